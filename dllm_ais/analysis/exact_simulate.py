"""Simulated batches for the estimators whose weights depend on the whole batch: AIS with the λ its own diagnostics
choose, and per-batch λ rules — everything else is closed form (exact_moments.py).

A batch: B prompts uniform from the n analysis prompts, G completions each from μ, rewards, GRPO group advantages
computed by the trainer's own function (rl/advantages.group_advantages), exact log-weights ℓ = log π_old − log μ.
AIS's λ per batch follows rl/correction.py at sequence level with all L tokens counted (`ais_lambda`, a batched
copy checked against `correct` in the tests). With λ_b the batch's λ and, in coefficient space,
    ĝ_none,b = c_b (c = Â / (N L) on the batch's completions),   Δ_b = ĝ_TIS,b − ĝ_none,b,   d_b = ĝ_none,b − g*,
AIS's error is d_b + λ_b Δ_b, so E‖ĝ_AIS − g*‖² = E‖d‖² + E[2 λ_b ⟨d_b, Δ_b⟩ + λ_b² ‖Δ_b‖²]: the first term is
known exactly (closed form), only the small correction is Monte-Carlo (a control variate); likewise E ĝ_AIS =
E ĝ_none + E[λ_b Δ_b].

Per-batch rules from what `--grad-diagnostics-every` can measure on one batch (halves a, b of the prompt groups,
shares s_a, s_b; δ = ĝ_a − ĝ_b of the halves' own normalised gradients, so E‖δ‖² s_a s_b = tr Var ĝ):
- `noise` (the issue's form): λ = ‖Δ‖² / (‖Δ‖² + ‖δ_TIS‖² s_a s_b)  (shift² against the TIS gradient's noise²);
- `shift` (derived from the MSE's minimiser): λ = clip((‖Δ‖² − ‖δ_Δ‖² s_a s_b − ⟨δ_none, δ_Δ⟩ s_a s_b) / ‖Δ‖², 0, 1),
  the per-batch plug-in of (‖EΔ‖² − tr Cov(ĝ_none, Δ)) / E‖Δ‖², which is λ* when TIS is unbiased.
Both need B ≥ 2 groups (NaN otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dllm_ais.analysis.exact_moments import MixtureMoments, qform
from dllm_ais.rl.advantages import group_advantages
from dllm_ais.rl.config import CorrectionConfig


@dataclass(frozen=True)
class Batches:
    """M simulated batches of N = B G completions."""

    k: torch.Tensor
    """[M, N] long: global completion index (prompt · Y + sequence index), groups contiguous."""
    adv: torch.Tensor
    """[M, N] float64 group advantages."""
    log_w: torch.Tensor
    """[M, N] float64 exact ℓ."""
    G: int
    """Generations per prompt."""


def draw_batches(mu: torch.Tensor, log_w: torch.Tensor, rewards: torch.Tensor, num_batches: int, B: int, G: int,
                 generator: torch.Generator, scale: str = "group") -> Batches:
    """mu, log_w, rewards [n, Y]; returns `num_batches` batches of B prompts × G completions drawn from μ."""
    n, Y = mu.shape
    prompt = torch.randint(n, (num_batches, B), generator=generator)  # [M, B]
    y = torch.multinomial(mu[prompt.reshape(-1)], G, replacement=True, generator=generator)  # [M B, G]
    k = (prompt.reshape(-1, 1) * Y + y).view(num_batches, B * G)  # [M, N]
    r = rewards.reshape(-1)[k]  # [M, N]
    adv = group_advantages(r.reshape(-1), G, scale).adv.view(num_batches, B * G).double()
    return Batches(k=k, adv=adv, log_w=log_w.reshape(-1)[k].double(), G=G)


def ais_lambda(log_w: torch.Tensor, adv: torch.Tensor, length: int, cfg: CorrectionConfig) -> torch.Tensor:
    """λ_batch of rl/correction.py per batch row, sequence level, every one of `length` tokens counted, no EMA:
    log_w, adv [M, N] -> [M]."""
    lw = log_w.clamp(-cfg.log_w_clamp, cfg.log_w_clamp)
    wt = lw.exp().clamp(max=cfg.is_cap)
    N = lw.shape[1]
    r = (wt.sum(-1) ** 2 / (N * (wt * wt).sum(-1))).clamp(max=1)
    s = -torch.expm1(-(lw.abs() / length).mean(-1) / cfg.ais_tau)
    var_adv = adv.var(-1, unbiased=False)
    v = torch.where(var_adv > 1e-12, (wt * adv).var(-1, unbiased=False) / var_adv.clamp(min=1e-12), 1.0)
    g = 1 / v.clamp(min=1)
    lam = s * g if cfg.ais_combiner == "severity" else s * r * g
    return lam.clamp(0, 1)


@dataclass(frozen=True)
class BatchForms:
    """Per-batch inner products (module doc's notation), each [M] float64."""

    d_d: torch.Tensor
    """‖d_b‖² (uncorrected error)."""
    d_delta: torch.Tensor
    """⟨d_b, Δ_b⟩."""
    delta_delta: torch.Tensor
    """‖Δ_b‖² (the correction's shift²)."""
    none_target: torch.Tensor
    """⟨ĝ_none,b, g*⟩."""
    delta_target: torch.Tensor
    """⟨Δ_b, g*⟩."""
    none_none: torch.Tensor
    """‖ĝ_none,b‖²."""
    none_delta: torch.Tensor
    """⟨ĝ_none,b, Δ_b⟩."""
    noise_tis: torch.Tensor
    """‖δ_TIS‖² s_a s_b (NaN when B < 2)."""
    noise_delta: torch.Tensor
    """‖δ_Δ‖² s_a s_b."""
    noise_cross: torch.Tensor
    """⟨δ_none, δ_Δ⟩ s_a s_b."""


def _halves(B: int, G: int) -> tuple[torch.Tensor, float]:
    """[N] +1 on the first half of the groups, −1 on the second (0-size halves impossible: B >= 2), and s_a."""
    cut = (B // 2) * G
    sign = torch.ones(B * G, dtype=torch.float64)
    sign[cut:] = -1.0
    return sign, cut / (B * G)


def batch_forms(batches: Batches, mm: MixtureMoments, w_trunc: torch.Tensor, length: int, chunk: int = 64
                ) -> BatchForms:
    """The inner products of every batch against the exact target (Gram from `mm`). w_trunc [K] min(π/μ, C)."""
    M, N = batches.k.shape
    B = N // batches.G
    gram, target = mm.gram, mm.target
    m_target = gram @ target  # [K]
    t_t = qform(target, target, gram)
    c_n = batches.adv / (N * length)  # [M, N]
    c_d = (w_trunc[batches.k] - 1) * c_n  # Δ's coefficients
    if B >= 2:
        sign, s_a = _halves(B, batches.G)
        half = torch.where(sign > 0, 1 / s_a, 1 / (1 - s_a))  # ĝ_a, ĝ_b renormalised by their own sizes
        h_n, h_d = c_n * sign * half, c_d * sign * half
    parts = {f: [] for f in BatchForms.__dataclass_fields__}
    for s in range(0, M, chunk):
        idx = batches.k[s:s + chunk]  # [c, N]
        sub = gram[idx[:, :, None], idx[:, None, :]]  # [c, N, N]

        def q(a, b, sub=sub):
            return torch.einsum("ci,cij,cj->c", a, sub, b)

        n_, d_ = c_n[s:s + chunk], c_d[s:s + chunk]
        mt = m_target[idx]
        nn, nd, dd = q(n_, n_), q(n_, d_), q(d_, d_)
        nt, dt = (n_ * mt).sum(-1), (d_ * mt).sum(-1)
        parts["none_none"].append(nn)
        parts["none_delta"].append(nd)
        parts["delta_delta"].append(dd)
        parts["none_target"].append(nt)
        parts["delta_target"].append(dt)
        parts["d_d"].append(nn - 2 * nt + t_t)
        parts["d_delta"].append(nd - dt)
        if B >= 2:
            hn, hd = h_n[s:s + chunk], h_d[s:s + chunk]
            ab = s_a * (1 - s_a)
            parts["noise_tis"].append(q(hn + hd, hn + hd) * ab)
            parts["noise_delta"].append(q(hd, hd) * ab)
            parts["noise_cross"].append(q(hn, hd) * ab)
        else:
            nan = torch.full_like(nn, math.nan)
            for f in ("noise_tis", "noise_delta", "noise_cross"):
                parts[f].append(nan)
    return BatchForms(**{f: torch.cat(v) for f, v in parts.items()})


def rule_lambdas(forms: BatchForms) -> dict[str, torch.Tensor]:
    """The per-batch rules of the module doc -> {"noise": [M], "shift": [M]}."""
    dd = forms.delta_delta
    noise = dd / (dd + forms.noise_tis)
    shift = ((dd - forms.noise_delta - forms.noise_cross) / dd).clamp(0, 1)
    return {"noise": torch.where(dd > 0, noise, 0.0), "shift": torch.where(dd > 0, shift, 0.0)}


@dataclass(frozen=True)
class LambdaResult:
    """Bias, variance, MSE and cosines of ĝ_none + λ_b Δ_b for one per-batch λ series."""

    mse: float
    """E‖ĝ − g*‖² (control variate on the exact uncorrected MSE)."""
    mse_se: float
    """Its Monte-Carlo standard error."""
    bias_sq: float
    """‖E ĝ − g*‖²."""
    trace_var: float
    """mse − bias_sq."""
    mean_cosine: float
    """E[cos(ĝ_b, g*)] over the batches."""
    lam_quantiles: list[float]
    """λ_b at the 5, 25, 50, 75, 95 % quantiles."""
    lam_mean: float
    """E λ_b."""
    mean: torch.Tensor
    """[K] E ĝ as a coefficient vector (not written to JSON)."""


def evaluate_lambda(lam: torch.Tensor, forms: BatchForms, batches: Batches, mm: MixtureMoments,
                    w_trunc: torch.Tensor, length: int, B: int) -> LambdaResult:
    """Statistics of ĝ_none,b + λ_b Δ_b (lam [M]) with the exact uncorrected moments as control variate."""
    M, N = batches.k.shape
    lam = lam.double()
    extra = 2 * lam * forms.d_delta + lam ** 2 * forms.delta_delta  # [M]
    mse = mm.mse(0.0, B) + float(extra.mean())
    coef = lam[:, None] * (w_trunc[batches.k] - 1) * batches.adv / (N * length)  # [M, N] λ_b Δ_b's coefficients
    delta_mean = torch.zeros_like(mm.target).index_add_(0, batches.k.reshape(-1), coef.reshape(-1)) / M
    d = mm.mean_none + delta_mean - mm.target
    bias_sq = qform(d, d, mm.gram)
    t_norm = qform(mm.target, mm.target, mm.gram) ** 0.5
    dot = forms.none_target + lam * forms.delta_target
    norm = (forms.none_none + 2 * lam * forms.none_delta + lam ** 2 * forms.delta_delta).clamp(min=1e-300).sqrt()
    q = torch.quantile(lam, torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64))
    return LambdaResult(mse=mse, mse_se=float(extra.std() / M ** 0.5), bias_sq=bias_sq, trace_var=mse - bias_sq,
                        mean_cosine=float((dot / (norm * t_norm)).mean()), lam_quantiles=q.tolist(),
                        lam_mean=float(lam.mean()), mean=mm.mean_none + delta_mean)
