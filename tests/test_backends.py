"""One trainer code path for every backend: the tiny LLaDA, Dream, Qwen and SDAR train through the same
function."""

import json
import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from dllm_ais import metrics as M
from dllm_ais.config import SamplerConfig
from dllm_ais.presets import get_preset
from dllm_ais.train.backend import AutoregressiveBackend, DiffusionBackend
from dllm_ais.train.job import run_training
from dllm_ais.train.run_dir import RunDir

REWARD_MODULE = (
    "def reward(prompts, completions, **columns):\n"
    "    texts = [c if isinstance(c, str) else c[0]['content'] for c in completions]  # TRL: chat form\n"
    "    return [sum(ch.isdigit() for ch in c) / 4 for c in texts]\n"  # graded: groups have spread
)


def train_briefly(preset_name: str, out, reward_fn: str, **train):
    """The single function both backends go through: a few steps of run_training on a shrunk preset."""
    p = get_preset(preset_name)
    fields = dict(steps=2, prompts_per_step=2, sft_steps=2, sft_batch_size=4, reward_fn=reward_fn)
    fields.update(train)
    p = replace(p, train=replace(p.train, **fields), grpo=replace(p.grpo, num_generations=4))
    run_training(p, out, progress=False)
    return M.read_metrics(out)


@pytest.fixture
def reward_fn(tmp_path, monkeypatch):
    name = f"graded_reward_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:reward"


@pytest.mark.parametrize("preset", ["tiny-cpu", "tiny-dream", "tiny-qwen", "tiny-sdar"])
def test_both_backends_train_through_one_code_path(tmp_path, reward_fn, preset):
    out = tmp_path / "run"
    rows = train_briefly(preset, out, reward_fn)
    assert len(rows) == 2
    for row in rows:
        assert all(k in row for k in M.REQUIRED_STEP_METRICS)
        assert math.isfinite(row[M.AIS_LAMBDA]) and math.isfinite(row[M.AIS_ESS])
        assert math.isfinite(row[M.LOSS_POLICY])
    start = load_file(str(next((out / "sft").glob("*.safetensors"))))
    end = load_file(str(next((RunDir(out).latest() / "model").glob("*.safetensors"))))
    assert any(not torch.equal(start[k], end[k]) for k in start), "the policy must move"


@pytest.mark.parametrize("preset", ["tiny-cpu", "tiny-dream", "tiny-qwen", "tiny-sdar"])
def test_bf16_rollouts_give_unit_weights(tmp_path, reward_fn, preset):
    rows = train_briefly(preset, tmp_path / "run", reward_fn, rollout_precision="bf16")
    for row in rows:
        assert row[M.AIS_LAMBDA] == 0.0 and row[M.AIS_ESS] == 1.0 and row[M.AIS_DIVERGENCE] == 0.0
        assert row[M.AIS_TRUNC] == 0.0 and row["ais/log_w_min"] == 0.0 == row["ais/log_w_max"]


def test_backend_choice_follows_the_family():
    from dllm_ais.families import get_family as family

    p = get_preset("tiny-cpu")
    llada = family("llada").backend(p.sampler, *family("llada").load(p.model))
    q = get_preset("tiny-qwen")
    qwen = family("qwen").backend(q.sampler, *family("qwen").load(q.model))
    assert isinstance(llada, DiffusionBackend) and not llada.is_causal
    assert isinstance(qwen, AutoregressiveBackend) and qwen.is_causal
    from dllm_ais.models.dream.backend import DreamBackend

    d = get_preset("tiny-dream")
    dream = family("dream").backend(d.sampler, *family("dream").load(d.model))
    assert isinstance(dream, DreamBackend) and not dream.is_causal and type(llada) is DiffusionBackend


def test_ar_mismatch_is_exact_token_log_ratio():
    """ℓ_t = log π_old(y_t) − recorded log μ(y_t), summed over counted tokens at sequence level."""
    from dllm_ais.fp8 import quantize_model
    from dllm_ais.models.qwen.model import tiny_qwen, tiny_qwen_tokenizer

    model = tiny_qwen(seed=3)
    fp8 = quantize_model(model, backend="torch")
    tok = tiny_qwen_tokenizer()
    enc = tok(["1+2=", "33+4="], padding=True, return_tensors="pt")
    backend = AutoregressiveBackend(SamplerConfig(gen_length=6, block_length=6, steps=1, temperature=1.0), (1,))
    rollout = backend.sample(fp8, enc["input_ids"], enc["attention_mask"].bool(), torch.Generator().manual_seed(0))
    tokw = backend.mismatch_log_w(model, fp8, rollout, None, "token")
    expected = torch.where(rollout.completion_mask, backend.token_logp(model, rollout, 0) - rollout.logp_rollout, 0)
    torch.testing.assert_close(tokw, expected)
    torch.testing.assert_close(backend.mismatch_log_w(model, fp8, rollout, None, "sequence"), expected.sum(-1))
    assert tokw.abs().max() > 0, "FP8 and BF16 differ"
    same = backend.mismatch_log_w(fp8, fp8, rollout, None, "token")
    assert torch.equal(same, torch.zeros_like(same))


def test_eval_runs_for_both_families(tmp_path):
    """`dllm-ais eval` on a Qwen run's checkpoint, a Dream run's and a LLaDA run's, through the same evaluate()."""
    from dllm_ais.analysis.evaluate import evaluate, load_for_eval

    for preset in ("tiny-cpu", "tiny-dream", "tiny-qwen"):
        out = tmp_path / preset
        p = get_preset(preset)
        p = replace(p, train=replace(p.train, steps=1, prompts_per_step=1, sft_steps=2, sft_batch_size=4),
                    grpo=replace(p.grpo, num_generations=2))
        run_training(p, out, progress=False)
        loaded = load_for_eval(run_dir=out)
        scores = evaluate(loaded.model, loaded.tokenizer, p.train.task, p.sampler, limit=4, out_dir=tmp_path / "e",
                          task_config=p.train.task_config, family=p.model.family)
        rows = [json.loads(line) for line in (tmp_path / "e" / "generations.jsonl").read_text().splitlines()]
        assert scores["n"] == 4 == len(rows)
        assert scores["accuracy"] == sum(r["reward"] for r in rows) / 4
