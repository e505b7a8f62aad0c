"""A training run's directory: config, metrics, and atomic, verifiable checkpoints.

<out>/config.json             the Preset the run uses (a resumed run reads it back)
<out>/metrics.jsonl           one JSON object per step (dllm_ais.metrics)
<out>/checkpoints/step-N/     model/ (official layout) or adapter/ (peft LoRA), trainer_state.pt, manifest.json
<out>/checkpoints/latest      name of the newest complete checkpoint

A checkpoint is written into a temporary directory, its manifest (size + sha256 of every file) last, and renamed into
place; loading verifies the manifest, so a partial or corrupted checkpoint is reported, never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from dllm_ais.atomic import atomic_dir, atomic_write_text
from dllm_ais.config import Preset

MANIFEST = "manifest.json"
STATE = "trainer_state.pt"


def read_run_config(run: str | os.PathLike) -> Preset:
    """The Preset in `run`/config.json; a missing, unreadable or invalid file is one ValueError naming it."""
    path = Path(run) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file, so {run} is not a dllm-ais run directory.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; the run's config is corrupt (restore it, or start a new run)."
                         ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}); the run's config is "
                         "corrupt (restore it, or start a new run).") from None
    if not isinstance(data, dict) or "name" not in data:
        raise ValueError(f"{path}: not a dllm-ais run config (expected an object with 'name', 'model', 'train', ...).")
    try:
        return Preset.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


class CheckpointCorrupt(RuntimeError):
    """A checkpoint that is partial or whose files do not match its manifest."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class RunDir:
    """Paths and operations of one run directory."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    def holds_run(self) -> bool:
        return self.config_file.exists() or (self.path / "metrics.jsonl").exists()

    def create(self, preset: Preset, resume: bool) -> Preset:
        """Prepare the directory; returns the preset to use (the saved one when resuming)."""
        if resume:
            if not self.config_file.exists():
                raise FileNotFoundError(f"--resume: {self.path} holds no run (no config.json); drop --resume to "
                                        "start one there.")
            return read_run_config(self.path)
        if self.holds_run():
            raise FileExistsError(f"--out {self.path} already holds a run; pass --resume to continue it, or choose "
                                  "another --out.")
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config_file, json.dumps(preset.to_dict(), indent=2))
        return preset

    def update_config(self, preset: Preset) -> Preset:
        """Rewrite config.json (a resumed run whose step count changed)."""
        atomic_write_text(self.config_file, json.dumps(preset.to_dict(), indent=2))
        return preset

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        pointer = self.checkpoints / "latest"
        if not pointer.exists():
            return None
        ckpt = self.checkpoints / pointer.read_text().strip()
        if not ckpt.is_dir():
            raise CheckpointCorrupt(f"{pointer} names {ckpt.name}, which does not exist.")
        return ckpt

    def save_checkpoint(self, step: int, write_model: Callable[[Path], None], state: dict) -> Path:
        """Write checkpoint `step-N`: `write_model(dir)` fills the model files, `state` goes to trainer_state.pt."""
        import torch

        name = f"step-{step:06d}"
        final = self.checkpoints / name
        with atomic_dir(final) as tmp:
            write_model(tmp)
            torch.save(state, tmp / STATE)
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            manifest = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
            (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": manifest}, indent=2))
        atomic_write_text(self.checkpoints / "latest", name)
        return final

    @staticmethod
    def verify(ckpt: Path) -> dict:
        """Check every file against the manifest; returns the manifest. Raises CheckpointCorrupt naming the file."""
        manifest_file = ckpt / MANIFEST
        if not manifest_file.exists():
            raise CheckpointCorrupt(f"{ckpt}: no {MANIFEST} — the checkpoint was not completely written.")
        try:
            manifest = json.loads(manifest_file.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointCorrupt(f"{manifest_file}: unreadable ({e}).") from e
        for rel, meta in manifest["files"].items():
            f = ckpt / rel
            if not f.is_file():
                raise CheckpointCorrupt(f"{ckpt}: file {rel} listed in the manifest is missing.")
            if f.stat().st_size != meta["bytes"] or _sha256(f) != meta["sha256"]:
                raise CheckpointCorrupt(f"{ckpt}: file {rel} does not match its manifest (corrupted or modified).")
        return manifest

    @staticmethod
    def load_state(ckpt: Path) -> dict:
        import torch

        return torch.load(ckpt / STATE, map_location="cpu", weights_only=True)
