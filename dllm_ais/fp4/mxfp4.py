"""MXFP4 (OCP Microscaling Formats v1.0): e2m1 elements in blocks of 32, one power-of-two e8m0 scale per block.

Scale rule (spec §6.3): X = 2^(floor(log2(amax)) − emax_elem) with emax_elem = 2 for e2m1, then each element is
round_to_e2m1(V / X). amax / X lies in [4, 8), so the block's largest elements can exceed 6 and saturate to ±6 (the
spec's known clipping; NVIDIA's "RCEIL" variant rounds the scale up instead: not implemented here).
e8m0 holds unbiased exponents −127 … 127 (bias 127; 0xFF is NaN); exponents outside are clamped. An all-zero block
gets the smallest scale 2^−127 (any scale would do: its elements are all 0).
"""

from __future__ import annotations

import torch

from .e2m1 import E2M1_EMAX, check_blockable, from_blocks, round_to_e2m1, to_blocks

MXFP4_BLOCK = 32
"""Elements per block (along K)."""
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127
"""Range of the unbiased e8m0 exponent."""


def mxfp4_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """amax [...] (>= 0) -> [...] int32 unbiased e8m0 exponent floor(log2(amax)) − 2, clamped to [−127, 127]."""
    amax = amax.float()
    _, e = torch.frexp(amax)  # amax = m · 2^e with m in [0.5, 1): floor(log2(amax)) = e − 1, exactly
    exp = (e.to(torch.int32) - 1 - E2M1_EMAX).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    return torch.where(amax > 0, exp, torch.full_like(exp, E8M0_MIN_EXP))


def mxfp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (q [..., K] fp32 e2m1 values, scale_exp [..., ceil(K/32)] int32 unbiased e8m0 exponents)."""
    check_blockable(x, "mxfp4_quantize")
    xb = to_blocks(x, MXFP4_BLOCK)  # [..., nb, 32]
    exp = mxfp4_scale_exponent(xb.abs().amax(dim=-1))  # [..., nb]
    scale = torch.exp2(exp.float()).unsqueeze(-1)  # [..., nb, 1], exact powers of two
    return from_blocks(round_to_e2m1(xb / scale), x.shape[-1]), exp


def mxfp4_dequantize(q: torch.Tensor, scale_exp: torch.Tensor) -> torch.Tensor:
    """q [..., K] e2m1 values, scale_exp [..., nb] -> [..., K] fp32 (q · 2^exp, exact)."""
    qb = to_blocks(q, MXFP4_BLOCK)  # [..., nb, 32]
    return from_blocks(qb * torch.exp2(scale_exp.float()).unsqueeze(-1), q.shape[-1])


def fake_mxfp4(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> [..., K] fp32: quantise to MXFP4 and back (weights and activations alike: no tensor scale)."""
    return mxfp4_dequantize(*mxfp4_quantize(x))
