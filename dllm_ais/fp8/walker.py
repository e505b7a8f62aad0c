"""Walking a model's linear layers for a quantised rollout copy (FP8, FP4): which layers a copy replaces, LoRA
merged on the fly, names compared across peft wrapping, and the memory-frugal copy itself.

peft LoRA: a LoRA-wrapped Linear (a module with `base_layer`, `lora_A`, `lora_B`, `get_delta_weight`, as peft makes)
counts as one linear layer whose weight is W + Σ_active scaling·B@A, merged on the fly exactly as peft's merge rounds
it, without touching the master. Module names are compared after removing peft's `base_model.model.` prefix and
`.base_layer` components, so a copy made from the plain model syncs from its LoRA-wrapped master and vice versa.

Nothing here knows a number format: quantized_copy builds a copy with any layer factory (fp8/quantize.py,
fp4/linear.py), sync.py refills it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import torch
from torch import nn


def is_lora_layer(module: nn.Module) -> bool:
    return (
        isinstance(getattr(module, "base_layer", None), nn.Linear)
        and hasattr(module, "lora_A")
        and hasattr(module, "get_delta_weight")
    )


def is_linear(module: nn.Module) -> bool:
    # nn.MultiheadAttention reads out_proj.weight directly, so its (NonDynamicallyQuantizable) Linear must stay.
    return isinstance(module, nn.Linear) and not isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear)


def linear_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Qualified name -> nn.Linear or LoRA-wrapped nn.Linear (not descending into LoRA layers; the root is skipped)."""
    found: dict[str, nn.Module] = {}

    def walk(prefix: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            name = f"{prefix}.{child_name}" if prefix else child_name
            if is_lora_layer(child) or is_linear(child):
                found[name] = child
            else:
                walk(name, child)

    walk("", model)
    return found


def canonical_name(name: str, peft_root: bool = False) -> str:
    """Drop peft's `base_model.model.` root prefix (when peft_root) and its `base_layer` components."""
    parts = name.split(".")
    if peft_root and parts[:2] == ["base_model", "model"]:
        parts = parts[2:]
    return ".".join(p for p in parts if p != "base_layer")


def is_peft_root(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def effective_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (weight [N, K], bias [N] | None) a linear layer applies; for a LoRA layer W + Σ scaling·B@A, computed
    adapter by adapter and rounded to W's dtype exactly as peft's merge does, without modifying the module."""
    if not is_lora_layer(module):
        return module.weight, module.bias
    base = module.base_layer
    weight, bias = base.weight, base.bias
    if getattr(module, "disable_adapters", False):
        return weight, bias
    merged = set(getattr(module, "merged_adapters", []))
    for adapter in module.active_adapters:
        if adapter not in module.lora_A.keys() or adapter in merged:
            continue
        if adapter in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(adapter, False):
            raise NotImplementedError(
                f"adapter {adapter!r} is a LoRA variant (e.g. DoRA); only vanilla LoRA is "
                "merged on the fly. Merge it into a copy of the model before quantising."
            )
        weight = (weight + module.get_delta_weight(adapter)).to(base.weight.dtype)
        if getattr(module, "lora_bias", {}).get(adapter, False):
            bias = (bias + module.lora_B[adapter].bias * module.scaling[adapter]).to(base.bias.dtype)
    return weight, bias


def base_linear(module: nn.Module) -> nn.Linear:
    return module.base_layer if is_lora_layer(module) else module


def named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


def _copy_memo(model: nn.Module, replaced: list[str]) -> dict[int, object]:
    """A deepcopy memo that stands a placeholder in for the parameters of layers about to be replaced, so that copying
    never duplicates the big linear weights (peak memory: master + FP8 copy, not twice the master). Parameters that
    are also used outside those layers (tied weights) are copied normally."""
    prefixes = tuple(f"{name}." for name in replaced)
    inside, outside = set(), set()
    for name, p in model.named_parameters(remove_duplicate=False):
        (inside if name.startswith(prefixes) else outside).add(id(p))
    placeholder = nn.Parameter(torch.empty(0, device="meta"), requires_grad=False)
    return {i: placeholder for i in inside - outside}


def quantizable_layers(model: nn.Module, exclude: Callable[[str], bool] | None = None) -> dict[str, nn.Module]:
    """Qualified name -> nn.Linear or LoRA-wrapped nn.Linear that a quantised rollout copy replaces: every one except
    the module `model.get_output_embeddings()` returns (the LM head, matched by identity) and those whose canonical
    name satisfies `exclude`."""
    peft_root = is_peft_root(model)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return {name: module for name, module in linear_layers(model).items()
            if not (head is not None and (module is head or getattr(module, "base_layer", None) is head))
            and not (exclude is not None and exclude(canonical_name(name, peft_root)))}


@torch.no_grad()
def quantized_copy(
    model: nn.Module,
    make_layer: Callable[[str, nn.Module], nn.Module],
    exclude: Callable[[str], bool] | None = None,
    check: Callable[[str, nn.Linear], None] | None = None,
) -> nn.Module:
    """A copy of `model` (eval mode, requires_grad off) in which every block linear is replaced by
    make_layer(qualified name, linear or LoRA-wrapped linear) — the layer selection quantize_model documents (LM head
    and `exclude`d canonical names kept). `check(canonical name, base nn.Linear)` runs on every target first and may
    raise before anything is copied."""
    targets = quantizable_layers(model, exclude)
    if check is not None:
        peft_root = is_peft_root(model)
        for name, module in targets.items():
            check(canonical_name(name, peft_root), base_linear(module))

    rollout = copy.deepcopy(model, _copy_memo(model, list(targets)))
    for name, module in targets.items():
        _set_submodule(rollout, name, make_layer(name, module))
    rollout.requires_grad_(False)
    return rollout.eval()
