"""Which policy likelihood to train with: exact bias², variance, MSE and cosine of each estimator's GRPO gradient
at equal forward passes per completion (issue 34, item 3).

    python -m dllm_ais.analysis.estimators --out benchmarks/estimators/rung1 [--smoke]

Rung 1 of the evidence ladder (analysis/ladder.py, issue 40), which runs it with `--rungs 1`.

On the enumerable testbed (exact_testbed.py) at θ = θ_old (ratio 1, nothing clipped) the GRPO ascent direction with
likelihood s is ĝ = (1/(N L)) Σ_i Â_i ∇s(x_i, y_i; ξ_i) (SPG: (1/N) Σ Â ∇bound, its own loss). Every estimator's
∇s is a random combination of per-completion feature gradients (estimator_features.py) with coefficient moments
computed exactly (estimator_draws.py), so over completions drawn from the sampler π (exact_sampler.py: LLaDA's
low-confidence rule and the threshold rule) and GRPO's group advantages (closed-form conditional moments, split by
the advantage's sign for SPG) the mean E ĝ, tr Var ĝ at N = 64 completions (8 groups of G = 8) and hence
MSE = ‖E ĝ − g*‖² + tr Var ĝ follow exactly. The target g* is ∇J̃ of the sampler actually used, J̃ = E_π[E(Â | r)/L]
(the reward GRPO's advantages put on each completion, E(Â | r) held fixed): the expected gradient of GRPO with the
exact log-likelihood of that sampler, in the estimators' own scale (∇J itself, with the raw reward, has another scale:
its cosine is reported too). Both come from autograd through the sampler's enumeration (exact_objective.py).
Seeds × checkpoints (random init, SFT'd) give the spread: 95 % t-intervals over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dllm_ais.analysis import estimator_draws as D
from dllm_ais.analysis import exact_testbed as tb
from dllm_ais.analysis.estimator_families import EXACT_FAMILIES, RULES, model_key
from dllm_ais.analysis.estimator_features import Features, feature_gradients
from dllm_ais.analysis.exact_moments import _advantage, _log_multinomial, compositions, level_probs
from dllm_ais.analysis.exact_objective import objective, objective_gradient
from dllm_ais.analysis.exact_sampler import canvas_logits, canvas_table
from dllm_ais.models.shift import logits_view
from dllm_ais.rl.advantages import ADV_EPS

MAKE = {"llada": tb.make_llada, "dream": tb.make_dream, "sdar": tb.make_sdar}
"""The testbed model of each family (the samplers per family: estimator_families.RULES)."""


@dataclass(frozen=True)
class EstimatorsConfig:
    """The analysis's settings (defaults: the committed run)."""

    testbed: tb.TestbedConfig = tb.TestbedConfig(vocab=3, prompt_len=1, gen_length=4, num_prompts=3, d_model=32,
                                                 n_layers=1, n_heads=2, mlp=32)
    """Task and model (its seed is replaced by each of `seeds`)."""
    families: tuple[str, ...] = ("llada", "dream", "sdar")
    """Model families of the testbed (same sizes; Dream with shifted logits and its own sampler; SDAR block-causal in
    blocks of 2 behind a one-token prefix, its own sampler and estimators: analysis/exact_sdar.py)."""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Model seeds (weights, prompts, SFT batches)."""
    checkpoints: tuple[int, ...] = (0, 20)
    """SFT steps of the measured masters (0 = random initialisation)."""
    sft_lr: float = 3e-3
    """SFT learning rate (AdamW, exact_testbed.sft_checkpoints)."""
    budgets: tuple[int, ...] = (1, 2, 4, 8)
    """Forward passes per completion compared."""
    G: int = 8
    """Generations per prompt (group size)."""
    N: int = 64
    """Completions per batch of the variance."""
    threshold: float = 0.5
    """Confidence threshold of the threshold sampler (0.5: at the SFT'd checkpoint 0.9 is never reached on this
    testbed, so the threshold sampler would equal the low-confidence one; at random init they coincide anyway)."""
    spg_draws: int = 4096
    """Monte-Carlo draws for SPG's EUBO at K ≥ 2 (its only non-enumerated part)."""
    spg_replicas: int = 8
    """Equal parts of `spg_draws` whose spread gives the Monte-Carlo standard error."""
    seed: int = 0
    """Seeds SPG's Monte-Carlo draws (fixed: results.json is bit-reproducible)."""

    def __post_init__(self):
        if self.N % self.G:
            raise ValueError(f"EstimatorsConfig: N={self.N} must be a multiple of G={self.G}.")
        if self.spg_draws % self.spg_replicas:
            raise ValueError(f"EstimatorsConfig: spg_draws={self.spg_draws} must be a multiple of spg_replicas.")


def smoke_config() -> EstimatorsConfig:
    """Seconds: vocabulary 2, L = 3, two seeds, few SPG draws; threshold 0.35 so the threshold rule commits in parallel
    on this barely trained model. LLaDA and Dream only (SDAR's blocks of 2 need an even L: tests/test_exact_sdar.py
    runs its rows)."""
    testbed = tb.TestbedConfig(vocab=2, prompt_len=1, gen_length=3, num_prompts=2, d_model=16, n_layers=1,
                               n_heads=2, mlp=16)
    return EstimatorsConfig(testbed=testbed, families=("llada", "dream"), seeds=(0, 1), checkpoints=(0, 5),
                            budgets=(1, 2, 4), spg_draws=256, spg_replicas=4, threshold=0.35)


def impossible_budgets(L: int, budgets: tuple[int, ...]) -> dict[str, str]:
    """Why an estimator has no value at some budgets (README and results.json)."""
    return {"one_step": "d1's estimator scores one prompt mask per step (one row); the package has no draw count",
            "elbo-antithetic": "K must be even (a mask and its complement); K = 1 is impossible",
            "elbo-quadrature": "K must be even (K/2 repeats of the 2 Gauss nodes); K = 1 is impossible",
            "coupled": "3 rows per draw (full, partial, complement): measured at 3, none of "
                       f"{', '.join(map(str, budgets))} is reachable",
            "trajectory": f"one row per sampler step that commits: L = {L} under LLaDA's low-confidence rule (fewer "
                          "expected steps under the threshold rule; Dream's schedule commits nothing at its first "
                          f"step: {L - 1} rows; SDAR's replay: one two-stream forward per local step of a block, 2 "
                          "here); more rows than steps do not exist",
            "trajectory-merge2": f"one row per run of 2 steps: L/2 = {L // 2} under low-confidence (SDAR: one "
                                 "two-stream forward per shrunk local step, 1 here)",
            "mdpo": f"K of the rollout's canvases that commit (at most its steps, ≤ L = {L}): K > L scores every "
                    "canvas, as K = L; rows = min(K, the path's committing steps) (Dream: its first step commits "
                    "nothing)",
            "dtreerpo": f"s segments of the path's T steps (T = L = {L} for the fixed schedules; the threshold rule's "
                        "paths have fewer): s > T cuts as s = T; rows = the segments that commit a token",
            "one_step-block": "SDAR's one-step analogue: one two-stream forward (one row); no draw count",
            "elbo-block": "SDAR's block-wise ELBO: K draws, one two-stream forward (row) each; every K exists"}


def signed_moments(probs: torch.Tensor, values: torch.Tensor, G: int):
    """Advantage moments split by the sign of Â (index 0: Â > 0, 1: Â ≤ 0): m1 [2, n, Lv] = E[Â 1_s | r_1],
    m2 [2, n, Lv] = E[Â² 1_s | r_1], m11 [2, 2, n, Lv, Lv] = E[Â_1 Â_2 1_s(Â_1) 1_s'(Â_2) | r_1, r_2]
    (GRPO's group z-scores, exact_moments' conventions)."""
    n, Lv = probs.shape
    lv = torch.arange(Lv)
    eye = torch.eye(Lv, dtype=torch.long)
    others = compositions(G - 1, Lv)
    w1 = _log_multinomial(others, probs).exp()  # [n, C1]
    adv = _advantage(values, others[None] + eye[:, None], lv[:, None].expand(Lv, others.shape[0]), "group", ADV_EPS)
    signs = torch.stack([adv > 0, adv <= 0]).double()  # [2, Lv, C1]
    m1 = torch.einsum("nc,slc->snl", w1, signs * adv)
    m2 = torch.einsum("nc,slc->snl", w1, signs * adv ** 2)
    rest = compositions(G - 2, Lv)
    w2 = _log_multinomial(rest, probs).exp()  # [n, C2]
    counts = eye[:, None, None] + eye[None, :, None] + rest[None, None]  # [Lv, Lv, C2, Lv]
    a1 = _advantage(values, counts, lv[:, None, None].expand(counts.shape[:3]), "group", ADV_EPS)
    a2 = _advantage(values, counts, lv[None, :, None].expand(counts.shape[:3]), "group", ADV_EPS)
    s1 = torch.stack([a1 > 0, a1 <= 0]).double()
    s2 = torch.stack([a2 > 0, a2 <= 0]).double()
    m11 = torch.einsum("nc,sabc,tabc->stnab", w2, s1 * a1, s2 * a2)
    return m1, m2, m11


@dataclass
class Target:
    """One sampler on one model: its law, the advantage moments under it, and the target gradients."""

    pi: torch.Tensor
    """[n, Y] π(y | x)."""
    level: torch.Tensor
    """[n, Y] reward level of each completion."""
    m1: torch.Tensor
    m2: torch.Tensor
    m11: torch.Tensor
    g_star: torch.Tensor
    """[P] ∇J̃ (module doc)."""
    grad_j: torch.Tensor
    """[P] ∇J (raw reward)."""
    J: float


def closed_forms(mom: D.Moments, feats: Features, tg: Target, L: int, G: int, N: int) -> dict:
    """bias², tr Var at N, MSE, cosines and rows of one estimator (module doc)."""
    grad, gram = feats.family(mom.family)  # [K, Q, P] float32, [K, Q, Q] float64
    n, Y = tg.pi.shape
    K = n * Y
    x_of = torch.arange(K) // Y
    lv = tg.level.reshape(-1)
    pi = tg.pi.reshape(-1)
    m1 = tg.m1[:, x_of, lv]  # [2, K]
    m2 = tg.m2[:, x_of, lv]
    B = N // G
    means, eu2 = [], []
    for node in mom.nodes:
        mean = node.mean.expand(2, K, -1)
        H = torch.einsum("skq,kqp->skp", mean.float(), grad).double()  # [2, K, P]
        mvec = torch.einsum("sk,skp->p", pi * m1 / (n * L), H)
        second = node.second.expand(2, K, -1, -1)
        self_term = float(torch.einsum("sk,skqr,kqr->", pi * m2, second, gram))
        basis = node.basis.expand(2, K, -1, -1)
        phi = torch.einsum("skqr,kqp->skrp", basis.float(), grad).double()  # [2, K, R, P]
        cross = 0.0
        for x in range(n):
            f = phi[:, x * Y:(x + 1) * Y]  # [2, Y, R, P]
            gm = torch.einsum("syrp,tzup->syrtzu", f, f)
            lvx = tg.level[x]
            w = tg.m11[:, :, x][:, :, lvx][:, :, :, lvx] * (tg.pi[x][:, None] * tg.pi[x][None, :])  # [2, 2, Y, Y]
            cross += float(torch.einsum("styz,syrtzu,ru->", w, gm, node.X))
        eu2.append((G * self_term + G * (G - 1) * cross) / (n * (G * L) ** 2))
        means.append(mvec)
    rho = torch.tensor([nd.rho for nd in mom.nodes], dtype=torch.float64)
    M = torch.stack(means)  # [Z, P]
    mbar = rho @ M
    sq = (M * M).sum(-1)  # [Z]
    var = float((rho * (torch.tensor(eu2, dtype=torch.float64) - sq)).sum()) / B + float((rho * sq).sum()
                                                                                         - mbar @ mbar)
    d = mbar - tg.g_star
    bias = float(d @ d)
    rows = float(mom.rows) if not torch.is_tensor(mom.rows) else float((tg.pi.reshape(-1) * mom.rows).sum() / n)
    cos = lambda a, b: float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))  # noqa: E731
    return {"bias_sq": bias, "trace_var": var, "mse": bias + var, "cos_g_star": cos(mbar, tg.g_star),
            "cos_grad_j": cos(mbar, tg.grad_j), "rows": rows, "mean_norm_sq": float(mbar @ mbar)}


def mask_moments(cfg: EstimatorsConfig) -> dict[tuple[str, int], D.Moments]:
    """The model-independent estimators (every mask-draw scheme but SPG) at every budget they allow."""
    tbc = cfg.testbed
    sp = D.Space(tbc.prompt_len, tbc.gen_length)
    out = {("one_step", 1): D.one_step(sp), ("coupled", 3): D.coupled(sp)}
    for K in cfg.budgets:
        out[("elbo-stratified", K)] = D.stratified(sp, K)
        if K % 2 == 0:
            out[("elbo-antithetic", K)] = D.antithetic(sp, K, cfg.G)
            out[("elbo-quadrature", K)] = D.quadrature(sp, K)
    return out


def distribution_of(family: str, rule: str, cfg: EstimatorsConfig):
    """logits [n, C, L, V] of every canvas -> the sampler's π [n, Y] (differentiable)."""
    V, fam = cfg.testbed.vocab, EXACT_FAMILIES[family]
    thr = cfg.threshold if rule in fam.threshold_rules else None
    return lambda logits: fam.distribution(logits, V, rule, cfg.testbed.mask_id, thr)


def target(model, prompts, logits, cfg: EstimatorsConfig, rule: str, family: str = "llada") -> Target:
    """π, advantage moments and ∇J̃, ∇J of `rule` at `model` (logits: every canvas's, through the shifted view for
    Dream)."""
    tbc = cfg.testbed
    V, L = tbc.vocab, tbc.gen_length
    law = distribution_of(family, rule, cfg)
    pi = law(logits)
    rewards = tb.rewards(prompts, tb.all_sequences(V, L), V)
    level = (rewards * L).round().long()
    values = torch.arange(L + 1, dtype=torch.float64) / L
    m1, m2, m11 = signed_moments(level_probs(pi, level, L + 1), values, cfg.G)

    def dist(m):
        return law(canvas_logits(logits_view(m), prompts, canvas_table(V, L), tbc.mask_id))

    r_tilde = (m1[0] + m1[1]).gather(1, level) / L
    return Target(pi=pi, level=level, m1=m1, m2=m2, m11=m11, g_star=objective_gradient(dist, model, r_tilde),
                  grad_j=objective_gradient(dist, model, rewards), J=objective(dist, model, rewards))


def analyse_model(model, prompts, cfg: EstimatorsConfig, masks: dict, seed: int, family: str = "llada") -> dict:
    """Every estimator × budget × sampler on one model: {rule: {"J", "estimators": {name: {budget: figures}}}}."""
    tbc = cfg.testbed
    V, L = tbc.vocab, tbc.gen_length
    sp = D.Space(tbc.prompt_len, L)
    feats = feature_gradients(model, prompts, V, L)
    with torch.no_grad():
        logits = canvas_logits(logits_view(model), prompts, canvas_table(V, L), tbc.mask_id)
    fam = EXACT_FAMILIES[family]
    if fam.own_moments is not None:  # the family's own estimators instead of the full-attention mask draws
        masks = fam.own_moments(sp, cfg.budgets)
    spg = {K: D.spg(sp, K, feats.logp_a, cfg.spg_draws, cfg.spg_replicas, cfg.seed + 1000 * seed + K)
           for K in cfg.budgets} if fam.own_moments is None else {}
    out = {}
    for rule in RULES[family]:
        tg = target(model, prompts, logits, cfg, rule, family)
        thr = cfg.threshold if rule in fam.threshold_rules else None
        res: dict[str, dict] = {}
        for (name, K), mom in masks.items():
            res.setdefault(name, {})[str(K)] = closed_forms(mom, feats, tg, L, cfg.G, cfg.N)
        for K, reps in spg.items():
            figs = [closed_forms(m, feats, tg, L, cfg.G, cfg.N) for m in reps]
            res.setdefault("spg", {})[str(K)] = _replica_mean(figs, reps[0].mc_draws)
        for name, merge in (("trajectory", 1), ("trajectory-merge2", 2)):
            mom = fam.trajectory(sp, logits, tg.pi, V, rule, tbc.mask_id, thr, merge)
            budget = fam.trajectory_rows(L, merge)
            res[name] = {str(budget): closed_forms(mom, feats, tg, L, cfg.G, cfg.N)}
        res.update(recorded_rows(family, sp, logits, feats, tg, cfg, rule))
        out[rule] = {"J": tg.J, "g_star_norm_sq": float(tg.g_star @ tg.g_star),
                     "grad_j_norm_sq": float(tg.grad_j @ tg.grad_j), "estimators": res}
    return out


def recorded_canvas_moments(family: str, sp: D.Space, logits: torch.Tensor, cfg: EstimatorsConfig, rule: str
                            ) -> dict[tuple[str, int], D.Moments]:
    """MDPO with K canvases and d-TreeRPO with s segments (K, s: the budgets up to L, and L — every canvas, every
    step its own segment; the rollout has no more steps) over the sampler's paths (estimator_paths.py); {} for a
    family without its paths."""
    from dllm_ais.analysis.estimator_paths import dtreerpo_path_moments, mdpo_path_moments

    fam, tbc = EXACT_FAMILIES[family], cfg.testbed
    if fam.path_sets is None:
        return {}
    thr = cfg.threshold if rule == "threshold" else None
    sets = fam.path_sets(logits, tbc.vocab, rule, tbc.mask_id, thr)
    out = {}
    settings = sorted({k for k in cfg.budgets if k <= tbc.gen_length} | {tbc.gen_length})
    for K in settings:
        out[("mdpo", K)] = D.recorded_moments(sets, sp, lambda ps, K=K: mdpo_path_moments(ps, sp, K))
    for s in settings:
        out[("dtreerpo", s)] = D.recorded_moments(sets, sp, lambda ps, s=s: dtreerpo_path_moments(ps, sp, s))
    return out


def recorded_rows(family: str, sp: D.Space, logits, feats: Features, tg: Target, cfg: EstimatorsConfig,
                  rule: str) -> dict[str, dict[str, dict]]:
    """{mdpo / dtreerpo: {setting: figures}} of one sampler on one model (`recorded_canvas_moments`)."""
    res: dict[str, dict] = {}
    for (name, K), mom in recorded_canvas_moments(family, sp, logits, cfg, rule).items():
        res.setdefault(name, {})[str(K)] = closed_forms(mom, feats, tg, cfg.testbed.gen_length, cfg.G, cfg.N)
    return res


def trained_models(cfg: EstimatorsConfig):
    """Every (family, seed, checkpoint) model of the testbed, built and SFT'd as `run` analyses it: yields (family,
    seed, checkpoint, model in eval mode at that checkpoint, the seed's prompts); one model per family and seed, its
    weights reloaded per checkpoint."""
    for family in cfg.families:
        for seed in cfg.seeds:
            tbc = tb.TestbedConfig(**{**asdict(cfg.testbed), "seed": seed})
            model = MAKE[family](tbc)
            states = tb.sft_checkpoints(model, tbc, cfg.checkpoints, family=family, lr=cfg.sft_lr)
            prompts = tb.draw_prompts(tbc)
            for ck in cfg.checkpoints:
                model.load_state_dict(states[ck])
                model.eval()
                yield family, seed, ck, model, prompts


def supplement_recorded(doc: dict, cfg: EstimatorsConfig, log=print) -> dict:
    """A stored results document with MDPO's and d-TreeRPO's rows added (they joined after it was computed): every
    model rebuilt as `run` builds it, and its J, ‖g*‖² and ‖∇J‖² per sampler must equal the stored ones bit for bit
    (the same models, prompts and targets; else a ValueError: rerun instead). Only the new rows are computed (the
    feature gradients, the targets and their closed forms); the stored rows are kept as they are."""
    stored_cfg = json.loads(json.dumps(asdict(cfg)))
    if doc["config"] != stored_cfg:
        raise ValueError("the stored results were computed with another EstimatorsConfig: rerun instead.")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    tbc = cfg.testbed
    sp = D.Space(tbc.prompt_len, tbc.gen_length)
    for family, seed, ck, model, prompts in trained_models(cfg):
        feats = feature_gradients(model, prompts, tbc.vocab, tbc.gen_length)
        with torch.no_grad():
            logits = canvas_logits(logits_view(model), prompts, canvas_table(tbc.vocab, tbc.gen_length), tbc.mask_id)
        for rule in RULES[family]:
            tg = target(model, prompts, logits, cfg, rule, family)
            old = doc["per_model"][model_key(family, seed, ck)][rule]
            now = {"J": tg.J, "g_star_norm_sq": float(tg.g_star @ tg.g_star),
                   "grad_j_norm_sq": float(tg.grad_j @ tg.grad_j)}
            if any(old[k] != v for k, v in now.items()):
                raise ValueError(f"{model_key(family, seed, ck)} {rule}: J / ‖g*‖² differ from the stored "
                                 f"ones ({now} vs {[old[k] for k in now]}): rerun instead.")
            old["estimators"].update(recorded_rows(family, sp, logits, feats, tg, cfg, rule))
        log(f"{family} seed {seed} checkpoint {ck}: {time.perf_counter() - t0:.0f} s")
    doc["impossible_budgets"] = impossible_budgets(tbc.gen_length, cfg.budgets)
    return doc


def _replica_mean(figs: list[dict], draws_each: int) -> dict:
    """Mean over Monte-Carlo replicas, with each figure's standard error (std / √replicas)."""
    r = len(figs)
    out = {}
    for k in figs[0]:
        xs = torch.tensor([f[k] for f in figs], dtype=torch.float64)
        out[k] = float(xs.mean())
        out[k + "_mc_se"] = float(xs.std() / r ** 0.5) if r > 1 else 0.0
    out["mc_draws"] = draws_each * r
    return out


def run(cfg: EstimatorsConfig, out_dir: Path | None, log=print) -> dict:
    """Every seed and checkpoint; writes results.json, README.md and the figure into out_dir (None: nothing)."""
    from dllm_ais.analysis.estimator_report import summarise

    torch.set_num_threads(1)
    t0, load0 = time.perf_counter(), os.getloadavg()
    masks = mask_moments(cfg)
    per_seed = {}
    for family, seed, ck, model, prompts in trained_models(cfg):
        per_seed[model_key(family, seed, ck)] = analyse_model(model, prompts, cfg, masks, seed, family)
        log(f"{family} seed {seed} checkpoint {ck}: {time.perf_counter() - t0:.0f} s")
    doc = {"config": asdict(cfg), "impossible_budgets": impossible_budgets(cfg.testbed.gen_length, cfg.budgets),
           "per_model": per_seed}
    doc["summary"] = summarise(doc)
    timing = {"seconds": time.perf_counter() - t0, "load_average_start": load0, "load_average_end": os.getloadavg(),
              "threads": 1}
    if out_dir is not None:
        write_outputs(doc, out_dir)
    doc["timing"] = timing
    return doc


def write_outputs(doc: dict, out_dir: Path) -> None:
    """results.json (atomic), then README.md and the figure from the file's own order, as --report-only reads it."""
    from dllm_ais.analysis.estimator_report import write_figure, write_readme
    from dllm_ais.atomic import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    atomic_write_text(out_dir / "results.json", text)
    written = json.loads(text)
    write_figure(written, out_dir / "mse_vs_forward_passes.png")
    write_readme(written, out_dir / "README.md")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/estimators/rung1",
                    help="output folder (results.json, README.md, figure)")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run of every code path (tiny settings)")
    ap.add_argument("--supplement", action="store_true",
                    help="add MDPO's and d-TreeRPO's rows to the folder's results.json (its models rebuilt; their J "
                    "and ‖g*‖² must be the stored ones bit for bit; the stored rows kept) and rewrite the reports")
    ap.add_argument("--report-only", action="store_true",
                    help="re-summarise the folder's results.json (its per-model numbers are kept) and rewrite it, "
                    "README.md and the figure (no recomputation)")
    args = ap.parse_args(argv)
    if args.report_only:
        from dllm_ais.analysis.estimator_report import summarise

        doc = json.loads((Path(args.out) / "results.json").read_text())
        doc["summary"] = summarise(doc)
        write_outputs(doc, Path(args.out))
        return 0
    if args.supplement:
        from dllm_ais.analysis.estimator_report import summarise

        t0, load0 = time.perf_counter(), os.getloadavg()
        doc = supplement_recorded(json.loads((Path(args.out) / "results.json").read_text()),
                                  smoke_config() if args.smoke else EstimatorsConfig())
        doc["supplemented"] = ["mdpo", "dtreerpo"]  # the README says how these rows came
        doc["summary"] = summarise(doc)
        write_outputs(doc, Path(args.out))
        print(f"supplemented {args.out} in {time.perf_counter() - t0:.0f} s (load average {load0} -> "
              f"{os.getloadavg()})")
        return 0
    doc = run(smoke_config() if args.smoke else EstimatorsConfig(), Path(args.out))
    t = doc["timing"]
    print(f"wrote {args.out} in {t['seconds']:.0f} s (load average {t['load_average_start']} -> "
          f"{t['load_average_end']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
