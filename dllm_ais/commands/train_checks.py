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
    path = preset.model.path
    if path is not None:
        local = Path(path).expanduser()
        if local.exists() or path.startswith((".", "/", "~")):
            if not local.is_dir():
                raise FileNotFoundError(f"--model {path}: not a checkpoint directory.")
            if not (local / "config.json").is_file():
                raise FileNotFoundError(f"--model {path}: no config.json, so not a checkpoint directory.")


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
