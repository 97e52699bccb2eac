"""The window sums of detectors/saturation_windows.py in one Numba pass per kind of event: per group and
sliding window, the requests sent in it (count, retries, median and mean latency), the answers that
arrived in it (count) and the time integral of the outstanding count over it (:func:`outstanding_area`). Windows are listed only where they hold an event (what a group-by of every event
exploded once per window containing it would list), without building that exploded frame (one row per
event and window: several times the requests)."""
from __future__ import annotations

import numpy as np

from analyzer.jit import njit


@njit(cache=True, inline="always")
def _new_windows(t_i, last_k, step, window):
    """(first, last) window holding time ``t_i`` that its group has not listed yet (windows up to
    ``last_k`` are): window k covers [k step, k step + window); empty when last < first."""
    lo = (t_i - window) // step + 1
    if lo < 0:
        lo = 0
    if lo <= last_k:
        lo = last_k + 1
    return lo, t_i // step


@njit(cache=True)
def _count_windows(g, t, step, window):
    """How many (group, window) pairs hold an event: ``g``, ``t`` sorted by group, then time (t >= 0)."""
    n = t.shape[0]
    out = 0
    last_g = 0
    last_k = -1
    for i in range(n):
        if i == 0 or g[i] != last_g:
            last_g = g[i]
            last_k = -1
        lo, hi = _new_windows(t[i], last_k, step, window)
        if hi >= lo:
            out += hi - lo + 1
            last_k = hi
    return out


@njit(cache=True)
def _windows_of(g, t, step, window, m):
    """The (group, window) pairs holding an event (window k covers [k step, k step + window)), in order,
    with the first and one-past-last event of each: sorted input as :func:`_count_windows`, ``m`` its count."""
    wg = np.empty(m, np.int64)
    wk = np.empty(m, np.int64)
    lo_ix = np.empty(m, np.int64)
    hi_ix = np.empty(m, np.int64)
    n = t.shape[0]
    j = 0
    last_g = 0
    last_k = -1
    for i in range(n):
        if i == 0 or g[i] != last_g:
            last_g = g[i]
            last_k = -1
        lo, hi = _new_windows(t[i], last_k, step, window)
        for k in range(lo, hi + 1):
            # events of this group in [k step, k step + window): event i is the first (every earlier one
            # lies before k step: their last window is at most last_k < k), the run ends at y
            end = k * step + window
            y = i + 1
            while y < n and g[y] == last_g and t[y] < end:
                y += 1
            wg[j] = last_g
            wk[j] = k
            lo_ix[j] = i
            hi_ix[j] = y
            j += 1
        if hi >= lo:
            last_k = hi
    return wg, wk, lo_ix, hi_ix


@njit(cache=True)
def _send_sums(lo_ix, hi_ix, retries, lat, has_lat):
    """Per window: retries summed, median and mean latency of the events that have one (NaN: none)."""
    m = lo_ix.shape[0]
    rsum = np.zeros(m, np.int64)
    med = np.full(m, np.nan)
    mean = np.full(m, np.nan)
    for j in range(m):
        a, b = lo_ix[j], hi_ix[j]
        s = 0
        cnt = 0
        for x in range(a, b):
            s += retries[x]
            if has_lat[x]:
                cnt += 1
        rsum[j] = s
        if cnt:
            v = np.empty(cnt, np.float64)
            c = 0
            for x in range(a, b):
                if has_lat[x]:
                    v[c] = lat[x]
                    c += 1
            med[j] = np.median(v)
            mean[j] = v.sum() / cnt
    return rsum, med, mean


def _fixed(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as a C-contiguous read-only array of ``dtype``: one kernel signature whatever the caller passes
    (Polars hands out read-only views or fresh copies; each flavour would compile, and cache, its own)."""
    v = np.ascontiguousarray(a, dtype=dtype).view()
    v.flags.writeable = False
    return v


def windows_holding(g: np.ndarray, t: np.ndarray, step: int, window: int):
    """(group, window, first event, one past the last event) of every window holding an event; ``g``, ``t``
    (t >= 0) sorted by group, then time."""
    g, t = _fixed(g, np.int64), _fixed(t, np.int64)
    m = _count_windows(g, t, int(step), int(window))
    return _windows_of(g, t, int(step), int(window), m)


def send_sums(lo_ix: np.ndarray, hi_ix: np.ndarray, retries: np.ndarray, lat: np.ndarray, has_lat: np.ndarray):
    """Per window (the events lo_ix..hi_ix of :func:`windows_holding`): retries, median and mean latency."""
    return _send_sums(_fixed(lo_ix, np.int64), _fixed(hi_ix, np.int64), _fixed(retries, np.int64),
                      _fixed(lat, np.float64), _fixed(has_lat, np.bool_))


@njit(cache=True)
def _prefix_sums(v):
    """0, v0, v0 + v1, ... (added in order, as numpy's cumsum)."""
    out = np.empty(v.shape[0] + 1, np.float64)
    out[0] = 0.0
    for i in range(v.shape[0]):
        out[i + 1] = out[i] + v[i]
    return out


@njit(cache=True)
def _area_to(g, v, cs, grp, t):
    """How many points of group ``grp`` lie below ``t`` (``g``, ``v`` sorted by group, then value), times
    ``t``, minus their sum: the time integral up to ``t`` of how many of them have passed."""
    lo = np.searchsorted(g, grp, side="left")
    hi = np.searchsorted(g, grp, side="right")
    below = lo + np.searchsorted(v[lo:hi], t, side="left")
    return float(below - lo) * t - (cs[below] - cs[lo])


@njit(cache=True)
def _outstanding_area(g_s, s, g_e, e, g_q, a, b):
    cs_s = _prefix_sums(s)
    cs_e = _prefix_sums(e)
    m = g_q.shape[0]
    out = np.empty(m, np.float64)
    for q in range(m):
        at_b = _area_to(g_s, s, cs_s, g_q[q], b[q]) - _area_to(g_e, e, cs_e, g_q[q], b[q])
        at_a = _area_to(g_s, s, cs_s, g_q[q], a[q]) - _area_to(g_e, e, cs_e, g_q[q], a[q])
        out[q] = at_b - at_a
    return out


def outstanding_area(g_s: np.ndarray, s: np.ndarray, g_e: np.ndarray, e: np.ndarray, g_q: np.ndarray,
                     a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per query window [a, b) of group g_q: the time integral of the outstanding count (requests sent,
    ``s``, minus requests ended, ``e``; each float64 and sorted by group, then time, their groups in
    ``g_s``, ``g_e``) over it. The prefix sums run over all groups in order, so the result is the same to
    the last bit as one sorted cumulative sum over every group at once."""
    return _outstanding_area(_fixed(g_s, np.int64), _fixed(s, np.float64), _fixed(g_e, np.int64),
                             _fixed(e, np.float64), _fixed(g_q, np.int64), _fixed(a, np.float64),
                             _fixed(b, np.float64))
