"""Blockwise FP8 (e4m3) quantisation in plain torch: the reference every kernel is tested against.

Scheme (DeepSeek-V3 / FP8-RL style, DESIGN.md §7):
  * activations x [M, K]: one fp32 scale per 1×128 group along K  -> scales [M, ceil(K/128)]
  * weights     W [N, K]: one fp32 scale per 128×128 block          -> scales [ceil(N/128), ceil(K/128)]
  * scale = amax / 448, codes = e4m3(round-to-nearest-even(clamp(x / scale, ±448))), x ≈ codes · scale.

Zero-safe scales: a group whose amax is 0 gets scale 1.0 (its codes are all 0); a nonzero scale is clamped below at
2**-126 (the smallest normal fp32) so that it is never a denormal or 0. Inputs must be finite.

Ragged shapes use masked tails, not stored padding: codes keep the input's shape, scales cover ceil(dim / 128)
groups, and a tail group's scale comes from its valid elements only (the reference pads with zeros internally, which
leaves every amax unchanged).

A second, coarser scheme ("row") serves torch._scaled_mm: one scale per row of x [M, K] (-> [M, 1]) and per output
channel of W [N, K] (-> [N, 1]).

Division is IEEE round-to-nearest in torch on CPU and CUDA; the Triton kernels use tl.math.div_rn to match bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 128  # quantisation group / block edge
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
MIN_SCALE = 2.0**-126  # smallest normal fp32: lower clamp of a nonzero scale


def num_blocks(n: int) -> int:
    """Number of 128-wide groups covering n elements (the last one may be partial)."""
    return -(-n // BLOCK)


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """amax [...] fp32 -> scale [...] fp32: amax / 448, clamped to ≥ 2**-126; exactly 1.0 where amax == 0."""
    # Divide by a tensor, not a Python scalar: CUDA turns division by a CPU scalar into a reciprocal multiply,
    # which is off by one ulp for some inputs and would break bit-identity with the kernels.
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp_min(MIN_SCALE)
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def to_e4m3(y: torch.Tensor) -> torch.Tensor:
    """y [...] fp32 (already divided by its scale) -> e4m3 codes, saturating at ±448, round-to-nearest-even."""
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 1×128 group along the last dim. x [..., K] float -> (codes [..., K] e4m3, scales [..., ceil(K/128)] fp32)."""
    *lead, K = x.shape
    G = num_blocks(K)
    xf = x.float().reshape(-1, K)
    if K != G * BLOCK:  # ragged: a zero tail (it leaves every amax unchanged); whole blocks need no copy
        xf = F.pad(xf, (0, G * BLOCK - K))  # [M, G*128]
    groups = xf.view(-1, G, BLOCK)  # [M, G, 128]
    scale = scale_from_amax(groups.abs().amax(dim=-1))  # [M, G]
    codes = to_e4m3(groups / scale[..., None]).view(-1, G * BLOCK)  # [M, G*128]
    if K != G * BLOCK:
        codes = codes[:, :K]  # [M, K]
    return codes.reshape(*lead, K).contiguous(), scale.reshape(*lead, G)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 128×128 block. w [N, K] float -> (codes [N, K] e4m3, scales [ceil(N/128), ceil(K/128)] fp32)."""
    if w.dim() != 2:
        raise ValueError(f"quantize_weight expects a 2-D [N, K] weight, got shape {tuple(w.shape)}")
    N, K = w.shape
    NB, KB = num_blocks(N), num_blocks(K)
    wf = F.pad(w.float(), (0, KB * BLOCK - K, 0, NB * BLOCK - N))  # [NB*128, KB*128], zero tails
    blocks = wf.view(NB, BLOCK, KB, BLOCK)  # [NB, 128, KB, 128]
    scale = scale_from_amax(blocks.abs().amax(dim=(1, 3)))  # [NB, KB]
    codes = to_e4m3(blocks / scale[:, None, :, None]).view(NB * BLOCK, KB * BLOCK)[:N, :K]  # [N, K]
    return codes.contiguous(), scale


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row ("row" scheme, for torch._scaled_mm). x [R, K] -> (codes [R, K] e4m3, scales [R, 1] fp32)."""
    xf = x.float()
    scale = scale_from_amax(xf.abs().amax(dim=-1, keepdim=True))  # [R, 1]
    return to_e4m3(xf / scale), scale


def _expand(scale: torch.Tensor, rows_per_block: int, shape: torch.Size) -> torch.Tensor:
    """scale [R', G] -> [R, K] by repeating each entry over its block (rows_per_block × 128), cut to shape [R, K]."""
    R, K = shape
    return scale.repeat_interleave(rows_per_block, dim=0)[:R].repeat_interleave(BLOCK, dim=1)[:, :K]


def dequantize_act(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """codes [..., K], scales [..., ceil(K/128)] -> x [..., K] fp32."""
    *lead, K = q.shape
    if tuple(s.shape) != (*lead, num_blocks(K)):
        raise ValueError(f"activation scales must have shape {(*lead, num_blocks(K))}, got {tuple(s.shape)}")
    q2 = q.reshape(-1, K)
    return (q2.float() * _expand(s.reshape(q2.shape[0], -1).float(), 1, q2.shape)).reshape(q.shape)


def dequantize_weight(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """codes [N, K], scales [ceil(N/128), ceil(K/128)] -> W [N, K] fp32."""
    N, K = q.shape
    if tuple(s.shape) != (num_blocks(N), num_blocks(K)):
        raise ValueError(f"weight scales must have shape {(num_blocks(N), num_blocks(K))}, got {tuple(s.shape)}")
    return q.float() * _expand(s.float(), BLOCK, q.shape)


def fp8_gemm_reference(
    xq: torch.Tensor,
    xs: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Dequantising reference GEMM y = x @ W^T in fp32, cast to out_dtype.

    xq [M, K] e4m3, xs [M, ceil(K/128)] fp32, wq [N, K] e4m3, ws [ceil(N/128), ceil(K/128)] fp32 -> y [M, N].
    """
    if xq.dim() != 2 or wq.dim() != 2 or xq.shape[1] != wq.shape[1]:
        raise ValueError(f"need xq [M, K] and wq [N, K] with the same K, got {tuple(xq.shape)} and {tuple(wq.shape)}")
    x = dequantize_act(xq, xs)  # [M, K]
    w = dequantize_weight(wq, ws)  # [N, K]
    return (x @ w.T).to(out_dtype)  # [M, N]
