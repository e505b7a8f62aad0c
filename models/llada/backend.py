"""LLaDA's trainer backend hook: the package's masked-diffusion backend (train/backend.py DiffusionBackend) as it is."""

from __future__ import annotations

from dllm_ais.train.backend import DiffusionBackend, build_diffusion_backend


def build_backend(sampler, model, tokenizer, train=None) -> DiffusionBackend:
    """DiffusionBackend with the run's likelihood settings from `train` (a TrainConfig; None when only sampling)."""
    return build_diffusion_backend(DiffusionBackend, sampler, model, train)
