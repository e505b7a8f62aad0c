"""Dream's trajectory likelihoods: a recorded step of a Dream rollout (models/dream/sampler.py) replayed under any
model, and the exact law of the sampled path.

`chunk_terms` is Dream's step for likelihood/trajectory.py's replay loop (`replay_terms`, its plan, chunking and
activation checkpointing; the policy likelihood `--policy-logprob trajectory` and the mismatch ratio use it through
train/backend.py): for n (row, step) canvases it returns every committed token's log q under Dream's filtered
proposal (models/dream/selection.py) and each step's selection term, from the logits the sampler used:
- uncached (`diffusion_generate`, and its threshold): a full forward of the canvas (prompt + tokens with
  commit_step < t), masked position i reading the raw row i − 1 (Dream's shift);
- `prefix` / `dual` (Fast-dLLM's cached generate): the step's block was opened by a refresh at t0 (the row's commit of
  the block's first position, which is forced: selection term 0) whose full forward wrote every K/V; a later step's
  logits come from a window forward of canvas_t — the block and what follows (prefix) or the block (dual) — over
  that cache, shifted inside the window (its first row keeps its own logits), as likelihood/replay.py does for
  LLaDA; the gradient flows through the cached K/V. `uncached=True` reads exact uncached logits instead with the same
  selection rule (the mismatch ratio's π_old, as LLaDA's).
Each step's selection term is the schedule's: origin's move probability, the top-k rules with the schedule's k (a
count other than k has probability 0), the uncached threshold with its quota (`threshold_quotas`), the cached
threshold without one.

`path_logprob` is the exact law: every committed token's term, every step's selection term, and the steps that
committed nothing (`idle_terms`, model-free: origin's "nobody moved" Π (1 − p_move), a top-k step whose k was not 0,
a threshold step that left its masks) — −inf for every path the sampler cannot take, not the training likelihoods'
finite floor (`LOG_ZERO`, likelihood/selection.py: a ratio of two impossible terms must stay finite).
"""

from __future__ import annotations

import torch

from dllm_ais.likelihood.replay import canvases, step_blocks
from dllm_ais.likelihood.selection import LOG_ZERO, _log_floor
from dllm_ais.likelihood.trajectory import replay_plan, replay_terms, share_step_terms
from dllm_ais.models.dream.selection import (
    DreamRule,
    dream_selection_logprob,
    move_probabilities,
    proposal_logprob,
    scheduled_counts,
    threshold_quotas,
)
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.types import Rollout


def _gather(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """logits [n, T, V] at rows index [n, m] -> [n, m, V]."""
    return logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))


def step_logits(model, rollout: Rollout, rows: torch.Tensor, steps: torch.Tensor, offsets: torch.Tensor, config,
                mask_token_id: int, uncached: bool = False) -> torch.Tensor:
    """Shifted logits [n, m, V] float32 the Dream sampler `config` used at step steps[i] of row rows[i], at
    block-relative positions offsets [n, m] of the step's block (module docstring); uncached: exact full forwards."""
    P, Lb = rollout.prompt_ids.shape[1], config.block_length
    block, t0 = step_blocks(rollout.commit_step, rows, steps, Lb)
    if uncached or config.cache == "none":
        ids, attn = canvases(rollout, rows, steps, mask_token_id)
        raw = P + block[:, None] * Lb + offsets - 1  # [n, m] Dream's shift (P >= 1)
        return model(input_ids=ids, attention_mask=attn, positions=raw).logits.float()
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    for b in torch.unique(block).tolist():
        sel = (block == b).nonzero().squeeze(-1)  # [s] the pairs in block b
        r, t, start = rows[sel], steps[sel], t0[sel]
        lo = P + b * Lb
        uniq, inv = torch.unique(r, return_inverse=True)  # one refresh per row of this block
        ids0, attn0 = canvases(rollout, uniq, torch.zeros_like(uniq).scatter_(0, inv, start), mask_token_id)
        cache = KVCache.for_model(model, uniq.numel(), ids0.shape[1])
        refresh = model(input_ids=ids0, attention_mask=attn0, positions=slice(lo - 1, lo + Lb - 1), kv_cache=cache,
                        window_start=0).logits.float()  # [u, Lb, V]: block position j reads raw row lo + j − 1
        at_refresh = t == start
        if bool(at_refresh.any()):
            out.append((sel[at_refresh], _gather(refresh[inv[at_refresh]], offsets[sel[at_refresh]])))
        later = ~at_refresh
        if bool(later.any()):
            ids, attn = canvases(rollout, r[later], t[later], mask_token_id)
            window = ids[:, lo:] if config.cache == "prefix" else ids[:, lo:lo + Lb]
            raw = (offsets[sel[later]] - 1).clamp_min(0)  # the window's own shift: its row 0 keeps its logits
            logits = model(input_ids=window, attention_mask=attn, positions=raw, kv_cache=cache.rows(inv[later]),
                           window_start=lo).logits.float()
            out.append((sel[later], logits))
    order = torch.cat([i for i, _ in out])
    return torch.cat([x for _, x in out])[torch.argsort(order)]


def _selection(logits, masked, commit, tokens, rollout: Rollout, rows, steps, t0, config, mask_token_id: int,
               impossible: float) -> torch.Tensor:
    """The selection term [n] of each (row, step): Dream's rule at the step's place in its schedule."""
    rule = DreamRule.of(config, mask_token_id)
    cached = config.cache != "none"
    i = steps - t0 if cached else steps  # the step's index in its schedule (a block's, with a cache)
    S = config.steps // config.num_blocks if cached else config.steps
    p_move, expected = None, None
    if rule.alg == "origin":
        p_move = move_probabilities(i, S, config.eps)
    elif config.threshold is None:
        expected = scheduled_counts(masked.sum(-1), i, S, config.eps)
    elif not cached:  # the uncached threshold's quota, from the row's own commits
        quota, _ = threshold_quotas(rollout.commit_step[rows], config.gen_length, config.steps)
        expected = quota.gather(1, steps.clamp(max=quota.shape[1] - 1)[:, None]).squeeze(1)
    sel = dream_selection_logprob(logits, masked, commit, tokens, rule, p_move, expected, impossible)
    return torch.where(steps == t0, 0.0, sel) if cached else sel  # a refresh's commit is forced


def chunk_terms(model, rollout: Rollout, rows: torch.Tensor, steps: torch.Tensor, config, mask_token_id: int,
                selection: bool, impossible: float = LOG_ZERO,
                uncached: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's step for likelihood/trajectory.py `replay_terms`: (token log q [n, Lb] float64 on the tokens committed
    at each (rows[i], steps[i]) of its block, each step's selection term [n] float64 (0 without `selection`)).
    config: a DreamSamplerConfig; uncached: exact uncached logits (module docstring)."""
    Lb, n = config.block_length, rows.numel()
    ar = torch.arange(n, device=rows.device)
    block, t0 = step_blocks(rollout.commit_step, rows, steps, Lb)
    cs = rollout.commit_step[rows].view(n, -1, Lb)[ar, block]  # [n, Lb]
    y = rollout.completion_ids[rows].view(n, -1, Lb)[ar, block]  # [n, Lb]
    commit = cs == steps[:, None]  # [n, Lb]
    masked = (cs < 0) | (cs >= steps[:, None])  # masked before the step
    want = masked if selection else commit
    m = int(want.sum(-1).max())
    offsets = torch.argsort((~want).to(torch.int8), dim=-1, stable=True)[:, :m]  # [n, m] wanted positions first
    keep = want.gather(1, offsets)
    logits = step_logits(model, rollout, rows, steps, offsets, config, mask_token_id, uncached)  # [n, m, V]
    tokens = y.gather(1, offsets)
    lp = proposal_logprob(logits, tokens, DreamRule.of(config, mask_token_id))  # [n, m] float64
    committed = commit.gather(1, offsets) & keep
    token = torch.zeros(n, Lb, dtype=lp.dtype, device=lp.device).scatter(1, offsets, torch.where(committed, lp, 0))
    if not selection:
        return token, torch.zeros(n, dtype=torch.float64, device=lp.device)
    sel = _selection(logits, masked.gather(1, offsets) & keep, committed, tokens, rollout, rows, steps, t0, config,
                     mask_token_id, impossible)
    return token, sel


def _origin_idle(masks: torch.Tensor, t: int, steps: int, eps: float, impossible: float) -> torch.Tensor:
    """origin: log P(none of `masks` [B] positions moved at step t) = masks · log(1 − p_move) [B]."""
    p = move_probabilities(torch.full_like(masks, t), steps, eps)
    return torch.where(masks > 0, masks.double() * _log_floor(1 - p, impossible), 0.0)


def idle_terms(rollout: Rollout, config, impossible: float = -torch.inf) -> torch.Tensor:
    """Model-free log-terms [B] float64 of the steps a row committed nothing at, and whether its commit steps fit the
    schedule at all (`impossible` where not): origin's Π (1 − p_move); 0 for a step the schedule lets commit
    nothing; `impossible` for a top-k step with k > 0, a threshold step that left masks, a never-committed position,
    a commit after the row's last step, or (cached) a block not opened by its refresh."""
    cs = rollout.commit_step
    B, L = cs.shape
    total = torch.zeros(B, dtype=torch.float64, device=cs.device)
    bad = (cs < 0).any(-1)
    if config.cache == "none":
        S = config.steps
        end = (threshold_quotas(cs, L, S)[1] if config.threshold is not None
               else torch.full((B,), S, dtype=torch.long, device=cs.device))
        bad |= (cs >= end[:, None]).any(-1)
        for t in range(int(end.max())):
            masks = ((cs < 0) | (cs >= t)).sum(-1)  # [B] masks before step t
            idle = ~(cs == t).any(-1) & (t < end) & (masks > 0)
            if config.alg == "origin":
                total += torch.where(idle, _origin_idle(masks, t, S, config.eps, impossible), 0.0)
            elif config.threshold is not None:
                bad |= idle
            else:
                bad |= idle & (scheduled_counts(masks, torch.full_like(masks, t), S, config.eps) > 0)
        return torch.where(bad, impossible, total)
    Lb, nb = config.block_length, config.num_blocks
    S = config.steps // nb
    blocks = cs.view(B, nb, Lb)
    starts = blocks[..., 0]  # [B, nb] each block's refresh step
    horizon = max(int(cs.max()) + 1, rollout.num_steps)
    ends = torch.cat([starts[:, 1:], torch.full((B, 1), horizon, device=cs.device)], 1)  # [B, nb]
    if config.threshold is None:
        ends = torch.minimum(ends, starts + S)
    bad |= (starts[:, 1:] <= starts[:, :-1]).any(-1) | ((blocks == starts[..., None]).sum(-1) != 1).any(-1)
    bad |= ((blocks < starts[..., None]) | (blocks >= ends[..., None])).any((-1, -2))
    for b in range(nb):
        for i in range(1, int((ends[:, b] - starts[:, b]).max())):
            t = starts[:, b] + i  # [B]
            blk = blocks[:, b]
            masks = ((blk < 0) | (blk >= t[:, None])).sum(-1)
            idle = ~(blk == t[:, None]).any(-1) & (t < ends[:, b]) & (masks > 0)
            if config.threshold is not None:
                bad |= idle
            else:
                bad |= idle & (scheduled_counts(masks, torch.full_like(masks, i), S, config.eps) > 0)
    return torch.where(bad, impossible, total)


def path_logprob(model, rollout: Rollout, config, mask_token_id: int, selection: bool = True,
                 chunk_size: int | None = None) -> torch.Tensor:
    """log P(path) [B] float64 of each row of a Dream rollout under `model` (raw logits, shifted here) and the sampler
    `config` (a DreamSamplerConfig; any cache): every committed token's term (all positions, counted or not), with
    `selection` every step's selection term and `idle_terms`. −inf for a path the sampler cannot take (module
    docstring). Differentiable through the token terms when grad is enabled."""
    B, L = rollout.completion_ids.shape
    committed = rollout.commit_step >= 0
    plan = replay_plan(rollout.commit_step, torch.ones(B, L, dtype=torch.bool, device=committed.device))
    token, select = replay_terms(model, rollout, plan, config, mask_token_id=mask_token_id, selection=selection,
                                 chunk_size=chunk_size, impossible=-torch.inf, chunk_terms=chunk_terms)
    total = torch.where(committed, token.double(), 0.0).sum(-1)
    if not selection:
        return total
    return total + share_step_terms(select, rollout.commit_step, committed).sum(-1) + idle_terms(rollout, config)


def recorded_path_logprob(rollout: Rollout) -> torch.Tensor:
    """log P(path) [B] float64 from the sampler's record: Σ logp_rollout over committed tokens plus each step's
    selection term once (logp_select repeats it on every token the step committed). Needs record_selection=True.
    origin's steps that moved nothing (probability Π (1 − p_move)) hold no token, so no record: use path_logprob."""
    if rollout.logp_rollout is None or rollout.logp_select is None:
        raise ValueError("the rollout has no logp_rollout / logp_select record: sample with record_selection=True.")
    committed = rollout.commit_step >= 0
    per_step = share_step_terms(rollout.logp_select, rollout.commit_step, committed)  # [B, L]
    return torch.where(committed, rollout.logp_rollout.double(), 0.0).sum(-1) + per_step.sum(-1)
