"""scripts/bench_ar_decode.py --smoke runs on CPU and writes one well-formed JSON row per measurement."""

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


def test_smoke_writes_rows(tmp_path):
    bench = _load_script()
    out = tmp_path / "ar.jsonl"
    bench.main(["--smoke", "--out", str(out), "--backends", "torch", "no-such-backend"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_key = {(r["precision"], r["backend"], r["batch"]): r for r in rows}
    assert len(rows) == len(by_key) == 6  # bf16 + 2 FP8 backends, batch 2 and 4
    for r in rows:
        assert r["bench"] == "ar_decode" and r["smoke"] is True and r["device"] and r["git_sha"]
        assert r["torch"] and r["transformers"] and r["shape"]["hidden_size"] == 64
        assert (r["prompt_len"], r["new_tokens"]) == (8, 8)
    for precision, backend in [("bf16", None), ("fp8", "torch")]:
        for batch in (2, 4):
            r = by_key[(precision, backend, batch)]
            assert r["status"] == "ok" and r["tokens_per_s"] > 0 and r["total_s"] > r["prefill_s"] > 0
            assert abs(r["tokens_per_s"] - batch * 8 / r["total_s"]) < 1e-6 * r["tokens_per_s"]
    skipped = by_key[("fp8", "no-such-backend", 2)]
    assert skipped["status"] == "skipped" and "no-such-backend" in skipped["reason"] and "tokens_per_s" not in skipped
