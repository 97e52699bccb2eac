"""Service response time charts: the latency distribution (log scale) and latency over time.

Input: transactions with the TRANSACTION_COMMON columns (``request_ts_ns``, ``latency_ns`` ...) and a
``series`` column naming what to colour by (protocol, operation or "protocol operation").
"""
from __future__ import annotations

import math

import altair as alt
import numpy as np
import polars as pl

from analyzer.durations import fmt_ns

from .base import MAX_ROWS, TIME_TITLE, empty, finish, nice_bin_ns

MAX_SERIES = 8
BINS_PER_DECADE = 10


def top_series(frame: pl.DataFrame, column: str = "series", k: int = MAX_SERIES) -> tuple[pl.DataFrame, str | None]:
    """Keep the ``k - 1`` busiest values of ``column`` and fold the rest into "other"."""
    counts = frame.group_by(column).len().sort("len", descending=True)
    if counts.height <= k:
        return frame, None
    keep = counts.head(k - 1)[column].implode()
    out = frame.with_columns(pl.when(pl.col(column).is_in(keep)).then(pl.col(column))
                             .otherwise(pl.lit("other")).alias(column))
    return out, f"the {k - 1} busiest of {counts.height} series shown, the rest as 'other'"


def latency_histogram(tx: pl.DataFrame, *, title: str = "Latency distribution") -> alt.Chart:
    """Counts of answered transactions in logarithmic latency bins (10 per decade), stacked by series.

    Always aggregated server-side (a bin per row, never a row per transaction); the subtitle says how
    many transactions are in it and how many unanswered ones have no latency to show.
    """
    answered = tx.filter(pl.col("latency_ns").is_not_null() & (pl.col("latency_ns") >= 0))
    unanswered = tx.height - answered.height
    if answered.height == 0:
        return empty("No answered transactions to draw.", title)
    answered, series_note = top_series(answered)
    ms = np.maximum(answered["latency_ns"].to_numpy().astype(np.float64) / 1e6, 1e-6)
    lo = math.floor(math.log10(ms.min()) * BINS_PER_DECADE) / BINS_PER_DECADE
    hi = math.ceil(math.log10(ms.max()) * BINS_PER_DECADE + 1e-9) / BINS_PER_DECADE
    if hi <= lo:
        hi = lo + 1 / BINS_PER_DECADE
    idx = np.floor((np.log10(ms) - lo) * BINS_PER_DECADE).astype(np.int64)
    binned = (answered.select("series").with_columns(pl.Series("bin", idx))
              .group_by("series", "bin").len("count")
              .with_columns((10 ** (lo + pl.col("bin") / BINS_PER_DECADE)).alias("from_ms"),
                            (10 ** (lo + (pl.col("bin") + 1) / BINS_PER_DECADE)).alias("to_ms"))
              .sort("bin", "series")
              # stacked here: a bar with x and x2 is ranged in x, so Vega-Lite would not stack it in y
              .with_columns(pl.col("count").cum_sum().over("bin").alias("top"))
              .with_columns((pl.col("top") - pl.col("count")).alias("bottom")))
    notes = [f"aggregated: {answered.height:,} answered transactions in {BINS_PER_DECADE} bins per decade",
             series_note, f"{unanswered:,} unanswered (no latency) not shown" if unanswered else None]
    chart = alt.Chart(binned).mark_bar(stroke="white", strokeWidth=0.3).encode(
        x=alt.X("from_ms:Q", title="latency (ms, log scale)", scale=alt.Scale(type="log")),
        x2="to_ms:Q",
        y=alt.Y("top:Q", title="transactions"), y2="bottom:Q",
        color=alt.Color("series:N", title=None),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip("from_ms:Q", format=".4g", title="from (ms)"),
                 alt.Tooltip("to_ms:Q", format=".4g", title="to (ms)"), alt.Tooltip("count:Q")],
    ).properties(height=260, width="container")
    return finish(chart, title, notes)


def latency_over_time(tx: pl.DataFrame, *, t0_ns: int, title: str = "Latency over time",
                      max_points: int = MAX_ROWS) -> alt.Chart:
    """Each answered transaction at its request time (log latency). Above ``max_points``: per time
    bin and series, p50, p99 and max lines instead (said in the subtitle); unanswered ones as ticks
    at the top when there are few enough."""
    answered = tx.filter(pl.col("latency_ns").is_not_null() & (pl.col("latency_ns") >= 0))
    if answered.height == 0:
        return empty("No answered transactions to draw.", title)
    answered, series_note = top_series(answered)
    notes = [series_note]
    y = alt.Y("latency_ms:Q", title="latency (ms, log scale)", scale=alt.Scale(type="log"))
    if answered.height <= max_points:
        data = answered.select(
            "series", "client", "server", "operation", "resource", "request_frame",
            ((pl.col("request_ts_ns") - t0_ns) / 1e9).alias("t_s"),
            (pl.col("latency_ns").clip(lower_bound=1) / 1e6).alias("latency_ms"))
        chart = alt.Chart(data).mark_circle(size=22, opacity=0.7).encode(
            x=alt.X("t_s:Q", title=TIME_TITLE), y=y, color=alt.Color("series:N", title=None),
            tooltip=[alt.Tooltip("series:N"), alt.Tooltip("t_s:Q", format=".6f"),
                     alt.Tooltip("latency_ms:Q", format=".4g"), alt.Tooltip("client:N"),
                     alt.Tooltip("server:N"), alt.Tooltip("resource:N"),
                     alt.Tooltip("request_frame:Q", title="frame")])
    else:
        span = int(answered["request_ts_ns"].max() - answered["request_ts_ns"].min()) or 1
        bin_ns = nice_bin_ns(span, 200)
        stats = (answered.with_columns(((pl.col("request_ts_ns") - t0_ns) // bin_ns).alias("bin"))
                 .group_by("series", "bin")
                 .agg(pl.col("latency_ns").quantile(0.5, "nearest").alias("p50"),
                      pl.col("latency_ns").quantile(0.99, "nearest").alias("p99"),
                      pl.col("latency_ns").max().alias("max"), pl.len().alias("n"))
                 .unpivot(["p50", "p99", "max"], index=["series", "bin", "n"], variable_name="stat",
                          value_name="latency_ns")
                 .with_columns((pl.col("bin") * bin_ns / 1e9).alias("t_s"),
                               (pl.col("latency_ns").clip(lower_bound=1) / 1e6).alias("latency_ms"))
                 .sort("series", "stat", "bin"))
        stats, thin_note = _cap_rows(stats, max_points)
        notes += [f"aggregated: {answered.height:,} transactions → p50/p99/max per "
                  f"{fmt_ns(bin_ns)} bin", thin_note]
        chart = alt.Chart(stats).mark_line(point=alt.OverlayMarkDef(size=12)).encode(
            x=alt.X("t_s:Q", title=TIME_TITLE), y=y, color=alt.Color("series:N", title=None),
            strokeDash=alt.StrokeDash("stat:N", title="per bin", sort=["p50", "p99", "max"]),
            detail="stat:N",
            tooltip=[alt.Tooltip("series:N"), alt.Tooltip("stat:N"), alt.Tooltip("t_s:Q", format=".3f"),
                     alt.Tooltip("latency_ms:Q", format=".4g"), alt.Tooltip("n:Q", title="transactions")])
    return finish(chart.properties(height=280, width="container").interactive(bind_y=False), title, notes)


def _cap_rows(frame: pl.DataFrame, max_rows: int) -> tuple[pl.DataFrame, str | None]:
    if frame.height <= max_rows:
        return frame, None
    # too many series × bins: keep the series with the most transactions
    series = (frame.group_by("series").agg(pl.col("n").sum()).sort("n", descending=True)["series"].to_list())
    per = frame.height / len(series)
    keep = series[: max(1, int(max_rows // per))]
    return frame.filter(pl.col("series").is_in(keep)), f"sampled: {len(keep)} of {len(series)} series drawn"
