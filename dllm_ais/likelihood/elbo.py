"""Monte-Carlo ELBO of log p(y | x) for a masked diffusion model (LLaDA `get_log_likelihood`).

    ELBO_i = E_draw[ w · Σ_{j masked} log p_θ(y_j | x, y with the draw's positions masked) ]

with the draws of `masks.py` (mask-count: w = L_i/l; uniform-t: w = 1/t; same expectation, derivation there).
The prompt is never masked; left padding of the prompt is never attended to. Only counted completion tokens
(completion_mask) are masked and scored; the other completion positions (the EOS tail after the first stop token)
stay visible as themselves by default, following LLaDA's SFT convention of keeping EOS padding as real tokens —
then the estimate bounds log p(y_counted | x, y_tail). With mask_tail=True they are masked (never scored) instead,
which bounds the marginal log p(y_counted | x) as the sampler's blank canvas would.

Cost: one forward row (one sequence of length P + L through the model) per sequence and draw with a non-empty
mask; rows are batched `batch_size` at a time and only the masked positions go through the LM head.
A sequence with no counted token has ELBO exactly 0 (the log-likelihood of nothing) and costs no row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_ais.likelihood.inputs import (
    as_generator,
    canvas,
    check_num_draws,
    check_sequences,
    mask_token_id_of,
    max_length_of,
)
from dllm_ais.likelihood.logprobs import token_logprobs
from dllm_ais.likelihood.masks import MaskDraws, draw_masks
from dllm_ais.models.shift import logits_view

DEFAULT_BATCH_SIZE = 64
"""Forward rows per model call unless told otherwise; lower it for 8B models at long lengths."""


@dataclass(frozen=True)
class ELBOEstimate:
    """A Monte-Carlo ELBO estimate with its per-draw terms."""

    estimate: torch.Tensor
    """[B] float64: mean of per_draw over the K draws (0 for a sequence with no counted token)."""
    per_draw: torch.Tensor
    """[B, K] float64: weight · Σ_masked log p for each draw (unbiased on its own)."""
    num_rows: int
    """Forward rows run (sequence × draw pairs with a non-empty mask)."""


def masked_logprob_sums(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor, mask: torch.Tensor, *, mask_token_id: int,
                        batch_size: int = DEFAULT_BATCH_SIZE, mask_tail: bool = False) -> tuple[torch.Tensor, int]:
    """Σ_{j: mask} log p(y_j | masked input) per (sequence, draw) -> ([B, K] float32/64, rows run).

    model(input_ids [n, T], attention_mask [n, T], positions LongTensor [n, M]).logits -> [n, M, V] (LLaDA
    signature); a shifted-logit family (Dream) is read through `logits_view`, so position j is scored with the raw
    logits of j − 1. mask [B, K, L] bool over the completion. Rows with an empty mask are skipped.
    """
    model = logits_view(model)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1.")
    B, K, L = mask.shape
    P = prompt_ids.shape[1]
    x, attn = canvas(prompt_ids, prompt_mask, completion_ids, completion_mask, mask_token_id, mask_tail)  # [B, T]
    flat = mask.reshape(B * K, L)  # [N, L], row r = (sequence r // K, draw r % K)
    active = flat.any(-1).nonzero().squeeze(-1)  # [A] rows that score at least one token
    parts = []
    for s in range(0, active.numel(), batch_size):
        rows = active[s:s + batch_size]  # [n]
        seq, m = rows // K, flat[rows]  # [n], [n, L]
        inp = x[seq]  # [n, T] (a copy: advanced indexing)
        inp[:, P:] = torch.where(m, mask_token_id, inp[:, P:])
        counts = m.sum(-1)  # [n]
        M = int(counts.max())
        pos = m.long().argsort(dim=-1, descending=True, stable=True)[:, :M]  # [n, M] masked positions first
        valid = torch.arange(M, device=m.device)[None, :] < counts[:, None]  # [n, M]
        logits = model(input_ids=inp, attention_mask=attn[seq], positions=pos + P).logits  # [n, M, V]
        lp = token_logprobs(logits, completion_ids[seq].gather(1, pos))  # [n, M]
        parts.append(lp.masked_fill(~valid, 0.0).sum(-1))  # [n]
    dtype = parts[0].dtype if parts else torch.float32
    sums = torch.zeros(B * K, dtype=dtype, device=mask.device)
    if parts:
        sums = sums.index_put((active,), torch.cat(parts))
    return sums.view(B, K), int(active.numel())


def elbo_from_draws(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                    completion_mask: torch.Tensor, draws: MaskDraws, *, mask_token_id: int | None = None,
                    batch_size: int = DEFAULT_BATCH_SIZE, mask_tail: bool = False) -> ELBOEstimate:
    """The ELBO estimate of `model` on given draws (so several models can share them)."""
    check_sequences(prompt_ids, prompt_mask, completion_ids, completion_mask, max_length_of(model))
    if draws.mask.shape[0] != completion_ids.shape[0] or draws.mask.shape[2] != completion_ids.shape[1]:
        raise ValueError(f"draws.mask {tuple(draws.mask.shape)} must be [B, K, L] for completions "
                         f"{tuple(completion_ids.shape)}.")
    if (draws.mask & ~completion_mask.bool()[:, None, :]).any():
        raise ValueError("draws.mask masks positions outside completion_mask; draw it from the same completion_mask.")
    sums, rows = masked_logprob_sums(model, prompt_ids, prompt_mask, completion_ids, completion_mask, draws.mask,
                                     mask_token_id=mask_token_id_of(model, mask_token_id=mask_token_id),
                                     batch_size=batch_size, mask_tail=mask_tail)
    per_draw = sums.double() * draws.weight  # [B, K]
    return ELBOEstimate(estimate=per_draw.mean(-1), per_draw=per_draw, num_rows=rows)


def elbo(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
         completion_mask: torch.Tensor, *, num_draws: int, generator: torch.Generator | int,
         scheme: str = "mask_count", stratified: bool = True, antithetic: bool = False,
         mask_token_id: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE, mask_tail: bool = False
         ) -> ELBOEstimate:
    """Monte-Carlo ELBO of log p(completion | prompt) with K = num_draws mask draws per sequence.

    prompt_ids/prompt_mask [B, P] (left-padded), completion_ids/completion_mask [B, L]. scheme, stratified and
    antithetic choose the draws (see `draw_masks`); generator: torch.Generator or int seed (global RNG untouched).
    mask_token_id defaults to model.config.mask_token_id. Gradients flow when called under grad mode.
    """
    check_num_draws(num_draws, antithetic)
    check_sequences(prompt_ids, prompt_mask, completion_ids, completion_mask, max_length_of(model))
    draws = draw_masks(completion_mask, num_draws, as_generator(generator), scheme=scheme, stratified=stratified,
                       antithetic=antithetic)
    return elbo_from_draws(model, prompt_ids, prompt_mask, completion_ids, completion_mask, draws,
                           mask_token_id=mask_token_id, batch_size=batch_size, mask_tail=mask_tail)
