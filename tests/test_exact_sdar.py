"""SDAR's rows of the exact estimator card (analysis/exact_sdar.py, issue 42 item 5): the enumerated law is the law of
the package's SDAR sampler (G-tests against sdar_sample's frequencies, both strategies), its block-wise ELBO moments
are the law of the package's own mask draws (likelihood.py `draw_block_masks`), and the analysis runs end to end."""

from dataclasses import asdict

import pytest
import torch
from dream_helpers import g_test

from dllm_ais.analysis import estimator_draws as D
from dllm_ais.analysis import estimators as E
from dllm_ais.analysis import exact_testbed as tb
from dllm_ais.analysis.exact_sampler import canvas_logits, canvas_table
from dllm_ais.analysis.exact_sdar import block_elbo, sdar_distribution
from dllm_ais.models.sdar.likelihood import draw_block_masks
from dllm_ais.models.sdar.sampler import SDARSamplerConfig, sdar_sample


@pytest.fixture(scope="module")
def bed():
    torch.set_num_threads(1)
    cfg = E.EstimatorsConfig(testbed=tb.TestbedConfig(vocab=2, prompt_len=1, gen_length=4, num_prompts=2, d_model=16,
                                                      n_layers=1, n_heads=2, mlp=16), budgets=(1, 2))
    t = tb.TestbedConfig(**{**asdict(cfg.testbed), "seed": 1})
    model = tb.make_sdar(t)
    model.load_state_dict(tb.sft_checkpoints(model, t, (0, 30), family="sdar", lr=cfg.sft_lr)[30])
    model.eval()
    prompts = tb.draw_prompts(t)
    with torch.no_grad():
        logits = canvas_logits(model, prompts, canvas_table(t.vocab, t.gen_length), t.mask_id)
    return {"cfg": cfg, "t": t, "model": model, "prompts": prompts, "logits": logits}


@pytest.mark.parametrize("rule", ["low_confidence_static", "low_confidence_dynamic"])
def test_enumerated_law_is_the_sdar_samplers(bed, rule):
    """π sums to 1 and 6,000 draws per prompt (V_c = 2, L = 4) of sdar_sample (steps = L, blocks of 2, T = 1) pass a
    G-test against it; the dynamic rule commits two slots at once on some paths (so the two rules differ here)."""
    t, model, prompts = bed["t"], bed["model"], bed["prompts"]
    pi = sdar_distribution(bed["logits"], t.vocab, rule, t.mask_id, bed["cfg"].threshold)
    assert torch.allclose(pi.sum(-1), torch.ones(pi.shape[0], dtype=torch.float64), atol=1e-6, rtol=0)
    config = SDARSamplerConfig(gen_length=t.gen_length, block_length=tb.SDAR_BLOCK, denoising_steps=tb.SDAR_BLOCK,
                               strategy=rule, threshold=bed["cfg"].threshold, temperature=1.0, cuda_graphs="off")
    n = 6000
    x = model.with_prefix(prompts).repeat_interleave(n, 0)  # [2 n, 2]
    ro = sdar_sample(model.inner, x, torch.ones_like(x, dtype=torch.bool), config, t.mask_id, (),
                     torch.Generator().manual_seed(3))
    assert ro.completion_ids.shape == (2 * n, t.gen_length) and int(ro.completion_ids.max()) < t.vocab
    if rule == "low_confidence_dynamic":
        per_block = ro.commit_step.view(2 * n, -1, tb.SDAR_BLOCK)
        assert bool((per_block[..., 0] == per_block[..., 1]).any())  # a block finished in one step
    idx = tb.sequence_index(ro.completion_ids, t.vocab).view(2, n)
    for i in range(2):
        counts = torch.bincount(idx[i], minlength=t.vocab ** t.gen_length)
        assert g_test(counts, n * pi[i])[2] > 1e-3


def test_block_elbo_moments_are_the_package_draws():
    """elbo-block's exact coefficient mean and second moment (K = 2, L = 4) equal the averages over 40,000 of the
    package's own draws (draw_block_masks, weight n_b / l / K on the block's subset)."""
    L, K, M = 4, 2, 40000
    sp = D.Space(1, L)
    mom = block_elbo(sp, K)
    mask, weight = draw_block_masks(torch.ones(M, L, dtype=torch.bool), tb.SDAR_BLOCK, K,
                                    torch.Generator().manual_seed(0))
    lut = torch.zeros(2 ** L, L, dtype=torch.long)
    for (s, m, j), c in sp.a.items():
        if s == 0:
            lut[m, j] = c
    W = torch.zeros(M, len(sp.a), dtype=torch.float64)
    for b in range(L // tb.SDAR_BLOCK):
        cols = slice(b * tb.SDAR_BLOCK, (b + 1) * tb.SDAR_BLOCK)
        for k in range(K):
            m = mask[:, k, cols]
            bits = (m.long() * 2 ** torch.arange(b * tb.SDAR_BLOCK, (b + 1) * tb.SDAR_BLOCK)).sum(-1)  # [M]
            for i, j in enumerate(range(cols.start, cols.stop)):
                hit = m[:, i]
                W[hit, lut[bits[hit], j]] += weight[hit, k, j].double() / K
    node = mom.nodes[0]
    mean, second = node.mean[0, 0], node.second[0, 0]
    assert float((W.mean(0) - mean).abs().max()) < 0.03 * float(mean.abs().max())
    assert float((W.T @ W / M - second).abs().max()) < 0.05 * float(second.abs().max())
    assert float(mean.sum()) == pytest.approx(L, abs=1e-12)  # Σ weights = n_b per block: unbiased for the ELBO


def test_sdar_rows_of_the_card(bed):
    """One model: every SDAR estimator has figures at both strategies, trajectory's measured rows are the replay's
    two-stream forwards (2 under static; fewer under dynamic, whose blocks can finish in one step)."""
    cfg = bed["cfg"]
    res = E.analyse_model(bed["model"], bed["prompts"], cfg, E.mask_moments(cfg), 1, "sdar")
    for rule in ("low_confidence_static", "low_confidence_dynamic"):
        est = res[rule]["estimators"]
        assert set(est) == {"one_step-block", "elbo-block", "trajectory", "trajectory-merge2"}
        for name, bs in est.items():
            for f in bs.values():
                assert f["mse"] > 0 and f["bias_sq"] >= 0 and -1 <= f["cos_g_star"] <= 1, name
    assert res["low_confidence_static"]["estimators"]["trajectory"]["2"]["rows"] == pytest.approx(2.0)
    assert 1.0 < res["low_confidence_dynamic"]["estimators"]["trajectory"]["2"]["rows"] < 2.0
    assert res["low_confidence_static"]["estimators"]["trajectory-merge2"]["1"]["rows"] == pytest.approx(1.0)
