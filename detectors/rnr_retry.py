"""RoCEv2 RNR NAK loops: a responder with no receive buffer posted, and the requester waiting its timer.

The pathology
    A SEND (or a WRITE with immediate) on a reliable-connected QP consumes a receive WQE the responding
    application posted. When there is none the responder answers "Receiver Not Ready": an RNR NAK, AETH
    syndrome 0x20 | timer code (IBA vol. 1 §9.7.5.2.8), and the requester waits at least the delay of
    that code (Table 45: code 12 = 0.64 ms, code 0 = 655 ms) before it sends the same PSN again,
    ``rnr_retry`` times (7 = forever). The delays are hundreds of fabric round trips of a few µs: a
    receiver that posts buffers slower than its peer sends makes the QP spend most of its time waiting,
    NAK after NAK. After ``rnr_retry`` retries the QP goes to the error state.

What is measured (rocev2_packets; detectors/rocev2_common.py pairs the directions and the RTT)
    Per requester -> responder direction of a QP: each RNR NAK (its PSN, its timer code and the code's
    delay ``rocev2.rnr_delay_ns``) and its retry, the first later request of the same PSN (an as-of join,
    no loop): the wait (retry - NAK), whether it honoured the delay (at least ``1 - delay_slack`` of it),
    the time lost (the waits, summed; a NAK with no retry captured counts the longer of its delay, which
    the requester must wait, and the time to the QP pair's last packet).
    Retries per message: RNR NAKs naming one PSN (a message's first PSN). RTT: the median ACK
    turnaround of the QP (request -> the ACK naming its PSN).

Aggregation
    One finding per QP direction (its NAKs more than ``episode_gap_ns`` apart are separate findings);
    at least ``population_min_qps`` QPs to one responder with findings are one finding on that responder
    listing the QPs (an application starving all its QPs). Evidence: the RNR NAKs and their retries.

Severity rule
    informational: no request of the QP captured (the requester -> responder direction is missing: the
        retries and their waits cannot be seen). critical: retries exhausted (``rnr_retry`` below 7 and
        one PSN NAKed more than ``rnr_retry`` times; or a NAK never retried, no request of the QP after
        its delay, and the capture going on ``gone_delays`` delays longer: the QP gave up).
    high: a loop (at least ``loop_min_naks`` RNR NAKs) that lost at least ``high_lost_ns`` and
        ``high_lost_rtts`` RTTs (no RTT measured: the time alone). medium: a loop, or at least
        ``share_min_naks`` RNR NAKs whose waits took at least ``medium_wait_share`` of the time the QP
        pair was seen (its first to last packet, within ``episode_gap_ns`` / 2 of the NAKs, never
        less than RESOLUTION_TICKS ticks; the waits as a union, cut at its last packet: pipelined
        SENDs NAKed together wait together): a requester idle for a share of its life because its
        peer posts no receive buffers, even where a short capture holds only two of the NAKs (two
        code-12 NAKs are 1.3 ms of waiting: most of a 1 ms capture, a rounding error of a 10 s one).
        low: otherwise (one NAK: a start-up race). Nothing below ``min_naks`` RNR NAKs.

What a capture cannot show
    A mirror sees the wire, not the receive queue: why no WQE was posted (a slow consumer, a missing
    ``ibv_post_recv``, an SRQ limit) is the application's; the requester's rnr_retry setting is only
    read from its giving up. Every explanation says so.

Known false positives
    A requester that retries sooner than the timer (against §9.7.5.2.8) is reported all the same, and
    said to be; start-up races (a first SEND before the peer posted) are a single NAK: low.

References: IBA vol. 1 rel. 1.4 §9.7.5.2.8 (RNR NAK), Table 45 (RNR timer field), §9.7.6.1.4 (rnr_retry),
Annex A17 (RoCEv2); Linux rxe_resp.c (``RESPST_ERR_RNR``), rxe_comp.c (``rnrnak_usec``).
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from . import rocev2_common as rc
from .base import NS_PER_MS, RESOLUTION_TICKS, empty_findings, findings, fmt_ns, fmt_number, resolution_ns
from .params import LOWER, param

NAME = "rnr_retry"
KINDS = ("rnr_loop",)
REQUIRES = ("rocev2_packets", "interfaces")  # interfaces: resolution_ns
ORDER = 81  # where it runs and is listed (detectors/__init__.py)
RETRY_INFINITE = 7  # rnr_retry 7: retry for ever (IBA §9.7.6.1.4)


@dataclass(frozen=True)
class Params:
    min_naks: int = param(1, "RNR NAKs (per QP direction) before anything is reported", unit="NAKs",
                          gate=LOWER, lo=1)
    loop_min_naks: int = param(3, "a loop (medium; high needs it) is at least this many RNR NAKs", unit="NAKs",
                               gate=LOWER, lo=1)
    share_min_naks: int = param(2, "medium by the time lost needs at least this many RNR NAKs (one is a "
                                   "start-up race) ...", unit="NAKs", gate=LOWER, lo=1)
    medium_wait_share: float = param(0.1, "... whose waits were at least this share of the time the QP pair was "
                                          "seen within episode_gap_ns / 2 of them", unit="share", gate=LOWER,
                                     lo=0.0, hi=1.0)
    high_lost_ns: int = param(1_000_000, "high: the loop cost the QP at least this much waiting ...", unit="ns",
                              gate=LOWER, lo=0)
    high_lost_rtts: float = param(100.0, "... and this many RTTs", unit="RTTs", gate=LOWER, lo=0.0)
    rnr_retry: int = param(7, "the requesters' rnr_retry (3 bits; 7 = retry for ever): one PSN NAKed more "
                              "often is retries exhausted (critical)", unit="retries", gate=LOWER, lo=0, hi=7)
    delay_slack: float = param(0.05, "a retry honours the timer when it waited at least (1 - this) x the code's "
                                     "delay (the mirror's clock and the path shave a little off)", unit="share",
                               lo=0.0, hi=1.0)
    retry_window_ns: int = param(2_000_000_000, "a NAK's retry is the next request of its PSN within this "
                                                "(longer than Table 45's longest delay, 655 ms)", unit="ns", lo=1)
    gone_delays: float = param(4.0, "a NAK never retried, with no request of the QP after its delay, while the "
                                    "capture went on this many delays longer: the requester gave up (exhausted)",
                               unit="delays", lo=1.0)
    episode_gap_ns: int = param(1_000_000_000, "NAKs of one QP further apart than this are separate findings",
                                unit="ns", lo=1)
    population_min_qps: int = param(4, "QPs to one responder with findings that are reported as one finding "
                                       "on the responder", unit="QPs", lo=2)


def nak_retries(req: pl.DataFrame, rsp: pl.DataFrame, retry_window_ns: int) -> pl.DataFrame:
    """One row per RNR NAK: FLOW, ``frame``, ``ts_ns``, ``psn``, ``timer``, ``delay_ns`` (Table 45) and
    its retry (``retry_frame``, ``retry_ts_ns``: the first later request of the same PSN, null when none
    within ``retry_window_ns``). The proof chart marks NAKs with this."""
    naks = (rsp.filter(pl.col("aeth_kind") == "rnr_nak")
            .select(*rc.FLOW, "frame", "ts_ns", "psn", pl.col("aeth_rnr_timer").alias("timer"))
            .with_columns(pl.col("timer").replace_strict(rc.RNR_DELAY_NS, default=None, return_dtype=pl.Int64)
                          .alias("delay_ns")))
    if naks.height == 0:
        return naks
    sent = req.select(*rc.FLOW, "psn", pl.col("frame").alias("retry_frame"), pl.col("ts_ns").alias("retry_ts_ns"))
    return (naks.sort("ts_ns")
            .join_asof(sent.sort("retry_ts_ns"), left_on="ts_ns", right_on="retry_ts_ns", by=[*rc.FLOW, "psn"],
                       strategy="forward", tolerance=int(retry_window_ns), allow_exact_matches=False,
                       check_sortedness=False)
            .sort(*rc.FLOW, "ts_ns"))


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    pk = rc.optional_packets(capture)
    if pk is None:
        return empty_findings()
    rows = rc.rc_packets(pk)
    req, rsp = rc.requests(rows), rc.responses(rows)
    naks = nak_retries(req, rsp, params.retry_window_ns)
    if naks.height == 0:
        return empty_findings()
    last = rows.group_by("qp_pair").agg(pl.col("ts_ns").min().alias("pair_first_ns"),
                                        pl.col("ts_ns").max().alias("pair_last_ns"))
    facts = rc.at_resolution(rc.flow_facts(req, rsp), resolution_ns(capture))
    naks = naks.join(last, on="qp_pair", how="left").sort(*rc.FLOW, "ts_ns", "frame").with_columns(
        pl.coalesce(pl.col("retry_ts_ns") - pl.col("ts_ns"),
                    pl.max_horizontal(pl.col("pair_last_ns") - pl.col("ts_ns"), "delay_ns")).clip(lower_bound=0)
        .alias("wait_ns"),
        (pl.col("retry_ts_ns") - pl.col("ts_ns") >= pl.col("delay_ns") * (1.0 - params.delay_slack)).alias("honoured"),
        pl.col("frame").cum_count().over(*rc.FLOW, "psn").alias("nth"))
    split = ((pl.col("ts_ns") - pl.col("ts_ns").shift(1).over(rc.FLOW)) > params.episode_gap_ns).fill_null(False)
    naks = naks.with_columns(split.cast(pl.UInt32).cum_sum().over(rc.FLOW).alias("part"))
    # the time the requester was waiting at all: the union of the waits (a pipelined QP's NAKed SENDs
    # wait at once), each cut at the QP pair's last packet (naks sorted by flow and time)
    until = pl.min_horizontal(pl.col("ts_ns") + pl.col("wait_ns"), "pair_last_ns")
    naks = naks.with_columns(until.alias("_until")).with_columns(
        (pl.col("_until") - pl.max_horizontal("ts_ns", pl.col("_until").cum_max().shift(1).over(*rc.FLOW, "part")))
        .clip(lower_bound=0).alias("_waiting"))
    # gave up: a NAK never retried, no request of the QP after its delay, and the capture went on for
    # gone_delays x that delay (the QP in the error state, or its application gave up)
    later = req.group_by(rc.FLOW).agg(pl.col("ts_ns").max().alias("last_req_ns"))
    capture_last = int(rows["ts_ns"].max())
    # (only where the requester's direction was captured: without it a retry cannot be seen either way)
    gave_up = (pl.col("retry_frame").is_null() & pl.col("last_req_ns").is_not_null()
               & (pl.col("last_req_ns") < pl.col("ts_ns") + pl.col("delay_ns"))
               & (pl.col("ts_ns") + pl.col("delay_ns") * params.gone_delays <= capture_last))
    per = (naks.join(later, on=rc.FLOW, how="left")
           .group_by(*rc.FLOW, "part", maintain_order=True)  # naks sorted by flow and time: deterministic
           .agg(pl.len().cast(pl.UInt32).alias("naks"), pl.col("psn").n_unique().cast(pl.UInt32).alias("messages"),
                pl.col("nth").max().cast(pl.UInt32).alias("max_per_message"),
                # the most common code (ties: the smallest, so the text is reproducible) and its own delay
                pl.col("timer").mode().min().alias("timer"),
                pl.col("timer").n_unique().alias("timers"),
                pl.col("wait_ns").sum().alias("lost_ns"), pl.col("wait_ns").median().alias("median_wait_ns"),
                pl.col("_waiting").sum().alias("waiting_ns"),
                pl.col("retry_frame").is_not_null().sum().alias("retried"),
                (pl.col("honoured") == False).sum().alias("early"),  # noqa: E712 - null (no retry) is not early
                pl.col("ts_ns").min().alias("start_ns"),
                pl.max_horizontal(pl.col("ts_ns").max(), pl.col("retry_ts_ns").max()).alias("end_ns"),
                gave_up.any().alias("stuck"),
                pl.concat_list(pl.col("frame"), pl.col("retry_frame")).list.explode(keep_nulls=False,
                                                                                   empty_as_null=False)
                .alias("evidence_frames"))
           .filter(pl.col("naks") >= params.min_naks)
           .with_columns(pl.col("timer").replace_strict(rc.RNR_DELAY_NS, default=None, return_dtype=pl.Int64)
                         .alias("delay_ns"))
           .join(facts, on=rc.FLOW, how="left"))
    if per.height == 0:
        return empty_findings()
    # the share of the QP pair's observed time (within episode_gap_ns / 2 of the NAKs: parts never
    # overlap) spent waiting; the span never below RESOLUTION_TICKS ticks of the capture's clock
    half = params.episode_gap_ns // 2
    span = (pl.min_horizontal(pl.col("end_ns") + half, "pair_last_ns")
            - pl.max_horizontal(pl.col("start_ns") - half, "pair_first_ns"))
    span = pl.max_horizontal(span, pl.col("tick_ns").fill_null(1) * RESOLUTION_TICKS)
    per = (per.join(last, on="qp_pair", how="left")
           .with_columns(span.alias("seen_ns"))
           .with_columns((pl.col("waiting_ns") / pl.col("seen_ns")).clip(upper_bound=1.0).alias("wait_share")))
    per = _severity(per, params)
    out = rc.merge_by_responder(_rows(per, params), params.population_min_qps, what="RNR NAK loop")
    return findings(out.drop("_qps"), detector=NAME, params=params)


def _severity(per: pl.DataFrame, p: Params) -> pl.DataFrame:
    lost = pl.col("lost_ns").cast(pl.Float64)
    rtts = lost / pl.col("rtt_ns").cast(pl.Float64)
    no_rtt = pl.col("rtt_ns").is_null() | (pl.col("rtt_ns") <= 0)
    loop = pl.col("naks") >= p.loop_min_naks
    starved = (pl.col("naks") >= p.share_min_naks) & (pl.col("wait_share") >= p.medium_wait_share)
    exhausted = ((pl.lit(p.rnr_retry < RETRY_INFINITE) & (pl.col("max_per_message") > p.rnr_retry))
                 | pl.col("stuck"))
    sev = (pl.when(pl.col("requests") == 0).then(pl.lit("informational"))
           .when(exhausted).then(pl.lit("critical"))
           .when(loop & (lost >= p.high_lost_ns) & (no_rtt | (rtts >= p.high_lost_rtts))).then(pl.lit("high"))
           .when(loop | starved).then(pl.lit("medium"))
           .otherwise(pl.lit("low")))
    return per.with_columns(sev.alias("severity"), rtts.alias("lost_rtts"), exhausted.alias("exhausted"))


def _rows(per: pl.DataFrame, p: Params) -> pl.DataFrame:
    """The finding rows: resource, metric, value and the explanation (a few rows: Python is fine here)."""
    out = []
    for r in per.iter_rows(named=True):
        res = rc.resource(r["requester"], r["requester_qpn"], r["responder"] or "?", r["responder_qpn"])
        rtt = r["rtt_ns"]
        delay = r["delay_ns"]
        code = (f"timer code {r['timer']} = {fmt_ns(delay)} (IBA Table 45)" if delay is not None
                else f"timer code {r['timer']}")
        if r["timers"] > 1:
            code += f", the most common of {r['timers']} codes"
        vs = (f", {fmt_number(delay / rtt)} × the QP's {fmt_ns(rtt)} ACK turnaround" if rtt and delay else
              "; no ACK turnaround measured")
        if rtt and r["rtt_coarse"]:
            vs += f" (an upper bound: {rc.rtt_text(rtt, r['rtt_pairs'], True, r['tick_ns'])})"
        text = (f"RNR NAK loop on {res}: {r['naks']} RNR NAK(s) ({code}{vs}) for {r['messages']} message(s), "
                f"up to {r['max_per_message']} per message; the requester waited {fmt_ns(r['lost_ns'])} in all "
                f"(median {fmt_ns(r['median_wait_ns'])} per NAK")
        text += (f", {fmt_number(r['lost_rtts'])} RTTs)" if rtt else ")")
        text += (f"; a NAKed request waiting during {fmt_ns(r['waiting_ns'])} of the {fmt_ns(r['seen_ns'])} the QP "
                 f"was seen ({fmt_number(r['wait_share'] * 100)} %)")
        text += ": the responder had no receive WQE posted when the SENDs arrived"
        if r["early"]:
            text += f"; {r['early']} retry(ies) came sooner than the timer's delay (the requester ignores it)"
        if r["stuck"]:
            text += ("; an RNR NAK was never retried and the QP went quiet while the capture went on: rnr_retry "
                     "exhausted (the QP in the error state) or the application gave up")
        elif r["exhausted"]:
            text += f"; one PSN NAKed {r['max_per_message']} times, more than rnr_retry {p.rnr_retry}: exhausted"
        if r["requests"] == 0:
            text += (f"; requester->responder direction missing (no request captured): the retries and their "
                     f"waits cannot be seen; {rc.MIRROR_NOTE}")
        else:
            text += f"; {rc.MIRROR_NOTE}"
        out.append({"kind": "rnr_loop", "severity": r["severity"], "start_ns": r["start_ns"], "end_ns": r["end_ns"],
                    "client": r["requester"], "server": r["responder"], "resource": res, "clients": 1,
                    "client_identity": "queue pair", "metric": "rnr_wait_ms", "value": r["lost_ns"] / NS_PER_MS,
                    "threshold": p.high_lost_ns / NS_PER_MS, "unit": "ms",
                    "evidence_frames": [int(f) for f in r["evidence_frames"] if f is not None],
                    "explanation": text, "_qps": [res]})
    return pl.DataFrame(out, schema_overrides={"evidence_frames": pl.List(pl.UInt32), "clients": pl.UInt32,
                                               "start_ns": pl.Int64, "end_ns": pl.Int64})
