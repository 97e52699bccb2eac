"""Decoding on a Dask cluster: ``herdscope scan --workers N`` and ``--scheduler tcp://HOST:8786``.

Each task opens the capture files, keeps one server partition of their packets
(``analyzer.partitions``: every packet to or from the partition's servers, so connections, flows and
per-server decoder state stay whole), runs TCP analysis and the decoders on it and sends back the
frames the detectors read; the caller merges them (:func:`analyzer.partitions.merge_frames`) into
exactly the frames a single process builds and runs the detectors on those. There are as many
partitions as the cluster has worker threads.

Dask is an optional extra (``pip install 'herdscope[distributed]'``): it is imported here only, when
one of the options is given. A local cluster has one thread per worker process, and each worker's
Polars and Numba are held to one thread, so N workers use N cores and do not oversubscribe them.
Every worker reads the files itself (from a path it can open: on a remote cluster, shared storage).

Detectors that follow a client across its servers run in a second stage: each decoding task also
splits its connection frames into client buckets (``analyzer.partitions.client_buckets``), and one
task per bucket merges that bucket of every partition, with the whole run's connection numbers, and
runs them on it. The buckets go from task to task through Dask (or, on one machine, through files):
the caller receives neither them nor the connection frames they hold unless its own detectors read them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile

import click
import polars as pl

from . import selection as select
from .capture import open_captures
from .errors import ClusterFailure
from .partitions import (FrameSet, client_buckets, connection_maps, decode_partition, merge_frames,
                         restrict_to_partition)

INSTALL_HINT = "pip install 'herdscope[distributed]' (Dask's distributed scheduler)"
# what a local worker's own thread pools are held to: one Dask thread, one core
WORKER_ENV = {"POLARS_MAX_THREADS": "1", "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _dask():
    try:
        import distributed  # lazy: the optional extra herdscope[distributed], imported only for these options
    except ImportError:
        raise click.UsageError(f"--workers and --scheduler need Dask: {INSTALL_HINT}") from None
    return distributed


@contextlib.contextmanager
def cluster(workers: int | None = None, scheduler: str | None = None):
    """A ``distributed.Client``: of a new LocalCluster of ``workers`` processes, or of the running
    scheduler at ``scheduler``; closed (and the local cluster stopped) on exit."""
    distributed = _dask()
    if scheduler:
        try:
            client = distributed.Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as exc:
            raise click.UsageError(f"--scheduler {scheduler}: cannot reach it ({exc})") from exc
        with client:
            yield client
        return
    # memory_limit=0: Dask would kill a worker whose RSS nears its share of the machine, and a
    # worker's RSS counts the capture's mapped pages (page cache, shared, reclaimable): the 10M synth
    # capture's 8 pieces, mapped twice while they are joined, took a worker past it
    local = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, memory_limit=0,
                                     dashboard_address=None, silence_logs=logging.ERROR, env=WORKER_ENV)
    with local, distributed.Client(local) as client:
        yield client


def _threads(client) -> int:
    info = client.scheduler_info(n_workers=-1)  # every worker (the default lists only the first five)
    return max(1, sum(w.get("nthreads", 1) for w in info["workers"].values()))


def decode_partition_task(files: list[str], selection, names: list[str], index: int, count: int,
                          spill_dir: str | None = None, then=None, client_frames: tuple[str, ...] = ()):
    """One task: the frames ``names`` of partition ``index`` of ``count`` of the files read as one
    capture (after ``selection``, as the caller applied it), and what ``then(capture, whole_packets)``
    returns (a dict of small frames, e.g. the findings of detectors run on the partition; sent back
    as they are), as ``(frames, then's, buckets)``: ``buckets`` is the partition's ``client_frames``
    split into ``count`` client buckets (empty without them). With ``spill_dir`` the frames and
    buckets are written there as Arrow IPC files and their paths returned: on one machine that is
    several times faster than sending them through the cluster's sockets (171 MB of frames of 1M
    packets: ~3.5 s, against ~0.3 s)."""
    cap = open_captures(files)
    try:
        select.apply(cap, selection)
        whole_packets = cap.packets.select("frame", "ts_ns")
        restrict_to_partition(cap, index, count)
        frames = decode_partition(cap, names)
        bucketed = decode_partition(cap, client_frames) if client_frames else None
        extra = then(cap, whole_packets) if then is not None else {}
    finally:
        cap.close()
    buckets = client_buckets(bucketed, count) if bucketed is not None else []
    if spill_dir is None:
        return frames, extra, buckets
    return (_spill(frames, spill_dir, f"{index}"), extra,
            [_spill(b, spill_dir, f"{index}-client{j}") for j, b in enumerate(buckets)])


def _spill(frames: dict[str, pl.DataFrame], spill_dir: str, stem: str) -> dict[str, str]:
    paths = {}
    for name, frame in frames.items():
        paths[name] = os.path.join(spill_dir, f"{stem}-{name}.arrow")
        frame.write_ipc(paths[name], compression="uncompressed")
    return paths


def _read_spilled(frames: dict) -> dict[str, pl.DataFrame]:
    """Frames as a task returned them: themselves, or the paths of their spilled files."""
    return {name: pl.read_ipc(f) if isinstance(f, str) else f for name, f in frames.items()}


def client_bucket_task(pieces: list[dict], conn_maps: list[pl.DataFrame], shared: dict, then) -> dict:
    """One task of the second stage: bucket ``j`` of every partition (``pieces``, in partition order),
    merged with the whole run's connection numbers (``conn_maps``), with the caller's ``shared``
    frames and facts (``frames``: interfaces, packets; ``path``, ``files``, ``pieces``, ``warnings``),
    handed to ``then(frame_set)``; returns what it returns (a dict of small frames)."""
    merged = merge_frames([_read_spilled(p) for p in pieces], conn_maps)
    facts = {k: v for k, v in shared.items() if k != "frames"}
    return then(FrameSet({**shared["frames"], **merged}, **facts))


def _part(result, k: int):
    return result[k]


def _bucket(result, j: int):
    return result[2][j]


def decode_frames(client, files: list[str], selection, names, *, local: bool, then=None,
                  client_frames: tuple[str, ...] = (), client_then=None, shared: dict | None = None
                  ) -> tuple[dict, dict]:
    """The frames ``names`` of the files, decoded partition by partition on ``client``'s cluster and
    merged: the same frames as a single process builds (``analyzer.partitions``); and the frames
    ``then`` made on each partition and ``client_then`` on each client bucket of ``client_frames``
    (:func:`client_bucket_task`, with ``shared``), each name's concatenated in partition, then bucket,
    order. ``local``: the workers share this machine's file system, so the frames come back through a
    temporary directory."""
    count = _threads(client)
    client_frames = tuple(client_frames) if client_then is not None else ()
    with contextlib.ExitStack() as stack:
        spill = stack.enter_context(tempfile.TemporaryDirectory(prefix="herdscope-")) if local else None
        decoded = [client.submit(decode_partition_task, list(files), selection, list(names), k, count, spill, then,
                                 client_frames, pure=False) for k in range(count)]
        heads = [client.submit(_part, d, 0, pure=False) for d in decoded]
        extras_of = [client.submit(_part, d, 1, pure=False) for d in decoded]
        try:
            parts = [_read_spilled(frames) for frames in client.gather(heads)]
            conn_maps = connection_maps(parts)
            found = client.gather(extras_of)
            if client_frames:
                bucketed = [client.submit(client_bucket_task,
                                          [client.submit(_bucket, d, j, pure=False) for d in decoded], conn_maps,
                                          shared or {}, client_then, pure=False) for j in range(count)]
                found += client.gather(bucketed)
        except _dask().KilledWorker as exc:
            raise ClusterFailure(f"a Dask worker died while decoding (out of memory?): {exc}") from exc
    extras: dict[str, list] = {}
    for extra in found:
        for name, frame in extra.items():
            extras.setdefault(name, []).append(frame)
    return merge_frames(parts, conn_maps), {name: pl.concat(frames) for name, frames in extras.items()}
