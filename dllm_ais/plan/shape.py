"""The model a plan is about, read from models built on the meta device (shapes and bytes, no weights, no download).

`model_shape(ModelConfig)` asks the preset's family (dllm_ais/families.py: `plan_config`, `plan_shape`; e.g.
models/llada/shape.py) for its model built on the meta device — the tiny built-in model, the config.json of a local
checkpoint directory, or, for a hub id, the 8B / 7B shape of the config class's defaults (DESIGN.md §6) — counted by
part; `rollout_copy_bytes` asks its `plan_copy_bytes` for the quantised rollout copy built on the meta device (e.g.
models/llada/fused_fp8.py's FusedLLaDA), its parameter and buffer bytes added up. Everything else in the plan is
arithmetic on the returned `ModelShape` (pure functions: memory.py, flops.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

LORA_TARGETS_PER_BLOCK = 7
"""Block linears peft wraps (models/llada/model.py LORA_TARGETS: q, k, v, attn_out, ff_proj, up_proj, ff_out)."""


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one LLaDA model, counted on its meta-device build."""

    name: str
    """Where the shape came from: "tiny built-in", a checkpoint directory, or "LLaDA-8B (LLaDAConfig defaults)"."""
    d_model: int
    """Hidden width d."""
    n_layers: int
    """Transformer blocks."""
    n_heads: int
    """Attention heads H (no grouped-query attention: as many K/V heads)."""
    mlp_hidden: int
    """SwiGLU hidden width h (ff_proj / up_proj outputs)."""
    vocab: int
    """Embedding / LM-head rows V (config.embedding_size)."""
    params_total: int
    """Every parameter of the model."""
    params_block_linear: int
    """Parameters of the block linears (q, k, v, attn_out, ff_proj, up_proj, ff_out of every block): what an FP8 or FP4
    rollout copy quantises and what LoRA wraps."""
    params_embedding: int
    """Input embedding (wte)."""
    params_head: int
    """LM head (ff_out at the top; untied)."""
    params_norm: int
    """RMSNorm weights (two per block and ln_f)."""
    lora_in_out: int
    """Σ (in_features + out_features) over the block linears: LoRA of rank r adds r times this many parameters."""
    n_kv_heads: int = 0
    """Key/value heads (grouped-query attention: Dream has 4 for 28 query heads); 0 = n_heads."""
    family: str = "llada"
    """The model family counted (a key of dllm_ais/families.py)."""

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values) per token and layer: n_kv_heads · head_dim."""
        return (self.n_kv_heads or self.n_heads) * self.head_dim

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def lora_params(self, rank: int) -> int:
        """Parameters of LoRA rank `rank` on every block linear (A: r × in, B: out × r)."""
        return rank * self.lora_in_out


def llada_config(model_config):
    """The model config of a diffusion preset's ModelConfig and where it came from (the family's `plan_config` hook:
    tiny (path None), a local directory's config.json, or for any other string (a hub id) the 8B / 7B shape of the
    config class's defaults — nothing is downloaded). A family the plan does not model is refused in one line."""
    return _family(model_config).plan_config(model_config)


def _family(model_config):
    from dllm_ais.families import FAMILIES, get_family

    family = get_family(model_config.family)
    if family.plan_config is None:
        modelled = ", ".join(f.title for f in FAMILIES.values() if f.plan_config is not None)
        raise ValueError(f"dllm-ais plan models diffusion ({modelled}) presets; model family "
                         f"{model_config.family!r} is not modelled yet: pick e.g. --preset llada-8b-gsm8k.")
    return family


def config_of(model_config, tiny_config, read_config, defaults, name: str, big: str):
    """A family's plan_config: the tiny built-in config, a local directory's config.json (`read_config`), or the
    `defaults()` config class's 8B / 7B shape for a hub id (`big` names it); with where it came from."""
    from pathlib import Path

    if model_config.path is None:
        return tiny_config(), f"tiny built-in {name}"
    local = Path(model_config.path).expanduser()
    if local.is_dir():
        return read_config(local), f"{local} (config.json)"
    return defaults(), f"{model_config.path} = {big} shape ({defaults.__name__} defaults; not downloaded)"


@lru_cache(maxsize=16)
def model_shape(model_config) -> ModelShape:
    """Count the parameters of the preset's model built on the meta device (the family's `plan_shape` hook)."""
    config, name = llada_config(model_config)
    return _family(model_config).plan_shape(config, name)


@lru_cache(maxsize=32)
def rollout_copy_bytes(model_config, precision: str, fp8_backend: str = "cublas") -> int:
    """Bytes of the quantised rollout copy the trainer builds (0 for bf16: the master itself rolls out).

    fp8: the family's fused copy (e.g. FusedLLaDA: e4m3 codes + fp32 block scales of the fused linears, embeddings,
    norms and LM head in the master's dtype), built on the meta device with `fp8_backend`'s scale layout (block for
    every backend but scaled_mm's per-row scales; `auto` resolves to a block backend). fp4: the emulated copy
    (fp4/linear.py: each block linear held dequantised in fp32, everything else copied in the master's dtype).
    """
    import torch

    if precision == "bf16":
        return 0
    config, _ = llada_config(model_config)
    dtype = getattr(torch, model_config.dtype)
    return _family(model_config).plan_copy_bytes(config, precision, dtype, fp8_backend)
