"""RoCEv2 go-back-N: PSNs resent after a NAK (sequence error) or an ACK timeout, per PSN lost.

The pathology
    A reliable-connected (RC) RoCEv2 queue pair has no selective repeat: when the responder sees a
    PSN gap it sends one NAK "PSN sequence error" (AETH syndrome 0x60, IBA vol. 1 §9.7.5.2.1) and drops
    everything until the missing PSN comes back, and the requester goes back N to the NAKed PSN and
    resends everything from there (§9.7.4.1.4). One lost packet costs a whole window of resends: on a
    lossy link (a flaky cable, FCS errors) with a 128-PSN window, dozens of PSNs per loss. When the
    tail of a burst is lost no later packet reveals the gap, no NAK is possible, and only the local ACK
    timer (4.096 µs × 2^timeout, §9.7.6.1.3: 67 ms at the common timeout 14) recovers: thousands of
    round trips of a few µs each, during which the QP moves nothing. After ``retry_cnt`` retries without
    progress the QP goes to the error state (§9.7.6.1.4).

What is measured (rocev2_packets; detectors/rocev2_common.py reads the flows, resends and episodes)
    Per requester -> responder direction of a QP (the capture carries only each packet's destination
    QPN; the two directions are paired by the symmetric UDP source port): a *resend* is a PSN seen
    again; a go-back-N *episode* starts where the requester steps back to a PSN it had passed and holds
    its run of resent PSNs. Its trigger: a NAK sequence error naming the episode's first PSN within
    ``nak_window_ns`` before it (kind ``nak``); an RNR NAK naming it (not go-back-N: rnr_retry's); none,
    after a silence of the QP pair of at least max(``timeout_min_ns``, ``timeout_rtts`` × RTT) (kind
    ``timeout``). A quicker resend with no NAK captured is ``nak`` too (an implicit NAK: a READ response
    PSN gap, §9.7.5.1.2, or a NAK the mirror did not see), at most low.
    Lost PSNs are not in a capture taken after the loss: the *gap* is the episode's PSNs the mirror had
    not seen before (at least 1 per NAK: a mirror upstream of the loss saw the original). Amplification
    = PSNs resent (the gap's included) / PSNs lost. RTT = the median ACK turnaround (request -> the ACK
    naming its PSN, the responder's ACK coalescing included). The timer's exponent is read from the
    silence (the t whose 4.096 µs × 2^t is nearest it, on a log scale). Retry exhausted: one PSN sent
    ``retry_cnt`` + 1 times (the original and retry_cnt retries), never acknowledged afterwards, and the
    flow ending there: in a NAK, or silent while the capture went on at least its timer's length.

Aggregation
    One finding per QP direction and trigger; episodes more than ``episode_gap_ns`` apart are separate
    findings. Where at least ``population_min_qps`` QPs to one responder have findings of one trigger
    (a lossy link in front of a host), they are one finding on that responder listing the QPs.
    Evidence: per episode, the NAK (a timeout: the QP pair's last packet before the silence), the first
    ``evidence_per_episode`` resent requests and the last.

Severity rule
    informational: no response of the QP captured (the responder -> requester direction is missing:
        NAK- and timer-driven cannot be told apart). critical: retry count exhausted.
    nak: by what go-back-N cost the QP and whether the loss repeats. The *resent share* is the PSNs
        resent over the QP direction's requests (resends included) within ``episode_gap_ns`` / 2 of
        its episodes: the goodput lost. A lossless class should lose nothing, so a loss that costs a
        share of the traffic is a link to look at even when it is the capture's only one: one loss
        resending 40 PSNs in a 2,000-request capture is 2 % of the goodput and one loss per 2,000
        packets (~1,000 losses/s at a 100 Gb/s QP's rate), while the same loss among a million
        requests is 0.004 %. High: a storm, at least ``storm_episodes`` episodes, with a resent share
        of at least ``high_resent_share`` and at least ``high_amplification`` PSNs resent per PSN lost.
        Medium: at least ``medium_amplification`` per loss, and ``storm_episodes`` episodes (a loss
        that repeats, whatever it cost) or a resent share of at least ``medium_resent_share``. Low
        otherwise (an isolated loss in a long or busy capture); at most low with no NAK captured. The
        share is a ratio of packet counts: it does not depend on the capture's length or its clock's
        resolution (the losses per second in the explanation are over the QP's requests' span, never
        less than RESOLUTION_TICKS ticks).
    timeout: by the time the QP stood still (the silences, summed), on both scales: high when at least
        ``timeout_high_ns`` and ``timeout_high_rtts`` RTTs, medium from ``timeout_medium_ns`` and
        ``timeout_medium_rtts`` RTTs, low otherwise (no RTT measured: the time scale alone).
    Nothing below ``min_resent`` resent PSNs.

What a capture cannot show
    A mirror sees the wire, not the DMA nor the send/receive queues: a loss between the mirror and the
    responder is invisible as such (the NAKed PSN was seen), the ACK timer's setting is inferred from
    the silence, and the QP's error state only from its going quiet. A burst's tail lost before the
    mirror, every PSN the mirror saw having been acknowledged, leaves no trace: the timer's resend
    starts above the last PSN seen and reads as the next send. Every explanation says what was seen.

Known false positives
    A capture that itself dropped packets (the gap is the capture's: the PSNs were resent because the
    responder NAKed, so the episode is real, but its amplification is over-stated); an application that
    goes idle with PSNs outstanding reads as a silence only when a resend follows it.

References: IBA vol. 1 rel. 1.4 §9.7.4-9.7.6 (requester, responder, ACK timer, retry_cnt), §9.7.5.2
(AETH, Table 41), Annex A17 (RoCEv2); Guo et al., "RDMA over Commodity Ethernet at Scale", SIGCOMM 2016
(go-back-N and its amplification); Linux rxe_comp.c / rxe_req.c.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from . import rocev2_common as rc
from .base import NS_PER_MS, NS_PER_S, RESOLUTION_TICKS, empty_findings, findings, fmt_ns, fmt_number, resolution_ns
from .params import LOWER, param

NAME = "gbn_retransmission"
KINDS = ("nak", "timeout")  # what triggered the go-back-N
REQUIRES = ("rocev2_packets", "interfaces")  # interfaces: resolution_ns
ORDER = 80  # where it runs and is listed (detectors/__init__.py)
ACK_TIMEOUT_BASE_NS = rc.ack_timeout_ns(1) // 2  # 4.096 µs: the ACK timer is this × 2^timeout


@dataclass(frozen=True)
class Params:
    nak_window_ns: int = param(1_000_000, "a NAK (PSN sequence error) triggers the episode whose first PSN it "
                                          "names when it came at most this long before it", unit="ns", lo=0)
    timeout_min_ns: int = param(8_192, "an episode with no NAK is timer-driven after a silence of the QP of at "
                                       "least this (IBA's shortest ACK timeout, timeout=1: 8.192 µs) ...",
                                unit="ns", lo=0)
    timeout_rtts: float = param(4.0, "... and this many ACK turnarounds", unit="RTTs", lo=0.0)
    episode_gap_ns: int = param(1_000_000_000, "episodes of one QP and trigger further apart than this are "
                                               "separate findings", unit="ns", lo=1)
    min_resent: int = param(1, "PSNs resent (per QP and trigger) before anything is reported", unit="PSNs",
                            gate=LOWER, lo=1)
    storm_episodes: int = param(3, "nak: a storm, the loss repeating: this many episodes are medium whatever "
                                   "they cost, and high needs them (one loss is an incident)", unit="episodes",
                                gate=LOWER, lo=1)
    medium_resent_share: float = param(0.005, "nak: medium from this share of the QP's requests (resends included, "
                                              "within episode_gap_ns / 2 of its episodes) being go-back-N resends: "
                                              "the goodput lost, even to one loss", unit="share", gate=LOWER,
                                       lo=0.0, hi=1.0)
    high_resent_share: float = param(0.02, "nak: high (a storm) from this resent share", unit="share", gate=LOWER,
                                     lo=0.0, hi=1.0)
    medium_amplification: float = param(4.0, "nak: medium from this many PSNs resent per PSN lost",
                                        unit="PSNs per loss", gate=LOWER, lo=0.0)
    high_amplification: float = param(16.0, "nak: high from this many PSNs resent per PSN lost",
                                      unit="PSNs per loss", gate=LOWER, lo=0.0)
    timeout_medium_ns: int = param(1_000_000, "timeout: medium when the QP stood still at least this long ...",
                                   unit="ns", gate=LOWER, lo=0)
    timeout_medium_rtts: float = param(100.0, "... and this many RTTs", unit="RTTs", gate=LOWER, lo=0.0)
    timeout_high_ns: int = param(10_000_000, "timeout: high from this long ...", unit="ns", gate=LOWER, lo=0)
    timeout_high_rtts: float = param(1000.0, "... and this many RTTs", unit="RTTs", gate=LOWER, lo=0.0)
    retry_cnt: int = param(7, "the QPs' retry_cnt (3 bits): one PSN sent retry_cnt + 1 times and never "
                              "acknowledged is a retry count exhausted (critical)", unit="retries",
                           gate=LOWER, lo=0, hi=7)
    population_min_qps: int = param(4, "QPs to one responder with findings of one trigger that are reported "
                                       "as one finding on the responder", unit="QPs", lo=2)
    evidence_per_episode: int = param(3, "evidence: resent requests kept per episode (and its last one)",
                                      unit="frames", lo=1)


def timeout_exponent(silence_ns: float) -> int | None:
    """The ACK timeout exponent t (1..31) whose 4.096 µs × 2^t is nearest ``silence_ns`` on a log scale
    (the silence is the timer give or take the path's µs: the timer armed at a transmission the
    mirror records a hop later, or at an ACK it recorded a hop earlier)."""
    if silence_ns is None or silence_ns < ACK_TIMEOUT_BASE_NS * 1.5:
        return None
    return int(min(31, max(1, round(math.log2(silence_ns / ACK_TIMEOUT_BASE_NS)))))


def classify(req: pl.DataFrame, rsp: pl.DataFrame, facts: pl.DataFrame, params: Params) -> pl.DataFrame:
    """The go-back-N episodes (rocev2_common.episodes) with ``trigger``: "nak" (a NAK named its first
    PSN, or a quick resend with no NAK: ``nak_seen`` False), "timeout", or "rnr" (an RNR NAK: not
    go-back-N). The proof chart marks resends with this."""
    ep = rc.episodes(req, rsp, params.nak_window_ns)
    if ep.height == 0:
        return ep
    ep = ep.join(facts.select(*rc.FLOW, "rtt_ns"), on=rc.FLOW, how="left")
    floor = pl.max_horizontal(pl.lit(float(params.timeout_min_ns)),
                              pl.col("rtt_ns").cast(pl.Float64).fill_null(0.0) * params.timeout_rtts)
    trigger = (pl.when(pl.col("nak_frame").is_not_null()).then(pl.lit("nak"))
               .when(pl.col("rnr_frame").is_not_null()).then(pl.lit("rnr"))
               .when(pl.col("silence_ns").fill_null(0) >= floor).then(pl.lit("timeout"))
               .otherwise(pl.lit("nak")))
    return ep.with_columns(trigger.alias("trigger"), pl.col("nak_frame").is_not_null().alias("nak_seen"))


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    pk = rc.optional_packets(capture)
    if pk is None:
        return empty_findings()
    rows = rc.rc_packets(pk)
    req, rsp = rc.requests(rows), rc.responses(rows)
    if req.height == 0:
        return empty_findings()
    facts = rc.at_resolution(rc.flow_facts(req, rsp), resolution_ns(capture))
    ep = classify(req, rsp, facts, params)
    if ep.height == 0:
        return empty_findings()
    ep = ep.filter(pl.col("trigger") != "rnr")
    if ep.height == 0:
        return empty_findings()
    k = params.evidence_per_episode
    ep = ep.with_columns(
        pl.concat_list(pl.col("frames").list.head(k), pl.col("frames").list.tail(1),
                       pl.col("nak_frame").cast(pl.UInt32).fill_null(pl.col("frame")),
                       pl.when(pl.col("trigger") == "timeout").then(pl.col("prev_frame")).otherwise(pl.col("frame"))
                       .cast(pl.UInt32)).alias("ev"),
        pl.max_horizontal(pl.col("gap"), pl.col("nak_seen").cast(pl.UInt32)).alias("lost"),
        pl.when(pl.col("trigger") == "timeout").then(pl.col("silence_ns")).otherwise(0).alias("stall_ns"),
        pl.coalesce(pl.col("nak_ts_ns"), pl.when(pl.col("trigger") == "timeout")
                    .then(pl.col("ts_ns") - pl.col("silence_ns")), pl.col("ts_ns")).alias("ep_start_ns"),
    ).sort(*rc.FLOW, "trigger", "ts_ns")
    # episodes of one flow and trigger further apart than episode_gap_ns are separate findings
    split = ((pl.col("ts_ns") - pl.col("end_ns").shift(1).over(*rc.FLOW, "trigger"))
             > params.episode_gap_ns).fill_null(False)
    ep = ep.with_columns(split.cast(pl.UInt32).cum_sum().over(*rc.FLOW, "trigger").alias("part"))
    acked = rc.acked_through(req, rsp)
    per = (ep.join(acked, on=rc.FLOW, how="left")
           .group_by(*rc.FLOW, "trigger", "part", maintain_order=True)  # ep sorted by flow, trigger, time
           .agg(pl.len().cast(pl.UInt32).alias("episodes"), pl.col("resent").sum(), pl.col("lost").sum(),
                pl.col("gap").sum().alias("gap_seen"), pl.col("nak_seen").sum().alias("naks"),
                pl.col("stall_ns").sum(), pl.col("silence_ns").max().alias("max_silence_ns"),
                pl.col("ep_start_ns").min().alias("start_ns"), pl.col("end_ns").max(),
                pl.col("ts_ns").min().alias("first_resend_ns"),
                pl.col("ev").list.explode(keep_nulls=False, empty_as_null=False).alias("evidence_frames"),
                ((pl.col("max_sends") >= params.retry_cnt + 1)
                 & (pl.col("acked_u").is_null() | (pl.col("acked_u") < pl.col("psn_u")))).any().alias("exhausted"),
                pl.col("max_sends").max())
           .filter(pl.col("resent") >= params.min_resent)
           .join(facts, on=rc.FLOW, how="left"))
    if per.height == 0:
        return empty_findings()
    # exhausted only when the flow then ended: in a NAK, or silent while the capture went on at least as
    # long as its timer (its longest silence) after its last request
    quiet = int(rows["ts_ns"].max()) - pl.col("last_ns")
    ended = ((pl.col("last_response_kind") == "nak")
             | (quiet >= pl.max_horizontal(pl.col("max_silence_ns").fill_null(0), pl.lit(params.timeout_min_ns))))
    # the QP's traffic around the episodes (parts are > episode_gap_ns apart: these windows never overlap)
    half = params.episode_gap_ns // 2
    per = rc.requests_within(req, per.with_columns((pl.col("first_resend_ns") - half).alias("lo_ns"),
                                                   (pl.col("end_ns") + half).alias("hi_ns"))).drop("lo_ns", "hi_ns")
    per = per.with_columns((pl.col("resent") / pl.col("lost").clip(lower_bound=1)).alias("amplification"),
                           (pl.col("resent") / pl.col("window_requests").clip(lower_bound=1)).alias("resent_share"),
                           # "never acknowledged" needs the responder's direction in the capture
                           (pl.col("exhausted") & ended.fill_null(False) & (pl.col("responses") > 0))
                           .alias("exhausted"))
    per = _severity(per, params)
    out = rc.merge_by_responder(_rows(per, params), params.population_min_qps, what="go-back-N")
    return findings(out.drop("_qps"), detector=NAME, params=params)


def _severity(per: pl.DataFrame, p: Params) -> pl.DataFrame:
    amp, eps, share = pl.col("amplification"), pl.col("episodes"), pl.col("resent_share")
    storm = eps >= p.storm_episodes
    nak = (pl.when(storm & (share >= p.high_resent_share) & (amp >= p.high_amplification)).then(pl.lit("high"))
           .when((storm | (share >= p.medium_resent_share)) & (amp >= p.medium_amplification)).then(pl.lit("medium"))
           .otherwise(pl.lit("low")))
    nak = pl.when(pl.col("naks") == 0).then(pl.lit("low")).otherwise(nak)
    stall = pl.col("stall_ns").cast(pl.Float64)
    rtts = stall / pl.col("rtt_ns").cast(pl.Float64)
    by_rtt = pl.col("rtt_ns").is_null() | (pl.col("rtt_ns") <= 0)
    timeout = (pl.when((stall >= p.timeout_high_ns) & (by_rtt | (rtts >= p.timeout_high_rtts))).then(pl.lit("high"))
               .when((stall >= p.timeout_medium_ns) & (by_rtt | (rtts >= p.timeout_medium_rtts))).then(pl.lit("medium"))
               .otherwise(pl.lit("low")))
    sev = (pl.when(pl.col("responses") == 0).then(pl.lit("informational"))
           .when(pl.col("exhausted")).then(pl.lit("critical"))
           .when(pl.col("trigger") == "timeout").then(timeout).otherwise(nak))
    return per.with_columns(sev.alias("severity"), rtts.alias("stall_rtts"))


def _cost_text(r: dict) -> str:
    """What the resends cost the QP: the share of its requests (a ratio of counts, whatever the capture's
    length or clock) and, for scale, the losses per second over its requests' span (never shorter than
    RESOLUTION_TICKS ticks of the capture's clock: a rate over fewer is the clock's, not the QP's)."""
    n, lost = r["window_requests"], max(int(r["lost"]), 1)
    span = max(int(r["window_span_ns"] or 0), RESOLUTION_TICKS * int(r["tick_ns"] or 1))
    return (f"the resends were {fmt_number(r['resent_share'] * 100)} % of the QP's {n:,} requests (goodput lost to "
            f"go-back-N), one loss every {fmt_number(n / lost)} requests; {lost:,} loss(es) in its {fmt_ns(span)} "
            f"of requests (~{fmt_number(lost * NS_PER_S / span)}/s)")


def _rows(per: pl.DataFrame, p: Params) -> pl.DataFrame:
    """The finding rows: resource, metric, value and the explanation (a few rows: Python is fine here)."""
    out = []
    for r in per.iter_rows(named=True):
        res = rc.resource(r["requester"], r["requester_qpn"], r["responder"], r["responder_qpn"])
        rtt = r["rtt_ns"]
        rtt_txt = rc.rtt_text(rtt, r["rtt_pairs"], r["rtt_coarse"], r["tick_ns"])
        lost_note = ("" if r["gap_seen"] >= r["lost"] else
                     f" ({r['lost'] - r['gap_seen']} of them named by a NAK although the mirror had seen that PSN: "
                     "the copy lost was a resend, the loss was after the capture point, or the packets were "
                     "reordered after it: RC has no reordering tolerance)")
        head = (f"go-back-N on {res}: {r['episodes']} episode(s), {r['resent']:,} PSNs resent for {r['lost']:,} "
                f"lost{lost_note} ({fmt_number(r['amplification'])} per loss)")
        if r["trigger"] == "timeout" and r["gap_seen"] == 0:
            head = (f"go-back-N on {res}: {r['episodes']} episode(s), {r['resent']:,} PSNs the mirror had seen were "
                    "resent (the lost packets, a burst's tail or its ACKs, were never captured: beyond the last "
                    "PSN seen, lost and new PSNs look alike)")
        if r["trigger"] == "timeout":
            t = timeout_exponent(r["max_silence_ns"])
            timer = (f", consistent with an ACK timeout of 4.096 µs × 2^{t} = {fmt_ns(rc.ack_timeout_ns(t))}"
                     if t is not None else "")
            ratio = f" = {fmt_number(r['stall_rtts'])} ACK turnarounds" if rtt else ""
            body = (f"; no NAK: the ACK timer fired after the QP stood still {fmt_ns(r['stall_ns'])}{ratio}{timer}; "
                    f"{rtt_txt}")
            metric, value, threshold, unit = ("timeout_stall_ms", r["stall_ns"] / NS_PER_MS,
                                              p.timeout_medium_ns / NS_PER_MS, "ms")
        else:
            trig = (f"; {r['naks']} NAK(s) (PSN sequence error) named the first PSN of each run" if r["naks"] else
                    "; no NAK captured before the resends (an implicit NAK, a READ response PSN gap, or a NAK "
                    "the mirror did not see)")
            body = f"{trig}; {_cost_text(r)}; {rtt_txt}"
            metric, value, threshold, unit = ("amplification", r["amplification"], p.medium_amplification,
                                              "PSNs resent per PSN lost")
        if r["exhausted"]:
            body += (f"; retry count exhausted: one PSN sent {r['max_sends']} times (retry_cnt {p.retry_cnt}) and "
                     "never acknowledged: the QP went to the error state")
        vantage = (f"; responder->requester direction missing (no ACK/NAK captured): NAK- and timer-driven "
                   f"resends cannot be told apart; {rc.MIRROR_NOTE}" if r["responses"] == 0 else f"; {rc.MIRROR_NOTE}")
        out.append({"kind": r["trigger"], "severity": r["severity"], "start_ns": r["start_ns"],
                    "end_ns": r["end_ns"], "client": r["requester"], "server": r["responder"], "resource": res,
                    "clients": 1, "client_identity": "queue pair", "metric": metric, "value": float(value),
                    "threshold": float(threshold), "unit": unit,
                    "evidence_frames": [int(f) for f in r["evidence_frames"] if f is not None],
                    "explanation": head + body + vantage, "_qps": [res]})
    return pl.DataFrame(out, schema_overrides={"evidence_frames": pl.List(pl.UInt32), "clients": pl.UInt32,
                                               "start_ns": pl.Int64, "end_ns": pl.Int64})

