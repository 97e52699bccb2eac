"""What every herdscope command shares below the argument parsing: opening the captures under the
command line's rules, and checking and writing its outputs.

The entry point (``analyzer/cli.py``) parses arguments and calls the commands; the commands that run
the detectors live in ``detectors/scan_command.py``. Both reach the captures and the outputs through
these functions, so that an unreadable capture or an unwritable output is the same one-line error
(:func:`analyzer.errors.fail`) and exit code everywhere.
"""
from __future__ import annotations

import contextlib
import errno
import os

from .errors import ExitCode, OutputError, UnreadableCapture, fail

_notice_shown = False  # the Numba cache notice is said once per process


def open_captures(paths: list[str], **options):
    """The files read as one capture (:func:`analyzer.capture.open_captures`, with its ``options``),
    under the command line's rule that a file from which damage let no packet at all be read is
    unreadable (exit 3), not an empty capture."""
    from . import CACHE_NOTICE  # lazy: analyzer/__init__ sets up the Numba cache; --help needs none of it
    from .capture import open_captures as open_files  # lazy: the reader loads Polars and Numba

    global _notice_shown
    if CACHE_NOTICE and not _notice_shown:
        _notice_shown = True
        fail(f"note: {CACHE_NOTICE}")
    cap = open_files(paths, **options)
    for path, report in cap.reports:
        reason = report.nothing_read()
        if reason:
            cap.close()
            raise UnreadableCapture(f"{path}: {reason}")
        if report.gzip_damage:  # said on stderr too: the packets after it are lost
            cap.warnings.append(f"{path}: {report.gzip_damage}; the packets before the damage are read")
    return cap


def each_capture(files, per_capture, *, partitions: int | None = 1, packet_columns: tuple[str, ...] | None = None,
                 chunked=None) -> int:
    """Open each file and call ``per_capture(path, cap, count)``; unreadable files are reported, not
    fatal. ``count``: the partitions to decode the file in, ``partitions`` (``--partitions``; 1 by
    default: at once), or with None as many as its estimated size asks
    (``analyzer.record_estimate.partitions_for``); a file of more than one is opened reading only
    ``packet_columns`` of its packets (what the command reads of them, and the partitioning; None:
    all of them), and with ``chunked`` (a function making an ``analyzer.ingest.ChunkReduction``) keeping
    of each chunk of them only what that reduction makes of it."""
    from .record_estimate import partitions_for  # lazy: light, but not for --help

    code = ExitCode.OK
    for path in files:
        try:
            count = partitions_for([path], partitions)
            narrow = {"packet_columns": packet_columns} if count > 1 and packet_columns is not None else {}
            if narrow and chunked is not None:
                narrow["reduce"] = chunked()
            with open_captures([path], **narrow) as cap:
                say_index_warning(narrow.get("reduce"))
                per_capture(path, cap, count)
        except UnreadableCapture as exc:
            fail(str(exc))
            code = ExitCode.UNREADABLE
    return code


def say_index_warning(reduction) -> None:
    """Why a reading that was to write a record index for its partitions wrote none (no room in the
    temporary directory: they walk the file instead, ``analyzer.record_index``), on stderr."""
    why = getattr(reduction, "index_warning", None)
    if why:
        fail(f"warning: {why}")


def check_output_file(option: str, path: str | None) -> None:
    """Fail now, before any capture is read, when ``path`` cannot be written."""
    if not path:
        return
    if os.path.isdir(path):
        raise OutputError(f"{option} {path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{option} {path}: the directory {parent} does not exist")
    target = path if os.path.exists(path) else parent
    if not os.access(target, os.W_OK):
        raise OutputError(f"{option} {path}: {'the file' if target == path else 'its directory'} is not writable")


def check_output_dir(option: str, path: str) -> None:
    """Fail now when directory ``path`` neither is nor can be created as a writable directory."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{option} {path}: exists and is not a directory")
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise OutputError(f"{option} {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: {probe} is not writable")


@contextlib.contextmanager
def writing(option: str, path: str | None):
    """Turn a failed write of ``path`` into a one-line OutputError (a closed stdout stays EPIPE)."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.EPIPE or not path:
            raise
        raise OutputError(f"{option} {path}: {exc.strerror or exc}") from exc
