"""Blockwise FP8 (e4m3) rollouts: reference quantisation (quant), FP8Linear / quantize_model / sync_weights (linear).

The Triton kernels live in `dllm_ais.fp8.kernels` and are imported only when a Triton path runs, so importing this
package never imports Triton.
"""

from __future__ import annotations

from .linear import (
    BACKENDS,
    FP8BackendError,
    FP8LayerError,
    FP8Linear,
    available_backends,
    check_backend,
    quantize_model,
    sync_weights,
    unavailable_reason,
)
from .quant import (
    dequantize_act,
    dequantize_weight,
    fp8_gemm_reference,
    quantize_act,
    quantize_rowwise,
    quantize_weight,
)

__all__ = [
    "BACKENDS",
    "FP8BackendError",
    "FP8LayerError",
    "FP8Linear",
    "available_backends",
    "check_backend",
    "dequantize_act",
    "dequantize_weight",
    "fp8_gemm_reference",
    "quantize_act",
    "quantize_model",
    "quantize_rowwise",
    "quantize_weight",
    "sync_weights",
    "unavailable_reason",
]
