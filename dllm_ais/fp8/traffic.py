"""Bytes moved by the elementwise work around the GEMMs of one rollout layer, counted on meta tensors (no GPU).

`layer_traffic(backend)` runs ONE eager block of the fused LLaDA rollout copy (models/llada/fused_fp8.py) at a given
shape on meta tensors under a TorchDispatchMode that charges every op its inputs + outputs (bytes of each tensor
argument and result as the op sees it: a view is charged its own elements, not its storage). Not charged:
  * GEMMs: aten mm / addmm / bmm / _scaled_mm and everything inside a backend's `gemm` (the torch reference's
    dequantisation, the Triton / torchao GEMM ops): the GEMM itself is not elementwise traffic;
  * attention: everything inside F.scaled_dot_product_attention (identical in every copy);
  * views and allocations (view, transpose, slice, empty …): they move no data.
A custom op (the Triton producers, the activation quantiser) is one op, charged its inputs + outputs through its fake
implementation, as the kernel reads and writes them once. This is a proxy for eager memory traffic at the bandwidth
floor (DESIGN.md §7): what the layer's non-GEMM kernels must read and write, not what they take.

backend None = the fused BF16 copy; an FP8 backend with producers "triton" = the copy as it runs on CUDA (the
default there), "torch" = as on CPU. The Triton producer ops are the custom_op registrations the interpreter uses
(TRITON_INTERPRET=1 must be set before dllm_ais.fp8.kernels is first imported; scripts/fp8_traffic.py does).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import backends

LLADA_8B = dict(d_model=4096, n_heads=32, mlp_hidden_size=12288)
"""LLaDA-8B's layer shape (DESIGN.md §6)."""

_GEMM_OPS = {"mm", "addmm", "bmm", "_scaled_mm", "baddbmm"}
_FREE_OPS = {  # views and allocations: no data moved
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "slice", "select", "expand", "as_strided",
    "unsqueeze", "squeeze", "alias", "detach", "split", "split_with_sizes", "unbind", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "_reshape_alias", "view_as",
}


class TrafficCounter(TorchDispatchMode):
    """Charges each op (outside GEMM / attention regions) the bytes of its tensor inputs and outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.excluded_depth = 0

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        self.excluded_depth += 1
        try:
            yield
        finally:
            self.excluded_depth -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if self.excluded_depth or name in _FREE_OPS or name in _GEMM_OPS:
            return out
        tensors = [t for t in tree_flatten((args, kwargs or {}, out))[0] if isinstance(t, torch.Tensor)]
        key = f"{func.namespace}::{name}"
        self.by_op[key] += sum(t.numel() * t.element_size() for t in tensors)
        self.calls[key] += 1
        return out

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


@contextlib.contextmanager
def _regions_excluded(counter: TrafficCounter) -> Iterator[None]:
    """Every backend's gemm and SDPA run inside counter.excluded() while this is active."""

    def excluding(fn):
        def wrapped(*args, **kwargs):
            with counter.excluded():
                return fn(*args, **kwargs)

        return wrapped

    saved_backends, saved_sdpa = dict(backends.BACKENDS), F.scaled_dot_product_attention
    try:
        for name, b in saved_backends.items():
            if b.gemm is not None:
                backends.BACKENDS[name] = dataclasses.replace(b, gemm=excluding(b.gemm))
        F.scaled_dot_product_attention = excluding(saved_sdpa)
        yield
    finally:
        backends.BACKENDS.update(saved_backends)
        F.scaled_dot_product_attention = saved_sdpa


def layer_traffic(backend: str | None, producers: str = "triton", batch: int = 32, seq: int = 320,
                  dtype: torch.dtype = torch.bfloat16, **shape) -> TrafficCounter:
    """Count one eager block of the fused rollout copy (backend None = BF16) at x [batch, seq, d]; `shape` overrides
    LLADA_8B (d_model, n_heads, mlp_hidden_size). Returns the counter (by_op bytes, calls, total)."""
    from dllm_ais.models.llada import fused_fp8 as fused_llada
    from dllm_ais.models.llada.model import LLaDAConfig

    from . import producers as torch_producers

    config = LLaDAConfig(**{**LLADA_8B, **shape}, n_layers=1)  # meta: the embedding and head cost nothing
    model = fused_llada.FusedLLaDA(config, backend, "meta", dtype, producers=producers)
    block = model.blocks[0]
    x = torch.empty(batch, seq, config.d_model, device="meta", dtype=dtype)
    pos = torch.empty(batch, seq, device="meta", dtype=torch.long)
    cos, sin = torch_producers.rope_tables(pos, config.head_dim, config.rope_theta)  # per forward, not per layer
    counter = TrafficCounter()
    with torch.no_grad(), _regions_excluded(counter), counter:
        fused_llada.BLOCK_FORWARDS[model.variant](block, model._impl, x, cos, sin, None)
    return counter
