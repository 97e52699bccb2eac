"""Errors a user can act on, the exit codes that say which, and the one-line message on standard error.

Each error carries a one-line message that names the file. Every herdscope command (the command line
in ``analyzer/cli.py``, the scan and show commands in ``detectors/``, ``herdscope dashboard``) reports
through :func:`fail` and returns an :class:`ExitCode`.
"""
from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # success
    FINDINGS = 1  # scan found something at or above --fail-on
    USAGE = 2  # bad command line, or an output that cannot be written
    UNREADABLE = 3  # an input could not be read as a capture
    INTERNAL = 4  # a bug
    INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C
    TERMINATED = 143  # 128 + SIGTERM: stopped (kill, a CI job's timeout), its temporary files removed
    BROKEN_PIPE = 141  # 128 + SIGPIPE: standard output was closed before all was written


class Terminated(BaseException):
    """The process was sent SIGTERM (:func:`analyzer.cli.main` raises it from the signal handler). A
    BaseException, as KeyboardInterrupt is, so that nothing catching errors stops it on its way out and
    every ``finally`` on the way runs: a scan in partitions removes its record index and spilled frames
    (gigabytes in the temporary directory at 100M packets) instead of leaving them behind."""


class HerdscopeError(Exception):
    """Base class of herdscope's own errors."""


class UnreadableCapture(HerdscopeError):
    """The input cannot be read as a capture at all (missing, empty, not pcap/pcapng, bad gzip).

    Damage *inside* a readable capture (a truncated last record, a block with a bogus length) is not
    raised: the packets before it are kept and the damage is reported in the capture's read report.
    """


class OutputError(HerdscopeError):
    """An output file or directory that cannot be written (exit 2)."""


class ClusterFailure(HerdscopeError):
    """The partitions of a scan could not finish the work: a worker of the Dask cluster of ``scan
    --workers``/``--scheduler`` died (e.g. out of memory), or the temporary directory their frames are
    written to is full (``--partitions``, local clusters): exit 4, said in one line, since neither the
    input nor the command is at fault."""


def fail(message: str) -> None:
    """Say ``herdscope: MESSAGE`` on standard error, one line (what every failure a user can act on
    prints, with the exit code that goes with it)."""
    import click  # lazy: the library's readers import this module; only a command prints

    click.echo(f"herdscope: {message}", err=True)
