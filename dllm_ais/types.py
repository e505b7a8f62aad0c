"""Records passed between the sampler, likelihoods, corrections and the trainer. Shapes are documented per field.

B sequences, P prompt length (left-padded), L completion length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """Completions produced by a sampler for a batch of prompts."""

    prompt_ids: torch.Tensor
    """[B, P] long, left-padded prompt tokens."""
    prompt_mask: torch.Tensor
    """[B, P] bool, True on real prompt tokens (False on left padding)."""
    completion_ids: torch.Tensor
    """[B, L] long, generated tokens (every position is filled)."""
    completion_mask: torch.Tensor
    """[B, L] bool, True up to and including the first stop token (EOS/EoT); these tokens count in the loss."""
    commit_step: torch.Tensor
    """[B, L] long, the denoising step (0-based, global across blocks) at which each token was committed;
    for an autoregressive sampler, the decoding step (= position)."""
    num_steps: int
    """Number of model forward passes the sampler made (denoising steps; doubled work with CFG is not counted)."""
    logp_rollout: torch.Tensor | None = None
    """[B, L] float32 per-token log-probs of the sampled tokens under the rollout policy as the sampler drew them:
    autoregressive, log μ(y_t | y_<t); diffusion, log μ(y_j | canvas at the step y_j was committed) under the
    proposal (`likelihood.logprobs.proposal_logprobs`: temperature applied, mask token removed, the KV cache's
    approximation included). None where the sampler did not record them."""
    logp_select: torch.Tensor | None = None
    """[B, L] float64, diffusion samplers asked to record it: the selection log-term (`likelihood.selection`) of the
    step at which each token was committed, under the logits that step used, repeated on every token the step
    committed (a step's term is counted once by `likelihood.trajectory.share_step_terms`). None = not recorded."""
    commit_confidence: torch.Tensor | None = None
    """[B, L] float32, diffusion with low-confidence remasking: the confidence (full-softmax probability) each token
    was committed with. None where the sampler has no such confidence (random remasking, autoregressive)."""
    trajectory_plan: object | None = None
    """The (sequence, step) canvases the trajectory likelihoods replay (`likelihood.trajectory.ReplayPlan`), drawn
    once per rollout by the trainer and shared by π_θ, π_old, μ and the reference. None = every step."""
    nfe: int | None = None
    """Model forward calls the sampler made (Fast-dLLM's NFE; a block-refresh forward counts as one; CFG's second
    forward is not counted). None = num_steps."""

    @property
    def sequences(self) -> torch.Tensor:
        """[B, P + L] prompt followed by completion."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[B, P + L] bool: real prompt tokens and every completion position."""
        return torch.cat([self.prompt_mask, torch.ones_like(self.completion_mask)], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[B] long, number of counted completion tokens."""
        return self.completion_mask.sum(-1)
