"""NFSv4 delegation recall queue (``delegation_recall``): a client slow to return a recalled
delegation while other clients' conflicting requests are answered NFS4ERR_DELAY behind it.

The pathology
    An NFSv4 server that granted a client a delegation (RFC 7530 §10.4, RFC 8881 §10.4) must recall
    it (CB_RECALL, RFC 7530 §10.4.4 and §18.2, RFC 8881 §20.2) when another client opens the file in a
    conflicting way (or SETATTRs, REMOVEs, RENAMEs it). Until the holder flushes its cached writes and
    returns the delegation (DELEGRETURN, RFC 7530 §16.6 / RFC 8881 §18.6) the server answers the
    conflicting requests NFS4ERR_DELAY (RFC 7530 §13.1.1.3, RFC 8881 §15.1.1.3), and the clients retry
    on their own timer (Linux ``nfs4_delay``: 100 ms doubling to 15 s, fs/nfs/nfs4proc.c
    NFS4_POLL_RETRY_MIN/MAX). A slow holder makes every conflicting opener queue, and each notices the
    return only at its next retry. A holder that never returns it (its callback path down, or buggy)
    keeps them waiting until the server revokes the delegation, about a lease period after the recall
    (RFC 7530 §10.4.6-10.4.7, RFC 8881 §10.4.6); the holder's later use of it is answered
    NFS4ERR_EXPIRED / BAD_STATEID (4.0), DELEG_REVOKED / ADMIN_REVOKED (4.1).

The signal (from ``nfs_transactions``; :mod:`detectors.delegation_recall_table` builds the rows)
    * per recall (the CB_RECALLs naming one delegation stateid: a server that sends it again is one
      recall; on the callback connection for 4.0, on the fore connection for 4.1): the time from the
      first CB_RECALL to the holder's DELEGRETURN of that stateid (a CLOSE does not return a
      delegation), compared with ``max(min_return_latency_ns, return_latency_factor x baseline)``,
      the baseline being the larger of the holder connection's RTT and the server's median NFS
      response time; the holder's WRITE/COMMITs between the recall and the return (its flush) and its
      answer to the CB_RECALL itself are reported;
    * the waiters: other clients' requests on the same file (the same resolved path, or the recalled
      handle) answered NFS4ERR_DELAY from ``trigger_window_ns`` before the recall (the request that
      triggered it) until the return; per client and operation: its DELAY answers (its retries), its
      total wait (first DELAY'd request to the first other answer), how long after the return it got
      through (the cost of the retry timer), and the peak queue depth
      (:func:`detectors.smb_break_queue.queue_depth_of`); the holder's own requests are not waiters;
    * recalls never answered: no DELEGRETURN while the capture lasts (longer than the threshold);
      "revoked" when the capture runs ``lease_ns`` past the recall or shows a revoked-state answer
      for the stateid;
    * recall storms: ``storm_min_recalls`` or more recalls of one file within ``storm_window_ns``
      (the server keeps granting a delegation and recalling it), with the grants seen;
    * recalls the capture cannot show: NFS4ERR_DELAY answers on a file that no visible CB_RECALL
      explains (``unseen_min_delays`` of them) are reported ``informational``: the callback
      connection was not captured (NFSv4.0 callbacks go to the port the client named in SETCLIENTID,
      which this decoder reads only when it is one of the NFS ports), or the server delayed them for
      another reason.

Kinds: ``slow_return``, ``unreturned``, ``storm``, ``recall_unseen``.

Known false positives / limits
    * A server that holds the conflicting request instead of answering NFS4ERR_DELAY (Linux nfsd
      waits briefly first) shows fewer or no waiters: the slow return is still reported.
    * A DELAY answer for another reason (a migrated file, a busy back end) on a recalled file within
      its window is counted as a waiter.
    * Matching waiters to the recall needs the file's path (resolved from the handles seen) or the
      recalled handle itself: an OPEN by name in a directory whose handle the capture never resolved
      is missed.
    * A capture taken at the holder sees a shorter recall-to-return time than the server (by an RTT).
    * The delegation stateid an OPEN returned is not decoded: the grant before a recall is found by
      client and path.

Client identity: :func:`detectors.base.client_identity` over the capture's NFS (non-callback)
transactions. The finding's ``client`` is the holder; the waiters are counted in ``clients``.

Severity rule (per recall): by the total time the waiters waited behind it — below ``medium_wait_s``
``low`` (also when nobody waited), then ``medium``, ``high`` from ``high_wait_s``, ``critical`` from
``critical_wait_s``; at least ``high`` when ``many_waiters`` or more waiters queued. Storms: the same
scale on their waiters' total wait. ``informational`` when the holder's direction is not in the
capture (an unreturned recall cannot be judged) and for ``recall_unseen``.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from .base import NS_PER_MS, NS_PER_S, empty_findings, findings, fmt_ns, severity_from_scale
from .delegation_recall_table import recall_table, unexplained_delays
from .params import LOWER, UPPER, param
from .smb_break_queue import severity_at_least

NAME = "delegation_recall"
KINDS = ("slow_return", "unreturned", "storm", "recall_unseen")
# every frame it reads (packets: where the capture ends; interfaces: resolution_ns; connections: RTT)
REQUIRES = ("nfs_transactions", "connections", "packets", "interfaces")
ORDER = 31  # next to its SMB twin smb_break_queue (30)
# its findings are the union of its findings per server partition (base.py; tests/test_partitions.py):
# an NFS server's partition holds its callback channel too (analyzer/partitions.py)
PARTITION = "server"
# the waiters' NFS4ERR_DELAY retries that retry_storm sees on the recalled file in the recall's window are
# this recall's cost, not a storm of their own: they become the finding's members (detectors/population.py)
EXPLAINS = {kind: {"service": "resource", "detector": "retry_storm", "kinds": ("nfs",), "member_service": "resource"}
            for kind in ("slow_return", "unreturned")}


@dataclass(frozen=True)
class Params:
    """Thresholds and windows of the delegation-recall detector."""

    min_return_latency_ns: int = param(50_000_000, "slow-return floor: delegations returned faster than this "
                                                   "after the CB_RECALL are never reported", unit="ns",
                                       gate=LOWER, lo=0)
    return_latency_factor: float = param(20.0, "... and at least this multiple of the path baseline (max of "
                                               "the holder's RTT and the server's median NFS response time)",
                                         unit="x", gate=LOWER, lo=0.0)
    lease_ns: int = param(90_000_000_000, "the server's lease: a recall unanswered this long is revoked (RFC "
                                          "7530 §10.4.6; Linux nfsd 90 s, nfs-ganesha Lease_Lifetime 60 s)",
                          unit="ns", lo=1)
    trigger_window_ns: int = param(1_000_000_000, "a request answered NFS4ERR_DELAY this long before the "
                                                  "CB_RECALL still waits behind it (it triggered the recall)",
                                   unit="ns", lo=0)
    min_waiter_wait_ns: int = param(10_000_000, "a client counts as waiting behind a recall only if it waited "
                                                "at least this long (first DELAY'd request to its answer)",
                                    unit="ns", gate=LOWER, lo=0)
    medium_wait_s: float = param(0.5, "severity: medium from this total time others waited behind one recall",
                                 unit="s", gate=LOWER, lo=0.0)
    high_wait_s: float = param(5.0, "... high from this", unit="s", gate=LOWER, lo=0.0)
    critical_wait_s: float = param(60.0, "... critical from this", unit="s", gate=LOWER, lo=0.0)
    many_waiters: int = param(10, "at least high when this many waiters queued behind one recall",
                              unit="waiters", gate=LOWER, lo=1)
    storm_min_recalls: int = param(6, "recall storm: at least this many recalls of one file (at least 2) ...",
                                   unit="recalls", gate=LOWER, lo=2)
    storm_window_ns: int = param(10_000_000_000, "... within this window", unit="ns", lo=1)
    unseen_min_delays: int = param(2, "recall_unseen: at least this many NFS4ERR_DELAY answers on one file "
                                      "that no visible recall explains", unit="requests", gate=LOWER, lo=1)


def _severity(params: Params) -> pl.Expr:
    return severity_from_scale(pl.col("total_wait_ns") / NS_PER_S,
                               (0.0, params.medium_wait_s, params.high_wait_s, params.critical_wait_s))


def _recall_findings(r: pl.DataFrame, params: Params) -> pl.DataFrame:
    slow = pl.col("latency_ns").is_not_null() & (pl.col("latency_ns") > pl.col("threshold_ns"))
    unreturned = pl.col("return_ts_ns").is_null() & (pl.col("observed_after_ns") > pl.col("threshold_ns"))
    f = r.filter(slow | unreturned)
    if f.height == 0:
        return pl.DataFrame()
    blind = pl.col("return_ts_ns").is_null() & (pl.col("holder_dir_seen") == False)  # noqa: E712
    f = f.with_columns(_severity(params).alias("severity")).with_columns(
        severity_at_least(pl.col("severity"), pl.col("waiters") >= params.many_waiters, "high").alias("severity"),
    ).with_columns(pl.when(blind).then(pl.lit("informational")).otherwise(pl.col("severity")).alias("severity"),
                   blind.alias("blind"))
    return pl.DataFrame([_recall_row(x, params) for x in f.iter_rows(named=True)], infer_schema_length=None)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _recall_row(x: dict, params: Params) -> dict:
    holder = x["holder_id"]
    kind = (x.get("grant_type") or "").replace("OPEN_DELEGATE_", "").lower()
    what = f"the {kind + ' ' if kind else ''}delegation on {x['resource'] or '(path not captured)'}"
    recall = "CB_RECALL" + (f" (sent {x['cb_calls']} times)" if x["cb_calls"] > 1 else "")
    returned = x["return_ts_ns"] is not None
    revoked_answer = x.get("revoked_status")
    if x["blind"]:
        lead = (f"no DELEGRETURN of {what} recalled from client {holder} is visible in the "
                f"{fmt_ns(x['observed_after_ns'])} the capture lasts after the {recall}, but this capture has no "
                f"packets from that client on its connection, so it cannot show one")
    elif not returned:
        if x["observed_after_ns"] >= params.lease_ns or revoked_answer:
            lead = (f"client {holder} never returned {what} after the {recall}: no DELEGRETURN in the "
                    f"{fmt_ns(x['observed_after_ns'])} the capture lasts after it"
                    + (f", past the {fmt_ns(params.lease_ns)} lease after which the server revokes it (RFC 7530 "
                       f"§10.4.6)" if x["observed_after_ns"] >= params.lease_ns else ""))
        else:
            lead = (f"client {holder} had not returned {what} {fmt_ns(x['observed_after_ns'])} after the {recall}, "
                    f"when the capture ends (a server revokes it after its lease, {fmt_ns(params.lease_ns)} assumed)")
        if revoked_answer:
            lead += (f"; the server answered its {x['revoked_operation']} with {revoked_answer} "
                     f"{fmt_ns(x['revoked_ts_ns'] - x['ts_ns'])} after the recall (revoked)")
    else:
        lead = f"client {holder} took {fmt_ns(x['latency_ns'])} to return {what} after the {recall}"
        if x.get("return_status") and x["return_status"] != "NFS4_OK":
            lead += f" (its DELEGRETURN was answered {x['return_status']}: the server had revoked it by then)"
    cb = ""
    if x["cb_answered"] and x["cb_latency_ns"] is not None:
        cb = f"; it answered the CB_RECALL {x['cb_status']} in {fmt_ns(x['cb_latency_ns'])}"
    elif x["cb_answered"] is False:
        cb = "; it never answered the CB_RECALL (callback path down?)"
    flush = ""
    if x["flush_ops"]:
        flush = (f"; it sent {_plural(x['flush_ops'], 'WRITE/COMMIT')}"
                 + (f" ({x['flush_bytes']:,} bytes)" if x["flush_bytes"] else "")
                 + (" between the recall and the return (flushing its cached writes)" if returned
                    else " after the recall"))
    n = x["waiters"]
    if n:
        others = len(x["waiter_client_ids"] or [])
        queue = (f"; {x['waiter_ops']} from {_plural(others, 'other client')} waited behind it "
                 f"({_plural(x['waiter_delays'], 'NFS4ERR_DELAY answer')}), the longest {fmt_ns(x['max_wait_ns'])}"
                 + (f", {fmt_ns(x['total_wait_ns'])} in all, queue depth up to {x['queue_depth']}" if n > 1 else ""))
        if returned and x["median_after_return_ns"] is not None:
            queue += (f"; they got through a median {fmt_ns(x['median_after_return_ns'])} (at most "
                      f"{fmt_ns(x['max_after_return_ns'])}) after the return: the cost of their retry timers")
        elif not returned and x["waiters_through"]:
            queue += (f"; {x['waiters_through']} got through {fmt_ns(x['last_through_ns'] - x['ts_ns'])} after the "
                      f"recall without a return (the server revoked the delegation)")
    else:
        queue = "; no other client's request was answered NFS4ERR_DELAY behind it"
    if x["baseline_ns"]:
        thr = (f"; threshold {fmt_ns(x['threshold_ns'])} (the larger of {fmt_ns(params.min_return_latency_ns)} and "
               f"{params.return_latency_factor:g}x the {fmt_ns(x['baseline_ns'])} path baseline)")
    else:
        thr = f"; threshold {fmt_ns(x['threshold_ns'])} (no RTT or response time measured to compare with)"
    frames = (list(x["cb_frames"] or []) + [x.get("return_frame"), x.get("return_response_frame"),
                                            x.get("grant_frame"), x.get("grant_response_frame"),
                                            x.get("revoked_frame")] + list(x["waiter_frames"] or []))
    value = x["latency_ns"] if returned else x["observed_after_ns"]
    end = x["return_ts_ns"] if returned else x["ts_ns"] + x["observed_after_ns"]
    ids = {holder} | set(x["waiter_client_ids"] or [])
    return {
        "kind": "slow_return" if returned else "unreturned", "severity": x["severity"],
        "start_ns": x["ts_ns"], "end_ns": max(end, x["last_through_ns"] or end), "client": holder,
        "server": x["nfs_server"], "resource": x["resource"], "clients": len(ids),
        "client_identity": x["client_identity"], "metric": "recall_return_ms", "value": value / NS_PER_MS,
        "threshold": x["threshold_ns"] / NS_PER_MS, "unit": "ms",
        "evidence_frames": [int(v) for v in frames if v is not None],
        "explanation": lead + cb + flush + queue + thr,
    }


def _storm_findings(r: pl.DataFrame, params: Params) -> pl.DataFrame:
    k, window = params.storm_min_recalls, params.storm_window_ns
    grp = ["nfs_server", "resource"]
    s = r.filter(pl.col("resource").is_not_null()).sort(*grp, "ts_ns", "rid")
    if s.height < k:
        return pl.DataFrame()
    # a recall is in a storm when it is one of k consecutive recalls of the file within the window
    dense = ((pl.col("ts_ns").shift(-(k - 1)).over(grp) - pl.col("ts_ns")) <= window).fill_null(False)
    s = s.with_columns(dense.alias("_dense")).with_columns(
        pl.col("_dense").cast(pl.Int8).rolling_max(k, min_samples=1).over(grp).cast(pl.Boolean).alias("_in"))
    s = s.filter(pl.col("_in"))
    if s.height == 0:
        return pl.DataFrame()
    s = s.with_columns(((pl.col("ts_ns") - pl.col("ts_ns").shift(1).over(grp)).fill_null(window + 1) > window)
                       .cum_sum().over(grp).alias("_ep"))
    eps = s.group_by(*grp, "_ep").agg(
        pl.len().alias("n"), pl.col("ts_ns").min().alias("start_ns"),
        pl.max_horizontal(pl.col("ts_ns"), pl.col("return_ts_ns").fill_null(0)).max().alias("end_ns"),
        pl.col("holder_id").n_unique().alias("holders"),
        pl.concat_list(pl.col("holder_id"), pl.col("waiter_client_ids")).explode().drop_nulls().unique().alias("ids"),
        pl.col("total_wait_ns").sum(), pl.col("waiters").sum(), pl.col("frame").alias("frames"),
        pl.col("grant_frame").drop_nulls().alias("grant_frames"), pl.col("client_identity").first(),
    ).filter(pl.col("n") >= k)
    if eps.height == 0:
        return pl.DataFrame()
    eps = eps.with_columns(severity_at_least(_severity(params), pl.lit(True), "low").alias("severity"))
    rows = []
    for e in eps.iter_rows(named=True):
        span = max(1, e["end_ns"] - e["start_ns"])
        rows.append({
            "kind": "storm", "severity": e["severity"], "start_ns": e["start_ns"], "end_ns": e["end_ns"],
            "client": None, "server": e["nfs_server"], "resource": e["resource"], "clients": len(e["ids"]),
            "client_identity": e["client_identity"], "metric": "recalls_in_window", "value": float(e["n"]),
            "threshold": float(k), "unit": "recalls",
            "evidence_frames": [int(v) for v in e["frames"] + e["grant_frames"]],
            "explanation": (
                f"{e['n']} delegation recalls of {e['resource']} in {fmt_ns(span)} "
                f"({e['n'] / (span / NS_PER_S):.3g}/s) from {_plural(e['holders'], 'holder')}"
                + (f", {len(e['grant_frames'])} grants seen" if e["grant_frames"] else "")
                + ": the server keeps granting a delegation on this file and recalling it"
                + (f"; {e['waiters']} waiter(s) waited {fmt_ns(e['total_wait_ns'])} in all behind these recalls"
                   if e["waiters"] else "; nobody waited long behind them")
                + f" (storm: at least {k} recalls within {fmt_ns(window)})"),
        })
    return pl.DataFrame(rows, infer_schema_length=None)


def _unseen_findings(capture, r: pl.DataFrame, params: Params) -> pl.DataFrame:
    u = unexplained_delays(capture, params, r)
    if u.height == 0:
        return pl.DataFrame()
    u = u.filter(pl.col("delays") >= params.unseen_min_delays)
    rows = []
    for x in u.iter_rows(named=True):
        grant = (f"; client {x['grant_holder']} was granted a {x['grant_type'].replace('OPEN_DELEGATE_', '').lower()} "
                 f"delegation on it (frame {x['grant_frame']})" if x["grant_holder"] else "")
        if x["return_frame"] is not None:
            grant += (f"; client {x['return_client']} returned a delegation on it (DELEGRETURN, frame "
                      f"{x['return_frame']}) {fmt_ns(x['return_ts_ns'] - x['start_ns'])} after the first DELAY")
        why = ("no CB_RECALL for this file is visible" if x["callbacks_seen"] else
               "the capture holds no callback (CB_COMPOUND) at all: an NFSv4.0 callback connection goes to the port "
               "the client named in SETCLIENTID, which was not captured or not decoded")
        rows.append({
            "kind": "recall_unseen", "severity": "informational", "start_ns": x["start_ns"], "end_ns": x["end_ns"],
            "client": x["client_ids"][0] if x["clients"] == 1 else None, "server": x["nfs_server"],
            "resource": x["resource"], "clients": x["clients"], "client_identity": x["client_identity"],
            "metric": "delayed_requests", "value": float(x["delays"]), "threshold": float(params.unseen_min_delays),
            "unit": "requests", "evidence_frames": [int(v) for v in x["frames"]] + [
                int(v) for v in (x["grant_frame"], x["return_frame"]) if v is not None],
            "explanation": (
                f"{_plural(x['delays'], 'request')} ({x['ops']}) from {_plural(x['clients'], 'client')} on "
                f"{x['resource']} were answered NFS4ERR_DELAY over {fmt_ns(max(0, x['end_ns'] - x['start_ns']))}"
                f"{grant}, but {why}: the server was probably recalling a delegation (RFC 7530 §10.4) this capture "
                f"cannot show, so " + ("when the recall was sent (the holder's reaction time) is unknown"
                                      if x["return_frame"] is not None else
                                      "the holder and its return time are unknown")),
        })
    return pl.DataFrame(rows, infer_schema_length=None)


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    """Findings: slow or missing returns of recalled delegations with the NFS4ERR_DELAY queue behind
    them, recall storms on one file, and DELAY answers no visible recall explains (see the module doc)."""
    r = recall_table(capture, params)
    parts = [_unseen_findings(capture, r, params)]
    if r.height:
        parts += [_recall_findings(r, params), _storm_findings(r, params)]
    parts = [p for p in parts if p.height]
    if not parts:
        return empty_findings()
    return findings(pl.concat(parts, how="diagonal_relaxed"), detector=NAME, params=params)
