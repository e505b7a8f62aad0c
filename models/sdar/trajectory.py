"""The exact path law of an SDAR rollout (models/sdar/sampler.py) under a model: every step's token terms (log q of
the filtered proposal, models/sdar/selection.py) plus its selection term, block by block.

The canvas (models/sdar/model.py `block_canvas`) is rebuilt from the rollout's prompts and completion width. In a
block, the s-th distinct commit step is the block's local step s (every step of a block commits at least one token:
its quota n_s >= 1 while masks are left), so the state of block k before its step s is its prompt tail plus the tokens
committed at earlier steps of the block, masks elsewhere; the blocks before it are final. The cache is exact, so the
logits that step saw are the block-causal forward's — and one two-stream forward (`two_stream_logits`: the states at
local step s in the noisy stream, the final tokens in the clean one) gives them for every block at once: a rollout
costs S = denoising_steps forwards of twice the canvas, whatever its number of blocks.

A step whose commit set the rule cannot produce (a count other than min(n_s, masks left), …) has probability 0:
`impossible` (LOG_ZERO by default, −inf for the exact law).
"""

from __future__ import annotations

import math

import torch

from dllm_ais.likelihood.selection import LOG_ZERO
from dllm_ais.likelihood.trajectory import share_step_terms
from dllm_ais.models.sdar.model import block_canvas, two_stream_logits
from dllm_ais.models.sdar.selection import SDARRule, proposal_logprob, selection_logprob, transfer_counts
from dllm_ais.types import Rollout


def local_steps(commit_step: torch.Tensor, steps: int) -> torch.Tensor:
    """The global step of each block's local step s: commit_step [B, nb, Lb] (−1 = never committed) ->
    [B, nb, steps] long, −1 where the block has no step s."""
    srt = commit_step.sort(-1).values  # [B, nb, Lb]
    first = torch.ones_like(srt, dtype=torch.bool)
    first[..., 1:] = srt[..., 1:] != srt[..., :-1]
    first &= srt >= 0
    rank = first.long().cumsum(-1) - 1  # [B, nb, Lb]
    out = torch.full((*srt.shape[:2], steps), -1, dtype=torch.long, device=srt.device)
    for s in range(steps):
        at = first & (rank == s)
        out[..., s] = torch.where(at, srt, -1).max(-1).values
    return out


def shrink_steps(cs_b: torch.Tensor, steps: int, shrink: int) -> torch.Tensor:
    """TraceRL's shrink (Gen-Verse/dLLM-RL@10b4fd1 train/rl_trado.py:219-231 `collapse_k_unique`, applied per block
    at :518-524): a block's distinct commit steps in order, grouped `shrink` at a time; every slot of a group is
    scored at the state before the group's first step. cs_b [B, nb, Lb] long (−1: never committed) -> the same with
    each committed slot's step replaced by its group's first step (the anchor names a group by its last: only the
    partition matters)."""
    t_local = local_steps(cs_b, steps)  # [B, nb, S]
    hit = (cs_b[..., None] == t_local[..., None, :]) & (cs_b >= 0)[..., None]  # [B, nb, Lb, S]
    rank = hit.long().argmax(-1)  # [B, nb, Lb] the slot's local step
    first = t_local.gather(-1, (rank // shrink * shrink).clamp(max=steps - 1))
    return torch.where(cs_b >= 0, first, -1)


def path_terms(model, rollout: Rollout, config, mask_token_id: int, selection: bool = True,
               impossible: float = LOG_ZERO, shrink: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token [B, L] float64, log P(path) [B] float64) of each row of an SDAR rollout under `model` and the
    sampler `config` (SDARSamplerConfig). Per token: its token term plus an equal share of its step's selection term
    among the counted tokens (completion_mask) that step committed; the total counts every committed slot (the
    tokens after a stop in its block and the slots that fill the last block are part of the path). selection=False:
    the token terms only. shrink > 1: TraceRL's shrink (`shrink_steps`; token terms only, no longer the exact law).
    Differentiable through both when grad is enabled."""
    if shrink > 1 and selection:
        raise ValueError("TraceRL's shrink scores merged steps: it has no selection terms; pass selection=False.")
    rule = SDARRule.of(config, mask_token_id)
    if rule.temperature == 0:
        raise ValueError("the SDAR path law needs a sampling density: --temperature 0 (greedy) has none.")
    Lb, S = config.block_length, config.denoising_steps
    counts = transfer_counts(Lb, S)
    B, L = rollout.completion_ids.shape
    dev = rollout.completion_ids.device
    canvas = block_canvas(rollout.prompt_ids, rollout.prompt_mask, Lb, config.gen_length, mask_token_id,
                          completion_length=L)
    nb = canvas.num_blocks
    committed = rollout.commit_step >= 0
    clean = canvas.scatter(torch.where(committed, rollout.completion_ids, mask_token_id), canvas.ids)  # [B, T]
    cs = canvas.scatter(rollout.commit_step, torch.full_like(canvas.ids, -1))  # [B, T]
    slot = canvas.scatter(torch.ones_like(committed), torch.zeros_like(canvas.keep))  # completion slots
    cs_b, slot_b = cs.view(B, nb, Lb), slot.view(B, nb, Lb)
    if shrink > 1:
        cs_b = shrink_steps(cs_b, S, shrink)
    t_local = local_steps(cs_b, S)  # [B, nb, S]
    total = torch.zeros(B, dtype=torch.float64, device=dev)
    token_terms = torch.zeros(B, nb, Lb, dtype=torch.float64, device=dev)
    select_terms = torch.zeros(B, nb, Lb, dtype=torch.float64, device=dev)  # repeated on the step's commits
    for s in range(S):
        t = t_local[..., s]  # [B, nb]
        has = t >= 0
        if not bool(has.any()):
            break
        before = (cs_b >= 0) & (cs_b < t[..., None])  # committed at an earlier step of the block
        noisy = torch.where((slot_b & ~before).view(B, -1), mask_token_id, clean)  # states at local step s
        logits = two_stream_logits(model, noisy, clean, canvas.keep, Lb).view(B, nb, Lb, -1)
        rows = has.nonzero(as_tuple=True)
        lg = logits[rows]  # [n, Lb, V]
        masked = slot_b[rows] & ~before[rows]
        commit = cs_b[rows] == t[rows][:, None]
        tokens = clean.view(B, nb, Lb)[rows]
        token = torch.where(commit, proposal_logprob(lg, tokens, rule), 0.0)  # [n, Lb]
        token_terms = token_terms.index_put(rows, token_terms[rows] + token)
        total = total.index_add(0, rows[0], token.sum(-1))
        if selection:
            quota = torch.full((lg.shape[0],), counts[s], device=dev)
            term = selection_logprob(lg, masked, commit, tokens, quota, rule, impossible)  # [n]
            select_terms = select_terms.index_put(rows, torch.where(commit, term[:, None], select_terms[rows]))
            total = total.index_add(0, rows[0], term)
    counted = rollout.completion_mask.bool() & committed
    step_terms = canvas.gather(select_terms.view(B, -1), 0.0)  # [B, L]
    per_token = canvas.gather(token_terms.view(B, -1), 0.0) + share_step_terms(step_terms, rollout.commit_step,
                                                                               counted)
    return torch.where(counted, per_token, 0.0), total


def path_logprob(model, rollout: Rollout, config, mask_token_id: int, impossible: float = -math.inf
                 ) -> torch.Tensor:
    """log P(path) [B] float64 of each row (selection included; −inf for an impossible path by default)."""
    return path_terms(model, rollout, config, mask_token_id, impossible=impossible)[1]


def recorded_path_logprob(rollout: Rollout) -> torch.Tensor:
    """log P(path) [B] float64 from the sampler's record: Σ logp_rollout over committed slots plus each step's
    selection term once (logp_select repeats it on every slot the step committed). Needs record_selection=True."""
    if rollout.logp_rollout is None or rollout.logp_select is None:
        raise ValueError("the rollout has no logp_rollout / logp_select record: sample with record_selection=True.")
    committed = rollout.commit_step >= 0
    per_step = share_step_terms(rollout.logp_select, rollout.commit_step, committed)  # [B, L]
    return torch.where(committed, rollout.logp_rollout.double(), 0.0).sum(-1) + per_step.sum(-1)
