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

Selection log-terms of one step (the probability that exactly the committed set C of the masked set M moved):
- origin: |C| log p_move + |M \\ C| log(1 − p_move).
- topk_margin / entropy, alg_temp = 0: the confidences do not depend on the drawn tokens: 0 if C is the top-k set
  under the tie rule, else `LOG_ZERO` (the same indicator as LLaDA's top-k term with a confidence flat over V).
- maskgit_plus, alg_temp = 0: LLaDA's low-confidence top-k term (likelihood/selection.py) with q = p: every
  uncommitted draw less confident than the least confident committed token (ties after it only).
- topk_margin / entropy, alg_temp > 0: P(C first in the exponential race) = Σ_{A ⊆ C} (−1)^|A| R / (R + w_A),
  w = exp((c − max c) / alg_temp), R = Σ_{M \\ C} w (exact; |C| ≤ MAX_RACE_SET).
- Fast-dLLM's refresh commit of a block's first position is forced: 0. Threshold τ (Fast-dLLM, maskgit_plus
  confidences): LLaDA's threshold term with q = p.
maskgit_plus with alg_temp > 0 at T > 0 mixes the race over the uncommitted draws: no closed form, refused.
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


def origin_selection_logprob(masked: torch.Tensor, commit: torch.Tensor, p_move: float) -> torch.Tensor:
    """origin: masked, commit [n, Lb] bool -> [n] float64, |C| log p + |M \\ C| log(1 − p) (LOG_ZERO floor)."""
    c, rest = commit.sum(-1).double(), (masked & ~commit).sum(-1).double()
    lp = torch.tensor(p_move, dtype=torch.float64)
    return torch.where(c > 0, c * _log_floor(lp), 0.0) + torch.where(rest > 0, rest * _log_floor(1 - lp), 0.0)


def race_selection_logprob(confidence: torch.Tensor, masked: torch.Tensor, commit: torch.Tensor,
                           alg_temp: float) -> torch.Tensor:
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
        out.append(math.log(total) if total > math.exp(LOG_ZERO) else LOG_ZERO)
    return torch.tensor(out, dtype=torch.float64, device=confidence.device)


def dream_selection_logprob(logits: torch.Tensor | None, masked: torch.Tensor, commit: torch.Tensor,
                            tokens: torch.Tensor, rule: DreamRule, p_move: float | None = None) -> torch.Tensor:
    """The selection log-term of one Dream step per row (module docstring).

    logits [n, Lb, V] the step's shifted logits (unused by origin), masked / commit [n, Lb] bool (commit ⊆ masked),
    tokens [n, Lb] long (the committed tokens; anything elsewhere), p_move: origin's move probability -> [n] float64.
    """
    if rule.alg == "origin":
        return origin_selection_logprob(masked, commit, p_move)
    filtered = filter_logits(logits, rule)
    probs = torch.softmax(filtered.detach(), dim=-1)  # [n, Lb, V] float32: the sampler's comparisons
    log_q = torch.log_softmax(filtered.double(), dim=-1)
    if rule.threshold is not None or rule.alg == "maskgit_plus":
        if rule.alg_temp > 0 and rule.threshold is None and rule.temperature > 0:
            raise ValueError("maskgit_plus with alg_temp > 0 at T > 0 has no closed-form selection term; use "
                             "alg_temp 0, T = 0 or another alg.")
        if rule.alg_temp > 0 and rule.threshold is None:  # T = 0: deterministic confidences
            conf = token_confidence(probs, tokens.clamp_min(0), rule.alg)
            return race_selection_logprob(conf, masked, commit, rule.alg_temp)
        llada_rule = SelectionRule("low_confidence", max(rule.temperature, 1e-6), rule.mask_token_id, rule.threshold)
        return confidence_selection_logprob(log_q, probs.double(), masked, commit, tokens, llada_rule)
    conf = token_confidence(probs, tokens.clamp_min(0), rule.alg)  # [n, Lb], independent of the tokens
    if rule.alg_temp > 0:
        return race_selection_logprob(conf, masked, commit, rule.alg_temp)
    flat = conf.double()[..., None].expand_as(log_q)  # the confidence, whatever the draw
    llada_rule = SelectionRule("low_confidence", 1.0, rule.mask_token_id)
    return confidence_selection_logprob(log_q, flat, masked, commit, tokens, llada_rule)


def proposal_logprob(logits: torch.Tensor, tokens: torch.Tensor, rule: DreamRule) -> torch.Tensor:
    """log q(token) under Dream's filtered proposal: logits [..., V], tokens [...] -> [...] float64 (the untempered
    filtered softmax at T = 0, which has no density of its own)."""
    filtered = filter_logits(logits, rule)
    return torch.log_softmax(filtered.double(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
