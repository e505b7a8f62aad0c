"""Helper for tests/test_fsdp_sync.py: full checkpoints of an FSDP2-sharded tiny LLaDA and its AdamW, 2 gloo ranks.

Run as `python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_checkpoint_script.py OUT`. Every rank trains
the same seeded tiny model twice side by side: a plain copy (`reference`) and a `fully_shard`ed one, one AdamW step
each on the same batch. The main process writes the sharded run's full checkpoint (dllm_ais.train.fsdp_checkpoint) to
OUT/ckpt.pt; every rank loads it into a fresh, differently initialised sharded model and optimizer, and both runs take
a second step. Writes OUT/fsdp-ckpt-rank{r}.pt = {"saved_model", "saved_optimizer" (main only, else None),
"reference_model", "reference_optimizer" after step 1, "resumed": full parameters after step 2 of the resumed sharded
run, "reference_final": the reference after step 2}. Asserts nothing itself.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from dllm_ais.models.llada.model import LLaDABlock
    from dllm_ais.models.tiny import tiny_model
    from dllm_ais.train.fsdp_checkpoint import (
        full_on_main,
        full_optimizer_state,
        load_full_optimizer_state,
        loading_full,
    )

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    main_rank = rank == 0

    def sharded(seed):
        model = tiny_model(seed=seed)
        for module in model.modules():
            if isinstance(module, LLaDABlock):
                fully_shard(module)
        fully_shard(model)
        return model

    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(3))

    def step(model, optimizer):
        loss = model(ids).logits.float().pow(2).mean()  # any loss: both runs see the same batch on every rank
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    reference = tiny_model(seed=0)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    model = sharded(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    step(reference, ref_opt)
    step(model, opt)

    saved_opt = full_optimizer_state(opt, main_rank)
    with full_on_main(model, main_rank):
        saved_model = {k: v.detach().clone() for k, v in model.state_dict().items()} if main_rank else None
    args.out.mkdir(parents=True, exist_ok=True)
    if main_rank:
        torch.save({"model": saved_model, "optimizer": saved_opt}, args.out / "ckpt.pt")
    dist.barrier()

    ckpt = torch.load(args.out / "ckpt.pt", weights_only=True)
    resumed = sharded(7)  # other initial weights: everything must come from the checkpoint
    resumed_opt = torch.optim.AdamW(resumed.parameters(), lr=1e-3, weight_decay=0.0)
    with loading_full(resumed):
        resumed.load_state_dict(ckpt["model"])
    load_full_optimizer_state(resumed_opt, ckpt["optimizer"])
    ref_state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    ref_opt_state = copy.deepcopy(ref_opt.state_dict())  # the live dict's tensors change in the next step
    step(reference, ref_opt)
    step(resumed, resumed_opt)
    with full_on_main(resumed, True):
        final = {k: v.detach().clone() for k, v in resumed.state_dict().items()}
    torch.save({"saved_model": saved_model, "saved_optimizer": saved_opt, "reference_model": ref_state,
                "reference_optimizer": ref_opt_state, "resumed": final,
                "reference_final": {k: v.detach().clone() for k, v in reference.state_dict().items()}},
               args.out / f"fsdp-ckpt-rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
