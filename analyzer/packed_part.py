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

Parts read one after the other in one process (``scan --partitions``, the default scan of a large
file) are packed several in one pass: the forward pass that copies a part's records also copies those
of the parts read next (``following``), as many as fit in :data:`PACK_AHEAD_DISK_FRACTION` of the free
space of the copies' directory (at most :data:`PACK_AHEAD_MAX_PARTS`). Each goes to a file of its own,
mapped and unlinked at once and held here until its part asks for it (:func:`forget_ahead` lets go of
those never asked for). A pass of the whole file then serves several parts: on the 100M synth capture,
where a pass is a minute of reading from the disk, 31 parts took 14 passes instead of 31 (2 large
ones a pass with ~13 GB free beside the capture, up to 8 small ones).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Callable, Hashable, Iterator

import numpy as np

from . import mapped_frames
from .jit import njit
from .record_index import IndexMismatch, RecordIndex, records_digest
from .source import CaptureBytes, map_file

# a part is packed when its file is larger than this fraction of the machine's physical memory (module doc)
PACK_FILE_FRACTION_OF_MEMORY = 0.5
# None: the threshold above; a number of bytes: pack a part of any file larger than that (tests: 0)
PACK_MIN_FILE_BYTES: int | None = None
# bytes copied into memory at a time, per part, before they are written to its copy
PACK_CHUNK_BYTES = 16 << 20
# of the free space of the copies' directory, what one pass's copies may take (the part's own included)
PACK_AHEAD_DISK_FRACTION = 0.5
# at most this many parts' copies made in one pass (each part's record offsets are in memory meanwhile,
# 12 bytes a record, and a chunk of PACK_CHUNK_BYTES)
PACK_AHEAD_MAX_PARTS = 8
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
def copy_records(buf, data_off, caplen, bounds, cursor, out, used):
    """Copy the records of several parts into their chunks, in file order: part ``j``'s records are rows
    ``bounds[j]`` to ``bounds[j + 1]`` of ``data_off`` / ``caplen`` (record ``i`` is
    ``buf[data_off[i]:data_off[i] + caplen[i]]``, each part's ascending), ``cursor[j]`` its next row,
    ``out[j]`` its chunk and ``used[j]`` the bytes in it. The record lowest in the file among the parts'
    next ones is copied, while it fits in its part's chunk. Returns 0 when every record is copied, 1 when
    a chunk is full (write the chunks out, set ``used`` to 0, call again), -1 - i when record ``i`` lies
    outside ``buf``."""
    size = buf.shape[0]
    room = out.shape[1]
    while True:
        best = -1
        start = np.int64(0)
        for j in range(cursor.shape[0]):
            if cursor[j] < bounds[j + 1] and (best < 0 or data_off[cursor[j]] < start):
                best, start = j, data_off[cursor[j]]
        if best < 0:
            return 0
        i = cursor[best]
        n = np.int64(caplen[i])
        if start < 0 or start + n > size:
            return -1 - i
        if used[best] + n > room:
            return 1
        out[best, used[best]:used[best] + n] = buf[start:start + n]
        used[best] += n
        cursor[best] += 1


# copies made ahead (module doc): part key -> (file path and size, digest of its frames, the mapping)
_ahead: dict[Hashable, tuple[tuple[str, int], bytes, tuple]] = {}

Following = Callable[[], Iterator[tuple[Hashable, np.ndarray]]]


def packed(data: CaptureBytes, index: RecordIndex, frames: np.ndarray, key: Hashable | None = None,
           following: Following | None = None) -> tuple[CaptureBytes, np.ndarray] | None:
    """The records ``frames`` (ascending, 1-based) of ``data``, found in ``index``, copied to a temporary
    file (module doc): the copy's bytes, in a CaptureBytes of the same path and file size, and each
    record's offset in it. None when the file is under the threshold, or the copy would be smaller than
    ``mapped_frames.MAPPED_MIN_BYTES``, or cannot be written or mapped; ``data`` is left open either way.
    ``key`` names the part, and ``following()`` gives the keys and frames of the parts read next, in
    order, whose copies this pass also makes while the disk has room (module doc); a part whose copy
    was made ahead gets it."""
    if len(data.buf) <= pack_threshold_bytes() or frames.shape[0] == 0:
        return None
    head = min(len(data.buf), HEAD_BYTES)
    own = index.where(frames)  # (data_off, caplen) of each record
    made = _made_ahead(data, key, frames)
    if made is None:
        ahead = _parts_ahead(index, int(own[1].sum(dtype=np.int64)), following)
        copies = _copies(data, [own, *(where for _, _, where in ahead)], head)
        if copies is None and ahead:  # no room for them all after all: this part's alone
            ahead, copies = [], _copies(data, [own], head)
        if copies is None:
            return None
        made = copies[0]
        for (key_ahead, frames_ahead, _), mapping in zip(ahead, copies[1:]):
            digest = records_digest(np.asarray(frames_ahead, np.uint32))
            _ahead[key_ahead] = ((data.path, len(data.buf)), digest, mapping)
    offsets = np.empty(frames.shape[0], np.int64)
    offsets[0] = head
    np.cumsum(own[1][:-1], out=offsets[1:])
    offsets[1:] += head
    return dataclasses.replace(data, buf=made[1], _mmap=made[0], _file=None, mapped=False), offsets


def forget_ahead() -> None:
    """Let go of the copies made ahead that no part asked for (their disk space goes with them)."""
    _ahead.clear()


def _made_ahead(data: CaptureBytes, key: Hashable | None, frames: np.ndarray):
    """The mapping of this part's copy if a pass made it ahead (the same file and frames), else None."""
    entry = _ahead.pop(key, None) if key is not None else None
    if entry is None or entry[0] != (data.path, len(data.buf)):
        return None
    if entry[1] != records_digest(np.asarray(frames, np.uint32)):
        return None
    return entry[2]


def _parts_ahead(index: RecordIndex, own_bytes: int, following: Following | None) -> list[tuple]:
    """The (key, frames, where: data_off and caplen) of the parts read next whose copies fit beside this
    part's records (``own_bytes``): in order, while their sizes add up to :data:`PACK_AHEAD_DISK_FRACTION`
    of the directory's free space."""
    directory = mapped_frames.frame_directory()
    if following is None or directory is None or PACK_AHEAD_MAX_PARTS < 2:
        return []
    try:
        room = shutil.disk_usage(directory).free * PACK_AHEAD_DISK_FRACTION
    except OSError:
        return []
    room -= HEAD_BYTES + own_bytes
    out = []
    for key, frames_next in following():
        if key in _ahead or frames_next.shape[0] == 0:
            continue
        where = index.where(frames_next)
        size = HEAD_BYTES + int(where[1].sum(dtype=np.int64))
        if size < mapped_frames.MAPPED_MIN_BYTES:  # not worth a file: that part reads the file itself
            continue
        if size > room or len(out) + 1 >= PACK_AHEAD_MAX_PARTS:
            break
        room -= size
        out.append((key, frames_next, where))
    return out


def _copies(data: CaptureBytes, where: list[tuple[np.ndarray, np.ndarray]], head: int) -> list | None:
    """The mappings of the copies of parts whose records are ``where`` (each part's data_off and caplen),
    made in one forward pass over ``data``: the file's first ``head`` bytes, then the part's records in
    file order."""
    parts = len(where)
    bounds = np.zeros(parts + 1, np.int64)
    np.cumsum([w[0].shape[0] for w in where], out=bounds[1:])
    data_off = np.concatenate([w[0] for w in where]).astype(np.int64, copy=False)
    caplen = np.concatenate([w[1] for w in where])
    sizes = [head + int(w[1].sum(dtype=np.int64)) for w in where]

    def write(paths: list[str]) -> None:
        outs = [open(path, "wb") for path in paths]
        try:
            for out in outs:
                out.write(data.buf[:head].tobytes())
            chunks = np.empty((parts, max(PACK_CHUNK_BYTES, int(caplen.max()))), np.uint8)
            cursor, used = bounds[:-1].copy(), np.zeros(parts, np.int64)
            while True:
                status = copy_records(data.buf, data_off, caplen, bounds, cursor, chunks, used)
                if status < 0:
                    raise IndexMismatch.beyond(data.path, len(data.buf))
                for out, chunk, n in zip(outs, chunks, used):
                    out.write(memoryview(chunk[:n]))
                used[:] = 0
                if status == 0:
                    return
        finally:
            for out in outs:
                out.close()

    def read(path: str):
        with open(path, "rb") as copy:  # the mapping outlives the file object and the file's name
            return map_file(copy, populate=False)

    return mapped_frames.through_files(sizes, None, ".part", write, read)
