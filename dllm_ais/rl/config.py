"""Frozen configs for the RL core: the GRPO loss (`GRPOConfig`) and the mismatch correction (`CorrectionConfig`).

Names follow TRL's `GRPOConfig` where TRL has the knob (num_generations, epsilon, epsilon_high, beta, loss_type,
importance_sampling_level, scale_rewards, max_completion_length, num_iterations). The correction knobs are this
project's (DESIGN.md §4, docs/ais.md). Every field has a docstring; `__post_init__` says what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

LOSS_TYPES = ("grpo", "dr_grpo", "bnpo", "dapo", "tbpo", "cispo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_sum")
SCALE_REWARDS = ("group", "batch", "none")
CORRECTIONS = ("none", "is", "tis", "mis", "band", "ais")
CORRECTION_LEVELS = ("sequence", "token", "geometric")
AIS_COMBINERS = ("product", "severity")
AIS_TARGETS = ("is", "tis", "mis", "band")
"""The full-IS end AIS mixes towards: ω = (1 − λ) + λ ω_target."""
TRL_ALIASES = {
    "token_truncate": ("tis", "token"),
    "token_mask": ("mis", "token"),
    "sequence_truncate": ("tis", "sequence"),
    "sequence_mask": ("mis", "sequence"),
}
"""TRL's `vllm_importance_sampling_mode` names -> (correction, correction_level)."""
REJECT_STATS = ("none", "k1", "k2", "k3")
REJECT_AGGS = ("token", "seq_sum", "seq_mean", "seq_max")
REJECTED = ("zero", "drop")
"""What a rejected sample (ω = 0) does to the loss: `zero` keeps it in the normaliser (TRL's *_mask), `drop` removes it
from the loss mask (verl's rollout_rs)."""
TRAIN_FORWARDS = ("bf16", "aligned")


class RejectRule(NamedTuple):
    """One divergence-rejection criterion (verl's rollout_rs option): a sample is kept when its aggregated statistic
    is <= upper, or, two-sided (k1 only, verl's `lower_upper` ratio bounds), when log(lower) <= stat <= log(upper)."""

    stat: str
    """k1, k2 or k3."""
    agg: str
    """token, seq_sum, seq_mean or seq_max."""
    upper: float
    """Upper bound on the statistic (nats) — or, when `lower` is set, the upper *ratio* bound (stat <= log upper)."""
    lower: float | None = None
    """Two-sided k1 only: the lower ratio bound (stat >= log lower); None = one-sided."""

    @property
    def name(self) -> str:
        """verl's option name, e.g. `seq_mean_k3`."""
        return f"{self.agg}_{self.stat}"


def parse_reject_rule(spec: str) -> RejectRule:
    """`STAT:AGG:THRESHOLD` -> RejectRule. THRESHOLD is one number (reject when the statistic exceeds it) or, for k1,
    verl's two-sided `LOWER_UPPER` ratio bounds (keep when log LOWER <= statistic <= log UPPER; Geo-RS is
    `k1:seq_mean:0.999_1.001`). LOWER <= 1 <= UPPER so that an on-policy sample (ℓ = 0) is never rejected."""
    example = (f"write STAT:AGG:THRESHOLD, e.g. k3:seq_mean:0.01 or k1:seq_mean:0.999_1.001 (STAT in "
               f"{', '.join(REJECT_STATS[1:])}; AGG in {', '.join(REJECT_AGGS)}), several joined by commas, or none")
    parts = spec.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"--reject {spec!r}: {example}.")
    stat, agg, threshold = (p.strip() for p in parts)
    if stat not in REJECT_STATS[1:]:
        raise ValueError(f"--reject {spec!r}: STAT (reject_stat) {stat!r} is not one of "
                         f"{', '.join(REJECT_STATS[1:])}; {example}.")
    if agg not in REJECT_AGGS:
        raise ValueError(f"--reject {spec!r}: AGG (reject_agg) {agg!r} is not one of {', '.join(REJECT_AGGS)}.")
    try:
        bounds = [float(v) for v in threshold.split("_")]
    except ValueError:
        raise ValueError(f"--reject {spec!r}: the threshold {threshold!r} is not a number (or LOWER_UPPER).") from None
    if len(bounds) == 1:
        if not (bounds[0] >= 0.0 and math.isfinite(bounds[0])):
            raise ValueError(f"--reject {spec!r}: the threshold (reject_threshold) must be finite and >= 0.")
        return RejectRule(stat, agg, bounds[0])
    if stat != "k1" or len(bounds) != 2:
        raise ValueError(f"--reject {spec!r}: only k1 takes two-sided LOWER_UPPER ratio bounds (verl's convention); "
                         f"give {stat} one upper threshold.")
    lower, upper = bounds
    if not (0.0 < lower <= 1.0 <= upper and math.isfinite(upper)):
        raise ValueError(f"--reject {spec!r}: the ratio bounds need 0 < LOWER <= 1 <= UPPER < inf, so that an "
                         "on-policy sample is kept (e.g. 0.999_1.001).")
    return RejectRule(stat, agg, upper, lower)


def parse_reject(spec: str) -> dict[str, object]:
    """`--reject` -> CorrectionConfig fields. `none`; one `STAT:AGG:THRESHOLD` (e.g. `k3:seq_mean:0.01`) fills
    reject_stat / reject_agg / reject_threshold; two-sided k1 bounds or several comma-separated rules (all must pass,
    verl's chained rollout_rs) go to reject_rules."""
    if spec.strip().lower() == "none":
        return {"reject_stat": "none", "reject_rules": ()}
    specs = tuple(part.strip() for part in spec.split(",") if part.strip())
    rules = [parse_reject_rule(part) for part in specs]
    if len(rules) == 1 and rules[0].lower is None:
        rule = rules[0]
        return {"reject_stat": rule.stat, "reject_agg": rule.agg, "reject_threshold": rule.upper, "reject_rules": ()}
    return {"reject_stat": "none", "reject_rules": specs}


def _default(cls, name: str):
    """A dataclass field's default, so that messages quote the current one."""
    return cls.__dataclass_fields__[name].default


def _one_of(owner: str, name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{name}={value!r}: use one of {', '.join(allowed)}.")


@dataclass(frozen=True)
class GRPOConfig:
    """Group-relative advantages and the clipped GRPO surrogate (dllm_ais/rl/advantages.py, dllm_ais/rl/grpo.py)."""

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
    max_completion_length)), `bnpo` and `dapo` (sum / number of counted tokens in the batch); `tbpo` (QaRL, our
    reading); `cispo` (TRL / MiniMax-M1: −min(r, ε_high)·Â·log π_θ with the clipped ratio detached, token mean;
    needs epsilon_high, the absolute cap ε_max, e.g. 5)."""
    importance_sampling_level: str = "token"
    """Ratio π_θ/π_old per `token` (GRPO), per `sequence` (GSPO: geometric mean of the token ratios) or
    `sequence_sum` (EBPO: exp(Σ_t (logp_train − logp_old)), the ratio of the sequence likelihoods, not normalised by
    length; set by --policy-logprob ebpo)."""
    max_completion_length: int = 256
    """Maximum completion length L; the constant normaliser of loss_type=dr_grpo."""
    num_iterations: int = 1
    """μ: optimisation passes over each generated batch (π_old is the policy at rollout time)."""
    dual_clip: float = 3.0
    """c of loss_type=tbpo's dual clip (dual-clip PPO): for Â < 0 the per-sequence loss is at most c·|Â|; c > 1."""
    clip_ratio_c: float | None = None
    """verl's dual clip (`clip_ratio_c`, dual-clip PPO) in the standard per-token loss: for Â < 0 the clipped
    surrogate's loss is at most c·|Â| per token (c > 1; verl's default 3). None = off (TRL's loss). Not with tbpo,
    whose sequence-level bound is `dual_clip`."""
    off_policy_mask_threshold: float | None = None
    """δ of TRL's off-policy sequence mask (DeepSeek-V3.2 eq. 9): a sequence with Â < 0 whose mean per-token
    log μ − log π_θ exceeds δ is removed from the surrogate. None = off; δ >= 0 (e.g. 0.5)."""
    error_ngram: int = 4
    """n of the error-token detector: the fraction of a completion's n-grams that repeat an earlier one."""
    error_mask_threshold: float | None = None
    """Drop completions whose repeated-n-gram fraction exceeds this from the loss (QaRL's error tokens);
    None = detect and log only."""

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
        if not (self.dual_clip > 1.0 and math.isfinite(self.dual_clip)):
            raise ValueError(f"GRPOConfig.dual_clip={self.dual_clip}: the dual-clip bound c must be finite and > 1 "
                             "(--dual-clip; 3 is dual-clip PPO's value).")
        if self.clip_ratio_c is not None:
            if not (self.clip_ratio_c > 1.0 and math.isfinite(self.clip_ratio_c)):
                raise ValueError(f"GRPOConfig.clip_ratio_c={self.clip_ratio_c}: the dual-clip bound must be finite "
                                 "and > 1 (3 is verl's value), or None for no dual clip.")
            if self.loss_type in ("tbpo", "cispo"):
                raise ValueError(f"GRPOConfig.clip_ratio_c with GRPOConfig.loss_type={self.loss_type!r}: the per-token "
                                 "dual clip belongs to the clipped PPO surrogate (grpo, dr_grpo, bnpo, dapo); tbpo "
                                 "has its own sequence-level bound (GRPOConfig.dual_clip), cispo has no PPO clip.")
        if self.off_policy_mask_threshold is not None and not (
                self.off_policy_mask_threshold >= 0.0 and math.isfinite(self.off_policy_mask_threshold)):
            raise ValueError(f"GRPOConfig.off_policy_mask_threshold={self.off_policy_mask_threshold}: δ must be finite "
                             "and >= 0 (TRL suggests 0.5), or None for no off-policy mask.")
        if self.loss_type == "cispo":
            if self.epsilon_high is None:
                raise ValueError("GRPOConfig.loss_type='cispo' clips the ratio at GRPOConfig.epsilon_high itself (the "
                                 "absolute cap ε_max, e.g. 5), not at 1 + ε: set it (TRL would fall back to epsilon, "
                                 "0.2, and cap every ratio at 0.2).")
            if self.importance_sampling_level != "token":
                raise ValueError("GRPOConfig.loss_type='cispo' needs GRPOConfig.importance_sampling_level='token' "
                                 "(TRL refuses sequence-level ratios with cispo).")
        if self.error_ngram < 1:
            raise ValueError(f"GRPOConfig.error_ngram={self.error_ngram}: the n-gram size must be >= 1.")
        if self.error_mask_threshold is not None and not 0.0 <= self.error_mask_threshold < 1.0:
            raise ValueError(f"GRPOConfig.error_mask_threshold={self.error_mask_threshold}: a repeated-n-gram "
                             "fraction in [0, 1) (--mask-error-completions), or None to only log it.")


@dataclass(frozen=True)
class CorrectionConfig:
    """FP8-rollout mismatch correction (dllm_ais/rl/correction.py; formulas in docs/ais.md)."""

    correction: str = "ais"
    """`none` (ω ≡ 1), `is` (ω = w), `tis` (ω = min(w, C)), `mis` (ω = w, or 0 where w > C or w < C_min), `band`
    (IcePop: ω = w inside [band_low, band_high], 0 outside), `ais` (ω = (1 - λ) + λ ω_target). TRL's names
    `token_truncate`, `token_mask`, `sequence_truncate`, `sequence_mask` are accepted and set correction and
    correction_level. With BF16 rollouts every choice gives ω ≡ 1."""
    correction_level: str = "sequence"
    """`sequence`: one log-weight per completion ([B]; LLaDA's coupled ELBO difference or the AR sum).
    `token`: per-token log-weights ([B, L]; AR, or LLaDA's one-step estimator).
    `geometric`: one weight per completion, exp of the mean per-token log-weight (verl's seq_mean; [B, L] input)."""
    is_cap: float | None = 2.0
    """C: truncation cap of tis / ais and upper drop threshold of mis (TIS default 2; TRL's clip max). Must be >= 1
    so that w = 1 is never changed. None = no upper bound (TRL's `vllm_importance_sampling_clip_max=None`)."""
    is_cap_min: float = 0.0
    """C_min: TRL's clip min. tis clamps from below at it (ω = clamp(w, C_min, C), TRL's *_truncate), mis drops
    samples below it (TRL's *_mask). 0 = none. Must be in [0, 1]."""
    band_low: float = 0.5
    """Lower edge of correction `band` (IcePop): weights below it are zeroed. In (0, 1]."""
    band_high: float = 5.0
    """Upper edge of correction `band` (IcePop): weights above it are zeroed. >= 1."""
    ais_target: str = "tis"
    """The full-IS end AIS mixes towards: `is`, `tis`, `mis` or `band` (ω = (1 - λ) + λ ω_target)."""
    reject_stat: str = "none"
    """Rejection by divergence: `k1` = -log r, `k2` = ½(log r)², `k3` = r - 1 - log r per token, or `none`."""
    reject_agg: str = "seq_mean"
    """How the per-token statistic is aggregated: `token` (reject tokens), `seq_sum`, `seq_mean`, `seq_max` (reject
    whole sequences)."""
    reject_threshold: float = 0.01
    """Samples whose aggregated statistic exceeds this are rejected (ω = 0)."""
    reject_rules: tuple[str, ...] = ()
    """Further rejection rules `STAT:AGG:THRESHOLD` (verl's chained rollout_rs: a sample must pass every rule, and
    the reject_stat rule above if set). THRESHOLD may be k1's two-sided `LOWER_UPPER` ratio bounds (Geo-RS:
    `k1:seq_mean:0.999_1.001`). In bypass mode the rules act on π_θ / μ inside the loss (verl's bypass)."""
    rejected: str = "zero"
    """What a sample with ω = 0 (rejected by reject_stat / reject_rules, or masked by mis / band) does to the loss:
    `zero` (default; TRL's *_mask) keeps it in the loss normaliser with weight 0; `drop` (verl's rollout_rs) removes it
    from the loss mask, so token means divide by the kept tokens only, and normalize_weights averages the weights
    over all valid samples before rejection (verl)."""
    normalize_weights: bool = False
    """Divide ω by its mean over the batch's kept samples (batch normalisation to mean 1, as verl's option)."""
    bypass: bool = False
    """Skip the BF16 old-policy pass: π_old := μ (the rollout policy's own per-token log-probs), ℓ ≡ 0. Cheaper;
    for comparison (PPO's clip then also absorbs the precision mismatch)."""
    train_forward: str = "bf16"
    """`bf16`: π_θ is the BF16 master. `aligned` (QaRL): π_θ's (and π_old's) forward fake-quantises weights and
    activations with the rollout copy's blockwise FP8 recipe, straight-through gradients to the BF16 master."""
    log_w_clamp: float = 20.0
    """Log-weights are clamped to [-log_w_clamp, log_w_clamp] before exponentiation (w <= e^20 stays finite)."""
    ais_tau: float = 0.1
    """τ of the divergence severity s = 1 − exp(−D / τ), D = mean per-token |log w| (sequence level). 0.1 is set by
    the exact-gradient analysis (issue 27, benchmarks/exact_gradients/): over its 39 enumerated regimes AIS's
    MSE against the exact target, relative to the best fixed λ, is lowest at τ = 0.1 for N = 8, 64 and 512 (geometric
    means 1.019 / 1.044 / 1.093 vs 1.031 / 1.063 / 1.122 at 0.02). That comes from the synthetic, fast-sampler and
    Qwen regimes: over the 16 real-format ones alone (N = 64) it is 1.068 / 1.034 / 1.028 / 1.028 at τ = 0.02 / 0.1 /
    0.2 / 0.5 and 1.032 with no correction. Before: 0.02 from a flat outcome scan
    (docs/ais.md §5a), 0.05 read off the testbed's D. Token-level D is larger (no cancellation over tokens): the
    token-level presets keep 0.05 until a token-level scan is run."""
    ais_ema: float = 0.0
    """β of the EMA of λ across steps: λ_t = β λ_{t-1} + (1 - β) λ_batch. 0 = no smoothing (per-batch λ)."""
    ais_combiner: str = "product"
    """How s, R, g become λ: `product` = clip(s · R · g, 0, 1) (DESIGN.md §4); `severity` = clip(s · g, 0, 1), which
    does not shrink λ when the weights' ESS R falls (under `product` λ ≤ R)."""

    def __post_init__(self):
        if self.correction in TRL_ALIASES:  # normalise TRL's spelling once (frozen: set through object.__setattr__)
            correction, level = TRL_ALIASES[self.correction]
            object.__setattr__(self, "correction", correction)
            object.__setattr__(self, "correction_level", level)
        _one_of("CorrectionConfig", "correction", self.correction, CORRECTIONS + tuple(TRL_ALIASES))
        _one_of("CorrectionConfig", "correction_level", self.correction_level, CORRECTION_LEVELS)
        _one_of("CorrectionConfig", "ais_combiner", self.ais_combiner, AIS_COMBINERS)
        _one_of("CorrectionConfig", "ais_target", self.ais_target, AIS_TARGETS)
        _one_of("CorrectionConfig", "reject_stat", self.reject_stat, REJECT_STATS)
        _one_of("CorrectionConfig", "reject_agg", self.reject_agg, REJECT_AGGS)
        _one_of("CorrectionConfig", "train_forward", self.train_forward, TRAIN_FORWARDS)
        _one_of("CorrectionConfig", "rejected", self.rejected, REJECTED)
        object.__setattr__(self, "reject_rules", tuple(self.reject_rules))  # config.json gives a list
        for spec in self.reject_rules:
            parse_reject_rule(spec)
        if not 0.0 <= self.is_cap_min <= 1.0:
            raise ValueError(f"CorrectionConfig.is_cap_min={self.is_cap_min}: the lower drop threshold must be in "
                             "[0, 1] (--is-cap-min; 0 = none), so that w = 1 is never dropped.")
        if not (0.0 < self.band_low <= 1.0 <= self.band_high and math.isfinite(self.band_high)):
            raise ValueError(f"CorrectionConfig.band=[{self.band_low}, {self.band_high}]: need 0 < low <= 1 <= high "
                             "< inf so that w = 1 is kept (--band LOW HIGH, e.g. --band 0.5 5).")
        if not (self.reject_threshold >= 0.0 and math.isfinite(self.reject_threshold)):
            raise ValueError(f"CorrectionConfig.reject_threshold={self.reject_threshold}: must be finite and >= 0 "
                             "(--reject STAT:AGG:THRESHOLD, e.g. k3:seq_mean:0.01).")
        if self.bypass and self.train_forward == "aligned":
            raise ValueError("CorrectionConfig: bypass (π_old := μ) and train_forward='aligned' (π_old from the "
                             "aligned forward) contradict each other; drop --bypass or --train-forward aligned.")
        if self.is_cap is not None and not (self.is_cap >= 1.0 and math.isfinite(self.is_cap)):
            raise ValueError(f"CorrectionConfig.is_cap={self.is_cap}: the cap C must be finite and >= 1 (a cap below "
                             "1 would shrink on-policy weights w = 1); 2.0 is the TIS default, None = no upper bound.")
        if not (self.log_w_clamp > 0.0 and math.isfinite(self.log_w_clamp)):
            raise ValueError(f"CorrectionConfig.log_w_clamp={self.log_w_clamp}: must be finite and > 0 (default 20, "
                             "so exp stays finite in float32).")
        if not (self.ais_tau > 0.0 and math.isfinite(self.ais_tau)):
            raise ValueError(f"CorrectionConfig.ais_tau={self.ais_tau}: the severity scale τ must be finite and > 0 "
                             f"(default {_default(CorrectionConfig, 'ais_tau')}).")
        if not 0.0 <= self.ais_ema < 1.0:
            raise ValueError(f"CorrectionConfig.ais_ema={self.ais_ema}: the EMA factor must be in [0, 1); 0 disables "
                             "smoothing, values near 1 make λ react slowly.")

    def rejection_rules(self) -> tuple[RejectRule, ...]:
        """Every divergence-rejection rule: reject_stat / reject_agg / reject_threshold (if reject_stat is set), then
        reject_rules. Empty = no rejection."""
        first = () if self.reject_stat == "none" else (
            RejectRule(self.reject_stat, self.reject_agg, self.reject_threshold),)
        return first + tuple(parse_reject_rule(spec) for spec in self.reject_rules)
