"""quantize_model: the FP8 rollout COPY of a model, with every `auto` layer resolved to a concrete backend.

A model of a family with a fused copy (dllm_ais/families.py `fp8_copy`; plain or peft-wrapped) gets that copy — LLaDA's
(models/llada/fused_fp8.py: fused QKV and gate-up weights, producers that emit FP8), Dream's
(models/dream/fused_fp8.py); every other model (Qwen, toy modules) gets a copy in which each block nn.Linear
(layer selection: walker.quantizable_layers) is an FP8Linear.

`auto` is resolved here, eagerly, when the copy is built (linear.resolve_auto): each layer shape (N, K) is timed once
for `expected_m` activation rows (the rollout batch × canvas length; linear.DEFAULT_EXPECTED_M when not given) and
the layer's backend is set to the winner, so the copy never times anything while torch.compile traces it.
`linear.backend_choices(copy)` returns what each layer shape runs, for the run's config / metrics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dllm_ais.families import family_of_model

from .backends import check_backend, prepare_gemm_shapes
from .linear import FP8Linear, check_layer_shape, resolve_auto
from .walker import quantized_copy


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

    A model of a family with a fused copy (LLaDA, Dream; plain or peft-wrapped) gets that copy instead (the family's
    `fp8_copy`, e.g. models/llada/fused_fp8.py), unless `exclude` is given (then: the per-Linear copy above). backend
    "auto" is resolved per layer shape for `expected_m` activation rows (module docstring).
    """
    check_backend(backend)
    family = family_of_model(model)  # a family with a fused copy builds it (None: `model` is not its master)
    if exclude is None and family is not None and family.fp8_copy is not None:
        copy = family.fp8_copy(model, backend, expected_m=expected_m)
        if copy is not None:
            return copy

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
