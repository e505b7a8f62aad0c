"""Divergence statistics of the rollout mismatch: k1/k2/k3 per token, rejection masks, and verl's diagnostic set.

r = π_old / μ per token, log r = ℓ_t = logp_old − logp_rollout (samples come from μ). Per-token statistics:

    k1 = −log r                 (unbiased for KL(μ ‖ π_old), can be negative)
    k2 = ½ (log r)²             (≥ 0, biased, low variance)
    k3 = r − 1 − log r          (≥ 0, unbiased for KL(μ ‖ π_old))

A rejection statistic is one of these aggregated per token (`token`: reject tokens) or per sequence (`seq_sum`,
`seq_mean`, `seq_max` over the sequence's counted tokens: reject whole sequences). Diagnostics (`rollout_diagnostics`)
follow verl's rollout-correction metrics; for LLaDA the per-token log-probs are the one-step estimator's (d1), so
perplexities and per-token ratios are estimator values, not exact ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of x over valid entries (any shape, broadcast); 0 when nothing is valid. Invalid x may be NaN."""
    return torch.where(valid, x, 0).sum() / valid.sum().clamp(min=1)


# ---------------------------------------------------------------------------------------------------- k1 / k2 / k3

def k1(log_r: torch.Tensor) -> torch.Tensor:
    """−log r."""
    return -log_r


def k2(log_r: torch.Tensor) -> torch.Tensor:
    """½ (log r)²."""
    return 0.5 * log_r * log_r


def k3(log_r: torch.Tensor) -> torch.Tensor:
    """r − 1 − log r, computed as expm1(log r) − log r (no cancellation near r = 1)."""
    return torch.expm1(log_r) - log_r


DIVERGENCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"k1": k1, "k2": k2, "k3": k3}


# ------------------------------------------------------------------------------------------- per-sequence aggregation
# stat [B, L], valid [B, L] bool -> [B] (0 for a sequence with no counted token).

def seq_sum(stat: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Σ_t stat over counted tokens."""
    return torch.where(valid, stat, 0).sum(-1)


def seq_mean(stat: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of stat over counted tokens."""
    return seq_sum(stat, valid) / valid.sum(-1).clamp(min=1)


def seq_max(stat: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Max of stat over counted tokens."""
    out = torch.where(valid, stat, float("-inf")).amax(-1) if stat.shape[-1] else stat.new_zeros(stat.shape[:-1])
    return torch.where(valid.any(-1), out, 0)


SEQ_AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "seq_sum": seq_sum, "seq_mean": seq_mean, "seq_max": seq_max,
}


def reject_keep(token_log_r: torch.Tensor, valid: torch.Tensor, stat: str, agg: str, threshold: float,
                lower: float | None = None, clamp: float = 20.0) -> torch.Tensor:
    """Keep mask of a divergence rejection: [B, L] (agg `token`) or [B] (`seq_*`), True = kept.

    token_log_r: [B, L] per-token log r (anything where not valid); valid: [B, L] bool. log r is clamped to ±clamp
    first (verl's SAFETY_BOUND = 20; the same clamp as mismatch/k3_token, so the logged statistic is the one that
    decides). A sample is rejected when its aggregated statistic is > threshold; with `lower` (k1, verl's two-sided
    ratio bounds) it is kept iff log(lower) <= statistic <= log(threshold). Invalid positions / empty sequences are
    kept (they carry no loss anyway).
    """
    lr = torch.where(valid, token_log_r, 0).clamp(-clamp, clamp)  # [B, L]
    per_token = DIVERGENCES[stat](lr)  # [B, L]
    value = per_token if agg == "token" else SEQ_AGGREGATIONS[agg](per_token, valid)  # [B, L] or [B]
    if lower is None:
        bad = value > threshold
    else:
        bad = (value < math.log(lower)) | (value > math.log(threshold))
    counted = valid if agg == "token" else valid.any(-1)
    return ~(counted & bad)


def chain_keep(token_log_r: torch.Tensor, valid: torch.Tensor, rules, clamp: float = 20.0
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's chained rollout_rs: a sample is kept when it passes every rule (logical AND).

    rules: RejectRule-like (stat, agg, upper, lower, name). Returns the keep mask — [B] when every rule is per
    sequence, else [B, L] (sequence decisions broadcast over the sequence's tokens) — and each rule's rejected
    fraction over its own samples (tokens for `token`, non-empty sequences otherwise), keyed by the rule's name.
    """
    keeps, fracs = [], {}
    seq_valid = valid.any(-1)  # [B]
    for rule in rules:
        keep = reject_keep(token_log_r, valid, rule.stat, rule.agg, rule.upper, rule.lower, clamp)
        fracs[rule.name] = masked_mean((~keep).double(), valid if keep.dim() == 2 else seq_valid)
        keeps.append(keep)
    if any(k.dim() == 2 for k in keeps):
        keeps = [k if k.dim() == 2 else k[:, None].expand_as(valid) for k in keeps]
    out = keeps[0]
    for k in keeps[1:]:
        out = out & k
    return out, fracs


# ---------------------------------------------------------------------------------------------------- diagnostics

def rollout_diagnostics(logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
                        clamp: float = 20.0) -> dict[str, torch.Tensor]:
    """verl's mismatch diagnostics from per-token log-probs of π_old ([B, L]) and μ ([B, L]), mask [B, L] bool.

    Per sequence i with counted tokens T_i (sequences without any are skipped), ℓ_it = logp_old − logp_rollout:
      ppl_train   = mean_i exp(−mean_t logp_old_it)        ppl_rollout = mean_i exp(−mean_t logp_rollout_it)
      log_ppl_diff = mean_i (log ppl_train_i − log ppl_rollout_i) = mean_i (−mean_t ℓ_it)
      chi2_token  = mean_{i,t} exp(2 ℓ̂_it) − 1                 (E[w²] − 1 over tokens; ℓ̂ clamped to ±clamp)
      chi2_seq    = mean_i exp(2 clamp(Σ_t ℓ_it)) − 1            (E[W²] − 1 over sequences)
      kl_token    = mean_{i,t} k1(ℓ_it)                         k3_token = mean_{i,t} k3(ℓ̂_it)
      log_ppl_train = mean_i (−mean_t logp_old_it)          log_ppl_rollout = mean_i (−mean_t logp_rollout_it)
      log_ppl_abs_diff = mean_i |mean_t ℓ_it|                log_ppl_diff_max / _min = max_i / min_i (−mean_t ℓ_it)
      ppl_ratio   = mean_i exp(−mean_t ℓ_it)                  (= mean_i ppl_train_i / ppl_rollout_i)
    (verl's compute_offpolicy_metrics, under our names; verl counts a row without tokens as ℓ = 0, we leave it out:
    docs/corrections.md §8b.) All 0-dim, detached.
    """
    valid = mask.bool()
    seq_valid = valid.any(-1)  # [B]
    old = torch.where(valid, logp_old.detach().double(), 0)  # [B, L]
    roll = torch.where(valid, logp_rollout.detach().double(), 0)
    lr = old - roll  # [B, L]
    lr_hat = lr.clamp(-clamp, clamp)
    mean_old, mean_roll = seq_mean(old, valid), seq_mean(roll, valid)  # [B]
    seq_lr = seq_sum(lr, valid).clamp(-clamp, clamp)  # [B]
    diff = mean_roll - mean_old  # [B] log ppl_train_i − log ppl_rollout_i
    return {
        "ppl_train": masked_mean(torch.exp(-mean_old), seq_valid),
        "ppl_rollout": masked_mean(torch.exp(-mean_roll), seq_valid),
        "log_ppl_diff": masked_mean(mean_roll - mean_old, seq_valid),
        "chi2_token": masked_mean(torch.expm1(2 * lr_hat), valid),
        "chi2_seq": masked_mean(torch.expm1(2 * seq_lr), seq_valid),
        "kl_token": masked_mean(k1(lr), valid),
        "k3_token": masked_mean(k3(lr_hat), valid),
        "log_ppl_train": masked_mean(-mean_old, seq_valid),
        "log_ppl_rollout": masked_mean(-mean_roll, seq_valid),
        "log_ppl_abs_diff": masked_mean(diff.abs(), seq_valid),
        "log_ppl_diff_max": _seq_extreme(diff, seq_valid, largest=True),
        "log_ppl_diff_min": _seq_extreme(diff, seq_valid, largest=False),
        "ppl_ratio": masked_mean(torch.exp(diff.clamp(max=clamp)), seq_valid),
    }


def _seq_extreme(x: torch.Tensor, valid: torch.Tensor, largest: bool) -> torch.Tensor:
    """max (largest) or min of x [B] over valid entries; 0 when none is valid."""
    if x.numel() == 0:
        return x.new_zeros(())
    picked = torch.where(valid, x, float("-inf") if largest else float("inf"))
    return torch.where(valid.any(), picked.amax() if largest else picked.amin(), 0)
