"""The pre-registered study (study_plan, study_stats): plan parser, hand-worked statistics, lag helper, report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dllm_ais import metrics as M
from dllm_ais.analysis import study, study_plan
from dllm_ais.analysis.study_stats import (
    holm,
    lagged_xcorr,
    min_detectable_effect,
    paired_t,
    peak_lag,
    t_quantile,
    t_sf,
    tost,
)

REPO = Path(__file__).resolve().parents[1]

PLAN = """
[plan]
name = "t"
preset = "study-cpu"
seeds = [0, 1, 2]
alpha = 0.05
equivalence_margin = 0.05
[plan.settings]
steps = 3
eval_limit = 8

[primary_metric]
key = "heldout_acc_t1"
temperature = 1.0

[secondary]
keys = ["heldout_acc_greedy", "final_reward", "collapse"]

[collapse]
window = 4
drop = 0.2

[[stress]]
name = "mxfp4"
rollout_precision = "fp4"
train = { fp4_format = "mxfp4" }

[[stress]]
name = "fast"
rollout_precision = "fp8"
sampler = { threshold = 0.9 }
train = { mismatch_estimator = "trajectory" }  # the ELBO ratio cannot see threshold decoding (refused)
requires = ["dllm_ais.no_such_module:thing"]
"""


def _plan(tmp_path, text=PLAN):
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return study_plan.load_plan(path)


# ----------------------------------------------------------------------------------------------- plan parser
def test_plan_parser_arms_and_the_holm_family(tmp_path):
    plan = _plan(tmp_path)
    assert plan.config.preset == "study-cpu" and plan.config.seeds == (0, 1, 2) and plan.config.steps == 3
    assert plan.config.learning_rate is None  # unset = the preset's
    assert [a.name for a in study_plan.arms(plan)] == ["bf16", "mxfp4-none", "mxfp4-tis", "mxfp4-ais"]
    assert study_plan.arms(plan)[1].train == {"fp4_format": "mxfp4"}
    everything = [a.name for a in study_plan.arms(plan, include_missing=True)]
    assert everything[-3:] == ["fast-none", "fast-tis", "fast-ais"] and everything[-1:][0] == "fast-ais"
    assert study_plan.missing_requirements(plan.stresses[1]) == ["dllm_ais.no_such_module:thing"]
    names = [(c["name"], c["a"], c["b"], c["test"]) for c in study_plan.comparisons(plan)]
    assert names == [("harm:mxfp4", "mxfp4-none", "bf16", "paired_t"),
                     ("benefit:mxfp4", "mxfp4-ais", "mxfp4-none", "paired_t"),
                     ("equivalence:mxfp4", "mxfp4-ais", "bf16", "tost")]  # the conditional regime is not in it
    preset = study.study_preset(plan.config, 1, study_plan.arms(plan, include_missing=True)[-1])
    assert preset.sampler.threshold == 0.9 and preset.train.seed == 1 and preset.train.rollout_precision == "fp8"


@pytest.mark.parametrize(("edit", "match"), [
    (lambda t: t.replace('key = "heldout_acc_t1"', 'key = "bogus"'), "metric 'bogus' unknown"),
    (lambda t: t.replace("steps = 3", "stepz = 3"), r"unknown field\(s\) \['stepz'\]"),
    (lambda t: t.replace('preset = "study-cpu"', 'preset = "nope"'), "unknown preset"),
    (lambda t: t.replace("seeds = [0, 1, 2]", "seeds = [0]"), "at least 2 seeds"),
    (lambda t: t.replace('name = "fast"', 'name = "mxfp4"'), "share a name"),
    (lambda t: t.replace("equivalence_margin = 0.05", "equivalence_margin = 0"), "equivalence_margin"),
])
def test_plan_errors_name_what_to_change(tmp_path, edit, match):
    with pytest.raises(ValueError, match=match):
        _plan(tmp_path, edit(PLAN))


@pytest.mark.parametrize("path", sorted((REPO / "study").glob("*.toml")), ids=lambda p: p.name)
def test_every_committed_plan_builds_its_arms_on_a_known_preset(path):
    """Pilot plans too: their results in benchmarks/study/ name them, so they must stay runnable as committed."""
    from dllm_ais.analysis import study

    plan = study_plan.load_plan(path)  # an unknown preset raises here
    arms = study_plan.arms(plan)
    assert len({a.name for a in arms}) == len(arms) and plan.baseline in {a.name for a in arms}
    for arm in arms:  # every arm's configs validate (unknown fields or values raise here)
        preset = study.study_preset(plan.config, plan.config.seeds[0], arm)
        assert preset.train.rollout_precision == arm.rollout_precision
    # the held-out scoring can draw its rows: a limit above a procedural split's size raises here, not after SFT
    # (study/estimators-rl-arith.toml asked for 500 of arith's 11 test items and died at its first evaluation)
    from dllm_ais.analysis.evaluate import _load_rows
    from dllm_ais.tasks.registry import get_task

    for split in ("test", "train"):
        rows = _load_rows(get_task(preset.train.task), split, preset.train.data_path, plan.config.eval_limit, 0,
                          preset.train.task_config)
        assert plan.config.eval_limit is None or len(rows) == plan.config.eval_limit


def test_the_committed_plan_parses_and_preregisters_the_issue_comparisons():
    plan = study_plan.load_plan(REPO / "study" / "plan.toml")
    assert len(plan.config.seeds) >= 5 and plan.primary == "heldout_acc_t1" and plan.primary_temperature == 1.0
    assert {"heldout_acc_greedy", "final_reward", "collapse"} <= set(plan.secondary)
    names = {c["name"].split(":")[0] for c in study_plan.comparisons(plan)}
    assert names == {"harm", "benefit", "equivalence"}
    assert {s.name for s in plan.stresses} == {"mxfp4-fast", "fp8-fast"}
    assert all(s.sampler == {"cache": "dual", "threshold": 0.9} for s in plan.stresses)
    assert all(s.train["mismatch_estimator"] == "trajectory" for s in plan.stresses)
    assert [a.name for a in study_plan.arms(plan)][0] == "bf16" and len(study_plan.arms(plan)) == 7
    assert {c["name"] for c in study_plan.comparisons(plan)} == {
        f"{kind}:{s}" for kind in ("harm", "benefit", "equivalence") for s in ("mxfp4-fast", "fp8-fast")}
    from dllm_ais.presets import get_preset

    assert get_preset(plan.config.preset).train.sft_steps > 0


EXPLICIT = """
[plan]
name = "x"
preset = "study-cpu"
seeds = [0, 1]
baseline = "exact"
[plan.settings]
steps = 3
eval_limit = 8

[primary_metric]
key = "heldout_acc_fast_t1"

[evaluation]
fast_sampler = { cache = "dual", threshold = 0.9 }

[secondary]
keys = ["heldout_acc_t1"]

[sft_acceptance]
key = "heldout_acc_greedy"
min = 0.5
redraw_offset = 1000
max_redraws = 2

[[arm]]
name = "exact"
rollout_precision = "bf16"

[[arm]]
name = "fast-trajectory"
rollout_precision = "bf16"
sampler = { cache = "dual", threshold = 0.9 }
train = { mismatch_estimator = "trajectory", policy_logprob = "trajectory", trajectory_steps = 2 }

[[comparison]]
name = "objective"
a = "fast-trajectory"
b = "exact"
test = "paired_t"
"""


def test_explicit_arms_comparisons_fast_evaluation_and_sft_acceptance(tmp_path, monkeypatch):
    plan = _plan(tmp_path, EXPLICIT)
    assert [a.name for a in study_plan.arms(plan)] == ["exact", "fast-trajectory"]
    assert study_plan.comparisons(plan) == [{"name": "objective", "a": "fast-trajectory", "b": "exact",
                                             "test": "paired_t"}]
    preset = study.study_preset(plan.config, 0, study_plan.arms(plan)[1])
    assert (preset.train.policy_logprob, preset.train.trajectory_steps, preset.sampler.cache) == ("trajectory", 2,
                                                                                                   "dual")
    assert plan.fast_sampler == {"cache": "dual", "threshold": 0.9} and plan.primary == "heldout_acc_fast_t1"
    scores = {0: 0.7, 1: 0.1, 1001: 0.2, 2001: 0.6, 2: 0.0, 1002: 0.0, 2002: 0.0}  # SFT greedy accuracy by seed
    monkeypatch.setattr(study_plan, "sft_scores", lambda plan, work, seed: {"heldout_acc_greedy": scores[seed]})
    assert study_plan.accepted_seed(plan, tmp_path, 0, log=lambda _: None) == (0, [])
    seed, rejected = study_plan.accepted_seed(plan, tmp_path, 1, log=lambda _: None)
    assert seed == 2001 and [r["seed"] for r in rejected] == [1, 1001]
    with pytest.raises(RuntimeError, match="no SFT warm-up met"):
        study_plan.accepted_seed(plan, tmp_path, 2, log=lambda _: None)
    for edit, match in ((lambda t: t.replace('b = "exact"', 'b = "nope"'), r"\[\[comparison\]\]"),
                        (lambda t: t.replace('baseline = "exact"', 'baseline = "nope"'), "baseline"),
                        (lambda t: t.replace("[evaluation]", "[evaluationz]"), "fast_sampler")):
        with pytest.raises(ValueError, match=match):
            _plan(tmp_path, edit(EXPLICIT))


@pytest.mark.slow
def test_explicit_plan_runs_end_to_end_with_the_fast_metric(tmp_path):
    """--plan --smoke on an explicit design: both arms trained per seed and scored with the fast sampler too; the
    baseline's gain and the registered comparison in the summary; the SFT bar (min 0.5, unreachable in 3 SFT steps)
    is relaxed here to 0 so that the smoke run keeps its seeds."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("study_corrections", REPO / "scripts" / "study_corrections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "plan.toml"
    path.write_text(EXPLICIT.replace("min = 0.5", "min = 0.0"))
    assert mod.main(["--plan", str(path), "--smoke", "--allow-dirty", "--out", str(tmp_path / "o"), "--work",
                     str(tmp_path / "w")]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    runs = [json.loads(line) for line in (tmp_path / "o" / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 4 and all(0.0 <= r["heldout_acc_fast_t1"] <= 1.0 for r in runs)
    assert set(summary["holm"]) == {"objective"} and summary["holm"]["objective"]["n"] == 2
    assert summary["baseline"] == "exact" and summary["bf16_gain"]["n"] == 2 and summary["sft_redraws"] == {}
    sft = json.loads((tmp_path / "w" / "sft-seed0" / "sft_scores.json").read_text())
    assert "heldout_acc_fast_t1" in sft


# ------------------------------------------------------------------------------------------------ statistics
def test_t_distribution_against_tables():
    assert 2 * t_sf(2.776445, 4) == pytest.approx(0.05, abs=1e-6)  # t_{0.975, 4}
    assert 2 * t_sf(12.706205, 1) == pytest.approx(0.05, abs=1e-6)
    assert t_sf(1.533206, 4) == pytest.approx(0.10, abs=1e-6)  # t_{0.90, 4}
    assert t_sf(0.0, 7) == 0.5 and t_sf(-1.0, 3) == pytest.approx(1 - t_sf(1.0, 3))
    for df in (1, 4, 10, 30):
        assert t_quantile(0.975, df) == pytest.approx(study.t_quantile_975(df), abs=2e-3)


def test_holm_against_a_hand_worked_example():
    # sorted p: 0.01 (×4 = 0.04), 0.02 (×3 = 0.06), 0.03 (×2 = 0.06, monotone), 0.20 (×1 = 0.20)
    out = holm({"a": 0.03, "b": 0.01, "c": 0.20, "d": 0.02}, alpha=0.05)
    assert {k: round(v["p_holm"], 10) for k, v in out.items()} == {"a": 0.06, "b": 0.04, "c": 0.2, "d": 0.06}
    assert [k for k, v in out.items() if v["rejected"]] == ["b"]
    assert list(out) == ["a", "b", "c", "d"]  # input order kept
    nan = holm({"x": 0.01, "y": math.nan})
    assert nan["x"]["p_holm"] == pytest.approx(0.02) and not nan["y"]["rejected"]  # NaN still counts in m


def test_paired_t_and_tost_hand_worked():
    d = [0.1, 0.2, 0.3, 0.2, 0.2]  # mean 0.2, sd = sqrt(0.02/4) = 0.0707107, se = 0.0316228, t = 6.3246
    r = paired_t(d)
    assert r["mean"] == pytest.approx(0.2) and r["t"] == pytest.approx(6.324555, rel=1e-6)
    assert r["p"] == pytest.approx(2 * t_sf(6.324555, 4), rel=1e-6) and r["p"] < 0.01
    assert r["ci95"] == pytest.approx([0.2 - 2.776445 * 0.0316228, 0.2 + 2.776445 * 0.0316228], rel=1e-5)
    assert paired_t(d, "greater")["p"] == pytest.approx(r["p"] / 2)
    eq = tost([0.01, -0.01, 0.0, 0.02, -0.02], margin=0.05)  # mean 0, se 0.0070711: t = 7.07 each side
    assert eq["p"] == pytest.approx(t_sf(0.05 / ((0.001 / 4) ** 0.5 / 5 ** 0.5), 4), rel=1e-9) and eq["p"] < 0.01
    assert tost(d, margin=0.05)["p"] > 0.5  # mean 0.2 is far outside ±0.05


def test_min_detectable_effect_formula():
    sd, n = 0.1, 5
    expect = (t_quantile(1 - 0.05 / 6, 4) + t_quantile(0.8, 4)) * sd / math.sqrt(n)  # Bonferroni over 3 tests
    assert min_detectable_effect(sd, n, 0.05, 0.8, tests=3) == pytest.approx(expect)
    assert min_detectable_effect(sd, n, tests=1) < min_detectable_effect(sd, n, tests=3)


# ---------------------------------------------------------------------------------------------- lag helper
def test_lagged_xcorr_finds_a_known_lag():
    import random

    rng = random.Random(0)
    x = [rng.gauss(0, 1) for _ in range(200)]
    y = [0.0] * 3 + [-v + 0.1 * rng.gauss(0, 1) for v in x[:-3]]  # y follows −x three steps later: x leads by 3
    xc = lagged_xcorr(x, y, max_lag=6)
    k, c = peak_lag(xc, sign=-1)
    assert k == 3 and c < -0.95
    k_rev, _ = peak_lag(lagged_xcorr(y, x, max_lag=6), sign=-1)
    assert k_rev == -3  # swapping the series flips the sign of the lag
    assert all(abs(v) < 0.3 for lag, v in xc.items() if lag != 3)


def test_lambda_lead_lag_on_a_synthetic_collapse():
    # λ jumps at step 20, the reward drops at step 24: λ leads by 4 steps
    lam = [0.1] * 20 + [0.9] * 20
    rew = [0.8] * 24 + [0.2] * 16
    out = study_plan.lambda_lead_lag({M.AIS_LAMBDA: lam, M.REWARD_MEAN: rew}, max_lag=8)
    assert out["peak_lag"] == 4 and out["corr"] < -0.9


def test_a_training_curve_primary_metric_gains_over_the_runs_first_quarter(tmp_path):
    """final_reward has no SFT score: the baseline's gain is final minus first-quarter reward, paired by seed."""
    plan = _plan(tmp_path, PLAN.replace('key = "heldout_acc_t1"', 'key = "final_reward"'))
    assert plan.primary == "final_reward"
    results = [{**_result("bf16", s, 0.5), "first_reward": 0.3 + 0.01 * s, "final_reward": 0.7 + 0.03 * s}
               for s in range(3)]
    out = study_plan.summarize_plan(plan, results, {s: {"heldout_acc_t1": 0.1} for s in range(3)})
    g = out["bf16_gain"]
    assert g["reference"] == "first_reward" and g["n"] == 3 and g["mean"] == pytest.approx(0.42)
    assert "first-quarter reward" in study_plan.report_table(out)


def test_collapse_indicator():
    assert study_plan.collapsed([0.2, 0.5, 0.8, 0.9, 0.9, 0.9, 0.3, 0.2], window=2, drop=0.2)
    assert not study_plan.collapsed([0.2, 0.5, 0.8, 0.9, 0.9, 0.9, 0.85, 0.8], window=2, drop=0.2)


# ------------------------------------------------------------------------------------------------ report
def _result(arm, seed, acc, ess=0.8):
    traj = {M.REWARD_MEAN: [0.2, 0.5, 0.8, 0.8], M.AIS_LAMBDA: [0.1, 0.2, 0.3, 0.4]}
    return {"arm": arm, "seed": seed, "heldout_acc_t1": acc, "heldout_acc_greedy": acc, "final_reward": 0.8,
            "collapse": 0.0, "ess_final": ess, "corr_ess_final": ess, "logp_mu_first": -5.0, "logp_mu_final": -1.0,
            "lambda_lead_lag": study_plan.lambda_lead_lag(traj), "trajectory": traj}


def test_summary_fields_and_holm_over_the_family(tmp_path):
    plan = _plan(tmp_path)
    results = []
    for s, (b, n, a) in enumerate([(0.50, 0.20, 0.45), (0.55, 0.25, 0.52), (0.60, 0.22, 0.58)]):
        results += [_result("bf16", s, b, 1.0), _result("mxfp4-none", s, n), _result("mxfp4-tis", s, n),
                    _result("mxfp4-ais", s, a)]
    sft = {s: {"heldout_acc_t1": 0.1} for s in range(3)}
    out = study_plan.summarize_plan(plan, results, sft)
    for key in ("plan", "primary_metric", "holm", "ess_final", "bf16_gain", "min_detectable_effect"):
        assert key in out
    assert out["plan"]["sha256"] == plan.sha256 and out["primary_metric"]["key"] == "heldout_acc_t1"
    assert out["ess_final"]["mxfp4-none"] == pytest.approx(0.8) and out["ess_final"]["bf16"] == 1.0
    assert out["bf16_gain"]["mean"] == pytest.approx(0.45) and out["bf16_gain"]["ci95"][0] > 0.3
    assert out["bf16_gain"]["reference"] == "sft"
    assert out["arms"]["bf16"]["heldout_acc_greedy"]["mean"] == pytest.approx(0.55)  # reported, not in secondary
    h = out["holm"]
    assert h["harm:mxfp4"]["mean"] == pytest.approx(-(0.30 + 0.30 + 0.38) / 3)
    raw = {k: v["p"] for k, v in h.items()}
    assert {k: v["p_holm"] for k, v in h.items()} == pytest.approx({k: v["p_holm"] for k, v in holm(raw).items()})
    assert h["harm:mxfp4"]["rejected"] and h["benefit:mxfp4"]["rejected"]
    assert out["not_run"] == ["fast"]
    text = study_plan.report_table(out)
    assert "harm:mxfp4" in text and "mxfp4-ais" in text


def test_plan_command_refuses_uncommitted_changes(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("study_corrections", REPO / "scripts" / "study_corrections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr("dllm_ais.analysis.bench_env.git_commit", lambda repo: ("abc", True))
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    with pytest.raises(SystemExit, match="uncommitted changes"):
        mod.main(["--plan", str(path), "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_plan_runs_end_to_end_and_resumes(tmp_path):
    """--plan --smoke: SFT per seed, every selected arm per seed, summary.json with the study fields; a second
    invocation reuses every finished run (nothing retrained)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("study_corrections", REPO / "scripts" / "study_corrections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    argv = ["--plan", str(path), "--smoke", "--allow-dirty", "--arms", "bf16,mxfp4-none", "--out", str(tmp_path / "o"),
            "--work", str(tmp_path / "w")]
    assert mod.main(argv) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    for key in ("plan", "primary_metric", "holm", "ess_final", "bf16_gain", "min_detectable_effect", "git_sha"):
        assert key in summary
    assert set(summary["arms"]) == {"bf16", "mxfp4-none"} and summary["uncommitted_changes"] in (True, False)
    assert summary["ess_final"]["bf16"] == 1.0  # μ = π_old exactly
    assert summary["holm"]["harm:mxfp4"]["n"] == 2 and summary["arms"]["bf16"]["seeds"] == [0, 1]
    assert all((tmp_path / "o" / f).stat().st_size > 10_000 for f in ("outcomes.png", "trajectories.png"))
    results = sorted((tmp_path / "w").glob("*/seed*/result.json"))
    assert len(results) == 4
    stamps = [p.stat().st_mtime_ns for p in results]
    assert mod.main(argv) == 0  # resume: every run is finished, so nothing is retrained
    assert [p.stat().st_mtime_ns for p in results] == stamps
    lost = results[0]  # interrupted after its final checkpoint (during evaluation): resumed, not retrained
    rows = (lost.parent / "metrics.jsonl").read_text()
    lost.unlink()
    assert mod.main(argv) == 0 and lost.is_file()
    assert (lost.parent / "metrics.jsonl").read_text() == rows


@pytest.mark.slow
def test_plan_workers_give_the_serial_runs(tmp_path):
    """--workers 2 (forked processes) trains and scores exactly what the serial runner does: each run is seeded by
    its seed, not by the order or the process it ran in."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("study_corrections", REPO / "scripts" / "study_corrections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    runs = {}
    for workers in ("1", "2"):
        argv = ["--plan", str(path), "--smoke", "--allow-dirty", "--arms", "bf16,mxfp4-none", "--workers", workers,
                "--out", str(tmp_path / f"o{workers}"), "--work", str(tmp_path / f"w{workers}")]
        assert mod.main(argv) == 0
        runs[workers] = {(r["arm"], r["seed"]): r for r in map(json.loads, (tmp_path / f"o{workers}" / "runs.jsonl")
                                                               .read_text().splitlines())}
    assert set(runs["1"]) == set(runs["2"]) == {(a, s) for a in ("bf16", "mxfp4-none") for s in (0, 1)}
    for key, serial in runs["1"].items():
        for field in ("first_reward", "final_reward", "heldout_acc_t1", "heldout_acc_greedy", "ess_final"):
            assert runs["2"][key][field] == serial[field], (key, field)


def test_figure_columns_pair_each_seed_across_arms():
    """outcomes.png's left panel: the SFT model first, then the arms in summary order, each {seed: primary}."""
    from dllm_ais.analysis.study_figure import arm_columns

    summary = {"primary_metric": {"key": "heldout_acc_t1"}, "arms": {"bf16": {}, "x-none": {}, "x-ais": {}},
               "sft": {"0": {"heldout_acc_t1": 0.1}, "1": {"heldout_acc_t1": 0.2}}}
    runs = [{"arm": a, "seed": s, "heldout_acc_t1": v} for a, s, v in
            [("x-none", 1, 0.5), ("bf16", 0, 0.9), ("bf16", 1, 0.8), ("x-none", 0, 0.4)]]
    names, cols = arm_columns(summary, runs)
    assert names == ["SFT model", "bf16", "x-none"]  # x-ais has no finished run: no column
    assert cols["SFT model"] == {0: 0.1, 1: 0.2} and cols["bf16"] == {0: 0.9, 1: 0.8}
    assert cols["x-none"] == {0: 0.4, 1: 0.5}


@pytest.mark.slow
def test_calibration_scans_tau_on_the_validation_split_only(tmp_path):
    """--calibrate --smoke: every τ × seed of [calibration] is trained and scored on its validation rows (train-split
    problems outside the training rows); τ* is the τ with the highest mean validation accuracy; the seeds' SFT models
    and the trained models are never scored on the test split, and --workers 2 gives the serial scan exactly."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("study_corrections", REPO / "scripts" / "study_corrections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "plan.toml"
    path.write_text(PLAN + '\n[calibration]\nstress = "mxfp4"\ntaus = [0.01, 1.0]\nseeds = [5, 6]\n'
                    'validation_limit = 8\n')
    scans = []
    for workers in ("1", "2"):
        out, work = tmp_path / f"o{workers}", tmp_path / f"w{workers}"
        assert mod.main(["--plan", str(path), "--calibrate", "--smoke", "--allow-dirty", "--workers", workers,
                         "--out", str(out), "--work", str(work)]) == 0
        scan = json.loads((out / "calibration" / "summary.json").read_text())["calibration"]
        by_tau = {float(k): v for k, v in scan["validation_acc_by_tau"].items()}
        assert set(by_tau) == {0.01, 1.0} and scan["tau_star"] == max(by_tau, key=by_tau.get)
        results = [json.loads(p.read_text()) for p in sorted((work / "calibration").glob("*/seed*/result.json"))]
        assert sorted((r["arm"], r["seed"]) for r in results) == [
            (f"mxfp4-ais-tau{t}", s) for t in ("0.01", "1") for s in (5, 6)]
        for t in (0.01, 1.0):  # the scan's mean is the mean of its runs' validation accuracies
            accs = [r["validation_acc_t1"] for r in results if r["arm"] == f"mxfp4-ais-tau{t:g}"]
            assert by_tau[t] == pytest.approx(sum(accs) / len(accs))
        for r in results:
            rows = [json.loads(x) for x in (work / "calibration" / r["arm"] / f"seed{r['seed']}" /
                                             "validation.jsonl").read_text().splitlines()]
            assert len(rows) == 8
        assert not list(work.rglob("sft_scores.json"))
        assert all(r["heldout_acc_t1"] is None and r["heldout_acc_greedy"] is None for r in results)
        scans.append(scan)
    assert scans[0] == scans[1]


def test_validation_rows_are_outside_the_training_rows_and_the_test_split():
    """The τ scan's validation split (corrections-v3's testbed): 500 problems, none trained on, none held out."""
    from dllm_ais.analysis.study import StudyConfig, study_preset
    from dllm_ais.train.job import task_config_kwargs, task_rows_and_reward

    preset = study_preset(StudyConfig(preset="study-cpu-16"), 5)
    val = study_plan.validation_rows(preset, 5, 500)
    task, train_rows, _ = task_rows_and_reward(preset)
    test = task.load("test", **task_config_kwargs(task.load, preset.train.task_config))
    prompts = {r["prompt"] for r in val}
    assert len(val) == len(prompts) == 500
    assert not prompts & {r["prompt"] for r in train_rows} and not prompts & {r["prompt"] for r in test}
    assert len(test) == 1000
