"""Rung 3 of the estimator ladder (issue 40): learning curves per policy likelihood, summarised from the runs of the
pre-registered plans (study/estimators-rl-*.toml, run by scripts/study_corrections.py --plan).

Per plan (one CPU task) and arm (one likelihood at equal forward rows per step): final reward (mean of the last
quarter of steps: study.quarter_means, the plan's `final_reward`), area under the reward curve (mean reward over all
steps: the AUC normalised by the number of steps), wall-clock seconds per GRPO step — each a mean over seeds with a
95 % t-interval — and paired differences against the plan's baseline arm (the pre-registered comparisons and their
Holm correction come from the study machinery's summary.json). Contexts for the ladder's rank table: one per (task,
metric), ranks from paired t-intervals over seeds (higher reward = better).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dllm_ais import metrics as M
from dllm_ais.analysis.ladder_rank import rank_intervals
from dllm_ais.analysis.study import mean_ci95, quarter_means
from dllm_ais.analysis.study_stats import paired_t

ESTIMATOR_OF = "estimator"
"""Key of an arm's train overrides naming the ladder row it stands for (the arm name otherwise)."""


def run_metrics(result: dict) -> dict:
    """final reward, AUC and seconds per step of one finished run (study_plan.run_arm's result.json)."""
    rewards = [r for r in result["trajectory"][M.REWARD_MEAN] if r is not None and math.isfinite(r)]
    _, final = quarter_means(rewards)
    return {"final_reward": final, "auc": sum(rewards) / len(rewards), "seconds_per_step": result["wall_s"] /
            max(result["steps"], 1)}


def summarise(work: Path, plan_doc: dict) -> dict:
    """{arm: {metric: {"per_seed": {seed: v}, "mean", "ci95"}}} from the plan's work directory."""
    out = {}
    for a in plan_doc.get("arm", []):
        per = {}
        for seed_dir in sorted((work / a["name"]).glob("seed*")):
            res = seed_dir / "result.json"
            if res.is_file():
                per[int(seed_dir.name[4:])] = run_metrics(json.loads(res.read_text()))
        if not per:
            continue
        entry = {}
        for k in ("final_reward", "auc", "seconds_per_step"):
            vals = {s: v[k] for s, v in per.items()}
            m, ci = mean_ci95(list(vals.values()))
            entry[k] = {"per_seed": vals, "mean": m, "ci95": ci}
        out[a["name"]] = entry
    return out


def rung3_contexts(summary: dict) -> dict[str, dict]:
    """{task/metric: {budget: {"ranks", "chosen", "mse"}}}: each plan's arms ranked by final reward and by AUC
    (higher better) with paired t over seeds, filed under the budget of rows per completion the plan fixed."""
    out = {}
    for task, plan in summary.get("tasks", {}).items():
        arms, b = plan["arms"], str(plan["budget"])
        for metric in ("final_reward", "auc"):
            vals = {n: a[metric]["per_seed"] for n, a in arms.items()}
            names = list(vals)

            def better(x, y, vals=vals):  # x's reward distinguishably above y's
                seeds = sorted(set(vals[x]) & set(vals[y]))
                lo = paired_t([vals[x][s] - vals[y][s] for s in seeds])["ci95"][0]
                return lo > 0

            score = {n: -arms[n][metric]["mean"] for n in names}  # rank 1 = highest reward
            out[f"{task}/{metric}"] = {b: {"ranks": rank_intervals(score, better),
                                           "chosen": {n: n for n in names}, "mse": score}}
    return out
