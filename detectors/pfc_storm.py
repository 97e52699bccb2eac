"""PFC pause storms: a priority paused back to back on a port, and the pause spreading port to port.

A priority paused for a large share of time on a port, the pause refreshed back to back, and spreading
from port to port (head-of-line blocking propagating upstream).

The pathology
    RoCEv2 runs over a lossless Ethernet class: when a receiver's buffer for priority P fills, it
    sends an IEEE 802.1Qbb PFC frame (MAC control 0x8808, opcode 0x0101) that stops its link partner
    from sending P for ``quanta`` x 512 bit times, refreshes the pause while the buffer stays full,
    and resumes it with a quanta-0 frame. A NIC or switch that keeps pausing (a slow receiver, a
    stuck NIC, a misconfigured buffer) holds the whole priority on that link; the partner's queue then
    fills and it pauses *its* upstream ports, and so on: the storms and deadlocks of Guo et al.,
    "RDMA over Commodity Ethernet at Scale" (SIGCOMM 2016, §4: PFC pause frame storm). Every flow of
    the priority through those ports stalls, victims included.

The signal (``pause_frames``)
    * Per (port = source MAC, priority) the paused intervals: each frame pauses from its time until
      its ``paused_until`` (ts + quanta x 512 / link speed), and the next frame for the same port and
      priority replaces the timer (802.1Qbb §36.1.3.2: a quanta-0 frame resumes at once, a new XOFF
      restarts it), so a frame's pause ends at min(its expiry, the next frame). An 802.3x PAUSE
      (opcode 0x0001) pauses every priority at once: it is priority "all".
    * A *run* is a continuous pause: XOFFs each arriving before the previous one expired (a
      *back-to-back refresh*); the longest run, its refreshes, and the largest share of time paused
      in any ``share_window_ns`` (the whole capture when it is shorter) — paused time clipped to the
      capture's end.
    * ``pause_storm``: a port and priority whose longest run holds at least ``min_back_to_back``
      refreshes, or that was paused at least ``min_paused_share`` of a window.
    * ``pause_spreading``: a port *joins* when its first pause of P arrives while another port had
      been paused on P continuously for at least ``min_spread_lag_ns`` (a hop's queue filling behind a
      paused link; ports that start together, within the lag, are one congestion event such as an
      incast, not a spread). A port whose first frame comes sooner after the capture's start than the
      pause it asks for may be refreshing a pause begun before the capture: it does not join (a
      mirror started mid-storm shows no spread). The joined ports and the ports they joined under,
      in order of first pause, from ``spread_min_ports`` on: one finding for the priority, ``server``
      the port that paused first, ``client`` the ports it spread to in order. The ports' own
      ``pause_storm`` findings are its members (``member_of``): one cause, one top-level finding.

References: IEEE 802.1Qbb-2011 (PFC; §36.1.3 the pause timer), IEEE 802.3 Annex 31B (PAUSE, the
quantum of 512 bit times); Guo et al., SIGCOMM 2016 (§4.3 PFC pause storms, §4.2 deadlock); Zhu et
al., SIGCOMM 2015 (DCQCN, why PFC should rarely fire).

What a capture cannot show
    Only the pause frames of the mirrored links: a mirror on one link does not see the others, so a
    spread can be longer than the ports listed, and a port's pause is known only from the frames
    it sent (the receiver's queue itself is invisible). The pause length depends on the link speed:
    the pcapng interface speed when the capture gives one, else analyzer.mac_control's default
    (100 Gb/s), else ``link_speed_bps`` when set; the explanation says which.

Known false positives / limits
    * Incast and short bursts pause briefly and resume (XON): no back-to-back run, a small share.
    * Several independent spreads of one priority in one capture are one finding (the ports of all
      of them, in order); a port counts by its first pause only.
    * At a timestamp tick as coarse as the pause itself, "arrived before the previous pause expired"
      cannot be told: such findings say so and are at most ``low``.

Severity rule
    ``pause_storm``: low when it passes the gate (``min_back_to_back`` refreshes in one run, or
    ``min_paused_share``); by the longest continuous pause, medium from ``medium_pause_ns``, high from
    ``high_pause_ns``, critical from ``critical_pause_ns``; a storm that long (from ``medium_pause_ns``)
    is also high when paused ``high_share`` of a window and critical from ``critical_share``. A large
    share made of short XOFF/XON cycles stays low (PFC absorbing congestion, e.g. an incast with
    DCQCN off: ecn_congestion's finding, not a storm). At most low when the tick is too coarse.
    ``pause_spreading``: never below its worst member storm; when that is at least medium (a storm
    drives the spread), also medium from ``medium_spread_ports`` ports and high from
    ``high_spread_ports``; otherwise (short pauses passed hop by hop: PFC's back-pressure) low.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.mac_control import DEFAULT_LINK_BPS, PAUSE_QUANTUM_BITS

from .base import (SEVERITIES, SEVERITY_RANK, empty_findings, findings, fmt_ns, optional_frame, resolution_ns,
                   severity_from_scale)
from .params import LOWER, param

NAME = "pfc_storm"
KINDS = ("pause_storm", "pause_spreading")
# pause_frames: the frames; packets: the capture's span (the share's window); interfaces: the tick and speed
REQUIRES = ("pause_frames", "packets", "interfaces")
ORDER = 70  # where it runs and is listed (detectors/__init__.py)

PRIORITIES = 8  # 802.1Qbb traffic classes
ALL = 8  # the priority value of an 802.3x PAUSE: every priority at once
NAMED_PORTS = 12  # a spreading explanation names this many ports, then "and N more"
NAMED_STORMS = 3  # ... and gives the figures of this many of its storms (worst first; all are its members)
KEY = ["src_mac", "priority"]


@dataclass(frozen=True)
class Params:
    """Thresholds of the PFC storm detector."""

    min_back_to_back: int = param(3, "pause_storm: XOFFs refreshing a pause before it expired, in one continuous "
                                     "run, for a storm", unit="refreshes", gate=LOWER, lo=1)
    min_paused_share: float = param(0.20, "pause_storm: share of a window the port and priority was paused for a "
                                          "finding (low)", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    medium_pause_ns: int = param(500_000, "severity: longest continuous pause for medium (1.5 max-quanta pauses "
                                          "at 100 Gb/s: refreshed rather than resumed)", unit="ns", gate=LOWER, lo=1)
    high_pause_ns: int = param(10_000_000, "... for high", unit="ns", gate=LOWER, lo=1)
    critical_pause_ns: int = param(100_000_000, "... for critical (where PFC watchdogs step in)", unit="ns",
                                   gate=LOWER, lo=1)
    high_share: float = param(0.50, "severity: a storm (continuous pause from medium_pause_ns) paused for this "
                                    "share of a window is high", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    critical_share: float = param(0.90, "... critical", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    share_window_ns: int = param(1_000_000_000, "the paused share is the largest in any window this long (the "
                                                "whole capture when it is shorter)", unit="ns", lo=1)
    spread_min_ports: int = param(3, "pause_spreading: ports pausing the priority, joined in a cascade, for a "
                                     "spread (low)", unit="ports", gate=LOWER, lo=2)
    medium_spread_ports: int = param(5, "severity: ports in a spread that a storm (a member from medium) drives, "
                                        "for medium", unit="ports", gate=LOWER, lo=2)
    high_spread_ports: int = param(10, "... for high", unit="ports", gate=LOWER, lo=2)
    min_spread_lag_ns: int = param(10_000, "a port joins a spread when its first pause comes while another port "
                                           "had been paused this long (ports starting within it are one event; at "
                                           "least 1 ns: a port never joins under itself)", unit="ns", gate=LOWER, lo=1)
    link_speed_bps: int = param(0, "link speed for the pause times, overriding the capture's (0: the frame's "
                                   "link_bps, from the pcapng if_speed or the 100 Gb/s default)", unit="bit/s",
                                lo=0)


# -- the paused intervals -------------------------------------------------------------------------

def priority_name(p: int) -> str:
    """The resource of a finding about priority ``p``."""
    return "all priorities (802.3x PAUSE)" if p == ALL else f"priority {p}"


_INTERVAL_SCHEMA = {"frame": pl.UInt32, "ts_ns": pl.Int64, "src_mac": pl.String, "priority": pl.Int8,
                    "quanta": pl.Int64, "link_bps": pl.Int64, "until_ns": pl.Int64}


def pause_intervals(frames: pl.DataFrame | None, link_speed_bps: int = 0) -> pl.DataFrame:
    """One row per (pause frame, priority it pauses or resumes), ordered by port, priority and time:
    ``frame``, ``ts_ns``, ``src_mac``, ``priority`` (0-7, 8 = 802.3x PAUSE), ``quanta``, ``link_bps``
    (the speed used), ``until_ns`` (its own expiry), ``end_ns`` (min(expiry, the port's next frame for
    the priority): the pause it actually caused), ``xoff`` (quanta > 0), ``refresh`` (an XOFF arriving
    before the previous XOFF expired), ``run`` (continuous-pause id within the port and priority),
    ``cut_by`` (the frame that ended this one's pause early, else null). ``link_speed_bps`` > 0
    recomputes every time at that speed."""
    cols = set(frames.columns) if frames is not None else set()
    if frames is None or frames.height == 0 or not {"frame", "ts_ns", "src_mac", "kind"} <= cols:
        return _finish_intervals(pl.DataFrame(schema=_INTERVAL_SCHEMA))
    ok = frames.filter(pl.col("status").cast(pl.String) == "ok") if "status" in cols else frames
    kind = pl.col("kind").cast(pl.String)
    speed = pl.col("link_bps") if "link_bps" in cols else pl.lit(None, pl.Int64)
    parts = []
    for p in range(PRIORITIES):  # the eight priority columns, not the frames
        q, u = f"quanta_p{p}", f"paused_until_p{p}_ns"
        if q not in cols:
            continue
        enabled = ((pl.col("class_enable").cast(pl.Int32) // (1 << p)) % 2 == 1) if "class_enable" in cols \
            else pl.lit(True)
        is_pfc = (kind == "pfc") & enabled
        sel = (is_pfc | (kind == "pause")) if p == 0 else is_pfc
        parts.append(ok.filter(sel & pl.col(q).is_not_null()).select(
            pl.col("frame").cast(pl.UInt32), pl.col("ts_ns").cast(pl.Int64), pl.col("src_mac").cast(pl.String),
            pl.when(kind == "pause").then(pl.lit(ALL)).otherwise(pl.lit(p)).cast(pl.Int8).alias("priority"),
            pl.col(q).cast(pl.Int64).alias("quanta"), speed.cast(pl.Int64).alias("link_bps"),
            (pl.col(u) if u in cols else pl.lit(None)).cast(pl.Int64).alias("until_ns")))
    rows = pl.concat(parts) if parts else pl.DataFrame(schema=_INTERVAL_SCHEMA)
    bps = (pl.lit(int(link_speed_bps), pl.Int64) if link_speed_bps > 0
           else pl.when(pl.col("link_bps") > 0).then(pl.col("link_bps")).otherwise(pl.lit(DEFAULT_LINK_BPS, pl.Int64)))
    computed = pl.col("ts_ns") + pl.col("quanta") * (PAUSE_QUANTUM_BITS * 1_000_000_000) // pl.col("link_bps")
    rows = rows.with_columns(bps.alias("link_bps")).with_columns(
        (computed if link_speed_bps > 0 else pl.coalesce("until_ns", computed)).alias("until_ns"))
    return _finish_intervals(rows)


def _finish_intervals(rows: pl.DataFrame) -> pl.DataFrame:
    # one integer key per (port, priority) sorts three times faster than the string and the priority
    key = pl.col("src_mac").cast(pl.Categorical).to_physical().cast(pl.Int64) * 16 + pl.col("priority")
    rows = rows.sort(key, "ts_ns", "frame")
    # sorted by port and priority: the previous / next row is the same timer's where the key is unchanged
    # (shifts masked at key changes: cheaper than windows over the string key)
    same_prev = ((pl.col("src_mac") == pl.col("src_mac").shift(1))
                 & (pl.col("priority") == pl.col("priority").shift(1))).fill_null(False)
    same_next = ((pl.col("src_mac") == pl.col("src_mac").shift(-1))
                 & (pl.col("priority") == pl.col("priority").shift(-1))).fill_null(False)
    rows = rows.with_columns(
        pl.when(same_next).then(pl.col("ts_ns").shift(-1)).alias("_next_ts"),
        pl.when(same_next).then(pl.col("frame").shift(-1)).alias("_next_frame"),
        pl.when(same_prev).then(pl.col("until_ns").shift(1)).alias("_prev_until"),
        pl.when(same_prev).then(pl.col("quanta").shift(1) > 0).alias("_prev_xoff"),
        (pl.col("quanta") > 0).alias("xoff"))
    rows = rows.with_columns(
        pl.min_horizontal("until_ns", pl.coalesce("_next_ts", "until_ns")).alias("end_ns"),
        (pl.col("xoff") & pl.col("_prev_xoff") & (pl.col("ts_ns") < pl.col("_prev_until")))
        .fill_null(False).alias("refresh"),
        pl.when(pl.col("_next_ts") < pl.col("until_ns")).then(pl.col("_next_frame")).alias("cut_by"))
    # a key's first frame is never a refresh, so the run ids are distinct across ports and priorities
    return rows.with_columns((~pl.col("refresh")).cum_sum().cast(pl.UInt32).alias("run")).drop(
        "_next_ts", "_next_frame", "_prev_until", "_prev_xoff")


def pause_runs(intervals: pl.DataFrame) -> pl.DataFrame:
    """The continuous pauses: one row per (port, priority, run) that paused: ``start_ns``, ``end_ns``,
    ``refreshes`` (back-to-back XOFFs after the first), ``xoffs``, ``frames`` (its frames and the one
    that ended it early), ``quanta``, ``link_bps`` and ``pause_ns`` (the pause it asked for) of its first
    frame."""
    return (intervals.group_by("run", maintain_order=True).agg(
        pl.col("src_mac").first(), pl.col("priority").first(), pl.col("xoff").first().alias("_starts"),
        pl.col("ts_ns").first().alias("start_ns"),
        pl.col("end_ns").last(), pl.col("refresh").sum().cast(pl.UInt32).alias("refreshes"),
        pl.col("xoff").sum().cast(pl.UInt32).alias("xoffs"),
        pl.col("frame"), pl.col("cut_by").last(), pl.col("quanta").first(), pl.col("link_bps").first(),
        (pl.col("until_ns").first() - pl.col("ts_ns").first()).alias("pause_ns"))
        .filter(pl.col("_starts") & (pl.col("end_ns") > pl.col("start_ns")))
        .with_columns(pl.concat_list("frame", pl.col("cut_by").cast(pl.UInt32)).list.drop_nulls().alias("frames"))
        .drop("_starts", "frame", "cut_by").select(*KEY, pl.exclude(KEY)))


def _cum_at(runs: pl.DataFrame, at: pl.DataFrame) -> pl.Series:
    """Paused time of each row's (port, priority) up to ``at["t"]`` (runs are disjoint per key and
    carry ``_before``, the paused time of the key's earlier runs)."""
    j = at.with_row_index("_i").sort("t").join_asof(
        runs.select(*KEY, "start_ns", "end_ns", "_before").sort("start_ns"), left_on="t", right_on="start_ns",
        by=KEY, strategy="backward", check_sortedness=False).sort("_i")
    part = (pl.min_horizontal("t", "end_ns") - pl.col("start_ns")).clip(lower_bound=0)
    return j.select(pl.when(pl.col("start_ns").is_null()).then(0).otherwise(pl.col("_before") + part))[:, 0]


def port_stats(runs: pl.DataFrame, span: tuple[int, int], window_ns: int) -> pl.DataFrame:
    """Per (port, priority): first pause, last paused instant, paused time, the longest run (its
    start, length and refreshes), the most refreshes in one run, and ``share``: the largest paused
    share of any ``window_ns`` within the capture's ``span`` (the whole span when shorter)."""
    lo, hi = span
    w = max(min(int(window_ns), hi - lo), 1)
    r = runs.with_columns(pl.col("end_ns").clip(upper_bound=max(hi, lo + 1)).alias("_end")).with_columns(
        (pl.col("_end") - pl.col("start_ns")).clip(lower_bound=0).alias("_dur")).sort(*KEY, "start_ns")
    r = r.with_columns((pl.col("_dur").cum_sum() - pl.col("_dur")).over(KEY).alias("_before"))
    edges = r.select(*KEY, pl.col("start_ns").clip(lower_bound=lo, upper_bound=max(hi - w, lo)).alias("t"))
    clipped = r.with_columns(pl.col("_end").alias("end_ns"))
    paused = _cum_at(clipped, edges.with_columns(pl.col("t") + w)) - _cum_at(clipped, edges)
    # rounded: 2e6 / 1e7 must be 0.2, not 0.19999999999999998
    shares = edges.with_columns((paused / w).round(12).clip(upper_bound=1.0).alias("share")).group_by(KEY).agg(
        pl.col("share").max())
    # the longest run as seen: clipped to the capture's end (a pause asked for past it may have been
    # resumed by an XON the capture does not hold), like the paused time and the share
    longest = r.sort("end_ns", descending=True).sort(pl.col("_dur"), descending=True,
                                                     maintain_order=True).group_by(KEY, maintain_order=True).first()
    agg = r.group_by(KEY).agg(
        pl.col("start_ns").min().alias("first_ns"), pl.col("end_ns").max().alias("last_ns"),
        pl.col("_dur").sum().alias("paused_ns"), pl.col("refreshes").max().alias("max_refreshes"),
        pl.col("xoffs").sum().alias("xoffs"), pl.len().alias("runs"),
        pl.col("frames").sort_by("start_ns").first().list.first().alias("first_frame"),
        pl.col("pause_ns").sort_by("start_ns").first().alias("first_pause_ns"))
    return agg.join(shares, on=KEY, how="left").join(longest.select(
        *KEY, pl.col("start_ns").alias("run_start_ns"), pl.col("_end").alias("run_end_ns"),
        pl.col("_dur").alias("longest_ns"), (pl.col("end_ns") > pl.col("_end")).alias("run_open"),
        pl.col("refreshes").alias("run_refreshes"),
        pl.col("frames").alias("run_frames"), "quanta", "link_bps"), on=KEY, how="left").with_columns(
        pl.lit(w, pl.Int64).alias("window_ns")).sort("priority", "first_ns", "src_mac")


def spread_ports(runs: pl.DataFrame, stats: pl.DataFrame, lag_ns: int, capture_start_ns: int) -> pl.DataFrame:
    """The ports of each priority's spread: a port *joins* when its first pause falls while another
    port had been paused continuously for at least ``lag_ns``; the spread is the joined ports and the
    ports they joined under. A port whose first frame comes sooner after ``capture_start_ns`` than the
    pause that frame asks for may be refreshing a pause begun before the capture: it cannot be said
    to join (it can still be one joined under). Columns: ``priority``, ``src_mac``, ``first_ns``,
    ``joined`` (bool), in order of first pause."""
    q = runs.select("priority", "src_mac", (pl.col("start_ns") + lag_ns).alias("qs"), "end_ns").filter(
        pl.col("end_ns") > pl.col("qs"))
    firsts = stats.select("priority", "src_mac", "first_ns")
    can_join = stats.filter(pl.col("first_ns") - capture_start_ns >= pl.col("first_pause_ns")).select(
        "priority", "src_mac", "first_ns")
    if q.height == 0 or can_join.height == 0:
        return firsts.clear().with_columns(pl.lit(False).alias("joined"))
    # the union of the qualified intervals per priority (a port's own start + lag is after its first pause)
    u = q.sort("priority", "qs").with_columns(pl.col("end_ns").cum_max().over("priority").alias("_reach"))
    u = u.with_columns((pl.col("qs") > pl.col("_reach").shift(1).over("priority")).fill_null(True).cum_sum()
                       .over("priority").alias("_g")).group_by("priority", "_g").agg(
        pl.col("qs").min(), pl.col("end_ns").max())
    hit = can_join.sort("first_ns").join_asof(u.sort("qs"), left_on="first_ns", right_on="qs", by="priority",
                                            strategy="backward", check_sortedness=False)
    joined = hit.filter(pl.col("end_ns").is_not_null() & (pl.col("first_ns") < pl.col("end_ns"))).select(
        "priority", "src_mac", "first_ns")
    if joined.height == 0:
        return firsts.clear().with_columns(pl.lit(False).alias("joined"))
    # the ports joined under: a qualified run with a join time inside it (the first join at or after its
    # qualified start, per priority; a port's own first pause is before its own runs' qualified starts)
    at = q.sort("qs").join_asof(joined.select("priority", pl.col("first_ns").alias("_join")).sort("_join"),
                                left_on="qs", right_on="_join", by="priority", strategy="forward",
                                check_sortedness=False)
    sources = at.filter(pl.col("_join") < pl.col("end_ns")).select("priority", "src_mac").unique()
    members = pl.concat([joined.select("priority", "src_mac").with_columns(pl.lit(True).alias("joined")),
                         sources.with_columns(pl.lit(False).alias("joined"))])
    members = members.group_by("priority", "src_mac").agg(pl.col("joined").any())
    return members.join(firsts, on=["priority", "src_mac"]).sort("priority", "first_ns", "src_mac").select(
        "priority", "src_mac", "first_ns", "joined")


# -- findings ---------------------------------------------------------------------------------------

def _capture_span(capture, intervals: pl.DataFrame) -> tuple[int, int]:
    packets = optional_frame(capture, "packets")
    ts = packets["ts_ns"] if packets is not None and packets.height and "ts_ns" in packets.columns else None
    lo = [int(ts.min())] if ts is not None else []
    hi = [int(ts.max())] if ts is not None else []
    if intervals.height:
        lo.append(int(intervals["ts_ns"].min()))
        hi.append(int(intervals["ts_ns"].max()))
    return (min(lo), max(hi)) if lo else (0, 1)


def _speed_source(capture, params: Params, link_bps: int) -> str:
    if params.link_speed_bps > 0:
        return "the link_speed_bps setting"
    ifaces = optional_frame(capture, "interfaces")
    named = [c for c in ("if_speed_bps", "speed_bps", "if_speed") if ifaces is not None and c in ifaces.columns]
    # this speed's own source: an interface declaring it (another interface's if_speed says nothing of it)
    if named and link_bps in set(ifaces[named[0]].drop_nulls().cast(pl.Int64).to_list()):
        return "the capture's interface speed (pcapng if_speed)"
    if link_bps == DEFAULT_LINK_BPS:
        return "the default: the capture does not give the interface speed; set pfc_storm.link_speed_bps"
    return "the capture's interface speed"


def _gbps(bps: int) -> str:
    return f"{bps / 1e9:g} Gb/s"


def _storm_severity(params: Params) -> pl.Expr:
    rank = lambda e: e.replace_strict(SEVERITY_RANK, return_dtype=pl.Int8)  # noqa: E731
    by_pause = rank(severity_from_scale(pl.col("longest_ns").cast(pl.Float64), (
        0.0, params.medium_pause_ns, params.high_pause_ns, params.critical_pause_ns)))
    by_share = rank(severity_from_scale(pl.col("share"), (0.0, 2.0, params.high_share, params.critical_share)))
    storm = pl.col("longest_ns") >= params.medium_pause_ns  # the share raises a storm, not XOFF/XON cycles
    out = pl.max_horizontal(by_pause, pl.when(storm).then(by_share).otherwise(1), pl.lit(1, pl.Int8))
    out = pl.when(pl.col("_coarse")).then(pl.min_horizontal(out, pl.lit(1, pl.Int8))).otherwise(out)
    return out.replace_strict(dict(enumerate(SEVERITIES)), return_dtype=pl.String)


NOT_SEEN = ("Only the pause frames of the mirrored links are seen: a mirror on one link does not see the "
            "others, and the paused queue itself is not on the wire.")


def _storm_rows(st: pl.DataFrame, params: Params, res_ns: float, t0: int, speed_words: dict) -> list[dict]:
    rows = []
    for r in st.iter_rows(named=True):  # one row per storming port and priority, not per frame
        pause_ns = r["quanta"] * PAUSE_QUANTUM_BITS * 1e9 / r["link_bps"]
        times = f"{r['run_refreshes']} time{'' if r['run_refreshes'] == 1 else 's'}"
        coarse = " The timestamp tick ({}) is as coarse as the pause: back to back cannot be told, at most low." \
            .format(fmt_ns(res_ns)) if r["_coarse"] else ""
        rows.append({
            "kind": "pause_storm", "severity": r["severity"], "start_ns": r["run_start_ns"], "end_ns": r["run_end_ns"],
            "client": None, "server": r["src_mac"], "resource": priority_name(r["priority"]), "clients": None,
            "client_identity": "port MAC", "metric": "paused_share", "value": float(r["share"]),
            "threshold": params.min_paused_share, "unit": "share", "evidence_frames": r["run_frames"],
            "explanation": (
                f"Port {r['src_mac']} paused {priority_name(r['priority'])} for {r['share']:.0%} of "
                f"{fmt_ns(r['window_ns'])}{' (the whole capture)' if r['_whole'] else ''}; longest continuous pause "
                f"{fmt_ns(r['longest_ns'])} from +{fmt_ns(r['run_start_ns'] - t0)}"
                f"{' (still paused when the capture ends)' if r['run_open'] else ''}, refreshed back to back "
                f"{times} (each XOFF before the previous pause expired; {r['quanta']} quanta = {fmt_ns(pause_ns)} "
                f"at {_gbps(r['link_bps'])}, {speed_words[r['link_bps']]}); {r['xoffs']} XOFFs in "
                f"{r['runs']} pause(s), {fmt_ns(r['paused_ns'])} paused in all. "
                + (f"Every flow of the priority through the link stalls meanwhile (a slow or stuck receiver, Guo "
                   f"et al. 2016)." if r["longest_ns"] >= params.medium_pause_ns else
                   f"Short XOFF/XON cycles, no pause over {fmt_ns(params.medium_pause_ns)}: PFC absorbing "
                   f"congestion (an incast?) rather than a storm.") + f"{coarse} "
                f"{NOT_SEEN}")})
    return rows


def _spread_rows(spread: pl.DataFrame, stats: pl.DataFrame, storms: pl.DataFrame, params: Params,
                 t0: int, speed_words: dict) -> list[dict]:
    rows = []
    by_key = {(r["priority"], r["src_mac"]): r for r in stats.iter_rows(named=True)}
    for (prio,), ports in spread.group_by("priority", maintain_order=True):
        if ports.height < params.spread_min_ports:
            continue
        macs = ports["src_mac"].to_list()
        first = [int(x) for x in ports["first_ns"]]
        origin = by_key[(prio, macs[0])]
        mine = storms.filter((pl.col("priority") == prio) & pl.col("src_mac").is_in(macs)).sort(
            pl.col("severity").replace_strict(SEVERITY_RANK, return_dtype=pl.Int8), "first_ns",
            descending=[True, False])  # worst first (member_ids)
        worst = max((SEVERITY_RANK[s] for s in mine["severity"]), default=0)
        n = len(macs)
        # a spread rates by its size only when a real storm drives it (a member from medium: a continuous
        # pause); hop-by-hop short pauses are PFC's back-pressure working, low
        own = (3 if n >= params.high_spread_ports else 2 if n >= params.medium_spread_ports else 1) \
            if worst >= SEVERITY_RANK["medium"] else 1
        named = ", ".join(f"{m} (+{fmt_ns(f - first[0])})" if k else f"{m} (first)"
                          for k, (m, f) in enumerate(zip(macs[:NAMED_PORTS], first)))
        more = f" and {n - NAMED_PORTS} more" if n > NAMED_PORTS else ""
        storm_words = "; ".join(f"{s['src_mac']} {s['share']:.0%} paused, {fmt_ns(s['longest_ns'])} continuous, "
                                f"{s['run_refreshes']} back-to-back refreshes"
                                for s in mine.head(NAMED_STORMS).iter_rows(named=True))
        evidence = [int(by_key[(prio, m)]["first_frame"]) for m in macs] + [
            int(f) for fs in mine["run_frames"] for f in fs]
        rows.append({
            "kind": "pause_spreading", "severity": SEVERITIES[max(own, worst)], "start_ns": first[0],
            "end_ns": max(int(by_key[(prio, m)]["last_ns"]) for m in macs), "client": ",".join(macs[1:]),
            "server": macs[0], "resource": priority_name(prio), "clients": n - 1, "client_identity": "port MAC",
            "metric": "ports_pausing", "value": float(n), "threshold": float(params.spread_min_ports),
            "unit": "ports", "evidence_frames": evidence, "_members": mine["_fid"].to_list(),
            "explanation": (
                f"The pause of {priority_name(prio)} spread over {n} ports in {fmt_ns(first[-1] - first[0])}, in order "
                f"of first pause: {named}{more}. Each joined while a port already pausing had been paused for at "
                f"least {fmt_ns(params.min_spread_lag_ns)} (head-of-line blocking propagating upstream, Guo et al. "
                f"2016); it began at {origin['src_mac']} (+{fmt_ns(first[0] - t0)})."
                + (f" Storms: {storm_words}." if storm_words else " No port of it stormed (short pauses only).")
                + f" Pause times at {_gbps(origin['link_bps'])} ({speed_words[origin['link_bps']]})."
                + f" {NOT_SEEN} The spread may reach further than the ports listed.")})
    return rows


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    frames = optional_frame(capture, "pause_frames", nonempty=True)
    if frames is None:
        return empty_findings()
    intervals = pause_intervals(frames, params.link_speed_bps)
    runs = pause_runs(intervals)
    if runs.height == 0:
        return empty_findings()
    span = _capture_span(capture, intervals)
    res_ns = resolution_ns(capture)
    stats = port_stats(runs, span, params.share_window_ns).with_columns(
        (pl.col("quanta") * PAUSE_QUANTUM_BITS * 1e9 / pl.col("link_bps") <= res_ns).alias("_coarse"),
        (pl.col("window_ns") >= span[1] - span[0]).alias("_whole"))
    storms = stats.filter((pl.col("run_refreshes") >= params.min_back_to_back)
                          | (pl.col("share") >= params.min_paused_share)).with_columns(
        _storm_severity(params).alias("severity"))
    speeds = {int(b): _speed_source(capture, params, int(b)) for b in stats["link_bps"].unique()}
    storm_found = findings(pl.DataFrame(_storm_rows(storms, params, res_ns, span[0], speeds)),
                           detector=NAME, params=params) if storms.height else empty_findings()
    storms = storms.with_columns(storm_found["finding_id"].alias("_fid")) if storms.height else \
        storms.with_columns(pl.lit(None, pl.String).alias("_fid"))
    spread = spread_ports(runs, stats, params.min_spread_lag_ns, span[0])
    rows = _spread_rows(spread, stats, storms, params, span[0], speeds)
    if not rows:
        return storm_found
    members = [r.pop("_members") for r in rows]
    spread_found = findings(pl.DataFrame(rows).with_columns(
        pl.Series("member_ids", members, dtype=pl.List(pl.String)),
        pl.Series("members", [len(m) for m in members], dtype=pl.UInt32)), detector=NAME, params=params)
    member_of = pl.DataFrame({"finding_id": [m for ms in members for m in ms],
                              "_of": [fid for fid, ms in zip(spread_found["finding_id"], members) for _ in ms]},
                             schema={"finding_id": pl.String, "_of": pl.String})
    storm_found = storm_found.join(member_of, on="finding_id", how="left", maintain_order="left").with_columns(
        pl.coalesce("_of", "member_of").alias("member_of")).drop("_of")
    return pl.concat([spread_found, storm_found.select(spread_found.columns)])
