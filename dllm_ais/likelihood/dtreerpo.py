"""d-TreeRPO's segment likelihood (DARE yjyddq/DARE@83ae8a3, `verl/workers/actor/llada_dp_actor_dtreerpo.py:
_get_local_transition_logps`, branch points in `verl/workers/rollout/dtreerpo_llada_rollout.py`): the rollout's
denoising steps cut into s segments at d-TreeRPO's branch points; the tokens a segment commits (MASK → token between
its parent state and its child state) are scored in ONE forward at the parent canvas.

What it scores (`draw_dtreerpo`):
- segments: with T = Rollout.num_steps forwards, boundaries b_k = int(k·T/s), k = 0..s (d-TreeRPO's branch points
  T − int(k·T/s) counted in forward steps; duplicates dropped), segment k = steps [b_k, b_{k+1}).
- canvas of segment k: the recorded x_{b_k} (tokens committed before b_k shown, every other position masked, the
  post-EOS tail included: the parent state).
- scored: the counted tokens with b_k <= commit_step < b_{k+1} (those that went MASK → token in the segment), each
  with weight 1, target y_j: every counted token is scored exactly once, at its segment's parent canvas.

Per-token terms log p(y_j | x_{b_k(j)}) ([B, L]) enter GRPO's per-token ratio, as d-TreeRPO's PPO ratio is per
token. Rows: one forward row per segment with a scored token (≤ s per sequence). Ratio level: token. Log-probs are
untempered and keep the mask token in the softmax (d-TreeRPO: cross-entropy on the raw logits).

Where we differ (docs/likelihoods.md, "MDPO and d-TreeRPO"): d-TreeRPO scores a tree's parent → child transitions
with sibling-relative advantages; a linear rollout is one root-to-leaf path of such a tree, and our advantage is the
sequence's GRPO one. Its loss normalises per segment (token mean, then mean over segments); ours is GRPO's
`loss_type`. Its counted positions are the child state's (up to the child's first visible EOS); ours the final
completion's (never post-EOS).
"""

from __future__ import annotations

import torch

from dllm_ais.likelihood.mask_draws import PolicyDraw
from dllm_ais.likelihood.mdpo import recorded_canvas


def segment_bounds(num_steps: int, segments: int) -> list[int]:
    """Sorted distinct boundaries int(k·T/s), k = 0..s, of T = num_steps forward steps cut into s segments."""
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments={segments!r} must be an int >= 1 (d-TreeRPO's tree depth s).")
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps}: the rollout made no denoising step; there is no segment.")
    return sorted({int(k * num_steps / segments) for k in range(segments + 1)})


def draw_dtreerpo(commit_step: torch.Tensor, completion_mask: torch.Tensor, num_steps: int,
                  segments: int) -> PolicyDraw:
    """d-TreeRPO's draw (module doc): K = the distinct segments; commit_step, completion_mask [B, L]."""
    bounds = segment_bounds(num_steps, segments)
    lo = torch.tensor(bounds[:-1], dtype=torch.long, device=commit_step.device)  # [K]
    hi = torch.tensor(bounds[1:], dtype=torch.long, device=commit_step.device)
    B, L = commit_step.shape
    K = lo.numel()
    hidden = recorded_canvas(commit_step, lo.expand(B, K))  # [B, K, L] the parent canvases
    cs = commit_step[:, None, :]
    mask = (cs >= lo[None, :, None]) & (cs < hi[None, :, None]) & completion_mask.bool()[:, None, :]
    weight = mask.double()
    level = hidden.sum(-1).double() / L
    return PolicyDraw(mask, weight, None, level, hidden)
