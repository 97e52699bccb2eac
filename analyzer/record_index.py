"""The record index: what the walk of a capture file found of each record, kept on disk for its partitions.

A partition of a scan, ``info`` or ``stats`` (``analyzer.partitions``) holds the packets of some servers
alone, but its frame numbers, silences and spans are the whole file's; without an index it gets them
by walking every record of the file again, each partition (a walk follows each record's length to the
next, so it reads every page of the file). At 10M packets that is ~0.7 s a partition; at 100M, where
the file no longer fits the page cache, each walk is a read of the whole file from the disk (63 GB,
sixteen times: most of a 47-minute scan, issue 13).

The caller's own reading walks the file once anyway. As it does, :class:`RecordIndexWriter` writes
the walker's row of every record (``analyzer.kernels.records.RecordColumns``: where its captured
bytes are, their length and the wire length, its time, interface and kind; 27 bytes a record) to a
temporary directory, one file per column. A partition then reads its own records' rows from there
(:meth:`RecordIndex.rows`) and decodes their headers from the file's pages, never walking it: only
its packets' pages are read (of a file larger than the page cache, its records are first copied
together into a file of their own, ``analyzer.packed_part``). The whole file's timed records (frame,
ts_ns), which its silences need, come from the index's ``ts_ns`` column read a slice at a time
(:meth:`RecordIndex.times`); thinned to a silence, they are the same for every partition, so the
partitions read in one process work them out once (at 100M packets, ~1 s a partition of reading 800 MB
of ``ts_ns``, 31 partitions).

The index describes the file as the caller read it: a partition checks that its rows lie within the
file it maps (a file cut short since says so, ``IndexMismatch``) but not that the bytes are the same.
Without room for it in the temporary directory there is no index (:meth:`RecordIndexWriter.append`
gives up, deletes what it wrote and says why), and the partitions walk the file as before.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import shutil
import tempfile

import numpy as np
import polars as pl

from .errors import UnreadableCapture
from .kernels import records as rk
from .kernels.headers import LINKTYPE_NOT_PACKET
from .kernels.silences import thinned_times

# the walker's columns, each a file of the index, in RecordColumns order
_COLUMNS = rk.RecordColumns._fields
# records of the ts_ns column read at a time to find the silences (12 bytes each while thinned)
TIMES_SLICE_RECORDS = 1 << 20


class IndexMismatch(UnreadableCapture):
    """A record of the index lies beyond the file it indexes: the file changed since it was read (the
    command says so in one line, exit 3: the input, not herdscope, is at fault)."""

    @classmethod
    def beyond(cls, path: str, size: int) -> "IndexMismatch":
        """The mismatch of a record found beyond the ``size`` bytes of the file at ``path``."""
        return cls(f"{path}: a record of the index lies beyond the file's {size:,} bytes: "
                   f"the file changed since it was read")


@dataclasses.dataclass(frozen=True)
class RecordIndex:
    """A finished index of one file's records (module doc): the directory of its column files, how
    many records, the link type of each interface (pcapng; the global interface numbers the walker
    gives ``iface``), the format's own link type (pcap; -1 for pcapng), and what the walk found
    (``analyzer.ingest.ReadReport``: a part's report is the whole file's, as a walk of it would say)."""

    directory: str
    records: int
    iface_linktypes: tuple[int, ...]
    file_linktype: int
    report: object
    # (silence_ns, digest of timed) -> times' thinned answer, for the next partition read in this process
    _thinned: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def _column(self, name: str) -> np.ndarray:
        dtype = _dtypes()[name]
        path = os.path.join(self.directory, f"{name}.bin")
        if self.records == 0:
            return np.zeros(0, dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=(self.records,))

    def rows(self, frames: np.ndarray) -> rk.RecordColumns:
        """The walker's rows of the records ``frames`` (frame numbers, ascending, 1-based), copied out."""
        at = self._at(frames)
        return rk.RecordColumns(*(np.ascontiguousarray(self._column(name)[at]) for name in _COLUMNS))

    def _at(self, frames: np.ndarray) -> np.ndarray:
        at = np.asarray(frames, np.int64) - 1
        if at.shape[0] and (at[0] < 0 or at[-1] >= self.records):
            raise IndexMismatch(f"frames {int(at[0]) + 1}..{int(at[-1]) + 1} asked of an index of "
                                f"{self.records} records")
        return at

    def where(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(data_off, caplen) of the records ``frames`` (ascending, 1-based): where their bytes are."""
        at = self._at(frames)
        return (np.ascontiguousarray(self._column("data_off")[at]),
                np.ascontiguousarray(self._column("caplen")[at]))

    def times(self, timed: np.ndarray | None, silence_ns: int | None) -> pl.DataFrame:
        """(frame, ts_ns) of the records ``timed`` marks (a boolean per record; None: every one),
        thinned to their span and silences of ``silence_ns`` (``analyzer.kernels.silences``), as
        the walk of a part finds them: a slice of the ts_ns column at a time. Thinned to a silence (not
        None), the answer is kept for the next part that asks with the same ``timed`` (module doc)."""
        if silence_ns is None:
            return self._times(timed, silence_ns)
        key = (silence_ns, None if timed is None else records_digest(np.asarray(timed, np.bool_)))
        if key not in self._thinned:
            self._thinned[key] = self._times(timed, silence_ns)
        return self._thinned[key]

    def _times(self, timed: np.ndarray | None, silence_ns: int | None) -> pl.DataFrame:
        ts = self._column("ts_ns")
        pieces = []
        for lo in range(0, self.records, TIMES_SLICE_RECORDS):
            hi = min(self.records, lo + TIMES_SLICE_RECORDS)
            frames = np.arange(lo + 1, hi + 1, dtype=np.uint32)
            stamps = np.asarray(ts[lo:hi])
            if timed is not None:
                keep = np.asarray(timed[lo:hi], np.bool_)
                frames, stamps = frames[keep], stamps[keep]
            pieces.append(thinned_times(pl.DataFrame({"frame": frames, "ts_ns": stamps}), silence_ns))
        if not pieces:
            return pl.DataFrame(schema={"frame": pl.UInt32, "ts_ns": pl.Int64})
        return thinned_times(pl.concat(pieces), silence_ns)

    def linktypes_of(self, rows: rk.RecordColumns) -> np.ndarray:
        """Each row's link type, as the walkers give ``decode_block`` (``analyzer.kernels.reading``)."""
        if self.file_linktype >= 0:
            return np.full(rows.kind.shape[0], self.file_linktype, np.int32)
        table = np.asarray(self.iface_linktypes + (LINKTYPE_NOT_PACKET,), np.int32)
        iface = np.minimum(rows.iface.astype(np.int64), len(self.iface_linktypes))
        return np.where(rows.kind == rk.KIND_PACKET, table[iface], np.int32(LINKTYPE_NOT_PACKET)).astype(np.int32)

    def remove(self) -> None:
        """Delete the index's files."""
        shutil.rmtree(self.directory, ignore_errors=True)


def records_digest(records: np.ndarray) -> bytes:
    """A digest of which records an array names (frame numbers, or a boolean per record): its bytes'
    blake2b, 16 bytes. Equal for equal arrays of one dtype."""
    return hashlib.blake2b(np.ascontiguousarray(records).data, digest_size=16).digest()


def _dtypes() -> dict[str, np.dtype]:
    empty = rk.allocate_records(0)
    return {name: getattr(empty, name).dtype for name in _COLUMNS}


class RecordIndexWriter:
    """Writes the rows of the records of one file as its walk finds them (:meth:`append`, chunk by
    chunk, every record in order), then :meth:`finish` makes the :class:`RecordIndex`. ``why_not``
    says why there is none (no room, or the directory could not be made); then :meth:`finish`
    returns None and the partitions walk the file."""

    def __init__(self, parent: str | None = None):
        self.why_not: str | None = None
        self.records = 0
        self.parent = parent  # where the index's directory is made (None: the temporary directory)
        self.directory: str | None = None  # made when the first records come
        self._files = {}

    def append(self, recs: rk.RecordColumns, n: int) -> None:
        """The first ``n`` rows of ``recs``: the next records of the file."""
        if self.why_not is not None:
            return
        try:
            if self.directory is None:
                self.directory = tempfile.mkdtemp(prefix="herdscope-index-", dir=self.parent)
                self._files = {name: open(os.path.join(self.directory, f"{name}.bin"), "wb") for name in _COLUMNS}
            for name in _COLUMNS:
                self._write(name, getattr(recs, name)[:n])
        except OSError as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            self._give_up(f"no room for the record index in {self.directory}: the partitions walk the file"
                          if full else f"no record index ({exc.strerror or exc}): the partitions walk the file")
            return
        self.records += n

    def _write(self, name: str, values: np.ndarray) -> None:
        values.tofile(self._files[name])

    def _give_up(self, why: str) -> None:
        self.why_not = why
        for fh in self._files.values():
            fh.close()
        self._files = {}
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def finish(self, iface_linktypes, file_linktype: int, report) -> RecordIndex | None:
        """The index written (None if :attr:`why_not`)."""
        if self.why_not is not None:
            return None
        try:
            for fh in self._files.values():
                fh.close()
        except OSError as exc:
            self._give_up(f"no record index ({exc.strerror or exc}): the partitions walk the file")
            return None
        self._files = {}
        if self.directory is None:  # no record at all
            self.directory = tempfile.mkdtemp(prefix="herdscope-index-", dir=self.parent)
        return RecordIndex(self.directory, self.records, tuple(int(t) for t in iface_linktypes), int(file_linktype),
                           report)

    def abandon(self) -> None:
        """Stop writing and delete what was written (the reading failed)."""
        if self.why_not is None:
            self._give_up("abandoned")


__all__ = ["RecordIndex", "RecordIndexWriter", "IndexMismatch", "TIMES_SLICE_RECORDS", "records_digest"]
