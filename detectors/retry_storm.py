"""Retry storm: clients repeating the same request without an answer, or after an error.

**Pathology.** A server slows down or stops answering; every client resends on its own timer, each
resend adds load, and when the server comes back it meets the backlog of every retry (dnsmasq even
forwards each one upstream). Without exponential backoff (RFC 8085 §3.1.3, RFC 6298 §5.5) and
without jitter, the retries of many clients keep the server down, and clients that time out together
retry in phase (synchronised waves).

**Signal.** Every *send* of a request: the first send of every transaction (every protocol's
transaction frame: DNS, Kerberos, LDAP, SMB2, NFS/ONC-RPC ...), each resend a protocol folds into its
transaction and declares (``Protocol.resends`` in analyzer/decoders/protocol.py: DNS queries re-sent
with their id and question, ``dns_messages``; RPC calls re-sent with their xid, ``nfs_messages``, RFC
5531 §9), and TCP SYNs (``tcp_client_syns`` + ``connections``: retransmitted SYNs and new connection
attempts). Sends of one client to one server for the same request are a *retry* of the send
before when that one came at most ``max_gap_ns`` earlier and either had been answered with an
error by then (SERVFAIL, a KRB-ERROR that ended the login, an LDAP error, STATUS_SHARING_VIOLATION,
an NFS error, a RST to a SYN) or had no answer yet — for requests with a new id over TCP only when the
resend uses another connection: on one connection TCP does the retransmitting, and a second request
sent before the first is answered is a pipelined twin, not a retry. A resend its protocol recognises
by its id is the application retrying on any connection (TCP's own retransmissions never reach the
message layer; Linux re-sends an RPC with its xid after ``timeo``, on the same connection or after a
reconnect, nfs(5)) and whatever the gap (the decoder's pairing window bounds it: 60 s and more for
NFS over TCP). "The same request" is operation + resource (DNS name and type, Kerberos principal,
LDAP DN, SMB2 path, NFS path or handle; server port for SYNs) plus the fields that tell requests apart
beyond them (LDAP filter, scope, attributes and OID, Kerberos cname, SMB2 info class, offset, create
disposition and file id, NFS offset and length). A request with its retries is a *chain*.
**Lock polling is not a retry storm:** asks answered with one of their protocol's ``poll_answers``
(``Protocol.poll_answers``: NFSv4 LOCK answered NFS4ERR_DENIED, RFC 7530 §16.10.4; NLM LOCK without
block answered NLM4_DENIED) are a client polling a lock another owner holds, reported by the
``lock_polling`` detector; they are left out here.
Kerberos' PREAUTH_REQUIRED -> AS-REQ with pre-authentication (and RESPONSE_TOO_BIG -> TCP) is the
protocol working (the kerberos decoder marks that step as no error), so it is never a retry.
Retried chains of one server (and port) that overlap or lie within ``episode_gap_ns`` of each
other are one episode: one finding, starting at its first retry.

Reported: clients, retried requests, retries, retries per original request (the metric) and the
amplification (sends per retried request), how the tries ended (errors by status, unanswered, answered
only after the client had asked again), the
backoff class of the inter-send intervals — none (a fixed timer), linear, exponential, with or
without jitter, or irregular (:func:`classify_backoff`: per-chain least-squares growth of the
log-intervals, model residuals) —, whether the clients retry in phase (:func:`in_phase`: the median
distance from a retry to the nearest retry of another client, against what independent timers
would give at that rate), and the retry timer (median first interval) against the server's
measured response time (median latency of requests answered without a retry; for SYNs the
handshake RTT) and, over TCP, the connections' handshake RTT: "retry timer 250 ms is 723x the
346 µs response time", "retry timer 60 s (Linux's default timeo for TCP mounts, nfs(5)) is
200,000x the 300 µs response time and 666,667x the connections' 90 µs TCP handshake RTT", or "the
retry timer 20 ms is shorter than the server's 80 ms response time: clients resend before it could
have answered". A timer within 5 % of its protocol's declared default (``Protocol.retry_timers``)
is named as that default.
A client that is itself a server of the protocol in the capture (a forwarder) is said to be
possibly relaying its own clients' retries.

**Clients** per :func:`detectors.base.client_identity_by` per server (address, or address:port for
an address with requests outstanding at once from several ports); ``client_identity`` is the rule
of most of the episode's clients; concurrent streams of one address count like distinct hosts and the
explanation says "N concurrent streams from one address (processes, containers or NAT)". **Vantage:** a capture without a single answer of the protocol
(one direction only) cannot tell a retry from a new request: such episodes are informational and
say so. **Resolution:** intervals within ten ticks of the capture's timestamp resolution are not
classified, and the explanation says so.

**Severity.** A = sends per retried request, N = clients, R = retries. Below ``min_retries``
retries: not reported. Otherwise low; medium when A >= ``medium_amplification`` with N >=
``medium_clients``, or A >= ``solo_amplification`` on a fixed timer of at most
``solo_max_interval_ns`` (one client hammering); high
when medium and (A >= ``high_amplification``, or N >= ``high_clients`` with R >= ``high_retries``);
critical when N >= ``critical_clients`` with A >= ``high_amplification``, or R >=
``critical_retries``. Clients backing off exponentially with jitter do what RFC 8085 asks: at most
low (an outage ridden out, not a storm); exponential backoff without jitter lowers one level
(not below low) unless the clients retry in phase. Clients that resend no faster than
``min_speedup`` times their normal pace for the request (the median gap between two asks answered
fine in a row, where the capture shows it for at least half of the retried requests) are polling
through a failure: at most low. Without any answer of the protocol in the capture: informational.

**References.** RFC 8085 §3.1.3 (UDP retransmission, backoff), RFC 1035 §4.2.1 and RFC 1536 §1
(DNS retransmission), RFC 4120 §7.2.1 (KDC timeouts), RFC 6298 and RFC 9293 §3.8.1 (TCP RTO, SYN
retransmission), MS-SMB2 §3.3.5.9 (CREATE and its sharing checks), RFC 5531 §9 (xid,
retransmissions), nfs(5) ``timeo``/``retrans`` (Linux: UDP 1.1 s doubling to 60 s, TCP 60 s growing
linearly), RFC 7530 §16.10 / RFC 8881 §18.10 (LOCK, NFS4ERR_DENIED), AWS Architecture Blog,
"Exponential Backoff And Jitter" (2015).

**Known false positives.** A client that polls a failing resource on its normal schedule within
``max_gap_ns`` looks like a fixed-timer retry (its amplification stays low). Re-asks from a new
source port while the first query is still outstanding make an address count as several clients,
splitting its chains. Resolvers that fail over to another server show their retries at that server.

**Code.** detectors/retry_storm_sends.py builds the sends, detectors/retry_storm_backoff.py classifies
the ladders (backoff class, phase); this module holds the parameters, chains, episodes, severity and
wording (``classify_backoff`` and ``in_phase`` are importable from here, with these parameters). It
runs in two steps (``PARTITION``, detectors/base.py): :func:`partial` finds the episodes of the
servers it is given, :func:`finish` joins in what the whole capture decides and words them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from analyzer.decoders import registry
from analyzer.wide_frames import row_wise

from . import retry_storm_backoff
from .base import (client_identity_by, fmt_limited, fmt_ns, fmt_number, findings, empty_findings, resolution_ns,
                   transaction_frames, PROTOCOL_KINDS, RESOLUTION_TICKS, SEVERITIES, TRANSACTION_FRAMES,
                   protocol_declaration)
from .params import LOWER, UPPER, param
from .herd import streams_text
from .retry_storm_backoff import MAX_CLASSIFIED_CHAINS  # noqa: F401 - public here too
from .retry_storm_sends import RESEND_FRAMES, SEND_SCHEMA, syn_sends, transaction_sends  # noqa: F401

NAME = "retry_storm"
KINDS = PROTOCOL_KINDS + ("tcp_syn",)  # the protocol of the requests (SYN retries: tcp_syn)
# every frame it reads: each protocol's transactions and the message frames of the protocols that declare
# resends (Protocol.resends_frame: DNS's re-sent queries, RPC's re-sent calls), both from the protocol
# registry; TCP's frames (SYN retries, connection RTTs) and the tick
REQUIRES = (*TRANSACTION_FRAMES, *RESEND_FRAMES, "connections", "tcp_client_syns", "interfaces")
# what it reads of the message frames: what the protocols' resends hooks read (Protocol.resends_columns)
COLUMNS = {p.resends_frame: p.resends_columns for p in registry.protocols() if p.transactions and p.resends_frame}
# ... and the rows of them, where the hooks read only some (Protocol.resends_rows: re-sent DNS queries, RPC calls)
ROWS = {p.resends_frame: p.resends_rows for p in registry.protocols()
        if p.transactions and p.resends_frame and p.resends_rows is not None}
ORDER = 20  # where it runs and is listed (detectors/__init__.py)
# chains and episodes are per server: found on each server partition (partial), finished on their parts
# with what the whole capture decides (finish: relays, each kind's answers and response time; base.py)
PARTITION = "server"

S = 1_000_000_000
# the clients' normal pace for a request is known when at least this share of the retried requests show it
# (two asks answered fine in a row): then a resend no faster than it is polling, not a storm
PACE_KNOWN_SHARE = 0.5
# a measured retry timer this close (share) to a protocol's declared default (Protocol.retry_timers) is named
# as that default in the sentence (wording only: it decides nothing)
DEFAULT_TIMER_SHARE = 0.05


@dataclass(frozen=True)
class Params:
    max_gap_ns: int = param(10_000_000_000, "a re-ask later than this after the previous try is a new request "
                                            "(not a resend with the same id: its protocol says it is the same)",
                            unit="ns", lo=1)
    episode_gap_ns: int = param(10_000_000_000, "retried requests of one server this close form one episode",
                                unit="ns", lo=1)
    min_retries: int = param(3, "episodes with fewer retries are not reported", unit="retries", gate=LOWER, lo=1)
    medium_amplification: float = param(3.0, "sends per retried request for medium (with medium_clients) ...",
                                        unit="x", gate=LOWER, lo=1.0)
    medium_clients: int = param(3, "... clients retrying for medium", unit="clients", gate=LOWER, lo=1)
    solo_amplification: float = param(100.0, "... or this many sends per request on a fixed timer, whatever "
                                             "the number of clients ...", unit="x", gate=LOWER, lo=1.0)
    solo_max_interval_ns: int = param(1_000_000_000, "... resending at least once in this (hammering)",
                                      unit="ns", gate=UPPER, lo=1)
    high_amplification: float = param(10.0, "high: this amplification, or ...", unit="x", gate=LOWER, lo=1.0)
    high_clients: int = param(10, "... this many clients with ...", unit="clients", gate=LOWER, lo=1)
    high_retries: int = param(100, "... this many retries", unit="retries", gate=LOWER, lo=1)
    critical_clients: int = param(100, "critical: this many clients at high_amplification, or ...",
                                  unit="clients", gate=LOWER, lo=1)
    critical_retries: int = param(10_000, "... this many retries", unit="retries", gate=LOWER, lo=1)
    growth_ratio: float = param(1.25, "intervals growing by at least this factor per retry: backoff (linear or "
                                      "exponential)", unit="x", lo=1.0)
    fixed_ratio: float = param(1.25, "growth above 1/this (and below growth_ratio): a fixed timer, unless ...",
                               unit="x", lo=1.0)
    linear_step: float = param(0.10, "... the intervals grow steadily by at least this share each time: linear",
                               unit="share", lo=0.0)
    jitter: float = param(0.10, "median absolute residual (log scale, or relative) above this: jittered",
                          unit="", lo=0.0)
    no_timer: float = param(0.5, "... above this (Poisson arrivals give ~0.75, +-50 % jitter ~0.2): no timer, "
                                 "irregular", unit="", lo=0.0)
    min_speedup: float = param(1.5, "clients must resend this much faster than they normally ask (when known)",
                               unit="x", gate=LOWER, lo=0.0)
    sync_ratio: float = param(0.25, "nearest other-client retry at most this share of the independent "
                                    "expectation: in phase", unit="share", lo=0.0, hi=1.0)
    sync_min_retries: int = param(10, "in phase is judged from this many retries in the episode ...",
                                  unit="retries", gate=LOWER, lo=0)
    sync_min_clients: int = param(3, "... from this many clients (fewer: not judged, not in phase)",
                                  unit="clients", gate=LOWER, lo=0)
    linear_preference: float = param(0.8, "growing intervals are linear, not exponential, when the linear model's "
                                          "median residual is below this share of the exponential one's",
                                     unit="share", lo=0.0)
    linear_consistency: float = param(0.75, "a steady linear step needs at least this share of the steps positive",
                                      unit="share", lo=0.0, hi=1.0)


# -- backoff, phase: detectors/retry_storm_backoff.py ------------------------------------------------

def classify_backoff(intervals: list[np.ndarray], params: Params = Params()) -> tuple[str, bool | None]:
    """Backoff class ("fixed", "linear", "exponential", "irregular" or "unknown") of retry chains from
    their inter-send intervals (one array per chain), and whether there is jitter (None when unknown):
    :func:`detectors.retry_storm_backoff.backoff_class` with these parameters."""
    return retry_storm_backoff.backoff_class(intervals, params)


def in_phase(retries: pl.DataFrame, duration_ns: int, params: Params = Params()) -> float | None:
    """How close each retry is to another client's, against independent timers (near 0: in phase):
    :func:`detectors.retry_storm_backoff.in_phase`; None below ``sync_min_retries`` or ``sync_min_clients``."""
    return retry_storm_backoff.in_phase(retries, duration_ns, params.sync_min_retries, params.sync_min_clients)


# -- detect -------------------------------------------------------------------------------------------


def _explain(r: dict, res_ns: float) -> str:
    kind = r["kind"]
    what = r["resource"] or r["operation"]
    declared = protocol_declaration(kind)  # its wording (analyzer/decoders/protocol.py); None for tcp
    if declared is not None and declared.operation_after_resource and r["operation"]:
        what = f"{what} {r['operation']}"
    if r["n_resources"] > 1:
        what += f" (and {r['n_resources'] - 1} other request(s))"
    op = r["operation"] or "request"
    if kind == "tcp":
        noun = "SYNs to"
    elif declared is not None and declared.request_word:
        noun = f"{declared.request_word} for"
    else:
        noun = f"{op}s for" if not op.endswith("Request") else f"{op[:-7]} requests for"
    clients = f"{r['clients']} clients" if r["clients"] != 1 else f"1 client ({r['one_client']})"
    head = (f"{clients} resent {noun} {what} at {r['server']} {r['retries']} times over "
            f"{fmt_ns(max(r['end_ns'] - r['first_send_ns'], res_ns))}: {r['chains']} request(s) retried, "
            f"{fmt_number(r['retries'] / r['chains'])} retries per request ({fmt_number(r['amplification'])}x amplification)")
    if r["answered_any_proto"] is False:
        return head + ("; no answer of this protocol is in the capture (one direction only?), so resends cannot "
                       "be told from new requests (informational)")
    if r["limited"]:
        back = (f"; intervals are within ten ticks of the capture's {fmt_ns(res_ns)} timestamp resolution, "
                "too fine to classify")
    elif r["backoff"] == "unknown":
        back = "; one retry per request"
    else:
        jit = " with jitter" if r["jitter"] else " without jitter"
        name = {"fixed": "no backoff (fixed timer)", "linear": "linear backoff", "exponential": "exponential backoff",
                "irregular": "irregular intervals (no timer to see)"}[r["backoff"]]
        jit = jit if r["backoff"] != "irregular" else ""
        back = f"; {name}{jit}, median interval {fmt_ns(r['median_interval_ns'])}"
    phase = ""
    if r["speedup"] is not None and r["pace_known"] >= PACE_KNOWN_SHARE and r["speedup"] >= 1.5:
        phase += (f"; {fmt_number(r['speedup'])}x faster than the clients normally ask for it (every "
                  f"{fmt_limited(r['normal_gap'], res_ns)})")
    if r["sync"] is not None:
        phase += "; clients retry in phase (synchronised)" if r["synced"] else "; clients retry out of phase"
    errs = r["error_answers"] or 0
    failed = max(r["sends"] - r["chains_ok"], 0)
    after_errors = errs * 2 >= failed and errs > 0
    rtt_name = "handshake RTT" if kind == "tcp" else "response time"
    rtt_of = "" if r["rtt_from_server"] else " (of other servers: it answered nothing on the first try)"
    conn_rtt = ""
    if kind != "tcp" and r["reliable"] and r["conn_rtt_ns"] is not None and r["conn_rtt_ns"] > 0 \
            and r["timer_ns"] is not None:
        conn_rtt = (f" and {fmt_number(r['timer_ns'] / r['conn_rtt_ns'])}x the connections' "
                    f"{fmt_limited(r['conn_rtt_ns'], res_ns)} TCP handshake RTT")
    default = _default_timer(declared, r)
    if r["timer_ns"] is None:
        timer = ""
    elif r["rtt_ns"] is None or r["rtt_ns"] <= 0:
        conn_rtt = f" is{conn_rtt[4:]}" if conn_rtt else ""
        timer = (f"; retry {'interval' if after_errors else 'timer'} {fmt_ns(r['timer_ns'])}{default}{conn_rtt}, "
                 f"response time unknown")
    elif after_errors:
        conn_rtt = (f" and a {fmt_limited(r['conn_rtt_ns'], res_ns)} TCP handshake RTT" if conn_rtt else "")
        timer = (f"; median retry interval {fmt_ns(r['timer_ns'])} against a {fmt_limited(r['rtt_ns'], res_ns)} "
                 f"{rtt_name}{rtt_of}{conn_rtt}")
    elif r["timer_ns"] < r["rtt_ns"]:
        timer = (f"; the retry timer {fmt_ns(r['timer_ns'])}{default} is shorter than the server's "
                 f"{fmt_limited(r['rtt_ns'], res_ns)} "
                 f"{rtt_name}{rtt_of}: clients resend before it could have answered")
    else:
        timer = (f"; retry timer {fmt_ns(r['timer_ns'])}{default} is {fmt_number(r['timer_ns'] / r['rtt_ns'])}x "
                 f"the {fmt_limited(r['rtt_ns'], res_ns)} {rtt_name}{rtt_of}{conn_rtt}")
    outcome = (f"; {r['chains_ok']} of {r['chains']} eventually succeeded" if r["chains_ok"] < r["chains"]
               else "; all eventually succeeded")
    # tries answered fine, but only after the next one went out (a slow server, re-asked with new ids)
    late = max((r["answered_ok"] or 0) - r["chains_ok"], 0)
    unanswered = max(r["sends"] - r["chains_ok"] - errs - late, 0)
    top = r["top_error"] if r["error_kinds"] == 1 else f"mostly {r['top_error']}"
    who, keep, back_off = (("clients", "keep", "back off") if r["clients"] != 1
                           else ("the client", "keeps", "backs off"))
    if errs and unanswered:
        after = f"; {errs} tries failed ({top}) and {unanswered} went unanswered"
    elif errs:
        after = f"; {errs} tries failed ({top})"
    elif unanswered or not late:
        after = f"; {unanswered} tries went unanswered"
    else:
        after = ""
    if late:
        after += f"; {late} tries were answered only after {who} had asked again"
    down = "while it keeps failing" if after_errors else "while the server is not answering"
    cause = {"fixed": f" — {who} without backoff {keep} the load up {down}",
             "linear": " — backoff too slow to shed load",
             "exponential": "", "irregular": "", "unknown": ""}[r["backoff"]] if not r["limited"] else ""
    if r["backoff"] == "exponential" and r["jitter"]:
        cause = f" — {who} {back_off} as RFC 8085 asks: an outage ridden out, not a storm"
    if r["polling"] and r["backoff"] != "exponential" and not r["relay"]:
        cause = (f" — but the clients resend no faster than they normally ask for it (every "
                 f"{fmt_limited(r['normal_gap'], res_ns)}): polling through a failure, no load added")
    elif r["polling"] and not r["relay"]:
        pace = (f"no faster than the clients normally ask for it (every {fmt_limited(r['normal_gap'], res_ns)}): "
                "the retries add no load")
        cause = f"{cause}, and {pace}" if cause else f" — {pace}"
    relay = (f"; {r['one_addr']} is itself a server of this protocol here: it may be relaying its own clients' "
             f"retries (see the finding at it)") if r["relay"] else ""
    streams = streams_text(r["clients"], r["split_clients"], r["split_addresses"], r["one_split_address"])
    return head + after + back + phase + timer + outcome + cause + relay + streams


def _default_timer(declared, r: dict) -> str:
    """" (Linux's default timeo for UDP mounts, nfs(5))" when the measured timer is the protocol's declared
    default for the episode's transport (Protocol.retry_timers), else ""."""
    if declared is None or not declared.retry_timers or r["timer_ns"] is None:
        return ""
    known = declared.retry_timers.get("tcp" if r["reliable"] else "udp")
    if known is None or abs(r["timer_ns"] - known[0]) > DEFAULT_TIMER_SHARE * known[0]:
        return ""
    return f" ({known[1]})"


# an episode as partial() hands it to finish(): every partition's of the same columns and types
_EMPTY_EPISODES = pl.DataFrame(schema={
    "kind": pl.String, "server": pl.String, "server_port": pl.UInt16, "start_ns": pl.Int64, "end_ns": pl.Int64,
    "first_send_ns": pl.Int64, "clients": pl.UInt32, "chains": pl.UInt32, "sends": pl.UInt32, "retries": pl.UInt32,
    "chains_ok": pl.UInt32, "operation": pl.String, "resource": pl.String, "n_resources": pl.UInt32,
    "split_clients": pl.UInt32, "split_addresses": pl.UInt32, "one_split_address": pl.String,
    "evidence_frames": pl.List(pl.UInt32), "timer_ns": pl.Float64, "median_interval_ns": pl.Float64,
    "one_client": pl.String, "one_addr": pl.String, "reliable": pl.Boolean, "answered_ok": pl.UInt32,
    "pace_known": pl.Float64, "speedup": pl.Float64, "normal_gap": pl.Float64, "error_answers": pl.UInt32,
    "top_error": pl.String, "error_kinds": pl.UInt32, "rtt_srv": pl.Float64, "conn_rtt_ns": pl.Int64,
    "client_identity": pl.String, "rtt_from_server": pl.Boolean, "amplification": pl.Float64,
    "backoff": pl.String, "jitter": pl.Boolean, "sync": pl.Float64, "limited": pl.Boolean, "synced": pl.Boolean})


def _connection_rtts(conns: pl.DataFrame | None) -> pl.DataFrame:
    """Median TCP handshake RTT of the connections to each server and port (empty without them)."""
    schema = {"server": pl.String, "server_port": pl.UInt16, "conn_rtt_ns": pl.Int64}
    if conns is None or conns.height == 0 or not {"server", "server_port", "handshake_rtt_ns"} <= set(conns.columns):
        return pl.DataFrame(schema=schema)
    return conns.group_by(pl.col("server").cast(pl.String), pl.col("server_port").cast(pl.UInt16)).agg(
        pl.col("handshake_rtt_ns").cast(pl.Int64).median().cast(pl.Int64).alias("conn_rtt_ns")).cast(schema)


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    return finish(partial(capture, params), capture, params)


def _latency_counts(requests: pl.DataFrame) -> pl.DataFrame:
    """Each kind's distinct latencies with how many ``requests`` had them (nulls left out)."""
    return requests.filter(pl.col("latency_ns").is_not_null()).group_by("kind", "latency_ns") \
        .agg(pl.len().cast(pl.Int64).alias("requests"))


def _median_latencies(counts: pl.DataFrame) -> pl.DataFrame:
    """``rtt_kind``: each kind's median latency over :func:`_latency_counts` (of every partition), as
    Polars' median of the latencies themselves: of the one or two middle ones."""
    counts = counts.group_by("kind", "latency_ns").agg(pl.col("requests").sum()).sort("kind", "latency_ns")
    counts = counts.with_columns(pl.col("requests").cum_sum().over("kind").alias("_upto"),
                                 pl.col("requests").sum().over("kind").alias("_n"))
    rows = []
    for kind, group in counts.group_by("kind", maintain_order=True):
        n, upto, values = group["_n"][0], group["_upto"].to_numpy(), group["latency_ns"].to_numpy()
        middle = [int(values[np.searchsorted(upto, rank, side="right")]) for rank in sorted({(n - 1) // 2, n // 2})]
        rows.append({"kind": kind[0], "rtt_kind": pl.Series(middle, dtype=pl.Int64).median()})
    return pl.DataFrame(rows, schema={"kind": counts.schema["kind"], "rtt_kind": pl.Float64})


def partial(capture, params: Params = Params()) -> dict[str, pl.DataFrame]:
    """What one server partition of the capture contributes (base.py, PARTITION): its episodes, as far
    as their servers decide them, and what only the whole capture decides, for :func:`finish`:
    ``answered`` (the kinds with an answer), ``servers`` (the addresses serving each kind: a client
    among them is a relay) and ``latencies`` (of the requests answered on the first try, each
    distinct latency of a kind with its count of ``requests``: the response time of an episode's kind
    where its own server has none; a row a request held all of them in the caller of a scan in
    partitions until its end, ~1.1 GB at 100M)."""
    frames = transaction_frames(capture)
    sends = transaction_sends(capture, frames) if frames else pl.DataFrame(schema=SEND_SCHEMA)
    syns, conns = syn_sends(capture)
    sends = pl.concat([sends, syns]) if syns.height else sends
    # protocols with at least one answer: without any, the capture misses a direction
    answered = sends.select(pl.col("kind").filter(pl.col("answered")).unique())
    servers = sends.select("kind", pl.col("server").alias("one_addr")).unique()
    if sends.height == 0:
        return {"episodes": _EMPTY_EPISODES, "answered": answered, "servers": servers,
                "latencies": _latency_counts(sends)}
    sends = sends.with_row_index("_row")
    # only addresses with a send that was not answered successfully, or answered only after the address's
    # next send to that server, can have retried (cheap filter before the client identity and the sort)
    # (on a narrow integer frame keyed by the hash of kind, server and client: sorting the strings is what costs)
    addr_g = row_wise(sends, pl.struct("kind", "server", "client").hash())
    late = ((pl.col("_a") == pl.col("_a").shift(-1)) & (pl.col("ok_ts") > pl.col("ts").shift(-1))).fill_null(False)
    cand = (sends.select(addr_g.alias("_a"), "ts", "ok_ts", "extra", "latency_ns").sort("_a", "ts")
            .filter(pl.col("ok_ts").is_null() | (pl.col("extra") > 0) | pl.col("latency_ns").is_null() | late)
            .select(pl.col("_a").unique())[:, 0])
    sub = sends.filter(addr_g.is_in(cand.implode()))
    sub = client_identity_by(sub, ["kind", "server"], start="ts", end="end_ts")
    gkey = ["kind", "client_id", "server", "server_port", "operation", "key_resource"]
    narrow = sub.select("_row", row_wise(sub, pl.struct(gkey).hash()).alias("_g"), "ts", "ok_ts", "err_ts",
                        "reliable", "flow", "extra", "same_id")
    narrow = narrow[narrow.select(pl.arg_sort_by("_g", "ts", "_row"))[:, 0]]  # a total order: by its keys alone
    prev_ok = (pl.col("ok_ts").shift(1) <= pl.col("ts")).fill_null(False)
    prev_err = (pl.col("err_ts").shift(1) <= pl.col("ts")).fill_null(False)
    # no answer yet: a resend over UDP (or a new SYN); over TCP the transport retransmits, so a request
    # with a new id is one only on another connection (the client gave up on the first), not a pipelined
    # twin — but a resend the protocol recognises by its id (same xid) is the application retrying anywhere
    resend = ~prev_ok & ~prev_err & (~pl.col("reliable") | pl.col("same_id")
                                     | (pl.col("flow") != pl.col("flow").shift(1)).fill_null(True))
    same_g = pl.col("_g") == pl.col("_g").shift(1)
    narrow = narrow.with_columns(
        # max_gap_ns tells a retry from a new request; a same-id resend is the same request whatever the
        # gap (its decoder's pairing window bounds it: NFS's timeo of 60 s and more over TCP)
        (same_g & (((pl.col("ts") - pl.col("ts").shift(1)) <= params.max_gap_ns) | pl.col("same_id"))
         & (prev_err | resend)).fill_null(False).alias("retry"),
        # the client's normal pace for this request: gaps between two answered-fine asks in a row
        pl.when(same_g & prev_ok).then(pl.col("ts") - pl.col("ts").shift(1)).alias("_ok_gap"),
    )
    normal = narrow.group_by("_g").agg(pl.col("_ok_gap").median().alias("normal_gap"))
    narrow = narrow.with_columns(
        (~pl.col("retry")).cum_sum().alias("chain"),
        (pl.col("retry") | pl.col("retry").shift(-1).fill_null(False) | (pl.col("extra") > 0)).alias("_retried"),
    ).filter(pl.col("_retried")).join(normal, on="_g", how="left").select("_row", "chain", "retry", "normal_gap")
    # response time per server: requests answered on the first try
    first_try = sends.lazy().select("_row", "kind", "server", "latency_ns", "ok_ts").filter(
        pl.col("ok_ts").is_not_null() & pl.col("latency_ns").is_not_null()).collect().join(
        narrow, on="_row", how="anti")
    rtt_srv = first_try.group_by("kind", "server").agg(pl.col("latency_ns").median().alias("rtt_srv"))
    out = {"episodes": _EMPTY_EPISODES, "answered": answered, "servers": servers,
           "latencies": _latency_counts(first_try)}
    if narrow.height == 0:
        return out
    # sub's rows of the retried sends, by position (``_row`` rises through sub): a join would hash sub whole
    at = np.searchsorted(sub["_row"].to_numpy(), narrow["_row"].to_numpy())
    s = sub[at].hstack(narrow.drop("_row")).sort("chain", "ts", "_row")
    retried = s.group_by("chain").agg(
        pl.col("kind").first(), pl.col("client_id").first(), pl.col("client_identity").first(),
        pl.col("server").first(), pl.col("server_port").first(), pl.col("operation").first(),
        pl.col("key_resource").first(), pl.col("resource").first(), pl.col("client").first().alias("one_addr"),
        (pl.len() + pl.col("extra").sum()).alias("tries"), pl.col("ts").min().alias("first_ts"),
        pl.col("ts").max().alias("last_ts"), pl.col("ts").diff().drop_nulls().alias("intervals"),
        pl.col("ts").get(1, null_on_oob=True).alias("first_retry_ts"),
        pl.col("frame").alias("frames"), pl.col("ok_ts").last().is_not_null().alias("ok"),
        pl.col("error").drop_nulls().alias("errors"), pl.col("normal_gap").first(), pl.col("reliable").all(),
        # sends of their own request answered fine (not a resend of one, not a SYN: those share one answer)
        (pl.col("answered") & pl.col("error").is_null() & ~pl.col("same_id") & (pl.col("kind") != "tcp"))
        .sum().alias("answered_ok"),
    ).with_columns((pl.col("normal_gap") / pl.col("intervals").list.median()).alias("speedup"))
    # episodes per server and port
    sk = ["kind", "server", "server_port"]
    retried = retried.sort([*sk, "first_ts", "chain"]).with_columns(
        (pl.all_horizontal([(pl.col(c) == pl.col(c).shift(1)).fill_null(False) for c in sk])
         & (pl.col("first_ts") <= pl.col("last_ts").cum_max().shift(1).over(sk) + params.episode_gap_ns
            ).fill_null(False)).alias("_same"),
    ).with_columns((~pl.col("_same")).cum_sum().alias("episode"))
    res_ns = resolution_ns(capture)
    eps = retried.group_by("episode").agg(
        pl.col("kind").first(), pl.col("server").first(), pl.col("server_port").first(),
        pl.coalesce(pl.col("first_retry_ts").min(), pl.col("first_ts").min()).alias("start_ns"),
        pl.col("last_ts").max().alias("end_ns"), pl.col("first_ts").min().alias("first_send_ns"),
        pl.col("client_id").n_unique().alias("clients"), pl.len().alias("chains"),
        pl.col("tries").sum().alias("sends"), (pl.col("tries") - 1).sum().alias("retries"),
        pl.col("ok").sum().alias("chains_ok"),
        pl.col("operation").mode().sort().first(), pl.col("resource").mode().sort().first(),
        pl.col("key_resource").n_unique().alias("n_resources"),
        pl.col("client_id").filter(pl.col("client_identity") == "address+port").n_unique().alias("split_clients"),
        pl.col("one_addr").filter(pl.col("client_identity") == "address+port").n_unique().alias("split_addresses"),
        pl.col("one_addr").filter(pl.col("client_identity") == "address+port").min().alias("one_split_address"),
        pl.col("frames").list.explode(keep_nulls=False, empty_as_null=False).alias("evidence_frames"),
        pl.col("intervals").list.first().drop_nulls().median().alias("timer_ns"),
        pl.col("intervals").list.explode(keep_nulls=False, empty_as_null=False).median().alias("median_interval_ns"),
        pl.col("client_id").first().alias("one_client"), pl.col("one_addr").first(),
        pl.col("errors").list.explode(keep_nulls=False, empty_as_null=False).alias("_errs"),
        pl.col("reliable").all(), pl.col("answered_ok").sum(),
        pl.col("speedup").is_not_null().mean().alias("pace_known"), pl.col("speedup").median(),
        pl.col("normal_gap").median(),
    ).with_columns(
        pl.col("_errs").list.len().alias("error_answers"),
        pl.col("_errs").list.eval(pl.element().mode().sort().first()).list.first().alias("top_error"),
        pl.col("_errs").list.n_unique().alias("error_kinds"),
    ).drop("_errs").filter(pl.col("retries") >= params.min_retries).sort("start_ns")
    if eps.height == 0:
        return out
    eps = (eps.join(rtt_srv, on=["kind", "server"], how="left")
           .join(_connection_rtts(conns), on=["server", "server_port"], how="left")
           .with_columns(pl.when(pl.col("split_clients") * 2 > pl.col("clients")).then(pl.lit("address+port"))
                         .otherwise(pl.lit("address")).alias("client_identity"),
                         pl.col("rtt_srv").is_not_null().alias("rtt_from_server"),
                         (pl.col("sends") / pl.col("chains")).alias("amplification")))
    # backoff class and phase per episode (episodes are few: a Python loop over them)
    ep_ids = eps["episode"].to_list()
    by_ep = {k: g for (k,), g in retried.filter(pl.col("episode").is_in(ep_ids)).group_by(["episode"])}
    retry_sends = s.filter(pl.col("retry")).join(retried.select("chain", "episode"), on="chain", how="inner")
    rs_by_ep = {k: g for (k,), g in retry_sends.group_by(["episode"])}
    extra_cols = {"backoff": [], "jitter": [], "sync": [], "limited": []}
    for row in eps.iter_rows(named=True):
        g = by_ep[row["episode"]]
        iv = [np.asarray(x, dtype=np.float64) for x in g["intervals"].to_list() if x is not None and len(x)]
        med = row["median_interval_ns"]
        limited = med is not None and med < RESOLUTION_TICKS * res_ns
        cls, jit = ("unknown", None) if limited else classify_backoff(iv, params)
        rs = rs_by_ep.get(row["episode"])
        sync = in_phase(rs, row["end_ns"] - row["start_ns"], params) if rs is not None and not limited else None
        extra_cols["backoff"].append(cls)
        extra_cols["jitter"].append(jit)
        extra_cols["sync"].append(sync)
        extra_cols["limited"].append(limited)
    eps = eps.with_columns(
        pl.Series("backoff", extra_cols["backoff"], dtype=pl.String),
        pl.Series("jitter", extra_cols["jitter"], dtype=pl.Boolean),
        pl.Series("sync", extra_cols["sync"], dtype=pl.Float64),
        pl.Series("limited", extra_cols["limited"], dtype=pl.Boolean),
    ).with_columns((pl.col("sync") <= params.sync_ratio).fill_null(False).alias("synced"))
    out["episodes"] = eps.drop("episode").select(_EMPTY_EPISODES.columns).cast(_EMPTY_EPISODES.schema)
    return out


def finish(parts: dict[str, pl.DataFrame], capture, params: Params = Params()) -> pl.DataFrame:
    """The findings of the episodes :func:`partial` found (on the whole capture, or on each server
    partition, its frames concatenated): what the whole capture decides joined in (relays, the kinds'
    response times and answers), then the severity and the sentence."""
    eps = parts["episodes"]
    if eps.height == 0:
        return empty_findings()
    rtt_kind = _median_latencies(parts["latencies"])
    servers = parts["servers"].unique().with_columns(pl.lit(True).alias("relay"))
    answered_kinds = set(parts["answered"]["kind"].to_list())
    res_ns = resolution_ns(capture)
    eps = (eps.sort("start_ns", "kind", "server", "server_port", "first_send_ns", "end_ns")
           .join(rtt_kind, on="kind", how="left", maintain_order="left")
           .join(servers, on=["kind", "one_addr"], how="left", maintain_order="left")
           .with_columns((pl.col("relay").fill_null(False) & (pl.col("clients") == 1)).alias("relay"),
                         pl.coalesce("rtt_srv", "rtt_kind").alias("rtt_ns"),
                         pl.col("kind").is_in(list(answered_kinds)).alias("answered_any_proto")))
    # severity
    A, N, R = pl.col("amplification"), pl.col("clients"), pl.col("retries")
    medium = (((A >= params.medium_amplification) & (N >= params.medium_clients))
              | ((A >= params.solo_amplification) & (pl.col("backoff") == "fixed")
                 & (pl.col("median_interval_ns") <= params.solo_max_interval_ns)))
    high = medium & ((A >= params.high_amplification) | ((N >= params.high_clients) & (R >= params.high_retries)))
    critical = ((N >= params.critical_clients) & (A >= params.high_amplification)) | (R >= params.critical_retries)
    level = (pl.when(critical).then(4).when(high).then(3).when(medium).then(2).otherwise(1))
    exp = pl.col("backoff") == "exponential"
    level = (pl.when(exp & pl.col("jitter").fill_null(False)).then(pl.min_horizontal(level, pl.lit(1)))
             .when(exp & ~pl.col("synced")).then(pl.max_horizontal(level - 1, pl.lit(1)))
             .otherwise(level))
    # clients that resend no faster than they normally ask are polling through a failure: no load added
    polling = ((pl.col("pace_known") >= PACE_KNOWN_SHARE) & (pl.col("speedup") < params.min_speedup)).fill_null(False)
    eps = eps.with_columns(polling.alias("polling"))
    level = pl.when(pl.col("polling")).then(pl.min_horizontal(level, pl.lit(1))).otherwise(level)
    level = pl.when(pl.col("answered_any_proto")).then(level).otherwise(0)
    eps = eps.with_columns(level.alias("_level"))
    rows = eps.to_dicts()
    expl = [_explain(r, res_ns) for r in rows]
    out = eps.with_columns(
        pl.Series("explanation", expl, dtype=pl.String),
        pl.col("_level").replace_strict(dict(enumerate(SEVERITIES)), return_dtype=pl.String).alias("severity"),
        pl.when(pl.col("clients") == 1).then(pl.col("one_client")).otherwise(None).alias("client"),
        pl.col("server").alias("server"),
        pl.when(pl.col("kind") == "tcp").then(pl.lit("tcp_syn")).otherwise(pl.col("kind")).alias("kind"),
        pl.col("clients").cast(pl.UInt32),
        pl.lit("retries_per_request").alias("metric"),
        ((pl.col("sends") - pl.col("chains")) / pl.col("chains")).cast(pl.Float64).alias("value"),
        pl.lit(float(params.medium_amplification - 1)).alias("threshold"),
        pl.lit("retries/request").alias("unit"),
        pl.col("evidence_frames").list.eval(pl.element().cast(pl.UInt32)),
    ).select("kind", "severity", "start_ns", "end_ns", "client", "server", "resource", "clients",
             "client_identity", "metric", "value", "threshold", "unit", "evidence_frames", "explanation")
    return findings(out, detector=NAME, params=params)
