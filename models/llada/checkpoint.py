"""Read LLaDA checkpoint directories in the official layout (config.json with model_type "llada"), without
trust_remote_code; writing goes through models/checkpoint.py `save_checkpoint`."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dllm_ais.models.checkpoint import (
    OPTIONAL_TOKEN_IDS,
    CheckpointError,
    check_model_files,
    checked_config,
    fill_token_ids,
    load_checked_model,
)
from dllm_ais.models.hub import read_json_object
from dllm_ais.models.llada.model import LLaDAConfig, LLaDAModelLM


def _check_field_types(data: dict, cfg_file: Path) -> None:
    """Every field LLaDAConfig declares as int / float / bool (None allowed where it says `| None`) must hold that
    type: one line naming the file and the field otherwise (a string "banana" for d_model would fail deep inside the
    model's construction)."""
    import inspect

    kinds = {"int": int, "float": float, "bool": bool}
    for name, param in inspect.signature(LLaDAConfig.__init__).parameters.items():
        kind = kinds.get(str(param.annotation).split(" |")[0])
        if kind is None or name not in data or (data[name] is None and "None" in str(param.annotation)):
            continue
        value, default = data[name], param.default
        ok = (isinstance(value, bool) if kind is bool else
              isinstance(value, int) and not isinstance(value, bool) if kind is int else
              isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok:
            raise CheckpointError(f"{cfg_file}: field {name!r} is {value!r} ({type(value).__name__}); it must be "
                                  f"{'a number' if kind is float else 'an integer' if kind is int else 'true/false'}"
                                  f" (LLaDA-8B: {default!r}).")


def read_llada_config(path: str | os.PathLike) -> LLaDAConfig:
    """Parse `path/config.json` into an LLaDAConfig, naming the field that is wrong."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file} not found: point --model at a LLaDA checkpoint directory.")
    data = read_json_object(cfg_file, CheckpointError)
    model_type = data.get("model_type")
    if model_type != "llada":
        raise CheckpointError(f"{cfg_file}: model_type is {model_type!r}, expected 'llada'. "
                              "Autoregressive models go through the Qwen backend.")
    if data.get("mask_token_id") is None:
        raise CheckpointError(f"{cfg_file}: missing field 'mask_token_id' (126336 for LLaDA-8B); add it.")
    _check_field_types(data, cfg_file)
    fill_token_ids(data, path, OPTIONAL_TOKEN_IDS)  # never LLaDAConfig's LLaDA-8B defaults: out of range elsewhere
    config = LLaDAConfig.from_dict(data)
    return checked_config(config, cfg_file, ("eos_token_id", "pad_token_id", *OPTIONAL_TOKEN_IDS),
                          config.embedding_size, f"the embedding ({config.embedding_size} rows)")


def check_llada_source(path: str | os.PathLike) -> None:
    """The family's source check, before anything is written: config.json parsed and checked, and every tensor's name
    and shape in the safetensors headers against what it implies (no tensor read)."""
    config = read_llada_config(path)
    check_model_files(LLaDAModelLM, config, Path(path), f"a LLaDA model with {config.n_layers} layers")


def load_llada(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
               device: str | torch.device = "cpu") -> LLaDAModelLM:
    """Load an official-layout LLaDA directory into LLaDAModelLM (eval mode), checking every tensor."""
    config = read_llada_config(path)
    return load_checked_model(LLaDAModelLM, config, Path(path), dtype, device,
                              f"a LLaDA model with {config.n_layers} layers")
