"""Dream as a trainer backend: LLaDA's DiffusionBackend with Dream's sampler and Dream's trajectory likelihood.

What a Dream differs in, and where: rollouts come from models/dream/sampler.py (`diffusion_generate` semantics,
Fast-dLLM's cache for sampling); every mask-draw likelihood (one-step, the ELBO and its coupled FP8/BF16 ratio, the SFT
loss) reads the model through models/shift.py's shifted view, so DiffusionBackend's own code serves them unchanged; the
trajectory mismatch ratio replays the rollout's canvases with models/dream/trajectory.py. The FP8 rollout copy
is models/dream/fused_fp8.py's (fp8/quantize.py picks it for a Dream master), refilled in place after every optimizer
step by fp8/sync.py as LLaDA's is.

Sampling settings: SamplerConfig's gen_length, steps, temperature, cache, block_length and threshold; Dream's `alg`
is `origin` for --remasking random, else the checkpoint's generation_config.json `alg` (or `maskgit_plus`, LLaDA's
low-confidence rule: the top-1 probability); `alg_temp`, `top_p`, `top_k` come from generation_config.json too
(models/dream/checkpoint.py `read_dream_sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_ais.config import SamplerConfig
from dllm_ais.models.dream.family import refusal
from dllm_ais.train.backend import DiffusionBackend, build_diffusion_backend
from dllm_ais.types import Rollout

LOW_CONFIDENCE_ALG = "maskgit_plus"
"""Dream's alg for --remasking low_confidence when the checkpoint names none: the top-1 probability, LLaDA's rule."""


def dream_sampler_config(sampler: SamplerConfig, defaults: dict | None = None, train=None):
    """The DreamSamplerConfig of a SamplerConfig and a checkpoint's Dream sampling settings (module docstring).
    `train` (a TrainConfig, None when sampling): what Dream cannot train yet is refused first, in one line
    (models/dream/family.py `refusal`, which Preset also applies before anything is written)."""
    from dllm_ais.models.dream.sampler import DreamSamplerConfig

    likelihoods = ("one_step", "elbo", None) if train is None else (train.policy_logprob, train.mismatch_estimator,
                                                                    train.trajectory_steps)
    why = refusal(sampler, *likelihoods)
    if why:
        raise ValueError(why)
    defaults = defaults or {}
    alg = "origin" if sampler.remasking == "random" else defaults.get("alg", LOW_CONFIDENCE_ALG)
    one_block = sampler.cache == "none" and sampler.block_length == sampler.gen_length
    return DreamSamplerConfig(gen_length=sampler.gen_length, steps=sampler.steps, alg=alg,
                              alg_temp=float(defaults.get("alg_temp", 0.0)), temperature=sampler.temperature,
                              top_p=defaults.get("top_p"), top_k=defaults.get("top_k"), cache=sampler.cache,
                              block_length=None if one_block else sampler.block_length, threshold=sampler.threshold)


@dataclass(frozen=True)
class DreamBackend(DiffusionBackend):
    """DiffusionBackend for Dream: models/dream/sampler.py rollouts, models/dream/trajectory.py trajectory ratio."""

    dream: object = None
    """The DreamSamplerConfig rollouts use (`dream_sampler_config`)."""

    @property
    def uses_trajectory(self) -> bool:
        """Dream's trajectory ratio replays every step itself: no replay plan is drawn."""
        return False

    def sample(self, model, prompt_ids, prompt_mask, generator, progress=False) -> Rollout:
        from dllm_ais.models.dream.sampler import dream_sample

        return dream_sample(model, prompt_ids, prompt_mask, self.dream, self.mask_token_id, self.stop_token_ids,
                            generator=generator)

    def trajectory_log_w(self, model_old, model_rollout, rollout: Rollout, generator, level: str) -> torch.Tensor:
        """ℓ = log P_old(path) − log P_μ(path): [B, L] per token (token terms and shared selection terms) or [B]
        (sequence level); exact with `trajectory_selection`, the committed tokens' terms only without it."""
        mask = rollout.completion_mask
        if model_old is model_rollout:  # BF16 rollouts without a cache: μ = π_old on every canvas
            zeros = torch.zeros(mask.shape, device=mask.device)
            return zeros if level != "sequence" else zeros.sum(-1)
        from dllm_ais.models.dream.trajectory import path_terms

        with torch.no_grad():
            old = path_terms(model_old, rollout, self.dream, self.mask_token_id, self.trajectory_selection)
            mu = path_terms(model_rollout, rollout, self.dream, self.mask_token_id, self.trajectory_selection)
        if level == "sequence":
            return (old[1] - mu[1]).float()
        return torch.where(mask, old[0] - mu[0], 0.0).float()


def build_backend(sampler: SamplerConfig, model, tokenizer, train=None) -> DreamBackend:
    """The family's backend hook: Dream's sampler with the checkpoint's alg / alg_temp / top_p / top_k."""
    dream = dream_sampler_config(sampler, getattr(model, "sampling_defaults", None), train)
    return build_diffusion_backend(DreamBackend, sampler, model, train, dream=dream)


def check_sampler(preset) -> None:
    """A Dream's sampler settings (the preset's with the checkpoint's alg / alg_temp / top_p / top_k) built and checked
    before the run directory exists: e.g. --threshold without a cache is refused here, not after the first write."""
    defaults = {}
    if preset.model.path is not None:
        from dllm_ais.models.dream.checkpoint import read_dream_sampling
        from dllm_ais.models.hub import resolve_checkpoint_dir

        defaults = read_dream_sampling(resolve_checkpoint_dir(preset.model.path))
    dream_sampler_config(preset.sampler, defaults, preset.train)
