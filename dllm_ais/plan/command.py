"""`dllm-ais plan`: its flags (those of `train` that change memory or time, and the plan's own) and the command.

The flags take the preset's value when left out, as `train`'s do; the typed ones go through train/flags.py's
`check_combinations`, so a flag `train` would refuse (e.g. --cache on a Qwen preset) is refused here too.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from dllm_ais.config import override
from dllm_ais.presets import PRESETS, get_preset

from .rates import GPUS


def add_plan_arguments(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the plan's flags to `p`; returns the rollout group (cli.py adds train's Fast-dLLM flags to it)."""
    run = p.add_argument_group("plan")
    run.add_argument("--preset", default=None, help=f"named preset: {', '.join(PRESETS)} (default tiny-cpu)")
    run.add_argument("--gpu", default="h100", choices=list(GPUS), help="GPU kind: its memory, datasheet figures and "
                     "any measured rows under benchmarks/gpu/")
    run.add_argument("--gpus", type=int, default=1, help="processes, one GPU each (accelerate); with full "
                     "fine-tuning on several GPUs the plan shards with FSDP2")
    run.add_argument("--fsdp", action="store_true", help="FSDP2 even with LoRA (default: only full fine-tuning on "
                     "several GPUs)")
    run.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default: measured for the tiny "
                     "model's task; 256 assumed for a hub model, nothing is downloaded)")
    run.add_argument("--json", action="store_true", help="print the plan as JSON")
    model = p.add_argument_group("model (as train)")
    model.add_argument("--model", default=None, help="a local checkpoint directory of the preset's family (LLaDA, "
                       "Dream): its config.json's shape")
    model.add_argument("--dtype", default=None, help="parameter dtype: float32, bfloat16, float16")
    model.add_argument("--lora-r", type=int, default=None, help="LoRA rank (0 = full fine-tuning)")
    rollout = p.add_argument_group("rollout (as train)")
    rollout.add_argument("--rollout-precision", default=None, choices=["bf16", "fp8", "fp4"],
                         help="precision of the rollout policy μ")
    rollout.add_argument("--gen-length", type=int, default=None, help="completion length in tokens")
    rollout.add_argument("--block-length", type=int, default=None, help="semi-autoregressive block length")
    rollout.add_argument("--sampler-steps", type=int, default=None, help="denoising steps per rollout (train reads "
                         "them from the preset)")
    batch = p.add_argument_group("batch and update")
    batch.add_argument("--prompts-per-step", type=int, default=None, help="prompts per step and process")
    batch.add_argument("--num-generations", type=int, default=None, help="G: generations per prompt")
    batch.add_argument("--num-iterations", type=int, default=None, help="updates per step (π_old and the "
                       "reference run once per update)")
    batch.add_argument("--micro-batches", type=int, default=None, help="micro-batches per update "
                       "(TrainConfig.gradient_accumulation_steps; no train flag yet)")
    batch.add_argument("--gradient-checkpointing", action="store_true", help="recompute each block in backward "
                       "(models/llada/model.py supports it; train does not switch it on yet)")
    batch.add_argument("--steps", type=int, default=None, help="RL steps of the run (for its total time)")
    batch.add_argument("--beta", type=float, default=None, help="KL coefficient (> 0: a reference pass per update; "
                       "--policy-logprob spg needs 0)")
    batch.add_argument("--elbo-draws", type=int, default=None, metavar="K", help="--policy-logprob elbo / spg: mask "
                       "draws per sequence (K forward rows per sequence and evaluation)")
    return rollout


def _typed(args: argparse.Namespace) -> dict[str, object]:
    """{"--lora-r": 64, ...}: the flags typed (not left at None / False)."""
    parser = getattr(args, "_parser", None)
    actions = parser._actions if parser is not None else []
    return {a.option_strings[-1]: getattr(args, a.dest) for a in actions if a.option_strings
            and a.dest != "help" and getattr(args, a.dest, None) not in (None, False)}


def plan_preset(args: argparse.Namespace):
    """The preset with the typed flags applied (validated by the configs' own checks)."""
    preset = get_preset(args.preset or "tiny-cpu")
    model = override(preset.model, path=args.model, dtype=args.dtype)
    sampler = override(preset.sampler, gen_length=args.gen_length, block_length=args.block_length,
                       steps=args.sampler_steps, cache=args.cache, threshold=args.threshold)
    train = override(preset.train, lora_r=args.lora_r, rollout_precision=args.rollout_precision,
                     prompts_per_step=args.prompts_per_step, gradient_accumulation_steps=args.micro_batches,
                     steps=args.steps, mismatch_estimator=args.mismatch_estimator,
                     trajectory_steps=args.trajectory_steps, policy_logprob=args.policy_logprob,
                     trajectory_merge=args.trajectory_merge,
                     likelihood=override(preset.train.likelihood, elbo_draws=args.elbo_draws))
    grpo = override(preset.grpo, num_generations=args.num_generations, num_iterations=args.num_iterations,
                    beta=args.beta)
    if args.gen_length is not None:
        grpo = replace(grpo, max_completion_length=args.gen_length)
    return replace(preset, model=model, sampler=sampler, train=train, grpo=grpo)


def cmd_plan(args: argparse.Namespace) -> int:
    from dllm_ais.train.flags import check_combinations

    from .predict import make_plan
    from .report import format_plan, plan_dict

    preset = plan_preset(args)
    check_combinations(_typed(args), preset)
    if args.micro_batches is not None and args.micro_batches < 1:
        raise ValueError(f"--micro-batches {args.micro_batches}: must be >= 1.")
    plan = make_plan(preset, args.gpu, args.gpus, prompt_len=args.prompt_len, fsdp=args.fsdp or None,
                     gradient_checkpointing=args.gradient_checkpointing)
    print(json.dumps(plan_dict(plan, preset), indent=2) if args.json else format_plan(plan, preset))
    return 0
