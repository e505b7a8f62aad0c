"""FP8Linear: a linear layer held as blockwise e4m3 codes + fp32 scales, activations quantised on the fly.

The rollout policy μ is a copy of the BF16 master in which every block nn.Linear is an FP8Linear (fp8/quantize.py
builds it; an LLaDA master gets the fused copy of models/llada/fused_fp8.py, whose four linears per block are FP8Linears
too). After every optimizer step fp8/sync.py requantises the master's weights into the existing buffers in place
(`load_weight_`), so the copy's memory never moves (CUDA graphs and cached pointers stay valid). How a layer
multiplies is its backend (fp8/backends.py), chosen once by name.

Layer shapes: in_features and out_features must be multiples of 16 for every backend (torch._scaled_mm's requirement,
and 16-byte-aligned fp8 rows for the GEMMs), so the set of quantisable layers does not depend on the backend. Ragged
multiples of 16 (not of 128) are fine: the 128-blocks use masked tails (see quant.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from . import backends, quant
from .backends import BACKENDS, FP8BackendError, check_backend, pick_auto
from .quant import FP8_DTYPE, num_blocks
from .walker import base_linear, effective_weight

ALIGN = 16  # in_features and out_features must be multiples of this


class FP8LayerError(ValueError):
    """A linear layer cannot be quantised (its shape does not fit the FP8 layout)."""


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
    if w.is_cuda and backends._unavailable("triton", w.device) is None:
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


QUANTIZE_INTO = {"block": _quantize_block_into, "row": _quantize_row_into}
"""Weight scheme -> quantise w [N, K] into existing codes / scales buffers, in place (FusedLLaDA writes slices)."""


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
        base = base_linear(linear)
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
        QUANTIZE_INTO[self.scheme](weight.detach().to(self.weight_q.device), self.weight_q, self.weight_scale)
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
        return y if y.dtype == dtype else y.to(dtype)  # no dispatch when the GEMM already wrote `dtype`

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"backend={self.backend!r}, scheme={self.scheme!r}"
        )


# ----------------------------------------------------------------------------------------------------------------------
# `auto` resolved for a whole rollout copy, at build time

DEFAULT_EXPECTED_M = 8 * 4 * 320
"""Rows per rollout forward `auto` times for when the caller gives none: 8 prompts × 4 generations × a 320-token
canvas (a 64-token prompt + 256 generated), a typical GPU rollout batch; the power-of-two bucket is what matters."""


@torch.no_grad()
def resolve_auto(rollout: nn.Module, expected_m: int | None = None, kind: str = "forward") -> dict[str, str]:
    """Set every FP8Linear of `rollout` whose backend is "auto" to `auto`'s choice for its (N, K) at `expected_m`
    rows (DEFAULT_EXPECTED_M if None; timed now where not cached; CPU: torch). kind "gemm" for a copy fed
    producer-quantised activations (the fused LLaDA copy), "forward" otherwise. Returns layer name -> backend of the
    layers it resolved. Raises FP8BackendError inside torch.compile (resolve before compiling)."""
    m = expected_m or DEFAULT_EXPECTED_M
    chosen: dict[str, str] = {}
    for name, layer in rollout.named_modules():
        if isinstance(layer, FP8Linear) and layer.backend == "auto":
            layer.backend = pick_auto(kind, layer.out_features, layer.in_features, m, layer.weight_q.device)
            chosen[name] = layer.backend
    return chosen


def backend_choices(rollout: nn.Module) -> dict[str, str]:
    """"{out_features}x{in_features}" -> backend, for every FP8Linear shape of a rollout copy (after `auto` was
    resolved, so each shape runs one concrete backend): small enough for a run's config / metrics. Empty without FP8
    layers."""
    return {f"{m.out_features}x{m.in_features}": m.backend for m in rollout.modules() if isinstance(m, FP8Linear)}
