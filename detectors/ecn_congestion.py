"""RoCEv2 congestion: CE marks and CNPs per destination and flow (DCQCN) — sustained, incast, CNPs ignored.

The pathology
    RoCEv2 runs on a lossless class: a switch queue that fills pauses the upstream port (PFC)
    instead of dropping. Congestion control keeps it from getting there: a switch egress queue above
    Kmin marks ECN-capable packets Congestion Experienced (RFC 3168 §5, RED-style as DCQCN
    configures it), the receiving NIC (notification point) answers CE with a CNP (BTH opcode 0x81,
    IBA vol. 1 Annex A17.9) to the sending QP at most once per CNP interval (typically 50 µs), and
    the sender's rate limiter (reaction point) cuts its rate on every CNP (DCQCN, Zhu et al.,
    SIGCOMM 2015). Three things go wrong:

    - ``sustained``: a destination whose packets keep arriving CE-marked for many CNP intervals
      (one or two senders: a slow receiver, an oversubscribed path);
    - ``incast``: many senders converging on one destination (fan-in N -> 1) with a high CE share:
      the receiver's link is the bottleneck (RoCE incast: storage reads, all-to-one collectives);
    - ``cnp_no_slowdown``: a flow keeps receiving CNPs while its packets stay CE-marked (~100 %)
      and its packet rate on the wire does not fall: the sender does not react (DCQCN disabled or
      misconfigured on its NIC), so congestion control is open-loop and PFC does the work, pausing
      whole ports (the storms of Guo et al., SIGCOMM 2016).

What is measured (columns of ``rocev2_packets``; ``rocev2_flows`` says which directions exist)
    The ECN-capable packets (ECT(0), ECT(1) or CE; not CNPs) to each destination address are cut in
    ``window_ns`` windows (from the first RoCEv2 packet; never shorter than the timestamp tick). A
    window is congested when at least ``min_ce_share`` of them and ``min_ce_packets`` are CE.
    Congested windows of one destination at most ``episode_gap_ns`` apart are one episode; its
    congested time is (congested windows) x ``window_ns``. An episode is reported from
    ``min_congested_ns``. Its CE share and its senders are read over its congested windows: the
    senders are the source addresses with at least ``min_ce_share`` of their packets CE-marked there:
    ``incast_min_senders`` or more make it an ``incast``, fewer a ``sustained`` congestion (one
    finding per episode either way, listing its senders and their CE shares).

    CNPs (from the receiver to the sender, same QP pair) to one flow's sender less than
    ``cnp_gap_ns`` apart form a CNP run. A run shows no slowdown when it has at least
    ``no_slowdown_min_cnps`` CNPs (a DCQCN reaction point at its initial alpha halves its rate on
    each: ten are a thousand-fold cut), the flow's packets between its first and last CNP are at
    least ``no_slowdown_ce_share`` CE-marked, and the flow's packet rate over the run is at least
    ``no_slowdown_rate_ratio`` times its rate in the ``rate_window_ns`` before the first CNP (not
    judged, and said, when fewer than two packets precede it). Such runs into one destination that
    overlap are one ``cnp_no_slowdown`` finding listing the senders. It explains (``EXPLAINS``) the
    incast or sustained finding at the same destination that starts inside it: that one becomes its
    member, so one cause is one top-level finding.

    The classification parameters (``incast_min_senders`` and the ``no_slowdown_*`` ones) have no
    gate: moving them relabels a finding between kinds.

What a mirror cannot show
    Traffic is seen at a switch mirror or NIC sniffer, not the DMA: the sender's rate limiter
    (DCQCN's Rc, alpha) and the switch queue are not on the wire. The packet rate is the rate *on
    the wire where the capture was taken*: when the observed link is itself the bottleneck the
    rate there cannot fall below the link's fair share whatever the sender does, so a working
    reaction point shows as the CE share falling, not as the rate. CE says *some* queue on the path
    was above Kmin; when many senders converge on one destination it is most likely the egress
    towards it. The load the senders *offered* is not on the wire either, only what was delivered: the
    explanation gives the payload rate delivered to the destination (and its share of the link when
    the capture interface declares its speed). Without the reverse direction (receiver -> sender)
    CNPs are invisible: the finding says "direction missing" and cnp_no_slowdown is not judged.

Severity rule
    incast and sustained: low once reported; medium from ``medium_congested_ns`` of congested time,
    high from ``high_congested_ns``, critical from ``critical_congested_ns`` — but at most low when
    the episode begins right after the link to the destination was silent for at least
    ``pause_silence_ns`` while its senders had been sending to it before: a queue released after a
    pause (see pfc_storm), not fan-in above the link rate.
    cnp_no_slowdown: high (congestion control is not working; PFC takes over), critical from
    ``critical_congested_ns`` of CNP run.

Known false positives
    A reaction point whose alpha has decayed after a long quiet period cuts little per CNP and may
    look unresponsive for its first CNPs (it is, in effect). Bursts that the receiver's link cannot
    absorb by design (a synchronised all-to-one) are incasts, which they are. A periodic incast on
    established QPs after an idle gap of ``pause_silence_ns`` is capped at low like a released pause.

References: RFC 3168 §5 (ECN codepoints); IBA vol. 1 Annex A17.9 (RoCEv2 CNP); Zhu et al.,
"Congestion Control for Large-Scale RDMA Deployments" (DCQCN), SIGCOMM 2015; Guo et al., "RDMA over
Commodity Ethernet at Scale", SIGCOMM 2016.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.decoders import rocev2_layout as L

from .base import NS_PER_MS, at_least_resolution, findings, fmt_ns, fmt_number, optional_frame
from .params import LOWER, UPPER, param

NAME = "ecn_congestion"
KINDS = ("incast", "cnp_no_slowdown", "sustained")
REQUIRES = ("rocev2_packets", "rocev2_flows", "interfaces")
ORDER = 90  # where it runs and is listed (detectors/__init__.py)
# senders that ignore CNPs are the cause of the congestion at their destination: the incast or
# sustained finding there that begins inside the cnp_no_slowdown finding becomes its member
EXPLAINS = {"cnp_no_slowdown": {"service": "resource", "detector": NAME, "kinds": ("incast", "sustained"),
                                "member_service": "resource"}}

CE = 3  # RFC 3168 §5 codepoints: 0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE
ECN_CAPABLE = (1, 2, 3)
NAMED_SENDERS = 8  # senders named with their CE share in an explanation (then "and N more")


@dataclass(frozen=True)
class Params:
    """Windows and thresholds of the RoCEv2 congestion detector."""

    window_ns: int = param(50_000, "CE share is measured per destination in windows this long (the common "
                                   "DCQCN CNP interval)", unit="ns", lo=1)
    min_ce_share: float = param(0.1, "a window is congested when this share of the ECN-capable packets to the "
                                     "destination is CE-marked; a sender counts in an episode at this share",
                                unit="share", gate=LOWER, lo=0.0, hi=1.0)
    min_ce_packets: int = param(5, "... and at least this many are CE-marked", unit="packets", gate=LOWER, lo=1)
    episode_gap_ns: int = param(500_000, "congested windows of one destination at most this apart are one "
                                         "episode", unit="ns", lo=0)
    min_congested_ns: int = param(100_000, "report an episode from this much congested time (low)", unit="ns",
                                  gate=LOWER, lo=0)
    medium_congested_ns: int = param(250_000, "medium from this much congested time (5 CNP intervals)",
                                     unit="ns", gate=LOWER, lo=0)
    high_congested_ns: int = param(2_000_000, "high from this much", unit="ns", gate=LOWER, lo=0)
    critical_congested_ns: int = param(50_000_000, "critical from this much (also for cnp_no_slowdown runs)",
                                       unit="ns", gate=LOWER, lo=0)
    pause_silence_ns: int = param(500_000, "at most low when the episode follows a silence of the link to the "
                                           "destination this long while its senders had sent before (a queue "
                                           "released after a pause)", unit="ns", gate=UPPER, lo=0)
    incast_min_senders: int = param(3, "an episode with this many senders at min_ce_share is an incast, with "
                                       "fewer a sustained congestion (classification: no gate)", unit="senders",
                                    lo=2)
    cnp_gap_ns: int = param(200_000, "CNPs to one flow's sender less than this apart are one run (4 CNP "
                                     "intervals)", unit="ns", lo=1)
    no_slowdown_min_cnps: int = param(10, "cnp_no_slowdown: CNPs in the run at least (classification)",
                                      unit="CNPs", lo=1)
    no_slowdown_ce_share: float = param(0.9, "... the flow's CE share between its first and last CNP at least "
                                             "(classification)", unit="share", lo=0.0, hi=1.0)
    no_slowdown_rate_ratio: float = param(0.8, "... and its packet rate over the run at least this times its rate "
                                               "before the first CNP (classification)", unit="ratio", lo=0.0)
    rate_window_ns: int = param(100_000, "the rate before the first CNP is measured over this window (clipped to "
                                         "the flow's first packet)", unit="ns", lo=1)


# -- the columns every step reads ---------------------------------------------------------------------

def _addresses(packets: pl.DataFrame) -> tuple[pl.Expr, pl.Expr]:
    """src and dst as they are (the decoder's one address Enum: cheap to group and join on), or as
    strings when the two columns do not share a type."""
    if packets.schema["src"] == packets.schema["dst"]:
        return pl.col("src"), pl.col("dst")
    return pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String)


def marked_packets(packets: pl.DataFrame) -> pl.DataFrame:
    """The ECN-capable RoCEv2 packets other than CNPs: frame, ts_ns, src, dst, qp_pair, payload_len,
    ce (bool)."""
    src, dst = _addresses(packets)
    return (packets.filter(pl.col("ecn").is_in(ECN_CAPABLE) & (pl.col("opcode") != L.CNP)
                           & pl.col("ts_ns").is_not_null() & pl.col("dst").is_not_null())
            .select("frame", "ts_ns", src, dst, "qp_pair", pl.col("payload_len").fill_null(0).cast(pl.Int64),
                    (pl.col("ecn") == CE).alias("ce")))


def cnp_packets(packets: pl.DataFrame) -> pl.DataFrame:
    """The CNPs: frame, ts_ns, qp_pair, ``sender`` (the QP they notify: the CNP's destination) and
    ``receiver`` (the notification point: its source)."""
    src, dst = _addresses(packets)
    return (packets.filter((pl.col("opcode") == L.CNP) & pl.col("ts_ns").is_not_null())
            .select("frame", "ts_ns", "qp_pair", dst.alias("sender"), src.alias("receiver")))


def window_shares(marked: pl.DataFrame, window_ns: int, t0_ns: int, by: tuple[str, ...] = ("dst",)) -> pl.DataFrame:
    """Per ``by`` and window: ``bin``, ``start_ns``, ``packets``, ``ce`` and ``share`` (CE / ECN-capable)."""
    return (marked.group_by(*by, ((pl.col("ts_ns") - t0_ns) // window_ns).alias("bin"))
            .agg(pl.len().alias("packets"), pl.col("ce").sum().cast(pl.UInt32).alias("ce"))
            .with_columns((pl.col("ce") / pl.col("packets")).alias("share"),
                          (t0_ns + pl.col("bin") * window_ns).alias("start_ns"))
            .sort(*by, "bin"))


def congested_windows(shares: pl.DataFrame, p: Params) -> pl.DataFrame:
    """The rows of :func:`window_shares` that are congested (``min_ce_share`` and ``min_ce_packets``)."""
    return shares.filter((pl.col("share") >= p.min_ce_share) & (pl.col("ce") >= p.min_ce_packets))


def episodes(shares: pl.DataFrame, p: Params, window_ns: int) -> pl.DataFrame:
    """Congested windows grouped into episodes per destination: dst, episode, first_bin, last_bin,
    bins (congested windows), congested_ns."""
    gap_bins = p.episode_gap_ns // window_ns
    new = ((pl.col("bin") - pl.col("bin").shift(1).over("dst")) > gap_bins + 1).fill_null(True)
    return (congested_windows(shares, p).with_columns(new.cum_sum().over("dst").alias("episode"))
            .group_by("dst", "episode")
            .agg(pl.col("bin").min().alias("first_bin"), pl.col("bin").max().alias("last_bin"),
                 pl.len().alias("bins"))
            .with_columns((pl.col("bins") * window_ns).alias("congested_ns"))
            .sort("dst", "first_bin"))


def cnp_runs(cnps: pl.DataFrame, p: Params) -> pl.DataFrame:
    """CNPs to one flow's sender (qp_pair, sender, receiver) less than ``cnp_gap_ns`` apart, as runs:
    run, cnps, first_cnp_ns, last_cnp_ns, cnp_frames."""
    key = ["qp_pair", "sender", "receiver"]
    return (cnps.sort(*key, "ts_ns")
            .with_columns(((pl.col("ts_ns") - pl.col("ts_ns").shift(1).over(key)) >= p.cnp_gap_ns)
                          .fill_null(True).cum_sum().over(key).alias("run"))
            .group_by(*key, "run")
            .agg(pl.len().alias("cnps"), pl.col("ts_ns").min().alias("first_cnp_ns"),
                 pl.col("ts_ns").max().alias("last_cnp_ns"), pl.col("frame").alias("cnp_frames"))
            .sort(*key, "first_cnp_ns"))


def flow_reactions(marked: pl.DataFrame, runs: pl.DataFrame, p: Params) -> pl.DataFrame:
    """Per CNP run, what the flow did: packets, CE share and packet rate between its first and last
    CNP, its rate in the ``rate_window_ns`` before the first CNP, the first CE mark that led to it
    (``start_ns``: the first within ``cnp_gap_ns`` before the first CNP), its CE-marked frames, and
    ``no_slowdown`` (the classification). Packets are matched to runs by as-of joins (no product)."""
    if runs.height == 0:
        return runs.with_columns(pl.lit(None, pl.Boolean).alias("no_slowdown"))
    key = ["qp_pair", "sender", "receiver"]
    flows = marked.rename({"src": "sender", "dst": "receiver"})
    ivals = runs.select(*key, "run", "first_cnp_ns", "last_cnp_ns",
                        (pl.col("first_cnp_ns") - p.rate_window_ns).alias("before_ns"),
                        (pl.col("first_cnp_ns") - 1).alias("just_before_ns"),
                        (pl.col("first_cnp_ns") - p.cnp_gap_ns).alias("lead_ns"))
    during = (_in_intervals(flows, "ts_ns", key, ivals, "run", "first_cnp_ns", "last_cnp_ns")
              .group_by(*key, "run")
              .agg(pl.len().alias("packets_during"), pl.col("ce").sum().alias("ce_during"),
                   pl.col("payload_len").cast(pl.Int64).sum().alias("bytes_during"),
                   pl.col("frame").filter(pl.col("ce")).alias("ce_frames")))
    before = (_in_intervals(flows, "ts_ns", key, ivals, "run", "before_ns", "just_before_ns")
              .group_by(*key, "run")
              .agg(pl.len().alias("packets_before"), pl.col("ts_ns").min().alias("before_first"),
                   pl.col("ts_ns").max().alias("before_last"),
                   pl.col("payload_len").cast(pl.Int64).sum().alias("bytes_before")))
    lead = (_in_intervals(flows.filter(pl.col("ce")), "ts_ns", key, ivals, "run", "lead_ns", "last_cnp_ns")
            .group_by(*key, "run").agg(pl.col("ts_ns").min().alias("start_ns")))
    out = (runs.join(during, on=[*key, "run"], how="left", nulls_equal=True)
           .join(before, on=[*key, "run"], how="left", nulls_equal=True)
           .join(lead, on=[*key, "run"], how="left", nulls_equal=True)
           .with_columns(pl.col("packets_during", "ce_during", "packets_before").fill_null(0)))
    span = (pl.col("last_cnp_ns") - pl.col("first_cnp_ns")).clip(lower_bound=1)
    # n packets before the first CNP: n - 1 gaps from the first to the last of them
    before_span = (pl.col("before_last") - pl.col("before_first")).clip(lower_bound=1)
    gaps = (pl.col("packets_before") - 1) / pl.col("packets_before")
    out = out.with_columns(
        (pl.col("ce_during") / pl.col("packets_during")).alias("ce_share"),
        (pl.col("packets_during") / span * 1e9).alias("rate_pps"),
        (pl.col("bytes_during") * 8 / span).alias("gbps"),
        pl.when(pl.col("packets_before") >= 2).then((pl.col("packets_before") - 1) / before_span * 1e9)
        .alias("rate_before_pps"),
        pl.when(pl.col("packets_before") >= 2).then(pl.col("bytes_before") * gaps * 8 / before_span)
        .alias("gbps_before"),
        pl.coalesce("start_ns", "first_cnp_ns").alias("start_ns"))
    ratio = pl.col("rate_pps") / pl.col("rate_before_pps")
    return out.with_columns(ratio.alias("rate_ratio"), (
        (pl.col("cnps") >= p.no_slowdown_min_cnps) & (pl.col("ce_share") >= p.no_slowdown_ce_share)
        & (ratio.is_null() | (ratio >= p.no_slowdown_rate_ratio))).fill_null(False).alias("no_slowdown"))


def link_bps(capture) -> int | None:
    """The capture interfaces' link speed (pcapng if_speed, ``interfaces.speed_bps``) when they all
    declare the same one; None otherwise."""
    iface = optional_frame(capture, "interfaces", nonempty=True)
    if iface is None or "speed_bps" not in iface.columns:
        return None
    speeds = iface["speed_bps"].drop_nulls().unique()
    return int(speeds[0]) if speeds.len() == 1 and speeds[0] > 0 else None


def missing_directions(flows: pl.DataFrame | None) -> set[tuple[str, str]]:
    """(src, dst) address pairs with RoCEv2 traffic one way and none the other way in the capture
    (``rocev2_flows``): their CNPs and ACKs are not visible."""
    if flows is None or flows.height == 0:
        return set()
    f = flows.select(pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String)).unique()
    rev = f.select(pl.col("dst").alias("src"), pl.col("src").alias("dst"))
    return set(f.join(rev, on=["src", "dst"], how="anti").iter_rows())


# -- the findings ------------------------------------------------------------------------------------------

def _senders_text(per: pl.DataFrame) -> str:
    """``10.1.0.2 87 %, 10.1.0.3 85 % ...`` (worst first) for ``per``: sender, share."""
    rows = per.sort("share", "sender", descending=[True, False]).iter_rows(named=True)
    parts = [f"{r['sender']} {r['share'] * 100:.0f} %" for r in rows]
    more = f" and {len(parts) - NAMED_SENDERS} more" if len(parts) > NAMED_SENDERS else ""
    return ", ".join(parts[:NAMED_SENDERS]) + more


def _pct(x) -> str:
    return "?" if x is None else f"{float(x) * 100:.0f} %"


def _gbps(x) -> str:
    return "?" if x is None else f"{fmt_number(float(x))} Gb/s"


def _mirror_note(dst: str, senders: list[str], missing: set[tuple[str, str]]) -> str:
    gone = [s for s in senders if (s, dst) in missing]  # sender -> dst seen, dst -> sender not
    note = ("Seen at a mirror/NIC sniffer, not the DMA: the senders' rate limiters and the switch queue are not on "
            "the wire")
    if gone:
        note += (f"; direction {dst} -> {', '.join(gone[:NAMED_SENDERS])} missing from the capture: their CNPs "
                 f"cannot be seen, so whether they slowed down is not judged")
    return note + "."


def _severity(congested_ns: int, p: Params) -> str:
    if congested_ns >= p.critical_congested_ns:
        return "critical"
    if congested_ns >= p.high_congested_ns:
        return "high"
    return "medium" if congested_ns >= p.medium_congested_ns else "low"


def _in_intervals(events: pl.DataFrame, ts: str, by: str | list[str], intervals: pl.DataFrame, key: str, start: str,
                  end: str) -> pl.DataFrame:
    """``events`` tagged with the interval (``key``) of ``intervals`` (per ``by``, non-overlapping,
    ``start``..``end``) that holds their ``ts``; events in none are dropped. An as-of join: no product."""
    by = [by] if isinstance(by, str) else list(by)
    right = intervals.select(*by, key, pl.col(start).alias("_a"), pl.col(end).alias("_b")).sort("_a")
    return (events.sort(ts).join_asof(right, left_on=ts, right_on="_a", by=by, strategy="backward",
                                      check_sortedness=False)
            .filter(pl.col(key).is_not_null() & (pl.col(ts) <= pl.col("_b"))).drop("_a", "_b"))


def _episode_table(a: dict, p: Params) -> pl.DataFrame:
    """One row per reported episode: its windows, CE counts over its congested windows, senders
    (with their shares), CNPs back to them, the first CNP run's reaction and the silence before it."""
    window_ns, t0 = a["window_ns"], a["t0_ns"]
    eps = a["episodes"].filter(pl.col("congested_ns") >= p.min_congested_ns)
    if eps.height == 0:
        return eps
    congested = congested_windows(a["shares"], p).select("dst", "bin")
    m = a["marked"].with_columns(((pl.col("ts_ns") - t0) // window_ns).alias("bin"))
    tagged = (_in_intervals(m, "bin", "dst", eps, "episode", "first_bin", "last_bin")
              .join(congested, on=["dst", "bin"], how="semi"))
    per_sender = (tagged.group_by("dst", "episode", pl.col("src").alias("sender"))
                  .agg(pl.len().alias("n"), pl.col("ce").sum().alias("n_ce"))
                  .with_columns((pl.col("n_ce") / pl.col("n")).alias("share"))
                  .filter((pl.col("share") >= p.min_ce_share) & (pl.col("n_ce") >= 1))
                  .sort("dst", "episode", "share", "sender", descending=[False, False, True, False])
                  .group_by("dst", "episode", maintain_order=True)
                  .agg(pl.col("sender").alias("senders"), pl.col("share").alias("shares")))
    stats = (tagged.group_by("dst", "episode")
             .agg(pl.len().alias("packets"), pl.col("ce").sum().alias("ce"),
                  pl.col("ts_ns").filter(pl.col("ce")).min().alias("start_ns"),
                  pl.col("ts_ns").filter(pl.col("ce")).max().alias("end_ns"),
                  pl.col("ts_ns").min().alias("first_ns"), pl.col("ts_ns").max().alias("last_ns"),
                  pl.col("payload_len").cast(pl.Int64).sum().alias("bytes"),
                  pl.col("frame").filter(pl.col("ce")).alias("ce_frames")))
    # the link to the destination just before the episode: its last packet, and who had been sending
    prev = (m.select("dst", "src", "ts_ns")
            .join_asof(stats.select("dst", "episode", "first_ns").sort("first_ns"), left_on="ts_ns",
                       right_on="first_ns", by="dst", strategy="forward", allow_exact_matches=False,
                       check_sortedness=False)
            .filter(pl.col("episode").is_not_null())
            .group_by("dst", "episode").agg(pl.col("ts_ns").max().alias("prev_ns"),
                                            pl.col("src").unique().alias("prev_senders")))
    ivals = stats.select(pl.col("dst").alias("receiver"), "episode", "start_ns",
                         (pl.col("end_ns") + p.cnp_gap_ns).alias("until_ns"))
    cnps = (_in_intervals(a["cnps"], "ts_ns", "receiver", ivals, "episode", "start_ns", "until_ns")
            .group_by(pl.col("receiver").alias("dst"), "episode")
            .agg(pl.len().alias("cnps"), pl.col("frame").alias("cnp_frames")))
    rx = a["reactions"]
    first = (_in_intervals(rx.select("receiver", "sender", "first_cnp_ns", "cnps", "ce_share", "gbps",
                                     "gbps_before"), "first_cnp_ns", "receiver",
                           ivals.with_columns(pl.col("until_ns") - p.cnp_gap_ns), "episode", "start_ns", "until_ns")
             .sort("first_cnp_ns").group_by(pl.col("receiver").alias("dst"), "episode", maintain_order=True)
             .agg(pl.all().exclude("receiver").first().name.prefix("first_"))
             if rx.height else None)
    out = (eps.join(stats, on=["dst", "episode"]).join(prev, on=["dst", "episode"], how="left")
           .join(per_sender, on=["dst", "episode"], how="left").join(cnps, on=["dst", "episode"], how="left"))
    if first is not None:
        out = out.join(first, on=["dst", "episode"], how="left")
    return out.sort("dst", "first_bin")


def _with_evidence(rows: list[dict], table: pl.DataFrame, columns: tuple[str, str]) -> pl.DataFrame | None:
    """The findings ``rows`` (one per row of ``table``, in its order) with their evidence frames: the
    two list columns of ``table`` concatenated, never turned into Python objects."""
    if not rows:
        return None
    ev = table.select(pl.concat_list(pl.col(c).fill_null(pl.lit([], pl.List(pl.UInt32))).cast(pl.List(pl.UInt32))
                                     for c in columns).alias("evidence_frames"))
    return pl.DataFrame(rows, schema_overrides={"clients": pl.UInt32, "start_ns": pl.Int64, "end_ns": pl.Int64}) \
        .with_columns(ev["evidence_frames"])


def _episode_rows(a: dict, p: Params) -> pl.DataFrame | None:
    """One incast / sustained finding per reported episode (its CE shares over its congested windows)."""
    table = _episode_table(a, p)
    window_ns, limited, missing = a["window_ns"], a["limited"], a["missing"]
    rows = []
    for e in table.drop("ce_frames", "cnp_frames", strict=False).iter_rows(named=True):
        dst, names = e["dst"], list(e["senders"] or [])
        kind = "incast" if len(names) >= p.incast_min_senders else "sustained"
        start, end = int(e["start_ns"]), int(e["end_ns"])
        span = max(e["last_ns"] - e["first_ns"], 1)
        severity = _severity(e["congested_ns"], p)
        silence = None if e["prev_ns"] is None else e["first_ns"] - e["prev_ns"]
        released = (silence is not None and silence >= p.pause_silence_ns
                    and bool(set(e["prev_senders"] or []) & set(names)))
        if released:
            severity = "low"
        per = pl.DataFrame({"sender": names, "share": list(e["shares"] or [])},
                           schema={"sender": pl.String, "share": pl.Float64})
        link = a["link_bps"]
        text = (f"{'incast' if kind == 'incast' else 'sustained congestion'}: {len(names)} sender(s) -> {dst}, "
                f"{e['ce'] / e['packets'] * 100:.0f} % of its {e['packets']:,} ECN-capable packets CE-marked in "
                f"{e['bins']} congested {fmt_ns(window_ns)} windows over {fmt_ns(end - start)}"
                f"{' (widened to the timestamp tick)' if limited else ''}; per sender: {_senders_text(per)}; "
                f"{e['cnps'] or 0} CNP(s) from {dst} back to the senders; {_gbps(e['bytes'] * 8 / span)} of RDMA "
                f"payload delivered to {dst} meanwhile"
                + (f" ({e['bytes'] * 8e9 / span / link:.0%} of the {_gbps(link / 1e9)} capture link)" if link else ""))
        if e.get("first_sender") is not None:
            text += (f"; {e['first_sender']}'s rate {_gbps(e['first_gbps_before'])} before its first CNP, "
                     f"{_gbps(e['first_gbps'])} while CNPs kept coming ({e['first_cnps']} CNPs, "
                     f"{_pct(e['first_ce_share'])} CE)")
        if released:
            text += (f"; capped at low: the link to {dst} was silent for {fmt_ns(silence)} just before while these "
                     f"senders had been sending to it: a queue released after a pause (see pfc_storm), not fan-in")
        text += ". " + _mirror_note(dst, names, missing)
        rows.append({"kind": kind, "severity": severity, "start_ns": start, "end_ns": end,
                     "client": names[0] if len(names) == 1 else None, "server": dst, "resource": dst,
                     "clients": len(names), "client_identity": "address", "metric": "congested_ms",
                     "value": e["congested_ns"] / NS_PER_MS, "threshold": p.min_congested_ns / NS_PER_MS, "unit": "ms",
                     "explanation": text})
    return _with_evidence(rows, table, ("ce_frames", "cnp_frames"))


def _no_slowdown_rows(a: dict, p: Params) -> pl.DataFrame | None:
    """One cnp_no_slowdown finding per destination and overlapping set of unresponsive CNP runs."""
    reactions, missing = a["reactions"], a["missing"]
    bad = reactions.filter(pl.col("no_slowdown")) if reactions.height else reactions
    if bad.height == 0:
        return None
    bad = bad.sort("receiver", "start_ns").with_columns(
        (pl.col("start_ns") > pl.col("last_cnp_ns").cum_max().shift(1).over("receiver")).fill_null(True)
        .cum_sum().over("receiver").alias("group"))
    groups = (bad.group_by("receiver", "group")
              .agg(pl.col("start_ns").min(), pl.col("last_cnp_ns").max().alias("end_ns"),
                   pl.col("sender").unique().sort().alias("senders"), pl.col("cnps").sum().alias("total_cnps"),
                   pl.col("cnps").min().alias("min_cnps"), pl.col("gbps_before").median().alias("before"),
                   pl.col("gbps").median().alias("during"),
                   pl.col("ce_frames").list.explode(keep_nulls=False, empty_as_null=False).alias("ce"),
                   pl.col("cnp_frames").list.explode(keep_nulls=False, empty_as_null=False).alias("cnp"))
              .sort("receiver", "start_ns"))
    shares = (bad.group_by("receiver", "group", "sender")
              .agg((pl.col("ce_during").sum() / pl.col("packets_during").sum()).alias("share")))
    talkers = (_in_intervals(a["marked"].select(pl.col("dst").alias("receiver"), "src", "ts_ns"), "ts_ns", "receiver",
                             groups, "group", "start_ns", "end_ns")
               .group_by("receiver", "group").agg(pl.col("src").unique().alias("talkers")))
    groups = groups.join(talkers, on=["receiver", "group"], how="left")
    rows = []
    by_group = shares.partition_by(["receiver", "group"], as_dict=True)
    for g in groups.drop("ce", "cnp").iter_rows(named=True):
        dst, names = g["receiver"], list(g["senders"])
        start, end = int(g["start_ns"]), int(g["end_ns"])
        per = by_group[(dst, g["group"])]
        others = sorted(set(g["talkers"] or []) - set(names))
        rate = (f"their rate on the wire {_gbps(g['before']) if g['before'] is not None else 'not measurable'} "
                f"before the first CNP and {_gbps(g['during'])} while the CNPs kept coming (median per sender)")
        sev = "critical" if end - start >= p.critical_congested_ns else "high"
        text = (f"CNPs without slowdown: {len(names)} sender(s) -> {dst} received {g['total_cnps']} CNPs over "
                f"{fmt_ns(end - start)} (at least {g['min_cnps']} each) while {_senders_text(per)} of their packets "
                f"stayed CE-marked; {rate}: their reaction points do not cut the rate (DCQCN off or misconfigured), "
                f"congestion control is left to PFC"
                + (f"; {len(others)} other sender(s) to {dst} meanwhile" if others else "")
                + ". The rate is the one on the wire where the capture was taken (where the link is the bottleneck it "
                  "cannot fall below the fair share); the CE share staying ~1 is what shows they did not slow down. "
                + _mirror_note(dst, names, missing))
        rows.append({"kind": "cnp_no_slowdown", "severity": sev, "start_ns": start, "end_ns": end,
                     "client": names[0] if len(names) == 1 else None, "server": dst, "resource": dst,
                     "clients": len(names), "client_identity": "address", "metric": "cnps_without_slowdown",
                     "value": float(g["min_cnps"]), "threshold": float(p.no_slowdown_min_cnps), "unit": "CNPs",
                     "explanation": text})
    return _with_evidence(rows, groups, ("ce", "cnp"))


def analyse(capture, params: Params = Params()) -> dict:
    """The detector's intermediate frames (for the proof chart): marked, cnps, t0_ns, window_ns,
    limited, shares (per destination), episodes, runs, reactions, missing. None without RoCEv2."""
    packets = optional_frame(capture, "rocev2_packets", nonempty=True)
    if packets is None or "ecn" not in packets.columns:
        return None
    window_ns, limited = at_least_resolution(params.window_ns, capture)
    marked, cnps = marked_packets(packets), cnp_packets(packets)
    if marked.height == 0:
        return None
    t0 = int(packets["ts_ns"].min())
    shares = window_shares(marked, window_ns, t0)
    runs = cnp_runs(cnps, params)
    return {"marked": marked, "cnps": cnps, "t0_ns": t0, "window_ns": window_ns, "limited": limited,
            "shares": shares, "episodes": episodes(shares, params, window_ns), "runs": runs,
            "reactions": flow_reactions(marked, runs, params),
            "missing": missing_directions(optional_frame(capture, "rocev2_flows")),
            "link_bps": link_bps(capture)}


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    a = analyse(capture, params)
    if a is None:
        return findings(pl.DataFrame(), detector=NAME, params=params)
    parts = [f for f in (_episode_rows(a, params), _no_slowdown_rows(a, params)) if f is not None]
    if not parts:
        return findings(pl.DataFrame(), detector=NAME, params=params)
    return findings(pl.concat(parts, how="diagonal_relaxed"), detector=NAME, params=params)
