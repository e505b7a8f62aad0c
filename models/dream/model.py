"""Dream (Dream-org/Dream-v0-Instruct-7B): a Qwen2-architecture masked-diffusion model, in this package's own code.

Read off the official hub code (`modeling_dream.py`, `configuration_dream.py`, `generation_utils.py`; copies in
NVlabs/Fast-dLLM `dream/model/`). Qwen2 blocks — grouped-query attention with q/k/v biases (o_proj has none), RMSNorm
(normalised in float32, cast back, then scaled in the input dtype), rotate-half RoPE with θ from config.json, SwiGLU
MLP — but with **bidirectional** attention. Parameter names are the official ones (`model.embed_tokens.weight`,
`model.layers.{i}.self_attn.{q,k,v,o}_proj.*`, `model.layers.{i}.mlp.{gate,up,down}_proj.weight`,
`model.layers.{i}.{input,post_attention}_layernorm.weight`, `model.norm.weight`, `lm_head.weight`).

**Raw logits.** `DreamModel.forward` returns the raw, unshifted logits: Dream's head at position i predicts token
i + 1 as in an autoregressive model, so a masked position i is predicted by the raw logits of i − 1 and position 0
reuses its own — `shift_logits`. Samplers apply it to what they sample from; likelihoods get shifted logits through
`models/shift.py`'s `logits_view` (every likelihood looks at a model through it; a no-op for LLaDA).

**Padding** (generation_utils.py): left padding; a 2-D mask m [B, T] becomes the 4-D boolean m_i ∧ m_j, RoPE
positions are cumsum(m) − 1 with padding positions set to 1. A padding query attends to nothing (SDPA then gives a zero
output), so its hidden state is the residual stream alone; real positions never see padding. Without padding the
official code passes no mask and positions 0..T−1 — the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PretrainedConfig, PreTrainedModel

from dllm_ais.models.gqa import attend_gqa, rope_tables, rotate, select_positions  # noqa: F401  (re-exported)
from dllm_ais.models.kv_cache import KVCache, window_index
from dllm_ais.models.shift import shift_logits  # noqa: F401  (re-exported: Dream's shift)


class DreamConfig(PretrainedConfig):
    """Dream configuration with the official config.json field names (defaults: Dream-v0-Instruct-7B).

    Unknown fields of an official config.json (auto_map, architectures, torch_dtype …) are kept and written back on
    save. The LLaDA-style names the rest of the package reads (d_model, n_layers, n_heads, n_kv_heads, head_dim,
    embedding_size, mlp_hidden_size) are read-only aliases.
    """

    model_type = "Dream"

    def __init__(
        self,
        vocab_size: int = 152064,
        hidden_size: int = 3584,
        intermediate_size: int = 18944,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 28,
        num_key_value_heads: int | None = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        rope_theta: float = 1000000.0,
        rope_scaling: dict | None = None,
        attention_dropout: float = 0.0,
        mask_token_id: int | None = 151666,
        pad_token_id: int | None = 151643,
        eos_token_id: int | None = 151643,
        bos_token_id: int | None = 151643,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        if rope_scaling is not None:  # set only when given: transformers >= 5 warns on every rope_scaling assignment
            self.rope_scaling = rope_scaling
        self.attention_dropout = attention_dropout
        self.mask_token_id = mask_token_id
        kwargs.pop("use_cache", None)
        super().__init__(tie_word_embeddings=tie_word_embeddings, pad_token_id=pad_token_id,
                         eos_token_id=eos_token_id, bos_token_id=bos_token_id, **kwargs)

    # LLaDA-style read-only aliases (KV cache, plan, FP8 copy and samplers read these names).
    d_model = property(lambda self: self.hidden_size)
    n_layers = property(lambda self: self.num_hidden_layers)
    n_heads = property(lambda self: self.num_attention_heads)
    n_kv_heads = property(lambda self: self.num_key_value_heads)
    embedding_size = property(lambda self: self.vocab_size)
    mlp_hidden_size = property(lambda self: self.intermediate_size)
    eot_token_id = property(lambda self: getattr(self, "_eot_token_id", None),
                            lambda self, v: setattr(self, "_eot_token_id", v))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        """Reject configurations this implementation does not support, naming the field to change."""
        if self.mask_token_id is None:
            raise ValueError("Dream config has no `mask_token_id`; add it to config.json (151666 for Dream-7B).")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id={self.mask_token_id} outside the vocabulary ({self.vocab_size}).")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by num_attention_heads="
                             f"{self.num_attention_heads}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}.")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act={self.hidden_act!r}: only 'silu' (Dream's SwiGLU) is supported.")
        scaling = getattr(self, "rope_scaling", None)
        if scaling is not None and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
            raise ValueError(f"rope_scaling={scaling}: only default RoPE is supported; set it to null.")


def dream_positions(attention_mask: torch.Tensor | None, batch: int, length: int,
                    device: torch.device) -> torch.Tensor:
    """RoPE positions [B, T] as Dream's generate builds them: cumsum(mask) − 1, padding positions set to 1
    (irrelevant to every real position); arange(T) without a mask."""
    if attention_mask is None:
        return torch.arange(length, device=device).expand(batch, -1)
    keep = attention_mask.bool()
    return (keep.long().cumsum(-1) - 1).masked_fill(~keep, 1)


class DreamRMSNorm(nn.Module):
    """weight · (x / rms(x)), normalised in float32 and cast back before the scale (the official order)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x32.to(x.dtype)


class DreamAttention(nn.Module):
    """Bidirectional GQA self-attention with q/k/v biases."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=True)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=True)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=True)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_mask: torch.Tensor | None,
                query_keep: torch.Tensor | None, kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                index: torch.Tensor | None = None) -> torch.Tensor:
        # x [B, Tq, d]; key_mask None or bool [B, 1, 1, Tk]; query_keep None or [B, 1, Tq, 1] (0 = padding query,
        # whose output is zero as the official m_i ∧ m_j mask gives); kv: this layer's cache [B, Hkv, T, D], index [Tq]
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        att = attend_gqa(q, k, v, key_mask, query_keep, kv, index)  # [B, H, Tq, D]
        return self.o_proj(att.transpose(1, 2).reshape(B, T, -1))


class DreamMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) · up_proj(x)), no biases."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        d, h = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        self.self_attn = DreamAttention(config)
        self.mlp = DreamMLP(config)
        self.input_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, key_mask, query_keep, kv=None, index=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, key_mask, query_keep, kv, index)
        return x + self.mlp(self.post_attention_layernorm(x))


def canvas_inputs(config: DreamConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  position_ids: torch.Tensor | None, kv_cache: KVCache | None, window_start: int | torch.Tensor,
                  dtype: torch.dtype):
    """What every layer of a forward shares: RoPE tables cos, sin [B, 1, Tq, D] (in `dtype`), key_mask
    [B, 1, 1, T] | None, query_keep [B, 1, Tq, 1] | None and the window's canvas slots index [Tq] | None (with a
    KV cache: input_ids is the window [s, s + Tq) of a canvas of kv_cache.length positions)."""
    B, Tq = input_ids.shape
    dev = input_ids.device
    T = Tq if kv_cache is None else kv_cache.length
    index = window_index(window_start, Tq, dev) if kv_cache is not None else None
    if position_ids is None:
        position_ids = dream_positions(attention_mask, B, T, dev)
        if index is not None:
            position_ids = position_ids.index_select(1, index)
    key_mask = query_keep = None
    if attention_mask is not None:
        keep = attention_mask.bool()  # [B, T]
        # a fully padded row would leave its queries nothing to attend: let them see every key, then zero them
        key_mask = (keep | ~keep.any(-1, keepdim=True))[:, None, None, :]  # [B, 1, 1, T]
        q_keep = keep if index is None else keep.index_select(1, index)
        query_keep = q_keep[:, None, :, None].to(dtype)  # [B, 1, Tq, 1]
    cos, sin = rope_tables(position_ids, config.head_dim, config.rope_theta, dtype)
    return cos, sin, key_mask, query_keep, index


class DreamBaseModel(nn.Module):
    """The official `model` submodule: embed_tokens, layers, norm."""

    gradient_checkpointing = False

    def __init__(self, config: DreamConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DreamDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                window_start: int | torch.Tensor = 0) -> torch.Tensor:
        """Final hidden states [B, Tq, d]. kv_cache: input_ids is the window [s, s + Tw) of a canvas whose K/V
        live in the cache; attention_mask [B, T] is then the whole canvas's mask."""
        x = self.embed_tokens(input_ids)  # [B, Tq, d]
        cos, sin, key_mask, query_keep, index = canvas_inputs(self.config, input_ids, attention_mask, position_ids,
                                                              kv_cache, window_start, x.dtype)
        for i, layer in enumerate(self.layers):
            if kv_cache is not None:
                x = layer(x, cos, sin, key_mask, query_keep, kv_cache.layer(i), index)
            elif self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                ckpt = getattr(self, "_gradient_checkpointing_func", None) or (
                    lambda f, *a: checkpoint(f, *a, use_reentrant=False))
                x = ckpt(layer.__call__, x, cos, sin, key_mask, query_keep)
            else:
                x = layer(x, cos, sin, key_mask, query_keep)
        return self.norm(x)


@dataclass
class DreamOutput:
    """Model output. logits [B, P, V] raw (unshifted), P = T or the number of requested positions."""

    logits: torch.Tensor


class DreamModel(PreTrainedModel):
    """Dream language model in our own code (peft, accelerate and gradient checkpointing work).

    `forward(input_ids [B, T], attention_mask [B, T] (1 = real, 0 = left padding) | None, positions)` returns RAW
    logits for every position, a slice of positions, or an index tensor [B, P] — the same interface as LLaDAModelLM.
    Apply `shift_logits` (or index raw row i − 1) to get the distribution of masked position i.
    """

    config_class = DreamConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DreamDecoderLayer"]
    _supports_sdpa = True
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    family = "dream"
    hub_architecture = "DreamModel"
    shifted_logits = True
    """Masked position i is predicted by raw logits i − 1 (`shift_logits`)."""

    def __init__(self, config: DreamConfig):
        config.validate()
        super().__init__(config)
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, DreamRMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | slice | None = None, kv_cache: KVCache | None = None,
                window_start: int | torch.Tensor = 0, position_ids: torch.Tensor | None = None,
                **kwargs) -> DreamOutput:
        """Raw logits. positions selects output rows (as LLaDAModelLM's); position_ids [B, Tq] overrides the RoPE
        positions (default `dream_positions(attention_mask)`). kv_cache: see DreamBaseModel.forward (the cache
        holds num_key_value_heads heads: KVCache.for_model)."""
        if kwargs.get("labels") is not None:
            raise ValueError("DreamModel computes no loss; use dllm_ais.likelihood for diffusion objectives.")
        h = self.model(input_ids, attention_mask, position_ids, kv_cache, window_start)
        return DreamOutput(logits=self.lm_head(select_positions(h, positions)))


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Dream block (the LM head `lm_head` is not one of them)."""


def lora_target_regex(targets: tuple[str, ...] = LORA_TARGETS) -> str:
    """A peft `target_modules` regex matching the block linears only."""
    return rf".*\.layers\.\d+\.(self_attn|mlp)\.({'|'.join(targets)})"

