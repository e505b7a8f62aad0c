"""The trajectory (path) likelihood is exact: by enumeration of every path of a tiny sampler, against the sampler's own
frequencies (G-test over 20,000 draws), for every selection rule and cache; the commit-only probability fails the
same test where the selection matters."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from dream_helpers import g_test

from dllm_ais.config import SamplerConfig
from dllm_ais.models.tiny import init_weights, tiny_model
from dllm_ais.samplers.diffusion import diffusion_sample, transfer_schedule
from dllm_ais.types import Rollout

VOCAB = 8
"""Tiny vocabulary: ids 0..7, the mask is 4, so 7 proposable tokens."""
PROMPT = torch.tensor([[5, 6, 7, 5, 2, 6]])
MASK_ID = 4
DRAWS = 20_000


def confident_model(seed: int = 2, scale: float = 2.0, dtype=torch.float32, vocab: int = VOCAB):
    """A smaller tiny LLaDA (d 32, 2 layers; weights N(0, 0.2²), LM head ×2) over VOCAB tokens: confidences spread
    over (0, 1) and differ between positions, so thresholds 0.5 and 0.9 (forced and multi-token commits) and the
    top-k order all bite (the default tiny model's N(0, 0.02²) weights give near-uniform, position-blind logits)."""
    model = tiny_model(seed=seed, dtype=dtype, vocab_size=vocab, embedding_size=vocab, d_model=32, n_heads=2,
                       mlp_hidden_size=64)
    init_weights(model, torch.Generator().manual_seed(seed), std=0.2)
    with torch.no_grad():
        model.model.transformer.ff_out.weight.mul_(scale)
    return model


def _block_assignments(cfg: SamplerConfig) -> list[tuple[int, ...]]:
    """Every way the sampler can assign the positions of one block to its steps (block-relative step indices)."""
    Lb, S = cfg.block_length, cfg.steps // cfg.num_blocks
    out = []
    if cfg.threshold is None:
        k = transfer_schedule(torch.tensor([Lb]), S)[0].tolist()
        for a in itertools.product(range(S), repeat=Lb):
            if [a.count(s) for s in range(S)] == k:
                out.append(a)
        return out
    cap = cfg.max_commit_per_step or Lb
    for a in itertools.product(range(Lb), repeat=Lb):
        used = max(a) + 1
        counts = [a.count(s) for s in range(used)]
        if min(counts) >= 1 and max(counts) <= cap:  # every step up to the last commits, at most `cap`
            out.append(a)
    return out


def enumerate_paths(cfg: SamplerConfig, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (tokens, commit step) path of the sampler for one prompt: completion [M, L], commit_step [M, L] (block b's
    steps numbered from b·block_length: only their order matters to the likelihood)."""
    tokens = [t for t in range(vocab) if t != MASK_ID]
    blocks = [[tuple(cfg.block_length * b + s for s in a) for a in _block_assignments(cfg)]
              for b in range(cfg.num_blocks)]
    steps = [sum(parts, ()) for parts in itertools.product(*blocks)]
    ys = list(itertools.product(tokens, repeat=cfg.gen_length))
    completion = torch.tensor(ys).repeat(len(steps), 1)  # [M, L]
    commit = torch.tensor(steps).repeat_interleave(len(ys), 0)  # [M, L]
    return completion, commit


def canonical_steps(commit_step: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """The sampler's global step numbers -> enumerate_paths's: b·block_length + (step − the row's first step in b)."""
    B, L = commit_step.shape
    blocks = commit_step.view(B, cfg.num_blocks, cfg.block_length)
    first = blocks.min(-1, keepdim=True).values
    base = (torch.arange(cfg.num_blocks) * cfg.block_length)[None, :, None]
    return (blocks - first + base).view(B, L)


def path_keys(completion: torch.Tensor, commit: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """One integer per (tokens, steps) path: [M, L] x2 -> [M]."""
    code = completion * (cfg.block_length * cfg.num_blocks) + commit  # [M, L]
    base = VOCAB * cfg.block_length * cfg.num_blocks
    return (code * base ** torch.arange(code.shape[1])).sum(-1)


def rollout_of(completion: torch.Tensor, commit: torch.Tensor, prompt=PROMPT) -> Rollout:
    M, L = completion.shape
    return Rollout(prompt_ids=prompt.expand(M, -1), prompt_mask=torch.ones(M, prompt.shape[1], dtype=torch.bool),
                   completion_ids=completion, completion_mask=torch.ones(M, L, dtype=torch.bool), commit_step=commit,
                   num_steps=int(commit.max()) + 1)


@torch.no_grad()
def sampler_counts(model, cfg: SamplerConfig, keys: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Counts [M] of each enumerated path among DRAWS sampler draws (every draw must be an enumerated path)."""
    r = diffusion_sample(model, PROMPT.expand(DRAWS, -1), torch.ones(DRAWS, PROMPT.shape[1], dtype=torch.bool), cfg,
                         MASK_ID, [MASK_ID], generator=torch.Generator().manual_seed(seed))
    drawn = path_keys(r.completion_ids, canonical_steps(r.commit_step, cfg), cfg)
    order = torch.argsort(keys)
    where = torch.searchsorted(keys[order], drawn)
    assert bool((keys[order][where.clamp(max=keys.numel() - 1)] == drawn).all()), "a draw outside the enumeration"
    return torch.bincount(order[where], minlength=keys.numel())


CASES = {
    "topk-k1": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0),
    "topk-k2": SamplerConfig(gen_length=4, block_length=4, steps=2, temperature=0.8),
    "threshold-0.5": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, threshold=0.5),
    "threshold-0.9": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, threshold=0.9),
    "threshold-0.3-cap2": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, threshold=0.3,
                                        max_commit_per_step=2),
    "random-k1": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, remasking="random"),
    "random-threshold-0.5": SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0,
                                          remasking="random", threshold=0.5),
    "topk-dual": SamplerConfig(gen_length=4, block_length=2, steps=4, temperature=1.0, cache="dual"),
    "topk-prefix": SamplerConfig(gen_length=4, block_length=2, steps=4, temperature=1.0, cache="prefix"),
    "threshold-0.9-dual": SamplerConfig(gen_length=4, block_length=2, steps=4, temperature=1.0, threshold=0.9,
                                        cache="dual"),
}
SELECTION_MATTERS = {"topk-k1", "topk-k2", "threshold-0.5", "threshold-0.9", "threshold-0.3-cap2",
                     "random-threshold-0.5", "topk-dual", "topk-prefix", "threshold-0.9-dual"}
"""Cases whose commit-only probability (normalised) is not the path probability: not random top-k, whose selection
term −log C(m, k) is the same for every path."""


@pytest.mark.parametrize("name", list(CASES))
def test_path_probability_is_the_sampler_frequency(name):
    from dllm_ais.likelihood.trajectory import path_logprob

    cfg = CASES[name]
    model = confident_model()
    completion, commit = enumerate_paths(cfg)
    keys = path_keys(completion, commit, cfg)
    assert keys.unique().numel() == keys.numel()
    with torch.no_grad():
        exact = path_logprob(model, rollout_of(completion, commit), cfg, selection=True)
        commit_only = path_logprob(model, rollout_of(completion, commit), cfg, selection=False).log_prob
    probs = exact.log_prob.exp()
    assert abs(float(probs.sum()) - 1) < 1e-4, float(probs.sum())  # every path enumerated, each counted once
    assert torch.allclose(exact.step_terms.sum(-1), exact.log_prob, atol=1e-9)
    counts = sampler_counts(model, cfg, keys)
    G, df, p = g_test(counts, DRAWS * probs)
    print(f"{name}: {keys.numel()} paths, G = {G:.1f}, df = {df}, p = {p:.3f}")
    assert df >= 10 and p > 0.01, (G, df, p)
    naive = (commit_only - commit_only.logsumexp(0)).exp()  # the commit-only probability, normalised
    G0, df0, p0 = g_test(counts, DRAWS * naive)
    print(f"{name}: commit-only G = {G0:.1f}, df = {df0}, p = {p0:.2e}")
    if name in SELECTION_MATTERS:
        assert p0 < 0.01, (G0, df0, p0)
    else:
        assert torch.allclose(naive, probs, atol=1e-6)  # random top-k: the selection term cancels
    if cfg.cache != "none":  # the cached sampler is another process: the uncached path probability fails the test
        with torch.no_grad():
            uncached = path_logprob(model, rollout_of(completion, commit), replace(cfg, cache="none")).log_prob
        assert abs(float(uncached.exp().sum()) - 1) < 1e-4
        G1, df1, p1 = g_test(counts, DRAWS * uncached.exp())
        print(f"{name}: uncached G = {G1:.1f}, df = {df1}, p = {p1:.2e}")
        assert p1 < 0.01, (G1, df1, p1)


def test_replay_reproduces_the_sampler_record_for_every_cache():
    """The replayed token and selection terms equal what the sampler recorded from the logits it used (float32
    logits: to 2e-5), cache none / prefix / dual, with threshold and a cap, and CFG without a cache."""
    from dllm_ais.likelihood.trajectory import path_logprob

    model = confident_model(seed=1)
    ids = torch.randint(5, VOCAB, (6, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :2] = False  # left padding
    configs = [SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=0.8, cache=c, threshold=t,
                             max_commit_per_step=n) for c in ("none", "prefix", "dual")
               for t, n in ((None, None), (0.5, None), (0.3, 2))]
    configs.append(SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=0.8, cfg_scale=1.5))
    for cfg in configs:
        r = diffusion_sample(model, ids, mask, cfg, MASK_ID, [MASK_ID], generator=torch.Generator().manual_seed(1),
                             record_selection=True)
        with torch.no_grad():
            pl = path_logprob(model, r, cfg)
        assert torch.allclose(pl.token_terms, r.logp_rollout.double(), atol=2e-5), cfg
        assert torch.allclose(pl.selection_terms, r.logp_select, atol=2e-5), cfg
        assert float(r.logp_select.abs().max()) > 0.05, cfg  # the selection terms are not trivially 0
        if cfg.max_commit_per_step is not None:
            per_step = torch.stack([(r.commit_step == t).sum(-1) for t in range(r.num_steps)])
            assert int(per_step.max()) <= cfg.max_commit_per_step


def test_trajectory_at_temperature_zero_is_refused():
    from dllm_ais.likelihood.trajectory import path_logprob

    model = confident_model()
    cfg = SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=0.0)
    r = diffusion_sample(model, PROMPT, torch.ones_like(PROMPT, dtype=torch.bool), cfg, MASK_ID, [MASK_ID])
    with pytest.raises(ValueError, match="--temperature 0"):
        path_logprob(model, r, cfg)


def test_the_cap_needs_a_threshold():
    with pytest.raises(ValueError, match="--threshold"):
        SamplerConfig(max_commit_per_step=2)
    assert math.isclose(SamplerConfig(threshold=0.9, max_commit_per_step=2).max_commit_per_step, 2)


# ------------------------------------------------------------------------------------ the policy gradient, exactly
GRAD_CFG = CASES["threshold-0.9-dual"]
GRAD_VOCAB, GRAD_PROMPT = 6, torch.tensor([[5, 2, 3, 5, 2, 0]])
"""5 proposable tokens: 5^4 × 9 = 5,625 paths (the enumeration's backward is the test's cost)."""
TARGET = torch.tensor([5, 1, 3, 0])


def _reward(y: torch.Tensor) -> torch.Tensor:
    """A graded reward: the fraction of positions holding TARGET's token. y [M, L] -> [M]."""
    return (y == TARGET[: y.shape[1]]).double().mean(-1)


def _flat_grad(value: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params)]).double()


@pytest.mark.slow
def test_trajectory_policy_gradient_is_the_exact_gradient():
    """Dual cache, threshold 0.9 (selection terms and stale K/V both matter), 4-token completions: the mean over
    20,000 sampler draws of the trainer's GRPO gradient with the trajectory likelihood (selection on; Â = R, the
    first inner iteration) equals ∇ E_path[R] computed exactly (every one of the 5,625 paths enumerated, autograd
    through the path probability), within 4 standard errors along the exact gradient and 3 random directions.
    The expected gradients of the commit-only trajectory likelihood and of the one-step estimator, computed exactly
    by enumeration (Σ_paths P(path) R ∇ log p̂(path): no noise), are biased by measured amounts."""
    from dllm_ais.likelihood.one_step import one_step_logprobs
    from dllm_ais.likelihood.trajectory import path_logprob
    from dllm_ais.rl.config import GRPOConfig
    from dllm_ais.rl.grpo import grpo_loss
    from dllm_ais.train.backend import DiffusionBackend

    model = confident_model(scale=3.0, vocab=GRAD_VOCAB)  # 17 % of the paths commit two tokens at once
    params = [p for p in model.parameters()]
    completion, commit = enumerate_paths(GRAD_CFG, GRAD_VOCAB)
    paths = rollout_of(completion, commit, GRAD_PROMPT)
    with torch.no_grad():
        assert abs(float(path_logprob(model, paths, GRAD_CFG).log_prob.exp().sum()) - 1) < 1e-4
    R = _reward(completion)
    logp = path_logprob(model, paths, GRAD_CFG).log_prob  # [M], differentiable
    exact = _flat_grad((logp.exp() * R).sum(), params)  # ∇ E[R]
    weight = (logp.exp() * R).detach()  # [M] P(path) R(path)
    commit_only = _flat_grad((weight * path_logprob(model, paths, GRAD_CFG, selection=False).log_prob).sum(), params)
    ys, inverse = completion.unique(dim=0, return_inverse=True)  # the one-step estimator sees y only
    w_y = torch.zeros(len(ys), dtype=torch.float64).index_add_(0, inverse, weight)
    ones = torch.ones(len(ys), GRAD_PROMPT.shape[1], dtype=torch.bool)
    one = one_step_logprobs(model, GRAD_PROMPT.expand(len(ys), -1), ones, ys, prompt_masked=~ones,
                            mask_token_id=MASK_ID)  # [Y, L] (T = 1: GRAD_CFG's temperature)
    one_step = _flat_grad((w_y * one.double().sum(-1)).sum(), params)

    L = GRAD_CFG.gen_length
    grpo = GRPOConfig(loss_type="dr_grpo", beta=0.0, max_completion_length=L)
    backend = DiffusionBackend(GRAD_CFG, MASK_ID, [MASK_ID], policy_logprob="trajectory", trajectory_selection=True)
    batches, n = 20, 1000
    estimates = []
    for k in range(batches):
        rollout = backend.sample(model, GRAD_PROMPT.expand(n, -1), torch.ones(n, 6, dtype=torch.bool),
                                 torch.Generator().manual_seed(k))
        lp = backend.token_logp(model, rollout, seed=0)  # [n, L] with gradients
        out = grpo_loss(lp, lp.detach(), _reward(rollout.completion_ids).float(), rollout.completion_mask, grpo,
                        token_scale=backend.token_scale(rollout))
        estimates.append(-L * _flat_grad(out.loss, params))  # (1/n) Σ_b R_b ∇ log P(path_b)
    est = torch.stack(estimates)  # [batches, P]
    g = torch.Generator().manual_seed(3)
    directions = [exact / exact.norm()] + [d / d.norm() for d in torch.randn(3, exact.numel(), generator=g,
                                                                              dtype=torch.float64)]
    z = []
    for d in directions:
        proj = est @ d  # [batches]
        z.append(float((proj.mean() - exact @ d) / (proj.std() / batches ** 0.5)))
    rel = lambda v: float((v - exact).norm() / exact.norm())  # noqa: E731
    se = float((est @ directions[0]).std() / batches ** 0.5)
    print(f"trajectory: z along ∇E[R] and 3 random directions {[f'{v:.2f}' for v in z]}; "
          f"|mean − ∇E[R]| / |∇E[R]| = {rel(est.mean(0)):.3f} (Monte-Carlo noise)")
    assert all(abs(v) < 4 for v in z), z
    for name, mean in (("commit-only", commit_only), ("one-step", one_step)):
        bias = float((mean - exact) @ directions[0])
        cos = float(mean @ exact / (mean.norm() * exact.norm()))
        print(f"{name}: |E ĝ − ∇E[R]| / |∇E[R]| = {rel(mean):.3f}, cosine with ∇E[R] {cos:.3f}, bias along ∇E[R] "
              f"{bias / float(exact.norm()):+.3f} |∇E[R]| ({bias / se:+.1f} trajectory SEs)")
        assert rel(mean) > 0.1 and rel(mean) > 1.5 * rel(est.mean(0)), (name, rel(mean))


@pytest.mark.parametrize("threshold", [None, 0.5, 0.9])
def test_marginal_over_orders_matches_the_independent_exact_sampler(threshold):
    """Σ over every order (commit steps) of exp(path_logprob) equals P(y | x) of issue 27's exact sampler
    (analysis/exact_sampler.py: a dynamic programme over partial canvases, written independently of this
    likelihood) for every completion, low-confidence and threshold decoding, one block, T = 1."""
    from dllm_ais.analysis.exact_sampler import diffusion_distribution
    from dllm_ais.analysis.exact_testbed import TestbedConfig, draw_prompts, make_llada, sequence_index
    from dllm_ais.likelihood.trajectory import path_logprob

    tb = TestbedConfig(gen_length=3)
    model = make_llada(tb)
    with torch.no_grad():
        model.model.transformer.ff_out.weight.mul_(30.0)  # confident: thresholds bite
    cfg = SamplerConfig(gen_length=3, block_length=3, steps=3, temperature=1.0, threshold=threshold)
    prompts = draw_prompts(tb)[:2]
    with torch.no_grad():
        exact = diffusion_distribution(model, prompts, tb.vocab, 3, tb.mask_id, rule="threshold" if threshold else
                                       "low_confidence", threshold=threshold)  # [2, V^3]
    tokens = torch.tensor(list(itertools.product(range(tb.vocab), repeat=3)))
    orders = [a for a in itertools.product(range(3), repeat=3) if sorted(set(a)) == list(range(max(a) + 1))]
    if threshold is None:
        orders = [a for a in orders if len(set(a)) == 3]  # one token per step
    completion = tokens.repeat(len(orders), 1)
    commit = torch.tensor(orders).repeat_interleave(len(tokens), 0)
    for n in range(2):
        with torch.no_grad():
            lp = path_logprob(model, rollout_of(completion, commit, prompts[n:n + 1]), cfg).log_prob
        marginal = torch.zeros(exact.shape[1], dtype=torch.float64).index_add_(
            0, sequence_index(completion, tb.vocab), lp.exp())
        assert float((marginal - exact[n]).abs().max()) < 2e-6, float((marginal - exact[n]).abs().max())
        assert float(exact[n].max()) > 0.2  # a confident model: the orders' probabilities differ
