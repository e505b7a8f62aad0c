"""How fast a GPU runs the step's work: measured rows under benchmarks/gpu/ when that GPU kind has them, else the
vendor's datasheet peaks scaled by the fraction of peak the nearest measured GPU achieved (said in `source`).

A measured rate is the FLOP/s one LLaDA-8B-shaped sampler forward achieved in scripts/bench_rollout.py's rows
(`step_ms` = one denoising step: the forward plus the sampling tail), FLOPs counted by flops.forward_flops for that
row's shape; the plan scales it to other shapes by their FLOPs. BF16 eager rows give the master's rate (training
forwards, backwards and likelihood passes run eager); the fastest BF16 / FP8 rows (eager or compiled) the rollout's.
Bandwidth-bound work (the optimizer step, the FP8 weight sync) divides its bytes by the HBM bandwidth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
"""Where gpu_check writes its rows (benchmarks/gpu/<device>-<date>/)."""
ROLLOUT_FILES = ("rollout-eager.jsonl", "rollout-compiled.jsonl")
SYNC_OVER_FLOOR = 2.7
"""sync_weights time over its bandwidth floor when no row measures it: DESIGN.md §7's H100 run (19.0 / 7.05 ms)."""
BLOCK_BACKENDS = ("cublas", "triton", "torchao")
"""fp8/backends.py AUTO_CANDIDATES: the backends `--fp8-backend auto` (the LLaDA GPU presets) chooses among."""
UNMEASURED_UTILISATION = 0.4
"""Fraction of datasheet peak assumed when no GPU row exists at all (a round guess; said so in `source`)."""


@dataclass(frozen=True)
class GPU:
    """Datasheet figures of one GPU kind (dense, no sparsity)."""

    name: str
    """Product name."""
    memory_gib: float
    """Memory torch reports (torch.cuda.get_device_properties(...).total_memory / 2**30)."""
    bf16_tflops: float
    """Dense BF16 tensor-core peak, TFLOP/s."""
    fp8_tflops: float | None
    """Dense FP8 tensor-core peak (None: no FP8 tensor cores)."""
    fp32_tflops: float
    """FP32 (non-tensor-core) peak: the emulated FP4 copy and the FP8 `torch` reference backend multiply in fp32."""
    hbm_tbps: float
    """HBM bandwidth, TB/s."""
    matches: str
    """Substring of torch.cuda.get_device_name() (benchmark rows' "device") that identifies the kind."""


GPUS: dict[str, GPU] = {
    "h100": GPU("NVIDIA H100 SXM5 80GB", 79.19, 989.4, 1978.9, 66.9, 3.35, "H100"),
    "h200": GPU("NVIDIA H200 SXM 141GB", 139.8, 989.4, 1978.9, 66.9, 4.8, "H200"),
    "a100": GPU("NVIDIA A100 SXM4 80GB", 79.15, 312.0, None, 19.5, 2.039, "A100"),
}
"""The kinds `--gpu` accepts. Sources: NVIDIA's H100 / H200 / A100 datasheets (SXM, dense)."""


def usable_bytes(gpu: GPU) -> float:
    """What a run may use: 95 % of the memory (allocator slack) minus 1 GiB (CUDA context, cuBLAS/cuDNN workspaces)."""
    return (0.95 * gpu.memory_gib - 1.0) * 2**30


@dataclass(frozen=True)
class Rates:
    """FLOP/s and bytes/s the plan divides by, with where each came from."""

    master: float
    """BF16 eager forward (and backward) of the master, FLOP/s."""
    rollout: dict[str, float]
    """Rollout forward FLOP/s per precision: bf16, fp8, fp4."""
    hbm: float
    """Bytes/s for bandwidth-bound work."""
    source: str
    """One line: measured rows (which directory) or datasheet × which utilisation."""
    notes: tuple[str, ...] = ()
    """Caveats for this GPU (e.g. no FP8 tensor cores)."""


def _rollout_rows(directory: Path) -> list[dict]:
    rows = []
    for name in ROLLOUT_FILES:
        path = directory / name
        if path.is_file():
            for line in path.read_text().splitlines():
                row = json.loads(line) if line.strip() else {}
                if row.get("status") == "ok" and not row.get("smoke") and row.get("step_ms") and row.get("shape"):
                    rows.append(row)
    return rows


def _row_flops(row: dict) -> float:
    """FLOPs of one sampler forward of a bench_rollout row: its shape, batch, canvas, current-block logits."""
    from .flops import forward_flops
    from .shape import ModelShape

    sh = row["shape"]
    d, h, layers, V = sh["d_model"], sh["mlp_hidden_size"], sh["n_layers"], sh["embedding_size"]
    shape = ModelShape("bench", d, layers, sh["n_heads"], h, V, 0, layers * (4 * d * d + 3 * d * h), V * d, V * d,
                       0, 0)
    T = row["prompt_len"] + row["gen_length"]
    return forward_flops(shape, row["batch"], T, T, row["block_length"])


@lru_cache(maxsize=16)
def measured(kind: str, root: Path = BENCHMARKS) -> dict | None:
    """{"dir", "bf16_eager", "bf16_best", "fp8_best", "fp8_backend"} in FLOP/s from the newest directory of
    benchmarks/gpu/ with rollout rows of this GPU kind, or None."""
    gpu = GPUS[kind]
    if not root.is_dir():
        return None
    for directory in sorted(root.iterdir(), reverse=True):  # <device>-<YYYYMMDD>: newest date first per device
        rows = [r for r in _rollout_rows(directory) if gpu.matches in r.get("device", "")]
        if not rows:
            continue
        rate = {id(r): _row_flops(r) / (r["step_ms"] / 1e3) for r in rows}
        bf16 = [r for r in rows if r["precision"] == "bf16"]
        eager = [r for r in bf16 if r.get("model") == "master" and not r.get("compiled")]
        fp8 = [r for r in rows if r["precision"] == "fp8"]
        fp8 = [r for r in fp8 if r.get("backend") in BLOCK_BACKENDS] or fp8  # what `auto` picks from
        if not eager:
            continue
        best_fp8 = max(fp8, key=lambda r: rate[id(r)]) if fp8 else None
        return {"dir": f"benchmarks/gpu/{directory.name}", "device": rows[0]["device"],
                "bf16_eager": max(rate[id(r)] for r in eager), "bf16_best": max(rate[id(r)] for r in bf16),
                "fp8_best": rate[id(best_fp8)] if best_fp8 else None,
                "fp8_backend": best_fp8["backend"] if best_fp8 else None,
                "shape": f"batch {eager[0]['batch']}, canvas {eager[0]['prompt_len'] + eager[0]['gen_length']}"}
    return None


def _nearest_measured(root: Path) -> tuple[str, dict] | None:
    for kind in ("h100", "h200", "a100"):  # any measured kind lends its utilisation (Hopper first)
        found = measured(kind, root)
        if found is not None:
            return kind, found
    return None


def rates(kind: str, root: Path = BENCHMARKS) -> Rates:
    """The rates of GPU kind `kind` (h100, h200, a100): its own rows, else its datasheet × a measured utilisation."""
    if kind not in GPUS:
        raise ValueError(f"--gpu {kind}: use one of {', '.join(GPUS)}.")
    gpu = GPUS[kind]
    hbm = gpu.hbm_tbps * 1e12
    fp32 = gpu.fp32_tflops * 1e12
    notes = []
    if gpu.fp8_tflops is None:
        notes.append(f"{gpu.name} has no FP8 tensor cores: the only FP8 backend that runs there is `torch` "
                     "(dequantise + fp32 matmul); roll out in bf16 (--rollout-precision bf16).")
    own = measured(kind, root)
    if own is not None:
        fp8 = own["fp8_best"] if own["fp8_best"] is not None else own["bf16_best"]
        u_bf16 = own["bf16_eager"] / (gpu.bf16_tflops * 1e12)
        source = (f"measured: {own['dir']} ({own['device']}, bench_rollout rows at {own['shape']}: BF16 eager "
                  f"{own['bf16_eager'] / 1e12:.0f}, FP8 {own['fp8_backend']} {fp8 / 1e12:.0f} TFLOP/s achieved); "
                  f"HBM {gpu.hbm_tbps} TB/s datasheet")
        return Rates(own["bf16_eager"], {"bf16": own["bf16_best"], "fp8": fp8, "fp4": fp32 * u_bf16}, hbm, source,
                     tuple(notes))
    near = _nearest_measured(root)
    if near is not None:
        other, found = near
        u_bf16 = found["bf16_eager"] / (GPUS[other].bf16_tflops * 1e12)
        u_fp8 = (found["fp8_best"] or found["bf16_best"]) / (GPUS[other].fp8_tflops * 1e12)
        how = (f"× the fraction of peak {found['device']} achieved in {found['dir']} (BF16 eager {u_bf16:.0%}, FP8 "
               f"{u_fp8:.0%})")
    else:
        u_bf16 = u_fp8 = UNMEASURED_UTILISATION
        how = f"× {UNMEASURED_UTILISATION:.0%} (no GPU rows under benchmarks/gpu/: an assumption)"
    bf16 = gpu.bf16_tflops * 1e12 * u_bf16
    fp8 = gpu.fp8_tflops * 1e12 * u_fp8 if gpu.fp8_tflops else fp32 * u_bf16
    fp8_text = f"{gpu.fp8_tflops:.0f} FP8" if gpu.fp8_tflops else f"no FP8 (fp32 {gpu.fp32_tflops})"
    source = (f"datasheet: {gpu.name} {gpu.bf16_tflops:.0f} BF16 / {fp8_text} TFLOP/s, {gpu.hbm_tbps} TB/s HBM, "
              f"{how}; no rows for this GPU under benchmarks/gpu/")
    return Rates(bf16, {"bf16": bf16, "fp8": fp8, "fp4": fp32 * u_bf16}, hbm, source, tuple(notes))
