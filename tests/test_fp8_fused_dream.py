"""The fused Dream rollout copy (models/dream/fused_fp8.py: q/k/v with GQA and biases stacked, gate/up stacked): equal
to the master (BF16 copy) and to the walker FP8 copy (FP8, torch backend) bit for bit in float32 and bf16, synced in
place by sync_weights, KV cache windows, LoRA merged, the shift kept."""

from __future__ import annotations

import pytest
import torch
from dream_helpers import padded_canvas
from torch import nn

from dllm_ais.fp8 import FP8Linear, quantize_model, sync_weights
from dllm_ais.models.dream.fused_fp8 import FusedDream, build_fused_dream
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.shift import ShiftedLogits, logits_view
from dllm_ais.models.tiny import tiny_dream_model

MASK = 4
DTYPES = [torch.float32, torch.bfloat16]


def _master(dtype, **kw):
    # q: 4 heads × 32 = 128 rows; k, v: 2 × 32 = 64 rows each (a ragged 128-block, padded in the fused weight)
    return tiny_dream_model(seed=2, dtype=dtype, hidden_size=128, intermediate_size=192, num_attention_heads=4,
                            num_key_value_heads=2, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_fused_copies_equal_master_and_walker_copy(dtype):
    master = _master(dtype)
    x, m = padded_canvas()
    bf16 = build_fused_dream(master, None)
    fp8 = build_fused_dream(master, "torch")
    assert isinstance(fp8, FusedDream) and sum(isinstance(mod, FP8Linear) for mod in fp8.modules()) == 8
    assert fp8.layers[0].qkv.out_features == 3 * 128  # q 128 + k, v padded from 64 to 128
    with torch.no_grad():
        ref = master(x, m).logits
        walker = quantize_model(master, backend="torch")(x, m).logits
        assert torch.equal(bf16(x, m).logits, ref)
        got = fp8(x, m).logits
    assert torch.equal(got, walker)  # measured: bit-equal in float32 and bf16
    assert (got.float() - ref.float()).abs().max() > 0.01


def test_fused_sync_after_an_optimizer_step_is_in_place_and_fresh():
    master = _master(torch.float32)
    rollout = build_fused_dream(master, "torch")
    ptrs = {n: t.data_ptr() for n, t in rollout.state_dict().items()}
    x, m = padded_canvas()
    master.train()
    opt = torch.optim.AdamW(master.parameters(), lr=1e-3)
    target = torch.randint(5, 100, x.shape, generator=torch.Generator().manual_seed(3))
    nn.functional.cross_entropy(master(x, m).logits.transpose(1, 2), target).backward()
    opt.step()
    master.eval()
    with torch.no_grad():
        stale = rollout(x, m).logits
    sync_weights(master, rollout)
    fresh = build_fused_dream(master, "torch")
    with torch.no_grad():
        synced = rollout(x, m).logits
        assert torch.equal(synced, fresh(x, m).logits) and not torch.equal(synced, stale)
    fresh_state = fresh.state_dict()
    for name, t in rollout.state_dict().items():
        assert torch.equal(t.view(torch.uint8), fresh_state[name].view(torch.uint8)), name
        assert t.data_ptr() == ptrs[name], f"{name} was reallocated"


def test_fused_kv_cache_window_and_shift():
    rollout = build_fused_dream(_master(torch.float32), "torch")
    assert isinstance(logits_view(rollout), ShiftedLogits)
    x, m = padded_canvas()
    cache = KVCache.for_model(rollout, *x.shape)
    assert cache.k[0].shape[1] == 2  # [B, H_kv, T, D] per layer
    with torch.no_grad():
        full = rollout(x, m).logits
        rollout(x, m, kv_cache=cache)
        window = rollout(x[:, 7:], m, kv_cache=cache, window_start=7).logits
    torch.testing.assert_close(window, full[:, 7:], rtol=0, atol=1e-5)


def test_fused_copy_of_a_lora_master_merges_the_adapters():
    from peft import LoraConfig, get_peft_model

    from dllm_ais.models.dream.model import lora_target_regex

    wrapped = get_peft_model(_master(torch.float32), LoraConfig(r=4, lora_alpha=8,
                                                                  target_modules=lora_target_regex()))
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    copy = build_fused_dream(wrapped, "torch")
    merged = build_fused_dream(wrapped.merge_and_unload(), "torch")
    x, m = padded_canvas()
    with torch.no_grad():
        assert torch.equal(copy(x, m).logits, merged(x, m).logits)


def test_build_refuses_other_models():
    with pytest.raises(TypeError, match="DreamModel"):
        build_fused_dream(nn.Linear(16, 16), "torch")
