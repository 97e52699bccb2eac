"""The evaluation captures (samples/eval/, real servers in scenarios the detectors were not tuned to)
meet their ground truth, checked with samples/groundtruth.py (the matching that
``samples/make_eval.py --scan`` and tests/benchmarks/evaluate.py use):

- every pathological expectation is found at or above its min_severity (normally medium), on its
  server and resource, inside the pathology's interval, ``count +- count_tolerance`` times;
- every ``below_high`` detector (on a healthy twin: every detector) reports nothing at high or above;
- every ``silent`` detector reports nothing at medium or above.

Every detector runs once over each capture (tests/shared_captures.py: once per session); one test per
capture and rule, so a failure names the capture. A case that fails because of a known detector
problem is listed in KNOWN with the reason (strict: it must start passing when that is fixed).
"""
from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

from detectors import available
from shared_captures import shared_capture, shared_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "samples"))
import groundtruth as gt  # noqa: E402

EVAL = ROOT / "samples" / "eval"
MANIFEST = gt.load_manifest(EVAL / "MANIFEST.toml")
COLUMNS = ("detector", "kind", "severity", "start_ns", "server", "resource")

# (file, rule) -> why it fails today: the detector's problem, not the ground truth's
KNOWN: dict[tuple[str, str], str] = {}

_cache: dict[str, tuple[pl.DataFrame, int]] = {}


def findings_of(file: str) -> tuple[pl.DataFrame, int]:
    """(findings of every detector, first packet ns) for one eval capture, computed once."""
    if file not in _cache:
        _cache[file] = (shared_run(EVAL / file), int(shared_capture(EVAL / file).packets["ts_ns"].min()))
    return _cache[file]


def shown(f: pl.DataFrame, first: int) -> list[dict]:
    return (f.select(COLUMNS).with_columns(start_s=(pl.col("start_ns") - first) / gt.SEC)
            .drop("start_ns").to_dicts())


def cases(rule: str, applies) -> list:
    out = []
    for rec in MANIFEST:
        if not applies(rec):
            continue
        why = KNOWN.get((rec["file"], rule))
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        out.append(pytest.param(rec, id=rec["file"], marks=marks))
    return out


def test_manifest_is_complete():
    files = {r["file"] for r in MANIFEST}
    on_disk = {p.name for p in EVAL.iterdir() if p.suffix in (".pcap", ".pcapng")}
    assert files == on_disk
    assert all(r["twin"] in files for r in MANIFEST if r.get("twin"))
    assert set(available()) >= {e["detector"] for r in MANIFEST for e in r.get("expect", [])}


@pytest.mark.parametrize("rec", cases("expect", lambda r: r.get("expect")))
def test_pathology_found(rec):
    f, first = findings_of(rec["file"])
    bad = {f"{e['detector']}/{e.get('kind')} t={e['start_s']}": p for e in rec["expect"]
           if (p := gt.expect_problem(f, e, first))}
    assert not bad, f"{bad}; all findings: {shown(f, first)}"


@pytest.mark.parametrize("rec", cases("extra", lambda r: r.get("expect")))
def test_no_unmatched_finding_of_an_expected_detector(rec):
    f, first = findings_of(rec["file"])
    ex = gt.extra(f, rec, first)
    assert ex.height == 0, shown(ex, first)


@pytest.mark.parametrize("rec", cases("silent", lambda r: r.get("silent") or r.get("below_high")))
def test_silent_and_below_high_detectors(rec):
    f, first = findings_of(rec["file"])
    fa = gt.false_alarms(f, rec)
    assert fa.height == 0, shown(fa, first)


@pytest.mark.parametrize("rec", cases("healthy", lambda r: r.get("healthy")))
def test_healthy_twin_below_high(rec):
    f, first = findings_of(rec["file"])
    high = gt.loud(f, gt.BELOW_HIGH_BAR)
    assert high.height == 0, shown(high, first)


# --------------------------------------------------------------------------- the matching itself

def _frame(rows: list[dict]) -> pl.DataFrame:
    from detectors.base import FINDINGS_SCHEMA
    cols = ("detector", "kind", "severity", "start_ns", "server", "resource", "finding_id", "member_of")
    return pl.DataFrame([{c: r.get(c) for c in cols} for r in rows],
                        schema={c: FINDINGS_SCHEMA[c] for c in cols})


def test_matching_uses_the_pathology_interval_resource_and_top_level_findings():
    t0 = 10**18
    at = lambda s: t0 + int(s * gt.SEC)  # noqa: E731
    f = _frame([
        {"detector": "herd", "kind": "kerberos", "severity": "high", "start_ns": at(4.3), "server": "10.0.0.88",
         "resource": "krbtgt/R@R", "finding_id": "a"},
        {"detector": "herd", "kind": "kerberos", "severity": "high", "start_ns": at(4.7), "server": "10.0.0.88",
         "resource": "HTTP/x@R", "finding_id": "b"},
        {"detector": "herd", "kind": "kerberos", "severity": "high", "start_ns": at(4.4), "server": "10.0.0.88",
         "resource": "krbtgt/R@R", "finding_id": "m", "member_of": "a"},        # a member: not counted again
    ])
    as_req = {"detector": "herd", "kind": "kerberos", "min_severity": "medium", "start_s": 4.3, "tolerance_s": 0.5,
              "server": "10.0.0.88", "resource": "krbtgt/R@R", "count": 1, "count_tolerance": 0}
    tgs = {**as_req, "resource": "HTTP/x@R", "start_s": 3.0, "measured": {"end_s": 4.5}}
    assert gt.matches(f, as_req, t0)["finding_id"].to_list() == ["a"]
    assert gt.expect_problem(f, as_req, t0) is None
    assert gt.expect_problem(f, tgs, t0) is None                             # 4.7 s: inside end_s + tolerance
    assert gt.expect_problem(f, {**tgs, "measured": {}}, t0) == "MISS"      # start_s +- tolerance only
    assert gt.expect_problem(f, {**as_req, "min_severity": "critical"}, t0) == "DOWNGRADED (high)"
    assert gt.expect_problem(f, {**as_req, "resource": ""}, t0) == "COUNT 2"
    grey = {**as_req, "min_severity": "informational", "start_s": 20.0, "count": 1, "count_tolerance": 1}
    assert gt.expect_problem(f, grey, t0) is None                           # a sweep point may not fire
    assert gt.expect_problem(f, {**grey, "min_severity": "low"}, t0) == "MISS"
    rec = {"expect": [as_req], "silent": ["tcp_stall"], "below_high": ["herd"]}
    assert gt.extra(f, rec, t0)["finding_id"].to_list() == ["b"]             # herd >= medium, near nothing
    assert gt.false_alarms(f, rec)["finding_id"].to_list() == ["a", "b"]     # herd must stay below high
    assert gt.false_alarms(f, {**rec, "below_high": []}).height == 0
    assert gt.problems(f, {"expect": [as_req, tgs]}, t0) == []
