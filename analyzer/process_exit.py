"""Ending a herdscope process once its command is done, without the interpreter's teardown.

When the command has returned, CPython's finalization still clears every module one by one and runs the
collector over what they held (Polars', NumPy's, Numba's and llvmlite's objects among them): ~0.1-0.13 s
of a one-packet ``scan`` of ~0.85 s on the 2-core machine (issue 13: a process's fixed cost, target
0.5 s), spent giving back memory the kernel takes back at once when the process ends. Measured with
``strace -f -tt``: the atexit handlers are done at 0.67 s, the process ends at 0.81 s.

:func:`leave` does what the interpreter's exit does that anyone outside the process could see, in its
order, and then ends the process with ``os._exit``:

1. standard output and standard error are flushed;
2. the atexit handlers run, last registered first (``atexit._run_exitfuncs``, the interpreter's own
   call: temporary directories' finalizers, ``logging.shutdown``, Dask's and coverage's handlers);
3. the streams are flushed again (a handler may have written to them).

It does so only where nothing can be lost. In any other case it returns, and the interpreter exits as it
always has:

- only in a process of the command's own: :func:`analyzer.cli.main` called without ``argv``, never a
  caller's ``main(argv)`` (tests, a pipeline, the dashboard);
- only when no other Python thread is alive (the interpreter would wait for a thread that is not a
  daemon, and a daemon might be writing);
- only when both streams flush; a closed pipe is left to the CLI's own handling of it (exit 141).

The exit status is the command's code, as ``sys.exit(code)`` gives it.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading


def _flushed() -> bool:
    """Whether standard output and standard error flushed (False on a closed pipe, a closed stream)."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return False
    return True


def can_leave() -> bool:
    """Whether the process can end now without waiting for anything: this is the main thread, no other
    Python thread is alive, and the interpreter's atexit call is there to run the handlers."""
    return (threading.current_thread() is threading.main_thread() and threading.active_count() == 1
            and callable(getattr(atexit, "_run_exitfuncs", None)))


def leave(code: int) -> int:
    """End the process with ``code`` after the steps of the module docstring; returns ``code`` (and the
    interpreter exits as usual) when it cannot (:func:`can_leave`, a stream that does not flush)."""
    if not can_leave() or not _flushed():
        return code
    atexit._run_exitfuncs()  # the interpreter's own call (module doc); each handler runs once
    if not _flushed():
        return code
    os._exit(code)
