"""A preallocated K/V cache for block-cached diffusion sampling (Fast-dLLM's prefix and dual cache).

The cache holds the keys (RoPE applied) and values of every canvas position for every layer, in one tensor per layer
and kind (2·n_layers tensors of static shape [B, H, T, D]). A forward over a *window* of the canvas — the whole
canvas at a block's refresh, [block start, T) for the prefix cache, the current block for the dual cache — writes the
window's K/V into slots [s, s + Tw) and attends over all T slots with the full key-padding mask, so positions outside
the window are seen as they were when last written (the cache's approximation). Writing the window's slots and
attending over the buffer is Fast-dLLM's `replace_position` for the dual cache; for the prefix cache the window reaches
the end of the canvas, which makes it the same as Fast-dLLM's concatenation of the cached prefix with the fresh K/V.

Why one tensor per layer: with a single [n_layers, B, H, T, D] buffer, `index_copy_` into layer i's view is, once
functionalised (torch.compile), a select_scatter of the whole buffer, which inductor materialises — a compiled window
step copied the whole cache several times per layer (tests/test_kv_cache_compile.py counts it). Separate tensors are
graph inputs that inductor writes in place (the window's slots only). Autograd needs them too: the likelihood replay
(likelihood/replay.py) writes a cache layer by layer under autograd, which a shared buffer saved by an earlier
layer's attention refuses.

Keys are cached after RoPE (Fast-dLLM caches them before and rotates every step: the same values, less work).
Shapes never depend on the window's start (it is an index, an int or a 0-dim tensor), so a compiled step function or
a CUDA graph (samplers/cuda_graphs.py) serves every block of a given window length; the tensors keep their address.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class KVCache:
    """Keys and values of every layer and canvas position, one tensor per layer."""

    k: list[torch.Tensor]
    """Per layer [B, H, T, D] keys after RoPE, in the model's dtype."""
    v: list[torch.Tensor]
    """Per layer [B, H, T, D] values."""

    @classmethod
    def allocate(cls, n_layers: int, batch: int, heads: int, length: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype) -> KVCache:
        """Zero-filled tensors (every slot is written by a block's refresh forward before it is read)."""
        shape = (batch, heads, length, head_dim)
        zeros = lambda: torch.zeros(shape, device=device, dtype=dtype)  # noqa: E731
        return cls([zeros() for _ in range(n_layers)], [zeros() for _ in range(n_layers)])

    @classmethod
    def for_model(cls, model, batch: int, length: int) -> KVCache:
        """A cache sized for `model` (LLaDAModelLM, FusedLLaDA or DreamModel, or a peft or DDP-style wrapper of one: its
        config and embedding dtype/device); it holds the key/value heads (n_kv_heads: fewer than n_heads for Dream's
        GQA)."""
        model = unwrap(model)
        config, weight = model.config, model.get_input_embeddings().weight
        heads = getattr(config, "n_kv_heads", None) or config.n_heads
        return cls.allocate(config.n_layers, batch, heads, length, config.head_dim, weight.device, weight.dtype)

    @property
    def length(self) -> int:
        return self.k[0].shape[2]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's keys and values [B, H, T, D] (written in place by `attend`)."""
        return self.k[i], self.v[i]

    def rows(self, index: torch.Tensor) -> KVCache:
        """A copy holding rows `index` [m] of every layer (a later window forward may write into it)."""
        return KVCache([k.index_select(0, index) for k in self.k], [v.index_select(0, index) for v in self.v])

    def mark_static(self) -> None:
        """Tell dynamo the tensors keep their address (CUDA graphs may then mutate them in place)."""
        for t in (*self.k, *self.v):
            torch._dynamo.mark_static_address(t)


def unwrap(model):
    """The model under DDP-style wrappers (`.module`), for its config; peft models forward attribute access."""
    while hasattr(model, "module") and not hasattr(model, "config"):
        model = model.module
    return model


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
