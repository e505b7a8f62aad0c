"""Dream for `dllm-ais plan` (the family's plan hooks): its config, its parameters by part and the bytes of its
rollout copies, counted on the meta device (no weights, no download), and the steps of its schedule that commit."""

from __future__ import annotations

import torch

from dllm_ais.models.dream.model import DreamModel
from dllm_ais.plan.shape import ModelShape, config_of


def plan_config(model_config):
    """(DreamConfig, where it came from): tiny, a local config.json, or Dream-7B's shape for a hub id."""
    from dllm_ais.models import tiny
    from dllm_ais.models.dream.checkpoint import read_dream_config
    from dllm_ais.models.dream.model import DreamConfig

    return config_of(model_config, tiny.tiny_dream_config, read_dream_config, DreamConfig, "Dream", "Dream-7B")


def plan_shape(config, name: str) -> ModelShape:
    """DreamModel(config) built on the meta device, its parameters counted by part (GQA: n_kv_heads)."""
    with torch.device("meta"):
        model = DreamModel(config)
    block_linears = [m for layer in model.model.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    return ModelShape(
        name=name, d_model=config.hidden_size, n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
        mlp_hidden=config.intermediate_size, vocab=config.vocab_size,
        params_total=sum(p.numel() for p in model.parameters()),
        params_block_linear=sum(m.weight.numel() for m in block_linears),
        params_embedding=model.model.embed_tokens.weight.numel(),
        params_head=0 if config.tie_word_embeddings else model.lm_head.weight.numel(),
        params_norm=sum(p.numel() for p in norms),
        lora_in_out=sum(m.in_features + m.out_features for m in block_linears),
        n_kv_heads=config.num_key_value_heads, family="dream",
    )


def plan_copy_bytes(config, precision: str, dtype: torch.dtype, fp8_backend: str) -> int:
    """Bytes of Dream's rollout copy: fp8, the fused copy the trainer builds (models/dream/fused_fp8.py, on the meta
    device: stacked q/k/v and gate/up FP8 codes padded to whole 128-row blocks + fp32 scales, 128×128 blocks or one
    per row for scaled_mm, + biases; the rest in `dtype`); fp4, the walker copy (dequantised fp32 weights + fp32
    bias)."""
    if precision == "fp8":
        from dllm_ais.models.dream.fused_fp8 import FusedDream

        backend = "scaled_mm" if fp8_backend == "scaled_mm" else "torch"  # the two scale layouts (block, row)
        copy = FusedDream(config, backend, "meta", dtype)
        return sum(t.untyped_storage().nbytes() for t in [*copy.parameters(), *copy.buffers()])

    with torch.device("meta"):
        model = DreamModel(config)
    total, replaced = 0, 0
    for layer in model.model.layers:
        for m in layer.modules():
            if isinstance(m, torch.nn.Linear):
                n, k = m.weight.shape
                bias = 0 if m.bias is None else n
                replaced += m.weight.numel() + bias
                total += 4 * (n * k + bias)
    rest = sum(p.numel() for p in model.parameters()) - replaced
    return total + rest * dtype.itemsize


def plan_commit_steps(sampler) -> int:
    """The sampler steps that commit a token in a sequence (models/dream/sampler.py): Dream's schedule commits
    int(masks · (1 − s/t)) at a step, 0 at the first when steps = L, so a trajectory replay scores fewer canvases than
    the sampler runs forwards. Cached: per block its refresh plus the window steps with k > 0. origin (a random number
    per step) and the threshold: every step (the uncached threshold's shortfalls add forwards beyond `steps`: there
    this is a lower bound)."""
    from dllm_ais.models.dream.family import runs_origin
    from dllm_ais.models.dream.selection import scheduled_count

    if runs_origin(sampler) or sampler.threshold is not None:
        return sampler.steps

    def committing(masks: int, first: int, steps: int) -> int:
        n = 0
        for i in range(first, steps):
            k = scheduled_count(torch.ones(1, masks, dtype=torch.bool), i, steps, 1e-3)
            n, masks = n + (k > 0), masks - k
        return n

    if sampler.cache == "none":
        return committing(sampler.gen_length, 0, sampler.steps)
    blocks = sampler.gen_length // sampler.block_length
    return blocks * (1 + committing(sampler.block_length - 1, 1, sampler.steps // blocks))
