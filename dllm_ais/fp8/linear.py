"""FP8Linear, the FP8 rollout copy of a model (quantize_model) and the BF16 -> FP8 weight sync (sync_weights).

The rollout policy μ is a deep copy of the BF16 master in which every nn.Linear — except the LM head and whatever the
caller excludes — is an FP8Linear: e4m3 weight codes and fp32 scales held as buffers, activations quantised on the fly
in each forward. After every optimizer step `sync_weights(master, rollout)` requantises the master's weights into the
copy's existing buffers in place, so the copy's memory never moves (CUDA graphs and cached pointers stay valid).

Backends (one interface, chosen once by name from BACKENDS; FP8Linear is inference-only, no autograd through it):
  "torch"     reference emulation: quantise x per 1×128, dequantise both operands, fp32 matmul. Runs everywhere;
              the CPU default. Exact twin of the Triton kernel up to fp32 summation order (~1e-6 relative).
  "triton"    dllm_ais.fp8.kernels: Triton activation quantisation + blockwise-scaled FP8 GEMM. CUDA with compute
              capability ≥ 8.9, or CPU tensors under TRITON_INTERPRET=1 (slow; tests).
  "scaled_mm" torch._scaled_mm with ROW-WISE scales: one scale per token row of x and per output channel of W. A
              different, coarser scheme than the 128-blocks (one outlier widens the scale of a whole row / channel),
              so its weight buffers hold [N, 1] scales. Available where a tiny probe call succeeds (CUDA sm90+ in
              torch 2.4+, and CPU in recent torch).
  "torchao"   torchao's blockwise_fp8_gemm (the DeepSeek-V3 Triton kernel, same 1×128 / 128×128 layout as ours, our
              Triton activation quantisation). CUDA with compute capability ≥ 8.9 only.
  "cublas"    cuBLAS's blockwise FP8 GEMM through torch._scaled_mm with 1×128 activation scales (K-major, [M, G] with
              stride (1, M)) and 128×128 weight scales (passed transposed). Same buffers and numbers as "triton" up to
              summation order and bf16 output rounding. Available where a tiny blockwise probe call succeeds (H100
              with torch 2.11 verified; not CPU). Layers whose N or K is not a multiple of 128 run the Triton GEMM.
  "auto"      per (device, N, K, M bucket) the fastest available block backend (cublas, triton, torchao), timed once
              on first use and cached in memory (auto_choices()); "torch" on CPU. Warm it eagerly (one forward per
              shape) before CUDA-graph capture or torch.compile: timing cannot run inside either.

Each backend is `forward` = quantise x + `gemm`, where `gemm(xq, xs, layer)` takes activations that a producer
kernel already quantised (FP8Linear.forward_quantized; the fused LLaDA rollout copy in fused_llada.py calls it after
RMSNorm→quant, SiLU·up→quant and attention-output→quant); scaled_mm's row-wise scheme has no gemm (None), so a model
on it quantises bf16 producer outputs itself. The Triton paths go through the torch.library ops of ops.py, so
torch.compile traces them without a graph break.

quantize_model on an LLaDAModelLM (plain or peft-wrapped) returns that fused copy; every other model (Qwen, toy
modules) gets the per-Linear copy described here, and sync_weights handles both.

Layer shapes: in_features and out_features must be multiples of 16 for every backend (torch._scaled_mm's requirement,
and 16-byte-aligned fp8 rows for the GEMMs), so the set of quantisable layers does not depend on the backend. Ragged
multiples of 16 (not of 128) are fine: the 128-blocks use masked tails (see quant.py).

peft LoRA: a LoRA-wrapped Linear (a module with `base_layer`, `lora_A`, `lora_B`, `get_delta_weight`, as peft makes)
counts as one linear layer whose weight is W + Σ_active scaling·B@A, merged on the fly exactly as peft's merge rounds
it, without touching the master. Module names are compared after removing peft's `base_model.model.` prefix and
`.base_layer` components, so a copy made from the plain model syncs from its LoRA-wrapped master and vice versa.

The model walking is shared with the emulated FP4 copy (dllm_ais.fp4.linear): quantized_copy builds a copy with any
layer factory, and sync_weights refills every QuantizedLinear (FP8Linear, FP4Linear) in place.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from . import quant
from .quant import FP8_DTYPE, num_blocks

ALIGN = 16  # in_features and out_features must be multiples of this


class FP8BackendError(ValueError):
    """The FP8 backend name is unknown or the backend cannot run on the tensors' device."""


class FP8LayerError(ValueError):
    """A linear layer cannot be quantised (its shape does not fit the FP8 layout)."""


# ----------------------------------------------------------------------------------------------------------------------
# backends: sibling forward functions, x [M, K] -> y [M, N] (fp32 or bf16; FP8Linear casts to x.dtype)


def _gemm_torch(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    return quant.fp8_gemm_reference(xq, xs, layer.weight_q, layer.weight_scale, out_dtype=torch.float32)


def _gemm_triton(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Linear, out_dtype: torch.dtype) -> torch.Tensor:
    from . import ops

    return ops.fp8_gemm(xq, xs, layer.weight_q, layer.weight_scale, out_dtype)


def _gemm_triton_bf16(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    """bf16 out unless the layer has a bias (added in fp32 by FP8Linear)."""
    return _gemm_triton(xq, xs, layer, torch.bfloat16 if layer.bias is None else torch.float32)


def _gemm_torchao(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    from . import ops

    return ops.torchao_gemm(xq, xs, layer.weight_q, layer.weight_scale)  # [M, N] bf16


def _quantize_act_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quant.quantize_act(x)


def _quantize_act_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from . import ops

    return ops.quantize_act(x)


def _forward_torch(x: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    return _gemm_torch(*_quantize_act_torch(x), layer)  # x [M, K] -> [M, K], [M, G] -> [M, N]


def _forward_triton(x: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    out_dtype = torch.bfloat16 if x.dtype == torch.bfloat16 and layer.bias is None else torch.float32
    return _gemm_triton(*_quantize_act_triton(x), layer, out_dtype)


def _forward_scaled_mm(x: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    xq, xs = quant.quantize_rowwise(x)  # [M, K], [M, 1]
    w_t, ws_t = layer.weight_q.t(), layer.weight_scale.t()  # [K, N] column-major, [1, N]
    return torch._scaled_mm(xq, w_t, scale_a=xs, scale_b=ws_t, out_dtype=torch.bfloat16)


def _forward_torchao(x: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    return _gemm_torchao(*_quantize_act_triton(x), layer)


@functools.cache
def torchao_blockwise_gemm() -> Callable:
    """torchao's blockwise_fp8_gemm(a, a_s, b, b_s) -> bf16; its module moved between torchao versions."""
    places = [
        "torchao.kernel.blockwise_quantization",
        "torchao.prototype.blockwise_fp8_inference",
        "torchao.prototype.blockwise_fp8",
    ]
    for place in places:
        try:
            return importlib.import_module(place).blockwise_fp8_gemm
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"no torchao module provides blockwise_fp8_gemm (looked in {', '.join(places)})")


def _outer_dim_major(xs: torch.Tensor) -> torch.Tensor:
    """Activation scales [M, G] in the layout cuBLAS's 1×128 mode requires: stride (1, M) (a copy only if needed)."""
    M, G = xs.shape
    if xs.stride(0) == 1 and (G <= 1 or xs.stride(1) == M):
        return xs
    return xs.new_empty(G, M).t().copy_(xs)  # explicit strides (1, M), also for M == 1


def _quantize_act_block(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (codes [M, K], K-major scales [M, G]): the Triton kernel where it runs, else the torch twin."""
    if _unavailable("triton", x.device) is None:
        from . import kernels

        return kernels.quantize_act(x)
    xq, xs = quant.quantize_act(x)
    return xq, _outer_dim_major(xs)


def _cublas_fits(layer: FP8Linear) -> bool:
    """cuBLAS's blockwise mode wants whole 128-blocks: scale shapes [M, K/128] and [N/128, K/128] exactly."""
    return layer.in_features % quant.BLOCK == 0 and layer.out_features % quant.BLOCK == 0


_CUBLAS_REJECTED: set[tuple[str, int, int, int]] = set()  # (device, M, N, K) that torch._scaled_mm refused


def cublas_fallbacks() -> set[tuple[str, int, int, int]]:
    """(device, M, N, K) shapes at which cuBLAS's blockwise mode raised and the Triton GEMM ran instead (a copy)."""
    return set(_CUBLAS_REJECTED)


def _gemm_cublas(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    """xq [M, K] e4m3, xs [M, G] fp32 (either layout) -> y [M, N] bf16 via torch._scaled_mm's blockwise mode.

    Layers that are not whole 128-blocks, and shapes cuBLAS rejects (the blockwise mode's constraints on M are not
    documented; verified at LLaDA-8B shapes), run the Triton GEMM; rejected shapes are remembered (cublas_fallbacks())
    and a warning names the first one."""
    key = (str(xq.device), xq.shape[0], layer.out_features, layer.in_features)
    if _cublas_fits(layer) and key not in _CUBLAS_REJECTED:
        try:
            return torch._scaled_mm(
                xq, layer.weight_q.t(), scale_a=_outer_dim_major(xs), scale_b=layer.weight_scale.t(),
                out_dtype=torch.bfloat16,
            )  # fmt: skip
        except RuntimeError as e:
            if not _CUBLAS_REJECTED:
                warnings.warn(f"cublas backend: torch._scaled_mm rejected M, N, K = {key[1:]} ({e}); running the "
                              "Triton GEMM for such shapes (see cublas_fallbacks())", stacklevel=2)  # fmt: skip
            _CUBLAS_REJECTED.add(key)
    from . import kernels

    return kernels.fp8_gemm(xq, xs, layer.weight_q, layer.weight_scale)


def _forward_cublas(x: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    return _gemm_cublas(*_quantize_act_block(x), layer)


AUTO_CANDIDATES = ("cublas", "triton", "torchao")  # "block" backends sharing FP8Linear's buffers, fastest first hoped
_AUTO_CHOICES: dict[tuple[str, str, int, int, int], str] = {}


def auto_choices() -> dict[tuple[str, str, int, int, int], str]:
    """What `auto` picked so far: (kind "forward" | "gemm", device, N, K, M bucket) -> backend name (a copy)."""
    return dict(_AUTO_CHOICES)


def clear_auto_choices() -> None:
    """Forget every `auto` choice (the next call per shape times the candidates again)."""
    _AUTO_CHOICES.clear()


def _m_bucket(m: int) -> int:
    """M rounded up to a power of two: the granularity at which `auto` re-times (and Triton re-tunes)."""
    return 1 << max(0, m - 1).bit_length()


def _median_ms(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    fn()  # warm-up: compilation / autotuning happen here, outside the timing
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _auto_pick(kind: str, layer: FP8Linear, m: int, device: torch.device, run: Callable[[str], object]) -> str:
    """The cached choice for (kind, device, N, K, M bucket); on a miss time `run(name)` for each available candidate
    (those with a `gemm` when kind == "gemm") and keep the fastest. CPU: always "torch"."""
    key = (kind, str(device), layer.out_features, layer.in_features, _m_bucket(m))
    choice = _AUTO_CHOICES.get(key)
    if choice is not None:
        return choice
    if device.type != "cuda":
        _AUTO_CHOICES[key] = "torch"
        return "torch"
    if torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling():
        raise FP8BackendError(
            f"FP8 backend 'auto' has not timed shape N={key[2]}, K={key[3]}, M bucket {key[4]} yet and cannot time it "
            "inside CUDA-graph capture or torch.compile: run one eager forward per shape first, or pick a backend."
        )
    times: dict[str, float] = {}
    for name in AUTO_CANDIDATES:
        if _unavailable(name, device) is not None or (kind == "gemm" and BACKENDS[name].gemm is None):
            continue
        try:
            times[name] = _median_ms(lambda name=name: run(name), device)
        except Exception:  # a candidate that fails at this shape is simply not chosen
            continue
    if not times:
        raise FP8BackendError(f"FP8 backend 'auto': no candidate of {AUTO_CANDIDATES} runs {kind} on {device}")
    _AUTO_CHOICES[key] = min(times, key=times.__getitem__)
    return _AUTO_CHOICES[key]


def _forward_auto(x: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    name = _auto_pick("forward", layer, x.shape[0], x.device, lambda b: BACKENDS[b].forward(x, layer))
    return BACKENDS[name].forward(x, layer)


def _gemm_auto(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Linear) -> torch.Tensor:
    name = _auto_pick("gemm", layer, xq.shape[0], xq.device, lambda b: BACKENDS[b].gemm(xq, xs, layer))
    return BACKENDS[name].gemm(xq, xs, layer)


def _cuda_fp8_reason(device: torch.device) -> str | None:
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"FP8 tensor cores need compute capability >= 8.9, this GPU has {major}.{minor}"
    return None


def _torch_unavailable(device: torch.device) -> str | None:
    return None


def _triton_unavailable(device: torch.device) -> str | None:
    try:
        from . import kernels
    except ImportError as e:
        return f"triton is not importable ({e})"
    if device.type == "cuda":
        return _cuda_fp8_reason(device)
    if device.type == "cpu":
        if kernels.INTERPRET:
            return None
        return (
            "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before dllm_ais.fp8.kernels is "
            "first imported (slow; meant for tests)"
        )
    return f"no Triton support for device type {device.type!r}"


def _scaled_mm_unavailable(device: torch.device) -> str | None:
    if not hasattr(torch, "_scaled_mm"):
        return "this torch has no torch._scaled_mm"
    try:  # the supported (device, scaling) combinations change between torch versions: ask the device itself
        a = torch.zeros(16, 16, dtype=FP8_DTYPE, device=device)
        ones = torch.ones(16, 1, dtype=torch.float32, device=device)
        torch._scaled_mm(a, a.t(), scale_a=ones, scale_b=ones.t(), out_dtype=torch.bfloat16)
    except Exception as e:  # a probe: any failure means "not here"
        return f"torch._scaled_mm with row-wise scales fails here ({str(e).splitlines()[0] if str(e) else type(e)})"
    return None


def _cublas_unavailable(device: torch.device) -> str | None:
    if not hasattr(torch, "_scaled_mm"):
        return "this torch has no torch._scaled_mm"
    try:  # which (device, scaling) pairs work changes between torch versions: ask the device itself
        a = torch.zeros(16, 256, dtype=FP8_DTYPE, device=device)  # [M, K]
        w = torch.zeros(256, 256, dtype=FP8_DTYPE, device=device)  # [N, K]
        xs = torch.ones(2, 16, dtype=torch.float32, device=device).t()  # [M, K/128], stride (1, M)
        ws = torch.ones(2, 2, dtype=torch.float32, device=device)  # [N/128, K/128]
        torch._scaled_mm(a, w.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)
    except Exception as e:  # a probe: any failure means "not here"
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        return (
            f"torch {torch.__version__} on {device.type} rejects torch._scaled_mm with blockwise (1×128 / 128×128) "
            f"scales ({detail}); cuBLAS's blockwise FP8 GEMM needs a CUDA GPU with compute capability >= 9.0"
        )
    return None


def _auto_unavailable(device: torch.device) -> str | None:
    return None  # falls back to "torch" where nothing faster runs


def _torchao_unavailable(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "torchao's blockwise FP8 GEMM is a CUDA kernel (needs a GPU with compute capability >= 8.9)"
    reason = _cuda_fp8_reason(device) or _triton_unavailable(device)
    if reason:
        return reason
    try:
        torchao_blockwise_gemm()
    except ImportError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class Backend:
    """One way to run an FP8Linear."""

    forward: Callable[[torch.Tensor, FP8Linear], torch.Tensor]
    """x [M, K] -> y [M, N] (fp32 or bf16): quantise x, then `gemm` (or the backend's own scheme)."""
    gemm: Callable[[torch.Tensor, torch.Tensor, FP8Linear], torch.Tensor] | None
    """(xq [M, K] e4m3, xs [M, ceil(K/128)] fp32, layer) -> y [M, N] from activations a producer already quantised
    per 1×128 (xs may be any strided [M, G] view, e.g. K-major); None for a backend that cannot take them (row-wise
    scaled_mm: the fused model then quantises the producer's output itself)."""
    scheme: str
    """"block": 1×128 activation / 128×128 weight scales; "row": per-row activation / per-output-channel weight."""
    unavailable: Callable[[torch.device], str | None]
    """Why this backend cannot run on a device, or None when it can."""


BACKENDS: dict[str, Backend] = {
    "torch": Backend(_forward_torch, _gemm_torch, "block", _torch_unavailable),
    "triton": Backend(_forward_triton, _gemm_triton_bf16, "block", _triton_unavailable),
    "scaled_mm": Backend(_forward_scaled_mm, None, "row", _scaled_mm_unavailable),
    "torchao": Backend(_forward_torchao, _gemm_torchao, "block", _torchao_unavailable),
    "cublas": Backend(_forward_cublas, _gemm_cublas, "block", _cublas_unavailable),
    "auto": Backend(_forward_auto, _gemm_auto, "block", _auto_unavailable),
}


@functools.cache
def _unavailable(backend: str, device: torch.device) -> str | None:
    return BACKENDS[backend].unavailable(device)


def unavailable_reason(backend: str, device: torch.device | str) -> str | None:
    """Why `backend` cannot run on `device` (None when it can). The answer is cached per (backend, device)."""
    check_backend(backend)
    return _unavailable(backend, torch.device(device))


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Names of the backends that can run on `device`."""
    device = torch.device(device)
    return [name for name in BACKENDS if _unavailable(name, device) is None]


def check_backend(backend: str, device: torch.device | str | None = None) -> None:
    """Raise FP8BackendError, naming the alternatives, if `backend` is unknown or (given a device) cannot run there."""
    if backend not in BACKENDS:
        raise FP8BackendError(f"unknown FP8 backend {backend!r}; known backends: {', '.join(BACKENDS)}")
    if device is None:
        return
    device = torch.device(device)
    reason = _unavailable(backend, device)
    if reason is not None:
        raise FP8BackendError(
            f"FP8 backend {backend!r} cannot run on {device}: {reason}. Backends that run on "
            f"{device}: {', '.join(available_backends(device))}"
        )


def check_layer_shape(name: str, in_features: int, out_features: int) -> None:
    """Raise FP8LayerError if a [out_features, in_features] linear cannot be quantised (see module docstring)."""
    if in_features % ALIGN or out_features % ALIGN or in_features == 0 or out_features == 0:
        raise FP8LayerError(
            f"cannot quantise layer {name!r} (in_features={in_features}, out_features={out_features}): FP8 layers "
            f"need both to be positive multiples of {ALIGN}. Keep it in BF16 with "
            f"quantize_model(model, exclude=lambda name: name == {name!r}), or pad it to a multiple of {ALIGN}."
        )


# ----------------------------------------------------------------------------------------------------------------------
# weight quantisation into existing buffers


def _quantize_block_into(w: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    """w [N, K] -> q [N, K] e4m3, s [ceil(N/128), ceil(K/128)] fp32, in place."""
    if w.is_cuda and _unavailable("triton", w.device) is None:
        from . import kernels

        kernels.quantize_weight(w, out=(q, s))  # writes straight into the buffers
    else:
        wq, ws = quant.quantize_weight(w)
        q.copy_(wq)
        s.copy_(ws)


def _quantize_row_into(w: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    """w [N, K] -> q [N, K] e4m3, s [N, 1] fp32, in place."""
    wq, ws = quant.quantize_rowwise(w)
    q.copy_(wq)
    s.copy_(ws)


_QUANTIZE_INTO = {"block": _quantize_block_into, "row": _quantize_row_into}


# ----------------------------------------------------------------------------------------------------------------------
# the layer


class QuantizedLinear(nn.Module):
    """Base of the rollout copy's low-precision linears (FP8Linear here, dllm_ais.fp4's FP4Linear): sync_weights finds
    them by this type and refills each with `load_weight_(weight, bias)`."""

    in_features: int
    out_features: int
    bias: torch.Tensor | None

    keep_dtype: tuple[str, ...] = ()
    """Buffers that model.to(dtype) / .half() / .bfloat16() must not cast (they hold quantised values exactly)."""

    def load_weight_(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def _apply(self, fn: Callable, recurse: bool = True) -> QuantizedLinear:
        """Like nn.Module._apply, but the `keep_dtype` buffers keep their dtype (devices still move)."""
        for name, buf in self._buffers.items():
            if buf is not None:
                moved = fn(buf)
                if name in self.keep_dtype and moved.dtype != buf.dtype:
                    moved = buf.to(moved.device)
                self._buffers[name] = moved
        return self

    def _check_weight(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Raise ValueError unless weight is [out_features, in_features] and bias matches the layer's."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            expected = (self.out_features, self.in_features)
            raise ValueError(f"weight must have shape {expected}, got {tuple(weight.shape)}")
        if (bias is None) != (self.bias is None):
            raise ValueError(f"bias mismatch: layer has bias={self.bias is not None}, got bias={bias is not None}")


class FP8Linear(QuantizedLinear):
    """y = x @ W^T + b with W held as e4m3 codes + fp32 scales and x quantised dynamically (inference only).

    Buffers: weight_q [N, K] float8_e4m3fn; weight_scale [ceil(N/128), ceil(K/128)] fp32 ("block" backends) or
    [N, 1] fp32 ("scaled_mm"); bias [N] bf16 or None. The output has the input's dtype.
    """

    keep_dtype = ("weight_q", "weight_scale")  # float8 counts as floating point to torch; the bias follows a cast

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        backend: str = "torch",
        device: torch.device | str | None = None,
        name: str = "FP8Linear",
    ) -> None:
        super().__init__()
        check_backend(backend)
        check_layer_shape(name, in_features, out_features)
        self.in_features, self.out_features, self.backend = in_features, out_features, backend
        self.scheme = BACKENDS[backend].scheme
        if self.scheme == "block":
            scale_shape = (num_blocks(out_features), num_blocks(in_features))
        else:
            scale_shape = (out_features, 1)
        self.register_buffer("weight_q", torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device))
        self.register_buffer("weight_scale", torch.ones(scale_shape, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=torch.bfloat16, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Module, backend: str = "torch", *, name: str = "FP8Linear") -> FP8Linear:
        """Quantise an nn.Linear, or a peft LoRA layer around one (adapters merged as effective_weight does; the module
        is not modified), on its device, which `backend` must support."""
        base = _base_linear(linear)
        check_backend(backend, base.weight.device)
        layer = cls(
            base.in_features,
            base.out_features,
            base.bias is not None,
            backend=backend,
            device=base.weight.device,
            name=name,
        )
        layer.load_weight_(*effective_weight(linear))
        return layer

    @torch.no_grad()
    def load_weight_(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Requantise weight [N, K] (and copy bias [N]) into the existing buffers, in place."""
        self._check_weight(weight, bias)
        _QUANTIZE_INTO[self.scheme](weight.detach().to(self.weight_q.device), self.weight_q, self.weight_scale)
        if bias is not None:
            self.bias.copy_(bias)

    def dequantized_weight(self) -> torch.Tensor:
        """W ≈ codes · scales, [N, K] fp32."""
        if self.scheme == "block":
            return quant.dequantize_weight(self.weight_q, self.weight_scale)
        return self.weight_q.float() * self.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] in x.dtype."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected input [..., {self.in_features}], got {tuple(x.shape)}")
        check_backend(self.backend, x.device)  # cached; fails clearly if the layer was moved to an unsupported device
        y = BACKENDS[self.backend].forward(x.reshape(-1, self.in_features), self)  # [M, N]
        if self.bias is not None:
            y = y.float() + self.bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def forward_quantized(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Already-quantised activations xq [M, K] e4m3, xs [M, ceil(K/128)] fp32 -> y [M, N] in `dtype`.

        For producers that emit FP8 (the fused rollout model); needs a backend whose `gemm` is not None. No device
        check here (the caller checked once), so torch.compile traces it without a graph break.
        """
        gemm = BACKENDS[self.backend].gemm
        if gemm is None:
            raise FP8BackendError(f"FP8 backend {self.backend!r} takes bf16 activations only (it has no gemm)")
        y = gemm(xq, xs, self)  # [M, N]
        if self.bias is not None:
            y = y.float() + self.bias.float()
        return y.to(dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"backend={self.backend!r}, scheme={self.scheme!r}"
        )


# ----------------------------------------------------------------------------------------------------------------------
# model walking (plain nn.Linear and peft LoRA-wrapped nn.Linear)


def _is_lora_layer(module: nn.Module) -> bool:
    return (
        isinstance(getattr(module, "base_layer", None), nn.Linear)
        and hasattr(module, "lora_A")
        and hasattr(module, "get_delta_weight")
    )


def _is_linear(module: nn.Module) -> bool:
    # nn.MultiheadAttention reads out_proj.weight directly, so its (NonDynamicallyQuantizable) Linear must stay.
    return isinstance(module, nn.Linear) and not isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear)


def _linear_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Qualified name -> nn.Linear or LoRA-wrapped nn.Linear (not descending into LoRA layers; the root is skipped)."""
    found: dict[str, nn.Module] = {}

    def walk(prefix: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            name = f"{prefix}.{child_name}" if prefix else child_name
            if _is_lora_layer(child) or _is_linear(child):
                found[name] = child
            else:
                walk(name, child)

    walk("", model)
    return found


def canonical_name(name: str, peft_root: bool = False) -> str:
    """Drop peft's `base_model.model.` root prefix (when peft_root) and its `base_layer` components."""
    parts = name.split(".")
    if peft_root and parts[:2] == ["base_model", "model"]:
        parts = parts[2:]
    return ".".join(p for p in parts if p != "base_layer")


def _is_peft_root(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def effective_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (weight [N, K], bias [N] | None) a linear layer applies; for a LoRA layer W + Σ scaling·B@A, computed
    adapter by adapter and rounded to W's dtype exactly as peft's merge does, without modifying the module."""
    if not _is_lora_layer(module):
        return module.weight, module.bias
    base = module.base_layer
    weight, bias = base.weight, base.bias
    if getattr(module, "disable_adapters", False):
        return weight, bias
    merged = set(getattr(module, "merged_adapters", []))
    for adapter in module.active_adapters:
        if adapter not in module.lora_A.keys() or adapter in merged:
            continue
        if adapter in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(adapter, False):
            raise NotImplementedError(
                f"adapter {adapter!r} is a LoRA variant (e.g. DoRA); only vanilla LoRA is "
                "merged on the fly. Merge it into a copy of the model before quantising."
            )
        weight = (weight + module.get_delta_weight(adapter)).to(base.weight.dtype)
        if getattr(module, "lora_bias", {}).get(adapter, False):
            bias = (bias + module.lora_B[adapter].bias * module.scaling[adapter]).to(base.bias.dtype)
    return weight, bias


def _base_linear(module: nn.Module) -> nn.Linear:
    return module.base_layer if _is_lora_layer(module) else module


def _named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


def _copy_memo(model: nn.Module, replaced: list[str]) -> dict[int, object]:
    """A deepcopy memo that stands a placeholder in for the parameters of layers about to be replaced, so that copying
    never duplicates the big linear weights (peak memory: master + FP8 copy, not twice the master). Parameters that
    are also used outside those layers (tied weights) are copied normally."""
    prefixes = tuple(f"{name}." for name in replaced)
    inside, outside = set(), set()
    for name, p in model.named_parameters(remove_duplicate=False):
        (inside if name.startswith(prefixes) else outside).add(id(p))
    placeholder = nn.Parameter(torch.empty(0, device="meta"), requires_grad=False)
    return {i: placeholder for i in inside - outside}


def _llada_master(model: nn.Module) -> nn.Module | None:
    """The LLaDAModelLM in `model` (itself or under peft), or None; without importing models.llada (if it is not
    imported, `model` cannot be one)."""
    if "dllm_ais.models.llada" not in sys.modules:
        return None
    from .fused_llada import llada_master

    return llada_master(model)


# ----------------------------------------------------------------------------------------------------------------------
# public entry points


@torch.no_grad()
def quantize_model(
    model: nn.Module,
    backend: str = "torch",
    exclude: Callable[[str], bool] | None = None,
) -> nn.Module:
    """Return an FP8 rollout COPY of `model` (in eval mode, requires_grad off); `model` itself is untouched.

    Every nn.Linear (or peft LoRA-wrapped nn.Linear, merged) becomes an FP8Linear on `backend`, except the module
    `model.get_output_embeddings()` returns (the LM head; matched by identity, never by name — LLaDA's head and its
    MLP down projections are all called `ff_out`) and layers whose canonical qualified name satisfies `exclude`.
    Embeddings, norms and everything that is not an nn.Linear are copied unchanged.
    Raises FP8BackendError / FP8LayerError, naming the backend or layer and the alternatives, before copying anything.

    An LLaDAModelLM (plain or peft-wrapped) gets the fused inference copy instead (fp8/fused_llada.py: fused QKV and
    gate-up weights, producers that emit FP8), unless `exclude` is given (then: the per-Linear copy above).
    """
    check_backend(backend)
    if exclude is None and _llada_master(model) is not None:
        from .fused_llada import build_fused_llada

        return build_fused_llada(model, backend)

    def check(name: str, linear: nn.Linear) -> None:
        check_layer_shape(name, linear.in_features, linear.out_features)
        check_backend(backend, linear.weight.device)

    def make(name: str, module: nn.Module) -> nn.Module:
        return FP8Linear.from_linear(module, backend, name=name)

    return quantized_copy(model, make, exclude, check)


def quantizable_layers(model: nn.Module, exclude: Callable[[str], bool] | None = None) -> dict[str, nn.Module]:
    """Qualified name -> nn.Linear or LoRA-wrapped nn.Linear that a quantised rollout copy replaces: every one except
    the module `model.get_output_embeddings()` returns (the LM head, matched by identity) and those whose canonical
    name satisfies `exclude`."""
    peft_root = _is_peft_root(model)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return {name: module for name, module in _linear_layers(model).items()
            if not (head is not None and (module is head or getattr(module, "base_layer", None) is head))
            and not (exclude is not None and exclude(canonical_name(name, peft_root)))}


@torch.no_grad()
def quantized_copy(
    model: nn.Module,
    make_layer: Callable[[str, nn.Module], nn.Module],
    exclude: Callable[[str], bool] | None = None,
    check: Callable[[str, nn.Linear], None] | None = None,
) -> nn.Module:
    """A copy of `model` (eval mode, requires_grad off) in which every block linear is replaced by
    make_layer(qualified name, linear or LoRA-wrapped linear) — the layer selection quantize_model documents (LM head
    and `exclude`d canonical names kept). `check(canonical name, base nn.Linear)` runs on every target first and may
    raise before anything is copied."""
    targets = quantizable_layers(model, exclude)
    if check is not None:
        peft_root = _is_peft_root(model)
        for name, module in targets.items():
            check(canonical_name(name, peft_root), _base_linear(module))

    rollout = copy.deepcopy(model, _copy_memo(model, list(targets)))
    for name, module in targets.items():
        _set_submodule(rollout, name, make_layer(name, module))
    rollout.requires_grad_(False)
    return rollout.eval()


@torch.no_grad()
def sync_weights(master: nn.Module, rollout: nn.Module, gather: Callable | None = None,
                 full: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """Copy the BF16 master's current weights into the FP8 (or FP4) rollout copy, in place (no buffer is reallocated).

    Each QuantizedLinear (FP8Linear, FP4Linear) of `rollout` is requantised from the master's linear of the same
    canonical name (a LoRA layer is merged on the fly; the master is not modified); a plain linear of `rollout` whose
    master layer carries LoRA (e.g. a LoRA-adapted LM head) gets the merged weight; every other parameter and buffer
    of `rollout` (embeddings, norms, LM head, excluded linears) is copy_'d from the master tensor of the same
    canonical name. A fused LLaDA rollout copy (fp8/fused_llada.py) has each master tensor requantised into its slice
    of the fused buffers instead.

    `gather(module)` and `full(tensor)` serve a sharded master (FSDP2, dllm_ais/fsdp_sync.py): a context manager that
    makes one master layer's parameters whole while it is read, and the whole of one sharded tensor. Default: the
    master is not sharded.
    """
    gather = gather or contextlib.nullcontext
    full = full or (lambda t: t)
    fused = sys.modules.get(f"{__package__}.fused_llada")
    if fused is not None and isinstance(rollout, fused.FusedLLaDA):
        fused.sync_fused_llada(master, rollout, gather=gather, full=full)
        return
    master_peft, rollout_peft = _is_peft_root(master), _is_peft_root(rollout)
    master_layers = {canonical_name(n, master_peft): m for n, m in _linear_layers(master).items()}
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
    for name, module in _linear_layers(rollout).items():
        source = master_layers.get(canonical_name(name, rollout_peft))
        if _is_linear(module) and source is not None and _is_lora_layer(source):
            with gather(source):
                weight, bias = effective_weight(source)
                module.weight.copy_(weight)
                if module.bias is not None:
                    module.bias.copy_(bias)
            done.append(name)

    # everything else (embeddings, norms, plain linears, a rollout's own LoRA adapters): by canonical name
    master_tensors = {canonical_name(n, master_peft): t for n, t in _named_tensors(master)}
    done_prefixes = tuple(f"{n}." for n in done)
    for name, tensor in _named_tensors(rollout):
        if name.startswith(done_prefixes):
            continue
        source = master_tensors.get(canonical_name(name, rollout_peft))
        if source is None or source.shape != tensor.shape:  # a DTensor's shape is the full (global) shape
            found = "nothing" if source is None else f"shape {tuple(source.shape)}"
            raise KeyError(
                f"sync_weights: rollout tensor {name!r} {tuple(tensor.shape)} has no master counterpart (found {found})"
            )
        tensor.copy_(full(source.detach()))
