"""MC ELBO for masked diffusion: draws, exactness against full mask enumeration, determinism, bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dllm_ais.likelihood.elbo import elbo, elbo_from_draws
from dllm_ais.likelihood.masks import draw_masks, stratified_uniforms
from dllm_ais.models.tiny import init_weights, tiny_model

MASK = 4


@pytest.fixture(scope="module")
def model():
    """A small float64 LLaDA with peaked predictions (std 0.3), so masking really changes the log-probs."""
    m = tiny_model(seed=3, dtype=torch.float64, d_model=32, n_heads=2, n_layers=1, mlp_hidden_size=64)
    return init_weights(m, torch.Generator().manual_seed(3), std=0.3).eval()


def _batch():
    """B = 3: left-padded prompts, counted completion lengths 6, 4 and 3 (then visible EOS tails)."""
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 100, (3, 3), generator=g)
    prompt_mask = torch.tensor([[False, True, True], [True, True, True], [False, False, True]])
    prompt_ids[~prompt_mask] = 1
    completion_ids = torch.randint(5, 100, (3, 6), generator=g)
    completion_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] * 3 + [False] * 3])
    completion_ids[~completion_mask] = 1
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def exact_elbo(model, prompt_ids, prompt_mask, completion_ids, completion_mask, mask_tail=False) -> torch.Tensor:
    """E over l ~ U{1..L} and uniform l-subsets S of (L/l)·Σ_{j∈S} log p(y_j | S masked), by enumeration. [B]."""
    P = prompt_ids.shape[1]
    out = []
    for b in range(prompt_ids.shape[0]):
        counted = completion_mask[b].nonzero().squeeze(-1).tolist()
        L = len(counted)
        base = torch.cat([prompt_ids[b], completion_ids[b]])
        if mask_tail:
            base[P:][~completion_mask[b]] = MASK
        attn = torch.cat([prompt_mask[b], torch.ones(completion_ids.shape[1], dtype=torch.bool)])
        total = 0.0
        for l in range(1, L + 1):
            for S in itertools.combinations(counted, l):
                x = base.clone()
                x[[P + j for j in S]] = MASK
                lp = model(x[None], attn[None]).logits[0].double().log_softmax(-1)  # [T, V]
                terms = sum(lp[P + j, completion_ids[b, j]].item() for j in S)
                total += (1 / L) * (1 / math.comb(L, l)) * (L / l) * terms
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


VARIANTS = [  # (scheme, stratified, antithetic)
    ("mask_count", True, False), ("mask_count", False, False), ("mask_count", True, True),
    ("uniform_t", True, False), ("uniform_t", False, False), ("uniform_t", True, True),
]


@pytest.fixture(scope="module")
def exact(model):
    with torch.no_grad():
        return {tail: exact_elbo(model, *_batch(), mask_tail=tail) for tail in (False, True)}


@pytest.mark.parametrize("scheme,stratified,antithetic", VARIANTS)
def test_mc_mean_matches_exact_elbo(model, exact, scheme, stratified, antithetic):
    R, K = 256, 4
    batch = [t.repeat(R, 1) for t in _batch()]  # R independent replicates of each sequence
    with torch.no_grad():
        est = elbo(model, *batch, num_draws=K, generator=7, scheme=scheme, stratified=stratified,
                   antithetic=antithetic, batch_size=4096)
    reps = est.estimate.view(R, 3)  # [R, B]
    se = reps.std(0) / R**0.5  # [B]
    assert (se > 1e-3).all()  # the draws really vary
    z = (reps.mean(0) - exact[False]) / se
    assert z.abs().max() < 4, (z, reps.mean(0), exact[False])


def test_mask_tail_mc_matches_its_exact_elbo(model, exact):
    R = 256
    batch = [t.repeat(R, 1) for t in _batch()]
    with torch.no_grad():
        est = elbo(model, *batch, num_draws=4, generator=8, mask_tail=True, batch_size=4096)
    reps = est.estimate.view(R, 3)
    z = (reps.mean(0) - exact[True]) / (reps.std(0) / R**0.5)
    assert z.abs().max() < 4
    assert not torch.allclose(exact[True], exact[False])  # the tail convention matters


def test_per_draw_mean_and_row_count(model):
    batch = _batch()
    with torch.no_grad():
        est = elbo(model, *batch, num_draws=5, generator=1)
    assert est.per_draw.shape == (3, 5) and est.estimate.shape == (3,)
    assert est.per_draw.dtype == torch.float64
    torch.testing.assert_close(est.estimate, est.per_draw.mean(-1))
    assert est.num_rows == 15


def test_batch_size_does_not_change_results(model):
    batch = _batch()
    with torch.no_grad():
        a = elbo(model, *batch, num_draws=6, generator=2, batch_size=1)
        b = elbo(model, *batch, num_draws=6, generator=2, batch_size=1000)
    torch.testing.assert_close(a.per_draw, b.per_draw, rtol=1e-12, atol=1e-12)


def test_same_seed_same_result_and_global_rng_untouched(model):
    batch = _batch()
    state = torch.get_rng_state()
    with torch.no_grad():
        a = elbo(model, *batch, num_draws=4, generator=torch.Generator().manual_seed(11))
        b = elbo(model, *batch, num_draws=4, generator=torch.Generator().manual_seed(11))
        c = elbo(model, *batch, num_draws=4, generator=11, scheme="uniform_t")
    assert torch.equal(a.per_draw, b.per_draw)
    assert not torch.equal(a.per_draw, c.per_draw)
    assert torch.equal(torch.get_rng_state(), state)


def test_gradients_flow(model):
    est = elbo(model, *_batch(), num_draws=2, generator=0)
    est.estimate.sum().backward()
    grad = model.get_output_embeddings().weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


# ---- draws ---------------------------------------------------------------------------------------------------------


def test_mask_count_draws_respect_counted_tokens_and_weights():
    counted = torch.tensor([[True] * 7 + [False] * 3, [True, True] + [False] * 8])
    d = draw_masks(counted, 9, 0)
    n = counted.sum(-1, keepdim=True)  # [B, 1]
    l = d.mask.sum(-1)  # [B, K]
    assert not (d.mask & ~counted[:, None]).any()
    assert ((l >= 1) & (l <= n)).all()
    torch.testing.assert_close(d.weight, n.double() / l.double())
    torch.testing.assert_close(d.level, l.double() / n.double())


def test_stratified_mask_count_hits_every_count_once_when_K_equals_L():
    counted = torch.ones(50, 6, dtype=torch.bool)
    l = draw_masks(counted, 6, 3).mask.sum(-1)  # [50, 6]
    assert torch.equal(l.sort(-1).values, torch.arange(1, 7).expand(50, 6))


def test_stratified_levels_are_marginally_uniform():
    w = stratified_uniforms(20000, 3, torch.Generator().manual_seed(0), stratified=True)  # [N, 3]
    for k in range(3):
        hist = torch.histc(w[:, k].float(), bins=10, min=0, max=1) / 20000
        assert (hist - 0.1).abs().max() < 0.01
    gaps = (w[:, 1] - w[:, 0]) % 1.0
    torch.testing.assert_close(gaps, torch.full_like(gaps, 1 / 3))


@pytest.mark.parametrize("scheme", ["mask_count", "uniform_t"])
def test_antithetic_pairs_are_complements(scheme):
    counted = torch.tensor([[True] * 5 + [False] * 2, [True] * 1 + [False] * 6, [True] * 7])
    d = draw_masks(counted, 8, 5, scheme=scheme, antithetic=True)
    base, comp = d.mask[:, :4], d.mask[:, 4:]
    full = base.sum(-1) == counted.sum(-1, keepdim=True)
    if scheme == "mask_count":  # a full mask pairs with itself; otherwise exact complements
        expect = torch.where(full[..., None], base, counted[:, None] & ~base)
        assert (comp.sum(-1) >= 1).all()
    else:
        expect = counted[:, None] & ~base
        torch.testing.assert_close(d.level[:, 4:], 1 - d.level[:, :4])
    assert torch.equal(comp, expect)
    nonempty = d.mask.any(-1)
    torch.testing.assert_close(d.weight[nonempty], 1 / d.level[nonempty])
    assert (d.weight[~nonempty] == 0).all()


def test_draws_use_their_own_generator_only():
    state = torch.get_rng_state()
    a = draw_masks(torch.ones(2, 5, dtype=torch.bool), 4, torch.Generator().manual_seed(1), scheme="uniform_t")
    b = draw_masks(torch.ones(2, 5, dtype=torch.bool), 4, 1, scheme="uniform_t")
    assert torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight)
    assert torch.equal(torch.get_rng_state(), state)


# ---- bad input -----------------------------------------------------------------------------------------------------


def test_row_without_counted_tokens_is_exactly_zero(model):
    p, pm, c, cm = _batch()
    pm[1] = False  # all-padding prompt row ...
    cm[1] = False  # ... and nothing counted
    with torch.no_grad():
        for scheme in ("mask_count", "uniform_t"):
            est = elbo(model, p, pm, c, cm, num_draws=4, generator=0, scheme=scheme)
            assert torch.isfinite(est.per_draw).all()
            assert (est.per_draw[1] == 0).all() and est.estimate[1] == 0
            assert (est.estimate[[0, 2]] < 0).all()
    assert est.num_rows <= 8  # the empty row costs no forward rows


def test_bad_inputs_raise_clear_errors(model):
    p, pm, c, cm = _batch()
    with pytest.raises(ValueError, match="empty"):
        elbo(model, p, pm, c[:, :0], cm[:, :0], num_draws=2, generator=0)
    for K in (0, -1, 1.5):
        with pytest.raises(ValueError, match="num_draws"):
            elbo(model, p, pm, c, cm, num_draws=K, generator=0)
    with pytest.raises(ValueError, match="even"):
        elbo(model, p, pm, c, cm, num_draws=3, generator=0, antithetic=True)
    long_c = torch.full((3, 260), 9)
    with pytest.raises(ValueError, match="max_sequence_length=256"):
        elbo(model, p, pm, long_c, torch.ones_like(long_c, dtype=torch.bool), num_draws=1, generator=0)
    with pytest.raises(ValueError, match="scheme"):
        elbo(model, p, pm, c, cm, num_draws=2, generator=0, scheme="linear")
    with pytest.raises(ValueError, match="completion_mask"):
        elbo(model, p, pm, c, cm[:, :3], num_draws=2, generator=0)
    with pytest.raises(TypeError, match="Generator"):
        elbo(model, p, pm, c, cm, num_draws=2, generator=None)
    other = draw_masks(torch.ones_like(cm), 2, 0)
    with pytest.raises(ValueError, match="outside completion_mask"):
        elbo_from_draws(model, p, pm, c, cm, other)
