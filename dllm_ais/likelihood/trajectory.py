"""Trajectory (commit-only) mismatch log-ratio of a masked-diffusion rollout: DESIGN.md §5, last bullet.

The sampler commits token y_j at step t(j) from canvas_t = prompt + the completion tokens committed before t (every
other completion position a mask); `Rollout.commit_step` [B, L] records t(j), so every canvas is reconstructible.
Replaying those canvases under π_old (an exact, uncached forward at the sampler's temperature, the same proposal
density `proposal_logprobs` the sampler records) gives per-token log-ratios

    ℓ_j = log π_old(y_j | canvas_t(j)) − log μ(y_j | canvas_t(j)),   ℓ = Σ_j over counted tokens (completion_mask).

It leaves out the order-selection term (which positions are committed at each step: it cancels exactly only under
random remasking). Unlike the coupled ELBO ratio it sees what the sampler did (KV-cache staleness, threshold commits)
because log μ is the sampler's own record. Where the rollout carries no record (`Rollout.logp_rollout is None`) the
rollout model is replayed too; for an uncached sampler that is what it would have recorded.

Cost: one canvas row per (sequence, denoising step with a counted commit); rows are batched `chunk_size` per forward
and only the committed positions' logits are computed. Step subsampling (`num_steps=K`) replays K distinct steps per
sequence drawn without replacement and scales their terms by S_b / K (S_b = that sequence's steps): Horvitz–Thompson,
so E[ℓ] over the draw is the full sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_ais.likelihood.logprobs import proposal_logprobs
from dllm_ais.types import Rollout


@dataclass(frozen=True)
class ReplayPlan:
    """Which (sequence, step) canvases to replay and how each replayed token's term is scaled."""

    rows: torch.Tensor
    """[N] long, sequence index of each canvas to replay."""
    steps: torch.Tensor
    """[N] long, denoising step of each canvas (the tokens committed at it are scored)."""
    scale: torch.Tensor
    """[B, L] float64: S_b / K on counted tokens of the sampled steps (1 without subsampling), 0 elsewhere."""


@dataclass(frozen=True)
class TrajectoryEstimate:
    """The trajectory log-ratio of a batch."""

    token_log_ratio: torch.Tensor
    """[B, L] float32 ℓ_j, Horvitz–Thompson scaled; 0 on tokens not counted or not replayed."""
    log_ratio: torch.Tensor
    """[B] float32 sequence ℓ = Σ_j token_log_ratio."""
    num_canvases: int
    """Canvas rows replayed per model (the replay's cost in forward rows)."""
    num_forwards: int
    """Model forward calls per replayed model (ceil(num_canvases / chunk_size))."""


def replay_plan(commit_step: torch.Tensor, counted: torch.Tensor, num_steps: int | None = None,
                generator: torch.Generator | None = None) -> ReplayPlan:
    """The canvases to replay: every (sequence, step) with a counted commit, or `num_steps` of them per sequence.

    commit_step [B, L] long (−1 = never committed), counted [B, L] bool. num_steps: K distinct steps per sequence,
    drawn uniformly without replacement from `generator` (required then); a sequence with S_b ≤ K steps replays all.
    """
    if num_steps is not None and num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1 (or None: every step); it is --trajectory-steps.")
    if num_steps is not None and generator is None:
        raise ValueError("step subsampling (num_steps) needs an explicit torch.Generator.")
    valid = counted & (commit_step >= 0)  # [B, L]
    scale = torch.zeros(commit_step.shape, dtype=torch.float64, device=commit_step.device)
    rows, steps = [], []
    for b in range(commit_step.shape[0]):
        distinct = torch.unique(commit_step[b][valid[b]])  # [S_b] sorted
        S = distinct.numel()
        if S == 0:
            continue
        if num_steps is not None and num_steps < S:
            pick = torch.randperm(S, generator=generator, device=generator.device)[:num_steps].to(distinct.device)
            chosen, weight = distinct[pick.sort().values], S / num_steps
        else:
            chosen, weight = distinct, 1.0
        scale[b] = torch.where(valid[b] & torch.isin(commit_step[b], chosen), weight, 0.0)
        rows.append(torch.full_like(chosen, b))
        steps.append(chosen)
    empty = commit_step.new_zeros(0)
    return ReplayPlan(rows=torch.cat(rows) if rows else empty, steps=torch.cat(steps) if steps else empty,
                      scale=scale)


def _canvases(rollout: Rollout, rows: torch.Tensor, steps: torch.Tensor, mask_token_id: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Canvas ids and attention mask [n, P + L] of (rows[i], steps[i]): prompt + tokens committed before the step."""
    completion = rollout.completion_ids[rows]  # [n, L]
    cs = rollout.commit_step[rows]  # [n, L]
    before = (cs >= 0) & (cs < steps[:, None])  # a never-committed position (−1) stays masked
    canvas = torch.where(before, completion, torch.full_like(completion, mask_token_id))
    ids = torch.cat([rollout.prompt_ids[rows], canvas], dim=1)
    attn = torch.cat([rollout.prompt_mask[rows].bool(), torch.ones_like(canvas, dtype=torch.bool)], dim=1)
    return ids, attn


def _chunk_logits(model, ids: torch.Tensor, attn: torch.Tensor, positions: torch.Tensor, prompt_mask: torch.Tensor,
                  cfg_scale: float, mask_token_id: int) -> torch.Tensor:
    """Logits [n, m, V] (float32) at canvas positions [n, m]; with CFG the sampler's guided combination."""
    logits = model(input_ids=ids, attention_mask=attn, positions=positions).logits.float()
    if cfg_scale > 0:
        uncond = ids.clone()
        P = prompt_mask.shape[1]
        uncond[:, :P][prompt_mask] = mask_token_id
        un = model(input_ids=uncond, attention_mask=attn, positions=positions).logits.float()
        logits = un + (cfg_scale + 1) * (logits - un)
    return logits


def _forwards_in_step(n: int, device: torch.device) -> int:
    """The most forward calls any process makes (n on one process): under FSDP every rank must call the model as
    often as the others (each forward all-gathers the shards), and canvases per rank differ."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return n
    t = torch.tensor([n], device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t)


@torch.no_grad()
def replay_logprobs(model, rollout: Rollout, plan: ReplayPlan, *, temperature: float, mask_token_id: int,
                    chunk_size: int | None = None, cfg_scale: float = 0.0) -> torch.Tensor:
    """log model(y_j | canvas_t(j)) under the sampler's proposal for every token the plan scores; 0 elsewhere.

    -> [B, L] float32 (float64 for a float64 model). chunk_size: canvases per forward (default B, the rollout's own
    batch, so the replay's activation memory is a rollout step's).
    """
    if temperature <= 0:
        raise ValueError("the trajectory estimator needs a sampling density: --temperature 0 (greedy) has none; "
                         "sample at T > 0 or use --mismatch-estimator elbo.")
    B, L = rollout.completion_ids.shape
    P = rollout.prompt_ids.shape[1]
    size = chunk_size if chunk_size is not None else max(B, 1)
    if size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1.")
    out = None
    scored = plan.scale > 0  # [B, L]
    for s in range(0, plan.rows.numel(), size):
        rows, steps = plan.rows[s:s + size], plan.steps[s:s + size]  # [n]
        ids, attn = _canvases(rollout, rows, steps, mask_token_id)
        hit = scored[rows] & (rollout.commit_step[rows] == steps[:, None])  # [n, L] tokens committed at the step
        m = int(hit.sum(-1).max())
        # committed positions first (stable), padded with a valid position whose result is discarded
        order = torch.argsort((~hit).to(torch.int8), dim=-1, stable=True)[:, :m]  # [n, m]
        keep = hit.gather(1, order)  # [n, m]
        logits = _chunk_logits(model, ids, attn, P + order, rollout.prompt_mask[rows].bool(), cfg_scale,
                               mask_token_id)  # [n, m, V]
        lp = proposal_logprobs(logits, rollout.completion_ids[rows].gather(1, order), temperature, mask_token_id)
        if out is None:
            out = torch.zeros(B, L, dtype=lp.dtype, device=lp.device)
        out[rows[:, None].expand_as(order)[keep], order[keep]] = lp[keep]
    device = rollout.completion_ids.device
    n_calls = -(-plan.rows.numel() // size)
    for _ in range(_forwards_in_step(n_calls, device) - n_calls):  # keep step with the other processes; discarded
        ids, attn = _canvases(rollout, plan.rows.new_zeros(1), plan.steps.new_zeros(1), mask_token_id)
        _chunk_logits(model, ids, attn, torch.full((1, 1), P, device=device), rollout.prompt_mask[:1].bool(),
                      cfg_scale, mask_token_id)
    return out if out is not None else torch.zeros(B, L, device=device)


@torch.no_grad()
def trajectory_log_ratio(model_old, model_rollout, rollout: Rollout, *, temperature: float, mask_token_id: int,
                         num_steps: int | None = None, generator: torch.Generator | None = None,
                         chunk_size: int | None = None, cfg_scale: float = 0.0) -> TrajectoryEstimate:
    """ℓ_j = log π_old(y_j | canvas) − log μ(y_j | canvas) over the rollout's recorded canvases (module docstring).

    log μ is `rollout.logp_rollout` [B, L] when the sampler recorded it, else the replay of `model_rollout`.
    num_steps: K replayed steps per sequence (Horvitz–Thompson scaled; needs `generator`); None = every step.
    """
    if temperature <= 0:
        raise ValueError("the trajectory estimator needs a sampling density: --temperature 0 (greedy) has none; "
                         "sample at T > 0 or use --mismatch-estimator elbo.")
    plan = replay_plan(rollout.commit_step, rollout.completion_mask.bool(), num_steps, generator)
    kw = dict(temperature=temperature, mask_token_id=mask_token_id, chunk_size=chunk_size, cfg_scale=cfg_scale)
    logp_old = replay_logprobs(model_old, rollout, plan, **kw)  # [B, L]
    if rollout.logp_rollout is not None:
        logp_mu = rollout.logp_rollout.to(logp_old.dtype)
    else:
        logp_mu = replay_logprobs(model_rollout, rollout, plan, **kw)
    scored = plan.scale > 0
    diff = torch.where(scored, logp_old - logp_mu, 0.0)  # [B, L]; unscored tokens may hold anything in logp_mu
    weighted = diff.double() * plan.scale  # [B, L] Horvitz–Thompson weighted token terms
    n = plan.rows.numel()
    size = chunk_size if chunk_size is not None else max(rollout.completion_ids.shape[0], 1)
    return TrajectoryEstimate(token_log_ratio=weighted.float(), log_ratio=weighted.sum(-1).float(),
                              num_canvases=n, num_forwards=-(-n // size))
