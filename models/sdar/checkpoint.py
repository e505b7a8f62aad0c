"""Read SDAR checkpoint directories in the official hub layout (JetAstra/SDAR `training/model/SDAR-*-Chat/`), no
remote code.

A directory holds `config.json` (model_type "sdar", `auto_map` to the hub's modeling_sdar.py, never run here),
`model.safetensors` or shards with `model.safetensors.index.json` (names: `model.embed_tokens.weight`,
`model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `…self_attn.{q,k}_norm.weight`, `…mlp.{gate,up,down}_proj.weight`,
`…{input,post_attention}_layernorm.weight`, `model.norm.weight`, `lm_head.weight` unless tied), tokenizer files and
generation_config.json. Every tensor is checked by name and shape before anything is assigned
(models/checkpoint.py). Saving is models/checkpoint.py's `save_model` (architectures ["SDARForCausalLM"]).

The mask token: config.json's `mask_token_id` (151669, `<|MASK|>`, in the released checkpoints); where config.json
has none, the id tokenizer_config.json gives its `mask_token` (generate.py:270-271 reads it from the tokenizer); a
checkpoint with neither is refused in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dllm_ais.models.checkpoint import (
    CheckpointError,
    _read_json,
    check_model_files,
    checked_config,
    fill_token_ids,
    load_checked_model,
)
from dllm_ais.models.hub import read_json_object
from dllm_ais.models.sdar.model import SDARConfig, SDARModel

SDAR_MODEL_TYPES = ("sdar",)
"""config.json `model_type` values of an SDAR (or TraDo) checkpoint."""


def tokenizer_mask_id(path: str | os.PathLike) -> int | None:
    """The id tokenizer_config.json gives its `mask_token` (through `added_tokens_decoder`), or None."""
    data = _read_json(Path(path) / "tokenizer_config.json")
    token = data.get("mask_token")
    if isinstance(token, dict):
        token = token.get("content")
    decoder = data.get("added_tokens_decoder") or {}
    for key, entry in decoder.items():
        if isinstance(entry, dict) and token is not None and entry.get("content") == token and key.isdigit():
            return int(key)
    return None


def read_sdar_config(path: str | os.PathLike) -> SDARConfig:
    """Parse `path/config.json` into an SDARConfig, naming the field that is wrong (the mask token included)."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file} not found: point --model at an SDAR checkpoint directory.")
    data = read_json_object(cfg_file, CheckpointError)
    if data.get("model_type") not in SDAR_MODEL_TYPES:
        raise CheckpointError(f"{cfg_file}: model_type is {data.get('model_type')!r}, expected 'sdar'.")
    if data.get("mask_token_id") is None:
        data["mask_token_id"] = tokenizer_mask_id(path)
        if data["mask_token_id"] is None:
            raise CheckpointError(f"{cfg_file}: no mask token — config.json has no 'mask_token_id' and "
                                  "tokenizer_config.json no mask_token; add mask_token_id (SDAR's <|MASK|>, 151669).")
    token_keys = ("eos_token_id", "bos_token_id", "pad_token_id")
    fill_token_ids(data, path, token_keys)
    config = SDARConfig.from_dict(data)
    return checked_config(config, cfg_file, (*token_keys, "mask_token_id"), config.vocab_size,
                          f"the vocabulary ({config.vocab_size})")


def check_sdar_source(path: str | os.PathLike) -> None:
    """The family's source check, before anything is written: config.json parsed and checked (mask token, block
    size …), and every tensor's name and shape in the safetensors headers against what it implies (no tensor read)."""
    config = read_sdar_config(path)
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else None
    check_model_files(SDARModel, config, Path(path), f"an SDAR model with {config.num_hidden_layers} layers", tied)


def load_sdar(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
              device: str | torch.device = "cpu") -> SDARModel:
    """Load an official-layout SDAR directory into SDARModel (eval mode), checking every tensor."""
    path = Path(path)
    config = read_sdar_config(path)
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else None
    return load_checked_model(SDARModel, config, path, dtype, device,
                              f"an SDAR model with {config.num_hidden_layers} layers", tied=tied)
