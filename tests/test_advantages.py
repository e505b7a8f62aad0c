"""Group-relative advantages (dllm_ais/rl/advantages.py) against a plain-loop reference."""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_ais.rl import advantages as A
from dllm_ais.rl import config as rl_config
from dllm_ais.rl.advantages import ADV_EPS, group_advantages


def reference(rewards: list[float], g: int, scale: str) -> tuple[list[float], float]:
    """Advantages and zero-std fraction with loops and the statistics module."""
    groups = [rewards[i:i + g] for i in range(0, len(rewards), g)]
    batch_std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    adv, zero = [], 0
    for group in groups:
        mean, std = statistics.fmean(group), statistics.stdev(group)
        if max(group) == min(group):
            zero += 1
            adv += [0.0] * g
            continue
        denom = {"none": 1.0, "group": std + ADV_EPS, "batch": batch_std + ADV_EPS}[scale]
        adv += [(r - mean) / denom for r in group]
    return adv, zero / len(groups)


@pytest.mark.parametrize("scale", ("none", "group", "batch"))
def test_hand_computed(scale):
    """Two prompts, G = 3: [1, 0, 0] and [2, 2, 2].

    Group 0: mean 1/3, centred [2/3, −1/3, −1/3], unbiased std = sqrt(((2/3)² + 2 (1/3)²) / 2) = sqrt(1/3).
    Group 1: all equal -> Â = 0, counts as zero-std -> zero_std_frac = 1/2.
    Batch std of [1, 0, 0, 2, 2, 2]: mean 7/6, Σ(r − mean)² = (1/6)² + 2 (7/6)² + 3 (5/6)² = 29/6, /5 -> sqrt(29/30).
    """
    out = group_advantages(torch.tensor([1.0, 0, 0, 2, 2, 2], dtype=torch.float64), 3, scale)
    denom = {"none": 1.0, "group": (1 / 3) ** 0.5 + ADV_EPS, "batch": (29 / 30) ** 0.5 + ADV_EPS}[scale]
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0], dtype=torch.float64) / denom
    torch.testing.assert_close(out.adv, expected, rtol=1e-12, atol=1e-12)
    assert out.zero_std_frac.item() == 0.5
    assert out.metrics() == {"adv/zero_std_frac": 0.5}


@settings(max_examples=40, deadline=None)
@given(data=st.data(), g=st.integers(2, 5), p=st.integers(1, 4), scale=st.sampled_from(("none", "group", "batch")),
       discrete=st.booleans())
def test_matches_reference(data, g, p, scale, discrete):
    values = st.sampled_from([0.0, 0.5, 1.0]) if discrete else st.floats(-10, 10, allow_nan=False)
    rewards = data.draw(st.lists(values, min_size=g * p, max_size=g * p))
    out = group_advantages(torch.tensor(rewards, dtype=torch.float64), g, scale)
    adv, zero_frac = reference(rewards, g, scale)
    torch.testing.assert_close(out.adv, torch.tensor(adv, dtype=torch.float64), rtol=1e-9, atol=1e-9)
    assert out.zero_std_frac.item() == pytest.approx(zero_frac)
    sums = out.adv.view(p, g).sum(-1)
    torch.testing.assert_close(sums, torch.zeros(p, dtype=torch.float64), rtol=0, atol=1e-9)


def test_zero_std_groups_are_exactly_zero():
    """In float32, mean([0.9] * 3) != 0.9, so r − mean leaves a 6e-8 residue (and z-scoring would blow it up to
    ~6e-4); an all-equal group must give exact zeros instead."""
    rewards = torch.tensor([0.9, 0.9, 0.9, 0.7, 0.7, 0.7, 0.0, 1.0, 0.0])
    first = rewards[:3]
    assert (first - first.mean() != 0).all()  # the residue this test is about exists
    for scale in ("none", "group", "batch"):
        out = group_advantages(rewards, 3, scale)
        assert torch.equal(out.adv[:6], torch.zeros(6))
        assert (out.adv[6:] != 0).all()
        assert out.zero_std_frac.item() == pytest.approx(2 / 3)


def test_z_score_has_unit_group_std():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(4 * 8, generator=gen, dtype=torch.float64) * 5 + 3
    adv = group_advantages(rewards, 8, "group").adv.view(4, 8)
    std = rewards.view(4, 8).std(dim=1)
    torch.testing.assert_close(adv.std(dim=1), std / (std + ADV_EPS))


def test_integer_rewards_and_empty_batch():
    out = group_advantages(torch.tensor([1, 0, 1, 1]), 2, "none")
    assert out.adv.dtype.is_floating_point
    assert out.adv.tolist() == [0.5, -0.5, 0.0, 0.0]
    empty = group_advantages(torch.zeros(0), 4)
    assert empty.adv.numel() == 0 and empty.zero_std_frac.item() == 0.0


def test_errors():
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="multiple of num_generations"):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(torch.zeros(4), 2, "std")


def test_config_names_match_implementations():
    assert set(rl_config.SCALE_REWARDS) == set(A.SCALERS)
