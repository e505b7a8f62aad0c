"""SDAR's proposal, schedule, commit rule and the exact law of one denoising step (JetAstra/SDAR@c2041a8
`generate.py`); models/sdar/sampler.py samples from exactly these functions, so its record and a replay agree.

Proposal of a slot of the current block (generate.py:8-46, `sample_with_temperature_topk_topp`): logits ℓ [V] in
float32, the mask token removed (ℓ_mask = −inf: our one departure, as for LLaDA and Dream — the official code can
draw the mask id, which leaves the slot masked), then ℓ / T, then top_k (logits below the k-th largest: −inf), then
top_p (sorted softmax's cumulative sum > p: −inf, the crossing token kept), q = softmax. A token y ~ q is drawn and
its confidence is q(y), the probability under the *filtered* distribution. T = 0 is the official greedy setting,
T = 1 with top_k = 1 (the official code divides by T and has no T = 0): the argmax, with confidence 1.

Schedule (generate.py:49-54 `get_num_transfer_tokens`): n_s for s = 0 .. S − 1 splits the block length Lb evenly
over the S denoising steps, remainder first, the same for every block. A block's step s with m masked slots commits
(the official code, generate.py:148-196, with one change below):
  low_confidence_static   the n' = min(n_s, m) most confident masked slots (exact ties go to the lower slot, a stable
                          descending sort; torch.topk breaks them arbitrarily);
  low_confidence_dynamic  H = the masked slots with confidence > τ (strictly); H if |H| >= n_s, else the top-n';
  sequential              the leftmost n' masked slots.
The change: where n_s > m (a first block holding a prompt tail, or a dynamic step that left fewer masks than the next
quota) the official `topk(confidence, n_s)` also picks n_s − m slots whose confidence is −inf — prompt-tail or
already committed slots, in torch.topk's arbitrary order among ties — and overwrites them with this step's draws
(cur_x[transfer_index] = x0[transfer_index]). We commit the m masked slots only: the same commit set and forward
count, and no prompt or committed token ever changes.

The law of a step (the probability that the step commits exactly C ⊆ M with tokens y_C; every slot of M draws
independently from its own q): Π_{j∈C} q_j(y_j) × the selection term, computed here:
  static      the top-n' set: LLaDA's top-k term (likelihood/selection.py `confidence_selection_logprob`) with the
              confidence measure = q: every uncommitted draw ranks below the least confident committed one
              (ties allowed only after its last position);
  dynamic     P(C = H, |H| >= n_s) + P(C = top-n', |H| < n_s): the first is Π_{u∈M∖C} P(q_u(Y) <= τ) when
              |C| >= n_s and every c_j > τ; the second sums over how many uncommitted draws rank below C yet exceed
              τ (fewer than n_s − |{j ∈ C: c_j > τ}|), a Poisson-binomial count computed exactly;
  sequential  1 if C is the leftmost n' masked slots, else 0.
An event the rule cannot produce (a count other than n', a committed slot that was not masked) has log-probability
`impossible` (LOG_ZERO by default; −inf for the exact law).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dllm_ais.config import SDAR_STRATEGIES
from dllm_ais.likelihood.selection import LOG_ZERO, SelectionRule, _log_floor, confidence_selection_logprob

STRATEGIES = SDAR_STRATEGIES
"""The commit rules of SDAR's `block_diffusion_generate` this package samples (its `entropy_bounded` branch reads
`transfer_index` before assigning it, generate.py:180-190, so it cannot run; it is not offered)."""


@dataclass(frozen=True)
class SDARRule:
    """How SDAR's sampler draws and commits at a step (a view of SDARSamplerConfig's fields)."""

    strategy: str
    """One of STRATEGIES."""
    temperature: float
    """T (0 = the official greedy setting: T = 1, top_k = 1)."""
    mask_token_id: int
    """The mask token (never proposed)."""
    top_k: int = 0
    """Top-k filter (0: off)."""
    top_p: float = 1.0
    """Nucleus filter p (1: off)."""
    threshold: float = 0.9
    """τ of low_confidence_dynamic."""

    @classmethod
    def of(cls, config, mask_token_id: int) -> SDARRule:
        """The rule of an SDARSamplerConfig (models/sdar/sampler.py)."""
        return cls(config.strategy, config.temperature, mask_token_id, config.top_k, config.top_p, config.threshold)


def transfer_counts(block_length: int, steps: int) -> list[int]:
    """n_s, s = 0 .. steps − 1: the block split evenly, remainder first (generate.py:49-54)."""
    base, rem = divmod(block_length, steps)
    return [base + (s < rem) for s in range(steps)]


def filter_logits(logits: torch.Tensor, rule: SDARRule) -> torch.Tensor:
    """The filtered logits [..., V] float32 (module docstring): mask removed, / T, top_k, then top_p. Which tokens
    are dropped is decided on detached values; the result is differentiable through the kept logits."""
    x = logits.float().index_fill(-1, torch.tensor([rule.mask_token_id], device=logits.device), -torch.inf)
    top_k, temperature = (1, 1.0) if rule.temperature == 0 else (rule.top_k, rule.temperature)
    if temperature != 1.0:
        x = x / temperature
    if top_k > 0:
        kth = torch.topk(x.detach(), min(top_k, x.shape[-1]), dim=-1).values[..., -1:]
        x = x.masked_fill(x.detach() < kth, -torch.inf)
    if rule.top_p < 1.0:
        sorted_x, order = torch.sort(x.detach(), descending=True)
        drop = torch.softmax(sorted_x, dim=-1).cumsum(-1) > rule.top_p  # [..., V] in sorted order
        drop[..., 1:] = drop[..., :-1].clone()  # keep the token that crosses p
        drop[..., 0] = False
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -torch.inf)
    return x


def proposal(logits: torch.Tensor, rule: SDARRule) -> torch.Tensor:
    """q [..., V] float32: softmax of `filter_logits` (what the sampler draws from and reads confidences off)."""
    return torch.softmax(filter_logits(logits, rule), dim=-1)


def proposal_logprob(logits: torch.Tensor, tokens: torch.Tensor, rule: SDARRule) -> torch.Tensor:
    """log q(token): logits [..., V], tokens [...] -> [...] float64 (differentiable through the logits)."""
    return torch.log_softmax(filter_logits(logits, rule).double(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


def _top(conf: torch.Tensor, masked: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k [n] most confident masked slots per row, exact ties to the lower slot: conf, masked [n, Lb] -> bool."""
    order = torch.sort(torch.where(masked, conf, -torch.inf), dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(conf.shape[-1], device=conf.device).expand_as(
        order))  # [n, Lb] rank of each slot
    return masked & (rank < k[:, None])


def commit_slots(conf: torch.Tensor, masked: torch.Tensor, quota: torch.Tensor, rule: SDARRule) -> torch.Tensor:
    """The slots a step commits (module docstring): conf [n, Lb] float32 confidences, masked [n, Lb] bool, quota
    [n] long the schedule's n_s -> [n, Lb] bool ⊆ masked."""
    k = torch.minimum(quota, masked.sum(-1))  # n' [n]
    if rule.strategy == "sequential":
        return masked & (masked.long().cumsum(-1) <= k[:, None])
    top = _top(conf, masked, k)
    if rule.strategy == "low_confidence_static":
        return top
    high = masked & (conf > rule.threshold)  # [n, Lb]
    return torch.where((high.sum(-1) >= quota)[:, None], high, top)


def _below_masses(log_q: torch.Tensor, q: torch.Tensor, c_min: torch.Tensor, tie_ok: torch.Tensor,
                  tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For every slot, the proposal mass of draws ranking below the committed set (q < c_min, or = c_min where
    tie_ok) split by the threshold: (mass above τ, mass at or below τ), each [n, Lb] float64."""
    b = c_min[:, None, None]
    below = (q < b) | ((q == b) & tie_ok[..., None])  # [n, Lb, V]
    mass = log_q.exp()
    hi = torch.where(below & (q > tau), mass, 0.0).sum(-1)
    lo = torch.where(below & (q <= tau), mass, 0.0).sum(-1)
    return hi, lo


def _logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.logaddexp, with a zero gradient (torch's is NaN) where both are −inf: the value is −inf there."""
    dead = torch.isneginf(a) & torch.isneginf(b)
    return torch.where(dead, -torch.inf, torch.logaddexp(torch.where(dead, 0.0, a), torch.where(dead, 0.0, b)))


def _logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """torch.logsumexp over `dim`, with a zero gradient (torch's is NaN) where every term is −inf."""
    dead = torch.isneginf(x).all(dim, keepdim=True)
    out = torch.logsumexp(torch.where(dead, 0.0, x), dim=dim, keepdim=True)
    return torch.where(dead, -torch.inf, out).squeeze(dim)


def _count_below(log_hi: torch.Tensor, log_lo: torch.Tensor, rest: torch.Tensor, limit: torch.Tensor
                 ) -> torch.Tensor:
    """log P(every slot of `rest` ranks below C and fewer than `limit` of them exceed τ): a Poisson-binomial over the
    slots, each above τ w.p. e^log_hi and below w.p. e^log_lo (they may not sum to 1: the rest of the mass ranks
    above C). log_hi, log_lo [n, Lb], rest [n, Lb] bool, limit [n] long -> [n] float64 (−inf where limit <= 0)."""
    n, Lb = rest.shape
    neg = torch.full((n, Lb + 1), -torch.inf, dtype=torch.float64, device=rest.device)
    coef = neg.clone()
    coef[:, 0] = 0.0  # log of the polynomial's coefficients: [n, k] = log P(k of the slots so far above τ)
    for u in range(Lb):
        shifted = torch.cat([neg[:, :1], coef[:, :-1]], dim=1)  # one more above τ
        step = _logaddexp(coef + log_lo[:, u:u + 1], shifted + log_hi[:, u:u + 1])
        coef = torch.where(rest[:, u:u + 1], step, coef)
    k = torch.arange(Lb + 1, device=rest.device)[None, :]
    return _logsumexp(torch.where(k < limit[:, None], coef, -torch.inf), dim=-1)


def _dynamic_logprob(log_q: torch.Tensor, q: torch.Tensor, masked: torch.Tensor, commit: torch.Tensor,
                     tokens: torch.Tensor, quota: torch.Tensor, tau: float, impossible: float) -> torch.Tensor:
    """low_confidence_dynamic's selection log-term per row (module docstring) -> [n] float64. q [n, Lb, V] float32:
    every comparison is the sampler's (float32 confidences against τ as a float32 scalar, as torch compares them)."""
    n, Lb = masked.shape
    conf = q.gather(-1, tokens.clamp_min(0)[..., None]).squeeze(-1)  # [n, Lb]
    count, m = commit.sum(-1), masked.sum(-1)
    rest = masked & ~commit
    # (a) C = H with |H| >= n_s: every committed draw above τ, every other at or below it
    at_most_tau = torch.where(q <= tau, log_q.exp(), 0.0).sum(-1)  # [n, Lb]
    ok_a = (count >= quota) & torch.where(commit, conf > tau, True).all(-1)
    log_a = torch.where(rest, _log_floor(at_most_tau, -math.inf), 0.0).sum(-1)
    log_a = torch.where(ok_a, log_a, -torch.inf)
    # (b) C = the top-n' with |H| < n_s: the others rank below C, fewer than n_s − |C ∩ H| of them above τ
    c_min = torch.where(commit, conf, torch.inf).min(-1).values  # [n]
    pos = torch.arange(Lb, device=masked.device).expand(n, -1)
    last_min = torch.where(commit & (conf == c_min[:, None]), pos, -1).max(-1).values
    hi, lo = _below_masses(log_q, q, c_min, pos > last_min[:, None], tau)
    limit = quota - torch.where(commit, conf > tau, False).sum(-1)
    log_b = _count_below(_log_floor(hi, -math.inf), _log_floor(lo, -math.inf), rest, limit)
    log_b = torch.where(count == torch.minimum(quota, m), log_b, -torch.inf)
    total = _logaddexp(log_a, log_b)
    return torch.where(total > (LOG_ZERO if impossible == LOG_ZERO else -math.inf), total,
                       torch.full_like(total, impossible))


def selection_logprob(logits: torch.Tensor, masked: torch.Tensor, commit: torch.Tensor, tokens: torch.Tensor,
                      quota: torch.Tensor, rule: SDARRule, impossible: float = LOG_ZERO) -> torch.Tensor:
    """The selection log-term of one SDAR step per row: logits [n, Lb, V] of the block, masked / commit [n, Lb]
    bool (masked before the step, committed at it), tokens [n, Lb] long (the committed tokens; anything elsewhere),
    quota [n] long (the schedule's n_s) -> [n] float64; `impossible` for an event the rule cannot produce.
    Differentiable through the logits (the indicators are piecewise constant)."""
    if bool((commit & ~masked).any()):
        bad = (commit & ~masked).any(-1)
    else:
        bad = torch.zeros(masked.shape[0], dtype=torch.bool, device=masked.device)
    k = torch.minimum(quota, masked.sum(-1))
    if rule.strategy == "sequential":
        ok = (commit == commit_slots(torch.zeros(masked.shape, device=masked.device), masked, quota, rule)).all(-1)
        out = torch.where(ok, 0.0, impossible).double()
    else:
        filtered = filter_logits(logits, rule)
        q = torch.softmax(filtered.detach(), dim=-1)  # [n, Lb, V] float32: the sampler's comparisons
        log_q = torch.log_softmax(filtered.double(), dim=-1)
        if rule.strategy == "low_confidence_static":
            flat = SelectionRule("low_confidence", 1.0, rule.mask_token_id)
            out = confidence_selection_logprob(log_q, q.double(), masked, commit, tokens, flat, expected=k,
                                               impossible=impossible)
        else:
            out = _dynamic_logprob(log_q, q, masked, commit, tokens, quota, rule.threshold, impossible)
    return torch.where(bad, torch.full_like(out, impossible), out)
