"""`dllm-ais` command line: train (the main job), sample, eval, plot, plan, variance.

Each subcommand is a thin function over the package; heavy imports happen inside it, so `dllm-ais --help` is fast.
"""

from __future__ import annotations

import argparse
import logging
import sys

import dllm_ais
from dllm_ais.config import CACHE_MODES, PRESETS, get_preset, override


def _quiet_third_party_logs() -> None:
    """transformers imports torchao, whose optional CUDA extensions log load failures on CPU-only machines."""
    for name in ("torchao", "torch.utils._pytree", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


DEFAULT_PRESET = "tiny-cpu"
"""The preset used when --preset is not given (train, sample, eval)."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with each flag's default (TRL-style): "(default: X)" after a fixed default; flags that default
    to the preset's value are annotated by `_show_preset_defaults`. Help that already names its default is kept."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default" in text.lower()):
            return text
        return f"{text} (default: %(default)s)"


def _section_of(preset, cls_name: str):
    return {"ModelConfig": preset.model, "SamplerConfig": preset.sampler, "TrainConfig": preset.train,
            "GRPOConfig": preset.grpo, "CorrectionConfig": preset.correction}.get(cls_name)


def _show_preset_defaults(parser: argparse.ArgumentParser, command: str) -> None:
    """Append "(default: the preset's; tiny-cpu: X)" to the help of each flag that takes its value from the preset
    (default None and a config field in FIELD_FLAGS), X read from the default preset, so help never goes stale."""
    preset = get_preset(DEFAULT_PRESET)
    fields = _field_flags(command)
    for action in parser._actions:
        text = action.help or ""
        if action.default is not None or not action.option_strings or "default" in text.lower():
            continue
        values = []
        for key, flag in fields.items():
            cls_name, _, name = key.partition(".")
            section = _section_of(preset, cls_name)
            if flag in action.option_strings and section is not None and hasattr(section, name):
                values.append(getattr(section, name))
        values = [v for v in values if v is not None and v is not False and v != [] and v != {}]
        if values:
            shown = " ".join(str(v) for v in values)
            action.help = f"{text} (default: the preset's; {DEFAULT_PRESET}: {shown})".lstrip()


def _move_to_group(parser: argparse.ArgumentParser, group, dests: tuple[str, ...]) -> None:
    """Show the flags with these dests under `group` in --help (parsing is unchanged): flags that one helper function
    adds together but that belong to different help sections."""
    for action in parser._actions:
        if action.dest not in dests:
            continue
        for other in parser._action_groups:
            if action in other._group_actions and other is not group:
                other._group_actions.remove(action)
        if action not in group._group_actions:
            group._group_actions.append(action)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None, help=f"named preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET})")
    p.add_argument("--model", default=None, help="checkpoint directory or hub id of the preset's family (LLaDA "
                   "official layout; Qwen save_pretrained layout with a qwen preset); overrides the preset's")
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (refused where it is not "
                   "available)")
    p.add_argument("--dtype", default=None, help="parameter dtype: float32, bfloat16, float16")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling noise and the tiny model's weights")


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gen-length", type=int, default=None, help="completion length in tokens")
    p.add_argument("--block-length", type=int, default=None, help="semi-autoregressive block length")
    p.add_argument("--steps", type=int, default=None, help="total denoising steps")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    p.add_argument("--remasking", default=None, choices=["low_confidence", "random"],
                   help="which masked positions each step commits: the most confident ones, or random ones")
    p.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (0 = off)")
    p.add_argument("--cache", default=None, choices=CACHE_MODES,
                   help="Fast-dLLM block KV cache: none (every step a full forward), prefix (one refresh forward per "
                   "block caches what precedes it), dual (later steps recompute the current block only)")
    p.add_argument("--threshold", type=float, default=None, metavar="F",
                   help="Fast-dLLM parallel decoding: each step commits every masked token of the block with "
                   "confidence >= F (and at least one), in (0, 1]; default: the fixed schedule")


def _add_correction_args(p: argparse.ArgumentParser) -> None:
    from dllm_ais.rl.config import (
        AIS_COMBINERS,
        AIS_TARGETS,
        CORRECTION_LEVELS,
        CORRECTIONS,
        LOSS_TYPES,
        TRAIN_FORWARDS,
        TRL_ALIASES,
    )

    p.add_argument("--correction", default=None, choices=[*CORRECTIONS, *TRL_ALIASES],
                   help="mismatch correction (docs/corrections.md); TRL's token_truncate / token_mask / "
                   "sequence_truncate / sequence_mask also set --correction-level")
    p.add_argument("--correction-level", default=None, choices=CORRECTION_LEVELS,
                   help="weight per sequence, per token, or geometric (exp of the mean token log-ratio)")
    p.add_argument("--is-cap", type=float, default=None, help="C: TIS cap / MIS upper threshold (TRL's clip max)")
    p.add_argument("--is-cap-min", type=float, default=None, help="MIS lower threshold (TRL's clip min; 0 = none)")
    p.add_argument("--band", type=float, nargs=2, metavar=("LOW", "HIGH"), default=None,
                   help="--correction band (IcePop): keep weights in [LOW, HIGH], zero outside (default 0.5 5)")
    p.add_argument("--ais-target", default=None, choices=AIS_TARGETS, help="the full-IS mode AIS mixes towards")
    p.add_argument("--ais-tau", type=float, default=None, metavar="TAU",
                   help="τ of AIS's severity s = 1 − exp(−D/τ) (default 0.02 at sequence level; docs/ais.md §5a)")
    p.add_argument("--ais-ema", type=float, default=None, metavar="BETA",
                   help="EMA factor β in [0, 1) for λ across steps (default 0: per-batch λ)")
    p.add_argument("--ais-combiner", default=None, choices=AIS_COMBINERS,
                   help="how s, R, g become λ: product = s·R·g (default), severity = s·g (not shrunk by the ESS R)")
    p.add_argument("--reject", default=None, metavar="STAT:AGG:THRESHOLD",
                   help="reject samples by divergence, e.g. k3:seq_mean:0.01 (k1|k2|k3 : token|seq_sum|seq_mean|"
                   "seq_max); several rules comma-separated (all must pass); k1 also takes ratio bounds LOWER_UPPER, "
                   "e.g. k1:seq_mean:0.5_2; or none (default: none)")
    p.add_argument("--normalize-weights", action="store_true", help="normalise the weights to batch mean 1")
    p.add_argument("--bypass", action="store_true",
                   help="use the rollout policy as pi_old (skip the BF16 old-policy pass)")
    p.add_argument("--train-forward", default=None, choices=TRAIN_FORWARDS,
                   help="aligned: fake-quantise the training forward like the FP8 rollout copy (QaRL)")
    p.add_argument("--loss-type", default=None, choices=LOSS_TYPES, help="GRPO loss aggregation, or tbpo (QaRL)")
    p.add_argument("--dual-clip", type=float, default=None, help="tbpo: dual-clip bound c > 1 for negative Â")
    p.add_argument("--mask-error-completions", type=float, default=None, metavar="FRAC",
                   help="drop completions whose repeated-n-gram fraction exceeds FRAC from the loss")
    p.add_argument("--error-ngram", type=int, default=None, help="n of the repeated-n-gram detector (default 4)")
    p.add_argument("--rejected", default=None, choices=["zero", "drop"],
                   help="rejected samples (omega = 0): zero = stay in the loss normaliser (TRL's *_mask, default); "
                   "drop = leave the loss mask, token means over kept tokens (verl's rollout_rs)")
    p.add_argument("--no-is-cap", action="store_true",
                   help="no upper IS bound (TRL's vllm_importance_sampling_clip_max=None)")
    p.add_argument("--clip-ratio-c", type=float, default=None,
                   help="verl's per-token dual clip for negative advantages in the standard loss (c > 1, verl: 3)")
    p.add_argument("--epsilon-high", type=float, default=None,
                   help="upper clip 1 + EPS of the ratio; with --loss-type cispo the absolute cap of the ratio")
    p.add_argument("--off-policy-mask", type=float, default=None, metavar="DELTA",
                   help="TRL's off_policy_mask_threshold: drop negative-advantage sequences whose mean "
                   "log mu - log pi_theta exceeds DELTA")


def _floats(flag: str, value: str | None) -> list[float] | None:
    """'1,0.5' -> [1.0, 0.5]; None -> None; anything else a one-line error naming the flag."""
    if value is None:
        return None
    try:
        return [float(v) for v in value.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {value!r}: expected comma-separated numbers, e.g. 1,0.5.") from None


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
    "TrainConfig.mismatch_estimator": "--mismatch-estimator", "TrainConfig.trajectory_steps": "--trajectory-steps",
    "TrainConfig.policy_logprob": "--policy-logprob", "TrainConfig.trajectory_selection": "--trajectory-selection",
    "SamplerConfig.max_commit_per_step": "--max-commit-per-step",
}
"""Config fields that have a flag: errors name the flag the user typed, not the dataclass field."""


def _field_flags(command: str) -> dict[str, str]:
    """FIELD_FLAGS as `command` reads them: sample's --steps is the sampler's, train's the trainer's."""
    fields = dict(FIELD_FLAGS)
    if command == "sample":
        fields["SamplerConfig.steps"] = "--steps"
        fields.pop("TrainConfig.steps")
    return fields


def name_flags(message: str, command: str) -> str:
    """'TrainConfig.steps=-1 must be >= 1.' -> '--steps -1 must be >= 1.' (fields without a flag stay as they are)."""
    import re

    fields = _field_flags(command)

    def flag(m: re.Match) -> str:
        name = fields.get(m.group(1))
        return m.group(0) if name is None else name + (" " if m.group(2) else "")

    return re.sub(r"\b([A-Z][A-Za-z]*Config\.[a-z_]+)(=?)", flag, message)


def _train_preset(args: argparse.Namespace, base=None):
    """The preset `train` runs: `base` (default the --preset) with the typed flags applied."""
    from dataclasses import replace

    preset = base if base is not None else get_preset(args.preset or DEFAULT_PRESET)
    train = override(preset.train, task=args.task, data_path=args.data, reward_fn=args.reward_fn,
                     reward_weights=_floats("--reward-weights", args.reward_weights), steps=args.steps,
                     rollout_precision=args.rollout_precision, fp8_backend=args.fp8_backend, seed=args.seed,
                     fp4_format=args.fp4_format,
                     learning_rate=args.lr, sft_steps=args.sft_steps, lora_r=args.lora_r,
                     save_every=args.save_every, report_to=_report_to(args.report_to),
                     grad_diagnostics_every=args.grad_diagnostics_every)
    if args.task and args.task != preset.train.task:
        train = replace(train, task_config={})  # generator options belong to the preset's own task
    train = override(train, mismatch_estimator=args.mismatch_estimator, trajectory_steps=args.trajectory_steps,
                     policy_logprob=args.policy_logprob, trajectory_selection=(
                         None if args.trajectory_selection is None else args.trajectory_selection == "on"))
    return replace(preset, model=override(preset.model, path=args.model, device=args.device, dtype=args.dtype),
                   sampler=override(preset.sampler, cache=args.cache, threshold=args.threshold,
                                    max_commit_per_step=args.max_commit_per_step),
                   train=train, **_correction_overrides(args, preset))


def _report_to(values: list[str] | None) -> list[str] | None:
    """--report-to's names (duplicates dropped); `none` alone = no tracker; None = the preset's (or the run's)."""
    if values is None or values == ["none"]:
        return None if values is None else []
    if "none" in values:
        raise ValueError(f"--report-to {' '.join(values)}: 'none' means no tracker; pass it alone, or drop it.")
    return list(dict.fromkeys(values))


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


def _add_fast_rollout_args(p: argparse.ArgumentParser) -> None:
    """`train`: Fast-dLLM rollouts (KV cache, threshold decoding) and the mismatch estimator that can see them."""
    from dllm_ais.config import CACHE_MODES, MISMATCH_ESTIMATORS, POLICY_LOGPROBS

    p.add_argument("--cache", default=None, choices=CACHE_MODES,
                   help="rollout KV cache (Fast-dLLM): none, prefix, dual (needs --mismatch-estimator trajectory)")
    p.add_argument("--threshold", type=float, default=None, metavar="F",
                   help="rollout threshold decoding: commit every token with confidence >= F per step (needs "
                   "--mismatch-estimator trajectory)")
    p.add_argument("--mismatch-estimator", default=None, choices=MISMATCH_ESTIMATORS,
                   help="diffusion log-ratio: elbo (coupled MC-ELBO, default) or trajectory (replay of the "
                   "recorded denoising canvases under pi_old; sees --cache/--threshold)")
    p.add_argument("--trajectory-steps", type=int, default=None, metavar="K",
                   help="trajectory: replay K random denoising steps per sequence (Horvitz-Thompson scaled; "
                   "default all)")
    p.add_argument("--policy-logprob", default=None, choices=POLICY_LOGPROBS, help="log pi of the GRPO ratio and KL: "
                   "one_step (d1) or trajectory (the sampled denoising path replayed under theta, cache included)")
    p.add_argument("--trajectory-selection", default=None, choices=["on", "off"], help="add the selection term")
    p.add_argument("--max-commit-per-step", type=int, default=None, metavar="N", help="threshold decoding: commit "
                   "at most N tokens per step (needs --threshold)")


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
    grpo = override(preset.grpo, loss_type=args.loss_type, dual_clip=args.dual_clip, error_ngram=args.error_ngram,
                    error_mask_threshold=args.mask_error_completions, clip_ratio_c=args.clip_ratio_c,
                    epsilon_high=args.epsilon_high, off_policy_mask_threshold=args.off_policy_mask)
    return {"correction": correction, "grpo": grpo}


def _preflight_train(preset, out: str, resume: bool) -> None:
    """Checks that need no torch, run before the heavy imports so bad input fails in well under a second:
    the run directory, the task and a local --data file, a local --model directory."""
    from pathlib import Path

    run = Path(out)
    if run.exists() and not run.is_dir():
        raise FileExistsError(f"--out {out}: a file of that name exists; --out names a run directory.")
    for parent in run.parents:
        if parent.exists() and not parent.is_dir():
            raise FileExistsError(f"--out {out}: {parent} is a file, not a directory; choose another --out.")
    holds_run = (run / "config.json").exists() or (run / "metrics.jsonl").exists()
    if resume and not (run / "config.json").exists():
        raise FileNotFoundError(f"--resume: {run} holds no run (no config.json); drop --resume to start one there.")
    if not resume and holds_run:
        raise FileExistsError(f"--out {run} already holds a run; pass --resume to continue it, or choose another "
                              "--out.")
    if resume:
        return  # the run's own config.json decides the rest
    from dllm_ais.tasks.loading import local_format
    from dllm_ais.tasks.registry import get_task

    try:
        task = get_task(preset.train.task)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    data = preset.train.data_path
    if data is not None:
        _check_data_path(data)
        if local_format(data) == "json":
            task.load("train", data_path=data, limit=1)  # reads and checks every line of the file
    path = preset.model.path
    if path is not None:
        local = Path(path).expanduser()
        if local.exists() or path.startswith((".", "/", "~")):
            if not local.is_dir():
                raise FileNotFoundError(f"--model {path}: not a checkpoint directory.")
            if not (local / "config.json").is_file():
                raise FileNotFoundError(f"--model {path}: no config.json, so not a checkpoint directory.")


def _check_data_path(data: str) -> None:
    """--data is a local .jsonl/.json/.parquet file, or a hub dataset name; anything on disk that is neither (a
    directory, a CSV) or a missing local-looking path is refused here, not sent to the hub."""
    from pathlib import Path

    from dllm_ais.tasks.loading import LOCAL_FORMATS, local_format

    local = Path(data).expanduser()
    kinds = "/".join(LOCAL_FORMATS)
    if local.is_dir():
        raise ValueError(f"--data {data}: a directory; pass one {kinds} file inside it.")
    file_like = local.suffix.lower() in (".csv", ".tsv", ".txt", ".xls", ".xlsx", ".arrow")
    if local_format(data) is None and (local.exists() or data.startswith((".", "/", "~")) or file_like):
        what = "no such file" if not local.exists() else f"a {local.suffix or 'suffix-less'} file"
        raise ValueError(f"--data {data}: {what}; --data reads a local {kinds} file (convert a CSV with pandas: "
                         "pd.read_csv(f).to_json(out, orient='records', lines=True)) or names a hub dataset.")


def _resume_preset(args: argparse.Namespace, typed: dict[str, object], out: str):
    """The preset a resumed run continues with: its config.json plus the flags that may change on resume (--steps,
    --save-every); any other flag that differs from the run's value is refused, naming it."""
    from dllm_ais.train.flags import resume_changes
    from dllm_ais.train.run_dir import read_run_config

    if "--preset" in typed:
        raise ValueError("--preset cannot be combined with --resume: the run's config.json names its preset.")
    saved = read_run_config(out)
    wanted = _train_preset(args, base=saved)
    _, refused = resume_changes(saved, wanted, FIELD_FLAGS)
    if refused:
        raise ValueError(f"--resume continues {out} with its config.json; {', '.join(refused)} cannot change on a "
                         "resumed run (only --steps, --save-every and --report-to can): drop them, or start a new run "
                         "with another "
                         "--out.")
    return wanted


def default_run_dir(preset_name: str, now: float | None = None, pid: int | None = None) -> str:
    """runs/<preset>-<date>-<time>-<pid>: two runs started in the same second get different directories. Processes of
    one `accelerate launch`/torchrun share the launcher's pid (their parent), so they agree on one directory."""
    import os
    import time

    if pid is None:
        pid = os.getppid() if "LOCAL_RANK" in os.environ else os.getpid()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"runs/{preset_name}-{stamp}-{pid}"


def _device_and_backend_checks(preset) -> None:
    """Checks that need torch, still before the run directory exists: the device is there, the FP8 backend is known
    and runs on it."""
    from dllm_ais.train.flags import check_device

    device = preset.model.device
    check_device(device)
    tc = preset.train
    if tc.rollout_precision == "fp8" or preset.correction.train_forward == "aligned":
        from dllm_ais.fp8.backends import check_backend

        try:
            check_backend(tc.fp8_backend, device)
        except ValueError as e:
            raise ValueError(f"--fp8-backend {tc.fp8_backend}: {e}") from None


def cmd_train(args: argparse.Namespace) -> int:
    import math
    import time

    from dllm_ais.train.flags import check_combinations, check_trackers, default_threads, usable_cores

    typed = typed_flags(args)
    preset = _train_preset(args)  # flags and config validation first: no heavy import yet
    out = args.out or default_run_dir(preset.name)
    _preflight_train(preset, out, args.resume)
    if args.resume:
        preset = _resume_preset(args, typed, out)
    check_combinations(typed, preset)
    check_trackers(preset.train.report_to)  # the run's own list on --resume
    threads = args.threads or default_threads(usable_cores())

    import torch

    from dllm_ais.metrics import REWARD_MEAN, STEP, read_metrics
    from dllm_ais.train.job import run_training

    _device_and_backend_checks(preset)
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        trainer = run_training(preset, out, resume=args.resume, progress=not args.no_progress, steps=args.steps,
                               save_every=args.save_every, hash_check=not args.no_hash_check,
                               report_to=_report_to(args.report_to))
    except KeyboardInterrupt:
        return 130
    seconds = time.perf_counter() - t0
    all_rows = read_metrics(out)
    new = [r for r in all_rows if r.get(STEP) >= trainer.first_step]  # a resume redoes steps after its checkpoint
    done_before = trainer.first_step > 0
    rows = [r for r in all_rows if math.isfinite(r.get(REWARD_MEAN, math.nan))]
    q = max(1, len(rows) // 4)
    first = sum(r[REWARD_MEAN] for r in rows[:q]) / q if rows else float("nan")
    last = sum(r[REWARD_MEAN] for r in rows[-q:]) / q if rows else float("nan")
    total = f" ({len(all_rows)} in the run)" if done_before else ""
    print(f"run {out}: {len(new)} steps in {seconds:.0f} s{total}; reward/mean first quarter {first:.3f} -> last "
          f"quarter {last:.3f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dllm-ais", description="GRPO for diffusion LMs with FP8 rollouts and AIS.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {dllm_ais.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    tiny = get_preset(DEFAULT_PRESET)
    p = sub.add_parser("train", help="AIS-GRPO training (default: tiny LLaDA on CPU, SFT warm-up, FP8 rollouts)",
                       formatter_class=HelpFormatter,
                       description="GRPO training of a diffusion (LLaDA) or autoregressive (Qwen) model with FP8 "
                                   "rollouts and an importance-sampling correction (default AIS). Without flags it "
                                   f"trains the tiny built-in LLaDA on the {tiny.train.task} task on CPU: an SFT "
                                   f"warm-up of {tiny.train.sft_steps} steps, then {tiny.train.steps} GRPO steps; the "
                                   "run directory (--out) gets config.json, metrics.jsonl and checkpoints/step-N, and "
                                   "--resume continues it. Flags left out take the preset's value (shown as "
                                   f"'{DEFAULT_PRESET}: ...'); every flag is checked before anything is written.")
    _add_model_args(p.add_argument_group("model"))
    data = p.add_argument_group("data and reward")
    data.add_argument("--task", default=None, help="task: digits, arith, gsm8k, math500, countdown, sudoku")
    data.add_argument("--data", default=None, help="local .jsonl/.json/.parquet training file for the task (offline); "
                      "other strings are hub dataset names")
    data.add_argument("--reward-fn", action="append", default=None, metavar="MODULE:FUNCTION",
                      help="TRL reward function 'package.module:function', called as TRL calls it (keyword "
                           "arguments; message lists for chat prompts; None = not applicable). Repeatable; replaces "
                           "the task's reward")
    data.add_argument("--reward-weights", default=None, metavar="W[,W...]",
                      help="one weight per --reward-fn, comma separated (default all 1); reward = weighted sum")
    rollout = p.add_argument_group("rollout")
    rollout.add_argument("--rollout-precision", default=None, choices=["bf16", "fp8", "fp4"],
                         help="precision of the rollout policy μ: fp8 (blockwise e4m3 copy, resynced every step), "
                              "fp4 (emulated W4A4) or bf16 (the master itself: no mismatch, every weight 1)")
    rollout.add_argument("--fp8-backend", default=None, help="FP8 GEMM of the rollout copy: torch (reference, CPU), "
                         "triton (GPU, or CPU under TRITON_INTERPRET=1), cublas, torchao, scaled_mm (row-wise), auto "
                         "(fastest block backend per shape)")
    rollout.add_argument("--fp4-format", default=None, choices=["nvfp4", "mxfp4"], help="FP4 format of "
                         "--rollout-precision fp4 (emulated: no speedup without Blackwell FP4 tensor cores)")
    _add_fast_rollout_args(rollout)
    _add_correction_args(p.add_argument_group("correction (docs/corrections.md)"))
    grpo = p.add_argument_group("GRPO")
    grpo.add_argument("--steps", type=int, default=None, help="GRPO steps (each: rollouts, rewards, updates, sync)")
    grpo.add_argument("--lr", type=float, default=None, help="AdamW learning rate of the GRPO updates")
    grpo.add_argument("--sft-steps", type=int, default=None, help="masked-diffusion SFT warm-up steps before GRPO "
                      "(0 = none)")
    grpo.add_argument("--lora-r", type=int, default=None, help="LoRA rank (0 = full fine-tuning)")
    _move_to_group(p, grpo, ("loss_type", "dual_clip", "mask_error_completions", "error_ngram", "clip_ratio_c",
                             "epsilon_high", "off_policy_mask_threshold"))
    run = p.add_argument_group("run")
    run.add_argument("--out", default=None, help="run directory (default runs/<preset>-<date>-<time>-<pid>)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its newest intact "
                     "checkpoint (verified against its manifest); only --steps, --save-every and --report-to may "
                     "change (applied and recorded in config.json)")
    run.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (0 = at the end and on "
                     "Ctrl-C only)")
    from dllm_ais.train.run_dir import add_hash_check_argument

    add_hash_check_argument(run)
    from dllm_ais.config import TRACKERS

    run.add_argument("--report-to", nargs="+", default=None, choices=(*TRACKERS, "none"), metavar="TRACKER",
                     help="also send every step's metrics to these experiment trackers, through accelerate (TRL's "
                     f"report_to): {', '.join(TRACKERS)}, or none; tensorboard writes <out>/logs (pip install "
                     "'dllm-ais[tensorboard]'). metrics.jsonl is always written")
    run.add_argument("--grad-diagnostics-every", type=int, default=None, metavar="N", help="every N steps log how "
                     "far the correction moves the policy gradient vs the minibatch noise (grad/*; 3 extra "
                     "forward+backward passes on those steps; one process)")
    run.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: the usable cores "
                     "minus one, at least 1: with every core busy, one more process on the machine slows each step "
                     "about 10x; docs/cpu.md)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train, seed=None, _parser=p)
    _show_preset_defaults(p, "train")

    p = sub.add_parser("sample", help="generate completions with the masked-diffusion sampler",
                       description="Generate completions. Without --model or --run it samples the untrained tiny "
                                   "built-in model (random weights: gibberish); --run RUN_DIR samples a training "
                                   "run's latest checkpoint, --model takes a checkpoint directory, a run's "
                                   "checkpoints/step-N, or a hub id.", formatter_class=HelpFormatter)
    model = p.add_argument_group("model")
    _add_model_args(model)
    model.add_argument("--run", default=None, help="training run directory: sample its latest checkpoint")
    add_hash_check_argument(model)
    _add_sampler_args(p.add_argument_group("sampler"))
    p.add_argument("--prompt", action="append", help="a prompt (repeatable); default: a few built-in prompts")
    p.add_argument("--no-chat", action="store_true", help="do not wrap prompts in the tokenizer's chat template")
    p.add_argument("--fp8", action="store_true", help="sample with the FP8 rollout copy (blockwise e4m3 linears)")
    p.add_argument("--backend", default="torch", help="FP8 GEMM backend: torch (reference, CPU), triton, cublas, "
                   "torchao, scaled_mm (row-wise), auto (fastest block backend per shape)")
    p.add_argument("--fp4", action="store_true", help="sample with the emulated FP4 rollout copy (W4A4)")
    p.add_argument("--fp4-format", default="nvfp4", choices=["nvfp4", "mxfp4"], help="FP4 format for --fp4")
    p.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a terminal")
    from dllm_ais.sample import cmd_sample

    p.set_defaults(func=cmd_sample)
    _show_preset_defaults(p, "sample")
    from dllm_ais.analysis.evaluate import add_eval_arguments, cmd_eval
    from dllm_ais.analysis.plot import add_plot_arguments, cmd_plot

    p = sub.add_parser("eval", help="accuracy of a model, run or checkpoint on a task (d1 evaluation settings)",
                       formatter_class=HelpFormatter)
    add_eval_arguments(p)
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("plot", help="PNG curves (reward, lambda, ESS, divergence, mismatch KL) of one or more runs",
                       formatter_class=HelpFormatter)
    add_plot_arguments(p)
    p.set_defaults(func=cmd_plot)
    from dllm_ais.plan.command import add_plan_arguments, cmd_plan

    p = sub.add_parser("plan", help="peak memory per GPU and seconds per step of a preset, before a run",
                       formatter_class=HelpFormatter, description="Predict a preset's peak memory per GPU by part and "
                       "its seconds per RL step by phase on an H100, H200 or A100, from meta-device models (no "
                       "weights) and benchmarks/gpu/ rows; when it does not fit, by how much and what fixes it "
                       "(docs/plan.md).")
    _add_fast_rollout_args(add_plan_arguments(p))
    p.set_defaults(func=cmd_plan, _parser=p)
    _show_preset_defaults(p, "train")
    # listed for --help only: main() hands `variance ...` to dllm_ais/analysis/variance_cli.py's own parser
    sub.add_parser("variance", help="std of the FP8/BF16 log-ratio vs forward passes per ELBO estimator "
                   "(dllm-ais variance --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["variance"]:  # its own parser (dllm_ais/analysis/variance_cli.py) takes every remaining argument
        _quiet_third_party_logs()
        from dllm_ais.analysis.variance_cli import main as variance_main

        return variance_main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    _quiet_third_party_logs()
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError, RuntimeError, ImportError, TypeError) as e:
        print(f"dllm-ais {args.command}: error: {name_flags(str(e), args.command)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
