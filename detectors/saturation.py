"""Server saturation: latency grows with concurrency while completions/s plateau (the knee), or fall (collapse).

The pathology
    A server (or one lock inside it: MDB's single writer, a small worker pool, a KDC's database) can
    complete only so many requests a second. Below that capacity, more offered load means more
    completions at the same latency. Past it, every added request only waits: the queue grows, the
    latency grows with the number of requests outstanding while completions/s stay flat (the knee of
    the throughput curve). When timeouts and retries add load faster than the server completes it,
    throughput can even fall while the offered load keeps rising: the metastable failure of Bronson
    et al. (HotOS 2021), where the retries sustain the overload after its trigger is gone.

The signal, per service and operation (protocol, server, server port, operation)
    Requests are every protocol's transactions (``base.transaction_frames``: DNS, Kerberos, LDAP, SMB2,
    and any protocol registered later), leaving out those that expect no response and SMB2's
    by-design long waits (``pending_by_design``: CHANGE_NOTIFY, blocking locks); on TCP connections no
    decoder covers, the request/response turns of detectors/tcp_turns.py (operation "turn").
    Over windows of ``window_ns`` sliding by ``window_ns / window_overlap``:
    - concurrency L: the time average of the requests outstanding (started, not yet answered; an
      unanswered one counts for ``unanswered_ns``), integrated exactly from the requests' intervals;
    - completions/s X (answers in the window) and offered load (requests sent in the window, retries
      included);
    - latency W: the median latency of the requests sent in the window. Little's law L = X W is
      checked on every window (the ratio of L to X times the mean latency) and reported.
    Windows with fewer than ``min_completions_per_window`` answers, or requests sent, are too thin to
    read (so are the windows after the clients stopped, where only the queue drains).
    The capacity is the ``cap_quantile`` quantile of X; the **knee** is the lowest concurrency of a
    window reaching ``knee_share`` of it. **Past the knee** are the windows with at least
    ``concurrency_growth`` times the knee's concurrency, the others are the baseline (their median
    latency W0); past the knee means more requests outstanding than the server
    needed to reach its capacity. A healthy ramp has (almost) none: its completions/s grow with the
    offered load, so its highest-concurrency windows are its highest-throughput ones and their
    latency is the baseline's. The latency factor is the past windows' median latency over W0; the
    explanation says how many of them kept ``plateau_share`` of the capacity (the plateau).
    **Collapse**: the past windows' median completions/s at ``collapse_share`` of the capacity or less,
    and ``min_collapse_windows`` of them that low, while still answering: more outstanding,
    fewer completed ("lock held 100 us: queue buildup, throughput worse"; the metastable failure when
    retries keep the load up). A window with no answers at all (a stall of the path) is not read.
    **Retries**: the share of the offered load past the knee that was retries (``retries`` on DNS
    transactions, ``retransmission`` on Kerberos ones, TCP retransmissions in a turn), against the
    baseline's. **SMB2 credits** (MS-SMB2 3.3.1.2): credits granted against credits requested in
    ``smb2_messages`` past the knee and before it (a server throttling its clients grants fewer).
    **NFSv4.1 slots** (RFC 8881 §2.10.6.1 the slot table, §18.46.3 sr_highest_slotid /
    sr_target_highest_slotid; detectors/saturation_slots.py): from ``nfs_messages``' SEQUENCE rows, per
    session past the knee the slots in use at once against those the server accepts, and the share of
    the time they were all busy: either the slot tables were exhausted (what reached the server was
    capped at sessions x slots, the clients' further requests waited unseen on their side; a lowered
    target is the server throttling through them) or they were never the limit (at most M of N in use:
    the server's own capacity was).

Severity rule
    A finding needs ``min_requests`` requests, ``min_baseline_windows`` baseline and
    ``min_saturated_windows`` past-the-knee windows, at least ``min_knee_concurrency`` requests outstanding
    at the knee (a server at its capacity is busy: below half a worker's time the highest throughput
    seen is no capacity, and latency that grew then has another cause: a slow upstream, lost replies),
    a median concurrency past the knee of
    ``min_concurrency`` or more (fewer than that many outstanding requests do not queue) and a latency
    factor of ``min_latency_factor``: low; medium at ``medium_latency_factor``, high at
    ``high_latency_factor``. A collapse (``min_collapse_windows`` collapsed windows: kind ``collapse``)
    is at least high. Retries amplifying it (their share past the knee at least ``min_retry_share`` and
    above the baseline's) raise it one step. Capped at low when the concurrency past the knee comes
    from fewer than ``min_clients`` clients, or one client holds ``max_client_share`` of the
    outstanding time (``base.client_identity_by`` per service tells clients apart).

Known false positives, and how they are handled
    - A server slow at low load too: high latency with no relation to concurrency is flat latency,
      factor near 1: not reported.
    - A client-side limit (one client pipelining, or a client that reads its answers slowly): the
      concurrency is one client's: capped at low by the client rules above.
    - A batch job bursting at a server that is otherwise idle: without low-load windows there is no
      baseline (nothing reported); with them, it is real queueing but often one client (low).
    - A path that stalls (TCP RTO, a lost reply) or a slow upstream raises latency and concurrency at a
      server that was nearly idle: its knee has fewer than ``min_knee_concurrency`` outstanding (the
      highest throughput seen was no capacity), so nothing is reported (tcp_stall, retry_storm report
      them); windows without answers are not read at all.
    - Long-poll operations (LDAP persistent search, SMB2 CHANGE_NOTIFY) are outstanding by design:
      SMB2's are left out; an LDAP persistent search is one request and rarely reaches the gates.
    A capture of one direction has no answers: nothing to measure, nothing reported.

References: Little, "A proof for the queuing formula L = lambda W" (1961); Bronson, Aghayev, Charapko,
Zhu, "Metastable failures in distributed systems" (HotOS 2021); MS-SMB2 3.3.1.2 (credits); RFC 1035,
RFC 4120, RFC 4511, RFC 8881 (the transactions).
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from . import saturation_slots, tcp_turns
from . import saturation_windows as sw
from .base import (at_least_resolution, empty_findings, findings, fmt_ns, fmt_number, protocol_declaration,
                   transaction_frames, TRANSACTION_FRAMES)
from .params import LOWER, UPPER, param

NAME = "saturation"
KINDS = ("saturation", "collapse")
REQUIRES = (*TRANSACTION_FRAMES, "smb2_messages", "nfs_messages", "connections", "tcp_segments", "interfaces")
# what it reads of them (base.py): the TCP turns of connections no transaction covers, the SMB2 credits
# (saturation_windows.smb2_credits) and the NFSv4.1 SEQUENCE slots (saturation_slots.sequence_calls)
COLUMNS = {"tcp_segments": tcp_turns.SEGMENT_COLUMNS, "smb2_messages": sw.SMB2_CREDIT_COLUMNS,
           "nfs_messages": saturation_slots.SEQUENCE_COLUMNS}
# its findings are the union of its findings per server partition (base.py; tests/test_partitions.py)
# it reads tcp_segments only of the connections no TCP transaction of these covers (base.py)
UNCOVERED_SEGMENTS = TRANSACTION_FRAMES
PARTITION = "server"
ORDER = 35


@dataclass(frozen=True)
class Params:
    window_ns: int = param(500_000_000, "window over which concurrency, completions/s and latency are measured",
                           unit="ns", lo=1)
    window_overlap: int = param(2, "windows slide by window_ns / this (1: back to back)", unit="windows", lo=1,
                                hi=8)
    unanswered_ns: int = param(5_000_000_000, "an unanswered request counts as outstanding for this long",
                               unit="ns", lo=0)
    min_completions_per_window: int = param(10, "a window needs this many answers, and requests sent, to be read "
                                                "(shape: which windows count)", unit="requests", lo=1)
    cap_quantile: float = param(0.9, "the capacity: this quantile of the windows' completions/s", unit="quantile",
                                lo=0.5, hi=1.0)
    knee_share: float = param(0.8, "the knee: the lowest concurrency of a window reaching this share of the "
                                   "capacity", unit="share", lo=0.1, hi=1.0)
    concurrency_growth: float = param(2.0, "past the knee: windows with this many times the knee's concurrency",
                                      unit="factor", lo=1.0)
    plateau_share: float = param(0.8, "wording: past windows whose completions/s stay at this share of the "
                                      "capacity or more are the plateau", unit="share", lo=0.0, hi=1.0)
    collapse_share: float = param(0.6, "collapse: past the knee, median completions/s at most this share of "
                                       "the capacity (kind)",
                                  unit="share", lo=0.0, hi=1.0)
    min_collapse_windows: int = param(2, "... and at least this many past windows that low (kind)",
                                      unit="windows", lo=1)
    min_requests: int = param(200, "requests to the service and operation before judging", unit="requests",
                              gate=LOWER, lo=1)
    min_baseline_windows: int = param(2, "windows below concurrency_growth times the knee's concurrency (the "
                                         "baseline latency)",
                                      unit="windows", gate=LOWER, lo=1)
    min_saturated_windows: int = param(3, "windows past the knee", unit="windows", gate=LOWER, lo=1)
    min_knee_concurrency: float = param(0.5, "requests outstanding at the knee: a server at its capacity is busy "
                                             "(a single worker at half its time or more); below this the highest "
                                             "throughput seen is not a capacity (an idle server whose latency grew "
                                             "for another reason: a slow upstream, a lost reply)",
                                        unit="requests", gate=LOWER, lo=0.0)
    min_concurrency: float = param(2.0, "median requests outstanding past the knee (fewer do not queue)",
                                   unit="requests", gate=LOWER, lo=0.0)
    min_latency_factor: float = param(2.0, "median latency past the knee over the baseline's: low",
                                      unit="factor", gate=LOWER, lo=1.0)
    medium_latency_factor: float = param(3.0, "... medium", unit="factor", gate=LOWER, lo=1.0)
    high_latency_factor: float = param(10.0, "... high", unit="factor", gate=LOWER, lo=1.0)
    min_retry_share: float = param(0.1, "retries amplified it: their share of the offered load past the knee "
                                        "at least this (and above the baseline's): one step up",
                                   unit="share", gate=LOWER, lo=0.0, hi=1.0)
    min_clients: int = param(2, "clients with requests past the knee; fewer: at most low (a client-side "
                                "limit)", unit="clients", gate=LOWER, lo=1)
    slot_full_share: float = param(0.5, "wording (NFSv4.1): a session is slot-bound past the knee when all the slots "
                                        "the server accepts were busy for this share of the period or more",
                                   unit="share", lo=0.0, hi=1.0)
    slot_bound_sessions_share: float = param(0.5, "wording (NFSv4.1): the slot tables were exhausted when at least "
                                                  "this share of the sessions were slot-bound", unit="share", lo=0.0,
                                             hi=1.0)
    max_client_share: float = param(0.8, "one client's share of the outstanding time past the knee at this or "
                                         "more: at most low", unit="share", gate=UPPER, lo=0.0, hi=1.0)


def _severity(p: Params) -> pl.Expr:
    f = pl.col("factor")
    rank = (pl.when(f >= p.high_latency_factor).then(3).when(f >= p.medium_latency_factor).then(2).otherwise(1))
    rank = pl.when(pl.col("collapsed")).then(pl.max_horizontal(rank, pl.lit(3))).otherwise(rank)
    amplified = (pl.col("retry_share") >= p.min_retry_share) & (pl.col("retry_share") > pl.col("retry_share_base"))
    rank = pl.when(amplified.fill_null(False)).then(pl.min_horizontal(rank + 1, pl.lit(4))).otherwise(rank)
    one = (pl.col("clients") < p.min_clients) | (pl.col("top_client_share") >= p.max_client_share)
    rank = pl.when(one.fill_null(False)).then(pl.min_horizontal(rank, pl.lit(1))).otherwise(rank)
    return (pl.when(rank >= 4).then(pl.lit("critical")).when(rank == 3).then(pl.lit("high"))
            .when(rank == 2).then(pl.lit("medium")).otherwise(pl.lit("low")))


def _explain(r: dict, p: Params, window: int, limited: bool) -> str:
    declared = protocol_declaration(r["protocol"])
    title = declared.title if declared is not None else "TCP"
    op = "request/response turns (no decoder for this port)" if r["protocol"] == "tcp" else f"{r['operation']} requests"
    t = (f"{r['requests']:,} {op} to {r['resource'].split(' ')[0]} ({title}): completions/s reach "
         f"{fmt_number(r['capacity'])}/s (capacity, {p.cap_quantile:.0%} quantile of {fmt_ns(window)} windows) at a "
         f"concurrency of {fmt_number(r['knee_l'])} outstanding (the knee); past it ({r['n_past']} windows, "
         f"{fmt_number(r['past_l'])} outstanding median, up to {fmt_number(r['max_l'])}) they "
         + ("stay at" if r["past_x"] >= p.plateau_share * r["capacity"] else "fall to")
         + f" {fmt_number(r['past_x'])}/s (median; {r['n_plateau']} of the windows at {p.plateau_share:.0%} of the "
         f"capacity or more) while the median latency grows from {fmt_ns(r['base_w'])} to "
         f"{fmt_ns(r['past_w'])} ({r['factor']:.1f}x): the requests queue at the server")
    if r["little"] is not None:
        t += f" (Little's law L = X W holds within {abs(r['little'] - 1):.1%} on these windows)"
    if r["collapsed"]:
        t += (f"; it collapses: {r['n_collapse']} windows with more outstanding complete only "
              f"{fmt_number(r['min_x'])}/s ({r['min_x'] / r['capacity']:.0%} of the capacity) while requests still "
              f"arrive at {fmt_number(r['collapse_offered'])}/s (more load, less work done: contention, or the "
              f"metastable failure where retries keep the load up)")
    if r["retry_share"] is not None and r["retry_share"] > 0:
        amp = r["retry_share"] >= p.min_retry_share and r["retry_share"] > (r["retry_share_base"] or 0)
        t += (f"; retries are {r['retry_share']:.0%} of the offered load past the knee "
              f"({(r['retry_share_base'] or 0):.0%} before)" + (", amplifying it" if amp else ""))
    if r.get("credit_text"):
        t += "; " + r["credit_text"]
    if r.get("slot_text"):
        t += "; " + r["slot_text"]
    t += f"; {r['clients']} client{'s' if r['clients'] != 1 else ''} ({r['client_identity']})"
    if r["clients"] < p.min_clients or (r["top_client_share"] or 0) >= p.max_client_share:
        t += (f", one of them holding {r['top_client_share']:.0%} of the outstanding time: a client-side limit "
              "(one client pipelining, a batch job) looks the same, so at most low")
    if limited:
        t += f"; windows widened to the capture's timestamp resolution ({fmt_ns(window)})"
    return t + "."


def windows_of(capture, resource: str, params: Params = Params()) -> pl.DataFrame:
    """The windows of one finding's service and operation (its ``resource``) with the detector's
    decisions (``saturation_windows.classify``: valid, capacity, knee_l, base, past, plateau, collapse): what
    the proof chart draws."""
    window, _ = at_least_resolution(params.window_ns, capture)
    req = sw.requests(capture, transaction_frames(capture), params).filter(pl.col("resource") == resource)
    if req.height == 0:
        return pl.DataFrame()
    req = req.with_columns(pl.lit(0, pl.Int64).alias("g"))
    return sw.classify(sw.windows(req, window, params), params)


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    p = params
    window, limited = at_least_resolution(p.window_ns, capture)
    req = sw.requests(capture, transaction_frames(capture), p)
    if req.height == 0:
        return empty_findings()
    # the groups (service and operation) with min_requests, numbered ``g`` in the order of their KEY values:
    # counted by the hash of KEY (integers: grouping and joining on the strings costs more), the few distinct
    # KEYs ranked, the ranks mapped back
    key_hash = req.select(pl.struct(sw.KEY).hash().alias("_h"))["_h"]
    counts = key_hash.value_counts(name="requests").filter(pl.col("requests") >= p.min_requests)
    if counts.height == 0:
        return empty_findings()
    kept = key_hash.is_in(counts["_h"].implode())
    req, key_hash = req.filter(kept), key_hash.filter(kept)
    ranks = req.select(key_hash, *sw.KEY).unique("_h").select(
        "_h", (pl.struct(sw.KEY).rank("dense").cast(pl.Int64) - 1).alias("g"))
    req = req.with_columns(key_hash.replace_strict(ranks["_h"], ranks["g"]).alias("g"))
    counts = req.group_by("g").agg(pl.len().alias("requests"))
    win = sw.windows(req, window, p)
    qualifies = ((pl.col("n_base") >= p.min_baseline_windows) & (pl.col("n_past") >= p.min_saturated_windows)
                 & (pl.col("past_l") >= p.min_concurrency) & (pl.col("knee_l") >= p.min_knee_concurrency)
                 & (pl.col("factor") >= p.min_latency_factor))
    summ = sw.knees(win, req, p, qualifies)
    if summ.height == 0:
        return empty_findings()
    summ = summ.join(counts, on="g")
    summ = sw.clients_past(summ, req, p)
    summ = sw.smb2_credits(capture, summ)
    summ = saturation_slots.slot_use(capture, summ, p)
    summ = summ.with_columns(
        ((pl.col("n_collapse") >= p.min_collapse_windows) & (pl.col("past_x") <= p.collapse_share * pl.col("capacity")))
        .alias("collapsed")).with_columns(
        _severity(p).alias("severity"))
    texts = [_explain(r, p, window, limited) for r in summ.iter_rows(named=True)]
    rows = summ.select(
        pl.when(pl.col("collapsed")).then(pl.lit("collapse")).otherwise(pl.lit("saturation")).alias("kind"),
        "severity", pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64),
        pl.lit(None, pl.String).alias("client"), pl.col("server").cast(pl.String), "resource",
        pl.col("clients").cast(pl.UInt32), "client_identity",
        pl.lit("latency_factor").alias("metric"), pl.col("factor").alias("value"),
        pl.lit(p.medium_latency_factor).alias("threshold"), pl.lit("x").alias("unit"),
        pl.col("evidence_frames").cast(pl.List(pl.UInt32)),
    ).with_columns(pl.Series("explanation", texts, dtype=pl.String))
    return findings(rows, detector=NAME, params=p)
