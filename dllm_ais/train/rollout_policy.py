"""The rollout policy μ of a run: built from the BF16 master (an FP8 / FP4 copy, or the master itself for bf16) and
refilled from it after every optimizer step."""

from __future__ import annotations

from dllm_ais.config import Preset


def _fp8_rollout(master, tc, expected_m: int | None = None):
    from dllm_ais.fp8.quantize import quantize_model
    from dllm_ais.models.qwen import rollout as qwen_rollout

    if qwen_rollout.supports(master):  # Qwen3: fused static-cache rollout copy (models/qwen/rollout.py)
        return qwen_rollout.rollout_copy(master, fp8_backend=tc.fp8_backend, expected_m=expected_m)
    # `auto` is timed here, once, for expected_m activation rows (rollout batch × canvas), never while compiling
    return quantize_model(master, backend=tc.fp8_backend, expected_m=expected_m)


def _fp4_rollout(master, tc):
    from dllm_ais.fp4.linear import quantize_model

    return quantize_model(master, fmt=tc.fp4_format)


# TrainConfig.rollout_precision -> (BF16 master, TrainConfig) -> rollout policy μ (the master itself for bf16)
ROLLOUT_BUILDERS = {"bf16": lambda master, tc: master, "fp4": _fp4_rollout}  # fp8: _fp8_rollout (expected rows)


def expected_rollout_rows(preset: Preset) -> int:
    """Activation rows of one rollout forward, for `auto`'s timing: prompts × generations × (gen_length + a 64-token
    prompt guess); only its power-of-two bucket matters."""
    return preset.train.prompts_per_step * preset.grpo.num_generations * (preset.sampler.gen_length + 64)


def make_rollout_model(master, preset: Preset):
    """μ for `preset.train.rollout_precision`: the master (bf16), an emulated FP4 copy, or an FP8 copy."""
    tc = preset.train
    if tc.rollout_precision != "fp8":
        return ROLLOUT_BUILDERS[tc.rollout_precision](master, tc)
    return _fp8_rollout(master, tc, expected_m=expected_rollout_rows(preset))


def sync_rollout(master, rollout_model, fsdp: bool) -> None:
    """Refill μ's weights from the master (nothing to do when μ is the master)."""
    if rollout_model is master:
        return
    if fsdp:  # sharded master: gather one layer's full weights at a time
        from dllm_ais.train.fsdp_sync import sync_weights_sharded

        sync_weights_sharded(master, rollout_model)
        return
    from dllm_ais.fp8.sync import sync_weights  # refills FP8Linear and FP4Linear alike
    from dllm_ais.models.qwen.rollout import QwenRollout, sync_qwen_rollout

    sync = sync_qwen_rollout if isinstance(rollout_model, QwenRollout) else sync_weights
    sync(master, rollout_model)
