"""The FP8 (and emulated FP4) rollout copy of Dream through the walker (fp8/quantize.py, fp4/linear.py): every
block linear (q/k/v with their biases, o, gate, up, down) quantised, embeddings / norms / LM head kept; the copy
equals its torch twin (the same model run with quantise → dequantise linears: fp8/fake_quant.aligned_forward, and
fp4's fake quantisers), syncs in place from the master after an optimizer step, and keeps Dream's shift and GQA
KV cache."""

from __future__ import annotations

import pytest
import torch
from dream_helpers import padded_canvas
from torch import nn

from dllm_ais.fp4.linear import FORMATS, FP4Linear
from dllm_ais.fp4.linear import quantize_model as quantize_fp4
from dllm_ais.fp8 import FP8Linear, quantize_model, sync_weights
from dllm_ais.fp8.fake_quant import aligned_forward
from dllm_ais.models.dream.model import LORA_TARGETS, DreamModel
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.shift import is_shifted
from dllm_ais.models.tiny import tiny_dream_model

MASK = 4
DTYPES = [torch.float32, torch.bfloat16]


def _walker(model):
    """The walker copy (quantize_model's default for a Dream is the fused one: see the last test)."""
    return quantize_model(model, backend="torch", exclude=lambda name: False)


def _master(dtype):
    # hidden 128 so every weight spans whole and partial 128-blocks (k/v: 64 rows, a ragged block)
    return tiny_dream_model(seed=2, dtype=dtype, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                            num_key_value_heads=2)


def test_fp8_copy_quantises_every_block_linear_and_keeps_the_rest():
    master = _master(torch.float32)
    copy = _walker(master)
    assert isinstance(copy, DreamModel) and is_shifted(copy)
    fp8 = {n for n, m in copy.named_modules() if isinstance(m, FP8Linear)}
    attn = ("q_proj", "k_proj", "v_proj", "o_proj")
    expected = {f"model.layers.{i}.{'self_attn' if name in attn else 'mlp'}.{name}" for i in range(2)
                for name in LORA_TARGETS}
    assert fp8 == expected
    assert isinstance(copy.lm_head, nn.Linear) and not isinstance(copy.lm_head, FP8Linear)
    for name in ("q_proj", "k_proj", "v_proj"):  # the biases travel (bf16, as FP8Linear keeps them)
        layer = getattr(copy.model.layers[0].self_attn, name)
        torch.testing.assert_close(layer.bias.float(),
                                   getattr(master.model.layers[0].self_attn, name).bias.to(torch.bfloat16).float())
    assert copy.model.layers[0].self_attn.o_proj.bias is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_fp8_copy_equals_its_torch_twin(dtype):
    master = _master(dtype)
    copy = _walker(master)
    x, m = padded_canvas()
    with torch.no_grad():
        got = copy(x, m).logits.float()
        with aligned_forward(master):
            twin = master(x, m).logits.float()
        plain = master(x, m).logits.float()
    assert torch.equal(got, twin)  # measured: bit-equal in float32 and bf16 (the same ops on the same codes)
    assert (got - plain).abs().max() > 0.01  # FP8 really is in effect (measured 0.043-0.056, logits up to 0.86)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_fp8_sync_after_an_optimizer_step_equals_a_fresh_quantisation(dtype):
    master = _master(dtype)
    rollout = _walker(master)
    ptrs = {n: t.data_ptr() for n, t in rollout.state_dict().items()}
    x, m = padded_canvas()
    with torch.no_grad():
        stale = rollout(x, m).logits
    master.train()
    opt = torch.optim.AdamW(master.parameters(), lr=1e-3)
    target = torch.randint(5, 100, x.shape, generator=torch.Generator().manual_seed(3))
    nn.functional.cross_entropy(master(x, m).logits.float().transpose(1, 2), target).backward()
    opt.step()
    master.eval()
    sync_weights(master, rollout)
    fresh = _walker(master)
    with torch.no_grad():
        synced, expected = rollout(x, m).logits, fresh(x, m).logits
    assert torch.equal(synced, expected) and not torch.equal(synced, stale)
    fresh_state = fresh.state_dict()
    for name, t in rollout.state_dict().items():
        assert torch.equal(t.view(torch.uint8), fresh_state[name].view(torch.uint8)), name
        assert t.data_ptr() == ptrs[name], f"{name} was reallocated"


def test_fp8_copy_kv_cache_window_equals_its_full_forward():
    copy = _walker(_master(torch.float32))
    x, m = padded_canvas()
    cache = KVCache.for_model(copy, *x.shape)
    with torch.no_grad():
        full = copy(x, m).logits
        copy(x, m, kv_cache=cache)
        window = copy(x[:, 7:], m, kv_cache=cache, window_start=7).logits
    torch.testing.assert_close(window, full[:, 7:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_fp4_copy_equals_its_twin_and_syncs_in_place(fmt):
    master = _master(torch.float32)
    copy = quantize_fp4(master, fmt=fmt)
    assert is_shifted(copy)
    layers = {n: mod for n, mod in copy.named_modules() if isinstance(mod, FP4Linear)}
    assert len(layers) == 14
    x, m = padded_canvas()
    f = FORMATS[fmt]

    def twin_linear(module, inp):  # quantise -> dequantise both operands, fp32 GEMM, + bias
        y = f.fake_act(inp.reshape(-1, inp.shape[-1])) @ f.fake_weight(module.weight).T
        return (y + module.bias if module.bias is not None else y).reshape(*inp.shape[:-1], -1)

    targets = [mod for n, mod in master.named_modules() if f"{n}" in layers]
    for mod in targets:
        mod.forward = lambda inp, _m=mod: twin_linear(_m, inp)
    try:
        with torch.no_grad():
            twin = master(x, m).logits
    finally:
        for mod in targets:
            del mod.forward
    with torch.no_grad():
        got = copy(x, m).logits
        plain = master(x, m).logits
    torch.testing.assert_close(got, twin, rtol=0, atol=1e-5)
    assert (got - plain).abs().max() > 1e-3
    ptrs = {n: t.data_ptr() for n, t in copy.state_dict().items()}
    with torch.no_grad():
        for p in master.parameters():
            p.add_(0.01)
    sync_weights(master, copy)
    fresh = quantize_fp4(master, fmt=fmt)
    with torch.no_grad():
        assert torch.equal(copy(x, m).logits, fresh(x, m).logits)
    assert all(t.data_ptr() == ptrs[n] for n, t in copy.state_dict().items())


def test_lora_wrapped_dream_keeps_the_shift_and_its_fp8_copy_merges_the_adapters():
    """peft LoRA on every block linear (models/dream/model.py lora_target_regex): the likelihood view still shifts, and
    the FP8 copy of the wrapped master equals the copy of the merged model."""
    from peft import LoraConfig, get_peft_model

    from dllm_ais.models.dream.model import lora_target_regex
    from dllm_ais.models.shift import ShiftedLogits, logits_view

    master = _master(torch.float32)
    wrapped = get_peft_model(master, LoraConfig(r=4, lora_alpha=8, target_modules=lora_target_regex()))
    wrapped_names = {n for n, _ in wrapped.named_modules() if n.endswith("lora_A")}
    assert len(wrapped_names) == 2 * len(LORA_TARGETS) and not any("lm_head" in n for n in wrapped_names)
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    assert isinstance(logits_view(wrapped), ShiftedLogits)
    copy = _walker(wrapped)
    merged = _walker(wrapped.merge_and_unload())
    x, m = padded_canvas()
    with torch.no_grad():
        assert torch.equal(copy(x, m).logits, merged(x, m).logits)


def test_default_fp8_copy_is_the_fused_one_and_equals_the_walker_copy():
    """quantize_model (what the trainer's FP8 rollout copy is) builds models/dream/fused_fp8.py's copy for a Dream
    master, and it computes what the walker copy computes."""
    from dllm_ais.models.dream.fused_fp8 import FusedDream

    master = _master(torch.float32)
    fused = quantize_model(master, backend="torch")
    assert isinstance(fused, FusedDream) and is_shifted(fused)
    x, m = padded_canvas()
    with torch.no_grad():
        assert torch.equal(fused(x, m).logits, _walker(master)(x, m).logits)
