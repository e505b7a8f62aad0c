"""Producers of the fused rollout model in plain torch: the exact math of models/llada/model.py, optionally followed by
the 1×128 activation quantisation of the consumer GEMM. Each function here is the twin of a Triton kernel in
`producer_kernels.py`, and the reference its tests hold it against.

A producer twin returns what `quant.quantize_act` makes of the producer's exact output in the model's dtype (bf16
rounding included), so a fused model built on these twins computes the same numbers as the unfused FP8 copy, whose
FP8Linear quantises the bf16 output of the same ops.

  rms_norm / rmsnorm_quant      RMSNorm (fp32 math, result in x.dtype)                       -> [M, d]
  silu_mul / silu_mul_quant     SiLU(gate) · up as torch evaluates F.silu(g) * u in x.dtype  -> [M, h]
  attn_out_quant                attention output [B, H, T, D] read as [B·T, H·D], quantised  -> [B·T, d]
  *_rowquant                    the same three producers quantised per ROW (one scale per token: the "row" scheme
                                of the scaled_mm backend; quant.quantize_rowwise) -> codes, scales [M, 1]
  rope_tables / apply_rope      rotary tables of half width (no `cat`) and the rotation of a [B, T, H, D] view into
                                a [B, H, T, D] tensor (the layout SDPA takes); bit-equal to llada.apply_rope
  qk_norm_rope                  Qwen3's (SDAR's) per-head q / k RMSNorm then rotate-half RoPE in the MODEL dtype
                                (tables in that dtype, each product and sum rounded to it, as models/gqa.py `rotate`):
                                a [B, T, H, D] view -> [B, H, T, D]; bit-equal to SDAR's q_norm + rotate
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import quant


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] -> x / rms(x) · weight in x.dtype (fp32 math), exactly as llada.RMSNorm."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


def rmsnorm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, d] -> (codes [M, d] e4m3, scales [M, ceil(d/128)] fp32) of rms_norm(x)."""
    return quant.quantize_act(rms_norm(x, weight, eps))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [M, h] (same dtype) -> SiLU(gate) · up [M, h], each op rounded to the dtype as torch does."""
    return F.silu(gate) * up


def silu_mul_quant(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gate, up [M, h] -> (codes [M, h] e4m3, scales [M, ceil(h/128)] fp32) of silu_mul(gate, up)."""
    return quant.quantize_act(silu_mul(gate, up))


def attn_merge(att: torch.Tensor) -> torch.Tensor:
    """att [B, H, T, D] -> [B·T, H·D] (heads side by side per token)."""
    B, H, T, D = att.shape
    return att.transpose(1, 2).reshape(B * T, H * D)


def attn_out_quant(att: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """att [B, H, T, D] -> (codes [B·T, H·D] e4m3, scales [B·T, ceil(H·D/128)] fp32)."""
    return quant.quantize_act(attn_merge(att))


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer positions [B, T] -> cos, sin [B, T, head_dim/2] fp32: the first half of llada.rope_cos_sin's tables
    (whose second half repeats the first)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, T, head_dim/2]
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] (any strides) rotated by cos, sin [B, T, D/2] -> [B, H, T, D] contiguous in x.dtype.

    out[:D/2] = x1·c − x2·s, out[D/2:] = x2·c + x1·s in fp32: the same products and sums as llada.apply_rope's
    x·cos + cat(−x2, x1)·sin, without building the rotated copy.
    """
    x = x.transpose(1, 2)  # [B, H, T, D] view
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()  # [B, H, T, D/2]
    c, s = cos[:, None], sin[:, None]  # [B, 1, T, D/2]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out[..., :half] = x1 * c - x2 * s
    out[..., half:] = x2 * c + x1 * s
    return out


def rmsnorm_rowquant(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, d] -> (codes [M, d] e4m3, scales [M, 1] fp32) of rms_norm(x), one scale per row."""
    return quant.quantize_rowwise(rms_norm(x, weight, eps))


def silu_mul_rowquant(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gate, up [M, h] -> (codes [M, h] e4m3, scales [M, 1] fp32) of silu_mul(gate, up), one scale per row."""
    return quant.quantize_rowwise(silu_mul(gate, up))


def attn_out_rowquant(att: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """att [B, H, T, D] -> (codes [B·T, H·D] e4m3, scales [B·T, 1] fp32), one scale per token row."""
    return quant.quantize_rowwise(attn_merge(att))


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                 sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] (any strides; a view into the fused QKV output), weight [D], cos, sin [B, T, D/2] in x.dtype
    (the first half of models/gqa.py `rope_tables`, whose halves repeat) -> [B, H, T, D] contiguous in x.dtype.

    y = rms_norm(x) per head (fp32 math, one cast: SDAR's q_norm / k_norm), then out[:D/2] = y1·c − y2·s,
    out[D/2:] = y2·c + y1·s with every product and sum rounded to x.dtype: the same roundings as gqa.rotate's
    y·cos + cat(−y2, y1)·sin (round(−a) = −round(a)), without building the rotated copy."""
    y = rms_norm(x, weight, eps).transpose(1, 2)  # [B, H, T, D]
    half = y.shape[-1] // 2
    y1, y2 = y[..., :half], y[..., half:]
    c, s = cos[:, None], sin[:, None]  # [B, 1, T, D/2]
    out = torch.empty(y.shape, dtype=x.dtype, device=x.device)
    out[..., :half] = y1 * c - y2 * s
    out[..., half:] = y2 * c + y1 * s
    return out
