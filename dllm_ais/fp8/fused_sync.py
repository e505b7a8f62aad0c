"""The one-pass weight sync of a fused rollout copy (models/llada/fused_fp8.py): master -> rollout after every optimizer
step, with everything that does not change between steps worked out once.

A SyncPlan is built on the first sync of a (master, rollout) pair and kept (weakly, per rollout):
  * the name maps (canonical master names -> modules / tensors), resolved once into direct references;
  * `copies`: the tensors copied as they are (embedding, norms, LM head): one torch._foreach_copy_ per sync (a few
    multi-tensor launches on CUDA instead of one copy_ per tensor);
  * `groups`: the block weights, each requantised into its row slice of a fused FP8 buffer. Where the Triton kernels
    run and the copy is block-scaled, each group is ONE launch of grouped_quant.GroupedWeightQuant: all 224 weights
    of LLaDA-8B in one group, or — for a LoRA master, whose merged weights are fresh tensors — one group per block,
    so at most one block's merged weights exist at a time. Otherwise (BF16 copy, row scheme, CPU without the
    interpreter) each weight goes through `load_rows` as before (GROUPED_DEVICES).
Numbers are exactly those of the per-tensor sync (the fused copy's sync_per_tensor): tests/test_fp8_fused_sync.py.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn

from . import backends
from .linear import QUANTIZE_INTO, FP8Linear
from .quant import BLOCK, num_blocks
from .walker import canonical_name, effective_weight, is_lora_layer, linear_layers, named_tensors

_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # rollout -> SyncPlan
def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n (fused buffers pad each part to whole 128-row blocks)."""
    return -(-n // multiple) * multiple


@torch.no_grad()
def load_rows(layer: nn.Module, offset: int, weight: torch.Tensor) -> None:
    """Write weight [n, K] into rows offset:offset+n of a fused linear, in place (FP8: requantised into the slices of
    the codes and scales, which is a fresh quantisation because offset is a multiple of 128)."""
    n = weight.shape[0]
    if not isinstance(layer, FP8Linear):
        layer.weight[offset:offset + n].copy_(weight)
        return
    if layer.scheme == "block":
        scales = layer.weight_scale[offset // BLOCK:round_up(offset + n, BLOCK) // BLOCK]
    else:
        scales = layer.weight_scale[offset:offset + n]
    QUANTIZE_INTO[layer.scheme](weight.detach().to(layer.weight_q.device), layer.weight_q[offset:offset + n],
                                scales)


GROUPED_DEVICES = {"cuda"}
"""Device types whose syncs use the grouped Triton quantiser (CPU runs it only under the interpreter, slowly: tests
add "cpu"; the per-tensor CPU path is the torch reference, bit-identical)."""


def _source(master_layers: dict, master_tensors: dict, name: str, shape: tuple) -> Callable[[], torch.Tensor]:
    """A zero-argument getter of the master's current tensor `name` (a linear: its weight with LoRA merged)."""
    if name in master_layers:
        layer = master_layers[name]
        if effective_weight(layer)[1] is not None:
            raise ValueError(f"{name} has a bias; LLaDA's linears have none")
        weight = effective_weight(layer)[0]
        if tuple(weight.shape) != shape:
            raise KeyError(f"sync: master tensor {name!r} {tuple(weight.shape)} does not fit {shape}")
        if not is_lora_layer(layer):  # the parameter itself (the sync runs under no_grad: no detach dispatch)
            return lambda: layer.weight
        return lambda: effective_weight(layer)[0]
    if name not in master_tensors:
        raise KeyError(f"sync: the master has no tensor {name!r}")
    tensor = master_tensors[name]
    if tuple(tensor.shape) != shape:
        raise KeyError(f"sync: master tensor {name!r} {tuple(tensor.shape)} does not fit {shape}")
    return lambda: tensor


def _grouped_ok(layer: nn.Module) -> bool:
    """The grouped Triton quantiser can write this fused layer's buffers."""
    return (isinstance(layer, FP8Linear) and layer.scheme == "block" and layer.in_features % 16 == 0
            and layer.weight_q.device.type in GROUPED_DEVICES
            and backends._unavailable("triton", layer.weight_q.device) is None)  # fmt: skip


class SyncPlan:
    """What one sync of `master` into a fused rollout does, resolved once. `copies`: [(target tensor, master name)];
    `rows`: [(block index, fused layer, first row, master name, master rows)]; `load_rows(layer, offset, weight)`
    writes one weight the per-tensor way (load_rows)."""

    def __init__(self, master: nn.Module, copies: list, rows: list, load_rows: Callable):
        peft_root = hasattr(master, "peft_config")
        layers = {canonical_name(n, peft_root): m for n, m in linear_layers(master).items()}
        tensors = {canonical_name(n, peft_root): t for n, t in named_tensors(master)}
        self.master, self.load_rows = master, load_rows
        self.copy_targets = [t for t, _ in copies]
        self.copy_sources = [_source(layers, tensors, n, tuple(t.shape)) for t, n in copies]
        lora = any(is_lora_layer(layers[r[3]]) for r in rows if r[3] in layers)
        self.groups: list[tuple[Callable | None, list]] = []  # (grouped_quant.GroupedWeightQuant | None, items)
        by_group: dict[int, list] = {}
        for block, layer, offset, name, n_rows in rows:
            src = _source(layers, tensors, name, (n_rows, layer.in_features))
            by_group.setdefault(block if lora else 0, []).append((layer, offset, n_rows, src))
        for items in by_group.values():
            fast = [it for it in items if _grouped_ok(it[0])]
            slow = [it for it in items if not _grouped_ok(it[0])]
            if fast:  # Triton runs on this device (imported only here: `import dllm_ais.fp8` stays light)
                from .grouped_quant import GroupedWeightQuant

                codes, scales = [], []
                for layer, offset, n, _ in fast:
                    codes.append(layer.weight_q[offset:offset + n])
                    scales.append(layer.weight_scale[offset // BLOCK:offset // BLOCK + num_blocks(n)])
                self.groups.append((GroupedWeightQuant(codes, scales), fast))
            if slow:
                self.groups.append((None, slow))

    @torch.no_grad()
    def run(self) -> None:
        """One sync: the copies, then each group (one launch, or one write per weight)."""
        if self.copy_targets:
            torch._foreach_copy_(self.copy_targets, [get() for get in self.copy_sources])
        for group, items in self.groups:
            if group is not None:
                sources = [src() for *_, src in items]
                device = items[0][0].weight_q.device
                group([w if w.device == device else w.to(device) for w in sources])
                continue
            for layer, offset, _, src in items:
                self.load_rows(layer, offset, src())


def sync_plan(master: nn.Module, rollout: nn.Module, targets: Callable, load_rows: Callable) -> SyncPlan:
    """The cached SyncPlan of (master, rollout), built now (from `targets(rollout)` -> copies, rows) if there is none
    for this master."""
    plan = _PLANS.get(rollout)
    if plan is None or plan.master is not master:
        plan = SyncPlan(master, *targets(rollout), load_rows)
        _PLANS[rollout] = plan
    return plan
