"""FP4Linear (emulated W4A4), the FP4 rollout copy of a model (quantize_model) and its in-place weight sync.

EMULATION: weights are stored dequantised (fp32 values that are exactly e2m1 codes times the format's scales) and
activations are quantised → dequantised in every forward, then an fp32 matmul runs. This reproduces FP4 numerics
(what the rollout policy μ computes) on CPU and on Hopper, but it is slower than BF16 and uses more memory: a speedup
needs FP4 tensor cores (Blackwell, sm_100+), which we cannot measure here.

Formats (FORMATS, chosen once by name): "nvfp4" (16-blocks, e4m3 block scales, an fp32 scale per weight matrix and
per activation row; see nvfp4.py) and "mxfp4" (32-blocks, power-of-two e8m0 scales; see mxfp4.py). Blocks run along
K (in_features); a K that is not a multiple of the block gets a short last block (see e2m1.py).

As for FP8 (dllm_ais.fp8.walker, whose model walking and LoRA merging this module reuses): every block linear
is replaced, the LM head (`get_output_embeddings()`), embeddings and norms stay in high precision, a peft LoRA layer
is merged on the fly, and `sync_weights(master, rollout)` requantises the master into the existing buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dllm_ais.families import family_of_model
from dllm_ais.fp8.linear import QuantizedLinear
from dllm_ais.fp8.sync import sync_weights
from dllm_ais.fp8.walker import effective_weight, quantized_copy

from .mxfp4 import MXFP4_BLOCK, fake_mxfp4
from .nvfp4 import NVFP4_BLOCK, fake_nvfp4_act, fake_nvfp4_weight


@dataclass(frozen=True)
class FP4Format:
    """One FP4 format as the emulated linear uses it."""

    block: int
    """Elements per scale block along K."""
    fake_weight: Callable[[torch.Tensor], torch.Tensor]
    """w [N, K] -> [N, K] fp32, quantised and dequantised."""
    fake_act: Callable[[torch.Tensor], torch.Tensor]
    """x [M, K] -> [M, K] fp32, quantised and dequantised dynamically (per forward)."""


FORMATS: dict[str, FP4Format] = {
    "nvfp4": FP4Format(NVFP4_BLOCK, fake_nvfp4_weight, fake_nvfp4_act),
    "mxfp4": FP4Format(MXFP4_BLOCK, fake_mxfp4, fake_mxfp4),
}


def check_format(fmt: str) -> None:
    """Raise ValueError, naming the known formats, if `fmt` is not one."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown FP4 format {fmt!r}; known formats: {', '.join(FORMATS)}")


class FP4Linear(QuantizedLinear):
    """y = fake_fp4(x) @ fake_fp4(W)^T + b, all in fp32 (an emulation of a W4A4 FP4 GEMM; inference only).

    Buffers: weight_dq [N, K] fp32 (the dequantised FP4 weight: e2m1 codes times scales, exactly); bias [N] fp32 or
    None. The output has the input's dtype.
    """

    keep_dtype = ("weight_dq", "bias")  # FP4 values times fp32 scales, held exactly: model.to(dtype) keeps fp32

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, fmt: str = "nvfp4",
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        check_format(fmt)
        if in_features < 1 or out_features < 1:
            raise ValueError(f"FP4Linear needs in_features, out_features >= 1, got {in_features}, {out_features}")
        self.in_features, self.out_features, self.fmt = in_features, out_features, fmt
        self.register_buffer("weight_dq", torch.zeros(out_features, in_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float32, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Module, fmt: str = "nvfp4") -> FP4Linear:
        """Quantise an nn.Linear, or a peft LoRA layer around one (adapters merged; the module is not modified)."""
        weight, bias = effective_weight(linear)
        layer = cls(weight.shape[1], weight.shape[0], bias is not None, fmt=fmt, device=weight.device)
        layer.load_weight_(weight, bias)
        return layer

    @torch.no_grad()
    def load_weight_(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Requantise weight [N, K] (and copy bias [N]) into the existing buffers, in place."""
        self._check_weight(weight, bias)
        self.weight_dq.copy_(FORMATS[self.fmt].fake_weight(weight.detach().to(self.weight_dq.device)))
        if bias is not None:
            self.bias.copy_(bias)

    @torch.no_grad()
    def load_rows_(self, offset: int, weight: torch.Tensor) -> None:
        """Requantise weight [n, K] into rows offset:offset+n, in place: a family's fused copy stacks several master
        linears in one FP4Linear (models/sdar/fused_fp8.py), each part quantised as its own matrix (NVFP4's tensor
        scale is the part's), so the fused rows equal the per-Linear copy's."""
        n = weight.shape[0]
        if weight.shape[1] != self.in_features or not 0 <= offset <= self.out_features - n:
            raise ValueError(f"rows {offset}:{offset + n} of width {weight.shape[1]} do not fit {self.extra_repr()}")
        weight = weight.detach().to(self.weight_dq.device)
        self.weight_dq[offset:offset + n].copy_(FORMATS[self.fmt].fake_weight(weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] in x.dtype."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected input [..., {self.in_features}], got {tuple(x.shape)}")
        xq = FORMATS[self.fmt].fake_act(x.reshape(-1, self.in_features))  # [M, K] fp32
        y = xq @ self.weight_dq.t()  # [M, N] fp32
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fmt={self.fmt!r} (emulated)")


@torch.no_grad()
def quantize_model(model: nn.Module, fmt: str = "nvfp4", exclude: Callable[[str], bool] | None = None) -> nn.Module:
    """Return an emulated-FP4 rollout COPY of `model` (eval mode, requires_grad off); `model` is untouched.

    Layer selection as dllm_ais.fp8.quantize.quantize_model: every nn.Linear / LoRA-wrapped nn.Linear except the LM head
    and `exclude`d canonical names becomes an FP4Linear in format `fmt` ("nvfp4" or "mxfp4"). A model of a family
    with a fused FP4 copy (dllm_ais/families.py `fp4_copy`: SDAR's, models/sdar/fused_fp8.py) gets that copy instead,
    unless `exclude` is given.
    """
    check_format(fmt)
    family = family_of_model(model)  # a family with a fused FP4 copy builds it (None: `model` is not its master)
    if exclude is None and family is not None and family.fp4_copy is not None:
        copy = family.fp4_copy(model, lambda k, n, device, name: FP4Linear(k, n, fmt=fmt, device=device))
        if copy is not None:
            return copy
    return quantized_copy(model, lambda name, module: FP4Linear.from_linear(module, fmt), exclude)


__all__ = ["FORMATS", "FP4Format", "FP4Linear", "check_format", "quantize_model", "sync_weights"]
