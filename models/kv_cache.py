"""A preallocated K/V cache for block-cached diffusion sampling (Fast-dLLM's prefix and dual cache).

The cache holds the keys (RoPE applied) and values of every canvas position for every layer, in one buffer per
tensor of static shape [n_layers, B, H, T, D]. A forward over a *window* of the canvas — the whole canvas at a
block's refresh, [block start, T) for the prefix cache, the current block for the dual cache — writes the window's
K/V into slots [s, s + Tw) and attends over all T slots with the full key-padding mask, so positions outside the
window are seen as they were when last written (the cache's approximation). Writing the window's slots and attending
over the buffer is Fast-dLLM's `replace_position` for the dual cache; for the prefix cache the window reaches the end
of the canvas, which makes it the same as Fast-dLLM's concatenation of the cached prefix with the fresh K/V.

Keys are cached after RoPE (Fast-dLLM caches them before and rotates every step: the same values, less work).
Shapes never depend on the window's start (it is an index, an int or a 0-dim tensor), so a compiled step function
serves every block of a given window length; the buffer can be marked as a static address for CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class KVCache:
    """Keys and values of every layer and canvas position."""

    k: torch.Tensor
    """[n_layers, B, H, T, D] keys after RoPE, in the model's dtype."""
    v: torch.Tensor
    """[n_layers, B, H, T, D] values."""

    @classmethod
    def allocate(cls, n_layers: int, batch: int, heads: int, length: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype) -> KVCache:
        """Zero-filled buffers (every slot is written by a block's refresh forward before it is read)."""
        shape = (n_layers, batch, heads, length, head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    @classmethod
    def for_model(cls, model, batch: int, length: int) -> KVCache:
        """A cache sized for `model` (LLaDAModelLM, FusedLLaDA or DreamModel: its config and embedding
        dtype/device); it holds the key/value heads (n_kv_heads: fewer than n_heads for Dream's GQA)."""
        config, weight = model.config, model.get_input_embeddings().weight
        heads = getattr(config, "n_kv_heads", None) or config.n_heads
        return cls.allocate(config.n_layers, batch, heads, length, config.head_dim, weight.device, weight.dtype)

    @property
    def length(self) -> int:
        return self.k.shape[3]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views [B, H, T, D] of layer i's keys and values (writes go to the buffer)."""
        return self.k[i], self.v[i]

    def mark_static(self) -> None:
        """Tell dynamo the buffers keep their address (CUDA graphs may then mutate them in place)."""
        torch._dynamo.mark_static_address(self.k)
        torch._dynamo.mark_static_address(self.v)


def window_index(window_start: int | torch.Tensor, window_length: int, device: torch.device) -> torch.Tensor:
    """[Tw] long canvas positions of a window: window_start + arange(Tw)."""
    return torch.arange(window_length, device=device) + window_start


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None,
           kv: tuple[torch.Tensor, torch.Tensor] | None = None, index: torch.Tensor | None = None) -> torch.Tensor:
    """Bidirectional attention of a window's queries. q, k, v [B, H, Tw, D] (RoPE applied to q, k) -> [B, H, Tw, D].

    kv None: attention over the window itself (attn_bias None or bool [B, 1, 1, Tw]). Else kv = one layer's cached
    (keys, values) [B, H, T, D]: the window's k/v are written into slots `index` [Tw] and the queries attend over all
    T slots (attn_bias None or bool [B, 1, 1, T], True = key may be attended)."""
    if kv is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, is_causal=False)
    cache_k, cache_v = kv
    cache_k.index_copy_(2, index, k.to(cache_k.dtype))
    cache_v.index_copy_(2, index, v.to(cache_v.dtype))
    return F.scaled_dot_product_attention(q, cache_k, cache_v, attn_mask=attn_bias, is_causal=False)


def window_rope_positions(attention_mask: torch.Tensor | None, index: torch.Tensor, batch: int) -> torch.Tensor:
    """RoPE positions [B, Tw] of a window: real-token positions of the full canvas (left padding skipped).

    attention_mask [B, T] over the whole canvas (None = no padding), index [Tw] the window's canvas positions."""
    if attention_mask is None:
        return index.expand(batch, -1)
    keep = attention_mask.bool()
    pos = (keep.long().cumsum(-1) - 1).clamp(min=0)  # [B, T]
    return pos.index_select(1, index)
