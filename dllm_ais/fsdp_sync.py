"""FP8 rollout sync from an FSDP-sharded master: gather one layer's full weight at a time, requantise, free it.

Under FSDP2 (`fully_shard`, accelerate's `fsdp_version: 2`) every master parameter is a DTensor holding this rank's
shard. The FP8 rollout copy is a full (unsharded) model on every rank, so each of its layers needs the master's full
weight: `gathered(layer)` swaps the layer's DTensor parameters for their `full_tensor()` (an all-gather) for the
duration of one requantisation, so the peak extra memory is one layer's weight, never the whole model. Every rank
takes part in every gather (same layer order everywhere) and ends with the same rollout copy.

The per-layer work is `sync_weights`' (dllm_ais/fp8/linear.py): LoRA merged on the fly, FP8 layers requantised in
place, every other tensor copied by canonical name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from dllm_ais.fp8.linear import (
    QuantizedLinear,
    _is_linear,
    _is_lora_layer,
    _is_peft_root,
    _linear_layers,
    _named_tensors,
    canonical_name,
    effective_weight,
)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: `DTensor.full_tensor()` (a collective) for a sharded one, `t` itself otherwise."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


@contextlib.contextmanager
def gathered(module: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every DTensor parameter of `module` (recursively) is replaced by its full tensor (detached);
    the sharded parameters are put back on exit. Collective: call it on every rank in the same order."""
    from torch.distributed.tensor import DTensor

    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    try:
        for sub in module.modules():
            for name, p in list(sub._parameters.items()):
                if isinstance(p, DTensor):
                    swapped.append((sub, name, p))
                    sub._parameters[name] = nn.Parameter(p.detach().full_tensor(), requires_grad=False)
        yield module
    finally:
        for sub, name, p in swapped:
            sub._parameters[name] = p


@torch.no_grad()
def sync_weights_sharded(master: nn.Module, rollout: nn.Module) -> None:
    """`sync_weights(master, rollout)` for a master whose parameters are DTensor shards, one layer at a time.

    FP8 layers: gather the master layer (weight, bias, LoRA factors), requantise into the rollout buffers in place,
    drop the gathered copy. Plain rollout linears whose master carries LoRA: the merged weight, gathered the same way.
    Every other rollout tensor (embeddings, norms, LM head): the master tensor of the same canonical name, gathered
    one tensor at a time.
    """
    from dllm_ais.fp8.fused_llada import FusedLLaDA, sync_fused_llada

    if isinstance(rollout, FusedLLaDA):  # the fused LLaDA copy: each master tensor into its slice, gathered one by one
        sync_fused_llada(master, rollout, gather=gathered, full=full_tensor)
        return
    master_peft, rollout_peft = _is_peft_root(master), _is_peft_root(rollout)
    master_layers = {canonical_name(n, master_peft): m for n, m in _linear_layers(master).items()}
    done: list[str] = []
    for name, layer in rollout.named_modules():
        if not isinstance(layer, QuantizedLinear):
            continue
        source = master_layers.get(canonical_name(name, rollout_peft))
        if source is None:
            raise KeyError(f"sync_weights_sharded: the master has no linear layer for the FP8 layer {name!r}")
        with gathered(source):
            layer.load_weight_(*effective_weight(source))
        done.append(name)

    for name, module in _linear_layers(rollout).items():
        source = master_layers.get(canonical_name(name, rollout_peft))
        if _is_linear(module) and source is not None and _is_lora_layer(source):
            with gathered(source):
                weight, bias = effective_weight(source)
                module.weight.copy_(weight)
                if module.bias is not None:
                    module.bias.copy_(bias)
            done.append(name)

    master_tensors = {canonical_name(n, master_peft): t for n, t in _named_tensors(master)}
    done_prefixes = tuple(f"{n}." for n in done)
    for name, tensor in _named_tensors(rollout):
        if name.startswith(done_prefixes):
            continue
        source = master_tensors.get(canonical_name(name, rollout_peft))
        if source is None or source.shape != tensor.shape:  # a DTensor's shape is the full (global) shape
            found = "nothing" if source is None else f"shape {tuple(source.shape)}"
            raise KeyError(f"sync_weights_sharded: rollout tensor {name!r} {tuple(tensor.shape)} has no master "
                           f"counterpart (found {found})")
        tensor.copy_(full_tensor(source.detach()))
