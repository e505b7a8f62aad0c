"""The trajectory (path) likelihood is exact: by enumeration of every path of a tiny sampler, against the sampler's own
frequencies (G-test over 20,000 draws), for every selection rule and cache; the commit-only probability fails the
same test where the selection matters."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.models.tiny import init_weights, tiny_model
from dllm_ais.samplers.diffusion import diffusion_sample, transfer_schedule
from dllm_ais.types import Rollout

VOCAB = 8
"""Tiny vocabulary: ids 0..7, the mask is 4, so 7 proposable tokens."""
PROMPT = torch.tensor([[5, 6, 7, 5, 2, 6]])
MASK_ID = 4
DRAWS = 20_000


def confident_model(seed: int = 2, scale: float = 2.0, dtype=torch.float32):
    """A smaller tiny LLaDA (d 32, 2 layers; weights N(0, 0.2²), LM head ×2) over VOCAB tokens: confidences spread
    over (0, 1) and differ between positions, so thresholds 0.5 and 0.9 (forced and multi-token commits) and the
    top-k order all bite (the default tiny model's N(0, 0.02²) weights give near-uniform, position-blind logits)."""
    model = tiny_model(seed=seed, dtype=dtype, vocab_size=VOCAB, embedding_size=VOCAB, d_model=32, n_heads=2,
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


def enumerate_paths(cfg: SamplerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (tokens, commit step) path of the sampler for one prompt: completion [M, L], commit_step [M, L] (block b's
    steps numbered from b·block_length: only their order matters to the likelihood)."""
    tokens = [t for t in range(VOCAB) if t != MASK_ID]
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


def g_test(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int, float]:
    """(G, degrees of freedom, p) of observed counts against expected counts [M]; bins with an expected count below 5
    are pooled into one."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]]).double()
    exp = torch.cat([expected[~small], expected[small].sum()[None]]).double()
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    G = 2 * float(torch.where(obs > 0, obs * (obs / exp).log(), torch.zeros_like(obs)).sum())
    df = obs.numel() - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(G / 2,
                                                                                               dtype=torch.float64)))
    return G, df, p


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
