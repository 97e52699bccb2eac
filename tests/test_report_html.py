"""``herdscope report``: the self-contained HTML report (dashboards/report_html.py, report_svg.py,
report_command.py).

On three samples (a herd with three findings, a break queue with a high finding, an incast whose
finding is a population of 15): the document parses, has one section per finding (worst first) with
its id, inline SVG proof charts for the charted findings and none for those left out by the limit,
one SVG for the timeline, and nothing that points outside the file. Capture-derived strings are
escaped (a file name and a synthetic finding and incident full of markup); a chart that cannot be
drawn is a note and a count; the exit codes are 0 (written, findings or not), 2 and 3.
"""
from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

import detectors
from analyzer.cli import main
from detectors import incidents
from dashboards import report_html
from dashboards.report_html import ReportLimits, build_report, incidents_section
from dashboards.charts.base import zoom_note
from dashboards.report_svg import ChartError, chart_svg, fixed_width, scoped_ids, static_subtitles
from report_doc import read
from shared_captures import shared_capture, shared_run

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = {"herd": ROOT / "samples" / "dns-ttl-herd.pcap", "break": ROOT / "samples" / "smb2-break-queue.pcap",
           "incast": ROOT / "samples" / "tcp-incast.pcap"}
HOSTILE = '<script>alert("x")</script><img src="http://evil.example/x.png">&amp;\'quote'


def report_of(name: str, findings: pl.DataFrame | None = None, limits: ReportLimits = ReportLimits(), **kw):
    path = SAMPLES[name]
    cap = shared_capture(path)
    found = shared_run(path) if findings is None else findings
    text, tally = build_report(cap, [str(path)], found, list(detectors.available()),
                               incidents=kw.pop("incidents", None), limits=limits, **kw)
    return text, tally, found


@pytest.fixture(scope="module")
def reports():
    """name -> (html, tally, findings); the herd report draws charts for 2 of its 3 findings."""
    incast = shared_run(SAMPLES["incast"])
    linked = incidents.link(incast, shared_capture(SAMPLES["incast"]))
    return {"herd": report_of("herd", limits=ReportLimits(max_charts=2)), "break": report_of("break"),
            "incast": report_of("incast", incast, incidents=linked) + (linked,)}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_a_section_per_finding_worst_first_with_its_charts(reports, name):
    text, tally, found = reports[name][:3]
    doc = read(text)
    top = detectors.worst_first(detectors.top_level(found))
    assert top.height, f"{name}: the sample must have findings for this test to mean anything"
    sections = doc.findings()
    assert [s.attrs["data-finding-id"] for s in sections] == top["finding_id"].to_list()
    assert all(s.attrs["id"] == f"finding-{s.attrs['data-finding-id']}" for s in sections)
    svgs = doc.named("svg")
    limit = 2 if name == "herd" else ReportLimits().max_charts
    for k, s in enumerate(sections):
        fid = s.attrs["data-finding-id"]
        mine = [t for t in svgs if t.finding == fid]
        if k < limit:
            assert s.attrs["data-charted"] == "yes" and len(mine) >= 1, (name, fid)
        else:
            assert s.attrs["data-charted"] == "no" and not mine, (name, fid)
    assert len([t for t in svgs if t.section == "timeline"]) == 1
    assert tally.charted == min(limit, top.height) and tally.charts == len(svgs) and not tally.chart_failures
    for r in top.iter_rows(named=True):  # the numbers and the Wireshark line of every finding
        assert html.escape(r["explanation"]) in text
        assert f"{html.escape(r['metric'])} = " in text
    assert text.count("wireshark -r ") >= top.height
    assert doc.external_references() == []
    assert not re.search(r"url\((?!#)", text), "a CSS/SVG url() pointing outside the document"
    assert "scroll to zoom out" not in text  # the dashboard's zoom hint: an SVG does not zoom


def test_left_out_charts_are_said(reports):
    text, tally, found = reports["herd"]
    assert detectors.top_level(found).height == 3 and tally.charted == 2
    assert "only the worst 2 findings get charts (--max-charts)" in text
    assert 'id="left-out"' in text


def test_a_population_shows_its_member_count_and_members(reports):
    text, _, found, _ = reports["incast"]
    pop = detectors.top_level(found).filter(pl.col("members") > 0).row(0, named=True)
    assert f"[population of {pop['members']} findings]" in text
    assert f"Members ({pop['members']:,})" in text
    member_ids = re.findall(r"<li><code>([0-9a-f]{16})</code>", text)
    assert member_ids == pop["member_ids"][:report_html.MEMBERS_LISTED]


def test_summary_srt_and_incident_hook(reports):
    text, _, _ = reports["break"]
    doc = read(text)
    sections = [t.attrs.get("id") for t in doc.named("section") if t.section == t.attrs.get("id")]
    assert sections[:5] == ["summary", "incidents", "timeline", "findings", "srt"]
    assert "195" in text and "smb2-break-queue.pcap" in text and "tcp" in doc.text  # packets, file, protocols
    assert "Service response times" in doc.text and "CREATE" in doc.text  # SMB2's operations, as stats
    assert 'id="incidents-unavailable"' in text  # incidents=None: the hook says so


def test_every_capture_string_is_escaped(tmp_path):
    """A finding whose every text field is markup, and an incident naming it: nothing of it is markup
    in the document (nor inside the timeline's SVG, which labels bars with the resource)."""
    found = shared_run(SAMPLES["herd"])
    hostile = found.with_columns(*(pl.lit(HOSTILE).alias(c) for c in
                                   ("resource", "explanation", "client", "server", "metric", "unit")))
    fid = hostile["finding_id"][0]
    incident = {"incident_id": "00" * 8, "severity": "medium", "start_time": HOSTILE, "end_time": HOSTILE,
                "start_ns": hostile["start_ns"][0], "end_ns": hostile["end_ns"][0],
                "trigger": fid, "trigger_reasons": [HOSTILE], "findings": [fid, "f" * 16], "summary": HOSTILE,
                "lanes": [{"lane": HOSTILE, "protocol": HOSTILE, "server": HOSTILE, "finding_ids": [fid]}]}
    text, tally, _ = report_of("herd", hostile, limits=ReportLimits(max_charts=1), incidents=[incident],
                               title=HOSTILE)
    doc = read(text)
    assert "<script" not in text and "evil.example/x.png\">" not in text and doc.external_references() == []
    assert not [t for t in doc.tags if t.name in ("script", "img")]
    assert text.count(html.escape(HOSTILE)) >= 10
    assert doc.text.count(HOSTILE) >= 10  # read back, it is the text as the capture had it
    assert f'<a href="#finding-{fid}">' in text  # the trigger links to its finding's section
    assert "f" * 16 in doc.text  # an id that is no finding here stays text, not a dead link
    assert [t for t in doc.named("svg") if t.section == "incidents"]  # its lanes (named HOSTILE) drawn, escaped
    assert tally.charts >= 3 and not tally.chart_failures


def test_the_incidents_of_the_linker_link_to_their_findings(reports):
    text, tally, _, linked = reports["incast"]
    assert linked and tally.incidents == len(linked), "the incast sample's findings must make an incident"
    doc = read(text)
    ids = {t.attrs["id"] for t in doc.tags if "id" in t.attrs}
    for inc in linked:
        assert f"incident-{inc['incident_id']}" in ids
        assert html.escape(inc["summary"]) in text
        assert all(html.escape(r) in text for r in inc["trigger_reasons"])
    assert len([t for t in doc.named("svg") if t.section == "incidents"]) == len(linked)  # swim lanes each
    links = [t.attrs["href"][1:] for t in doc.named("a") if t.section == "incidents"]
    assert links and all(target in ids for target in links)  # every link lands on a finding's section
    assert links[0] == f"finding-{linked[0]['trigger']}"  # the trigger comes first


def test_incidents_section_lists_trigger_first_and_links():
    by_id = {"a" * 16: {"detector": "herd", "kind": "dns"}, "b" * 16: {"detector": "retry_storm", "kind": "kerberos"}}
    inc = {"incident_id": "1" * 16, "severity": "high", "start_time": "t0", "end_time": "t1", "trigger": "a" * 16,
           "trigger_reasons": ["precedes the others by 1.2 s"], "findings": ["a" * 16, "b" * 16], "summary": "s",
           "lanes": []}
    text = incidents_section([inc], by_id)
    assert text.index("likely trigger") < text.index("findings in start order")
    assert 'href="#finding-' + "a" * 16 in text and "precedes the others by 1.2 s" in text
    assert "No incident" in incidents_section([], by_id)


def test_a_chart_that_fails_is_a_note_and_counted(monkeypatch):
    real = report_html.proof_charts
    bad = {"first": None}

    def sometimes_broken(cap, row, findings=None, tx=None, whole=False):
        if bad["first"] is None:
            bad["first"] = row["finding_id"]
            return [({"mark": "no-such-mark", "data": {"values": [{}]}}, "broken")]
        return real(cap, row, findings, tx, whole)

    monkeypatch.setattr(report_html, "proof_charts", sometimes_broken)
    text, tally, found = report_of("herd", limits=ReportLimits(max_charts=2))
    assert len(tally.chart_failures) == 1 and bad["first"] in tally.chart_failures[0]
    doc = read(text)
    assert [t for t in doc.named("p") if t.attrs.get("class") == "chart-failed" and t.finding == bad["first"]]
    assert not [t for t in doc.named("svg") if t.finding == bad["first"]]
    second = detectors.worst_first(detectors.top_level(found))["finding_id"][1]
    assert [t for t in doc.named("svg") if t.finding == second]  # the next finding still has its chart
    assert "1 chart(s) could not be drawn" in text


def test_svg_ids_are_scoped_and_container_widths_fixed():
    spec = {"vconcat": [{"width": "container", "layer": [{"width": "container"}]}, {"width": 300}],
            "data": {"values": [{"width": "container"}]}}
    fixed_width(spec, 640)
    assert spec["vconcat"][0]["width"] == 640 and spec["vconcat"][0]["layer"][0]["width"] == 640
    assert spec["vconcat"][1]["width"] == 300 and spec["data"]["values"][0]["width"] == "container"
    svg = '<clipPath id="clip1"><rect/></clipPath><g clip-path="url(#clip1)"/><use xlink:href="#clip1"/>'
    out = scoped_ids(svg, "c7")
    assert 'id="c7-clip1"' in out and "url(#c7-clip1)" in out and 'href="#c7-clip1"' in out
    titled = {"layer": [{"title": {"text": "t", "subtitle": [zoom_note((0, 10**9), (0, 10)), "sampled: 1 in 2"]}}]}
    assert static_subtitles(titled)["layer"][0]["title"]["subtitle"] == [
        "zoomed on the finding's 10 ns window ± context (1 s shown)", "sampled: 1 in 2"]
    with pytest.raises(ChartError):
        chart_svg({"mark": "no-such-mark", "data": {"values": [{}]}}, "x")


def test_cli_writes_a_report_with_exit_0_on_a_high_finding(tmp_path, capsys):
    """The break queue has a high finding (scan exits 1); report exits 0. The copy's name is markup."""
    copy = tmp_path / 'a<b>&"c\'.pcap'
    shutil.copy(SAMPLES["break"], copy)
    out = tmp_path / "report.html"
    assert main(["report", str(copy), "--out", str(out), "--title", "CI run 42"]) == 0
    text = out.read_text()
    doc = read(text)
    assert "<b>&" not in text and html.escape(str(copy)) in text
    assert "CI run 42" in doc.text and len(doc.findings()) == 1 and doc.findings()[0].attrs["data-charted"] == "yes"
    assert doc.external_references() == []
    assert f"{out}: 1 finding (1 with proof charts), 2 charts" in capsys.readouterr().err


def test_cli_exit_codes(tmp_path, capsys):
    missing = tmp_path / "missing.pcap"
    out = tmp_path / "r.html"
    # --out is checked before any capture is read: a missing capture and an unwritable --out is 2, not 3
    assert main(["report", str(missing), "--out", str(tmp_path / "no-such-dir" / "r.html")]) == 2
    assert main(["report", str(SAMPLES["break"])]) == 2  # --out is required
    assert main(["report", str(SAMPLES["break"]), "--out", str(out), "--max-charts", "-1"]) == 2
    assert main(["report", str(SAMPLES["break"]), "--out", str(out), "--set", "herd.no_such=1"]) == 2
    assert main(["report", str(missing), "--out", str(out)]) == 3
    junk = tmp_path / "junk.pcap"
    junk.write_text("not a capture\n")
    assert main(["report", str(junk), "--out", str(out)]) == 3
    assert not out.exists()  # nothing written for an unreadable input
    err = capsys.readouterr().err
    assert "herdscope: " in err and str(missing) in err


def test_cli_default_max_charts_is_the_documented_limit():
    """analyzer/cli.py writes the default out (--help loads no dashboard): it must be the module's."""
    from analyzer.cli import report

    (opt,) = [p for p in report.params if p.name == "max_charts"]
    assert opt.default == report_html.MAX_CHARTED_FINDINGS == ReportLimits().max_charts


def test_cli_reads_several_files_as_one_capture_and_reports_the_warnings(tmp_path):
    """As scan: a copy of the file is read once, and the warning is in the report's summary."""
    copy = tmp_path / "copy.pcap"
    shutil.copyfile(SAMPLES["break"], copy)
    out = tmp_path / "r.html"
    assert main(["report", str(SAMPLES["break"]), str(copy), "--out", str(out)]) == 0
    doc = read(out.read_text())
    summary = doc.text.split("Protocols")[0]  # the capture table, above the protocols
    assert "195" in summary and "the same packets" in summary and str(copy) in summary
    assert len(doc.findings()) == 1
