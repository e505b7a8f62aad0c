"""Full (unsharded) checkpoints of an FSDP2-sharded master and its optimizer.

Under FSDP2 every parameter and every AdamW state tensor is a DTensor holding this rank's shard. A checkpoint holds
the full tensors, so it loads without FSDP and on any number of processes: every rank takes part in the gathers (one
tensor at a time, in the same order everywhere), the main process keeps the full tensors on the CPU and writes them.
Resuming scatters the full tensors back into each rank's shards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def _dtensor_params(module: nn.Module) -> Iterator[tuple[nn.Module, str, torch.Tensor]]:
    from torch.distributed.tensor import DTensor

    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if isinstance(p, DTensor):
                yield sub, name, p


def _shard_like(full: torch.Tensor, like) -> torch.Tensor:
    """The DTensor with `like`'s mesh and placements holding `full` (the same full tensor on every rank)."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(device=like.device, dtype=like.dtype), like.device_mesh, like.placements)


@contextlib.contextmanager
def full_on_main(module: nn.Module, is_main: bool) -> Iterator[nn.Module]:
    """Within the block, the main process's `module` holds full CPU copies of its sharded parameters (gathered one at a
    time; the other ranks gather and drop them), so that any saving code sees an ordinary model. Collective."""
    swapped = []
    try:
        for sub, name, p in _dtensor_params(module):
            full = p.detach().full_tensor()
            if is_main:
                swapped.append((sub, name, p))
                sub._parameters[name] = nn.Parameter(full.cpu(), requires_grad=False)
            del full
        yield module
    finally:
        for sub, name, p in swapped:
            sub._parameters[name] = p


@contextlib.contextmanager
def loading_full(module: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every rank's `module` holds full CPU tensors in place of its sharded parameters (their current
    values, gathered); whatever is loaded into them is scattered back into the shards on exit (every rank loads the
    same checkpoint). A checkpoint that holds only some parameters (a LoRA adapter) leaves the others as they were.
    Collective."""
    swapped = []
    for sub, name, p in _dtensor_params(module):
        swapped.append((sub, name, p))
        sub._parameters[name] = nn.Parameter(p.detach().full_tensor().cpu(), requires_grad=False)
    # FSDP2's load_state_dict post-hooks re-register the module's (expected: DTensor) parameters as its shards; the
    # shards are filled in place below instead, so the hooks are set aside while plain tensors stand in.
    hooks = {sub: sub._load_state_dict_post_hooks for sub in module.modules()}
    for sub in hooks:
        sub._load_state_dict_post_hooks = type(hooks[sub])()
    try:
        yield module
        with torch.no_grad():
            for sub, name, p in swapped:
                p.to_local().copy_(_shard_like(sub._parameters[name].detach(), p).to_local())
    finally:
        for sub, name, p in swapped:
            sub._parameters[name] = p
        for sub, h in hooks.items():
            sub._load_state_dict_post_hooks = h


def full_optimizer_state(optimizer: torch.optim.Optimizer, is_main: bool) -> dict | None:
    """The optimizer's state_dict with every DTensor state gathered to a full CPU tensor (on the main process; None
    elsewhere). Collective."""
    from torch.distributed.tensor import DTensor

    sd = optimizer.state_dict()
    state = {}
    for idx in sorted(sd["state"]):
        state[idx] = {}
        for key, value in sd["state"][idx].items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            state[idx][key] = full.cpu() if isinstance(full, torch.Tensor) else full
    return {"state": state, "param_groups": sd["param_groups"]} if is_main else None


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, full: dict) -> None:
    """Load what full_optimizer_state returned into an optimizer over sharded parameters (every rank)."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for idx, values in full["state"].items():
        p = params[int(idx)]
        state[idx] = {k: _shard_like(v, p) if isinstance(p, DTensor) and isinstance(v, torch.Tensor)
                      and v.shape == p.shape else v for k, v in values.items()}
    optimizer.load_state_dict({"state": state, "param_groups": full["param_groups"]})
