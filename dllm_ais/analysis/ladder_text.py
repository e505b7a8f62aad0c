"""The generated README of benchmarks/estimators/ (the evidence ladder, issue 40): the answer table by budget, where
the rungs disagree, the rank table and links to each rung's own report."""

from __future__ import annotations

from dllm_ais.analysis.ladder_report import BUDGETS, aggregate, answer, point_best

ISSUE_PATHS = 100_000
"""Paths per rung-2 cell issue 40 asks for (≥ 10⁵)."""
FULL_RUNG2 = "python -m dllm_ais.analysis.ladder --rungs 2 --out benchmarks/estimators"
"""The command of rung 2's full grid (ladder_rung2.GRID)."""
RUNG3 = ("python scripts/study_corrections.py --plan study/estimators-rl-digits.toml --out "
         "benchmarks/estimators/rung3/digits --work runs/estimators-rl-digits, the same with "
         "study/estimators-rl-arith-v2.toml (--out benchmarks/estimators/rung3/arith --work "
         "runs/estimators-rl-arith-v2), then python -m dllm_ais.analysis.ladder_rung3 (the plans' headers hold the "
         "full commands)")
"""Rung 3's commands."""
RUNG1_BEST_STEP = "rung 1, best step"
"""The column of rung 1 ranked by each estimator's MSE at its own best step size (estimator_best_step.py)."""


def _rung2_command(c: dict, Ls: list[int], paths: list[int]) -> str:
    """' Run by `...`.' when the stored grid is the full grid at some lengths (else '')."""
    from dllm_ais.analysis.ladder_rung2 import GRID

    grid = [[f, s, [L for L in ls if L in Ls]] for f, s, ls in GRID]
    if [g for g in grid if g[2]] != c["grid"]:
        return ""
    per_length = ",".join(f"{L}:{p}" for L, p in c["paths"] if L in Ls)
    return (f" Run by `python -m dllm_ais.analysis.ladder --rungs 2 --lengths {','.join(map(str, Ls))} "
            f"--paths {paths[0] if len(paths) == 1 else per_length} --out benchmarks/estimators` (its machine, load "
            "and versions: rung2/RUN.md).")


def status(docs: dict) -> list[str]:
    """What each rung has measured, in words that a reader cannot take for more (deterministic, from the stored
    results' own configs)."""
    out = []
    if "rung1" in docs:
        c = docs["rung1"]["config"]
        out.append(f"- **Rung 1 (exact): measured.** {len(c['seeds'])} model seeds × checkpoints {c['checkpoints']}; "
                   "every answer in [rung1/README.md](rung1/README.md) carries its per-seed wins, a leave-one-seed-out "
                   "check (an answer one seed can flip is reported as 'no robust answer') and a paired t-test against "
                   "the runner-up.")
    else:
        out.append("- **Rung 1 (exact): not in this folder** (`--rungs 1` writes it).")
    if "rung2" in docs:
        c = docs["rung2"]["config"]
        paths = sorted({p for L, p in c["paths"] if any(L in ls for _, _, ls in c["grid"])})
        Ls = sorted({L for _, _, ls in c["grid"] for L in ls})
        cells = len(docs["rung2"]["cells"])
        grid = "; ".join(f"{f} {s} at L = {', '.join(map(str, ls))}" for f, s, ls in c["grid"])
        factor = " to ".join(f"{(ISSUE_PATHS / p) ** 0.5:.0f}" for p in sorted({max(paths), min(paths)}, reverse=True))
        short = "" if min(paths) >= ISSUE_PATHS else (
            f" — issue 40 asks for ≥ {ISSUE_PATHS:,} paths per cell, so the target's own Monte-Carlo error is "
            f"≈ {factor}× larger than asked (see each cell's relative error)")
        full = "" if Ls == [8, 16, 32, 64] else (
            f" L = {', '.join(map(str, Ls))} only: L = 8–64 on the full grid is not run at scale "
            f"(`{FULL_RUNG2}`).")
        out.append(f"- **Rung 2 (Monte-Carlo ground truth): measured at small scale.** {cells} cells ({grid}; "
                   f"checkpoints {', '.join(c['checkpoints'])}), {' / '.join(f'{p:,}' for p in paths)} sampled paths "
                   f"per cell{short}.{full}{_rung2_command(c, Ls, paths)}")
    else:
        out.append(f"- **Rung 2 (Monte-Carlo ground truth): not run at scale.** `{FULL_RUNG2}`.")
    if "rung3" in docs:
        out.append("- **Rung 3 (RL): measured** (pre-registered plans; [rung3/README.md](rung3/README.md)).")
    else:
        out.append("- **Rung 3 (RL): plan registered** (study/estimators-rl-digits.toml, "
                   f"study/estimators-rl-arith-v2.toml), **runs not done**: {RUNG3}.")
    return out


def _names(families: list[str]) -> str:
    """'LLaDA and Dream', 'LLaDA, Dream and SDAR'."""
    names = [{"llada": "LLaDA", "dream": "Dream", "sdar": "SDAR"}[f] for f in families]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def scale(rung: str, docs: dict) -> str:
    """At which scale a rung's answer holds, from its stored config."""
    if rung == RUNG1_BEST_STEP:
        return ("rung 1's testbed and numbers, each estimator scaled by its own best scalar step first (min_c "
                "E‖c ĝ − g*‖² / ‖g*‖²: a tuned learning rate undoes a fixed shrinkage such as MDPO's λ_t weights; "
                "estimator_best_step.py)")
    if rung == "rung 1":
        c = docs["rung1"]["config"]
        t = c["testbed"]
        fams = _names(c.get("families", ["llada"]))
        return (f"exact enumeration: tiny {fams} ({t['n_layers']} layer, d_model {t['d_model']}), V_c = {t['vocab']}, "
                f"L = {t['gen_length']}, {t['num_prompts']} prompts; {len(c['seeds'])} seeds × checkpoints "
                f"{c['checkpoints']} (SFT steps); every parameter; the MSE at one shared step size")
    if rung == "rung 2":
        c = docs["rung2"]["config"]
        m = c["models"]
        Ls = sorted({L for _, _, ls in c["grid"] for L in ls})
        cells = "; ".join(f"{f} {s} L = {', '.join(map(str, ls))}" for f, s, ls in c["grid"])
        paths = ", ".join(f"{p} at L = {L}" for L, p in c["paths"] if L in Ls)
        fams = _names(list(dict.fromkeys(f for f, _, _ in c["grid"])))
        return (f"Monte Carlo: tiny {fams} ({m['n_layers']} layers, width {m['d_model']}) trained on digits "
                f"(SFT to reward {m['sft_target']}, then {m['rl_steps']} GRPO steps), L = "
                f"{'–'.join(map(str, sorted({Ls[0], Ls[-1]})))}; {cells}; "
                f"paths per cell {paths}; the LM head's coordinates of the gradient")
    tasks = docs["rung3"]["tasks"]
    runs = "; ".join(f"{name} (`{t['plan']}`, preset {t['preset']}, "
                     f"{max(len(a['final_reward']['per_seed']) for a in t['arms'].values())} seeds, "
                     f"{t['budget']} forward row per completion in every arm" +
                     ("; LEFT OUT of the ranks: its baseline did not learn distinguishably, see rung3/README.md)"
                      if t.get("learned") is False else ")") for name, t in tasks.items())
    return ("RL: pre-registered learning curves, one context per task and metric (final reward, AUC; higher is "
            f"better, ranked by paired t over seeds): {runs}")


def _best(contexts: dict, b: str) -> set[str]:
    return set(point_best(aggregate(contexts, b)))


def by_family(rungs: dict[str, dict]) -> list[str]:
    """The answer table per model family (contexts are named family/...): a family's own estimators (SDAR's block
    ELBO, its one-step analogue) never meet the others', so the pooled table above can hide its answer."""
    fams = list(dict.fromkeys(k.split("/")[0] for r in rungs.values() for k in r))
    if len(fams) < 2:
        return []
    out = ["", "The answer per family (each family's contexts only; same notation):", "",
           "| forward rows per completion | family | " + " | ".join(rungs) + " |", "|---|---|" + "---|" * len(rungs)]
    for b in BUDGETS:
        for f in fams:
            own = {r: {k: v for k, v in c.items() if k.split("/")[0] == f} for r, c in rungs.items()}
            cells = [answer(aggregate(own[r], str(b))) for r in rungs]
            if any(c != "—" for c in cells):
                out.append(f"| ≤ {b} | {_names([f])} | " + " | ".join(cells) + " |")
    return out


def readme(rungs: dict[str, dict], docs: dict, table: list[str]) -> str:
    """The whole README text (deterministic: no timings; those are in rung2/timing.json)."""
    lines = ["# Which policy likelihood to train with — the evidence ladder (generated)", "",
             "Written by `python -m dllm_ais.analysis.ladder --out benchmarks/estimators` (module doc of "
             "`dllm_ais/analysis/ladder.py`); per-rung reports: [rung 1](rung1/README.md) (exact), "
             "[rung 2](rung2/README.md) (Monte-Carlo ground truth)" + (", [rung 3](rung3/README.md) (RL)" if
                                                                         "rung 3" in rungs else "") + ".", "",
             "Each rung ranks every policy likelihood's GRPO gradient by its MSE against the gradient of the "
             "sampler that ran (g* = ∇J̃, exact-likelihood GRPO's expected gradient), each estimator at its best "
             "setting whose *measured* forward rows per completion fit the budget (rung 3 ranks the learning curves' "
             "reward instead, every arm at the same rows). A rank interval moves only past estimators whose paired "
             "95 % interval of the difference excludes 0.", "",
             "## What each rung has", ""] + status(docs) + ["",
             "## The answer, by budget", "",
             "| forward rows per completion | " + " | ".join(rungs) + " |", "|---|" + "---|" * len(rungs)]
    for b in BUDGETS:
        lines.append(f"| ≤ {b} | " + " | ".join(answer(aggregate(rungs[r], str(b))) for r in rungs) + " |")
    lines += ["", "'best in k/n': point rank 1 in k of the rung's n contexts (rung 1: sampler × checkpoint; rung 2: "
              "family × checkpoint × L × sampler; rung 3: task × metric); 'robust in k/n' (rung 1 only): the lowest "
              "mean MSE in k contexts "
              "where no single seed left out changes it and it wins a majority of seeds; 'can be best': no other "
              "estimator distinguishably better. A point rank is not an answer: in rung 1 one seed can flip it (the "
              "per-context answers that survive leaving any seed out are in rung1/README.md); in rung 2 read it beside "
              "each cell's Monte-Carlo error.", "",
              "Scale at which each rung holds:", ""]
    lines += [f"- **{r}**: {scale(r, docs)}." for r in rungs]
    lines += by_family(rungs)
    if "rung 1" in rungs and "rung 2" in rungs:
        lines += ["", "Where the rungs disagree (the point-best estimators differ):", ""]
        diff = [f"- ≤ {b} rows: rung 1 {', '.join(sorted(_best(rungs['rung 1'], str(b))))}; rung 2 "
                f"{', '.join(sorted(_best(rungs['rung 2'], str(b))))}" for b in BUDGETS
                if _best(rungs["rung 1"], str(b)) and _best(rungs["rung 2"], str(b))
                and _best(rungs["rung 1"], str(b)) != _best(rungs["rung 2"], str(b))]
        lines += diff or ["- nowhere: the same estimators lead at every budget both rungs cover."]
        missing = sorted({k for ctx in rungs["rung 1"].values() for c in ctx.values() for k in c["ranks"]}
                         - {k for ctx in rungs["rung 2"].values() for c in ctx.values() for k in c["ranks"]})
        if missing:
            sups = docs.get("rung2_supplements", [])
            lines.append(f"- not measured in rung 2's cells (a disagreement there is no evidence): "
                         f"{', '.join(missing)}" + ("" if not sups else " (measured on part of the grid, outside these "
                                                     "tables: " + ", ".join(f"[{n}]({n}/README.md)" for n in sups)
                                                     + ")") + ".")
    if "rung2" in docs:
        lines += ["", "![MSE vs L](mse_vs_L.png)", "",
                  "Rung 2's MSE relative to ‖g*‖² against the completion length, each estimator at its best setting "
                  "within the budget (jackknife 95 % bars)."]
    lines += ["", "## Ranks per rung and budget", "",
              "Median point rank over the rung's contexts [lowest–highest end of the rank intervals] (point-best "
              "contexts / contexts):", ""] + table
    return "\n".join(lines) + "\n"
