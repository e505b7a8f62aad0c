"""Ahead-of-time static checks of the FP8 Triton kernels for sm_90 (Hopper), on CPU (DESIGN.md §7 "Static checks").

Every GEMM autotune config and every producer kernel is compiled with triton's bundled ptxas, specialised as the JIT
specialises at LLaDA-8B shapes (dllm_ais/fp8/aot.py); registers / spill / shared memory come from the cubin, the rest
from the PTX. The table is printed (pytest -s shows it). Compiles once per session in a subprocess (this process runs
the interpreter); triton's disk cache makes later sessions fast.
"""

import pytest

from dllm_ais.fp8 import aot

pytestmark = pytest.mark.slow  # ~40 s cold on a loaded 2-core machine (26 compiles), a few seconds with triton's cache


@pytest.fixture(scope="module")
def table():
    why = aot.unavailable()
    if why:
        pytest.skip(why)
    rows = aot.compile_table()
    print("\n" + aot.format_table(rows))
    return rows


def _gemm(rows):
    return [r for r in rows if r.kernel.startswith("fp8_gemm")]


def test_every_gemm_autotune_config_compiles_for_sm90_without_spilling(table):
    from dllm_ais.fp8 import kernels

    gemm = _gemm(table)
    assert len(gemm) == 2 * len(kernels._GPU_GEMM_SHAPES)  # pointer and TMA-descriptor operands
    for r in gemm:
        assert r.tma == (r.kernel == "fp8_gemm_tma"), f"{r.kernel} {r.config}: TMA in PTX = {r.tma}"
        assert r.spill == 0, f"{r.config} spills {r.spill} B/thread ({r.regs} regs): drop it from _GPU_GEMM_SHAPES"
        assert r.smem <= aot.SMEM_LIMIT, f"{r.config} needs {r.smem} B of shared memory"
        assert r.pipelined, f"{r.config}: operand loads are not asynchronous (no cp.async / TMA in the PTX)"
        assert r.vec in ("v4", "v8"), f"{r.config}: no 16-byte vector global access"


def test_gemm_uses_wgmma_for_tiles_of_64_rows_or_more(table):
    # wgmma's M is 64 per warpgroup: smaller tiles compile to mma.sync, which is expected for decode-sized M.
    for r in _gemm(table):
        bm = int(r.config.split("x")[0])
        assert r.wgmma == (bm >= 64), f"{r.config}: wgmma={r.wgmma}"


def test_producers_compile_without_spilling_with_16_byte_vectors(table):
    prods = [r for r in table if not r.kernel.startswith("fp8_gemm") and "weight_quant" not in r.kernel
             and not r.kernel.endswith(aot.FP64_SUFFIX)]  # fmt: skip
    assert {r.kernel for r in prods} == {"rmsnorm_quant", "silu_mul_quant", "attn_out_quant", "rope", "qk_norm_rope",
                                         "rmsnorm_rowquant", "silu_mul_rowquant", "attn_out_rowquant"}
    for r in prods:
        assert r.spill == 0, f"{r.kernel} spills {r.spill} B/thread"
        assert r.smem <= aot.SMEM_LIMIT
        assert r.vec in ("v4", "v8"), f"{r.kernel}: widest global access is {r.vec}, not 16 bytes"


def test_producers_with_float_scalars_compile_when_inductor_types_them_fp64(table):
    """Under torch.compile, inductor passes float scalars that derive from symbolic shapes (RMSNorm's `float(D)`) to
    user Triton kernels as fp64; a kernel that feeds them to fp32-only math (`tl.sqrt_rn`) then fails to compile."""
    fp64 = {r.kernel for r in table if r.kernel.endswith(aot.FP64_SUFFIX)}
    # every launch with a float argument has its fp64 row (the row-wise producers share one kernel, so all three do)
    assert fp64 == {"rmsnorm_quant/fp64", "rmsnorm_rowquant/fp64", "silu_mul_rowquant/fp64", "attn_out_rowquant/fp64",
                    "qk_norm_rope/fp64"}


def test_grouped_weight_quant_fits_128_registers_without_spilling(table):
    """The sync's grouped quantiser (several 128×128 tiles per program, chunked rows): ≤ 128 registers (the old
    per-tensor kernel, one tile per 8-warp program, needs 156), no spill, 16-byte vectors."""
    rows = {r.kernel: r for r in table if "weight_quant" in r.kernel}
    assert set(rows) == {"weight_quant", "grouped_weight_quant"}
    new = rows["grouped_weight_quant"]
    assert new.regs <= 128 and new.spill == 0, f"{new.regs} registers, {new.spill} B spilled"
    assert new.vec in ("v4", "v8") and new.smem <= aot.SMEM_LIMIT
    assert rows["weight_quant"].regs > 128  # the bound can fail: the old kernel would


def test_prune_keeps_tiles_no_taller_than_the_m_bucket_and_wgmma_tiles_for_large_m():
    triton = pytest.importorskip("triton")
    from dllm_ais.fp8 import kernels

    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": g}, num_warps=w, num_stages=s)
               for bm, bn, g, w, s in kernels._GPU_GEMM_SHAPES]  # fmt: skip
    for bucket, lowest, tallest in ((1, 16, 16), (16, 16, 16), (64, 16, 64), (128, 16, 128), (16384, 64, 128)):
        kept = kernels.prune_gemm_configs(configs, {"M_BUCKET": bucket})
        heights = [c.kwargs["BLOCK_M"] for c in kept]
        assert (min(heights), max(heights)) == (lowest, tallest), bucket
    assert len(kernels.prune_gemm_configs(configs, {"M_BUCKET": 16384})) == 7  # the 64×… and 128×… tiles only
