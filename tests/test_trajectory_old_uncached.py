"""The trajectory mismatch ratio's π_old is the exact, *uncached* replay of the rollout's canvases, whatever cache the
sampler used: its terms equal `path_logprob` with cache="none", and a cached BF16 rollout (π_old and μ the same
weights) has ℓ ≠ 0 — the cache's staleness is a real mismatch between the sampler and the policy."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_path_likelihood import MASK_ID, VOCAB, confident_model

from dllm_ais.config import SamplerConfig
from dllm_ais.likelihood.trajectory import path_logprob, rollout_token_logp, share_step_terms
from dllm_ais.train.backend import DiffusionBackend

CFG = SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=1.0, cache="dual", threshold=0.2)


def _prompts(B=6, P=7, seed=0):
    ids = torch.randint(0, VOCAB, (B, P), generator=torch.Generator().manual_seed(seed))
    ids[ids == MASK_ID] = 5
    mask = torch.ones(B, P, dtype=torch.bool)
    mask[0, :2] = False  # left padding
    return ids, mask


@pytest.mark.parametrize("selection", [False, True])
def test_old_policy_terms_are_the_uncached_path_terms(selection):
    model = confident_model(seed=1)
    backend = DiffusionBackend(CFG, MASK_ID, [MASK_ID], mismatch_estimator="trajectory",
                               trajectory_selection=selection)
    ids, mask = _prompts()
    rollout = backend.sample(model, ids, mask, torch.Generator().manual_seed(1))
    backend.prepare(rollout, torch.Generator().manual_seed(2))
    with torch.no_grad():
        ell = backend.mismatch_log_w(model, model, rollout, torch.Generator().manual_seed(3), "token")  # [B, L]
        exact = path_logprob(model, rollout, replace(CFG, cache="none"), selection=selection)
    counted = rollout.completion_mask
    plan = rollout.trajectory_plan
    mu = rollout_token_logp(rollout, plan, selection)  # the sampler's record of log μ (cached logits)
    old = exact.token_terms + (share_step_terms(exact.selection_terms, rollout.commit_step, counted) if selection
                               else 0.0)
    old = torch.where(counted, old, 0.0)
    assert torch.allclose((ell.double() + mu)[counted], old[counted], atol=5e-5, rtol=0), \
        float(((ell.double() + mu) - old)[counted].abs().max())
    assert float(ell.abs().max()) > 0.02, float(ell.abs().max())  # same weights, cached sampler: ℓ ≠ 0
    with torch.no_grad():
        cached = path_logprob(model, rollout, CFG, selection=selection)  # what a cached π_old would give: ℓ ≈ 0
    print(f"max |ℓ| = {float(ell.abs().max()):.3f}")
    assert float((cached.token_terms - exact.token_terms)[counted].abs().max()) > 0.02
