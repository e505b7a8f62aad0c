"""Statistics over the global batch when several processes train (DESIGN.md §4: diagnostics over the global batch).

Each process holds its own rows (d1's presets: 1 prompt × 6 generations per process). The AIS diagnostics R, D, V and
λ are batch statistics, so they are computed on the rows of every process gathered in rank order: λ is identical on
every rank and equal to what one process holding the whole batch computes, and each process keeps ω of its own rows.

`acc` is anything with accelerate's Accelerator interface (num_processes, process_index, gather,
pad_across_processes); nothing here imports accelerate.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dllm_ais.rl.config import CorrectionConfig
from dllm_ais.rl.correction import CorrectionOutput, correct
from dllm_ais.rl.mismatch_stats import rollout_diagnostics


def gather_rows(acc, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], slice]:
    """Concatenate each tensor's rows (dim 0) over processes in rank order.

    Every tensor has the same number of local rows B_r (which may differ between ranks); a 2-D tensor's dim 1 (e.g.
    the completion length L of an autoregressive batch) is right-padded with zeros (False for bool) to the largest
    over processes. Returns the gathered tensors ([Σ_r B_r, ...]) and the slice of this process's rows in them.
    """
    B = tensors[0].shape[0]
    if any(t.shape[0] != B for t in tensors):
        shapes = [tuple(t.shape) for t in tensors]
        raise ValueError(f"gather_rows: all tensors need the same number of rows, got {shapes}")
    if acc.num_processes == 1:
        return list(tensors), slice(0, B)
    device = tensors[0].device
    sizes = acc.gather(torch.tensor([B], device=device)).tolist()  # [world]
    rank, width = acc.process_index, max(sizes)
    out = []
    for t in tensors:
        is_bool = t.dtype == torch.bool
        x = t.to(torch.uint8) if is_bool else t  # gloo has no bool collectives
        x = acc.pad_across_processes(x, dim=0, pad_index=0)
        if x.dim() > 1:
            x = acc.pad_across_processes(x, dim=1, pad_index=0)
        g = acc.gather(x.contiguous())  # [world * width, ...]
        g = torch.cat([g[r * width: r * width + n] for r, n in enumerate(sizes)])
        out.append(g.bool() if is_bool else g)
    start = sum(sizes[:rank])
    return out, slice(start, start + B)


def correct_global(acc, log_w: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: CorrectionConfig,
                   prev_lam: torch.Tensor | float | None = None, *,
                   token_log_w: torch.Tensor | None = None, global_mask: torch.Tensor | None = None
                   ) -> CorrectionOutput:
    """`correct()` over the rows of every process; ω is sliced back to this process's rows.

    log_w: [B] or [B, L] (by cfg.correction_level), adv: [B], mask: [B, L] bool, token_log_w: None or [B, L] (for
    divergence rejection) — this process's rows; global_mask: the gathered mask when the caller already has it (not
    gathered again). Every diagnostic (λ, R, D, V, min/max log-weights …) is the global batch's, identical on every
    rank.
    """
    extra = () if token_log_w is None else (token_log_w,)
    local = (log_w, adv, *extra) if global_mask is not None else (log_w, adv, mask, *extra)
    gathered, rows = gather_rows(acc, *local)
    if global_mask is not None:
        gathered.insert(2, global_mask)
    g_log_w, g_adv, g_mask, *g_extra = gathered
    out = correct(g_log_w, g_adv, g_mask, cfg, prev_lam=prev_lam, token_log_w=g_extra[0] if g_extra else None)
    omega = out.omega[rows]  # [B] or [B, L_max]
    if omega.dim() == 2:
        omega = omega[:, : mask.shape[1]]  # [B, L]: drop the padding added for longer ranks
    return replace(out, omega=omega)


def rollout_diagnostics_global(acc, logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
                               clamp: float = 20.0) -> dict[str, torch.Tensor]:
    """`mismatch_stats.rollout_diagnostics` over the rows of every process (identical on every rank), so that the
    token-weighted ones (χ², KL, k3 per token) are the global batch's token means, not a mean of per-process means.
    logp_old, logp_rollout: [B, L], mask: [B, L] bool — this process's rows."""
    (g_old, g_roll, g_mask), _ = gather_rows(acc, logp_old, logp_rollout, mask)
    return rollout_diagnostics(g_old, g_roll, g_mask, clamp)


def global_sum(acc, x: torch.Tensor) -> torch.Tensor:
    """Σ over processes of a tensor (itself on one process)."""
    if acc.num_processes == 1:
        return x
    return acc.reduce(x.clone(), reduction="sum")
