"""Ahead-of-time compilation of the FP8 Triton kernels for Hopper (sm_90) on any machine, GPU or not.

Triton ships the NVIDIA backend and ptxas, so a CPU-only machine can compile a kernel for sm_90 exactly as the JIT
would on an H100, and read what a GPU run would pay for: registers per thread, stack (spilled registers), shared
memory, whether operand loads are software-pipelined (cp.async, or TMA's cp.async.bulk.tensor) and whether the dot
lowers to Hopper's wgmma. tests/test_aot_sm90.py asserts these facts for every kernel and every GEMM autotune config;
`python scripts/aot_check.py` prints them.

Specialisation follows the JIT (`specialise`): pointers and integers divisible by 16 get the `tt.divisibility` 16
attribute, integers equal to 1 become constants, constexpr parameters take their values. Without the divisibility
attributes the pipeliner does not run and shared memory shows a single stage, so the numbers would be wrong.

Kernels must be compiled in a process without TRITON_INTERPRET (under the interpreter `@triton.jit` returns objects
the compiler cannot take): `reports(kind)` runs `python -m dllm_ais.fp8.aot KIND` in a clean subprocess.

Shapes: LLaDA-8B at one rollout forward [32, 320] (M = 10240 rows, d = 4096, h = 12288, 32 heads of 128). Only
divisibility and equality to 1 reach the compiler, so every LLaDA-8B layer compiles to the same code.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

SMEM_LIMIT = 227 * 1024
"""Shared memory a Hopper CTA may use (232,448 bytes: 228 KiB per SM less 1 KiB reserved)."""

LLADA_8B = dict(M=10240, d=4096, h=12288, heads=32, head_dim=128, batch=32, seq=320)
"""The shapes the kernels are specialised at: one LLaDA-8B denoising forward of a batch of 32 × 320 tokens."""


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel costs on sm_90."""

    kernel: str
    """Kernel name plus its config, e.g. `fp8_gemm 64x128x128 g16 w4 s4`."""
    registers: int
    """Registers per thread (255 is the hardware maximum: at it, anything more spills)."""
    spill_bytes: int
    """Stack bytes per thread (cuobjdump STACK): registers spilled to local memory. 0 = no spill."""
    shared_bytes: int
    """Dynamic shared memory of one CTA (Triton's pipelining buffers)."""
    cp_async: bool
    """The PTX has cp.async (software-pipelined global→shared copies)."""
    tma: bool
    """The PTX has cp.async.bulk.tensor (Hopper TMA loads)."""
    wgmma: bool
    """The PTX has wgmma.mma_async (Hopper warpgroup MMA); False for kernels without a dot or with M tiles < 64."""
    load_bytes: int
    """Widest per-thread global load in the PTX (ld.global[.v2|.v4].bN), in bytes: 16 = full-width vector loads;
    0 when every global load goes through cp.async / TMA."""

    @property
    def pipelined(self) -> bool:
        return self.cp_async or self.tma


def nvidia_unavailable() -> str | None:
    """None if this triton can compile for sm_90 here, else why not (a skip reason)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as e:
        return f"triton's compiler is not importable: {e}"
    tools = _bin_dir(triton)
    for tool in ("ptxas", "cuobjdump"):
        if not os.access(os.path.join(tools, tool), os.X_OK):
            return f"triton {triton.__version__} has no NVIDIA {tool} in {tools}"
    return None


def _bin_dir(triton) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def specialise(fn, args: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) for ASTSource, as the JIT would specialise `fn` on these arguments.

    args: every parameter of `fn` by name. Pointers and tensor descriptors as Triton type strings ('*bf16',
    'tensordesc<fp8e4nv[128, 128]>'; pointers are assumed 16-byte aligned, as torch allocations are), integers and
    floats as Python numbers, constexpr parameters as their values."""
    params = _params(fn)
    missing = [p for p, _ in params if p not in args]
    if missing:
        raise ValueError(f"{fn.__name__}: no value for parameter(s) {missing}")
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, is_constexpr) in enumerate(params):
        value = args[name]
        if is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, str):
            signature[name] = value
            if value.startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            raise ValueError(f"{fn.__name__}.{name}: a bool for a non-constexpr parameter")
        elif isinstance(value, int):
            if value == 1:  # the JIT turns ints equal to 1 into constants
                signature[name], constexprs[name] = "constexpr", 1
            else:
                signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
                if value % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise ValueError(f"{fn.__name__}.{name}: cannot specialise a {type(value).__name__}")
    return signature, constexprs, attrs


def _params(fn) -> list[tuple[str, bool]]:
    """(name, is constexpr) per parameter of a @triton.jit function (or the interpreter's wrapper of one)."""
    if hasattr(fn, "params"):
        return [(p.name, p.is_constexpr) for p in fn.params]
    import triton.language as tl

    sig = inspect.signature(fn.fn)
    return [(name, p.annotation in (tl.constexpr, "tl.constexpr")) for name, p in sig.parameters.items()]


def compile_sm90(fn, args: dict, num_warps: int, num_stages: int, label: str | None = None) -> Resources:
    """Compile `fn` for sm_90 with these arguments and launch options; read its resources from cubin and PTX."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constexprs, attrs = specialise(fn, args)
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 128),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    usage = _resource_usage(compiled.asm["cubin"], _bin_dir(triton))
    ptx = compiled.asm["ptx"]
    return Resources(
        kernel=label or fn.__name__, registers=usage["REG"], spill_bytes=usage["STACK"] + usage["LOCAL"],
        shared_bytes=int(compiled.metadata.shared), cp_async="cp.async." in ptx.replace("cp.async.bulk", ""),
        tma="cp.async.bulk.tensor" in ptx, wgmma="wgmma.mma_async" in ptx, load_bytes=_widest_load(ptx),
    )  # fmt: skip


def _widest_load(ptx: str) -> int:
    loads = re.findall(r"ld\.global(?:\.\w+)*?(?:\.v(\d))?\.[bfsu](\d+)", ptx)  # (vector width, bits) per load
    widths = [int(v or 1) * int(bits) // 8 for v, bits in loads]
    return max(widths, default=0)


def _resource_usage(cubin: bytes, tools: str) -> dict[str, int]:
    """cuobjdump --dump-resource-usage of one kernel: {"REG": …, "STACK": …, "SHARED": …, "LOCAL": …}."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", f.name], check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out))
    if "REG" not in found:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{out}")
    return {key: int(found.get(key, 0)) for key in ("REG", "STACK", "SHARED", "LOCAL")}


# ----------------------------------------------------------------------------------------------------------------------
# the project's kernels at LLaDA-8B shapes


def gemm_args(tma: bool, block_m: int, block_n: int, group_m: int, persistent: bool, M: int = LLADA_8B["M"],
              N: int = 3 * LLADA_8B["d"], K: int = LLADA_8B["d"]) -> dict:  # fmt: skip
    """Arguments of kernels._fp8_gemm_kernel as fp8_gemm passes them (K-major activation scales, bf16 output)."""
    G = K // 128
    if tma:
        a, w = f"tensordesc<fp8e4nv[{block_m}, 128]>", f"tensordesc<fp8e4nv[{block_n}, 128]>"
    else:
        a, w = "*fp8e4nv", "*fp8e4nv"
    return dict(
        a_src=a, as_ptr="*fp32", w_src=w, ws_ptr="*fp32", c_ptr="*bf16", M=M, N=N, K=K, G=G,
        stride_am=K, stride_wn=K, stride_asm=1, stride_asg=M, stride_wsn=G, stride_wsg=1, stride_cm=N,
        M_BUCKET=1 << (M - 1).bit_length(), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, GROUP_M=group_m,
        PERSISTENT=persistent, EVEN_K=True, USE_TMA=tma, OUT_BF16=True, RNE_BF16=False,
    )  # fmt: skip


def gemm_reports() -> list[Resources]:
    """Every config of the GEMM's autotune sets (pointer loads and TMA), compiled at the qkv GEMM's shape."""
    from . import kernels

    reports = []
    for tma in (False, True):
        for cfg in kernels._gpu_configs(tma):
            kw = cfg.kwargs
            label = (f"fp8_gemm{' tma' if tma else ''} {kw['BLOCK_M']}x{kw['BLOCK_N']}x128 g{kw['GROUP_M']} "
                     f"w{cfg.num_warps} s{cfg.num_stages}{' persistent' if kw['PERSISTENT'] else ''}")
            args = gemm_args(tma, kw["BLOCK_M"], kw["BLOCK_N"], kw["GROUP_M"], kw["PERSISTENT"])
            reports.append(compile_sm90(kernels._fp8_gemm_kernel, args, cfg.num_warps, cfg.num_stages, label))
    return reports


def producer_reports() -> list[Resources]:
    """The activation producers (blockwise and row-wise) and the standalone quantisers at LLaDA-8B shapes, with the
    launch constants their Python wrappers use on a GPU."""
    from . import kernels, producer_kernels, row_producer_kernels

    M, d, h, nh, hd = (LLADA_8B[k] for k in ("M", "d", "h", "heads", "head_dim"))
    T = LLADA_8B["seq"]
    rows, rrows, rbk = producer_kernels._ROWS, row_producer_kernels._ROWS, row_producer_kernels._BLOCK_K
    pk, rk = producer_kernels, row_producer_kernels
    # K-major activation scales [M, G] with stride (1, M), as empty_act_scales makes them
    specs = [
        (pk._rmsnorm_quant_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", M=M, D=d,
                                        G=d // 128, stride_xm=d, stride_qm=d, stride_sm=1, stride_sg=M, eps=1e-5,
                                        d_float=float(d), BLOCK_M=rows, BLOCK_K=128, OUT_BF16=True), 4),
        (pk._silu_mul_quant_kernel, dict(g_ptr="*bf16", u_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", M=M, H=h,
                                         stride_gm=2 * h, stride_um=2 * h, stride_qm=h, stride_sm=1, stride_sg=M,
                                         BLOCK_M=rows, BLOCK_K=128, OUT_BF16=True), 4),
        (pk._attn_out_quant_kernel, dict(a_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", T=T, HD=d, D=hd, M=M,
                                         stride_ab=nh * T * hd, stride_ah=T * hd, stride_at=hd, stride_ad=1,
                                         stride_qm=d, stride_sm=1, stride_sg=M, BLOCK_M=rows, BLOCK_K=128), 4),
        (pk._rope_kernel, dict(x_ptr="*bf16", c_ptr="*fp32", s_ptr="*fp32", o_ptr="*bf16", T=T, NH=nh, HALF=hd // 2,
                               stride_xb=T * 3 * d, stride_xt=3 * d, stride_xh=hd, stride_xd=1, BLOCK_T=16,
                               BLOCK_HALF=hd // 2, OUT_BF16=True), 4),
        (kernels._act_quant_kernel, dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", M=M, K=d, stride_xm=d,
                                         stride_sm=1, stride_sg=M, BLOCK_M=32, BLOCK_K=128), 4),
    ]
    for mode, name in ((0, "rmsnorm"), (1, "silu_mul"), (2, "attn_out")):
        specs.append((rk._row_quant_kernel, dict(
            a_ptr="*bf16", b_ptr="*bf16", w_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", M=M, K=d, stride_am=d,
            stride_bm=d, stride_qm=d, eps=1e-5, k_float=float(d), T=T, D=hd, stride_ab=nh * T * hd,
            stride_ah=T * hd, stride_at=hd, stride_ad=1, BLOCK_M=rrows, BLOCK_K=rbk, MODE=mode, OUT_BF16=True),
            4, f"row_quant[{name}]"))  # fmt: skip
    out = []
    for spec in specs:
        fn, args, warps = spec[:3]
        label = spec[3] if len(spec) > 3 else fn.__name__.strip("_").removesuffix("_kernel")
        out.append(compile_sm90(fn, args, warps, 3, label))  # the JIT defaults: 4 warps, 3 stages
    return out


def report_table(reports: list[Resources]) -> str:
    """A fixed-width table of the reports (what tests print and scripts/aot_check.py shows)."""
    head = f"{'kernel':<48} {'regs':>4} {'spill':>5} {'smem':>7} {'pipelined':>9} {'wgmma':>5} {'ld B':>4}"
    lines = [head, "-" * len(head)]
    for r in reports:
        pipe = "tma" if r.tma else ("cp.async" if r.cp_async else "no")
        lines.append(f"{r.kernel:<48} {r.registers:>4} {r.spill_bytes:>5} {r.shared_bytes:>7} {pipe:>9} "
                     f"{'yes' if r.wgmma else 'no':>5} {r.load_bytes:>4}")
    return "\n".join(lines)


def as_json(reports: list[Resources]) -> list[dict]:
    return [asdict(r) for r in reports]


def spill_probe() -> list[Resources]:
    """A tile known to spill (128×256 on 8 warps with pointer loads, out of the autotune set): shows the check bites."""
    from . import kernels

    return [compile_sm90(kernels._fp8_gemm_kernel, gemm_args(False, 128, 256, 8, False), 8, 3,
                         "fp8_gemm 128x256x128 g8 w8 s3 (probe)")]


KINDS = {"producers": producer_reports, "gemm": gemm_reports, "spill_probe": spill_probe}


def reports(kind: str) -> list[Resources]:
    """KINDS[kind]() compiled in a clean subprocess (no TRITON_INTERPRET), so it works from tests and scripts alike."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use one of {', '.join(KINDS)}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when unset; 1 is what the JIT does today
    out = subprocess.run([sys.executable, "-m", "dllm_ais.fp8.aot", kind], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"compiling {kind} for sm_90 failed:\n{out.stderr[-4000:]}")
    return [Resources(**row) for row in json.loads(out.stdout)]


if __name__ == "__main__":
    print(json.dumps(as_json(KINDS[sys.argv[1]]())))
