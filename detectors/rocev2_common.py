"""What the RoCEv2 transport detectors (gbn_retransmission, rnr_retry) share: the requests and the
responses of each reliable-connected queue pair, resends and go-back-N episodes, the ACK turnaround.

A capture carries only the *destination* QPN of each packet (BTH DestQP, IBA vol. 1 §9.2): a request
names the responder's QP, a response (ACK, NAK, RNR NAK, READ response) names the requester's. A QP's
two directions are paired by ``qp_pair`` (rocev2_packets: the symmetric UDP source port), so the
resource ``10.0.0.1:qp0x2e1->10.1.0.1:qp0x381`` is the requester's address and the QPN its responses are
addressed to, then the responder's address and the QPN its requests are addressed to.

A *flow* is one requester -> responder direction of one QP pair: ``(qp_pair, requester)``. Requests
(SEND / WRITE / READ REQUEST / atomics: ``rocev2.is_request``) are read in capture order per flow:

- the PSN is unwrapped (24 bits, IBA §9.7.1: each step is taken modulo 2^24 into [-2^23, 2^23);
  ``rocev2.unwrap_psn``, the rule rocev2_flows counts with);
- a *resend* is a request whose PSN this flow already sent (a PSN seen again);
- a request is *behind* when its PSN is not above every PSN the flow sent before it: the requester
  went back (go-back-N from the NAKed PSN, or from the oldest unacknowledged one after its ACK timer
  or an RNR wait, IBA §9.7.4-9.7.6). A behind request never seen before is a PSN the mirror never saw
  the first time (lost upstream of it: "the gap");
- an *episode* starts at a behind request that steps back (its PSN not above the previous request's)
  and holds the behind requests up to the next such step.

Each episode's trigger is read from the responses: the latest NAK "PSN sequence error" (AETH
syndrome 0x60) naming the episode's first PSN within ``nak_window_ns`` before it -> ``nak``; the
latest RNR NAK (0x20|timer) naming it -> ``rnr`` (rnr_retry's, not a go-back-N); neither -> the
silence before it (since the QP pair's previous packet, either direction) decides in the detector.
What the resends cost is over the flow's requests in a window around them (``requests_within``).

All of it is column work (sort, shift, cumulative windows over flows, as-of joins), never a loop.
"""
from __future__ import annotations

import polars as pl

from analyzer.decoders.rocev2 import ack_timeout_ns, is_request, rnr_delay_ns, unwrap_psn  # noqa: F401 - re-exported

from .base import RESOLUTION_TICKS, SEVERITY_RANK, endpoint, fmt_ns, optional_frame

PSN_BITS = 24  # IBA §9.2: the PSN is 24 bits and wraps
PSN_MOD = 1 << PSN_BITS
FLOW = ("qp_pair", "requester")
MIRROR_NOTE = ("seen at a mirror or NIC sniffer: the wire, not the DMA or the receive/send WQE queues")

# the decoder's own tables (IBA Table 38 request opcodes, Table 45 RNR delays, §9.7.6.1.3 ACK timer)
RNR_DELAY_NS = {code: int(rnr_delay_ns(code)) for code in range(32)}


def rc_packets(pk: pl.DataFrame) -> pl.DataFrame:
    """The decodable reliable-connected packets (status ok, transport RC, a PSN, TVer 0), addresses as
    strings. A receiver drops a packet whose BTH TVer is not 0 (IBA vol. 1 §9.2.2, §9.6.1.1): it is not
    part of the transport, and random bytes on UDP 4791 pass this test only one time in sixteen."""
    if pk is None or pk.height == 0:
        return pl.DataFrame(schema={"frame": pl.UInt32, "ts_ns": pl.Int64, "qp_pair": pl.UInt32, "src": pl.String,
                                    "dst": pl.String, "opcode": pl.UInt8, "dest_qp": pl.UInt32, "psn": pl.UInt32,
                                    "aeth_kind": pl.String, "aeth_nak_code": pl.UInt8, "aeth_rnr_timer": pl.UInt8})
    ok = pk.filter((pl.col("status").cast(pl.String) == "ok") & (pl.col("transport").cast(pl.String) == "RC")
                   & pl.col("psn").is_not_null() & pl.col("qp_pair").is_not_null() & (pl.col("tver") == 0))
    return ok.select(pl.col("frame").cast(pl.UInt32), pl.col("ts_ns").cast(pl.Int64), pl.col("qp_pair").cast(pl.UInt32),
                     pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String), pl.col("opcode").cast(pl.UInt8),
                     pl.col("dest_qp").cast(pl.UInt32), pl.col("psn").cast(pl.UInt32),
                     pl.col("aeth_kind").cast(pl.String), pl.col("aeth_nak_code").cast(pl.UInt8),
                     pl.col("aeth_rnr_timer").cast(pl.UInt8))


def requests(rc: pl.DataFrame) -> pl.DataFrame:
    """One row per request, per flow in capture order, with ``psn_u`` (unwrapped), ``resend`` (PSN seen
    before on this flow), ``sends`` (how many times this PSN was sent so far, this one included),
    ``behind`` (not above every earlier PSN), ``episode`` (the go-back-N episode's id, unique in the
    capture; null when not behind) and ``prev_ts_ns`` / ``prev_frame`` (the QP pair's previous packet,
    either direction).

    One sort per question and running sums/maxima over the whole sorted frame, restarted at each flow
    boundary by offsets (no per-group windows: a capture has few flows but many PSNs)."""
    pairs = rc.sort("qp_pair", "ts_ns", "frame")
    same = pl.col("qp_pair") == pl.col("qp_pair").shift(1)
    prev = pairs.select("frame", pl.when(same).then(pl.col("ts_ns").shift(1)).alias("prev_ts_ns"),
                        pl.when(same).then(pl.col("frame").shift(1)).alias("prev_frame"))
    req = (rc.filter(is_request(pl.col("opcode")))
           .select("frame", "ts_ns", "qp_pair", pl.col("src").alias("requester"), pl.col("dst").alias("responder"),
                   pl.col("dest_qp").alias("responder_qpn"), "psn", "opcode")
           .sort(*FLOW, "ts_ns", "frame"))
    new_flow = ((pl.col("qp_pair") != pl.col("qp_pair").shift(1))
                | (pl.col("requester") != pl.col("requester").shift(1))).fill_null(True)
    req = req.with_columns(new_flow.alias("_new")).with_columns(pl.col("_new").cum_sum().alias("_flow"))
    req = req.with_columns(unwrap_psn(req, pl.col("_flow"), pl.lit(True)))  # psn_u, the decoder's rule
    # per-flow running maximum as one global one: each flow's PSNs lifted above every earlier flow's
    lifted = pl.col("_flow").cast(pl.Int64) * (1 << 40) + pl.col("psn_u") + PSN_MOD
    req = req.with_columns(
        (~pl.col("_new") & (lifted <= lifted.cum_max().shift(1))).fill_null(False).alias("behind"),
        (~pl.col("_new") & (pl.col("psn_u") <= pl.col("psn_u").shift(1))).fill_null(False).alias("_back"))
    req = req.with_columns(
        pl.when(pl.col("behind")).then((pl.col("behind") & pl.col("_back")).cast(pl.UInt32).cum_sum())
        .alias("episode"))
    # sends: the rank of each transmission among those of its PSN (sorted by flow, PSN, time)
    by_psn = req.select("frame", "_flow", "psn_u", "ts_ns").sort("_flow", "psn_u", "ts_ns", "frame")
    run = ((pl.col("_flow") != pl.col("_flow").shift(1)) | (pl.col("psn_u") != pl.col("psn_u").shift(1))).fill_null(True)
    idx = pl.int_range(pl.len(), dtype=pl.UInt32)
    sends = by_psn.select("frame", (idx - pl.when(run).then(idx).forward_fill() + 1).cast(pl.UInt32).alias("sends"))
    req = (req.drop("_new", "_flow", "_back").join(sends, on="frame", how="left")
           .with_columns((pl.col("sends") > 1).alias("resend")))
    return req.join(prev, on="frame", how="left")


def responses(rc: pl.DataFrame) -> pl.DataFrame:
    """One row per packet with an AETH (ACK, NAK, RNR NAK, READ responses FIRST/LAST/ONLY), keyed by the
    flow it answers: ``requester`` is its destination, ``requester_qpn`` its DestQP."""
    return (rc.filter(pl.col("aeth_kind").is_not_null())
            .select("frame", "ts_ns", "qp_pair", pl.col("dst").alias("requester"), pl.col("src").alias("responder"),
                    pl.col("dest_qp").alias("requester_qpn"), "psn", "opcode", "aeth_kind", "aeth_nak_code",
                    "aeth_rnr_timer")
            .sort(*FLOW, "ts_ns", "frame"))


def ack_turnaround(req: pl.DataFrame, rsp: pl.DataFrame) -> pl.DataFrame:
    """Per flow: the median time from a request to the ACK (or READ response) that names its PSN
    (``rtt_ns``, the responder's ACK coalescing included: what the requester waits), and how many
    pairs it was measured from (``rtt_pairs``). Each ACK is paired with the latest transmission of its
    PSN before it."""
    acks = rsp.filter(pl.col("aeth_kind") == "ack").select(*FLOW, "psn", pl.col("ts_ns").alias("ack_ts_ns"))
    if acks.height == 0 or req.height == 0:
        return pl.DataFrame(schema={"qp_pair": pl.UInt32, "requester": pl.String, "rtt_ns": pl.Int64,
                                    "rtt_pairs": pl.UInt32})
    sent = req.select(*FLOW, "psn", pl.col("ts_ns").alias("req_ts_ns")).sort("req_ts_ns")
    paired = acks.sort("ack_ts_ns").join_asof(sent, left_on="ack_ts_ns", right_on="req_ts_ns", by=[*FLOW, "psn"],
                                              strategy="backward", check_sortedness=False)
    return (paired.filter(pl.col("req_ts_ns").is_not_null())
            .group_by(FLOW).agg((pl.col("ack_ts_ns") - pl.col("req_ts_ns")).median().cast(pl.Int64).alias("rtt_ns"),
                                pl.len().cast(pl.UInt32).alias("rtt_pairs")))


def flow_facts(req: pl.DataFrame, rsp: pl.DataFrame) -> pl.DataFrame:
    """Per flow (either direction seen): the two QPNs (the most common DestQP of each direction, ties: the
    smallest; null when that direction is missing), request and response counts, first and last time,
    and the ACK turnaround."""
    fwd = req.group_by(FLOW).agg(pl.col("responder").first(), pl.col("responder_qpn").mode().min(),
                                 pl.len().cast(pl.UInt32).alias("requests"), pl.col("ts_ns").min().alias("first_ns"),
                                 pl.col("ts_ns").max().alias("last_ns"))
    back = rsp.group_by(FLOW).agg(pl.col("responder").first().alias("_responder"),
                                  pl.col("requester_qpn").mode().min(),
                                  pl.len().cast(pl.UInt32).alias("responses"),
                                  pl.col("ts_ns").max().alias("last_response_ns"),
                                  pl.col("aeth_kind").sort_by("ts_ns").last().alias("last_response_kind"))
    out = (fwd.join(back, on=FLOW, how="full", coalesce=True)
           .with_columns(pl.coalesce("responder", "_responder").alias("responder")).drop("_responder")
           .join(ack_turnaround(req, rsp), on=FLOW, how="left"))
    return out.with_columns(pl.col("requests").fill_null(0), pl.col("responses").fill_null(0),
                            pl.col("rtt_pairs").fill_null(0))


def resource(requester: str, requester_qpn, responder: str, responder_qpn) -> str:
    """``10.0.0.1:qp0x2e1->10.1.0.1:qp0x381`` (IPv6 in brackets); ``qp?`` where that QPN was not seen."""
    def side(addr, qpn):
        return endpoint(addr, f"qp{int(qpn):#x}" if qpn is not None else "qp?")
    return f"{side(requester, requester_qpn)}->{side(responder, responder_qpn)}"


def trigger_naks(starts: pl.DataFrame, rsp: pl.DataFrame, kind: str, window_ns: int, prefix: str) -> pl.DataFrame:
    """``starts`` (FLOW, psn, ``ts_ns``) with the latest response of ``aeth_kind == kind`` naming the
    same PSN at most ``window_ns`` before: ``<prefix>_frame``, ``<prefix>_ts_ns`` (null when none),
    and for RNR NAKs ``<prefix>_timer``."""
    naks = (rsp.filter(pl.col("aeth_kind") == kind)
            .select(*FLOW, "psn", pl.col("frame").alias(f"{prefix}_frame"), pl.col("ts_ns").alias(f"{prefix}_ts_ns"),
                    pl.col("aeth_rnr_timer").alias(f"{prefix}_timer"))
            .sort(f"{prefix}_ts_ns"))
    return starts.sort("ts_ns").join_asof(naks, left_on="ts_ns", right_on=f"{prefix}_ts_ns", by=[*FLOW, "psn"],
                                          strategy="backward", tolerance=int(window_ns), check_sortedness=False)


def episodes(req: pl.DataFrame, rsp: pl.DataFrame, nak_window_ns: int) -> pl.DataFrame:
    """One row per go-back-N episode: FLOW, ``episode``, its first request (``frame``, ``ts_ns``,
    ``psn``, ``psn_u``), ``end_ns``, ``resent`` (behind requests: every PSN sent again, the gap's
    included), ``gap`` (behind requests the mirror had not seen before: the PSNs lost upstream of it),
    ``max_sends`` (the most times one PSN of it was sent, up to then), ``silence_ns`` and
    ``prev_frame`` (since / the QP pair's previous packet), ``frames`` (its requests), and the trigger: ``nak_frame``/``nak_ts_ns``
    (a PSN sequence error NAK naming its first PSN) and ``rnr_frame``/``rnr_ts_ns``/``rnr_timer``."""
    behind = req.filter(pl.col("episode").is_not_null())
    if behind.height == 0:
        return pl.DataFrame()
    ep = (behind.group_by(*FLOW, "episode")
          .agg(pl.col("frame").first(), pl.col("ts_ns").first(), pl.col("psn").first(), pl.col("psn_u").first(),
               pl.col("ts_ns").last().alias("end_ns"), pl.len().cast(pl.UInt32).alias("resent"),
               (~pl.col("resend")).sum().cast(pl.UInt32).alias("gap"), pl.col("sends").max().alias("max_sends"),
               (pl.col("ts_ns").first() - pl.col("prev_ts_ns").first()).alias("silence_ns"),
               pl.col("prev_frame").first(),
               pl.col("frame").alias("frames")))
    naks = rsp.filter(pl.col("aeth_kind") == "nak")
    seq = naks.filter(pl.col("aeth_nak_code") == 0)
    ep = trigger_naks(ep, seq, "nak", nak_window_ns, "nak")
    ep = trigger_naks(ep, rsp, "rnr_nak", max(RNR_DELAY_NS.values()) * 2, "rnr").drop("nak_timer")
    return ep.sort(*FLOW, "episode")


def acked_through(req: pl.DataFrame, rsp: pl.DataFrame) -> pl.DataFrame:
    """Per flow: the highest unwrapped PSN an ACK named (``acked_u``; each ACK's PSN placed by the
    latest request of that PSN before it), and the flow's last request (``last_req_u``)."""
    acks = rsp.filter(pl.col("aeth_kind") == "ack").select(*FLOW, "psn", pl.col("ts_ns").alias("ack_ts_ns"))
    last = req.group_by(FLOW).agg(pl.col("psn_u").max().alias("last_req_u"))
    if acks.height == 0:
        return last.with_columns(pl.lit(None, pl.Int64).alias("acked_u"))
    sent = req.select(*FLOW, "psn", "psn_u", pl.col("ts_ns").alias("req_ts_ns")).sort("req_ts_ns")
    placed = acks.sort("ack_ts_ns").join_asof(sent, left_on="ack_ts_ns", right_on="req_ts_ns", by=[*FLOW, "psn"],
                                              strategy="backward", check_sortedness=False)
    top = placed.group_by(FLOW).agg(pl.col("psn_u").max().alias("acked_u"))
    return last.join(top, on=FLOW, how="left")


def requests_within(req: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """``windows`` (FLOW, ``lo_ns``, ``hi_ns``, any other columns) with ``window_requests``: the
    flow's requests (resends included: what it put on the wire) with lo_ns <= ts_ns <= hi_ns, and
    ``window_span_ns``: from the first of them to the last (0 for one, null for none). Two as-of
    joins on a per-flow running count, no loop."""
    ranked = (req.select(*FLOW, "ts_ns", "frame").sort(*FLOW, "ts_ns", "frame")
              .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(FLOW).alias("_i"))
              .sort("ts_ns", "_i"))
    last = ranked.select(*FLOW, pl.col("ts_ns").alias("_t_hi"), pl.col("_i").alias("_i_hi"))
    first = ranked.select(*FLOW, pl.col("ts_ns").alias("_t_lo"), pl.col("_i").alias("_i_lo"))
    out = (windows.with_row_index("_w").sort("hi_ns")
           .join_asof(last, left_on="hi_ns", right_on="_t_hi", by=list(FLOW), strategy="backward",
                      check_sortedness=False)
           .sort("lo_ns")
           .join_asof(first, left_on="lo_ns", right_on="_t_lo", by=list(FLOW), strategy="forward",
                      check_sortedness=False))
    n = (pl.col("_i_hi") - pl.col("_i_lo") + 1).clip(lower_bound=0).fill_null(0)
    return (out.with_columns(n.cast(pl.UInt32).alias("window_requests"),
                             pl.when(n > 0).then(pl.col("_t_hi") - pl.col("_t_lo")).alias("window_span_ns"))
            .sort("_w").drop("_w", "_t_hi", "_i_hi", "_t_lo", "_i_lo"))


def optional_packets(capture) -> pl.DataFrame | None:
    """The capture's rocev2_packets, None when it has none (no decoder, or no RoCEv2 traffic)."""
    return optional_frame(capture, "rocev2_packets", nonempty=True)


def merge_by_responder(out: pl.DataFrame, min_qps: int, what: str) -> pl.DataFrame:
    """Finding rows (kind, severity, server, ``_qps``, ...) of one kind on at least ``min_qps`` QPs to
    one responder become one row on that responder: the worst severity, the union of the windows and
    the evidence, the QPs listed, the worst QP's explanation; the others stay as they are."""
    if out.height == 0:
        return out
    ranked = out.with_columns(pl.col("severity").replace_strict(SEVERITY_RANK, return_dtype=pl.Int32).alias("_rank"),
                              pl.col("resource").n_unique().over("server", "kind").alias("_n"))  # QPs, not findings
    keep = ranked.filter(pl.col("_n") < min_qps)
    big = ranked.filter(pl.col("_n") >= min_qps).sort("_rank", "value", descending=True, maintain_order=True)
    if big.height == 0:
        return out
    merged = (big.group_by("server", "kind", maintain_order=True)
              .agg(pl.col("severity").first(), pl.col("start_ns").min(), pl.col("end_ns").max(),
                   pl.col("client").unique().sort().str.join(", ").alias("client"),
                   pl.col("client").n_unique().cast(pl.UInt32).alias("clients"), pl.col("client_identity").first(),
                   pl.col("metric").first(), pl.col("value").first(), pl.col("threshold").first(),
                   pl.col("unit").first(), pl.col("evidence_frames").list.explode(keep_nulls=False, empty_as_null=False).alias("evidence_frames"),
                   pl.col("_qps").list.explode(keep_nulls=False, empty_as_null=False).unique(maintain_order=True)
                   .alias("_qps"), pl.col("explanation").first().alias("_worst"))
              .with_columns(pl.col("_qps").list.len().alias("_n"))  # one QP split in time is listed once
              .with_columns(pl.format("{} QPs to {}", "_n", "server").alias("resource"),
                            pl.format("{} on {} QPs to {} (one cause at one responder: {}); the worst: {}",
                                      pl.lit(what), "_n", "server", pl.col("_qps").list.join(", "), "_worst")
                            .alias("explanation"))
              .drop("_worst", "_n"))
    return pl.concat([keep.drop("_rank", "_n"), merged.select(keep.drop("_rank", "_n").columns)], how="vertical_relaxed")


def at_resolution(facts: pl.DataFrame, tick_ns: float) -> pl.DataFrame:
    """The flows' ``rtt_ns`` never below the capture's timestamp tick (base.resolution_ns), and
    ``rtt_coarse`` where it is within RESOLUTION_TICKS ticks of it (multiples of it are then upper
    bounds: a µs pcap reads a 2 µs ACK turnaround as 1-3 ticks)."""
    tick = max(int(round(tick_ns)), 1)
    return facts.with_columns(pl.when(pl.col("rtt_ns").is_not_null()).then(pl.max_horizontal("rtt_ns", pl.lit(tick)))
                              .alias("rtt_ns"),
                              (pl.col("rtt_ns") < RESOLUTION_TICKS * tick).fill_null(False).alias("rtt_coarse"),
                              pl.lit(tick).alias("tick_ns"))


def rtt_text(rtt_ns, pairs: int, coarse: bool, tick_ns: int) -> str:
    """How the ACK turnaround was measured, for an explanation."""
    if not rtt_ns:
        return "no ACK turnaround measured (no request/ACK pair captured)"
    text = f"ACK turnaround {fmt_ns(rtt_ns)} (median of {pairs:,} request/ACK pairs)"
    if coarse:
        text += (f", within {RESOLUTION_TICKS} ticks of the capture's {fmt_ns(tick_ns)} timestamp resolution: "
                 "multiples of it are upper bounds")
    return text
