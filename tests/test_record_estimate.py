"""The record count of a capture estimated from a sample, and the partitions a scan takes by default
from it (analyzer/record_estimate.py, issue 13)."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from analyzer import cli, distributed, record_estimate
from analyzer.record_estimate import automatic_partitions, estimated_packets, estimated_records

ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "samples"


def _records(path) -> int:
    out = subprocess.run(["capinfos", "-c", "-M", "-T", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1].split("\t")[-1])


@pytest.mark.parametrize("name", ["tcp-incast.pcap", "dns-retry-storm.pcapng", "smb2-break-queue.pcap"])
def test_a_small_file_is_walked_whole_and_counted_exactly(name):
    assert estimated_records(SAMPLES / name) == _records(SAMPLES / name)


def test_a_large_file_is_sampled_across_its_length(synthetic_capture):
    """The synth capture begins with handshakes and DNS, smaller than its HTTP bulk: its first records
    alone put it at 1.6 times its count; windows spread over the file find it within a few percent."""
    real = _records(synthetic_capture)
    assert os.path.getsize(synthetic_capture) > record_estimate.SAMPLE_WINDOWS * record_estimate.SAMPLE_WINDOW_BYTES
    assert abs(estimated_records(synthetic_capture) - real) <= 0.1 * real


def test_a_large_pcapng_file_is_sampled_too(synthetic_capture, tmp_path):
    ng = tmp_path / "synth.pcapng"
    subprocess.run(["editcap", "-F", "pcapng", str(synthetic_capture), str(ng)], check=True, capture_output=True)
    real = _records(ng)
    assert abs(estimated_records(ng) - real) <= 0.1 * real


def test_what_cannot_be_read_twice_or_is_compressed_is_not_estimated(tmp_path):
    packed = tmp_path / "x.pcap.gz"
    packed.write_bytes(gzip.compress((SAMPLES / "tcp-incast.pcap").read_bytes()))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would wait for a writer: it must not be opened
    not_capture = tmp_path / "notes.txt"
    not_capture.write_text("not a capture\n" * 100)
    for path in (packed, fifo, not_capture, tmp_path / "missing.pcap", "-"):
        assert estimated_records(path) is None, path
    assert estimated_packets([SAMPLES / "tcp-incast.pcap", packed]) is None
    assert automatic_partitions(None) == 1


def test_damaged_records_end_the_sample_not_the_estimate(tmp_path):
    data = bytearray((SAMPLES / "tcp-incast.pcap").read_bytes())
    data[24 + 8:24 + 12] = (0xFFFFFFF0).to_bytes(4, "little")  # the first record's length: absurd
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(bytes(data))
    assert estimated_records(bad) is None  # no whole record before the damage: no estimate, no guess


def test_default_partitions_grow_with_the_packets():
    per = record_estimate.PARTITION_PACKETS
    assert automatic_partitions(record_estimate.AUTO_MIN_PACKETS - 1) == 1
    assert automatic_partitions(record_estimate.AUTO_MIN_PACKETS) == -(-record_estimate.AUTO_MIN_PACKETS // per)
    assert automatic_partitions(4 * per) == 4
    assert automatic_partitions(10 ** 12) == record_estimate.AUTO_MAX_PARTITIONS


def test_the_help_states_the_default_partitions():
    text = " ".join(p.help or "" for p in cli.scan.params if p.name == "partitions")
    words = re.search(r"fewer than (\d+(?:\.\d+)?)M packets .* one per (\d+(?:\.\d+)?)M packets \(at most (\d+)\)", text)
    assert words, text
    assert float(words[1]) * 1e6 == record_estimate.AUTO_MIN_PACKETS
    assert float(words[2]) * 1e6 == record_estimate.PARTITION_PACKETS
    assert int(words[3]) == record_estimate.AUTO_MAX_PARTITIONS


def test_a_scan_of_a_large_capture_is_partitioned_by_default_and_reports_the_same(monkeypatch, tmp_path, capsys):
    """The thresholds lowered so that a sample counts as large: the scan decodes it in partitions
    (InProcess's tasks run; its server, above a third of the packets, cut into shards) and reports
    byte for byte what --partitions 1 does."""
    path = str(SAMPLES / "smb2-break-queue.pcap")
    whole, parts = tmp_path / "whole.json", tmp_path / "parts.json"
    assert cli.main(["scan", "--format", "json", "--partitions", "1", "--output", str(whole), path]) in (0, 1)
    tasks = []
    submit = distributed.InProcess.submit
    monkeypatch.setattr(distributed.InProcess, "submit", lambda self, fn, *a, **k: (tasks.append(fn), submit(self, fn, *a, **k))[1])
    monkeypatch.setattr(record_estimate, "AUTO_MIN_PACKETS", 10)
    monkeypatch.setattr(record_estimate, "PARTITION_PACKETS", _records(path) // 3 + 1)
    assert cli.main(["scan", "--format", "json", "--output", str(parts), path]) in (0, 1)
    # three partitions, and the file server (nearly every packet) cut into shards of its clients besides
    assert tasks.count(distributed.decode_partition_task) > 3 and tasks.count(distributed.server_task) == 1
    assert json.loads(parts.read_text()) == json.loads(whole.read_text()) and json.loads(whole.read_text())["findings"]
