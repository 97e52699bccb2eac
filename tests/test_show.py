"""herdscope show: one finding in full, every evidence frame, per file."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analyzer import open_capture
from analyzer.cli import ExitCode, main
from detectors import run
from detectors.base import EVIDENCE_CAP

SAMPLES = Path(__file__).parent.parent / "samples"
QUEUE = SAMPLES / "smb2-break-queue.pcap"
TOCTOU = SAMPLES / "smb2-toctou.pcap"


def _scan_json(capsys, *args) -> dict:
    main(["scan", "--format", "json", *args])
    return json.loads(capsys.readouterr().out)


def test_show_prints_the_finding_scan_reported(capsys):
    (f,) = _scan_json(capsys, str(QUEUE))["findings"]
    assert main(["show", f["finding_id"], str(QUEUE), "--no-tshark"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert f["finding_id"] in out and "took 3 s to acknowledge" in out.replace("\n", " ")
    assert "wireshark -r" in out and "break_timeout_ns=35s" in out


def test_show_json_by_prefix_matches_scan(capsys):
    (f,) = _scan_json(capsys, str(QUEUE))["findings"]
    assert main(["show", f["finding_id"][:6], str(QUEUE), "--format", "json", "--no-tshark"]) == ExitCode.OK
    shown = json.loads(capsys.readouterr().out)
    for key in ("finding_id", "severity", "explanation", "start_ns", "evidence_frames", "evidence"):
        assert shown[key] == f[key]


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_show_summarises_every_evidence_frame_with_tshark(capsys):
    (f,) = _scan_json(capsys, str(QUEUE))["findings"]
    assert main(["show", f["finding_id"], str(QUEUE), "--format", "json"]) == ExitCode.OK
    (summary,) = json.loads(capsys.readouterr().out)["tshark"]
    assert len(summary["lines"]) == len(f["evidence_frames"])
    assert [int(line.split()[0]) for line in summary["lines"]] == f["evidence_frames"]
    assert any("Oplock Break" in line for line in summary["lines"])


def test_show_lists_all_evidence_frames_beyond_the_cap(capsys):
    """A finding whose evidence scan caps at EVIDENCE_CAP frames: show has every one."""
    big = None
    for path in sorted(SAMPLES.glob("*.pcap*")):
        with open_capture(path) as cap:
            found = run(cap)
        over = found.filter(found["evidence_total"] > EVIDENCE_CAP)
        if over.height:
            big = (path, over.row(0, named=True))
            break
    assert big is not None, "no sample has a finding with more than EVIDENCE_CAP evidence frames any more"
    path, f = big
    assert main(["show", f["finding_id"], str(path), "--format", "json", "--no-tshark"]) == ExitCode.OK
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["evidence_frames"]) == f["evidence_total"] > EVIDENCE_CAP
    assert sum(len(e["frames"]) for e in shown["evidence"]) == f["evidence_total"]


def test_show_in_a_multi_file_capture_names_each_file(capsys):
    doc = _scan_json(capsys, str(QUEUE), str(TOCTOU))
    lost = next(f for f in doc["findings"] if f["detector"] == "toctou")
    assert main(["show", lost["finding_id"], str(QUEUE), str(TOCTOU), "--format", "json", "--no-tshark"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [e["file"] for e in shown["evidence"]] == [str(TOCTOU)]


@pytest.mark.parametrize("finding_id, message", [
    ("zz", "is not a finding id"), ("abc", "is not a finding id"), ("0123456789abcdef", "no finding"),
])
def test_show_unknown_or_malformed_id_is_a_usage_error(finding_id, message, capsys):
    assert main(["show", finding_id, str(QUEUE), "--no-tshark"]) == ExitCode.USAGE
    assert message in capsys.readouterr().err


def test_show_with_other_parameters_finds_other_ids(capsys):
    (f,) = _scan_json(capsys, str(QUEUE))["findings"]
    # the finding disappears when its threshold is raised above its value: show says so
    assert main(["show", f["finding_id"], str(QUEUE), "--set", "smb_break_queue.min_ack_latency_ns=10s",
                 "--no-tshark"]) == ExitCode.USAGE
    assert "no finding" in capsys.readouterr().err
