"""What the families' fused rollout copies share (dllm_ais/fp8/fused_copy.py): the accessors answer with each copy's
own modules and its master's mask id, and the forward variant picks the FP8 producers, in the backend's scale
scheme, for an FP8 backend and the plain forward without one."""

from __future__ import annotations

import pytest

from dllm_ais.fp8 import producers
from dllm_ais.fp8.fused_copy import forward_variant, producer_impl
from dllm_ais.models.dream.fused_fp8 import build_fused_dream
from dllm_ais.models.llada.fused_fp8 import build_fused_llada
from dllm_ais.models.sdar.fused_fp8 import build_fused_sdar
from dllm_ais.models.sdar.tiny import tiny_sdar_model
from dllm_ais.models.tiny import tiny_dream_model, tiny_model


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_each_copy_answers_with_its_own_embeddings_and_its_masters_mask_id(family):
    master, build, embed = {"llada": (tiny_model, build_fused_llada, "wte"),
                            "dream": (tiny_dream_model, build_fused_dream, "embed_tokens"),
                            "sdar": (tiny_sdar_model, build_fused_sdar, "embed_tokens")}[family]
    model = master(seed=0)
    copy = build(model, None)
    assert copy.get_input_embeddings() is getattr(copy, embed)
    assert copy.get_output_embeddings() is copy.lm_head
    assert copy.mask_token_id == model.config.mask_token_id
    if family != "dream":  # Dream's copy has no producer forward (its linears quantise their own input)
        assert copy.variant == "plain" and copy._impl is None


def test_the_fp8_producers_in_the_backends_scale_scheme():
    assert forward_variant(None, "torch") == ("plain", None)  # the model-dtype copy, and emulated FP4's
    variant, impl = forward_variant("torch", "torch")  # block scales (1×128)
    assert variant == "fp8_producers" and impl.rmsnorm_quant is producers.rmsnorm_quant
    variant, impl = forward_variant("scaled_mm", "torch")  # torch._scaled_mm's row-wise scales
    assert variant == "fp8_producers" and impl.rmsnorm_quant is producers.rmsnorm_rowquant
    block = producer_impl("block", "torch")
    assert block.rmsnorm_quant is producers.rmsnorm_quant and block.silu_mul_quant is producers.silu_mul_quant
    assert block.rope is producers.apply_rope and block.qk_norm_rope is producers.qk_norm_rope
    with pytest.raises(ValueError, match="unknown producers"):
        producer_impl("block", "cuda")
