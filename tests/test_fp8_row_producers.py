"""Row-wise producer kernels (fp8/row_producer_kernels.py, the scaled_mm backend's producers) against their torch
twins (producers.*_rowquant = quant.quantize_rowwise of the producer's output).

Bounds as for the block producers (tests/test_fp8_producers.py): RMSNorm and SiLU reduce / exponentiate in another
order or library than torch, so a value may land one model-dtype ulp away and its code one e4m3 grid step away
(|ordinal difference| ≤ 1), scales within one bf16 ulp (2**-7 relative); the attention-output copy has no arithmetic
before the quantiser: bit-identical. Shapes: ragged K (200, 1000), a K longer than one column step (interpreter
step 128), one row, zero rows, saturating magnitudes, bf16 and fp32.
"""

from __future__ import annotations

import pytest
import torch

from dllm_ais.fp8 import producers

rk = pytest.importorskip("dllm_ais.fp8.row_producer_kernels", reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32]
SHAPES = [(1, 16), (9, 200), (33, 384), (5, 1000)]


def _ordinal(q: torch.Tensor) -> torch.Tensor:
    bits = q.view(torch.uint8).int()
    return torch.where(bits & 0x80 > 0, -(bits & 0x7F), bits & 0x7F)


def _assert_codes_close(got, ref) -> None:
    (q, s), (qr, sr) = got, ref
    assert q.shape == qr.shape and q.dtype == qr.dtype == torch.float8_e4m3fn and s.shape == sr.shape == (q.shape[0], 1)
    assert (_ordinal(q) - _ordinal(qr)).abs().max().item() <= 1
    torch.testing.assert_close(s, sr, rtol=2.0**-7, atol=0.0)


def _awkward(M: int, K: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows over 6 decades, a zero row, a huge row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.logspace(-3, 3, M)[:, None]
    x[0] = 0.0
    if M > 3:
        x[3] = 1e4 * torch.sign(x[3])
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm_rowquant_kernel(shape, dtype):
    M, D = shape
    x = _awkward(M, D, 0, dtype)
    w = (torch.rand(D, generator=torch.Generator().manual_seed(1)) * 2).to(dtype).to(DEVICE)
    got = rk.rmsnorm_rowquant(x, w, 1e-5)
    _assert_codes_close(got, producers.rmsnorm_rowquant(x, w, 1e-5))
    assert got[1][0, 0] == 1.0 and (got[0][0].float() == 0).all()  # the zero row: scale 1, zero codes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_silu_mul_rowquant_kernel_on_strided_slices(shape, dtype):
    M, H = shape
    gu = torch.cat([_awkward(M, H, 2, dtype), torch.zeros(M, 16, dtype=dtype, device=DEVICE),
                    _awkward(M, H, 3, dtype)], dim=1)  # gate and up as column slices of one output, as in the model
    gate, up = gu[:, :H], gu[:, H + 16:]
    _assert_codes_close(rk.silu_mul_rowquant(gate, up), producers.silu_mul_rowquant(gate, up))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bhtd", [(2, 4, 5, 32), (1, 3, 7, 48), (3, 2, 9, 128)])
def test_attn_out_rowquant_kernel_bit_identical(bhtd, dtype):
    B, H, T, D = bhtd
    g = torch.Generator().manual_seed(4)
    att = (torch.randn(B, T, H, D, generator=g) * 10).to(dtype).to(DEVICE).transpose(1, 2)  # SDPA-like strides
    att[0, 0] = 0.0
    q, s = rk.attn_out_rowquant(att)
    qr, sr = producers.attn_out_rowquant(att)
    assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)


def test_row_producers_reject_fp16():
    x = torch.zeros(2, 16, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        rk.rmsnorm_rowquant(x, torch.ones(16, device=DEVICE), 1e-5)
