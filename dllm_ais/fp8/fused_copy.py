"""What every family's fused rollout copy shares (models/llada|dream|sdar/fused_fp8.py): the producer functions of its
FP8 forward, chosen once at build time, and the accessors its callers use (the sampler's mask id, the embeddings).
Each family keeps its own layers, forward, `sync_from` and build functions."""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn

from dllm_ais.fp8 import producers
from dllm_ais.fp8.backends import BACKENDS, PRODUCERS


def producer_impl(scheme: str, kind: str) -> SimpleNamespace:
    """The producer functions of an FP8 fused forward: each emits the activation codes + scales its consumer GEMM
    reads, in that GEMM's scheme ("block": 1×128 scales [M, G] with stride (1, M), what cuBLAS's blockwise mode and
    the Triton GEMM read as is; "row": [M, 1], torch._scaled_mm's row-wise mode). rmsnorm_quant, silu_mul_quant,
    attn_out_quant; rope (LLaDA, Dream) and qk_norm_rope (SDAR's per-head norms, model-dtype heads for SDPA)."""
    if kind not in PRODUCERS:
        raise ValueError(f"unknown producers {kind!r}; choose one of {', '.join(PRODUCERS)}")
    if kind == "triton":
        from dllm_ais.fp8 import ops as impl  # Triton: producer_kernels.py, row_producer_kernels.py

        rope = impl.rope
    else:
        impl, rope = producers, producers.apply_rope
    suffix = "quant" if scheme == "block" else "rowquant"
    return SimpleNamespace(rmsnorm_quant=getattr(impl, f"rmsnorm_{suffix}"),
                           silu_mul_quant=getattr(impl, f"silu_mul_{suffix}"),
                           attn_out_quant=getattr(impl, f"attn_out_{suffix}"), rope=rope,
                           qk_norm_rope=impl.qk_norm_rope)


def forward_variant(backend: str | None, kind: str) -> tuple[str, SimpleNamespace | None]:
    """("fp8_producers", its producer functions) when `backend` has an FP8 GEMM, else ("plain", None): the model-dtype
    copy (backend None) and the linears that quantise their own input (emulated FP4)."""
    if backend is not None and BACKENDS[backend].gemm is not None:
        return "fp8_producers", producer_impl(BACKENDS[backend].scheme, kind)
    return "plain", None


class FusedCopy(nn.Module):
    """Base of the fused rollout copies: `config.mask_token_id` as the sampler asks for it, and the embeddings under
    transformers' accessor names (the token embedding is the attribute `input_embeddings_name`, the head `lm_head`)."""

    input_embeddings_name = "embed_tokens"
    """The attribute holding the token embedding (LLaDA's official layout: wte)."""

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def get_input_embeddings(self) -> nn.Embedding:
        return getattr(self, self.input_embeddings_name)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head
