"""The mismatch diagnostics (mismatch/ppl_*, chi2_*, kl_token, k3_token) of a multi-process run are the global
batch's (docs/gpus.md, "AIS over the global batch"), not a mean of per-process values: 2 gloo processes with
different numbers of rows and tokens each get exactly what one process holding every row computes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from global_diagnostics_script import rows
from test_distributed import free_port

from dllm_ais.rl.mismatch_stats import rollout_diagnostics

SCRIPT = Path(__file__).with_name("global_diagnostics_script.py")


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(t.shape[0], width - t.shape[1])], dim=1)


def test_rollout_diagnostics_over_two_processes_equal_one_process_with_every_row(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(SCRIPT), str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-20000:]
    local = [rows(r) for r in range(2)]
    width = max(x[0].shape[1] for x in local)
    whole = rollout_diagnostics(*(torch.cat([_pad(x[i], width) for x in local]) for i in range(3)))
    mean_of_locals = {k: (rollout_diagnostics(*local[0])[k] + rollout_diagnostics(*local[1])[k]) / 2 for k in whole}
    assert not torch.isclose(mean_of_locals["kl_token"], whole["kl_token"]), "the test batch must tell them apart"
    for rank in range(2):
        got = torch.load(out / f"diag-rank{rank}.pt", weights_only=True)
        assert got.keys() == whole.keys()
        for k, v in whole.items():
            torch.testing.assert_close(got[k], v, rtol=1e-12, atol=0, msg=f"rank {rank}: {k}")
