"""The incident linker (detectors/incidents.py): the linking rule on small constructed findings, the
trigger and its reasons, the participants taken from evidence frames, populations and DNS answers,
its parameters, and scan's outputs on real samples."""
from __future__ import annotations

import json
import random
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest

import detectors
from analyzer import open_capture
from analyzer.cli import ExitCode, main
from detectors import incidents
from detectors.base import FINDINGS_SCHEMA
from detectors.incidents_dns import answer_addresses
from detectors.incidents_evidence import DNS_FRAME, Retained, addresses_of, retain
from detectors.params import ParameterError
from detectors.scan_config import load_config
from fakes import MS, S, T0, FakeCapture

SAMPLES = Path(__file__).parent.parent / "samples"
INCAST = SAMPLES / "tcp-incast.pcap"  # incast (a population of tcp_stall rto) + a spurious retransmission
QUEUE = SAMPLES / "smb2-break-queue.pcap"  # one finding: no incident
STORM = SAMPLES / "dns-retry-storm.pcapng"  # the clients' storm at the resolver and its upstream leg

_ids = iter(f"{k:016x}" for k in range(1, 10_000))


def finding(start_ms: float, end_ms: float, *, client=None, server=None, resource=None, detector="herd", kind="dns",
            severity="medium", evidence=(), finding_id=None, member_of=None, members=()) -> dict:
    return {"detector": detector, "kind": kind, "finding_id": finding_id or next(_ids), "severity": severity,
            "start_ns": T0 + int(start_ms * MS), "end_ns": T0 + int(end_ms * MS), "client": client,
            "server": server, "resource": resource, "clients": 1, "client_identity": "address", "metric": "m",
            "value": 1.0, "threshold": 1.0, "unit": "x", "evidence_frames": list(evidence),
            "evidence_total": len(evidence), "explanation": "e", "parameters": "{}", "members": len(members),
            "member_ids": list(members), "member_of": member_of}


def frame(*rows: dict) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema=FINDINGS_SCHEMA)


def link(*rows: dict, capture=None, retained=None, **params) -> list[dict]:
    return incidents.link(frame(*rows), capture or FakeCapture(), incidents.Params(**params),
                          retained=retained or Retained())


def test_overlapping_findings_with_a_shared_client_are_one_incident():
    a = finding(0, 100, client="10.0.0.1", server="10.0.0.53")
    b = finding(50, 300, client="10.0.0.1", server="10.0.0.88", detector="retry_storm", kind="kerberos",
                severity="high")
    (inc,) = link(a, b)
    assert inc["findings"] == [a["finding_id"], b["finding_id"]]
    assert (inc["start_ns"], inc["end_ns"]) == (a["start_ns"], b["end_ns"])
    assert inc["severity"] == "high" and inc["trigger"] == a["finding_id"]
    assert [lane["lane"] for lane in inc["lanes"]] == ["dns 10.0.0.53", "kerberos 10.0.0.88"]


def test_lag_edge_is_inclusive():
    lag_ms = 200
    a = finding(0, 100, server="10.0.0.53")
    at_edge = finding(100 + lag_ms, 400, server="10.0.0.53")
    assert len(link(a, at_edge, lag_ns=lag_ms * MS)) == 1
    past_edge = dict(at_edge, start_ns=at_edge["start_ns"] + 1)
    assert link(a, past_edge, lag_ns=lag_ms * MS) == []


def test_findings_sharing_no_participant_are_not_linked():
    a = finding(0, 100, client="10.0.0.1", server="10.0.0.53")
    b = finding(0, 100, client="10.0.0.2", server="10.0.0.54")
    assert link(a, b) == []


def test_links_chain_into_one_incident():
    a = finding(0, 10, client="10.0.0.1", server="10.0.0.53")
    b = finding(20, 30, client="10.0.0.1", server="10.0.0.88")  # shares a's client
    c = finding(40, 50, client="10.0.0.9", server="10.0.0.88")  # shares b's server, nothing of a's
    (inc,) = link(a, b, c)
    assert inc["findings"] == [a["finding_id"], b["finding_id"], c["finding_id"]]


def test_trigger_is_the_earliest_and_says_why_with_numbers():
    a = finding(0, 100, client="10.0.0.1, 10.0.0.2", server="10.0.0.53")
    b = finding(1500, 1600, client="10.0.0.1", server="10.0.0.88", kind="kerberos")
    c = finding(2000, 2100, client="10.0.0.2, 10.0.0.3", server="10.0.0.88", kind="kerberos")
    (inc,) = link(c, a, b)
    assert inc["trigger"] == a["finding_id"]
    why = " | ".join(inc["trigger_reasons"])
    assert "1.5 s before the next" in why and "2 s before the last" in why
    assert "2 of the 3 clients" in why  # 10.0.0.1 and .2 of {.1, .2, .3}


def test_incident_id_is_stable_whatever_the_row_order():
    rows = [finding(k * 100, k * 100 + 150, client="10.0.0.1", server=f"10.0.1.{k}") for k in range(6)]
    first = link(*rows)
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)
    assert link(*shuffled) == first and len(first) == 1
    assert link(*rows[:5])[0]["incident_id"] != first[0]["incident_id"]  # other findings, other id


def test_min_findings():
    rows = [finding(k * 10, k * 10 + 15, server="10.0.0.53") for k in range(3)]
    assert len(link(*rows, min_findings=3)) == 1
    assert link(*rows, min_findings=4) == []


def test_evidence_frames_name_the_clients_of_a_finding_that_names_only_its_server():
    retained = Retained(addresses=pl.DataFrame({"frame": [1, 2, 3], "src": ["10.0.1.1", "10.0.1.2", "10.0.0.53"],
                                                "dst": ["10.0.0.53", "10.0.0.53", "10.0.1.1"]},
                                               schema_overrides={"frame": pl.UInt32}))
    herd = finding(0, 50, server="10.0.0.53", evidence=[1, 2, 3])
    storm = finding(60, 500, client="10.0.1.2", server="10.0.0.88", kind="kerberos")
    (inc,) = link(herd, storm, retained=retained)
    assert "1 of the 1 clients" in " | ".join(inc["trigger_reasons"])
    assert link(herd, storm) == []  # without the evidence's addresses they share nothing


def test_a_population_stands_for_its_members():
    pop = finding(0, 1000, server="10.0.0.89", detector="conn_churn", kind="churn", finding_id="p" * 16,
                  members=["m" * 16])
    member = finding(0, 1000, client="10.0.7.7", server="10.0.0.89", detector="conn_churn", kind="churn",
                     finding_id="m" * 16, member_of="p" * 16)
    other = finding(500, 900, client="10.0.7.7", server="10.0.0.5", detector="tcp_stall", kind="rto")
    (inc,) = link(pop, member, other)
    assert inc["findings"] == [pop["finding_id"], other["finding_id"]]  # the member is not listed itself
    assert link(pop, other) == []  # top_level alone: the member's client is not known


def dns_response(name: str, address: str) -> bytes:
    """A DNS response with one question and one A answer (a compression pointer to the question)."""
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    header = struct.pack("!HHHHHH", 7, 0x8180, 1, 1, 0, 0)
    answer = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + bytes(int(x) for x in address.split("."))
    return header + qname + struct.pack("!HH", 1, 1) + answer


def test_answer_addresses_reads_a_records_and_refuses_cut_messages():
    msg = dns_response("kdc.corp.example", "10.0.0.88")
    assert answer_addresses(msg) == ["10.0.0.88"]
    assert answer_addresses(msg[:-2]) == [] and answer_addresses(b"\0" * 5) == []


def test_a_near_tie_goes_to_the_dependency():
    msg = dns_response("kdc.corp.example", "10.0.0.88")
    retained = Retained(dns_responses=pl.DataFrame({"name": ["kdc.corp.example"], "payload_offset": [0],
                                                    "payload_caplen": [len(msg)]}),
                        read_bytes=lambda offset, length: msg[offset:offset + length])
    storm = finding(0, 500, client="10.0.9.9", server="10.0.0.88", kind="kerberos")
    herd = finding(0.005, 50, client="10.0.1.1", server="10.0.0.53", resource="kdc.corp.example")
    (tied,) = link(storm, herd, retained=retained, tie_ns=10_000)  # 5 µs apart: a tie within 10 µs
    assert tied["trigger"] == herd["finding_id"]
    assert any("kdc.corp.example" in r and "resolves to 10.0.0.88" in r for r in tied["trigger_reasons"])
    (ordered,) = link(storm, herd, retained=retained)  # 5 µs is beyond the 1 ns tick: earliest wins ...
    assert ordered["trigger"] == storm["finding_id"]
    assert any(r.startswith("but it depends on the server of") for r in ordered["trigger_reasons"])  # ... said


def test_addresses_of_client_and_server_values():
    assert addresses_of("10.0.0.1, 10.0.0.2:88, [2001:db8::1]:445, +3 more") == {"10.0.0.1", "10.0.0.2",
                                                                                   "2001:db8::1"}
    assert addresses_of(None) == set()


def test_parameters_are_settable_and_checked(tmp_path):
    assert detectors.incident_params({"incident.lag_ns": "2s"}).lag_ns == 2 * S
    detectors.configure(None, {"incident.tie_ns": "1ms"})
    with pytest.raises(ParameterError):
        detectors.configure(None, {"incident.nope": 1})
    with pytest.raises(ParameterError):
        detectors.incident_params({"incident.min_findings": 1})
    cfg = tmp_path / "h.toml"
    cfg.write_text('[incident]\nlag_ns = "250ms"\n')
    assert detectors.incident_params(load_config(str(cfg), (), None, None).overrides).lag_ns == 250 * MS
    assert "incident" in [d["name"] for d in detectors.describe()]


def test_scan_json_and_table_on_a_sample_with_linked_findings(capsys):
    assert main(["scan", "--format", "json", str(INCAST)]) == ExitCode.FINDINGS
    doc = json.loads(capsys.readouterr().out)
    (inc,) = doc["incidents"]
    listed = {f["finding_id"]: f for f in doc["findings"]}
    assert set(inc["findings"]) <= set(listed) and len(inc["findings"]) >= 2
    assert all(listed[fid]["incident"] == inc["incident_id"] for fid in inc["findings"])
    assert inc["capture"] == str(INCAST) and listed[inc["trigger"]]["detector"] == "incast"
    assert main(["scan", str(INCAST)]) == ExitCode.FINDINGS
    out = capsys.readouterr().out
    assert out.index("incidents (1)") < out.index("╭─")  # incidents before the findings' panels
    assert f"incident {inc['incident_id']}" in out and "<- trigger" in out
    assert main(["scan", "--format", "junit", str(INCAST)]) == ExitCode.FINDINGS
    suite = ET.fromstring(capsys.readouterr().out).find("testsuite")
    assert f"incident {inc['incident_id']}" in suite.find("system-out").text  # the suite's own, after its cases
    assert int(suite.get("tests")) == len(suite.findall("testcase"))
    assert main(["scan", "--set", "incident.lag_ns=0", "--set", "incident.min_findings=3", "--format", "json",
                 str(INCAST)]) == ExitCode.FINDINGS
    assert json.loads(capsys.readouterr().out)["incidents"] == []
    assert main(["scan", "--set", "incident.lag=1s", str(INCAST)]) == ExitCode.USAGE


def test_scan_of_a_single_finding_has_no_incident(capsys):
    assert main(["scan", "--format", "json", str(QUEUE)]) == ExitCode.FINDINGS
    doc = json.loads(capsys.readouterr().out)
    assert doc["incidents"] == [] and [f["incident"] for f in doc["findings"]] == [None]
    assert main(["scan", str(QUEUE)]) == ExitCode.FINDINGS
    assert "incident" not in capsys.readouterr().out


def test_released_scan_links_what_the_plain_run_links():
    with open_capture(STORM) as cap:
        kept = retain(cap, detectors.required_frames())
        released = incidents.link(detectors.run(cap, release=True), cap, retained=kept)
    with open_capture(STORM) as cap:
        plain = incidents.link(detectors.run(cap), cap)
    assert released == plain and len(plain) == 1
    (inc,) = plain
    assert any("10.77.0.53 is itself a client of 10.77.0.54" in r for r in inc["trigger_reasons"])


def test_dashboard_overview_draws_each_incident_above_the_findings_timeline(monkeypatch):
    pytest.importorskip("streamlit")
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboards import pages
    from dashboards.settings import ENV, Settings

    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.setenv(ENV, Settings(files=(str(INCAST),)).to_env())
    at = AppTest.from_file(str(Path(__file__).parent.parent / "dashboards" / "streamlit_app.py"),
                           default_timeout=120).run()
    assert not at.exception and not at.error
    assert [s.value for s in at.subheader][0] == "Incidents (1)"
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    titles = [s.get("title", {}).get("text", "") for s in specs]
    assert titles[0].startswith("Incident ") and titles[1].startswith("Findings timeline")
    assert any("Likely trigger" in m.value for m in at.markdown)
    with open_capture(INCAST) as cap:
        (inc,) = incidents.link(detectors.run(cap), cap)
    at.session_state["incident_0"] = {"selection": {"pick": [{"finding_id": inc["trigger"]}]}}
    with monkeypatch.context() as m:  # what a click on the trigger's bar does
        m.setattr(pages.st, "session_state", at.session_state)
        pages._on_pick("incident_0")
    at.run()
    assert at.session_state["page"] == "Findings" and at.selectbox(key="finding_select").value == inc["trigger"]
    st.cache_data.clear()
    st.cache_resource.clear()


def test_findings_below_min_severity_take_no_part():
    a = finding(0, 100, server="10.0.0.53", severity="informational")
    b = finding(50, 150, server="10.0.0.53", severity="low")
    assert link(a, b) == []  # default low: the informational one links to nothing
    (inc,) = link(a, b, min_severity="informational", min_worst_severity="low")
    assert inc["trigger"] == a["finding_id"] and inc["severity"] == "low"
    assert link(a, b, min_severity="medium") == []


def test_an_incident_needs_one_finding_at_min_worst_severity():
    a = finding(0, 100, server="10.0.0.53", severity="low")
    b = finding(50, 150, server="10.0.0.53", severity="low")
    assert link(a, b) == []  # default medium: two low findings that touch are no incident
    (inc,) = link(a, b, min_worst_severity="low")
    assert inc["severity"] == "low"
    c = finding(120, 200, server="10.0.0.53", severity="medium")
    (inc,) = link(a, b, c)
    assert len(inc["findings"]) == 3  # one medium finding makes the low ones it links part of the incident


@pytest.mark.parametrize("sample", [STORM, SAMPLES / "cascade-dns-krb5.pcap", SAMPLES / "dns-ttl-herd.pcap"])
def test_a_released_scan_takes_the_dns_responses_as_its_run_builds_the_dns_frames(sample):
    """The linker does not build the DNS transactions before a scan's run (alone, with every packet
    column held): it takes its responses as the run builds them among the other frames
    (``Capture.when_built``), and their places from the packets before the run narrows them. The same
    rows as when the DNS transactions were built first."""
    with open_capture(sample) as cap:
        kept = retain(cap, detectors.required_frames())
        assert not cap.built(DNS_FRAME) and kept.dns_responses is None
        detectors.run(cap, release=True)
    with open_capture(sample) as cap:
        cap.frame(DNS_FRAME)
        first = retain(cap, detectors.required_frames())
    assert first.dns_responses is not None and first.dns_responses.height
    assert kept.dns_responses.equals(first.dns_responses)
