"""Atomic writes: a file or a directory is written beside its destination under a temporary name and renamed into
place, so a reader sees the old content or the new, never a half-written one; on an error the temporary is removed.

Permissions follow the user's umask, as a plain write would: `tempfile.mkdtemp` creates 0700 directories and
safetensors writes 0600 files, so everything renamed into place is first set to 0777/0666 minus the umask.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask (read by setting and restoring it; Python has no getter)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Set `path` (and, for a directory, everything under it) to 0777 (directories) / 0666 (files) minus the umask."""
    mask = current_umask()
    items = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in items:
        if p.is_symlink():
            continue
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write; when the block ends without error it is renamed to `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (flushed and fsynced before the rename)."""
    with atomic_file(path) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `path` (its parent is created) to fill; when the block ends without
    error it replaces `path` (see replace_dir), otherwise it is deleted and `path` is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        follow_umask(tmp)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(src: Path, dst: Path) -> None:
    """Rename src to dst; an existing dst is moved aside first and deleted only after the rename."""
    old = None
    if dst.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.replace(dst, old / dst.name)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
