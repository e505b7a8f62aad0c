"""Per-completion gradients h_k = ∇_θ s(x_k, y_k) of the trainer's surrogate log-likelihood, and their Gram matrix.

At θ = θ_old (the first update of a step: ratio 1, nothing clipped) the GRPO loss with ω and dapo's token mean over
N completions of L counted tokens has the ascent direction

    ĝ = (1 / (N L)) Σ_i ω_i Â_i h_i,         h_i = ∇_θ s(x_i, y_i),

so every estimator is a weighted sum of the K = n_prompts · V_c^L per-completion gradients, and every bias, variance
and inner product follows from the K × K Gram matrix M = H Hᵀ (H [K, P], rows h_k; P = every parameter of the
model — the "stated parameter set"). Rows are prompt-major: k = prompt · V_c^L + sequence_index(y).

Surrogates s (per-completion log-likelihood callables `loglik(model, prompts [n, P], completions [n, L]) -> [n]`,
differentiable; the generic path `per_completion_gradients` takes any of them — the trajectory likelihood of
issue 26 plugs in here as one more callable):
- `one_step_expected`: d1's one-step estimator (every completion token masked) summed over the L tokens, in
  expectation over its random prompt mask (each prompt token masked w.p. 0.15): the 2^P prompt masks enumerated
  with their probabilities. The trainer draws one mask per step; its extra noise is not in these figures.
- `exact_elbo`: LLaDA's mask-count ELBO with every one of the 2^L − 1 completion masks enumerated (weights
  1 / (|m| C(L, |m|)); the K → ∞ limit of the MC ELBO, masks.py).
- `ar_loglik`: the exact autoregressive log-likelihood (Qwen).
`one_step_gradients` computes the one-step Gram without per-completion backward passes: the one-step input does
not depend on y, so h(x, y) = Σ_{m,t} π(m) (e_{y_t} − p_{x,m,t})ᵀ ∂z_{x,m,t}/∂θ and M = U (J Jᵀ) Uᵀ with J the
Jacobian of the n · 2^P · L · V logits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from math import comb

import torch

from dllm_ais.analysis.exact_testbed import all_sequences

LogLik = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
"""loglik(model, prompts [n, P], completions [n, L]) -> [n] differentiable surrogate log-likelihood."""

P_MASK_PROMPT = 0.15
"""d1's prompt-token masking probability (likelihood/one_step.py)."""


@dataclass(frozen=True)
class SurrogateGradients:
    """The Gram matrix of the per-completion gradients and a way to form any weighted sum of them."""

    gram: torch.Tensor
    """[K, K] float64, M_kl = ⟨h_k, h_l⟩ (K = n_prompts · V_c^L, prompt-major)."""
    vector: Callable[[torch.Tensor], torch.Tensor]
    """a [K] float64 -> Σ_k a_k h_k, flat [P] float64 in `model.parameters()` order (from float32-stored
    gradients: relative error ~1e-7; the Gram is accumulated in float64)."""
    num_params: int
    """P: parameters differentiated (all of the model's)."""


def prompt_masks(prompt_len: int, p: float = P_MASK_PROMPT) -> tuple[torch.Tensor, torch.Tensor]:
    """Every prompt mask [2^P, P] bool and its probability [2^P] float64 (each token masked w.p. p)."""
    masks = all_sequences(2, prompt_len).bool()
    k = masks.sum(-1).double()
    return masks, p ** k * (1 - p) ** (prompt_len - k)


def one_step_expected(model, prompts: torch.Tensor, completions: torch.Tensor, p: float = P_MASK_PROMPT
                      ) -> torch.Tensor:
    """E_m[Σ_t log p(y_t | x with mask m, all completion masked)] over the enumerated prompt masks m -> [n]."""
    from dllm_ais.likelihood.one_step import one_step_logprobs

    masks, weight = prompt_masks(prompts.shape[1], p)  # [S, P], [S]
    n, S = prompts.shape[0], masks.shape[0]
    x = prompts.repeat_interleave(S, 0)  # [n S, P]
    lp = one_step_logprobs(model, x, torch.ones_like(x, dtype=torch.bool), completions.repeat_interleave(S, 0),
                           prompt_masked=masks.repeat(n, 1), mask_token_id=model.config.mask_token_id)  # [n S, L]
    return (lp.sum(-1).view(n, S) * weight.to(lp.dtype)).sum(-1)


def all_masks_draws(n: int, length: int):
    """MaskDraws holding every non-empty completion mask once, weighted so that their mean is the exact ELBO."""
    from dllm_ais.likelihood.masks import MaskDraws

    masks = all_sequences(2, length).bool()[1:]  # [2^L − 1, L]
    size = masks.sum(-1)
    K = masks.shape[0]
    weight = torch.tensor([K / (int(s) * comb(length, int(s))) for s in size], dtype=torch.float64)
    return MaskDraws(mask=masks[None].expand(n, -1, -1), level=(size / length).double()[None].expand(n, -1),
                     weight=weight[None].expand(n, -1))


def exact_elbo(model, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """LLaDA's ELBO of log p(y | x), every mask enumerated -> [n]."""
    from dllm_ais.likelihood.elbo import elbo_from_draws

    ones = torch.ones_like(completions, dtype=torch.bool)
    draws = all_masks_draws(prompts.shape[0], completions.shape[1])
    return elbo_from_draws(model, prompts, torch.ones_like(prompts, dtype=torch.bool), completions, ones, draws,
                           mask_token_id=model.config.mask_token_id, batch_size=4096).estimate


def ar_loglik(model, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """Exact log π(y | x) of a causal LM -> [n]."""
    from dllm_ais.likelihood.autoregressive import completion_logprobs

    return completion_logprobs(model, prompts, torch.ones_like(prompts, dtype=torch.bool), completions).sum(-1)


LOGLIKS: dict[str, LogLik] = {"one_step": one_step_expected, "elbo": exact_elbo, "ar": ar_loglik}


def _flat_grad(out: torch.Tensor, params: list[torch.Tensor], **kw) -> torch.Tensor:
    grads = torch.autograd.grad(out, params, allow_unused=True, **kw)
    return torch.cat([torch.zeros_like(p).reshape(-1) if g is None else g.reshape(-1) for g, p in zip(grads, params,
                                                                                                       strict=True)])


def _gram(rows: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """rows [K, P] (any float) -> rows rowsᵀ [K, K] float64, in float64 chunks."""
    K = rows.shape[0]
    out = torch.empty(K, K, dtype=torch.float64)
    for i in range(0, K, chunk):
        a = rows[i:i + chunk].double()
        for j in range(0, i + 1, chunk):
            block = a @ rows[j:j + chunk].double().T
            out[i:i + chunk, j:j + chunk] = block
            out[j:j + chunk, i:i + chunk] = block.T
    return out


def completion_grid(prompts: torch.Tensor, vocab: int, gen_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (prompt, completion) pair, prompt-major: ([K, P], [K, L]) with K = n · V_c^L."""
    ys = all_sequences(vocab, gen_length)
    n, Y = prompts.shape[0], ys.shape[0]
    return prompts.repeat_interleave(Y, 0), ys.repeat(n, 1)


def per_completion_gradients(loglik: LogLik, model, prompts: torch.Tensor, vocab: int, gen_length: int
                             ) -> SurrogateGradients:
    """The generic path: one backward pass per completion (model in float64), H kept in float32 [K, P]."""
    model = copy.deepcopy(model).double()
    params = list(model.parameters())
    xs, ys = completion_grid(prompts, vocab, gen_length)
    H = torch.stack([_flat_grad(loglik(model, xs[k:k + 1], ys[k:k + 1]).sum(), params).float()
                     for k in range(xs.shape[0])])  # [K, P]
    return SurrogateGradients(gram=_gram(H), vector=lambda a: (a.float() @ H).double(), num_params=H.shape[1])


def one_step_gradients(model, prompts: torch.Tensor, vocab: int, gen_length: int, p: float = P_MASK_PROMPT
                       ) -> SurrogateGradients:
    """`one_step_expected`'s Gram by the logit Jacobian (module doc); equal to `per_completion_gradients` with it."""
    model = copy.deepcopy(model).double()
    params = list(model.parameters())
    mask_id = model.config.mask_token_id
    masks, weight = prompt_masks(prompts.shape[1], p)  # [S, P], [S]
    n, S, L = prompts.shape[0], masks.shape[0], gen_length
    x = torch.where(masks[None], mask_id, prompts[:, None])  # [n, S, P]
    rows = torch.cat([x, torch.full((n, S, L), mask_id)], -1).view(n * S, -1)  # [n S, P + L]
    jac, probs = [], []
    for r in rows:
        z = model(input_ids=r[None], positions=slice(prompts.shape[1], None)).logits[0]  # [L, V]
        eye = torch.eye(z.numel(), dtype=z.dtype).view(-1, *z.shape)
        grads = torch.autograd.grad(z, params, grad_outputs=eye, is_grads_batched=True)
        jac.append(torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1).float())  # [L V, P]
        probs.append(z.detach().softmax(-1))  # [L, V]
    J = torch.cat(jac)  # [n S L V, P]
    G = _gram(J)
    V = probs[0].shape[-1]
    p_all = torch.stack(probs).view(n, S, L, V)
    ys = all_sequences(vocab, L)  # [Y, L]
    onehot = torch.nn.functional.one_hot(ys, V).double()  # [Y, L, V]
    Y = ys.shape[0]
    U = torch.zeros(n * Y, n * S * L * V, dtype=torch.float64)
    for i in range(n):
        block = weight[None, :, None, None] * (onehot[:, None] - p_all[i][None])  # [Y, S, L, V]
        U[i * Y:(i + 1) * Y, i * S * L * V:(i + 1) * S * L * V] = block.reshape(Y, -1)
    gram = U @ G @ U.T

    def vector(a: torch.Tensor) -> torch.Tensor:
        return ((a.double() @ U).float() @ J).double()  # float32 J: 4-byte storage, 1e-7 relative

    return SurrogateGradients(gram=gram, vector=vector, num_params=J.shape[1])


def surrogate_gradients(name: str, model, prompts: torch.Tensor, vocab: int, gen_length: int) -> SurrogateGradients:
    """Gram and vectors of the named surrogate (one_step uses the Jacobian shortcut; elbo and ar the generic path)."""
    if name == "one_step":
        return one_step_gradients(model, prompts, vocab, gen_length)
    if name not in LOGLIKS:
        raise ValueError(f"unknown surrogate {name!r}: use one of {', '.join(LOGLIKS)}.")
    return per_completion_gradients(LOGLIKS[name], model, prompts, vocab, gen_length)
