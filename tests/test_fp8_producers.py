"""Producer kernels (fp8/producer_kernels.py) against their torch twins (fp8/producers.py), and the twins against the
model's own math (models/llada/model.py).

Bounds (stated in producer_kernels.py): attn_out_quant and rope are bit-identical under the interpreter;
rmsnorm_quant and silu_mul_quant reduce / exponentiate in another order or library than torch, so a value may land
one model-dtype ulp away and its e4m3 code one grid step away (codes at most one step apart on the signed e4m3
grid) and scales within one bf16 ulp (2**-7 relative, for both model dtypes). Measured under the interpreter (torch
2.13, triton 3.9): every code equal; scales equal in bf16, one fp32 ulp apart for some fp32 RMSNorm rows.
Shapes: ragged tails (d = 200, 1000, 2100), one row, 64 and 129 rows, rows of more than 16 groups (several programs
per row), zero groups, saturating magnitudes, bf16 and fp32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dllm_ais.fp8 import producers, quant
from dllm_ais.models.llada.model import RMSNorm, apply_rope, rope_cos_sin

pk = pytest.importorskip("dllm_ais.fp8.producer_kernels", reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32]
# (3, 2100): 17 groups, more than one silu program per row (16 groups each) and a padded rmsnorm row tile;
# (64, 256) and (129, 130): the M = 64 / M > 128 row counts, one program per row.
SHAPES = [(1, 16), (3, 2100), (7, 128), (9, 200), (33, 384), (5, 1000), (64, 256), (129, 130)]


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8).int()


def _ordinal(q: torch.Tensor) -> torch.Tensor:
    """e4m3 code -> its signed position on the grid (±0 -> 0); neighbouring grid values differ by 1."""
    bits = _bits(q)
    return torch.where(bits & 0x80 > 0, -(bits & 0x7F), bits & 0x7F)


def _assert_codes_close(got: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Codes within one e4m3 grid step, scales within one bf16 ulp."""
    (q, s), (qr, sr) = got, ref
    assert q.shape == qr.shape and q.dtype == qr.dtype == torch.float8_e4m3fn and s.shape == sr.shape
    assert (_ordinal(q) - _ordinal(qr)).abs().max().item() <= 1
    torch.testing.assert_close(s, sr, rtol=2.0**-7, atol=0.0)


def _awkward(M: int, K: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows over 6 decades, a zero row, a zero group, a huge row (codes saturate in the twin's scale logic)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.logspace(-3, 3, M)[:, None]
    x[0] = 0.0
    if M > 2:
        x[1, : min(K, 128)] = 0.0
    if M > 3:
        x[3] = 1e4 * torch.sign(x[3])
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm_quant_kernel(shape, dtype):
    M, D = shape
    x = _awkward(M, D, 0, dtype)
    w = (torch.rand(D, generator=torch.Generator().manual_seed(1)) * 2).to(dtype).to(DEVICE)
    w[: min(D, 128)] = 0.0  # a whole zero group in the output
    got = pk.rmsnorm_quant(x, w, 1e-5)
    ref = producers.rmsnorm_quant(x, w, 1e-5)
    _assert_codes_close(got, ref)
    assert (got[1][:, 0] == 1.0).all() and (got[0][:, :128].float() == 0).all()  # zero groups: scale 1, zero codes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_silu_mul_quant_kernel_on_strided_slices(shape, dtype):
    M, H = shape
    gu = torch.cat([_awkward(M, H, 2, dtype), torch.zeros(M, 16, dtype=dtype, device=DEVICE),
                    _awkward(M, H, 3, dtype)], dim=1)  # [M, 2H + 16]: gate and up as column slices, as in the model
    gate, up = gu[:, :H], gu[:, H + 16:]
    _assert_codes_close(pk.silu_mul_quant(gate, up), producers.silu_mul_quant(gate, up))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bhtd", [(2, 4, 5, 32), (1, 3, 7, 48), (2, 1, 3, 128), (3, 2, 9, 128), (1, 18, 3, 128)])
def test_attn_out_quant_kernel_bit_identical(bhtd, dtype):
    B, H, T, D = bhtd
    g = torch.Generator().manual_seed(4)
    att = (torch.randn(B, T, H, D, generator=g) * 10).to(dtype).to(DEVICE).transpose(1, 2)  # SDPA-like strides
    att[0, 0] = 0.0
    q, s = pk.attn_out_quant(att)
    qr, sr = producers.attn_out_quant(att)
    assert torch.equal(_bits(q), _bits(qr)) and torch.equal(s, sr)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bthd", [(2, 5, 4, 32), (1, 37, 3, 16), (2, 3, 2, 128)])
def test_rope_kernel_bit_identical_and_twin_equals_model(bthd, dtype):
    B, T, H, D = bthd
    g = torch.Generator().manual_seed(5)
    qkv = (torch.randn(B, T, 3, H, D, generator=g) * 3).to(dtype).to(DEVICE)
    x = qkv[:, :, 1]  # [B, T, H, D] strided view, as k inside the fused QKV output
    pos = torch.randint(0, 4000, (B, T), generator=g).to(DEVICE)
    cos, sin = producers.rope_tables(pos, D, 500000.0)
    got = pk.rope(x, cos, sin)
    twin = producers.apply_rope(x, cos, sin)
    assert got.shape == (B, H, T, D) and got.is_contiguous()
    if DEVICE == "cuda" and dtype == torch.float32:
        # compiled for a GPU, x1·c − x2·s contracts to fma(x1, c, −x2·s) (PTX fma.rn.f32: seen in the sm_90 AOT
        # compile), one rounding fewer than torch's: ≤ 1 ulp apart in fp32. bf16 outputs stay bit-identical.
        torch.testing.assert_close(got, twin, rtol=2.5e-7, atol=4e-6)  # |x| ≤ ~15: ulp ≤ 1e-6
    else:
        assert torch.equal(got, twin)
    cos_full, sin_full = rope_cos_sin(pos, D, 500000.0)
    assert torch.equal(twin, apply_rope(x.transpose(1, 2), cos_full, sin_full))  # the model's cat-based RoPE


@pytest.mark.parametrize("dtype", DTYPES)
def test_twins_equal_model_math(dtype):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(6, 200, generator=g).to(dtype)
    norm = RMSNorm(200, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(200, generator=g))
        assert torch.equal(producers.rms_norm(x, norm.weight, 1e-5), norm(x))
    gate, up = torch.randn(6, 200, generator=g).to(dtype), torch.randn(6, 200, generator=g).to(dtype)
    codes, scales = producers.silu_mul_quant(gate, up)
    ref_codes, ref_scales = quant.quantize_act(F.silu(gate) * up)
    assert torch.equal(_bits(codes), _bits(ref_codes)) and torch.equal(scales, ref_scales)


def test_scale_layout_matches_quantize_act():
    """Producers allocate scales where kernels.quantize_act puts them (one helper; a layout change goes there)."""
    kernels = pytest.importorskip("dllm_ais.fp8.kernels")
    _, s = kernels.quantize_act(torch.randn(5, 300, device=DEVICE))
    assert s.stride() == pk.empty_act_scales(5, 3, torch.device(DEVICE)).stride()


def test_producers_reject_fp16():
    x = torch.zeros(2, 16, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        pk.rmsnorm_quant(x, torch.ones(16, device=DEVICE), 1e-5)
