"""Fake-quantised (quantise → dequantise) forwards with straight-through gradients: QaRL's rollout-aligned training.

`aligned_forward(model)` makes every linear layer that `quantize_model` would turn into an FP8Linear compute

    y = (Q_act(x) @ Q_w(W)^T) in fp32 (+ bias rounded to bf16 as FP8Linear stores it), cast to x.dtype

with Q_act / Q_w the reference quantisers of quant.py (1×128 activation groups, 128×128 weight blocks; or the row
scheme of the `scaled_mm` backend) — the same numbers the rollout copy's "torch" backend produces — while the
backward pass treats Q as the identity (straight-through estimator), so gradients reach the BF16 master weights (and
LoRA adapters: a LoRA layer's merged weight W + scaling·B@A is fake-quantised as a whole, as the rollout copy
quantises it). The model is patched only inside the `with` block (instance `forward` attributes, removed on exit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from . import quant
from .walker import effective_weight, quantizable_layers


def _fq_block_act(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> fp32 [..., K]: per 1×128 group quantised and dequantised."""
    return quant.dequantize_act(*quant.quantize_act(x))


def _fq_block_weight(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] -> fp32 [N, K]: per 128×128 block quantised and dequantised."""
    return quant.dequantize_weight(*quant.quantize_weight(w))


def _fq_row(x: torch.Tensor) -> torch.Tensor:
    """x [R, K] -> fp32 [R, K]: one scale per row (activations per token row, weights per output channel)."""
    q, s = quant.quantize_rowwise(x)
    return q.float() * s


FAKE_QUANT = {
    "block": (_fq_block_act, _fq_block_weight),
    "row": (_fq_row, _fq_row),
}
"""scheme -> (activation fake-quant, weight fake-quant); the scheme of a backend is backends.BACKENDS[name].scheme."""


class _StraightThrough(torch.autograd.Function):
    """Forward: fn(x) (fp32). Backward: the identity (gradient cast back to x's dtype)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fn) -> torch.Tensor:
        ctx.dtype = x.dtype
        return fn(x.detach())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.dtype), None


def fake_quant_act(x: torch.Tensor, scheme: str = "block") -> torch.Tensor:
    """x [..., K] -> fp32 [..., K] fake-quantised like the rollout copy's activations; straight-through gradient."""
    return _StraightThrough.apply(x, FAKE_QUANT[scheme][0])


def fake_quant_weight(w: torch.Tensor, scheme: str = "block") -> torch.Tensor:
    """w [N, K] -> fp32 [N, K] fake-quantised like the rollout copy's weights; straight-through gradient."""
    return _StraightThrough.apply(w, FAKE_QUANT[scheme][1])


def aligned_linear(module: nn.Module, x: torch.Tensor, scheme: str = "block") -> torch.Tensor:
    """The aligned forward of one linear (or LoRA-wrapped linear) layer: x [..., K] -> [..., N] in x.dtype."""
    weight, bias = effective_weight(module)  # [N, K], [N] | None; differentiable (LoRA merge included)
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    y = fake_quant_act(x2, scheme) @ fake_quant_weight(weight, scheme).T  # [M, N] fp32
    if bias is not None:
        y = y + _StraightThrough.apply(bias, lambda b: b.to(torch.bfloat16).float())  # FP8Linear keeps a bf16 bias
    return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])


def aligned_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers quantize_model replaces: every (LoRA-wrapped) nn.Linear except the LM head."""
    return quantizable_layers(model)


@contextlib.contextmanager
def aligned_forward(model: nn.Module, scheme: str = "block") -> Iterator[nn.Module]:
    """Within the block, `model`'s quantisable linears run `aligned_linear` (fake-quant, straight-through)."""
    if scheme not in FAKE_QUANT:
        raise ValueError(f"fake-quant scheme {scheme!r}: use one of {', '.join(FAKE_QUANT)}.")
    layers = list(aligned_layers(model).values())
    for layer in layers:
        layer.forward = lambda x, _m=layer: aligned_linear(_m, x, scheme)
    try:
        yield model
    finally:
        for layer in layers:
            del layer.forward
