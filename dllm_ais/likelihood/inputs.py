"""Input checks and canvas construction shared by the diffusion likelihood estimators.

Sequences are [left-padded prompt | completion]: prompt_ids/prompt_mask [B, P] (mask True on real tokens),
completion_ids/completion_mask [B, L] (mask True on the tokens that count, e.g. up to and including the first EOS).
Every completion position is attended to; prompt padding never is.
"""

from __future__ import annotations

import torch


def as_generator(generator: torch.Generator | int) -> torch.Generator:
    """An explicit RNG: the generator itself, or a fresh CPU generator seeded with the int. Never the global RNG."""
    if isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, int) and not isinstance(generator, bool):
        return torch.Generator().manual_seed(generator)
    raise TypeError(f"generator must be a torch.Generator or an int seed, got {type(generator).__name__}.")


def mask_token_id_of(*models, mask_token_id: int | None = None) -> int:
    """The mask token id: explicit, or `model.config.mask_token_id` (all models that have a config must agree)."""
    found = {getattr(getattr(m, "config", None), "mask_token_id", None) for m in models} - {None}
    if mask_token_id is not None:
        return int(mask_token_id)
    if len(found) != 1:
        raise ValueError("pass mask_token_id=...: " + ("no model has config.mask_token_id." if not found else
                                                       f"the models disagree on config.mask_token_id ({found})."))
    return int(found.pop())


def max_length_of(*models) -> int | None:
    """Smallest `config.max_sequence_length` (LLaDA) or `config.max_position_embeddings` among the models, if any."""
    lengths = []
    for m in models:
        cfg = getattr(m, "config", None)
        n = getattr(cfg, "max_sequence_length", None) or getattr(cfg, "max_position_embeddings", None)
        if n is not None:
            lengths.append(int(n))
    return min(lengths) if lengths else None


def check_sequences(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                    completion_mask: torch.Tensor | None, max_length: int | None = None) -> None:
    """Raise ValueError naming the problem: shapes, an empty completion (L = 0), or P + L over the model's limit."""
    if prompt_ids.dim() != 2 or prompt_ids.shape != prompt_mask.shape:
        raise ValueError(f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must be "
                         "equal [B, P] shapes.")
    if completion_ids.dim() != 2 or completion_ids.shape[0] != prompt_ids.shape[0]:
        raise ValueError(f"completion_ids {tuple(completion_ids.shape)} must be [B, L] with B = "
                         f"{prompt_ids.shape[0]} (the prompt batch).")
    if completion_mask is not None and completion_mask.shape != completion_ids.shape:
        raise ValueError(f"completion_mask {tuple(completion_mask.shape)} must match completion_ids "
                         f"{tuple(completion_ids.shape)}.")
    if completion_ids.shape[1] == 0:
        raise ValueError("the completion is empty (L = 0): there is nothing to score.")
    T = prompt_ids.shape[1] + completion_ids.shape[1]
    if max_length is not None and T > max_length:
        raise ValueError(f"prompt + completion = {T} tokens exceeds the model's max_sequence_length={max_length}; "
                         "truncate the prompt or shorten the completion.")


def check_num_draws(num_draws: int, antithetic: bool = False) -> None:
    """K must be a positive int, even when draws come in antithetic pairs."""
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 1:
        raise ValueError(f"num_draws={num_draws!r} must be an int >= 1.")
    if antithetic and num_draws % 2:
        raise ValueError(f"num_draws={num_draws} must be even for antithetic draws (K/2 masks and their "
                         "complements).")


def canvas(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
           completion_mask: torch.Tensor, mask_token_id: int, mask_tail: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnoised inputs [B, P + L] and attention mask [B, P + L] bool.

    Completion tokens outside completion_mask (the tail after the first EOS) stay visible as themselves, or are
    replaced by the mask token when mask_tail; they are never scored either way.
    """
    comp = completion_ids
    if mask_tail:
        comp = torch.where(completion_mask.bool(), completion_ids, torch.full_like(completion_ids, mask_token_id))
    x = torch.cat([prompt_ids, comp], dim=1)  # [B, T]
    attn = torch.cat([prompt_mask.bool(), torch.ones_like(completion_ids, dtype=torch.bool)], dim=1)  # [B, T]
    return x, attn
