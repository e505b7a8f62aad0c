"""Qwen's registry record (dllm_ais/families.py): the autoregressive family (Qwen2 / Qwen3 through transformers)."""

from __future__ import annotations

from dllm_ais.families import Family, Hook

_M = "dllm_ais.models.qwen"

FAMILY = Family(
    name="qwen",
    title="Qwen",
    model_types=("qwen2", "qwen3"),
    architectures=("Qwen2ForCausalLM", "Qwen3ForCausalLM"),
    tiny=Hook(f"{_M}.model:tiny_qwen"),
    load=Hook(f"{_M}.model:load_family"),
    load_dir=Hook(f"{_M}.model:load_qwen"),
    save=Hook(f"{_M}.model:save_qwen"),
    check_source=Hook(f"{_M}.model:check_source"),
    lora_targets=Hook(f"{_M}.model:lora_targets"),
    backend=Hook(f"{_M}.backend:build_backend"),
    diffusion=False,
    fsdp_fp8_refusal=("FSDP with FP8 rollouts of a Qwen3 model is not supported (its fused static-cache copy is synced "
                      "from full weights only); use DDP (distributed_type: MULTI_GPU) with LoRA (--lora-r)."),
)
