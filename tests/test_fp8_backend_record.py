"""A training run records the FP8 backend each rollout layer shape runs (`auto` resolved when the copy is built, for
the rollout's expected rows), in <run>/fp8_backends.json."""

from __future__ import annotations

import json
from dataclasses import replace

from dllm_ais.presets import get_preset
from dllm_ais.train.job import run_training


def test_run_records_resolved_fp8_backends(tmp_path):
    p = get_preset("tiny-cpu")
    train = replace(p.train, steps=1, prompts_per_step=2, sft_steps=1, sft_batch_size=4, mismatch_num_draws=1,
                    rollout_precision="fp8", fp8_backend="auto")
    run_training(replace(p, train=train, grpo=replace(p.grpo, num_generations=2, num_iterations=1)), tmp_path / "r",
                 progress=False)
    recorded = json.loads((tmp_path / "r" / "fp8_backends.json").read_text())
    assert len(recorded) >= 3 and set(recorded.values()) == {"torch"}  # qkv, attn_out, gate_up, ff_out; CPU: torch
    assert all("x" in shape and all(part.isdigit() for part in shape.split("x")) for shape in recorded)
