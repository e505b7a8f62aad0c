"""Helper for tests/test_distributed.py: a tiny AIS-GRPO run under `accelerate launch`, then each rank's parameters.

Run as `accelerate launch --multi_gpu --num_processes 2 tests/dist_train_script.py OUT [--steps N] [--sft-steps N]`
on a CPU-only machine: accelerate's `--cpu` flag uses its simple launcher, which starts several processes only
through mpirun, so the test uses the torchrun-based launcher instead; each process's `Accelerator(cpu=True)` (the
trainer's) then joins a gloo process group.

Every process trains through `dllm_ais.train_job.run_training` (DDP over gloo, set up by accelerate) and writes
`OUT/params-rank{i}.pt` = {"init": state_dict when GRPO started, "final": state_dict at the end, "rank", "world"}
(the unwrapped master's tensors). The initial state is captured by wrapping `Trainer.fit` in this process only, so
it is exactly what GRPO started from (after any SFT warm-up and DDP's initial broadcast). The test compares these
files; this script asserts nothing itself.
"""

from __future__ import annotations

import argparse
import zlib
from dataclasses import replace
from pathlib import Path

import torch

REWARD_FN = "dist_train_script:hash_reward"
"""Import path of the reward (this file's directory is sys.path[0] when it runs as a script)."""


def hash_reward(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """An arbitrary deterministic reward in [0, 1] from a hash of the completion text.

    The untrained tiny model never solves arith, so the task's reward would be 0 everywhere, every advantage 0 and
    the GRPO gradient exactly 0. Hashing the text gives different rewards to different completions, hence non-zero
    advantages that differ between the processes' prompts: the parameters only stay identical if DDP averages the
    gradients.
    """
    return [(zlib.crc32(c.encode()) % 1000) / 999 for c in completions]


def small_preset(steps: int, sft_steps: int):
    """tiny-cpu shrunk to seconds: 2 prompts x 2 generations per process, 5-token completions, 2 mask draws."""
    from dllm_ais.config import get_preset

    p = get_preset("tiny-cpu")
    return replace(
        p,
        train=replace(p.train, steps=steps, prompts_per_step=2, sft_steps=sft_steps, sft_batch_size=8,
                      mismatch_num_draws=2, reward_fn=REWARD_FN),
        grpo=replace(p.grpo, num_generations=2),
    )


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of every tensor of `model`'s state_dict."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def record_initial_state(into: dict) -> None:
    """Wrap `Trainer.fit` (in this process only) so that it first stores the master's parameters in `into`."""
    from dllm_ais.trainer import Trainer

    fit = Trainer.fit

    def fit_recording(self, *args, **kwargs):
        into.update(snapshot(self.master))
        return fit(self, *args, **kwargs)

    Trainer.fit = fit_recording


def main(argv: list[str] | None = None) -> None:
    """Train, then write params-rank{i}.pt on every rank."""
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=0)
    args = ap.parse_args(argv)

    from dllm_ais.train_job import run_training

    init: dict[str, torch.Tensor] = {}
    record_initial_state(init)
    trainer = run_training(small_preset(args.steps, args.sft_steps), args.out, progress=False)
    acc = trainer.acc
    final = snapshot(trainer.master)
    torch.save({"rank": acc.process_index, "world": acc.num_processes, "init": init, "final": final},
               args.out / f"params-rank{acc.process_index}.pt")
    acc.wait_for_everyone()
    print(f"rank {acc.process_index}/{acc.num_processes}: done, {len(final)} tensors", flush=True)


if __name__ == "__main__":
    main()
