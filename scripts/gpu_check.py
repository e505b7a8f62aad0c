"""One command for a GPU session: the test suite on CUDA, every GPU benchmark, and a summary of issue 10's numbers.

  bash scripts/gpu_check.sh                      # install (DESIGN.md §7), then everything below
  python scripts/gpu_check.py                    # every stage in order (tests, gemm, sync, rollout, rl_step, ar_decode)
  python scripts/gpu_check.py --only gemm sync   # some stages (a device call is capped at 10 minutes: split the run)
  python scripts/gpu_check.py --only summary     # rebuild summary.json / report.md from the files already there
  python scripts/gpu_check.py --dry-run          # no GPU needed: runs nothing, writes a summary with nulls

Writes benchmarks/gpu/<device>-<YYYYMMDD>/ (or --out-dir): one file per stage (pytest.xml + pytest.log, fp8.jsonl,
rollout.json + rollout.jsonl, rl_step.jsonl, ar_decode.jsonl, <stage>.log), then summary.json and report.md.
Each stage runs as a subprocess with its own timeout; one that fails is recorded and the others still run.

summary.json holds exactly SUMMARY_KEYS: floats (null when not measured), gpu_tests_failed an int (null when the tests
did not run), and device, torch, triton, git_sha:
  gemm_triton_vs_cublas_blockwise_min  min over M ≥ 8192 shapes of (Triton GEMM TFLOP/s) / (cuBLAS blockwise TFLOP/s)
  gemm_triton_vs_bf16_min              min over M ≥ 8192 shapes of (Triton GEMM TFLOP/s) / (BF16 matmul TFLOP/s)
  rollout_fp8_vs_bf16_best / _eager    read from bench_rollout.py --json (batch 32, gen 256)
  rollout_fp8_peak_mem_ratio           ditto
  sync_vs_floor                        sync_weights time / bandwidth floor (bench_fp8.py sync; lower is better)
  rl_step_fp8_vs_bf16                  BF16 step time / FP8 step time (bench_rl_step.py; > 1 = FP8 faster)
  rl_step_mismatch_fraction            mismatch-ELBO time / FP8 step time
  ar_decode_bf16_vs_floor, ar_decode_fp8_vs_bf16   from bench_ar_decode.py's rows when it writes them (else null)
  gpu_tests_failed                     failures + errors of the whole suite run on CUDA (GPU-marked tests included)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUMMARY_KEYS = (
    "gemm_triton_vs_cublas_blockwise_min",
    "gemm_triton_vs_bf16_min",
    "rollout_fp8_vs_bf16_best",
    "rollout_fp8_vs_bf16_eager",
    "rollout_fp8_peak_mem_ratio",
    "sync_vs_floor",
    "rl_step_fp8_vs_bf16",
    "rl_step_mismatch_fraction",
    "ar_decode_bf16_vs_floor",
    "ar_decode_fp8_vs_bf16",
    "gpu_tests_failed",
    "device",
    "torch",
    "triton",
    "git_sha",
)
BIG_M = 8192  # the GEMM ratios are taken over shapes with M >= this (the rollout / training regime)


def _py(*args: str) -> list[str]:
    return [sys.executable, *args]


# stage -> (command given the output directory, timeout in seconds). Each writes its rows into the directory.
STAGES: dict[str, Callable[[Path], list[str]]] = {
    "tests": lambda out: _py("-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={out / 'pytest.xml'}"),
    "gemm": lambda out: _py("scripts/bench_fp8.py", "--bench", "gemm", "--out", str(out / "fp8.jsonl")),
    "sync": lambda out: _py("scripts/bench_fp8.py", "--bench", "sync", "--out", str(out / "fp8.jsonl")),
    "rollout": lambda out: _py("scripts/bench_rollout.py", "--batch", "32", "--gen-length", "256", "--out",
                               str(out / "rollout.jsonl"), "--json", str(out / "rollout.json")),  # fmt: skip
    "rl_step": lambda out: _py("scripts/bench_rl_step.py", "--out", str(out / "rl_step.jsonl")),
    "ar_decode": lambda out: _py("scripts/bench_ar_decode.py", "--out", str(out / "ar_decode.jsonl")),
}


# ----------------------------------------------------------------------------------------------------------------------
# reading the rows back


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _float(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def gemm_ratio_min(rows: list[dict], metric: str) -> float | None:
    """min of a bench_fp8.py per-shape ratio row over shapes with M >= BIG_M (None when none was measured)."""
    values = [
        r["value"] for r in rows
        if r.get("bench") == "gemm" and r.get("backend") == "ratio" and r.get("metric") == metric
        and r.get("status") == "ok" and r.get("shape", {}).get("M", 0) >= BIG_M and _float(r.get("value")) is not None
    ]  # fmt: skip
    return min(values) if values else None


def sync_vs_floor(rows: list[dict]) -> float | None:
    """Last sync_weights_ms / floor_ms pair of bench_fp8.py's sync rows."""
    sync = [r["value"] for r in rows if r.get("bench") == "sync" and r.get("metric") == "sync_weights_ms"]
    floor = [r["value"] for r in rows if r.get("bench") == "sync" and r.get("metric") == "floor_ms"]
    return sync[-1] / floor[-1] if sync and floor and floor[-1] else None


def rl_step_numbers(rows: list[dict]) -> tuple[float | None, float | None]:
    """(step speedup, mismatch fraction) of the first measured FP8 row of bench_rl_step.py."""
    for r in rows:
        if r.get("precision") == "fp8" and r.get("status") == "ok":
            return _float(r.get("step_speedup_vs_bf16")), _float(r.get("mismatch_fraction"))
    return None, None


def _first_key(rows: list[dict], key: str) -> float | None:
    for r in rows:
        if _float(r.get(key)) is not None:
            return float(r[key])
    return None


def gpu_tests_failed(xml_path: Path) -> int | None:
    """failures + errors from pytest's junit XML (None when the tests did not run)."""
    if not xml_path.is_file():
        return None
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)


def environment() -> dict:
    """device, torch, triton, git_sha of this machine."""
    import torch

    from dllm_ais import bench_env

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return {
        "device": bench_env.device_name(device),
        "torch": bench_env.version("torch"),
        "triton": bench_env.version("triton"),
        "git_sha": bench_env.git_commit(REPO)[0],
    }


def summarize(out: Path, env: dict) -> dict:
    """summary.json's dict from the files in `out` (SUMMARY_KEYS exactly, in order)."""
    fp8 = _jsonl(out / "fp8.jsonl")
    rollout = json.loads((out / "rollout.json").read_text()) if (out / "rollout.json").is_file() else {}
    rl_speedup, rl_mismatch = rl_step_numbers(_jsonl(out / "rl_step.jsonl"))
    ar_rows = _jsonl(out / "ar_decode.jsonl")
    if (out / "ar_decode.json").is_file():
        ar_rows.append(json.loads((out / "ar_decode.json").read_text()))
    values = {
        "gemm_triton_vs_cublas_blockwise_min": gemm_ratio_min(fp8, "triton_vs_cublas_blockwise"),
        "gemm_triton_vs_bf16_min": gemm_ratio_min(fp8, "triton_vs_bf16"),
        "rollout_fp8_vs_bf16_best": _float(rollout.get("rollout_fp8_vs_bf16_best")),
        "rollout_fp8_vs_bf16_eager": _float(rollout.get("rollout_fp8_vs_bf16_eager")),
        "rollout_fp8_peak_mem_ratio": _float(rollout.get("rollout_fp8_peak_mem_ratio")),
        "sync_vs_floor": sync_vs_floor(fp8),
        "rl_step_fp8_vs_bf16": rl_speedup,
        "rl_step_mismatch_fraction": rl_mismatch,
        "ar_decode_bf16_vs_floor": _first_key(ar_rows, "ar_decode_bf16_vs_floor"),
        "ar_decode_fp8_vs_bf16": _first_key(ar_rows, "ar_decode_fp8_vs_bf16"),
        "gpu_tests_failed": gpu_tests_failed(out / "pytest.xml"),
        **env,
    }
    return {key: values[key] for key in SUMMARY_KEYS}


TARGETS = {  # issue 10's acceptance bounds: (key, comparison, bound)
    "gemm_triton_vs_cublas_blockwise_min": (">=", 0.9),
    "rollout_fp8_vs_bf16_best": (">=", 1.4),
    "rollout_fp8_vs_bf16_eager": (">=", 2.5),
    "rollout_fp8_peak_mem_ratio": ("<=", 0.65),
    "sync_vs_floor": ("<=", 2.0),
    "gpu_tests_failed": ("<=", 0),
}


def report(summary: dict, stages: dict[str, str], dry_run: bool) -> str:
    lines = [
        f"# GPU check: {summary['device']}",
        "",
        f"torch {summary['torch']}, triton {summary['triton']}, git {summary['git_sha']}",
        "",
    ]
    if dry_run:
        lines += ["Dry run: nothing was measured (every value is null).", ""]
    lines += ["| key | value | issue 10 target |", "|---|---|---|"]
    for key in SUMMARY_KEYS[:11]:
        value = summary[key]
        shown = "not measured" if value is None else (f"{value:.3g}" if isinstance(value, float) else str(value))
        target = TARGETS.get(key)
        if target is None:
            verdict = ""
        elif value is None:
            verdict = f"{target[0]} {target[1]} (not measured)"
        else:
            met = value >= target[1] if target[0] == ">=" else value <= target[1]
            verdict = f"{target[0]} {target[1]}: {'met' if met else 'NOT met'}"
        lines.append(f"| {key} | {shown} | {verdict} |")
    if stages:
        lines += ["", "Stages of this call:", ""] + [f"- {name}: {status}" for name, status in stages.items()]
    lines += ["", "Rows: fp8.jsonl (GEMM + sync), rollout.json(l), rl_step.jsonl, ar_decode.jsonl, pytest.xml.", ""]
    return "\n".join(lines)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def run_stage(name: str, out: Path, timeout: int) -> str:
    """Run one stage (its output to <out>/<name>.log); a short status string."""
    cmd = STAGES[name](out)
    log = out / f"{'pytest' if name == 'tests' else name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env).returncode
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout} s (see {log.name})"
    return "ok" if rc == 0 else f"exit status {rc} (see {log.name})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="where to write (default benchmarks/gpu/<device>-<YYYYMMDD>)")
    parser.add_argument("--only", nargs="+", choices=[*STAGES, "summary"], help="run these stages (default: all)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per stage (default 3600)")
    parser.add_argument("--dry-run", action="store_true", help="run nothing; write a summary of nulls (CPU is fine)")
    args = parser.parse_args(argv)

    env = environment()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
    out = Path(args.out_dir) if args.out_dir else REPO / "benchmarks" / "gpu" / f"{_slug(env['device'])}-{date}"
    out.mkdir(parents=True, exist_ok=True)
    stages: dict[str, str] = {}
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device here; use --dry-run on CPU", file=sys.stderr)
            return 2
        for name in [s for s in STAGES if args.only is None or s in args.only]:
            print(f"gpu_check: {name} …", flush=True)
            stages[name] = run_stage(name, out, args.timeout)
            print(f"gpu_check: {name}: {stages[name]}", flush=True)
    summary = summarize(out, env) if not args.dry_run else {k: env.get(k) for k in SUMMARY_KEYS}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "report.md").write_text(report(summary, stages, args.dry_run))
    print(json.dumps(summary, indent=2))
    print(f"gpu_check: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
