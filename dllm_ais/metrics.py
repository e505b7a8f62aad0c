"""Metric names (DESIGN.md §8) in one place, and the per-step writer: metrics.jsonl, mirrored to --report-to
trackers."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from dllm_ais.atomic import atomic_write_text

# Logged every training step (the trainer checks that each is present).
STEP = "step"
REWARD_MEAN = "reward/mean"
ADV_ZERO_STD = "adv/zero_std_frac"
AIS_LAMBDA = "ais/lambda"
AIS_ESS = "ais/ess_frac"
AIS_DIVERGENCE = "ais/divergence"
AIS_VAR_AMP = "ais/var_amp"
AIS_TRUNC = "ais/trunc_frac"
MISMATCH_KL = "mismatch/kl"
MISMATCH_K3 = "mismatch/k3"
LOSS_POLICY = "loss/policy"
LOSS_CLIP = "loss/clip_frac"
LOSS_CLIP_LOW = "loss/clip_frac_low"
LOSS_CLIP_HIGH = "loss/clip_frac_high"
LOSS_KL = "loss/kl"
AIS_LOG_W_MIN = "ais/log_w_min"
AIS_LOG_W_MAX = "ais/log_w_max"
ROLLOUT_TOKENS_PER_S = "rollout/tokens_per_s"
ROLLOUT_STEPS = "rollout/steps"
ROLLOUT_GEN_LEN = "rollout/gen_len"
ROLLOUT_NFE = "rollout/nfe"
"""Model forward calls of the step's rollout (Rollout.nfe; = rollout/steps without a KV cache or threshold)."""
ROLLOUT_TOKENS_PER_STEP = "rollout/tokens_per_step"
"""Mean tokens a diffusion rollout committed per denoising step (over (sequence, step) pairs that committed some):
1 for one token per step; threshold decoding raises it (dllm_ais/rl/rollout_stats.py)."""
ROLLOUT_TOKENS_PER_STEP_MAX = "rollout/tokens_per_step_max"
"""Most tokens one sequence committed at one step (capped by --max-commit-per-step)."""
ROLLOUT_GROUP_DISTINCT = "rollout/group_distinct"
"""Mean number of distinct completions (counted tokens) per prompt group of G: confidence decoding makes them alike."""
ROLLOUT_COMMIT_CONFIDENCE = "rollout/commit_confidence"
"""Mean confidence (full-softmax probability) the counted tokens were committed with (low-confidence remasking)."""
SKIPPED_STEPS = "train/skipped_steps"
# rollout-correction diagnostics (verl's set under our names; dllm_ais/rl/mismatch_stats.py, docs/corrections.md)
MISMATCH_PPL_TRAIN = "mismatch/ppl_train"
MISMATCH_PPL_ROLLOUT = "mismatch/ppl_rollout"
MISMATCH_LOG_PPL_DIFF = "mismatch/log_ppl_diff"
MISMATCH_CHI2_TOKEN = "mismatch/chi2_token"
MISMATCH_CHI2_SEQ = "mismatch/chi2_seq"
MISMATCH_KL_TOKEN = "mismatch/kl_token"
MISMATCH_K3_TOKEN = "mismatch/k3_token"
MISMATCH_KL_TOKEN_BF16 = "mismatch/kl_token_bf16"
"""train_forward=aligned only: mismatch/kl_token of the plain BF16 forward on the same rollouts (what alignment
removed is kl_token_bf16 − kl_token)."""
MISMATCH_KL_BF16 = "mismatch/kl_bf16"
"""train_forward=aligned, sequence level: mismatch/kl (mean −ℓ/L) of the plain BF16 forward, same rollouts and masks."""
CORR_FRAC_ABOVE = "corr/frac_above"
CORR_FRAC_BELOW = "corr/frac_below"
CORR_REJECT_FRAC = "corr/reject_frac"
CORR_ESS = "corr/ess_frac"
CORR_OMEGA_MEAN = "corr/omega_mean"
GRAD_SHIFT = "grad/correction_shift"
"""TrainConfig.grad_diagnostics_every: ‖g_ω − g_1‖, how far the correction moves the step's policy gradient
(dllm_ais/train/grad_diagnostics.py)."""
GRAD_NOISE = "grad/noise"
"""One minibatch-noise standard deviation of g_ω, from the gradients of the batch's two halves of prompt groups."""
GRAD_SHIFT_TO_NOISE = "grad/shift_to_noise"
"""grad/correction_shift / grad/noise: ≪ 1 means the correction is lost in the minibatch noise at this batch size."""
CORR_ESS_VERL = "corr/ess_verl"
"""verl's rollout_is_eff_sample_size: 1 / mean((c / mean c)²) over tokens, c = w clamped to [1/C, C]."""
CORR_IS_MEAN = "corr/is_weight_mean"
CORR_IS_STD = "corr/is_weight_std"
CORR_IS_MIN = "corr/is_weight_min"
CORR_IS_MAX = "corr/is_weight_max"
MISMATCH_LOG_PPL_TRAIN = "mismatch/log_ppl_train"
MISMATCH_LOG_PPL_ROLLOUT = "mismatch/log_ppl_rollout"
MISMATCH_LOG_PPL_ABS_DIFF = "mismatch/log_ppl_abs_diff"
MISMATCH_LOG_PPL_DIFF_MAX = "mismatch/log_ppl_diff_max"
MISMATCH_LOG_PPL_DIFF_MIN = "mismatch/log_ppl_diff_min"
MISMATCH_PPL_RATIO = "mismatch/ppl_ratio"


def reject_frac_key(option: str) -> str:
    """Rejected fraction of one rejection rule, by verl's option name: corr/reject_frac/seq_mean_k3."""
    return f"corr/reject_frac/{option}"
ROLLOUT_REPEAT_FRAC = "rollout/repeat_frac"
"""Mean repeated-n-gram fraction of the completions (dllm_ais/rl/error_tokens.py)."""
ROLLOUT_ERROR_MASKED = "rollout/error_masked_frac"
"""Fraction of completions dropped from the loss as error completions (0 unless error_mask_threshold is set)."""
LOSS_DUAL_CLIP = "loss/dual_clip_frac"
LOSS_OFF_POLICY_MASKED = "loss/off_policy_masked_frac"
"""GRPOConfig.off_policy_mask_threshold: fraction of sequences TRL's off-policy mask removed from the surrogate."""
ROLLOUT_LOGP_MU = "rollout/logp_mu"
"""Mean over the step's completions of Σ_j log μ(y_j | ·) over counted tokens: log μ(y) of the rollout policy, from
the log-probs the sampler recorded when it records them (autoregressive: exact; diffusion: the commit-time proposal
log-probs), else the one-step d1 estimate (all completion tokens and 15 % of the prompt masked). It rises towards 0
as the policy concentrates. Caveat, measured on study-cpu: the one-step estimate stayed near −14.5 while the policy
concentrated (held-out accuracy at T = 1: 0.15 → 0.98); there it is not a concentration measure."""

DIAGNOSTIC_NAMES = {
    "ppl_train": MISMATCH_PPL_TRAIN, "ppl_rollout": MISMATCH_PPL_ROLLOUT, "log_ppl_diff": MISMATCH_LOG_PPL_DIFF,
    "chi2_token": MISMATCH_CHI2_TOKEN, "chi2_seq": MISMATCH_CHI2_SEQ, "kl_token": MISMATCH_KL_TOKEN,
    "k3_token": MISMATCH_K3_TOKEN, "log_ppl_train": MISMATCH_LOG_PPL_TRAIN, "log_ppl_rollout": MISMATCH_LOG_PPL_ROLLOUT,
    "log_ppl_abs_diff": MISMATCH_LOG_PPL_ABS_DIFF, "log_ppl_diff_max": MISMATCH_LOG_PPL_DIFF_MAX,
    "log_ppl_diff_min": MISMATCH_LOG_PPL_DIFF_MIN, "ppl_ratio": MISMATCH_PPL_RATIO,
}
"""mismatch_stats.rollout_diagnostics keys -> metric names."""
REWARD_ERRORS = "reward/errors"

REQUIRED_STEP_METRICS = (
    STEP, REWARD_MEAN, ADV_ZERO_STD, AIS_LAMBDA, AIS_ESS, AIS_DIVERGENCE, AIS_VAR_AMP, AIS_TRUNC, MISMATCH_KL,
    MISMATCH_K3, LOSS_POLICY, LOSS_CLIP, ROLLOUT_TOKENS_PER_S, ROLLOUT_STEPS, ROLLOUT_GEN_LEN, SKIPPED_STEPS,
    *DIAGNOSTIC_NAMES.values(), CORR_FRAC_ABOVE, CORR_FRAC_BELOW, CORR_REJECT_FRAC, CORR_ESS, CORR_OMEGA_MEAN,
    CORR_ESS_VERL, CORR_IS_MEAN, CORR_IS_STD, CORR_IS_MIN, CORR_IS_MAX, ROLLOUT_REPEAT_FRAC, ROLLOUT_ERROR_MASKED,
)


REDUCTIONS: dict[str, str] = {AIS_LOG_W_MIN: "min", AIS_LOG_W_MAX: "max", CORR_IS_MIN: "min", CORR_IS_MAX: "max",
                               MISMATCH_LOG_PPL_DIFF_MIN: "min", MISMATCH_LOG_PPL_DIFF_MAX: "max",
                               ROLLOUT_TOKENS_PER_STEP_MAX: "max"}
"""How a metric combines over processes when it is not already global: min, max; every other metric is averaged
(`mean`). The AIS diagnostics are computed over the global batch, so they agree on every rank anyway."""


def reduction(key: str) -> str:
    """`min`, `max` or `mean`: how `key` combines over processes."""
    return REDUCTIONS.get(key, "mean")


def reduce_row(row: dict[str, float], reduce: Callable[[list[float], str], list[float]]) -> dict[str, float]:
    """Combine one step's metrics over processes: `reduce(values, kind)` reduces a list of this process's values
    elementwise over processes by `kind` (one collective per kind; called in the same order on every process).
    The step number is kept as is."""
    out: dict[str, float] = {}
    for kind in ("mean", "min", "max"):
        keys = sorted(k for k in row if k != STEP and reduction(k) == kind)
        if keys:
            out.update(zip(keys, reduce([float(row[k]) for k in keys], kind), strict=True))
    out[STEP] = row[STEP]
    return {k: out[k] for k in row}


def reward_key(task: str) -> str:
    """`reward/<task>`."""
    return f"reward/{task}"


def time_key(phase: str) -> str:
    """`time/<phase>` seconds spent in a phase of the step."""
    return f"time/{phase}"


class MetricsWriter:
    """Appends one JSON object per step to `metrics.jsonl` (flushed and fsynced), then hands the row to `mirror` (the
    experiment trackers of --report-to: dllm_ais/train/trackers.py), which only copies it."""

    def __init__(self, run_dir: str | os.PathLike, mirror=None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._mirror = mirror

    def write(self, row: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")  # NaN/Infinity as Python's json writes and reads them
            f.flush()
            os.fsync(f.fileno())
        if self._mirror is not None:
            self._mirror.log({k: v for k, v in row.items() if k != STEP}, step=row[STEP])

    def truncate_after(self, step: int) -> list[int]:
        """Drop rows with step > `step` (rows written after the checkpoint a resumed run starts from); returns the
        dropped rows' steps."""
        rows = read_metrics(self.path.parent)
        atomic_write_text(self.path, "".join(json.dumps(row) + "\n" for row in rows if row[STEP] <= step))
        return [int(row[STEP]) for row in rows if row[STEP] > step]

    def close(self) -> None:
        if self._mirror is not None:
            self._mirror.finish()


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """All rows of `run_dir/metrics.jsonl` (empty list if there is none)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
