"""The FP8 kernels as torch.library ops, so torch.compile of a rollout forward traces them without a graph break.

The producer kernels (producer_kernels.py, row_producer_kernels.py) are `triton_op`s launched through `wrap_triton`:
the compiler sees into them. The blockwise GEMM and the activation quantiser are called here only through their
public Python functions (`kernels.fp8_gemm`, `kernels.quantize_act`: they choose tiles, autotune and check layouts),
which wrap_triton cannot look through, so they are `custom_op`s with a fake (meta) implementation giving the output's
shape, dtype and strides; torchao's blockwise GEMM likewise. Each public function calls its op only while something
traces (torch.compile, a TorchDispatchMode) and the kernel's Python function directly otherwise (fp8/eager.py).
Importing this module imports Triton (backends.py imports it lazily, inside the functions that run a Triton path;
this module imports nothing above the kernels).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch

from . import kernels
from .eager import eager_or_op
from .producer_kernels import attn_out_quant, empty_act_scales, qk_norm_rope, rmsnorm_quant, rope, silu_mul_quant
from .quant import FP8_DTYPE, num_blocks
from .row_producer_kernels import attn_out_rowquant, rmsnorm_rowquant, silu_mul_rowquant

__all__ = [
    "attn_out_quant", "attn_out_rowquant", "fp8_gemm", "qk_norm_rope", "quantize_act", "rmsnorm_quant",
    "rmsnorm_rowquant", "rope",
    "silu_mul_quant", "silu_mul_rowquant", "torchao_blockwise_gemm", "torchao_gemm",
]


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


def _fp8_gemm(
    xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """kernels.fp8_gemm: xq [M, K] e4m3, xs [M, G] fp32 (any layout it accepts), wq [N, K], ws [NB, G] -> [M, N]."""
    return kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=out_dtype)


fp8_gemm_op = torch.library.custom_op("dllm_ais::fp8_gemm", _fp8_gemm, mutates_args=())
fp8_gemm = eager_or_op(fp8_gemm_op, _fp8_gemm)


@fp8_gemm_op.register_fake
def _(xq, xs, wq, ws, out_dtype):
    return xq.new_empty((xq.shape[0], wq.shape[0]), dtype=out_dtype)


def _quantize_act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels.quantize_act on x [M, K] -> (codes [M, K] e4m3, scales [M, ceil(K/128)] fp32)."""
    q, s = kernels.quantize_act(x.reshape(-1, x.shape[-1]))
    return q, s


quantize_act_op = torch.library.custom_op("dllm_ais::quantize_act", _quantize_act, mutates_args=())
quantize_act = eager_or_op(quantize_act_op, _quantize_act)


@quantize_act_op.register_fake
def _(x):
    M, K = x.numel() // x.shape[-1], x.shape[-1]
    return x.new_empty((M, K), dtype=FP8_DTYPE), empty_act_scales(M, num_blocks(K), x.device)


def _torchao_gemm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """torchao's blockwise_fp8_gemm (it reads xs as [M, G] row-major) -> [M, N] bf16."""
    return torchao_blockwise_gemm()(xq, xs.contiguous(), wq, ws)


torchao_gemm_op = torch.library.custom_op("dllm_ais::torchao_gemm", _torchao_gemm, mutates_args=())
torchao_gemm = eager_or_op(torchao_gemm_op, _torchao_gemm)


@torchao_gemm_op.register_fake
def _(xq, xs, wq, ws):
    return xq.new_empty((xq.shape[0], wq.shape[0]), dtype=torch.bfloat16)
