"""Helper for tests/test_distributed.py: a tiny AIS-GRPO run under `accelerate launch`, then each rank's parameters.

Run as `accelerate launch --multi_gpu --num_processes 2 tests/dist_train_script.py OUT [--steps N] [--sft-steps N]
[--resume]` on a CPU-only machine: accelerate's `--cpu` flag uses its simple launcher, which starts several processes
only through mpirun, so the test uses the torchrun-based launcher instead; each process's `Accelerator(cpu=True)`
(the trainer's) then joins a gloo process group.

Every process trains through `dllm_ais.train.job.run_training` (DDP over gloo, set up by accelerate) and writes
`OUT/params-rank{i}.pt` = {"init": state_dict when GRPO started, "final": state_dict at the end, "rank", "world",
"records": per step this process's rollout, mismatch log-weights ℓ, λ and ω, "events": the order of backward passes
and DDP gradient all-reduces} (the unwrapped master's tensors). The initial state is captured by wrapping
`Trainer.fit` in this process only, so it is exactly what GRPO started from (after any SFT warm-up and DDP's initial
broadcast). The test compares these files; this script asserts nothing itself.

`--replay DIR` (one plain process, no launcher): the same run as one process holding the global batch of the
multi-process run in DIR: each step's rollout and ℓ are the concatenation, in rank order, of what the ranks recorded
(every other quantity — rewards, advantages, λ, ω, log-probs, losses, updates — is computed afresh). This is the
"one process with the same global batch" the multi-process run must equal: sampling and the MC mask draws are seeded
per process, so a fresh one-process run would draw different noise for the second rank's rows.
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
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]  # TRL's chat form on digits
    return [(zlib.crc32(t.encode()) % 1000) / 999 for t in texts]


def small_preset(steps: int, sft_steps: int, prompts_per_step: int = 2, base: str = "tiny-cpu"):
    """tiny-cpu (or `base`, e.g. tiny-dream) shrunk to seconds: 2 prompts x 2 generations per process, 5-token
    completions, 2 mask draws, 2 micro-batches per update, λ smoothed by an EMA (its state must survive a resume),
    dapo (normalised by the global token count). p_mask_prompt = 0: the one-step log-probs of a row then do not depend
    on the other rows of its process's batch (the prompt-mask draw covers the whole local batch), so one process can
    reproduce them."""
    from dllm_ais.presets import get_preset

    p = get_preset(base)
    return replace(
        p,
        train=replace(p.train, steps=steps, prompts_per_step=prompts_per_step, sft_steps=sft_steps, sft_batch_size=8,
                      mismatch_num_draws=2, reward_fn=REWARD_FN, gradient_accumulation_steps=2, p_mask_prompt=0.0),
        grpo=replace(p.grpo, num_generations=2, loss_type="dapo"),
        correction=replace(p.correction, ais_ema=0.5),
    )


ROLLOUT_FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "commit_step")


def record_steps(records: list[dict], events: list[str], replay: list[dict] | None = None) -> None:
    """Record each step's rollout, ℓ, λ and ω (wrapping the backend and the trainer, in this process only), and the
    order of backward passes and DDP all-reduces; with `replay`, return its rollouts and ℓ instead of sampling."""
    import accelerate
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    import dllm_ais.train.step_mismatch as step_mismatch
    from dllm_ais.models.dream.backend import DreamBackend
    from dllm_ais.models.sdar.backend import SDARBackend
    from dllm_ais.train.backend import DiffusionBackend
    from dllm_ais.train.trainer import Trainer
    from dllm_ais.types import Rollout

    correct_global = step_mismatch.correct_global

    def sample_recording(sample):
        def wrapped(self, *args, **kwargs):
            if replay is not None:
                r = replay[len(records)]
                rollout = Rollout(**{f: r[f] for f in ROLLOUT_FIELDS}, num_steps=r["num_steps"])
            else:
                rollout = sample(self, *args, **kwargs)
            records.append({f: getattr(rollout, f).clone() for f in ROLLOUT_FIELDS} | {"num_steps": rollout.num_steps})
            return rollout
        return wrapped

    def mismatch_recording(mismatch):
        def wrapped(self, *args, **kwargs):
            log_w = replay[len(records) - 1]["log_w"] if replay is not None else mismatch(self, *args, **kwargs)
            records[-1]["log_w"] = log_w.clone()
            return log_w
        return wrapped

    def correct_recording(*args, **kwargs):
        out = correct_global(*args, **kwargs)
        records[-1].update(lam=out.lam.clone(), omega=out.omega.clone())
        return out

    for cls in (DiffusionBackend, DreamBackend, SDARBackend):  # each class's own sampler (Dream's, SDAR's override)
        cls.sample = sample_recording(cls.sample)
    for cls in (DiffusionBackend, SDARBackend):  # each class's own mismatch ratio (SDAR's overrides)
        cls.mismatch_log_w = mismatch_recording(cls.mismatch_log_w)
    step_mismatch.correct_global = correct_recording

    backward = accelerate.Accelerator.backward

    def backward_recording(self, loss, **kwargs):
        events.append("backward")
        return backward(self, loss, **kwargs)

    accelerate.Accelerator.backward = backward_recording

    def allreduce_recording(state, bucket):
        events.append("allreduce")
        return allreduce_hook(state, bucket)

    fit = Trainer.fit

    def fit_hooking(self, *args, **kwargs):
        if hasattr(self.model, "register_comm_hook"):  # the DDP wrapper
            self.model.register_comm_hook(None, allreduce_recording)
        return fit(self, *args, **kwargs)

    Trainer.fit = fit_hooking


def concat_records(ranks: list[list[dict]]) -> list[dict]:
    """Per step, the ranks' records concatenated along the batch (rank order): one process's global batch."""
    steps = []
    for per_rank in zip(*ranks, strict=True):
        step = {k: torch.cat([r[k] for r in per_rank]) for k in (*ROLLOUT_FIELDS, "log_w")}
        step["num_steps"] = per_rank[0]["num_steps"]
        steps.append(step)
    return steps


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of every tensor of `model`'s state_dict."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def record_initial_state(into: dict) -> None:
    """Wrap `Trainer.fit` (in this process only) so that it first stores the master's parameters in `into`."""
    from dllm_ais.train.trainer import Trainer

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
    ap.add_argument("--resume", action="store_true", help="resume the run in OUT and train it to --steps")
    ap.add_argument("--replay", type=Path, help="one process replaying the global batches of the run in this dir")
    args = ap.parse_args(argv)

    from dllm_ais.train.job import run_training

    init: dict[str, torch.Tensor] = {}
    record_initial_state(init)
    records: list[dict] = []
    events: list[str] = []
    replay, per_step = None, 2
    if args.replay is not None:
        ranks = [torch.load(f, weights_only=True) for f in sorted(args.replay.glob("params-rank*.pt"))]
        replay, per_step = concat_records([r["records"] for r in ranks]), 2 * len(ranks)
    record_steps(records, events, replay)
    trainer = run_training(small_preset(args.steps, args.sft_steps, per_step), args.out, resume=args.resume,
                           progress=False, steps=args.steps if args.resume else None)
    acc = trainer.acc
    final = snapshot(trainer.master)
    torch.save({"rank": acc.process_index, "world": acc.num_processes, "init": init, "final": final,
                "records": records, "events": events}, args.out / f"params-rank{acc.process_index}.pt")
    acc.wait_for_everyone()
    print(f"rank {acc.process_index}/{acc.num_processes}: done, {len(final)} tensors", flush=True)


if __name__ == "__main__":
    main()
