"""Vectorised twins of the trajectory likelihood's replay plans for rung 2 (issue 40), where a cell replays tens of
thousands of sequences per batch: the package's `replay_plan` and `merge_commit_steps`
(likelihood/trajectory.py) loop over sequences in Python. Same laws, checked against them in
tests/test_mc_ground_truth.py: `step_plan` draws K of a sequence's S_b counted steps uniformly without replacement
(random keys instead of `randperm`, so the draws differ, not their law) and scales the chosen steps' tokens by
S_b / K (Horvitz–Thompson); `merged_steps` equals `merge_commit_steps` exactly.
"""

from __future__ import annotations

import torch


def counted_step_table(commit_step: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """[B, S] bool: step s committed a counted token of sequence b (S = the largest step + 1)."""
    B = commit_step.shape[0]
    valid = counted & (commit_step >= 0)
    S = int(commit_step.max()) + 1 if bool(valid.any()) else 1
    has = torch.zeros(B, S, dtype=torch.bool)
    b, j = valid.nonzero(as_tuple=True)
    has[b, commit_step[b, j]] = True
    return has


def step_plan(commit_step: torch.Tensor, counted: torch.Tensor, num_steps: int | None,
              generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scale [B, L] float64, chosen [B, S] bool, rows [B] float64): `replay_plan`'s law. num_steps None = every
    counted step (scale 1 on counted committed tokens)."""
    has = counted_step_table(commit_step, counted)
    chosen, weight = has, torch.ones(has.shape[0], dtype=torch.float64)
    if num_steps is not None:
        keys = torch.rand(has.shape, generator=generator, dtype=torch.float64).masked_fill(~has, 2.0)
        chosen = has & (keys.argsort(-1).argsort(-1) < num_steps)
        S = has.sum(-1)
        weight = torch.where(S > num_steps, S.double() / num_steps, 1.0)
    valid = counted & (commit_step >= 0)
    picked = chosen.gather(1, commit_step.clamp(min=0)) & valid
    return torch.where(picked, weight[:, None], 0.0), chosen, chosen.sum(-1).double()


def merged_steps(commit_step: torch.Tensor, merge: int, block_length: int) -> torch.Tensor:
    """`merge_commit_steps` vectorised: per block, each token takes the first step of its run of `merge`
    consecutive distinct commit steps. commit_step [B, L] (−1 = never committed) -> [B, L]."""
    if merge == 1:
        return commit_step
    B, L = commit_step.shape
    c = commit_step.view(B, L // block_length, block_length)  # [B, nb, Lb]
    big = torch.iinfo(c.dtype).max
    vals = torch.where(c >= 0, c, big)
    srt = vals.sort(-1).values
    first = torch.ones_like(srt, dtype=torch.bool)
    first[..., 1:] = srt[..., 1:] != srt[..., :-1]
    first &= srt < big
    rank = (first[..., None, :] & (srt[..., None, :] < vals[..., :, None])).sum(-1)  # [B, nb, Lb] distinct below
    slot = torch.where(first, first.long().cumsum(-1) - 1, block_length)  # rank of each distinct value
    table = torch.full((*c.shape[:2], block_length + 1), big, dtype=c.dtype).scatter_(-1, slot, srt)
    out = table.gather(-1, ((rank // merge) * merge).clamp(max=block_length))
    return torch.where(c >= 0, out, c).view(B, L)
