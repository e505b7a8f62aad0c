"""`dllm-ais` command line: train (the main job), sample, eval, plot, variance.

Each subcommand is a thin function over the package; heavy imports happen inside it, so `dllm-ais --help` is fast.
"""

from __future__ import annotations

import argparse
import logging
import sys

from dllm_ais.config import PRESETS, get_preset, override

TINY_PROMPTS = ["12+7=", "3+45=", "Hello, "]


def _quiet_third_party_logs() -> None:
    """transformers imports torchao, whose optional CUDA extensions log load failures on CPU-only machines."""
    for name in ("torchao", "torch.utils._pytree", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny-cpu", help=f"named preset: {', '.join(PRESETS)} (default tiny-cpu)")
    p.add_argument("--model", default=None, help="local LLaDA checkpoint directory (overrides the preset's)")
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: the preset's)")
    p.add_argument("--dtype", default=None, help="parameter dtype: float32, bfloat16, float16 (default: preset's)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling noise and the tiny model's weights")


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gen-length", type=int, default=None, help="completion length in tokens")
    p.add_argument("--block-length", type=int, default=None, help="semi-autoregressive block length")
    p.add_argument("--steps", type=int, default=None, help="total denoising steps")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    p.add_argument("--remasking", default=None, choices=["low_confidence", "random"])
    p.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (0 = off)")


def cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from dllm_ais.models.load import encode_prompts
    from dllm_ais.train_job import family

    preset = get_preset(args.preset)
    model_cfg = override(preset.model, path=args.model, device=args.device, dtype=args.dtype, seed=args.seed)
    block_length = args.block_length
    if block_length is None and args.gen_length and preset.sampler.block_length == preset.sampler.gen_length:
        block_length = args.gen_length  # a one-block preset (tiny-cpu) stays one block at another length
    sampler_cfg = override(preset.sampler, gen_length=args.gen_length, block_length=block_length,
                           steps=args.steps, temperature=args.temperature, remasking=args.remasking,
                           cfg_scale=args.cfg_scale)
    model, tokenizer = family(model_cfg.family).load(model_cfg)
    if args.fp8 and args.fp4:
        raise ValueError("use --fp8 or --fp4, not both")
    if args.fp8:
        from dllm_ais.fp8.linear import quantize_model

        model = quantize_model(model, backend=args.backend)
    elif args.fp4:
        from dllm_ais.fp4.linear import quantize_model as quantize_model_fp4

        model = quantize_model_fp4(model, fmt=args.fp4_format)
    prompts = args.prompt or (TINY_PROMPTS if model_cfg.path is None else ["What is 12 * 7? Think step by step."])
    ids, mask = encode_prompts(tokenizer, prompts, chat=not args.no_chat, device=model_cfg.device)
    generator = torch.Generator(device=model_cfg.device).manual_seed(args.seed)
    backend = family(model_cfg.family).backend(sampler_cfg, model, tokenizer)
    rollout = backend.sample(model, ids, mask, generator, progress=sys.stderr.isatty() or args.progress)
    for prompt, comp, keep in zip(prompts, rollout.completion_ids, rollout.completion_mask, strict=True):
        text = tokenizer.decode(comp[keep], skip_special_tokens=True)
        print(f"### {prompt}\n{text}\n")
    return 0


def _train_preset(args: argparse.Namespace):
    from dataclasses import replace

    preset = get_preset(args.preset)
    train = override(preset.train, task=args.task, data_path=args.data, reward_fn=args.reward_fn, steps=args.steps,
                     rollout_precision=args.rollout_precision, fp8_backend=args.fp8_backend, seed=args.seed,
                     fp4_format=args.fp4_format,
                     learning_rate=args.lr, sft_steps=args.sft_steps, lora_r=args.lora_r,
                     save_every=args.save_every, tensorboard=args.tensorboard or None)
    if args.task and args.task != preset.train.task:
        train = replace(train, task_config={})  # generator options belong to the preset's own task
    return replace(preset, model=override(preset.model, path=args.model, device=args.device, dtype=args.dtype),
                   train=train, correction=override(preset.correction, correction=args.correction))


def cmd_train(args: argparse.Namespace) -> int:
    import math
    import time

    import torch

    from dllm_ais.metrics import REWARD_MEAN, read_metrics
    from dllm_ais.train_job import run_training

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = _train_preset(args)
    out = args.out or f"runs/{preset.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.perf_counter()
    try:
        run_training(preset, out, resume=args.resume, progress=not args.no_progress, steps=args.steps)
    except KeyboardInterrupt:
        return 130
    rows = [r for r in read_metrics(out) if math.isfinite(r.get(REWARD_MEAN, math.nan))]
    q = max(1, len(rows) // 4)
    first = sum(r[REWARD_MEAN] for r in rows[:q]) / q if rows else float("nan")
    last = sum(r[REWARD_MEAN] for r in rows[-q:]) / q if rows else float("nan")
    print(f"run {out}: {len(rows)} steps in {time.perf_counter() - t0:.0f} s; reward/mean first quarter "
          f"{first:.3f} -> last quarter {last:.3f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dllm-ais", description="GRPO for diffusion LMs with FP8 rollouts and AIS.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="AIS-GRPO training (default: tiny LLaDA on CPU, SFT warm-up, FP8 rollouts)")
    _add_model_args(p)
    p.add_argument("--out", default=None, help="run directory (default runs/<preset>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--task", default=None, help="task: digits, arith, gsm8k, math500, countdown, sudoku")
    p.add_argument("--data", default=None, help="local jsonl/parquet training file for the task")
    p.add_argument("--reward-fn", default=None, help="TRL-style reward function 'package.module:function'")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps")
    p.add_argument("--lr", type=float, default=None, help="learning rate")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT warm-up steps (tiny default: 300)")
    p.add_argument("--rollout-precision", default=None, choices=["bf16", "fp8", "fp4"])
    p.add_argument("--fp8-backend", default=None, help="torch (CPU), triton, scaled_mm, torchao")
    p.add_argument("--fp4-format", default=None, choices=["nvfp4", "mxfp4"], help="FP4 format of --rollout-precision "
                   "fp4 (emulated: no speedup without Blackwell FP4 tensor cores)")
    p.add_argument("--correction", default=None, choices=["none", "is", "tis", "mis", "ais"])
    p.add_argument("--lora-r", type=int, default=None, help="LoRA rank (0 = full fine-tuning)")
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps")
    p.add_argument("--tensorboard", action="store_true", help="also log to <out>/tb")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train, seed=None)

    p = sub.add_parser("sample", help="generate completions with the masked-diffusion sampler")
    _add_model_args(p)
    _add_sampler_args(p)
    p.add_argument("--prompt", action="append", help="a prompt (repeatable); default: a few built-in prompts")
    p.add_argument("--no-chat", action="store_true", help="do not wrap prompts in the tokenizer's chat template")
    p.add_argument("--fp8", action="store_true", help="sample with the FP8 rollout copy (blockwise e4m3 linears)")
    p.add_argument("--backend", default="torch", help="FP8 GEMM backend: torch (reference, CPU), triton, scaled_mm, "
                   "torchao")
    p.add_argument("--fp4", action="store_true", help="sample with the emulated FP4 rollout copy (W4A4)")
    p.add_argument("--fp4-format", default="nvfp4", choices=["nvfp4", "mxfp4"], help="FP4 format for --fp4")
    p.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a terminal")
    p.set_defaults(func=cmd_sample)
    from dllm_ais.evaluate import add_eval_arguments, cmd_eval
    from dllm_ais.plot import add_plot_arguments, cmd_plot

    p = sub.add_parser("eval", help="accuracy of a model, run or checkpoint on a task (d1 evaluation settings)")
    add_eval_arguments(p)
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("plot", help="PNG curves (reward, lambda, ESS, divergence, mismatch KL) of one or more runs")
    add_plot_arguments(p)
    p.set_defaults(func=cmd_plot)
    # listed for --help only: main() hands `variance ...` to dllm_ais/variance_cli.py's own parser
    sub.add_parser("variance", help="std of the FP8/BF16 log-ratio vs forward passes per ELBO estimator "
                   "(dllm-ais variance --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["variance"]:  # its own parser (dllm_ais/variance_cli.py) takes every remaining argument
        _quiet_third_party_logs()
        from dllm_ais.variance_cli import main as variance_main

        return variance_main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    _quiet_third_party_logs()
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError, RuntimeError, ImportError, TypeError) as e:
        print(f"dllm-ais {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
