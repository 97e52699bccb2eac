"""The herd detector's search (see detectors/herd.py for what a herd is): maximal-scoring segments
of a key's arrivals against a herd rate (one Numba pass per rung), the ladder of finer rates that
splits a segment too long to be a herd, and per-window server statistics by binary search."""
from __future__ import annotations

import numpy as np
import polars as pl

from analyzer.jit import njit

S = 1_000_000_000


# -- each key's baseline ---------------------------------------------------------------------------

@njit(cache=True)
def key_baselines(key, t, min_arrivals, bin_ns, min_bins):
    """Per arrival (sorted by ``key``, then time ``t``): whether its key has at least ``min_arrivals``
    arrivals, and its key's median arrivals per bin of ``bin_ns`` from the key's first arrival to its
    last, empty bins included (0 over fewer than ``min_bins`` bins: there is no baseline). One pass
    over sorted integers: counting per (key, bin) with a hash table was ~535 MB at 7.2M arrivals."""
    n = t.shape[0]
    enough = np.zeros(n, np.bool_)
    median = np.zeros(n, np.float64)
    counts = np.empty(n, np.int64)  # a key's nonzero bin counts (scratch)
    i = 0
    while i < n:
        j = i
        while j < n and key[j] == key[i]:
            j += 1
        if j - i >= min_arrivals:
            k0 = t[i]
            nb = (t[j - 1] - k0) // bin_ns + 1
            nz = 0
            last_bin = -1
            for r in range(i, j):
                b = (t[r] - k0) // bin_ns
                if b != last_bin:
                    counts[nz] = 0
                    nz += 1
                    last_bin = b
                counts[nz - 1] += 1
            zeros = nb - nz
            mid = (nb - 1) // 2
            value = 0.0
            if nb >= min_bins and mid >= zeros:
                value = float(np.sort(counts[:nz])[mid - zeros])
            for r in range(i, j):
                enough[r] = True
                median[r] = value
        i = j
    return enough, median


# -- the segment search ----------------------------------------------------------------------------

# Work bound of the segment search on hostile input (scan steps per arrival, see _kadane_segments).
_RESCAN_STEPS_PER_ARRIVAL = 64


@njit(cache=True)
def _kadane_segments(key, t, lam, min_events):
    """Maximal-scoring segments of (1 per arrival - lam[k] per ns) in each run of equal ``key``
    (arrivals sorted by key, then time). Returns the segment number per arrival (-1: none) for
    segments of at least ``min_events`` arrivals.

    A scan from ``start`` runs while its score stays positive and ends its segment at the peak;
    the next scan starts right after the peak, not where the score ran out: the arrivals between
    (another burst that did not lift the score above the first one's peak) are searched again.
    Past ``_RESCAN_STEPS_PER_ARRIVAL`` steps per arrival (adversarial input) scans continue
    where the score ran out instead, which keeps the work linear."""
    n = t.shape[0]
    seg = np.full(n, -1, np.int64)
    nseg = 0
    budget = _RESCAN_STEPS_PER_ARRIVAL * n + n
    steps = 0
    i = 0
    while i < n:
        j = i
        while j < n and key[j] == key[i]:
            j += 1
        k = i
        while k < j:
            start = k
            cur = 1.0
            peak = 1.0
            peak_end = k
            m = k + 1
            while m < j:
                cand = cur - lam[m] * float(t[m] - t[m - 1])
                if cand <= 0.0:
                    break
                cur = cand + 1.0
                if cur > peak:
                    peak = cur
                    peak_end = m
                m += 1
            steps += m - k
            if peak_end - start + 1 >= min_events:
                for x in range(start, peak_end + 1):
                    seg[x] = nseg
                nseg += 1
            k = peak_end + 1 if steps <= budget else m
        i = j
    return seg


# The finer rates a too-long segment is searched again at: a fixed ladder of sqrt(2) steps (per second)
# shared by every parameter setting, so the rates tried for a stricter setting are a subset of those
# tried for a looser one. A segment longer than max_span_ns at rate lam has more than lam x
# max_span_ns arrivals, so the ladder ends after at most log2(arrivals) doublings; the cap only
# bounds hostile input.
_LADDER_STEPS_PER_DOUBLING = 2
_MAX_LADDER_STEPS = 160


def _next_rung(lam: pl.Expr) -> pl.Expr:
    """The first rung of the ladder above ``lam`` (per ns)."""
    k = _LADDER_STEPS_PER_DOUBLING
    return 2.0 ** ((((lam * S).log(2) * k).floor() + 1) / k) / S


def _best_parts(arr: pl.DataFrame, min_events: int, trim_factor: float) -> pl.DataFrame:
    """One pass: the maximum-scoring segments of ``arr`` (grp, request_ts_ns, lam; sorted) with at
    least ``min_events`` arrivals (``seg``), each trimmed to its best part at 1/``trim_factor`` of its
    own rate (``keep``: the arrival is in the trimmed part)."""
    seg = _kadane_segments(arr["grp"].to_numpy(), arr["request_ts_ns"].to_numpy(), arr["lam"].to_numpy(),
                           min_events)
    arr = arr.with_columns(pl.Series("seg", seg)).filter(pl.col("seg") >= 0)
    if arr.height == 0:
        return arr.with_columns(pl.lit(True).alias("keep"))
    # Trim: a low lambda lets a segment run into background that arrives at about lambda; the herd
    # is the core where arrivals are far denser. Search again inside each segment at 1/trim_factor
    # of the segment's own rate (when that is above lambda), and keep the best part.
    arr = arr.with_columns(
        pl.max_horizontal(pl.col("lam"), pl.len().over("seg") / trim_factor
                          / (pl.col("request_ts_ns").max() - pl.col("request_ts_ns").min() + 1).over("seg"))
        .alias("lam2"))
    sub = _kadane_segments(arr["seg"].to_numpy(), arr["request_ts_ns"].to_numpy(), arr["lam2"].to_numpy(),
                           min_events)
    arr = arr.with_columns(pl.Series("sub", sub))
    best = (arr.filter(pl.col("sub") >= 0).group_by("seg", "sub").len()
            .sort("len", "sub", descending=[True, False]).unique("seg", keep="first", maintain_order=True))
    return arr.join(best.select("seg", "sub", pl.lit(True).alias("keep")), on=["seg", "sub"], how="left").with_columns(
        pl.col("keep").fill_null(False)).drop("lam2", "sub")


def herd_segments(arrivals: pl.DataFrame, params) -> pl.DataFrame:
    """The herds among a key's arrivals (grp = the key, lam = its herd rate): the arrivals of each
    herd, numbered by ``seg``.

    A segment found at ``lam`` (and trimmed) is a herd when it holds at least ``min_clients``
    distinct clients and lasts at most ``max_span_ns``. A longer one is not dropped: a low ``lam``
    (a small ``min_clients``) lets herds and the load between them merge into one long segment,
    and the herds are still inside it, so it is searched again at the next rung of a fixed ladder
    of higher rates, until its parts are short enough or too small; so is what the trim cut off a
    herd's segment. Lowering ``min_clients`` or
    ``rate_factor`` (a lower ``lam``) or raising ``max_span_ns`` therefore never loses a herd that a
    stricter setting finds: the stricter setting's segments lie inside the looser one's."""
    mc, max_span = int(params.min_clients), int(params.max_span_ns)
    work = arrivals.sort("grp", "request_ts_ns", "_row")  # _row: ties in time the same way in every run
    found, next_id = [], 0
    for _ in range(_MAX_LADDER_STEPS):
        if work.height < mc:
            break
        parts = _best_parts(work, mc, float(params.trim_factor))
        if parts.height == 0:
            break
        parts = parts.with_columns(pl.col("seg") + next_id)
        next_id = int(parts["seg"].max()) + 1
        core = parts.filter(pl.col("keep"))
        nodes = core.group_by("seg").agg(
            pl.col("cid").n_unique().alias("_c"),
            (pl.col("request_ts_ns").max() - pl.col("request_ts_ns").min()).alias("_span"))
        big = nodes.filter(pl.col("_c") >= mc)
        herds = big.filter(pl.col("_span") <= max_span)["seg"]
        found.append(core.filter(pl.col("seg").is_in(herds.implode())).drop("keep"))
        longer = big.filter(pl.col("_span") > max_span)["seg"]
        # the next rung: the whole of a segment too long to be a herd, and what the trim cut off
        # the others (another herd may be there)
        work = (parts.filter(pl.col("seg").is_in(longer.implode()) | ~pl.col("keep"))
                .with_columns(pl.col("seg").alias("grp"), _next_rung(pl.col("lam")).alias("lam"))
                .drop("seg", "keep").sort("grp", "request_ts_ns", "_row"))
    found = [f for f in found if f.height]
    if not found:
        return arrivals.clear().with_columns(pl.lit(0, pl.Int64).alias("seg"))
    return pl.concat(found)



# -- window statistics ----------------------------------------------------------------------------

LATENCY_QUANTILE = 0.99  # the server latency compared during and before a herd is its p99

@njit(cache=True)
def _window_stats(lat, failed, answered, lo, hi):
    """Per window [lo, hi) of one server's time-sorted requests: p99 latency (linear, NaN latencies
    left out), failure share, answered count and requests (NaN / 0 where the window is empty)."""
    m = lo.shape[0]
    p99 = np.full(m, np.nan)
    fail = np.full(m, np.nan)
    ans = np.zeros(m, np.int64)
    n = np.zeros(m, np.int64)
    for i in range(m):
        a, b = lo[i], hi[i]
        n[i] = b - a
        if b <= a:
            continue
        fail[i] = failed[a:b].mean()
        ans[i] = answered[a:b].sum()
        v = lat[a:b]
        v = v[~np.isnan(v)]
        if v.shape[0]:
            p99[i] = np.quantile(v, LATENCY_QUANTILE)
    return p99, fail, ans, n


# what :func:`stats_columns` reads of a server's requests, as the columns of one frame (sorted by time)
WINDOW_COLUMNS = ("request_ts_ns", "_latency", "_failed", "_answered")


def window_columns() -> list[pl.Expr]:
    """:data:`WINDOW_COLUMNS` of a frame of requests (``request_ts_ns``, ``latency_ns``, ``failed``,
    ``answered``): the latency as a float (NaN when none), failed as a float, answered as an integer."""
    return [pl.col("request_ts_ns"), pl.col("latency_ns").cast(pl.Float64).fill_null(np.nan).alias("_latency"),
            pl.col("failed").cast(pl.Float64).alias("_failed"), pl.col("answered").cast(pl.Int64).alias("_answered")]


def stats_columns(arrays: tuple[np.ndarray, ...], lo_t: np.ndarray, hi_t: np.ndarray, hi_side: str,
                  suffix: str) -> dict[str, np.ndarray]:
    """Per window from ``lo_t`` to ``hi_t`` (``hi_side``: "right" includes a request at ``hi_t``) of one
    server's requests (``arrays``: :data:`WINDOW_COLUMNS`, sorted by time): p99 latency, failure share,
    answered and requests, suffixed ``suffix``."""
    t, latency, failed, answered = arrays
    lo = np.searchsorted(t, lo_t, "left")
    hi = np.searchsorted(t, hi_t, hi_side)
    p99, fail, ans, n = _window_stats(latency, failed, answered, lo, hi)
    return {f"p99_{suffix}": p99, f"fail_{suffix}": fail, f"answered_{suffix}": ans, f"n_{suffix}": n}
