"""Rung 1's scale-free view: each estimator's MSE at its own best scalar step size, relative to ‖g*‖² (issue 40).

An estimator ĝ whose mean m = E ĝ is g* shrunk by a factor (MDPO's λ_t = R / #masked weights shrink it by about
half) has a small MSE partly because it is small, not because it points better; a tuned learning rate undoes any
fixed scale. The MSE of c·ĝ minimised over the scalar c is

    min_c E‖c ĝ − g*‖² = ‖g*‖² − (m·g*)² / (‖m‖² + tr Var)
                       = ‖g*‖² (1 − cos²(m, g*) · ‖m‖² / (‖m‖² + tr Var)),      at c* = m·g* / (‖m‖² + tr Var).

Divided by ‖g*‖² it lies in [0, 1] (1: no better than not stepping at all) and does not change when ĝ is rescaled:
`rel_mse_best_step`. It is computed per model from the exact fields rung 1 stores (cos_g_star, mean_norm_sq,
trace_var of the N-completion minibatch) and ranked like the MSE (estimator_robust.ranking with this metric:
per-seed wins, leave-one-seed-out, paired t against the lowest). It answers "which direction is best once each
likelihood has its own learning rate"; the plain MSE answers "at one shared learning rate".
"""

from __future__ import annotations

from dllm_ais.analysis.estimator_robust import ranking

METRIC = "rel_mse_best_step"


def rel_mse_best_step(f: dict) -> float:
    """1 − cos²(E ĝ, g*) · ‖E ĝ‖² / (‖E ĝ‖² + tr Var): one estimator setting's stored exact fields → [0, 1]."""
    m2, var, cos = f["mean_norm_sq"], f["trace_var"], f["cos_g_star"]
    if m2 + var <= 0.0:
        return 1.0
    return 1.0 - cos * cos * m2 / (m2 + var)


def with_best_step(estimators: dict) -> dict:
    """{name: {setting: fields}} of one model, each fields dict given `rel_mse_best_step` (a copy)."""
    return {name: {k: {**f, METRIC: rel_mse_best_step(f)} for k, f in settings.items()}
            for name, settings in estimators.items()}


def best_step_ranking(models: list[dict], b: float, seeds: list) -> dict:
    """estimator_robust.ranking of budget b by the scale-free metric (models: per seed {name: {setting: fields}},
    already through with_best_step)."""
    return ranking(models, b, seeds, metric=METRIC)


def best_step_sentence(b: str, r: dict, est: dict) -> str:
    """'≤ b rows: winner (K) 0.41 ± 0.05, wins 4/5 seeds, robust; runner-up X (K) Δ +0.03 [−0.01, +0.07], p 0.1'."""
    if not r:
        return f"≤ {b} rows: fewer than two estimators fit"
    w = r["winner"]
    iv = est[w][r["setting"]][METRIC]
    head = (f"≤ {b} rows: {'**' + w + '**' if r['robust'] else w + ' (NOT robust)'} (K = {r['setting']}) "
            f"{iv['mean']:.3g} ± {iv['half']:.2g}, wins {r['wins'][w]}/{r['seeds']} seeds")
    if not r["paired"]:
        return head
    k, pt = min(r["paired"].items(), key=lambda kv: kv[1]["mean"])
    lo, hi = pt["ci95"]
    return (f"{head}; runner-up {k} (K = {pt['setting']}) Δ {pt['mean']:+.3g} [{lo:+.3g}, {hi:+.3g}], "
            f"p {pt['p']:.2g}")
