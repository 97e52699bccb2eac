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
        RTTs at 8 ms: "a path whose RTT is µs or a few ms"). A SYN's explanation says what the capture
        shows came back before the timer fired: nothing (lost, filtered, full backlog), the server's
        SYN/ACK (it never reached the client's TCP), a bare ACK (a challenge ACK, RFC 5961 4: the server
        still held an older connection on the 4-tuple) or a RST. A data episode the peer never answered
        (nothing of the peer's after its last retransmission, the capture going on for at least the
        episode's threshold after it) is read as a lost peer or path, not a slowed transfer: the
        explanation names the peer's last segment (the stall and its severity are unchanged).
        Timer episodes are of one class each: a SYN, a bare FIN, or data; they are read as follows.
    ``synack_retransmission``: the server resent its SYN/ACK on its timer after the client's SYN had
        been answered. Reading, from what the client sent in between: its ACK was captured (so the ACK
        was lost between the capture point and the server, or the server dropped it: Linux drops the
        handshake's last ACK when the accept queue is full and resends the SYN/ACK), it sent its SYN
        again (the SYN/ACK did not reach it), or nothing was captured. A SYN/ACK resent within the
        resume window of the client's repeated SYN answers that SYN (RFC 9293 3.10.7.4): it is no timer
        of the server's and no finding (the client's SYN episode is). Stall as for ``rto``.
    ``spurious_retransmission``: a data episode whose first retransmission the receiver reported as a
        duplicate with a D-SACK (RFC 2883; ``analysis.DSACKED_RETRANSMISSION``): the original had
        arrived, so nothing was lost; the timer fired before the ACK came back (a delayed or lost ACK, a
        timer short for the path, reordering). ``metric`` spurious_retransmissions (the D-SACKed copies);
        always low: wasted sending and perhaps a congestion-window cut, never lost time.
    ``teardown``: retransmissions of a bare FIN (no payload), typically after the peer had sent its own
        FIN, with the FIN's ACK never coming back (the peer, a NAT or a firewall dropped the state). As a
        tcptrace or Wireshark user reads it: the connection was closing, both applications were done
        with it, no data waited; informational, with the count, the timer and the peer's FIN frame. A
        FIN carried on the last data segment is data (``rto``).
    ``capture_gap``: any stall above whose interval contains a silence of the whole capture (no packet
        from anyone) of at least ``capture_gap_ns`` after which traffic resumed without a retransmission
        (the first data-bearing TCP segment after it is not a retransmission): the capture was stopped or
        files were merged, and the time is the capture's, not TCP's. Informational ("cannot judge"),
        naming the silence. A capture-wide silence that ends in retransmissions is an outage or an RTO
        backoff and stays the stall it is. Which segment came first after a silence is the whole
        capture's: on server partitions, the connections with an episode holding a silence are judged
        where the partitions meet (:func:`partial`, :func:`finish`).
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
        between and no silence longer than ``transfer_gap_rtts`` (2) x RTT + ``resume_slack_ns`` (slow
        start sends every round trip). Flight is measured per RTT round (bytes of new data sent in each
        RTT-long slot from the transfer's first segment; the first round is its first
        ``first_round_rtts`` RTT), which reads the same from any vantage point, unlike ``bytes_in_flight``.
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
    (``metric`` stall_ms; spurious_retransmission: the count), ``threshold`` the kind's episode threshold in
    ms for that connection, and the
    evidence frames are, per episode: rto (and the other timer kinds): the original of the lost data, the
    last segment before the silence, for a SYN or SYN/ACK the peer's answer before the timer fired, each
    retransmission and the peer's next segment; capture_gap adds the packets either side of the silence;
    delayed_ack: the outstanding segment, the delayed ACK and the held segment; zero_window: the first
    zero window, the probes, the reopening and the sender's next data; window_full: the full segment, the reopening ACK and the
    next data; slow start: the segment before the idle gap and the transfer's first and last segments.

Share of life
    The connection's active life is its first-to-last-packet time minus application idle time: gaps of
    at least the RTO estimate after which both sides simply carry on (the next packet is new data, a
    FIN/RST or a keep-alive, not a retransmission, probe or window update). A connection that sleeps
    2 s between requests did not lose those seconds.

Severity rule (per finding; L = time lost, S = L / active life, R = L / path RTT)
    The cost of a stall is weighed twice: in absolute time and share of the connection (what the user
    saw) and in the path's own timescale (what makes it herdscope's pathology: a fixed timer that is
    hundreds to thousands of round trips long). A 1 s initial SYN timeout on a 48 ms path is ~20 RTTs,
    RFC 6298 working as designed: low; the same second on a 0.4 ms path is 2,500 RTTs: medium or high.
    by time: critical: L >= critical_lost_ns (10 s) and S >= critical_share (0.5);
        high: L >= high_lost_ns (1 s) and S >= high_share (0.25);
        medium: L >= medium_lost_ns (100 ms) and S >= medium_share (0.10); low otherwise.
    by RTTs (rto, synack_retransmission, delayed_ack, zero_window, window_full: the timer and window
        kinds): critical from critical_lost_rtts (5,000), high from high_lost_rtts (500), medium from
        medium_lost_rtts (50), low otherwise. These kinds take the lower of the two; the slow-start
        kinds, whose loss is counted in round trips already, take the time scale alone.
    Nothing is reported below min_lost_ns (10 ms; spurious retransmissions are counted, not timed).
    Caps: informational when it cannot be judged (only one direction captured, no RTT measured, a
    capture gap) and for ``teardown``; ``rto`` and ``synack_retransmission`` at most low when no single
    episode lost ``rto_mismatch_rtts`` RTTs (a timer in proportion to the path, however often), and when
    nothing waited on them (a SYN or SYN/ACK episode after which the connection carried no data);
    ``spurious_retransmission`` low; ``small_initial_window`` at most low (a tuning hint).

Vantage point and resolution
    A connection with one direction missing is reported at most informational, saying which direction
    was seen. RTTs are never reported below the capture's timestamp resolution, and an explanation says
    when the RTT is within 10 ticks of it.

Known false positives
    An application that itself pauses exactly one RTT after a peer's pure ACK (looks like Nagle); a
    sender pacing its own bursts (looks like a small initial window; at most low); retransmissions
    of a capture that dropped packets (the gap is the capture's, not the sender's; only a silence of the
    whole capture is recognised as such); D-SACK is only seen where the receiver negotiated SACK, so a
    spurious retransmission without it still reads as ``rto``.

References: RFC 6298 (RTO, minimum 1 s, backoff), RFC 2883 (D-SACK), RFC 5961 (challenge ACK), RFC 5681
(slow start, restart after idle), RFC 6928 (IW10), RFC 896 (Nagle), RFC 1122 4.2.3.2 (delayed ACK <= 500 ms),
RFC 9293, Linux tcp(7) (tcp_slow_start_after_idle, TCP_NODELAY, rto_min), Wireshark's tcp.analysis.*
definitions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from . import tcp_stall_bursts, tcp_stall_kinds as ep
from .base import (NS_PER_MS, RESOLUTION_TICKS, SEVERITIES, empty_findings, endpoint_expr, findings, fmt_ns,
                   resolution_ns)
from .params import LOWER, UPPER, param
from .tcp_stall_explain import explain

NAME = "tcp_stall"
# every frame it reads (packets: capture-wide silences; interfaces: resolution_ns)
REQUIRES = ("tcp_segments", "connections", "packets", "interfaces")
# what it reads of tcp_segments (base.py: a scan keeps no more of it for its readers)
SEGMENT_COLUMNS = ("frame", "conn", "from_client", "seq_rel", "seglen", "analysis", "acks_frame", "ack_rtt_ns",
                   "rtt_ns", "initial_rtt_ns", "ts_ns", "tcp_flags", "window")
COLUMNS = {"tcp_segments": SEGMENT_COLUMNS}
# its findings are the union of its findings per server partition, and per shard of a server's clients:
# each connection is judged alone (base.py; tests/test_partitions.py)
PARTITION = "server"
SHARDS = True
# the parameter that is the shortest silence of the whole capture it looks for in packets (base.py)
SILENCE = "capture_gap_ns"
ORDER = 40  # where it runs and is listed (detectors/__init__.py)

# the sender's segment size when the peer announced no MSS: Ethernet's 1500-byte MTU less 40 bytes of
# IPv4 and TCP headers
DEFAULT_MSS = 1460
# Connections are analysed in batches of whole connections of about this many segments: a bound on the
# working set, not a threshold (every connection is judged alone; the findings do not depend on it).
# A batch's working set is ~700 B a segment: at 1 << 18 it was the 1M synth scan's peak (506 MB of
# anonymous memory, 465 at 1 << 17, 460-466 at 1 << 16, the time within run-to-run noise)
BATCH_SEGMENTS = 1 << 17

KINDS = ("rto", "synack_retransmission", "spurious_retransmission", "teardown", "capture_gap", "delayed_ack",
         "zero_window", "window_full", "slow_start_after_idle", "small_initial_window")
# kinds whose severity also weighs the time lost against the path's RTT (fixed timers and receiver waits)
RTT_SCALED = ("rto", "synack_retransmission", "delayed_ack", "zero_window", "window_full")
# many connections stalled the same way form one population per service, or across servers (detectors/population.py);
# not the kinds that cost nothing or cannot be judged (spurious_retransmission, teardown, capture_gap): no service pathology
POPULATION = {"kinds": tuple(k for k in KINDS if k not in ("spurious_retransmission", "teardown", "capture_gap")),
              "service": "resource_head", "member": "connection", "fleet": True}


@dataclass(frozen=True)
class Params:
    rto_min_gap_ns: int = param(20_000_000, "rto: a retransmission counts as timer-driven after a sender "
                                            "silence of at least this long (below any stack's minimum RTO but "
                                            "above Linux's TLP floor) ...", unit="ns", gate=LOWER, lo=0)
    rto_gap_rtts: float = param(3.0, "... and this many RTTs", unit="RTTs", gate=LOWER, lo=0.0)
    rto_mismatch_rtts: float = param(25.0, "an episode losing this many RTTs: a timer out of proportion to the "
                                           "path", unit="RTTs", gate=LOWER, lo=0.0)
    rto_max_gap_ns: int = param(130_000_000_000, "longer silences are not a timer (Linux TCP_RTO_MAX is 120 s)",
                                unit="ns", gate=UPPER, lo=0)
    delack_min_ns: int = param(15_000_000, "delayed_ack: the pure ACK came at least this long after the data "
                                           "(Linux delayed ACK >= 40 ms, Windows 200 ms) ...", unit="ns",
                               gate=LOWER, lo=0)
    delack_rtts: float = param(4.0, "... and this many RTTs after it", unit="RTTs", gate=LOWER, lo=0.0)
    delack_min_events: int = param(3, "held segments needed per connection side before reporting",
                                   unit="segments", gate=LOWER, lo=1)
    resume_rtts: float = param(1.5, "the blocked side resumes within resume_rtts x RTT + resume_slack_ns of the "
                                    "ACK / window update", unit="RTTs", lo=0.0)
    resume_slack_ns: int = param(1_000_000, "(see resume_rtts)", unit="ns", lo=0)
    window_min_ns: int = param(10_000_000, "zero_window / window_full: waits shorter than max(window_min_ns, "
                                           "window_rtts x RTT) are not stalls", unit="ns", gate=LOWER, lo=0)
    window_rtts: float = param(4.0, "(see window_min_ns)", unit="RTTs", gate=LOWER, lo=0.0)
    idle_min_ns: int = param(200_000_000, "idle: silence longer than the RTO estimate (idle_min_ns + RTT; "
                                          "Linux's RTO is >= 200 ms + SRTT)", unit="ns", lo=0)
    restart_ratio: float = param(0.25, "slow_start_after_idle: after idle the first round carries at most this "
                                       "fraction of the previous transfer's best per-RTT flight ...",
                                 unit="share", gate=UPPER, lo=0.0, hi=1.0)
    iw_max_segments: int = param(16, "... and at most this many MSS (IW10 = 10; some stacks use more)",
                                 unit="segments", gate=UPPER, lo=1)
    first_round_rtts: float = param(0.8, "the first round is the first 0.8 RTT of a transfer", unit="RTTs",
                                    lo=0.0)
    sis_min_rounds: int = param(3, "small_initial_window: transfers that took at least this many RTT rounds "
                                   "while still growing", unit="rounds", gate=LOWER, lo=1)
    min_lost_ns: int = param(10_000_000, "severity: time lost per finding below which it is not reported",
                             unit="ns", gate=LOWER, lo=0)
    medium_lost_ns: int = param(100_000_000, "medium from this much lost ...", unit="ns", gate=LOWER, lo=0)
    medium_share: float = param(0.10, "... that is this share of the active life", unit="share", gate=LOWER,
                                lo=0.0, hi=1.0)
    high_lost_ns: int = param(1_000_000_000, "high from this much lost ...", unit="ns", gate=LOWER, lo=0)
    high_share: float = param(0.25, "... and this share", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    critical_lost_ns: int = param(10_000_000_000, "critical from this much lost ...", unit="ns", gate=LOWER,
                                  lo=0)
    critical_share: float = param(0.5, "... and this share of the active life", unit="share", gate=LOWER,
                                  lo=0.0, hi=1.0)
    medium_lost_rtts: float = param(50.0, "severity of timer and window stalls: medium also needs the time lost to "
                                          "be this many RTTs of the path ...", unit="RTTs", gate=LOWER, lo=0.0)
    high_lost_rtts: float = param(500.0, "... high this many ...", unit="RTTs", gate=LOWER, lo=0.0)
    critical_lost_rtts: float = param(5000.0, "... and critical this many (a timer thousands of RTTs long)",
                                      unit="RTTs", gate=LOWER, lo=0.0)
    small_segment_margin: int = param(40, "delayed_ack: the held segment N is small: more than this many bytes "
                                          "under the peer's MSS", unit="bytes", gate=LOWER, lo=0)
    transfer_gap_rtts: float = param(2.0, "a transfer ends at a silence longer than this many RTTs + "
                                          "resume_slack_ns (slow start sends every round trip)", unit="RTTs", lo=0.0)
    round_growth: float = param(1.5, "slow start: a round grows when it carries at least this times the round "
                                     "before (a transfer still growing; a second round that grew)", unit="x", lo=0.0)
    transfer_growth: int = param(2, "both slow-start kinds: the transfer carried at least this times its first "
                                    "round (it needed more than one window)", unit="x", lo=0)
    ssi_min_first_segments: float = param(0.5, "slow_start_after_idle: the first round after idle carried at least "
                                               "this many MSS", unit="segments", lo=0.0)
    sis_min_first_segments: int = param(2, "small_initial_window: the first round carried at least this many MSS",
                                        unit="segments", lo=0)
    capture_gap_ns: int = param(10_000_000_000, "a silence of the whole capture (no packet from anyone) at least "
                                "this long inside a stall, after which traffic resumes without a retransmission, "
                                "is the capture's (stopped, or files merged): the stall is reported as "
                                "capture_gap, cannot judge (reclassifies, gates nothing)", unit="ns", lo=1)


# -- inputs ------------------------------------------------------------------------------------------

def _segments(seg: pl.DataFrame, conns: tuple[int, int]) -> pl.DataFrame:
    """The segments of connections ``conns`` (first, last id) of ``seg`` (tcp_segments with its row
    index ``_i`` over the rows that have a time, see :func:`_indexed`), in capture order; tcp_segments
    carries ts_ns, tcp_flags and the raw window."""
    return seg.select(  # the columns first: the filter copies only these
        "_i", *SEGMENT_COLUMNS,
    ).filter(pl.col("conn").is_between(*conns) & pl.col("ts_ns").is_not_null()).with_columns(
        pl.col("tcp_flags").fill_null(0).cast(pl.Int64),
        pl.col("seglen").cast(pl.Int64),
        pl.col("seq_rel").cast(pl.Int64),
        pl.col("analysis").cast(pl.Int64),
    )


def _indexed(seg: pl.DataFrame) -> pl.DataFrame:
    """tcp_segments with ``_i``: the row's position among the rows that have a time (capture order)."""
    return seg.with_columns((pl.col("ts_ns").is_not_null().cast(pl.Int64).cum_sum() - 1).alias("_i"))


def _batches(seg: pl.DataFrame, max_segments: int) -> list[tuple[int, int]]:
    """(first, last) connection ids of consecutive batches of whole connections, each of about
    ``max_segments`` segments (one connection with more is a batch of its own)."""
    counts = seg.group_by("conn").len().sort("conn")
    ids, n = counts["conn"].to_numpy().astype(np.int64), counts["len"].to_numpy().astype(np.int64)
    if ids.size == 0:
        return []
    batch = (np.cumsum(n) - n) // max(1, max_segments)
    edges = np.flatnonzero(np.diff(batch)) + 1
    starts, stops = np.r_[0, edges], np.r_[edges, ids.size] - 1
    return [(int(ids[a]), int(ids[b])) for a, b in zip(starts, stops)]


def _connection_info(s: pl.DataFrame, conns: pl.DataFrame, res: float) -> pl.DataFrame:
    """Per connection: path RTT (and how it was measured), vantage, MSS per side, labels."""
    rtts = s.group_by("conn").agg(
        pl.col("ts_ns").filter(pl.col("seglen") > 0).max().alias("last_pay_ts"),
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
        endpoint_expr(pl.col("client"), pl.col("client_port")).alias("client_ep"),
        endpoint_expr(pl.col("server"), pl.col("server_port")).alias("server_ep"),
    ).join(rtts.select("conn", "rtt", "rtt_source", "last_pay_ts"), on="conn", how="left")
    return c.with_columns(
        ((pl.col("client_packets") > 0) & (pl.col("server_packets") > 0)).alias("both_directions"),
        pl.format("{}-{}", "server_ep", "client_ep").alias("resource"),
        (pl.col("last_ts_ns") - pl.col("first_ts_ns")).alias("life_ns"),
    )


# -- findings ----------------------------------------------------------------------------------------

RANKED = SEVERITIES  # the severity names, by rank (0 informational .. 4 critical)


def _severity(p: Params) -> pl.Expr:
    """The severity rule of the module docstring, as ranks (0 informational .. 4 critical)."""
    lost, share = pl.col("stall_ns"), pl.col("share")
    by_time = (pl.when((lost >= p.critical_lost_ns) & (share >= p.critical_share)).then(4)
               .when((lost >= p.high_lost_ns) & (share >= p.high_share)).then(3)
               .when((lost >= p.medium_lost_ns) & (share >= p.medium_share)).then(2)
               .otherwise(1))
    rtts = lost / pl.col("rtt")
    by_rtts = (pl.when(rtts >= p.critical_lost_rtts).then(4).when(rtts >= p.high_lost_rtts).then(3)
               .when(rtts >= p.medium_lost_rtts).then(2).otherwise(1))
    kind = pl.col("kind")
    rank = pl.when(kind.is_in(RTT_SCALED)).then(pl.min_horizontal(by_time, by_rtts)).otherwise(by_time)
    in_proportion = pl.col("max_stall") < pl.col("rtt").fill_null(0.0) * p.rto_mismatch_rtts
    capped = ((kind.is_in(["rto", "synack_retransmission"]) & in_proportion)
              | kind.is_in(["small_initial_window", "spurious_retransmission"]) | ~pl.col("waited"))
    cannot = ~pl.col("both_directions") | pl.col("rtt").is_null() | kind.is_in(["teardown", "capture_gap"])
    rank = (pl.when(cannot).then(0).when(capped).then(pl.min_horizontal(rank, pl.lit(1)))
            .when(kind == "spurious_retransmission").then(1).otherwise(rank))
    return rank.replace_strict(list(range(len(RANKED))), list(RANKED), return_dtype=pl.String)


def _metric() -> tuple[pl.Expr, ...]:
    """metric, value, threshold, unit: the time lost in ms; for spurious retransmissions their count."""
    spurious = pl.col("kind") == "spurious_retransmission"
    return (pl.when(spurious).then(pl.lit("spurious_retransmissions")).otherwise(pl.lit("stall_ms")).alias("metric"),
            pl.when(spurious).then(pl.col("dsacked").cast(pl.Float64)).otherwise(pl.col("stall_ns") / NS_PER_MS)
            .alias("value"),
            pl.when(spurious).then(pl.lit(1.0)).otherwise(pl.col("threshold_ns") / NS_PER_MS).alias("threshold"),
            pl.when(spurious).then(pl.lit("retransmissions")).otherwise(pl.lit("ms")).alias("unit"))


def segment_batches(seg: pl.DataFrame, conns: pl.DataFrame):
    """(segments, connections) of consecutive batches of whole connections of tcp_segments ``seg`` and
    the connections frame ``conns``, about BATCH_SEGMENTS segments each, the segments as
    :func:`linked_segments` takes them: the working set is a batch's, not the capture's (issue 13)."""
    seg = _indexed(seg)
    for batch in _batches(seg, BATCH_SEGMENTS):
        yield _segments(seg, batch), conns.filter(pl.col("conn").is_between(*batch))


def linked_segments(s: pl.DataFrame, conns: pl.DataFrame, p: Params, res: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(segments ``s`` of some connections, from :func:`_segments`, with their connection's RTT,
    MSS and the link columns of tcp_stall_kinds.linked; those connections' info): what every episode
    kind reads, here and in detectors/incast_rounds.py."""
    info = _connection_info(s, conns, res)
    per_conn = info.select("conn", "rtt", "saw_synack", "last_ts_ns", "client_mss", "server_mss", "last_pay_ts")
    s = s.join(per_conn, on="conn", how="left", maintain_order="left").with_columns(
        # the sender's segment size is the peer's announced MSS
        pl.coalesce(pl.when(pl.col("from_client")).then(pl.col("server_mss")).otherwise(pl.col("client_mss")),
                    pl.lit(DEFAULT_MSS)).alias("peer_mss"),
        ep.DK.alias("dk"),
        (pl.col("rtt").fill_null(0.0) * p.resume_rtts + p.resume_slack_ns + res).alias(ep.RESUME))
    return ep.linked(s, info, p, res)


def _batch_episodes(s: pl.DataFrame, conns: pl.DataFrame, p: Params, res: float):
    """One batch of whole connections: (its episodes by kind: rto, delayed_ack, zero_window,
    window_full, bursts; its connections' info; its resume rows for ``first_resumes``)."""
    s, info = linked_segments(s, conns, p, res)
    zw = ep.zero_window(s, p, res)
    parts = [ep.rto(s, p, res), ep.delayed_ack(s, p, res), zw, ep.window_full(s, zw, p, res),
             tcp_stall_bursts.bursts(s, p, res)]
    return parts, info, ep.resume_rows(s)


def _last_packet_ns(capture, last_seg_ns: int) -> int:
    """The time of the capture's last packet (``packets``: the whole capture's span on a partition), or
    ``last_seg_ns`` when none is known."""
    try:
        last = capture.packets["ts_ns"].max()
    except (KeyError, AttributeError, pl.exceptions.ColumnNotFoundError):
        return last_seg_ns
    return max(int(last), int(last_seg_ns)) if last is not None else last_seg_ns


# what partial() hands finish() of the connections whose findings wait on the whole capture's silences
# (an episode of theirs holds one): their episodes and their info, of the same columns and types on every
# partition (``conn`` there is the connection's first frame, which no other partition's connection has)
EPISODE_SCHEMA = pl.Schema({
    "conn": pl.UInt32, "from_client": pl.Boolean, "kind": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
    "stall_ns": pl.Float64, "threshold_ns": pl.Float64, "frames": pl.List(pl.UInt32), "gaps": pl.List(pl.Float64),
    "retx": pl.UInt32, "syn": pl.Boolean, "waited": pl.Boolean, "dsacked": pl.UInt32, "ans_frame": pl.UInt32,
    "ans_flags": pl.Int64, "peer_fin_frame": pl.UInt32, "unanswered": pl.Boolean, "peer_last_frame": pl.UInt32,
    "wait_ns": pl.Int64, "probes": pl.UInt32, "never_reopened": pl.Boolean, "first_bytes": pl.Int64,
    "prev_peak": pl.Int64, "best_peak": pl.Int64, "bytes": pl.Int64, "rounds": pl.Int64, "idle_ns": pl.Int64})
CONNECTION_SCHEMA = pl.Schema({
    "conn": pl.UInt32, "first_ts_ns": pl.Int64, "last_ts_ns": pl.Int64, "client_packets": pl.UInt32,
    "server_packets": pl.UInt32, "client": pl.String, "server": pl.String, "client_port": pl.UInt16,
    "server_port": pl.UInt16, "client_mss": pl.Int64, "server_mss": pl.Int64, "saw_synack": pl.Boolean,
    "client_ep": pl.String, "server_ep": pl.String, "rtt": pl.Float64, "rtt_source": pl.String,
    "last_pay_ts": pl.Int64, "both_directions": pl.Boolean, "resource": pl.String, "life_ns": pl.Int64,
    "idle_ns": pl.Int64, "active_ns": pl.Int64})
SPAN_SCHEMA = pl.Schema({"last_ns": pl.Int64})  # the capture's last packet


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    return finish(partial(capture, params), capture, params)


def partial(capture, params: Params = Params()) -> dict[str, pl.DataFrame]:
    """Step one of two (base.py, PARTITION): ``findings``, those of the connections no episode of which
    holds a silence of the whole capture; of the others (whether a stall is the capture's depends on
    what the whole capture resumed with after the silence, which a partition sees only part of),
    their ``episodes`` and ``connections``; each silence's first data-bearing segment after it here
    (``resumes``) and the capture's last packet (``span``)."""
    p = params
    parts = {"findings": empty_findings(), "episodes": pl.DataFrame(schema=EPISODE_SCHEMA),
             "connections": pl.DataFrame(schema=CONNECTION_SCHEMA),
             "resumes": pl.DataFrame(schema=ep.RESUME_SCHEMA), "span": pl.DataFrame(schema=SPAN_SCHEMA)}
    try:
        seg = capture.frame("tcp_segments")
        conns = capture.frame("connections")
    except KeyError:
        return parts
    if seg.height == 0 or conns.height == 0:
        return parts
    res = resolution_ns(capture)
    last_seg_ts = seg["ts_ns"].max()
    if last_seg_ts is None:
        return parts
    # the capture's end: its last packet from anyone (the whole capture's on a partition or shard, whose
    # own segments end earlier), or the last segment's where no packet times are held
    last_ns = _last_packet_ns(capture, last_seg_ts)
    parts["span"] = pl.DataFrame({"last_ns": [last_ns]}, schema=SPAN_SCHEMA)
    # Everything below is per connection but the capture's silences, so the connections are taken in
    # batches (segment_batches); each batch's resumes are kept for the silences.
    kinds: list[list[pl.DataFrame]] = [[] for _ in range(5)]
    infos, resumes = [], []
    for batch_segments, batch_conns in segment_batches(seg, conns):
        batch, info, resume = _batch_episodes(batch_segments, batch_conns, p, res)
        for k, part in enumerate(batch):
            kinds[k].append(part)
        infos.append(info)
        resumes.append(resume)
    del seg
    silences = ep.capture_silences(capture, p)
    parts["resumes"] = ep.first_resumes(silences, resumes)
    found = [x for part in kinds for x in part if x.height]
    if not found:
        return parts
    info = pl.concat(infos, how="diagonal_relaxed")
    eps = _episodes(found)
    waiting = pl.col("conn").is_in(ep.holding_a_silence(eps, silences).implode())
    no_silence = pl.DataFrame(schema=ep.SILENCE_SCHEMA)
    parts["findings"] = _findings(eps.filter(~waiting), info, no_silence, last_ns, res, p)
    first_frame = conns.select("conn", pl.col("first_frame").cast(pl.UInt32).alias("_first"))

    def by_first_frame(frame: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
        frame = frame.filter(waiting).join(first_frame, on="conn", how="left", maintain_order="left")
        return frame.with_columns(pl.col("_first").alias("conn")).select(*schema).cast(schema)

    parts["episodes"] = by_first_frame(eps, EPISODE_SCHEMA)
    parts["connections"] = by_first_frame(info, CONNECTION_SCHEMA)
    return parts


def finish(parts: dict[str, pl.DataFrame], capture, params: Params = Params()) -> pl.DataFrame:
    """The findings of :func:`partial`'s parts (of the whole capture, or concatenated over its
    partitions): the connections whose episodes hold a silence of the whole capture judged with the
    silences after which the whole capture resumed cleanly. Reads ``interfaces`` of ``capture``."""
    found = parts["findings"]
    if parts["episodes"].height:
        last_ns = parts["span"]["last_ns"].max()
        found = pl.concat([found, _findings(parts["episodes"], parts["connections"], ep.clean_gaps(parts["resumes"]),
                                            last_ns, resolution_ns(capture), params)])
    return found.sort("start_ns", maintain_order=True)


def _episodes(found: list[pl.DataFrame]) -> pl.DataFrame:
    """The episodes of every kind as one frame (the columns a kind has not, null)."""
    eps = pl.concat(found, how="diagonal_relaxed")
    for col, dtype in EPISODE_SCHEMA.items():
        if col not in eps.columns:
            eps = eps.with_columns(pl.lit(None, dtype).alias(col))
    return eps.with_columns(pl.col("gaps").cast(pl.List(pl.Float64)), pl.col("waited").fill_null(True))


def _findings(eps: pl.DataFrame, info: pl.DataFrame, gaps: pl.DataFrame, last_ns: int, res: float,
              p: Params) -> pl.DataFrame:
    """The findings of episodes ``eps`` (:func:`_episodes`) of connections ``info``, those holding a
    clean silence of the whole capture (``gaps``: tcp_stall_kinds.clean_gaps) the capture's."""
    if eps.height == 0:
        return empty_findings()
    # a stall that spans a silence of the whole capture that ended cleanly is the capture's
    eps = ep.relabel_capture_gaps(eps, gaps)
    # overlapping episodes of one side and kind count once (union of their intervals)
    eps = eps.sort("conn", "from_client", "kind", "start_ns", "end_ns").with_columns(
        pl.col("end_ns").cum_max().shift(1).over("conn", "from_client", "kind").alias("_covered"))
    eps = eps.with_columns(
        (pl.col("stall_ns") - (pl.col("_covered") - pl.col("start_ns")).clip(lower_bound=0).fill_null(0)
         .clip(upper_bound=pl.col("end_ns") - pl.col("start_ns"))).clip(lower_bound=0.0).alias("stall_ns"))
    agg = eps.sort("start_ns", "end_ns").group_by("conn", "from_client", "kind").agg(
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
        pl.col("waited").any(), pl.col("dsacked").sum(), pl.col("retx").sum().alias("retx_total"),
        pl.col("ans_frame").drop_nulls().first(), pl.col("ans_flags").drop_nulls().first(),
        pl.col("peer_fin_frame").drop_nulls().first(), pl.col("was_kind").first(), pl.col("gap_ns").max(),
        # the last episode went unanswered: the peer sent nothing after its retransmissions
        pl.col("unanswered").fill_null(False).last(), pl.col("peer_last_frame").drop_nulls().first(),
    )
    agg = agg.filter(~((pl.col("kind") == "delayed_ack") & (pl.col("episodes") < p.delack_min_events)))
    # "never answered" needs the capture to go on for at least a timeout after the last retransmission
    agg = agg.with_columns((pl.col("unanswered") & (pl.col("end_ns") + pl.col("threshold_ns") <= last_ns))
                           .alias("unanswered"))
    agg = agg.join(info, on="conn", how="inner").with_columns(
        (pl.col("stall_ns") / pl.col("active_ns")).clip(upper_bound=1.0).alias("share"))
    agg = agg.filter((pl.col("stall_ns") >= p.min_lost_ns) | (pl.col("kind") == "spurious_retransmission"))
    if agg.height == 0:
        return empty_findings()
    agg = agg.with_columns(_severity(p).alias("severity")).sort("start_ns", "conn", "from_client", "kind")
    texts = []
    for r in agg.iter_rows(named=True):
        t = explain(r, res, p)
        notes = []
        if not r["both_directions"]:
            seen = "client->server" if (r["client_packets"] or 0) > 0 else "server->client"
            notes.append(f"only the {seen} direction was captured, so this cannot be judged (informational)")
        elif r["rtt"] is None:
            notes.append("no RTT could be measured, so this cannot be judged (informational)")
        elif r["rtt"] < RESOLUTION_TICKS * res:
            notes.append(f"the RTT ({r['rtt_source']}) is within {RESOLUTION_TICKS} ticks of the {fmt_ns(res)} "
                         f"timestamp resolution, so RTT multiples are approximate")
        if not r["waited"] and r["kind"] in ("rto", "synack_retransmission"):
            notes.append("no data followed in the connection, so nothing waited on it (at most low)")
        if notes:
            t = t.rstrip(".") + "; " + "; ".join(notes) + "."
        texts.append(t)
    rows = agg.select(
        "kind", "severity", pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64),
        pl.col("client"), pl.col("server"), pl.col("resource"),
        pl.lit(1, pl.UInt32).alias("clients"), pl.lit("connection").alias("client_identity"),
        *_metric(),
        pl.col("evidence_frames").list.drop_nulls(),
    ).with_columns(pl.Series("explanation", texts, dtype=pl.String))
    return findings(rows, detector=NAME, params=p)
