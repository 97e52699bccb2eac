"""Several capture files mapped side by side into one range of memory: one buffer, nothing copied.

Several files read as one capture (the pieces of a ring buffer, ``capture.open_captures``) are
decoded from one buffer: payload offsets index it, and the kernels take one array. Copying the files
into a fresh buffer costs their size again in memory, and on a machine whose fresh pages are slow to
fault in (a VM: 620 MB took 3.7 s to first-touch here, against 0.1 s to read) more time than the
whole scan. Instead the files are mapped, each at the next page boundary, into one reserved range:
Linux's ``mmap(MAP_FIXED)`` over an anonymous ``PROT_NONE`` reservation. A file's pages are then the
page cache's, shared with every other process reading it (the workers of ``scan --workers``).

Each file starts at a page boundary, so :attr:`JoinedMap.bases` (where each file starts) are not the
running sum of the sizes: the bytes after a file's end up to the next page are zeros and belong to
no file. The range is unmapped when the last NumPy view of it goes (the array's ``base`` is the
:class:`JoinedMap`), so a frame still viewing it stays valid after the capture is closed.

:func:`join` returns None where this cannot be done (not Linux, a piece without a file, mmap
refused); the caller then copies.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys

import numpy as np

PAGE_BYTES = mmap.PAGESIZE
# Linux's values (<sys/mman.h>); Python's mmap module does not export MAP_FIXED or MAP_NORESERVE
_PROT_NONE, _PROT_READ = 0, 1
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def aligned(size: int) -> int:
    """``size`` rounded up to a whole number of pages."""
    return -(-size // PAGE_BYTES) * PAGE_BYTES


class JoinedMap:
    """Files mapped one after the other (read-only). ``np.asarray(joined)`` is the buffer."""

    def __init__(self, files: list[tuple[int, int]]):
        """``files``: (open file descriptor, size in bytes) of each, in order."""
        self._libc = _libc()
        self.bases = []
        offset = 0
        for _, size in files:
            self.bases.append(offset)
            offset += aligned(size)
        self.size = offset
        self._addr = None
        if self.size == 0:
            return
        addr = self._libc.mmap(None, self.size, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap: cannot reserve the joined range")
        self._addr = addr
        for (fd, size), base in zip(files, self.bases):
            if size == 0:
                continue
            got = self._libc.mmap(addr + base, size, _PROT_READ, _MAP_SHARED | _MAP_FIXED | _MAP_POPULATE, fd, 0)
            if got != addr + base:
                errno = ctypes.get_errno()
                self._unmap()
                raise OSError(errno, "mmap: cannot map a piece into the joined range")

    @property
    def __array_interface__(self) -> dict:
        return {"version": 3, "shape": (self.size,), "typestr": "|u1",
                "data": (self._addr or 0, True)}  # read-only

    def _unmap(self) -> None:
        if self._addr is not None:
            self._libc.munmap(self._addr, self.size)
            self._addr = None

    def __del__(self):  # the last view of the buffer is gone
        self._unmap()


def join(pieces) -> tuple[np.ndarray, list[int]] | None:
    """(one read-only buffer of ``pieces``' bytes, where each starts in it), the pieces being
    :class:`analyzer.source.CaptureBytes` of mapped files; None when they cannot be mapped so."""
    if not sys.platform.startswith("linux"):
        return None
    files = []
    for piece in pieces:
        if piece.buf.size == 0:
            files.append((-1, 0))
            continue
        fd = piece.fileno()
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
        except OSError:
            return None
        if size != piece.buf.size:  # not the file's bytes as they are (cannot happen for a mapped file)
            return None
        files.append((fd, size))
    try:
        joined = JoinedMap(files)
    except OSError:
        return None
    if joined.size == 0:
        return np.empty(0, np.uint8), joined.bases
    return np.asarray(joined), joined.bases
