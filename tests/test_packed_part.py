"""A part's records packed into a temporary file (``analyzer.packed_part``) read the same as from the
capture: the copy holds each record's bytes at its new offset and the file's first bytes ahead of
them; a scan in partitions with every part packed reports the scan at once; a record beyond the file
says the file changed; small files, and no directory on a disk, leave the part reading the file."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analyzer import ingest, mapped_frames, packed_part
from analyzer.packed_part import packed
from analyzer.record_index import IndexMismatch, RecordIndexWriter
from analyzer.source import open_bytes

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def _index_of(path: Path):
    """The record index of ``path``'s whole reading (as the chunked caller writes it)."""
    writer = RecordIndexWriter()

    class Reduction(ingest.ChunkReduction):
        def chunk(self, packets):
            return packets.head(0)

        def records(self, recs, n):
            writer.append(recs, n)

        def records_done(self, iface_linktypes, file_linktype, report):
            self.index = writer.finish(iface_linktypes, file_linktype, report)

    reduction = Reduction()
    data, tables = ingest.read_tables(str(path), reduce=reduction)
    data.close()
    return reduction.index, tables


@pytest.mark.parametrize("name", ["dns-ttl-herd.pcap", "krb5-as-tgs-herd.pcapng"])
def test_the_copy_holds_each_record_at_its_new_offset(monkeypatch, name):
    monkeypatch.setattr(packed_part, "PACK_MIN_FILE_BYTES", 0)
    monkeypatch.setattr(mapped_frames, "MAPPED_MIN_BYTES", 0)  # the samples' copies are small
    index, _ = _index_of(SAMPLES / name)
    try:
        frames = np.arange(1, index.records + 1, 3, dtype=np.uint32)  # every third record
        data = open_bytes(SAMPLES / name, populate=False)
        copy, offsets = packed(data, index, frames)
        data_off, caplen = index.where(frames)
        assert offsets[0] == min(len(data.buf), packed_part.HEAD_BYTES)
        assert bytes(copy.buf[:offsets[0]]) == bytes(data.buf[:offsets[0]])  # the file's header
        for old, new, n in zip(data_off, offsets, caplen):
            assert bytes(copy.buf[new:new + n]) == bytes(data.buf[old:old + n])
        assert len(copy.buf) == offsets[-1] + caplen[-1] < len(data.buf)
        assert copy.path == data.path
        copy.close()
        data.close()
    finally:
        index.remove()


def test_a_record_beyond_the_file_says_the_file_changed(monkeypatch):
    monkeypatch.setattr(packed_part, "PACK_MIN_FILE_BYTES", 0)
    monkeypatch.setattr(mapped_frames, "MAPPED_MIN_BYTES", 0)  # the samples' copies are small
    index, _ = _index_of(SAMPLES / "dns-ttl-herd.pcap")
    try:
        data = open_bytes(SAMPLES / "dns-ttl-herd.pcap", populate=False)
        cut = open_bytes(SAMPLES / "dns-ttl-herd.pcap", populate=False)
        cut.buf = data.buf[:len(data.buf) // 2]  # the file as if cut short since it was read
        with pytest.raises(IndexMismatch, match="changed since it was read"):
            packed(cut, index, np.arange(1, index.records + 1, dtype=np.uint32))
        data.close()
    finally:
        index.remove()


def test_a_small_file_or_no_disk_leaves_the_part_reading_the_file(monkeypatch):
    index, _ = _index_of(SAMPLES / "dns-ttl-herd.pcap")
    try:
        data = open_bytes(SAMPLES / "dns-ttl-herd.pcap", populate=False)
        frames = np.arange(1, index.records + 1, dtype=np.uint32)
        assert packed(data, index, frames) is None  # far under half the machine's memory
        monkeypatch.setattr(packed_part, "PACK_MIN_FILE_BYTES", 0)
        monkeypatch.setattr(mapped_frames, "MAPPED_MIN_BYTES", 0)  # the samples' copies are small
        monkeypatch.setattr(mapped_frames, "frame_directory", lambda: None)
        assert packed(data, index, frames) is None
        data.close()
    finally:
        index.remove()


def test_the_threshold_is_a_fraction_of_memory():
    assert packed_part.PACK_MIN_FILE_BYTES is None
    import os
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert packed_part.pack_threshold_bytes() == int(memory * packed_part.PACK_FILE_FRACTION_OF_MEMORY)


@pytest.mark.parametrize("name", ["smb2-break-queue.pcap", "krb5-as-tgs-herd.pcapng", "dns-retry-storm.pcapng"])
def test_a_scan_in_partitions_with_every_part_packed_reports_the_single_process_scan(monkeypatch, capsys, name):
    """Every partition and shard reads its records from a packed copy: the report is the scan's at
    once, and the partitions did read copies."""
    from analyzer.cli import main as cli_main

    assert cli_main(["scan", "--format", "json", str(SAMPLES / name)]) in (0, 1)
    single = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(packed_part, "PACK_MIN_FILE_BYTES", 0)
    monkeypatch.setattr(mapped_frames, "MAPPED_MIN_BYTES", 0)  # the samples' copies are small
    copies = []

    def watched(data, index, frames, *ahead):
        out = packed(data, index, frames, *ahead)
        copies.append(out is not None)
        return out

    monkeypatch.setattr(ingest, "packed", watched)
    assert cli_main(["scan", "--format", "json", "--partitions", "3", str(SAMPLES / name)]) in (0, 1)
    assert json.loads(capsys.readouterr().out) == single and single["findings"]
    assert len(copies) >= 3 and all(copies)


@pytest.mark.parametrize("name", ["smb2-break-queue.pcap", "dns-retry-storm.pcapng"])
def test_parts_read_in_turn_are_copied_several_in_one_pass(monkeypatch, capsys, name):
    """The parts of a scan in partitions in this process are copied several in one pass over the file
    (each to a file of its own, handed to its part when it runs): fewer passes than parts, every part
    reads a copy, the report is the scan's at once, and nothing is left held at the end."""
    from analyzer.cli import main as cli_main

    assert cli_main(["scan", "--format", "json", str(SAMPLES / name)]) in (0, 1)
    single = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(packed_part, "PACK_MIN_FILE_BYTES", 0)
    monkeypatch.setattr(mapped_frames, "MAPPED_MIN_BYTES", 0)  # the samples' copies are small
    monkeypatch.setattr(packed_part, "PACK_AHEAD_MAX_PARTS", 3)
    passes, copies = [], []
    through_files = mapped_frames.through_files

    def counted(sizes, directory, suffix, *args):
        if suffix == ".part":  # not the frames mapped_frames maps
            passes.append(len(sizes))
        return through_files(sizes, directory, suffix, *args)

    def watched(data, index, frames, *ahead):
        out = packed(data, index, frames, *ahead)
        if frames.shape[0]:  # a partition may have no packets
            copies.append(out is not None)
        return out

    monkeypatch.setattr(mapped_frames, "through_files", counted)
    monkeypatch.setattr(ingest, "packed", watched)
    assert cli_main(["scan", "--format", "json", "--partitions", "5", str(SAMPLES / name)]) in (0, 1)
    assert json.loads(capsys.readouterr().out) == single and single["findings"]
    assert len(copies) >= 5 and all(copies)
    assert sum(passes) == len(copies) > len(passes) and max(passes) == 3  # at most PACK_AHEAD_MAX_PARTS a pass
    packed_part.forget_ahead()  # (the scan let go of them already; nothing to find)


def test_a_copy_made_ahead_goes_to_its_own_part_only(monkeypatch):
    """A part whose copy a pass made ahead gets that copy; the same key with other frames (another
    reading) gets a copy of its own; without room on the disk nothing is copied ahead."""
    monkeypatch.setattr(packed_part, "PACK_MIN_FILE_BYTES", 0)
    monkeypatch.setattr(mapped_frames, "MAPPED_MIN_BYTES", 0)
    index, _ = _index_of(SAMPLES / "dns-ttl-herd.pcap")
    try:
        data = open_bytes(SAMPLES / "dns-ttl-herd.pcap", populate=False)
        thirds = [np.arange(1 + k, index.records + 1, 3, dtype=np.uint32) for k in range(3)]
        passes = []
        through_files = mapped_frames.through_files
        monkeypatch.setattr(mapped_frames, "through_files", lambda sizes, *a: passes.append(len(sizes))
                            or through_files(sizes, *a))
        first, _ = packed(data, index, thirds[0], "p0", lambda: iter([("p1", thirds[1]), ("p2", thirds[2])]))
        assert passes == [3]
        second, offsets = packed(data, index, thirds[1], "p1")
        assert passes == [3]  # made ahead
        data_off, caplen = index.where(thirds[1])
        for old, new, n in zip(data_off, offsets, caplen):
            assert bytes(second.buf[new:new + n]) == bytes(data.buf[old:old + n])
        other, _ = packed(data, index, thirds[1][::2], "p2")  # p2's key, not p2's frames
        assert passes == [3, 1] and len(other.buf) < len(second.buf)
        monkeypatch.setattr(packed_part.shutil, "disk_usage", lambda path: type("U", (), {"free": 0})())
        packed(data, index, thirds[0], "q0", lambda: iter([("q1", thirds[1])]))
        assert passes == [3, 1, 1]
        for copy in (first, second, other):
            copy.close()
        data.close()
    finally:
        packed_part.forget_ahead()
        index.remove()
