"""Helper for tests/test_fsdp_sync.py: FSDP2-shard a tiny LLaDA (or Dream, or SDAR) on 2 gloo CPU processes, sync its
FP8 rollout copy.

Run as `python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_sync_script.py OUT [--lora] [--dream | --sdar]`.
Every rank: builds the same seeded tiny model (optionally with LoRA adapters), makes the FP8 rollout copy from the full
weights, perturbs every master parameter (a stand-in for an optimizer step), keeps a full copy of the perturbed master,
then `fully_shard`s each block and the root (FSDP2: parameters become DTensor shards) and runs
`sync_weights_sharded`.
A second rollout copy is synced from the full copy with the plain `sync_weights`. Writes `OUT/fsdp-rank{r}.pt` =
{"sharded": rollout synced from the shards, "full": rollout synced from the full master, "gathers": numel of every
full_tensor() call, "largest_param": numel of the largest master parameter, "total_params", "sharded_params": how
many master parameters were DTensors}. Asserts nothing itself.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--dream", action="store_true", help="the tiny Dream (its fused FP8 copy) instead of LLaDA")
    ap.add_argument("--sdar", action="store_true", help="the tiny SDAR (its fused FP8 copy) instead of LLaDA")
    args = ap.parse_args()
    torch.set_num_threads(1)

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from dllm_ais.fp8 import quantize_model, sync_weights
    from dllm_ais.models.dream.model import DreamDecoderLayer
    from dllm_ais.models.dream.model import lora_target_regex as dream_targets
    from dllm_ais.models.llada.model import LLaDABlock
    from dllm_ais.models.llada.model import lora_target_regex as llada_targets
    from dllm_ais.models.sdar.model import SDARDecoderLayer
    from dllm_ais.models.sdar.model import lora_target_regex as sdar_targets
    from dllm_ais.models.sdar.tiny import tiny_sdar_model
    from dllm_ais.models.tiny import tiny_dream_model, tiny_model
    from dllm_ais.train.fsdp_sync import sync_weights_sharded

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    family = "dream" if args.dream else "sdar" if args.sdar else "llada"
    build, block, targets = {"llada": (tiny_model, LLaDABlock, llada_targets),
                             "dream": (tiny_dream_model, DreamDecoderLayer, dream_targets),
                             "sdar": (tiny_sdar_model, SDARDecoderLayer, sdar_targets)}[family]
    master = build(seed=0)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)  # peft draws lora_A from the global RNG: the ranks must hold the same model to shard it
        master = get_peft_model(master, LoraConfig(r=4, lora_alpha=8, target_modules=targets()))
    rollout = quantize_model(master)
    reference = copy.deepcopy(rollout)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the "update": every parameter moves (LoRA B starts at 0, so the adapters now matter)
        for p in master.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    full = copy.deepcopy(master)
    for module in master.modules():
        if isinstance(module, block):
            fully_shard(module)
    fully_shard(master)
    sharded = sum(isinstance(p, DTensor) for p in master.parameters())

    gathers: list[int] = []
    full_tensor = DTensor.full_tensor

    def counting(self, *a, **k):
        gathers.append(self.numel())
        return full_tensor(self, *a, **k)

    DTensor.full_tensor = counting
    sync_weights_sharded(master, rollout)
    DTensor.full_tensor = full_tensor
    sync_weights(full, reference)

    def state(m):
        return {k: v.detach().clone() for k, v in m.state_dict().items()}

    args.out.mkdir(parents=True, exist_ok=True)
    torch.save({"sharded": state(rollout), "full": state(reference), "gathers": gathers,
                "rollout_type": type(rollout).__name__,
                "largest_param": max(p.numel() for p in full.parameters()),
                "total_params": sum(p.numel() for p in full.parameters()),
                "n_params": sum(1 for _ in full.parameters()), "sharded_params": sharded},
               args.out / f"fsdp-rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
