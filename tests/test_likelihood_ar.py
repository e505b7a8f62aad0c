"""Exact causal-LM token log-probs: chunked and hidden-state variants equal the naive full log-softmax."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.likelihood.autoregressive import (
    causal_logprobs,
    completion_logprobs,
    completion_logprobs_from_hidden,
    hf_hidden_and_head,
    naive_causal_logprobs,
)
from dllm_ais.likelihood.logprobs import hidden_token_logprobs, token_logprobs

VOCAB = 151936  # Qwen's


@pytest.fixture(scope="module")
def qwen():
    """A random one-layer Qwen3 with the real vocabulary; built under fork_rng so the global RNG is left as it was."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(cfg).eval()
        with torch.no_grad():
            model.lm_head.weight.mul_(60.0)  # peaked distributions, log-probs far from -log V
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(0, VOCAB, (2, 5), generator=g)
    prompt_mask = torch.tensor([[False, False, True, True, True], [True] * 5])
    return prompt_ids, prompt_mask, torch.randint(0, VOCAB, (2, 6), generator=g)


def _naive(model, prompt_ids, prompt_mask, completion_ids, temperature=1.0):
    ids = torch.cat([prompt_ids, completion_ids], 1)
    attn = torch.cat([prompt_mask, torch.ones_like(completion_ids, dtype=torch.bool)], 1).long()
    logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp_min(0)).logits
    return naive_causal_logprobs(logits, ids, temperature)[:, -completion_ids.shape[1]:]


@pytest.mark.parametrize("chunk_size", [None, 1, 5])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_naive(qwen, chunk_size, temperature):
    with torch.no_grad():
        ref = _naive(qwen, *_batch(), temperature=temperature)
        got = completion_logprobs(qwen, *_batch(), chunk_size=chunk_size, temperature=temperature)
    assert got.shape == (2, 6) and ref.std() > 0.5
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_logits_to_keep_gives_the_same(qwen):
    with torch.no_grad():
        full = completion_logprobs(qwen, *_batch())
        kept = completion_logprobs(qwen, *_batch(), model_kwargs=dict(logits_to_keep=7))
    torch.testing.assert_close(kept, full, rtol=0, atol=1e-5)


def test_hidden_variant_equals_naive_and_never_builds_full_logits(qwen):
    hidden_fn, head, vocab = hf_hidden_and_head(qwen)
    rows_seen = []

    def spy_head(h):
        rows_seen.append(h.reshape(-1, h.shape[-1]).shape[0])
        return head(h)

    with torch.no_grad():
        ref = _naive(qwen, *_batch())
        got = completion_logprobs_from_hidden(hidden_fn, spy_head, *_batch(), vocab_size=vocab, chunk_size=4)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    assert vocab == VOCAB and max(rows_seen) <= 4 and sum(rows_seen) == 12


def test_default_chunk_respects_the_memory_budget(qwen):
    hidden_fn, head, vocab = hf_hidden_and_head(qwen)
    rows_seen = []
    with torch.no_grad():
        hidden_token_logprobs(torch.randn(2, 300, 32, generator=torch.Generator().manual_seed(0)),
                              lambda h: rows_seen.append(h.shape[0]) or head(h), torch.zeros(2, 300, dtype=torch.long),
                              vocab_size=vocab)
    assert max(rows_seen) == 2**25 // VOCAB and sum(rows_seen) == 600


def test_gradients_match_naive():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 9, 50, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 50, (2, 9), generator=g)
    (gc,) = torch.autograd.grad(causal_logprobs(logits, ids, chunk_size=4).sum(), logits)
    (gn,) = torch.autograd.grad(naive_causal_logprobs(logits, ids).sum(), logits)
    torch.testing.assert_close(gc, gn)
    w = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    h = torch.randn(2, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    got = hidden_token_logprobs(h, lambda x: x @ w.T, ids, vocab_size=50, chunk_size=5)
    ref = token_logprobs(h @ w.T, ids)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), (h, w)), torch.autograd.grad(ref.sum(), (h, w)))


def test_bad_inputs(qwen):
    p, pm, c = _batch()
    pm[0] = False
    with pytest.raises(ValueError, match="real prompt token"):
        completion_logprobs(qwen, p, pm, c)
    with pytest.raises(ValueError, match="empty"):
        completion_logprobs(qwen, *_batch()[:2], c[:, :0])
    with pytest.raises(ValueError, match="disagree"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), temperature=0)


def test_proposal_logprobs_excludes_mask_and_applies_temperature():
    from dllm_ais.likelihood.logprobs import proposal_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    tokens = torch.tensor([[0, 1, 2], [3, 5, 6]])
    mask_id = 4
    for T in (0.5, 1.0, 2.0):
        keep = [v for v in range(7) if v != mask_id]
        ref = (logits[..., keep] / T).log_softmax(-1)  # [2, 3, 6]
        idx = torch.tensor([keep.index(int(t)) for t in tokens.flatten()]).view(2, 3)
        want = ref.gather(-1, idx[..., None]).squeeze(-1)
        torch.testing.assert_close(proposal_logprobs(logits, tokens, T, mask_id), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(proposal_logprobs(logits, tokens, 0.0, mask_id),
                               proposal_logprobs(logits, tokens, 1.0, mask_id), rtol=0, atol=0)
    assert proposal_logprobs(logits, torch.full_like(tokens, mask_id), 1.0, mask_id).isinf().all()
