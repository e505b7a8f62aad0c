"""A row whose completion has no counted token (issue 29, item 4): our sequence-level diagnostics leave it out; verl's
compute_offpolicy_metrics and compute_is_metrics (rollout_corr_helper.py, b178a3c) count it as a perfectly matched row
(masked_mean's `/ (n + 1e-8)` gives an empty row mean log-prob 0: ppl 1, log-ratio 0, w = 1). verl's own loss path
leaves it out (batch normalisation's seq_mask, the rejection metrics' seq_valid_mask), and so do we — everywhere.

The case: row 0 masked, row 1 with log π_old = [−1, −1], log μ = [−2, −2] (ℓ = [1, 1], Σℓ = 2, w = e² = 7.39), C = 2:

    metric                              ours (row 1 only)          verl (row 1 and an empty row 0 as ℓ = 0)
    mismatch/ppl_train                  e = 2.718                  (1 + e) / 2 = 1.859
    mismatch/chi2_seq                   e⁴ − 1 = 53.6              (1 + e⁴) / 2 − 1 = 26.8
    mismatch/log_ppl_diff               −1                         −0.5
    mismatch/log_ppl_abs_diff           1                          0.5
    mismatch/log_ppl_diff_max           −1                         0
    mismatch/ppl_ratio                  e⁻¹ = 0.368                (1 + e⁻¹) / 2 = 0.684
    corr/frac_above (sequence level)    1.0                        0.5
    corr/is_weight_min (sequence)       e² = 7.39                  e⁰ = 1
Token-level ones (chi2_token, kl_token, k3_token, is_weight_mean/std, ess_verl) agree: an empty row has no token.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_parity_verl_trl import _verl_is_metrics, _verl_is_weights, _verl_offpolicy_metrics, _verl_vanilla_loss

from dllm_ais.rl.config import CorrectionConfig, GRPOConfig
from dllm_ais.rl.correction import correct
from dllm_ais.rl.grpo import grpo_loss
from dllm_ais.rl.mismatch_stats import rollout_diagnostics

D = torch.float64
NAN = float("nan")
VERL_EPS = 1e-8  # verl_F.masked_mean's guard
E = math.e

MASK = torch.tensor([[False, False], [True, True]])
OLD = torch.tensor([[NAN, NAN], [-1.0, -1.0]], dtype=D)  # log π_old; anything where masked
ROLL = torch.tensor([[NAN, NAN], [-2.0, -2.0]], dtype=D)  # log μ

# (ours, verl) by our metric name, worked out by hand above
OFFPOLICY = {"ppl_train": (E, (1 + E) / 2), "chi2_seq": (E ** 4 - 1, (1 + E ** 4) / 2 - 1),
             "log_ppl_diff": (-1.0, -0.5), "log_ppl_abs_diff": (1.0, 0.5), "log_ppl_diff_max": (-1.0, 0.0),
             "ppl_ratio": (1 / E, (1 + 1 / E) / 2), "chi2_token": (E ** 2 - 1, E ** 2 - 1), "kl_token": (-1.0, -1.0)}
IS_METRICS = {"frac_above": (1.0, 0.5), "is_min": (E ** 2, 1.0), "is_max": (E ** 2, E ** 2),
              "is_mean": (E ** 2, E ** 2)}


@pytest.mark.parametrize("name", sorted(OFFPOLICY))
def test_offpolicy_metrics_leave_an_empty_row_out_where_verl_counts_it(name):
    ours, verl = OFFPOLICY[name]
    got = rollout_diagnostics(OLD, ROLL, MASK)[name]
    want = _verl_offpolicy_metrics(OLD, ROLL, MASK, eps=VERL_EPS)[name]  # verl's formulas, its 1e-8 guard included
    assert got.item() == pytest.approx(ours, rel=1e-12)
    assert want.item() == pytest.approx(verl, rel=1e-7)
    # and without the empty row the two agree: the difference is that row alone
    alone = _verl_offpolicy_metrics(OLD[1:], ROLL[1:], MASK[1:], eps=VERL_EPS)[name]
    assert alone.item() == pytest.approx(ours, rel=1e-7)


@pytest.mark.parametrize("name", sorted(IS_METRICS))
def test_sequence_is_metrics_leave_an_empty_row_out_where_verl_counts_it(name):
    ours, verl = IS_METRICS[name]
    out = correct(torch.where(MASK, OLD - ROLL, NAN), torch.tensor([0.0, 1.0], dtype=D), MASK,
                  CorrectionConfig(correction="tis", correction_level="sequence", is_cap=2.0))
    want = _verl_is_metrics(torch.where(MASK, OLD - ROLL, 0), MASK, "sequence", 2.0)[name]
    assert getattr(out, name).item() == pytest.approx(ours, rel=1e-12)
    assert want.item() == pytest.approx(verl, rel=1e-7)


@pytest.mark.parametrize("normalize", [False, True])
def test_the_loss_leaves_an_empty_row_out_like_verls_loss(normalize):
    """The weights and the loss were right already (unchanged by issue 29): verl's batch normalisation averages over
    rows with a token (seq_mask) and its token-mean loss sees none of an empty row, so ω and the loss equal verl's."""
    train = torch.tensor([[NAN, NAN], [-0.9, -1.2]], dtype=D)  # log π_θ
    adv = torch.tensor([0.7, 1.0], dtype=D)
    log_ratio = torch.where(MASK, OLD - ROLL, 0)
    want_w = _verl_is_weights(log_ratio, MASK, "sequence", 2.0, normalize, eps=VERL_EPS)  # [B, L]
    cfg = CorrectionConfig(correction="tis", correction_level="sequence", is_cap=2.0, normalize_weights=normalize,
                           rejected="drop")
    out = correct(torch.where(MASK, OLD - ROLL, NAN), adv, MASK, cfg)
    assert out.omega[1].item() == pytest.approx(want_w[1, 0].item(), rel=1e-7)
    assert out.omega[1].item() == (1.0 if normalize else 2.0)
    got = grpo_loss(train, torch.where(MASK, OLD, 0), adv, MASK, GRPOConfig(loss_type="dapo", clip_ratio_c=3.0),
                    weights=out.omega).loss
    want = _verl_vanilla_loss(torch.where(MASK, train, 0), torch.where(MASK, OLD, 0), adv, MASK, want_w)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=0)  # verl's 1e-8 guards move the 9th digit
