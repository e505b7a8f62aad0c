"""The RL objective by enumeration, its exact gradient, and the one-step improvement of an update.

J(θ) = (1/n) Σ_x Σ_y π_θ(y | x) r(x, y), with π_θ the BF16 exact sampler (exact_sampler.py) — the quantity GRPO is
meant to raise. Its gradient ∇J comes from autograd through the enumeration. Under the low-confidence rule J is only
piecewise smooth: P(y | x) jumps where two positions' confidences cross (the sampler commits the larger), so a finite
step of parameter length ≳ 1e-3 already crosses some of these (measured on the testbed: ΔJ = ⟨∇J, Δθ⟩ to 1 % up to
1e-4, jumps of ~2e-3 beyond). Hence two readings of "the one-step improvement" of an update Δθ:
- first order: ⟨∇J, Δθ⟩ (exact, the smooth part; linear in Δθ, so E over batches is exact for SGD);
- finite: J(θ + Δθ) − J(θ) by enumeration (includes the jumps).
Updates: SGD Δθ = η ĝ (ĝ the ascent direction, exact_surrogates.py), and one AdamW step as the trainer takes it (the
study presets: weight decay 0, gradient clipped to norm 1, then Adam); from a fresh optimiser state its update is
lr · ĝ / (|ĝ| + ε) per coordinate (bias-corrected first step): its length no longer depends on ‖ĝ‖, only on the
signs — which is what "does a longer gradient survive Adam" asks. Parameters are flat vectors in
`model.parameters()` order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters


def objective(distribution: Callable[[torch.nn.Module], torch.Tensor], model, rewards: torch.Tensor) -> float:
    """J = mean over prompts of Σ_y P(y | x) r(x, y); distribution(model) -> [n, Y], rewards [n, Y]."""
    with torch.no_grad():
        return float((distribution(model) * rewards).sum(-1).mean())


def objective_gradient(distribution: Callable[[torch.nn.Module], torch.Tensor], model, rewards: torch.Tensor
                       ) -> torch.Tensor:
    """∇_θ J, flat [P] float64, by autograd through the enumeration (model's parameters, in order)."""
    params = list(model.parameters())
    with torch.enable_grad():
        J = (distribution(model) * rewards).sum(-1).mean()
        grads = torch.autograd.grad(J, params, allow_unused=True)
    return torch.cat([torch.zeros_like(p).reshape(-1) if g is None else g.reshape(-1)
                      for g, p in zip(grads, params, strict=True)]).double()


@torch.no_grad()
def objective_after(distribution, model, rewards: torch.Tensor, step: torch.Tensor) -> float:
    """J at θ + step (flat [P]); the model's parameters are restored afterwards."""
    theta = parameters_to_vector(model.parameters()).detach().clone()
    vector_to_parameters(theta + step.to(theta.dtype), model.parameters())
    try:
        return objective(distribution, model, rewards)
    finally:
        vector_to_parameters(theta, model.parameters())


def adam_step(ascent: torch.Tensor, lr: float, max_grad_norm: float = 1.0, betas=(0.9, 0.999), eps: float = 1e-8
              ) -> torch.Tensor:
    """The parameter change of the first AdamW step (weight decay 0) on the loss gradient −ascent, after clipping the
    gradient to `max_grad_norm` (0: no clipping), computed by torch.optim.AdamW itself. ascent [P] -> [P]."""
    p = torch.zeros_like(ascent, dtype=torch.float64, requires_grad=True)
    p.grad = -ascent.detach().double().clone()
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_([p], max_grad_norm)
    opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=0.0)
    opt.step()
    return p.detach().clone()
