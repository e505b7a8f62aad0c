"""Helper for tests/test_fsdp_trainer.py: `dllm-ais train` under accelerate's FSDP2 on gloo CPU processes.

Run as `accelerate launch --use_fsdp --fsdp_version 2 --num_processes 2 ... tests/fsdp_train_script.py [--replay DIR]
[--prompts-per-step N] [--base tiny-dream | tiny-sdar] TRAIN_FLAGS...` (TRAIN_FLAGS are `dllm-ais train`'s, --out
included). Every process runs `dllm_ais.cli.main(["train", "--preset", PRESET, ...])`; PRESET is
tests/dist_train_script.py's `small_preset` (tiny-cpu, or --base tiny-dream / tiny-sdar, with FP8 rollouts, 2 prompts
× 2 generations per process, dapo over 2 micro-batches, λ EMA, a hash reward so the advantages are not zero),
registered under a name so the CLI can select it.

accelerate makes CPU processes MULTI_CPU (plain DDP) even when launched with an FSDP plugin: its state only turns
FSDP on for accelerator device types. `cpu_fsdp2()` switches that one decision, after accelerate has built the
plugin from the launcher's flags: everything else — `fsdp2_prepare_model` (fully_shard per LLaDABlock, the
embedding, the tail and the root), FSDP2's `no_sync` (set_requires_gradient_sync), its DTensor-aware
`clip_grad_norm_`, the gradient reduce-scatter — is accelerate's and torch's own code, run over gloo.

Writes OUT/params-rank{i}.pt = {"rank", "world", "distributed_type", "is_fsdp2", "sharded_params" / "params": how many
master parameters are DTensors / all of them when GRPO starts (after a resume), "rollout_type": class of the rollout
copy, "records": per step this process's rollout, ℓ, λ and ω (as tests/dist_train_script.py records them), "events",
"init" / "final": full copies of the parameters when GRPO started / ended (shards gathered), "resumed_at":
the step this launch started from}; a resumed launch keeps the earlier launch's records and init. With `--replay DIR`
(one plain process, no launcher) the run in DIR is replayed as one process holding its global batch: its rollouts and
ℓ, and its initial trainable parameters (peft draws LoRA's init from each process's own RNG). The test compares these
files, metrics.jsonl and the final checkpoints; this script asserts nothing itself.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

PRESET = "tiny-cpu-fsdp-test"


def cpu_fsdp2() -> None:
    """Make accelerate's state FSDP (with the plugin it built from the launcher's environment) on CPU processes."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def init_fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            if self.mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self.mixed_precision)
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = init_fsdp_on_cpu


def row_keyed_sdar_draws() -> None:
    """SDAR's block-wise ELBO draws its masks for the whole local batch from one generator (models/sdar/likelihood.py
    `draw_block_masks`), so a row's draws depend on the rows beside it, and rank 1's rows would be scored on other
    masks than the one-process replay's. For the comparison each row is drawn by the same function from its own
    generator, keyed by the step's seed and the row's GLOBAL index (rank · local rows + row; the replay's global batch
    is the ranks' rows in rank order): the likelihood, the FP8 copy and the sharding stay the code under test."""
    import torch.distributed as dist

    import dllm_ais.models.sdar.likelihood as likelihood

    draw = likelihood.draw_block_masks

    def keyed(counted, block_length, num_draws, generator):
        base = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
        rank = dist.get_rank() if dist.is_initialized() else 0
        offset = rank * counted.shape[0]
        parts = [draw(counted[b:b + 1], block_length, num_draws,
                      torch.Generator(counted.device).manual_seed(base + 1_000_003 * (offset + b)))
                 for b in range(counted.shape[0])]
        return tuple(torch.cat(p) for p in zip(*parts, strict=True))

    likelihood.draw_block_masks = keyed


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the full tensors of `model`'s parameters, frozen ones included (DTensor shards gathered:
    collective)."""
    from dllm_ais.train.fsdp_sync import full_tensor

    return {n: full_tensor(p.detach()).cpu().clone() for n, p in model.named_parameters()}


def main() -> None:
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", type=Path, help="one process replaying the global batches of the run in this dir")
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--base", default="tiny-cpu", help="the preset shrunk (tiny-cpu, tiny-dream or tiny-sdar)")
    args, train_flags = ap.parse_known_args()
    out = Path(train_flags[train_flags.index("--out") + 1])

    from dist_train_script import concat_records, record_steps, small_preset
    from torch.distributed.tensor import DTensor

    from dllm_ais import cli
    from dllm_ais.presets import PRESETS
    from dllm_ais.train.trainer import Trainer

    cpu_fsdp2()
    if args.base == "tiny-sdar":
        row_keyed_sdar_draws()
    replay, per_step = None, args.prompts_per_step
    if args.replay is not None:
        ranks = [torch.load(f, weights_only=True) for f in sorted(args.replay.glob("params-rank*.pt"))]
        replay, per_step = concat_records([r["records"] for r in ranks]), per_step * len(ranks)
        replay_init = ranks[0]["init"]
    PRESETS[PRESET] = small_preset(steps=4, sft_steps=0, prompts_per_step=per_step, base=args.base)
    records: list[dict] = []
    events: list[str] = []
    record_steps(records, events, replay)
    trainers: list[Trainer] = []
    fit = Trainer.fit

    init: dict[str, torch.Tensor] = {}
    start: list[int] = []
    sharded: dict[str, int] = {}

    def fit_keeping(self, *a, **k):
        trainers.append(self)
        start.append(self.step)
        if replay is not None:  # start where the replayed run started (peft's LoRA init is drawn per process)
            with torch.no_grad():
                for name, p in self.master.named_parameters():
                    if p.requires_grad:
                        p.copy_(replay_init[name])
            self._sync_rollout()
        init.update(full_state(self.master))
        params = list(self.master.parameters())  # before any forward: FSDP2 leaves the tail (final norm, LM head,
        sharded.update(params=len(params), sharded_params=sum(isinstance(p, DTensor) for p in params))  # no reshard)
        return fit(self, *a, **k)

    Trainer.fit = fit_keeping
    preset_flag = [] if "--resume" in train_flags else ["--preset", PRESET]  # a resume reads the run's own preset
    code = cli.main(["train", *preset_flag, "--threads", "1", "--no-progress", *train_flags])
    if code:
        sys.exit(code)
    (trainer,) = trainers
    acc = trainer.acc
    path = out / f"params-rank{acc.process_index}.pt"
    if start[0] > 0:  # resumed: the steps before come from the launch that wrote the checkpoint
        before = torch.load(path, weights_only=True)
        records[:0], init = before["records"][: start[0]], before["init"]
    torch.save({"rank": acc.process_index, "world": acc.num_processes, "distributed_type": str(acc.distributed_type),
                "is_fsdp2": bool(getattr(acc, "is_fsdp2", False)),
                **sharded,
                "rollout_type": type(trainer.rollout_model).__name__, "records": records, "events": events,
                "init": init, "final": full_state(trainer.master), "resumed_at": start[0]}, path)
    acc.wait_for_everyone()
    print(f"rank {acc.process_index}/{acc.num_processes} ({acc.distributed_type}): done", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
