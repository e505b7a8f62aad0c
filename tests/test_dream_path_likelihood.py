"""Dream's trajectory likelihood is exact: path probabilities (models/dream/trajectory.py) sum to 1 over every
path of an enumerable setting for each algorithm (Fast-dLLM's uncached threshold included), every path the schedule
forbids has log P = −inf, they match the sampler's own frequencies (G-test over 20,000 draws), and equal the
sampler's record; for the cached (Fast-dLLM) sampler the recorded path probabilities match its frequencies and equal
the cached replay. Impossible paths: −inf for the exact law, the finite LOG_ZERO floor for the training likelihood."""

from __future__ import annotations

import itertools

import pytest
import torch
from dream_helpers import UniqueRows, g_test

from dllm_ais.models.dream.sampler import DreamSamplerConfig, dream_sample
from dllm_ais.models.dream.selection import scheduled_count
from dllm_ais.models.dream.trajectory import path_logprob, recorded_path_logprob
from dllm_ais.models.tiny import tiny_dream_model
from dllm_ais.types import Rollout

VOCAB = 8
"""ids 0..7; the tiny tokenizer's mask is 4: 7 proposable tokens."""
PROMPT = torch.tensor([[5, 6, 7]])
DRAWS = 20_000


@pytest.fixture(scope="module")
def model():
    """A tinier Dream (hidden 16, 2 heads, 1 KV head) over 8 tokens with weights ×10 (std 0.2): confidences differ
    between positions and steps, and 20,000 draws stay cheap."""
    m = tiny_dream_model(seed=3, vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                         num_key_value_heads=1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.mul_(10.0)
    return m


CASES = {
    "maskgit_plus": DreamSamplerConfig(gen_length=3, steps=3, alg="maskgit_plus", temperature=1.0),
    "maskgit_plus-top_k3": DreamSamplerConfig(gen_length=3, steps=2, alg="maskgit_plus", temperature=1.0, top_k=3),
    "topk_margin-top_p": DreamSamplerConfig(gen_length=3, steps=2, alg="topk_margin", temperature=1.5, top_p=0.8),
    "entropy": DreamSamplerConfig(gen_length=3, steps=3, alg="entropy", temperature=0.8),
    "entropy-alg_temp": DreamSamplerConfig(gen_length=3, steps=3, alg="entropy", temperature=1.0, alg_temp=0.5),
    "origin-top_k4": DreamSamplerConfig(gen_length=3, steps=2, alg="origin", temperature=0.8, top_k=4),
    "threshold-uncached": DreamSamplerConfig(gen_length=3, steps=1, alg="maskgit_plus", temperature=1.0,
                                             threshold=0.3),
}


def horizon(cfg: DreamSamplerConfig) -> int:
    """Steps a path may use: the schedule's, or up to L for the uncached threshold (a shortfall adds steps)."""
    return cfg.gen_length if cfg.threshold is not None else cfg.steps


def allowed(cfg: DreamSamplerConfig, a: tuple[int, ...]) -> bool:
    """Whether the schedule lets the commit steps `a` happen (top-k rules: each step's count is its k)."""
    if cfg.alg == "origin" or cfg.threshold is not None:
        return True
    left, ks = cfg.gen_length, []
    for i in range(cfg.steps):
        ks.append(scheduled_count(torch.ones(1, left, dtype=torch.bool), i, cfg.steps, cfg.eps))
        left -= ks[-1]
    return [a.count(s) for s in range(cfg.steps)] == ks


def enumerate_paths(cfg: DreamSamplerConfig) -> tuple[Rollout, torch.Tensor]:
    """Every (tokens, commit steps) path over `horizon` steps, forbidden orders included, and which the schedule
    allows [M]."""
    tokens = [t for t in range(VOCAB) if t != 4]
    ys = list(itertools.product(tokens, repeat=cfg.gen_length))
    steps = list(itertools.product(range(horizon(cfg)), repeat=cfg.gen_length))
    completion = torch.tensor(ys).repeat(len(steps), 1)
    commit = torch.tensor(steps).repeat_interleave(len(ys), 0)
    ok = torch.tensor([allowed(cfg, a) for a in steps]).repeat_interleave(len(ys), 0)
    M = completion.shape[0]
    return Rollout(prompt_ids=PROMPT.expand(M, -1), prompt_mask=torch.ones(M, PROMPT.shape[1], dtype=torch.bool),
                   completion_ids=completion, completion_mask=torch.ones_like(completion, dtype=torch.bool),
                   commit_step=commit, num_steps=horizon(cfg)), ok


def keys_of(completion: torch.Tensor, commit: torch.Tensor, S: int) -> torch.Tensor:
    code = completion * S + commit
    return (code * (VOCAB * S) ** torch.arange(code.shape[1])).sum(-1)


def sample(model, cfg, n=DRAWS, seed=1, record=False):
    ids = PROMPT.expand(n, -1)
    return dream_sample(model if cfg.cache != "none" else UniqueRows(model), ids,
                        torch.ones_like(ids, dtype=torch.bool), cfg, 4, [],
                        generator=torch.Generator().manual_seed(seed), record_selection=record)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
@torch.no_grad()
def test_paths_sum_to_one_and_match_sampler(model, name):
    cfg = CASES[name]
    paths, ok = enumerate_paths(cfg)
    logp = path_logprob(model, paths, cfg, 4)  # [M]
    total = float(torch.logsumexp(logp, 0).exp())
    assert abs(total - 1) < 1e-6, total
    assert bool((logp[~ok] == -torch.inf).all()) and not bool(logp.isnan().any())  # forbidden: −inf, not e^−30
    r = sample(model, cfg)
    keys = keys_of(paths.completion_ids, paths.commit_step, horizon(cfg))
    drawn = keys_of(r.completion_ids, r.commit_step, horizon(cfg))
    order = torch.argsort(keys)
    where = torch.searchsorted(keys[order], drawn).clamp(max=keys.numel() - 1)
    assert bool((keys[order][where] == drawn).all()), "a draw outside the enumeration"
    counts = torch.bincount(order[where], minlength=keys.numel())
    G, df, p = g_test(counts, DRAWS * logp.exp())
    assert df >= 10 and p > 0.01, f"G={G:.1f} df={df} p={p:.4f}"
    if cfg.alg != "origin":  # the sampler's record is the same path probability
        r = sample(model, cfg, n=64, seed=2, record=True)
        torch.testing.assert_close(recorded_path_logprob(r), path_logprob(model, r, cfg, 4), rtol=1e-5, atol=1e-5)


def test_selection_matters(model):
    """Without its selection terms the path law does not sum to 1 (the test above could fail)."""
    cfg = CASES["maskgit_plus"]
    paths, ok = enumerate_paths(cfg)
    paths = Rollout(prompt_ids=paths.prompt_ids[ok], prompt_mask=paths.prompt_mask[ok],
                    completion_ids=paths.completion_ids[ok], completion_mask=paths.completion_mask[ok],
                    commit_step=paths.commit_step[ok], num_steps=paths.num_steps)
    with torch.no_grad():
        full = path_logprob(model, paths, cfg, 4)
    from dllm_ais.models.dream.selection import DreamRule, proposal_logprob

    rule = DreamRule.of(cfg, 4)
    tokens_only = torch.zeros(paths.completion_ids.shape[0], dtype=torch.float64)
    for t in range(cfg.steps):
        done = (paths.commit_step < t)
        canvas = torch.cat([paths.prompt_ids, torch.where(done, paths.completion_ids, 4)], 1)
        with torch.no_grad():
            logits = model(canvas, None, positions=slice(PROMPT.shape[1] - 1, canvas.shape[1] - 1)).logits
        lp = proposal_logprob(logits, paths.completion_ids, rule)
        tokens_only += torch.where(paths.commit_step == t, lp, 0.0).sum(-1)
    assert abs(float(torch.logsumexp(tokens_only, 0).exp()) - 1) > 0.5
    assert abs(float(torch.logsumexp(full, 0).exp()) - 1) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("cache,threshold", [("dual", None), ("prefix", None), ("dual", 0.6), ("prefix", 0.4)])
@torch.no_grad()
def test_cached_record_matches_frequencies(model, cache, threshold):
    """Fast-dLLM's cached sampler: the recorded path probabilities (cached logits, forced refresh commits, selection
    terms) are the frequencies of its paths."""
    alg = "maskgit_plus" if threshold is not None else "entropy"
    cfg = DreamSamplerConfig(gen_length=4, steps=4, block_length=2, cache=cache, threshold=threshold, alg=alg,
                             temperature=1.0, top_k=3)
    r = sample(model, cfg, record=True)
    blocks = r.commit_step.view(DRAWS, 2, 2)  # rows wait for each other between blocks: steps within a block only
    canonical = (blocks - blocks.min(-1, keepdim=True).values).view(DRAWS, 4) + torch.tensor([0, 0, 3, 3])
    keys = keys_of(r.completion_ids, canonical, 6)
    uniq, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    logp = torch.zeros(uniq.numel(), dtype=torch.float64).scatter(0, inverse, recorded_path_logprob(r))
    expected = DRAWS * logp.exp()
    rest = DRAWS - float(expected.sum())
    assert rest > -1e-6 * DRAWS
    G, df, p = g_test(torch.cat([counts, torch.zeros(1, dtype=counts.dtype)]),
                      torch.cat([expected, torch.tensor([max(rest, 0.0)], dtype=torch.float64)]))
    assert df >= 10 and p > 0.01, f"G={G:.1f} df={df} p={p:.4f}"


RECORDED = {
    "maskgit_plus-top_k3": CASES["maskgit_plus-top_k3"],
    "entropy-alg_temp": CASES["entropy-alg_temp"],
    "threshold-uncached": DreamSamplerConfig(gen_length=4, steps=2, alg="maskgit_plus", temperature=1.0,
                                             threshold=0.5, top_k=3),
    "dual-entropy": DreamSamplerConfig(gen_length=4, steps=4, block_length=2, cache="dual", alg="entropy",
                                       temperature=1.0, top_k=3),
    "prefix-threshold": DreamSamplerConfig(gen_length=4, steps=4, block_length=2, cache="prefix", threshold=0.6,
                                           alg="maskgit_plus", temperature=1.0, top_k=3),
}


@pytest.mark.parametrize("name", list(RECORDED))
@torch.no_grad()
def test_the_record_is_the_replay(model, name):
    """The sampler's record of log μ (token and selection terms, cached logits included) equals the path law's
    replay of the same canvases — uncached, Fast-dLLM's uncached threshold (its quotas), prefix and dual caches."""
    cfg = RECORDED[name]
    r = sample(model, cfg, n=32, seed=3, record=True)
    torch.testing.assert_close(path_logprob(model, r, cfg, 4), recorded_path_logprob(r), rtol=1e-5, atol=1e-5)


def _forbidden(cfg: DreamSamplerConfig, cs: torch.Tensor) -> torch.Tensor:
    """A commit-step table the schedule forbids, from a sampled one [B, L]."""
    cs = cs.clone()
    if cfg.cache != "none":
        cs[:, 1] = cs[:, 0]  # a refresh commits the block's first position only
    elif cfg.threshold is not None:
        cs[:] = 0  # 4 tokens at once: above the quota of 2
    elif cfg.alg == "origin":
        cs[:, 0] = cfg.steps  # after the last step
    else:
        cs[:] = torch.arange(cs.shape[1])  # one per step: the schedule's k is 0, 1, 2
    return cs


@pytest.mark.parametrize("name", ["maskgit_plus", "origin-top_k4", "threshold-uncached", "dual-entropy"])
@torch.no_grad()
def test_forbidden_paths_are_impossible_exactly_and_floored_in_training(model, name):
    """The exact law gives a schedule-forbidden path −inf (not the −30 floor: forbidden orders must carry no mass);
    the training likelihood (the policy's per-token terms with selection) keeps it finite (LOG_ZERO)."""
    from dllm_ais.likelihood.selection import LOG_ZERO
    from dllm_ais.likelihood.trajectory import policy_token_logp, replay_plan
    from dllm_ais.models.dream.trajectory import chunk_terms

    cfg = {**CASES, **RECORDED}[name]
    r = sample(model, cfg, n=8, seed=4)
    assert bool(torch.isfinite(path_logprob(model, r, cfg, 4)).all())
    bad = Rollout(prompt_ids=r.prompt_ids, prompt_mask=r.prompt_mask, completion_ids=r.completion_ids,
                  completion_mask=r.completion_mask, commit_step=_forbidden(cfg, r.commit_step),
                  num_steps=r.num_steps + 1)
    assert bool((path_logprob(model, bad, cfg, 4) == -torch.inf).all())
    train = policy_token_logp(model, bad, replay_plan(bad.commit_step, bad.completion_mask), cfg, mask_token_id=4,
                              selection=True, chunk_terms=chunk_terms).sum(-1)
    assert bool(torch.isfinite(train).all())
    if cfg.cache == "none" and cfg.alg != "origin":  # a replayed step's count breaks the rule: floored (the
        # training terms see only steps that committed a counted token: origin's late commit and a cached
        # refresh's extra one fall outside them, and give the finite terms they find)
        assert bool((train < LOG_ZERO / 2).all()), train
