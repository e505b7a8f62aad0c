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


def reject_keep(token_log_r: torch.Tensor, valid: torch.Tensor, stat: str, agg: str,
                threshold: float) -> torch.Tensor:
    """Keep mask of a divergence rejection: [B, L] (agg `token`) or [B] (`seq_*`), True = kept.

    token_log_r: [B, L] per-token log r (anything where not valid); valid: [B, L] bool. A sample is rejected when its
    aggregated statistic is > threshold. Invalid positions / empty sequences are kept (they carry no loss anyway).
    """
    lr = torch.where(valid, token_log_r, 0)  # [B, L]
    per_token = DIVERGENCES[stat](lr)  # [B, L]
    if agg == "token":
        return ~(valid & (per_token > threshold))  # [B, L]
    return ~(valid.any(-1) & (SEQ_AGGREGATIONS[agg](per_token, valid) > threshold))  # [B]


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
    All 0-dim, detached.
    """
    valid = mask.bool()
    seq_valid = valid.any(-1)  # [B]
    old = torch.where(valid, logp_old.detach().double(), 0)  # [B, L]
    roll = torch.where(valid, logp_rollout.detach().double(), 0)
    lr = old - roll  # [B, L]
    lr_hat = lr.clamp(-clamp, clamp)
    mean_old, mean_roll = seq_mean(old, valid), seq_mean(roll, valid)  # [B]
    seq_lr = seq_sum(lr, valid).clamp(-clamp, clamp)  # [B]
    return {
        "ppl_train": masked_mean(torch.exp(-mean_old), seq_valid),
        "ppl_rollout": masked_mean(torch.exp(-mean_roll), seq_valid),
        "log_ppl_diff": masked_mean(mean_roll - mean_old, seq_valid),
        "chi2_token": masked_mean(torch.expm1(2 * lr_hat), valid),
        "chi2_seq": masked_mean(torch.expm1(2 * seq_lr), seq_valid),
        "kl_token": masked_mean(k1(lr), valid),
        "k3_token": masked_mean(k3(lr_hat), valid),
    }
