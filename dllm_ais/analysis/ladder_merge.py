"""Merge a rung-2 run of some families into a stored rung-2 folder (issue 42 item 5: SDAR's cells beside LLaDA's and
Dream's, without recomputing or rewriting theirs).

    python -m dllm_ais.analysis.ladder_merge --into benchmarks/estimators/rung2 --add runs/ladder-sdar/out/rung2
    python -m dllm_ais.analysis.ladder --report-only --out benchmarks/estimators

results.json: the stored cells are kept byte for byte (values), the added run's cells join them; both runs must have
the same settings apart from the grid (MC, models, paths, threshold, blocks, prompts — the cells' cache key minus the
grid), and a cell present in both must be equal. The merged grid lists, in `ladder_rung2.GRID`'s order, every
(family, sampler) of either run with the union of its lengths. timing.json: the per-cell timings are merged, the
run-level fields of the added run are kept under `merged[<family list>]`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dllm_ais.analysis.ladder_rung2 import GRID


def merge_docs(base: dict, add: dict) -> dict:
    """The merged results.json document (module doc); ValueError on a settings or cell conflict."""
    strip = lambda c: {k: v for k, v in c.items() if k != "grid"}  # noqa: E731
    if strip(base["config"]) != strip(add["config"]):
        diff = sorted(k for k in strip(base["config"]) if base["config"][k] != add["config"].get(k))
        raise ValueError(f"rung-2 runs with different settings cannot be merged (differ in: {', '.join(diff)}).")
    for name, cell in add["cells"].items():
        if name in base["cells"] and base["cells"][name] != cell:
            raise ValueError(f"cell {name} differs between the two runs.")
    lengths: dict[tuple, set] = {}
    for f, s, ls in list(base["config"]["grid"]) + list(add["config"]["grid"]):
        lengths.setdefault((f, s), set()).update(ls)
    order = [(f, s) for f, s, _ in GRID] + sorted(k for k in lengths if k not in {(f, s) for f, s, _ in GRID})
    grid = [[f, s, sorted(lengths[(f, s)])] for f, s in order if (f, s) in lengths]
    return {**base, "config": {**base["config"], "grid": grid}, "cells": {**base["cells"], **add["cells"]}}


def merge_timing(base: dict, add: dict) -> dict:
    out = {**base, "cells": {**base["cells"], **add["cells"]}}
    run = {k: v for k, v in add.items() if k != "cells"}
    out.setdefault("merged", []).append(run)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", required=True, help="the stored rung2 folder (results.json, timing.json)")
    ap.add_argument("--add", required=True, help="the rung2 folder of the run to add")
    args = ap.parse_args(argv)
    into, add = Path(args.into), Path(args.add)
    doc = merge_docs(json.loads((into / "results.json").read_text()), json.loads((add / "results.json").read_text()))
    (into / "results.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=float) + "\n")
    if (into / "timing.json").is_file() and (add / "timing.json").is_file():
        t = merge_timing(json.loads((into / "timing.json").read_text()), json.loads((add / "timing.json").read_text()))
        (into / "timing.json").write_text(json.dumps(t, indent=1, sort_keys=True, default=float) + "\n")
    print(f"merged {len(doc['cells'])} cells into {into}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
