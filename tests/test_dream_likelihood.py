"""Likelihoods for Dream (shifted logits): the MC-ELBO against its exact value by enumeration, the one-step estimator
and the coupled log-ratio against plain references that apply Dream's shift by hand — and each differs from what the
unshifted reading (LLaDA's) would give, so a missing shift fails these tests."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dllm_ais.likelihood.elbo import elbo
from dllm_ais.likelihood.one_step import draw_prompt_mask, one_step_logprobs
from dllm_ais.likelihood.ratio import coupled_log_ratio
from dllm_ais.models.dream.model import shift_logits
from dllm_ais.models.shift import ShiftedLogits, logits_view, source_positions
from dllm_ais.models.tiny import tiny_dream_model, tiny_model

MASK = 4


def _peaked(seed: int):
    """A float64 tiny Dream with large weights (std 0.3) so masking and the shift really change the log-probs."""
    m = tiny_dream_model(seed=seed, dtype=torch.float64, hidden_size=32, num_attention_heads=2,
                         num_key_value_heads=1, num_hidden_layers=1, intermediate_size=64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    return m.eval()


@pytest.fixture(scope="module")
def model():
    return _peaked(3)


class Unshifted:
    """The wrong reading: Dream's raw logits used as if position i predicted itself (what a LLaDA path does)."""

    shifted_logits = False

    def __init__(self, m):
        self.m, self.config = m, m.config

    def __call__(self, **kw):
        return self.m(**kw)


def _batch():
    """B = 3: left-padded prompts, counted completion lengths 4, 3 and 2 (then visible EOS tails)."""
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 100, (3, 3), generator=g)
    prompt_mask = torch.tensor([[False, True, True], [True, True, True], [False, False, True]])
    prompt_ids[~prompt_mask] = 1
    completion_ids = torch.randint(5, 100, (3, 4), generator=g)
    completion_mask = torch.tensor([[True] * 4, [True] * 3 + [False], [True] * 2 + [False] * 2])
    completion_ids[~completion_mask] = 1
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def exact_elbo(model, prompt_ids, prompt_mask, completion_ids, completion_mask, shift=True) -> torch.Tensor:
    """E over l ~ U{1..L}, uniform l-subsets S of (L/l)·Σ_{j∈S} log p(y_j | S masked), by enumeration [B]; p of
    position i from Dream's shifted logits (raw row i − 1), or from raw row i when shift=False."""
    P = prompt_ids.shape[1]
    out = []
    for b in range(prompt_ids.shape[0]):
        counted = completion_mask[b].nonzero().squeeze(-1).tolist()
        L = len(counted)
        base = torch.cat([prompt_ids[b], completion_ids[b]])
        attn = torch.cat([prompt_mask[b], torch.ones(completion_ids.shape[1], dtype=torch.bool)])
        total = 0.0
        for l in range(1, L + 1):
            for S in itertools.combinations(counted, l):
                x = base.clone()
                x[[P + j for j in S]] = MASK
                raw = model(x[None], attn[None]).logits
                lp = (shift_logits(raw) if shift else raw)[0].double().log_softmax(-1)  # [T, V]
                terms = sum(lp[P + j, completion_ids[b, j]].item() for j in S)
                total += (1 / L) * (1 / math.comb(L, l)) * (L / l) * terms
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("scheme", ["mask_count", "uniform_t"])
def test_dream_mc_elbo_mean_matches_exact_shifted_elbo(model, scheme):
    with torch.no_grad():
        exact = exact_elbo(model, *_batch())
        wrong = exact_elbo(model, *_batch(), shift=False)
        R, K = 192, 4
        batch = [t.repeat(R, 1) for t in _batch()]
        est = elbo(model, *batch, num_draws=K, generator=7, scheme=scheme, batch_size=4096)
    reps = est.estimate.view(R, 3)  # [R, B]
    se = reps.std(0) / R**0.5
    assert (se > 1e-3).all()
    z = (reps.mean(0) - exact) / se
    assert z.abs().max() < 4, (z, reps.mean(0), exact)
    if scheme == "mask_count":  # (stratified counts: small se) the unshifted value is far away, so a missing
        z_wrong = (reps.mean(0) - wrong) / se  # shift fails this test
        assert z_wrong.abs().max() > 10, (z_wrong, wrong)


def _one_step_reference(model, prompt_ids, prompt_mask, completion_ids, prompt_masked, shift=True):
    """One sequence at a time, unpadded: masked prompt + all-mask completion; completion position j scored with
    raw row (P_b + j − 1) (shift) or raw row P_b + j."""
    out = []
    for b in range(prompt_ids.shape[0]):
        keep = prompt_mask[b]
        prompt = torch.where(prompt_masked[b], MASK, prompt_ids[b])[keep]
        x = torch.cat([prompt, torch.full_like(completion_ids[b], MASK)])[None]
        raw = model(x).logits
        lp = (shift_logits(raw) if shift else raw)[0, len(prompt):].log_softmax(-1)  # [L, V]
        out.append(lp.gather(-1, completion_ids[b, :, None]).squeeze(-1))
    return torch.stack(out)


def test_dream_one_step_uses_the_shift(model):
    prompt_ids, prompt_mask, completion_ids, _ = _batch()
    pm = draw_prompt_mask(prompt_mask, 0.3, 5)
    with torch.no_grad():
        got = one_step_logprobs(model, prompt_ids, prompt_mask, completion_ids, prompt_masked=pm)
        ref = _one_step_reference(model, prompt_ids, prompt_mask, completion_ids, pm)
        wrong = _one_step_reference(model, prompt_ids, prompt_mask, completion_ids, pm, shift=False)
        unwrapped = one_step_logprobs(Unshifted(model), prompt_ids, prompt_mask, completion_ids, prompt_masked=pm)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(unwrapped, wrong, rtol=0, atol=1e-10)  # the reference can tell them apart:
    assert (got - wrong).abs().max() > 0.1


def test_dream_one_step_first_completion_token_reads_the_last_prompt_row(model):
    """The completion's first token is predicted by the last real prompt position (not by itself)."""
    prompt_ids, prompt_mask, completion_ids, _ = _batch()
    pm = torch.zeros_like(prompt_mask)
    with torch.no_grad():
        got = one_step_logprobs(model, prompt_ids, prompt_mask, completion_ids, prompt_masked=pm)
        x = torch.cat([prompt_ids, torch.full_like(completion_ids, MASK)], 1)
        attn = torch.cat([prompt_mask, torch.ones_like(completion_ids, dtype=torch.bool)], 1)
        raw = model(x, attn).logits.log_softmax(-1)  # [B, T, V]
    P = prompt_ids.shape[1]
    torch.testing.assert_close(got[:, 0], raw[:, P - 1].gather(-1, completion_ids[:, :1]).squeeze(-1))


def test_dream_coupled_ratio_is_the_difference_of_shifted_elbos(model):
    other = _peaked(4)
    batch = _batch()
    with torch.no_grad():
        est = coupled_log_ratio(model, other, *batch, num_draws=4, generator=11)
        a = elbo(model, *batch, num_draws=4, generator=11)
        b = elbo(other, *batch, num_draws=4, generator=11)
        same = coupled_log_ratio(model, model, *batch, num_draws=4, generator=11)
    torch.testing.assert_close(est.log_ratio, a.estimate - b.estimate, rtol=0, atol=1e-12)
    assert torch.equal(same.log_ratio, torch.zeros(3, dtype=torch.float64))
    R = 128  # and its mean is the exact ELBO difference
    rep = [t.repeat(R, 1) for t in batch]
    with torch.no_grad():
        reps = coupled_log_ratio(model, other, *rep, num_draws=4, generator=12, batch_size=4096).log_ratio.view(R, 3)
        exact = exact_elbo(model, *batch) - exact_elbo(other, *batch)
    z = (reps.mean(0) - exact) / (reps.std(0) / R**0.5)
    assert z.abs().max() < 4, (z, exact)


def test_shifted_view_positions_and_idempotence(model):
    x = torch.randint(5, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        raw = model(x).logits
        view = logits_view(model)
        assert isinstance(view, ShiftedLogits) and logits_view(view) is view
        assert view.config is model.config and view.mask_token_id == model.mask_token_id
        torch.testing.assert_close(view(x).logits, shift_logits(raw))
        torch.testing.assert_close(view(x, positions=slice(3, None)).logits, raw[:, 2:6])
        torch.testing.assert_close(view(x, positions=slice(0, 2)).logits, raw[:, [0, 0]])
        idx = torch.tensor([[0, 4], [6, 1]])
        torch.testing.assert_close(view(x, positions=idx).logits, torch.stack([raw[0, [0, 3]], raw[1, [5, 0]]]))
    llada = tiny_model()
    assert logits_view(llada) is llada  # LLaDA is read as is
    assert source_positions(None, 5) is None


def test_fp8_style_copy_keeps_the_shift_flag(model):
    """A copy built by the FP8 walker keeps the class, hence `shifted_logits`: the ratio reads both alike."""
    from dllm_ais.fp8.quantize import quantize_model

    q = quantize_model(tiny_dream_model(seed=1), backend="torch")
    assert getattr(q, "shifted_logits", False) and isinstance(logits_view(q), ShiftedLogits)
