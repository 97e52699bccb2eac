"""The comparison of ``herdscope diff BEFORE AFTER``: two captures measured alike, then set side by side.

Frames in, plain data out (no printing: :mod:`detectors.diff_render` writes it, :mod:`detectors.diff_gate`
judges it, :mod:`detectors.diff_command` runs it).

- **Service response times** per (protocol, operation, leg): the rows of ``herdscope stats``
  (:func:`analyzer.stats.service_response_times`: count, answered, unanswered, errors, p50, p99, the same
  numbers), each quantile with a distribution-free confidence interval from the raw latencies of
  :func:`analyzer.stats.transactions` (:mod:`detectors.diff_stats`). A quantile change is a *significant
  increase* when AFTER's lower bound is above BEFORE's upper bound (a *significant decrease* the other
  way round), *too few samples* when either side has fewer than ``min_samples`` answered requests or the
  interval a rise needs cannot be bounded with that many (p99 at 95 % needs 368), and otherwise *no
  significant change*. SMB2's derived rows (STATUS_PENDING waits, break acknowledgments) have no raw
  sample here: their quantiles are compared but never called significant.
- **Findings** (top-level: a population finding stands for its members) are matched by (detector, kind,
  server, resource), never by time or id. A TCP connection's resource (``client:port-server:port``) is
  matched by its server endpoint, since client ports are ephemeral. Several findings under one key are
  paired worst first (then by start); the unpaired are *new* (AFTER only) or *gone* (BEFORE only); a pair
  whose severity differs is *changed* (``rose`` when AFTER's is higher), otherwise *unchanged*.
- **TCP rates**: new connections (a SYN seen) per second of capture, and retransmissions
  (:func:`analyzer.summary.tcp_totals`, every ``tcp.analysis`` retransmission) per data segment.
"""
from __future__ import annotations

import re

import numpy as np
import polars as pl

from analyzer import stats
from analyzer.summary import tcp_totals

from .base import SEVERITY_RANK
from .diff_stats import quantile_interval, samples_for_upper_bound, share_verdict
from .report import finding_records

QUANTILES = {"p50": 0.5, "p99": 0.99}  # the quantiles compared (the names of analyzer.stats' columns)
SRT_KEYS = ("protocol", "operation", "leg")
SHARE_COUNTS = {"error_share": "errors", "unanswered_share": "unanswered"}  # a share -> the count it is of


# -- measuring one side ---------------------------------------------------------------------------------

def srt_samples(cap) -> dict[tuple, dict]:
    """(protocol, operation, leg) -> the ``stats`` row's values plus ``latencies_ns`` (the sorted
    latencies of its answered requests; None for rows built from other frames)."""
    rows = stats.service_response_times(cap)
    tx = stats.transactions(cap)
    sorted_by_key: dict[tuple, np.ndarray] = {}
    if tx.height:
        grouped = (stats.with_legs(tx).filter(pl.col("answered"))
                   .group_by(list(SRT_KEYS)).agg(pl.col("latency_ns").sort()))
        for protocol, operation, leg, latencies in grouped.iter_rows():
            sorted_by_key[(protocol, operation, leg)] = np.asarray(latencies, dtype=np.int64)
    out = {}
    for row in rows.iter_rows(named=True):
        key = tuple(row[k] for k in SRT_KEYS)
        out[key] = {**{k: row[k] for k in ("count", "answered", "unanswered", "errors", "p50", "p99")},
                    "latencies_ns": sorted_by_key.get(key)}
    return out


def tcp_rates(cap, duration_s: float) -> dict:
    """New connections per second and retransmissions per data segment (module doc)."""
    totals = tcp_totals(cap)
    conns, segments = cap.frame("connections"), cap.frame("tcp_segments")
    new = int(conns["saw_syn"].sum()) if conns.height else 0
    data = int((segments["seglen"] > 0).sum()) if segments.height else 0
    return {"connections": totals["connections"], "new_connections": new, "duration_s": duration_s,
            "connection_rate_per_s": new / duration_s if duration_s > 0 else None,
            "retransmissions": totals["retransmissions"], "data_segments": data,
            "retransmission_rate": totals["retransmissions"] / data if data else None}


def measure(cap, findings: pl.DataFrame | None, label: str) -> dict:
    """One side: its SRT samples, TCP rates and top-level finding records (none without ``findings``).
    Call it before the detectors' ``release`` frees the frames (the SRT and rates read transactions
    and TCP frames)."""
    p = cap.packets
    duration_s = (int(p["ts_ns"].max()) - int(p["ts_ns"].min())) / 1e9 if p.height else 0.0
    return {"srt": srt_samples(cap), "rates": tcp_rates(cap, duration_s),
            "findings": finding_records(findings, label, cap) if findings is not None else []}


# -- comparing --------------------------------------------------------------------------------------

def _side(values: dict | None, params) -> dict | None:
    if values is None:
        return None
    lat = values["latencies_ns"]
    count = values["count"] or 0
    out = {k: values[k] for k in ("count", "answered", "unanswered", "errors", "p50", "p99")}
    out["error_share"] = values["errors"] / count if count else None
    out["unanswered_share"] = values["unanswered"] / count if count else None
    for name, q in QUANTILES.items():
        out[f"{name}_ci"] = list(quantile_interval(lat, q, params.confidence)) if lat is not None and len(lat) \
            else None
    return out


def compare_quantile(name: str, before: dict | None, after: dict | None, params) -> dict:
    """The verdict on one quantile (module doc): before/after point estimates and intervals, the relative
    change and why the verdict is what it is."""
    if before is None or after is None or before[name] is None or after[name] is None:
        return {"before": before and before[name], "after": after and after[name], "change_ratio": None,
                "verdict": "not in both", "why": "answered requests in only one capture"}
    b, a = before[name], after[name]
    change = (a - b) / b if b else None
    out = {"before": b, "after": a, "change_ratio": change, "before_ci": before[f"{name}_ci"],
           "after_ci": after[f"{name}_ci"]}
    nb, na = before["answered"], after["answered"]
    if min(nb, na) < params.min_samples:
        return {**out, "verdict": "too few samples",
                "why": f"{nb} and {na} answered requests; at least {params.min_samples} per side are needed"}
    if out["before_ci"] is None or out["after_ci"] is None:
        return {**out, "verdict": "no significant change", "why": "no raw latencies for this row: not tested"}
    (b_lo, b_hi), (a_lo, a_hi) = out["before_ci"], out["after_ci"]
    level = f"{params.confidence * 100:g}%"
    if a_lo is not None and b_hi is not None and a_lo > b_hi:
        return {**out, "verdict": "significant increase",
                "why": f"AFTER's {level} interval starts at {a_lo} ns, above BEFORE's end {b_hi} ns"}
    if a_hi is not None and b_lo is not None and a_hi < b_lo:
        return {**out, "verdict": "significant decrease",
                "why": f"AFTER's {level} interval ends at {a_hi} ns, below BEFORE's start {b_lo} ns"}
    if a > b and (b_hi is None or a_lo is None):
        need = samples_for_upper_bound(QUANTILES[name], params.confidence)
        return {**out, "verdict": "too few samples",
                "why": f"{name} rose, but {min(nb, na)} requests cannot bound it at {level} "
                       f"(an interval needs at least {need} per side)"}
    return {**out, "verdict": "no significant change", "why": f"the {level} intervals overlap"}


def compare_share(name: str, before: dict | None, after: dict | None, params) -> dict:
    """An error or unanswered share: before, after (fractions) and the change in percentage points."""
    if before is None or after is None:
        return {"before": before and before[name], "after": after and after[name], "change_pp": None,
                "verdict": "not in both"}
    b, a = before[name] or 0.0, after[name] or 0.0
    out = {"before": b, "after": a, "change_pp": (a - b) * 100.0}
    nb, na = before["count"], after["count"]
    if min(nb, na) < params.min_samples:
        return {**out, "verdict": "too few samples",
                "why": f"{nb} and {na} requests; at least {params.min_samples} per side are needed"}
    hits = SHARE_COUNTS[name]
    return {**out, **share_verdict((before[hits], nb), (after[hits], na), params.confidence)}


def compare_srt(before: dict[tuple, dict], after: dict[tuple, dict], params) -> list[dict]:
    """One row per (protocol, operation, leg) in either capture (AFTER's order, then BEFORE's others)."""
    rows = []
    for key in list(after) + [k for k in before if k not in after]:
        b, a = _side(before.get(key), params), _side(after.get(key), params)
        row = dict(zip(SRT_KEYS, key))
        row.update({"before": b, "after": a})
        for name in QUANTILES:
            row[name] = compare_quantile(name, b, a, params)
        for name in ("error_share", "unanswered_share"):
            row[name] = compare_share(name, b, a, params)
        rows.append(row)
    return rows


_ENDPOINT = re.compile(r"^(?P<a>.+):(?P<ap>\d+)-(?P<b>.+):(?P<bp>\d+)$")


def match_resource(resource: str | None, server: str | None) -> str | None:
    """The resource a finding is matched by: a connection (``a:p-b:q``) by its server's endpoint."""
    m = _ENDPOINT.match(resource or "")
    if not m or server is None:
        return resource
    for side in ("a", "b"):
        if m.group(side).strip("[]") == server:
            return f"{m.group(side)}:{m.group(side + 'p')}"
    return resource


def match_key(record: dict) -> tuple:
    """(detector, kind, server, resource): what a finding is matched by across captures."""
    return (record["detector"], record["kind"], record["server"], match_resource(record["resource"], record["server"]))


def _worst_first(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: (-SEVERITY_RANK[r["severity"]], r["start_ns"] or 0, r["finding_id"]))


def compare_findings(before: list[dict], after: list[dict]) -> dict:
    """``{new, gone, changed, unchanged}`` (module doc); changed and unchanged are ``{key, before, after,
    rose}`` pairs."""
    groups: dict[tuple, tuple[list, list]] = {}
    for side, records in ((0, before), (1, after)):
        for r in records:
            groups.setdefault(match_key(r), ([], []))[side].append(r)
    out = {"new": [], "gone": [], "changed": [], "unchanged": []}
    for key, (b_list, a_list) in groups.items():
        b_list, a_list = _worst_first(b_list), _worst_first(a_list)
        for b, a in zip(b_list, a_list):
            pair = {"key": list(key), "before": b, "after": a,
                    "rose": SEVERITY_RANK[a["severity"]] > SEVERITY_RANK[b["severity"]]}
            out["changed" if a["severity"] != b["severity"] else "unchanged"].append(pair)
        out["new"] += a_list[len(b_list):]
        out["gone"] += b_list[len(a_list):]
    for name in ("new", "gone"):
        out[name] = _worst_first(out[name])
    return out


def compare_rates(before: dict, after: dict, params) -> dict:
    """The two TCP rates side by side, each with its change and whether there were enough samples."""
    b_r, a_r = before["retransmission_rate"], after["retransmission_rate"]
    few = min(before["data_segments"], after["data_segments"]) < params.min_data_segments
    counted = (f"{before['retransmissions']} of {before['data_segments']} and {after['retransmissions']} "
               f"of {after['data_segments']} data segments retransmitted")
    retrans = {"before": b_r, "after": a_r,
               "change_pp": (a_r - b_r) * 100.0 if b_r is not None and a_r is not None else None}
    if few or b_r is None or a_r is None:
        retrans.update(verdict="too few samples", before_ci=None, after_ci=None,
                       why=counted + f" (at least {params.min_data_segments} data segments per side are needed)")
    else:
        tested = share_verdict((before["retransmissions"], before["data_segments"]),
                               (after["retransmissions"], after["data_segments"]), params.confidence)
        retrans.update(tested, why=f"{counted}; {tested['why']}")
    b_c, a_c = before["connection_rate_per_s"], after["connection_rate_per_s"]
    few = max(before["new_connections"], after["new_connections"]) < params.min_connections
    change = (a_c - b_c) / b_c if b_c and a_c is not None else None
    conns = {"before": b_c, "after": a_c, "change_ratio": change, "from_zero": b_c == 0 and bool(a_c),
             "verdict": "too few samples" if few or a_c is None or b_c is None else "compared",
             "why": f"{before['new_connections']} new connections in {before['duration_s']:.3f} s and "
                    f"{after['new_connections']} in {after['duration_s']:.3f} s"
                    + (f" (at least {params.min_connections} on one side are needed)" if few else "")}
    return {"retransmission_rate": retrans, "connection_rate": conns,
            "before": before, "after": after}


def compare(before: dict, after: dict, params) -> dict:
    """The whole comparison of two :func:`measure` results: ``{srt, findings, rates}``."""
    return {"srt": compare_srt(before["srt"], after["srt"], params),
            "findings": compare_findings(before["findings"], after["findings"]),
            "rates": compare_rates(before["rates"], after["rates"], params)}
