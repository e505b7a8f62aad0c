"""`dllm-ais plan` against measurements: one real RL step of the default preset (the tiny model, CPU) with every live
tensor storage counted (dllm_ais/plan/live_bytes.py) and every model forward recorded (tiny-dream's too), and one
LLaDA-8B-wide block on the meta device.

Bounds (docs/plan.md, "Validated"): the parts alive through the step within 1 %; the peak of the whole step, of the
update, and (bf16 rollouts) of the rollout and likelihood phases within 5 %; forward rows per phase exactly; the bytes
one 8B-wide block saves for backward within 1 %; the fused FP8 copy's forward working set within 2 %.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import replace

import pytest
import torch

from dllm_ais.models.llada.model import LLaDAConfig, LLaDAModelLM, lora_target_regex
from dllm_ais.plan.live_bytes import LiveBytes
from dllm_ais.plan.memory import layer_saved_bytes
from dllm_ais.plan.predict import make_plan
from dllm_ais.plan.shape import model_shape
from dllm_ais.plan.workload import step_passes
from dllm_ais.presets import get_preset


class _Stages:
    """Live-byte peak of each trainer stage (above the bytes alive when it starts), the peak over all of them
    (`outer`), and the stage now running."""

    def __init__(self, live: LiveBytes):
        self.live, self.peaks, self.now, self.outer = live, {}, "setup", 0

    def wrap(self, fn, label: str):
        def run(*a, **k):
            before, self.now = self.now, label
            self.outer = max(self.outer, self.live.peak)
            self.live.reset_peak()
            base = self.live.now
            try:
                return fn(*a, **k)
            finally:
                self.peaks[label] = max(self.peaks.get(label, 0), self.live.peak - base)
                self.outer = max(self.outer, self.live.peak)
                self.now = before

        return run


class _Sampling:
    """A backend whose `sample` runs as the rollout stage."""

    def __init__(self, inner, stages: _Stages):
        self.inner, self.sample = inner, stages.wrap(inner.sample, "rollout")

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _run_steps(preset, steps: int = 2) -> dict:
    """Trainer.train_step of `preset` on CPU (no SFT), `steps` times (AdamW's states exist from the second on): of the
    last step, the live-byte peak of each trainer stage and of the step, the bytes alive after it, and (stage,
    model, rows, tokens) of every model forward."""
    from dllm_ais.models.dream.backend import build_backend as _dream_backend
    from dllm_ais.models.dream.fused_fp8 import FusedDream
    from dllm_ais.models.dream.model import DreamModel
    from dllm_ais.models.llada.backend import build_backend as _llada_backend
    from dllm_ais.models.llada.fused_fp8 import FusedLLaDA
    from dllm_ais.models.tiny import tiny_dream_model, tiny_model, tiny_tokenizer
    from dllm_ais.train.job import task_rows_and_reward
    from dllm_ais.train.run_dir import RunDir
    from dllm_ais.train.trainer import Policy, Trainer

    dream = preset.model.family == "dream"
    model = (tiny_dream_model if dream else tiny_model)(0, dtype=getattr(torch, preset.model.dtype))
    tok = tiny_tokenizer()
    _, rows, reward = task_rows_and_reward(preset)
    forwards = []
    with LiveBytes(*model.parameters()) as live, tempfile.TemporaryDirectory() as out:
        stages = _Stages(live)
        backend = _Sampling((_dream_backend if dream else _llada_backend)(preset.sampler, model, tok, preset.train),
                            stages)
        policy = Policy(model=model, tokenizer=tok, backend=backend, save_model=None, load_model_state=None)
        trainer = Trainer(preset, policy, RunDir(out), reward, rows, progress=False)
        names = {id(trainer.master): "master", id(trainer.rollout_model): "rollout",
                 id(trainer.ref_model): "reference"}

        def record(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            forwards.append((stages.now, names[id(module)], ids.shape[0], ids.shape[1]))

        handles = [m.register_forward_pre_hook(record, with_kwargs=True) for m in
                   {id(m): m for m in (trainer.master, trainer.rollout_model, trainer.ref_model)
                    if isinstance(m, (LLaDAModelLM, FusedLLaDA, DreamModel, FusedDream))}.values()]
        for method, label in (("_old_logp", "likelihood"), ("_correction", "likelihood"),
                              ("_ref_logp", "likelihood"), ("_update", "train"), ("_sync_rollout", "sync")):
            setattr(trainer, method, stages.wrap(getattr(trainer, method), label))
        for _ in range(steps):
            forwards.clear()
            stages.peaks.clear()
            live.reset_peak()
            stages.outer = 0
            trainer.train_step()
            trainer.step += 1
        live.sweep()
        step_peak = max(stages.outer, live.peak)
        for h in handles:
            h.remove()
        return {"peaks": stages.peaks, "step_peak": step_peak, "alive": live.now, "forwards": forwards}


@pytest.fixture(scope="module")
def tiny_step():
    preset = get_preset("tiny-cpu")
    plan = make_plan(preset, "h100", device="cpu")
    return preset, plan, _run_steps(preset)


def test_forward_rows_per_phase_are_exactly_the_predicted_ones(tiny_step):
    _, plan, measured = tiny_step
    got = Counter()
    for phase, model, rows, tokens in measured["forwards"]:
        got[(phase, model, rows, tokens)] += 1
    want = Counter()
    for p in step_passes(plan.workload):
        model = "master" if p.model == "rollout" and plan.workload.rollout_precision == "bf16" else p.model
        want[(p.phase, model, p.rows, p.tokens)] += p.calls
    assert got == want
    assert sum(r for _, _, r, _ in measured["forwards"]) == sum(p.row_passes for p in step_passes(plan.workload))


def test_the_parts_alive_through_the_step_are_predicted_within_1_percent(tiny_step):
    _, plan, measured = tiny_step
    predicted = plan.memory.fixed  # master + AdamW states + reference copy + FP8 copy
    assert measured["alive"] == pytest.approx(predicted, rel=0.01)


def test_the_step_and_update_peaks_are_predicted_within_5_percent(tiny_step):
    _, plan, measured = tiny_step
    m = plan.memory
    # the update: one micro-batch's activations and the gradients, above what lives through the step
    assert measured["peaks"]["train"] == pytest.approx(m.train_activations + m.gradients, rel=0.05)
    # the whole step: the update sets the peak of the tiny model
    assert m.peak_phase == "train"
    assert measured["step_peak"] == pytest.approx(m.peak, rel=0.05)


@pytest.mark.parametrize("lora_r", [0, 128])
def test_an_8b_wide_block_saves_the_predicted_bytes(lora_r):
    """A one-block LLaDA of LLaDA-8B's width (bf16, weights left at zero, on CPU: its SDPA is the flash kernel that
    GPUs run too, where the meta device's would be the math path), 2 × 8 tokens: what the storages alive grow by over
    the block's forward, its output aside, is what the block saves for backward. (The block is the first one: under
    LoRA its input, the frozen embedding's output, needs no gradient.)"""
    shape = model_shape(get_preset("llada-8b-gsm8k").model)
    config = LLaDAConfig(n_layers=1, vocab_size=256, embedding_size=256, mask_token_id=0, eos_token_id=1,
                         pad_token_id=1, bos_token_id=2, eot_token_id=3)
    with torch.device("meta"):
        model = LLaDAModelLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    if lora_r:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=64.0, target_modules=lora_target_regex()))
    block = next(m for m in model.modules() if type(m).__name__ == "LLaDABlock")
    B, T = 2, 8
    ids, mask = torch.zeros(B, T, dtype=torch.long), torch.ones(B, T, dtype=torch.bool)
    grown = []
    with LiveBytes(*model.parameters(), ids, mask) as live:
        def before(module, args):
            live.sweep()
            grown.append(-live.now)

        def after(module, args, out):
            live.sweep()
            grown[-1] += live.now - out.untyped_storage().nbytes()

        block.register_forward_pre_hook(before)
        block.register_forward_hook(after)
        model(input_ids=ids, attention_mask=mask, positions=slice(T - 1, None))
    norm_weights = (1 if lora_r else 2) * 4 * shape.d_model  # the fp32 copies of the norm weights it keeps
    predicted = B * T * layer_saved_bytes(shape, 2, lora_r, first=True) + norm_weights
    assert grown == [pytest.approx(predicted, rel=0.01)]


@pytest.mark.slow
def test_the_fused_fp8_copy_on_triton_producers_uses_the_predicted_working_set():
    """The fused FP8 copy as a GPU runs it (Triton producers and GEMM, here under TRITON_INTERPRET on CPU: the same
    allocations), bf16, one 16-token row: its forward's peak per token is memory.fused_working_set's."""
    from dllm_ais.models.llada.fused_fp8 import build_fused_llada
    from dllm_ais.models.tiny import tiny_model
    from dllm_ais.plan.memory import fused_working_set

    copy = build_fused_llada(tiny_model(0, dtype=torch.bfloat16), "triton", producers="triton")
    ids, mask = torch.randint(5, 100, (1, 16)), torch.ones(1, 16, dtype=torch.bool)
    with torch.no_grad(), LiveBytes(ids, mask) as live:
        copy(input_ids=ids, attention_mask=mask, positions=slice(12, None))
    per_token = (live.peak - ids.untyped_storage().nbytes() - mask.untyped_storage().nbytes()) / 16
    assert per_token == pytest.approx(fused_working_set(model_shape(get_preset("tiny-cpu").model), 2), rel=0.02)


def test_with_bf16_rollouts_the_rollout_and_likelihood_phases_are_predicted_within_5_percent():
    """With bf16 rollouts the master samples and scores (on CPU the FP8 copy runs its producers' torch twins, whose
    working set the plan does not model: docs/plan.md): the rollout phase is the master's no-grad working set (or the
    sampler's tail), the likelihood phase its largest no-grad pass."""
    preset = get_preset("tiny-cpu")
    preset = replace(preset, train=replace(preset.train, rollout_precision="bf16"))
    plan = make_plan(preset, "h100", device="cpu")
    measured = _run_steps(preset, steps=1)
    assert plan.memory.rollout_copy == 0
    assert measured["peaks"]["rollout"] == pytest.approx(plan.memory.rollout_activations, rel=0.05)
    assert measured["peaks"]["likelihood"] == pytest.approx(plan.memory.likelihood_activations, rel=0.05)


def _policy_preset(name: str):
    base = get_preset("tiny-cpu")
    likelihood = replace(base.train.likelihood, elbo_draws=2) if name in ("elbo", "spg") else base.train.likelihood
    grpo = replace(base.grpo, beta=0.0) if name == "spg" else base.grpo  # SPG trains without a KL term
    train = replace(base.train, policy_logprob=name, likelihood=likelihood)
    if name in ("mdpo", "dtreerpo"):  # several rows per sequence: an eighth of the batch keeps the test short
        train = replace(train, prompts_per_step=2, likelihood=replace(likelihood, mdpo_steps=3))
    return replace(base, train=train, grpo=grpo)


def _rows_by(counts) -> Counter:
    out = Counter()
    for key, n in counts:
        out[key[:2]] += key[2] * n
    return out


def _measured_and_planned(preset, plan) -> tuple[Counter, Counter]:
    """(phase, model, rows, tokens) -> forward calls of one real step, and as the plan counts them (a checkpointed
    update's forward runs twice)."""
    measured = _run_steps(preset, steps=1)
    got = Counter((phase, model, rows, tokens) for phase, model, rows, tokens in measured["forwards"])
    want = Counter()
    for p in step_passes(plan.workload):
        want[(p.phase, p.model, p.rows, p.tokens)] += p.calls * (2 if p.recompute else 1)
    return got, want


@pytest.mark.parametrize("name", ["elbo", "spg", "coupled", "trajectory", "mdpo", "dtreerpo"])
def test_forward_rows_of_each_policy_likelihood_are_the_planned_ones(name):
    """The plan knows what each --policy-logprob runs: mask-draw calls of 64 rows per draw (elbo, spg: exact), the
    three coupled canvases, MDPO's recorded canvases (min(--mdpo-steps, steps)), d-TreeRPO's segments and the
    replayed trajectory steps (upper bounds: canvases with nothing to score are skipped), π_old and the reference
    once per step for a trajectory, and a checkpointed update (forward twice)."""
    preset = _policy_preset(name)
    plan = make_plan(preset, "h100", device="cpu")
    got, want = _measured_and_planned(preset, plan)
    assert any(p.recompute for p in step_passes(plan.workload))
    if name in ("elbo", "spg"):
        assert got == want
        return
    got_rows, want_rows = _rows_by(got.items()), _rows_by(want.items())
    assert set(got_rows) == set(want_rows)
    for key, rows in want_rows.items():  # an upper bound, and a tight one on this task
        assert 0.85 * rows <= got_rows[key] <= rows, (key, got_rows[key], rows)


DREAM_STEPS = {  # tiny-dream's rows of `dllm-ais plan` against a measured step
    "one_step": {},
    "trajectory-ratio": dict(mismatch_estimator="trajectory"),
    "trajectory-policy": dict(policy_logprob="trajectory"),
    "dual-cache": dict(mismatch_estimator="trajectory", policy_logprob="trajectory", cache="dual"),
}


@pytest.mark.parametrize("name", list(DREAM_STEPS))
def test_forward_rows_of_a_dream_step_are_the_planned_ones(name):
    """tiny-dream: the sampler's forwards, the one-step likelihood's (exact), and Dream's trajectory replays — the
    mismatch ratio's π_old (log μ recorded by the sampler), the policy's replay with the cache as it ran — counted as
    LLaDA's (upper bounds: canvases with nothing to score are skipped, tight on this task)."""
    base = get_preset("tiny-dream")
    changes = dict(DREAM_STEPS[name])
    sampler = replace(base.sampler, cache=changes.pop("cache")) if "cache" in changes \
        else base.sampler
    preset = replace(base, sampler=sampler, train=replace(base.train, **changes))
    plan = make_plan(preset, "h100", device="cpu")
    got, want = _measured_and_planned(preset, plan)
    if name == "one_step":
        assert got == want
        return
    got_rows, want_rows = _rows_by(got.items()), _rows_by(want.items())
    assert set(got_rows) == set(want_rows)
    for key, rows in want_rows.items():
        assert 0.85 * rows <= got_rows[key] <= rows, (key, got_rows[key], rows)
