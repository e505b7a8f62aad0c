"""SDAR's rows in rung 2 of the estimator ladder (issue 42 item 5): a tiny SDAR is trained by ladder_models (SFT, then
RL with its block-wise ELBO) and measured by one cell end to end; adding SDAR's grid rows leaves every other cell's
cache key (and so its cached result) unchanged."""

from dataclasses import replace
from pathlib import Path

import torch

from dllm_ais.analysis import ladder
from dllm_ais.analysis import ladder_models as LM
from dllm_ais.analysis import ladder_rung2 as R2
from dllm_ais.analysis.mc_ground_truth import MCConfig


def test_sdar_rows_leave_other_cells_keys_unchanged():
    """A cell's cache key is a function of the settings that shape it, not of the grid: the full grid with and
    without SDAR's rows gives every LLaDA / Dream cell the same key."""
    cfg = ladder.rung2_config("full", (8, 16), 4096)
    assert any(f == "sdar" for f, _, _ in cfg.grid)
    without = replace(cfg, grid=tuple(g for g in cfg.grid if g[0] != "sdar"))
    others = [c for c in R2.cells(cfg) if c[0] != "sdar"]
    assert others == R2.cells(without) and len(others) == 20
    for cell in others:
        assert R2._cell_cache(cfg, Path("r"), cell) == R2._cell_cache(without, Path("r"), cell)


def test_sdar_cell_end_to_end(tmp_path):
    """ladder_models trains a tiny SDAR (SFT chunks, one RL step with --policy-logprob elbo) and rung 2 measures its
    dynamic-strategy cell: every SDAR estimator has finite figures, the path law's selection-including likelihood is
    the target's own estimator (bias² ≈ 0 within its interval), and rows are the measured forwards."""
    torch.set_num_threads(1)
    cfg = R2.Rung2Config(grid=(("sdar", "low_confidence_dynamic", (8,)),), checkpoints=("rl",),
                         mc=MCConfig(N=16, G=4, blocks=4, budgets=(1, 2)), paths=((8, 128),), prompts=8,
                         models=LM.LadderModelConfig(d_model=16, mlp=16, sft_max_steps=20, sft_chunk=10, rl_steps=1,
                                                     eval_prompts=8))
    doc = R2.run(cfg, tmp_path, log=lambda *_: None)
    (cell,) = doc["cells"].values()
    assert cell["cell"] == "sdar/rl/L8/low_confidence_dynamic" and cell["paths"] == 128
    est = cell["estimators"]
    assert set(est) == {"one_step-block:1", "elbo-block:1", "elbo-block:2", "trajectory:all", "trajectory-merge2:2",
                        "trajectory-merge4:4", "trajectory-selection:all"}
    for k, f in est.items():
        assert f["mse"]["value"] > 0 and f["mse"]["half"] > 0, k  # (128 paths: the cosine's ratio estimate is noisy)
    assert est["elbo-block:2"]["rows"]["value"] == 2.0
    assert 1.0 <= est["trajectory-merge4:4"]["rows"]["value"] <= est["trajectory:all"]["rows"]["value"] <= 4.0
    sel = est["trajectory-selection:all"]["bias_sq"]
    assert abs(sel["value"]) <= max(sel["half"], 1e-6)
    info = cell["model"]["train"]
    assert info["family"] == "sdar" and len(info["rl_rewards"]) == 1


def test_merge_keeps_stored_cells_and_refuses_conflicts():
    """ladder_merge: the stored cells stay, the added ones join, the grid is the union in GRID's order; a run with
    other settings or a differing copy of a stored cell is refused."""
    import pytest

    from dllm_ais.analysis.ladder_merge import merge_docs

    base = {"config": {"grid": [["llada", "threshold", [8]], ["dream", "entropy", [8, 16]]], "paths": [[8, 4096]]},
            "cells": {"llada/rl/L8/threshold": {"J": 0.5}}}
    add = {"config": {"grid": [["sdar", "low_confidence_dynamic", [8]], ["llada", "threshold", [16]]],
                      "paths": [[8, 4096]]}, "cells": {"sdar/rl/L8/low_confidence_dynamic": {"J": 0.25}}}
    doc = merge_docs(base, add)
    assert doc["config"]["grid"] == [["llada", "threshold", [8, 16]], ["dream", "entropy", [8, 16]],
                                     ["sdar", "low_confidence_dynamic", [8]]]
    assert doc["cells"] == {**base["cells"], **add["cells"]}
    with pytest.raises(ValueError, match="paths"):
        merge_docs(base, {**add, "config": {**add["config"], "paths": [[8, 1024]]}})
    with pytest.raises(ValueError, match="differs"):
        merge_docs(base, {**add, "cells": {"llada/rl/L8/threshold": {"J": 0.4}}})
