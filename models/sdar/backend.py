"""SDAR as a trainer backend — sampling only for now: DiffusionBackend's interface with SDAR's sampler
(models/sdar/sampler.py). Training (its likelihoods: the block-wise ELBO, TraceRL, EBPO) is not built yet and is
refused in one line before anything is written (`resolve_sampler`, which train/job.py calls first).

Sampling settings from SamplerConfig: gen_length, block_length, steps (the total: denoising_steps = steps /
(gen_length / block_length) per block), temperature (0 = the official greedy T = 1, top_k = 1), sdar_strategy
(default low_confidence_dynamic), sdar_threshold (default 0.9), cuda_graphs; top_k 0 and top_p 1 (off: the official
generate's and TraDo's rollout defaults; a checkpoint's generation_config.json is for autoregressive decoding and is
not read). What SDAR's sampler does not have (--cache, Fast-dLLM's --threshold, --remasking random, --cfg-scale) is
refused by models/sdar/family.py `refusal`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm_ais.config import SamplerConfig
from dllm_ais.models.sdar.family import refusal
from dllm_ais.train.backend import DiffusionBackend, build_diffusion_backend
from dllm_ais.types import Rollout

DEFAULT_STRATEGY = "low_confidence_dynamic"
"""SamplerConfig.sdar_strategy None: generate.py's default strategy, TraDo's rollout one (configs/rl_trado.yaml)."""
DEFAULT_THRESHOLD = 0.9
"""SamplerConfig.sdar_threshold None: TraDo's dynamic_threshold (configs/rl_trado.yaml; generate.py's CLI: 0.85)."""
TRAINING_REFUSAL = ("SDAR: training is not built yet (its likelihoods — the block-wise ELBO, TraceRL's trajectory, "
                    "EBPO — come next); `dllm-ais sample` samples an SDAR model.")


def sdar_sampler_config(sampler: SamplerConfig):
    """The SDARSamplerConfig of a SamplerConfig (module docstring); what SDAR's sampler lacks is refused in one
    line."""
    from dllm_ais.models.sdar.sampler import SDARSamplerConfig

    why = refusal(sampler, "one_step", "elbo", None)
    if why:
        raise ValueError(why)
    return SDARSamplerConfig(gen_length=sampler.gen_length, block_length=sampler.block_length,
                             denoising_steps=sampler.steps // sampler.num_blocks,
                             strategy=sampler.sdar_strategy or DEFAULT_STRATEGY,
                             threshold=DEFAULT_THRESHOLD if sampler.sdar_threshold is None else sampler.sdar_threshold,
                             temperature=sampler.temperature, cuda_graphs=sampler.cuda_graphs)


@dataclass(frozen=True)
class SDARBackend(DiffusionBackend):
    """DiffusionBackend for SDAR: models/sdar/sampler.py rollouts (the likelihoods come with SDAR's training)."""

    sdar: object = None
    """The SDARSamplerConfig rollouts use (`sdar_sampler_config`)."""

    def sample(self, model, prompt_ids, prompt_mask, generator, progress=False) -> Rollout:
        from dllm_ais.models.sdar.sampler import sdar_sample

        return sdar_sample(model, prompt_ids, prompt_mask, self.sdar, self.mask_token_id, self.stop_token_ids,
                           generator=generator)


def build_backend(sampler: SamplerConfig, model, tokenizer, train=None) -> SDARBackend:
    """The family's backend hook: SDAR's sampler; a TrainConfig (training) is refused in one line."""
    if train is not None:
        raise ValueError(TRAINING_REFUSAL)
    return build_diffusion_backend(SDARBackend, sampler, model, train, sdar=sdar_sampler_config(sampler))


def resolve_sampler(preset):
    """The family's resolve_sampler hook, called by `dllm-ais train` before the run directory exists: the sampler
    settings are checked, then training is refused (one line): SDAR does not train yet."""
    sdar_sampler_config(preset.sampler)
    raise ValueError(TRAINING_REFUSAL)
