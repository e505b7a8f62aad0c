"""scripts/bench_ar_decode.py --smoke runs on CPU and writes one well-formed JSON row per measurement, and --json
writes the summary with the two headline keys computed from those rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_ar_decode.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_ar_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_writes_rows_and_summary(tmp_path):
    bench = _load_script()
    out, summary_path = tmp_path / "ar.jsonl", tmp_path / "sub" / "ar.json"
    bench.main(["--smoke", "--out", str(out), "--json", str(summary_path), "--backends", "torch", "no-such-backend"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_key = {(r["engine"], r["precision"], r["backend"], r["mode"], r["batch"]): r for r in rows}
    # static: (bf16 + 2 FP8 backends) x (eager, graph) x 2 batches; hf: 3 x eager x 2 batches
    assert len(rows) == len(by_key) == 18
    for r in rows:
        assert r["bench"] == "ar_decode" and r["smoke"] is True and r["device"] and r["git_sha"]
        assert r["torch"] and r["transformers"] and r["shape"]["hidden_size"] == 64
        assert (r["prompt_len"], r["new_tokens"]) == (8, 8)
    for engine in ("static", "hf"):
        for precision, backend in [("bf16", None), ("fp8", "torch")]:
            for batch in (2, 4):
                r = by_key[(engine, precision, backend, "eager", batch)]
                assert r["status"] == "ok" and r["tokens_per_s"] > 0 and r["total_s"] > r["prefill_s"] > 0
                assert abs(r["tokens_per_s"] - batch * 8 / r["total_s"]) < 1e-6 * r["tokens_per_s"]
                assert abs(r["step_s"] - (r["total_s"] - r["prefill_s"]) / 7) < 1e-9
                assert r["copy_gbps"] > 0 and r["weight_bytes"] > 0 and r["kv_bytes"] > 0
                floor = (r["weight_bytes"] + r["kv_bytes"]) / (r["copy_gbps"] * 1e9)
                assert abs(r["floor_s"] - floor) < 1e-9 * floor + 1e-15
                assert abs(r["step_vs_floor"] - r["step_s"] / r["floor_s"]) < 1e-6 * r["step_vs_floor"]
    # FP8 halves (or better) the linear weights' bytes: fewer weight bytes per step than BF16
    assert by_key[("static", "fp8", "torch", "eager", 2)]["weight_bytes"] < \
        by_key[("static", "bf16", None, "eager", 2)]["weight_bytes"]
    graph = by_key[("static", "bf16", None, "graph", 2)]
    assert graph["status"] == "skipped" and "CUDA" in graph["reason"]
    skipped = by_key[("static", "fp8", "no-such-backend", "eager", 2)]
    assert skipped["status"] == "skipped" and "no-such-backend" in skipped["reason"] and "tokens_per_s" not in skipped

    summary = json.loads(summary_path.read_text())
    assert summary["key_batch"] == 4 and summary["ar_decode_mode"] == "eager"  # batch 8 not run: the largest
    assert summary["ar_decode_fp8_backend"] == "torch" and summary["device"] and len(summary["rows"]) == 18
    bf16, fp8 = by_key[("static", "bf16", None, "eager", 4)], by_key[("static", "fp8", "torch", "eager", 4)]
    assert summary["ar_decode_bf16_vs_floor"] == bf16["step_vs_floor"]
    assert summary["ar_decode_fp8_vs_bf16"] == fp8["tokens_per_s"] / bf16["tokens_per_s"]


def test_without_gpu_everything_is_skipped_and_keys_are_null(tmp_path, monkeypatch):
    bench = _load_script()
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    out, summary_path = tmp_path / "ar.jsonl", tmp_path / "ar.json"
    bench.main(["--out", str(out), "--json", str(summary_path), "--batch", "8"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["status"] == "skipped" for r in rows)
    summary = json.loads(summary_path.read_text())
    assert summary["ar_decode_bf16_vs_floor"] is None and summary["ar_decode_fp8_vs_bf16"] is None
    assert "CUDA" in summary["reason"] or "GPU" in summary["reason"]
