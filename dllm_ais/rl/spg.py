"""SPG's policy loss (Sandwiched Policy Gradient, arXiv 2510.09541), a pure function.

    loss = Σ_i L_i · ω_i · (−Â_i · ℓ_i) / Σ_i L_i

ℓ_i is the bound each sequence is trained on (ELBO for Â_i > 0, EUBO or a mixture otherwise:
`dllm_ais.likelihood.spg.spg_sequence_logp`), L_i its counted length, ω_i the (detached) mismatch correction weight
(1 without one). Where it differs from GRPO's loss: no ratio π_θ/π_old and so no clipping, no KL term (SPG trains
with β = 0), and the bound itself — not a log-ratio — carries the gradient; the token-mean aggregation of SPG's code
(each sequence weighted by its length). With one update per batch (num_iterations = 1) and Â-sign-dependent ℓ,
its gradient equals GSPO's sequence-ratio GRPO gradient at ratio 1 with a token-mean loss (the test checks it).
"""

from __future__ import annotations

import torch

from dllm_ais.rl.grpo import LossOutput


def spg_loss(seq_logp: torch.Tensor, adv: torch.Tensor, lengths: torch.Tensor,
             weights: torch.Tensor | None = None) -> LossOutput:
    """seq_logp [B] (differentiable), adv [B], lengths [B] counted tokens, weights [B] or None -> LossOutput.

    A sequence with no counted token contributes nothing. Clip fractions are 0 (SPG has no ratio); kl is None."""
    if not (seq_logp.shape == adv.shape == lengths.shape) or seq_logp.dim() != 1:
        raise ValueError(f"seq_logp {tuple(seq_logp.shape)}, adv {tuple(adv.shape)} and lengths "
                         f"{tuple(lengths.shape)} must all be [B].")
    n = lengths.to(seq_logp.dtype)
    w = torch.ones_like(n) if weights is None else weights.detach().to(seq_logp.dtype).reshape(n.shape)
    ell = torch.where(n > 0, seq_logp, 0.0)  # empty sequences: a NaN or inf there never reaches the loss
    loss = (n * w * (-adv.detach().to(seq_logp.dtype) * ell)).sum() / n.sum().clamp_min(1)
    return LossOutput(loss=loss, policy_loss=loss.detach(), kl=None, clip_ratio_low=None, clip_ratio_high=None,
                      clip_ratio_region=None)  # no ratio, no clip: no loss/clip_frac* metrics
