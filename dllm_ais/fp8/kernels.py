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
GPU caveat (not measurable here): if the compiled kernels flush fp32 denormals, inputs below 2**-126 in magnitude can
differ from the reference — all such values quantise to a (signed) zero code anyway.
"""

from __future__ import annotations

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
    x_ptr, q_ptr, s_ptr,  # x [M, K] (row stride stride_xm), q [M, K] contiguous, s [M, G] contiguous
    M, K, G, stride_xm,
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
    tl.store(s_ptr + rows64 * G + g, scale, mask=rows < M)


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
    a_ptr, as_ptr, w_ptr, ws_ptr, c_ptr,  # a [M, K] e4m3, as [M, G], w [N, K] e4m3, ws [NB, G], c [M, N]
    M, N, K, G, stride_am, stride_wn, stride_cm, M_BUCKET,  # M_BUCKET: autotune key only
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    OUT_BF16: tl.constexpr,
):  # fmt: skip
    """c = sum_kb (a_kb @ w_kb^T) * as[:, kb] * ws[nb, kb]; BLOCK_K == 128 and BLOCK_N divides 128 (one ws per tile)."""
    # grouped launch order: GROUP_M row-tiles share their column tiles while those are hot in L2
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * num_n
    first_m = (pid // group_size) * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows_in_group
    pid_n = (pid % group_size) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    offs_k = tl.arange(0, BLOCK_K)  # [BK]
    m_ok = offs_m < M
    n_ok = offs_n < N
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :]  # [BM, BK]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]  # [BK, BN] = tile of W^T
    as_ptrs = as_ptr + offs_m.to(tl.int64) * G  # [BM]
    ws_row = ws_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * G  # this tile's weight-block row

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, G):
        k_ok = offs_k < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK] e4m3
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)  # [BK, BN] e4m3
        a_scale = tl.load(as_ptrs + kb, mask=m_ok, other=0.0)  # [BM]
        w_scale = tl.load(ws_row + kb)  # scalar
        acc += tl.dot(a, w, out_dtype=tl.float32) * (a_scale[:, None] * w_scale)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    c_mask = m_ok[:, None] & n_ok[None, :]
    if OUT_BF16:
        tl.store(c_ptrs, _round_to_bf16(acc).to(tl.bfloat16), mask=c_mask)
    else:
        tl.store(c_ptrs, acc, mask=c_mask)


_GPU_GEMM_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": 8}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(128, 128, 8, 3), (128, 128, 4, 4), (64, 128, 4, 4), (128, 64, 4, 4), (256, 128, 8, 3)]
]
# Autotune only when compiled: the interpreter fails with more than one config (DESIGN.md §7).
_fp8_gemm_tuned = (
    None if INTERPRET else triton.autotune(_GPU_GEMM_CONFIGS, key=["N", "K", "M_BUCKET"])(_fp8_gemm_kernel)
)


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


def quantize_act(
    x: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 1×128 group. x [..., K] (fp32/bf16/fp16) -> (codes [..., K] e4m3, scales [..., ceil(K/128)] fp32).

    `out` = (codes, scales) buffers to write into (contiguous, shapes as returned).
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
        out = (
            torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device),
            torch.empty((*lead, G), dtype=torch.float32, device=x.device),
        )
    _check_out("out codes", out[0], FP8_DTYPE, tuple(x.shape), x.device)
    _check_out("out scales", out[1], torch.float32, (*lead, G), x.device)
    if M and K:
        block_m = 32 if INTERPRET else 8
        _act_quant_kernel[(triton.cdiv(M, block_m), G)](
            x2, out[0], out[1], M, K, G, x2.stride(0), BLOCK_M=block_m, BLOCK_K=BLOCK, num_warps=4
        )
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


def fp8_gemm(
    xq: torch.Tensor,
    xs: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Blockwise-scaled FP8 GEMM y = x @ W^T with fp32 accumulation; twin of quant.fp8_gemm_reference.

    xq [M, K] e4m3, xs [M, ceil(K/128)] fp32, wq [N, K] e4m3, ws [ceil(N/128), ceil(K/128)] fp32
    -> y [M, N] in out_dtype (bfloat16 or float32). block_m / block_n pin the tile (block_n must divide 128);
    by default the interpreter uses 128×128 (its cost is per program, not per element) and a GPU autotunes.
    """
    _check_fp8("xq", xq, 2)
    _check_fp8("wq", wq, 2)
    (M, K), (N, Kw) = xq.shape, wq.shape
    if K != Kw:
        raise ValueError(f"inner dimensions differ: xq is [M={M}, K={K}] but wq is [N={N}, K={Kw}]")
    if xq.device != wq.device:
        raise ValueError(f"xq is on {xq.device} but wq is on {wq.device}")
    G = num_blocks(K)
    xs, ws = xs.contiguous(), ws.contiguous()
    _check_scales("xs", xs, (M, G))
    _check_scales("ws", ws, (num_blocks(N), G))
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    if block_n is not None and (block_n > BLOCK or BLOCK % block_n):
        raise ValueError(f"block_n must divide {BLOCK}, got {block_n}")
    y = torch.empty((M, N), dtype=out_dtype, device=xq.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_()
    args = (xq, xs, wq, ws, y, M, N, K, G, xq.stride(0), wq.stride(0), y.stride(0), triton.next_power_of_2(M))
    flags = dict(BLOCK_K=BLOCK, OUT_BF16=out_dtype == torch.bfloat16)
    if INTERPRET or block_m is not None or block_n is not None:
        bm, bn = block_m or 128, block_n or 128
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        _fp8_gemm_kernel[grid](*args, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, num_warps=4, **flags)
    else:

        def grid(meta):
            return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

        _fp8_gemm_tuned[grid](*args, **flags)
    return y
