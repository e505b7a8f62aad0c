"""Dream's registry record (dllm_ais/families.py) and what Dream cannot train yet (`refusal`, applied by Preset
before anything is written; docs/models.md lists each with why)."""

from __future__ import annotations

from dllm_ais.families import Family, Hook

_M = "dllm_ais.models"
ALGORITHMS = ("origin", "maskgit_plus", "topk_margin", "entropy")
"""Dream's `alg` values (generation_utils.py `sample_tokens`; `confidence_threshold` is --threshold here)."""


def runs_origin(s) -> bool:
    """Whether SamplerConfig `s` samples in Dream's random order (origin): --dream-alg origin, or --remasking random
    without a --dream-alg (with low_confidence the checkpoint's "origin" is never taken: backend.py)."""
    return s.dream_alg == "origin" or (s.dream_alg is None and s.remasking == "random")


def one_block_uncached(model, s) -> int | None:
    """Evaluation's block (Family.eval_block_length): without a cache one block, as Dream's own generate has none."""
    return s.gen_length if s.cache == "none" else None


def refusal(s, policy_logprob: str, mismatch_estimator: str, trajectory_steps: int | None) -> str | None:
    """What Dream's trainer backend (models/dream/backend.py) cannot do with SamplerConfig `s`, in one line, or
    None."""
    origin = "--dream-alg origin" if s.dream_alg == "origin" else "--remasking random (Dream's origin)"
    for bad, why in ((runs_origin(s) and s.cache != "none", f"{origin} draws a random order, which Fast-dLLM's "
                      f"cached generate has no variant of; use --cache none, or a confidence rule with --cache "
                      f"{s.cache} (--dream-alg entropy | maskgit_plus | topk_margin)"),
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
    resolve_sampler=Hook(f"{_M}.dream.backend:resolve_sampler"),
    position_rules=ALGORITHMS,
    refusal=refusal,
    plan_config=Hook(f"{_M}.dream.shape:plan_config"),
    plan_shape=Hook(f"{_M}.dream.shape:plan_shape"),
    plan_copy_bytes=Hook(f"{_M}.dream.shape:plan_copy_bytes"),
    plan_commit_steps=Hook(f"{_M}.dream.shape:plan_commit_steps"),
    eval_block_length=one_block_uncached,
)
