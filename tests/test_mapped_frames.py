"""A frame handed back by ``analyzer.mapped_frames.mapped`` is the same frame (every column type the
decoders make), backed by a mapped file that is gone from the directory at once and from the
process's mappings when the frame goes; small frames and frames that cannot be written stay as
they were."""
from __future__ import annotations

import gc
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analyzer import mapped_frames
from analyzer.mapped_frames import mapped


def _mappings_of_frames() -> list[str]:
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "herdscope-frame-" in line]


def _wide_frame(rows: int) -> pl.DataFrame:
    kinds = pl.Enum(["udp", "tcp"])
    return pl.DataFrame({
        "frame": pl.Series(range(rows), dtype=pl.UInt32),
        "ts_ns": pl.Series([1_700_000_000_000_000_000 + 37 * i for i in range(rows)], dtype=pl.Int64),
        "transport": pl.Series(["udp" if i % 3 else "tcp" for i in range(rows)], dtype=kinds),
        "name": [None if i % 11 == 0 else f"host-{i % 977}.example.internal" for i in range(rows)],
        "short": [f"q{i % 7}" for i in range(rows)],
        "ok": [i % 5 != 0 for i in range(rows)],
        "latency_ns": [None if i % 13 == 0 else i * 10 for i in range(rows)],
        "etypes": [[18, 17] if i % 2 else [] for i in range(rows)],
        "pair": [{"a": i, "b": f"x{i % 3}"} for i in range(rows)],
    })


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux's /proc")
def test_a_big_frame_comes_back_equal_and_mapped(tmp_path):
    frame = pl.concat([_wide_frame(40_000)] * 4, rechunk=False)  # several chunks, as a merge leaves them
    assert frame.estimated_size() >= mapped_frames.MAPPED_MIN_BYTES
    before = len(_mappings_of_frames())
    out = mapped(frame, str(tmp_path))
    assert out is not frame and out.equals(frame) and out.schema == frame.schema
    assert list(tmp_path.iterdir()) == []  # unlinked at once
    assert len(_mappings_of_frames()) > before  # its pages are the file's
    # what is computed from it is the same as from the frame in memory
    assert out.group_by("transport").agg(pl.col("latency_ns").sum(), pl.col("name").n_unique()).sort(
        "transport").equals(frame.group_by("transport").agg(pl.col("latency_ns").sum(),
                                                           pl.col("name").n_unique()).sort("transport"))
    del out
    gc.collect()
    assert len(_mappings_of_frames()) == before  # unmapped with the frame


def test_a_small_frame_stays_in_memory(tmp_path):
    frame = _wide_frame(10)
    assert mapped(frame, str(tmp_path)) is frame
    assert list(tmp_path.iterdir()) == []


def _memory_mount() -> str | None:
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                point, kind = line.split()[1:3]
                if kind == "tmpfs" and os.access(point, os.W_OK):
                    return point
    except OSError:
        pass
    return None


@pytest.mark.skipif(_memory_mount() is None, reason="no writable tmpfs mount")
def test_a_directory_in_memory_is_not_used(tmp_path):
    memory = _memory_mount()
    assert not mapped_frames.on_disk(memory) and mapped_frames.on_disk(str(tmp_path)) == (
        mapped_frames.on_disk(tempfile.gettempdir()))
    frame = _wide_frame(40_000)
    assert mapped(frame, memory) is frame  # the file would be memory too


def test_a_frame_that_cannot_be_written_stays_in_memory(tmp_path):
    frame = _wide_frame(40_000)
    missing = tmp_path / "no such directory"
    assert mapped(frame, str(missing)) is frame


def test_an_array_comes_back_equal_read_only_and_mapped(tmp_path):
    ids = (np.arange(3_000_000, dtype=np.uint32) % 17).astype(np.uint16)
    out = mapped_frames.mapped_array(ids, str(tmp_path))
    assert isinstance(out, np.memmap) and np.array_equal(out, ids) and out.dtype == ids.dtype
    assert not out.flags.writeable and list(tmp_path.iterdir()) == []
    small = ids[:10]
    assert mapped_frames.mapped_array(small, str(tmp_path)) is small
    assert mapped_frames.mapped_array(ids, str(tmp_path / "missing")) is ids


@pytest.mark.parametrize("name", ["smb2-break-queue.pcap", "krb5-as-tgs-herd.pcapng", "dns-retry-storm.pcapng"])
def test_a_scan_in_partitions_with_every_frame_mapped_reports_the_single_process_scan(monkeypatch, capsys, name):
    """Every frame a cut server's task merges and the caller's merged frames mapped, however small: the
    report is the scan's at once (tests/test_partitions.py cuts these samples' servers into shards)."""
    from analyzer import distributed, shards
    from analyzer.cli import main as cli_main
    from detectors import scan_command

    samples = Path(__file__).resolve().parents[1] / "samples"
    assert cli_main(["scan", "--format", "json", str(samples / name)]) in (0, 1)
    single = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(mapped_frames, "MAPPED_MIN_BYTES", 0)
    was_mapped = []

    def watched(frame, directory=None):
        out = mapped(frame, directory)
        was_mapped.append(out is not frame)
        return out

    for module in (shards, distributed, scan_command):
        monkeypatch.setattr(module, "mapped", watched)
    assert cli_main(["scan", "--format", "json", "--partitions", "3", str(samples / name)]) in (0, 1)
    assert json.loads(capsys.readouterr().out) == single and single["findings"]
    assert sum(was_mapped) >= 5  # the task's merged frames, the caller's (empty frames come back as they were)
