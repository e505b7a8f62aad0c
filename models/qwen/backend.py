"""Qwen's trainer backend hook: the autoregressive backend (train/backend.py AutoregressiveBackend)."""

from __future__ import annotations

from dllm_ais.train.backend import AutoregressiveBackend


def build_backend(sampler, model, tokenizer, train=None) -> AutoregressiveBackend:
    """AutoregressiveBackend stopping at every EOS id the model's config and generation config name."""
    stops: list[int] = []
    for cfg in (model.config, getattr(model, "generation_config", None)):  # Qwen3 lists <|endoftext|> only in the
        eos = getattr(cfg, "eos_token_id", None)  # generation config
        for i in eos if isinstance(eos, (list, tuple)) else [eos]:
            if i is not None and i not in stops:
                stops.append(i)
    return AutoregressiveBackend(sampler, tuple(stops), pad_token_id=tokenizer.pad_token_id)
