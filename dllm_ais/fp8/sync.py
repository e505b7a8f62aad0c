"""sync_weights: the BF16 master's current weights into a quantised rollout copy (FP8, FP4), in place.

After every optimizer step each QuantizedLinear of the copy is requantised from the master's layer of the same
canonical name (walker.py: LoRA merged on the fly, peft prefixes ignored) into its existing buffers, so the copy's
memory never moves. A family's fused copy (models/llada/fused_fp8.py, models/dream/fused_fp8.py) syncs itself: its
`sync_from(master, gather, full)` method.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from .linear import QuantizedLinear
from .walker import (
    canonical_name,
    effective_weight,
    is_linear,
    is_lora_layer,
    is_peft_root,
    linear_layers,
    named_tensors,
)


@torch.no_grad()
def sync_weights(master: nn.Module, rollout: nn.Module, gather: Callable | None = None,
                 full: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """Copy the BF16 master's current weights into the FP8 (or FP4) rollout copy, in place (no buffer is reallocated).

    Each QuantizedLinear (FP8Linear, FP4Linear) of `rollout` is requantised from the master's linear of the same
    canonical name (a LoRA layer is merged on the fly; the master is not modified); a plain linear of `rollout` whose
    master layer carries LoRA (e.g. a LoRA-adapted LM head) gets the merged weight; every other parameter and buffer
    of `rollout` (embeddings, norms, LM head, excluded linears) is copy_'d from the master tensor of the same
    canonical name. A fused LLaDA rollout copy (models/llada/fused_fp8.py) has each master tensor requantised into its
    slice of the fused buffers instead.

    `gather(module)` and `full(tensor)` serve a sharded master (FSDP2, dllm_ais/train/fsdp_sync.py): a context manager
    that makes one master layer's parameters whole while it is read, and the whole of one sharded tensor. Default: the
    master is not sharded.
    """
    sync_from = getattr(rollout, "sync_from", None)  # a family's fused copy (FusedLLaDA, FusedDream) syncs itself
    if sync_from is not None:
        sync_from(master, gather=gather, full=full)  # LLaDA, unsharded: its one-pass sync
        return
    gather = gather or contextlib.nullcontext
    full = full or (lambda t: t)
    master_peft, rollout_peft = is_peft_root(master), is_peft_root(rollout)
    master_layers = {canonical_name(n, master_peft): m for n, m in linear_layers(master).items()}
    fp8_layers = {n: m for n, m in rollout.named_modules() if isinstance(m, QuantizedLinear)}
    missing = [n for n in fp8_layers if canonical_name(n, rollout_peft) not in master_layers]
    if missing:
        raise KeyError(f"sync_weights: the master has no linear layer for these FP8 layers of the rollout: {missing}")
    for name, layer in fp8_layers.items():
        source = master_layers[canonical_name(name, rollout_peft)]
        with gather(source):
            layer.load_weight_(*effective_weight(source))
    done = list(fp8_layers)

    # a plain BF16 linear of the rollout (e.g. the LM head) whose master counterpart carries LoRA: copy the merge
    for name, module in linear_layers(rollout).items():
        source = master_layers.get(canonical_name(name, rollout_peft))
        if is_linear(module) and source is not None and is_lora_layer(source):
            with gather(source):
                weight, bias = effective_weight(source)
                module.weight.copy_(weight)
                if module.bias is not None:
                    module.bias.copy_(bias)
            done.append(name)

    # everything else (embeddings, norms, plain linears, a rollout's own LoRA adapters): by canonical name
    master_tensors = {canonical_name(n, master_peft): t for n, t in named_tensors(master)}
    done_prefixes = tuple(f"{n}." for n in done)
    for name, tensor in named_tensors(rollout):
        if name.startswith(done_prefixes):
            continue
        source = master_tensors.get(canonical_name(name, rollout_peft))
        if source is None or source.shape != tensor.shape:  # a DTensor's shape is the full (global) shape
            found = "nothing" if source is None else f"shape {tuple(source.shape)}"
            raise KeyError(
                f"sync_weights: rollout tensor {name!r} {tuple(tensor.shape)} has no master counterpart (found {found})"
            )
        tensor.copy_(full(source.detach()))
