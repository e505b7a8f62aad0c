"""A tiny LLaDA and a character-level tokenizer, built offline and deterministically, for CPU runs and tests.

The tokenizer uses LLaDA's special-token strings so prompts and chat handling look like the real model's; ids are
small (mask 4, EOS/pad 1). It carries LLaDA-8B-Instruct's chat template (Llama-3 style headers, `CHAT_TEMPLATE`), so
a CPU run with a chat task goes through the same prompt path, and TRL's conversational reward calls, as the 8B model.
Weights are drawn from an explicit `torch.Generator`, never the global RNG.
"""

from __future__ import annotations

import string

import torch
from torch import nn

from .llada.model import LLaDAConfig, LLaDAModelLM, RMSNorm

PAD_EOS = "<|endoftext|>"
BOS = "<|startoftext|>"
EOT = "<|eot_id|>"
MASK = "<|mdm_mask|>"
UNK = "<|unk|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
SPECIAL_TOKENS = (UNK, PAD_EOS, BOS, EOT, MASK)  # ids 0..4
CHARS = string.printable[:95] + "\n"  # digits, letters, punctuation, space, newline
HEADER_TOKENS = (START_HEADER, END_HEADER)  # ids after the characters (101, 102): earlier ids are unchanged
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
"""LLaDA-8B-Instruct's chat template (its tokenizer_config.json), written as one loop: BOS, then per message
`<|start_header_id|>role<|end_header_id|>\n\n content <|eot_id|>`, then the assistant header when generating."""


def tiny_vocab() -> dict[str, int]:
    """Token -> id: the five special tokens, one token per character, then the two chat header tokens."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    for tok in HEADER_TOKENS:
        vocab[tok] = len(vocab)
    return vocab


def tiny_tokenizer():
    """A PreTrainedTokenizerFast over single characters (left padding, pad = EOS as in LLaDA) with LLaDA's chat
    template (`CHAT_TEMPLATE`; the header tokens are single tokens, so a wrapped prompt costs 23 more tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=tiny_vocab(), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([*SPECIAL_TOKENS, *HEADER_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token=UNK, pad_token=PAD_EOS, eos_token=PAD_EOS, bos_token=BOS,
        mask_token=MASK, additional_special_tokens=[EOT, *HEADER_TOKENS], padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def tiny_config(**overrides) -> LLaDAConfig:
    """A 2-layer, d_model 128 LLaDA (about 0.4M parameters) matching `tiny_tokenizer()`'s ids."""
    vocab = tiny_vocab()
    fields = dict(
        d_model=128, n_layers=2, n_heads=4, mlp_hidden_size=256, vocab_size=128, embedding_size=128,
        max_sequence_length=256, rope_theta=10000.0, mask_token_id=vocab[MASK], eos_token_id=vocab[PAD_EOS],
        pad_token_id=vocab[PAD_EOS], bos_token_id=vocab[BOS], eot_token_id=vocab[EOT],
    )
    fields.update(overrides)
    return LLaDAConfig(**fields)


def init_weights(model: nn.Module, generator: torch.Generator, std: float = 0.02) -> nn.Module:
    """Re-draw every Linear/Embedding weight ~ N(0, std²) from `generator`; RMSNorm weights = 1."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                w = torch.empty(module.weight.shape, dtype=torch.float32)
                w.normal_(0.0, std, generator=generator)
                module.weight.copy_(w)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
    return model


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> LLaDAModelLM:
    """A tiny LLaDA with weights drawn from `torch.Generator().manual_seed(seed)`."""
    with torch.device("meta"):
        model = LLaDAModelLM(tiny_config(**overrides))
    model = model.to_empty(device="cpu")
    init_weights(model, torch.Generator().manual_seed(seed))
    return model.to(dtype).eval()


def tiny_dream_config(**overrides):
    """A 2-layer, hidden 64 Dream (4 query heads, 2 KV heads, q/k/v biases; about 0.1M parameters) matching
    `tiny_tokenizer()`'s ids (mask 4, pad = EOS 1, as Dream-7B has pad = EOS)."""
    from .dream.model import DreamConfig

    vocab = tiny_vocab()
    fields = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, mask_token_id=vocab[MASK], eos_token_id=vocab[PAD_EOS],
        pad_token_id=vocab[PAD_EOS], bos_token_id=vocab[BOS],
    )
    fields.update(overrides)
    return DreamConfig(**fields)


def tiny_dream_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A tiny DreamModel with weights (and q/k/v biases, so they matter) drawn from
    `torch.Generator().manual_seed(seed)`; its `config.eot_token_id` is the tokenizer's <|eot_id|>."""
    from .dream.model import DreamModel, DreamRMSNorm

    with torch.device("meta"):
        model = DreamModel(tiny_dream_config(**overrides))
    model = model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.copy_(torch.empty(module.weight.shape).normal_(0.0, 0.02, generator=gen))
                if getattr(module, "bias", None) is not None:
                    module.bias.copy_(torch.empty(module.bias.shape).normal_(0.0, 0.02, generator=gen))
            elif isinstance(module, DreamRMSNorm):
                module.weight.fill_(1.0)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.config.eot_token_id = tiny_vocab()[EOT]
    return model.to(dtype).eval()
