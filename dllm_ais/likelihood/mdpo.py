"""MDPO's per-step token likelihood (Masked Diffusion Policy Optimization; autonomousvision/mdpo@e6ae439, DARE's
`mdpo` port yjyddq/DARE@83ae8a3): the rollout's own intermediate canvases x_t, every position x_t masks scored,
each weighted by λ_t = L / (#masked(x_t) + 1e-4) and by the sampler's confidence.

What it scores (`draw_mdpo`, one `PolicyDraw` per batch and logp seed):
- canvases: the rollout's recorded x_t (`Rollout.commit_step`: x_t shows the tokens committed before step t, every
  other completion position masked, the post-EOS tail included — `likelihood/replay.py::canvases`). A sequence's
  candidates are its distinct canvases that still mask a counted token: x_t for each step t at which the row
  committed something and some counted token has commit_step >= t (a step that committed nothing repeats the next
  one's canvas). K = `num_canvases` of them are drawn uniformly without replacement per sequence (all when there
  are fewer; MDPO trains on sample_train_steps = 16 of its steps).
- scored: the counted positions x_t masks (MDPO scores every masked position, the post-EOS tail included; we never
  score post-EOS positions), the target being the completion's token y_j.
- weight of log p(y_j | x_t): λ_t · c_j / K_b, with λ_t = L / (#masked(x_t) + 1e-4) (MDPO's code: L the completion
  width, #masked over the whole completion, tail included; DARE clamps the count at 1 instead of adding 1e-4),
  c_j = exp(Rollout.logp_rollout[j]) the probability the sampler committed y_j with (MDPO's confidence; weight 1
  without `confidence`) and K_b the canvases drawn for that sequence (their mean: its expectation over the draw is
  the mean over all the sequence's candidate canvases).

Per-token terms Σ_k weight · log p(y_j | x_{t_k}) ([B, L], `mask_draws.token_terms`) enter GRPO's per-token ratio.
Rows: one forward row per drawn canvas (≤ K per sequence). Ratio level: token.

Where we differ from MDPO's code (docs/likelihoods.md, "MDPO and d-TreeRPO"): its target at x_t is the step's own
proposal x̂0_t (a full-canvas sample, discarded where not committed) and its confidence that proposal's probability;
our sampler computes logits for the current block only and keeps just the committed tokens, so the target is the
final y_j and the confidence is y_j's at its commit step (the same at that step). Its log-probs are tempered
(logits / T; DARE's port does not temper) — ours are untempered, as every mask-draw likelihood here. Its steps are
the top-K by |step advantage| from intermediate rewards; with one advantage per sequence every step ties, so ours
are drawn at random.
"""

from __future__ import annotations

import torch

from dllm_ais.likelihood.inputs import as_generator, check_num_draws
from dllm_ais.likelihood.mask_draws import PolicyDraw

MDPO_COUNT_EPS = 1e-4
"""MDPO's code: λ_t = max_completion_length / (#masked + 1e-4)."""


def recorded_canvas(commit_step: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """[B, K, L] bool: the positions canvas x_{steps[b, k]} masks — not committed before that step (never-committed
    positions, commit_step −1, included). commit_step [B, L] long, steps [B, K] long."""
    cs = commit_step[:, None, :]
    return (cs < 0) | (cs >= steps[..., None])


def candidate_steps(commit_step: torch.Tensor, counted: torch.Tensor) -> list[torch.Tensor]:
    """Per sequence, the steps of its distinct canvases that still mask a counted token (module doc): B sorted
    tensors [S_b]."""
    out = []
    for b in range(commit_step.shape[0]):
        cs = commit_step[b]
        steps = torch.unique(cs[cs >= 0])  # [S] the steps at which the row committed something
        last = cs[counted[b] & (cs >= 0)].max() if bool((counted[b] & (cs >= 0)).any()) else cs.new_tensor(-1)
        out.append(steps[steps <= last])
    return out


def mdpo_lambda(hidden: torch.Tensor, gen_length: int) -> torch.Tensor:
    """[..., K] float64 λ_t = L / (#masked + 1e-4) of canvases hidden [..., K, L] (MDPO's code)."""
    return gen_length / (hidden.sum(-1).double() + MDPO_COUNT_EPS)


def draw_mdpo(commit_step: torch.Tensor, completion_mask: torch.Tensor, num_canvases: int | None,
              generator: torch.Generator | int, confidence: torch.Tensor | None = None) -> PolicyDraw:
    """MDPO's draw over the rollout's canvases (module doc). commit_step, completion_mask [B, L]; confidence [B, L]
    the per-token weight c_j (exp(logp_rollout)) or None (weight 1); num_canvases K (None = every candidate)."""
    if num_canvases is not None:
        check_num_draws(num_canvases)
    g = as_generator(generator)
    counted = completion_mask.bool()
    B, L = commit_step.shape
    chosen = []
    for steps in candidate_steps(commit_step, counted):
        S = steps.numel()
        if num_canvases is not None and num_canvases < S:
            pick = torch.randperm(S, generator=g, device=g.device)[:num_canvases].sort().values
            steps = steps[pick.to(steps.device)]
        chosen.append(steps)
    K = max([1] + [s.numel() for s in chosen])
    dev = commit_step.device
    step = torch.full((B, K), -1, dtype=torch.long, device=dev)  # −1: a padding draw (scores nothing)
    for b, s in enumerate(chosen):
        step[b, :s.numel()] = s
    used = step >= 0  # [B, K]
    hidden = recorded_canvas(commit_step, step) & used[..., None]  # [B, K, L]
    mask = hidden & counted[:, None, :]
    lam = mdpo_lambda(hidden, L)  # [B, K]
    per_row = used.sum(-1, keepdim=True).clamp_min(1).double()  # [B, 1] K_b
    c = torch.ones(B, L, dtype=torch.float64, device=dev) if confidence is None else confidence.double()
    weight = torch.where(mask, (lam / per_row)[..., None] * c[:, None, :], 0.0)
    level = hidden.sum(-1).double() / L  # the canvas's masked fraction
    return PolicyDraw(mask, weight, None, level, hidden)
