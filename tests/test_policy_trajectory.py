"""Training with the trajectory policy likelihood (--policy-logprob trajectory): the plan shared by θ, π_old and μ,
the ratio exactly 1 at the first inner iteration, Horvitz–Thompson weights in the loss, the mismatch ratio from the
same replay, the rollout metrics, and bad input refused before anything is written."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import dllm_ais.train.trainer as trainer_module
from dllm_ais import metrics as M
from dllm_ais.cli import main
from dllm_ais.config import SamplerConfig
from dllm_ais.presets import get_preset
from dllm_ais.rl.rollout_stats import commit_stats
from dllm_ais.train.job import run_training

FAST = SamplerConfig(gen_length=6, block_length=3, steps=6, temperature=1.0, cache="dual", threshold=0.05)


def _preset(steps: int = 2, accumulation: int = 2, iterations: int = 2, **train):
    p = get_preset("tiny-cpu")
    fields = dict(steps=steps, prompts_per_step=2, sft_steps=0, policy_logprob="trajectory",
                  mismatch_estimator="trajectory", gradient_accumulation_steps=accumulation)
    fields.update(train)
    return replace(p, sampler=FAST, train=replace(p.train, **fields),
                   grpo=replace(p.grpo, num_generations=4, num_iterations=iterations, max_completion_length=6))


@pytest.fixture
def losses(monkeypatch):
    """Every grpo_loss call of the trainer: (logp_train, logp_old, token_scale) detached."""
    seen = []
    real = trainer_module.grpo_loss

    def spy(logp, logp_old, *args, **kwargs):
        scale = kwargs.get("token_scale")
        seen.append((logp.detach().clone(), logp_old.clone(), None if scale is None else scale.clone()))
        return real(logp, logp_old, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "grpo_loss", spy)
    return seen


def graded_reward(tmp_path, monkeypatch) -> str:
    """A reward graded by completion length (the untrained model's task reward is 0 everywhere: no gradient)."""
    name = f"graded_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "def reward(prompts, completions, **cols):\n"
        "    return [float(len(c if isinstance(c, str) else c[0]['content'])) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:reward"


@pytest.mark.parametrize("selection", [False, True], ids=["commit-only", "selection"])
def test_first_iteration_ratio_is_exactly_one_and_the_plan_is_shared(tmp_path, monkeypatch, losses, selection):
    """Micro-batches of 2, 2 inner iterations, K = 2 replayed steps: at the first iteration π_θ's replay equals
    π_old's bit for bit on every token; tokens off the plan carry no term and no loss weight; the weights are S/K."""
    run_training(_preset(trajectory_steps=2, trajectory_selection=selection,
                         reward_fn=graded_reward(tmp_path, monkeypatch)), tmp_path / "run", progress=False)
    rows = M.read_metrics(tmp_path / "run")
    assert len(rows) == 2 and len(losses) == 2 * 2 * 2  # steps × iterations × micro-batches
    for step in range(2):
        calls = losses[step * 4:(step + 1) * 4]
        for logp, old, scale in calls[:2]:  # the first iteration's micro-batches
            assert torch.equal(logp, old)  # exp(0) = 1: the ratio is exactly 1
            assert scale is not None and bool((scale[scale > 0] >= 1).all())
            assert bool((logp[scale == 0] == 0).all()) and bool((logp[scale > 0] < 0).any())
            assert bool((scale > 1).any())  # S_b / K > 1: K = 2 of a sequence's S_b > 2 steps replayed
        for (_, old0, s0), (logp1, old1, s1) in zip(calls[:2], calls[2:], strict=True):
            assert torch.equal(old0, old1) and torch.equal(s0, s1)  # one plan, one π_old for every iteration
            assert not torch.equal(logp1, old1)  # the first update moved θ
    for r in rows:
        assert r[M.LOSS_CLIP] >= 0 and math.isfinite(r[M.AIS_ESS]) and r[M.AIS_LOG_W_MAX] > r[M.AIS_LOG_W_MIN]


def test_the_mismatch_ratio_is_the_policy_replay_against_the_sampler_record(tmp_path, monkeypatch):
    """With a trajectory policy, ℓ = Σ_j scale_j (log π_old − log μ) on the policy's own replay (no extra replay of
    π_old) and μ's record; sequence level, so ais/log_w_mean is the mean of the rows' ℓ, and with K = 2 replayed steps
    the divergence D divides the Horvitz–Thompson ℓ by the sequence's full counted length."""
    seen = {}
    real = trainer_module.Trainer._correction

    def spy(self, rollout, adv, logp_old, seed):
        out = real(self, rollout, adv, logp_old, seed)
        seen.setdefault("rows", []).append((rollout, logp_old.clone(), out[1]))
        return out

    monkeypatch.setattr(trainer_module.Trainer, "_correction", spy)
    import dllm_ais.likelihood.trajectory as trajectory

    monkeypatch.setattr(trajectory, "trajectory_log_ratio", None)  # never called: π_old's replay is reused
    run_training(_preset(steps=1, trajectory_selection=True, trajectory_steps=2), tmp_path / "run", progress=False)
    (rollout, old, metrics), = seen["rows"]
    plan = rollout.trajectory_plan
    assert bool((plan.scale > 1).any())  # subsampled
    mu = trajectory.rollout_token_logp(rollout, plan, selection=True)
    ell = (torch.where(plan.scale > 0, old.double() - mu, 0) * plan.scale).sum(-1)
    assert metrics["ais/log_w_mean"] == pytest.approx(float(ell.mean()), abs=1e-5)
    lengths = rollout.completion_mask.sum(-1).double()
    assert metrics[M.AIS_DIVERGENCE] == pytest.approx(float((ell.abs() / lengths).mean()), rel=1e-4)
    assert float(ell.abs().max()) > 1e-3  # an FP8 mismatch is measured


def test_bf16_rollouts_with_a_cache_have_no_mismatch(tmp_path):
    """The policy is the cached sampler: with BF16 rollouts μ = π_old on every canvas, so ℓ ≡ 0 and ESS = 1."""
    run_training(_preset(steps=1, rollout_precision="bf16"), tmp_path / "run", progress=False)
    (r,) = M.read_metrics(tmp_path / "run")
    assert r[M.AIS_LOG_W_MIN] == r[M.AIS_LOG_W_MAX] == 0.0 and r[M.AIS_ESS] == 1.0


def test_rollout_metrics_and_the_cap(tmp_path):
    p = _preset(steps=1, accumulation=1, iterations=1)
    p = replace(p, sampler=replace(FAST, threshold=0.01, max_commit_per_step=2))
    run_training(p, tmp_path / "run", progress=False)
    (r,) = M.read_metrics(tmp_path / "run")
    assert 1.0 <= r[M.ROLLOUT_TOKENS_PER_STEP] <= r[M.ROLLOUT_TOKENS_PER_STEP_MAX] == 2.0  # the cap binds
    assert 1.0 <= r[M.ROLLOUT_GROUP_DISTINCT] <= 4.0 and 0.0 < r[M.ROLLOUT_COMMIT_CONFIDENCE] < 1.0


def test_commit_stats_by_hand():
    commit = torch.tensor([[0, 0, 1, 2], [0, 1, 1, 1], [0, 0, 0, 0], [1, 0, 2, 3]])
    ids = torch.tensor([[5, 6, 7, 1], [5, 6, 7, 1], [9, 9, 9, 9], [9, 9, 9, 8]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    conf = torch.tensor([[0.5, 0.5, 0.5, 0.5], [1.0, 1.0, 1.0, torch.nan], [0.2, 0.2, 0.2, 0.2], [0.5] * 4])
    out = commit_stats(commit, mask, ids, 2, conf)
    # (row, step) counts: [2, 1, 1], [1, 3], [4], [1, 1, 1, 1] -> 16 tokens over 10 pairs
    assert out[M.ROLLOUT_TOKENS_PER_STEP] == pytest.approx(1.6) and out[M.ROLLOUT_TOKENS_PER_STEP_MAX] == 4
    # group 0: [5 6 7 1] and [5 6 7 -] differ (the mask); group 1: [9 9 9 -] vs [9 9 9 8]
    assert out[M.ROLLOUT_GROUP_DISTINCT] == 2.0
    assert out[M.ROLLOUT_COMMIT_CONFIDENCE] == pytest.approx((4 * 0.5 + 3 * 1.0 + 3 * 0.2 + 4 * 0.5) / 14)


@pytest.mark.parametrize("args, flag", [
    (["--max-commit-per-step", "2"], "--max-commit-per-step"),
    (["--trajectory-selection", "on"], "--trajectory-selection"),
    (["--preset", "llada-8b-instruct", "--policy-logprob", "trajectory"], "--policy-logprob trajectory"),
    (["--preset", "tiny-qwen", "--policy-logprob", "trajectory"], "--policy-logprob"),
    (["--policy-logprob", "trajectory", "--max-commit-per-step", "0", "--threshold", "0.9"],
     "--max-commit-per-step"),
])
def test_bad_input_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, args, flag):
    out = tmp_path / "run"
    assert main(["train", *args, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
    assert not out.exists()


def test_flags_reach_the_configs():
    from dllm_ais.cli import _train_preset, build_parser

    args = build_parser().parse_args(["train", "--policy-logprob", "trajectory", "--trajectory-selection", "on",
                                      "--threshold", "0.9", "--max-commit-per-step", "3", "--mismatch-estimator",
                                      "trajectory"])
    p = _train_preset(args)
    assert (p.train.policy_logprob, p.train.trajectory_selection) == ("trajectory", True)
    assert (p.sampler.threshold, p.sampler.max_commit_per_step) == (0.9, 3)
    plain = _train_preset(build_parser().parse_args(["train"]))
    assert (plain.train.policy_logprob, plain.train.trajectory_selection) == ("one_step", False)
    assert plain.sampler.max_commit_per_step is None
