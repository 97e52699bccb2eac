"""herdscope scan: formats, exit codes, configuration and ring-buffer pieces read as one capture."""
import json
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest

from analyzer import open_capture, open_captures
from analyzer.cli import ExitCode, main
from detectors import run
from detectors.base import FINDING_COLUMNS

SAMPLES = Path(__file__).parent.parent / "samples"
QUEUE = SAMPLES / "smb2-break-queue.pcap"  # one high smb_break_queue finding
HERD = SAMPLES / "dns-ttl-herd.pcap"  # three medium herd findings
FINDING_KEYS = set(FINDING_COLUMNS) | {"start_time", "end_time", "capture", "evidence", "incident"}


def test_json_document_and_exit_code_on_findings(capsys):
    assert main(["scan", "--format", "json", str(QUEUE)]) == ExitCode.FINDINGS
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"herdscope", "captures", "findings", "incidents"}
    assert doc["incidents"] == []  # one finding: no incident
    (cap,) = doc["captures"]
    assert cap["packets"] == 195 and cap["findings"]["high"] == 1 and cap["damage"] is None
    (f,) = doc["findings"]
    assert set(f) == FINDING_KEYS
    assert (f["detector"], f["severity"], f["client"]) == ("smb_break_queue", "high", "10.77.4.1")
    assert f["evidence_total"] >= len(f["evidence_frames"]) > 0 and isinstance(f["parameters"], dict)


def test_fail_on_decides_the_exit_code(capsys):
    assert main(["scan", "--format", "ndjson", "--fail-on", "critical", str(QUEUE)]) == ExitCode.OK
    assert main(["scan", "--format", "ndjson", str(HERD)]) == ExitCode.OK  # medium < high
    assert main(["scan", "--format", "ndjson", "--fail-on", "medium", str(HERD)]) == ExitCode.FINDINGS
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["detector"] for x in lines].count("herd") == 6  # two runs of the herd sample


def test_junit_and_parquet_outputs(tmp_path):
    xml_path = tmp_path / "r.xml"
    assert main(["scan", "--format", "junit", "--output", str(xml_path), str(QUEUE), str(HERD),
                 "--separate"]) == ExitCode.FINDINGS
    root = ET.parse(xml_path).getroot()
    assert root.get("failures") == "1"
    suites = root.findall("testsuite")
    assert len(suites) == 2  # one per capture
    for suite in suites:
        cases = suite.findall("testcase")
        names = {c.get("classname") for c in cases}
        assert names == {f"herdscope.{d}" for d in run.__globals__["available"]()}  # every detector shows
        # every finding is a case: the break queue (high, failing) and the three herds (medium, passing)
        findings = [c for c in cases if c.get("name") != "no findings"]
        assert all(c.find("system-out") is not None for c in findings)
        assert len(findings) == (1 if "break-queue" in suite.get("name") else 3)
    herds = [c for c in root.iter("testcase") if c.get("classname") == "herdscope.herd" and "dns" in c.get("name")]
    assert len(herds) == 3 and all(c.find("failure") is None for c in herds)  # medium < --fail-on high
    pq = tmp_path / "f.parquet"
    assert main(["scan", "--format", "parquet", "--output", str(pq), str(HERD)]) == ExitCode.OK
    f = pl.read_parquet(pq)
    assert f.height == 3 and set(f["detector"]) == {"herd"} and "capture" in f.columns


def test_table_output_names_the_evidence_filter(capsys):
    main(["scan", str(QUEUE)])
    out = capsys.readouterr().out
    assert "took 3 s to acknowledge the oplock break" in out
    assert "frame.number in {81, 94" in out  # the comma syntax tshark 4 accepts


def test_multi_file_evidence_names_each_file_with_its_own_frame_numbers(capsys):
    """Two files read as one capture: the evidence opens the right packets in each file."""
    toctou = SAMPLES / "smb2-toctou.pcap"
    main(["scan", "--format", "json", str(QUEUE), str(toctou)])
    doc = json.loads(capsys.readouterr().out)
    sizes = {str(QUEUE): 195}
    with open_capture(toctou) as cap:
        sizes[str(toctou)] = cap.packets.height
    by_file = {}
    for f in doc["findings"]:
        assert sum(len(e["frames"]) for e in f["evidence"]) == len(f["evidence_frames"])
        for e in f["evidence"]:
            assert all(1 <= n <= sizes[e["file"]] for n in e["frames"])
            by_file.setdefault(e["file"], []).append(f["detector"])
    assert "smb_break_queue" in by_file[str(QUEUE)] and "toctou" in by_file[str(toctou)]
    # the same finding scanned alone has the same frame numbers in that file
    main(["scan", "--format", "json", str(toctou)])
    alone = {(f["kind"], f["start_ns"]): f["evidence"] for f in json.loads(capsys.readouterr().out)["findings"]}
    for f in doc["findings"]:
        if f["detector"] == "toctou" and (f["kind"], f["start_ns"]) in alone:
            assert alone[(f["kind"], f["start_ns"])][0]["frames"] == f["evidence"][0]["frames"]
    main(["scan", str(QUEUE), str(toctou)])
    out = capsys.readouterr().out
    assert f"wireshark -r {toctou}" in out and f"wireshark -r {QUEUE}" in out


def test_cut_evidence_says_how_much_more():
    from detectors.report import evidence_lines

    record = {"finding_id": "ab", "evidence_total": 60,
              "evidence": [{"file": "a.pcap", "frames": list(range(1, 51))}]}
    lines = evidence_lines(record, per_command=20)
    assert "... and 30 more in this file" in lines[0] and lines[0].count(",") == 19
    assert "... and 10 more evidence frames" in lines[1]


def test_json_integers_are_integers(capsys):
    main(["scan", "--format", "json", str(HERD)])
    (summary,) = json.loads(capsys.readouterr().out)["captures"]
    assert type(summary["ts_resolution_ns"]) is int  # noqa: E721 - 1000, not 1000.0


def test_quiet_prints_nothing_but_keeps_the_exit_code(capsys):
    assert main(["scan", "--quiet", str(QUEUE)]) == ExitCode.FINDINGS
    assert capsys.readouterr().out == ""


def test_config_file_and_set_overrides(tmp_path, capsys):
    cfg = tmp_path / "herdscope.toml"
    cfg.write_text('[scan]\ndetectors = ["herd"]\nfail_on = "medium"\n\n[herd]\nmin_clients = 61\n')
    assert main(["scan", "--config", str(cfg), "--format", "ndjson", str(HERD)]) == ExitCode.OK
    assert capsys.readouterr().out == ""  # 60 clients < 61
    assert main(["scan", "--config", str(cfg), "--set", "herd.min_clients=20", "--format", "ndjson",
                 str(HERD)]) == ExitCode.FINDINGS


@pytest.mark.parametrize("argv", [
    ["scan", "--set", "herd.no_such_parameter=1", str(HERD)],
    ["scan", "--set", "nodetector.x=1", str(HERD)],
    ["scan", "--set", "herd.min_clients=many", str(HERD)],
    ["scan", "--detectors", "herd,nope", str(HERD)],
    ["scan", "--format", "parquet", str(HERD)],  # needs --output
])
def test_bad_parameters_are_usage_errors(argv):
    assert main(argv) == ExitCode.USAGE


def test_unreadable_input_exits_3_even_with_readable_ones(tmp_path):
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"garbage")
    assert main(["scan", "--separate", "--format", "ndjson", str(HERD), str(bad)]) == ExitCode.UNREADABLE


def _split_pcap(path: Path, out_dir: Path) -> list[Path]:
    data = path.read_bytes()
    header, off, records = data[:24], 24, []
    while off + 16 <= len(data):
        incl = struct.unpack("<I", data[off + 8:off + 12])[0]
        records.append(data[off:off + 16 + incl])
        off += 16 + incl
    half = len(records) // 2
    pieces = []
    for k, chunk in enumerate((records[:half], records[half:])):
        p = out_dir / f"ring_{k:05d}.pcap"
        p.write_bytes(header + b"".join(chunk))
        pieces.append(p)
    return pieces


def test_ring_buffer_pieces_read_as_one_capture(tmp_path):
    pieces = _split_pcap(HERD, tmp_path)
    with open_capture(HERD) as whole:
        expected = run(whole).select("detector", "start_ns", "clients", "evidence_frames")
        n = whole.packets.height
    merged = open_captures(list(reversed(pieces)))  # given out of order: joined in time order
    assert merged.packets.height == n and merged.packets["frame"].to_list() == list(range(1, n + 1))
    assert merged.files == [str(p) for p in pieces]
    got = run(merged).select("detector", "start_ns", "clients", "evidence_frames")
    assert got.equals(expected)  # same findings, same frame numbers as the unsplit file


def test_separate_pieces_each_on_its_own(tmp_path, capsys):
    pieces = _split_pcap(HERD, tmp_path)
    main(["scan", "--separate", "--format", "json", *map(str, pieces)])
    doc = json.loads(capsys.readouterr().out)
    assert [c["files"] for c in doc["captures"]] == [[str(pieces[0])], [str(pieces[1])]]
