"""Summary over seeds, the README table and the figure of the estimator analysis (analysis/estimators.py).

Per sampler, checkpoint, estimator and budget: the mean over model seeds of MSE, bias², tr Var, cosines and rows,
with a 95 % Student-t interval over seeds. The winner at a budget of b forward rows per completion is the lowest mean
MSE among the estimators' settings whose mean rows (measured, not nominal K) are ≤ b; it is "distinguishable"
from the runner-up when the paired 95 % t-interval of their per-seed MSE difference excludes 0 (the two per-estimator
intervals overlapping or not is reported too).
"""

from __future__ import annotations

import math
from pathlib import Path

from dllm_ais.analysis.estimator_best_step import METRIC, best_step_ranking, best_step_sentence, with_best_step
from dllm_ais.analysis.estimator_families import FAMILY_NAMES, RULES, model_key
from dllm_ais.analysis.estimator_robust import ranking
from dllm_ais.analysis.estimator_robust import verdict as robust_verdict
from dllm_ais.analysis.study_stats import t_quantile

FIELDS = ("mse", "bias_sq", "trace_var", "cos_g_star", "cos_grad_j", "rows", METRIC)


def interval(xs: list[float]) -> dict:
    """mean and 95 % t-interval half-width over the values."""
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return {"mean": mean, "half": math.nan, "n": n}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return {"mean": mean, "half": t_quantile(0.975, n - 1) * sd / math.sqrt(n), "n": n}


def family_rules(cfg: dict) -> list[tuple[str, str]]:
    """(family, sampler rule) of every summarised sampler (results from before Dream joined: LLaDA's only)."""
    return [(f, r) for f in cfg.get("families", ("llada",)) for r in RULES[f]]


def rule_label(rule: str) -> str:
    """'LLaDA low_confidence', 'Dream entropy', ... (the family a sampler rule belongs to, named)."""
    family = next(f for f, rules in RULES.items() if rule in rules)
    return f"{FAMILY_NAMES[family]} {rule}"


def _names(families: list[str]) -> str:
    names = [FAMILY_NAMES[f] for f in families]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _sdar_note(cfg: dict) -> str:
    """SDAR's testbed differences (analysis/exact_sdar.py), when it is measured."""
    if "sdar" not in cfg.get("families", ()):
        return ""
    return ("; SDAR block-causal in blocks of 2 behind a one-token prefix, steps = L, its static and dynamic "
            "(τ = threshold) strategies and its own estimators: analysis/exact_sdar.py")


def summarise(doc: dict) -> dict:
    """{rule: {checkpoint: {"estimators": {name: {budget: {field: interval}}}, "winners": {budget: ...}}}}."""
    cfg = doc["config"]
    out: dict = {}
    for family, rule in family_rules(cfg):
        out[rule] = {}
        for ck in cfg["checkpoints"]:
            models = [doc["per_model"][model_key(family, s, ck)][rule] for s in cfg["seeds"]]
            ests = [with_best_step(m["estimators"]) for m in models]
            est: dict = {}
            for name, budgets in ests[0].items():
                for b in budgets:
                    vals = {f: [e[name][b][f] for e in ests] for f in FIELDS}
                    est.setdefault(name, {})[b] = {f: interval(v) for f, v in vals.items()}
            winners = {}
            for b in (str(b) for b in cfg["budgets"]):
                # equal forward passes: each estimator at its best setting whose mean rows per completion fit b
                # (antithetic's empty halves, coupled's skipped canvases and a threshold's shorter paths cost less)
                best = {k: min((v[kb]["mse"]["mean"], kb) for kb in v if v[kb]["rows"]["mean"] <= float(b) + 1e-9)
                        for k, v in est.items() if any(v[kb]["rows"]["mean"] <= float(b) + 1e-9 for kb in v)}
                ranked = sorted((mse, k, kb) for k, (mse, kb) in best.items())
                if len(ranked) < 2:
                    continue
                (_, w, bw), (_, r, br) = ranked[0], ranked[1]
                diff = interval([m["estimators"][w][bw]["mse"] - m["estimators"][r][br]["mse"] for m in models])
                iw, ir = est[w][bw]["mse"], est[r][br]["mse"]
                overlap = iw["mean"] + iw["half"] >= ir["mean"] - ir["half"]
                winners[b] = {"winner": w, "runner_up": r, "mse": iw, "runner_up_mse": ir, "overlap": bool(overlap),
                              "winner_budget": bw, "winner_rows": est[w][bw]["rows"]["mean"],
                              "runner_up_budget": br, "runner_up_rows": est[r][br]["rows"]["mean"],
                              "paired_diff": diff, "distinguishable": bool(diff["mean"] + diff["half"] < 0)}
                winners[b]["robust"] = ranking(ests, float(b), list(cfg["seeds"]))
                winners[b]["best_step"] = best_step_ranking(ests, float(b), list(cfg["seeds"]))
            out[rule][str(ck)] = {"estimators": est, "winners": winners,
                                  "J": interval([m["J"] for m in models])}
    return out


def _fmt(iv: dict) -> str:
    return f"{iv['mean']:.3g} ± {iv['half']:.2g}"


def sentence(rule: str, ck: str, summ: dict) -> str:
    """One sentence: the lowest-MSE estimator at each budget, with its interval and the runner-up's verdict."""
    parts = []
    for b, w in summ["winners"].items():
        verdict = ("distinguishable from" if w["distinguishable"] else "not distinguishable from")
        lead = f"at ≤ {b} rows {w['winner']}" if w["robust"]["robust"] else f"at ≤ {b} rows no robust answer"
        parts.append(f"{lead} (lowest mean: {w['winner']}, K = {w['winner_budget']}, {w['winner_rows']:.2g} rows; "
                     f"MSE {_fmt(w['mse'])}; {robust_verdict(w['robust'])}; {verdict} runner-up {w['runner_up']} "
                     f"(K = {w['runner_up_budget']}) {_fmt(w['runner_up_mse'])} by the paired interval)")
    return f"**{rule_label(rule)}, checkpoint {ck}**: " + "; ".join(parts) + "."


def ranking_table(summ: dict) -> list[str]:
    """Per budget, every estimator at its best fitting setting: mean MSE, seeds won, and the paired test against
    the budget's lowest-mean estimator (per-seed MSE difference: mean, 95 % t-interval, two-sided p)."""
    lines = ["| budget | estimator (K) | MSE | seeds won | ΔMSE vs lowest (paired 95 % CI) | p |",
             "|---|---|---|---|---|---|"]
    for b, w in summ["winners"].items():
        r = w["robust"]
        win = r["winner"]
        lines.append(f"| ≤ {b} | **{win}** ({r['setting']}) | {_fmt(summ['estimators'][win][r['setting']]['mse'])} "
                     f"| {r['wins'][win]}/{r['seeds']} | — | — |")
        for k, pt in sorted(r["paired"].items(), key=lambda kv: kv[1]["mean"]):
            lo, hi = pt["ci95"]
            lines.append(f"| ≤ {b} | {k} ({pt['setting']}) | {_fmt(summ['estimators'][k][pt['setting']]['mse'])} | "
                         f"{pt['wins']}/{r['seeds']} | {pt['mean']:+.3g} [{lo:+.3g}, {hi:+.3g}] | {pt['p']:.2g} |")
    return lines


def _same_as_low_confidence(doc: dict, rule: str, ck: str) -> bool:
    """Whether `rule` gave exactly the low-confidence sampler's J on every seed at checkpoint ck."""
    if rule != "threshold":
        return False
    ms = [doc["per_model"][model_key("llada", s, ck)] for s in doc["config"]["seeds"]]
    return all(m[rule]["J"] == m["low_confidence"]["J"] for m in ms)


def write_readme(doc: dict, path: Path) -> None:
    """The generated README: what was measured, one sentence per sampler and checkpoint, the full table."""
    cfg, summ = doc["config"], doc["summary"]
    t = cfg["testbed"]
    lines = ["# Which policy likelihood to train with — exact bias², variance and MSE (generated)", "",
             "Written by `python -m dllm_ais.analysis.estimators --out benchmarks/estimators/rung1` (rung 1 of "
             "`python -m dllm_ais.analysis.ladder`; module doc of "
             "`dllm_ais/analysis/estimators.py` for the method); numbers from `results.json`, figure "
             "`mse_vs_forward_passes.png`. Everything is exact enumeration except SPG's EUBO at K ≥ 2 "
             f"({cfg['spg_draws']} Monte-Carlo draws, `_mc_se` fields in results.json)."
             + (f" The rows of {', '.join(doc['supplemented'])} were added to the stored results by `--supplement` "
                "(every model rebuilt; its J, ‖g*‖² and ‖∇J‖² per sampler equal the stored ones bit for bit; "
                "the other rows kept; a full run computes the same rows: tests/test_estimator_paths.py)."
                if doc.get("supplemented") else ""), "",
             f"Testbed: tiny {_names(cfg.get('families', ['llada']))} "
             f"(d_model {t['d_model']}, {t['n_layers']} layer{_sdar_note(cfg)}), V_c = {t['vocab']} tokens, "
             f"prompt length {t['prompt_len']}, L = {t['gen_length']}, {t['num_prompts']} prompts; seeds "
             f"{list(cfg['seeds'])}; checkpoints {list(cfg['checkpoints'])} (SFT steps, 0 = random init); "
             f"GRPO with group z-scores, G = {cfg['G']}, N = {cfg['N']}; threshold {cfg['threshold']}. "
             "Target g* = ∇J̃ of the sampler used (the exact-likelihood GRPO gradient), intervals: 95 % t over "
             "seeds; 'distinguishable' = the paired t-interval of the per-seed MSE difference excludes 0.", "",
             "Scope: this is rung 1 of the evidence ladder only — exact, on this tiny testbed; what it says about "
             "longer completions and larger models is a hypothesis (what rungs 2 and 3 have measured: "
             "[../README.md](../README.md)). An answer below names the lowest mean MSE only where no single seed "
             "left out changes it ('no robust answer' otherwise), with its per-seed wins and its paired test "
             "against the runner-up; 'not distinguishable' means the data do not separate the two.", "",
             "![MSE vs forward passes](mse_vs_forward_passes.png)", "", "## Answer per sampler", ""]
    for rule in summ:
        for ck in summ[rule]:
            same = _same_as_low_confidence(doc, rule, ck)
            lines.append(f"- {sentence(rule, ck, summ[rule][ck])}" + (
                " At this checkpoint no confidence reaches the threshold on any seed, so this sampler IS the "
                "low-confidence sampler (identical numbers)." if same else ""))
    se = [f["mse_mc_se"] / f["mse"] for m in doc["per_model"].values() for r in m.values()
          for f in r["estimators"].get("spg", {}).values() if f.get("mc_draws")]
    if se:
        lines += ["", f"SPG's Monte-Carlo standard error (EUBO, K ≥ 2): at most {100 * max(se):.2g} % of its MSE "
                  f"(per model; {cfg['spg_replicas']} replicas of {cfg['spg_draws'] // cfg['spg_replicas']} draws)."]
    lines += ["", "## At each estimator's best step size (scale-free)", "",
              "The MSE above compares the likelihoods at one shared learning rate, so an estimator whose mean is a "
              "shrunk g* (MDPO's λ_t weights) gains by being small. Below, each is scaled by its own best scalar "
              "c* first: rel. MSE = min_c E‖c ĝ − g*‖² / ‖g*‖² = 1 − cos²(E ĝ, g*) · ‖E ĝ‖² / (‖E ĝ‖² + tr Var) "
              "(0 = exact, 1 = no better than no step; `dllm_ais/analysis/estimator_best_step.py`), ranked the "
              "same way (setting chosen by this metric, per-seed wins, leave-one-seed-out, paired t against the "
              "runner-up). Bold = no single seed left out changes the winner and it wins a majority of seeds.", ""]
    for rule in summ:
        for ck, s in summ[rule].items():
            lines.append(f"- **{rule_label(rule)}, checkpoint {ck}**: " + "; ".join(
                best_step_sentence(b, w.get("best_step", {}), s["estimators"]) for b, w in s["winners"].items()))
    lines += ["", "## Budgets an estimator cannot take", ""]
    lines += [f"- `{k}`: {v}" for k, v in doc["impossible_budgets"].items()]
    for rule in summ:
        for ck, s in summ[rule].items():
            lines += ["", f"## {rule_label(rule)}, checkpoint {ck} (J = {_fmt(s['J'])})", "",
                      "Ranking per budget (each "
                      "estimator at its best setting whose mean rows fit; paired over the seeds):", ""]
            lines += ranking_table(s)
            lines += ["", "All settings:", "",
                      "| estimator | budget | rows | MSE | bias² | tr Var (N) | cos(E ĝ, g*) | cos(E ĝ, ∇J) "
                      "| rel. MSE at best step |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for name, budgets in s["estimators"].items():
                for b, f in budgets.items():
                    lines.append(f"| {name} | {b} | {f['rows']['mean']:.2f} | {_fmt(f['mse'])} | "
                                 f"{_fmt(f['bias_sq'])} | {_fmt(f['trace_var'])} | {_fmt(f['cos_g_star'])} | "
                                 f"{_fmt(f['cos_grad_j'])} | {_fmt(f[METRIC])} |")
    path.write_text("\n".join(lines) + "\n")


def write_figure(doc: dict, path: Path) -> None:
    """MSE (mean over seeds, 95 % t bars, clipped at the axis where they cross 0) vs forward passes per completion,
    one line per estimator; one panel per sampler and checkpoint; log-log axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    summ = doc["summary"]
    panels = [(r, ck) for r in summ for ck in summ[r]]
    cols = 2
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(6.0 * cols, 4.4 * rows))
    FigureCanvasAgg(fig)
    for i, (rule, ck) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        for name, budgets in summ[rule][ck]["estimators"].items():
            xs = [f["rows"]["mean"] for f in budgets.values()]
            ys = [f["mse"]["mean"] for f in budgets.values()]
            err = [f["mse"]["half"] for f in budgets.values()]
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=4, lw=1.2, capsize=2, label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("expected forward rows per completion")
        ax.set_ylabel("MSE of the GRPO gradient vs g* (log)")
        ax.set_title(f"{rule_label(rule)}, checkpoint {ck}", fontsize=9)
        if i == 0:
            ax.legend(fontsize=7)
    fig.suptitle("Exact MSE = bias² + tr Var (N = 64) per policy likelihood; mean over seeds, 95 % t bars")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
