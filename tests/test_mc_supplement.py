"""MDPO's and d-TreeRPO's rung-2 rows (mc_estimators.RecordedCanvas) and the supplement that adds them to cached
cells (mc_ground_truth.measure_cell / supplement_cell): their gradients are the package likelihoods' own, the
sampled paths are reproduced by the seeded sampler, and supplementing leaves a cached cell's numbers bit-identical
(and refuses a cell it cannot reproduce); the default config's cache keys are those of the committed cells."""

import json
from pathlib import Path

import pytest
import torch

from dllm_ais.analysis import estimators as E
from dllm_ais.analysis.estimator_paths import draw_dtreerpo_own_steps
from dllm_ais.analysis.mc_estimators import ESTIMATORS, SUPPLEMENT_ESTIMATORS, Batch, Variant
from dllm_ais.analysis.mc_ground_truth import TIMING, MCConfig, run_cell, supplement_cell
from dllm_ais.analysis.mc_head import HeadTap
from dllm_ais.analysis.mc_paths import LLaDALaw, sample_paths
from dllm_ais.analysis.mc_testbed import bridge_bed, bridge_model
from dllm_ais.config import PolicyLikelihoodConfig, SamplerConfig
from dllm_ais.likelihood.policy import policy_likelihood
from dllm_ais.models.tiny import tiny_model

MASK = 4


def _batch(threshold):
    model = tiny_model(0, d_model=32, n_heads=2, mlp_hidden_size=64).eval()
    law = LLaDALaw(SamplerConfig(gen_length=8, block_length=8, steps=8, temperature=1.0, threshold=threshold), MASK)
    ids = torch.randint(5, 60, (8, 3), generator=torch.Generator().manual_seed(6)).repeat_interleave(4, 0)
    tap = HeadTap(model)
    ro, rec = sample_paths(law, tap, ids, torch.ones_like(ids, dtype=torch.bool), (1, 40),
                           torch.Generator().manual_seed(7))
    adv = torch.linspace(-1.5, 1.5, 32, dtype=torch.float64)
    seq = torch.arange(32)
    bt = Batch(law=law, tap=tap, rollout=ro, record=rec, adv=adv, coef=adv / 7.0, unit=seq // 16, group=seq // 4,
               n_units=2, G=4, block_length=8)
    return model, ro, bt


@pytest.mark.parametrize("name,setting,threshold", [("mdpo", 2, None), ("mdpo", 0, 0.01), ("dtreerpo", 2, None),
                                                    ("dtreerpo", 3, 0.01)])
def test_recorded_canvas_gradient_is_the_package_likelihood_gradient(name, setting, threshold):
    """The rung-2 unit gradient of mdpo / dtreerpo = autograd (LM head) of Σ c_i Σ_j token_logp of
    likelihood/policy.py's MDPOLikelihood / DTreeRPOLikelihood on the same rollout and draw (EOS tails included; the
    threshold rule's rows have their own T: with a fixed schedule the own-T draw is the package's draw_rollout)."""
    model, ro, bt = _batch(threshold)
    assert not bool(ro.completion_mask.all())
    got, rows = ESTIMATORS[name].gradients(bt, Variant(name, name, setting), torch.Generator().manual_seed(8))
    L = ro.completion_ids.shape[1]
    lik = policy_likelihood(name, PolicyLikelihoodConfig(mdpo_steps=setting or L, dtreerpo_segments=max(setting, 1)))
    if name == "mdpo":
        draw = lik.draw_rollout(ro, torch.Generator().manual_seed(8))
    else:
        draw = draw_dtreerpo_own_steps(ro.commit_step, ro.completion_mask, setting)
        own = ro.commit_step.max(-1).values + 1
        if threshold is None:
            ref = lik.draw_rollout(ro, 0)
            assert bool((own == ro.num_steps).all())
            assert torch.equal(draw.mask, ref.mask) and torch.equal(draw.hidden, ref.hidden)
        else:
            assert int(own.min()) < ro.num_steps  # rows that finished early: their own T is shorter
    W = model.get_output_embeddings().weight
    model.requires_grad_(False)
    W.requires_grad_(True)
    s = lik.token_logp(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, draw,
                       mask_token_id=MASK).sum(-1).double()
    (ref_g,) = torch.autograd.grad((bt.coef * s).sum(), W)
    assert float((got.sum(0) - ref_g.reshape(-1).double()).norm()) <= 1e-5 * float(ref_g.norm())
    assert float(ref_g.norm()) > 1e-3
    assert torch.equal(rows, draw.mask.any(-1).sum(-1).double())


def test_seeded_sampling_reproduces_the_paths():
    """The same generators give the same rollout and path record (what a supplement relies on)."""
    _, a, bta = _batch(0.02)
    _, b, btb = _batch(0.02)
    assert torch.equal(a.commit_step, b.commit_step) and torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(bta.record.token, btb.record.token) and torch.equal(bta.record.log_prob, btb.record.log_prob)


def test_supplement_keeps_the_cached_numbers_and_refuses_other_ones():
    """A cell cached by run_cell, supplemented with mdpo and dtreerpo: its target, J and every cached estimator row
    are bit-identical (through the cache's JSON), the new rows are there and ranked with the others; a cached
    cell whose numbers differ is refused."""
    torch.set_num_threads(1)
    cfg = E.smoke_config()
    model, prompts = bridge_model(cfg, 0, 5, "llada")
    bed = bridge_bed(cfg, model, prompts, "low_confidence", "llada")
    mc = MCConfig(units=16, N=16, G=4, blocks=8, budgets=(1, 2))
    cached = json.loads(json.dumps(run_cell(bed, mc, log=lambda *_: None), sort_keys=True, default=float))
    sup = json.loads(json.dumps(supplement_cell(bed, mc, cached, SUPPLEMENT_ESTIMATORS, log=lambda *_: None),
                                sort_keys=True, default=float))
    assert sup["target"] == cached["target"] and sup["J"] == cached["J"] and sup["units"] == cached["units"]
    for k, f in cached["estimators"].items():
        assert sup["estimators"][k] == f
    new = set(sup["estimators"]) - set(cached["estimators"])
    assert {k.split(":")[0] for k in new} == {"mdpo", "dtreerpo"}
    assert any(k in r["chosen"] for r in sup["rankings"].values() for k in ("mdpo", "dtreerpo"))
    assert set(sup) - set(TIMING) - {"model", "supplement"} == set(cached) - set(TIMING)
    tampered = json.loads(json.dumps(cached))
    tampered["estimators"]["one_step:1"]["mse"]["value"] *= 1 + 1e-12
    with pytest.raises(ValueError, match="changed since it was cached"):
        supplement_cell(bed, mc, tampered, SUPPLEMENT_ESTIMATORS, log=lambda *_: None)


def test_default_cache_keys_are_the_committed_cells():
    """MCConfig's default estimators stay the cached cells' (the supplement is outside the key): the committed
    run's cells (rung2/RUN.md: --lengths 8,16 --paths 4096) keep their cache file names (a supplement is an
    argument of ladder_rung2.run, not part of the config)."""
    from dllm_ais.analysis.ladder import rung2_config
    from dllm_ais.analysis.ladder_rung2 import _cell_cache

    cfg = rung2_config("full", (8, 16), 4096)
    assert _cell_cache(cfg, Path("r"), ("llada", "sft", 8, "low_confidence")).name == \
        "llada-sft-8-low_confidence-645a4769e248.json"
    assert _cell_cache(cfg, Path("r"), ("dream", "rl", 16, "maskgit_plus")).name == \
        "dream-rl-16-maskgit_plus-d137592074a1.json"
