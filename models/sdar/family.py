"""SDAR's registry record (dllm_ais/families.py) and what SDAR's sampler does not have (`refusal`, applied by Preset
before anything is written; the likelihoods SDAR cannot train with are refused by models/sdar/backend.py
`training_refusal`, through `resolve_sampler`, also before anything is written)."""

from __future__ import annotations

from dllm_ais.families import Family, Hook

_M = "dllm_ais.models"


def refusal(s, policy_logprob: str, mismatch_estimator: str, trajectory_steps: int | None) -> str | None:
    """The SamplerConfig `s` settings SDAR's sampler (models/sdar/sampler.py) does not have, in one line, or None."""
    for bad, why in ((s.remasking == "random", "--remasking random: SDAR's strategies are confidence-ranked or "
                      "sequential; use --sdar-strategy"),
                     (s.cache != "none", f"--cache {s.cache}: SDAR's per-block KV cache is native (causal across "
                      "blocks, always on); drop --cache"),
                     (s.threshold is not None, "--threshold is Fast-dLLM's; SDAR's threshold rule is --sdar-strategy "
                      "low_confidence_dynamic --sdar-threshold F"),
                     (s.cfg_scale != 0, "--cfg-scale: SDAR's sampler has no classifier-free guidance; drop it"),
                     (s.max_commit_per_step is not None, "--max-commit-per-step is LLaDA's threshold cap; drop it")):
        if bad:
            return f"SDAR: {why}."
    return None


def trained_block_length(model, s) -> int:
    """Evaluation's block (Family.eval_block_length): the block `model` (an SDARModel, its FP8 copy or a peft wrapper)
    was trained with, config.json's block_size."""
    return int(model.config.block_size)


FAMILY = Family(
    name="sdar",
    title="SDAR",
    model_types=("sdar",),
    architectures=("SDARForCausalLM",),
    tiny=Hook(f"{_M}.sdar.tiny:tiny_sdar_model"),
    load=Hook(f"{_M}.load:load_model_and_tokenizer"),
    load_dir=Hook(f"{_M}.sdar.checkpoint:load_sdar"),
    save=Hook(f"{_M}.checkpoint:save_model"),
    check_source=Hook(f"{_M}.sdar.checkpoint:check_sdar_source"),
    lora_targets=Hook(f"{_M}.sdar.model:lora_target_regex"),
    backend=Hook(f"{_M}.sdar.backend:build_backend"),
    fp8_copy=Hook(f"{_M}.sdar.fused_fp8:fp8_copy"),
    fp4_copy=Hook(f"{_M}.sdar.fused_fp8:fp4_copy"),
    resolve_sampler=Hook(f"{_M}.sdar.backend:resolve_sampler"),
    refusal=refusal,
    sampler_fields=("sdar_strategy", "sdar_threshold"),
    eval_block_length=trained_block_length,
    eval_uses_rollout_sampler=True,
    records_logp_mu=False,
    plan_config=Hook(f"{_M}.sdar.shape:plan_config"),
    plan_shape=Hook(f"{_M}.sdar.shape:plan_shape"),
    plan_copy_bytes=Hook(f"{_M}.sdar.shape:plan_copy_bytes"),
    plan_commit_steps=Hook(f"{_M}.sdar.shape:plan_commit_steps"),
    replay_step_canvases=2,
    plan_rollout_passes=Hook(f"{_M}.sdar.shape:plan_rollout_passes"),
    native_kv_cache=True,
    own_policy_logprobs=("ebpo",),
    plan_policy_rows=Hook(f"{_M}.sdar.shape:plan_policy_rows"),
)
