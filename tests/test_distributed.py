"""Two-process DDP (gloo, CPU) through `accelerate launch`: two GRPO steps of a tiny run keep the ranks identical.

The helper tests/dist_train_script.py trains through `run_training` into one shared run directory and makes every
rank save its parameters at the start and the end of GRPO. Its reward is a hash of the completion text, so advantages
are non-zero and differ between the ranks' prompts: identical final parameters mean DDP averaged the gradients (a
run whose model is not wrapped ends with every tensor different on the two ranks).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dllm_ais import metrics as M

SCRIPT = Path(__file__).with_name("dist_train_script.py")
TIMEOUT_S = 300


def free_port() -> int:
    """A TCP port that was free a moment ago (for the rendezvous of the launched processes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out: Path, tmp: Path, steps: int = 2, num_processes: int = 2) -> tuple[subprocess.CompletedProcess, float]:
    """`accelerate launch` the helper on `num_processes` CPU processes; returns (completed process, seconds).

    accelerate's `--cpu` launches one process unless mpirun is used, so this uses the torchrun-based launcher
    (`--multi_gpu`); the trainer's Accelerator(cpu=True) makes it a gloo CPU group. HF_HOME points into tmp so that
    no user accelerate config file changes the launch.
    """
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(SCRIPT), str(out), "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HOME=str(tmp / "hf_home"), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=tmp)
    except subprocess.TimeoutExpired as e:
        output = "\n".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        pytest.fail(f"accelerate launch did not finish in {TIMEOUT_S} s; its output:\n{output[-20000:]}")
    return proc, time.perf_counter() - t0


@pytest.mark.slow
def test_two_process_ddp_keeps_ranks_identical(tmp_path):
    out = tmp_path / "run"
    proc, seconds = launch(out, tmp_path)
    output = f"$ {' '.join(proc.args)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 0, output[-20000:]
    print(f"two-process GRPO run: {seconds:.1f} s")

    ranks = [torch.load(out / f"params-rank{i}.pt", weights_only=True) for i in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks), output[-5000:]
    (init0, final0), (init1, final1) = ((r["init"], r["final"]) for r in ranks)
    assert init0.keys() == final0.keys() == init1.keys() == final1.keys() and final0
    same_start = [k for k in init0 if not torch.equal(init0[k], init1[k])]
    assert not same_start, f"ranks started GRPO from different parameters: {same_start}"
    differ = [k for k in final0 if not torch.equal(final0[k], final1[k])]
    assert not differ, f"ranks ended with different parameters (gradients not averaged?): {differ}"
    moved = [k for k in final0 if not torch.equal(init0[k], final0[k])]
    assert moved, "no parameter changed in two GRPO steps"

    rows = M.read_metrics(out)
    assert [r[M.STEP] for r in rows] == [0, 1], "only the main process writes metrics.jsonl, one row per step"
    for row in rows:
        assert row[M.ADV_ZERO_STD] < 1.0, "every group had equal rewards: the test reward should vary"
