"""A tiny SDAR on the tiny character tokenizer (models/tiny.py), built offline from an explicit generator."""

from __future__ import annotations

import torch
from torch import nn

from dllm_ais.models.sdar.model import SDARConfig, SDARModel, SDARRMSNorm
from dllm_ais.models.tiny import BOS, EOT, MASK, PAD_EOS, tiny_vocab


def tiny_sdar_config(**overrides) -> SDARConfig:
    """A 2-layer, hidden 64 SDAR (4 query heads, 2 KV heads, head_dim 32 — Qwen3's head_dim is its own field, here
    not hidden / heads — block_size 4; about 0.1M parameters) matching `tiny_tokenizer()`'s ids (mask 4, pad = EOS 1,
    BOS 2)."""
    vocab = tiny_vocab()
    fields = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, block_size=4, mask_token_id=vocab[MASK], eos_token_id=vocab[PAD_EOS],
        pad_token_id=vocab[PAD_EOS], bos_token_id=vocab[BOS],
    )
    fields.update(overrides)
    return SDARConfig(**fields)


def tiny_sdar_model(seed: int = 0, dtype: torch.dtype = torch.float32, std: float = 0.02, **overrides) -> SDARModel:
    """A tiny SDARModel with weights ~ N(0, std²) drawn from `torch.Generator().manual_seed(seed)` (norm scales 1);
    its `config.eot_token_id` is the tokenizer's <|eot_id|>. The family's `tiny` hook."""
    with torch.device("meta"):
        model = SDARModel(tiny_sdar_config(**overrides))
    model = model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.copy_(torch.empty(module.weight.shape).normal_(0.0, std, generator=gen))
            elif isinstance(module, SDARRMSNorm):
                module.weight.fill_(1.0)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.config.eot_token_id = tiny_vocab()[EOT]
    return model.to(dtype).eval()
