"""Statistics of the pre-registered study: paired t-tests, Holm's step-down correction, an equivalence test (TOST),
the smallest effect a design can detect, and the lagged cross-correlation of two per-step series.

Pure functions over Python floats (no scipy): the Student-t distribution function comes from the regularized
incomplete beta function (Lentz's continued fraction), accurate to ~1e-10 over the range a study uses.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence


# --------------------------------------------------------------------------------------------------- t distribution
def _betacf(a: float, b: float, x: float, iters: int = 300, eps: float = 1e-15) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, iters + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0, 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom."""
    if not math.isfinite(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """The t value with P(T <= t) = p (bisection on `t_sf`; |t| < 1e4). Cached: reports ask for the same few
    (0.975, n − 1) thousands of times, each a 200-step bisection."""
    lo, hi = -1e4, 1e4
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 1.0 - t_sf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# ------------------------------------------------------------------------------------------------------- tests
def _mean_sd(diffs: Sequence[float]) -> tuple[float, float, int]:
    vals = [float(d) for d in diffs if math.isfinite(float(d))]
    n = len(vals)
    if n < 2:
        return (vals[0] if vals else math.nan), math.nan, n
    m = sum(vals) / n
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1)), n


def paired_t(diffs: Sequence[float], alternative: str = "two-sided") -> dict:
    """Paired t-test of mean(diffs) = 0 over per-seed differences: mean, sd, n, t, p (two-sided, greater or less)
    and the two-sided 95 % t-interval. A zero sd gives t = ±inf (or NaN when the mean is 0 too)."""
    m, sd, n = _mean_sd(diffs)
    out = {"mean": m, "sd": sd, "n": n, "t": math.nan, "p": math.nan, "ci95": [math.nan, math.nan],
           "alternative": alternative}
    if n < 2:
        return out
    se = sd / math.sqrt(n)
    t = m / se if se > 0 else (math.copysign(math.inf, m) if m != 0 else math.nan)
    if math.isnan(t):
        p = 1.0
    elif alternative == "greater":
        p = t_sf(t, n - 1)
    elif alternative == "less":
        p = t_sf(-t, n - 1)
    else:
        p = min(1.0, 2.0 * t_sf(abs(t), n - 1))
    half = t_quantile(0.975, n - 1) * se
    out.update(t=t, p=p, ci95=[m - half, m + half])
    return out


def tost(diffs: Sequence[float], margin: float) -> dict:
    """Equivalence test (two one-sided t-tests) of |mean(diffs)| < margin: p = max of the two one-sided p-values;
    equivalence at level α iff p < α (the 1 − 2α interval lies inside ±margin)."""
    if margin <= 0:
        raise ValueError(f"equivalence margin={margin} must be > 0.")
    m, sd, n = _mean_sd(diffs)
    out = {"mean": m, "sd": sd, "n": n, "margin": margin, "p": math.nan, "p_lower": math.nan, "p_upper": math.nan}
    if n < 2:
        return out
    se = sd / math.sqrt(n)
    if se == 0:
        p_low = p_up = 0.0 if abs(m) < margin else 1.0
    else:
        p_low = t_sf((m + margin) / se, n - 1)  # H0: mean <= -margin
        p_up = t_sf((margin - m) / se, n - 1)  # H0: mean >= +margin
    out.update(p=max(p_low, p_up), p_lower=p_low, p_upper=p_up)
    return out


def holm(pvalues: Mapping[str, float], alpha: float = 0.05) -> dict[str, dict]:
    """Holm's step-down correction of a family of p-values: per name the raw p, the adjusted p
    (max over j <= rank of (m − j + 1) · p_(j), capped at 1) and whether it is rejected at family-wise `alpha`.
    NaN p-values (a comparison that could not be computed) stay NaN, are never rejected, and still count in m."""
    names = list(pvalues)
    m = len(names)
    order = sorted(names, key=lambda k: (math.isnan(pvalues[k]), pvalues[k]))
    out: dict[str, dict] = {}
    running = 0.0
    for rank, name in enumerate(order):
        p = float(pvalues[name])
        if math.isnan(p):
            out[name] = {"p": p, "p_holm": math.nan, "rejected": False}
            continue
        running = max(running, min(1.0, (m - rank) * p))
        out[name] = {"p": p, "p_holm": running, "rejected": running <= alpha}
    return {k: out[k] for k in names}


def min_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8, tests: int = 1) -> float:
    """Smallest true mean of a paired difference a two-sided paired t-test on `n` pairs detects with `power` at level
    alpha / tests (Bonferroni bound of Holm's first step): (t_{1−α/2m, n−1} + t_{power, n−1}) · sd / √n."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    a = alpha / tests
    return (t_quantile(1 - a / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


# ------------------------------------------------------------------------------------------ cross-correlation
def lagged_xcorr(x: Sequence[float], y: Sequence[float], max_lag: int) -> dict[int, float]:
    """Pearson correlation of x[t] with y[t + k] for k in −max_lag..max_lag, over the steps both define.

    A peak at k > 0 means x moves first and y follows k steps later (x leads y); k < 0: x lags y. Non-finite pairs
    are dropped; lags with fewer than 3 pairs or a constant side give NaN."""
    xs, ys = [float(v) for v in x], [float(v) for v in y]
    n = min(len(xs), len(ys))
    out: dict[int, float] = {}
    for k in range(-max_lag, max_lag + 1):
        pairs = [(xs[t], ys[t + k]) for t in range(max(0, -k), min(n, n - k))
                 if math.isfinite(xs[t]) and math.isfinite(ys[t + k])]
        if len(pairs) < 3:
            out[k] = math.nan
            continue
        a, b = zip(*pairs, strict=True)
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        va = sum((v - ma) ** 2 for v in a)
        vb = sum((v - mb) ** 2 for v in b)
        cov = sum((u - ma) * (v - mb) for u, v in pairs)
        out[k] = cov / math.sqrt(va * vb) if va > 0 and vb > 0 else math.nan
    return out


def peak_lag(xcorr: Mapping[int, float], sign: int = 1) -> tuple[int | None, float]:
    """The lag with the largest `sign` · correlation (sign −1: the most negative one) and that correlation."""
    finite = [(k, c) for k, c in xcorr.items() if math.isfinite(c)]
    if not finite:
        return None, math.nan
    k, c = max(finite, key=lambda kc: (sign * kc[1], -abs(kc[0])))
    return k, c


def differences(series: Sequence[float]) -> list[float]:
    """First differences s[t+1] − s[t] (cross-correlating changes, not levels, avoids trend-driven peaks)."""
    return [b - a for a, b in zip(series[:-1], series[1:], strict=True)]
