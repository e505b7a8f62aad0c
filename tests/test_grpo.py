"""GRPO loss (dllm_ais/rl/grpo.py) against a plain-loop reference, plus masking, gradients and config checks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_ais.rl import config as rl_config
from dllm_ais.rl import grpo as G
from dllm_ais.rl.config import GRPOConfig
from dllm_ais.rl.grpo import grpo_loss

NAN = float("nan")
LOSS_TYPES = ("grpo", "dr_grpo", "bnpo", "dapo")


def reference(logp, old, adv, mask, cfg, weights=None, ref=None):
    """TRL's GRPO loss and diagnostics with Python loops over sequences and tokens (float arithmetic)."""
    B, L = len(mask), len(mask[0])
    lo, hi = cfg.epsilon, cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    seq_sums, policy_sums, counts = [], [], []
    n_clip_low = n_clip_high = n_clip_any = n_units = 0
    kl_sum = 0.0
    for i in range(B):
        toks = [t for t in range(L) if mask[i][t]]
        counts.append(len(toks))
        seq_sum = sum(logp[i][t] - old[i][t] for t in toks)
        summed = cfg.importance_sampling_level == "sequence_sum"  # EBPO's ratio: the sum, not normalised
        seq_ratio = math.exp(seq_sum if summed else seq_sum / max(len(toks), 1))
        total = policy = 0.0
        for t in toks:
            ratio = math.exp(logp[i][t] - old[i][t]) if cfg.importance_sampling_level == "token" else seq_ratio
            clipped = min(max(ratio, 1 - lo), 1 + hi)
            surr = -min(ratio * adv[i], clipped * adv[i])
            if weights is not None:
                surr *= weights[i] if not isinstance(weights[i], list) else weights[i][t]
            policy += surr
            total += surr
            if ref is not None:
                d = ref[i][t] - logp[i][t]
                kl = math.exp(d) - d - 1
                kl_sum += kl
                total += cfg.beta * kl
            if cfg.importance_sampling_level == "token":
                low, high = ratio < 1 - lo and adv[i] < 0, ratio > 1 + hi and adv[i] > 0
                n_clip_low, n_clip_high, n_clip_any = n_clip_low + low, n_clip_high + high, n_clip_any + (low or high)
                n_units += 1
        if cfg.importance_sampling_level != "token" and toks:
            low, high = seq_ratio < 1 - lo and adv[i] < 0, seq_ratio > 1 + hi and adv[i] > 0
            n_clip_low, n_clip_high, n_clip_any = n_clip_low + low, n_clip_high + high, n_clip_any + (low or high)
            n_units += 1
        seq_sums.append(total)
        policy_sums.append(policy)

    def aggregate(sums):
        if cfg.loss_type == "grpo":
            return sum(s / max(c, 1) for s, c in zip(sums, counts, strict=True)) / B
        if cfg.loss_type == "dr_grpo":
            return sum(sums) / (B * cfg.max_completion_length)
        return sum(sums) / max(sum(counts), 1)

    n_units = max(n_units, 1)
    return {"loss": aggregate(seq_sums), "policy_loss": aggregate(policy_sums),
            "kl": None if ref is None else kl_sum / max(sum(counts), 1), "clip_ratio_low": n_clip_low / n_units,
            "clip_ratio_high": n_clip_high / n_units, "clip_ratio_region": n_clip_any / n_units}


def _inputs(seed=0, b=5, l=7, spread=0.4):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 4, 1, 0, 6])[:b].clamp(max=l)
    mask = torch.arange(l)[None, :] < lengths[:, None]  # [B, L]
    if b > 2 and l > 3:
        mask[2] = torch.arange(l) == 3  # one counted token that is not the first position
    logp = -torch.rand(b, l, generator=gen, dtype=torch.float64) * 3
    old = logp + spread * torch.randn(b, l, generator=gen, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(b, l, generator=gen, dtype=torch.float64)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    weights_seq = torch.rand(b, generator=gen, dtype=torch.float64) * 2
    weights_tok = torch.rand(b, l, generator=gen, dtype=torch.float64) * 2
    return mask, logp, old, ref, adv, weights_seq, weights_tok


def _check_against_reference(out, expected):
    for name, value in expected.items():
        got = getattr(out, name)
        if value is None:
            assert got is None
        else:
            torch.testing.assert_close(got, torch.tensor(value, dtype=got.dtype), rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("is_level", ("token", "sequence", "sequence_sum"))
@pytest.mark.parametrize("weights_kind", ("none", "seq", "tok"))
@pytest.mark.parametrize("beta", (0.0, 0.1))
def test_matches_loop_reference(loss_type, is_level, weights_kind, beta):
    mask, logp, old, ref, adv, w_seq, w_tok = _inputs()
    cfg = GRPOConfig(loss_type=loss_type, importance_sampling_level=is_level, beta=beta, epsilon=0.2,
                     epsilon_high=0.28, max_completion_length=10)
    weights = {"none": None, "seq": w_seq, "tok": w_tok}[weights_kind]
    nan_pad = lambda x: torch.where(mask, x, NAN)  # noqa: E731
    out = grpo_loss(nan_pad(logp), nan_pad(old), adv, mask, cfg, weights=weights, logp_ref=nan_pad(ref))
    expected = reference(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), cfg,
                         None if weights is None else weights.tolist(), ref.tolist())
    _check_against_reference(out, expected)


def test_reference_inputs_exercise_clipping():
    """The random inputs above actually clip on both sides, so the clip comparison is not vacuous."""
    mask, logp, old, ref, adv, _, _ = _inputs()
    out = grpo_loss(logp, old, adv, mask, GRPOConfig())
    assert out.clip_ratio_low.item() > 0 and out.clip_ratio_high.item() > 0
    assert out.clip_ratio_region.item() < 1


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 5), l=st.integers(1, 7),
       loss_type=st.sampled_from(LOSS_TYPES), is_level=st.sampled_from(("token", "sequence")),
       spread=st.sampled_from([0.0, 0.1, 1.0]))
def test_matches_loop_reference_random_shapes(seed, b, l, loss_type, is_level, spread):
    mask, logp, old, ref, adv, w_seq, _ = _inputs(seed, b, l, spread)
    cfg = GRPOConfig(loss_type=loss_type, importance_sampling_level=is_level, beta=0.05, max_completion_length=l)
    out = grpo_loss(logp, old, adv, mask, cfg, weights=w_seq, logp_ref=ref)
    expected = reference(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), cfg, w_seq.tolist(), ref.tolist())
    _check_against_reference(out, expected)


def test_clip_fractions_hand_computed():
    """Two sequences, logp_old = 0, ratios r = exp(logp_train), ε = 0.2, ε_high = 0.28.

    Sequence 0 (Â = +1): r = [0.5, 1.3, 1.2, 1.0]  -> high-clipped: 1.3 > 1.28 (1 token); 0.5 < 0.8 but Â > 0: no.
    Sequence 1 (Â = −1): r = [0.5, 0.85, 1.5, pad] -> low-clipped: 0.5 < 0.8 (1 token); 1.5 > 1.28 but Â < 0: no.
    7 counted tokens: low = 1/7, high = 1/7, region = 2/7.
    """
    ratios = torch.tensor([[0.5, 1.3, 1.2, 1.0], [0.5, 0.85, 1.5, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    cfg = GRPOConfig(epsilon=0.2, epsilon_high=0.28)
    out = grpo_loss(ratios.log(), torch.zeros(2, 4, dtype=torch.float64), torch.tensor([1.0, -1.0]).double(), mask,
                    cfg)
    assert out.clip_ratio_low.item() == pytest.approx(1 / 7)
    assert out.clip_ratio_high.item() == pytest.approx(1 / 7)
    assert out.clip_ratio_region.item() == pytest.approx(2 / 7)


def test_kl_hand_computed():
    """k3 with d = logp_ref − logp_train: d = ln2 -> 2 − ln2 − 1 = 1 − ln2;  d = 0 -> 0.  Mean over 2 tokens."""
    logp = torch.zeros(1, 3, dtype=torch.float64)
    ref = torch.tensor([[math.log(2), 0.0, NAN]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    out = grpo_loss(logp, logp, torch.zeros(1, dtype=torch.float64), mask, GRPOConfig(beta=0.5), logp_ref=ref)
    assert out.kl.item() == pytest.approx((1 - math.log(2)) / 2)
    # ratio 1 and Â = 0: the loss is β · KL aggregated (dapo: token mean)
    assert out.loss.item() == pytest.approx(0.5 * (1 - math.log(2)) / 2)


@pytest.mark.parametrize("is_level", ("token", "sequence"))
def test_gradient_at_ratio_one_is_analytic(is_level):
    """At θ = old (r = 1, nothing clipped), loss_type=grpo: ∂loss/∂logp_it = −Â_i ω_i / (B · n_i) on counted tokens."""
    mask, logp, _, _, adv, w_seq, _ = _inputs()
    theta = logp.clone().requires_grad_(True)
    cfg = GRPOConfig(loss_type="grpo", importance_sampling_level=is_level)
    grpo_loss(torch.where(mask, theta, NAN), logp, adv, mask, cfg, weights=w_seq).loss.backward()
    n = mask.sum(-1).clamp(min=1)
    expected = torch.where(mask, (-adv * w_seq / (mask.shape[0] * n))[:, None], 0.0)
    torch.testing.assert_close(theta.grad, expected, rtol=1e-12, atol=1e-14)


def test_padding_content_never_reaches_loss_or_gradient():
    mask, logp, old, ref, adv, _, w_tok = _inputs()
    cfg = GRPOConfig(beta=0.1, loss_type="grpo", importance_sampling_level="sequence")
    results = []
    for pad in (NAN, float("inf"), 123.0):
        theta = logp.clone().requires_grad_(True)
        fill = lambda x, p=pad: torch.where(mask, x, p)  # noqa: E731
        out = grpo_loss(fill(theta), fill(old), torch.where(mask.any(-1), adv, pad), mask, cfg,
                        weights=fill(w_tok), logp_ref=fill(ref))
        out.loss.backward()
        assert torch.isfinite(out.loss) and torch.isfinite(theta.grad).all()
        results.append((out.loss.detach(), theta.grad))
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])


def test_sequence_weights_equal_broadcast_token_weights():
    mask, logp, old, ref, adv, w_seq, _ = _inputs()
    cfg = GRPOConfig(loss_type="bnpo")
    a = grpo_loss(logp, old, adv, mask, cfg, weights=w_seq).loss
    b = grpo_loss(logp, old, adv, mask, cfg, weights=w_seq[:, None].expand_as(logp)).loss
    assert torch.equal(a, b)
    c = grpo_loss(logp, old, adv, mask, cfg).loss
    assert not torch.allclose(a, c)  # the weights do something


def test_constant_log_ratio_makes_sequence_and_token_levels_agree():
    mask, logp, _, _, adv, _, _ = _inputs()
    c = torch.tensor([0.3, -0.3, 0.05, 0.0, 0.1], dtype=torch.float64)[:, None]
    cfg_tok, cfg_seq = GRPOConfig(loss_type="grpo"), GRPOConfig(loss_type="grpo", importance_sampling_level="sequence")
    tok = grpo_loss(logp + c, logp, adv, mask, cfg_tok)
    seq = grpo_loss(logp + c, logp, adv, mask, cfg_seq)
    torch.testing.assert_close(tok.loss, seq.loss)
    torch.testing.assert_close(tok.policy_loss, seq.policy_loss)


def test_empty_mask_gives_zero_loss_and_zero_gradient():
    mask = torch.zeros(3, 4, dtype=torch.bool)
    for loss_type in LOSS_TYPES:
        theta = torch.zeros(3, 4, requires_grad=True)
        out = grpo_loss(theta + NAN, torch.full((3, 4), NAN), torch.ones(3), mask,
                        GRPOConfig(loss_type=loss_type, max_completion_length=4, beta=0.1),
                        logp_ref=torch.full((3, 4), NAN))
        out.loss.backward()
        assert out.loss.item() == 0.0 and torch.equal(theta.grad, torch.zeros(3, 4))
        assert all(math.isfinite(v) for v in out.metrics().values())


def test_metric_names():
    mask, logp, old, ref, adv, _, _ = _inputs()
    metrics = grpo_loss(logp, old, adv, mask, GRPOConfig(beta=0.1), logp_ref=ref).metrics()
    assert {"loss/policy", "loss/kl", "loss/clip_frac"} <= set(metrics)
    assert "loss/kl" not in grpo_loss(logp, old, adv, mask, GRPOConfig()).metrics()


def test_config_names_match_implementations():
    assert set(rl_config.LOSS_TYPES) == set(G.AGGREGATIONS)
    assert set(rl_config.IMPORTANCE_SAMPLING_LEVELS) == set(G.LOG_RATIO_LEVELS)


def test_input_errors():
    mask, logp, old, ref, adv, _, _ = _inputs()
    with pytest.raises(ValueError, match="logp_ref"):
        grpo_loss(logp, old, adv, mask, GRPOConfig(beta=0.1))
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(logp, old, adv, mask, GRPOConfig(loss_type="dr_grpo", max_completion_length=3))
    with pytest.raises(ValueError, match="weights"):
        grpo_loss(logp, old, adv, mask, GRPOConfig(), weights=torch.ones(3))
    with pytest.raises(ValueError, match="adv"):
        grpo_loss(logp, old, adv[:2], mask, GRPOConfig())


@pytest.mark.parametrize("kwargs, fragment", [
    ({"num_generations": 1}, "num_generations"),
    ({"loss_type": "ppo"}, "loss_type"),
    ({"importance_sampling_level": "batch"}, "importance_sampling_level"),
    ({"scale_rewards": True}, "scale_rewards"),
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon_high": -0.1}, "epsilon_high"),
    ({"beta": -1.0}, "beta"),
    ({"max_completion_length": 0}, "max_completion_length"),
    ({"num_iterations": 0}, "num_iterations"),
])
def test_grpo_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        GRPOConfig(**kwargs)


# ------------------------------------------------------------------------------------------------------------- TBPO

def _tbpo_batch():
    """Four sequences of two tokens, logp_old = 0, sequence ratios s = 2, 5, 0.9, 2 and Â = +1, −1, −1, −1."""
    s = torch.tensor([2.0, 5.0, 0.9, 2.0], dtype=torch.float64)
    logp = s.log()[:, None].expand(4, 2).clone()
    return logp, torch.zeros(4, 2, dtype=torch.float64), torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=torch.float64)


@pytest.mark.parametrize("is_level", ["token", "sequence"])  # tbpo always uses the sequence ratio
def test_tbpo_hand_computed(is_level):
    """J = min(s Â, clip(s, 0.8, 1.2) Â), then max(J, 3 Â) for Â < 0:
    s=2, Â=+1: min(2, 1.2) = 1.2 (clipped, no gradient)          -> loss −1.2
    s=5, Â=−1: min(−5, −1.2) = −5, max(−5, −3) = −3 (dual clip)   -> loss 3, no gradient
    s=0.9, Â=−1: min(−0.9, −0.9) = −0.9                            -> loss 0.9, ∂/∂logp_t = s/L = 0.45
    s=2, Â=−1: min(−2, −1.2) = −2 > −3                              -> loss 2,   ∂/∂logp_t = s/L = 1
    loss = mean = 4.7 / 4; gradients / 4 (mean over sequences)."""
    logp, old, adv = _tbpo_batch()
    logp.requires_grad_(True)
    mask = torch.ones(4, 2, dtype=torch.bool)
    cfg = GRPOConfig(loss_type="tbpo", importance_sampling_level=is_level, epsilon=0.2, dual_clip=3.0)
    out = grpo_loss(logp, old, adv, mask, cfg)
    torch.testing.assert_close(out.loss.detach(), torch.tensor(4.7 / 4, dtype=torch.float64))
    (grad,) = torch.autograd.grad(out.loss, logp)
    expected = torch.tensor([0.0, 0.0, 0.45 / 4, 1.0 / 4], dtype=torch.float64)[:, None].expand(4, 2)
    torch.testing.assert_close(grad, expected)
    assert out.dual_clip_frac.item() == 0.25 and out.metrics()["loss/dual_clip_frac"] == 0.25
    torch.testing.assert_close(out.clip_ratio_high, torch.tensor(0.25, dtype=torch.float64))


def test_tbpo_bounds_negative_sequences_by_c_abs_adv():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(16, 5, generator=gen, dtype=torch.float64) * 3
    adv = -torch.rand(16, generator=gen, dtype=torch.float64) * 2
    mask = torch.ones(16, 5, dtype=torch.bool)
    cfg = GRPOConfig(loss_type="tbpo", dual_clip=2.5)
    for i in range(16):
        one = grpo_loss(logp[i:i + 1], torch.zeros(1, 5, dtype=torch.float64), adv[i:i + 1], mask[i:i + 1], cfg)
        assert one.loss.item() <= 2.5 * abs(adv[i].item()) + 1e-12


def test_tbpo_weights_scale_each_sequence():
    logp, old, adv = _tbpo_batch()
    mask = torch.ones(4, 2, dtype=torch.bool)
    cfg = GRPOConfig(loss_type="tbpo")
    w = torch.tensor([0.0, 1.0, 2.0, 0.5], dtype=torch.float64)
    out = grpo_loss(logp, old, adv, mask, cfg, weights=w)
    torch.testing.assert_close(out.loss, torch.tensor((0 * -1.2 + 3 + 2 * 0.9 + 0.5 * 2) / 4, dtype=torch.float64))


def test_tbpo_config_errors():
    with pytest.raises(ValueError, match="--dual-clip"):
        GRPOConfig(loss_type="tbpo", dual_clip=1.0)
    with pytest.raises(ValueError, match="--mask-error-completions"):
        GRPOConfig(error_mask_threshold=1.0)
