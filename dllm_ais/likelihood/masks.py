"""Mask draws for the Monte-Carlo ELBO of a masked diffusion model: pure functions of an explicit torch.Generator.

A draw is a boolean mask over the completion (True = replaced by the mask token and scored) with a level and a weight:

- mask-count (LLaDA's low-variance form): l ~ U{1..L_i}, then a uniformly random l-subset of the L_i counted tokens;
  level = l / L_i, weight = L_i / l.
- uniform-t: t ~ U(0, 1], each counted token masked independently with probability t; level = t, weight = 1 / t.

Both are unbiased for the same ELBO. Let g(l) = E[Σ_{j∈M} log p(y_j | y_{M^c}, x) | |M| = l] (g(0) = 0); given |M| = l,
M is a uniform l-subset under both schemes. Mask-count: E = Σ_{l=1..L} (1/L) · (L/l) · g(l) = Σ_l g(l) / l. Uniform-t:
E = Σ_l g(l) ∫_0^1 (1/t) C(L,l) t^l (1-t)^(L-l) dt = Σ_l g(l) C(L,l) B(l, L-l+1) = Σ_l g(l) C(L,l) (l-1)! (L-l)! / L!
= Σ_{l≥1} g(l) / l. The same. (Uniform-t has infinite variance, though: exactly one token j is masked with
probability L·t·(1-t)^(L-1), and then X = log p_j / t, so E[X²] ≥ ∫ L·t·(1-t)^(L-1)·(log p_j)²/t² dt = ∞. The mean is
fine, but sample variances keep growing like log n; the mask-count form has no such tail. Coupling tames it for ℓ:
the common 1/t multiplies a log-prob difference.)

Stratification (default): the K levels of one sequence come from one uniform offset v and evenly spaced points,
w_k = (v + k/K) mod 1, so each w_k is exactly U[0, 1) (unbiased) while together they cover [0, 1) evenly.
l_k = floor(w_k · L_i) + 1 (exactly uniform on 1..L_i; K = L_i hits every count once), t_k = 1 - w_k ∈ (0, 1].
(LLaDA's reference rounds k0 + k·L/K with round-half-to-even, which makes l_k slightly non-uniform when k·L/K ends
in .5; flooring a continuous offset avoids that.) Plain draws: w_k i.i.d. U[0, 1).

Antithetic draws: K/2 base draws followed by their complements over the counted tokens (draw K/2 + j complements
draw j). Mask-count: the complement of an l-mask is an (L_i - l)-mask, weight L_i/(L_i - l); the full mask (l = L_i)
has an empty complement, so it is paired with itself instead: the complement count L_i - l (0 read as L_i) is again
uniform on 1..L_i and its subset uniform, so each half is unbiased. Uniform-t: the complement is a t' = 1 - t mask
(each token masked independently w.p. 1 - t), weight 1/(1 - t); it may be empty.

Draws with an empty mask (uniform-t; sequences with no counted token) get weight 0 and contribute exactly 0.
Random numbers are drawn on the generator's device and then moved, so a CPU generator gives the same masks anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_ais.likelihood.inputs import as_generator, check_num_draws


@dataclass(frozen=True)
class MaskDraws:
    """K mask draws per sequence over the completion, shared verbatim by every model they are evaluated on."""

    mask: torch.Tensor
    """[B, K, L] bool: True = completion position replaced by the mask token and scored. Only counted tokens."""
    level: torch.Tensor
    """[B, K] float64: masked fraction l / L_i (mask-count) or masking probability t (uniform-t)."""
    weight: torch.Tensor
    """[B, K] float64: importance weight 1 / level (L_i / l or 1 / t); 0 where the mask is empty."""

    @property
    def num_draws(self) -> int:
        return self.mask.shape[1]


def stratified_uniforms(batch: int, num_draws: int, generator: torch.Generator, stratified: bool) -> torch.Tensor:
    """[B, K] float64 in [0, 1): (v_b + k/K) mod 1 with one v_b ~ U[0, 1) per row, or i.i.d. when not stratified."""
    if not stratified:
        return torch.rand(batch, num_draws, generator=generator, device=generator.device, dtype=torch.float64)
    v = torch.rand(batch, 1, generator=generator, device=generator.device, dtype=torch.float64)  # [B, 1]
    k = torch.arange(num_draws, device=generator.device, dtype=torch.float64) / num_draws  # [K]
    return (v + k) % 1.0


def _weights(mask: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """[B, K] 1/level where the mask is non-empty, else 0 (never inf or NaN)."""
    nonempty = mask.any(-1)  # [B, K]
    return torch.where(nonempty, 1.0 / level.clamp_min(torch.finfo(torch.float64).tiny), 0.0)


def draw_mask_count(counted: torch.Tensor, num_draws: int, generator: torch.Generator, stratified: bool = True,
                    antithetic: bool = False) -> MaskDraws:
    """Mask-count draws: l ∈ {1..L_i}, then a uniform l-subset of the counted tokens. counted [B, L] bool."""
    B, L = counted.shape
    K0 = num_draws // 2 if antithetic else num_draws
    n = counted.sum(-1).to(generator.device)  # [B] counted tokens L_i
    cnt = counted.to(generator.device)
    w = stratified_uniforms(B, K0, generator, stratified)  # [B, K0]
    l = (w * n[:, None]).floor().long() + 1  # [B, K0] in 1..L_i (1 when L_i = 0: masks nothing below)
    keys = torch.rand(B, K0, L, generator=generator, device=generator.device, dtype=torch.float64)  # [B, K0, L]
    keys = keys.masked_fill(~cnt[:, None, :], 2.0)  # uncounted positions rank last
    rank = keys.argsort(-1).argsort(-1)  # [B, K0, L] rank of each position in a uniform random order
    mask = (rank < l[..., None]) & cnt[:, None, :]  # [B, K0, L]
    if antithetic:
        full = l >= n[:, None]  # [B, K0] full masks pair with themselves
        comp = torch.where(full[..., None], mask, cnt[:, None, :] & ~mask)  # [B, K0, L]
        mask = torch.cat([mask, comp], dim=1)  # [B, K, L]
        l = torch.cat([l, torch.where(full, l, n[:, None] - l)], dim=1)  # [B, K]
    level = l.double() / n[:, None].clamp_min(1).double()  # [B, K]
    dev = counted.device
    return MaskDraws(mask=mask.to(dev), level=level.to(dev), weight=_weights(mask, level).to(dev))


def draw_uniform_t(counted: torch.Tensor, num_draws: int, generator: torch.Generator, stratified: bool = True,
                   antithetic: bool = False) -> MaskDraws:
    """Uniform-t draws: t ∈ (0, 1], each counted token masked independently w.p. t. counted [B, L] bool."""
    B, L = counted.shape
    K0 = num_draws // 2 if antithetic else num_draws
    cnt = counted.to(generator.device)
    t = 1.0 - stratified_uniforms(B, K0, generator, stratified)  # [B, K0] in (0, 1]
    u = torch.rand(B, K0, L, generator=generator, device=generator.device, dtype=torch.float64)  # [B, K0, L]
    mask = (u < t[..., None]) & cnt[:, None, :]  # [B, K0, L]
    if antithetic:
        mask = torch.cat([mask, cnt[:, None, :] & ~mask], dim=1)  # complement: masked w.p. 1 - t
        t = torch.cat([t, 1.0 - t], dim=1)  # [B, K]
    dev = counted.device
    return MaskDraws(mask=mask.to(dev), level=t.to(dev), weight=_weights(mask, t).to(dev))


MASK_SCHEMES = {"mask_count": draw_mask_count, "uniform_t": draw_uniform_t}
"""Mask-drawing variants by name."""


def draw_masks(completion_mask: torch.Tensor, num_draws: int, generator: torch.Generator | int, *,
               scheme: str = "mask_count", stratified: bool = True, antithetic: bool = False) -> MaskDraws:
    """K mask draws per sequence over the counted completion tokens (completion_mask [B, L] bool) -> MaskDraws.

    scheme: "mask_count" (LLaDA: l ~ U{1..L_i}, weight L_i/l) or "uniform_t" (t ~ U(0,1], weight 1/t).
    stratified: evenly spaced levels with one random offset per sequence. antithetic: K/2 draws + complements.
    """
    if scheme not in MASK_SCHEMES:
        raise ValueError(f"scheme={scheme!r}: use one of {', '.join(MASK_SCHEMES)}.")
    if completion_mask.dim() != 2:
        raise ValueError(f"completion_mask {tuple(completion_mask.shape)} must be [B, L].")
    check_num_draws(num_draws, antithetic)
    return MASK_SCHEMES[scheme](completion_mask.bool(), num_draws, as_generator(generator), stratified, antithetic)
