"""The RoCEv2 congestion proof: the CE share over time at the finding's destination and per flow
(sender -> destination), with the CNPs the destination sent back marked on the time axis, and the
senders' packet rates below.

:func:`congestion_frames` cuts the evidence with the detector's own functions (its ECN-capable
packets, its windows, its CNPs; pure Polars), :func:`ce_share_chart` draws it, and
:func:`ecn_congestion_proof` (registered for ``ecn_congestion``) ties them together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.ecn_congestion as detector
from analyzer.durations import fmt_ns

from ..charts.base import (PANEL_WIDTH, TIME_TITLE, data_range, empty, finish, focus_domain, linked_zoom,
                           nice_bin_ns, seconds_domain, thin, window_rect, x_scale, zoom_note)
from .base import Proof, detector_params, proof_chart

TARGET_BINS = 400  # windows drawn at most over the data range (coarser windows average the CE share)
MAX_FLOWS = 8  # senders drawn in the per-flow panel (the busiest)
HEIGHT = 170  # px, each panel
CNP_COLOUR = "#7b0d1e"


def congestion_frames(cap, finding: dict, params, lo_ns: int, hi_ns: int) -> dict:
    """The finding's destination between ``lo_ns`` and ``hi_ns``: ``dest`` (CE share per window),
    ``flows`` (per sender), ``cnps`` (time, sender) and the window ``bin_ns`` used (the detector's
    ``window_ns``, or coarser when the range would need more than TARGET_BINS of them)."""
    packets = cap.frame("rocev2_packets")
    dst = finding.get("server")
    marked = (detector.marked_packets(packets).filter(pl.col("ts_ns").is_between(lo_ns, hi_ns))
              .with_columns(pl.col("src", "dst").cast(pl.String)).filter(pl.col("dst") == dst))
    cnps = (detector.cnp_packets(packets).filter(pl.col("ts_ns").is_between(lo_ns, hi_ns))
            .with_columns(pl.col("sender", "receiver").cast(pl.String)).filter(pl.col("receiver") == dst))
    bin_ns = max(int(params.window_ns), nice_bin_ns(hi_ns - lo_ns, TARGET_BINS))
    t0 = int(packets["ts_ns"].min()) if packets.height else lo_ns
    dest = detector.window_shares(marked, bin_ns, t0)
    flows = detector.window_shares(marked.rename({"src": "sender"}), bin_ns, t0, by=("sender",))
    return {"dest": dest, "flows": flows, "cnps": cnps.select("ts_ns", "sender", "frame"), "bin_ns": bin_ns}


def ce_share_chart(dest: pl.DataFrame, flows: pl.DataFrame, cnps: pl.DataFrame, *, t0_ns: int,
                   window_ns: tuple[int, int], view_ns: tuple[int, int], bin_ns: int, threshold: float,
                   destination: str, detector_window_ns: int) -> alt.VConcatChart | alt.Chart:
    """Three panels on one time axis: the CE share of the ECN-capable packets to ``destination`` per
    window (the congestion threshold as a rule, the finding's window shaded), the CE share per
    sender with a tick per CNP the destination sent back (coloured by the sender it notified), and
    each sender's packet rate on the wire (a sender that slows down after its CNPs shows it there,
    unless the observed link is the bottleneck)."""
    title = f"CE share of the packets to {destination}"
    if dest.height == 0:
        return empty(f"No ECN-capable RoCEv2 packets to {destination} in this range.", title)
    notes = [zoom_note(view_ns, window_ns)]
    if bin_ns > detector_window_ns:
        notes.append(f"aggregated: {fmt_ns(bin_ns)} windows (the detector's are {fmt_ns(detector_window_ns)})")
    busiest = flows.group_by("sender").agg(pl.col("packets").sum()).sort("packets", "sender",
                                                                         descending=[True, False])
    senders = busiest.head(MAX_FLOWS)["sender"].to_list()
    if busiest.height > len(senders):
        notes.append(f"the {len(senders)} busiest of {busiest.height} senders shown")
    rel = lambda c: ((pl.col(c) - t0_ns) / 1e9).alias("t_s")  # noqa: E731
    d, n1 = thin(dest.with_columns(rel("start_ns")), what="windows")
    f, n2 = thin(flows.filter(pl.col("sender").is_in(senders)).with_columns(rel("start_ns")), what="flow windows")
    c, n3 = thin(cnps.with_columns(rel("ts_ns")), what="CNPs")
    notes += [n1, n2, n3]
    xs = x_scale(view_ns, t0_ns)
    zoom = linked_zoom("ecn_zoom")
    shade = window_rect(*seconds_domain(window_ns[0], window_ns[1], t0_ns), "finding", opacity=0.08, scale=xs)
    y = alt.Y("share:Q", title=f"CE share ({fmt_ns(bin_ns)} windows)", scale=alt.Scale(domain=[0, 1.05]))
    tip = [alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("packets:Q"), alt.Tooltip("ce:Q", title="CE"),
           alt.Tooltip("share:Q", format=".0%")]
    top = alt.layer(
        shade,
        alt.Chart(d).mark_line(interpolate="step-after", clip=True, color="#4e79a7").encode(
            x=alt.X("t_s:Q", title=TIME_TITLE, scale=xs), y=y, tooltip=tip),
        alt.Chart(pl.DataFrame({"share": [threshold]})).mark_rule(strokeDash=[4, 3], color="#e8a202").encode(
            y="share:Q", tooltip=[alt.Tooltip("share:Q", title="congested from", format=".0%")]),
    ).add_params(zoom).properties(width=PANEL_WIDTH, height=HEIGHT, title=f"to {destination}")
    colour = alt.Color("sender:N", sort=senders, title="sender")
    lower = [shade,
             alt.Chart(f).mark_line(interpolate="step-after", clip=True).encode(
                 x=alt.X("t_s:Q", title=TIME_TITLE, scale=xs), y=y, color=colour,
                 tooltip=[alt.Tooltip("sender:N"), *tip])]
    if c.height:
        lower.append(alt.Chart(c.with_columns(pl.lit(1.03).alias("share"))).mark_tick(
            thickness=2, size=14, clip=True).encode(
            x=alt.X("t_s:Q", scale=xs), y=alt.Y("share:Q", scale=alt.Scale(domain=[0, 1.05])), color=colour,
            tooltip=[alt.Tooltip("sender:N", title="CNP to"), alt.Tooltip("frame:Q"),
                     alt.Tooltip("t_s:Q", format=".6f")]))
    bottom = alt.layer(*lower).add_params(alt.selection_interval(name="ecn_zoom_flows", bind="scales",
                                                                 encodings=["x"])) \
        .properties(width=PANEL_WIDTH, height=HEIGHT,
                    title=f"per sender -> {destination}; ticks: CNPs ({cnps.height:,})")
    # the senders' packet rate on the wire: what "no slowdown" is read from (a mirror sees no rate limiter)
    rate = alt.layer(shade, alt.Chart(f.with_columns((pl.col("packets") / (bin_ns / 1e9)).alias("pps"))).mark_line(
        interpolate="step-after", clip=True).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=xs), y=alt.Y("pps:Q", title="packets/s on the wire"), color=colour,
        tooltip=[alt.Tooltip("sender:N"), alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("pps:Q", format=",.0f")])) \
        .add_params(alt.selection_interval(name="ecn_zoom_rate", bind="scales", encodings=["x"])) \
        .properties(width=PANEL_WIDTH, height=HEIGHT, title=f"each sender's packet rate to {destination}")
    return finish(alt.vconcat(top, bottom, rate).resolve_scale(color="independent"), title, notes)


@proof_chart(detector.NAME)
def ecn_congestion_proof(p: Proof) -> list[tuple[object, str]]:
    params = detector_params(p.finding, detector)
    if not p.has("rocev2_packets"):
        return [(empty("This capture has no RoCEv2 packets."), "")]
    span = p.window[1] - p.window[0]
    view = p.view or focus_domain(p.window, min_context_ns=max(20 * params.window_ns, span))
    lo, hi = data_range(view, (p.t0, p.t1))
    f = congestion_frames(p.cap, p.finding, params, lo, hi)
    chart = ce_share_chart(f["dest"], f["flows"], f["cnps"], t0_ns=p.t0, window_ns=p.window, view_ns=view,
                           bin_ns=f["bin_ns"], threshold=params.min_ce_share,
                           destination=p.finding.get("server") or "?", detector_window_ns=params.window_ns)
    return [(chart, "CE share of the ECN-capable packets to the destination per window (dashed: the share from which "
                    "a window is congested) and per sender, with each CNP the destination sent back as a tick; below, "
                    "each sender's packet rate on the wire.")]
