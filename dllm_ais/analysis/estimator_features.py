"""Per-completion feature gradients of the estimator analysis (analysis/estimators.py): every policy likelihood's
gradient on a completion is a random linear combination of a few fixed gradient vectors ("features"), so its exact
moments follow from these vectors and the moments of the combination's coefficients (estimator_draws.py).

Completion y (L tokens) of prompt x; a mask set m ⊆ {0..L−1} (bitmask, non-empty), a position j ∈ m and a prompt
mask s ⊆ {0..P−1} (bitmask) name the canvas "x with s masked, y with m masked":
- `A` features (every mask-draw likelihood: ELBO schemes, coupled, SPG, d1's one-step): ∇ log p_θ(y_j | canvas)
  with p the full softmax (mask token included), as `likelihood/logprobs.token_logprobs` scores it; index (s, m, j).
- `T` features (trajectory replays, prompt unmasked): ∇ log q_θ(y_j | canvas) with q the sampler's proposal
  (softmax over the content tokens, mask removed, T = 1: `logprobs.proposal_logprobs`); index (m, j).
One forward per (prompt, s, partial canvas) and the logit Jacobian of its L·V logits (`is_grads_batched`) give them
all: ∇ log p(y_j) = (e_{y_j} − p_j)ᵀ ∂z_j/∂θ, so the gradient depends on y only through y_j and the canvas.
Shapes: n prompts, Y = V_c^L completions each, K = n Y (prompt-major, `exact_surrogates.completion_grid` order).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from dllm_ais.analysis.exact_testbed import all_sequences
from dllm_ais.models.shift import logits_view


def a_index(P: int, L: int) -> list[tuple[int, int, int]]:
    """The A features (s, m, j) in their column order: s over 2^P prompt masks, m over non-empty masks, j ∈ m."""
    return [(s, m, j) for s in range(2 ** P) for m in range(1, 2 ** L) for j in range(L) if m >> j & 1]


def t_index(L: int) -> list[tuple[int, int]]:
    """The T features (m, j) in their column order."""
    return [(m, j) for m in range(1, 2 ** L) for j in range(L) if m >> j & 1]


@dataclass(frozen=True)
class Features:
    """Feature gradients of one model (float32 vectors, float64 within-completion Grams)."""

    grad_a: torch.Tensor
    """[K, Q_A, P] float32: A feature gradients (`a_index` order)."""
    grad_t: torch.Tensor
    """[K, Q_T, P] float32: T feature gradients (`t_index` order)."""
    gram_a: torch.Tensor
    """[K, Q_A, Q_A] float64: within-completion Gram of the A features."""
    gram_t: torch.Tensor
    """[K, Q_T, Q_T] float64."""
    logp_a: torch.Tensor
    """[K, Q_A] float64: the A features' log-probabilities themselves (SPG's EUBO weights depend on them)."""

    def family(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(gradients, Gram) of family `A` or `T`."""
        return (self.grad_a, self.gram_a) if name == "A" else (self.grad_t, self.gram_t)


def _canvas_ids(prompt: torch.Tensor, vocab: int, L: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (prompt mask s, partial canvas c) row for one prompt [P]: ids [2^P · (V_c+1)^L, P + L] and the canvas
    digits [(V_c+1)^L, L] (0 = masked, d = token d − 1)."""
    P = prompt.shape[0]
    digits = all_sequences(vocab + 1, L)  # [C, L]
    comp = torch.where(digits == 0, mask_id, digits - 1)
    rows = []
    for s in range(2 ** P):
        pm = torch.tensor([s >> i & 1 for i in range(P)], dtype=torch.bool)
        x = torch.where(pm, mask_id, prompt)
        rows.append(torch.cat([x[None].expand(comp.shape[0], P), comp], -1))
    return torch.cat(rows), digits


def _jacobian_rows(model, ids: torch.Tensor, P: int, chunk: int, params: list
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits z [R, L, V] (float64, detached; Dream's through its shifted view) and their Jacobian
    [R, L, V, P_params] float32 with respect to `params`, `chunk` rows a call."""
    view = logits_view(model)
    zs, jac = [], []
    for s in range(0, ids.shape[0], chunk):
        z = view(input_ids=ids[s:s + chunk], positions=slice(P, None)).logits  # [c, L, V]
        eye = torch.eye(z.numel(), dtype=z.dtype).view(-1, *z.shape)
        grads = torch.autograd.grad(z, params, grad_outputs=eye, is_grads_batched=True)
        flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1).float()  # [c L V, P]
        jac.append(flat.view(*z.shape, -1))
        zs.append(z.detach().double())
    return torch.cat(zs), torch.cat(jac)


def feature_gradients(model, prompts: torch.Tensor, vocab: int, gen_length: int, chunk: int = 16,
                      head_only: bool = False) -> Features:
    """Every completion's A and T feature gradients under `model` (copied to float64 for the Jacobian) with respect
    to every parameter (in `model.parameters()` order), or to the LM head's weight alone (`head_only`: the
    coordinates rung 2 measures, analysis/mc_head.py)."""
    model = copy.deepcopy(model).double().eval()
    params = [model.get_output_embeddings().weight] if head_only else list(model.parameters())
    mask_id = model.config.mask_token_id
    n, P = prompts.shape
    L = gen_length
    ys = all_sequences(vocab, L)  # [Y, L]
    a_idx, t_idx = a_index(P, L), t_index(L)
    C = (vocab + 1) ** L
    powers = (vocab + 1) ** torch.arange(L)
    # canvas of (y, m): digit y_j + 1 outside m, 0 in m
    bits = torch.tensor([[m >> j & 1 for j in range(L)] for m in range(2 ** L)], dtype=torch.bool)  # [2^L, L]
    canvas_of = ((torch.where(bits[None], 0, ys[:, None] + 1)) * powers).sum(-1)  # [Y, 2^L]
    sa = torch.tensor([s for s, _, _ in a_idx])
    ma = torch.tensor([m for _, m, _ in a_idx])
    ja = torch.tensor([j for _, _, j in a_idx])
    mt = torch.tensor([m for m, _ in t_idx])
    jt = torch.tensor([j for _, j in t_idx])
    grad_a, grad_t, logp_a = [], [], []
    for x in range(n):
        ids, _ = _canvas_ids(prompts[x], vocab, L, mask_id)
        z, jac = _jacobian_rows(model, ids, P, chunk, params)  # [2^P C, L, V], [2^P C, L, V, Pp]
        V = z.shape[-1]
        p_full = z.softmax(-1)  # [R, L, V]
        q = torch.cat([z[..., :vocab].softmax(-1), torch.zeros_like(z[..., vocab:])], -1)  # proposal, mask removed
        eye = torch.eye(V, dtype=torch.float64)[:vocab]  # [V_c, V] targets (never the mask token)
        # D[r, j, v] = (e_v − p_rj)ᵀ ∂z_rj/∂θ: the gradient of log p(v | row r) at position j (A), same with q (T)
        d_a = torch.einsum("rjtv,rjvp->rjtp", (eye[None, None] - p_full[:, :, None]).float(), jac)  # [R, L, V_c, Pp]
        d_t = torch.einsum("rjtv,rjvp->rjtp", (eye[None, None] - q[:C, :, None]).float(), jac[:C])
        del jac
        row_a = sa[None] * C + canvas_of[:, ma]  # [Y, Q_A]
        col_a = ja[None].expand_as(row_a)
        tok_a = ys[:, ja]  # [Y, Q_A] target token of each feature
        grad_a.append(d_a[row_a, col_a, tok_a])  # [Y, Q_A, Pp]
        logp_a.append(p_full[row_a, col_a, tok_a].log())
        row_t = canvas_of[:, mt]  # [Y, Q_T] (s = 0: the first C rows)
        grad_t.append(d_t[row_t, jt[None].expand_as(row_t), ys[:, jt]])
        del d_a, d_t
    ga, gt = torch.cat(grad_a), torch.cat(grad_t)  # [K, Q, Pp]
    gram = lambda g: torch.einsum("kqp,krp->kqr", g.double(), g.double())  # noqa: E731
    return Features(grad_a=ga, grad_t=gt, gram_a=gram(ga), gram_t=gram(gt), logp_a=torch.cat(logp_a))

