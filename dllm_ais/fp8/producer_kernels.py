"""Triton producer kernels of the fused rollout model: each writes the e4m3 codes + 1×128 scales its consumer GEMM
reads (or, for RoPE, the rotated heads), so no bf16 intermediate is written and re-read by a separate quantiser.

  rmsnorm_quant(x, w, eps)   RMSNorm -> quant          twin: producers.rmsnorm_quant
  silu_mul_quant(gate, up)   SiLU(gate)·up -> quant    twin: producers.silu_mul_quant
  attn_out_quant(att)        [B,H,T,D] -> [B·T,H·D] -> quant (the transpose is folded into the loads)
                                                       twin: producers.attn_out_quant
  rope(x, cos, sin)          [B,T,H,D] view -> rotated [B,H,T,D], half-width tables, no `cat`
                                                       twin: producers.apply_rope
  qk_norm_rope(x, w, eps, cos, sin)
                             [B,T,H,D] view -> per-head RMSNorm -> RoPE in the model dtype -> [B,H,T,D] (SDAR's
                             q_norm / k_norm; tables in the model dtype)   twin: producers.qk_norm_rope

Each is registered as a `torch.library.triton_op` launched through `wrap_triton`, so torch.compile traces into the
kernel instead of breaking the graph (as torchao's prototype/blockwise_fp8_training/kernels.py does); called eagerly,
the public functions launch the kernel directly, skipping the op's dispatch (fp8/eager.py; same kernel, same bits).
The model dtype (x.dtype, bf16 or fp32) is the dtype the producer's output is rounded to before quantisation, as the
unfused model does it; the interpreter's fp32 -> bf16 cast truncates, so rounding goes through
kernels._round_to_bf16 (and kernels._round_to_e4m3 for the e4m3 cast; DESIGN.md §7).

Agreement with the twins (tests/test_fp8_producers.py, interpreter): attn_out_quant and rope are bit-identical (no
reduction, no transcendental; on a GPU the compiler may contract a·b − c·d into an FMA, which can move the last fp32
bit); rmsnorm_quant and silu_mul_quant sum / exponentiate in a different order or library than torch, so a value can
land one bf16 ulp away and its code one e4m3 step away (|code bits difference| ≤ 1, scales within one bf16 ulp);
qk_norm_rope sums the head's squares in another order than torch's mean, so a normalised value can land one
model-dtype ulp away before the rotation (tests/test_fp8_fused_sdar.py states what it measured).

Launch geometry (bandwidth-bound kernels; register / vector facts from the AOT check, dllm_ais/fp8/aot.py, sm_90):
  rmsnorm_quant   one row per program, one pass: the row is loaded once as a [next_pow2(G), 128] tile (d = 4096:
                  32 × 128, 4 warps, 32 elements = four 16-byte loads per thread), reduced, normalised and quantised
                  group by group from registers (was: 4 rows per program, two passes over x).
  silu_mul_quant  program (row, j) handles 16 groups (2048 elements, 16 per thread at 4 warps): at M = 10240, h =
                  12288 that is 61,440 programs (was 245,760 of 4 × 128 with 8-byte loads); at M = 64, 384 programs,
                  enough for 132 SMs.
  attn_out_quant  the same over the H·D output columns with 8 groups per program (8 elements = 16 bytes per thread):
                  40,960 programs at M = 10240 (was 81,920), 256 at M = 64.
  rmsnorm_quant at M = 64 launches 64 programs (a row's norm needs the whole row; 512 KB of input in all).
  rope            [16 positions × D/2] per (batch, head) program, as before (already 16-byte vectors).
The PTX of all four uses ld.global.v4.b32 / st.global.v4.b32 (16 bytes per thread); none spills.

Activation scales are allocated by `empty_act_scales`, in the layout `kernels.quantize_act` returns ([M, G], K-major);
the kernels write through explicit (row, group) strides, so that helper is the one place a layout change goes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .eager import direct_launch, eager_or_op
from .kernels import INTERPRET, _round_to_bf16, _round_to_e4m3, _scale_from_amax
from .quant import BLOCK, FP8_DTYPE, num_blocks

_GROUPS = 16  # 1×128 groups per silu_mul_quant program: 2048 elements, 16 per thread at 4 warps
_ATT_GROUPS = 8  # per attn_out_quant program (d = 4096 has 32 groups: 4 programs per row, 256 programs at M = 64)


_ROPE_T = 32 if INTERPRET else 16  # positions per rope program (the interpreter's cost is per program)


def _groups(G: int, most: int = _GROUPS) -> int:
    """Groups per program for a row of G groups: at most `most`, a power of two (tl.arange)."""
    return min(most, triton.next_power_of_2(G))


def empty_act_scales(M: int, G: int, device: torch.device) -> torch.Tensor:
    """Uninitialised activation scales for M rows × G groups, in kernels.quantize_act's layout: [M, G] stored K-major
    (stride (1, M)), the outer-dim-major layout cuBLAS's blockwise mode needs and the GEMM reads contiguously."""
    return torch.empty_strided((M, G), (1, M), dtype=torch.float32, device=device)  # one op (not empty + t)


def _check_model_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"{name} must be bfloat16 or float32 (the model dtype), got {t.dtype}")


# ----------------------------------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _quant_store_row(y, row64, grp, cols, mask, q_ptr, s_ptr, stride_qm, stride_sm, stride_sg, G):
    """y [GB, 128] fp32 = GB consecutive 1×128 groups of one row -> codes at q[row, cols], scales at s[row, grp]."""
    scale = _scale_from_amax(tl.max(tl.abs(y), axis=1))  # [GB]
    q = _round_to_e4m3(tl.math.div_rn(y, scale[:, None]))  # [GB, 128]
    tl.store(q_ptr + row64 * stride_qm + cols, q.to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + row64 * stride_sm + grp.to(tl.int64) * stride_sg, scale, mask=grp < G)


@triton.jit
def _to_model_dtype(y, OUT_BF16: tl.constexpr):
    """fp32 -> fp32 on the model dtype's grid (bf16: round to nearest even; fp32: unchanged)."""
    if OUT_BF16:
        y = _round_to_bf16(y)
    return y


@triton.jit
def _group_tile(GROUPS: tl.constexpr, BLOCK_K: tl.constexpr, g0, D):
    """Groups g0 … g0 + GROUPS − 1 of a row as a [GROUPS, BLOCK_K] tile: (group index [GB], column [GB, BK], mask)."""
    grp = g0 + tl.arange(0, GROUPS)  # [GB]
    cols = grp[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]  # [GB, BK]
    return grp, cols, cols < D


@triton.jit
def _rmsnorm_quant_kernel(
    x_ptr, w_ptr, q_ptr, s_ptr,  # x [M, D] (row stride stride_xm), w [D], q [M, D], s [M, G] (strides sm, sg)
    M, D, G, stride_xm, stride_qm, stride_sm, stride_sg, eps, d_float,  # d_float: D as a float
    GROUPS: tl.constexpr, BLOCK_K: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    """One row per program, one pass: the whole row (GROUPS ≥ G groups of 128) is loaded once into registers."""
    row64 = tl.program_id(0).to(tl.int64)
    grp, cols, mask = _group_tile(GROUPS, BLOCK_K, 0, D)
    x = tl.load(x_ptr + row64 * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)  # [GB, BK]
    ss = tl.sum(tl.sum(x * x, axis=1), axis=0)  # scalar
    # inductor types float scalars that come from symbolic shapes as fp64: the math stays fp32 either way
    r = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(ss, tl.cast(d_float, tl.float32)) + tl.cast(eps, tl.float32)))
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = _to_model_dtype((x * r) * w, OUT_BF16)
    _quant_store_row(y, row64, grp, cols, mask, q_ptr, s_ptr, stride_qm, stride_sm, stride_sg, G)


@triton.jit
def _silu_mul_quant_kernel(
    g_ptr, u_ptr, q_ptr, s_ptr,  # gate, up [M, H] (row strides), q [M, H], s [M, G] (strides sm, sg)
    M, H, G, stride_gm, stride_um, stride_qm, stride_sm, stride_sg,
    GROUPS: tl.constexpr, BLOCK_K: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    """Program (row, j): groups j·GROUPS … of one row, a [GROUPS, 128] tile (16-byte vector loads per thread)."""
    row64 = tl.program_id(0).to(tl.int64)
    grp, cols, mask = _group_tile(GROUPS, BLOCK_K, tl.program_id(1) * GROUPS, H)
    gate = tl.load(g_ptr + row64 * stride_gm + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(u_ptr + row64 * stride_um + cols, mask=mask, other=0.0).to(tl.float32)
    act = _to_model_dtype(tl.math.div_rn(gate, 1.0 + tl.exp(-gate)), OUT_BF16)  # F.silu in the model dtype
    y = _to_model_dtype(act * up, OUT_BF16)
    _quant_store_row(y, row64, grp, cols, mask, q_ptr, s_ptr, stride_qm, stride_sm, stride_sg, G)


@triton.jit
def _attn_out_quant_kernel(
    a_ptr, q_ptr, s_ptr,  # a [B, H, T, D] (any strides), q [B·T, H·D], s [B·T, G] (strides sm, sg)
    T, HD, D, G, stride_ab, stride_ah, stride_at, stride_ad, stride_qm, stride_sm, stride_sg,
    GROUPS: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (row = b·T + t, j): groups j·GROUPS … of output row `row`; column h·D + d reads a[b, h, t, d]."""
    row64 = tl.program_id(0).to(tl.int64)
    grp, cols, mask = _group_tile(GROUPS, BLOCK_K, tl.program_id(1) * GROUPS, HD)
    row_off = (row64 // T) * stride_ab + (row64 % T) * stride_at
    col_off = (cols // D).to(tl.int64) * stride_ah + (cols % D).to(tl.int64) * stride_ad  # [GB, BK]
    y = tl.load(a_ptr + row_off + col_off, mask=mask, other=0.0).to(tl.float32)
    _quant_store_row(y, row64, grp, cols, mask, q_ptr, s_ptr, stride_qm, stride_sm, stride_sg, G)


@triton.jit
def _rope_kernel(
    x_ptr, c_ptr, s_ptr, o_ptr,  # x [B, T, H, D] (any strides), cos/sin [B, T, D/2] contiguous, o [B, H, T, D]
    T, NH, HALF, stride_xb, stride_xt, stride_xh, stride_xd,
    BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(0)
    b = bh // NH
    h = bh % NH
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    j = tl.arange(0, BLOCK_HALF)  # [BH]
    mask = (t[:, None] < T) & (j[None, :] < HALF)
    t64 = t.to(tl.int64)
    x_row = x_ptr + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh + t64[:, None] * stride_xt
    x1 = tl.load(x_row + j[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (j[None, :] + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    tab = (b.to(tl.int64) * T + t64[:, None]) * HALF + j[None, :]
    c = tl.load(c_ptr + tab, mask=mask, other=0.0)
    s = tl.load(s_ptr + tab, mask=mask, other=0.0)
    o_row = o_ptr + (bh.to(tl.int64) * T + t64[:, None]) * (2 * HALF)
    o1 = _to_model_dtype(x1 * c - x2 * s, OUT_BF16)
    o2 = _to_model_dtype(x2 * c + x1 * s, OUT_BF16)
    tl.store(o_row + j[None, :], o1.to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + j[None, :] + HALF, o2.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr, w_ptr, c_ptr, s_ptr, o_ptr,  # x [B, T, H, D] (any strides), w [D], cos/sin [B, T, D/2], o [B, H, T, D]
    T, NH, HALF, stride_xb, stride_xt, stride_xh, stride_xd, eps, d_float,  # d_float: D as a float
    BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    """Program (b·NH + h, j): BLOCK_T positions of one head; each row's RMSNorm over its D = 2·HALF values, then the
    rotation with every product and sum rounded to the model dtype (gqa.rotate's order; tables in that dtype)."""
    bh = tl.program_id(0)
    b = bh // NH
    h = bh % NH
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    j = tl.arange(0, BLOCK_HALF)  # [BH]
    mask = (t[:, None] < T) & (j[None, :] < HALF)
    t64 = t.to(tl.int64)
    x_row = x_ptr + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh + t64[:, None] * stride_xt
    x1 = tl.load(x_row + j[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)  # [BT, BH]
    x2 = tl.load(x_row + (j[None, :] + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)  # [BT]
    r = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(ss, tl.cast(d_float, tl.float32)) + tl.cast(eps, tl.float32)))
    w1 = tl.load(w_ptr + j, mask=j < HALF, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + j + HALF, mask=j < HALF, other=0.0).to(tl.float32)
    y1 = _to_model_dtype((x1 * r[:, None]) * w1[None, :], OUT_BF16)  # SDARRMSNorm: fp32 math, one cast
    y2 = _to_model_dtype((x2 * r[:, None]) * w2[None, :], OUT_BF16)
    tab = (b.to(tl.int64) * T + t64[:, None]) * HALF + j[None, :]
    c = tl.load(c_ptr + tab, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + tab, mask=mask, other=0.0).to(tl.float32)
    o1 = _to_model_dtype(_to_model_dtype(y1 * c, OUT_BF16) - _to_model_dtype(y2 * s, OUT_BF16), OUT_BF16)
    o2 = _to_model_dtype(_to_model_dtype(y2 * c, OUT_BF16) + _to_model_dtype(y1 * s, OUT_BF16), OUT_BF16)
    o_row = o_ptr + (bh.to(tl.int64) * T + t64[:, None]) * (2 * HALF)
    tl.store(o_row + j[None, :], o1.to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + j[None, :] + HALF, o2.to(o_ptr.dtype.element_ty), mask=mask)


def _rmsnorm_warps(G: int) -> int:
    """Warps for a one-row rmsnorm program of G groups: ~32 elements (4 × 16-byte bf16 vectors) per thread."""
    return max(1, min(16, triton.next_power_of_2(G) * BLOCK // (32 * 32)))


def aot_launches(M: int, d: int, h: int, n_heads: int, head_dim: int, seq: int) -> list:
    """(name, kernel, args, constexprs, num_warps) of each producer as launched at a bf16 model of width d, MLP hidden
    h, n_heads × head_dim attention and M = batch·seq rows, in dllm_ais.fp8.aot's format ("*dtype" pointers, ints
    with their values): the AOT check compiles exactly what the launchers above launch."""
    g_d, g_h = num_blocks(d), num_blocks(h)
    return [
        ("rmsnorm_quant", _rmsnorm_quant_kernel,
         dict(x_ptr="*bf16", w_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", M=M, D=d, G=g_d, stride_xm=d,
              stride_qm=d, stride_sm=1, stride_sg=M, eps=1e-5, d_float=float(d)),
         dict(GROUPS=triton.next_power_of_2(g_d), BLOCK_K=BLOCK, OUT_BF16=True), _rmsnorm_warps(g_d)),
        ("silu_mul_quant", _silu_mul_quant_kernel,
         dict(g_ptr="*bf16", u_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", M=M, H=h, G=g_h, stride_gm=2 * h,
              stride_um=2 * h, stride_qm=h, stride_sm=1, stride_sg=M),
         dict(GROUPS=_groups(g_h), BLOCK_K=BLOCK, OUT_BF16=True), 4),
        ("attn_out_quant", _attn_out_quant_kernel,
         dict(a_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*fp32", T=seq, HD=d, D=head_dim, G=g_d,
              stride_ab=n_heads * seq * head_dim, stride_ah=seq * head_dim, stride_at=head_dim, stride_ad=1,
              stride_qm=d, stride_sm=1, stride_sg=M),
         dict(GROUPS=_groups(g_d, _ATT_GROUPS), BLOCK_K=BLOCK), 4),
        ("rope", _rope_kernel,
         dict(x_ptr="*bf16", c_ptr="*fp32", s_ptr="*fp32", o_ptr="*bf16", T=seq, NH=n_heads, HALF=head_dim // 2,
              stride_xb=seq * 3 * d, stride_xt=3 * d, stride_xh=head_dim, stride_xd=1),
         dict(BLOCK_T=_ROPE_T, BLOCK_HALF=triton.next_power_of_2(head_dim // 2), OUT_BF16=True), 4),
        ("qk_norm_rope", _qk_norm_rope_kernel,
         dict(x_ptr="*bf16", w_ptr="*bf16", c_ptr="*bf16", s_ptr="*bf16", o_ptr="*bf16", T=seq, NH=n_heads,
              HALF=head_dim // 2, stride_xb=seq * 3 * d, stride_xt=3 * d, stride_xh=head_dim, stride_xd=1, eps=1e-6,
              d_float=float(head_dim)),
         dict(BLOCK_T=_ROPE_T, BLOCK_HALF=triton.next_power_of_2(head_dim // 2), OUT_BF16=True), 4),
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# launchers: `launch` is eager.direct_launch (the kernel itself) or torch.library.wrap_triton (inside the ops below)


def _fake_quant(x2d_shape: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    M, K = x2d_shape
    return torch.empty((M, K), dtype=FP8_DTYPE, device=device), empty_act_scales(M, num_blocks(K), device)


def _register(name: str, fake):
    """A triton_op (torch.compile traces through wrap_triton into the kernel). Under the Triton interpreter wrap_triton
    cannot trace (it runs the kernel on fake tensors), so there the op is a custom_op with `fake` as its meta
    function: same graph, no break, and CPU tests can check the FP8 forward compiles as one graph."""

    def wrap(fn):
        if not INTERPRET:
            return triton_op(name, mutates_args={})(fn)
        op = torch.library.custom_op(name, mutates_args=())(fn)
        op.register_fake(fake)
        return op

    return wrap


def _rmsnorm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, launch=direct_launch):
    """x [M, d] (bf16/fp32, unit last stride), weight [d] -> (codes [M, d] e4m3, scales [M, ceil(d/128)] fp32)."""
    _check_model_dtype("x", x)
    torch._check(x.dim() == 2 and x.stride(-1) == 1 and weight.shape == (x.shape[1],), lambda: "x [M, d], w [d]")
    M, D = x.shape
    G = num_blocks(D)
    q = torch.empty((M, D), dtype=FP8_DTYPE, device=x.device)
    s = empty_act_scales(M, G, x.device)
    if M and D:
        launch(_rmsnorm_quant_kernel)[(M,)](
            x, weight.contiguous(), q, s, M, D, G, x.stride(0), q.stride(0), s.stride(0), s.stride(1), eps, float(D),
            GROUPS=triton.next_power_of_2(G), BLOCK_K=BLOCK, OUT_BF16=x.dtype == torch.bfloat16,
            num_warps=_rmsnorm_warps(G),
        )
    return q, s


def _silu_mul_quant(gate: torch.Tensor, up: torch.Tensor, launch=direct_launch):
    """gate, up [M, h] (same dtype, unit last stride; e.g. column slices of the fused gate-up output)
    -> (codes [M, h] e4m3, scales [M, ceil(h/128)] fp32) of SiLU(gate)·up rounded to the dtype."""
    _check_model_dtype("gate", gate)
    torch._check(gate.shape == up.shape and gate.dtype == up.dtype and gate.dim() == 2, lambda: "gate, up [M, h]")
    torch._check(gate.stride(-1) == 1 and up.stride(-1) == 1, lambda: "gate and up need unit last stride")
    M, H = gate.shape
    G = num_blocks(H)
    q = torch.empty((M, H), dtype=FP8_DTYPE, device=gate.device)
    s = empty_act_scales(M, G, gate.device)
    if M and H:
        gb = _groups(G)
        launch(_silu_mul_quant_kernel)[(M, triton.cdiv(G, gb))](
            gate, up, q, s, M, H, G, gate.stride(0), up.stride(0), q.stride(0), s.stride(0), s.stride(1),
            GROUPS=gb, BLOCK_K=BLOCK, OUT_BF16=gate.dtype == torch.bfloat16, num_warps=4,
        )
    return q, s


def _attn_out_quant(att: torch.Tensor, launch=direct_launch):
    """att [B, H, T, D] (any strides) -> (codes [B·T, H·D] e4m3, scales [B·T, ceil(H·D/128)] fp32)."""
    torch._check(att.dim() == 4, lambda: "att must be [B, H, T, D]")
    B, H, T, D = att.shape
    M, HD = B * T, H * D
    G = num_blocks(HD)
    q = torch.empty((M, HD), dtype=FP8_DTYPE, device=att.device)
    s = empty_act_scales(M, G, att.device)
    if M and HD:
        gb = _groups(G, _ATT_GROUPS)
        launch(_attn_out_quant_kernel)[(M, triton.cdiv(G, gb))](
            att, q, s, T, HD, D, G, *att.stride(), q.stride(0), s.stride(0), s.stride(1),
            GROUPS=gb, BLOCK_K=BLOCK, num_warps=4,
        )
    return q, s


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, launch=direct_launch):
    """x [B, T, H, D] (any strides; e.g. a view into the fused QKV output), cos, sin [B, T, D/2] fp32
    -> rotated [B, H, T, D] contiguous in x.dtype."""
    _check_model_dtype("x", x)
    torch._check(x.dim() == 4 and x.shape[-1] % 2 == 0, lambda: "x must be [B, T, H, D] with even D")
    B, T, H, D = x.shape
    torch._check(cos.shape == (B, T, D // 2) and sin.shape == cos.shape, lambda: "cos, sin must be [B, T, D/2]")
    out = torch.empty((B, H, T, D), dtype=x.dtype, device=x.device)
    if out.numel():
        launch(_rope_kernel)[(B * H, triton.cdiv(T, _ROPE_T))](
            x, cos.contiguous(), sin.contiguous(), out, T, H, D // 2, *x.stride(),
            BLOCK_T=_ROPE_T, BLOCK_HALF=triton.next_power_of_2(D // 2), OUT_BF16=x.dtype == torch.bfloat16,
            num_warps=4,
        )
    return out


def _qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                  launch=direct_launch):
    """x [B, T, H, D] (any strides; a view into the fused QKV output), weight [D], cos, sin [B, T, D/2] in x.dtype
    -> per-head RMSNorm then RoPE, [B, H, T, D] contiguous in x.dtype."""
    _check_model_dtype("x", x)
    torch._check(x.dim() == 4 and x.shape[-1] % 2 == 0, lambda: "x must be [B, T, H, D] with even D")
    B, T, H, D = x.shape
    torch._check(weight.shape == (D,), lambda: "weight must be [D]")
    torch._check(cos.shape == (B, T, D // 2) and sin.shape == cos.shape, lambda: "cos, sin must be [B, T, D/2]")
    out = torch.empty((B, H, T, D), dtype=x.dtype, device=x.device)
    if out.numel():
        launch(_qk_norm_rope_kernel)[(B * H, triton.cdiv(T, _ROPE_T))](
            x, weight.contiguous(), cos.contiguous(), sin.contiguous(), out, T, H, D // 2, *x.stride(), eps, float(D),
            BLOCK_T=_ROPE_T, BLOCK_HALF=triton.next_power_of_2(D // 2), OUT_BF16=x.dtype == torch.bfloat16,
            num_warps=4,
        )
    return out


# ----------------------------------------------------------------------------------------------------------------------
# the ops: torch.library registrations (torch.compile traces them through wrap_triton) and the public functions, which
# call the registration only while something traces and launch the kernel directly otherwise (fp8/eager.py)

_fake_att = lambda att: _fake_quant((att.shape[0] * att.shape[2], att.shape[1] * att.shape[3]), att.device)  # noqa: E731


@_register("dllm_ais::rmsnorm_quant", lambda x, weight, eps: _fake_quant(tuple(x.shape), x.device))
def rmsnorm_quant_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _rmsnorm_quant(x, weight, eps, wrap_triton)


@_register("dllm_ais::silu_mul_quant", lambda gate, up: _fake_quant(tuple(gate.shape), gate.device))
def silu_mul_quant_op(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _silu_mul_quant(gate, up, wrap_triton)


@_register("dllm_ais::attn_out_quant", _fake_att)
def attn_out_quant_op(att: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _attn_out_quant(att, wrap_triton)


@_register("dllm_ais::rope", lambda x, cos, sin: x.new_empty((x.shape[0], x.shape[2], x.shape[1], x.shape[3])))
def rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _rope(x, cos, sin, wrap_triton)


@_register("dllm_ais::qk_norm_rope",
           lambda x, weight, eps, cos, sin: x.new_empty((x.shape[0], x.shape[2], x.shape[1], x.shape[3])))
def qk_norm_rope_op(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                    sin: torch.Tensor) -> torch.Tensor:
    return _qk_norm_rope(x, weight, eps, cos, sin, wrap_triton)


rmsnorm_quant = eager_or_op(rmsnorm_quant_op, _rmsnorm_quant)
silu_mul_quant = eager_or_op(silu_mul_quant_op, _silu_mul_quant)
attn_out_quant = eager_or_op(attn_out_quant_op, _attn_out_quant)
rope = eager_or_op(rope_op, _rope)
qk_norm_rope = eager_or_op(qk_norm_rope_op, _qk_norm_rope)
