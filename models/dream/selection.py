"""Dream's proposal, confidences, schedule and selection terms (Dream-org `generation_utils.py` `_sample` /
`sample_tokens`; models/dream/sampler.py is the sampler, this module the law it samples from, so the sampler's record
and a replay of the same canvases agree by construction).

Proposal of a masked position, from its (shifted) logits ℓ [V]: the mask token removed (ℓ_mask = −inf, the one
departure from the official code, which can draw the mask id and then leaves the position masked, as LLaDA's sampler
departs), then ℓ / T (T > 0), then top_p (sort descending, drop every token after the one whose cumulative
probability first exceeds p: that crossing token is kept; dropped logits = the dtype minimum), then top_k (drop
logits below the k-th largest), in that order, in float32 (the official code works in the logits' dtype). p =
softmax of the filtered logits: the token is drawn from p (argmax at T = 0) and the confidences are read from it:
  maskgit_plus  p(x0) of the drawn token (max p at T = 0)       topk_margin  top-1 − top-2 of p
  entropy       Σ_v p_v log(p_v + 1e-10) (negative entropy)    origin       none: each mask moves w.p. 1 − s/t

Schedule (`diffusion_generate`): timesteps linspace(1, eps, steps + 1); step i < steps − 1 commits
k = int(mean masks per row · (1 − t_{i+1}/t_i)) (truncated, one k for the batch), the last step every mask left.
Selection of the k positions: the k largest confidences (alg_temp = 0; exact ties go to the lower position, a stable
descending sort — the official torch.topk breaks ties arbitrarily), or k draws without replacement from
softmax(confidence / alg_temp) (alg_temp > 0: Plackett–Luce, torch.multinomial's law).

Fast-dLLM's uncached threshold (`generation_utils.py` alg "confidence_threshold", `ThresholdQuota`): one block,
L / steps tokens per step plus what earlier steps left; a step ranks its masked positions by maskgit_plus confidence,
takes the top quota, and keeps the most confident one and every other with confidence >= τ; the rest carry over. A
shortfall at the last step adds one step (no fresh quota) and carries it there, until a last step commits its quota.

Selection log-terms of one step (the probability that exactly the committed set C of the masked set M moved):
- origin: |C| log p_move + |M \\ C| log(1 − p_move).
- topk_margin / entropy, alg_temp = 0: the confidences do not depend on the drawn tokens: 0 if C is the top-k set
  under the tie rule, else `LOG_ZERO` (the same indicator as LLaDA's top-k term with a confidence flat over V).
- maskgit_plus, alg_temp = 0: LLaDA's low-confidence top-k term (likelihood/selection.py) with q = p: every
  uncommitted draw less confident than the least confident committed token (ties after it only).
- topk_margin / entropy, alg_temp > 0: P(C first in the exponential race) = Σ_{A ⊆ C} (−1)^|A| R / (R + w_A),
  w = exp((c − max c) / alg_temp), R = Σ_{M \\ C} w (exact; |C| ≤ MAX_RACE_SET).
- Fast-dLLM's refresh commit of a block's first position is forced: 0. Threshold τ (Fast-dLLM, maskgit_plus
  confidences): LLaDA's threshold term with q = p; the uncached threshold's quota is LLaDA's cap N (|C| = quota:
  the top quota, bound c_min; |C| < quota: every other < τ), a count above the quota or none while masks remain
  has probability 0.
maskgit_plus with alg_temp > 0 at T > 0 mixes the race over the uncommitted draws: no closed form, refused.
A step whose count is not the schedule's (`expected`) has probability 0: `impossible` (LOG_ZERO, the training
likelihoods' floor, or −inf for the exact path law).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from dllm_ais.likelihood.selection import LOG_ZERO, SelectionRule, _log_floor, confidence_selection_logprob
from dllm_ais.models.dream.checkpoint import DREAM_ALGORITHMS

ALGORITHMS = DREAM_ALGORITHMS
"""Dream's `alg` values (`confidence_threshold` is Fast-dLLM's threshold decoding: `threshold` here)."""
MAX_RACE_SET = 16
"""Largest committed set whose alg_temp > 0 selection term is computed (2^|C| inclusion–exclusion terms)."""
ENTROPY_EPS = 1e-10
"""Dream's ε in Σ p log(p + ε)."""


@dataclass(frozen=True)
class DreamRule:
    """How Dream's sampler draws and selects at a step (a view of DreamSamplerConfig's fields)."""

    alg: str
    """One of ALGORITHMS."""
    temperature: float
    """Proposal temperature T (0 = argmax)."""
    mask_token_id: int
    """The mask token (never proposed)."""
    top_p: float | None = None
    """Nucleus filter p (None or >= 1: off)."""
    top_k: int | None = None
    """Top-k filter (None: off)."""
    alg_temp: float = 0.0
    """0 = the k most confident positions; > 0 = k draws from softmax(confidence / alg_temp)."""
    threshold: float | None = None
    """Fast-dLLM threshold τ (maskgit_plus confidences); None = Dream's schedule."""

    @classmethod
    def of(cls, config, mask_token_id: int) -> DreamRule:
        """The rule of a DreamSamplerConfig (models/dream/sampler.py)."""
        return cls(config.alg, config.temperature, mask_token_id, config.top_p, config.top_k, config.alg_temp or 0.0,
                   config.threshold)


def filter_logits(logits: torch.Tensor, rule: DreamRule) -> torch.Tensor:
    """Dream's filtered logits [..., V] float32 (module docstring): mask removed, / T, top_p, top_k. Which tokens
    are dropped is decided on detached values; the result is differentiable through the kept logits."""
    x = logits.float().index_fill(-1, torch.tensor([rule.mask_token_id], device=logits.device), -torch.inf)
    if rule.temperature > 0:
        x = x / rule.temperature
    low = torch.finfo(x.dtype).min
    if rule.top_p is not None and rule.top_p < 1:
        sorted_x, order = torch.sort(x.detach(), descending=True)
        drop = torch.softmax(sorted_x, dim=-1).cumsum(-1) > rule.top_p  # [..., V] in sorted order
        drop[..., 1:] = drop[..., :-1].clone()  # keep the token that crosses p
        drop[..., 0] = False
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), low)
    if rule.top_k is not None:
        kth = torch.topk(x.detach(), min(rule.top_k, x.shape[-1]), dim=-1).values[..., -1:]
        x = x.masked_fill(x.detach() < kth, low)
    return x


def token_confidence(probs: torch.Tensor, tokens: torch.Tensor, alg: str) -> torch.Tensor:
    """probs [..., V] (softmax of `filter_logits`), tokens [...] -> the confidence [...] of each position (float32
    as the official code; maskgit_plus reads the drawn token's probability)."""
    if alg == "maskgit_plus":
        return probs.gather(-1, tokens[..., None]).squeeze(-1)
    if alg == "topk_margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if alg == "entropy":
        return (probs * torch.log(probs + ENTROPY_EPS)).sum(-1)
    raise ValueError(f"alg={alg!r} has no confidence: use one of maskgit_plus, topk_margin, entropy.")


def timesteps(steps: int, eps: float, device=None) -> torch.Tensor:
    """Dream's timesteps [steps + 1] float32: linspace(1, eps, steps + 1)."""
    return torch.linspace(1, eps, steps + 1, device=device)


def scheduled_counts(num_masked: torch.Tensor, i: torch.Tensor, steps: int, eps: float) -> torch.Tensor:
    """`scheduled_count` per row: num_masked [n] (masks of the row's canvas or block), i [n] (step index of the
    schedule) -> k [n] long, the same float32 arithmetic (one row's mean is its own count)."""
    ts = timesteps(steps, eps, num_masked.device)
    j = i.clamp(max=steps - 1)
    ratio = 1 - ts[j + 1] / ts[j]  # [n] float32
    k = (num_masked.float() * ratio).long()  # truncation toward zero, as int()
    return torch.where(i >= steps - 1, num_masked.long(), k)


def move_probabilities(i: torch.Tensor, steps: int, eps: float) -> torch.Tensor:
    """`move_probability` per row: i [n] -> [n] float64 (the float32 value, 1 at the last step)."""
    ts = timesteps(steps, eps, i.device)
    j = i.clamp(max=max(steps - 2, 0))
    return torch.where(i >= steps - 1, 1.0, (1 - ts[j + 1] / ts[j]).double())


class ThresholdQuota:
    """Fast-dLLM's uncached threshold bookkeeping per row (generation_utils.py `_sample`, alg "confidence_threshold"):
    `quota` [B] of the current step, `update(count)` after it; `done` [B] once a last step committed its quota;
    `end` [B] the row's forward count. Shared by the sampler and the replay, so both count alike."""

    def __init__(self, batch: int, length: int, steps: int, device=None):
        if length % steps:
            raise ValueError(f"threshold decoding without a cache needs gen_length ({length}) divisible by steps "
                             f"({steps}) (Fast-dLLM's assertion); change one.")
        self.fresh = torch.full((batch,), length // steps, dtype=torch.long, device=device)  # per-step quota
        self.left = torch.zeros(batch, dtype=torch.long, device=device)  # carried over
        self.end = torch.full((batch,), steps, dtype=torch.long, device=device)  # steps (grows on a shortfall)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.t = 0

    def quota(self) -> torch.Tensor:
        """[B] long: the current step's quota (0 for a finished row)."""
        return torch.where(self.done, 0, self.fresh + self.left)

    def update(self, count: torch.Tensor) -> None:
        """count [B]: tokens each row committed at the current step."""
        short = self.quota() - count  # [B] carried to the next step
        last = (self.end == self.t + 1) & ~self.done
        extend = last & (short > 0)  # a shortfall at the last step: one more step, no fresh quota
        self.end = torch.where(extend, self.end + 1, self.end)
        self.fresh = torch.where(extend, 0, self.fresh)
        self.left = torch.where(self.done, 0, short)
        self.done = self.done | (last & (short == 0))
        self.t += 1


def threshold_quotas(commit_step: torch.Tensor, length: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay the bookkeeping of an uncached threshold rollout: commit_step [B, L] -> (quota [B, T] long of every step
    t < T = the longest row's end, end [B] long: each row's forward count)."""
    B = commit_step.shape[0]
    q = ThresholdQuota(B, length, steps, commit_step.device)
    horizon = max(int(commit_step.max()) + 1, steps) if commit_step.numel() else steps
    quotas = []
    for t in range(horizon):
        quotas.append(q.quota())
        q.update((commit_step == t).sum(-1))
    return torch.stack(quotas, 1), q.end


def scheduled_count(masked: torch.Tensor, i: int, steps: int, eps: float) -> int:
    """k of step i (one for the batch): masked [B, N] bool -> int(mean masks per row · (1 − s/t)), all at the last
    step. Computed with the official float32 ops (truncation makes the rounding visible)."""
    ts = timesteps(steps, eps, masked.device)
    num = masked.sum() / masked.shape[0]
    return int(num * (1 - ts[i + 1] / ts[i])) if i < steps - 1 else int(num)


def move_probability(i: int, steps: int, eps: float) -> float:
    """origin's probability that a masked position moves at step i (float32 1 − s/t; 1 at the last step)."""
    if i >= steps - 1:
        return 1.0
    ts = timesteps(steps, eps)
    return float(1 - ts[i + 1] / ts[i])


def origin_selection_logprob(masked: torch.Tensor, commit: torch.Tensor, p_move: float | torch.Tensor,
                             impossible: float = LOG_ZERO) -> torch.Tensor:
    """origin: masked, commit [n, Lb] bool, p_move a float or [n] -> [n] float64, |C| log p + |M \\ C| log(1 − p)
    (`impossible` where a factor has probability 0)."""
    c, rest = commit.sum(-1).double(), (masked & ~commit).sum(-1).double()
    lp = torch.as_tensor(p_move, dtype=torch.float64, device=masked.device)
    return (torch.where(c > 0, c * _log_floor(lp, impossible), 0.0)
            + torch.where(rest > 0, rest * _log_floor(1 - lp, impossible), 0.0))


def race_selection_logprob(confidence: torch.Tensor, masked: torch.Tensor, commit: torch.Tensor,
                           alg_temp: float, impossible: float = LOG_ZERO) -> torch.Tensor:
    """alg_temp > 0: log P(the committed set comes first when |C| positions are drawn without replacement from
    softmax(confidence / alg_temp) over the masked ones). confidence, masked, commit [n, Lb] -> [n] float64."""
    out = []
    for conf, m, c in zip(confidence.double(), masked, commit, strict=True):
        if not bool(c.any()):
            out.append(0.0)
            continue
        z = torch.where(m, conf / alg_temp, -torch.inf)
        w = torch.exp(z - z.max())
        chosen = w[c].tolist()
        if len(chosen) > MAX_RACE_SET:
            raise ValueError(f"alg_temp > 0 selection term of {len(chosen)} positions at once: at most "
                             f"{MAX_RACE_SET}; use more steps or alg_temp 0.")
        rest = float(w[m & ~c].sum())
        if rest == 0.0:
            out.append(0.0)
            continue
        total = 0.0
        for r in range(len(chosen) + 1):
            for sub in itertools.combinations(chosen, r):
                total += (-1) ** r * rest / (rest + sum(sub))
        out.append(math.log(total) if total > (math.exp(LOG_ZERO) if impossible == LOG_ZERO else 0.0)
                   else impossible)
    return torch.tensor(out, dtype=torch.float64, device=confidence.device)


def dream_selection_logprob(logits: torch.Tensor | None, masked: torch.Tensor, commit: torch.Tensor,
                            tokens: torch.Tensor, rule: DreamRule, p_move: float | torch.Tensor | None = None,
                            expected: torch.Tensor | None = None, impossible: float = LOG_ZERO) -> torch.Tensor:
    """The selection log-term of one Dream step per row (module docstring).

    logits [n, Lb, V] the step's shifted logits (unused by origin), masked / commit [n, Lb] bool (commit ⊆ masked),
    tokens [n, Lb] long (the committed tokens; anything elsewhere), p_move: origin's move probability (a float or
    [n]), expected [n] long: the schedule's k of the step (top-k rules) or the uncached threshold's quota (None: the
    step's own count; the cached threshold has no quota) -> [n] float64; `impossible` for probability 0.
    """
    if rule.alg == "origin":
        return origin_selection_logprob(masked, commit, p_move, impossible)
    count = commit.sum(-1)
    filtered = filter_logits(logits, rule)
    probs = torch.softmax(filtered.detach(), dim=-1)  # [n, Lb, V] float32: the sampler's comparisons
    log_q = torch.log_softmax(filtered.double(), dim=-1)
    if rule.threshold is not None:
        llada_rule = SelectionRule("low_confidence", max(rule.temperature, 1e-6), rule.mask_token_id, rule.threshold)
        out = confidence_selection_logprob(log_q, probs.double(), masked, commit, tokens, llada_rule,
                                           impossible=impossible, cap=expected)
        stuck = (count == 0) & masked.any(-1)  # the most confident masked position always commits
        over = count > expected if expected is not None else torch.zeros_like(stuck)
        return torch.where(stuck | over, impossible, out)
    if rule.alg == "maskgit_plus":
        if rule.alg_temp > 0 and rule.temperature > 0:
            raise ValueError("maskgit_plus with alg_temp > 0 at T > 0 has no closed-form selection term; use "
                             "alg_temp 0, T = 0 or another alg.")
        if rule.alg_temp == 0:
            llada_rule = SelectionRule("low_confidence", max(rule.temperature, 1e-6), rule.mask_token_id)
            return confidence_selection_logprob(log_q, probs.double(), masked, commit, tokens, llada_rule, expected,
                                                impossible)
    conf = (probs.max(-1).values if rule.alg == "maskgit_plus"  # T = 0: every position draws its argmax
            else token_confidence(probs, tokens.clamp_min(0), rule.alg))  # [n, Lb], independent of the draw
    if rule.alg_temp > 0:
        out = race_selection_logprob(conf, masked, commit, rule.alg_temp, impossible)
        return out if expected is None else torch.where(count == expected, out, impossible)
    flat = conf.double()[..., None].expand_as(log_q)  # the confidence, whatever the draw
    llada_rule = SelectionRule("low_confidence", 1.0, rule.mask_token_id)
    return confidence_selection_logprob(log_q, flat, masked, commit, tokens, llada_rule, expected, impossible)


def proposal_logprob(logits: torch.Tensor, tokens: torch.Tensor, rule: DreamRule) -> torch.Tensor:
    """log q(token) under Dream's filtered proposal: logits [..., V], tokens [...] -> [...] float64 (the untempered
    filtered softmax at T = 0, which has no density of its own)."""
    filtered = filter_logits(logits, rule)
    return torch.log_softmax(filtered.double(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
