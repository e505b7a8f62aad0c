"""SDAR as a family: the registry record, checkpoint detection, `dllm-ais sample` on the tiny built-in SDAR, and
what it refuses in one line before anything is written (likelihoods it cannot train with, other families' flags on
it, its flags on others, settings its sampler does not have)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dllm_ais.cli import main
from dllm_ais.config import SamplerConfig, override
from dllm_ais.families import family_of_config, get_family
from dllm_ais.models.load import detect_family
from dllm_ais.presets import get_preset

FIXTURE = Path(__file__).parent / "fixtures" / "sdar_tiny"


def test_the_registry_knows_sdar_and_its_checkpoints():
    family = get_family("sdar")
    assert family.title == "SDAR" and family.diffusion
    assert family_of_config({"model_type": "sdar"}) is family
    assert family_of_config({"architectures": ["SDARForCausalLM"]}) is family
    assert detect_family(FIXTURE) == "sdar"
    family.check_source(FIXTURE)
    model = family.load_dir(FIXTURE, dtype=torch.float32, device="cpu")
    assert model.config.mask_token_id == 297 and model.config.head_dim == 32
    tiny = family.tiny(seed=0, dtype=torch.float32)
    assert tiny.config.model_type == "sdar" and family.lora_targets().endswith("down_proj)")


def test_sample_runs_the_tiny_sdar(capsys):
    assert main(["sample", "--preset", "tiny-sdar", "--prompt", "12+7=", "--prompt", "Hello", "--seed", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("### ") == 2
    assert "rule low_confidence_dynamic" in captured.err  # what runs, not "low_confidence remasking"
    assert main(["sample", "--preset", "tiny-sdar", "--prompt", "ab", "--temperature", "0", "--sdar-strategy",
                 "sequential", "--gen-length", "12", "--steps", "6"]) == 0
    assert "rule sequential" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--cache", "dual"], "native"),
    (["--threshold", "0.9"], "--sdar-strategy low_confidence_dynamic"),
    (["--remasking", "random"], "--remasking random"),
    (["--gen-length", "6"], "not a multiple of block_length"),
])
def test_sample_refuses_what_the_sdar_sampler_lacks(capsys, argv, says):
    assert main(["sample", "--preset", "tiny-sdar", "--prompt", "x", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the untrained-model note: the one error line
    assert err.startswith("dllm-ais sample: error:") and says in err


def test_sdar_flags_are_refused_on_other_families(capsys):
    assert main(["sample", "--preset", "tiny-cpu", "--prompt", "x", "--sdar-strategy", "sequential"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("dllm-ais sample: error:") and "SDAR's sampler setting" in err
    with pytest.raises(ValueError, match="sdar_strategy"):
        SamplerConfig(sdar_strategy="entropy_bounded")


def test_a_likelihood_sdar_cannot_train_with_is_refused_before_the_run_directory_exists(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--preset", "tiny-sdar", "--policy-logprob", "one_step", "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--policy-logprob one_step" in err and "\n" not in err
    assert not out.exists()


def test_backend_maps_the_sampler_settings():
    from dllm_ais.models.sdar.backend import sdar_sampler_config

    s = override(get_preset("tiny-sdar").sampler, steps=8, sdar_strategy="low_confidence_static",
                 sdar_threshold=0.7, temperature=0.0)
    cfg = sdar_sampler_config(s)
    assert (cfg.denoising_steps, cfg.strategy, cfg.threshold, cfg.temperature) == (4, "low_confidence_static", 0.7,
                                                                                   0.0)
    assert sdar_sampler_config(get_preset("tiny-sdar").sampler).strategy == "low_confidence_dynamic"


def test_eval_samples_in_the_blocks_the_model_was_trained_with(tmp_path, capsys):
    """`eval --protocol d1` asks for d1's blocks of 32; an SDAR samples in its own (config block_size: 4 for the tiny
    one) with d1's steps per token; a length that is not a whole number of blocks is refused in one line."""
    import json

    out = tmp_path / "ev"
    assert main(["eval", "--preset", "tiny-sdar", "--protocol", "d1", "--task", "countdown", "--limit", "2",
                 "--gen-length", "32", "--out", str(out)]) == 0
    scores = json.loads((out / "countdown-test-d1-gen32" / "scores.json").read_text())
    assert (scores["block_length"], scores["steps"]) == (4, 16), scores
    capsys.readouterr()
    assert main(["eval", "--preset", "tiny-sdar", "--protocol", "d1", "--task", "countdown", "--limit", "2",
                 "--gen-length", "30", "--out", str(tmp_path / "ev30")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "blocks of 4" in errors[0], errors
    assert not list((tmp_path / "ev30").rglob("scores.json"))


def test_a_trained_sdar_is_evaluated_and_sampled_with_its_own_rollout_sampler_at_t0():
    """`eval` (strict) and `sample --run` take analysis.evaluate.eval_sampler: an SDAR checkpoint keeps its preset's
    strategy, threshold and blocks (d1's LLaDA sampler refused sdar-8b-gsm8k's 2,000 tokens, which are not a whole
    number of its blocks of 32, and would have dropped the dynamic rule); another length keeps the steps per block;
    a LLaDA checkpoint still gets d1's sampler."""
    from dllm_ais.analysis.evaluate import d1_sampler, eval_sampler

    preset = get_preset("sdar-8b-gsm8k")
    s = eval_sampler(preset)
    assert s == override(preset.sampler, temperature=0.0) and s.sdar_strategy == "low_confidence_dynamic"
    s256 = eval_sampler(preset, 256)
    assert (s256.gen_length, s256.block_length, s256.steps, s256.sdar_threshold, s256.temperature) == (
        256, 4, 256, 0.9, 0.0)
    with pytest.raises(ValueError, match="blocks of 4"):
        eval_sampler(preset, 30)
    assert eval_sampler(get_preset("llada-8b-gsm8k"), 256) == d1_sampler(256)
