"""The fused rollout copy of an SDAR model: q/k/v (GQA, no biases) and gate/up stacked into one quantised linear each,
SDAR's per-head q/k RMSNorm inside the producers, synced in place.

Per layer the copy holds four linears instead of seven:
  qkv      [q' + 2·k', d]  q_proj, k_proj, v_proj stacked   (q' = H·D, k' = Hkv·D, each rounded up to a multiple of
                                                            `pad`)
  o_proj   [d, H·D]
  gate_up  [2·h', d]       gate_proj, up_proj stacked       (h' = h rounded up likewise)
  down     [d, h]
`pad` is 128 for FP8 (each part's codes and scales are then exactly a fresh quantisation of its master tensor, as in
models/llada/fused_fp8.py; the padding rows hold zero codes and are never read) and 1 for BF16 and emulated FP4.

FP8 forward of a layer (producers emit the codes + scales the GEMM reads, as LLaDA's fused copy; `producers` "torch":
the twins of fp8/producers.py, "triton": the kernels of fp8/producer_kernels.py through fp8/ops.py):
  rmsnorm_quant(x) -> qkv GEMM -> qk_norm_rope(q), qk_norm_rope(k) (per-head RMSNorm + RoPE in the model dtype, one
  producer each) -> SDPA (block-causal mask, KV cache) -> attn_out_quant -> o_proj GEMM -> + x
  rmsnorm_quant(x) -> gate_up GEMM -> silu_mul_quant -> down GEMM -> + x
The BF16 copy and the emulated FP4 copy (fp4/linear.py's FP4Linear, which quantises its own input) run the same
fused structure on model-dtype producer outputs ("plain").

Numerics: every producer is SDAR's own math (models/sdar/model.py: SDARRMSNorm in float32 cast once =
producers.rms_norm; q_norm then gqa.rotate in the model dtype = producers.qk_norm_rope, bit-equal; F.silu(g)·u;
`canvas_inputs`' masks, positions and the KV cache windows), and each producer quantises as FP8Linear quantises its
input, so with the torch backend and torch producers the fused copy computes what the per-Linear copy
(fp8/quantize.py with an `exclude`) computes, up to the summation order of the wider GEMM
(tests/test_fp8_fused_sdar.py: bit-equal at its shapes).

`build_fused_sdar(master, backend)` / `fp4_copy(master, make_linear)` / `sync_fused_sdar(master, rollout)`: the master
(plain or peft-wrapped SDARModel, LoRA merged on the fly; or FSDP2-sharded, one master linear gathered at a time)
keeps the official names; sync writes each master tensor into its row slice of the fused buffers in place.
Embeddings, norms (q_norm / k_norm included) and the LM head stay in the master's dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dllm_ais.fp8 import producers
from dllm_ais.fp8.backends import check_backend, default_producers, prepare_gemm_shapes
from dllm_ais.fp8.fused_copy import FusedCopy, forward_variant
from dllm_ais.fp8.fused_sync import load_rows, round_up, sync_plan
from dllm_ais.fp8.linear import FP8Linear, resolve_auto
from dllm_ais.fp8.quant import BLOCK
from dllm_ais.fp8.walker import canonical_name, effective_weight, linear_layers, named_tensors
from dllm_ais.models.gqa import attend_gqa, select_positions
from dllm_ais.models.kv_cache import KVCache
from dllm_ais.models.sdar.model import SDARConfig, SDARModel, SDAROutput, SDARRMSNorm, canvas_inputs

FUSED_PARTS: dict[str, tuple[str, ...]] = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
"""Fused linear of a rollout layer -> the master layer's linears stacked in it (official names), in order."""

MakeLinear = Callable[[int, int, torch.device, str], nn.Module]
"""make_linear(in_features, out_features, device, name) -> a quantised linear with `load_rows_(offset, weight)`
(fp4/linear.py's FP4Linear: the emulated FP4 copy)."""


class FusedSDARLayer(nn.Module):
    """One SDAR layer with fused qkv / gate_up linears (FP8Linear, a `make_linear` one, or nn.Linear for BF16)."""

    def __init__(self, config: SDARConfig, backend: str | None, device, dtype: torch.dtype,
                 make_linear: MakeLinear | None = None):
        super().__init__()
        d, h, D = config.hidden_size, config.intermediate_size, config.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.h = config.num_attention_heads, config.num_key_value_heads, D, h
        pad = BLOCK if backend is not None else 1
        self.qp, self.kp, self.hp = round_up(self.n_heads * D, pad), round_up(self.n_kv * D, pad), round_up(h, pad)
        eps = config.rms_norm_eps
        self.input_layernorm = SDARRMSNorm(d, eps).to(device=device, dtype=dtype)
        self.post_attention_layernorm = SDARRMSNorm(d, eps).to(device=device, dtype=dtype)
        self.q_norm = SDARRMSNorm(D, eps).to(device=device, dtype=dtype)
        self.k_norm = SDARRMSNorm(D, eps).to(device=device, dtype=dtype)
        shapes = {"qkv": (d, self.qp + 2 * self.kp), "o_proj": (self.n_heads * D, d), "gate_up": (d, 2 * self.hp),
                  "down": (h, d)}
        for name, (k, n) in shapes.items():
            if backend is not None:
                layer = FP8Linear(k, n, backend=backend, device=device, name=name)
            elif make_linear is not None:
                layer = make_linear(k, n, device, name)
            else:
                layer = nn.Linear(k, n, bias=False, device=device, dtype=dtype)
                nn.init.zeros_(layer.weight)
            setattr(self, name, layer)

    def part_offsets(self, fused: str) -> list[tuple[str, int]]:
        """(official linear name within the layer, first row in the fused weight) for each part of `fused`."""
        starts = {"qkv": (0, self.qp, self.qp + self.kp), "gate_up": (0, self.hp)}.get(fused, (0,))
        return list(zip(FUSED_PARTS[fused], starts, strict=True))

    def heads(self, qkv: torch.Tensor, B: int, T: int):
        """qkv [B·T, q' + 2·k'] -> q [B, T, H, D], k [B, T, Hkv, D] (views, norm and RoPE still to apply), v
        [B, Hkv, T, D]."""
        D, nq, nk = self.head_dim, self.n_heads * self.head_dim, self.n_kv * self.head_dim
        q = qkv[:, :nq].view(B, T, self.n_heads, D)
        k = qkv[:, self.qp:self.qp + nk].view(B, T, self.n_kv, D)
        v = qkv[:, self.qp + self.kp:self.qp + self.kp + nk].view(B, T, self.n_kv, D).transpose(1, 2)
        return q, k, v


def _layer_fp8_producers(layer: FusedSDARLayer, impl, x, cos, sin, mask, kv=None, index=None):
    """FP8 layer whose producers emit codes + scales. x [B, T, d] -> [B, T, d]; cos, sin [B, T, D/2] model dtype."""
    B, T, d = x.shape
    dtype = x.dtype
    x2 = x.reshape(B * T, d)
    n1 = layer.input_layernorm
    qkv = layer.qkv.forward_quantized(*impl.rmsnorm_quant(x2, n1.weight, n1.variance_epsilon), dtype)
    q, k, v = layer.heads(qkv, B, T)
    q = impl.qk_norm_rope(q, layer.q_norm.weight, layer.q_norm.variance_epsilon, cos, sin)  # [B, H, T, D]
    k = impl.qk_norm_rope(k, layer.k_norm.weight, layer.k_norm.variance_epsilon, cos, sin)  # [B, Hkv, T, D]
    att = attend_gqa(q, k, v, mask, None, kv, index)  # [B, H, T, D]
    x2 = x2 + layer.o_proj.forward_quantized(*impl.attn_out_quant(att), dtype)
    n2 = layer.post_attention_layernorm
    gu = layer.gate_up.forward_quantized(*impl.rmsnorm_quant(x2, n2.weight, n2.variance_epsilon), dtype)
    x2 = x2 + layer.down.forward_quantized(*impl.silu_mul_quant(gu[:, :layer.h], gu[:, layer.hp:layer.hp + layer.h]),
                                           dtype)
    return x2.view(B, T, d)


def _layer_plain(layer: FusedSDARLayer, impl, x, cos, sin, mask, kv=None, index=None):
    """Fused layer on model-dtype producer outputs (the BF16 copy; linears that quantise their own input: FP4)."""
    B, T, d = x.shape
    x2 = x.reshape(B * T, d)
    n1 = layer.input_layernorm
    q, k, v = layer.heads(layer.qkv(producers.rms_norm(x2, n1.weight, n1.variance_epsilon)), B, T)
    q = producers.qk_norm_rope(q, layer.q_norm.weight, layer.q_norm.variance_epsilon, cos, sin)
    k = producers.qk_norm_rope(k, layer.k_norm.weight, layer.k_norm.variance_epsilon, cos, sin)
    att = attend_gqa(q, k, v, mask, None, kv, index)
    x2 = x2 + layer.o_proj(producers.attn_merge(att))
    n2 = layer.post_attention_layernorm
    gu = layer.gate_up(producers.rms_norm(x2, n2.weight, n2.variance_epsilon))  # [B·T, 2·h']
    x2 = x2 + layer.down(F.silu(gu[:, :layer.h]) * gu[:, layer.hp:layer.hp + layer.h])
    return x2.view(B, T, d)


LAYER_FORWARDS = {"fp8_producers": _layer_fp8_producers, "plain": _layer_plain}


class FusedSDAR(FusedCopy):
    """Inference-only rollout copy of an SDARModel: forward(input_ids, attention_mask, positions, kv_cache,
    window_start, position_ids, block_length) -> unshifted .logits, as the master's (models/sdar/model.py: the
    block-causal canvas, a window against the native KV cache, or an explicit 4-D mask)."""

    family = "sdar"
    shifted_logits = False

    def __init__(self, config: SDARConfig, backend: str | None, device, dtype: torch.dtype,
                 producers: str | None = None, make_linear: MakeLinear | None = None):
        super().__init__()
        if backend is not None and make_linear is not None:
            raise ValueError("FusedSDAR: an FP8 backend or make_linear (emulated FP4), not both")
        self.config, self.backend = config, backend
        self.producers = producers or default_producers(device)
        """"triton" | "torch": the producer implementation of the FP8 forward (default_producers(device))."""
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(FusedSDARLayer(config, backend, device, dtype, make_linear)
                                    for _ in range(config.num_hidden_layers))
        self.norm = SDARRMSNorm(config.hidden_size, config.rms_norm_eps).to(device=device, dtype=dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, device=device, dtype=dtype)
        self.variant, self._impl = forward_variant(backend, self.producers)

    def sync_from(self, master: nn.Module, gather=None, full=None) -> None:
        """Refill this copy from the master in place (fp8/sync.py `sync_weights` calls it; `gather` / `full` for an
        FSDP2-sharded master, train/fsdp_sync.py)."""
        sync_fused_sdar(master, self, gather=gather, full=full)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | slice | None = None, kv_cache: KVCache | None = None,
                window_start: int | torch.Tensor = 0, position_ids: torch.Tensor | None = None,
                block_length: int | None = None, **kwargs) -> SDAROutput:
        x = self.embed_tokens(input_ids)  # [B, Tq, d]
        cos, sin, mask, index = canvas_inputs(self.config, input_ids, attention_mask, position_ids, kv_cache,
                                              window_start, block_length, x.dtype)  # cos, sin [B, 1, Tq, D]
        half = self.config.head_dim // 2
        cos, sin = cos[:, 0, :, :half].contiguous(), sin[:, 0, :, :half].contiguous()  # [B, Tq, D/2]: halves repeat
        layer_forward = LAYER_FORWARDS[self.variant]
        for i, layer in enumerate(self.layers):
            kv = None if kv_cache is None else kv_cache.layer(i)
            x = layer_forward(layer, self._impl, x, cos, sin, mask, kv, index)
        return SDAROutput(logits=self.lm_head(self.norm(select_positions(x, positions))))


# ----------------------------------------------------------------------------------------------------------------------
# building and syncing


def sdar_master(model: nn.Module) -> SDARModel | None:
    """The SDARModel inside `model` (itself, or under a peft wrapper), or None."""
    base = model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model
    return base if isinstance(base, SDARModel) else None


def _load_rows(layer: nn.Module, offset: int, weight: torch.Tensor) -> None:
    """weight [n, K] into rows offset:offset+n of a fused linear, in place: the layer's own `load_rows_` (FP4Linear)
    or fused_sync.load_rows (FP8Linear: requantised into its slices; nn.Linear: copied)."""
    own = getattr(layer, "load_rows_", None)
    if own is not None:
        own(offset, weight)
    else:
        load_rows(layer, offset, weight)


def _sync_targets(rollout: FusedSDAR) -> tuple[list, list]:
    """What a sync writes: copies [(target tensor, master name)] and rows [(layer index, fused linear, first row,
    master name, master rows)] (fused_sync.SyncPlan's input)."""
    copies = [(rollout.embed_tokens.weight, "model.embed_tokens.weight"), (rollout.norm.weight, "model.norm.weight"),
              (rollout.lm_head.weight, "lm_head")]
    rows = []
    for i, layer in enumerate(rollout.layers):
        prefix = f"model.layers.{i}."
        copies += [(layer.input_layernorm.weight, f"{prefix}input_layernorm.weight"),
                   (layer.post_attention_layernorm.weight, f"{prefix}post_attention_layernorm.weight"),
                   (layer.q_norm.weight, f"{prefix}self_attn.q_norm.weight"),
                   (layer.k_norm.weight, f"{prefix}self_attn.k_norm.weight")]
        D = layer.head_dim
        n_rows = {"self_attn.q_proj": layer.n_heads * D, "self_attn.k_proj": layer.n_kv * D,
                  "self_attn.v_proj": layer.n_kv * D, "self_attn.o_proj": rollout.config.hidden_size,
                  "mlp.gate_proj": layer.h, "mlp.up_proj": layer.h, "mlp.down_proj": rollout.config.hidden_size}
        for fused in FUSED_PARTS:
            rows += [(i, getattr(layer, fused), offset, prefix + name, n_rows[name])
                     for name, offset in layer.part_offsets(fused)]
    return copies, rows


@torch.no_grad()
def sync_fused_sdar(master: nn.Module, rollout: FusedSDAR, gather=None, full=None) -> None:
    """Copy the master's current weights (LoRA merged) into the fused rollout copy, in place.

    Unsharded master: one pass (fp8/fused_sync.py SyncPlan, built on the first call and kept on the rollout: grouped
    copies, one grouped Triton requantisation where it runs). `gather(module)` / `full(tensor)` (FSDP2,
    dllm_ais/train/fsdp_sync.py): one master linear gathered at a time, `sync_per_tensor`."""
    if gather is not None or full is not None:
        sync_per_tensor(master, rollout, gather=gather, full=full)
        return
    sync_plan(master, rollout, _sync_targets, _load_rows).run()


@torch.no_grad()
def sync_per_tensor(master: nn.Module, rollout: FusedSDAR, gather=None, full=None) -> None:
    """sync_fused_sdar one tensor at a time (name maps built per call): the path of a sharded master, and the
    reference the one-pass sync is tested against. `gather(module)` makes one master layer whole while it is read,
    `full(tensor)` one sharded tensor; default: the master is unsharded."""
    gather = gather or contextlib.nullcontext
    full = full or (lambda t: t)
    peft_root = hasattr(master, "peft_config")
    layers = {canonical_name(n, peft_root): m for n, m in linear_layers(master).items()}
    tensors = {canonical_name(n, peft_root): t for n, t in named_tensors(master)}
    copies, rows = _sync_targets(rollout)
    for target, name in copies:
        if name in layers:
            with gather(layers[name]):
                source = effective_weight(layers[name])[0]
        else:
            source = full(tensors[name].detach())
        if source.shape != target.shape:
            raise KeyError(f"sync: master tensor {name!r} {tuple(source.shape)} does not fit {tuple(target.shape)}")
        target.copy_(source)
    for _, layer, offset, name, n_rows in rows:
        with gather(layers[name]):  # one master linear whole at a time
            weight, bias = effective_weight(layers[name])
            if bias is not None or weight.shape != (n_rows, layer.in_features):
                raise KeyError(f"sync: master linear {name!r} {tuple(weight.shape)} (bias {bias is not None}) does "
                               f"not fit {(n_rows, layer.in_features)} without bias")
            _load_rows(layer, offset, weight)


def _check_master(model: nn.Module) -> SDARModel:
    master = sdar_master(model)
    if master is None:
        raise TypeError(f"the fused SDAR copy needs an SDARModel (or a peft model around one), got {type(model)}")
    return master


@torch.no_grad()
def build_fused_sdar(model: nn.Module, backend: str | None, expected_m: int | None = None,
                     producers: str | None = None, make_linear: MakeLinear | None = None) -> FusedSDAR:
    """The fused rollout copy of a (peft-wrapped or plain) SDARModel, on its device, in eval mode, no grads.

    backend None = the BF16 copy in the master's dtype (or, with `make_linear`, the emulated FP4 copy); else an FP8
    backend ("auto" resolved here per fused layer shape for `expected_m` rows, linear.resolve_auto). `producers`
    "triton" | "torch" (default: default_producers(device))."""
    master = _check_master(model)
    weight = master.get_input_embeddings().weight
    if backend is not None:
        check_backend(backend, weight.device)
    rollout = FusedSDAR(master.config, backend, weight.device, weight.dtype, producers=producers,
                        make_linear=make_linear)
    sync_per_tensor(model, rollout)
    if backend == "auto":
        resolve_auto(rollout, expected_m, kind="gemm")
    if expected_m and backend is not None:
        prepare_gemm_shapes(rollout, [expected_m])
    rollout.requires_grad_(False)
    return rollout.eval()


def fp8_copy(model: nn.Module, backend: str, expected_m: int | None = None) -> FusedSDAR | None:
    """The family's fp8_copy hook: the fused FP8 copy of an SDAR master (plain or peft), None for any other model."""
    return None if sdar_master(model) is None else build_fused_sdar(model, backend, expected_m=expected_m)


def fp4_copy(model: nn.Module, make_linear: MakeLinear) -> FusedSDAR | None:
    """The family's fp4_copy hook: the fused emulated-FP4 copy (fp4/linear.py passes FP4Linear's `make_linear`),
    None for any other model."""
    return None if sdar_master(model) is None else build_fused_sdar(model, None, make_linear=make_linear)
