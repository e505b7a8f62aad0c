"""The generated README of benchmarks/estimators/ (the evidence ladder, issue 40): the answer table by budget, where
the rungs disagree, the rank table and links to each rung's own report."""

from __future__ import annotations

from dllm_ais.analysis.ladder_report import BUDGETS, aggregate, answer


def scale(rung: str, docs: dict) -> str:
    """At which scale a rung's answer holds, from its stored config."""
    if rung == "rung 1":
        c = docs["rung1"]["config"]
        t = c["testbed"]
        fams = " and ".join({"llada": "LLaDA", "dream": "Dream"}[f] for f in c.get("families", ["llada"]))
        return (f"exact enumeration: tiny {fams} ({t['n_layers']} layer, d_model {t['d_model']}), V_c = {t['vocab']}, "
                f"L = {t['gen_length']}, {t['num_prompts']} prompts; {len(c['seeds'])} seeds × checkpoints "
                f"{c['checkpoints']} (SFT steps); every parameter")
    if rung == "rung 2":
        c = docs["rung2"]["config"]
        m = c["models"]
        Ls = sorted({L for _, _, ls in c["grid"] for L in ls})
        cells = "; ".join(f"{f} {s} L = {', '.join(map(str, ls))}" for f, s, ls in c["grid"])
        paths = ", ".join(f"{p} at L = {L}" for L, p in c["paths"])
        return (f"Monte Carlo: tiny LLaDA and Dream ({m['n_layers']} layers, width {m['d_model']}) trained on digits "
                f"(SFT to reward {m['sft_target']}, then {m['rl_steps']} GRPO steps), L = {Ls[0]}–{Ls[-1]}; {cells}; "
                f"paths per cell {paths}; the LM head's coordinates of the gradient")
    return "RL: pre-registered learning curves on two CPU tasks (study/estimators-rl-*.toml), 5 seeds"


def _best(contexts: dict, b: str) -> set[str]:
    agg = aggregate(contexts, b)
    if not agg:
        return set()
    top = max(a["best"] for a in agg.values())
    return {k for k, a in agg.items() if a["best"] == top}


def readme(rungs: dict[str, dict], docs: dict, table: list[str]) -> str:
    """The whole README text (deterministic: no timings; those are in rung2/timing.json)."""
    lines = ["# Which policy likelihood to train with — the evidence ladder (generated)", "",
             "Written by `python -m dllm_ais.analysis.ladder --out benchmarks/estimators` (module doc of "
             "`dllm_ais/analysis/ladder.py`); per-rung reports: [rung 1](rung1/README.md) (exact), "
             "[rung 2](rung2/README.md) (Monte-Carlo ground truth)" + (", [rung 3](rung3/README.md) (RL)" if
                                                                         "rung 3" in rungs else "") + ".", "",
             "Each rung ranks every policy likelihood's GRPO gradient by its MSE against the gradient of the "
             "sampler that ran (g* = ∇J̃, exact-likelihood GRPO's expected gradient), each estimator at its best "
             "setting whose *measured* forward rows per completion fit the budget. A rank interval moves only past "
             "estimators whose paired 95 % interval of the MSE difference excludes 0.", "",
             "## The answer, by budget", "",
             "| forward rows per completion | " + " | ".join(rungs) + " |", "|---|" + "---|" * len(rungs)]
    for b in BUDGETS:
        lines.append(f"| ≤ {b} | " + " | ".join(answer(aggregate(rungs[r], str(b))) for r in rungs) + " |")
    lines += ["", "'best in k/n': point rank 1 in k of the rung's n contexts (rung 1: sampler × checkpoint; rung 2: "
              "family × checkpoint × L × sampler); 'can be best': no other estimator distinguishably better.", "",
              "Scale at which each rung holds:", ""]
    lines += [f"- **{r}**: {scale(r, docs)}." for r in rungs]
    if "rung 1" in rungs and "rung 2" in rungs:
        lines += ["", "Where the rungs disagree (the point-best estimators differ):", ""]
        diff = [f"- ≤ {b} rows: rung 1 {', '.join(sorted(_best(rungs['rung 1'], str(b))))}; rung 2 "
                f"{', '.join(sorted(_best(rungs['rung 2'], str(b))))}" for b in BUDGETS
                if _best(rungs["rung 1"], str(b)) and _best(rungs["rung 2"], str(b))
                and _best(rungs["rung 1"], str(b)) != _best(rungs["rung 2"], str(b))]
        lines += diff or ["- nowhere: the same estimators lead at every budget both rungs cover."]
    if "rung2" in docs:
        lines += ["", "![MSE vs L](mse_vs_L.png)", "",
                  "Rung 2's MSE relative to ‖g*‖² against the completion length, each estimator at its best setting "
                  "within the budget (jackknife 95 % bars)."]
    lines += ["", "## Ranks per rung and budget", "",
              "Median point rank over the rung's contexts [lowest–highest end of the rank intervals] (point-best "
              "contexts / contexts):", ""] + table
    return "\n".join(lines) + "\n"
