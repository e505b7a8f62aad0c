"""Ranks with intervals for the estimator ladder's table (issue 40, item 4).

Within one comparison (a rung's cell at a budget of b forward rows: every estimator at its best setting that fits)
the estimators are ordered by their MSE estimate; an estimator's rank interval is
    [1 + #{others distinguishably better}, n − #{others distinguishably worse}],
"distinguishably" meaning the paired 95 % interval of the MSE difference excludes 0 (rung 1: t over model seeds;
rung 2: jackknife over blocks of GRPO batches, the target's Monte-Carlo error included). Two estimators whose
difference is not distinguishable can swap, so their intervals overlap; rank 1 = lowest MSE.
"""

from __future__ import annotations

from collections.abc import Callable


def rank_intervals(mse: dict[str, float], better: Callable[[str, str], bool]) -> dict[str, dict]:
    """{name: {"rank": point rank by MSE, "lo", "hi"}} from the MSE estimates and better(a, c) = a's MSE is
    distinguishably below c's."""
    names = sorted(mse, key=lambda k: (mse[k], k))
    n = len(names)
    out = {}
    for i, a in enumerate(names):
        above = sum(better(c, a) for c in names if c != a)
        below = sum(better(a, c) for c in names if c != a)
        out[a] = {"rank": i + 1, "lo": 1 + above, "hi": n - below}
    return out


def fmt(r: dict) -> str:
    """'2 [1–3]' (point rank and interval), or '1' when the interval is the point."""
    return str(r["rank"]) if r["lo"] == r["hi"] == r["rank"] else f"{r['rank']} [{r['lo']}–{r['hi']}]"
