"""Check-then-use races (``toctou``): a client checks a resource, another client changes it, and the
first client then acts on what it checked.

The pathology
    A client reads the state of a file or directory entry — it opens it or queries its attributes
    (SMB2 CREATE with an open disposition, QUERY_INFO, READ), or searches / compares an LDAP entry —
    and later acts on it: writes it (SMB2 WRITE; SET_INFO rename, link, delete disposition, end of
    file; CREATE that overwrites, supersedes or creates it; LDAP modify, add, delete, modDN). If
    another client's change lands between the check and the use, the use is based on stale state:
    a lost update (the classic read-modify-write race, e.g. two LDAP clients allocating the same
    uidNumber from a counter entry, or a config file renamed over a newer version), or an action
    on something other than what was checked (time-of-check to time-of-use).

The signal (``smb2_transactions``, ``ldap_transactions`` + ``ldap_messages``)
    * Events per (server, resource, client): checks and uses, in capture order. A *window* is a use
      whose previous event by the same client on the same resource is a check (not an earlier use:
      a stream of writes after one check is one window), at most ``max_window_ns`` long (a re-open
      of the resource — a read use — at most ``stale_max_window_ns``).
    * Resources: SMB2 paths compared case-insensitively below the share name (a rename touches its
      source and its target path); LDAP DNs normalised (case, blanks around ``,`` and ``=``); an
      LDAP search checks its base (baseObject scope) and the entries it returned (at most
      ``max_entries_per_search``).
    * Clients: SMB2 requests that carry one SessionId to one server are one client, whatever
      connection they came on (SMB 3 multichannel binds several connections to one session, MS-SMB2
      3.2.4.1.7 / 3.3.5.5.2); otherwise :func:`detectors.base.client_identity`.
    * A realised race: another client's *successful* change of the same resource between the check
      and the use (capture order), not made through the handle the use goes through (a use through
      the handle the "change" itself returned knows that change), that conflicts with the use (overlapping byte ranges when both
      are WRITEs; overlapping attributes when both are LDAP modifies; always otherwise).
      ``lost_update``: the use succeeded and was unconditional. ``conflict_detected``: the use
      failed (e.g. LDAP noSuchAttribute on a delete-old/add-new modify, SMB
      STATUS_OBJECT_NAME_COLLISION): the race happened and the server caught it (informational).
      ``stale_use``: the use re-opened the resource after the change (a stale check, not a lost
      write). A conditional LDAP modify that succeeded (delete of the old value with an add of the
      new one, increment, or the assertion control RFC 4528) proves the checked value unchanged:
      no finding.
    * Windows without a realised race (write uses only): the rate of changes to the resource by
      other clients over the capture (change episodes: a client's changes less than
      ``episode_gap_ns`` apart count once) against the window length gives the race probability
      ``1 - exp(-rate x window)``; ``race_exposure`` summarises them per resource. A window whose
      check and use go through one open that denies write sharing (SMB2 ShareAccess without
      FILE_SHARE_WRITE) cannot race and is left out.

References: MS-SMB2 2.2.13 (CreateDisposition, ShareAccess), 2.2.14 (CreateAction), 2.2.37/2.2.39
(QUERY_INFO / SET_INFO), MS-FSCC 2.4.37 (FileRenameInformation), 2.4.11 (FileDispositionInformation);
RFC 4511 4.5 (search), 4.6 (modify: atomic, a failed delete of a value fails the whole
operation), 4.10 (compare); RFC 4528 (LDAP assertion control); CWE-367 (TOCTOU race condition).

Known false positives / limits
    * The order is the capture's (arrival order at the vantage point); a capture far from the server
      may order two nearly simultaneous requests differently than the server did. When a gap is not
      longer than the timestamp resolution the finding says so and is at most ``low``.
    * A client that re-reads the resource between the check and the use (outside the capture, from a
      cache, or through another protocol) is not seen: windows can look longer than they are.
    * Concurrent writes to disjoint byte ranges are not conflicts; a WRITE whose range is unknown
      conflicts with everything.
    * Several processes behind one address are one client unless their request streams overlap
      (:func:`detectors.base.client_identity`): a race between them is missed, never invented.
    * ``stale_use`` is a re-open after a check: whether the client acted on the stale check cannot
      be seen on the wire, so it is ``low`` by default (``stale_use_severity``).
    * A realised race counts the other clients that changed the resource inside the window up to
      ``max_counted_clients`` (16): beyond that the ``clients`` column and the explanation say at most
      that many (the count is a bound on the work per window, not a gate).

Severity rule: ``lost_update`` is ``medium``; ``high`` when the same resource lost ``high_repeats``
or more updates in the capture (a systematic race), ``critical`` from ``critical_repeats``; at most
``low`` when the order is not resolvable at the capture's timestamp resolution. ``stale_use``:
``stale_use_severity``. ``conflict_detected``: ``informational``. ``race_exposure``: by the mean
race probability of the resource's windows — ``informational`` from ``min_report_probability``,
``low`` from ``low_probability``, ``medium`` from ``high_probability``.

Code: detectors/toctou_events.py builds the events, detectors/toctou_scan.py the windows and the
interleaving scan; this module holds the parameters, the findings (severity, wording) and ``detect``.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from . import toctou_events, toctou_scan
from .base import (NS_PER_MS, NS_PER_S, SEVERITIES, SEVERITY_RANK, empty_findings, findings, fmt_ns,
                   optional_frame, resolution_ns)
from .params import LOWER, UPPER, param
from .toctou_events import FILE_SHARE_ALL, FILE_SHARE_WRITE, MESSAGE_COLUMNS, MESSAGE_ROWS, dn_key, smb_key  # noqa: F401

NAME = "toctou"
KINDS = ("lost_update", "stale_use", "outcome_unknown", "conflict_detected", "race_exposure", "vantage")
# every frame it reads (packets: the capture's duration; interfaces: resolution_ns)
REQUIRES = ("smb2_transactions", "ldap_transactions", "ldap_messages", "packets", "interfaces")
COLUMNS = {"ldap_messages": MESSAGE_COLUMNS}  # what it reads of them (base.py)
ROWS = {"ldap_messages": MESSAGE_ROWS}
# its findings are the union of its findings per server partition (base.py; tests/test_partitions.py)
PARTITION = "server"
ORDER = 50  # where it runs and is listed (detectors/__init__.py)


@dataclass(frozen=True)
class Params:
    """Windows and thresholds of the check-then-use detector."""

    max_window_ns: int = param(10_000_000_000, "longest check -> write window considered (a later write is "
                                               "not taken as acting on that check)", unit="ns", gate=UPPER, lo=0)
    stale_max_window_ns: int = param(1_000_000_000, "longest check -> re-open window for a stale_use",
                                     unit="ns", gate=UPPER, lo=0)
    stale_use_severity: str = param("low", "severity of a stale_use (a re-open after another client's change)",
                                    choices=SEVERITIES)
    high_repeats: int = param(5, "lost updates on one resource from which each is high (a systematic race)",
                              unit="updates", gate=LOWER, lo=1)
    critical_repeats: int = param(50, "... and critical", unit="updates", gate=LOWER, lo=1)
    max_entries_per_search: int = param(10, "an LDAP search checks the entries it returned only when it "
                                            "returned at most this many", unit="entries", gate=UPPER, lo=0)
    episode_gap_ns: int = param(100_000_000, "a client's changes to one resource less than this apart are one "
                                             "change episode (rate estimate)", unit="ns", lo=0)
    min_report_probability: float = param(0.01, "race_exposure: mean race probability per window to report "
                                                "(informational)", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    low_probability: float = param(0.1, "... to call it low", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    high_probability: float = param(0.5, "... to flag it (medium)", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    min_requests_for_vantage: int = param(20, "a server with at least this many requests and no response "
                                              "captured cannot be judged", unit="requests", gate=LOWER, lo=1)
    max_scan: int = param(100_000, "changes examined per window (bounds the work on very hot resources)",
                          unit="changes", gate=UPPER, lo=1)
    max_counted_clients: int = param(16, "other clients counted per window: the clients column (1 + them) and "
                                         "the explanation's \"by N client(s)\" say at most this many (bounds "
                                         "the work per window); a larger value only counts more, it never "
                                         "removes, adds or re-rates a finding", unit="clients", gate=None, lo=1)


NAMED_CHECKERS = 3  # a race_exposure explanation names this many of the clients that checked, then "and N more"
EXPOSURE_EVIDENCE_FRAMES = 50  # race_exposure: the first windows' check and use frames kept as evidence
VANTAGE_EVIDENCE_FRAMES = 10  # vantage: the first requests kept as evidence

# -- findings ---------------------------------------------------------------------------------------------

def _cap(sev: str, limit: str) -> str:
    return sev if SEVERITY_RANK[sev] <= SEVERITY_RANK[limit] else limit


def _realised_rows(real: pl.DataFrame, params: Params, res_ns: float) -> list[dict]:
    rows = []
    lost_per_res = {}
    for r in real.filter(pl.col("_kind") == "lost_update").group_by("proto", "server", "key").len().iter_rows():
        lost_per_res[r[:3]] = r[3]
    stale_sev = params.stale_use_severity
    for r in real.iter_rows(named=True):
        kind = r["_kind"]
        window = r["ts"] - r["p_ts"]
        gap = min(r["x_ts"] - r["p_ts"], r["ts"] - r["x_ts"])
        limited = gap <= res_ns
        n_lost = lost_per_res.get((r["proto"], r["server"], r["key"]), 0)
        if kind == "lost_update":
            sev = "critical" if n_lost >= params.critical_repeats else "high" if n_lost >= params.high_repeats \
                else "medium"
        elif kind == "stale_use":
            sev = stale_sev
        else:
            sev = "informational"
        if limited:
            sev = _cap(sev, "low")
        who, other = r["cid"], r["x_cid"]
        more = r["x_count"] - 1
        inter = (f"{other}'s {r['x_op']} (frame {r['x_frame']}) changed it {fmt_ns(r['x_ts'] - r['p_ts'])} after the "
                 f"check" + (f" (and {more} more change{'s' if more > 1 else ''} by {r['x_clients']} client(s))"
                             if more > 0 else ""))
        check = f"client {who} checked {r['resource']} ({r['p_op']}, frame {r['p_frame']})"
        if kind == "lost_update":
            tail = (f"; then {who}'s {r['op']} (frame {r['frame']}, {fmt_ns(window)} after its check) overwrote "
                    f"it on the stale check: a lost update"
                    + (f" ({n_lost} on this resource in the capture)" if n_lost > 1 else ""))
        elif kind == "stale_use":
            tail = (f"; then {who} opened it again for use (frame {r['frame']}, {fmt_ns(window)} after its check): "
                    f"what it checked is not what it uses")
        elif kind == "outcome_unknown":
            tail = (f"; then {who}'s {r['op']} (frame {r['frame']}, {fmt_ns(window)} after its check) acted on the "
                    f"stale check, but its response is not in the capture: a lost update if it succeeded")
        else:
            tail = (f"; {who}'s {r['op']} (frame {r['frame']}, {fmt_ns(window)} after its check) was refused "
                    f"({r['status']}): the race happened and the server caught it")
        note = (f" (the order rests on a gap of {fmt_ns(gap)}, no longer than the capture's "
                f"{fmt_ns(res_ns)} timestamp resolution)" if limited else "")
        frames = [r["p_frame"], r["p_resp_frame"], r["x_frame"], r["x_resp_frame"], r["frame"], r["resp_frame"]]
        rows.append({
            "kind": kind, "severity": sev, "start_ns": r["p_ts"], "end_ns": r["resp_ts"] or r["ts"],
            "client": who, "server": r["server"], "resource": r["p_resource"] or r["resource"],
            "clients": 1 + r["x_clients"], "client_identity": r["ident_rule"],
            "metric": "race_window_ms", "value": max(window, res_ns) / NS_PER_MS, "threshold": res_ns / NS_PER_MS,
            "unit": "ms",
            "evidence_frames": [int(f) for f in frames if f is not None],
            "explanation": check + ", " + inter + tail + note,
        })
    return rows


def _exposure(ev: pl.DataFrame, win: pl.DataFrame, real_keys: pl.DataFrame, duration_ns: int,
              params: Params, res_ns: float = 1.0) -> list[dict]:
    """Per resource, the windows that did not race: their race probability from the rate of other
    clients' changes (windows no shorter than the timestamp resolution)."""
    w = win.filter(pl.col("write_op") & (pl.col("x_count") == 0))
    protected = (pl.col("fid").is_not_null() & (pl.col("fid") == pl.col("p_fid"))
                 & ((pl.col("p_open_share").fill_null(FILE_SHARE_ALL) & FILE_SHARE_WRITE) == 0))
    w = w.filter(~protected)
    if w.height == 0 or duration_ns <= 0:
        return []
    ch = ev.filter(pl.col("write_op") & pl.col("ok") & pl.col("key").is_not_null()) \
        .sort("proto", "server", "key", "seq")
    g = ["proto", "server", "key"]
    ch = ch.with_columns(((pl.col("cid") != pl.col("cid").shift(1).over(g))
                          | ((pl.col("ts") - pl.col("ts").shift(1).over(g)) > params.episode_gap_ns))
                         .fill_null(True).alias("_new")).filter(pl.col("_new"))
    tot = ch.group_by(g).len("n_key")
    own = ch.group_by(*g, "cid").len("n_own")
    w = w.join(tot, on=g, how="left").join(own, on=[*g, "cid"], how="left").with_columns(
        ((pl.col("n_key").fill_null(0) - pl.col("n_own").fill_null(0)) / (duration_ns / NS_PER_S)).alias("rate"),
        pl.max_horizontal(pl.col("ts") - pl.col("p_ts"), pl.lit(int(res_ns), pl.Int64)).alias("window_ns"))
    w = w.with_columns((1.0 - (-pl.col("rate") * pl.col("window_ns") / NS_PER_S).exp()).alias("p"))
    agg = w.sort(*g, "seq").group_by(g).agg(  # sorted: first() and head() the same in every run
        pl.len().alias("windows"), pl.col("p").mean().alias("p_mean"), pl.col("p").max().alias("p_max"),
        pl.col("p").sum().alias("p_sum"), pl.col("window_ns").median().alias("window_med"),
        pl.col("rate").mean().alias("rate"), pl.col("cid").n_unique().alias("checkers"),
        pl.col("cid").unique().sort().head(NAMED_CHECKERS).alias("checker_ids"),
        pl.col("p_ts").min().alias("start_ns"), pl.col("ts").max().alias("end_ns"),
        pl.col("p_resource").first().alias("resource"), pl.col("ident_rule").first(),
        pl.concat_list("p_frame", "frame").explode().head(EXPOSURE_EVIDENCE_FRAMES).alias("frames"),
    ).filter(pl.col("p_mean") >= params.min_report_probability)
    if agg.height == 0:
        return []
    agg = agg.join(real_keys, on=g, how="left").with_columns(pl.col("realised").fill_null(0))
    rows = []
    for r in agg.iter_rows(named=True):
        p = r["p_mean"]
        sev = "medium" if p >= params.high_probability else "low" if p >= params.low_probability else "informational"
        who = ", ".join(r["checker_ids"]) + (f" and {r['checkers'] - NAMED_CHECKERS} more"
                                              if r["checkers"] > NAMED_CHECKERS else "")
        rows.append({
            "kind": "race_exposure", "severity": sev, "start_ns": r["start_ns"], "end_ns": r["end_ns"],
            "client": r["checker_ids"][0] if r["checkers"] == 1 else None, "server": r["server"],
            "resource": r["resource"], "clients": r["checkers"], "client_identity": r["ident_rule"],
            "metric": "race_probability", "value": float(p), "threshold": params.high_probability,
            "unit": "probability", "evidence_frames": [int(f) for f in r["frames"] if f is not None],
            "explanation": (
                f"{who} checked then wrote {r['resource']} {r['windows']} time(s) with a median check-to-use window "
                f"of {fmt_ns(r['window_med'])} while other clients changed it {r['rate']:.3g} times a second: each "
                f"window has a {100 * p:.2g}% chance (at most {100 * r['p_max']:.2g}%) that another change lands "
                f"inside it (1 - exp(-rate x window)), {r['p_sum']:.2g} expected races in the capture"
                + (f"; {r['realised']} realised race(s) reported separately" if r["realised"] else "; none seen")),
        })
    return rows


def _vantage_rows(tx_frames: dict[str, pl.DataFrame | None], params: Params) -> list[dict]:
    rows = []
    for proto, tx in tx_frames.items():
        if tx is None or tx.height == 0 or "answered" not in tx.columns:
            continue
        by = tx.group_by(pl.col("server").cast(pl.String)).agg(
            pl.len().alias("n"), pl.col("answered").fill_null(False).sum().alias("answered"),
            pl.col("request_ts_ns").min().alias("start_ns"), pl.col("request_ts_ns").max().alias("end_ns"),
            pl.col("request_frame").head(VANTAGE_EVIDENCE_FRAMES).alias("frames"))
        blind = by.filter((pl.col("n") >= params.min_requests_for_vantage) & (pl.col("answered") == 0))
        for r in blind.iter_rows(named=True):
            rows.append({
                "kind": "vantage", "severity": "informational", "start_ns": r["start_ns"], "end_ns": r["end_ns"],
                "client": None, "server": r["server"], "resource": None, "clients": None, "client_identity": None,
                "metric": "answered_requests", "value": 0.0, "threshold": 1.0, "unit": "requests",
                "evidence_frames": [int(f) for f in r["frames"]],
                "explanation": (f"{r['n']} {proto} requests to {r['server']} and not one response in this capture "
                                f"(one direction missing?): check-then-use races on it cannot be judged"),
            })
    return rows


def events(capture, params: Params = Params()) -> pl.DataFrame:
    """The check and use events of the capture (SMB2 and LDAP), in capture order with ``seq``
    (detectors/toctou_events.py)."""
    return toctou_events.events(capture, params)


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    """Findings: realised check-then-use races (lost updates, stale uses, conflicts the server caught)
    and, per resource, the race probability of the windows that did not race (see the module doc)."""
    ev = events(capture, params)
    rows: list[dict] = _vantage_rows({"SMB2": optional_frame(capture, "smb2_transactions"),
                                      "LDAP": optional_frame(capture, "ldap_transactions")}, params)
    if ev.height:
        win = toctou_scan.windows(ev, params)
        if win.height:
            win = toctou_scan.interleavings(ev, win, params)
            real = win.filter(pl.col("x_count") > 0).with_columns(
                pl.when(pl.col("open_use")).then(pl.lit("stale_use"))
                .when(pl.col("resp_ts").is_null()).then(pl.lit("outcome_unknown"))
                .when(~pl.col("ok")).then(pl.lit("conflict_detected"))
                .when(pl.col("conditional")).then(pl.lit("verified"))
                .otherwise(pl.lit("lost_update")).alias("_kind")).filter(pl.col("_kind") != "verified")
            res = resolution_ns(capture)
            rows += _realised_rows(real, params, res)
            real_keys = real.group_by("proto", "server", "key").agg(pl.len().alias("realised"))
            p = capture.packets
            if p.height and "ts_ns" in p.columns:
                duration = int(p["ts_ns"].max() - p["ts_ns"].min())
            else:
                duration = int(ev["ts"].max() - ev["ts"].min())
            rows += _exposure(ev, win, real_keys, duration, params, res)
    if not rows:
        return empty_findings()
    return findings(pl.DataFrame(rows, infer_schema_length=None), detector=NAME, params=params)
