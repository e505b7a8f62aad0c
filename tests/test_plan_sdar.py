"""`dllm-ais plan` counts an SDAR on the meta device (models/sdar/shape.py): SDAR-8B's ≈ 8.2 B parameters with its
GQA KV width, the tiny SDAR's counts equal the real module's, the FP8 / FP4 rollout copy bytes equal a real copy's;
the sdar-8b-gsm8k and trado-8b-math presets carry TraDo's RL settings and get a plan."""

from __future__ import annotations

import pytest
import torch

from dllm_ais.config import ModelConfig
from dllm_ais.fp4.linear import quantize_model as quantize_fp4
from dllm_ais.fp8 import quantize_model
from dllm_ais.models.sdar.tiny import tiny_sdar_model
from dllm_ais.plan.shape import model_shape, rollout_copy_bytes
from dllm_ais.presets import get_preset


def test_sdar_8b_preset_shape():
    shape = model_shape(get_preset("sdar-8b-gsm8k").model)
    assert shape.family == "sdar" and 8.1e9 < shape.params_total < 8.3e9  # Qwen3-8B geometry: 8.19 B
    assert (shape.d_model, shape.n_layers, shape.n_heads, shape.n_kv_heads) == (4096, 36, 32, 8)
    assert shape.kv_dim == 1024 and shape.vocab == 151936
    assert shape.params_embedding == shape.params_head == 151936 * 4096  # untied


def test_tiny_sdar_shape_counts_the_real_module():
    shape = model_shape(ModelConfig(family="sdar"))
    m = tiny_sdar_model()
    assert shape.params_total == sum(p.numel() for p in m.parameters())
    linears = [mod for mod in m.model.layers.modules() if isinstance(mod, torch.nn.Linear)]
    assert shape.params_block_linear == sum(mod.weight.numel() for mod in linears)
    assert shape.lora_in_out == sum(mod.in_features + mod.out_features for mod in linears)


def _bytes(model) -> int:
    return sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()])


@pytest.mark.parametrize("precision,backend", [("fp8", "torch"), ("fp8", "scaled_mm"), ("fp4", "torch")])
def test_sdar_copy_bytes_equal_a_real_copy(precision, backend):
    cfg = ModelConfig(family="sdar", dtype="float32")
    master = tiny_sdar_model()
    copy = quantize_fp4(master, fmt="nvfp4") if precision == "fp4" else quantize_model(master, backend=backend)
    assert rollout_copy_bytes(cfg, precision, backend) == _bytes(copy)


@pytest.mark.parametrize("name", ["sdar-8b-gsm8k", "trado-8b-math"])
def test_the_sdar_presets_carry_trados_rl_settings_and_get_a_plan(name):
    from dllm_ais.plan.predict import make_plan
    from dllm_ais.plan.report import format_plan

    p = get_preset(name)
    assert p.model.family == "sdar" and p.train.lora_r == 0  # TraDo trains every weight
    assert (p.sampler.block_length, p.sampler.steps // p.sampler.num_blocks, p.sampler.sdar_threshold) == (4, 4, 0.9)
    assert (p.train.prompts_per_step, p.grpo.num_generations, p.train.learning_rate) == (64, 16, 1e-6)
    assert (p.grpo.epsilon, p.grpo.beta, p.train.policy_logprob) == (0.2, 0.01, "trajectory")
    plan = make_plan(p, "h100")
    assert plan.workload.rows == 64 * 16
    assert plan.workload.replay_steps == 2 * 4  # the path law: 4 two-stream forwards (2 canvases each) a sequence
    # SDAR records no per-token log μ: log μ is a replay on the rollout copy; at shrink 1 the trajectory ratio is
    # π_old's replay minus it (no more replays); under a shrink the ratio replays the exact law on both copies
    from dataclasses import replace

    from dllm_ais.plan.workload import likelihood_passes

    names = [(ps.what, ps.model) for ps in likelihood_passes(plan.workload)]
    assert any(n.startswith("log μ (same masks)") and m == "rollout" for n, m in names), names
    assert not any(n.startswith("mismatch") for n, _ in names), names
    shrunk = make_plan(replace(p, train=replace(p.train, trajectory_merge=2)), "h100")
    names = [(ps.what, ps.model) for ps in likelihood_passes(shrunk.workload)]
    assert ("mismatch replay of π_old", "master") in names and ("mismatch replay of μ", "rollout") in names, names
    assert "SDAR-8B" in format_plan(plan, p)  # the report renders (no Fast-dLLM cache offered to SDAR)


def test_the_plan_counts_tracerl_shrink_per_block_as_the_replay_runs(monkeypatch):
    """TraceRL's shrink k groups each block's local steps (models/sdar/trajectory.py), so a path-law replay runs
    ⌈S / k⌉ two-stream forwards (2 canvases each): the plan counted ⌈2S / k⌉ canvases before (3 for S = 4, k = 3,
    where 4 run). The forwards are counted on a real replay of a tiny SDAR at the same S and k."""
    from dataclasses import replace

    import dllm_ais.models.sdar.trajectory as traj
    from dllm_ais.models.sdar.backend import build_backend
    from dllm_ais.plan.predict import make_plan

    p = get_preset("trado-8b-math")
    p = replace(p, train=replace(p.train, trajectory_merge=3))
    S = p.sampler.steps // p.sampler.num_blocks
    assert S == 4
    draws = make_plan(p, "h100").workload.policy_draws
    assert draws == 2 * 2  # 2 · ⌈4 / 3⌉

    tiny = get_preset("tiny-sdar")
    sampler = replace(tiny.sampler, steps=S * tiny.sampler.num_blocks, sdar_strategy="low_confidence_static")
    model = tiny_sdar_model(seed=0)
    backend = build_backend(sampler, model, None, replace(tiny.train, policy_logprob="trajectory", trajectory_merge=3))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 100, (2, 5), generator=g)
    rollout = backend.sample(model, prompt, torch.ones_like(prompt, dtype=torch.bool), g)
    calls = []
    forward = traj.two_stream_logits
    monkeypatch.setattr(traj, "two_stream_logits", lambda *a, **k: calls.append(1) or forward(*a, **k))
    with torch.no_grad():
        backend.token_logp(model, rollout, 0)
    assert 2 * len(calls) == draws  # two canvases a two-stream forward


@pytest.mark.parametrize("prompt_len", [8, 6, 7, 3])  # whole prompt blocks; a tail of 2, 3 (fewer first steps), 3
def test_the_plan_counts_sdars_cached_rollout_forwards_as_the_sampler_runs(prompt_len):
    """SDAR's rollout is the prefill, S cached block steps and one store pass per block (Family.plan_rollout_passes),
    not a full-canvas forward per step: the plan's calls equal a real tiny rollout's NFE (static strategy: every
    step of a block runs), its KV cache is counted, and the rollout's per-step work is one block, not the canvas."""
    from dataclasses import replace

    from dllm_ais.models.sdar.backend import build_backend
    from dllm_ais.plan.predict import make_plan
    from dllm_ais.plan.workload import rollout_passes

    p = get_preset("tiny-sdar")
    p = replace(p, sampler=replace(p.sampler, sdar_strategy="low_confidence_static"))
    plan = make_plan(p, "h100")
    w = replace(plan.workload, rollout_prompt_len=prompt_len, rows=2)
    passes = rollout_passes(w)
    backend = build_backend(p.sampler, tiny_sdar_model(seed=0), None)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 100, (2, prompt_len), generator=g)
    rollout = backend.sample(tiny_sdar_model(seed=0), prompt, torch.ones_like(prompt, dtype=torch.bool), g)
    assert sum(ps.calls for ps in passes) == rollout.nfe
    assert all(ps.tokens <= max(p.sampler.block_length, prompt_len) for ps in passes)
    assert plan.memory.kv_cache > 0


@pytest.mark.parametrize("policy", ["elbo", "ebpo"])
def test_the_plan_counts_an_elbo_draw_as_one_two_stream_forward_of_two_canvases(monkeypatch, policy):
    """SDAR's block ELBO and EBPO score each mask draw with one two-stream [x_t | x_0] forward (twice the canvas), as
    its path-law replay scores a step: the plan counts 2 canvases a draw (it counted 1 before, half what runs). The
    forwards are counted on a real evaluation of a tiny SDAR: each call's rows per sequence, times 2 canvases."""
    from dataclasses import replace

    import dllm_ais.models.sdar.likelihood as lik
    from dllm_ais.models.sdar.backend import build_backend
    from dllm_ais.plan.predict import make_plan

    tiny = get_preset("tiny-sdar")
    train = replace(tiny.train, policy_logprob=policy, likelihood=replace(tiny.train.likelihood, elbo_draws=3))
    p = replace(tiny, train=train)
    draws = make_plan(p, "h100").workload.policy_draws
    assert draws == 2 * 3

    sampler = replace(tiny.sampler, sdar_strategy="low_confidence_static")
    model = tiny_sdar_model(seed=0)
    backend = build_backend(sampler, model, None, train)
    g = torch.Generator().manual_seed(0)
    B = 2
    prompt = torch.randint(5, 100, (B, 5), generator=g)
    rollout = backend.sample(model, prompt, torch.ones_like(prompt, dtype=torch.bool), g)
    rows = []
    forward = lik.two_stream_logits
    monkeypatch.setattr(lik, "two_stream_logits", lambda m, noisy, *a, **k: rows.append(noisy.shape[0]) or forward(
        m, noisy, *a, **k))
    with torch.no_grad():
        backend.token_logp(model, rollout, 0)
    assert rows and 2 * sum(rows) == draws * B
