"""Evaluation: accuracy = mean task reward of greedy completions, one generation per row, deterministic; the model
resolves from a checkpoint directory, a run's latest checkpoint (full or LoRA) or the preset."""

import argparse
import json
from dataclasses import replace

import pytest
import torch

from dllm_ais.analysis.evaluate import (
    add_eval_arguments,
    cmd_eval,
    d1_sampler,
    eval_sampler,
    evaluate,
    load_for_eval,
    parse_gen_lengths,
)
from dllm_ais.config import SamplerConfig
from dllm_ais.models.checkpoint import save_checkpoint
from dllm_ais.models.tiny import tiny_model, tiny_tokenizer
from dllm_ais.presets import get_preset
from dllm_ais.tasks import registry
from dllm_ais.tasks.registry import get_task

SAMPLER = SamplerConfig(gen_length=4, block_length=4, steps=4, temperature=1.0)  # evaluate forces temperature 0
LIMIT = 8


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _logits(m):
    ids = torch.arange(5, 25).reshape(2, 10)
    with torch.no_grad():
        return m(input_ids=ids).logits


def test_accuracy_is_mean_reward_of_written_generations(model, tokenizer, tmp_path):
    scores = evaluate(model, tokenizer, "arith", SAMPLER, limit=LIMIT, batch_size=3, out_dir=tmp_path)
    gens = _read_jsonl(tmp_path / "generations.jsonl")
    rows = get_task("arith").load("test", limit=LIMIT)
    assert len(gens) == len(rows) == scores["n"] == LIMIT
    assert [g["prompt"] for g in gens] == [r["prompt"] for r in rows]
    assert [g["answer"] for g in gens] == [r["answer"] for r in rows]  # gold columns kept
    rewards = get_task("arith").reward([g["prompt"] for g in gens], [g["completion"] for g in gens],
                                       answer=[g["answer"] for g in gens])
    assert [g["reward"] for g in gens] == rewards
    assert scores["accuracy"] == pytest.approx(sum(rewards) / len(rewards))
    assert json.loads((tmp_path / "scores.json").read_text()) == scores
    assert scores["temperature"] == 0.0 and scores["gen_length"] == 4 and scores["task"] == "arith"
    assert all(len(g["completion"]) <= 4 for g in gens)


def test_accuracy_averages_nontrivial_rewards(model, tokenizer, tmp_path, monkeypatch):
    """A random tiny model scores 0 on arith; a graded reward checks the averaging and the row alignment."""
    def graded(prompts, completions, answer, **_):
        return [sum(ch.isdigit() for ch in c) / 4 + (len(a) == 3) for c, a in zip(completions, answer, strict=True)]

    monkeypatch.setitem(registry.TASKS, "arith-graded", replace(get_task("arith"), name="arith-graded",
                                                                reward=graded))
    scores = evaluate(model, tokenizer, "arith-graded", SAMPLER, limit=LIMIT, out_dir=tmp_path)
    gens = _read_jsonl(tmp_path / "generations.jsonl")
    expected = graded(None, [g["completion"] for g in gens], [g["answer"] for g in gens])
    assert [g["reward"] for g in gens] == expected and len(set(expected)) > 1
    assert scores["accuracy"] == pytest.approx(sum(expected) / LIMIT)
    assert scores["full_reward_frac"] == pytest.approx(sum(r >= 1 for r in expected) / LIMIT)


def test_greedy_evaluation_is_deterministic_and_batch_independent(model, tokenizer, tmp_path):
    a = evaluate(model, tokenizer, "arith", SAMPLER, limit=LIMIT, batch_size=8, out_dir=tmp_path / "a")
    b = evaluate(model, tokenizer, "arith", replace(SAMPLER, temperature=0.0), limit=LIMIT, batch_size=8,
                 out_dir=tmp_path / "b")
    c = evaluate(model, tokenizer, "arith", SAMPLER, limit=LIMIT, batch_size=3, out_dir=tmp_path / "c")
    ga, gb, gc = (_read_jsonl(tmp_path / d / "generations.jsonl") for d in "abc")
    assert ga == gb and a["accuracy"] == b["accuracy"]
    assert [g["completion"] for g in ga] == [g["completion"] for g in gc], "left padding must not change results"
    assert c["accuracy"] == a["accuracy"]
    assert len({g["completion"] for g in ga}) > 1, "completions should depend on the prompt"


def test_load_for_eval_model_dir_with_and_without_tokenizer(model, tokenizer, tmp_path):
    save_checkpoint(model, tmp_path / "with_tok", tokenizer=tokenizer)
    save_checkpoint(model, tmp_path / "bare")
    for d in ("with_tok", "bare"):
        loaded = load_for_eval(model_dir=tmp_path / d)
        assert torch.equal(_logits(loaded.model), _logits(model))
        assert loaded.tokenizer.padding_side == "left"
        assert loaded.tokenizer("12+7=")["input_ids"] == tokenizer("12+7=")["input_ids"]
        assert loaded.preset.name == "tiny-cpu" and loaded.source == str(tmp_path / d)


def _fake_run(path, preset, write_model):
    """A run directory with one checkpoint (step-000001, with its manifest) whose model files `write_model` writes."""
    from dllm_ais.train.run_dir import RunDir

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(preset.to_dict()))
    RunDir(path).save_checkpoint(1, write_model, {"step": 1})


def test_load_for_eval_run_dir_full_model_and_missing_checkpoint(model, tmp_path):
    preset = get_preset("tiny-cpu")
    _fake_run(tmp_path / "run", preset, lambda ckpt: save_checkpoint(model, ckpt / "model"))
    loaded = load_for_eval(run_dir=tmp_path / "run")
    assert torch.equal(_logits(loaded.model), _logits(model))
    assert loaded.preset == preset and loaded.source.endswith("step-000001")

    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    (tmp_path / "empty" / "config.json").write_text(json.dumps(preset.to_dict()))
    with pytest.raises(FileNotFoundError, match="no checkpoint yet"):
        load_for_eval(run_dir=tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_for_eval(run_dir=tmp_path / "empty" / "checkpoints")
    with pytest.raises(ValueError, match="not both"):
        load_for_eval(model_dir=tmp_path / "x", run_dir=tmp_path / "run")


def test_load_for_eval_verifies_a_trainer_checkpoint_manifest(model, tokenizer, tmp_path):
    from dllm_ais.train.run_dir import CheckpointCorrupt, RunDir

    run = RunDir(tmp_path / "run")
    run.create(get_preset("tiny-cpu"), resume=False)
    ckpt = run.save_checkpoint(7, lambda d: save_checkpoint(model, d / "model", tokenizer=tokenizer), {"step": 7})
    assert torch.equal(_logits(load_for_eval(run_dir=run.path).model), _logits(model))
    with open(ckpt / "model" / "model.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(CheckpointCorrupt, match="does not match its manifest"):
        load_for_eval(run_dir=run.path)


def test_load_for_eval_lora_run_merges_adapter_on_base(tmp_path):
    from peft import LoraConfig, get_peft_model

    from dllm_ais.models.llada.model import lora_target_regex

    base = get_preset("tiny-cpu")
    preset = replace(base, train=replace(base.train, lora_r=4, sft_steps=0))
    peft_model = get_peft_model(tiny_model(seed=preset.model.seed),
                                LoraConfig(r=4, lora_alpha=8, target_modules=lora_target_regex()))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    _fake_run(tmp_path / "run", preset, lambda ckpt: peft_model.save_pretrained(str(ckpt / "adapter")))
    loaded = load_for_eval(run_dir=tmp_path / "run")
    expected = _logits(peft_model.eval())
    assert not torch.allclose(expected, _logits(tiny_model(seed=preset.model.seed)), atol=1e-4)
    torch.testing.assert_close(_logits(loaded.model), expected, atol=1e-5, rtol=1e-5)
    assert not hasattr(loaded.model, "peft_config")


def test_eval_samplers_follow_d1_for_real_models_and_the_preset_for_tiny():
    s = eval_sampler(get_preset("llada-8b-gsm8k"), 512)
    assert (s.gen_length, s.block_length, s.steps, s.temperature, s.remasking) == (512, 32, 256, 0.0,
                                                                                   "low_confidence")
    assert eval_sampler(get_preset("llada-8b-gsm8k")) == d1_sampler(256)
    tiny = get_preset("tiny-cpu").sampler
    assert eval_sampler(get_preset("tiny-cpu")) == replace(tiny, temperature=0.0)
    assert eval_sampler(get_preset("tiny-cpu"), 8).steps == 8
    with pytest.raises(ValueError, match="multiple of 32"):
        d1_sampler(100)
    assert parse_gen_lengths(["128,256", "512", "128"]) == [128, 256, 512]
    with pytest.raises(ValueError, match="positive integers"):
        parse_gen_lengths(["12x"])


def test_cmd_eval_writes_one_subdir_per_gen_length(model, tokenizer, tmp_path, capsys):
    save_checkpoint(model, tmp_path / "m", tokenizer=tokenizer)
    parser = argparse.ArgumentParser()
    add_eval_arguments(parser)
    args = parser.parse_args(["--model", str(tmp_path / "m"), "--limit", "4", "--gen-length", "4,8",
                              "--out", str(tmp_path / "out")])
    assert cmd_eval(args) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "digits" in out  # the default preset's task
    for L in (4, 8):
        scores = json.loads((tmp_path / "out" / f"digits-test-gen{L}" / "scores.json").read_text())
        assert scores["gen_length"] == L and scores["n"] == 4 and scores["model"] == str(tmp_path / "m")
        assert len(_read_jsonl(tmp_path / "out" / f"digits-test-gen{L}" / "generations.jsonl")) == 4
