"""FSDP2 on 2 gloo CPU processes: the FP8 rollout copy synced from a sharded master, one layer's weight at a time,
equals the copy synced from the full master (plain and LoRA); a full checkpoint of the sharded master and optimizer
equals an unsharded twin's and resumes exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_distributed import free_port

SCRIPT = Path(__file__).with_name("fsdp_sync_script.py")
CHECKPOINT_SCRIPT = Path(__file__).with_name("fsdp_checkpoint_script.py")


@pytest.mark.slow
@pytest.mark.parametrize(("lora", "family"), [
    pytest.param(lora, family, id=f"{'lora' if lora else 'full'}-{family}")
    for family in ("llada", "dream", "sdar") for lora in (False, True)
    if (family, lora) != ("sdar", True)  # SDAR's LoRA merge is the walker's, tested with LLaDA's and Dream's
])
def test_sync_from_fsdp2_shards_equals_sync_from_the_full_master(tmp_path, lora, family):
    """Each family's fused FP8 copy (FusedLLaDA, FusedDream: q/k/v with biases, FusedSDAR: q/k norms) from DTensor
    shards."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(SCRIPT), str(out), *(["--lora"] if lora else []), *([f"--{family}"] if family != "llada" else [])]
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
        assert r["rollout_type"] == {"llada": "FusedLLaDA", "dream": "FusedDream", "sdar": "FusedSDAR"}[family]
        # one tensor gathered at a time, each exactly once: never the whole model
        assert len(r["gathers"]) == r["n_params"] and max(r["gathers"]) == r["largest_param"] < r["total_params"]


@pytest.mark.slow
def test_full_checkpoint_of_an_fsdp2_master_and_optimizer_resumes_exactly(tmp_path):
    """The main process writes full tensors equal to an unsharded twin's; loading them into a fresh sharded model and
    AdamW (other init, other lr) continues exactly as the twin does."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(CHECKPOINT_SCRIPT), str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-20000:]
    main = torch.load(out / "fsdp-ckpt-rank0.pt", weights_only=True)
    assert main["saved_model"].keys() == main["reference_model"].keys()
    for k, v in main["reference_model"].items():
        assert type(main["saved_model"][k]) is torch.Tensor, "a plain tensor, not a DTensor shard"
        torch.testing.assert_close(main["saved_model"][k], v, rtol=0, atol=1e-6, msg=k)
    saved, ref = main["saved_optimizer"], main["reference_optimizer"]
    assert saved["state"].keys() == ref["state"].keys() and saved["state"]
    for idx, state in ref["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(saved["state"][idx][key], value, rtol=0, atol=1e-6, msg=f"{idx} {key}")
    for rank in range(2):
        r = torch.load(out / f"fsdp-ckpt-rank{rank}.pt", weights_only=True)
        for k, v in r["reference_final"].items():
            torch.testing.assert_close(r["resumed"][k], v, rtol=0, atol=1e-6, msg=f"rank {rank} {k}")
        assert any(not torch.equal(r["reference_final"][k], v) for k, v in r["reference_model"].items())
