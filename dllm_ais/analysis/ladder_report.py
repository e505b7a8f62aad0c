"""The estimator ladder's report (issue 40, item 4): rank tables across rungs, the answer table, rung 2's README and
the figure of MSE against L.

Contexts: rung 1 = each (sampler, checkpoint) of the exact testbed (ranks from paired t-intervals over the model
seeds); rung 2 = each Monte-Carlo cell (ranks from paired jackknife intervals, mc_ground_truth.rankings). At a
budget of b forward rows per completion every estimator competes with its best setting that fits (measured rows).
Across a rung's contexts an estimator is summarised by the contexts where its rank interval reaches 1 ("can be
best": nothing is distinguishably better) and where its point rank is 1, with the range of its rank intervals.
"""

from __future__ import annotations

import math
from pathlib import Path

from dllm_ais.analysis.estimator_robust import chosen_settings, ranking
from dllm_ais.analysis.ladder_rank import fmt, rank_intervals
from dllm_ais.analysis.study_stats import paired_t

BUDGETS = (1, 2, 4, 8, 16)


def rung1_contexts(doc: dict, metric: str = "mse") -> dict[str, dict]:
    """{context: {budget: {"ranks", "chosen", "mse"}}} of rung 1's results.json (exact; seeds paired), ranked by
    `metric`: the MSE, or estimator_best_step.METRIC (each estimator at its own best step size)."""
    from dllm_ais.analysis.estimator_best_step import with_best_step
    from dllm_ais.analysis.estimator_report import family_rules, model_key

    cfg = doc["config"]
    out = {}
    for family, rule in family_rules(cfg):
        for ck in cfg["checkpoints"]:
            models = [with_best_step(doc["per_model"][model_key(family, s, ck)][rule]["estimators"])
                      for s in cfg["seeds"]]
            ctx = {}
            for b in cfg["budgets"]:
                chosen = chosen_settings(models, float(b), metric)
                n = len(models)
                mse = {k: sum(m[k][kb][metric] for m in models) / n for k, kb in chosen.items()}

                def better(a, c, chosen=chosen, models=models):
                    hi = paired_t([m[a][chosen[a]][metric] - m[c][chosen[c]][metric] for m in models])["ci95"][1]
                    return hi < 0

                robust = ranking(models, float(b), list(cfg["seeds"]), metric)
                ctx[str(b)] = {"ranks": rank_intervals(mse, better), "chosen": chosen, "mse": mse,
                               "robust_winner": robust["winner"] if robust.get("robust") else None}
            out[f"{family}/{rule}/ck{ck}"] = ctx
    return out


def rung2_contexts(doc: dict) -> dict[str, dict]:
    """{cell: {budget: {"ranks", "chosen", "mse"}}} of rung 2's results."""
    out = {}
    for name, cell in doc["cells"].items():
        out[name] = {b: {"ranks": r["ranks"], "chosen": r["chosen"],
                         "mse": {k: cell["estimators"][v]["mse"]["value"] for k, v in r["chosen"].items()}}
                     for b, r in cell["rankings"].items()}
    return out


def aggregate(contexts: dict[str, dict], b: str) -> dict[str, dict]:
    """{estimator: {"can_be_best", "best", "n", "lo", "hi", "median"}} over the contexts at budget b."""
    acc: dict[str, list] = {}
    for ctx in contexts.values():
        for k, r in ctx.get(b, {"ranks": {}})["ranks"].items():
            acc.setdefault(k, []).append(r)
    out = {}
    for k, rs in acc.items():
        pts = sorted(r["rank"] for r in rs)
        out[k] = {"can_be_best": sum(r["lo"] == 1 for r in rs), "best": sum(r["rank"] == 1 for r in rs),
                  "n": len(rs), "lo": min(r["lo"] for r in rs), "hi": max(r["hi"] for r in rs),
                  "median": pts[len(pts) // 2]}
    seeded = [ctx[b] for ctx in contexts.values() if "robust_winner" in ctx.get(b, {})]
    if seeded:  # rung 1: contexts over model seeds, where a winner no single seed flips is 'robust'
        for k in out:
            out[k]["robust"] = sum(c["robust_winner"] == k for c in seeded)
    return out


def point_best(agg: dict[str, dict]) -> list[str]:
    """The estimators point-best (rank 1) in the most contexts of an `aggregate`, sorted; [] when it is empty."""
    if not agg:
        return []
    top = max(a["best"] for a in agg.values())
    return sorted(k for k, a in agg.items() if a["best"] == top)


def answer(agg: dict[str, dict]) -> str:
    """The estimators that are point-best in the most contexts, with how often they can be best."""
    names = point_best(agg)
    if not names:
        return "—"
    return "; ".join(f"{k} (best in {agg[k]['best']}/{agg[k]['n']}"
                     + (f", robust in {agg[k]['robust']}/{agg[k]['n']}" if "robust" in agg[k] else "")
                     + f", can be best in {agg[k]['can_be_best']}/{agg[k]['n']})" for k in names)


def rank_table(rungs: dict[str, dict[str, dict]], budgets=BUDGETS) -> list[str]:
    """Markdown: estimator × (rung, budget) -> median rank [range of the rank intervals] (best / contexts)."""
    head = [(r, str(b)) for r in rungs for b in budgets if any(str(b) in c for c in rungs[r].values())]
    aggs = {(r, b): aggregate(rungs[r], b) for r, b in head}
    names = sorted({k for a in aggs.values() for k in a})
    lines = ["| estimator | " + " | ".join(f"{r} ≤ {b}" for r, b in head) + " |",
             "|---|" + "---|" * len(head)]
    for k in names:
        cells = []
        for h in head:
            a = aggs[h].get(k)
            cells.append("—" if a is None else f"{a['median']} [{a['lo']}–{a['hi']}] ({a['best']}/{a['n']})")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def _v(x: dict, digits: int = 3) -> str:
    v, h = x["value"], x["half"]
    return f"{v:.{digits}g} ± {h:.2g}" if math.isfinite(h) else f"{v:.{digits}g}"


def rung2_readme(doc: dict) -> list[str]:
    """Per cell: the target's figures, the ranking at each budget and every variant's figures."""
    lines = []
    for name, c in doc["cells"].items():
        t = c["target"]
        red = 1 - t["trace_var"]["value"] / t["trace_var_no_cv"]["value"] if t["trace_var_no_cv"]["value"] else 0
        lines += ["", f"### {name}", "",
                  f"{c['paths']} paths ({c['units']} GRPO batches of N = {doc['config']['mc']['N']}), J = "
                  f"{c['J']:.3f}. Target: ‖g*‖² = {_v(t['norm_sq'])}, relative Monte-Carlo "
                  f"error of ĝ* {_v(t['mc_rel_error'], 2)}; control variate β = {t['beta']['value']:.3g} "
                  f"(tr Var of the target per batch {100 * red:.1f} % lower).", "",
                  "| budget | rank: estimator (setting) MSE |", "|---|---|"]
        for b, r in c["rankings"].items():
            order = sorted(r["ranks"], key=lambda k: r["ranks"][k]["rank"])
            lines.append(f"| ≤ {b} | " + "; ".join(
                f"{fmt(r['ranks'][k])}: {k} ({r['chosen'][k].split(':')[1]}) "
                f"{c['estimators'][r['chosen'][k]]['mse']['value']:.3g}" for k in order) + " |")
        lines += ["", "| estimator:setting | rows | MSE | bias² | tr Var (N) | cos(E ĝ, g*) |",
                  "|---|---|---|---|---|---|"]
        for k, f in c["estimators"].items():
            lines.append(f"| {k} | {f['rows']['value']:.2f} | {_v(f['mse'])} | {_v(f['bias_sq'])} | "
                         f"{_v(f['trace_var'])} | {_v(f['cos_g_star'], 2)} |")
    return lines


def write_figure(doc: dict, path: Path, budgets=(1, 4, 16)) -> None:
    """MSE / ‖g*‖² (log) against L per estimator (each at its best setting within the budget), one panel per
    (family/checkpoint/sampler) and budget; error bars: the jackknife 95 % half-width of the MSE over ‖ĝ*‖²."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups: dict[str, dict[int, dict]] = {}
    for c in doc["cells"].values():
        m = c["model"]
        groups.setdefault(f"{m['family']}/{m['checkpoint']}/{m['sampler']}", {})[c["L"]] = c
    cols = len(groups)
    have = set.intersection(*(set(c["rankings"]) for c in doc["cells"].values()))
    budgets = [b for b in budgets if str(b) in have] or sorted(int(b) for b in have)[:1]
    fig = Figure(figsize=(3.4 * cols, 3.0 * len(budgets)))
    FigureCanvasAgg(fig)
    for i, b in enumerate(budgets):
        for j, (g, by_L) in enumerate(sorted(groups.items())):
            ax = fig.add_subplot(len(budgets), cols, i * cols + j + 1)
            Ls = sorted(by_L)
            names = sorted({k for L in Ls for k in by_L[L]["rankings"][str(b)]["chosen"]})
            for k in names:
                xs, ys, es = [], [], []
                for L in Ls:
                    r = by_L[L]["rankings"][str(b)]
                    if k in r["chosen"]:
                        f = by_L[L]["estimators"][r["chosen"][k]]["mse"]
                        n2 = by_L[L]["target"]["norm_sq"]["value"]
                        xs.append(L)
                        ys.append(f["value"] / n2)
                        es.append(f["half"] / n2)
                ax.errorbar(xs, ys, yerr=es, marker="o", ms=3, lw=1, capsize=2, label=k)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{g}, ≤ {b} rows", fontsize=8)
            ax.set_xlabel("L", fontsize=7)
            if j == 0:
                ax.set_ylabel("MSE / ‖g*‖²", fontsize=7)
            ax.tick_params(labelsize=6)
            if i == 0 and j == 0:
                ax.legend(fontsize=5)
    fig.suptitle("Rung 2: MSE of each policy likelihood's GRPO gradient (LM head) vs L, relative to ‖g*‖²",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
