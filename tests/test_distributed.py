"""Two-process DDP (gloo, CPU) through `accelerate launch`: a tiny AIS-GRPO run equals one process holding the global
batch, keeps the ranks identical, skips the all-reduce of micro-batches before the last, and resumes exactly.

The helper tests/dist_train_script.py trains through `run_training` into one shared run directory and makes every
rank save its parameters at the start and the end of GRPO, with what it rolled out and the order of its backward
passes and gradient all-reduces. Its reward is a hash of the completion text, so advantages are non-zero and differ
between the ranks' prompts: identical final parameters mean DDP averaged the gradients (a run whose model is not
wrapped ends with every tensor different on the two ranks).
"""

from __future__ import annotations

import math
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


def launch(out: Path, tmp: Path, steps: int = 2, num_processes: int = 2,
           extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, float]:
    """`accelerate launch` the helper on `num_processes` CPU processes; returns (completed process, seconds).

    accelerate's `--cpu` launches one process unless mpirun is used, so this uses the torchrun-based launcher
    (`--multi_gpu`); the trainer's Accelerator(cpu=True) makes it a gloo CPU group. HF_HOME points into tmp so that
    no user accelerate config file changes the launch. num_processes = 1 runs the helper as a plain script.
    """
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                str(num_processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(free_port())]
    cmd = [*(launcher if num_processes > 1 else [sys.executable]), str(SCRIPT), str(out), "--steps", str(steps),
           *extra]
    return run_launch(cmd, tmp, TIMEOUT_S)


def run_launch(cmd: list[str], tmp: Path, timeout_s: float) -> tuple[subprocess.CompletedProcess, float]:
    """Run a launch command in `tmp` with one torch thread per process and an HF_HOME inside tmp (no user accelerate
    config changes it); fail the test with the launch's output if it outlasts `timeout_s`. (process, seconds)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HOME=str(tmp / "hf_home"), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=tmp)
    except subprocess.TimeoutExpired as e:
        output = "\n".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        pytest.fail(f"the launch did not finish in {timeout_s} s; its output:\n{output[-20000:]}")
    return proc, time.perf_counter() - t0


def _checked(proc: subprocess.CompletedProcess) -> None:
    output = f"$ {' '.join(proc.args)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 0, output[-20000:]


def _ranks(out: Path, world: int = 2) -> list[dict]:
    return [torch.load(out / f"params-rank{i}.pt", weights_only=True) for i in range(world)]


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", M.ROLLOUT_TOKENS_PER_S))} for r in rows]


STEPS = 4


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """A 4-step two-process run (dapo, 2 micro-batches, ais_ema 0.5), shared by the tests of this file."""
    tmp = tmp_path_factory.mktemp("ddp")
    out = tmp / "run"
    proc, seconds = launch(out, tmp, steps=STEPS)
    _checked(proc)
    print(f"two-process GRPO run: {seconds:.1f} s")
    return out, tmp


@pytest.mark.slow
def test_two_process_ddp_keeps_ranks_identical(two_process_run):
    out, _ = two_process_run
    ranks = _ranks(out)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks)
    (init0, final0), (init1, final1) = ((r["init"], r["final"]) for r in ranks)
    assert init0.keys() == final0.keys() == init1.keys() == final1.keys() and final0
    same_start = [k for k in init0 if not torch.equal(init0[k], init1[k])]
    assert not same_start, f"ranks started GRPO from different parameters: {same_start}"
    differ = [k for k in final0 if not torch.equal(final0[k], final1[k])]
    assert not differ, f"ranks ended with different parameters (gradients not averaged?): {differ}"
    moved = [k for k in final0 if not torch.equal(init0[k], final0[k])]
    assert moved, "no parameter changed in the GRPO steps"

    rows = M.read_metrics(out)
    assert [r[M.STEP] for r in rows] == list(range(STEPS)), "only the main process writes metrics.jsonl"
    for row in rows:
        assert row[M.ADV_ZERO_STD] < 1.0, "every group had equal rewards: the test reward should vary"
    for step in range(STEPS):  # λ and every other AIS statistic comes from the global batch: the same on both ranks
        lam0, lam1 = (r["records"][step]["lam"] for r in ranks)
        assert torch.equal(lam0, lam1), (step, lam0, lam1)


@pytest.mark.slow
def test_micro_batches_before_the_last_skip_the_all_reduce(two_process_run):
    """2 micro-batches per update: DDP all-reduces in the second backward only (accelerator.no_sync on the first)."""
    out, _ = two_process_run
    for rank in _ranks(out):
        events = rank["events"]
        updates, i = 0, 0
        while i < len(events):
            assert events[i:i + 2] == ["backward", "backward"], (i, events)
            i += 2
            n = 0
            while i < len(events) and events[i] == "allreduce":
                i, n = i + 1, n + 1
            assert n >= 1, f"no gradient all-reduce after update {updates}'s last micro-batch: {events}"
            updates += 1
        assert updates == STEPS * 2, f"{updates} updates recorded for {STEPS} steps × 2 iterations: {events}"


@pytest.mark.slow
def test_two_processes_equal_one_process_with_the_global_batch(two_process_run):
    """Same rollouts and ℓ, one process: the same λ and ω (exactly), loss and parameters (up to float reordering)."""
    out, tmp = two_process_run
    single = tmp / "single"
    proc, _ = launch(single, tmp, steps=STEPS, num_processes=1, extra=("--replay", str(out)))
    _checked(proc)
    ranks, (one,) = _ranks(out), _ranks(single, world=1)
    assert torch.equal(ranks[0]["init"]["model.transformer.wte.weight"], one["init"]["model.transformer.wte.weight"])
    for step in range(STEPS):
        rec = one["records"][step]
        assert torch.equal(rec["completion_ids"], torch.cat([r["records"][step]["completion_ids"] for r in ranks]))
        for r in ranks:
            assert torch.equal(r["records"][step]["lam"], rec["lam"]), step
        torch.testing.assert_close(torch.cat([r["records"][step]["omega"] for r in ranks]), rec["omega"],
                                   rtol=0, atol=0, msg=f"step {step}: ω")
    multi, single_rows = M.read_metrics(out), M.read_metrics(single)
    for a, b in zip(multi, single_rows, strict=True):
        for key in (M.AIS_LAMBDA, M.AIS_ESS, M.AIS_DIVERGENCE, M.AIS_VAR_AMP, "ais/log_w_min", "ais/log_w_max"):
            assert a[key] == b[key], (a[M.STEP], key, a[key], b[key])
        for key in (M.REWARD_MEAN, M.LOSS_POLICY, M.LOSS_CLIP):
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-7), (a[M.STEP], key, a[key], b[key])
    assert any(abs(r[M.LOSS_POLICY]) > 1e-4 for r in single_rows), "the loss should not be zero"
    for k, v in one["final"].items():  # the whole Adam update (an element with gradient ≈ 0 may move differently)
        moved, gap = v - one["init"][k], ranks[0]["final"][k] - v
        assert float(gap.norm()) <= 1e-3 * float(moved.norm()) + 1e-9, (k, float(gap.norm()), float(moved.norm()))
    assert any(not torch.equal(one["init"][k], v) for k, v in one["final"].items())


@pytest.mark.slow
def test_resume_of_a_two_process_run_matches_the_uninterrupted_one(two_process_run):
    """ais_ema = 0.5: the λ EMA state (global, the same on every rank) is in the checkpoint."""
    out, tmp = two_process_run
    split = tmp / "split"
    _checked(launch(split, tmp, steps=2)[0])
    _checked(launch(split, tmp, steps=STEPS, extra=("--resume",))[0])
    assert _comparable(M.read_metrics(split)) == _comparable(M.read_metrics(out))
    for whole, resumed in zip(_ranks(out), _ranks(split), strict=True):
        differ = [k for k in whole["final"] if not torch.equal(whole["final"][k], resumed["final"][k])]
        assert not differ, differ
