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


def curves(work: Path, plan_doc: dict) -> dict[str, list[list[float]]]:
    """{arm: per-seed reward curves} of the finished runs."""
    out = {}
    for a in plan_doc.get("arm", []):
        runs = [json.loads((d / "result.json").read_text()) for d in sorted((work / a["name"]).glob("seed*"))
                if (d / "result.json").is_file()]
        out[a["name"]] = [[float(x) for x in r["trajectory"][M.REWARD_MEAN]] for r in runs]
    return out


def write_figure(tasks: dict[str, dict[str, list[list[float]]]], path: Path) -> None:
    """Reward per GRPO step, mean over seeds with the min–max band, one panel per task."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * len(tasks), 3.8))
    FigureCanvasAgg(fig)
    for i, (task, arms) in enumerate(sorted(tasks.items())):
        ax = fig.add_subplot(1, len(tasks), i + 1)
        for arm, runs in arms.items():
            if not runs:
                continue
            n = min(len(r) for r in runs)
            cols = list(zip(*(r[:n] for r in runs), strict=True))
            mean = [sum(c) / len(c) for c in cols]
            ax.plot(range(n), mean, lw=1.2, label=f"{arm} ({len(runs)} seeds)")
            ax.fill_between(range(n), [min(c) for c in cols], [max(c) for c in cols], alpha=0.15)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("mean reward of the step's rollouts")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})


def main(argv: list[str] | None = None) -> int:
    """python -m dllm_ais.analysis.ladder_rung3 --plan study/estimators-rl-digits.toml:runs/estimators-rl-digits ...
    --out benchmarks/estimators/rung3: summary.json, README.md and curves.png from the plans' finished runs."""
    import argparse

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    from dllm_ais.atomic import atomic_write_text

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", required=True, help="PLAN.toml:WORK_DIR (repeat per task)")
    ap.add_argument("--out", default="benchmarks/estimators/rung3")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary, figs = {"tasks": {}}, {}
    for item in args.plan:
        plan_path, work = item.rsplit(":", 1)
        doc = tomllib.loads(Path(plan_path).read_text())
        task = doc["plan"]["name"]
        summary["tasks"][task] = {"plan": plan_path, "preset": doc["plan"]["preset"],
                                  "budget": doc["plan"].get("rows_per_completion", 1),
                                  "arms": summarise(Path(work), doc)}
        figs[task] = curves(Path(work), doc)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    write_figure(figs, out / "curves.png")
    lines = ["# Rung 3: learning curves per policy likelihood (generated)", "",
             "Written by `python -m dllm_ais.analysis.ladder_rung3` from the pre-registered plans' runs (module doc of "
             "`dllm_ais/analysis/ladder_rung3.py`); the plans' own reports (Holm-corrected comparisons) are beside "
             "this file. Mean over seeds [95 % t-interval].", "", "![curves](curves.png)", ""]
    for task, t in summary["tasks"].items():
        lines += [f"## {task} (`{t['plan']}`, preset {t['preset']})", "",
                  "| arm | final reward | AUC (mean reward over steps) | seconds per step | seeds |",
                  "|---|---|---|---|---|"]
        for arm, e in t["arms"].items():
            cell = lambda k, e=e: f"{e[k]['mean']:.3f} [{e[k]['ci95'][0]:.3f}, {e[k]['ci95'][1]:.3f}]"  # noqa: E731
            lines.append(f"| {arm} | {cell('final_reward')} | {cell('auc')} | {cell('seconds_per_step')} | "
                         f"{len(e['auc']['per_seed'])} |")
        lines.append("")
    (out / "README.md").write_text("\n".join(lines))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
