"""Frames (and arrays) held in a memory-mapped file instead of the process's own memory.

A scan in partitions merges frames that its detectors then hold for a while: a cut server's task
(``analyzer.shards.MergedShards``) holds each merged frame from its first reader to its last, and the
caller holds the merged frames of the whole capture while its own detectors run. On the 100M synth
capture a task's frames alone were 1-2 GB of anonymous memory (the LDAP server's: ``ldap_transactions``,
``kerberos_messages``, ``kerberos_transactions``, ``ldap_messages``, ~1.6 GB; issue 13), on top of which
its detectors build what they compute. :func:`mapped` writes such a frame once to an uncompressed Arrow
IPC file (the format Polars and Arrow share, every column type round-trips: strings, enums, lists) and
hands back the same frame backed by that file's pages, mapped with Arrow's ``pyarrow.memory_map``: the
kernel reads them in as they are touched and may drop them again under pressure (they are clean pages
of a file, like the capture's own mapping), so they no longer count in the process's anonymous memory.
What a detector computes from such a frame is still its own memory; a column it only selects or casts
to its own type stays mapped.

The file goes to the system's temporary directory, or to ``/var/tmp`` when that is in memory
(``tmpfs``, as Debian 13 mounts ``/tmp``): a file in memory would only move the frame from the process's
memory to the kernel's, and the frame is kept as it is when neither is on a disk (:func:`on_disk`).
The file is unlinked as soon as it is mapped: the mapping keeps its pages until the last column of the
frame goes, and nothing is left on disk however the process ends. Without room for it in the directory
(or any other failure to write or read it back) the frame is kept as it was, in memory; a frame
smaller than :data:`MAPPED_MIN_BYTES` is not worth a file. The mapped frame equals the one given,
schema included (checked; otherwise the given one is kept). A worker of a Dask cluster maps in its own
temporary directory; an array sent to it (the partition ids) arrives as a copy in its memory.
"""
from __future__ import annotations

import functools
import os
import tempfile

import numpy as np
import polars as pl

# a frame smaller than this (Polars' estimate) stays in memory: a file and a mapping per frame cost more
MAPPED_MIN_BYTES = 1 << 20
# file systems whose files are memory, not disk
IN_MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs"})
# where a frame's file goes when the system's temporary directory is in memory (the FHS's disk-backed one)
DISK_TEMPORARY_DIRECTORY = "/var/tmp"


@functools.lru_cache(maxsize=8)
def on_disk(directory: str) -> bool:
    """Whether ``directory``'s files are on a disk: the type of the mount holding it (the last of the
    longest mount points above it in ``/proc/self/mounts``) is not one of :data:`IN_MEMORY_FILE_SYSTEMS`.
    True where that cannot be read (not Linux)."""
    path = os.path.realpath(directory)
    try:
        with open("/proc/self/mounts") as mounts:
            table = [line.split()[1:3] for line in mounts if len(line.split()) >= 3]
    except OSError:
        return True
    best, kind = "", ""
    for point, fs_type in table:
        point = point.replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fs_type
    return kind not in IN_MEMORY_FILE_SYSTEMS


def frame_directory() -> str | None:
    """Where :func:`mapped` writes by default: the system's temporary directory when it is on a disk,
    else :data:`DISK_TEMPORARY_DIRECTORY` when that is; None when neither is (frames stay in memory)."""
    for directory in (tempfile.gettempdir(), DISK_TEMPORARY_DIRECTORY):
        if os.path.isdir(directory) and on_disk(directory):
            return directory
    return None


def through_file(nbytes: int, directory: str | None, suffix: str, write, read, errors: tuple = ()):
    """``read(path)`` of a file that ``write(path)`` wrote in ``directory`` (default:
    :func:`frame_directory`), unlinked once read; None when ``nbytes`` is under :data:`MAPPED_MIN_BYTES`,
    there is no such directory on a disk, or writing or reading fails (OSError, ValueError, ``errors``)."""
    out = through_files([nbytes], directory, suffix, lambda paths: write(paths[0]), read, errors)
    return None if out is None else out[0]


def through_files(sizes: list[int], directory: str | None, suffix: str, write, read, errors: tuple = ()):
    """:func:`through_file` of several files written together: ``write(paths)`` writes one file of each
    size in ``sizes``; the list of ``read(path)`` of each, every file unlinked once read; None when any
    size is under :data:`MAPPED_MIN_BYTES` or anything fails, as there."""
    directory = directory if directory is not None else frame_directory()
    if not sizes or min(sizes) < MAPPED_MIN_BYTES or directory is None or not on_disk(directory):
        return None
    paths: list[str] = []
    try:
        try:
            for _ in sizes:
                fd, path = tempfile.mkstemp(prefix="herdscope-frame-", suffix=suffix, dir=directory)
                os.close(fd)
                paths.append(path)
            write(paths)
            return [read(path) for path in paths]
        finally:
            for path in paths:
                os.unlink(path)
    except (OSError, ValueError, *errors):
        return None


def mapped(frame: pl.DataFrame, directory: str | None = None) -> pl.DataFrame:
    """``frame``, backed by a memory-mapped Arrow file in ``directory`` (default: :func:`frame_directory`)
    instead of anonymous memory (module doc); ``frame`` itself when it is smaller than
    :data:`MAPPED_MIN_BYTES`, or there is no directory on a disk for it, or it cannot be written there."""
    if frame.estimated_size() < MAPPED_MIN_BYTES:  # before pyarrow's import (~0.2 s)
        return frame
    import pyarrow as pa  # lazy: only a scan in partitions maps frames
    import pyarrow.ipc  # noqa: F401  # lazy: with pyarrow (pa.ipc)

    def read(path: str):
        with pa.memory_map(path) as source:  # the buffers keep the mapping after the file is closed
            return pa.ipc.open_file(source).read_all()

    table = through_file(frame.estimated_size(), directory, ".arrow",
                         lambda path: frame.write_ipc(path, compression="uncompressed"), read,
                         (pl.exceptions.PolarsError, pa.ArrowException))
    out = None if table is None else pl.from_arrow(table, rechunk=False)
    if not isinstance(out, pl.DataFrame) or out.schema != frame.schema or out.height != frame.height:
        return frame
    return out


def mapped_array(array: np.ndarray, directory: str | None = None) -> np.ndarray:
    """``array`` (one dimension), read-only and backed by a memory-mapped file as :func:`mapped` backs a
    frame (``numpy.memmap``; the same directories, the same threshold); ``array`` itself where
    :func:`mapped` would keep a frame in memory. A scan's partition ids, 2 bytes a packet, read by
    every partition (analyzer.distributed)."""
    if array.ndim != 1:
        return array
    view = through_file(array.nbytes, directory, ".bin", array.tofile,
                        lambda path: np.memmap(path, dtype=array.dtype, mode="r", shape=array.shape))
    return array if view is None else view
