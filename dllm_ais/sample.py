"""`dllm-ais sample`: generate completions from a run, a checkpoint, a hub model or the untrained tiny built-in model,
with the BF16 fused copy (LLaDA), the FP8 copy or the emulated FP4 copy. The flags are built in cli.py."""

from __future__ import annotations

import argparse
import sys

from dllm_ais.config import override
from dllm_ais.presets import get_preset

TINY_PROMPTS = ["12+7=", "3+45=", "Hello, "]


def cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from dllm_ais.train.flags import check_device

    check_device(args.device)

    from dllm_ais.families import foreign_sampler_setting, get_family
    from dllm_ais.models.load import encode_prompts

    from_run = args.run is not None or (args.model is not None and is_checkpoint_dir(args.model))
    preset = get_preset(args.preset or "tiny-cpu") if not from_run else None
    if args.run is not None and args.model is not None:
        raise ValueError("pass either --model DIR or --run RUN_DIR, not both.")
    if from_run:  # a run's latest checkpoint, or one checkpoints/step-N directory: the run's preset and model
        from dllm_ais.analysis.evaluate import load_for_eval

        if args.preset is not None:
            raise ValueError("--preset cannot be combined with --run or a checkpoint directory: the run's config.json "
                             "names its preset.")
        loaded = load_for_eval(args.model, args.run, None, device=args.device, dtype=args.dtype,
                               hash_check=not args.no_hash_check)
        preset, model, tokenizer = loaded.preset, loaded.model, loaded.tokenizer
        model_cfg = preset.model
        print(f"model: {loaded.source}", file=sys.stderr)
    else:
        model_cfg = override(preset.model, path=args.model, device=args.device, dtype=args.dtype, seed=args.seed)
        model, tokenizer = get_family(model_cfg.family).load(model_cfg)
        if model_cfg.path is None:
            print(f"note: no --model or --run: sampling the UNTRAINED tiny built-in model (random weights, seed "
                  f"{model_cfg.seed}), so the text is gibberish. Pass --run RUN_DIR (its latest checkpoint), --model "
                  "RUN_DIR/checkpoints/step-N, or --model CHECKPOINT_DIR.", file=sys.stderr)
    if from_run:  # a trained model samples as `dllm-ais eval` scores it (tiny: the rollout settings at T = 0)
        from dllm_ais.analysis.evaluate import eval_sampler

        base, source = eval_sampler(preset), "the run's eval sampler"
    else:
        base, source = preset.sampler, f"preset {preset.name}'s rollout sampler"
    block_length = args.block_length
    if block_length is None and args.gen_length and base.block_length == base.gen_length:
        block_length = args.gen_length  # a one-block preset (tiny-cpu) stays one block at another length
    sampler_cfg = override(base, gen_length=args.gen_length, block_length=block_length,
                           steps=args.steps, temperature=args.temperature, remasking=args.remasking,
                           cfg_scale=args.cfg_scale, cache=args.cache, threshold=args.threshold,
                           cuda_graphs=args.cuda_graphs, dream_alg=args.dream_alg, dream_alg_temp=args.dream_alg_temp,
                           sdar_strategy=args.sdar_strategy, sdar_threshold=args.sdar_threshold)
    family = get_family(model_cfg.family)
    if why := foreign_sampler_setting(family, sampler_cfg):
        raise ValueError(why)
    if not family.diffusion and (sampler_cfg.cache != "none" or sampler_cfg.threshold is not None):
        raise ValueError("--cache/--threshold apply to diffusion (LLaDA, Dream) sampling only; drop them for this "
                         "model.")
    if args.fp8 and args.fp4:
        raise ValueError("use --fp8 or --fp4, not both")
    if args.fp8:
        from dllm_ais.fp8.quantize import quantize_model

        model = quantize_model(model, backend=args.backend)
    elif args.fp4:
        from dllm_ais.fp4.linear import quantize_model as quantize_model_fp4

        model = quantize_model_fp4(model, fmt=args.fp4_format)
    elif family.bf16_sampling_copy is not None:  # e.g. LLaDA's fused BF16 copy: same numbers, fewer kernels
        model = family.bf16_sampling_copy(model)
    print(f"sampler: {sampler_settings(sampler_cfg, family.diffusion)} ({source}; the sampling flags change it)",
          file=sys.stderr)
    prompts = args.prompt or _default_prompts(preset, model_cfg)
    ids, mask = encode_prompts(tokenizer, prompts, chat=not args.no_chat, device=model_cfg.device)
    generator = torch.Generator(device=model_cfg.device).manual_seed(args.seed)
    backend = family.backend(sampler_cfg, model, tokenizer)
    if getattr(backend, "note", None):  # e.g. Dream: what its generation_config.json sets and what runs
        print(backend.note, file=sys.stderr)
    rollout = backend.sample(model, ids, mask, generator, progress=sys.stderr.isatty() or args.progress)
    for prompt, comp, keep in zip(prompts, rollout.completion_ids, rollout.completion_mask, strict=True):
        text = tokenizer.decode(comp[keep], skip_special_tokens=True)
        print(f"### {prompt}\n{text}\n")
    return 0


def sampler_settings(s, diffusion: bool = True) -> str:
    """The settings a SamplerConfig samples with, in one line (an autoregressive family: temperature and length)."""
    if not diffusion:
        return f"temperature {s.temperature:g}, up to {s.gen_length} tokens"
    fast = f", cache {s.cache}" * (s.cache != "none") + f", threshold {s.threshold}" * (s.threshold is not None)
    named = s.dream_alg or s.sdar_strategy  # a family's named rule (Dream's alg, SDAR's strategy) runs, not remasking
    rule = f"rule {named}" if named else f"{s.remasking} remasking"
    return (f"temperature {s.temperature:g}, {s.gen_length} tokens in blocks of {s.block_length}, {s.steps} steps, "
            f"{rule}{fast}")


def _default_prompts(preset, model_cfg) -> list[str]:
    """Prompts when none are given: for a tiny built-in model the first test-split prompts of its preset's task (what
    it was trained on: `digits` for tiny-cpu), else a generic question."""
    if model_cfg.path is not None:
        return ["What is 12 * 7? Think step by step."]
    from dllm_ais.analysis.evaluate import _load_rows
    from dllm_ais.tasks.registry import get_task

    try:
        rows = _load_rows(get_task(preset.train.task), "test", preset.train.data_path, 3, 0, preset.train.task_config)
    except (OSError, ValueError, KeyError, ImportError):  # a hub task offline, a missing file: generic prompts
        return TINY_PROMPTS
    return [row["prompt"] for row in rows]


def is_checkpoint_dir(path: str) -> bool:
    """A trainer checkpoint (<run>/checkpoints/step-N: model/ or adapter/ beside trainer_state.pt)."""
    from pathlib import Path

    p = Path(path)
    return (p / "trainer_state.pt").is_file() and ((p / "model").is_dir() or (p / "adapter").is_dir())
