"""Blockwise-scaled FP8 GEMM: Triton kernel vs the dequantising torch reference, and vs the exact fp32 product.

Under the Triton interpreter on CPU at small shapes; a larger case runs only on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from dllm_ais.fp8 import quant

kernels = pytest.importorskip("dllm_ais.fp8.kernels", reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SNR_FLOOR_DB = 24.0  # FP8 W8A8 (1×128 / 128×128) vs the exact fp32 product: measured 25.8 dB (M=1) to 29.8 dB


def snr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    return 10 * torch.log10(ref.pow(2).sum() / (ref - approx).pow(2).sum()).item()


def _operands(M: int, N: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.logspace(-1, 1, K)  # channel magnitudes vary (as in LLM activations)
    w = torch.randn(N, K, generator=g) * 0.05
    return x.to(DEVICE), w.to(DEVICE)


def _assert_matches_reference(y: torch.Tensor, ref: torch.Tensor) -> None:
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < 1e-5, rel
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize(
    ("M", "N", "K"),
    [(1, 16, 16), (33, 48, 200), (64, 128, 256), (130, 144, 384), (7, 272, 129), (100, 32, 1000)],
)
def test_gemm_matches_dequantised_reference(M, N, K):
    x, w = _operands(M, N, K, seed=M + N + K)
    xq, xs = quant.quantize_act(x)
    wq, ws = quant.quantize_weight(w)
    y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32)
    ref = quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32)
    assert y.shape == (M, N) and y.dtype == torch.float32
    _assert_matches_reference(y, ref)
    assert snr_db(x @ w.T, y) > SNR_FLOOR_DB


@pytest.mark.parametrize(("block_m", "block_n"), [(16, 32), (32, 64), (64, 128)])
def test_gemm_tiles_smaller_than_a_weight_block(block_m, block_n):
    """Several column tiles share one 128-row weight block; ragged M and N end mid-tile."""
    x, w = _operands(45, 160, 200, seed=7)
    xq, xs = quant.quantize_act(x)
    wq, ws = quant.quantize_weight(w)
    y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32, block_m=block_m, block_n=block_n)
    _assert_matches_reference(y, quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32))


def test_bf16_output_is_the_fp32_result_rounded_to_nearest_even():
    """The kernel's own bf16 rounding (the interpreter truncates fp32 -> bf16 casts) equals torch's RNE cast."""
    x, w = _operands(40, 160, 256, seed=3)
    xq, xs = quant.quantize_act(x)
    wq, ws = quant.quantize_weight(w)
    y32 = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32)
    y16 = kernels.fp8_gemm(xq, xs, wq, ws)
    assert y16.dtype == torch.bfloat16
    assert torch.equal(y16, y32.to(torch.bfloat16))


def test_gemm_with_zero_blocks_and_kernel_quantised_operands():
    x, w = _operands(20, 256, 384, seed=5)
    x[:, 128:256] = 0.0  # zero activation groups (scale 1, codes 0)
    w[128:, :] = 0.0  # zero weight blocks
    xq, xs = kernels.quantize_act(x)
    wq, ws = kernels.quantize_weight(w)
    y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32)
    _assert_matches_reference(y, quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32))
    assert not y[:, 128:].any()


def test_gemm_shape_checks():
    x, w = _operands(8, 32, 64, seed=1)
    xq, xs = quant.quantize_act(x)
    wq, ws = quant.quantize_weight(w)
    with pytest.raises(ValueError, match="inner dimensions"):
        kernels.fp8_gemm(xq, xs, wq[:, :48].contiguous(), ws)
    with pytest.raises(ValueError, match="xs must be float32 of shape"):
        kernels.fp8_gemm(xq, xs[:4], wq, ws)
    with pytest.raises(ValueError, match="ws must be float32 of shape"):
        kernels.fp8_gemm(xq, xs, wq, ws.double())
    with pytest.raises(ValueError, match="xq must be a 2-D"):
        kernels.fp8_gemm(x, xs, wq, ws)
    with pytest.raises(ValueError, match="out_dtype"):
        kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="block_n must divide"):
        kernels.fp8_gemm(xq, xs, wq, ws, block_n=96)
    assert kernels.fp8_gemm(xq[:0], xs[:0], wq, ws).shape == (0, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton, autotuned configs)")
def test_gemm_gpu_llada_like_shape():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tl.dot needs compute capability >= 8.9")
    x, w = _operands(1024, 4096, 4096, seed=9)
    x = x.bfloat16()
    xq, xs = kernels.quantize_act(x)
    wq, ws = kernels.quantize_weight(w.bfloat16())
    y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32)
    _assert_matches_reference(y, quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32))
    assert snr_db(x.float() @ w.T, y) > SNR_FLOOR_DB
