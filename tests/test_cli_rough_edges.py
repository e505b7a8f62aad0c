"""What a new user hits first, through the CLI where possible: one-line errors, nothing half-made left on disk,
permissions that follow the umask, a resumable SFT warm-up, sampling a trained run, honest summaries and help."""

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from dllm_ais.cli import build_parser, main, name_flags
from dllm_ais.presets import get_preset


def _run_cli_light(args):
    """main(args) in a fresh interpreter -> (exit code, stderr, whether torch got imported)."""
    code = ("import sys; from dllm_ais.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    return p.returncode, p.stderr, "TORCH True" in p.stdout


@pytest.mark.parametrize("content,message", [
    ('{"question": "q", "answer": "#### 1"}\n{oops\n', "bad.jsonl:2: not valid JSON"),
    ("", "bad.jsonl: the file is empty"),
    ('{"question": "q", "answer": "#### 1"}\n[1, 2]\n', "bad.jsonl:2: expected a JSON object"),
])
def test_bad_data_file_is_one_line_before_any_heavy_import(tmp_path, content, message):
    data = tmp_path / "bad.jsonl"
    data.write_text(content)
    out = tmp_path / "run"
    rc, err, torch_imported = _run_cli_light(["train", "--task", "gsm8k", "--data", str(data), "--out", str(out)])
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not torch_imported and not out.exists()


def test_bad_model_leaves_nothing_behind_and_names_the_flag(tmp_path):
    out = tmp_path / "run"
    rc, err, torch_imported = _run_cli_light(["train", "--model", str(tmp_path / "nonexistent"), "--out", str(out)])
    assert rc == 2 and "--model" in err and "not a checkpoint directory" in err and not torch_imported
    assert not out.exists()
    rc, err, _ = _run_cli_light(["train", "--steps", "-1", "--out", str(out)])
    assert rc == 2 and "--steps -1 must be >= 1" in err and "TrainConfig" not in err


@pytest.mark.parametrize("precision", ["bf16", "fp4"])
def test_aligned_forward_without_fp8_rollouts_fails_before_anything_is_created(tmp_path, precision):
    """Was refused in Trainer.__init__, after the run directory, config.json and the SFT warm-up existed (so the
    corrected command then hit 'already holds a run' and --resume reused the bad config)."""
    out = tmp_path / "run"
    rc, err, torch_imported = _run_cli_light(["train", "--train-forward", "aligned", "--rollout-precision", precision,
                                              "--out", str(out)])
    assert rc == 2 and "--rollout-precision fp8" in err and len(err.strip().splitlines()) == 1, err
    assert not torch_imported and not out.exists()


def test_library_run_training_checks_the_model_before_creating_the_run(tmp_path):
    from dllm_ais.train.job import run_training

    p = get_preset("tiny-cpu")
    empty = tmp_path / "empty_model"
    empty.mkdir()
    preset = replace(p, model=replace(p.model, path=str(empty)))
    with pytest.raises(ValueError, match="config.json not found"):
        run_training(preset, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_error_messages_name_flags():
    assert name_flags("TrainConfig.learning_rate=-1.0 must be > 0.", "train") == "--lr -1.0 must be > 0."
    assert name_flags("TrainConfig.num_epochs=3 is odd", "train") == "TrainConfig.num_epochs=3 is odd"
    assert name_flags("SamplerConfig.steps=0 must be >= 1", "sample") == "--steps 0 must be >= 1"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_checkpoints_follow_the_umask(tmp_path, umask):
    from dllm_ais.models.checkpoint import save_checkpoint
    from dllm_ais.models.tiny import tiny_model, tiny_tokenizer

    old = os.umask(umask)
    try:
        path = save_checkpoint(tiny_model(), tmp_path / "ckpt", tokenizer=tiny_tokenizer())
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o777 & ~umask
    for f in path.iterdir():
        assert (f.stat().st_mode & 0o777) == 0o666 & ~umask, f.name


def test_sft_warm_up_interrupted_and_resumed_equals_uninterrupted(tmp_path, capsys):
    from dllm_ais.models.tiny import tiny_model, tiny_tokenizer
    from dllm_ais.tasks.arith import sft_pairs
    from dllm_ais.train.sft import sft_loss, warm_up

    tok = tiny_tokenizer()
    pairs = sft_pairs(200, seed=0)
    calls = []

    def loss(model, ids, mask, target, gen, interrupt_at=None):
        calls.append(1)
        if interrupt_at is not None and len(calls) == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of step interrupt_at
        return sft_loss(model, ids, mask, target, 4, gen)

    def run(model, checkpoint=None, interrupt_at=None):
        return warm_up(model, tok, pairs, 6, 4, 1e-3, 16, lambda *a: loss(*a, interrupt_at=interrupt_at), 1, 0,
                       checkpoint=checkpoint)

    whole = run(tiny_model(seed=0))
    partial = tmp_path / "sft-partial.pt"
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        run(tiny_model(seed=0), partial, interrupt_at=3)
    assert "interrupted after 3/6 steps" in capsys.readouterr().err and partial.is_file()
    resumed = run(tiny_model(seed=0), partial)
    ws, wr = whole.state_dict(), resumed.state_dict()
    assert all(torch.equal(ws[k], wr[k]) for k in ws)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    from dllm_ais.train.job import run_training

    p = get_preset("tiny-cpu")
    preset = replace(p, train=replace(p.train, steps=2, prompts_per_step=2, sft_steps=2, sft_batch_size=4,
                                      save_every=1, mismatch_num_draws=2),
                     grpo=replace(p.grpo, num_generations=2))
    out = tmp_path_factory.mktemp("runs") / "run"
    run_training(preset, out, progress=False)
    return out


def test_sample_says_when_the_model_is_untrained_and_takes_runs_and_checkpoints(trained_run, capsys):
    small = ["--prompt", "1+1=", "--gen-length", "8", "--steps", "4", "--block-length", "8"]
    assert main(["sample", *small]) == 0
    assert "UNTRAINED tiny built-in model" in capsys.readouterr().err
    assert main(["sample", "--run", str(trained_run), *small]) == 0
    out, err = capsys.readouterr()
    assert "### 1+1=" in out and "UNTRAINED" not in err and "step-000002" in err
    step1 = trained_run / "checkpoints" / "step-000001"
    assert main(["sample", "--model", str(step1), *small]) == 0
    assert "step-000001" in capsys.readouterr().err
    assert main(["sample", "--run", str(trained_run), "--preset", "tiny-cpu"]) == 2
    assert "--preset cannot be combined" in capsys.readouterr().err


def test_eval_takes_a_checkpoint_dir_and_writes_by_default(trained_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    step1 = trained_run / "checkpoints" / "step-000001"
    assert main(["eval", "--model", str(step1), "--limit", "2", "--gen-length", "8"]) == 0
    assert "step-000001" in capsys.readouterr().out
    task = get_preset("tiny-cpu").train.task  # the run's task (the default preset's)
    assert not (tmp_path / "evals").exists()  # a run's checkpoint: into the run's own evals/, not ./evals/
    written = list((trained_run / "evals").glob(f"{task}-strict-*/{task}-test-gen8/scores.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["n"] == 2
    shutil.rmtree(trained_run / "evals")  # the run fixture is shared


def test_help_texts(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--help"])
    assert "GRPO training of a diffusion" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["plot", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    from dllm_ais.analysis.plot import DEFAULT_KEYS

    assert all(key in flat for key in DEFAULT_KEYS)  # wrapped at spaces, never inside a metric name
    with pytest.raises(SystemExit):
        parser.parse_args(["sample", "--help"])
    assert "hub id" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--help"])
    assert "Score a model on a task's held-out split" in " ".join(capsys.readouterr().out.split())
    from dllm_ais.analysis.variance_cli import build_parser as variance_parser

    with pytest.raises(SystemExit):
        variance_parser().parse_args(["--help"])
    assert "sequences per model forward" in " ".join(capsys.readouterr().out.split())
