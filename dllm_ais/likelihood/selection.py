"""The selection term of a masked-diffusion denoising step: the probability that the sampler commits exactly the
positions it committed, given the tokens proposed there (DESIGN.md §5; samplers/diffusion.py is the sampler).

At a step every masked position i of the current block draws a proposal X_i ~ q_i = softmax(logits_i / T) with the
mask token removed, independently; its confidence is c_i(X_i) = p_i(X_i), p_i = softmax(logits_i) over the full
vocabulary (low-confidence remasking), or an independent uniform draw (random remasking). The step commits a set C
of the masked positions M. The probability of (C, y_C) factorises as

    Π_{j ∈ C} q_j(y_j)  ×  Π_{j ∈ C} 1[j's confidence was allowed]  ×  Π_{i ∈ M \\ C} P(c_i(X_i) below the bound)

where the last two factors are the *selection term* computed here, one per rule:
- fixed schedule (top-k, k = |C|): every uncommitted proposal is less confident than the least confident committed
  token, bound = c_min; a tie with it is allowed only at a position after the last committed position holding c_min
  (the sampler's stable descending sort puts lower positions first).
- threshold τ (Fast-dLLM): all committed c_j >= τ and every uncommitted c_i < τ; or, where one token was committed
  below τ (the forced most-confident one), every other c_i < c_j (ties allowed after j: argmax takes the first).
  With a cap N (`max_commit_per_step`) and |C| = N: the N most confident of those >= τ, bound = c_min as for top-k.
- random remasking: confidences are uniform draws independent of the model: top-k gives −log C(|M|, k); threshold
  gives (1 − τ)^|C| τ^(|M|−|C|) (plus τ^|M| / |M| when |C| = 1, the forced draw; the cap's |C| = N case integrates
  the uniform order statistics exactly). These cancel in any ratio of two models.

P(c_i(X_i) < b) = Σ_x q_i(x) 1[p_i(x) < b] is differentiable in the logits through q (the indicator is piecewise
constant): the selection term's gradient is the one of the exact path probability wherever it is differentiable.
An event of probability 0 — a committed token below the threshold beside others above it, a step of the fixed
schedule that commits another number of tokens than `transfer_schedule` gives it (top-k's k is the schedule's, not
the step's own count) — has the log-probability `impossible`: −inf for the exact law (`trajectory.path_logprob`),
`LOG_ZERO` (a finite floor, the default) for the training likelihoods. The floor is deliberate there: θ and π_old
(or π_old and μ) may both find a sampled path impossible (a quantised rollout's confidence crossing τ), and
−inf − (−inf) is NaN in a ratio; with the floor the ratio of two impossible terms is 1 with no gradient, and one
impossible term against a possible one gives ℓ ≤ −30 + O(1), which the correction's log_w_clamp bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOG_ZERO = -30.0
"""Floor of a selection log-term (an event of probability 0 or below e^−30): the term's value there, with no gradient.
e^−30 ≈ 1e−13 is far below any probability a sampler of this package draws at float64 resolution in practice."""


@dataclass(frozen=True)
class SelectionRule:
    """How a sampler chooses the positions it commits at a step (a view of SamplerConfig's fields)."""

    remasking: str
    """`low_confidence` (full-softmax probability of the proposal) or `random` (uniform draws)."""
    temperature: float
    """Proposal temperature T > 0 (the proposal q is softmax(logits / T) without the mask token)."""
    mask_token_id: int
    """The mask token: never proposed, but in the full softmax the confidence is read from."""
    threshold: float | None = None
    """Threshold decoding's τ; None = the fixed schedule (top-k with k = the number committed)."""
    max_commit: int | None = None
    """Threshold decoding's cap N on tokens per step (None = no cap)."""

    @classmethod
    def of(cls, config, mask_token_id: int) -> SelectionRule:
        """The rule of a SamplerConfig."""
        return cls(config.remasking, config.temperature, mask_token_id, config.threshold,
                   config.max_commit_per_step)


def proposal_and_confidence(logits: torch.Tensor, rule: SelectionRule) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, Lb, V] (the sampler's, before the mask token is removed) -> (log q [n, Lb, V] float64, the
    proposal's log-probabilities with the mask token at −inf; p [n, Lb, V] float64 full softmax, detached)."""
    x = logits.to(torch.float64)
    p = torch.softmax(x.detach(), dim=-1)
    q = (x / rule.temperature).index_fill(-1, torch.tensor([rule.mask_token_id], device=x.device), -torch.inf)
    return q.log_softmax(-1), p


def _mass_below(log_q: torch.Tensor, p: torch.Tensor, bound: torch.Tensor, tie_ok: torch.Tensor) -> torch.Tensor:
    """P(p_i(X) < bound, or = bound where tie_ok) under X ~ q_i: log_q, p [n, Lb, V], bound [n], tie_ok [n, Lb]
    -> [n, Lb] (differentiable through log_q)."""
    b = bound[:, None, None]
    below = (p < b) | ((p == b) & tie_ok[..., None])  # [n, Lb, V]
    return torch.where(below, log_q.exp(), 0.0).sum(-1)


def transfer_schedule(num_masked: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to commit per step: num_masked [B] -> [B, steps], rows summing to num_masked (remainder first). The
    fixed schedule of samplers/diffusion.py (LLaDA's `get_num_transfer_tokens`)."""
    base = num_masked // steps  # [B]
    rem = num_masked % steps  # [B]
    extra = torch.arange(steps, device=num_masked.device)[None, :] < rem[:, None]  # [B, steps]
    return base[:, None] + extra.long()


def _log_floor(x: torch.Tensor, impossible: float = LOG_ZERO) -> torch.Tensor:
    """log x; `impossible` where x <= e^LOG_ZERO (LOG_ZERO, the floor) or x == 0 (impossible = −inf): no gradient
    there."""
    edge = math.exp(LOG_ZERO) if impossible == LOG_ZERO else 0.0
    tiny = max(edge, torch.finfo(torch.float64).tiny)
    return torch.where(x > edge, x.clamp_min(tiny).log(), torch.full_like(x, impossible))


def confidence_selection_logprob(log_q: torch.Tensor, p: torch.Tensor, masked: torch.Tensor, commit: torch.Tensor,
                                 tokens: torch.Tensor, rule: SelectionRule, expected: torch.Tensor | None = None,
                                 impossible: float = LOG_ZERO, cap: torch.Tensor | None = None) -> torch.Tensor:
    """Low-confidence remasking: the selection log-term of each row's step (module docstring).

    log_q, p [n, Lb, V] (`proposal_and_confidence`), masked [n, Lb] bool (masked before the step), commit [n, Lb]
    bool (committed at the step, ⊆ masked), tokens [n, Lb] long (the committed tokens; anything elsewhere),
    expected [n] long: the fixed schedule's k of the step (None = take k from `commit`; unused with a threshold),
    cap [n] long: a threshold step's cap per row (None = rule.max_commit; Dream's uncached threshold quota)
    -> [n] float64; 0 for a row that committed nothing, `impossible` for an event of probability 0.
    """
    n, Lb = masked.shape
    conf = p.gather(-1, tokens.clamp_min(0)[..., None]).squeeze(-1)  # [n, Lb] confidence of each committed token
    inf = torch.tensor(torch.inf, dtype=conf.dtype, device=conf.device)
    c_min = torch.where(commit, conf, inf).min(-1).values  # [n]
    pos = torch.arange(Lb, device=masked.device).expand(n, -1)  # [n, Lb]
    last_min = torch.where(commit & (conf == c_min[:, None]), pos, -1).max(-1).values  # [n] last committed at c_min
    tie_after_min = pos > last_min[:, None]  # [n, Lb]
    count = commit.sum(-1)  # [n]
    bound, tie_ok, feasible = c_min, tie_after_min, torch.ones(n, dtype=torch.bool, device=masked.device)
    if rule.threshold is not None:
        tau = rule.threshold
        all_above = torch.where(commit, conf >= tau, True).all(-1)  # [n]
        forced = (count == 1) & ~all_above  # the most confident token committed below τ: top-1
        max_commit = cap if cap is not None else rule.max_commit
        capped = (count == max_commit) if max_commit is not None else torch.zeros_like(forced)
        top_n = forced | (capped & all_above)  # bound c_min, ties after the last minimum
        bound = torch.where(top_n, c_min, torch.full_like(c_min, tau))
        tie_ok = tie_after_min & top_n[:, None]
        feasible = all_above | forced
    elif expected is not None:
        feasible = count == expected
    uncommitted = masked & ~commit  # [n, Lb]
    below = _mass_below(log_q, p, bound, tie_ok)  # [n, Lb]
    terms = torch.where(uncommitted, _log_floor(below, impossible), 0.0).sum(-1)  # [n]
    terms = torch.where(feasible, terms, torch.full_like(terms, impossible))
    return torch.where(count > 0, terms, torch.where(feasible, 0.0, impossible))


def _log_comb(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """log C(n, k) elementwise (float64)."""
    n, k = n.double(), k.double()
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def _capped_uniform_log_prob(m: int, cap: int, tau: float) -> float:
    """log P(a given set of `cap` of m iid U[0, 1) draws are the `cap` largest and all >= τ)
    = log ∫_τ^1 cap (1 − a)^(cap−1) a^(m−cap) da, by the binomial expansion of (1 − a)^(cap−1)."""
    total = 0.0
    for k in range(cap):
        e = m - cap + k + 1
        total += math.comb(cap - 1, k) * (-1) ** k * (1 - tau ** e) / e
    return math.log(max(cap * total, math.exp(LOG_ZERO)))


def random_selection_logprob(masked: torch.Tensor, commit: torch.Tensor, rule: SelectionRule,
                             expected: torch.Tensor | None = None, impossible: float = LOG_ZERO) -> torch.Tensor:
    """Random remasking: the model-free selection log-term per row (module docstring). masked, commit [n, Lb] bool,
    expected [n] (the fixed schedule's k; None = the step's count) -> [n] float64; 0 for a row that committed
    nothing, `impossible` for a count the schedule does not allow."""
    m, c = masked.sum(-1), commit.sum(-1)  # [n]
    if rule.threshold is None:
        ok = c == expected if expected is not None else torch.ones_like(c, dtype=torch.bool)  # [n]
        return torch.where(ok, torch.where(c > 0, -_log_comb(m, c), 0.0), impossible)
    else:
        tau, cap = rule.threshold, rule.max_commit
        vals = []
        for mi, ci in zip(m.tolist(), c.tolist(), strict=True):
            if ci == 0:
                vals.append(0.0)
            elif cap is not None and ci == cap and cap >= 2:
                vals.append(_capped_uniform_log_prob(mi, ci, tau))
            elif cap == 1:
                vals.append(-math.log(mi))  # always the argmax of the uniforms: a uniform choice
            else:
                prob = (1 - tau) ** ci * tau ** (mi - ci) + (tau ** mi / mi if ci == 1 else 0.0)
                vals.append(math.log(max(prob, math.exp(LOG_ZERO))))
        out = torch.tensor(vals, dtype=torch.float64, device=masked.device)
    return torch.where(c > 0, out, 0.0)


def selection_logprob(logits: torch.Tensor | None, masked: torch.Tensor, commit: torch.Tensor, tokens: torch.Tensor,
                      rule: SelectionRule, expected: torch.Tensor | None = None,
                      impossible: float = LOG_ZERO) -> torch.Tensor:
    """The selection log-term of one step per row: logits [n, Lb, V] (unused, may be None, under random remasking),
    masked / commit [n, Lb] bool, tokens [n, Lb] long, expected [n] long (the fixed schedule's k at the step; None:
    the step's own count) -> [n] float64; `impossible` (LOG_ZERO or −inf) for an event of probability 0."""
    if rule.remasking == "random":
        return random_selection_logprob(masked, commit, rule, expected, impossible)
    log_q, p = proposal_and_confidence(logits, rule)
    return confidence_selection_logprob(log_q, p, masked, commit, tokens, rule, expected, impossible)
