"""The proof of a detector without a chart of its own: its evidence frames on the time axis."""
from __future__ import annotations

import altair as alt
import polars as pl

from .base import TIME_TITLE, empty, finish, opening_view, seconds_domain, thin, window_rect, x_scale


def evidence_timeline(rows: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                      view_ns: tuple[int, int] | None = None, title: str = "Evidence frames") -> alt.Chart:
    """One mark per evidence frame at its time, one row per source → destination, the finding's
    window shaded. Opens on ``view_ns`` (default: the window with context).

    ``rows``: :func:`dashboards.frames.packet_rows` (``frame``, ``time_s`` since ``t0_ns``, ``src``,
    ``sport``, ``dst``, ``dport``, ``wirelen``)."""
    if rows.height == 0:
        return empty("None of the finding's evidence frames is in this capture.", title)
    notes = []
    view = opening_view(window_ns, view_ns, notes)
    xscale = x_scale(view, t0_ns)
    data = rows.select(
        "frame", pl.col("time_s").alias("t_s"), "wirelen",
        pl.format("{} → {}", pl.coalesce(pl.col("src"), pl.lit("?")), pl.coalesce(pl.col("dst"), pl.lit("?")))
        .alias("path"))
    data, note = thin(data, what="evidence frames")
    notes.append(note)
    order = data.group_by("path").agg(pl.col("t_s").min()).sort("t_s")["path"].to_list()
    layers = []
    if window_ns:
        layers.append(window_rect(*seconds_domain(window_ns[0], window_ns[1], t0_ns), "finding window",
                                  opacity=0.08, scale=xscale))
    layers.append(alt.Chart(data).mark_tick(thickness=2, clip=True, color="#4e79a7").encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale),
        y=alt.Y("path:N", sort=order, title=None, axis=alt.Axis(labelLimit=260)),
        tooltip=[alt.Tooltip("frame:Q"), alt.Tooltip("path:N"), alt.Tooltip("t_s:Q", format=".6f"),
                 alt.Tooltip("wirelen:Q", title="bytes")]))
    chart = alt.layer(*layers).properties(width="container", height=alt.Step(24))
    return finish(chart.interactive(bind_y=False), title, notes)
