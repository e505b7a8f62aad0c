"""Figures of a pre-registered study (`--plan`): outcomes.png and trajectories.png, drawn from the study folder's
summary.json and runs.jsonl only, so they can be redrawn without rerunning anything:

    python -m dllm_ais.analysis.study_figure benchmarks/study/corrections-v3

outcomes.png, left: the primary metric per arm, one dot per seed (grey lines join a seed's arms: the comparisons
are paired by seed), the mean with its 95 % t-interval; the SFT model first. Right: every comparison of the Holm
family: the mean paired difference with its 95 % t-interval (TOST rows: the 1 − 2α interval, with the ±margin
drawn), the Holm-adjusted p beside it.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from dllm_ais import metrics as M

TRAJECTORY_KEYS = (M.REWARD_MEAN, M.AIS_ESS, M.ROLLOUT_LOGP_MU, M.AIS_LAMBDA, M.AIS_DIVERGENCE, M.MISMATCH_KL)


def read_runs(folder: Path) -> list[dict]:
    """runs.jsonl of a study folder: one result per (arm, seed)."""
    path = folder / "runs.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: point at a study output folder (the --out of --plan).")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def arm_columns(summary: dict, runs: Sequence[dict]) -> tuple[list[str], dict[str, dict[int, float]]]:
    """Column names (SFT model first, then the arms in summary order) and per column {seed: primary metric}."""
    key = summary["primary_metric"]["key"]
    cols: dict[str, dict[int, float]] = {"SFT model": {int(s): v[key] for s, v in summary.get("sft", {}).items()
                                                       if key in v}}  # none for a training-curve metric
    for name in summary["arms"]:
        cols[name] = {r["seed"]: r[key] for r in runs if r["arm"] == name}
    names = [n for n in cols if cols[n]]
    return names, cols


def plot_outcomes(summary: dict, runs: Sequence[dict], path: Path) -> None:
    """outcomes.png (see the module docstring)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from dllm_ais.analysis.study import mean_ci95

    names, cols = arm_columns(summary, runs)
    tests = summary["holm"]
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, width_ratios=[1.2, 1])
    seeds = sorted({s for c in cols.values() for s in c})
    for s in seeds:
        xs = [i for i, n in enumerate(names) if s in cols[n]]
        left.plot(xs, [cols[names[i]][s] for i in xs], color="0.8", linewidth=0.7, zorder=1)
    for i, n in enumerate(names):
        vals = [cols[n][s] for s in sorted(cols[n])]
        left.scatter([i] * len(vals), vals, s=12, color=f"C{i}", zorder=2)
        m, (lo, hi) = mean_ci95(vals)
        if math.isfinite(lo):
            left.errorbar([i + 0.18], [m], yerr=[[m - lo], [hi - m]], fmt="o", color="k", capsize=3, markersize=4)
    left.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    left.set_ylabel(summary["primary_metric"]["key"])
    left.set_title(f"primary metric per arm: dots = seeds, black = mean, 95 % CI (n = {len(seeds)} seeds)", fontsize=9)
    rows = list(tests.items())
    for j, (_, t) in enumerate(rows):
        lo, hi = t.get("ci_1m2alpha") or t.get("ci95") or [math.nan, math.nan]
        y = len(rows) - 1 - j
        if math.isfinite(lo):
            right.plot([lo, hi], [y, y], color="k", linewidth=1.5)
        right.plot([t["mean"]], [y], "o", color="C3" if t.get("rejected") else "k", markersize=5)
        if t.get("test") == "tost":
            for edge in (-t["margin"], t["margin"]):
                right.plot([edge, edge], [y - 0.3, y + 0.3], color="C2", linestyle="--", linewidth=1)
        right.annotate(f"p_Holm {t.get('p_holm', math.nan):.3g}", (1.01, y), xycoords=("axes fraction", "data"),
                       fontsize=7, va="center")
    right.axvline(0, color="0.5", linewidth=0.8)
    right.set_yticks(range(len(rows)), [f"{n}\n{t['a']} − {t['b']}" for n, t in reversed(rows)], fontsize=7)
    right.set_xlabel(f"paired difference in {summary['primary_metric']['key']}")
    right.set_title("Holm family: mean, 95 % CI (TOST: 90 %, margin dashed); red = rejected", fontsize=9)
    fig.savefig(path, dpi=90)


def draw(folder: Path) -> list[Path]:
    """outcomes.png and trajectories.png in `folder` from its summary.json and runs.jsonl; returns their paths."""
    from dllm_ais.analysis import study

    summary = json.loads((folder / "summary.json").read_text())
    runs = read_runs(folder)
    plot_outcomes(summary, runs, folder / "outcomes.png")
    arms = [study.Arm(name, "", "") for name in summary["arms"]]
    study.plot_trajectories(runs, arms, folder / "trajectories.png", keys=TRAJECTORY_KEYS)
    return [folder / "outcomes.png", folder / "trajectories.png"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m dllm_ais.analysis.study_figure STUDY_FOLDER  (the folder holding summary.json and "
              "runs.jsonl)", file=sys.stderr)
        return 2
    for p in draw(Path(args[0])):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
