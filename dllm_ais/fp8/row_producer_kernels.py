"""Triton producers for the ROW-wise scheme (the scaled_mm backend: one fp32 scale per token row, torch._scaled_mm's
row-wise mode): each writes e4m3 codes [M, K] + scales [M, 1] of its producer's output in one kernel, so no bf16
intermediate is written and re-read by a separate quantiser.

  rmsnorm_rowquant(x, w, eps)   RMSNorm -> row quant                 twin: producers.rmsnorm_rowquant
  silu_mul_rowquant(gate, up)   SiLU(gate)·up -> row quant           twin: producers.silu_mul_rowquant
  attn_out_rowquant(att)        [B,H,T,D] -> [B·T,H·D] -> row quant  twin: producers.attn_out_rowquant

One kernel, three producer prologues (MODE): a row's scale needs its whole amax before the first code, so each
program runs over its rows' K twice (RMSNorm three times: sum of squares first) — the re-reads of a row (8–24 KB)
come from L2; HBM sees the input once and the codes once. Numerics as the block producers (producer_kernels.py):
values rounded to the model dtype before quantisation, fp32 → bf16 / e4m3 rounding done explicitly (the
interpreter's casts truncate); agreement with the twins: codes within one e4m3 step, scales within one bf16 ulp
(tests/test_fp8_row_producers.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from .eager import direct_launch, eager_or_op
from .kernels import INTERPRET, _round_to_bf16, _round_to_e4m3, _scale_from_amax
from .producer_kernels import _register  # triton_op on GPU, custom_op + fake under the interpreter
from .quant import FP8_DTYPE

_ROWS = 16 if INTERPRET else 1  # rows per program (the interpreter's cost is per program)
_BLOCK_K = 128 if INTERPRET else 1024  # columns per step (1024 bf16 per row: 16-byte vectors across a CTA)
_RMSNORM, _SILU_MUL, _ATTN_OUT = 0, 1, 2


@triton.jit
def _value(a_ptr, b_ptr, w_ptr, rows64, cols, mask, col_ok, r, stride_am, stride_bm, T, D,
           stride_ab, stride_ah, stride_at, stride_ad, MODE: tl.constexpr, OUT_BF16: tl.constexpr):  # fmt: skip
    """The producer's output at (rows, cols) [BM, BK] fp32, on the model dtype's grid."""
    if MODE == 0:  # RMSNorm: (x · r) · w
        x = tl.load(a_ptr + rows64[:, None] * stride_am + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = (x * r[:, None]) * w[None, :]
        if OUT_BF16:
            y = _round_to_bf16(y)
    elif MODE == 1:  # SiLU(gate) · up, each op rounded to the model dtype as torch does
        g = tl.load(a_ptr + rows64[:, None] * stride_am + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        u = tl.load(b_ptr + rows64[:, None] * stride_bm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        act = tl.math.div_rn(g, 1.0 + tl.exp(-g))
        if OUT_BF16:
            act = _round_to_bf16(act)
        y = act * u
        if OUT_BF16:
            y = _round_to_bf16(y)
    else:  # attention output [B, H, T, D] (any strides) read as [B·T, H·D]
        row_off = (rows64 // T) * stride_ab + (rows64 % T) * stride_at
        col_off = (cols // D).to(tl.int64) * stride_ah + (cols % D).to(tl.int64) * stride_ad
        y = tl.load(a_ptr + row_off[:, None] + col_off[None, :], mask=mask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _row_quant_kernel(
    a_ptr, b_ptr, w_ptr, q_ptr, s_ptr,  # inputs (MODE), q [M, K] e4m3, s [M, 1] fp32 contiguous
    M, K, stride_am, stride_bm, stride_qm, eps, k_float, T, D, stride_ab, stride_ah, stride_at, stride_ad,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    rows64 = rows.to(tl.int64)
    row_ok = rows < M
    offs = tl.arange(0, BLOCK_K)  # [BK]
    r = tl.full((BLOCK_M,), 1.0, tl.float32)
    if MODE == 0:  # RMSNorm's 1 / rms first
        ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + offs
            mask = row_ok[:, None] & (cols[None, :] < K)
            x = tl.load(a_ptr + rows64[:, None] * stride_am + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            ss += tl.sum(x * x, axis=1)
        # inductor types float scalars from symbolic shapes as fp64: keep the math fp32
        r = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(ss, tl.cast(k_float, tl.float32)) + tl.cast(eps, tl.float32)))
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # the row's amax
        cols = k0 + offs
        col_ok = cols < K
        mask = row_ok[:, None] & col_ok[None, :]
        y = _value(a_ptr, b_ptr, w_ptr, rows64, cols, mask, col_ok, r, stride_am, stride_bm, T, D,
                   stride_ab, stride_ah, stride_at, stride_ad, MODE, OUT_BF16)  # fmt: skip
        amax = tl.maximum(amax, tl.max(tl.abs(y), axis=1))
    scale = _scale_from_amax(amax)  # [BM]
    for k0 in range(0, K, BLOCK_K):  # codes
        cols = k0 + offs
        col_ok = cols < K
        mask = row_ok[:, None] & col_ok[None, :]
        y = _value(a_ptr, b_ptr, w_ptr, rows64, cols, mask, col_ok, r, stride_am, stride_bm, T, D,
                   stride_ab, stride_ah, stride_at, stride_ad, MODE, OUT_BF16)  # fmt: skip
        q = _round_to_e4m3(tl.math.div_rn(y, scale[:, None]))
        tl.store(q_ptr + rows64[:, None] * stride_qm + cols[None, :], q.to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + rows64, scale, mask=row_ok)


def _launch(mode: int, q: torch.Tensor, s: torch.Tensor, a: torch.Tensor, b: torch.Tensor, w: torch.Tensor,
            stride_am: int, stride_bm: int, eps: float, out_bf16: bool, T: int = 1, D: int = 1,
            strides4: tuple[int, int, int, int] = (0, 0, 0, 0), launch=direct_launch) -> None:  # fmt: skip
    M, K = q.shape
    if M and K:
        launch(_row_quant_kernel)[(triton.cdiv(M, _ROWS),)](
            a, b, w, q, s, M, K, stride_am, stride_bm, q.stride(0), eps, float(K), T, D, *strides4,
            BLOCK_M=_ROWS, BLOCK_K=_BLOCK_K, MODE=mode, OUT_BF16=out_bf16,
        )


def aot_launches(M: int, d: int, h: int, n_heads: int, head_dim: int, seq: int) -> list:
    """(name, kernel, args, constexprs, num_warps) of each row producer as launched on a GPU for a bf16 model (the
    format of producer_kernels.aot_launches): the AOT check compiles exactly what _launch launches."""
    def args(K: int, stride_am: int, stride_bm: int, strides4=(0, 0, 0, 0)) -> dict:
        return dict(a_ptr="*bf16", b_ptr="*bf16", w_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", M=M, K=K,
                    stride_am=stride_am, stride_bm=stride_bm, stride_qm=K, eps=1e-5, k_float=float(K), T=seq,
                    D=head_dim, stride_ab=strides4[0], stride_ah=strides4[1], stride_at=strides4[2],
                    stride_ad=strides4[3])  # fmt: skip

    def const(mode: int) -> dict:
        return dict(BLOCK_M=_ROWS, BLOCK_K=_BLOCK_K, MODE=mode, OUT_BF16=True)

    att = (n_heads * seq * head_dim, seq * head_dim, head_dim, 1)  # [B, H, T, D] contiguous
    return [
        ("rmsnorm_rowquant", _row_quant_kernel, args(d, d, 0), const(_RMSNORM), 4),
        ("silu_mul_rowquant", _row_quant_kernel, args(h, 2 * h, 2 * h), const(_SILU_MUL), 4),
        ("attn_out_rowquant", _row_quant_kernel, args(d, 0, 0, att), const(_ATTN_OUT), 4),
    ]


def _empty(M: int, K: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty((M, K), dtype=FP8_DTYPE, device=device), torch.empty((M, 1), dtype=torch.float32, device=device)


def _check_model_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"{name} must be bfloat16 or float32 (the model dtype), got {t.dtype}")


def _rmsnorm_rowquant(x: torch.Tensor, weight: torch.Tensor, eps: float, launch=direct_launch):
    """x [M, d] (bf16/fp32, unit last stride), weight [d] -> (codes [M, d] e4m3, scales [M, 1] fp32)."""
    _check_model_dtype("x", x)
    torch._check(x.dim() == 2 and x.stride(-1) == 1 and weight.shape == (x.shape[1],), lambda: "x [M, d], w [d]")
    q, s = _empty(x.shape[0], x.shape[1], x.device)
    _launch(_RMSNORM, q, s, x, x, weight.contiguous(), x.stride(0), 0, eps, x.dtype == torch.bfloat16,
            launch=launch)
    return q, s


def _silu_mul_rowquant(gate: torch.Tensor, up: torch.Tensor, launch=direct_launch):
    """gate, up [M, h] (same dtype, unit last stride) -> (codes [M, h] e4m3, scales [M, 1] fp32) of SiLU(gate)·up."""
    _check_model_dtype("gate", gate)
    torch._check(gate.shape == up.shape and gate.dtype == up.dtype and gate.dim() == 2, lambda: "gate, up [M, h]")
    torch._check(gate.stride(-1) == 1 and up.stride(-1) == 1, lambda: "gate and up need unit last stride")
    q, s = _empty(gate.shape[0], gate.shape[1], gate.device)
    _launch(_SILU_MUL, q, s, gate, up, gate, gate.stride(0), up.stride(0), 0.0, gate.dtype == torch.bfloat16,
            launch=launch)
    return q, s


def _attn_out_rowquant(att: torch.Tensor, launch=direct_launch):
    """att [B, H, T, D] (any strides) -> (codes [B·T, H·D] e4m3, scales [B·T, 1] fp32)."""
    torch._check(att.dim() == 4, lambda: "att must be [B, H, T, D]")
    B, H, T, D = att.shape
    q, s = _empty(B * T, H * D, att.device)
    _launch(_ATTN_OUT, q, s, att, att, att, 0, 0, 0.0, False, T=T, D=D, strides4=tuple(att.stride()),
            launch=launch)
    return q, s


# the ops (torch.compile traces them) and the public functions (direct launches eagerly; fp8/eager.py)


@_register("dllm_ais::rmsnorm_rowquant", lambda x, weight, eps: _empty(x.shape[0], x.shape[1], x.device))
def rmsnorm_rowquant_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _rmsnorm_rowquant(x, weight, eps, wrap_triton)


@_register("dllm_ais::silu_mul_rowquant", lambda gate, up: _empty(gate.shape[0], gate.shape[1], gate.device))
def silu_mul_rowquant_op(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _silu_mul_rowquant(gate, up, wrap_triton)


@_register("dllm_ais::attn_out_rowquant",
           lambda att: _empty(att.shape[0] * att.shape[2], att.shape[1] * att.shape[3], att.device))
def attn_out_rowquant_op(att: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _attn_out_rowquant(att, wrap_triton)


rmsnorm_rowquant = eager_or_op(rmsnorm_rowquant_op, _rmsnorm_rowquant)
silu_mul_rowquant = eager_or_op(silu_mul_rowquant_op, _silu_mul_rowquant)
attn_out_rowquant = eager_or_op(attn_out_rowquant_op, _attn_out_rowquant)
