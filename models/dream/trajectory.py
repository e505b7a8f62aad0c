"""The path log-probability of a Dream rollout (models/dream/sampler.py, uncached `diffusion_generate`) under a model:
every step's token terms (log q of the filtered proposal, models/dream/selection.py) plus its selection term.

The canvas of step t is the prompt plus the tokens with commit_step < t (the rest masked); every step of the schedule
is replayed, including those that committed nothing (origin's "nobody moved" has probability Π (1 − p_move) < 1). A
step that committed a number of tokens other than the schedule's k has probability 0 (`LOG_ZERO`). Cached rollouts
(Fast-dLLM) are scored from the sampler's own record (`recorded_path_logprob`): their logits came from the cache.
"""

from __future__ import annotations

import torch

from dllm_ais.likelihood.selection import LOG_ZERO
from dllm_ais.likelihood.trajectory import share_step_terms
from dllm_ais.models.dream.selection import (
    DreamRule,
    dream_selection_logprob,
    move_probability,
    proposal_logprob,
    scheduled_count,
)
from dllm_ais.types import Rollout


def _step_canvas(rollout: Rollout, t: int, mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, P + L], attention mask [B, P + L]) of step t."""
    done = (rollout.commit_step >= 0) & (rollout.commit_step < t)
    completion = torch.where(done, rollout.completion_ids, mask_token_id)
    ids = torch.cat([rollout.prompt_ids, completion], dim=1)
    attn = torch.cat([rollout.prompt_mask.bool(), torch.ones_like(done)], dim=1)
    return ids, attn


def path_terms(model, rollout: Rollout, config, mask_token_id: int, selection: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token [B, L] float64, log P(path) [B] float64) of each row of an uncached Dream rollout under `model`
    (raw logits, shifted here) and the sampler `config` (DreamSamplerConfig). Per token: its own token term plus an
    equal share of its step's selection term among the completion's counted tokens (completion_mask) that step
    committed; a step that committed no counted token (origin's "nobody moved", a k = 0 step, an EOS-tail step)
    gives its term to the total only. selection=False: the token terms only (the commit-only likelihood, as LLaDA's
    `trajectory_selection` off). Differentiable through the token terms when grad is enabled."""
    if config.cache != "none":
        raise ValueError(f"cache={config.cache!r}: a cached Dream rollout's logits came from the cache; score it with "
                         "recorded_path_logprob (the sampler's record) instead.")
    rule = DreamRule.of(config, mask_token_id)
    P = rollout.prompt_ids.shape[1]
    B, L = rollout.completion_ids.shape
    total = torch.zeros(B, dtype=torch.float64, device=rollout.completion_ids.device)
    per_token = torch.zeros(B, L, dtype=torch.float64, device=total.device)
    counted = rollout.completion_mask.bool()
    cs, tokens = rollout.commit_step, rollout.completion_ids
    for t in range(config.steps):
        ids, attn = _step_canvas(rollout, t, mask_token_id)
        logits = model(input_ids=ids, attention_mask=attn, positions=slice(P - 1, P + L - 1)).logits  # [B, L, V]
        masked = (cs < 0) | (cs >= t)  # [B, L] masked before step t
        commit = cs == t
        token = torch.where(commit, proposal_logprob(logits, tokens, rule), 0.0).double()  # [B, L]
        p_move = move_probability(t, config.steps, config.eps) if rule.alg == "origin" else None
        select = dream_selection_logprob(logits, masked, commit, tokens, rule, p_move)  # [B]
        if not selection:
            select = torch.zeros_like(select)
        elif rule.alg != "origin":  # the schedule's k for this row's canvas
            k = torch.tensor([scheduled_count(masked[b:b + 1], t, config.steps, config.eps) for b in range(B)],
                             device=commit.device)
            select = torch.where(commit.sum(-1) == k, select, torch.full_like(select, LOG_ZERO))
        total = total + token.sum(-1) + select
        shared = commit & counted
        per_token = per_token + token + torch.where(shared, select[:, None] / shared.sum(-1, keepdim=True).clamp(
            min=1), 0.0)
    return torch.where(counted, per_token, 0.0), total


def path_logprob(model, rollout: Rollout, config, mask_token_id: int) -> torch.Tensor:
    """log P(path) [B] float64 of each row of an uncached Dream rollout under `model` (raw logits, shifted here) and
    the sampler `config` (DreamSamplerConfig). Differentiable through the token terms when grad is enabled."""
    return path_terms(model, rollout, config, mask_token_id)[1]


def recorded_path_logprob(rollout: Rollout) -> torch.Tensor:
    """log P(path) [B] float64 from the sampler's record: Σ logp_rollout over committed tokens plus each step's
    selection term once (logp_select repeats it on every token the step committed). Needs record_selection=True.
    origin's steps that moved nothing (probability Π (1 − p_move)) hold no token, so no record: use path_logprob."""
    if rollout.logp_rollout is None or rollout.logp_select is None:
        raise ValueError("the rollout has no logp_rollout / logp_select record: sample with record_selection=True.")
    committed = rollout.commit_step >= 0
    per_step = share_step_terms(rollout.logp_select, rollout.commit_step, committed)  # [B, L]
    return torch.where(committed, rollout.logp_rollout.double(), 0.0).sum(-1) + per_step.sum(-1)
