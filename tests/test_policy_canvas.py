"""The recorded-canvas policy likelihoods (`--policy-logprob mdpo | dtreerpo`) on real rollouts of a tiny LLaDA:
shared draws (first-iteration ratio exactly 1, micro-batches see the batch's canvases), gradients flow, post-EOS
positions never scored, MDPO's subsample mean equals its all-canvas value (z-test over draws), d-TreeRPO's one
segment is d1's one-step estimator without prompt masking, and a few GRPO steps of tiny-cpu train with each."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from dllm_ais import metrics as M
from dllm_ais.config import PolicyLikelihoodConfig, SamplerConfig
from dllm_ais.likelihood.mask_draws import draw_logprobs
from dllm_ais.likelihood.mdpo import draw_mdpo
from dllm_ais.likelihood.one_step import one_step_logprobs
from dllm_ais.likelihood.policy import POLICY_LIKELIHOODS, policy_likelihood
from dllm_ais.models.tiny import init_weights, tiny_model
from dllm_ais.presets import get_preset
from dllm_ais.rl.config import GRPOConfig
from dllm_ais.rl.grpo import grpo_loss
from dllm_ais.samplers.diffusion import diffusion_sample
from dllm_ais.train.backend import DiffusionBackend
from dllm_ais.train.job import run_training

MASK, EOS = 4, 1
SAMPLER = SamplerConfig(gen_length=6, block_length=3, steps=6, temperature=1.0)


@pytest.fixture(scope="module")
def model():
    m = tiny_model(seed=3, dtype=torch.float64, d_model=32, n_heads=2, n_layers=1, mlp_hidden_size=64)
    return init_weights(m, torch.Generator().manual_seed(3), std=0.3).eval()


@pytest.fixture(scope="module")
def rollout(model):
    """6 rows (2 prompts × 3), one of them cut by an EOS at position 2 (its tail masked on early canvases)."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(5, 100, (2, 3), generator=g).repeat_interleave(3, 0)
    ro = diffusion_sample(model, prompts, torch.ones_like(prompts, dtype=torch.bool), SAMPLER, MASK, (EOS,),
                          generator=torch.Generator().manual_seed(1))
    ro.completion_ids[1, 2] = EOS  # as if row 1 had stopped there (its commit steps stay the sampler's)
    ro.completion_mask[1] = torch.arange(6) <= 2
    return ro


def _backend(name, **cfg):
    return DiffusionBackend(SAMPLER, MASK, (EOS,), policy_logprob=name, likelihood=PolicyLikelihoodConfig(**cfg))


@pytest.mark.parametrize("name,cfg", [("mdpo", {"mdpo_steps": 3}), ("mdpo", {"mdpo_confidence": False}),
                                      ("dtreerpo", {"dtreerpo_segments": 3})])
def test_first_iteration_ratio_is_one_and_gradients_flow(model, rollout, name, cfg):
    be = _backend(name, **cfg)
    with torch.no_grad():
        old = be.token_logp(model, rollout, seed=7)
    assert (old[~rollout.completion_mask] == 0).all() and bool((old[rollout.completion_mask] != 0).any())
    model.zero_grad()
    new = be.token_logp(model, rollout, seed=7, rows=torch.arange(6))
    assert torch.equal(new.detach(), old)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0], dtype=torch.float64)
    out = grpo_loss(new, old, adv, rollout.completion_mask, GRPOConfig(beta=0.0, loss_type="dapo"))
    assert float(out.clip_ratio_region) == 0.0 and torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and max(float(g.abs().max()) for g in grads) > 1e-4
    for rows in (torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])):  # a micro-batch sees the batch's canvases
        with torch.no_grad():
            torch.testing.assert_close(be.token_logp(model, rollout, 7, rows=rows), old[rows], rtol=0, atol=1e-12)


def test_post_eos_tokens_are_masked_on_early_canvases_and_never_scored(model, rollout):
    """Row 1's tail shows as the canvas recorded it: masked before its commit step, itself after."""
    for name in ("mdpo", "dtreerpo"):
        d = _backend(name).policy_draw(rollout, 3)
        tail = ~rollout.completion_mask[1]
        assert not bool(d.mask[1][:, tail].any()) and not bool((d.weight[1][:, tail] != 0).any())
        used = d.mask[1].any(-1)
        assert bool(d.hidden[1][used][:, tail].any())  # an early canvas masks the tail


def test_mdpo_subsample_mean_equals_every_canvas_value(model, rollout):
    """MDPO's K canvases are drawn uniformly without replacement: over 600 draws each row's mean per-token terms
    equal the all-canvas terms (K ≥ steps, exact: no randomness) within 4.5 standard errors, and each canvas is drawn
    with probability K / S_b."""
    ro, K = rollout, 2
    conf = ro.logp_rollout.double().exp()
    full = draw_mdpo(ro.commit_step, ro.completion_mask, 100, 0, conf)
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    with torch.no_grad():
        lp = draw_logprobs(model, *args, full, mask_token_id=MASK)  # [B, S, L] every canvas once
    exact = (full.weight * lp).sum(1)  # [B, L]
    key = full.hidden.sum(-1)  # [B, S] a canvas is identified by its masked count (strictly decreasing)
    n, draws, hits = 600, [], torch.zeros(key.shape, dtype=torch.float64)
    for seed in range(n):
        d = draw_mdpo(ro.commit_step, ro.completion_mask, K, seed, conf)
        idx = (d.hidden.sum(-1)[:, :, None] == key[:, None, :]) & d.hidden.any(-1)[:, :, None]  # [B, K, S]
        hits += idx.any(1).double()
        draws.append((d.weight[:, :, None, :] * idx[..., None] * lp[:, None]).sum((1, 2)))
    x = torch.stack(draws)  # [n, B, L]
    se = x.std(0) / math.sqrt(n)
    scored = ro.completion_mask & (exact != 0)
    z = ((x.mean(0) - exact).abs() / se.clamp_min(1e-12))[scored]
    assert bool((z < 4.5).all()), z.max()
    S_b = full.hidden.any(-1).sum(-1).double()  # [B]
    freq = hits / n
    want = torch.where(full.hidden.any(-1), (K / S_b).clamp(max=1.0)[:, None], 0.0)
    assert bool(((freq - want).abs() <= 4.5 * (want * (1 - want) / n).sqrt() + 1e-12).all())
    assert bool((S_b > K).any())  # the subsample is random somewhere


def test_one_dtreerpo_segment_is_d1_one_step_without_prompt_masking(model, rollout):
    """s = 1: every token is scored at x_0 (the whole completion masked, the tail too) — d1's estimator with
    p_mask_prompt = 0; more segments show committed tokens and change the log-probs."""
    like = policy_likelihood("dtreerpo", PolicyLikelihoodConfig(dtreerpo_segments=1))
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
    with torch.no_grad():
        got = like.token_logp(model, *args, like.draw_rollout(rollout, 0), mask_token_id=MASK)
        d1 = one_step_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                               mask_token_id=MASK, prompt_masked=torch.zeros_like(rollout.prompt_mask))
        two = policy_likelihood("dtreerpo", PolicyLikelihoodConfig(dtreerpo_segments=2))
        seg2 = two.token_logp(model, *args, two.draw_rollout(rollout, 0), mask_token_id=MASK)
    torch.testing.assert_close(got, torch.where(rollout.completion_mask, d1, 0.0), rtol=0, atol=1e-12)
    assert not torch.allclose(seg2, got)


def test_registry_rows_levels_and_refusals(rollout):
    assert {"mdpo", "dtreerpo"} <= set(POLICY_LIKELIHOODS)
    mdpo = policy_likelihood("mdpo", PolicyLikelihoodConfig(mdpo_steps=16), sampler_steps=5)
    dt = policy_likelihood("dtreerpo", PolicyLikelihoodConfig(dtreerpo_segments=4), sampler_steps=6)
    assert (mdpo.level, mdpo.rows_per_sequence, dt.level, dt.rows_per_sequence) == ("token", 5, "token", 4)
    d = dt.draw_rollout(rollout, 0)
    assert d.mask.shape[1] == 4 and int(d.mask.any(-1).sum(-1).max()) <= 4
    with pytest.raises(ValueError, match="draw_rollout"):
        mdpo.draw(rollout.prompt_ids, rollout.prompt_mask, rollout.completion_mask, 0)
    with pytest.raises(ValueError, match="logp_rollout"):
        mdpo.draw_rollout(replace(rollout, logp_rollout=None), 0)
    for kw in ({"mdpo_steps": 0}, {"dtreerpo_segments": 0}, {"mdpo_steps": True}):
        with pytest.raises(ValueError, match="int >= 1"):
            PolicyLikelihoodConfig(**kw)


@pytest.mark.parametrize("name", ["mdpo", "dtreerpo"])
def test_a_few_grpo_steps_of_tiny_cpu_train(tmp_path, name):
    """tiny-cpu shrunk (2 prompts × 4 generations, 3 SFT steps, 2 GRPO steps; MDPO on 2 canvases per sequence): the
    loss is finite, no step is skipped, some advantage is non-zero and the weights move."""
    from safetensors.torch import load_file

    from dllm_ais.train.run_dir import RunDir

    p = get_preset("tiny-cpu")
    p = replace(p, train=replace(p.train, steps=2, prompts_per_step=2, sft_steps=3, sft_batch_size=8,
                                 mismatch_num_draws=2, policy_logprob=name,
                                 likelihood=replace(p.train.likelihood, mdpo_steps=2)),
                grpo=replace(p.grpo, num_generations=4))
    run_training(p, tmp_path, progress=False)
    rows = M.read_metrics(tmp_path)
    assert len(rows) == 2 and all(math.isfinite(r[M.LOSS_POLICY]) for r in rows)
    assert all(r[M.SKIPPED_STEPS] == 0 for r in rows) and any(r[M.ADV_ZERO_STD] < 1 for r in rows)
    start = load_file(str(tmp_path / "sft" / "model.safetensors"))
    end = load_file(str(RunDir(tmp_path).latest() / "model" / "model.safetensors"))
    assert any(not torch.equal(start[k], end[k]) for k in start)


def test_flags_reach_the_config_and_are_refused_without_their_likelihood():
    from dllm_ais.cli import build_parser
    from dllm_ais.commands.train_preset import train_preset
    from dllm_ais.train.flags import check_combinations

    args = build_parser().parse_args(["train", "--policy-logprob", "mdpo", "--mdpo-steps", "3", "--mdpo-confidence",
                                      "off"])
    lik = train_preset(args).train.likelihood
    assert (lik.mdpo_steps, lik.mdpo_confidence) == (3, False)
    args = build_parser().parse_args(["train", "--policy-logprob", "dtreerpo", "--dtreerpo-segments", "4"])
    p = train_preset(args)
    assert p.train.likelihood.dtreerpo_segments == 4
    with pytest.raises(ValueError, match="--mdpo-steps has no effect"):
        check_combinations({"--mdpo-steps": 3}, p)
    with pytest.raises(ValueError, match="--dtreerpo-segments has no effect"):
        check_combinations({"--dtreerpo-segments": 3}, get_preset("tiny-cpu"))
