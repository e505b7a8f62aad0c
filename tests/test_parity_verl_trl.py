"""Correction parity with verl and TRL (issue 20, items 8–11): hand-worked cases, and differential tests that
re-implement the reference formulas from their sources on random inputs.

Sources read (re-implemented below, never imported — neither package is a dependency):
- verl `verl/trainer/ppo/rollout_corr_helper.py` at b178a3c: `compute_rollout_correction_weights` (IS weights,
  truncation, batch normalisation), `compute_is_metrics` (mean / std / min / max / ESS),
  `compute_rollout_rejection_mask` (k1/k2/k3 statistics on the ±20-clamped log-ratio, chained options, k1's
  `lower_upper` ratio bounds),
  `compute_offpolicy_metrics` (log-ppl, ppl ratio, χ², KL); `verl/trainer/ppo/core_algos.py` at b178a3c:
  `compute_policy_loss_vanilla` (dual clip `clip_ratio_c`, IS weights × loss) and `agg_loss` ("token-mean" over the
  rejection-modified response mask).
- TRL `trl/trainer/grpo_trainer.py` (the vLLM importance-sampling block of `_generate_and_score_completions`,
  `get_off_policy_mask`, `_compute_loss` for grpo / dapo / cispo), read at f2cd577.
"""

from __future__ import annotations

import math

import pytest
import torch

from dllm_ais.rl.config import CorrectionConfig, GRPOConfig, parse_reject, parse_reject_rule
from dllm_ais.rl.correction import correct, rejected_loss_mask
from dllm_ais.rl.grpo import grpo_loss
from dllm_ais.rl.mismatch_stats import reject_keep, rollout_diagnostics

D = torch.float64
NAN = float("nan")
SAFETY_BOUND = 20.0  # verl's rollout_corr_helper.SAFETY_BOUND


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=D)


def _random_batch(seed: int, b: int = 6, l: int = 7, scale: float = 0.6):
    """Per-token log π_old, log μ, log π_θ [B, L] with ragged completion masks (every row non-empty) and Â [B]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, l + 1, (b,), generator=g)
    mask = torch.arange(l)[None, :] < lengths[:, None]
    roll = -torch.rand(b, l, generator=g, dtype=D) * 3  # log μ
    old = roll + scale * torch.randn(b, l, generator=g, dtype=D)  # log π_old
    train = old + 0.3 * torch.randn(b, l, generator=g, dtype=D)  # log π_θ
    adv = torch.randn(b, generator=g, dtype=D)
    return old, roll, train, adv, mask


def _masked_mean(x, mask, dim=None, eps=0.0):
    """verl_F.masked_mean: sum(x·m) / (sum(m) + 1e-8). eps = 0 here (an exact mean, so the differentials hold to 1e-12
    on rows that all have tokens); eps = 1e-8 reproduces verl on an empty row too (0 / 1e-8 = 0: see
    test_parity_empty_rows.py)."""
    m = mask.to(x.dtype)
    x = torch.where(mask.bool(), x, 0)
    if dim is None:
        return (x * m).sum() / (m.sum() + eps)
    return (x * m).sum(dim) / (m.sum(dim) + eps)


# =========================================================================================== item 8: TIS and C_min

def test_tis_clamps_from_below_at_is_cap_min_like_trl_truncate():
    # ℓ = −1, C = 2, C_min = 0.5: w = e^−1 = 0.368; TRL's *_truncate gives clamp(0.368, 0.5, 2) = 0.5
    # (before: min(w, C) = 0.368, C_min ignored).
    cfg = CorrectionConfig(correction="tis", is_cap=2.0, is_cap_min=0.5)
    out = correct(_t([-1.0]), _t([1.0]), torch.ones(1, 3, dtype=torch.bool), cfg)
    assert out.omega.item() == pytest.approx(0.5)
    tok = CorrectionConfig(correction="token_truncate", is_cap=2.0, is_cap_min=0.5)
    out = correct(_t([[-1.0, 0.0, 1.0]]), _t([1.0]), torch.ones(1, 3, dtype=torch.bool), tok)
    torch.testing.assert_close(out.omega, _t([[0.5, 1.0, 2.0]]))  # e^1 = 2.72 -> 2


def test_no_upper_cap_is_trls_clip_max_none():
    # w = 0.25, 6 with C = None and C_min = 0.5: tis -> clamp below only = [0.5, 6]; mis -> drop below C_min = [0, 6]
    log_w, adv, mask = _t([math.log(0.25), math.log(6.0)]), _t([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool)
    tis = correct(log_w, adv, mask, CorrectionConfig(correction="tis", is_cap=None, is_cap_min=0.5))
    torch.testing.assert_close(tis.omega, _t([0.5, 6.0]))
    assert tis.trunc_frac.item() == 0.0 and tis.frac_above.item() == 0.0
    mis = correct(log_w, adv, mask, CorrectionConfig(correction="mis", is_cap=None, is_cap_min=0.5))
    torch.testing.assert_close(mis.omega, _t([0.0, 6.0]))


def _trl_vllm_is_ratio(old, roll, mask, mode, clip_min, clip_max):
    """TRL grpo_trainer.py, `_generate_and_score_completions`, the `vllm_importance_sampling_correction` block."""
    per_token_logps_diff = (old - roll) * mask
    if mode in ("sequence_mask", "sequence_truncate"):
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ("sequence_truncate", "token_truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)
    return ratio


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min, clip_max", [(0.5, 2.0), (0.8, None), (None, 3.0), (0.2, 1.5)])
def test_trl_importance_sampling_modes_differential(mode, clip_min, clip_max):
    old, roll, _, adv, mask = _random_batch(11, b=12, scale=0.7 if mode.startswith("token") else 0.5)
    want = _trl_vllm_is_ratio(old, roll, mask, mode, clip_min, clip_max)
    cfg = CorrectionConfig(correction=mode, is_cap=clip_max, is_cap_min=0.0 if clip_min is None else clip_min)
    out = correct(torch.where(mask, old - roll, NAN), adv, mask, cfg)
    got = out.omega if out.omega.dim() == 2 else out.omega[:, None].expand_as(mask)
    want = want.expand_as(mask)
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-12, atol=0)
    raw = torch.exp((old - roll) * mask).expand_as(mask) if mode.startswith("token") else torch.exp(
        ((old - roll) * mask).sum(-1, keepdim=True)).expand_as(mask)
    changed = got[mask] != raw[mask]
    assert changed.any() and not changed.all()  # the draw has weights inside and outside the bounds


# ================================================================================ item 9: rejection and the denominator

def _loss(cfg_c: CorrectionConfig, log_w, mask, adv, loss_type="dapo", **grpo):
    """The loss at π_θ = π_old (ratio 1) with the correction's ω and, under rejected=drop, its loss mask."""
    out = correct(log_w, adv, mask, cfg_c)
    loss_mask = rejected_loss_mask(out.omega, mask, cfg_c)
    zeros = torch.zeros(mask.shape, dtype=D)
    return grpo_loss(zeros, zeros, adv, loss_mask, GRPOConfig(loss_type=loss_type, **grpo), weights=out.omega).loss


@pytest.mark.parametrize("rejected, want", [("drop", -1.0), ("zero", -0.5)])
def test_rejected_tokens_leave_the_token_mean_with_drop_like_verl(rejected, want):
    # ℓ = [0, 2], Â = 1, token TIS C = 2, reject token_k3 > 0.05. k3(2) = e² − 3 = 4.39 -> token 2 rejected; at r = 1
    # the per-token loss is −Â·ω = [−1, −2·0]. verl (agg_loss token-mean over the rejection-modified mask):
    # −1 / 1 = −1.0. TRL's *_mask convention (ω = 0, token still counted): (−1 + 0) / 2 = −0.5.
    cfg = CorrectionConfig(correction="tis", correction_level="token", rejected=rejected,
                           **parse_reject("k3:token:0.05"))
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert _loss(cfg, _t([[0.0, 2.0]]), mask, _t([1.0])).item() == pytest.approx(want)


@pytest.mark.parametrize("rejected, want", [
    # token weights w = [1, 2, 0.5, e²], tis C = 2 -> [1, 2, 0.5, 2]; reject token_k3 > 1 drops token 4 (k3 = 4.39;
    # k3(ln 2) = 0.31, k3(ln ½) = 0.19). verl normalises over every valid token before rejection:
    # mean = 5.5 / 4 = 1.375 -> [0.727, 1.455, 0.364, 0]. zero: over the kept ones, mean = 3.5 / 3 -> [0.857, …, 0].
    ("drop", [1 / 1.375, 2 / 1.375, 0.5 / 1.375, 0.0]),
    ("zero", [3 / 3.5, 6 / 3.5, 1.5 / 3.5, 0.0]),
])
def test_normalisation_with_rejection(rejected, want):
    cfg = CorrectionConfig(correction="tis", correction_level="token", normalize_weights=True, rejected=rejected,
                           **parse_reject("k3:token:1"))
    out = correct(_t([[0.0, math.log(2), math.log(0.5), 2.0]]), _t([1.0]), torch.ones(1, 4, dtype=torch.bool), cfg)
    torch.testing.assert_close(out.omega, _t([want]))


def _verl_is_weights(log_ratio, mask, level, threshold, normalize, eps=0.0):
    """rollout_corr_helper.compute_rollout_correction_weights (b178a3c): weights × mask, clamp(max), normalise."""
    if level == "token":
        w = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        s = (log_ratio * mask).sum(-1, keepdim=True)
        w = torch.exp(torch.clamp(s, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    w = (w * mask).clamp(max=threshold)
    if normalize:
        if level == "token":
            mean = _masked_mean(w, mask, eps=eps)
        else:
            seq_w = _masked_mean(w, mask, dim=-1, eps=eps)
            seq_mask = (mask.sum(-1) > 0).to(w.dtype)
            mean = (seq_w * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if mean > 1e-8:
            w = w / mean
    return w


def _verl_thresholds(option, spec):
    """_parse_rollout_rs_thresholds for one option: k1 takes `lower_upper` (or upper, lower = 1/upper)."""
    if option.endswith("k1"):
        lower, upper = (float(v) for v in spec.split("_")) if "_" in spec else (1 / float(spec), float(spec))
        return lower, upper
    return None, float(spec)


def _verl_rejection_mask(log_ratio, mask, options, specs):
    """rollout_corr_helper.compute_rollout_rejection_mask (b178a3c): every option must pass (logical AND)."""
    lr = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    stats = {"k1": -lr, "k2": 0.5 * lr ** 2, "k3": torch.exp(lr) - 1.0 - lr}
    combined = torch.ones_like(mask, dtype=log_ratio.dtype)
    token_fracs, seq_fracs = {}, {}
    for option, spec in zip(options, specs, strict=True):
        lower, upper = _verl_thresholds(option, spec)
        kind = option[-2:]
        stat = stats[kind]
        if option.startswith("token"):
            value = stat
        elif option.startswith("seq_sum"):
            value = (stat * mask).sum(-1, keepdim=True)
        elif option.startswith("seq_mean"):
            value = _masked_mean(stat, mask, dim=-1)[:, None]
        else:  # seq_max
            value = stat.masked_fill(~mask, float("-inf")).max(-1, keepdim=True).values
        if kind == "k1":
            keep = (value >= math.log(lower)) & (value <= math.log(upper))
        else:
            keep = value <= upper
        keep = keep.expand_as(mask)
        combined = combined * keep.to(combined.dtype)
        token_fracs[option] = _masked_mean(1 - keep.to(D), mask)
        seq_fracs[option] = ((~keep) & mask).any(-1).to(D).mean()
    return (mask * combined).bool(), token_fracs, seq_fracs


def _verl_vanilla_loss(logp, old, adv, mask, weights, clip_ratio=0.2, clip_ratio_c=3.0):
    """core_algos.compute_policy_loss_vanilla + agg_loss("token-mean") (b178a3c)."""
    ratio = torch.exp(torch.clamp(logp - old, min=-20.0, max=20.0))
    a = adv[:, None]
    pg_losses1 = -a * ratio
    pg_losses2 = -a * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -a * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(a < 0, clip_pg_losses2, clip_pg_losses1)
    if weights is not None:
        pg_losses = pg_losses * weights
    return (pg_losses * mask).sum() / mask.sum()


VERL_CASES = [  # (rollout_is level, threshold, normalise, rollout_rs options, thresholds)
    ("token", 2.0, False, ["token_k3"], ["0.05"]),
    ("token", 1.5, True, ["token_k1", "seq_mean_k3"], ["0.7_1.6", "0.1"]),
    ("sequence", 3.0, False, ["seq_mean_k1"], ["0.8_1.25"]),  # Geo-RS
    ("sequence", 2.0, True, ["seq_max_k2", "token_k3"], ["0.3", "0.2"]),
    ("token", 2.0, True, ["seq_sum_k3", "seq_mean_k2"], ["0.5", "0.2"]),
    ("sequence", 2.0, False, ["token_k1"], ["2.0"]),  # k1 with one number: verl's [1/2, 2]
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("level, threshold, normalize, options, specs", VERL_CASES)
def test_verl_weights_rejection_and_loss_differential(seed, level, threshold, normalize, options, specs):
    old, roll, train, adv, mask = _random_batch(seed)
    log_ratio = torch.where(mask, old - roll, 0)
    want_w = _verl_is_weights(log_ratio, mask, level, threshold, normalize)
    want_mask, token_fracs, seq_fracs = _verl_rejection_mask(log_ratio, mask, options, specs)
    want_loss = _verl_vanilla_loss(train, old, adv, want_mask, want_w)
    assert 0 < want_mask.sum() < mask.sum()  # something rejected, something kept (verl's loss is 0/0 if nothing is)

    rules = [f"{o[-2:]}:{o[:-3]}:{s if '_' in s or not o.endswith('k1') else f'{1 / float(s)}_{s}'}"
             for o, s in zip(options, specs, strict=True)]
    cfg = CorrectionConfig(correction="tis", correction_level=level, is_cap=threshold, normalize_weights=normalize,
                           rejected="drop", **parse_reject(",".join(rules)))
    out = correct(torch.where(mask, old - roll, NAN), adv, mask, cfg)
    loss_mask = rejected_loss_mask(out.omega, mask, cfg)
    omega = out.omega if out.omega.dim() == 2 else out.omega[:, None].expand_as(mask)
    assert torch.equal(loss_mask, want_mask)
    torch.testing.assert_close(omega[want_mask], want_w[want_mask], rtol=1e-12, atol=0)
    got = grpo_loss(torch.where(mask, train, NAN), old, adv, loss_mask,
                    GRPOConfig(loss_type="dapo", clip_ratio_c=3.0), weights=out.omega).loss
    torch.testing.assert_close(got, want_loss, rtol=1e-12, atol=1e-15)
    for option in options:  # per-option fractions: tokens for token options, sequences for sequence options
        want = token_fracs[option] if option.startswith("token") else seq_fracs[option]
        torch.testing.assert_close(out.reject_fracs[option], want, rtol=1e-12, atol=0)


# ========================================================================================== item 10: diagnostics

def test_verl_ess_beside_ours_hand_computed():
    # ℓ = [0, −2] per token, C = 2. verl: weights clamped to [1/C, C] = [1, 0.5], mean 0.75, normalised [4/3, 2/3],
    # ESS = 1 / mean(16/9, 4/9) = 1 / (10/9) = 0.900. Ours (R of min(w, C)): (1 + e^−2)² / (2 (1 + e^−4)) = 0.633.
    cfg = CorrectionConfig(correction="tis", correction_level="token")
    out = correct(_t([[0.0, -2.0]]), _t([1.0]), torch.ones(1, 2, dtype=torch.bool), cfg)
    assert out.ess_verl.item() == pytest.approx(0.9, rel=1e-7)  # verl's + 1e-8 guard moves the 8th digit
    assert out.ess_frac.item() == pytest.approx((1 + math.exp(-2)) ** 2 / (2 * (1 + math.exp(-4))))
    assert out.ess_frac.item() == pytest.approx(0.633, abs=5e-4)
    m = out.metrics()
    assert m["corr/ess_verl"] == pytest.approx(0.9, rel=1e-7) and m["ais/ess_frac"] == pytest.approx(0.633, abs=5e-4)


def test_k3_rejection_uses_the_clamped_ratio_like_the_logged_k3():
    # ℓ = 25 (beyond the ±20 clamp). The logged mismatch/k3_token is k3(20) = e^20 − 21 = 4.85e8; the rejection
    # statistic is now the same number (verl clamps at SAFETY_BOUND = 20 too), so threshold 1e9 keeps the token
    # (before: the unclamped k3(25) = e^25 − 26 = 7.2e10 > 1e9 rejected it while the log showed 4.85e8).
    lr, mask = _t([[25.0]]), torch.ones(1, 1, dtype=torch.bool)
    logged = rollout_diagnostics(lr, torch.zeros(1, 1, dtype=D), mask)["k3_token"]
    assert logged.item() == pytest.approx(math.exp(20) - 21)
    assert reject_keep(lr, mask, "k3", "token", 1e9).all()
    assert not reject_keep(lr, mask, "k3", "token", 4e8).any()


def _verl_offpolicy_metrics(old, roll, mask, eps=0.0):
    """rollout_corr_helper.compute_offpolicy_metrics (b178a3c)."""
    mean_old = _masked_mean(old, mask, dim=-1, eps=eps)
    mean_roll = _masked_mean(roll, mask, dim=-1, eps=eps)
    log_ratio = old - roll
    diff = mean_roll - mean_old
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    seq = torch.clamp(torch.where(mask, log_ratio, 0).sum(-1), -SAFETY_BOUND, SAFETY_BOUND)
    return {
        "ppl_train": torch.exp(-mean_old).mean(), "log_ppl_train": (-mean_old).mean(),
        "kl_token": _masked_mean(roll - old, mask),
        "k3_token": _masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask),
        "ppl_rollout": torch.exp(-mean_roll).mean(), "log_ppl_rollout": (-mean_roll).mean(),
        "log_ppl_diff": diff.mean(), "log_ppl_abs_diff": diff.abs().mean(), "log_ppl_diff_max": diff.max(),
        "log_ppl_diff_min": diff.min(), "ppl_ratio": torch.exp(diff).mean(),
        "chi2_token": _masked_mean(rho.square(), mask) - 1.0, "chi2_seq": torch.exp(2.0 * seq).mean() - 1.0,
    }


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_verl_offpolicy_metrics_differential(seed):
    old, roll, _, _, mask = _random_batch(seed)
    want = _verl_offpolicy_metrics(torch.where(mask, old, 0), torch.where(mask, roll, 0), mask)
    got = rollout_diagnostics(torch.where(mask, old, NAN), torch.where(mask, roll, NAN), mask)
    assert set(want) <= set(got)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-12, atol=1e-15, msg=key)


def _verl_is_metrics(log_ratio, mask, level, threshold):
    """rollout_corr_helper.compute_is_metrics on the weights before truncation (b178a3c): mean, std, min, max, ESS,
    fraction above the threshold (a sequence-level sum counts every row, an empty one as log-ratio 0)."""
    if level == "token":
        w = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)) * mask
        wmax = w.masked_fill(~mask, float("-inf")).max()
        wmin = w.masked_fill(~mask, float("inf")).min()
        high = _masked_mean((w > threshold).to(D), mask)
    else:
        s = torch.where(mask, log_ratio, 0).sum(-1, keepdim=True)
        w = torch.exp(torch.clamp(s, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio) * mask
        wmax, wmin = torch.exp(torch.clamp(s.max(), max=SAFETY_BOUND)), torch.exp(s.min())
        high = (s > math.log(threshold)).to(D).mean()
    c = w.clamp(min=1 / threshold, max=threshold)
    mean_c = _masked_mean(c, mask)
    std = torch.sqrt(torch.clamp(_masked_mean(c.square(), mask) - mean_c.square(), min=0.0))
    ess = 1.0 / _masked_mean((c / (mean_c + 1e-8)).square(), mask)
    return {"is_mean": _masked_mean(w, mask), "is_std": std, "is_min": wmin, "is_max": wmax, "ess_verl": ess,
            "frac_above": high}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_verl_is_metrics_differential(seed, level):
    old, roll, _, adv, mask = _random_batch(seed, scale=0.5 if level == "token" else 0.3)
    want = _verl_is_metrics(torch.where(mask, old - roll, 0), mask, level, 2.0)
    out = correct(torch.where(mask, old - roll, NAN), adv, mask, CorrectionConfig(correction="tis",
                                                                                   correction_level=level))
    for key, value in want.items():
        torch.testing.assert_close(getattr(out, key), value, rtol=1e-12, atol=1e-15, msg=key)
    m = out.metrics()
    for name in ("corr/ess_verl", "corr/is_weight_mean", "corr/is_weight_std", "corr/is_weight_min",
                 "corr/is_weight_max"):
        assert math.isfinite(m[name])


# ===================================================================================== item 11: the missing options

def test_two_sided_k1_geo_rs_hand_computed():
    # seq_mean k1 with verl's ratio bounds 0.5_2: keep log ½ <= −mean_t ℓ <= log 2, i.e. |mean ℓ| <= 0.693.
    # Sequences (two tokens each) with mean ℓ = 0, 1, −1, 0.5 -> k1 = 0, −1, 1, −0.5 -> keep T, F, F, T.
    lr = _t([[0.0, 0.0], [1.0, 1.0], [-0.5, -1.5], [0.0, 1.0]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    rule = parse_reject_rule("k1:seq_mean:0.5_2")
    assert (rule.lower, rule.upper, rule.name) == (0.5, 2.0, "seq_mean_k1")
    assert reject_keep(lr, mask, "k1", "seq_mean", rule.upper, rule.lower).tolist() == [True, False, False, True]
    cfg = CorrectionConfig(correction="none", **parse_reject("k1:seq_mean:0.5_2"))
    out = correct(torch.zeros(4, dtype=D), _t([1.0, 1.0, -1.0, -1.0]), mask, cfg, token_log_w=lr)
    torch.testing.assert_close(out.omega, _t([1.0, 0.0, 0.0, 1.0]))
    assert out.reject_frac.item() == 0.5 and out.metrics()["corr/reject_frac/seq_mean_k1"] == 0.5


def test_chained_rejection_every_rule_must_pass():
    # Rules token_k3 > 0.05 and seq_mean_k1 outside [0.5, 2]. Sequence A: ℓ = [0, 0.5] (k3(0.5) = 0.149 -> token 2
    # rejected; mean ℓ = 0.25 passes the k1 bounds). Sequence B: ℓ = [1, 1] (both k3 = 0.718 > 0.05, and mean 1 fails
    # the k1 bounds). Sequence C: ℓ = [0.1, −0.1] (k3 = 0.0052, 0.0048 pass; mean 0 passes).
    lr = _t([[0.0, 0.5], [1.0, 1.0], [0.1, -0.1]])
    mask = torch.ones(3, 2, dtype=torch.bool)
    cfg = CorrectionConfig(correction="none", **parse_reject("k3:token:0.05,k1:seq_mean:0.5_2"))
    assert cfg.reject_stat == "none" and len(cfg.rejection_rules()) == 2
    out = correct(torch.zeros(3, dtype=D), _t([1.0, -1.0, 1.0]), mask, cfg, token_log_w=lr)
    torch.testing.assert_close(out.omega, _t([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))
    m = out.metrics()
    assert m["corr/reject_frac/token_k3"] == pytest.approx(3 / 6) and m["corr/reject_frac/seq_mean_k1"] == 1 / 3
    assert m["corr/reject_frac"] == pytest.approx(3 / 6)


@pytest.mark.parametrize("rejected, want", [("drop", -1.0), ("zero", -0.5)])
def test_bypass_rejects_on_pi_theta_over_mu_inside_the_loss(rejected, want):
    # Bypass: π_old = μ. log π_θ − log μ = [0, 2], Â = 1, rule token_k3 > 0.05: token 2 (k3 = 4.39) is rejected on
    # π_θ/μ at every update. Token 1: ratio 1 -> loss −1. drop (verl): −1 / 1; zero: (−1 + 0) / 2.
    cfg = CorrectionConfig(bypass=True, rejected=rejected, **parse_reject("k3:token:0.05"))
    mu = _t([[-1.0, -3.0]])
    out = grpo_loss(mu + _t([[0.0, 2.0]]), mu, _t([1.0]), torch.ones(1, 2, dtype=torch.bool), GRPOConfig(),
                    bypass_correction=cfg)
    assert out.loss.item() == pytest.approx(want) and out.reject_frac.item() == 0.5
    assert out.metrics()["corr/reject_frac"] == 0.5
    # the correction itself leaves everything to the loss in bypass (its ℓ ≡ 0 would reject nothing anyway)
    assert correct(torch.zeros(1, dtype=D), _t([1.0]), torch.ones(1, 2, dtype=torch.bool), cfg,
                   token_log_w=torch.zeros(1, 2, dtype=D)).reject_frac.item() == 0.0


def test_verl_dual_clip_in_the_standard_loss_hand_computed():
    # Â = −1, r = 5 (log π_θ − log π_old = ln 5), ε = 0.2. PPO: −min(5·(−1), 1.2·(−1)) = 5. verl's dual clip c = 3:
    # min(5, −Â·c = 3) = 3. With Â = +1 the dual clip does nothing: −min(5, 1.2) = −1.2.
    logp, old, mask = _t([[math.log(5.0)]]), _t([[0.0]]), torch.ones(1, 1, dtype=torch.bool)
    assert grpo_loss(logp, old, _t([-1.0]), mask, GRPOConfig()).loss.item() == pytest.approx(5.0)
    out = grpo_loss(logp, old, _t([-1.0]), mask, GRPOConfig(clip_ratio_c=3.0))
    assert out.loss.item() == pytest.approx(3.0) and out.dual_clip_frac.item() == 1.0
    assert grpo_loss(logp, old, _t([1.0]), mask, GRPOConfig(clip_ratio_c=3.0)).loss.item() == pytest.approx(-1.2)


def test_off_policy_mask_hand_computed():
    # δ = 0.4. Sequence 1: Â = −1, log μ − log π_θ = [1, 0] -> mean 0.5 > δ -> masked. Sequence 2: Â = +1, same KL ->
    # kept (positive advantage). Sequence 3: Â = −1, KL [0.2, 0.2] -> 0.2 <= δ -> kept. At r = 1 the per-token loss
    # is −Â: token mean over 6 tokens = (0 + 0 − 1 − 1 + 1 + 1) / 6 = 0.
    theta = torch.zeros(3, 2, dtype=D)
    mu = _t([[1.0, 0.0], [1.0, 0.0], [0.2, 0.2]])
    mask = torch.ones(3, 2, dtype=torch.bool)
    adv = _t([-1.0, 1.0, -1.0])
    out = grpo_loss(theta, theta, adv, mask, GRPOConfig(off_policy_mask_threshold=0.4), logp_rollout=mu)
    assert out.loss.item() == pytest.approx(0.0) and out.off_policy_masked_frac.item() == pytest.approx(1 / 3)
    plain = grpo_loss(theta, theta, adv, mask, GRPOConfig())
    assert plain.loss.item() == pytest.approx(1 / 3)  # (1 + 1 − 1 − 1 + 1 + 1) / 6


def test_cispo_gradient_hand_computed():
    # TRL cispo: ℓ_t = −sg(min(r_t, ε_high)) Â log π_θ(y_t), token mean. r = [0.5, 3], ε_high = 2, Â = 1, n = 2:
    # ∂loss/∂ log π_θ = −min(r, 2) / 2 = [−0.25, −1.0] (the capped ratio carries no gradient).
    old = _t([[-1.0, -2.0]])
    logp = (old + torch.log(_t([[0.5, 3.0]])))
    logp.requires_grad_(True)
    cfg = GRPOConfig(loss_type="cispo", epsilon_high=2.0)
    out = grpo_loss(logp, old, _t([1.0]), torch.ones(1, 2, dtype=torch.bool), cfg)
    (grad,) = torch.autograd.grad(out.loss, logp)
    torch.testing.assert_close(grad, _t([[-0.25, -1.0]]))
    assert out.clip_ratio_high.item() == 0.5  # TRL's cispo_clip_ratio: r > ε_high with Â > 0


def _trl_compute_loss(per_token_logps, old, adv, mask, loss_type, eps_low, eps_high, is_ratio, opsm=None,
                      sampling=None):
    """TRL grpo_trainer.py `_compute_loss` (token level, β = 0) with `get_off_policy_mask`."""
    advantages = adv.unsqueeze(1)
    if opsm is not None:
        kl_div = sampling - per_token_logps.detach()
        avg_seq_kl = (kl_div * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
        off_policy_mask = ((advantages >= 0) | (avg_seq_kl <= opsm)).to(mask.dtype)
    coef_1 = torch.exp(per_token_logps - old)
    if loss_type == "cispo":
        per_token_loss = -torch.clamp(coef_1, max=eps_high).detach() * advantages * per_token_logps
    else:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if opsm is not None:
        per_token_loss = per_token_loss * off_policy_mask
    per_token_loss = per_token_loss * is_ratio
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)  # dapo / cispo on one process, one batch


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("loss_type, mode, opsm", [
    ("grpo", "token_truncate", None), ("dapo", "token_mask", 0.05), ("cispo", "token_truncate", 0.1),
    ("dapo", "sequence_truncate", None), ("grpo", "sequence_mask", 0.0),
])
def test_trl_compute_loss_differential(seed, loss_type, mode, opsm):
    old, roll, train, adv, mask = _random_batch(seed, scale=0.3 if mode.startswith("token") else 0.1)
    maskd = mask.to(D)
    is_ratio = _trl_vllm_is_ratio(old * maskd, roll * maskd, maskd, mode, 0.5, 2.0)
    eps_high = 1.5 if loss_type == "cispo" else 0.28
    theta_ref = torch.where(mask, train, 0).requires_grad_(True)
    want = _trl_compute_loss(theta_ref, old * maskd, adv, maskd, loss_type, 0.2, eps_high, is_ratio, opsm,
                             roll * maskd)
    (want_grad,) = torch.autograd.grad(want, theta_ref)

    cfg = CorrectionConfig(correction=mode, is_cap=2.0, is_cap_min=0.5)
    omega = correct(torch.where(mask, old - roll, NAN), adv, mask, cfg).omega
    theta = torch.where(mask, train, 0).requires_grad_(True)
    grpo = GRPOConfig(loss_type=loss_type, epsilon_high=eps_high, off_policy_mask_threshold=opsm)
    got = grpo_loss(torch.where(mask, theta, NAN), torch.where(mask, old, NAN), adv, mask, grpo, weights=omega,
                    logp_rollout=torch.where(mask, roll, NAN)).loss
    (grad,) = torch.autograd.grad(got, theta)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad[mask], want_grad[mask], rtol=1e-12, atol=1e-15)


# ========================================================================================= config and invariants

@pytest.mark.parametrize("kwargs, fragment", [
    ({"rejected": "keep"}, "rejected"), ({"reject_rules": ("k3:token:0.1_2",)}, "only k1"),
    ({"reject_rules": ("k1:seq_mean:2_3",)}, "LOWER <= 1 <= UPPER"), ({"is_cap": 0.5}, "is_cap"),
])
def test_correction_config_errors(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        CorrectionConfig(**kwargs)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"clip_ratio_c": 1.0}, "clip_ratio_c"), ({"clip_ratio_c": 3.0, "loss_type": "tbpo"}, "tbpo"),
    ({"loss_type": "cispo"}, "epsilon_high"),
    ({"loss_type": "cispo", "epsilon_high": 5.0, "importance_sampling_level": "sequence"}, "token"),
    ({"off_policy_mask_threshold": -0.1}, "off_policy_mask_threshold"),
])
def test_grpo_config_errors(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        GRPOConfig(**kwargs)


def test_config_json_round_trip_keeps_rules_and_no_cap():
    from dataclasses import replace

    from dllm_ais.config import Preset
    from dllm_ais.presets import get_preset

    p = get_preset("tiny-cpu")
    p = replace(p, correction=replace(p.correction, is_cap=None, rejected="drop",
                                      **parse_reject("k3:token:0.1,k1:seq_mean:0.9_1.1")))
    import json

    back = Preset.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.correction == p.correction and back.correction.reject_rules == ("k3:token:0.1", "k1:seq_mean:0.9_1.1")


NEW_CONFIGS = [
    dict(correction="tis", is_cap_min=0.5), dict(correction="tis", is_cap=None, is_cap_min=0.5),
    dict(correction="mis", is_cap=None, correction_level="token"),
    dict(correction="tis", rejected="drop", normalize_weights=True, **parse_reject("k3:token:0")),
    dict(correction="ais", rejected="drop", **parse_reject("k3:token:0,k1:seq_mean:0.999_1.001")),
    dict(correction="tis", correction_level="geometric", normalize_weights=True,
         **parse_reject("k1:seq_sum:0.99_1.01,k2:seq_max:0")),
]
NEW_LOSSES = [dict(loss_type="dapo", clip_ratio_c=3.0), dict(loss_type="grpo", clip_ratio_c=1.5),
              dict(loss_type="dapo", off_policy_mask_threshold=0.0), dict(loss_type="cispo", epsilon_high=5.0)]


@pytest.mark.parametrize("kwargs", NEW_CONFIGS, ids=lambda k: "-".join(f"{v}" for v in k.values()))
@pytest.mark.parametrize("grpo_kwargs", NEW_LOSSES, ids=lambda k: "-".join(f"{v}" for v in k.values()))
def test_new_options_are_the_identity_when_mu_equals_pi_old(kwargs, grpo_kwargs):
    """μ = π_old: ω ≡ 1, the drop mask is the mask, and the loss and its gradient are the unweighted ones bit for bit
    (also with bypass-mode rules at π_θ = μ)."""
    gen = torch.Generator().manual_seed(5)
    b, l, v = 4, 5, 6
    logits = torch.randn(b, l, v, generator=gen)
    tokens = torch.randint(0, v, (b, l), generator=gen)
    mask = torch.arange(l)[None, :] < torch.tensor([5, 2, 1, 0])[:, None]
    old = torch.where(mask, logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0], NAN)
    adv = torch.randn(b, generator=gen)
    cfg = CorrectionConfig(**kwargs)
    zeros = torch.where(mask, torch.zeros(b, l), NAN)
    out = correct(zeros if cfg.correction_level != "sequence" else torch.zeros(b), adv, mask, cfg, token_log_w=zeros)
    assert torch.equal(out.omega, torch.ones_like(out.omega)) and out.reject_frac.item() == 0.0
    assert torch.equal(rejected_loss_mask(out.omega, mask, cfg), mask)
    assert out.ess_verl.item() == pytest.approx(1.0) and out.is_std.item() == 0.0
    grpo = GRPOConfig(max_completion_length=l, **grpo_kwargs)

    def loss_and_grad(**kw):
        theta = logits.clone().requires_grad_(True)
        logp = torch.where(mask, theta.log_softmax(-1).gather(-1, tokens[..., None])[..., 0], NAN)
        loss = grpo_loss(logp, old, adv, mask, grpo, **kw).loss
        return loss.detach(), torch.autograd.grad(loss, theta)[0]

    plain_loss, plain_grad = loss_and_grad()
    for kw in (dict(weights=out.omega), dict(weights=out.omega, logp_rollout=old),
               dict(bypass_correction=CorrectionConfig(bypass=True, **{k: v for k, v in kwargs.items()
                                                                       if k.startswith("reject")}))):
        loss, grad = loss_and_grad(**kw)
        assert torch.equal(loss, plain_loss) and torch.equal(grad, plain_grad), kw
