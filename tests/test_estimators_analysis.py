"""The estimator analysis (analysis/estimators.py): determinism, and its exact figures against independent
computations — d1's one-step bias by direct autograd, the ELBO schemes' expectation by brute-force mask enumeration,
the coefficient moments against the package's own draws, and MSE against simulated GRPO batches."""

import copy

import pytest
import torch

from dllm_ais.analysis import estimator_draws as D
from dllm_ais.analysis import estimators as E
from dllm_ais.analysis import exact_testbed as tb
from dllm_ais.analysis.estimator_features import feature_gradients
from dllm_ais.analysis.exact_sampler import canvas_logits, canvas_table
from dllm_ais.analysis.exact_surrogates import completion_grid, exact_elbo, one_step_expected
from dllm_ais.likelihood.mask_draws import draw_antithetic, draw_coupled, draw_quadrature, draw_stratified
from dllm_ais.rl.advantages import group_advantages


@pytest.fixture(scope="module")
def bed():
    torch.set_num_threads(1)
    cfg = E.smoke_config()
    t = cfg.testbed
    model = tb.make_llada(t)
    states = tb.sft_checkpoints(model, t, (0, 5), lr=cfg.sft_lr)
    model.load_state_dict(states[5])
    model.eval()
    prompts = tb.draw_prompts(t)
    feats = feature_gradients(model, prompts, t.vocab, t.gen_length)
    with torch.no_grad():
        logits = canvas_logits(model, prompts, canvas_table(t.vocab, t.gen_length), t.mask_id)
    tg = E.target(model, prompts, logits, cfg, "low_confidence")
    return {"cfg": cfg, "model": model, "prompts": prompts, "feats": feats, "tg": tg, "masks": E.mask_moments(cfg)}


def _flat_grad(out, params):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(out, params)]).double()


def test_smoke_results_are_bit_reproducible(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    E.run(E.smoke_config(), a, log=lambda *_: None)
    E.run(E.smoke_config(), b, log=lambda *_: None)
    assert (a / "results.json").read_bytes() == (b / "results.json").read_bytes()
    assert (a / "README.md").read_text() == (b / "README.md").read_text()
    assert (a / "mse_vs_forward_passes.png").stat().st_size > 0


def test_one_step_bias_equals_direct_autograd(bed):
    """E ĝ of d1's estimator = ∇ Σ_k π_k E[Â | r_k] / (n L) · E_mask[one-step log-lik] (exact_surrogates, its own
    enumeration of prompt masks): bias² against ∇J̃ and ‖E ĝ‖² as the analysis reports them."""
    cfg, tg = bed["cfg"], bed["tg"]
    t = cfg.testbed
    res = E.closed_forms(bed["masks"][("one_step", 1)], bed["feats"], tg, t.gen_length, cfg.G, cfg.N)
    xs, ys = completion_grid(bed["prompts"], t.vocab, t.gen_length)
    n = tg.pi.shape[0]
    a = (tg.pi * (tg.m1[0] + tg.m1[1]).gather(1, tg.level)).reshape(-1) / (n * t.gen_length)
    md = copy.deepcopy(bed["model"]).double()
    g = _flat_grad((a * one_step_expected(md, xs, ys)).sum(), list(md.parameters()))
    d = g - tg.g_star
    assert res["bias_sq"] == pytest.approx(float(d @ d), rel=1e-5)
    assert res["mean_norm_sq"] == pytest.approx(float(g @ g), rel=1e-5)
    assert res["bias_sq"] > 1e-6  # a biased estimator: the check is not vacuous


@pytest.mark.parametrize("name,K", [("elbo-stratified", 1), ("elbo-stratified", 4), ("elbo-antithetic", 2),
                                    ("elbo-antithetic", 4)])
def test_elbo_expectation_equals_enumerated_elbo(bed, name, K):
    """The schemes' exact expected gradient per completion = ∇ of LLaDA's ELBO with all 2^L − 1 masks enumerated."""
    t = bed["cfg"].testbed
    mom = bed["masks"][(name, K)]
    grad = bed["feats"].grad_a
    H = torch.einsum("q,kqp->kp", mom.nodes[0].mean[0, 0].float(), grad).double()
    xs, ys = completion_grid(bed["prompts"], t.vocab, t.gen_length)
    md = copy.deepcopy(bed["model"]).double()
    params = list(md.parameters())
    for k in range(xs.shape[0]):
        gk = _flat_grad(exact_elbo(md, xs[k:k + 1], ys[k:k + 1]).sum(), params)
        assert float((gk - H[k]).norm()) <= 1e-5 * float(gk.norm())


def _w_of(draw, sp: D.Space):
    """[B, Q] coefficient vectors of PolicyDraws (prompt unmasked) in the A-feature columns."""
    B, K, L = draw.mask.shape
    lut = torch.zeros(2 ** L, L, dtype=torch.long)
    for (_, m, j), c in ((k, v) for k, v in sp.a.items() if k[0] == 0):
        lut[m, j] = c
    bits = (draw.mask.long() * 2 ** torch.arange(L)).sum(-1)  # [B, K]
    col = lut[bits[..., None], torch.arange(L)]  # [B, K, L]
    W = torch.zeros(B, len(sp.a), dtype=torch.float64)
    W.scatter_add_(1, col.reshape(B, -1), draw.weight.double().reshape(B, -1))  # weight 0 off the mask
    return W


@pytest.mark.parametrize("scheme", ["stratified", "antithetic", "quadrature", "coupled"])
def test_coefficient_moments_match_package_draws(scheme):
    """E W and E W Wᵀ (and, antithetic, two rows of a group) of estimator_draws = means over the package's own draw
    functions (4,000 rows; z-scores below 5)."""
    L, G, K = 3, 8, 2
    sp = D.Space(1, L)
    g = torch.Generator().manual_seed(0)
    ones = torch.ones(4000, L, dtype=torch.bool)
    if scheme == "coupled":  # t per batch: one row per call
        W = torch.cat([_w_of(draw_coupled(ones[:1], g), sp) for _ in range(1500)])
        node_mean = sum(nd.rho * nd.mean[0, 0] for nd in D.coupled(sp).nodes)
        node_second = sum(nd.rho * nd.second[0, 0] for nd in D.coupled(sp).nodes)
    else:
        draw = {"stratified": lambda: draw_stratified(ones, K, g), "quadrature": lambda: draw_quadrature(ones, K, g),
                "antithetic": lambda: draw_antithetic(ones, K, g, G)}[scheme]()
        W = _w_of(draw, sp)
        mom = {"stratified": D.stratified, "quadrature": D.quadrature}.get(scheme)
        mom = mom(sp, K) if mom else D.antithetic(sp, K, G)
        node_mean, node_second = mom.nodes[0].mean[0, 0], mom.nodes[0].second[0, 0]
        if scheme == "antithetic":
            Wg = W.view(-1, G, W.shape[1])
            pairs = torch.einsum("bgq,bhr->bqr", Wg, Wg) - torch.einsum("bgq,bgr->bqr", Wg, Wg)
            emp = pairs / (G * (G - 1))  # [groups, Q, Q]
            nd = mom.nodes[0]
            exact = nd.basis[0, 0] @ nd.X @ nd.basis[0, 0].T
            z = (emp.mean(0) - exact).abs() / (emp.std(0) / emp.shape[0] ** 0.5 + 1e-12)
            assert float(z.max()) < 5
    assert_draws_match_moments(W, node_mean, node_second)
    assert float(node_mean.abs().sum()) > 0


def assert_draws_match_moments(W: torch.Tensor, mean: torch.Tensor, second: torch.Tensor, z_max: float = 5.0):
    """Sampled feature rows W [M, Q] against the exact first [Q] and second [Q, Q] moments: every coordinate's
    Monte-Carlo mean within z_max standard errors."""
    m = W.shape[0]
    z = (W.mean(0) - mean).abs() / (W.std(0) / m ** 0.5 + 1e-12)
    assert float(z.max()) < z_max
    outer = torch.einsum("bq,br->bqr", W, W)
    z2 = (outer.mean(0) - second).abs() / (outer.std(0) / m ** 0.5 + 1e-12)
    assert float(z2.max()) < z_max


def _spg_w(draw, sp: D.Space, logp, k, L, positive):
    """[N, Q] SPG coefficient vectors: L ∂bound/∂log p per row (ELBO for Â > 0, else EUBO), from spg.py itself."""
    from dllm_ais.likelihood.spg import spg_sequence_logp

    N, K, _ = draw.mask.shape
    lut = torch.zeros(2 ** sp.P, 2 ** L, L, dtype=torch.long)
    for (s, m, j), c in sp.a.items():
        lut[s, m, j] = c
    sb = (draw.prompt_masked.long() * 2 ** torch.arange(sp.P)).sum(-1)
    mb = (draw.mask.long() * 2 ** torch.arange(L)).sum(-1)
    col = lut[sb[..., None], mb[..., None], torch.arange(L)]  # [N, K, L]
    lp = logp[k[:, None, None], col].clone().requires_grad_(True)
    spg_sequence_logp(draw, lp, torch.where(positive, 1.0, -1.0)).sum().backward()
    return torch.zeros(N, len(sp.a), dtype=torch.float64).scatter_add_(1, col.reshape(N, -1),
                                                                        (L * lp.grad).reshape(N, -1))


@pytest.mark.slow
@pytest.mark.parametrize("name,K", [("elbo-stratified", 2), ("elbo-antithetic", 2), ("coupled", 3), ("spg", 2)])
def test_mse_matches_simulated_grpo_batches(bed, name, K):
    """The closed-form MSE = mean over simulated batches (B groups from π, GRPO's own advantages, masks from the
    package's draw functions — coupled's t once per batch, antithetic's strata per group, SPG's bound by the sign of
    Â) of ‖ĝ − g*‖², within 4 standard errors."""
    from dllm_ais.likelihood.spg import draw_spg

    cfg, tg, feats = bed["cfg"], bed["tg"], bed["feats"]
    L, G, N, P = cfg.testbed.gen_length, cfg.G, cfg.N, cfg.testbed.prompt_len
    B = N // G
    sp = D.Space(P, L)
    if name == "spg":
        reps = D.spg(sp, K, feats.logp_a, 4096, 1, seed=5)
        res = E.closed_forms(reps[0], feats, tg, L, G, N)
    else:
        res = E.closed_forms(bed["masks"][(name, K)], feats, tg, L, G, N)
    n, Y = tg.pi.shape
    values = tg.level.double() / L
    ones = torch.ones(N, L, dtype=torch.bool)
    g = torch.Generator().manual_seed(1)
    errs = []
    for _ in range(400):
        xs = torch.randint(n, (B,), generator=g)
        ys = torch.multinomial(tg.pi[xs], G, replacement=True, generator=g)  # [B, G]
        k = (xs[:, None] * Y + ys).reshape(-1)
        adv = group_advantages(values[xs[:, None], ys].reshape(-1).float(), G).adv.double()
        if name == "spg":
            draw = draw_spg(ones, K, g, L, torch.ones(N, P, dtype=torch.bool), 0.3)
            W = _spg_w(draw, sp, feats.logp_a, k, L, adv > 0)
        else:
            draw = {"elbo-stratified": lambda: draw_stratified(ones, K, g), "coupled": lambda: draw_coupled(ones, g),
                    "elbo-antithetic": lambda: draw_antithetic(ones, K, g, G)}[name]()
            W = _w_of(draw, sp)
        gh = torch.einsum("i,iq,iqp->p", adv / (N * L), W, feats.grad_a[k].double())
        errs.append(float(((gh - tg.g_star) ** 2).sum()))
    e = torch.tensor(errs, dtype=torch.float64)
    assert abs(float(e.mean()) - res["mse"]) < 4 * float(e.std()) / len(errs) ** 0.5
