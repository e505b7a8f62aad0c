"""Reading task rows through ``datasets``: a local jsonl/parquet file offline, a hub dataset name online.

``data_path`` ending in ``.jsonl``/``.json``/``.parquet`` (globs allowed) is read locally with
``datasets.load_dataset("json"|"parquet", data_files=...)``; any other string is taken as a hub dataset name. Rows come
back as plain dicts in file order (``limit`` keeps the first rows; the trainer shuffles with its own generator).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""File suffix -> ``datasets`` builder name."""


def local_format(data_path: str) -> str | None:
    """``"json"``/``"parquet"`` when ``data_path`` names a local file by its suffix, else ``None`` (a hub name)."""
    for suffix, builder in LOCAL_FORMATS.items():
        if str(data_path).lower().endswith(suffix):
            return builder
    return None


def read_rows(
    split: str,
    data_path: str | None,
    hub_name: str,
    hub_config: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Rows of ``split`` from ``data_path`` (local file or hub name) or, when it is None, from ``hub_name``.

    A local file *is* the split: all its rows are returned whatever ``split`` says.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    source = hub_name if data_path is None else str(data_path)
    builder = None if data_path is None else local_format(source)
    if builder == "json" and not any(c in source for c in "*?["):
        rows = read_json_rows(source)
        return rows if limit is None else rows[:limit]
    import datasets  # heavy: imported only when data is actually read

    if builder is not None:
        if not any(c in source for c in "*?[") and not Path(source).is_file():
            raise FileNotFoundError(f"{source}: no such file.")
        try:
            dataset = datasets.load_dataset(builder, data_files=source, split="train")
        except Exception as err:  # datasets' own traceback is long and rarely names the line
            raise ValueError(f"{source}: could not read it as {builder} ({type(err).__name__}: {err}).") from None
    else:
        config = hub_config if data_path is None else None
        try:
            dataset = datasets.load_dataset(source, config, split=split)
        except Exception as err:  # offline, unknown name, unknown split: say what to do instead
            raise RuntimeError(
                f"could not load split {split!r} of hub dataset {source!r} (config {config!r}): {err}. "
                "Offline? pass data_path=<local .jsonl/.parquet file> instead (on the command line: train --data, "
                "eval --data-path)."
            ) from err
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return dataset.to_list()


def read_json_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a local JSON-lines file (one object per line) or of a JSON array of objects, in file order; every row
    gets every column (None where a row lacks it). Errors are one line naming the file and line."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no such file.")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}); expected one JSON object per line.") from None
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; expected one JSON object per line.")
    rows: list[Any] | None = None
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}).") from None
        lines = list(range(1, len(rows) + 1))
    else:
        rows, lines = [], []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                _refuse_one_object(path, text)
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg}, column {e.colno}).") from None
            lines.append(n)
    for row, n in zip(rows, lines, strict=True):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}.")
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return [{k: row.get(k) for k in columns} for row in rows]


def _refuse_one_object(path: str, text: str) -> None:
    """A file that is one JSON object over several lines (not records): say what a .json/.jsonl file must hold."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(whole, dict):
        keys = ", ".join(list(whole)[:5])
        raise ValueError(f"{path}: one JSON object (keys {keys}), not records; a .json/.jsonl file must hold one "
                         "object per line (JSON Lines) or a JSON array of objects, e.g. [{\"prompt\": ...}, ...].")


def require(row: dict[str, Any], index: int, field: str, source: str, aliases: Sequence[str] = ()) -> Any:
    """``row[field]`` (or the first present alias); ``ValueError`` naming the row index and field when absent/null."""
    for name in (field, *aliases):
        value = row.get(name)
        if value is not None:
            return value
    also = f" (or {', '.join(repr(a) for a in aliases)})" if aliases else ""
    present = sorted(k for k, v in row.items() if v is not None)
    raise ValueError(f"{source}: row {index} has no field {field!r}{also}; its fields are {present}")


def check_limit(limit: int | None, default: int) -> int:
    """Number of rows a procedural generator makes: ``limit`` or the task's default."""
    n = default if limit is None else limit
    if n < 0:
        raise ValueError(f"limit must be >= 0, got {n}")
    return n
