"""Exact law of Dream's sampler on the enumerable testbed, for rung 1 of the estimator ladder (issue 40): Dream's
estimators join the exact card (analysis/estimators.py).

Dream's uncached `diffusion_generate` with steps = L (models/dream/sampler.py) is a Markov chain over partial canvases
with a fixed number of commits per step (Dream's schedule k_t = int(masks · (1 − t_{i+1}/t_i)), all at the last
step: k = 0, 1, 1, 2 at L = 4 — the first step commits nothing). A step from canvas c commits a set C (|C| = k_t)
of its masked positions with tokens y_C with probability

    Π_{j ∈ C} q_j(y_j) · exp(selection term of (C, y_C))

where q is Dream's filtered proposal and the selection term is models/dream/selection.py's
`dream_selection_logprob` (entropy: the top-k set by the entropy confidence, an indicator; maskgit_plus: every
uncommitted draw less confident than the least confident committed one). Both factors are computed here by the
package's own functions on the canvas's shifted logits (exact_sampler.canvas_logits through models/shift.py's view),
so the law is the one the package's sampler draws from (its path law is tested against the package's Dream path
likelihood and sampler). Everything is differentiable in the logits: ∇J̃ by autograd, as for LLaDA.
Canvas digits and indices as exact_sampler.py (0 = masked, d = token d − 1, index Σ_j d_j (V_c + 1)^j). A
selection term at the package's floor (LOG_ZERO: probability ≤ e^−30, an impossible set) counts as probability 0.
"""

from __future__ import annotations

import torch

from dllm_ais.analysis.exact_sampler import canvas_table, commit_children
from dllm_ais.analysis.exact_testbed import sequence_index
from dllm_ais.likelihood.selection import LOG_ZERO
from dllm_ais.models.dream.selection import DreamRule, dream_selection_logprob, proposal_logprob
from dllm_ais.models.dream.selection import scheduled_count as dream_count

RULES = ("entropy", "maskgit_plus")
"""Dream's rules measured exactly (alg_temp 0, T = 1, no top-p / top-k)."""
EPS = 1e-3
"""Dream's last timestep."""


def schedule(L: int, eps: float = EPS) -> list[int]:
    """Commits per step of the uncached schedule with steps = L."""
    out, m = [], L
    for t in range(L):
        k = dream_count(torch.ones(1, m, dtype=torch.bool), t, L, eps) if m else 0
        out.append(k)
        m -= k
    return out


def edges(logits: torch.Tensor, vocab: int, alg: str, mask_id: int) -> list[tuple]:
    """Per step t: (parent canvas [E], child canvas [E], log-probability [n, E]) of every possible commit, or None
    for a step that commits nothing. logits [n, C, L, V] (shifted, every canvas)."""
    n, C, L, V = logits.shape
    digits = canvas_table(vocab, L)  # [C, L]
    rule = DreamRule(alg, 1.0, mask_id)
    out, masks = [], L
    for k in schedule(L):
        if k == 0:
            out.append(None)
            continue
        par, kid, tok, com = [], [], [], []
        for c in (digits == 0).sum(-1).eq(masks).nonzero().squeeze(-1).tolist():
            free = [j for j in range(L) if digits[c, j] == 0]
            for child, t, m in commit_children(c, free, (k,), vocab, L):
                par.append(c)
                kid.append(child)
                tok.append(t)
                com.append(m)
        par_t, tok_t, com_t = torch.tensor(par), torch.stack(tok), torch.stack(com)  # [E], [E, L], [E, L]
        E = len(par)
        z = logits[:, par_t].reshape(n * E, L, V)
        masked = (digits[par_t] == 0).repeat(n, 1)
        commit, tokens = com_t.repeat(n, 1), tok_t.repeat(n, 1)
        lq = torch.where(commit, proposal_logprob(z, tokens, rule), 0.0).sum(-1)  # [n E]
        sel = dream_selection_logprob(z, masked, commit, tokens, rule)  # [n E]
        sel = torch.where(sel <= LOG_ZERO, -torch.inf, sel)  # the floor of an impossible selection: probability 0
        out.append((par_t, torch.tensor(kid), (lq + sel).view(n, E)))
        masks -= k
    return out


def dream_distribution(logits: torch.Tensor, vocab: int, alg: str, mask_id: int) -> torch.Tensor:
    """P(y | x) [n, V_c^L] float64 of Dream's sampler (steps = L, T = 1) from every canvas's shifted logits
    [n, C, L, V] (exact_sampler.canvas_logits of the shifted view); differentiable."""
    n, C, L, _ = logits.shape
    prob = logits.new_zeros(n, C)
    prob[:, 0] = 1.0
    for e in edges(logits, vocab, alg, mask_id):
        if e is None:
            continue
        par, kid, lp = e
        prob = logits.new_zeros(n, C).index_add(1, kid, prob[:, par] * lp.exp())
    digits = canvas_table(vocab, L)
    full = (digits > 0).all(-1)
    out = logits.new_zeros(n, vocab ** L)
    out[:, sequence_index(digits[full] - 1, vocab)] = prob[:, full]
    return out
