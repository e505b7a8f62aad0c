"""LLaDA for `dllm-ais plan` (the family's plan hooks): its config, its parameters by part and the bytes of its
rollout copies, counted on the meta device (no weights, no download)."""

from __future__ import annotations

import torch

from dllm_ais.models.llada.model import LLaDAModelLM
from dllm_ais.plan.shape import ModelShape, config_of


def plan_config(model_config):
    """(LLaDAConfig, where it came from): tiny, a local config.json, or LLaDA-8B's shape for a hub id."""
    from dllm_ais.models import tiny
    from dllm_ais.models.llada.checkpoint import read_llada_config
    from dllm_ais.models.llada.model import LLaDAConfig

    return config_of(model_config, tiny.tiny_config, read_llada_config, LLaDAConfig, "LLaDA", "LLaDA-8B")


def plan_shape(config, name: str) -> ModelShape:
    """LLaDAModelLM(config) built on the meta device, its parameters counted by part."""
    with torch.device("meta"):
        model = LLaDAModelLM(config)
    t = model.model.transformer
    block_linears = [m for blk in t.blocks for m in blk.modules() if isinstance(m, torch.nn.Linear)]
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight") or n.endswith("ln_f.weight")]
    return ModelShape(
        name=name, d_model=config.d_model, n_layers=config.n_layers, n_heads=config.n_heads,
        mlp_hidden=config.mlp_hidden_size, vocab=config.embedding_size,
        params_total=sum(p.numel() for p in model.parameters()),
        params_block_linear=sum(m.weight.numel() for m in block_linears),
        params_embedding=t.wte.weight.numel(), params_head=t.ff_out.weight.numel(),
        params_norm=sum(p.numel() for p in norms),
        lora_in_out=sum(m.in_features + m.out_features for m in block_linears),
    )


def plan_copy_bytes(config, precision: str, dtype: torch.dtype, fp8_backend: str) -> int:
    """fp8: the fused copy (FusedLLaDA: e4m3 codes + fp32 scales of the fused linears, 128×128 blocks or one per row
    for scaled_mm; embeddings, norms and LM head in `dtype`); fp4: the walker copy (block linears dequantised in
    fp32, the rest in `dtype`)."""
    if precision == "fp4":
        shape = plan_shape(config, "")
        rest = shape.params_total - shape.params_block_linear
        return 4 * shape.params_block_linear + rest * dtype.itemsize
    from dllm_ais.models.llada.fused_fp8 import FusedLLaDA

    backend = "scaled_mm" if fp8_backend == "scaled_mm" else "torch"  # the two scale layouts (block, row)
    copy = FusedLLaDA(config, backend, "meta", dtype, producers="torch")
    return sum(t.untyped_storage().nbytes() for t in [*copy.parameters(), *copy.buffers()])
