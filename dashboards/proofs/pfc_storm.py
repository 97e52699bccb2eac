"""The PFC storm's proof: the pause timeline per priority (ports paused at each instant), and below it
each port's paused intervals as bars, ports in the order in which they started pausing.

:func:`pause_frames_of` cuts the pause frames into the detector's own continuous pauses
(``detectors.pfc_storm.pause_intervals`` / ``pause_runs`` / ``port_stats``: the chart shows what the
detector decided, not a re-derivation), :func:`paused_count` turns them into a per-priority step line,
:func:`pause_timeline_chart` draws both, :func:`pfc_storm_proof` (registered for ``pfc_storm``) ties them
together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.pfc_storm as detector
from analyzer.durations import fmt_ns

from ..charts.base import (MAX_ROWS, PANEL_WIDTH, TIME_TITLE, data_range, empty, finish, focus_domain,
                           linked_zoom, seconds_domain, thin, windows_rect, zoom_note)
from .base import Proof, detector_params, proof_chart

MAX_PORT_ROWS = 40  # port rows drawn in the bars panel (the finding's ports first, then by first pause)
ROW_PX = 22  # height of one port's row (its label must fit)
MIN_CONTEXT_NS = 20_000  # a pause storm is µs to ms long: the opening view's context is at least this


def pause_frames_of(cap, finding: dict) -> dict:
    """The capture's continuous pauses (``runs``) and per-port figures (``ports``: port, priority,
    first pause, order), with the detector's parameters the finding was found with (its link speed)."""
    params = detector_params(finding, detector)
    try:
        frames = cap.frame("pause_frames")
    except KeyError:
        frames = None
    runs = detector.pause_runs(detector.pause_intervals(frames, params.link_speed_bps))
    if runs.height == 0:
        return {"runs": runs, "ports": pl.DataFrame()}
    t0, t1 = int(cap.packets["ts_ns"].min()) if cap.packets.height else 0, \
        int(cap.packets["ts_ns"].max()) if cap.packets.height else 1
    span = (min(t0, int(runs["start_ns"].min())), max(t1, int(runs["start_ns"].max())))
    ports = detector.port_stats(runs, span, params.share_window_ns)
    return {"runs": runs, "ports": ports}


def paused_count(runs: pl.DataFrame) -> pl.DataFrame:
    """Per priority, how many ports are paused from each instant on (a step function): ``priority``,
    ``t_ns``, ``paused`` (one row per pause start and end)."""
    ev = pl.concat([runs.select("priority", pl.col("start_ns").alias("t_ns"), pl.lit(1).alias("d")),
                    runs.select("priority", pl.col("end_ns").alias("t_ns"), pl.lit(-1).alias("d"))])
    return (ev.group_by("priority", "t_ns").agg(pl.col("d").sum()).sort("priority", "t_ns")
            .with_columns(pl.col("d").cum_sum().over("priority").alias("paused")).drop("d"))


def _row_label(order: int, mac: str, priority: int) -> str:
    return f"{order:>2}. {mac} · {detector.priority_name(priority).replace('priority ', 'p')}"


def pause_timeline_chart(runs: pl.DataFrame, ports: pl.DataFrame, *, t0_ns: int, finding: dict,
                         window_ns: tuple[int, int] | None = None, view_ns: tuple[int, int] | None = None,
                         extent_ns: tuple[int, int] | None = None, max_ports: int = MAX_PORT_ROWS):
    """Top: ports paused at each instant, one step line per priority. Bottom: one row per (port,
    priority) in the order the ports started pausing, each continuous pause a bar (its refreshes in
    the tooltip), the first pause marked; the finding's ports (its ``server`` and ``client`` list,
    on its priority) first and outlined. Opens on ``view_ns`` (default: the finding's window with
    context); scroll to zoom out."""
    title = f"Pause timeline: {finding.get('resource') or 'every priority'}"
    if runs.height == 0:
        return empty("No PFC or PAUSE frame in this capture.", title)
    notes = []
    if view_ns is None and window_ns is not None:
        view_ns = focus_domain(window_ns, min_context_ns=max(MIN_CONTEXT_NS, window_ns[1] - window_ns[0]))
        if extent_ns is not None:  # µs-long pauses: nothing before the first packet or after the last
            view_ns = (max(view_ns[0], min(extent_ns[0], window_ns[0])),
                       min(view_ns[1], max(extent_ns[1], window_ns[1])))
        notes.append(zoom_note(view_ns, window_ns))
    view = view_ns or (int(runs["start_ns"].min()), int(runs["end_ns"].max()))
    lo, hi = data_range(view, extent_ns)
    runs = runs.filter((pl.col("end_ns") >= lo) & (pl.col("start_ns") <= hi))
    xscale = alt.Scale(domain=list(seconds_domain(view[0], view[1], t0_ns)), nice=False)
    x = alt.X("start_s:Q", title=TIME_TITLE, scale=xscale)
    zoom = linked_zoom("pfc_zoom")
    # the finding's ports (server, then clients in order) on its priority come first
    mine = [finding.get("server")] + [c for c in (finding.get("client") or "").split(",") if c]
    prio = next((p for p in range(detector.ALL + 1) if detector.priority_name(p) == finding.get("resource")), None)
    order = ports.with_columns((pl.col("src_mac").is_in([m for m in mine if m]) &
                                (pl.col("priority") == prio)).alias("finding_port")).sort(
        "priority", "first_ns", "src_mac").with_columns(
        pl.int_range(1, pl.len() + 1).over("priority").alias("order"))
    order = order.sort(pl.col("finding_port"), "first_ns", descending=[True, False])
    if order.height > max_ports:
        notes.append(f"the first {max_ports} of {order.height} (port, priority) rows shown, this finding's first")
        order = order.head(max_ports)
    labels = [_row_label(o, m, p) for o, m, p in order.select("order", "src_mac", "priority").iter_rows()]
    order = order.with_columns(pl.Series("row", labels))
    bars = runs.join(order.select("src_mac", "priority", "row", "finding_port"), on=["src_mac", "priority"]).select(
        "row", "finding_port", pl.col("priority").cast(pl.Int32), ((pl.col("start_ns") - t0_ns) / 1e9).alias("start_s"),
        ((pl.col("end_ns") - t0_ns) / 1e9).alias("end_s"), ((pl.col("end_ns") - pl.col("start_ns")) / 1e3)
        .alias("paused_us"), "refreshes", "xoffs", pl.col("frames").list.first().alias("first_frame"))
    bars, note = thin(bars, keep=pl.col("finding_port"), what="pauses")
    notes.append(note)
    count = paused_count(runs).filter(pl.col("t_ns").is_between(lo, hi)).with_columns(
        ((pl.col("t_ns") - t0_ns) / 1e9).alias("start_s"), pl.col("priority").cast(pl.Int32))
    if count.height > MAX_ROWS:
        n = count.height
        count = count.group_by("priority", (pl.col("t_ns") // max((hi - lo) // (MAX_ROWS // 2), 1)).alias("b")).agg(
            pl.col("start_s").first(), pl.col("paused").max()).drop("b").sort("priority", "start_s")
        notes.append(f"aggregated: {n:,} pause starts and ends → the most ports paused per bin")
    colour = alt.Color("priority:N", title="priority", scale=alt.Scale(scheme="category10"))
    top = alt.Chart(count).mark_line(interpolate="step-after", clip=True).encode(
        x=x, y=alt.Y("paused:Q", title="ports paused"), color=colour,
        tooltip=[alt.Tooltip("priority:N"), alt.Tooltip("start_s:Q", format=".6f", title="t (s)"),
                 alt.Tooltip("paused:Q", title="ports paused")]).add_params(zoom).properties(
        width=PANEL_WIDTH, height=120)
    layers = []
    if window_ns is not None:
        shade = pl.DataFrame({"start_s": [(window_ns[0] - t0_ns) / 1e9],
                              "end_s": [(max(window_ns[1], window_ns[0] + 1) - t0_ns) / 1e9],
                              "label": [f"{finding.get('kind')} {fmt_ns(window_ns[1] - window_ns[0])}"]})
        layers.append(windows_rect(shade, colour="#e15759", opacity=0.08, scale=xscale))
    y = alt.Y("row:N", title=None, sort=labels, axis=alt.Axis(labelFontSize=10, labelLimit=260))
    layers.append(alt.Chart(bars).mark_bar(height=9, clip=True).encode(
        x=x, x2="end_s:Q", y=y, color=colour,
        stroke=alt.condition("datum.finding_port", alt.value("#222"), alt.value(None)),
        tooltip=[alt.Tooltip("row:N", title="port"), alt.Tooltip("start_s:Q", format=".6f"),
                 alt.Tooltip("paused_us:Q", format=",.1f", title="paused (µs)"),
                 alt.Tooltip("refreshes:Q", title="back-to-back refreshes"), alt.Tooltip("xoffs:Q", title="XOFFs"),
                 alt.Tooltip("first_frame:Q", title="frame")]))
    firsts = order.filter(pl.col("first_ns").is_between(lo, hi)).select(
        "row", ((pl.col("first_ns") - t0_ns) / 1e9).alias("start_s"), pl.col("order").cast(pl.Int32))
    if firsts.height:
        layers.append(alt.Chart(firsts).mark_point(shape="triangle-right", filled=True, color="#222", size=40,
                                                   clip=True).encode(
            x=x, y=y, tooltip=[alt.Tooltip("row:N", title="started pausing"),
                               alt.Tooltip("start_s:Q", format=".6f")]))
    bottom = alt.layer(*layers).properties(width=PANEL_WIDTH, height=max(60, ROW_PX * len(labels)))
    return finish(alt.vconcat(top, bottom, spacing=8).resolve_scale(x="shared"), title, notes)


@proof_chart(detector.NAME)
def pfc_storm_proof(p: Proof) -> list[tuple[object, str]]:
    f = pause_frames_of(p.cap, p.finding)
    chart = pause_timeline_chart(f["runs"], f["ports"], t0_ns=p.t0, finding=p.finding, window_ns=p.window,
                                 view_ns=p.view, extent_ns=(p.t0, p.t1))
    return [(chart, "Ports paused at each instant per priority (top); each port's continuous pauses as bars, ports "
                    "in the order they started pausing (▸ marks the first pause; this finding's ports outlined and "
                    "listed first). Only the mirrored links' pause frames are seen.")]
