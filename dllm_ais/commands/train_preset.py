"""`dllm-ais train`'s flags -> the Preset it runs (a new run: the --preset with the typed flags applied; --resume:
the run's config.json with the flags that may change on resume)."""

from __future__ import annotations

import argparse

from dllm_ais.commands.field_flags import FIELD_FLAGS
from dllm_ais.commands.help import DEFAULT_PRESET
from dllm_ais.config import override
from dllm_ais.families import foreign_policy_logprob, get_family
from dllm_ais.presets import get_preset


def _floats(flag: str, value: str | None) -> list[float] | None:
    """'1,0.5' -> [1.0, 0.5]; None -> None; anything else a one-line error naming the flag."""
    if value is None:
        return None
    try:
        return [float(v) for v in value.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {value!r}: expected comma-separated numbers, e.g. 1,0.5.") from None


def train_preset(args: argparse.Namespace, base=None):
    """The preset `train` runs: `base` (default the --preset) with the typed flags applied."""
    from dataclasses import replace

    preset = base if base is not None else get_preset(args.preset or DEFAULT_PRESET)
    train = override(preset.train, task=args.task, data_path=args.data, reward_fn=args.reward_fn,
                     reward_weights=_floats("--reward-weights", args.reward_weights), steps=args.steps,
                     rollout_precision=args.rollout_precision, fp8_backend=args.fp8_backend, seed=args.seed,
                     fp4_format=args.fp4_format,
                     learning_rate=args.lr, sft_steps=args.sft_steps, lora_r=args.lora_r,
                     save_every=args.save_every, report_to=tracker_list(args.report_to),
                     save_every_minutes=args.save_every_minutes, keep_checkpoints=args.keep_checkpoints,
                     grad_diagnostics_every=args.grad_diagnostics_every)
    if args.task and args.task != preset.train.task:
        train = replace(train, task_config={})  # generator options belong to the preset's own task
    train = override(train, mismatch_estimator=args.mismatch_estimator, trajectory_steps=args.trajectory_steps,
                     policy_logprob=args.policy_logprob, trajectory_merge=args.trajectory_merge,
                     trajectory_selection=(
                         None if args.trajectory_selection is None else args.trajectory_selection == "on"),
                     likelihood=override(train.likelihood, elbo_draws=args.elbo_draws, elbo_scheme=args.elbo_scheme,
                                         elbo_ratio_level=args.elbo_ratio_level, spg_beta=args.spg_beta,
                                         spg_mix=args.spg_mix, mdpo_steps=args.mdpo_steps,
                                         mdpo_confidence=(None if args.mdpo_confidence is None
                                                          else args.mdpo_confidence == "on"),
                                         dtreerpo_segments=args.dtreerpo_segments))
    return replace(preset, model=override(preset.model, path=args.model, device=args.device, dtype=args.dtype),
                   sampler=override(preset.sampler, cache=args.cache, threshold=args.threshold,
                                    max_commit_per_step=args.max_commit_per_step, cuda_graphs=args.cuda_graphs,
                                    dream_alg=args.dream_alg, dream_alg_temp=args.dream_alg_temp,
                                    sdar_strategy=args.sdar_strategy, sdar_threshold=args.sdar_threshold),
                   train=train, **_correction_overrides(args, preset))


def tracker_list(values: list[str] | None) -> list[str] | None:
    """--report-to's names (duplicates dropped); `none` alone = no tracker; None = the preset's (or the run's)."""
    if values is None or values == ["none"]:
        return None if values is None else []
    if "none" in values:
        raise ValueError(f"--report-to {' '.join(values)}: 'none' means no tracker; pass it alone, or drop it.")
    return list(dict.fromkeys(values))


def _correction_overrides(args: argparse.Namespace, preset) -> dict:
    """The correction / loss flags of `train` (docs/corrections.md) as replaced `correction` and `grpo` configs."""
    from dataclasses import replace

    from dllm_ais.rl.config import parse_reject

    band = args.band or (None, None)
    reject = parse_reject(args.reject) if args.reject else {}
    correction = override(preset.correction, correction=args.correction, correction_level=args.correction_level,
                          is_cap=args.is_cap, is_cap_min=args.is_cap_min, band_low=band[0], band_high=band[1],
                          ais_target=args.ais_target, ais_tau=args.ais_tau, ais_ema=args.ais_ema,
                          ais_combiner=args.ais_combiner, normalize_weights=args.normalize_weights or None,
                          bypass=args.bypass or None, train_forward=args.train_forward, rejected=args.rejected,
                          **reject)
    if args.no_is_cap:
        if args.is_cap is not None:
            raise ValueError("--no-is-cap and --is-cap contradict each other; pass one.")
        correction = replace(correction, is_cap=None)
    beta = args.beta
    if beta is None and (args.policy_logprob or preset.train.policy_logprob) == "spg" and preset.grpo.beta != 0:
        import sys

        beta = 0.0  # SPG's loss has no KL term: the preset's β goes, and the run says so
        print(f"--policy-logprob spg: β set to 0 (the preset's {preset.grpo.beta}; SPG trains without a KL term)",
              file=sys.stderr)
    loss_type = args.loss_type
    ebpo = (args.policy_logprob or preset.train.policy_logprob) == "ebpo"
    if ebpo and loss_type is None and preset.grpo.loss_type != "grpo" and not foreign_policy_logprob(
            get_family(preset.model.family), "ebpo"):  # (another family's refusal comes alone, from Preset)
        import sys

        loss_type = "grpo"  # EBPO's loss is the mean over sequences of the clipped sequence-ratio surrogate
        print(f"--policy-logprob ebpo: --loss-type grpo (the preset's {preset.grpo.loss_type}; EBPO averages its "
              "clipped sequence surrogate over sequences)", file=sys.stderr)
    grpo = override(preset.grpo, loss_type=loss_type, dual_clip=args.dual_clip, error_ngram=args.error_ngram,
                    error_mask_threshold=args.mask_error_completions, clip_ratio_c=args.clip_ratio_c,
                    epsilon_high=args.epsilon_high, off_policy_mask_threshold=args.off_policy_mask, beta=beta)
    return {"correction": correction, "grpo": grpo}


def resume_preset(args: argparse.Namespace, typed: dict[str, object], out: str):
    """The preset a resumed run continues with: its config.json plus the flags that may change on resume (--steps,
    --save-every); any other flag that differs from the run's value is refused, naming it."""
    from dllm_ais.train.flags import resume_changes
    from dllm_ais.train.run_dir import read_run_config

    if "--preset" in typed:
        raise ValueError("--preset cannot be combined with --resume: the run's config.json names its preset.")
    saved = read_run_config(out)
    wanted = train_preset(args, base=saved)
    _, refused = resume_changes(saved, wanted, FIELD_FLAGS)
    if refused:
        raise ValueError(f"--resume continues {out} with its config.json; {', '.join(refused)} cannot change on "
                         "a resumed run (only --steps, the checkpoint flags and --report-to can): drop them, or start "
                         "a new run with another --out.")
    return wanted
