"""The dashboard app through Streamlit's AppTest (every page on real samples, the widgets and the
numbers on them, bad input), and the pieces around it: sources under a root, uploads, settings,
evidence frame numbers across joined files, the Wireshark dissection and the launcher."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("streamlit")
import streamlit as st  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import detectors  # noqa: E402
from analyzer import open_capture, open_captures  # noqa: E402
from dashboards import data as D  # noqa: E402
from dashboards import dissect as dissect_mod  # noqa: E402
from dashboards.frames import display_filter, evidence_locations, wireshark_command  # noqa: E402
from dashboards.launch import launch, streamlit_command  # noqa: E402
from dashboards.settings import ENV, Settings  # noqa: E402
from detectors.base import findings as make_findings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
APP = str(ROOT / "dashboards" / "streamlit_app.py")
HERD = SAMPLES / "dns-ttl-herd.pcap"
TIMEOUT = 120
HAS_TSHARK = shutil.which("tshark") is not None


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch):
    """Each test sees its own detectors/monkeypatches, not the previous test's cached results."""
    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.delenv("HERDSCOPE_TSHARK", raising=False)
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


def app(monkeypatch, **settings) -> AppTest:
    monkeypatch.setenv(ENV, Settings(**settings).to_env())
    return AppTest.from_file(APP, default_timeout=TIMEOUT)


def unmd(text: str) -> str:
    """Markdown source as the reader sees it (the pages backslash-escape capture-derived text)."""
    return re.sub(r"\\(.)", r"\1", text)


def texts(elements) -> list[str]:
    return [unmd(e.value) for e in elements]


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def chart_specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]


def chart_titles(at: AppTest) -> list[str]:
    out = []
    for spec in chart_specs(at):
        title = spec.get("title", {})
        out.append(title.get("text", "") if isinstance(title, dict) else str(title))
    return out


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def table_with(at: AppTest, *columns: str) -> pl.DataFrame:
    """The first table on the page that has these columns."""
    for frame in at.dataframe:
        value = pl.from_pandas(frame.value) if not isinstance(frame.value, pl.DataFrame) else frame.value
        if set(columns) <= set(value.columns):
            return value
    raise AssertionError(f"no table with columns {columns}")


def go(at: AppTest, page: str) -> AppTest:
    at.sidebar.radio(key="page").set_value(page).run()
    assert_clean(at)
    return at


# -- every page on a real sample ----------------------------------------------------------------------

def test_every_page_on_the_herd_sample(monkeypatch):
    with open_capture(HERD) as cap:
        expected = detectors.run(cap)
        dns = cap.frame("dns_transactions")
    at = app(monkeypatch, files=(str(HERD),)).run()
    assert_clean(at)
    assert unmd(at.header[0].value) == "Overview — dns-ttl-herd.pcap"
    assert metric(at, "Packets") == "616"
    assert metric(at, "Duration") == "32.7 s"
    assert metric(at, "Findings") == f"{expected.height:,}"
    assert at.sidebar.radio(key="page").options == ["Overview", "Findings", "Transactions", "Downloads"]
    per_protocol = table_with(at, "protocol", "count", "p99_ms")
    assert per_protocol["protocol"].to_list() == ["dns"] and per_protocol["count"].to_list() == [dns.height]
    if expected.height:
        assert chart_titles(at)[0] == f"Findings timeline ({expected.height})"
        timeline = chart_specs(at)[0]
        assert timeline["params"][0]["name"] == "pick"

    go(at, "Findings")
    assert unmd(at.header[0].value) == "Findings — dns-ttl-herd.pcap"
    if expected.height == 0:
        assert any("No findings" in s.value for s in at.success)
    else:
        box = at.selectbox(key="finding_select")
        assert sorted(box.options) == sorted(box.format_func(i) for i in expected["finding_id"].to_list())
        assert at.session_state["finding_id"] in expected["finding_id"].to_list()
        shown = expected.filter(pl.col("finding_id") == at.session_state["finding_id"]).row(0, named=True)
        assert unmd(at.info[0].value) == shown["explanation"]
        code = "\n".join(c.value for c in at.code)
        assert f"wireshark -r {HERD} -Y 'frame.number in {{" in code
        if shown["detector"] == "herd":
            assert "Herd on api.corp.example" in chart_titles(at)
        if HAS_TSHARK:
            expanders = [e.label for e in at.expander]
            assert any(label.startswith(f"Frame {shown['evidence_frames'][0]} — DNS") for label in expanders)
            assert "Layer DNS" in code

    go(at, "Transactions")
    srt = table_with(at, "protocol", "operation", "count")
    assert int(srt.filter(pl.col("protocol") == "dns")["count"].sum()) == dns.height
    titles = chart_titles(at)
    assert "Latency distribution" in titles and "Latency over time" in titles
    at.multiselect(key="tx_client").set_value(["10.77.1.1"]).run()
    assert_clean(at)
    assert table_with(at, "operation", "count")["count"].sum() == dns.filter(pl.col("client") == "10.77.1.1").height

    go(at, "Downloads")
    labels = [b.label for b in at.download_button]
    assert {"Findings as JSON", "Findings as NDJSON", "Findings as Parquet", "packets.parquet"} <= set(labels)
    assert any(label.startswith("All frames (zip") for label in labels)


def test_every_page_on_every_sample_kind(monkeypatch):
    """One capture per protocol family: no page raises or shows an error."""
    for name in ("smb2-break-queue.pcap", "tcp-rto-blackout.pcap", "dns-retry-storm.pcapng"):
        at = app(monkeypatch, files=(str(SAMPLES / name),)).run()
        assert_clean(at)
        for page in ("Findings", "Transactions", "Downloads"):
            go(at, page)


def test_several_files_one_at_a_time_or_joined(monkeypatch):
    files = (str(SAMPLES / "smb2-toctou.pcap"), str(HERD))
    at = app(monkeypatch, files=files).run()
    assert_clean(at)
    choice = at.sidebar.radio(key="source_file")
    assert choice.options == ["smb2-toctou.pcap", "dns-ttl-herd.pcap", "all files, joined in time order"]
    first = int(metric(at, "Packets").replace(",", ""))
    choice.set_value("all files, joined in time order").run()
    assert_clean(at)
    assert unmd(at.header[0].value) == "Overview — 2 files joined"
    assert int(metric(at, "Packets").replace(",", "")) == first + 616


def test_downloads_are_the_scan_documents_and_parquet(tmp_path):
    import io
    import zipfile

    from dashboards.pages import _parquet, _zip_frames

    with open_capture(HERD) as cap:
        blob = _zip_frames(cap)
        names = zipfile.ZipFile(io.BytesIO(blob)).namelist()
        assert {"packets.parquet", "dns_transactions.parquet", "schema.json", "read_report.json"} <= set(names)
        back = pl.read_parquet(io.BytesIO(_parquet(cap.frame("dns_transactions"))))
        assert back.height == cap.frame("dns_transactions").height


# -- each detector's proof chart in the app (findings built here: the schema is fixed) -------------------

PROOFS = [
    # sample, detector, kind, start_s, end_s, server, client, resource, chart titles that must appear
    ("dns-ttl-herd.pcap", "herd", "dns", 10.696, 10.745, "10.77.0.53", None, "api.corp.example",
     ["Herd on api.corp.example"]),
    ("dns-retry-storm.pcapng", "retry_storm", "dns", 4.259, 11.588, "10.77.0.53", None, "db.corp.example",
     ["Retry ladder", "Retry intervals — backoff: fixed", "Amplification over time"]),
    ("smb2-break-queue.pcap", "smb_break_queue", "oplock", 1.062, 4.062, "10.77.0.45", None,
     "\\\\10.77.0.45\\data\\shared.db", ["Break → acknowledgment, and the queue behind it"]),
    ("tcp-rto-blackout.pcap", "tcp_stall", "rto", 0.61, 2.2, "10.77.5.1", "10.77.5.2",
     "10.77.5.1:5001-10.77.5.2:34077", ["Time-sequence graph of 10.77.5.1:5001-10.77.5.2:34077"]),
    ("smb2-toctou.pcap", "toctou", "lost_update", 0.404, 0.808, "10.77.0.45", None,
     "\\\\10.77.0.45\\data\\config.json", ["Check → use windows on \\\\10.77.0.45\\data\\config.json"]),
    ("ldap-conn-churn.pcap", "conn_churn", "churn", 0.534, 6.5, "10.77.0.89:389", "10.77.3.1", "10.77.0.89:389",
     ["New connections per second", "Connection lifetime"]),
]


@dataclasses.dataclass(frozen=True)
class _Params:
    threshold: float = 1.0


def constructed_finding(path: Path, detector, kind, start_s, end_s, server, client, resource) -> pl.DataFrame:
    with open_capture(path) as cap:
        t0 = int(cap.packets["ts_ns"].min())
    rows = pl.DataFrame([{
        "kind": kind, "severity": "high", "start_ns": t0 + int(start_s * 1e9), "end_ns": t0 + int(end_s * 1e9),
        "client": client, "server": server, "resource": resource, "clients": 2, "metric": "m", "value": 3.0,
        "threshold": 1.0, "unit": "x", "evidence_frames": [1, 2], "explanation": f"constructed {detector} finding",
    }], schema_overrides={"evidence_frames": pl.List(pl.UInt32), "clients": pl.UInt32})
    return make_findings(rows, detector=detector, params=_Params())


@pytest.mark.parametrize("case", PROOFS, ids=[c[1] for c in PROOFS])
def test_each_detector_has_its_proof_chart(monkeypatch, case):
    sample, detector, kind, s, e, server, client, resource, titles = case
    frame = constructed_finding(SAMPLES / sample, detector, kind, s, e, server, client, resource)
    monkeypatch.setattr(D, "findings", lambda key, cap, overrides="{}": (frame, {}, [detector]))
    monkeypatch.setenv("HERDSCOPE_TSHARK", "")  # the dissection has its own test
    at = app(monkeypatch, files=(str(SAMPLES / sample),)).run()
    assert_clean(at)
    go(at, "Findings")
    assert unmd(at.info[0].value) == f"constructed {detector} finding"
    got = chart_titles(at)
    for title in titles:
        assert any(t.startswith(title) for t in got), (title, got)
    for spec in chart_specs(at):  # a proof with data, not a "nothing to draw" message
        assert not (spec.get("mark", {}) == "text" or spec.get("mark", {}).get("type") == "text"), spec.get("title")


# generated RoCEv2 captures (tests/rocev2_captures.py; issue 16): the detectors' own findings, not
# constructed ones, each opened on the Findings page with its proof chart drawn from the capture's frames
ROCEV2_PROOFS = [("rocev2-gbn-storm", "gbn_retransmission", "PSN ladder of "),
                 ("rocev2-rnr-loop", "rnr_retry", "PSN ladder of "),
                 ("rocev2-pfc-storm", "pfc_storm", "Pause timeline"),
                 ("rocev2-incast", "ecn_congestion", "CE share of ")]
ROCEV2_PROOF_SCALE = 0.02
# ... except where 0.02 is too short for the pathology's top finding to stand alone: the PFC storm's spread
# needs pauses that begin a whole pause time (336 µs) after the capture's start (detectors/pfc_storm.py)
ROCEV2_PROOF_SCALES = {"pfc_storm": 0.1}


@pytest.mark.parametrize("scenario,detector,title", ROCEV2_PROOFS, ids=[c[1] for c in ROCEV2_PROOFS])
def test_generated_rocev2_findings_show_their_proof_chart(monkeypatch, scenario, detector, title):
    import rocev2_captures

    path = rocev2_captures.rocev2_capture(scenario, ROCEV2_PROOF_SCALES.get(detector, ROCEV2_PROOF_SCALE))
    with open_capture(path) as cap:
        mine = detectors.worst_first(detectors.top_level(detectors.run(cap, only=[detector])))  # as listed
    assert mine.height, f"{detector} finds nothing on {path.name}"
    monkeypatch.setenv("HERDSCOPE_TSHARK", "")
    at = app(monkeypatch, files=(str(path),)).run()
    assert_clean(at)
    go(at, "Findings")
    at.selectbox(key="finding_select").set_value(mine["finding_id"][0]).run()
    assert_clean(at)
    assert unmd(at.info[0].value) == mine["explanation"][0]
    got = chart_titles(at)
    assert any(t.startswith(title) for t in got), (title, got)
    for spec in chart_specs(at):  # drawn from the capture's frames, not a "nothing to draw" message
        assert not (spec.get("mark", {}) == "text" or spec.get("mark", {}).get("type") == "text"), spec.get("title")
    assert not [w for w in texts(at.warning) if "could not be drawn" in w], texts(at.warning)


def test_a_detector_without_a_proof_chart_shows_its_evidence(monkeypatch):
    frame = constructed_finding(HERD, "newcomer", "x", 10.6, 10.8, "10.77.0.53", None, "api.corp.example")
    monkeypatch.setattr(D, "findings", lambda key, cap, overrides="{}": (frame, {}, ["newcomer"]))
    monkeypatch.setenv("HERDSCOPE_TSHARK", "")
    at = app(monkeypatch, files=(str(HERD),)).run()
    assert_clean(at)
    go(at, "Findings")
    assert not [w for w in texts(at.warning) if "could not be drawn" in w], texts(at.warning)
    assert any(t.startswith("Evidence of newcomer") for t in chart_titles(at)), chart_titles(at)


# -- clicks, deep links, tshark, failing detectors, parameters -------------------------------------------

def test_timeline_pick_and_deep_link_open_the_finding(monkeypatch):
    frame = pl.concat([constructed_finding(HERD, "herd", "dns", s, s + 0.05, "10.77.0.53", None, "api.corp.example")
                       for s in (10.696, 21.696)])
    monkeypatch.setattr(D, "findings", lambda key, cap, overrides="{}": (frame, {}, ["herd"]))
    second = frame["finding_id"][1]
    at = app(monkeypatch, files=(str(HERD),))
    at.query_params["finding"] = second
    at.run()
    assert_clean(at)
    assert at.session_state["page"] == "Findings" and at.selectbox(key="finding_select").value == second
    # what a click on a timeline bar does (Streamlit hands the callback the selection under "pick")
    go(at, "Overview")
    from dashboards import pages

    at.session_state["timeline"] = {"selection": {"pick": [{"finding_id": frame["finding_id"][0]}]}}
    with monkeypatch.context() as m:
        m.setattr(pages.st, "session_state", at.session_state)
        pages._on_timeline_pick()
    at.run()
    assert_clean(at)
    assert unmd(at.header[0].value).startswith("Findings")
    assert at.selectbox(key="finding_select").value == frame["finding_id"][0]
    # and what selecting the second row of the findings table does
    at.session_state["findings_table"] = {"selection": {"rows": [1], "columns": []}}
    with monkeypatch.context() as m:
        m.setattr(pages.st, "session_state", at.session_state)
        pages._on_table_pick()
    at.run()
    assert_clean(at)
    assert at.selectbox(key="finding_select").value == at.session_state["_table_ids"][1]


def test_without_tshark_the_page_says_so(monkeypatch):
    frame = constructed_finding(HERD, "herd", "dns", 10.696, 10.745, "10.77.0.53", None, "api.corp.example")
    monkeypatch.setattr(D, "findings", lambda key, cap, overrides="{}": (frame, {}, ["herd"]))
    monkeypatch.setenv("HERDSCOPE_TSHARK", "")
    at = app(monkeypatch, files=(str(HERD),)).run()
    go(at, "Findings")
    assert any("tshark is not installed" in w for w in texts(at.warning))
    assert any("wireshark -r" in c.value for c in at.code)  # the command line is still offered


def test_a_failing_detector_is_reported_and_the_others_still_shown(monkeypatch):
    def boom(cap, params):
        raise RuntimeError("boom")

    monkeypatch.setattr(detectors.available()["retry_storm"], "detect", boom)
    at = app(monkeypatch, files=(str(HERD),)).run()
    assert not at.exception
    assert any("retry_storm" in w and "boom" in w for w in texts(at.warning))
    with open_capture(HERD) as cap:
        others = detectors.run(cap, only=[n for n in detectors.available() if n != "retry_storm"])
    assert metric(at, "Findings") == f"{others.height:,}"


def test_parameter_overrides_reach_the_detectors(monkeypatch):
    seen = []
    monkeypatch.setattr(detectors, "run", lambda cap, only=None, overrides=None, errors=None:
                        seen.append(overrides) or detectors.base.empty_findings())
    at = app(monkeypatch, files=(str(HERD),)).run()
    at.sidebar.text_area(key="overrides_text").set_value("herd.min_clients = 50\nnosuch.x=1").run()
    assert {"herd.min_clients": "50"} in seen
    assert any("no detector named nosuch" in w for w in texts(at.warning))
    at.sidebar.text_area(key="overrides_text").set_value("not a setting").run()
    assert any("expected DETECTOR.PARAMETER=VALUE" in e for e in texts(at.sidebar.error))


# -- without files: samples, uploads, a path under the root; bad input ----------------------------------

def test_without_files_samples_upload_and_path(monkeypatch, tmp_path):
    (tmp_path / "sub").mkdir()
    shutil.copy(HERD, tmp_path / "sub" / "herd.pcap")
    (tmp_path / "notes.pcap").write_text("this is not a capture\n")
    data = HERD.read_bytes()
    (tmp_path / "cut.pcap").write_bytes(data[: len(data) // 2])
    at = app(monkeypatch, files=(), browse_root=str(tmp_path), max_upload_mb=7).run()
    assert_clean(at)
    assert unmd(at.header[0].value) == "herdscope"
    assert at.sidebar.radio(key="source_kind").options == ["Bundled sample", "Upload", "Path"]
    sample = at.sidebar.selectbox(key="sample")
    assert "dns-ttl-herd.pcap" in sample.options and "tcp-rto-blackout.pcap" in sample.options
    sample.set_value("dns-ttl-herd.pcap").run()
    assert_clean(at)
    assert metric(at, "Packets") == "616"
    assert any("3 herds of 60 distinct clients" in c.value for c in at.sidebar.caption)

    at.sidebar.radio(key="source_kind").set_value("Upload").run()
    assert "at most 7 MB" in at.sidebar.file_uploader[0].label
    assert any("Upload limit: 7 MB" in c.value for c in at.sidebar.caption)
    at.sidebar.file_uploader[0].set_value(("notes.pcap", b"GET / HTTP/1.1\r\n\r\n" * 10, "text/plain")).run()
    assert not at.exception
    assert any("notes.pcap is not a capture herdscope can read" in e for e in texts(at.error))
    at.sidebar.file_uploader[0].set_value(("cut.pcap", data[: len(data) // 2], "application/octet-stream")).run()
    assert not at.exception and not at.error
    assert any("The capture is damaged" in w for w in texts(at.warning))
    assert int(metric(at, "Packets").replace(",", "")) < 616

    at.sidebar.radio(key="source_kind").set_value("Path").run()
    assert any(str(tmp_path) in c.value for c in at.sidebar.caption)
    path = at.sidebar.text_input(key="path_text")
    for text, message in (("../etc/passwd", "is outside"), ("/etc/passwd", "is outside"),
                          ("missing.pcap", "no such file"), ("sub", "is not a file")):
        path.set_value(text).run()
        assert not at.exception
        assert any(message in e for e in texts(at.sidebar.error)), (text, texts(at.sidebar.error))
    path.set_value("notes.pcap").run()
    assert any("is not a capture herdscope can read" in e for e in texts(at.error))
    path.set_value(str(tmp_path / "sub" / "herd.pcap")).run()
    assert_clean(at)
    assert metric(at, "Packets") == "616"


def test_resolve_under_root(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "t.pcap").write_bytes(b"x")
    (tmp_path / "outside.pcap").write_bytes(b"x")
    (root / "link.pcap").symlink_to(tmp_path / "outside.pcap")
    assert D.resolve_under_root("a/t.pcap", str(root)) == (root / "a" / "t.pcap").resolve()
    assert D.resolve_under_root(str(root / "a" / "t.pcap"), str(root)) == (root / "a" / "t.pcap").resolve()
    for bad in ("../outside.pcap", "a/../../outside.pcap", str(tmp_path / "outside.pcap"), "link.pcap"):
        with pytest.raises(D.PathRejected, match="outside"):
            D.resolve_under_root(bad, str(root))
    with pytest.raises(D.PathRejected):
        D.resolve_under_root("  ", str(root))
    assert D.captures_under(str(root)) == ["a/t.pcap", "link.pcap"]


def test_uploads_are_kept_once_by_content(tmp_path):
    a = D.save_upload("../../evil name.pcap", b"abc", tmp_path)
    b = D.save_upload("other.pcap", b"abc", tmp_path)
    assert a.parent == tmp_path and a.name.endswith("evil_name.pcap") and ".." not in a.name
    assert a.read_bytes() == b"abc" and b != a and b.name.split("-")[0] == a.name.split("-")[0]


def test_settings_travel_in_the_environment():
    s = Settings(files=("/x/a.pcap",), browse_root="/data", max_upload_mb=5)
    assert Settings.from_env({ENV: s.to_env()}) == s
    assert Settings.from_env({}).files == ()


def test_parse_overrides():
    assert D.parse_overrides("herd.min_clients=50\n# comment\n\nretry_storm.x = 2 # why") == {
        "herd.min_clients": "50", "retry_storm.x": "2"}
    with pytest.raises(ValueError):
        D.parse_overrides("min_clients=50")


def test_a_bad_override_disables_only_its_own_detector():
    """The checks are detectors.configure's; the policy (one bad value costs one detector) the page's."""
    bad = {"herd.min_clients": "many", "nosuch.a": "1", "population.min_members": "1", "toctou.no_such_param": "1"}
    errors: dict[str, str] = {}
    good = D.usable_overrides({**bad, "retry_storm.min_retries": "5"}, errors)
    assert good == {"retry_storm.min_retries": "5"}
    assert set(errors) == {"herd", "overrides", "population", "toctou"}
    assert errors["herd"].startswith("bad parameter: herd.min_clients") and "not an integer" in errors["herd"]
    assert "no detector named nosuch" in errors["overrides"]
    assert "below the smallest allowed value" in errors["population"]
    assert "no parameter 'no_such_param'" in errors["toctou"]
    for key, message in errors.items():  # each message is what detectors.configure says
        owner = "nosuch" if key == "overrides" else key
        with pytest.raises(detectors.ParameterError) as exc:
            detectors.configure(None if owner in ("population", "nosuch") else [owner],
                                {k: v for k, v in bad.items() if k.startswith(owner + ".")})
        assert message.removeprefix("bad parameter: ") == str(exc.value)


# -- evidence frames, Wireshark lines, dissection ----------------------------------------------------------

def test_evidence_frames_across_joined_files():
    files = [str(SAMPLES / "smb2-toctou.pcap"), str(SAMPLES / "dns-ttl-herd.pcap")]
    cap = open_captures(files)
    sizes = {p: r.records for p, r in cap.reports}
    first = cap.files[0]
    n_first = sizes[first]
    got = evidence_locations(cap, [1, n_first, n_first + 1, n_first + 5])
    assert got == [(first, [1, n_first]), (cap.files[1], [1, 5])]
    ts = cap.packets.filter(pl.col("frame") == n_first + 5)["ts_ns"].item()
    with open_capture(cap.files[1]) as one:
        assert one.packets.filter(pl.col("frame") == 5)["ts_ns"].item() == ts
    cap.close()


def test_wireshark_line_and_display_filter():
    assert display_filter([3, 5, 7]) == "frame.number in {3, 5, 7}"  # Wireshark 4 wants the commas
    assert wireshark_command("/c/my trace.pcap", [1, 2]) == \
        "wireshark -r '/c/my trace.pcap' -Y 'frame.number in {1, 2}'"


def test_tshark_path_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("HERDSCOPE_TSHARK", "")
    assert dissect_mod.tshark_path() is None
    with pytest.raises(dissect_mod.DissectError, match="tshark is not installed"):
        dissect_mod.dissect(str(HERD), [1])
    monkeypatch.setenv("HERDSCOPE_TSHARK", str(tmp_path / "nope"))
    assert dissect_mod.tshark_path() is None


@pytest.mark.tshark
@pytest.mark.skipif(not HAS_TSHARK, reason="tshark is not installed")
def test_dissection_of_a_few_frames(monkeypatch):
    whole = dissect_mod.dissect(str(HERD), [250, 5, 5])
    assert whole.note is None and [d.frame for d in whole.frames] == [5, 250]
    assert all("Layer DNS" in d.text for d in whole.frames) and whole.frames[0].summary.startswith("DNS")
    # a long file: the frames are cut out with editcap first, and the numbers map back
    monkeypatch.setattr(dissect_mod, "DIRECT_MAX_PACKETS", 10)
    cut = dissect_mod.dissect(str(HERD), [5, 250], total_packets=616)
    assert [d.frame for d in cut.frames] == [5, 250] and "editcap" in cut.note
    assert [d.text.split("Layer DNS")[1][:200] for d in cut.frames] == \
        [d.text.split("Layer DNS")[1][:200] for d in whole.frames]


# -- the launcher ---------------------------------------------------------------------------------------

def test_streamlit_command_binds_where_asked():
    cmd = streamlit_command(port=8765, address="127.0.0.1", max_upload_mb=12)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("streamlit_app.py")
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert flags["--server.port"] == "8765" and flags["--server.address"] == "127.0.0.1"
    assert flags["--server.maxUploadSize"] == "12" and flags["--browser.gatherUsageStats"] == "false"


def test_launch_refuses_bad_input(tmp_path, capsys):
    assert launch([str(tmp_path / "missing.pcap")]) == 3
    assert "no such file" in capsys.readouterr().err
    assert launch([], port=70000) == 2
    assert launch([], browse_root=str(tmp_path / "nope")) == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_herdscope_dashboard_serves_on_localhost_and_stops(tmp_path):
    """`herdscope dashboard FILE --port P`: Streamlit answers on 127.0.0.1:P; SIGTERM stops both."""
    port = free_port()
    env = dict(os.environ, STREAMLIT_SERVER_HEADLESS="true", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "analyzer", "dashboard", str(HERD), "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    assert r.read() == b"ok"
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.time() < deadline, "the dashboard did not come up in 60 s"
                time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"herdscope dashboard on http://127.0.0.1:{port}" in out
    with socket.socket() as s:  # the Streamlit child is gone with it
        assert s.connect_ex(("127.0.0.1", port)) != 0
