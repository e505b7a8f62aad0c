"""Coupled / antithetic / independent log-ratio ℓ = ELBO_a − ELBO_b between a model and its FP8 copy."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.likelihood.ratio import (
    LOG_RATIO_ESTIMATORS,
    antithetic_log_ratio,
    coupled_log_ratio,
    independent_log_ratio,
)
from dllm_ais.models.tiny import tiny_model

MIN_FACTOR = 5.0  # asserted; measured ≈ 20-25x on the tiny default with quantize_model(backend="torch")


def fp8_copy(model):
    """quantize_model(model) when dllm_ais.fp8 is there; else a copy whose Linear weights are perturbed by ~3%."""
    try:
        from dllm_ais.fp8 import quantize_model
    except ImportError:
        import copy

        out, g = copy.deepcopy(model), torch.Generator().manual_seed(99)
        head = out.get_output_embeddings()
        with torch.no_grad():
            for m in out.modules():
                if isinstance(m, torch.nn.Linear) and m is not head:
                    m.weight.mul_(1 + 0.03 * torch.randn(m.weight.shape, generator=g))
        return out
    return quantize_model(model, backend="torch")


@pytest.fixture(scope="module")
def models():
    model = tiny_model(seed=0)
    return model, fp8_copy(model)


def _batch(B=4, P=8, L=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(5, 100, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    prompt_mask[0, :3] = False
    completion_ids = torch.randint(5, 100, (B, L), generator=g)
    completion_mask = torch.ones(B, L, dtype=torch.bool)
    completion_mask[1, 10:] = False
    return prompt_ids, prompt_mask, completion_ids, completion_mask


@pytest.mark.parametrize("scheme", ["mask_count", "uniform_t"])
def test_identical_models_give_exactly_zero(models, scheme):
    model, _ = models
    with torch.no_grad():
        for fn in (coupled_log_ratio, antithetic_log_ratio):
            est = fn(model, model, *_batch(), num_draws=4, generator=0, scheme=scheme, batch_size=5)
            assert torch.equal(est.log_ratio, torch.zeros_like(est.log_ratio))
            assert torch.equal(est.per_draw, torch.zeros_like(est.per_draw))
            assert 0 < est.num_rows <= 2 * 4 * 4 and (est.num_rows == 32 or scheme == "uniform_t")
        ind = independent_log_ratio(model, model, *_batch(), num_draws=4, generator=0, scheme=scheme)
    assert (ind.log_ratio != 0).any()  # independent draws do not cancel


def test_record_parts_are_consistent(models):
    with torch.no_grad():
        est = coupled_log_ratio(*models, *_batch(), num_draws=3, generator=1)
    assert est.log_ratio.shape == (4,) and est.per_draw.shape == (4, 3)
    torch.testing.assert_close(est.log_ratio, est.elbo_a - est.elbo_b)
    torch.testing.assert_close(est.log_ratio, est.per_draw.mean(-1))
    assert est.num_rows == 2 * 4 * 3


def test_coupled_std_is_far_below_independent_at_equal_forward_passes(models):
    """Both cost 2 models × K rows per sequence; std of ℓ over R replicates, averaged over sequences."""
    R, K, B = 16, 2, 4
    batch = [t.repeat(R, 1) for t in _batch(B)]
    with torch.no_grad():
        std = {name: LOG_RATIO_ESTIMATORS[name](*models, *batch, num_draws=K, generator=3, batch_size=512)
               .log_ratio.view(R, B).std(0).mean().item() for name in ("independent", "coupled")}
    factor = std["independent"] / std["coupled"]
    print(f"\nstd(ℓ) independent={std['independent']:.4g} coupled={std['coupled']:.4g} factor={factor:.1f}x (K={K})")
    assert std["coupled"] > 0  # the FP8 copy really differs
    assert factor > MIN_FACTOR


def test_same_seed_same_result_and_global_rng_untouched(models):
    state = torch.get_rng_state()
    with torch.no_grad():
        for fn in LOG_RATIO_ESTIMATORS.values():
            a = fn(*models, *_batch(), num_draws=2, generator=torch.Generator().manual_seed(5))
            b = fn(*models, *_batch(), num_draws=2, generator=5)
            assert torch.equal(a.per_draw, b.per_draw)
    assert torch.equal(torch.get_rng_state(), state)


def test_bad_inputs(models):
    p, pm, c, cm = _batch()
    with pytest.raises(ValueError, match="num_draws"):
        coupled_log_ratio(*models, p, pm, c, cm, num_draws=0, generator=0)
    with pytest.raises(ValueError, match="even"):
        antithetic_log_ratio(*models, p, pm, c, cm, num_draws=3, generator=0)
    with pytest.raises(ValueError, match="empty"):
        independent_log_ratio(*models, p, pm, c[:, :0], cm[:, :0], num_draws=1, generator=0)
    other = tiny_model(seed=0, mask_token_id=5)
    with pytest.raises(ValueError, match="disagree"):
        coupled_log_ratio(models[0], other, p, pm, c, cm, num_draws=1, generator=0)
    cm[2] = False  # a row with nothing counted: ℓ = 0 exactly, no NaN
    with torch.no_grad():
        est = coupled_log_ratio(*models, p, pm, c, cm, num_draws=2, generator=0)
    assert est.log_ratio[2] == 0 and torch.isfinite(est.log_ratio).all()
