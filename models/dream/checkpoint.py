"""Read Dream checkpoint directories in the official hub layout (Dream-org/Dream-v0-Instruct-7B), no remote code.

A directory holds `config.json` (model_type "Dream", `auto_map` pointing at the hub's remote code, which is never
run), `model.safetensors` or sharded `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`, and
tokenizer files. Every tensor is checked by name and shape before anything is assigned. Saving goes through
`checkpoint.save_checkpoint` (it writes either family; architectures ["DreamModel"], so the hub code still opens it).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dllm_ais.families import FAMILIES  # noqa: F401  (the registry first: it imports models/dream/family.py)
from dllm_ais.models.checkpoint import (
    CheckpointError,
    _read_json,
    check_model_files,
    checked_config,
    fill_token_ids,
    load_checked_model,
)
from dllm_ais.models.dream.family import ALGORITHMS
from dllm_ais.models.dream.model import DreamConfig, DreamModel
from dllm_ais.models.hub import read_json_object

DREAM_MODEL_TYPES = ("Dream", "dream")
"""config.json `model_type` values of a Dream checkpoint (the official one is "Dream")."""
DREAM_ALGORITHMS = ALGORITHMS
"""Dream's `alg` values (generation_utils.py `sample_tokens`; the registry record's, models/dream/family.py)."""
SAMPLING_KEYS = ("alg", "alg_temp", "top_p", "top_k")
"""Dream generation settings a checkpoint's generation_config.json may fix (DreamGenerationConfig's names)."""


def read_dream_sampling(path: str | os.PathLike) -> dict:
    """The Dream sampling settings `path/generation_config.json` sets ({} when none), checked: an unknown `alg` or
    `alg_temp` < 0 is refused in one line (CheckpointError), before anything is loaded or written."""
    gen_file = Path(path) / "generation_config.json"
    data = _read_json(gen_file)
    found = {k: data[k] for k in SAMPLING_KEYS if data.get(k) is not None}
    if "alg" in found and found["alg"] not in DREAM_ALGORITHMS:
        raise CheckpointError(f"{gen_file}: alg={found['alg']!r} is not a Dream algorithm; set it to one of "
                              f"{', '.join(DREAM_ALGORITHMS)}.")
    if "alg_temp" in found and not (isinstance(found["alg_temp"], (int, float)) and found["alg_temp"] >= 0):
        raise CheckpointError(f"{gen_file}: alg_temp={found['alg_temp']!r} must be a number >= 0 (0 = the most "
                              "confident positions); fix it.")
    return found


def read_dream_config(path: str | os.PathLike) -> DreamConfig:
    """Parse `path/config.json` into a DreamConfig, naming the field that is wrong."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file} not found: point --model at a Dream checkpoint directory.")
    data = read_json_object(cfg_file, CheckpointError)
    if data.get("model_type") not in DREAM_MODEL_TYPES:
        raise CheckpointError(f"{cfg_file}: model_type is {data.get('model_type')!r}, expected 'Dream'.")
    if data.get("mask_token_id") is None:
        raise CheckpointError(f"{cfg_file}: missing field 'mask_token_id' (151666 for Dream-7B); add it.")
    token_keys = ("eos_token_id", "bos_token_id", "pad_token_id")
    fill_token_ids(data, path, token_keys)  # never Dream-7B's defaults for another vocab
    config = DreamConfig.from_dict(data)
    return checked_config(config, cfg_file, token_keys, config.vocab_size, f"the vocabulary ({config.vocab_size})")


def check_dream_source(path: str | os.PathLike) -> None:
    """The family's source check, before anything is written: config.json (mask_token_id …) and
    generation_config.json's sampling settings (alg, alg_temp) parsed and checked, and every tensor's name and shape
    in the safetensors headers against what config.json implies (no tensor read)."""
    config = read_dream_config(path)
    read_dream_sampling(path)
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else None
    check_model_files(DreamModel, config, Path(path), f"a Dream model with {config.num_hidden_layers} layers", tied)


def load_dream(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
               device: str | torch.device = "cpu") -> DreamModel:
    """Load an official-layout Dream directory into DreamModel (eval mode), checking every tensor."""
    path = Path(path)
    config = read_dream_config(path)
    sampling = read_dream_sampling(path)  # refused before any tensor is read
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else None
    model = load_checked_model(DreamModel, config, path, dtype, device,
                               f"a Dream model with {config.num_hidden_layers} layers", tied=tied)
    model.sampling_defaults = sampling  # the checkpoint's alg / alg_temp / top_p / top_k (models/dream/backend.py)
    return model
