"""Rung 3's summary (analysis/ladder_rung3.py) on synthetic finished runs: metrics, the paired time ratio, the
README with the plan's Holm family."""

from __future__ import annotations

import json
import math

import pytest

from dllm_ais import metrics as M
from dllm_ais.analysis import ladder_rung3

PLAN = {"plan": {"name": "toy-plan", "preset": "tiny-cpu", "baseline": "a", "rows_per_completion": 1},
        "arm": [{"name": "a"}, {"name": "b"}]}


def _write_run(d, rewards, step_s, wall_s):
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"steps": len(rewards), "wall_s": wall_s,
                                               "trajectory": {M.REWARD_MEAN: rewards}}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i, M.time_key("step"): s}) + "\n"
                                             for i, s in enumerate(step_s)))


def _runs(tmp_path):
    work = tmp_path / "work"
    load = {0: 1.0, 1: 3.0, 2: 2.0}  # the machine's load per seed: seconds scale with it, ratios do not
    for seed, f in load.items():
        _write_run(work / "a" / f"seed{seed}", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], [f] * 8, 8 * f + 5)
        # b's result.json is from a resumed process (wall_s 0): its seconds must come from metrics.jsonl
        _write_run(work / "b" / f"seed{seed}", [0.1 + 0.01 * seed] * 8, [1.5 * f] * 8, 0.0)
    return work


def test_metrics_come_from_the_curve_and_the_step_times(tmp_path):
    out = ladder_rung3.summarise(_runs(tmp_path), PLAN)
    a, b = out["a"], out["b"]
    assert a["final_reward"]["per_seed"][0] == pytest.approx(0.75)  # last quarter: steps 7 and 8
    assert a["auc"]["per_seed"][1] == pytest.approx(0.45)
    assert a["seconds_per_step"]["per_seed"] == pytest.approx({0: 1.0, 1: 3.0, 2: 2.0})
    assert b["seconds_per_step"]["per_seed"] == pytest.approx({0: 1.5, 1: 4.5, 2: 3.0})
    assert b["time_vs_baseline"]["mean"] == pytest.approx(1.5) and b["time_vs_baseline"]["n"] == 3
    assert a["time_vs_baseline"]["mean"] == pytest.approx(1.0)
    assert b["final_reward"]["mean"] == pytest.approx(0.11)


def test_seconds_fall_back_to_wall_time_without_step_rows(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    assert ladder_rung3.seconds_per_step({"wall_s": 30.0, "steps": 10}, d) == 3.0


def test_readme_carries_the_plans_holm_family_and_its_detectable_effect(tmp_path):
    work = _runs(tmp_path)
    plan_path = tmp_path / "plan.toml"
    plan_path.write_text('[plan]\nname = "toy-plan"\npreset = "tiny-cpu"\nbaseline = "a"\nrows_per_completion = 1\n'
                         '[[arm]]\nname = "a"\n[[arm]]\nname = "b"\n')
    out = tmp_path / "out"
    (out / "toy").mkdir(parents=True)
    study = {"primary_metric": {"key": "final_reward"},
             "min_detectable_effect": {"alpha": 0.05, "by_comparison": {"b-vs-a": 0.123}},
             "holm": {"b-vs-a": {"mean": -0.64, "ci95": [-0.7, -0.58], "p": 0.001, "p_holm": 0.001,
                                 "rejected": True}},
             "baseline": "a", "bf16_gain": {"mean": 0.01, "ci95": [-0.05, 0.07], "n": 3, "reference": "first_reward"},
             "arms": {"a": {"seeds": [0, 1, 2], "collapse": {"mean": 0.0}},
                      "b": {"seeds": [0, 1, 2], "collapse": {"mean": 2 / 3}}},
             "plan": {"name": "toy-plan", "document": {"collapse": {"window": 10, "drop": 0.2}}}}
    (out / "toy" / "summary.json").write_text(json.dumps(study))
    assert ladder_rung3.main(["--plan", f"{plan_path}:{work}", "--out", str(out)]) == 0
    text = (out / "README.md").read_text()
    assert "| b-vs-a | -0.640 [-0.700, -0.580] |" in text and "±0.123" in text and "different" in text
    assert "**not shown**" in text and "b 2/3" in text and "a 0/3" not in text
    assert "| b | 0.110" in text and "| 1.50 [1.50, 1.50] |" in text and "| baseline |" in text
    doc = json.loads((out / "summary.json").read_text())
    assert math.isclose(doc["tasks"]["toy-plan"]["arms"]["b"]["time_vs_baseline"]["mean"], 1.5)


def test_a_plan_whose_baseline_did_not_learn_gives_no_rank_context():
    arms = {n: {m: {"per_seed": {0: v, 1: v + 0.01, 2: v - 0.01}, "mean": v} for m in ("final_reward", "auc")}
            for n, v in (("a", 0.8), ("b", 0.5))}
    plan = {"arms": arms, "budget": 1, "family": "llada"}
    learned = ladder_rung3.rung3_contexts({"tasks": {"t": {**plan, "learned": True}}})
    assert set(learned) == {"llada/t/final_reward", "llada/t/auc"}
    assert learned["llada/t/final_reward"]["1"]["ranks"]["a"]["rank"] == 1
    assert ladder_rung3.rung3_contexts({"tasks": {"t": {**plan, "learned": False}}}) == {}
    assert ladder_rung3.testbed_learned({"bf16_gain": {"n": 5, "ci95": [0.1, 0.3]}}) is True
    assert ladder_rung3.testbed_learned({"bf16_gain": {"n": 5, "ci95": [-0.1, 0.3]}}) is False
    assert ladder_rung3.testbed_learned(None) is None
