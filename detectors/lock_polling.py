"""Lock polling: clients polling a held NFS byte-range lock (NFSv4 NFS4ERR_DENIED, NLM4_DENIED) on a timer.

The pathology
    NFSv4 has no lock wait: a LOCK that conflicts with a held lock is answered NFS4ERR_DENIED at once
    (RFC 7530 §16.10 / RFC 8881 §18.10); the blocking types READW_LT / WRITEW_LT are only a hint
    that the client will retry (RFC 7530 §9.4, RFC 8881 §9.6). So the client polls: the Linux client
    re-sends the LOCK after 1 s doubling up to 30 s (fs/nfs/nfs4proc.c nfs4_retry_setlk_simple,
    NFS4_LOCK_MINTIMEOUT / NFS4_LOCK_MAXTIMEOUT), applications that poll F_SETLK themselves use
    their own fixed timers. A contended lock becomes a polling storm whose winner is luck: after the
    holder releases it (LOCKU, or its CLOSE, or its lease expiring) the lock sits free until some
    waiter's next poll happens to arrive — seconds, where the server could have handed it over in one
    response time — and a client whose timer keeps missing the free moments starves while others
    win repeatedly. NFSv4.1 CB_NOTIFY_LOCK (RFC 8881 §20.11) removes the polling when the client
    asks for it (OPEN4_RESULT_MAY_NOTIFY_LOCK) and the server sends it; NFSv4.0 has nothing of the
    kind. NLM (NFSv3's lock manager, Open Group XNFS ch. 10) has a real wait: a blocking NLM_LOCK is
    answered NLM4_BLOCKED and the server calls NLM_GRANTED when the lock is free (the protocol's own
    queue, not polling: such waits are counted, never reported on their own); a non-blocking
    NLM_LOCK answered NLM4_DENIED and re-sent is polling like NFSv4's.

The signal (``nfs_transactions``; :mod:`detectors.lock_polling_events` builds the tables)
    * per lock resource — server + file (path, else handle) + a group of overlapping byte ranges —
      the attempts (LOCK: denied / granted / blocked), grants and releases (LOCKU / NLM UNLOCK, else
      the holder's CLOSE of the file); a *wait* is one client's denied attempts up to its grant (or
      its last attempt), waits that overlap form a contended *episode*: one finding each;
    * waiters (distinct clients denied), denied polls, polls per grant, each client's retry interval
      and its class (fixed / linear / exponential / irregular: retry_storm's
      :func:`~detectors.retry_storm.classify_backoff` with its default parameters), the holder named
      from the denial's owner / clientid (RFC 7530 LOCK4denied) where the reply carries it;
    * **free time**: for each release inside the episode, the gap to the next grant; their sum as a
      share of the contended period (first denial to the last waiter's grant), and their median
      against the server's median lock response time ("waiters only notice on their next poll");
    * **order and starvation**: grants in first-request order (FIFO) or not (luck); a waiter is
      starved when ``starve_min_overtakes`` grants went to clients that first asked after it while it
      kept being denied (granted late or never), or when it was never granted (gave up, or the capture
      ended) while that many grants went to other clients during its wait. Waiting long in a FIFO
      order behind many others is queueing, not starvation.

Kinds: ``nfs4`` (NFS4ERR_DENIED polls), ``nlm`` (NLM4_DENIED polls).

Known limits / false positives
    * What the capture cannot show: a release by lease expiry (no packet at all: the free gap then
      starts at the holder's last packet, unknown here, and the grant is counted as after an unseen
      release), a lock taken before the capture started (the holder is named from the denial's owner
      when the reply carries it), NLM's asynchronous *_RES replies (not decoded).
    * A release is the LOCKU (or UNLOCK) reply, a grant the winning LOCK call: with a capture taken
      at a client, both are off by about a round trip.
    * Shared (READ_LT) locks of several holders on one range: the free gap starts at the release
      just before the next grant, which may not have been the last holder's.
    * LOCKT tests (F_GETLK polling) are not counted; an application that tests before it locks shows
      only its LOCKs.

Client identity: :func:`detectors.base.client_identity_by` per server; one address with several
lock owners on one file counts as several contenders (processes), named ``address (owner)``.

Severity rule (per episode; below ``min_polls`` denied polls: not reported): by the free-time share
of the contended period — low below ``medium_free_share``, medium from it, high from
``high_free_share``, critical from ``critical_free_share`` with at least ``critical_waiters``
waiters (else high); at least medium when the polls per grant reach ``medium_polls_per_grant`` (the
server's load) or a waiter starved.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from . import retry_storm
from .base import (SEVERITIES, empty_findings, findings, fmt_ns, fmt_number, optional_frame,
                   resolution_ns)
from .lock_polling_events import free_gaps, lock_events, lock_holds, lock_waits, owner_text, U64_MAX
from .params import LOWER, param

NAME = "lock_polling"
KINDS = ("nfs4", "nlm")  # the lock protocol polled
REQUIRES = ("nfs_transactions", "interfaces")  # interfaces: resolution_ns
# its findings are the union of its findings per server partition (base.py; tests/test_partitions.py)
PARTITION = "server"
ORDER = 35  # after smb_break_queue (30): the other lock-queue detector

# the interval classes are retry_storm's (growth_ratio, fixed_ratio, ... at their defaults)
BACKOFF_PARAMS = retry_storm.Params()
MAX_NAMED = 4  # clients named one by one in an explanation (the rest are counted)


@dataclass(frozen=True)
class Params:
    """Thresholds and windows of the lock-polling detector."""

    min_polls: int = param(3, "episodes with fewer denied LOCK attempts are not reported", unit="polls",
                           gate=LOWER, lo=1)
    max_poll_gap_ns: int = param(120_000_000_000, "a client's denied attempt later than this after its previous "
                                                  "one starts a new wait (Linux polls at most every 30 s)",
                                 unit="ns", lo=1)
    medium_free_share: float = param(0.05, "severity: medium from this share of the contended period the lock "
                                           "sat free between a release and the next grant", unit="share",
                                     gate=LOWER, lo=0.0, hi=1.0)
    high_free_share: float = param(0.25, "... high from this", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    critical_free_share: float = param(0.5, "... critical from this, with critical_waiters", unit="share",
                                       gate=LOWER, lo=0.0, hi=1.0)
    critical_waiters: int = param(8, "critical needs this many clients denied in the episode", unit="clients",
                                  gate=LOWER, lo=1)
    medium_polls_per_grant: float = param(10.0, "at least medium from this many denied polls per grant to a "
                                                "waiter (the server's load)", unit="polls", gate=LOWER, lo=1.0)
    starve_min_overtakes: int = param(2, "a waiter is starved when this many grants went to clients that first "
                                         "asked after it while it was denied (at least medium)", unit="grants",
                                      gate=LOWER, lo=1)


# -- the tables -------------------------------------------------------------------------------------

def lock_tables(capture, params: Params = Params()) -> dict[str, pl.DataFrame]:
    """The detector's working tables (events, holds, waits, free gaps) for the finding's proof chart and
    the tests; empty frames when the capture has no NFS locking."""
    tx = optional_frame(capture, "nfs_transactions")
    ev = lock_events(tx)
    holds = lock_holds(ev) if ev.height else pl.DataFrame()
    waits = lock_waits(ev, params.max_poll_gap_ns) if ev.height else pl.DataFrame()
    if waits.height:
        eps = waits.group_by("episode", "gkey").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        gaps = free_gaps(eps, holds)
    else:
        gaps = free_gaps(pl.DataFrame(), pl.DataFrame())
    notify = 0
    if tx is not None and tx.height and "operation" in tx.columns:
        notify = tx.filter(pl.col("operation") == "CB_NOTIFY_LOCK").height
    return {"events": ev, "holds": holds, "waits": waits, "gaps": gaps, "tx": tx, "notify": notify}


def retry_intervals(tries: list[list[int]]) -> list[np.ndarray]:
    """Inter-attempt intervals (ns) of each wait's attempts (its grant included)."""
    return [np.diff(np.sort(np.asarray(t, dtype=np.float64))) for t in tries if t is not None and len(t) > 1]


def starvation(waits: pl.DataFrame, holds: pl.DataFrame) -> pl.DataFrame:
    """Per wait of one episode: ``others_granted`` — grants during it (after its first denial, up to its
    own grant or last poll) to other clients — and ``overtaken``, those of them to clients that first
    asked after it, or never asked (walked in while it waited). ``waits``: one episode's rows of
    :func:`lock_waits`; ``holds``: :func:`lock_holds`."""
    if waits.height == 0:
        return waits.with_columns(pl.lit(0, pl.UInt32).alias("overtaken"), pl.lit(0, pl.UInt32).alias("others_granted"))
    g = holds.filter(pl.col("gkey") == waits["gkey"][0])
    gt = g["ts_ns"].to_numpy()
    gw = np.array(g["waiter"].to_list(), dtype=object)
    started = dict(zip(waits["waiter"].to_list(), waits["start_ns"].to_list()))  # first ask per waiter
    for wt, s in zip(waits["waiter"].to_list(), waits["start_ns"].to_list()):
        started[wt] = min(started[wt], s)
    g_start = np.array([started.get(w, np.iinfo(np.int64).max) for w in gw], dtype=np.int64)
    overtaken, others = [], []
    for w, s, e, gr in waits.select("waiter", "start_ns", "end_ns", "grant_ns").iter_rows():
        end = gr if gr is not None else e
        during = (gt > s) & (gt < end) & (gw != w)
        overtaken.append(int((during & (g_start > s)).sum()))
        others.append(int(during.sum()))
    return waits.with_columns(pl.Series("overtaken", overtaken, dtype=pl.UInt32),
                              pl.Series("others_granted", others, dtype=pl.UInt32))


# -- findings ---------------------------------------------------------------------------------------

def _severity(share: float, waiters: int, ppg: float, starved: int, params: Params) -> str:
    level = 1  # low
    if share >= params.medium_free_share:
        level = 2
    if share >= params.high_free_share:
        level = 3
    if share >= params.critical_free_share and waiters >= params.critical_waiters:
        level = 4
    if ppg >= params.medium_polls_per_grant or starved:
        level = max(level, 2)
    return SEVERITIES[level]


def _interval_text(chains: list[np.ndarray]) -> tuple[str, str]:
    """(class, wording) of one client's (or all) retry intervals."""
    if not chains:
        return "unknown", "no repeated attempt"
    cls, jitter = retry_storm.classify_backoff(chains, BACKOFF_PARAMS)
    first = float(np.median([c[0] for c in chains if c.size]))
    allv = np.concatenate(chains)
    if cls == "exponential":
        return cls, f"{fmt_ns(first)} growing to {fmt_ns(float(allv.max()))} (exponential)"
    if cls == "fixed":
        return cls, f"every {fmt_ns(float(np.median(allv)))} (fixed{', jittered' if jitter else ''})"
    if cls == "unknown":
        return cls, f"after {fmt_ns(float(np.median(allv)))}"
    return cls, f"{fmt_ns(float(np.median(allv)))} on median ({cls})"


def _range_text(lo: int, hi: int) -> str:
    if lo == 0 and hi == U64_MAX:
        return " (whole file)"
    if hi == U64_MAX:
        return f" (bytes {lo:,} to the end)"
    return f" (bytes {lo:,}-{hi - 1:,})"


def _holder(ep_waits: pl.DataFrame, ev: pl.DataFrame) -> tuple[str | None, str]:
    """Who held the lock when it was first denied, from the denial's owner (LOCK4denied) mapped to
    the client that locked with that owner, and the wording."""
    first = ep_waits.sort("start_ns").filter(pl.col("denied_owner").is_not_null())
    if first.height == 0:
        return None, ""
    own, cid = first["denied_owner"][0], first["denied_clientid"][0]
    lockers = ev.filter((pl.col("owner") == own) & (pl.col("outcome") == "granted"))
    name = owner_text(own)
    cid_text = f", clientid {cid:#x}" if cid is not None else ""
    if lockers.height:
        who = lockers["waiter"][0]
        return who, f"held by {who} (lock owner '{name}'{cid_text}) when first denied"
    return None, (f"held by lock owner '{name}'{cid_text} when first denied; its LOCK is not in the capture "
                  "(taken before it started)")


def _episode_row(ep: str, w: pl.DataFrame, ev: pl.DataFrame, holds: pl.DataFrame, g: pl.DataFrame, notify: int,
                 base_ns: dict, res_ns: float, params: Params) -> dict | None:
    """The finding of one episode: its waits ``w``, and its lock's grants ``ev``, holds and free gaps ``g``."""
    polls = int(w["polls"].sum())
    if polls < params.min_polls:
        return None
    r0 = w.row(0, named=True)
    kind, server, resource = r0["kind"], r0["server"], r0["resource"]
    e0, e1 = int(w["start_ns"].min()), int(w["end_ns"].max())
    period = max(e1 - e0, 1)
    pollers = w.filter(pl.col("polls") > 0)
    waiters = pollers["waiter"].n_unique()
    queued = w.filter(pl.col("blocked"))["waiter"].n_unique()
    granted = w.filter(pl.col("grant_ns").is_not_null())
    n_grants = granted.height
    ppg = polls / n_grants if n_grants else float(polls)
    # retry intervals per client, and their class over all waits
    per_client = []
    all_chains = []
    for who in pollers.sort("start_ns")["waiter"].unique(maintain_order=True).to_list():
        chains = retry_intervals(pollers.filter(pl.col("waiter") == who)["tries"].to_list())
        all_chains += chains
        per_client.append((who, _interval_text(chains)[1]))
    cls, cls_text = _interval_text(all_chains)
    # free time
    free_sum = int(g["gap_ns"].sum()) if g.height else 0
    share = free_sum / period
    base = base_ns.get((server, kind))
    unseen = n_grants - granted.filter(pl.col("grant_ns").is_in(g["grant_ns"].implode())).height if g.height \
        else n_grants
    # order and starvation
    st = starvation(w, holds)
    overtakes_total = int(st["overtaken"].sum())
    k = params.starve_min_overtakes
    starved = st.filter((pl.col("overtaken") >= k) | (pl.col("grant_ns").is_null() & (pl.col("others_granted") >= k))) \
        .sort("others_granted", "overtaken", "start_ns", descending=[True, True, False])
    sev = _severity(share, waiters, ppg, starved.height, params)
    holder, holder_text = _holder(w, ev)
    proto = "NFS4ERR_DENIED" if kind == "nfs4" else "NLM4_DENIED"
    parts = [f"{waiters} client{'s' if waiters != 1 else ''} polled for the lock on {resource}"
             f"{_range_text(r0['range_lo'], r0['range_hi'])} at {server} for {fmt_ns(period)}: {polls} LOCK "
             f"attempts denied ({proto}), {n_grants} grant{'s' if n_grants != 1 else ''} to {'waiters' if n_grants != 1 else 'a waiter'}"
             + (f" ({fmt_number(ppg)} polls per grant)" if n_grants else " (none granted while the capture lasts)")]
    named = "; ".join(f"{who} {txt}" for who, txt in per_client[:MAX_NAMED])
    more = f"; and {len(per_client) - MAX_NAMED} more" if len(per_client) > MAX_NAMED else ""
    parts.append(f"retry interval {cls_text} — {named}{more}")
    if g.height:
        med = float(g["gap_ns"].median())
        cmp = ""
        if base:
            cmp = (f", {fmt_number(med / base)}x the {fmt_ns(base)} lock response time: waiters only notice "
                   "on their next poll")
        if med < res_ns:
            cmp += f" (within the {fmt_ns(res_ns)} timestamp resolution)"
        parts.append(f"the lock sat free {fmt_ns(med)} on median after each of {g.height} release"
                     f"{'s' if g.height != 1 else ''} before the next grant ({fmt_ns(free_sum)} in all, "
                     f"{share * 100:.3g}% of the contended period){cmp}")
    else:
        parts.append("no release followed by a grant inside the episode: the free time is not measurable")
    if unseen > 0 and n_grants:
        parts.append(f"{unseen} grant{'s' if unseen != 1 else ''} came with no release visible before "
                     f"{'them' if unseen != 1 else 'it'} (lease expiry, or a release outside the capture)")
    if n_grants > 1 or overtakes_total:
        parts.append("grants went in first-request order (FIFO)" if overtakes_total == 0 else
                     f"{overtakes_total} grant{'s' if overtakes_total != 1 else ''} went to a client that asked "
                     "after another still waiting: the winner is whoever polls first after a release, not a queue")
    phrases: dict[str, list[str]] = {}  # one sentence for the starved clients that fared alike
    for s in starved.iter_rows(named=True):
        waited = (s["grant_ns"] if s["grant_ns"] is not None else s["end_ns"]) - s["start_ns"]
        if s["overtaken"] >= k:
            text = (f"denied {s['polls']} times over {fmt_ns(waited)} while {s['overtaken']} grants went to later "
                    "askers, " + ("then granted" if s["grant_ns"] is not None else "never granted while the capture lasts"))
        else:
            text = (f"denied {s['polls']} times over {fmt_ns(waited)} and never granted while the capture lasts, "
                    f"while {s['others_granted']} grants went to others")
        phrases.setdefault(text, []).append(s["waiter"])
    for text, who in list(phrases.items())[:MAX_NAMED]:
        names = ", ".join(who[:MAX_NAMED]) + (f" and {len(who) - MAX_NAMED} more" if len(who) > MAX_NAMED else "")
        parts.append(f"{names} starved: {'each ' if len(who) > 1 else ''}{text}")
    if holder_text:
        parts.append(holder_text)
    if queued:
        parts.append(f"{queued} client{'s' if queued != 1 else ''} waited the protocol's way (NLM4_BLOCKED, then "
                     "a GRANTED callback): not polling")
    if kind == "nfs4":
        minor = r0["minorversion"]
        note = ("NFSv4 has no lock wait: a conflicting LOCK is denied and the client polls (RFC 7530 §16.10, "
                "§9.4; Linux re-tries after 1 s doubling to 30 s)")
        if minor is not None and minor >= 1:
            note += (f"; {notify} CB_NOTIFY_LOCK callback(s) in the capture: NFSv4.1's notification "
                     "(RFC 8881 §20.11) removes the polling when the client asks for it and the server sends it")
        else:
            note += ("; these are NFSv4.0 COMPOUNDs, which have no lock notification — NFSv4.1's CB_NOTIFY_LOCK "
                     "(RFC 8881 §20.11) removes the polling when client and server both use it")
        parts.append(note)
    else:
        parts.append("non-blocking NLM LOCKs were denied and re-sent; a blocking LOCK would have been queued by "
                     "the server (NLM4_BLOCKED, then GRANTED)")
    by_close = g.filter(pl.col("released_by") == "CLOSE").height if g.height else 0
    if by_close:
        parts.append(f"{by_close} release{'s were' if by_close != 1 else ' was'} the holder's CLOSE with no LOCKU: "
                     "the lock is taken as freed at the CLOSE reply")
    if not unseen:  # said above when a grant had no release before it
        parts.append("a capture cannot show a release by lease expiry (no packet at all)")
    frames = [x for fr in pollers["frames"].to_list() for x in (fr or [])]
    frames += [x for x in granted["grant_frame"].to_list() if x is not None]
    frames += [x for x in g["release_frame"].to_list() if x is not None] if g.height else []
    clients = set(w["client"].to_list()) | ({holder} if holder else set())
    return {
        "kind": kind, "severity": sev, "start_ns": e0, "end_ns": e1,
        "client": starved["waiter"][0] if starved.height == 1 else None,
        "server": server, "resource": resource, "clients": len(clients),
        "client_identity": r0["client_identity"], "metric": "denied_polls", "value": float(polls),
        "threshold": float(params.min_polls), "unit": "polls",
        "evidence_frames": [int(x) for x in frames],
        "explanation": "; ".join(parts),
        # the measures, for the proof chart and the tests (not finding columns: findings() drops them)
        "episode": ep, "waiters": waiters, "polls": polls, "grants": n_grants, "polls_per_grant": ppg,
        "free_ns": free_sum, "free_share": share, "contended_ns": period,
        "median_free_ns": float(g["gap_ns"].median()) if g.height else None, "releases": g.height,
        "response_ns": base, "backoff": cls, "overtakes": overtakes_total,
        "starved": starved["waiter"].to_list(), "queued_waiters": queued, "holder": holder,
    }


def episode_summaries(capture, params: Params = Params()) -> list[dict]:
    """One dict per reported episode: the finding's fields before :func:`detectors.base.findings`."""
    t = lock_tables(capture, params)
    w = t["waits"]
    if w.height == 0:
        return []
    ev = t["events"]
    base = ev.filter(pl.col("outcome").is_in(["denied", "granted", "released"]) & pl.col("latency_ns").is_not_null()) \
        .group_by("server", "kind").agg(pl.col("latency_ns").median())
    base_ns = {(s, k): float(v) for s, k, v in base.iter_rows() if v}
    res_ns = resolution_ns(capture)
    busy = w.group_by("episode").agg(pl.col("polls").sum()).filter(pl.col("polls") >= params.min_polls)["episode"]
    w = w.filter(pl.col("episode").is_in(busy.implode()))
    if w.height == 0:
        return []
    gkeys = w["gkey"].unique().implode()
    grants_by = ev.filter(pl.col("gkey").is_in(gkeys) & (pl.col("outcome") == "granted")) \
        .partition_by("gkey", as_dict=True)
    holds_by = t["holds"].filter(pl.col("gkey").is_in(gkeys)).partition_by("gkey", as_dict=True)
    gaps_by = t["gaps"].filter(pl.col("episode").is_in(busy.implode())).partition_by("episode", as_dict=True)
    rows = []
    for (ep,), we in sorted(w.partition_by("episode", as_dict=True).items()):
        gk = (we["gkey"][0],)
        row = _episode_row(ep, we, grants_by.get(gk, ev.clear()), holds_by.get(gk, t["holds"].clear()),
                           gaps_by.get((ep,), t["gaps"].clear()), t["notify"], base_ns, res_ns, params)
        if row is not None:
            rows.append(row)
    return rows


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    """Findings: one per contended lock episode polled by its waiters (see the module doc)."""
    rows = episode_summaries(capture, params)
    if not rows:
        return empty_findings()
    return findings(pl.DataFrame(rows, infer_schema_length=None), detector=NAME, params=params)
