"""Measure memory honestly on any device (CPU, meta): the bytes of every tensor storage alive, op by op.

`LiveBytes` is a TorchDispatchMode: every tensor an op returns while it is active is tracked by a weak reference to
its storage (`StorageWeakRef`: the C++ storage, so a tensor autograd keeps for backward counts as long as autograd
holds it, even when no Python object refers to it). Tensors made before the mode (parameters, inputs) are counted
once `track`ed. After each op the storages that died are dropped, so `peak` is the largest total of live storage bytes
seen at any op's end (an op's inputs and outputs are both alive then), and `now` the current total.

Used by the plan's tests as the measurement its predictions are checked against (tiny model on CPU; one LLaDA-8B
block on the meta device, where storages have sizes but no data).
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Live tensor storage bytes: `now`, `peak` (since the last `reset_peak`)."""

    def __init__(self, *tensors: torch.Tensor):
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}  # storage address -> (weak ref, bytes)
        self.now = 0
        self.peak = 0
        self.track(*tensors)

    def track(self, *tensors) -> None:
        """Count these tensors' storages (each storage once, however many tensors view it)."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self._live:
                    self._live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)

    def sweep(self) -> None:
        """Drop the storages that have been freed."""
        dead = [k for k, (ref, _) in self._live.items() if ref.expired()]
        for k in dead:
            self.now -= self._live.pop(k)[1]

    def reset_peak(self) -> None:
        self.sweep()
        self.peak = self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sweep()
        self.track(out)
        return out
