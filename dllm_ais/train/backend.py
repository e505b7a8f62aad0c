"""What the trainer needs from a policy family, behind one small interface.

The trainer never branches on diffusion vs autoregressive: it calls a `Backend`.
- `sample(model, prompt_ids, prompt_mask, generator)` -> Rollout (with the FP8 or the BF16 model).
- `token_logp(model, rollout, seed, rows=None)` -> [B, L] (or [len(rows), L]) per-token log-probs used in the GRPO
  ratio π_θ / π_old; `seed` fixes any estimator noise for the whole batch, so θ on a micro-batch of rows, π_old and
  the reference on the full batch all see the same masks.
- `mismatch_log_w(model_old, model_rollout, rollout, generator, level)` -> ℓ = log π_old − log μ, [B] (sequence
  level) or [B, L] (token / geometric level: exact per-token log-ratios for AR; for diffusion the one-step
  estimator's per-token log-ratios, estimator values, not exact ones). Diffusion with
  `mismatch_estimator="trajectory"`: the trajectory ratio's per-token ℓ_j (likelihood/trajectory.py) at every level,
  summed for `sequence`.
- `rollout_token_logp(model_rollout, rollout, seed, rows=None)` -> [B, L] per-token log μ on the same footing as
  `token_logp` (AR: the sampler's exact log-probs; diffusion: the one-step estimator under the rollout model with
  the same masks), for the per-token mismatch diagnostics, rejection and bypass (π_old := μ).
- `sft_loss(model, prompt_ids, prompt_mask, completion_ids, generator)` -> [] supervised warm-up loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.types import Rollout


class Backend(Protocol):
    is_causal: bool
    """True for autoregressive models (exact per-token log-probs; token-level corrections available)."""

    def sample(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generator: torch.Generator,
               progress: bool = False) -> Rollout: ...

    def token_logp(self, model, rollout: Rollout, seed: int, rows: torch.Tensor | None = None) -> torch.Tensor: ...

    def mismatch_log_w(self, model_old, model_rollout, rollout: Rollout, generator: torch.Generator,
                       level: str) -> torch.Tensor: ...

    def rollout_token_logp(self, model_rollout, rollout: Rollout, seed: int,
                           rows: torch.Tensor | None = None) -> torch.Tensor: ...

    def sft_loss(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                 generator: torch.Generator) -> torch.Tensor: ...


@dataclass(frozen=True)
class DiffusionBackend:
    """LLaDA-style masked diffusion: LLaDA sampler, d1 one-step log-probs, coupled MC-ELBO or trajectory mismatch."""

    sampler: SamplerConfig
    """Sampling settings for rollouts."""
    mask_token_id: int
    """Id of the mask token."""
    stop_token_ids: Sequence[int]
    """Tokens that end a completion (EOS, EoT)."""
    p_mask_prompt: float = 0.15
    """One-step estimator: probability of masking each prompt token."""
    mismatch_num_draws: int = 4
    """K mask draws of the coupled ELBO difference ℓ = ELBO_BF16 − ELBO_FP8 (common random numbers)."""
    mismatch_estimator: str = "elbo"
    """ℓ = log π_old − log μ: `elbo` (coupled MC-ELBO difference at sequence level, one-step log-ratios per token) or
    `trajectory` (replay of the rollout's recorded canvases under π_old, per token and summed; sees the sampler's
    cache and threshold)."""
    trajectory_steps: int | None = None
    """`trajectory`: K denoising steps replayed per sequence (Horvitz–Thompson scaled); None = every step."""
    trajectory_chunk_size: int | None = None
    """`trajectory`: canvases per replay forward (None = the rollout's batch size)."""
    is_causal: bool = False

    def sample(self, model, prompt_ids, prompt_mask, generator, progress=False) -> Rollout:
        from dllm_ais.samplers.diffusion import diffusion_sample

        return diffusion_sample(model, prompt_ids, prompt_mask, self.sampler, self.mask_token_id,
                                self.stop_token_ids, generator=generator, progress=progress)

    def token_logp(self, model, rollout: Rollout, seed: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        from dllm_ais.likelihood.one_step import draw_prompt_mask, one_step_logprobs

        masked = draw_prompt_mask(rollout.prompt_mask, self.p_mask_prompt, seed)  # [B, P], drawn for the whole batch
        idx = slice(None) if rows is None else rows
        return one_step_logprobs(model, rollout.prompt_ids[idx], rollout.prompt_mask[idx],
                                 rollout.completion_ids[idx], prompt_masked=masked[idx],
                                 mask_token_id=self.mask_token_id)

    def rollout_token_logp(self, model_rollout, rollout: Rollout, seed: int,
                           rows: torch.Tensor | None = None) -> torch.Tensor:
        return self.token_logp(model_rollout, rollout, seed, rows)

    def trajectory_log_w(self, model_old, model_rollout, rollout: Rollout, generator, level: str) -> torch.Tensor:
        """The trajectory estimator's ℓ: [B, L] per token (token / geometric level) or [B] summed (sequence)."""
        mask = rollout.completion_mask
        exact_sampler = self.sampler.cache == "none"  # without a cache the sampler's μ is the model's own density
        if model_old is model_rollout and exact_sampler:  # BF16 rollouts, no cache: μ = π_old on every canvas
            zeros = torch.zeros(mask.shape, device=mask.device)
            return zeros if level != "sequence" else zeros.sum(-1)
        from dllm_ais.likelihood.trajectory import trajectory_log_ratio

        est = trajectory_log_ratio(model_old, model_rollout, rollout, temperature=self.sampler.temperature,
                                   mask_token_id=self.mask_token_id, num_steps=self.trajectory_steps,
                                   generator=generator if self.trajectory_steps is not None else None,
                                   chunk_size=self.trajectory_chunk_size, cfg_scale=self.sampler.cfg_scale)
        return est.token_log_ratio if level != "sequence" else est.log_ratio

    def mismatch_log_w(self, model_old, model_rollout, rollout: Rollout, generator, level: str) -> torch.Tensor:
        if self.mismatch_estimator == "trajectory":
            return self.trajectory_log_w(model_old, model_rollout, rollout, generator, level)
        if level != "sequence":  # token / geometric: the one-step estimator's per-token log-ratios (same masks)
            if model_old is model_rollout:
                return torch.zeros(rollout.completion_ids.shape, device=rollout.completion_ids.device)
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
            per_token = self.token_logp(model_old, rollout, seed) - self.token_logp(model_rollout, rollout, seed)
            return torch.where(rollout.completion_mask, per_token, 0.0)
        if model_old is model_rollout:  # BF16 rollouts: μ = π_old exactly
            return torch.zeros(rollout.completion_ids.shape[0], device=rollout.completion_ids.device)
        from dllm_ais.likelihood.ratio import coupled_log_ratio

        est = coupled_log_ratio(model_old, model_rollout, rollout.prompt_ids, rollout.prompt_mask,
                                rollout.completion_ids, rollout.completion_mask, num_draws=self.mismatch_num_draws,
                                generator=generator, mask_token_id=self.mask_token_id)
        return est.log_ratio.float()

    def sft_loss(self, model, prompt_ids, prompt_mask, completion_ids, generator) -> torch.Tensor:
        from dllm_ais.train.sft import sft_loss

        return sft_loss(model, prompt_ids, prompt_mask, completion_ids, self.mask_token_id, generator)


@dataclass(frozen=True)
class AutoregressiveBackend:
    """Causal LMs (Qwen): KV-cache sampler recording μ's exact log-probs; exact teacher-forced log-probs."""

    sampler: SamplerConfig
    """gen_length = max new tokens, temperature; block_length/steps/remasking are unused."""
    stop_token_ids: Sequence[int]
    """Tokens that end a completion."""
    pad_token_id: int | None = None
    """Token fed to finished rows (default: the first stop token)."""
    is_causal: bool = True

    def _ar_config(self):
        from dllm_ais.samplers.ar_common import ARSamplerConfig

        return ARSamplerConfig(max_new_tokens=self.sampler.gen_length, temperature=self.sampler.temperature)

    @property
    def _temperature(self) -> float:
        """Log-probs are those of the tempered policy the rollouts sample from (T = 0 scores at T = 1)."""
        return self.sampler.temperature or 1.0

    def sample(self, model, prompt_ids, prompt_mask, generator, progress=False) -> Rollout:
        from dllm_ais.samplers.autoregressive import ar_sample

        return ar_sample(model, prompt_ids, prompt_mask, self._ar_config(), self.stop_token_ids, generator=generator,
                         progress=progress, pad_token_id=self.pad_token_id)

    def token_logp(self, model, rollout: Rollout, seed: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        from dllm_ais.likelihood.autoregressive import completion_logprobs

        idx = slice(None) if rows is None else rows
        return completion_logprobs(model, rollout.prompt_ids[idx], rollout.prompt_mask[idx],
                                   rollout.completion_ids[idx], temperature=self._temperature)

    def rollout_token_logp(self, model_rollout, rollout: Rollout, seed: int,
                           rows: torch.Tensor | None = None) -> torch.Tensor:
        if rollout.logp_rollout is None:
            raise ValueError("the rollout carries no logp_rollout; sample with AutoregressiveBackend.sample.")
        return rollout.logp_rollout if rows is None else rollout.logp_rollout[rows]

    def mismatch_log_w(self, model_old, model_rollout, rollout: Rollout, generator, level: str) -> torch.Tensor:
        mask = rollout.completion_mask
        if model_old is model_rollout:  # BF16 rollouts: μ = π_old exactly
            zeros = torch.zeros(mask.shape, device=mask.device)
            return zeros if level != "sequence" else zeros.sum(-1)
        if rollout.logp_rollout is None:
            raise ValueError("the rollout carries no logp_rollout; sample with AutoregressiveBackend.sample.")
        per_token = self.token_logp(model_old, rollout, 0) - rollout.logp_rollout  # [B, L]
        per_token = torch.where(mask, per_token, 0.0)
        return per_token if level != "sequence" else per_token.sum(-1)

    def sft_loss(self, model, prompt_ids, prompt_mask, completion_ids, generator) -> torch.Tensor:
        from dllm_ais.likelihood.autoregressive import completion_logprobs

        return -completion_logprobs(model, prompt_ids, prompt_mask, completion_ids).mean()
