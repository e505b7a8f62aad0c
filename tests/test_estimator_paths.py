"""MDPO's and d-TreeRPO's rows in rung 1's exact card (analysis/estimator_paths.py): the coefficients are the
package's own likelihoods (`--policy-logprob mdpo` / `dtreerpo` through likelihood/policy.py, scored by autograd on
each path's recorded Rollout), the exact expected gradient equals a brute-force sum over every path of every
completion, and the second moments match the package's random canvas draws."""

import copy

import pytest
import torch
from test_estimators_analysis import assert_draws_match_moments

from dllm_ais.analysis import estimator_draws as D
from dllm_ais.analysis import estimator_paths as EP
from dllm_ais.analysis import estimators as E
from dllm_ais.analysis import exact_testbed as tb
from dllm_ais.analysis.estimator_families import EXACT_FAMILIES
from dllm_ais.analysis.estimator_features import feature_gradients
from dllm_ais.analysis.exact_sampler import canvas_logits, canvas_table
from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.policy import policy_likelihood
from dllm_ais.models.shift import logits_view
from dllm_ais.types import Rollout

RULE = {"llada": "low_confidence", "dream": "entropy"}
OTHER = {"llada": "threshold", "dream": "maskgit_plus"}


@pytest.fixture(scope="module", params=["llada", "dream"])
def bed(request):
    torch.set_num_threads(1)
    family = request.param
    cfg = E.smoke_config()
    t = cfg.testbed
    model = E.MAKE[family](t)
    model.load_state_dict(tb.sft_checkpoints(model, t, (0, 5), family=family, lr=cfg.sft_lr)[5])
    model.eval()
    prompts = tb.draw_prompts(t)
    feats = feature_gradients(model, prompts, t.vocab, t.gen_length)
    with torch.no_grad():
        logits = canvas_logits(logits_view(model), prompts, canvas_table(t.vocab, t.gen_length), t.mask_id)
    rule = RULE[family]
    sets = EXACT_FAMILIES[family].path_sets(logits, t.vocab, rule, t.mask_id, None)
    return {"family": family, "cfg": cfg, "model": model, "prompts": prompts, "feats": feats, "logits": logits,
            "rule": rule, "sets": sets, "sp": D.Space(t.prompt_len, t.gen_length)}


def _rollout(bed, k: int, ps: EP.PathSet, p: int) -> Rollout:
    """Path p of completion k as the sampler records it (a batch of one)."""
    t = bed["cfg"].testbed
    Y = t.vocab ** t.gen_length
    y = tb.all_sequences(t.vocab, t.gen_length)[k % Y]
    prompt = bed["prompts"][k // Y][None]
    return Rollout(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt, dtype=torch.bool), completion_ids=y[None],
                   completion_mask=torch.ones(1, t.gen_length, dtype=torch.bool),
                   commit_step=ps.commit_step[p:p + 1], num_steps=int(ps.num_steps[p]),
                   logp_rollout=ps.logp_commit[p:p + 1])


def _package_grad(bed, name: str, cfg: PolicyLikelihoodConfig, r: Rollout, seed: int, model):
    """∇ Σ_j token_logp of the package's likelihood on rollout r (float64 model), and its draw."""
    lik = policy_likelihood(name, cfg)
    draw = lik.draw_rollout(r, seed)
    lp = lik.token_logp(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, draw,
                        mask_token_id=bed["cfg"].testbed.mask_id)
    grads = torch.autograd.grad(lp.sum(), list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads]), draw


def test_paths_are_the_sampler_law(bed):
    """Every completion of positive probability has paths whose weights sum to 1, each a complete set of commits
    (every position exactly once) whose T covers its steps; the fixed schedules run T = L steps."""
    L = bed["cfg"].testbed.gen_length
    assert all(ps is not None for ps in bed["sets"])
    for ps in bed["sets"]:
        assert float(ps.weight.sum()) == pytest.approx(1.0, abs=1e-12)
        assert bool((ps.commit_step >= 0).all())
        assert bool((ps.num_steps == L).all())  # low-confidence and Dream: steps = L, the last step commits
        assert bool((ps.logp_commit < 0).all())


@pytest.mark.parametrize("name,setting", [("mdpo", 1), ("mdpo", 3), ("dtreerpo", 1), ("dtreerpo", 2)])
def test_coefficients_are_the_package_likelihood(bed, name, setting):
    """On every path of two completions, W · (feature gradients) = the gradient of likelihood/policy.py's own
    token_logp (mdpo: the drawn subset's W is one of the enumerated subsets, each scaled S/K)."""
    md = copy.deepcopy(bed["model"]).double()
    sp, feats = bed["sp"], bed["feats"]
    cfg = PolicyLikelihoodConfig(mdpo_steps=setting, dtreerpo_segments=setting)
    checked = 0
    for k in (1, len(bed["sets"]) - 2):
        ps = bed["sets"][k]
        G = feats.grad_a[k].double()  # [Q, P]
        for p in range(ps.weight.shape[0]):
            g, draw = _package_grad(bed, name, cfg, _rollout(bed, k, ps, p), 7 + p, md)
            W = EP.draw_columns(draw, sp).sum(1)[0]  # [Q] the package draw's coefficients
            assert float((W @ G - g).norm()) <= 1e-5 * float(g.norm())
            if name == "mdpo":  # the draw is one of the enumerated K-subsets of the all-canvas terms
                one = EP.mdpo_path_draw(EP.PathSet(ps.weight[p:p + 1], ps.commit_step[p:p + 1], ps.num_steps[p:p + 1],
                                                   ps.logp_commit[p:p + 1]))
                v = EP.draw_columns(one, sp)[0] * one.mask.any(-1).sum()  # [S, Q]
                K = min(setting, v.shape[0])
                assert any(torch.allclose(W, v[list(c)].sum(0) / K, rtol=0, atol=1e-12)
                           for c in __import__("itertools").combinations(range(v.shape[0]), K))
            checked += 1
    assert checked >= 2  # Dream entropy: the top-k rule makes the path given y nearly unique


@pytest.mark.parametrize("name,setting", [("mdpo", 3), ("dtreerpo", 2)])
def test_card_bias_equals_brute_force(bed, name, setting):
    """The card's bias² and ‖E ĝ‖² = those of E ĝ = Σ_k π_k E[Â | r_k] / (n L) Σ_paths P(path | y) ∇s(path), with
    ∇s by autograd through the package's likelihood on every path of every completion."""
    cfg, t = bed["cfg"], bed["cfg"].testbed
    L = t.gen_length
    tg = E.target(bed["model"], bed["prompts"], bed["logits"], cfg, bed["rule"], bed["family"])
    mom = E.recorded_canvas_moments(bed["family"], bed["sp"], bed["logits"], cfg, bed["rule"])[(name, setting)]
    res = E.closed_forms(mom, bed["feats"], tg, L, cfg.G, cfg.N)
    n = tg.pi.shape[0]
    a = (tg.pi * (tg.m1[0] + tg.m1[1]).gather(1, tg.level)).reshape(-1) / (n * L)
    md = copy.deepcopy(bed["model"]).double()
    pcfg = PolicyLikelihoodConfig(mdpo_steps=setting, dtreerpo_segments=setting)
    g = 0
    for k, ps in enumerate(bed["sets"]):
        for p in range(ps.weight.shape[0]):
            gp, _ = _package_grad(bed, name, pcfg, _rollout(bed, k, ps, p), 0, md)
            g = g + float(a[k] * ps.weight[p]) * gp
    d = g - tg.g_star
    assert res["bias_sq"] == pytest.approx(float(d @ d), rel=1e-4)
    assert res["mean_norm_sq"] == pytest.approx(float(g @ g), rel=1e-4)
    assert res["bias_sq"] > 1e-7  # biased: the check is not vacuous


def test_mdpo_subset_moments_match_package_draws(bed):
    """E W and E W Wᵀ of MDPO with K = 1 of S canvases on one completion = means over the package's own draws
    (paths sampled by P(path | y), `draw_mdpo`'s randperm): z-scores below 5 over 3,000 draws."""
    sp, k = bed["sp"], 3
    ps = bed["sets"][k]
    mean, second, rows = EP.mdpo_path_moments(ps, sp, 1)
    g = torch.Generator().manual_seed(0)
    idx = torch.multinomial(ps.weight, 3000, replacement=True, generator=g)
    from dllm_ais.likelihood.mdpo import draw_mdpo

    draw = draw_mdpo(ps.commit_step[idx], torch.ones(3000, ps.commit_step.shape[1], dtype=torch.bool), 1, g,
                     ps.logp_commit[idx].exp())
    W = EP.draw_columns(draw, sp).sum(1)  # [M, Q]
    assert_draws_match_moments(W, mean, second)
    assert rows == pytest.approx(1.0)
    for K in (1, 2, 3):  # the inclusion-probability form = every subset enumerated, on every completion
        for q in bed["sets"]:
            a, b = EP.mdpo_path_moments(q, sp, K), EP.mdpo_subset_moments(q, sp, K)
            assert torch.allclose(a[0], b[0], rtol=0, atol=1e-12) and torch.allclose(a[1], b[1], rtol=1e-12,
                                                                                      atol=1e-12)
            assert a[2] == pytest.approx(b[2], abs=1e-12)
    full_mean, full_second, _ = EP.mdpo_path_moments(ps, sp, 8)
    assert torch.allclose(full_mean, mean, rtol=0, atol=1e-12)  # unbiased for the all-canvas mean
    assert float(torch.trace(second - full_second)) > 1e-6  # one canvas is noisier than all of them


def test_other_rule_paths_score_as_the_package(bed):
    """The family's other rule (LLaDA threshold: paths of fewer steps than L, each with its own T; Dream
    maskgit_plus): d-TreeRPO with s = 2 and MDPO with every canvas on every path of one completion equal the
    package's likelihoods."""
    cfg, t = bed["cfg"], bed["cfg"].testbed
    rule = OTHER[bed["family"]]
    thr = cfg.threshold if rule == "threshold" else None
    sets = EXACT_FAMILIES[bed["family"]].path_sets(bed["logits"], t.vocab, rule, t.mask_id, thr)
    if rule == "threshold":  # the threshold rule commits in parallel on this model: some paths are shorter
        assert any(bool((ps.num_steps < t.gen_length).any()) for ps in sets if ps is not None)
    md = copy.deepcopy(bed["model"]).double()
    k = max((k for k, ps in enumerate(sets) if ps is not None),
            key=lambda k: (int((sets[k].num_steps < t.gen_length).sum()), sets[k].weight.shape[0]))
    ps = sets[k]
    G = bed["feats"].grad_a[k].double()
    for name in ("mdpo", "dtreerpo"):
        pcfg = PolicyLikelihoodConfig(mdpo_steps=t.gen_length, dtreerpo_segments=2)
        fn = (lambda q: EP.mdpo_path_moments(q, bed["sp"], t.gen_length)) if name == "mdpo" else (
            lambda q: EP.dtreerpo_path_moments(q, bed["sp"], 2))
        for p in range(ps.weight.shape[0]):
            one = EP.PathSet(torch.ones(1, dtype=torch.float64), ps.commit_step[p:p + 1], ps.num_steps[p:p + 1],
                             ps.logp_commit[p:p + 1])
            W, _, _ = fn(one)  # a path of weight 1: E W = its W
            g, _ = _package_grad(bed, name, pcfg, _rollout(bed, k, ps, p), 0, md)
            assert float((W @ G - g).norm()) <= 1e-5 * float(g.norm())


def test_supplement_adds_the_rows_a_full_run_computes():
    """A stored document without MDPO's and d-TreeRPO's rows, supplemented, equals the full run's document
    (JSON-identical); a stored J that is not the rebuilt model's is refused."""
    import json
    from dataclasses import replace

    cfg = replace(E.smoke_config(), families=("llada",), seeds=(1,), checkpoints=(5,))
    full = json.loads(json.dumps(E.run(cfg, None, log=lambda *_: None), sort_keys=True))
    full.pop("timing"), full.pop("summary")
    old = json.loads(json.dumps(full))
    for m in old["per_model"].values():
        for r in m.values():
            del r["estimators"]["mdpo"], r["estimators"]["dtreerpo"]
    got = json.loads(json.dumps(E.supplement_recorded(json.loads(json.dumps(old)), cfg, log=lambda *_: None),
                                sort_keys=True))
    assert got == full
    old["per_model"]["seed1/ck5"]["threshold"]["J"] += 1e-15
    with pytest.raises(ValueError, match="rerun instead"):
        E.supplement_recorded(old, cfg, log=lambda *_: None)
