"""Fake-quantised aligned forward (dllm_ais/fp8/fake_quant.py) against quant.py's reference and the FP8 rollout copy."""

import pytest
import torch
from torch import nn

from dllm_ais.fp8 import FP8Linear, quant, quantize_model
from dllm_ais.fp8.fake_quant import aligned_forward, aligned_linear, fake_quant_act, fake_quant_weight
from dllm_ais.models.tiny import tiny_model


@pytest.mark.parametrize("shape", [(3, 128), (5, 200), (2, 7, 48)])
def test_fake_quant_act_matches_the_reference(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3
    expected = quant.dequantize_act(*quant.quantize_act(x))
    assert torch.equal(fake_quant_act(x), expected)
    assert not torch.equal(fake_quant_act(x), x)  # lossy


@pytest.mark.parametrize("shape", [(128, 128), (48, 200), (300, 16)])
def test_fake_quant_weight_matches_the_reference(shape):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(fake_quant_weight(w), quant.dequantize_weight(*quant.quantize_weight(w)))
    q, s = quant.quantize_rowwise(w)
    assert torch.equal(fake_quant_weight(w, "row"), q.float() * s)


def test_straight_through_gradients():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(32, 48, generator=g, requires_grad=True)
    x = torch.randn(4, 48, generator=g, requires_grad=True)
    upstream = torch.randn(4, 32, generator=g)
    (fake_quant_act(x) @ fake_quant_weight(w).T).backward(upstream)
    xq, wq = fake_quant_act(x.detach()), fake_quant_weight(w.detach())
    torch.testing.assert_close(w.grad, upstream.T @ xq)  # ∂/∂W of x_q W_q^T with ∂W_q/∂W = I
    torch.testing.assert_close(x.grad, upstream @ wq)


@pytest.mark.parametrize("dtype, bias", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)])
def test_aligned_linear_equals_the_fp8_rollout_layer(dtype, bias):
    g = torch.Generator().manual_seed(3)
    layer = nn.Linear(160, 48, bias=bias).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 160, generator=g))
    x = torch.randn(2, 5, 160, generator=g).to(dtype)
    fp8 = FP8Linear.from_linear(layer, "torch")
    with torch.no_grad():
        assert torch.equal(aligned_linear(layer, x), fp8(x))
        assert not torch.equal(layer(x), fp8(x))


def _logits(model, ids):
    return model(ids).logits


def test_aligned_forward_reproduces_the_rollout_copy_and_trains_the_master():
    model = tiny_model(seed=0)
    fp8 = quantize_model(model, backend="torch")
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain, rollout = _logits(model, ids), _logits(fp8, ids)
        with aligned_forward(model):
            aligned = _logits(model, ids)
        after = _logits(model, ids)
    assert torch.equal(after, plain), "the patch is removed on exit"
    gap_plain = (plain - rollout).abs().max().item()
    gap_aligned = (aligned - rollout).abs().max().item()
    assert gap_plain > 1e-4 and gap_aligned < 1e-5 * max(1.0, rollout.abs().max().item())
    with aligned_forward(model):
        _logits(model, ids).logsumexp(-1).sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(gr is not None and torch.isfinite(gr).all() for gr in grads)
    assert model.model.transformer.blocks[0].q_proj.weight.grad.abs().sum() > 0


def test_aligned_forward_with_lora_matches_the_merged_rollout_copy():
    from peft import LoraConfig, get_peft_model

    from dllm_ais.models.llada.model import lora_target_regex

    model = get_peft_model(tiny_model(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=lora_target_regex()))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    fp8 = quantize_model(model, backend="torch")
    ids = torch.randint(0, 100, (2, 9), generator=g)
    with torch.no_grad(), aligned_forward(model):
        aligned = _logits(model, ids)
    rollout = _logits(fp8, ids).detach()
    torch.testing.assert_close(aligned, rollout, rtol=1e-5, atol=1e-5)
    with aligned_forward(model):
        _logits(model, ids).logsumexp(-1).sum().backward()
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n]
    assert lora_grads and all(gr is not None and gr.abs().sum() > 0 for gr in lora_grads)
