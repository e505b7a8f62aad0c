"""Multi-seed study of the mismatch corrections (logic in dllm_ais/analysis/study.py): every arm × every seed.

    python scripts/study_corrections.py --out benchmarks/study --work runs/study --workers 2     # the study
    python scripts/study_corrections.py --out benchmarks/study --work runs/study --arms fp4-none,fp4-ais  # add arms
    python scripts/study_corrections.py --out /tmp/s --work /tmp/s/runs --smoke                  # seconds

Pre-registered study (dllm_ais/analysis/study_plan.py): the plan file fixes arms, seeds, metrics and comparisons; runs
are resumable (rerun the same command), and it refuses to run with uncommitted changes (--allow-dirty for smoke tests):

    python scripts/study_corrections.py --plan study/plan.toml                     # benchmarks/study/<plan name>/
    python scripts/study_corrections.py --plan study/plan.toml --pilot --seeds 1 --arms bf16,mxfp4-none
    python scripts/study_corrections.py --plan study/plan.toml --calibrate          # τ scan on a validation split

Arms: bf16; fp8 × {none, tis, ais}; fp4 × {none, tis, mis, ais} when the package has FP4 rollouts
(dllm_ais.analysis.study.ARMS; adding an arm is one line there). Per seed one SFT warm-up shared by all arms; runs whose
result.json exists in --work are reused, so the study can be resumed or extended. --report-only rewrites the report from
--work.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
from pathlib import Path

from dllm_ais.analysis import study

REPO = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="study_corrections", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", default=None, help="report directory (summary.json, README.md, runs.jsonl, plots)")
    p.add_argument("--work", default=None, help="run directories (one per arm and seed; reused when finished)")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds 0..N-1 (default 5; with --plan: the "
                   "first N of the plan's seeds)")
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
    p.add_argument("--plan", default=None, help="pre-registered plan (TOML, e.g. study/plan.toml): runs its arms "
                   "and comparisons; --out/--work default to benchmarks/study/<plan name> and runs/study-<name>")
    p.add_argument("--pilot", action="store_true", help="with --plan: a labelled pilot (report under <out>/pilot)")
    p.add_argument("--calibrate", action="store_true", help="with --plan: the τ scan of its [calibration] table")
    p.add_argument("--allow-dirty", action="store_true", help="with --plan: run with uncommitted changes (smoke "
                   "tests; the summary records it)")
    return p


def machine() -> str:
    import torch

    return (f"{platform.machine()} {platform.system()}, {os.cpu_count()} logical CPUs, "
            f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}; Python "
            f"{platform.python_version()}, torch {torch.__version__}")


def main(argv: list[str] | None = None) -> int:
    from dataclasses import replace

    from dllm_ais.analysis.bench_env import git_commit

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.plan is not None:
        return run_plan_command(args, argv)
    if args.out is None or args.work is None:
        raise SystemExit("--out and --work are required without --plan.")
    cfg = study.SMOKE if args.smoke else study.StudyConfig()
    overrides = dict(steps=args.steps, sft_steps=args.sft_steps, prompts_per_step=args.prompts_per_step,
                     ais_tau=args.ais_tau, eval_limit=args.eval_limit)
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if not args.smoke:
        cfg = replace(cfg, seeds=tuple(range(args.seeds or 5)))
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


def run_plan_command(args, argv: list[str]) -> int:
    """--plan: refuse uncommitted changes (unless --allow-dirty), run the plan's runs (resumable), write the report."""
    import json

    from dllm_ais.analysis import study_plan
    from dllm_ais.analysis.bench_env import git_commit
    from dllm_ais.atomic import atomic_write_text

    plan = study_plan.load_plan(args.plan)
    sha, dirty = git_commit(REPO)
    if dirty and not args.allow_dirty:
        raise SystemExit("the work tree has uncommitted changes: a pre-registered study runs on committed code only "
                         "(commit first; --allow-dirty for smoke tests, recorded in summary.json).")
    sub = "pilot" if args.pilot else ("calibration" if args.calibrate else "")
    out = Path(args.out or REPO / "benchmarks" / "study" / plan.name) / sub
    work = Path(args.work or REPO / "runs" / f"study-{plan.name}") / sub
    seeds = plan.config.seeds[:args.seeds] if args.seeds is not None and args.seeds < len(plan.config.seeds) \
        else plan.config.seeds
    if args.smoke:
        from dataclasses import replace

        plan = replace(plan, config=replace(study.SMOKE, preset=plan.config.preset))
        seeds = plan.config.seeds
    wanted = args.arms.split(",") if args.arms else None
    if wanted:
        known = {a.name for a in study_plan.arms(plan, include_missing=True)}
        unknown = sorted(set(wanted) - known)
        if unknown:
            raise SystemExit(f"--arms: unknown arm(s) {unknown}; the plan has {', '.join(sorted(known))}.")
    meta = {"command": "python scripts/study_corrections.py " + shlex.join(argv), "machine": args.machine or machine(),
            "git_sha": sha, "uncommitted_changes": bool(dirty), "pilot": args.pilot}
    log = lambda line: print(line, flush=True)  # noqa: E731
    if args.calibrate:
        summary = {**meta, "calibration": study_plan.run_calibration(plan, work, log=log, workers=args.workers)}
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str))
        print(f"wrote {out / 'summary.json'}")
        return 0
    study_plan.run_plan(plan, work, wanted, seeds, log=log, workers=args.workers)
    seeds, redraws = study_plan.accepted_seeds(plan, work, seeds, log=log)  # [sft_acceptance] (cached scores)
    results = study.collect(work, study_plan.arms(plan, include_missing=True), seeds)  # every finished run, also
    sft = {s: study_plan.sft_scores(plan, work, s) for s in seeds}  # those of earlier commands (other --arms)
    summary = {**meta, "preset": study.study_preset(plan.config, seeds[0]).to_dict(),
               **study_plan.summarize_plan(plan, results, sft, redraws)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str))
    atomic_write_text(out / "runs.jsonl", "".join(json.dumps(r) + "\n" for r in results))
    if results:
        from dllm_ais.analysis.study_figure import draw

        draw(out)  # outcomes.png, trajectories.png
    print(study_plan.report_table(summary))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
