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
