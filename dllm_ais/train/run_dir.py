"""A training run's directory: config, metrics, and atomic, verifiable checkpoints.

<out>/config.json             the Preset the run uses (a resumed run reads it back)
<out>/metrics.jsonl           one JSON object per step (dllm_ais.metrics)
<out>/checkpoints/step-N/     model/ (official layout) or adapter/ (peft LoRA), trainer_state.pt, manifest.json
<out>/checkpoints/latest      name of the newest complete checkpoint

A checkpoint is written into a temporary directory, its manifest (size + sha256 of every file) last, and renamed into
place. Every load verifies the manifest (`--resume`, `eval --run/--model`, `sample --run`), so a partial or corrupted
checkpoint is reported, naming the file, never half-loaded: sizes always, sha256 unless `--no-hash-check` (hashing
runs at about 1.3 GB/s per core, the files in parallel). `--resume` falls back to the newest intact checkpoint
(`resume_checkpoint`); eval and sample hash only the files they load (model/ or adapter/).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
    train = data.get("train")
    if isinstance(train, dict) and "tensorboard" in train:  # a run written before --report-to replaced --tensorboard
        train.setdefault("report_to", ["tensorboard"] if train.pop("tensorboard") else [])
    try:
        return Preset.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def add_hash_check_argument(parser: argparse.ArgumentParser) -> None:
    """`--no-hash-check`, for every command that loads a run's checkpoint (train --resume, eval, sample)."""
    parser.add_argument("--no-hash-check", action="store_true", help="verify a run checkpoint's files by size only, "
                        "not sha256 (sha256 runs at about 1.3 GB/s per file, files in parallel: a few seconds for "
                        "LLaDA-8B's sharded 16 GB of weights, about 75 s for the ~96 GB fp32 optimizer state a full "
                        "fine-tune resumes from)")


class CheckpointCorrupt(RuntimeError):
    """A checkpoint that is partial or whose files do not match its manifest."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256_all(paths: list[Path]) -> list[str]:
    """sha256 of each file, several files at once (hashlib releases the GIL: one core per file)."""
    if len(paths) < 2:
        return [_sha256(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1)) as pool:
        return list(pool.map(_sha256, paths))


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

    def create(self, preset: Preset, resume: bool, extra: dict | None = None) -> Preset:
        """Prepare the directory; returns the preset to use (the saved one when resuming). extra: top-level records
        written beside the preset in config.json (e.g. "sampling": what a Dream checkpoint set and what runs), read
        by people, ignored by `read_run_config`, kept by `update_config`."""
        if resume:
            if not self.config_file.exists():
                raise FileNotFoundError(f"--resume: {self.path} holds no run (no config.json); drop --resume to "
                                        "start one there.")
            return read_run_config(self.path)
        if self.holds_run():
            raise FileExistsError(f"--out {self.path} already holds a run; pass --resume to continue it, or choose "
                                  "another --out.")
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config_file, json.dumps({**preset.to_dict(), **(extra or {})}, indent=2))
        return preset

    def update_config(self, preset: Preset) -> Preset:
        """Rewrite config.json (a resumed run whose step count changed), keeping its extra records."""
        data = preset.to_dict()
        try:
            old = json.loads(self.config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        extra = {k: v for k, v in old.items() if k not in data} if isinstance(old, dict) else {}
        atomic_write_text(self.config_file, json.dumps({**data, **extra}, indent=2))
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
            manifest = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": h}
                        for p, h in zip(files, _sha256_all(files), strict=True)}
            (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": manifest}, indent=2))
        atomic_write_text(self.checkpoints / "latest", name)
        return final

    @staticmethod
    def verify(ckpt: Path, hashes: bool = True, hash_only: tuple[str, ...] | None = None) -> dict:
        """Check every file against the manifest; returns the manifest. Raises CheckpointCorrupt naming the file.

        Sizes are always checked; sha256 too when `hashes`, of every file or only those under `hash_only` (e.g.
        ("model/", "adapter/") for a load that reads no trainer state)."""
        manifest_file = ckpt / MANIFEST
        if not manifest_file.exists():
            raise CheckpointCorrupt(f"{ckpt}: no {MANIFEST} — the checkpoint was not completely written.")
        try:
            manifest = json.loads(manifest_file.read_text())
            files = manifest["files"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise CheckpointCorrupt(f"{manifest_file}: unreadable ({e}).") from e
        for rel, meta in files.items():
            f = ckpt / rel
            if not f.is_file():
                raise CheckpointCorrupt(f"{ckpt}: file {rel} listed in the manifest is missing.")
            if f.stat().st_size != meta["bytes"]:
                raise CheckpointCorrupt(f"{ckpt}: file {rel} does not match its manifest ({f.stat().st_size} bytes, "
                                        f"{meta['bytes']} written: truncated or modified).")
        todo = [rel for rel in files if hashes and (hash_only is None or rel.startswith(hash_only))]
        for rel, digest in zip(todo, _sha256_all([ckpt / rel for rel in todo]), strict=True):
            if digest != files[rel]["sha256"]:
                raise CheckpointCorrupt(f"{ckpt}: file {rel} does not match its manifest (sha256 differs: corrupted "
                                        "or modified).")
        return manifest

    def step_dirs(self) -> list[Path]:
        """Every checkpoints/step-N directory, newest (largest N) first."""
        if not self.checkpoints.is_dir():
            return []
        found = [p for p in self.checkpoints.iterdir() if p.is_dir() and re.fullmatch(r"step-\d+", p.name)]
        return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)

    def newest_intact(self, hashes: bool = True) -> tuple[Path | None, list[tuple[Path, str]]]:
        """The newest checkpoint that verifies (None if none does) and the newer ones that do not, with why."""
        broken = []
        for ckpt in self.step_dirs():
            try:
                self.verify(ckpt, hashes)
                return ckpt, broken
            except CheckpointCorrupt as e:
                broken.append((ckpt, str(e)))
        return None, broken

    def prune(self, keep: int, permanent: Callable[[int], bool] = lambda step: False) -> list[Path]:
        """Delete the oldest step-N checkpoints beyond the newest `keep` (0 = keep all), except those whose step is
        `permanent` and the one `latest` names; returns the deleted paths. (Set-aside *.corrupt ones stay.)"""
        import shutil

        if keep <= 0:
            return []
        pointer = self.checkpoints / "latest"
        latest = pointer.read_text().strip() if pointer.exists() else None
        rolling = [p for p in self.step_dirs() if not permanent(int(p.name[5:]))]
        gone = [p for p in rolling[keep:] if p.name != latest]
        for p in gone:  # renamed first: a kill mid-delete leaves no half checkpoint under a step-N name
            doomed = p.with_name(f"{p.name}.deleting")
            os.replace(p, doomed)
            shutil.rmtree(doomed)
        return gone

    @staticmethod
    def load_state(ckpt: Path) -> dict:
        import torch

        return torch.load(ckpt / STATE, map_location="cpu", weights_only=True)


def _set_aside(run: RunDir, broken: list[tuple[Path, str]], keep: Path) -> list[Path]:
    """Rename each corrupt checkpoint to step-N.corrupt (kept for inspection; a later save of step N cannot clash)
    and point `latest` at `keep`. Returns the new paths."""
    moved = []
    for ckpt, _ in broken:
        target, i = ckpt.with_name(f"{ckpt.name}.corrupt"), 1
        while target.exists():
            target, i = ckpt.with_name(f"{ckpt.name}.corrupt-{i}"), i + 1
        os.replace(ckpt, target)
        moved.append(target)
    atomic_write_text(run.checkpoints / "latest", keep.name)
    return moved


def _pick_resume(run: RunDir, hashes: bool) -> tuple[str | None, str | None]:
    """(checkpoint name to resume from or None, error) — the main process's decision, see resume_checkpoint."""
    ckpt, broken = run.newest_intact(hashes)
    if not broken:
        return (ckpt.name if ckpt else None), None
    why = "; ".join(reason.rstrip(".") for _, reason in broken)
    if ckpt is None:
        older = [c.name for c, _ in broken[1:]]
        more = f"; the older {', '.join(older)} fail too" if older else ""
        return None, (f"--resume: no intact checkpoint in {run.checkpoints}: {broken[0][1].rstrip('.')}{more}. "
                      "Restore the files, or start a new run with another --out.")
    step, newest = int(ckpt.name[5:]), int(broken[0][0].name[5:])
    lost = f"step {step} is" if newest - 1 == step else f"steps {step}–{newest - 1} are"
    moved = _set_aside(run, broken, ckpt)
    print(f"warning: --resume: {why}. Resuming from {ckpt.name}, the newest intact checkpoint: {lost} lost and "
          f"will be redone (numbered as in metrics.jsonl, whose rows from step {step} on are dropped); moved "
          f"{', '.join(f'{c.name} to {m.name}' for (c, _), m in zip(broken, moved, strict=True))}.", file=sys.stderr)
    return ckpt.name, None


def resume_checkpoint(run: RunDir, state, hashes: bool = True) -> Path | None:
    """The checkpoint `--resume` continues from: the newest that verifies, None when the run has none yet (start
    over). Newer corrupt ones are reported (which steps are lost) and set aside; none intact raises
    CheckpointCorrupt. The main process verifies and decides (under `accelerate launch` the others follow it), so
    the files are hashed once. `state`: accelerate's PartialState."""
    picked = [_pick_resume(run, hashes) if state.is_main_process else None]
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(picked)
    name, error = picked[0]
    if error is not None:
        raise CheckpointCorrupt(error)
    return None if name is None else run.checkpoints / name
