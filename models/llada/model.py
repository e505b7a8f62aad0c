"""LLaDA: a bidirectional masked-diffusion transformer (LLaMA-style blocks, no causal mask).

Parameter names follow the official checkpoint (GSAI-ML/LLaDA-8B-Instruct) exactly, so `state_dict()` keys are
`model.transformer.wte.weight`, `model.transformer.blocks.{i}.{attn_norm,q_proj,k_proj,v_proj,attn_out,ff_norm,
ff_proj,up_proj,ff_out}.weight`, `model.transformer.ln_f.weight` and `model.transformer.ff_out.weight` (LM head).
Loading and saving checkpoint directories lives in `dllm_ais.models.checkpoint`.

Differences from a causal LLaMA: attention is bidirectional (only padding keys are masked), logits are not shifted
(a masked position predicts its own token), and the MLP is `ff_out(silu(ff_proj(x)) * up_proj(x))`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PretrainedConfig, PreTrainedModel

from dllm_ais.models.kv_cache import KVCache, attend, window_index, window_rope_positions


class LLaDAConfig(PretrainedConfig):
    """LLaDA configuration with the official config.json field names.

    Unknown fields of an official config.json (auto_map, init_fn, alibi …) are kept as attributes and written back
    on save, so a saved directory still opens with the official remote code.
    """

    model_type = "llada"

    def __init__(
        self,
        d_model: int = 4096,
        n_layers: int = 32,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        mlp_hidden_size: int = 12288,
        vocab_size: int = 126464,
        embedding_size: int | None = None,
        max_sequence_length: int = 4096,
        rope_theta: float = 500000.0,
        rms_norm_eps: float = 1e-5,
        mask_token_id: int | None = 126336,
        eos_token_id: int | None = 126081,
        pad_token_id: int | None = 126081,
        bos_token_id: int | None = 126080,
        eot_token_id: int | None = 126348,
        include_bias: bool = False,
        weight_tying: bool = False,
        init_std: float = 0.02,
        **kwargs,
    ):
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads if n_kv_heads is not None else n_heads
        self.mlp_hidden_size = mlp_hidden_size
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size if embedding_size is not None else vocab_size
        self.max_sequence_length = max_sequence_length
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.mask_token_id = mask_token_id
        self.eot_token_id = eot_token_id
        self.include_bias = include_bias
        self.weight_tying = weight_tying
        self.init_std = init_std
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=bos_token_id, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> None:
        """Reject configurations this implementation does not support, naming the field to change."""
        if self.mask_token_id is None:
            raise ValueError("LLaDA config has no `mask_token_id`; add it to config.json (126336 for LLaDA-8B).")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}.")
        if self.n_kv_heads != self.n_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} != n_heads={self.n_heads}: grouped-query LLaDA variants "
                             "are not supported yet.")
        if self.include_bias or self.weight_tying:
            raise ValueError("include_bias/weight_tying must be false: LLaDA-8B has neither.")
        if not 0 <= self.mask_token_id < self.embedding_size:
            raise ValueError(f"mask_token_id={self.mask_token_id} outside the embedding ({self.embedding_size}).")


class RMSNorm(nn.Module):
    """y = x / rms(x) · weight, computed in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for integer positions [B, T] -> cos, sin [B, 1, T, head_dim] in float32 (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, T, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, T, head_dim]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by (cos, sin) [B, 1, T, D]; math in float32, result in x's dtype."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class LLaDABlock(nn.Module):
    """Pre-norm transformer block: bidirectional self-attention + SwiGLU MLP, no biases."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        d, h = config.d_model, config.mlp_hidden_size
        self.n_heads = config.n_heads
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = RMSNorm(d, config.rms_norm_eps)
        self.ff_proj = nn.Linear(d, h, bias=False)  # gate
        self.up_proj = nn.Linear(d, h, bias=False)
        self.ff_out = nn.Linear(h, d, bias=False)  # down

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn_bias: torch.Tensor | None,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None, index: torch.Tensor | None = None):
        # x [B, T, d]; attn_bias None or bool [B, 1, 1, T_keys] (True = key may be attended); kv/index: this layer's
        # KV cache [B, H, T_keys, D] and the window's slots [T] in it (kv_cache.attend), or None
        B, T, d = x.shape
        hx = self.attn_norm(x)
        q, k, v = (proj(hx).view(B, T, self.n_heads, -1).transpose(1, 2) for proj in (self.q_proj, self.k_proj,
                                                                                       self.v_proj))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # [B, H, T, D]
        att = attend(q, k, v, attn_bias, kv, index)
        x = x + self.attn_out(att.transpose(1, 2).reshape(B, T, d))
        hx = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(hx)) * self.up_proj(hx))


class LLaDATransformer(nn.Module):
    """The `model` submodule; holds `transformer` with the official names."""

    gradient_checkpointing = False

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.embedding_size, config.d_model),
            blocks=nn.ModuleList(LLaDABlock(config) for _ in range(config.n_layers)),
            ln_f=RMSNorm(config.d_model, config.rms_norm_eps),
            ff_out=nn.Linear(config.d_model, config.embedding_size, bias=False),
        ))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                positions: torch.Tensor | None, kv_cache: KVCache | None = None,
                window_start: int | torch.Tensor = 0) -> torch.Tensor:
        t = self.transformer
        x = t.wte(input_ids)  # [B, T, d]
        index = None
        if kv_cache is not None:  # input_ids is the window [s, s + Tw) of a canvas of kv_cache.length positions
            index = window_index(window_start, input_ids.shape[1], input_ids.device)  # [Tw]
            pos = window_rope_positions(attention_mask, index, input_ids.shape[0])
            attn_bias = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # [B, 1, 1, T]
        elif attention_mask is None:
            pos = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
            attn_bias = None
        else:
            keep = attention_mask.bool()
            # Positions count only real tokens, so left padding does not shift RoPE phases.
            pos = (keep.long().cumsum(-1) - 1).clamp(min=0)
            attn_bias = keep[:, None, None, :]  # [B, 1, 1, T]
        cos, sin = rope_cos_sin(pos, self.config.head_dim, self.config.rope_theta)
        for i, block in enumerate(t.blocks):
            if kv_cache is not None:
                x = block(x, cos, sin, attn_bias, kv_cache.layer(i), index)
            elif self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                ckpt = getattr(self, "_gradient_checkpointing_func", None) or (
                    lambda f, *a: checkpoint(f, *a, use_reentrant=False))
                x = ckpt(block.__call__, x, cos, sin, attn_bias)
            else:
                x = block(x, cos, sin, attn_bias)
        if positions is not None:
            x = x[:, positions] if isinstance(positions, slice) else x.gather(
                1, positions[..., None].expand(-1, -1, x.shape[-1]))
        return t.ff_out(t.ln_f(x))  # [B, P, V]


@dataclass
class LLaDAOutput:
    """Model output. logits [B, P, V] where P = T, or the number of requested positions."""

    logits: torch.Tensor


class LLaDAModelLM(PreTrainedModel):
    """LLaDA language model in our own code; works with peft, accelerate and gradient checkpointing.

    `forward(input_ids [B, T], attention_mask [B, T] (1 = real token, 0 = padding), positions)` returns logits for
    every position, for a slice of positions (e.g. `slice(prompt_len, None)`), or for an index tensor [B, P].
    """

    config_class = LLaDAConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LLaDABlock"]
    _supports_sdpa = True

    def __init__(self, config: LLaDAConfig):
        config.validate()
        super().__init__(config)
        self.model = LLaDATransformer(config)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.transformer.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.transformer.wte = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.model.transformer.ff_out

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | slice | None = None, kv_cache: KVCache | None = None,
                window_start: int | torch.Tensor = 0, **kwargs) -> LLaDAOutput:
        """kv_cache None: input_ids is the whole canvas (today's forward). Else input_ids [B, Tw] is the window
        [window_start, window_start + Tw) of a canvas of kv_cache.length positions, attention_mask [B, T] the whole
        canvas's mask; the window's K/V are written into the cache and it attends over every cached position
        (models/kv_cache.py); positions then index the window."""
        if kwargs.get("labels") is not None:
            raise ValueError("LLaDAModelLM computes no loss; use dllm_ais.likelihood for diffusion objectives.")
        return LLaDAOutput(logits=self.model(input_ids, attention_mask, positions, kv_cache, window_start))


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")
"""Every linear layer of a LLaDA block. `ff_out` is also the LM head's name, hence `lora_target_regex`."""


def lora_target_regex(targets: tuple[str, ...] = LORA_TARGETS) -> str:
    """A peft `target_modules` regex matching the block linears only (not the LM head `transformer.ff_out`)."""
    return rf".*\.blocks\.\d+\.({'|'.join(targets)})"
