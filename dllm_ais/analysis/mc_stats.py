"""Streaming statistics of rung 2 (issue 40): bias², tr Var, MSE and cosine of each estimator against the
Monte-Carlo target, with jackknife confidence intervals that carry the target's own Monte-Carlo error.

The unit is one GRPO batch of N completions: its target vector t = Σ_i c_i ∇ log P(path_i) (c_i = Â_i / (N L),
exact-likelihood GRPO's gradient on that batch), an estimator's vector a = Σ_i c_i ∇s_i on the SAME batch, and the
control variate u = Σ_i ∇ log P(path_i) / (N L) (E u = 0: the score has mean zero). Units are iid. With M units:
- target: ĝ = mean(t − β u), β = tr Cov(t, u) / tr Var(u) fitted on the same units (an O(1/M) bias; β = 0 when
  the control variate is off); its Monte-Carlo error sqrt(tr Var(t − βu) / M) is reported beside ‖ĝ‖;
- bias² = ‖E a − g*‖², estimated without bias from the paired differences d = a − (t − βu):
  ‖d̄‖² − tr Var(d) / M (the correction removes the noise of both the estimator's and the target's means);
- tr Var = tr Var(a) per unit, i.e. of the GRPO gradient at batch size N; MSE = bias² + tr Var;
- cos(E a, g*) from unbiased inner products (⟨ā, t̄'⟩ − tr Cov(a, t') / M, likewise the norms).
Intervals: delete-one-block jackknife over `blocks` blocks of units (unit k in block k mod blocks), 95 % Student-t
with blocks − 1 degrees of freedom; a paired difference of two estimators' MSE uses the same blocks, so
"distinguishable" means its interval excludes 0 with both estimators' and the target's Monte-Carlo error counted.
Every statistic is a function of per-block sums (vectors Σt, Σu, Σa and scalars Σ‖·‖², Σ⟨·,·⟩), so nothing per
unit is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from dllm_ais.analysis.study_stats import t_quantile


@dataclass
class Sums:
    """Per-block sums for the target and each estimator (float64)."""

    blocks: int
    """Jackknife blocks R."""
    D: int
    """Length of a gradient vector."""
    n: torch.Tensor = field(init=False)
    """[R] units per block."""
    T: torch.Tensor = field(init=False)
    """[R, D] Σ t."""
    U: torch.Tensor = field(init=False)
    """[R, D] Σ u."""
    tt: torch.Tensor = field(init=False)
    uu: torch.Tensor = field(init=False)
    tu: torch.Tensor = field(init=False)
    est: dict = field(default_factory=dict)
    """key -> {"A" [R, D], "aa", "at", "au", "rows", "seqs" [R]}."""

    def __post_init__(self):
        R, D = self.blocks, self.D
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.n, self.T, self.U, self.tt, self.uu, self.tu = z(R), z(R, D), z(R, D), z(R), z(R), z(R)

    def add_target(self, block: torch.Tensor, t: torch.Tensor, u: torch.Tensor) -> None:
        """block [m] long, t, u [m, D] float64: the units' target and control-variate vectors."""
        self.n.index_add_(0, block, torch.ones(len(block), dtype=torch.float64))
        self.T.index_add_(0, block, t)
        self.U.index_add_(0, block, u)
        self.tt.index_add_(0, block, (t * t).sum(-1))
        self.uu.index_add_(0, block, (u * u).sum(-1))
        self.tu.index_add_(0, block, (t * u).sum(-1))

    def add(self, key: str, block: torch.Tensor, a: torch.Tensor, t: torch.Tensor, u: torch.Tensor,
            rows: torch.Tensor, seq_block: torch.Tensor) -> None:
        """An estimator's unit vectors a [m, D] beside the same units' t, u; rows [B] its forward rows per sequence
        (seq_block [B] the block of each sequence)."""
        R = self.blocks
        if key not in self.est:
            z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
            self.est[key] = {"A": z(R, self.D), "aa": z(R), "at": z(R), "au": z(R), "rows": z(R), "seqs": z(R)}
        e = self.est[key]
        e["A"].index_add_(0, block, a)
        e["aa"].index_add_(0, block, (a * a).sum(-1))
        e["at"].index_add_(0, block, (a * t).sum(-1))
        e["au"].index_add_(0, block, (a * u).sum(-1))
        e["rows"].index_add_(0, seq_block, rows.double())
        e["seqs"].index_add_(0, seq_block, torch.ones(len(seq_block), dtype=torch.float64))


def _totals(s: Sums, keep: torch.Tensor, key: str | None) -> dict:
    out = {k: getattr(s, k)[keep].sum(0) for k in ("n", "T", "U", "tt", "uu", "tu")}
    if key is not None:
        out.update({k: v[keep].sum(0) for k, v in s.est[key].items()})
    return out


def target_stats(x: dict, control_variate: bool) -> dict:
    """β, ĝ, ‖g*‖² (unbiased), tr Var(t') and the relative Monte-Carlo error of ĝ from totals `x`."""
    M = float(x["n"])
    T, U = x["T"], x["U"]
    var_u = float(x["uu"] - U @ U / M)
    beta = float(x["tu"] - T @ U / M) / var_u if control_variate and var_u > 0 else 0.0
    Tp = T - beta * U
    tpp = float(x["tt"] - 2 * beta * x["tu"] + beta ** 2 * x["uu"])
    var_t = (tpp - float(Tp @ Tp) / M) / (M - 1)  # tr Var(t') per unit
    var_plain = (float(x["tt"]) - float(T @ T) / M) / (M - 1)
    g = Tp / M
    norm2 = float(g @ g) - var_t / M
    return {"beta": beta, "g": g, "norm_sq": norm2, "trace_var": var_t, "trace_var_no_cv": var_plain,
            "mc_rel_error": math.sqrt(max(var_t, 0.0) / M / norm2) if norm2 > 0 else math.inf, "Tp": Tp, "tpp": tpp}


def estimator_stats(x: dict, control_variate: bool) -> dict:
    """bias², tr Var, MSE, cosine and rows of one estimator from totals `x` (module doc)."""
    M = float(x["n"])
    tg = target_stats(x, control_variate)
    beta, Tp = tg["beta"], tg["Tp"]
    A = x["A"]
    a_tp = float(x["at"] - beta * x["au"])  # Σ⟨a, t'⟩
    Dsum = A - Tp
    dd = float(x["aa"]) - 2 * a_tp + tg["tpp"]
    var_d = (dd - float(Dsum @ Dsum) / M) / (M - 1)
    bias = float(Dsum @ Dsum) / M ** 2 - var_d / M
    var_a = (float(x["aa"]) - float(A @ A) / M) / (M - 1)
    ea2 = float(A @ A) / M ** 2 - var_a / M
    cov = (a_tp - float(A @ Tp) / M) / (M - 1)
    inner = float(A @ Tp) / M ** 2 - cov / M
    den = math.sqrt(ea2 * tg["norm_sq"]) if ea2 > 0 and tg["norm_sq"] > 0 else math.nan
    return {"bias_sq": bias, "trace_var": var_a, "mse": bias + var_a, "cos_g_star": inner / den,
            "rows": float(x["rows"] / x["seqs"]), "mean_norm_sq": ea2}


def jackknife(s: Sums, fn) -> dict:
    """fn(keep [R] bool) -> dict of floats; returns {name: {"value", "half"}} with 95 % jackknife half-widths."""
    R = s.blocks
    full = fn(torch.ones(R, dtype=torch.bool))
    reps = []
    for r in range(R):
        keep = torch.ones(R, dtype=torch.bool)
        keep[r] = False
        reps.append(fn(keep))
    tq = t_quantile(0.975, R - 1)
    out = {}
    for k, v in full.items():
        xs = torch.tensor([rep[k] for rep in reps], dtype=torch.float64)
        se = math.sqrt((R - 1) / R * float(((xs - xs.mean()) ** 2).sum()))
        out[k] = {"value": v, "half": tq * se}
    return out


FIELDS = ("mse", "bias_sq", "trace_var", "cos_g_star", "rows")


def summary(s: Sums, control_variate: bool) -> dict:
    """{"target": {...}, "estimators": {key: {field: {value, half}}}} of a finished cell."""

    def tfn(keep):
        t = target_stats(_totals(s, keep, None), control_variate)
        return {k: t[k] for k in ("norm_sq", "trace_var", "trace_var_no_cv", "mc_rel_error", "beta")}

    out = {"target": jackknife(s, tfn), "units": int(s.n.sum()), "estimators": {}}
    for key in s.est:
        out["estimators"][key] = jackknife(s, lambda keep, key=key: {
            k: v for k, v in estimator_stats(_totals(s, keep, key), control_variate).items() if k in FIELDS})
    return out


def paired_mse_difference(s: Sums, a: str, b: str, control_variate: bool) -> dict:
    """MSE(a) − MSE(b) with its jackknife interval over the shared blocks."""
    def fn(keep):
        x, y = _totals(s, keep, a), _totals(s, keep, b)
        return {"diff": estimator_stats(x, control_variate)["mse"] - estimator_stats(y, control_variate)["mse"]}

    return jackknife(s, fn)["diff"]
