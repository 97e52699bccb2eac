"""Several capture files mapped side by side into one buffer (analyzer/joined_map.py), as
``open_captures`` joins the pieces of a ring buffer without copying them."""
from __future__ import annotations

import gc
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analyzer.capture import open_captures
from analyzer.joined_map import PAGE_BYTES, aligned, join
from analyzer.source import CaptureBytes, open_bytes

SAMPLES = Path(__file__).parent.parent / "samples"


def _files(tmp_path, sizes):
    rng = np.random.default_rng(7)
    paths = []
    for k, n in enumerate(sizes):
        p = tmp_path / f"f{k}.bin"
        p.write_bytes(rng.integers(1, 256, n, dtype=np.uint8).tobytes())  # no zero byte: the padding shows
        paths.append(p)
    return paths


def test_files_sit_at_page_boundaries_with_their_own_bytes(tmp_path):
    sizes = [1, PAGE_BYTES, PAGE_BYTES + 1, 0, 3 * PAGE_BYTES - 7]
    paths = _files(tmp_path, sizes)
    pieces = [open_bytes(p) for p in paths]
    buf, bases = join(pieces)
    assert bases == list(np.cumsum([0] + [aligned(n) for n in sizes[:-1]]))
    assert buf.size == sum(aligned(n) for n in sizes) and not buf.flags.writeable
    for p, base, n in zip(paths, bases, sizes):
        assert bytes(buf[base:base + n]) == p.read_bytes()
        assert not buf[base + n:base + aligned(n)].any()  # the rest of the last page: zeros, no file's
    with pytest.raises(ValueError):
        buf[0] = 1
    for piece in pieces:
        piece.close()


def test_a_view_outlives_the_capture(tmp_path):
    paths = _files(tmp_path, [5000, 9000])
    cap = open_captures([SAMPLES / "dns-ttl-herd.pcap", SAMPLES / "tcp-incast.pcap"])
    view = cap.buf[100:200].copy(), cap.buf[100:200]
    cap.close()
    del cap
    gc.collect()
    assert bytes(view[1]) == bytes(view[0])  # still mapped: unmapped with the last view
    assert paths


def test_a_piece_without_a_file_is_not_joined():
    class Bytes:  # a buffer in memory, as a test's or a future reader's
        buf = np.ones(10, np.uint8)
        compressed = False

        def fileno(self):
            return None
    assert join([Bytes()]) is None


@pytest.mark.skipif(shutil.which("editcap") is None, reason="editcap (wireshark-common)")
def test_joined_pieces_read_as_the_whole_file(tmp_path):
    whole = SAMPLES / "smb2-break-queue.pcap"
    subprocess.run(["editcap", "-c", "40", str(whole), str(tmp_path / "p.pcap")], check=True, capture_output=True)
    pieces = sorted(tmp_path.glob("p_*.pcap"))
    assert len(pieces) > 2
    with open_captures(pieces) as joined, open_captures([whole]) as one:
        assert joined.buf.base is not None and joined.buf.size >= sum(p.stat().st_size for p in pieces)
        cols = ["frame", "ts_ns", "caplen", "payload_len", "payload_caplen"]
        assert joined.packets.select(cols).equals(one.packets.select(cols))
        # every payload's bytes, where its offset says, as in the unsplit file
        for (ja, n), (oa, m) in zip(joined.packets.select("payload_offset", "payload_caplen").iter_rows(),
                                    one.packets.select("payload_offset", "payload_caplen").iter_rows()):
            if n:
                assert n == m and bytes(joined.buf[ja:ja + n]) == bytes(one.buf[oa:oa + m])
        text = [pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String)]  # the joined capture's address
        # Enum is the pieces' sorted union, the file's is in order of appearance: the same addresses
        assert joined.frame("smb2_messages").with_columns(text).equals(one.frame("smb2_messages").with_columns(text))


def _resident_kb(start: int, size: int) -> int:
    """This process's resident KB of the mapping that holds ``start`` (/proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    rss, inside = 0, False
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < start + size and start < hi
        elif inside and head == "Rss:":
            rss += int(line.split()[1])
    return rss


def test_forgotten_pages_come_back_with_the_same_bytes_and_a_copy_is_never_touched(tmp_path):
    """A partitioned scan's caller gives back its resident pages of the files (forget_pages): the
    bytes read afterwards are the file's, one file mapped or several joined; bytes held in memory
    instead (a copy: stdin, a piece that could not be mapped) stay as they were."""
    paths = _files(tmp_path, [3 * PAGE_BYTES + 5, 40 * PAGE_BYTES])
    whole = b"".join(p.read_bytes() for p in paths)
    one = open_bytes(paths[1])
    assert _resident_kb(one.buf.ctypes.data, one.buf.size) >= 40 * PAGE_BYTES // 1024  # MAP_POPULATE
    one.forget_pages()
    assert _resident_kb(one.buf.ctypes.data, one.buf.size) == 0
    assert one.buf.tobytes() == paths[1].read_bytes()
    one.close()
    pieces = [open_bytes(p) for p in paths]
    buf, bases = join(pieces)
    joined = CaptureBytes("joined", buf, False, len(whole), mapped=True)
    joined.forget_pages()
    assert b"".join(buf[b:b + p.stat().st_size].tobytes() for b, p in zip(bases, paths)) == whole
    copy = CaptureBytes("copy", np.frombuffer(bytearray(whole), np.uint8), False, len(whole))
    copy.forget_pages()
    assert copy.buf.tobytes() == whole
    for p in pieces:
        p.close()
