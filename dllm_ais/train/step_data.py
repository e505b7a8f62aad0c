"""What one GRPO step draws from: its seeded generators (one per purpose, so a resumed run reproduces the
uninterrupted one), its prompts, and how many tokens its sampler generated."""

from __future__ import annotations

import zlib

import torch


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A seed for one purpose at one step, independent of everything that ran before."""
    return zlib.crc32(f"{seed}/{step}/{purpose}".encode())


def step_generator(seed: int, step: int, purpose: str, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator seeded with `step_seed(seed, step, purpose)`."""
    return torch.Generator(device=device).manual_seed(step_seed(seed, step, purpose))


def batch_rows(rows: list[dict], step: int, per_step: int, rank: int, world: int, seed: int) -> list[dict]:
    """Prompts of `step` for process `rank`: a fresh seeded permutation per epoch, consumed in order."""
    n = len(rows)
    start = (step * world + rank) * per_step
    perms: dict[int, list[int]] = {}  # one permutation per epoch the step touches (at most two)
    out = []
    for i in range(start, start + per_step):
        epoch, j = divmod(i, n)
        if epoch not in perms:
            perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
        out.append(rows[perms[epoch][j]])
    return out


def generated_tokens(rollout) -> int:
    """Tokens the sampler generated: an autoregressive sampler (one that records `logp_rollout` and no `nfe`) stops
    each row at its stop token and pads the rest (its counted tokens, the stop token included, are what it
    generated); a diffusion sampler (it reports `nfe`) fills every completion position of the canvas."""
    if rollout.logp_rollout is not None and rollout.nfe is None:
        return int(rollout.completion_mask.sum())
    return rollout.completion_ids.numel()


def micro_batches(B: int, n: int, device) -> list[torch.Tensor]:
    """The row chunks of one update: B rows in (at most) n chunks (gradient accumulation)."""
    return [c for c in torch.arange(B, device=device).tensor_split(n) if c.numel()]
