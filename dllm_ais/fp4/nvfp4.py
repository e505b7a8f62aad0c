"""NVFP4 (NVIDIA Blackwell): e2m1 elements in blocks of 16, one e4m3 scale per block, one fp32 scale per tensor.

Two-level scaling (NVIDIA's NVFP4 description; torchao's nvfp4_quantize uses the same recipe):
  s_tensor = amax(|tensor|) / (6 · 448)                      fp32, so that every block scale fits e4m3 (max 448)
  s_block  = e4m3(amax(|block|) / 6 / s_tensor)              rounded to nearest e4m3 (ties to even), saturated at
                                                             448 and raised to the smallest e4m3 value 2^−9 (so an
                                                             all-zero or vanishing block never divides by zero)
  q        = round_to_e2m1(x · ((1 / s_tensor) / s_block))   elements beyond ±6 after the rounded scale saturate
  x̂        = q · s_block · s_tensor
The fp32 operations run in that order, as in torchao's nvfp4_quantize (which says it matches NVIDIA's MSLK Triton
kernel): the codes and block scales equal torchao's bit for bit, except that torchao raises block scales to 2^−6
(the smallest normal e4m3) where we allow e4m3's subnormals down to 2^−9 — they differ only for blocks whose amax
is below 2^−6 · 6 · s_tensor, i.e. under 1/75000 of the tensor's amax. An all-zero tensor gets s_tensor = 1 (its
codes are all 0 whatever the scale).

Activations: the "tensor" of the fp32 scale is one token row (fake_nvfp4_act), not the whole batch, so the rollout
policy's probabilities of a sequence never depend on which other sequences share its batch (the IS weights need
log μ(y|x) to be a function of the sequence alone). Weights use one scale per weight matrix.
"""

from __future__ import annotations

import torch

from .e2m1 import E2M1_MAX, check_blockable, from_blocks, round_to_e2m1, to_blocks

NVFP4_BLOCK = 16
"""Elements per block (along K)."""
E4M3_MAX = 448.0
"""Largest e4m3 (float8_e4m3fn) value."""
E4M3_MIN = 2.0**-9
"""Smallest positive e4m3 value (a subnormal)."""


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x [...] >= 0 -> [...] fp32 on the e4m3 grid: nearest (ties to even), clamped to [2^−9, 448]."""
    return x.float().clamp(E4M3_MIN, E4M3_MAX).to(torch.float8_e4m3fn).float()


def nvfp4_tensor_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax [...] -> [...] fp32 second-level scale amax / (6 · 448); 1 where that is 0 (an all-zero tensor)."""
    s = amax.float() / (E2M1_MAX * E4M3_MAX)
    return torch.where(s > 0, s, torch.ones_like(s))


def nvfp4_quantize(x: torch.Tensor, tensor_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K], tensor_scale [] or broadcastable to x.shape[:-1] ->
    (q [..., K] fp32 e2m1 values, block_scale [..., ceil(K/16)] fp32 e4m3 values)."""
    check_blockable(x, "nvfp4_quantize")
    xb = to_blocks(x, NVFP4_BLOCK)  # [..., nb, 16]
    ts = tensor_scale.float()[..., None]  # [..., 1] against [..., nb]
    block_scale = round_to_e4m3(xb.abs().amax(dim=-1) / E2M1_MAX / ts)  # [..., nb]
    q = round_to_e2m1(xb * ((1.0 / ts) / block_scale).unsqueeze(-1))  # [..., nb, 16]
    return from_blocks(q, x.shape[-1]), block_scale


def nvfp4_dequantize(q: torch.Tensor, block_scale: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """q [..., K], block_scale [..., nb], tensor_scale [] or broadcastable to q.shape[:-1] -> [..., K] fp32."""
    qb = to_blocks(q, NVFP4_BLOCK)  # [..., nb, 16]
    ts = tensor_scale.float()[..., None, None]  # [..., 1, 1]
    return from_blocks(qb * block_scale.unsqueeze(-1) * ts, q.shape[-1])  # (q · s_block, exact) · s_tensor


def fake_nvfp4_weight(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] -> [N, K] fp32 through NVFP4 with one fp32 scale for the whole matrix."""
    ts = nvfp4_tensor_scale(w.detach().abs().amax())  # []
    return nvfp4_dequantize(*nvfp4_quantize(w, ts), ts)


def fake_nvfp4_act(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> [..., K] fp32 through NVFP4 with one fp32 scale per row (token)."""
    ts = nvfp4_tensor_scale(x.detach().abs().amax(dim=-1))  # [...]
    return nvfp4_dequantize(*nvfp4_quantize(x, ts), ts)
