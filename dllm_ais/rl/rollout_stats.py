"""Parallel-decoding diagnostics of a masked-diffusion rollout (DESIGN.md §8 names in dllm_ais/metrics.py).

Confidence (Fast-dLLM threshold) decoding can commit many tokens per step and make a group's G completions alike;
d1's authors saw over-confident logits and too many tokens per step make such rollouts unstable in RL. These
statistics watch for that: tokens committed per denoising step (mean and max), distinct completions per group, and the
mean confidence the counted tokens were committed with.
"""

from __future__ import annotations

import torch

from dllm_ais import metrics as M


def tokens_per_step(commit_step: torch.Tensor) -> torch.Tensor:
    """Tokens committed at each (row, step): commit_step [B, L] (−1 = never) -> [B, S] long (S = last step + 1)."""
    S = int(commit_step.max()) + 1 if commit_step.numel() else 0
    counts = torch.zeros(commit_step.shape[0], max(S, 1), dtype=torch.long, device=commit_step.device)
    return counts.scatter_add_(1, commit_step.clamp(min=0), (commit_step >= 0).long())


def group_distinct(completion_ids: torch.Tensor, completion_mask: torch.Tensor, group: int) -> torch.Tensor:
    """Distinct counted completions per group of `group` consecutive rows: [B, L] x2 -> [B / group] long."""
    kept = torch.where(completion_mask.bool(), completion_ids, -1)  # what a reward sees: the counted tokens
    return torch.tensor([len(torch.unique(g, dim=0)) for g in kept.split(group)], device=completion_ids.device)


def commit_stats(commit_step: torch.Tensor, completion_mask: torch.Tensor, completion_ids: torch.Tensor,
                 group: int, confidence: torch.Tensor | None = None) -> dict[str, float]:
    """rollout/tokens_per_step (mean over (row, step) pairs that committed something) and its max, rollout/
    group_distinct (mean over groups), rollout/commit_confidence (mean over counted tokens; only with a
    confidence [B, L] record, i.e. low-confidence remasking)."""
    counts = tokens_per_step(commit_step)  # [B, S]
    active = counts > 0
    out = {M.ROLLOUT_TOKENS_PER_STEP: float(counts[active].double().mean()) if bool(active.any()) else 0.0,
           M.ROLLOUT_TOKENS_PER_STEP_MAX: float(counts.max()),
           M.ROLLOUT_GROUP_DISTINCT: float(group_distinct(completion_ids, completion_mask, group).double().mean())}
    if confidence is not None:
        valid = completion_mask.bool() & torch.isfinite(confidence)
        out[M.ROLLOUT_COMMIT_CONFIDENCE] = float(confidence[valid].double().mean()) if bool(valid.any()) else 0.0
    return out
