"""What a run on a shared machine needs, checked fast: checkpoints on a wall-time interval by default with the
newest few kept, a resume that says what it continued from and which metric rows it dropped (also after a kill
during the SFT warm-up), SIGTERM / SIGUSR1 handled as a stop at the step's end, and the CLI's short errors.
(The real signals to a real `dllm-ais train`, one process and two, are in tests/test_preemption.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import fields, replace

import pytest

from dllm_ais import metrics as M
from dllm_ais.cli import build_parser, main
from dllm_ais.config import TrainConfig
from dllm_ais.presets import get_preset
from dllm_ais.rl.config import CorrectionConfig
from dllm_ais.train.run_dir import RunDir


def small_preset(**train):
    """tiny-cpu shrunk to seconds (as tests/test_trainer.py): 2 prompts x 4 generations, a few SFT steps."""
    p = get_preset("tiny-cpu")
    values = dict(steps=2, prompts_per_step=2, sft_steps=2, sft_batch_size=8, mismatch_num_draws=2)
    values.update(train)
    return replace(p, train=replace(p.train, **values), grpo=replace(p.grpo, num_generations=4))


def _default(cls, name: str):
    return next(f.default for f in fields(cls) if f.name == name)


# ------------------------------------------------------------------------------------------------- checkpoints
def test_the_default_run_checkpoints_on_a_wall_time_interval_and_keeps_the_newest():
    tc = TrainConfig()
    assert 0 < tc.save_every_minutes <= 30 and tc.keep_checkpoints >= 2
    for name in ("tiny-cpu", "llada-8b-gsm8k"):
        assert get_preset(name).train.save_every_minutes == tc.save_every_minutes
    with pytest.raises(ValueError, match="save_every_minutes"):
        TrainConfig(save_every_minutes=-1)


def _fake_checkpoints(run: RunDir, steps: list[int], latest: int) -> None:
    for s in steps:
        (run.checkpoints / f"step-{s:06d}").mkdir(parents=True)
        (run.checkpoints / f"step-{s:06d}" / "f").write_text("x")
    (run.checkpoints / "latest").write_text(f"step-{latest:06d}")


def test_prune_keeps_the_newest_the_permanent_and_the_latest(tmp_path):
    run = RunDir(tmp_path)
    _fake_checkpoints(run, [1, 2, 3, 4, 5, 6, 7], latest=7)
    (run.checkpoints / "step-000002.corrupt").mkdir()
    gone = run.prune(3, lambda step: step % 4 == 0)  # step 4: a --save-every checkpoint
    assert sorted(p.name for p in gone) == ["step-000001", "step-000002", "step-000003"]
    assert [p.name for p in run.step_dirs()] == ["step-000007", "step-000006", "step-000005", "step-000004"]
    assert (run.checkpoints / "step-000002.corrupt").is_dir()
    assert not list(run.checkpoints.glob("*.deleting"))
    assert run.prune(0) == [] and len(run.step_dirs()) == 4  # 0 = keep all
    _fake_checkpoints(RunDir(tmp_path / "b"), [1, 2, 3], latest=1)  # `latest` names an old one (a fallback)
    assert [p.name for p in RunDir(tmp_path / "b").prune(1)] == ["step-000002"]


def test_save_clock(monkeypatch):
    from dllm_ais.train import trainer_state

    now = [100.0]
    monkeypatch.setattr(trainer_state.time, "monotonic", lambda: now[0])
    clock = trainer_state.SaveClock(2.0)
    now[0] += 119.0
    assert not clock.due()
    now[0] += 1.0
    assert clock.due()
    clock.reset()
    assert not clock.due()
    now[0] += 1e6
    assert not trainer_state.SaveClock(0.0).due()


def test_the_loop_checkpoints_on_time_and_prunes(tmp_path, capsys):
    """An interval shorter than a step: a checkpoint after every step, the newest 2 kept; the run directory is said
    when the run starts (before the SFT warm-up's first line)."""
    from dllm_ais.train.job import run_training

    out = tmp_path / "run"
    run_training(small_preset(steps=3, save_every_minutes=1e-6, keep_checkpoints=2), out, progress=False)
    assert capsys.readouterr().err.splitlines()[0] == f"run directory: {out}"
    assert [p.name for p in RunDir(out).step_dirs()] == ["step-000003", "step-000002"]
    for ckpt in RunDir(out).step_dirs():
        RunDir.verify(ckpt)
    assert json.loads((out / "config.json").read_text())["train"]["keep_checkpoints"] == 2


# ----------------------------------------------------------------------------------------------- say what happened
def test_a_resume_says_what_it_continued_from_and_which_rows_it_dropped(tmp_path, capsys):
    from dllm_ais.train.job import run_training

    out = tmp_path / "run"
    run_training(small_preset(save_every=1), out, progress=False)
    shutil.rmtree(out / "checkpoints" / "step-000002")  # as if killed after step 1's row, before its checkpoint
    (out / "checkpoints" / "latest").write_text("step-000001")
    capsys.readouterr()
    run_training(small_preset(save_every=1), out, resume=True, progress=False)
    err = capsys.readouterr().err
    assert (f"--resume: continuing from {out / 'checkpoints' / 'step-000001'} at step 1; dropped the metrics.jsonl "
            "rows of step 1 (they are redone)") in err, err
    assert [r[M.STEP] for r in M.read_metrics(out)] == [0, 1]


def test_a_resume_after_a_kill_during_the_sft_warm_up_says_so(tmp_path, capsys):
    """kill -9 during the warm-up leaves config.json and nothing else: the resume says the warm-up starts over."""
    from dllm_ais.train.job import run_training

    out = tmp_path / "run"
    preset = small_preset(steps=1)
    RunDir(out).create(preset, resume=False)  # what the run had written when it was killed
    run_training(preset, out, resume=True, progress=False)
    err = capsys.readouterr().err
    assert "the SFT warm-up starts over at step 0 of 2" in err, err
    assert "has no checkpoint yet: GRPO starts at step 0; no metrics.jsonl rows dropped" in err, err
    assert [r[M.STEP] for r in M.read_metrics(out)] == [0]


# ------------------------------------------------------------------------------------------------------ signals
@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_a_scheduler_signal_asks_for_a_stop_and_is_ignored_once_exiting(sig, capsys):
    from dllm_ais.train.interrupt import RESUME_EXIT_CODE, install_sigint

    reason = []
    before, sigint = signal.getsignal(getattr(signal, sig)), signal.getsignal(signal.SIGINT)
    restore = install_sigint(lambda: bool(reason), reason.append)
    try:
        os.kill(os.getpid(), getattr(signal, sig))
        os.kill(os.getpid(), getattr(signal, sig))  # a repeat changes nothing (no KeyboardInterrupt, one reason)
        assert reason == [sig]
        assert f"exiting with {RESUME_EXIT_CODE}" in capsys.readouterr().err
        restore(True)
        assert signal.getsignal(getattr(signal, sig)) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is sigint
    finally:
        signal.signal(getattr(signal, sig), before)


# ----------------------------------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("argv, flag", [(["train", "--lr", "abc"], "--lr"),
                                        (["train", "--report-to", "nosuchtracker"], "--report-to"),
                                        (["train", "--no-such-flag"], "--no-such-flag")])
def test_argparse_errors_are_one_line_and_a_pointer_to_help(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("dllm-ais train: error:") and flag in lines[0]
    assert "dllm-ais train --help" in lines[1] and "usage" not in " ".join(lines)


def test_ais_tau_help_and_error_quote_the_configs_default(tmp_path, capsys):
    default = _default(CorrectionConfig, "ais_tau")
    train = next(a for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions
                 if "--ais-tau" in a.option_strings)
    assert f"default {default}" in train.help and "0.02" not in train.help
    with pytest.raises(ValueError, match=rf"\(default {default}\)"):
        CorrectionConfig(ais_tau=0.0)
    assert main(["train", "--ais-tau", "0", "--out", str(tmp_path / "r")]) == 2
    assert f"(default {default})" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_data_json_holding_one_object_says_what_a_json_file_must_hold(tmp_path, capsys):
    from dllm_ais.tasks.loading import read_json_rows

    one = tmp_path / "one.json"
    one.write_text(json.dumps({"digits": "1234", "answer": "2345"}, indent=2))
    assert main(["train", "--data", str(one), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "one JSON object" in err and "JSON Lines" in err and "JSON array" in err and "not valid JSON" not in err
    assert not (tmp_path / "r").exists()
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([{"digits": "1234"}, {"digits": "5678"}], indent=2))  # an array spread over lines
    assert read_json_rows(str(array)) == [{"digits": "1234"}, {"digits": "5678"}]
