"""Every FP8 Triton kernel and every GEMM autotune config compiled ahead of time for Hopper (sm_90) on this machine.

Asserts what a GPU run would pay (fp8/aot.py reads it from the cubin and PTX): no register spill anywhere, shared
memory within a CTA's 227 KiB, GEMM operand loads software-pipelined (cp.async or TMA) and the 64-row-and-up GEMM
tiles on wgmma. The table is printed (pytest -s, or scripts/aot_check.py). Skipped only where the installed triton
lacks its NVIDIA backend tools.
"""

from __future__ import annotations

import functools

import pytest

from dllm_ais.fp8 import aot

pytestmark = pytest.mark.skipif(aot.nvidia_unavailable() is not None, reason=str(aot.nvidia_unavailable()))


@functools.cache
def _gemm() -> list[aot.Resources]:
    return aot.reports("gemm")


@functools.cache
def _producers() -> list[aot.Resources]:
    return aot.reports("producers")


@pytest.mark.slow
def test_every_gemm_autotune_config_compiles_without_spills_pipelined_on_wgmma():
    reports = _gemm()
    print("\n" + aot.report_table(reports))
    from dllm_ais.fp8 import kernels

    assert len(reports) == len(kernels._gpu_configs(False)) + len(kernels._gpu_configs(True))
    for r in reports:
        assert r.spill_bytes == 0, f"{r.kernel} spills {r.spill_bytes} B per thread ({r.registers} registers)"
        assert r.shared_bytes <= aot.SMEM_LIMIT, f"{r.kernel} needs {r.shared_bytes} B of shared memory"
        assert r.pipelined, f"{r.kernel}: operand loads are not pipelined (no cp.async / TMA in the PTX)"
        assert r.tma == (" tma " in r.kernel), f"{r.kernel}: TMA loads iff the TMA variant"
        block_m = int(r.kernel.split("x")[0].split()[-1])
        if block_m >= 64:
            assert r.wgmma, f"{r.kernel}: no wgmma.mma_async in the PTX"


@pytest.mark.slow
def test_every_producer_kernel_compiles_without_spills():
    reports = _producers()
    print("\n" + aot.report_table(reports))
    assert {r.kernel for r in reports} >= {"rmsnorm_quant", "silu_mul_quant", "attn_out_quant", "rope",
                                           "row_quant[rmsnorm]", "row_quant[silu_mul]", "row_quant[attn_out]"}
    for r in reports:
        assert r.spill_bytes == 0, f"{r.kernel} spills {r.spill_bytes} B per thread"
        assert r.shared_bytes <= aot.SMEM_LIMIT


def test_a_config_that_spills_is_caught():
    """The check can fail: a 128×256 tile on 8 warps with pointer loads (out of the autotune set) spills."""
    (r,) = aot.reports("spill_probe")
    assert r.registers == 255 and r.spill_bytes > 0


def test_specialisation_follows_the_jit():
    from dllm_ais.fp8 import kernels

    sig, constexprs, attrs = aot.specialise(kernels._fp8_gemm_kernel, aot.gemm_args(False, 64, 128, 16, False))
    names = kernels._fp8_gemm_kernel.arg_names
    assert sig["a_src"] == "*fp8e4nv" and attrs[(names.index("a_src"),)] == [["tt.divisibility", 16]]
    assert sig["stride_asm"] == "constexpr" and constexprs["stride_asm"] == 1  # ints equal to 1 become constants
    assert sig["K"] == "i32" and attrs[(names.index("K"),)] == [["tt.divisibility", 16]]
    assert sig["G"] == "i32" and (names.index("G"),) in attrs  # G = 32 at d = 4096
    assert constexprs["BLOCK_M"] == 64 and sig["BLOCK_M"] == "constexpr"
    with pytest.raises(ValueError, match="no value for parameter"):
        aot.specialise(kernels._fp8_gemm_kernel, {"a_src": "*fp8e4nv"})


def test_autotune_prune_drops_tiles_taller_than_the_m_bucket():
    from dllm_ais.fp8 import kernels

    configs = kernels._gpu_configs(True)
    kept = {c.kwargs["BLOCK_M"] for c in kernels._prune_wasted_rows(configs, {"M_BUCKET": 64})}
    assert kept == {16, 32, 64}
    assert {c.kwargs["BLOCK_M"] for c in kernels._prune_wasted_rows(configs, {"M_BUCKET": 16384})} == {16, 32, 64, 128}
    assert {c.kwargs["BLOCK_M"] for c in kernels._prune_wasted_rows(configs, {"M_BUCKET": 1})} == {16}
