"""LLaDA's registry record (dllm_ais/families.py): how a LLaDA checkpoint is recognised, loaded, saved and trained."""

from __future__ import annotations

from dllm_ais.families import Family, Hook

_M = "dllm_ais.models"

FAMILY = Family(
    name="llada",
    title="LLaDA",
    model_types=("llada",),
    architectures=("LLaDAModelLM",),
    tiny=Hook(f"{_M}.tiny:tiny_model"),
    load=Hook(f"{_M}.load:load_model_and_tokenizer"),
    load_dir=Hook(f"{_M}.llada.checkpoint:load_llada"),
    save=Hook(f"{_M}.checkpoint:save_model"),
    check_source=Hook(f"{_M}.llada.checkpoint:check_llada_source"),
    lora_targets=Hook(f"{_M}.llada.model:lora_target_regex"),
    backend=Hook(f"{_M}.llada.backend:build_backend"),
    fp8_copy=Hook(f"{_M}.llada.fused_fp8:fp8_copy"),
    bf16_sampling_copy=Hook(f"{_M}.llada.fused_fp8:bf16_copy"),
    plan_config=Hook(f"{_M}.llada.shape:plan_config"),
    plan_shape=Hook(f"{_M}.llada.shape:plan_shape"),
    plan_copy_bytes=Hook(f"{_M}.llada.shape:plan_copy_bytes"),
    fused_producers=True,
    graphed_sampling=True,
)
