"""A `--model` directory with a broken config.json fails in one line naming the file and what is wrong: truncated
JSON (LLaDA and Qwen), a field of the wrong type, JSON that is not an object."""

from __future__ import annotations

import json

import pytest

from dllm_ais.models.checkpoint import CheckpointError, save_checkpoint
from dllm_ais.models.llada.checkpoint import load_llada, read_llada_config
from dllm_ais.models.tiny import tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck") / "llada"
    save_checkpoint(tiny_model(), d)
    return d


def _broken(checkpoint, tmp_path, text):
    d = tmp_path / "broken"
    d.mkdir()
    for f in checkpoint.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "config.json").write_text(text)
    return d


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_truncated_config_names_the_file(checkpoint, tmp_path):
    text = (checkpoint / "config.json").read_text()
    d = _broken(checkpoint, tmp_path, text[: len(text) // 2])
    with pytest.raises(CheckpointError) as err:
        load_llada(d)
    msg = _one_line(err)
    assert str(d / "config.json") in msg and "truncated" in msg and "line" in msg


@pytest.mark.parametrize("field,value,says", [("d_model", "banana", "integer"), ("rope_theta", "x", "number"),
                                              ("weight_tying", 0, "true/false"), ("mask_token_id", 1.5, "integer")])
def test_wrong_field_type_names_the_file_and_field(checkpoint, tmp_path, field, value, says):
    data = json.loads((checkpoint / "config.json").read_text())
    data[field] = value
    d = _broken(checkpoint, tmp_path, json.dumps(data))
    with pytest.raises(CheckpointError) as err:
        read_llada_config(d)
    msg = _one_line(err)
    assert str(d / "config.json") in msg and repr(field) in msg and says in msg, msg


def test_config_that_is_not_an_object(checkpoint, tmp_path):
    d = _broken(checkpoint, tmp_path, "[1, 2]")
    with pytest.raises(CheckpointError) as err:
        read_llada_config(d)
    assert "not an object" in _one_line(err)


def test_valid_config_still_loads(checkpoint):
    assert read_llada_config(checkpoint).d_model == tiny_model().config.d_model


def test_truncated_qwen_config_names_the_file(tmp_path):
    from dllm_ais.models.qwen.model import QwenCheckpointError, read_model_type

    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "hidden_size"')
    with pytest.raises(QwenCheckpointError) as err:
        read_model_type(tmp_path)
    msg = _one_line(err)
    assert str(tmp_path / "config.json") in msg and "truncated" in msg
