"""Checks on `dllm-ais train`'s input before the run directory is written: the directory, the task, a local --data
file and --model directory (no torch needed), then the device and the FP8 backend."""

from __future__ import annotations


def preflight_train(preset, out: str, resume: bool) -> None:
    """Checks that need no torch, run before the heavy imports so bad input fails in well under a second:
    the run directory, the task and a local --data file, a local --model directory."""
    from pathlib import Path

    run = Path(out)
    if run.exists() and not run.is_dir():
        raise FileExistsError(f"--out {out}: a file of that name exists; --out names a run directory.")
    for parent in run.parents:
        if parent.exists() and not parent.is_dir():
            raise FileExistsError(f"--out {out}: {parent} is a file, not a directory; choose another --out.")
    holds_run = (run / "config.json").exists() or (run / "metrics.jsonl").exists()
    if resume and not (run / "config.json").exists():
        raise FileNotFoundError(f"--resume: {run} holds no run (no config.json); drop --resume to start one there.")
    if not resume and holds_run:
        raise FileExistsError(f"--out {run} already holds a run; pass --resume to continue it, or choose another "
                              "--out.")
    if not resume and run.is_dir() and (others := sorted(p.name for p in run.iterdir())):
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise FileExistsError(f"--out {run}: a directory that holds other files ({shown}), not a run; a new run needs "
                              "a new or empty directory: choose another --out.")
    if resume:
        return  # the run's own config.json decides the rest
    from dllm_ais.tasks.loading import local_format
    from dllm_ais.tasks.registry import get_task

    try:
        task = get_task(preset.train.task)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    data = preset.train.data_path
    if data is not None:
        check_data_path(data)
        if local_format(data) == "json":
            task.load("train", data_path=data, limit=1)  # reads and checks every line of the file
    if preset.model.path is not None:
        check_model_dir(preset.model.path, preset.model.family)
    quick_device_checks(preset)


def check_model_dir(path: str, family: str) -> None:
    """--model names a checkpoint directory (a hub id is fetched here, once) whose config.json is a JSON object naming
    the preset's family; one line otherwise. No torch: the weights' shapes are checked later, still before any write
    (the family's check_source)."""
    from dllm_ais.families import family_of_config
    from dllm_ais.models.hub import read_json_object, resolve_checkpoint_dir

    directory = resolve_checkpoint_dir(path)
    cfg_file = directory / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"--model {path}: no config.json, so not a checkpoint directory.")
    data = read_json_object(cfg_file)
    found = family_of_config(data)
    if found is None:
        from dllm_ais.families import FAMILIES

        known = sorted({t for f in FAMILIES.values() for t in f.model_types})
        raise ValueError(f"{cfg_file}: unknown model family (model_type {data.get('model_type')!r}, architectures "
                         f"{data.get('architectures') or []}); supported model_type: {', '.join(known)}.")
    if found.name != family:
        from dllm_ais.presets import PRESETS

        presets = [name for name, p in PRESETS.items() if p.model.family == found.name]
        raise ValueError(f"--model {path}: config.json holds a {found.title} model but the preset's family is "
                         f"{family!r}; pick one of its presets with --preset ({', '.join(presets)}).")


CPU_FP8_REFUSALS = {
    "triton": ("CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before dllm_ais.fp8.kernels is first "
               "imported (slow; meant for tests)"),
    "cublas": "cuBLAS's blockwise FP8 GEMM needs a CUDA GPU with compute capability >= 9.0",
    "torchao": "torchao's blockwise FP8 GEMM is a CUDA kernel (needs a GPU with compute capability >= 8.9)",
}
"""FP8 backends that cannot run on the CPU, and why (fp8/backends.py's exact checks say the same once torch is in)."""


def quick_device_checks(preset) -> None:
    """The --device and --fp8-backend refusals that need no torch import (the exact checks run later, with torch):
    a CUDA device with a CPU-only torch build (its version ends in +cpu), and an FP8 backend that cannot run on the
    CPU."""
    import importlib.metadata
    import os

    device = preset.model.device
    if device.startswith("cuda"):
        try:
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            version = ""
        if version.endswith("+cpu"):
            raise RuntimeError(f"--device {device}: torch sees no CUDA device here (torch {version}); use --device "
                               "cpu, or a machine with a GPU and a CUDA build of torch.")
    backend = preset.train.fp8_backend
    fp8 = preset.train.rollout_precision == "fp8" or preset.correction.train_forward == "aligned"
    why = CPU_FP8_REFUSALS.get(backend) if fp8 and device == "cpu" else None
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
        why = None
    if why is not None:
        raise ValueError(f"--fp8-backend {backend}: FP8 backend {backend!r} cannot run on cpu: {why}. Use "
                         "--fp8-backend torch (or auto) on the CPU.")


def check_data_path(data: str) -> None:
    """--data is a local .jsonl/.json/.parquet file, or a hub dataset name; anything on disk that is neither (a
    directory, a CSV) or a missing local-looking path is refused here, not sent to the hub."""
    from pathlib import Path

    from dllm_ais.tasks.loading import LOCAL_FORMATS, local_format

    local = Path(data).expanduser()
    kinds = "/".join(LOCAL_FORMATS)
    if local.is_dir():
        raise ValueError(f"--data {data}: a directory; pass one {kinds} file inside it.")
    file_like = local.suffix.lower() in (".csv", ".tsv", ".txt", ".xls", ".xlsx", ".arrow")
    if local_format(data) is None and (local.exists() or data.startswith((".", "/", "~")) or file_like):
        what = "no such file" if not local.exists() else f"a {local.suffix or 'suffix-less'} file"
        raise ValueError(f"--data {data}: {what}; --data reads a local {kinds} file (convert a CSV with pandas: "
                         "pd.read_csv(f).to_json(out, orient='records', lines=True)) or names a hub dataset.")


def device_and_backend_checks(preset) -> None:
    """Checks that need torch, still before the run directory exists: the device is there, the FP8 backend is known
    and runs on it."""
    from dllm_ais.train.flags import check_device

    device = preset.model.device
    check_device(device)
    tc = preset.train
    if tc.rollout_precision == "fp8" or preset.correction.train_forward == "aligned":
        from dllm_ais.fp8.backends import check_backend

        try:
            check_backend(tc.fp8_backend, device)
        except ValueError as e:
            raise ValueError(f"--fp8-backend {tc.fp8_backend}: {e}") from None
