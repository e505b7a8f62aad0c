"""Summary, length extrapolation and figure of the exact-gradient analysis (results.json of exact_gradients.py).

`summarise(doc)` condenses the per-regime figures into what the README states: per regime and batch size the ratio
bias²/variance of the uncorrected gradient, λ* against AIS's λ, each estimator's MSE relative to λ*'s; across
regimes the correlation of AIS's mean λ with λ*, the τ of AIS's severity map that minimises the MSE, the λ rules'
excess MSE, ΔJ early vs late, and the length fit:

    log(bias²_none / v_unit) = c + β log Var_μ(ℓ) + γ log L          (v_unit = tr Var of one prompt group's term)

β from the synthetic μ_α sweep at fixed L, γ from the length sweep given β. With N = B G, bias²/tr Var ĝ = B ·
bias² / v_unit; extrapolated to LLaDA-8B (L = 256, B = 32 prompts, G = 6) with Var ℓ = L κ for a per-token κ range —
an extrapolation over two orders of magnitude in L from L ≤ 5, stated as such.
"""

from __future__ import annotations

import math
from pathlib import Path

LLADA_8B = {"L": 256, "B": 32, "G": 6}
"""The d1 presets' rollout shape the extrapolation targets (gen 256, 32 × 6 is the issue's batch)."""


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _regime_rows(doc: dict) -> list[dict]:
    rows = []
    for reg in doc["regimes"]:
        for N, f in reg["per_N"].items():
            best = f["mse_lam_star"]
            row = {"regime": reg["spec"]["name"], "group": reg["spec"]["group"], "N": int(N),
                   "bias_sq_over_var": f["bias_sq_over_var_none"], "lam_star": f["lam_star"],
                   "ais_lam_mean": f["ais_product"]["lam_mean"], "ais_lam_q": f["ais_product"]["lam_quantiles"],
                   "mse_none_rel": _ratio(f["mse_none"], best), "mse_tis_rel": _ratio(f["mse_tis"], best),
                   "mse_ais_rel": _ratio(f["ais_product"]["mse"], best),
                   "mse_ais_severity_rel": _ratio(f["ais_severity"]["mse"], best),
                   "mse_rule_shift_limit_rel": _ratio(f["mse_rule_shift_limit"], best),
                   "mse_rule_noise_limit_rel": _ratio(f["mse_rule_noise_limit"], best),
                   "rule_shift_limit": f["rule_shift_limit"], "rule_noise_limit": f["rule_noise_limit"],
                   "bias_sq_tis_over_none": _ratio(f["bias_sq_tis"], f["bias_sq_none"]),
                   "D": reg["mismatch"]["D"], "ess": reg["mismatch"]["ess"]}
            for k in ("rule_shift", "rule_noise"):
                if k in f:
                    row[f"mse_{k}_rel"] = _ratio(f[k]["mse"], best)
                    row[f"{k}_lam_mean"] = f[k]["lam_mean"]
            rows.append(row)
    return rows


def _corr(x: list[float], y: list[float]) -> float:
    n = len(x)
    if n < 3:
        return math.nan
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def _tau_scan(doc: dict) -> dict:
    """Per N: geometric mean over regimes of MSE(AIS at τ) / MSE(λ*), and the best τ."""
    out = {}
    for N in {n for reg in doc["regimes"] for n in reg["per_N"]}:
        scores = {}
        for reg in doc["regimes"]:
            f = reg["per_N"].get(N)
            if f is None:
                continue
            for tau, mse in f["mse_ais_by_tau"].items():
                scores.setdefault(tau, []).append(_ratio(mse, f["mse_lam_star"]))
            scores.setdefault("none (λ = 0)", []).append(_ratio(f["mse_none"], f["mse_lam_star"]))
        gm = {tau: _geomean(v) for tau, v in scores.items()}
        worst = {tau: max(v) for tau, v in scores.items()}
        out[N] = {"geomean_mse_over_lam_star": gm, "max_mse_over_lam_star": worst,
                  "best": min(gm, key=lambda k: gm[k]), "best_minimax": min(worst, key=lambda k: worst[k])}
    return out


def _fit(xs: list[list[float]], y: list[float]) -> list[float]:
    """Least squares y ≈ X b (X rows xs, an intercept included by the caller) via the normal equations."""
    import torch

    X = torch.tensor(xs, dtype=torch.float64)
    Y = torch.tensor(y, dtype=torch.float64)
    return torch.linalg.lstsq(X, Y[:, None]).solution[:, 0].tolist()


def length_extrapolation(doc: dict, kappa_range: tuple[float, float] | None = None) -> dict:
    """The module doc's fit and its extrapolation (None fields when the run lacks the sweeps)."""
    pts = []  # (name, group, L, var_ell, bias², v_unit)
    for reg in doc["regimes"]:
        s = reg["spec"]
        if s["family"] != "llada" or s["surrogate"] != "one_step" or s["rule"] != "low_confidence":
            continue
        f = next(iter(reg["per_N"].values()))
        v_unit = f["trace_var_none"] * f["B"]
        pts.append({"name": s["name"], "group": s["group"], "precision": s["precision"], "L": s["gen_length"],
                    "checkpoint": s["checkpoint"], "var_ell": reg["mismatch"]["var_ell"], "bias_sq": f["bias_sq_none"],
                    "v_unit": v_unit})
    main_ck = next((p["checkpoint"] for p in pts if p["group"] == "length"), None)
    alpha = [p for p in pts if p["group"] == "synthetic" and p["bias_sq"] > 0]
    if main_ck is None or len(alpha) < 2:
        return {"fitted": False}
    beta = _fit([[1.0, math.log(p["var_ell"])] for p in alpha],
                [math.log(p["bias_sq"] / p["v_unit"]) for p in alpha])[1]
    length_precisions = {p["precision"] for p in pts if p["group"] == "length"}
    sweep = [p for p in pts if p["checkpoint"] == main_ck and p["precision"] in length_precisions and p["bias_sq"] > 0]
    ys = [math.log(p["bias_sq"] / p["v_unit"]) - beta * math.log(p["var_ell"]) for p in sweep]
    c, gamma = _fit([[1.0, math.log(p["L"])] for p in sweep], ys)
    resid = [y - c - gamma * math.log(p["L"]) for y, p in zip(ys, sweep, strict=True)]
    resid_sd = math.sqrt(sum(r * r for r in resid) / max(len(resid) - 2, 1))
    kappa = {p["name"]: p["var_ell"] / p["L"] for p in sweep}
    fp8 = [p for p in pts if p["precision"] == "fp8" and p["var_ell"] > 0]
    if kappa_range is None:
        ks = [p["var_ell"] / p["L"] for p in fp8]
        kappa_range = (min(ks), max(ks)) if ks else (math.nan, math.nan)
    L, B = LLADA_8B["L"], LLADA_8B["B"]
    pred = {f"{k:.3g}": B * math.exp(c + beta * math.log(L * k) + gamma * math.log(L)) for k in kappa_range
            if k > 0 and math.isfinite(k)}
    return {"fitted": True, "beta_var_ell": beta, "gamma_L": gamma, "intercept": c, "residual_sd_log": resid_sd,
            "fp8_kappa_by_checkpoint": {p["name"]: p["var_ell"] / p["L"] for p in fp8},
            "points": sweep, "alpha_points": alpha, "kappa_per_token_of_sweep": kappa,
            "kappa_fp8_range_assumed": list(kappa_range), "target": LLADA_8B,
            "predicted_bias_sq_over_var_at_8b": pred,
            "assumptions": "bias²/v_unit = e^c (Var ℓ)^β L^γ fitted on the tiny LLaDA at L ≤ 5 (one-step surrogate, "
                           "exact sampler, main checkpoint); Var ℓ = L κ (independent per-token log-ratios); κ of FP8 "
                           "at LLaDA-8B unknown without a GPU: taken as the range FP8 shows on this testbed's "
                           "checkpoints; G = 6 vs 8 and a 0/1 reward vs a per-position one are ignored; the fit's "
                           "residual SD (log scale) is a factor e^sd either way at the fitted points, more beyond."}


def _delta_j_rows(doc: dict) -> list[dict]:
    rows = []
    for reg in doc["regimes"]:
        dj = reg["delta_j"]
        row = {"regime": reg["spec"]["name"], "group": reg["spec"]["group"], "J": dj["J"],
               "first_order_over_target": {k: v["rate_over_target"] for k, v in dj["first_order"].items()},
               "cos_grad_J": {k: v["cos_grad_J"] for k, v in dj["first_order"].items()},
               "sgd_mean_gradient": dj["sgd"]["mean_gradient"]}
        if "first_order" in dj["adam"]:
            row["adam_first_order"] = {k: [v["mean"], v["se"], v["minus_none_mean"], v["minus_none_se"]]
                                       for k, v in dj["adam"]["first_order"].items()}
        rows.append(row)
    return rows


def summarise(doc: dict) -> dict:
    """The condensed view (module doc)."""
    rows = _regime_rows(doc)
    corr = {}
    for N in sorted({r["N"] for r in rows}):
        sel = [r for r in rows if r["N"] == N]
        corr[N] = {"corr_ais_lam_vs_lam_star": _corr([r["ais_lam_mean"] for r in sel], [r["lam_star"] for r in sel]),
                   **{f"geomean_{k}": _geomean([r[k] for r in sel if k in r])
                      for k in ("mse_none_rel", "mse_tis_rel", "mse_ais_rel", "mse_ais_severity_rel",
                                "mse_rule_shift_limit_rel", "mse_rule_noise_limit_rel", "mse_rule_shift_rel",
                                "mse_rule_noise_rel")},
                   "max_mse_ais_rel": max(r["mse_ais_rel"] for r in sel),
                   "max_mse_none_rel": max(r["mse_none_rel"] for r in sel)}
    return {"headline": {str(k): v for k, v in corr.items()}, "rows": rows, "tau": _tau_scan(doc),
            "delta_j": _delta_j_rows(doc), "length": length_extrapolation(doc)}


def write_figure(doc: dict, path: Path) -> None:
    """MSE(λ) / MSE(0) per regime (one panel each, one line per N) with λ* (dot) and AIS's λ (median, 25–75 % bar)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    regs = doc["regimes"]
    grid = doc["config"]["lambda_grid"]
    cols = 6
    rows = -(-len(regs) // cols)
    fig = Figure(figsize=(3.0 * cols, 2.3 * rows))
    FigureCanvasAgg(fig)
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i, reg in enumerate(regs):
        ax = fig.add_subplot(rows, cols, i + 1)
        for j, (N, f) in enumerate(reg["per_N"].items()):
            base = f["mse_grid"][0]
            c = colours[j % len(colours)]
            ax.plot(grid, [m / base for m in f["mse_grid"]], color=c, lw=1.2, label=f"N={N}")
            ax.plot([f["lam_star"]], [f["mse_lam_star"] / base], "o", color=c, ms=5)
            q = f["ais_product"]["lam_quantiles"]
            y = f["ais_product"]["mse"] / base
            ax.plot([q[2]], [y], "x", color=c, ms=7, mew=2)
            ax.plot([q[1], q[3]], [y, y], "-", color=c, lw=3, alpha=0.4)
        m = reg["mismatch"]
        ax.set_title(f"{reg['spec']['name']} (ESS {m['ess']:.3f})", fontsize=8)
        ax.tick_params(labelsize=6)
        if i == 0:
            ax.legend(fontsize=6)
    tau = doc["config"].get("ais_tau")
    fig.suptitle("MSE(λ) / MSE(λ = 0) of ĝ_AIS(λ) = (1 − λ) ĝ_none + λ ĝ_TIS against g* (exact); "
                 f"o = λ*(N), x = AIS's own λ (product combiner, τ = {tau}; median, bar = IQR) at its simulated MSE",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(str(path), dpi=90)


def _f(x, nd=3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{nd}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{nd}f}"


def markdown_tables(doc: dict) -> str:
    """The README's tables, printed from results.json (so no number in them is typed by hand)."""
    out = ["| regime | group | D | ESS | N | bias²/var (none) | bias² TIS / none | λ* | AIS λ median [IQR] | "
           "MSE / MSE(λ*): none · TIS · AIS · AIS-sev · shift rule |", "|" + "---|" * 10]
    for reg in doc["regimes"]:
        m = reg["mismatch"]
        for N, f in reg["per_N"].items():
            q = f["ais_product"]["lam_quantiles"]
            best = f["mse_lam_star"]
            rule = f.get("rule_shift", {}).get("mse")
            rels = " · ".join(_f(v / best) if v is not None else "—" for v in
                              (f["mse_none"], f["mse_tis"], f["ais_product"]["mse"], f["ais_severity"]["mse"], rule))
            out.append(f"| {reg['spec']['name']} | {reg['spec']['group']} | {_f(m['D'])} | {_f(m['ess'])} | {N} | "
                       f"{_f(f['bias_sq_over_var_none'])} | {_f(_ratio(f['bias_sq_tis'], f['bias_sq_none']), 2)} | "
                       f"{_f(f['lam_star'], 2)} | {_f(q[2], 2)} [{_f(q[1], 2)}, {_f(q[3], 2)}] | {rels} |")
    out += ["", "| regime | J | cos(g*, ∇J) | first-order ΔJ of the mean gradient / target's: none · TIS · AIS · "
            "λ*(64) | finite SGD step (‖η g*‖ = step_norm) ΔJ: target · none · TIS · AIS | AdamW first-order ΔJ "
            "(×1e3) none; − none: TIS · AIS · λ* |", "|" + "---|" * 6]
    for reg in doc["regimes"]:
        dj = reg["delta_j"]
        fo = dj["first_order"]
        rel = " · ".join(f"{fo[k]['rate_over_target']:.3f}" for k in ("none", "tis", "ais_product", "lam_star"))
        fin = " · ".join(f"{dj['sgd']['mean_gradient'][k]:+.4f}" for k in ("target", "none", "tis", "ais_product"))
        adam = dj["adam"].get("first_order")
        cell = "—" if adam is None else (f"{1e3 * adam['none']['mean']:+.2f} ± {1e3 * adam['none']['se']:.2f}; " +
                                         " · ".join(f"{1e3 * adam[k]['minus_none_mean']:+.2f} ± "
                                                    f"{1e3 * adam[k]['minus_none_se']:.2f}"
                                                    for k in ("tis", "ais_product", "lam_star")))
        out.append(f"| {reg['spec']['name']} | {dj['J']:.3f} | {fo['target']['cos_grad_J']:.3f} | {rel} | {fin} | "
                   f"{cell} |")
    return "\n".join(out)


if __name__ == "__main__":
    import json
    import sys

    print(markdown_tables(json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else
                                          "benchmarks/exact_gradients/results.json").read_text())))
