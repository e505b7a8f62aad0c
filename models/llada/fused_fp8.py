"""The rollout copy of a LLaDA model, built for inference: fused QKV and gate-up weights, producers that emit FP8.

Per block the copy holds four linears instead of seven:
  qkv      [3·d', d]  q_proj, k_proj, v_proj stacked        (d' = d rounded up to a multiple of `pad`)
  attn_out [d, d]
  gate_up  [2·h', d]  ff_proj (gate), up_proj stacked        (h' = h rounded up likewise)
  ff_out   [d, h]
so each block input is normalised and quantised once for all its consumers. `pad` is 128 for FP8 (the weight
block edge) and 1 for BF16. Padding each part to whole 128-row blocks, rather than keeping a per-part block grid, keeps
the fused weight an ordinary blockwise-quantised FP8Linear that every GEMM backend takes unchanged, and makes each
part's codes and scales exactly a fresh quantisation of its master tensor (no 128×128 block straddles two parts);
the padding rows hold zero codes (scale 1), cost nothing for LLaDA-8B (4096, 12288 are multiples of 128) and only
ragged test shapes pay a few extra output columns, which the forward never reads.

FP8 forward of a block (every FP8 backend; producers = the Triton kernels on CUDA whatever the GEMM backend, their
torch twins on CPU unless asked for — producer_kernels.py / producers.py; each emits the scales in the layout its
GEMM reads, so no pad / copy / layout change sits between producer and GEMM):
  rmsnorm_quant(x) -> qkv GEMM -> rope(q), rope(k) (no cat) -> SDPA -> attn_out_quant -> attn_out GEMM -> + x
  rmsnorm_quant(x) -> gate_up GEMM -> silu_mul_quant -> ff_out GEMM -> + x
The BF16 copy runs the same fused structure on bf16 producer outputs; the row-wise scaled_mm backend gets producers
that quantise per row (row_producer_kernels.py / producers.*_rowquant).

Weights: `build_fused_llada(master, backend)` and `sync_fused_llada(master, rollout)`; the master (plain or
peft-wrapped LLaDAModelLM, LoRA merged on the fly as walker.effective_weight does) keeps the official names, the copy
writes each master tensor into its row slice of the fused buffer in place (no reallocation, data_ptr unchanged).
Embeddings, norms and the LM head stay in the master's dtype.

Numerics: with the torch backend the fused copy computes what the unfused FP8 copy computes (same ops on the same
codes; only the fp32 GEMM over the wider fused weight may sum in another order). The Triton GEMM returns bf16, so an
fp32 master's fused copy on triton rounds GEMM outputs to bf16 where the unfused copy kept fp32 (fp32 masters are a CPU
test setting; LLaDA-8B runs in bf16, where the two agree).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from dllm_ais.fp8 import producers
from dllm_ais.fp8.backends import check_backend, default_producers, prepare_gemm_shapes
from dllm_ais.fp8.fused_copy import FusedCopy, forward_variant
from dllm_ais.fp8.fused_sync import load_rows, round_up
from dllm_ais.fp8.linear import FP8Linear, resolve_auto
from dllm_ais.fp8.quant import BLOCK
from dllm_ais.fp8.walker import canonical_name, effective_weight, linear_layers, named_tensors
from dllm_ais.models.kv_cache import KVCache, attend, window_index, window_rope_positions
from dllm_ais.models.llada.model import LLaDAConfig, LLaDAModelLM, LLaDAOutput, RMSNorm

FUSED_PARTS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "attn_out": ("attn_out",),
    "gate_up": ("ff_proj", "up_proj"),
    "ff_out": ("ff_out",),
}
"""Fused linear of a rollout block -> the master block's linears stacked in it (official names), in order."""


class FusedLLaDABlock(nn.Module):
    """One LLaDA block with fused qkv / gate_up linears (FP8Linear, or nn.Linear for the BF16 copy)."""

    def __init__(self, config: LLaDAConfig, backend: str | None, device, dtype: torch.dtype):
        super().__init__()
        d, h = config.d_model, config.mlp_hidden_size
        self.n_heads, self.d, self.h = config.n_heads, d, h
        self.pad = BLOCK if backend is not None else 1
        self.dp, self.hp = round_up(d, self.pad), round_up(h, self.pad)
        self.attn_norm = RMSNorm(d, config.rms_norm_eps).to(device=device, dtype=dtype)
        self.ff_norm = RMSNorm(d, config.rms_norm_eps).to(device=device, dtype=dtype)
        shapes = {"qkv": (d, 3 * self.dp), "attn_out": (d, d), "gate_up": (d, 2 * self.hp), "ff_out": (h, d)}
        for name, (k, n) in shapes.items():
            if backend is None:
                layer = nn.Linear(k, n, bias=False, device=device, dtype=dtype)
                nn.init.zeros_(layer.weight)  # padding rows (none at pad 1) and a defined start
            else:
                layer = FP8Linear(k, n, backend=backend, device=device, name=name)
            setattr(self, name, layer)

    def part_offsets(self, fused: str) -> list[tuple[str, int]]:
        """(official linear name, first row in the fused weight) for each part of `fused`."""
        size = {"qkv": self.dp, "gate_up": self.hp}.get(fused, 0)
        return [(name, i * size) for i, name in enumerate(FUSED_PARTS[fused])]


def _block_fp8_producers(blk: FusedLLaDABlock, impl, x, cos, sin, attn_bias, kv=None, index=None):
    """FP8 block whose producers emit codes + scales. x [B, T, d] -> [B, T, d]."""
    B, T, d = x.shape
    dtype = x.dtype
    x2 = x.reshape(B * T, d)
    qkv = blk.qkv.forward_quantized(*impl.rmsnorm_quant(x2, blk.attn_norm.weight, blk.attn_norm.eps), dtype)
    q, k, v = (qkv[:, i * blk.dp:i * blk.dp + d].view(B, T, blk.n_heads, -1) for i in range(3))  # [B, T, H, D] views
    q, k = impl.rope(q, cos, sin), impl.rope(k, cos, sin)  # [B, H, T, D]
    att = attend(q, k, v.transpose(1, 2), attn_bias, kv, index)  # kv: this layer's KV cache or None
    x2 = x2 + blk.attn_out.forward_quantized(*impl.attn_out_quant(att), dtype)
    gu = blk.gate_up.forward_quantized(*impl.rmsnorm_quant(x2, blk.ff_norm.weight, blk.ff_norm.eps), dtype)
    mq, ms = impl.silu_mul_quant(gu[:, :blk.h], gu[:, blk.hp:blk.hp + blk.h])
    x2 = x2 + blk.ff_out.forward_quantized(mq, ms, dtype)
    return x2.view(B, T, d)


def _block_plain(blk: FusedLLaDABlock, impl, x, cos, sin, attn_bias, kv=None, index=None):
    """Fused block on bf16 producer outputs (the BF16 copy; FP8 backends that quantise for themselves)."""
    B, T, d = x.shape
    x2 = x.reshape(B * T, d)
    qkv = blk.qkv(producers.rms_norm(x2, blk.attn_norm.weight, blk.attn_norm.eps))  # [B·T, 3·d']
    q, k, v = (qkv[:, i * blk.dp:i * blk.dp + d].view(B, T, blk.n_heads, -1) for i in range(3))
    q, k = producers.apply_rope(q, cos, sin), producers.apply_rope(k, cos, sin)
    att = attend(q, k, v.transpose(1, 2), attn_bias, kv, index)  # kv: this layer's KV cache or None
    x2 = x2 + blk.attn_out(producers.attn_merge(att))
    gu = blk.gate_up(producers.rms_norm(x2, blk.ff_norm.weight, blk.ff_norm.eps))  # [B·T, 2·h']
    x2 = x2 + blk.ff_out(producers.silu_mul(gu[:, :blk.h], gu[:, blk.hp:blk.hp + blk.h]))
    return x2.view(B, T, d)


BLOCK_FORWARDS = {"fp8_producers": _block_fp8_producers, "plain": _block_plain}


class FusedLLaDA(FusedCopy):
    """Inference-only rollout copy of an LLaDAModelLM: forward(input_ids, attention_mask, positions) -> .logits,
    as the master's. `backend` None = the BF16 copy (master dtype), else an FP8 backend name."""

    input_embeddings_name = "wte"

    def __init__(self, config: LLaDAConfig, backend: str | None, device, dtype: torch.dtype,
                 producers: str | None = None):
        super().__init__()
        self.config, self.backend = config, backend
        self.producers = producers or default_producers(device)
        """"triton" | "torch": the producer implementation of the FP8 forward (default_producers(device))."""
        self.wte = nn.Embedding(config.embedding_size, config.d_model, device=device, dtype=dtype)
        self.blocks = nn.ModuleList(FusedLLaDABlock(config, backend, device, dtype) for _ in range(config.n_layers))
        self.ln_f = RMSNorm(config.d_model, config.rms_norm_eps).to(device=device, dtype=dtype)
        self.lm_head = nn.Linear(config.d_model, config.embedding_size, bias=False, device=device, dtype=dtype)
        self.variant, self._impl = forward_variant(backend, self.producers)

    def sync_from(self, master: nn.Module, gather=None, full=None) -> None:
        """Refill this copy from the master in place (fp8/sync.py `sync_weights` calls it): `sync_fused_llada`."""
        sync_fused_llada(master, self, gather=gather, full=full)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | slice | None = None, kv_cache: KVCache | None = None,
                window_start: int | torch.Tensor = 0, **kwargs) -> LLaDAOutput:
        """input_ids [B, T], attention_mask [B, T] (1 = real token), positions, kv_cache and window_start as
        LLaDAModelLM's -> logits [B, P, V]."""
        x = self.wte(input_ids)  # [B, T, d]
        index = None
        if kv_cache is not None:  # input_ids: the window [s, s + Tw) of the canvas (models/kv_cache.py)
            index = window_index(window_start, input_ids.shape[1], input_ids.device)  # [Tw]
            pos = window_rope_positions(attention_mask, index, input_ids.shape[0])
            attn_bias = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # [B, 1, 1, T]
        elif attention_mask is None:
            pos = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
            attn_bias = None
        else:
            keep = attention_mask.bool()
            pos = (keep.long().cumsum(-1) - 1).clamp(min=0)  # real tokens only: left padding keeps RoPE phases
            attn_bias = keep[:, None, None, :]  # [B, 1, 1, T]
        cos, sin = producers.rope_tables(pos, self.config.head_dim, self.config.rope_theta)  # [B, T, D/2]
        block_forward = BLOCK_FORWARDS[self.variant]
        for i, block in enumerate(self.blocks):
            kv = None if kv_cache is None else kv_cache.layer(i)
            x = block_forward(block, self._impl, x, cos, sin, attn_bias, kv, index)
        if positions is not None:
            x = x[:, positions] if isinstance(positions, slice) else x.gather(
                1, positions[..., None].expand(-1, -1, x.shape[-1]))
        return LLaDAOutput(logits=self.lm_head(self.ln_f(x)))  # [B, P, V]


# ----------------------------------------------------------------------------------------------------------------------
# building and syncing


def llada_master(model: nn.Module) -> LLaDAModelLM | None:
    """The LLaDAModelLM inside `model` (itself, or under a peft wrapper), or None."""
    base = model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model
    return base if isinstance(base, LLaDAModelLM) else None


def _sync_targets(rollout: FusedLLaDA) -> tuple[list, list]:
    """What a sync writes: copies [(target tensor, master name)] and rows [(block index, fused layer, first row,
    master name, master rows)] (fused_sync.SyncPlan's input; built once per plan)."""
    t = "model.transformer."
    copies = [(rollout.wte.weight, f"{t}wte.weight"), (rollout.ln_f.weight, f"{t}ln_f.weight"),
              (rollout.lm_head.weight, f"{t}ff_out")]  # fmt: skip
    rows = []
    for i, block in enumerate(rollout.blocks):
        prefix = f"{t}blocks.{i}."
        copies += [(block.attn_norm.weight, f"{prefix}attn_norm.weight"),
                   (block.ff_norm.weight, f"{prefix}ff_norm.weight")]  # fmt: skip
        n_rows = {"q_proj": block.d, "k_proj": block.d, "v_proj": block.d, "attn_out": block.d, "ff_proj": block.h,
                  "up_proj": block.h, "ff_out": block.d}  # fmt: skip
        for fused in FUSED_PARTS:
            rows += [(i, getattr(block, fused), offset, prefix + name, n_rows[name])
                     for name, offset in block.part_offsets(fused)]  # fmt: skip
    return copies, rows


@torch.no_grad()
def sync_fused_llada(master: nn.Module, rollout: FusedLLaDA, gather=None, full=None) -> None:
    """Copy the master's current weights (LoRA merged) into the fused rollout copy, in place.

    Unsharded master: one pass (fused_sync.SyncPlan, built on the first call and kept on the rollout): the embedding,
    norms and LM head in one grouped copy, every block weight requantised by one grouped Triton launch where the
    Triton kernels run (a LoRA master: one launch per block, so at most one block's merged weights exist at a time).
    `gather(module)` / `full(tensor)` (FSDP2, dllm_ais/train/fsdp_sync.py): a context manager that makes one master
    layer's sharded parameters whole while it is read, and the whole of one sharded tensor: then `sync_per_tensor`.
    """
    if gather is not None or full is not None:
        sync_per_tensor(master, rollout, gather=gather, full=full)
        return
    from dllm_ais.fp8.fused_sync import sync_plan

    sync_plan(master, rollout, _sync_targets, load_rows).run()


@torch.no_grad()
def sync_per_tensor(master: nn.Module, rollout: FusedLLaDA, gather=None, full=None) -> None:
    """sync_fused_llada one tensor at a time, name maps built per call: the path of a sharded master (FSDP2), and
    the reference the one-pass sync is tested and benchmarked against.

    `gather(module)` / `full(tensor)` (FSDP2, dllm_ais/train/fsdp_sync.py): a context manager that makes one master
    layer's sharded parameters whole while it is read, and the whole of one sharded tensor; default: the master is
    unsharded.
    """
    gather = gather or contextlib.nullcontext
    full = full or (lambda t: t)
    peft_root = hasattr(master, "peft_config")
    layers = {canonical_name(n, peft_root): m for n, m in linear_layers(master).items()}
    tensors = {canonical_name(n, peft_root): t for n, t in named_tensors(master)}

    def load(name: str, write) -> None:
        """write(the master's current weight called `name`), one layer gathered at a time."""
        if name not in layers:
            write(full(tensors[name].detach()))
            return
        with gather(layers[name]):
            weight, bias = effective_weight(layers[name])
            if bias is not None:
                raise ValueError(f"{name} has a bias; LLaDA's linears have none")
            write(weight)

    def copy(target: torch.Tensor, name: str) -> None:
        def write(source: torch.Tensor) -> None:
            if source.shape != target.shape:
                raise KeyError(f"sync: master tensor {name!r} {tuple(source.shape)} does not fit {tuple(target.shape)}")
            target.copy_(source)

        load(name, write)

    t = "model.transformer."
    copy(rollout.wte.weight, f"{t}wte.weight")
    copy(rollout.ln_f.weight, f"{t}ln_f.weight")
    copy(rollout.lm_head.weight, f"{t}ff_out")
    for i, block in enumerate(rollout.blocks):
        prefix = f"{t}blocks.{i}."
        copy(block.attn_norm.weight, f"{prefix}attn_norm.weight")
        copy(block.ff_norm.weight, f"{prefix}ff_norm.weight")
        for fused in FUSED_PARTS:
            target = getattr(block, fused)
            for name, offset in block.part_offsets(fused):
                load(prefix + name, lambda w, target=target, offset=offset: load_rows(target, offset, w))


@torch.no_grad()
def build_fused_llada(model: nn.Module, backend: str | None, expected_m: int | None = None,
                      producers: str | None = None) -> FusedLLaDA:
    """The fused rollout copy of a (peft-wrapped or plain) LLaDAModelLM, on its device, in eval mode, no grads.

    backend None = BF16 copy in the master's dtype; else an FP8 backend that runs on that device. "auto" is resolved
    here, per fused layer shape, by timing the GEMMs for `expected_m` rows (batch × canvas length; see
    linear.resolve_auto), so every layer of the returned copy runs a concrete backend. `producers` "triton" | "torch"
    (default: default_producers(device), Triton on CUDA with every backend)."""
    master = llada_master(model)
    if master is None:
        raise TypeError(f"build_fused_llada needs an LLaDAModelLM (or a peft model around one), got {type(model)}")
    weight = master.get_input_embeddings().weight
    if backend is not None:
        check_backend(backend, weight.device)
    rollout = FusedLLaDA(master.config, backend, weight.device, weight.dtype, producers=producers)
    sync_fused_llada(model, rollout)
    if backend == "auto":
        resolve_auto(rollout, expected_m, kind="gemm")
    if expected_m:  # cuBLAS's acceptance of the expected row count, decided now and recorded on each layer
        prepare_gemm_shapes(rollout, [expected_m])
    rollout.requires_grad_(False)
    return rollout.eval()


def fp8_copy(model: nn.Module, backend: str, expected_m: int | None = None) -> FusedLLaDA | None:
    """The family's fp8_copy hook: the fused FP8 copy of an LLaDA master (plain or peft), None for any other model."""
    return None if llada_master(model) is None else build_fused_llada(model, backend, expected_m=expected_m)


def bf16_copy(model: nn.Module) -> FusedLLaDA:
    """The family's bf16_sampling_copy hook: the fused BF16 inference copy (same numbers, fewer kernels)."""
    return build_fused_llada(model, None)
