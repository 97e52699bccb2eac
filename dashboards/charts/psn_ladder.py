"""The PSN ladder of RoCEv2 queue pairs: x time, y PSN, one panel per QP direction, a mark per packet —
sent, resent (go-back-N), retried (after an RNR NAK), the responder's ACKs (and the ACK line through
them), NAKs and RNR NAKs — with the finding's window shaded. The proof of the RoCEv2 transport detectors (go-back-N and RNR loops).

:func:`ladder_points` cuts the points from the detectors' own reading of rocev2_packets
(``detectors.rocev2_common``: flows, unwrapped PSNs, resends) — pure Polars, no capture —, and
:func:`psn_ladder` draws them (pure Altair). A proof module passes the marks its detector decides
(which requests are resends of which trigger, which are RNR retries).

PSNs are drawn relative to the QP direction's first PSN (24-bit arithmetic: a wrap stays a step of
one). Row budget (dashboards/charts/base.py): above :data:`MAX_ROWS` points per panel, plain "sent"
points are thinned (every k-th) and every marked point is kept, and the subtitle says so.
"""
from __future__ import annotations

import altair as alt
import polars as pl

from detectors import rocev2_common as rc

from .base import (MAX_ROWS, PANEL_WIDTH, TIME_TITLE, data_range, empty, finish, focus_domain, linked_zoom,
                   seconds_domain, thin, window_rect, zoom_note)

SENT, RESENT, RETRY, ACK, NAK, RNR_NAK = ("sent", "resent (go-back-N)", "retried after RNR NAK", "ACK",
                                         "NAK (PSN sequence error)", "RNR NAK")
MARKS = (SENT, RESENT, RETRY, ACK, NAK, RNR_NAK)
COLOURS = ("#9aa5b1", "#e8702a", "#8e44ad", "#4e79a7", "#d62728", "#6f1d8c")
SHAPES = ("circle", "diamond", "square", "square", "triangle-down", "triangle-up")
SIZES = (14, 50, 50, 8, 170, 170)
MAX_QPS = 3  # panels (QP directions) drawn; the finding's come first
PANEL_HEIGHT = 170  # px per QP panel
# the ladder opens on the finding's window with this much context each side (RoCE timers are µs to ms,
# far below the dashboard's 1 s minimum context for request herds)
CONTEXT_FACTOR = 0.5
MIN_CONTEXT_NS = 20_000


def ladder_points(req: pl.DataFrame, rsp: pl.DataFrame, flows: pl.DataFrame, lo_ns: int, hi_ns: int,
                  resent: pl.DataFrame | None = None, retried: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per packet of the ``flows`` (``qp_pair``, ``requester``, ``label``) between ``lo_ns``
    and ``hi_ns``: ``qp`` (the label), ``t_ns``, ``frame``, ``psn_rel`` (PSN relative to the flow's
    first request, modulo 2^24), ``psn``, ``mark`` (one of :data:`MARKS`). Requests are "sent" unless
    their frame is in ``resent`` (a ``frame`` column: the go-back-N resends) or ``retried`` (RNR
    retries); responses are "ACK", "NAK (PSN sequence error)" (any NAK code, the code in the tooltip)
    or "RNR NAK". ``req``/``rsp`` are rocev2_common.requests / responses."""
    keys = flows.select(*rc.FLOW, "label")
    base = (req.join(keys, on=rc.FLOW, how="inner").group_by(rc.FLOW)
            .agg(pl.col("psn").sort_by("ts_ns").first().cast(pl.Int64).alias("_base")))
    in_range = pl.col("ts_ns").is_between(lo_ns, hi_ns)
    r = req.filter(in_range).join(keys, on=rc.FLOW, how="inner")
    mark = pl.lit(SENT)
    if retried is not None and retried.height:
        mark = pl.when(pl.col("frame").is_in(retried["frame"].implode())).then(pl.lit(RETRY)).otherwise(mark)
    if resent is not None and resent.height:
        mark = pl.when(pl.col("frame").is_in(resent["frame"].implode())).then(pl.lit(RESENT)).otherwise(mark)
    r = r.select("label", "ts_ns", "frame", "psn", mark.alias("mark"), pl.lit(None, pl.String).alias("detail"),
                 *rc.FLOW)
    s = rsp.filter(in_range).join(keys, on=rc.FLOW, how="inner").select(
        "label", "ts_ns", "frame", "psn",
        pl.when(pl.col("aeth_kind") == "rnr_nak").then(pl.lit(RNR_NAK))
        .when(pl.col("aeth_kind") == "nak").then(pl.lit(NAK)).otherwise(pl.lit(ACK)).alias("mark"),
        pl.when(pl.col("aeth_kind") == "rnr_nak").then(pl.format("timer code {}", "aeth_rnr_timer"))
        .when(pl.col("aeth_kind") == "nak").then(pl.format("NAK code {}", "aeth_nak_code")).alias("detail"),
        *rc.FLOW)
    pts = pl.concat([r, s], how="vertical_relaxed").join(base, on=rc.FLOW, how="inner")
    return (pts.select(pl.col("label").alias("qp"), pl.col("ts_ns").alias("t_ns"), "frame",
                       ((pl.col("psn").cast(pl.Int64) - pl.col("_base")) % rc.PSN_MOD).alias("psn_rel"),
                       "psn", "mark", "detail")
            .sort("qp", "t_ns", "frame"))


def finding_flows(req: pl.DataFrame, rsp: pl.DataFrame, frames: list[int]) -> pl.DataFrame:
    """The QP directions (``qp_pair``, ``requester``, ``label``: the detectors' resource) that the
    evidence ``frames`` belong to, requests or responses."""
    f = pl.Series(list(frames or []), dtype=pl.UInt32).implode()
    hit = pl.concat([req.filter(pl.col("frame").is_in(f)).select(rc.FLOW),
                     rsp.filter(pl.col("frame").is_in(f)).select(rc.FLOW)]).unique()
    if hit.height == 0:
        return pl.DataFrame(schema={"qp_pair": pl.UInt32, "requester": pl.String, "label": pl.String})
    facts = rc.flow_facts(req, rsp).join(hit, on=rc.FLOW, how="inner")
    labels = [rc.resource(r["requester"], r["requester_qpn"], r["responder"] or "?", r["responder_qpn"])
              for r in facts.iter_rows(named=True)]
    return facts.select(*rc.FLOW).with_columns(pl.Series("label", labels, dtype=pl.String))


def ladder_view(window_ns: tuple[int, int], extent_ns: tuple[int, int],
                view_ns: tuple[int, int] | None) -> tuple[tuple[int, int], tuple[int, int], str | None]:
    """(view, data range, note): the range the ladder opens on (``view_ns``, else the finding's window
    ± max(CONTEXT_FACTOR × its length, MIN_CONTEXT_NS)) and the range it carries data for."""
    if view_ns is not None:
        return view_ns, data_range(view_ns, extent_ns), None
    view = focus_domain(window_ns, factor=CONTEXT_FACTOR, min_context_ns=MIN_CONTEXT_NS)
    return view, data_range(view, extent_ns), zoom_note(view, window_ns)


def psn_ladder(points: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
               view_ns: tuple[int, int] | None = None, title: str = "PSN ladder",
               focus: list[str] | None = None, max_qps: int = MAX_QPS, max_rows: int = MAX_ROWS,
               notes: list[str | None] | None = None):
    """The ladder of ``points`` (:func:`ladder_points`): one panel per QP direction (``focus`` first,
    at most ``max_qps``), x seconds since ``t0_ns`` on a shared zoomable axis opening on ``view_ns``,
    y the relative PSN, colour and shape by mark; the finding's ``window_ns`` shaded; ``notes`` go
    first in the subtitle (the zoom note)."""
    if points.height == 0:
        return empty("No RoCEv2 packets of this finding's queue pairs to draw.", title)
    notes = list(notes or [])
    qps = points.group_by("qp").len().sort("len", descending=True)["qp"].to_list()
    order = [q for q in (focus or []) if q in qps] + [q for q in qps if q not in (focus or [])]
    if len(order) > max_qps:
        notes.append(f"the first {max_qps} of {len(order)} QP directions drawn (this finding's first)")
    order = order[:max_qps]
    if view_ns is None:
        lo, hi = int(points["t_ns"].min()), int(points["t_ns"].max())
        view_ns = (lo, hi)
    domain = seconds_domain(view_ns[0], view_ns[1], t0_ns)
    xscale = alt.Scale(domain=list(domain), nice=False)
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xscale)
    zoom = linked_zoom("psn_ladder_zoom")
    colour = alt.Color("mark:N", title="packet", scale=alt.Scale(domain=list(MARKS), range=list(COLOURS)))
    # one legend: the three channels share the field and the title, so Vega-Lite merges them
    shape = alt.Shape("mark:N", title="packet", scale=alt.Scale(domain=list(MARKS), range=list(SHAPES)))
    size = alt.Size("mark:N", title="packet", scale=alt.Scale(domain=list(MARKS), range=list(SIZES)))
    panels = []
    for k, qp in enumerate(order):
        pts = points.filter(pl.col("qp") == qp)
        pts, note = thin(pts, max_rows, keep=pl.col("mark") != SENT, what=f"packets of {qp}")
        notes.append(note)
        data = pts.with_columns(((pl.col("t_ns") - t0_ns) / 1e9).alias("t_s")).drop("t_ns")
        layers = []
        if window_ns is not None:
            w0, w1 = seconds_domain(window_ns[0], window_ns[1], t0_ns)
            layers.append(window_rect(w0, w1, "finding" if k == 0 else "", scale=xscale,
                                      min_width_s=(domain[1] - domain[0]) / 300,
                                      opacity=0.12))
        base = alt.Chart(data).mark_point(filled=True, opacity=0.85, clip=True).encode(
            x=x, y=alt.Y("psn_rel:Q", title=f"PSN − first ({qp})", scale=alt.Scale(zero=False)),
            color=colour, shape=shape, size=size,
            tooltip=[alt.Tooltip("mark:N", title="packet"), alt.Tooltip("frame:Q"), alt.Tooltip("psn:Q", title="PSN"),
                     alt.Tooltip("t_s:Q", format=".9f"), alt.Tooltip("detail:N")])
        # plain sends behind, the ACK line (the highest PSN acknowledged, a step after each ACK), then
        # the marked packets (resends, retries, NAKs) drawn over them
        sent = base.transform_filter(alt.datum.mark == SENT)
        ack_line = alt.Chart(data).transform_filter(alt.datum.mark == ACK).mark_line(
            interpolate="step-after", color=COLOURS[MARKS.index(ACK)], strokeWidth=1, opacity=0.8, clip=True).encode(
            x=x, y="psn_rel:Q")
        acks = base.transform_filter(alt.datum.mark == ACK)
        marked = base.transform_filter((alt.datum.mark != SENT) & (alt.datum.mark != ACK)).mark_point(
            filled=True, opacity=0.95, clip=True, stroke="#222", strokeWidth=0.4)
        if k == 0:
            sent = sent.add_params(zoom)
        layers += [sent, ack_line, acks, marked]
        panels.append(alt.layer(*layers).properties(width=PANEL_WIDTH, height=PANEL_HEIGHT))
    chart = panels[0] if len(panels) == 1 else alt.vconcat(*panels, spacing=10).resolve_scale(x="shared")
    return finish(chart, title, notes)
