"""The pre-registered study: a plan file (TOML) that fixes the arms, seeds, metrics and comparisons before any run,
the runs it asks for (resumable), and the report with Holm-corrected comparisons.

Plan file (study/plan.toml), sections:
- `[plan]`: name, preset, seeds, alpha (family-wise), equivalence_margin, registered (date), and `[plan.settings]`
  (StudyConfig overrides: steps, sft_steps, learning_rate, ...; unset = the preset's).
- `[primary_metric]`: `key` (a result.json field), temperature, eval_limit, description.
- `[secondary]`: keys; `[collapse]`: window, drop (the collapse indicator's definition).
- `[[stress]]`: name, rollout_precision, optional `train` / `sampler` / `corr` overrides, `corrections` (default
  none, tis, ais) and `requires` (import paths "module:attr" that must resolve: a conditional stress regime whose
  code may not be in the package; left out of the run and the Holm family, and listed as such, when missing).
- `[calibration]`: stress, taus, seeds, validation_limit (the τ scan on a validation split, `--calibrate`).
- Explicit designs instead of stress regimes: `[[arm]]` tables (name, rollout_precision, correction, train, sampler,
  corr) and `[[comparison]]` tables (name, a, b, test = paired_t | tost): the arms and the Holm family as written;
  `[plan] baseline` names the arm whose gain over the SFT model is reported (default bf16).
- `[evaluation] fast_sampler`: SamplerConfig overrides (e.g. cache, threshold) of the `heldout_acc_fast_t1` metric:
  the final model sampled with that fast sampler at the primary temperature.
- `[sft_acceptance]`: key (an SFT score: heldout_acc_t1, heldout_acc_greedy, heldout_acc_fast_t1), min, redraw_offset,
  max_redraws: a seed whose SFT model scores below `min` is replaced by seed + k·redraw_offset (k = 1, 2, ...) before
  any of its runs; every re-draw is recorded in the summary.
Arms (stress designs): `bf16` plus `<stress>-<correction>` for every stress regime. Pre-registered comparisons per
(available) stress s, all in one Holm family: `harm:<s>` (s-none − bf16, two-sided paired t), `benefit:<s>` (s-ais −
s-none, two-sided paired t), `equivalence:<s>` (s-ais − bf16, TOST with ±equivalence_margin).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dllm_ais import metrics as M
from dllm_ais.analysis import study
from dllm_ais.analysis.study_stats import (
    differences,
    holm,
    lagged_xcorr,
    min_detectable_effect,
    paired_t,
    peak_lag,
    tost,
)
from dllm_ais.atomic import atomic_write_text

CORRECTIONS = ("none", "tis", "ais")
"""Corrections of every stress regime unless its table lists others."""
PRIMARY_KEYS = ("heldout_acc_t1", "heldout_acc_greedy", "heldout_acc_fast_t1", "final_reward", "collapse")
"""result.json fields a plan may name as primary or secondary metric."""


@dataclass(frozen=True)
class Stress:
    """A rollout-mismatch regime: a rollout precision and the settings that make it."""

    name: str
    """Prefix of its arms' names (e.g. mxfp4 -> mxfp4-none, mxfp4-tis, mxfp4-ais)."""
    rollout_precision: str
    """TrainConfig.rollout_precision."""
    train: dict = field(default_factory=dict)
    """TrainConfig overrides (fp4_format, mismatch_estimator, ...)."""
    sampler: dict = field(default_factory=dict)
    """SamplerConfig overrides used for rollouts (e.g. cache, threshold); evaluation keeps the preset's sampler."""
    corr: dict = field(default_factory=dict)
    """CorrectionConfig overrides shared by its arms."""
    corrections: tuple[str, ...] = CORRECTIONS
    """Corrections it is run with."""
    requires: tuple[str, ...] = ()
    """Import paths 'module:attr' that must resolve for the regime to run (conditional regimes)."""


@dataclass(frozen=True)
class Plan:
    """A parsed plan file."""

    name: str
    """Plan name."""
    path: str
    """The file it was read from."""
    sha256: str
    """Hash of the file's bytes (summary.json records it: the plan that was run is the plan that was committed)."""
    raw: dict
    """The TOML document as parsed."""
    config: study.StudyConfig
    """Run settings."""
    stresses: tuple[Stress, ...]
    """Stress regimes, in file order."""
    primary: str
    """The primary metric's result key."""
    primary_temperature: float
    """Sampling temperature of the primary metric's evaluation."""
    secondary: tuple[str, ...]
    """Secondary metrics' result keys."""
    alpha: float
    """Family-wise error rate of the Holm family."""
    equivalence_margin: float
    """± margin of the equivalence comparisons (primary metric's units)."""
    collapse_window: int
    """Moving-average window (steps) of the collapse indicator."""
    collapse_drop: float
    """A run collapsed when its final-quarter reward is below its peak moving average by more than this."""
    calibration: dict
    """[calibration] section (may be empty)."""
    explicit_arms: tuple = ()
    """[[arm]] tables as study.Arm (empty: bf16 plus the stress regimes' arms)."""
    explicit_comparisons: tuple = ()
    """[[comparison]] tables (empty: harm / benefit / equivalence per stress regime)."""
    baseline: str = "bf16"
    """The arm whose gain over the SFT model is reported."""
    fast_sampler: dict = field(default_factory=dict)
    """[evaluation] fast_sampler: SamplerConfig overrides of heldout_acc_fast_t1 (empty: not measured)."""
    sft_acceptance: dict = field(default_factory=dict)
    """[sft_acceptance] (empty: every seed is kept)."""


def missing_requirements(stress: Stress) -> list[str]:
    """The `requires` entries of `stress` that do not resolve in this package."""
    missing = []
    for spec in stress.requires:
        module, _, attr = spec.partition(":")
        try:
            obj = importlib.import_module(module)
            if attr and not hasattr(obj, attr):
                missing.append(spec)
        except ImportError:
            missing.append(spec)
    return missing


def load_plan(path: str | Path) -> Plan:
    """Parse and validate a plan file; errors name the section and field to change."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ImportError("reading a study plan needs Python >= 3.11 (tomllib) or `pip install tomli`.") from None
    path = Path(path)
    data = path.read_bytes()
    doc = tomllib.loads(data.decode())
    head = doc.get("plan")
    if not isinstance(head, dict):
        raise ValueError(f"{path}: no [plan] table.")
    seeds = tuple(head.get("seeds", ()))
    settings = dict(head.get("settings", {}))
    known = {f for f in study.StudyConfig.__dataclass_fields__} - {"preset", "seeds"}
    unknown = set(settings) - known
    if unknown:
        raise ValueError(f"{path}: [plan.settings] has unknown field(s) {sorted(unknown)}; known: {sorted(known)}.")
    try:
        unset = dict.fromkeys(("steps", "sft_steps", "prompts_per_step", "num_generations", "mismatch_num_draws",
                               "learning_rate", "beta"))  # None = the preset's value
        cfg = study.StudyConfig(preset=head["preset"], seeds=seeds, **{**unset, **settings})
    except KeyError as e:
        raise ValueError(f"{path}: [plan] needs {e.args[0]!r}.") from None
    from dllm_ais.presets import get_preset

    get_preset(cfg.preset)  # unknown preset: the error lists the known ones
    prim = doc.get("primary_metric", {})
    primary = prim.get("key", "heldout_acc_t1")
    secondary = tuple(doc.get("secondary", {}).get("keys", ()))
    for key in (primary, *secondary):
        if key not in PRIMARY_KEYS:
            raise ValueError(f"{path}: metric {key!r} unknown; use one of {', '.join(PRIMARY_KEYS)}.")
    stresses = []
    for i, s in enumerate(doc.get("stress", [])):
        extra = set(s) - {"name", "rollout_precision", "train", "sampler", "corr", "corrections", "requires"}
        if extra or "name" not in s or "rollout_precision" not in s:
            raise ValueError(f"{path}: [[stress]] #{i + 1} needs name and rollout_precision; unknown keys "
                             f"{sorted(extra)}.")
        stresses.append(Stress(s["name"], s["rollout_precision"], dict(s.get("train", {})),
                               dict(s.get("sampler", {})), dict(s.get("corr", {})),
                               tuple(s.get("corrections", CORRECTIONS)), tuple(s.get("requires", ()))))
    if len({s.name for s in stresses}) != len(stresses):
        raise ValueError(f"{path}: two [[stress]] tables share a name.")
    alpha = float(head.get("alpha", 0.05))
    margin = float(head.get("equivalence_margin", 0.05))
    if not 0 < alpha < 1 or margin <= 0:
        raise ValueError(f"{path}: [plan] alpha must be in (0, 1) and equivalence_margin > 0.")
    coll = doc.get("collapse", {})
    calib = dict(doc.get("calibration", {}))
    if calib and calib.get("stress") not in {s.name for s in stresses}:
        raise ValueError(f"{path}: [calibration] stress={calib.get('stress')!r} is not a [[stress]] name.")
    explicit, tests = _explicit_design(path, doc)
    fast = dict(doc.get("evaluation", {}).get("fast_sampler", {}))
    if "heldout_acc_fast_t1" in (primary, *secondary) and not fast:
        raise ValueError(f"{path}: heldout_acc_fast_t1 needs [evaluation] fast_sampler = {{ cache = ..., ... }}.")
    accept = dict(doc.get("sft_acceptance", {}))
    if accept and accept.get("key") not in ("heldout_acc_t1", "heldout_acc_greedy", "heldout_acc_fast_t1"):
        raise ValueError(f"{path}: [sft_acceptance] key must be an SFT score (heldout_acc_t1, heldout_acc_greedy, "
                         f"heldout_acc_fast_t1), got {accept.get('key')!r}.")
    baseline = head.get("baseline", "bf16")
    if explicit and baseline not in {a.name for a in explicit}:
        raise ValueError(f"{path}: [plan] baseline={baseline!r} is not an [[arm]] name.")
    return Plan(head.get("name", path.stem), str(path), hashlib.sha256(data).hexdigest(), doc, cfg, tuple(stresses),
                primary, float(prim.get("temperature", 1.0)), secondary, alpha, margin,
                int(coll.get("window", 10)), float(coll.get("drop", 0.2)), calib, explicit, tests, baseline, fast,
                accept)


def _explicit_design(path: Path, doc: dict) -> tuple[tuple, tuple]:
    """[[arm]] and [[comparison]] tables, checked: unique arm names, comparisons between listed arms."""
    arms_, tests = [], []
    for i, a in enumerate(doc.get("arm", [])):
        extra = set(a) - {"name", "rollout_precision", "correction", "train", "sampler", "corr"}
        if extra or "name" not in a or "rollout_precision" not in a:
            raise ValueError(f"{path}: [[arm]] #{i + 1} needs name and rollout_precision; unknown keys "
                             f"{sorted(extra)}.")
        arms_.append(study.Arm(a["name"], a["rollout_precision"], a.get("correction", "none"), dict(a.get("train", {})),
                               dict(a.get("corr", {})), dict(a.get("sampler", {}))))
    names = [a.name for a in arms_]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: two [[arm]] tables share a name.")
    for c in doc.get("comparison", []):
        if set(c) != {"name", "a", "b", "test"} or c["test"] not in ("paired_t", "tost") or not {c["a"], c["b"]} <= \
                set(names):
            raise ValueError(f"{path}: a [[comparison]] needs exactly name, a, b (two [[arm]] names) and test "
                             f"(paired_t or tost); got {c}.")
        tests.append(dict(c))
    if tests and not arms_:
        raise ValueError(f"{path}: [[comparison]] tables need [[arm]] tables.")
    return tuple(arms_), tuple(tests)


def arms(plan: Plan, include_missing: bool = False) -> list[study.Arm]:
    """The [[arm]] tables, or bf16 plus every (available) stress regime × its corrections, in plan order."""
    if plan.explicit_arms:
        return list(plan.explicit_arms)
    out = [study.Arm("bf16", "bf16", "none")]
    for s in plan.stresses:
        if missing_requirements(s) and not include_missing:
            continue
        for c in s.corrections:
            out.append(study.Arm(f"{s.name}-{c}", s.rollout_precision, c, dict(s.train), dict(s.corr),
                                 dict(s.sampler)))
    return out


def comparisons(plan: Plan) -> list[dict]:
    """The pre-registered Holm family: the [[comparison]] tables, or harm / benefit / equivalence per available
    stress regime."""
    if plan.explicit_comparisons:
        return [dict(c) for c in plan.explicit_comparisons]
    out = []
    for s in plan.stresses:
        if missing_requirements(s):
            continue
        out += [{"name": f"harm:{s.name}", "a": f"{s.name}-none", "b": "bf16", "test": "paired_t"},
                {"name": f"benefit:{s.name}", "a": f"{s.name}-ais", "b": f"{s.name}-none", "test": "paired_t"},
                {"name": f"equivalence:{s.name}", "a": f"{s.name}-ais", "b": "bf16", "test": "tost"}]
    return out


# ---------------------------------------------------------------------------------------------------- outcomes
def collapsed(rewards: Sequence[float], window: int, drop: float) -> bool:
    """Collapse indicator: the final-quarter mean reward is below the peak `window`-step moving average by > drop."""
    vals = [float(v) for v in rewards if math.isfinite(float(v))]
    if len(vals) < window:
        return False
    peak = max(sum(vals[i:i + window]) / window for i in range(len(vals) - window + 1))
    return peak - study.quarter_means(vals)[1] > drop


def lambda_lead_lag(trajectory: dict[str, list[float]], max_lag: int = 10) -> dict:
    """Does λ move before or after the reward? Cross-correlation of the step-to-step changes of λ and of the reward;
    the lag of the most negative correlation (λ up, reward down): > 0 means λ leads the reward drop."""
    lam = trajectory.get(M.AIS_LAMBDA, [])
    rew = trajectory.get(M.REWARD_MEAN, [])
    if len(lam) < 4 or len(rew) < 4:
        return {"peak_lag": None, "corr": math.nan, "xcorr": {}}
    xc = lagged_xcorr(differences(lam), differences(rew), max_lag)
    k, c = peak_lag(xc, sign=-1)
    return {"peak_lag": k, "corr": c, "xcorr": {str(k_): v for k_, v in xc.items()}}


def validation_rows(preset, seed: int, limit: int) -> list[dict]:
    """A validation split: `limit` train-split problems drawn with another seed, minus the run's training rows."""
    from dllm_ais.train.job import task_rows_and_reward

    task, train_rows, _ = task_rows_and_reward(preset)
    seen = {r["prompt"] for r in train_rows}
    from dllm_ais.train.job import task_config_kwargs

    extra = task.load("train", seed=seed + 100_003, limit=limit * 2,
                      **task_config_kwargs(task.load, preset.train.task_config))
    return [r for r in extra if r["prompt"] not in seen][:limit]


def _evaluate(model, tokenizer, preset, plan: Plan, temperature: float, split: str = "test",
              data_path: str | None = None, sampler: dict | None = None) -> dict:
    """Held-out scores with the preset's evaluation sampler, or with `sampler` overrides of it (the fast sampler)."""
    import torch

    from dllm_ais.analysis.evaluate import eval_sampler, evaluate

    config = replace(eval_sampler(preset), **(sampler or {}))
    with torch.no_grad():
        return evaluate(model, tokenizer, preset.train.task, config, split=split, data_path=data_path,
                        limit=plan.config.eval_limit, batch_size=plan.config.eval_batch_size, seed=0,
                        task_config=preset.train.task_config, family=preset.model.family, temperature=temperature)


def sft_scores(plan: Plan, work: Path, seed: int) -> dict:
    """Held-out accuracy of the seed's SFT model (T = primary temperature and greedy), cached next to it."""
    path = study.sft_dir(work, seed) / "sft_scores.json"
    if path.is_file():
        return json.loads(path.read_text())
    from dllm_ais.families import get_family as family

    cache = study.warm_start(plan.config, work, seed)
    preset = study.study_preset(plan.config, seed)
    import torch

    from dllm_ais.models.load import load_tokenizer

    model = family(preset.model.family).load_dir(cache, dtype=getattr(torch, preset.model.dtype), device="cpu")
    tok = load_tokenizer(cache, model.config)  # the model's config: no "model of type llada" warning
    tok.padding_side = "left"
    t1 = _evaluate(model, tok, preset, plan, plan.primary_temperature)
    greedy = _evaluate(model, tok, preset, plan, 0.0)
    scores = {"heldout_acc_t1": t1["full_reward_frac"], "heldout_acc_greedy": greedy["full_reward_frac"],
              "heldout_n": t1["n"]}
    if plan.fast_sampler:
        fast = _evaluate(model, tok, preset, plan, plan.primary_temperature, sampler=plan.fast_sampler)
        scores["heldout_acc_fast_t1"] = fast["full_reward_frac"]
    atomic_write_text(path, json.dumps(scores))
    return scores


def accepted_seed(plan: Plan, work: Path, seed: int, log=print) -> tuple[int, list[dict]]:
    """The seed whose runs stand for `seed`: itself, or with [sft_acceptance] the first of seed + k·redraw_offset
    (k = 0, 1, ...) whose SFT model scores >= min. Returns (seed, the rejected draws with their scores)."""
    rule = plan.sft_acceptance
    if not rule:
        return seed, []
    rejected = []
    for k in range(int(rule.get("max_redraws", 5)) + 1):
        candidate = seed + k * int(rule.get("redraw_offset", 1000))
        score = sft_scores(plan, work, candidate)[rule["key"]]
        if score >= float(rule["min"]):
            return candidate, rejected
        rejected.append({"seed": candidate, rule["key"]: score})
        log(f"seed {candidate}: SFT {rule['key']} {score:.3f} < {rule['min']}: re-drawn")
    raise RuntimeError(f"seed {seed}: no SFT warm-up met [sft_acceptance] in {len(rejected)} draws ({rejected}).")


def accepted_seeds(plan: Plan, work: Path, seeds: Sequence[int], log=print, workers: int = 1
                   ) -> tuple[list[int], dict[str, list[dict]]]:
    """accepted_seed for every seed (their SFT warm-ups first, in parallel): (seeds to run, re-draws by seed)."""
    list(_pool_map(_sft_job, [(plan, str(work), s) for s in seeds], workers))
    chosen = [accepted_seed(plan, work, s, log) for s in seeds]
    return [c for c, _ in chosen], {str(s): r for s, (_, r) in zip(seeds, chosen, strict=True) if r}


def run_arm(plan: Plan, work: Path, arm: study.Arm, seed: int, validation_limit: int = 0) -> dict:
    """Train one arm on one seed from the seed's shared SFT; score the final master in BF16 (primary: sampled at the
    plan's temperature; greedy) on the test split, or only on a validation split when asked (calibration runs).
    Writes result.json last; a run without it resumes from its latest checkpoint (the trainer saves one at the end
    and on interruption), or starts again if it has none."""
    import torch

    from dllm_ais.train.job import run_training

    run = study.run_dir(work, arm, seed)
    done = run / study.RESULT
    if done.is_file():
        return json.loads(done.read_text())
    preset = study.study_preset(plan.config, seed, arm)
    t0 = time.perf_counter()
    if any((run / "checkpoints").glob("step-*")):  # interrupted after a checkpoint (e.g. during evaluation): resume
        trainer = run_training(preset, run, resume=True, progress=False)
    else:
        if run.exists():
            shutil.rmtree(run)  # interrupted before any checkpoint: start again
        cache = study.warm_start(plan.config, work, seed)
        if cache is not None:
            shutil.copytree(cache, run / study.SFT_CACHE)
        trainer = run_training(preset, run, progress=False)
    wall = time.perf_counter() - t0  # of this invocation (a resumed run: the remaining steps and the evaluation)
    eval_preset = study.study_preset(plan.config, seed)  # the preset's own sampler: BF16 master, no fast decoding
    master, tok = trainer.master, trainer.policy.tokenizer
    fast = {"full_reward_frac": None}
    if validation_limit:  # a calibration run: the test split is not scored at all
        t1 = greedy = {"full_reward_frac": None, "n": 0}
    else:
        t1 = _evaluate(master, tok, eval_preset, plan, plan.primary_temperature)
        greedy = _evaluate(master, tok, eval_preset, plan, 0.0)
        if plan.fast_sampler:
            fast = _evaluate(master, tok, eval_preset, plan, plan.primary_temperature, sampler=plan.fast_sampler)
    rows = sorted(M.read_metrics(run), key=lambda r: r[M.STEP])
    traj = {k: [study._num(r.get(k)) for r in rows] for k in (*study.TRAJECTORY_KEYS, M.ROLLOUT_LOGP_MU, M.CORR_ESS)}
    first, final = study.quarter_means(traj[M.REWARD_MEAN])
    tail = max(1, len(rows) // 10)
    result = {
        "arm": arm.name, "seed": seed, "rollout_precision": arm.rollout_precision, "correction": arm.correction,
        "steps": len(rows), "first_reward": first, "final_reward": final,
        "heldout_acc_t1": t1["full_reward_frac"], "heldout_acc_greedy": greedy["full_reward_frac"],
        "heldout_acc_fast_t1": fast["full_reward_frac"], "heldout_n": t1["n"],
        "collapse": float(collapsed(traj[M.REWARD_MEAN], plan.collapse_window, plan.collapse_drop)),
        "ess_final": study._mean(traj[M.AIS_ESS][-tail:]), "corr_ess_final": study._mean(traj[M.CORR_ESS][-tail:]),
        "logp_mu_first": study._mean(traj[M.ROLLOUT_LOGP_MU][:tail]),
        "logp_mu_final": study._mean(traj[M.ROLLOUT_LOGP_MU][-tail:]),
        "lambda_mean": study._mean(traj[M.AIS_LAMBDA]), "lambda_std": study._std(traj[M.AIS_LAMBDA]),
        "lambda_lead_lag": lambda_lead_lag(traj), "wall_s": wall, "trajectory": traj,
    }
    if validation_limit:
        val = validation_rows(preset, seed, validation_limit)
        path = run / "validation.jsonl"
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in val))
        with torch.no_grad():
            result["validation_acc_t1"] = _evaluate(master, tok, eval_preset, replace(
                plan, config=replace(plan.config, eval_limit=None)), plan.primary_temperature, split="train",
                data_path=str(path))["full_reward_frac"]
    atomic_write_text(done, json.dumps(result))
    return result


def _sft_job(args: tuple) -> dict:
    plan, work, seed = args
    import torch

    torch.set_num_threads(1)
    return sft_scores(plan, Path(work), seed)


def _warm_job(args: tuple) -> None:
    plan, work, seed = args
    import torch

    torch.set_num_threads(1)
    study.warm_start(plan.config, Path(work), seed)


def _arm_job(args: tuple) -> dict:
    plan, work, arm, seed, validation_limit = args
    import torch

    torch.set_num_threads(1)
    return run_arm(plan, Path(work), arm, seed, validation_limit=validation_limit)


def _pool_map(fn, jobs: list, workers: int):
    """fn over jobs in order: in this process (workers <= 1) or `workers` forked processes, one torch thread each."""
    if workers <= 1:
        yield from map(fn, jobs)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as pool:
        yield from pool.map(fn, jobs)


def run_plan(plan: Plan, work: Path, arm_names: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
             log=print, workers: int = 1) -> list[dict]:
    """Every (arm, seed) of the plan, seed by seed (every seed's SFT first); finished runs are reused (resume = run the
    same command). workers > 1 runs that many at a time in forked processes, one torch thread each; the runs are
    the same as serial ones (each is seeded by its own seed, never by the order it ran in)."""
    work.mkdir(parents=True, exist_ok=True)
    selected = [a for a in arms(plan) if arm_names is None or a.name in arm_names]
    seeds, _ = accepted_seeds(plan, work, list(seeds or plan.config.seeds), log, workers)
    jobs = [(plan, str(work), arm, seed, 0) for seed in seeds for arm in selected]
    results = []
    for r in _pool_map(_arm_job, jobs, workers):
        results.append(r)
        log(f"{r['arm']:>12} seed {r['seed']}: reward {r['first_reward']:.3f} -> {r['final_reward']:.3f}, held-out "
            f"T={plan.primary_temperature:g} {r['heldout_acc_t1']:.3f}, greedy {r['heldout_acc_greedy']:.3f}, "
            f"ESS final {r['ess_final']:.3f}, log μ(y) {r['logp_mu_first']:.2f} -> {r['logp_mu_final']:.2f}, "
            f"{r['wall_s']:.0f} s")
    return results


def calibration_arms(plan: Plan) -> list[study.Arm]:
    """The τ scan's arms: `<stress>-ais-tau<τ>` for every τ of [calibration]."""
    c = plan.calibration
    s = next(x for x in plan.stresses if x.name == c["stress"])
    return [study.Arm(f"{s.name}-ais-tau{tau:g}", s.rollout_precision, "ais", dict(s.train),
                      {**s.corr, "ais_tau": float(tau)}, dict(s.sampler)) for tau in c["taus"]]


def run_calibration(plan: Plan, work: Path, log=print, workers: int = 1) -> dict:
    """τ scan on the validation split: every τ of [calibration] on its seeds; τ* = the highest mean validation
    accuracy (primary temperature). Returns per τ the mean validation accuracy and τ*; test accuracy is not used."""
    if not plan.calibration:
        raise ValueError(f"{plan.path}: no [calibration] table; add stress, taus, seeds, validation_limit.")
    c = plan.calibration
    seeds = list(c.get("seeds", plan.config.seeds[:2]))
    limit = int(c.get("validation_limit", 500))
    list(_pool_map(_warm_job, [(plan, str(work), s) for s in seeds], workers))  # SFT only: the test split is not scored
    jobs = [(plan, str(work), arm, seed, limit) for arm in calibration_arms(plan) for seed in seeds]
    accs: dict[float, list[float]] = {}
    for r in _pool_map(_arm_job, jobs, workers):
        tau = next(a.corr["ais_tau"] for a in calibration_arms(plan) if a.name == r["arm"])
        accs.setdefault(tau, []).append(r["validation_acc_t1"])
        log(f"{r['arm']} seed {r['seed']}: validation {r['validation_acc_t1']:.3f}")
    out = {tau: study._mean(v) for tau, v in accs.items()}
    best = max(out, key=lambda t: out[t])
    return {"validation_acc_by_tau": {str(k): v for k, v in out.items()}, "tau_star": best}


# ------------------------------------------------------------------------------------------------------ report
def summarize_plan(plan: Plan, results: Sequence[dict], sft: dict[int, dict], redraws: dict | None = None) -> dict:
    """summary.json's study fields: plan, primary_metric, per-arm outcomes with ess_final, bf16_gain, holm,
    min_detectable_effect and the λ lead/lag of collapsed runs."""
    by: dict[str, dict[int, dict]] = {}
    for r in results:
        by.setdefault(r["arm"], {})[r["seed"]] = r
    key = plan.primary
    arms_out = {}
    for name, runs in by.items():
        entry = {"seeds": sorted(runs)}
        for k in dict.fromkeys((key, *plan.secondary, "heldout_acc_greedy", "ess_final", "corr_ess_final",
                                "logp_mu_first", "logp_mu_final")):
            m, ci = study.mean_ci95([r.get(k, math.nan) for r in runs.values()])
            entry[k] = {"mean": m, "ci95": ci}
        arms_out[name] = entry
    ess_final = {n: e["ess_final"]["mean"] for n, e in arms_out.items()}
    base = plan.baseline
    # a held-out metric: the baseline arm's score minus the SFT model's; a training-curve metric (final_reward,
    # the last quarter's rollout reward) has no SFT score: its run's first quarter (rollouts of the SFT model and
    # its first updates) stands in
    reference = "sft" if any(key in v for v in sft.values()) else "first_reward"
    if reference == "sft":
        gain_diffs = [r[key] - sft[s][key] for s, r in sorted(by.get(base, {}).items()) if key in sft.get(s, {})]
    else:
        gain_diffs = [r[key] - r["first_reward"] for _, r in sorted(by.get(base, {}).items()) if "first_reward" in r]
    bf16_gain = {**paired_t(gain_diffs, alternative="greater"), "reference": reference}
    tests, pvals = {}, {}
    for c in comparisons(plan):
        a, b = by.get(c["a"], {}), by.get(c["b"], {})
        seeds = sorted(set(a) & set(b))
        diffs = [a[s][key] - b[s][key] for s in seeds]
        res = tost(diffs, plan.equivalence_margin) if c["test"] == "tost" else paired_t(diffs)
        if c["test"] == "tost":  # the 1 − 2α interval: equivalence iff it lies inside ±margin
            res["ci_1m2alpha"] = _ci(diffs, 1 - 2 * plan.alpha) if len(diffs) >= 2 else [math.nan, math.nan]
        tests[c["name"]] = {**c, **res, "seeds": seeds}
        pvals[c["name"]] = res["p"]
    adjusted = holm(pvals, plan.alpha)
    for name, adj in adjusted.items():
        tests[name].update(p_holm=adj["p_holm"], rejected=adj["rejected"])
    m = len(pvals)
    mde = {}
    for name, t in tests.items():
        mde[name] = min_detectable_effect(t["sd"], t["n"], plan.alpha, tests=max(m, 1))
    lead_lag = [{"arm": r["arm"], "seed": r["seed"], **{k: v for k, v in r["lambda_lead_lag"].items() if k != "xcorr"}}
                for r in results if r.get("collapse") and r.get("lambda_lead_lag")]
    return {
        "plan": {"name": plan.name, "path": plan.path, "sha256": plan.sha256, "document": plan.raw},
        "primary_metric": {"key": key, "temperature": plan.primary_temperature,
                           "description": plan.raw.get("primary_metric", {}).get("description", "")},
        "arms": arms_out, "ess_final": ess_final, "bf16_gain": bf16_gain, "holm": tests,
        "min_detectable_effect": {"alpha": plan.alpha, "power": 0.8, "family_size": m, "by_comparison": mde},
        "lambda_lead_lag_collapsed_runs": lead_lag,
        "sft": {str(s): v for s, v in sft.items()},
        "not_run": [s.name for s in plan.stresses if missing_requirements(s)],
        "baseline": base, "sft_redraws": redraws or {},
    }


def _ci(diffs: Sequence[float], level: float) -> list[float]:
    """Two-sided `level` t-interval of the mean (TOST's 1 − 2α interval with level = 1 − 2α)."""
    from dllm_ais.analysis.study_stats import t_quantile

    r = paired_t(diffs)
    half = t_quantile(0.5 + level / 2, r["n"] - 1) * r["sd"] / math.sqrt(r["n"])
    return [r["mean"] - half, r["mean"] + half]


def report_table(summary: dict) -> str:
    """Markdown: per arm the primary metric (mean [95 % CI]), secondary metrics, final ESS and log μ(y) first → final;
    then the Holm family."""
    key = summary["primary_metric"]["key"]
    lines = ["| arm | seeds | " + key + " | greedy | final-quarter reward | collapse | ESS final | log μ(y) first → "
             "final |", "|---|---|---|---|---|---|---|---|"]
    f = study._fmt
    for name, e in summary["arms"].items():
        get = lambda k, e=e: e.get(k, {"mean": math.nan, "ci95": [math.nan, math.nan]})  # noqa: E731
        lines.append(f"| {name} | {len(e['seeds'])} | {study._ci(get(key)['mean'], get(key)['ci95'])} | "
                     f"{f(get('heldout_acc_greedy')['mean'])} | {f(get('final_reward')['mean'])} | "
                     f"{f(get('collapse')['mean'], 2)} | {f(get('ess_final')['mean'])} | "
                     f"{f(get('logp_mu_first')['mean'], 2)} → {f(get('logp_mu_final')['mean'], 2)} |")
    lines += ["", "| comparison | a − b | mean | p | p (Holm) | rejected |", "|---|---|---|---|---|---|"]
    for name, t in summary["holm"].items():
        lines.append(f"| {name} | {t['a']} − {t['b']} | {f(t['mean'])} | {f(t['p'], 4)} | {f(t['p_holm'], 4)} | "
                     f"{t['rejected']} |")
    g = summary["bf16_gain"]
    against = ("its run's first-quarter reward (the SFT model's rollouts and first updates)"
               if g.get("reference") == "first_reward" else "the SFT model")
    lines += ["", f"Gain of {summary.get('baseline', 'bf16')} over {against} ({key}): {f(g['mean'])} "
              f"[{f(g['ci95'][0])}, {f(g['ci95'][1])}], "
              f"n = {g['n']}"]
    return "\n".join(lines)
