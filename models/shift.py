"""Shifted-logit families (Dream): one view through which every likelihood sees the distribution of each position.

Dream's head at position i predicts token i + 1 (Qwen2's autoregressive head kept through diffusion training), so the
distribution of a masked position i is the raw logits of i − 1, and position 0 reuses its own (`shift_logits`). A
model that says so (`shifted_logits = True`, e.g. DreamModel and its FP8 copy) is seen by the likelihoods through
`ShiftedLogits`, which returns at every requested position p the raw logits of max(p − 1, 0) and forwards everything
else to the model; `logits_view(model)` applies it where needed and is a no-op for LLaDA (and idempotent).

With a KV cache, p indexes the window: window position 0 reuses its own logits, as Fast-dLLM's Dream cache does
(it shifts inside the window: `cat([logits[:, :1], logits[:, :-1]], 1)` over the window's logits).
"""

from __future__ import annotations

import torch


def shift_logits(logits: torch.Tensor) -> torch.Tensor:
    """Dream's shift: logits [B, T, V] -> [B, T, V] whose row i is the raw row i − 1 (row 0 keeps its own)."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def source_positions(positions: torch.Tensor | slice | None, length: int) -> torch.Tensor | slice | None:
    """The raw rows that predict `positions` of a length-`length` input: max(p − 1, 0). None stays None (the caller
    shifts the whole [B, T, V]); a slice becomes a slice where it can, else an index [1, P]."""
    if positions is None:
        return None
    if isinstance(positions, slice):
        start, stop, step = positions.indices(length)
        if step == 1 and start >= 1:
            return slice(start - 1, max(stop - 1, start - 1))
        return (torch.arange(start, stop, step) - 1).clamp(min=0)[None]
    return (positions - 1).clamp(min=0)


def _base(model):
    while hasattr(model, "module") and not hasattr(model, "config"):  # DDP-style wrappers
        model = model.module
    return model


def is_shifted(model) -> bool:
    """Whether `model` (or the model under DDP/peft wrappers) predicts position i from raw logits i − 1."""
    return bool(getattr(_base(model), "shifted_logits", False))


class ShiftedLogits:
    """A callable view of a shifted-logit model: `view(input_ids, attention_mask, positions, **kw).logits` are the
    per-position distributions (raw row max(p − 1, 0)); attribute access goes to the model (config, parameters …)."""

    is_shifted_view = True

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 positions: torch.Tensor | slice | None = None, **kwargs):
        source = source_positions(positions, input_ids.shape[1])
        if isinstance(source, torch.Tensor):
            source = source.to(input_ids.device).expand(input_ids.shape[0], -1)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, positions=source, **kwargs)
        if positions is None:
            out.logits = shift_logits(out.logits)
        return out

    forward = __call__

    def __getattr__(self, name: str):
        return getattr(self.__dict__["model"], name)


def logits_view(model):
    """`ShiftedLogits(model)` for a shifted-logit model not yet wrapped, else `model` itself."""
    if getattr(model, "is_shifted_view", False) or not is_shifted(model):
        return model
    return ShiftedLogits(model)
