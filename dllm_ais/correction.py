"""Mismatch corrections for FP8 rollouts: none / is / tis / mis / ais, and the AIS diagnostics (DESIGN.md §4).

Input: mismatch log-weights log_w = logp_old − logp_rollout, per sequence ([B]) or per token ([B, L]), the
advantages Â ([B]) and the completion mask ([B, L]). Output: a detached weight ω that multiplies the per-token GRPO
surrogate (dllm_ais/grpo.py), plus every diagnostic. The formulas, with the token-level reading, are in docs/ais.md.

A "sample" is a sequence at sequence level and a counted token at token level; every diagnostic is a plain average
over the valid samples:

    ℓ̂ = clamp(ℓ, −c, c)     w = exp(ℓ̂)     w̃ = min(w, C)
    R = (Σ w̃)² / (n Σ w̃²)                                   ess_fraction
    D = mean |ℓ̂| / len       (len = L_i for sequences, 1 for tokens)   divergence
    s = 1 − exp(−D / τ)                                      severity
    V = Var(w̃ Â) / Var(Â)    (V = 1 when Var(Â) ≈ 0)          variance_amplification
    g = min(1, 1 / V)                                        damping
    λ = clip(s · R · g, 0, 1), then optionally EMA across steps
    ω = (1 − λ) + λ w̃                                        (correction "ais")

Masked positions never influence anything: invalid log-weights (NaN, ±inf, garbage) are replaced with torch.where
before any arithmetic, and ω is 1 there. Empty batches give the neutral values R = 1, D = 0, V = 1, λ = 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dllm_ais.rl_config import CorrectionConfig

VAR_EPS = 1e-12
"""Var(Â) at or below this counts as zero (advantages are O(1); std 1e-6 carries no signal): then V := 1."""


# ---------------------------------------------------------------------------------------------------------- helpers

def masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of x over valid entries (any shape, broadcast); 0 when nothing is valid. Invalid x may be NaN."""
    n = valid.sum()
    return torch.where(valid, x, 0).sum() / n.clamp(min=1)


def masked_var(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Population variance (divide by n) of x over valid entries; 0 when nothing is valid."""
    centred = x - masked_mean(x, valid)
    return masked_mean(centred * centred, valid)


def _masked_extreme(x: torch.Tensor, valid: torch.Tensor, largest: bool) -> torch.Tensor:
    """Max (largest) or min of x over valid entries; 0 when nothing is valid."""
    if x.numel() == 0:
        return x.new_zeros(())
    fill = float("-inf") if largest else float("inf")
    picked = torch.where(valid, x, fill)
    out = picked.amax() if largest else picked.amin()
    return torch.where(valid.any(), out, 0)


# ------------------------------------------------------------------------------------------------------ diagnostics

def safe_log_weights(log_w: torch.Tensor, valid: torch.Tensor, clamp: float) -> torch.Tensor:
    """ℓ̂ = clamp(ℓ, −clamp, clamp) on valid entries, 0 elsewhere (so padded NaN/inf never propagate)."""
    return torch.where(valid, log_w, 0).clamp(-clamp, clamp)


def ess_fraction(w_trunc: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """R = (Σ w̃)² / (n Σ w̃²) ∈ (0, 1]: normalised effective sample size of the truncated weights; 1 if n = 0."""
    w = torch.where(valid, w_trunc, 0)
    n = valid.sum()
    num = w.sum() ** 2
    den = n * (w * w).sum()
    ratio = num / den.clamp(min=torch.finfo(w.dtype).tiny)
    return torch.where(n > 0, ratio, 1).clamp(max=1)


def divergence(per_token_log_w: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """D = mean over valid samples of |ℓ̂| / len: the per-token mean absolute log-ratio; 0 if nothing is valid."""
    return masked_mean(per_token_log_w.abs(), valid)


def severity(d: torch.Tensor, tau: float) -> torch.Tensor:
    """s = 1 − exp(−D / τ) ∈ [0, 1): 0 when the policies agree, → 1 as D grows past τ."""
    return -torch.expm1(-d / tau)


def variance_amplification(w_trunc: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor,
                           eps: float = VAR_EPS) -> torch.Tensor:
    """V = Var(w̃ Â) / Var(Â) over valid samples (population variances).

    When Var(Â) <= eps (B = 1, all-equal rewards, no valid sample) the ratio is 0/0; V := 1, "no measurable
    amplification", so the damping g is neutral and λ = s · R is still logged and fed to the EMA. The gradient of
    the surrogate does not depend on λ in the Â ≡ 0 case anyway.
    """
    var_adv = masked_var(adv, valid)
    var_weighted = masked_var(w_trunc * adv, valid)
    return torch.where(var_adv > eps, var_weighted / var_adv.clamp(min=eps), 1)


def damping(v: torch.Tensor) -> torch.Tensor:
    """g = min(1, 1 / V): shrink λ when full IS would inflate the gradient signal's variance."""
    return 1 / v.clamp(min=1)


def combine_product(s: torch.Tensor, r: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """λ = clip(s · R · g, 0, 1): correct only when the mismatch is severe, the weights reliable and tame."""
    return (s * r * g).clamp(0, 1)


COMBINERS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "product": combine_product,
}


def ema(lam_batch: torch.Tensor, prev_lam: torch.Tensor | float | None, beta: float) -> torch.Tensor:
    """λ_t = β λ_{t−1} + (1 − β) λ_batch; the first step (prev_lam None) and β = 0 return λ_batch unchanged."""
    if prev_lam is None or beta == 0.0:
        return lam_batch
    prev = torch.as_tensor(prev_lam, dtype=lam_batch.dtype, device=lam_batch.device)
    return (beta * prev + (1 - beta) * lam_batch).clamp(0, 1)


# ------------------------------------------------------------------------------------------------------- weights ω
# Sibling functions chosen once by name. Arguments: w = exp(ℓ̂), w_trunc = min(w, C), lam = λ, cap = C.

def omega_none(w: torch.Tensor, w_trunc: torch.Tensor, lam: torch.Tensor, cap: float) -> torch.Tensor:
    """No correction: ω ≡ 1."""
    return torch.ones_like(w)


def omega_is(w: torch.Tensor, w_trunc: torch.Tensor, lam: torch.Tensor, cap: float) -> torch.Tensor:
    """Plain importance sampling: ω = w (≤ e^clamp, finite)."""
    return w


def omega_tis(w: torch.Tensor, w_trunc: torch.Tensor, lam: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated IS: ω = min(w, C)."""
    return w_trunc


def omega_mis(w: torch.Tensor, w_trunc: torch.Tensor, lam: torch.Tensor, cap: float) -> torch.Tensor:
    """Masked IS: keep ω = w where w <= C, drop the sample (ω = 0) where w > C."""
    return torch.where(w <= cap, w, 0)


def omega_ais(w: torch.Tensor, w_trunc: torch.Tensor, lam: torch.Tensor, cap: float) -> torch.Tensor:
    """AIS: ω = (1 − λ) + λ min(w, C), so the gradient is (1 − λ) ĝ_none + λ ĝ_tis exactly."""
    return (1 - lam) + lam * w_trunc


CORRECTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "none": omega_none,
    "is": omega_is,
    "tis": omega_tis,
    "mis": omega_mis,
    "ais": omega_ais,
}


# -------------------------------------------------------------------------------------------------------- record

_METRIC_NAMES = {
    "lam": "ais/lambda",
    "lam_batch": "ais/lambda_batch",
    "ess_frac": "ais/ess_frac",
    "divergence": "ais/divergence",
    "severity": "ais/severity",
    "var_amp": "ais/var_amp",
    "damping": "ais/damping",
    "trunc_frac": "ais/trunc_frac",
    "log_w_mean": "ais/log_w_mean",
    "log_w_min": "ais/log_w_min",
    "log_w_max": "ais/log_w_max",
    "mismatch_kl": "mismatch/kl",
    "mismatch_k3": "mismatch/k3",
}


@dataclass(frozen=True)
class CorrectionOutput:
    """ω and the diagnostics of one batch. Every tensor is detached; scalars are 0-dim."""

    omega: torch.Tensor
    """[B] (sequence level) or [B, L] (token level) weight multiplying the per-token surrogate; 1 where not valid."""
    lam: torch.Tensor
    """λ in [0, 1] after the EMA: what `ais` applied. Pass it back as `prev_lam` next step. Computed (and logged)
    for every correction, so the baselines show what AIS would have done."""
    lam_batch: torch.Tensor
    """λ from this batch alone (before the EMA)."""
    ess_frac: torch.Tensor
    """R ∈ (0, 1]: normalised effective sample size of the truncated weights."""
    divergence: torch.Tensor
    """D >= 0: mean per-token |log w| (of the clamped log-weights)."""
    severity: torch.Tensor
    """s = 1 − exp(−D / τ) ∈ [0, 1)."""
    var_amp: torch.Tensor
    """V = Var(w̃ Â) / Var(Â) >= 0 (1 when Var(Â) = 0)."""
    damping: torch.Tensor
    """g = min(1, 1 / V) ∈ (0, 1]."""
    trunc_frac: torch.Tensor
    """Fraction of valid samples with w > C (truncated by tis/ais, dropped by mis)."""
    log_w_mean: torch.Tensor
    """Mean of the clamped log-weights over valid samples (per sequence or per token, by level)."""
    log_w_min: torch.Tensor
    """Minimum clamped log-weight (0 if nothing is valid)."""
    log_w_max: torch.Tensor
    """Maximum clamped log-weight (0 if nothing is valid)."""
    mismatch_kl: torch.Tensor
    """Per-token k1 estimate of KL(μ ‖ π_old) = mean(−ℓ̂ / len); unbiased but can be negative on a batch."""
    mismatch_k3: torch.Tensor
    """Per-token k3 estimate of KL(μ ‖ π_old) = mean((w − 1 − ℓ̂) / len) >= 0."""

    def metrics(self) -> dict[str, float]:
        """Scalar metrics under DESIGN.md §8 names (one device sync)."""
        values = torch.stack([getattr(self, f).double() for f in _METRIC_NAMES]).tolist()
        return dict(zip(_METRIC_NAMES.values(), values, strict=True))


# ----------------------------------------------------------------------------------------------------------- main

def correct(log_w: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: CorrectionConfig,
            prev_lam: torch.Tensor | float | None = None) -> CorrectionOutput:
    """Compute ω and the AIS diagnostics for one batch.

    log_w:    [B] (cfg.correction_level = sequence) or [B, L] (token) log π_old − log μ; any value (NaN, ±inf)
              where not counted. A NaN at a counted position propagates (a loud upstream bug, never hidden).
    adv:      [B] advantages Â.
    mask:     [B, L] bool, completion tokens that count. Sequence level: L_i = mask[i].sum(), and a sequence
              with no counted token is not a sample.
    prev_lam: the previous step's `lam` for the EMA (cfg.ais_ema > 0); None on the first step.
    """
    valid_tok = mask.bool()  # [B, L]
    lengths = valid_tok.sum(-1)  # [B]
    if adv.shape != lengths.shape:
        raise ValueError(f"adv must have shape [B] = {tuple(lengths.shape)}, got {tuple(adv.shape)}.")
    if cfg.correction_level == "sequence":
        if log_w.shape != lengths.shape:
            raise ValueError(f"correction_level='sequence' needs log_w of shape [B] = {tuple(lengths.shape)}, got "
                             f"{tuple(log_w.shape)}; pass per-token log-weights with correction_level='token'.")
        valid = lengths > 0  # [B]
        per_len = lengths.clamp(min=1)  # [B]
        adv_s = adv  # [B]
    else:
        if log_w.shape != valid_tok.shape:
            raise ValueError(f"correction_level='token' needs log_w of shape [B, L] = {tuple(valid_tok.shape)}, "
                             f"got {tuple(log_w.shape)}; pass per-sequence log-weights with correction_level="
                             "'sequence'.")
        valid = valid_tok  # [B, L]
        per_len = torch.ones_like(lengths)[:, None]  # [B, 1]
        adv_s = adv[:, None].expand_as(valid_tok)  # [B, L]

    dtype = torch.promote_types(log_w.dtype, torch.float32)
    lw = safe_log_weights(log_w.detach().to(dtype), valid, cfg.log_w_clamp)  # [B] or [B, L]
    adv_s = torch.where(valid, adv_s.detach().to(dtype), 0)
    w = lw.exp()
    w_trunc = w.clamp(max=cfg.is_cap)
    per_token_lw = lw / per_len  # ℓ̂ / len

    r = ess_fraction(w_trunc, valid)
    d = divergence(per_token_lw, valid)
    s = severity(d, cfg.ais_tau)
    v = variance_amplification(w_trunc, adv_s, valid)
    g = damping(v)
    lam_batch = COMBINERS[cfg.ais_combiner](s, r, g)
    lam = ema(lam_batch, prev_lam, cfg.ais_ema)

    omega = CORRECTIONS[cfg.correction](w, w_trunc, lam, cfg.is_cap)
    omega = torch.where(valid, omega, 1)

    return CorrectionOutput(
        omega=omega, lam=lam, lam_batch=lam_batch, ess_frac=r, divergence=d, severity=s, var_amp=v, damping=g,
        trunc_frac=masked_mean((w > cfg.is_cap).to(dtype), valid),
        log_w_mean=masked_mean(lw, valid),
        log_w_min=_masked_extreme(lw, valid, largest=False),
        log_w_max=_masked_extreme(lw, valid, largest=True),
        mismatch_kl=masked_mean(-per_token_lw, valid),
        mismatch_k3=masked_mean((torch.expm1(lw) - lw) / per_len, valid),  # w − 1 − ℓ̂ without cancellation
    )
