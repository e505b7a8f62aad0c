"""Exact law of SDAR's sampler on the enumerable testbed and SDAR's own estimators, for rung 1 of the estimator ladder
(issue 42 item 5, in issue 40's ladder): SDAR's rows of the exact card (analysis/estimators.py).

Testbed (exact_testbed.make_sdar): the tiny SDAR with blocks of SDAR_BLOCK = 2, a fixed prefix token before the
P = 1 prompt (so the prompt fills block 0 and the L completion tokens fill L / 2 whole blocks), T = 1, no top-k /
top-p, steps = L: denoising_steps = 2 per block, quota n_s = 1 per step (models/sdar/selection.py
`transfer_counts`). Strategies: `low_confidence_static` (the most confident masked slot of the block) and
`low_confidence_dynamic` (every masked slot with confidence > τ when there is at least one, else the top one; τ =
EstimatorsConfig.threshold). The sampler is a Markov chain over (partial canvas, local step): block b is denoised
with blocks < b final and blocks > b masked (unseen: attention is block-causal). A step from canvas c commits a set C
of the block's masked slots with tokens y_C with probability

    Π_{j ∈ C} q_j(y_j) · exp(selection term of (C, y_C))

with q SDAR's filtered proposal and the selection term models/sdar/selection.py's `selection_logprob` — the
package's own functions on the canvas's logits (exact_sampler.canvas_logits through PrefixedSDAR), so the law is the
one sdar_sample draws from (tested against its frequencies). Differentiable in the logits (∇J̃ by autograd). The
proposal and the comparisons are float32, as in the sampler.

SDAR's estimators (what its trainer offers, models/sdar/backend.py, plus one analogue):
- `elbo-block` K: the block-wise ELBO, ONE two-stream [x_t | x_0] forward per draw (likelihood.py
  `draw_block_masks`: per block and draw l ~ U{1..n_b} stratified over the K draws, a uniform l-subset of the block,
  weight n_b / l / K; the clean blocks before it as context): A features (s = 0, m = the block's subset, j). Rows = K.
- `one_step-block`: d1's one-step estimator carried to blocks — the prompt masked w.p. 0.15 (in the clean stream),
  every completion block fully masked, the clean blocks before it as context, one two-stream forward: each block's
  l_b = n_b term of the block ELBO. Not a likelihood SDAR trains with (the package refuses --policy-logprob one_step
  for SDAR); measured as the one-forward baseline LLaDA's and Dream's cards have. Rows = 1.
- `trajectory`: the exact path law's commit-only terms (T features at the canvas before each step); its replay
  (models/sdar/trajectory.py) scores local step s of every block in one two-stream forward: rows = the largest
  number of local steps of any block of the path (2 here under static, 1–2 under dynamic).
- `trajectory-merge2`: TraceRL's shrink 2 (`shrink_steps`: a block's steps grouped 2 at a time, every slot of a
  group scored at the canvas before the group's first step): rows = max over blocks of ⌈steps / 2⌉ = 1 here.
The mask-draw estimators of the full-attention families (the ELBO schemes over the whole completion, coupled, SPG)
are not SDAR's: under block-causal attention a block's logits would see masked earlier blocks; they have no SDAR row.
"""

from __future__ import annotations

import math
from itertools import combinations

import torch

from dllm_ais.analysis import estimator_draws as D
from dllm_ais.analysis.exact_sampler import canvas_table, commit_children
from dllm_ais.analysis.exact_testbed import SDAR_BLOCK, all_sequences, sequence_index
from dllm_ais.likelihood.selection import LOG_ZERO
from dllm_ais.models.sdar.selection import SDARRule, proposal_logprob, selection_logprob, transfer_counts

RULES = ("low_confidence_static", "low_confidence_dynamic")
"""SDAR's strategies measured exactly (sequential is a fixed order: its path is the completion itself)."""
THRESHOLD_RULES = ("low_confidence_dynamic",)
"""The strategies that read τ."""
P_MASK_PROMPT = 0.15
"""d1's prompt-mask probability (likelihood/one_step.py), for `one_step-block`."""


def rule_of(rule: str, mask_id: int, threshold: float | None) -> SDARRule:
    """The SDARRule of a testbed strategy (T = 1, no top-k / top-p)."""
    return SDARRule(rule, 1.0, mask_id, threshold=0.9 if threshold is None else threshold)


def _block_states(digits: torch.Tensor, b: int, Lb: int) -> torch.Tensor:
    """[C] bool: canvases of block b's denoising (blocks < b full, block b with a mask, blocks > b masked)."""
    lo, hi = b * Lb, (b + 1) * Lb
    return ((digits[:, :lo] > 0).all(-1) & (digits[:, lo:hi] == 0).any(-1) & (digits[:, hi:] == 0).all(-1))


def _walk(logits: torch.Tensor, vocab: int, rule: str, mask_id: int, threshold: float | None):
    """The chain's DP over (canvas, local step): (prob [n, C · S] with the finished canvases at local step 0, edges
    [(b, s, parent [E], child [E], log-probability [n, E])]) over the states reached with positive probability."""
    n, C, L, _ = logits.shape
    Lb, S = SDAR_BLOCK, SDAR_BLOCK
    quota = transfer_counts(Lb, S)
    digits = canvas_table(vocab, L)
    r = rule_of(rule, mask_id, threshold)
    prob = logits.new_zeros(n, C * S)
    prob[:, 0] = 1.0
    edges = []
    for b in range(L // Lb):
        lo = b * Lb
        cand = _block_states(digits, b, Lb).nonzero().squeeze(-1)
        for s in range(S):
            live = cand[(prob.detach()[:, cand * S + s] > 0).any(0)].tolist()
            par, kid, tok, com = [], [], [], []
            for c in live:
                free = [j for j in range(Lb) if digits[c, lo + j] == 0]
                for child, t, m in commit_children(c, free, range(1, len(free) + 1), vocab, Lb, offset=lo):
                    par.append(c)
                    kid.append(child)
                    tok.append(t)
                    com.append(m)
            if not par:
                continue
            par_t, kid_t, E = torch.tensor(par), torch.tensor(kid), len(par)
            tok_t, com_t = torch.stack(tok).repeat(n, 1), torch.stack(com).repeat(n, 1)  # [n E, Lb]
            z = logits[:, par_t, lo:lo + Lb].reshape(n * E, Lb, -1)
            masked = (digits[par_t, lo:lo + Lb] == 0).repeat(n, 1)
            lq = torch.where(com_t, proposal_logprob(z, tok_t, r), 0.0).sum(-1)  # [n E]
            sel = selection_logprob(z, masked, com_t, tok_t, torch.full((n * E,), quota[s]), r)
            sel = torch.where(sel <= LOG_ZERO, -torch.inf, sel)  # the floor of an impossible step: probability 0
            lp = (lq + sel).view(n, E)
            done = (digits[kid_t, lo:lo + Lb] > 0).all(-1)  # the block is full: the next block's step 0
            if s + 1 == S and not bool(done.all()):
                raise RuntimeError("SDAR testbed: masks left after a block's last step.")
            dst = torch.where(done, kid_t * S, kid_t * S + s + 1)
            prob = prob.index_add(1, dst, prob[:, par_t * S + s] * lp.exp())
            edges.append((b, s, par_t, kid_t, lp))
    return prob, edges


def sdar_distribution(logits: torch.Tensor, vocab: int, rule: str, mask_id: int, threshold: float | None = None
                      ) -> torch.Tensor:
    """P(y | x) [n, V_c^L] float64 of SDAR's sampler (module doc) from every canvas's logits [n, C, L, V]
    (exact_sampler.canvas_logits through PrefixedSDAR); differentiable."""
    n, C, L, _ = logits.shape
    prob, _ = _walk(logits, vocab, rule, mask_id, threshold)
    digits = canvas_table(vocab, L)
    full = (digits > 0).all(-1)
    out = logits.new_zeros(n, vocab ** L).double()
    out[:, sequence_index(digits[full] - 1, vocab)] = prob[:, full.nonzero().squeeze(-1) * SDAR_BLOCK].double()
    return out


def trajectory(sp: D.Space, logits: torch.Tensor, vocab: int, rule: str, mask_id: int, threshold: float | None,
               merge: int = 1) -> D.Moments:
    """The commit-only trajectory likelihood's coefficient moments over SDAR's paths given y (P(path | y) =
    P(path) / π(y)); merge = N: TraceRL's shrink N within each block. Rows per path: the replay's two-stream forwards
    (module doc)."""
    n, C, L, _ = logits.shape
    Lb = SDAR_BLOCK
    with torch.no_grad():
        _, edges = _walk(logits, vocab, rule, mask_id, threshold)
    table = {}
    for b, s, par, kid, lp in edges:
        for i, (p, c) in enumerate(zip(par.tolist(), kid.tolist(), strict=True)):
            table[(b, s, p, c)] = lp[:, i].tolist()
    base = vocab + 1
    ys = all_sequences(vocab, L).tolist()
    Y, Q = len(ys), len(sp.t)
    means = torch.zeros(n * Y, Q, dtype=torch.float64)
    seconds = torch.zeros(n * Y, Q, Q, dtype=torch.float64)
    rows = torch.zeros(n * Y, dtype=torch.float64)
    for x in range(n):
        for yi, y in enumerate(ys):
            paths = []

            def walk(b, s, m, logp, steps, y=y, x=x, paths=paths):
                if m == 0:
                    paths.append((logp, steps))
                    return
                c = sum((y[j] + 1) * base ** j for j in range(L) if not m >> j & 1)
                free = [j for j in range(b * Lb, (b + 1) * Lb) if m >> j & 1]
                for size in range(1, len(free) + 1):
                    for pos in combinations(free, size):
                        a = sum(1 << j for j in pos)
                        lp = table.get((b, s, c, c + sum((y[j] + 1) * base ** j for j in pos)))
                        if lp is None or not math.isfinite(lp[x]):
                            continue
                        left = m & ~a
                        done = not any(left >> j & 1 for j in range(b * Lb, (b + 1) * Lb))
                        walk(b + 1 if done else b, 0 if done else s + 1, left, logp + lp[x], steps + [(b, m, a)])

            walk(0, 0, sp.full, 0.0, [])
            k = x * Y + yi
            probs = torch.tensor([p for p, _ in paths], dtype=torch.float64).exp()
            total = float(probs.sum())
            for w, (_, steps) in zip((probs / total).tolist(), paths, strict=True):
                terms, forwards = [], 0
                for b in range(L // Lb):
                    own = [(m, a) for bb, m, a in steps if bb == b]
                    forwards = max(forwards, -(-len(own) // merge))
                    for r in range(0, len(own), merge):
                        run = 0
                        for _, a in own[r:r + merge]:
                            run |= a
                        terms += [((own[r][0], j), 1.0) for j in range(L) if run >> j & 1]
                v = sp.vec("T", terms)
                means[k] += w * v
                seconds[k] += w * torch.outer(v, v)
                rows[k] += w * forwards
    mean = means[None].expand(2, -1, -1)
    node = D.Node(1.0, mean, seconds[None].expand(2, -1, -1, -1), mean[..., None],
                  torch.ones(1, 1, dtype=torch.float64))
    return D.Moments("T", (node,), rows)


def _block_bits(b: int) -> list[int]:
    return [b * SDAR_BLOCK + i for i in range(SDAR_BLOCK)]


def block_elbo(sp: D.Space, K: int) -> D.Moments:
    """`elbo-block` with K draws (module doc): exact over each (draw, block)'s count l and subset."""
    n = SDAR_BLOCK
    parts = []
    for k in range(K):
        lo_u, hi_u = k / K, (k + 1) / K
        for b in range(sp.L // n):
            outcomes = []
            for x in range(1, n + 1):  # l = ceil(u n) = x  <=>  u in ((x − 1)/n, x/n]
                p = K * max(0.0, min(hi_u, x / n) - max(lo_u, (x - 1) / n))
                if p <= 0:
                    continue
                subsets = [sum(1 << j for j in c) for c in combinations(_block_bits(b), x)]
                outcomes += [(p / len(subsets), sp.vec("A", sp.mask_vec(m, n / x / K))) for m in subsets]
            parts.append(D.unit(outcomes))
    mean, second = D.add_independent(parts)
    return D.Moments("A", (D.independent(mean, second),), float(K))


def one_step_block(sp: D.Space, p: float = P_MASK_PROMPT) -> D.Moments:
    """`one_step-block` (module doc): one prompt mask (each token w.p. p), every block fully masked; one row."""
    blocks = [sum(1 << j for j in _block_bits(b)) for b in range(sp.L // SDAR_BLOCK)]
    outcomes = []
    for s in range(2 ** sp.P):
        k = bin(s).count("1")
        terms = [t for m in blocks for t in sp.mask_vec(m, 1.0, s)]
        outcomes.append((p ** k * (1 - p) ** (sp.P - k), sp.vec("A", terms)))
    return D.Moments("A", (D.independent(*D.unit(outcomes)),), 1.0)


def own_moments(sp: D.Space, budgets: tuple[int, ...]) -> dict[tuple[str, int], D.Moments]:
    """SDAR's model-independent estimators at every budget: {(name, setting): Moments}."""
    out = {("one_step-block", 1): one_step_block(sp)}
    for K in budgets:
        out[("elbo-block", K)] = block_elbo(sp, K)
    return out
