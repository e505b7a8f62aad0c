"""`dllm-ais` command line: train (the main job), sample, eval, plot, plan, variance.

Each subcommand is a thin function over the package; heavy imports happen inside it, so `dllm-ais --help` is fast.
The train command lives in dllm_ais/commands/ (its flags, checks, preset and run), sample in dllm_ais/sample.py,
eval and plot in dllm_ais/analysis/, plan in dllm_ais/plan/command.py; this module builds the parser and runs one.
"""

from __future__ import annotations

import argparse
import logging
import sys

import dllm_ais
from dllm_ais.commands.common_args import add_model_args, add_sampler_args
from dllm_ais.commands.field_flags import FIELD_FLAGS, name_flags
from dllm_ais.commands.help import HelpFormatter, ShortErrorParser, brief_help, show_preset_defaults
from dllm_ais.commands.train import add_train_parser, cmd_train, default_run_dir
from dllm_ais.commands.train_args import add_fast_rollout_args
from dllm_ais.commands.train_preset import train_preset

__all__ = ["FIELD_FLAGS", "build_parser", "cmd_train", "default_run_dir", "main", "name_flags", "train_preset"]
_train_preset = train_preset  # the name earlier tests and scripts import


def _quiet_third_party_logs() -> None:
    """transformers imports torchao, whose optional CUDA extensions log load failures on CPU-only machines."""
    for name in ("torchao", "torch.utils._pytree", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = ShortErrorParser(prog="dllm-ais", description="GRPO for diffusion LMs with FP8 rollouts and AIS.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {dllm_ais.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)

    p = sub.add_parser("sample", help="generate completions with the masked-diffusion sampler",
                       description="Generate completions. Without --model or --run it samples the untrained tiny "
                                   "built-in model (random weights: gibberish); --run RUN_DIR samples a training "
                                   "run's latest checkpoint, --model takes a checkpoint directory, a run's "
                                   "checkpoints/step-N, or a hub id.", formatter_class=HelpFormatter)
    model = p.add_argument_group("model")
    add_model_args(model)
    model.add_argument("--run", default=None, help="training run directory: sample its latest checkpoint")
    from dllm_ais.train.run_dir import add_hash_check_argument

    add_hash_check_argument(model)
    add_sampler_args(p.add_argument_group("sampler"))
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
    show_preset_defaults(p, "sample")
    brief_help(p, ("preset", "model", "run", "device", "seed", "gen_length", "block_length", "steps", "temperature",
                   "cache", "threshold", "prompt", "fp8"))
    from dllm_ais.analysis.evaluate import add_eval_arguments, cmd_eval
    from dllm_ais.analysis.plot import add_plot_arguments, cmd_plot

    p = sub.add_parser("eval", help="accuracy of a model, run or checkpoint on a task (d1 evaluation settings)",
                       formatter_class=HelpFormatter,
                       description="Score a model on a task's held-out split: --run RUN_DIR (its latest "
                       "checkpoint, sampled as the run's eval sampler), --model DIR or a hub id, or the tiny built-in "
                       "model. Greedy decoding at each --gen-length; strict answers by default, or d1's protocol and "
                       "prompts (--protocol d1). Prints accuracy per length and writes each generation with its score "
                       "(--out; docs/commands.md).")
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
    add_fast_rollout_args(add_plan_arguments(p))
    p.set_defaults(func=cmd_plan, _parser=p)
    show_preset_defaults(p, "train")
    brief_help(p, ("preset", "gpu", "gpus", "fsdp", "prompt_len", "json", "model", "lora_r", "rollout_precision",
                   "gen_length", "prompts_per_step", "num_generations", "steps", "cache", "policy_logprob"))
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
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand whose flags they are not (its --help lists them)
        parser._subparsers._group_actions[0].choices[args.command].error(
            f"unrecognized arguments: {' '.join(extra)}")
    _quiet_third_party_logs()
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError, RuntimeError, ImportError, TypeError) as e:
        print(f"dllm-ais {args.command}: error: {name_flags(str(e), args.command)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
