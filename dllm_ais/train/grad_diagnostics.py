"""Does the correction move the gradient by more than the minibatch noise? (issue "evidence": λ from bias/variance)

On one batch, with the loss exactly as the update computes it:
  g_ω  the policy gradient with the correction's weights ω (what the update uses),
  g_1  the same gradient with ω ≡ 1 (no correction),
  g_a, g_b  g_ω on the two halves of the batch's prompt groups (a group's G completions stay together: they share a
       prompt and their advantages are centred within the group, so groups, not completions, are the iid units).
With s_a, s_b the halves' shares of the loss's normaliser (tokens for token-mean losses, sequences otherwise),
g_ω = s_a g_a + s_b g_b, and for iid units Var(g_ω) = E‖g_a − g_b‖² · s_a s_b, so
  shift = ‖g_ω − g_1‖            what the correction changes (its bias reduction, if ω is right),
  noise = ‖g_a − g_b‖ √(s_a s_b)  one minibatch-noise standard deviation of g_ω (a one-draw estimate),
  shift_to_noise = shift / noise  ≪ 1: at this batch size the correction is lost in the noise (λ → 0 costs nothing);
                                  ≫ 1: it changes the update (whether for the better is the study's question).
Cost: three extra forward + backward passes over the batch (micro-batched like the update); memory: three copies of
the trainable parameters' gradients (g_a, g_b, g_1) at once. One process only: the gradients are not all-reduced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from dllm_ais import metrics as M

ONE_PROCESS = ("grad_diagnostics_every runs on one process only (its gradients are not all-reduced, and DDP expects "
               "every forward to end in its own backward): set it to 0 for a multi-process run.")


def split_groups(batch: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the first half of the prompt groups and of the second half ([B] = groups × G, groups contiguous)."""
    if group_size < 1 or batch % group_size:
        raise ValueError(f"batch {batch} is not a whole number of groups of {group_size}.")
    groups = batch // group_size
    if groups < 2:
        raise ValueError("the gradient noise estimate splits the batch's prompt groups in two: it needs at least 2 "
                         "prompts per step (raise prompts_per_step or turn grad_diagnostics_every off).")
    cut = (groups // 2) * group_size
    rows = torch.arange(batch)
    return rows[:cut], rows[cut:]


def gradient(loss_of: Callable[[torch.Tensor], torch.Tensor], chunks: Sequence[torch.Tensor],
             params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Σ over row chunks of d loss_of(chunk) / d params, without touching `.grad` (the update's state is untouched).
    loss_of(rows) is the chunk's contribution to the loss, already weighted by its share."""
    total = [torch.zeros_like(p) for p in params]
    for rows in chunks:
        grads = torch.autograd.grad(loss_of(rows), params, allow_unused=True)
        for acc, g in zip(total, grads, strict=True):
            if g is not None:
                acc.add_(g)
    return total


def shift_and_noise(g_a: Sequence[torch.Tensor], g_b: Sequence[torch.Tensor], g_1: Sequence[torch.Tensor],
                    share_a: float) -> dict[str, float]:
    """The module doc's shift, noise and their ratio from the halves' ω-gradients and the uncorrected full gradient
    (lists of per-parameter tensors, same shapes); share_a in (0, 1) is half a's share of the loss's normaliser."""
    if not 0 < share_a < 1:
        raise ValueError(f"share_a={share_a} must be in (0, 1): both halves need tokens in the loss.")
    share_b = 1.0 - share_a
    shift_sq = diff_sq = 0.0
    for a, b, one in zip(g_a, g_b, g_1, strict=True):
        a, b, one = a.double(), b.double(), one.double()
        shift_sq += float((share_a * a + share_b * b - one).pow(2).sum())
        diff_sq += float((a - b).pow(2).sum())
    shift, noise = math.sqrt(shift_sq), math.sqrt(diff_sq * share_a * share_b)
    ratio = shift / noise if noise > 0 else (math.nan if shift == 0 else math.inf)  # 0 / 0: no gradient at all
    return {"shift": shift, "noise": noise, "shift_to_noise": ratio}


def measure(loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], params: Sequence[torch.Tensor],
            omega: torch.Tensor, mask: torch.Tensor, group_size: int, token_mean: bool,
            micro_batches: int = 1) -> dict[str, float]:
    """{grad/correction_shift, grad/noise, grad/shift_to_noise} (the module doc's shift, noise and ratio) of one
    batch. loss_of(rows, weights) is the update's loss over `rows` alone (a mean over their tokens when token_mean,
    else over their sequences) with `weights` (ω's rows, or ones) as ω; omega: [B] or [B, L]; mask: [B, L] bool, the
    loss mask. NaNs when a half has nothing in the loss."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise ValueError(ONE_PROCESS)
    B = mask.shape[0]
    half_a, half_b = split_groups(B, group_size)
    everything = torch.arange(B)

    def size(rows: torch.Tensor) -> float:
        return float(mask[rows.to(mask.device)].sum()) if token_mean else float(rows.numel())

    def grad(rows: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
        total = size(rows)
        chunks = [c.to(mask.device) for c in rows.tensor_split(micro_batches) if c.numel()]
        return gradient(lambda idx: loss_of(idx, weights[idx]) * (size(idx) / total), chunks, params)

    if min(size(half_a), size(half_b)) == 0:
        stats = {"shift": math.nan, "noise": math.nan, "shift_to_noise": math.nan}
    else:
        g_a, g_b = grad(half_a, omega), grad(half_b, omega)
        g_1 = grad(everything, torch.ones_like(omega))
        stats = shift_and_noise(g_a, g_b, g_1, size(half_a) / size(everything))
    return {M.GRAD_SHIFT: stats["shift"], M.GRAD_NOISE: stats["noise"], M.GRAD_SHIFT_TO_NOISE: stats["shift_to_noise"]}
