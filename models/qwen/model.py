"""Qwen2/Qwen3 causal LMs through transformers: load a checkpoint directory, build a tiny random one, save atomically.

The autoregressive backend uses the stock `transformers` classes (no remote code): `load_qwen` refuses any directory
whose config.json `model_type` is not qwen2/qwen3 before transformers reads a tensor. `tiny_qwen` is a 2-layer Qwen3
(about 0.1M parameters) over `dllm_ais.models.tiny.tiny_tokenizer()` (char-level, 101 tokens, pad/EOS id 1), with
weights drawn from an explicit `torch.Generator`, never the global RNG; built on the meta device, then materialised.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from dllm_ais.atomic import atomic_dir
from dllm_ais.models.hub import read_json_object, resolve_checkpoint_dir
from dllm_ais.models.tiny import BOS, PAD_EOS, tiny_tokenizer, tiny_vocab

QWEN_MODEL_TYPES = ("qwen2", "qwen3")


class QwenCheckpointError(ValueError):
    """A directory that is not a loadable Qwen2/Qwen3 checkpoint; the message names the file and field."""


def read_model_type(path: str | os.PathLike) -> str:
    """`model_type` of `path/config.json`, which must be qwen2 or qwen3."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise QwenCheckpointError(f"{cfg_file} not found: point at a Qwen2/Qwen3 checkpoint directory.")
    model_type = read_json_object(cfg_file, QwenCheckpointError).get("model_type")
    if model_type not in QWEN_MODEL_TYPES:
        hint = " LLaDA checkpoints go through dllm_ais.models.checkpoint.load_llada." if model_type == "llada" else ""
        raise QwenCheckpointError(f"{cfg_file}: field 'model_type' is {model_type!r}; the Qwen backend loads "
                                  f"{' or '.join(map(repr, QWEN_MODEL_TYPES))} only.{hint}")
    return model_type


def load_qwen(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
              device: str | torch.device = "cpu") -> nn.Module:
    """A Qwen2/Qwen3 *ForCausalLM from a local directory (or a hub id, fetched once), in eval mode on `device`.

    Loads with `local_files_only=True` and `trust_remote_code=False`: nothing is executed from the directory.
    """
    from transformers import AutoModelForCausalLM

    ckpt = resolve_checkpoint_dir(str(path))
    read_model_type(ckpt)
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype, trust_remote_code=False,
                                                 local_files_only=True)
    return model.to(device).eval()


def load_qwen_tokenizer(path: str | os.PathLike):
    """The checkpoint's tokenizer with left padding (pad = EOS when the tokenizer names no pad token)."""
    from transformers import AutoTokenizer

    ckpt = resolve_checkpoint_dir(str(path))
    tokenizer = AutoTokenizer.from_pretrained(str(ckpt), trust_remote_code=False, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tiny_qwen_config(**overrides):
    """A 2-layer Qwen3Config (hidden 64, 4 heads of 16, 2 KV heads, MLP 128, vocab 128) matching `tiny_tokenizer()`.

    Every linear layer has in/out features that are multiples of 16, so `quantize_model` can make an FP8 copy.
    """
    from transformers import Qwen3Config

    vocab = tiny_vocab()
    fields = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        pad_token_id=vocab[PAD_EOS], eos_token_id=vocab[PAD_EOS], bos_token_id=vocab[BOS],
    )
    fields.update(overrides)
    return Qwen3Config(**fields)


def init_qwen_weights(model: nn.Module, generator: torch.Generator, std: float = 0.02) -> nn.Module:
    """Draw every Linear/Embedding weight ~ N(0, std²) from `generator` (biases 0), norms = 1, and recompute the RoPE
    inverse frequencies (buffers that `to_empty` leaves uninitialised). Draws on the generator's device."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                w = torch.empty(module.weight.shape, dtype=torch.float32, device=generator.device)
                module.weight.copy_(w.normal_(0.0, std, generator=generator))
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif "RMSNorm" in type(module).__name__:
                module.weight.fill_(1.0)
            elif hasattr(module, "inv_freq") and hasattr(module, "config"):  # *RotaryEmbedding
                fresh = type(module)(module.config)
                module.inv_freq.copy_(fresh.inv_freq)
                if hasattr(module, "original_inv_freq"):
                    module.original_inv_freq.copy_(fresh.original_inv_freq)
    return model


def random_qwen(config, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> nn.Module:
    """A Qwen*ForCausalLM for `config` with random weights: built on meta, materialised on `device`, drawn from
    `torch.Generator(device).manual_seed(seed)` (the same seed gives different draws on CPU and CUDA)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = model.to_empty(device=device)
    init_qwen_weights(model, torch.Generator(device=device).manual_seed(seed))
    if getattr(config, "tie_word_embeddings", False):  # to_empty unties them: the head shares the embedding again
        model.tie_weights()
    return model.eval()


def tiny_qwen(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> nn.Module:
    """A tiny Qwen3ForCausalLM on CPU in eval mode; `overrides` go to `tiny_qwen_config`."""
    return random_qwen(tiny_qwen_config(**overrides), seed=seed, dtype=dtype, device="cpu")


def tiny_qwen_tokenizer():
    """The tiny char-level tokenizer (ids: pad/EOS 1, BOS 2; left padding) shared with the tiny LLaDA."""
    return tiny_tokenizer()


def save_qwen(model: nn.Module, tokenizer, path: str | os.PathLike) -> Path:
    """Write `model` (safetensors, via save_pretrained) and `tokenizer` (if given) to `path`, atomically: everything
    goes to a temporary sibling directory first; an existing `path` is replaced only once the write succeeded."""
    path = Path(path)
    with atomic_dir(path) as tmp:
        model.save_pretrained(str(tmp))
        if not any(tmp.glob("*.safetensors")):
            raise RuntimeError(f"save_pretrained wrote no .safetensors file into {tmp}")
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    return path


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every block linear of a Qwen2 / Qwen3 decoder layer (transformers' names)."""


def lora_targets() -> list[str]:
    """peft `target_modules` for a Qwen model: every block linear."""
    return list(LORA_TARGETS)


def load_family(cfg):
    """The family's load hook: (model on cfg.device in eval mode, tokenizer) — the tiny built-in Qwen when cfg.path is
    None, else a checkpoint directory or hub id."""
    dtype = getattr(torch, cfg.dtype)
    if cfg.path is None:
        return tiny_qwen(seed=cfg.seed, dtype=dtype).to(cfg.device), tiny_qwen_tokenizer()
    path = resolve_checkpoint_dir(cfg.path)
    return load_qwen(path, dtype=dtype, device=cfg.device), load_qwen_tokenizer(path)


def check_source(path: str | os.PathLike) -> None:
    """The family's source check: a Qwen directory needs its config.json (transformers reads the rest)."""
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"--model {path}: no config.json, so not a checkpoint directory.")
