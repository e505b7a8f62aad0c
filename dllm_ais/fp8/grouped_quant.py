"""One launch that requantises many weights: the 128×128-block quantisation of a list of [N, K] tensors into their
(fixed) FP8 code and scale buffers, for the weight sync of a rollout copy (fp8/fused_llada.sync_fused_llada).

The old sync launched kernels.quantize_weight once per master tensor (224 launches for LLaDA-8B) with one 128×128
tile per 256-thread program (156 registers). Here:
  * one launch for a whole group: every task's tensors are addressed as int64 element offsets from three base
    pointers (sources, codes, scales; one dtype each), read from a small device table `tasks` [T, 8];
  * a program quantises TILES consecutive 128×128 tiles of one task (table `progs` [P, 2]: task, first tile), in two
    passes of ROWS-row chunks per tile — amax, then codes (the second read of a 32 KB tile hits L2) — so a thread
    holds ROWS·128/(32·warps) values, not 64 (registers ≤ 128, no spills: tests/test_aot_sm90.py);
  * ragged shapes (N, K not multiples of 128) are masked as in quant.quantize_weight (zero tails, scale 1 when a
    block is all zero).
Numerics: the same amax, the same division (div_rn) and the same rounding (_round_to_e4m3) as kernels.quantize_weight
and quant.quantize_weight: bit-identical codes and scales (tests/test_fp8_grouped_quant.py).

The destinations never move (the rollout copy's buffers), so `progs` and the destination offsets are built once; the
source offsets are rebuilt (a [T, 8] int64 table copied to the device) only when a source tensor moved.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernels import INTERPRET, _round_to_e4m3, _scale_from_amax
from .quant import BLOCK, FP8_DTYPE, num_blocks

TILES = 4  # 128×128 tiles per program
ROWS = 128 if INTERPRET else 32  # rows per chunk: 32 × 128 over 4 warps = 32 fp32 per thread (interpreter: 1 chunk)
WARPS = 4
ALIGN = 16  # element offsets and row strides must be multiples of this (16-byte vectors for bf16 and e4m3)
_FIELDS = 8  # w_off, q_off, s_off, N, K, stride_wn, KB, unused


@triton.jit
def _grouped_weight_quant_kernel(
    w_base, q_base, s_base,  # sources (bf16 / fp32), codes (e4m3), scales (fp32): each task's at offsets from these
    tasks_ptr,  # int64 [T, 8]: w_off, q_off, s_off, N, K, stride_wn, KB, 0 (codes rows are K apart, scales KB apart)
    progs_ptr,  # int32 [P, 2]: task, first tile (tile t of a task = block (t // KB, t % KB))
    TILES: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0).to(tl.int64)
    task = tl.load(progs_ptr + 2 * p).to(tl.int64)
    t0 = tl.load(progs_ptr + 2 * p + 1)
    row = tasks_ptr + task * 8
    w_off = tl.multiple_of(tl.load(row), ALIGN)
    q_off = tl.multiple_of(tl.load(row + 1), ALIGN)
    s_off = tl.load(row + 2)
    N = tl.load(row + 3)
    K = tl.multiple_of(tl.load(row + 4), ALIGN)
    stride_wn = tl.multiple_of(tl.load(row + 5), ALIGN)
    KB = tl.load(row + 6)
    n_tiles = ((N + BLOCK - 1) // BLOCK) * KB
    r = tl.arange(0, ROWS)  # [R]
    c = tl.arange(0, BLOCK)  # [B]
    for i in range(TILES):
        t = t0 + i
        nb = t // KB
        kb = t % KB
        cols = kb * BLOCK + c  # [B]
        n_lim = tl.where(t < n_tiles, N, 0)  # a tile past the task's last: nothing loaded or stored
        amax = tl.zeros((ROWS,), dtype=tl.float32)
        for r0 in range(0, BLOCK, ROWS):  # pass 1: the tile's amax
            rows = nb * BLOCK + r0 + r  # [R] int64
            mask = (rows[:, None] < n_lim) & (cols[None, :] < K)
            w = tl.load(w_base + w_off + rows[:, None] * stride_wn + cols[None, :], mask=mask, other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(w.to(tl.float32)), axis=1))
        scale = _scale_from_amax(tl.max(amax, axis=0))  # scalar
        for r0 in range(0, BLOCK, ROWS):  # pass 2: codes
            rows = nb * BLOCK + r0 + r
            mask = (rows[:, None] < n_lim) & (cols[None, :] < K)
            w = tl.load(w_base + w_off + rows[:, None] * stride_wn + cols[None, :], mask=mask, other=0.0)
            q = _round_to_e4m3(tl.math.div_rn(w.to(tl.float32), scale))
            tl.store(q_base + q_off + rows[:, None] * K + cols[None, :], q.to(tl.float8e4nv), mask=mask)
        tl.store(s_base + s_off + nb * KB + kb, scale, mask=t < n_tiles)


def _offset(t: torch.Tensor, base: torch.Tensor) -> int:
    """Element offset of t's first element from base's (same dtype)."""
    diff = t.data_ptr() - base.data_ptr()
    if diff % t.element_size():
        raise ValueError("tensors of one group must be element-aligned with each other")
    return diff // t.element_size()


class GroupedWeightQuant:
    """Quantise sources[i] [N_i, K_i] into codes[i] [N_i, K_i] e4m3 (rows K_i apart) and scales[i]
    [ceil(N_i/128), ceil(K_i/128)] fp32 (rows contiguous), for every i in one launch. Build once for fixed
    destinations; call with the current sources (same shapes; any that moved are re-addressed)."""

    def __init__(self, codes: list[torch.Tensor], scales: list[torch.Tensor]):
        if not codes or len(codes) != len(scales):
            raise ValueError("GroupedWeightQuant needs one scales tensor per codes tensor (and at least one)")
        self.device = codes[0].device
        self.codes, self.scales = codes, scales
        self.shapes = [tuple(q.shape) for q in codes]
        for q, s, (n, k) in zip(codes, scales, self.shapes, strict=True):
            if q.dtype != FP8_DTYPE or q.stride() != (k, 1) or s.dtype != torch.float32:
                raise ValueError(f"codes must be row-major e4m3 [N, K] and scales fp32, got {q.dtype} {q.stride()}")
            if tuple(s.shape) != (num_blocks(n), num_blocks(k)) or (s.shape[0] > 1 and s.stride(0) != s.shape[1]):
                raise ValueError(f"scales for [{n}, {k}] must be [{num_blocks(n)}, {num_blocks(k)}] row-major")
        self.q_offs = [_offset(q, codes[0]) for q in codes]
        self.s_offs = [_offset(s, scales[0]) for s in scales]
        if any(o % ALIGN for o in self.q_offs) or any(k % ALIGN for _, k in self.shapes):
            raise ValueError(f"code buffers must start at multiples of {ALIGN} bytes and K be a multiple of {ALIGN}")
        tiles = torch.tensor([num_blocks(n) * num_blocks(k) for n, k in self.shapes])  # [T]
        per_task = (tiles + TILES - 1) // TILES  # programs per task
        task = torch.repeat_interleave(torch.arange(len(codes)), per_task)  # [P]
        first = torch.arange(len(task)) - torch.repeat_interleave(per_task.cumsum(0) - per_task, per_task)
        self.progs = torch.stack([task, first * TILES], 1).to(torch.int32).to(self.device)  # [P, 2]
        self._key: tuple | None = None
        self._tasks: torch.Tensor | None = None

    def tasks(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """The [T, 8] int64 device table for these sources (rebuilt only when a source moved)."""
        key = tuple(w.data_ptr() for w in sources) + tuple(w.stride(0) for w in sources)
        if key != self._key:
            base = sources[0]
            rows = []
            for w, (n, k), q_off, s_off in zip(sources, self.shapes, self.q_offs, self.s_offs, strict=True):
                if tuple(w.shape) != (n, k) or w.stride(-1) != 1 or w.dtype != base.dtype:
                    raise ValueError(f"source {tuple(w.shape)} {w.dtype} stride {w.stride()} does not fit [{n}, {k}] "
                                     f"{base.dtype} with unit last stride")  # fmt: skip
                w_off = _offset(w, base)
                if w_off % ALIGN or w.stride(0) % ALIGN:
                    raise ValueError(f"sources must start at multiples of {ALIGN} elements, rows too")
                rows.append([w_off, q_off, s_off, n, k, w.stride(0), num_blocks(k), 0])
            self._tasks = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
            self._key = key
        return self._tasks

    def __call__(self, sources: list[torch.Tensor]) -> None:
        """Quantise `sources` (list as at build time) into the codes and scales buffers, in one launch."""
        if len(sources) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} sources, got {len(sources)}")
        tasks = self.tasks(sources)
        _grouped_weight_quant_kernel[(self.progs.shape[0],)](
            sources[0], self.codes[0], self.scales[0], tasks, self.progs,
            TILES=TILES, BLOCK=BLOCK, ROWS=ROWS, ALIGN=ALIGN, num_warps=WARPS,
        )  # fmt: skip


def aot_launches() -> list:
    """(name, kernel, args, constexprs, num_warps) of the grouped weight quantiser as launched on a bf16 master (the
    format of producer_kernels.aot_launches)."""
    args = dict(w_base="*bf16", q_base="*fp8e4nv", s_base="*fp32", tasks_ptr="*i64", progs_ptr="*i32")
    return [("grouped_weight_quant", _grouped_weight_quant_kernel, args,
             dict(TILES=TILES, BLOCK=BLOCK, ROWS=32, ALIGN=ALIGN), WARPS)]  # fmt: skip (the GPU's ROWS)
