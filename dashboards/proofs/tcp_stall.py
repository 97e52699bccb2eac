"""The TCP stall's proof: the connection's time-sequence (Stevens) graph with the stalls shaded, and
bytes in flight below on the same time axis.

:func:`stall_connection` and :func:`stall_frames` cut the connection's segments from the capture's TCP
analysis (pure Polars), :func:`stevens_chart` draws them, :func:`tcp_stall_proof` (registered for
``tcp_stall``) ties them together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.tcp_stall as detector
from analyzer.durations import fmt_ns
from analyzer.tcp.analysis import ANY_RETRANSMISSION

from ..charts.base import (MAX_ROWS, PANEL_WIDTH, TIME_TITLE, empty, finish, linked_zoom as _linked_zoom,
                           nice_bin_ns, opening_view as _view, seconds_domain as _domain, windows_rect)
from ..frames import endpoint_matches
from .base import Proof, proof_chart


# -- the evidence: the connection and its segments ---------------------------------------------------

def stall_connection(segments: pl.DataFrame, connections: pl.DataFrame, finding: dict) -> int | None:
    """The connection a tcp_stall finding is about: the one most of its evidence frames belong to,
    else the one its resource (``a:p-b:q``) names."""
    frames = finding.get("evidence_frames") or []
    if frames:
        hit = segments.filter(pl.col("frame").is_in(pl.Series(frames, dtype=pl.UInt32).implode()))
        if hit.height:
            return int(hit.group_by("conn").len().sort("len", descending=True)["conn"][0])
    resource = finding.get("resource") or ""
    ends = {e.strip() for e in resource.replace("–", "-").split("-") if e.strip()} if resource else set()
    if len(ends) == 2:
        def either(addr: str, port: str) -> pl.Expr:
            return pl.any_horizontal([endpoint_matches(addr, port, e) for e in sorted(ends)])
        hit = connections.filter(either("client", "client_port") & either("server", "server_port"))
        if hit.height:
            return int(hit["conn"][0])
    return None


def stall_frames(segments: pl.DataFrame, packets: pl.DataFrame, conn: int, stall_findings: pl.DataFrame) -> dict:
    """The connection's segments with their times, the data direction (the one that sent more
    payload bytes) as ``from_sender``, retransmissions flagged; and the stalls to shade."""
    seg = segments.filter(pl.col("conn") == conn).join(packets.select("frame", "ts_ns"), on="frame", how="left")
    # summed in 64 bits: Polars sums UInt32 in 32, and a long connection sends more than 4 GiB
    by_dir = seg.group_by("from_client").agg(pl.col("seglen").cast(pl.Int64).sum())
    client_sends = dict(by_dir.iter_rows()).get(True, 0) >= dict(by_dir.iter_rows()).get(False, 0)
    seg = seg.select(
        pl.col("ts_ns").alias("t_ns"), "frame", (pl.col("from_client") == client_sends).alias("from_sender"),
        "seq_rel", "seglen", "ack_rel", "window_size", "bytes_in_flight",
        ((pl.col("analysis") & ANY_RETRANSMISSION) != 0).alias("retransmission")).sort("t_ns")
    stalls = stall_findings.select(
        "start_ns", "end_ns",
        pl.format("{} {} ms", pl.coalesce(pl.col("kind"), pl.lit("stall")),
                  ((pl.col("end_ns") - pl.col("start_ns")) / 1e6).round(1)).alias("label"))
    return {"segments": seg, "stalls": stalls}


# -- the chart: the time-sequence (Stevens) graph ------------------------------------------------------

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
                     f"{fmt_ns(bucket_ns)}; " + (f"all {retx.height:,} retransmissions kept)"
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
        notes.append(f"aggregated: {n_before:,} ACKs → the last per {fmt_ns(bucket_ns)}")
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
                     f"{fmt_ns(bucket_ns)}")
    if flight.height == 0:
        return finish(top, title, notes)
    flight = flight.with_columns(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s"))
    bottom = alt.Chart(flight).mark_area(interpolate="step-after", opacity=0.5, color="#4e79a7", clip=True).encode(
        x=x, y=alt.Y("bytes_in_flight:Q", title="bytes in flight"),
        tooltip=[alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("bytes_in_flight:Q", format=","),
                 alt.Tooltip("frame:Q")]).properties(width=PANEL_WIDTH, height=120)
    return finish(alt.vconcat(top, bottom, spacing=8).resolve_scale(x="shared"), title, notes)


@proof_chart(detector.NAME)
def tcp_stall_proof(p: Proof) -> list[tuple[object, str]]:
    finding = p.finding
    segments, connections = p.cap.frame("tcp_segments"), p.cap.frame("connections")
    conn = stall_connection(segments, connections, finding)
    if conn is None:
        return [(empty("The finding's connection is not in this capture's TCP analysis."), "")]
    same = (p.findings if p.findings is not None else pl.DataFrame([finding])).filter(
        (pl.col("detector") == detector.NAME) & (pl.col("resource") == finding.get("resource")))
    if same.height == 0:
        same = pl.DataFrame([finding]).select("start_ns", "end_ns", "kind")
    f = stall_frames(segments, p.cap.packets, conn, same)
    title = f"Time-sequence graph of {finding.get('resource') or f'connection {conn}'}"
    return [(stevens_chart(f["segments"], t0_ns=p.t0, stalls=f["stalls"], title=title, window_ns=p.window,
                           view_ns=p.view),
             "Sequence numbers sent, the ACK line and the receive window; retransmissions as red diamonds, "
             "stalls shaded; bytes in flight below (drag to zoom both).")]
