"""Mismatch corrections for FP8 rollouts: none / is / tis / mis / band / ais, and the AIS diagnostics (DESIGN.md §4).

Input: mismatch log-weights log_w = logp_old − logp_rollout, per sequence ([B]) or per token ([B, L]), the
advantages Â ([B]) and the completion mask ([B, L]). Output: a detached weight ω that multiplies the per-token GRPO
surrogate (dllm_ais/rl/grpo.py), plus every diagnostic. The formulas, with the token-level reading, are in docs/ais.md.

A "sample" is a sequence at sequence level and a counted token at token level; every diagnostic is a plain average
over the valid samples:

    ℓ̂ = clamp(ℓ, −c, c)     w = exp(ℓ̂)     w̃ = min(w, C)
    R = (Σ w̃)² / (n Σ w̃²)                                   ess_fraction
    D = mean |ℓ̂| / len       (len = L_i for sequences, 1 for tokens)   divergence
    s = 1 − exp(−D / τ)                                      severity
    V = Var(w̃ Â) / Var(Â)    (V = 1 when Var(Â) ≈ 0)          variance_amplification
    g = min(1, 1 / V)                                        damping
    λ = clip(s · R · g, 0, 1), then optionally EMA across steps
    ω = (1 − λ) + λ ω_target                                 (correction "ais"; target tis: ω_target = w̃)

Levels: `sequence` (ℓ_i per completion), `token` (ℓ_it), `geometric` (ℓ̄_i = mean_t ℓ_it, verl's seq_mean; len = 1).
Then optionally: divergence rejection (ω = 0 for samples failing any of cfg.rejection_rules(): k1/k2/k3 statistics,
k1 also two-sided, chained as verl's rollout_rs; mismatch_stats.chain_keep) and batch normalisation of ω to mean 1.
`rejected` decides whether ω = 0 samples stay in the loss normaliser (`zero`, TRL) or leave the loss mask (`drop`,
verl: `rejected_loss_mask`; normalisation then averages over all valid samples before rejection). verl's IS-weight
metrics (its per-token ESS among them) are logged beside ours. All formulas: docs/corrections.md.

Masked positions never influence anything: invalid log-weights (NaN, ±inf, garbage) are replaced with torch.where
before any arithmetic, and ω is 1 there. Empty batches give the neutral values R = 1, D = 0, V = 1, λ = 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dllm_ais.metrics import reject_frac_key
from dllm_ais.rl.config import CorrectionConfig
from dllm_ais.rl.mismatch_stats import chain_keep, k3, masked_mean

VAR_EPS = 1e-12
"""Var(Â) at or below this counts as zero (advantages are O(1); std 1e-6 carries no signal): then V := 1."""


# ---------------------------------------------------------------------------------------------------------- helpers

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


def combine_severity(s: torch.Tensor, r: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """λ = clip(s · g, 0, 1): correct as far as the mismatch is severe, damped only by variance amplification. R is
    left out: under `product` λ ≤ R, so AIS corrects least exactly when the weights spread most (docs/ais.md §5a)."""
    del r
    return (s * g).clamp(0, 1)


COMBINERS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "product": combine_product,
    "severity": combine_severity,
}


def ema(lam_batch: torch.Tensor, prev_lam: torch.Tensor | float | None, beta: float) -> torch.Tensor:
    """λ_t = β λ_{t−1} + (1 − β) λ_batch; the first step (prev_lam None) and β = 0 return λ_batch unchanged."""
    if prev_lam is None or beta == 0.0:
        return lam_batch
    prev = torch.as_tensor(prev_lam, dtype=lam_batch.dtype, device=lam_batch.device)
    return (beta * prev + (1 - beta) * lam_batch).clamp(0, 1)


# ------------------------------------------------------------------------------------------------------- weights ω
# Full-IS modes: sibling functions w -> ω chosen once by name (w = exp(ℓ̂), any shape; cfg gives the thresholds).

def omega_none(w: torch.Tensor, cfg: CorrectionConfig) -> torch.Tensor:
    """No correction: ω ≡ 1."""
    return torch.ones_like(w)


def omega_is(w: torch.Tensor, cfg: CorrectionConfig) -> torch.Tensor:
    """Plain importance sampling: ω = w (≤ e^clamp, finite)."""
    return w


def cap(cfg: CorrectionConfig) -> float:
    """C, or +inf when is_cap is None (TRL's clip_max=None: no upper bound)."""
    return math.inf if cfg.is_cap is None else cfg.is_cap


def truncate(w: torch.Tensor, cfg: CorrectionConfig) -> torch.Tensor:
    """w̃ = min(w, C) (w itself when C is None): the weight the AIS diagnostics use."""
    return w if cfg.is_cap is None else w.clamp(max=cfg.is_cap)


def omega_tis(w: torch.Tensor, cfg: CorrectionConfig) -> torch.Tensor:
    """Truncated IS (TIS; TRL's *_truncate): ω = clamp(w, C_min, C) — TRL clamps from below at its clip min too
    (C_min = 0, the default, changes nothing: w > 0)."""
    return w.clamp(min=cfg.is_cap_min, max=cfg.is_cap)


def omega_mis(w: torch.Tensor, cfg: CorrectionConfig) -> torch.Tensor:
    """Masked IS (MIS; TRL's *_mask): ω = w where C_min <= w <= C, the sample is dropped (ω = 0) elsewhere."""
    return torch.where((w <= cap(cfg)) & (w >= cfg.is_cap_min), w, 0)


def omega_band(w: torch.Tensor, cfg: CorrectionConfig) -> torch.Tensor:
    """IcePop's two-sided band: ω = w where band_low <= w <= band_high, 0 outside."""
    return torch.where((w >= cfg.band_low) & (w <= cfg.band_high), w, 0)


FULL_IS: dict[str, Callable[[torch.Tensor, CorrectionConfig], torch.Tensor]] = {
    "none": omega_none,
    "is": omega_is,
    "tis": omega_tis,
    "mis": omega_mis,
    "band": omega_band,
}


def omega_ais(w: torch.Tensor, lam: torch.Tensor, cfg: CorrectionConfig) -> torch.Tensor:
    """AIS: ω = (1 − λ) + λ ω_target, so the gradient is (1 − λ) ĝ_none + λ ĝ_target exactly."""
    return (1 - lam) + lam * FULL_IS[cfg.ais_target](w, cfg)


CORRECTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, CorrectionConfig], torch.Tensor]] = {
    **{name: (lambda w, lam, cfg, _f=f: _f(w, cfg)) for name, f in FULL_IS.items()},
    "ais": omega_ais,
}
"""correction -> ω(w, λ, cfg)."""


def mode_bounds(cfg: CorrectionConfig) -> tuple[float, float]:
    """(lower, upper) thresholds of the applied mode (AIS: its target), for the above/below-fraction diagnostics:
    band -> [band_low, band_high]; every other mode -> [C_min, C]."""
    mode = cfg.ais_target if cfg.correction == "ais" else cfg.correction
    return (cfg.band_low, cfg.band_high) if mode == "band" else (cfg.is_cap_min, cap(cfg))


def normalize_mean_one(omega: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """ω / mean(ω over valid kept samples) (verl's batch normalisation); unchanged when that mean is 0.
    A rejected sample (ω = 0) is not counted in the mean. ω ≡ 1 is returned bit for bit."""
    return _divide_by_mean(omega, valid & (omega != 0), floor=0.0)


def normalize_all_valid(omega: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """ω / mean(ω over every valid sample) — verl's batch normalisation, computed before rejection (`rejected=drop`);
    unchanged when that mean is <= 1e-8 (verl's guard). ω ≡ 1 is returned bit for bit."""
    return _divide_by_mean(omega, valid, floor=1e-8)


def _divide_by_mean(omega: torch.Tensor, over: torch.Tensor, floor: float) -> torch.Tensor:
    """ω / mean(ω over `over`), or ω unchanged when that mean is <= floor."""
    mean = masked_mean(omega, over)
    return torch.where(mean > floor, omega / torch.where(mean > floor, mean, 1), omega)


def rejected_loss_mask(omega: torch.Tensor, mask: torch.Tensor, cfg: CorrectionConfig) -> torch.Tensor:
    """The loss mask [B, L] after the correction: with `rejected=drop` (verl) every counted token whose ω is 0
    (rejected by divergence, or masked by mis / band) leaves the mask, so the loss's token means divide by the kept
    tokens only; with `zero` (TRL) the mask is returned unchanged and those tokens count with weight 0.
    omega: [B] or [B, L] from `correct`; mask: [B, L] bool."""
    if cfg.rejected != "drop":
        return mask
    kept = omega != 0
    return mask & (kept[:, None] if kept.dim() == 1 else kept)


def verl_is_stats(w: torch.Tensor, valid: torch.Tensor, counts: torch.Tensor, cfg: CorrectionConfig
                  ) -> dict[str, torch.Tensor]:
    """verl's IS-weight metrics (compute_is_metrics) on the weights w = exp(ℓ̂) before truncation.

    w, valid: [B] (one weight per sequence) or [B, L]; counts: how many tokens each sample stands for (verl
    broadcasts a sequence weight over its tokens, so every average is token-weighted): L_i, or 1 per token.
    c = clamp(w, 1/C, C) (no clamp when C is None):
      mean = Σ n w / Σ n            std = sqrt(max(0, E_n[c²] − E_n[c]²))        min / max of w
      ess  = 1 / E_n[(c / (E_n[c] + 1e-8))²]     (per token; ≠ ais/ess_frac, the per-sample ESS of min(w, C))
    """
    n = torch.where(valid, counts.to(w.dtype), 0)
    total = n.sum().clamp(min=1)

    def mean_n(x):
        return (torch.where(valid, x, 0) * n).sum() / total

    c = w if cfg.is_cap is None else w.clamp(min=1 / cfg.is_cap, max=cfg.is_cap)
    mean_c = mean_n(c)
    ess = 1 / mean_n((c / (mean_c + 1e-8)) ** 2)
    return {
        "is_mean": mean_n(w),
        "is_std": (mean_n(c * c) - mean_c * mean_c).clamp(min=0).sqrt(),
        "is_min": _masked_extreme(w, valid, largest=False),
        "is_max": _masked_extreme(w, valid, largest=True),
        "ess_verl": torch.where(n.sum() > 0, ess, 1),
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
    "frac_above": "corr/frac_above",
    "frac_below": "corr/frac_below",
    "reject_frac": "corr/reject_frac",
    "omega_ess": "corr/ess_frac",
    "omega_mean": "corr/omega_mean",
    "ess_verl": "corr/ess_verl",
    "is_mean": "corr/is_weight_mean",
    "is_std": "corr/is_weight_std",
    "is_min": "corr/is_weight_min",
    "is_max": "corr/is_weight_max",
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
    frac_above: torch.Tensor
    """Fraction of valid samples with w above the mode's upper threshold (C, or band_high for band)."""
    frac_below: torch.Tensor
    """Fraction of valid samples with w below the mode's lower threshold (C_min, or band_low for band)."""
    reject_frac: torch.Tensor
    """Fraction of valid samples (tokens for reject_agg=token, sequences otherwise) rejected by divergence."""
    omega_ess: torch.Tensor
    """Normalised ESS (Σ ω)² / (n Σ ω²) of the applied weights ω (0 if every ω is 0; 1 if n = 0)."""
    omega_mean: torch.Tensor
    """Mean of the applied ω over valid samples."""
    ess_verl: torch.Tensor
    """verl's ESS: per token, weights clamped to [1/C, C] (verl_is_stats); beside ais/ess_frac (R), which differs."""
    is_mean: torch.Tensor
    """verl's IS weight mean (token-weighted, w before truncation)."""
    is_std: torch.Tensor
    """verl's IS weight std (token-weighted, of w clamped to [1/C, C])."""
    is_min: torch.Tensor
    """Smallest w over valid samples."""
    is_max: torch.Tensor
    """Largest w over valid samples."""
    reject_fracs: dict[str, torch.Tensor] = field(default_factory=dict)
    """Each rejection rule's rejected fraction (its own samples: tokens or sequences), by verl's option name."""

    def metrics(self) -> dict[str, float]:
        """Scalar metrics under DESIGN.md §8 names (one device sync)."""
        tensors = [getattr(self, f).double() for f in _METRIC_NAMES] + [v.double() for v in self.reject_fracs.values()]
        keys = list(_METRIC_NAMES.values()) + [reject_frac_key(k) for k in self.reject_fracs]
        return dict(zip(keys, torch.stack(tensors).tolist(), strict=True))


# ----------------------------------------------------------------------------------------------------------- main

def correct(log_w: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: CorrectionConfig,
            prev_lam: torch.Tensor | float | None = None, *,
            token_log_w: torch.Tensor | None = None) -> CorrectionOutput:
    """Compute ω and the AIS diagnostics for one batch.

    log_w:    cfg.correction_level = sequence: [B] (or [B, L] per-token, summed over counted tokens);
              token or geometric: [B, L] per-token log π_old − log μ. Any value (NaN, ±inf) where not counted.
              A NaN at a counted position propagates (a loud upstream bug, never hidden).
    adv:      [B] advantages Â.
    mask:     [B, L] bool, completion tokens that count. Sequence level: L_i = mask[i].sum(), and a sequence
              with no counted token is not a sample.
    prev_lam: the previous step's `lam` for the EMA (cfg.ais_ema > 0); None on the first step.
    token_log_w: [B, L] per-token log-weights for divergence rejection (cfg.reject_stat); defaults to log_w when
              that is [B, L].
    """
    valid_tok = mask.bool()  # [B, L]
    lengths = valid_tok.sum(-1)  # [B]
    if adv.shape != lengths.shape:
        raise ValueError(f"adv must have shape [B] = {tuple(lengths.shape)}, got {tuple(adv.shape)}.")
    level = cfg.correction_level
    per_token_in = log_w.shape == valid_tok.shape
    if token_log_w is None and per_token_in:
        token_log_w = log_w
    if level != "sequence" and not per_token_in:
        raise ValueError(f"correction_level={level!r} needs per-token log_w of shape [B, L] = "
                         f"{tuple(valid_tok.shape)}, got {tuple(log_w.shape)}; pass per-sequence log-weights with "
                         "correction_level='sequence'.")
    if level == "sequence" and not (per_token_in or log_w.shape == lengths.shape):
        raise ValueError(f"correction_level='sequence' needs log_w of shape [B] = {tuple(lengths.shape)} (or [B, L]),"
                         f" got {tuple(log_w.shape)}; pass per-token log-weights with correction_level='token'.")
    dtype = torch.promote_types(log_w.dtype, torch.float32)
    if level == "token":
        valid = valid_tok  # [B, L]
        per_len = torch.ones_like(lengths)[:, None]  # [B, 1]
        adv_s = adv[:, None].expand_as(valid_tok)  # [B, L]
        raw = log_w
    else:
        valid = lengths > 0  # [B]
        adv_s = adv  # [B]
        raw = torch.where(valid_tok, log_w, 0).sum(-1) if per_token_in else log_w  # [B] sum of token ℓ
        if level == "geometric":  # verl's seq_mean: ℓ̄_i = mean_t ℓ_it, already per token
            raw = raw / lengths.clamp(min=1)
            per_len = torch.ones_like(lengths)
        else:
            per_len = lengths.clamp(min=1)  # [B]

    lw = safe_log_weights(raw.detach().to(dtype), valid, cfg.log_w_clamp)  # [B] or [B, L]
    adv_s = torch.where(valid, adv_s.detach().to(dtype), 0)
    w = lw.exp()
    w_trunc = truncate(w, cfg)
    per_token_lw = lw / per_len  # ℓ̂ / len

    r = ess_fraction(w_trunc, valid)
    d = divergence(per_token_lw, valid)
    s = severity(d, cfg.ais_tau)
    v = variance_amplification(w_trunc, adv_s, valid)
    g = damping(v)
    lam_batch = COMBINERS[cfg.ais_combiner](s, r, g)
    lam = ema(lam_batch, prev_lam, cfg.ais_ema)

    omega = torch.where(valid, CORRECTIONS[cfg.correction](w, lam, cfg), 1)  # [B] or [B, L]
    omega_valid = valid
    drop = cfg.rejected == "drop"
    if cfg.normalize_weights and drop:  # verl: the weights' mean over every valid sample, before rejection
        omega = normalize_all_valid(omega, omega_valid)
    reject_frac = lw.new_zeros(())
    reject_fracs: dict[str, torch.Tensor] = {}
    rules = () if cfg.bypass else cfg.rejection_rules()  # bypass: the rules act on π_θ / μ inside the loss
    if rules:
        if token_log_w is None:
            raise ValueError("divergence rejection (reject_stat) needs per-token log-weights: pass token_log_w [B, L] "
                             "or log_w [B, L], or set reject_stat='none' (--reject none).")
        keep, reject_fracs = chain_keep(token_log_w.detach().to(dtype), valid_tok, rules, cfg.log_w_clamp)
        reject_frac = masked_mean((~keep).to(dtype), valid_tok if keep.dim() == 2 else lengths > 0)
        reject_fracs = {k: f.to(dtype) for k, f in reject_fracs.items()}
        if keep.dim() == 2 and omega.dim() == 1:  # token rejection under a per-sequence weight: ω becomes [B, L]
            omega, omega_valid = omega[:, None].expand_as(keep), valid_tok
        elif keep.dim() == 1 and omega.dim() == 2:
            keep = keep[:, None]
        omega = torch.where(keep, omega, 0)
    if cfg.normalize_weights and not drop:
        omega = normalize_mean_one(omega, omega_valid)
    omega = torch.where(omega_valid, omega, 1)
    lo, hi = mode_bounds(cfg)
    counts = torch.ones_like(valid_tok) if level == "token" else lengths  # tokens each sample stands for
    verl_stats = verl_is_stats(w, valid, counts, cfg)

    return CorrectionOutput(
        omega=omega, lam=lam, lam_batch=lam_batch, ess_frac=r, divergence=d, severity=s, var_amp=v, damping=g,
        trunc_frac=masked_mean((w > cap(cfg)).to(dtype), valid),
        log_w_mean=masked_mean(lw, valid),
        log_w_min=_masked_extreme(lw, valid, largest=False),
        log_w_max=_masked_extreme(lw, valid, largest=True),
        mismatch_kl=masked_mean(-per_token_lw, valid),
        mismatch_k3=masked_mean(k3(lw) / per_len, valid),  # w − 1 − ℓ̂ without cancellation
        frac_above=masked_mean((w > hi).to(dtype), valid),
        frac_below=masked_mean((w < lo).to(dtype), valid),
        reject_frac=reject_frac,
        omega_ess=ess_fraction(omega, omega_valid),
        omega_mean=masked_mean(omega, omega_valid),
        **{k: t.to(dtype) for k, t in verl_stats.items()},
        reject_fracs=reject_fracs,
    )
