"""scripts/study_corrections.py --smoke writes summary.json (every required key), the table and the plot; the
study's statistics (t-interval, paired differences, λ recomputed for another τ) against plain computations."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

from dllm_ais.analysis import study

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "study_corrections.py"
REQUIRED = ("seeds", "final_reward_mean", "final_reward_ci95", "heldout_acc_mean", "heldout_acc_ci95", "lambda_mean",
            "lambda_std_over_steps")


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("study_corrections_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_smoke_writes_summary_table_and_plot(script, tmp_path):
    out, work = tmp_path / "report", tmp_path / "work"
    arms = "bf16,fp8-none,fp8-ais"
    assert script.main(["--smoke", "--out", str(out), "--work", str(work), "--arms", arms]) == 0
    doc = json.loads((out / "summary.json").read_text())
    for key in ("command", "machine", "git_sha"):
        assert doc[key], key
    assert "--smoke" in doc["command"]
    assert list(doc["arms"]) == arms.split(",")
    for name, entry in doc["arms"].items():
        for key in REQUIRED:
            assert key in entry, (name, key)
        assert entry["seeds"] == 2 and len(entry["final_reward_ci95"]) == 2
        lo, hi = entry["heldout_acc_ci95"]
        assert lo <= entry["heldout_acc_mean"] <= hi and entry["heldout_n"] == 8
    bf16 = doc["arms"]["bf16"]
    assert bf16["lambda_mean"] == 0.0 and bf16["lambda_std_over_steps"] == 0.0 and bf16["divergence_mean"] == 0.0
    assert doc["arms"]["fp8-none"]["divergence_mean"] > 0
    ais = doc["arms"]["fp8-ais"]
    assert ais["final_reward_vs_bf16"]["pairs"] == 2 and ais["final_reward_vs_uncorrected"]["pairs"] == 2
    table = (out / "README.md").read_text()
    assert "| fp8-ais | 2 |" in table and (out / "trajectories.png").stat().st_size > 0
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 6 and all(len(r["trajectory"]["ais/lambda"]) == 3 for r in runs)
    # one SFT warm-up per seed, shared: every arm of a seed logs the same first-step reward (same start, same seeds)
    first = {(r["arm"], r["seed"]): r["trajectory"]["reward/mean"][0] for r in runs}
    for seed in (0, 1):
        assert first[("fp8-none", seed)] == first[("fp8-ais", seed)]
    # finished runs are reused: a second call trains nothing and reproduces the summary
    before = {p: p.stat().st_mtime_ns for p in work.glob("*/seed*/result.json")}
    assert script.main(["--smoke", "--out", str(out), "--work", str(work), "--arms", arms]) == 0
    assert {p: p.stat().st_mtime_ns for p in work.glob("*/seed*/result.json")} == before
    assert json.loads((out / "summary.json").read_text())["arms"] == doc["arms"]


def test_unknown_arm_is_refused(script, tmp_path):
    with pytest.raises(SystemExit, match="unknown or unavailable arm"):
        script.main(["--smoke", "--out", str(tmp_path), "--work", str(tmp_path), "--arms", "fp9-none"])


def test_mean_ci95_is_the_t_interval():
    values = [0.31, 0.42, 0.38, 0.29, 0.45]
    m, (lo, hi) = study.mean_ci95(values)
    half = 2.776 * statistics.stdev(values) / math.sqrt(5)  # t_{0.975, 4}
    assert m == pytest.approx(statistics.mean(values))
    assert (lo, hi) == pytest.approx((m - half, m + half))
    assert study.t_quantile_975(1) == 12.706 and study.t_quantile_975(100) == 1.960
    assert all(math.isnan(x) for x in study.mean_ci95([0.5])[1])


def test_paired_differences_use_common_seeds_only():
    a = {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.9}
    b = {0: 0.4, 1: 0.4, 2: 0.6}
    d = study.paired(a, b)
    assert d["pairs"] == 3
    assert d["mean"] == pytest.approx(statistics.mean([0.1, 0.2, 0.1]))
    half = 4.303 * statistics.stdev([0.1, 0.2, 0.1]) / math.sqrt(3)
    assert d["ci95"] == pytest.approx([d["mean"] - half, d["mean"] + half])


def test_summarize_pairs_against_bf16_and_the_uncorrected_arm():
    arms = [study.Arm("bf16", "bf16", "none"), study.Arm("fp8-none", "fp8", "none"), study.Arm("fp8-ais", "fp8", "ais")]
    rows = []
    for seed in range(3):
        for arm, reward in (("bf16", 0.5), ("fp8-none", 0.4), ("fp8-ais", 0.45)):
            rows.append({"arm": arm, "seed": seed, "final_reward": reward + 0.01 * seed, "first_reward": 0.1,
                         "heldout_acc": reward, "heldout_n": 100, "train_greedy_acc": reward, "lambda_mean": 0.2,
                         "lambda_std": 0.1,
                         "wall_s": 1.0, "steps": 4, **{f"{k}_mean": 0.0 for k in study.TRAJECTORY_KEYS[2:]}})
    s = study.summarize(rows, arms)
    assert "final_reward_vs_bf16" not in s["bf16"] and "final_reward_vs_uncorrected" not in s["fp8-none"]
    assert s["fp8-ais"]["final_reward_vs_bf16"]["mean"] == pytest.approx(-0.05)
    assert s["fp8-ais"]["final_reward_vs_uncorrected"]["mean"] == pytest.approx(0.05)
    assert s["fp8-ais"]["final_reward_vs_uncorrected"]["ci95"] == pytest.approx([0.05, 0.05])  # constant differences
    assert s["fp8-none"]["final_reward_mean"] == pytest.approx(0.41)


def test_lambda_for_tau_matches_the_product_combiner():
    import torch

    from dllm_ais.rl.correction import combine_product, severity

    traj = {"ais/divergence": [0.0, 0.02, 0.3], "ais/ess_frac": [1.0, 0.9, 0.5], "ais/damping": [1.0, 1.0, 0.8]}
    for tau in (0.01, 0.1):
        got = study.lambda_for_tau(traj, tau)
        f64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
        want = [float(combine_product(severity(f64(d), tau), f64(r), f64(g)))
                for d, r, g in zip(*traj.values(), strict=True)]
        assert got == pytest.approx(want, rel=1e-9)
    assert study.lambda_for_tau(traj, 0.1)[0] == 0.0
