"""FP8 rollout sync from an FSDP-sharded master: gather one layer's full weight at a time, requantise, free it.

Under FSDP2 (`fully_shard`, accelerate's `fsdp_version: 2`) every master parameter is a DTensor holding this rank's
shard. The FP8 rollout copy is a full (unsharded) model on every rank, so each of its layers needs the master's full
weight: `gathered(layer)` swaps the layer's DTensor parameters for their `full_tensor()` (an all-gather) for the
duration of one requantisation, so the peak extra memory is one layer's weight, never the whole model. Every rank
takes part in every gather (same layer order everywhere) and ends with the same rollout copy.

The per-layer work is `sync_weights`' (dllm_ais/fp8/sync.py): LoRA merged on the fly, FP8 layers requantised in
place, every other tensor copied by canonical name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from dllm_ais.fp8.sync import sync_weights


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


def sync_weights_sharded(master: nn.Module, rollout: nn.Module) -> None:
    """`sync_weights(master, rollout)` for a master whose parameters are DTensor shards, one layer at a time: each
    master layer (weight, bias, LoRA factors) is gathered while it is requantised into the rollout buffers (or its
    merged weight copied into a plain rollout linear) and dropped after; every other rollout tensor (embeddings, norms,
    LM head) is gathered one tensor at a time. The fused LLaDA copy is filled slice by slice the same way."""
    sync_weights(master, rollout, gather=gathered, full=full_tensor)
