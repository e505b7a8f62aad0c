"""The compact Qwen3 rollout model: logits equal transformers' Qwen3 (float32, left padding, tied or untied head), the
cached path (chunked prefill + one-token decode) equals the cache-free pass, syncing from the master (LoRA merged)
is in place, and the FP8 copy has fused FP8Linear projections with one activation quantisation per input."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.fp8 import FP8Linear
from dllm_ais.fp8 import linear as fp8_linear
from dllm_ais.models.qwen.model import tiny_qwen, tiny_qwen_config
from dllm_ais.models.qwen.rollout import QwenRollout, QwenShape, rollout_copy, supports, sync_qwen_rollout

IDS = torch.tensor([[5, 17, 42, 99, 3, 60, 7, 8], [1, 1, 1, 20, 21, 22, 23, 24], [1, 9, 9, 9, 9, 9, 9, 9]])
MASK = torch.tensor([[1] * 8, [0, 0, 0, 1, 1, 1, 1, 1], [0] + [1] * 7]).bool()
POS = (MASK.long().cumsum(-1) - 1).clamp_min(0)


def _hf_logits(model):
    return model(input_ids=IDS, attention_mask=MASK.long(), position_ids=POS).logits.detach()


@pytest.mark.parametrize("tied", [False, True])
def test_logits_match_transformers_qwen3_fp32(tied):
    master = tiny_qwen(seed=4, tie_word_embeddings=tied)
    rollout = rollout_copy(master)
    assert isinstance(rollout, QwenRollout) and (rollout.lm_head is None) == tied
    ref, got = _hf_logits(master), rollout(IDS, MASK, POS).logits
    assert got.shape == ref.shape == (3, 8, 128)
    torch.testing.assert_close(got[MASK], ref[MASK], atol=1e-5, rtol=1e-5)  # padded positions are never used
    assert ref[MASK].abs().max() > 0.1  # not a vacuous comparison


def test_logits_match_transformers_with_nontrivial_norms():
    """Norm weights and q/k norms away from 1 (a fresh model has them all at 1, which would hide a swapped norm)."""
    master = tiny_qwen(seed=5)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in master.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.rand(p.shape, generator=g))
    rollout = rollout_copy(master)
    torch.testing.assert_close(rollout(IDS, MASK, POS).logits[MASK], _hf_logits(master)[MASK], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_cached_prefill_and_decode_equal_cache_free_pass(chunk):
    master = tiny_qwen(seed=6, dtype=torch.float64)
    rollout = rollout_copy(master)
    full = rollout(IDS, MASK, POS).logits  # [B, T, V]
    P = 5
    rollout.setup_cache(3, 16)
    key_valid = torch.zeros(3, 16, dtype=torch.bool)
    key_valid[:, :8] = MASK
    last = rollout.prefill(IDS[:, :P], POS[:, :P], key_valid, chunk)  # [B, V]
    torch.testing.assert_close(last, full[:, P - 1], atol=1e-10, rtol=0)
    for t in range(P, 8):  # feed the rest one column at a time (slot t, position POS[:, t])
        got = rollout.decode_logits(IDS[:, t], POS[:, t], torch.tensor([t]), key_valid)
        rows = MASK[:, t]
        torch.testing.assert_close(got[rows], full[rows, t], atol=1e-10, rtol=0)


def test_sync_is_in_place_and_tracks_the_master():
    master = tiny_qwen(seed=7)
    rollout = rollout_copy(master)
    ptrs = {n: t.data_ptr() for n, t in rollout.state_dict().items()}
    with torch.no_grad():
        for p in master.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    before = rollout(IDS, MASK, POS).logits
    assert (before[MASK] - _hf_logits(master)[MASK]).abs().max() > 1e-4  # stale until synced
    sync_qwen_rollout(master, rollout)
    torch.testing.assert_close(rollout(IDS, MASK, POS).logits[MASK], _hf_logits(master)[MASK], atol=1e-5, rtol=1e-5)
    assert ptrs == {n: t.data_ptr() for n, t in rollout.state_dict().items()}  # nothing reallocated


def test_lora_master_is_merged_on_the_fly():
    peft = pytest.importorskip("peft")
    master = tiny_qwen(seed=8)
    wrapped = peft.get_peft_model(master, peft.LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    assert supports(wrapped)
    rollout = rollout_copy(wrapped)
    ref = wrapped(input_ids=IDS, attention_mask=MASK.long(), position_ids=POS).logits.detach()
    with wrapped.disable_adapter():
        base = wrapped(input_ids=IDS, attention_mask=MASK.long(), position_ids=POS).logits.detach()
    assert (ref[MASK] - base[MASK]).abs().max() > 1e-3  # the adapters matter
    torch.testing.assert_close(rollout(IDS, MASK, POS).logits[MASK], ref[MASK], atol=1e-5, rtol=1e-5)


def test_fp8_copy_is_fused_with_one_activation_quantisation_per_input(monkeypatch):
    master = tiny_qwen(seed=9)
    rollout = rollout_copy(master, fp8_backend="torch")
    for layer in rollout.layers:
        fp8 = [m for m in layer.modules() if isinstance(m, FP8Linear)]
        assert [m.out_features for m in fp8] == [(4 + 2 * 2) * 16, 64, 2 * 128, 64]  # wqkv, o_proj, gate_up, down
    assert not isinstance(rollout.lm_head, FP8Linear)
    calls = []
    real = fp8_linear.quant.quantize_act
    monkeypatch.setattr(fp8_linear.quant, "quantize_act", lambda x: calls.append(x.shape) or real(x))
    got = rollout(IDS, MASK, POS).logits
    assert len(calls) == 4 * len(rollout.layers)  # wqkv, o_proj, gate_up, down: one each (unfused: 7)
    # FP8 is lossy but close: SNR of the logits against the fp32 master
    ref = _hf_logits(master)[MASK]
    snr = 10 * torch.log10(ref.pow(2).sum() / (got[MASK] - ref).pow(2).sum())
    assert snr > 20, f"FP8 logits SNR {snr:.1f} dB"
    assert (got[MASK] - ref).abs().max() > 0  # it is quantised


def test_fp8_sync_requantises_in_place():
    master = tiny_qwen(seed=10)
    rollout = rollout_copy(master, fp8_backend="torch")
    layer = rollout.layers[0].wqkv
    ptr, codes = layer.weight_q.data_ptr(), layer.weight_q.clone()
    with torch.no_grad():
        master.model.layers[0].self_attn.k_proj.weight.mul_(3.0)
    sync_qwen_rollout(master, rollout)
    assert layer.weight_q.data_ptr() == ptr and not torch.equal(layer.weight_q.view(torch.uint8),
                                                                codes.view(torch.uint8))
    w = torch.cat([master.model.layers[0].self_attn.q_proj.weight, master.model.layers[0].self_attn.k_proj.weight,
                   master.model.layers[0].self_attn.v_proj.weight])
    err = (layer.dequantized_weight() - w).abs().max() / w.abs().max()
    assert err < 0.07  # e4m3 has a 3-bit mantissa: ≤ 2^-4 relative to the block maximum


def test_supports_and_refusals():
    from transformers import Qwen2Config

    assert supports(tiny_qwen(seed=0))
    qwen2 = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="Qwen3 only"):
        QwenShape.from_config(qwen2)
    with pytest.raises(ValueError, match="rope_type"):
        QwenShape.from_config(tiny_qwen_config(rope_parameters={"rope_type": "linear", "rope_theta": 1e4,
                                                                "factor": 2.0}))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        QwenShape(128, 64, 128, 1, 4, 3, 16, 1e-6, 1e4, False)


def test_trainer_uses_the_fused_copy_for_qwen3_fp8_and_keeps_it_synced(tmp_path):
    from dataclasses import replace

    from dllm_ais.presets import get_preset
    from dllm_ais.train.job import run_training

    p = get_preset("tiny-qwen")
    p = replace(p, train=replace(p.train, steps=2, prompts_per_step=2, sft_steps=0, rollout_precision="fp8",
                                 fp8_backend="torch"), grpo=replace(p.grpo, num_generations=2))
    trainer = run_training(p, tmp_path / "run", progress=False)
    rollout = trainer.rollout_model
    assert isinstance(rollout, QwenRollout) and rollout.fp8_backend == "torch"
    with torch.no_grad():  # an update the copy has not seen yet
        for param in trainer.master.parameters():
            param.mul_(1.5)

    def raw(t):
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

    stale = {n: raw(t).clone() for n, t in rollout.state_dict().items()}
    trainer._sync_rollout()  # what the trainer runs after every optimizer step
    got, want = rollout.state_dict(), rollout_copy(trainer.master, fp8_backend="torch").state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(raw(got[n]), raw(want[n])) for n in got)
    assert not all(torch.equal(raw(got[n]), stale[n]) for n in got)
