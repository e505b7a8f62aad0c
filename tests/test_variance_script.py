"""scripts/variance.py in --smoke mode: csv with the documented columns, a PNG, a table; and the --data path."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "variance.py"


@pytest.fixture(scope="module")
def variance():
    spec = importlib.util.spec_from_file_location("variance_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_smoke_run_writes_csv_png_and_table(variance, tmp_path, capsys):
    assert variance.main(["--smoke", "--out", str(tmp_path), "--no-progress"]) == 0
    rows = _rows(tmp_path / "variance.csv")
    assert {"estimator", "K", "forward_passes", "std_log_ratio", "mean_log_ratio"} <= set(rows[0])
    assert {r["estimator"] for r in rows} == {"independent", "coupled", "stratified", "antithetic", "uniform_t"}
    for r in rows:
        assert int(r["forward_passes"]) == 2 * int(r["K"])
        assert math.isfinite(float(r["std_log_ratio"])) and float(r["std_log_ratio"]) >= 0
        assert math.isfinite(float(r["mean_log_ratio"]))
    assert {int(r["K"]) for r in rows if r["estimator"] == "antithetic"} == {2, 4}  # even K only
    assert (tmp_path / "variance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "variance.json").read_text())["model"] == "tiny"
    out = capsys.readouterr().out
    assert "std(ℓ)" in out and "independent" in out


def test_data_jsonl_input(variance, tmp_path):
    data = tmp_path / "seqs.jsonl"
    data.write_text("\n".join(json.dumps(d) for d in [{"prompt": "1+1=", "completion": "2"},
                                                       {"prompt": "Hi", "completion": "Hello there"}]) + "\n")
    out = tmp_path / "out"
    assert variance.main(["--data", str(data), "--ks", "2", "--repeats", "3", "--estimators", "coupled,antithetic",
                          "--out", str(out), "--no-progress"]) == 0
    rows = _rows(out / "variance.csv")
    assert [(r["estimator"], r["K"]) for r in rows] == [("coupled", "2"), ("antithetic", "2")]
    assert json.loads((out / "variance.json").read_text())["counted_tokens"] == [2, 12]  # text + EOS


def test_runs_as_a_plain_script():
    res = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--smoke" in res.stdout


def test_rejects_unknown_estimator(variance, tmp_path):
    with pytest.raises(SystemExit):
        variance.main(["--smoke", "--estimators", "bogus", "--out", str(tmp_path)])


def test_a_dream_checkpoint_is_read_as_a_dream_and_sampled_by_dreams_sampler(tmp_path):
    """--model DIR of a Dream: its family from config.json, and the Dream sampler's rollouts of its FP8 copy (a LLaDA
    sampler on a Dream would ignore its shift)."""
    import argparse

    import torch

    from dllm_ais.analysis.variance_cli import load_models, sample_sequences
    from dllm_ais.families import get_family
    from dllm_ais.models.dream.backend import DreamBackend
    from dllm_ais.models.tiny import tiny_dream_model, tiny_tokenizer

    ckpt = tmp_path / "dream"
    get_family("dream").save(tiny_dream_model(seed=0), tiny_tokenizer(), ckpt)
    args = argparse.Namespace(model=str(ckpt), dtype="float32", device="cpu", seed=0, fp8_backend="torch",
                              num_sequences=2, gen_length=4, steps=None, temperature=1.0)
    model, fp8, tokenizer, _ = load_models(args)
    assert type(fp8).__name__ == "FusedDream" and model.config.model_type == "Dream"
    sampled = []
    sample = DreamBackend.sample
    DreamBackend.sample = lambda self, *a, **k: sampled.append(self) or sample(self, *a, **k)
    try:
        _, _, completion, mask = sample_sequences(args, fp8, tokenizer, smoke=False)
    finally:
        DreamBackend.sample = sample
    assert len(sampled) == 1 and completion.shape == (2, 4) and bool(mask[:, 0].all())
    assert not bool((completion == torch.tensor(model.config.mask_token_id)).any())
