"""scripts/gpu_quick.py (`gpu_check.sh --quick`): the CPU dry run executes every part at tiny shapes with datasets,
math_verify and torchao unimportable (as on the bare device image) and writes every summary key; the summary's
ratios and the test counts are computed from the rows as documented."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GPU_ONLY = {  # keys that need a CUDA device (memory statistics, cuBLAS) or a known GPU kind (the plan's predictions)
    "model_gib_bf16_master", "model_gib_fp8_copy", "peak_gib_bf16_forward", "peak_gib_fp8_forward",
    "fp8_peak_mem_ratio", "peak_gib_rl_microbatch", "peak_gib_rl_microbatch_checkpointed",
    "gemm_triton_vs_cublas_min", "gemm_cublas_vs_bf16_min", "cublas_rejected_m", "predicted",
    # CUDA graphs (the CPU dry run writes "needs CUDA" rows for them), the plan's RL step (a known GPU kind)
    "window_ms_bf16_graphed", "window_ms_fp8_graphed", "window_fp8_graphed_vs_bf16_eager",
    "window_fp8_graphed_vs_bf16_graphed", "plan_rl_step_s", "rl_step_vs_plan", "rl_peak_gib", "plan_rl_peak_gib",
    "rl_peak_vs_plan",
}  # fmt: skip


def _quick(name: str = "gpu_quick_summary"):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_cpu_dry_run_writes_every_key_with_the_bare_image_imports_blocked(tmp_path):
    quick = _quick()
    env = {**os.environ, "GPU_CHECK_SKIP_INSTALL": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--quick", "--device", "cpu", "--tiny", "--out-dir",
                           str(tmp_path), "--block-imports", "datasets,math_verify,torchao"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary) == list(quick.QUICK_KEYS)
    parts = _quick("gpu_quick").PARTS
    assert list(summary["parts"]) == list(parts)
    assert all(status.startswith("ok") for status in summary["parts"].values()), summary["parts"]
    for key in quick.QUICK_KEYS:
        if key in GPU_ONLY:
            assert summary[key] is None, key
        else:
            assert summary[key] is not None, key
    assert summary["fp8_backend"] == "torch" and summary["gpu_tests_failed"] == 0 and summary["gpu_tests_passed"] > 0
    # the imports really were blocked in the parts, and nothing failed
    rows = quick.read_rows(tmp_path)
    assert not [r for r in rows if r["status"] == "failed"], [r for r in rows if r["status"] == "failed"]
    assert {r["part"] for r in rows} == set(parts)
    graphed = [r for r in rows if r["section"] == "graphed" and r["metric"] != "section_s"]
    assert len(graphed) == 2 and all(r["status"] == "skipped" and "needs CUDA" in r["reason"] for r in graphed)
    # the RL step ran both steps, wrote and verified a checkpoint, and reports every phase
    assert summary["rl_checkpoint_verified"] is True and summary["rl_prompts"] == 1 and summary["rl_nfe"] > 0
    assert set(summary["rl_phases"]) == {"rollout", "likelihood", "update", "sync"}
    assert all(v["measured_s"] > 0 for p, v in summary["rl_phases"].items() if p != "sync")
    assert list(summary["parts"]) == ["window", "rl_step", "eager", "compiled", "tests"]  # missed figures first
    report = (tmp_path / "report.md").read_text()
    assert "not measured" in report and "RL step by phase" in report
    for name in quick.PROFILES:  # each profile was written, with its header, and the report shows it
        text = (tmp_path / name).read_text()
        assert re.search(r"# wall [0-9.]+ ms under the profiler; \d+ device kernels", text), text[:300]
        assert text.splitlines()[0] in report


def test_blocked_imports_look_absent(tmp_path):
    code = ("import importlib.util, sys; sys.path.insert(0, 'scripts'); import gpu_quick; "
            "gpu_quick.block_imports('json_not_really, email'); "
            "assert importlib.util.find_spec('email') is None\n"
            "try:\n    import email\nexcept ModuleNotFoundError:\n    print('absent')")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "absent", out.stderr


def _write(out: Path, rows: list[dict]) -> None:
    (out / "quick.jsonl").write_text("".join(json.dumps({"status": "ok", **r}) + "\n" for r in rows) + "{cut")


def test_summary_from_rows(tmp_path):
    quick = _quick()
    gemm = lambda metric, value, M: dict(section="gemm", metric=metric, value=value, shape={"M": M, "N": 1, "K": 1})  # noqa: E731
    _write(tmp_path, [
        dict(metric="fp8_backend", value="cublas"),
        dict(metric="forward_ms_bf16_eager", value=330.0), dict(metric="forward_ms_bf16_fused_eager", value=320.0),
        dict(metric="forward_ms_fp8_cublas_eager", value=165.0),
        dict(metric="forward_ms_fp8_triton_eager", value=150.0),
        dict(metric="forward_ms_bf16_compiled", value=260.0),
        dict(metric="forward_ms_bf16_fused_compiled", value=250.0),
        dict(metric="forward_ms_fp8_cublas_compiled", value=200.0),
        dict(metric="window_ms_bf16", value=20.0), dict(metric="window_ms_fp8", value=12.0),
        dict(metric="window_ms_fp8_compiled", value=10.0), dict(metric="window_ms_bf16_graphed", value=16.0),
        dict(metric="window_ms_fp8_graphed", value=8.0),
        dict(metric="block_ms_fp8_graphed", value=100.0), dict(metric="block_ms_bf16_uncached", value=1200.0),
        dict(metric="sync_fair_floor_ms", value=12.0),
        dict(metric="prompts", value=3), dict(metric="nfe", value=256), dict(metric="rl_step_s", value=30.0),
        dict(metric="plan_rl_step_s", value=20.0), dict(metric="peak_gib", value=40.0),
        dict(metric="plan_peak_gib", value=38.0), dict(metric="checkpoint_verified", value=True),
        dict(metric="rollout_s", value=10.0), dict(metric="plan_rollout_s", value=3.0),
        dict(metric="model_gib_bf16_master", value=16.0), dict(metric="forward_activation_gib_bf16_eager", value=2.0),
        dict(metric="model_gib_fp8_copy", value=9.0), dict(metric="forward_activation_gib_fp8_cublas_eager", value=1.0),
        dict(metric="sync_ms", value=30.0), dict(metric="sync_floor_ms", value=10.0),
        gemm("tflops_fp8_triton_gemm", 600.0, 8), gemm("tflops_fp8_cublas_blockwise", 1000.0, 8),
        gemm("tflops_bf16_matmul", 700.0, 8),
        gemm("tflops_fp8_triton_gemm", 900.0, 16), gemm("tflops_fp8_cublas_blockwise", 1000.0, 16),
        gemm("tflops_bf16_matmul", 800.0, 16),
        dict(metric="forward_ms_dream_bf16_eager", value=300.0), dict(metric="forward_ms_dream_fp8_eager", value=150.0),
        dict(metric="window_ms_dream_bf16", value=30.0), dict(metric="window_ms_dream_fp8", value=40.0),
        dict(metric="gpu_tests_failed", value=2, status="partial"),
        dict(metric="forward_ms_fp8_scaled_mm_eager", value=None, status="failed"),
    ])  # fmt: skip
    env = dict(device="NVIDIA H100 80GB HBM3", torch="2.11", triton="3.6.0", git_sha="abc")
    s = quick.summarize(tmp_path, env, {"eager": "ok"})
    assert list(s) == list(quick.QUICK_KEYS)
    assert s["fp8_vs_bf16_eager"] == pytest.approx(2.0)  # the default backend's row, not the faster triton one
    assert s["forward_ms_bf16_compiled_best"] == 250.0
    assert s["fp8_vs_bf16_best"] == pytest.approx(250.0 / 165.0)  # best BF16 (fused compiled) / best FP8 (eager)
    assert s["window_fp8_vs_bf16"] == pytest.approx(20.0 / 12.0)  # eager vs eager (compiled has its own key)
    assert s["window_fp8_graphed_vs_bf16_eager"] == pytest.approx(2.5)
    assert s["window_fp8_graphed_vs_bf16_graphed"] == pytest.approx(2.0)
    assert s["block_speedup"] == pytest.approx(12.0) and s["sync_vs_fair_floor"] == pytest.approx(2.5)
    assert s["rl_step_vs_plan"] == pytest.approx(1.5) and s["rl_peak_vs_plan"] == pytest.approx(40 / 38)
    assert s["rl_phases"]["rollout"] == {"measured_s": 10.0, "plan_s": 3.0}
    assert s["rl_phases"]["update"] == {"measured_s": None, "plan_s": None}
    assert s["peak_gib_bf16_forward"] == 18.0 and s["fp8_peak_mem_ratio"] == pytest.approx(10.0 / 18.0)
    assert s["sync_vs_floor"] == pytest.approx(3.0)
    assert s["gemm_triton_vs_cublas_min"] == pytest.approx(0.6) and s["gemm_cublas_vs_bf16_min"] == pytest.approx(1.25)
    assert s["gpu_tests_failed"] == 2
    assert s["dream_fp8_vs_bf16_eager"] == pytest.approx(2.0) and s["dream_window_fp8_vs_bf16"] == pytest.approx(0.75)
    report = quick.report(s, tmp_path)
    assert "| sync_vs_floor | 3 |" in report and "NOT met" in report and "| fp8_vs_bf16_eager | 2 |" in report
    assert "| rl_step_vs_plan | 1.5 |  | within 0.25: NOT met |" in report  # 50 % off the plan
    assert "| rl_peak_vs_plan | 1.05 |  | within 0.1: met |" in report  # 5 % off
    assert "| block_speedup | 12 |  | >= 10.0: met |" in report
    assert quick.gpu_kind(env["device"]) == "h100" and quick.gpu_kind("cpu") is None


def test_best_needs_a_compiled_bf16_row(tmp_path):
    """Without any compiled BF16 row the 'vs best BF16' ratio is not claimed (eager BF16 is not the best BF16)."""
    quick = _quick()
    _write(tmp_path, [dict(metric="fp8_backend", value="torch"), dict(metric="forward_ms_bf16_eager", value=3.0),
                      dict(metric="forward_ms_fp8_torch_eager", value=2.0)])  # fmt: skip
    s = quick.summarize(tmp_path, dict(device="cpu", torch="x", triton="y", git_sha="z"), {})
    assert s["fp8_vs_bf16_eager"] == pytest.approx(1.5) and s["fp8_vs_bf16_best"] is None


def test_count_tests_reads_complete_and_cut_logs():
    quick = _quick()
    log = ("tests/test_a.py::test_x PASSED [ 10%]\ntests/test_a.py::test_y[1-2] FAILED [ 20%]\n"
           "tests/test_b.py::test_z SKIPPED (needs CUDA) [ 30%]\ntests/test_b.py::test_w ERROR [ 40%]\n"
           "tests/test_b.py::test_v ")  # cut mid-line by the timeout
    assert quick.count_tests(log) == {"passed": 1, "failed": 2, "skipped": 1}


def test_failures_are_written_when_they_happen(tmp_path):
    """The tests part's plugin writes a failure's traceback at once: a run killed at its limit still says why."""
    (tmp_path / "test_dies.py").write_text(
        "import time\n\ndef test_fails():\n    assert 1 == 2, 'the reason'\n\ndef test_hangs():\n    time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "pytest_report_now",
                             str(tmp_path / "test_dies.py")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    out = ""
    for line in proc.stdout:  # until the failure's reason is out; the run is then killed inside test_hangs
        out += line
        if "the reason" in line or "test_hangs PASSED" in line:
            break
    proc.kill()
    out += proc.communicate()[0]
    assert "--- " in out and "test_fails failed (call)" in out and "the reason" in out, out[-2000:]
    assert "short test summary" not in out  # killed in test_hangs, before pytest's own report
