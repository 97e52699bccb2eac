"""Decoding on a Dask cluster: ``herdscope scan --workers N`` and ``--scheduler tcp://HOST:8786`` (and,
with :class:`InProcess` in the client's place, ``--partitions N`` in one process, the tasks in turn).

Each task opens the capture files, keeps one server partition of their packets
(``analyzer.partitions``: every packet to or from the partition's servers, so connections, flows and
per-server decoder state stay whole), runs TCP analysis and the decoders on it and sends back the
frames the detectors read; the caller merges them (:func:`analyzer.partitions.merge_frames`) into
exactly the frames a single process builds and runs the detectors on those. There are
:data:`PARTITIONS_PER_THREAD` partitions per worker thread unless ``--partitions`` says how many.

Dask is an optional extra (``pip install 'herdscope[distributed]'``): it is imported here only, when
one of the options is given. A local cluster has one thread per worker process, and each worker's
Polars and Numba are held to one thread, so N workers use N cores and do not oversubscribe them.
The caller reads the files once (it needs their packets for the report, and the partition of each
packet is decided over the whole capture); every worker then reads them again itself (from a path it
can open: on a remote cluster, shared storage), keeping only its partition's packets
(``analyzer.capture.ReadPart``), so a worker holds its part, not the whole.

Detectors that follow a client across its servers run in a second stage: each decoding task also
splits its connection frames into client buckets (``analyzer.partitions.client_buckets``), and one
task per bucket merges that bucket of every partition, with the whole run's connection numbers, and
runs them on it. The buckets go from task to task through Dask (or, on one machine, through files):
the caller receives neither them nor the connection frames they hold unless its own detectors read them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import tempfile
from collections.abc import Mapping

import click
import polars as pl

from .capture import ReadPart, open_captures
from .errors import ClusterFailure
from .kernels.silences import KEEP_EVERY_TIME, SPAN_ONLY_NS
from .mapped_frames import mapped, mapped_array
from .memory import POLARS_ALLOCATOR_ENV, worker_allocator_conf
from .packed_part import forget_ahead
from .packet_readers import build_packet_readers, narrow_after_readers
from .partitions import (MERGE_KEY_COLUMNS, TASK_KEPT_PACKET_COLUMNS, CallerChunks, FrameSet, client_buckets,
                         connection_maps, decode_partition, merge_columns, merge_frames, read_part, sharded_ids)
from .shards import MergedShards, shard_frames, source_columns, with_server_frames
from .threads import THREADS_ENV, at_most
from .wide_frames import columns_among

INSTALL_HINT = "pip install 'herdscope[distributed]' (Dask's distributed scheduler)"
# partitions per worker thread: a capture's servers are far from equal (on the 1M synth capture one
# server has 27% of the packets: dealt largest first, 2 partitions split it 50/50 and 4 at best 27/25/24/25),
# so with more partitions than threads Dask hands the next one to whichever worker is free, and each is
# smaller; but each partition walks every record of the files again. On the 10M synth capture, 2 workers
# (measured with servers hashed to partitions, before they were dealt largest first): 2 partitions 46.6 s
# and 3.6 GB in the largest worker, 4 partitions 44.6 s and 2.2 GB, 8 partitions 66.5 s and 2.2 GB.
PARTITIONS_PER_THREAD = 2
# how the partitions' frames are written for the merge (_spill): LZ4 takes the 10M synth capture's
# spilled frames from 1.27 to 0.33 GB for 0.4 s more writing (the scan 29.8 s against 30.3-33.1 s, the
# same peak); at 100M the uncompressed ones did not fit the 12 GB left beside the 63 GB capture
SPILL_COMPRESSION = "lz4"
# what a local worker's own thread pools are held to: one Dask thread, one core (Polars', Numba's, OpenMP's
# and the steps' of analyzer.threads; and Polars' allocator set as a command's for one core: worker_env)
WORKER_ENV = {"POLARS_MAX_THREADS": "1", "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", THREADS_ENV: "1"}


def worker_env() -> dict[str, str]:
    """:data:`WORKER_ENV` and Polars' allocator settings for a worker (``analyzer.memory.worker_allocator_conf``)."""
    return {**WORKER_ENV, POLARS_ALLOCATOR_ENV: worker_allocator_conf()}


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
                                     dashboard_address=None, silence_logs=logging.ERROR, env=worker_env())
    with local, distributed.Client(local) as client:
        yield client


class InProcess:
    """The calls :func:`decode_frames` makes of a Dask client, done at once in this process, one after
    the other: ``scan --partitions N`` without a cluster, which decodes the partitions in turn so that
    memory holds one partition's decoding at a time."""

    def submit(self, fn, *args, pure: bool = True):
        return _Done(fn(*(_resolved(a) for a in args)))

    def gather(self, done: list) -> list:
        return [d.value for d in done]

    def scatter(self, data, broadcast: bool = False):
        return data


@dataclasses.dataclass
class _Done:
    value: object


def _resolved(arg):
    if isinstance(arg, _Done):
        return arg.value
    if isinstance(arg, list):
        return [_resolved(a) for a in arg]
    return arg


def _threads(client) -> int:
    if isinstance(client, InProcess):
        return 1
    info = client.scheduler_info(n_workers=-1)  # every worker (the default lists only the first five)
    return max(1, sum(w.get("nthreads", 1) for w in info["workers"].values()))


def decode_partition_task(part: ReadPart, ids, names: list[str], count: int, spill_dir: str | None = None,
                          then=None, client_frames: tuple[str, ...] = (), task_frames: tuple[str, ...] = (),
                          task_packet_columns: tuple[str, ...] | None = None,
                          frame_columns: dict[str, tuple[str, ...]] | None = None,
                          caller_columns: dict[str, tuple[str, ...]] | None = None, hand_over=None):
    """One task: the frames ``names`` of partition ``part.index`` of ``count`` (its packets alone read
    from the files, ``ids`` saying which: :func:`analyzer.partitions.partition_ids`), and what
    ``then(capture, whole_packets)`` returns (a dict of small frames, e.g. the findings of detectors
    run on the partition; sent back as they are), as ``(frames, then's, buckets)``: ``buckets`` is the
    partition's ``client_frames`` split into ``count`` client buckets (empty without them). With
    ``spill_dir`` the frames and buckets are written there as Arrow IPC files and their paths
    returned: on one machine that is several times faster than sending them through the cluster's
    sockets (171 MB of frames of 1M packets: ~3.5 s, against ~0.3 s). ``task_packet_columns``: what
    the task reads of the partition's packets once what reads the others is built for ``names``,
    ``client_frames`` and ``task_frames`` (``then``'s frames; ``analyzer.packet_readers``), besides
    what the task itself keeps (``partitions.TASK_KEPT_PACKET_COLUMNS``): the rest is freed before the
    decoders run (None: nothing is); ``frame_columns``: frame -> the columns of it anything reads once
    what is built from it is, besides the merge's keys (``partitions.MERGE_KEY_COLUMNS``): the packet
    readers' frames (``tcp_segments``) are narrowed to them then too (a frame not named is kept whole);
    ``caller_columns``: of the frames ``names``, what the caller reads of them once merged: what is sent
    of such a frame is those and what the merge reads (``partitions.merge_columns``), the partition's
    own frame (what ``then`` reads) left whole. ``hand_over(capture)``, on a shard of a cut server: the
    frames it hands to its server's task (:func:`server_task`), returned fourth with the whole
    capture's packet times as ``packets`` (None elsewhere)."""
    cap = open_captures([p for p, _, _ in part.pieces], part=dataclasses.replace(part, ids=ids))
    try:
        if task_packet_columns is not None:
            # connections too: decode_partition hands over its conn map whatever the frames asked
            kept = {name: tuple(dict.fromkeys((*MERGE_KEY_COLUMNS, *columns)))
                    for name, columns in (frame_columns or {}).items()}
            build_packet_readers(cap, (*names, *client_frames, *task_frames, "connections"), kept)
            narrow_after_readers(cap, tuple(dict.fromkeys((*TASK_KEPT_PACKET_COLUMNS, *task_packet_columns))),
                                 kept)
        frames = decode_partition(cap, names)
        for name, wanted in (caller_columns or {}).items():
            if name in frames:
                frames[name] = frames[name].select(merge_columns(name, frames[name], wanted))
        bucketed = decode_partition(cap, client_frames) if client_frames else None
        handed = None
        if hand_over is not None:
            handed = {**hand_over(cap), "packets": cap.whole_times}
            if spill_dir is not None:  # written before then's detectors run beside it
                handed = _spill(handed, spill_dir, f"{part.index}-shard")
        extra = then(cap, cap.whole_times) if then is not None else {}
    finally:
        cap.close()
    buckets = client_buckets(bucketed, count) if bucketed is not None else []
    if spill_dir is None:
        return frames, extra, buckets, handed
    return (_spill(frames, spill_dir, f"{part.index}"), extra,
            [_spill(b, spill_dir, f"{part.index}-client{j}") for j, b in enumerate(buckets)], handed)


def _spill(frames: dict[str, pl.DataFrame], spill_dir: str, stem: str) -> dict[str, str]:
    """``frames`` written to ``spill_dir`` (Arrow IPC, LZ4: SPILL_COMPRESSION), their paths by name; a
    full disk is said as such (ClusterFailure, exit 4), not as a bug."""
    paths = {}
    for name, frame in frames.items():
        paths[name] = os.path.join(spill_dir, f"{stem}-{name}.arrow")
        try:
            frame.write_ipc(paths[name], compression=SPILL_COMPRESSION)
        except OSError as exc:
            if exc.errno != errno.ENOSPC and "No space left" not in str(exc):  # Polars' OSError has no errno
                raise
            raise ClusterFailure(f"no space left in {spill_dir} for the partitions' frames (the temporary "
                                 f"directory: set TMPDIR to a larger disk)") from exc
    return paths


class _Spilled(Mapping):
    """Frames as a task returned them (themselves, or the paths of their spilled files), each read from
    its file when asked for and held by no one here: a merge (``analyzer.partitions.merge_frames``) then
    holds one frame of every part at a time, not every frame of every part from the start."""

    def __init__(self, frames: dict):
        self._frames = frames

    def __getitem__(self, name: str) -> pl.DataFrame:
        frame = self._frames[name]
        return pl.read_ipc(frame) if isinstance(frame, str) else frame

    def __contains__(self, name) -> bool:  # Mapping's would read the frame
        return name in self._frames

    def __iter__(self):
        return iter(self._frames)

    def __len__(self) -> int:
        return len(self._frames)


def client_bucket_task(pieces: list[dict], conn_maps: list[pl.DataFrame], shared: dict, then) -> dict:
    """One task of the second stage: bucket ``j`` of every partition (``pieces``, in partition order),
    merged with the whole run's connection numbers (``conn_maps``), with the caller's ``shared``
    frames and facts (``frames``: interfaces, packets; ``path``, ``files``, ``pieces``, ``warnings``),
    handed to ``then(frame_set)``; returns what it returns (a dict of small frames)."""
    merged = merge_frames([_Spilled(p) for p in pieces], conn_maps)
    facts = {k: v for k, v in shared.items() if k != "frames"}
    return then(FrameSet({**shared["frames"], **merged}, **facts))


def server_task(shards: list[dict], conn_maps: list[pl.DataFrame], names, shared: dict, then) -> dict:
    """One task of the second stage for a server cut into shards (``analyzer.shards``): the
    frames its shards handed over (``hand_over`` of :func:`decode_partition_task`), merged with the
    whole run's connection numbers (``conn_maps``, the shards' partitions') into the frames ``names``
    its partition whole would have built (or frame -> the columns read of it), each when first read
    (:class:`~analyzer.shards.MergedShards`),
    with the whole capture's packet times (the same in each shard) and the caller's ``shared`` frames and
    facts, handed to ``then(frame_set)``; returns what it returns (a dict of small frames)."""
    frames = {**shared["frames"], "packets": _Spilled(shards[0])["packets"]}
    facts = {k: v for k, v in shared.items() if k != "frames"}
    return then(MergedShards([_Spilled({n: f for n, f in s.items() if n != "packets"}) for s in shards], conn_maps,
                             names, frames, **facts))


def _part(result, k: int):
    return result[k]


def _bucket(result, j: int):
    return result[2][j]


def partition_count(client, partitions: int | None) -> int:
    """How many partitions :func:`decode_frames` decodes in on ``client``: ``partitions``, or by default
    :data:`PARTITIONS_PER_THREAD` per worker thread."""
    return partitions or _threads(client) * PARTITIONS_PER_THREAD


def decode_frames(client, cap, names, *, local: bool, then=None, client_frames: tuple[str, ...] = (),
                  client_then=None, shared: dict | None = None, packet_columns: tuple[str, ...] | None = None,
                  partitions: int | None = None, silence_ns: int | None = KEEP_EVERY_TIME,
                  task_frames: tuple[str, ...] = (), task_packet_columns: tuple[str, ...] | None = None,
                  frame_columns: dict[str, tuple[str, ...]] | None = None,
                  caller_columns: dict[str, tuple[str, ...]] | None = None,
                  caller_silence_ns: int | None = KEEP_EVERY_TIME, shards: bool = False, shard_then=None,
                  hand_over=None, server_then=None, server_frames=(), whole_times: bool | None = None
                  ) -> tuple[dict, dict]:
    """The frames ``names`` of ``cap`` (read whole here, its selection applied), decoded partition by
    partition on ``client``'s cluster, each worker reading its partition's packets alone from the
    files, and merged: the same frames as a single process builds (``analyzer.partitions``); and the
    frames ``then`` made on each partition and ``client_then`` on each client bucket of
    ``client_frames`` (:func:`client_bucket_task`, with ``shared``), each name's concatenated in
    partition, then bucket, order. ``local``: the workers share this machine's file system, so the
    frames come back through a temporary directory. ``packet_columns``: what the caller still reads of
    ``cap.packets`` once the partitions are decided (the rest is freed while the workers decode,
    ``Capture.release``: nothing more is built from ``cap``; the merged frames are set on it).
    ``partitions``: how many (default :data:`PARTITIONS_PER_THREAD` per worker thread). ``silence_ns``:
    what ``then`` reads of the whole capture's packet times (:func:`analyzer.partitions.read_part`; by
    default every one); ``whole_times`` False: ``then`` reads none of them, and no task reads them (by
    default they are read where ``then``, ``shard_then`` or ``hand_over`` is given: every one, frame and
    time, is 1.6 GB in each task at 100M packets). ``task_frames`` and ``task_packet_columns``: the frames
    ``then`` builds and what a task reads of its partition's packets beyond what builds the frames, and
    ``frame_columns`` what anything reads of the frames named, and ``caller_columns`` what the caller
    reads of the merged frames named (those alone are merged and returned, and of a server-state frame's
    sources what its builder reads besides: ``shards.source_columns``; :func:`decode_partition_task`).
    Each merged frame is mapped out of memory as soon as it is merged (``mapped_frames.mapped``).
    ``caller_silence_ns``: with ``packet_columns``, what the caller then keeps of ``cap.packets``, the
    span and silences this long (``Capture.thin_packets``; None: every row). Of a capture read through
    ``analyzer.partitions.CallerChunks`` the caller keeps what that kept, and neither applies.
    ``shards``, ``shard_then``, ``hand_over``, ``server_then`` and ``server_frames``: given (one of the
    first three), a server with more than an even share of the packets is cut by client into shards,
    each a partition of its own (``analyzer.shards``), where ``shard_then`` runs instead
    of ``then`` and ``hand_over(capture)`` makes what ``server_then(frame_set)`` reads of the server
    whole, ``server_frames`` (:func:`server_task`; or frame -> the columns read of it,
    ``detectors.server_read_columns``); ``then`` runs on the other partitions. The frames
    of ``names`` that a server's state across its clients decides (``shards.SERVER_STATE_FRAMES``)
    are then built here on their sources merged (``shards.with_server_frames``).
    ``client`` may be :class:`InProcess`."""
    count = partition_count(client, partitions)
    client_frames = tuple(client_frames) if client_then is not None else ()
    ids, groups = sharded_ids(cap, count, shards or shard_then is not None or hand_over is not None)
    ids = mapped_array(ids)  # read by every partition, 2 bytes a packet: not in the caller's memory
    in_shard = {k for g in groups for k in g}
    asked = list(names)
    if groups:  # what a server's state across its clients decides is built here, on the merged sources
        names = list(shard_frames(names))
    # what the tasks send and the merge reads: what the caller reads, and of a server-state frame's
    # sources what its builder reads too
    sent_columns = source_columns(asked, caller_columns) if groups and caller_columns is not None else caller_columns
    # a worker elsewhere has not the caller's record index (its temporary directory): it walks the files
    reads = [read_part(cap, None, k, silence_ns) for k in range(count + len(in_shard))]
    if whole_times is False or (whole_times is None and then is None and shard_then is None and hand_over is None):
        reads = [dataclasses.replace(r, whole_times=False, silence_ns=SPAN_ONLY_NS) for r in reads]
    if not local:
        reads = [dataclasses.replace(r, record_index=None) for r in reads]
    elif isinstance(client, InProcess):  # read in turn: each part's copy can be made in an earlier one's pass
        reads = [dataclasses.replace(r, following=tuple(range(k + 1, len(reads)))) for k, r in enumerate(reads)]
    if packet_columns is not None and not isinstance(cap.reduction, CallerChunks):  # it kept only what it keeps
        cap.release((), packet_columns)
        if caller_silence_ns is not KEEP_EVERY_TIME:
            cap.thin_packets(caller_silence_ns)
    cap.forget_pages()  # the partitions map the files again; these pages come back if read
    ids = client.scatter(ids, broadcast=True)
    with contextlib.ExitStack() as stack:
        spill = stack.enter_context(tempfile.TemporaryDirectory(prefix="herdscope-")) if local else None
        stack.callback(forget_ahead)  # copies made ahead for parts that did not run (an error)
        decoded = [client.submit(decode_partition_task, reads[k], ids, list(names), count, spill,
                                 shard_then if k in in_shard else then, client_frames, tuple(task_frames),
                                 task_packet_columns, frame_columns, sent_columns,
                                 hand_over if k in in_shard else None, pure=False)
                   for k in range(len(reads))]
        del ids  # every partition has it (done, in this process): 2 bytes a packet not held through what follows
        heads = [client.submit(_part, d, 0, pure=False) for d in decoded]
        extras_of = [client.submit(_part, d, 1, pure=False) for d in decoded]
        try:
            parts = [_Spilled(frames) for frames in client.gather(heads)]  # read as they are merged
            conn_maps = connection_maps(parts)
            found = client.gather(extras_of)
            if hand_over is not None and groups:
                servers = [client.submit(server_task, [client.submit(_part, decoded[k], 3, pure=False) for k in g],
                                         [conn_maps[k] for k in g], server_frames, shared or {}, server_then,
                                         pure=False) for g in groups]
                found += client.gather(servers)
            if client_frames:
                bucketed = [client.submit(client_bucket_task,
                                          [client.submit(_bucket, d, j, pure=False) for d in decoded], conn_maps,
                                          shared or {}, client_then, pure=False) for j in range(count)]
                found += client.gather(bucketed)
        except Exception as exc:
            if not isinstance(client, InProcess) and isinstance(exc, _dask().KilledWorker):
                raise ClusterFailure(f"a Dask worker died while decoding (out of memory?): {exc}") from exc
            raise
        # before the spilled files go; each merged frame is held to the end of the run, so out of memory
        # as soon as it is merged: on the 100M synth capture, stats' merged frames held at once were 7.2 GB
        merged = merge_frames(parts, conn_maps, then=lambda name, frame: mapped(frame))
    if groups:  # the server-state frames built here are mapped in turn
        merged = {name: frame if name in names else mapped(frame)
                  for name, frame in with_server_frames(merged, asked).items()}
    for name, wanted in (caller_columns or {}).items():
        if name in merged:
            merged[name] = columns_among(merged[name], wanted)
    extras: dict[str, list] = {}
    for extra in found:
        for name, frame in extra.items():
            extras.setdefault(name, []).append(frame)
    return merged, {name: pl.concat(frames) for name, frames in extras.items()}


def decode_into(client, cap, names, *, local: bool = True, **options) -> dict[str, pl.DataFrame]:
    """:func:`decode_frames` with the merged frames set on ``cap`` (which then answers for them as if
    it had built them); returns what ``then`` and ``client_then`` made, by name. ``client`` None: the
    partitions in turn in this process (:class:`InProcess`), each one step at a time
    (``analyzer.threads.at_most``: the partitions bound the memory)."""
    with at_most(1):
        frames, found = decode_frames(client or InProcess(), cap, names, local=local, **options)
    for name, frame in frames.items():
        cap.set_frame(name, frame)
    return found
