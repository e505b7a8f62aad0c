"""CUDA graphs for static-shape sampler steps: capture a step once, then replay it with new inputs.

One mechanism for both samplers: the autoregressive decode (samplers/ar_static.py: the step reads and writes its
decoder's own static buffers, nothing is copied in) and the diffusion sampler (samplers/diffusion_graphs.py: the
full-canvas refresh, the dual / prefix window step and the uncached step, each captured once per (batch, shape, window
length)).

- `capture(fn, device, warmup, prepare, pool)`: `warmup` calls of fn on a side stream (JIT, cuBLAS / Triton set-up,
  torch.compile's compilation all happen here, outside the capture), then fn recorded into a `torch.cuda.CUDAGraph`.
  Returns (graph, fn's output): the output tensors live in the graph's memory pool and every replay rewrites them.
- `GraphedCall(fn, example_args)`: static copies of fn's tensor arguments; a call copies the new arguments into them,
  replays, and returns the static output (valid until the next replay of any graph sharing its pool: copy it out
  before the next step). A call whose argument shapes differ from the captured ones is refused: a graph holds one
  shape.
- `capture` is injectable: `eager_capture` returns a stand-in whose replay re-runs fn on the static buffers and writes
  the result into the captured output (what a replay does), so the buffer logic is tested on CPU.

What a graph assumes: every tensor the step reads other than its arguments (weights, the KV cache) keeps its address
(in-place weight updates and syncs are fine, a reassigned parameter is not — diffusion_graphs re-captures when a
parameter's address changes), and the step makes no host-device synchronisation (no `.item()`, no data-dependent
shapes).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

from dllm_ais.config import CUDA_GRAPH_MODES as MODES  # auto = graphs for CUDA rollouts, on = graphs or a refusal


def use_graphs(mode: str, device: torch.device | str, what: str = "rollouts") -> bool:
    """Whether `what` on `device` runs through CUDA graphs under `mode`; refuses `on` off CUDA (one ValueError line,
    raised before anything is allocated or written)."""
    if mode not in MODES:
        raise ValueError(f"cuda_graphs={mode!r}: use one of {', '.join(MODES)}.")
    device = torch.device(device)
    if mode == "off":
        return False
    if device.type == "cuda":
        return True
    if mode == "on":
        raise ValueError(f"cuda_graphs='on' needs CUDA but the {what} run on {device.type}: use --cuda-graphs auto "
                         "(graphs on CUDA, eager elsewhere) or --cuda-graphs off.")
    return False


def capture(fn: Callable[[], object], device: torch.device | str, warmup: int = 2,
            prepare: Callable[[], None] | None = None, pool=None) -> tuple[object, object]:
    """(torch.cuda.CUDAGraph, output) of fn recorded on `device` after `warmup` side-stream calls; `prepare` runs
    before every warm-up call and before the capture (e.g. rewinding a step counter). pool: a memory pool shared with
    other graphs replayed one at a time (torch.cuda.graph_pool_handle()), or None for the graph's own."""
    device = torch.device(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            if prepare is not None:
                prepare()
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    if prepare is not None:
        prepare()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class EagerReplay:
    """A stand-in graph (tests, and hosts without CUDA): replay re-runs fn and writes its tensors into the output
    captured first, so callers see exactly what a CUDA graph's replay gives them — the same output tensors, rewritten,
    computed from whatever the static buffers hold now."""

    def __init__(self, fn: Callable[[], object], output: object):
        self.fn, self.output, self.replays = fn, output, 0

    def replay(self) -> None:
        new = self.fn()
        for old, fresh in zip(_tensors(self.output), _tensors(new), strict=True):
            old.copy_(fresh)
        self.replays += 1


def eager_capture(fn: Callable[[], object], device=None, warmup: int = 0, prepare=None, pool=None
                  ) -> tuple[EagerReplay, object]:
    """`capture`'s signature and contract without CUDA: (EagerReplay, the output of one call of fn)."""
    for _ in range(warmup):
        if prepare is not None:
            prepare()
        fn()
    if prepare is not None:
        prepare()
    out = fn()
    return EagerReplay(fn, out), out


def _tensors(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if out is None:
        return []
    raise TypeError(f"a graphed step must return tensors (or tuples of them), not {type(out).__name__}")


class GraphedCall:
    """fn(*args) captured once with static copies of its tensor arguments; `call(*args)` copies the new arguments
    in, replays and returns the static output (module docstring)."""

    def __init__(self, fn: Callable[..., object], example_args: Sequence[torch.Tensor], capture_fn=capture,
                 warmup: int = 2, pool=None):
        self.static = [a.clone() for a in example_args]
        device = self.static[0].device
        self.graph, self.output = capture_fn(lambda: fn(*self.static), device, warmup=warmup, pool=pool)

    def __call__(self, *args: torch.Tensor) -> object:
        for buf, new in zip(self.static, args, strict=True):
            if buf.shape != new.shape or buf.dtype != new.dtype:
                raise ValueError(f"a CUDA graph holds one shape: captured with {tuple(buf.shape)} {buf.dtype}, "
                                 f"called with {tuple(new.shape)} {new.dtype}; capture a graph per shape (or run "
                                 "with --cuda-graphs off).")
            if new.data_ptr() != buf.data_ptr():
                buf.copy_(new, non_blocking=True)
        self.graph.replay()
        return self.output


def warn_fallback(what: str, err: BaseException) -> None:
    """The one warning of cuda_graphs='auto' falling back to eager (what failed and why, and how to silence it)."""
    warnings.warn(f"cuda_graphs='auto': capturing {what} as a CUDA graph failed ({type(err).__name__}: "
                  f"{str(err).splitlines()[0] if str(err) else ''}); it runs eager from now on (same results, more "
                  "host time). Pass --cuda-graphs off to silence this, or on to make it an error.", RuntimeWarning,
                  stacklevel=3)
