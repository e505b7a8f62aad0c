"""`dllm-ais train` under accelerate's FSDP2 on 2 gloo CPU processes (tiny LLaDA, FP8 rollouts, full fine-tuning and
LoRA): the sharded run, stopped after 2 steps and resumed to 4, equals one process holding the same global batch.

tests/fsdp_train_script.py runs the CLI in every process with accelerate's FSDP2 plugin built from the launcher's
flags (the one switch from accelerate's CPU default, DDP, to FSDP is explained there). "The same global batch": the
one-process run replays the sharded run's rollouts and mismatch log-weights ℓ (sampling and MC mask draws are seeded
per process, so a fresh one-process run would draw other noise for rank 1's rows) and starts from its initial
trainable parameters; everything else — rewards, advantages, λ, ω, log-probs, losses, updates, FP8 syncs — is
computed afresh, unsharded.

Bounds. λ, ω and the AIS diagnostics are functions of the replayed ℓ and of the rewards, gathered over the global
batch: equal exactly. Losses and parameters differ only by float32 reduction order: FSDP2 reduce-scatters the two
ranks' gradient sums (each rank's loss is its share of the global token mean) where one process sums all rows in one
backward, and the π_θ / π_old forwards see all-gathered weights that drift apart by a few ulps per step (AdamW's
m/√v turns an ulp of gradient into up to an ulp-sized relative change of the update). Measured after the 4 steps:
parameters within 1.4e-7 (full) and 2.2e-8 (LoRA) while they moved up to 1.6e-3, relative loss differences ≤ 1e-5;
the bounds (2e-6 on the parameters, rel 1e-4 on the losses) leave an order of magnitude for this drift and catch a
lost optimizer state, λ EMA or shard, or a resume that garbles the frozen LoRA base (each changes the update by a
large fraction of itself; the last one did, before fsdp_checkpoint.loading_full started from the gathered values).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from test_distributed import free_port, run_launch

from dllm_ais import metrics as M

SCRIPT = Path(__file__).with_name("fsdp_train_script.py")
TIMEOUT_S = 150
FSDP2_FLAGS = ("--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
               "--fsdp_transformer_layer_cls_to_wrap", "LLaDABlock", "--fsdp_state_dict_type", "FULL_STATE_DICT",
               "--fsdp_reshard_after_forward", "true")
"""accelerate launch's FSDP2 flags (docs/accelerate/fsdp2.yaml, on CPU without mixed precision)."""
PARAM_ATOL = 2e-6
SDAR_PARAM_ATOL = 1e-5
LOSS_RTOL = 1e-4


def launch(tmp: Path, args: list[str], num_processes: int = 2, mixed_precision: str = "no",
           block: str = "LLaDABlock") -> float:
    """Run the helper under `accelerate launch` with FSDP2 on `num_processes` CPU processes (1: a plain process),
    wrapping each `block` (DreamDecoderLayer for Dream); returns the seconds it took. HF_HOME points into tmp so that
    no user accelerate config changes the launch."""
    flags = [block if f == "LLaDABlock" else f for f in FSDP2_FLAGS]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *flags, "--num_processes",
                str(num_processes), "--num_machines", "1", "--mixed_precision", mixed_precision,
                "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    cmd = [*(launcher if num_processes > 1 else [sys.executable]), str(SCRIPT), *args]
    proc, seconds = run_launch(cmd, tmp, TIMEOUT_S)
    output = f"$ {' '.join(cmd)}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 0, output[-20000:]
    return seconds


def _ranks(out: Path, world: int) -> list[dict]:
    return [torch.load(out / f"params-rank{i}.pt", weights_only=True) for i in range(world)]


def _final_checkpoint(out: Path, lora: bool) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (ckpt,) = sorted((out / "checkpoints").glob("step-*"))[-1:]
    name = "adapter/adapter_model.safetensors" if lora else "model/model.safetensors"
    return load_file(str(ckpt / name))


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fsdp2_run_resumed_equals_one_process_with_the_global_batch(tmp_path, lora):
    flags = ["--lora-r", "4"] if lora else []
    run, single = tmp_path / "run", tmp_path / "single"
    seconds = launch(tmp_path, ["--out", str(run), "--steps", "2", *flags])
    seconds += launch(tmp_path, ["--out", str(run), "--steps", "4", "--resume"])
    seconds += launch(tmp_path, ["--replay", str(run), "--out", str(single), "--steps", "4", *flags], num_processes=1)
    print(f"FSDP2 run (2 + 2 resumed steps) and its one-process replay: {seconds:.1f} s")
    _equals_one_process(run, single, lora, "FusedLLaDA", steps=4, resumed_at=2)


@pytest.mark.slow
def test_fsdp2_dream_with_fp8_rollouts_equals_one_process(tmp_path):
    """The same for tiny-dream (full fine-tuning, 2 steps): every DreamDecoderLayer sharded, the fused FP8 Dream copy
    synced from the shards one master linear at a time (models/dream/fused_fp8.py `sync_fused_dream` with gather /
    full), equal to one process holding the global batch."""
    run, single = tmp_path / "run", tmp_path / "single"
    dream = ["--base", "tiny-dream"]
    seconds = launch(tmp_path, [*dream, "--out", str(run), "--steps", "2"], block="DreamDecoderLayer")
    seconds += launch(tmp_path, [*dream, "--replay", str(run), "--out", str(single), "--steps", "2"], num_processes=1)
    print(f"FSDP2 Dream run (2 steps) and its one-process replay: {seconds:.1f} s")
    _equals_one_process(run, single, False, "FusedDream", steps=2, resumed_at=0)


@pytest.mark.slow
def test_fsdp2_sdar_with_fp8_rollouts_equals_one_process(tmp_path):
    """The same for tiny-sdar (full fine-tuning, 2 steps, the block-wise ELBO): every SDARDecoderLayer sharded, the
    fused FP8 SDAR copy (q/k norms in its producers) synced from the shards one master linear at a time
    (models/sdar/fused_fp8.py `sync_per_tensor` with gather / full), equal to one process holding the global batch.
    The ELBO's mask draws are keyed by global row for this comparison (tests/fsdp_train_script.py
    `row_keyed_sdar_draws`: the trainer's own draws depend on the rows beside each row).

    Parameters within SDAR_PARAM_ATOL: measured 2.25e-6 at most (a few elements of layer 0's up / q projections; mean
    difference 1e-9) while they moved 2.0e-3 — tiny-sdar's lr 5e-4 and AdamW's m/√v on elements whose gradient is
    near eps turn reduction-order ulps into more than LLaDA's 1.4e-7; λ, ω exact and losses within rel 1e-4 as for
    the others. 1e-5 is still 200× below the step's movement (a lost shard or optimizer state moves it by ~1e-3)."""
    run, single = tmp_path / "run", tmp_path / "single"
    sdar = ["--base", "tiny-sdar"]
    seconds = launch(tmp_path, [*sdar, "--out", str(run), "--steps", "2"], block="SDARDecoderLayer")
    seconds += launch(tmp_path, [*sdar, "--replay", str(run), "--out", str(single), "--steps", "2"], num_processes=1)
    print(f"FSDP2 SDAR run (2 steps) and its one-process replay: {seconds:.1f} s")
    _equals_one_process(run, single, False, "FusedSDAR", steps=2, resumed_at=0, param_atol=SDAR_PARAM_ATOL)


def _equals_one_process(run: Path, single: Path, lora: bool, rollout_type: str, steps: int, resumed_at: int,
                        param_atol: float = PARAM_ATOL):
    """The sharded run in `run` against its one-process replay in `single` (module docstring's bounds)."""
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["rollout_precision"] == "fp8" and config["train"]["lora_r"] == (4 if lora else 0)
    ranks, (one,) = _ranks(run, 2), _ranks(single, 1)
    for r in ranks:  # the trainer really ran sharded: accelerate's FSDP2, every master parameter a DTensor shard
        assert r["distributed_type"] == "DistributedType.FSDP" and r["is_fsdp2"] and r["world"] == 2
        assert r["sharded_params"] == r["params"] > 0
        assert r["rollout_type"] == rollout_type, "the FP8 rollout copy (synced from the shards)"
        assert r["resumed_at"] == resumed_at and len(r["records"]) == steps
    assert one["distributed_type"] == "DistributedType.NO" and one["sharded_params"] == 0

    for step in range(steps):  # λ, ω from the replayed ℓ and the rewards over the global batch: exact
        rec = one["records"][step]
        assert torch.equal(rec["completion_ids"], torch.cat([r["records"][step]["completion_ids"] for r in ranks]))
        for r in ranks:  # (λ is NaN where the AIS statistics are undefined, e.g. a batch without reward variance)
            torch.testing.assert_close(r["records"][step]["lam"], rec["lam"], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(torch.cat([r["records"][step]["omega"] for r in ranks]), rec["omega"], rtol=0,
                                   atol=0, equal_nan=True, msg=f"step {step}: ω")
    sharded_rows, single_rows = M.read_metrics(run), M.read_metrics(single)
    assert [r[M.STEP] for r in sharded_rows] == list(range(steps))
    for a, b in zip(sharded_rows, single_rows, strict=True):
        for key in (M.AIS_LAMBDA, M.AIS_ESS, M.AIS_DIVERGENCE, M.AIS_VAR_AMP):
            assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), (a[M.STEP], key, a[key], b[key])
        for key in (M.REWARD_MEAN, M.LOSS_POLICY, M.LOSS_KL, M.LOSS_CLIP):
            assert math.isclose(a[key], b[key], rel_tol=LOSS_RTOL, abs_tol=1e-7), (a[M.STEP], key, a[key], b[key])
    assert all(math.isfinite(r[M.LOSS_POLICY]) and math.isfinite(r[M.MISMATCH_KL]) for r in sharded_rows), \
        "every step updated (a broken resume shows as NaN mismatch, which the replay would inherit)"
    assert any(abs(r[M.LOSS_POLICY]) > 1e-4 for r in single_rows), "the loss should not be zero"

    init, final = ranks[0]["init"], ranks[0]["final"]
    assert init.keys() == one["final"].keys() and init
    for k, v in init.items():  # every rank gathered the same full tensors; the replay started from them
        assert torch.equal(ranks[1]["init"][k], v) and torch.equal(ranks[1]["final"][k], final[k]), k
        assert torch.equal(one["init"][k], v), k
    moved = max(float((final[k] - init[k]).abs().max()) for k in init)
    assert moved > 100 * param_atol, f"the parameters barely moved ({moved:.2e}): the comparison would be vacuous"
    worst = max(float((final[k] - v).abs().max()) for k, v in one["final"].items())
    print(f"largest parameter difference to one process: {worst:.2e} (parameters moved up to {moved:.2e})")
    for k, v in one["final"].items():  # frozen LoRA base weights included: a resume must not touch them
        torch.testing.assert_close(final[k], v, rtol=0, atol=param_atol, msg=k)

    # the final checkpoints (written from gathered shards / by one process) hold the same weights
    sharded_ckpt, single_ckpt = _final_checkpoint(run, lora), _final_checkpoint(single, lora)
    assert sharded_ckpt.keys() == single_ckpt.keys() and sharded_ckpt
    for k, v in single_ckpt.items():
        assert type(sharded_ckpt[k]) is torch.Tensor
        torch.testing.assert_close(sharded_ckpt[k], v, rtol=0, atol=param_atol, msg=k)


@pytest.mark.slow
def test_fsdp2_lora_on_a_bf16_base_with_bf16_mixed_precision_trains_and_resumes(tmp_path):
    """docs/accelerate/fsdp2.yaml's 8-GPU setup in small: LoRA on a bfloat16 base, accelerate's mixed_precision
    bf16 (FSDP2 keeps fp32 sharded adapters, gathers in bf16). No one-process twin at this precision: the run must
    shard, keep the dtypes, train finite steps and resume (an FSDP2 group of bf16 base and fp32 adapter weights needs
    the bf16 policy to all-gather them together)."""
    run = tmp_path / "run"
    launch(tmp_path, ["--out", str(run), "--steps", "2", "--lora-r", "4", "--dtype", "bfloat16"],
           mixed_precision="bf16")
    launch(tmp_path, ["--out", str(run), "--steps", "3", "--resume"], mixed_precision="bf16")
    rows = M.read_metrics(run)
    assert [r[M.STEP] for r in rows] == [0, 1, 2]
    assert all(math.isfinite(r[M.LOSS_POLICY]) and math.isfinite(r[M.MISMATCH_KL]) for r in rows), rows
    for r in _ranks(run, 2):
        assert r["is_fsdp2"] and r["sharded_params"] == r["params"] > 0 and r["resumed_at"] == 2
        lora = {k: v for k, v in r["final"].items() if "lora_" in k}
        assert lora and all(v.dtype == torch.float32 for v in lora.values()), "fp32 adapter masters"
        assert all(v.dtype == torch.bfloat16 for k, v in r["final"].items() if k not in lora), "bf16 frozen base"
        assert any(not torch.equal(v, r["init"][k]) for k, v in lora.items()), "the adapters trained"


def _preset(**changes):
    from dataclasses import replace

    from dllm_ais.presets import get_preset

    p = get_preset("tiny-cpu")
    model = {k: changes.pop(k) for k in ("family", "dtype") if k in changes}
    return replace(p, model=replace(p.model, **model), train=replace(p.train, **changes))


@pytest.mark.parametrize(("version", "changes", "refused"), [
    (None, {"dtype": "bfloat16"}, None),  # not FSDP: nothing to refuse here
    (1, {}, "fsdp_version: 2"),  # FP8 rollouts need FSDP2's per-layer gather
    (1, {"rollout_precision": "fp4"}, "fsdp_version: 2"),
    (1, {"rollout_precision": "bf16"}, None),
    (2, {}, None),  # the tested setup: float32 full fine-tuning, FP8 rollouts
    (2, {"dtype": "bfloat16"}, "--dtype float32"),  # a sharded bf16 optimizer would lose small updates
    (2, {"dtype": "bfloat16", "lora_r": 8}, None),  # LoRA adapters are fp32
    (2, {"family": "qwen", "lora_r": 8}, "Qwen3"),  # the fused Qwen rollout copy syncs from full weights only
    (2, {"family": "dream", "lora_r": 8}, None),  # the fused Dream copy syncs from the shards (gather / full)
    (2, {"family": "dream", "lora_r": 8, "rollout_precision": "bf16"}, None),
    (2, {"family": "sdar", "lora_r": 8}, None),  # the fused SDAR copy syncs from the shards (gather / full)
    (2, {"policy_logprob": "mdpo"}, "--policy-logprob mdpo under FSDP"),  # forward counts differ between ranks
    (2, {"policy_logprob": "dtreerpo"}, "--policy-logprob dtreerpo under FSDP"),
    (2, {"policy_logprob": "coupled"}, None),
])
def test_fsdp_refusals(version, changes, refused):
    from dllm_ais.train.fsdp_setup import fsdp_refusals, fsdp_version_from_env

    reason = fsdp_refusals(_preset(**changes), version)
    assert reason is None if refused is None else refused in reason
    assert fsdp_version_from_env({}) is None and fsdp_version_from_env({"ACCELERATE_USE_FSDP": "false"}) is None
    assert fsdp_version_from_env({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}) == 2
    assert fsdp_version_from_env({"ACCELERATE_USE_FSDP": "true"}) == 1  # accelerate's default


def test_fsdp1_with_fp8_rollouts_is_refused_before_the_run_directory_exists(tmp_path, monkeypatch):
    """What `accelerate launch --use_fsdp --fsdp_version 1` exports: refused before SFT, model or run directory."""
    from dllm_ais.train.job import run_training

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ValueError, match="fsdp_version: 2"):
        run_training(_preset(steps=1, sft_steps=1), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
