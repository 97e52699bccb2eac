"""The NFSv4 delegation recall queue's proof: each recall from CB_RECALL to DELEGRETURN, each waiter
from its first NFS4ERR_DELAY'd request to the answer that let it through (its DELAY answers marked),
and the queue depth below, on one time axis.

:func:`recall_frames` cuts them from the detector's own tables (:mod:`detectors.delegation_recall_table`:
the rows the finding was built from), :func:`recall_queue_chart` draws them, :func:`recall_proof`
(registered for ``delegation_recall``) ties them together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.delegation_recall as detector
from detectors.delegation_recall_table import recall_table, waiter_table

from ..charts.base import (PANEL_WIDTH, TIME_TITLE, empty, finish, linked_zoom, opening_view, seconds_domain, thin,
                           window_rect)
from .base import Proof, detector_params, proof_chart
from .smb_break_queue import open_intervals_depth

_STATES = ["returned", "never returned", "waiting (DELAY answers)", "waiting, never through"]
_COLOURS = ["#e8a202", "#7b0d1e", "#4e79a7", "#e15759"]


def recall_frames(cap, finding: dict, params) -> dict:
    """The recalls of the finding's file at its server, and their waiters (with each DELAY answer)."""
    r = recall_table(cap, params)
    empty_w = waiter_table(cap, params, r=pl.DataFrame())
    if r.height == 0:
        return {"recalls": r, "waiters": empty_w}
    mine = pl.col("nfs_server") == finding.get("server")
    if finding.get("resource") is not None:
        mine = mine & (pl.col("resource") == finding["resource"])
    r = r.filter(mine.fill_null(False))
    w = waiter_table(cap, params) if r.height else empty_w
    return {"recalls": r, "waiters": w.filter(pl.col("rid").is_in(r["rid"].implode()))}


def recall_queue_chart(recalls: pl.DataFrame, waiters: pl.DataFrame, *, t0_ns: int,
                       window_ns: tuple[int, int] | None = None, end_ns: int | None = None,
                       view_ns: tuple[int, int] | None = None):
    """Top: a bar per recall (CB_RECALL → DELEGRETURN, or to the capture's end) and per waiter (first
    DELAY'd request → the answer that let it through), ticks at each DELAY'd request. Bottom: how many
    waiters were queued."""
    title = "CB_RECALL → DELEGRETURN, and the NFS4ERR_DELAY queue behind it"
    if recalls.height == 0:
        return empty("No delegation recall of this file is visible in the capture.", title)
    hi = int(end_ns or max(recalls["ts_ns"].max(), *(waiters["final_response_ts_ns"].drop_nulls().to_list() or [0])))
    notes: list = []
    view = opening_view(window_ns, view_ns, notes)
    if view is None:
        lo = int(recalls["ts_ns"].min())
        view = (lo - 1_000_000, hi + 1_000_000)
    domain = seconds_domain(view[0], view[1], t0_ns)
    xscale = alt.Scale(domain=list(domain), nice=False)
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xscale)
    rel = lambda c: ((c - t0_ns) / 1e9)  # noqa: E731
    bars_r = recalls.select(
        pl.format("recall {} → {}", pl.col("frame"), pl.col("holder_id")).alias("row"),
        rel(pl.col("ts_ns")).alias("t_s"), rel(pl.coalesce(pl.col("return_ts_ns"), pl.lit(hi))).alias("end_s"),
        pl.when(pl.col("return_ts_ns").is_null()).then(pl.lit(_STATES[1])).otherwise(pl.lit(_STATES[0])).alias("state"),
        pl.when(pl.col("latency_ns").is_null()).then(pl.lit("not returned"))
        .otherwise(pl.format("{} ms", (pl.col("latency_ns") / 1e6).round(1))).alias("label"))
    w, note = thin(waiters, max_rows=300, what="waiters")
    notes.append(note)
    bars_w = w.select(
        pl.format("  {} {}", pl.col("wclient"), pl.col("operation")).alias("row"), rel(pl.col("first_ts_ns")).alias("t_s"),
        rel(pl.coalesce(pl.col("final_response_ts_ns"), pl.lit(hi))).alias("end_s"),
        pl.when(pl.col("final_response_ts_ns").is_null()).then(pl.lit(_STATES[3])).otherwise(pl.lit(_STATES[2]))
        .alias("state"), pl.format("{} DELAY", pl.col("delays")).alias("label"))
    bars = pl.concat([bars_r, bars_w])
    order = bars["row"].to_list()
    y = alt.Y("row:N", title=None, sort=order, axis=alt.Axis(labelLimit=260))
    colour = alt.Color("state:N", scale=alt.Scale(domain=_STATES, range=_COLOURS), title=None)
    layers = []
    if window_ns:
        layers.append(window_rect(*seconds_domain(window_ns[0], window_ns[1], t0_ns), "", opacity=0.08, scale=xscale))
    base = alt.Chart(bars)
    layers += [base.mark_bar(height=12, clip=True).encode(
                   x=x, x2="end_s:Q", y=y, color=colour,
                   tooltip=[alt.Tooltip("row:N"), alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("end_s:Q", format=".6f"),
                            alt.Tooltip("label:N"), alt.Tooltip("state:N")]).add_params(linked_zoom("recall_zoom")),
               base.mark_text(align="left", dx=4, fontSize=11, clip=True).encode(x="end_s:Q", y=y, text="label:N")]
    ticks = w.select(pl.format("  {} {}", pl.col("wclient"), pl.col("operation")).alias("row"), "delay_ts_ns") \
        .explode("delay_ts_ns").drop_nulls().select("row", rel(pl.col("delay_ts_ns")).alias("t_s"))
    if ticks.height:
        layers.append(alt.Chart(ticks).mark_tick(color="black", thickness=2, size=14, clip=True).encode(
            x=x, y=y, tooltip=[alt.Tooltip("row:N"), alt.Tooltip("t_s:Q", format=".6f", title="NFS4ERR_DELAY'd request")]))
    top = alt.layer(*layers).properties(width=PANEL_WIDTH, height=alt.Step(22))
    depth = open_intervals_depth(waiters, "first_ts_ns", "final_response_ts_ns", "waiters queued", hi)
    depth = depth.with_columns(rel(pl.col("t_ns")).alias("t_s"))
    depth, note = thin(depth, what="queue changes")
    notes.append(note)
    bottom = alt.Chart(depth).mark_line(interpolate="step-after", clip=True).encode(
        x=x, y=alt.Y("depth:Q", title="waiters queued", axis=alt.Axis(tickMinStep=1)),
        tooltip=[alt.Tooltip("t_s:Q", format=".6f"), alt.Tooltip("depth:Q")]).properties(width=PANEL_WIDTH, height=130)
    return finish(alt.vconcat(top, bottom, spacing=8).resolve_scale(x="shared"), title, notes)


@proof_chart(detector.NAME)
def recall_proof(p: Proof) -> list[tuple[object, str]]:
    if not p.has("nfs_transactions"):
        return [(empty("This capture has no nfs_transactions frame (the NFS decoder is not installed)."), "")]
    if p.finding.get("kind") == "recall_unseen":
        return [(empty("The recall itself is not in the capture: the evidence frames are the NFS4ERR_DELAY "
                       "answers (listed below)."), "")]
    params = detector_params(p.finding, detector)
    f = recall_frames(p.cap, p.finding, params)
    return [(recall_queue_chart(f["recalls"], f["waiters"], t0_ns=p.t0, window_ns=p.window, end_ns=p.t1,
                                view_ns=p.view),
             "Each recall from CB_RECALL to DELEGRETURN and each waiting client from its first NFS4ERR_DELAY to "
             "its answer; below, how many clients queued.")]
