"""A cheap detector of QaRL's "error tokens": repetitive spans in (long, quantised) rollouts.

    repeat_frac_i = #{j : n-gram j of completion i equals some earlier n-gram j' < j} / #n-grams of completion i

over the counted tokens (mask) of each completion; 0 for completions shorter than n + 1 tokens. A completion that
loops ("the the the …") scores near 1, a varied one near 0. `error_keep` turns it into a keep mask for the loss.
"""

from __future__ import annotations

import torch


def repeated_ngram_fraction(ids: torch.Tensor, mask: torch.Tensor, n: int = 4) -> torch.Tensor:
    """ids [B, L] int, mask [B, L] bool -> [B] float32 fraction of each completion's n-grams seen earlier in it."""
    if n < 1:
        raise ValueError(f"n-gram size n={n} must be >= 1.")
    out = torch.zeros(ids.shape[0], dtype=torch.float32)
    for i, (row, keep) in enumerate(zip(ids.tolist(), mask.bool().tolist(), strict=True)):
        tokens = [t for t, k in zip(row, keep, strict=True) if k]
        grams = [tuple(tokens[j:j + n]) for j in range(len(tokens) - n + 1)]
        if len(grams) < 2:
            continue
        seen: set[tuple[int, ...]] = set()
        repeats = 0
        for g in grams:
            repeats += g in seen
            seen.add(g)
        out[i] = repeats / len(grams)
    return out.to(ids.device)


def error_keep(repeat_frac: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """[B] bool: True where a completion stays in the loss (repeat_frac <= threshold; all True when None)."""
    if threshold is None:
        return torch.ones_like(repeat_frac, dtype=torch.bool)
    return repeat_frac <= threshold
