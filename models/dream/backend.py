"""Dream as a trainer backend: LLaDA's DiffusionBackend with Dream's sampler and Dream's trajectory replay.

What a Dream differs in, and where: rollouts come from models/dream/sampler.py (`diffusion_generate` semantics,
Fast-dLLM's cached generate and its uncached threshold); every mask-draw likelihood (one-step, the ELBO and its
coupled FP8/BF16 ratio, the SFT loss) reads the model through models/shift.py's shifted view, so DiffusionBackend's
own code serves them unchanged; the trajectory likelihoods (`--policy-logprob trajectory`, `--mismatch-estimator
trajectory`) replay the rollout's canvases through likelihood/trajectory.py's loop with Dream's step
(models/dream/trajectory.py `chunk_terms`: Dream's shift, filtered proposal, selection terms and cache). The FP8
rollout copy is models/dream/fused_fp8.py's (fp8/quantize.py picks it for a Dream master), refilled in place after
every optimizer step by fp8/sync.py (train/fsdp_sync.py under FSDP2) as LLaDA's is.

Sampling settings: SamplerConfig's gen_length, steps, temperature, cache, block_length and threshold; Dream's `alg`
(`resolve_alg`) is SamplerConfig.dream_alg when set (presets name theirs), else `origin` for --remasking random and
a confidence rule for low_confidence — the checkpoint's generation_config.json `alg` when it is one, else
maskgit_plus (LLaDA's rule, the top-1 probability): the released checkpoints' "origin" is never taken for
low_confidence. `alg_temp` is dream_alg_temp, else the checkpoint's; `top_p`, `top_k` come from generation_config.json
(models/dream/checkpoint.py `read_dream_sampling`). `resolve_sampler` writes what runs into the run's config and says
it at start, beside what the checkpoint says.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from dllm_ais.config import SamplerConfig
from dllm_ais.models.dream.family import refusal
from dllm_ais.train.backend import DiffusionBackend, build_diffusion_backend
from dllm_ais.types import Rollout

LOW_CONFIDENCE_ALG = "maskgit_plus"
"""Dream's alg for --remasking low_confidence when neither the preset nor the checkpoint names a confidence rule."""
CONFIDENCE_ALGS = ("maskgit_plus", "topk_margin", "entropy")
"""The algs that rank positions by confidence (origin draws a random order)."""
SAMPLING_KEYS = ("alg", "alg_temp", "top_p", "top_k")


def resolve_alg(sampler: SamplerConfig, checkpoint: dict) -> tuple[str, float, str]:
    """(alg, alg_temp, where the alg came from) for SamplerConfig `sampler` and the checkpoint's generation settings."""
    if sampler.dream_alg is not None:
        alg, source = sampler.dream_alg, "the preset / --dream-alg"
    elif sampler.remasking == "random":
        alg, source = "origin", "--remasking random"
    elif sampler.threshold is not None:
        alg, source = LOW_CONFIDENCE_ALG, "--threshold (Fast-dLLM's confidence_threshold: the top-1 probability)"
    elif checkpoint.get("alg") in CONFIDENCE_ALGS:
        alg, source = checkpoint["alg"], "the checkpoint's generation_config.json"
    else:
        alg, source = LOW_CONFIDENCE_ALG, "--remasking low_confidence (maskgit_plus: the top-1 probability)"
    alg_temp = sampler.dream_alg_temp
    if alg_temp is None:
        alg_temp = float(checkpoint.get("alg_temp") or 0.0)
    return alg, alg_temp, source


def dream_sampler_config(sampler: SamplerConfig, defaults: dict | None = None, train=None):
    """The DreamSamplerConfig of a SamplerConfig and a checkpoint's Dream sampling settings (module docstring).
    `train` (a TrainConfig, None when sampling): what Dream cannot train is refused first, in one line
    (models/dream/family.py `refusal`, which Preset also applies before anything is written)."""
    from dllm_ais.models.dream.sampler import DreamSamplerConfig

    likelihoods = ("one_step", "elbo", None) if train is None else (train.policy_logprob, train.mismatch_estimator,
                                                                    train.trajectory_steps)
    why = refusal(sampler, *likelihoods)
    if why:
        raise ValueError(why)
    defaults = defaults or {}
    alg, alg_temp, _ = resolve_alg(sampler, defaults)
    return DreamSamplerConfig(gen_length=sampler.gen_length, steps=sampler.steps, alg=alg, alg_temp=alg_temp,
                              temperature=sampler.temperature, top_p=defaults.get("top_p"),
                              top_k=defaults.get("top_k"), cache=sampler.cache, block_length=sampler.block_length,
                              threshold=sampler.threshold)


def sampling_line(checkpoint: dict | None, dream, source: str) -> str:
    """One line: what the checkpoint's generation_config.json sets (None: no checkpoint) and what runs."""
    sets = ", ".join(f"{k}={checkpoint[k]!r}" for k in SAMPLING_KEYS if k in (checkpoint or {}))
    said = ("the tiny built-in model has no generation_config.json" if checkpoint is None else
            f"the checkpoint's generation_config.json sets {sets or 'none of alg/alg_temp/top_p/top_k'}")
    runs = ", ".join(f"{k}={getattr(dream, k)!r}" for k in SAMPLING_KEYS)
    return f"Dream sampling: {said}; running {runs} (alg from {source})."


@dataclass(frozen=True)
class DreamBackend(DiffusionBackend):
    """DiffusionBackend for Dream: models/dream/sampler.py rollouts, models/dream/trajectory.py replay steps."""

    dream: object = None
    """The DreamSamplerConfig rollouts use (`dream_sampler_config`)."""
    note: str | None = None
    """What the checkpoint's generation_config.json sets and what runs (`sampling_line`; `dllm-ais sample` says it)."""

    @property
    def replay_config(self):
        return self.dream

    @property
    def chunk_terms(self):
        from dllm_ais.models.dream.trajectory import chunk_terms

        return chunk_terms

    @property
    def uncached_chunk_terms(self):
        from dllm_ais.models.dream.trajectory import chunk_terms

        return partial(chunk_terms, uncached=True)

    def sample(self, model, prompt_ids, prompt_mask, generator, progress=False) -> Rollout:
        from dllm_ais.models.dream.sampler import dream_sample

        return dream_sample(model, prompt_ids, prompt_mask, self.dream, self.mask_token_id, self.stop_token_ids,
                            generator=generator, record_selection=self.trajectory_selection and self.uses_trajectory)


def build_backend(sampler: SamplerConfig, model, tokenizer, train=None) -> DreamBackend:
    """The family's backend hook: Dream's sampler with the checkpoint's alg / alg_temp / top_p / top_k. With `train`
    the model then carries what runs (`sampling_defaults`), so the run's saved checkpoints sample as it trained."""
    checkpoint = getattr(model, "sampling_defaults", None)
    dream = dream_sampler_config(sampler, checkpoint, train)
    note = sampling_line(checkpoint, dream, resolve_alg(sampler, checkpoint or {})[2])
    if train is not None:
        model.sampling_defaults = {k: getattr(dream, k) for k in SAMPLING_KEYS if getattr(dream, k) is not None}
    return build_diffusion_backend(DreamBackend, sampler, model, train, dream=dream, note=note)


def resolve_sampler(preset):
    """The family's resolve_sampler hook, before the run directory exists: the checkpoint's sampling settings read
    (generation_config.json), the sampler built and checked (e.g. --threshold with entropy is refused here), and
    -> (the preset with dream_alg / dream_alg_temp set to what runs, the start-up line, {"checkpoint", "runs"})."""
    checkpoint = None
    if preset.model.path is not None:
        from dllm_ais.models.dream.checkpoint import read_dream_sampling
        from dllm_ais.models.hub import resolve_checkpoint_dir

        checkpoint = read_dream_sampling(resolve_checkpoint_dir(preset.model.path))
    dream = dream_sampler_config(preset.sampler, checkpoint, preset.train)
    _, _, source = resolve_alg(preset.sampler, checkpoint or {})
    runs = {k: getattr(dream, k) for k in SAMPLING_KEYS}
    sampler = replace(preset.sampler, dream_alg=dream.alg, dream_alg_temp=dream.alg_temp)
    return (replace(preset, sampler=sampler), sampling_line(checkpoint, dream, source),
            {"checkpoint": checkpoint, "runs": runs})
