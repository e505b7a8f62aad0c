"""The flag behind each config field (errors name the flag the user typed, not the dataclass field) and the flags a
command line typed."""

from __future__ import annotations

import argparse
import re

FIELD_FLAGS = {
    "TrainConfig.task": "--task", "TrainConfig.data_path": "--data", "TrainConfig.reward_fn": "--reward-fn",
    "TrainConfig.reward_weights": "--reward-weights", "TrainConfig.steps": "--steps", "TrainConfig.learning_rate":
    "--lr", "TrainConfig.sft_steps": "--sft-steps", "TrainConfig.rollout_precision": "--rollout-precision",
    "TrainConfig.fp8_backend": "--fp8-backend", "TrainConfig.lora_r": "--lora-r", "TrainConfig.save_every":
    "--save-every", "TrainConfig.seed": "--seed", "ModelConfig.path": "--model", "ModelConfig.device": "--device",
    "ModelConfig.dtype": "--dtype", "SamplerConfig.gen_length": "--gen-length", "SamplerConfig.block_length":
    "--block-length", "SamplerConfig.temperature": "--temperature", "SamplerConfig.remasking": "--remasking",
    "SamplerConfig.cfg_scale": "--cfg-scale", "CorrectionConfig.correction": "--correction",
    "TrainConfig.fp4_format": "--fp4-format", "TrainConfig.report_to": "--report-to",
    "TrainConfig.grad_diagnostics_every": "--grad-diagnostics-every",
    "CorrectionConfig.correction_level": "--correction-level", "CorrectionConfig.is_cap": "--is-cap",
    "CorrectionConfig.is_cap_min": "--is-cap-min", "CorrectionConfig.band": "--band",
    "CorrectionConfig.band_low": "--band", "CorrectionConfig.band_high": "--band",
    "CorrectionConfig.ais_target": "--ais-target", "CorrectionConfig.reject_stat": "--reject",
    "CorrectionConfig.ais_tau": "--ais-tau", "CorrectionConfig.ais_ema": "--ais-ema",
    "CorrectionConfig.ais_combiner": "--ais-combiner",
    "CorrectionConfig.reject_agg": "--reject", "CorrectionConfig.reject_threshold": "--reject",
    "CorrectionConfig.normalize_weights": "--normalize-weights", "CorrectionConfig.bypass": "--bypass",
    "CorrectionConfig.train_forward": "--train-forward", "GRPOConfig.loss_type": "--loss-type",
    "GRPOConfig.dual_clip": "--dual-clip", "GRPOConfig.error_ngram": "--error-ngram",
    "GRPOConfig.error_mask_threshold": "--mask-error-completions",
    "CorrectionConfig.rejected": "--rejected", "CorrectionConfig.reject_rules": "--reject",
    "GRPOConfig.clip_ratio_c": "--clip-ratio-c", "GRPOConfig.epsilon_high": "--epsilon-high",
    "GRPOConfig.off_policy_mask_threshold": "--off-policy-mask",
    "SamplerConfig.cache": "--cache", "SamplerConfig.threshold": "--threshold",
    "SamplerConfig.cuda_graphs": "--cuda-graphs", "GRPOConfig.beta": "--beta",
    "TrainConfig.trajectory_merge": "--trajectory-merge",
    "PolicyLikelihoodConfig.elbo_draws": "--elbo-draws", "PolicyLikelihoodConfig.elbo_scheme": "--elbo-scheme",
    "PolicyLikelihoodConfig.elbo_ratio_level": "--elbo-ratio-level", "PolicyLikelihoodConfig.spg_beta": "--spg-beta",
    "PolicyLikelihoodConfig.spg_mix": "--spg-mix", "PolicyLikelihoodConfig.mdpo_steps": "--mdpo-steps",
    "PolicyLikelihoodConfig.mdpo_confidence": "--mdpo-confidence",
    "PolicyLikelihoodConfig.dtreerpo_segments": "--dtreerpo-segments",
    "TrainConfig.mismatch_estimator": "--mismatch-estimator", "TrainConfig.trajectory_steps": "--trajectory-steps",
    "TrainConfig.policy_logprob": "--policy-logprob", "TrainConfig.trajectory_selection": "--trajectory-selection",
    "SamplerConfig.max_commit_per_step": "--max-commit-per-step", "SamplerConfig.dream_alg": "--dream-alg",
    "SamplerConfig.dream_alg_temp": "--dream-alg-temp",
    "SamplerConfig.sdar_strategy": "--sdar-strategy", "SamplerConfig.sdar_threshold": "--sdar-threshold",
    "TrainConfig.save_every_minutes": "--save-every-minutes", "TrainConfig.keep_checkpoints": "--keep-checkpoints",
}
"""Config fields that have a flag: errors name the flag the user typed, not the dataclass field."""


def flags_of(command: str) -> dict[str, str]:
    """FIELD_FLAGS as `command` reads them: sample's --steps is the sampler's, train's the trainer's."""
    fields = dict(FIELD_FLAGS)
    if command == "sample":
        fields["SamplerConfig.steps"] = "--steps"
        fields.pop("TrainConfig.steps")
    return fields


def name_flags(message: str, command: str) -> str:
    """'TrainConfig.steps=-1 must be >= 1.' -> '--steps -1 must be >= 1.' (fields without a flag stay as they are)."""
    fields = flags_of(command)

    def flag(m: re.Match) -> str:
        name = fields.get(m.group(1))
        return m.group(0) if name is None else name + (" " if m.group(2) else "")

    return re.sub(r"\b([A-Z][A-Za-z]*Config\.[a-z_]+)(=?)", flag, message)


def typed_flags(args: argparse.Namespace) -> dict[str, object]:
    """{"--lr": 5.0, ...}: the flags the user typed (a value other than the parser's None/False default)."""
    parser = getattr(args, "_parser", None)
    if parser is None:
        return {}
    return {a.option_strings[-1] if a.option_strings[-1].startswith("--") else a.option_strings[0]:
            getattr(args, a.dest)
            for a in parser._actions
            if a.option_strings and a.dest != "help" and (a.default is None or a.default is False)
            and getattr(args, a.dest, None) is not None and getattr(args, a.dest, None) is not False}
