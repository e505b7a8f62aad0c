"""A `--model` string -> a local checkpoint directory (a hub id fetched once with huggingface_hub), and its JSON
files read with one-line errors. No torch import: the train command resolves and checks `--model` before the heavy
imports, so bad input is refused in under a second."""

from __future__ import annotations

import json
from pathlib import Path

HUB_FILES = ["*.json", "*.safetensors", "*.py", "*.txt", "*.model", "*.jinja"]
"""What a checkpoint download fetches: configs, weights, tokenizer files (remote-code .py files are fetched only so a
saved copy opens where the original did; they are never run)."""


def resolve_checkpoint_dir(path: str) -> Path:
    """A local directory as is; otherwise a hub repo id, fetched with huggingface_hub (needs network access). Every
    failure is one line of ours saying what to do."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if local.exists() or path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"--model {path}: not a checkpoint directory.")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(path, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, unknown repo, no access: their text spans lines; the class says which
        raise FileNotFoundError(f"--model {path}: not a local directory, and the hub download failed "
                                f"({type(e).__name__}: offline, an unknown repo or no access). Download it once "
                                f"(huggingface-cli download {path} --local-dir DIR) and pass --model DIR.") from None


def read_json_object(path: Path, error: type[Exception] = ValueError) -> dict:
    """The JSON object in `path`, or `error` with one line naming the file and what is wrong (truncated, not an
    object)."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        cut = " — the file looks truncated (it ends before the JSON does)" if e.pos >= len(text.rstrip()) else ""
        raise error(f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}{cut}; restore or "
                    "re-download it.") from None
    if not isinstance(data, dict):
        raise error(f"{path}: holds a JSON {type(data).__name__}, not an object of config fields.")
    return data
