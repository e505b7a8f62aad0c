"""CUDA graphs for diffusion_sample's forwards (SamplerConfig.cuda_graphs; the mechanism: samplers/cuda_graphs.py).

Every forward of a rollout has a static shape: the uncached step and a block's refresh take the whole canvas
[B, P + L], the dual-cache window step one block [B, Lb], the prefix-cache window [B, L − b·Lb] for block b. Each
(kind, shape) is captured once, with static buffers for the tokens, the canvas's attention mask, the positions whose
logits are returned ([B, n] canvas or window coordinates) and the window's start (a 0-dim tensor, so one window graph
serves every block), and over one KV cache that the runner owns (models/kv_cache.py: one tensor per layer, written in
place at the window's slots). A replay copies the new inputs into the buffers; the logits it returns are the graph's
static output, which diffusion_sample copies out at once. The step captured is the eager model call or, with
SamplerConfig.compile, the compiled step (inductor without its own CUDA graphs), so BF16 masters, per-Linear FP8/FP4
copies and the fused FP8 copy (models/llada/fused_fp8.py) all go through the same runner.

A runner is kept per model (weakly) and reused by later calls with the same batch, canvas length, cache mode and
compile setting while no parameter or buffer of the model has moved (in-place optimizer steps and FP8 syncs keep
addresses); otherwise it is rebuilt. It holds its KV cache and the graphs' memory pool until then, or until
`release(model)`. Prompts are padded to PROMPT_BUCKET as for compiled sampling, so a run reuses its graphs.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import torch

from dllm_ais.models.kv_cache import KVCache

from . import cuda_graphs

Step = Callable[..., torch.Tensor]
"""step(model, x, attention_mask, positions, kv_cache, window_start) -> logits [B, n, V] (diffusion._step's)."""


def model_step(model, x: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
               kv_cache: KVCache | None = None, window_start: torch.Tensor | None = None) -> torch.Tensor:
    """One eager sampler forward: logits [B, n, V] at positions [B, n] (with a cache: x is the window)."""
    if kv_cache is None:
        return model(input_ids=x, attention_mask=attention_mask, positions=positions).logits
    return model(input_ids=x, attention_mask=attention_mask, positions=positions, kv_cache=kv_cache,
                 window_start=window_start).logits


def _fingerprint(model) -> tuple[int, ...]:
    """Addresses of every parameter and buffer: a graph read them by address, so a moved tensor means a new graph."""
    if not isinstance(model, torch.nn.Module):
        return (id(model),)
    return tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))


class SamplerGraphs:
    """The graphed forwards of one (model, batch, canvas length, cache mode, compile) and the KV cache they use."""

    def __init__(self, mode: str, step: Step, capture_fn=cuda_graphs.capture, warmup: int = 2):
        self.mode, self.step, self.capture_fn, self.warmup = mode, step, capture_fn, warmup
        self.calls: dict[tuple, cuda_graphs.GraphedCall] = {}
        self.cache: KVCache | None = None
        self.pool = torch.cuda.graph_pool_handle() if capture_fn is cuda_graphs.capture else None
        self.eager_reason: str | None = None
        """Set when a capture failed under mode 'auto': every later call runs eager."""

    def kv_cache(self, model, batch: int, length: int) -> KVCache:
        """The runner's cache (graphs read it by address); allocated on first use."""
        if self.cache is None or self.cache.k[0].shape[0] != batch or self.cache.length != length:
            self.cache, self.calls = KVCache.for_model(model, batch, length), {}
        return self.cache

    def logits(self, model, x: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
               kv_cache: KVCache | None, window_start: torch.Tensor) -> torch.Tensor:
        """The step's logits [B, n, V] through the graph of this (kind, shape), captured on first use. x [B, Tw],
        attention_mask [B, T], positions [B, n] long, window_start 0-dim long. The result is the graph's output:
        read or copy it before the next call."""
        if self.eager_reason is not None:
            return self.step(model, x, attention_mask, positions, kv_cache, window_start)
        if kv_cache is not None and kv_cache is not self.cache:
            raise ValueError("a graphed window step must use the runner's KV cache (SamplerGraphs.kv_cache).")
        key = (tuple(x.shape), tuple(positions.shape), kv_cache is not None)
        call = self.calls.get(key)
        if call is None:
            step = self.step

            def fn(x_, attn_, pos_, start_):
                return step(model, x_, attn_, pos_, kv_cache, start_)

            try:
                call = cuda_graphs.GraphedCall(fn, (x, attention_mask, positions, window_start), self.capture_fn,
                                               warmup=self.warmup, pool=self.pool)
            except Exception as err:
                what = f"the sampler's {'window' if kv_cache is not None else 'full'} step {tuple(x.shape)}"
                if self.mode == "on":
                    raise RuntimeError(f"cuda_graphs='on': capturing {what} failed ({type(err).__name__}: {err}); "
                                       "run with --cuda-graphs auto (eager fallback) or off.") from err
                cuda_graphs.warn_fallback(what, err)
                self.eager_reason = str(err)
                return self.step(model, x, attention_mask, positions, kv_cache, window_start)
            self.calls[key] = call
        return call(x, attention_mask, positions, window_start)


_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> (key, SamplerGraphs): the runner of the model's last graphed rollout shape."""


def runner(model, mode: str, batch: int, length: int, cache: str, step: Step, compiled: bool,
           capture_fn=cuda_graphs.capture) -> SamplerGraphs:
    """The model's runner for this geometry: the previous one if batch, canvas length, cache mode, compile setting
    and every parameter's address still match, else a new one (the old graphs and cache are freed)."""
    key = (batch, length, cache, compiled, mode, capture_fn, _fingerprint(model))
    held = _RUNNERS.get(model)
    if held is not None and held[0] == key:
        return held[1]
    _RUNNERS.pop(model, None)  # free the old graphs' pool before capturing new ones
    made = SamplerGraphs(mode, step, capture_fn)
    _RUNNERS[model] = (key, made)
    return made


def release(model) -> None:
    """Free the model's graphs, their memory pool and their KV cache (e.g. before a memory-hungry update phase)."""
    _RUNNERS.pop(model, None)


def graphed_window_step(model, cache: KVCache, x_window: torch.Tensor, attention_mask: torch.Tensor,
                        window_start: int, capture_fn=cuda_graphs.capture, warmup: int = 2
                        ) -> Callable[[], torch.Tensor]:
    """A thunk that runs one dual/prefix-cache window step as diffusion_sample does under cuda_graphs='on': copy the
    window's tokens, mask and start into the static buffers, replay, return the logits [B, Tw, V] (the graph's output,
    float as the model returns it). The graph is captured now (warm-up included) over `cache`, which a refresh
    should have filled. For timing (scripts/gpu_quick.py): each call is one replay plus three small copies.
    x_window [B, Tw] long, attention_mask [B, T] bool, window_start: the window's first canvas position."""
    B, Tw = x_window.shape
    if isinstance(model, torch.nn.Module):  # FP8 GEMM backend decisions for this M, made before the capture
        from dllm_ais.fp8.backends import prepare_gemm_shapes

        prepare_gemm_shapes(model, [B * Tw])
    graphs = SamplerGraphs("on", model_step, capture_fn, warmup)
    graphs.cache = cache
    positions = torch.arange(Tw, device=x_window.device).expand(B, -1)
    start = torch.tensor(window_start, device=x_window.device)
    graphs.logits(model, x_window, attention_mask, positions, cache, start)  # capture
    return lambda: graphs.logits(model, x_window, attention_mask, positions, cache, start)
