"""Qwen adapter: tiny model built from an explicit generator, checkpoint directories written by save_pretrained /
save_qwen load offline and reproduce logits, wrong model_type is refused by name, and the FP8 copy (quantize_model /
sync_weights) works on the stock transformers Qwen3ForCausalLM."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from dllm_ais.fp8 import FP8Linear, quantize_model, sync_weights
from dllm_ais.models.qwen.model import (
    QwenCheckpointError,
    load_qwen,
    load_qwen_tokenizer,
    random_qwen,
    save_qwen,
    tiny_qwen,
    tiny_qwen_config,
    tiny_qwen_tokenizer,
)

IDS = torch.tensor([[5, 17, 42, 99, 3, 60, 7], [1, 1, 20, 21, 22, 23, 24]])
MASK = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])


def _logits(model) -> torch.Tensor:
    pos = (MASK.cumsum(-1) - 1).clamp_min(0)
    return model(input_ids=IDS, attention_mask=MASK, position_ids=pos).logits


def test_tiny_qwen_shapes_seed_and_global_rng():
    state = torch.get_rng_state()
    a, b, c = tiny_qwen(seed=0), tiny_qwen(seed=0), tiny_qwen(seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.self_attn.q_proj.weight"], sc["model.layers.0.self_attn.q_proj.weight"])
    cfg = a.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == ("qwen3", 64, 2, 4)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (2, 16, 128, 128)
    tok = tiny_qwen_tokenizer()
    assert len(tok) <= cfg.vocab_size and tok.eos_token_id == cfg.eos_token_id == 1 and tok.padding_side == "left"
    rope = a.model.rotary_emb
    head_dim = cfg.head_dim
    expected = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    torch.testing.assert_close(rope.inv_freq, expected)  # materialised from meta: buffers recomputed, not garbage
    assert torch.isfinite(_logits(a)).all()
    assert tiny_qwen(seed=0, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_save_pretrained_dir_loads_offline_and_reproduces_logits(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = tiny_qwen(seed=2), tiny_qwen_tokenizer()
    model.save_pretrained(str(tmp_path / "ckpt"))  # plain transformers layout
    tok.save_pretrained(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    loaded = load_qwen(tmp_path / "ckpt", dtype=torch.float32)
    assert type(loaded).__name__ == "Qwen3ForCausalLM" and not loaded.training
    with torch.no_grad():
        assert torch.equal(_logits(loaded), _logits(model))
    tok2 = load_qwen_tokenizer(tmp_path / "ckpt")
    assert tok2.padding_side == "left" and tok2("12+7=")["input_ids"] == tok("12+7=")["input_ids"]


def test_save_qwen_is_atomic_and_replaces(tmp_path):
    path = tmp_path / "out"
    save_qwen(tiny_qwen(seed=3), tiny_qwen_tokenizer(), path)
    model = tiny_qwen(seed=4)
    save_qwen(model, None, path)  # replaces the existing directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or old directories left behind
    with torch.no_grad():
        assert torch.equal(_logits(load_qwen(path, dtype=torch.float32)), _logits(model))

    class Boom(RuntimeError):
        pass

    def fail(*args, **kwargs):
        raise Boom

    broken = tiny_qwen(seed=5)
    broken.save_pretrained = fail
    with pytest.raises(Boom):
        save_qwen(broken, None, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with torch.no_grad():
        assert torch.equal(_logits(load_qwen(path, dtype=torch.float32)), _logits(model))  # old content intact


def test_qwen2_directory_loads(tmp_path):
    from transformers import Qwen2Config

    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = random_qwen(cfg, seed=0)
    save_qwen(model, None, tmp_path / "q2")
    with torch.no_grad():
        assert torch.equal(_logits(load_qwen(tmp_path / "q2", dtype=torch.float32)), _logits(model))


def test_wrong_model_type_is_refused_by_field(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4).save_pretrained(tmp_path)
    with pytest.raises(QwenCheckpointError, match=r"'model_type' is 'llama'.*'qwen2' or 'qwen3'"):
        load_qwen(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llada"}))
    with pytest.raises(QwenCheckpointError, match="load_llada"):
        load_qwen(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(QwenCheckpointError, match="config.json not found"):
        load_qwen(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        load_qwen(tmp_path / "does-not-exist")


def test_quantize_model_and_sync_weights_on_qwen3():
    master = tiny_qwen(seed=6)
    config = tiny_qwen_config()
    rollout = quantize_model(master, backend="torch")
    fp8 = {n for n, m in rollout.named_modules() if isinstance(m, FP8Linear)}
    per_layer = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj"}
    assert fp8 == {f"model.layers.{i}.{p}" for i in range(config.num_hidden_layers) for p in per_layer}
    assert type(rollout.lm_head) is nn.Linear and type(master.model.layers[0].mlp.up_proj) is nn.Linear
    with torch.no_grad():
        ref, q = _logits(master), _logits(rollout)
        snr_db = 10 * torch.log10(ref.pow(2).mean() / (ref - q).pow(2).mean())
        assert 20 < snr_db < 200  # lossy but close (and not silently unquantised)

        for p in master.parameters():  # an "optimizer step" on the master
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        buffers = {n: b.data_ptr() for n, b in rollout.named_buffers()}
        sync_weights(master, rollout)
        assert buffers == {n: b.data_ptr() for n, b in rollout.named_buffers()}  # in place
        assert torch.equal(_logits(rollout), _logits(quantize_model(master, backend="torch")))
