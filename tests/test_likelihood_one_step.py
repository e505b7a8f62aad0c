"""d1's one-step per-token log-probs: shared prompt masks from a seed, padding respected, plain reference."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.likelihood.one_step import draw_prompt_mask, one_step_logprobs
from dllm_ais.models.tiny import tiny_model

MASK = 4


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=2, dtype=torch.float64)


def _batch():
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 100, (3, 10), generator=g)
    prompt_mask = torch.ones(3, 10, dtype=torch.bool)
    prompt_mask[0, :4] = False
    prompt_mask[2, :9] = False
    prompt_ids[~prompt_mask] = 1
    return prompt_ids, prompt_mask, torch.randint(5, 100, (3, 7), generator=g)


def reference(model, prompt_ids, prompt_mask, completion_ids, prompt_masked):
    """One sequence at a time, unpadded: masked prompt + all-mask completion, full logits, log_softmax."""
    out = []
    for b in range(prompt_ids.shape[0]):
        keep = prompt_mask[b]
        prompt = torch.where(prompt_masked[b], MASK, prompt_ids[b])[keep]
        x = torch.cat([prompt, torch.full_like(completion_ids[b], MASK)])[None]
        lp = model(x).logits[0, len(prompt):].log_softmax(-1)  # [L, V]
        out.append(lp.gather(-1, completion_ids[b, :, None]).squeeze(-1))
    return torch.stack(out)


def test_matches_unpadded_reference(model):
    p, pm, c = _batch()
    masked = draw_prompt_mask(pm, 0.3, 4)
    with torch.no_grad():
        got = one_step_logprobs(model, p, pm, c, prompt_masked=masked)
        ref = reference(model, p, pm, c, masked)
    assert got.shape == (3, 7) and got.dtype == torch.float64
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)


def test_same_seed_shares_the_mask_so_identical_models_give_zero_ratio(model):
    p, pm, c = _batch()
    state = torch.get_rng_state()
    with torch.no_grad():
        theta = one_step_logprobs(model, p, pm, c, generator=123, p_mask_prompt=0.5)
        old = one_step_logprobs(model, p, pm, c, generator=torch.Generator().manual_seed(123), p_mask_prompt=0.5)
        other = one_step_logprobs(model, p, pm, c, generator=124, p_mask_prompt=0.5)
    assert torch.equal(theta - old, torch.zeros_like(theta))
    assert not torch.equal(theta, other)
    assert torch.equal(torch.get_rng_state(), state)


def test_prompt_mask_draws_only_real_tokens():
    pm = torch.ones(400, 20, dtype=torch.bool)
    pm[:, :5] = False
    masked = draw_prompt_mask(pm, 0.15, 0)
    assert not masked[:, :5].any()
    assert abs(masked[:, 5:].float().mean().item() - 0.15) < 0.01
    assert not draw_prompt_mask(pm, 0.0, 0).any()
    assert torch.equal(draw_prompt_mask(pm, 1.0, 0), pm)


def test_bad_inputs(model):
    p, pm, c = _batch()
    with pytest.raises(ValueError, match="exactly one"):
        one_step_logprobs(model, p, pm, c)
    with pytest.raises(ValueError, match="exactly one"):
        one_step_logprobs(model, p, pm, c, generator=0, prompt_masked=pm)
    with pytest.raises(ValueError, match="p_mask_prompt"):
        one_step_logprobs(model, p, pm, c, generator=0, p_mask_prompt=1.5)
    with pytest.raises(ValueError, match="empty"):
        one_step_logprobs(model, p, pm, c[:, :0], generator=0)
    with pytest.raises(ValueError, match="max_sequence_length"):
        one_step_logprobs(model, p, pm, torch.full((3, 250), 9), generator=0)
