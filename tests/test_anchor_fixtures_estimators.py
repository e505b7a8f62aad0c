"""The mask-draw policy likelihoods (issue 34: `elbo` stratified / antithetic, `coupled`, `spg`) against numbers
produced by the anchors' own code — LLaDA's get_log_likelihood, ESPO's _get_elbo_mc, DiffuCoder's coupled-GRPO
_get_per_token_logps, SPG's _get_per_seq_logps — on the tiny LLaDA with the anchors' masks fed explicitly
(tests/fixtures/anchors/, docs/anchors.md). Agreement to 1e-5 absolute (rtol 0), LLaDA's float32 ELBO to 2e-5
(test_anchor_fixtures.LLADA_FLOAT32_ATOL: its float32 sum), and to 1e-9 on the float64 model."""

from __future__ import annotations

import pytest
import torch
from test_anchor_fixtures import FLOAT64_ATOL, LLADA_FLOAT32_ATOL, assert_within, load, model_of, tensors

from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.mask_draws import PolicyDraw, policy_draw, token_terms
from dllm_ais.likelihood.policy import policy_likelihood
from dllm_ais.likelihood.spg import spg_elbo, spg_sequence_logp


def _inputs(rec):
    prompt, completion = tensors(rec, "prompt_ids", "completion_ids")
    return (prompt, torch.ones_like(prompt, dtype=torch.bool), completion,
            torch.ones_like(completion, dtype=torch.bool))  # every completion token counted in the fixtures


@pytest.mark.parametrize("dtype,key,atol", [(torch.float32, "log_likelihood", LLADA_FLOAT32_ATOL),
                                             (torch.float64, "log_likelihood_float64", FLOAT64_ATOL)])
def test_stratified_elbo_matches_llada_get_log_likelihood(dtype, key, atol):
    """VRPO / BGPO's stratified ELBO (weight (L/x)/K per draw) on LLaDA's own draws = get_log_likelihood (float32:
    within its float32 rounding; float64 copy: to float64 rounding)."""
    rec = load("llada_elbo.json")
    m = model_of(rec).to(dtype)
    prompt, pmask, completion, cmask = _inputs(rec)
    (mask,) = tensors(rec, "mask", dtype=torch.bool)
    (counts,) = tensors(rec, "count")
    B, K, L = mask.shape
    draw = policy_draw(mask, L / counts.double() / K, cmask)
    like = policy_likelihood("elbo", PolicyLikelihoodConfig(elbo_draws=K, elbo_scheme="stratified"))
    with torch.no_grad():
        got = like.token_logp(m, prompt, pmask, completion, cmask, draw, mask_token_id=m.config.mask_token_id)
    assert_within(got.sum(-1), rec["outputs"][key], atol)


def test_antithetic_elbo_matches_espo():
    """ESPO's sequence ELBO (num_mc 2: two counts x ∈ 0..L with weight (L+1)/x and their complements with
    (L+1)/(L−x), halves averaged) on ESPO's own draws = the antithetic scheme's estimate; counts 0 and L included."""
    rec = load("espo.json")
    m = model_of(rec)
    prompt, pmask, completion, cmask = _inputs(rec)
    (base,) = tensors(rec, "base_mask", dtype=torch.bool)  # [B, 2, L]
    (x,) = tensors(rec, "count")  # [B, 2]
    L = completion.shape[1]
    assert bool((x == 0).any()) and bool((x == L).any())  # both edge counts are in the fixture
    mask = torch.cat([base, ~base], dim=1)  # [B, 4, L] the draws, then their complements
    counts = torch.cat([x, L - x], dim=1).double()
    K = mask.shape[1]
    weight = torch.where(counts > 0, (L + 1) / counts.clamp_min(1), 0.0) / K
    draw = policy_draw(mask, weight, cmask)
    like = policy_likelihood("elbo", PolicyLikelihoodConfig(elbo_draws=K, elbo_scheme="antithetic"))
    with torch.no_grad():
        got = like.token_logp(m, prompt, pmask, completion, cmask, draw, mask_token_id=m.config.mask_token_id)
    want = torch.tensor(rec["outputs"]["elbo"], dtype=got.dtype)
    assert_within(got.sum(-1), want)


def test_coupled_matches_diffucoder():
    """DiffuCoder's per-token ½[log p_full + log p_partial / t (or log p_complement / (1 − t))] on its own t and
    partial mask = the coupled likelihood's token terms."""
    rec = load("diffucoder_coupled.json")
    m = model_of(rec)
    prompt, pmask, completion, cmask = _inputs(rec)
    (partial,) = tensors(rec, "partial_mask", dtype=torch.bool)  # [B, L]
    t = rec["inputs"]["t"]
    assert 0.2 <= t <= 0.8 and bool(partial.any()) and bool((~partial).any())
    mask = torch.stack([cmask, partial, cmask & ~partial], dim=1)  # [B, 3, L]
    weight = torch.tensor([0.5, 0.5 / t, 0.5 / (1 - t)], dtype=torch.float64).expand(mask.shape[0], -1)
    draw = policy_draw(mask, weight, cmask)
    like = policy_likelihood("coupled", PolicyLikelihoodConfig())
    with torch.no_grad():
        got = like.token_logp(m, prompt, pmask, completion, cmask, draw, mask_token_id=m.config.mask_token_id)
    want = torch.tensor(rec["outputs"]["per_token_logps"], dtype=got.dtype)
    assert_within(got, want)


@pytest.mark.parametrize("estimator", ["elbo", "eubo", "mix"])
def test_spg_matches_spg_trainer(estimator):
    """SPG's _get_per_seq_logps (block_random, num_t 2, prompt and earlier blocks masked w.p. 0.3): the ELBO (per-token
    mean over masked counted tokens, no 1/t) for positive advantages, the EUBO (β 1.5) or the 0.5 mixture for the
    others, on SPG's own masks."""
    rec = load("spg.json")
    m = model_of(rec)
    prompt, pmask, completion, cmask = _inputs(rec)
    (mask, prompt_masked) = tensors(rec, "mask", "prompt_masked", dtype=torch.bool)  # [B, K, L], [B, K, P]
    B, K, L = mask.shape
    count = mask.sum(-1).double()  # [B, K]
    assert bool(prompt_masked.any()) and bool((count > 0).all())
    draw = PolicyDraw(mask=mask, weight=torch.where(mask, (1.0 / count / K)[..., None], 0.0),
                      prompt_masked=prompt_masked, level=count / L)
    like = policy_likelihood("spg", PolicyLikelihoodConfig(elbo_draws=K, spg_p_mask_prompt=0.3), block_length=4)
    with torch.no_grad():
        lp = like.draw_logp(m, prompt, pmask, completion, cmask, draw, mask_token_id=m.config.mask_token_id)
    adv = torch.where(torch.tensor(rec["inputs"]["reward_mask"]), 1.0, -1.0)
    if estimator == "elbo":
        got = spg_elbo(draw, lp)
        assert_within(token_terms(draw, lp).sum(-1), got, atol=1e-12)
    else:
        got = spg_sequence_logp(draw, lp, adv, beta=1.5, mix=None if estimator == "eubo" else 0.5)
    want = torch.tensor(rec["outputs"]["per_seq_logps"][estimator], dtype=got.dtype)
    assert_within(got, want)
