"""The shared mask-draw layer of the field's policy likelihoods: one draw object, the draws, and its scoring.

A `PolicyDraw` holds K masked canvases per sequence and one weight per (draw, token): the estimate of sequence i is
    Σ_k Σ_j weight[i, k, j] · log p_θ(y_j | canvas k of sequence i)
and its per-token terms (`token_terms`, [B, L]) are the inner sums over k. π_θ, π_old and the reference are scored
on the SAME draw (common random numbers), so at the first iteration the ratio is exactly 1.

Draws (every one an explicit torch.Generator; random numbers are drawn on the generator's device, then moved):
- `draw_stratified` (VRPO / BGPO / LLaDA): K counts x_k = floor(w_k · L_i) + 1, w_k = (v + k/K) mod 1 with one
  offset v per sequence (each x_k exactly uniform on 1..L_i), a uniform x_k-subset, weight (L_i / x_k) / K. Unbiased
  for the ELBO Σ_x g(x)/x (g(x) = E[Σ_{j∈M} log p | |M| = x]).
- `draw_antithetic` (ESPO): K/2 counts x ∈ {0..L_i} with weight (L_i + 1)/x, and their complements (count L_i − x,
  weight (L_i + 1)/(L_i − x)); the K/2 counts of the G rows of a group are stratified together from one offset per
  group (ESPO stratifies its counts across the rows it scores at once). Each draw is marginally uniform on 0..L_i:
  E = Σ_{x=1..L} (1/(L+1)) · ((L+1)/x) · g(x) = Σ_x g(x)/x, the same ELBO; x = 0 (or its complement) scores nothing.
- `draw_quadrature` (GDPO): the 2-point Gauss–Legendre rule on t ∈ [0, 1] (t = ½ ∓ 1/(2√3) ≈ 0.211 / 0.789, weights
  ½), |M| = max(1, round(L_i · t)), weight (½ / t) / (K/2). Deterministic levels: its expectation is the quadrature
  Σ_n ½ · (1/t_n) · g(|M_n|), not the ELBO (a bias that shrinks as the integrand is smoother).
- `draw_coupled` (DiffuCoder coupled-GRPO), K = 3: all counted tokens masked (weight ½), a Bernoulli(t) mask with
  t ~ U(t_min, t_max) drawn once per batch (weight ½/t), its complement over the counted tokens (weight ½/(1 − t)):
  per token ½[log p_full + log p_partial / t_eff], DiffuCoder's per-token log-prob.
- `draw_spg` (SPG): block-random masks, see `spg.py`.
- `draw_mdpo` (MDPO) and `draw_dtreerpo` (d-TreeRPO): the rollout's own recorded canvases (`mdpo.py`,
  `dtreerpo.py`); their draws carry `hidden`, the canvas's masked positions (the post-EOS tail included).

Post-EOS positions (completion_mask False) are never scored (weight 0); a draw never masks them except where it
shows a recorded canvas (`hidden`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from dllm_ais.likelihood.inputs import as_generator, canvas, check_num_draws, check_sequences, max_length_of
from dllm_ais.likelihood.logprobs import token_logprobs
from dllm_ais.models.shift import logits_view

QUADRATURE_NODES = (0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0))
"""GDPO's 2-point Gauss–Legendre nodes on [0, 1] (weights ½ each)."""


@dataclass(frozen=True)
class PolicyDraw:
    """K masked canvases per sequence and the weight of each (draw, token) log-prob in the estimate."""

    mask: torch.Tensor
    """[B, K, L] bool: completion positions replaced by the mask token in draw k (a subset of completion_mask)."""
    weight: torch.Tensor
    """[B, K, L] float64: weight of log p(y_j | canvas k) in the estimate; 0 where token j is not scored."""
    prompt_masked: torch.Tensor | None = None
    """[B, K, P] bool: prompt positions masked in draw k (SPG), or None (the prompt is never masked)."""
    level: torch.Tensor | None = None
    """[B, K] float64: the draw's noise level (t, or count / L_i); informational."""
    hidden: torch.Tensor | None = None
    """[B, K, L] bool: every completion position canvas k shows as the mask token, when the canvas is one the sampler
    recorded (MDPO, d-TreeRPO: the positions not yet committed, the post-EOS tail included; ⊇ mask); the other
    positions show the completion's tokens. None: canvas k masks `mask` (and the tail by `mask_tail`)."""

    @property
    def num_draws(self) -> int:
        return self.mask.shape[1]

    def rows(self, idx: torch.Tensor | slice) -> PolicyDraw:
        """The same draw restricted to rows idx (a micro-batch): θ on a micro-batch sees the batch's masks."""
        pm = None if self.prompt_masked is None else self.prompt_masked[idx]
        lv = None if self.level is None else self.level[idx]
        hid = None if self.hidden is None else self.hidden[idx]
        return PolicyDraw(self.mask[idx], self.weight[idx], pm, lv, hid)


def policy_draw(mask: torch.Tensor, weight: torch.Tensor, completion_mask: torch.Tensor,
                prompt_masked: torch.Tensor | None = None) -> PolicyDraw:
    """A draw from explicit masks (e.g. an anchor's): mask [B, K, L] bool, weight [B, K, L] (or [B, K], per draw).

    The weight is zeroed outside mask & completion_mask, so post-EOS positions never score."""
    mask = mask.bool() & completion_mask.bool()[:, None, :]
    w = weight.double()
    if w.dim() == 2:
        w = w[..., None].expand(mask.shape)
    return PolicyDraw(mask, torch.where(mask, w, 0.0), prompt_masked)


def _uniform_subsets(counted: torch.Tensor, counts: torch.Tensor, g: torch.Tensor | torch.Generator) -> torch.Tensor:
    """[B, K, L] bool: for each (b, k) a uniformly random counts[b, k]-subset of counted[b] (counted [B, L] bool)."""
    B, L = counted.shape
    K = counts.shape[1]
    keys = torch.rand(B, K, L, generator=g, device=g.device, dtype=torch.float64)
    keys = keys.masked_fill(~counted[:, None, :], 2.0)  # uncounted positions rank last
    rank = keys.argsort(-1).argsort(-1)  # [B, K, L]
    return (rank < counts[..., None]) & counted[:, None, :]


def _finish(mask, weight, level, device) -> PolicyDraw:
    weight = torch.where(mask, weight, 0.0)
    return PolicyDraw(mask.to(device), weight.to(device), None, None if level is None else level.to(device))


def draw_stratified(completion_mask: torch.Tensor, num_draws: int, generator: torch.Generator | int) -> PolicyDraw:
    """VRPO / BGPO: K stratified counts over 1..L_i, uniform subsets, weight (L_i / x) / K. completion_mask [B, L]."""
    check_num_draws(num_draws)
    g = as_generator(generator)
    cnt = completion_mask.bool().to(g.device)
    B, _ = cnt.shape
    n = cnt.sum(-1)  # [B]
    v = torch.rand(B, 1, generator=g, device=g.device, dtype=torch.float64)
    w = (v + torch.arange(num_draws, device=g.device, dtype=torch.float64) / num_draws) % 1.0  # [B, K]
    x = (w * n[:, None]).floor().long() + 1  # [B, K] in 1..L_i
    mask = _uniform_subsets(cnt, x, g)
    weight = (n[:, None].double() / x.double() / num_draws)[..., None].expand(mask.shape)
    return _finish(mask, weight, x.double() / n[:, None].clamp_min(1).double(), completion_mask.device)


def draw_antithetic(completion_mask: torch.Tensor, num_draws: int, generator: torch.Generator | int,
                    group_size: int = 1) -> PolicyDraw:
    """ESPO: K/2 counts x ∈ {0..L_i} (weight (L_i+1)/x) + complements; counts stratified over each group's rows.

    completion_mask [B, L] with B a multiple of group_size (consecutive rows form a group)."""
    check_num_draws(num_draws, antithetic=True)
    g = as_generator(generator)
    cnt = completion_mask.bool().to(g.device)
    B, _ = cnt.shape
    if group_size < 1 or B % group_size:
        raise ValueError(f"group_size={group_size} must divide the batch ({B} rows).")
    K0, n = num_draws // 2, cnt.sum(-1)  # [B]
    cells = group_size * K0  # stratified cells per group: (row in group, draw)
    v = torch.rand(B // group_size, 1, generator=g, device=g.device, dtype=torch.float64)  # one offset per group
    w = (v + torch.arange(cells, device=g.device, dtype=torch.float64) / cells) % 1.0  # [B/G, G·K0]
    w = w.view(B, K0)  # row r of group q takes cells r·K0 .. r·K0 + K0 - 1
    x = (w * (n[:, None] + 1)).floor().long()  # [B, K0] uniform on 0..L_i
    base = _uniform_subsets(cnt, x, g)  # [B, K0, L]
    mask = torch.cat([base, cnt[:, None, :] & ~base], dim=1)  # [B, K, L]
    counts = torch.cat([x, n[:, None] - x], dim=1)  # [B, K]
    weight = torch.where(counts > 0, (n[:, None] + 1).double() / counts.clamp_min(1).double(), 0.0) / num_draws
    level = counts.double() / (n[:, None] + 1).double()
    return _finish(mask, weight[..., None].expand(mask.shape), level, completion_mask.device)


def draw_quadrature(completion_mask: torch.Tensor, num_draws: int, generator: torch.Generator | int) -> PolicyDraw:
    """GDPO: K/2 repeats of the nodes t = 0.211 / 0.789 (Gauss weights ½), |M| = max(1, round(L_i t)), weight
    (½ / t) / (K/2). One generator (one seed) draws the subsets of the whole batch. K must be even."""
    if isinstance(num_draws, int) and not isinstance(num_draws, bool) and num_draws % 2:
        raise ValueError(f"elbo_draws={num_draws}: the quadrature scheme needs an even K (K/2 repeats of its 2 "
                         "nodes); pass an even --elbo-draws.")
    check_num_draws(num_draws)
    g = as_generator(generator)
    cnt = completion_mask.bool().to(g.device)
    B, _ = cnt.shape
    n = cnt.sum(-1)  # [B]
    t = torch.tensor(QUADRATURE_NODES * (num_draws // 2), dtype=torch.float64, device=g.device)  # [K]
    x = torch.round(n[:, None].double() * t[None, :]).long().clamp_min(1)  # [B, K] (round half to even)
    x = torch.minimum(x, n[:, None])  # L_i = 0: masks nothing
    mask = _uniform_subsets(cnt, x, g)
    weight = (0.5 / t / (num_draws // 2))[None, :, None].expand(mask.shape)
    return _finish(mask, weight, t[None, :].expand(B, -1), completion_mask.device)


def draw_coupled(completion_mask: torch.Tensor, generator: torch.Generator | int, t_min: float = 0.2,
                 t_max: float = 0.8) -> PolicyDraw:
    """DiffuCoder's three canvases (K = 3): full mask (½), Bernoulli(t) mask (½/t), its complement (½/(1 − t));
    t ~ U(t_min, t_max) once per batch."""
    if not 0.0 < t_min <= t_max < 1.0:
        raise ValueError(f"coupled t range ({t_min}, {t_max}) must satisfy 0 < t_min <= t_max < 1.")
    g = as_generator(generator)
    cnt = completion_mask.bool().to(g.device)
    t = t_min + (t_max - t_min) * torch.rand((), generator=g, device=g.device, dtype=torch.float64)
    u = torch.rand(cnt.shape, generator=g, device=g.device, dtype=torch.float64)  # [B, L]
    part = cnt & (u < t)
    mask = torch.stack([cnt, part, cnt & ~part], dim=1)  # [B, 3, L]
    weight = torch.stack([0.5 * torch.ones((), dtype=torch.float64), 0.5 / t, 0.5 / (1.0 - t)])  # [3]
    level = torch.stack([torch.ones((), dtype=torch.float64), t, 1.0 - t])
    B = cnt.shape[0]
    return _finish(mask, weight[None, :, None].expand(mask.shape), level[None].expand(B, -1),
                   completion_mask.device)


def token_terms(draw: PolicyDraw, draw_logp: torch.Tensor) -> torch.Tensor:
    """Per-token terms Σ_k weight[b, k, j] · draw_logp[b, k, j] -> [B, L] (0 where nothing is scored).

    draw_logp [B, K, L]: log p(y_j | canvas k) at the positions draw k masks (values elsewhere are ignored)."""
    if draw_logp.shape != draw.mask.shape:
        raise ValueError(f"draw_logp {tuple(draw_logp.shape)} must match the draw's mask {tuple(draw.mask.shape)}.")
    lp = torch.where(draw.weight != 0, draw_logp, 0.0)  # a non-finite value off the scored set never leaks in
    return (draw.weight.to(lp.dtype) * lp).sum(1)


def _rows_logp(model, inp: torch.Tensor, attn: torch.Tensor, m: torch.Tensor, targets: torch.Tensor, P: int
               ) -> torch.Tensor:
    """Rows of one draw: inp [n, T] (canvas, masks in place), m [n, L] bool masked completion positions, targets
    [n, L] -> [n, L] log p(y_j | canvas) at masked positions, 0 elsewhere. Only masked positions reach the LM head."""
    counts = m.sum(-1)  # [n]
    M = int(counts.max())
    pos = m.long().argsort(dim=-1, descending=True, stable=True)[:, :M]  # [n, M] masked positions first (distinct)
    valid = torch.arange(M, device=m.device)[None, :] < counts[:, None]  # [n, M]
    logits = logits_view(model)(input_ids=inp, attention_mask=attn, positions=pos + P).logits  # [n, M, V]
    lp = token_logprobs(logits, targets.gather(1, pos)).masked_fill(~valid, 0.0)  # [n, M]
    return torch.zeros(m.shape, dtype=lp.dtype, device=lp.device).scatter(1, pos, lp)  # [n, L]


def draw_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                  completion_mask: torch.Tensor, draw: PolicyDraw, *, mask_token_id: int, mask_tail: bool = True,
                  batch_size: int = 64) -> torch.Tensor:
    """log p(y_j | canvas k) at every position draw k masks -> [B, K, L] (0 elsewhere; float32, float64 for float64
    models). prompt_ids/prompt_mask [B, P] left-padded, completion_ids/completion_mask [B, L].

    One forward row per (sequence, draw) with a non-empty mask, `batch_size` rows per model call. mask_tail: post-EOS
    positions are shown as mask tokens (the sampler's blank canvas), else as themselves; never scored either way.
    A draw with `hidden` shows its recorded canvases instead (mask_tail is not read).
    Memory does not grow with K under autograd: each (draw, row chunk) is checkpointed — the forward keeps only its
    inputs, and backward recomputes one chunk at a time (ESPO's no-grad pass + per-draw replay)."""
    check_sequences(prompt_ids, prompt_mask, completion_ids, completion_mask, max_length_of(model))
    B, K, L = draw.mask.shape
    if (B, L) != tuple(completion_ids.shape):
        raise ValueError(f"draw.mask {tuple(draw.mask.shape)} must be [B, K, L] for completions "
                         f"{tuple(completion_ids.shape)}.")
    if (draw.mask & ~completion_mask.bool()[:, None, :]).any():
        raise ValueError("draw.mask masks post-EOS positions (outside completion_mask); draw it from the same mask.")
    if draw.hidden is not None and (draw.mask & ~draw.hidden).any():
        raise ValueError("draw.mask scores positions its canvas shows (outside draw.hidden): a canvas masks what it "
                         "scores.")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1.")
    P = prompt_ids.shape[1]
    recorded = draw.hidden is not None  # the sampler's canvases: the tail shows as recorded
    x, attn = canvas(prompt_ids, prompt_mask, completion_ids, completion_mask, mask_token_id,
                     mask_tail and not recorded)  # [B, T]
    grad = torch.is_grad_enabled()
    out: list[torch.Tensor] = []
    for k in range(K):
        m = draw.mask[:, k]  # [B, L]
        active = m.any(-1).nonzero().squeeze(-1)  # [A]
        parts = []
        for s in range(0, active.numel(), batch_size):
            rows = active[s:s + batch_size]
            inp = x[rows]  # [n, T] (a copy)
            shown_masked = draw.hidden[rows, k] if recorded else m[rows]  # [n, L]
            inp[:, P:] = torch.where(shown_masked, mask_token_id, inp[:, P:])
            if draw.prompt_masked is not None:
                pm = draw.prompt_masked[rows, k] & prompt_mask[rows].bool()
                inp[:, :P] = torch.where(pm, mask_token_id, inp[:, :P])
            args = (model, inp, attn[rows], m[rows], completion_ids[rows], P)
            parts.append((rows, checkpoint(_rows_logp, *args, use_reentrant=False) if grad else _rows_logp(*args)))
        dtype = parts[0][1].dtype if parts else torch.float32
        col = torch.zeros(B, L, dtype=dtype, device=completion_ids.device)
        for rows, lp in parts:
            col = col.index_put((rows,), lp)
        out.append(col)
    return torch.stack(out, dim=1)  # [B, K, L]
