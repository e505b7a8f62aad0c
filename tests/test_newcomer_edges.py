"""The edges a new user met (issue 44), each re-run as it was met: one line saying what to do, before anything is
written, without importing torch where no model is needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from dllm_ais.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def _cli_light(args, env=None):
    """main(args) in a fresh interpreter -> (exit code, stderr, whether torch got imported)."""
    code = ("import sys; from dllm_ais.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    return p.returncode, p.stderr, "TORCH True" in p.stdout


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _cpu_torch() -> bool:
    import importlib.metadata

    return importlib.metadata.version("torch").endswith("+cpu")


@pytest.mark.parametrize("args, needle", [
    pytest.param(["--device", "cuda"], "--device cuda: torch sees no CUDA device here",
                 marks=pytest.mark.skipif(not _cpu_torch(), reason="needs a CPU-only torch build (its version ends "
                                          "in +cpu) to refuse CUDA without importing torch")),
    (["--fp8-backend", "triton"], "--fp8-backend triton: FP8 backend 'triton' cannot run on cpu"),
    (["--fp8-backend", "cublas"], "--fp8-backend cublas: FP8 backend 'cublas' cannot run on cpu"),
    (["--model", str(FIXTURES / "dream_tiny")], "holds a Dream model but the preset's family is 'llada'"),
])
def test_refusals_that_need_no_model_come_before_torch(tmp_path, args, needle):
    out = tmp_path / "run"
    rc, err, torch_imported = _cli_light(["train", *args, "--out", str(out)], env={"TRITON_INTERPRET": "0"})
    assert rc == 2 and needle in _one_line(err) and not torch_imported and not out.exists(), err


def test_a_hub_id_that_cannot_be_fetched_is_one_line_of_ours(tmp_path):
    out = tmp_path / "run"
    rc, err, torch_imported = _cli_light(["train", "--model", "no-such-org/no-such-model", "--out", str(out)],
                                         env={"HF_HUB_OFFLINE": "1"})
    line = _one_line(err)
    assert rc == 2 and "hub download failed" in line and "--model DIR" in line and not torch_imported, err
    assert not out.exists()


def test_a_truncated_config_is_refused_before_torch(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llada", "d_model": ')
    rc, err, torch_imported = _cli_light(["train", "--model", str(model), "--out", str(tmp_path / "run")])
    assert rc == 2 and "looks truncated" in _one_line(err) and not torch_imported


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_weights_that_do_not_match_config_json_leave_no_run_directory(tmp_path, capsys, family):
    """config.json says one width, the tensors another: refused from the safetensors headers before `--out` exists
    (it used to print `run directory: X`, leave X/config.json and make the fixed command fail on 'already holds')."""
    model = tmp_path / "m"
    if family == "dream":
        import shutil

        shutil.copytree(FIXTURES / "dream_tiny", model)
        key, preset = "hidden_size", "tiny-dream"
    else:
        from dllm_ais.models.checkpoint import save_checkpoint
        from dllm_ais.models.tiny import tiny_model, tiny_tokenizer

        save_checkpoint(tiny_model(seed=0), model, tokenizer=tiny_tokenizer())
        key, preset = "d_model", "tiny-cpu"
    config = json.loads((model / "config.json").read_text())
    config[key] = config[key] + 32
    (model / "config.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    assert main(["train", "--preset", preset, "--model", str(model), "--out", str(out)]) == 2
    assert "config.json implies" in capsys.readouterr().err and not out.exists()


def test_resume_without_out_asks_for_the_run_and_lists_the_newest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("old", "new"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.json").write_text("{}")
    os.utime(tmp_path / "runs" / "old" / "config.json", (1, 1))
    assert main(["train", "--resume"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "add --out RUN" in line and line.index("runs/new") < line.index("runs/old")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["new", "old"]  # nothing invented


def test_out_on_a_directory_of_other_files_is_refused(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["train", "--out", str(mine)]) == 2
    assert "holds other files (notes.txt)" in _one_line(capsys.readouterr().err)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_spg_sets_beta_to_zero_and_an_explicit_beta_is_refused_by_its_flag(capsys):
    from dllm_ais.commands.train_preset import train_preset

    parser = __import__("dllm_ais.cli", fromlist=["build_parser"]).build_parser()
    preset = train_preset(parser.parse_args(["train", "--policy-logprob", "spg"]))
    assert preset.grpo.beta == 0 and "β set to 0 (the preset's 0.04" in capsys.readouterr().err
    assert main(["train", "--policy-logprob", "spg", "--beta", "0.04"]) == 2
    assert "--beta" in _one_line(capsys.readouterr().err)


def test_spg_logs_no_clip_fractions_for_a_loss_without_a_clip():
    import torch

    from dllm_ais.rl.spg import spg_loss

    out = spg_loss(torch.tensor([-1.0, -2.0], requires_grad=True), torch.tensor([1.0, -1.0]), torch.tensor([3, 4]))
    names = out.metrics()
    assert "loss/policy" in names and not [n for n in names if n.startswith("loss/clip_frac")]


def test_a_run_names_its_objective_and_policy_likelihood():
    from dataclasses import replace

    from dllm_ais.presets import get_preset

    p = get_preset("tiny-cpu")
    assert p.objective == "AIS-GRPO" and "policy likelihood one_step" in p.summary()
    elbo = replace(p, train=replace(p.train, policy_logprob="elbo"))
    assert "policy likelihood elbo K=" in elbo.summary() and elbo.summary() != p.summary()
    spg = replace(p, train=replace(p.train, policy_logprob="spg"), grpo=replace(p.grpo, beta=0.0))
    assert spg.objective == "SPG (AIS)"


def test_progress_without_a_terminal_is_plain_lines():
    from dllm_ais import progress

    stream, now = SimpleNamespace(lines=[]), [0.0]
    stream.write = stream.lines.append
    stream.flush = lambda: None
    bar = progress._LineBar(None, 10, "AIS-GRPO one_step", "step", stream=stream, every=30, clock=lambda: now[0])
    for _ in range(4):
        now[0] += 10
        bar.set_postfix(reward="0.500")
        bar.update(1)
    bar.close()
    text = "".join(stream.lines)
    assert "\r" not in text and text.splitlines() == ["AIS-GRPO one_step: 3/10 step (30 %), 30 s; reward=0.500",
                                                      "AIS-GRPO one_step: 4/10 step (40 %), 40 s; reward=0.500"]


def test_progress_bar_picks_lines_off_a_terminal_and_silence_for_transient_bars(monkeypatch):
    from dllm_ais import progress

    monkeypatch.setattr(sys, "stderr", SimpleNamespace(isatty=lambda: False, write=lambda s: None, flush=lambda: 0))
    assert isinstance(progress.progress_bar(range(3), desc="x"), progress._LineBar)
    assert type(progress.progress_bar(range(3), desc="x", leave=False)) is progress._NoBar


def test_preemption_message_counts_steps_as_the_checkpoint_names_them(capsys):
    from dllm_ais.train import trainer_state

    fake = SimpleNamespace(step=5, _stop_reason="SIGTERM", run=SimpleNamespace(path="runs/r"))
    trainer_state.report_preempted(fake, Path("runs/r/checkpoints/step-000005"))
    err = capsys.readouterr().err
    assert "stopped after 5 steps" in err and "step-000005" in err and "`dllm-ais train --out runs/r --resume`" in err


def test_a_dream_checkpoint_loads_without_transformers_warnings():
    from dllm_ais.models.dream.checkpoint import load_dream

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_dream(FIXTURES / "dream_tiny", dtype=__import__("torch").float32)
    assert not [w for w in caught if "rope_scaling" in str(w.message)], [str(w.message) for w in caught]


def test_sigterm_in_the_warm_up_says_a_resume_command_that_works(tmp_path, monkeypatch, capsys):
    """SIGTERM during the SFT warm-up: exit 75 with `dllm-ais train --out RUN --resume`, which continues the warm-up
    and trains; resuming the finished run says that --steps extends it."""
    from dllm_ais.train import sft

    step = sft._sft_step
    calls = []

    def stopped_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's stop, in the middle of the first step
        return step(*args, **kwargs)

    monkeypatch.setattr(sft, "_sft_step", stopped_once)
    out = tmp_path / "run"
    small = ["--sft-steps", "3", "--steps", "1", "--no-progress"]
    assert main(["train", "--out", str(out), *small]) == 75
    err = capsys.readouterr().err
    assert f"`dllm-ais train --out {out} --resume`" in err and (out / "sft-partial.pt").is_file()
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert "the SFT warm-up continues from" in capsys.readouterr().err and len(calls) == 3
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    out_text, err = capsys.readouterr()
    assert "pass --steps N (more than 1) with --resume to extend it" in err and ": 0 steps in" in out_text
