"""Sequence log-ratio ℓ = ELBO_a − ELBO_b between two diffusion models (BF16 π_old vs its FP8 copy μ).

- coupled (default): both ELBOs on the SAME mask draws (common random numbers). The masking noise is shared and
  cancels in ℓ; what remains is the precision difference. Identical models give ℓ = 0 exactly.
- antithetic: coupled, with K/2 draws and their complements (see `masks.py` for the complement weights).
- independent: each model gets its own K draws (the naive estimator, for comparison).

Cost in forward rows: 2 models × K rows per sequence for all three (`num_rows` reports what actually ran).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_ais.likelihood.elbo import DEFAULT_BATCH_SIZE, ELBOEstimate, elbo_from_draws
from dllm_ais.likelihood.inputs import as_generator, check_num_draws, check_sequences, mask_token_id_of, max_length_of
from dllm_ais.likelihood.masks import draw_masks


@dataclass(frozen=True)
class LogRatioEstimate:
    """ℓ = ELBO_a − ELBO_b per sequence, with its parts."""

    log_ratio: torch.Tensor
    """[B] float64: elbo_a − elbo_b."""
    per_draw: torch.Tensor
    """[B, K] float64: per-draw difference (draw k of a minus draw k of b; for independent draws these pairs
    share nothing)."""
    elbo_a: torch.Tensor
    """[B] float64 ELBO estimate of model_a."""
    elbo_b: torch.Tensor
    """[B] float64 ELBO estimate of model_b."""
    num_rows: int
    """Forward rows run, both models together."""


def _combine(a: ELBOEstimate, b: ELBOEstimate) -> LogRatioEstimate:
    return LogRatioEstimate(log_ratio=a.estimate - b.estimate, per_draw=a.per_draw - b.per_draw, elbo_a=a.estimate,
                            elbo_b=b.estimate, num_rows=a.num_rows + b.num_rows)


def _prepare(model_a, model_b, prompt_ids, prompt_mask, completion_ids, completion_mask, num_draws, antithetic,
             mask_token_id):
    check_num_draws(num_draws, antithetic)
    check_sequences(prompt_ids, prompt_mask, completion_ids, completion_mask, max_length_of(model_a, model_b))
    return mask_token_id_of(model_a, model_b, mask_token_id=mask_token_id)


def coupled_log_ratio(model_a, model_b, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor, *, num_draws: int,
                      generator: torch.Generator | int, scheme: str = "mask_count", stratified: bool = True,
                      antithetic: bool = False, mask_token_id: int | None = None,
                      batch_size: int = DEFAULT_BATCH_SIZE, mask_tail: bool = False) -> LogRatioEstimate:
    """ℓ = ELBO_a − ELBO_b with both ELBOs on the same K draws (common random numbers).

    Inputs as `elbo`: prompt_ids/prompt_mask [B, P], completion_ids/completion_mask [B, L]. model_a/model_b: the
    same forward signature (LLaDAModelLM and its FP8 copy).
    """
    mid = _prepare(model_a, model_b, prompt_ids, prompt_mask, completion_ids, completion_mask, num_draws, antithetic,
                   mask_token_id)
    draws = draw_masks(completion_mask, num_draws, as_generator(generator), scheme=scheme, stratified=stratified,
                       antithetic=antithetic)
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask, draws)
    kw = dict(mask_token_id=mid, batch_size=batch_size, mask_tail=mask_tail)
    return _combine(elbo_from_draws(model_a, *args, **kw), elbo_from_draws(model_b, *args, **kw))


def antithetic_log_ratio(model_a, model_b, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         completion_ids: torch.Tensor, completion_mask: torch.Tensor, *, num_draws: int,
                         generator: torch.Generator | int, scheme: str = "mask_count", stratified: bool = True,
                         mask_token_id: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                         mask_tail: bool = False) -> LogRatioEstimate:
    """Coupled ℓ on K/2 draws and their complements (K even)."""
    return coupled_log_ratio(model_a, model_b, prompt_ids, prompt_mask, completion_ids, completion_mask,
                             num_draws=num_draws, generator=generator, scheme=scheme, stratified=stratified,
                             antithetic=True, mask_token_id=mask_token_id, batch_size=batch_size,
                             mask_tail=mask_tail)


def independent_log_ratio(model_a, model_b, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                          completion_ids: torch.Tensor, completion_mask: torch.Tensor, *, num_draws: int,
                          generator: torch.Generator | int, scheme: str = "mask_count", stratified: bool = True,
                          antithetic: bool = False, mask_token_id: int | None = None,
                          batch_size: int = DEFAULT_BATCH_SIZE, mask_tail: bool = False) -> LogRatioEstimate:
    """ℓ = ELBO_a − ELBO_b with independent draws for each model (drawn one after the other from `generator`)."""
    mid = _prepare(model_a, model_b, prompt_ids, prompt_mask, completion_ids, completion_mask, num_draws, antithetic,
                   mask_token_id)
    g = as_generator(generator)
    seqs = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    kw = dict(mask_token_id=mid, batch_size=batch_size, mask_tail=mask_tail)
    ests = []
    for model in (model_a, model_b):
        draws = draw_masks(completion_mask, num_draws, g, scheme=scheme, stratified=stratified, antithetic=antithetic)
        ests.append(elbo_from_draws(model, *seqs, draws, **kw))
    return _combine(*ests)


LOG_RATIO_ESTIMATORS = {"coupled": coupled_log_ratio, "antithetic": antithetic_log_ratio,
                        "independent": independent_log_ratio}
"""Log-ratio estimators by name."""
