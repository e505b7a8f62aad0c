"""Rung 3 of the estimator ladder (issue 40): learning curves per policy likelihood, summarised from the runs of the
pre-registered plans (study/estimators-rl-*.toml, run by scripts/study_corrections.py --plan).

Per plan (one CPU task) and arm (one likelihood at equal forward rows per step): final reward (mean of the last
quarter of steps: study.quarter_means, the plan's `final_reward`), area under the reward curve (mean reward over all
steps: the AUC normalised by the number of steps), wall-clock seconds per GRPO step (from the runs' `time/step` rows)
— each a mean over seeds with a 95 % t-interval — and the seconds relative to the plan's baseline arm, paired by
seed. The pre-registered comparisons, their Holm correction, the detectable effect and whether the baseline learned
at all come from the study machinery's summary.json beside the report. Contexts for the ladder's rank table: one per
(family, task, metric), ranks from paired t-intervals over seeds (higher reward = better); a task whose baseline did
not learn gives none.
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


def seconds_per_step(result: dict, run_dir: Path | None = None) -> float:
    """Mean wall-clock seconds of a GRPO step: the run's metrics.jsonl `time/step` rows (the steps alone, whichever
    process ran them: a resumed run's result.json wall_s covers only what the last process did), else wall_s."""
    key = M.time_key("step")
    rows = [float(r[key]) for r in M.read_metrics(run_dir) if key in r] if run_dir is not None else []
    if rows:
        return sum(rows) / len(rows)
    return result["wall_s"] / max(result["steps"], 1)


def run_metrics(result: dict, run_dir: Path | None = None) -> dict:
    """final reward, AUC and seconds per step of one finished run (study_plan.run_arm's result.json)."""
    rewards = [r for r in result["trajectory"][M.REWARD_MEAN] if r is not None and math.isfinite(r)]
    _, final = quarter_means(rewards)
    return {"final_reward": final, "auc": sum(rewards) / len(rewards),
            "seconds_per_step": seconds_per_step(result, run_dir)}


def time_ratio(per: dict[int, float], base: dict[int, float]) -> dict:
    """Seconds per step relative to the baseline arm, paired by seed (the arms of one seed ran side by side, so the
    machine's load, which changes over a study, cancels): geometric mean and 95 % t-interval of the log ratio."""
    seeds = sorted(set(per) & set(base))
    t = paired_t([math.log(per[s] / base[s]) for s in seeds])
    return {"mean": math.exp(t["mean"]), "ci95": [math.exp(x) for x in t["ci95"]], "n": len(seeds)}


def summarise(work: Path, plan_doc: dict) -> dict:
    """{arm: {metric: {"per_seed": {seed: v}, "mean", "ci95"}}} from the plan's work directory."""
    out = {}
    for a in plan_doc.get("arm", []):
        per = {}
        for seed_dir in sorted((work / a["name"]).glob("seed*")):
            res = seed_dir / "result.json"
            if res.is_file():
                per[int(seed_dir.name[4:])] = run_metrics(json.loads(res.read_text()), seed_dir)
        if not per:
            continue
        entry = {}
        for k in ("final_reward", "auc", "seconds_per_step"):
            vals = {s: v[k] for s, v in per.items()}
            m, ci = mean_ci95(list(vals.values()))
            entry[k] = {"per_seed": vals, "mean": m, "ci95": ci}
        out[a["name"]] = entry
    base = plan_doc.get("plan", {}).get("baseline")
    if base in out:
        for entry in out.values():
            entry["time_vs_baseline"] = time_ratio(entry["seconds_per_step"]["per_seed"],
                                                   out[base]["seconds_per_step"]["per_seed"])
    return out


def rung3_contexts(summary: dict) -> dict[str, dict]:
    """{family/task/metric: {budget: {"ranks", "chosen", "mse"}}}: each plan's arms ranked by final reward and by AUC
    (higher better) with paired t over seeds, filed under the budget of rows per completion the plan fixed; a plan
    whose baseline did not learn (testbed_learned False) gives no context."""
    out = {}
    for task, plan in summary.get("tasks", {}).items():
        if plan.get("learned") is False:  # the testbed did not learn: its ranks would be noise (testbed_learned)
            continue
        arms, b = plan["arms"], str(plan["budget"])
        for metric in ("final_reward", "auc"):
            vals = {n: a[metric]["per_seed"] for n, a in arms.items()}
            names = list(vals)

            def better(x, y, vals=vals):  # x's reward distinguishably above y's
                seeds = sorted(set(vals[x]) & set(vals[y]))
                lo = paired_t([vals[x][s] - vals[y][s] for s in seeds])["ci95"][0]
                return lo > 0

            score = {n: -arms[n][metric]["mean"] for n in names}  # rank 1 = highest reward
            out[f"{plan.get('family', 'llada')}/{task}/{metric}"] = {b: {"ranks": rank_intervals(score, better),
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


def testbed_learned(doc: dict | None) -> bool | None:
    """Whether the plan's baseline arm gained distinguishably (the lower end of the 95 % interval of its paired gain
    over the SFT model or its first quarter above 0): the plan's testbed can show learning at all. None: unknown."""
    g = (doc or {}).get("bf16_gain")
    if not g or not g.get("n"):
        return None
    return bool(g["ci95"][0] > 0)


def plan_summary(out: Path, plan_name: str) -> dict | None:
    """The study machinery's summary.json of the plan named `plan_name` in a folder under `out`, if written."""
    for path in sorted(out.glob("*/summary.json")):
        doc = json.loads(path.read_text())
        if doc.get("plan", {}).get("name") == plan_name:
            return doc
    return None


def holm_lines(doc: dict | None) -> list[str]:
    """The plan's pre-registered comparisons: paired difference [95 % CI], p, Holm-adjusted p, verdict, and the
    minimum detectable effect (power 0.8) that the plan's sd gives, so that a null says what it could have seen."""
    if doc is None:
        return ["(the plan's own report is not written yet: no Holm-corrected comparisons)", ""]
    key = doc["primary_metric"]["key"]
    mde = doc["min_detectable_effect"]["by_comparison"]
    lines = [f"Pre-registered comparisons ({key}, paired t over seeds, Holm over the family at α = "
             f"{doc['min_detectable_effect']['alpha']}):", "",
             "| comparison | a − b [95 % CI] | p | p (Holm) | verdict | detectable at power 0.8 |",
             "|---|---|---|---|---|---|"]
    for name, t in doc["holm"].items():
        verdict = "different" if t["rejected"] else "not distinguishable"
        lines.append(f"| {name} | {t['mean']:+.3f} [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}] | {t['p']:.2g} | "
                     f"{t['p_holm']:.2g} | {verdict} | ±{mde[name]:.3f} |")
    g, base = doc.get("bf16_gain"), doc.get("baseline", "the baseline")
    if g and g.get("n"):
        against = "its first-quarter reward" if g.get("reference") == "first_reward" else "the SFT model"
        learned = testbed_learned(doc)
        lines += ["", f"Does the testbed learn at all? {base}'s gain over {against}: {g['mean']:+.3f} "
                  f"[{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}] (n = {g['n']}): " +
                  ("yes." if learned else "**not shown** — under this plan the baseline did not learn "
                   "distinguishably, so a null comparison here is no evidence about the likelihoods, and the "
                   "ladder's rank table leaves this task out.")]
    coll = {a: e["collapse"]["mean"] * len(e["seeds"]) for a, e in doc.get("arms", {}).items()
            if e.get("collapse", {}).get("mean")}
    if coll:
        rule = doc.get("plan", {}).get("document", {}).get("collapse", {})
        lines += ["", f"Collapsed runs (the plan's rule: reward falls by {rule.get('drop', '?')} within "
                  f"{rule.get('window', '?')} steps): " + ", ".join(
                      f"{a} {round(n)}/{len(doc['arms'][a]['seeds'])}" for a, n in coll.items()) + "."]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    """python -m dllm_ais.analysis.ladder_rung3 --plan study/estimators-rl-digits.toml:runs/estimators-rl-digits ...
    --out benchmarks/estimators/rung3: summary.json, README.md and curves.png from the plans' finished runs."""
    import argparse

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    from dllm_ais.atomic import atomic_write_text
    from dllm_ais.presets import get_preset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", required=True, help="PLAN.toml:WORK_DIR (repeat per task)")
    ap.add_argument("--out", default="benchmarks/estimators/rung3")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary, figs, studies = {"tasks": {}}, {}, {}  # studies: each plan's own summary.json (read once)
    for item in args.plan:
        plan_path, work = item.rsplit(":", 1)
        doc = tomllib.loads(Path(plan_path).read_text())
        task = doc["plan"]["name"]
        summary["tasks"][task] = {"plan": plan_path, "preset": doc["plan"]["preset"],
                                  "budget": doc["plan"].get("rows_per_completion", 1),
                                  "baseline": doc["plan"].get("baseline"),
                                  "family": get_preset(doc["plan"]["preset"]).model.family,
                                  "arms": summarise(Path(work), doc)}
        studies[task] = plan_summary(out, task)
        summary["tasks"][task]["learned"] = testbed_learned(studies[task])
        figs[task] = curves(Path(work), doc)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    write_figure(figs, out / "curves.png")
    lines = ["# Rung 3: learning curves per policy likelihood (generated)", "",
             "Written by `python -m dllm_ais.analysis.ladder_rung3` from the pre-registered plans' runs (module doc of "
             "`dllm_ais/analysis/ladder_rung3.py`); the plans' own reports are beside this file. Mean over seeds "
             "[95 % t-interval]; seconds per step are paired by seed against the plan's baseline arm (the arms of a "
             "seed ran side by side; the machine's load changed over the study, so absolute seconds are not "
             "comparable across seeds)." + (" How the runs were made (commits, machine, load, what was interrupted): "
                                            "[RUN.md](RUN.md)." if (out / "RUN.md").is_file() else ""), "",
             "![curves](curves.png)", ""]
    for task, t in summary["tasks"].items():
        lines += [f"## {task} (`{t['plan']}`, preset {t['preset']}, {t['budget']} forward row per completion)", "",
                  "| arm | final reward | AUC (mean reward over steps) | s per step | × baseline's time | seeds |",
                  "|---|---|---|---|---|---|"]
        for arm, e in t["arms"].items():
            cell = lambda k, e=e: f"{e[k]['mean']:.3f} [{e[k]['ci95'][0]:.3f}, {e[k]['ci95'][1]:.3f}]"  # noqa: E731
            ratio = e.get("time_vs_baseline")
            ratio = ("baseline" if arm == t["baseline"] else "—" if not ratio else
                     f"{ratio['mean']:.2f} [{ratio['ci95'][0]:.2f}, {ratio['ci95'][1]:.2f}]")
            lines.append(f"| {arm} | {cell('final_reward')} | {cell('auc')} | {cell('seconds_per_step')} | "
                         f"{ratio} | {len(e['auc']['per_seed'])} |")
        lines += [""] + holm_lines(studies[task])
    (out / "README.md").write_text("\n".join(lines))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
