"""scripts/bench_rollout.py: --smoke runs on CPU and writes one well-formed JSON row per measurement and the --json
summary (ratios recomputed from the rows); without CUDA the full benchmark writes skipped rows with the reason (and
builds no model)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_rollout.py"
ENV_FIELDS = ("bench", "device", "torch", "triton", "git_sha", "git_dirty", "smoke", "time")
RECORD_FIELDS = ("shape", "batch", "prompt_len", "gen_length", "block_length", "steps", "temperature", "precision",
                 "backend", "model", "compiled", "status")


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_rollout", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_smoke_writes_rows(tmp_path):
    out, summary_path = tmp_path / "x.jsonl", tmp_path / "x.json"
    _load_script().main(["--smoke", "--out", str(out), "--json", str(summary_path),
                         "--backends", "torch", "scaled_mm", "torchao", "no-such"])
    rows = _rows(out)
    by_key = {(r["precision"], r["backend"], r["model"], r["compiled"]): r for r in rows}
    # (bf16 master, bf16 fused, 4 FP8 backends) × (eager, compiled), one shape (batch 2, gen_length 16)
    assert len(rows) == len(by_key) == 12
    for r in rows:
        assert all(k in r for k in ENV_FIELDS + RECORD_FIELDS), sorted(set(ENV_FIELDS + RECORD_FIELDS) - set(r))
        assert r["bench"] == "rollout" and r["smoke"] is True and r["device"] and r["git_sha"] and r["torch"]
        assert r["shape"]["d_model"] == 128 and r["shape"]["n_layers"] == 2
        assert (r["batch"], r["gen_length"], r["steps"], r["block_length"]) == (2, 16, 8, 8)
        assert r["status"] in ("ok", "skipped"), r.get("reason")
        if r["status"] == "ok":
            assert r["tokens_per_s"] > 0 and r["total_s"] > 0 and "reason" not in r
            assert abs(r["tokens_per_s"] - 2 * 16 / r["total_s"]) < 1e-6 * r["tokens_per_s"]
            assert "peak_mem_gib" not in r  # CPU: no CUDA memory statistics
        else:
            assert isinstance(r["reason"], str) and r["reason"] and "tokens_per_s" not in r
        if r["compiled"]:  # the sampler compiles on CUDA only
            assert r["status"] == "skipped"
            assert r["backend"] in ("torchao", "no-such") or "compiled rollouts need CUDA" in r["reason"]
    eager = by_key["bf16", None, "master", False]
    ok = [r for r in rows if r["status"] == "ok"]
    assert {(r["precision"], r["backend"], r["model"]) for r in ok} >= {("bf16", None, "master"),
                                                                        ("bf16", None, "fused"),
                                                                        ("fp8", "torch", "fused")}
    best = max((r for r in ok if r["precision"] == "bf16"), key=lambda r: r["tokens_per_s"])
    for r in ok:  # as emitted: FP8 rows come after every BF16 row, so their ratios are final
        assert r["speedup_vs_bf16_eager"] == pytest.approx(r["tokens_per_s"] / eager["tokens_per_s"])
        if r["precision"] == "fp8":
            assert r["speedup_vs_bf16_best"] == pytest.approx(r["tokens_per_s"] / best["tokens_per_s"])
    fp8 = by_key["fp8", "torch", "fused", False]
    assert fp8["build_s"] > 0
    assert by_key["fp8", "torchao", "fused", False]["status"] == "skipped"
    assert "CUDA" in by_key["fp8", "torchao", "fused", False]["reason"]
    assert "no-such" in by_key["fp8", "no-such", "fused", False]["reason"]

    summary = json.loads(summary_path.read_text())
    assert {"device", "torch", "triton", "git_sha", "rows", "rollout_fp8_vs_bf16_best", "rollout_fp8_vs_bf16_eager",
            "rollout_fp8_peak_mem_ratio"} <= set(summary)
    assert len(summary["rows"]) == 12 and summary["rollout_fp8_peak_mem_ratio"] is None  # no CUDA memory on CPU
    for r in summary["rows"]:  # the summary's rows carry the ratios over all BF16 rows
        if r["status"] == "ok":
            assert r["speedup_vs_bf16_best"] == pytest.approx(r["tokens_per_s"] / best["tokens_per_s"])
    fastest = max((r for r in ok if r["precision"] == "fp8"), key=lambda r: r["tokens_per_s"])
    assert summary["rollout_fp8_vs_bf16_eager"] == pytest.approx(fastest["tokens_per_s"] / eager["tokens_per_s"])
    assert summary["rollout_fp8_vs_bf16_best"] == pytest.approx(fastest["tokens_per_s"] / best["tokens_per_s"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_full_run_without_cuda_writes_skipped_rows(tmp_path):
    out = tmp_path / "full.jsonl"
    _load_script().main(["--out", str(out), "--backends", "triton", "scaled_mm"])
    rows = _rows(out)
    assert len(rows) == 4 * 2 * 4  # (bf16 master, bf16 fused, triton, scaled_mm) × (eager, compiled) × 4 shapes
    assert {(r["batch"], r["gen_length"], r["steps"]) for r in rows} == {(8, 128, 64), (32, 128, 64), (8, 256, 128),
                                                                         (32, 256, 128)}
    for r in rows:
        assert r["status"] == "skipped" and "CUDA" in r["reason"] and "tokens_per_s" not in r
        assert r["shape"]["d_model"] == 4096 and r["shape"]["vocab_size"] == 126464 and r["prompt_len"] == 64


def test_smoke_profile_and_budget(tmp_path):
    """--profile writes the profiler table of one FP8 forward; --budget-s 0 starts no variant (rows skipped, with the
    reason); --compiled-only keeps compiled rows only."""
    out, prof = tmp_path / "p.jsonl", tmp_path / "profile.txt"
    _load_script().main(["--smoke", "--no-compile", "--out", str(out), "--backends", "torch", "--profile", str(prof)])
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["ok"] * 3 and not any(r["compiled"] for r in rows)
    text = prof.read_text()
    assert text.startswith("# one forward, fp8 torch, [2, 24]") and "aten::" in text and "Self CPU" in text

    out2 = tmp_path / "c.jsonl"
    _load_script().main(["--smoke", "--compiled-only", "--out", str(out2), "--backends", "torch"])
    assert [r["compiled"] for r in _rows(out2)] == [True] * 3  # (skipped on CPU: the sampler compiles on CUDA only)

    out3 = tmp_path / "b.jsonl"
    _load_script().main(["--smoke", "--no-compile", "--out", str(out3), "--backends", "torch", "--budget-s", "0"])
    rows = _rows(out3)
    assert len(rows) == 3 and all(r["status"] == "skipped" and "time budget" in r["reason"] for r in rows)
