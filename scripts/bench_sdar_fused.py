"""CPU forward time of SDAR's FP8 rollout copies side by side in one run: the fused copy (models/sdar/fused_fp8.py) and
the per-Linear copy (fp8/quantize.py with an `exclude`), with LLaDA's fused copy of the same width for reference.

  python scripts/bench_sdar_fused.py                # tiny SDAR (the tiny-sdar preset's model), [128, 48]
  python scripts/bench_sdar_fused.py --wide         # d 512, h 1536, 8 q / 2 kv heads of 64, 2 layers, [16, 64]
  python scripts/bench_sdar_fused.py --quick        # a few rows, one repeat (tests/test_fp8_fused_sdar.py runs it)

torch backend (what `auto` takes on CPU), --threads threads, the three copies timed in turn per repeat (interleaved, so
load changes hit them alike), median per copy. Prints one line per copy and the ratios; results recorded in
benchmarks/sdar_fused/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def measure(wide: bool, rows: int, length: int, repeats: int) -> dict[str, float]:
    """Median milliseconds of one no-grad forward of each copy on a [rows, length] canvas."""
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.models.sdar.tiny import tiny_sdar_model
    from dllm_ais.models.tiny import tiny_model

    shape = dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2, head_dim=64)
    sdar = tiny_sdar_model(seed=0, **(shape if wide else {}))
    llada = tiny_model(seed=0, d_model=512, n_heads=8, mlp_hidden_size=1536) if wide else tiny_model(seed=0)
    copies = {"sdar fused": quantize_model(sdar, "torch"),
              "sdar per-Linear": quantize_model(sdar, "torch", exclude=lambda name: False),
              "llada fused": quantize_model(llada, "torch")}
    ids = torch.randint(5, 100, (rows, length), generator=torch.Generator().manual_seed(0))
    keep = torch.ones(rows, length, dtype=torch.bool)
    times: dict[str, list[float]] = {k: [] for k in copies}
    with torch.no_grad():
        for copy in copies.values():  # warm-up
            copy(ids, keep)
        for _ in range(repeats):
            for name, copy in copies.items():
                start = time.perf_counter()
                copy(ids, keep)
                times[name].append(time.perf_counter() - start)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wide", action="store_true", help="d 512 instead of the tiny SDAR's 64")
    ap.add_argument("--quick", action="store_true", help="4 rows × 8 positions, one repeat (a smoke run)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows, length, repeats = (4, 8, 1) if args.quick else (16, 64, 7) if args.wide else (128, 48, 15)
    ms = measure(args.wide, rows, length, repeats)
    for name, t in ms.items():
        print(f"{name:16s} {t:8.2f} ms  [{rows}, {length}], {repeats} repeats, {args.threads} thread(s)")
    print(f"per-Linear / fused (SDAR): {ms['sdar per-Linear'] / ms['sdar fused']:.2f}x; "
          f"SDAR fused / LLaDA fused: {ms['sdar fused'] / ms['llada fused']:.2f}x")
    return ms


if __name__ == "__main__":
    main()
