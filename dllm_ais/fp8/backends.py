"""FP8 GEMM backends: how an FP8Linear multiplies, where each one runs, and `auto`'s choice among them.

Backends (one interface, chosen once by name from BACKENDS; inference only, no autograd):
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
              The default on sm_90 (DESIGN.md §7: the fastest FP8 GEMM measured on an H100).
  "auto"      resolved when a rollout copy is built (`resolve_auto`): per (device, N, K, M bucket) the fastest
              available block backend (cublas, triton, torchao), timed eagerly once for an expected M given at build
              time, cached (auto_choices()), and written into each layer, so no layer runs "auto" afterwards. cublas
              is kept unless another candidate is clearly faster (AUTO_MARGIN). CPU: "torch". A layer still on "auto"
              at run time (an FP8Linear made by hand) picks on its first eager call; never inside torch.compile or
              CUDA-graph capture (that raises, naming the fix).

Each backend is `forward` = quantise x + `gemm`, where `gemm(xq, xs, layer)` takes activations that a producer
kernel already quantised (FP8Linear.forward_quantized; the fused LLaDA rollout copy calls it after RMSNorm→quant,
SiLU·up→quant and attention-output→quant); scaled_mm's gemm takes row scales [M, 1] (row producers). Producers emit
1×128 scales as [M, G] with stride (1, M) (producer_kernels.empty_act_scales), the layout cuBLAS's blockwise mode
consumes as is and the Triton GEMM reads contiguously; torchao reads [M, G] row-major and gets a copy. The Triton
paths go through the torch.library ops of ops.py, so torch.compile traces them without a graph break.

`layer` below is anything with weight_q [N, K] e4m3, weight_scale, bias, in_features, out_features (an FP8Linear;
typed as FP8Layer).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Protocol

import torch

from . import quant
from .eager import eager_or_op
from .quant import FP8_DTYPE


class FP8Layer(Protocol):
    """What a backend reads of a layer (an FP8Linear; this module does not import linear.py, which imports it)."""

    weight_q: torch.Tensor  # [N, K] e4m3
    weight_scale: torch.Tensor  # [ceil(N/128), ceil(K/128)] ("block") or [N, 1] ("row") fp32
    bias: torch.Tensor | None  # [N] or None
    in_features: int
    out_features: int


class FP8BackendError(ValueError):
    """The FP8 backend name is unknown or the backend cannot run on the tensors' device."""


# ----------------------------------------------------------------------------------------------------------------------
# sibling gemm / forward functions: x [M, K] -> y [M, N] (fp32 or bf16; FP8Linear casts to x.dtype)


def _gemm_torch(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    return quant.fp8_gemm_reference(xq, xs, layer.weight_q, layer.weight_scale, out_dtype=torch.float32)


def _gemm_triton(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Layer, out_dtype: torch.dtype) -> torch.Tensor:
    from . import ops

    return ops.fp8_gemm(xq, xs, layer.weight_q, layer.weight_scale, out_dtype)


def _gemm_triton_bf16(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    """bf16 out unless the layer has a bias (added in fp32 by FP8Layer)."""
    return _gemm_triton(xq, xs, layer, torch.bfloat16 if layer.bias is None else torch.float32)


def _gemm_torchao(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    from . import ops

    return ops.torchao_gemm(xq, xs, layer.weight_q, layer.weight_scale)  # [M, N] bf16


def _quantize_act_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from . import ops

    return ops.quantize_act(x)


def _forward_torch(x: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    return _gemm_torch(*quant.quantize_act(x), layer)  # x [M, K] -> [M, K], [M, G] -> [M, N]


def _forward_triton(x: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    out_dtype = torch.bfloat16 if x.dtype == torch.bfloat16 and layer.bias is None else torch.float32
    return _gemm_triton(*_quantize_act_triton(x), layer, out_dtype)


def _gemm_scaled_mm(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    """xq [M, K] e4m3, ROW scales xs [M, 1] fp32 -> y [M, N] bf16."""
    w_t, ws_t = layer.weight_q.t(), layer.weight_scale.t()  # [K, N] column-major, [1, N]
    return torch._scaled_mm(xq, w_t, scale_a=xs, scale_b=ws_t, out_dtype=torch.bfloat16)


def _forward_scaled_mm(x: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    return _gemm_scaled_mm(*quant.quantize_rowwise(x), layer)  # [M, K], [M, 1] -> [M, N]


def _forward_torchao(x: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    return _gemm_torchao(*_quantize_act_triton(x), layer)


def outer_dim_major(xs: torch.Tensor) -> torch.Tensor:
    """Activation scales [M, G] in the layout cuBLAS's 1×128 mode requires: stride (1, M) (a copy only if needed)."""
    M, G = xs.shape
    if xs.stride(0) == 1 and (G <= 1 or xs.stride(1) == M):
        return xs
    return xs.new_empty(G, M).t().copy_(xs)  # explicit strides (1, M), also for M == 1


def quantize_act_block(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (codes [M, K], K-major scales [M, G]): the Triton kernel where it runs, else the torch twin."""
    if _unavailable("triton", x.device) is None:
        from . import kernels

        return kernels.quantize_act(x)
    xq, xs = quant.quantize_act(x)
    return xq, outer_dim_major(xs)


def _cublas_fits(layer: FP8Layer) -> bool:
    """cuBLAS's blockwise mode wants whole 128-blocks: scale shapes [M, K/128] and [N/128, K/128] exactly."""
    return layer.in_features % quant.BLOCK == 0 and layer.out_features % quant.BLOCK == 0


_CUBLAS_DECIDED: dict[tuple[str, int, int, int], bool] = {}  # (device, M, N, K) -> cuBLAS blockwise accepts it


def _tracing() -> bool:
    """Inside torch.compile tracing or CUDA-graph capture: no probe may run, no decision may change."""
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def cublas_accepts(m: int, n: int, k: int, device: torch.device | str) -> bool:
    """Whether cuBLAS's blockwise mode runs x [M, K] @ W[N, K]^T on `device` (N, K whole 128-blocks). Decided once per
    (device, M, N, K) by an eager probe call on zero operands of exactly that shape, then recorded
    (cublas_decisions()). The blockwise mode's constraints on M are not documented, so the device is asked.
    Raises FP8BackendError when asked for an undecided shape inside torch.compile / CUDA-graph capture."""
    device = torch.device(device)
    key = (str(device), m, n, k)
    if key in _CUBLAS_DECIDED:
        return _CUBLAS_DECIDED[key]
    if _tracing():
        raise FP8BackendError(
            f"cublas backend: shape M, N, K = {(m, n, k)} was not decided before compiling; call "
            "prepare_gemm_shapes(model, rows) eagerly first (diffusion_sample does this for its own shapes)."
        )
    if _unavailable("cublas", device) is not None:
        _CUBLAS_DECIDED[key] = False
        return False
    try:  # a probe: any failure means "not at this shape"
        xq = torch.zeros(m, k, dtype=FP8_DTYPE, device=device)
        wq = torch.zeros(n, k, dtype=FP8_DTYPE, device=device)
        xs = outer_dim_major(torch.ones(m, k // quant.BLOCK, dtype=torch.float32, device=device))
        ws = torch.ones(n // quant.BLOCK, k // quant.BLOCK, dtype=torch.float32, device=device)
        torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        accepted = True
    except RuntimeError as e:
        warnings.warn(f"cublas backend: torch._scaled_mm rejects M, N, K = {(m, n, k)} on {device} "
                      f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); that shape runs the Triton GEMM "
                      "(cublas_decisions() lists every decision)", stacklevel=2)  # fmt: skip
        accepted = False
    _CUBLAS_DECIDED[key] = accepted
    return accepted


def cublas_decisions() -> dict[tuple[str, int, int, int], bool]:
    """Every recorded (device, M, N, K) -> whether cuBLAS's blockwise mode runs it (a copy)."""
    return dict(_CUBLAS_DECIDED)


def cublas_fallbacks() -> set[tuple[str, int, int, int]]:
    """(device, M, N, K) shapes that cuBLAS's blockwise mode rejected, which run the Triton GEMM instead."""
    return {key for key, ok in _CUBLAS_DECIDED.items() if not ok}


def prepare_gemm_shapes(model: torch.nn.Module, rows: Iterable[int]) -> dict[str, list[int]]:
    """Decide now, eagerly, for every cublas FP8Linear of `model` and each activation row count M in `rows`, whether
    cuBLAS's blockwise mode takes the shape (cublas_accepts), and record the accepted M on the layer
    (`layer.cublas_rows`), so a compiled step only reads that record and never probes or catches anything.
    Returns "NxK" -> the rejected M of that layer shape (empty lists when every M is accepted)."""
    rows = sorted({int(m) for m in rows if int(m) > 0})
    rejected: dict[str, list[int]] = {}
    for layer in model.modules():
        if getattr(layer, "backend", None) != "cublas" or not hasattr(layer, "weight_q"):
            continue
        n, k = layer.out_features, layer.in_features
        bad = rejected.setdefault(f"{n}x{k}", [])
        if not _cublas_fits(layer):
            continue
        ok = {m for m in rows if cublas_accepts(m, n, k, layer.weight_q.device)}
        bad.extend(m for m in rows if m not in ok and m not in bad)
        layer.cublas_rows = frozenset(getattr(layer, "cublas_rows", frozenset()) | ok)
    return rejected


def _cublas_blockwise_gemm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """cuBLAS's blockwise FP8 GEMM: xq [M, K] e4m3, xs [M, K/128] fp32 (any layout), wq [N, K] e4m3, ws [N/128, K/128]
    -> [M, N] bf16, through torch._scaled_mm with 1×128 / 128×128 scales. A custom op, so torch.compile calls it as
    one opaque kernel: inductor never lowers or autotunes _scaled_mm with blockwise scales (torch 2.11's autotuner
    failed building that call's meta on an H200 — benchmarks/gpu/nvidia-h200-20261126-quick)."""
    return torch._scaled_mm(xq, wq.t(), scale_a=outer_dim_major(xs), scale_b=ws.t(), out_dtype=torch.bfloat16)


cublas_blockwise_gemm_op = torch.library.custom_op("dllm_ais::cublas_blockwise_gemm", _cublas_blockwise_gemm,
                                                   mutates_args=())
cublas_blockwise_gemm = eager_or_op(cublas_blockwise_gemm_op, _cublas_blockwise_gemm)
"""The op while torch.compile traces; eagerly, torch._scaled_mm directly (no custom-op dispatch: fp8/eager.py)."""


@cublas_blockwise_gemm_op.register_fake
def _(xq, xs, wq, ws):
    return xq.new_empty((xq.shape[0], wq.shape[0]), dtype=torch.bfloat16)


def _gemm_cublas(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    """xq [M, K] e4m3, xs [M, G] fp32 (either layout; producers emit stride (1, M), passed as is) -> y [M, N] bf16 via
    torch._scaled_mm's blockwise mode.

    Whether cuBLAS takes (M, N, K) is decided eagerly and recorded, never by catching an error inside a compiled step:
    M in `layer.cublas_rows` (prepare_gemm_shapes, before compiling) runs cuBLAS; eagerly, an undecided M is probed
    once (cublas_accepts) and recorded on the layer. Layers that are not whole 128-blocks, rejected shapes, and (inside
    torch.compile) shapes nobody prepared run the Triton GEMM, which takes every shape."""
    m = xq.shape[0]
    if _cublas_fits(layer):
        use = m in getattr(layer, "cublas_rows", ())
        if not use and not _tracing() and cublas_accepts(m, layer.out_features, layer.in_features, xq.device):
            layer.cublas_rows = frozenset(getattr(layer, "cublas_rows", frozenset()) | {m})
            use = True
        if use:
            return cublas_blockwise_gemm(xq, xs, layer.weight_q, layer.weight_scale)
    from . import kernels

    return kernels.fp8_gemm(xq, xs, layer.weight_q, layer.weight_scale)


def _forward_cublas(x: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    return _gemm_cublas(*quantize_act_block(x), layer)


# ----------------------------------------------------------------------------------------------------------------------
# auto: timed once per (kind, device, N, K, M bucket), eagerly


AUTO_CANDIDATES = ("cublas", "triton", "torchao")  # "block" backends sharing FP8Linear's buffers; cublas preferred
AUTO_MARGIN = 0.9  # another candidate replaces the first available one only when it takes < 90% of its time
_AUTO_CHOICES: dict[tuple[str, str, int, int, int], str] = {}


def auto_choices() -> dict[tuple[str, str, int, int, int], str]:
    """What `auto` picked so far: (kind "forward" | "gemm", device, N, K, M bucket) -> backend name (a copy)."""
    return dict(_AUTO_CHOICES)


def clear_auto_choices() -> None:
    """Forget every `auto` choice (the next call per shape times the candidates again)."""
    _AUTO_CHOICES.clear()


def m_bucket(m: int) -> int:
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


def _choose(times: dict[str, float]) -> str:
    """The first candidate (in AUTO_CANDIDATES order) unless another is faster than AUTO_MARGIN × its time."""
    first = next(name for name in AUTO_CANDIDATES if name in times)
    fastest = min(times, key=times.__getitem__)
    return fastest if times[fastest] < AUTO_MARGIN * times[first] else first


def _auto_pick(kind: str, layer: FP8Layer, m: int, device: torch.device, run: Callable[[str], object]) -> str:
    """The cached choice for (kind, device, N, K, M bucket); on a miss time `run(name)` for each available candidate
    (those with a `gemm` when kind == "gemm") and keep the best (_choose). CPU: always "torch"."""
    key = (kind, str(device), layer.out_features, layer.in_features, m_bucket(m))
    choice = _AUTO_CHOICES.get(key)
    if choice is not None:
        return choice
    if device.type != "cuda":
        _AUTO_CHOICES[key] = "torch"
        return "torch"
    if torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling():
        raise FP8BackendError(
            f"FP8 backend 'auto' has not timed shape N={key[2]}, K={key[3]}, M bucket {key[4]} yet and cannot time it "
            "inside CUDA-graph capture or torch.compile: build the rollout copy with quantize_model(..., "
            "expected_m=...) (it resolves 'auto' eagerly), or pick a backend (--fp8-backend cublas)."
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
    _AUTO_CHOICES[key] = _choose(times)
    return _AUTO_CHOICES[key]


def _forward_auto(x: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    name = _auto_pick("forward", layer, x.shape[0], x.device, lambda b: BACKENDS[b].forward(x, layer))
    return BACKENDS[name].forward(x, layer)


def _gemm_auto(xq: torch.Tensor, xs: torch.Tensor, layer: FP8Layer) -> torch.Tensor:
    name = _auto_pick("gemm", layer, xq.shape[0], xq.device, lambda b: BACKENDS[b].gemm(xq, xs, layer))
    return BACKENDS[name].gemm(xq, xs, layer)


def pick_auto(kind: str, n: int, k: int, m: int, device: torch.device | str) -> str:
    """`auto`'s backend for a [N, K] layer fed M rows on `device`, timed now on synthetic operands if not cached.

    kind "gemm": the layer is fed producer-quantised activations (fused rollout copy); "forward": bf16 activations.
    Raises FP8BackendError inside torch.compile / CUDA-graph capture (time before compiling)."""
    device = torch.device(device)
    layer = SimpleNamespace(in_features=k, out_features=n, bias=None)
    if device.type == "cuda" and (kind, str(device), n, k, m_bucket(m)) not in _AUTO_CHOICES:
        g = torch.Generator(device=device).manual_seed(0)
        w = torch.randn(n, k, device=device, generator=g, dtype=torch.bfloat16)
        layer.weight_q, layer.weight_scale = quant.quantize_weight(w)
        x = torch.randn(m, k, device=device, generator=g, dtype=torch.bfloat16)
        xq, xs = quantize_act_block(x)
        if kind == "gemm":
            return _auto_pick(kind, layer, m, device, lambda b: BACKENDS[b].gemm(xq, xs, layer))
        return _auto_pick(kind, layer, m, device, lambda b: BACKENDS[b].forward(x, layer))
    return _auto_pick(kind, layer, m, device, lambda b: None)


def default_backend(device: torch.device | str) -> str:
    """The backend a rollout copy on `device` should use when the user names none: cublas where it runs (sm_90+),
    else triton where it runs (CUDA sm_89+), else the torch reference."""
    device = torch.device(device)
    if device.type == "cuda":
        for name in ("cublas", "triton"):
            if _unavailable(name, device) is None:
                return name
    return "torch"


# ----------------------------------------------------------------------------------------------------------------------
# availability


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
    from . import ops

    try:
        ops.torchao_blockwise_gemm()
    except ImportError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class Backend:
    """One way to run an FP8Linear."""

    forward: Callable[[torch.Tensor, FP8Layer], torch.Tensor]
    """x [M, K] -> y [M, N] (fp32 or bf16): quantise x, then `gemm` (or the backend's own scheme)."""
    gemm: Callable[[torch.Tensor, torch.Tensor, FP8Layer], torch.Tensor] | None
    """(xq [M, K] e4m3, xs fp32, layer) -> y [M, N] from activations a producer already quantised in the backend's
    scheme: xs [M, ceil(K/128)] for "block" (any strided view; producers emit stride (1, M)), [M, 1] for "row".
    None for a backend that cannot take pre-quantised activations (the fused model then feeds it bf16)."""
    scheme: str
    """"block": 1×128 activation / 128×128 weight scales; "row": per-row activation / per-output-channel weight."""
    unavailable: Callable[[torch.device], str | None]
    """Why this backend cannot run on a device, or None when it can."""


BACKENDS: dict[str, Backend] = {
    "torch": Backend(_forward_torch, _gemm_torch, "block", _torch_unavailable),
    "triton": Backend(_forward_triton, _gemm_triton_bf16, "block", _triton_unavailable),
    "scaled_mm": Backend(_forward_scaled_mm, _gemm_scaled_mm, "row", _scaled_mm_unavailable),
    "torchao": Backend(_forward_torchao, _gemm_torchao, "block", _torchao_unavailable),
    "cublas": Backend(_forward_cublas, _gemm_cublas, "block", _cublas_unavailable),
    "auto": Backend(_forward_auto, _gemm_auto, "block", _auto_unavailable),
}


@functools.cache
def _unavailable(backend: str, device: torch.device) -> str | None:
    if device.type == "meta":  # shape-only tensors (traffic counting, scripts/fp8_traffic.py): nothing runs
        return None
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


PRODUCERS = ("triton", "torch")
"""Producer implementations of a family's fused rollout copy (models/<family>/fused_fp8.py): the Triton kernels
(producer_kernels.py through ops.py; CUDA, or CPU under TRITON_INTERPRET=1) or their torch twins (producers.py)."""


def default_producers(device: torch.device | str) -> str:
    """"triton" on a CUDA GPU where the Triton FP8 kernels run (sm_89+: the fast path with every GEMM backend),
    "torch" elsewhere (CPU: the twins; the Triton producers run there only under TRITON_INTERPRET=1, when asked)."""
    device = torch.device(device)
    return "triton" if device.type == "cuda" and _unavailable("triton", device) is None else "torch"
