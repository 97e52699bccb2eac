"""A part's records copied together, in file order, into one temporary file that its passes then read.

A partition read from the record index (``read_tables(indexed=)``, ``analyzer.record_index``) decodes
its own records only, but they lie all over the file, and it reads their bytes more than once: the
headers' decoding, then each decoder framing its payloads (``analyzer.tcp.framing``, DNS, NFS, ...).
Each pass faults in pages spread over the whole file, and the kernel's read-ahead brings in the rest of
every window with them, so once the file no longer fits in the page cache every pass reads the whole
file from the disk again. At 100M synth packets (63.8 GB; issue 13) that was 120-180 s a partition, in
two passes of ~50 s (py-spy: the records' decoding and the HTTP framing). A shard of a cut server
took ~530 s, because its sparser pages defeat the read-ahead.

:func:`packed` copies the part's records in one forward pass over the mapping, so the read-ahead reads
the file once and in order. They go into a temporary file that holds nothing else, a fraction of the
capture whose pages the page cache keeps between the passes. It hands back that file's mapping and
each record's offset in it. The copy starts with the file's own first bytes (the file header, or a
pcapng section header), so what is read there reads the same. Offsets read from the copy
(``payload_offset``, ...) are the copy's and never leave the partition: what a partition hands over
is frames of frame numbers. The file is unlinked as soon as it is mapped.

A part is packed when its file is larger than :data:`PACK_FILE_FRACTION_OF_MEMORY` of the machine's
memory. A smaller file is read from the page cache by every pass anyway, so the 1M and 10M captures are
not packed. The copy is written, mapped and unlinked as ``analyzer.mapped_frames`` does a frame's (its
directory on a disk, not ``tmpfs``; nothing under ``MAPPED_MIN_BYTES``); without room for it, the
part reads the file as before. A record of the index that lies beyond the file raises ``IndexMismatch``,
as the unpacked reading does.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from .jit import njit
from .mapped_frames import through_file
from .record_index import IndexMismatch, RecordIndex
from .source import CaptureBytes, map_file

# a part is packed when its file is larger than this fraction of the machine's physical memory (module doc)
PACK_FILE_FRACTION_OF_MEMORY = 0.5
# None: the threshold above; a number of bytes: pack a part of any file larger than that (tests: 0)
PACK_MIN_FILE_BYTES: int | None = None
# bytes copied into memory at a time before they are written to the copy
PACK_CHUNK_BYTES = 32 << 20
# the file's first bytes copied ahead of the records (a pcap file header is 24, a pcapng section header
# block usually under 1 KB; a longer one is cut: only its options are read from there, and checked)
HEAD_BYTES = 4096


def pack_threshold_bytes() -> int:
    """The file size above which a part is packed (:data:`PACK_MIN_FILE_BYTES`, or the fraction of
    physical memory)."""
    if PACK_MIN_FILE_BYTES is not None:
        return PACK_MIN_FILE_BYTES
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return np.iinfo(np.int64).max  # unknown memory: never packed
    return int(memory * PACK_FILE_FRACTION_OF_MEMORY)


@njit(cache=True)
def copy_records(buf, data_off, caplen, lo, out):
    """Copy records ``lo``.. (``buf[data_off[i]:data_off[i] + caplen[i]]``) into ``out`` one after the
    other while they fit; returns (records copied, bytes used), or (-1 - i, 0) when record ``i`` lies
    outside ``buf``."""
    size = buf.shape[0]
    used = 0
    i = lo
    while i < data_off.shape[0]:
        start = data_off[i]
        n = np.int64(caplen[i])
        if start < 0 or start + n > size:
            return -1 - i, 0
        if used + n > out.shape[0]:
            break
        out[used:used + n] = buf[start:start + n]
        used += n
        i += 1
    return i - lo, used


def packed(data: CaptureBytes, index: RecordIndex, frames: np.ndarray) -> tuple[CaptureBytes, np.ndarray] | None:
    """The records ``frames`` (ascending, 1-based) of ``data``, found in ``index``, copied to a temporary
    file (module doc): the copy's bytes, in a CaptureBytes of the same path and file size, and each
    record's offset in it. None when the file is under the threshold, or the copy would be smaller than
    ``mapped_frames.MAPPED_MIN_BYTES``, or cannot be written or mapped; ``data`` is left open either way."""
    if len(data.buf) <= pack_threshold_bytes() or frames.shape[0] == 0:
        return None
    data_off, caplen = index.where(frames)
    head = min(len(data.buf), HEAD_BYTES)
    lengths = caplen.astype(np.int64)
    offsets = np.empty(data_off.shape[0], np.int64)
    offsets[0] = head
    np.cumsum(lengths[:-1], out=offsets[1:])
    offsets[1:] += head

    def write(path: str) -> None:
        with open(path, "wb") as copy:
            copy.write(data.buf[:head].tobytes())
            chunk = np.empty(max(PACK_CHUNK_BYTES, int(lengths.max())), np.uint8)
            done = 0
            while done < data_off.shape[0]:
                n, used = copy_records(data.buf, data_off, caplen, done, chunk)
                if n < 0:
                    raise IndexMismatch.beyond(data.path, len(data.buf))
                copy.write(memoryview(chunk[:used]))
                done += n

    def read(path: str):
        with open(path, "rb") as copy:  # the mapping outlives the file object and the file's name
            return map_file(copy, populate=False)

    mapping = through_file(head + int(lengths.sum()), None, ".part", write, read)
    if mapping is None:
        return None
    return dataclasses.replace(data, buf=mapping[1], _mmap=mapping[0], _file=None, mapped=False), offsets
