"""Frozen configs for the RL core: the GRPO loss (`GRPOConfig`) and the mismatch correction (`CorrectionConfig`).

Names follow TRL's `GRPOConfig` where TRL has the knob (num_generations, epsilon, epsilon_high, beta, loss_type,
importance_sampling_level, scale_rewards, max_completion_length, num_iterations). The correction knobs are this
project's (DESIGN.md §4, docs/ais.md). Every field has a docstring; `__post_init__` says what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOSS_TYPES = ("grpo", "dr_grpo", "bnpo", "dapo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
SCALE_REWARDS = ("group", "batch", "none")
CORRECTIONS = ("none", "is", "tis", "mis", "ais")
CORRECTION_LEVELS = ("sequence", "token")
AIS_COMBINERS = ("product",)


def _one_of(owner: str, name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{name}={value!r}: use one of {', '.join(allowed)}.")


@dataclass(frozen=True)
class GRPOConfig:
    """Group-relative advantages and the clipped GRPO surrogate (dllm_ais/advantages.py, dllm_ais/grpo.py)."""

    num_generations: int = 8
    """G: completions sampled per prompt. Rewards are laid out [num_prompts * G], each prompt's G contiguous."""
    scale_rewards: str = "group"
    """Advantage scaling: `group` (z-score with the group's std, GRPO), `batch` (divide by the batch std),
    `none` (mean-only, as d1 / Dr.GRPO)."""
    epsilon: float = 0.2
    """Lower clip: the ratio is clipped below at 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip: the ratio is clipped above at 1 + epsilon_high. None = epsilon (symmetric); DAPO uses 0.28."""
    beta: float = 0.0
    """Coefficient of the k3 KL penalty to the reference policy (logp_ref). 0 = no reference model needed."""
    loss_type: str = "dapo"
    """Aggregation of per-token losses: `grpo` (per-sequence mean, then batch mean), `dr_grpo` (sum / (B *
    max_completion_length)), `bnpo` and `dapo` (sum / number of counted tokens in the batch)."""
    importance_sampling_level: str = "token"
    """Ratio π_θ/π_old per `token` (GRPO) or per `sequence` (GSPO: geometric mean of the token ratios)."""
    max_completion_length: int = 256
    """Maximum completion length L; the constant normaliser of loss_type=dr_grpo."""
    num_iterations: int = 1
    """μ: optimisation passes over each generated batch (π_old is the policy at rollout time)."""

    def __post_init__(self):
        if self.num_generations < 2:
            raise ValueError(f"GRPOConfig.num_generations={self.num_generations}: group-relative advantages need "
                             "at least 2 generations per prompt; set num_generations >= 2.")
        _one_of("GRPOConfig", "scale_rewards", self.scale_rewards, SCALE_REWARDS)
        _one_of("GRPOConfig", "loss_type", self.loss_type, LOSS_TYPES)
        _one_of("GRPOConfig", "importance_sampling_level", self.importance_sampling_level,
                IMPORTANCE_SAMPLING_LEVELS)
        if not 0.0 < self.epsilon < 1.0:
            raise ValueError(f"GRPOConfig.epsilon={self.epsilon}: the ratio is clipped to [1 - epsilon, ...]; "
                             "choose 0 < epsilon < 1 (0.2 is the usual value).")
        if self.epsilon_high is not None and not self.epsilon_high > 0.0:
            raise ValueError(f"GRPOConfig.epsilon_high={self.epsilon_high}: must be > 0, or None to reuse epsilon.")
        if not (self.beta >= 0.0 and math.isfinite(self.beta)):
            raise ValueError(f"GRPOConfig.beta={self.beta}: the KL coefficient must be finite and >= 0 (0 disables "
                             "the KL term).")
        if self.max_completion_length < 1:
            raise ValueError(f"GRPOConfig.max_completion_length={self.max_completion_length}: must be >= 1.")
        if self.num_iterations < 1:
            raise ValueError(f"GRPOConfig.num_iterations={self.num_iterations}: must be >= 1.")


@dataclass(frozen=True)
class CorrectionConfig:
    """FP8-rollout mismatch correction (dllm_ais/correction.py; formulas in docs/ais.md)."""

    correction: str = "ais"
    """`none` (ω ≡ 1), `is` (ω = w), `tis` (ω = min(w, C)), `mis` (ω = w, or 0 where w > C), `ais` (ω = (1 - λ)
    + λ min(w, C)). With BF16 rollouts every choice gives ω ≡ 1."""
    correction_level: str = "sequence"
    """`sequence`: one log-weight per completion ([B]; LLaDA's coupled ELBO difference or the AR sum).
    `token`: per-token log-weights ([B, L]; AR, or LLaDA's one-step estimator)."""
    is_cap: float = 2.0
    """C: truncation cap of tis / ais and drop threshold of mis (TIS default 2). Must be >= 1 so that w = 1 is
    never changed."""
    log_w_clamp: float = 20.0
    """Log-weights are clamped to [-log_w_clamp, log_w_clamp] before exponentiation (w <= e^20 stays finite)."""
    ais_tau: float = 0.05
    """τ of the divergence severity s = 1 − exp(−D / τ), D = mean per-token |log w| (sequence level). Calibrated on
    the tiny testbed (docs/ais.md §5): e4m3 rollouts give D ≈ 0.01 early in RL (s ≈ 0.18) rising to ≈ 0.05 as the
    policy concentrates, FP4 rollouts D ≈ 0.05 (s ≈ 0.63). Token-level D is larger: choose τ per level."""
    ais_ema: float = 0.0
    """β of the EMA of λ across steps: λ_t = β λ_{t-1} + (1 - β) λ_batch. 0 = no smoothing (per-batch λ)."""
    ais_combiner: str = "product"
    """How s, R, g become λ: `product` = clip(s · R · g, 0, 1) (DESIGN.md §4)."""

    def __post_init__(self):
        _one_of("CorrectionConfig", "correction", self.correction, CORRECTIONS)
        _one_of("CorrectionConfig", "correction_level", self.correction_level, CORRECTION_LEVELS)
        _one_of("CorrectionConfig", "ais_combiner", self.ais_combiner, AIS_COMBINERS)
        if not (self.is_cap >= 1.0 and math.isfinite(self.is_cap)):
            raise ValueError(f"CorrectionConfig.is_cap={self.is_cap}: the cap C must be finite and >= 1 (a cap below "
                             "1 would shrink on-policy weights w = 1); 2.0 is the TIS default.")
        if not (self.log_w_clamp > 0.0 and math.isfinite(self.log_w_clamp)):
            raise ValueError(f"CorrectionConfig.log_w_clamp={self.log_w_clamp}: must be finite and > 0 (default 20, "
                             "so exp stays finite in float32).")
        if not (self.ais_tau > 0.0 and math.isfinite(self.ais_tau)):
            raise ValueError(f"CorrectionConfig.ais_tau={self.ais_tau}: the severity scale τ must be finite and > 0.")
        if not 0.0 <= self.ais_ema < 1.0:
            raise ValueError(f"CorrectionConfig.ais_ema={self.ais_ema}: the EMA factor must be in [0, 1); 0 disables "
                             "smoothing, values near 1 make λ react slowly.")
