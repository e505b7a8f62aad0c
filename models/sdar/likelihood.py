"""SDAR's training likelihoods: the block-wise ELBO in ONE two-stream [x_t | x_0] forward per mask draw, its coupled
FP8/BF16 difference, and the SFT loss.

The block-wise ELBO (semi-autoregressive: blocks causal, each block a masked-diffusion ELBO given the clean blocks
before it):

    log p(y | x) = Σ_b log p(y_b | x, y_<b)
                >= Σ_b E_{l_b, S_b}[ (n_b / l_b) Σ_{j ∈ S_b} log p_θ(y_j | x, y_<b, y_b∖S_b) ]

with n_b the counted completion tokens of block b, l_b ~ U{1..n_b} (stratified over the K draws) and S_b a uniform
subset of size l_b of them: masks random within each response block, the clean context before it. Every block of a
draw is scored by one forward: the noisy stream holds every block's x_t, the clean stream x_0, and
`two_stream_logits` (models/sdar/model.py, the official `block_diff_mask`) lets noisy block b see its own noisy block
and the clean blocks < b only.

Anchors (what differs is said): SDAR's training draws one t per sequence, masks each token with p = (1 − ε)t + ε and
weights the cross-entropy by 1/p (JetAstra/SDAR@c2041a8 training/model/SDAR-4B-Chat/modeling_sdar.py:155-283,
fused_linear_diffusion_cross_entropy.py:172) — `sft_loss` is that objective; TraDo's `random_masking` RL draws a
rate ~ U(lower_p, upper_p) per block and scores the masked tokens unweighted (Gen-Verse/dLLM-RL@10b4fd1
train/rl_trado.py:441-462, lower_p 0.1 / upper_p 0.9 in configs/rl_trado.yaml:65-66). The policy likelihood here
draws per block (as TraDo) with the mask-count weights n_b / l_b (same expectation as 1/t, masks.py's derivation) so
that Σ_j of the per-token terms is an unbiased estimate of the block-wise ELBO above.

Layout: the canvas is the sampler's (`block_canvas`: the row's own blocks aligned, prompt tail in the first
completion block); tokens outside completion_mask (after a stop, the slots filling the last block) stay as the
rollout left them in both streams and are never masked or scored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dllm_ais.likelihood.logprobs import token_logprobs
from dllm_ais.models.sdar.model import BlockCanvas, block_canvas, two_stream_logits


def completion_canvas(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                      completion_mask: torch.Tensor, block_length: int, gen_length: int, mask_token_id: int
                      ) -> tuple[BlockCanvas, torch.Tensor, torch.Tensor]:
    """(canvas, clean [B, T] long: x_0 with the completions in place, counted [B, T] bool: completion_mask on the
    canvas) for prompts [B, P] and completions [B, L] laid out as the sampler's canvas for `gen_length` tokens."""
    L = completion_ids.shape[1]
    canvas = block_canvas(prompt_ids, prompt_mask, block_length, gen_length, mask_token_id, completion_length=L)
    clean = canvas.scatter(completion_ids, canvas.ids)
    counted = canvas.scatter(completion_mask.bool(), torch.zeros_like(canvas.keep))
    return canvas, clean, counted


def draw_block_masks(counted: torch.Tensor, block_length: int, num_draws: int, generator: torch.Generator
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block and draw: l ~ U{1..n_b} (stratified over the K draws: u_k = (k + U)/K, l = ceil(u_k n_b)), then a
    uniform subset of l of the block's counted slots. counted [B, T] bool (T a multiple of block_length) ->
    (mask [B, K, T] bool, weight [B, K, T] float64: n_b / l_b on the block's slots)."""
    B, T = counted.shape
    K, Lb, dev = num_draws, block_length, counted.device
    nb = T // Lb
    c = counted.view(B, 1, nb, Lb).expand(B, K, nb, Lb)
    n = c.sum(-1)  # [B, K, nb]
    u = (torch.arange(K, device=dev, dtype=torch.float64)[None, :, None]
         + torch.rand(B, K, nb, generator=generator, device=dev, dtype=torch.float64)) / K  # [B, K, nb]
    l = torch.ceil(u * n).clamp(min=1)  # [B, K, nb]; n = 0 masks nothing below
    keys = torch.rand(B, K, nb, Lb, generator=generator, device=dev).masked_fill(~c, 2.0)  # uncounted rank last
    rank = keys.argsort(-1).argsort(-1)  # [B, K, nb, Lb]
    mask = c & (rank < l[..., None])
    weight = (n / l)[..., None].expand(B, K, nb, Lb)
    return mask.reshape(B, K, T), weight.reshape(B, K, T)


def first_noisy_column(mask: torch.Tensor, block_length: int) -> int:
    """The first block boundary at or before every row's first masked slot (mask [B, T] bool): the noisy stream
    can start there (`two_stream_logits` noisy_from); 0 when nothing is masked."""
    cols = mask.any(0).nonzero()
    return 0 if cols.numel() == 0 else int(cols[0, 0]) // block_length * block_length


def masked_token_logp(model, clean: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor, block_length: int,
                      mask_token_id: int) -> torch.Tensor:
    """[B, T] log p_θ(x_0[j] | noisy block, clean blocks before it) at the masked slots (0 elsewhere), from ONE
    two-stream forward (its noisy stream from the first block holding a masked slot). clean [B, T] x_0, keep
    [B, T], mask [B, T] bool (the draw's x_t = clean with mask -> mask token). Only the masked slots go through the
    LM head."""
    B, T = clean.shape
    noisy = torch.where(mask, mask_token_id, clean)
    counts = mask.sum(-1)  # [B]
    M = max(int(counts.max()), 1)
    pos = mask.long().argsort(dim=-1, descending=True, stable=True)[:, :M]  # [B, M] masked slots first
    valid = torch.arange(M, device=clean.device)[None, :] < counts[:, None]  # [B, M]
    s = first_noisy_column(mask, block_length)
    logits = two_stream_logits(model, noisy, clean, keep, block_length, positions=(pos - s).clamp(min=0),
                               noisy_from=s)  # [B, M, V]
    lp = token_logprobs(logits, clean.gather(1, pos)).masked_fill(~valid, 0.0)  # [B, M]
    return torch.zeros(B, T, dtype=lp.dtype, device=lp.device).scatter(1, pos, lp)


def block_elbo_terms(model, clean: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor,
                     block_length: int, mask_token_id: int) -> torch.Tensor:
    """[B, T] per-slot terms of the block-wise ELBO, averaged over the K draws: mean_k weight · log p at the draw's
    masked slots. Σ over slots = the ELBO estimate. mask, weight [B, K, T]; one two-stream forward per draw."""
    K = mask.shape[1]
    total = None
    for k in range(K):
        lp = masked_token_logp(model, clean, keep, mask[:, k], block_length, mask_token_id)  # [B, T]
        term = lp * weight[:, k].to(lp.dtype)
        total = term if total is None else total + term
    return total / K


def block_elbo_token_logp(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, block_length: int,
                          gen_length: int, num_draws: int, generator: torch.Generator, mask_token_id: int,
                          rows: torch.Tensor | None = None, draw=draw_block_masks) -> torch.Tensor:
    """[B, L] (or [len(rows), L]) per-token terms of the block-wise ELBO (module docstring) on the completion
    layout; the draws are made for the whole batch from `generator`, then `rows` taken, so a micro-batch sees the
    masks the full batch does. `draw(counted, block_length, K, generator) -> (mask, weight) [B, K, T]` is the mask
    law: `draw_block_masks` here, EBPO's `draw_ebpo_masks` (models/sdar/ebpo.py)."""
    canvas, clean, counted = completion_canvas(prompt_ids, prompt_mask, completion_ids, completion_mask, block_length,
                                               gen_length, mask_token_id)
    mask, weight = draw(counted, block_length, num_draws, generator)
    if rows is not None:
        canvas = BlockCanvas(ids=canvas.ids[rows], keep=canvas.keep[rows], prompt_end=canvas.prompt_end[rows],
                             row_end=canvas.row_end[rows], first_block=canvas.first_block,
                             block_length=block_length, completion_length=canvas.completion_length)
        clean, mask, weight = clean[rows], mask[rows], weight[rows]
    terms = block_elbo_terms(model, clean, canvas.keep, mask, weight, block_length, mask_token_id)  # [b, T]
    return canvas.gather(terms, 0.0)


def sft_loss(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
             mask_token_id: int, block_length: int, generator: torch.Generator, eps: float = 1e-3) -> torch.Tensor:
    """SDAR's SFT objective (modeling_sdar.py:155-283): t ~ U(0, 1) per sequence, each completion token masked with
    p = (1 − ε)t + ε, Σ_masked −log p_θ(y_j | x_t block, clean blocks before) / p over B · L, in one two-stream
    forward. completion_ids [B, L] (EOS-padded; every token counts, as LLaDA's SFT). The official code forces one
    masked token when none is drawn (:258); here such a row contributes 0 (the same expectation up to that event)."""
    B, L = completion_ids.shape
    dev = completion_ids.device
    canvas, clean, counted = completion_canvas(prompt_ids, prompt_mask, completion_ids,
                                               torch.ones_like(completion_ids, dtype=torch.bool), block_length, L,
                                               mask_token_id)
    t = torch.rand(B, 1, generator=generator, device=dev)
    p = (1 - eps) * t + eps  # [B, 1]
    mask = counted & (torch.rand(clean.shape, generator=generator, device=dev) < p)  # [B, T]
    noisy = torch.where(mask, mask_token_id, clean)
    s = canvas.first_block * block_length  # the first block holding a completion slot
    logits = two_stream_logits(model, noisy, clean, canvas.keep, block_length, noisy_from=s)  # [B, T − s, V]
    nll = F.cross_entropy(logits.float().transpose(1, 2), clean[:, s:], reduction="none")  # [B, T − s]
    return torch.where(mask[:, s:], nll / p, 0.0).sum() / (B * L)
