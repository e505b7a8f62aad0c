"""A scheduler's stop and a hard kill, on the real `dllm-ais train` (tests/preempt_train_script.py: cli.main on a
tiny preset): SIGTERM / SIGUSR1 finish the step, write a verified checkpoint and exit with 75 ("resume me") on every
process of a run, one process's signal stopping all; a `kill -9` after a wall-time checkpoint resumes from it; and
each `--resume` continues bit-identically to the uninterrupted run (metrics and weights)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm_ais import metrics as M
from dllm_ais.train.interrupt import RESUME_EXIT_CODE
from dllm_ais.train.run_dir import RunDir

SCRIPT = Path(__file__).with_name("preempt_train_script.py")
STEPS = 8
TIMEOUT_S = 300
pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")


def _env(tmp: Path) -> dict[str, str]:
    pids = tmp / "pids"
    pids.mkdir(exist_ok=True)
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HOME=str(tmp / "hf_home"), HF_HUB_OFFLINE="1",
                PYTHONUNBUFFERED="1", PREEMPT_PID_DIR=str(pids))


def _start(tmp: Path, out: Path, *flags: str, processes: int = 1) -> subprocess.Popen:
    """The train command on `processes` gloo CPU processes (accelerate's torchrun launcher, as test_distributed)."""
    from test_distributed import free_port

    for f in (tmp / "pids").glob("*.pid") if (tmp / "pids").is_dir() else ():
        f.unlink()
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(free_port())]
    cmd = [*(launcher if processes > 1 else [sys.executable]), str(SCRIPT), "--out", str(out), *flags]
    return subprocess.Popen(cmd, cwd=tmp, env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the run did not finish in {TIMEOUT_S} s:\n{out[-5000:]}\n{err[-10000:]}")
    return proc.returncode, out + err


def _wait(proc: subprocess.Popen, ready, what: str) -> None:
    """Poll until ready() (the run is where the test wants to signal it); fail if the run ends first."""
    t0 = time.monotonic()
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {what}:\n{''.join(proc.communicate())[-10000:]}")
        if time.monotonic() - t0 > TIMEOUT_S:
            proc.kill()
            pytest.fail(f"no {what} after {TIMEOUT_S} s")
        time.sleep(0.05)


def _rows(out: Path) -> int:
    try:
        return len(M.read_metrics(out))
    except ValueError:  # a line being written
        return 0


def _latest_step(out: Path) -> int:
    try:
        latest = RunDir(out).latest()
    except Exception:  # the pointer being replaced
        return -1
    return -1 if latest is None else int(latest.name[5:])


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", M.ROLLOUT_TOKENS_PER_S))} for r in rows]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(RunDir(out).latest() / "model" / "model.safetensors"))


def _same_run(whole: Path, resumed: Path) -> None:
    assert _comparable(M.read_metrics(resumed)) == _comparable(M.read_metrics(whole))
    a, b = _weights(whole), _weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert RunDir(resumed).latest().name == f"step-{STEPS:06d}"


def _stopped_by_signal(tmp: Path, out: Path, sig: int, processes: int) -> int:
    """Start a run, send `sig` to one of its processes once the first step is logged; check the stop; its step."""
    proc = _start(tmp, out, "--steps", str(STEPS), processes=processes)
    _wait(proc, lambda: _rows(out) >= 1 and len(list((tmp / "pids").glob("*.pid"))) == processes, "a first step")
    target = max(int(f.read_text()) for f in (tmp / "pids").glob("*.pid"))  # the last rank of a launch
    os.kill(target, sig)
    code, log = _finish(proc)
    codes = [int((out / f"exit-rank{r}.txt").read_text()) for r in range(processes)]
    assert codes == [RESUME_EXIT_CODE] * processes, log[-10000:]
    if processes == 1:
        assert code == RESUME_EXIT_CODE
    assert f"run directory: {out}" in log  # said at the start: this run never reached its summary line
    assert "written and verified" in log and f"exiting with {RESUME_EXIT_CODE}" in log, log[-5000:]
    step = _latest_step(out)
    assert 1 <= step < STEPS, log[-5000:]
    RunDir.verify(RunDir(out).latest())  # sizes and sha256 against the manifest
    assert [r[M.STEP] for r in M.read_metrics(out)] == list(range(step)), "every process stopped after step - 1"
    return step


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """The uninterrupted run, in this process (what the script's train command runs, without its start-up)."""
    from dist_train_script import small_preset

    from dllm_ais.train.job import run_training

    out = tmp_path_factory.mktemp("whole") / "run"
    run_training(small_preset(steps=STEPS, sft_steps=2), out, progress=False)
    return out


@pytest.mark.slow
def test_sigterm_then_kill_9_after_a_timed_checkpoint_both_resume_exactly(whole_run, tmp_path):
    out = tmp_path / "run"
    stopped = _stopped_by_signal(tmp_path, out, signal.SIGTERM, processes=1)
    # resume with a wall-time checkpoint after every step (the interval is 12 ms), keeping 2; kill -9 after the
    # first checkpoint of this launch
    proc = _start(tmp_path, out, "--resume", "--save-every-minutes", "0.0002", "--keep-checkpoints", "2")
    _wait(proc, lambda: _latest_step(out) > stopped, "a timed checkpoint")
    proc.kill()
    _, log = _finish(proc)
    assert f"continuing from {out / 'checkpoints' / f'step-{stopped:06d}'} at step {stopped}" in log, log[-5000:]
    killed_at = _latest_step(out)
    assert killed_at > stopped
    assert len(RunDir(out).step_dirs()) <= 2, "--keep-checkpoints 2"
    code, log = _finish(_start(tmp_path, out, "--resume"))
    assert code == 0, log[-10000:]
    assert f"continuing from {out / 'checkpoints' / f'step-{killed_at:06d}'} at step {killed_at}" in log
    assert "metrics.jsonl rows" in log  # which rows were dropped (or that none were)
    _same_run(whole_run, out)


@pytest.mark.slow
def test_sigusr1_to_one_of_two_processes_stops_both_and_resume_is_exact(tmp_path):
    whole = tmp_path / "whole"
    code, log = _finish(_start(tmp_path, whole, "--steps", str(STEPS), processes=2))
    assert code == 0, log[-10000:]
    out = tmp_path / "run"
    _stopped_by_signal(tmp_path, out, signal.SIGUSR1, processes=2)
    code, log = _finish(_start(tmp_path, out, "--resume", processes=2))
    assert code == 0, log[-10000:]
    _same_run(whole, out)


@pytest.mark.slow
def test_sigterm_to_the_main_process_during_the_sft_warm_up_stops_both(tmp_path):
    """The main process runs the warm-up while the other waits (main_process_first): a SIGTERM to the main process
    there saves the warm-up's state and stops both processes with 75 — before, the other waited for ever at a barrier
    the main process never reached."""
    out = tmp_path / "run"
    proc = _start(tmp_path, out, "--steps", "2", "--sft-steps", "400", processes=2)
    _wait(proc, lambda: (out / "config.json").is_file() and len(list((tmp_path / "pids").glob("*.pid"))) == 2,
          "the warm-up's start")
    time.sleep(1.0)  # into the warm-up (400 steps: far from its end)
    os.kill(int((tmp_path / "pids" / "rank0.pid").read_text()), signal.SIGTERM)
    code, log = _finish(proc)  # fails the test after TIMEOUT_S if a process hangs
    codes = [int((out / f"exit-rank{r}.txt").read_text()) for r in range(2)]
    assert codes == [RESUME_EXIT_CODE] * 2, log[-10000:]
    assert (out / "sft-partial.pt").is_file() and not (out / "sft").exists(), log[-5000:]
    assert "process 1: stopping with the run (SIGTERM before the first step)" in log, log[-5000:]
