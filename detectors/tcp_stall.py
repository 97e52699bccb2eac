"""TCP stall: time a connection spends unable to send, and why.

The pathology
    A TCP sender that has data to send but may not: it waits on its retransmission timer, on the peer's
    delayed ACK, on a closed or full receive window, or on a congestion window that was thrown away
    after an idle period. On fast networks these waits are fixed timers (200 ms, 40 ms, 1 s) that are
    hundreds or thousands of round trips long, so they dominate the time a request takes.

What is measured (per connection and sending side, one finding per kind)
    The path RTT: the smaller of the handshake RTT (``initial_rtt_ns``: most recent SYN to the first ACK
    after it) and the sum of the two ACK-timing halves (the smallest Karn-clean ``rtt_ns`` of the ACKs
    each side sends: capture point -> client -> capture point plus capture point -> server -> capture
    point), which is right from any vantage point and ignores delayed ACKs. Every threshold is the
    larger of an absolute floor and a multiple of that RTT, and never below the timestamp resolution.

    ``rto``: a retransmission (``tcp.analysis.retransmission``, not a fast retransmission or
        out-of-order segment) after the sender had been silent (no data, SYN or FIN) for at least
        ``max(rto_min_gap_ns, rto_gap_rtts x RTT)`` and at most ``rto_max_gap_ns``. SYN retransmissions
        count when the handshake then completed (unanswered SYNs are conn_churn's and retry_storm's).
        Back-to-back timeouts (exponential backoff, RFC 6298 5.5) are one episode. Stall = from the first
        transmission of the retransmitted data to the retransmission that ended the silence, minus one
        RTT. The explanation names the timer: a 200-450 ms first timeout is a minimum RTO (Linux: 200 ms
        + SRTT; Windows: 300 ms), ~1 s on a SYN the initial RTO (RFC 6298 2.1), and whether it doubled.
        The RTO-min mismatch is an episode that loses ``rto_mismatch_rtts`` RTTs or more (200 ms is 25
        RTTs at 8 ms: "a path whose RTT is µs or a few ms").
    ``delayed_ack``: the Nagle / delayed-ACK interaction (RFC 896, RFC 1122 4.2.3.2, RFC 9293 3.8.6.2):
        side A's data segment S is acknowledged by a *pure* ACK from B that came at least
        ``max(delack_min_ns, delack_rtts x RTT)`` after it (a delayed-ACK timer: ~40 ms Linux, ~200 ms
        Windows), and A's very next data segment N is small (under the MSS) and leaves within
        ``resume_rtts x RTT + resume_slack_ns`` of that ACK, with no data from B in between: A had N
        ready and held it until the ACK. Stall = N - S - RTT. Reported from ``delack_min_events`` held
        segments per connection side.
    ``zero_window``: the receiver advertised window 0 (RFC 9293 3.8.6.1) for at least
        ``max(window_min_ns, window_rtts x RTT)`` while the sender was blocked (it sent zero-window
        probes, or resumed sending within the resume window of the reopening). Stall = time closed.
    ``window_full``: the sender filled the advertised window (``tcp.analysis.window_full``) and its next
        data left only after the receiver's ACK or window update, at least ``max(window_min_ns,
        window_rtts x RTT)`` later. Stall = wait - RTT.
    Transfers (for the two kinds below): a run of one side's payload with no payload from the peer in
        between and no silence longer than ``2 x RTT + resume_slack_ns`` (slow start sends every round
        trip). Flight is measured per RTT round (bytes of new data sent in each RTT-long slot from the
        transfer's first segment; the first round is its first ``first_round_rtts`` RTT), which reads
        the same from any vantage point, unlike ``bytes_in_flight``.
    ``slow_start_after_idle`` (RFC 5681 4.1, RFC 7661; Linux ``net.ipv4.tcp_slow_start_after_idle``):
        the sending side was idle longer than its RTO estimate (``idle_min_ns`` + RTT), and the next
        transfer's first round carried at most ``restart_ratio`` of the best round of the side's previous
        transfer and at most ``iw_max_segments`` MSS (near the initial window, RFC 6928), although the
        transfer needed more and its second round grew (slow start, not the application). Stall = the
        transfer's duration minus what the previous flight would have needed, capped at the rounds slow
        start needs to grow back to it.
    ``small_initial_window``: a transfer of at least ``sis_min_rounds`` round trips that started from an
        initial-window-sized first round and was still growing (largest round among its last two) when
        it ended: it finished in slow start. Stall = rounds used minus the rounds the connection's best
        per-round flight would have needed, times the RTT (the bandwidth-delay product is estimated from
        below by that best flight).

Aggregation
    One finding per connection, sending side and kind: episodes are summed (overlapping ones count
    once), ``start_ns``/``end_ns`` span the first to the last, ``value`` is the time lost in ms
    (``metric`` stall_ms), ``threshold`` the kind's episode threshold in ms for that connection, and the
    evidence frames are, per episode: rto: the original of the lost data, the last segment before the
    silence, each retransmission and the peer's next segment; delayed_ack: the outstanding segment, the
    delayed ACK and the held segment; zero_window: the first zero window, the probes,
    the reopening and the sender's next data; window_full: the full segment, the reopening ACK and the
    next data; slow start: the segment before the idle gap and the transfer's first and last segments.

Share of life
    The connection's active life is its first-to-last-packet time minus application idle time: gaps of
    at least the RTO estimate after which both sides simply carry on (the next packet is new data, a
    FIN/RST or a keep-alive, not a retransmission, probe or window update). A connection that sleeps
    2 s between requests did not lose those seconds.

Severity rule (per finding; L = time lost, S = L / active life)
    informational: cannot judge: only one direction of the connection was captured, or no RTT could be
        measured;
    critical: L >= critical_lost_ns (10 s) and S >= critical_share (0.5);
    high: L >= high_lost_ns (1 s) and S >= high_share (0.25);
    medium: L >= medium_lost_ns (100 ms) and S >= medium_share (0.10);
    low: otherwise (nothing is reported below min_lost_ns, 10 ms).
    Caps: ``rto`` at most low when no single episode lost ``rto_mismatch_rtts`` RTTs (a timer in
    proportion to the path: ordinary loss recovery on a slow path, however often it happens);
    ``small_initial_window`` at most low (every new connection slow-starts; it is a tuning hint).

Vantage point and resolution
    A connection with one direction missing is reported at most informational, saying which direction
    was seen. RTTs are never reported below the capture's timestamp resolution, and an explanation says
    when the RTT is within 10 ticks of it.

Known false positives
    An application that itself pauses exactly one RTT after a peer's pure ACK (looks like Nagle); a
    sender pacing its own bursts (looks like a small initial window; at most low); retransmissions
    of a capture that dropped packets (the gap is the capture's, not the sender's).

References: RFC 6298 (RTO, minimum 1 s, backoff), RFC 5681 (slow start, restart after idle), RFC 6928
(IW10), RFC 896 (Nagle), RFC 1122 4.2.3.2 (delayed ACK <= 500 ms), RFC 9293, Linux tcp(7)
(tcp_slow_start_after_idle, TCP_NODELAY, rto_min), Wireshark's tcp.analysis.* definitions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from numba import njit

from analyzer.tcp import analysis as an

from .base import empty_findings, findings, fmt_ns, resolution_ns

NAME = "tcp_stall"
REQUIRES = ("tcp_segments", "connections", "packets")

SYN, FIN, RST, ACK = 0x02, 0x01, 0x04, 0x10
KINDS = ("rto", "delayed_ack", "zero_window", "window_full", "slow_start_after_idle", "small_initial_window")


@dataclass(frozen=True)
class Params:
    # rto: a retransmission counts as timer-driven after a sender silence of at least
    rto_min_gap_ns: int = 20_000_000  # this long (below any stack's minimum RTO but above Linux's TLP floor)
    rto_gap_rtts: float = 3.0  # and this many RTTs
    rto_mismatch_rtts: float = 25.0  # an episode losing this many RTTs: a timer out of proportion to the path
    rto_max_gap_ns: int = 130_000_000_000  # longer silences are not a timer (Linux TCP_RTO_MAX is 120 s)
    # delayed_ack: the pure ACK came at least
    delack_min_ns: int = 15_000_000  # this long after the data (Linux delayed ACK >= 40 ms, Windows 200 ms)
    delack_rtts: float = 4.0  # and this many RTTs after it
    delack_min_events: int = 3  # held segments needed per connection side before reporting
    # the blocked side resumes within resume_rtts x RTT + resume_slack_ns of the ACK / window update
    resume_rtts: float = 1.5
    resume_slack_ns: int = 1_000_000
    # zero_window / window_full: waits shorter than max(window_min_ns, window_rtts x RTT) are not stalls
    window_min_ns: int = 10_000_000
    window_rtts: float = 4.0
    # idle: silence longer than the RTO estimate (idle_min_ns + RTT; Linux's RTO is >= 200 ms + SRTT)
    idle_min_ns: int = 200_000_000
    # slow_start_after_idle: after idle the first round carries at most
    restart_ratio: float = 0.25  # this fraction of the previous transfer's best per-RTT flight
    iw_max_segments: int = 16  # and at most this many MSS (IW10 = 10; some stacks use more)
    first_round_rtts: float = 0.8  # the first round is the first 0.8 RTT of a transfer
    # small_initial_window: transfers that took at least this many RTT rounds while still growing
    sis_min_rounds: int = 3
    # severity (see the module docstring): time lost per finding and its share of the active life
    min_lost_ns: int = 10_000_000  # less is not reported at all
    medium_lost_ns: int = 100_000_000  # medium from 100 ms lost ...
    medium_share: float = 0.10  # ... that are 10 % of the active life
    high_lost_ns: int = 1_000_000_000  # high from 1 s ...
    high_share: float = 0.25  # ... and 25 %
    critical_lost_ns: int = 10_000_000_000  # critical from 10 s ...
    critical_share: float = 0.5  # ... and half the active life


# -- inputs ------------------------------------------------------------------------------------------

def _segments(capture) -> pl.DataFrame:
    """tcp_segments in capture order (it carries ts_ns, tcp_flags and the raw window) with a row
    index ``_i``."""
    s = capture.frame("tcp_segments").select(
        "frame", "conn", "from_client", "seq_rel", "seglen", "analysis", "acks_frame", "ack_rtt_ns", "rtt_ns",
        "initial_rtt_ns", "ts_ns", "tcp_flags", "window")
    return s.with_columns(
        pl.col("tcp_flags").fill_null(0).cast(pl.Int64),
        pl.col("seglen").cast(pl.Int64),
        pl.col("seq_rel").cast(pl.Int64),
        pl.col("analysis").cast(pl.Int64),
    ).filter(pl.col("ts_ns").is_not_null()).with_row_index("_i").with_columns(pl.col("_i").cast(pl.Int64))


def _endpoint(addr: pl.Expr, port: pl.Expr) -> pl.Expr:
    a = addr.cast(pl.String)
    return pl.when(a.str.contains(":")).then(pl.format("[{}]:{}", a, port)).otherwise(pl.format("{}:{}", a, port))


def _connection_info(s: pl.DataFrame, conns: pl.DataFrame, res: float) -> pl.DataFrame:
    """Per connection: path RTT (and how it was measured), vantage, MSS per side, labels."""
    rtts = s.group_by("conn").agg(
        pl.col("initial_rtt_ns").max().alias("hs_rtt"),
        pl.col("rtt_ns").filter(pl.col("from_client")).min().alias("rtt_c"),
        pl.col("rtt_ns").filter(~pl.col("from_client")).min().alias("rtt_s"),
    )
    halves = pl.col("rtt_c") + pl.col("rtt_s")
    rtt = (pl.when(pl.col("hs_rtt").is_not_null() & halves.is_not_null())
           .then(pl.min_horizontal("hs_rtt", halves))
           .otherwise(pl.coalesce("hs_rtt", halves)))
    source = (pl.when(pl.col("hs_rtt").is_not_null() & halves.is_not_null() & (halves < pl.col("hs_rtt")))
              .then(pl.lit("ACK timing"))
              .when(pl.col("hs_rtt").is_not_null()).then(pl.lit("handshake"))
              .when(halves.is_not_null()).then(pl.lit("ACK timing"))
              .otherwise(pl.lit(None, pl.String)))
    rtts = rtts.with_columns(rtt.cast(pl.Float64).alias("rtt"), source.alias("rtt_source"))
    rtts = rtts.with_columns(
        pl.when(pl.col("rtt").is_not_null()).then(pl.max_horizontal(pl.col("rtt"), pl.lit(res)))
        .alias("rtt"))
    c = conns.select(
        "conn", "first_ts_ns", "last_ts_ns", "client_packets", "server_packets",
        pl.col("client").cast(pl.String), pl.col("server").cast(pl.String), "client_port", "server_port",
        pl.col("client_mss").cast(pl.Int64), pl.col("server_mss").cast(pl.Int64), "saw_synack",
        _endpoint(pl.col("client"), pl.col("client_port")).alias("client_ep"),
        _endpoint(pl.col("server"), pl.col("server_port")).alias("server_ep"),
    ).join(rtts.select("conn", "rtt", "rtt_source"), on="conn", how="left")
    return c.with_columns(
        ((pl.col("client_packets") > 0) & (pl.col("server_packets") > 0)).alias("both_directions"),
        pl.format("{}-{}", "server_ep", "client_ep").alias("resource"),
        (pl.col("last_ts_ns") - pl.col("first_ts_ns")).alias("life_ns"),
    )


@njit(cache=True)
def _links(conn, side, ts, seglen, analysis, frame, data_like, gap_limit, idle_thr, zw_bit, blocked_bits, n_conn):
    """One pass in capture order. Per segment (-1 where there is none):
    prev_any_ts / prev_any_frame: the previous data-bearing (payload, SYN or FIN) segment of its direction;
    prev_pay_ts / prev_pay_frame, next_frame / next_ts / next_seglen / next_analysis: the previous and
    next payload segment of its direction (payload segments only); next_held: that next payload segment
    directly follows this one in the connection (no payload from the peer in between);
    tr / prev_tr: the transfer of a payload segment (the row of its first segment; a new transfer
    starts after a silence of ``gap_limit`` or when the peer sent payload in between; none where
    gap_limit is NaN) and the direction's transfer before it.
    Per connection: idle, the sum of the gaps of at least ``idle_thr[conn]`` after which the connection
    carries on (the segment after the gap is not a retransmission, probe or window update, and the one
    before it did not close the window)."""
    n = conn.shape[0]
    prev_any_ts = np.full(n, -1, np.int64)
    prev_any_frame = np.full(n, -1, np.int64)
    prev_pay_ts = np.full(n, -1, np.int64)
    prev_pay_frame = np.full(n, -1, np.int64)
    next_frame = np.full(n, -1, np.int64)
    next_ts = np.full(n, -1, np.int64)
    next_seglen = np.full(n, -1, np.int64)
    next_analysis = np.zeros(n, np.int64)
    next_held = np.zeros(n, np.bool_)
    tr = np.full(n, -1, np.int64)
    prev_tr = np.full(n, -1, np.int64)
    idle = np.zeros(n_conn, np.int64)
    last_seg = np.full(n_conn, -1, np.int64)
    last_pay_c = np.full(n_conn, -1, np.int64)
    last_any = np.full(2 * n_conn, -1, np.int64)
    last_pay = np.full(2 * n_conn, -1, np.int64)
    cur_tr = np.full(2 * n_conn, -1, np.int64)
    before_tr = np.full(2 * n_conn, -1, np.int64)
    for i in range(n):
        c = conn[i]
        d = c * 2 + side[i]
        ps = last_seg[c]
        if ps >= 0 and ts[i] - ts[ps] >= idle_thr[c] and (analysis[i] & blocked_bits) == 0 \
                and (analysis[ps] & zw_bit) == 0:
            idle[c] += ts[i] - ts[ps]
        last_seg[c] = i
        if data_like[i]:
            pa = last_any[d]
            if pa >= 0:
                prev_any_ts[i] = ts[pa]
                prev_any_frame[i] = frame[pa]
            last_any[d] = i
        if seglen[i] > 0:
            pp = last_pay[d]
            pc = last_pay_c[c]
            if pp >= 0:
                prev_pay_ts[i] = ts[pp]
                prev_pay_frame[i] = frame[pp]
                next_frame[pp] = frame[i]
                next_ts[pp] = ts[i]
                next_seglen[pp] = seglen[i]
                next_analysis[pp] = analysis[i]
                next_held[pp] = pc == pp
            last_pay[d] = i
            last_pay_c[c] = i
            g = gap_limit[i]
            if g == g:
                turn = pc >= 0 and side[pc] != side[i]
                if pp < 0 or cur_tr[d] < 0 or turn or (ts[i] - ts[pp]) >= g:
                    before_tr[d] = cur_tr[d]
                    cur_tr[d] = i
                tr[i] = cur_tr[d]
                prev_tr[i] = before_tr[d]
    return (prev_any_ts, prev_any_frame, prev_pay_ts, prev_pay_frame, next_frame, next_ts, next_seglen,
            next_analysis, next_held, tr, prev_tr), idle


LINK_COLUMNS = ("prev_any_ts", "prev_any_frame", "prev_pay_ts", "prev_pay_frame", "next_frame", "next_ts",
                "next_seglen", "next_analysis", "next_held", "tr", "prev_tr")


def _linked(s: pl.DataFrame, info: pl.DataFrame, p: Params, res: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """s with the LINK_COLUMNS (null where there is none) and info with ``active_ns``."""
    data_like = (pl.col("seglen") > 0) | ((pl.col("tcp_flags") & (SYN | FIN)) != 0)
    gap_limit = (pl.col("rtt") * 2 + p.resume_slack_ns + res).fill_null(float("nan"))
    arrays = s.select(pl.col("conn").cast(pl.Int64), pl.col("from_client").cast(pl.Int64),
                      pl.col("ts_ns").cast(pl.Int64), "seglen", "analysis", pl.col("frame").cast(pl.Int64),
                      data_like.alias("dl"), gap_limit.alias("gl"))
    n_conn = int(max(arrays["conn"].max(), info["conn"].max())) + 1
    idle_thr = np.full(n_conn, float(p.idle_min_ns))
    known = info.filter(pl.col("rtt").is_not_null())
    idle_thr[known["conn"].to_numpy().astype(np.int64)] += known["rtt"].to_numpy()
    blocked_bits = an.ANY_RETRANSMISSION | an.ZERO_WINDOW_PROBE | an.WINDOW_UPDATE | an.ZERO_WINDOW \
        | an.ZERO_WINDOW_PROBE_ACK
    cols, idle = _links(
        arrays["conn"].to_numpy(), arrays["from_client"].to_numpy(), arrays["ts_ns"].to_numpy(),
        arrays["seglen"].to_numpy(), arrays["analysis"].to_numpy(), arrays["frame"].to_numpy(),
        arrays["dl"].to_numpy(), arrays["gl"].to_numpy(), idle_thr, an.ZERO_WINDOW, blocked_bits, n_conn)
    series = []
    for name, a in zip(LINK_COLUMNS, cols):
        ser = pl.Series(name, a)
        if name not in ("next_analysis", "next_held"):
            ser = ser.set(ser == -1, None) if (a == -1).any() else ser
        series.append(ser)
    s = s.with_columns(series).with_columns(data_like.alias("data_like"))
    info = info.join(pl.DataFrame({"conn": np.arange(n_conn, dtype=np.int64), "idle_ns": idle})
                     .with_columns(pl.col("conn").cast(info["conn"].dtype)), on="conn", how="left").with_columns(
        (pl.col("life_ns") - pl.col("idle_ns").fill_null(0)).clip(lower_bound=1).alias("active_ns"))
    return s, info


# -- episodes ----------------------------------------------------------------------------------------
# Each episode frame has: conn, from_client (the blocked sender), kind, start_ns, end_ns, stall_ns,
# threshold_ns, frames (list[u32]) and kind-specific detail columns. ``s`` is the linked segment frame
# (capture order, see _linked); ``dk`` is conn * 2 + from_client.

DK = (pl.col("conn").cast(pl.Int64) * 2 + pl.col("from_client").cast(pl.Int64))


def _rows(s: pl.DataFrame, mask: pl.Expr, *cols) -> pl.DataFrame:
    """The rows of ``s`` where ``mask`` holds, only ``cols`` (names or expressions): the segment frame
    is wide, and filtering only the columns needed is what keeps the detector fast."""
    return s.lazy().filter(mask).select(*cols).collect()
RESUME = "resume"  # column: rtt * resume_rtts + resume_slack_ns + resolution


def _rto(s: pl.DataFrame, p: Params, res: float) -> pl.DataFrame:
    retx = ((pl.col("analysis") & (an.RETRANSMISSION | an.SPURIOUS_RETRANSMISSION)) != 0) \
        & ((pl.col("analysis") & (an.FAST_RETRANSMISSION | an.OUT_OF_ORDER)) == 0)
    thr = pl.max_horizontal(pl.lit(float(p.rto_min_gap_ns)), pl.col("rtt").fill_null(0.0) * p.rto_gap_rtts,
                            pl.lit(res))
    gap = pl.col("ts_ns") - pl.col("prev_any_ts")
    is_syn = (pl.col("tcp_flags") & SYN) != 0
    is_rto = (pl.col("data_like") & retx & (gap >= thr) & (gap <= p.rto_max_gap_ns)
              & (~is_syn | pl.col("saw_synack"))).fill_null(False)
    r = _rows(s, is_rto, "dk", "_i", "conn", "from_client", "frame", "ts_ns", "seq_rel", "prev_any_ts",
              "prev_any_frame", "rtt", "tcp_flags")
    if r.height == 0:
        return pl.DataFrame()
    # back-to-back timeouts (the previous data segment of the direction was a timeout too) are one episode
    r = r.with_columns(gap.alias("gap"), thr.alias("threshold_ns"), is_syn.alias("syn")).sort("dk", "_i")
    chained = ((pl.col("dk") == pl.col("dk").shift(1)) & (pl.col("frame").shift(1) == pl.col("prev_any_frame")))
    r = r.with_columns((~chained.fill_null(False)).cum_sum().alias("ep"))
    # the first transmission of the retransmitted bytes: the original segment holding seq_rel
    key = pl.col("dk") * (1 << 33) + pl.col("seq_rel")
    orig = _rows(s, pl.col("data_like") & ((pl.col("analysis") & (an.ANY_RETRANSMISSION | an.OUT_OF_ORDER)) == 0)
                 & pl.col("dk").is_in(r["dk"].unique().implode()),
        key.alias("key"), pl.col("ts_ns").alias("orig_ts"), pl.col("frame").alias("orig_frame"),
        (pl.col("seq_rel") + pl.col("seglen").clip(lower_bound=1)).alias("orig_end"),
        pl.col("dk").alias("orig_dk")).sort("key")
    r = r.with_columns(key.alias("key")).sort("key").join_asof(orig, on="key", strategy="backward")
    ok = (pl.col("orig_dk") == pl.col("dk")) & (pl.col("seq_rel") < pl.col("orig_end")) \
        & (pl.col("orig_ts") <= pl.col("ts_ns"))
    r = r.with_columns(pl.when(ok).then(pl.col("orig_ts")).alias("orig_ts"),
                       pl.when(ok).then(pl.col("orig_frame")).alias("orig_frame")).sort("_i")
    eps = r.group_by("conn", "from_client", "ep").agg(
        pl.col("ts_ns").max().alias("end_ns"),
        pl.col("frame").alias("retx_frames"), pl.col("gap").alias("gaps"), pl.len().alias("retx"),
        pl.col("orig_ts").first(), pl.col("orig_frame").first(), pl.col("prev_any_ts").first().alias("prev_ts"),
        pl.col("prev_any_frame").first().alias("prev_frame"), pl.col("syn").any(),
        pl.col("threshold_ns").first(), pl.col("rtt").first(),
    )
    eps = eps.with_columns(pl.min_horizontal(pl.coalesce("orig_ts", "prev_ts"), "prev_ts").alias("start_ns"))
    # the other side's first segment after the last retransmission (the recovery ACK)
    other = _rows(s, pl.col("conn").is_in(eps["conn"].unique().implode()),
        "conn", (~pl.col("from_client")).alias("from_client"), pl.col("ts_ns").alias("ack_ts"),
        pl.col("frame").alias("ack_frame")).sort("ack_ts")
    eps = eps.sort("end_ns").join_asof(other, left_on="end_ns", right_on="ack_ts", by=["conn", "from_client"],
                                       strategy="forward", check_sortedness=False)
    eps = eps.with_columns(
        pl.concat_list(pl.col("orig_frame").cast(pl.UInt32), pl.col("prev_frame").cast(pl.UInt32),
                       pl.col("retx_frames").cast(pl.List(pl.UInt32)), pl.col("ack_frame").cast(pl.UInt32))
        .list.drop_nulls().alias("frames"),
        (pl.col("end_ns") - pl.col("start_ns") - pl.col("rtt").fill_null(0.0)).clip(lower_bound=0.0)
        .alias("stall_ns"),
        pl.lit("rto").alias("kind"),
    )
    return eps.select("conn", "from_client", "kind", "start_ns", "end_ns", "stall_ns", "threshold_ns", "frames",
                      pl.col("gaps").cast(pl.List(pl.Float64)), "retx", "syn")


def _delayed_ack(s: pl.DataFrame, p: Params, res: float) -> pl.DataFrame:
    thr = pl.max_horizontal(pl.lit(float(p.delack_min_ns)), pl.col("rtt").fill_null(0.0) * p.delack_rtts,
                            pl.lit(res))
    k = _rows(s, (pl.col("seglen") == 0) & ((pl.col("tcp_flags") & (SYN | FIN | RST)) == 0)
              & ((pl.col("tcp_flags") & ACK) != 0) & pl.col("acks_frame").is_not_null()
              & (pl.col("ack_rtt_ns") >= thr), "frame", "ts_ns", "acks_frame", thr.alias("threshold_ns"))
    if k.height == 0:
        return pl.DataFrame()
    # the acknowledged segment S, found by frame number (s is in frame order)
    pos = s["frame"].search_sorted(k["acks_frame"].cast(s["frame"].dtype), side="left").cast(pl.Int64)
    pos = pos.clip(upper_bound=s.height - 1)
    seg = s.select("_i", "frame", "conn", "from_client", "ts_ns", "next_frame", "next_ts", "next_seglen",
                   "next_analysis", "next_held", "rtt", "peer_mss", RESUME)[pos]
    j = pl.concat([k.select(pl.col("frame").alias("ack_frame"), pl.col("ts_ns").alias("ack_ts"),
                            "threshold_ns", pl.col("acks_frame").cast(pl.UInt32).alias("want")), seg],
                  how="horizontal")
    j = j.filter((pl.col("frame") == pl.col("want"))
                 & pl.col("next_frame").is_not_null()
                 & (pl.col("next_ts") >= pl.col("ack_ts"))
                 & ((pl.col("next_ts") - pl.col("ack_ts")) <= pl.col(RESUME))
                 & (pl.col("next_seglen") < pl.col("peer_mss") - 40)
                 & ((pl.col("next_analysis") & (an.ANY_RETRANSMISSION | an.OUT_OF_ORDER)) == 0)
                 # nothing from the peer but that ACK between S and N: N was held, not a new request
                 & pl.col("next_held"))
    if j.height == 0:
        return pl.DataFrame()
    return j.select(
        "conn", "from_client", pl.lit("delayed_ack").alias("kind"), pl.col("ts_ns").alias("start_ns"),
        pl.col("next_ts").alias("end_ns"),
        (pl.col("next_ts") - pl.col("ts_ns") - pl.col("rtt").fill_null(0.0)).clip(lower_bound=0.0).alias("stall_ns"),
        "threshold_ns",
        pl.concat_list(pl.col("frame").cast(pl.UInt32), pl.col("ack_frame").cast(pl.UInt32),
                       pl.col("next_frame").cast(pl.UInt32)).alias("frames"),
        (pl.col("ack_ts") - pl.col("ts_ns")).alias("wait_ns"),
    )


def _zero_window(s: pl.DataFrame, p: Params, res: float) -> pl.DataFrame:
    """Zero-window episodes of each receiver; the blocked sender is the other side."""
    zw = ((pl.col("window") == 0) & ((pl.col("tcp_flags") & (SYN | FIN | RST)) == 0)).fill_null(False)
    dirs = _rows(s, zw, "dk")["dk"].unique()
    if dirs.len() == 0:
        return pl.DataFrame()
    w = _rows(s, pl.col("dk").is_in(dirs.implode()) & ((pl.col("tcp_flags") & RST) == 0),
              "dk", "_i", "conn", "from_client", "frame", "ts_ns", "window", "tcp_flags", "rtt", "last_ts_ns",
              RESUME).sort("dk", "_i")
    same = (pl.col("dk") == pl.col("dk").shift(1)).fill_null(False)
    w = w.with_columns(zw.alias("zw")).with_columns(
        pl.when(same).then(pl.col("zw").shift(1)).otherwise(False).fill_null(False).alias("prev_zw"))
    w = w.with_columns((pl.col("zw") & ~pl.col("prev_zw")).cum_sum().alias("ep"))
    eps = w.filter(pl.col("zw") | pl.col("prev_zw")).group_by("conn", "from_client", "ep").agg(
        pl.col("ts_ns").filter(pl.col("zw")).min().alias("start_ns"),
        pl.col("frame").filter(pl.col("zw")).min().alias("zw_frame"),
        pl.col("ts_ns").filter(~pl.col("zw")).min().alias("open_ts"),
        pl.col("frame").filter(~pl.col("zw")).min().alias("open_frame"),
        pl.col("rtt").first(), pl.col("last_ts_ns").first(), pl.col(RESUME).first(),
    ).filter(pl.col("start_ns").is_not_null())
    eps = eps.with_columns(
        (~pl.col("from_client")).alias("sender"),
        pl.coalesce("open_ts", "last_ts_ns").alias("end_ns"),
        pl.max_horizontal(pl.lit(float(p.window_min_ns)), pl.col("rtt").fill_null(0.0) * p.window_rtts,
                          pl.lit(res)).alias("threshold_ns"),
    ).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("closed_ns"))
    eps = eps.filter(pl.col("closed_ns") >= pl.col("threshold_ns"))
    if eps.height == 0:
        return pl.DataFrame()
    # the sender's probes while closed, and its first data after the reopening
    dd = _rows(s, (pl.col("seglen") > 0) & pl.col("conn").is_in(eps["conn"].unique().implode()),
               "conn", "from_client", "ts_ns", "frame", "analysis")
    probes = dd.filter((pl.col("analysis") & an.ZERO_WINDOW_PROBE) != 0).select(
        "conn", pl.col("from_client").alias("sender"), pl.col("ts_ns").alias("probe_ts"),
        pl.col("frame").alias("probe_frame"))
    pj = eps.select("conn", "sender", "ep", "start_ns", "end_ns").join(probes, on=["conn", "sender"]).filter(
        pl.col("probe_ts").is_between(pl.col("start_ns"), pl.col("end_ns"))).group_by("ep").agg(
        pl.col("probe_frame").cast(pl.UInt32).alias("probe_frames"))
    sent = dd.filter((pl.col("analysis") & an.ZERO_WINDOW_PROBE) == 0).select(
        "conn", pl.col("from_client").alias("sender"), pl.col("ts_ns").alias("next_ts"),
        pl.col("frame").alias("next_frame")).sort("next_ts")
    eps = eps.sort("end_ns").join_asof(sent, left_on="end_ns", right_on="next_ts", by=["conn", "sender"],
                                       strategy="forward", check_sortedness=False)
    eps = eps.join(pj, on="ep", how="left").with_columns(
        pl.col("probe_frames").fill_null(pl.lit([], pl.List(pl.UInt32))))
    blocked = (pl.col("probe_frames").list.len() > 0) | (
        pl.col("open_ts").is_not_null() & ((pl.col("next_ts") - pl.col("open_ts")) <= pl.col(RESUME)))
    eps = eps.filter(blocked.fill_null(False))
    if eps.height == 0:
        return pl.DataFrame()
    return eps.select(
        "conn", pl.col("sender").alias("from_client"), pl.lit("zero_window").alias("kind"), "start_ns", "end_ns",
        pl.col("closed_ns").cast(pl.Float64).alias("stall_ns"), "threshold_ns",
        pl.concat_list(pl.col("zw_frame").cast(pl.UInt32), pl.col("probe_frames").list.head(10),
                       pl.col("open_frame").cast(pl.UInt32), pl.col("next_frame").cast(pl.UInt32))
        .list.drop_nulls().alias("frames"),
        pl.col("probe_frames").list.len().alias("probes"), pl.col("open_ts").is_null().alias("never_reopened"),
    )


def _window_full(s: pl.DataFrame, zw: pl.DataFrame, p: Params, res: float) -> pl.DataFrame:
    thr = pl.max_horizontal(pl.lit(float(p.window_min_ns)), pl.col("rtt").fill_null(0.0) * p.window_rtts,
                            pl.lit(res))
    wf = _rows(s, ((pl.col("analysis") & an.WINDOW_FULL) != 0) & (pl.col("seglen") > 0)
               & pl.col("next_ts").is_not_null(),
               "conn", "from_client", "frame", "ts_ns", "next_ts", "next_frame", "rtt", RESUME)
    if wf.height == 0:
        return pl.DataFrame()
    wf = wf.with_columns(thr.alias("threshold_ns"), (pl.col("next_ts") - pl.col("ts_ns")).alias("wait_ns")) \
        .filter(pl.col("wait_ns") >= pl.col("threshold_ns"))
    if wf.height == 0:
        return pl.DataFrame()
    # the receiver's last segment before the sender resumed: it reopened the window
    other = _rows(s, pl.col("conn").is_in(wf["conn"].unique().implode()),
        "conn", (~pl.col("from_client")).alias("from_client"), pl.col("ts_ns").alias("en_ts"),
        pl.col("frame").alias("en_frame")).sort("en_ts")
    wf = wf.sort("next_ts").join_asof(other, left_on="next_ts", right_on="en_ts", by=["conn", "from_client"],
                                      strategy="backward", check_sortedness=False)
    wf = wf.filter((pl.col("en_ts") >= pl.col("ts_ns")) & ((pl.col("next_ts") - pl.col("en_ts")) <= pl.col(RESUME)))
    if zw.height and wf.height:
        z = zw.select("conn", pl.col("from_client").alias("zf"), pl.col("start_ns").alias("zs"),
                      pl.col("end_ns").alias("ze"))
        inside = wf.select("conn", "frame", "from_client", "ts_ns", "next_ts").join(z, on="conn").filter(
            (pl.col("zf") == pl.col("from_client")) & (pl.col("zs") <= pl.col("next_ts"))
            & (pl.col("ze") >= pl.col("ts_ns"))).select("conn", "frame").unique()
        wf = wf.join(inside, on=["conn", "frame"], how="anti")
    if wf.height == 0:
        return pl.DataFrame()
    return wf.select(
        "conn", "from_client", pl.lit("window_full").alias("kind"), pl.col("ts_ns").alias("start_ns"),
        pl.col("next_ts").alias("end_ns"),
        (pl.col("wait_ns") - pl.col("rtt").fill_null(0.0)).clip(lower_bound=0.0).alias("stall_ns"), "threshold_ns",
        pl.concat_list(pl.col("frame").cast(pl.UInt32), pl.col("en_frame").cast(pl.UInt32),
                       pl.col("next_frame").cast(pl.UInt32)).list.drop_nulls().alias("frames"),
        "wait_ns",
    )


def _bursts(s: pl.DataFrame, p: Params, res: float) -> pl.DataFrame:
    """Slow start after idle and transfers finished in slow start, from per-RTT-round flight.

    A transfer (``tr``, from _links) is a run of one side's payload with no payload from the peer in
    between and no silence longer than ``2 x RTT + resume_slack_ns`` (slow start sends every round
    trip). Its rounds are RTT-long slots from its first segment; the first round is its first
    ``first_round_rtts`` RTT."""
    new_data = (pl.col("analysis") & (an.ANY_RETRANSMISSION | an.OUT_OF_ORDER)) == 0
    x = _rows(s, pl.col("tr").is_not_null() & new_data, "tr", "frame", "ts_ns", "seglen", "rtt")
    if x.height == 0:
        return pl.DataFrame()
    # per transfer: its first segment (tr is that segment's row) says how it started ...
    heads = _rows(s, pl.col("_i") == pl.col("tr"),
        "tr", "prev_tr", "conn", "from_client", "rtt", "peer_mss",
        (pl.col("ts_ns") - pl.col("prev_pay_ts")).alias("idle_ns"), pl.col("prev_pay_frame").alias("before_frame"))
    # ... and its new data what it carried
    t = x.group_by("tr").agg(
        pl.col("ts_ns").min().alias("t0"), pl.col("ts_ns").max().alias("t1"), pl.col("seglen").sum().alias("bytes"),
        pl.col("frame").min().alias("first_frame"), pl.col("frame").max().alias("last_frame"),
    ).join(heads, on="tr", how="inner")
    # only transfers of 2+ rounds can be slow-start limited; the others' flight is their size
    multi = t.filter((pl.col("t1") - pl.col("t0")) >= pl.col("rtt")).select("tr", "t0")
    xm = x.select("tr", "ts_ns", "seglen", "rtt").join(multi, on="tr", how="inner")
    xm = xm.with_columns(((pl.col("ts_ns") - pl.col("t0")) / pl.col("rtt")).floor().cast(pl.Int64).alias("round"))
    rounds = xm.group_by("tr", "round").agg(pl.col("seglen").sum().alias("rb")).sort("tr", "round")
    rounds = rounds.with_columns(
        pl.when(pl.col("tr") == pl.col("tr").shift(1)).then(pl.col("rb").shift(1)).alias("prev_rb"),
        pl.col("round").max().over("tr").alias("last_round"))
    rstat = rounds.group_by("tr").agg(
        pl.col("rb").max().alias("peak"),
        pl.col("round").sort_by("rb", descending=True).first().alias("peak_round"),
        pl.col("round").max().alias("last_round"),
        pl.len().alias("nonempty_rounds"),
        # growing: every complete round (all but the last) at least 1.5x the one before
        ((pl.col("round") < pl.col("last_round")) & pl.col("prev_rb").is_not_null()
         & (pl.col("rb") < 1.5 * pl.col("prev_rb"))).any().alias("stalled_growth"),
        (pl.col("rb").filter(pl.col("round") == 1).first()
         >= 1.5 * pl.col("rb").filter(pl.col("round") == 0).first()).alias("second_round_grew"),
    ).join(xm.filter((pl.col("ts_ns") - pl.col("t0")) < pl.col("rtt") * p.first_round_rtts)
           .group_by("tr").agg(pl.col("seglen").sum().alias("first")), on="tr", how="left")
    b = t.join(rstat, on="tr", how="left").with_columns(
        pl.col("peak").fill_null(pl.col("bytes")), pl.col("last_round").fill_null(0),
        pl.col("first").fill_null(pl.col("bytes")), pl.col("nonempty_rounds").fill_null(1))
    b = b.join(b.select(pl.col("tr").alias("prev_tr"), pl.col("peak").alias("prev_peak")), on="prev_tr",
               how="left").with_columns(
        pl.col("peak").max().over("conn", "from_client").alias("best_peak"),
        (pl.col("last_round") + 1).alias("rounds"))
    b = b.filter(pl.col("rounds") >= 2)
    if b.height == 0:
        return pl.DataFrame()
    mss = pl.col("peer_mss").cast(pl.Float64)
    iw_cap = mss * p.iw_max_segments
    idle_thr = pl.lit(float(p.idle_min_ns)) + pl.col("rtt")
    ssi = ((pl.col("idle_ns") >= idle_thr)
           & (pl.col("first") <= pl.col("prev_peak") * p.restart_ratio)
           & (pl.col("first") <= iw_cap) & (pl.col("first") >= mss * 0.5)
           & (pl.col("bytes") >= 2 * pl.col("first"))
           & pl.col("second_round_grew")).fill_null(False)
    ideal = ((pl.col("bytes") / pl.col("prev_peak")) - 1).clip(lower_bound=0) * pl.col("rtt")
    regrow = (pl.col("prev_peak") / pl.col("first")).log(2).ceil() * pl.col("rtt")
    ssi_lost = pl.min_horizontal((pl.col("t1") - pl.col("t0") - ideal).clip(lower_bound=0), regrow)
    sis = (~ssi & (pl.col("nonempty_rounds") >= p.sis_min_rounds) & ~pl.col("stalled_growth").fill_null(True)
           & (pl.col("first") <= iw_cap) & (pl.col("first") >= 2 * mss)
           & (pl.col("peak_round") >= pl.col("last_round") - 1) & (pl.col("bytes") >= 2 * pl.col("first")))
    needed = (pl.col("bytes") / pl.col("best_peak")).ceil().clip(lower_bound=1)
    sis_lost = pl.min_horizontal(((pl.col("rounds") - needed) * pl.col("rtt")).clip(lower_bound=0),
                                 (pl.col("t1") - pl.col("t0")).cast(pl.Float64))
    b = b.with_columns(
        pl.when(ssi).then(pl.lit("slow_start_after_idle")).when(sis).then(pl.lit("small_initial_window"))
        .otherwise(None).alias("kind"),
        pl.when(ssi).then(ssi_lost).when(sis).then(sis_lost).otherwise(0.0).alias("stall_ns"),
    ).filter(pl.col("kind").is_not_null() & (pl.col("stall_ns") > 0))
    if b.height == 0:
        return pl.DataFrame()
    return b.select(
        "conn", "from_client", "kind", pl.col("t0").alias("start_ns"), pl.col("t1").alias("end_ns"),
        pl.col("stall_ns").cast(pl.Float64),
        pl.when(pl.col("kind") == "slow_start_after_idle").then(pl.lit(float(p.idle_min_ns)) + pl.col("rtt"))
        .otherwise(pl.col("rtt") * p.sis_min_rounds).alias("threshold_ns"),
        pl.concat_list(pl.col("before_frame").cast(pl.UInt32), pl.col("first_frame").cast(pl.UInt32),
                       pl.col("last_frame").cast(pl.UInt32)).list.drop_nulls().alias("frames"),
        pl.col("first").alias("first_bytes"), pl.col("prev_peak"), pl.col("best_peak"), pl.col("bytes"),
        pl.col("rounds"), pl.col("idle_ns"),
    )


# -- findings ----------------------------------------------------------------------------------------

def _severity(p: Params) -> pl.Expr:
    lost, share = pl.col("stall_ns"), pl.col("share")
    base = (pl.when((lost >= p.critical_lost_ns) & (share >= p.critical_share)).then(pl.lit("critical"))
            .when((lost >= p.high_lost_ns) & (share >= p.high_share)).then(pl.lit("high"))
            .when((lost >= p.medium_lost_ns) & (share >= p.medium_share)).then(pl.lit("medium"))
            .otherwise(pl.lit("low")))
    in_proportion = pl.col("max_stall") < pl.col("rtt").fill_null(0.0) * p.rto_mismatch_rtts
    capped = ((pl.col("kind") == "rto") & in_proportion) | (pl.col("kind") == "small_initial_window")
    cannot = ~pl.col("both_directions") | pl.col("rtt").is_null()
    return (pl.when(cannot).then(pl.lit("informational"))
            .when(capped & base.is_in(["medium", "high", "critical"])).then(pl.lit("low"))
            .otherwise(base))


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def _bytes(n) -> str:
    n = float(n or 0)
    if n >= 1 << 20:
        return f"{n / (1 << 20):.3g} MiB"
    if n >= 1024:
        return f"{n / 1024:.3g} KiB"
    return f"{n:.0f} bytes"


def _timer_name(gaps: list[float], syn: bool) -> str:
    """Name the timer from the silences before successive retransmissions of one episode."""
    g1 = gaps[0]
    if syn and 0.8e9 <= g1 <= 1.3e9:
        name = "its initial RTO (RFC 6298: 1 s)"
    elif syn and 2.5e9 <= g1 <= 3.5e9:
        name = "its initial RTO (RFC 1122: 3 s)"
    elif 190e6 <= g1 <= 450e6:
        name = "its retransmission timer (Linux: the 200 ms minimum RTO + SRTT; Windows: 300 ms)"
    else:
        name = "its retransmission timer"
    if len(gaps) > 1:
        ratios = [b / a for a, b in zip(gaps, gaps[1:]) if a > 0]
        doubling = ratios and all(1.6 <= x <= 2.5 for x in ratios)
        rest = ", ".join(fmt_ns(g) for g in gaps[1:6])
        name += f", {'doubled each time' if doubling else 'then'} to {rest}"
    return name


def _explain(r: dict, res: float, p: Params) -> str:
    kind = r["kind"]
    rtt = r["rtt"]
    sender = f"{'client' if r['from_client'] else 'server'} {r['client_ep'] if r['from_client'] else r['server_ep']}"
    peer = f"{'server' if r['from_client'] else 'client'} {r['server_ep'] if r['from_client'] else r['client_ep']}"
    rtt_txt = f"{fmt_ns(rtt)} RTT" if rtt is not None else "unmeasured RTT"
    lost = fmt_ns(r["stall_ns"])
    share = f"{r['share']:.0%} of the connection's active life"
    n = r["episodes"]
    if kind == "rto":
        gaps = [g for gs in (r["gaps"] or []) for g in (gs or [])]
        g1 = gaps[0] if gaps else 0.0
        timer = _timer_name(gaps or [0.0], bool(r["syn"]))
        ratio = (g1 / rtt) if rtt else None
        backoff = (r["retx_max"] or 1) > 1
        head = (f"retry timer {fmt_ns(g1)} is {_num(ratio)}× the {fmt_ns(rtt)} RTT: " if ratio else
                f"retry timer {fmt_ns(g1)} on a path of {rtt_txt}: ")
        if r["syn"]:
            cause = ("the SYN went unanswered (lost, filtered, or dropped by a full listen backlog) and the "
                     "client waited out its initial timer")
        elif backoff:
            cause = ("likely a burst loss or an outage: the sender backed off its timer until the path came "
                     "back and resumed only at the next expiry")
        elif ratio is not None and ratio >= p.rto_mismatch_rtts:
            cause = ("likely an RTO-min mismatch: a lost tail segment waits out a minimum timer sized for "
                     "slower paths (lower the route's rto_min, or rely on TLP/RACK)")
        else:
            cause = "likely loss of the last segments of a flight, recovered only by the timer"
        what = "its SYN" if r["syn"] else "data"
        eps = f"{n} timeout episodes, " if n != 1 else ""
        return (f"{head}{sender} stalled {lost} ({eps}{share}) waiting on {timer} before retransmitting "
                f"{what}; {cause}.")
    if kind == "delayed_ack":
        wait = r["median_wait"]
        timer = ("a ~200 ms delayed-ACK timer (Windows, or Linux's maximum)" if wait and wait >= 120e6
                 else "a ~40 ms delayed-ACK timer (Linux)")
        return (f"{sender} held a small segment until {peer}'s delayed ACK {n} times (median wait "
                f"{fmt_ns(wait)}, {timer}, on a {rtt_txt}), losing {lost} ({share}): Nagle's algorithm "
                f"meets delayed ACK (write-write-read); send each request in one write or set TCP_NODELAY.")
    if kind == "zero_window":
        never = " and never reopened it" if r["never_reopened"] else ""
        return (f"{peer} advertised a zero receive window {n} time{'s' if n != 1 else ''}{never}, "
                f"blocking {sender} for {lost} in all (longest {fmt_ns(r['max_stall'])}, {share}, "
                f"{r['probes_total']} zero-window probe{'s' if r['probes_total'] != 1 else ''}, {rtt_txt}): "
                f"the receiving application stopped reading (receiver-limited).")
    if kind == "window_full":
        return (f"{sender} filled {peer}'s receive window {n} time{'s' if n != 1 else ''} and waited "
                f"{lost} beyond the {rtt_txt} in all for it to reopen (longest wait {fmt_ns(r['max_wait'])}, "
                f"{share}): receiver-limited, the receiving application reads slowly or its buffer is small.")
    if kind == "slow_start_after_idle":
        return (f"after {n} idle gap{'s' if n != 1 else ''} (about {fmt_ns(r['median_idle'])}, longer than "
                f"its ~{fmt_ns(p.idle_min_ns + (rtt or 0))} retransmission timeout) {sender} restarted from a "
                f"{_bytes(r['min_first'])} first round although it had reached {_bytes(r['max_prev_peak'])} per "
                f"{rtt_txt} round before, losing about {lost} ({share}): slow start after idle "
                f"(Linux net.ipv4.tcp_slow_start_after_idle=1); turn it off for bursty long-lived connections.")
    if kind == "small_initial_window":
        return (f"{n} transfer{'s' if n != 1 else ''} from {sender} finished while still in slow start "
                f"(up to {r['max_rounds']} round trips of {rtt_txt} for {_bytes(r['max_bytes'])}, starting from "
                f"a {_bytes(r['min_first'])} first round; best flight {_bytes(r['best_peak'])} per round), "
                f"costing about {lost} ({share}): the initial window is small for this path's "
                f"bandwidth-delay product; reuse warm connections or raise the initial window.")
    return f"{sender} stalled {lost} ({share})."


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    p = params
    try:
        seg = capture.frame("tcp_segments")
        conns = capture.frame("connections")
    except KeyError:
        return empty_findings()
    if seg.height == 0 or conns.height == 0:
        return empty_findings()
    res = resolution_ns(capture)
    s = _segments(capture)
    if s.height == 0:
        return empty_findings()
    info = _connection_info(s, conns, res)
    per_conn = info.select("conn", "rtt", "saw_synack", "last_ts_ns", "client_mss", "server_mss")
    s = s.join(per_conn, on="conn", how="left", maintain_order="left").with_columns(
        # the sender's segment size is the peer's announced MSS
        pl.coalesce(pl.when(pl.col("from_client")).then(pl.col("server_mss")).otherwise(pl.col("client_mss")),
                    pl.lit(1460)).alias("peer_mss"),
        DK.alias("dk"),
        (pl.col("rtt").fill_null(0.0) * p.resume_rtts + p.resume_slack_ns + res).alias(RESUME))
    s, info = _linked(s, info, p, res)
    zw = _zero_window(s, p, res)
    parts = [_rto(s, p, res), _delayed_ack(s, p, res), zw, _window_full(s, zw, p, res), _bursts(s, p, res)]
    parts = [x for x in parts if x.height]
    if not parts:
        return empty_findings()
    eps = pl.concat(parts, how="diagonal_relaxed")
    for col, dtype in (("gaps", pl.List(pl.Float64)), ("retx", pl.UInt32), ("syn", pl.Boolean),
                       ("wait_ns", pl.Int64), ("probes", pl.UInt32), ("never_reopened", pl.Boolean),
                       ("first_bytes", pl.Int64), ("prev_peak", pl.Int64), ("best_peak", pl.Int64),
                       ("bytes", pl.Int64), ("rounds", pl.Int64), ("idle_ns", pl.Int64)):
        if col not in eps.columns:
            eps = eps.with_columns(pl.lit(None, dtype).alias(col))
    eps = eps.with_columns(pl.col("gaps").cast(pl.List(pl.Float64)))
    # overlapping episodes of one side and kind count once (union of their intervals)
    eps = eps.sort("conn", "from_client", "kind", "start_ns").with_columns(
        pl.col("end_ns").cum_max().shift(1).over("conn", "from_client", "kind").alias("_covered"))
    eps = eps.with_columns(
        (pl.col("stall_ns") - (pl.col("_covered") - pl.col("start_ns")).clip(lower_bound=0).fill_null(0)
         .clip(upper_bound=pl.col("end_ns") - pl.col("start_ns"))).clip(lower_bound=0.0).alias("stall_ns"))
    agg = eps.sort("start_ns").group_by("conn", "from_client", "kind").agg(
        pl.len().alias("episodes"), pl.col("start_ns").min(), pl.col("end_ns").max(),
        pl.col("stall_ns").sum(), pl.col("stall_ns").max().alias("max_stall"),
        pl.col("threshold_ns").min(),
        pl.col("frames").list.explode(keep_nulls=False, empty_as_null=False).alias("evidence_frames"),
        pl.col("gaps"), pl.col("retx").max().alias("retx_max"), pl.col("syn").any(),
        pl.col("wait_ns").median().alias("median_wait"), pl.col("wait_ns").max().alias("max_wait"),
        pl.col("probes").sum().alias("probes_total"), pl.col("never_reopened").any(),
        pl.col("first_bytes").min().alias("min_first"), pl.col("prev_peak").max().alias("max_prev_peak"),
        pl.col("best_peak").max(), pl.col("bytes").max().alias("max_bytes"),
        pl.col("rounds").max().alias("max_rounds"), pl.col("idle_ns").median().alias("median_idle"),
    )
    agg = agg.filter(~((pl.col("kind") == "delayed_ack") & (pl.col("episodes") < p.delack_min_events)))
    agg = agg.join(info, on="conn", how="inner").with_columns(
        (pl.col("stall_ns") / pl.col("active_ns")).clip(upper_bound=1.0).alias("share"))
    agg = agg.filter(pl.col("stall_ns") >= p.min_lost_ns)
    if agg.height == 0:
        return empty_findings()
    agg = agg.with_columns(_severity(p).alias("severity")).sort("start_ns", "conn", "from_client", "kind")
    texts = []
    for r in agg.iter_rows(named=True):
        t = _explain(r, res, p)
        notes = []
        if not r["both_directions"]:
            seen = "client->server" if (r["client_packets"] or 0) > 0 else "server->client"
            notes.append(f"only the {seen} direction was captured, so this cannot be judged (informational)")
        elif r["rtt"] is None:
            notes.append("no RTT could be measured, so this cannot be judged (informational)")
        elif r["rtt"] < 10 * res:
            notes.append(f"the RTT ({r['rtt_source']}) is within 10 ticks of the {fmt_ns(res)} timestamp "
                         f"resolution, so RTT multiples are approximate")
        if notes:
            t = t.rstrip(".") + "; " + "; ".join(notes) + "."
        texts.append(t)
    rows = agg.select(
        "kind", "severity", pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64),
        pl.col("client"), pl.col("server"), pl.col("resource"),
        pl.lit(1, pl.UInt32).alias("clients"), pl.lit("connection").alias("client_identity"),
        pl.lit("stall_ms").alias("metric"), (pl.col("stall_ns") / 1e6).alias("value"),
        (pl.col("threshold_ns") / 1e6).alias("threshold"), pl.lit("ms").alias("unit"),
        pl.col("evidence_frames").list.drop_nulls(),
    ).with_columns(pl.Series("explanation", texts, dtype=pl.String))
    return findings(rows, detector=NAME, params=p)
