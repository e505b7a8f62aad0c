"""scripts/bench_rollout.py: --smoke runs on CPU and writes one well-formed JSON row per measurement; without CUDA the
full benchmark writes skipped rows with the reason (and builds no model)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_rollout.py"
ENV_FIELDS = ("bench", "device", "torch", "triton", "git_sha", "git_dirty", "smoke", "time")
RECORD_FIELDS = ("shape", "batch", "prompt_len", "gen_length", "block_length", "steps", "temperature", "precision",
                 "backend", "status")


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_rollout", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_smoke_writes_rows(tmp_path):
    out = tmp_path / "x.jsonl"
    _load_script().main(["--smoke", "--out", str(out), "--backends", "torch", "scaled_mm", "torchao", "no-such"])
    rows = _rows(out)
    by_key = {(r["precision"], r["backend"]): r for r in rows}
    assert len(rows) == len(by_key) == 5  # bf16 + 4 FP8 backends, one shape (batch 2, gen_length 16)
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
    assert by_key["bf16", None]["status"] == by_key["fp8", "torch"]["status"] == "ok"
    fp8 = by_key["fp8", "torch"]
    assert fp8["quantize_s"] > 0
    assert fp8["speedup_vs_bf16"] == pytest.approx(fp8["tokens_per_s"] / by_key["bf16", None]["tokens_per_s"])
    assert by_key["fp8", "torchao"]["status"] == "skipped" and "CUDA" in by_key["fp8", "torchao"]["reason"]
    assert "no-such" in by_key["fp8", "no-such"]["reason"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_full_run_without_cuda_writes_skipped_rows(tmp_path):
    out = tmp_path / "full.jsonl"
    _load_script().main(["--out", str(out)])
    rows = _rows(out)
    assert len(rows) == 5 * 4  # (bf16 + triton, scaled_mm, torchao, torch) × batch {8, 32} × gen_length {128, 256}
    assert {(r["batch"], r["gen_length"], r["steps"]) for r in rows} == {(8, 128, 64), (32, 128, 64), (8, 256, 128),
                                                                         (32, 256, 128)}
    for r in rows:
        assert r["status"] == "skipped" and "CUDA" in r["reason"] and "tokens_per_s" not in r
        assert r["shape"]["d_model"] == 4096 and r["shape"]["vocab_size"] == 126464 and r["prompt_len"] == 64
