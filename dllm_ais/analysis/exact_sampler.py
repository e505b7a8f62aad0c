"""Exact completion probabilities of the masked-diffusion sampler (and of an autoregressive one), by enumeration.

The sampler of samplers/diffusion.py with one block and steps = L is a Markov chain over partial canvases: a canvas
assigns each of the L completion positions either the mask or a committed token, and its next state depends only on
the model's logits at that canvas. So P(y | x) = the probability of reaching the full canvas y from the all-mask
canvas, computed by dynamic programming over the (V_c + 1)^L partial canvases, one forward each.

Per step, at canvas c with masked set S, every masked position i proposes X_i ~ prop_i = softmax(logits_i / T) over
the content tokens (the mask token is never proposed) and has confidence conf_i(X_i) = softmax(logits_i)[X_i] (full
softmax, mask included, untempered — as the sampler reads it). With F_i(a) = P(conf_i(X_i) < a):
- `low_confidence` (LLaDA's rule, one commit per step): commit (j, v) with probability
      prop_j(v) · Π_{i ∈ S, i ≠ j} F_i(conf_j(v));
- `threshold` (Fast-dLLM's rule, cache off): commit the set A ⊆ S of positions whose proposal has confidence ≥ the
  threshold, and if A is empty the most confident one. P(A with tokens y_A, all ≥ threshold) =
      Π_{i ∈ A} prop_i(y_i) 1[conf_i(y_i) ≥ thr] · Π_{i ∈ S \\ A} F_i(thr),
  and the single commit (j, v) with conf_j(v) < thr has the low-confidence probability above.
Ties between confidences (quantised copies produce exact ones) go to the lower position, as the sampler's stable
sort and first-argmax do.
Canvas digits: 0 = masked, d = token d − 1; canvas index Σ_j d_j (V_c + 1)^j, so committing never lowers the index.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations, product

import torch

from dllm_ais.analysis.exact_testbed import all_sequences, sequence_index


def canvas_table(vocab: int, length: int) -> torch.Tensor:
    """All partial canvases as digits, [(V_c + 1)^L, L] long (0 = masked, d = token d − 1)."""
    return all_sequences(vocab + 1, length)


def commit_children(canvas: int, free: list[int], sizes, vocab: int, width: int, offset: int = 0):
    """Every commit from canvas index `canvas` (canvas_table's digits, base V_c + 1): `size` of the masked slots
    `free` (offsets within a window of `width` slots starting at canvas column `offset`) get tokens, for each size
    in `sizes`. Yields (child canvas index, tokens [width] long, committed [width] bool), slots in combinations
    order, tokens in product order."""
    base = vocab + 1
    for size in sizes:
        for pos in combinations(free, size):
            for ys in product(range(vocab), repeat=size):
                tokens = torch.zeros(width, dtype=torch.long)
                committed = torch.zeros(width, dtype=torch.bool)
                for j, y in zip(pos, ys, strict=True):
                    tokens[j], committed[j] = y, True
                yield canvas + sum((y + 1) * base ** (offset + j) for j, y in zip(pos, ys, strict=True)), tokens, \
                    committed


def canvas_logits(model, prompts: torch.Tensor, canvases: torch.Tensor, mask_id: int, chunk: int = 4096
                  ) -> torch.Tensor:
    """float64 logits at the completion positions of every (prompt, canvas): prompts [n, P], canvases [C, L] digits
    -> [n, C, L, V]. Differentiable (call under torch.no_grad() when no gradient is wanted)."""
    n, P = prompts.shape
    C, L = canvases.shape
    ids = torch.where(canvases == 0, mask_id, canvases - 1)  # [C, L]
    rows = torch.cat([prompts[:, None].expand(n, C, P), ids[None].expand(n, C, L)], -1).reshape(n * C, P + L)
    out = [model(input_ids=rows[s:s + chunk], positions=slice(P, None)).logits.double()
           for s in range(0, n * C, chunk)]
    return torch.cat(out).view(n, C, L, -1)


def _proposal_and_confidence(logits: torch.Tensor, vocab: int, temperature: float):
    """logits [..., V] (V = V_c + 1, mask last) -> proposal [..., V_c] (T-tempered, mask removed) and confidence
    [..., V_c] (untempered full softmax of each content token)."""
    prop = (logits[..., :vocab] / temperature).softmax(-1)
    conf = logits.softmax(-1)[..., :vocab]
    return prop, conf


def _below(prop: torch.Tensor, conf: torch.Tensor, level: torch.Tensor, inclusive: bool = False) -> torch.Tensor:
    """F_i(level) = Σ_v' prop_i(v') 1[conf_i(v') < level] (≤ with `inclusive`): prop, conf [N, L, V_c]; level
    [N, J, W] -> [N, L, J, W]."""
    c, lv = conf[:, :, None, None, :], level[:, None, :, :, None]
    below = c <= lv if inclusive else c < lv  # [N, L, J, W, V_c]
    return (prop[:, :, None, None, :] * below).sum(-1)


def _single_commits(prop, conf, masked, threshold: float | None) -> torch.Tensor:
    """[N, L, V_c] probability that the step commits exactly (j, v): prop_j(v) Π_{i masked, i ≠ j} F_ij(conf_j(v)),
    0 where j is not masked; with a threshold, only for conf_j(v) < threshold. masked [N, L] bool. Ties go to the
    lower position (the sampler's stable sort / first argmax): F_ij counts conf_i < conf_j for i < j, ≤ for i > j."""
    N, L, V = prop.shape
    strict, loose = _below(prop, conf, conf), _below(prop, conf, conf, inclusive=True)  # [N, L_i, L_j, V_c]
    later = (torch.arange(L)[:, None] > torch.arange(L)[None, :])[None, :, :, None]  # i > j
    F = torch.where(later, loose, strict)
    other = masked[:, :, None] & ~torch.eye(L, dtype=torch.bool)[None]  # [N, L_i, L_j]
    F = torch.where(other[..., None], F, 1.0).prod(1)  # [N, L_j, V_c]
    p = prop * F * masked[..., None]
    return p if threshold is None else p * (conf < threshold)


def _parallel_commits(prop, conf, masked, threshold: float) -> torch.Tensor:
    """[N, (V_c + 1)^L] probability that the threshold step commits exactly the extension e (digits per position:
    0 = stays masked, v + 1 = commits v) with every committed confidence ≥ threshold; e = 0 (nothing above) gets 0."""
    N, L, V = prop.shape
    stay = _below(prop, conf, torch.full((N, 1, 1), threshold, dtype=prop.dtype)).squeeze(-1).squeeze(-1)  # [N, L]
    phi = torch.cat([stay[..., None], prop * (conf >= threshold)], -1)  # [N, L, V_c + 1]
    phi = torch.where(masked[..., None], phi, torch.eye(V + 1, dtype=phi.dtype)[0])  # unmasked: must stay (digit 0)
    table = phi[:, 0]  # [N, V_c + 1]
    for i in range(1, L):  # index Σ e_i (V_c + 1)^i, position 0 least significant
        table = (phi[:, i, :, None] * table[:, None, :]).reshape(N, -1)
    table[:, 0] = 0.0
    return table


def sampler_distribution(logits: torch.Tensor, vocab: int, rule: str = "low_confidence", temperature: float = 1.0,
                         threshold: float | None = None) -> torch.Tensor:
    """P(y | x) of the one-block sampler with steps = L: logits [n, C, L, V] from `canvas_logits` over
    `canvas_table(vocab, L)` -> [n, V_c^L] float64, indexed by `sequence_index` (rows sum to 1)."""
    if rule not in ("low_confidence", "threshold"):
        raise ValueError(f"rule={rule!r}: use low_confidence or threshold.")
    if (rule == "threshold") != (threshold is not None):
        raise ValueError("pass threshold exactly with rule='threshold'.")
    n, C, L, _ = logits.shape
    base = vocab + 1
    digits = canvas_table(vocab, L)  # [C, L]
    level = (digits > 0).sum(-1)  # [C] committed positions
    powers = base ** torch.arange(L)  # [L]
    prob = logits.new_zeros(n, C)
    prob[:, 0] = 1.0
    prop, conf = _proposal_and_confidence(logits, vocab, temperature)  # [n, C, L, V_c]
    for k in range(L):
        parents = (level == k).nonzero().squeeze(-1)  # [p]
        p = parents.numel()
        masked = (digits[parents] == 0)[None].expand(n, p, L).reshape(n * p, L)
        pr, cf = prop[:, parents].reshape(n * p, L, vocab), conf[:, parents].reshape(n * p, L, vocab)
        single = _single_commits(pr, cf, masked, threshold).view(n, p, L, vocab)
        child = parents[:, None, None] + (torch.arange(1, vocab + 1)[None, None, :] * powers[None, :, None])
        contrib = prob[:, parents, None, None] * single  # [n, p, L, V_c]
        ok = (digits[parents] == 0)[:, :, None].expand_as(child)  # children of masked positions only
        prob.index_add_(1, child[ok], contrib[:, ok])
        if threshold is not None:
            par = _parallel_commits(pr, cf, masked, threshold).view(n, p, -1)  # [n, p, C]
            legal = (digits[parents][:, None, :] == 0) | (digits[None, :, :] == 0)  # extension only where masked
            legal = legal.all(-1)  # [p, C]
            kids = parents[:, None] + torch.arange(C)[None, :]  # [p, C]
            prob.index_add_(1, kids[legal], (prob[:, parents, None] * par)[:, legal])
    full = (digits > 0).all(-1)  # [C]
    order = sequence_index(digits[full] - 1, vocab)  # completion index of each full canvas
    out = logits.new_zeros(n, vocab ** L)
    out[:, order] = prob[:, full]
    return out


def diffusion_distribution(model, prompts: torch.Tensor, vocab: int, gen_length: int, mask_id: int,
                           rule: str = "low_confidence", temperature: float = 1.0,
                           threshold: float | None = None) -> torch.Tensor:
    """[n, V_c^L] exact P(y | x) of the diffusion sampler for `model` (one block, steps = L)."""
    logits = canvas_logits(model, prompts, canvas_table(vocab, gen_length), mask_id)
    return sampler_distribution(logits, vocab, rule, temperature, threshold)


def ar_distribution(model, prompts: torch.Tensor, vocab: int, gen_length: int, temperature: float = 1.0
                    ) -> torch.Tensor:
    """[n, V_c^L] exact P(y | x) = Π_t softmax(z_t / T)[y_t] of ancestral sampling from a causal LM
    (differentiable)."""
    from dllm_ais.likelihood.autoregressive import completion_logprobs

    ys = all_sequences(vocab, gen_length)  # [K, L]
    n, K = prompts.shape[0], ys.shape[0]
    x = prompts[:, None].expand(n, K, -1).reshape(n * K, -1)
    lp = completion_logprobs(model, x, torch.ones_like(x, dtype=torch.bool), ys.repeat(n, 1), temperature=temperature)
    return lp.double().sum(-1).exp().view(n, K)


DISTRIBUTIONS: dict[str, Callable[..., torch.Tensor]] = {"llada": diffusion_distribution, "qwen": ar_distribution}
"""family -> exact sampler distribution (the same keyword arguments minus the diffusion-only ones)."""
