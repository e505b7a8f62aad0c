"""Closed-form bias, variance and MSE of the fixed-weight GRPO gradient estimators, in coefficient space.

A batch is B prompts drawn uniformly (with replacement) from the n analysis prompts, each with G completions drawn
i.i.d. from the rollout policy q(· | x); advantages are GRPO's group z-scores (rl/advantages.py, `group`; `none`
centres only). With a per-sample weight ω(x, y) that depends on that sample alone (none: 1; TIS: min(π/μ, C);
AIS at a fixed λ: (1 − λ) + λ min(π/μ, C)), the estimator is the mean of B i.i.d. group terms

    ĝ = (1/B) Σ_b u_b,    u_b = (1/(G L)) Σ_g ω_bg Â_bg h_bg,

so E ĝ = E u and tr Var ĝ = (E‖u‖² − ‖E u‖²) / B exactly. Â_g depends on the group's other rewards; the reward takes
L + 1 levels, so E[Â_1 | r_1], E[Â_1² | r_1] and E[Â_1 Â_2 | r_1, r_2] are sums over the compositions of the other
G − 1 (G − 2) rewards among the levels, weighted by their multinomial probabilities (`advantage_moments`).

Every vector is a coefficient vector a ∈ R^K over the per-completion gradients (ĝ = Hᵀ a); inner products use the
Gram matrix M = H Hᵀ (exact_surrogates.py): ⟨a, b⟩_M = aᵀ M b. Shapes: n prompts, Y = V_c^L completions per prompt,
K = n Y (prompt-major), Lv = L + 1 reward levels.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from math import lgamma

import torch

from dllm_ais.rl.advantages import ADV_EPS


def compositions(total: int, parts: int) -> torch.Tensor:
    """Every vector of `parts` non-negative ints summing to `total`: [C(total + parts − 1, parts − 1), parts]."""
    rows = [c for c in itertools.product(range(total + 1), repeat=parts) if sum(c) == total]
    return torch.tensor(rows, dtype=torch.long).reshape(-1, parts)


def _log_multinomial(counts: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """log P(counts) for i.i.d. draws with level probabilities: counts [C, Lv], probs [n, Lv] -> [n, C] (−inf if a
    level with probability 0 is drawn)."""
    n_draws = int(counts[0].sum())
    coef = lgamma(n_draws + 1) - torch.lgamma(counts.double() + 1).sum(-1)  # [C]
    logp = torch.where(counts[None] > 0, counts[None] * probs[:, None].log(), 0.0)  # [n, C, Lv]
    return coef[None] + logp.sum(-1)


def _advantage(values: torch.Tensor, counts: torch.Tensor, own: torch.Tensor, scale: str, eps: float
               ) -> torch.Tensor:
    """Â of a group member with reward values[own] in a group with level counts `counts` (own included), as
    rl/advantages.group_advantages computes it. values [Lv]; counts [..., Lv]; own [...] level index -> [...]."""
    G = counts.sum(-1).double()
    mean = (counts * values).sum(-1) / G
    centred = values[own] - mean
    if scale == "none":
        adv = centred
    else:
        var = (counts * (values - mean[..., None]) ** 2).sum(-1) / (G - 1)
        adv = centred / (var.sqrt() + eps)
    all_equal = (counts > 0).sum(-1) == 1
    return torch.where(all_equal, torch.zeros_like(adv), adv)


@dataclass(frozen=True)
class AdvantageMoments:
    """Conditional moments of one group member's advantage given its own (and a second member's) reward level."""

    m1: torch.Tensor
    """[n, Lv] E[Â_1 | r_1 = level]."""
    m2: torch.Tensor
    """[n, Lv] E[Â_1² | r_1 = level]."""
    m11: torch.Tensor
    """[n, Lv, Lv] E[Â_1 Â_2 | r_1, r_2] (members 1 and 2 of the same group)."""


def advantage_moments(level_probs: torch.Tensor, values: torch.Tensor, G: int, scale: str = "group",
                      eps: float = ADV_EPS) -> AdvantageMoments:
    """level_probs [n, Lv]: each prompt's reward-level distribution under the rollout policy; values [Lv] the reward
    of each level; G generations per prompt; scale `group` (GRPO) or `none` (mean-only)."""
    if scale not in ("group", "none"):
        raise ValueError(f"scale={scale!r}: closed-form moments exist for 'group' and 'none' (per-group statistics); "
                         "'batch' couples the groups — simulate it instead.")
    if G < 2:
        raise ValueError(f"G={G}: group advantages need G >= 2.")
    n, Lv = level_probs.shape
    values = values.double()
    lv = torch.arange(Lv)
    others = compositions(G - 1, Lv)  # [C1, Lv]
    w1 = _log_multinomial(others, level_probs).exp()  # [n, C1]
    counts = others[None] + torch.eye(Lv, dtype=torch.long)[:, None]  # [Lv own, C1, Lv]
    adv = _advantage(values, counts, lv[:, None].expand(Lv, others.shape[0]), scale, eps)  # [Lv, C1]
    m1 = w1 @ adv.T  # [n, Lv]
    m2 = w1 @ (adv ** 2).T
    if G == 2:
        counts2 = (torch.eye(Lv, dtype=torch.long)[:, None] + torch.eye(Lv, dtype=torch.long)[None])[:, :, None]
        w2 = torch.ones(n, 1, dtype=torch.float64)
    else:
        rest = compositions(G - 2, Lv)  # [C2, Lv]
        w2 = _log_multinomial(rest, level_probs).exp()  # [n, C2]
        counts2 = (torch.eye(Lv, dtype=torch.long)[:, None, None] + torch.eye(Lv, dtype=torch.long)[None, :, None]
                   + rest[None, None])  # [Lv, Lv, C2, Lv]
    own1 = lv[:, None, None].expand(counts2.shape[:3])
    own2 = lv[None, :, None].expand(counts2.shape[:3])
    pair = _advantage(values, counts2, own1, scale, eps) * _advantage(values, counts2, own2, scale, eps)
    m11 = torch.einsum("nc,abc->nab", w2, pair)
    return AdvantageMoments(m1=m1, m2=m2, m11=m11)


@dataclass(frozen=True)
class Regime:
    """One rollout policy against the target, on the enumerated completions."""

    pi: torch.Tensor
    """[n, Y] π_old(y | x): the BF16 exact sampler (the target's sampling distribution)."""
    mu: torch.Tensor
    """[n, Y] μ(y | x): the rollout policy's sampler."""
    level: torch.Tensor
    """[n, Y] reward level index of each completion (reward = values[level])."""
    values: torch.Tensor
    """[Lv] reward of each level."""
    L: int
    """Completion length (dapo's token mean divides by N L)."""
    G: int = 8
    """Generations per prompt."""
    cap: float = 2.0
    """TIS cap C."""

    @property
    def log_w(self) -> torch.Tensor:
        """[n, Y] exact ℓ = log π_old − log μ (the weights here are the exact marginal ratios)."""
        return self.pi.log() - self.mu.log()

    @property
    def w_trunc(self) -> torch.Tensor:
        """[n, Y] min(e^ℓ, C), ℓ clamped to ±20 as rl/correction.py does."""
        return self.log_w.clamp(-20, 20).exp().clamp(max=self.cap)


def level_probs(q: torch.Tensor, level: torch.Tensor, Lv: int) -> torch.Tensor:
    """[n, Lv] reward-level distribution of q [n, Y]."""
    return torch.zeros(q.shape[0], Lv, dtype=torch.float64).scatter_add_(1, level, q.double())


def mean_coefficients(q: torch.Tensor, omega: torch.Tensor, level: torch.Tensor, m1: torch.Tensor, L: int
                      ) -> torch.Tensor:
    """E ĝ as a coefficient vector [K]: (1 / (n L)) q(y|x) ω(x, y) E[Â | r(x, y)] (q, ω, level [n, Y])."""
    n = q.shape[0]
    return (q * omega * m1.gather(1, level) / (n * L)).reshape(-1)


def group_second_moment(q: torch.Tensor, omega_a: torch.Tensor, omega_b: torch.Tensor, level: torch.Tensor,
                        mom: AdvantageMoments, gram: torch.Tensor, L: int, G: int) -> float:
    """E⟨u_a, u_b⟩_M of one group's terms under weights ω_a, ω_b (same group draws): the module doc's u."""
    n, Y = q.shape
    total = 0.0
    for x in range(n):
        block = gram[x * Y:(x + 1) * Y, x * Y:(x + 1) * Y]  # [Y, Y]
        lv = level[x]
        diag = (q[x] * omega_a[x] * omega_b[x] * mom.m2[x, lv] * block.diagonal()).sum()
        qa, qb = q[x] * omega_a[x], q[x] * omega_b[x]
        pair = mom.m11[x][lv][:, lv]  # [Y, Y]
        off = qa @ (pair * block) @ qb
        total += float(G * diag + G * (G - 1) * off)
    return total / (n * (G * L) ** 2)


def qform(a: torch.Tensor, b: torch.Tensor, gram: torch.Tensor) -> float:
    """⟨a, b⟩_M = aᵀ M b."""
    return float(a @ gram @ b)


@dataclass(frozen=True)
class MixtureMoments:
    """Exact first and second moments of ĝ_none and ĝ_TIS under μ, and the target a*: every AIS(λ) follows."""

    target: torch.Tensor
    """[K] a*: E ĝ_none under π_old (the BF16 exact sampler)."""
    mean_none: torch.Tensor
    """[K] E ĝ_none under μ."""
    mean_tis: torch.Tensor
    """[K] E ĝ_TIS under μ."""
    cov_unit: torch.Tensor
    """[2, 2] tr Cov(u_a, u_b) of one group's terms, a, b ∈ (none, TIS): the per-group (B = 1) covariance."""
    gram: torch.Tensor
    """[K, K] M."""

    def mean(self, lam: float) -> torch.Tensor:
        """[K] E ĝ_AIS(λ) = (1 − λ) E ĝ_none + λ E ĝ_TIS."""
        return (1 - lam) * self.mean_none + lam * self.mean_tis

    def bias_sq(self, lam: float) -> float:
        """‖E ĝ_AIS(λ) − g*‖²."""
        d = self.mean(lam) - self.target
        return qform(d, d, self.gram)

    def trace_var(self, lam: float, B: int) -> float:
        """tr Var ĝ_AIS(λ) with B prompt groups per batch."""
        c = torch.tensor([1 - lam, lam], dtype=torch.float64)
        return float(c @ self.cov_unit @ c) / B

    def mse(self, lam: float, B: int) -> float:
        """E‖ĝ_AIS(λ) − g*‖² = bias² + tr Var."""
        return self.bias_sq(lam) + self.trace_var(lam, B)

    def cosine(self, lam: float) -> float:
        """cos(E ĝ_AIS(λ), g*)."""
        m = self.mean(lam)
        return qform(m, self.target, self.gram) / (qform(m, m, self.gram) * qform(self.target, self.target,
                                                                                    self.gram)) ** 0.5

    def quadratic(self, B: int) -> tuple[float, float, float]:
        """(A0, A1, A2) with MSE(λ) = A0 + 2 λ A1 + λ² A2."""
        d = self.mean_none - self.target
        delta = self.mean_tis - self.mean_none
        c = self.cov_unit / B
        a0 = qform(d, d, self.gram) + float(c[0, 0])
        a1 = qform(d, delta, self.gram) + float(c[0, 1] - c[0, 0])
        a2 = qform(delta, delta, self.gram) + float(c[0, 0] - 2 * c[0, 1] + c[1, 1])
        return a0, a1, a2

    def lam_star(self, B: int) -> float:
        """The MSE-optimal fixed λ ∈ [0, 1] at B groups per batch."""
        _, a1, a2 = self.quadratic(B)
        return min(max(-a1 / a2, 0.0), 1.0) if a2 > 0 else 0.0

    def shift_rule(self, B: int) -> float:
        """The shift rule in its many-step limit: (E‖Δ‖² − tr Var Δ − tr Cov(ĝ_none, Δ)) / E‖Δ‖², Δ = ĝ_TIS − ĝ_none,
        which equals λ* when TIS is unbiased (then −⟨d_none, Δ⟩ = ‖E Δ‖²)."""
        delta = self.mean_tis - self.mean_none
        c = self.cov_unit / B
        var_delta = float(c[0, 0] - 2 * c[0, 1] + c[1, 1])
        cov_n_delta = float(c[0, 1] - c[0, 0])
        total = qform(delta, delta, self.gram) + var_delta
        return min(max((total - var_delta - cov_n_delta) / total, 0.0), 1.0) if total > 0 else 0.0

    def noise_rule(self, B: int) -> float:
        """The issue's form b̂² / (b̂² + v̂/N) in its many-step limit: ‖E Δ‖² / (‖E Δ‖² + tr Var ĝ_TIS)."""
        delta = self.mean_tis - self.mean_none
        b2 = qform(delta, delta, self.gram)
        v = float(self.cov_unit[1, 1]) / B
        return b2 / (b2 + v) if b2 + v > 0 else 0.0


def mixture_moments(regime: Regime, gram: torch.Tensor, scale: str = "group") -> MixtureMoments:
    """The exact moments of `regime` (module doc)."""
    Lv = regime.values.numel()
    mom_pi = advantage_moments(level_probs(regime.pi, regime.level, Lv), regime.values, regime.G, scale)
    mom_mu = advantage_moments(level_probs(regime.mu, regime.level, Lv), regime.values, regime.G, scale)
    ones = torch.ones_like(regime.mu)
    wt = regime.w_trunc
    target = mean_coefficients(regime.pi, ones, regime.level, mom_pi.m1, regime.L)
    mean_none = mean_coefficients(regime.mu, ones, regime.level, mom_mu.m1, regime.L)
    mean_tis = mean_coefficients(regime.mu, wt, regime.level, mom_mu.m1, regime.L)
    omegas = (ones, wt)
    means = (mean_none, mean_tis)
    cov = torch.empty(2, 2, dtype=torch.float64)
    for i, j in ((0, 0), (0, 1), (1, 1)):
        second = group_second_moment(regime.mu, omegas[i], omegas[j], regime.level, mom_mu, gram, regime.L, regime.G)
        cov[i, j] = cov[j, i] = second - qform(means[i], means[j], gram)
    return MixtureMoments(target=target, mean_none=mean_none, mean_tis=mean_tis, cov_unit=cov, gram=gram)
