"""Ground truth against findings: the one copy of how a manifest's expectations are matched.

A manifest (``samples/MANIFEST.toml``, ``samples/eval/MANIFEST.toml``, or the ``MANIFEST.json``
that ``samples/synth_scenarios.py write`` produces) lists captures; each has ``healthy``,
``silent`` (detectors that must report nothing at or above medium), optionally ``below_high``
(detectors that must report nothing at or above high), and ``expect`` entries: ``detector``,
``min_severity``, ``start_s`` (seconds after the capture's first packet), ``tolerance_s``,
``server`` (a substring of the finding's server; empty: any), ``resource``, ``count`` and
``count_tolerance``, optionally ``kind`` (the finding's kind must equal it) and
``measured.end_s`` (when the pathology ended).

An expectation is *matched* by a top-level finding (a population's members, listed only with
``--expand``, are not counted again) of its detector (and kind), on its server, naming its
resource (either contains the other, any case), that starts inside the pathology's own
interval: from ``start_s - tolerance_s`` to ``measured.end_s + tolerance_s`` (``end_s`` is
``start_s`` when the manifest does not give it), at or above its ``min_severity``. It holds when
the number of matches is ``count +- count_tolerance`` but at least one (none needed only when
``min_severity`` is ``informational``: a sweep point that may not fire).

A ``silent`` (or ``below_high``) entry names a detector, or ``detector/kind`` for one kind of it
(a capture where the detector may rightly report one kind but not another).

Generator labels (``samples/synth.py``'s label keys, as ``samples/rocev2_synth.py`` writes them
beside each capture) become expectations with ``expects_from_labels``.

Used by ``tests/test_detectors_samples.py`` and ``tests/test_detectors_eval.py`` (which assert),
``tests/benchmarks/evaluate.py`` (which counts) and ``samples/make_eval.py --scan`` (which prints
verdicts). Findings are a detectors.base findings frame (``severity`` an Enum of SEVERITIES).
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import polars as pl

from detectors import top_level as top_level_findings
from detectors.base import SEVERITIES, SEVERITY_RANK

SEC = 1_000_000_000
SILENT_BAR = "medium"          # a ``silent`` detector reports nothing at or above this
BELOW_HIGH_BAR = "high"        # a ``below_high`` detector reports nothing at or above this
OPTIONAL_FLOOR = "informational"   # an expectation with this min_severity may have no match


def expects_from_labels(labels: list[dict], first_ns: int, slack_s: float,
                        min_severity: str = SILENT_BAR) -> list[dict]:
    """Expectations from generator labels: one per label (its detector, server and resource), in the
    label's own interval (``start_ns``..``end_ns``, as ``start_s``/``measured.end_s`` after
    ``first_ns``) widened by ``slack_s``, one finding at ``min_severity`` or worse; ``kind`` is the
    label's ``parameters.kind`` or, for go-back-N labels, ``parameters.trigger`` (nak / timeout)."""
    out = []
    for lab in labels:
        p = lab.get("parameters") or {}
        e = {"detector": lab["detector"], "min_severity": min_severity,
             "start_s": (lab["start_ns"] - first_ns) / SEC, "tolerance_s": slack_s,
             "server": lab.get("server") or "", "resource": lab.get("resource") or "", "count": 1,
             "count_tolerance": 0, "measured": {"end_s": (lab["end_ns"] - first_ns) / SEC}}
        kind = p.get("kind", p.get("trigger"))
        if kind:
            e["kind"] = kind
        out.append(e)
    return out


def _named(entries) -> pl.Expr:
    """Findings of the detectors named in ``entries`` (``detector`` or ``detector/kind``)."""
    whole = [d for d in entries if "/" not in d]
    expr = pl.col("detector").is_in(whole)
    for d in entries:
        if "/" in d:
            det, kind = d.split("/", 1)
            expr = expr | ((pl.col("detector") == det) & (pl.col("kind") == kind))
    return expr


def load_manifest(path: str | Path) -> list[dict]:
    """The ``[[capture]]`` records of a TOML manifest, or the ``capture`` list of a JSON one."""
    path = Path(path)
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    return list(data.get("capture", []))


def window_ns(expect: dict, first_ns: int) -> tuple[int, int]:
    """(lo, hi) in ns since the epoch: where a matching finding may start."""
    end_s = expect.get("measured", {}).get("end_s", expect["start_s"])
    return (first_ns + int((expect["start_s"] - expect["tolerance_s"]) * SEC),
            first_ns + int((max(end_s, expect["start_s"]) + expect["tolerance_s"]) * SEC))


def top_level(findings: pl.DataFrame) -> pl.DataFrame:
    """What a listing shows (detectors.top_level): not the members of a population finding, which
    ``herdscope scan`` lists only with --expand. Frames without ``member_of`` are all top level."""
    return top_level_findings(findings) if "member_of" in findings.columns else findings


def names_resource(expect: dict) -> pl.Expr:
    """The finding names the expected resource: either contains the other, in any case (true when
    the expectation names none)."""
    if not expect.get("resource"):
        return pl.lit(True)
    res, col = expect["resource"].lower(), pl.col("resource").fill_null("").str.to_lowercase()
    return col.str.contains(res, literal=True) | (pl.lit(res).str.contains(col, literal=True) & (col != ""))


def near(findings: pl.DataFrame, expect: dict, first_ns: int) -> pl.DataFrame:
    """The top-level findings of ``expect``'s detector (and kind, server and resource when it names
    them) that start in its window, at any severity."""
    lo, hi = window_ns(expect, first_ns)
    out = top_level(findings).filter((pl.col("detector") == expect["detector"])
                                     & pl.col("start_ns").is_between(lo, hi) & names_resource(expect))
    if expect.get("kind"):
        out = out.filter(pl.col("kind") == expect["kind"])
    if expect.get("server"):
        out = out.filter(pl.col("server").fill_null("").str.contains(expect["server"], literal=True))
    return out


def matches(findings: pl.DataFrame, expect: dict, first_ns: int) -> pl.DataFrame:
    """The findings that match ``expect``: ``near`` it and at or above its min_severity."""
    return loud(near(findings, expect, first_ns), expect["min_severity"])


def count_range(expect: dict) -> tuple[int, int]:
    """(fewest, most) matching findings: count +- count_tolerance (1 and 0 when not given), and at
    least one unless min_severity is OPTIONAL_FLOOR."""
    count, tol = expect.get("count", 1), expect.get("count_tolerance", 0)
    least = 0 if expect["min_severity"] == OPTIONAL_FLOOR else 1
    return max(count - tol, least), count + tol


def count_ok(hits: pl.DataFrame, expect: dict) -> bool:
    """The number of matching findings is within ``count_range``."""
    lo, hi = count_range(expect)
    return lo <= hits.height <= hi


def resource_ok(hits: pl.DataFrame, expect: dict) -> bool:
    """Some finding of ``hits`` names the expected resource (``names_resource``); true when the
    expectation names none or ``hits`` is empty. Always true for ``matches``, which filters on it."""
    return hits.height == 0 or hits.filter(names_resource(expect)).height > 0


def loud(findings: pl.DataFrame, severity: str = SILENT_BAR, detector: str | None = None) -> pl.DataFrame:
    """The findings at or above ``severity`` (of one detector, or ``detector/kind``, when given)."""
    out = findings.filter(pl.col("severity").to_physical() >= SEVERITY_RANK[severity])
    return out if detector is None else out.filter(_named([detector]))


def worst(findings: pl.DataFrame) -> str | None:
    """The highest severity in ``findings`` (None when empty)."""
    if findings.height == 0:
        return None
    return SEVERITIES[int(findings["severity"].to_physical().max())]


def expect_problem(findings: pl.DataFrame, expect: dict, first_ns: int) -> str | None:
    """None when ``expect`` holds, else a verdict word: MISS (nothing near it), DOWNGRADED (sev)
    (the right finding, below the floor), COUNT n (too many matches)."""
    hits = matches(findings, expect, first_ns)
    lo, hi = count_range(expect)
    if hits.height < lo:
        w = worst(near(findings, expect, first_ns))
        return f"DOWNGRADED ({w})" if w else "MISS"
    if hits.height > hi:
        return f"COUNT {hits.height}"
    return None


def extra(findings: pl.DataFrame, record: dict, first_ns: int) -> pl.DataFrame:
    """Top-level findings >= SILENT_BAR of an expected detector near no expectation (split or
    spurious)."""
    expects = record.get("expect", [])
    dets = sorted({e["detector"] for e in expects})
    if not dets:
        return findings.clear()
    rows = top_level(findings).with_row_index("_row")
    near_rows = pl.concat([near(rows, e, first_ns).select("_row") for e in expects])["_row"]
    out = rows.filter(pl.col("detector").is_in(dets) & ~pl.col("_row").is_in(near_rows.implode()))
    return loud(out.drop("_row"))


def false_alarms(findings: pl.DataFrame, record: dict) -> pl.DataFrame:
    """Top-level findings that break the record's ``silent`` (>= SILENT_BAR) or ``below_high``
    (>= BELOW_HIGH_BAR) rules."""
    rank = pl.col("severity").to_physical()
    silent = _named(list(record.get("silent", []))) & (rank >= SEVERITY_RANK[SILENT_BAR])
    below_high = _named(list(record.get("below_high", []))) & (rank >= SEVERITY_RANK[BELOW_HIGH_BAR])
    return top_level(findings).filter(silent | below_high)


def problems(findings: pl.DataFrame, record: dict, first_ns: int) -> list[str]:
    """Every verdict word for one capture (empty: it meets its ground truth)."""
    out = [p for e in record.get("expect", []) if (p := expect_problem(findings, e, first_ns))]
    ex = extra(findings, record, first_ns)
    if ex.height:
        out.append(f"EXTRA {ex.height} (unmatched {ex['detector'][0]} >= {SILENT_BAR})")
    fa = false_alarms(findings, record)
    out += [f"FALSE ALARM {d}/{k} {s}" for d, k, s in fa.select("detector", "kind", "severity").iter_rows()]
    return list(dict.fromkeys(out))


def describe_expected(record: dict) -> str:
    """What the record expects, in one line."""
    if record.get("healthy"):
        return f"nothing >= {SILENT_BAR}"
    txt = [f"{e['detector']}/{e.get('kind') or '*'} >= {e['min_severity']}"
           + (f" @{e['server']}" if e.get("server") else "") + f" t={e['start_s']:g}s"
           for e in record.get("expect", [])]
    if record.get("below_high"):
        txt.append(f"{','.join(record['below_high'])} < {BELOW_HIGH_BAR}")
    return "; ".join(txt)


def describe_found(findings: pl.DataFrame) -> str:
    """The top-level findings as detector/kind severity xN, by detector, worst first (``nothing``
    when there are none)."""
    findings = top_level(findings)
    if findings.height == 0:
        return "nothing"
    c = (findings.group_by("detector", "kind", "severity").len()
         .sort("detector", pl.col("severity").to_physical(), "kind", descending=[False, True, False]))
    return ", ".join(f"{d}/{k} {s} x{n}" for d, k, s, n in c.iter_rows())
