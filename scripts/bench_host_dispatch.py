"""Host time per rollout layer (and per weight sync) with the device work stubbed: what a launch-bound GPU step pays
on the CPU side, measured on a CPU machine.

Stubs: every tensor lives on the `meta` device (ATen ops dispatch and allocate shapes, no math), and Triton kernel
launches return at once (triton.runtime.jit.JITFunction.run is replaced by a no-op: the binding of `kernel[grid]` and
everything above it still runs; Triton's own argument specialisation and the driver launch do not — on a GPU each
launch adds its launcher's cost, ≈ the same per launch for every path). At LLaDA-8B layer shapes (d 4096, MLP 12288,
32 heads × 128), the dual-cache window step [32 × 32 rows over a 320-slot cache] and a full [32, 320] forward:

  bf16_master     models/llada.LLaDABlock (7 nn.Linear, unfused elementwise ops): the BF16 master eager
  bf16_fused      the fused BF16 rollout copy's block (models/llada/fused_fp8.py _block_plain)
  fp8_registered  the fused FP8 copy (cublas backend, Triton producers) through the torch.library ops (the old path)
  fp8_direct      the same, eager: kernels and torch._scaled_mm called directly (fp8/eager.py)

Variants run interleaved, round after round (the machine is shared): each round times `--calls` calls of every
variant; the report gives per-variant medians over rounds and the median over rounds of each ratio to bf16_master.
`--sync` adds host µs per weight sync of LLaDA-8B on meta, old vs new, and the sync's fair floor (bench_host_sync.py).

  python scripts/bench_host_dispatch.py --rounds 15 --calls 50 --sync --out benchmarks/host_dispatch/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET: the benchmark stubs compiled-kernel launches, not the interpreter")

import torch  # noqa: E402
import triton.runtime.jit  # noqa: E402

from dllm_ais.fp8 import backends, eager  # noqa: E402
from dllm_ais.fp8.fused_copy import producer_impl  # noqa: E402
from dllm_ais.models.llada import fused_fp8 as fl  # noqa: E402
from dllm_ais.models.llada.model import LLaDABlock, LLaDAConfig, rope_cos_sin  # noqa: E402


def stub_triton_launches() -> None:
    """kernel[grid](...) returns without compiling or launching (the stub of the device work)."""
    triton.runtime.jit.JITFunction.run = lambda self, *args, **kwargs: None


def llada_8b_config() -> LLaDAConfig:
    return LLaDAConfig(d_model=4096, n_heads=32, n_layers=1, mlp_hidden_size=12288, vocab_size=126464,
                       embedding_size=126464)  # fmt: skip


def tiny_config() -> LLaDAConfig:
    """LLaDA-8B's structure (head_dim 128, MLP 3× d) at widths where the CPU's own arithmetic is small (run in
    fp32: the model dtype the producers also accept; CPU bf16 GEMMs are emulated and would dominate)."""
    return LLaDAConfig(d_model=128, n_heads=1, n_layers=1, mlp_hidden_size=384, vocab_size=512, embedding_size=512)


def stub_blockwise_scaled_mm() -> None:
    """CPU torch has no blockwise _scaled_mm (and its fp8 row-wise mode is a slow emulation): stand in the ATen GEMM
    the fp32 tiny layers run at the same shape — one torch.mm of cached fp32 operands — so both sides pay one ATen
    GEMM dispatch per linear (on meta tensors the real _scaled_mm meta function runs)."""
    real, operands = torch._scaled_mm, {}

    def scaled_mm(a, b, scale_a, scale_b, out_dtype):  # a [M, K], b [K, N]
        if a.device.type == "meta":
            return real(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
        key = (a.shape[0], a.shape[1], b.shape[1])
        if key not in operands:
            operands[key] = (torch.zeros(key[0], key[1]), torch.zeros(key[1], key[2]))
        return torch.mm(*operands[key])  # fp32: the CPU's bf16 GEMMs are slow emulations even at tiny shapes

    torch._scaled_mm = scaled_mm


def layer_variants(config: LLaDAConfig, batch: int, rows: int, cache: int | None, device: str) -> dict:
    """name -> zero-argument callable running one layer's forward on `device` ("meta" or "cpu"). rows: query rows per
    sequence; cache: KV-cache slots (the dual-cache window step) or None (a full forward over `rows` positions)."""
    meta = torch.device(device)
    bf16 = torch.bfloat16 if device == "meta" else torch.float32  # CPU: fp32, whose tiny GEMMs cost ~ nothing
    with meta:
        master = LLaDABlock(config).to(bf16)
    fused_bf16 = fl.FusedLLaDABlock(config, None, meta, bf16)
    fused_fp8 = fl.FusedLLaDABlock(config, "cublas", meta, bf16)
    backends.prepare_gemm_shapes(fused_fp8, [batch * rows])  # cuBLAS's acceptance decided up front, as rollouts do
    impl = producer_impl("block", "triton")
    d, H, D = config.d_model, config.n_heads, config.head_dim
    x = torch.randn(batch, rows, d, device=meta).to(bf16)
    keys = cache or rows
    positions = torch.arange(rows, device=meta).expand(batch, -1)
    cos4, sin4 = rope_cos_sin(positions, D, config.rope_theta)  # [B, 1, T, D] (master)
    cos, sin = fl.producers.rope_tables(positions, D, config.rope_theta)  # [B, T, D/2] (fused copies)
    bias = torch.ones(batch, 1, 1, keys, dtype=torch.bool, device=meta)
    kv = index = None
    if cache:
        kv = (torch.zeros(batch, H, cache, D, dtype=bf16, device=meta),) * 2
        index = torch.arange(rows, device=meta)

    def fp8_registered():
        with eager.registered_ops():
            return fl._block_fp8_producers(fused_fp8, impl, x, cos, sin, bias, kv, index)

    return {
        "bf16_master": lambda: master(x, cos4, sin4, bias, kv, index),
        "bf16_fused": lambda: fl._block_plain(fused_bf16, None, x, cos, sin, bias, kv, index),
        "fp8_registered": fp8_registered,
        "fp8_direct": lambda: fl._block_fp8_producers(fused_fp8, impl, x, cos, sin, bias, kv, index),
    }


def time_interleaved(variants: dict, rounds: int, calls: int, reference: str) -> dict:
    """Per variant: median / min µs per call over rounds, and the median per-round ratio to `reference`."""
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for fn in variants.values():  # warm-up (first calls build caches)
            for _ in range(3):
                fn()
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))  # no fixed position in the round
            for name in order:
                fn = variants[name]
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                per_round[name].append((time.perf_counter() - t0) / calls * 1e6)
    ref = per_round[reference]
    return {name: {"median_us": statistics.median(us), "min_us": min(us),
                   "ratio_to_" + reference: statistics.median(a / b for a, b in zip(us, ref, strict=True))}
            for name, us in per_round.items()}  # fmt: skip


def machine() -> dict:
    load = os.getloadavg()
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "loadavg_1_5_15": [round(v, 2) for v in load],
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "omp_threads": os.environ.get("OMP_NUM_THREADS")}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--sync", action="store_true", help="also time one weight sync, old vs new")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    stub_triton_launches()
    stub_blockwise_scaled_mm()
    result = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "machine_before": machine(), "rounds": args.rounds, "calls": args.calls, "layer": {}}  # fmt: skip
    shapes = {  # label -> (device, config, batch, rows, cache)
        "cpu_tiny_window_step_1x2_cache4": ("cpu", tiny_config(), 1, 2, 4),
        "cpu_tiny_full_forward_1x4": ("cpu", tiny_config(), 1, 4, None),
        "meta_8b_window_step_32x32_cache320": ("meta", llada_8b_config(), 32, 32, 320),
    }
    for label, (device, config, batch, rows, cache) in shapes.items():
        result["layer"][label] = time_interleaved(layer_variants(config, batch, rows, cache, device), args.rounds,
                                                  args.calls, "bf16_master")  # fmt: skip
    if args.sync:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_host_sync import sync_bench  # scripts/bench_host_sync.py

        result["sync"] = sync_bench(max(3, args.rounds // 3))
    result["machine_after"] = machine()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
