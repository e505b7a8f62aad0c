"""Benchmark the FP8 rollout path: GEMM throughput and BF16 -> FP8 weight quantisation / sync time.

  python scripts/bench_fp8.py                 # GPU: LLaDA-8B shapes, full 8B-parameter sync
  python scripts/bench_fp8.py --smoke         # CPU, tiny shapes, a few seconds (torch reference + Triton interpreter)

1. GEMM y = x @ W^T at M ∈ {2048, 8192, 32768} × (N, K) ∈ {(4096, 4096), (12288, 4096), (4096, 12288)}:
   TFLOP/s = 2·M·N·K / time of our Triton blockwise FP8 GEMM (autotuned, as FP8Linear runs it; on GPU also without
   TMA, and pinned to 128×256 tiles, plain and persistent), cuBLAS's blockwise FP8 GEMM (torch._scaled_mm with 1×128 /
   128×128 scales: fp8_cublas_blockwise), BF16 torch.matmul, torch._scaled_mm (row-wise), torchao's blockwise GEMM,
   the dequantising torch reference, and the whole FP8Linear forward (activation quantisation + GEMM) per backend.
   Per shape, `ratio` rows: fp8_triton_gemm / fp8_cublas_blockwise, fp8_triton_gemm / bf16_matmul,
   fp8_cublas_blockwise / bf16_matmul, and the best Triton variant / cuBLAS blockwise (throughput ratios, > 1 = faster).
2. quantize_model and sync_weights for LLaDA-8B's linear layers (32 × q,k,v,attn_out 4096×4096, ff_proj/up_proj
   12288×4096, ff_out 4096×12288; 7.0e9 parameters) vs the memory-bandwidth floor: (bytes read + written) / measured
   device copy bandwidth.

Writes one JSON line per measurement to --out; a backend that cannot run is recorded as skipped with the reason.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the Triton kernels can only run on CPU under the interpreter (DESIGN.md §7)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from torch import nn  # noqa: E402

from dllm_ais.analysis import bench_env  # noqa: E402
from dllm_ais.fp8 import BACKENDS, FP8Linear, quant, quantize_model, sync_weights, unavailable_reason  # noqa: E402
from dllm_ais.fp8.backends import outer_dim_major as _outer_dim_major  # noqa: E402
from dllm_ais.fp8.ops import torchao_blockwise_gemm  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GEMM_M = {"full": [2048, 8192, 32768], "smoke": [32]}
GEMM_NK = {"full": [(4096, 4096), (12288, 4096), (4096, 12288)], "smoke": [(128, 128), (384, 128), (128, 384)]}
MODEL = {"full": dict(layers=32, d=4096, hidden=12288), "smoke": dict(layers=2, d=128, hidden=384)}


def timed(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    """Median wall time of fn() in seconds (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


TRITON_VARIANTS = ("fp8_triton_gemm", "fp8_triton_gemm_no_tma", "fp8_triton_gemm_128x256",
                   "fp8_triton_gemm_128x256_persistent")  # fmt: skip


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2


def gemm_cases(x: torch.Tensor, w: torch.Tensor) -> dict[str, tuple[str | None, Callable[[], object]]]:
    """name -> (reason it cannot run here or None, thunk). x [M, K] bf16, w [N, K] bf16."""
    device = x.device
    xq, xs = quant.quantize_act(x)
    xs = _outer_dim_major(xs)  # K-major, as kernels.quantize_act produces and cuBLAS requires
    wq, ws = quant.quantize_weight(w)
    xr, xrs = quant.quantize_rowwise(x)
    wr, wrs = quant.quantize_rowwise(w)
    triton_reason = unavailable_reason("triton", device)
    gpu_only = None if device.type == "cuda" else "GPU-only variant (the interpreter has no TMA / autotuning)"
    cases = {
        "bf16_matmul": (None, lambda: torch.matmul(x, w.T)),
        "fp8_triton_gemm": (triton_reason, lambda: _kernels().fp8_gemm(xq, xs, wq, ws)),
        "fp8_triton_gemm_no_tma": (triton_reason or gpu_only, lambda: _kernels().fp8_gemm(xq, xs, wq, ws,
                                                                                          use_tma=False)),
        "fp8_triton_gemm_128x256": (triton_reason, lambda: _kernels().fp8_gemm(xq, xs, wq, ws, block_m=128,
                                                                               block_n=256)),
        "fp8_triton_gemm_128x256_persistent": (triton_reason, lambda: _kernels().fp8_gemm(
            xq, xs, wq, ws, block_m=128, block_n=256, num_programs=_num_sms(device))),
        "fp8_cublas_blockwise": (
            unavailable_reason("cublas", device),
            lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16),
        ),
        "fp8_scaled_mm_rowwise": (
            unavailable_reason("scaled_mm", device),
            lambda: torch._scaled_mm(xr, wr.t(), scale_a=xrs, scale_b=wrs.t(), out_dtype=torch.bfloat16),
        ),
        "fp8_torchao_blockwise_gemm": (
            unavailable_reason("torchao", device),
            lambda: torchao_blockwise_gemm()(xq, xs, wq, ws),
        ),
        "fp8_torch_reference_gemm": (None, lambda: quant.fp8_gemm_reference(xq, xs, wq, ws)),
    }
    linear = nn.Linear(w.shape[1], w.shape[0], bias=False, device=device, dtype=w.dtype)
    with torch.no_grad():
        linear.weight.copy_(w)
    for backend in BACKENDS:
        reason = unavailable_reason(backend, device)
        layer = None if reason else FP8Linear.from_linear(linear, backend=backend)
        cases[f"fp8_linear_{backend}"] = (reason, lambda layer=layer: layer(x))
    return cases


def gemm_ratios(tflops: dict[str, float]) -> dict[str, float]:
    """Throughput ratios of one shape (only those whose both sides were measured)."""
    pairs = {
        "triton_vs_cublas_blockwise": ("fp8_triton_gemm", "fp8_cublas_blockwise"),
        "triton_vs_bf16": ("fp8_triton_gemm", "bf16_matmul"),
        "cublas_blockwise_vs_bf16": ("fp8_cublas_blockwise", "bf16_matmul"),
    }
    out = {metric: tflops[a] / tflops[b] for metric, (a, b) in pairs.items() if a in tflops and b in tflops}
    best = max((tflops[v] for v in TRITON_VARIANTS if v in tflops), default=None)
    if best is not None and "fp8_cublas_blockwise" in tflops:
        out["triton_best_variant_vs_cublas_blockwise"] = best / tflops["fp8_cublas_blockwise"]
    return out


def _kernels():
    from dllm_ais.fp8 import kernels

    return kernels


def bench_gemm(device: torch.device, size: str, repeats: int, warmup: int, emit: Callable[..., None]) -> None:
    g = torch.Generator(device=device).manual_seed(0)
    for N, K in GEMM_NK[size]:
        w = (torch.randn(N, K, generator=g, device=device) * 0.02).to(torch.bfloat16)
        for M in GEMM_M[size]:
            x = torch.randn(M, K, generator=g, device=device).to(torch.bfloat16)
            shape = {"M": M, "N": N, "K": K}
            tflops: dict[str, float] = {}
            for name, (reason, fn) in gemm_cases(x, w).items():
                if reason is not None:
                    emit(bench="gemm", shape=shape, backend=name, metric="tflops", status="skipped", reason=reason)
                    continue
                try:
                    with torch.no_grad():
                        seconds = timed(fn, device, repeats, warmup)
                except Exception as e:  # one failing variant must not end the run: record it
                    emit(bench="gemm", shape=shape, backend=name, metric="tflops", status="failed",
                         reason=bench_env.error_reason(e))  # fmt: skip
                    continue
                tflops[name] = 2 * M * N * K / seconds / 1e12
                emit(bench="gemm", shape=shape, backend=name, metric="tflops", value=tflops[name],
                     time_ms=seconds * 1e3, status="ok")  # fmt: skip
            for metric, value in gemm_ratios(tflops).items():
                emit(bench="gemm", shape=shape, backend="ratio", metric=metric, value=value, status="ok")
            del x
        del w
        if device.type == "cuda":
            torch.cuda.empty_cache()


def llada_linears(layers: int, d: int, hidden: int, device: torch.device) -> nn.Module:
    """LLaDA-8B's linear layers only (names as in the checkpoint), bf16, default nn.Linear init."""
    blocks = nn.ModuleList()
    for _ in range(layers):
        block = nn.Module()
        for name, (n_out, n_in) in {
            "q_proj": (d, d), "k_proj": (d, d), "v_proj": (d, d), "attn_out": (d, d),
            "ff_proj": (hidden, d), "up_proj": (hidden, d), "ff_out": (d, hidden),
        }.items():  # fmt: skip
            setattr(block, name, nn.Linear(n_in, n_out, bias=False, device=device, dtype=torch.bfloat16))
        blocks.append(block)
    model = nn.Module()
    model.blocks = blocks
    return model


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int) -> float:
    """Device copy bandwidth in bytes/s: (read + write) of a large copy_."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device, repeats, warmup=2)
    return 2 * nbytes / seconds


def bench_sync(device: torch.device, size: str, repeats: int, emit: Callable[..., None]) -> None:
    backend = "triton" if unavailable_reason("triton", device) is None and device.type == "cuda" else "torch"
    cfg = MODEL[size]
    master = llada_linears(device=device, **cfg)
    linears = [m for m in master.modules() if isinstance(m, nn.Linear)]
    params = sum(m.weight.numel() for m in linears)
    scale_bytes = sum(4 * quant.num_blocks(m.out_features) * quant.num_blocks(m.in_features) for m in linears)
    moved = 2 * params + params + scale_bytes  # read bf16 weights, write e4m3 codes and fp32 scales
    bandwidth = copy_bandwidth(device, (1 << 30) if device.type == "cuda" else (1 << 26), repeats)
    floor = moved / bandwidth
    shape = {**cfg, "params": params, "bytes_moved": moved}
    emit(bench="sync", shape=shape, backend=backend, metric="copy_bandwidth_GBps", value=bandwidth / 1e9, status="ok")
    emit(bench="sync", shape=shape, backend=backend, metric="floor_ms", value=floor * 1e3, status="ok")

    holder: dict[str, nn.Module] = {}

    def first_quantisation() -> None:
        holder.pop("rollout", None)
        holder["rollout"] = quantize_model(master, backend=backend)

    seconds = timed(first_quantisation, device, repeats=1, warmup=1)
    emit(bench="sync", shape=shape, backend=backend, metric="quantize_model_ms", value=seconds * 1e3,
         floor_fraction=floor / seconds, status="ok")  # fmt: skip
    rollout = holder["rollout"]
    seconds = timed(lambda: sync_weights(master, rollout), device, repeats, warmup=1)
    emit(bench="sync", shape=shape, backend=backend, metric="sync_weights_ms", value=seconds * 1e3,
         floor_fraction=floor / seconds, status="ok")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, a few seconds")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "fp8_gemm.jsonl"), help="JSONL file to append to")
    parser.add_argument("--bench", nargs="+", choices=["gemm", "sync"], default=["gemm", "sync"])
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (median); default 20 GPU, 2 smoke")
    args = parser.parse_args(argv)

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    size = "smoke" if args.smoke else "full"
    if size == "full" and device.type != "cuda":
        sys.exit("the full benchmark needs a CUDA GPU; use --smoke on CPU")
    repeats = args.repeats or (2 if args.smoke else 20)
    env = bench_env.environment(device, args.smoke, REPO, libraries=("torch", "triton"),
                                triton_interpret=os.environ.get("TRITON_INTERPRET") == "1")
    with bench_env.jsonl_writer(args.out, env) as emit:
        if "gemm" in args.bench:
            bench_gemm(device, size, repeats, warmup=1 if args.smoke else 3, emit=emit)
        if "sync" in args.bench:
            bench_sync(device, size, repeats, emit=emit)


if __name__ == "__main__":
    main()
