"""Reading task rows through ``datasets``: shipped samples, parquet, missing fields, hub names (mocked, no network)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from dllm_ais.tasks import countdown, gsm8k, math500, sudoku
from dllm_ais.tasks.loading import local_format, read_rows, require

datasets = pytest.importorskip("datasets", reason="reading task rows needs `datasets` (not on the bare GPU image)")

DATA = resources.files("dllm_ais.tasks") / "data"


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_local_format_by_suffix():
    assert local_format("a/b.jsonl") == "json" and local_format("x.JSON") == "json"
    assert local_format("d/*.parquet") == "parquet"
    assert local_format("openai/gsm8k") is None


def test_shipped_samples_load_through_datasets():
    rows = gsm8k.load("test", data_path=str(DATA / "gsm8k_sample.jsonl"))
    assert len(rows) == 5 and [r["answer"] for r in rows] == ["27", "270", "320", "1200", "8"]
    assert rows[3]["solution"].endswith("#### 1,200") and rows[0]["prompt"].endswith(rows[0]["question"])
    rows = math500.load("test", data_path=str(DATA / "math500_sample.jsonl"))
    assert len(rows) == 5 and rows[0]["answer"] == "\\frac{1}{2}" and rows[1]["answer"] == "3\\sqrt{2}"
    assert rows[0]["subject"] == "Prealgebra" and rows[0]["level"] == 1
    assert len(countdown.load("test", data_path=str(DATA / "countdown_sample.jsonl"))) == 5
    assert len(sudoku.load("test", data_path=str(DATA / "sudoku_sample.jsonl"))) == 5
    assert len(gsm8k.load("test", data_path=str(DATA / "gsm8k_sample.jsonl"), limit=2)) == 2


def test_parquet_file(tmp_path):
    path = str(tmp_path / "gsm.parquet")
    datasets.Dataset.from_list(
        [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "4"}]
    ).to_parquet(path)
    rows = gsm8k.load("train", data_path=path)
    assert [r["answer"] for r in rows] == ["2", "4"]


def test_row_missing_a_field_names_row_and_field(tmp_path):
    path = _write_jsonl(
        tmp_path / "bad.jsonl",
        [{"question": "q0", "answer": "#### 1"}, {"question": "q1", "answer": "#### 2"}, {"question": "q2"}],
    )
    with pytest.raises(ValueError, match=r"row 2 has no field 'answer'; its fields are \['question'\]"):
        gsm8k.load("train", data_path=path)
    path = _write_jsonl(tmp_path / "bad_cd.jsonl", [{"numbers": [1, 2, 3], "target": 6}, {"target": 5}])
    with pytest.raises(ValueError, match=r"row 1 has no field 'numbers' \(or 'nums'\)"):
        countdown.load("train", data_path=path)


def test_bad_values_name_the_row(tmp_path):
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "#### 3"}, {"question": "q", "answer": "x"}])
    with pytest.raises(ValueError, match="row 1 field 'answer' has no final number"):
        gsm8k.load("train", data_path=path)


def test_require_helper():
    assert require({"nums": [1]}, 0, "numbers", "src", aliases=("nums",)) == [1]
    with pytest.raises(ValueError, match="src: row 4 has no field 'x'"):
        require({"x": None, "y": 1}, 4, "x", "src")


def test_hub_names_used_when_no_path(monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split))
        if name == gsm8k.HUB_NAME:
            return datasets.Dataset.from_list([{"question": "How many?", "answer": "It is 3.\n#### 3"}] * 4)
        return datasets.Dataset.from_list([{"problem": "p", "answer": "7", "subject": "Algebra", "level": 2}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = gsm8k.load("test", limit=2)
    assert calls[-1] == ("openai/gsm8k", "main", "test") and len(rows) == 2 and rows[0]["answer"] == "3"
    rows = math500.load()
    assert calls[-1] == ("HuggingFaceH4/MATH-500", None, "test") and rows[0]["answer"] == "7"
    with pytest.raises(ValueError, match="only a 'test' split"):
        math500.load("train")


def test_hub_countdown_with_nums_alias(monkeypatch):
    def fake_load_dataset(name, config=None, split=None, **kwargs):
        assert (name, config, split) == ("Jiayi-Pan/Countdown-Tasks-3to4", None, "train")
        return datasets.Dataset.from_list([{"target": 16, "nums": [3, 5, 2]}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = countdown.load("train", data_path="Jiayi-Pan/Countdown-Tasks-3to4")
    assert rows[0]["numbers"] == [3, 5, 2] and rows[0]["target"] == 16 and rows[0]["solution"] is None


def test_hub_failure_says_to_use_a_local_file(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="Offline\\? pass data_path"):
        read_rows("train", None, "openai/gsm8k", "main")


def test_optional_fields_keep_rows_aligned(tmp_path):
    path = _write_jsonl(
        tmp_path / "m.jsonl", [{"problem": "p0", "answer": "1", "subject": "Algebra"}, {"problem": "p1", "answer": "2"}]
    )
    rows = math500.load(data_path=path)
    assert rows[0].keys() == rows[1].keys() and rows[0]["subject"] == "Algebra" and rows[1]["subject"] is None
