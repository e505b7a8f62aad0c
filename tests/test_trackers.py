"""--report-to (issue 29, item 6): every step's metrics go to accelerate's experiment trackers as well as to
metrics.jsonl, which stays the source of truth; checked offline with tensorboard (its event files read back) and, where
wandb is installed, wandb in offline mode (its run file read back)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace

import pytest
from test_trainer import small_preset

from dllm_ais import metrics as M
from dllm_ais.cli import main
from dllm_ais.config import TRACKERS
from dllm_ais.train.job import run_training
from dllm_ais.train.run_dir import read_run_config
from dllm_ais.train.trackers import flat_config


def _numbers(row):
    return {k: v for k, v in row.items() if k != M.STEP and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _same(a: float, b: float, rel: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel, abs=1e-30)


def test_trackers_are_accelerates():
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    assert set(TRACKERS) == set(LOGGER_TYPE_TO_CLASS)


def test_flat_config_keeps_every_field_as_a_tracker_value():
    flat = flat_config(small_preset().to_dict())
    assert flat["train/steps"] == 3 and flat["grpo/num_generations"] == 4 and flat["name"] == "tiny-cpu"
    assert flat["train/reward_fn"] == "null" and flat["train/report_to"] == "[]"
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())


def test_tensorboard_gets_every_metric_of_every_step(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    run_training(small_preset(steps=2, report_to=["tensorboard"]), run, progress=False)
    rows = M.read_metrics(run)
    events = EventAccumulator(str(run / "logs" / "dllm-ais"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {k for row in rows for k in _numbers(row)}
    for row in rows:
        for key, value in _numbers(row).items():
            logged = {e.step: e.value for e in events.Scalars(key)}
            assert _same(logged[row[M.STEP]], value, 1e-6), key  # tensorboard keeps float32
    assert read_run_config(run).train.report_to == ["tensorboard"]


def _wandb_records(path):
    """Records of a wandb run file: a 7-byte header, then LevelDB log framing (32 KiB blocks; per record a 7-byte
    header crc32, length, type 1 full / 2 first / 3 middle / 4 last) around protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, parts = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4: pos + 7])
        parts += data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record
        elif kind == 0:
            break


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_gets_every_metric_and_the_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    run_training(small_preset(steps=2, report_to=["wandb"]), run, progress=False)
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    history, config = {}, {}
    for record in _wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {_key(i): json.loads(i.value_json) for i in record.history.item}
            history[record.history.step.num] = items
        elif kind == "config":
            config.update({_key(i): json.loads(i.value_json) for i in record.config.update})
    rows = M.read_metrics(run)
    assert sorted(history) == [r[M.STEP] for r in rows]
    for row in rows:
        for key, value in _numbers(row).items():
            assert _same(float("nan") if history[row[M.STEP]][key] == "NaN" else history[row[M.STEP]][key], value,
                         1e-12), key
    assert config["train/steps"] == 2 and config["train/report_to"] == '["wandb"]'


def test_report_to_changes_on_resume_and_old_runs_read_tensorboard_true(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    preset = small_preset(steps=1, sft_steps=0)
    run_training(replace(preset, grpo=replace(preset.grpo, num_iterations=1)), run, progress=False)
    assert not (run / "logs").exists()
    assert main(["train", "--resume", "--out", str(run), "--steps", "2", "--report-to", "tensorboard",
                 "--no-progress", "--threads", "1"]) == 0
    assert json.loads((run / "config.json").read_text())["train"]["report_to"] == ["tensorboard"]
    assert list((run / "logs" / "dllm-ais").glob("events.out.tfevents.*"))
    assert main(["train", "--report-to", "none", "tensorboard", "--out", str(tmp_path / "x")]) == 2
    assert "'none' means no tracker" in capsys.readouterr().err
    config = json.loads((run / "config.json").read_text())  # a run written while the flag was --tensorboard
    del config["train"]["report_to"]
    config["train"]["tensorboard"] = True
    (run / "config.json").write_text(json.dumps(config))
    assert read_run_config(run).train.report_to == ["tensorboard"]
