"""The TCP incast's proof: per fan-out round, the time it took against the time it would have taken
without the timeouts; and, for the worst incast rounds, every flow's timeline (request, answer, the
silent RTO gap) against the base RTT.

The rounds and flows are the detector's own (:func:`detectors.incast_rounds.flows` and
:func:`~detectors.incast_rounds.rounds` with the finding's parameters); :func:`round_chart` and
:func:`timeline_chart` draw them, :func:`incast_proof` (registered for ``incast``) ties them together.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.incast as detector
from analyzer.durations import fmt_ns
from detectors import incast_rounds as ir

from ..charts.base import MAX_ROWS, PANEL_WIDTH, TIME_TITLE, empty, finish, thin
from .base import Proof, detector_params, proof_chart

TIMELINE_ROUNDS = 3  # incast rounds drawn flow by flow (the slowest)
PHASE_COLOURS = {"answer": "#4e79a7", "RTO gap (silent)": "#e15759", "after the timeout": "#e8a202"}


def incast_frames(capture, finding: dict, params) -> dict:
    """The finding's client's flows (``flows``) and rounds (``rounds``), as the detector measured them."""
    f = ir.flows(capture, params)
    client = finding.get("client")
    if client is not None:
        f = f.filter(pl.col("client") == client)
    return {"flows": f, "rounds": ir.rounds(f, params)}


def round_chart(rounds: pl.DataFrame, *, t0_ns: int) -> alt.Chart:
    """Per fan-out round (at its start time): how long it took and how long it would have taken
    without the timeouts; incast rounds marked."""
    title = "Fan-out rounds: round time against the time without the timeouts"
    r = rounds.filter(pl.col("fanout"))
    if r.height == 0:
        return empty("No fan-out round of this client.", title)
    r, note = thin(r, MAX_ROWS // 2, keep=pl.col("incast"), what="rounds")
    long = pl.concat([
        r.select(((pl.col("start_ns") - t0_ns) / 1e9).alias("t_s"), "round", "fan_in", "timed_out",
                 (pl.col("round_ns") / 1e6).alias("ms"), pl.lit("round time").alias("what")),
        r.select(((pl.col("start_ns") - t0_ns) / 1e9).alias("t_s"), "round", "fan_in", "timed_out",
                 (pl.col("ideal_ns") / 1e6).alias("ms"), pl.lit("without the timeouts").alias("what")),
    ])
    chart = alt.Chart(long).mark_point(filled=True, size=50).encode(
        x=alt.X("t_s:Q", title=TIME_TITLE, scale=alt.Scale(zero=False)),
        y=alt.Y("ms:Q", title="ms"),
        color=alt.Color("what:N", title=None, scale=alt.Scale(domain=["round time", "without the timeouts"],
                                                             range=["#e15759", "#4e79a7"])),
        tooltip=["round:Q", "fan_in:Q", "timed_out:Q", alt.Tooltip("ms:Q", format=".1f"), "what:N"],
    ).properties(width=PANEL_WIDTH, height=220)
    return finish(chart, title, [note])


def timeline_chart(flows: pl.DataFrame, rounds: pl.DataFrame, *, n_rounds: int = TIMELINE_ROUNDS) -> alt.Chart:
    """The slowest ``n_rounds`` incast rounds, one row per flow: request to the answer's last segment,
    the silent gap before its retransmission in red; time since the round's first request in ms.
    The subtitle gives each round's base RTT and RTO gap."""
    title = "Flows of the slowest incast rounds (ms since the round's first request)"
    worst = rounds.filter(pl.col("incast")).sort("round_ns", descending=True).head(n_rounds)
    if worst.height == 0:
        return empty("No incast round of this client.", title)
    f = flows.join(worst.select("round", "start_ns", "base_rtt"), on="round").with_columns(
        pl.format("round {} · {}", "round", "server").alias("flow"))
    rel = lambda c: ((pl.col(c) - pl.col("start_ns")) / 1e6)  # noqa: E731
    silent_to = pl.col("retx_ts") - pl.col("gap_ns").fill_null(0).cast(pl.Int64)
    answer = f.select("flow", "round", "server", rel("req_ts").alias("a"),
                      pl.when(pl.col("timed_out")).then(((silent_to - pl.col("start_ns")) / 1e6))
                      .otherwise(rel("resp_last_ts")).alias("b"), pl.lit("answer").alias("phase"))
    gap = f.filter(pl.col("timed_out")).select(
        "flow", "round", "server", ((silent_to - pl.col("start_ns")) / 1e6).alias("a"), rel("retx_ts").alias("b"),
        pl.lit("RTO gap (silent)").alias("phase"))
    after = f.filter(pl.col("timed_out")).select(
        "flow", "round", "server", rel("retx_ts").alias("a"), rel("resp_last_ts").alias("b"),
        pl.lit("after the timeout").alias("phase"))
    bars = pl.concat([answer, gap, after]).filter(pl.col("b") >= pl.col("a"))
    notes = [f"round {r['round']}: base RTT {fmt_ns(r['base_rtt']) if r['base_rtt'] else 'unmeasured'}, "
             f"longest RTO gap {fmt_ns(r['max_gap_ns'] or 0)}"
             + (f" ({(r['max_gap_ns'] or 0) / r['base_rtt']:,.0f}x the RTT)" if r["base_rtt"] else "")
             + f", {r['timed_out']} of {r['flows']} flows timed out, {fmt_ns(r['round_ns'])} against "
               f"{fmt_ns(r['ideal_ns'])} without the timeouts" for r in worst.iter_rows(named=True)]
    chart = alt.Chart(bars).mark_bar(height=6).encode(
        x=alt.X("a:Q", title="ms since the round's first request"), x2="b:Q",
        y=alt.Y("flow:N", title=None, sort=None),
        color=alt.Color("phase:N", title=None, scale=alt.Scale(domain=list(PHASE_COLOURS),
                                                              range=list(PHASE_COLOURS.values()))),
        tooltip=["flow:N", "phase:N", alt.Tooltip("a:Q", format=".3f"), alt.Tooltip("b:Q", format=".3f")],
    ).properties(width=PANEL_WIDTH, height=max(120, 9 * bars["flow"].n_unique()))
    return finish(chart, title, notes)


@proof_chart(detector.NAME)
def incast_proof(p: Proof) -> list[tuple[object, str]]:
    params = detector_params(p.finding, detector)
    fr = incast_frames(p.cap, p.finding, params)
    return [
        (round_chart(fr["rounds"], t0_ns=p.t0),
         "Each fan-out round of the client: red, the time from its first request to the last segment of its "
         "slowest answer; blue, the same with every flow's timeout stall taken out. The gap between them is the "
         "goodput the timeouts cost."),
        (timeline_chart(fr["flows"], fr["rounds"]),
         "The slowest incast rounds flow by flow: blue, the request and the answer up to the silence; red, the "
         "server's silence before its retransmission (its RTO), against a base RTT of microseconds; orange, the "
         "rest of the answer after the timeout. The round ends only with the slowest flow."),
    ]
