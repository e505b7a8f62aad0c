"""The exact-gradient analysis (issue 27): enumerated sampler probabilities against the sampler itself, surrogate
Grams against per-completion backward passes, closed-form moments against simulated batches, the μ = π_old
invariant, a planted mismatch with a hand-computed bias, AIS's batched λ against rl/correction.py, and a smoke run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dllm_ais.analysis import exact_testbed as tb
from dllm_ais.analysis.exact_moments import (
    Regime,
    advantage_moments,
    level_probs,
    mixture_moments,
    qform,
)
from dllm_ais.analysis.exact_objective import adam_step, objective, objective_after
from dllm_ais.analysis.exact_sampler import ar_distribution, diffusion_distribution
from dllm_ais.analysis.exact_simulate import ais_lambda, batch_forms, draw_batches, evaluate_lambda
from dllm_ais.analysis.exact_surrogates import (
    exact_elbo,
    one_step_expected,
    one_step_gradients,
    per_completion_gradients,
)
from dllm_ais.config import SamplerConfig
from dllm_ais.rl.advantages import group_advantages
from dllm_ais.rl.config import CorrectionConfig
from dllm_ais.rl.correction import correct
from dllm_ais.samplers.diffusion import diffusion_sample

SMALL = tb.TestbedConfig(vocab=3, prompt_len=2, gen_length=3, num_prompts=2, d_model=32, n_heads=2, mlp=32)


@pytest.fixture(scope="module")
def trained():
    """A lightly SFT'd small LLaDA (confident enough for the threshold rule to fire) and its prompts."""
    torch.manual_seed(0)
    model = tb.make_llada(SMALL)
    states = tb.sft_checkpoints(model, SMALL, (40,), lr=3e-3)
    model.load_state_dict(states[40])
    return model.eval(), tb.draw_prompts(SMALL)


def _frequencies(model, prompt, cfg: SamplerConfig, n: int, seed: int) -> torch.Tensor:
    x = prompt[None].expand(n, -1)
    out = diffusion_sample(model, x, torch.ones_like(x, dtype=torch.bool), cfg, SMALL.mask_id, [SMALL.mask_id],
                           generator=torch.Generator().manual_seed(seed)).completion_ids
    return torch.bincount(tb.sequence_index(out, SMALL.vocab), minlength=SMALL.vocab ** SMALL.gen_length).double() / n


@pytest.mark.parametrize("precision, rule", [("bf16", "low_confidence"), ("bf16", "threshold"),
                                             ("mxfp4", "low_confidence"), ("mxfp4", "threshold")])
def test_enumerated_probabilities_sum_to_one_and_are_what_the_sampler_draws(trained, precision, rule):
    """Exact P(y | x) by dynamic programming over partial canvases vs 6,000 draws of samplers/diffusion.py (one
    block, steps = L): every completion's frequency within 4.5 standard errors (MXFP4's quantised logits make exact
    confidence ties, which the sampler breaks towards the lower position)."""
    model, prompts = trained
    mu = tb.rollout_copy(model, precision)
    thr = 0.6 if rule == "threshold" else None
    L = SMALL.gen_length
    with torch.no_grad():
        exact = diffusion_distribution(mu, prompts, SMALL.vocab, L, SMALL.mask_id, rule, threshold=thr)
    assert torch.allclose(exact.sum(-1), torch.ones(len(prompts), dtype=torch.float64), atol=1e-12)
    cfg = SamplerConfig(gen_length=L, block_length=L, steps=L, temperature=1.0, remasking="low_confidence",
                        threshold=thr)
    n = 6000
    freq = _frequencies(mu, prompts[0], cfg, n, seed=1)
    se = (exact[0] * (1 - exact[0]) / n).sqrt().clamp(min=1 / n)
    assert float(((freq - exact[0]).abs() / se).max()) < 4.5
    assert float(exact[0].max()) > 0.05  # concentrated enough for the frequencies to say something


def test_threshold_rule_differs_from_low_confidence_where_it_fires(trained):
    model, prompts = trained
    V, L, mid = SMALL.vocab, SMALL.gen_length, SMALL.mask_id
    with torch.no_grad():
        a = diffusion_distribution(model, prompts, V, L, mid)
        b = diffusion_distribution(model, prompts, V, L, mid, "threshold", threshold=0.6)
        c = diffusion_distribution(model, prompts, V, L, mid, "threshold", threshold=1.1)
    assert float((a - b).abs().max()) > 1e-3  # parallel commits change the distribution
    assert torch.allclose(a, c, atol=1e-12)  # a threshold nothing reaches is the low-confidence rule


def test_autoregressive_probabilities_sum_to_one_and_match_frequencies():
    cfg = tb.TestbedConfig(vocab=3, prompt_len=2, gen_length=2, num_prompts=2, d_model=32, n_heads=2, mlp=32)
    qwen = tb.make_qwen(cfg)
    with torch.no_grad():
        qwen.lm_head.weight.mul_(40.0)  # a less uniform policy
    prompts = tb.draw_prompts(cfg)
    with torch.no_grad():
        exact = ar_distribution(qwen, prompts, cfg.vocab, cfg.gen_length)
    assert torch.allclose(exact.sum(-1), torch.ones(2, dtype=torch.float64), atol=1e-10)
    # ancestral sampling by hand, 4,000 draws
    g, n = torch.Generator().manual_seed(0), 4000
    seq = prompts[:1].expand(n, -1)
    with torch.no_grad():
        for _ in range(cfg.gen_length):
            p = qwen(input_ids=seq).logits[:, -1].double().softmax(-1)
            seq = torch.cat([seq, torch.multinomial(p, 1, generator=g)], 1)
    freq = torch.bincount(tb.sequence_index(seq[:, 2:], 3), minlength=9).double() / n
    se = (exact[0] * (1 - exact[0]) / n).sqrt().clamp(min=1 / n)
    assert float(((freq - exact[0]) / se).abs().max()) < 4.5


def test_one_step_gram_by_logit_jacobian_equals_per_completion_backward():
    cfg = tb.TestbedConfig(vocab=3, prompt_len=2, gen_length=2, num_prompts=2, d_model=32, n_heads=2, mlp=32)
    model = tb.make_llada(cfg)
    prompts = tb.draw_prompts(cfg)
    fast = one_step_gradients(model, prompts, cfg.vocab, cfg.gen_length)
    slow = per_completion_gradients(one_step_expected, model, prompts, cfg.vocab, cfg.gen_length)
    scale = float(slow.gram.abs().max())
    assert float((fast.gram - slow.gram).abs().max()) < 1e-5 * scale
    a = torch.randn(fast.gram.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    va, vb = fast.vector(a), slow.vector(a)
    assert float((va - vb).norm()) < 1e-5 * float(vb.norm())
    assert abs(float(va @ va) - qform(a, a, slow.gram)) < 1e-4 * float(va @ va)  # vectors and Gram agree


def test_exact_elbo_is_the_mean_of_the_monte_carlo_elbo():
    """Every mask enumerated = the expectation of LLaDA's stratified mask-count estimator (5,000 draws, 4 SE)."""
    from dllm_ais.likelihood.elbo import elbo

    model = tb.make_llada(SMALL)
    prompts = tb.draw_prompts(SMALL)
    ys = tb.all_sequences(SMALL.vocab, SMALL.gen_length)[[0, 13]]
    with torch.no_grad():
        exact = exact_elbo(model, prompts, ys)
        mc = elbo(model, prompts, torch.ones_like(prompts, dtype=torch.bool), ys, torch.ones_like(ys, dtype=torch.bool),
                  num_draws=5000, generator=torch.Generator().manual_seed(0), stratified=False,
                  mask_token_id=SMALL.mask_id, batch_size=5000)
    se = mc.per_draw.std(-1) / 5000 ** 0.5
    assert bool(((mc.estimate - exact).abs() < 4 * se).all()), (mc.estimate, exact, se)


def test_closed_form_advantage_moments_match_the_trainer_advantages():
    """E[Â_1 | r_1], E[Â_1² | r_1], E[Â_1 Â_2 | r_1, r_2] by compositions vs 200,000 groups through group_advantages."""
    values = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    probs = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    G, n = 4, 200_000
    mom = advantage_moments(probs, values, G)
    g = torch.Generator().manual_seed(0)
    lv = torch.multinomial(probs[0], n * G, replacement=True, generator=g).view(n, G)
    adv = group_advantages(values[lv].reshape(-1), G).adv.view(n, G).double()
    for a in range(3):
        sel = lv[:, 0] == a
        x = adv[sel, 0]
        assert abs(float(x.mean()) - float(mom.m1[0, a])) < 4 * float(x.std()) / sel.sum() ** 0.5
        assert abs(float((x * x).mean()) - float(mom.m2[0, a])) < 4 * float((x * x).std()) / sel.sum() ** 0.5
        for b in range(3):
            both = sel & (lv[:, 1] == b)
            y = adv[both, 0] * adv[both, 1]
            assert abs(float(y.mean()) - float(mom.m11[0, a, b])) < 4 * float(y.std()) / both.sum() ** 0.5 + 1e-12


def _regime(pi, mu, rewards, L, G=8, cap=2.0):
    level = (rewards * L).round().long()
    return Regime(pi=pi, mu=mu, level=level, values=torch.arange(L + 1, dtype=torch.float64) / L, L=L, G=G, cap=cap)


@pytest.fixture(scope="module")
def setup(trained):
    model, prompts = trained
    V, L = SMALL.vocab, SMALL.gen_length
    grads = one_step_gradients(model, prompts, V, L)
    with torch.no_grad():
        pi = diffusion_distribution(model, prompts, V, L, SMALL.mask_id)
    rewards = tb.rewards(prompts, tb.all_sequences(V, L), V)
    return model, prompts, grads, pi, rewards


def test_closed_form_mse_matches_simulated_batches(setup):
    """bias² + tr Var from the closed form = the mean squared error of simulated batches (uncorrected: plain Monte
    Carlo; TIS: through the control-variate path AIS uses), and the split-half noise estimate is unbiased for tr Var."""
    model, prompts, grads, pi, rewards = setup
    with torch.no_grad():
        mu = diffusion_distribution(tb.rollout_copy(model, "mxfp4-w-8"), prompts, SMALL.vocab, SMALL.gen_length,
                                    SMALL.mask_id)
    reg = _regime(pi, mu, rewards, SMALL.gen_length)
    mm = mixture_moments(reg, grads.gram)
    B, M = 2, 6000
    batches = draw_batches(mu, reg.log_w, rewards, M, B, reg.G, torch.Generator().manual_seed(0))
    wt = reg.w_trunc.reshape(-1)
    forms = batch_forms(batches, mm, wt, reg.L)
    mse0 = mm.mse(0.0, B)
    assert abs(float(forms.d_d.mean()) - mse0) < 4 * float(forms.d_d.std()) / M ** 0.5
    tis = evaluate_lambda(torch.ones(M, dtype=torch.float64), forms, batches, mm, wt, reg.L, B)
    assert abs(tis.mse - mm.mse(1.0, B)) < 4 * tis.mse_se + 1e-9
    c = mm.cov_unit / B
    v_delta = float(c[0, 0] - 2 * c[0, 1] + c[1, 1]) / M  # Monte-Carlo variance of the simulated E Δ
    b2 = mm.bias_sq(1.0)
    assert abs(tis.bias_sq - b2) < 4 * (2 * (b2 * v_delta) ** 0.5 + v_delta)
    noise = forms.noise_tis
    assert abs(float(noise.mean()) - mm.trace_var(1.0, B)) < 4 * float(noise.std()) / M ** 0.5
    assert mm.bias_sq(0.0) > 0.01 * mm.trace_var(0.0, B)  # the planted μ_8 mismatch is visible at all


def test_mu_equal_to_pi_old_is_unbiased_with_lambda_zero(setup):
    model, prompts, grads, pi, rewards = setup
    reg = _regime(pi, pi.clone(), rewards, SMALL.gen_length)
    mm = mixture_moments(reg, grads.gram)
    scale = mm.trace_var(0.0, 1)
    for lam in (0.0, 0.5, 1.0):
        assert mm.bias_sq(lam) < 1e-20 * max(scale, 1.0)
    assert mm.lam_star(1) == 0.0 and mm.lam_star(64) == 0.0
    batches = draw_batches(pi, reg.log_w, rewards, 500, 4, reg.G, torch.Generator().manual_seed(0))
    lam = ais_lambda(batches.log_w, batches.adv, reg.L, CorrectionConfig(correction="ais"))
    assert torch.equal(lam, torch.zeros_like(lam))


def test_planted_mismatch_has_the_hand_computed_bias():
    """No model: one prompt, completions with rewards r, gradients h(y) = r(y) · e (Gram r rᵀ), mean-only advantages
    (E[Â | r] = (G − 1)/G · (r − E_q r)). Then E ĝ_none = c Var_q(r) e with c = (G − 1)/(G L), so planting μ with a
    larger reward variance than π_old must bias the uncorrected gradient by c (Var_μ r − Var_π r) > 0 along e, and
    untruncated IS by c (E_π r − E_μ r) E_π[r] (the group baseline is μ's) — sign and size."""
    r = torch.tensor([[0.0, 0.5, 0.5, 1.0]], dtype=torch.float64)
    pi = torch.tensor([[0.1, 0.4, 0.4, 0.1]], dtype=torch.float64)
    mu = torch.tensor([[0.25, 0.15, 0.2, 0.4]], dtype=torch.float64)
    L, G = 2, 4
    level = (r * L).round().long()
    reg = Regime(pi=pi, mu=mu, level=level, values=torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64), L=L, G=G,
                 cap=1e9)
    gram = r.reshape(-1, 1) @ r.reshape(1, -1)  # h_k = r_k e
    Lv = 3
    mom = {q: advantage_moments(level_probs(d, level, Lv), reg.values, G, "none") for q, d in (("pi", pi), ("mu", mu))}
    c = (G - 1) / (G * L)
    assert torch.allclose(mom["mu"].m1, (G - 1) / G * (reg.values - (mu * r).sum()), atol=1e-12)

    def var(q):
        return float((q * r * r).sum() - (q * r).sum() ** 2)

    from dllm_ais.analysis import exact_moments as em

    target = em.mean_coefficients(pi, torch.ones_like(pi), level, mom["pi"].m1, L)
    none = em.mean_coefficients(mu, torch.ones_like(mu), level, mom["mu"].m1, L)
    tis = em.mean_coefficients(mu, pi / mu, level, mom["mu"].m1, L)
    along_e = lambda a: float(a @ r.reshape(-1))  # noqa: E731  the component along e
    assert abs(along_e(target) - c * var(pi)) < 1e-12
    bias_none = along_e(none) - along_e(target)
    assert bias_none > 0 and abs(bias_none - c * (var(mu) - var(pi))) < 1e-12
    e_pi, e_mu = float((pi * r).sum()), float((mu * r).sum())
    assert abs(along_e(tis) - along_e(target) - c * (e_pi - e_mu) * e_pi) < 1e-12
    assert abs(qform(none - target, none - target, gram) - bias_none ** 2) < 1e-12


def test_batched_ais_lambda_equals_the_correction_module():
    g = torch.Generator().manual_seed(0)
    for combiner in ("product", "severity"):
        for tau in (0.02, 0.3):
            cfg = CorrectionConfig(correction="ais", ais_combiner=combiner, ais_tau=tau)
            log_w = torch.randn(6, 16, generator=g, dtype=torch.float64) * 0.7
            adv = torch.randn(6, 16, generator=g, dtype=torch.float64)
            adv[0] = 0.0  # the Var(Â) = 0 branch
            mine = ais_lambda(log_w, adv, 5, cfg)
            for b in range(6):
                ref = correct(log_w[b], adv[b], torch.ones(16, 5, dtype=torch.bool), cfg).lam_batch
                assert abs(float(mine[b]) - float(ref)) < 1e-12


def test_adam_step_is_lr_times_sign_and_objective_after_restores_the_model():
    g = torch.tensor([3.0, -1e-3, 0.5, -7.0], dtype=torch.float64)
    step = adam_step(g, 1e-3)
    assert torch.allclose(step, 1e-3 * g.sign(), rtol=1e-4)  # first bias-corrected step: lr · sign, any scale
    model = tb.make_llada(SMALL)
    prompts = tb.draw_prompts(SMALL)
    V, L = SMALL.vocab, SMALL.gen_length
    rewards = tb.rewards(prompts, tb.all_sequences(V, L), V)
    dist = lambda m: diffusion_distribution(m, prompts, V, L, SMALL.mask_id)  # noqa: E731
    before = [p.detach().clone() for p in model.parameters()]
    j0 = objective(dist, model, rewards)
    n = sum(p.numel() for p in model.parameters())
    assert objective_after(dist, model, rewards, torch.full((n,), 0.05)) != j0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert 0 < j0 < 1


def test_objective_gradient_is_the_derivative_of_the_enumerated_objective(trained):
    """⟨∇J, d⟩ by autograd through the enumeration = the finite difference of J along d at a step small enough that
    no confidence ordering flips (the low-confidence J is piecewise smooth)."""
    from dllm_ais.analysis.exact_objective import objective_gradient

    model, prompts = trained
    V, L = SMALL.vocab, SMALL.gen_length
    rewards = tb.rewards(prompts, tb.all_sequences(V, L), V)
    dist = lambda m: diffusion_distribution(m, prompts, V, L, SMALL.mask_id)  # noqa: E731
    g = objective_gradient(dist, model, rewards)
    d = g / g.norm()
    eps = 1e-4
    fd = (objective_after(dist, model, rewards, eps * d) - objective_after(dist, model, rewards, -eps * d)) / (2 * eps)
    assert abs(fd - float(g.norm())) < 0.02 * float(g.norm())


def test_smoke_run_writes_results_and_figure(tmp_path):
    from dllm_ais.analysis.exact_gradients import run, smoke_config

    doc = run(smoke_config(), tmp_path, log=lambda *_: None)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "mse_vs_lambda.png").stat().st_size > 10_000
    assert len(saved["regimes"]) == len(smoke_config().regimes) == len(doc["regimes"])
    for reg in saved["regimes"]:
        for f in reg["per_N"].values():
            chk = f["check"]
            assert abs(chk["mse_none_simulated"] - f["mse_none"]) < 5 * chk["mse_none_simulated_se"] + 1e-12
            assert 0.0 <= f["lam_star"] <= 1.0 and math.isfinite(f["mse_lam_star"])
            assert f["mse_lam_star"] <= min(f["mse_grid"]) + 1e-12  # λ* minimises the exact curve
    dj = saved["regimes"][0]["delta_j"]
    assert dj["finite_sampled"]["batches"] == 2 and dj["adam"]["batches"] == 4
    assert abs(dj["first_order"]["target"]["rate_over_target"] - 1.0) < 1e-12


def test_tau_calibration_per_seed_values_match_the_summary():
    """The τ calibration's per-seed values (committed as JSON from the docs, issue 27) average to summary.json's."""
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "benchmarks" / "study" / "corrections-v3" / "calibration"
    per_seed = json.loads((folder / "per_seed.json").read_text())
    means = json.loads((folder / "summary.json").read_text())["calibration"]["validation_acc_by_tau"]
    for i, tau in enumerate(per_seed["tau"]):
        pair = [per_seed["validation_acc"][s][i] for s in ("seed 5", "seed 6")]
        assert abs(sum(pair) / 2 - means[str(tau)]) < 5e-4, (tau, pair, means[str(tau)])


def test_bias_decomposition_isolates_the_group_baseline():
    """Untruncated IS with π_old's advantage moments is exactly unbiased; the exact AR log-likelihood's score has mean
    zero under π_old (so the μ-computed baseline cannot bias IS there), the one-step surrogate's does not."""
    from dllm_ais.analysis.exact_gradients import bias_decomposition
    from dllm_ais.analysis.exact_surrogates import ar_loglik

    cfg = tb.TestbedConfig(vocab=3, prompt_len=2, gen_length=2, num_prompts=2, d_model=32, n_heads=2, mlp=32)
    prompts = tb.draw_prompts(cfg)
    rewards = tb.rewards(prompts, tb.all_sequences(3, 2), 3)
    qwen = tb.make_qwen(cfg)
    with torch.no_grad():
        qwen.lm_head.weight.mul_(30.0)
        pi = ar_distribution(qwen, prompts, 3, 2)
        mu = ar_distribution(tb.rollout_copy(qwen, "mxfp4-w-8"), prompts, 3, 2)
    gram = per_completion_gradients(ar_loglik, qwen, prompts, 3, 2).gram
    reg = _regime(pi, mu, rewards, 2)
    dec = bias_decomposition(reg, mixture_moments(reg, gram))
    assert dec["bias_sq_is_pi_advantages"] < 1e-20 and dec["score_mean_sq_over_second_moment"] < 1e-10
    llada = tb.make_llada(cfg)
    with torch.no_grad():
        pi = diffusion_distribution(llada, prompts, 3, 2, cfg.mask_id)
    gram = one_step_gradients(llada, prompts, 3, 2).gram
    reg = _regime(pi, pi, rewards, 2)
    assert bias_decomposition(reg, mixture_moments(reg, gram))["score_mean_sq_over_second_moment"] > 1e-3
