"""Group-relative advantages Â for GRPO.

Rewards are laid out [num_prompts * G] with each prompt's G generations contiguous. Every variant centres a reward
on its group's mean; they differ in the scale:

- `none`  (d1 / Dr.GRPO): Â = r − mean_group(r)
- `group` (GRPO):         Â = (r − mean_group(r)) / (std_group(r) + eps)
- `batch`:                Â = (r − mean_group(r)) / (std_batch(r) + eps)

std is the unbiased (n − 1) standard deviation and eps = 1e-4, as in TRL. A group whose G rewards are all exactly
equal carries no learning signal: its advantages are set to exactly 0 (so no rounding residue of r − mean leaks into
the loss or into AIS's variance diagnostic), and it counts in `zero_std_frac` (metric `adv/zero_std_frac`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

ADV_EPS = 1e-4


@dataclass(frozen=True)
class AdvantageOutput:
    """Advantages and their diagnostics."""

    adv: torch.Tensor
    """[num_prompts * G] float advantages Â, same layout as the rewards."""
    zero_std_frac: torch.Tensor
    """[] fraction of groups whose rewards are all equal (no learning signal); 0 for an empty batch."""

    def metrics(self) -> dict[str, float]:
        """Scalar metrics under DESIGN.md §8 names."""
        return {"adv/zero_std_frac": float(self.zero_std_frac)}


def _scale_none(centred: torch.Tensor, grouped: torch.Tensor, eps: float) -> torch.Tensor:
    """Mean-only: Â = r − mean_group(r).  centred, grouped: [P, G]."""
    return centred


def _scale_group(centred: torch.Tensor, grouped: torch.Tensor, eps: float) -> torch.Tensor:
    """z-score within the group: divide by the group's std."""
    return centred / (grouped.std(dim=1, keepdim=True) + eps)  # [P, G]


def _scale_batch(centred: torch.Tensor, grouped: torch.Tensor, eps: float) -> torch.Tensor:
    """Divide by the std of all rewards in the batch (a single group's std when P = 1)."""
    return centred / (grouped.reshape(-1).std() + eps)  # [P, G]


SCALERS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "none": _scale_none,
    "group": _scale_group,
    "batch": _scale_batch,
}


def group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group",
                     eps: float = ADV_EPS) -> AdvantageOutput:
    """Group-relative advantages of `rewards` [num_prompts * G] (float, finite), G = num_generations.

    scale_rewards is `none` (mean-only), `group` (z-score, GRPO) or `batch`; see the module docstring.
    """
    if num_generations < 2:
        raise ValueError(f"num_generations={num_generations}: group-relative advantages need G >= 2.")
    if rewards.dim() != 1 or rewards.numel() % num_generations:
        raise ValueError(f"rewards must be 1-D with a multiple of num_generations={num_generations} entries "
                         f"(each prompt's G generations contiguous); got shape {tuple(rewards.shape)}.")
    if scale_rewards not in SCALERS:
        raise ValueError(f"scale_rewards={scale_rewards!r}: use one of {', '.join(SCALERS)}.")
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    if rewards.numel() == 0:
        return AdvantageOutput(adv=rewards.clone(), zero_std_frac=rewards.new_zeros(()))
    grouped = rewards.view(-1, num_generations)  # [P, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # [P, G]
    adv = SCALERS[scale_rewards](centred, grouped, eps)  # [P, G]
    zero_std = grouped.amax(dim=1) == grouped.amin(dim=1)  # [P] all G rewards equal
    adv = torch.where(zero_std[:, None], torch.zeros_like(adv), adv)  # [P, G]
    return AdvantageOutput(adv=adv.reshape(-1), zero_std_frac=zero_std.float().mean())
