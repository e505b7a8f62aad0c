"""Host-cheap eager calls of the FP8 torch.library ops: the registration only where a tracer needs it.

Each FP8 kernel (the Triton producers, the Triton GEMM and activation quantiser, cuBLAS's blockwise GEMM) is
registered with torch.library so torch.compile sees one op per kernel and never breaks the graph. Called eagerly,
that registration costs host time on every call — autograd dispatch, redispatch, the triton_op wrapper — about 78 %
of a producer call's host time (DESIGN.md §7), which a small FP8 step (a dual-cache window step) pays per layer.

`eager_or_op(op, direct)` returns one function that calls
  * `op` (the registered op) while anything traces: inside torch.compile (torch.compiler.is_compiling()), or under a
    TorchDispatchMode (FakeTensorMode, make_fx, fp8/traffic.py's byte counter), or inside `registered_ops()`;
  * `direct` (the same Python body with the plain kernel launch) otherwise.
Both run the same kernel with the same arguments, so their outputs are bit-identical (tests/test_fp8_eager_direct.py).
This module imports neither Triton nor any kernel (importing dllm_ais.fp8 stays light).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch

_FORCED = [0]  # depth of registered_ops() contexts


def tracing() -> bool:
    """True where the registered op must be called: torch.compile tracing, an active TorchDispatchMode, or
    registered_ops(). One C call and one Python call (≈ 0.3 µs)."""
    return torch.compiler.is_compiling() or bool(_FORCED[0]) or torch._C._len_torch_dispatch_stack() > 0


@contextlib.contextmanager
def registered_ops() -> Iterator[None]:
    """Within this context every eager_or_op function calls its torch.library op, as before the direct path existed
    (the host-dispatch benchmark measures both paths in one run with it)."""
    _FORCED[0] += 1
    try:
        yield
    finally:
        _FORCED[0] -= 1


def direct_launch(kernel):
    """The launch wrapper of the direct path: the kernel itself (the op path passes torch.library.wrap_triton)."""
    return kernel


def eager_or_op(op: Callable, direct: Callable) -> Callable:
    """One function: `op(*args)` while tracing (see `tracing`), else `direct(*args)`. `.op` and `.direct` expose
    both (tests compare them)."""

    @functools.wraps(direct)
    def call(*args, **kwargs):
        if tracing():
            return op(*args, **kwargs)
        return direct(*args, **kwargs)

    call.op, call.direct = op, direct
    return call
