"""Exact per-token log-probs of a causal LM (logits at position t predict token t + 1).

Full float32 [B, T, V] logits are never materialised: the log-softmax + gather runs over chunks of positions
(`logprobs.token_logprobs`). `completion_logprobs_from_hidden` goes further and applies the LM head per chunk, so the
full logits never exist at all (valid for models whose logits are just lm_head(final hidden), e.g. Qwen/LLaMA; not for
models with logit soft-capping or scaling outside the head).
Inputs are [left-padded prompt | completion]; position ids count real tokens only (as HF `generate` does).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dllm_ais.likelihood.inputs import check_sequences
from dllm_ais.likelihood.logprobs import hidden_token_logprobs, token_logprobs


def naive_causal_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Reference: logits [B, T, V], input_ids [B, T] -> [B, T-1] log p(input_ids[:, t+1] | ≤ t), one float32 copy."""
    lp = (logits[:, :-1].float() / temperature).log_softmax(-1)  # [B, T-1, V]
    return lp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def causal_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, *, chunk_size: int | None = None,
                    temperature: float = 1.0) -> torch.Tensor:
    """logits [B, T, V], input_ids [B, T] -> [B, T-1] log p(input_ids[:, t+1] | ≤ t), chunked over positions."""
    return token_logprobs(logits[:, :-1], input_ids[:, 1:], chunk_size=chunk_size, temperature=temperature)


def _inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor):
    """input_ids, attention_mask, position_ids [B, P + L] for a causal LM; rows need >= 1 real prompt token."""
    check_sequences(prompt_ids, prompt_mask, completion_ids, None)
    if prompt_ids.shape[1] == 0 or not prompt_mask.bool().any(-1).all():
        raise ValueError("every row needs at least one real prompt token (e.g. BOS): the first completion token is "
                         "predicted from the last prompt position.")
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, T]
    attn = torch.cat([prompt_mask.long(), torch.ones_like(completion_ids, dtype=torch.long)], dim=1)  # [B, T]
    pos = (attn.cumsum(-1) - 1).clamp_min(0)  # [B, T]
    return ids, attn, pos


def completion_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, *,
                        chunk_size: int | None = None, temperature: float = 1.0,
                        model_kwargs: dict | None = None) -> torch.Tensor:
    """log p(completion_j | prompt, completion_<j) -> [B, L] (float32) for a causal LM.

    model(input_ids, attention_mask, position_ids, **model_kwargs).logits -> [B, T', V] where the last T' positions
    are returned (T' = T, or fewer with e.g. HF's logits_to_keep=L + 1, which saves the prompt's logits).
    """
    ids, attn, pos = _inputs(prompt_ids, prompt_mask, completion_ids)
    L = completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, **(model_kwargs or {})).logits
    if logits.shape[1] < L + 1:
        raise ValueError(f"the model returned logits for {logits.shape[1]} positions; need the last {L + 1}.")
    return token_logprobs(logits[:, -(L + 1):-1], completion_ids, chunk_size=chunk_size, temperature=temperature)


def completion_logprobs_from_hidden(hidden_fn: Callable[..., torch.Tensor], lm_head: Callable[[torch.Tensor],
                                    torch.Tensor], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                                    completion_ids: torch.Tensor, *, vocab_size: int, chunk_size: int | None = None,
                                    temperature: float = 1.0) -> torch.Tensor:
    """As `completion_logprobs`, but logits are formed per chunk from final hidden states: never [B, L, V] at once.

    hidden_fn(input_ids=, attention_mask=, position_ids=) -> [B, T, d] final (normed) hidden states; lm_head: [.., d]
    -> [.., V]. For a HF causal LM: `hf_hidden_and_head(model)`.
    """
    ids, attn, pos = _inputs(prompt_ids, prompt_mask, completion_ids)
    L = completion_ids.shape[1]
    hidden = hidden_fn(input_ids=ids, attention_mask=attn, position_ids=pos)  # [B, T, d]
    return hidden_token_logprobs(hidden[:, -(L + 1):-1], lm_head, completion_ids, vocab_size=vocab_size,
                                 chunk_size=chunk_size, temperature=temperature)


def hf_hidden_and_head(model) -> tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor], int]:
    """(hidden_fn, lm_head, vocab_size) for a transformers *ForCausalLM (decoder + output embeddings)."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()

    def hidden_fn(**kw) -> torch.Tensor:
        return decoder(**kw).last_hidden_state

    return hidden_fn, head, int(head.weight.shape[0])
