"""Blockwise FP8 (e4m3) rollouts: reference quantisation (quant), GEMM backends (backends), FP8Linear (linear), the
model walker (walker), the rollout copy (quantize: quantize_model; a family's fused copy, e.g.
models/llada/fused_fp8.py, through its registry record) and its weight sync (sync, fused_sync).

Layers import downward only: quant <- kernels, producer_kernels <- ops <- backends <- walker, linear <- fused_sync
<- (a family's fused_fp8.py) <- quantize, sync. The Triton kernels live in `dllm_ais.fp8.kernels` and are imported
only when a Triton path runs, so importing this package never imports Triton.
"""

from __future__ import annotations

from .backends import (
    BACKENDS,
    FP8BackendError,
    available_backends,
    check_backend,
    default_backend,
    prepare_gemm_shapes,
    unavailable_reason,
)
from .linear import FP8LayerError, FP8Linear, backend_choices
from .quant import (
    dequantize_act,
    dequantize_weight,
    fp8_gemm_reference,
    quantize_act,
    quantize_rowwise,
    quantize_weight,
)
from .quantize import quantize_model
from .sync import sync_weights

__all__ = [
    "BACKENDS",
    "FP8BackendError",
    "FP8LayerError",
    "FP8Linear",
    "available_backends",
    "backend_choices",
    "check_backend",
    "default_backend",
    "dequantize_act",
    "dequantize_weight",
    "fp8_gemm_reference",
    "prepare_gemm_shapes",
    "quantize_act",
    "quantize_model",
    "quantize_rowwise",
    "quantize_weight",
    "sync_weights",
    "unavailable_reason",
]
