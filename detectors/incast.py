"""TCP incast: one client's fan-out answered by many servers at once, flows sitting out RTO-min.

The pathology
    A client (an aggregator: a storage, search or map-reduce front end) asks N servers for a block
    at once; the N answers converge on the client's switch port, overflow its shallow buffer, and
    the flows that lose their tail segments get too few duplicate ACKs for fast retransmit (and a
    tail loss probe that is lost too): they wait out the retransmission timer, whose minimum
    (Linux ``TCP_RTO_MIN`` 200 ms, RFC 6298 2.4 says 1 s) is thousands of the path's round trips.
    The round completes only with the slowest flow, so the link idles while the timer runs:
    goodput falls by up to 90 % (Vasudevan et al., "Safe and Effective Fine-grained TCP
    Retransmissions for Datacenter Communication", SIGCOMM 2009; Alizadeh et al., "Data Center
    TCP (DCTCP)", SIGCOMM 2010; Phanishayee et al., FAST 2008).

The signal (detectors/incast_rounds.py; the ``tcp_segments`` and ``connections`` frames)
    * Turns: per TCP connection, a run of the client's payload (a request) and the server's answer
      after it (first and last segment, bytes).
    * Rounds, per client address: requests less than ``max(fanout_gap_ns, fanout_gap_rtts x base
      RTT)`` apart form one round (base RTT: the smallest path RTT of the client's connections, as
      tcp_stall measures it). An answer is in flight from its first segment to its last, or to the
      first transmission of the data it lost; the fan-in of a round is the most answers in flight at
      once (not the requests: answers that do not overlap do not share the buffer); a fan-out round
      has a fan-in of at least ``min_fan_in``.
    * Timed-out flows: tcp_stall's own ``rto`` episodes (detectors/tcp_stall_kinds.py ``rto``, with
      tcp_stall's default thresholds: a retransmission, not a fast one, after the server was silent)
      that began inside the answer and whose first silence (the RTO gap) is at least
      ``max(min_gap_ns, min_gap_rtts x path RTT)``: a timer out of all proportion to the path; and
      at least ``min_fan_in`` answers (itself included) were in flight while it was.
    * An incast round is a fan-out round with at least ``min_timed_out`` concurrent flows timed out.
      Its time is the first request to the last segment of the slowest answer; without the timeouts
      it would have been the same with each flow's stall taken out (tcp_stall's stall: the lost
      data's first transmission to its retransmission, less one RTT). Goodput lost = 1 - sum of
      those ideal times / sum of the actual times, over the client's fan-out rounds.

One finding per client address (its fan-out rounds over the capture): rounds, fan-in, flows timed
out per incast round, the RTO gap against the base RTT, the goodput lost (``metric``
goodput_lost, ``value`` the share, ``threshold`` ``medium_lost_share``). It explains tcp_stall's
``rto`` findings of that client that began within it (``EXPLAINS``, detectors/population.py: they
become its members), so one cause gives one finding. The client's own request retransmissions in
those rounds (its timer fired because the answer carrying the request's ACK was lost at the port;
the server's D-SACK shows the request had arrived) stay tcp_stall's low spurious_retransmission
findings.

Vantage point
    The capture shows a timeout as a retransmission after a silence only where it saw the original:
    at the servers, or at the switch before the bottleneck (a SPAN port). At the client, a tail lost
    entirely before the capture point arrives after the timer as ordinary in-order data (no
    retransmission to see): such flows are not counted, so a client-side capture under-reports; a
    flow that lost a segment in the middle of its answer is still counted (the retransmission
    fills a hole the capture saw). A connection seen in one direction only: informational.

Known false positives
    * A single lossy path: one server's flows time out whatever the round (a bad link or NIC): while
      fewer than ``min_timed_out_servers`` distinct servers ever timed out the finding is kind
      ``single_path``, at most low, and explains nothing (tcp_stall's findings of that path stand
      as they are: a lossy path is their pathology, not a fan-out's).
    * A client that is itself slow (zero window, a full receive buffer): its servers wait on the
      window, not on a timer; they are tcp_stall's zero_window / window_full, never counted here;
      but a server that retransmits after a window probe timeout can look alike.
    * Staggered responses: servers that answer one after another do not share the buffer; their
      answers are not in flight together and do not make a fan-out round. A flow whose answer overlapped
      fewer than ``min_fan_in`` answers (itself included) is not counted, even in a fan-out round.
    * Losses elsewhere on the path at the same moment (a congested core link, a policer) read the
      same: the capture cannot tell which queue dropped.

Severity rule (per client; R = incast rounds, S = R / fan-out rounds, L = goodput lost)
    low: at least one incast round; medium: R >= ``medium_rounds`` and L >= ``medium_lost_share``;
    high: R >= ``high_rounds``, S >= ``high_round_share`` and L >= ``high_lost_share``; critical:
    as high with L >= ``critical_lost_share`` (the 90 % collapse). At most low (kind ``single_path``)
    when the timeouts came from fewer than ``min_timed_out_servers`` servers; informational when a
    connection of the rounds was seen in one direction only or no RTT was measured.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from . import incast_rounds as ir
from .base import (SEVERITIES, empty_findings, findings, fmt_limited, fmt_ns, fmt_number,
                   resolution_ns)
from .params import LOWER, param

NAME = "incast"
# single_path: fan-out rounds whose timeouts all came from fewer than min_timed_out_servers servers
KINDS = ("incast", "single_path")
# every frame it reads (tcp_segments / connections as tcp_stall does; interfaces: resolution_ns)
REQUIRES = ("tcp_segments", "connections", "interfaces")
COLUMNS = {"tcp_segments": ir.SEGMENT_COLUMNS}  # what it reads of them (base.py)
ORDER = 45  # after tcp_stall (40), whose rto findings it explains
# a finding is one client's rounds across its servers: the union of its findings on client buckets
PARTITION = "client"
# an incast finding is the cause of tcp_stall's rto findings of its client in its window
# (not the client's spurious request retransmissions of those rounds, low findings counted in retransmissions:
# the members' values must share one unit, ms, for the explanation's median and worst)
EXPLAINS = {"incast": {"service": "client", "detector": "tcp_stall", "kinds": ("rto",), "member_service": "client"}}
LISTED_SERVERS = 8  # servers named in the resource (then "+N more")


@dataclass(frozen=True)
class Params:
    fanout_gap_ns: int = param(10_000_000, "requests of one client less than max(fanout_gap_ns, fanout_gap_rtts x "
                                           "base RTT) apart belong to one round (an aggregator writes its requests "
                                           "in one loop; this leaves room for a busy host)", unit="ns", lo=0)
    fanout_gap_rtts: float = param(4.0, "(see fanout_gap_ns)", unit="RTTs", lo=0.0)
    min_fan_in: int = param(3, "a fan-out round: at least this many answers in flight at once; a timed-out "
                               "flow counts when this many (itself included) were in flight while it was",
                            unit="answers", gate=LOWER, lo=2)
    min_gap_ns: int = param(100_000_000, "a timed-out flow's first silence is at least this long (below Linux's "
                                         "200 ms RTO-min, above its >= 10 ms tail loss probe and the 40 ms "
                                         "delayed ACK) ...", unit="ns", gate=LOWER, lo=0)
    min_gap_rtts: float = param(25.0, "... and this many path RTTs (a timer out of proportion to the path)",
                                unit="RTTs", gate=LOWER, lo=0.0)
    min_timed_out: int = param(1, "an incast round: at least this many of its overlapping flows timed out",
                               unit="flows", gate=LOWER, lo=1)
    min_timed_out_servers: int = param(2, "at most low while the timeouts came from fewer distinct servers (a "
                                          "single lossy path)", unit="servers", gate=LOWER, lo=1)
    medium_rounds: int = param(2, "medium from this many incast rounds ...", unit="rounds", gate=LOWER, lo=1)
    medium_lost_share: float = param(0.2, "... and this share of the fan-out rounds' goodput lost to the timeouts",
                                     unit="share", gate=LOWER, lo=0.0, hi=1.0)
    high_rounds: int = param(5, "high from this many incast rounds ...", unit="rounds", gate=LOWER, lo=1)
    high_round_share: float = param(0.5, "... that are this share of the client's fan-out rounds ...",
                                    unit="share", gate=LOWER, lo=0.0, hi=1.0)
    high_lost_share: float = param(0.5, "... and this share of the goodput lost", unit="share", gate=LOWER,
                                   lo=0.0, hi=1.0)
    critical_lost_share: float = param(0.9, "critical: as high, with this share of the goodput lost",
                                       unit="share", gate=LOWER, lo=0.0, hi=1.0)


def per_client(r: pl.DataFrame, p: Params) -> pl.DataFrame:
    """One row per client with an incast round: the facts of the finding, its severity rank."""
    fan = r.filter(pl.col("fanout"))
    if fan.height == 0:
        return pl.DataFrame()
    inc = pl.col("incast")
    g = fan.group_by("client").agg(
        pl.len().alias("fanout_rounds"), inc.sum().alias("incast_rounds"),
        pl.col("start_ns").filter(inc).min(), pl.col("end_ns").filter(inc).max(),
        pl.col("fan_in").median().alias("median_fan_in"), pl.col("fan_in").max().alias("max_fan_in"),
        pl.col("timed_out").filter(inc).median().alias("median_timed_out"),
        pl.col("timed_out").filter(inc).max().alias("max_timed_out"),
        pl.col("timed_out").filter(inc).sum().alias("flows_timed_out"),
        pl.col("servers_timed_out").filter(inc).list.explode(keep_nulls=False, empty_as_null=False).unique().sort()
        .alias("servers"),
        pl.col("median_gap_ns").filter(inc).median().alias("gap_ns"),
        pl.col("base_rtt").min(),
        pl.col("round_ns").sum().alias("round_total"), pl.col("ideal_ns").sum().alias("ideal_total"),
        pl.col("round_ns").filter(inc).median().alias("median_round_ns"),
        pl.col("ideal_ns").filter(inc).median().alias("median_ideal_ns"),
        pl.col("both_directions").filter(inc).all(),
        pl.col("req_frame").filter(inc).alias("req_frames"),
        pl.col("frames").filter(inc).list.explode(keep_nulls=False, empty_as_null=False).alias("frames"),
    ).filter(pl.col("incast_rounds") > 0)
    if g.height == 0:
        return g
    lost = (1 - pl.col("ideal_total") / pl.col("round_total")).clip(0.0, 1.0)
    g = g.with_columns(lost.fill_nan(0.0).alias("lost"),
                       (pl.col("incast_rounds") / pl.col("fanout_rounds")).alias("round_share"),
                       pl.col("servers").list.len().cast(pl.Int64).alias("n_servers"))
    rounds, share, lost = pl.col("incast_rounds"), pl.col("round_share"), pl.col("lost")
    high = (rounds >= p.high_rounds) & (share >= p.high_round_share) & (lost >= p.high_lost_share)
    rank = (pl.when(high & (lost >= p.critical_lost_share)).then(4).when(high).then(3)
            .when((rounds >= p.medium_rounds) & (lost >= p.medium_lost_share)).then(2).otherwise(1))
    cannot = ~pl.col("both_directions") | pl.col("base_rtt").is_null()
    rank = (pl.when(cannot).then(0).when(pl.col("n_servers") < p.min_timed_out_servers)
            .then(pl.min_horizontal(rank, pl.lit(1))).otherwise(rank))
    return g.with_columns(rank.alias("rank")).sort("start_ns", "client")


def _explain(g: dict, p: Params, res: float) -> str:
    rtt = g["base_rtt"]
    gap = g["gap_ns"] or 0.0
    rtts = gap / rtt if rtt else None
    servers = g["servers"] or []
    text = (f"TCP incast: client {g['client']} had a median {g['median_fan_in']:.0f} servers' answers in flight at "
            f"once (up to {g['max_fan_in']}) in {g['fanout_rounds']} fan-out rounds; in {g['incast_rounds']} of them "
            f"({g['round_share']:.0%}) the answers converging on it overflowed the path and "
            f"{g['flows_timed_out']} flows (median {g['median_timed_out']:.0f}, up to {g['max_timed_out']} per round, "
            f"from {len(servers)} servers) sat out a retransmission timeout: a median first silence of "
            f"{fmt_ns(gap)} on a {fmt_limited(rtt, res) if rtt else 'unmeasured'} base RTT"
            + (f" ({fmt_number(rtts)}x)" if rtts else "")
            + f"; each such round completed only with its slowest flow, a median {fmt_ns(g['median_round_ns'])} "
              f"against {fmt_ns(g['median_ideal_ns'])} without the timeouts: {g['lost']:.0%} of the fan-out "
              f"rounds' goodput lost (a shallow switch buffer and a minimum RTO sized for slower paths: fewer "
              f"concurrent senders or smaller answers per round, a lower rto_min on the route, ECN/DCTCP)")
    notes = []
    if g["rank"] == 0:
        notes.append("a connection of these rounds was seen in one direction only (or no RTT was measured), "
                     "so this cannot be judged (informational)")
    elif len(servers) < p.min_timed_out_servers:
        notes.append(f"every timeout came from {len(servers)} server(s): that may be a single lossy path, not "
                     f"incast (at most low)")
    return text + ("; " + "; ".join(notes) if notes else "") + "."


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    p = params
    # only the clients that may have a timed-out flow: the others can have no incast round
    f = ir.flows(capture, p, suspects_only=True)
    if f.height == 0:
        return empty_findings()
    g = per_client(ir.rounds(f, p), p)
    if g.height == 0:
        return empty_findings()
    res = resolution_ns(capture)
    texts = [_explain(r, p, res) for r in g.iter_rows(named=True)]
    listed = pl.col("servers").list.head(LISTED_SERVERS).list.join(", ")
    more = pl.col("n_servers") - LISTED_SERVERS
    rows = g.select(
        pl.when(pl.col("n_servers") < p.min_timed_out_servers).then(pl.lit("single_path"))
        .otherwise(pl.lit("incast")).alias("kind"),
        pl.col("rank").replace_strict(list(range(len(SEVERITIES))), list(SEVERITIES), return_dtype=pl.String)
        .alias("severity"),
        pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64), "client",
        pl.when(pl.col("n_servers") == 1).then(pl.col("servers").list.first()).alias("server"),
        pl.format("{} <- {}", "client", pl.when(more > 0).then(pl.format("{} (+{} more)", listed, more))
                  .otherwise(listed)).alias("resource"),
        pl.lit(1, pl.UInt32).alias("clients"), pl.lit("address").alias("client_identity"),
        pl.lit("goodput_lost").alias("metric"), pl.col("lost").alias("value"),
        pl.lit(p.medium_lost_share).alias("threshold"), pl.lit("share").alias("unit"),
        pl.concat_list(pl.col("req_frames"), pl.col("frames")).list.drop_nulls().alias("evidence_frames"),
    ).with_columns(pl.Series("explanation", texts, dtype=pl.String))
    return findings(rows, detector=NAME, params=p)

