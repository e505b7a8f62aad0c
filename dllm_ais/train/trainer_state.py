"""A trainer's checkpoint: what `save` writes at a step boundary (the model or adapter, the optimizer, schedule,
EMA λ and counters) and what `resume` reads back, so a resumed run continues exactly where the saved one stood."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import torch

from dllm_ais import metrics as M
from dllm_ais.train.interrupt import RESUME_EXIT_CODE, Preempted, resume_command
from dllm_ais.train.run_dir import RunDir

__all__ = ["Preempted", "SaveClock", "checkpoint", "report_preempted", "resume", "save"]


class SaveClock:
    """When the next wall-time checkpoint is due: `minutes` after the run (or this call of fit) started or after the
    last checkpoint; never when minutes is 0."""

    def __init__(self, minutes: float):
        self.seconds = 60.0 * minutes
        self.reset()

    def reset(self) -> None:
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.seconds > 0 and time.monotonic() - self.last >= self.seconds


def checkpoint(trainer, clock: SaveClock | None = None, verify: bool = False) -> Path | None:
    """save(trainer), then (main process) delete the checkpoints beyond TrainConfig.keep_checkpoints (multiples of
    save_every stay) and, with `verify`, read the new one back against its manifest (sha256 included); restarts
    the wall-time clock. Returns the checkpoint's path on the main process, None elsewhere."""
    path = save(trainer)
    tc = trainer.tc
    if path is not None:
        trainer.run.prune(tc.keep_checkpoints, lambda step: bool(tc.save_every) and step % tc.save_every == 0)
        if verify:
            RunDir.verify(path)
    if clock is not None:
        clock.reset()
    return path


def report_preempted(trainer, path: Path | None) -> None:
    """The main process's one line after a SIGTERM / SIGUSR1 stop."""
    if path is not None:
        steps = f"{trainer.step} step{'s' * (trainer.step != 1)}"
        print(f"\n{trainer._stop_reason or 'a signal to another process'}: stopped after {steps}; checkpoint {path} "
              f"written and verified; exiting with {RESUME_EXIT_CODE}: continue with "
              f"{resume_command(trainer.run.path)}", file=sys.stderr, flush=True)


def save(trainer) -> Path | None:
    """Write a checkpoint (main process; under FSDP every process takes part in gathering the full tensors)."""
    main = trainer.acc.is_main_process
    full_model = contextlib.nullcontext()
    if trainer.fsdp:
        from dllm_ais.train.fsdp_checkpoint import full_on_main, full_optimizer_state

        optimizer_state = full_optimizer_state(trainer.optimizer, main)
        full_model = full_on_main(trainer.master, main)
    elif main:
        optimizer_state = trainer.optimizer.state_dict()
    with full_model:
        if not main:
            return None
        state = {"step": trainer.step, "optimizer": optimizer_state, "scheduler": trainer.scheduler.state_dict(),
                 "prev_lam": None if trainer.prev_lam is None else float(trainer.prev_lam), "skipped": trainer.skipped,
                 "reward_errors": trainer.reward_errors}
        if trainer.master_weights is not None:
            state["master_weights"] = trainer.master_weights.state_dict()
        return trainer.run.save_checkpoint(trainer.step, lambda d: trainer.policy.save_model(trainer.master, d), state)

def resume(trainer, ckpt: Path | None) -> None:
    """Continue from `ckpt` (verified: run_dir.resume_checkpoint); None = no checkpoint yet, start over."""
    main = trainer.acc.is_main_process
    if ckpt is None:  # interrupted before its first checkpoint: start over
        if main:
            dropped = M.MetricsWriter(trainer.run.path).truncate_after(-1)
            print(f"--resume: {trainer.run.path} has no checkpoint yet: GRPO starts at step 0{_dropped(dropped)}",
                  file=sys.stderr, flush=True)
        return
    state = RunDir.load_state(ckpt)
    if trainer.fsdp:  # full tensors in the checkpoint: scatter them into this process's shards
        from dllm_ais.train.fsdp_checkpoint import load_full_optimizer_state, loading_full

        with loading_full(trainer.master):
            trainer.policy.load_model_state(trainer.master, ckpt)
        load_full_optimizer_state(trainer.optimizer, state["optimizer"])
    else:
        trainer.policy.load_model_state(trainer.master, ckpt)
        trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.step = state["step"]
    trainer.prev_lam = None if state["prev_lam"] is None else torch.tensor(state["prev_lam"])
    trainer.skipped, trainer.reward_errors = state["skipped"], state["reward_errors"]
    if trainer.master_weights is not None:
        trainer.master_weights.load_state_dict(state["master_weights"])
    trainer._sync_rollout()
    if main:
        dropped = M.MetricsWriter(trainer.run.path).truncate_after(trainer.step - 1)
        print(f"--resume: continuing from {ckpt} at step {trainer.step}{_dropped(dropped)}", file=sys.stderr,
              flush=True)
        if trainer.step >= trainer.tc.steps:
            print(f"--resume: the run has done all its {trainer.tc.steps} steps, so nothing is left to train; pass "
                  f"--steps N (more than {trainer.tc.steps}) with --resume to extend it", file=sys.stderr, flush=True)


def _dropped(steps: list[int]) -> str:
    """'; dropped metrics.jsonl rows of steps 3–5 (redone)' or '; no metrics.jsonl rows dropped'."""
    if not steps:
        return "; no metrics.jsonl rows dropped"
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"
    return f"; dropped the metrics.jsonl rows of {span} (they are redone)"
