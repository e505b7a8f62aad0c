"""NVFP4 / MXFP4 quantisers (dllm_ais.fp4) against plain per-element Python references and hand-worked examples.

The references below loop over Python floats: e2m1 and e4m3 rounding by searching the full list of representable
values (ties to the even code, i.e. mantissa bit 0), MX exponents by doubling/halving until 2^e <= amax < 2^(e+1),
and fp32 arithmetic mirrored with an explicit round-to-fp32 (struct) after every operation the torch code does in
fp32. The torch quantisers must agree with them exactly.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch

from dllm_ais.fp4 import (
    E2M1_VALUES,
    fake_mxfp4,
    fake_nvfp4_act,
    fake_nvfp4_weight,
    mxfp4_dequantize,
    mxfp4_quantize,
    mxfp4_scale_exponent,
    nvfp4_dequantize,
    nvfp4_quantize,
    nvfp4_tensor_scale,
    round_to_e2m1,
    round_to_e4m3,
)

# ----------------------------------------------------------------------------------------------------------------------
# plain references


def f32(v: float) -> float:
    """Round a Python float to the nearest fp32 value."""
    return struct.unpack("f", struct.pack("f", v))[0]


def nearest_even(value: float, grid: list[float]) -> float:
    """Nearest element of the ascending non-negative `grid` to value >= 0 (clamped to grid[-1]); ties go to the even
    index (the grids here list every code in order, so index parity is the mantissa's last bit)."""
    value = min(value, grid[-1])
    best = min(range(len(grid)), key=lambda i: (abs(grid[i] - value), i % 2))
    return grid[best]


def e2m1_ref(v: float) -> float:
    if math.isnan(v):
        return v
    return math.copysign(nearest_even(abs(v), list(E2M1_VALUES)), v)


def _e4m3_values() -> list[float]:
    """Every finite non-negative e4m3 (fn) value, from its bit pattern: bias 7, 3 mantissa bits, S.1111.111 is NaN."""
    out = []
    for code in range(0x7F):  # 0x7F is NaN
        e, m = code >> 3, code & 7
        out.append(m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return out


E4M3_VALUES = _e4m3_values()


def e4m3_ref(v: float) -> float:
    """Nearest e4m3 to v >= 0, ties to even, clamped to [2^-9, 448] as the NVFP4 block scale is."""
    return nearest_even(max(v, 2.0**-9), E4M3_VALUES)


def mx_exp_ref(amax: float) -> int:
    if amax == 0:
        return -127
    e = 0
    while 2.0**e > amax:
        e -= 1
    while 2.0 ** (e + 1) <= amax:
        e += 1
    return max(-127, min(127, e - 2))


def mxfp4_ref(row: list[float]) -> list[float]:
    """One row of fp32 values -> its MXFP4 fake-quantised values (blocks of 32 along the row)."""
    out = []
    for start in range(0, len(row), 32):
        block = row[start : start + 32]
        scale = 2.0 ** mx_exp_ref(max(abs(v) for v in block))
        out += [e2m1_ref(v / scale) * scale for v in block]  # exact: powers of two
    return out


def nvfp4_ref(row: list[float], tensor_amax: float) -> list[float]:
    """One row -> NVFP4 fake-quantised values, blocks of 16, second-level scale from tensor_amax, fp32 mirrored."""
    ts = f32(tensor_amax / 2688.0) or 1.0
    out = []
    for start in range(0, len(row), 16):
        block = row[start : start + 16]
        bs = e4m3_ref(f32(f32(max(abs(v) for v in block) / 6.0) / ts))
        recip = f32(f32(1.0 / ts) / bs)
        out += [f32(f32(e2m1_ref(f32(v * recip)) * bs) * ts) for v in block]
    return out


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    """Heavy-tailed test data: normal values times a per-row scale spanning 1e-3 .. 1e3, a few outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp(torch.empty(*shape[:-1], 1).uniform_(-7, 7, generator=g))
    outliers = torch.rand(*shape, generator=g) < 0.01
    return torch.where(outliers, x * 50, x)


# ----------------------------------------------------------------------------------------------------------------------
# e2m1


def test_every_e2m1_value_round_trips():
    grid = torch.tensor([s * v for v in E2M1_VALUES for s in (1.0, -1.0)])
    assert torch.equal(round_to_e2m1(grid), grid)
    assert len(set(E2M1_VALUES)) == 8 and max(E2M1_VALUES) == 6.0


def test_e2m1_midpoints_round_to_even():
    # midpoint -> the neighbour whose mantissa bit is 0 (0, 1, 2, 4 are even; 0.5, 1.5, 3, 6 odd)
    cases = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    x = torch.tensor(list(cases))
    assert round_to_e2m1(x).tolist() == list(cases.values())
    assert round_to_e2m1(-x).tolist() == [-v for v in cases.values()]
    # just off the midpoints: plain nearest
    eps = 1e-3
    assert round_to_e2m1(x + eps).tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert round_to_e2m1(x - eps).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]


def test_e2m1_saturates_and_keeps_sign_and_nan():
    x = torch.tensor([6.0, 6.5, 7.0, 1e30, float("inf"), -7.0, -float("inf"), float("nan")])
    y = round_to_e2m1(x)
    assert y[:5].tolist() == [6.0] * 5 and y[5:7].tolist() == [-6.0, -6.0] and math.isnan(y[7])
    assert math.copysign(1.0, round_to_e2m1(torch.tensor([-0.1])).item()) == -1.0  # −0.1 -> −0


def test_e2m1_matches_the_reference_on_a_dense_sweep():
    x = torch.linspace(-7.0, 7.0, 14001)  # steps of 0.001: hits every midpoint up to fp32 rounding
    x = torch.cat([x, torch.tensor([v / 4 for v in range(-28, 29)])])  # and exactly every multiple of 1/4
    assert round_to_e2m1(x).tolist() == [e2m1_ref(v) for v in x.tolist()]


# ----------------------------------------------------------------------------------------------------------------------
# MXFP4


def test_mx_scale_exponents_follow_the_spec():
    amax = [0.0, 1e-45, 1e-40, 2.0**-130, 0.75, 1.0, 1.5, 2.0, 3.999, 4.0, 6.0, 7.99, 8.0, 1e30, 3e38,
            f32(4.0 * (1 - 2.0**-24)), 2.0**127]
    got = mxfp4_scale_exponent(torch.tensor(amax)).tolist()
    assert got == [mx_exp_ref(f32(a)) for a in amax]
    assert got[5:10] == [-2, -2, -1, -1, 0]  # floor(log2(amax)) − 2 on hand-picked points


def test_mxfp4_matches_the_reference_and_scales_are_powers_of_two():
    x = _randn(6, 96, seed=1)
    q, exp = mxfp4_quantize(x)
    assert exp.shape == (6, 3) and exp.dtype == torch.int32 and q.shape == x.shape
    assert round_to_e2m1(q).equal(q)  # codes are on the grid
    scale = torch.exp2(exp.float())
    assert torch.equal(torch.frexp(scale).mantissa, torch.full_like(scale, 0.5))  # exact powers of two
    assert fake_mxfp4(x).tolist() == [mxfp4_ref(row) for row in x.tolist()]
    assert torch.equal(mxfp4_dequantize(q, exp), fake_mxfp4(x))


def test_mxfp4_hand_worked_block():
    block = torch.zeros(32)
    block[:4] = torch.tensor([1.0, 0.1, -3.0, 7.0])  # amax 7: floor(log2 7) − 2 = 0, scale 1
    q, exp = mxfp4_quantize(block)
    assert exp.tolist() == [0] and q[:4].tolist() == [1.0, 0.0, -3.0, 6.0]  # 7 saturates to 6
    block[:4] = torch.tensor([0.75, 0.3, -0.1, 0.05])  # amax 0.75: floor(log2 .75) − 2 = −3, scale 1/8
    q, exp = mxfp4_quantize(block)
    assert exp.tolist() == [-3] and q[:4].tolist() == [6.0, 2.0, -1.0, 0.5]  # 2.4 -> 2, 0.8 -> 1, 0.4 -> 0.5
    assert fake_mxfp4(block)[:4].tolist() == [0.75, 0.25, -0.125, 0.0625]


def test_mxfp4_grid_values_round_trip_exactly():
    values = torch.tensor([s * v for v in E2M1_VALUES for s in (1.0, -1.0)] * 2)  # 32 values, amax 6 -> scale 1
    for k in (-100, -3, 0, 5, 100):
        x = values * 2.0**k
        assert torch.equal(fake_mxfp4(x), x), k


# ----------------------------------------------------------------------------------------------------------------------
# NVFP4


def test_nvfp4_tensor_scale_is_amax_over_6_times_448():
    amax = torch.tensor([2688.0, 1.0, 0.0, 1e-3])
    assert nvfp4_tensor_scale(amax).tolist() == [1.0, f32(1 / 2688), 1.0, f32(f32(1e-3) / 2688)]


def test_e4m3_block_scale_rounding():
    x = torch.tensor([0.0, 1e-9, 2.0**-9, 1.1, 17.0, 19.0, 447.0, 449.0, 1e6, 0.0029])
    got = round_to_e4m3(x).tolist()
    assert got == [e4m3_ref(f32(v)) for v in x.tolist()]
    assert got[:8] == [2.0**-9, 2.0**-9, 2.0**-9, 1.125, 16.0, 20.0, 448.0, 448.0]  # 17, 19: ties to even


@pytest.mark.parametrize("shape", [(4, 64), (3, 48), (2, 5, 80)])
def test_nvfp4_matches_the_reference(shape):
    x = _randn(*shape, seed=2)
    ref_w = fake_nvfp4_weight(x.reshape(-1, shape[-1]))  # one scale for the whole tensor
    amax = x.abs().max().item()
    assert ref_w.tolist() == [nvfp4_ref(row, amax) for row in x.reshape(-1, shape[-1]).tolist()]
    act = fake_nvfp4_act(x).reshape(-1, shape[-1])  # one scale per row
    assert act.tolist() == [nvfp4_ref(row, max(map(abs, row))) for row in x.reshape(-1, shape[-1]).tolist()]


def test_nvfp4_block_scales_are_e4m3_and_codes_on_the_grid():
    x = _randn(8, 64, seed=3)
    ts = nvfp4_tensor_scale(x.abs().amax())
    q, bs = nvfp4_quantize(x, ts)
    assert bs.shape == (8, 4) and q.shape == x.shape
    assert torch.equal(bs.to(torch.float8_e4m3fn).float(), bs) and (bs > 0).all() and (bs <= 448).all()
    assert torch.equal(round_to_e2m1(q), q)
    assert bs.max().item() == 448.0  # the block holding the tensor's amax uses the top of the e4m3 range


def test_nvfp4_hand_worked_blocks():
    x = torch.zeros(1, 48)
    x[0, :3] = torch.tensor([2688.0, 1000.0, -300.0])  # tensor amax 2688 = 6 · 448 -> tensor scale 1
    x[0, 16:19] = torch.tensor([12.0, 5.0, 7.0])  # block amax 12 -> block scale 2
    x[0, 32:34] = torch.tensor([6.36, 1.0])  # block amax 6.36 -> 1.06 -> e4m3 1.0 (below the 1.0625 midpoint)
    ts = nvfp4_tensor_scale(x.abs().amax())
    q, bs = nvfp4_quantize(x, ts)
    assert ts.item() == 1.0 and bs[0].tolist() == [448.0, 2.0, 1.0]
    # 1000/448 = 2.23 -> 2; −300/448 = −0.67 -> −0.5; 5/2 = 2.5 -> 2 (tie, even); 7/2 = 3.5 -> 4 (tie, even);
    # 6.36/1 saturates to 6
    assert q[0, :3].tolist() == [6.0, 2.0, -0.5] and q[0, 16:19].tolist() == [6.0, 2.0, 4.0]
    assert q[0, 32:34].tolist() == [6.0, 1.0]
    assert nvfp4_dequantize(q, bs, ts)[0, [0, 1, 2, 16, 17, 18, 32]].tolist() == [2688, 896, -224, 12, 4, 8, 6]


def test_nvfp4_codes_of_grid_values_round_trip():
    values = torch.tensor([s * v for v in E2M1_VALUES for s in (1.0, -1.0)])  # one 16-block, amax 6
    for k in (-20, 0, 20):
        x = values * 2.0**k
        q, _ = nvfp4_quantize(x, nvfp4_tensor_scale(x.abs().amax()))
        assert torch.equal(q, values), k


# ----------------------------------------------------------------------------------------------------------------------
# zero blocks, ragged K, errors


@pytest.mark.parametrize("fake", [fake_mxfp4, fake_nvfp4_weight, fake_nvfp4_act], ids=lambda f: f.__name__)
def test_zero_blocks_and_zero_tensors(fake):
    x = _randn(4, 64, seed=4)
    x[:, :32] = 0.0  # the first 32-block (and two 16-blocks) of every row are zero
    y = fake(x)
    assert torch.isfinite(y).all() and torch.equal(y[:, :32], torch.zeros(4, 32))
    assert (y[:, 32:] != 0).any()
    z = fake(torch.zeros(3, 48))
    assert torch.equal(z, torch.zeros(3, 48))


def test_zero_block_scales():
    _, exp = mxfp4_quantize(torch.zeros(64))
    assert exp.tolist() == [-127, -127]
    q, bs = nvfp4_quantize(torch.zeros(32), nvfp4_tensor_scale(torch.tensor(0.0)))
    assert bs.tolist() == [2.0**-9] * 2 and torch.equal(q, torch.zeros(32))


@pytest.mark.parametrize("fake,block", [(fake_mxfp4, 32), (fake_nvfp4_weight, 16), (fake_nvfp4_act, 16)],
                         ids=["mxfp4", "nvfp4_weight", "nvfp4_act"])
@pytest.mark.parametrize("k", [1, 7, 20, 33, 50])
def test_ragged_k_is_a_short_last_block(fake, block, k):
    """A K that is not a multiple of the block quantises exactly as the zero-padded tensor, padding dropped."""
    x = _randn(3, k, seed=k)
    padded = torch.nn.functional.pad(x, (0, -k % block))
    y = fake(x)
    assert y.shape == x.shape and torch.equal(y, fake(padded)[:, :k])


def test_bad_inputs_raise_clear_errors():
    ts = torch.tensor(1.0)
    with pytest.raises(ValueError, match="floating-point"):
        mxfp4_quantize(torch.ones(4, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="last dimension"):
        mxfp4_quantize(torch.tensor(1.0))
    with pytest.raises(ValueError, match="last dimension"):
        nvfp4_quantize(torch.ones(4, 0), ts)


def test_bf16_input_is_quantised_from_its_exact_values():
    x = _randn(4, 64, seed=5).bfloat16()
    assert torch.equal(fake_mxfp4(x), fake_mxfp4(x.float()))
    assert torch.equal(fake_nvfp4_act(x), fake_nvfp4_act(x.float()))


# ----------------------------------------------------------------------------------------------------------------------
# an independent implementation: torchao's mx_formats (when installed)


def _torchao_mx():
    pytest.importorskip("torchao")
    try:
        from torchao.prototype.mx_formats import kernels
        from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as ao_nvfp4_quantize
        from torchao.prototype.mx_formats.nvfp4_tensor import per_tensor_amax_to_scale
    except ImportError as e:  # torchao moves its prototypes between versions
        pytest.skip(f"this torchao has no mx_formats reference: {e}")
    return kernels, to_mx, ScaleCalculationMode, ao_nvfp4_quantize, per_tensor_amax_to_scale


def _torchao_codes(kernels, packed: torch.Tensor, shape) -> torch.Tensor:
    return kernels.f4_unpacked_to_f32(kernels.unpack_uint4(packed.view(torch.uint8))).reshape(shape)


def test_mxfp4_equals_torchao_floor_mode():
    kernels, to_mx, mode, _, _ = _torchao_mx()
    x = _randn(16, 128, seed=6)
    scale, packed = to_mx(x, torch.float4_e2m1fn_x2, 32, scaling_mode=mode.FLOOR)
    q, exp = mxfp4_quantize(x)
    assert torch.equal(scale.view(torch.uint8).to(torch.int32) - 127, exp)
    assert torch.equal(_torchao_codes(kernels, packed, x.shape), q)


def test_nvfp4_equals_torchao():
    kernels, _, _, ao_nvfp4_quantize, per_tensor_amax_to_scale = _torchao_mx()
    x = _randn(1, 16 * 128, seed=7).reshape(16, 128) * 0.01  # one row scale: no block far below the tensor amax
    ts = per_tensor_amax_to_scale(x.abs().amax())
    assert torch.equal(ts, nvfp4_tensor_scale(x.abs().amax()))
    ao_scale, packed = ao_nvfp4_quantize(x, per_tensor_scale=ts)
    q, bs = nvfp4_quantize(x, ts)
    assert bs.min() > 2.0**-6  # the regime where torchao's 2^-6 floor on block scales does not bite
    assert torch.equal(ao_scale.float(), bs)
    assert torch.equal(_torchao_codes(kernels, packed, x.shape), q)
