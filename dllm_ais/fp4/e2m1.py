"""The FP4 element type e2m1 (OCP MX v1.0 §5.3.3) and the block layout shared by NVFP4 and MXFP4.

e2m1: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit, no inf/NaN. Magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}:
0.5 is the only subnormal, 6 = 1.5·2² the largest normal. Rounding is round-to-nearest, ties to even (even = mantissa
bit 0: 0, 1, 2, 4), and out-of-range values saturate to ±6 (the spec leaves overflow implementation-defined; every
FP4 kernel we know of saturates).

Blocks run along the last dimension K (the GEMM's reduction dimension). A K that is not a multiple of the block size is
zero-padded to one: the last block is a short block whose scale comes from its real elements only (the padding zeros
never change a block's amax), and the padding is dropped again on the way back. Real FP4 GEMMs need K to be a
multiple of the block; this emulation does not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

E2M1_MAX = 6.0
"""Largest e2m1 magnitude (1.5 · 2²)."""
E2M1_EMAX = 2
"""Exponent of the largest normal e2m1 value (emax_elem in the MX spec)."""
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Every non-negative e2m1 value, in order."""


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """x [...] -> [...] fp32 on the e2m1 grid: round to nearest, ties to even, saturate at ±6, keep the sign.

    The grid's spacing is 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]; within each range the even grid points are the
    even multiples of the spacing, so torch.round (ties to even) of |x| / spacing is exactly e2m1's rounding.
    """
    x = x.float()
    a = x.abs().clamp(max=E2M1_MAX)
    step = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))  # [...] grid spacing around |x|
    return torch.copysign(torch.round(a / step) * step, x)


def check_blockable(x: torch.Tensor, what: str) -> None:
    """Raise ValueError unless x is a floating tensor with at least one dimension and a non-empty last dimension."""
    if not x.is_floating_point():
        raise ValueError(f"{what}: expected a floating-point tensor, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{what}: blocks run along the last dimension, which must be non-empty; got shape "
                         f"{tuple(x.shape)}")


def to_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., K] -> [..., ceil(K / block), block] fp32, the tail zero-padded."""
    pad = -x.shape[-1] % block
    xf = x.float()
    if pad:
        xf = F.pad(xf, (0, pad))
    return xf.reshape(*x.shape[:-1], -1, block)


def from_blocks(xb: torch.Tensor, k: int) -> torch.Tensor:
    """xb [..., nb, block] -> [..., k] (drops the padding)."""
    return xb.flatten(-2)[..., :k]
