"""Exact moments of each policy likelihood's random gradient coefficients (analysis/estimators.py).

On a completion k every estimator's gradient is ∇s_k(ξ) = Σ_q W_kq(ξ) g_kq: g the feature gradients
(estimator_features.py, family A or T) and W random (the mask draws, or the sampler's path). The GRPO moments need
    mean  E W_k            [Q],
    self  E W_k W_kᵀ       [Q, Q]   (one row's draws),
    cross E W_k W_k'ᵀ      [Q, Q]   (two rows of one group: `basis · X · basisᵀ`),
optionally given a batch-shared latent z (coupled's t: `Node.rho`), and per sign of the advantage (SPG trains on
its ELBO for Â > 0 and its EUBO otherwise: index 0 = Â > 0, 1 = Â ≤ 0). Everything here is exact enumeration —
over subsets, the offset intervals of the stratified schemes, the sampler's paths — except SPG's EUBO with K ≥ 2
draws (log of a mean over draws; `spg_eubo_mc`: M draws from `likelihood.spg.draw_spg` itself, fixed generator).
Coupled's t ~ U(t_min, t_max) is integrated with a 16-node Gauss–Legendre rule (the integrands are smooth on the
interval; the rule's error is below float64 rounding at these degrees).
Each builder returns the nodes and the expected forward rows per completion (draws with an empty mask cost none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch

from dllm_ais.analysis.estimator_features import a_index, t_index
from dllm_ais.likelihood.mask_draws import QUADRATURE_NODES


@dataclass(frozen=True)
class Node:
    """The coefficient moments given one value of the batch-shared latent (one node when there is none)."""

    rho: float
    """Probability (quadrature weight) of this latent value."""
    mean: torch.Tensor
    """[2, K or 1, Q] E W per advantage sign (0: Â > 0, 1: Â ≤ 0)."""
    second: torch.Tensor
    """[2, K or 1, Q, Q] E W Wᵀ of one row."""
    basis: torch.Tensor
    """[2, K or 1, Q, R]: E W_row W_row'ᵀ (two rows of a group) = basis[s] X basis[s']ᵀ."""
    X: torch.Tensor
    """[R, R]."""


@dataclass(frozen=True)
class Moments:
    """Everything the closed forms need about one estimator at one budget."""

    family: str
    """A or T (estimator_features.py)."""
    nodes: tuple[Node, ...]
    rows: float | torch.Tensor
    """Expected forward rows per completion (a float), or [K] per completion (trajectory; weighted by π later)."""
    mc_draws: int = 0
    """Monte-Carlo draws behind the moments (0 = exact)."""


def independent(mean: torch.Tensor, second: torch.Tensor, rho: float = 1.0) -> Node:
    """A node whose rows draw independently: cross = mean meanᵀ. mean [Q] / [2, K, Q]; second likewise [.., Q, Q]."""
    if mean.dim() == 1:
        mean, second = mean[None, None].expand(2, 1, -1), second[None, None].expand(2, 1, -1, -1)
    return Node(rho, mean, second, mean[..., None], torch.ones(1, 1, dtype=torch.float64))


def unit(outcomes: list[tuple[float, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(E b, E b bᵀ) of a finite distribution [(prob, vector [Q])]."""
    mean = sum(p * v for p, v in outcomes)
    second = sum(p * torch.outer(v, v) for p, v in outcomes)
    return mean, second


def add_independent(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Moments of a sum of independent parts [(mean, second)]."""
    mean = sum(m for m, _ in parts)
    second = sum(s - torch.outer(m, m) for m, s in parts) + torch.outer(mean, mean)
    return mean, second


class Space:
    """Feature columns and subset enumeration for a (P, L) testbed."""

    def __init__(self, P: int, L: int):
        self.P, self.L = P, L
        self.a = {f: i for i, f in enumerate(a_index(P, L))}
        self.t = {f: i for i, f in enumerate(t_index(L))}
        self.full = 2 ** L - 1

    def vec(self, family: str, terms: list[tuple[tuple, float]]) -> torch.Tensor:
        """A [Q] vector with `weight` on each feature key of `terms`."""
        cols = self.a if family == "A" else self.t
        v = torch.zeros(len(cols), dtype=torch.float64)
        for key, w in terms:
            v[cols[key]] += w
        return v

    def mask_vec(self, m: int, w: float, s: int = 0) -> list[tuple[tuple, float]]:
        """A-feature terms: every token j of mask m at prompt mask s, weight w."""
        return [((s, m, j), w) for j in range(self.L) if m >> j & 1]

    def subsets(self, x: int) -> list[int]:
        return [sum(1 << j for j in c) for c in combinations(range(self.L), x)]

    def subset_unit(self, x: int, w: float) -> tuple[torch.Tensor, torch.Tensor]:
        """A uniformly random x-subset, weight w on its tokens (x = 0: nothing)."""
        if x == 0:
            z = torch.zeros(len(self.a), dtype=torch.float64)
            return z, torch.outer(z, z)
        ms = self.subsets(x)
        return unit([(1 / len(ms), self.vec("A", self.mask_vec(m, w))) for m in ms])


def _intervals(breaks: list[float]) -> list[tuple[float, float]]:
    """(midpoint, length) of the pieces of [0, 1) cut at `breaks`."""
    pts = sorted({0.0, 1.0, *[b % 1.0 for b in breaks]})
    return [((a + b) / 2, b - a) for a, b in zip(pts[:-1], pts[1:], strict=True) if b - a > 1e-15]


def stratified(sp: Space, K: int) -> Moments:
    """VRPO/BGPO: K counts from one offset (draw_stratified), weight (L/x)/K; exact over the offset's intervals."""
    L = sp.L
    mean = second = 0
    for v, length in _intervals([i / L - k / K for i in range(L + 1) for k in range(K)]):
        xs = [math.floor(((v + k / K) % 1.0) * L) + 1 for k in range(K)]
        m, s = add_independent([sp.subset_unit(x, L / x / K) for x in xs])
        mean, second = mean + length * m, second + length * s
    return Moments("A", (independent(mean, second),), float(K))


def antithetic(sp: Space, K: int, G: int) -> Moments:
    """ESPO: K/2 counts x ∈ 0..L (+ complements), stratified over the G·K/2 cells of a group from one offset."""
    L, K0 = sp.L, K // 2
    cells = G * K0
    n = len(sp.a)
    mean, second, cross = torch.zeros(n, dtype=torch.float64), torch.zeros(n, n, dtype=torch.float64), 0
    rows = 0.0
    ms_of = {x: sp.subsets(x) for x in range(L + 1)}

    def pair(x: int):
        w = lambda c: (L + 1) / c / K if c > 0 else 0.0  # noqa: E731
        return unit([(1 / len(ms_of[x]), sp.vec("A", sp.mask_vec(m, w(x)) + sp.mask_vec(sp.full & ~m, w(L - x))))
                     for m in ms_of[x]])

    pairs = {x: pair(x) for x in range(L + 1)}
    for v, length in _intervals([i / (L + 1) - c / cells for i in range(L + 2) for c in range(cells)]):
        xs = [math.floor(((v + c / cells) % 1.0) * (L + 1)) for c in range(cells)]
        row = [add_independent([pairs[x] for x in xs[r * K0:(r + 1) * K0]]) for r in range(G)]
        means = torch.stack([m for m, _ in row])  # [G, Q]
        total = means.sum(0)
        mean += length * total / G
        second += length * sum(s for _, s in row) / G
        cross = cross + length * (torch.outer(total, total) - means.T @ means) / (G * (G - 1))
        rows += length * sum(2 - (x == 0) - (x == L) for x in xs) / G
    evals, evecs = torch.linalg.eigh((cross + cross.T) / 2)
    keep = evals.abs() > 1e-12 * evals.abs().max()
    basis = evecs[:, keep][None, None].expand(2, 1, -1, -1)
    node = Node(1.0, mean[None, None].expand(2, 1, -1), second[None, None].expand(2, 1, -1, -1), basis,
                torch.diag(evals[keep]))
    return Moments("A", (node,), rows)


def quadrature(sp: Space, K: int) -> Moments:
    """GDPO: K/2 i.i.d. pairs of node draws, |M| = max(1, round(L t)), weight (½/t)/(K/2)."""
    L = sp.L
    xs = [min(L, max(1, int(np.round(L * t)))) for t in QUADRATURE_NODES]  # numpy rounds half to even, as torch
    pair = add_independent([sp.subset_unit(x, 0.5 / t / (K // 2)) for x, t in zip(xs, QUADRATURE_NODES,
                                                                                   strict=True)])
    return Moments("A", (independent(*add_independent([pair] * (K // 2))),), float(K))


def coupled(sp: Space, t_min: float = 0.2, t_max: float = 0.8, nodes: int = 16) -> Moments:
    """DiffuCoder: full mask (½) + Bernoulli(t) mask (½/t) + complement (½/(1−t)); t shared by the batch."""
    L = sp.L
    z, w = np.polynomial.legendre.leggauss(nodes)
    out, rows = [], 0.0
    for zi, wi in zip(z, w, strict=True):
        t = t_min + (t_max - t_min) * (zi + 1) / 2
        outcomes = []
        for m in range(2 ** L):
            k = bin(m).count("1")
            terms = sp.mask_vec(sp.full, 0.5) + (sp.mask_vec(m, 0.5 / t) if m else [])
            terms += sp.mask_vec(sp.full & ~m, 0.5 / (1 - t)) if m != sp.full else []
            outcomes.append((t ** k * (1 - t) ** (L - k), sp.vec("A", terms)))
        out.append(independent(*unit(outcomes), rho=float(wi) / 2))
        rows += float(wi) / 2 * (3 - (1 - t) ** L - t ** L)
    return Moments("A", tuple(out), rows)


def one_step(sp: Space, p: float = 0.15) -> Moments:
    """d1: one prompt mask (each token w.p. p), every completion token masked; one row."""
    P = sp.P
    outcomes = [(p ** bin(s).count("1") * (1 - p) ** (P - bin(s).count("1")), sp.vec("A", sp.mask_vec(sp.full, 1.0,
                                                                                                       s)))
                for s in range(2 ** P)]
    return Moments("A", (independent(*unit(outcomes)),), 1.0)


def spg_elbo_unit(sp: Space, K: int, p: float = 0.3, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One SPG draw (one block): prompt tokens masked w.p. p, x ~ U{1..L}, uniform x-subset, weight scale/x/K."""
    P, L = sp.P, sp.L
    outcomes = []
    for s in range(2 ** P):
        ps = p ** bin(s).count("1") * (1 - p) ** (P - bin(s).count("1"))
        for x in range(1, L + 1):
            for m in sp.subsets(x):
                outcomes.append((ps / L / len(sp.subsets(x)), sp.vec("A", sp.mask_vec(m, scale / x / K, s))))
    return unit(outcomes)


def spg(sp: Space, K: int, logp_a: torch.Tensor, draws: int, replicas: int, seed: int, beta: float = 1.5,
        p: float = 0.3) -> list[Moments]:
    """SPG with K draws: the ELBO (Â > 0, exact) and the EUBO (Â ≤ 0). The loss is (1/N) Σ Â · bound with the
    bound a per-token mean, i.e. L · bound in this analysis's (1/(N L)) Σ Â ∇s convention. K = 1: the EUBO's
    gradient equals the ELBO's (log of one term), exact. K ≥ 2: the EUBO's coefficients W = L ∂EUBO/∂log p depend
    on the log-probs; `draws` draws from `draw_spg` (fixed seed), split into `replicas` equal parts: one Moments per
    replica (their spread gives the Monte-Carlo standard error). logp_a [Kc, Q_A] the A features' log p."""
    from dllm_ais.likelihood.spg import draw_spg, spg_eubo

    L, P = sp.L, sp.P
    elbo = add_independent([spg_elbo_unit(sp, K, p, scale=float(L))] * K)
    Kc = logp_a.shape[0]
    if K == 1:
        node = independent(elbo[0], elbo[1])
        return [Moments("A", (node,), 1.0)]
    g = torch.Generator().manual_seed(seed)
    ones = torch.ones(draws, L, dtype=torch.bool)
    d = draw_spg(ones, K, g, L, torch.ones(draws, P, dtype=torch.bool), p)
    pw = 2 ** torch.arange(P)
    s_bits = (d.prompt_masked.long() * pw).sum(-1)  # [M, K]
    m_bits = (d.mask.long() * 2 ** torch.arange(L)).sum(-1)  # [M, K]
    lut = torch.full((2 ** P, 2 ** L, L), 0, dtype=torch.long)
    for (s, m, j), c in sp.a.items():
        lut[s, m, j] = c
    col = lut[s_bits[..., None], m_bits[..., None], torch.arange(L)]  # [M, K, L] (0 where unmasked: weight 0)
    Q = len(sp.a)
    per = draws // replicas
    means, seconds = torch.zeros(replicas, Kc, Q, dtype=torch.float64), torch.zeros(replicas, Kc, Q, Q,
                                                                                   dtype=torch.float64)
    for k in range(Kc):
        lp = logp_a[k][col].clone().requires_grad_(True)  # [M, K, L]
        spg_eubo(d, lp, beta).sum().backward()
        W = torch.zeros(draws, Q, dtype=torch.float64).scatter_add_(1, col.reshape(draws, -1),
                                                                    (L * lp.grad).reshape(draws, -1))
        Wr = W.view(replicas, per, Q)
        means[:, k] = Wr.mean(1)
        seconds[:, k] = torch.einsum("rmq,rmp->rqp", Wr, Wr) / per
    out = []
    for r in range(replicas):
        mean = torch.stack([elbo[0][None].expand(Kc, -1), means[r]])  # [2, Kc, Q]
        second = torch.stack([elbo[1][None].expand(Kc, -1, -1), seconds[r]])
        out.append(Moments("A", (Node(1.0, mean, second, mean[..., None], torch.ones(1, 1, dtype=torch.float64)),),
                           float(K), mc_draws=per))
    return out


def trajectory(sp: Space, logits: torch.Tensor, pi: torch.Tensor, vocab: int, threshold: float | None,
               merge: int) -> Moments:
    """The trajectory likelihood (commit-only: Σ_j log q(y_j | canvas of its step), the package default without
    selection terms), exact over the sampler's paths given y: P(path | y) = P(path) / π(y)
    (estimator_paths.llada_paths). merge = N scores each run of N consecutive steps from the run's first canvas
    (`trajectory.merge_commit_steps`); its rows = runs. logits [n, C, L, V] every partial canvas's logits
    (exact_sampler.canvas_logits), pi [n, Y] the sampler's law."""
    from dllm_ais.analysis.estimator_paths import llada_paths

    return path_moments(sp, llada_paths(logits, vocab, threshold), merge)


def path_moments(sp: Space, paths: list, merge: int) -> Moments:
    """The commit-only trajectory likelihood's moments (T features) from every completion's paths [(P(path | y),
    [(t, m, a)])] (estimator_paths.py): each run of `merge` steps scored from its first canvas, one row a run."""
    L = sp.L
    Q = len(sp.t)
    K = len(paths)
    means = torch.zeros(K, Q, dtype=torch.float64)
    seconds = torch.zeros(K, Q, Q, dtype=torch.float64)
    rows = torch.zeros(K, dtype=torch.float64)
    for k, ps in enumerate(paths):
        for w, steps in ps:
            terms = []
            for r in range(0, len(steps), merge):
                start = steps[r][1]
                run = 0
                for _, _, a in steps[r:r + merge]:
                    run |= a
                terms += [((start, j), 1.0) for j in range(L) if run >> j & 1]
            v = sp.vec("T", terms)
            means[k] += w * v
            seconds[k] += w * torch.outer(v, v)
            rows[k] += w * -(-len(steps) // merge)
    return single_node("T", means, seconds, rows)


def recorded_moments(sets: list, sp: Space, fn) -> Moments:
    """Moments (family A) of a recorded-canvas likelihood (MDPO, d-TreeRPO) from per-completion fn(PathSet) ->
    (mean, second, rows) over the completions' paths (estimator_paths.py; None: no path); rows of one group draw
    their paths independently given their completions."""
    Q = len(sp.a)
    K = len(sets)
    means = torch.zeros(K, Q, dtype=torch.float64)
    seconds = torch.zeros(K, Q, Q, dtype=torch.float64)
    rows = torch.zeros(K, dtype=torch.float64)
    for k, ps in enumerate(sets):
        if ps is not None:
            means[k], seconds[k], rows[k] = fn(ps)
    return single_node("A", means, seconds, rows)


def single_node(family: str, means: torch.Tensor, seconds: torch.Tensor, rows: torch.Tensor) -> Moments:
    """Moments of a likelihood whose rows are drawn independently given their completions: one node holding each
    completion's exact feature mean [K, Q] and second moment [K, Q, Q] (both group halves alike), rows [K]."""
    mean = means[None].expand(2, -1, -1)
    node = Node(1.0, mean, seconds[None].expand(2, -1, -1, -1), mean[..., None], torch.ones(1, 1, dtype=torch.float64))
    return Moments(family, (node,), rows)
