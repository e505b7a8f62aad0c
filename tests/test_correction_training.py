"""Every new correction option trains 3 tiny CPU steps through run_training and logs the new diagnostics each step;
bypass with BF16 rollouts equals no correction; the aligned training forward removes the FP8 mismatch."""

import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from dllm_ais import metrics as M
from dllm_ais.cli import _train_preset, build_parser
from dllm_ais.presets import get_preset
from dllm_ais.rl.config import parse_reject
from dllm_ais.train.job import run_training
from dllm_ais.train.run_dir import RunDir

NEW_METRICS = (*M.DIAGNOSTIC_NAMES.values(), M.CORR_FRAC_ABOVE, M.CORR_FRAC_BELOW, M.CORR_REJECT_FRAC, M.CORR_ESS,
               M.CORR_OMEGA_MEAN, M.ROLLOUT_REPEAT_FRAC, M.ROLLOUT_ERROR_MASKED)


def small_preset(correction=None, grpo=None, **train):
    """tiny-cpu shrunk to seconds: 2 prompts x 4 generations, a few SFT steps, 3 GRPO steps."""
    p = get_preset("tiny-cpu")
    fields = dict(steps=3, prompts_per_step=2, sft_steps=3, sft_batch_size=8, mismatch_num_draws=2)
    fields.update(train)
    return replace(p, train=replace(p.train, **fields), grpo=replace(p.grpo, num_generations=4, **(grpo or {})),
                   correction=replace(p.correction, **(correction or {})))


OPTIONS = {
    "geometric": dict(correction={"correction": "tis", "correction_level": "geometric"}),
    "band": dict(correction={"correction": "band", "band_low": 0.5, "band_high": 5.0}),
    "reject": dict(correction={"correction": "ais", **parse_reject("k3:seq_mean:0.01")}),
    "reject_tokens": dict(correction={"correction": "tis", **parse_reject("k1:token:0")}),  # drops tokens with ℓ < 0
    "bypass": dict(correction={"bypass": True}),
    "aligned": dict(correction={"train_forward": "aligned", "normalize_weights": True}),
    "aligned_token": dict(correction={"train_forward": "aligned", "correction_level": "token"}),
    "tbpo": dict(grpo={"loss_type": "tbpo", "error_mask_threshold": 0.5}),
    # issue 20: verl's conventions (drop, chained two-sided k1, per-token dual clip) and TRL's (no cap, OPSM)
    "verl_drop": dict(correction={"correction": "tis", "correction_level": "token", "rejected": "drop",
                                  "normalize_weights": True, **parse_reject("k1:token:0,k1:seq_mean:0.5_2")},
                      grpo={"clip_ratio_c": 3.0}),
    "bypass_reject": dict(correction={"bypass": True, "rejected": "drop", **parse_reject("k3:token:0.001")},
                          grpo={"off_policy_mask_threshold": 0.0}),
    "trl_cispo": dict(correction={"correction": "token_truncate", "is_cap": None, "is_cap_min": 0.5},
                      grpo={"loss_type": "cispo", "epsilon_high": 5.0}),
}


@pytest.mark.parametrize("name", OPTIONS)
def test_each_option_trains_and_logs_the_diagnostics(tmp_path, name):
    run = tmp_path / name
    run_training(small_preset(**OPTIONS[name]), run, progress=False)
    rows = M.read_metrics(run)
    assert [r[M.STEP] for r in rows] == [0, 1, 2]
    extra = {"aligned": (M.MISMATCH_KL_TOKEN_BF16, M.MISMATCH_KL_BF16), "aligned_token": (M.MISMATCH_KL_TOKEN_BF16,),
             "tbpo": (M.LOSS_DUAL_CLIP,)}.get(name, ())
    for row in rows:
        for key in (*NEW_METRICS, *extra, M.LOSS_POLICY, M.AIS_LAMBDA):
            assert isinstance(row.get(key), float) and math.isfinite(row[key]), (name, key)
        assert 0.0 <= row[M.CORR_REJECT_FRAC] <= 1.0 and 0.0 <= row[M.CORR_ESS] <= 1.0
        assert row[M.MISMATCH_PPL_TRAIN] >= 1.0 and row[M.MISMATCH_PPL_ROLLOUT] >= 1.0
        assert row[M.MISMATCH_CHI2_TOKEN] >= -1.0 and row[M.MISMATCH_K3_TOKEN] >= 0.0
    if name.startswith("bypass"):  # π_old := μ: no measurable mismatch, every weight 1
        assert all(r[M.MISMATCH_KL_TOKEN] == 0.0 and r[M.CORR_OMEGA_MEAN] == 1.0 for r in rows)
    elif name.startswith("aligned"):  # the fake-quant forward reproduces μ: the remaining KL is far below BF16's
        for r in rows:
            assert r[M.MISMATCH_KL_TOKEN_BF16] != 0.0
            assert abs(r[M.MISMATCH_KL_TOKEN]) <= 0.01 * abs(r[M.MISMATCH_KL_TOKEN_BF16]), r
            if name == "aligned":  # sequence level: the coupled-ELBO mismatch/kl, aligned vs plain, same masks
                assert r[M.MISMATCH_KL_BF16] != 0.0
                assert abs(r[M.MISMATCH_KL]) <= 0.01 * abs(r[M.MISMATCH_KL_BF16]), r
    else:  # FP8 rollouts: the diagnostics see the mismatch
        assert all(r[M.MISMATCH_CHI2_TOKEN] != 0.0 for r in rows)
    if name in ("reject_tokens", "verl_drop"):
        assert all(0.0 < r[M.CORR_REJECT_FRAC] < 1.0 for r in rows)
    if name == "bypass_reject":  # the loss's rejection on π_θ / μ (the FP8 mismatch itself) logs its own fraction
        assert any(r[M.CORR_REJECT_FRAC] > 0.0 for r in rows) and all(r[M.CORR_REJECT_FRAC] < 1.0 for r in rows)
        assert all(M.LOSS_OFF_POLICY_MASKED in r for r in rows)
    if name == "verl_drop":
        assert all(M.reject_frac_key("token_k1") in r and M.reject_frac_key("seq_mean_k1") in r for r in rows)


def _final_weights(run):
    return load_file(str(RunDir(run).latest() / "model" / "model.safetensors"))


def test_bypass_with_bf16_rollouts_equals_no_correction(tmp_path):
    runs = {}
    for name, corr in (("none", {"correction": "none"}), ("bypass", {"correction": "none", "bypass": True})):
        runs[name] = tmp_path / name
        run_training(small_preset(correction=corr, steps=2, rollout_precision="bf16"), runs[name], progress=False)
    a, b = (M.read_metrics(runs[k]) for k in ("none", "bypass"))
    drop = ("time/", "rollout/tokens_per_s")
    assert [{k: v for k, v in r.items() if not k.startswith(drop)} for r in a] == \
        [{k: v for k, v in r.items() if not k.startswith(drop)} for r in b]
    wa, wb = _final_weights(runs["none"]), _final_weights(runs["bypass"])
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_aligned_forward_needs_fp8_rollouts(tmp_path):
    with pytest.raises(ValueError, match="rollout-precision fp8"):
        run_training(small_preset(correction={"train_forward": "aligned"}, rollout_precision="bf16", steps=1),
                     tmp_path / "run", progress=False)


def test_cli_flags_reach_the_configs():
    args = build_parser().parse_args([
        "train", "--correction", "band", "--band", "0.25", "4", "--correction-level", "geometric",
        "--reject", "k3:seq_mean:0.01", "--normalize-weights", "--bypass", "--loss-type", "tbpo", "--dual-clip", "2",
        "--mask-error-completions", "0.4", "--error-ngram", "3", "--is-cap", "3", "--is-cap-min", "0.1",
        "--ais-target", "band", "--rejected", "drop", "--ais-tau", "0.1", "--ais-ema", "0.5",
        "--ais-combiner", "severity"])
    p = _train_preset(args)
    c, g = p.correction, p.grpo
    assert (c.correction, c.band_low, c.band_high, c.correction_level) == ("band", 0.25, 4.0, "geometric")
    assert (c.reject_stat, c.reject_agg, c.reject_threshold) == ("k3", "seq_mean", 0.01)
    assert c.normalize_weights and c.bypass and (c.is_cap, c.is_cap_min, c.ais_target) == (3.0, 0.1, "band")
    assert (g.loss_type, g.dual_clip, g.error_mask_threshold, g.error_ngram) == ("tbpo", 2.0, 0.4, 3)
    assert c.rejected == "drop"
    assert (c.ais_tau, c.ais_ema, c.ais_combiner) == (0.1, 0.5, "severity")
    p = _train_preset(build_parser().parse_args([
        "train", "--reject", "k3:token:0.05,k1:seq_mean:0.999_1.001", "--no-is-cap", "--clip-ratio-c", "3",
        "--off-policy-mask", "0.5", "--epsilon-high", "0.28"]))
    c, g = p.correction, p.grpo
    assert c.reject_stat == "none" and c.reject_rules == ("k3:token:0.05", "k1:seq_mean:0.999_1.001")
    assert c.is_cap is None and (g.clip_ratio_c, g.off_policy_mask_threshold, g.epsilon_high) == (3.0, 0.5, 0.28)
    p = _train_preset(build_parser().parse_args(["train", "--correction", "token_mask", "--train-forward", "aligned"]))
    assert (p.correction.correction, p.correction.correction_level, p.correction.train_forward) == \
        ("mis", "token", "aligned")
    default = _train_preset(build_parser().parse_args(["train"]))
    assert default.correction == get_preset("tiny-cpu").correction and default.grpo == get_preset("tiny-cpu").grpo


def test_diffusion_token_mismatch_is_the_one_step_estimator_difference():
    from dllm_ais.families import get_family as family
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.models.load import encode_prompts

    p = get_preset("tiny-cpu")
    fam = family(p.model.family)
    model, tok = fam.load(p.model)
    backend = fam.backend(p.sampler, model, tok)
    fp8 = quantize_model(model, backend="torch")
    ids, mask = encode_prompts(tok, ["12+7=", "3+45="], chat=True, device="cpu")
    rollout = backend.sample(fp8, ids, mask, torch.Generator().manual_seed(0))
    log_w = backend.mismatch_log_w(model, fp8, rollout, torch.Generator().manual_seed(5), "token")
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(5)))
    expected = backend.token_logp(model, rollout, seed) - backend.rollout_token_logp(fp8, rollout, seed)
    torch.testing.assert_close(log_w, torch.where(rollout.completion_mask, expected, 0.0))
    assert log_w.abs().max() > 0
    same = backend.mismatch_log_w(fp8, fp8, rollout, torch.Generator(), "geometric")
    assert torch.equal(same, torch.zeros_like(log_w))
