"""Triton kernels for blockwise FP8: activation / weight quantisation and the blockwise-scaled FP8 GEMM.

Each kernel has a plain-torch twin with the same signature in `quant.py` (quantize_act, quantize_weight,
fp8_gemm_reference); tests/test_fp8_quant.py and tests/test_fp8_gemm.py hold them against each other.

Runs compiled on a CUDA GPU with compute capability ≥ 8.9 (fp8 tl.dot) and on CPU tensors under the Triton
interpreter (TRITON_INTERPRET=1, which must be set before this module is first imported; slow — tests only).
Written for triton 3.6–3.9 and around the interpreter's bugs (DESIGN.md §7):
  * fp32 -> fp8 casts are done on values already rounded to the e4m3 grid in fp32 (`_round_to_e4m3`), so the cast
    itself is exact (the triton 3.9 interpreter mis-rounds ties, mantissa carries and e4m3 subnormals, and turns
    values above 448 into NaN instead of saturating);
  * fp32 -> bf16 output is rounded to nearest-even by integer arithmetic before the (then exact) cast;
  * bf16 / fp16 loads are converted to fp32 immediately; no bf16 arithmetic, no bf16 tl.dot;
  * a single fixed config under the interpreter (autotune over several configs only on GPU); no tl.make_block_ptr;
  * divisions use tl.math.div_rn (div.rn.f32): a plain fp32 `/` compiles to div.full.f32 (≤ 2 ulp) on NVIDIA
    (triton-lang/triton#10661), and bit-identity with torch's IEEE division needs correct rounding.
GPU-only paths (selected by host flags / constexprs; the interpreter runs the same kernel with one pinned config):
an autotune set of the configs that compile for sm_90 without spilling (pruned per M bucket; dllm_ais/fp8/aot.py
checks them ahead of time), a persistent schedule for pinned launches (num_programs < #tiles: each program loops over
tiles), TMA tensor-descriptor operand loads on sm_90 (triton.tools.tensor_descriptor; the triton 3.9 interpreter
emulates them, so tests cover that branch too), an unmasked K loop when K % 128 == 0, and a direct bf16 store.
Activation scales are produced K-major ([M, G] with stride (1, M)), the layout torch._scaled_mm's blockwise mode needs.
GPU caveat (not measurable here): if the compiled kernels flush fp32 denormals, inputs below 2**-126 in magnitude can
differ from the reference — all such values quantise to a (signed) zero code anyway.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .quant import BLOCK, FP8_DTYPE, num_blocks

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # read once, like triton.jit does


# ----------------------------------------------------------------------------------------------------------------------
# jit helpers


@triton.jit
def _scale_from_amax(amax):
    """amax fp32 -> scale fp32: amax / 448 clamped to ≥ 2**-126, exactly 1.0 where amax == 0 (quant.scale_from_amax)."""
    scale = tl.maximum(tl.math.div_rn(amax, 448.0), 1.1754943508222875e-38)
    return tl.where(amax > 0.0, scale, 1.0)


@triton.jit
def _round_to_e4m3(y):
    """fp32 -> fp32 on the e4m3fn grid: clamp to ±448, round to nearest-even (normals and subnormals), keep the sign.

    Normals (|y| ≥ 2**-6): round the 23-bit fp32 mantissa to 3 bits in integer arithmetic (a carry correctly bumps
    the exponent). Subnormals (|y| < 2**-6): the grid is multiples of 2**-9; (a·2**9 + 1.5·2**23) − 1.5·2**23 rounds
    a·2**9 to an integer with the fp32 adder's round-to-nearest-even (a·2**9 is exact, so FMA contraction is harmless).
    """
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    bits = y.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    sign = bits ^ mag  # 0 or the sign bit
    normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & -1048576  # -1048576 == ~0xFFFFF: clear the 20 dropped bits
    a = mag.to(tl.float32, bitcast=True)
    sub = ((a * 512.0 + 12582912.0) - 12582912.0) * 0.001953125
    rounded = tl.where(a < 0.015625, sub.to(tl.int32, bitcast=True), normal)
    return (rounded | sign).to(tl.float32, bitcast=True)


@triton.jit
def _round_to_bf16(y):
    """fp32 -> fp32 on the bf16 grid, round-to-nearest-even (NaN kept), so the following .to(bf16) is exact."""
    bits = y.to(tl.int32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)  # -65536 == ~0xFFFF
    return tl.where(y != y, y, rounded)


# ----------------------------------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _cast_e4m3_kernel(y_ptr, q_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(q_ptr + offs, _round_to_e4m3(y).to(tl.float8e4nv), mask=mask)


@triton.jit
def _act_quant_kernel(
    x_ptr, q_ptr, s_ptr,  # x [M, K] (row stride stride_xm), q [M, K] contiguous, s [M, G] (via stride_sm, stride_sg)
    M, K, stride_xm, stride_sm, stride_sg,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    g = tl.program_id(1)
    cols = g * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
    rows64 = rows.to(tl.int64)
    mask = (rows[:, None] < M) & (cols[None, :] < K)  # [BM, BK]
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    scale = _scale_from_amax(tl.max(tl.abs(x), axis=1))  # [BM]
    q = _round_to_e4m3(tl.math.div_rn(x, scale[:, None]))  # [BM, BK]
    tl.store(q_ptr + rows64[:, None] * K + cols[None, :], q.to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + rows64 * stride_sm + g * stride_sg, scale, mask=rows < M)  # K-major: stride_sm == 1


@triton.jit
def _weight_quant_kernel(
    w_ptr, q_ptr, s_ptr,  # w [N, K] (row stride stride_wn), q [N, K] contiguous, s [NB, KB] contiguous
    N, K, KB, stride_wn,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    nb = tl.program_id(0)
    kb = tl.program_id(1)
    rows = (nb * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)).to(tl.int64)  # [B]
    cols = kb * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # [B]
    mask = (rows[:, None] < N) & (cols[None, :] < K)  # [B, B]
    w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    scale = _scale_from_amax(tl.max(tl.max(tl.abs(w), axis=1), axis=0))  # scalar
    q = _round_to_e4m3(tl.math.div_rn(w, scale))  # [B, B]
    tl.store(q_ptr + rows[:, None] * K + cols[None, :], q.to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + nb * KB + kb, scale)


@triton.jit
def _fp8_gemm_kernel(
    a_src, as_ptr, w_src, ws_ptr, c_ptr,  # a [M, K] e4m3, as [M, G], w [N, K] e4m3, ws [NB, G], c [M, N]
    M, N, K, G,
    stride_am, stride_wn, stride_asm, stride_asg, stride_wsn, stride_wsg, stride_cm,
    M_BUCKET,  # autotune key only
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, OUT_BF16: tl.constexpr, RNE_BF16: tl.constexpr,
):  # fmt: skip
    """c = sum_kb (a_kb @ w_kb^T) * as[:, kb] ⊗ ws[n // 128, kb], one 128-wide K block (BLOCK_K == 128) per step.

    Precision: one tl.dot per 128-wide K block, scaled and summed into an fp32 register accumulator. Hopper's FP8
    tensor cores (wgmma) accumulate a single dot with reduced precision (~14 mantissa bits kept); promoting every
    128-wide partial product to fp32 before summing bounds that error to one block — the remedy DeepGEMM uses too.
    Never fold the scales into a longer dot or pass `acc` into tl.dot to "save" the multiply.
    The scales of K block kb + 1 are loaded during step kb (a register prefetch: the pipeliner turns only the operand
    loads into cp.async), so their global-load latency is covered by a whole K step. Tried and not kept (AOT PTX,
    triton 3.9): promoting block kb − 1's result while block kb's wgmma runs (ping-pong) — the compiler still waits
    for wgmma group 0 right after issuing the dot, before the promotion, and 64×128 / 4 warps then spills 8 B.

    Schedule: programs walk the tiles tile = pid, pid + P, pid + 2P, … (P = the grid size). The autotuned launch uses
    P = #tiles (one tile each); a pinned launch may pass num_programs < #tiles (persistent: each program loops). The
    autotune set has no persistent duplicates (the body is the same code either way).
    Tiles are ordered in GROUP_M-row groups so the column tiles a group shares stay in L2.

    Operands: a_src / w_src are pointers, or (USE_TMA, GPU only) host-made tensor descriptors whose out-of-bounds
    rows / columns read as zero. Scales are read through their strides, so as may be [M, G] contiguous or K-major
    (stride (1, M): one K step reads BLOCK_M contiguous floats); weight scales are one scalar per K step when
    BLOCK_N ≤ 128 (the tile lies in one weight block; a [BN] vector of the same value cost the 128×128 tiles their
    registers) and a per-column vector ws[offs_n // 128, kb] for wider tiles, so BLOCK_N may be any power of two.
    """
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_m * num_n
    group_size = GROUP_M * num_n
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        first_m = (tile // group_size) * GROUP_M
        rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % group_size) % rows_in_group
        pid_n = (tile % group_size) // rows_in_group

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        offs_k = tl.arange(0, BLOCK_K)  # [BK]
        rows = (offs_m % M).to(tl.int64)  # [BM] wrapped into range: loads need no M / N masks (stores are masked)
        cols = (offs_n % N).to(tl.int64)  # [BN]
        as_ptrs = as_ptr + rows * stride_asm  # [BM]
        if BLOCK_N <= BLOCK_K:  # the tile lies in one 128-row weight block: one scalar scale per K step
            ws_ptrs = ws_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * stride_wsn
        else:  # [BN] weight-block row of each column (BLOCK_K == 128)
            ws_ptrs = ws_ptr + (cols // BLOCK_K) * stride_wsn

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        a_next = tl.load(as_ptrs)  # [BM] scales of K block 0; the loop loads block kb + 1's while block kb multiplies
        w_next = tl.load(ws_ptrs)  # [] or [BN]
        for kb in range(0, G):
            k0 = kb * BLOCK_K
            if USE_TMA:
                a = a_src.load([pid_m * BLOCK_M, k0])  # [BM, BK] e4m3, zero outside [M, K]
                w = w_src.load([pid_n * BLOCK_N, k0]).T  # [BK, BN] e4m3 (K-major smem, what fp8 wgmma wants)
            else:
                a_ptrs = a_src + rows[:, None] * stride_am + (k0 + offs_k)[None, :]  # [BM, BK]
                w_ptrs = w_src + cols[None, :] * stride_wn + (k0 + offs_k)[:, None]  # [BK, BN] = tile of W^T
                if EVEN_K:
                    a = tl.load(a_ptrs)
                    w = tl.load(w_ptrs)
                else:
                    k_ok = offs_k < K - k0
                    a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
                    w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
            a_scale = a_next  # [BM]
            w_scale = w_next  # [] or [BN]
            kn = (kb + 1) % G  # prefetch one K step ahead (the last step re-reads block 0: in range, unused)
            a_next = tl.load(as_ptrs + kn * stride_asg)
            w_next = tl.load(ws_ptrs + kn * stride_wsg)
            if BLOCK_N <= BLOCK_K:
                acc += tl.dot(a, w, out_dtype=tl.float32) * (a_scale * w_scale)[:, None]
            else:
                acc += tl.dot(a, w, out_dtype=tl.float32) * (a_scale[:, None] * w_scale[None, :])

        c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
        c_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        if OUT_BF16:
            if RNE_BF16:  # the interpreter's fp32 -> bf16 cast truncates: round to nearest-even first
                tl.store(c_ptrs, _round_to_bf16(acc).to(tl.bfloat16), mask=c_mask)
            else:  # compiled casts round to nearest-even already
                tl.store(c_ptrs, acc.to(tl.bfloat16), mask=c_mask)
        else:
            tl.store(c_ptrs, acc, mask=c_mask)


def _tma_block_shapes(nargs: dict) -> None:
    """Autotune pre-hook: the TMA descriptors' block shapes follow the config being tried (triton tutorial 09)."""
    nargs["a_src"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["w_src"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


# (BLOCK_M, BLOCK_N, GROUP_M, num_warps, num_stages): the configs that compile for sm_90 without spilling (AOT check,
# dllm_ais/fp8/aot.py, asserted by tests/test_aot_sm90.py; triton 3.9, LLaDA-8B shapes). Sources: vLLM's tuned H100
# block-FP8 configs (16×64…128, 4 warps, 4–5 stages for small M; 64×128, 4 warps, 3–4 stages), FBGEMM's triton fp8
# GEMM (128-wide tiles with 8 warps). Measured: 128×128 fits only with 8 warps (4 warps: 255 regs, 376 B spill);
# 64×256 only with 8 warps; 128×256 and 256×128 spill at 8 warps (352–376 B: the dot result and the accumulator are
# both live, 2 × 128 fp32 per thread) and are left out; 32×128 spills (8 B at 3–4 stages on triton 3.9, 16 B with TMA
# at 5 stages on triton 3.6) and is left out.
# prune_gemm_configs keeps, per M bucket, BLOCK_M ≤ the bucket (no wasted MMA rows) and, from 256 on, BLOCK_M ≥ 64.
_GPU_GEMM_SHAPES = [
    (16, 64, 8, 4, 4),  # decode-sized M
    (16, 128, 8, 4, 5),
    (32, 64, 8, 4, 4),
    (64, 128, 16, 4, 3),
    (64, 128, 16, 4, 4),
    (64, 128, 32, 4, 5),
    (64, 256, 8, 8, 3),
    (128, 64, 8, 4, 4),
    (128, 128, 8, 8, 3),
    (128, 128, 8, 8, 4),
]


def _gpu_configs(tma: bool) -> list:
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": gm},
            num_warps=w,
            num_stages=s,
            pre_hook=_tma_block_shapes if tma else None,
        )  # fmt: skip
        for bm, bn, gm, w, s in _GPU_GEMM_SHAPES
    ]


def prune_gemm_configs(configs: list, named_args: dict, **kwargs) -> list:
    """Autotune early prune per M bucket (M_BUCKET = next power of two of M): drop tiles taller than the bucket (at
    least 16), which would spend MMA work on padding rows; from a bucket of 256 on, also drop the tiles under 64 rows
    (they compile to mma.sync, not wgmma, and only suit decode-sized M). Never returns an empty list."""
    bucket = max(16, named_args["M_BUCKET"])
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= bucket and (bucket < 256 or c.kwargs["BLOCK_M"] >= 64)]
    return kept or [c for c in configs if c.kwargs["BLOCK_M"] == min(x.kwargs["BLOCK_M"] for x in configs)]


# Autotune only when compiled: the interpreter fails with more than one config (DESIGN.md §7).
_AUTOTUNE_KEY = ["N", "K", "M_BUCKET"]
_PRUNE = {"early_config_prune": prune_gemm_configs}


def _tuned(tma: bool):
    return triton.autotune(_gpu_configs(tma), key=_AUTOTUNE_KEY, prune_configs_by=_PRUNE)(_fp8_gemm_kernel)


_fp8_gemm_tuned = None if INTERPRET else _tuned(False)
_fp8_gemm_tuned_tma = None if INTERPRET else _tuned(True)


# ----------------------------------------------------------------------------------------------------------------------
# Python wrappers


def _check_fp8(name: str, t: torch.Tensor, dims: int) -> None:
    if t.dtype != FP8_DTYPE or t.dim() != dims or t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be a {dims}-D {FP8_DTYPE} tensor with unit last stride, got {t.dtype} "
            f"shape {tuple(t.shape)} stride {t.stride()}"
        )


def _check_scales(name: str, s: torch.Tensor, shape: tuple[int, ...]) -> None:
    if s.dtype != torch.float32 or tuple(s.shape) != shape:
        raise ValueError(f"{name} must be float32 of shape {shape}, got {s.dtype} {tuple(s.shape)}")


def _check_out(name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device) -> None:
    if t.dtype != dtype or tuple(t.shape) != shape or t.device != device or not t.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {dtype} tensor of shape {shape} on {device}, got {t.dtype} "
            f"{tuple(t.shape)} on {t.device}"
        )


def cast_to_e4m3(y: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even cast y [...] (fp32/bf16/fp16) -> e4m3 [...]; twin of quant.to_e4m3."""
    y = y.contiguous()
    q = torch.empty(y.shape, dtype=FP8_DTYPE, device=y.device)
    n = y.numel()
    if n:
        _cast_e4m3_kernel[(triton.cdiv(n, 1024),)](y, q, n, BLOCK_SIZE=1024)
    return q


def _k_major(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An empty fp32 tensor of `shape` [..., G] stored group-major (last dim outermost): [M, G] with stride (1, M)."""
    *lead, G = shape
    return torch.empty((G, *lead), dtype=torch.float32, device=device).movedim(0, -1)


def quantize_act(
    x: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 1×128 group. x [..., K] (fp32/bf16/fp16) -> (codes [..., K] e4m3, scales [..., ceil(K/128)] fp32).

    The scales are stored K-major (group-major): for x [M, K] an [M, G] tensor with stride (1, M), the outer-dim-major
    layout torch._scaled_mm's blockwise mode requires and the one fp8_gemm reads contiguously per K step. Values equal
    quant.quantize_act's (which returns a contiguous [M, G]); compare values, not strides.
    `out` = (codes, scales) buffers to write into: codes contiguous, scales of the returned shape in any layout whose
    leading dims flatten to one (K-major as returned, or contiguous).
    """
    if not x.is_floating_point() or x.dim() < 1:
        raise ValueError(f"quantize_act expects a floating tensor [..., K], got {x.dtype} {tuple(x.shape)}")
    *lead, K = x.shape
    G = num_blocks(K)
    x2 = x.reshape(-1, K)  # [M, K]
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    if out is None:
        out = (torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device), _k_major((*lead, G), x.device))
    _check_out("out codes", out[0], FP8_DTYPE, tuple(x.shape), x.device)
    s = out[1]
    if s.dtype != torch.float32 or tuple(s.shape) != (*lead, G) or s.device != x.device:
        raise ValueError(
            f"out scales must be a float32 tensor of shape {(*lead, G)} on {x.device}, got {s.dtype} "
            f"{tuple(s.shape)} on {s.device}"
        )
    try:
        s2 = s.view(M, G)  # shares memory: the kernel writes through its strides
    except RuntimeError as e:
        raise ValueError(f"out scales' leading dims must flatten to one without a copy, got stride {s.stride()}") from e
    if M and K:
        block_m = 32 if INTERPRET else 8
        _act_quant_kernel[(triton.cdiv(M, block_m), G)](
            x2, out[0], s2, M, K, x2.stride(0), s2.stride(0), s2.stride(1), BLOCK_M=block_m, BLOCK_K=BLOCK,
            num_warps=4,
        )  # fmt: skip
    return out


def quantize_weight(
    w: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 128×128 block. w [N, K] -> (codes [N, K] e4m3, scales [ceil(N/128), ceil(K/128)] fp32).

    `out` = (codes, scales) buffers to write into in place (how sync_weights requantises without allocating).
    """
    if not w.is_floating_point() or w.dim() != 2:
        raise ValueError(f"quantize_weight expects a floating [N, K] tensor, got {w.dtype} {tuple(w.shape)}")
    if w.stride(-1) != 1:
        w = w.contiguous()
    N, K = w.shape
    NB, KB = num_blocks(N), num_blocks(K)
    if out is None:
        out = (
            torch.empty((N, K), dtype=FP8_DTYPE, device=w.device),
            torch.empty((NB, KB), dtype=torch.float32, device=w.device),
        )
    _check_out("out codes", out[0], FP8_DTYPE, (N, K), w.device)
    _check_out("out scales", out[1], torch.float32, (NB, KB), w.device)
    if N and K:
        _weight_quant_kernel[(NB, KB)](w, out[0], out[1], N, K, KB, w.stride(0), BLOCK_SIZE=BLOCK, num_warps=8)
    return out


@functools.cache
def tma_unavailable(device: torch.device) -> str | None:
    """Why the TMA (tensor-descriptor) GEMM path cannot run on `device`, or None. Needs triton's host-side
    TensorDescriptor (triton.tools.tensor_descriptor, triton >= 3.4) and, compiled, a GPU with compute capability
    >= 9.0 (Hopper's TMA unit). The triton 3.9 interpreter emulates descriptor loads (tests use that); fp8_gemm still
    defaults to the pointer path there."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return f"triton {triton.__version__} has no triton.tools.tensor_descriptor.TensorDescriptor"
    if INTERPRET:
        return None if device.type == "cpu" else f"the interpreter runs on CPU tensors, not {device.type}"
    if device.type != "cuda":
        return f"compiled TMA needs a CUDA device, not {device.type}"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return "TMA needs compute capability >= 9.0"
    return None


def _tma_ok(xq: torch.Tensor, wq: torch.Tensor) -> bool:
    """TMA descriptors need 16-byte-aligned bases and row strides (fp8: K % 16 == 0)."""
    return all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in (xq, wq))


def _descriptor(t: torch.Tensor, block_shape: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block_shape)


def fp8_gemm(
    xq: torch.Tensor,
    xs: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_programs: int | None = None,
    use_tma: bool | None = None,
) -> torch.Tensor:
    """Blockwise-scaled FP8 GEMM y = x @ W^T with fp32 accumulation; twin of quant.fp8_gemm_reference.

    xq [M, K] e4m3, xs [M, ceil(K/128)] fp32 (contiguous or K-major, stride (1, M): same values either way),
    wq [N, K] e4m3, ws [ceil(N/128), ceil(K/128)] fp32 -> y [M, N] in out_dtype (bfloat16 or float32).

    Tuning knobs (defaults: the interpreter runs one fixed 128×128 config, its cost is per program; a GPU autotunes
    over _GPU_GEMM_SHAPES per (N, K, M bucket), with TMA descriptors where tma_unavailable(device) is None):
      block_m / block_n  pin the tile (powers of two ≥ 16; 128×256 is fine) and skip autotuning;
      num_programs       with a pinned tile: launch this many programs, each looping over tiles (persistent);
      use_tma            force the TMA path on (Hopper; or the interpreter, for tests) or off.
    """
    _check_fp8("xq", xq, 2)
    _check_fp8("wq", wq, 2)
    (M, K), (N, Kw) = xq.shape, wq.shape
    if K != Kw:
        raise ValueError(f"inner dimensions differ: xq is [M={M}, K={K}] but wq is [N={N}, K={Kw}]")
    if xq.device != wq.device:
        raise ValueError(f"xq is on {xq.device} but wq is on {wq.device}")
    G = num_blocks(K)
    _check_scales("xs", xs, (M, G))
    _check_scales("ws", ws, (num_blocks(N), G))
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if b is not None and (b < 16 or b & (b - 1)):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's minimum), got {b}")
    if num_programs is not None and num_programs < 1:
        raise ValueError(f"num_programs must be >= 1, got {num_programs}")
    if use_tma and tma_unavailable(xq.device):
        raise ValueError(f"use_tma=True but TMA cannot run here: {tma_unavailable(xq.device)}")
    if use_tma and not _tma_ok(xq, wq):
        raise ValueError("use_tma=True needs 16-byte-aligned xq / wq with row strides that are multiples of 16")
    y = torch.empty((M, N), dtype=out_dtype, device=xq.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_()
    if use_tma is None:
        use_tma = not INTERPRET and tma_unavailable(xq.device) is None and _tma_ok(xq, wq)
    pinned = INTERPRET or block_m is not None or block_n is not None
    bm, bn = block_m or 128, block_n or 128
    a_src, w_src = xq, wq
    if use_tma:  # block shapes: the pinned tile's, or set per config by the autotuner's pre-hook
        a_src, w_src = _descriptor(xq, [bm, BLOCK]), _descriptor(wq, [bn, BLOCK])
    args = (
        a_src, xs, w_src, ws, y, M, N, K, G,
        xq.stride(0), wq.stride(0), xs.stride(0), xs.stride(1), ws.stride(0), ws.stride(1), y.stride(0),
        triton.next_power_of_2(M),
    )  # fmt: skip
    flags = dict(
        BLOCK_K=BLOCK, EVEN_K=K % BLOCK == 0, USE_TMA=use_tma, OUT_BF16=out_dtype == torch.bfloat16, RNE_BF16=INTERPRET
    )
    if pinned:
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        grid = (min(tiles, num_programs or tiles),)
        warps = 8 if bm * bn >= 128 * 256 and not INTERPRET else 4
        _fp8_gemm_kernel[grid](*args, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, num_warps=warps, **flags)  # fmt: skip
    else:

        def grid(meta):
            return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

        (_fp8_gemm_tuned_tma if use_tma else _fp8_gemm_tuned)[grid](*args, **flags)
    return y
