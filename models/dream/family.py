"""Dream's registry record (dllm_ais/families.py) and what Dream cannot train yet (`refusal`, applied by Preset
before anything is written)."""

from __future__ import annotations

from dllm_ais.families import Family, Hook

_M = "dllm_ais.models"


def refusal(s, policy_logprob: str, mismatch_estimator: str, trajectory_steps: int | None) -> str | None:
    """What Dream's trainer backend (models/dream/backend.py) cannot do yet with SamplerConfig `s`, in one line, or
    None."""
    for bad, why in ((policy_logprob == "trajectory", "--policy-logprob trajectory is LLaDA's replay; use one_step or "
                      "a mask-draw likelihood (elbo, coupled, spg, mdpo, dtreerpo)"),
                     (mismatch_estimator == "trajectory" and s.cache != "none", f"--cache {s.cache}: Dream's "
                      "trajectory ratio replays the uncached schedule only; use --cache none"),
                     (trajectory_steps is not None, "--trajectory-steps: Dream's trajectory ratio replays every "
                      "step; drop it"),
                     (s.cfg_scale != 0, "--cfg-scale: Dream's sampler has no classifier-free guidance; drop it"),
                     (s.max_commit_per_step is not None, "--max-commit-per-step is LLaDA's threshold cap; drop it"),
                     (s.cuda_graphs == "on", "--cuda-graphs on: Dream's sampler runs eager (no graphs yet); use auto"),
                     (s.cache == "none" and s.block_length != s.gen_length, f"--block-length {s.block_length} "
                      "needs --cache prefix or dual (Dream's own generate has one block); or set it to --gen-length")):
        if bad:
            return f"Dream: {why}."
    return None


FAMILY = Family(
    name="dream",
    title="Dream",
    model_types=("Dream", "dream"),
    architectures=("DreamModel",),
    tiny=Hook(f"{_M}.tiny:tiny_dream_model"),
    load=Hook(f"{_M}.load:load_model_and_tokenizer"),
    load_dir=Hook(f"{_M}.dream.checkpoint:load_dream"),
    save=Hook(f"{_M}.checkpoint:save_model"),
    check_source=Hook(f"{_M}.dream.checkpoint:check_dream_source"),
    lora_targets=Hook(f"{_M}.dream.model:lora_target_regex"),
    backend=Hook(f"{_M}.dream.backend:build_backend"),
    fp8_copy=Hook(f"{_M}.dream.fused_fp8:fp8_copy"),
    check_sampler=Hook(f"{_M}.dream.backend:check_sampler"),
    refusal=refusal,
    plan_config=Hook(f"{_M}.dream.shape:plan_config"),
    plan_shape=Hook(f"{_M}.dream.shape:plan_shape"),
    plan_copy_bytes=Hook(f"{_M}.dream.shape:plan_copy_bytes"),
    replays_every_step=True,
    cached_trajectory_ratio=False,
    one_block_uncached=True,
    fsdp_fp8_refusal=("FSDP with FP8 rollouts of a Dream model is not supported yet (its fused copy syncs from an "
                      "unsharded master only); use DDP (distributed_type: MULTI_GPU) or --rollout-precision bf16."),
)
