"""FP8 quantisation: the Triton kernels are bit-identical to the torch reference; reference properties and error bounds.

Kernel tests run under the Triton interpreter on CPU (tests/conftest.py sets TRITON_INTERPRET=1) at small shapes.
"""

from __future__ import annotations

import pytest
import torch

from dllm_ais.fp8 import quant

kernels = pytest.importorskip("dllm_ais.fp8.kernels", reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
E4M3_GRID = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
E4M3_GRID = E4M3_GRID[torch.isfinite(E4M3_GRID)].unique()  # 253 finite values, -448 … 448


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


def _activations(M: int, K: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Gaussian rows with per-row magnitudes over 8 decades, plus the awkward groups every kernel must get right."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.logspace(-4, 4, M)[:, None]
    x[0, :] = 0.0  # all-zero row (every group zero)
    if M > 2:
        x[1, : min(K, 128)] = 0.0  # one zero group
        x[2, :] *= 1e-3  # subnormal e4m3 codes: tiny values next to one large one
        x[2, 0] = 448.0 * 4
    if M > 3:
        x[3, :] = torch.where(torch.arange(K) % 2 == 0, 448.0, -448.0)  # exactly ±448 (scale 1)
    if M > 4:
        x[4, :] = 1e4 * torch.sign(x[4, :])  # beyond 448: all codes ±448
    return x.to(dtype)


def test_cast_matches_torch_on_grid_midpoints_and_saturation():
    """The kernels' fp32 -> e4m3 rounding (the interpreter-safe path) equals torch's saturating RNE cast."""
    g = torch.Generator().manual_seed(0)
    pos = E4M3_GRID[E4M3_GRID >= 0]
    mid = (pos[1:] + pos[:-1]) / 2  # ties: round to even
    big = torch.full_like(mid, 1e9)
    values = torch.cat([
        pos, mid, torch.nextafter(mid, big), torch.nextafter(mid, torch.zeros_like(mid)),
        torch.tensor([448.0, 449.0, 464.0, 465.0, 1e30]),  # saturation
        torch.tensor([2.0**-126, 2.0**-140, 1e-44, 0.0]),  # fp32 normal minimum, denormals, zero
        torch.rand(4096, generator=g) * 500, torch.rand(4096, generator=g) * 2.0**-6,  # random normals / subnormals
    ])  # fmt: skip
    values = torch.cat([values, -values]).to(DEVICE)
    got = kernels.cast_to_e4m3(values)
    assert torch.equal(_bits(got), _bits(quant.to_e4m3(values)))
    assert _bits(kernels.cast_to_e4m3(torch.tensor([-0.0], device=DEVICE))).item() == 0x80  # sign of zero kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 16), (7, 128), (9, 200), (33, 384), (6, 1000)])
def test_act_quant_kernel_bit_identical(shape, dtype):
    x = _activations(*shape, seed=sum(shape), dtype=dtype if dtype != torch.float16 else torch.float32)
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4).half()
    x = x.to(DEVICE)
    q, s = kernels.quantize_act(x)
    q_ref, s_ref = quant.quantize_act(x)
    assert q.shape == x.shape and s.shape == (shape[0], quant.num_blocks(shape[1]))
    assert s.stride() == (1, shape[0])  # K-major (outer-dim-major): what fp8_gemm and torch._scaled_mm read
    assert torch.equal(_bits(q), _bits(q_ref))
    assert torch.equal(s, s_ref)


def test_act_quant_kernel_leading_dims_and_strided_input():
    x = _activations(12, 256, seed=1, dtype=torch.float32).to(DEVICE)
    wide = torch.cat([x, x], dim=1)[:, :256]  # row stride 512
    q, s = kernels.quantize_act(wide)
    q_ref, s_ref = quant.quantize_act(x)
    assert torch.equal(_bits(q), _bits(q_ref)) and torch.equal(s, s_ref)
    q3, s3 = kernels.quantize_act(x.view(3, 4, 256))
    assert q3.shape == (3, 4, 256) and s3.shape == (3, 4, 2)
    assert torch.equal(_bits(q3.view(12, 256)), _bits(q_ref)) and torch.equal(s3.view(12, 2), s_ref)
    assert s3.view(12, 2).stride() == (1, 12)  # K-major across the flattened leading dims


@pytest.mark.parametrize("layout", ["k_major", "contiguous"])
def test_act_quant_kernel_writes_into_given_buffers(layout):
    x = _activations(10, 300, seed=2, dtype=torch.float32).to(DEVICE)
    q = torch.empty(10, 300, dtype=quant.FP8_DTYPE, device=DEVICE)
    s = torch.empty(10, 3, device=DEVICE) if layout == "contiguous" else torch.empty(3, 10, device=DEVICE).t()
    q_out, s_out = kernels.quantize_act(x, out=(q, s))
    assert q_out is q and s_out is s
    q_ref, s_ref = quant.quantize_act(x)
    assert torch.equal(_bits(q), _bits(q_ref)) and torch.equal(s, s_ref)
    with pytest.raises(ValueError, match="out scales must be"):
        kernels.quantize_act(x, out=(q, torch.empty(10, 2, device=DEVICE)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 16), (128, 128), (200, 300), (384, 130), (130, 384)])
def test_weight_quant_kernel_bit_identical(shape, dtype):
    g = torch.Generator().manual_seed(shape[0] * shape[1])
    w = torch.randn(shape, generator=g) * 0.02
    w[:128, :128] = 0.0  # an all-zero block
    if shape[0] > 128 and shape[1] > 128:
        w[128:, 128:] *= 1e-4  # a tiny block
        w[-1, -1] = 3.0  # an outlier in a tail block: the rest of it becomes e4m3 subnormals
    w = w.to(dtype).to(DEVICE)
    q, s = kernels.quantize_weight(w)
    q_ref, s_ref = quant.quantize_weight(w)
    assert torch.equal(_bits(q), _bits(q_ref))
    assert torch.equal(s, s_ref)
    assert s[0, 0].item() == 1.0 and not _bits(q[:128, :128]).any()


def test_weight_quant_kernel_writes_into_given_buffers():
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(144, 272, generator=g) * 0.02).to(DEVICE)
    q = torch.empty(144, 272, dtype=quant.FP8_DTYPE, device=DEVICE)
    s = torch.empty(2, 3, dtype=torch.float32, device=DEVICE)
    q_out, s_out = kernels.quantize_weight(w, out=(q, s))
    assert q_out is q and s_out is s
    q_ref, s_ref = quant.quantize_weight(w)
    assert torch.equal(_bits(q), _bits(q_ref)) and torch.equal(s, s_ref)
    with pytest.raises(ValueError, match="out scales"):
        kernels.quantize_weight(w, out=(q, torch.empty(3, 3, device=DEVICE)))


def test_zero_groups_get_scale_one_and_zero_codes():
    x = torch.zeros(3, 300)
    x[1, 200] = 5.0
    q, s = quant.quantize_act(x)
    expected = torch.ones(3, 3)
    expected[1, 1] = torch.tensor(5.0) / torch.tensor(448.0)  # fp32 division
    assert torch.equal(s, expected)
    assert _bits(q).count_nonzero().item() == 1 and q[1, 200].float().item() == 448.0
    wq, ws = quant.quantize_weight(torch.zeros(130, 17))
    assert torch.equal(ws, torch.ones(2, 1)) and not _bits(wq).any()


def test_group_max_maps_to_448_and_tiny_scales_stay_normal():
    x = _activations(16, 384, seed=5, dtype=torch.float32)
    q, s = quant.quantize_act(x)
    nonzero = s != 1.0
    group_max = q.float().abs().view(16, 3, 128).amax(-1)
    assert torch.all(group_max[nonzero] == 448.0)
    tiny = torch.full((1, 128), 1e-40)  # fp32 denormals: the scale is clamped to the smallest normal
    _, s_tiny = quant.quantize_act(tiny)
    assert s_tiny.item() == 2.0**-126


@pytest.mark.parametrize("shape", [(5, 100), (64, 384), (130, 260)])
def test_round_trip_error_bounds(shape):
    """|x - dequant(quant(x))| ≤ 2^-4·|x| (half an e4m3 ulp, 3 mantissa bits) + 2^-10·scale (half a subnormal step)."""
    x = _activations(*shape, seed=11, dtype=torch.float32)
    q, s = quant.quantize_act(x)
    x_hat = quant.dequantize_act(q, s)
    scale = s.repeat_interleave(128, dim=1)[:, : shape[1]]
    bound = 2.0**-4 * x.abs() + 2.0**-10 * scale
    assert torch.all((x - x_hat).abs() <= bound * (1 + 1e-6))
    g = torch.Generator().manual_seed(12)
    w = torch.randn(shape, generator=g) * 0.02
    wq, ws = quant.quantize_weight(w)
    w_hat = quant.dequantize_weight(wq, ws)
    snr_db = 10 * torch.log10(w.pow(2).sum() / (w - w_hat).pow(2).sum()).item()
    assert snr_db > 30.0  # measured 31.3–31.6 dB for Gaussian weights (e4m3 has 3 mantissa bits)


def test_rowwise_reference():
    g = torch.Generator().manual_seed(13)
    x = torch.randn(9, 48, generator=g)
    x[4] = 0.0
    q, s = quant.quantize_rowwise(x)
    assert s.shape == (9, 1) and s[4].item() == 1.0
    assert torch.equal(s[:, 0], quant.scale_from_amax(x.abs().amax(-1)))
    err = (q.float() * s - x).abs()
    assert torch.all(err <= 2.0**-4 * x.abs() + 2.0**-10 * s)


def test_dequantize_rejects_wrong_scale_shapes():
    q, s = quant.quantize_act(torch.ones(4, 256))
    with pytest.raises(ValueError, match="activation scales"):
        quant.dequantize_act(q, s[:, :1])
    wq, ws = quant.quantize_weight(torch.ones(256, 256))
    with pytest.raises(ValueError, match="weight scales"):
        quant.dequantize_weight(wq, ws.T[:1])
