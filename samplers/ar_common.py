"""What both autoregressive samplers share: the sampling settings, the distribution sampled from (`sampling_logprobs`,
see samplers/autoregressive.py's module doc for its definition), exact Gumbel-max draws and the prompt checks.

samplers/autoregressive.py (the generic KV-cache loop) and samplers/ar_static.py (the static-cache, graph-captured
engine) both import from here, so neither imports the other at module level.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ARSamplerConfig:
    """Autoregressive sampling settings (TRL/transformers names)."""

    max_new_tokens: int = 32
    """Completion length L: tokens generated per prompt (rows that stop earlier are padded and masked out)."""
    temperature: float = 1.0
    """Softmax temperature T (logits / T, float64); 0 = greedy argmax."""
    top_k: int = 0
    """Keep only tokens whose logit is >= the k-th largest (ties kept) before sampling; 0 = off. Needs T > 0."""
    top_p: float = 1.0
    """Nucleus sampling: keep the most likely tokens until their mass reaches top_p, in (0, 1]; 1 = off. Needs T > 0."""

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1.")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy).")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off).")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 = off).")
        if self.temperature == 0 and (self.top_k or self.top_p < 1):
            raise ValueError("temperature=0 is greedy decoding, where top_k/top_p do nothing: set top_k=0 and "
                             "top_p=1.0, or use temperature > 0.")


def sampling_logprobs(logits: torch.Tensor, config: ARSamplerConfig) -> torch.Tensor:
    """log π over the vocabulary: logits [..., V] -> [..., V] float64, −inf outside the kept set (see module doc)."""
    z = logits.to(torch.float64)
    if config.temperature == 0:
        return z.log_softmax(-1)
    z = z / config.temperature
    if config.top_k:
        kth = z.topk(min(config.top_k, z.shape[-1]), dim=-1).values[..., -1:]  # [..., 1]
        z = z.masked_fill(z < kth, -torch.inf)
    if config.top_p < 1:
        p_sorted, order = z.softmax(-1).sort(dim=-1, descending=True, stable=True)  # [..., V]
        mass_before = p_sorted.cumsum(-1) - p_sorted  # mass of strictly more likely tokens
        drop_sorted = mass_before >= config.top_p  # the first token has mass_before 0 < top_p: always kept
        z = z.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -torch.inf)
    return z.log_softmax(-1)


def gumbel_argmax(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Gumbel-max: log π [B, V] and uniforms u [B, V] (float64) -> [B] tokens, an exact draw from π."""
    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))
    return (logp + gumbel).argmax(-1)  # −inf entries are never chosen


def sample_tokens(logp: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from log π [B, V] (float64): argmax when greedy, else Gumbel-max (exact sampling from π)."""
    if greedy:
        return logp.argmax(-1)
    return gumbel_argmax(logp, torch.rand(logp.shape, generator=generator, device=logp.device, dtype=torch.float64))


def check_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
    if prompt_ids.dim() != 2 or prompt_ids.shape != prompt_mask.shape:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be "
                         "equal [B, P] shapes.")
    if prompt_ids.shape[1] == 0 or not prompt_mask.bool().any(-1).all():
        raise ValueError("every row needs at least one real prompt token (e.g. BOS): the first new token is "
                         "predicted from the last prompt position.")
    if prompt_mask.bool()[:, -1].logical_not().any():
        raise ValueError("prompts must be LEFT-padded (prompt_mask True at the last position of every row); set "
                         "tokenizer.padding_side = 'left'.")
