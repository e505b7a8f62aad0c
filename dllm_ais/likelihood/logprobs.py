"""Per-token log-probabilities from logits without a full float32 copy of the [N, V] logits.

`token_logprobs` takes log-softmax + gather over chunks of positions: at most `chunk_size × V` float32 values exist at
once (the model's own logits, usually bf16, are not copied). Under autograd each chunk is checkpointed, so backward
keeps only the logits themselves, not a float32 log-softmax per chunk. Results equal the naive
`logits.float().log_softmax(-1).gather(-1, targets)` (same kernel, row by row).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

MAX_CHUNK_ELEMENTS = 2**25
"""Default float32 working-set budget per chunk (2^25 values = 128 MiB): chunk_size = max(1, budget // V)."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype the log-softmax is taken in: float32, or float64 for float64 models."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits [n, V], targets [n] -> [n] log softmax(logits / T)[target], in float32 (float64 for float64 input)."""
    x = logits.to(compute_dtype(logits.dtype))
    if temperature != 1.0:
        x = x / temperature
    return x.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


def _chunks(n: int, vocab: int, chunk_size: int | None) -> tuple[range, int]:
    size = chunk_size if chunk_size is not None else max(1, MAX_CHUNK_ELEMENTS // max(vocab, 1))
    if size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1.")
    return range(0, n, size), size


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, chunk_size: int | None = None,
                   temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[targets] per position, chunked over positions.

    logits [..., V] (any float dtype), targets [...] long -> [...] float32 (float64 for float64 logits).
    chunk_size: positions per chunk (default: MAX_CHUNK_ELEMENTS // V).
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree: logits must be "
                         "targets.shape + (V,).")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0.")
    V = logits.shape[-1]
    flat, tgt = logits.reshape(-1, V), targets.reshape(-1)  # [N, V], [N]
    starts, size = _chunks(flat.shape[0], V, chunk_size)
    use_ckpt = torch.is_grad_enabled() and flat.requires_grad
    parts = []
    for s in starts:
        args = (flat[s:s + size], tgt[s:s + size], temperature)
        parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if use_ckpt else _chunk_logprobs(*args))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=compute_dtype(flat.dtype))
    return out.view(targets.shape)


def _head_chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, lm_head: Callable, temperature: float):
    return _chunk_logprobs(lm_head(hidden), targets, temperature)


def hidden_token_logprobs(hidden: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor],
                          targets: torch.Tensor, *, vocab_size: int, chunk_size: int | None = None,
                          temperature: float = 1.0) -> torch.Tensor:
    """Like `token_logprobs(lm_head(hidden), targets)` but the full logits never exist: lm_head runs per chunk.

    hidden [..., d], targets [...] -> [...]. Under autograd each chunk is checkpointed (backward recomputes its logits).
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree.")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0.")
    flat, tgt = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)  # [N, d], [N]
    starts, size = _chunks(flat.shape[0], vocab_size, chunk_size)
    use_ckpt = torch.is_grad_enabled()
    parts = []
    for s in starts:
        args = (flat[s:s + size], tgt[s:s + size], lm_head, temperature)
        parts.append(checkpoint(_head_chunk_logprobs, *args, use_reentrant=False) if use_ckpt
                     else _head_chunk_logprobs(*args))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=compute_dtype(flat.dtype))
    return out.view(targets.shape)


def proposal_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float,
                      mask_token_id: int) -> torch.Tensor:
    """log μ(token) under the masked-diffusion sampler's proposal: softmax(logits / T) over the vocabulary with the
    mask token removed (the sampler never proposes it). T = 0 (greedy) has no density of its own: the untempered
    softmax (T = 1) is used, and estimators that need a density refuse T = 0.

    logits [..., V] (any float dtype), tokens [...] long -> [...] float32 (float64 for float64 logits). Used both to
    record log μ while sampling and to replay the same canvases under π_old, so the two sides match by construction.
    """
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree: logits must be "
                         "tokens.shape + (V,).")
    x = logits.to(compute_dtype(logits.dtype))
    if temperature > 0 and temperature != 1.0:
        x = x / temperature
    x = x.index_fill(-1, torch.tensor([mask_token_id], device=x.device), -torch.inf)  # [..., V], a copy
    return x.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(x, dim=-1)
