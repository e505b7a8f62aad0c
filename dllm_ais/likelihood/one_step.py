"""d1's one-step (mean-field) per-token log-probs for a masked diffusion model (diffu-GRPO).

Every completion position is masked and each real prompt token is masked independently with probability
p_mask_prompt (default 0.15); one forward gives log p(y_j | x̃) for every completion position j. The prompt mask is
drawn from an explicit generator or seed, so π_θ and π_old (the trainer calls this twice with the same seed) see the
same masked prompt — the random prompt masking then acts as a shared regulariser, not as noise in the ratio π_θ/π_old.
Differences from d1's code: left padding is never masked nor attended (d1 masks padding like prompt tokens), and the
seed goes to a local generator instead of reseeding the global RNGs.
"""

from __future__ import annotations

import torch

from dllm_ais.likelihood.inputs import as_generator, check_sequences, mask_token_id_of, max_length_of
from dllm_ais.likelihood.logprobs import token_logprobs
from dllm_ais.models.shift import logits_view

P_MASK_PROMPT = 0.15
"""d1's default probability of masking each prompt token."""


def draw_prompt_mask(prompt_mask: torch.Tensor, p_mask_prompt: float, generator: torch.Generator | int) -> torch.Tensor:
    """[B, P] bool: each real prompt token (prompt_mask True) masked independently with probability p_mask_prompt.

    The uniforms are drawn on the generator's device (a CPU generator gives the same mask on any device).
    """
    if not 0.0 <= p_mask_prompt <= 1.0:
        raise ValueError(f"p_mask_prompt={p_mask_prompt} must be in [0, 1].")
    g = as_generator(generator)
    u = torch.rand(prompt_mask.shape, generator=g, device=g.device, dtype=torch.float64).to(prompt_mask.device)
    return (u < p_mask_prompt) & prompt_mask.bool()  # [B, P]


def one_step_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, *,
                      generator: torch.Generator | int | None = None, prompt_masked: torch.Tensor | None = None,
                      p_mask_prompt: float = P_MASK_PROMPT, mask_token_id: int | None = None,
                      chunk_size: int | None = None, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log p(y_j | prompt with some tokens masked, all completion masked) -> [B, L] (float32, or float64).

    prompt_ids/prompt_mask [B, P] left-padded; completion_ids [B, L] (all L positions are masked and scored; apply
    completion_mask downstream). Give exactly one of generator (Generator or int seed) or prompt_masked [B, P] bool
    (a mask from `draw_prompt_mask`). temperature divides the logits as in the rollout's sampling distribution.
    """
    check_sequences(prompt_ids, prompt_mask, completion_ids, None, max_length_of(model))
    if (generator is None) == (prompt_masked is None):
        raise ValueError("pass exactly one of generator (or an int seed) and prompt_masked.")
    if prompt_masked is None:
        prompt_masked = draw_prompt_mask(prompt_mask, p_mask_prompt, generator)
    if prompt_masked.shape != prompt_ids.shape:
        raise ValueError(f"prompt_masked {tuple(prompt_masked.shape)} must match prompt_ids {tuple(prompt_ids.shape)}.")
    mid = mask_token_id_of(model, mask_token_id=mask_token_id)
    B, P = prompt_ids.shape
    prompt = torch.where(prompt_masked.bool() & prompt_mask.bool(), mid, prompt_ids)  # [B, P]
    x = torch.cat([prompt, torch.full_like(completion_ids, mid)], dim=1)  # [B, P + L]
    attn = torch.cat([prompt_mask.bool(), torch.ones_like(completion_ids, dtype=torch.bool)], dim=1)  # [B, P + L]
    logits = logits_view(model)(input_ids=x, attention_mask=attn, positions=slice(P, None)).logits  # [B, L, V]
    return token_logprobs(logits, completion_ids, chunk_size=chunk_size, temperature=temperature)  # [B, L]
