"""grad/correction_shift and grad/noise: exact values, an unbiased noise estimate, autograd without touching .grad, and
in a training run the gradient the diagnostic reconstructs is the update's own gradient."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from dllm_ais import metrics as M
from dllm_ais.config import TrainConfig
from dllm_ais.presets import get_preset
from dllm_ais.train import grad_diagnostics as GD
from dllm_ais.train.job import run_training
from dllm_ais.train.run_dir import RunDir


def test_shift_and_noise_hand_worked():
    g_a, g_b, g_1 = [torch.tensor([1.0, 0.0])], [torch.tensor([0.0, 1.0])], [torch.zeros(2)]
    out = GD.shift_and_noise(g_a, g_b, g_1, 0.5)
    assert out["shift"] == pytest.approx(math.sqrt(0.5))  # g_ω = (0.5, 0.5)
    assert out["noise"] == pytest.approx(math.sqrt(2) * 0.5)  # ‖g_a − g_b‖ √(½ · ½)
    assert out["shift_to_noise"] == pytest.approx(1.0)
    out = GD.shift_and_noise(g_a, g_b, [torch.tensor([0.25, 0.75])], 0.25)  # g_ω = (0.25, 0.75) = g_1
    assert out["shift"] == 0.0 and out["noise"] == pytest.approx(math.sqrt(2 * 0.25 * 0.75))
    with pytest.raises(ValueError, match="share_a"):
        GD.shift_and_noise(g_a, g_b, g_1, 1.0)


def test_split_groups():
    a, b = GD.split_groups(12, 4)  # 3 groups: one on the left, two on the right
    assert a.tolist() == [0, 1, 2, 3] and b.tolist() == list(range(4, 12))
    with pytest.raises(ValueError, match="at least 2 prompts"):
        GD.split_groups(4, 4)
    with pytest.raises(ValueError, match="whole number"):
        GD.split_groups(10, 4)


@pytest.mark.parametrize("groups", [6, 7])
def test_noise_is_the_standard_deviation_of_the_batch_gradient(groups):
    """Per-group gradients iid N(μ, σ² I_d): E[noise²] = tr Var(g_ω) = d σ² / n, also for unequal halves."""
    gen = torch.Generator().manual_seed(0)
    d, sigma, draws = 5, 0.7, 4000
    x = 1.0 + sigma * torch.randn(draws, groups, d, generator=gen, dtype=torch.float64)  # [draws, n, d]
    cut = groups // 2
    share_a = cut / groups
    noise_sq = torch.tensor([GD.shift_and_noise([xi[:cut].mean(0)], [xi[cut:].mean(0)], [xi.mean(0)], share_a)["noise"]
                             for xi in x]).pow(2)
    expected = d * sigma ** 2 / groups
    assert abs(float(noise_sq.mean()) - expected) < 3 * float(noise_sq.std()) / math.sqrt(draws)


def test_measure_matches_plain_backward_and_leaves_grad_alone():
    """A linear model, a weighted mean loss; measure's g_a, g_b, g_1 (via its shift/noise) against .backward()."""
    torch.manual_seed(0)
    B, L, G = 8, 3, 2
    model = torch.nn.Linear(4, 1, bias=False).double()
    feats = torch.randn(B, L, 4, dtype=torch.float64)
    mask = torch.rand(B, L) > 0.2
    omega = torch.rand(B, dtype=torch.float64) + 0.5

    def loss_of(rows, w):  # token mean over the rows' masked tokens
        per_token = model(feats[rows]).squeeze(-1) ** 2 * w[:, None]  # [R, L]
        return (per_token * mask[rows]).sum() / mask[rows].sum()

    params = list(model.parameters())
    got = GD.measure(loss_of, params, omega, mask, G, token_mean=True, micro_batches=3)
    assert all(p.grad is None for p in params)

    def backward(rows, w):
        model.zero_grad()
        loss_of(rows, w[rows]).backward()
        return [model.weight.grad.clone()]

    a, b = GD.split_groups(B, G)
    ref = GD.shift_and_noise(backward(a, omega), backward(b, omega), backward(torch.arange(B), torch.ones(B)),
                             float(mask[a].sum() / mask.sum()))
    assert got[M.GRAD_SHIFT] == pytest.approx(ref["shift"], rel=1e-10)
    assert got[M.GRAD_NOISE] == pytest.approx(ref["noise"], rel=1e-10)
    assert got[M.GRAD_SHIFT] > 0


def test_config_refuses_one_prompt_per_step():
    with pytest.raises(ValueError, match="prompts_per_step >= 2"):
        TrainConfig(grad_diagnostics_every=1, prompts_per_step=1)
    with pytest.raises(ValueError, match="must be >= 0"):
        TrainConfig(grad_diagnostics_every=-1)


def _preset(**train):
    p = get_preset("tiny-cpu")
    fields = dict(steps=3, prompts_per_step=3, sft_steps=3, sft_batch_size=8, mismatch_num_draws=2, max_grad_norm=0.0)
    fields.update(train)
    return replace(p, train=replace(p.train, **fields), grpo=replace(p.grpo, num_generations=4, num_iterations=1))


def test_in_training_the_diagnostic_rebuilds_the_update_gradient(tmp_path, monkeypatch):
    """s_a g_a + s_b g_b (the diagnostic's g_ω) equals the gradient the optimizer then steps with; logged every step;
    the run's weights equal those of the same run without the diagnostic."""
    seen, stepped = [], []
    real = GD.shift_and_noise

    def recording(g_a, g_b, g_1, share_a):
        seen.append([share_a * a + (1 - share_a) * b for a, b in zip(g_a, g_b, strict=True)])
        return real(g_a, g_b, g_1, share_a)

    real_step = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        stepped.append([p.grad.clone() for group in self.param_groups for p in group["params"]])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(GD, "shift_and_noise", recording)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    run_training(_preset(grad_diagnostics_every=1), tmp_path / "with", progress=False)
    rows = M.read_metrics(tmp_path / "with")
    assert len(seen) == 3 and len(stepped) >= 3  # the SFT warm-up's AdamW steps come first
    for g_diag, g_update in zip(seen, stepped[-3:], strict=True):
        assert len(g_diag) == len(g_update)
        for a, b in zip(g_diag, g_update, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(float(g.abs().max()) > 0 for g in seen[-1])  # the comparison had something to compare
    moved = [row for row in rows if row[M.GRAD_NOISE] > 0]  # a step whose groups all tie has no gradient at all
    assert moved and all(row[M.GRAD_SHIFT] > 1e-3 * row[M.GRAD_NOISE] for row in moved)  # FP8 rollouts: ω ≠ 1
    for row in moved:
        assert row[M.GRAD_SHIFT_TO_NOISE] == pytest.approx(row[M.GRAD_SHIFT] / row[M.GRAD_NOISE])
    monkeypatch.undo()
    run_training(_preset(), tmp_path / "without", progress=False)
    assert M.GRAD_SHIFT not in M.read_metrics(tmp_path / "without")[0]
    w1 = load_file(str(RunDir(tmp_path / "with").latest() / "model" / "model.safetensors"))
    w2 = load_file(str(RunDir(tmp_path / "without").latest() / "model" / "model.safetensors"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_without_a_correction_the_shift_is_zero(tmp_path):
    p = _preset(grad_diagnostics_every=1)
    p = replace(p, correction=replace(p.correction, correction="none"))
    run_training(p, tmp_path / "run", progress=False)
    rows = M.read_metrics(tmp_path / "run")
    # ω ≡ 1: g_ω is g_1 up to float32 summation order (the halves' gradients are summed, g_1 is one backward)
    assert all(row[M.GRAD_SHIFT] <= 1e-4 * row[M.GRAD_NOISE] for row in rows)
    assert any(row[M.GRAD_NOISE] > 0 for row in rows)
