"""Rung 1's scale-free metric (analysis/estimator_best_step.py) against a brute-force minimum over the step size."""

from __future__ import annotations

import torch

from dllm_ais.analysis.estimator_best_step import METRIC, best_step_ranking, rel_mse_best_step, with_best_step


def _fields(draws: torch.Tensor, g_star: torch.Tensor) -> dict:
    """The exact fields rung 1 stores, for an estimator that takes each row of `draws` with equal probability."""
    m = draws.mean(0)
    var = ((draws - m) ** 2).sum(1).mean()
    bias_sq = ((m - g_star) ** 2).sum()
    return {"mean_norm_sq": float(m @ m), "trace_var": float(var), "bias_sq": float(bias_sq),
            "mse": float(bias_sq + var), "cos_g_star": float(m @ g_star / (m.norm() * g_star.norm())), "rows": 1.0}


def _brute_rel(draws: torch.Tensor, g_star: torch.Tensor) -> float:
    cs = torch.linspace(-3.0, 3.0, 600_001, dtype=torch.float64)
    # E‖c ĝ − g*‖² = c² E‖ĝ‖² − 2 c E ĝ·g* + ‖g*‖², a parabola in c evaluated on the grid
    a, b, g2 = (draws ** 2).sum(1).mean(), (draws @ g_star).mean(), g_star @ g_star
    return float((cs ** 2 * a - 2 * cs * b + g2).min() / g2)


def test_the_closed_form_is_the_minimum_over_the_step_size_and_ignores_the_scale():
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        g_star = torch.randn(6, generator=gen, dtype=torch.float64)
        draws = 0.4 * g_star + 0.3 * torch.randn(7, 6, generator=gen, dtype=torch.float64)
        rel = rel_mse_best_step(_fields(draws, g_star))
        assert 0.0 < rel < 1.0
        assert abs(rel - _brute_rel(draws, g_star)) < 1e-6
        assert abs(rel_mse_best_step(_fields(5.0 * draws, g_star)) - rel) < 1e-12


def test_a_shrunk_estimator_wins_the_mse_but_not_the_best_step_ranking():
    gen = torch.Generator().manual_seed(1)
    models = []
    for _ in range(5):
        g_star = torch.randn(8, generator=gen, dtype=torch.float64)
        g_star = 2.0 * g_star / g_star.norm()
        noise = torch.randn(16, 8, generator=gen, dtype=torch.float64)
        noise = noise - noise.mean(0)  # both means exact: g* and 0.3 g*
        wide = g_star + 1.0 * noise           # unbiased, noisy
        shrunk = 0.3 * (g_star + 1.4 * noise)  # a worse direction, shrunk: a small MSE by being small
        models.append(with_best_step({"wide": {"1": _fields(wide, g_star)}, "shrunk": {"1": _fields(shrunk, g_star)}}))
    assert all(m["shrunk"]["1"]["mse"] < m["wide"]["1"]["mse"] for m in models)
    assert all(m["wide"]["1"][METRIC] < m["shrunk"]["1"][METRIC] for m in models)
    r = best_step_ranking(models, 1.0, list(range(5)))
    assert r["winner"] == "wide" and r["wins"]["wide"] == 5 and r["robust"]
    assert r["paired"]["shrunk"]["mean"] > 0


def test_an_estimator_with_zero_mean_and_variance_is_no_better_than_no_step():
    assert rel_mse_best_step({"mean_norm_sq": 0.0, "trace_var": 0.0, "cos_g_star": 0.0}) == 1.0
