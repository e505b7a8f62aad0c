"""The fused rollout copy of a Dream model: q/k/v (GQA, with biases) and gate/up stacked into one FP8 linear each.

Per layer the copy holds four linears instead of seven:
  qkv      [q' + 2·k', d]  q_proj, k_proj, v_proj stacked, with their biases  (q' = H·D, k' = Hkv·D, each rounded up
                                                                              to a multiple of `pad`)
  o_proj   [d, H·D]
  gate_up  [2·h', d]       gate_proj, up_proj stacked                       (h' = h rounded up likewise)
  down     [d, h]
so each normalised layer input is quantised once for q, k and v, and once for gate and up. As in
models/llada/fused_fp8.py each part is padded to whole 128-row blocks (`pad` 128 for FP8, 1 for BF16), so its codes and
scales are exactly a fresh quantisation of its master tensor and the padding rows (zero codes, zero bias) are never
read.

Numerics: every op outside the linears is Dream's own (models/dream/model.py: RMSNorm scaled in the input dtype, RoPE in
the input dtype, `attend_gqa` with the padding rules, `canvas_inputs`), and each FP8Linear quantises its input as the
walker copy's does, so with the torch backend the fused copy computes what the walker copy (fp8/quantize.py) computes
up to the summation order of the wider GEMM. Not (yet) here: producers that emit FP8 (LLaDA's Triton producers
compute RMSNorm and RoPE in LLaDA's rounding order, which differs from Dream's in bf16).

`build_fused_dream(master, backend)` / `sync_fused_dream(master, rollout)`: the master (plain or peft-wrapped
DreamModel, LoRA merged on the fly; or FSDP2-sharded, one layer gathered at a time) keeps the official names; sync
writes each master tensor into its row slice of the fused buffers in place. Embeddings, norms and the LM head stay in
the master's dtype.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from dllm_ais.fp8.backends import check_backend, prepare_gemm_shapes
from dllm_ais.fp8.fused_copy import FusedCopy
from dllm_ais.fp8.fused_sync import load_rows, round_up
from dllm_ais.fp8.linear import FP8Linear, resolve_auto
from dllm_ais.fp8.quant import BLOCK
from dllm_ais.fp8.walker import canonical_name, effective_weight, linear_layers, named_tensors
from dllm_ais.models.dream.model import (
    DreamConfig,
    DreamModel,
    DreamOutput,
    DreamRMSNorm,
    attend_gqa,
    canvas_inputs,
    rotate,
    select_positions,
)
from dllm_ais.models.kv_cache import KVCache

FUSED_PARTS: dict[str, tuple[str, ...]] = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
"""Fused linear of a rollout layer -> the master layer's linears stacked in it (official names), in order."""


class FusedDreamLayer(nn.Module):
    """One Dream layer with fused qkv / gate_up linears (FP8Linear, or nn.Linear for the BF16 copy)."""

    def __init__(self, config: DreamConfig, backend: str | None, device, dtype: torch.dtype):
        super().__init__()
        d, h, D = config.hidden_size, config.intermediate_size, config.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.h = config.num_attention_heads, config.num_key_value_heads, D, h
        pad = BLOCK if backend is not None else 1
        self.qp, self.kp, self.hp = round_up(self.n_heads * D, pad), round_up(self.n_kv * D, pad), round_up(h, pad)
        self.input_layernorm = DreamRMSNorm(d, config.rms_norm_eps).to(device=device, dtype=dtype)
        self.post_attention_layernorm = DreamRMSNorm(d, config.rms_norm_eps).to(device=device, dtype=dtype)
        shapes = {"qkv": (d, self.qp + 2 * self.kp, True), "o_proj": (self.n_heads * D, d, False),
                  "gate_up": (d, 2 * self.hp, False), "down": (h, d, False)}
        for name, (k, n, bias) in shapes.items():
            if backend is None:
                layer = nn.Linear(k, n, bias=bias, device=device, dtype=dtype)
                nn.init.zeros_(layer.weight)
                if bias:
                    nn.init.zeros_(layer.bias)
            else:
                layer = FP8Linear(k, n, bias, backend=backend, device=device, name=name)
            setattr(self, name, layer)

    def part_offsets(self, fused: str) -> list[tuple[str, int]]:
        """(official linear name within the layer, first row in the fused weight) for each part of `fused`."""
        starts = {"qkv": (0, self.qp, self.qp + self.kp), "gate_up": (0, self.hp)}.get(fused, (0,))
        return list(zip(FUSED_PARTS[fused], starts, strict=True))

    def forward(self, x, cos, sin, key_mask, query_keep, kv=None, index=None):
        B, T, _ = x.shape
        D, nq, nk = self.head_dim, self.n_heads * self.head_dim, self.n_kv * self.head_dim
        qkv = self.qkv(self.input_layernorm(x))  # [B, T, q' + 2·k']
        q = qkv[..., :nq].view(B, T, self.n_heads, D).transpose(1, 2)
        k = qkv[..., self.qp:self.qp + nk].view(B, T, self.n_kv, D).transpose(1, 2)
        v = qkv[..., self.qp + self.kp:self.qp + self.kp + nk].view(B, T, self.n_kv, D).transpose(1, 2)
        att = attend_gqa(rotate(q, cos, sin), rotate(k, cos, sin), v, key_mask, query_keep, kv, index)
        x = x + self.o_proj(att.transpose(1, 2).reshape(B, T, nq))
        gu = self.gate_up(self.post_attention_layernorm(x))  # [B, T, 2·h']
        return x + self.down(F.silu(gu[..., :self.h]) * gu[..., self.hp:self.hp + self.h])


class FusedDream(FusedCopy):
    """Inference-only rollout copy of a DreamModel: forward(input_ids, attention_mask, positions, kv_cache,
    window_start, position_ids) -> raw .logits, as the master's (`shifted_logits` too)."""

    family = "dream"
    shifted_logits = True

    def __init__(self, config: DreamConfig, backend: str | None, device, dtype: torch.dtype):
        super().__init__()
        self.config, self.backend = config, backend
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(FusedDreamLayer(config, backend, device, dtype)
                                    for _ in range(config.num_hidden_layers))
        self.norm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps).to(device=device, dtype=dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device=device, dtype=dtype)

    def sync_from(self, master: nn.Module, gather=None, full=None) -> None:
        """Refill this copy from the master in place (fp8/sync.py `sync_weights` calls it; `gather` / `full` for an
        FSDP2-sharded master, train/fsdp_sync.py)."""
        sync_fused_dream(master, self, gather=gather, full=full)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | slice | None = None, kv_cache: KVCache | None = None,
                window_start: int | torch.Tensor = 0, position_ids: torch.Tensor | None = None,
                **kwargs) -> DreamOutput:
        x = self.embed_tokens(input_ids)  # [B, Tq, d]
        cos, sin, key_mask, query_keep, index = canvas_inputs(self.config, input_ids, attention_mask, position_ids,
                                                              kv_cache, window_start, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, key_mask, query_keep, None if kv_cache is None else kv_cache.layer(i), index)
        return DreamOutput(logits=self.lm_head(select_positions(self.norm(x), positions)))


def dream_master(model: nn.Module) -> DreamModel | None:
    """The DreamModel inside `model` (itself, or under a peft wrapper), or None."""
    base = model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model
    return base if isinstance(base, DreamModel) else None


@torch.no_grad()
def sync_fused_dream(master: nn.Module, rollout: FusedDream, gather=None, full=None) -> None:
    """Copy the master's current weights (LoRA merged) into the fused rollout copy, in place, one tensor at a time.

    `gather(module)` / `full(tensor)` (FSDP2, dllm_ais/train/fsdp_sync.py, as LLaDA's `sync_per_tensor`): a context
    manager that makes one master layer's sharded parameters (weight, bias, LoRA factors) whole while it is read, and
    the whole of one sharded tensor; default: the master is unsharded."""
    gather = gather or contextlib.nullcontext
    full = full or (lambda t: t)
    peft_root = hasattr(master, "peft_config")
    layers = {canonical_name(n, peft_root): m for n, m in linear_layers(master).items()}
    tensors = {canonical_name(n, peft_root): t for n, t in named_tensors(master)}

    def copy(target: torch.Tensor, name: str) -> None:
        if name in layers:
            with gather(layers[name]):
                source = effective_weight(layers[name])[0]
                _checked_copy(target, source, name)
        else:
            _checked_copy(target, full(tensors[name].detach()), name)

    copy(rollout.embed_tokens.weight, "model.embed_tokens.weight")
    copy(rollout.norm.weight, "model.norm.weight")
    copy(rollout.lm_head.weight, "lm_head")
    for i, layer in enumerate(rollout.layers):
        prefix = f"model.layers.{i}."
        copy(layer.input_layernorm.weight, f"{prefix}input_layernorm.weight")
        copy(layer.post_attention_layernorm.weight, f"{prefix}post_attention_layernorm.weight")
        for fused in FUSED_PARTS:
            target = getattr(layer, fused)
            for name, offset in layer.part_offsets(fused):
                with gather(layers[prefix + name]):  # one master linear whole at a time
                    weight, bias = effective_weight(layers[prefix + name])
                    load_rows(target, offset, weight)
                    if bias is not None:
                        target.bias[offset:offset + bias.shape[0]].copy_(bias.detach())


def _checked_copy(target: torch.Tensor, source: torch.Tensor, name: str) -> None:
    if source.shape != target.shape:
        raise KeyError(f"sync: master tensor {name!r} {tuple(source.shape)} does not fit {tuple(target.shape)}")
    target.copy_(source.detach())


@torch.no_grad()
def build_fused_dream(model: nn.Module, backend: str | None, expected_m: int | None = None) -> FusedDream:
    """The fused rollout copy of a (peft-wrapped or plain) DreamModel, on its device, in eval mode, no grads.
    backend None = BF16 copy in the master's dtype; else an FP8 backend ("auto" resolved here per fused shape)."""
    master = dream_master(model)
    if master is None:
        raise TypeError(f"build_fused_dream needs a DreamModel (or a peft model around one), got {type(model)}")
    weight = master.get_input_embeddings().weight
    if backend is not None:
        check_backend(backend, weight.device)
    rollout = FusedDream(master.config, backend, weight.device, weight.dtype)
    sync_fused_dream(model, rollout)
    if backend == "auto":
        resolve_auto(rollout, expected_m, kind="forward")
    if expected_m:
        prepare_gemm_shapes(rollout, [expected_m])
    rollout.requires_grad_(False)
    return rollout.eval()


def fp8_copy(model: nn.Module, backend: str, expected_m: int | None = None) -> FusedDream | None:
    """The family's fp8_copy hook: the fused FP8 copy of a Dream master (plain or peft), None for any other model."""
    return None if dream_master(model) is None else build_fused_dream(model, backend, expected_m=expected_m)
