"""RoPE and grouped-query attention of the Qwen-shaped diffusion families (Dream, SDAR): rotate-half RoPE tables,
the rotation, one attention call over an optional per-layer KV cache, and the output-position selection. The math of
the official Qwen2 / Qwen3 code; each family's model.py builds its blocks on these (docs/layout.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, T, head_dim] for integer positions [B, T]: computed in float32, cast to `dtype`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.int64).float()
                                / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, T, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, T, head_dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated (rotate-half layout) in x's dtype, as the official apply_rotary_pos_emb."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attend_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
               query_keep: torch.Tensor | None, kv: tuple[torch.Tensor, torch.Tensor] | None = None,
               index: torch.Tensor | None = None) -> torch.Tensor:
    """Bidirectional grouped-query attention. q [B, H, Tq, D], k, v [B, Hkv, Tq, D] (RoPE applied) -> [B, H, Tq, D].

    kv: one layer's cache (keys, values) [B, Hkv, T, D]: k, v are written into slots `index` [Tq] and the queries
    attend over all T slots. key_mask None or bool [B, 1, 1, Tk]; query_keep None or [B, 1, Tq, 1] (0 = a padding
    query, whose output is zero, as the official m_i ∧ m_j mask gives through SDPA's fully masked rows)."""
    if kv is not None:
        kv[0].index_copy_(2, index, k.to(kv[0].dtype))
        kv[1].index_copy_(2, index, v.to(kv[1].dtype))
        k, v = kv
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    att = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, is_causal=False)
    return att if query_keep is None else att * query_keep


def select_positions(x: torch.Tensor, positions: torch.Tensor | slice | None) -> torch.Tensor:
    """x [B, T, ...] at `positions` (None = all, a slice, or an index tensor [B, P])."""
    if positions is None:
        return x
    if isinstance(positions, slice):
        return x[:, positions]
    return x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1]))
