"""How the process gives memory back: the allocators' settings for a command that reads a capture.

glibc keeps freed heap memory for reuse: its mmap threshold rises to the largest block freed (up to
32 MiB), so after the first large array every later one comes from the heap, and the heap is only
trimmed when its top free chunk passes a threshold that rises with it. A scan's intermediate arrays
(NumPy's column copies, the Numba kernels' outputs, all from ``malloc``) then stay resident after
they are freed, and the process peak holds several generations of them (issue 13). Fixing the mmap
threshold (blocks at or above it are mapped on their own and unmapped when freed) and trimming at
once gives them back; on the 1M-packet synth capture the scan's peak RSS falls by ~48 MB, the same
findings, no measurable CPU cost (:func:`return_freed_memory_promptly`).

Polars' own allocator is jemalloc, built into its library. It keeps freed pages dirty (500 ms as Polars
sets it, then "muzzy" for 1 s more) in each of its arenas (four per CPU by default; Polars' threads spread
over them) and gives them back only as later allocations in the same arena pass by. In a scan in
partitions that retention was most of the process: in the largest partition of the 10M synth capture, at
its first detector, 1,186 MB anonymous of which 249 MB were the frames alive; with every freed page given
back at once, 473 MB, but the scan ~35% slower (jemalloc unmaps and maps again what it would have
reused). :func:`polars_allocator_conf` instead has one arena per CPU, freed pages given back after half a
second by jemalloc's background thread whatever allocates, and none kept muzzy. On the 10M synth capture
(6 December, runs of each side by side) the scan's peak anonymous memory went from 1,183-1,259 MB to
1,068-1,175 MB, its time the same (27-30 s); at 1M, decoded at once, from 414-426 to 400-413 MB. jemalloc
reads its settings from the environment once, when Polars is first loaded
(:func:`configure_polars_allocator`; Polars puts its own before them, and later pairs win); a setting
of the user's own is kept, what the Polars of a parent process put there is not (:func:`users_own`): a
herdscope started by a Python process that had loaded Polars (the benchmark's, a pipeline's) ran with
Polars' defaults, and on the 1M synth capture its scan peaked at 436-448 MB of anonymous memory against
379-392 MB (7 December; ``make bench`` reported 391 B a packet of anonymous memory, 322 B once fixed).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

from .threads import cpus as this_process_cpus

# jemalloc's settings as Polars' build reads them (its symbols carry the prefix _rjem_)
POLARS_ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
# freed pages kept dirty this long before the background thread gives them back (Polars' own setting)
DIRTY_DECAY_MS = 500

# mallopt(3) parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# blocks at least this large are mapped on their own and returned to the system when freed
MMAP_THRESHOLD_BYTES = 64 * 1024
# the heap is trimmed as soon as this much is free at its top
TRIM_THRESHOLD_BYTES = 0


def return_freed_memory_promptly() -> bool:
    """Tell glibc to hand freed large blocks back at once (see the module docstring). False where the
    C library is not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) & bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


_users_conf: str | None = None  # the user's own setting, as configure_polars_allocator found it

# what Polars' import puts in POLARS_ALLOCATOR_ENV before whatever the variable held (polars/__init__.py;
# the second with POLARS_THP=1): a process started by one that has loaded Polars (a Python pipeline, a
# notebook, the benchmark's own process) inherits it, and it is not the user's setting
POLARS_OWN_CONFS = ("dirty_decay_ms:500,muzzy_decay_ms:1000,thp:always,metadata_thp:always",
                    "dirty_decay_ms:500,muzzy_decay_ms:1000")


def users_own(conf: str | None) -> str | None:
    """``conf`` (the variable as this process found it) without what the Polars of the processes that
    started it put first (:data:`POLARS_OWN_CONFS`, once per generation): the user's own setting, or None
    when there is none."""
    while conf:
        own = next((o for o in POLARS_OWN_CONFS if conf == o or conf.startswith(o + ",")), None)
        if own is None:
            return conf
        conf = conf[len(own) + 1:]
    return None


def polars_allocator_conf(cpus: int | None = None) -> str:
    """The jemalloc settings this process gives Polars (module doc): one arena per CPU (``cpus``, by
    default this process's), freed pages given back after :data:`DIRTY_DECAY_MS` by the background
    thread, none kept half-returned."""
    arenas = max(1, cpus or this_process_cpus())
    return f"narenas:{arenas},background_thread:true,dirty_decay_ms:{DIRTY_DECAY_MS},muzzy_decay_ms:0"


def configure_polars_allocator() -> bool:
    """Give Polars' jemalloc :func:`polars_allocator_conf` (before Polars is loaded; a setting of the
    user's in the environment already is kept, :func:`users_own`). False when Polars was loaded already:
    jemalloc has read its settings."""
    global _users_conf
    if "polars" in sys.modules:
        return False
    _users_conf = users_own(os.environ.get(POLARS_ALLOCATOR_ENV))
    os.environ[POLARS_ALLOCATOR_ENV] = _users_conf or polars_allocator_conf()
    return True


def worker_allocator_conf() -> str:
    """What a Dask worker of one thread gives Polars' jemalloc: the user's own setting when
    :func:`configure_polars_allocator` found one, else :func:`polars_allocator_conf` for one CPU. (Read
    from the environment after Polars is loaded it would be Polars' rewriting of it: Polars puts its own
    settings first in the variable.)"""
    return _users_conf or polars_allocator_conf(1)
