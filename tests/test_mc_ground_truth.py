"""Rung 2 of the estimator ladder (issue 40): its path-law gradients against the package's exact path likelihood,
its vectorised replay plans against the package's, its estimator scores against the package's likelihoods, and the
bridge — rung 2's Monte Carlo on rung 1's testbed agrees with rung 1's exact figures."""

import pytest
import torch

from dllm_ais.analysis import estimators as E
from dllm_ais.analysis.mc_estimators import ESTIMATORS, Batch, Variant
from dllm_ais.analysis.mc_ground_truth import MCConfig, run_cell
from dllm_ais.analysis.mc_head import HeadTap
from dllm_ais.analysis.mc_paths import DreamLaw, LLaDALaw, sample_paths
from dllm_ais.analysis.mc_plans import merged_steps, step_plan
from dllm_ais.analysis.mc_testbed import bridge_bed, bridge_model, exact_head_figures
from dllm_ais.config import PolicyLikelihoodConfig, SamplerConfig
from dllm_ais.likelihood.trajectory import merge_commit_steps, path_logprob, replay_plan
from dllm_ais.models.dream import trajectory as dream_trajectory
from dllm_ais.models.dream.sampler import DreamSamplerConfig
from dllm_ais.models.tiny import tiny_dream_model, tiny_model

MASK = 4  # the tiny tokenizer's mask id


def _llada():
    return tiny_model(0, d_model=32, n_heads=2, mlp_hidden_size=64).eval()


def _dream():
    return tiny_dream_model(0, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                            num_key_value_heads=2).eval()


LAWS = {
    "llada-low-confidence": (_llada, lambda: LLaDALaw(SamplerConfig(gen_length=8, block_length=8, steps=8,
                                                                    temperature=1.0), MASK)),
    "llada-two-blocks": (_llada, lambda: LLaDALaw(SamplerConfig(gen_length=8, block_length=4, steps=8,
                                                                temperature=1.0), MASK)),
    "llada-threshold": (_llada, lambda: LLaDALaw(SamplerConfig(gen_length=8, block_length=8, steps=8,
                                                               temperature=1.0, threshold=0.02), MASK)),
    "dream-entropy": (_dream, lambda: DreamLaw(DreamSamplerConfig(gen_length=8, steps=8, alg="entropy",
                                                                  temperature=1.0), MASK)),
    "dream-maskgit": (_dream, lambda: DreamLaw(DreamSamplerConfig(gen_length=8, steps=8, alg="maskgit_plus",
                                                                  temperature=1.0), MASK)),
}


def _package_path_logprob(model, law, rollout):
    if law.family == "llada":
        return path_logprob(model, rollout, law.config).log_prob
    return dream_trajectory.path_logprob(model, rollout, law.config, MASK)


def _rows(rollout, b):
    return type(rollout)(**{k: v[b:b + 1] if torch.is_tensor(v) and v.dim() and v.shape[0] ==
                            rollout.prompt_ids.shape[0] else v for k, v in vars(rollout).items()})


@pytest.mark.parametrize("name", list(LAWS))
def test_path_record_is_the_package_path_law_and_its_head_gradient(name):
    """log P(path) summed from the sampler's own forwards equals likelihood/trajectory.path_logprob (Dream:
    dream_trajectory.path_logprob) on the same rollout, and ∇_W log P(path) equals autograd through it."""
    make_model, make_law = LAWS[name]
    model, law = make_model(), make_law()
    ids = torch.randint(5, 60, (4, 5), generator=torch.Generator().manual_seed(1))
    rollout, rec = sample_paths(law, HeadTap(model), ids, torch.ones_like(ids, dtype=torch.bool), (1,),
                                torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = _package_path_logprob(model, law, rollout)
    assert torch.allclose(rec.log_prob, ref.double(), atol=1e-9, rtol=0)
    W = model.get_output_embeddings().weight
    model.requires_grad_(False)
    W.requires_grad_(True)
    for b in range(2):
        (g,) = torch.autograd.grad(_package_path_logprob(model, law, _rows(rollout, b)).sum(), W)
        mine = rec.path_grad()[b]
        assert float((mine - g.reshape(-1).double()).norm()) <= 1e-5 * float(g.norm())
        assert float(g.norm()) > 1.0  # not a vacuous comparison


def test_vectorised_plans_equal_the_package_plans():
    """merged_steps = merge_commit_steps exactly; step_plan(None) = replay_plan's scale and rows; step_plan(K) is
    Horvitz–Thompson: every counted token's scale averages to 1 over draws."""
    model = _llada()
    cfg = SamplerConfig(gen_length=16, block_length=4, steps=16, temperature=1.0, threshold=0.02)
    ids = torch.randint(5, 60, (32, 4), generator=torch.Generator().manual_seed(3))
    ro, _ = sample_paths(LLaDALaw(cfg, MASK), HeadTap(model), ids, torch.ones_like(ids, dtype=torch.bool), (1,),
                         torch.Generator().manual_seed(4))
    assert (ro.commit_step == ro.commit_step[:, :1]).float().mean() < 0.9  # several steps per row
    for n in (2, 3, 4):
        assert torch.equal(merged_steps(ro.commit_step, n, 4), merge_commit_steps(ro.commit_step, n, 4))
    scale, _, rows = step_plan(ro.commit_step, ro.completion_mask, None, None)
    ref = replay_plan(ro.commit_step, ro.completion_mask)
    assert torch.equal(scale, ref.scale)
    assert torch.equal(rows, torch.bincount(ref.rows, minlength=32).double())
    g = torch.Generator().manual_seed(5)
    mean = sum(step_plan(ro.commit_step, ro.completion_mask, 2, g)[0] for _ in range(1000)) / 1000
    valid = ro.completion_mask & (ro.commit_step >= 0)
    assert float((mean[valid] - 1).abs().mean()) < 0.08
    assert float(mean[~valid].abs().max()) == 0.0


@pytest.mark.parametrize("name,setting,options", [("one_step", 1, {}), ("elbo", 2, {"elbo_scheme": "stratified"}),
                                                  ("elbo", 2, {"elbo_scheme": "antithetic"}), ("coupled", 3, {}),
                                                  ("spg", 2, {})])
def test_estimator_gradient_is_the_package_likelihood_gradient(name, setting, options):
    """An estimator's unit gradient = autograd (LM head) of Σ c_i s_i with s_i the package likelihood's own value
    on the same draw (policy_likelihood(...).token_logp / sequence_logp; d1's one_step_logprobs)."""
    from dllm_ais.likelihood.one_step import one_step_logprobs
    from dllm_ais.likelihood.policy import policy_likelihood

    model = _llada()
    law = LLaDALaw(SamplerConfig(gen_length=8, block_length=8, steps=8, temperature=1.0), MASK)
    ids = torch.randint(5, 60, (8, 3), generator=torch.Generator().manual_seed(6)).repeat_interleave(4, 0)
    pmask = torch.ones_like(ids, dtype=torch.bool)
    tap = HeadTap(model)
    ro, rec = sample_paths(law, tap, ids, pmask, (1, 40), torch.Generator().manual_seed(7))
    assert not bool(ro.completion_mask.all())  # some EOS tails: post-EOS handling is exercised
    adv = torch.linspace(-1.5, 1.5, 32, dtype=torch.float64)
    seq = torch.arange(32)
    bt = Batch(law=law, tap=tap, rollout=ro, record=rec, adv=adv, coef=adv / 7.0, unit=seq // 16, group=seq // 4,
               n_units=2, G=4, block_length=8)
    v = Variant(name, name, setting, options)
    got, rows = ESTIMATORS[name].gradients(bt, v, torch.Generator().manual_seed(8))
    W = model.get_output_embeddings().weight
    model.requires_grad_(False)
    W.requires_grad_(True)
    g = torch.Generator().manual_seed(8)
    if name == "one_step":
        from dllm_ais.likelihood.one_step import draw_prompt_mask

        pm = draw_prompt_mask(pmask, 0.15, g)
        s = (one_step_logprobs(model, ids, pmask, ro.completion_ids, prompt_masked=pm).double()
             * ro.completion_mask).sum(-1)
    else:
        cfg = PolicyLikelihoodConfig(elbo_draws=setting, **options)
        lik = policy_likelihood(name, cfg, 8)
        if name == "coupled":  # one t per unit, drawn in unit order
            parts = [lik.draw(bt.group[u * 16:(u + 1) * 16, None], pmask[:16], ro.completion_mask[u * 16:(u + 1) * 16],
                              g) for u in range(2)]
            from dllm_ais.likelihood.mask_draws import PolicyDraw

            draw = PolicyDraw(torch.cat([p.mask for p in parts]), torch.cat([p.weight for p in parts]), None,
                              torch.cat([p.level for p in parts]))
        else:
            draw = lik.draw(bt.group[:, None], pmask, ro.completion_mask, g)
        args = (model, ids, pmask, ro.completion_ids, ro.completion_mask, draw)
        s = (8 * lik.sequence_logp(*args, adv, mask_token_id=MASK) if name == "spg"
             else lik.token_logp(*args, mask_token_id=MASK).sum(-1)).double()
    (ref,) = torch.autograd.grad((bt.coef * s).sum(), W)
    assert float((got.sum(0) - ref.reshape(-1).double()).norm()) <= 1e-5 * float(ref.norm())
    assert float(ref.norm()) > 1e-3
    assert float(rows.mean()) > 0


@pytest.mark.parametrize("family,rule", [("llada", "low_confidence"), ("dream", "entropy")])
def test_bridge_rung2_agrees_with_rung1(family, rule):
    """At L = 4 on rung 1's testbed (seed 0, 20 SFT steps) rung 2's Monte-Carlo bias², tr Var and MSE of each
    estimator agree with rung 1's exact figures on the same (LM-head) coordinates: within twice the 95 % jackknife
    half-width (the figures share the sampled batches, so their errors move together), and the exact path
    likelihood with selection terms is unbiased for the target."""
    torch.set_num_threads(1)
    cfg = E.EstimatorsConfig(budgets=(1, 2), spg_draws=512, spg_replicas=4)
    model, prompts = bridge_model(cfg, 0, 20, family)
    exact = exact_head_figures(cfg, model, prompts, rule, family=family)
    mc = run_cell(bridge_bed(cfg, model, prompts, rule, family),
                  MCConfig(units=96, blocks=8, budgets=(1, 2), seed=1, estimators=tuple(ESTIMATORS)),
                  log=lambda *_: None)
    compared = 0
    for key, f in mc["estimators"].items():
        if key not in exact:
            continue
        for fld in ("bias_sq", "trace_var", "mse"):
            v, h = f[fld]["value"], f[fld]["half"]
            assert abs(v - exact[key][fld]) <= 2 * h, (key, fld, v, h, exact[key][fld])
            assert h < 0.5 * exact[key]["mse"]  # the interval is informative
            compared += 1
    assert compared >= 30
    assert {k.split(":")[0] for k in mc["estimators"] if k in exact} >= {"mdpo", "dtreerpo"}  # their rows too
    sel = mc["estimators"]["trajectory-selection:all"]["bias_sq"]
    assert abs(sel["value"]) <= max(sel["half"], 1e-6)
    nt = mc["target"]["norm_sq"]
    assert abs(nt["value"] - exact["_target"]["norm_sq"]) <= 2 * nt["half"]
