"""The SFT loss's value: its mean over seeds is the exact expected loss, computed by enumerating every mask of a
short completion and integrating t exactly — E[loss] = (1 / L) Σ_S w(|S|) Σ_{j ∈ S} −log p(y_j | S masked), with
w(k) = ∫ p^(k−1) (1 − p)^(L−k) dt, p = (1 − ε) t + ε — which for ε → 0 is −ELBO / L (the 1/p_mask weight makes the
SFT loss LLaDA's ELBO bound; without it the mean is far smaller)."""

from __future__ import annotations

import itertools
import math

import torch
from test_likelihood_elbo import MASK, exact_elbo

from dllm_ais.models.tiny import init_weights, tiny_model
from dllm_ais.train.sft import sft_loss

EPS = 1e-3
"""sft_loss's default ε."""


def _model():
    m = tiny_model(seed=3, dtype=torch.float64, d_model=32, n_heads=2, n_layers=1, mlp_hidden_size=64)
    return init_weights(m, torch.Generator().manual_seed(3), std=0.3).eval()


def _weight(k: int, L: int, eps: float) -> float:
    """∫_0^1 p^(k−1) (1 − p)^(L−k) dt with p = (1 − ε) t + ε, by the binomial expansion of (1 − p)^(L−k)."""
    m = L - k
    total = sum(math.comb(m, i) * (-1) ** i * (1 - eps ** (k + i)) / (k + i) for i in range(m + 1))
    return total / (1 - eps)


@torch.no_grad()
def exact_sft_loss(model, prompt_ids, prompt_mask, completion_ids, eps: float = EPS) -> float:
    """E over t and the masks of sft_loss for one sequence ([1, P], [1, L]), by enumeration."""
    P, L = prompt_ids.shape[1], completion_ids.shape[1]
    attn = torch.cat([prompt_mask[0], torch.ones(L, dtype=torch.bool)])
    total = 0.0
    for k in range(1, L + 1):
        for S in itertools.combinations(range(L), k):
            x = torch.cat([prompt_ids[0], completion_ids[0]])
            x[[P + j for j in S]] = MASK
            lp = model(x[None], attn[None]).logits[0].double().log_softmax(-1)
            total += _weight(k, L, eps) * -sum(lp[P + j, completion_ids[0, j]].item() for j in S)
    return total / L


def test_sft_loss_mean_is_the_exact_expected_loss():
    model = _model()
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 100, (1, 3), generator=g)
    prompt_mask = torch.tensor([[False, True, True]])
    completion_ids = torch.randint(5, 100, (1, 5), generator=g)
    exact = exact_sft_loss(model, prompt_ids, prompt_mask, completion_ids)
    with torch.no_grad():  # ε → 0: the exact loss is −ELBO / L (ELBO enumerated as in test_likelihood_elbo.py)
        elbo = float(exact_elbo(model, prompt_ids, prompt_mask, completion_ids, torch.ones(1, 5, dtype=torch.bool)))
    assert abs(exact_sft_loss(model, prompt_ids, prompt_mask, completion_ids, eps=0.0) + elbo / 5) < 1e-9
    R, seeds = 512, 16
    batch = [t.expand(R, -1) for t in (prompt_ids, prompt_mask, completion_ids)]
    with torch.no_grad():
        losses = torch.tensor([float(sft_loss(model, *batch, MASK, torch.Generator().manual_seed(s)))
                               for s in range(seeds)], dtype=torch.float64)
    se = float(losses.std() / seeds ** 0.5)
    z = (float(losses.mean()) - exact) / se
    print(f"SFT loss: mean {float(losses.mean()):.4f} ± {se:.4f}, exact {exact:.4f} (z = {z:.2f})")
    assert se > 1e-4 and abs(z) < 4, (float(losses.mean()), exact, se)
