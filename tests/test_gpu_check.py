"""scripts/gpu_check.py (summary keys, parsing of every benchmark's rows), and the CPU smoke runs of the benchmarks it
drives: bench_fp8.py's GEMM rows (cuBLAS blockwise, Triton variants, ratios) and bench_rl_step.py."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXPECTED_KEYS = [
    "gemm_triton_vs_cublas_blockwise_min", "gemm_triton_vs_bf16_min", "rollout_fp8_vs_bf16_best",
    "rollout_fp8_vs_bf16_eager", "rollout_fp8_peak_mem_ratio", "sync_vs_floor", "rl_step_fp8_vs_bf16",
    "rl_step_mismatch_fraction", "ar_decode_bf16_vs_floor", "ar_decode_fp8_vs_bf16", "gpu_tests_failed",
    "device", "torch", "triton", "git_sha",
]  # fmt: skip


def test_dry_run_writes_a_summary_of_nulls(tmp_path):
    gpu_check = _script("gpu_check")
    assert gpu_check.main(["--dry-run", "--out-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary) == EXPECTED_KEYS
    assert all(summary[k] is None for k in EXPECTED_KEYS[:11])  # gpu_tests_failed included: the tests did not run
    assert isinstance(summary["device"], str) and summary["torch"] and summary["git_sha"]
    assert "not measured" in (tmp_path / "report.md").read_text()


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_reads_every_benchmark(tmp_path):
    gpu_check = _script("gpu_check")

    def ratio(M, metric, value):
        return dict(bench="gemm", backend="ratio", metric=metric, value=value, status="ok", shape=dict(M=M, N=1, K=1))

    _write_jsonl(tmp_path / "fp8.jsonl", [
        ratio(2048, "triton_vs_cublas_blockwise", 0.1),  # M < 8192: not counted
        ratio(8192, "triton_vs_cublas_blockwise", 0.95), ratio(32768, "triton_vs_cublas_blockwise", 0.91),
        ratio(8192, "triton_vs_bf16", 1.3), ratio(32768, "triton_vs_bf16", 1.2),
        dict(bench="gemm", backend="fp8_triton_gemm", metric="tflops", value=700.0, status="ok", shape=dict(M=8192)),
        dict(bench="sync", metric="floor_ms", value=7.0, status="ok"),
        dict(bench="sync", metric="sync_weights_ms", value=10.5, status="ok"),
    ])  # fmt: skip
    (tmp_path / "rollout.json").write_text(json.dumps(
        {"rollout_fp8_vs_bf16_best": 1.5, "rollout_fp8_vs_bf16_eager": 2.6, "rollout_fp8_peak_mem_ratio": 0.6,
         "rows": []}))  # fmt: skip
    _write_jsonl(tmp_path / "rl_step.jsonl", [
        dict(precision="bf16", status="ok", step_s=10.0),
        dict(precision="fp8", backend="cublas", status="failed", reason="x"),
        dict(precision="fp8", backend="auto", status="ok", step_s=8.0, step_speedup_vs_bf16=1.25,
             mismatch_fraction=0.2),
    ])  # fmt: skip
    _write_jsonl(tmp_path / "ar_decode.jsonl", [dict(status="ok"), dict(ar_decode_fp8_vs_bf16=1.1)])
    (tmp_path / "pytest.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="90">'
        "</testsuite></testsuites>"
    )
    env = dict(device="NVIDIA H100", torch="2.11", triton="3.6.0", git_sha="abc")
    summary = gpu_check.summarize(tmp_path, env)
    assert list(summary) == EXPECTED_KEYS
    assert summary["gemm_triton_vs_cublas_blockwise_min"] == 0.91
    assert summary["gemm_triton_vs_bf16_min"] == 1.2
    assert summary["rollout_fp8_vs_bf16_best"] == 1.5 and summary["rollout_fp8_peak_mem_ratio"] == 0.6
    assert summary["sync_vs_floor"] == pytest.approx(1.5)
    assert summary["rl_step_fp8_vs_bf16"] == 1.25 and summary["rl_step_mismatch_fraction"] == 0.2
    assert summary["ar_decode_fp8_vs_bf16"] == 1.1 and summary["ar_decode_bf16_vs_floor"] is None
    assert summary["gpu_tests_failed"] == 3 and isinstance(summary["gpu_tests_failed"], int)
    assert summary["device"] == "NVIDIA H100"
    text = gpu_check.report(summary, {"tests": "ok"}, dry_run=False)
    assert "| gemm_triton_vs_cublas_blockwise_min | 0.91 | >= 0.9: met |" in text
    assert "| gpu_tests_failed | 3 | <= 0: NOT met |" in text


def _rollout_row(precision, backend, model, compiled, tps, mem=None, batch=32, gen=256, status="ok"):
    row = dict(bench="rollout", precision=precision, backend=backend, model=model, compiled=compiled, batch=batch,
               gen_length=gen, status=status, tokens_per_s=tps)
    if mem is not None:
        row["peak_mem_gib"] = mem
    return row


def test_rollout_ratios_from_the_eager_and_compiled_stages(tmp_path):
    """BF16-best may come from the compiled stage; a re-run's later row replaces the earlier one; other shapes and
    failed rows do not count."""
    gpu_check = _script("gpu_check")
    _write_jsonl(tmp_path / "rollout-eager.jsonl", [
        _rollout_row("bf16", None, "master", False, 100.0, mem=40.0),
        _rollout_row("bf16", None, "fused", False, 120.0, mem=38.0),
        _rollout_row("fp8", "cublas", "fused", False, 200.0, mem=30.0),
        _rollout_row("fp8", "cublas", "fused", False, 250.0, mem=26.0),  # a later run of the same variant
        _rollout_row("fp8", "triton", "fused", False, 900.0, batch=8),  # another shape
        _rollout_row("fp8", "scaled_mm", "fused", False, 999.0, status="failed"),
    ])  # fmt: skip
    _write_jsonl(tmp_path / "rollout-compiled.jsonl", [_rollout_row("bf16", None, "master", True, 160.0, mem=45.0)])
    summary = gpu_check.summarize(tmp_path, dict(device="d", torch="t", triton="t", git_sha="g"))
    assert summary["rollout_fp8_vs_bf16_best"] == pytest.approx(250 / 160)
    assert summary["rollout_fp8_vs_bf16_eager"] == pytest.approx(250 / 100)
    assert summary["rollout_fp8_peak_mem_ratio"] == pytest.approx(26 / 40)


def test_test_shards_cover_every_test_file_once_and_a_missing_shard_gives_null(tmp_path):
    gpu_check = _script("gpu_check")
    shards = gpu_check.test_shards(4)
    files = [f for shard in shards for f in shard]
    assert len(shards) == 4 and sorted(files) == sorted(f"tests/{p.name}" for p in (SCRIPTS.parent / "tests").glob(
        "test_*.py")) and len(files) == len(set(files))  # fmt: skip
    (tmp_path / "pytest-shards.json").write_text(json.dumps(["pytest-0.xml", "pytest-1.xml"]))
    xml = '<testsuites><testsuite name="pytest" errors="{}" failures="{}" tests="9"></testsuite></testsuites>'
    (tmp_path / "pytest-0.xml").write_text(xml.format(0, 1))
    assert gpu_check.gpu_tests_failed(tmp_path) is None  # shard 1 did not finish: unknown, not "1 failure"
    (tmp_path / "pytest-1.xml").write_text(xml.format(2, 0))
    assert gpu_check.gpu_tests_failed(tmp_path) == 3


def test_each_stage_merges_its_keys_and_keeps_earlier_ones(tmp_path, monkeypatch):
    """write_summary after a stage: values from this directory's files, an earlier call's value kept where the files
    give none now; stages.json accumulates; report.md carries the profiler table."""
    gpu_check = _script("gpu_check")
    env = dict(device="NVIDIA H100", torch="2.11", triton="3.6.0", git_sha="abc")
    (tmp_path / "summary.json").write_text(json.dumps({"rl_step_fp8_vs_bf16": 1.3, "sync_vs_floor": 9.0}))
    _write_jsonl(tmp_path / "fp8.jsonl", [dict(bench="sync", metric="floor_ms", value=7.0, status="ok"),
                                          dict(bench="sync", metric="sync_weights_ms", value=14.0, status="ok")])
    (tmp_path / "profile_fp8.txt").write_text("# one forward\nName  Self CUDA\naten::mm 1 ms\n")
    gpu_check.write_summary(tmp_path, env, {"sync": "ok (30 s)"})
    gpu_check.write_summary(tmp_path, env, {"gemm": "timed out after 510 s (see gemm.log)"})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary) == EXPECTED_KEYS
    assert summary["sync_vs_floor"] == pytest.approx(2.0)  # from the files (not the stale 9.0)
    assert summary["rl_step_fp8_vs_bf16"] == 1.3  # kept: no rl_step rows here
    assert json.loads((tmp_path / "stages.json").read_text()) == {"sync": "ok (30 s)",
                                                                  "gemm": "timed out after 510 s (see gemm.log)"}
    text = (tmp_path / "report.md").read_text()
    assert "aten::mm 1 ms" in text and "- gemm: timed out" in text and not list(tmp_path.glob(".*tmp*"))


def test_stage_commands_use_flags_the_scripts_have_and_fit_the_time_limit(tmp_path, capsys):
    gpu_check = _script("gpu_check")
    assert gpu_check.STAGE_TIMEOUT_S < 540
    assert list(gpu_check.STAGE_NAMES) == ["tests", "gemm", "sync", "rollout-eager", "rollout-compiled", "rl_step",
                                           "ar_decode", "summary"]
    assert gpu_check.main(["--dry-run", "--out-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for name in gpu_check.STAGES:
        for cmd, _ in gpu_check.STAGES[name](tmp_path):
            assert f"gpu_check: {name}: {' '.join(cmd)}" in printed
            script = next((a for a in cmd if a.startswith("scripts/")), None)
            if script is None:
                continue
            source = (SCRIPTS.parent / script).read_text()
            for flag in (a for a in cmd if a.startswith("--")):
                assert f'"{flag}"' in source, (script, flag)


def test_gpu_check_refuses_to_run_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the CPU answer")
    assert _script("gpu_check").main(["--only", "gemm", "--out-dir", str(tmp_path)]) == 2


def test_bench_fp8_gemm_smoke_rows(tmp_path):
    out = tmp_path / "fp8.jsonl"
    _script("bench_fp8").main(["--smoke", "--bench", "gemm", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_backend = {(r["backend"], r["metric"], r["shape"]["N"], r["shape"]["K"]): r for r in rows}
    # --smoke runs on CPU tensors: the Triton rows need the interpreter, which conftest sets only on a CUDA-less machine
    triton_here = os.environ.get("TRITON_INTERPRET") == "1"
    for N, K in [(128, 128), (384, 128), (128, 384)]:
        for variant in ("fp8_triton_gemm", "fp8_triton_gemm_128x256", "fp8_triton_gemm_128x256_persistent"):
            assert by_backend[(variant, "tflops", N, K)]["status"] == ("ok" if triton_here else "skipped")
        if not triton_here:
            continue
        cublas = by_backend[("fp8_cublas_blockwise", "tflops", N, K)]
        if cublas["status"] == "skipped":
            assert "blockwise" in cublas["reason"]
        ratio = by_backend[("ratio", "triton_vs_bf16", N, K)]
        tflops = {b: by_backend[(b, "tflops", N, K)]["value"] for b in ("fp8_triton_gemm", "bf16_matmul")}
        assert ratio["value"] == pytest.approx(tflops["fp8_triton_gemm"] / tflops["bf16_matmul"])


def test_bench_rl_step_smoke(tmp_path):
    out = tmp_path / "rl.jsonl"
    _script("bench_rl_step").main(["--smoke", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["precision"], r["backend"], r["status"]) for r in rows] == [("bf16", None, "ok"), ("fp8", "torch", "ok")]
    stages = ("rollout_s", "mismatch_s", "logp_s", "update_s", "sync_s")
    for r in rows:
        assert all(r[s] >= 0 for s in stages) and r["rollout_s"] > 0 and r["update_s"] > 0
        assert sum(r[s] for s in stages) <= r["step_s"] + 1e-3
        assert {"rl_step", "cpu"} <= {r["bench"], r["device"]} and r["lora_r"] == 4
    bf16, fp8 = rows
    assert bf16["mismatch_s"] < fp8["mismatch_s"]  # μ = π_old for BF16: no ELBO passes
    assert fp8["sync_s"] > 0 and fp8["mismatch_fraction"] == pytest.approx(fp8["mismatch_s"] / fp8["step_s"])
    assert fp8["step_speedup_vs_bf16"] == pytest.approx(bf16["step_s"] / fp8["step_s"])
