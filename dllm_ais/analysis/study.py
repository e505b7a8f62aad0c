"""Multi-seed study of the mismatch corrections: every arm (rollout precision × correction) on several seeds.

One *arm* is a rollout precision and a correction (bf16; fp8 × {none, tis, ais}; fp4 × {none, tis, mis, ais} when
the package has FP4 rollouts). For every seed the SFT warm-up runs once (`<work>/sft-seed<k>`) and is copied into
every arm's run directory, so the arms of a seed start from the same weights with the same data and sampling seeds:
differences between arms of one seed are paired. Each run is an ordinary `run_training` run directory
`<work>/<arm>/seed<k>` plus `result.json` (final-quarter reward, held-out accuracy of the final BF16 model, wall time);
a run whose `result.json` exists is skipped, so a study can be extended (more seeds, new arms) or resumed.

The summary (`summarize`) gives per arm the mean and 95 % t-interval across seeds of the final-quarter reward and the
held-out accuracy, the mean λ and its spread over steps, and paired differences (same seed) against BF16 and against
the uncorrected run of the same precision. `write_report` writes `summary.json`, `README.md` (the table), `runs.jsonl`
(per-run results and compact trajectories) and the plots into the output directory.

Adding an arm is one line in `ARMS`; arms whose precision or correction this package does not have are left out.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dllm_ais import metrics as M
from dllm_ais.atomic import atomic_write_text

SFT_CACHE = "sft"  # dllm_ais.train.job.SFT_DIR: run_training reuses <run>/sft when it exists
RESULT = "result.json"
TRAJECTORY_KEYS = (M.REWARD_MEAN, M.AIS_LAMBDA, M.AIS_ESS, M.AIS_DIVERGENCE, M.AIS_VAR_AMP, "ais/damping",
                   M.MISMATCH_KL, M.AIS_TRUNC)
"""Per-step metrics kept for every run in runs.jsonl (the full metrics.jsonl stays in the work directory)."""


@dataclass(frozen=True)
class Arm:
    """One arm of the study: a rollout precision and a correction (plus optional config overrides)."""

    name: str
    """Label in tables and plots, and the run directory name."""
    rollout_precision: str
    """TrainConfig.rollout_precision (bf16, fp8, fp4, ...)."""
    correction: str
    """CorrectionConfig.correction (none, tis, mis, ais, ...)."""
    train: dict = field(default_factory=dict)
    """Extra TrainConfig fields, e.g. {"fp4_format": "nvfp4"}."""
    corr: dict = field(default_factory=dict)
    """Extra CorrectionConfig fields, e.g. {"ais_tau": 0.01}."""
    sampler: dict = field(default_factory=dict)
    """Extra SamplerConfig fields of the rollouts, e.g. {"threshold": 0.9} (evaluation keeps the preset's)."""


ARMS: tuple[Arm, ...] = (
    Arm("bf16", "bf16", "none"),
    Arm("fp8-none", "fp8", "none"),
    Arm("fp8-tis", "fp8", "tis"),
    Arm("fp8-ais", "fp8", "ais"),
    Arm("fp4-none", "fp4", "none", {"fp4_format": "nvfp4"}),
    Arm("fp4-tis", "fp4", "tis", {"fp4_format": "nvfp4"}),
    Arm("fp4-mis", "fp4", "mis", {"fp4_format": "nvfp4"}),
    Arm("fp4-ais", "fp4", "ais", {"fp4_format": "nvfp4"}),
    Arm("fp4-ais-tau0.2", "fp4", "ais", {"fp4_format": "nvfp4"}, {"ais_tau": 0.2}),  # variant: smaller λ (~0.3)
)
"""Every arm this study knows; `available_arms` drops those the installed package cannot run."""

BASELINE = "bf16"
"""The arm every other arm is compared with (paired by seed)."""


def available_arms(arms: Sequence[Arm] = ARMS) -> list[Arm]:
    """The arms whose rollout precision, correction and extra fields exist in this package's configs."""
    from dataclasses import fields

    from dllm_ais.config import ROLLOUT_PRECISIONS, TrainConfig
    from dllm_ais.rl.config import CORRECTIONS, CorrectionConfig

    train_fields = {f.name for f in fields(TrainConfig)}
    corr_fields = {f.name for f in fields(CorrectionConfig)}
    return [a for a in arms if a.rollout_precision in ROLLOUT_PRECISIONS and a.correction in CORRECTIONS
            and set(a.train) <= train_fields and set(a.corr) <= corr_fields]


def uncorrected_name(arm: Arm) -> str:
    """Name of the uncorrected arm of the same precision (e.g. fp8-none for fp8-ais)."""
    return f"{arm.rollout_precision}-none"


# ------------------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class StudyConfig:
    """Study-wide settings: the base preset and the (smaller) run size every arm uses."""

    preset: str = "tiny-cpu-arith"
    """Base preset; the fields below override it. tiny-cpu-arith (single-digit arith, gen_length 4, SFT lr 3e-3 ×
    batch 64, dapo, 2 updates per step) is the testbed benchmarks/study/ was measured on; the default tiny-cpu has
    since moved to the digits task, so the study pins its own."""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Seeds; each seed is one model init, one SFT warm-up, one data order, shared by all arms."""
    steps: int | None = 150
    """GRPO steps per run (None = the preset's). The study's runs are shorter than the default run."""
    sft_steps: int | None = 200
    """SFT warm-up steps (None = the preset's); 200 starts RL near reward 0.2."""
    prompts_per_step: int | None = 8
    """Prompts per GRPO step (None = the preset's)."""
    num_generations: int | None = 8
    """G (None = the preset's)."""
    mismatch_num_draws: int | None = 2
    """K of the coupled ELBO (None = the preset's)."""
    learning_rate: float | None = 5e-4
    """GRPO learning rate (None = the preset's)."""
    beta: float | None = 0.0
    """KL coefficient to the SFT model (None = the preset's). 0: the study ran before tiny-cpu got beta 0.04."""
    sft_batch_size: int | None = None
    """SFT batch size (None = the preset's)."""
    ais_tau: float | None = None
    """τ for every arm (None = the preset's CorrectionConfig default); an arm's `corr` still wins."""
    eval_limit: int | None = None
    """Held-out items evaluated per run (None = the task's whole test split)."""
    eval_batch_size: int = 64
    """Prompts per held-out evaluation batch."""

    def __post_init__(self):
        if len(self.seeds) < 2:
            raise ValueError(f"StudyConfig.seeds={self.seeds}: a confidence interval needs at least 2 seeds.")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"StudyConfig.seeds={self.seeds} has repeats.")


SMOKE = StudyConfig(seeds=(0, 1), steps=3, sft_steps=3, prompts_per_step=2, num_generations=4, mismatch_num_draws=2,
                    sft_batch_size=8, eval_limit=8, eval_batch_size=8)
"""--smoke: seconds per run."""


def study_preset(cfg: StudyConfig, seed: int, arm: Arm | None = None):
    """The base preset with the study's overrides, the seed (model init and training) and the arm's settings."""
    from dllm_ais.presets import get_preset

    p = get_preset(cfg.preset)
    train = {k: v for k, v in dict(steps=cfg.steps, sft_steps=cfg.sft_steps, prompts_per_step=cfg.prompts_per_step,
                                  mismatch_num_draws=cfg.mismatch_num_draws, learning_rate=cfg.learning_rate,
                                  sft_batch_size=cfg.sft_batch_size).items() if v is not None}
    corr = {} if cfg.ais_tau is None else {"ais_tau": cfg.ais_tau}
    if arm is not None:
        train.update(rollout_precision=arm.rollout_precision, **arm.train)
        corr.update(correction=arm.correction, **arm.corr)
    grpo = {k: v for k, v in dict(num_generations=cfg.num_generations, beta=cfg.beta).items() if v is not None}
    sampler = {} if arm is None else arm.sampler
    return replace(p, model=replace(p.model, seed=seed), train=replace(p.train, seed=seed, **train),
                   grpo=replace(p.grpo, **grpo), correction=replace(p.correction, **corr),
                   sampler=replace(p.sampler, **sampler))


# ---------------------------------------------------------------------------------------------------------- runs
def sft_dir(work: Path, seed: int) -> Path:
    return work / f"sft-seed{seed}"


def run_dir(work: Path, arm: Arm, seed: int) -> Path:
    return work / arm.name / f"seed{seed}"


def warm_start(cfg: StudyConfig, work: Path, seed: int) -> Path | None:
    """The seed's SFT cache (a 1-step run in <work>/sft-seed<k>, made once); None when the preset has no SFT."""
    from dllm_ais.train.job import run_training

    preset = study_preset(cfg, seed)
    if preset.train.sft_steps == 0:
        return None
    run = sft_dir(work, seed)
    cache = run / SFT_CACHE
    if not cache.is_dir():
        if run.exists():
            shutil.rmtree(run)  # an interrupted warm-up: start it again
        run_training(replace(preset, train=replace(preset.train, steps=1)), run, progress=False)
    return cache


def quarter_means(values: Sequence[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter (at least one value each) of a per-step series."""
    vals = list(values)
    q = max(1, len(vals) // 4)
    return _mean(vals[:q]), _mean(vals[-q:])


def run_arm(cfg: StudyConfig, work: Path, arm: Arm, seed: int) -> dict:
    """Train one arm on one seed (from the seed's SFT cache), evaluate held-out accuracy; returns result.json."""
    import torch

    from dllm_ais.analysis.evaluate import eval_sampler, evaluate
    from dllm_ais.train.job import run_training

    run = run_dir(work, arm, seed)
    done = run / RESULT
    if done.is_file():
        return json.loads(done.read_text())
    if run.exists():
        shutil.rmtree(run)  # an interrupted run: start it again
    cache = warm_start(cfg, work, seed)
    if cache is not None:
        shutil.copytree(cache, run / SFT_CACHE)
    preset = study_preset(cfg, seed, arm)
    t0 = time.perf_counter()
    trainer = run_training(preset, run, progress=False)
    wall = time.perf_counter() - t0
    sampler = eval_sampler(preset)
    with torch.no_grad():  # greedy accuracy of the final BF16 model on the held-out split and on the train split
        scores = {split: evaluate(trainer.master, trainer.policy.tokenizer, preset.train.task, sampler, split=split,
                                  limit=cfg.eval_limit, batch_size=cfg.eval_batch_size, seed=0,
                                  task_config=preset.train.task_config, family=preset.model.family)
                  for split in ("test", "train")}
    rows = sorted(M.read_metrics(run), key=lambda r: r[M.STEP])
    first, final = quarter_means([_num(r.get(M.REWARD_MEAN)) for r in rows])
    lam = [_num(r.get(M.AIS_LAMBDA)) for r in rows]
    result = {
        "arm": arm.name, "seed": seed, "rollout_precision": arm.rollout_precision, "correction": arm.correction,
        "steps": len(rows), "first_reward": first, "final_reward": final,
        "heldout_acc": scores["test"]["accuracy"], "heldout_n": scores["test"]["n"],
        "train_greedy_acc": scores["train"]["accuracy"], "train_greedy_n": scores["train"]["n"], "wall_s": wall,
        "lambda_mean": _mean(lam), "lambda_std": _std(lam),
        **{f"{k}_mean": _mean([_num(r.get(k)) for r in rows]) for k in TRAJECTORY_KEYS[2:]},
        "trajectory": {k: [_num(r.get(k)) for r in rows] for k in TRAJECTORY_KEYS},
    }
    atomic_write_text(done, json.dumps(result))
    return result


def _job(args) -> dict:
    """Worker entry: one (arm, seed) run with one torch thread."""
    import torch

    cfg, work, arm, seed = args
    torch.set_num_threads(1)
    return run_arm(cfg, Path(work), arm, seed)


def _sft_job(args) -> None:
    import torch

    cfg, work, seed = args
    torch.set_num_threads(1)
    warm_start(cfg, Path(work), seed)


def run_study(cfg: StudyConfig, work: Path, arms: Sequence[Arm], workers: int = 1, log=print) -> list[dict]:
    """All (arm, seed) runs, seed by seed (so a stopped study holds complete seeds); returns their results."""
    work.mkdir(parents=True, exist_ok=True)
    jobs = [(cfg, str(work), arm, seed) for seed in cfg.seeds for arm in arms]
    if workers <= 1:
        for seed in cfg.seeds:
            _sft_job((cfg, str(work), seed))
        results = []
        for job in jobs:
            results.append(_job(job))
            log(_line(results[-1]))
        return results
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as pool:
        list(pool.map(_sft_job, [(cfg, str(work), s) for s in cfg.seeds]))
        results = []
        for result in pool.map(_job, jobs):
            results.append(result)
            log(_line(result))
    return results


def _line(r: dict) -> str:
    return (f"{r['arm']:>10} seed {r['seed']}: reward {r['first_reward']:.3f} -> {r['final_reward']:.3f}, "
            f"held-out {r['heldout_acc']:.3f}, greedy train {r['train_greedy_acc']:.3f}, "
            f"λ {r['lambda_mean']:.3f}, D {r[M.AIS_DIVERGENCE + '_mean']:.4f}, "
            f"{r['wall_s']:.0f} s")


def collect(work: Path, arms: Sequence[Arm], seeds: Sequence[int]) -> list[dict]:
    """The finished runs' result.json among `arms` × `seeds` (unfinished runs are left out)."""
    out = []
    for arm in arms:
        for seed in seeds:
            path = run_dir(work, arm, seed) / RESULT
            if path.is_file():
                out.append(json.loads(path.read_text()))
    return out


# ------------------------------------------------------------------------------------------------------ statistics
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Two-sided 95 % Student-t quantiles t_{0.975, df} for df = 1..30."""


def t_quantile_975(df: int) -> float:
    """t_{0.975, df}; the normal 1.960 beyond df = 30 (at most 2 % wider there: a conservative table is not needed)."""
    if df < 1:
        return math.nan
    return _T975[df - 1] if df <= len(_T975) else 1.960


def _num(v) -> float:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return math.nan
    return v


def _finite(values) -> list[float]:
    return [v for v in (_num(x) for x in values) if math.isfinite(v)]


def _mean(values) -> float:
    vals = _finite(values)
    return sum(vals) / len(vals) if vals else math.nan


def _std(values) -> float:
    """Sample standard deviation (n − 1); NaN below 2 values."""
    vals = _finite(values)
    if len(vals) < 2:
        return math.nan
    m = sum(vals) / len(vals)
    return math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))


def mean_ci95(values: Sequence[float]) -> tuple[float, list[float]]:
    """Mean and the 95 % t-interval [lo, hi] of the mean across independent values (seeds)."""
    vals = _finite(values)
    m = _mean(vals)
    if len(vals) < 2:
        return m, [math.nan, math.nan]
    half = t_quantile_975(len(vals) - 1) * _std(vals) / math.sqrt(len(vals))
    return m, [m - half, m + half]


def paired(a: dict[int, float], b: dict[int, float]) -> dict:
    """a − b paired by seed over the seeds both have: mean, 95 % t-interval, number of pairs."""
    seeds = sorted(set(a) & set(b))
    m, ci = mean_ci95([a[s] - b[s] for s in seeds])
    return {"mean": m, "ci95": ci, "pairs": len(seeds)}


def summarize(results: Sequence[dict], arms: Sequence[Arm]) -> dict[str, dict]:
    """Per arm: seeds, means and CIs, λ statistics and paired differences against BF16 and the uncorrected arm."""
    by_arm: dict[str, dict[int, dict]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    out: dict[str, dict] = {}
    for arm in arms:
        runs = by_arm.get(arm.name, {})
        if not runs:
            continue
        col = lambda key, runs=runs: {s: r[key] for s, r in runs.items()}  # noqa: E731
        fr_m, fr_ci = mean_ci95(col("final_reward").values())
        acc_m, acc_ci = mean_ci95(col("heldout_acc").values())
        tr_m, tr_ci = mean_ci95(col("train_greedy_acc").values())
        entry = {
            "rollout_precision": arm.rollout_precision, "correction": arm.correction,
            "seeds": len(runs), "seed_list": sorted(runs),
            "first_reward_mean": _mean(col("first_reward").values()),
            "final_reward_mean": fr_m, "final_reward_ci95": fr_ci,
            "heldout_acc_mean": acc_m, "heldout_acc_ci95": acc_ci,
            "heldout_n": min(r["heldout_n"] for r in runs.values()),
            "train_greedy_acc_mean": tr_m, "train_greedy_acc_ci95": tr_ci,
            "lambda_mean": _mean(col("lambda_mean").values()),
            "lambda_std_over_steps": _mean(col("lambda_std").values()),
            "divergence_mean": _mean(col(M.AIS_DIVERGENCE + "_mean").values()),
            "ess_mean": _mean(col(M.AIS_ESS + "_mean").values()),
            "var_amp_mean": _mean(col(M.AIS_VAR_AMP + "_mean").values()),
            "trunc_frac_mean": _mean(col(M.AIS_TRUNC + "_mean").values()),
            "wall_s_mean": _mean(col("wall_s").values()),
            "steps": min(r["steps"] for r in runs.values()),
        }
        for ref_name, label in ((BASELINE, "vs_bf16"), (uncorrected_name(arm), "vs_uncorrected")):
            ref = by_arm.get(ref_name)
            if ref and ref_name != arm.name:
                ref_col = lambda key, ref=ref: {s: r[key] for s, r in ref.items()}  # noqa: E731
                entry[f"final_reward_{label}"] = paired(col("final_reward"), ref_col("final_reward"))
                entry[f"heldout_acc_{label}"] = paired(col("heldout_acc"), ref_col("heldout_acc"))
                entry[f"train_greedy_acc_{label}"] = paired(col("train_greedy_acc"), ref_col("train_greedy_acc"))
        out[arm.name] = entry
    return out


def lambda_for_tau(trajectory: dict[str, list[float]], tau: float) -> list[float]:
    """λ per step that the product combiner would give at severity scale τ, from a run's logged D, R and g.

    λ = clip((1 − exp(−D/τ)) · R · g, 0, 1) with D = ais/divergence, R = ais/ess_frac, g = ais/damping (before any
    EMA): recomputes AIS's coefficient for another τ without rerunning (the diagnostics do not depend on τ).
    """
    d, r, g = (trajectory[k] for k in (M.AIS_DIVERGENCE, M.AIS_ESS, "ais/damping"))
    return [min(1.0, max(0.0, -math.expm1(-di / tau) * ri * gi)) for di, ri, gi in zip(d, r, g, strict=True)]


TAU_GRID = (0.01, 0.02, 0.05, 0.1, 0.2)
"""τ values whose λ trajectories `tau_scan` recomputes from the logged diagnostics."""


def _quantile(vals: list[float], q: float) -> float:
    """Linear-interpolation quantile of finite values (NaN when empty)."""
    vals = sorted(_finite(vals))
    if not vals:
        return math.nan
    pos = q * (len(vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def tau_scan(results: Sequence[dict], taus: Sequence[float] = TAU_GRID) -> dict[str, dict]:
    """Per arm: D over all steps of all seeds (mean, quartiles, first vs last quarter of the run) and, for each τ,
    the mean and the std over steps of the λ the product combiner would give (`lambda_for_tau`)."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["arm"] for r in results):
        runs = [r for r in results if r["arm"] == name]
        d_all = [d for r in runs for d in r["trajectory"][M.AIS_DIVERGENCE]]
        firsts, lasts = zip(*(quarter_means(r["trajectory"][M.AIS_DIVERGENCE]) for r in runs), strict=True)
        entry = {"D_mean": _mean(d_all), "D_q25": _quantile(d_all, 0.25), "D_q50": _quantile(d_all, 0.5),
                 "D_q75": _quantile(d_all, 0.75), "D_first_quarter": _mean(firsts), "D_final_quarter": _mean(lasts),
                 "lambda": {}}
        for tau in taus:
            lams = [lambda_for_tau(r["trajectory"], tau) for r in runs]
            entry["lambda"][str(tau)] = {"mean": _mean([x for lam in lams for x in lam]),
                                         "std_over_steps": _mean([_std(lam) for lam in lams])}
        out[name] = entry
    return out


def tau_table(scan: dict[str, dict]) -> str:
    """Markdown: D statistics per arm and the mean λ (std over steps) each τ would give."""
    taus = list(next(iter(scan.values()))["lambda"]) if scan else []
    head = ["arm", "D mean", "D quartiles", "D first → final quarter"] + [f"λ at τ={t}" for t in taus]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, e in scan.items():
        cells = [name, _fmt(e["D_mean"], 4), f"{_fmt(e['D_q25'], 4)} / {_fmt(e['D_q50'], 4)} / {_fmt(e['D_q75'], 4)}",
                 f"{_fmt(e['D_first_quarter'], 4)} → {_fmt(e['D_final_quarter'], 4)}"]
        cells += [f"{_fmt(e['lambda'][t]['mean'], 2)} ({_fmt(e['lambda'][t]['std_over_steps'], 2)})" for t in taus]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- report
def _fmt(x: float, digits: int = 3) -> str:
    return "nan" if not math.isfinite(_num(x)) else f"{x:.{digits}f}"


def _ci(m: float, ci: list[float], digits: int = 3) -> str:
    return f"{_fmt(m, digits)} [{_fmt(ci[0], digits)}, {_fmt(ci[1], digits)}]"


def _diff(entry: dict, key: str) -> str:
    d = entry.get(key)
    if not d:
        return "—"
    m, (lo, hi) = d["mean"], d["ci95"]
    mark = " *" if math.isfinite(lo) and (lo > 0 or hi < 0) else ""
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]{mark}"


def table(summary: dict[str, dict]) -> str:
    """Markdown table: one row per arm (means with 95 % t-intervals across seeds, paired differences)."""
    head = ["arm", "seeds", "final-quarter reward", "Δ reward vs BF16", "Δ reward vs uncorrected",
            "held-out acc", "greedy acc, train problems", "Δ greedy vs BF16", "Δ greedy vs uncorrected",
            "λ mean (std over steps)", "D mean", "ESS mean", "V mean", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, e in summary.items():
        cells = [name, str(e["seeds"]), _ci(e["final_reward_mean"], e["final_reward_ci95"]),
                 _diff(e, "final_reward_vs_bf16"), _diff(e, "final_reward_vs_uncorrected"),
                 _ci(e["heldout_acc_mean"], e["heldout_acc_ci95"]),
                 _ci(e["train_greedy_acc_mean"], e["train_greedy_acc_ci95"]),
                 _diff(e, "train_greedy_acc_vs_bf16"), _diff(e, "train_greedy_acc_vs_uncorrected"),
                 f"{_fmt(e['lambda_mean'])} ({_fmt(e['lambda_std_over_steps'])})", _fmt(e["divergence_mean"], 4),
                 _fmt(e["ess_mean"], 4), _fmt(e["var_amp_mean"], 3), _fmt(e["wall_s_mean"], 0)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _smooth(ys: list[float], width: int) -> list[float]:
    half = width // 2
    out = []
    for j in range(len(ys)):
        win = [y for y in ys[max(0, j - half):j - half + width] if math.isfinite(y)]
        out.append(sum(win) / len(win) if win else math.nan)
    return out


def _seed_mean(curves: list[list[float]]) -> list[float]:
    n = min(len(c) for c in curves)
    return [_mean([c[i] for c in curves]) for i in range(n)]


def plot_trajectories(results: Sequence[dict], arms: Sequence[Arm], path: Path,
                      keys: Sequence[str] = (M.REWARD_MEAN, M.AIS_LAMBDA, M.AIS_ESS, M.AIS_DIVERGENCE,
                                             M.AIS_VAR_AMP, M.MISMATCH_KL)) -> None:
    """One panel per metric: the seed-mean curve of each arm (smoothed), faint per-seed curves behind it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 3
    rows_ = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(5 * cols, 3.4 * rows_), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows_, cols, squeeze=False).ravel()
    for i, arm in enumerate(arms):
        runs = [r for r in results if r["arm"] == arm.name]
        if not runs:
            continue
        for ax, key in zip(axes, keys, strict=False):
            curves = [r["trajectory"][key] for r in runs if key in r["trajectory"]]
            if not curves:
                continue
            width = max(1, len(curves[0]) // 15)
            for c in curves:
                ax.plot(_smooth(c, width), color=f"C{i}", alpha=0.12, linewidth=0.7)
            ax.plot(_smooth(_seed_mean(curves), width), color=f"C{i}", linewidth=1.6,
                    label=f"{arm.name} (n={len(curves)})")
            ax.set_title(key)
            ax.set_xlabel("GRPO step")
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    fig.savefig(path, dpi=80)


def _rounded(result: dict, digits: int = 5) -> dict:
    """The result with its per-step trajectories rounded (runs.jsonl stays small; summaries use full precision)."""
    traj = {k: [round(v, digits) if math.isfinite(v) else v for v in vals] for k, vals in result["trajectory"].items()}
    return {**result, "trajectory": traj}


def write_report(out: Path, cfg: StudyConfig, results: Sequence[dict], arms: Sequence[Arm], meta: dict) -> dict:
    """summary.json, README.md (table and settings), runs.jsonl and trajectories.png under `out`; returns summary."""
    out.mkdir(parents=True, exist_ok=True)
    present = [a for a in arms if any(r["arm"] == a.name for r in results)]
    summary = summarize(results, present)
    p = study_preset(cfg, cfg.seeds[0])
    scan = tau_scan(results) if results else {}
    doc = {**meta, "study_config": asdict(cfg), "preset": p.to_dict(), "tau_scan": scan,
           "arms": {name: {**entry, "arm": asdict(next(a for a in present if a.name == name))}
                    for name, entry in summary.items()}}
    atomic_write_text(out / "summary.json", json.dumps(doc, indent=1, default=str))
    atomic_write_text(out / "runs.jsonl", "".join(json.dumps(_rounded(r)) + "\n" for r in results))
    if results:
        plot_trajectories(results, present, out / "trajectories.png")
    tc, g, s, c = p.train, p.grpo, p.sampler, p.correction
    text = f"""# Study: mismatch corrections across seeds

Command: `{meta.get('command', '')}`

Machine: {meta.get('machine', '')}

Code: {meta.get('git_sha', '')}

Testbed: the study pins its own preset (`{cfg.preset}`, the earlier default on single-digit `arith`); the default
`dllm-ais train` (preset `tiny-cpu`) has since moved to the `digits` task, so these numbers are not about it.

Settings (study-specific, smaller than the default run): preset `{cfg.preset}` (task `{tc.task}`
{json.dumps(tc.task_config)}), seeds {list(cfg.seeds)}; per seed one SFT warm-up ({tc.sft_steps} steps, batch
{tc.sft_batch_size}) shared by all arms; then {tc.steps} GRPO steps × {tc.prompts_per_step} prompts × G =
{g.num_generations}, L = {s.gen_length}, {s.steps} denoising steps, T = {s.temperature}, lr {tc.learning_rate},
loss `{g.loss_type}`, β = {g.beta}, {g.num_iterations} updates per step; ℓ from the coupled ELBO with
K = {tc.mismatch_num_draws};
C = {c.is_cap}, τ = {c.ais_tau}, EMA {c.ais_ema}, combiner `{c.ais_combiner}`. Held-out accuracy: greedy decoding
of the final BF16 model on {'the whole test split' if cfg.eval_limit is None else f'{cfg.eval_limit} test items'};
greedy accuracy on the train problems: the same on {'the whole train split' if cfg.eval_limit is None else
f'{cfg.eval_limit} train items'} (what the BF16 model learned, without the rollout policy's sampling noise).

{table(summary)}

Final-quarter reward = mean `reward/mean` (rollout policy's samples at T = {s.temperature}) over the last quarter
of the steps of one run; the table gives its mean over seeds with the 95 % Student-t interval across seeds. Δ columns
are paired by seed (same SFT start, data order and sampling seeds), mean [95 % t-interval]; `*` marks an interval
that excludes 0. λ is logged for every correction (for none/tis/mis it is what AIS would have used); the std is
over the steps of a run, averaged over seeds. Wall time is the GRPO phase of one run (two runs at a time, one torch
thread each, on a machine shared with other jobs); FP8/FP4 on CPU are emulations and slower than BF16 here.

![trajectories](trajectories.png)

## τ scan (recomputed from the logged diagnostics, no extra runs)

D is the mean per-token |ℓ| of a batch (`ais/divergence`); the λ columns give the mean (and std over steps) of
λ = clip((1 − exp(−D/τ)) · R · g, 0, 1) from each step's logged D, R and g, i.e. what AIS would have applied at that
τ on these trajectories (the trajectories themselves were produced with τ = {c.ais_tau}; for arms other than ais
λ does not feed back into training, so the recomputation is exact for them).

{tau_table(scan)}
"""
    atomic_write_text(out / "README.md", text)
    return summary
