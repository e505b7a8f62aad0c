"""Helper for tests/test_global_diagnostics.py: under `torch.distributed.run --nproc_per_node 2` (gloo, CPU), each
rank computes `rollout_diagnostics_global` on its own rows (rank 1 holds more rows and longer completions) and writes
the result to OUT/diag-rank{i}.pt. A minimal stand-in for accelerate's Accelerator (gather, pad_across_processes over
torch.distributed) keeps accelerate out of it."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from dllm_ais.train.distributed import rollout_diagnostics_global


class DistAcc:
    """gather (concatenate along dim 0 in rank order) and pad_across_processes over torch.distributed."""

    def __init__(self):
        self.num_processes, self.process_index = dist.get_world_size(), dist.get_rank()

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(self.num_processes)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    def pad_across_processes(self, t: torch.Tensor, dim: int = 0, pad_index: int = 0) -> torch.Tensor:
        size = self.gather(torch.tensor([t.shape[dim]]))
        width = int(size.max())
        if t.shape[dim] == width:
            return t
        shape = list(t.shape)
        shape[dim] = width - t.shape[dim]
        return torch.cat([t, t.new_full(shape, pad_index)], dim=dim)


def rows(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's logp_old, logp_rollout [B, L] and mask [B, L] (rank 0: 2 x 3, rank 1: 3 x 5, ragged masks)."""
    g = torch.Generator().manual_seed(rank)
    B, L = (2, 3) if rank == 0 else (3, 5)
    old = -torch.rand(B, L, generator=g) * 3
    roll = old + torch.randn(B, L, generator=g) * 0.3
    lengths = torch.tensor([3, 1]) if rank == 0 else torch.tensor([5, 4, 5])
    mask = torch.arange(L)[None, :] < lengths[:, None]
    return old, roll, mask


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    diag = rollout_diagnostics_global(DistAcc(), *rows(rank))
    out.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.clone() for k, v in diag.items()}, out / f"diag-rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
