"""Does AIS pick the right λ? Exact bias, variance and MSE of the GRPO gradient estimators by enumeration (issue 27).

    python -m dllm_ais.analysis.exact_gradients --out benchmarks/exact_gradients [--smoke] [--threads 1]

On the enumerable testbed (exact_testbed.py: tiny small-vocabulary LLaDA and Qwen, V_c^L completions per prompt, a
reward on every one) every completion's exact probability under π_old (the BF16 exact sampler) and μ (FP8, NVFP4,
MXFP4, the synthetic μ_α; exact and threshold samplers) is enumerated (exact_sampler.py), every completion's
surrogate gradient enters one Gram matrix (exact_surrogates.py), and the estimators none, TIS (C = 2), AIS at every
fixed λ (closed form, exact_moments.py) and AIS with the λ its own diagnostics choose (simulated batches,
exact_simulate.py) are measured against the target g* = E ĝ_none under π_old: bias², trace variance, MSE, cosine,
λ*(N), and the exact one-step ΔJ of an SGD step and of an AdamW step (exact_objective.py). Writes
`results.json`, `mse_vs_lambda.png` and prints a summary; the README of the output folder is written by hand from
them (benchmarks/exact_gradients/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from dllm_ais.analysis import exact_testbed as tb
from dllm_ais.analysis.exact_moments import Regime, mixture_moments, qform
from dllm_ais.analysis.exact_objective import adam_step, objective, objective_after, objective_gradient
from dllm_ais.analysis.exact_sampler import ar_distribution, diffusion_distribution
from dllm_ais.analysis.exact_simulate import (
    LambdaResult,
    ais_lambda,
    batch_forms,
    draw_batches,
    evaluate_lambda,
    rule_lambdas,
)
from dllm_ais.analysis.exact_surrogates import surrogate_gradients
from dllm_ais.families import get_family
from dllm_ais.rl.config import CorrectionConfig


@dataclass(frozen=True)
class RegimeSpec:
    """One measured regime: a model checkpoint, a completion length, a surrogate and a rollout policy μ."""

    name: str
    """Label in results.json and the figure."""
    group: str
    """Which question it answers: precision, fast, synthetic, concentration, surrogate, length, qwen."""
    family: str = "llada"
    """llada (diffusion sampler) or qwen (autoregressive)."""
    checkpoint: int = 40
    """SFT step of the master π_old."""
    gen_length: int = 4
    """L."""
    surrogate: str = "one_step"
    """one_step | elbo | ar (exact_surrogates.py)."""
    precision: str = "mxfp4"
    """μ's weights: fp8 | nvfp4 | mxfp4 | mxfp4-w-<α> | bf16 (exact_testbed.rollout_copy)."""
    rule: str = "low_confidence"
    """μ's sampler: low_confidence (the exact sampler) or threshold (Fast-dLLM's, AnalysisConfig.threshold)."""
    steps: bool = False
    """Also simulate the ΔJ of SGD and AdamW steps over sampled batches (costly: J per batch and estimator)."""


@dataclass(frozen=True)
class AnalysisConfig:
    """Everything the analysis measures, with its defaults (the committed run)."""

    testbed: tb.TestbedConfig = tb.TestbedConfig()
    """Task, vocabulary, prompts and model size."""
    checkpoints: tuple[int, ...] = (0, 20, 40, 60, 100)
    """SFT steps saved for the LLaDA master (0 = random initialisation)."""
    qwen_checkpoint: int = 15
    """SFT step of the tiny Qwen master."""
    sft_lr: float = 1e-3
    """SFT learning rate (AdamW) for both families."""
    sft_lengths: tuple[int, ...] = (2, 3, 4, 5)
    """Completion lengths drawn per SFT batch (one LLaDA for the length sweep)."""
    G: int = 8
    """Generations per prompt (the study presets' num_generations)."""
    batch_sizes: tuple[int, ...] = (8, 64, 512)
    """N = B · G completions per batch."""
    num_batches: tuple[int, ...] = (20000, 4000, 500)
    """Simulated batches for each batch size (AIS's own λ and the per-batch rules)."""
    lambda_grid: tuple[float, ...] = tuple(i / 20 for i in range(21))
    """Fixed λ values of the MSE curves."""
    tau_grid: tuple[float, ...] = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
    """τ values of AIS's severity map scanned for the MSE (product combiner)."""
    threshold: float = 0.9
    """Confidence threshold of the fast sampler."""
    ais_tau: float = 0.02
    """τ of the AIS whose own λ is simulated (`ais_product`, `ais_severity`): the package default when this analysis
    ran (it set the default to 0.1 afterwards, from `tau_grid`'s scan); pinned so the figures do not move with it."""
    lr: float = 5e-4
    """AdamW learning rate of the ΔJ step (the study presets')."""
    sgd_step_norm: float = 0.01
    """SGD's η = sgd_step_norm / ‖g*‖: the target's step moves the parameters by this length (J is smooth to first
    order up to ~1e-4 and jumps beyond, exact_objective.py; 0.01 keeps the target's step improving J)."""
    adam_batches: int = 100
    """Sampled batches (N = step_batch_size) per `steps` regime for AdamW's first-order ΔJ ⟨∇J, Δθ⟩."""
    step_batches: int = 12
    """Of those, batches whose finite-step ΔJ (J by enumeration after the step) is also computed, SGD and AdamW."""
    step_batch_size: int = 64
    """N of the sampled steps."""
    seed: int = 0
    """Seeds the batch draws."""
    regimes: tuple[RegimeSpec, ...] = field(default_factory=lambda: default_regimes())
    """What to measure."""

    def __post_init__(self):
        if len(self.num_batches) != len(self.batch_sizes):
            raise ValueError("AnalysisConfig: num_batches needs one count per entry of batch_sizes.")
        if any(n % self.G for n in self.batch_sizes + (self.step_batch_size,)):
            raise ValueError(f"AnalysisConfig: every batch size must be a multiple of G={self.G}.")


def default_regimes(main: int = 40, late: int = 100) -> tuple[RegimeSpec, ...]:
    """The committed regime list (README of benchmarks/exact_gradients)."""
    out = [RegimeSpec(f"{p}", "precision", precision=p, steps=p != "nvfp4") for p in ("fp8", "nvfp4", "mxfp4")]
    out += [RegimeSpec(f"{p}-fast@{ck}", "fast", checkpoint=ck, precision=p, rule="threshold",
                       steps=ck == late and p == "mxfp4") for ck in (60, late) for p in ("bf16", "fp8", "mxfp4")]
    out += [RegimeSpec(f"mxfp4-w-{a:g}", "synthetic", precision=f"mxfp4-w-{a:g}", steps=a == 8)
            for a in (0.5, 1, 2, 4, 8)]
    out += [RegimeSpec(f"{p}@{ck}", "concentration", checkpoint=ck, precision=p,
                       steps=p == "mxfp4-w-8" or (p == "mxfp4" and ck == 0))
            for p in ("fp8", "mxfp4", "mxfp4-w-8") for ck in (0, 20, 60, late)]
    out += [RegimeSpec(f"elbo {p}", "surrogate", surrogate="elbo", precision=p) for p in ("fp8", "mxfp4", "mxfp4-w-8")]
    out += [RegimeSpec(f"L={n} {p}", "length", gen_length=n, precision=p) for p in ("mxfp4", "mxfp4-w-4")
            for n in (2, 3, 5)]
    out += [RegimeSpec(f"qwen {p}", "qwen", family="qwen", checkpoint=-1, surrogate="ar", precision=p,
                       steps=p == "mxfp4-w-8") for p in ("fp8", "nvfp4", "mxfp4", "mxfp4-w-8")]
    return tuple(out)


def smoke_config() -> AnalysisConfig:
    """A seconds-long run of every code path (tests, --smoke): 2 prompts, L = 2, few batches."""
    testbed = tb.TestbedConfig(num_prompts=2, gen_length=2, prompt_len=2, d_model=32, n_heads=2, mlp=32)
    regimes = (RegimeSpec("fp8", "precision", checkpoint=5, gen_length=2, precision="fp8", steps=True),
               RegimeSpec("mxfp4-w-8", "synthetic", checkpoint=5, gen_length=2, precision="mxfp4-w-8"),
               RegimeSpec("fp8-fast", "fast", checkpoint=5, gen_length=2, precision="fp8", rule="threshold"),
               RegimeSpec("elbo fp8", "surrogate", checkpoint=5, gen_length=2, surrogate="elbo", precision="fp8"),
               RegimeSpec("qwen fp8", "qwen", family="qwen", checkpoint=-1, gen_length=2, surrogate="ar",
                          precision="fp8"))
    return AnalysisConfig(testbed=testbed, checkpoints=(0, 5), qwen_checkpoint=5, sft_lengths=(2,),
                          batch_sizes=(8, 32), num_batches=(200, 100), step_batches=2, adam_batches=4,
                          step_batch_size=32,
                          lambda_grid=(0.0, 0.5, 1.0), tau_grid=(0.02, 0.2), regimes=regimes)


class Context:
    """Models, checkpoints, exact π_old and Gram matrices, built once and shared by the regimes that need them."""

    def __init__(self, cfg: AnalysisConfig):
        self.cfg = cfg
        self.prompts = tb.draw_prompts(cfg.testbed)
        self.models = {"llada": tb.make_llada(cfg.testbed), "qwen": tb.make_qwen(cfg.testbed)}
        t = time.perf_counter()
        self.states = {"llada": tb.sft_checkpoints(self.models["llada"], cfg.testbed, cfg.checkpoints,
                                                   lr=cfg.sft_lr, lengths=cfg.sft_lengths),
                       "qwen": tb.sft_checkpoints(self.models["qwen"], cfg.testbed, (cfg.qwen_checkpoint,),
                                                  family="qwen", lr=cfg.sft_lr)}
        self.sft_s = time.perf_counter() - t
        self._key = self._grad_key = None
        self._gram = self._grad_j = None

    def model(self, spec: RegimeSpec):
        """The master at the regime's checkpoint (loaded in place)."""
        ck = spec.checkpoint if get_family(spec.family).diffusion else self.cfg.qwen_checkpoint  # the AR testbed's
        m = self.models[spec.family]
        m.load_state_dict(self.states[spec.family][ck])
        return m.eval()

    def distribution(self, model, spec: RegimeSpec, rule: str = "low_confidence") -> torch.Tensor:
        """[n, Y] exact sampler distribution of `model` for the regime's family and length (differentiable)."""
        V, L = self.cfg.testbed.vocab, spec.gen_length
        if not get_family(spec.family).diffusion:
            return ar_distribution(model, self.prompts, V, L)
        thr = self.cfg.threshold if rule == "threshold" else None
        return diffusion_distribution(model, self.prompts, V, L, self.cfg.testbed.mask_id, rule, threshold=thr)

    def objective_gradient(self, spec: RegimeSpec, rewards: torch.Tensor) -> torch.Tensor:
        """∇J at the regime's master (cached with the Gram: it depends on the master and L only)."""
        key = (spec.family, spec.checkpoint, spec.gen_length)
        if key != self._grad_key:
            self._grad_j = objective_gradient(lambda m: self.distribution(m, spec), self.model(spec), rewards)
            self._grad_key = key
        return self._grad_j

    def gradients(self, spec: RegimeSpec):
        """Gram + vectors of the regime's surrogate at its master (cached for consecutive regimes sharing them)."""
        key = (spec.family, spec.checkpoint, spec.gen_length, spec.surrogate)
        if key != self._key:
            self._gram = None  # free the previous one first
            self._gram = surrogate_gradients(spec.surrogate, self.model(spec), self.prompts, self.cfg.testbed.vocab,
                                             spec.gen_length)
            self._key = key
        return self._gram


def mismatch_stats(reg: Regime) -> dict:
    """Population diagnostics of μ against π_old (expectations under μ, averaged over prompts)."""
    mu, lw = reg.mu, reg.log_w
    seen = mu > 0
    lw0 = torch.where(seen, lw, 0.0)
    wt = torch.where(seen, reg.w_trunc, 0.0)
    mean_l = (mu * lw0).sum(-1)
    return {"D": float((mu * lw0.abs()).sum(-1).mean()) / reg.L,
            "kl_per_token": float((-mu * lw0).sum(-1).mean()) / reg.L,
            "var_ell": float(((mu * lw0 ** 2).sum(-1) - mean_l ** 2).mean()),
            "ess": float(((mu * wt).sum(-1) ** 2 / (mu * wt ** 2).sum(-1)).mean()),
            "tv": float(0.5 * (reg.pi - mu).abs().sum(-1).mean()),
            "J_pi": float((reg.pi * reg.values[reg.level]).sum(-1).mean()),
            "J_mu": float((mu * reg.values[reg.level]).sum(-1).mean())}


def bias_decomposition(reg: Regime, mm) -> dict:
    """Where TIS's bias comes from: untruncated IS with the advantages the trainer computes (from μ's group) vs with
    π_old's advantage moments (exactly unbiased), and how far the surrogate's score is from mean zero under π_old
    (‖E_π h‖² / E_π ‖h‖²; 0 for an exact log-likelihood, whose score has mean 0)."""
    from dllm_ais.analysis.exact_moments import advantage_moments, level_probs, mean_coefficients

    Lv = reg.values.numel()
    mom_mu = advantage_moments(level_probs(reg.mu, reg.level, Lv), reg.values, reg.G)
    mom_pi = advantage_moments(level_probs(reg.pi, reg.level, Lv), reg.values, reg.G)
    w = torch.where(reg.mu > 0, reg.pi / reg.mu.clamp(min=1e-300), 0.0)
    out = {}
    for name, mom in (("bias_sq_is_untruncated", mom_mu), ("bias_sq_is_pi_advantages", mom_pi)):
        d = mean_coefficients(reg.mu, w, reg.level, mom.m1, reg.L) - mm.target
        out[name] = qform(d, d, mm.gram)
    n = reg.pi.shape[0]
    mean_h = reg.pi.reshape(-1) / n  # E_x E_π h as a coefficient vector
    second = float((reg.pi.reshape(-1) / n * mm.gram.diagonal()).sum())
    out["score_mean_sq_over_second_moment"] = qform(mean_h, mean_h, mm.gram) / second
    return out


def _lambda_json(res: LambdaResult) -> dict:
    out = asdict(res)
    out.pop("mean")
    return out


def _per_batch_size(mm, reg: Regime, cfg: AnalysisConfig, N: int, M: int, gen: torch.Generator) -> tuple[dict, dict]:
    """Closed-form and simulated figures at batch size N; also returns the simulated objects for the ΔJ steps."""
    B = N // cfg.G
    wt = reg.w_trunc.reshape(-1)
    a0, a1, a2 = mm.quadratic(B)
    lam_star = mm.lam_star(B)
    out = {"B": B, "bias_sq_none": mm.bias_sq(0.0), "bias_sq_tis": mm.bias_sq(1.0),
           "trace_var_none": mm.trace_var(0.0, B), "trace_var_tis": mm.trace_var(1.0, B),
           "mse_none": mm.mse(0.0, B), "mse_tis": mm.mse(1.0, B), "cos_none": mm.cosine(0.0), "cos_tis": mm.cosine(1.0),
           "bias_sq_over_var_none": mm.bias_sq(0.0) / mm.trace_var(0.0, B),
           "lam_star": lam_star, "mse_lam_star": a0 + 2 * lam_star * a1 + lam_star ** 2 * a2,
           "bias_sq_lam_star": mm.bias_sq(lam_star), "cos_lam_star": mm.cosine(lam_star),
           "mse_grid": [mm.mse(lam, B) for lam in cfg.lambda_grid],
           "rule_shift_limit": mm.shift_rule(B), "rule_noise_limit": mm.noise_rule(B)}
    for name in ("rule_shift_limit", "rule_noise_limit"):
        lam = out[name]
        out[name.replace("rule", "mse_rule")] = a0 + 2 * lam * a1 + lam ** 2 * a2
    batches = draw_batches(reg.mu, reg.log_w, reg.values[reg.level], M, B, cfg.G, gen)
    forms = batch_forms(batches, mm, wt, reg.L)
    base = CorrectionConfig(correction="ais", ais_tau=cfg.ais_tau)
    lams = {"ais_product": ais_lambda(batches.log_w, batches.adv, reg.L, base),
            "ais_severity": ais_lambda(batches.log_w, batches.adv, reg.L, replace(base, ais_combiner="severity"))}
    if B >= 2:
        lams.update({f"rule_{k}": v for k, v in rule_lambdas(forms).items()})
    results = {k: evaluate_lambda(v, forms, batches, mm, wt, reg.L, B) for k, v in lams.items()}
    out.update({k: _lambda_json(r) for k, r in results.items()})
    check = evaluate_lambda(torch.ones(M, dtype=torch.float64), forms, batches, mm, wt, reg.L, B)
    out["check"] = {"mse_none_simulated": float(forms.d_d.mean()), "mse_none_simulated_se": float(forms.d_d.std()
                                                                                                  / M ** 0.5),
                    "mse_tis_simulated": check.mse, "mse_tis_simulated_se": check.mse_se}
    extra = {}
    for tau in cfg.tau_grid:
        lam = ais_lambda(batches.log_w, batches.adv, reg.L, replace(base, ais_tau=tau))
        extra[str(tau)] = mm.mse(0.0, B) + float((2 * lam * forms.d_delta + lam ** 2 * forms.delta_delta).mean())
    out["mse_ais_by_tau"] = extra
    return out, {"batches": batches, "lams": lams, "results": results}


def _scatter(batches, coef: torch.Tensor, K: int, b: int) -> torch.Tensor:
    return torch.zeros(K, dtype=torch.float64).index_add_(0, batches.k[b], coef)


def _paired(rows: dict[str, list[float]]) -> dict:
    """mean ± SE of each estimator's values and of its difference from `none` on the same batches."""
    base = torch.tensor(rows["none"], dtype=torch.float64)
    out = {}
    for k, r in rows.items():
        x = torch.tensor(r, dtype=torch.float64)
        n = len(x)
        out[k] = {"mean": float(x.mean()), "se": float(x.std() / n ** 0.5) if n > 1 else math.nan,
                  "minus_none_mean": float((x - base).mean()),
                  "minus_none_se": float((x - base).std() / n ** 0.5) if n > 1 else math.nan}
    return out


def _delta_j(ctx: Context, spec: RegimeSpec, mm, reg: Regime, sims: dict, cfg: AnalysisConfig) -> dict:
    """One-step improvement of J (exact_objective.py): first order along each estimator's mean gradient (exact), a
    finite SGD step along it, and — for `steps` regimes — AdamW's first-order ΔJ over sampled batches and finite
    SGD / AdamW steps on a few of them."""
    grads = ctx.gradients(spec)
    model = ctx.model(spec)
    rewards = reg.values[reg.level]
    dist = lambda m: ctx.distribution(m, spec)  # noqa: E731
    J0 = objective(dist, model, rewards)
    gJ = ctx.objective_gradient(spec, rewards)
    B = cfg.step_batch_size // cfg.G
    sim = sims[cfg.step_batch_size]
    lam_star = mm.lam_star(B)
    means = {"target": mm.target, "none": mm.mean_none, "tis": mm.mean_tis, "lam_star": mm.mean(lam_star),
             "ais_product": sim["results"]["ais_product"].mean}
    vec = {k: grads.vector(a) for k, a in means.items()}
    t_rate = float(gJ @ vec["target"])
    eta = cfg.sgd_step_norm / float(vec["target"].norm())
    out = {"J": J0, "grad_J_norm": float(gJ.norm()), "N": cfg.step_batch_size, "lam_star": lam_star,
           "first_order": {k: {"rate": float(gJ @ v), "rate_over_target": float(gJ @ v) / t_rate,
                               "cos_grad_J": float(gJ @ v) / float(gJ.norm() * v.norm()),
                               "norm_over_target": float(v.norm() / vec["target"].norm())} for k, v in vec.items()},
           "sgd": {"eta": eta, "step_norm": cfg.sgd_step_norm,
                   "mean_gradient": {k: objective_after(dist, model, rewards, eta * v) - J0 for k, v in vec.items()}},
           "adam": {"lr": cfg.lr}}
    if not spec.steps:
        return out
    batches, N = sim["batches"], cfg.step_batch_size
    wt = reg.w_trunc.reshape(-1)
    K = mm.target.numel()
    names = ("none", "tis", "ais_product", "lam_star")
    first = {k: [] for k in names}
    finite = {opt: {k: [] for k in names} for opt in ("sgd", "adam")}
    for b in range(min(cfg.adam_batches, batches.k.shape[0])):
        c_n = batches.adv[b] / (N * reg.L)
        c_t = wt[batches.k[b]] * c_n
        lam_b = float(sim["lams"]["ais_product"][b])
        coefs = {"none": c_n, "tis": c_t, "ais_product": c_n + lam_b * (c_t - c_n),
                 "lam_star": c_n + lam_star * (c_t - c_n)}
        for k, c in coefs.items():
            g = grads.vector(torch.zeros(K, dtype=torch.float64).index_add_(0, batches.k[b], c))
            step = adam_step(g, cfg.lr)
            first[k].append(float(gJ @ step))
            if b < cfg.step_batches:
                finite["sgd"][k].append(objective_after(dist, model, rewards, eta * g) - J0)
                finite["adam"][k].append(objective_after(dist, model, rewards, step) - J0)
    out["adam"].update({"batches": len(first["none"]), "first_order": _paired(first)})
    out["finite_sampled"] = {"batches": len(finite["sgd"]["none"]), "sgd": _paired(finite["sgd"]),
                             "adam": _paired(finite["adam"])}
    return out


def analyse(spec: RegimeSpec, ctx: Context, cfg: AnalysisConfig) -> dict:
    """Every figure of one regime (module doc); its batches are drawn from seed + crc32(name), so a regime's numbers
    do not depend on which others run."""
    t = time.perf_counter()
    gen = torch.Generator().manual_seed(cfg.seed + zlib.crc32(spec.name.encode()))
    model = ctx.model(spec)
    V, L = cfg.testbed.vocab, spec.gen_length
    rewards = tb.rewards(ctx.prompts, tb.all_sequences(V, L), V)  # [n, Y]
    level = (rewards * L).round().long()
    values = torch.arange(L + 1, dtype=torch.float64) / L
    with torch.no_grad():
        pi = ctx.distribution(model, spec)
        mu = ctx.distribution(tb.rollout_copy(model, spec.precision), spec, spec.rule)
    reg = Regime(pi=pi, mu=mu, level=level, values=values, L=L, G=cfg.G)
    grads = ctx.gradients(spec)
    mm = mixture_moments(reg, grads.gram)
    out = {"spec": asdict(spec), "mismatch": mismatch_stats(reg), "num_params": grads.num_params,
           "target_norm": qform(mm.target, mm.target, mm.gram) ** 0.5,
           "bias_decomposition": bias_decomposition(reg, mm), "per_N": {}}
    sims = {}
    for N, M in zip(cfg.batch_sizes + (cfg.step_batch_size,), cfg.num_batches + (cfg.step_batches,), strict=True):
        if N in sims:
            continue
        fig, sims[N] = _per_batch_size(mm, reg, cfg, N, M, gen)
        if N in cfg.batch_sizes:
            out["per_N"][str(N)] = fig
    out["delta_j"] = _delta_j(ctx, spec, mm, reg, sims, cfg)
    out["seconds"] = time.perf_counter() - t
    return out


def _clean(x):
    """JSON-safe: NaN / inf -> None, tuples -> lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def run(cfg: AnalysisConfig, out_dir: Path | None, threads: int = 1, log=print) -> dict:
    """Run every regime; write results.json and the figure into out_dir (None: write nothing)."""
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    ctx = Context(cfg)
    by_name = {}
    order = sorted(cfg.regimes, key=lambda s: (s.family, s.checkpoint, s.gen_length, s.surrogate))  # share Grams
    for spec in order:
        res = by_name[spec.name] = analyse(spec, ctx, cfg)
        n64 = res["per_N"].get("64") or next(iter(res["per_N"].values()))
        log(f"{spec.name:>22}: D {res['mismatch']['D']:.4f} ESS {res['mismatch']['ess']:.3f} | N=64 bias²/var "
            f"{n64['bias_sq_over_var_none']:.3g} λ* {n64['lam_star']:.2f} AIS λ {n64['ais_product']['lam_mean']:.2f} "
            f"({res['seconds']:.1f} s)")
    from dllm_ais.analysis.bench_env import git_commit
    from dllm_ais.analysis.exact_report import summarise, write_figure

    sha, dirty = git_commit(Path(__file__).resolve().parents[2])
    doc = {"config": asdict(cfg), "git_sha": sha, "git_dirty": dirty, "threads": threads,
           "load_average_start": load0, "load_average_end": os.getloadavg(), "sft_seconds": ctx.sft_s,
           "seconds": time.perf_counter() - t0, "regimes": [by_name[s.name] for s in cfg.regimes]}
    doc["summary"] = summarise(doc)
    doc = _clean(doc)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        from dllm_ais.atomic import atomic_write_text

        atomic_write_text(out_dir / "results.json", json.dumps(doc, indent=1) + "\n")
        write_figure(doc, out_dir / "mse_vs_lambda.png")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/exact_gradients", help="output folder (results.json, figure)")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run of every code path (tiny settings)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for these tiny models)")
    args = ap.parse_args(argv)
    cfg = smoke_config() if args.smoke else AnalysisConfig()
    doc = run(cfg, Path(args.out), threads=args.threads)
    print(json.dumps(doc["summary"]["headline"], indent=1))
    print(f"wrote {args.out} in {doc['seconds']:.0f} s (load average {doc['load_average_start']} -> "
          f"{doc['load_average_end']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
