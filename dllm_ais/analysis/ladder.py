"""Which policy likelihood to train with — the evidence ladder (issue 40): one command, one table.

    python -m dllm_ais.analysis.ladder --out benchmarks/estimators                 # rungs 1 and 2, then the report
    python -m dllm_ais.analysis.ladder --rungs 2 --quick --out /tmp/ladder          # a few minutes
    python -m dllm_ais.analysis.ladder --rungs 2 --lengths 8 --paths 4096 --out benchmarks/estimators  # the run
                                                                                     # committed in rung2/
    python -m dllm_ais.analysis.ladder --smoke --out /tmp/ladder                     # seconds (CI)
    python -m dllm_ais.analysis.ladder --report-only --out benchmarks/estimators    # the report from stored results
    python -m dllm_ais.analysis.ladder --rungs 2 --lengths 8 --paths 4096 --supplement mdpo,dtreerpo \
        --out benchmarks/estimators   # MDPO's and d-TreeRPO's rows added to the cached cells, on their own paths

Rung 1 (exact, analysis/estimators.py): the enumerable tiny-LLaDA testbed, L = 4 -> <out>/rung1/.
Rung 2 (Monte-Carlo ground truth, analysis/ladder_rung2.py): trained tiny LLaDA, Dream and SDAR, L = 8-64 ->
<out>/rung2/.
Rung 3 (RL, pre-registered, study/estimators-rl-*.toml): learning curves per likelihood; run with
`scripts/study_corrections.py --plan ...` (hours) and summarised here from <out>/rung3/ when present.
The report (<out>/README.md, ladder.json, mse_vs_L.png) ranks the estimators per rung with intervals
(analysis/ladder_report.py). Every output is a deterministic function of the command (seeded generators, one torch
thread); a test checks --smoke twice for identical bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from dllm_ais.analysis import estimators as E
from dllm_ais.analysis import ladder_models as LM
from dllm_ais.analysis import ladder_rung2 as R2
from dllm_ais.analysis.mc_ground_truth import MCConfig
from dllm_ais.atomic import atomic_write_text


def parse_paths(text: str | None) -> int | dict[int, int] | None:
    """--paths: "4096" (every length) or "8:4096,32:1024" (per completion length L)."""
    if text is None or ":" not in text:
        return None if text is None else int(text)
    out = {}
    for part in text.split(","):
        L, _, n = part.partition(":")
        try:
            out[int(L)] = int(n)
        except ValueError:
            raise SystemExit(f"--paths {text}: write N or L:N,L:N (e.g. 8:4096,32:1024).") from None
    return out


def rung2_config(mode: str, lengths: tuple[int, ...] = (), paths: int | dict[int, int] | None = None,
                 families: tuple[str, ...] = ()) -> R2.Rung2Config:
    """The full, --quick or --smoke grid of rung 2 (module doc of ladder_rung2.py); the full grid restricted to
    `lengths` and `families` (when given) with `paths` paths per cell (when given: one count, or a count per length —
    a length it does not name keeps Rung2Config's)."""
    if mode == "full":
        from dataclasses import replace

        cfg = R2.Rung2Config()
        if lengths or families:
            grid = tuple((f, s, tuple(L for L in ls if not lengths or L in lengths)) for f, s, ls in cfg.grid
                         if not families or f in families)
            cfg = replace(cfg, grid=tuple(g for g in grid if g[2]))
        if isinstance(paths, dict):
            unknown = set(paths) - dict(cfg.paths).keys()
            if unknown:
                raise SystemExit(f"--paths names L = {sorted(unknown)}; rung 2's lengths are "
                                 f"{', '.join(str(L) for L, _ in cfg.paths)}.")
            cfg = replace(cfg, paths=tuple((L, paths.get(L, n)) for L, n in cfg.paths))
        elif paths is not None:
            cfg = replace(cfg, paths=tuple((L, paths) for L, _ in cfg.paths))
        return cfg
    if lengths or paths is not None or families:
        raise SystemExit("--lengths / --paths / --families shape the full grid of rung 2: drop --quick / --smoke.")
    if mode == "quick":
        return R2.Rung2Config(grid=(("llada", "low_confidence", (8,)), ("dream", "entropy", (8,)),
                                    ("sdar", "low_confidence_dynamic", (8,))), checkpoints=("rl",),
                              mc=MCConfig(blocks=8, budgets=(1, 2, 4)), paths=((8, 1024),), prompts=32)
    return R2.Rung2Config(grid=(("llada", "low_confidence", (8,)), ("dream", "entropy", (8,))), checkpoints=("sft",),
                          mc=MCConfig(N=16, G=4, blocks=4, budgets=(1, 2)), paths=((8, 128),), prompts=8,
                          models=LM.LadderModelConfig(d_model=16, mlp=16, sft_max_steps=20, sft_chunk=10,
                                                      rl_steps=1, eval_prompts=8))


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True, default=float) + "\n")


def run_rung1(out: Path, mode: str, log=print) -> None:
    cfg = E.EstimatorsConfig() if mode == "full" else E.smoke_config()
    doc = E.run(cfg, out / "rung1", log=log)
    log(f"rung 1: {doc['timing']['seconds']:.0f} s")


def run_rung2(out: Path, cfg: R2.Rung2Config, models: Path, log=print, supplement: tuple[str, ...] = ()) -> None:
    t0, c0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()
    doc = R2.run(cfg, models, log, supplement)
    doc["timing"].update(seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0,
                         load_average_start=load0, load_average_end=os.getloadavg(), threads=1)
    timing = doc.pop("timing")
    timing["cells"] = {}
    for name, cell in doc["cells"].items():  # machine-dependent seconds: out of results.json (bit-reproducible)
        train = cell["model"]["train"]
        timing["cells"][name] = {"seconds": cell.pop("seconds"), "cpu_seconds": cell.pop("cpu_seconds"),
                                 "by_part": cell.pop("seconds_by_part"),
                                 "model_sft_seconds": train.pop("sft_seconds"),
                                 "model_rl_seconds": train.pop("rl_seconds"),
                                 "model_cpu_seconds": train.pop("cpu_seconds", None)}
    _write_json(out / "rung2" / "results.json", doc)
    _write_json(out / "rung2" / "timing.json", timing)  # machine-dependent: kept out of results.json
    log(f"rung 2: {timing['seconds']:.0f} s (models {timing['models_seconds']:.0f} s)")


def report(out: Path, figures: bool = True) -> dict:
    """README.md, ladder.json, answer.md and (figures) mse_vs_L.png of `out` from the rungs' stored results."""
    from dllm_ais.analysis.estimator_best_step import METRIC
    from dllm_ais.analysis.ladder_report import (
        BUDGETS,
        rank_table,
        rung1_contexts,
        rung2_contexts,
        rung2_readme,
        write_figure,
    )
    from dllm_ais.analysis.ladder_text import RUNG1_BEST_STEP

    rungs, docs = {}, {}
    if (out / "rung1" / "results.json").is_file():
        docs["rung1"] = json.loads((out / "rung1" / "results.json").read_text())
        rungs["rung 1"] = rung1_contexts(docs["rung1"])
        rungs[RUNG1_BEST_STEP] = rung1_contexts(docs["rung1"], METRIC)
    if (out / "rung2" / "results.json").is_file():
        docs["rung2"] = json.loads((out / "rung2" / "results.json").read_text())
        rungs["rung 2"] = rung2_contexts(docs["rung2"])
        if figures:
            write_figure(docs["rung2"], out / "mse_vs_L.png")
        from dllm_ais.analysis.ladder_text import status

        run_md = ["", "How this folder's run was made (command, machine, load, versions): [RUN.md](RUN.md)."] if (
            out / "rung2" / "RUN.md").is_file() else []
        (out / "rung2" / "README.md").write_text("\n".join(
            ["# Rung 2: Monte-Carlo ground truth per cell (generated)", "",
             "Written by `python -m dllm_ais.analysis.ladder`; numbers from `results.json` (method: module docs of "
             "`dllm_ais/analysis/mc_ground_truth.py` and `mc_stats.py`).", "", status({"rung2": docs["rung2"]})[1]]
            + run_md + rung2_readme(docs["rung2"])) + "\n")
    docs["rung2_supplements"] = sorted(p.name for p in out.glob("rung2-supplement-*") if (p / "README.md").is_file())
    from dllm_ais.analysis.ladder_rung3 import rung3_contexts

    if (out / "rung3" / "summary.json").is_file():
        docs["rung3"] = json.loads((out / "rung3" / "summary.json").read_text())
        rungs["rung 3"] = rung3_contexts(docs["rung3"])
    table = rank_table(rungs, BUDGETS)
    from dllm_ais.analysis.ladder_text import readme

    (out / "README.md").write_text(readme(rungs, docs, table))
    from dllm_ais.analysis.ladder_answer import answer_block

    (out / "answer.md").write_text(answer_block(rungs) + "\n")
    ladder = {r: {b: {k: v for k, v in _agg(rungs[r], str(b)).items()} for b in BUDGETS} for r in rungs}
    _write_json(out / "ladder.json", ladder)
    return ladder


def _agg(contexts, b):
    from dllm_ais.analysis.ladder_report import aggregate

    return aggregate(contexts, b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/estimators", help="output folder")
    ap.add_argument("--rungs", default="1,2", help="comma list of rungs to run (1, 2); rung 3 is the study "
                    "script's (its summary in <out>/rung3 is read when present)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a few minutes: rung 2 at L = 8 only, LLaDA "
                      "low-confidence, Dream entropy and SDAR dynamic after RL, 1,024 paths a cell")
    mode.add_argument("--smoke", action="store_true", help="seconds: every code path at toy sizes")
    ap.add_argument("--lengths", default="", help="comma list: rung 2's full grid at these completion lengths only "
                    "(of 8, 16, 32, 64)")
    ap.add_argument("--families", default="", help="comma list: rung 2's full grid for these families only (llada, "
                    "dream, sdar); cells of other families are kept out of results.json (merge them with "
                    "ladder_merge.py)")
    ap.add_argument("--paths", default=None, help="sampled paths per rung-2 cell: N at every length, or L:N,L:N per "
                    "length (default: ladder_rung2.Rung2Config.paths)")
    ap.add_argument("--supplement", default="", help="comma list of rung-2 estimators (mdpo, dtreerpo) added to every "
                    "cell on its own sampled paths; a cached cell is re-measured and must reproduce its numbers "
                    "(mc_ground_truth.supplement_cell)")
    ap.add_argument("--models", default="runs/ladder", help="cache of rung 2's trained models (gitignored)")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the report from stored results")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    m = "smoke" if args.smoke else "quick" if args.quick else "full"
    if not args.report_only:
        rungs = {r.strip() for r in args.rungs.split(",") if r.strip()}
        if rungs - {"1", "2"}:
            raise SystemExit(f"--rungs {args.rungs}: run rungs 1 and 2 here; rung 3 runs with "
                             "scripts/study_corrections.py --plan study/estimators-rl-<task>.toml.")
        if "1" in rungs:
            run_rung1(out, m)
        if "2" in rungs:
            lengths = tuple(int(x) for x in args.lengths.split(",") if x.strip())
            models = Path(args.models) if m != "smoke" else out / "models"
            names = tuple(x.strip() for x in args.supplement.split(",") if x.strip())
            families = tuple(x.strip() for x in args.families.split(",") if x.strip())
            run_rung2(out, rung2_config(m, lengths, parse_paths(args.paths), families), models, supplement=names)
    report(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

