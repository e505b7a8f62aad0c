"""The sampler's paths given the completion, enumerated exactly, and the coefficient moments of the two likelihoods
that score a rollout's own recorded canvases — MDPO (likelihood/mdpo.py) and d-TreeRPO (likelihood/dtreerpo.py) —
over them (rung 1 of the estimator ladder, analysis/estimators.py).

A path of completion y is the list of its sampler steps (t, m, a): the global forward index t (the package sampler's
`Rollout.commit_step` counting), the masked set m before the step and the set a it commits (bitmasks over the L
positions); its weight is P(path | y) = P(path) / π(y). `llada_paths` / `dream_paths` enumerate them with the
sampler's own step laws (exact_sampler.py's single / parallel commit probabilities; exact_dream.py's edges) and are
what the trajectory moments walk too (estimator_draws.trajectory / path_moments, for both families).

`PathSet` turns a completion's paths into what a recorded rollout holds — commit_step [Np, L], num_steps and the
log-probability each token was committed with (the sampler's `logp_rollout`, under the family's proposal) — and
`mdpo_path_moments` / `dtreerpo_path_moments` feed them to the package's own draws (`draw_mdpo`, `draw_dtreerpo`: one
code path; estimator_draws.recorded_moments collects them). Each draw canvas (masked set = its `hidden`, never the
prompt) scores A features (s = 0, m = hidden, j) with the draw's weights.

Path-only setting (no tree, no batch): a path's T (`num_steps`, d-TreeRPO's step count that its segments cut) is the
path's own — 1 + its last commit step, what a batch of one records. The fixed schedules (LLaDA low-confidence and
Dream, steps = L) have T = L on every path; the threshold rule's paths differ in T (a batch of several rows records
the batch's largest T, so in training its segments depend on the other rows; here they do not).
MDPO's K of S candidate canvases are drawn uniformly without replacement (`draw_mdpo`'s randperm): the moments
follow from the per-canvas terms of the all-canvas draw, each scaled S / K (the draw's 1 / K_b), by the inclusion
probabilities of such a draw (`mdpo_path_moments`; tests check them against every subset, `mdpo_subset_moments`,
and that `draw_mdpo` with K returns exactly one such subset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import torch

Step = tuple[int, int, int]
"""(t, m, a): global step index, masked set before the step, committed set (bitmasks)."""


def transitions(logits: torch.Tensor, vocab: int, threshold: float | None):
    """Per prompt and parent canvas: single-commit probabilities [n, C, L, V_c] and (threshold) the parallel
    extension table [n, C, C] (exact_sampler's own step laws)."""
    from dllm_ais.analysis.exact_sampler import (
        _parallel_commits,
        _proposal_and_confidence,
        _single_commits,
        canvas_table,
    )

    n, C, L, _ = logits.shape
    digits = canvas_table(vocab, L)
    masked = (digits == 0)[None].expand(n, C, L).reshape(n * C, L)
    prop, conf = _proposal_and_confidence(logits, vocab, 1.0)
    pr, cf = prop.reshape(n * C, L, vocab), conf.reshape(n * C, L, vocab)
    single = _single_commits(pr, cf, masked, threshold).view(n, C, L, vocab)
    par = None if threshold is None else _parallel_commits(pr, cf, masked, threshold).view(n, C, -1)
    return single, par


def llada_paths(logits: torch.Tensor, vocab: int, threshold: float | None) -> list[list[tuple[float, list[Step]]]]:
    """Per completion k = x·Y + y (prompt-major), its paths under LLaDA's one-block sampler with steps = L
    (low-confidence: one commit per step; threshold: the parallel extensions too): [(P(path | y), steps)]; [] where
    π(y) = 0. logits [n, C, L, V] of every partial canvas (exact_sampler.canvas_logits)."""
    from dllm_ais.analysis.exact_testbed import all_sequences

    n, C, L, _ = logits.shape
    single, par = transitions(logits, vocab, threshold)
    single, par = single.tolist(), None if par is None else par.tolist()
    ys = all_sequences(vocab, L).tolist()
    base = vocab + 1
    full = 2 ** L - 1
    out = []
    for x in range(n):
        for y in ys:
            paths = []  # (prob, [(t, mask, committed set)])

            def walk(m: int, prob: float, steps: list, y=y, x=x, paths=paths):
                if m == 0:
                    paths.append((prob, steps))
                    return
                c = sum((y[j] + 1) * base ** j for j in range(L) if not m >> j & 1)
                for a in range(1, m + 1):
                    if a & ~m:
                        continue
                    size = bin(a).count("1")
                    if par is None and size > 1:
                        continue
                    t = 0.0
                    if size == 1:
                        j = a.bit_length() - 1
                        t += single[x][c][j][y[j]]
                    if par is not None:
                        t += par[x][c][sum((y[j] + 1) * base ** j for j in range(L) if a >> j & 1)]
                    if t > 0:
                        walk(m & ~a, prob * t, steps + [(len(steps), m, a)])

            walk(full, 1.0, [])
            total = sum(p for p, _ in paths)
            out.append([] if total <= 0 else [(prob / total, steps) for prob, steps in paths])
    return out


def dream_paths(logits: torch.Tensor, vocab: int, alg: str, mask_id: int) -> list[list[tuple[float, list[Step]]]]:
    """As `llada_paths` for Dream's uncached sampler (steps = L, exact_dream.schedule): a step that commits nothing
    (k_t = 0) is no entry of the list but keeps its index t (a forward all the same)."""
    from dllm_ais.analysis.exact_dream import edges, schedule
    from dllm_ais.analysis.exact_testbed import all_sequences

    n, C, L, _ = logits.shape
    table = []  # per step: {(parent, child): [n] log-probabilities} or None
    with torch.no_grad():
        for e in edges(logits, vocab, alg, mask_id):
            table.append(None if e is None else {(int(p), int(c)): e[2][:, i].tolist()
                                                 for i, (p, c) in enumerate(zip(e[0], e[1], strict=True))})
    ks = schedule(L)
    base = vocab + 1
    ys = all_sequences(vocab, L).tolist()
    out = []
    for x in range(n):
        for y in ys:
            paths = []

            def walk(t, m, logp, steps, y=y, x=x, paths=paths):
                if t == L:
                    paths.append((logp, steps))
                    return
                if ks[t] == 0:
                    return walk(t + 1, m, logp, steps)
                c = sum((y[j] + 1) * base ** j for j in range(L) if not m >> j & 1)
                for pos in combinations([j for j in range(L) if m >> j & 1], ks[t]):
                    a = sum(1 << j for j in pos)
                    lp = table[t][(c, c + sum((y[j] + 1) * base ** j for j in pos))][x]
                    if math.isfinite(lp):
                        walk(t + 1, m & ~a, logp + lp, steps + [(t, m, a)])

            walk(0, 2 ** L - 1, 0.0, [])
            probs = torch.tensor([p for p, _ in paths], dtype=torch.float64).exp()
            total = float(probs.sum())
            out.append([(w, steps) for w, (_, steps) in zip((probs / total).tolist(), paths, strict=True)])
    return out


@dataclass(frozen=True)
class PathSet:
    """One completion's paths as recorded rollouts (one row per path)."""

    weight: torch.Tensor
    """[Np] float64 P(path | y)."""
    commit_step: torch.Tensor
    """[Np, L] long: the step at which each position was committed (Rollout.commit_step)."""
    num_steps: torch.Tensor
    """[Np] long: the path's own T = 1 + its last commit step (module doc)."""
    logp_commit: torch.Tensor
    """[Np, L] float64: log q(y_j | canvas of j's commit step) under the family's proposal (Rollout.logp_rollout)."""


def path_sets(paths: list[list[tuple[float, list[Step]]]], logits: torch.Tensor, vocab: int,
              token_logprob) -> list[PathSet | None]:
    """Every completion's PathSet (None where it has no path); token_logprob(z [..., V], tokens [...]) -> [...] the
    family's proposal log-probability (the function its sampler records logp_rollout with)."""
    from dllm_ais.analysis.exact_testbed import all_sequences

    n, C, L, _ = logits.shape
    ys = all_sequences(vocab, L)  # [Y, L]
    Y = ys.shape[0]
    powers = (vocab + 1) ** torch.arange(L)
    out = []
    for k, ps in enumerate(paths):
        if not ps:
            out.append(None)
            continue
        x, y = divmod(k, Y)
        cs = torch.full((len(ps), L), -1, dtype=torch.long)
        for i, (_, steps) in enumerate(ps):
            for t, _, a in steps:
                for j in range(L):
                    if a >> j & 1:
                        cs[i, j] = t
        # canvas of j's commit step: y shown where committed earlier (cs < cs_j), masked elsewhere
        shown = cs[:, None, :] < cs[:, :, None]  # [Np, L_j, L]
        canvas = (torch.where(shown, ys[y] + 1, 0) * powers).sum(-1)  # [Np, L_j]
        z = logits[x, canvas, torch.arange(L)]  # [Np, L, V]
        lp = token_logprob(z, ys[y].expand(len(ps), L)).double()
        out.append(PathSet(torch.tensor([w for w, _ in ps], dtype=torch.float64), cs, own_steps(cs), lp))
    return out


def draw_columns(draw, sp) -> torch.Tensor:
    """[B, K, Q_A] float64: each canvas of a recorded-canvas PolicyDraw (hidden set m, prompt shown) as A-feature
    coefficients — its weights at columns (0, m, j)."""
    B, K, L = draw.mask.shape
    lut = torch.zeros(2 ** L, L, dtype=torch.long)
    for (s, m, j), c in sp.a.items():
        if s == 0:
            lut[m, j] = c
    bits = (draw.hidden.long() * 2 ** torch.arange(L)).sum(-1)  # [B, K]
    col = lut[bits[..., None], torch.arange(L)]  # [B, K, L]
    out = torch.zeros(B * K, len(sp.a), dtype=torch.float64)
    w = torch.where(draw.mask, draw.weight.double(), 0.0)
    return out.scatter_add_(1, col.reshape(B * K, L), w.reshape(B * K, L)).view(B, K, -1)


def mdpo_path_draw(ps: PathSet, confidence: bool = True):
    """The all-canvas MDPO draw of every path (num_canvases None: weight λ_t c_j / S)."""
    from dllm_ais.likelihood.mdpo import draw_mdpo

    ones = torch.ones_like(ps.commit_step, dtype=torch.bool)
    return draw_mdpo(ps.commit_step, ones, None, 0, ps.logp_commit.exp() if confidence else None)


def mdpo_path_moments(ps: PathSet, sp, K: int, confidence: bool = True):
    """(E W [Q], E W Wᵀ [Q, Q], E rows) of MDPO with K canvases over the completion's paths (module doc). Path p
    has S candidate canvases with own terms v_i (the all-canvas draw's weights times S); K' = min(K, S) of them are
    drawn uniformly without replacement and W = Σ_{i drawn} v_i / K', so E W = Σ_i v_i / S and
    E W Wᵀ = [Σ_i v_i v_iᵀ + (K' − 1)/(S − 1) · Σ_{i≠j} v_i v_jᵀ] / (K' S) (inclusion probabilities K'/S and
    K'(K' − 1)/(S(S − 1)); tests check it against every subset and against draw_mdpo's own draws)."""
    draw = mdpo_path_draw(ps, confidence)
    S = draw.mask.any(-1).sum(-1).double()  # [Np] candidate canvases
    v = draw_columns(draw, sp) * S[:, None, None]  # [Np, Smax, Q] each canvas's own term (padding: 0)
    k = S.clamp(max=K)  # [Np] K'
    tot = v.sum(1)  # [Np, Q]
    own = torch.einsum("psq,psr->pqr", v, v)  # Σ_i v_i v_iᵀ
    pair = torch.einsum("pq,pr->pqr", tot, tot) - own  # Σ_{i≠j} v_i v_jᵀ
    c = torch.where(S > 1, (k - 1) / (S - 1).clamp_min(1), 0.0)
    w = ps.weight
    second = torch.einsum("p,pqr->qr", w / (k * S), own + c[:, None, None] * pair)
    return w @ (tot / S[:, None]), second, float(w @ k)


def mdpo_subset_moments(ps: PathSet, sp, K: int, confidence: bool = True):
    """`mdpo_path_moments` by enumerating every K'-subset of every path's canvases (the reference, for tests)."""
    draw = mdpo_path_draw(ps, confidence)
    V = draw_columns(draw, sp)  # [Np, Smax, Q]: per-canvas terms / S
    used = draw.mask.any(-1)  # [Np, Smax]
    Q = V.shape[-1]
    mean, second, rows = torch.zeros(Q, dtype=torch.float64), torch.zeros(Q, Q, dtype=torch.float64), 0.0
    for p in range(V.shape[0]):
        S = int(used[p].sum())
        v = V[p, :S] * S  # [S, Q] each canvas's own term
        subs = list(combinations(range(S), min(K, S)))
        Ws = torch.stack([v[list(c)].sum(0) / len(c) for c in subs])  # [n_sub, Q]
        w = float(ps.weight[p]) / len(subs)
        mean += w * Ws.sum(0)
        second += w * Ws.T @ Ws
        rows += float(ps.weight[p]) * min(K, S)
    return mean, second, rows


def own_steps(commit_step: torch.Tensor) -> torch.Tensor:
    """[B] long: each row's own T = 1 + its last commit step (module doc)."""
    return commit_step.max(-1).values + 1


def draw_dtreerpo_own_steps(commit_step: torch.Tensor, completion_mask: torch.Tensor, segments: int):
    """d-TreeRPO's draw (likelihood/dtreerpo.draw_dtreerpo) with each row's segments cut from its own T (the
    path-only setting, module doc) instead of the batch's num_steps: rows grouped by T, one call per group, draws
    padded to the largest segment count (padding scores nothing)."""
    from dllm_ais.likelihood.dtreerpo import draw_dtreerpo
    from dllm_ais.likelihood.mask_draws import PolicyDraw

    T_row = own_steps(commit_step)
    parts = {}
    for T in T_row.unique().tolist():
        idx = (T_row == T).nonzero().squeeze(-1)
        parts[T] = (idx, draw_dtreerpo(commit_step[idx], completion_mask[idx], int(T), segments))
    B, L = commit_step.shape
    K = max(d.mask.shape[1] for _, d in parts.values())
    mask = torch.zeros(B, K, L, dtype=torch.bool, device=commit_step.device)
    weight = torch.zeros(B, K, L, dtype=torch.float64, device=commit_step.device)
    hidden = torch.zeros(B, K, L, dtype=torch.bool, device=commit_step.device)
    level = torch.zeros(B, K, dtype=torch.float64, device=commit_step.device)
    for idx, d in parts.values():
        k = d.mask.shape[1]
        mask[idx, :k], weight[idx, :k], hidden[idx, :k], level[idx, :k] = d.mask, d.weight, d.hidden, d.level
    return PolicyDraw(mask, weight, None, level, hidden)


def dtreerpo_path_moments(ps: PathSet, sp, segments: int):
    """(E W, E W Wᵀ, E rows) of d-TreeRPO with `segments` segments of each path's own T (module doc)."""
    cs = ps.commit_step
    draw = draw_dtreerpo_own_steps(cs, torch.ones_like(cs, dtype=torch.bool), segments)
    W = draw_columns(draw, sp).sum(1)  # [Np, Q]
    rows = draw.mask.any(-1).sum(-1).double()
    w = ps.weight
    return w @ W, torch.einsum("p,pq,pr->qr", w, W, W), float(w @ rows)
