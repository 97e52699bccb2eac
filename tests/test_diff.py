"""herdscope diff: the regression gate on the samples' healthy twins and their pathologies, both ways.

Each pair (samples/MANIFEST.toml: healthy, twin) is diffed once per direction in a module-scoped
fixture (JSON to a file, in process); the tests read those documents. The statistics (order-statistic
intervals) are checked against a brute-force binomial sum and on constructed samples.
"""
import dataclasses
import json
import math
import shutil
import subprocess
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from analyzer import cli
from analyzer.cli import ExitCode, main
from detectors.diff import compare, match_key
from detectors.diff_gate import GATE_FIELDS, GateParams, gate, gate_params, parse_value
from detectors.diff_stats import (binomial_cdf, order_statistic_bounds, quantile_interval, samples_for_upper_bound,
                                  share_interval, share_verdict)

SAMPLES = Path(__file__).parent.parent / "samples"
# one pair per protocol family: DNS herd, SMB2 break queue, TCP RTO, LDAP connection churn
PAIRS = ("dns-ttl-herd.pcap", "smb2-break-queue.pcap", "tcp-rto-blackout.pcap", "ldap-conn-churn.pcap")
# the reverse direction judged on findings alone: the healthy twins are other recordings, and some are
# really slower at the median or retransmit more (test_reverse_with_default_gate_names_what_differs)
FINDINGS_ONLY = ["--max-p50-increase", "off", "--max-p99-increase", "off", "--max-error-share-increase", "off",
                 "--max-unanswered-share-increase", "off", "--max-retransmission-increase", "off",
                 "--max-connection-rate-increase", "off"]
DOC_KEYS = {"herdscope", "before", "after", "gate_parameters", "srt", "findings", "rates", "gate"}


def twins() -> dict[str, str]:
    manifest = tomllib.loads((SAMPLES / "MANIFEST.toml").read_text())
    return {c["file"]: c["twin"] for c in manifest["capture"] if not c["healthy"] and c["file"] in PAIRS}


def run_json(tmp: Path, name: str, *args) -> tuple[int, dict]:
    out = tmp / f"{name}.json"
    code = main(["diff", *map(str, args), "--format", "json", "--output", str(out)])
    return code, json.loads(out.read_text())


@pytest.fixture(scope="module")
def diffs(tmp_path_factory):
    """(pathology, direction) -> (exit code, JSON document); direction "worse" is healthy -> pathology."""
    tmp = tmp_path_factory.mktemp("diff")
    out = {}
    for sick, healthy in twins().items():
        out[sick, "worse"] = run_json(tmp, f"{sick}-worse", SAMPLES / healthy, SAMPLES / sick)
        out[sick, "better"] = run_json(tmp, f"{sick}-better", SAMPLES / sick, SAMPLES / healthy, *FINDINGS_ONLY)
        out[sick, "better-default"] = run_json(tmp, f"{sick}-better-default", SAMPLES / sick, SAMPLES / healthy)
    return out


def test_the_manifest_pairs_are_there():
    assert set(twins()) == set(PAIRS)


@pytest.mark.parametrize("sick", PAIRS)
def test_healthy_to_pathology_fails_naming_the_new_finding(diffs, sick):
    code, doc = diffs[sick, "worse"]
    assert code == ExitCode.FINDINGS and set(doc) == DOC_KEYS and doc["gate"]["passed"] is False
    new = doc["findings"]["new"]
    assert new and not doc["findings"]["gone"]
    (check,) = [c for c in doc["gate"]["failures"] if c["check"] == "new findings"]
    for record in new:  # every new finding at medium or above is named by its id
        assert record["finding_id"] in check["message"]
    assert doc["before"]["findings"] == {s: 0 for s in doc["before"]["findings"]}  # the twin is clean


def test_the_dns_herd_shows_its_p99_rise_and_says_it_is_not_significant(diffs):
    """stats shows p99 393 µs -> 811 µs on 240 requests a side: reported, but 240 cannot bound a p99 at
    95 % (368 are needed), so it does not gate."""
    _, doc = diffs["dns-ttl-herd.pcap", "worse"]
    (row,) = [r for r in doc["srt"] if r["operation"] == "A" and r["leg"] == "client_to_resolver"]
    assert row["p99"]["after"] > row["p99"]["before"] and row["p99"]["change_ratio"] > 0.2
    assert row["p99"]["verdict"] == "too few samples" and "368" in row["p99"]["why"]
    assert row["before"]["p99_ci"][1] is None  # unbounded above
    (p99,) = [c for c in doc["gate"]["checks"] if c["check"] == "p99 dns A client_to_resolver"]
    assert p99["status"] == "skipped"


def test_connection_churn_trips_the_connection_rate(diffs):
    _, doc = diffs["ldap-conn-churn.pcap", "worse"]
    rate = doc["rates"]["connection_rate"]
    assert rate["after"] > 10 * rate["before"] and rate["verdict"] == "compared"
    assert "tcp connection rate" in [c["check"] for c in doc["gate"]["failures"]]


@pytest.mark.parametrize("sick", PAIRS)
def test_pathology_to_healthy_passes_and_lists_the_findings_as_gone(diffs, sick):
    code, doc = diffs[sick, "better"]
    assert code == ExitCode.OK and doc["gate"] == {**doc["gate"], "passed": True, "failures": []}
    worse = diffs[sick, "worse"][1]["findings"]["new"]
    assert {r["finding_id"] for r in doc["findings"]["gone"]} == {r["finding_id"] for r in worse}
    assert not doc["findings"]["new"] and not doc["findings"]["changed"]


def test_reverse_with_default_gate_passes_and_the_medians_differ_when_asked(diffs, tmp_path):
    """With every default threshold the way back passes: what differs between the twins (other recordings)
    is not significant or not gated by default. The medians do differ significantly (the DNS and LDAP twins
    answer slower at the median: another mix of cache hits), which --max-p50-increase, off by default,
    turns into a failure; the RTO twin's retransmission share rises, but within its Wilson intervals."""
    for sick in PAIRS:
        code, doc = diffs[sick, "better-default"]
        assert code == ExitCode.OK and doc["gate"]["failures"] == [], sick
    _, doc = diffs["tcp-rto-blackout.pcap", "better-default"]
    rate = doc["rates"]["retransmission_rate"]
    assert rate["change_pp"] > 0 and rate["verdict"] == "no significant change"
    assert rate["after_ci"][0] <= rate["before_ci"][1]  # the intervals overlap
    healthy = twins()
    for sick, check in (("dns-ttl-herd.pcap", "p50 dns A client_to_resolver"),
                        ("ldap-conn-churn.pcap", "p50 ldap searchRequest")):
        code, doc = run_json(tmp_path, f"{sick}-p50", SAMPLES / sick, SAMPLES / healthy[sick],
                             "--max-p50-increase", "20%")
        assert code == ExitCode.FINDINGS and [c["check"] for c in doc["gate"]["failures"]] == [check]
        row = next(r for r in doc["srt"] if f"p50 {r['protocol']} {r['operation']}" in check)
        assert row["p50"]["verdict"] == "significant increase"
        assert row["p50"]["after_ci"][0] > row["p50"]["before_ci"][1]  # the intervals do not overlap


def test_a_capture_against_itself_passes_with_nothing_new_or_gone(tmp_path):
    sample = SAMPLES / "smb2-break-queue.pcap"
    code, doc = run_json(tmp_path, "self", sample, sample)
    assert code == ExitCode.OK and doc["gate"]["passed"]
    found = doc["findings"]
    assert not found["new"] and not found["gone"] and not found["changed"] and len(found["unchanged"]) == 1
    for row in doc["srt"]:
        assert row["p50"]["verdict"] in ("no significant change", "too few samples")
        assert row["before"] == row["after"]


@pytest.mark.skipif(shutil.which("editcap") is None, reason="editcap is not installed")
def test_a_directory_of_pieces_compares_as_the_whole_file(tmp_path):
    whole = SAMPLES / "dns-ttl-herd.pcap"
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    subprocess.run(["editcap", "-c", "200", str(whole), str(pieces / "ring.pcap")], check=True)
    assert len(list(pieces.iterdir())) == 4
    healthy = SAMPLES / "dns-ttl-herd-healthy.pcap"
    _, by_file = run_json(tmp_path, "file", healthy, whole)
    code, by_dir = run_json(tmp_path, "dir", healthy, pieces)
    assert code == ExitCode.FINDINGS and len(by_dir["after"]["files"]) == 4
    assert by_dir["srt"] == by_file["srt"] and by_dir["rates"]["retransmission_rate"] == \
        by_file["rates"]["retransmission_rate"]
    assert [match_key(r) for r in by_dir["findings"]["new"]] == [match_key(r) for r in by_file["findings"]["new"]]
    assert [c["check"] for c in by_dir["gate"]["failures"]] == [c["check"] for c in by_file["gate"]["failures"]]
    code, same = run_json(tmp_path, "same", whole, pieces)  # the pieces against the whole: nothing new or gone
    assert code == ExitCode.OK and not same["findings"]["new"] and not same["findings"]["gone"]


def test_table_and_junit_outputs(tmp_path, capsys):
    healthy, sick = SAMPLES / "smb2-break-queue-healthy.pcap", SAMPLES / "smb2-break-queue.pcap"
    assert main(["diff", str(healthy), str(sick)]) == ExitCode.FINDINGS
    table = capsys.readouterr().out
    assert table.index("what failed the gate") < table.index("Service response times") < table.index("1 new, 0 gone")
    assert "smb_break_queue/slow_ack" in table and "smb2 CREATE" in table
    out = tmp_path / "diff.xml"
    assert main(["diff", str(healthy), str(sick), "--format", "junit", "--output", str(out)]) == ExitCode.FINDINGS
    root = ET.parse(out).getroot()
    cases = root.findall(".//testcase")
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["new findings"] and int(root.get("failures")) == 1 and len(cases) == int(root.get("tests"))
    assert any(c.find("skipped") is not None for c in cases)  # the rows with too few samples


def test_usage_errors_and_unreadable_input(tmp_path, capsys):
    sample = str(SAMPLES / "smb2-break-queue.pcap")
    for bad in (["--max-p99-increase", "lots"], ["--max-p99-increase", "20"], ["--max-error-share-increase", "5"], ["--fail-on-new", "severe"],
                ["--confidence", "1.5"], ["--min-samples", "2.5"]):
        assert main(["diff", sample, sample, *bad]) == ExitCode.USAGE, bad
    assert "--max-error-share-increase '5'" in capsys.readouterr().err
    assert main(["diff", sample]) == ExitCode.USAGE
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"not a capture at all")
    assert main(["diff", sample, str(junk)]) == ExitCode.UNREADABLE
    assert main(["diff", str(tmp_path / "missing.pcap"), sample]) == ExitCode.UNREADABLE
    (tmp_path / "empty").mkdir()
    assert main(["diff", sample, str(tmp_path / "empty")]) == ExitCode.UNREADABLE
    assert "herdscope: " in capsys.readouterr().err


def test_threshold_forms():
    assert parse_value("max_p99_increase", "20%") == parse_value("max_p99_increase", "0.2") == pytest.approx(0.2)
    assert parse_value("max_error_share_increase", "+5pp") == parse_value("max_error_share_increase", "5pp") == 5.0
    assert parse_value("max_p50_increase", "off") is None and parse_value("fail_on_new", "none") is None
    assert parse_value("confidence", "90%") == pytest.approx(0.9) and parse_value("min_samples", "30") == 30
    assert parse_value("max_connection_rate_increase", "150%") == pytest.approx(1.5)
    with pytest.raises(ValueError, match="write 20%"):
        parse_value("max_p99_increase", "20")
    with pytest.raises(ValueError, match="ambiguous"):
        parse_value("max_retransmission_increase", "1%")
    assert gate_params({"fail_on_new": "high", "max_p99_increase": None}) == \
        dataclasses.replace(GateParams(), fail_on_new="high")


def test_the_cli_lists_every_gate_parameter():
    assert tuple(cli.GATE_OPTIONS) == tuple(GATE_FIELDS)


# -- the statistics ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n,q", [(1, 0.5), (7, 0.3), (50, 0.99), (200, 0.5)])
def test_binomial_cdf_against_the_plain_sum(n, q):
    plain = np.cumsum([math.comb(n, k) * q ** k * (1 - q) ** (n - k) for k in range(n + 1)])
    assert np.allclose(binomial_cdf(n, q), np.minimum(plain, 1.0), atol=1e-12)


def test_order_statistic_intervals():
    assert order_statistic_bounds(100, 0.5, 0.95) == (40, 61)  # the textbook median interval (Conover, table A3)
    assert order_statistic_bounds(5, 0.5, 0.95) == (None, None)  # 1 - 2 / 32 < 0.95: no interval
    assert samples_for_upper_bound(0.99, 0.95) == 368 and samples_for_upper_bound(0.5, 0.95) == 6
    assert order_statistic_bounds(367, 0.99, 0.95)[1] is None and order_statistic_bounds(368, 0.99, 0.95)[1] == 368
    rng = np.random.default_rng(7)  # coverage: the true median of U(0, 1) is 0.5
    covered = 0
    for _ in range(400):
        low, high = quantile_interval(np.sort(rng.integers(0, 1_000_000, 60)), 0.5, 0.9)
        covered += low <= 500_000 <= high
    assert covered / 400 >= 0.88


def _side(latencies_ns, errors=0):
    lat = np.sort(np.asarray(latencies_ns, dtype=np.int64))
    n = len(lat)
    row = {"count": n, "answered": n, "unanswered": 0, "errors": errors,
           "p50": int(lat[math.ceil((n - 1) * 0.5)]), "p99": int(lat[math.ceil((n - 1) * 0.99)]), "latencies_ns": lat}
    rates = {"connections": 0, "new_connections": 0, "duration_s": 1.0, "connection_rate_per_s": 0.0,
             "retransmissions": 0, "data_segments": 0, "retransmission_rate": None}
    return {"srt": {("dns", "A", "direct"): row}, "rates": rates, "findings": []}


def test_a_significant_p99_rise_trips_and_a_small_one_does_not():
    rng = np.random.default_rng(1)
    before = _side(rng.integers(100_000, 200_000, 2000))
    slower = _side(np.concatenate([rng.integers(100_000, 200_000, 1960), rng.integers(900_000, 1_000_000, 40)]))
    result = gate(compare(before, slower, GateParams()), GateParams())
    assert [c["check"] for c in result["failures"]] == ["p99 dns A direct"]
    same = _side(rng.integers(100_000, 200_000, 2000))
    assert gate(compare(before, same, GateParams()), GateParams())["passed"]
    off = dataclasses.replace(GateParams(), max_p99_increase=None)
    assert gate(compare(before, slower, off), off)["passed"]
    erring = _side(rng.integers(100_000, 200_000, 2000), errors=100)  # 5 % errors: +5 points
    assert [c["check"] for c in gate(compare(before, erring, GateParams()), GateParams())["failures"]] == \
        ["error share dns A direct"]


def test_wilson_share_intervals_and_their_verdicts():
    lo, hi = share_interval(0, 10, 0.95)  # the textbook case (Brown, Cai & DasGupta 2001): [0, 0.2775]
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = share_interval(8, 1000, 0.95)
    assert lo < 0.008 < hi and share_interval(5, 0, 0.95) is None
    assert share_verdict((8, 1000), (15, 1000), 0.95)["verdict"] == "no significant change"
    assert share_verdict((8, 1000), (60, 1000), 0.95)["verdict"] == "significant increase"
    assert share_verdict((60, 1000), (8, 1000), 0.95)["verdict"] == "significant decrease"
