"""Benchmark masked-diffusion rollouts (samplers/diffusion.py): tokens/s and peak memory, BF16 vs FP8 linears.

  python scripts/bench_rollout.py            # GPU: LLaDA-8B shape, random bf16 weights, batch 8/32 × gen 128/256
  python scripts/bench_rollout.py --smoke    # CPU, tiny shape, seconds (FP8 via the torch reference backend)

The model is our LLaDAModelLM with LLaDA-8B's shape (d_model 4096, 32 layers, 32 heads, SwiGLU 12288, vocab 126464)
and random weights (no download): built on the meta device, materialised on the GPU in bf16, every weight drawn from
an explicit generator. The rollout is `diffusion_sample` exactly as the trainer calls it: random prompts of
--prompt-len tokens (never the mask id; an all-ones prompt mask, so attention runs with a padding mask as in training),
gen_length ∈ --gen-length, blocks of --block-length, steps = gen_length / 2 (two tokens committed per forward),
low-confidence remasking at --temperature. Per (precision, backend, batch, gen_length):
  total_s          wall time of one diffusion_sample call (cuda-synchronised before and after), median of --repeats;
                   a warm-up call with the same shapes (one step per block) runs first and is not timed
  tokens_per_s     batch · gen_length / total_s;  step_ms  total_s / steps (one full forward + sampling per step)
  peak_mem_gib     torch.cuda.max_memory_allocated during the timed calls, with only the measured model on the GPU
                   (the BF16 master waits on the CPU while its FP8 copy is measured); model_gib  allocated before them
  speedup_vs_bf16, peak_mem_ratio_vs_bf16   (FP8 rows) against the BF16 row of the same shape from the same run
FP8 = `quantize_model(master, backend=...)` for each --backends entry (quantize_s: its wall time). A backend that cannot
run here is written as status "skipped" with the reason, a measurement that fails (e.g. out of memory) as "failed"
with the error. Without CUDA and without --smoke every measurement is written as skipped: nothing is estimated.
The "torch" backend is the dequantising fp32 reference (correctness, not speed): on LLaDA-8B shapes it is far slower
than BF16; drop it with --backends for a quick run, or split a long run with --batch / --gen-length.
One JSON line per measurement is appended to --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from dllm_ais import bench_env
from dllm_ais.config import SamplerConfig
from dllm_ais.models.llada import LLaDAConfig, LLaDAModelLM, RMSNorm
from dllm_ais.samplers.diffusion import diffusion_sample

REPO = Path(__file__).resolve().parent.parent
SHAPES = {  # LLaDA-8B (DESIGN.md §6) and a tiny stand-in for --smoke (ids as models/tiny.py: mask 4, EOS 1)
    "full": dict(d_model=4096, n_layers=32, n_heads=32, mlp_hidden_size=12288, vocab_size=126464,
                 embedding_size=126464, max_sequence_length=4096, rope_theta=500000.0),
    "smoke": dict(d_model=128, n_layers=2, n_heads=4, mlp_hidden_size=256, vocab_size=128, embedding_size=128,
                  max_sequence_length=256, rope_theta=10000.0, mask_token_id=4, eos_token_id=1, pad_token_id=1,
                  bos_token_id=2, eot_token_id=3),
}
DEFAULTS = {  # batch sizes, gen lengths, block length, prompt length, FP8 backends, timed repeats
    "full": dict(batch=[8, 32], gen_length=[128, 256], block_length=32, prompt_len=64,
                 backends=["triton", "scaled_mm", "torchao", "torch"], repeats=1),
    # triton on CPU needs the (slow) interpreter, so the smoke run leaves it out unless asked for with --backends
    "smoke": dict(batch=[2], gen_length=[16], block_length=8, prompt_len=8, backends=["torch", "scaled_mm", "torchao"],
                  repeats=1),
}


@torch.no_grad()
def random_llada(config: LLaDAConfig, seed: int, device: torch.device, dtype: torch.dtype = torch.bfloat16,
                 std: float = 0.02) -> LLaDAModelLM:
    """LLaDAModelLM built on meta, materialised on `device` in `dtype`; Linear/Embedding weights ~ N(0, std²) drawn on
    the device from `torch.Generator(device).manual_seed(seed)`, RMSNorm weights 1. In eval mode."""
    with torch.device("meta"):
        model = LLaDAModelLM(config).to(dtype)  # free on meta: the device never holds an fp32 copy
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, std, generator=generator)
        elif isinstance(module, RMSNorm):
            module.weight.fill_(1.0)
    return model.eval()


def random_prompts(batch: int, prompt_len: int, vocab: int, mask_token_id: int, generator: torch.Generator,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt ids [B, P] uniform over the vocabulary without the mask id, and an all-True prompt mask [B, P]."""
    ids = torch.randint(0, vocab - 1, (batch, prompt_len), generator=generator, device=device)
    ids = ids + (ids >= mask_token_id).long()  # skip the mask id
    return ids, torch.ones(batch, prompt_len, dtype=torch.bool, device=device)


def _timed_rollout(model, ids, mask, cfg: SamplerConfig, generator: torch.Generator) -> float:
    device = ids.device
    config = model.config
    bench_env.sync(device)
    t0 = time.perf_counter()
    out = diffusion_sample(model, ids, mask, cfg, config.mask_token_id, (config.eos_token_id,), generator)
    bench_env.sync(device)
    seconds = time.perf_counter() - t0
    if out.num_steps != cfg.steps or (out.commit_step < 0).any():  # (a random model may sample the mask id itself)
        raise RuntimeError(f"rollout incomplete: {out.num_steps} of {cfg.steps} steps, or positions never committed")
    return seconds


def measure(model, batch: int, gen_length: int, args, device: torch.device) -> dict:
    """Timings and memory of diffusion_sample for one (batch, gen_length) (see the module docstring)."""
    config = model.config
    cfg = SamplerConfig(gen_length=gen_length, block_length=args.block_length, steps=gen_length // 2,
                        temperature=args.temperature)
    warmup = replace(cfg, steps=cfg.num_blocks)  # same shapes as the timed call, one forward per block
    g = torch.Generator(device=device).manual_seed(1000 * batch + gen_length)
    ids, mask = random_prompts(batch, args.prompt_len, config.embedding_size, config.mask_token_id, g, device)
    _timed_rollout(model, ids, mask, warmup, g)
    with bench_env.cuda_memory(device) as memory:
        total = statistics.median(_timed_rollout(model, ids, mask, cfg, g) for _ in range(args.repeats))
    return {"total_s": total, "tokens_per_s": batch * gen_length / total, "step_ms": total / cfg.steps * 1e3, **memory}


def run(args, device: torch.device, size: str, emit) -> None:
    """BF16 rows for every shape first, then each FP8 backend's rows with ratios against them."""
    shape = SHAPES[size]
    grid = [(batch, gen_length) for gen_length in args.gen_length for batch in args.batch]

    def record(precision: str, backend: str | None, batch: int, gen_length: int) -> dict:
        return dict(shape=shape, batch=batch, prompt_len=args.prompt_len, gen_length=gen_length,
                    block_length=args.block_length, steps=gen_length // 2, temperature=args.temperature,
                    precision=precision, backend=backend)

    if device.type != "cuda" and not args.smoke:
        for precision, backend in [("bf16", None)] + [("fp8", b) for b in args.backends]:
            for batch, gen_length in grid:
                emit(**record(precision, backend, batch, gen_length), status="skipped", reason=bench_env.NO_CUDA_REASON)
        return
    bf16: dict[tuple[int, int], dict] = {}

    def measure_all(precision: str, backend: str | None, model, info: dict) -> None:
        for batch, gen_length in grid:
            rec = record(precision, backend, batch, gen_length)
            if model is None:
                emit(**rec, **info)  # skipped or failed, with the reason
                continue
            try:
                row = measure(model, batch, gen_length, args, device)
            except Exception as e:  # e.g. out of memory at batch 32: record it and go on
                emit(**rec, status="failed", reason=bench_env.error_reason(e))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            if backend is None:
                bf16[batch, gen_length] = row
            elif (batch, gen_length) in bf16:
                ref = bf16[batch, gen_length]
                row["speedup_vs_bf16"] = row["tokens_per_s"] / ref["tokens_per_s"]
                if "peak_mem_gib" in row:
                    row["peak_mem_ratio_vs_bf16"] = row["peak_mem_gib"] / ref["peak_mem_gib"]
            emit(**rec, **info, **row, status="ok")  # info: quantize_s for FP8

    master = random_llada(LLaDAConfig(**shape), seed=0, device=device)
    bench_env.for_each_precision(master, args.backends, device, measure_all)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape on CPU, a few seconds")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "rollout.jsonl"), help="JSONL file to append to")
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 8 32; smoke 2)")
    parser.add_argument("--gen-length", type=int, nargs="+", help="completion lengths (default 128 256; smoke 16)")
    parser.add_argument("--block-length", type=int, help="semi-autoregressive block (default 32; smoke 8)")
    parser.add_argument("--prompt-len", type=int, help="prompt tokens (default 64; smoke 8)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    parser.add_argument("--backends", nargs="+",
                        help="FP8 backends (default triton scaled_mm torchao torch; smoke torch scaled_mm torchao)")
    parser.add_argument("--repeats", type=int, help="timed calls per measurement, median (default 1)")
    args = parser.parse_args(argv)
    size = "smoke" if args.smoke else "full"
    for key, value in DEFAULTS[size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for gen_length in args.gen_length:  # fail before any model is built
        SamplerConfig(gen_length=gen_length, block_length=args.block_length, steps=gen_length // 2)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    env = bench_env.environment(device, args.smoke, REPO, bench="rollout", libraries=("torch", "triton"))
    with bench_env.jsonl_writer(args.out, env) as emit, torch.no_grad():
        run(args, device, size, emit)


if __name__ == "__main__":
    main()
