"""A compact Qwen3 inference model for rollouts: fused QKV and gate-up weights, a static preallocated KV cache, and a
decode forward whose tensors never change shape or address (so one step can be captured as a CUDA graph).

The math is exactly transformers' Qwen3 (RMSNorm in float32, q/k RMSNorm per head before RoPE, rotate-half RoPE with
cos/sin computed in float32 and cast to the model dtype, GQA with query head h reading KV head h // (H / KV),
softmax(q·kᵀ / √D), SwiGLU MLP, final norm, LM head); `tests/test_qwen_rollout.py` checks its logits against
transformers' on the tiny Qwen in float32.

Weights: the master (a transformers Qwen3ForCausalLM, possibly peft-wrapped) keeps the official parameter names; this
copy holds `wqkv` = cat(q_proj, k_proj, v_proj) [(H + 2·KV)·D, d] and `gate_up` = cat(gate_proj, up_proj) [2·I, d] per
layer, as nn.Linear (BF16/fp32 copy) or `dllm_ais.fp8.FP8Linear` (FP8 copy: one activation quantisation per input,
by construction: 4 per layer instead of 7). `sync_qwen_rollout(master, rollout)` refreshes every tensor in place from
the master (LoRA merged on the fly, as fp8/walker.py's `effective_weight` does), so buffer addresses — and any
captured CUDA graph — stay valid. FP8 note: the 128×128 weight blocks of a fused matrix may straddle the q/k/v (or
gate/up) boundary when H·D or I is not a multiple of 128 (the tiny model; not Qwen3-8B): the fused copy is then a
slightly different μ than three separately quantised layers, and the recorded log-probs are the fused copy's own.

Cache layout: `setup_cache(B, S)` allocates K and V [B, KV, S, D] per layer (reused while B and S fit). Slot s of the
cache is column s of [left-padded prompt | completion]; `key_valid` [B, S] says which slots hold real tokens (padding
never attends or is attended to by real tokens); RoPE positions count real tokens only (left padding shifts nothing).
Every query may also attend to its own slot, so a padding query never sees an empty row (its output is never used).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class QwenShape:
    """The architecture numbers of a Qwen3 model (read from a transformers Qwen3Config by `from_config`)."""

    vocab_size: int
    """V."""
    hidden_size: int
    """d."""
    intermediate_size: int
    """I (SwiGLU width)."""
    num_layers: int
    """Decoder layers."""
    num_heads: int
    """H query heads."""
    num_kv_heads: int
    """KV heads (H must be a multiple)."""
    head_dim: int
    """D."""
    rms_norm_eps: float
    """RMSNorm epsilon."""
    rope_theta: float
    """RoPE base (default rope type only)."""
    tie_word_embeddings: bool
    """LM head shares the embedding matrix."""

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}.")

    @classmethod
    def from_config(cls, config) -> QwenShape:
        """From a transformers Qwen3Config; other model types or RoPE scalings are refused by name."""
        if getattr(config, "model_type", None) != "qwen3":
            raise ValueError(f"the compact rollout model implements Qwen3 only (got model_type "
                             f"{getattr(config, 'model_type', None)!r}); use quantize_model for other models.")
        rope = getattr(config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not implemented by the compact rollout model (default only).")
        theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
        if getattr(config, "attention_bias", False):
            raise ValueError("attention_bias=True is not implemented by the compact rollout model.")
        if getattr(config, "use_sliding_window", False):
            raise ValueError("use_sliding_window=True is not implemented by the compact rollout model.")
        return cls(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                   intermediate_size=config.intermediate_size, num_layers=config.num_hidden_layers,
                   num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                   head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps, rope_theta=float(theta),
                   tie_word_embeddings=bool(config.tie_word_embeddings))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen3RMSNorm: normalise in float32, cast back, then scale. x [..., n], weight [..., n]
    (broadcast). `F.rms_norm` upcasts bf16/fp16 to float32 and casts the result back exactly like it (one fused kernel
    on CUDA instead of eight); float64 goes the long way, since transformers normalises it in float32 too."""
    if x.dtype == torch.float64:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)
    return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)


def rope_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """pos [B, T] long, inv_freq [D/2] fp32 -> cos, sin [B, 1, T, D] in `dtype` (computed in float32)."""
    freqs = pos[..., None].float() * inv_freq  # [B, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, T, D]
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, h, T, D]: x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x₂, x₁)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def grouped_mask(allowed: torch.Tensor, groups: int) -> torch.Tensor:
    """allowed [B, T, S] bool -> [B, 1, G·T, S], the mask of `gqa_attention`'s stacked queries (built once per
    forward, shared by every layer)."""
    B, T, S = allowed.shape
    return allowed[:, None, None].expand(B, 1, groups, T, S).reshape(B, 1, groups * T, S)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, H, T, D], k/v [B, KV, S, D], mask [B, 1, G·T, S] bool (`grouped_mask`) -> [B, T, H·D].

    Grouped without copying K/V: the G = H / KV query heads of one KV head are stacked along the query axis
    ([B, KV, G·T, D]), so the cache is read once per step, not G times.
    """
    B, H, T, D = q.shape
    KV = k.shape[1]
    qg = q.reshape(B, KV, (H // KV) * T, D)  # head h = kv·G + g
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)  # [B, KV, G·T, D]
    return o.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)




class QwenRolloutLayer(nn.Module):
    """One decoder layer with fused wqkv and gate_up projections."""

    def __init__(self, shape: QwenShape, linear, name: str, dtype: torch.dtype, device) -> None:
        super().__init__()
        s, d = shape, shape.hidden_size
        qkv_out = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
        self.attn_norm = nn.Parameter(torch.ones(d, dtype=dtype, device=device), requires_grad=False)
        self.mlp_norm = nn.Parameter(torch.ones(d, dtype=dtype, device=device), requires_grad=False)
        qk_heads = s.num_heads + s.num_kv_heads  # q_norm repeated over the H query heads, then k_norm over KV heads:
        self.qk_norm = nn.Parameter(torch.ones(qk_heads, s.head_dim, dtype=dtype, device=device), requires_grad=False)
        self.wqkv = linear(d, qkv_out, f"{name}.wqkv")
        self.o_proj = linear(s.num_heads * s.head_dim, d, f"{name}.o_proj")
        self.gate_up = linear(d, 2 * s.intermediate_size, f"{name}.gate_up")
        self.down = linear(s.intermediate_size, d, f"{name}.down")
        self.shape = shape

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                cache: tuple[torch.Tensor, torch.Tensor] | None, slots: torch.Tensor | None) -> torch.Tensor:
        """h [B, T, d]; cos/sin [B, 1, T, D]; mask [B, 1, G·T, S] (`grouped_mask`); cache K/V [B, KV, S, D] written
        at `slots` [T] (None: attend to this call's own T keys only) -> [B, T, d]."""
        s = self.shape
        B, T, _ = h.shape
        H, KV, D = s.num_heads, s.num_kv_heads, s.head_dim
        qkv = self.wqkv(rms_norm(h, self.attn_norm, s.rms_norm_eps))  # [B, T, (H + 2KV)·D]
        qk, v = qkv.split([(H + KV) * D, KV * D], dim=-1)
        # q and k heads normed and rotated together (per-head math, half the kernel launches)
        qk = rms_norm(qk.view(B, T, H + KV, D), self.qk_norm, s.rms_norm_eps).transpose(1, 2)  # [B, H + KV, T, D]
        q, k = apply_rope(qk, cos, sin).split([H, KV], dim=1)  # [B, H, T, D], [B, KV, T, D]
        v = v.view(B, T, KV, D).transpose(1, 2)
        if cache is not None:
            k_cache, v_cache = cache
            k_cache.index_copy_(2, slots, k)
            v_cache.index_copy_(2, slots, v)
            k, v = k_cache, v_cache  # [B, KV, S, D]
        h = h + self.o_proj(gqa_attention(q, k, v, mask))
        gate, up = self.gate_up(rms_norm(h, self.mlp_norm, s.rms_norm_eps)).chunk(2, dim=-1)  # [B, T, I] each
        return h + self.down(F.silu(gate) * up)


def _plain_linear(dtype: torch.dtype, device):
    def make(in_features: int, out_features: int, name: str) -> nn.Module:
        layer = nn.Linear(in_features, out_features, bias=False, dtype=dtype, device=device)
        return layer.requires_grad_(False)

    return make


def _fp8_linear(backend: str, device):
    from dllm_ais.fp8.backends import check_backend
    from dllm_ais.fp8.linear import FP8Linear

    check_backend(backend, device)

    def make(in_features: int, out_features: int, name: str) -> nn.Module:
        return FP8Linear(in_features, out_features, backend=backend, device=device, name=name)

    return make


class QwenRollout(nn.Module):
    """Qwen3 inference copy with fused projections and a static KV cache (see module docstring).

    `forward(input_ids, attention_mask, position_ids)` is a cache-free teacher-forced pass returning `.logits`
    [B, T, V] (the transformers calling convention, so likelihood code can score with it); `prefill` and
    `decode_logits` are the cached rollout path used by `dllm_ais.samplers.ar_static`.
    """

    def __init__(self, shape: QwenShape, dtype: torch.dtype, device, fp8_backend: str | None = None,
                 config=None) -> None:
        super().__init__()
        self.shape, self.fp8_backend, self.config = shape, fp8_backend, config
        linear = _plain_linear(dtype, device) if fp8_backend is None else _fp8_linear(fp8_backend, device)
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size, dtype=dtype, device=device).requires_grad_(False)
        self.layers = nn.ModuleList(QwenRolloutLayer(shape, linear, f"layers.{i}", dtype, device)
                                    for i in range(shape.num_layers))
        self.norm = nn.Parameter(torch.ones(shape.hidden_size, dtype=dtype, device=device), requires_grad=False)
        self.lm_head = None
        if not shape.tie_word_embeddings:  # the LM head stays in the master dtype (DESIGN §7)
            self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False, dtype=dtype, device=device)
            self.lm_head.requires_grad_(False)
        D = shape.head_dim
        inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.eval()

    @property
    def groups(self) -> int:
        """G = query heads per KV head."""
        return self.shape.num_heads // self.shape.num_kv_heads

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: h [..., d] -> logits [..., V]."""
        h = rms_norm(h, self.norm, self.shape.rms_norm_eps)
        return F.linear(h, self.embed.weight) if self.lm_head is None else self.lm_head(h)

    # ------------------------------------------------------------------------------------------------ cache-free
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, **_ignored) -> SimpleNamespace:
        """Teacher-forced pass: input_ids [B, T], attention_mask [B, T] (left padding), position_ids [B, T] ->
        .logits [B, T, V]. Causal; padded keys are masked."""
        B, T = input_ids.shape
        valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if position_ids is None:
            position_ids = (valid.long().cumsum(-1) - 1).clamp_min(0)
        col = torch.arange(T, device=input_ids.device)
        mask = grouped_mask(self.allowed(valid, col), self.groups)  # [B, 1, G·T, T]
        cos, sin = rope_cos_sin(position_ids, self.inv_freq, self.dtype)
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, None, None)
        return SimpleNamespace(logits=self.head(h))

    @staticmethod
    def allowed(key_valid: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """key_valid [B, S] bool, slots [T] (each query's own slot) -> [B, T, S]: real keys at or before the query's
        slot, plus the query's own slot (so no row is empty)."""
        key = torch.arange(key_valid.shape[1], device=key_valid.device)  # [S]
        causal = key[None, :] <= slots[:, None]  # [T, S]
        own = key[None, :] == slots[:, None]
        return (key_valid[:, None, :] & causal[None]) | own[None]

    # ------------------------------------------------------------------------------------------------ cached path
    def setup_cache(self, batch: int, length: int) -> None:
        """Make K/V caches [batch, KV, ≥ length, D] per layer; existing ones are kept when they fit exactly in batch
        and have at least `length` slots (their addresses then stay valid for captured graphs)."""
        if self.k_cache and self.k_cache[0].shape[0] == batch and self.k_cache[0].shape[2] >= length:
            return
        s = self.shape
        size = (batch, s.num_kv_heads, length, s.head_dim)
        self.k_cache = [torch.zeros(size, dtype=self.dtype, device=self.device) for _ in range(s.num_layers)]
        self.v_cache = [torch.zeros(size, dtype=self.dtype, device=self.device) for _ in range(s.num_layers)]

    @property
    def cache_len(self) -> int:
        return self.k_cache[0].shape[2] if self.k_cache else 0

    def _cached(self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
                key_valid: torch.Tensor) -> torch.Tensor:
        """ids/pos [B, T], slots [T] cache slots, key_valid [B, S] -> final hidden [B, T, d] (caches written)."""
        mask = grouped_mask(self.allowed(key_valid, slots), self.groups)  # [B, 1, G·T, S]
        cos, sin = rope_cos_sin(pos, self.inv_freq, self.dtype)
        h = self.embed(ids)
        for layer, k, v in zip(self.layers, self.k_cache, self.v_cache, strict=True):
            h = layer(h, cos, sin, mask, (k, v), slots)
        return h

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, pos: torch.Tensor, key_valid: torch.Tensor, chunk: int) -> torch.Tensor:
        """Write prompt columns 0..P-1 into the cache, `chunk` columns per forward; ids/pos [B, P] ->
        logits [B, V] of the last column (the LM head runs on that column only)."""
        P = ids.shape[1]
        if P > self.cache_len:
            raise ValueError(f"prompt of {P} tokens does not fit the cache ({self.cache_len} slots): call "
                             "setup_cache first.")
        h = None
        for c0 in range(0, P, chunk):
            c1 = min(P, c0 + chunk)
            slots = torch.arange(c0, c1, device=ids.device)
            h = self._cached(ids[:, c0:c1], pos[:, c0:c1], slots, key_valid)
        return self.head(h[:, -1])

    @torch.no_grad()
    def decode_logits(self, token: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor,
                      key_valid: torch.Tensor) -> torch.Tensor:
        """One token per row: token/pos [B] long, slot [1] long (a device tensor: no host value is read) ->
        logits [B, V]. Shapes and addresses are the same every step (graph-capturable)."""
        h = self._cached(token[:, None], pos[:, None], slot, key_valid)
        return self.head(h[:, 0])


# ----------------------------------------------------------------------------------------------------------------------
# building from / syncing with the transformers master


def supports(master: nn.Module) -> bool:
    """True when `master` (possibly peft-wrapped) is a model `rollout_copy` can mirror."""
    config = getattr(master, "config", None)
    try:
        QwenShape.from_config(config)
    except (ValueError, AttributeError, TypeError):
        return False
    return True


@torch.no_grad()
def rollout_copy(master: nn.Module, fp8_backend: str | None = None, expected_m: int | None = None) -> QwenRollout:
    """A QwenRollout of `master` (a transformers Qwen3ForCausalLM, plain or peft LoRA-wrapped), on its device and in
    its dtype, with fused FP8Linear projections when `fp8_backend` is given (else nn.Linear); weights synced.
    As for the LLaDA copy, `auto` is resolved here, eagerly, per projection shape for `expected_m` activation rows
    (never lazily on a first call), and cuBLAS's acceptance of that row count is decided and recorded."""
    shape = QwenShape.from_config(master.config)
    ref = next(t for n, t in master.named_parameters() if n.endswith("embed_tokens.weight"))
    rollout = QwenRollout(shape, ref.dtype, ref.device, fp8_backend=fp8_backend, config=master.config)
    sync_qwen_rollout(master, rollout)
    if fp8_backend is not None:
        from dllm_ais.fp8.backends import prepare_gemm_shapes
        from dllm_ais.fp8.linear import DEFAULT_EXPECTED_M, resolve_auto

        resolve_auto(rollout, expected_m, kind="forward")
        prepare_gemm_shapes(rollout, [expected_m or DEFAULT_EXPECTED_M])
    return rollout


def _master_tensors(master: nn.Module) -> tuple[dict[str, nn.Module], dict[str, torch.Tensor]]:
    """Canonical name -> linear layer (LoRA wrapper preferred) and canonical name -> parameter/buffer."""
    from dllm_ais.fp8.walker import canonical_name, is_peft_root, linear_layers

    peft = is_peft_root(master)
    layers = {canonical_name(n, peft): m for n, m in linear_layers(master).items()}
    tensors = {canonical_name(n, peft): t for n, t in master.named_parameters()}
    return layers, tensors


def _load_linear(layer: nn.Module, weight: torch.Tensor) -> None:
    """Write weight [N, K] into a rollout linear in place (FP8Linear: requantise into its buffers)."""
    if hasattr(layer, "load_weight_"):
        layer.load_weight_(weight)
    else:
        layer.weight.copy_(weight)


@torch.no_grad()
def sync_qwen_rollout(master: nn.Module, rollout: QwenRollout) -> None:
    """Copy the master's current weights into `rollout` in place (LoRA merged on the fly; nothing reallocated)."""
    from dllm_ais.fp8.walker import effective_weight

    layers, tensors = _master_tensors(master)

    def tensor(name: str) -> torch.Tensor:
        if name not in tensors:
            raise KeyError(f"sync_qwen_rollout: the master has no tensor {name!r}")
        return tensors[name]

    def weight(name: str) -> torch.Tensor:
        if name not in layers:
            raise KeyError(f"sync_qwen_rollout: the master has no linear layer {name!r}")
        w, b = effective_weight(layers[name])
        if b is not None:
            raise ValueError(f"sync_qwen_rollout: {name} has a bias; the compact rollout model has none.")
        return w

    rollout.embed.weight.copy_(tensor("model.embed_tokens.weight"))
    rollout.norm.copy_(tensor("model.norm.weight"))
    if rollout.lm_head is not None:
        rollout.lm_head.weight.copy_(weight("lm_head"))
    for i, layer in enumerate(rollout.layers):
        p = f"model.layers.{i}"
        layer.attn_norm.copy_(tensor(f"{p}.input_layernorm.weight"))
        layer.mlp_norm.copy_(tensor(f"{p}.post_attention_layernorm.weight"))
        H = rollout.shape.num_heads
        layer.qk_norm[:H].copy_(tensor(f"{p}.self_attn.q_norm.weight").expand(H, -1))
        layer.qk_norm[H:].copy_(tensor(f"{p}.self_attn.k_norm.weight").expand(rollout.shape.num_kv_heads, -1))
        _load_linear(layer.wqkv, torch.cat([weight(f"{p}.self_attn.{x}_proj") for x in "qkv"], dim=0))
        _load_linear(layer.o_proj, weight(f"{p}.self_attn.o_proj"))
        _load_linear(layer.gate_up, torch.cat([weight(f"{p}.mlp.gate_proj"), weight(f"{p}.mlp.up_proj")], dim=0))
        _load_linear(layer.down, weight(f"{p}.mlp.down_proj"))
