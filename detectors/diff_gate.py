"""The gate of ``herdscope diff``: its typed thresholds, how they are written, and the checks that trip.

Every threshold is one field of :class:`GateParams` (declared with :func:`detectors.params.param`, like
a detector's ``Params``: default, meaning, unit); ``--max-p99-increase`` and the other options set them
by name, and ``off`` turns one off. How a value is written depends on its unit:

- ``ratio`` (a relative increase of a latency quantile or of the connection rate): ``20%`` or ``0.2``
  (a bare number is a fraction, at most 1: ``20`` is refused, ``150%`` is how to write more), both
  meaning "AFTER may be up to 20 % above BEFORE";
- ``pp`` (a share's increase, in percentage points: error share, unanswered share, retransmission
  rate): ``1pp`` or ``+1pp``; a bare number or ``%`` is refused as ambiguous;
- ``severity``: one of informational, low, medium, high, critical;
- ``confidence``: ``0.95`` or ``95%``; ``count``: a whole number.

A check is ``passed``, ``failed`` (it trips the gate) or ``skipped`` (turned off, too few samples, or
the row is not in both captures). A quantile check fails only when the change is both larger than
its threshold and significant (the confidence intervals of :mod:`detectors.diff_stats` do not
overlap, :func:`detectors.diff.compare_quantile`); a share check fails when its increase is larger
than the threshold and both sides have ``min_samples`` requests.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from .base import SEVERITIES, SEVERITY_RANK
from .params import param, spec_of

OFF_WORDS = ("off", "none")


@dataclass(frozen=True)
class GateParams:
    """When AFTER is worse than BEFORE: each threshold, its default, and None when turned off."""

    max_p50_increase: float | None = param(
        None, "the largest significant rise of a median latency (p50) per protocol, operation and leg (off by "
        "default: a median moves with the workload's mix of cache hits and misses as much as with a "
        "regression; the tail, p99, is what a user waits on)", unit="ratio")
    max_p99_increase: float | None = param(
        0.20, "the largest significant rise of a p99 latency per protocol, operation and leg", unit="ratio")
    max_error_share_increase: float | None = param(
        1.0, "the largest rise of the share of requests answered with an error, per operation", unit="pp")
    max_unanswered_share_increase: float | None = param(
        1.0, "the largest rise of the share of requests never answered, per operation", unit="pp")
    fail_on_new: str | None = param(
        "medium", "a new finding at or above this severity fails, as does a matched finding whose "
        "severity rose to it (medium: the level no detector reaches on a healthy sample)", unit="severity",
        choices=SEVERITIES)
    max_retransmission_increase: float | None = param(
        0.5, "the largest rise of TCP retransmissions per data segment", unit="pp")
    max_connection_rate_increase: float | None = param(
        1.0, "the largest rise of new TCP connections per second (1.0 = 100 %: double the rate)", unit="ratio")
    confidence: float = param(
        0.95, "two-sided confidence of each quantile's interval; a change is significant when the "
        "intervals do not overlap", unit="confidence", lo=0.5, hi=0.9999)
    min_samples: int = param(
        20, "fewer answered requests on either side: too few samples, the row's checks are skipped",
        unit="count", lo=1)
    min_connections: int = param(
        10, "fewer new TCP connections on both sides: the connection rate check is skipped", unit="count", lo=1)
    min_data_segments: int = param(
        200, "fewer TCP data segments on either side: the retransmission check is skipped", unit="count", lo=1)


GATE_FIELDS = {f.name: f for f in dataclasses.fields(GateParams)}
_PP = re.compile(r"^\+?\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*pp$")
_NUMBER = re.compile(r"^\+?\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(%?)$")


def option_name(field_name: str) -> str:
    """``max_p99_increase`` -> ``--max-p99-increase``: the command-line option of a gate parameter."""
    return "--" + field_name.replace("_", "-")


def parse_value(name: str, raw: str):
    """``raw`` as gate parameter ``name`` takes it (module doc); ValueError with the option and the
    accepted forms otherwise."""
    field = GATE_FIELDS[name]
    spec = spec_of(field)
    text = str(raw).strip().lower()
    where = f"{option_name(name)} {raw!r}"
    if text in OFF_WORDS and spec.unit in ("ratio", "pp", "severity"):
        return None
    if spec.unit == "severity":
        if text not in SEVERITIES:
            raise ValueError(f"{where}: expected one of {', '.join(SEVERITIES)} or off")
        return text
    if spec.unit == "pp":
        m = _PP.match(text)
        if not m:
            raise ValueError(f"{where}: expected percentage points such as 1pp or +0.5pp (or off); "
                             f"a bare number or % would be ambiguous")
        return float(m.group(1))
    m = _NUMBER.match(text)
    if not m or not math.isfinite(float(m.group(1))):
        forms = {"ratio": "20% or 0.2 (or off)", "confidence": "0.95 or 95%", "count": "a whole number"}
        raise ValueError(f"{where}: expected {forms[spec.unit]}")
    value = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
    if spec.unit in ("ratio", "confidence") and not m.group(2) and value > 1:
        raise ValueError(f"{where}: a bare number is a fraction up to 1 (0.2 = 20%); write {m.group(1)}% "
                         f"for a percentage")
    if spec.unit == "count":
        if m.group(2) or not value.is_integer():
            raise ValueError(f"{where}: expected a whole number")
        value = int(value)
    if spec.lo is not None and value < spec.lo or spec.hi is not None and value > spec.hi:
        raise ValueError(f"{where}: expected a value from {spec.lo:g} to {spec.hi:g}" if spec.hi is not None
                         else f"{where}: expected at least {spec.lo:g}")
    return value


def gate_params(options: dict[str, str | None]) -> GateParams:
    """GateParams from ``{field: raw text}`` (None: the default); ValueError for a bad value."""
    changes = {name: parse_value(name, raw) for name, raw in options.items() if raw is not None}
    return dataclasses.replace(GateParams(), **changes)


def describe_gate(params: GateParams) -> dict:
    """The parameters as JSON values (None: off), for the JSON document."""
    return dataclasses.asdict(params)


def format_threshold(name: str, value) -> str:
    """A threshold as a user would type it: ``20%``, ``+1pp``, ``medium``, ``off``."""
    if value is None:
        return "off"
    unit = spec_of(GATE_FIELDS[name]).unit
    if unit == "ratio":
        return f"{value * 100:g}%"
    if unit == "pp":
        return f"+{value:g}pp"
    return str(value)


def relative_change(ratio: float) -> str:
    """``+26%``, ``-50%``; from ten times up a factor, ``x311`` (what ``+30974%`` means)."""
    return f"x{1 + ratio:.0f}" if ratio >= 9 else f"{ratio * 100:+.0f}%"


def gate_help() -> str:
    """One line per gate parameter (its option, default and meaning), for --help and the README."""
    return "\n".join(f"  {option_name(f.name)} (default {format_threshold(f.name, f.default)}): {spec_of(f).help}"
                     for f in dataclasses.fields(GateParams))


# -- the checks ---------------------------------------------------------------------------------------

def _check(name: str, status: str, message: str, **values) -> dict:
    return {"check": name, "status": status, "message": message, **values}


def finding_label(record: dict) -> str:
    """``herd/dns medium 10.77.0.53 api.corp.example (finding 1a2b...)``: a finding in a message."""
    where = " ".join(x for x in (record.get("server"), record.get("resource")) if x)
    return f"{record['detector']}/{record['kind']} {record['severity']} {where} ({record['finding_id']})"


def finding_checks(findings: dict, params: GateParams) -> list[dict]:
    """Two checks: new findings at or above ``fail_on_new``, matched findings whose severity rose to it."""
    level = params.fail_on_new
    if level is None:
        return [_check("new findings", "skipped", "turned off (--fail-on-new off)"),
                _check("severity rises", "skipped", "turned off (--fail-on-new off)")]
    at_level = [r for r in findings["new"] if SEVERITY_RANK[r["severity"]] >= SEVERITY_RANK[level]]
    rose = [c for c in findings["changed"] if c["rose"]
            and SEVERITY_RANK[c["after"]["severity"]] >= SEVERITY_RANK[level]]
    new = (_check("new findings", "failed", f"{len(at_level)} new finding(s) at or above {level}: "
                  + "; ".join(finding_label(r) for r in at_level), threshold=level, count=len(at_level))
           if at_level else _check("new findings", "passed", f"no new finding at or above {level} "
                                   f"({len(findings['new'])} new in all)", threshold=level, count=0))
    up = (_check("severity rises", "failed", f"{len(rose)} finding(s) rose to {level} or above: "
                 + "; ".join(f"{finding_label(c['after'])} was {c['before']['severity']}" for c in rose),
                 threshold=level, count=len(rose))
          if rose else _check("severity rises", "passed", f"no matched finding rose to {level} or above",
                              threshold=level, count=0))
    return [new, up]


def _row_name(row: dict) -> str:
    return " ".join(x for x in (row["protocol"], row["operation"], row["leg"]) if x)


def srt_checks(rows: list[dict], params: GateParams) -> list[dict]:
    """Per SRT row: p50, p99 (relative, significant), error share and unanswered share (points)."""
    out = []
    for row in rows:
        name = _row_name(row)
        for metric, field in (("p50", "max_p50_increase"), ("p99", "max_p99_increase")):
            limit, cmp = getattr(params, field), row[metric]
            check = f"{metric} {name}"
            if limit is None:
                out.append(_check(check, "skipped", f"turned off ({option_name(field)} off)"))
            elif cmp["verdict"] in ("too few samples", "not in both"):
                out.append(_check(check, "skipped", f"{cmp['verdict']}: {cmp['why']}", **_values(cmp)))
            elif cmp["verdict"] == "significant increase" and cmp["change_ratio"] > limit:
                out.append(_check(check, "failed", f"{metric} rose {relative_change(cmp['change_ratio'])} (limit "
                                  f"{format_threshold(field, limit)}), significant: {cmp['why']}",
                                  threshold=limit, **_values(cmp)))
            else:
                out.append(_check(check, "passed", f"{cmp['verdict']} ({cmp['why']})", threshold=limit,
                                  **_values(cmp)))
        for metric, field in (("error_share", "max_error_share_increase"),
                              ("unanswered_share", "max_unanswered_share_increase")):
            limit, cmp = getattr(params, field), row[metric]
            check = f"{metric.replace('_', ' ')} {name}"
            if limit is None:
                out.append(_check(check, "skipped", f"turned off ({option_name(field)} off)"))
            elif cmp["verdict"] in ("too few samples", "not in both"):
                out.append(_check(check, "skipped", cmp["verdict"], **_values(cmp)))
            elif cmp["verdict"] == "significant increase" and cmp["change_pp"] > limit:
                out.append(_check(check, "failed", f"{metric.replace('_', ' ')} rose {cmp['change_pp']:+.2f} "
                                  f"points (limit {format_threshold(field, limit)}), significant: {cmp['why']}",
                                  threshold=limit, **_values(cmp)))
            else:
                out.append(_check(check, "passed", f"{cmp['change_pp']:+.2f} points, {cmp['verdict']} "
                                  f"({cmp['why']})", threshold=limit, **_values(cmp)))
    return out


def _values(cmp: dict) -> dict:
    return {k: cmp.get(k) for k in ("before", "after", "change_ratio", "change_pp") if k in cmp}


def rate_checks(rates: dict, params: GateParams) -> list[dict]:
    """The TCP retransmission rate (points) and new-connection rate (relative) checks."""
    out = []
    for key, field, check in (("retransmission_rate", "max_retransmission_increase", "tcp retransmission rate"),
                              ("connection_rate", "max_connection_rate_increase", "tcp connection rate")):
        limit, cmp = getattr(params, field), rates[key]
        if limit is None:
            out.append(_check(check, "skipped", f"turned off ({option_name(field)} off)"))
        elif cmp["verdict"] == "too few samples":
            out.append(_check(check, "skipped", f"too few samples: {cmp['why']}", **_values(cmp)))
        elif key == "retransmission_rate" and cmp["verdict"] == "significant increase" and cmp["change_pp"] > limit:
            out.append(_check(check, "failed", f"retransmissions per data segment rose {cmp['change_pp']:+.2f} "
                              f"points (limit {format_threshold(field, limit)}), significant: {cmp['why']}",
                              threshold=limit, **_values(cmp)))
        elif key == "connection_rate" and cmp["from_zero"]:
            out.append(_check(check, "failed", f"new connections per second rose from none to {cmp['after']:.3g}",
                              threshold=limit, **_values(cmp)))
        elif key == "connection_rate" and cmp["change_ratio"] is not None and cmp["change_ratio"] > limit:
            out.append(_check(check, "failed", f"new connections per second rose {relative_change(cmp['change_ratio'])} "
                              f"(limit {format_threshold(field, limit)})", threshold=limit, **_values(cmp)))
        else:
            out.append(_check(check, "passed", cmp["why"], threshold=limit, **_values(cmp)))
    return out


def gate(comparison: dict, params: GateParams) -> dict:
    """``{passed, failures: [check...], checks: [check...]}``: every check, findings first."""
    checks = (finding_checks(comparison["findings"], params) + srt_checks(comparison["srt"], params)
              + rate_checks(comparison["rates"], params))
    failures = [c for c in checks if c["status"] == "failed"]
    return {"passed": not failures, "failures": failures, "checks": checks}
