"""The training loop on the tiny model: parameters move, metrics are complete, resume reproduces, failures are clean."""

import json
import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

import dllm_ais.train.trainer as trainer_module
from dllm_ais import metrics as M
from dllm_ais.families import get_family as family
from dllm_ais.presets import get_preset
from dllm_ais.train.job import run_training
from dllm_ais.train.run_dir import CheckpointCorrupt, RunDir

TIMING_KEYS = ("time/", "rollout/tokens_per_s")


def small_preset(**train):
    """tiny-cpu shrunk to seconds: 2 prompts x 4 generations, 5-token completions, a few SFT steps."""
    p = get_preset("tiny-cpu")
    fields = dict(steps=3, prompts_per_step=2, sft_steps=3, sft_batch_size=8, mismatch_num_draws=2)
    fields.update(train)
    return replace(p, train=replace(p.train, **fields), grpo=replace(p.grpo, num_generations=4))


def _comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in rows]


def _final_weights(run):
    return load_file(str(RunDir(run).latest() / "model" / "model.safetensors"))


def test_training_changes_parameters_and_logs_every_metric(tmp_path):
    run = tmp_path / "run"
    run_training(small_preset(), run, progress=False)
    rows = M.read_metrics(run)
    assert [r[M.STEP] for r in rows] == [0, 1, 2]
    for row in rows:
        missing = [k for k in M.REQUIRED_STEP_METRICS if k not in row]
        assert not missing, missing
        for key in (M.AIS_LAMBDA, M.AIS_ESS, M.AIS_DIVERGENCE, M.AIS_VAR_AMP, M.MISMATCH_KL, M.REWARD_MEAN):
            assert isinstance(row[key], float) and math.isfinite(row[key]), key
        assert 0.0 <= row[M.AIS_LAMBDA] <= 1.0 and 0.0 < row[M.AIS_ESS] <= 1.0
        assert row[M.ROLLOUT_TOKENS_PER_S] > 0
    start = load_file(str(run / "sft" / "model.safetensors"))
    end = _final_weights(run)
    changed = [k for k in start if not torch.equal(start[k], end[k])]
    assert len(changed) == len(start), "every tensor of a fully fine-tuned model moves"
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["steps"] == 3 and config["correction"]["correction"] == "ais"


def test_bf16_rollouts_have_no_mismatch(tmp_path):
    run_training(small_preset(steps=2, rollout_precision="bf16"), tmp_path / "run", progress=False)
    for row in M.read_metrics(tmp_path / "run"):
        assert row[M.AIS_LAMBDA] == 0.0 and row[M.AIS_ESS] == 1.0 and row[M.AIS_DIVERGENCE] == 0.0


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    run_training(small_preset(steps=4), whole, progress=False)
    run_training(small_preset(steps=2), split, progress=False)
    run_training(small_preset(), split, resume=True, progress=False, steps=4)
    a, b = M.read_metrics(whole), M.read_metrics(split)
    assert [r[M.STEP] for r in b] == [0, 1, 2, 3]
    assert _comparable(a) == _comparable(b)
    wa, wb = _final_weights(whole), _final_weights(split)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _reward_module(tmp_path, monkeypatch, body):
    """A user reward module, importable by path (a fresh module name per test: module state must not leak)."""
    name = f"user_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:reward"


def test_interrupt_writes_a_loadable_checkpoint(tmp_path, monkeypatch):
    fn = _reward_module(tmp_path, monkeypatch, (
        "calls = []\n"
        "def reward(prompts, completions, **cols):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 3:\n"
        "        raise KeyboardInterrupt\n"
        "    return [0.0] * len(completions)\n"))
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_training(small_preset(steps=5, reward_fn=fn), run, progress=False)
    ckpt = RunDir(run).latest()
    assert ckpt.name == "step-000002"
    RunDir.verify(ckpt)
    assert RunDir.load_state(ckpt)["step"] == 2
    from dllm_ais.models.llada.checkpoint import load_llada

    load_llada(ckpt / "model")


def test_reward_function_that_raises_is_reported_and_training_continues(tmp_path, monkeypatch, capsys):
    fn = _reward_module(tmp_path, monkeypatch, (
        "calls = []\n"
        "def reward(prompts, completions, **cols):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 2:\n"
        "        raise ZeroDivisionError('boom')\n"
        "    return [float(len(c if isinstance(c, str) else c[0]['content'])) for c in completions]\n"))
    run_training(small_preset(steps=3, reward_fn=fn), tmp_path / "run", progress=False)
    rows = M.read_metrics(tmp_path / "run")
    assert [r[M.REWARD_ERRORS] for r in rows] == [0.0, 1.0, 0.0]
    assert rows[2][M.SKIPPED_STEPS] == 1 and math.isfinite(rows[2][M.REWARD_MEAN])
    assert "step 1: skipped — reward function reward raised ZeroDivisionError: boom" in capsys.readouterr().err


def test_non_finite_loss_skips_the_update_and_continues(tmp_path, monkeypatch):
    real = trainer_module.grpo_loss
    calls = []

    def flaky(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        return replace(out, loss=out.loss * float("nan")) if len(calls) == 1 else out

    monkeypatch.setattr(trainer_module, "grpo_loss", flaky)
    preset = small_preset(steps=2)
    preset = replace(preset, grpo=replace(preset.grpo, num_iterations=1))  # one update per step: step 0's is lost
    run_training(preset, tmp_path / "run", progress=False)
    rows = M.read_metrics(tmp_path / "run")
    assert [r[M.SKIPPED_STEPS] for r in rows] == [1, 1]
    assert math.isnan(rows[0][M.LOSS_POLICY]) and math.isfinite(rows[1][M.LOSS_POLICY])


def test_corrupted_or_partial_checkpoint_is_detected(tmp_path):
    run = tmp_path / "run"
    run_training(small_preset(steps=1), run, progress=False)
    ckpt = RunDir(run).latest()
    state = ckpt / "trainer_state.pt"
    data = bytearray(state.read_bytes())
    data[-10] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match="trainer_state.pt does not match"):
        run_training(small_preset(), run, resume=True, progress=False, steps=2)
    (ckpt / "manifest.json").unlink()
    with pytest.raises(CheckpointCorrupt, match="not completely written"):
        run_training(small_preset(), run, resume=True, progress=False, steps=2)


def test_bad_input_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        run_training(small_preset(task="nope", task_config={}), tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists(), "nothing written for a run that cannot start"
    run_training(small_preset(steps=1), tmp_path / "b", progress=False)
    before = (tmp_path / "b" / "metrics.jsonl").read_text()
    with pytest.raises(FileExistsError, match="already holds a run"):
        run_training(small_preset(steps=1), tmp_path / "b", progress=False)
    assert (tmp_path / "b" / "metrics.jsonl").read_text() == before
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"digits": "1234"}\n{"a": 3}\n')  # the preset's task (digits) reads a `digits` column
    with pytest.raises(ValueError, match=r"row 1 has no field 'digits'"):
        run_training(small_preset(data_path=str(bad), task_config={}), tmp_path / "c", progress=False)
    with pytest.raises(FileNotFoundError, match="holds no run"):
        run_training(small_preset(), tmp_path / "d", resume=True, progress=False)


def test_ctrl_c_finishes_the_step_and_resume_reproduces(tmp_path, monkeypatch):
    """A real SIGINT during step 1: the step completes, checkpoint step-2 is written, resume matches a whole run."""
    fn = _reward_module(tmp_path, monkeypatch, (
        "import os, signal\n"
        "calls = []\n"
        "def reward(prompts, completions, **cols):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 2:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return [float(len(c if isinstance(c, str) else c[0]['content'])) for c in completions]\n"))
    whole, split = tmp_path / "whole", tmp_path / "split"
    reward_fn = fn.replace(":", "_whole:")
    (tmp_path / f"{reward_fn.split(':')[0]}.py").write_text(
        "def reward(prompts, completions, **cols):\n"
        "    return [float(len(c if isinstance(c, str) else c[0]['content'])) for c in completions]\n")
    run_training(small_preset(steps=4, reward_fn=reward_fn), whole, progress=False)
    with pytest.raises(KeyboardInterrupt):
        run_training(small_preset(steps=4, reward_fn=fn), split, progress=False)
    assert RunDir(split).latest().name == "step-000002"
    assert [r[M.STEP] for r in M.read_metrics(split)] == [0, 1]
    run_training(small_preset(), split, resume=True, progress=False)
    assert _comparable(M.read_metrics(whole)) == _comparable(M.read_metrics(split))


def test_gradient_accumulation_keeps_masks_shared_and_the_loss_scaled(tmp_path, monkeypatch):
    """Micro-batches see the full batch's one-step masks (ratio exactly 1 at the first iteration: nothing clipped)
    and are weighted by their token share (dapo, and SPG's length-weighted loss) or sequence share (grpo): same
    training as one big batch. SPG also shows the trainer runs its own loss (no ratio: its clip columns are NaN)."""
    fn = _reward_module(tmp_path, monkeypatch, (  # graded, so advantages (and gradients) are not all zero
        "def reward(prompts, completions, **cols):\n"
        "    return [float(len(c if isinstance(c, str) else c[0]['content'])) for c in completions]\n"))
    for loss_type in ("dapo", "grpo", "spg"):
        weights, logged = [], []
        for acc in (1, 3):
            p = small_preset(steps=2, gradient_accumulation_steps=acc, p_mask_prompt=0.5, reward_fn=fn)
            spg = loss_type == "spg"
            p = replace(p, grpo=replace(p.grpo, num_iterations=1, loss_type="grpo" if spg else loss_type,
                                        beta=0.0 if spg else p.grpo.beta),
                        train=replace(p.train, policy_logprob="spg") if spg else p.train)
            out = tmp_path / f"{loss_type}-{acc}"
            run_training(p, out, progress=False)
            rows = M.read_metrics(out)
            assert all(r[M.ADV_ZERO_STD] < 1 for r in rows)
            clips = [r[k] for r in rows for k in (M.LOSS_CLIP, M.LOSS_CLIP_LOW, M.LOSS_CLIP_HIGH)]  # every row has them
            # nothing clipped at the first iteration; SPG has no ratio and no clip: the columns stay, as NaN
            assert all(math.isnan(c) for c in clips) if spg else all(c == 0.0 for c in clips), (loss_type, clips)
            weights.append(_final_weights(out))
            logged.append([r[M.LOSS_POLICY] for r in rows])
        # the logged loss is the optimised one: micro-batches weighted like the loss (not a plain mean of them).
        # dapo's token mean is far from 0 (lengths differ); grpo's first-iteration loss is −mean(Â ω) ≈ 0 (Σ Â = 0
        # per group, ω ≈ 1), so there only the equality below can be checked.
        if loss_type in ("dapo", "spg"):  # SPG's loss −Σ L_i Â_i ℓ_i / Σ L_i is far from 0 (ℓ_i ≪ 0)
            assert any(abs(v) > 1e-4 for v in logged[0])
        for whole, micro in zip(*logged, strict=True):
            assert math.isclose(whole, micro, rel_tol=1e-5, abs_tol=1e-7), (loss_type, logged)
        start = load_file(str(out / "sft" / "model.safetensors"))
        assert any(not torch.equal(start[k], weights[0][k]) for k in start)
        # Adam's first steps move each weight by ≈ lr·sign(g): an element whose gradient is ≈ 0 can move differently
        # under another CPU's summation order (one element in 16k by 1e-6 here, by more on CI's machine), so the whole
        # update is compared: a mis-weighted micro-batch turns a sizeable share of the signs (a gap of 10-50 %).
        for k in weights[0]:
            moved, gap = weights[0][k] - start[k], weights[1][k] - weights[0][k]
            assert float(gap.norm()) <= 1e-3 * float(moved.norm()) + 1e-9, (loss_type, k, float(gap.norm()))


def test_generated_tokens_count_what_the_sampler_generated():
    from dllm_ais.types import Rollout

    ids = torch.zeros(3, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    common = dict(prompt_ids=ids[:, :2], prompt_mask=torch.ones(3, 2, dtype=torch.bool), completion_ids=ids,
                  completion_mask=mask, commit_step=ids, num_steps=5)
    ar = Rollout(**common, logp_rollout=torch.zeros(3, 5))
    assert trainer_module.generated_tokens(ar) == 8, "AR rows stop at their stop token: the rest is padding"
    assert trainer_module.generated_tokens(Rollout(**common)) == 15, "diffusion fills every canvas position"


def test_tokens_per_s_excludes_tokenisation(tmp_path, monkeypatch):
    """Tokenising the prompts takes 2 s here; rollout/tokens_per_s times the sampler only (4 tiny forwards)."""
    real = trainer_module.encode_prompts

    def slow_encode(*args, **kwargs):
        import time

        time.sleep(2.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "encode_prompts", slow_encode)
    run_training(small_preset(steps=1, sft_steps=0), tmp_path / "run", progress=False)
    (row,) = M.read_metrics(tmp_path / "run")
    generated = 2 * 4 * 4  # prompts x generations x gen_length: the diffusion sampler fills every position
    assert row[M.ROLLOUT_TOKENS_PER_S] > generated / 2.0, row[M.ROLLOUT_TOKENS_PER_S]
    assert row[M.time_key("rollout")] >= 2.0, "the step's rollout phase (tokenisation included) is still timed"


def test_bf16_full_fine_tuning_keeps_fp32_master_weights(tmp_path, monkeypatch):
    """lr 1e-6 on N(0, 0.02)-scale bf16 weights is below bf16's resolution: the fp32 masters move, the resume
    restores them (the run equals the uninterrupted one), and the optimizer never holds a bf16 tensor."""
    fn = _reward_module(tmp_path, monkeypatch, (  # graded, so advantages (and gradients) are not all zero
        "def reward(prompts, completions, **cols):\n"
        "    return [float(len(c if isinstance(c, str) else c[0]['content'])) for c in completions]\n"))

    def preset(steps):
        p = small_preset(steps=steps, sft_steps=0, learning_rate=1e-6, reward_fn=fn)
        return replace(p, model=replace(p.model, dtype="bfloat16"))

    whole, split = tmp_path / "whole", tmp_path / "split"
    trainer = run_training(preset(2), whole, progress=False)
    assert trainer.master_weights is not None
    opt_params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert opt_params and all(p.dtype == torch.float32 for p in opt_params)
    names = [n for n, p in trainer.master.named_parameters() if p.requires_grad]
    model_params = [p for p in trainer.master.parameters() if p.requires_grad]
    assert all(p.dtype == torch.bfloat16 for p in model_params)
    init_model, _ = family("llada").load(preset(2).model)  # the same seeded initial bf16 weights
    init = dict(init_model.named_parameters())
    total = sum(p.numel() for p in model_params)
    moved_master = sum(int((m != init[n].float()).sum())
                       for n, m in zip(names, trainer.master_weights.master, strict=True))
    moved_bf16 = sum(int((p != init[n]).sum()) for n, p in zip(names, model_params, strict=True))
    assert moved_master > 0.5 * total, f"the masters carry the sub-resolution updates: {moved_master}/{total}"
    assert moved_bf16 < 0.5 * moved_master, f"most updates are below bf16's resolution: {moved_bf16}/{total}"
    state = RunDir.load_state(RunDir(whole).latest())
    assert len(state["master_weights"]) == len(model_params)

    run_training(preset(1), split, progress=False)
    resumed = run_training(preset(2), split, resume=True, progress=False, steps=2)
    for a, b in zip(trainer.master_weights.master, resumed.master_weights.master, strict=True):
        assert torch.equal(a, b)
    assert _comparable(M.read_metrics(whole)) == _comparable(M.read_metrics(split))
