"""SPG (Sandwiched Policy Gradient, arXiv 2510.09541): block-random masks, the ELBO for positive advantages and the
EUBO (or a mixture) for the others — as SPG's code computes them.

Draw (`draw_spg`, per sequence and draw): a completion block c among the n_b blocks holding counted tokens; the
counted tokens of earlier blocks and the real prompt tokens are masked independently w.p. p_mask_prompt (0.3); in
block c, x ~ U{1..m} of its m counted tokens form a uniform subset; counted tokens of later blocks are all masked.
Post-EOS positions are never masked nor scored. level = t̂ = (#masked counted tokens) / L_i.
The blocks of the K draws (`block_rule`):
- `permutation` (SPG's code, the default): the first K entries of a random permutation of all N = ⌈L / block⌉ blocks
  of the completion width, each taken modulo n_b. With n_b = N the K draws get K distinct blocks, a uniform random
  K-subset in random order; with n_b < N (an early EOS) blocks can repeat and, unless n_b divides N, the law is not
  uniform — as in SPG. SPG asserts K <= N; for K > N the draws continue with a fresh permutation (distinct within
  each run of N draws).
- `independent`: each draw's block uniform on the n_b blocks, independently.

- ELBO (SPG's code): mean over draws of the per-token MEAN of log p over the draw's masked counted tokens — no 1/t
  weight (the paper's ELBO carries 1/t; the code's per-token mean is what SPG trains with, and what we follow).
  As a draw weight: 1 / (#masked) / K, so `token_terms(draw, logp).sum(-1)` is this value.
- EUBO (β, SPG's code): per token a_j = mean_k [p_kj^β · m_kj / t̂_k]; then (1/β) · mean over tokens with a_j > 0
  of log a_j. Computed in log space (logsumexp) rather than from p^β, equal up to rounding.
- mixture (w): w · EUBO + (1 − w) · ELBO for the non-positive advantages.
The loss (no ratio, no clip, no KL) is `dllm_ais.rl.spg.spg_loss`.

Differences from SPG's code: none in law with `permutation` (its prompt mask also hits left padding, which ours never
masks: padding is never attended).
"""

from __future__ import annotations

import math

import torch

from dllm_ais.likelihood.inputs import as_generator, check_num_draws
from dllm_ais.likelihood.mask_draws import PolicyDraw, token_terms

SPG_BETA = 1.5
"""SPG's default EUBO exponent β."""


SPG_BLOCK_RULES = ("permutation", "independent")
"""How the K draws pick their blocks (module doc)."""


def _blocks(counted_blocks: torch.Tensor, num_blocks: int, K: int, g: torch.Generator, rule: str) -> torch.Tensor:
    """[B, K] long block index of each draw; counted_blocks [B] (n_b, 0 when nothing is counted), num_blocks N."""
    B = counted_blocks.shape[0]
    nb = counted_blocks.clamp_min(1)[:, None]  # [B, 1]
    if rule == "independent":
        u = torch.rand(B, K, generator=g, device=g.device, dtype=torch.float64)
        return (u * nb).floor().long()
    runs = -(-K // num_blocks)  # permutations needed (SPG: one, K <= N)
    keys = torch.rand(B, runs, num_blocks, generator=g, device=g.device, dtype=torch.float64)
    perm = keys.argsort(-1).reshape(B, runs * num_blocks)[:, :K]  # [B, K] uniform permutations, concatenated
    return perm % nb


def draw_spg(completion_mask: torch.Tensor, num_draws: int, generator: torch.Generator | int, block_length: int,
             prompt_mask: torch.Tensor | None = None, p_mask_prompt: float = 0.3,
             block_rule: str = "permutation") -> PolicyDraw:
    """SPG block-random draws. completion_mask [B, L] bool (a prefix per row), prompt_mask [B, P] bool or None;
    block_rule: `permutation` (SPG's) or `independent` (module doc)."""
    check_num_draws(num_draws)
    if block_length < 1:
        raise ValueError(f"spg block_length={block_length} must be >= 1.")
    if not 0.0 <= p_mask_prompt < 1.0:
        raise ValueError(f"p_mask_prompt={p_mask_prompt} must be in [0, 1).")
    if block_rule not in SPG_BLOCK_RULES:
        raise ValueError(f"spg block_rule={block_rule!r}: use one of {', '.join(SPG_BLOCK_RULES)}.")
    g = as_generator(generator)
    cnt = completion_mask.bool().to(g.device)
    B, L = cnt.shape
    K = num_draws
    n = cnt.sum(-1)  # [B]
    blocks = (n + block_length - 1) // block_length  # [B] blocks holding counted tokens
    c = _blocks(blocks, -(-L // block_length), K, g, block_rule)  # [B, K] (0 when no counted token)
    block_of = torch.arange(L, device=g.device) // block_length  # [L]
    in_c = (block_of[None, None, :] == c[..., None]) & cnt[:, None, :]  # [B, K, L]
    m = in_c.sum(-1)  # [B, K] counted tokens of block c
    v = torch.rand(B, K, generator=g, device=g.device, dtype=torch.float64)
    x = (v * m).floor().long() + 1  # [B, K] uniform on 1..m
    keys = torch.rand(B, K, L, generator=g, device=g.device, dtype=torch.float64).masked_fill(~in_c, 2.0)
    in_block = (keys.argsort(-1).argsort(-1) < x[..., None]) & in_c
    early = cnt[:, None, :] & (block_of[None, None, :] < c[..., None])
    early_masked = early & (torch.rand(B, K, L, generator=g, device=g.device, dtype=torch.float64) < p_mask_prompt)
    later = cnt[:, None, :] & (block_of[None, None, :] > c[..., None])
    mask = in_block | early_masked | later  # [B, K, L]
    prompt_masked = None
    if prompt_mask is not None:
        pu = torch.rand(B, K, prompt_mask.shape[1], generator=g, device=g.device, dtype=torch.float64)
        prompt_masked = (pu < p_mask_prompt) & prompt_mask.bool().to(g.device)[:, None, :]
        prompt_masked = prompt_masked.to(completion_mask.device)
    count = mask.sum(-1)  # [B, K]
    weight = torch.where(count > 0, 1.0 / count.clamp_min(1).double(), 0.0) / K
    level = count.double() / n[:, None].clamp_min(1).double()
    dev = completion_mask.device
    return PolicyDraw(mask.to(dev), torch.where(mask, weight[..., None], 0.0).to(dev),
                      prompt_masked, level.to(dev))


def spg_elbo(draw: PolicyDraw, draw_logp: torch.Tensor) -> torch.Tensor:
    """[B] SPG's ELBO: mean over draws of the per-token mean log p over the draw's masked counted tokens."""
    return token_terms(draw, draw_logp).sum(-1)


def spg_eubo(draw: PolicyDraw, draw_logp: torch.Tensor, beta: float = SPG_BETA) -> torch.Tensor:
    """[B] SPG's EUBO: (1/β) · mean_{j: a_j > 0} log a_j, a_j = mean_k p_kj^β · m_kj / t̂_k (t̂_k = draw.level)."""
    if not beta > 0:
        raise ValueError(f"spg beta={beta} must be > 0.")
    if draw.level is None:
        raise ValueError("spg_eubo needs draw.level (t̂ = masked fraction per draw): use draw_spg.")
    scored = draw.weight != 0  # [B, K, L] masked counted tokens
    K = draw.mask.shape[1]
    lp = torch.where(scored, draw_logp, 0.0)
    t_hat = draw.level.to(lp.dtype).clamp_min(torch.finfo(lp.dtype).tiny)[..., None]  # [B, K, 1]
    hit = scored.any(1)  # [B, L] a_j > 0
    # -inf for unscored draws of a token some draw scores; 0 in never-scored columns (dropped below) keeps the
    # logsumexp and its gradient finite
    log_terms = torch.where(scored, beta * lp - t_hat.log(), torch.where(hit[:, None, :], -torch.inf, 0.0))
    log_a = torch.logsumexp(log_terms, dim=1) - math.log(K)  # [B, L]
    s = torch.where(hit, log_a, 0.0).sum(-1)
    return s / hit.sum(-1).clamp_min(1).to(s.dtype) / beta


def spg_sequence_logp(draw: PolicyDraw, draw_logp: torch.Tensor, adv: torch.Tensor, beta: float = SPG_BETA,
                      mix: float | None = None) -> torch.Tensor:
    """[B] the bound SPG trains each sequence on: ELBO where adv > 0, else EUBO (mix=None) or
    mix · EUBO + (1 − mix) · ELBO."""
    if mix is not None and not 0.0 <= mix <= 1.0:
        raise ValueError(f"spg mix={mix} must be in [0, 1] (or None: the EUBO alone).")
    elbo = spg_elbo(draw, draw_logp)
    eubo = spg_eubo(draw, draw_logp, beta)
    neg = eubo if mix is None else mix * eubo + (1.0 - mix) * elbo
    return torch.where(adv.to(elbo.device) > 0, elbo, neg)
