"""Bytes of a capture as one read-only NumPy array over a memory map.

A regular file is mapped as it is. Anything else that can be read — standard input (``-``), a pipe
(``tcpdump -w - | herdscope scan -``), a FIFO, process substitution (``<(zcat x.pcap.gz)``),
``/dev/stdin`` — is copied in :data:`PIECE_BYTES` pieces into an unlinked temporary file that is then
mapped: the reader and the detectors need random access to the bytes, memory stays bounded whatever
the size, and the temporary file goes away with the capture.

Gzip-compressed captures (``.pcap.gz`` is common in the wild) are recognised by their magic, not their
name, and are decompressed the same way, from a file or a pipe. A damaged gzip stream (a bad CRC,
corrupt deflate data in the middle, a stream cut short) keeps every byte that decompressed before the
damage, as tshark does, and says what was wrong in :attr:`CaptureBytes.gzip_damage`.
"""
from __future__ import annotations

import ctypes
import io
import mmap
import os
import stat
import sys
import tempfile
import zlib
from dataclasses import dataclass, field

import numpy as np

from .errors import UnreadableCapture
from .formats import MAGIC_BYTES, is_capture_magic

GZIP_MAGIC = b"\x1f\x8b"
STDIN = "-"  # the file name that means standard input
STDIN_LABEL = "<stdin>"  # how messages name it
PIECE_BYTES = 1 << 20  # read (and decompress into) pieces of this size: the bound on memory
# Compressed bytes fed to zlib between two saved inflater states. When zlib reports damage, the
# piece that failed is fed again one byte at a time from the saved state, so every byte that
# decompresses before the damage is kept (at most this many single-byte calls, a few ms).
INFLATE_STEP_BYTES = 1 << 16
MADV_DONTNEED = 4  # Linux's <sys/mman.h> (Python's mmap module has it only for its own mmap objects)


@dataclass
class CaptureBytes:
    """The bytes of one capture. ``buf`` stays valid until :meth:`close`."""

    path: str
    buf: np.ndarray  # uint8, read-only
    compressed: bool
    file_size: int  # bytes of the input (on disk, or that arrived through the pipe; compressed size for gzip)
    gzip_damage: str = ""  # why the gzip stream ended before its end ("" when it is whole)
    spilled: bool = False  # read from a pipe / stdin into a temporary file
    _mmap: mmap.mmap | None = field(default=None, repr=False)
    _file: object = field(default=None, repr=False)
    mapped: bool = False  # ``buf`` maps files side by side (analyzer.joined_map), not a copy in memory

    @property
    def gzip_complete(self) -> bool:
        return not self.gzip_damage

    def fileno(self) -> int | None:
        """The descriptor of the file ``buf`` maps (the capture, or the temporary file a pipe or a
        gzip stream was spilled to); None when there is none."""
        try:
            return self._file.fileno() if self._file is not None and self._mmap is not None else None
        except (OSError, ValueError):
            return None

    def forget_pages(self) -> None:
        """Give back this process's resident pages of the mapped files (``madvise(MADV_DONTNEED)``):
        they stay in the page cache and are mapped again by the next read of them, so nothing is lost
        or copied; what a partitioned scan's caller does while its partitions read the same files
        again (else the process's RSS counts the files twice). Bytes held in memory (not a mapping of
        files) are left alone: there the call would zero them."""
        if not (self.mapped or self._mmap is not None) or self.buf.size == 0 or not sys.platform.startswith("linux"):
            return
        start = self.buf.ctypes.data
        aligned = start - start % mmap.PAGESIZE
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(aligned, self.buf.size + (start - aligned), MADV_DONTNEED)

    def close(self) -> None:
        self.buf = np.empty(0, dtype=np.uint8)
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:  # a frame still views the map; it is released with the last view
                pass
            self._mmap = None
        if self._file is not None:
            self._file.close()
            self._file = None


def map_file(fileobj, populate: bool = True) -> tuple[mmap.mmap | None, np.ndarray]:
    """``fileobj``'s file mapped read-only (shared): the mapping (None for an empty file) and its bytes;
    ``populate``: every page mapped at once."""
    size = os.fstat(fileobj.fileno()).st_size
    if size == 0:
        return None, np.empty(0, dtype=np.uint8)
    # MAP_POPULATE maps the pages up front instead of faulting them in as the walk reaches them
    # (measured: 1.4 ms instead of 2.2 ms for 633 MB); the pages are the page cache's, nothing is copied.
    # A reading that walks no record (a part read from a record index) reads some pages only: faulted in.
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    mapped = mmap.mmap(fileobj.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
    return mapped, np.frombuffer(mapped, dtype=np.uint8)


def _temp_file():
    return tempfile.TemporaryFile(prefix="herdscope-", suffix=".pcap")


def _temp_failed(label: str, exc: OSError) -> UnreadableCapture:
    return UnreadableCapture(f"{label}: cannot hold a temporary copy in {tempfile.gettempdir()} "
                             f"({exc.strerror or exc}); set TMPDIR to a directory with room")


class _Reader:
    """A stream read in pieces of at most PIECE_BYTES, ``head`` (already read) first; counts bytes."""

    def __init__(self, src, head: bytes, label: str):
        self.src, self.head, self.label, self.bytes_read = src, head, label, len(head)

    def __iter__(self):
        if self.head:
            yield self.head
        while True:
            try:
                piece = self.src.read(PIECE_BYTES)
            except OSError as exc:
                raise UnreadableCapture(f"{self.label}: reading failed after {self.bytes_read:,} bytes "
                                        f"({exc.strerror or exc})") from exc
            if not piece:
                return
            self.bytes_read += len(piece)
            yield piece


def _spill(reader: _Reader):
    """Copy a stream into an unlinked temporary file."""
    try:
        tmp = _temp_file()
    except OSError as exc:
        raise _temp_failed(reader.label, exc) from exc
    try:
        for piece in reader:
            tmp.write(piece)
        tmp.flush()
    except OSError as exc:  # the reader's own failures are UnreadableCapture already
        tmp.close()
        raise _temp_failed(reader.label, exc) from exc
    except BaseException:
        tmp.close()
        raise
    return tmp


def _inflate_into(inflater, data: bytes, tmp) -> None:
    """Decompress ``data`` into ``tmp`` with output pieces bounded by PIECE_BYTES."""
    out = inflater.decompress(data, PIECE_BYTES)
    tmp.write(out)
    while inflater.unconsumed_tail or len(out) == PIECE_BYTES:
        out = inflater.decompress(inflater.unconsumed_tail, PIECE_BYTES)
        if not out and not inflater.unconsumed_tail:
            break
        tmp.write(out)


def _inflate_salvaging(inflater, data: bytes, tmp) -> tuple[str, int]:
    """Feed ``data`` to ``inflater``. On damage keep what decompressed before it and return
    (why, index of the damaged byte in ``data``); ("", 0) when all went well."""
    saved, mark = inflater.copy(), tmp.tell()
    try:
        _inflate_into(inflater, data, tmp)
        return "", 0
    except zlib.error as exc:
        reason = str(exc).removeprefix("Error -3 while decompressing data: ")
    # Again from the saved state one byte at a time: everything before the damaged byte comes out.
    tmp.seek(mark)
    tmp.truncate()
    for k in range(len(data)):
        try:
            _inflate_into(saved, data[k:k + 1], tmp)
        except zlib.error:
            return reason, k
    return reason, len(data)


def _decompress(reader: _Reader):
    """Decompress every gzip member of a stream into an unlinked temporary file.

    Returns (file, damage): damage ("" if none) says what stopped decompression early (a bad CRC,
    corrupt data, a stream cut short); the bytes that decompressed before it are in the file. Bytes
    after the last member that do not start another member are ignored, as gzip(1) does.
    """
    try:
        tmp = _temp_file()
    except OSError as exc:
        raise _temp_failed(reader.label, exc) from exc
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    used = 0  # compressed bytes consumed by finished steps
    fed = False  # the current member has been given bytes
    damage = ""
    junk = False  # bytes after the last member that start no other member
    try:
        for piece in reader:
            pos = 0
            while pos < len(piece) and not damage and not junk:
                step = piece[pos:pos + INFLATE_STEP_BYTES]
                fed = True
                reason, at = _inflate_salvaging(inflater, step, tmp)
                if reason:
                    damage = f"the gzip stream is damaged at compressed byte {used + pos + at:,} ({reason})"
                elif inflater.eof:  # a member ended in this step: another member or trailing junk follows
                    pos += len(step) - len(inflater.unused_data)
                    inflater, fed = zlib.decompressobj(16 + zlib.MAX_WBITS), False
                    junk = not GZIP_MAGIC.startswith(piece[pos:pos + 2])
                else:
                    pos += len(step)
            if damage or junk:
                break
            used += len(piece)
    except OSError as exc:
        tmp.close()
        raise _temp_failed(reader.label, exc) from exc
    except BaseException:
        tmp.close()
        raise
    if not damage and fed and not inflater.eof:
        damage = "the gzip stream is cut short"
    if damage and tmp.tell() == 0:
        tmp.close()
        raise UnreadableCapture(f"{reader.label}: not a readable gzip file ({damage})")
    try:
        tmp.flush()
    except OSError as exc:
        tmp.close()
        raise _temp_failed(reader.label, exc) from exc
    return tmp, damage


def _open_source(path: str):
    """(file object, label, is a regular file) for ``path`` or ``-``."""
    if path == STDIN:
        return sys.stdin.buffer, STDIN_LABEL, False
    try:
        fileobj = open(path, "rb")
    except IsADirectoryError as exc:
        raise UnreadableCapture(f"{path}: is a directory, not a capture file") from exc
    except OSError as exc:
        raise UnreadableCapture(f"{path}: {(exc.strerror or str(exc)).lower()}") from exc
    mode = os.fstat(fileobj.fileno()).st_mode
    if stat.S_ISDIR(mode):
        fileobj.close()
        raise UnreadableCapture(f"{path}: is a directory, not a capture file")
    return fileobj, path, stat.S_ISREG(mode)


def read_once(path: str | os.PathLike) -> bool:
    """Whether ``path`` can be read only once: standard input, a pipe, a FIFO, a process substitution
    (what :func:`open_bytes` copies into a temporary file). A path that cannot be looked at is not
    (opening it says what is wrong)."""
    path = os.fspath(path)
    if path == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def open_bytes(path: str | os.PathLike, populate: bool = True) -> CaptureBytes:
    """Map ``path`` (``-`` for standard input; gzip is decompressed) and return its bytes; ``populate``:
    every page mapped at once (a walk of every record reads them all), or as they are read.

    Raises :class:`UnreadableCapture` when it cannot be opened or nothing can be read from it.
    """
    path = os.fspath(path)
    src, label, regular = _open_source(path)
    fileobj = None
    try:
        try:
            head = src.read(MAGIC_BYTES)
        except OSError as exc:
            raise UnreadableCapture(f"{label}: {(exc.strerror or str(exc)).lower()}") from exc
        reader = _Reader(src, head, label)
        compressed = head.startswith(GZIP_MAGIC)
        size = os.fstat(src.fileno()).st_size if regular else 0
        damage = ""
        if compressed:
            fileobj, damage = _decompress(reader)
        elif regular:
            fileobj = src
        elif is_capture_magic(head):
            fileobj = _spill(reader)
        else:  # not a capture: read no further (it may be /dev/zero); the reader says what it is
            fileobj = _spill(_Reader(io.BytesIO(), head, label))
        size = size or reader.bytes_read
        mapped, buf = map_file(fileobj, populate)
    except BaseException:
        if fileobj is not None and fileobj is not src:
            fileobj.close()
        raise
    finally:
        if fileobj is not src and src is not sys.stdin.buffer:
            src.close()
    return CaptureBytes(label, buf, compressed, size, damage, not regular, mapped, fileobj)
