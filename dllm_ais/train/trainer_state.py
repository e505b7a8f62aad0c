"""A trainer's checkpoint: what `save` writes at a step boundary (the model or adapter, the optimizer, schedule,
EMA λ and counters) and what `resume` reads back, so a resumed run continues exactly where the saved one stood."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from dllm_ais import metrics as M
from dllm_ais.train.run_dir import RunDir


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
    if ckpt is None:  # interrupted before its first checkpoint: start over
        if trainer.acc.is_main_process:
            M.MetricsWriter(trainer.run.path).truncate_after(-1)
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
    if trainer.acc.is_main_process:
        M.MetricsWriter(trainer.run.path).truncate_after(trainer.step - 1)
