"""Running a command's independent steps on several threads of one process (issue 13: the 1M scan's time).

Once the TCP analysis is done, a scan's decoders build their frames from it independently of one
another (DNS, Kerberos, LDAP, SMB2, NFS, HTTP), and once every frame a scan's detectors read is built,
the detectors only read them. Each such step spends its time in Numba kernels, which release the GIL
(``analyzer.jit``), and in Polars' engine, which releases it too, so the steps of one stage run at once
on the machine's cores: :func:`run_each`. A frame asked for by two steps at once is built once
(``Capture.frame`` holds a lock per frame while it builds).

On the 1M synth capture (2 cores, 7 December, four runs of each alternating, the report the same):
the whole ``scan`` process took 4.16-4.57 s against 4.83-5.56 s on one thread, its peak anonymous
memory 405-408 MB against 399-406 MB. A prototype's timings of the two stages: the frames built in 1.10-1.11 s
against 1.42-1.51 s, the detectors in 1.00-1.02 s against 1.24-1.33 s.

How many threads (:func:`thread_count`): ``HERDSCOPE_THREADS`` when set, else the CPUs this process
may run on, at most :data:`DEFAULT_MAX_THREADS`. A Dask worker runs one (``analyzer.distributed``
sets the variable to 1 in its local workers' environment, as it holds Polars and Numba to one thread):
there the cores are the workers'.

A capture decoded in partitions (a large one, by default) runs one step at a time (:func:`at_most`):
the partitions are there to bound the memory, and two steps at once hold two steps' working memory. On
the 100M synth capture (7 December) several threads took the scan's peak anonymous memory from
2.8-2.9 GB to 4.9 GB, past issue 13's 4 GB, at the end, where the caller's detectors run on the
merged frames.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Callable, TypeVar

T = TypeVar("T")

THREADS_ENV = "HERDSCOPE_THREADS"  # the number of threads, overriding the default
# Without the variable, at most this many: the longest step of a stage (the SMB2 decoder, tcp_stall) is a
# third of its stage on the 1M synth capture, so a stage gains little beyond three or four threads, and
# each thread holds a step's working memory.
DEFAULT_MAX_THREADS = 4
# what at_most() holds the count to here (None: nothing)
_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("herdscope_thread_limit", default=None)


def cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container's cpuset limits)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def configured_threads() -> int:
    """``HERDSCOPE_THREADS``, else the CPUs up to :data:`DEFAULT_MAX_THREADS` (module doc). A value that
    is not a whole number of at least 1 raises ValueError naming it (the CLI's usage error)."""
    given = os.environ.get(THREADS_ENV)
    if given is None or not given.strip():
        return max(1, min(cpus(), DEFAULT_MAX_THREADS))
    try:
        count = int(given)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{THREADS_ENV}={given!r}: expected a whole number of threads, at least 1")
    return count


def thread_count() -> int:
    """How many threads :func:`run_each` runs its calls on: :func:`configured_threads`, at most what
    :func:`at_most` allows where it holds."""
    count, limit = configured_threads(), _limit.get()
    return count if limit is None else min(count, limit)


@contextlib.contextmanager
def at_most(count: int):
    """Within it (in this thread, and the calls :func:`run_each` makes from it), :func:`thread_count` is at
    most ``count``: a scan in partitions, whose memory is bounded by doing one thing at a time."""
    token = _limit.set(count)
    try:
        yield
    finally:
        _limit.reset(token)


def run_each(calls: list[Callable[[], T]], *, threads: int | None = None,
             done: Callable[[int], None] | None = None) -> list[T]:
    """Each call's result, in the order of ``calls``, the calls run on ``threads`` threads (default
    :func:`thread_count`). ``done(i)`` runs in the calling thread as call ``i`` returns (in the order
    they finish). On one thread the calls run in order and an exception stops them at once, as a loop
    would; on several, a call that raises cancels those not started, the others finish, and the
    exception of the first failed call (in the order of ``calls``) is raised. Each call sees the
    caller's context variables (``show``'s uncapped evidence, ``detectors.base``)."""
    threads = thread_count() if threads is None else threads
    if threads <= 1 or len(calls) <= 1:
        results = []
        for index, call in enumerate(calls):
            results.append(call())
            if done is not None:
                done(index)
        return results
    import concurrent.futures  # lazy: 7.6 ms that every command would pay (the CLI reads thread_count at start)

    results: list = [None] * len(calls)
    failed: dict[int, BaseException] = {}
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(calls)), thread_name_prefix="herdscope") as pool:
        # each call sees the caller's context variables (as asyncio.to_thread does): a copy each, since
        # one context cannot be entered by two threads at once
        futures = {pool.submit(contextvars.copy_context().run, call): index for index, call in enumerate(calls)}
        for future in concurrent.futures.as_completed(futures):
            index = futures[future]
            if future.cancelled():
                continue
            error = future.exception()
            if error is not None:
                failed[index] = error
                for other in futures:
                    other.cancel()
                continue
            results[index] = future.result()
            if done is not None and not failed:
                done(index)
    if failed:
        raise failed[min(failed)]
    return results
