"""A big server cut into shards of its clients: what its shards hand over and what its task merges.

A server's partition (``analyzer.partitions``) holds every packet of that server, so one large server
(on the synth captures the file server has 26% of the packets) sets the memory of a scan in
partitions whatever their count: 8.3 GiB for its 25.8M packets of a 100M capture. A server with more
than an even share of the packets is therefore cut by client: its address pairs dealt largest first
into as many shards as hold its packets at that share, each shard a partition of its own
(``analyzer.partitions.PartitionDecision.dealt``). Every frame of a connection, flow or
request/response pair is the same decoded on a shard; what is not is what the server's state across
its clients decides (:data:`SERVER_STATE_FRAMES`, ``Protocol.server_frames``), and what a detector
that looks at every client of a server finds. So a shard runs only the detectors whose findings are
per connection (``SHARDS``, detectors/base.py), and hands over what the others read
(:func:`shard_frames`: the server-state frames replaced by what they are built of;
``detectors.hand_over`` narrows each to what is read). A task per cut server
(``analyzer.distributed.server_task``) merges its shards' frames as its detectors read them
(:class:`MergedShards`, the server-state frames built anew on them) and runs those detectors on what
its whole partition would have built: it holds those frames, not the server's decoding. A run that
merges frames for its caller from partitions some of which are shards builds the server-state
frames there (:func:`with_server_frames`).
"""
from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from .capture import builder_of
from .decoders.registry import protocols
from .mapped_frames import mapped
from .partitions import FrameSet, merge_frames
from .wide_frames import columns_among

# frames whose rows a server's state across its clients decides -> the frames they are built of alone
# (``Protocol.server_frames``; module doc): a server cut into shards builds them on its merged shards
SERVER_STATE_FRAMES: dict[str, tuple[str, ...]] = {k: v for p in protocols() for k, v in p.server_frames.items()}
# of those frames' sources, the columns their builders read (``Protocol.server_frame_columns``; others: whole)
SERVER_STATE_COLUMNS: dict[str, tuple[str, ...]] = {k: v for p in protocols()
                                                    for k, v in p.server_frame_columns.items()}


def shard_frames(names) -> tuple[str, ...]:
    """What the shards of a cut server hand over for ``names`` to be read of the server whole
    (:class:`MergedShards`): ``names``, those of :data:`SERVER_STATE_FRAMES` replaced by what they are
    built of."""
    out: dict[str, None] = {}
    for name in names:
        out.update(dict.fromkeys(SERVER_STATE_FRAMES.get(name, (name,))))
    return tuple(out)


def source_columns(names, columns: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Of :func:`shard_frames` of ``names``, what to merge when the frames ``names`` are read only
    ``columns`` (frame -> the columns read of it; a frame not in it is read whole): a frame's own, and of
    a source of a frame of :data:`SERVER_STATE_FRAMES` what its builder reads besides
    (:data:`SERVER_STATE_COLUMNS`; a source whose builder does not say is merged whole, as is one that is
    asked for and read whole)."""
    whole = {name for name in names if name not in columns}
    out = {name: set(columns[name]) for name in names if name in columns}
    for name in names:
        for source in SERVER_STATE_FRAMES.get(name, ()):
            if source not in SERVER_STATE_COLUMNS:
                whole.add(source)
            elif source not in whole:
                out[source] = out.get(source, set()) | set(SERVER_STATE_COLUMNS[source])
    return {name: tuple(sorted(kept)) for name, kept in out.items() if name not in whole}


def with_server_frames(merged: dict[str, pl.DataFrame], names) -> dict[str, pl.DataFrame]:
    """The frames ``names`` of a run whose partitions sent :func:`shard_frames` of them, ``merged``: those
    of :data:`SERVER_STATE_FRAMES` built on their sources (their builders read frames alone), the
    sources not asked for let go of."""
    frames = FrameSet(merged, path="", files=(), pieces=())
    for name in names:
        if name in SERVER_STATE_FRAMES:
            frames.set_frame(name, builder_of(name)(frames))
    return {name: frames.frame(name) for name in names}


class MergedShards(FrameSet):
    """The frames ``names`` of a server cut into ``shards`` (module doc; each shard's
    :func:`decode_partition` of :func:`shard_frames`, read when asked for, with the shards' ``conn_maps``
    over every partition, :func:`connection_maps`), each merged when first asked for
    (:func:`merge_frames`) and those of :data:`SERVER_STATE_FRAMES` built anew on the merged frames
    (their builders read frames alone), besides the ``frames`` given: what its partition whole would
    have built. A frame is merged when a detector first reads it and let go of after the last
    (``drop``), so the task holds what the detectors still read, not every frame from the start (the
    DNS server's of the 10M synth capture cut in 3: merged at once, 470 MB before its detectors ran).
    ``names`` may map each frame to the columns its readers read (None: all): a server-state frame's
    source that they read too is narrowed to those once the frame is built (the file server's
    ``smb2_messages``: its breaks' builder reads 21 columns (47 before), ``saturation`` then 8; at 10x the 10M
    capture's, ~700 MB held through the break queue's detection for nothing)."""

    def __init__(self, shards: list, conn_maps: list[pl.DataFrame], names, frames: dict[str, pl.DataFrame], **facts):
        super().__init__(frames, **facts)
        self._shards, self._conn_maps = shards, conn_maps
        self._columns = dict(names) if isinstance(names, Mapping) else dict.fromkeys(names)
        self._names = frozenset(self._columns)

    def frame(self, name: str) -> pl.DataFrame:
        if name not in self._frames and name in self._names:
            self._frames[name] = mapped(self._built(name))
        return super().frame(name)

    def _merged(self, names) -> dict[str, pl.DataFrame]:
        """The frames ``names`` merged over the shards."""
        return merge_frames(self._shards, self._conn_maps, only=tuple(names))

    def _built(self, name: str) -> pl.DataFrame:
        if name not in SERVER_STATE_FRAMES:
            return self._merged((name,))[name]
        sources = SERVER_STATE_FRAMES[name]
        fresh = [s for s in sources if s not in self._frames]
        self._frames.update(self._merged(fresh))
        try:
            return builder_of(name)(self)
        finally:  # what no detector reads besides is not kept, and of the rest what they read
            self.drop([s for s in fresh if s not in self._names])
            for source in fresh:
                if source in self._frames:
                    kept = self._frames[source]
                    if self._columns.get(source) is not None:
                        kept = columns_among(kept, self._columns[source])
                    self._frames[source] = mapped(kept)
