"""The retry_storm detector's ladder classification (see detectors/retry_storm.py): the backoff class of
retry chains from their inter-send intervals (:func:`backoff_class`) and whether the clients retry in
phase (:func:`in_phase`). ``params`` is the detector's Params (its growth_ratio, fixed_ratio,
linear_step, jitter, no_timer, linear_preference and linear_consistency fields).
"""
from __future__ import annotations

import numpy as np
import polars as pl

def _fit(y: np.ndarray) -> tuple[float, np.ndarray]:
    """Least-squares slope of y over its index, and the residuals."""
    i = np.arange(y.size, dtype=np.float64)
    ic = i - i.mean()
    b = float((ic * (y - y.mean())).sum() / (ic * ic).sum())
    return b, y - (y.mean() + b * ic)


MAX_CLASSIFIED_CHAINS = 2000  # chains looked at for the backoff class (the first ones: enough to tell)
MIN_CHAIN_INTERVALS = 2  # a chain's growth is a slope: it needs two intervals (three sends)
MIN_MODEL_INTERVALS = 3  # linear and exponential fit two intervals equally well: they are compared from three
_RESIDUAL_FLOOR = 1e-12  # the linear model's relative residual divides by its value: never by zero


def backoff_class(intervals: list[np.ndarray], params) -> tuple[str, bool | None]:
    """Backoff class of retry chains from their inter-send intervals (one array per chain): "fixed" (no backoff),
    "linear", "exponential", "irregular" (intervals shrinking) or "unknown" (no chain with two intervals),
    and whether there is jitter (None when unknown).

    Per chain, the least-squares slope of log(interval) over the retry number is its growth per retry; the
    median over chains decides: at least ``growth_ratio`` is growing (exponential or linear, whichever model
    leaves the smaller residuals — log-space for exponential, relative for linear), within
    1/``fixed_ratio``..``growth_ratio`` a fixed timer unless the steps are consistently positive and at
    least ``linear_step`` of the interval (a linear backoff from a large base). Linear wins over exponential
    when its median residual is below ``linear_preference`` times the exponential one's (chains of
    MIN_MODEL_INTERVALS or more); "consistently positive" is at least ``linear_consistency`` of the steps.
    Jitter: the median absolute residual of the chosen model above ``jitter``; a "fixed" timer scattered
    beyond ``no_timer`` is "irregular" (what a forwarder relaying many clients looks like)."""
    chains = []
    for d in intervals[:MAX_CLASSIFIED_CHAINS]:
        d = np.asarray(d, dtype=np.float64)
        d = d[d > 0]
        if d.size >= MIN_CHAIN_INTERVALS:
            chains.append(d)
    if not chains:
        return "unknown", None
    fits = [_fit(np.log(d)) for d in chains]
    growth = float(np.exp(np.median([b for b, _ in fits])))
    exp_res = np.abs(np.concatenate([r for _, r in fits]))

    def linear_res():
        out = []
        for d in chains:
            b, r = _fit(d)
            out.append(np.abs(r) / np.maximum(d - r, _RESIDUAL_FLOOR))
        return np.concatenate(out)

    if growth >= params.growth_ratio:
        long_chains = [d for d in chains if d.size >= MIN_MODEL_INTERVALS]
        if long_chains:
            e_long = np.abs(np.concatenate([_fit(np.log(d))[1] for d in long_chains]))
            l_long = np.concatenate([np.abs(_fit(d)[1]) / np.maximum(d - _fit(d)[1], _RESIDUAL_FLOOR)
                                     for d in long_chains])
            if float(np.median(l_long)) < float(np.median(e_long)) * params.linear_preference:
                return "linear", float(np.median(linear_res())) > params.jitter
        return "exponential", float(np.median(exp_res)) > params.jitter
    if growth > 1.0 / params.fixed_ratio:
        steps = np.concatenate([np.diff(d) / np.median(d) for d in chains])
        if float(np.median(steps)) >= params.linear_step and float(np.mean(steps > 0)) >= params.linear_consistency:
            return "linear", float(np.median(linear_res())) > params.jitter
        dev = float(np.median(np.abs(np.concatenate([np.log(d / np.median(d)) for d in chains]))))
        if dev > params.no_timer:  # as scattered as independent arrivals: no timer to see
            return "irregular", True
        return "fixed", dev > params.jitter
    return "irregular", True


def in_phase(retries: pl.DataFrame, duration_ns: int, min_retries: int, min_clients: int) -> float | None:
    """Median distance from each retry to the nearest retry of *another* client (prev/next in time),
    as a share of what independent timers would give at the same rate (1 / (2 x rate)): near 0 when
    clients retry in phase, near 1 when not. None with fewer than ``min_clients`` clients or
    ``min_retries`` retries (retry_storm's sync_min_clients, sync_min_retries)."""
    if retries.height < min_retries or retries["client_id"].n_unique() < min_clients or duration_ns <= 0:
        return None
    r = retries.sort("ts", "client_id").with_columns(  # ties by client: the same in every run
        pl.when(pl.col("client_id").shift(1) != pl.col("client_id")).then(pl.col("ts") - pl.col("ts").shift(1))
        .alias("dp"),
        pl.when(pl.col("client_id").shift(-1) != pl.col("client_id")).then(pl.col("ts").shift(-1) - pl.col("ts"))
        .alias("dn"),
    ).select(pl.min_horizontal("dp", "dn").alias("nn")).drop_nulls()
    if r.height == 0:
        return None
    rate = retries.height / duration_ns
    return float(r["nn"].median()) * 2 * rate
