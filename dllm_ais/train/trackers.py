"""Experiment trackers (`--report-to`, TrainConfig.report_to) through accelerate, as TRL's `report_to` does it.

The run's Accelerator is built with `log_with=report_to` and the run directory as its project (`accelerator_kwargs`);
the main process starts the trackers when the loop starts (`start`: `init_trackers` with the run's config, the run
directory's name as the run name) and gets the `Mirror` that MetricsWriter calls after writing each metrics.jsonl line
(`accelerator.log`). metrics.jsonl is the source of truth; a tracker only mirrors it.

Where each tracker writes: tensorboard under <out>/logs/dllm-ais/ (`tensorboard --logdir <out>/logs`); wandb's files
under <out>/wandb/ (online, or offline with WANDB_MODE=offline); the others where their own settings say (mlflow:
MLFLOW_TRACKING_URI, default ./mlruns; trackio: its local database) — project / experiment "dllm-ais".
"""

from __future__ import annotations

import json
from pathlib import Path

PROJECT = "dllm-ais"
LOGGING_DIR = "logs"


def accelerator_kwargs(report_to: list[str], run_path: str | Path) -> dict:
    """Accelerator(...) keyword arguments for these trackers (none: {})."""
    if not report_to:
        return {}
    from accelerate.utils import ProjectConfiguration

    run = Path(run_path)
    return {"log_with": list(report_to),
            "project_config": ProjectConfiguration(project_dir=str(run), logging_dir=str(run / LOGGING_DIR))}


def flat_config(config: dict, prefix: str = "") -> dict[str, bool | int | float | str]:
    """{"train": {"steps": 3}} -> {"train/steps": 3}; lists, dicts inside lists and None become their JSON text (the
    value types every tracker's hyperparameter table takes)."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, f"{name}/"))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


class Mirror:
    """The trackers of one Accelerator, as MetricsWriter uses them: one step's numbers, then finish()."""

    def __init__(self, accelerator):
        self.acc = accelerator

    def log(self, row: dict, step: int) -> None:
        self.acc.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
                     step=step)

    def finish(self) -> None:
        for tracker in self.acc.trackers:  # not accelerator.end_training(): that also ends the process group
            tracker.finish()


def start(accelerator, preset, run_path: str | Path) -> Mirror | None:
    """Start the Accelerator's trackers on this (main) process with the run's config; None when it has none."""
    if not accelerator.log_with:
        return None
    run = Path(run_path)
    accelerator.init_trackers(PROJECT, config=flat_config(preset.to_dict()), init_kwargs={
        "wandb": {"name": run.name, "dir": str(run)}, "mlflow": {"run_name": run.name},
        "trackio": {"name": run.name}})
    return Mirror(accelerator)
