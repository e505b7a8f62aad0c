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
- `prepare(rollout, generator)` attaches what every likelihood of the rollout shares (diffusion with a trajectory
  likelihood: the replay plan, `Rollout.trajectory_plan`); `token_scale(rollout)` -> None or [B, L] the loss's
  Horvitz–Thompson weights; `rollout_metrics(rollout, G)` -> the sampler's rollout/* metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import torch

from dllm_ais.config import PolicyLikelihoodConfig, SamplerConfig
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

    def prepare(self, rollout: Rollout, generator: torch.Generator) -> None: ...

    def token_scale(self, rollout: Rollout) -> torch.Tensor | None: ...

    def rollout_metrics(self, rollout: Rollout, num_generations: int) -> dict[str, float]: ...


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
    policy_logprob: str = "one_step"
    """log π in the GRPO ratio and KL: `one_step` (d1's estimator: every completion token masked at once),
    `trajectory` (the replay of the rollout's recorded canvases under the sampler's config: the path likelihood of
    likelihood/trajectory.py, per token), or a mask-draw likelihood of likelihood/policy.py's registry (`elbo`,
    `coupled`, `spg`, `mdpo`, `dtreerpo`) with the settings `likelihood`."""
    likelihood: PolicyLikelihoodConfig = field(default_factory=PolicyLikelihoodConfig)
    """Settings of the mask-draw policy likelihoods, received whole."""
    trajectory_selection: bool = False
    """Trajectory likelihoods (policy and mismatch) include each step's selection term (which positions were
    committed); False = the commit-only likelihood (token terms only)."""
    trajectory_merge: int = 1
    """`trajectory` policy likelihood: score this many consecutive recorded steps in one forward from the canvas at
    the group's first step (likelihood.trajectory.merge_commit_steps; biased, cheaper); 1 = the exact replay."""
    is_causal: bool = False

    @property
    def replay_config(self):
        """The sampler config a trajectory replay reads (a family's own, e.g. Dream's DreamSamplerConfig)."""
        return self.sampler

    @property
    def chunk_terms(self):
        """A family's replay of one chunk of canvases (likelihood/trajectory.py `_chunk_terms`'s signature); None =
        LLaDA's."""
        return None

    @property
    def uncached_chunk_terms(self):
        """Its variant with exact uncached logits (the mismatch ratio's π_old); None: `chunk_terms` with cache none."""
        return None

    @property
    def uses_trajectory(self) -> bool:
        """The rollouts' canvases are replayed (policy likelihood or mismatch ratio): a plan is drawn per rollout."""
        return self.policy_logprob == "trajectory" or self.mismatch_estimator == "trajectory"

    @cached_property
    def policy(self):
        """The mask-draw policy likelihood chosen by name (`likelihood.policy.POLICY_LIKELIHOODS`), or None for
        one_step / trajectory."""
        from dllm_ais.likelihood.policy import POLICY_LIKELIHOODS, policy_likelihood

        if self.policy_logprob not in POLICY_LIKELIHOODS:
            return None
        return policy_likelihood(self.policy_logprob, self.likelihood, self.sampler.block_length, self.sampler.steps)

    def policy_draw(self, rollout: Rollout, seed: int):
        """The batch's `PolicyDraw` for a logp seed: the same for θ (any rows), π_old, μ and the reference."""
        return self.policy.draw_rollout(rollout, seed)

    def sequence_logp(self, model, rollout: Rollout, seed: int, adv: torch.Tensor,
                      rows: torch.Tensor | None = None) -> torch.Tensor:
        """`spg`: [B] (or [len(rows)]) the bound each sequence trains on (ELBO for Â > 0, else EUBO / mixture) on the
        seed's draw; adv [B] (or [len(rows)]). The loss is `dllm_ais.rl.spg.spg_loss`."""
        if not hasattr(self.policy, "sequence_logp"):
            raise ValueError(f"--policy-logprob {self.policy_logprob} has no sequence bound; only spg does.")
        idx = slice(None) if rows is None else rows
        return self.policy.sequence_logp(model, rollout.prompt_ids[idx], rollout.prompt_mask[idx],
                                         rollout.completion_ids[idx], rollout.completion_mask[idx],
                                         self.policy_draw(rollout, seed).rows(idx), adv,
                                         mask_token_id=self.mask_token_id)

    def sample(self, model, prompt_ids, prompt_mask, generator, progress=False) -> Rollout:
        from dllm_ais.samplers.diffusion import diffusion_sample

        return diffusion_sample(model, prompt_ids, prompt_mask, self.sampler, self.mask_token_id,
                                self.stop_token_ids, generator=generator, progress=progress,
                                record_selection=self.trajectory_selection and self.uses_trajectory)

    def trajectory_plan(self, rollout: Rollout, generator: torch.Generator | None):
        """The canvases every trajectory likelihood of this rollout replays (`trajectory_steps` per sequence, drawn
        from `generator`, or all): a `likelihood.trajectory.ReplayPlan`."""
        from dllm_ais.likelihood.trajectory import replay_plan

        return replay_plan(rollout.commit_step, rollout.completion_mask.bool(), self.trajectory_steps,
                           generator if self.trajectory_steps is not None else None)

    def prepare(self, rollout: Rollout, generator: torch.Generator) -> None:
        """Draw the rollout's replay plan once (shared by π_θ, π_old, μ and the reference) when a likelihood replays
        its canvases; the generator is the step's `mismatch` one (the draw the trajectory ratio always made)."""
        if self.uses_trajectory:
            rollout.trajectory_plan = self.trajectory_plan(rollout, generator)

    def rollout_metrics(self, rollout: Rollout, num_generations: int) -> dict[str, float]:
        """Parallel-decoding diagnostics (rollout/tokens_per_step, group_distinct, commit_confidence)."""
        from dllm_ais.rl.rollout_stats import commit_stats

        return commit_stats(rollout.commit_step, rollout.completion_mask, rollout.completion_ids, num_generations,
                            rollout.commit_confidence)

    def _plan(self, rollout: Rollout):
        return rollout.trajectory_plan if rollout.trajectory_plan is not None else self.trajectory_plan(rollout, None)

    def _policy_rollout(self, rollout: Rollout) -> Rollout:
        """The rollout the policy likelihood replays: itself, or with `trajectory_merge` its merged copy (its plan:
        every merged step; the config refuses --trajectory-steps with a merge)."""
        if self.trajectory_merge == 1:
            return rollout
        from dllm_ais.likelihood.trajectory import merge_rollout

        return merge_rollout(rollout, self.trajectory_merge, self.sampler.block_length)

    def token_scale(self, rollout: Rollout) -> torch.Tensor | None:
        """[B, L] Horvitz–Thompson weights of the policy likelihood's replayed tokens (S_b / K on the sampled steps,
        0 on tokens not replayed), for the loss; None with the one-step estimator (every token scored)."""
        if self.policy_logprob != "trajectory":
            return None
        return self._plan(self._policy_rollout(rollout)).scale

    def token_logp(self, model, rollout: Rollout, seed: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        if self.policy_logprob == "trajectory":  # the plan, not the seed, fixes what is replayed
            from dllm_ais.likelihood.trajectory import policy_token_logp, rollout_rows

            rollout = self._policy_rollout(rollout)
            plan = self._plan(rollout)
            if rows is not None:
                rollout, plan = rollout_rows(rollout, rows), plan.for_rows(rows)
            return policy_token_logp(model, rollout, plan, self.replay_config, mask_token_id=self.mask_token_id,
                                     selection=self.trajectory_selection, chunk_size=self.trajectory_chunk_size,
                                     chunk_terms=self.chunk_terms)
        if self.policy is not None:  # a mask-draw likelihood: one draw per seed for the whole batch
            idx = slice(None) if rows is None else rows
            return self.policy.token_logp(model, rollout.prompt_ids[idx], rollout.prompt_mask[idx],
                                          rollout.completion_ids[idx], rollout.completion_mask[idx],
                                          self.policy_draw(rollout, seed).rows(idx),
                                          mask_token_id=self.mask_token_id)
        from dllm_ais.likelihood.one_step import draw_prompt_mask, one_step_logprobs

        masked = draw_prompt_mask(rollout.prompt_mask, self.p_mask_prompt, seed)  # [B, P], drawn for the whole batch
        idx = slice(None) if rows is None else rows
        return one_step_logprobs(model, rollout.prompt_ids[idx], rollout.prompt_mask[idx],
                                 rollout.completion_ids[idx], prompt_masked=masked[idx],
                                 mask_token_id=self.mask_token_id)

    def token_logp_by_rows(self, model, rollout: Rollout, chunks: list[torch.Tensor]) -> torch.Tensor:
        """`token_logp` [B, L] computed chunk by chunk of rows (a trajectory policy's π_old, in the same forwards as
        the update's micro-batches compute π_θ: the first iteration's ratio is then exactly 1)."""
        parts = [(idx, self.token_logp(model, rollout, 0, rows=idx)) for idx in chunks]
        out = torch.zeros(rollout.completion_ids.shape, dtype=parts[0][1].dtype, device=parts[0][1].device)
        for idx, lp in parts:
            out[idx] = lp
        return out

    def rollout_token_logp(self, model_rollout, rollout: Rollout, seed: int,
                           rows: torch.Tensor | None = None) -> torch.Tensor:
        merged = self.trajectory_merge > 1  # the sampler's record is of the unmerged canvases: replay μ instead
        if self.policy_logprob == "trajectory" and rollout.logp_rollout is not None and not merged:
            from dllm_ais.likelihood.trajectory import rollout_token_logp

            out = rollout_token_logp(rollout, self._plan(rollout), self.trajectory_selection)
            return out if rows is None else out[rows]
        return self.token_logp(model_rollout, rollout, seed, rows)

    def trajectory_log_w(self, model_old, model_rollout, rollout: Rollout, generator, level: str) -> torch.Tensor:
        """The trajectory estimator's ℓ: [B, L] per token (token / geometric level) or [B] summed (sequence)."""
        mask = rollout.completion_mask
        exact_sampler = self.sampler.cache == "none"  # without a cache the sampler's μ is the model's own density
        if model_old is model_rollout and exact_sampler:  # BF16 rollouts, no cache: μ = π_old on every canvas
            zeros = torch.zeros(mask.shape, device=mask.device)
            return zeros if level != "sequence" else zeros.sum(-1)
        from dllm_ais.likelihood.trajectory import trajectory_log_ratio

        plan = rollout.trajectory_plan if rollout.trajectory_plan is not None else self.trajectory_plan(rollout,
                                                                                                        generator)
        est = trajectory_log_ratio(model_old, model_rollout, rollout, temperature=self.sampler.temperature,
                                   mask_token_id=self.mask_token_id, plan=plan, chunk_size=self.trajectory_chunk_size,
                                   cfg_scale=self.sampler.cfg_scale, config=self.replay_config,
                                   selection=self.trajectory_selection, chunk_terms=self.chunk_terms,
                                   uncached_chunk_terms=self.uncached_chunk_terms)
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


def build_diffusion_backend(cls, sampler: SamplerConfig, model, train=None, **fields):
    """A diffusion backend (DiffusionBackend, or a family's subclass) for `model` with the run's likelihood settings
    from `train` (a TrainConfig; None when only sampling) and the family's own `fields`."""
    from dllm_ais.models.load import stop_token_ids

    extra = {} if train is None else dict(p_mask_prompt=train.p_mask_prompt,
                                          mismatch_num_draws=train.mismatch_num_draws,
                                          mismatch_estimator=train.mismatch_estimator,
                                          trajectory_steps=train.trajectory_steps,
                                          policy_logprob=train.policy_logprob, likelihood=train.likelihood,
                                          trajectory_selection=train.trajectory_selection,
                                          trajectory_merge=train.trajectory_merge)
    return cls(sampler, model.config.mask_token_id, stop_token_ids(model), **extra, **fields)


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

    def prepare(self, rollout: Rollout, generator: torch.Generator) -> None:
        """Nothing to share: exact per-token log-probs."""

    def token_scale(self, rollout: Rollout) -> None:
        """Every token is scored."""
        return None

    def rollout_metrics(self, rollout: Rollout, num_generations: int) -> dict[str, float]:
        """No denoising steps: one token per step."""
        return {}

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
