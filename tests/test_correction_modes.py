"""The verl / TRL / IcePop correction modes, divergence rejection, weight normalisation and AIS targets
(dllm_ais/rl/correction.py, dllm_ais/rl/mismatch_stats.py, docs/corrections.md): hand-worked values and invariants."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_ais.rl.config import AIS_TARGETS, CorrectionConfig, GRPOConfig, parse_reject
from dllm_ais.rl.correction import correct
from dllm_ais.rl.grpo import grpo_loss
from dllm_ais.rl.mismatch_stats import k1, k2, k3, reject_keep, rollout_diagnostics

LN = math.log
NAN = float("nan")
D = torch.float64


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=D)


def _seq_batch():
    """Five sequences of two counted tokens with weights w = 0.25, 0.5, 1, 4, 6; Â alternating."""
    log_w = _t([LN(0.25), LN(0.5), 0.0, LN(4.0), LN(6.0)])
    mask = torch.ones(5, 2, dtype=torch.bool)
    adv = _t([1.0, -1.0, 1.0, -1.0, 0.5])
    return log_w, adv, mask


# ------------------------------------------------------------------------------------------------ modes, by hand

@pytest.mark.parametrize("kwargs, omega, above, below", [
    ({"correction": "none"}, [1, 1, 1, 1, 1], 2 / 5, 0.0),
    ({"correction": "is"}, [0.25, 0.5, 1, 4, 6], 2 / 5, 0.0),
    ({"correction": "tis"}, [0.25, 0.5, 1, 2, 2], 2 / 5, 0.0),
    ({"correction": "mis"}, [0.25, 0.5, 1, 0, 0], 2 / 5, 0.0),
    ({"correction": "mis", "is_cap_min": 0.5}, [0, 0.5, 1, 0, 0], 2 / 5, 1 / 5),
    ({"correction": "band"}, [0, 0.5, 1, 4, 0], 1 / 5, 1 / 5),  # default band [0.5, 5]
    ({"correction": "band", "band_low": 0.2, "band_high": 4.0}, [0.25, 0.5, 1, 4, 0], 1 / 5, 0.0),
    ({"correction": "sequence_truncate"}, [0.25, 0.5, 1, 2, 2], 2 / 5, 0.0),
    ({"correction": "sequence_mask", "is_cap": 4.0, "is_cap_min": 0.3}, [0, 0.5, 1, 4, 0], 1 / 5, 1 / 5),
])
def test_sequence_modes_hand_computed(kwargs, omega, above, below):
    log_w, adv, mask = _seq_batch()
    out = correct(log_w, adv, mask, CorrectionConfig(**kwargs))
    torch.testing.assert_close(out.omega, _t(omega))
    torch.testing.assert_close(out.frac_above, _t(above))
    torch.testing.assert_close(out.frac_below, _t(below))
    assert out.reject_frac.item() == 0.0
    torch.testing.assert_close(out.omega_mean, _t(sum(omega) / 5))
    torch.testing.assert_close(out.omega_ess, _t(sum(omega) ** 2 / (5 * sum(o * o for o in omega))))


def test_trl_aliases_set_mode_and_level():
    assert (CorrectionConfig(correction="token_truncate").correction,
            CorrectionConfig(correction="token_truncate").correction_level) == ("tis", "token")
    assert CorrectionConfig(correction="token_mask").correction == "mis"
    cfg = CorrectionConfig(correction="sequence_mask", correction_level="token")
    assert (cfg.correction, cfg.correction_level) == ("mis", "sequence")


def test_token_band_hand_computed():
    log_w = torch.tensor([[LN(0.4), LN(2.0), NAN], [LN(6.0), 0.0, LN(5.0)]], dtype=D)  # NaN in padding
    mask = torch.tensor([[True, True, False], [True, True, True]])
    out = correct(log_w, _t([1.0, -1.0]), mask, CorrectionConfig(correction="band", correction_level="token"))
    torch.testing.assert_close(out.omega, _t([[0.0, 2.0, 1.0], [0.0, 1.0, 5.0]]))
    torch.testing.assert_close(out.frac_above, _t(1 / 5))
    torch.testing.assert_close(out.frac_below, _t(1 / 5))


def test_geometric_level_hand_computed():
    """ℓ̄_0 = (ln 2 + ln 8) / 2 = ln 4, ℓ̄_1 = (0 − ln 8 + 0) / 3 = −ln 2: w = [4, 0.5] per sequence."""
    log_w = torch.tensor([[LN(2.0), LN(8.0), NAN], [0.0, -LN(8.0), 0.0]], dtype=D)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = _t([1.0, -1.0])
    out = correct(log_w, adv, mask, CorrectionConfig(correction="is", correction_level="geometric"))
    torch.testing.assert_close(out.omega, _t([4.0, 0.5]))
    tis = correct(log_w, adv, mask, CorrectionConfig(correction="tis", correction_level="geometric"))
    torch.testing.assert_close(tis.omega, _t([2.0, 0.5]))
    torch.testing.assert_close(out.mismatch_kl, _t((-LN(4.0) + LN(2.0)) / 2))
    torch.testing.assert_close(out.divergence, _t((LN(4.0) + LN(2.0)) / 2))
    torch.testing.assert_close(out.log_w_max, _t(LN(4.0)))
    with pytest.raises(ValueError, match="geometric"):
        correct(_t([0.1, 0.2]), adv, mask, CorrectionConfig(correction_level="geometric"))


def test_sequence_level_accepts_token_log_weights_and_sums_them():
    log_w = torch.tensor([[0.1, 0.2, NAN], [0.3, -0.1, 0.05]], dtype=D)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = _t([1.0, -1.0])
    summed = correct(_t([0.3, 0.25]), adv, mask, CorrectionConfig(correction="is"))
    tokens = correct(log_w, adv, mask, CorrectionConfig(correction="is"))
    torch.testing.assert_close(tokens.omega, summed.omega)
    torch.testing.assert_close(tokens.lam, summed.lam)


# ------------------------------------------------------------------------------------------------------ rejection

def _reject_batch():
    """Three sequences of two tokens: r = (2, 1), (0.5, 1), (1.5, 1.5)."""
    log_w = _t([[LN(2.0), 0.0], [-LN(2.0), 0.0], [LN(1.5), LN(1.5)]])
    return log_w, torch.ones(3, 2, dtype=torch.bool), _t([1.0, -1.0, 0.5])


def test_divergence_statistics_hand_computed():
    lr = _t([LN(2.0), -LN(2.0), 0.0])
    torch.testing.assert_close(k1(lr), _t([-LN(2.0), LN(2.0), 0.0]))
    torch.testing.assert_close(k2(lr), _t([0.5 * LN(2.0) ** 2] * 2 + [0.0]))
    torch.testing.assert_close(k3(lr), _t([1 - LN(2.0), -0.5 + LN(2.0), 0.0]))


@pytest.mark.parametrize("spec, keep", [
    # k3 per token: (0.3069, 0), (0.1931, 0), (0.0945, 0.0945)
    ("k3:seq_sum:0.2", [False, True, True]),  # sums 0.307, 0.193, 0.189
    ("k3:seq_sum:0.15", [False, False, False]),
    ("k3:seq_mean:0.095", [False, False, True]),  # means 0.153, 0.0966, 0.0945
    ("k3:seq_max:0.15", [False, False, True]),  # maxima 0.307, 0.193, 0.0945
    ("k2:seq_mean:0.1", [False, False, True]),  # means 0.120, 0.120, 0.082
    ("k1:seq_sum:0.5", [True, False, True]),  # sums −0.693, 0.693, −0.811
])
def test_sequence_rejection_hand_computed(spec, keep):
    log_w, mask, adv = _reject_batch()
    cfg = CorrectionConfig(correction="none", correction_level="token", **parse_reject(spec))
    out = correct(log_w, adv, mask, cfg)
    expected = torch.tensor(keep, dtype=D)[:, None].expand(3, 2)
    torch.testing.assert_close(out.omega, expected)
    torch.testing.assert_close(out.reject_frac, _t(keep.count(False) / 3))


def test_token_rejection_under_a_sequence_weight_gives_token_weights():
    """k1 per token: (−0.69, 0), (0.69, 0), (−0.41, −0.41); threshold 0.3 rejects token (1, 0) only."""
    log_w, mask, adv = _reject_batch()
    cfg = CorrectionConfig(correction="tis", **parse_reject("k1:token:0.3"))
    out = correct(log_w.sum(-1), adv, mask, cfg, token_log_w=log_w)
    w = [2.0, 0.5, 2.0]  # sequence weights exp(Σ ℓ) = 2, 0.5, 2.25 truncated at 2
    torch.testing.assert_close(out.omega, _t([[w[0], w[0]], [0.0, w[1]], [w[2], w[2]]]))
    torch.testing.assert_close(out.reject_frac, _t(1 / 6))
    with pytest.raises(ValueError, match="token_log_w"):
        correct(log_w.sum(-1), adv, mask, cfg)


def test_reject_keep_skips_padding():
    lr = torch.tensor([[5.0, NAN], [NAN, NAN]], dtype=D)
    valid = torch.tensor([[True, False], [False, False]])
    assert reject_keep(lr, valid, "k2", "token", 1.0).tolist() == [[False, True], [True, True]]
    assert reject_keep(lr, valid, "k2", "seq_max", 1.0).tolist() == [False, True]


@pytest.mark.parametrize("spec, error", [
    ("k3:seq_mean", "STAT:AGG:THRESHOLD"), ("k3:seq_mean:x", "not a number"), ("k4:seq_mean:0.1", "reject_stat"),
    ("k3:batch:0.1", "reject_agg"), ("k3:token:-1", "reject_threshold"),
])
def test_reject_spec_errors(spec, error):
    with pytest.raises(ValueError, match=error):
        CorrectionConfig(**parse_reject(spec))


# -------------------------------------------------------------------------------------------------- normalisation

def test_normalisation_to_mean_one_skips_rejected_samples():
    log_w = _t([LN(0.5), 0.0, LN(4.0)])
    mask = torch.ones(3, 1, dtype=torch.bool)
    out = correct(log_w, _t([1.0, -1.0, 0.0]), mask, CorrectionConfig(correction="tis", normalize_weights=True))
    torch.testing.assert_close(out.omega, _t([0.5, 1.0, 2.0]) / (3.5 / 3))
    out = correct(log_w, _t([1.0, -1.0, 0.0]), mask,
                  CorrectionConfig(correction="tis", normalize_weights=True, **parse_reject("k1:seq_sum:0.5")),
                  token_log_w=log_w[:, None])
    # k1 = −ℓ: ℓ = ln 0.5 gives 0.69 > 0.5 (rejected); the kept weights 1, 2 have mean 1.5
    torch.testing.assert_close(out.omega, _t([0.0, 1.0, 2.0]) / 1.5)
    torch.testing.assert_close(out.omega_mean, _t(2 / 3))


def test_normalisation_of_all_zero_weights_stays_zero():
    out = correct(_t([LN(9.0), LN(10.0)]), _t([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool),
                  CorrectionConfig(correction="mis", normalize_weights=True))
    assert torch.equal(out.omega, _t([0.0, 0.0])) and out.omega_ess.item() == 0.0


# ---------------------------------------------------------------------------------------------------- AIS targets

def _loss_grad(weights, seed=0, loss_type="dapo"):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, 2, 4, generator=gen, dtype=D)
    tokens = torch.randint(0, 4, (5, 2), generator=gen)
    mask = torch.ones(5, 2, dtype=torch.bool)
    old = (logits + 0.1 * torch.randn(5, 2, 4, generator=gen, dtype=D)).log_softmax(-1)
    old = old.gather(-1, tokens[..., None])[..., 0]
    theta = logits.clone().requires_grad_(True)
    logp = theta.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    out = grpo_loss(logp, old, _seq_batch()[1], mask, GRPOConfig(loss_type=loss_type, max_completion_length=2),
                    weights=weights)
    return torch.autograd.grad(out.loss, theta)[0]


@pytest.mark.parametrize("target", AIS_TARGETS)
@pytest.mark.parametrize("loss_type", ["dapo", "tbpo"])
def test_ais_mixes_none_and_any_target(target, loss_type):
    log_w, adv, mask = _seq_batch()
    base = dict(ais_tau=2.0, ais_target=target)
    ais = correct(log_w, adv, mask, CorrectionConfig(correction="ais", **base))
    full = correct(log_w, adv, mask, CorrectionConfig(correction=target, **base))
    lam = ais.lam
    assert 0.05 < lam.item() < 0.95
    torch.testing.assert_close(ais.omega, (1 - lam) + lam * full.omega)
    g_none = _loss_grad(None, loss_type=loss_type)
    g_full = _loss_grad(full.omega, loss_type=loss_type)
    assert not torch.allclose(g_none, g_full)
    torch.testing.assert_close(_loss_grad(ais.omega, loss_type=loss_type), (1 - lam) * g_none + lam * g_full)


# --------------------------------------------------------------------------------------- invariant: μ = π_old

ALL_CONFIGS = [
    dict(correction=c, correction_level=lvl) for c in ("none", "is", "tis", "mis", "band", "ais")
    for lvl in ("sequence", "token", "geometric")
] + [
    dict(correction="ais", ais_target=t) for t in AIS_TARGETS
] + [
    dict(correction="token_truncate"), dict(correction="sequence_mask", is_cap_min=0.5),
    dict(correction="tis", normalize_weights=True), dict(correction="band", normalize_weights=True),
    dict(correction="tis", **parse_reject("k3:seq_mean:0.0")), dict(correction="none", **parse_reject("k1:token:0")),
    dict(correction="ais", correction_level="geometric", normalize_weights=True, **parse_reject("k2:seq_max:0")),
]


@pytest.mark.parametrize("kwargs", ALL_CONFIGS, ids=lambda k: "-".join(f"{v}" for v in k.values()))
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "tbpo"])
def test_every_mode_is_the_identity_when_mu_equals_pi_old(kwargs, loss_type):
    gen = torch.Generator().manual_seed(3)
    b, l, v = 4, 5, 6
    logits = torch.randn(b, l, v, generator=gen)
    tokens = torch.randint(0, v, (b, l), generator=gen)
    mask = torch.arange(l)[None, :] < torch.tensor([5, 2, 1, 0])[:, None]
    old = (logits + 0.2 * torch.randn(b, l, v, generator=gen)).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    old = torch.where(mask, old, NAN)
    adv = torch.randn(b, generator=gen)
    cfg = CorrectionConfig(**kwargs)
    log_w = torch.where(mask, torch.zeros(b, l), NAN)  # μ = π_old: every counted log-ratio is exactly 0
    if cfg.correction_level == "sequence":
        log_w = torch.zeros(b)
    out = correct(log_w, adv, mask, cfg, token_log_w=torch.where(mask, torch.zeros(b, l), NAN))
    assert torch.equal(out.omega, torch.ones_like(out.omega))
    assert out.reject_frac.item() == 0.0 and out.frac_above.item() == 0.0 and out.frac_below.item() == 0.0
    assert out.lam.item() == 0.0 and out.omega_ess.item() == 1.0

    grpo = GRPOConfig(loss_type=loss_type, max_completion_length=l)

    def loss_and_grad(weights):
        theta = logits.clone().requires_grad_(True)
        logp = torch.where(mask, theta.log_softmax(-1).gather(-1, tokens[..., None])[..., 0], NAN)
        loss = grpo_loss(logp, old, adv, mask, grpo, weights=weights).loss
        return loss.detach(), torch.autograd.grad(loss, theta)[0]

    plain_loss, plain_grad = loss_and_grad(None)
    loss, grad = loss_and_grad(out.omega)
    assert torch.equal(loss, plain_loss) and torch.equal(grad, plain_grad)


# ---------------------------------------------------------------------------------------------------- diagnostics

def test_rollout_diagnostics_hand_computed():
    """Two sequences: π_old log-probs (ln .5, ln .25), (ln .8, pad); μ log-probs (ln .25, ln .25), (ln .4, pad)."""
    old = _t([[LN(0.5), LN(0.25)], [LN(0.8), NAN]])
    roll = _t([[LN(0.25), LN(0.25)], [LN(0.4), NAN]])
    mask = torch.tensor([[True, True], [True, False]])
    d = rollout_diagnostics(old, roll, mask)
    ppl_old = [math.exp(-(LN(0.5) + LN(0.25)) / 2), 1 / 0.8]
    ppl_roll = [4.0, 1 / 0.4]
    torch.testing.assert_close(d["ppl_train"], _t(sum(ppl_old) / 2))
    torch.testing.assert_close(d["ppl_rollout"], _t(sum(ppl_roll) / 2))
    # token ratios w = 2, 1, 2; sequence ratios W = 2, 2
    torch.testing.assert_close(d["log_ppl_diff"], _t((-LN(2.0) / 2 - LN(2.0)) / 2))
    torch.testing.assert_close(d["chi2_token"], _t((4 + 1 + 4) / 3 - 1))
    torch.testing.assert_close(d["chi2_seq"], _t((4 + 4) / 2 - 1))
    torch.testing.assert_close(d["kl_token"], _t(-2 * LN(2.0) / 3))
    torch.testing.assert_close(d["k3_token"], _t(2 * (1 - LN(2.0)) / 3))


def test_rollout_diagnostics_are_neutral_when_mu_equals_pi_old():
    old = torch.log(torch.tensor([[0.3, 0.6], [0.9, 0.2]]))
    d = rollout_diagnostics(old, old.clone(), torch.ones(2, 2, dtype=torch.bool))
    for key in ("log_ppl_diff", "chi2_token", "chi2_seq", "kl_token", "k3_token"):
        assert d[key].item() == 0.0, key
    assert d["ppl_train"].item() == d["ppl_rollout"].item() > 1.0


def test_metrics_include_the_new_names():
    log_w, adv, mask = _seq_batch()
    metrics = correct(log_w, adv, mask, CorrectionConfig()).metrics()
    for name in ("corr/frac_above", "corr/frac_below", "corr/reject_frac", "corr/ess_frac", "corr/omega_mean"):
        assert name in metrics and math.isfinite(metrics[name])


@pytest.mark.parametrize("kwargs, fragment", [
    ({"band_low": 0.0}, "--band"), ({"band_low": 1.5}, "--band"), ({"band_high": 0.9}, "--band"),
    ({"is_cap_min": 1.5}, "--is-cap-min"), ({"ais_target": "ais"}, "ais_target"),
    ({"train_forward": "fp8"}, "train_forward"), ({"bypass": True, "train_forward": "aligned"}, "--bypass"),
    ({"correction_level": "batch"}, "correction_level"),
])
def test_new_config_errors_name_the_flag(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        CorrectionConfig(**kwargs)
