"""The default correction on log-weights with 2 < |ℓ| < 20 (inside the default clamp ±20, outside a clamp of ±2):
ω and the diagnostics computed by hand from docs/ais.md's formulas, with every default of CorrectionConfig
(AIS towards TIS, sequence level, C = 2, τ = 0.1, product combiner, log_w_clamp = 20)."""

from __future__ import annotations

import math

import torch

from dllm_ais.rl.config import CorrectionConfig
from dllm_ais.rl.correction import correct


def test_default_config_weights_by_hand():
    cfg = CorrectionConfig()
    ell = [-5.0, 3.0, 0.5]  # sequence log-weights; lengths 10, 10, 5
    lengths = [10, 10, 5]
    adv = [1.0, -1.0, 0.5]
    mask = torch.tensor([[True] * n + [False] * (10 - n) for n in lengths])
    out = correct(torch.tensor(ell, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64), mask, cfg)

    C, tau = 2.0, 0.1
    w = [math.exp(x) for x in ell]  # no clamp reached at ±20
    wt = [min(x, C) for x in w]  # truncated weights
    R = sum(wt) ** 2 / (3 * sum(x * x for x in wt))  # ESS fraction
    D = sum(abs(x) / n for x, n in zip(ell, lengths, strict=True)) / 3  # mean per-token |ℓ|
    s = 1 - math.exp(-D / tau)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    var = lambda v: mean([(x - mean(v)) ** 2 for x in v])  # noqa: E731
    V = var([a * x for a, x in zip(adv, wt, strict=True)]) / var(adv)
    g = min(1.0, 1 / V)
    lam = min(max(s * R * g, 0.0), 1.0)
    omega = [(1 - lam) + lam * min(x, C) for x in w]

    assert math.isclose(float(out.lam), lam, rel_tol=1e-9), (float(out.lam), lam)
    assert torch.allclose(out.omega, torch.tensor(omega, dtype=torch.float64), rtol=1e-9, atol=0), (out.omega, omega)
    assert math.isclose(float(out.log_w_min), -5.0) and math.isclose(float(out.log_w_max), 3.0)
    assert math.isclose(float(out.divergence), D, rel_tol=1e-9)
    assert 0.05 < lam < 0.95 and omega[0] < 0.7  # the case really exercises the weights


def test_bad_tau_error_states_the_real_default():
    import pytest

    with pytest.raises(ValueError, match=rf"\(default {CorrectionConfig().ais_tau}\)"):
        CorrectionConfig(ais_tau=0.0)
    assert CorrectionConfig().ais_tau == 0.1
