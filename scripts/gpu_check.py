"""One command for a GPU session, in stages that each fit one 10-minute device call: the test suite on CUDA, every
GPU benchmark, and a summary of issue 10's numbers that every stage updates as soon as it ends.

  bash scripts/gpu_check.sh --stage tests          # install (DESIGN.md §7), then one stage; stages, in order:
      tests gemm sync rollout-eager rollout-compiled rl_step ar_decode summary
  python scripts/gpu_check.py --stage gemm sync    # several stages in one call (each has its own timeout)
  python scripts/gpu_check.py --stage summary      # rebuild summary.json / report.md from the files already there
  python scripts/gpu_check.py                      # every stage in order (longer than one device call)
  python scripts/gpu_check.py --dry-run            # no GPU needed: runs nothing, writes a summary with nulls and
                                                   # prints each stage's commands

Writes benchmarks/gpu/<device>-<YYYYMMDD>/ (or --out-dir). Each stage writes its own files (pytest-<i>.xml/.log per
test shard, fp8.jsonl, rollout-eager.jsonl, rollout-compiled.jsonl, profile_fp8.txt, rl_step.jsonl, ar_decode.jsonl
+ ar_decode.json, <stage>.log), rows flushed one by one as measured; when a stage ends (or hits its timeout, default
STAGE_TIMEOUT_S < 540 s) summary.json and report.md are rebuilt from every file in the directory and written
atomically, keeping values of earlier calls that this directory's files no longer give; stages.json records each
stage's last status. So a killed stage loses only itself.

Stage sizes, from DESIGN.md §7's H100 numbers (one LLaDA-8B forward at [32, 320]: BF16 eager 342 ms, compiled
261 ms + 37 s compile; FP8 compiled up to 120 s compile): rollout-eager = batch 32, gen 256 (128 forwards ≈ 44 s per
BF16 variant, less per FP8 one) for BF16 master / fused and FP8 cublas, triton, scaled_mm, torchao, with a budget
after which no variant starts; rollout-compiled = the same shape for BF16 master / fused and FP8 cublas, triton
(≈ 75–150 s each); rl_step = 1 warm-up + 1 timed step per precision; ar_decode = batch 8, 128 new tokens, the static
engine; tests = the suite in TEST_SHARDS parallel pytest processes.

summary.json holds exactly SUMMARY_KEYS: floats (null when not measured), gpu_tests_failed an int (null when the tests
did not run or a shard did not finish), and device, torch, triton, git_sha:
  gemm_triton_vs_cublas_blockwise_min  min over M ≥ 8192 shapes of (Triton GEMM TFLOP/s) / (cuBLAS blockwise TFLOP/s)
  gemm_triton_vs_bf16_min              min over M ≥ 8192 shapes of (Triton GEMM TFLOP/s) / (BF16 matmul TFLOP/s)
  rollout_fp8_vs_bf16_best             fastest FP8 rollout row / fastest BF16 row (eager or compiled), batch 32, gen 256
  rollout_fp8_vs_bf16_eager            fastest FP8 rollout row / the BF16 master's eager row
  rollout_fp8_peak_mem_ratio           that FP8 row's peak memory / the BF16 master eager row's
  sync_vs_floor                        sync_weights time / bandwidth floor (bench_fp8.py sync; lower is better)
  rl_step_fp8_vs_bf16                  BF16 step time / FP8 step time (bench_rl_step.py; > 1 = FP8 faster)
  rl_step_mismatch_fraction            mismatch-ELBO time / FP8 step time
  ar_decode_bf16_vs_floor, ar_decode_fp8_vs_bf16   bench_ar_decode.py's --json summary (ar_decode.json)
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
import time
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


STAGE_TIMEOUT_S = 510  # per stage: under the 540 s a stage may take, leaving a device call room for the install
TEST_SHARDS = 4  # parallel pytest processes of the tests stage (16 CPU cores on the device machine)
ROLLOUT = ("scripts/bench_rollout.py", "--batch", "32", "--gen-length", "256")


def _py(*args: str) -> list[str]:
    return [sys.executable, *args]


def test_shards(n: int = TEST_SHARDS) -> list[list[str]]:
    """The test files split into n groups of similar total size (largest first, each to the lightest group)."""
    files = sorted((REPO / "tests").glob("test_*.py"), key=lambda p: (-p.stat().st_size, p.name))
    shards: list[list[str]] = [[] for _ in range(n)]
    sizes = [0] * n
    for f in files:
        i = sizes.index(min(sizes))
        shards[i].append(str(f.relative_to(REPO)))
        sizes[i] += f.stat().st_size
    return [s for s in shards if s]


def _tests(out: Path) -> list[tuple[list[str], str]]:
    pytest = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10")
    return [(_py(*pytest, f"--junitxml={out / f'pytest-{i}.xml'}", *files), f"pytest-{i}.log")
            for i, files in enumerate(test_shards())]


# stage -> the commands it runs (in parallel), each with its log file name, given the output directory
STAGES: dict[str, Callable[[Path], list[tuple[list[str], str]]]] = {
    "tests": _tests,
    "gemm": lambda out: [(_py("scripts/bench_fp8.py", "--bench", "gemm", "--out", str(out / "fp8.jsonl")), "gemm.log")],
    "sync": lambda out: [(_py("scripts/bench_fp8.py", "--bench", "sync", "--out", str(out / "fp8.jsonl")), "sync.log")],
    "rollout-eager": lambda out: [(_py(*ROLLOUT, "--no-compile", "--backends", "cublas", "triton", "scaled_mm",
                                       "torchao", "--budget-s", "330", "--profile", str(out / "profile_fp8.txt"),
                                       "--out", str(out / "rollout-eager.jsonl")), "rollout-eager.log")],
    "rollout-compiled": lambda out: [(_py(*ROLLOUT, "--compiled-only", "--backends", "cublas", "triton",
                                          "--budget-s", "300", "--out", str(out / "rollout-compiled.jsonl")),
                                      "rollout-compiled.log")],
    "rl_step": lambda out: [(_py("scripts/bench_rl_step.py", "--rl-steps", "1", "--warmup", "1", "--out",
                                 str(out / "rl_step.jsonl")), "rl_step.log")],
    "ar_decode": lambda out: [(_py("scripts/bench_ar_decode.py", "--batch", "8", "--new-tokens", "128", "--repeats",
                                   "2", "--engines", "static", "--backends", "cublas", "triton", "--out",
                                   str(out / "ar_decode.jsonl"), "--json", str(out / "ar_decode.json")),
                             "ar_decode.log")],
}  # fmt: skip
STAGE_NAMES = (*STAGES, "summary")


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


def _junit_failed(xml_path: Path) -> int:
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)


def gpu_tests_failed(out: Path) -> int | None:
    """failures + errors over the test shards' junit XML files named in <out>/pytest-shards.json (None when the tests
    did not run or a shard wrote no XML, e.g. it timed out); a single <out>/pytest.xml as written before the shards."""
    shards = out / "pytest-shards.json"
    if shards.is_file():
        names = json.loads(shards.read_text())
        if not names or not all((out / n).is_file() for n in names):
            return None
        return sum(_junit_failed(out / n) for n in names)
    return _junit_failed(out / "pytest.xml") if (out / "pytest.xml").is_file() else None


ROLLOUT_SHAPE = (32, 256)  # (batch, gen_length) of the headline rollout ratios


def rollout_numbers(rows: list[dict]) -> dict[str, float | None]:
    """The three rollout ratios from bench_rollout.py rows (eager and compiled stages together; the last row per
    variant and shape wins), at batch 32 / gen 256 (else the largest measured shape): fastest FP8 row over the fastest
    BF16 row and over the BF16 master's eager row; that FP8 row's peak memory over the eager master's."""
    out: dict[str, float | None] = dict.fromkeys(
        ("rollout_fp8_vs_bf16_best", "rollout_fp8_vs_bf16_eager", "rollout_fp8_peak_mem_ratio"))
    latest: dict[tuple, dict] = {}
    for r in rows:
        if r.get("status") == "ok" and _float(r.get("tokens_per_s")) is not None:
            latest[(r.get("precision"), r.get("backend"), r.get("model"), r.get("compiled"), r.get("batch"),
                    r.get("gen_length"))] = r  # fmt: skip
    shapes = {(r.get("batch"), r.get("gen_length")) for r in latest.values()}
    if not shapes:
        return out
    shape = ROLLOUT_SHAPE if ROLLOUT_SHAPE in shapes else max(shapes)
    same = [r for r in latest.values() if (r.get("batch"), r.get("gen_length")) == shape]
    fp8 = [r for r in same if r.get("precision") == "fp8"]
    bf16 = [r for r in same if r.get("precision") == "bf16"]
    eager = [r for r in bf16 if r.get("model") == "master" and not r.get("compiled")]
    if not fp8:
        return out
    fastest = max(fp8, key=lambda r: r["tokens_per_s"])
    if bf16:
        out["rollout_fp8_vs_bf16_best"] = fastest["tokens_per_s"] / max(r["tokens_per_s"] for r in bf16)
    if eager:
        out["rollout_fp8_vs_bf16_eager"] = fastest["tokens_per_s"] / eager[0]["tokens_per_s"]
        if _float(fastest.get("peak_mem_gib")) and _float(eager[0].get("peak_mem_gib")):
            out["rollout_fp8_peak_mem_ratio"] = fastest["peak_mem_gib"] / eager[0]["peak_mem_gib"]
    return out


def environment() -> dict:
    """device, torch, triton, git_sha of this machine."""
    import torch

    from dllm_ais.analysis import bench_env

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
    rollout = rollout_numbers([r for name in ("rollout-eager.jsonl", "rollout-compiled.jsonl", "rollout.jsonl")
                               for r in _jsonl(out / name)])
    if all(v is None for v in rollout.values()) and (out / "rollout.json").is_file():  # bench_rollout.py --json
        rollout = json.loads((out / "rollout.json").read_text())
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
        "gpu_tests_failed": gpu_tests_failed(out),
        **env,
    }
    return {key: values[key] for key in SUMMARY_KEYS}


TARGETS = {  # acceptance bounds of issues 10, 14 and 17: (key, comparison, bound)
    "gemm_triton_vs_cublas_blockwise_min": (">=", 0.9),
    "rollout_fp8_vs_bf16_best": (">=", 1.4),
    "rollout_fp8_vs_bf16_eager": (">=", 2.2),
    "rollout_fp8_peak_mem_ratio": ("<=", 0.65),
    "sync_vs_floor": ("<=", 2.0),
    "ar_decode_bf16_vs_floor": ("<=", 2.0),
    "ar_decode_fp8_vs_bf16": (">=", 1.6),
    "gpu_tests_failed": ("<=", 0),
}


def report(summary: dict, stages: dict[str, str], dry_run: bool, profile: str | None = None) -> str:
    lines = [
        f"# GPU check: {summary['device']}",
        "",
        f"torch {summary['torch']}, triton {summary['triton']}, git {summary['git_sha']}",
        "",
    ]
    if dry_run:
        lines += ["Dry run: nothing was measured (every value is null).", ""]
    lines += ["| key | value | target |", "|---|---|---|"]
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
        lines += ["", "Stages (last status of each):", ""] + [f"- {name}: {status}" for name, status in stages.items()]
    lines += ["", "Rows: fp8.jsonl (GEMM + sync), rollout-eager.jsonl, rollout-compiled.jsonl, rl_step.jsonl, "
              "ar_decode.jsonl (+ ar_decode.json), pytest-<i>.xml.", ""]
    if profile:
        lines += ["## torch.profiler: one FP8 forward (rollout-eager stage)", "", "```", profile.rstrip(), "```", ""]
    return "\n".join(lines)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def run_stage(name: str, out: Path, timeout: int) -> str:
    """Run one stage's commands in parallel (each writing <out>/<log>), killing what is left at `timeout`; a short
    status string."""
    commands = STAGES[name](out)
    if name == "tests":  # which shard files make a complete run (a timed-out shard leaves its XML missing)
        for old in out.glob("pytest-*.xml"):
            old.unlink()
        (out / "pytest-shards.json").write_text(json.dumps([f"pytest-{i}.xml" for i in range(len(commands))]))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if len(commands) > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 4) // len(commands))))
    deadline = time.monotonic() + timeout
    procs, logs = [], []
    for cmd, log_name in commands:
        log = (out / log_name).open("w")
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env))
        logs.append(log)
    statuses = []
    for proc, log, (_, log_name) in zip(procs, logs, commands, strict=True):
        try:
            rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            statuses.append("ok" if rc == 0 else f"exit status {rc} (see {log_name})")
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            statuses.append(f"timed out after {timeout} s (see {log_name})")
        log.close()
    bad = [st for st in statuses if st != "ok"]
    return "ok" if not bad else "; ".join(bad)


def write_summary(out: Path, env: dict, stages: dict[str, str], dry_run: bool = False) -> dict:
    """Rebuild summary.json (values from the files in `out`; a null keeps the value an earlier call wrote) and
    report.md, each written atomically; stages are merged into stages.json."""
    from dllm_ais.atomic import atomic_write_text

    if dry_run:
        summary = {k: env.get(k) for k in SUMMARY_KEYS}
    else:
        summary = summarize(out, env)
        previous = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
        for key in SUMMARY_KEYS[:11]:
            if summary[key] is None and previous.get(key) is not None:
                summary[key] = previous[key]
    recorded = json.loads((out / "stages.json").read_text()) if (out / "stages.json").is_file() else {}
    recorded.update(stages)
    atomic_write_text(out / "stages.json", json.dumps(recorded, indent=2) + "\n")
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    profile = (out / "profile_fp8.txt").read_text() if (out / "profile_fp8.txt").is_file() else None
    atomic_write_text(out / "report.md", report(summary, recorded, dry_run, profile))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="where to write (default benchmarks/gpu/<device>-<YYYYMMDD>)")
    parser.add_argument("--stage", "--only", dest="stages", nargs="+", choices=STAGE_NAMES,
                        help="run these stages, in the order given (default: all; summary: only rebuild the summary)")
    parser.add_argument("--timeout", type=int, default=STAGE_TIMEOUT_S,
                        help=f"seconds per stage (default {STAGE_TIMEOUT_S})")
    parser.add_argument("--dry-run", action="store_true",
                        help="run nothing; print each stage's commands, write a summary of nulls (CPU is fine)")
    args = parser.parse_args(argv)

    env = environment()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
    out = Path(args.out_dir) if args.out_dir else REPO / "benchmarks" / "gpu" / f"{_slug(env['device'])}-{date}"
    out.mkdir(parents=True, exist_ok=True)
    names = [s for s in (args.stages or STAGES) if s != "summary"]
    if args.dry_run:
        for name in names:
            for cmd, log_name in STAGES[name](out):
                print(f"gpu_check: {name}: {' '.join(cmd)}  > {log_name}")
        summary = write_summary(out, env, {}, dry_run=True)
    else:
        import torch

        if names and not torch.cuda.is_available():
            print("gpu_check: no CUDA device here; use --dry-run on CPU", file=sys.stderr)
            return 2
        summary = None
        for name in names:
            print(f"gpu_check: {name} …", flush=True)
            t0 = time.monotonic()
            status = run_stage(name, out, args.timeout)
            print(f"gpu_check: {name}: {status} ({time.monotonic() - t0:.0f} s)", flush=True)
            summary = write_summary(out, env, {name: f"{status} ({time.monotonic() - t0:.0f} s)"})
        if summary is None:  # --stage summary
            summary = write_summary(out, env, {})
    print(json.dumps(summary, indent=2))
    print(f"gpu_check: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
