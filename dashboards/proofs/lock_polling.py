"""The lock-polling proof: one swim-lane per client on the contended lock — its denied polls, the time
it held the lock, its grants — and a lane of its own for the time the lock sat free between a release
and the next grant (what polling costs: nobody held it while everybody waited).

:func:`lock_lanes` cuts the episode from the detector's own tables (:func:`detectors.lock_polling.
lock_tables`, :func:`~detectors.lock_polling.episode_summaries`: the same waits, holds and free gaps
the finding counted), :func:`lock_lanes_chart` draws them, :func:`lock_polling_proof` (registered
for ``lock_polling``) ties them together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.lock_polling as detector

from ..charts.base import (PANEL_WIDTH, TIME_TITLE, empty, finish, linked_zoom, opening_view,
                           seconds_domain, thin, window_rect)
from .base import Proof, detector_params, proof_chart

FREE_LANE = "lock free"
STATES = ("holding", "lock free")
STATE_COLOURS = ("#4e79a7", "#e15759")
POINTS = ("denied poll", "granted", "released")
POINT_COLOURS = ("#e8a202", "#59a14f", "#4e79a7")


def lock_lanes(capture, finding: dict, params=None) -> dict[str, pl.DataFrame]:
    """The finding's episode as lanes: ``spans`` (lane, state, start_ns, end_ns) — holds and free gaps —
    and ``points`` (lane, what, ts_ns, frame) — denied polls, grants, releases. Empty frames when the
    finding's episode is not found (another capture, other parameters)."""
    params = params or detector.Params()
    spans = pl.DataFrame(schema={"lane": pl.String, "state": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64})
    points = pl.DataFrame(schema={"lane": pl.String, "what": pl.String, "ts_ns": pl.Int64, "frame": pl.UInt32})
    t = detector.lock_tables(capture, params)
    match = [s for s in detector.episode_summaries(capture, params)
             if s["start_ns"] == finding.get("start_ns") and s["server"] == finding.get("server")
             and s["resource"] == finding.get("resource")]
    if not match:
        return {"spans": spans, "points": points}
    ep = match[0]
    w = t["waits"].filter(pl.col("episode") == ep["episode"])
    gkey = w["gkey"][0]
    e0, e1 = ep["start_ns"], ep["end_ns"]
    ev = t["events"].filter((pl.col("gkey") == gkey) & (pl.col("ts_ns") >= e0 - (e1 - e0) // 10)
                            & (pl.col("ts_ns") <= e1 + (e1 - e0) // 10))
    holds = t["holds"].filter((pl.col("gkey") == gkey) & (pl.col("ts_ns") <= e1)
                              & (pl.col("release_ns").is_null() | (pl.col("release_ns") >= e0)))
    gaps = t["gaps"].filter(pl.col("episode") == ep["episode"])
    spans = pl.concat([
        holds.select(pl.col("waiter").alias("lane"), pl.lit("holding").alias("state"), pl.col("ts_ns").alias("start_ns"),
                     pl.coalesce("release_ns", pl.lit(e1, pl.Int64)).alias("end_ns")),
        gaps.select(pl.lit(FREE_LANE).alias("lane"), pl.lit("lock free").alias("state"),
                    pl.col("release_ns").alias("start_ns"), pl.col("grant_ns").alias("end_ns")),
    ])
    what = pl.col("outcome").replace_strict(["denied", "granted", "blocked"], ["denied poll", "granted", "denied poll"],
                                            default=None, return_dtype=pl.String)
    # a release is what ended a hold (a LOCKU, or the holder's CLOSE): not every CLOSE of the file
    releases = holds.filter(pl.col("release_ns").is_not_null()).select(
        pl.col("waiter").alias("lane"), pl.lit("released").alias("what"), pl.col("release_ns").alias("ts_ns"),
        pl.col("release_frame").alias("frame"))
    points = pl.concat([ev.select(pl.col("waiter").alias("lane"), what.alias("what"), "ts_ns", "frame")
                        .drop_nulls("what"), releases])
    return {"spans": spans, "points": points}


def lock_lanes_chart(spans: pl.DataFrame, points: pl.DataFrame, *, t0_ns: int,
                     window_ns: tuple[int, int] | None = None, view_ns: tuple[int, int] | None = None):
    """Swim-lanes per client: holds as bars, denied polls / grants / releases as ticks, and the
    ``lock free`` lane with the gaps between a release and the next grant."""
    title = "Who held the lock, who polled, and when it sat free"
    if spans.height == 0 and points.height == 0:
        return empty("The finding's lock episode is not in this capture's lock operations.", title)
    notes: list = []
    view = opening_view(window_ns, view_ns, notes)
    lanes = sorted(set(points["lane"].to_list()) | (set(spans["lane"].to_list()) - {FREE_LANE})) + [FREE_LANE]
    if view is None:
        lo = min(int(x) for x in (spans["start_ns"].min(), points["ts_ns"].min()) if x is not None)
        hi = max(int(x) for x in (spans["end_ns"].max(), points["ts_ns"].max()) if x is not None)
        view = (lo, hi)
    xscale = alt.Scale(domain=list(seconds_domain(view[0], view[1], t0_ns)), nice=False)
    y = alt.Y("lane:N", title=None, sort=lanes, axis=alt.Axis(labelLimit=220))
    s = spans.with_columns(((pl.col("start_ns") - t0_ns) / 1e9).alias("start_s"),
                           ((pl.col("end_ns") - t0_ns) / 1e9).alias("end_s"),
                           ((pl.col("end_ns") - pl.col("start_ns")) / 1e6).alias("ms"))
    p, note = thin(points.with_columns(((pl.col("ts_ns") - t0_ns) / 1e9).alias("t_s")),
                   keep=pl.col("what") != "denied poll", what="lock operations")
    notes.append(note)
    zoom = linked_zoom("lock_zoom")
    layers = []
    if window_ns:
        layers.append(window_rect(*seconds_domain(window_ns[0], window_ns[1], t0_ns), "", opacity=0.06, scale=xscale))
    layers.append(alt.Chart(s).mark_bar(height=14, clip=True).encode(
        x=alt.X("start_s:Q", title=TIME_TITLE, scale=xscale), x2="end_s:Q", y=y,
        color=alt.Color("state:N", scale=alt.Scale(domain=list(STATES), range=list(STATE_COLOURS)), title=None),
        tooltip=[alt.Tooltip("lane:N", title="client"), alt.Tooltip("state:N"),
                 alt.Tooltip("start_s:Q", format=".6f"), alt.Tooltip("ms:Q", format=".3f", title="ms")],
    ).add_params(zoom))
    layers.append(alt.Chart(p).mark_tick(thickness=2, size=18, clip=True).encode(
        x=alt.X("t_s:Q", scale=xscale), y=y,
        color=alt.Color("what:N", scale=alt.Scale(domain=list(POINTS), range=list(POINT_COLOURS)), title=None),
        tooltip=[alt.Tooltip("lane:N", title="client"), alt.Tooltip("what:N"), alt.Tooltip("t_s:Q", format=".6f"),
                 alt.Tooltip("frame:Q")]))
    chart = alt.layer(*layers).resolve_scale(color="independent").properties(width=PANEL_WIDTH,
                                                                             height=alt.Step(26))
    return finish(chart, title, notes)


@proof_chart(detector.NAME)
def lock_polling_proof(p: Proof) -> list[tuple[object, str]]:
    if not p.has("nfs_transactions"):
        return [(empty("This capture has no nfs_transactions frame (the NFS decoder is not installed)."), "")]
    lanes = lock_lanes(p.cap, p.finding, detector_params(p.finding, detector))
    return [(lock_lanes_chart(lanes["spans"], lanes["points"], t0_ns=p.t0, window_ns=p.window, view_ns=p.view),
             "One lane per client: its denied polls (ticks), the time it held the lock (bars) and its grants; the "
             "red lane is the time the lock sat free between a release and the next grant while clients waited.")]
