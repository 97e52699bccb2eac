"""Connection churn: a new TCP connection (with its handshake, bind or negotiate) per request.

The pathology
    A client that opens a connection, authenticates, asks one thing and closes, over and over, instead
    of keeping one connection (a pool) open. Every request pays the TCP handshake and the protocol's
    setup (LDAP bind, SMB2 NEGOTIATE + SESSION_SETUP + TREE_CONNECT), the server pays an accept and
    an authentication each time, and the side that closes first keeps every 4-tuple in TIME_WAIT for
    60 s, eating its ephemeral ports (RFC 9293 3.6.1, RFC 6191; Linux ip_local_port_range has 28,232
    ports). Under load, SYNs queue in the server's listen backlog; when it is full they are dropped
    (or reset), and clients wait their 1 s initial RTO (RFC 6298 2.1) before trying again.

Client identity
    Here the client is the **address**: connections from one address to one service, each from a new
    source port, *are* the churn, so telling ports apart (``base.client_identity``'s address+port rule)
    would hide it. Several processes behind one address (NAT, containers) that each open a connection
    per request still churn from the server's point of view; the explanation says how many of the
    connections overlapped in time, and how many new connections a second the service took from all
    clients over the same period.

What is measured, per (client address, server address, server port) and episode (a run of that
client's connections to that service whose SYNs are at most ``episode_gap_ns`` apart: a pool with
that idle timeout would have kept one connection), over connections whose SYN is in the capture
    - connections and their rate: (n - 1) / max(last SYN - first SYN, ``rate_min_span_ns``): a burst
      shorter than that (15 connections in 6 ms) is not extrapolated to thousands a second;
    - requests per connection: with a decoder for the port, its transactions (``ldap_transactions``:
      operations other than bind, unbind and abandon; ``smb2_transactions``: CREATEs, or commands other
      than NEGOTIATE / SESSION_SETUP / TREE_CONNECT / TREE_DISCONNECT / LOGOFF / ECHO when there is no
      CREATE); without one, TCP request turns (runs of client payload after server payload, from
      ``tcp_segments``). The explanation says which;
    - each connection's life split into setup (SYN to the first useful request: handshake, plus bind
      or negotiate where the protocol is known), work (first useful request to last useful response)
      and teardown (to the last packet); the medians are reported;
    - who closes first (Zeek history: ``F`` before ``f``): that side holds TIME_WAIT. When it is the
      client (on at least ``min_client_close_share`` of the connections; the server, on
      ``min_server_close_share``, is said in words), the ports held in TIME_WAIT at this rate are
      rate x ``time_wait_ns``, never more than the connections seen, compared with ``ephemeral_ports``;
    - 4-tuples reused with a new ISN (``reused_ports``) and how soon (within ``time_wait_ns`` means the
      ports cycle faster than TIME_WAIT).
    Churn is reported when a client opened at least ``min_connections`` connections at
    ``min_rate_per_s`` or more, carrying at most ``max_requests_per_connection`` decoded requests
    (``max_turns_per_connection`` TCP turns without a decoder) each (median): the connection rate is
    compared with the request rate the capture shows, not with an absolute number alone.

    Per service (kind ``syn_backlog``): connection attempts that got no SYN/ACK (Zeek S0 with a
    retransmitted SYN, or REJ / RSTOS0), and handshakes that succeeded only after a retransmitted SYN
    (SYN to SYN/ACK >= ``syn_retry_ns``): the listen backlog overflowing under load. Each such attempt
    is counted (``affected``) when, at its own SYN, both of what makes it a backlog's hold:
      - another handshake to the service was answered within ``backlog_window_ns`` (under load, not a
        closed port): any other, retried or not — its own late SYN/ACK is not one, and leaving the
        retried ones out would make this set shrink as ``syn_retry_ns`` falls;
      - at least ``backlog_min_open`` established connections to the service were open: a full accept
        queue holds at least its backlog of them, so SYNs lost on a lightly loaded service (a few
        connections open at a time) are the path's loss (tcp_stall), not a backlog.
    Judged per attempt, not as a median over them: a median over a set that grows as ``syn_retry_ns``
    falls (more handshakes count as retried, some on an idle service) can fall below the gate and drop
    a finding a stricter setting had. Each attempt's tests depend on neither ``syn_retry_ns`` nor the
    other attempts, so lowering ``syn_retry_ns`` or ``backlog_min_open`` only adds affected attempts.
    Its finding explains tcp_stall's ``rto`` / ``synack_retransmission`` findings at the
    service in its window (``EXPLAINS``): they become its members (detectors/population.py).

Severity rule
    churn: low once the gates above pass; medium at ``medium_rate_per_s`` (10/s) new connections a
    second; high at ``high_rate_per_s`` (100/s) — these two rate steps only for an episode lasting at
    least ``rate_min_span_ns`` (1 s): an isolated burst (an exploit's 21 connections in 14 ms, a
    benchmark's 15 in 6 ms) is still churn but has no sustained rate, so it stays low unless what it
    holds says otherwise —, or when the client's TIME_WAIT ports at this rate would
    reach ``high_time_wait_share`` (25 %) of the ephemeral range, or 4-tuples are reused within
    TIME_WAIT; critical when TIME_WAIT would hold ``critical_time_wait_share`` (75 %) of the range.
    Capped at low for services whose protocol opens a connection per request by design
    (``one_shot_ports``: DNS over TCP 53, Kerberos 88 and 464), and those services are only reported
    at all from the medium rate up. Informational when fewer than ``min_both_directions_share``
    (half) of the group's connections were seen in both directions (one vantage point: cannot judge).
    syn_backlog: low for ``min_failed_syns`` affected attempts; medium when, in the worst window, they
    are at least ``medium_failed_share`` (5 %) of the service's attempts; high at ``high_failed_share``
    (20 %). The window: around each affected SYN, every attempt to the service within
    ``backlog_window_ns``, and the share of them affected; the largest is the finding's value. Those
    attempts do not depend on which ones are affected, so more affected attempts only raise a window's
    share and add windows: the value never falls as a gate is lowered (a share over the whole affected
    period would, when one more far-off attempt widens the period). The explanation also gives the
    share over the whole period.

Known false positives
    Health checks and monitoring probes (one connection per probe by design, usually slower than the
    medium rate); protocols whose norm is a connection per request (capped); a NAT address in front
    of many independent clients each making one request (the overlap count in the explanation shows
    it).

References: RFC 9293 (TCP, TIME_WAIT), RFC 6191, RFC 6298, RFC 4511 4.2 (LDAP bind), MS-SMB2 3.2.4.2
(connection setup), Zeek conn.log (conn_state, history).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from analyzer.decoders import registry

from . import tcp_turns
from .base import (empty_findings, endpoint, endpoint_expr, findings, fmt_ns, optional_frame, protocol_declaration,
                   resolution_ns, transaction_frames)
from .params import LOWER, UPPER, param

NAME = "conn_churn"
KINDS = ("churn", "syn_backlog")
# many clients churning against one service form one population there, judged by the service's
# new-connection rate against this detector's own rate steps (detectors/population.py)
POPULATION = {"kinds": ("churn",), "service": "resource", "member": "client", "aggregate": "rate",
              "steps": ("medium_rate_per_s", "high_rate_per_s")}
# an overflowing listen backlog explains the SYN timeouts its clients waited out at that service in its
# window: tcp_stall's findings for them become members of the syn_backlog finding (detectors/population.py)
EXPLAINS = {"syn_backlog": {"service": "resource", "detector": "tcp_stall",
                            "kinds": ("rto", "synack_retransmission"), "member_service": "resource_head"}}
# Without a decoder for the port: TCP request turns, what they count and what the setup is.
TCP_WORDS = ("TCP request turns (no decoder for this port)", "the TCP handshake")


def _setup_protocols():
    """The protocols that declare setup operations (analyzer/decoders/protocol.py): their transactions
    are counted per connection, setup excluded. Read from the registry when called."""
    return tuple(p for p in registry.protocols() if p.setup_operations and p.transactions)


# every frame it reads: TCP's, the tick (resolution_ns), and the transactions of the protocols with
# setup operations (a connection's useful requests), as registered when the detector is imported
REQUIRES = ("connections", "tcp_segments", "interfaces", *(p.transactions for p in _setup_protocols()))
COLUMNS = {"tcp_segments": tcp_turns.SEGMENT_COLUMNS}  # the TCP turns of connections no transaction counts
# its findings are the union of its findings per server partition (base.py; tests/test_partitions.py)
# it reads tcp_segments only of the connections no TCP transaction of these covers (base.py)
UNCOVERED_SEGMENTS = tuple(p.transactions for p in _setup_protocols())
PARTITION = "server"
ORDER = 60  # where it runs and is listed (detectors/__init__.py)


def _protocol_words(counted_by: str | None) -> tuple[str, str]:
    """(what was counted, the set-up in a sentence) for the way a connection's requests were counted."""
    p = next((p for p in _setup_protocols() if p.name == counted_by), None)
    return (f"{p.work_noun} ({p.transactions})", p.setup_words) if p is not None else TCP_WORDS


@dataclass(frozen=True)
class Params:
    min_connections: int = param(10, "new connections from one client to one service before judging",
                                 unit="connections", gate=LOWER, lo=1)
    min_rate_per_s: float = param(0.5, "and at least this many a second (first to last SYN of the episode)",
                                  unit="1/s", gate=LOWER, lo=0.0)
    episode_gap_ns: int = param(10_000_000_000, "SYNs further apart than this start a new episode", unit="ns",
                                lo=1)
    rate_min_span_ns: int = param(1_000_000_000, "rates are measured over at least this long (a shorter burst is "
                                                 "not extrapolated: (n - 1) / max(span, this)), and the rate "
                                                 "severity steps need an episode at least this long",
                                  unit="ns", gate=LOWER, lo=1)
    max_requests_per_connection: float = param(2.0, "median decoded requests per connection at most this",
                                               unit="requests", gate=UPPER, lo=0.0)
    max_turns_per_connection: float = param(4.0, "without a decoder: median TCP request turns (they include "
                                                 "the protocol's own setup and teardown exchanges)",
                                            unit="turns", gate=UPPER, lo=0.0)
    medium_rate_per_s: float = param(10.0, "severity: new connections a second from one client for medium",
                                     unit="1/s", gate=LOWER, lo=0.0)
    high_rate_per_s: float = param(100.0, "... for high", unit="1/s", gate=LOWER, lo=0.0)
    time_wait_ns: int = param(60_000_000_000, "TIME_WAIT length (Linux: 60 s)", unit="ns", lo=0)
    ephemeral_ports: int = param(28_232, "ephemeral ports (Linux ip_local_port_range 32768-60999)",
                                 unit="ports", lo=1, hi=65_535)
    high_time_wait_share: float = param(0.25, "of the ephemeral range held in TIME_WAIT at this rate: high",
                                        unit="share", gate=LOWER, lo=0.0, hi=1.0)
    critical_time_wait_share: float = param(0.75, "... critical", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    one_shot_ports: frozenset = param(frozenset({53, 88, 464}), "connection per request is the protocol's norm "
                                                                "on these server ports: at most low",
                                      unit="ports", lo=0, hi=65_535)
    min_both_directions_share: float = param(0.5, "churn: below this share of a group's connections seen in both "
                                                  "directions (one vantage point), it cannot be judged: "
                                                  "informational", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    min_client_close_share: float = param(0.5, "churn: the client holds TIME_WAIT (its ports counted against "
                                               "ephemeral_ports for the TIME_WAIT severity steps) when it "
                                               "closes first on at least this share of the connections",
                                          unit="share", gate=LOWER, lo=0.0, hi=1.0)
    min_server_close_share: float = param(0.5, "churn: otherwise, the explanation says TIME_WAIT piles up on the "
                                               "server when the server closes first on at least this share "
                                               "(wording only)", unit="share", lo=0.0, hi=1.0)
    min_failed_syns: int = param(5, "syn_backlog: attempts without SYN/ACK (or only after a SYN retry), each "
                                    "near another answered handshake and with backlog_min_open open, before "
                                    "reporting", unit="attempts", gate=LOWER, lo=1)
    backlog_window_ns: int = param(1_000_000_000, "... within this of another successful handshake to the "
                                                  "service; also the half-width of the window the severity "
                                                  "share is measured in", unit="ns", lo=0)
    syn_retry_ns: int = param(900_000_000, "SYN to SYN/ACK this long means the first SYN was not answered",
                              unit="ns", gate=LOWER, lo=1)
    medium_failed_share: float = param(0.05, "severity: affected share of the attempts in the worst window "
                                             "(backlog_window_ns around an affected SYN) for medium", unit="share",
                                       gate=LOWER, lo=0.0, hi=1.0)
    high_failed_share: float = param(0.20, "... for high", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    backlog_min_open: int = param(5, "syn_backlog: established connections to the service still open when a "
                                     "SYN went unanswered (at that SYN; fewer: not counted) before a full "
                                     "listen queue can explain it (a full accept queue holds at least its "
                                     "backlog; 5 is the smallest in common use, Python socketserver's)",
                                  unit="connections",
                                  gate=LOWER, lo=0)


def _requests_per_conn(capture, conns: pl.DataFrame) -> pl.DataFrame:
    """Per candidate connection: useful requests, first useful request and last useful response time,
    and which way it was counted (ldap, smb2 or tcp)."""
    parts = []
    done = pl.DataFrame(schema={"conn": pl.UInt32})
    ids = conns.select(pl.col("conn").cast(pl.UInt32))
    # the setup protocols' transactions it declares (REQUIRES: as registered when it was imported)
    frames = transaction_frames(capture, [p.transactions for p in _setup_protocols() if p.transactions in REQUIRES])
    for declared in _setup_protocols():
        proto = declared.name
        tx = frames.get(declared.transactions)
        if tx is None or "flow" not in tx.columns:
            continue
        tx = tx.filter(pl.col("transport").cast(pl.String) == "tcp").with_columns(
            pl.col("flow").cast(pl.UInt32).alias("conn")).join(ids, on="conn", how="semi")
        if tx.height == 0:
            continue
        useful = ~pl.col("operation").cast(pl.String).is_in(list(declared.setup_operations))
        if declared.work_operations:  # the unit of work when present (SMB2: CREATEs), else all but setup
            work = pl.col("operation").cast(pl.String).is_in(list(declared.work_operations))
            requests = pl.when(work.any()).then(work.sum()).otherwise(useful.sum())
            op = pl.lit(declared.work_operations[0])
        else:
            requests = useful.sum()
            op = pl.col("operation").filter(useful).mode().sort().first()
        per = tx.group_by("conn").agg(
            requests.cast(pl.Float64).alias("requests"),
            pl.col("request_ts_ns").filter(useful).min().alias("work_start"),
            pl.coalesce("response_ts_ns", "request_ts_ns").filter(useful).max().alias("work_end"),
            op.alias("op"),
        )
        per = per.join(done, on="conn", how="anti").with_columns(pl.lit(proto).alias("counted_by"))
        done = pl.concat([done, per.select("conn")])
        parts.append(per)
    rest = ids.join(done, on="conn", how="anti")
    seg = optional_frame(capture, "tcp_segments", nonempty=True)
    if rest.height and seg is not None:
        s = tcp_turns.payload_segments(seg, rest)  # TCP request turns: detectors/tcp_turns.py
        per = s.with_columns(tcp_turns.turn_start()).group_by("conn").agg(
            pl.col("turn").sum().cast(pl.Float64).alias("requests"),
            pl.col("ts_ns").filter(pl.col("from_client")).min().alias("work_start"),
            pl.col("ts_ns").filter(~pl.col("from_client")).max().alias("work_end"),
            pl.lit("request").alias("op"),
        ).with_columns(pl.lit("tcp").alias("counted_by"))
        parts.append(per)
    if not parts:
        return pl.DataFrame(schema={"conn": pl.UInt32, "requests": pl.Float64, "work_start": pl.Int64,
                                    "work_end": pl.Int64, "op": pl.String, "counted_by": pl.String})
    return pl.concat([x.select("conn", "requests", "work_start", "work_end", pl.col("op").cast(pl.String),
                               "counted_by") for x in parts], how="vertical_relaxed")


def _churn(capture, conns: pl.DataFrame, p: Params) -> pl.DataFrame:
    c = conns.filter(pl.col("saw_start")).with_columns(
        pl.col("client").cast(pl.String), pl.col("server").cast(pl.String))
    if c.height == 0:
        return pl.DataFrame()
    # episodes: runs of connections from one client to one service whose SYNs are at most
    # episode_gap_ns apart (a pool with that idle timeout would have kept the connection)
    svc = ["client", "server", "server_port"]
    c = c.sort(*svc, "syn_ts_ns", "conn").with_columns(
        (pl.col("syn_ts_ns") - pl.col("syn_ts_ns").shift(1)).alias("_gap"),
        pl.struct(svc).ne_missing(pl.struct(svc).shift(1)).alias("_new_svc"))
    c = c.with_columns((pl.col("_new_svc") | (pl.col("_gap") > p.episode_gap_ns).fill_null(True))
                       .cum_sum().alias("episode"))
    key = [*svc, "episode"]
    g = c.group_by(key).agg(
        pl.len().alias("n"), pl.col("syn_ts_ns").min().alias("first_syn"), pl.col("syn_ts_ns").max().alias("last_syn"))
    g = g.with_columns(((pl.col("last_syn") - pl.col("first_syn")) / 1e9).alias("span_s"))
    g = g.with_columns(((pl.col("n") - 1) / pl.max_horizontal("span_s", pl.lit(p.rate_min_span_ns / 1e9)))
                       .alias("rate"), (pl.col("span_s") * 1e9 >= p.rate_min_span_ns).alias("sustained"))
    one_shot = pl.col("server_port").is_in(sorted(p.one_shot_ports))
    cand = g.filter((pl.col("n") >= p.min_connections) & (pl.col("rate") >= p.min_rate_per_s)
                    & (~one_shot | (pl.col("rate") >= p.medium_rate_per_s)))
    if cand.height == 0:
        return pl.DataFrame()
    cc = c.join(cand.select(key), on=key, how="semi")
    req = _requests_per_conn(capture, cc)
    hist = pl.col("history")
    f_at, f2_at = hist.str.find("F", literal=True), hist.str.find("f", literal=True)
    client_first = f_at.is_not_null() & (f2_at.is_null() | (f_at < f2_at))
    server_first = f2_at.is_not_null() & (f_at.is_null() | (f2_at < f_at))
    cc = cc.join(req, on="conn", how="left").with_columns(
        client_first.alias("client_closed_first"), server_first.alias("server_closed_first"),
        (pl.col("last_ts_ns") - pl.col("syn_ts_ns")).clip(lower_bound=1).alias("life"),
        ((pl.col("client_packets") > 0) & (pl.col("server_packets") > 0)).alias("both"),
    ).with_columns(
        ((pl.coalesce("work_start", "hs_end") - pl.col("syn_ts_ns")) / pl.col("life")).clip(0, 1).alias("setup_share"),
        ((pl.col("last_ts_ns") - pl.coalesce("work_end", "last_ts_ns")) / pl.col("life")).clip(0, 1)
        .alias("teardown_share"),
    )
    # overlap: connections open while an earlier one of the group was still open
    cc = cc.sort(*key, "syn_ts_ns", "conn").with_columns(
        (pl.col("syn_ts_ns") < pl.col("last_ts_ns").cum_max().shift(1).over(key)).fill_null(False).alias("overlaps"))
    # 4-tuple reuse: the same client port again, and how soon
    cc = cc.sort(*key, "client_port", "syn_ts_ns", "conn").with_columns(
        (pl.col("syn_ts_ns") - pl.col("last_ts_ns").shift(1).over(*svc, "client_port")).alias("port_reuse_gap"))
    agg = cc.group_by(key).agg(
        pl.len().alias("n"), pl.col("syn_ts_ns").min().alias("start_ns"), pl.col("last_ts_ns").max().alias("end_ns"),
        pl.col("syn_ts_ns").max().alias("last_syn"),
        pl.col("requests").median().alias("req_median"), pl.col("requests").sum().alias("req_total"),
        pl.col("counted_by").drop_nulls().mode().sort().first().alias("counted_by"),
        pl.col("op").drop_nulls().mode().sort().first().alias("op"),
        pl.col("setup_share").median(), pl.col("teardown_share").median(),
        pl.col("life").median().alias("life_median"),
        pl.col("client_closed_first").mean().alias("client_close_share"),
        pl.col("server_closed_first").mean().alias("server_close_share"),
        pl.col("overlaps").sum().alias("overlapping"),
        pl.col("reused_ports").sum().alias("reused"),
        pl.col("port_reuse_gap").min().alias("min_reuse_gap"),
        pl.col("client_port").n_unique().alias("ports"),
        pl.col("both").mean().alias("both_share"),
        pl.col("first_frame").sort().alias("evidence_frames"),
    ).join(cand.select(*key, "rate", "span_s", "sustained"), on=key)
    limit = pl.when(pl.col("counted_by") == "tcp").then(pl.lit(p.max_turns_per_connection)) \
        .otherwise(pl.lit(p.max_requests_per_connection))
    agg = agg.filter(pl.col("req_median").is_null() | (pl.col("req_median") <= limit))
    # the service as a whole over each episode: new connections a second and from how many clients
    win = agg.select(*key, pl.col("start_ns").alias("_a"), pl.col("last_syn").alias("_b"))
    svc_load = c.select(*svc, "syn_ts_ns", pl.col("client").alias("_who")).drop("client").join(
        win.rename({"client": "_for"}), on=["server", "server_port"]).filter(
        pl.col("syn_ts_ns").is_between(pl.col("_a"), pl.col("_b"))).group_by("_for", "server", "server_port",
                                                                          "episode").agg(
        pl.len().alias("svc_n"), pl.col("_who").n_unique().alias("svc_clients"),
        ((pl.col("_b").first() - pl.col("_a").first()) / 1e9).alias("_span")).rename({"_for": "client"})
    agg = agg.join(svc_load, on=key, how="left").with_columns(
        ((pl.col("svc_n") - 1) / pl.max_horizontal("_span", pl.lit(p.rate_min_span_ns / 1e9))).alias("svc_rate")
    ).drop("_span")
    return agg


def _churn_severity(p: Params) -> pl.Expr:
    rate, tw = pl.col("rate"), pl.col("tw_share")
    reuse_fast = (pl.col("min_reuse_gap") < p.time_wait_ns).fill_null(False)
    sustained = pl.col("sustained")  # an isolated burst shorter than rate_min_span has no rate to step on
    base = (pl.when(tw >= p.critical_time_wait_share).then(pl.lit("critical"))
            .when((sustained & (rate >= p.high_rate_per_s)) | (tw >= p.high_time_wait_share) | reuse_fast)
            .then(pl.lit("high"))
            .when(sustained & (rate >= p.medium_rate_per_s)).then(pl.lit("medium"))
            .otherwise(pl.lit("low")))
    one_shot = pl.col("server_port").is_in(sorted(p.one_shot_ports))
    return (pl.when(pl.col("both_share") < p.min_both_directions_share).then(pl.lit("informational"))
            .when(one_shot & base.is_in(["medium", "high", "critical"])).then(pl.lit("low"))
            .otherwise(base))


def _churn_findings(agg: pl.DataFrame, p: Params, res: float) -> pl.DataFrame:
    # ports in TIME_WAIT at once: the rate over one TIME_WAIT, but never more than the connections seen
    agg = agg.with_columns(
        pl.min_horizontal(pl.col("rate") * (p.time_wait_ns / 1e9), pl.col("n").cast(pl.Float64),
                          pl.lit(float(p.ephemeral_ports))).alias("tw_ports"))
    agg = agg.with_columns(
        pl.when(pl.col("client_close_share") >= p.min_client_close_share).then(pl.col("tw_ports") / p.ephemeral_ports)
        .otherwise(0.0).alias("tw_share"))
    agg = agg.with_columns(_churn_severity(p).alias("severity"))
    texts = []
    one_shot = set(sorted(p.one_shot_ports))
    for r in agg.iter_rows(named=True):
        counted, setup_word = _protocol_words(r["counted_by"])
        declared = protocol_declaration(r["counted_by"] or "tcp")
        words = declared.operation_words if declared is not None else {}
        op = words.get(r["op"] or "", (r["op"] or "request").replace("Request", ""))
        span = fmt_ns(max(r["span_s"] * 1e9, res))
        req = r["req_median"]
        if req is None:
            each = "requests per connection unknown"
        else:
            plural = "" if req == 1 else ("es" if op.endswith("h") else "s")
            each = f"each carrying {req:.0f} {op}{plural} (median, counted as {counted})"
        rate = (f"{r['rate']:.1f}/s" if r["sustained"] else
                f"an isolated burst: {r['rate']:.1f}/s over the {fmt_ns(p.rate_min_span_ns)} a rate is measured "
                f"over, so no rate step applies")
        t = (f"{r['n']} connections from {r['client']} to {endpoint(r['server'], r['server_port'])} in {span} "
             f"({rate}), {each}")
        if r["setup_share"] is not None:
            t += (f": {r['setup_share']:.0%} of each connection's life is handshake"
                  + (f" and {setup_word}" if (r["counted_by"] or "tcp") != "tcp" else ""))
            if r["teardown_share"] is not None:
                t += f", {r['teardown_share']:.0%} teardown"
        if (r["client_close_share"] or 0) >= p.min_client_close_share:
            t += (f"; the client closes first, so at this rate about {r['tw_ports']:,.0f} of its "
                  f"{p.ephemeral_ports:,} ephemeral ports sit in TIME_WAIT ({r['tw_share']:.0%}"
                  + (", at most the connections seen" if r["tw_ports"] >= r["n"] else "") + ")")
        elif (r["server_close_share"] or 0) >= p.min_server_close_share:
            t += "; the server closes first, so TIME_WAIT piles up on the server"
        if r["reused"]:
            t += (f"; {r['reused']} 4-tuples were reused"
                  + (f", the soonest after {fmt_ns(r['min_reuse_gap'])} (inside TIME_WAIT)"
                     if r["min_reuse_gap"] is not None and r["min_reuse_gap"] < p.time_wait_ns else ""))
        if r["overlapping"]:
            t += (f"; {r['overlapping']} opened while an earlier one was still open (several processes behind "
                  f"one address each connecting per request look the same)")
        if r["svc_clients"] and r["svc_clients"] > 1:
            t += (f"; the service saw {r['svc_rate']:.1f} new connections/s from {r['svc_clients']} clients in "
                  f"that time")
        if r["server_port"] in one_shot:
            t += "; a connection per request is this protocol's norm, so at most low"
        if (r["both_share"] or 0) < p.min_both_directions_share:
            t += "; most connections were seen in one direction only, so this cannot be judged (informational)"
        t += "; reuse one connection (a pool) instead of connecting per request."
        texts.append(t)
    return agg.select(
        pl.lit("churn").alias("kind"), "severity", pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64),
        "client", "server",
        endpoint_expr(pl.col("server"), pl.col("server_port")).alias("resource"),
        pl.lit(1, pl.UInt32).alias("clients"), pl.lit("address").alias("client_identity"),
        pl.lit("connections_per_s").alias("metric"), pl.col("rate").alias("value"),
        pl.lit(p.medium_rate_per_s).alias("threshold"), pl.lit("1/s").alias("unit"),
        "evidence_frames",
    ).with_columns(pl.Series("explanation", texts, dtype=pl.String))


def _below(points: pl.DataFrame, at: pl.DataFrame, key: list[str], times: np.ndarray, side: str) -> np.ndarray:
    """For each row of ``at`` and its time in ``times``: how many of ``points``' times (column ``t``) at
    the same service (``key``) are at most it (``side="right"``) or before it (``"left"``). One sort and
    one search for every service at once: each time is replaced by its rank among all the times, and
    the service's number is put in front of it."""
    if at.height == 0:
        return np.zeros(0, np.int64)
    pts = points.filter(pl.col("t").is_not_null())
    svc = pl.concat([pts.select(key), at.select(key)]).unique().with_row_index("_svc")
    p_svc = pts.select(key).join(svc, on=key, how="left", maintain_order="left")["_svc"].to_numpy().astype(np.int64)
    q_svc = at.select(key).join(svc, on=key, how="left", maintain_order="left")["_svc"].to_numpy().astype(np.int64)
    ranks = np.unique(np.concatenate([pts["t"].to_numpy().astype(np.int64), times.astype(np.int64)]),
                      return_inverse=True)[1].reshape(-1)
    m = int(ranks.max(initial=0)) + 1
    p_keys = np.sort(p_svc * m + ranks[:pts.height])
    return (np.searchsorted(p_keys, q_svc * m + ranks[pts.height:], side=side)
            - np.searchsorted(p_keys, q_svc * m, side="left"))


def _within(points: pl.DataFrame, at: pl.DataFrame, key: list[str], times: np.ndarray, w: int) -> np.ndarray:
    """How many of ``points``' times at each row's service lie within ``w`` of its time (both ends in);
    the ends saturate at the int64 range (a hostile capture's timestamps, a huge window)."""
    i64 = np.iinfo(np.int64)
    w = min(int(w), i64.max)
    return (_below(points, at, key, np.minimum(times, i64.max - w) + w, "right")
            - _below(points, at, key, np.maximum(times, i64.min + w) - w, "left"))


def _backlog(conns: pl.DataFrame, p: Params, res: float) -> pl.DataFrame:
    """The syn_backlog findings (the module docstring says what counts and why each gate keeps its
    direction: every set below only grows as ``syn_retry_ns`` or ``backlog_min_open`` is lowered)."""
    c = conns.filter(pl.col("saw_syn") & pl.col("syn_ts_ns").is_not_null() & pl.col("server").is_not_null()
                     & pl.col("server_port").is_not_null()).with_columns(
        pl.col("server").cast(pl.String), pl.col("client").cast(pl.String))
    if c.height == 0:
        return pl.DataFrame()
    failed = (((pl.col("conn_state") == "S0") & (pl.col("client_packets") >= 2))
              | pl.col("conn_state").is_in(["REJ", "RSTOS0"]))
    retried = pl.col("saw_synack") & (pl.col("rtt_client_server_ns") >= p.syn_retry_ns)
    c = c.with_columns(failed.fill_null(False).alias("failed"), retried.fill_null(False).alias("retried"))
    key, w = ["server", "server_port"], p.backlog_window_ns
    bad = c.filter(pl.col("failed") | pl.col("retried"))
    if bad.height == 0:
        return pl.DataFrame()
    answered = c.filter(pl.col("saw_synack") & pl.col("synack_ts_ns").is_not_null())
    syn = bad["syn_ts_ns"].to_numpy()
    # other handshakes to the service answered within the window (under load, not a closed port); the
    # attempt's own late SYN/ACK is not one of them. Any other answered handshake counts, retried or not,
    # so that this does not change with syn_retry_ns.
    own = bad.select((pl.col("saw_synack") & ((pl.col("synack_ts_ns") - pl.col("syn_ts_ns")).abs() <= w))
                     .fill_null(False))
    others = (_within(answered.select(*key, pl.col("synack_ts_ns").alias("t")), bad, key, syn, w)
              - own.to_series().cast(pl.Int64).to_numpy())
    # established connections (handshake answered, not yet ended) open when the SYN was sent
    open_at = (_below(answered.select(*key, pl.col("synack_ts_ns").alias("t")), bad, key, syn, "right")
               - _below(answered.select(*key, pl.col("last_ts_ns").alias("t")), bad, key, syn, "left"))
    aff = bad.with_columns(pl.Series("_others", others), pl.Series("open_at", open_at)).filter(
        (pl.col("_others") > 0) & (pl.col("open_at") >= p.backlog_min_open))
    g = aff.group_by(key).agg(
        pl.len().alias("affected"), pl.col("failed").sum().alias("n_failed"),
        pl.col("retried").sum().alias("n_retried"),
        pl.col("syn_ts_ns").min().alias("start_ns"), pl.col("syn_ts_ns").max().alias("end_ns"),
        pl.col("client").n_unique().alias("clients"), pl.col("first_frame").sort().alias("evidence_frames"),
        pl.col("open_at").median().alias("open_median"),
    ).filter(pl.col("affected") >= p.min_failed_syns)
    if g.height == 0:
        return pl.DataFrame()
    aff = aff.join(g.select(key), on=key, how="semi")
    s = aff["syn_ts_ns"].to_numpy()
    # the worst window: around each affected SYN, the affected share of all the service's attempts
    # within backlog_window_ns (those attempts do not depend on the parameters, so a share only grows)
    peak = aff.with_columns(
        pl.Series("_aff", _within(aff.select(*key, pl.col("syn_ts_ns").alias("t")), aff, key, s, w)),
        pl.Series("_att", _within(c.select(*key, pl.col("syn_ts_ns").alias("t")), aff, key, s, w)),
    ).with_columns((pl.col("_aff") / pl.col("_att")).alias("share")).sort(
        *key, "share", "_att", "syn_ts_ns", descending=[False, False, True, True, False]).group_by(
        key, maintain_order=True).first().select(*key, "share", "_aff", "_att", pl.col("syn_ts_ns").alias("_at"))
    attempts = c.join(g.select(*key, "start_ns", "end_ns"), on=key).filter(
        pl.col("syn_ts_ns").is_between(pl.col("start_ns") - w, pl.col("end_ns") + w)
    ).group_by(key).agg(pl.len().alias("attempts"))
    g = g.join(attempts, on=key, how="left").join(peak, on=key, how="left")
    g = g.with_columns(
        pl.when(pl.col("share") >= p.high_failed_share).then(pl.lit("high"))
        .when(pl.col("share") >= p.medium_failed_share).then(pl.lit("medium"))
        .otherwise(pl.lit("low")).alias("severity"))
    texts = []
    for r in g.iter_rows(named=True):
        span = fmt_ns(max(r["end_ns"] - r["start_ns"], res))
        worst = ("" if (r["_aff"], r["_att"]) == (r["affected"], r["attempts"]) else
                 f"; at worst {r['_aff']} of the {r['_att']} attempts within {fmt_ns(w)} of one of them "
                 f"({r['share']:.0%})")
        texts.append(
            f"{r['affected']} of {r['attempts']} connection attempts to {endpoint(r['server'], r['server_port'])} "
            f"from {r['clients']} client{'s' if r['clients'] != 1 else ''} within {span} got no SYN/ACK "
            f"({r['n_failed']} never answered or reset, {r['n_retried']} answered only after a SYN retry) while "
            f"other handshakes to it succeeded and at least {p.backlog_min_open:,} established connections to "
            f"it were open ({r['open_median']:,.0f}, median at those SYNs){worst}: the listen backlog is "
            f"overflowing under a burst of new connections (raise the backlog / somaxconn, or stop connecting "
            f"per request).")
    return g.select(
        pl.lit("syn_backlog").alias("kind"), "severity", pl.col("start_ns").cast(pl.Int64),
        pl.col("end_ns").cast(pl.Int64), pl.lit(None, pl.String).alias("client"), "server",
        endpoint_expr(pl.col("server"), pl.col("server_port")).alias("resource"),
        pl.col("clients").cast(pl.UInt32), pl.lit("address").alias("client_identity"),
        pl.lit("unanswered_syn_share").alias("metric"), pl.col("share").alias("value"),
        pl.lit(p.medium_failed_share).alias("threshold"), pl.lit("fraction").alias("unit"),
        "evidence_frames",
    ).with_columns(pl.Series("explanation", texts, dtype=pl.String))


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    p = params
    conns = optional_frame(capture, "connections", nonempty=True)
    if conns is None:
        return empty_findings()
    res = resolution_ns(capture)
    conns = conns.with_columns(
        (pl.col("syn_ts_ns") + pl.col("handshake_rtt_ns")).alias("hs_end"))
    parts = []
    agg = _churn(capture, conns, p)
    if agg.height:
        parts.append(_churn_findings(agg, p, res))
    bl = _backlog(conns, p, res)
    if bl.height:
        parts.append(bl)
    if not parts:
        return empty_findings()
    rows = pl.concat(parts, how="diagonal_relaxed").with_columns(
        pl.col("evidence_frames").cast(pl.List(pl.UInt32)))
    return findings(rows, detector=NAME, params=p)
