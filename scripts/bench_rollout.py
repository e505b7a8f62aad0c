"""Benchmark masked-diffusion rollouts (samplers/diffusion.py): tokens/s and peak memory, BF16 against FP8.

  python scripts/bench_rollout.py --json out.json   # GPU: LLaDA-8B shape, random bf16 weights, batch 8/32 × gen 128/256
  python scripts/bench_rollout.py --smoke           # CPU, tiny shape, seconds (FP8 via the torch reference backend)

The model is our LLaDAModelLM with LLaDA-8B's shape (d_model 4096, 32 layers, 32 heads, SwiGLU 12288, vocab 126464)
and random weights (no download): built on the meta device, materialised on the GPU in bf16, every weight drawn from
an explicit generator. The rollout is `diffusion_sample` exactly as the trainer calls it: random prompts of
--prompt-len tokens (never the mask id; an all-ones prompt mask, so attention runs with a padding mask as in training),
gen_length ∈ --gen-length, blocks of --block-length, steps = gen_length / 2 (two tokens committed per forward),
low-confidence remasking at --temperature.

Rows, one per (variant, batch, gen_length), all from one run:
  bf16 master  eager      BF16-eager: the master LLaDAModelLM itself (what the trainer's bf16 rollouts sample from)
  bf16 master  compiled   the master through the sampler's compiled step (SamplerConfig.compile: torch.compile
                          mode="reduce-overhead", CUDA graphs)
  bf16 fused   eager / compiled   the fused BF16 rollout copy (models/llada/fused_fp8.py, backend None)
  fp8 <backend> eager / compiled  the fused FP8 rollout copy, quantize_model(master, backend), per --backends
BF16-best = the fastest BF16 row of a shape (master compiled, fused eager or compiled, or the eager master itself).
Per row: total_s (wall time of one diffusion_sample call, cuda-synchronised, median of --repeats, after a warm-up call
with the same shapes — one step per block — whose time is warmup_s and includes compilation), tokens_per_s,
step_ms, build_s (quantize_model / fused copy), peak_mem_gib and model_gib (CUDA: only the measured model resident; the
master waits on the CPU while a copy is measured), and speedup_vs_bf16_eager, speedup_vs_bf16_best,
peak_mem_ratio_vs_bf16_eager against the BF16 rows of the same shape. Compiled rows need CUDA (the sampler ignores the
option on CPU: skipped there); a backend that cannot run here is "skipped" with the reason, a measurement that fails
(e.g. out of memory) "failed" with the error. Without CUDA and without --smoke every row is skipped: nothing is
estimated.
--no-compile / --compiled-only keep one kind of row (scripts/gpu_check.py runs them as two stages); --budget-s S
starts no new variant after S seconds (its rows are written "skipped" with that reason), so a stage fits a time
limit; --profile PATH writes a torch.profiler table (CUDA time per op) of ONE forward of the first FP8 variant that
measured ok, at the largest shape. FP8 copies are built with expected_m = batch × canvas of the largest shape
(`auto` is timed then, never inside the compiled sampler).
--out appends one JSON line per row; --json writes one object {device, torch, triton, git_sha, rows,
rollout_fp8_vs_bf16_best, rollout_fp8_vs_bf16_eager, rollout_fp8_peak_mem_ratio} (floats or null), where fp8 = the
fastest FP8 row and the shape is the largest measured (batch 32, gen 256 by default); the memory ratio is that FP8
row's peak over BF16-eager's.
The "torch" backend is the dequantising fp32 reference (correctness, not speed): it is not in the GPU default.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from dllm_ais.analysis import bench_env
from dllm_ais.atomic import atomic_write_text
from dllm_ais.config import SamplerConfig
from dllm_ais.fp8 import BACKENDS
from dllm_ais.models.llada.model import LLaDAConfig, LLaDAModelLM, RMSNorm
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
                 backends=[name for name in BACKENDS if name != "torch"], repeats=1),
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


def measure(model, batch: int, gen_length: int, compiled: bool, args, device: torch.device) -> dict:
    """Timings and memory of diffusion_sample for one (batch, gen_length) (see the module docstring)."""
    config = model.config
    cfg = SamplerConfig(gen_length=gen_length, block_length=args.block_length, steps=gen_length // 2,
                        temperature=args.temperature, compile=compiled, cache=args.cache)
    # same shapes as the timed call: one forward per block (with a cache: the refresh and one cached step per block)
    warmup = replace(cfg, steps=cfg.num_blocks * (1 if args.cache == "none" else 2))
    g = torch.Generator(device=device).manual_seed(1000 * batch + gen_length)
    ids, mask = random_prompts(batch, args.prompt_len, config.embedding_size, config.mask_token_id, g, device)
    with bench_env.cuda_memory(device) as memory:  # peak over warm-up and timed calls (CUDA-graph pools included)
        warmup_s = _timed_rollout(model, ids, mask, warmup, g)
        total = statistics.median(_timed_rollout(model, ids, mask, cfg, g) for _ in range(args.repeats))
    return {"total_s": total, "tokens_per_s": batch * gen_length / total, "step_ms": total / cfg.steps * 1e3,
            "warmup_s": warmup_s, "cache": args.cache, **memory}


class Variant(NamedTuple):
    """One model configuration measured at every shape (a NamedTuple: this script is also loaded without a module
    entry in sys.modules, where dataclasses cannot resolve postponed annotations)."""

    precision: str
    """bf16 or fp8."""
    backend: str | None
    """FP8 backend (None for BF16)."""
    model: str
    """master (the LLaDAModelLM itself) or fused (the rollout copy, models/llada/fused_fp8.py)."""
    compiled: bool
    """SamplerConfig.compile (CUDA only)."""

    def build(self, master: nn.Module, expected_m: int | None = None) -> nn.Module:
        if self.model == "master":
            return master
        if self.precision == "bf16":
            from dllm_ais.models.llada.fused_fp8 import build_fused_llada

            return build_fused_llada(master, None)
        from dllm_ais.fp8 import quantize_model

        return quantize_model(master, backend=self.backend, expected_m=expected_m)


def variants(backends: list[str], compile_too: bool, eager_too: bool = True) -> list[Variant]:
    """BF16 master eager first (the reference), then BF16 master compiled, BF16 fused, each FP8 backend (fused)."""
    kinds = [("bf16", None, "master"), ("bf16", None, "fused")] + [("fp8", b, "fused") for b in backends]
    modes = [c for c, keep in ((False, eager_too), (True, compile_too)) if keep]
    return [Variant(p, b, m, c) for p, b, m in kinds for c in modes]


@torch.no_grad()
def profile_table(model, batch: int, seq: int, device: torch.device, rows: int = 30) -> str:
    """torch.profiler table (ops sorted by device time) of ONE forward of `model` on random ids [batch, seq]."""
    from torch.profiler import ProfilerActivity, profile

    config = model.config
    g = torch.Generator(device=device).manual_seed(7)
    ids = torch.randint(0, config.mask_token_id, (batch, seq), generator=g, device=device)
    mask = torch.ones(batch, seq, dtype=torch.bool, device=device)
    model(ids, attention_mask=mask)  # warm-up (autotuning outside the profile)
    bench_env.sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        model(ids, attention_mask=mask)
        bench_env.sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def _skip_reason(v: Variant, device: torch.device, smoke: bool) -> str | None:
    if device.type != "cuda" and not smoke:
        return bench_env.NO_CUDA_REASON
    if v.backend is not None:
        reason = bench_env.backend_reason(v.backend, device)
        if reason is not None:
            return reason
    if v.compiled and device.type != "cuda":
        return "compiled rollouts need CUDA (SamplerConfig.compile is ignored on CPU)"
    return None


def _ratios(rows: list[dict]) -> None:
    """Add speedup_vs_bf16_eager / _best and peak_mem_ratio_vs_bf16_eager to every ok row, per shape."""
    for shape_key in {(r["batch"], r["gen_length"]) for r in rows}:
        same = [r for r in rows if (r["batch"], r["gen_length"]) == shape_key and r["status"] == "ok"]
        eager = [r for r in same if r["precision"] == "bf16" and r["model"] == "master" and not r["compiled"]]
        bf16 = [r for r in same if r["precision"] == "bf16"]
        best = max(bf16, key=lambda r: r["tokens_per_s"], default=None)
        for r in same:
            if eager:
                r["speedup_vs_bf16_eager"] = r["tokens_per_s"] / eager[0]["tokens_per_s"]
                if "peak_mem_gib" in r and "peak_mem_gib" in eager[0]:
                    r["peak_mem_ratio_vs_bf16_eager"] = r["peak_mem_gib"] / eager[0]["peak_mem_gib"]
            if best is not None:
                r["speedup_vs_bf16_best"] = r["tokens_per_s"] / best["tokens_per_s"]


def summary(rows: list[dict]) -> dict:
    """The three headline ratios at the largest measured shape (null when not measured)."""
    ok = [r for r in rows if r["status"] == "ok"]
    out = {"rollout_fp8_vs_bf16_best": None, "rollout_fp8_vs_bf16_eager": None, "rollout_fp8_peak_mem_ratio": None}
    if not ok:
        return out
    shape = max((r["batch"], r["gen_length"]) for r in ok)
    fp8 = [r for r in ok if (r["batch"], r["gen_length"]) == shape and r["precision"] == "fp8"]
    if fp8:
        fastest = max(fp8, key=lambda r: r["tokens_per_s"])
        out["rollout_fp8_vs_bf16_best"] = fastest.get("speedup_vs_bf16_best")
        out["rollout_fp8_vs_bf16_eager"] = fastest.get("speedup_vs_bf16_eager")
        out["rollout_fp8_peak_mem_ratio"] = fastest.get("peak_mem_ratio_vs_bf16_eager")
    return out


def run(args, device: torch.device, size: str, emit) -> list[dict]:
    """Measure every variant at every shape; each row is emitted as soon as it is measured, with ratios against the
    BF16 rows measured so far (BF16 variants run first); the returned rows carry the ratios over all of them."""
    shape = SHAPES[size]
    grid = [(batch, gen_length) for gen_length in args.gen_length for batch in args.batch]
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        _ratios(rows)
        emit(**row)

    def record(v: Variant, batch: int, gen_length: int) -> dict:
        return dict(shape=shape, batch=batch, prompt_len=args.prompt_len, gen_length=gen_length,
                    block_length=args.block_length, steps=gen_length // 2, temperature=args.temperature,
                    precision=v.precision, backend=v.backend, model=v.model, compiled=v.compiled)

    master = None
    started = time.perf_counter()
    largest = max(grid)
    expected_m = largest[0] * (args.prompt_len + largest[1])  # rows of one forward at the largest shape
    profiled = not args.profile
    for v in variants(args.backends, not args.no_compile, not args.compiled_only):
        reason, status = _skip_reason(v, device, args.smoke), "skipped"
        if reason is None and args.budget_s is not None and time.perf_counter() - started > args.budget_s:
            reason = f"time budget: --budget-s {args.budget_s} s spent before this variant started"
        if reason is None and master is None:
            master = random_llada(LLaDAConfig(**shape), seed=0, device=device)
        info: dict = {}
        model = None
        if reason is None:
            try:
                bench_env.sync(device)
                t0 = time.perf_counter()
                model = v.build(master, expected_m)
                bench_env.sync(device)
                info["build_s"] = time.perf_counter() - t0
                if model is not master:
                    master.to("cpu")  # only the measured model stays on the device
            except Exception as e:  # a backend that fails to build is reported, not fatal
                reason, status = f"building the model failed: {bench_env.error_reason(e)}", "failed"
        for batch, gen_length in grid:
            rec = record(v, batch, gen_length)
            if model is None:
                add({**rec, "status": status, "reason": reason})
                continue
            try:
                add({**rec, **info, **measure(model, batch, gen_length, v.compiled, args, device), "status": "ok"})
            except Exception as e:  # e.g. out of memory at batch 32: record it and go on
                add({**rec, **info, "status": "failed", "reason": bench_env.error_reason(e)})
                continue
            if not profiled and v.precision == "fp8" and not v.compiled and (batch, gen_length) == largest:
                profiled = True
                table = profile_table(model, batch, args.prompt_len + gen_length, device)
                atomic_write_text(Path(args.profile), f"# one forward, fp8 {v.backend}, [{batch}, "
                                  f"{args.prompt_len + gen_length}], {bench_env.device_name(device)}\n\n{table}\n")
            if device.type == "cuda":
                torch._dynamo.reset()  # frees compiled graphs and their CUDA-graph pools
                torch.cuda.empty_cache()
        if model is not None and model is not master:
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
            master.to(device)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape on CPU, a few seconds")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "rollout.jsonl"), help="JSONL file to append to")
    parser.add_argument("--json", help="also write one JSON object (environment, rows, summary ratios) here")
    parser.add_argument("--no-compile", action="store_true", help="eager rows only (no torch.compile time)")
    parser.add_argument("--compiled-only", action="store_true", help="compiled rows only (CUDA)")
    parser.add_argument("--budget-s", type=float, help="start no new variant after this many seconds")
    parser.add_argument("--profile", help="write a torch.profiler table of one FP8 forward here")
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 8 32; smoke 2)")
    parser.add_argument("--gen-length", type=int, nargs="+", help="completion lengths (default 128 256; smoke 16)")
    parser.add_argument("--block-length", type=int, help="semi-autoregressive block (default 32; smoke 8)")
    parser.add_argument("--prompt-len", type=int, help="prompt tokens (default 64; smoke 8)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    parser.add_argument("--cache", default="none", choices=["none", "prefix", "dual"],
                        help="Fast-dLLM block KV cache for every row (same NFE, cheaper steps; thresholds are not "
                        "offered: random weights are never confident)")
    parser.add_argument("--backends", nargs="+",
                        help="FP8 backends (default: every backend but the torch reference; smoke torch scaled_mm "
                             "torchao)")
    parser.add_argument("--repeats", type=int, help="timed calls per measurement, median (default 1)")
    args = parser.parse_args(argv)
    if args.no_compile and args.compiled_only:
        parser.error("--no-compile and --compiled-only exclude each other (drop one)")
    size = "smoke" if args.smoke else "full"
    for key, value in DEFAULTS[size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for gen_length in args.gen_length:  # fail before any model is built
        SamplerConfig(gen_length=gen_length, block_length=args.block_length, steps=gen_length // 2)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    env = bench_env.environment(device, args.smoke, REPO, bench="rollout", libraries=("torch", "triton"))
    with bench_env.jsonl_writer(args.out, env) as emit, torch.no_grad():
        rows = run(args, device, size, emit)
    if args.json:
        keys = ("device", "torch", "triton", "git_sha")
        result = {**{k: env.get(k) for k in keys}, "rows": rows, **summary(rows)}
        atomic_write_text(Path(args.json), json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
