"""Multi-seed study of the mismatch corrections (logic in dllm_ais/study.py): every arm × every seed.

    python scripts/study_corrections.py --out benchmarks/study --work runs/study --workers 2     # the study
    python scripts/study_corrections.py --out benchmarks/study --work runs/study --arms fp4-none,fp4-ais  # add arms
    python scripts/study_corrections.py --out /tmp/s --work /tmp/s/runs --smoke                  # seconds

Arms: bf16; fp8 × {none, tis, ais}; fp4 × {none, tis, mis, ais} when the package has FP4 rollouts (dllm_ais.study.ARMS;
adding an arm is one line there). Per seed one SFT warm-up shared by all arms; runs whose result.json exists in
--work are reused, so the study can be resumed or extended. --report-only rewrites the report from --work.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
from pathlib import Path

from dllm_ais import study

REPO = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="study_corrections", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", required=True, help="report directory (summary.json, README.md, runs.jsonl, plots)")
    p.add_argument("--work", required=True, help="run directories (one per arm and seed; reused when finished)")
    p.add_argument("--seeds", type=int, default=5, help="number of seeds 0..N-1 (default 5)")
    p.add_argument("--arms", default=None, help="comma list of arm names (default: every available arm)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the study's)")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT warm-up steps (default: the preset's)")
    p.add_argument("--prompts-per-step", type=int, default=None, help="prompts per GRPO step (default: preset's)")
    p.add_argument("--ais-tau", type=float, default=None, help="τ of every arm (default: CorrectionConfig's)")
    p.add_argument("--eval-limit", type=int, default=None, help="held-out items per run (default: whole test split)")
    p.add_argument("--workers", type=int, default=1, help="runs at a time, one torch thread each")
    p.add_argument("--smoke", action="store_true", help="seconds: 2 seeds, 3 SFT + 3 GRPO steps, 8 held-out items")
    p.add_argument("--report-only", action="store_true", help="only rewrite the report from --work's finished runs")
    p.add_argument("--machine", default=None, help="machine description for the report (default: detected)")
    return p


def machine() -> str:
    import torch

    return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} logical CPUs, "
            f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}; Python "
            f"{platform.python_version()}, torch {torch.__version__}")


def main(argv: list[str] | None = None) -> int:
    from dataclasses import replace

    from dllm_ais.bench_env import git_commit

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    cfg = study.SMOKE if args.smoke else study.StudyConfig()
    overrides = dict(steps=args.steps, sft_steps=args.sft_steps, prompts_per_step=args.prompts_per_step,
                     ais_tau=args.ais_tau, eval_limit=args.eval_limit)
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if not args.smoke:
        cfg = replace(cfg, seeds=tuple(range(args.seeds)))
    arms = study.available_arms()
    if args.arms:
        wanted = args.arms.split(",")
        unknown = sorted(set(wanted) - {a.name for a in arms})
        if unknown:
            raise SystemExit(f"--arms: unknown or unavailable arm(s) {unknown}; available: "
                             f"{', '.join(a.name for a in arms)}.")
        selected = [a for a in arms if a.name in wanted]
    else:
        selected = arms
    work, out = Path(args.work), Path(args.out)
    sha, dirty = git_commit(REPO)
    meta = {"command": "python scripts/study_corrections.py " + shlex.join(argv),
            "machine": args.machine or machine(), "git_sha": sha + (" (uncommitted changes)" if dirty else "")}
    if not args.report_only:
        study.run_study(cfg, work, selected, workers=args.workers, log=lambda line: print(line, flush=True))
    results = study.collect(work, arms, cfg.seeds)  # every finished arm, also those run by earlier commands
    summary = study.write_report(out, cfg, results, arms, meta)
    print(study.table(summary))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
