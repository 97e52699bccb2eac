"""A partition reads its records' rows from the caller's record index instead of walking the file
(issue 13: at 100M packets each partition's walk was a read of the whole 63 GB file from the disk).

``analyzer.record_index``: the caller's chunked reading (``analyzer.partitions.CallerChunks`` with
``record_index``) writes the walker's row of every record; a part read from it must be the part a walk
gives, row for row: the packets, SACK blocks and ICMP errors, the whole file's times and silences, the
report. Samples of both formats, several interfaces and sections, damage, and chunks smaller than the
file; then what happens when the index cannot be written, or the file changed since.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from analyzer import record_index
from analyzer.capture import UNSELECTED, open_captures
from analyzer.errors import UnreadableCapture
from analyzer.partitions import CallerChunks, partition_ids, read_part
from analyzer.record_index import IndexMismatch
from detectors.scan_command import CALLER_PACKET_COLUMNS

import builders as b

ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "samples"
CAPTURES = ["smb2-break-queue.pcap", "nfs4-delegation-recall.pcap", "krb5-as-tgs-herd.pcapng",
            "dns-retry-storm.pcapng", "tcp-incast.pcap", "eval/dns-herd-dnsmasq-50.pcap"]
SILENCES = (None, 200_000_000)  # every time kept; a silence a partition's detector reads


def _two_sections_with_damage(path: Path) -> Path:
    """A pcapng of two sections (big-endian, then little-endian; two interfaces each, one of them in
    ns), packets between the IDBs, a custom block, a Simple Packet Block (no timestamp), an unknown
    interface, and a last block cut short."""
    def pkt(i: int, sport: int) -> bytes:
        return b.ethernet(b.ipv4(b.tcp(b"x" * (i % 7), sport=sport, dport=445, seq=i), src=f"10.0.0.{i % 5 + 1}",
                                 dst="10.0.9.9"))
    body = b.shb(">") + b.idb(1, o=">") + b.epb(0, 1000, pkt(1, 1001), o=">") + b.idb(1, tsresol=9, o=">")
    body += b.epb(1, 2_000_000, pkt(2, 1002), o=">") + b.epb(0, 3000, pkt(3, 1003), o=">") + b.custom_block(o=">")
    body += b.epb(7, 3000, pkt(4, 1004), o=">")  # no such interface: skipped, counted
    body += b.shb("<") + b.idb(1) + b.idb(101, tsresol=9) + b.epb(0, 5000, pkt(5, 1001)) + b.spb(pkt(6, 1002))
    body += b"".join(b.epb(1, 6_000_000 + 10 * i, pkt(7 + i, 1001 + i % 3)) for i in range(40))
    body += b.epb(0, 9000, pkt(50, 1003))[:-9]  # cut short
    path.write_bytes(body)
    return path


def _reading(path: Path, chunk_records: int, indexed: bool):
    chunks = CallerChunks(None, record_index=indexed)
    cap = open_captures([path], packet_columns=CALLER_PACKET_COLUMNS, reduce=chunks, chunk_records=chunk_records)
    return cap, chunks


def _part(cap, ids, k: int, silence_ns, indexed: bool):
    part = dataclasses.replace(read_part(cap, ids, k, silence_ns), **({} if indexed else {"record_index": None}))
    return open_captures([], part=part)


def _assert_same_part(one, other) -> None:
    for name in ("packets", "tcp_sack", "icmp_errors", "interfaces"):
        assert one.frame(name).equals(other.frame(name)), name
    assert one.whole_times.equals(other.whole_times)
    assert dataclasses.asdict(one.report) == dataclasses.asdict(other.report)
    assert one.packet_count == other.packet_count and one.pieces == other.pieces


@pytest.mark.parametrize("name", [*CAPTURES, "two-sections"])
@pytest.mark.parametrize("chunk_records", [13, 1 << 20])
def test_a_part_read_from_the_index_is_the_part_a_walk_reads(name, chunk_records, tmp_path):
    path = _two_sections_with_damage(tmp_path / "two.pcapng") if name == "two-sections" else SAMPLES / name
    cap, chunks = _reading(path, chunk_records, indexed=True)
    with cap:
        index = chunks.record_index
        assert index is not None and index.records == sum(n for _, _, n in cap.pieces)
        ids = partition_ids(cap, 3)
        for k in range(3):
            for silence_ns in SILENCES:
                with _part(cap, ids, k, silence_ns, True) as fast, _part(cap, ids, k, silence_ns, False) as walked:
                    _assert_same_part(fast, walked)
        assert os.path.isdir(index.directory)
    assert not os.path.exists(index.directory)  # closing the capture deletes it


def test_the_parts_of_one_reading_work_out_the_thinned_times_once(monkeypatch):
    """Thinned to a silence, the whole file's times are the same for every part of a reading: the index
    works them out for the first part that asks and hands the next the same answer (at 100M packets,
    each part read 800 MB of ts_ns for them); asked for other records, or every time (not thinned, 12
    bytes a record), it works them out again. The parts' times are a walk's (the test above)."""
    cap, chunks = _reading(SAMPLES / "tcp-incast.pcap", 1 << 20, indexed=True)
    with cap:
        index, ids = chunks.record_index, partition_ids(cap, 3)
        timed, thinnings = ids != UNSELECTED, []
        thinned_times = record_index.thinned_times
        monkeypatch.setattr(record_index, "thinned_times", lambda *a: thinnings.append(1) or thinned_times(*a))
        first = index.times(timed, 200_000_000)
        worked = len(thinnings)
        assert worked and index.times(timed.copy(), 200_000_000).equals(first) and len(thinnings) == worked
        fewer = timed.copy()
        fewer[fewer.nonzero()[0][-1]] = False
        assert index.times(fewer, 200_000_000).height and len(thinnings) == 2 * worked
        index.times(timed, None)
        index.times(timed, None)
        assert len(thinnings) == 4 * worked


def test_the_damaged_file_is_read_as_the_walk_read_it(tmp_path):
    path = _two_sections_with_damage(tmp_path / "two.pcapng")
    cap, chunks = _reading(path, 1 << 20, indexed=True)
    with cap:
        report = chunks.record_index.report
        assert report.stop_offset is not None and report.counts.get("unknown_interface") == 1
        ids = partition_ids(cap, 2)
        with _part(cap, ids, 0, None, True) as part:
            assert part.report.counts == report.counts and part.report.stop == report.stop
            assert part.packets.height == int((ids == 0).sum())


def test_the_evidence_read_back_uses_the_index(monkeypatch):
    """The linker's read of a few frames' addresses (``packets_reader``) reads their rows, not the file,
    nor the index's times (it reads no time)."""
    from analyzer.partitions import packets_reader

    path = SAMPLES / "smb2-break-queue.pcap"
    with open_captures([path], packet_columns=CALLER_PACKET_COLUMNS) as whole:
        expected = whole.packets.select("frame", "src", "dst").filter(
            whole.packets["frame"].is_in([3, 50, 51, 400])).cast({"src": str, "dst": str})
    cap, chunks = _reading(path, 1 << 20, indexed=True)
    with cap:
        read = packets_reader(cap, ("frame", "src", "dst"))
        partition_ids(cap, 2)

        def no_walk(*args, **kwargs):
            raise AssertionError("walked the file")
        monkeypatch.setattr("analyzer.ingest.read_pcap", no_walk)
        monkeypatch.setattr(record_index.RecordIndex, "times", lambda *a, **k: (_ for _ in ()).throw(AssertionError("times")))
        got = read([400, 3, 51, 50]).cast({"src": str, "dst": str})
    assert got.equals(expected)


def test_a_partition_of_an_indexed_reading_does_not_walk_the_file(monkeypatch):
    cap, chunks = _reading(SAMPLES / "smb2-break-queue.pcap", 1 << 20, indexed=True)
    with cap:
        ids = partition_ids(cap, 2)

        def no_walk(*args, **kwargs):
            raise AssertionError("walked the file")
        monkeypatch.setattr("analyzer.ingest.read_pcap", no_walk)
        with _part(cap, ids, 1, None, True) as part:
            assert part.packets.height == int((ids == 1).sum())


def test_without_room_for_the_index_the_partitions_walk(monkeypatch, tmp_path):
    real, calls = record_index.RecordIndexWriter._write, []

    def second_chunk_fills_the_disk(self, name, values):
        calls.append(name)
        if len(calls) > len(record_index.rk.RecordColumns._fields):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, name, values)
    monkeypatch.setattr(record_index.RecordIndexWriter, "_write", second_chunk_fills_the_disk)
    chunks = CallerChunks(None, record_index=True, index_dir=str(tmp_path))
    path = SAMPLES / "smb2-break-queue.pcap"
    with open_captures([path], packet_columns=CALLER_PACKET_COLUMNS, reduce=chunks, chunk_records=97) as cap:
        assert chunks.record_index is None and "no room for the record index" in chunks.index_warning
        assert os.listdir(tmp_path) == []  # what was written is gone
        ids = partition_ids(cap, 2)
        with _part(cap, ids, 0, None, True) as part, _part(cap, ids, 0, None, False) as walked:
            _assert_same_part(part, walked)


def test_a_file_changed_since_the_index_was_written_is_said(tmp_path):
    path = tmp_path / "copy.pcap"
    shutil.copy(SAMPLES / "smb2-break-queue.pcap", path)
    cap, chunks = _reading(path, 1 << 20, indexed=True)
    with cap:
        ids = partition_ids(cap, 2)
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) // 2)
        with pytest.raises(IndexMismatch, match="changed since it was read") as raised:
            _part(cap, ids, 0, None, True)
    assert isinstance(raised.value, UnreadableCapture)  # said in one line, exit 3 (analyzer.cli)


def test_a_reading_that_fails_leaves_no_index(tmp_path):
    path = tmp_path / "not-a-capture.pcap"
    path.write_bytes(b"hello" * 100)
    chunks = CallerChunks(None, record_index=True, index_dir=str(tmp_path / "idx"))
    os.mkdir(tmp_path / "idx")
    with pytest.raises(Exception):
        open_captures([path], packet_columns=CALLER_PACKET_COLUMNS, reduce=chunks)
    assert os.listdir(tmp_path / "idx") == []
