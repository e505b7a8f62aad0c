"""Blockwise-scaled FP8 GEMM: Triton kernel vs the dequantising torch reference, and vs the exact fp32 product.

Under the Triton interpreter on CPU at small shapes (every code path the GPU compiles, except autotuning: pinned
tiles incl. 128×256, the persistent tile loop, the TMA-descriptor loads, both activation-scale layouts); a larger case
and the autotuned / TMA-vs-pointer comparisons run only on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from dllm_ais.fp8 import quant

kernels = pytest.importorskip("dllm_ais.fp8.kernels", reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SNR_FLOOR_DB = 24.0  # FP8 W8A8 (1×128 / 128×128) vs the exact fp32 product: measured 25.8 dB (M=1) to 29.8 dB

# Bound of the kernel (fp32 output) vs quant.fp8_gemm_reference, relative to the reference's norm / max |entry|.
# Interpreter: both sum exact fp8×fp8 products in fp32, only the summation order differs; measured ≤ 2e-7.
# Compiled on Hopper (sm_90): wgmma's FP8 path keeps a reduced-precision accumulator inside one tl.dot (DeepGEMM
# reports ~14 bits; DESIGN.md §7 measured 5.4e-5 … 1.2e-4 relative on an H100 against this reference). The kernel
# promotes every 128-wide K block's dot to an fp32 sum, so the error does not grow with K beyond one block's: 1e-3
# is 8× the worst measured value and still 50× below FP8 quantisation error itself (SNR 24 dB ≈ 6e-2 relative).
_COMPILED_FP8_ACCUMULATION = DEVICE == "cuda"
GEMM_REL_BOUND = 1e-3 if _COMPILED_FP8_ACCUMULATION else 1e-5


def snr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    return 10 * torch.log10(ref.pow(2).sum() / (ref - approx).pow(2).sum()).item()


def _operands(M: int, N: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.logspace(-1, 1, K)  # channel magnitudes vary (as in LLM activations)
    w = torch.randn(N, K, generator=g) * 0.05
    return x.to(DEVICE), w.to(DEVICE)


def _layout(xs: torch.Tensor, layout: str) -> torch.Tensor:
    """The same activation scales [M, G] stored contiguous or K-major (stride (1, M), what cuBLAS requires)."""
    return xs.contiguous() if layout == "contiguous" else xs.t().contiguous().t()


def _assert_matches_reference(y: torch.Tensor, ref: torch.Tensor) -> None:
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < GEMM_REL_BOUND, rel
    bound = GEMM_REL_BOUND
    torch.testing.assert_close(y, ref, rtol=bound, atol=bound * ref.abs().max().item())


@pytest.mark.parametrize("layout", ["contiguous", "k_major"])
@pytest.mark.parametrize(
    ("M", "N", "K"),
    [(1, 16, 16), (33, 48, 200), (64, 128, 256), (130, 144, 384), (7, 272, 129), (100, 32, 1000)],
)
def test_gemm_matches_dequantised_reference(M, N, K, layout):
    x, w = _operands(M, N, K, seed=M + N + K)
    xq, xs = quant.quantize_act(x)
    wq, ws = quant.quantize_weight(w)
    xs = _layout(xs, layout)
    y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32)
    ref = quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32)
    assert y.shape == (M, N) and y.dtype == torch.float32
    _assert_matches_reference(y, ref)
    assert snr_db(x @ w.T, y) > SNR_FLOOR_DB


@pytest.mark.parametrize(
    ("block_m", "block_n", "num_programs"),
    [(16, 32, None), (32, 64, None), (64, 128, None), (16, 256, None), (128, 256, None), (32, 64, 3), (128, 256, 1)],
)
def test_gemm_pinned_tiles_and_persistent_schedule(block_m, block_n, num_programs):
    """Tiles narrower than a weight block (several share one ws row), wider ones (128×256: each column reads its own
    block's scale), and the persistent loop (fewer programs than tiles). Ragged M, N and K end mid-tile."""
    x, w = _operands(45, 400, 200, seed=7)
    xq, xs = kernels.quantize_act(x)  # K-major scales
    wq, ws = quant.quantize_weight(w)
    # weight scales six decades apart from block to block: a wrong column -> weight-block mapping shows at once
    ws = ws * torch.logspace(-3, 3, ws.numel(), device=DEVICE).view_as(ws)
    y = kernels.fp8_gemm(
        xq, xs, wq, ws, out_dtype=torch.float32, block_m=block_m, block_n=block_n, num_programs=num_programs
    )
    _assert_matches_reference(y, quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32))


@pytest.mark.parametrize(("M", "N", "K"), [(33, 272, 208), (64, 256, 256)])
def test_gemm_tma_descriptor_path(M, N, K):
    """The TMA branch (tensor-descriptor loads, zero-filled out of bounds, no masks) — emulated by the interpreter."""
    reason = kernels.tma_unavailable(torch.device(DEVICE))
    if reason is not None:
        pytest.skip(f"TMA path unavailable: {reason}")
    x, w = _operands(M, N, K, seed=11)
    xq, xs = kernels.quantize_act(x)
    wq, ws = kernels.quantize_weight(w)
    ref = quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32)
    for tile in ((64, 128), (128, 256)):
        y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32, block_m=tile[0], block_n=tile[1], use_tma=True)
        _assert_matches_reference(y, ref)
    y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32, block_m=64, num_programs=2, use_tma=True)
    _assert_matches_reference(y, ref)


def test_bf16_output_is_the_fp32_result_rounded_to_nearest_even():
    """bf16 output == the fp32 result rounded to nearest-even: the interpreter's truncating cast is worked around by
    integer rounding; compiled, the direct cast rounds to nearest-even itself."""
    x, w = _operands(40, 160, 256, seed=3)
    xq, xs = quant.quantize_act(x)
    wq, ws = quant.quantize_weight(w)
    y32 = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32, block_m=64, block_n=128)
    y16 = kernels.fp8_gemm(xq, xs, wq, ws, block_m=64, block_n=128)
    assert y16.dtype == torch.bfloat16
    assert torch.equal(y16, y32.to(torch.bfloat16))


def test_gemm_with_zero_blocks_and_kernel_quantised_operands():
    x, w = _operands(20, 256, 384, seed=5)
    x[:, 128:256] = 0.0  # zero activation groups (scale 1, codes 0)
    w[128:, :] = 0.0  # zero weight blocks
    xq, xs = kernels.quantize_act(x)
    wq, ws = kernels.quantize_weight(w)
    for block_n in (128, 256):
        y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32, block_m=32, block_n=block_n)
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
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        kernels.fp8_gemm(xq, xs, wq, ws, block_n=96)
    with pytest.raises(ValueError, match="block_m must be a power of two >= 16"):
        kernels.fp8_gemm(xq, xs, wq, ws, block_m=8)
    with pytest.raises(ValueError, match="num_programs"):
        kernels.fp8_gemm(xq, xs, wq, ws, block_m=16, num_programs=0)
    assert kernels.fp8_gemm(xq[:0], xs[:0], wq, ws).shape == (0, 32)


# ----------------------------------------------------------------------------------------------------------------------
# GPU only (compiled kernels, autotuned configs, Hopper's TMA)


def _skip_unless_fp8_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (compiled Triton, autotuned configs)")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tl.dot needs compute capability >= 8.9")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "k_major"])
def test_gemm_gpu_llada_like_shape(layout):
    _skip_unless_fp8_gpu()
    x, w = _operands(1024, 4096, 4096, seed=9)
    x = x.bfloat16()
    xq, xs = kernels.quantize_act(x)
    wq, ws = kernels.quantize_weight(w.bfloat16())
    xs = _layout(xs, layout)
    y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32)
    _assert_matches_reference(y, quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32))
    assert snr_db(x.float() @ w.T, y) > SNR_FLOOR_DB
    y16 = kernels.fp8_gemm(xq, xs, wq, ws)  # autotuned bf16 output (direct cast)
    torch.testing.assert_close(y16.float(), y, rtol=2**-8, atol=GEMM_REL_BOUND * y.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize(("M", "N", "K"), [(8192, 4096, 4096), (300, 12288, 4096), (77, 4096, 12288 + 64)])  # ragged K
def test_gemm_gpu_tma_and_pointer_paths_agree(M, N, K):
    """Both compiled operand paths and the persistent schedule against the reference at LLaDA-like shapes."""
    _skip_unless_fp8_gpu()
    x, w = _operands(M, N, K, seed=M)
    xq, xs = kernels.quantize_act(x.bfloat16())
    wq, ws = kernels.quantize_weight(w.bfloat16())
    ref = quant.fp8_gemm_reference(xq, xs, wq, ws, out_dtype=torch.float32)
    runs = {"pointer": dict(use_tma=False), "pointer_persistent": dict(block_m=128, block_n=256, num_programs=7)}
    if kernels.tma_unavailable(xq.device) is None:
        runs["tma"] = dict(use_tma=True)
        runs["tma_128x256_persistent"] = dict(use_tma=True, block_m=128, block_n=256, num_programs=13)
    for name, kwargs in runs.items():
        y = kernels.fp8_gemm(xq, xs, wq, ws, out_dtype=torch.float32, **kwargs)
        rel = ((y - ref).norm() / ref.norm()).item()
        assert rel < GEMM_REL_BOUND, (name, rel)
