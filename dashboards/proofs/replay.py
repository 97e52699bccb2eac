"""The replay proof: every copy of the finding's authenticators (or KDC requests) on the time axis,
numbered, coloured by what the detector decided about it and what the service answered.

:func:`replay_points` cuts the copies from the detector's own tables (``detectors.replay.copies`` /
``kdc_copies``: the same decisions the finding counts), :func:`replay_chart` draws them,
:func:`replay_proof` (registered for ``replay``) ties them together; a ``repeat_error`` finding (no
tags to draw) gets the generic evidence timeline.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.replay as detector

from ..charts.base import (PANEL_WIDTH, TIME_TITLE, empty, finish, linked_zoom, opening_view, seconds_domain,
                           thin, window_rect)
from .base import Proof, detector_params, generic_proof, proof_chart

CLASSES = ("first copy", "rejected copy", "accepted copy", "unanswered copy", "not counted")
COLOURS = ("#4e79a7", "#e8a202", "#7b0d1e", "#bab0ac", "#59a14f")
KDC_CLASSES = ("first copy", "replay (new flow)", "client's own retry")
KDC_COLOURS = ("#4e79a7", "#e15759", "#59a14f")


def replay_points(cap, finding: dict, params: detector.Params) -> pl.DataFrame:
    """The copies of the finding's service (authenticator_replay) or KDC (kdc_request_repeat) within
    its window: ``ts_ns``, ``n`` (the copy's number at its service, 0 for first copies), ``class``,
    ``src``, ``frame``, ``status``."""
    # from one replay-cache horizon before the first repeat (the first copies they repeat) to the last
    lo = int(finding["start_ns"]) - params.window_ns
    hi = int(finding["end_ns"] or finding["start_ns"])
    server = finding.get("server")
    if finding.get("kind") == "kdc_request_repeat":
        c = detector.kdc_copies(cap, params)
        if c.height == 0:
            return pl.DataFrame()
        c = c.filter((pl.col("dst") == server) & pl.col("ts_ns").is_between(lo, hi))
        if finding.get("resource"):
            c = c.filter(pl.concat_str(["sname", "realm"], separator="@") == finding["resource"])
        cls = (pl.when(pl.col("k") == 0).then(pl.lit("first copy")).when(pl.col("retry"))
               .then(pl.lit("client's own retry")).otherwise(pl.lit("replay (new flow)")))
        status = pl.when(pl.col("lookaside") & (pl.col("k") > 0)).then(pl.lit("same reply as the first (lookaside)")) \
            .otherwise(pl.col("status"))
    else:
        c = detector.copies(cap, params)
        if c.height == 0:
            return pl.DataFrame()
        c = c.filter((pl.col("dst") == server) & (pl.col("service") == finding.get("resource"))
                     & pl.col("ts_ns").is_between(lo, hi))
        cls = (pl.when(pl.col("k") == 0).then(pl.lit("first copy")).when(~pl.col("counted"))
               .then(pl.lit("not counted")).otherwise(pl.format("{} copy", pl.col("outcome"))))
        status = pl.col("status")
    return c.sort("ts_ns").select(
        "ts_ns", (pl.col("k") > 0).cast(pl.UInt32).cum_sum().alias("n"),
        cls.alias("class"), "src", "frame", status.alias("status"))


def replay_chart(points: pl.DataFrame, *, t0_ns: int, kdc: bool, window_ns: tuple[int, int] | None = None,
                 view_ns: tuple[int, int] | None = None) -> alt.LayerChart | alt.Chart:
    """Each copy at its time (x) and its running number among the copies (y), coloured by class."""
    title = "Copies of the same KDC request" if kdc else "Copies of the same authenticators"
    if points.height == 0:
        return empty("No copies of the finding's authenticators or requests in its window.", title)
    notes: list = []
    view = opening_view(window_ns, view_ns, notes)
    first = pl.col("class") == "first copy"
    pts, note = thin(points.with_columns(((pl.col("ts_ns") - t0_ns) / 1e9).alias("t_s")), keep=first,
                     what="copies")
    notes.append(note)
    scale = alt.Scale(domain=list(seconds_domain(view[0], view[1], t0_ns)), nice=False) if view \
        else alt.Scale(zero=False)
    classes, colours = (KDC_CLASSES, KDC_COLOURS) if kdc else (CLASSES, COLOURS)
    layers = []
    if window_ns:
        layers.append(window_rect(*seconds_domain(window_ns[0], window_ns[1], t0_ns), "", opacity=0.08, scale=scale))
    layers.append(alt.Chart(pts).mark_point(filled=True, size=30, clip=True).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=scale),
        y=alt.Y("n:Q", title="copies so far"),
        color=alt.Color("class:N", scale=alt.Scale(domain=list(classes), range=list(colours)), title=None),
        tooltip=[alt.Tooltip("class:N"), alt.Tooltip("src:N", title="from"), alt.Tooltip("frame:Q"),
                 alt.Tooltip("status:N", title="answer"), alt.Tooltip("t_s:Q", format=".6f")],
    ).add_params(linked_zoom("replay_zoom")))
    return finish(alt.layer(*layers).properties(width=PANEL_WIDTH, height=220), title, notes)


@proof_chart(detector.NAME)
def replay_proof(p: Proof) -> list[tuple[object, str]]:
    if p.finding.get("kind") == "repeat_error":
        return generic_proof(p)
    params = detector_params(p.finding, detector)
    kdc = p.finding.get("kind") == "kdc_request_repeat"
    pts = replay_points(p.cap, p.finding, params)
    what = ("byte-identical requests to this KDC: blue the first copy, red copies on new flows (replays), "
            "green the client's own retries on its flow" if kdc else
            "AP-REQs with identical replay-cache tags to this service: blue the first copy, orange copies the "
            "service rejected, dark red copies it accepted, grey unanswered, green resends on one connection "
            "(not counted)")
    return [(replay_chart(pts, t0_ns=p.t0, kdc=kdc, window_ns=p.window, view_ns=p.view),
             f"Each copy at its time and its running number: {what}; the finding's window shaded.")]
