"""The SMB2 oplock/lease break queue's proof: each break from notification to acknowledgment, and
the requests queued behind it on the same time axis.

:func:`break_frames` cuts the breaks and their waiters from the capture (pure Polars),
:func:`break_queue_chart` draws them, :func:`break_queue_proof` (registered for ``smb_break_queue``)
ties them together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.smb_break_queue as detector

from ..charts.base import (PANEL_WIDTH, TIME_TITLE, empty, finish, linked_zoom as _linked_zoom,
                           opening_view as _view, seconds_domain as _domain, thin, window_rect)
from ..frames import endpoint_matches
from .base import Proof, proof_chart


# -- the evidence: breaks and the requests waiting on them -------------------------------------------

def break_frames(breaks: pl.DataFrame, smb2_tx: pl.DataFrame | None, finding: dict) -> dict:
    """The oplock/lease breaks on the finding's resource, and the requests that waited on it
    (answered with an interim STATUS_PENDING first, CHANGE_NOTIFY excluded, or named as a break's
    blocked trigger)."""
    resource = finding.get("resource")
    b = breaks.filter(endpoint_matches("server", "server_port", finding.get("server")))
    if resource:
        on_path = pl.col("path") == resource
        if "lease_paths" in b.columns:
            on_path = on_path | pl.col("lease_paths").list.contains(resource).fill_null(False)
        b = b.filter(on_path.fill_null(False))
    b = b.select("frame", "ts_ns", "ack_ts_ns", pl.col("client").cast(pl.String), "path",
                 pl.col("kind").cast(pl.String), *[c for c in ("trigger_frame",) if c in b.columns])
    empty_waiters = pl.DataFrame(schema={"t_ns": pl.Int64, "end_ns": pl.Int64, "client": pl.String,
                                         "operation": pl.String, "frame": pl.UInt32})
    if smb2_tx is None or smb2_tx.height == 0:
        return {"breaks": b, "waiters": empty_waiters}
    t = smb2_tx.filter(endpoint_matches("server", "server_port", finding.get("server")))
    if resource and "path" in t.columns:
        t = t.filter(pl.col("path") == resource)
    pending = pl.col("pending_ns").is_not_null() if "pending_ns" in t.columns else pl.lit(False)
    if "pending_by_design" in t.columns:
        pending = pending & ~pl.col("pending_by_design").fill_null(False)
    triggered = pl.col("request_frame").is_in(b["trigger_frame"].drop_nulls().implode()) \
        if "trigger_frame" in b.columns else pl.lit(False)
    waiters = t.filter(pending | triggered).select(
        pl.col("request_ts_ns").alias("t_ns"), pl.col("response_ts_ns").alias("end_ns"),
        pl.col("client").cast(pl.String), "operation", pl.col("request_frame").alias("frame"))
    return {"breaks": b, "waiters": waiters}


# -- the chart -----------------------------------------------------------------------------------------

def break_queue_chart(breaks: pl.DataFrame, waiters: pl.DataFrame, *, t0_ns: int,
                      window_ns: tuple[int, int] | None = None, end_ns: int | None = None,
                      view_ns: tuple[int, int] | None = None) -> alt.VConcatChart | alt.Chart:
    """Top: each break from notification to acknowledgment (the bar's length is the break → ack
    latency, labelled). Bottom, same time axis: queue depth as a step chart — requests waiting on the
    resource, and breaks not yet acknowledged.

    ``breaks``: ``frame``, ``ts_ns``, ``ack_ts_ns`` (null: never acknowledged), ``client``, ``path``,
    ``kind``. ``waiters``: ``t_ns``, ``end_ns`` (null: never answered), ``client``, ``operation``, ``frame``.
    """
    title = "Break → acknowledgment, and the queue behind it"
    if breaks.height == 0 and waiters.height == 0:
        return empty("No oplock or lease breaks on this resource.", title)
    times = [s for s in (breaks["ts_ns"], breaks["ack_ts_ns"], waiters["t_ns"], waiters["end_ns"]) if len(s)]
    lo = min(int(s.min()) for s in times if s.drop_nulls().len())
    hi = max(int(s.max()) for s in times if s.drop_nulls().len())
    if window_ns:
        lo, hi = min(lo, window_ns[0]), max(hi, window_ns[1])
    hi_draw = max(end_ns or hi, hi)
    notes = []
    view = _view(window_ns, view_ns, notes)
    if view is None:
        pad = max((hi - lo) // 20, 1_000_000)
        view = (lo - pad, hi + 3 * pad)  # room on the right for the latency labels
    domain = _domain(view[0], view[1], t0_ns)
    xscale = alt.Scale(domain=list(domain), nice=False)
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xscale)
    zoom = _linked_zoom("break_zoom")
    b, note = thin(breaks, max_rows=300, what="breaks")
    notes.append(note)
    bars = b.select(
        pl.format("frame {} → {} ({})", pl.col("frame"), pl.col("client"), pl.col("kind")).alias("break"),
        ((pl.col("ts_ns") - t0_ns) / 1e9).alias("t_s"),
        ((pl.coalesce(pl.col("ack_ts_ns"), pl.lit(hi_draw)) - t0_ns) / 1e9).alias("ack_s"),
        ((pl.col("ack_ts_ns") - pl.col("ts_ns")) / 1e6).alias("latency_ms"),
        pl.when(pl.col("ack_ts_ns").is_null()).then(pl.lit("never acknowledged"))
        .otherwise(pl.lit("acknowledged")).alias("state"),
        "path", "frame")
    bars = bars.with_columns(
        pl.when(pl.col("latency_ms").is_null()).then(pl.lit("no ack"))
        .otherwise(pl.format("{} ms", pl.col("latency_ms").round(1))).alias("label"))
    base = alt.Chart(bars)
    y = alt.Y("break:N", title=None, sort=bars.sort("t_s")["break"].to_list(), axis=alt.Axis(labelLimit=260))
    top_layers = []
    if window_ns:
        top_layers.append(window_rect(*_domain(window_ns[0], window_ns[1], t0_ns), "", opacity=0.08, scale=xscale))
    top_layers += [
        base.mark_bar(height=12, clip=True).encode(
            x=x, x2="ack_s:Q", y=y,
            color=alt.Color("state:N", scale=alt.Scale(domain=["acknowledged", "never acknowledged"],
                                                       range=["#e8a202", "#7b0d1e"]), title=None),
            tooltip=[alt.Tooltip("break:N"), alt.Tooltip("path:N"), alt.Tooltip("t_s:Q", format=".6f"),
                     alt.Tooltip("latency_ms:Q", format=".3f", title="break → ack (ms)"), alt.Tooltip("state:N")]
        ).add_params(zoom),
        base.mark_text(align="left", dx=4, fontSize=11, clip=True).encode(x="ack_s:Q", y=y, text="label:N"),
    ]
    top = alt.layer(*top_layers).properties(width=PANEL_WIDTH, height=alt.Step(24))
    depth = open_intervals_depth(waiters, "t_ns", "end_ns", "requests waiting", hi_draw)
    unacked = breaks.rename({"ts_ns": "t_ns", "ack_ts_ns": "end_ns"})
    depth = pl.concat([depth, open_intervals_depth(unacked, "t_ns", "end_ns", "breaks unacknowledged", hi_draw)])
    depth = depth.with_columns(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"))
    depth, note = thin(depth, what="queue changes")
    notes.append(note)
    bottom = alt.Chart(depth).mark_line(interpolate="step-after", point=alt.OverlayMarkDef(size=14, clip=True),
                                        clip=True).encode(
        x=x, y=alt.Y("depth:Q", title="queue depth", axis=alt.Axis(tickMinStep=1)),
        color=alt.Color("series:N", scale=alt.Scale(domain=["requests waiting", "breaks unacknowledged"],
                                                    range=["#4e79a7", "#e8a202"]), title=None),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("depth:Q")]
    ).properties(width=PANEL_WIDTH, height=150)
    return finish(alt.vconcat(top, bottom, spacing=8).resolve_scale(x="shared", color="independent"), title, notes)


def open_intervals_depth(frame: pl.DataFrame, start: str, end: str, series: str, end_of_time: int) -> pl.DataFrame:
    """Step function of how many [start, end) intervals are open (+1 at start, -1 at end)."""
    if frame.height == 0:
        return pl.DataFrame(schema={"t_ns": pl.Int64, "depth": pl.Int64, "series": pl.String})
    ev = pl.concat([
        frame.select(pl.col(start).cast(pl.Int64).alias("t_ns"), pl.lit(1, pl.Int64).alias("d")),
        frame.filter(pl.col(end).is_not_null()).select(pl.col(end).cast(pl.Int64).alias("t_ns"),
                                                        pl.lit(-1, pl.Int64).alias("d")),
    ]).group_by("t_ns").agg(pl.col("d").sum()).sort("t_ns")
    ev = ev.with_columns(pl.col("d").cum_sum().alias("depth")).select("t_ns", "depth")
    first = pl.DataFrame({"t_ns": [int(ev["t_ns"][0]) - 1], "depth": [0]}, schema=ev.schema)
    last = pl.DataFrame({"t_ns": [max(end_of_time, int(ev["t_ns"][-1]))], "depth": [int(ev["depth"][-1])]},
                        schema=ev.schema)
    return pl.concat([first, ev, last]).with_columns(pl.lit(series).alias("series"))


@proof_chart(detector.NAME)
def break_queue_proof(p: Proof) -> list[tuple[object, str]]:
    if not p.has("smb2_breaks"):
        return [(empty("This capture has no smb2_breaks frame (the SMB2 decoder is not installed)."), "")]
    smb2_tx = p.cap.frame("smb2_transactions") if p.has("smb2_transactions") else None
    f = break_frames(p.cap.frame("smb2_breaks"), smb2_tx, p.finding)
    return [(break_queue_chart(f["breaks"], f["waiters"], t0_ns=p.t0, window_ns=p.window, end_ns=p.t1,
                               view_ns=p.view),
             "Each break from notification to acknowledgment; below, how many requests queued behind it.")]
