"""The quick GPU check's summary: summary.json (QUICK_KEYS exactly) and report.md from the rows scripts/gpu_quick.py
writes to <out>/quick.jsonl, the targets, and the plan's predictions beside the measured figures. Importing this
module imports no torch (environment() does, when called)."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUICK_KEYS = (
    # the figures the H200 run missed (issue 33): window step eager / graphed / compiled, one dual-cache block, sync
    "window_ms_bf16", "window_ms_fp8", "window_fp8_vs_bf16", "window_ms_bf16_graphed", "window_ms_fp8_graphed",
    "window_ms_bf16_compiled", "window_ms_fp8_compiled", "window_fp8_graphed_vs_bf16_eager",
    "window_fp8_graphed_vs_bf16_graphed", "block_ms_fp8", "block_ms_bf16_uncached", "block_speedup",
    "sync_ms", "sync_floor_ms", "sync_fair_floor_ms", "sync_vs_floor", "sync_vs_fair_floor",
    # one whole RL step next to the plan
    "rl_prompts", "rl_nfe", "rl_step_s", "plan_rl_step_s", "rl_step_vs_plan", "rl_phases", "rl_peak_gib",
    "plan_rl_peak_gib", "rl_peak_vs_plan", "rl_checkpoint_verified",
    # the forward, memory, GEMMs
    "forward_ms_bf16_eager", "forward_ms_bf16_fused_eager", "forward_ms_bf16_compiled_best", "forward_ms_fp8_eager",
    "forward_ms_fp8_compiled", "fp8_backend", "fp8_vs_bf16_eager", "fp8_vs_bf16_best", "model_gib_bf16_master",
    "model_gib_fp8_copy", "peak_gib_bf16_forward", "peak_gib_fp8_forward", "fp8_peak_mem_ratio",
    "peak_gib_rl_microbatch", "peak_gib_rl_microbatch_checkpointed", "gemm_triton_vs_cublas_min",
    "gemm_cublas_vs_bf16_min", "cublas_rejected_m",
    # Dream-7B's shapes (scripts/gpu_quick_dream.py): the uncached step and the dual-cache window step
    "forward_ms_dream_bf16_eager", "forward_ms_dream_fp8_eager", "dream_fp8_vs_bf16_eager", "window_ms_dream_bf16",
    "window_ms_dream_fp8", "dream_window_fp8_vs_bf16",
    # the kernel tests, then what the run was
    "gpu_tests_passed", "gpu_tests_failed", "predicted", "parts", "device", "torch", "triton", "git_sha",
)  # fmt: skip
TARGETS = {  # issues 28 and 33: (comparison, bound); "within" b: |value − 1| <= b
    "window_fp8_graphed_vs_bf16_eager": (">=", 2.0),
    "window_fp8_graphed_vs_bf16_graphed": (">=", 1.5),
    "block_speedup": (">=", 10.0),
    "sync_vs_fair_floor": ("<=", 2.0),
    "rl_step_vs_plan": ("within", 0.25),
    "rl_peak_vs_plan": ("within", 0.10),
    "fp8_vs_bf16_eager": (">=", 1.7),
    "fp8_vs_bf16_best": (">=", 1.3),
    "gpu_tests_failed": ("<=", 0),
}
PREDICTED = {  # summary key -> key of dllm_ais.plan.predict_quick(gpu) measuring the same thing (its docstring;
    # its peak_gib_bf16_master / _fp8_copy are whole sampler steps, float64 sampling tail included, not one forward)
    "forward_ms_bf16_eager": "forward_ms_bf16",
    "forward_ms_fp8_eager": "forward_ms_fp8",
    "peak_gib_rl_microbatch": "peak_gib_rl_microbatch",
    "sync_floor_ms": "sync_ms_floor_linears",
}


PROFILES = {  # file the window and eager parts write -> what it profiled
    "profile_fp8.txt": "one FP8 forward",
    "profile_window.txt": "one dual-cache window step, BF16 then FP8 (window_fp8_vs_bf16)",
    "profile_sync.txt": "one weight sync (sync_vs_fair_floor)",
}
PREDICTED_NAMES = {v: k for k, v in PREDICTED.items()}
NOT_IN_TABLE = {"predicted", "parts", "device", "torch", "triton", "git_sha", "rl_phases"}
RL_PHASES = ("rollout", "likelihood", "update", "sync")
"""scripts/gpu_quick_rl.py's phases, each measured (<phase>_s) and planned (plan_<phase>_s)."""


def met(value: float, target: tuple[str, float]) -> bool:
    op, bound = target
    return value >= bound if op == ">=" else value <= bound if op == "<=" else abs(value - 1) <= bound


def read_rows(out: Path) -> list[dict]:
    path = out / "quick.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            continue
    return rows



def count_tests(log: str) -> dict[str, int]:
    """passed / failed (FAILED + ERROR) / skipped from pytest -v lines (complete or cut short by a timeout)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for m in re.finditer(r"^\S+::\S+.*? (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", log, re.MULTILINE):
        word = m.group(1)
        counts["passed" if word in ("PASSED", "XFAIL", "XPASS") else "skipped" if word == "SKIPPED" else
               "failed"] += 1  # fmt: skip
    return counts



def _last(rows: list[dict], metric: str):
    values = [r["value"] for r in rows if r.get("metric") == metric and r.get("status") in ("ok", "partial")]
    return values[-1] if values else None


def _ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def predictions(gpu: str | None) -> dict | None:
    """dllm_ais.plan.predict_quick(gpu) when the plan module is there (None otherwise, or off CUDA)."""
    if not gpu:
        return None
    try:
        from dllm_ais.plan import predict_quick
    except ImportError:
        return None
    try:
        return predict_quick(gpu)
    except Exception as e:  # a prediction must never cost the measurement
        return {"error": f"{type(e).__name__}: {e}"}


def gpu_kind(device_name: str) -> str | None:
    """'h100' / 'h200' / 'a100' from a CUDA device name (None for anything else)."""
    for kind in ("h200", "h100", "a100"):
        if kind in device_name.lower():
            return kind
    return None


def dream_values(rows: list[dict]) -> dict:
    """The Dream-7B rows and their FP8-vs-BF16 ratios (BF16 ms / FP8 ms)."""
    names = ("forward_ms_dream_bf16_eager", "forward_ms_dream_fp8_eager", "window_ms_dream_bf16", "window_ms_dream_fp8")
    v = {name: _last(rows, name) for name in names}
    return {**{k: v[k] for k in names[:2]},
            "dream_fp8_vs_bf16_eager": _ratio(v["forward_ms_dream_bf16_eager"], v["forward_ms_dream_fp8_eager"]),
            **{k: v[k] for k in names[2:]},
            "dream_window_fp8_vs_bf16": _ratio(v["window_ms_dream_bf16"], v["window_ms_dream_fp8"])}


def summarize(out: Path, env: dict, parts: dict[str, str]) -> dict:
    """summary.json's dict (QUICK_KEYS exactly) from <out>/quick.jsonl."""
    rows = read_rows(out)
    backend = _last(rows, "fp8_backend")
    fp8_eager = _last(rows, f"forward_ms_fp8_{backend}_eager")
    fp8_compiled = _last(rows, f"forward_ms_fp8_{backend}_compiled")
    bf16_eager = _last(rows, "forward_ms_bf16_eager")
    bf16_fused = _last(rows, "forward_ms_bf16_fused_eager")
    compiled = [v for v in (_last(rows, "forward_ms_bf16_compiled"), _last(rows, "forward_ms_bf16_fused_compiled"))
                if v is not None]
    bf16_all = [v for v in (bf16_eager, bf16_fused, *compiled) if v is not None]
    fp8_all = [v for v in (fp8_eager, fp8_compiled) if v is not None]
    master_gib, fp8_gib = _last(rows, "model_gib_bf16_master"), _last(rows, "model_gib_fp8_copy")
    act_bf16 = _last(rows, "forward_activation_gib_bf16_eager")
    act_fp8 = _last(rows, f"forward_activation_gib_fp8_{backend}_eager")
    peak_bf16 = master_gib + act_bf16 if master_gib is not None and act_bf16 is not None else None
    peak_fp8 = fp8_gib + act_fp8 if fp8_gib is not None and act_fp8 is not None else None
    gemm = {}
    for r in rows:
        if r.get("section") == "gemm" and r.get("status") == "ok" and "shape" in r:
            gemm.setdefault(json.dumps(r["shape"], sort_keys=True), {})[r["metric"]] = r["value"]
    def ratios(a: str, b: str) -> list[float]:  # per GEMM shape where both were measured
        return [r for g in gemm.values() if (r := _ratio(g.get(f"tflops_{a}"), g.get(f"tflops_{b}"))) is not None]

    tri_vs_cublas = ratios("fp8_triton_gemm", "fp8_cublas_blockwise")
    cublas_vs_bf16 = ratios("fp8_cublas_blockwise", "bf16_matmul")
    w = {name: _last(rows, f"window_ms_{name}") for name in ("bf16", "fp8", "bf16_graphed", "fp8_graphed",
                                                              "bf16_compiled", "fp8_compiled")}  # fmt: skip
    block_fp8 = _last(rows, "block_ms_fp8_graphed") or _last(rows, "block_ms_fp8_eager")
    block_bf16 = _last(rows, "block_ms_bf16_uncached")
    sync_ms = _last(rows, "sync_ms")
    rl_step, plan_step = _last(rows, "rl_step_s"), _last(rows, "plan_rl_step_s")
    rl_peak, plan_peak = _last(rows, "peak_gib"), _last(rows, "plan_peak_gib")
    phases = {p: {"measured_s": _last(rows, f"{p}_s"), "plan_s": _last(rows, f"plan_{p}_s")} for p in RL_PHASES}
    values = {
        **{f"window_ms_{name}": value for name, value in w.items()},
        "window_fp8_vs_bf16": _ratio(w["bf16"], w["fp8"]),
        "window_fp8_graphed_vs_bf16_eager": _ratio(w["bf16"], w["fp8_graphed"]),
        "window_fp8_graphed_vs_bf16_graphed": _ratio(w["bf16_graphed"], w["fp8_graphed"]),
        "block_ms_fp8": block_fp8,
        "block_ms_bf16_uncached": block_bf16,
        "block_speedup": _ratio(block_bf16, block_fp8),
        "sync_ms": sync_ms,
        "sync_floor_ms": _last(rows, "sync_floor_ms"),
        "sync_fair_floor_ms": _last(rows, "sync_fair_floor_ms"),
        "sync_vs_floor": _ratio(sync_ms, _last(rows, "sync_floor_ms")),
        "sync_vs_fair_floor": _ratio(sync_ms, _last(rows, "sync_fair_floor_ms")),
        "rl_prompts": _last(rows, "prompts"),
        "rl_nfe": _last(rows, "nfe"),
        "rl_step_s": rl_step,
        "plan_rl_step_s": plan_step,
        "rl_step_vs_plan": _ratio(rl_step, plan_step),
        "rl_phases": phases if any(v["measured_s"] is not None for v in phases.values()) else None,
        "rl_peak_gib": rl_peak,
        "plan_rl_peak_gib": plan_peak,
        "rl_peak_vs_plan": _ratio(rl_peak, plan_peak),
        "rl_checkpoint_verified": _last(rows, "checkpoint_verified"),
        "forward_ms_bf16_eager": bf16_eager,
        "forward_ms_bf16_fused_eager": bf16_fused,
        "forward_ms_bf16_compiled_best": min(compiled) if compiled else None,
        "forward_ms_fp8_eager": fp8_eager,
        "forward_ms_fp8_compiled": fp8_compiled,
        "fp8_backend": backend,
        "fp8_vs_bf16_eager": _ratio(bf16_eager, fp8_eager),
        "fp8_vs_bf16_best": _ratio(min(bf16_all), min(fp8_all)) if bf16_all and fp8_all and compiled else None,
        "model_gib_bf16_master": master_gib,
        "model_gib_fp8_copy": fp8_gib,
        "peak_gib_bf16_forward": peak_bf16,
        "peak_gib_fp8_forward": peak_fp8,
        "fp8_peak_mem_ratio": _ratio(peak_fp8, peak_bf16),
        "peak_gib_rl_microbatch": _last(rows, "peak_gib_rl_microbatch"),
        "peak_gib_rl_microbatch_checkpointed": _last(rows, "peak_gib_rl_microbatch_checkpointed"),
        "gemm_triton_vs_cublas_min": min(tri_vs_cublas) if tri_vs_cublas else None,
        "gemm_cublas_vs_bf16_min": min(cublas_vs_bf16) if cublas_vs_bf16 else None,
        "cublas_rejected_m": _last(rows, "cublas_rejected_m"),
        **dream_values(rows),
        "gpu_tests_passed": _last(rows, "gpu_tests_passed"),
        "gpu_tests_failed": _last(rows, "gpu_tests_failed"),
        "predicted": predictions(gpu_kind(env["device"])),
        "parts": parts,
        **env,
    }
    return {key: values[key] for key in QUICK_KEYS}


def _shown(value) -> str:
    if value is None:
        return "not measured"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def report(summary: dict, out: Path) -> str:
    lines = [f"# GPU quick check: {summary['device']}", "",
             f"torch {summary['torch']}, triton {summary['triton']}, git {summary['git_sha']}; FP8 backend "
             f"{summary['fp8_backend']}. Command: `bash scripts/gpu_check.sh --quick` (scripts/gpu_quick.py).", "",
             "| key | measured | plan's prediction | target |", "|---|---|---|---|"]  # fmt: skip
    predicted = summary["predicted"] or {}
    missed = []
    for key in (k for k in QUICK_KEYS if k not in NOT_IN_TABLE):
        value, target = summary[key], TARGETS.get(key)
        verdict = ""
        if target is not None:
            if value is None:
                verdict = f"{target[0]} {target[1]} (not measured)"
            else:
                ok = met(value, target)
                verdict = f"{target[0]} {target[1]}: {'met' if ok else 'NOT met'}"
                if not ok:
                    missed.append(key)
        pred = predicted.get(PREDICTED.get(key, ""), None) if isinstance(predicted, dict) else None
        lines.append(f"| {key} | {_shown(value)} | {_shown(pred) if key in PREDICTED else ''} | {verdict} |")
    if isinstance(predicted, dict) and isinstance(predicted.get("sources"), dict):
        gpu = predicted.get("gpu")
        lines += ["", f"Predictions: dllm_ais.plan.predict_quick({gpu!r}), from its model and the rows committed "
                  "before this run:"]
        lines += [f"- {PREDICTED_NAMES.get(k, k)}: {note}" for k, note in predicted["sources"].items()]
    elif isinstance(predicted, dict) and predicted.get("error"):
        lines += ["", f"Predictions failed: {predicted['error']}"]
    elif not predicted:
        lines += ["", "Predictions: none (dllm_ais.plan.predict_quick unavailable or not a known GPU kind)."]
    lines += ["", "Forward = one sampler step without a cache at [batch 32, canvas 320]: the whole canvas through the "
              "model, the current 32-token block's logits out (diffusion_sample's call). Window = a dual-cache step: "
              "[32 × 32] tokens against the cached canvas (eager, replayed from a CUDA graph, compiled). Block = one "
              "dual-cache block at the fixed schedule (1 refresh + 15 window steps; FP8 graphed on CUDA) against the "
              "BF16 master's 16 uncached forwards. best = fastest of eager and compiled rows.", "",
              "Parts:", ""] + [f"- {name}: {status}" for name, status in summary["parts"].items()]
    if summary["rl_phases"]:
        lines += ["", f"RL step by phase (second of two steps; {summary['rl_prompts']} prompt(s) × G, NFE "
                  f"{summary['rl_nfe']}; the plan re-made at that NFE):", "", "| phase | measured s | plan s |",
                  "|---|---|---|"]  # fmt: skip
        lines += [f"| {p} | {_shown(v['measured_s'])} | {_shown(v['plan_s'])} |" for p, v in
                  summary["rl_phases"].items()]  # fmt: skip
    if missed:
        lines += ["", "Missed targets: " + ", ".join(missed) + " (the profiles below are of the calls they time)."]
    for name, what in PROFILES.items():
        profile = out / name
        if profile.is_file():
            lines += ["", f"## Profile: {what}", "", "```", profile.read_text().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, env: dict, parts: dict[str, str]) -> dict:
    from dllm_ais.atomic import atomic_write_text

    summary = summarize(out, env, parts)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(out / "report.md", report(summary, out))
    return summary


def environment(device: str) -> dict:
    import torch

    from dllm_ais.analysis import bench_env

    sha, dirty = bench_env.git_commit(REPO)
    return {
        "device": bench_env.device_name(torch.device(device)),
        "torch": bench_env.version("torch"),
        "triton": bench_env.version("triton"),
        "git_sha": sha + ("+uncommitted" if dirty else ""),  # (a copied tree whose .git is older reads as changed)
    }
