"""The model a plan is about, read from models built on the meta device (shapes and bytes, no weights, no download).

`model_shape(ModelConfig)` builds the LLaDAModelLM (or, for family "dream", the DreamModel) of a preset on the meta
device — the tiny built-in model, the config.json of a local checkpoint directory, or, for a hub id, the LLaDA-8B
shape that `LLaDAConfig()`'s defaults ship (DESIGN.md §6; Dream: `DreamConfig()`'s, Dream-v0-Instruct-7B's) — and
counts its parameters by part; `rollout_copy_bytes` builds the FP8 rollout copy (fp8/fused_llada.py's FusedLLaDA)
on the meta device and adds up its parameter and buffer bytes (Dream's walker copy, fp8/quantize.py: counted from
the layer shapes). Everything else in
the plan is arithmetic on the returned `ModelShape` (pure functions: memory.py, flops.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

LORA_TARGETS_PER_BLOCK = 7
"""Block linears peft wraps (models/llada.py LORA_TARGETS: q, k, v, attn_out, ff_proj, up_proj, ff_out)."""


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
    """The model family counted ("llada" or "dream")."""

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
    """The model config of a diffusion preset's ModelConfig (`llada_config` answers for Dream too: DreamConfig) and
    where it came from: tiny (path None), a local directory's config.json, or for any other string (a hub id) the
    8B / 7B shape of the config class's defaults — nothing is downloaded."""
    from dllm_ais.models import checkpoint, dream_checkpoint, tiny
    from dllm_ais.models.dream import DreamConfig
    from dllm_ais.models.llada import LLaDAConfig

    if model_config.family == "dream":
        return _config_of(model_config, tiny.tiny_dream_config, dream_checkpoint.read_dream_config, DreamConfig,
                          "Dream", "Dream-7B")
    if model_config.family != "llada":
        raise ValueError(f"dllm-ais plan models diffusion (LLaDA, Dream) presets; model family "
                         f"{model_config.family!r} is not modelled yet: pick e.g. --preset llada-8b-gsm8k.")
    return _config_of(model_config, tiny.tiny_config, checkpoint.read_llada_config, LLaDAConfig, "LLaDA", "LLaDA-8B")


def _config_of(model_config, tiny_config, read_config, defaults, name: str, big: str):
    from pathlib import Path

    if model_config.path is None:
        return tiny_config(), f"tiny built-in {name}"
    local = Path(model_config.path).expanduser()
    if local.is_dir():
        return read_config(local), f"{local} (config.json)"
    return defaults(), f"{model_config.path} = {big} shape ({defaults.__name__} defaults; not downloaded)"


def _dream_shape(config, name: str) -> ModelShape:
    import torch

    from dllm_ais.models.dream import DreamModel

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


def _dream_copy_bytes(config, precision: str, dtype, fp8_backend: str) -> int:
    """Bytes of Dream's rollout copy: fp8, the fused copy the trainer builds (fp8/fused_dream.py, on the meta device:
    stacked q/k/v and gate/up FP8 codes padded to whole 128-row blocks + fp32 scales, 128×128 blocks or one per row
    for scaled_mm, + biases; the rest in `dtype`); fp4, the walker copy (dequantised fp32 weights + fp32 bias)."""
    import torch

    from dllm_ais.models.dream import DreamModel

    if precision == "fp8":
        from dllm_ais.fp8.fused_dream import FusedDream

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


@lru_cache(maxsize=16)
def model_shape(model_config) -> ModelShape:
    """Count the parameters of the preset's LLaDA (or Dream) model built on the meta device."""
    import torch

    from dllm_ais.models.llada import LLaDAModelLM

    config, name = llada_config(model_config)
    if model_config.family == "dream":
        return _dream_shape(config, name)
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


@lru_cache(maxsize=32)
def rollout_copy_bytes(model_config, precision: str, fp8_backend: str = "cublas") -> int:
    """Bytes of the quantised rollout copy the trainer builds (0 for bf16: the master itself rolls out).

    fp8: the fused copy (FusedLLaDA: e4m3 codes + fp32 block scales of the fused linears, embeddings, norms and LM
    head in the master's dtype), built on the meta device with `fp8_backend`'s scale layout (block for every backend
    but scaled_mm's per-row scales; `auto` resolves to a block backend). fp4: the emulated copy (fp4/linear.py: each
    block linear held dequantised in fp32, everything else copied in the master's dtype).
    """
    import torch

    if precision == "bf16":
        return 0
    config, _ = llada_config(model_config)
    dtype = getattr(torch, model_config.dtype)
    if model_config.family == "dream":
        return _dream_copy_bytes(config, precision, dtype, fp8_backend)
    if precision == "fp4":
        shape = model_shape(model_config)
        rest = shape.params_total - shape.params_block_linear
        return 4 * shape.params_block_linear + rest * dtype.itemsize
    from dllm_ais.fp8.fused_llada import FusedLLaDA

    backend = "scaled_mm" if fp8_backend == "scaled_mm" else "torch"  # the two scale layouts (block, row)
    copy = FusedLLaDA(config, backend, "meta", dtype, producers="torch")
    return sum(t.untyped_storage().nbytes() for t in [*copy.parameters(), *copy.buffers()])
