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

    def watched(data, index, frames):
        out = packed(data, index, frames)
        copies.append(out is not None)
        return out

    monkeypatch.setattr(ingest, "packed", watched)
    assert cli_main(["scan", "--format", "json", "--partitions", "3", str(SAMPLES / name)]) in (0, 1)
    assert json.loads(capsys.readouterr().out) == single and single["findings"]
    assert len(copies) >= 3 and all(copies)
