"""incast's measurements: the flows of each fan-out round, which of them sat out a timeout, and the rounds.

:func:`flows` gives one row per request/response turn of a TCP connection (a run of the client's
payload followed by the server's; the same reading as conn_churn's TCP turns), grouped into rounds
per client address, with the tcp_stall ``rto`` episode (detectors/tcp_stall_kinds.py :func:`rto`,
the same episodes and thresholds tcp_stall reports) that fell inside the response, if any.
:func:`rounds` aggregates them per round. Both are columns only (Polars), no Python loop per flow,
and the proof chart (dashboards/proofs/incast.py) reads the same frames.
"""
from __future__ import annotations

import polars as pl

from analyzer.tcp import analysis as an

from . import tcp_stall, tcp_stall_kinds as ep
from .base import resolution_ns

# what it reads of tcp_segments: what tcp_stall's batches read (a detector's COLUMNS, base.py)
SEGMENT_COLUMNS = tcp_stall.SEGMENT_COLUMNS

FLOW_SCHEMA = {
    "conn": pl.UInt32, "client": pl.String, "server": pl.String, "server_ep": pl.String, "client_ep": pl.String,
    "rtt": pl.Float64, "both_directions": pl.Boolean, "round": pl.Int64, "req_ts": pl.Int64, "req_frame": pl.UInt32,
    "resp_first_ts": pl.Int64, "resp_last_ts": pl.Int64, "resp_bytes": pl.Int64, "active_to": pl.Int64,
    "in_flight": pl.UInt32, "in_flight_at_start": pl.UInt32, "concurrent": pl.Boolean,
    "timed_out": pl.Boolean, "gap_ns": pl.Float64, "stall_ns": pl.Float64, "silence_start_ns": pl.Int64,
    "retx_ts": pl.Int64, "episode_frames": pl.List(pl.UInt32),
}


def _episodes(seg: pl.DataFrame, conns: pl.DataFrame, res: float) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(request/response turns, per-connection info, rto episodes) exactly as tcp_stall computes them,
    with its default parameters (so that a timed-out flow here is an rto episode there), in
    tcp_stall's batches of whole connections (everything here is per connection)."""
    tp = tcp_stall.Params()
    turns, infos, episodes = [], [], []
    for batch_segments, batch_conns in tcp_stall.segment_batches(seg, conns):
        s, info = tcp_stall.linked_segments(batch_segments, batch_conns, tp, res)
        eps = ep.rto(s, tp, res)
        if eps.height:
            # the server's data episodes only: the answers that sat out the timer
            episodes.append(eps.filter((pl.col("kind") == "rto") & ~pl.col("from_client")
                                       & ~pl.col("syn").fill_null(False)))
        turns.append(_turns(s))
        infos.append(info)
    if not infos:
        return pl.DataFrame(), pl.DataFrame(), pl.DataFrame()
    eps = pl.concat(episodes, how="diagonal_relaxed") if episodes else pl.DataFrame()
    return pl.concat(turns, how="diagonal_relaxed"), pl.concat(infos, how="diagonal_relaxed"), eps


def _turns(s: pl.DataFrame) -> pl.DataFrame:
    """One row per request/response turn: the client's payload run and the server's answer after it.
    The client's retransmissions are left out: a request resent on its timer (the answer carrying
    its ACK was lost) is no new request and does not split the answer it is waiting for."""
    resent = pl.col("from_client") & ((pl.col("analysis") & an.ANY_RETRANSMISSION) != 0)
    pay = s.lazy().filter((pl.col("seglen") > 0) & ~resent).select(
        "conn", "from_client", "ts_ns", "frame", "seglen", "analysis", "_i").sort("conn", "_i")
    start = pl.col("from_client") & (~pl.col("from_client").shift(1).over("conn")).fill_null(True)
    pay = pay.with_columns(start.cast(pl.Int64).cum_sum().over("conn").alias("turn")).filter(pl.col("turn") > 0)
    srv = ~pl.col("from_client")
    fresh = (pl.col("analysis") & an.ANY_RETRANSMISSION) == 0
    t = pay.group_by("conn", "turn").agg(
        pl.col("ts_ns").filter(pl.col("from_client")).min().alias("req_ts"),
        pl.col("frame").filter(pl.col("from_client")).min().alias("req_frame"),
        pl.col("ts_ns").filter(srv).min().alias("resp_first_ts"),
        pl.col("ts_ns").filter(srv).max().alias("resp_last_ts"),
        pl.col("seglen").filter(srv & fresh).cast(pl.Int64).sum().alias("resp_bytes"),
    ).filter(pl.col("resp_first_ts").is_not_null())
    return t.collect()


def _suspects(seg: pl.DataFrame, conns: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(segments, connections) of the clients that may have a timed-out flow: those with a server
    segment that could begin one of tcp_stall's data ``rto`` episodes (timed and carrying data or a
    FIN, not a SYN/ACK, with the flags of a timer's retransmission: every segment of such an episode
    has them). Any other client has no timed-out flow, hence no incast round; and every measurement
    here is per connection (turns, episodes) or per client (rounds, base RTT, fan-in), so a suspect's
    rows are the same as the whole capture's. One pass over the segments' columns; on a capture with
    few timeouts it leaves a small share of the connections for the expensive part."""
    flags = pl.col("tcp_flags").fill_null(0)
    first = (~pl.col("from_client") & pl.col("ts_ns").is_not_null() & ep.TIMER_RETRANSMISSION
             & ((flags & ep.SYN) == 0) & ((pl.col("seglen") > 0) | ((flags & ep.FIN) != 0)))
    timed = seg.lazy().filter(first).select("conn").unique()
    clients = conns.lazy().join(timed, on="conn", how="semi").select("client").unique()
    kept = conns.lazy().join(clients, on="client", how="semi", nulls_equal=True).collect()
    return seg.filter(pl.col("conn").is_in(kept["conn"].implode())), kept


def _answers(t: pl.DataFrame, upto: str, since: str) -> pl.Series:
    """Per row of ``t``: the answers of its round that began at or before the time in column ``upto``
    (``active_from``) less those that had ended (``active_to``) before the time in ``since``. With
    one time for both, the answers in flight at that moment; with the row's own end and start, the
    answers that overlapped it (itself included). Two as-of joins on the sorted ends, no loop."""
    key = ["client", "round"]
    q = t.select(*key, pl.col(upto).alias("_q"), pl.col(since).alias("_s"), pl.int_range(pl.len()).alias("_row"))
    ups = (t.select(*key, pl.col("active_from").alias("_q")).sort(*key, "_q")
           .with_columns(pl.int_range(1, pl.len() + 1).over(key).alias("_up")))
    downs = (t.select(*key, pl.col("active_to").alias("_s")).sort(*key, "_s")
             .with_columns(pl.int_range(1, pl.len() + 1).over(key).alias("_down")))
    # several answers can share one timestamp: keep the highest count per time (the last of them)
    ups = ups.group_by(*key, "_q").agg(pl.col("_up").max()).sort("_q")
    downs = downs.group_by(*key, "_s").agg(pl.col("_down").max()).sort("_s")
    q = q.sort("_q").join_asof(ups, on="_q", by=key, strategy="backward", check_sortedness=False)
    q = q.sort("_s").join_asof(downs, on="_s", by=key, strategy="backward", allow_exact_matches=False,
                               check_sortedness=False)
    level = (pl.col("_up").fill_null(0) - pl.col("_down").fill_null(0)).clip(lower_bound=0).cast(pl.UInt32)
    return q.sort("_row").select(level)[:, 0]


def flows(capture, p, suspects_only: bool = False) -> pl.DataFrame:
    """One row per answered request (FLOW_SCHEMA), in rounds per client address: a request starts a
    new round when it comes more than ``max(p.fanout_gap_ns, p.fanout_gap_rtts x base RTT)`` after
    the client's previous one (base RTT: the smallest path RTT of the client's connections).
    An answer is in flight from its first segment until its last, or until the first transmission
    of the data it then lost (``silence_start_ns``): ``in_flight`` counts the answers of the round
    that were in flight at some time while this one was (itself included), ``in_flight_at_start``
    those in flight when it began; the round's fan-in is the most answers in flight at once (the
    largest ``in_flight_at_start``). ``timed_out``: a tcp_stall rto episode of the server began
    inside the answer and its first silence (``gap_ns``) was at least ``max(p.min_gap_ns,
    p.min_gap_rtts x RTT)``; ``concurrent``: ``in_flight`` reached
    ``p.min_fan_in``. ``suspects_only``: only the clients that may have a timed-out flow
    (:func:`_suspects`; their rows are the same, the detector's early exit)."""
    try:
        seg = capture.frame("tcp_segments")
        conns = capture.frame("connections")
    except KeyError:
        return pl.DataFrame(schema=FLOW_SCHEMA)
    if seg.height == 0 or conns.height == 0:
        return pl.DataFrame(schema=FLOW_SCHEMA)
    if suspects_only:
        seg, conns = _suspects(seg, conns)
        if conns.height == 0:
            return pl.DataFrame(schema=FLOW_SCHEMA)
    res = resolution_ns(capture)
    t, info, eps = _episodes(seg, conns, res)
    if t.height == 0:
        return pl.DataFrame(schema=FLOW_SCHEMA)
    t = t.join(info.select("conn", "client", "server", "server_ep", "client_ep", "rtt", "both_directions"),
               on="conn", how="inner")
    base = pl.col("rtt").min().over("client")
    gap_limit = pl.max_horizontal(pl.lit(float(p.fanout_gap_ns)), base.fill_null(0.0) * p.fanout_gap_rtts)
    t = t.sort("client", "req_ts", "conn").with_columns(
        ((pl.col("req_ts") - pl.col("req_ts").shift(1).over("client")) > gap_limit).fill_null(True)
        .cast(pl.Int64).cum_sum().over("client").alias("round"))
    if eps.height:
        e = eps.select("conn", pl.col("start_ns").alias("silence_start_ns"), pl.col("end_ns").alias("retx_ts"),
                       pl.col("gaps").list.first().alias("gap_ns"), "stall_ns",
                       pl.col("frames").alias("episode_frames"))
        m = t.select("conn", "turn", "req_ts", "resp_last_ts", "rtt").join(e, on="conn").filter(
            pl.col("silence_start_ns").is_between(pl.col("req_ts"), pl.col("resp_last_ts"))
            & (pl.col("gap_ns") >= pl.max_horizontal(pl.lit(float(p.min_gap_ns)),
                                                      pl.col("rtt").fill_null(float("inf")) * p.min_gap_rtts)))
        m = m.group_by("conn", "turn").agg(
            pl.col("gap_ns").max(), pl.col("stall_ns").sum(), pl.col("silence_start_ns").min(),
            pl.col("retx_ts").max(), pl.col("episode_frames").list.explode(keep_nulls=False, empty_as_null=False))
        t = t.join(m, on=["conn", "turn"], how="left")
    else:
        t = t.with_columns(pl.lit(None, pl.Float64).alias("gap_ns"), pl.lit(None, pl.Float64).alias("stall_ns"),
                           pl.lit(None, pl.Int64).alias("silence_start_ns"), pl.lit(None, pl.Int64).alias("retx_ts"),
                           pl.lit(None, pl.List(pl.UInt32)).alias("episode_frames"))
    t = t.with_columns(pl.col("gap_ns").is_not_null().alias("timed_out"), pl.col("resp_first_ts").alias("active_from"),
                       pl.max_horizontal("resp_first_ts", pl.coalesce("silence_start_ns", "resp_last_ts"))
                       .alias("active_to"))
    t = t.with_columns(_answers(t, "active_to", "active_from").alias("in_flight"),
                       _answers(t, "active_from", "active_from").alias("in_flight_at_start"))
    t = t.with_columns((pl.col("in_flight") >= p.min_fan_in).alias("concurrent"))
    return t.select(pl.col(c).cast(d) for c, d in FLOW_SCHEMA.items()).sort("client", "round", "req_ts")


ROUND_SCHEMA = {
    "client": pl.String, "round": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "flows": pl.UInt32,
    "fan_in": pl.UInt32, "timed_out": pl.UInt32, "servers_timed_out": pl.List(pl.String),
    "base_rtt": pl.Float64, "max_gap_ns": pl.Float64, "median_gap_ns": pl.Float64, "round_ns": pl.Float64,
    "ideal_ns": pl.Float64, "bytes": pl.Int64, "fanout": pl.Boolean, "incast": pl.Boolean,
    "both_directions": pl.Boolean, "req_frame": pl.UInt32, "frames": pl.List(pl.UInt32),
}


def rounds(f: pl.DataFrame, p) -> pl.DataFrame:
    """One row per round (ROUND_SCHEMA): ``fanout`` when its fan-in (distinct servers whose answers
    overlapped) reaches ``p.min_fan_in``; ``incast`` when it also had at least ``p.min_timed_out``
    concurrent flows that timed out. ``round_ns``: the first request to the last answer's last
    segment (the round completes with the slowest flow); ``ideal_ns``: the same with each flow's
    stall (tcp_stall's: from the lost data's first transmission to its retransmission, less one RTT)
    taken out, i.e. what the round would have taken without the timeouts (at most ``round_ns``)."""
    if f.height == 0:
        return pl.DataFrame(schema=ROUND_SCHEMA)
    conc = pl.col("concurrent")
    to = conc & pl.col("timed_out")
    r = f.group_by("client", "round").agg(
        pl.col("req_ts").min().alias("start_ns"), pl.col("resp_last_ts").max().alias("end_ns"),
        pl.len().cast(pl.UInt32).alias("flows"),
        pl.col("in_flight_at_start").max().cast(pl.UInt32).alias("fan_in"),
        to.sum().cast(pl.UInt32).alias("timed_out"),
        pl.col("server").filter(to).unique().sort().alias("servers_timed_out"),
        pl.col("rtt").min().alias("base_rtt"),
        pl.col("gap_ns").filter(to).max().alias("max_gap_ns"),
        pl.col("gap_ns").filter(to).median().alias("median_gap_ns"),
        (pl.col("resp_last_ts") - pl.col("stall_ns").fill_null(0.0)).max().alias("_ideal_end"),
        pl.col("resp_bytes").sum().alias("bytes"),
        pl.col("both_directions").all(),
        pl.col("req_frame").min(),
        pl.col("episode_frames").filter(to).list.explode(keep_nulls=False, empty_as_null=False).drop_nulls()
        .alias("frames"),
    )
    r = r.with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64).alias("round_ns"),
        (pl.col("fan_in") >= p.min_fan_in).alias("fanout"),
    ).with_columns(
        pl.min_horizontal(pl.col("round_ns"), (pl.col("_ideal_end") - pl.col("start_ns")).clip(lower_bound=0.0))
        .alias("ideal_ns"),
        (pl.col("fanout") & (pl.col("timed_out") >= p.min_timed_out)).alias("incast"),
    )
    return r.select(pl.col(c).cast(d) for c, d in ROUND_SCHEMA.items()).sort("client", "round")
