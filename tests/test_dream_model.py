"""Dream in our code against Dream's official code: logits recorded from Fast-dLLM's copy of the hub's
modeling_dream.py (transformers 4.46.3, torch 2.13) on a tiny random checkpoint in the official layout
(tests/fixtures/dream_tiny, see its README.md), loaded with no remote code; plus the loader's refusals, family
detection, tied embeddings, padding and the KV cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm_ais.config import ModelConfig
from dllm_ais.models.checkpoint import CheckpointError, save_checkpoint
from dllm_ais.models.dream.checkpoint import load_dream
from dllm_ais.models.dream.model import DreamModel, dream_positions, shift_logits
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.load import detect_family, load_model_and_tokenizer
from dllm_ais.models.tiny import tiny_dream_model

FIXTURE = Path(__file__).parent / "fixtures" / "dream_tiny"


@pytest.fixture(scope="module")
def official():
    return load_file(str(FIXTURE / "logits.safetensors"))


@pytest.fixture(scope="module")
def model():
    return load_dream(FIXTURE, dtype=torch.float32)


def test_fixture_is_the_official_layout_and_loads_without_remote_code(model):
    cfg = json.loads((FIXTURE / "config.json").read_text())
    assert cfg["model_type"] == "Dream" and "auto_map" in cfg and cfg["architectures"] == ["DreamModel"]
    assert not list(FIXTURE.glob("*.py"))  # nothing to run: the remote code is not even there
    assert isinstance(model, DreamModel) and model.config.num_key_value_heads == 2
    assert model.config.mask_token_id == 297 and model.config.rope_theta == 500.0
    assert model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0


def test_unpadded_logits_equal_the_official_code(model, official):
    with torch.no_grad():
        ours = model(official["unpadded_input_ids"]).logits
        ones = model(official["unpadded_input_ids"], torch.ones_like(official["unpadded_input_ids"])).logits
    torch.testing.assert_close(ours, official["unpadded_logits"], rtol=0, atol=1e-5)
    torch.testing.assert_close(ones, official["unpadded_logits"], rtol=0, atol=1e-5)
    assert official["unpadded_logits"].abs().max() > 1  # non-trivial numbers


@pytest.mark.parametrize("variant", ["hub", "fastdllm"])
def test_left_padded_logits_equal_the_official_code_at_every_position(model, official, variant):
    """hub: positions cumsum − 1 (padding 1) as the hub code uses generate's tok_idx; fastdllm: Fast-dLLM's copy
    overwrites position_ids with arange — both with the 4-D m_i ∧ m_j mask, padding rows included."""
    x, m = official["padded_input_ids"], official["padded_attention_mask"]
    assert torch.equal(dream_positions(m, *x.shape, x.device), official["padded_tok_idx"])
    pos = None if variant == "hub" else torch.arange(x.shape[1]).expand_as(x)
    with torch.no_grad():
        ours = model(x, m, position_ids=pos).logits
    torch.testing.assert_close(ours, official[f"padded_logits_{variant}"], rtol=0, atol=1e-5)


def test_bf16_logits_equal_the_official_code_bit_for_bit(official):
    """The official code run in bf16 (from_pretrained(torch_dtype=bfloat16)): our op order (RMSNorm scaled in the
    input dtype, RoPE tables cast to it, rotation in it) gives the same bits, padded canvas included."""
    bf16 = load_file(str(FIXTURE / "logits_bf16.safetensors"))
    model = load_dream(FIXTURE, dtype=torch.bfloat16)
    with torch.no_grad():
        u = model(official["unpadded_input_ids"]).logits
        p = model(official["padded_input_ids"], official["padded_attention_mask"]).logits
    assert u.dtype == torch.bfloat16
    assert torch.equal(u, bf16["unpadded_logits_bf16"]) and torch.equal(p, bf16["padded_logits_hub_bf16"])
    assert (u.float() - official["unpadded_logits"]).abs().max() > 1e-3  # bf16 really differs from fp32


def test_padding_does_not_change_real_positions(model, official):
    x, m = official["padded_input_ids"], official["padded_attention_mask"].bool()
    with torch.no_grad():
        padded = model(x, m).logits
        for b in range(x.shape[0]):
            alone = model(x[b][m[b]][None]).logits[0]
            torch.testing.assert_close(padded[b][m[b]], alone, rtol=0, atol=1e-5)


def test_fully_padded_row_is_finite_and_leaves_other_rows_alone(model, official):
    x, m = official["padded_input_ids"].clone(), official["padded_attention_mask"].clone()
    m[2] = 0
    with torch.no_grad():
        out = model(x, m).logits
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:2], official["padded_logits_hub"][:2], rtol=0, atol=1e-5)


def test_positions_select_rows_and_shift_is_pure(model, official):
    x = official["unpadded_input_ids"]
    with torch.no_grad():
        full = model(x).logits
        torch.testing.assert_close(model(x, positions=slice(4, None)).logits, full[:, 4:])
        idx = torch.tensor([[1, 7], [0, 11]])
        torch.testing.assert_close(model(x, positions=idx).logits, torch.stack([full[0, [1, 7]], full[1, [0, 11]]]))
    s = shift_logits(full)
    assert torch.equal(s[:, 0], full[:, 0]) and torch.equal(s[:, 1:], full[:, :-1])


def test_kv_cache_window_forward_matches_full_forward(model, official):
    x, m = official["padded_input_ids"], official["padded_attention_mask"]
    cache = KVCache.for_model(model, *x.shape)
    assert len(cache.k) == model.config.n_layers and cache.k[0].shape[1] == model.config.num_key_value_heads
    with torch.no_grad():
        full = model(x, m).logits
        torch.testing.assert_close(model(x, m, kv_cache=cache).logits, full, rtol=0, atol=1e-6)
        window = model(x[:, 8:], m, kv_cache=cache, window_start=8).logits
    torch.testing.assert_close(window, full[:, 8:], rtol=0, atol=1e-6)


def test_save_and_reload_roundtrip_and_tied_embeddings(tmp_path):
    for tied in (False, True):
        m = tiny_dream_model(seed=5, tie_word_embeddings=tied)
        save_checkpoint(m, tmp_path / f"t{tied}")
        cfg = json.loads((tmp_path / f"t{tied}" / "config.json").read_text())
        assert cfg["model_type"] == "Dream" and cfg["architectures"] == ["DreamModel"]
        back = load_dream(tmp_path / f"t{tied}", dtype=torch.float32)
        assert (back.lm_head.weight is back.model.embed_tokens.weight) == tied
        x = torch.randint(5, 100, (2, 6))
        with torch.no_grad():
            torch.testing.assert_close(back(x).logits, m(x).logits, rtol=0, atol=0)


def _copy_with(tmp_path: Path, **changes) -> Path:
    d = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_missing_mask_token_id_is_refused_in_one_line(tmp_path):
    with pytest.raises(CheckpointError, match="mask_token_id") as e:
        load_dream(_copy_with(tmp_path, mask_token_id=None))
    assert "\n" not in str(e.value)


def test_family_detection_and_unknown_family(tmp_path):
    assert detect_family(FIXTURE) == "dream"
    assert detect_family(_copy_with(tmp_path, model_type=None)) == "dream"  # from architectures
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unknown model family") as e:
        detect_family(bad)
    assert "\n" not in str(e.value)


def test_load_model_and_tokenizer_dispatches_on_family(tmp_path):
    d = _copy_with(tmp_path)
    with pytest.raises(ValueError, match="'dream' model but the preset's family is 'llada'"):
        load_model_and_tokenizer(ModelConfig(family="llada", path=str(d)))
    model, tok = load_model_and_tokenizer(ModelConfig(family="dream", path=None))
    assert isinstance(model, DreamModel) and tok.convert_tokens_to_ids("<|mdm_mask|>") == model.mask_token_id


def test_wrong_tensor_shape_is_refused(tmp_path):
    d = _copy_with(tmp_path, num_key_value_heads=4)
    with pytest.raises(CheckpointError, match="k_proj"):
        load_dream(d)


def test_gradients_flow_with_checkpointing():
    m = tiny_dream_model(seed=1).train()
    m.gradient_checkpointing_enable()
    x = torch.randint(5, 100, (2, 6))
    m(x, torch.ones_like(x)).logits.sum().backward()
    assert m.model.layers[0].self_attn.k_proj.bias.grad.abs().sum() > 0


def test_dream_tokenizer_is_read_as_qwen2_without_remote_code(tmp_path):
    """The hub's tokenizer_config.json names DreamTokenizer (remote code: Qwen2's BPE renamed); AutoTokenizer would
    need trust_remote_code, our loader reads it with transformers' Qwen2Tokenizer."""
    from dllm_ais.models.load import load_tokenizer

    vocab = {chr(c): i for i, c in enumerate(range(33, 127))}
    vocab["Ġ"], vocab["ab"] = len(vocab), len(vocab) + 1
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    special = {"special": True, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False}
    n = len(vocab)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "DreamTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "added_tokens_decoder": {str(n): {"content": "<|endoftext|>", **special},
                                 str(n + 1): {"content": "<|mask|>", **special}},
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>", "padding_side": "left"}))
    tok = load_tokenizer(tmp_path)
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert tok("ab c<|mask|>").input_ids == [n - 1, n - 2, vocab["c"], n + 1]
    assert (tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (n, n, n + 1)
