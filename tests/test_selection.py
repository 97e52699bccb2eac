"""--start/--end/--host/--port: applied before the analysis, counted in the report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer import open_capture
from analyzer.cli import ExitCode, main
from analyzer.summary import iso_time
from analyzer.selection import Selection, SelectionError, apply, parse_time
from detectors import run

SAMPLES = Path(__file__).parent.parent / "samples"
HERD = SAMPLES / "dns-ttl-herd.pcap"  # three herds, about 11 s apart


def _scan(capsys, *args):
    main(["scan", "--format", "json", str(HERD), *args])
    return json.loads(capsys.readouterr().out)


def test_time_selection_keeps_only_the_herd_inside_it(capsys):
    everything = _scan(capsys)
    starts = sorted(f["start_ns"] for f in everything["findings"] if f["detector"] == "herd")
    assert len(starts) == 3
    doc = _scan(capsys, "--start", "20", "--end", "30")
    sel = doc["captures"][0]["selection"]
    assert 0 < sel["packets_selected"] < sel["packets_total"] == everything["captures"][0]["packets"]
    herds = [f for f in doc["findings"] if f["detector"] == "herd"]
    assert [f["start_ns"] for f in herds] == [starts[1]]
    # the same window as absolute ISO times
    with open_capture(HERD) as cap:
        t0 = int(cap.packets["ts_ns"].min())
    doc2 = _scan(capsys, "--start", iso_time(t0 + 20 * 10**9), "--end", iso_time(t0 + 30 * 10**9))
    assert doc2["captures"][0]["selection"]["packets_selected"] == sel["packets_selected"]


def test_selection_happens_before_the_analysis():
    with open_capture(HERD) as cap:
        total = cap.packets.height
        apply(cap, Selection.from_options(None, None, (), (9999,)))  # a port nobody uses
        assert cap.packets.height == 0 and cap.selection["packets_total"] == total
        assert run(cap).height == 0
        assert cap.frame("dns_transactions").height == 0


def test_host_selection_keeps_both_directions():
    with open_capture(HERD) as cap:
        resolver = "10.77.0.53"
        apply(cap, Selection.from_options(None, None, (resolver,), ()))
        p = cap.packets
        assert p.height and ((p["src"].cast(str) == resolver) | (p["dst"].cast(str) == resolver)).all()
        assert (p["src"].cast(str) == resolver).any() and (p["dst"].cast(str) == resolver).any()


def test_selection_after_derivation_is_refused():
    with open_capture(HERD) as cap:
        cap.frame("connections")
        with pytest.raises(RuntimeError):
            apply(cap, Selection.from_options("1", None, (), ()))


@pytest.mark.parametrize("args", [["--start", "yesterday"], ["--start", "-3"], ["--host", "10.0.0"],
                                  ["--port", "70000"]])
def test_bad_selection_is_a_usage_error(args, capsys):
    assert main(["scan", str(HERD), *args]) == ExitCode.USAGE
    assert "Error" in capsys.readouterr().err


def test_iso_times_parse_to_ns():
    assert parse_time("1970-01-01T00:00:01.5Z", "--start").absolute_ns == 1_500_000_000
    assert parse_time("1970-01-01T00:00:01", "--start").absolute_ns == 1_000_000_000
    assert parse_time("2.25", "--start").offset_ns == 2_250_000_000
    with pytest.raises(SelectionError):
        parse_time("nan-ish", "--start")


def test_stats_takes_the_same_selection(capsys):
    assert main(["stats", "--format", "json", str(HERD), "--start", "20", "--end", "30"]) == ExitCode.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["selection"]["packets_selected"] < doc["selection"]["packets_total"]
    client_leg = [r for r in doc["stats"] if r["leg"] == "client_to_resolver"]
    assert [r["count"] for r in client_leg] == [60]  # one herd of 60 clients in 20-30 s, not all three


CHURN = SAMPLES / "ldap-conn-churn.pcap"  # LDAP over TCP: selection before TCP reassembly


def test_port_selection_of_a_tcp_capture_reassembles_only_the_selected_packets():
    """The TCP framings read payload columns of the selected packets by frame number: after a selection,
    frame numbers are no longer row positions (a gather by ``frame - 1`` read the wrong rows or ran off
    the end; ``scan --port 389`` of this sample was an internal error)."""
    with open_capture(CHURN) as cap:
        whole = cap.frame("ldap_messages")
    with open_capture(CHURN) as cap:
        # a port the LDAP traffic does not use, and the LDAP port: the first keeps no LDAP message,
        # the second keeps every one, with the same rows as the unselected run
        apply(cap, Selection.from_options(None, None, (), (389,)))
        assert 0 < cap.packets.height
        assert cap.frame("ldap_messages").equals(whole)
    with open_capture(CHURN) as cap:
        first = cap.packets.sort("ts_ns")["ts_ns"]
        half_s = (int(first[-1]) - int(first[0])) / 2e9
        apply(cap, Selection.from_options(str(half_s), None, (), ()))
        kept = set(cap.packets["frame"].to_list())
        later = cap.frame("ldap_messages")
    assert later.height and set(later["frame_first"].to_list()) <= kept
    assert later.height < whole.height


def test_scan_with_a_port_selection_of_a_tcp_capture_finds_the_churn(capsys):
    """The 14 packets off port 389 (DNS before the churn) do not change the churn finding: same id."""
    main(["scan", "--format", "json", str(CHURN)])
    whole = json.loads(capsys.readouterr().out)
    code = main(["scan", "--format", "json", str(CHURN), "--port", "389", "--fail-on", "medium"])
    doc = json.loads(capsys.readouterr().out)
    assert code == ExitCode.FINDINGS
    assert doc["captures"][0]["selection"]["packets_selected"] < whole["captures"][0]["packets"]
    churn = lambda d: [f["finding_id"] for f in d["findings"] if f["detector"] == "conn_churn"]  # noqa: E731
    assert churn(doc) == churn(whole) and churn(doc)
