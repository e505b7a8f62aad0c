"""FSDP2 on 2 gloo CPU processes: the FP8 rollout copy synced from a sharded master, one layer's weight at a time,
equals the copy synced from the full master (plain and LoRA)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_distributed import free_port

SCRIPT = Path(__file__).with_name("fsdp_sync_script.py")


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sync_from_fsdp2_shards_equals_sync_from_the_full_master(tmp_path, lora):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(SCRIPT), str(out), *(["--lora"] if lora else [])]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-20000:]
    for rank in range(2):
        r = torch.load(out / f"fsdp-rank{rank}.pt", weights_only=True)
        assert r["sharded_params"] == r["n_params"] > 0, "every master parameter was a DTensor shard"
        assert r["sharded"].keys() == r["full"].keys()
        differ = [k for k in r["full"] if not torch.equal(r["sharded"][k], r["full"][k])]
        assert not differ, f"rank {rank}: synced from shards differs from synced from the full master: {differ}"
        assert any(k.endswith("weight_q") for k in r["full"]), "the rollout copy has FP8 layers"
        # one tensor gathered at a time, each exactly once: never the whole model
        assert len(r["gathers"]) == r["n_params"] and max(r["gathers"]) == r["largest_param"] < r["total_params"]
