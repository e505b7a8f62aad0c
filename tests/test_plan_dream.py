"""`dllm-ais plan` counts a Dream on the meta device: Dream-7B's ≈ 7.6 B parameters with its GQA KV width, the tiny
Dream's counts equal the real module's, and the walker FP8 / FP4 copy bytes equal a real copy's."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.config import ModelConfig
from dllm_ais.fp4.linear import quantize_model as quantize_fp4
from dllm_ais.fp8 import quantize_model
from dllm_ais.models.tiny import tiny_dream_model
from dllm_ais.plan.shape import model_shape, rollout_copy_bytes
from dllm_ais.presets import get_preset


def test_dream_7b_preset_shape():
    shape = model_shape(get_preset("dream-7b-gsm8k").model)
    assert shape.family == "dream" and 7.5e9 < shape.params_total < 7.7e9  # Qwen2.5-7B geometry: 7.62 B
    assert (shape.d_model, shape.n_layers, shape.n_heads, shape.n_kv_heads) == (3584, 28, 28, 4)
    assert shape.kv_dim == 512 and shape.vocab == 152064
    assert shape.params_embedding == shape.params_head == 152064 * 3584  # untied


def test_tiny_dream_shape_counts_the_real_module():
    shape = model_shape(ModelConfig(family="dream"))
    m = tiny_dream_model()
    assert shape.params_total == sum(p.numel() for p in m.parameters())
    linears = [mod for mod in m.model.layers.modules() if isinstance(mod, torch.nn.Linear)]
    assert shape.params_block_linear == sum(mod.weight.numel() for mod in linears)
    assert shape.lora_in_out == sum(mod.in_features + mod.out_features for mod in linears)


def _bytes(model) -> int:
    return sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()])


@pytest.mark.parametrize("precision,backend", [("fp8", "torch"), ("fp8", "scaled_mm"), ("fp4", "torch")])
def test_dream_copy_bytes_equal_a_real_copy(precision, backend):
    cfg = ModelConfig(family="dream", dtype="float32")
    master = tiny_dream_model()
    if precision == "fp4":
        copy = quantize_fp4(master, fmt="nvfp4")
    else:  # torch: 128×128 block scales; scaled_mm: one scale per row (torch._scaled_mm runs on CPU)
        copy = quantize_model(master, backend=backend)
    assert rollout_copy_bytes(cfg, precision, backend) == _bytes(copy)


@pytest.mark.parametrize("task", ["gsm8k", "math", "countdown", "sudoku"])
def test_each_dream_7b_task_preset_is_d1s_settings_on_dream(task):
    from dllm_ais.plan.predict import make_plan

    dream, llada = get_preset(f"dream-7b-{task}"), get_preset(f"llada-8b-{task}")
    assert dream.model.family == "dream" and dream.train.task == llada.train.task
    assert (dream.grpo, dream.train.lora_r) == (llada.grpo, llada.train.lora_r)
    plan = make_plan(dream, "h100")
    assert plan.fits and plan.workload.rows == llada.train.prompts_per_step * llada.grpo.num_generations
