"""The field's policy likelihoods (elbo stratified / antithetic / quadrature, coupled, spg): every estimator's MC mean
equals its exact expectation, enumerated over all masks of tiny completions (z-tests over >= 1,000 draws)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch

from dllm_ais.config import PolicyLikelihoodConfig
from dllm_ais.likelihood.mask_draws import QUADRATURE_NODES, draw_antithetic, draw_logprobs, token_terms
from dllm_ais.likelihood.policy import policy_likelihood
from dllm_ais.likelihood.spg import spg_eubo
from dllm_ais.models.tiny import init_weights, tiny_model

MASK = 4
P_PROMPT = 0.3  # PolicyLikelihoodConfig's spg_p_mask_prompt (SPG's default)


@pytest.fixture(scope="module")
def model():
    """A small float64 LLaDA with peaked predictions, so masking really changes the log-probs."""
    m = tiny_model(seed=5, dtype=torch.float64, d_model=32, n_heads=2, n_layers=1, mlp_hidden_size=64)
    return init_weights(m, torch.Generator().manual_seed(5), std=0.3).eval()


def _batch():
    """B = 2, P = 2 (one left-padded), L = 5: counted lengths 4 and 3, then post-EOS tails."""
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(5, 100, (2, 2), generator=g)
    prompt_mask = torch.tensor([[True, True], [False, True]])
    prompt_ids[~prompt_mask] = 1
    completion_ids = torch.randint(5, 100, (2, 5), generator=g)
    completion_mask = torch.tensor([[True] * 4 + [False], [True] * 3 + [False] * 2])
    completion_ids[~completion_mask] = 2
    return prompt_ids, prompt_mask, completion_ids, completion_mask


class Table:
    """log p(y_j | canvas) for every (prompt subset, completion subset) of one sequence, by a plain full forward."""

    def __init__(self, model, b):
        self.pid, self.pm, self.cid, self.cm = (t[b] for t in _batch())
        self.P, self.counted = self.pid.shape[0], self.cm.nonzero().squeeze(-1).tolist()
        self.n, self.cache = len(self.counted), {}
        self.model = model

    def lp(self, S, sp=()):
        """{j: log p(y_j | S and prompt positions sp masked)} for j in S (tail masked: mask_tail)."""
        key = (tuple(sorted(sp)), tuple(sorted(S)))
        if key not in self.cache:
            comp = torch.where(self.cm, self.cid, MASK)
            x = torch.cat([self.pid, comp]).clone()
            x[[self.P + j for j in S]] = MASK
            x[list(sp)] = MASK
            attn = torch.cat([self.pm, torch.ones(len(self.cm), dtype=torch.bool)])
            with torch.no_grad():
                out = self.model(x[None], attn[None]).logits[0].double().log_softmax(-1)
            self.cache[key] = {j: out[self.P + j, self.cid[j]].item() for j in S}
        return self.cache[key]

    def subsets(self, size):
        return list(itertools.combinations(self.counted, size))


def exact_elbo_terms(t: Table) -> np.ndarray:
    """E[c_j] of stratified and antithetic draws: Σ_x (1/x) · avg_{|S| = x} [j ∈ S] log p(y_j | S)."""
    out = np.zeros(5)
    for x in range(1, t.n + 1):
        subs = t.subsets(x)
        for S in subs:
            for j, v in t.lp(S).items():
                out[j] += v / x / len(subs)
    return out


def exact_quadrature_terms(t: Table) -> np.ndarray:
    out = np.zeros(5)
    for node in QUADRATURE_NODES:
        x = min(max(1, round(t.n * node)), t.n)
        subs = t.subsets(x)
        for S in subs:
            for j, v in t.lp(S).items():
                out[j] += 0.5 / node * v / len(subs)
    return out


def exact_coupled_terms(t: Table, lo=0.2, hi=0.8) -> np.ndarray:
    """½ log p_full + ½ E_t E_S[(j∈S)/t log p(j|S) + (j∉S)/(1−t) log p(j|S^c)], t ~ U(lo, hi) (Gauss–Legendre)."""
    out = np.zeros(5)
    for j, v in t.lp(t.counted).items():
        out[j] += 0.5 * v
    nodes, weights = np.polynomial.legendre.leggauss(40)
    ts, ws = lo + (hi - lo) * (nodes + 1) / 2, weights / 2  # ∫ over [lo, hi] / (hi − lo)
    for size in range(t.n + 1):
        for S in t.subsets(size):
            comp = [j for j in t.counted if j not in S]
            for tt, w in zip(ts, ws, strict=True):
                p = tt**size * (1 - tt) ** (t.n - size)
                for j, v in t.lp(S).items():
                    out[j] += 0.5 * w * p * v / tt
                for j, v in t.lp(comp).items():
                    out[j] += 0.5 * w * p * v / (1 - tt)
    return out


def spg_block_law(nb: int, N: int, K: int, rule: str) -> list[tuple[float, tuple[int, ...]]]:
    """The K draws' blocks (c_1..c_K) with their probabilities: `independent` uniform on the n_b counted blocks;
    `permutation` (SPG) the first K of a uniform permutation of all N blocks, each modulo n_b (K <= N)."""
    if rule == "independent":
        return [(1 / nb**K, cs) for cs in itertools.product(range(nb), repeat=K)]
    perms = list(itertools.permutations(range(N), K))
    law = Counter(tuple(j % nb for j in p) for p in perms)
    return [(n / len(perms), cs) for cs, n in sorted(law.items())]


def spg_outcomes(t: Table, block: int, c: int):
    """Every single SPG draw whose block is c, with its probability given c: (prob, completion subset M, prompt
    subset sp)."""
    real = [i for i in range(t.P) if t.pm[i]]
    prompt = [(P_PROMPT ** len(sp) * (1 - P_PROMPT) ** (len(real) - len(sp)), sp)
              for k in range(len(real) + 1) for sp in itertools.combinations(real, k)]
    out = []
    early = [j for j in t.counted if j // block < c]
    inb = [j for j in t.counted if j // block == c]
    later = [j for j in t.counted if j // block > c]
    for k in range(len(early) + 1):
        for E in itertools.combinations(early, k):
            pe = P_PROMPT ** k * (1 - P_PROMPT) ** (len(early) - k)
            for x in range(1, len(inb) + 1):
                subs = list(itertools.combinations(inb, x))
                for S in subs:
                    for pp, sp in prompt:
                        out.append((pe * pp / len(inb) / len(subs), tuple(E) + S + tuple(later), sp))
    assert abs(sum(o[0] for o in out) - 1) < 1e-12
    return out


def _blocks_of(t: Table, block: int) -> tuple[int, int]:
    """(n_b counted blocks, N blocks of the completion width)."""
    return (t.n + block - 1) // block, -(-len(t.cm) // block)


def _replicated(R, group=1):
    """R replicates of the batch, each sequence's replicates in runs of `group` consecutive rows."""
    pid, pm, cid, cm = _batch()
    idx = torch.arange(2).repeat_interleave(group).repeat(R // group)  # [2R]
    return pid[idx], pm[idx], cid[idx], cm[idx], idx


def _z(values: torch.Tensor, idx: torch.Tensor, exact: np.ndarray) -> torch.Tensor:
    """values [2R, L] per-token terms -> z-scores [2, L] of their means vs exact [2, L] (tokens that vary)."""
    zs = []
    for b in range(2):
        v = values[idx == b]
        se = v.std(0) / v.shape[0] ** 0.5
        diff = v.mean(0) - torch.as_tensor(exact[b])
        zs.append(torch.where(se > 1e-9, diff / se.clamp_min(1e-12), diff.abs() * 1e9))
    return torch.stack(zs)


@pytest.mark.parametrize("scheme,K", [("stratified", 4), ("antithetic", 4), ("quadrature", 4)])
def test_elbo_schemes_mc_mean_equals_exact(model, scheme, K):
    R = 256  # 256 replicates × 4 draws = 1,024 draws per sequence
    pid, pm, cid, cm, idx = _replicated(R, group=4)
    pl = policy_likelihood("elbo", PolicyLikelihoodConfig(elbo_draws=K, elbo_scheme=scheme, batch_size=4096))
    with torch.no_grad():
        terms = pl.token_logp(model, pid, pm, cid, cm, pl.draw(pid, pm, cm, 11), mask_token_id=MASK)
    tables = [Table(model, b) for b in range(2)]
    fn = exact_quadrature_terms if scheme == "quadrature" else exact_elbo_terms
    exact = np.stack([fn(t) for t in tables])  # [2, L]
    z = _z(terms, idx, exact)
    assert z.abs().max() < 4.5, (scheme, z)
    assert (terms[:, 4] == 0).all() and (terms[idx == 1][:, 3:] == 0).all()  # post-EOS never scored
    seq = terms.sum(-1)
    zs = [(seq[idx == b].mean() - exact[b].sum()) / (seq[idx == b].std() / R**0.5) for b in range(2)]
    assert max(abs(float(v)) for v in zs) < 4


def test_stratified_and_antithetic_share_the_exact_elbo_quadrature_does_not(model):
    t = Table(model, 0)
    elbo, quad = exact_elbo_terms(t).sum(), exact_quadrature_terms(t).sum()
    assert abs(elbo - quad) > 1e-3  # a deterministic rule in t is a different (biased) quantity


def test_coupled_mc_mean_equals_exact(model):
    R = 512  # 512 replicates × 3 canvases; t drawn once per batch, so each replicate is its own batch
    pl = policy_likelihood("coupled")
    pid, pm, cid, cm = _batch()
    rows = []
    with torch.no_grad():
        for r in range(R):
            rows.append(pl.token_logp(model, pid, pm, cid, cm, pl.draw(pid, pm, cm, 1000 + r), mask_token_id=MASK))
    terms = torch.cat(rows)  # [2R, L]
    idx = torch.arange(2).repeat(R)
    exact = np.stack([exact_coupled_terms(Table(model, b)) for b in range(2)])
    assert _z(terms, idx, exact).abs().max() < 4.5
    assert (terms[:, 4] == 0).all() and (terms[idx == 1][:, 3:] == 0).all()


def _spg_draws(model, R, K, seed, block=2, rule="permutation"):
    pid, pm, cid, cm, idx = _replicated(R)
    pl = policy_likelihood("spg", PolicyLikelihoodConfig(elbo_draws=K, spg_block_length=block, batch_size=4096,
                                                         spg_block_rule=rule))
    d = pl.draw(pid, pm, cm, seed)
    with torch.no_grad():
        lp = pl.draw_logp(model, pid, pm, cid, cm, d, mask_token_id=MASK)
    return d, lp, idx


@pytest.mark.parametrize("rule", ["permutation", "independent"])
def test_spg_elbo_mc_mean_equals_exact(model, rule):
    """Rows of 4 and 3 counted tokens in 3 blocks of 2 (L = 5): n_b = 2 < N = 3, where SPG's permutation rule takes
    block 0 w.p. 2/3 (a permutation entry modulo 2)."""
    d, lp, idx = _spg_draws(model, R=512, K=2, seed=3, rule=rule)  # 1,024 draws per sequence
    terms = token_terms(d, lp)
    exact = np.zeros((2, 5))
    for b in range(2):
        t = Table(model, b)
        nb, N = _blocks_of(t, 2)
        for pc, (c,) in spg_block_law(nb, N, 1, rule):  # each draw's marginal block law
            for prob, M, sp in spg_outcomes(t, 2, c):
                for j, v in t.lp(M, sp).items():
                    exact[b, j] += pc * prob * v / len(M)
    assert _z(terms, idx, exact).abs().max() < 4.5
    assert (terms[:, 4] == 0).all() and (terms[idx == 1][:, 3:] == 0).all()


@pytest.mark.parametrize("K,rule", [(1, "permutation"), (2, "permutation"), (2, "independent")])
def test_spg_eubo_mc_mean_equals_exact(model, K, rule):
    beta = 1.5
    d, lp, idx = _spg_draws(model, R=1024 // K, K=K, seed=4, rule=rule)
    eubo = spg_eubo(d, lp, beta)  # [2R]
    for b in range(2):
        t = Table(model, b)
        exact = 0.0
        for pc, cs in spg_block_law(*_blocks_of(t, 2), K, rule):  # the blocks jointly, then each draw given its block
            for combo in itertools.product(*(spg_outcomes(t, 2, c) for c in cs)):
                prob = pc * math.prod(o[0] for o in combo)
                a = {}
                for _, M, sp in combo:
                    lps = t.lp(M, sp)
                    for j in M:
                        a[j] = a.get(j, 0.0) + math.exp(beta * lps[j]) / (len(M) / t.n) / K
                exact += prob * sum(math.log(v) for v in a.values()) / len(a) / beta
        v = eubo[idx == b]
        z = (v.mean() - exact) / (v.std() / v.shape[0] ** 0.5)
        assert abs(float(z)) < 4, (b, float(v.mean()), exact)


def test_antithetic_counts_are_uniform_and_pairs_complement():
    cm = torch.tensor([[True] * 4 + [False]] * 8)
    d = draw_antithetic(cm, 2, torch.Generator().manual_seed(0), group_size=8)
    assert torch.equal(d.mask[:, 0] | d.mask[:, 1], cm) and not (d.mask[:, 0] & d.mask[:, 1]).any()
    counts = torch.stack([draw_antithetic(cm, 2, g, 8).mask[:, 0].sum(-1) for g in range(400)]).flatten()
    freq = torch.bincount(counts, minlength=5).double() / counts.numel()  # uniform on 0..4: 0.2 each
    assert (freq - 0.2).abs().max() < 0.02
    one_group = draw_antithetic(cm, 2, torch.Generator().manual_seed(1), 8).mask[:, 0].sum(-1)
    assert torch.bincount(one_group, minlength=5).max() <= 2  # stratified across the group's 8 rows


def test_draw_logprobs_matches_the_plain_table(model):
    pid, pm, cid, cm = _batch()
    pl = policy_likelihood("spg", PolicyLikelihoodConfig(elbo_draws=3, spg_block_length=2))
    d = pl.draw(pid, pm, cid.ne(0) & cm, 9)
    with torch.no_grad():
        lp = draw_logprobs(model, pid, pm, cid, cm, d, mask_token_id=MASK)
    for b in range(2):
        t = Table(model, b)
        for k in range(3):
            M = d.mask[b, k].nonzero().squeeze(-1).tolist()
            sp = (d.prompt_masked[b, k] & pm[b]).nonzero().squeeze(-1).tolist()
            for j, v in t.lp(M, sp).items():
                assert abs(lp[b, k, j].item() - v) < 1e-10
