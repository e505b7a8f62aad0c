"""How robust a "lowest MSE at ≤ b forward rows" answer of rung 1 is over model seeds (issue 40, item 1).

At a budget of b rows per completion each estimator competes with its best setting whose mean measured rows fit b
(chosen on the mean over seeds, as estimator_report.summarise does). For the ranking this adds:
- per-seed wins: on how many seeds each estimator (at that setting) has the lowest MSE;
- a paired test beside every estimator: its per-seed MSE minus the winner's, mean, 95 % t-interval and two-sided
  p (study_stats.paired_t);
- leave-one-seed-out stability: the winner recomputed (settings re-chosen) with each seed dropped in turn; the
  answer is `robust` only when no single seed changes the winner AND the winner wins a strict majority of seeds.
An answer sentence is written only for robust winners; otherwise the report says which seed flips it.
"""

from __future__ import annotations

from collections import Counter

from dllm_ais.analysis.study_stats import paired_t


def _fits(rows: float, b: float) -> bool:
    return rows <= b + 1e-9


def chosen_settings(models: list[dict], b: float, metric: str = "mse") -> dict[str, str]:
    """{estimator: its setting (budget key) with the lowest mean `metric` among those whose mean rows fit b}.
    models: per seed {estimator: {setting: {"mse", "rows", ...}}}."""
    n = len(models)
    out = {}
    for name, settings in models[0].items():
        fit = [(sum(m[name][k][metric] for m in models) / n, k) for k in settings
               if _fits(sum(m[name][k]["rows"] for m in models) / n, b)]
        if fit:
            out[name] = min(fit)[1]
    return out


def _winner(models: list[dict], b: float, metric: str = "mse") -> tuple[str | None, dict[str, str]]:
    chosen = chosen_settings(models, b, metric)
    if not chosen:
        return None, chosen
    n = len(models)
    return min(chosen, key=lambda k: (sum(m[k][chosen[k]][metric] for m in models) / n, k)), chosen


def ranking(models: list[dict], b: float, seeds: list, metric: str = "mse") -> dict:
    """The robustness record of budget b (module doc): winner, its setting, wins per estimator, leave-one-out
    winners, `robust`, and a paired test of every other estimator against the winner; all by `metric` (lower is
    better: "mse", or estimator_best_step's scale-free "rel_mse_best_step")."""
    winner, chosen = _winner(models, b, metric)
    if winner is None or len(chosen) < 2:
        return {}
    per_seed = [min(chosen, key=lambda k, m=m: (m[k][chosen[k]][metric], k)) for m in models]
    wins = Counter(per_seed)
    loo = {}
    for i, s in enumerate(seeds):
        w, _ = _winner(models[:i] + models[i + 1:], b, metric) if len(models) > 2 else (winner, None)
        loo[str(s)] = w
    flips = {s: w for s, w in loo.items() if w != winner}
    paired = {}
    for k, kb in chosen.items():
        if k == winner:
            continue
        t = paired_t([m[k][kb][metric] - m[winner][chosen[winner]][metric] for m in models])
        paired[k] = {"setting": kb, "mean": t["mean"], "ci95": t["ci95"], "p": t["p"], "wins": wins.get(k, 0)}
    n = len(models)
    return {"winner": winner, "setting": chosen[winner], "wins": {k: wins.get(k, 0) for k in chosen},
            "seeds": n, "leave_one_out": loo, "flips": flips,
            "robust": not flips and 2 * wins.get(winner, 0) > n, "paired": paired}


def verdict(r: dict) -> str:
    """The robustness clause of a winner's sentence."""
    w, n = r["winner"], r["seeds"]
    won = f"wins {r['wins'][w]}/{n} seeds"
    if r["robust"]:
        return f"{won}; no single seed left out changes it"
    if r["flips"]:
        s, other = next(iter(r["flips"].items()))
        return f"{won}; NOT robust: leaving seed {s} out makes {other} the lowest"
    return f"{won}; NOT robust: no majority of seeds"
