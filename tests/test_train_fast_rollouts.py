"""Training with fast rollouts (Fast-dLLM cache / threshold) and the trajectory mismatch estimator."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

import dllm_ais.likelihood.trajectory as trajectory
import dllm_ais.samplers.diffusion as diffusion
from dllm_ais import metrics as M
from dllm_ais.cli import main
from dllm_ais.config import SamplerConfig
from dllm_ais.presets import get_preset
from dllm_ais.train.job import run_training


@pytest.fixture
def sampler_configs(monkeypatch):
    """Every SamplerConfig the rollout sampler is called with."""
    seen = []
    real = diffusion.diffusion_sample

    def spy(model, prompt_ids, prompt_mask, config, *args, **kwargs):
        seen.append(config)
        return real(model, prompt_ids, prompt_mask, config, *args, **kwargs)

    monkeypatch.setattr(diffusion, "diffusion_sample", spy)
    return seen


@pytest.mark.parametrize("precision", [None, "fp4"], ids=["fp8-default", "fp4"])
def test_train_cache_threshold_trajectory_three_steps(tmp_path, capsys, sampler_configs, precision):
    out = tmp_path / "run"
    args = ["train", "--cache", "dual", "--threshold", "0.9", "--mismatch-estimator", "trajectory", "--steps", "3",
            "--sft-steps", "0", "--out", str(out), "--no-progress"]
    args += ["--rollout-precision", precision] if precision else []
    assert main(args) == 0, capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config["sampler"]["cache"] == "dual" and config["sampler"]["threshold"] == 0.9
    assert config["train"]["mismatch_estimator"] == "trajectory"
    assert config["train"]["rollout_precision"] == (precision or "fp8")
    assert {(c.cache, c.threshold) for c in sampler_configs} == {("dual", 0.9)}  # reached the rollout sampler
    rows = M.read_metrics(out)
    assert [r[M.STEP] for r in rows] == [0, 1, 2]
    for r in rows:
        for key in (M.MISMATCH_KL, M.AIS_ESS, M.AIS_LAMBDA, M.AIS_LOG_W_MIN, M.AIS_LOG_W_MAX, M.ROLLOUT_NFE):
            assert math.isfinite(r[key]), key
        assert r[M.AIS_LOG_W_MAX] > r[M.AIS_LOG_W_MIN]  # a real mismatch, not zeros
        assert r[M.ROLLOUT_NFE] >= 1


def test_elbo_with_a_cache_is_refused_in_one_line(capsys):
    assert main(["train", "--cache", "prefix", "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--mismatch-estimator trajectory" in err and "--cache prefix" in err
    assert main(["train", "--threshold", "0.8", "--mismatch-estimator", "elbo", "--steps", "1"]) == 2
    assert "--mismatch-estimator trajectory" in capsys.readouterr().err
    preset = get_preset("tiny-cpu")
    with pytest.raises(ValueError, match="drop --trajectory-steps"):
        replace(preset, train=replace(preset.train, mismatch_estimator="trajectory", trajectory_steps=2),
                correction=replace(preset.correction, correction_level="token"))
    with pytest.raises(ValueError, match="--temperature 0"):
        preset = get_preset("tiny-cpu")
        replace(preset, sampler=replace(preset.sampler, temperature=0.0),
                train=replace(preset.train, mismatch_estimator="trajectory"))


def _expected_log_w_mean(ell: torch.Tensor, mask: torch.Tensor, level: str) -> float:
    """ais/log_w_mean from the trajectory's token ℓ_j [B, L] at a correction level (|ℓ| far below the clamp)."""
    lengths = mask.sum(-1)
    if level == "token":
        return float(ell[mask].double().mean())
    seq = torch.where(mask, ell, 0).double().sum(-1)
    if level == "geometric":
        seq = seq / lengths.clamp(min=1)
    return float(seq[lengths > 0].mean())


@pytest.mark.parametrize("level", ["sequence", "token", "geometric"])
def test_every_correction_level_uses_the_trajectory_ratio(tmp_path, monkeypatch, level):
    """AIS at each level over ℓ_j of the trajectory estimator: the logged log_w_mean is that of the replayed ℓ."""
    calls = []
    real = trajectory.trajectory_log_ratio

    def spy(*args, **kwargs):
        est = real(*args, **kwargs)
        calls.append((args[2].completion_mask.clone(), est.token_log_ratio.clone()))
        return est

    monkeypatch.setattr(trajectory, "trajectory_log_ratio", spy)
    p = get_preset("tiny-cpu")
    preset = replace(p, sampler=SamplerConfig(gen_length=6, block_length=3, steps=6, temperature=1.0),
                     train=replace(p.train, steps=2, prompts_per_step=2, sft_steps=0, mismatch_estimator="trajectory",
                                   trajectory_steps=2 if level == "geometric" else None),
                     grpo=replace(p.grpo, num_generations=4, num_iterations=1),
                     correction=replace(p.correction, correction="ais", correction_level=level))
    run_training(preset, tmp_path / "run", progress=False)
    rows = M.read_metrics(tmp_path / "run")
    assert len(calls) == len(rows) == 2  # one replay per step
    for (mask, ell), r in zip(calls, rows, strict=True):
        assert ell.abs().max() > 0
        assert r["ais/log_w_mean"] == pytest.approx(_expected_log_w_mean(ell, mask, level), abs=1e-5)
        assert math.isfinite(r[M.AIS_LAMBDA]) and 0 <= r[M.AIS_LAMBDA] <= 1


def test_train_flags_reach_the_configs():
    from dllm_ais.cli import _train_preset, build_parser

    args = build_parser().parse_args(["train", "--cache", "prefix", "--threshold", "0.7", "--mismatch-estimator",
                                      "trajectory", "--trajectory-steps", "2"])
    preset = _train_preset(args)
    assert (preset.sampler.cache, preset.sampler.threshold) == ("prefix", 0.7)
    assert (preset.train.mismatch_estimator, preset.train.trajectory_steps) == ("trajectory", 2)
    plain = _train_preset(build_parser().parse_args(["train"]))
    assert (plain.sampler.cache, plain.sampler.threshold, plain.train.mismatch_estimator) == ("none", None, "elbo")
