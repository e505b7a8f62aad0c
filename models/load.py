"""Build a (model, tokenizer) pair from a ModelConfig: a family's tiny built-in model or a checkpoint directory;
`detect_family` reads which family a checkpoint directory holds from its config.json."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dllm_ais.config import ModelConfig

from .hub import resolve_checkpoint_dir
from .tiny import tiny_tokenizer


def detect_family(directory: str | Path) -> str:
    """The model family (a key of dllm_ais/families.py's registry) of a checkpoint directory, from config.json's
    `model_type`, then `architectures`; an unknown one is refused in one line."""
    from dllm_ais.families import FAMILIES, family_of_config

    cfg_file = Path(directory) / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file} not found: --model must be a checkpoint directory with a config.json.")
    data = json.loads(cfg_file.read_text())
    family = family_of_config(data)
    if family is None:
        known = sorted({t for f in FAMILIES.values() for t in f.model_types})
        raise ValueError(f"{cfg_file}: unknown model family (model_type {data.get('model_type')!r}, architectures "
                         f"{data.get('architectures') or []}); supported model_type: {', '.join(known)}.")
    return family.name


def load_model_and_tokenizer(cfg: ModelConfig):
    """A diffusion family's load hook: the BF16 (or cfg.dtype) model on cfg.device in eval mode — the family's tiny
    built-in model when cfg.path is None, else its checkpoint reader's — and its tokenizer (left padding). A
    checkpoint whose config.json names another family than cfg.family is refused in one line."""
    from dllm_ais.families import get_family

    family = get_family(cfg.family)
    dtype = getattr(torch, cfg.dtype)
    if cfg.path is None:
        return family.tiny(seed=cfg.seed, dtype=dtype).to(cfg.device), tiny_tokenizer()
    ckpt = resolve_checkpoint_dir(cfg.path)
    found = detect_family(ckpt)
    if found != cfg.family:
        raise ValueError(f"--model {cfg.path}: config.json holds a {found!r} model but the preset's family is "
                         f"{cfg.family!r}; pick a {found} preset.")
    model = family.load_dir(ckpt, dtype=dtype, device=cfg.device)
    tokenizer = load_tokenizer(ckpt, model.config)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = model.config.pad_token_id
    fill_token_ids_from_tokenizer(model.config, tokenizer)
    return model, tokenizer


REMOTE_QWEN2_TOKENIZERS = ("DreamTokenizer",)
"""tokenizer_config.json classes that live in a hub repo's remote code but are Qwen2's byte-level BPE renamed (Dream's
tokenization_dream.py: Qwen2Tokenizer's vocab.json / merges.txt, pre-tokenisation regex and NFC normalisation):
loaded with transformers' Qwen2Tokenizer, never with remote code."""


def load_tokenizer(directory: str | Path, config=None):
    """AutoTokenizer of a checkpoint directory. `config` (the loaded model's) is handed to transformers: without it,
    AutoTokenizer re-reads config.json, does not know model_type "llada", and warns "You are using a model of type
    llada to instantiate a model of type ``" on every load. A Dream directory's DreamTokenizer (remote code) is read
    as the Qwen2Tokenizer it is (REMOTE_QWEN2_TOKENIZERS)."""
    from transformers import AutoTokenizer

    tok_cfg = Path(directory) / "tokenizer_config.json"
    if tok_cfg.is_file() and json.loads(tok_cfg.read_text()).get("tokenizer_class") in REMOTE_QWEN2_TOKENIZERS:
        from transformers import Qwen2Tokenizer

        return Qwen2Tokenizer.from_pretrained(str(directory))
    extra = {} if config is None else {"config": config}
    return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False, **extra)


EOT_TOKEN = "<|eot_id|>"
"""LLaDA's end-of-turn token; its id is looked up in the tokenizer when config.json has no eot_token_id."""
EOT_TOKENS = (EOT_TOKEN, "<|im_end|>")
"""End-of-turn tokens looked up in this order: LLaDA's, then Qwen's chat template's (Dream-7B's)."""


def fill_token_ids_from_tokenizer(config, tokenizer) -> None:
    """Set config.bos_token_id / eot_token_id from the tokenizer where config.json and generation_config.json had
    none (LLaDA-8B's ids are never assumed). An id the tokenizer lacks stays None: no BOS, EOS is the only stop."""
    size = config.embedding_size
    if getattr(config, "bos_token_id", None) is None:
        bos = getattr(tokenizer, "bos_token_id", None)
        config.bos_token_id = bos if isinstance(bos, int) and 0 <= bos < size else None
    if getattr(config, "eot_token_id", None) is None:
        vocab = tokenizer.get_vocab()
        eot = next((vocab[t] for t in EOT_TOKENS if t in vocab), None)
        config.eot_token_id = eot if isinstance(eot, int) and 0 <= eot < size else None


def stop_token_ids(model) -> tuple[int, ...]:
    """Tokens that end a completion: EOS and, where the config names one, end-of-turn."""
    ids = (model.config.eos_token_id, getattr(model.config, "eot_token_id", None))
    return tuple(i for i in ids if i is not None)


def encode_prompts(tokenizer, prompts: list[str], chat: bool = True, device: str | torch.device = "cpu",
                   assistant_prefix: str = ""):
    """Left-padded prompt ids and mask [B, P]; wraps each prompt in the chat template when the tokenizer has one.

    assistant_prefix: text appended after the template's generation prompt (d1 opens the answer with "<reasoning>").
    """
    if not prompts:
        raise ValueError("no prompts given.")
    if chat and getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                               tokenize=False) + assistant_prefix for p in prompts]
        enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    else:
        enc = tokenizer([p + assistant_prefix for p in prompts], add_special_tokens=False, padding=True,
                        return_tensors="pt")
    if tokenizer.padding_side != "left":
        raise ValueError("tokenizer.padding_side must be 'left' for diffusion sampling.")
    return enc["input_ids"].to(device), enc["attention_mask"].bool().to(device)
