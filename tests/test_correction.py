"""Mismatch corrections and the AIS diagnostics (dllm_ais/rl/correction.py, DESIGN.md §4, docs/ais.md)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_ais.rl import config as rl_config
from dllm_ais.rl import correction as C
from dllm_ais.rl.config import CorrectionConfig, GRPOConfig
from dllm_ais.rl.correction import correct
from dllm_ais.rl.grpo import grpo_loss

LN2 = math.log(2.0)
NAN, INF = float("nan"), float("inf")
METHODS = ("none", "is", "tis", "mis", "band", "ais")
LEVELS = ("sequence", "token")
LOSS_TYPES = ("grpo", "dr_grpo", "bnpo", "dapo")


def _close(actual: torch.Tensor, expected: float, tol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------- hand-computed batches

def test_sequence_level_hand_computed():
    """Four counted sequences plus one empty one (NaN log-weight and advantage) that must be ignored.

    ℓ = [0, ln2, −ln2, ln4], L = [2, 2, 4, 4], Â = [1, −1, 1, −1], C = 2, τ = 0.3125.
    w  = [1, 2, 0.5, 4]               w̃ = min(w, 2) = [1, 2, 0.5, 2]
    R  = (1+2+0.5+2)² / (4 · (1+4+0.25+4)) = 5.5² / (4 · 9.25) = 30.25 / 37
    D  = (0/2 + ln2/2 + ln2/4 + 2ln2/4) / 4 = 1.25 ln2 / 4 = 0.3125 ln2  ->  D/τ = ln2  ->  s = 1 − 1/2 = 1/2
    Var(Â) = 1 (mean 0, every |Â| = 1)
    w̃Â = [1, −2, 0.5, −2], mean −0.625, deviations [1.625, −1.375, 1.125, −1.375],
         squares [2.640625, 1.890625, 1.265625, 1.890625], sum 7.6875, Var = 7.6875/4 = 123/64
    V  = 123/64  ->  g = 64/123
    λ  = 1/2 · 30.25/37 · 64/123 = 968 / 4551
    trunc_frac = 1/4 (only w = 4 > 2; w = 2 is not truncated)
    ω  = 1 + λ(w̃ − 1) = [1, 1 + λ, 1 − λ/2, 1 + λ] and 1 for the empty sequence
    mismatch/kl = −mean(ℓ/L) = −(0 + ln2/2 − ln2/4 + ln2/2)/4 = −0.1875 ln2
    mismatch/k3 = mean((w − 1 − ℓ)/L) = (0 + (1 − ln2)/2 + (ln2 − 0.5)/4 + (3 − 2ln2)/4)/4 = 0.28125 − 0.1875 ln2
    """
    log_w = torch.tensor([0.0, LN2, -LN2, 2 * LN2, NAN], dtype=torch.float64)
    lengths = torch.tensor([2, 2, 4, 4, 0])
    mask = torch.arange(4)[None, :] < lengths[:, None]  # [5, 4]
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, NAN], dtype=torch.float64)
    out = correct(log_w, adv, mask, CorrectionConfig(correction="ais", ais_tau=0.3125))

    lam = 968 / 4551
    _close(out.ess_frac, 30.25 / 37)
    _close(out.divergence, 0.3125 * LN2)
    _close(out.severity, 0.5)
    _close(out.var_amp, 123 / 64)
    _close(out.damping, 64 / 123)
    _close(out.lam, lam)
    _close(out.lam_batch, lam)
    _close(out.trunc_frac, 0.25)
    _close(out.mismatch_kl, -0.1875 * LN2)
    _close(out.mismatch_k3, 0.28125 - 0.1875 * LN2)
    _close(out.log_w_min, -LN2)
    _close(out.log_w_max, 2 * LN2)
    _close(out.log_w_mean, 2 * LN2 / 4)
    torch.testing.assert_close(out.omega, torch.tensor([1, 1 + lam, 1 - lam / 2, 1 + lam, 1], dtype=torch.float64))


def test_token_level_hand_computed_with_garbage_padding():
    """Per-token log-weights; padded positions hold NaN and +inf and must not count.

    mask = [[1, 1, 0], [1, 0, 0]], ℓ (valid) = [ln2, 0 | −ln2], Â = [1, −1] -> per-token Â = [1, 1, −1], τ = 2/3.
    w̃ = [2, 1, 0.5] (nothing exceeds C = 2, trunc_frac = 0)
    R = 3.5² / (3 · (4 + 1 + 0.25)) = 12.25 / 15.75 = 7/9
    D = (ln2 + 0 + ln2) / 3 = 2 ln2 / 3  ->  D/τ = ln2  ->  s = 1/2
    Var(Â) = mean([1,1,1]) − mean(Â)² = 1 − 1/9 = 8/9
    w̃Â = [2, 1, −0.5], mean 5/6, E[(w̃Â)²] = (4 + 1 + 0.25)/3 = 7/4, Var = 7/4 − 25/36 = 38/36 = 19/18
    V = (19/18) / (8/9) = 19/16  ->  g = 16/19
    λ = 1/2 · 7/9 · 16/19 = 56/171
    mismatch/kl = −(ln2 + 0 − ln2)/3 = 0;  mismatch/k3 = ((1 − ln2) + 0 + (ln2 − 0.5))/3 = 1/6
    """
    log_w = torch.tensor([[LN2, 0.0, NAN], [-LN2, INF, NAN]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    out = correct(log_w, adv, mask, CorrectionConfig(correction="ais", correction_level="token", ais_tau=2 / 3))

    lam = 56 / 171
    _close(out.ess_frac, 7 / 9)
    _close(out.divergence, 2 * LN2 / 3)
    _close(out.severity, 0.5)
    _close(out.var_amp, 19 / 16)
    _close(out.lam, lam)
    _close(out.trunc_frac, 0.0)
    _close(out.mismatch_kl, 0.0)
    _close(out.mismatch_k3, 1 / 6)
    _close(out.log_w_min, -LN2)
    _close(out.log_w_max, LN2)
    expected = torch.tensor([[1 + lam, 1, 1], [1 - lam / 2, 1, 1]], dtype=torch.float64)
    torch.testing.assert_close(out.omega, expected)


def test_damping_is_one_when_is_shrinks_variance():
    """ℓ = [−ln2, −ln2], L = [1, 1], Â = [1, −1], τ = ln2.

    w̃ = [0.5, 0.5] -> R = 1² / (2 · 0.5) = 1;  D = ln2 -> s = 1 − e^{−1}
    w̃Â = [0.5, −0.5]: Var = 0.25, Var(Â) = 1 -> V = 0.25 < 1 -> g = min(1, 4) = 1;  λ = 1 − e^{−1}
    """
    mask = torch.ones(2, 1, dtype=torch.bool)
    out = correct(torch.tensor([-LN2, -LN2], dtype=torch.float64), torch.tensor([1.0, -1.0], dtype=torch.float64),
                  mask, CorrectionConfig(ais_tau=LN2))
    _close(out.ess_frac, 1.0)
    _close(out.var_amp, 0.25)
    _close(out.damping, 1.0)
    _close(out.lam, 1 - math.exp(-1))


def test_baseline_weights_hand_computed():
    """ℓ = [ln3, ln1.5, −ln2, ln2], C = 2: w = [3, 1.5, 0.5, 2].

    is: ω = w = [3, 1.5, 0.5, 2];  tis: ω = min(w, 2) = [2, 1.5, 0.5, 2];  mis: drop w > 2 -> [0, 1.5, 0.5, 2];
    none: [1, 1, 1, 1].
    """
    log_w = torch.tensor([math.log(3), math.log(1.5), -LN2, LN2], dtype=torch.float64)
    mask = torch.ones(4, 3, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    expected = {"none": [1, 1, 1, 1], "is": [3, 1.5, 0.5, 2], "tis": [2, 1.5, 0.5, 2], "mis": [0, 1.5, 0.5, 2]}
    for method, values in expected.items():
        out = correct(log_w, adv, mask, CorrectionConfig(correction=method))
        torch.testing.assert_close(out.omega, torch.tensor(values, dtype=torch.float64))
        _close(out.trunc_frac, 0.25)


def test_severity_combiner_hand_computed():
    """The sequence example under ais_combiner='severity': λ = s · g = 1/2 · 64/123 = 32/123 (R = 30.25/37 left
    out, so λ is larger than product's 968/4551 by 1/R), and ω mixes towards the same truncated weights."""
    log_w = torch.tensor([0.0, LN2, -LN2, 2 * LN2], dtype=torch.float64)
    mask = torch.arange(4)[None, :] < torch.tensor([2, 2, 4, 4])[:, None]
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    out = correct(log_w, adv, mask, CorrectionConfig(correction="ais", ais_tau=0.3125, ais_combiner="severity"))
    _close(out.ess_frac, 30.25 / 37)
    _close(out.lam, 32 / 123)
    torch.testing.assert_close(out.omega, 1 + 32 / 123 * (torch.tensor([1, 2, 0.5, 2], dtype=torch.float64) - 1))
    s, r, g = (torch.tensor(v, dtype=torch.float64) for v in (0.9, 0.2, 1.0))
    _close(C.combine_product(s, r, g), 0.18)  # at a low ESS, product backs off; severity does not
    _close(C.combine_severity(s, r, g), 0.9)


def test_ema_hand_computed_and_stateless():
    """β = 0.5, previous λ = 0.8, batch λ = 968/4551 (sequence example): λ = 0.5 · 0.8 + 0.5 · 968/4551."""
    log_w = torch.tensor([0.0, LN2, -LN2, 2 * LN2], dtype=torch.float64)
    mask = torch.arange(4)[None, :] < torch.tensor([2, 2, 4, 4])[:, None]
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    cfg = CorrectionConfig(ais_tau=0.3125, ais_ema=0.5)
    first = correct(log_w, adv, mask, cfg)  # no previous λ: the batch value
    _close(first.lam, 968 / 4551)
    second = correct(log_w, adv, mask, cfg, prev_lam=torch.tensor(0.8, dtype=torch.float64))
    lam = 0.4 + 0.5 * 968 / 4551
    _close(second.lam, lam)
    _close(second.lam_batch, 968 / 4551)
    torch.testing.assert_close(second.omega, 1 + lam * (torch.tensor([1, 2, 0.5, 2], dtype=torch.float64) - 1))
    again = correct(log_w, adv, mask, cfg)  # no hidden state carried between calls
    assert torch.equal(again.lam, first.lam)


# ------------------------------------------------------------------------------------ BF16 rollouts: bit-exact GRPO

def _grpo_inputs(level: str, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    b, l, v = 4, 6, 5
    logits = torch.randn(b, l, v, generator=gen, dtype=dtype)
    tokens = torch.randint(0, v, (b, l), generator=gen)
    lengths = torch.tensor([6, 3, 1, 0])
    mask = torch.arange(l)[None, :] < lengths[:, None]  # [B, L], last sequence empty
    logp_old = (logits + 0.1 * torch.randn(b, l, v, generator=gen, dtype=dtype)).log_softmax(-1)
    logp_old = logp_old.gather(-1, tokens[..., None])[..., 0]
    logp_old = torch.where(mask, logp_old, NAN)  # garbage in padding
    logp_ref = torch.where(mask, logp_old + 0.2 * torch.randn(b, l, generator=gen, dtype=dtype), NAN)
    adv = torch.randn(b, generator=gen, dtype=dtype)
    log_w_shape = (b,) if level == "sequence" else (b, l)
    return logits, tokens, mask, logp_old, logp_ref, adv, log_w_shape, gen


def _loss_and_grad(logits, tokens, mask, logp_old, logp_ref, adv, cfg, weights):
    theta = logits.clone().requires_grad_(True)
    logp = theta.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]  # [B, L]
    logp = torch.where(mask, logp, NAN)  # NaN padding in the differentiable input too
    out = grpo_loss(logp, logp_old, adv, mask, cfg, weights=weights, logp_ref=logp_ref)
    (grad,) = torch.autograd.grad(out.loss, theta)
    return out.loss.detach(), grad


@pytest.mark.parametrize("level", LEVELS)
def test_zero_log_weights_give_identity(level):
    _, _, mask, _, _, adv, shape, _ = _grpo_inputs(level)
    log_w = torch.zeros(shape)
    log_w = torch.where(mask if level == "token" else mask.any(-1), log_w, NAN)  # NaN where not counted
    for method in METHODS:
        out = correct(log_w, adv, mask, CorrectionConfig(correction=method, correction_level=level))
        assert torch.equal(out.omega, torch.ones(shape)), method
        assert out.ess_frac.item() == 1.0 and out.divergence.item() == 0.0 and out.lam.item() == 0.0
        assert out.var_amp.item() == 1.0 and out.trunc_frac.item() == 0.0
        assert out.mismatch_kl.item() == 0.0 and out.mismatch_k3.item() == 0.0


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("is_level", ("token", "sequence"))
def test_bf16_rollouts_match_plain_grpo_bit_for_bit(level, loss_type, is_level):
    logits, tokens, mask, logp_old, logp_ref, adv, shape, _ = _grpo_inputs(level)
    cfg = GRPOConfig(loss_type=loss_type, importance_sampling_level=is_level, beta=0.04, max_completion_length=8)
    plain_loss, plain_grad = _loss_and_grad(logits, tokens, mask, logp_old, logp_ref, adv, cfg, None)
    assert torch.isfinite(plain_loss) and plain_grad.abs().sum() > 0
    for method in METHODS:
        omega = correct(torch.zeros(shape), adv, mask, CorrectionConfig(correction=method, correction_level=level))
        loss, grad = _loss_and_grad(logits, tokens, mask, logp_old, logp_ref, adv, cfg, omega.omega)
        assert torch.equal(loss, plain_loss), method
        assert torch.equal(grad, plain_grad), method


# --------------------------------------------------------------------------------------- gradient interpolation

@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("is_level, beta", [("token", 0.0), ("sequence", 0.05)])
def test_ais_gradient_interpolates_none_and_tis(level, loss_type, is_level, beta):
    logits, tokens, mask, logp_old, logp_ref, adv, shape, gen = _grpo_inputs(level, torch.float64, seed=1)
    log_w = torch.randn(shape, generator=gen, dtype=torch.float64) * (0.8 if level == "sequence" else 0.5)
    tau = 0.3 if level == "sequence" else 0.5
    cfg = GRPOConfig(loss_type=loss_type, importance_sampling_level=is_level, beta=beta, max_completion_length=8)
    outs = {m: correct(log_w, adv, mask, CorrectionConfig(correction=m, correction_level=level, ais_tau=tau))
            for m in ("none", "tis", "ais")}
    lam = outs["ais"].lam
    assert 0.05 < lam.item() < 0.95  # the identity below is not a trivial endpoint
    grads = {m: _loss_and_grad(logits, tokens, mask, logp_old, logp_ref, adv, cfg, o.omega)[1]
             for m, o in outs.items()}
    assert not torch.allclose(grads["none"], grads["tis"])
    torch.testing.assert_close(grads["ais"], (1 - lam) * grads["none"] + lam * grads["tis"], rtol=1e-10,
                               atol=1e-12)


# --------------------------------------------------------------------------------------------- edge cases

def test_single_sequence_has_neutral_variance_ratio():
    """B = 1: Var(Â) = 0, so V := 1, g = 1, R = 1 (one weight) and λ = s = 1 − exp(−|ℓ|/(L τ)).

    ℓ = 0.5, L = 5, τ = 0.1: D = 0.1, s = 1 − e^{−1}.
    """
    mask = torch.ones(1, 5, dtype=torch.bool)
    out = correct(torch.tensor([0.5], dtype=torch.float64), torch.tensor([0.7], dtype=torch.float64), mask,
                  CorrectionConfig(ais_tau=0.1))
    _close(out.var_amp, 1.0)
    _close(out.ess_frac, 1.0)
    _close(out.lam, 1 - math.exp(-1))
    _close(out.omega[0], 1 + (1 - math.exp(-1)) * (math.exp(0.5) - 1))


def test_all_equal_rewards_define_v_as_one():
    """All-equal rewards -> Â ≡ 0 -> V := 1 and λ = s · R (weights [e^{0.3}, e^{−0.3}], so R < 1)."""
    from dllm_ais.rl.advantages import group_advantages

    adv = group_advantages(torch.full((4,), 0.3), num_generations=4).adv
    assert torch.equal(adv, torch.zeros(4))
    mask = torch.ones(4, 3, dtype=torch.bool)
    log_w = torch.tensor([0.3, -0.3, 0.3, -0.3])
    out = correct(log_w, adv, mask, CorrectionConfig(ais_tau=0.1))
    w = torch.tensor([math.exp(0.3), math.exp(-0.3)] * 2)
    r = w.sum() ** 2 / (4 * (w * w).sum())
    assert out.var_amp.item() == 1.0
    assert out.ess_frac.item() < 1.0
    torch.testing.assert_close(out.lam, (1 - math.exp(-1.0)) * r)  # D = 0.3/3 = 0.1 = τ


@pytest.mark.parametrize("level", LEVELS)
def test_empty_mask(level):
    mask = torch.zeros(3, 4, dtype=torch.bool)
    shape = (3,) if level == "sequence" else (3, 4)
    log_w = torch.full(shape, NAN)
    adv = torch.tensor([1.0, NAN, -1.0])
    for method in METHODS:
        out = correct(log_w, adv, mask, CorrectionConfig(correction=method, correction_level=level))
        assert torch.equal(out.omega, torch.ones(shape))
        metrics = out.metrics()
        assert metrics["ais/lambda"] == 0.0 and metrics["ais/ess_frac"] == 1.0 and metrics["ais/var_amp"] == 1.0
        assert all(math.isfinite(v) for v in metrics.values())
    theta = torch.zeros(3, 4, requires_grad=True)
    loss = grpo_loss(theta + log_w.new_full((3, 4), NAN), torch.zeros(3, 4), adv, mask, GRPOConfig(),
                     weights=out.omega).loss
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(theta.grad, torch.zeros(3, 4))


def test_bfloat16_log_weights_give_float32_weights():
    log_w = torch.tensor([0.5, -0.25], dtype=torch.bfloat16)
    out = correct(log_w, torch.tensor([1.0, -1.0]), torch.ones(2, 3, dtype=torch.bool), CorrectionConfig())
    assert out.omega.dtype == torch.float32
    torch.testing.assert_close(out.log_w_max, torch.tensor(0.5))


_SPECIAL = st.sampled_from([0.0, 1e4, -1e4, INF, -INF, 20.0, -20.0, 60.0, -60.0, 1e-30])
_VALUE = st.one_of(st.floats(-50, 50, allow_nan=False), _SPECIAL)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), b=st.integers(1, 4), l=st.integers(1, 5), level=st.sampled_from(LEVELS),
       cap=st.sampled_from([1.0, 2.0, 5.0]), tau=st.sampled_from([1e-3, 0.01, 1.0]))
def test_outputs_bounded_for_any_log_weights(data, b, l, level, cap, tau):
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=l, max_size=l), min_size=b,
                                           max_size=b)))
    shape = (b,) if level == "sequence" else (b, l)
    n = b if level == "sequence" else b * l
    log_w = torch.tensor(data.draw(st.lists(_VALUE, min_size=n, max_size=n))).reshape(shape)
    valid = mask.any(-1) if level == "sequence" else mask
    log_w = torch.where(valid, log_w, NAN)
    adv = torch.tensor(data.draw(st.lists(st.floats(-3, 3), min_size=b, max_size=b)))
    logp_old = torch.where(mask, -1.0, NAN)
    for method in METHODS:
        out = correct(log_w, adv, mask, CorrectionConfig(correction=method, correction_level=level, is_cap=cap,
                                                         ais_tau=tau))
        assert 0.0 <= out.lam.item() <= 1.0
        assert 0.0 < out.ess_frac.item() <= 1.0
        assert torch.isfinite(out.omega).all() and (out.omega >= 0).all()
        assert all(math.isfinite(v) for v in out.metrics().values())
        theta = torch.zeros(b, l, requires_grad=True)
        loss = grpo_loss(torch.where(mask, theta - 1.0, NAN), logp_old, adv, mask, GRPOConfig(),
                         weights=out.omega).loss
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(theta.grad).all()


# ------------------------------------------------------------------------------------------ interface and config

def test_metric_names_follow_design():
    out = correct(torch.tensor([0.1, -0.2]), torch.tensor([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool),
                  CorrectionConfig())
    metrics = out.metrics()
    required = {"ais/lambda", "ais/ess_frac", "ais/divergence", "ais/var_amp", "ais/trunc_frac", "ais/log_w_mean",
                "ais/log_w_min", "ais/log_w_max", "mismatch/kl", "mismatch/k3"}
    assert required <= set(metrics)
    assert metrics["ais/ess_frac"] == out.ess_frac.item() and metrics["ais/lambda"] == out.lam.item()
    assert metrics["ais/log_w_min"] == pytest.approx(-0.2) and metrics["ais/log_w_max"] == pytest.approx(0.1)


def test_config_names_match_implementations():
    assert set(rl_config.CORRECTIONS) == set(C.CORRECTIONS)
    assert set(rl_config.AIS_COMBINERS) == set(C.COMBINERS)


def test_shape_errors():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="correction_level='token'"):
        correct(torch.zeros(2, 4), torch.zeros(2), mask, CorrectionConfig(correction_level="sequence"))
    with pytest.raises(ValueError, match="correction_level='sequence'"):
        correct(torch.zeros(2), torch.zeros(2), mask, CorrectionConfig(correction_level="token"))
    with pytest.raises(ValueError, match="adv"):
        correct(torch.zeros(2), torch.zeros(3), mask, CorrectionConfig())


@pytest.mark.parametrize("kwargs, fragment", [
    ({"correction": "cis"}, "correction='cis'"),
    ({"correction_level": "batch"}, "correction_level"),
    ({"is_cap": 0.5}, "is_cap"),
    ({"is_cap": INF}, "is_cap"),
    ({"ais_tau": 0.0}, "ais_tau"),
    ({"ais_ema": 1.0}, "ais_ema"),
    ({"log_w_clamp": -1.0}, "log_w_clamp"),
    ({"ais_combiner": "sum"}, "ais_combiner"),
])
def test_correction_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        CorrectionConfig(**kwargs)
