"""SDAR in rung 2 of the estimator ladder (issue 42 item 5): its recorded path law is the package's exact SDAR path law
(value and LM-head gradient), its estimators' gradients are autograd through the package's own SDAR likelihoods, and
the bridge — rung 2's Monte Carlo on rung 1's SDAR testbed agrees with rung 1's exact figures."""

import pytest
import torch

from dllm_ais.analysis import estimators as E
from dllm_ais.analysis.mc_estimators import Batch, Variant
from dllm_ais.analysis.mc_ground_truth import MCConfig, run_cell
from dllm_ais.analysis.mc_head import HeadTap
from dllm_ais.analysis.mc_paths import sample_paths
from dllm_ais.analysis.mc_sdar import SDARLaw
from dllm_ais.analysis.mc_sdar_estimators import SDAR_ESTIMATORS
from dllm_ais.analysis.mc_testbed import bridge_model, exact_head_figures, sdar_bridge_bed
from dllm_ais.models.sdar.likelihood import block_elbo_token_logp
from dllm_ais.models.sdar.tiny import tiny_sdar_model
from dllm_ais.models.sdar.trajectory import path_logprob, path_terms

MASK = 4  # the tiny tokenizer's mask id


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_sdar_model(0, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                           head_dim=16, std=0.2).eval()


def _sample(model, strategy, tau, B=8, seed=2):
    law, block = SDARLaw.named(strategy, 8, MASK, tau)
    lens = torch.tensor([6, 4, 7, 5] * (B // 4))  # prompt tails of 2, 0, 3, 1 slots in the first block
    ids = torch.randint(5, 60, (B, 7), generator=torch.Generator().manual_seed(1))
    pmask = torch.arange(7)[None, :] >= (7 - lens)[:, None]  # left padding
    tap = HeadTap(model)
    ro, rec = sample_paths(law, tap, ids, pmask, (1,), torch.Generator().manual_seed(seed))
    return law, tap, ro, rec


def _head_grad(model, f):
    W = model.get_output_embeddings().weight
    model.requires_grad_(False)
    W.requires_grad_(True)
    (g,) = torch.autograd.grad(f(), W)
    W.requires_grad_(False)
    return g.reshape(-1).double()


@pytest.mark.parametrize("strategy,tau", [("low_confidence_static", 0.9), ("low_confidence_dynamic", 0.05)])
def test_path_record_is_the_package_sdar_path_law(model, strategy, tau):
    """log P(path) from the sampler's own cached forwards equals models/sdar/trajectory.path_logprob (left-padded
    prompts with prompt tails, slots past a row's canvas), and ∇_W log P(path) equals autograd through it."""
    law, _, ro, rec = _sample(model, strategy, tau)
    assert bool((ro.commit_step < 0).any()) or not bool(ro.completion_mask.all())  # a stop or an unused slot
    with torch.no_grad():
        ref = path_logprob(model, ro, law.config, MASK)
    # two float32 forwards (the sampler's cached block forward, the replay's two-stream one): ~2e-6 apart here
    assert torch.allclose(rec.log_prob, ref.double(), atol=2e-5, rtol=0)
    g = _head_grad(model, lambda: path_logprob(model, ro, law.config, MASK).sum())
    assert float((rec.path_grad().sum(0) - g).norm()) <= 1e-4 * float(g.norm())
    assert float(g.norm()) > 1.0
    if strategy.endswith("dynamic"):  # several commits in one step happen: the dynamic branch is exercised
        assert bool((torch.stack([(ro.commit_step == t).sum(-1) for t in range(ro.num_steps)]) > 1).any())


@pytest.mark.parametrize("label,setting", [("elbo-block", 2), ("trajectory-merge2", 2), ("trajectory", 0)])
def test_sdar_estimator_is_the_package_likelihood_gradient(model, label, setting):
    """An SDAR estimator's unit gradient = autograd (LM head) of Σ c_i s_i with s_i the package's own likelihood
    (block_elbo_token_logp on the same generator; path_terms with shrink 2; path_terms' token terms)."""
    law, tap, ro, rec = _sample(model, "low_confidence_static", 0.9)
    B = ro.completion_ids.shape[0]
    adv = torch.linspace(-1.5, 1.5, B, dtype=torch.float64)
    seq = torch.arange(B)
    bt = Batch(law=law, tap=tap, rollout=ro, record=rec, adv=adv, coef=adv / 7.0, unit=seq // 4, group=seq // 4,
               n_units=2, G=4, block_length=4)
    name = {"elbo-block": "elbo"}.get(label, "trajectory")
    got, rows = SDAR_ESTIMATORS[name].gradients(bt, Variant(name, label, setting), torch.Generator().manual_seed(8))
    cfg = law.config
    if name == "elbo":
        def s():
            return block_elbo_token_logp(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                         block_length=4, gen_length=8, num_draws=2,
                                         generator=torch.Generator().manual_seed(8), mask_token_id=MASK).sum(-1)
        assert torch.equal(rows, torch.full((B,), 2.0))
    else:
        n = max(setting, 1)
        s = lambda: path_terms(model, ro, cfg, MASK, selection=False, shrink=n)[0].sum(-1)  # noqa: E731
        assert float(rows.max()) <= 4 / n and float(rows.min()) >= 1
    ref = _head_grad(model, lambda: (bt.coef * s().double()).sum())
    assert float((got.sum(0) - ref).norm()) <= 1e-5 * float(ref.norm())
    assert float(ref.norm()) > 1e-3


def test_bridge_rung2_agrees_with_rung1_sdar():
    """At L = 4 on rung 1's SDAR testbed (seed 0, 20 SFT steps, static strategy) rung 2's Monte-Carlo bias², tr Var
    and MSE of each SDAR estimator agree with rung 1's exact figures on the LM head's coordinates (within twice the
    95 % jackknife half-width), and the exact path likelihood with selection terms is unbiased for the target."""
    torch.set_num_threads(1)
    cfg = E.EstimatorsConfig(budgets=(1, 2))
    model, prompts = bridge_model(cfg, 0, 20, "sdar")
    rule = "low_confidence_static"
    exact = exact_head_figures(cfg, model, prompts, rule, family="sdar")
    mc = run_cell(sdar_bridge_bed(cfg, model, prompts, rule), MCConfig(units=96, blocks=8, budgets=(1, 2), seed=1),
                  log=lambda *_: None)
    compared = 0
    for key, f in mc["estimators"].items():
        if key not in exact:
            continue
        assert f["rows"]["value"] == pytest.approx(exact[key]["rows"], rel=0.05), key
        for fld in ("bias_sq", "trace_var", "mse"):
            v, h = f[fld]["value"], f[fld]["half"]
            assert abs(v - exact[key][fld]) <= 2 * h, (key, fld, v, h, exact[key][fld])
            assert h < 0.5 * exact[key]["mse"]  # the interval is informative
            compared += 1
    assert compared == 3 * 5  # one_step-block, elbo-block 1 and 2, trajectory, trajectory-merge2
    sel = mc["estimators"]["trajectory-selection:all"]["bias_sq"]
    assert abs(sel["value"]) <= max(sel["half"], 1e-6)
    nt = mc["target"]["norm_sq"]
    assert abs(nt["value"] - exact["_target"]["norm_sq"]) <= 2 * nt["half"]
