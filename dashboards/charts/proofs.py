"""The chart that proves a finding, one builder per detector (frames from :mod:`dashboards.evidence`).

Every builder takes plain frames with documented columns (times in ns since the epoch; ``t0_ns`` is
the capture's first packet, the origin of every time axis) and returns one Altair chart. Panels that
must share a time axis (a herd's rate over its server latency, a time-sequence graph over bytes in
flight) are one vertically concatenated chart with a shared x scale: dragging or scrolling in the top
panel zooms both. Every chart on a time axis opens on ``view_ns`` — by default the finding's window
with context before and after (:func:`dashboards.charts.base.focus_domain`) — and can be zoomed out
(scroll; the Findings page also has a whole-capture toggle). The herd chart is in
:mod:`dashboards.charts.herd`.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl

from .base import (MAX_ROWS, PANEL_WIDTH, TIME_TITLE, data_range, empty, finish, fmt_duration_ns,
                   linked_zoom as _linked_zoom, nice_bin_ns, opening_view as _view, seconds_domain as _domain,
                   thin, window_rect, windows_rect, x_scale as _x_scale)
from .herd import herd_chart  # noqa: F401 - the herd's proof chart lives in its own module

MAX_CLIENTS = 60


# -- retry storm ---------------------------------------------------------------------------------

def classify_backoff(attempts: pl.DataFrame) -> tuple[str, float | None, float | None]:
    """(class, median interval ns, median ratio of consecutive intervals) of retry chains.

    ``attempts``: ``chain``, ``t_ns`` (one row per attempt). Classes: ``fixed`` (ratio within 15 % of
    1), ``exponential`` (ratio ≥ 1.6), ``growing`` (in between), ``shrinking``, ``single retry``
    (no chain has two intervals), ``no retries``.
    """
    iv = (attempts.sort("chain", "t_ns")
          .with_columns(pl.col("t_ns").diff().over("chain").alias("interval_ns"))
          .filter(pl.col("interval_ns").is_not_null()))
    if iv.height == 0:
        return "no retries", None, None
    median_ns = float(iv["interval_ns"].median())
    ratios = (iv.with_columns((pl.col("interval_ns") / pl.col("interval_ns").shift(1).over("chain"))
                              .alias("ratio")).filter(pl.col("ratio").is_not_null() & pl.col("ratio").is_finite()))
    if ratios.height == 0:
        return "single retry", median_ns, None
    r = float(ratios["ratio"].median())
    if abs(r - 1) <= 0.15:
        kind = "fixed"
    elif r >= 1.6:
        kind = "exponential"
    elif r > 1:
        kind = "growing"
    else:
        kind = "shrinking"
    return kind, median_ns, r


def retry_ladder(attempts: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                 view_ns: tuple[int, int] | None = None, max_clients: int = MAX_CLIENTS) -> alt.Chart:
    """One row per client, a mark per attempt (first tries hollow, retries filled red). Opens on
    ``view_ns`` (default: the storm window with context); scroll to zoom out.

    ``attempts``: ``t_ns``, ``client``, ``chain``, ``attempt`` (0 = first try), ``frame``."""
    title = "Retry ladder"
    if attempts.height == 0:
        return empty("No attempts to draw.", title)
    notes = []
    view = _view(window_ns, view_ns, notes)
    xscale = _x_scale(view, t0_ns)
    per_client = attempts.group_by("client").agg(pl.len().alias("n"), pl.col("t_ns").min().alias("first"))
    if per_client.height > max_clients:
        keep = per_client.sort("n", descending=True).head(max_clients)
        notes.append(f"sampled: the {max_clients} clients with most attempts of {per_client.height:,} shown")
        attempts = attempts.filter(pl.col("client").is_in(keep["client"].implode()))
        per_client = keep
    order = per_client.sort("first")["client"].to_list()
    data = attempts.select(
        "client", "chain", "attempt", "frame", ((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"),
        pl.when(pl.col("attempt") == 0).then(pl.lit("first try")).otherwise(pl.lit("retry")).alias("what"))
    data, note = thin(data, keep=pl.col("attempt") == 1, what="attempts")
    notes.append(note)
    layers = []
    if window_ns:
        w0, w1 = _domain(window_ns[0], window_ns[1], t0_ns)
        layers.append(window_rect(w0, w1, "storm window", colour="#e15759", opacity=0.08, scale=xscale))
    layers.append(alt.Chart(data).mark_point(size=30, filled=True, clip=True).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale),
        y=alt.Y("client:N", sort=order, title=None, axis=alt.Axis(labelLimit=200)),
        color=alt.Color("what:N", scale=alt.Scale(domain=["first try", "retry"], range=["#4e79a7", "#e15759"]),
                        title=None, legend=alt.Legend(orient="top")),
        shape=alt.Shape("what:N", scale=alt.Scale(domain=["first try", "retry"], range=["circle", "triangle-right"]),
                        title=None, legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("client:N"), alt.Tooltip("attempt:Q", title="attempt # (0 = first)"),
                 alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("frame:Q")]))
    # discrete y: a step per row (Streamlit does not honour a fixed height on a discrete axis)
    chart = alt.layer(*layers).properties(width="container", height=alt.Step(16 if len(order) > 8 else 24))
    return finish(chart.interactive(bind_y=False), title, notes)


def retry_intervals(attempts: pl.DataFrame, *, backoff: str | None = None, bins: int = 40) -> alt.Chart:
    """Histogram of the time between consecutive attempts of one request, with the backoff class."""
    kind, median_ns, ratio = classify_backoff(attempts)
    label = backoff or kind
    title = f"Retry intervals — backoff: {label}"
    if median_ns is not None:
        title += f" (median {fmt_duration_ns(median_ns)}" + (f", ×{ratio:.2f} per retry)" if ratio else ")")
    iv = (attempts.sort("chain", "t_ns").with_columns(pl.col("t_ns").diff().over("chain").alias("interval_ns"))
          .filter(pl.col("interval_ns").is_not_null()))
    if iv.height == 0:
        return empty("No retries: every request was sent once.", title)
    ms = iv["interval_ns"].to_numpy().astype(np.float64) / 1e6
    top = float(np.quantile(ms, 0.995)) * 1.05 or 1.0
    counts, edges = np.histogram(np.clip(ms, 0, top), bins=bins, range=(0, top))
    data = pl.DataFrame({"from_ms": edges[:-1], "to_ms": edges[1:], "intervals": counts})
    chart = alt.Chart(data).mark_bar(color="#e15759").encode(
        x=alt.X("from_ms:Q", title="interval between attempts (ms)"), x2="to_ms:Q",
        y=alt.Y("intervals:Q", title="intervals"), y2=alt.datum(0),
        tooltip=[alt.Tooltip("from_ms:Q", format=".4g"), alt.Tooltip("to_ms:Q", format=".4g"),
                 alt.Tooltip("intervals:Q")]).properties(width="container", height=200)
    clipped = int((ms > top).sum())
    notes = [f"aggregated: {len(ms):,} intervals in {bins} bins",
             f"{clipped} intervals above {top:.4g} ms counted in the last bin" if clipped else None]
    return finish(chart, title, notes)


def amplification_chart(attempts: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                        view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """Attempts/s against first tries/s over time; the subtitle has the overall amplification. Opens
    on ``view_ns`` (default: the storm window with context), bins of about 1/120 of it."""
    title = "Amplification over time"
    if attempts.height == 0:
        return empty("No attempts to draw.", title)
    notes = []
    view = _view(window_ns, view_ns, notes)
    total = attempts.height / max(int((attempts["attempt"] == 0).sum()), 1)
    lo, hi = int(attempts["t_ns"].min()), int(attempts["t_ns"].max())
    if view:
        lo, hi = data_range(view, (lo, hi))
        attempts = attempts.filter(pl.col("t_ns").is_between(lo, hi))
    bin_ns = nice_bin_ns((view[1] - view[0]) if view else hi - lo, 120, min_ns=1_000_000)
    per = (attempts.with_columns(((pl.col("t_ns") - lo) // bin_ns).alias("bin"))
           .group_by("bin").agg(pl.len().alias("all attempts"), (pl.col("attempt") == 0).sum().alias("first tries")))
    grid = pl.DataFrame({"bin": np.arange(int((hi - lo) // bin_ns) + 1, dtype=np.int64)})
    per = (grid.join(per, on="bin", how="left").fill_null(0)
           .with_columns(((lo - t0_ns + pl.col("bin") * bin_ns) / 1e9).alias("t_s"),
                         (pl.col("all attempts") / pl.max_horizontal(pl.col("first tries"), 1)).alias("amplification")))
    long = per.unpivot(["all attempts", "first tries"], index=["t_s", "amplification"], variable_name="what",
                       value_name="count").with_columns((pl.col("count") / (bin_ns / 1e9)).alias("per_s"))
    xscale = _x_scale(view, t0_ns)
    layers = []
    if window_ns:
        w0, w1 = _domain(window_ns[0], window_ns[1], t0_ns)
        layers.append(window_rect(w0, w1, "", opacity=0.08, scale=xscale))
    layers.append(alt.Chart(long).mark_line(interpolate="step-after", clip=True).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale),
        y=alt.Y("per_s:Q", title=f"per second ({fmt_duration_ns(bin_ns)} bins)"),
        color=alt.Color("what:N", scale=alt.Scale(domain=["all attempts", "first tries"], range=["#e15759", "#4e79a7"]),
                        title=None),
        tooltip=[alt.Tooltip("what:N"), alt.Tooltip("t_s:Q", format=".3f"), alt.Tooltip("per_s:Q", format=",.1f"),
                 alt.Tooltip("amplification:Q", format=".2f", title="attempts per first try")]))
    chart = alt.layer(*layers).properties(width="container", height=200)
    return finish(chart.interactive(bind_y=False), f"{title}: {total:.2f} attempts per request overall", notes)


# -- SMB oplock / lease break queue ----------------------------------------------------------------

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
    depth = _depth(waiters, "t_ns", "end_ns", "requests waiting", hi_draw)
    depth = pl.concat([depth, _depth(breaks.rename({"ts_ns": "t_ns", "ack_ts_ns": "end_ns"}), "t_ns", "end_ns",
                                     "breaks unacknowledged", hi_draw)])
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


def _depth(frame: pl.DataFrame, start: str, end: str, series: str, end_of_time: int) -> pl.DataFrame:
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


# -- TCP stall: the time-sequence (Stevens) graph ----------------------------------------------------

def stevens_chart(segments: pl.DataFrame, *, t0_ns: int, stalls: pl.DataFrame | None = None,
                  title: str = "Time-sequence graph", max_points: int = MAX_ROWS,
                  window_ns: tuple[int, int] | None = None,
                  view_ns: tuple[int, int] | None = None) -> alt.VConcatChart | alt.Chart:
    """Sequence numbers of the data sender's segments over time, the receiver's ACK line and
    receive-window edge (ACK + window), retransmissions marked, stalls shaded and labelled with their
    cause; bytes in flight below on the same time axis.

    ``segments``: ``t_ns``, ``frame``, ``from_sender`` (the data direction), ``seq_rel``, ``seglen``,
    ``ack_rel``, ``window_size``, ``bytes_in_flight``, ``retransmission``. ``stalls``: ``start_ns``,
    ``end_ns``, ``label``. Above ``max_points`` data segments, each of about ``max_points / 2`` time
    buckets keeps its lowest and highest segment, every retransmission is kept, and the subtitle says so.
    Opens on ``view_ns`` (default: the finding's stall ``window_ns`` with context, else the whole
    connection); scroll to zoom out.
    """
    data = segments.filter(pl.col("from_sender") & (pl.col("seglen") > 0))
    acks = segments.filter(~pl.col("from_sender") & pl.col("ack_rel").is_not_null())
    if data.height == 0 and acks.height == 0:
        return empty("No segments on this connection.", title)
    notes = []
    lo = int(segments["t_ns"].min())
    hi = max(int(segments["t_ns"].max()), lo + 1)
    if stalls is not None and stalls.height:
        lo, hi = min(lo, int(stalls["start_ns"].min())), max(hi, int(stalls["end_ns"].max()))
    view = _view(window_ns, view_ns, notes) or (lo, hi)
    domain = _domain(view[0], view[1], t0_ns)
    xscale = alt.Scale(domain=list(domain), nice=False)
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xscale)
    zoom = _linked_zoom("tsg_zoom")
    pts = data.select("t_ns", "frame", "seq_rel", "seglen", "retransmission",
                      (pl.col("seq_rel").cast(pl.Int64) + pl.col("seglen")).alias("seq_end"))
    bucket_ns = nice_bin_ns(hi - lo, max_points // 2)
    if pts.height > max_points:
        retx = pts.filter(pl.col("retransmission"))
        keep_retx = retx.head(max_points // 4)
        normal = pts.filter(~pl.col("retransmission")).with_columns(((pl.col("t_ns") - lo) // bucket_ns).alias("b"))
        env = pl.concat([normal.sort("seq_end").group_by("b").first(), normal.sort("seq_end").group_by("b").last()])
        env = env.unique(subset=["frame"]).drop("b")
        n_before = pts.height
        pts = pl.concat([env.select(pts.columns), keep_retx]).sort("t_ns")
        notes.append(f"sampled: {pts.height:,} of {n_before:,} data segments drawn (lowest and highest per "
                     f"{fmt_duration_ns(bucket_ns)}; " + (f"all {retx.height:,} retransmissions kept)"
                                                           if keep_retx.height == retx.height else
                                                           f"{keep_retx.height:,} of {retx.height:,} retransmissions)"))
    pts = pts.with_columns(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"),
                           pl.when(pl.col("retransmission")).then(pl.lit("retransmission"))
                           .otherwise(pl.lit("data segment")).alias("what"))
    ackline = acks.select("t_ns", "frame", pl.col("ack_rel").cast(pl.Int64).alias("ack"),
                          (pl.col("ack_rel").cast(pl.Int64) + pl.col("window_size")).alias("window_edge"),
                          "window_size", "bytes_in_flight")
    if ackline.height > max_points:
        n_before = ackline.height
        ackline = (ackline.with_columns(((pl.col("t_ns") - lo) // bucket_ns).alias("b")).sort("t_ns")
                   .group_by("b", maintain_order=True).last().drop("b"))
        notes.append(f"aggregated: {n_before:,} ACKs → the last per {fmt_duration_ns(bucket_ns)}")
    ackline = ackline.with_columns(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"))
    y = alt.Y("seq:Q", title="relative sequence number (bytes)")
    layers = []
    if stalls is not None and stalls.height:
        layers.append(windows_rect(stalls.select(
            ((pl.col("start_ns") - t0_ns) / 1e9).alias("start_s"), ((pl.col("end_ns") - t0_ns) / 1e9).alias("end_s"),
            "label"), colour="#e15759", opacity=0.13, scale=xscale))
    if ackline.height:
        long = ackline.unpivot(["ack", "window_edge"], index=["t_s", "frame", "window_size"], variable_name="line",
                               value_name="seq").drop_nulls("seq").with_columns(
            pl.col("line").replace({"ack": "ACK", "window_edge": "receive window (ACK + window)"}))
        layers.append(alt.Chart(long).mark_line(interpolate="step-after", strokeWidth=1.2, clip=True).encode(
            x=x, y=y, color=alt.Color("line:N", scale=alt.Scale(
                domain=["ACK", "receive window (ACK + window)"], range=["#59a14f", "#b0b0b0"]), title=None),
            strokeDash=alt.StrokeDash("line:N", legend=None, scale=alt.Scale(
                domain=["ACK", "receive window (ACK + window)"], range=[[1, 0], [5, 3]])),
            tooltip=[alt.Tooltip("line:N"), alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("seq:Q", format=","),
                     alt.Tooltip("window_size:Q", format=","), alt.Tooltip("frame:Q")]))
    if pts.height:
        layers.append(alt.Chart(pts.rename({"seq_end": "seq"})).mark_point(filled=True, clip=True).encode(
            x=x, y=y,
            color=alt.Color("what:N", scale=alt.Scale(domain=["data segment", "retransmission"],
                                                      range=["#4e79a7", "#e15759"]), title=None),
            shape=alt.Shape("what:N", scale=alt.Scale(domain=["data segment", "retransmission"],
                                                      range=["circle", "diamond"]), legend=None),
            size=alt.condition("datum.what == 'retransmission'", alt.value(60), alt.value(12)),
            tooltip=[alt.Tooltip("what:N"), alt.Tooltip("frame:Q"), alt.Tooltip("t_s:Q", format=".6f"),
                     alt.Tooltip("seq_rel:Q", format=",", title="seq"), alt.Tooltip("seglen:Q", title="len")]
        ).add_params(zoom))
    else:
        layers[-1] = layers[-1].add_params(zoom)
    top = alt.layer(*layers).resolve_scale(color="independent").properties(width=PANEL_WIDTH, height=300)
    flight = data.select("t_ns", "frame", "bytes_in_flight").drop_nulls("bytes_in_flight")
    if flight.height > max_points:
        n_before = flight.height
        flight = (flight.with_columns(((pl.col("t_ns") - lo) // bucket_ns).alias("b"))
                  .group_by("b").agg(pl.col("t_ns").min(), pl.col("frame").first(), pl.col("bytes_in_flight").max())
                  .drop("b").sort("t_ns"))
        notes.append(f"aggregated: bytes in flight of {n_before:,} segments → the maximum per "
                     f"{fmt_duration_ns(bucket_ns)}")
    if flight.height == 0:
        return finish(top, title, notes)
    flight = flight.with_columns(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"))
    bottom = alt.Chart(flight).mark_area(interpolate="step-after", opacity=0.5, color="#4e79a7", clip=True).encode(
        x=x, y=alt.Y("bytes_in_flight:Q", title="bytes in flight"),
        tooltip=[alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("bytes_in_flight:Q", format=","),
                 alt.Tooltip("frame:Q")]).properties(width=PANEL_WIDTH, height=120)
    return finish(alt.vconcat(top, bottom, spacing=8).resolve_scale(x="shared"), title, notes)


# -- TOCTOU --------------------------------------------------------------------------------------

ROLE_COLOURS = {"check": "#4e79a7", "use": "#59a14f", "change": "#e15759", "other": "#9e9e9e"}


def toctou_chart(ops: pl.DataFrame, windows: pl.DataFrame, *, t0_ns: int,
                 window_ns: tuple[int, int] | None = None, resource: str | None = None,
                 domain_ns: tuple[int, int] | None = None, view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """A Gantt of each client's check → use windows on the resource; the other clients' changes that
    fall inside a window are marked (red rule, labelled with what and who).

    ``ops``: ``t_ns``, ``client``, ``operation``, ``role`` (check, use, change, other), ``frame``,
    ``interleaved`` (a write inside another client's window). ``windows``: ``client``, ``check_ns``,
    ``use_ns``, ``check_frame``, ``use_frame``, ``interleaved`` (another client wrote inside it).
    ``domain_ns``: the time range the operations were cut to (default: the operations'); the chart
    opens on ``view_ns`` (default: the finding's window with context, else ``domain_ns``).
    """
    title = f"Check → use windows on {resource}" if resource else "Check → use windows"
    if ops.height == 0:
        return empty("No operations on this resource.", title)
    notes = []
    ops, note = thin(ops, max_rows=1500, keep=pl.col("interleaved"), what="operations")
    notes.append(note)
    windows, note = thin(windows, max_rows=1000, keep=pl.col("interleaved"), what="windows")
    notes.append(note)
    lo, hi = domain_ns or (int(ops["t_ns"].min()), int(ops["t_ns"].max()))
    pad = max((hi - lo) // 40, 1_000)
    view = _view(window_ns, view_ns, notes) or (lo - pad, hi + pad)
    domain = _domain(view[0], view[1], t0_ns)
    clients = ops.group_by("client").agg(pl.col("t_ns").min()).sort("t_ns")["client"].to_list()
    y = alt.Y("client:N", sort=clients, title=None, axis=alt.Axis(labelLimit=200))
    xscale = alt.Scale(domain=list(domain), nice=False)
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xscale)
    layers = []
    if window_ns:
        layers.append(window_rect(*_domain(window_ns[0], window_ns[1], t0_ns), "", opacity=0.06, scale=xscale))
    if windows.height:
        w = windows.select("client", "check_frame", "use_frame",
                           ((pl.col("check_ns") - t0_ns) / 1e9).alias("t_s"),
                           ((pl.col("use_ns") - t0_ns) / 1e9).alias("use_s"),
                           ((pl.col("use_ns") - pl.col("check_ns")) / 1e6).alias("window_ms"),
                           pl.when(pl.col("interleaved")).then(pl.lit("changed underneath"))
                           .otherwise(pl.lit("clean")).alias("window"))
        layers.append(alt.Chart(w).mark_bar(height=16, opacity=0.5, clip=True).encode(
            x=x, x2="use_s:Q", y=y,
            fill=alt.Fill("window:N", scale=alt.Scale(domain=["clean", "changed underneath"],
                                                      range=["#bab0ac", "#e15759"]), title="check → use window",
                          legend=alt.Legend(orient="top")),
            tooltip=[alt.Tooltip("client:N"), alt.Tooltip("window:N"), alt.Tooltip("window_ms:Q", format=".3f"),
                     alt.Tooltip("check_frame:Q"), alt.Tooltip("use_frame:Q")]))
    o = ops.with_columns(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"))
    changes = o.filter(pl.col("interleaved"))
    if changes.height:
        # one label per other client's burst of writes (writes closer than 1/60 of the range merge)
        gap_s = (domain[1] - domain[0]) / 60
        labels = (changes.sort("t_s").with_columns(
            (pl.col("t_s").diff().over("client").fill_null(gap_s + 1) > gap_s).cum_sum().over("client").alias("burst"))
            .group_by("client", "burst").agg(pl.col("t_s").min(), pl.col("operation").unique(maintain_order=True))
            .with_columns(pl.format("{} by {}", pl.col("operation").list.join(", "), pl.col("client")).alias("label")))
        rules = alt.Chart(changes.with_columns(pl.format("{} by {}", "operation", "client").alias("label")))
        layers.append(rules.mark_rule(color="#e15759", strokeWidth=1.5, strokeDash=[3, 2], clip=True).encode(
            x=x, tooltip=[alt.Tooltip("label:N", title="interleaved change"), alt.Tooltip("frame:Q")]))
        layers.append(alt.Chart(labels).mark_text(align="left", baseline="top", dx=3, dy=2, fontSize=11,
                                                  color="#c0392b", clip=True).encode(x=x, y=alt.value(0),
                                                                                     text="label:N"))
    layers.append(alt.Chart(o).mark_point(filled=True, size=60, stroke="#333", strokeWidth=0.5, clip=True).encode(
        x=x, y=y,
        color=alt.Color("role:N", scale=alt.Scale(domain=list(ROLE_COLOURS), range=list(ROLE_COLOURS.values())),
                        title="operation", legend=alt.Legend(orient="top")),
        shape=alt.Shape("role:N", scale=alt.Scale(domain=list(ROLE_COLOURS),
                                                  range=["circle", "square", "cross", "triangle"]), title="operation",
                        legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("client:N"), alt.Tooltip("operation:N"), alt.Tooltip("role:N"),
                 alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("frame:Q")]))
    chart = alt.layer(*layers).properties(width="container", height=alt.Step(44))
    return finish(chart.interactive(bind_y=False), title, notes)


# -- connection churn ---------------------------------------------------------------------------------

PHASES = ("handshake", "bind / session setup", "work", "close")
PHASE_COLOURS = ("#e8a202", "#e15759", "#4e79a7", "#bab0ac")


def churn_rate_chart(conns: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                     max_clients: int = 8, focus_client: str | None = None,
                     view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """New connections per second per client (1 s bins; 100 ms bins scaled to /s for views under
    10 s). ``conns``: ``start_ns``, ``client``. The busiest ``max_clients`` are drawn, and
    ``focus_client`` (the finding's) always. Opens on ``view_ns`` (default: the finding's window
    with context); scroll to zoom out."""
    title = "New connections per second"
    if conns.height == 0:
        return empty("No connections.", title)
    notes = []
    view = _view(window_ns, view_ns, notes)
    per = conns.group_by("client").len().sort("len", descending=True)
    clients = per.head(max_clients)["client"].to_list()
    if focus_client and focus_client not in clients and focus_client in per["client"].to_list():
        clients = clients[: max_clients - 1] + [focus_client]
    if per.height > len(clients):
        notes.append(f"the {len(clients)} busiest of {per.height:,} clients shown (this finding's included)")
        conns = conns.filter(pl.col("client").is_in(clients))
    lo, hi = int(conns["start_ns"].min()), int(conns["start_ns"].max())
    if window_ns:
        lo, hi = min(lo, window_ns[0]), max(hi, window_ns[1])
    n_total, total_s = conns.height, max((hi - lo) / 1e9, 1e-9)
    if view:
        lo, hi = data_range(view, (lo, hi))
        conns = conns.filter(pl.col("start_ns").is_between(lo, hi))
    span = (view[1] - view[0]) if view else hi - lo
    bin_ns = 1_000_000_000 if span >= 10_000_000_000 else 100_000_000
    nb = int((hi - lo) // bin_ns) + 1
    grid = pl.DataFrame({"client": clients}).join(pl.DataFrame({"bin": np.arange(nb, dtype=np.int64)}), how="cross")
    binned = conns.with_columns(((pl.col("start_ns") - lo) // bin_ns).alias("bin")).group_by("client", "bin").len("n")
    rate = (grid.join(binned, on=["client", "bin"], how="left").fill_null(0)
            .with_columns(((lo - t0_ns + pl.col("bin") * bin_ns) / 1e9).alias("t_s"),
                          (pl.col("n") / (bin_ns / 1e9)).alias("per_s")))
    rate, note = thin(rate, what="rate points")
    notes.append(note)
    xscale = _x_scale(view, t0_ns)
    layers = []
    if window_ns:
        layers.append(window_rect(*_domain(window_ns[0], window_ns[1], t0_ns), "churn window", opacity=0.08,
                                  scale=xscale))
    layers.append(alt.Chart(rate).mark_line(interpolate="step-after", point=alt.OverlayMarkDef(size=10, clip=True),
                                            clip=True).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xscale),
        y=alt.Y("per_s:Q", title=f"new connections/s ({fmt_duration_ns(bin_ns)} bins)"),
        color=alt.Color("client:N", sort=clients, title="client"),
        tooltip=[alt.Tooltip("client:N"), alt.Tooltip("t_s:Q", format=".3f"), alt.Tooltip("n:Q", title="new"),
                 alt.Tooltip("per_s:Q", format=",.1f")]))
    chart = alt.layer(*layers).properties(width="container", height=220)
    return finish(chart.interactive(bind_y=False),
                  f"{title}: {n_total:,} connections, {n_total / total_s:,.1f}/s on average", notes)


def lifetime_chart(lifetimes: pl.DataFrame, *, max_bars: int = 300) -> alt.Chart:
    """Each connection's lifetime split into handshake, bind/session setup, work and close (stacked
    bars in ms, connections in start order); the title has the median share spent on setup.

    ``lifetimes``: ``conn``, ``client``, ``start_ns``, ``handshake_ns``, ``setup_ns``, ``work_ns``,
    ``close_ns`` (nulls count as 0)."""
    title = "Connection lifetime"
    if lifetimes.height == 0:
        return empty("No connections.", title)
    lt = lifetimes.sort("start_ns").with_columns(pl.col(c).fill_null(0).clip(lower_bound=0)
                                                 for c in ("handshake_ns", "setup_ns", "work_ns", "close_ns"))
    total = lt.select(pl.sum_horizontal("handshake_ns", "setup_ns", "work_ns", "close_ns").alias("t"),
                      (pl.col("handshake_ns") + pl.col("setup_ns")).alias("s"))
    share = total.filter(pl.col("t") > 0).select((pl.col("s") / pl.col("t")).median()).item()
    lt = lt.with_row_index("order")
    lt, note = thin(lt, max_rows=max_bars, what="connections")
    long = lt.unpivot(["handshake_ns", "setup_ns", "work_ns", "close_ns"], index=["order", "conn", "client"],
                      variable_name="phase", value_name="ns").with_columns(
        pl.col("phase").replace({"handshake_ns": PHASES[0], "setup_ns": PHASES[1], "work_ns": PHASES[2],
                                 "close_ns": PHASES[3]}),
        (pl.col("ns") / 1e6).alias("ms"))
    chart = alt.Chart(long).mark_bar().encode(
        x=alt.X("order:O", title="connections in start order", axis=alt.Axis(labels=lt.height <= 40, ticks=False)),
        y=alt.Y("ms:Q", title="ms", stack="zero"),
        color=alt.Color("phase:N", scale=alt.Scale(domain=list(PHASES), range=list(PHASE_COLOURS)), sort=list(PHASES),
                        title=None),
        order=alt.Order("phase_rank:Q"),
        tooltip=[alt.Tooltip("conn:Q", title="connection"), alt.Tooltip("client:N"), alt.Tooltip("phase:N"),
                 alt.Tooltip("ms:Q", format=".3f")],
    ).transform_calculate(phase_rank=f"indexof({list(PHASES)!r}, datum.phase)").properties(
        width="container", height=220)
    head = f"{title}: handshake + bind take {share * 100:.0f} % of it (median)" if share is not None else title
    return finish(chart, head, [note])
