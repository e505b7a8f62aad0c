"""`--policy-logprob trajectory` for Dream (issue 41, item 3): the policy likelihood replays the rollout's canvases
through likelihood/trajectory.py's loop with Dream's step (models/dream/trajectory.py `chunk_terms`: the shift, the
filtered proposal, each algorithm's selection term, the cache as it ran). Per token it sums to the exact path law
(tests/test_dream_path_likelihood.py: sums to 1, equals the sampler's frequencies) on rows whose every token counts,
carries gradients, equals the sampler's record under the sampling model, and trains (one step here; the learning run
is in docs/cpu.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.models.tiny import tiny_dream_model
from dllm_ais.presets import get_preset

MASK = 4
SETTINGS = {
    "uncached": SamplerConfig(gen_length=6, block_length=6, steps=6, temperature=1.0),
    "threshold": SamplerConfig(gen_length=6, block_length=6, steps=3, temperature=1.0, threshold=0.2),
    "dual": SamplerConfig(gen_length=6, block_length=3, steps=4, temperature=1.0, cache="dual"),
    "prefix-entropy": SamplerConfig(gen_length=6, block_length=3, steps=4, temperature=1.0, cache="prefix",
                                    dream_alg="entropy"),
}


def _backend(sampler, model, **train):
    from dllm_ais.families import get_family

    p = get_preset("tiny-dream")
    sampler = replace(sampler, dream_alg=sampler.dream_alg or "maskgit_plus", dream_alg_temp=0.0)
    return get_family("dream").backend(sampler, model, None, replace(p.train, **train))


@pytest.mark.parametrize("name", list(SETTINGS))
def test_policy_terms_are_the_path_law_and_carry_gradients(name):
    from dllm_ais.models.dream.trajectory import path_logprob

    model = tiny_dream_model(seed=5)
    backend = _backend(SETTINGS[name], model, policy_logprob="trajectory", trajectory_selection=True)
    prompt = torch.randint(5, 100, (8, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        r = backend.sample(model, prompt, torch.ones_like(prompt, dtype=torch.bool), torch.Generator().manual_seed(1))
    backend.prepare(r, torch.Generator().manual_seed(2))
    lp = backend.token_logp(model, r, seed=0)  # [B, L] with gradients
    full = r.completion_mask.all(-1)
    with torch.no_grad():
        exact = path_logprob(model, r, backend.dream, MASK)
        mu = backend.rollout_token_logp(model, r, seed=0)  # the sampler's record: the same model sampled
    assert bool(full.any())
    torch.testing.assert_close(lp.sum(-1)[full].detach(), exact[full], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp.detach(), mu.to(lp.dtype), rtol=1e-5, atol=1e-5)
    lp.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0
    rows = torch.tensor([5, 1])  # a micro-batch's rows: the same terms
    torch.testing.assert_close(backend.token_logp(model, r, seed=0, rows=rows).detach(), lp.detach()[rows])


def test_trajectory_steps_subsample_with_horvitz_thompson_weights():
    """--trajectory-steps K on Dream: K of a row's S steps with a counted commit are replayed, their tokens weighted
    S / K (the plan LLaDA's uses)."""
    model = tiny_dream_model(seed=5)
    backend = _backend(SETTINGS["uncached"], model, policy_logprob="trajectory", trajectory_steps=2)
    prompt = torch.randint(5, 100, (6, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        r = backend.sample(model, prompt, torch.ones_like(prompt, dtype=torch.bool), torch.Generator().manual_seed(1))
    backend.prepare(r, torch.Generator().manual_seed(2))
    scale = backend.token_scale(r)
    for b in range(6):
        steps = torch.unique(r.commit_step[b][r.completion_mask[b]])
        kept = torch.unique(r.commit_step[b][scale[b] > 0])
        assert kept.numel() == min(2, steps.numel())
        assert torch.allclose(scale[b][scale[b] > 0], torch.tensor(max(steps.numel() / 2, 1.0), dtype=scale.dtype))
    with torch.no_grad():
        lp = backend.token_logp(model, r, seed=0)
    assert bool(((lp != 0) <= (scale > 0)).all())  # only replayed tokens carry a term


def test_tiny_dream_trains_on_the_trajectory_policy_with_fp8_and_the_dual_cache(tmp_path):
    """One GRPO step of tiny-dream with the trajectory policy likelihood (selection terms on), FP8 rollouts with
    the dual cache and the trajectory mismatch ratio: finite loss and weights, and the first iteration's ratio is 1."""
    from dllm_ais import metrics as M
    from dllm_ais.train.job import run_training

    p = get_preset("tiny-dream")
    p = replace(p, sampler=replace(p.sampler, gen_length=6, block_length=3, steps=4, cache="dual"),
                train=replace(p.train, steps=1, prompts_per_step=2, sft_steps=0, policy_logprob="trajectory",
                              trajectory_selection=True, mismatch_estimator="trajectory"),
                grpo=replace(p.grpo, num_generations=4, num_iterations=1))
    run_training(p, tmp_path / "run", progress=False)
    row = M.read_metrics(tmp_path / "run")[0]
    assert all(torch.isfinite(torch.tensor(float(row[k]))) for k in (M.LOSS_POLICY, M.MISMATCH_KL, M.AIS_LAMBDA))
    assert row[M.LOSS_CLIP] == 0.0  # θ = π_old at the first iteration (the only one here): no ratio was clipped
