"""SDAR for `dllm-ais plan` (the family's plan hooks): its config, its parameters by part and the bytes of its rollout
copies, counted on the meta device (no weights, no download)."""

from __future__ import annotations

import math

import torch

from dllm_ais.models.sdar.model import SDARModel
from dllm_ais.plan.shape import ModelShape, config_of


def plan_config(model_config):
    """(SDARConfig, where it came from): tiny, a local config.json, or SDAR-8B-Chat's shape for a hub id (TraDo-8B is
    the same architecture)."""
    from dllm_ais.models.sdar.checkpoint import read_sdar_config
    from dllm_ais.models.sdar.model import SDARConfig
    from dllm_ais.models.sdar.tiny import tiny_sdar_config

    return config_of(model_config, tiny_sdar_config, read_sdar_config, SDARConfig, "SDAR", "SDAR-8B")


def _block_linears(model) -> list[torch.nn.Linear]:
    return [m for layer in model.model.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]


def plan_shape(config, name: str) -> ModelShape:
    """SDARModel(config) built on the meta device, its parameters counted by part (GQA: n_kv_heads; Qwen3's head_dim
    is its own field, so the KV width is n_kv_heads · head_dim, not d_model / n_heads · n_kv_heads)."""
    with torch.device("meta"):
        model = SDARModel(config)
    linears = _block_linears(model)
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    return ModelShape(
        name=name, d_model=config.hidden_size, n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
        mlp_hidden=config.intermediate_size, vocab=config.vocab_size,
        params_total=sum(p.numel() for p in model.parameters()),
        params_block_linear=sum(m.weight.numel() for m in linears),
        params_embedding=model.model.embed_tokens.weight.numel(),
        params_head=0 if config.tie_word_embeddings else model.lm_head.weight.numel(),
        params_norm=sum(p.numel() for p in norms),
        lora_in_out=sum(m.in_features + m.out_features for m in linears),
        n_kv_heads=config.num_key_value_heads, family="sdar",
    )


def plan_copy_bytes(config, precision: str, dtype: torch.dtype, fp8_backend: str) -> int:
    """Bytes of SDAR's rollout copy: fp8, the fused copy the trainer builds (models/sdar/fused_fp8.py, on the meta
    device: stacked q/k/v and gate/up FP8 codes padded to whole 128-row blocks + fp32 scales, 128×128 blocks or one
    per row for scaled_mm; the rest, q/k norms included, in `dtype`); fp4, the fused emulated-FP4 copy, which pads
    nothing and so holds what a per-Linear copy holds: dequantised fp32 weights. No biases (SDAR has none)."""
    if precision == "fp8":
        from dllm_ais.models.sdar.fused_fp8 import FusedSDAR

        backend = "scaled_mm" if fp8_backend == "scaled_mm" else "torch"  # the two scale layouts (block, row)
        copy = FusedSDAR(config, backend, "meta", dtype)
        return sum(t.untyped_storage().nbytes() for t in [*copy.parameters(), *copy.buffers()])
    with torch.device("meta"):
        model = SDARModel(config)
    total, replaced = 0, 0
    for m in _block_linears(model):
        n, k = m.weight.shape
        replaced += n * k
        if precision == "fp4":
            total += 4 * n * k
        else:
            scales = n if fp8_backend == "scaled_mm" else math.ceil(n / 128) * math.ceil(k / 128)
            total += n * k + 4 * scales
    rest = sum(p.numel() for p in model.parameters()) - replaced
    return total + rest * dtype.itemsize


def plan_commit_steps(sampler) -> int:
    """The local steps SDAR's path-law replay scores per sequence: models/sdar/trajectory.py scores local step s of
    every block at once in one two-stream forward of twice the canvas (Family.replay_step_canvases = 2: the linear
    layers exactly; attention over 2T keys costs more), so a rollout costs denoising_steps such forwards however many
    blocks it has — ⌈denoising_steps / k⌉ under TraceRL's shrink k, which groups each block's steps."""
    return sampler.steps // sampler.num_blocks


def plan_rollout_passes(w) -> list:
    """SDAR's sampler forwards per rollout (models/sdar/sampler.py, block_diffusion_generate's schedule): the prompt's
    whole blocks prefilled once; then per block its denoising steps, each the block's Lb tokens against the cache,
    and one pass storing the finished block's KV (its logits computed and unused). The first block also finishes the
    prompt's partial block (its tail of P mod Lb tokens): it has fewer masks, so it may need fewer steps, and the
    completion spills into one more block when there is a tail. Static strategy: exact; the dynamic rule can finish a
    block in fewer steps (an upper bound). A block's tokens see every earlier token and their own block, so the b-th
    block's keys are prefill + (b + 1) · Lb: the passes carry the mean over blocks, rounded up (attention's cost is
    linear in the keys)."""
    from dllm_ais.models.sdar.selection import transfer_counts
    from dllm_ais.plan.workload import Pass

    P, B, Lb = w.rollout_prompt_len, w.rows, w.block_length
    S = w.sampler_steps // (w.gen_length // Lb)
    tail = P % Lb
    prefill = P - tail
    blocks = -(-(tail + w.gen_length) // Lb)
    counts = transfer_counts(Lb, S)
    first = next(s + 1 for s in range(S) if sum(counts[:s + 1]) >= Lb - tail)  # steps of the first block
    keys = prefill + math.ceil(Lb * (blocks + 1) / 2)
    out = [Pass("rollout", "prompt prefill (whole blocks)", "rollout", 1, B, prefill, prefill, 0)] if prefill else []
    return [*out, Pass("rollout", "block step (cached)", "rollout", first + (blocks - 1) * S, B, Lb, keys, Lb),
            Pass("rollout", "finished block's KV stored", "rollout", blocks, B, Lb, keys, Lb)]


def plan_policy_rows(train, sampler) -> int:
    """Two-stream forwards per sequence of one evaluation of SDAR's own policy likelihood (`ebpo`,
    models/sdar/ebpo.py): one per draw, K = --elbo-draws, as the block-wise ELBO (the plan counts each as
    Family.replay_step_canvases = 2 canvases)."""
    return train.likelihood.elbo_draws
