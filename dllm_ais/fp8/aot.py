"""Ahead-of-time static checks of the FP8 Triton kernels for Hopper (sm_90), on a machine without a GPU.

Each kernel (and each GEMM autotune config) is compiled with `triton.compile(ASTSource(...), target=GPUTarget("cuda",
90, 128))`, specialised as the JIT specialises it at LLaDA-8B shapes: pointers and ints divisible by 16 carry the
`tt.divisibility = 16` attribute, ints equal to 1 become constexprs (DESIGN.md §7 "Static checks"). From the result:

  regs, spill   registers per thread and stack bytes per thread (spill), read by triton's bundled
                `cuobjdump --dump-resource-usage` from the cubin;
  smem          shared memory per CTA in bytes (the compiler's dynamic allocation, `metadata.shared`, plus any static);
  pipelined     the PTX loads operands asynchronously (cp.async or TMA `cp.async.bulk.tensor`);
  tma           the PTX uses TMA (`cp.async.bulk.tensor`): the descriptor variant of the GEMM, fp8_gemm's sm_90 default;
  wgmma         the PTX issues Hopper's `wgmma.mma_async`;
  vec           widest global vector access in the PTX (`ld.global…v4.b32` = 16 bytes per thread → "v4");
  wait0         the PTX waits for wgmma group 0 (every MMA retired) before the fp32 scale promotion.

Not imported by `import dllm_ais` (it imports triton and compiles). Compiling needs the kernels as `JITFunction`s, so
run it in a process without TRITON_INTERPRET=1 (`compile_table` does that itself with a subprocess when the current
process is interpreting). `scripts/aot_check.py` prints the table; tests/test_aot_sm90.py asserts on it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import tempfile

SMEM_LIMIT = 227 * 1024  # Hopper's per-block opt-in maximum (228 KiB per SM, 1 KiB reserved)
TARGET = ("cuda", 90, 128)  # sm_90, warp size 32 … GPUTarget(backend, arch, warp_size)

# LLaDA-8B: d = 4096, MLP hidden 12288, 32 heads × 128; one denoising forward at [32, 320] has M = 10240 rows,
# decode-sized work M = 64. The GEMM's specialisation does not depend on M beyond divisibility, so one compile per
# config covers every M bucket; pruning per bucket (kernels.prune_gemm_configs) is checked separately.
D_MODEL, D_FF, HEAD_DIM, N_HEADS, SEQ = 4096, 12288, 128, 32, 320
M_LARGE, M_SMALL = 10240, 64
FP64_SUFFIX = "/fp64"
"""Suffix of a producer row compiled with its float scalars typed fp64, as inductor passes floats derived from symbolic
shapes to user kernels (the H200 quick check of 2026-11-27 failed on `tl.sqrt_rn` of an fp64 value)."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One compiled kernel variant and what the cubin / PTX say about it."""

    kernel: str  # kernel name as in the table
    config: str  # tile / warps / stages
    regs: int  # registers per thread
    spill: int  # stack (local-memory spill) bytes per thread
    smem: int  # shared memory bytes per CTA
    pipelined: bool  # cp.async or TMA in the PTX
    tma: bool  # TMA bulk tensor loads (cp.async.bulk.tensor) in the PTX
    wgmma: bool  # wgmma.mma_async in the PTX
    vec: str  # widest global vector load / store ("v4", "v2" or "-")
    wait0_before_promote: bool  # PTX waits for wgmma group 0 inside the K loop (no MMA overlaps the promotion)


def _cuobjdump() -> str | None:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return path if os.path.exists(path) else None


def unavailable() -> str | None:
    """Why the AOT check cannot run with the installed triton, or None."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as e:
        return f"triton's compiler API is not importable: {e}"
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for tool in ("ptxas", "cuobjdump"):
        if not os.path.exists(os.path.join(bin_dir, tool)):
            return f"triton {triton.__version__} has no bundled NVIDIA {tool} under {bin_dir}"
    return None


def _signature(fn, args: dict, constexprs: dict):
    """(signature, constexprs, attrs) as ASTSource takes them (triton ≥ 3.3: names → type strings, attrs keyed by
    (index,) paths), specialised like the JIT: ints == 1 become constexprs; pointers and ints % 16 == 0 get
    tt.divisibility 16. `args`: name -> "*dtype" (a 16-byte-aligned pointer), int or float."""
    sig, const, attrs = {}, dict(constexprs), {}
    div16 = [["tt.divisibility", 16]]
    for i, name in enumerate(fn.arg_names):
        if name in const:
            sig[name] = "constexpr"
            continue
        v = args[name]
        if isinstance(v, str):
            sig[name] = v
            if v.startswith("*"):
                attrs[(i,)] = div16
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name}: unsupported argument {v!r}")
        elif isinstance(v, float):
            sig[name] = "fp32"
        elif v == 1:
            sig[name] = "constexpr"
            const[name] = 1
        else:
            sig[name] = "i32" if -(2**31) <= v < 2**31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = div16
    return sig, const, attrs


def _compile(fn, args: dict, constexprs: dict, num_warps: int, num_stages: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, const, attrs = _signature(fn, args, constexprs)
    try:
        src = ASTSource(fn, sig, const, attrs)
    except TypeError:  # triton < 3.3: signature / constants keyed by argument index
        idx = {n: i for i, n in enumerate(fn.arg_names)}
        src = ASTSource(fn, {idx[n]: t for n, t in sig.items() if t != "constexpr"},
                        {idx[n]: v for n, v in const.items()}, attrs)  # fmt: skip
    return triton.compile(src, target=GPUTarget(*TARGET), options={"num_warps": num_warps, "num_stages": num_stages})


def _resources(cubin: bytes) -> tuple[int, int, int]:
    """(registers, stack bytes, static shared bytes) of the cubin's one function."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        cmd = [_cuobjdump(), "--dump-resource-usage", f.name]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)", out.stdout)
    if m is None:
        raise RuntimeError(f"cannot parse cuobjdump output:\n{out.stdout}{out.stderr}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def _vec(ptx: str) -> str:
    for width in ("v8", "v4", "v2"):
        if re.search(rf"(ld|st)\.global[\w.]*\.{width}\.", ptx):
            return width
    return "-"


def _row(kernel: str, config: str, compiled) -> Row:
    regs, stack, static_smem = _resources(compiled.asm["cubin"])
    ptx = compiled.asm["ptx"]
    # The fp32 promotion follows the K loop's wgmma; "wait_group 0" inside the loop body means every MMA retires first.
    loop_waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    return Row(
        kernel=kernel,
        config=config,
        regs=regs,
        spill=stack,
        smem=int(compiled.metadata.shared) + static_smem,
        pipelined="cp.async" in ptx,  # cp.async.cg/ca (Ampere-style) or cp.async.bulk.tensor (TMA)
        tma="cp.async.bulk.tensor" in ptx,
        wgmma="wgmma.mma_async" in ptx,
        vec=_vec(ptx),
        wait0_before_promote="0" in loop_waits,
    )


def gemm_rows(shapes=None, tma: bool = False) -> list[Row]:
    """Compile the GEMM for every (BLOCK_M, BLOCK_N, GROUP_M, warps, stages) in `shapes` (default: the autotune set,
    kernels._GPU_GEMM_SHAPES), K % 128 == 0, bf16 out, at the down-projection's N=4096, K=12288; operands through
    pointers, or (tma) through TMA tensor descriptors, fp8_gemm's default on sm_90."""
    from . import kernels

    fn = kernels._fp8_gemm_kernel
    M, N, K = M_LARGE, D_MODEL, D_FF
    G = K // 128
    args = dict(a_src="*fp8e4nv", as_ptr="*fp32", w_src="*fp8e4nv", ws_ptr="*fp32", c_ptr="*bf16", M=M, N=N, K=K, G=G,
                stride_am=K, stride_wn=K, stride_asm=1, stride_asg=M, stride_wsn=G, stride_wsg=1, stride_cm=N,
                M_BUCKET=16384)  # fmt: skip
    rows = []
    for bm, bn, gm, w, s in shapes if shapes is not None else kernels._GPU_GEMM_SHAPES:
        const = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=gm, EVEN_K=True, USE_TMA=tma, OUT_BF16=True,
                     RNE_BF16=False)  # fmt: skip
        if tma:  # the JIT's type string of a host TensorDescriptor with this config's block shape
            args |= dict(a_src=f"tensordesc<fp8e4nv[{bm}, 128]>", w_src=f"tensordesc<fp8e4nv[{bn}, 128]>")
        compiled = _compile(fn, args, const, w, s)
        rows.append(_row("fp8_gemm_tma" if tma else "fp8_gemm", f"{bm}x{bn} g{gm} w{w} s{s}", compiled))
    return rows


def producer_rows() -> list[Row]:
    """Compile each producer kernel at its launch configuration for LLaDA-8B shapes (M = 10240 rows, bf16 model)."""
    from . import producer_kernels as pk
    from . import row_producer_kernels as rk

    rows = []
    shape = (M_LARGE, D_MODEL, D_FF, N_HEADS, HEAD_DIM, SEQ)
    launches = [*pk.aot_launches(*shape), *rk.aot_launches(*shape)]  # blockwise, then row-wise (scaled_mm's)
    for name, fn, args, const, warps in launches:
        compiled = _compile(fn, args, const, warps, 1)
        tiles = " ".join(f"{k}={v}" for k, v in sorted(const.items()) if k.startswith("BLOCK") or k == "GROUPS")
        rows.append(_row(name, f"w{warps} {tiles}", compiled))
        if any(isinstance(v, float) for v in args.values()):  # inductor types symbolic-shape floats as fp64
            fp64 = {k: "fp64" if isinstance(v, float) else v for k, v in args.items()}
            rows.append(_row(f"{name}{FP64_SUFFIX}", f"w{warps} {tiles}", _compile(fn, fp64, const, warps, 1)))
    return rows


def weight_quant_rows() -> list[Row]:
    """Compile the weight sync's quantisers: the per-tensor kernel (kernels.quantize_weight: one 128×128 tile per
    8-warp program) and the grouped one of the sync (grouped_quant.py: several tiles per program, chunked rows)."""
    from . import grouped_quant, kernels

    rows = []
    args = dict(w_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", N=D_FF, K=D_MODEL, KB=D_MODEL // 128,
                stride_wn=D_MODEL)  # fmt: skip
    compiled = _compile(kernels._weight_quant_kernel, args, dict(BLOCK_SIZE=128), 8, 1)
    rows.append(_row("weight_quant", "w8 BLOCK_SIZE=128 (1 tile)", compiled))
    for name, fn, args, const, warps in grouped_quant.aot_launches():
        compiled = _compile(fn, args, const, warps, 1)
        rows.append(_row(name, f"w{warps} TILES={const['TILES']} ROWS={const['ROWS']}", compiled))
    return rows


def _table_in_process() -> list[Row]:
    return gemm_rows() + gemm_rows(tma=True) + producer_rows() + weight_quant_rows()


@functools.cache
def compile_table() -> tuple[Row, ...]:
    """Every row (GEMM autotune set, then producers). Compiles in a subprocess when TRITON_INTERPRET=1 is set here
    (the interpreter's kernels are not compilable JITFunctions); cached for the process (and on disk by triton)."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return tuple(_table_in_process())
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    out = subprocess.run([sys.executable, "-m", "dllm_ais.fp8.aot"], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"AOT compile subprocess failed:\n{out.stderr[-4000:]}")
    return tuple(Row(**r) for r in json.loads(out.stdout))


def format_table(rows) -> str:
    yes = {True: "yes", False: "no"}
    head = ("kernel", "config", "regs", "spill", "smem", "pipelined", "tma", "wgmma", "vec", "wait0")
    body = [(r.kernel, r.config, str(r.regs), str(r.spill), f"{r.smem / 1024:.1f}K", yes[r.pipelined], yes[r.tma],
             yes[r.wgmma], r.vec, yes[r.wait0_before_promote]) for r in rows]  # fmt: skip
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in [head, *body])


if __name__ == "__main__":  # the subprocess of compile_table: JSON rows on stdout
    print(json.dumps([dataclasses.asdict(r) for r in _table_in_process()]))
