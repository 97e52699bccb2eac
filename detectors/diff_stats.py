"""Distribution-free confidence intervals for quantiles, from order statistics (``herdscope diff``).

Of ``n`` independent latencies, the number ``B`` at or below the true ``q``-quantile is Binomial(n, q),
whatever the latencies' distribution. So with the sample sorted (``x_1 <= ... <= x_n``, 1-based):

- ``x_l`` is a lower bound at one-sided confidence ``1 - a``: ``P(x_l <= quantile) = P(B >= l)``; ``l``
  is the largest index with ``P(B <= l - 1) <= a``. When even ``P(B = 0) > a`` there is no lower bound.
- ``x_u`` is an upper bound: ``P(x_u >= quantile) = P(B <= u - 1)``; ``u`` is the smallest index with
  ``P(B <= u - 1) >= 1 - a``. When even ``u = n`` falls short (``q**n > a``) there is none: the sample is
  too small to bound that quantile from above (p99 at 95 % needs 368 latencies: :func:`samples_for_upper_bound`).

A two-sided interval at ``confidence`` puts ``a = (1 - confidence) / 2`` on each side (Hahn & Meeker,
*Statistical Intervals*, 2nd ed., §5.2; Conover, *Practical Nonparametric Statistics*, §3.2). The
binomial CDF is computed exactly (log-space cumulative sums, no normal approximation). The point
estimates themselves stay :mod:`analyzer.stats`' ("higher" rule); this module only bounds them.

Shares (errors, unanswered requests, retransmitted segments) get Wilson's score interval for a binomial
proportion (Wilson 1927; Brown, Cai & DasGupta, *Statistical Science* 16(2), 2001, recommend it over the
normal-approximation interval for small counts and shares near 0). Retransmissions come in bursts, not
independently per segment, so their interval is narrower than the truth: requiring the two intervals
not to overlap keeps the test conservative.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


def binomial_cdf(n: int, q: float) -> np.ndarray:
    """``P(B <= k)`` for ``k = 0 .. n``, B ~ Binomial(n, q), exactly (0 < q < 1)."""
    k = np.arange(1, n + 1, dtype=np.float64)
    log_comb = np.concatenate(([0.0], np.cumsum(np.log((n - k + 1) / k))))
    ks = np.arange(n + 1, dtype=np.float64)
    log_pmf = log_comb + ks * math.log(q) + (n - ks) * math.log1p(-q)
    # the largest term is at least 1 / (n + 1), so exp() loses only terms too small to matter
    return np.minimum(np.cumsum(np.exp(log_pmf)), 1.0)


def order_statistic_bounds(n: int, q: float, confidence: float) -> tuple[int | None, int | None]:
    """1-based indices ``(l, u)`` of the sorted sample bounding the ``q``-quantile at two-sided
    ``confidence``; None for a side the sample is too small to bound."""
    if n <= 0:
        return None, None
    tail = (1.0 - confidence) / 2.0
    cdf = binomial_cdf(n, q)  # cdf[k] = P(B <= k)
    below = np.nonzero(cdf <= tail)[0]  # k = l - 1 with P(B <= l - 1) <= tail
    lower = int(below[-1]) + 1 if below.size else None
    if lower is not None and lower > n:
        lower = None
    above = np.nonzero(cdf[:n] >= 1.0 - tail)[0]  # k = u - 1 < n with P(B <= u - 1) >= 1 - tail
    upper = int(above[0]) + 1 if above.size else None
    return lower, upper


def quantile_interval(sorted_values: np.ndarray, q: float, confidence: float) -> tuple[int | None, int | None]:
    """``(low, high)``: the values bounding the ``q``-quantile of ``sorted_values`` (ascending) at two-sided
    ``confidence``; None for a side that cannot be bounded with this many values."""
    lower, upper = order_statistic_bounds(len(sorted_values), q, confidence)
    return (int(sorted_values[lower - 1]) if lower else None, int(sorted_values[upper - 1]) if upper else None)


def samples_for_upper_bound(q: float, confidence: float) -> int:
    """The fewest values for which the ``q``-quantile has an upper bound at two-sided ``confidence``:
    the smallest n with ``q**n <= (1 - confidence) / 2`` (p99 at 0.95: 368; p50: 6)."""
    return math.ceil(math.log((1.0 - confidence) / 2.0) / math.log(q) - 1e-12)


def share_interval(hits: int, n: int, confidence: float) -> tuple[float, float] | None:
    """``(low, high)``: Wilson's two-sided ``confidence`` interval for the share ``hits / n`` (module
    doc); None without any trial."""
    if n <= 0:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def share_verdict(before: tuple[int, int], after: tuple[int, int], confidence: float) -> dict:
    """Two shares, each ``(hits, trials)``: their intervals and ``significant increase``, ``significant
    decrease`` or ``no significant change`` (the intervals overlap)."""
    b_ci, a_ci = share_interval(*before, confidence), share_interval(*after, confidence)
    out = {"before_ci": list(b_ci) if b_ci else None, "after_ci": list(a_ci) if a_ci else None}
    level = f"{confidence * 100:g}%"
    if b_ci and a_ci and a_ci[0] > b_ci[1]:
        return {**out, "verdict": "significant increase",
                "why": f"AFTER's {level} interval starts at {a_ci[0]:.4%}, above BEFORE's end {b_ci[1]:.4%}"}
    if b_ci and a_ci and a_ci[1] < b_ci[0]:
        return {**out, "verdict": "significant decrease",
                "why": f"AFTER's {level} interval ends at {a_ci[1]:.4%}, below BEFORE's start {b_ci[0]:.4%}"}
    return {**out, "verdict": "no significant change", "why": f"the {level} intervals overlap"}
