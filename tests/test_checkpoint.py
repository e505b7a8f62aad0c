"""Official checkpoint layout: sharded load reproduces logits, exact round trip, clear errors for malformed dirs."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm_ais.models.checkpoint import CheckpointError, save_checkpoint
from dllm_ais.models.llada.checkpoint import load_llada
from dllm_ais.models.tiny import tiny_model, tiny_tokenizer


def _write_official_sharded(model, path):
    """Write `model` by hand in the official layout, split over two shards with an index (not via save_checkpoint)."""
    path.mkdir()
    cfg = model.config.to_dict()
    cfg["auto_map"] = {"AutoModel": "modeling_llada.LLaDAModelLM"}  # as in the official config.json
    (path / "config.json").write_text(json.dumps(cfg))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:]), 1):
        fname = f"model-0000{i}-of-00002.safetensors"
        save_file({n: state[n] for n in part}, str(path / fname))
        weight_map.update(dict.fromkeys(part, fname))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "modeling_llada.py").write_text("# remote code stand-in\n")
    return path


def test_sharded_official_checkpoint_reproduces_logits(tmp_path):
    model = tiny_model(seed=3, dtype=torch.float32)
    ckpt = _write_official_sharded(model, tmp_path / "ckpt")
    loaded = load_llada(ckpt, dtype=torch.float32)
    ids = torch.randint(5, 100, (2, 11), generator=torch.Generator().manual_seed(1))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_save_load_round_trip_is_exact(tmp_path):
    model = tiny_model(seed=5, dtype=torch.bfloat16)
    src = _write_official_sharded(model, tmp_path / "src")
    out = save_checkpoint(load_llada(src), tmp_path / "out", tokenizer=tiny_tokenizer(), source_dir=src,
                     max_shard_bytes=200_000)
    assert (out / "model.safetensors.index.json").is_file(), "small max_shard_bytes must shard"
    assert json.loads((out / "config.json").read_text())["auto_map"], "official fields survive a save"
    assert (out / "modeling_llada.py").is_file() and (out / "tokenizer.json").is_file()
    again = load_llada(out)
    for (n, a), (m, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert n == m and a.dtype == b.dtype and torch.equal(a, b), n
    # Saving over an existing directory replaces it whole.
    save_checkpoint(again, out)
    assert not (out / "model.safetensors.index.json").exists() and (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary directory left behind"


def _corrupt(tmp_path, edit_config=None, edit_state=None):
    model = tiny_model()
    path = tmp_path / "bad"
    save_checkpoint(model, path)
    if edit_config:
        cfg = json.loads((path / "config.json").read_text())
        edit_config(cfg)
        (path / "config.json").write_text(json.dumps(cfg))
    if edit_state:
        state = load_file(str(path / "model.safetensors"))
        edit_state(state)
        save_file(state, str(path / "model.safetensors"))
    return path


def test_missing_tensor_is_named(tmp_path):
    path = _corrupt(tmp_path, edit_state=lambda s: s.pop("model.transformer.blocks.1.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"blocks\.1\.up_proj\.weight"):
        load_llada(path)


def test_wrong_shape_is_named(tmp_path):
    def shrink(s):
        s["model.transformer.blocks.0.q_proj.weight"] = torch.zeros(3, 3)

    with pytest.raises(CheckpointError, match=r"blocks\.0\.q_proj\.weight.*shape"):
        load_llada(_corrupt(tmp_path, edit_state=shrink))


def test_unknown_model_type_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="model_type.*'qwen3'"):
        load_llada(_corrupt(tmp_path, edit_config=lambda c: c.update(model_type="qwen3")))


def test_missing_mask_token_id_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="mask_token_id"):
        load_llada(_corrupt(tmp_path, edit_config=lambda c: c.pop("mask_token_id")))


def test_missing_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_llada(tmp_path)
    path = _corrupt(tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="safetensors"):
        load_llada(path)


def test_unexpected_tensor_is_named(tmp_path):
    def add(s):
        s["model.transformer.blocks.7.q_proj.weight"] = torch.zeros(1)

    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.transformer\.blocks\.7"):
        load_llada(_corrupt(tmp_path, edit_state=add))


def test_tokenizer_opens_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    save_checkpoint(tiny_model(), tmp_path / "ckpt", tokenizer=tiny_tokenizer())
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "ckpt"))
    assert tok.mask_token_id == 4 and tok.decode(tok("12+7=")["input_ids"]) == "12+7="


def _without_token_ids(c):
    c.pop("bos_token_id")
    c.pop("eot_token_id")


def test_missing_bos_eot_never_become_llada_8b_ids(tmp_path):
    path = _corrupt(tmp_path, edit_config=_without_token_ids)
    cfg = load_llada(path).config
    assert cfg.bos_token_id is None and cfg.eot_token_id is None  # not 126080 / 126348
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 2}))
    assert load_llada(path).config.bos_token_id == 2


def test_missing_bos_eot_come_from_the_tokenizer(tmp_path):
    from dllm_ais.config import ModelConfig
    from dllm_ais.models.load import load_model_and_tokenizer
    from dllm_ais.models.tiny import BOS, EOT, tiny_vocab

    path = _corrupt(tmp_path, edit_config=_without_token_ids)
    tiny_tokenizer().save_pretrained(str(path))
    model, _ = load_model_and_tokenizer(ModelConfig(path=str(path), dtype="float32", device="cpu"))
    vocab = tiny_vocab()
    assert (model.config.bos_token_id, model.config.eot_token_id) == (vocab[BOS], vocab[EOT])


def test_token_id_outside_the_embedding_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="eot_token_id=126348 is outside the embedding"):
        load_llada(_corrupt(tmp_path, edit_config=lambda c: c.update(eot_token_id=126348)))
