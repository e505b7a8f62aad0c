"""Dream's position rule (issue 41, item 1): the released checkpoints' generation_config.json says "alg": "origin"
(random order), which a user asking for low-confidence remasking must never get; presets name their rule, --dream-alg
/ --dream-alg-temp override, and what the checkpoint says and what runs are printed at start and written to the run's
config.json (models/dream/backend.py `resolve_sampler`)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dllm_ais.presets import get_preset

FIXTURE = Path(__file__).parent / "fixtures" / "dream_tiny"


def test_the_fixture_ships_the_hubs_generation_config_and_low_confidence_never_takes_its_origin():
    """tests/fixtures/dream_tiny/generation_config.json is the hub's (alg "origin", alg_temp / top_p / top_k null):
    without a rule of its own, --remasking low_confidence on it runs a confidence rule, --remasking random origin."""
    from dllm_ais.models.dream.backend import dream_sampler_config
    from dllm_ais.models.dream.checkpoint import read_dream_sampling

    hub = json.loads((FIXTURE / "generation_config.json").read_text())
    assert hub["alg"] == "origin" and hub["alg_temp"] is None and hub["top_k"] is None
    said = read_dream_sampling(FIXTURE)
    assert said == {"alg": "origin"}
    sampler = replace(get_preset("dream-7b-gsm8k").sampler, dream_alg=None, dream_alg_temp=None)
    assert dream_sampler_config(sampler, said).alg == "maskgit_plus"
    assert dream_sampler_config(replace(sampler, remasking="random"), said).alg == "origin"
    for name in ("dream-7b-gsm8k", "dream-7b-math", "dream-7b-countdown", "dream-7b-sudoku"):  # DARE's rule
        assert dream_sampler_config(get_preset(name).sampler, said).alg == "entropy"


def _tiny_hub_dream(tmp_path) -> Path:
    """The tiny Dream saved in the hub layout with the hub's generation_config.json (the fixture's)."""
    from dllm_ais.families import get_family
    from dllm_ais.models.tiny import tiny_dream_model, tiny_tokenizer

    d = tmp_path / "dream"
    get_family("dream").save(tiny_dream_model(seed=0), tiny_tokenizer(), d)
    shutil.copy(FIXTURE / "generation_config.json", d / "generation_config.json")
    return d


def test_a_released_checkpoint_rolls_out_the_presets_rule_with_the_dual_cache(tmp_path, capsys):
    """dream-7b-gsm8k (shortened) on a hub-layout checkpoint whose generation_config.json says origin, with
    --cache dual: the rollouts run entropy (the preset's), the start-up line says both, config.json records both."""
    from dllm_ais.train.job import run_training

    p = get_preset("dream-7b-gsm8k")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1?", "answer": f"#### {a + 1}"}) + "\n" for a in range(4)))
    p = replace(p, model=replace(p.model, path=str(_tiny_hub_dream(tmp_path)), device="cpu", dtype="float32"),
                sampler=replace(p.sampler, gen_length=8, block_length=4, steps=4, cache="dual"),
                train=replace(p.train, steps=1, data_path=str(data), fp8_backend="torch", lora_r=0,
                              mismatch_estimator="trajectory", gradient_accumulation_steps=1),
                grpo=replace(p.grpo, num_generations=2, num_iterations=1))
    trainer = run_training(p, tmp_path / "run", progress=False)
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("Dream sampling:")]
    assert line == ["Dream sampling: the checkpoint's generation_config.json sets alg='origin'; running "
                    "alg='entropy', alg_temp=0.0, top_p=None, top_k=None (alg from the preset / --dream-alg)."]
    assert (trainer.policy.backend.dream.alg, trainer.policy.backend.dream.cache) == ("entropy", "dual")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["sampling"] == {"checkpoint": {"alg": "origin"},
                                  "runs": {"alg": "entropy", "alg_temp": 0.0, "top_p": None, "top_k": None}}
    assert config["sampler"]["dream_alg"] == "entropy"
    from dllm_ais import metrics as M

    rows = M.read_metrics(tmp_path / "run")
    assert len(rows) == 1 and torch.isfinite(torch.tensor(rows[0][M.MISMATCH_KL]))


@pytest.mark.parametrize("estimator", [[], ["--mismatch-estimator", "trajectory"]], ids=["as-typed", "trajectory"])
def test_origin_with_the_dual_cache_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, estimator):
    """The issue's command as typed: the refusal names origin (not the estimator the cache would need next)."""
    from dllm_ais.cli import main

    out = tmp_path / "run"
    assert main(["train", "--preset", "dream-7b-gsm8k", "--model", str(FIXTURE), "--dream-alg", "origin", "--cache",
                 "dual", *estimator, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--dream-alg origin draws a random order" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_sample_says_what_runs(capsys):
    """`dllm-ais sample` on a Dream prints what its checkpoint sets and what runs (--dream-alg overrides)."""
    from dllm_ais.cli import main

    assert main(["sample", "--preset", "tiny-dream", "--dream-alg", "topk_margin", "--prompt", "1+2=",
                 "--gen-length", "4", "--steps", "2"]) == 0
    err = capsys.readouterr().err
    assert "Dream sampling: the tiny built-in model has no generation_config.json; running alg='topk_margin'" in err
