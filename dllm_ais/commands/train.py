"""`dllm-ais train`: the parser and the command (checks, then dllm_ais.train.job.run_training, then a summary)."""

from __future__ import annotations

import argparse

from dllm_ais.commands.common_args import add_model_args, family_titles
from dllm_ais.commands.field_flags import typed_flags
from dllm_ais.commands.help import DEFAULT_PRESET, HelpFormatter, brief_help, move_to_group, show_preset_defaults
from dllm_ais.commands.train_args import add_correction_args, add_fast_rollout_args, add_likelihood_args
from dllm_ais.commands.train_checks import device_and_backend_checks, preflight_train
from dllm_ais.commands.train_preset import resume_preset, tracker_list, train_preset

TRAIN_BRIEF = ("preset", "model", "task", "data", "rollout_precision", "cache", "policy_logprob",
               "correction", "steps", "lr", "beta", "sft_steps", "lora_r", "out", "resume", "save_every_minutes",
               "report_to")
"""The flags `dllm-ais train --help` shows (by dest); --help-all shows every flag."""


def default_run_dir(preset_name: str, now: float | None = None, pid: int | None = None) -> str:
    """runs/<preset>-<date>-<time>-<pid>: two runs started in the same second get different directories. Processes of
    one `accelerate launch`/torchrun share the launcher's pid (their parent), so they agree on one directory."""
    import os
    import time

    if pid is None:
        pid = os.getppid() if "LOCAL_RANK" in os.environ else os.getpid()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"runs/{preset_name}-{stamp}-{pid}"


def newest_runs(root: str, n: int = 3) -> str:
    """'; the newest under runs/: a, b, c' (by config.json's time), or '' when there are none."""
    from pathlib import Path

    runs = sorted((p.parent for p in Path(root).glob("*/config.json")), key=lambda p: p.stat().st_mtime, reverse=True)
    return f"; the newest under {root}/: {', '.join(str(p) for p in runs[:n])}" if runs else ""


def cmd_train(args: argparse.Namespace) -> int:
    import math
    import time

    from dllm_ais.train.flags import check_combinations, check_trackers, default_threads, usable_cores

    typed = typed_flags(args)
    preset = train_preset(args)  # flags and config validation first: no heavy import yet
    if args.resume and args.out is None:
        raise ValueError(f"--resume continues a run: add --out RUN, the run's directory{newest_runs('runs')}.")
    out = args.out or default_run_dir(preset.name)
    preflight_train(preset, out, args.resume)
    if args.resume:
        preset = resume_preset(args, typed, out)
    check_combinations(typed, preset)
    check_trackers(preset.train.report_to)  # the run's own list on --resume
    threads = args.threads or default_threads(usable_cores())

    import torch

    from dllm_ais.metrics import REWARD_MEAN, STEP, read_metrics
    from dllm_ais.train.interrupt import RESUME_EXIT_CODE, Preempted
    from dllm_ais.train.job import run_training

    device_and_backend_checks(preset)
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        trainer = run_training(preset, out, resume=args.resume, progress=not args.no_progress, steps=args.steps,
                               save_every=args.save_every, hash_check=not args.no_hash_check,
                               report_to=tracker_list(args.report_to), save_every_minutes=args.save_every_minutes,
                               keep_checkpoints=args.keep_checkpoints)
    except KeyboardInterrupt:
        return 130
    except Preempted:
        return RESUME_EXIT_CODE  # "resume me": the checkpoint is written and verified (train/interrupt.py)
    seconds = time.perf_counter() - t0
    all_rows = read_metrics(out)
    new = [r for r in all_rows if r.get(STEP) >= trainer.first_step]  # a resume redoes steps after its checkpoint
    done_before = trainer.first_step > 0
    rows = [r for r in all_rows if math.isfinite(r.get(REWARD_MEAN, math.nan))]
    q = max(1, len(rows) // 4)
    first = sum(r[REWARD_MEAN] for r in rows[:q]) / q if rows else float("nan")
    last = sum(r[REWARD_MEAN] for r in rows[-q:]) / q if rows else float("nan")
    total = f" ({len(all_rows)} in the run)" if done_before else ""
    print(f"run {out} ({preset.objective}, policy likelihood {preset.train.policy_logprob}): "
          f"{len(new)} step{'s' * (len(new) != 1)} in {seconds:.0f} s{total}; reward/mean first quarter "
          f"{first:.3f} -> last "
          f"quarter {last:.3f}")
    return 0


def add_train_parser(sub) -> argparse.ArgumentParser:
    """The `train` subparser: model, data and reward, rollout, correction, GRPO and run flags (a new flag goes in
    the group it belongs to; the correction and rollout groups are filled in commands/train_args.py)."""
    from dllm_ais.config import TRACKERS
    from dllm_ais.presets import get_preset
    from dllm_ais.train.run_dir import add_hash_check_argument

    tiny = get_preset(DEFAULT_PRESET)
    p = sub.add_parser("train", help="AIS-GRPO training (default: tiny LLaDA on CPU, SFT warm-up, FP8 rollouts)",
                       formatter_class=HelpFormatter, usage="%(prog)s [--preset NAME] [--model DIR] [--out RUN] "
                       "[--resume] [flags]",
                       description=f"GRPO training of a diffusion ({family_titles(diffusion_only=True)}) or "
                                   "autoregressive (Qwen) model with FP8 "
                                   "rollouts and an importance-sampling correction (default AIS). Without flags it "
                                   f"trains the tiny built-in LLaDA on the {tiny.train.task} task on CPU: an SFT "
                                   f"warm-up of {tiny.train.sft_steps} steps, then {tiny.train.steps} GRPO steps; the "
                                   "run directory (--out) gets config.json, metrics.jsonl and checkpoints/step-N, and "
                                   "--resume continues it. Flags left out take the preset's value (shown as "
                                   f"'{DEFAULT_PRESET}: ...'); every flag is checked before anything is written.")
    add_model_args(p.add_argument_group("model"))
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
    add_fast_rollout_args(rollout)
    add_likelihood_args(p.add_argument_group("policy likelihood (--policy-logprob elbo | coupled | spg | mdpo | "
                                             "dtreerpo; docs/likelihoods.md)"))
    add_correction_args(p.add_argument_group("correction (docs/corrections.md)"))
    grpo = p.add_argument_group("GRPO")
    grpo.add_argument("--steps", type=int, default=None, help="GRPO steps (each: rollouts, rewards, updates, sync)")
    grpo.add_argument("--lr", type=float, default=None, help="AdamW learning rate of the GRPO updates")
    grpo.add_argument("--beta", type=float, default=None, help="KL coefficient to the reference (TRL's beta; 0 = no "
                      "reference pass)")
    grpo.add_argument("--sft-steps", type=int, default=None, help="masked-diffusion SFT warm-up steps before GRPO "
                      "(0 = none)")
    grpo.add_argument("--lora-r", type=int, default=None, help="LoRA rank (0 = full fine-tuning)")
    move_to_group(p, grpo, ("loss_type", "dual_clip", "mask_error_completions", "error_ngram", "clip_ratio_c",
                             "epsilon_high", "off_policy_mask_threshold"))
    run = p.add_argument_group("run")
    run.add_argument("--out", default=None, help="run directory (default runs/<preset>-<date>-<time>-<pid>)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its newest intact "
                     "checkpoint (verified against its manifest); only --steps, the checkpoint flags and --report-to "
                     "may change (applied and recorded in config.json)")
    run.add_argument("--save-every", type=int, default=None, help="also checkpoint every N steps, each kept "
                     "(0 = none by step count)")
    run.add_argument("--save-every-minutes", type=float, default=None, metavar="M", help="checkpoint when M minutes "
                     "have passed since the last one, so a killed run loses at most M minutes (0 = off); checkpoints "
                     "are also written at the end and on Ctrl-C, SIGTERM or SIGUSR1 (then the exit status is 75: "
                     "resume me)")
    run.add_argument("--keep-checkpoints", type=int, default=None, metavar="N", help="keep the newest N checkpoints "
                     "(0 = all); those of --save-every are always kept")
    add_hash_check_argument(run)
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
    show_preset_defaults(p, "train")
    brief_help(p, TRAIN_BRIEF)
    return p
