"""FP4 rollouts, emulated: NVFP4 and MXFP4 quantise → dequantise references (e2m1, nvfp4, mxfp4) and the W4A4
FP4Linear / quantize_model / sync_weights (linear).

This is an emulation on CPU and Hopper (fp32 matmuls over dequantised values): it reproduces FP4 numerics, not FP4
speed. A speedup needs FP4 tensor cores (Blackwell), which we cannot measure.
"""

from __future__ import annotations

from .e2m1 import E2M1_MAX, E2M1_VALUES, round_to_e2m1
from .linear import FORMATS, FP4Format, FP4Linear, check_format, quantize_model, sync_weights
from .mxfp4 import MXFP4_BLOCK, fake_mxfp4, mxfp4_dequantize, mxfp4_quantize, mxfp4_scale_exponent
from .nvfp4 import (
    NVFP4_BLOCK,
    fake_nvfp4_act,
    fake_nvfp4_weight,
    nvfp4_dequantize,
    nvfp4_quantize,
    nvfp4_tensor_scale,
    round_to_e4m3,
)

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "FORMATS",
    "FP4Format",
    "FP4Linear",
    "MXFP4_BLOCK",
    "NVFP4_BLOCK",
    "check_format",
    "fake_mxfp4",
    "fake_nvfp4_act",
    "fake_nvfp4_weight",
    "mxfp4_dequantize",
    "mxfp4_quantize",
    "mxfp4_scale_exponent",
    "nvfp4_dequantize",
    "nvfp4_quantize",
    "nvfp4_tensor_scale",
    "quantize_model",
    "round_to_e2m1",
    "round_to_e4m3",
    "sync_weights",
]
