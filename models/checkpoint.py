"""Read and write checkpoint directories in the official hub layout of a family (LLaDA, Dream), without
trust_remote_code: what every family's checkpoint reader shares (models/<family>/checkpoint.py holds the rest).

A directory holds `config.json`, `model.safetensors` or sharded
`model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`, and tokenizer files. Every tensor is checked
by name and shape before anything is assigned; saving is atomic (temporary directory, then rename).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dllm_ais.atomic import atomic_dir

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# Files an official directory carries besides weights; copied on save so the output opens like the input.
_PASSTHROUGH_SUFFIXES = (".py", ".json", ".model", ".txt", ".jinja")
_WRITTEN_BY_US = {"config.json", INDEX_NAME}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the file, field or tensor."""


OPTIONAL_TOKEN_IDS = ("bos_token_id", "eot_token_id")
"""Ids a config.json may omit: taken from generation_config.json, then the tokenizer (models/load.py), else None."""


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e}).") from e
    return data if isinstance(data, dict) else {}


def fill_token_ids(data: dict, path: str | os.PathLike, keys) -> None:
    """Token ids config.json leaves out (None) taken from generation_config.json where it gives an int, else None."""
    generation = _read_json(Path(path) / "generation_config.json")
    for key in keys:
        if data.get(key) is None:
            data[key] = generation.get(key) if isinstance(generation.get(key), int) else None


def checked_config(config, cfg_file: Path, token_keys, size: int, table: str):
    """`config` once every token id in `token_keys` lies in [0, size) (`table` names the embedding in the error) and
    its own validate() passes; else a one-line CheckpointError naming the file and the field."""
    for key in token_keys:
        value = getattr(config, key, None)
        if value is not None and not 0 <= value < size:
            raise CheckpointError(f"{cfg_file}: {key}={value} is outside {table}; set it to this checkpoint's id.")
    try:
        config.validate()
    except ValueError as e:
        raise CheckpointError(f"{cfg_file}: {e}") from e
    return config


def _weight_files(path: Path) -> dict[str, list[str]]:
    """Map each safetensors file in `path` to the tensor names it should hold (from the index when sharded)."""
    index = path / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object.")
        files: dict[str, list[str]] = {}
        for name, fname in weight_map.items():
            files.setdefault(fname, []).append(name)
        return files
    if (path / SINGLE_NAME).is_file():
        return {SINGLE_NAME: []}
    raise CheckpointError(f"{path}: neither {SINGLE_NAME} nor {INDEX_NAME} found (only safetensors are loaded).")


def check_tensor_headers(path: Path, expected: dict[str, tuple[int, ...]], what: str,
                         optional: frozenset[str] = frozenset()) -> dict[Path, list[str]]:
    """Every tensor name and shape in the directory's safetensors headers checked against `expected` (no tensor is
    read); names in `optional` may be absent (e.g. a tied LM head). Returns {file: its tensor names}. `what` names the
    model in messages; a mismatch is one CheckpointError line naming the file and the tensor."""
    found: dict[Path, list[str]] = {}
    for fname, names in _weight_files(path).items():
        fpath = path / fname
        if not fpath.is_file():
            raise CheckpointError(f"{fpath}: listed in {INDEX_NAME} but missing.")
        with safe_open(str(fpath), framework="pt", device="cpu") as f:
            keys = set(f.keys())
            for name in names:
                if name not in keys:
                    raise CheckpointError(f"{fpath}: tensor {name!r} listed in the index is not in the file.")
            for name in sorted(keys):
                if name not in expected:
                    raise CheckpointError(f"{fpath}: unexpected tensor {name!r} for {what}.")
                shape = tuple(f.get_slice(name).get_shape())
                if shape != expected[name]:
                    raise CheckpointError(f"{fpath}: tensor {name!r} has shape {shape}, config.json implies "
                                          f"{expected[name]}.")
        found[fpath] = sorted(keys)
    missing = sorted(set(expected) - {n for names in found.values() for n in names} - optional)
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(f"{path}: missing tensor(s) {', '.join(missing[:3])}{more}.")
    return found


def read_checked_state(path: Path, expected: dict[str, tuple[int, ...]], dtype: torch.dtype,
                       device: str | torch.device, what: str,
                       optional: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors, read once all of them passed `check_tensor_headers`."""
    state: dict[str, torch.Tensor] = {}
    for fpath, names in check_tensor_headers(path, expected, what, optional).items():
        with safe_open(str(fpath), framework="pt", device="cpu") as f:
            for name in names:
                state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    return state


def expected_shapes(model_cls, config) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of `model_cls(config)`, built on the meta device (no memory, no weights)."""
    with torch.device("meta"):
        model = model_cls(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_model_files(model_cls, config, path: Path, what: str, tied: dict[str, str] | None = None) -> None:
    """A checkpoint's tensors match what its config.json implies, checked from the safetensors headers only: run
    before anything is written, so a run directory is never created for weights that cannot load."""
    check_tensor_headers(Path(path), expected_shapes(model_cls, config), what, optional=frozenset(tied or {}))


def load_checked_model(model_cls, config, path: Path, dtype: torch.dtype, device, what: str,
                       tied: dict[str, str] | None = None):
    """`model_cls(config)` built on the meta device and filled from `path`'s checked tensors (read_checked_state), in
    eval mode. `tied`: {weight: source} pairs a checkpoint may omit (a tied head is the embedding)."""
    tied = tied or {}
    with torch.device("meta"):
        model = model_cls(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = read_checked_state(path, expected, dtype, device, what, optional=frozenset(tied))
    for name, source in tied.items():
        state[name] = state[source]
    model.load_state_dict(state, strict=True, assign=True)
    if tied:
        model.tie_weights()
    return model.eval()


def _shards(state: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def save_checkpoint(model, path: str | os.PathLike, tokenizer=None,
               source_dir: str | os.PathLike | None = None, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write `model` (LLaDA or Dream) to `path` in the official layout, atomically (an existing `path` is replaced
    only at the end).

    `tokenizer` (if given) is saved beside the weights; `source_dir` is an official directory whose remaining files
    (remote-code .py, tokenizer and generation configs) are copied so the output opens wherever the input did. A
    Dream's checkpoint sampling settings (`model.sampling_defaults`) are written as generation_config.json when no
    source file gave one, so the saved model samples as the run did.
    """
    path = Path(path)
    with atomic_dir(path) as tmp:
        if source_dir is not None:
            for f in Path(source_dir).iterdir():
                if f.is_file() and f.suffix in _PASSTHROUGH_SUFFIXES and f.name not in _WRITTEN_BY_US:
                    shutil.copy2(f, tmp / f.name)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        sampling = getattr(model, "sampling_defaults", None)  # a Dream's alg / alg_temp / top_p / top_k
        if sampling and not (tmp / "generation_config.json").exists():
            (tmp / "generation_config.json").write_text(json.dumps(sampling, indent=2, sort_keys=True) + "\n")
        model.config.architectures = [getattr(model, "hub_architecture", "LLaDAModelLM")]
        model.config.to_json_file(str(tmp / "config.json"))
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):  # the head is the embedding: stored once
            for key in getattr(model, "_tied_weights_keys", None) or ():
                state.pop(key, None)
        shards = _shards(state, max_shard_bytes)
        if len(shards) == 1:
            save_file(shards[0], str(tmp / SINGLE_NAME), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(shard, fname))
            total = sum(t.numel() * t.element_size() for t in state.values())
            (tmp / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                     indent=2))
    return path


def save_model(model, tokenizer, path: str | os.PathLike) -> Path:
    """The LLaDA and Dream families' save hook: `save_checkpoint(model, path, tokenizer=tokenizer)`."""
    return save_checkpoint(model, path, tokenizer=tokenizer)
