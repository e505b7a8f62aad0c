"""Trajectory likelihoods of a masked-diffusion rollout: the log-probability of the path the sampler took, and the
mismatch log-ratio built from it (DESIGN.md §5, last bullets).

The sampler commits token y_j at step t(j) from canvas_t (`Rollout.commit_step`; likelihood/replay.py rebuilds every
canvas and the logits the sampler used, cache included). The path's log-probability is a sum over its steps of

    Σ_{j committed at t} log q_θ(y_j | canvas_t)   (the proposal: softmax(logits / T), mask token removed)
    + the step's selection term                    (which positions were committed: likelihood/selection.py)

`path_logprob` computes it exactly (tested against sampler frequencies by enumeration). For a per-token loss the
selection term of a step is shared equally by the *counted* tokens it committed (`share_step_terms`), so a
sequence's counted terms sum to its path log-probability whenever every step committed a counted token.

Trajectory mismatch ratio: ℓ_j = [log π_old − log μ](token terms + shared selection terms) on the recorded canvases,
ℓ = Σ_j over counted tokens. log μ is the sampler's own record (`Rollout.logp_rollout`, `Rollout.logp_select`) when it
recorded it, else a replay of the rollout model under the sampler's config. Without selection terms (the
commit-only ratio) it is the exact path ratio only where the choice of positions cancels (random remasking).

Cost: one canvas row per (sequence, step with a counted commit); rows are batched `chunk_size` per forward. Step
subsampling (`replay_plan(num_steps=K)`) replays K distinct steps per sequence drawn without replacement and scales
their terms by S_b / K (S_b = that sequence's steps): Horvitz–Thompson, so the expectation over the draw of any sum
of per-step terms is the full sum. Under autograd each chunk of canvases is activation-checkpointed: backward keeps
the chunk's inputs and its [n, Lb] outputs only and recomputes its forwards, so memory is one chunk's activations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch.utils.checkpoint import checkpoint

from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.inputs import mask_token_id_of
from dllm_ais.likelihood.logprobs import proposal_logprobs
from dllm_ais.likelihood.replay import canvases, step_blocks, step_logits
from dllm_ais.likelihood.selection import LOG_ZERO, SelectionRule, selection_logprob, transfer_schedule
from dllm_ais.types import Rollout


@dataclass(frozen=True)
class ReplayPlan:
    """Which (sequence, step) canvases to replay and how each replayed token's term is scaled."""

    rows: torch.Tensor
    """[N] long, sequence index of each canvas to replay (sorted by row, then step)."""
    steps: torch.Tensor
    """[N] long, denoising step of each canvas (the tokens committed at it are scored)."""
    scale: torch.Tensor
    """[B, L] float64: S_b / K on counted tokens of the sampled steps (1 without subsampling), 0 elsewhere."""

    def for_rows(self, rows: torch.Tensor) -> ReplayPlan:
        """The plan of sequences `rows` [m] only, renumbered 0..m−1 in that order (a micro-batch's plan)."""
        new = torch.full((int(self.scale.shape[0]),), -1, dtype=torch.long, device=self.rows.device)
        new[rows] = torch.arange(rows.numel(), device=rows.device)
        keep = new[self.rows] >= 0
        r, s = new[self.rows[keep]], self.steps[keep]
        order = torch.argsort(r * (int(s.max()) + 1 if s.numel() else 1) + s)  # stable row-then-step order
        return ReplayPlan(rows=r[order], steps=s[order], scale=self.scale[rows])


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


@dataclass(frozen=True)
class PathLogprob:
    """log P(path) of each rollout row under a sampler (`path_logprob`)."""

    log_prob: torch.Tensor
    """[B] float64 log-probability of the whole path (tokens and commit steps)."""
    step_terms: torch.Tensor
    """[B, num_steps] float64: each step's token terms plus its selection term (0 where the row committed nothing)."""
    token_terms: torch.Tensor
    """[B, L] float64 log q(y_j | canvas_t(j)) of every committed token."""
    selection_terms: torch.Tensor
    """[B, L] float64: the selection term of the step at which each token was committed (repeated per token)."""


def counted_steps(commit_step: torch.Tensor, counted: torch.Tensor) -> list[torch.Tensor]:
    """Per sequence, its distinct steps with a counted commit, sorted: B tensors [S_b]."""
    valid = counted & (commit_step >= 0)  # [B, L]
    return [torch.unique(commit_step[b][valid[b]]) for b in range(commit_step.shape[0])]


def plan_for_steps(commit_step: torch.Tensor, counted: torch.Tensor, chosen: list[torch.Tensor],
                   num_steps: int | None) -> ReplayPlan:
    """The plan replaying `chosen[b]` (a subset of `counted_steps`) of each sequence; with `num_steps` K, a sequence
    with S_b > K steps has K chosen and its terms are scaled by S_b / K (Horvitz–Thompson: each step is chosen with
    probability K / S_b), else all S_b are replayed at scale 1."""
    valid = counted & (commit_step >= 0)  # [B, L]
    scale = torch.zeros(commit_step.shape, dtype=torch.float64, device=commit_step.device)
    rows, steps = [], []
    for b, distinct in enumerate(counted_steps(commit_step, counted)):
        S, pick = distinct.numel(), chosen[b]
        if S == 0:
            continue
        weight = S / num_steps if num_steps is not None and num_steps < S else 1.0
        scale[b] = (valid[b] & torch.isin(commit_step[b], pick)).double() * weight  # float64: S/K unrounded
        rows.append(torch.full_like(pick, b))
        steps.append(pick)
    empty = commit_step.new_zeros(0)
    return ReplayPlan(rows=torch.cat(rows) if rows else empty, steps=torch.cat(steps) if steps else empty,
                      scale=scale)


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
    chosen = []
    for distinct in counted_steps(commit_step, counted):
        S = distinct.numel()
        if num_steps is not None and 0 < num_steps < S:
            pick = torch.randperm(S, generator=generator, device=generator.device)[:num_steps].to(distinct.device)
            distinct = distinct[pick.sort().values]
        chosen.append(distinct)
    return plan_for_steps(commit_step, counted, chosen, num_steps)


def merge_commit_steps(commit_step: torch.Tensor, merge: int, block_length: int) -> torch.Tensor:
    """Step merging (TraceRL's `shrink`, d2's StepMerge): each row's distinct commit steps in a block, sorted, are cut
    into consecutive groups of `merge`, and every token of a group gets the group's first step. A replay of the
    result scores the whole group in one forward from the canvas at the group's first step (every token of the group
    masked): biased (a token no longer sees the tokens committed at earlier steps of its group) and about `merge`
    times fewer canvases. Groups stay inside a block (a cached sampler's window is per block); with one block
    this is TraceRL's `collapse_k_unique` up to the label of the group (TraceRL labels it by its last step).

    commit_step [B, L] long (−1 = never committed) -> [B, L] long; merge = 1 returns commit_step itself.
    """
    if merge < 1:
        raise ValueError(f"merge={merge} must be >= 1 (1 = every recorded step on its own); it is --trajectory-merge.")
    if merge == 1:
        return commit_step
    B, L = commit_step.shape
    if L % block_length:
        raise ValueError(f"block_length={block_length} must divide the completion length {L}.")
    out = commit_step.clone()
    blocks = commit_step.view(B, L // block_length, block_length)  # [B, nb, Lb]
    merged = out.view(B, L // block_length, block_length)
    for b in range(B):
        for k in range(blocks.shape[1]):
            cs = blocks[b, k]  # [Lb]
            distinct = torch.unique(cs[cs >= 0])  # sorted [S]
            if distinct.numel() == 0:
                continue
            first = distinct[(torch.arange(distinct.numel(), device=cs.device) // merge) * merge]  # [S] group's first
            idx = torch.searchsorted(distinct, cs.clamp(min=0))  # [Lb] rank of each token's step
            merged[b, k] = torch.where(cs >= 0, first[idx.clamp(max=distinct.numel() - 1)], cs)
    return out


def merge_rollout(rollout: Rollout, merge: int, block_length: int) -> Rollout:
    """The rollout with `merge_commit_steps` applied, for a merged trajectory likelihood: merge = 1 returns it
    unchanged; else a copy whose sampler records (log μ, selection terms, plan) are dropped, since they belong to the
    unmerged canvases — μ is then replayed on the merged canvases like π_θ and π_old."""
    if merge == 1:
        return rollout
    return Rollout(prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask,
                   completion_ids=rollout.completion_ids, completion_mask=rollout.completion_mask,
                   commit_step=merge_commit_steps(rollout.commit_step, merge, block_length),
                   num_steps=rollout.num_steps, commit_confidence=rollout.commit_confidence, nfe=rollout.nfe)


def rollout_rows(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """The rollout of sequences `rows` [m] only (a micro-batch), its tensors indexed; the plan is left out."""
    pick = lambda t: None if t is None else t[rows]  # noqa: E731
    return Rollout(prompt_ids=rollout.prompt_ids[rows], prompt_mask=rollout.prompt_mask[rows],
                   completion_ids=rollout.completion_ids[rows], completion_mask=rollout.completion_mask[rows],
                   commit_step=rollout.commit_step[rows], num_steps=rollout.num_steps,
                   logp_rollout=pick(rollout.logp_rollout), logp_select=pick(rollout.logp_select),
                   commit_confidence=pick(rollout.commit_confidence), nfe=rollout.nfe)


def share_step_terms(step_terms: torch.Tensor, commit_step: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """A step's term shared equally by the counted tokens it committed. step_terms [B, L] (the step's term repeated
    on each token it committed), commit_step [B, L], counted [B, L] bool -> [B, L] (0 off counted tokens)."""
    same = (commit_step[:, :, None] == commit_step[:, None, :]) & counted[:, None, :]  # [B, L, L]
    n = same.sum(-1).clamp(min=1)  # [B, L] counted tokens committed at each token's step
    return torch.where(counted, step_terms / n, 0.0)


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ValueError("the trajectory likelihood needs a sampling density: --temperature 0 (greedy) has none; "
                         "sample at T > 0 (or use --mismatch-estimator elbo / --policy-logprob one_step).")


def scheduled_count(cs: torch.Tensor, steps: torch.Tensor, config: SamplerConfig) -> torch.Tensor:
    """The fixed schedule's k at each replayed step: cs [n, Lb] commit steps of the step's block, steps [n] -> [n]
    long. A step is the block's r-th step with a commit (r = its distinct earlier commit steps in the block: the
    schedule's zeros come last), so its k is transfer_schedule(Lb, S)[r]; −1 (no k fits) past the S-th."""
    n, Lb = cs.shape
    S = config.steps // config.num_blocks
    srt = cs.sort(-1).values  # [n, Lb]
    first = torch.ones_like(srt, dtype=torch.bool)
    first[:, 1:] = srt[:, 1:] != srt[:, :-1]
    rank = (first & (srt >= 0) & (srt < steps[:, None])).sum(-1)  # [n]
    k = transfer_schedule(torch.full((n,), Lb, device=cs.device), S)  # [n, S]
    return torch.where(rank < S, k.gather(1, rank.clamp(max=S - 1)[:, None]).squeeze(1), -1)


def _chunk_terms(model, rollout: Rollout, rows: torch.Tensor, steps: torch.Tensor, config: SamplerConfig,
                 mask_token_id: int, selection: bool,
                 impossible: float = LOG_ZERO) -> tuple[torch.Tensor, torch.Tensor]:
    """(token log q [n, Lb], each step's selection term [n]) of the (rows, steps) canvases: [n, Lb] over the step's
    block, nonzero on the tokens committed at the step. impossible: a probability-0 step's selection term."""
    Lb = config.block_length
    n = rows.numel()
    block, _ = step_blocks(rollout.commit_step, rows, steps, Lb)
    cs = rollout.commit_step[rows].view(n, -1, Lb)[torch.arange(n, device=rows.device), block]  # [n, Lb]
    y = rollout.completion_ids[rows].view(n, -1, Lb)[torch.arange(n, device=rows.device), block]  # [n, Lb]
    commit = cs == steps[:, None]  # [n, Lb]
    masked = (cs < 0) | (cs >= steps[:, None])  # masked before the step
    want = masked if selection else commit
    m = int(want.sum(-1).max())
    offsets = torch.argsort((~want).to(torch.int8), dim=-1, stable=True)[:, :m]  # [n, m] wanted positions first
    keep = want.gather(1, offsets)  # [n, m] False on padding
    logits = step_logits(model, rollout, rows, steps, offsets, config, mask_token_id)  # [n, m, V]
    tokens = y.gather(1, offsets)
    lp = proposal_logprobs(logits, tokens, config.temperature, mask_token_id)  # [n, m]
    committed = commit.gather(1, offsets) & keep
    token = torch.zeros(n, Lb, dtype=lp.dtype, device=lp.device).scatter(1, offsets, torch.where(committed, lp, 0))
    if not selection:
        return token, torch.zeros(n, dtype=torch.float64, device=lp.device)
    rule = SelectionRule.of(config, mask_token_id)
    expected = scheduled_count(cs, steps, config) if config.threshold is None else None
    sel = selection_logprob(logits, masked.gather(1, offsets) & keep, committed, tokens, rule, expected,
                            impossible)  # [n]
    return token, sel


def replay_terms(model, rollout: Rollout, plan: ReplayPlan, config: SamplerConfig, *, mask_token_id: int,
                 selection: bool = False, chunk_size: int | None = None, impossible: float = LOG_ZERO,
                 chunk_terms=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay the plan's canvases under `model` with the sampler `config` (its cache and selection rule).
    chunk_terms: a family's step (models/dream/trajectory.py `chunk_terms`, with its own config), None = LLaDA's.

    -> (token [B, L]: log q(y_j | canvas_t(j)) of every token committed at a replayed step, float32 (float64 for a
    float64 model); step_select [B, L] float64: the selection term of each such token's step, repeated per token,
    0 when `selection` is off; `impossible` for a step of probability 0, selection.py). 0 elsewhere. Differentiable
    when grad is enabled (each chunk of `chunk_size` canvases, default the rollout's batch size, is
    activation-checkpointed); a no-grad call runs plain forwards.
    """
    _check_temperature(config.temperature)
    B, L = rollout.completion_ids.shape
    size = chunk_size if chunk_size is not None else max(B, 1)
    if size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1.")
    Lb = config.block_length
    device = rollout.completion_ids.device
    token, select = None, torch.zeros(B, L, dtype=torch.float64, device=device)
    grad = torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())
    for s in range(0, plan.rows.numel(), size):
        rows, steps = plan.rows[s:s + size], plan.steps[s:s + size]  # [n]
        args = (model, rollout, rows, steps, config, mask_token_id, selection, impossible)
        terms = chunk_terms if chunk_terms is not None else _chunk_terms
        lp, sel = checkpoint(terms, *args, use_reentrant=False) if grad else terms(*args)
        if token is None:
            token = torch.zeros(B, L, dtype=lp.dtype, device=device)
        block, _ = step_blocks(rollout.commit_step, rows, steps, Lb)
        cols = block[:, None] * Lb + torch.arange(Lb, device=device)  # [n, Lb] completion positions of the block
        hit = rollout.commit_step[rows].gather(1, cols) == steps[:, None]  # [n, Lb]
        r, c = rows[:, None].expand_as(cols)[hit], cols[hit]
        token = token.index_put((r, c), lp[hit])
        select = select.index_put((r, c), sel[:, None].expand_as(cols)[hit])
    if token is None:
        token = torch.zeros(B, L, device=device)
    return token, select


def policy_token_logp(model, rollout: Rollout, plan: ReplayPlan, config: SamplerConfig, *, mask_token_id: int,
                      selection: bool, chunk_size: int | None = None, chunk_terms=None) -> torch.Tensor:
    """Per-token path terms of the GRPO ratio: log q(y_j | canvas) plus the step's selection term shared over its
    counted tokens, on the plan's scored tokens (plan.scale > 0); 0 elsewhere. [B, L], float64 with selection."""
    token, step_select = replay_terms(model, rollout, plan, config, mask_token_id=mask_token_id,
                                      selection=selection, chunk_size=chunk_size, chunk_terms=chunk_terms)
    scored = plan.scale > 0
    if selection:
        token = token.double() + share_step_terms(step_select, rollout.commit_step, scored)
    return torch.where(scored, token, 0.0)


def rollout_token_logp(rollout: Rollout, plan: ReplayPlan, selection: bool) -> torch.Tensor:
    """`policy_token_logp` of the rollout policy μ from the sampler's own record: [B, L]."""
    if rollout.logp_rollout is None or (selection and rollout.logp_select is None):
        raise ValueError("the rollout carries no sampler record of log μ (logp_rollout / logp_select); sample with "
                         "diffusion_sample(..., record_selection=True) for selection terms.")
    scored = plan.scale > 0
    token = rollout.logp_rollout
    if selection:
        token = token.double() + share_step_terms(rollout.logp_select, rollout.commit_step, scored)
    return torch.where(scored, token, 0.0)


def path_logprob(model, rollout: Rollout, config: SamplerConfig, selection: bool = True,
                 chunk_size: int | None = None) -> PathLogprob:
    """log P(path) of each rollout row under the sampler `config` with `model`'s logits: every committed token's
    proposal term plus, with `selection`, every step's selection term (module docstring). Every position counts
    (stop tokens included). A path the sampler cannot take (a step of the fixed schedule committing another number
    of tokens, a threshold step whose confidences break the rule) has log P = −inf: this is the exact law, not a
    training likelihood (those floor such a step at LOG_ZERO so a ratio of two models stays finite: selection.py).
    Differentiable when grad is enabled."""
    mask_token_id = mask_token_id_of(model)
    B, L = rollout.completion_ids.shape
    everything = torch.ones(B, L, dtype=torch.bool, device=rollout.completion_ids.device)
    plan = replay_plan(rollout.commit_step, everything)
    token, select = replay_terms(model, rollout, plan, config, mask_token_id=mask_token_id, selection=selection,
                                 chunk_size=chunk_size, impossible=-torch.inf)
    token = token.double()
    committed = rollout.commit_step >= 0
    per_token = token + share_step_terms(select, rollout.commit_step, committed)  # [B, L]
    steps = torch.zeros(B, rollout.num_steps, dtype=torch.float64, device=token.device)
    steps = steps.index_put((torch.arange(B, device=token.device)[:, None].expand(B, L)[committed],
                             rollout.commit_step[committed]), per_token[committed], accumulate=True)
    return PathLogprob(log_prob=per_token.sum(-1), step_terms=steps, token_terms=token, selection_terms=select)


def _forwards_in_step(n: int, device: torch.device) -> int:
    """The most forward calls any process makes (n on one process): under FSDP every rank must call the model as
    often as the others (each forward all-gathers the shards), and canvases per rank differ."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return n
    t = torch.tensor([n], device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t)


def _uncached(temperature: float, cfg_scale: float, length: int) -> SamplerConfig:
    """An uncached sampler config for replays that need no selection term (blocks then play no part)."""
    return SamplerConfig(gen_length=length, block_length=length, steps=1, temperature=temperature,
                         cfg_scale=cfg_scale, compile=False)


@torch.no_grad()
def replay_logprobs(model, rollout: Rollout, plan: ReplayPlan, *, temperature: float, mask_token_id: int,
                    chunk_size: int | None = None, cfg_scale: float = 0.0,
                    config: SamplerConfig | None = None, selection: bool = False, chunk_terms=None) -> torch.Tensor:
    """log model(y_j | canvas_t(j)) under the sampler's proposal for every token the plan scores (with `selection`
    plus the shared selection term); 0 elsewhere. -> [B, L]. config: the sampler to replay (cache, selection rule);
    None = an exact uncached forward at `temperature` (no selection then). Pads its forward calls to the busiest
    process's under FSDP."""
    _check_temperature(temperature)
    if config is None:
        if selection:
            raise ValueError("selection terms need the sampler's config (block length, remasking, threshold).")
        config = _uncached(temperature, cfg_scale, rollout.completion_ids.shape[1])
    out = policy_token_logp(model, rollout, plan, config, mask_token_id=mask_token_id, selection=selection,
                            chunk_size=chunk_size, chunk_terms=chunk_terms)
    size = chunk_size if chunk_size is not None else max(rollout.completion_ids.shape[0], 1)
    n_calls = -(-plan.rows.numel() // size)
    device = rollout.completion_ids.device
    per_chunk = 2 if config.cfg_scale > 0 else 1  # calls per chunk (uncached replays only run under FSDP)
    for _ in range((_forwards_in_step(n_calls, device) - n_calls) * per_chunk):  # keep step with the others
        ids, attn = canvases(rollout, plan.rows.new_zeros(1), plan.steps.new_zeros(1), mask_token_id)
        model(input_ids=ids, attention_mask=attn, positions=torch.full((1, 1), rollout.prompt_ids.shape[1],
                                                                       device=device))
    return out


@torch.no_grad()
def trajectory_log_ratio(model_old, model_rollout, rollout: Rollout, *, temperature: float, mask_token_id: int,
                         num_steps: int | None = None, generator: torch.Generator | None = None,
                         chunk_size: int | None = None, cfg_scale: float = 0.0, plan: ReplayPlan | None = None,
                         config: SamplerConfig | None = None, selection: bool = False, chunk_terms=None,
                         uncached_chunk_terms=None) -> TrajectoryEstimate:
    """ℓ_j = log π_old(path terms of y_j) − log μ(path terms of y_j) over the rollout's recorded canvases.

    π_old is an exact uncached replay at the sampler's temperature. log μ is the sampler's record when present, else
    a replay of `model_rollout` under `config` (the rollout's sampler; uncached when None). plan: the canvases to
    replay (drawn once per rollout and shared with the policy likelihood); else drawn here from num_steps /
    generator. selection: add each step's selection term (needs `config`; μ's from `Rollout.logp_select`).
    chunk_terms / uncached_chunk_terms: a family's replay step as it ran and with exact uncached logits (Dream's;
    None = LLaDA's, uncached by `config` with cache "none").
    """
    _check_temperature(temperature)
    if plan is None:
        plan = replay_plan(rollout.commit_step, rollout.completion_mask.bool(), num_steps, generator)
    if uncached_chunk_terms is not None:
        old_config, old_terms = config, uncached_chunk_terms
    else:
        old_config, old_terms = (None if config is None else replace(config, cache="none")), chunk_terms
    kw = dict(temperature=temperature, mask_token_id=mask_token_id, chunk_size=chunk_size, cfg_scale=cfg_scale,
              selection=selection)
    logp_old = replay_logprobs(model_old, rollout, plan, config=old_config, chunk_terms=old_terms, **kw)  # [B, L]
    recorded = rollout.logp_rollout is not None and (not selection or rollout.logp_select is not None)
    if recorded:
        logp_mu = rollout_token_logp(rollout, plan, selection).to(logp_old.dtype)
    else:
        logp_mu = replay_logprobs(model_rollout, rollout, plan, config=config, chunk_terms=chunk_terms, **kw)
    scored = plan.scale > 0
    diff = torch.where(scored, logp_old - logp_mu, 0.0)  # [B, L]
    weighted = diff.double() * plan.scale  # [B, L] Horvitz–Thompson weighted token terms
    n = plan.rows.numel()
    size = chunk_size if chunk_size is not None else max(rollout.completion_ids.shape[0], 1)
    return TrajectoryEstimate(token_log_ratio=weighted.float(), log_ratio=weighted.sum(-1).float(),
                              num_canvases=n, num_forwards=-(-n // size))
