"""quantize_model: the FP8 rollout COPY of a model, with every `auto` layer resolved to a concrete backend.

An LLaDAModelLM (plain or peft-wrapped) gets the fused inference copy (fp8/fused_llada.py: fused QKV and gate-up
weights, producers that emit FP8), a DreamModel its fused copy (fp8/fused_dream.py); every other model (Qwen,
toy modules) gets a copy in which each block nn.Linear
(layer selection: walker.quantizable_layers) is an FP8Linear.

`auto` is resolved here, eagerly, when the copy is built (linear.resolve_auto): each layer shape (N, K) is timed once
for `expected_m` activation rows (the rollout batch × canvas length; linear.DEFAULT_EXPECTED_M when not given) and
the layer's backend is set to the winner, so the copy never times anything while torch.compile traces it.
`linear.backend_choices(copy)` returns what each layer shape runs, for the run's config / metrics.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn

from .backends import check_backend, prepare_gemm_shapes
from .linear import FP8Linear, check_layer_shape, resolve_auto
from .walker import quantized_copy


def _llada_master(model: nn.Module) -> nn.Module | None:
    """The LLaDAModelLM in `model` (itself or under peft), or None; without importing models.llada (if it is not
    imported, `model` cannot be one)."""
    if "dllm_ais.models.llada" not in sys.modules:
        return None
    from .fused_llada import llada_master

    return llada_master(model)


def _dream_master(model: nn.Module) -> nn.Module | None:
    """The DreamModel in `model` (itself or under peft), or None; without importing models.dream needlessly."""
    if "dllm_ais.models.dream" not in sys.modules:
        return None
    from .fused_dream import dream_master

    return dream_master(model)


@torch.no_grad()
def quantize_model(
    model: nn.Module,
    backend: str = "torch",
    exclude: Callable[[str], bool] | None = None,
    expected_m: int | None = None,
) -> nn.Module:
    """Return an FP8 rollout COPY of `model` (in eval mode, requires_grad off); `model` itself is untouched.

    Every nn.Linear (or peft LoRA-wrapped nn.Linear, merged) becomes an FP8Linear on `backend`, except the module
    `model.get_output_embeddings()` returns (the LM head; matched by identity, never by name — LLaDA's head and its
    MLP down projections are all called `ff_out`) and layers whose canonical qualified name satisfies `exclude`.
    Embeddings, norms and everything that is not an nn.Linear are copied unchanged.
    Raises FP8BackendError / FP8LayerError, naming the backend or layer and the alternatives, before copying anything.

    An LLaDAModelLM (plain or peft-wrapped) gets the fused inference copy instead (fp8/fused_llada.py), a DreamModel
    fp8/fused_dream.py's, unless `exclude` is given (then: the per-Linear copy above). backend "auto" is resolved
    per layer shape for `expected_m` activation rows (module docstring).
    """
    check_backend(backend)
    if exclude is None and _llada_master(model) is not None:
        from .fused_llada import build_fused_llada

        return build_fused_llada(model, backend, expected_m=expected_m)
    if exclude is None and _dream_master(model) is not None:
        from .fused_dream import build_fused_dream

        return build_fused_dream(model, backend, expected_m=expected_m)

    def check(name: str, linear: nn.Linear) -> None:
        check_layer_shape(name, linear.in_features, linear.out_features)
        check_backend(backend, linear.weight.device)

    def make(name: str, module: nn.Module) -> nn.Module:
        return FP8Linear.from_linear(module, backend, name=name)

    rollout = quantized_copy(model, make, exclude, check)
    resolve_auto(rollout, expected_m, kind="forward")
    if expected_m:  # cuBLAS's acceptance of the expected row count, decided now and recorded on each layer
        prepare_gemm_shapes(rollout, [expected_m])
    return rollout
