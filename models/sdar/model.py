"""SDAR (JetAstra/SDAR; TraDo, Gen-Verse/dLLM-RL, is the same architecture): Qwen3 weights turned into a
block-diffusion language model, in this package's own code.

Read off the official remote code, JetAstra/SDAR@c2041a8 `training/model/SDAR-4B-Chat/modeling_sdar.py` (the 8B copy
is identical) and `configuration_sdar.py`:
- Qwen3 blocks (modeling_sdar.py:479-661): grouped-query attention without biases, q_norm / k_norm = RMSNorm over each
  head's dim applied before RoPE (:534-543), rotate-half RoPE with float32 tables cast to the model dtype (:693-730),
  SwiGLU MLP (:381-401), pre-norm residual layers, final norm, untied LM head (tied where config.json says so).
- RMSNorm: the live code calls flash-attn's Triton `rms_norm_fn` (:365-367; the eager Qwen3 lines are commented out
  below it): normalised and scaled in float32, cast once — `SDARRMSNorm` does that.
- Inference attention (:570-595, generate.py:83-87): **block-causal** — a token of block b attends to every token of
  blocks <= b (`tril(ones(nb, nb))` repeated over block_length), RoPE positions plain arange. The official code passes
  that boolean mask to SDPA on a prefill, and no mask (flash-attn, causal=False) when a block attends to the whole
  cache and itself: both are `attend` here (SDPA with a boolean mask; the same math).
- Training (:286-327 `block_diff_mask`, :1069-1110 `prepare_for_bd_training`): the input is [x_t | x_0] (noisy and
  clean copies, the same position ids twice) under a mask that is block-diagonal within the noisy stream, offset
  block-causal from noisy to clean (a noisy block sees the clean blocks before it) and block-causal within the clean
  stream, so one forward scores every block: `two_stream_mask`, `two_stream_logits`.

The logits are NOT shifted (unlike Dream): position i's logits are the distribution of token i.

`SDARModel.forward` serves every use through one signature (input_ids, attention_mask, positions, kv_cache,
window_start, position_ids, block_length): a whole block-causal canvas (2-D key mask, left padding allowed when the
padding is whole blocks: `block_canvas`), a window of a canvas against a preallocated KV cache (models/kv_cache.py:
the window's K/V are written into its slots, the queries attend to every slot the 2-D mask marks), or any explicit
4-D boolean mask (the two-stream training forward). The native per-block cache of the sampler is the second mode
with the key mask cut at the window's end: causal across blocks, so the cache is exact (no approximation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PretrainedConfig, PreTrainedModel

from dllm_ais.models.gqa import attend_gqa, rope_tables, rotate, select_positions
from dllm_ais.models.kv_cache import KVCache, window_index


class SDARConfig(PretrainedConfig):
    """SDAR configuration with the official config.json field names (defaults: SDAR-8B-Chat's config.json).

    Unknown fields of an official config.json (auto_map, fuse_cross_entropy, …) are kept and written back on save.
    The LLaDA-style names the rest of the package reads (d_model, n_layers, n_heads, n_kv_heads, embedding_size,
    mlp_hidden_size) are read-only aliases; head_dim is a field of its own (Qwen3: not hidden_size / heads)."""

    model_type = "sdar"

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 4096,
        intermediate_size: int = 12288,
        num_hidden_layers: int = 36,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 8,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        rope_theta: float = 1000000.0,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        use_sliding_window: bool = False,
        sliding_window: int | None = None,
        block_size: int = 4,
        mask_token_id: int | None = 151669,
        pad_token_id: int | None = None,
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
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        if rope_scaling is not None:  # set only when given: transformers >= 5 warns on every rope_scaling assignment
            self.rope_scaling = rope_scaling
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        # config.json's "attn_implementation" (flex_attention: the official training kernel) is kept under another
        # name: transformers would otherwise try to select that kernel for this model (`to_dict` writes it back)
        self.hub_attn_implementation = kwargs.pop("attn_implementation", None)
        kwargs.pop("use_cache", None)
        super().__init__(tie_word_embeddings=tie_word_embeddings, pad_token_id=pad_token_id,
                         eos_token_id=eos_token_id, bos_token_id=bos_token_id, **kwargs)

    def to_dict(self) -> dict:
        out = super().to_dict()
        hub = out.pop("hub_attn_implementation", None)
        if hub is not None:
            out["attn_implementation"] = hub
        return out

    # LLaDA-style read-only aliases (KV cache, plan and samplers read these names).
    d_model = property(lambda self: self.hidden_size)
    n_layers = property(lambda self: self.num_hidden_layers)
    n_heads = property(lambda self: self.num_attention_heads)
    n_kv_heads = property(lambda self: self.num_key_value_heads)
    embedding_size = property(lambda self: self.vocab_size)
    mlp_hidden_size = property(lambda self: self.intermediate_size)
    eot_token_id = property(lambda self: getattr(self, "_eot_token_id", None),
                            lambda self, v: setattr(self, "_eot_token_id", v))

    def validate(self) -> None:
        """Reject configurations this implementation does not support, naming the field to change."""
        if self.mask_token_id is None:
            raise ValueError("SDAR config has no `mask_token_id` (SDAR's <|MASK|>, 151669 in the released "
                             "checkpoints); add it to config.json.")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id={self.mask_token_id} outside the vocabulary ({self.vocab_size}).")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}.")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (rotate-half RoPE).")
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} must be >= 1.")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act={self.hidden_act!r}: only 'silu' (SDAR's SwiGLU) is supported.")
        if self.attention_bias:
            raise ValueError("attention_bias=true: SDAR's attention has no biases; this implementation has none.")
        if self.use_sliding_window:
            raise ValueError("use_sliding_window=true: SDAR's block attention has no sliding window; set it false.")
        scaling = getattr(self, "rope_scaling", None)
        if scaling is not None and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
            raise ValueError(f"rope_scaling={scaling}: only default RoPE is supported; set it to null.")


class SDARRMSNorm(nn.Module):
    """weight · x / rms(x), in float32, cast once (flash-attn's `rms_norm_fn`, which the official code calls)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (x32 * self.weight.float()).to(x.dtype)


class SDARAttention(nn.Module):
    """GQA self-attention, no biases, q/k RMSNorm per head before RoPE; the mask decides what each query sees."""

    def __init__(self, config: SDARConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)
        self.q_norm = SDARRMSNorm(hd, config.rms_norm_eps)
        self.k_norm = SDARRMSNorm(hd, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None, index: torch.Tensor | None = None):
        # x [B, Tq, d]; mask None or bool [B, 1, Tq, Tk] (True = the query sees the key); kv: this layer's cache
        # [B, Hkv, T, D] and index [Tq] the window's slots in it (written before attending)
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        att = attend_gqa(q, k, v, mask, None, kv, index)  # [B, H, Tq, D]
        return self.o_proj(att.transpose(1, 2).reshape(B, T, -1))


class SDARMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) · up_proj(x)), no biases."""

    def __init__(self, config: SDARConfig):
        super().__init__()
        d, h = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SDARDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, config: SDARConfig):
        super().__init__()
        self.self_attn = SDARAttention(config)
        self.mlp = SDARMLP(config)
        self.input_layernorm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, kv=None, index=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, index)
        return x + self.mlp(self.post_attention_layernorm(x))


def block_causal_mask(length: int, block_length: int, device=None) -> torch.Tensor:
    """[T, T] bool: query i sees key j iff j's block <= i's block (blocks of `block_length` from position 0;
    generate.py:83-86)."""
    block = torch.arange(length, device=device) // block_length
    return block[None, :] <= block[:, None]


def block_diff_mask(q_idx: torch.Tensor, kv_idx: torch.Tensor, block_size: int, n: int) -> torch.Tensor:
    """The two-stream training mask (modeling_sdar.py:286-327) elementwise: indices < n are the noisy stream x_t,
    indices >= n the clean stream x_0. A noisy query sees its own noisy block and the clean blocks before it; a clean
    query sees the clean blocks up to its own. q_idx, kv_idx broadcastable long tensors -> bool."""
    clean_q, clean_kv = q_idx >= n, kv_idx >= n
    block_q = torch.where(clean_q, q_idx - n, q_idx) // block_size
    block_kv = torch.where(clean_kv, kv_idx - n, kv_idx) // block_size
    diagonal = (block_q == block_kv) & (clean_q == clean_kv)
    offset_causal = (block_q > block_kv) & clean_kv & ~clean_q
    causal = (block_q >= block_kv) & clean_kv & clean_q
    return diagonal | offset_causal | causal


def two_stream_mask(n: int, block_length: int, device=None) -> torch.Tensor:
    """[2n, 2n] bool: `block_diff_mask` over the concatenation [x_t (n) | x_0 (n)]."""
    idx = torch.arange(2 * n, device=device)
    return block_diff_mask(idx[:, None], idx[None, :], block_length, n)


def padded_positions(keep: torch.Tensor) -> torch.Tensor:
    """RoPE positions [B, T] of a left-padded canvas: cumsum(keep) − 1 (padding 0; it is never seen)."""
    return (keep.long().cumsum(-1) - 1).clamp(min=0)


def canvas_inputs(config: SDARConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  position_ids: torch.Tensor | None, kv_cache: KVCache | None, window_start: int | torch.Tensor,
                  block_length: int | None, dtype: torch.dtype):
    """What every layer of a forward shares: cos, sin [B, 1, Tq, D], mask [B, 1, Tq, Tk] bool | None and the
    window's cache slots index [Tq] | None (module docstring: the three modes)."""
    B, Tq = input_ids.shape
    dev = input_ids.device
    index = window_index(window_start, Tq, dev) if kv_cache is not None else None
    mask = None
    if attention_mask is not None and attention_mask.dim() == 4:  # explicit: the caller's mask and positions
        mask = attention_mask.bool()
        if position_ids is None:
            position_ids = torch.arange(Tq, device=dev).expand(B, -1)
    else:
        T = Tq if kv_cache is None else kv_cache.length
        keep = (torch.ones(B, T, dtype=torch.bool, device=dev) if attention_mask is None
                else attention_mask.bool())  # [B, T]
        if position_ids is None:
            position_ids = padded_positions(keep)
            if index is not None:
                position_ids = position_ids.index_select(1, index)
        if kv_cache is None:  # the whole canvas, block-causal; a query always sees itself (padding stays finite)
            causal = block_causal_mask(T, block_length or config.block_size, dev)
            mask = (causal & keep[:, None, :]) | torch.eye(T, dtype=torch.bool, device=dev)
            mask = mask[:, None]  # [B, 1, T, T]
        else:  # a window against the cache: every marked key, and the window's own slots
            own = torch.zeros(Tq, T, dtype=torch.bool, device=dev).scatter_(1, index[:, None], True)
            mask = (keep[:, None, :] | own)[:, None]  # [B, 1, Tq, T]
    cos, sin = rope_tables(position_ids, config.head_dim, config.rope_theta, dtype)
    return cos, sin, mask, index


class SDARBaseModel(nn.Module):
    """The official `model` submodule: embed_tokens, layers, norm."""

    gradient_checkpointing = False

    def __init__(self, config: SDARConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(SDARDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                window_start: int | torch.Tensor = 0, block_length: int | None = None) -> torch.Tensor:
        """Final hidden states [B, Tq, d] (SDARModel.forward says what the arguments mean)."""
        x = self.embed_tokens(input_ids)  # [B, Tq, d]
        cos, sin, mask, index = canvas_inputs(self.config, input_ids, attention_mask, position_ids, kv_cache,
                                              window_start, block_length, x.dtype)
        for i, layer in enumerate(self.layers):
            if kv_cache is not None:
                x = layer(x, cos, sin, mask, kv_cache.layer(i), index)
            elif self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                ckpt = getattr(self, "_gradient_checkpointing_func", None) or (
                    lambda f, *a: checkpoint(f, *a, use_reentrant=False))
                x = ckpt(layer.__call__, x, cos, sin, mask)
            else:
                x = layer(x, cos, sin, mask)
        return self.norm(x)


@dataclass
class SDAROutput:
    """Model output. logits [B, P, V] (unshifted), P = Tq or the number of requested positions."""

    logits: torch.Tensor


class SDARModel(PreTrainedModel):
    """SDAR language model in our own code (peft, accelerate and gradient checkpointing work).

    forward(input_ids [B, Tq], attention_mask, positions, kv_cache, window_start, position_ids, block_length):
    - attention_mask [B, T] bool (1 = a real key) or None, no cache: the canvas is block-causal in blocks of
      `block_length` (default config.block_size) counted from column 0, padding keys hidden, positions cumsum − 1;
      left padding must be whole blocks for the blocks to be the rows' own (`block_canvas` lays a batch out so).
    - with kv_cache: input_ids is the window [s, s + Tq) (s = window_start, an int or a 0-dim tensor); its K/V are
      written into those slots and its queries see every key attention_mask [B, T] marks (the caller marks the
      blocks <= the window's) and the window itself; positions cumsum(mask) − 1 at the window.
    - attention_mask [B | 1, 1, Tq, Tk] bool: used as given (e.g. `two_stream_mask`); position_ids default arange.
    positions selects output rows (None = all, a slice, or an index [B, P]); position_ids [B, Tq] overrides RoPE's.
    """

    config_class = SDARConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["SDARDecoderLayer"]
    _supports_sdpa = True
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    family = "sdar"
    hub_architecture = "SDARForCausalLM"
    shifted_logits = False

    def __init__(self, config: SDARConfig):
        config.validate()
        super().__init__(config)
        self.model = SDARBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, SDARRMSNorm):
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
                block_length: int | None = None, **kwargs) -> SDAROutput:
        if kwargs.get("labels") is not None:
            raise ValueError("SDARModel computes no loss; use dllm_ais.likelihood for diffusion objectives.")
        h = self.model(input_ids, attention_mask, position_ids, kv_cache, window_start, block_length)
        return SDAROutput(logits=self.lm_head(select_positions(h, positions)))


def two_stream_logits(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor, keep: torch.Tensor | None,
                      block_length: int, positions: torch.Tensor | None = None, noisy_from: int = 0) -> torch.Tensor:
    """Logits [B, T, V] of the noisy stream of one two-stream forward (the official training forward's layout):
    input [x_t | x_0] [B, 2T], positions [p | p] with p = cumsum(keep) − 1, mask `two_stream_mask(T, block_length)`
    with padding keys hidden. Row b's noisy block k gets the logits a block-causal forward gives block k when it holds
    x_t's block k after x_0's blocks < k — in one forward for every block. noisy_ids, clean_ids [B, T] on a
    block-aligned canvas (padding whole blocks, `block_canvas`), keep [B, T] bool (None = no padding); positions
    [B, M] long (noisy-stream columns) returns [B, M, V] for those only. noisy_from (a multiple of block_length):
    the noisy stream starts at that canvas column (its earlier blocks — full prompt blocks with nothing to score —
    are left out: no query sees a noisy block but its own, so the logits of the rest are unchanged); the output then
    covers columns [noisy_from, T) and `positions` count from noisy_from."""
    B, T = noisy_ids.shape
    dev = noisy_ids.device
    if noisy_from % block_length:
        raise ValueError(f"noisy_from={noisy_from} must be a multiple of block_length={block_length}.")
    keep = torch.ones(B, T, dtype=torch.bool, device=dev) if keep is None else keep.bool()
    pos = padded_positions(keep)
    s = noisy_from
    idx = torch.cat([torch.arange(s, T, device=dev), T + torch.arange(T, device=dev)])  # two-stream indices kept
    keep2 = torch.cat([keep[:, s:], keep], dim=1)  # [B, 2T − s]
    mask = block_diff_mask(idx[:, None], idx[None, :], block_length, T)[None] & keep2[:, None, :]
    mask = mask | torch.eye(idx.numel(), dtype=torch.bool, device=dev)
    out = model(input_ids=torch.cat([noisy_ids[:, s:], clean_ids], dim=1), attention_mask=mask[:, None],
                position_ids=torch.cat([pos[:, s:], pos], dim=1),
                positions=slice(0, T - s) if positions is None else positions)
    return out.logits


@dataclass
class BlockCanvas:
    """A batch laid out for block diffusion: each row's real tokens start at a block boundary (left padding by whole
    blocks), so canvas block k is block k − start/Lb of that row's own canvas — the official batch-1 canvas
    (generate.py:79-93: prompt, then masks up to a whole number of blocks), row by row. Every row's first block
    that holds a mask is canvas block `first_block` (Q = the most full prompt blocks of any row); a row whose prompt
    is not a multiple of Lb has its prompt tail there and one more block than a row whose prompt is.

    Row i's completion is canvas [prompt_end_i, row_end_i): gen_length and the slots that fill its last block
    (the official completion, x[:, prompt_length:]). The record keeps it left-aligned in [B, L], L the batch's
    longest; slots past a row's own canvas are not part of it (`completion_valid`)."""

    ids: torch.Tensor
    """[B, T] long: the prompts' real tokens in place, the mask token elsewhere (padding's value is never seen)."""
    keep: torch.Tensor
    """[B, T] bool: real prompt tokens and the row's own completion slots (False: padding, slots past its canvas)."""
    prompt_end: torch.Tensor
    """[B] long: the canvas column of the row's first completion slot (Q·Lb + its prompt tail)."""
    row_end: torch.Tensor
    """[B] long: the end of the row's own canvas (a block boundary)."""
    first_block: int
    """Q: the first canvas block holding a mask (blocks < Q hold full prompt blocks or padding: the prefill)."""
    block_length: int
    """Lb."""
    completion_length: int
    """L: the width of the completion record."""

    @property
    def num_blocks(self) -> int:
        return self.ids.shape[1] // self.block_length

    def completion_columns(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(canvas columns [B, L] of each completion slot, clamped into the canvas; valid [B, L] bool)."""
        cols = self.prompt_end[:, None] + torch.arange(self.completion_length, device=self.ids.device)  # [B, L]
        return cols.clamp(max=self.ids.shape[1] - 1), cols < self.row_end[:, None]

    def gather(self, x: torch.Tensor, fill) -> torch.Tensor:
        """x [B, T] -> [B, L] at the completion slots, `fill` where a slot is past the row's canvas."""
        cols, valid = self.completion_columns()
        return torch.where(valid, x.gather(1, cols), torch.as_tensor(fill, dtype=x.dtype, device=x.device))

    def scatter(self, values: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        """A copy of `into` [B, T] with the valid completion slots set from values [B, L]."""
        cols, valid = self.completion_columns()
        out = into.clone()
        rows = torch.arange(into.shape[0], device=into.device)[:, None].expand_as(cols)
        out[rows[valid], cols[valid]] = values[valid].to(out.dtype)
        return out


def block_canvas(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, block_length: int, gen_length: int,
                 mask_token_id: int, completion_length: int | None = None) -> BlockCanvas:
    """The block-aligned canvas (`BlockCanvas`) of left-padded prompts [B, P] (prompt_mask [B, P] True on real
    tokens, which must be a suffix of each row) for `gen_length` tokens in blocks of `block_length`.
    completion_length: the record's width (default: the batch's longest completion)."""
    B, P = prompt_ids.shape
    Lb, dev = block_length, prompt_ids.device
    keep_p = prompt_mask.bool()
    n = keep_p.sum(-1)  # [B] prompt lengths
    if not bool((keep_p == (torch.arange(P, device=dev) >= (P - n)[:, None])).all()):
        raise ValueError("prompts must be left-padded (prompt_mask True on a suffix of each row).")
    q, r = n // Lb, n % Lb  # full prompt blocks, prompt tail
    Q = int(q.max())
    own_blocks = (r + gen_length + Lb - 1) // Lb  # [B] blocks each row denoises (generate.py:79-80)
    T = (Q + int(own_blocks.max())) * Lb
    start = (Q - q) * Lb  # [B] first real column
    prompt_end = Q * Lb + r
    row_end = (Q + own_blocks) * Lb
    col = torch.arange(T, device=dev)[None, :]  # [1, T]
    in_prompt = (col >= start[:, None]) & (col < prompt_end[:, None])  # [B, T]
    src = (P - n)[:, None] + col - start[:, None]  # prompt column of each canvas column
    ids = torch.where(in_prompt, prompt_ids.gather(1, src.clamp(0, P - 1)), mask_token_id)
    keep = (col >= start[:, None]) & (col < row_end[:, None])
    L = int((row_end - prompt_end).max()) if completion_length is None else completion_length
    return BlockCanvas(ids=ids, keep=keep, prompt_end=prompt_end, row_end=row_end, first_block=Q, block_length=Lb,
                       completion_length=L)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of an SDAR block (the LM head `lm_head` is not one of them)."""


def lora_target_regex(targets: tuple[str, ...] = LORA_TARGETS) -> str:
    """A peft `target_modules` regex matching the block linears only."""
    return rf".*\.layers\.\d+\.(self_attn|mlp)\.({'|'.join(targets)})"
