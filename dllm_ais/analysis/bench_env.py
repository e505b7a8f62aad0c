"""What the benchmark scripts (scripts/bench_*.py) share: the environment fields on every row, the JSONL row writer, the
reasons written on skipped or failed rows, CUDA memory statistics, and the BF16-then-each-FP8-backend model loop.

Light at import: torch and the FP8 package are imported inside the functions that need them.
"""

from __future__ import annotations

import importlib
import json
import platform
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

NO_CUDA_REASON = "no CUDA device: the full benchmark needs a GPU (use --smoke on CPU)"


def git_commit(repo: Path) -> tuple[str, bool | None]:
    """(HEAD's sha or "unknown", whether the work tree has changes; None when git cannot run)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True).stdout.strip()

    try:
        return git("rev-parse", "HEAD") or "unknown", bool(git("status", "--porcelain"))
    except OSError:
        return "unknown", None


def device_name(device) -> str:
    """The GPU's name, or the CPU's (platform.processor(), "cpu" when empty)."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")


def version(module: str) -> str | None:
    """`module.__version__`, or None when it cannot be imported."""
    try:
        return importlib.import_module(module).__version__
    except ImportError:
        return None


def environment(device, smoke: bool, repo: Path, bench: str | None = None, libraries: tuple[str, ...] = ("torch",),
                **extra: object) -> dict:
    """Fields shared by every row, in this order: bench (when given), device, each library's version, `extra`, git_sha,
    git_dirty, smoke."""
    sha, dirty = git_commit(repo)
    head = {} if bench is None else {"bench": bench}
    return {**head, "device": device_name(device), **{name: version(name) for name in libraries}, **extra,
            "git_sha": sha, "git_dirty": dirty, "smoke": smoke}


@contextmanager
def jsonl_writer(path: str | Path, env: dict) -> Iterator[Callable[..., None]]:
    """`emit(**record)` appends {**env, **record, "time": now} as one JSON line to `path` (created with its folder) and
    prints it; each line is flushed as written, so a run cut short keeps its rows."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:

        def emit(**record: object) -> None:
            line = json.dumps({**env, **record, "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
            f.write(line + "\n")
            f.flush()
            print(line, flush=True)

        yield emit


def backend_reason(backend: str, device) -> str | None:
    """Why FP8 `backend` cannot run on `device` (FP8BackendError's message), or None."""
    from dllm_ais.fp8 import FP8BackendError, check_backend

    try:
        check_backend(backend, device)
    except FP8BackendError as e:
        return str(e)
    return None


def error_reason(e: BaseException) -> str:
    """A failed row's reason: the exception's type and the first line of its message."""
    first_line = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first_line}"


def sync(device) -> None:
    """Wait for the device's queued work (a no-op off CUDA), so wall-clock timings cover it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def cuda_memory(device) -> Iterator[dict]:
    """On CUDA: empties the allocator cache and resets the peak before the block; after it the yielded dict holds
    peak_mem_gib (peak allocated during the block) and model_gib (allocated before it). Stays empty off CUDA."""
    import torch

    stats: dict = {}
    if device.type != "cuda":
        yield stats
        return
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    model_bytes = torch.cuda.memory_allocated(device)
    yield stats
    stats["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    stats["model_gib"] = model_bytes / 2**30


def for_each_precision(master, backends: Sequence[str], device, measure: Callable[..., None]) -> None:
    """measure(precision, backend, model, info) for BF16 (`master`, backend None) and then for each FP8 backend.

    FP8: model = quantize_model(master, backend) (info["quantize_s"]: its wall time), with the master waiting on the CPU
    while the FP8 copy is measured, so only the measured model is resident; the copy is freed and the master moved back
    afterwards. A backend that cannot run here, or whose quantize_model raises, gets model None and info
    {"status": "skipped" or "failed", "reason": ...}.
    """
    import torch

    from dllm_ais.fp8 import quantize_model

    measure("bf16", None, master, {})
    for backend in backends:
        reason = backend_reason(backend, device)
        if reason is not None:
            measure("fp8", backend, None, {"status": "skipped", "reason": reason})
            continue
        try:
            sync(device)
            t0 = time.perf_counter()
            model = quantize_model(master, backend=backend)
            sync(device)
            info = {"quantize_s": time.perf_counter() - t0}
            master.to("cpu")  # only the measured model stays on the device
        except Exception as e:  # a backend that fails to build is reported, not fatal
            model, info = None, {"status": "failed", "reason": f"quantize_model failed: {error_reason(e)}"}
        measure("fp8", backend, model, info)
        del model  # the FP8 copy goes before the master comes back
        if device.type == "cuda":
            torch.cuda.empty_cache()
        master.to(device)
