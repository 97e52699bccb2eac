"""``info`` and ``stats`` of a capture decoded in server partitions say what they say of it decoded at
once (issue 13: scan, stats and info of a capture of any size in bounded memory).

Both decode in partitions one after the other in this process (``analyzer.distributed.decode_into``):
``stats`` merges the partitions' transaction frames, ``info`` their connections and the counts it adds
up (``analyzer.summary.counted_parts``). Every sample and the synthetic capture are compared whole, key
for key, with ``--partitions 1``; and a capture estimated as large is partitioned without being asked.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer import cli, distributed, open_capture, record_estimate, summary
from analyzer.kernels.silences import SPAN_ONLY_NS
from analyzer.tcp import SEGMENT_DESCRIPTIONS

SAMPLES = Path(__file__).parent.parent / "samples"
CAPTURES = sorted(p.name for p in SAMPLES.iterdir() if p.suffix in (".pcap", ".pcapng"))


def _json_lines(capsys, *args) -> tuple[int, list[dict]]:
    capsys.readouterr()
    code = cli.main([*args, "--format", "json"])
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("command", ["info", "stats"])
@pytest.mark.parametrize("name", CAPTURES)
def test_a_sample_in_partitions_says_what_it_says_decoded_at_once(capsys, command, name):
    path = str(SAMPLES / name)
    code, whole = _json_lines(capsys, command, "--partitions", "1", path)
    code3, parts = _json_lines(capsys, command, "--partitions", "3", path)
    assert code3 == code and parts == whole


def _count_tasks(monkeypatch) -> list:
    tasks = []
    submit = distributed.InProcess.submit
    monkeypatch.setattr(distributed.InProcess, "submit",
                        lambda self, fn, *a, **k: (tasks.append(fn), submit(self, fn, *a, **k))[1])
    return tasks


@pytest.mark.parametrize("command", ["info", "stats"])
def test_the_synthetic_capture_in_partitions_is_summarised_as_at_once(capsys, monkeypatch, synthetic_capture, command):
    """200k packets of every protocol, with damage and TCP analysis flags to add up across partitions (and
    the shards of its big servers: ``analyzer.shards``)."""
    code, whole = _json_lines(capsys, command, "--partitions", "1", str(synthetic_capture))
    tasks = _count_tasks(monkeypatch)
    code4, parts = _json_lines(capsys, command, "--partitions", "4", str(synthetic_capture))
    # four partitions, and the servers above a quarter of the packets cut into shards of their clients besides
    assert tasks.count(distributed.decode_partition_task) > 4
    assert code4 == code == 0 and parts == whole
    if command == "info":
        tcp = whole[0]["tcp"]
        assert tcp["connections"] > 100 and tcp["retransmissions"] > 0 and tcp["handshake_rtt_ns"]["n"] > 100
    else:
        assert {row["protocol"] for row in whole[0]["stats"]} >= {"dns", "kerberos", "ldap", "smb2"}


@pytest.mark.parametrize("command", ["info", "stats"])
def test_a_large_capture_is_decoded_in_partitions_by_default(capsys, monkeypatch, command):
    """The thresholds lowered so that a sample counts as large: decoded in partitions unasked (its tasks
    run), and the output is what --partitions 1 gives; each file of several is estimated on its own."""
    big, small = str(SAMPLES / "ldap-saturation.pcap"), str(SAMPLES / "smb2-break-queue.pcap")
    _, whole = _json_lines(capsys, command, "--partitions", "1", big, small)
    tasks = _count_tasks(monkeypatch)
    monkeypatch.setattr(record_estimate, "AUTO_MIN_PACKETS", 1000)
    monkeypatch.setattr(record_estimate, "PARTITION_PACKETS", record_estimate.estimated_records(big) // 3 + 1)
    assert record_estimate.estimated_records(small) < 1000 < record_estimate.estimated_records(big)
    _, parts = _json_lines(capsys, command, big, small)
    # the big file's three, and its server (most of its packets) cut into shards besides; the small one at once
    assert tasks.count(distributed.decode_partition_task) > 3
    assert parts == whole and len(whole) == 2


@pytest.mark.parametrize("command", ["info", "stats", "scan"])
def test_only_a_scans_tasks_read_the_whole_captures_packet_times(capsys, monkeypatch, tmp_path, command):
    """Every packet's (frame, ts_ns) is 16 bytes a packet in each task (1.6 GB at 100M packets): a task reads
    them only when what it runs reads them (a scan's detectors: spans and rates are the capture's), not
    for ``stats`` or ``info`` (their tasks then hold the ends alone)."""
    seen = []
    task = distributed.decode_partition_task

    def traced(part, *args, **kwargs):
        seen.append((part.whole_times, part.silence_ns))
        return task(part, *args, **kwargs)

    monkeypatch.setattr(distributed, "decode_partition_task", traced)
    output = ["--output", str(tmp_path / "out.json")] if command == "scan" else []
    _json_lines(capsys, command, "--partitions", "2", str(SAMPLES / "ldap-saturation.pcap"), *output)
    assert len(seen) >= 2
    if command == "scan":
        assert all(whole for whole, _ in seen)
    else:
        assert seen == [(False, SPAN_ONLY_NS)] * len(seen)


@pytest.mark.parametrize("name", ["ldap-saturation.pcap", "smb2-break-queue.pcap", "dns-retry-storm.pcapng"])
def test_stats_of_a_selection_in_partitions(capsys, name):
    """The selection is applied before the partitions are decided: the same rows as at once."""
    path = str(SAMPLES / name)
    _, everything = _json_lines(capsys, "stats", "--partitions", "1", path)
    server = max(everything[0]["stats"], key=lambda r: r["count"])  # a busy operation's server, by address
    _, by_server = _json_lines(capsys, "stats", "--by", "server", "--partitions", "1", path)
    host = next(r["server"] for r in by_server[0]["stats"] if r["operation"] == server["operation"])
    for selection in (["--host", host], ["--end", "2"], ["--host", host, "--start", "1"]):
        code, whole = _json_lines(capsys, "stats", *selection, "--partitions", "1", path)
        code3, parts = _json_lines(capsys, "stats", *selection, "--partitions", "3", path)
        assert code3 == code and parts == whole, selection
        assert whole[0]["selection"] and whole[0]["selection"]["packets_selected"] < whole[0]["selection"]["packets_total"]


def test_the_help_allows_no_more_partitions_than_a_packet_can_be_numbered_in():
    """--partitions stops where analyzer.partitions.partition_ids would refuse (a usage error, not a crash)."""
    from analyzer.capture import UNSELECTED

    assert cli.MAX_PARTITIONS == int(UNSELECTED) - 1
    for command in (cli.scan, cli.stats, cli.info):
        option = next(p for p in command.params if p.name == "partitions")
        assert option.type.max == cli.MAX_PARTITIONS


@pytest.mark.parametrize("command", ["info", "stats"])
def test_standard_input_is_not_read_in_partitions(command):
    """Each partition reads the file again: what arrives on standard input can be read once (usage, 2);
    without --partitions it is read at once."""
    for option, expected in ((["--partitions", "2"], 2), ([], 0)):
        with open(SAMPLES / "dns-ttl-herd.pcap", "rb") as stdin:
            run = subprocess.run([sys.executable, "-m", "analyzer", command, *option, "-"], stdin=stdin,
                                 capture_output=True, text=True, timeout=120)
        assert run.returncode == expected, run.stderr
        if expected == 2:
            assert "standard input can be read only once" in run.stderr and "--partitions" in run.stderr


@pytest.mark.parametrize("command", ["scan", "stats"])
def test_a_copied_piece_is_read_once_in_partitions_too(capsys, tmp_path, command):
    """A partitioned command reads few packet columns in the caller, but of several pieces it still reads
    what tells a copy apart (``capture.COPY_COLUMNS``: times and lengths), so a piece named twice under
    two names is read once, as at once."""
    original = SAMPLES / "smb2-break-queue.pcap"
    copy = tmp_path / "copy.pcap"
    copy.write_bytes(original.read_bytes())
    args = [command, str(original), str(copy)] + (["--output", str(tmp_path / "out.json")] if command == "scan" else [])
    code, lines = _json_lines(capsys, *args, "--partitions", "2")
    alone_code, alone = _json_lines(capsys, command, str(original), "--partitions", "1",
                                    *(["--output", str(tmp_path / "alone.json")] if command == "scan" else []))
    assert code == alone_code
    if command == "stats":
        assert lines[0]["stats"] == alone[0]["stats"] and lines[0]["stats"]
    else:
        together = json.loads((tmp_path / "out.json").read_text())
        assert any("the same packets as" in w for w in together["captures"][0]["warnings"]), together["captures"]
        assert together["findings"] and [f["finding_id"] for f in together["findings"]] == \
            [f["finding_id"] for f in json.loads((tmp_path / "alone.json").read_text())["findings"]]


@pytest.mark.parametrize("name", CAPTURES)
def test_info_at_once_builds_of_the_segments_what_it_reads(name):
    """``info`` at once (``summarize_in_partitions(cap, 1)``) has TCP analysis build of ``tcp_segments``
    only what the summary reads of it (``summary.TASK_FRAME_COLUMNS``): the summary is that of the
    segments built whole."""
    with open_capture(SAMPLES / name) as cap:
        expected = summary.summarize(cap)
        assert cap.frame("tcp_segments").columns == list(SEGMENT_DESCRIPTIONS)
    with open_capture(SAMPLES / name) as cap:
        got = summary.summarize_in_partitions(cap, 1)
        built = cap.frame("tcp_segments").columns
    assert got == expected
    assert set(summary.TASK_FRAME_COLUMNS["tcp_segments"]) <= set(built) < set(SEGMENT_DESCRIPTIONS)
