"""What a shard of a server cut by client hands over for the detectors that run on the shards merged,
and what the server's task keeps of the frames it merges (``analyzer.shards``): the frames those
detectors read, each narrowed to the columns and rows its readers declare (COLUMNS, ROWS: base.py)."""
from __future__ import annotations

import polars as pl

from analyzer.capture import READER_FRAMES
from analyzer.narrowing import build_frames
from analyzer.partitions import decode_partition, merge_columns
from analyzer.shards import SERVER_STATE_COLUMNS, SERVER_STATE_FRAMES, shard_frames

from . import available, declared_columns, required_frames
from .base import rows_among


def server_frames(names: list[str]) -> tuple[str, ...]:
    """The frames detectors ``names`` read of a cut server's merged shards (``analyzer.shards``): what
    they require but the reader's frames (``packets``: the whole capture's times,
    ``interfaces``: the caller's)."""
    return tuple(n for n in required_frames(names) if n not in READER_FRAMES)


def server_read_columns(names: list[str]) -> dict[str, tuple[str, ...] | None]:
    """:func:`server_frames` of detectors ``names``, each with the columns they read of it
    (:func:`declared_columns`; None: all of it): what a cut server's task keeps of a frame it merged
    to build another (``analyzer.shards.MergedShards``)."""
    readers = [available()[n] for n in names]
    return {frame: None if (c := declared_columns(readers, frame)) is None else tuple(sorted(c))
            for frame in server_frames(names)}


def hand_over(capture, names: list[str]) -> dict[str, pl.DataFrame]:
    """What one shard ``capture`` of a server cut by client hands over for detectors ``names`` to run on
    the shards merged (``analyzer.shards.MergedShards``): :func:`server_frames`, the frames a
    server's state decides replaced by what they are built of (``shards.shard_frames``), each
    narrowed to the columns its readers declare and the merge's (``partitions.merge_columns``; of a
    server-state frame's sources, what its builder reads besides: :func:`_handed_columns`) and to the
    rows they declare (``ROWS``, :func:`_handed_rows`); and of ``tcp_segments`` the rows of the
    connections that no TCP transaction covers in the frames every reader of it names in
    ``UNCOVERED_SEGMENTS`` (base.py; all of them when one names none). A connection is whole in one
    shard, so what covers it is too. On the 10M synth capture in 16 partitions, the DNS server's
    shards hand over 600 of its 1.45M ``dns_messages`` rows (the re-sent queries), in 15 of their 45
    columns."""
    detectors = available()
    readers = [detectors[n] for n in names]
    read_frames = server_frames(names)
    wanted = shard_frames(read_frames)
    build_frames(capture, wanted)
    out = decode_partition(capture, wanted)
    for name in wanted:
        rows = _handed_rows(name, readers, read_frames)
        if rows is not None:
            out[name] = rows_among(out[name], rows)
        columns = _handed_columns(name, readers, read_frames)
        if columns is not None:
            out[name] = out[name].select(merge_columns(name, out[name], columns))
    if "tcp_segments" in out:
        out["tcp_segments"] = _uncovered_segments(capture, out["tcp_segments"], readers)
    return out


def _handed_columns(name: str, readers: list, read_frames: tuple[str, ...]) -> frozenset[str] | None:
    """What :func:`hand_over` keeps of frame ``name`` (None: all of it): what its readers among
    ``readers`` declare, and where it is a source of a server-state frame among ``read_frames``,
    what that frame's builder reads of it (``shards.SERVER_STATE_COLUMNS``; None if it reads it whole)."""
    read = any(name in m.REQUIRES for m in readers)
    declared = declared_columns(readers, name)
    if read and declared is None:
        return None
    columns = set(declared or ())
    if _builds_of(name, read_frames):
        if name not in SERVER_STATE_COLUMNS:
            return None
        columns |= set(SERVER_STATE_COLUMNS[name])
    return frozenset(columns)


def _handed_rows(name: str, readers: list, read_frames: tuple[str, ...]) -> pl.Expr | None:
    """Of frame ``name``, the rows :func:`hand_over` keeps (None: all of them): those any of its readers
    among ``readers`` declares in ``ROWS``, when every one of them declares some and no server-state
    frame among ``read_frames`` is built of it (its builder reads every row)."""
    declared = [getattr(m, "ROWS", {}).get(name) for m in readers if name in m.REQUIRES]
    if not declared or any(rows is None for rows in declared):
        return None
    if _builds_of(name, read_frames):
        return None
    return pl.any_horizontal(declared) if len(declared) > 1 else declared[0]


def _builds_of(name: str, read_frames: tuple[str, ...]) -> list[str]:
    """The server-state frames among ``read_frames`` built of frame ``name`` (``shards.SERVER_STATE_FRAMES``)."""
    return [built for built, sources in SERVER_STATE_FRAMES.items() if name in sources and built in read_frames]


def _uncovered_segments(capture, segments: pl.DataFrame, readers: list) -> pl.DataFrame:
    """Of ``segments``, what :func:`hand_over` keeps: the rows of connections no TCP transaction covers in
    every frame its readers name in ``UNCOVERED_SEGMENTS``."""
    named = [getattr(m, "UNCOVERED_SEGMENTS", None) for m in readers if "tcp_segments" in m.REQUIRES]
    if not named or any(n is None for n in named):
        return segments
    covering = set.intersection(*(set(n) for n in named))
    covered = [capture.frame(f).filter(pl.col("transport").cast(pl.String) == "tcp")
               .select(pl.col("flow").cast(segments.schema["conn"]).alias("conn")) for f in sorted(covering)]
    if not covered:
        return segments
    return segments.join(pl.concat(covered).unique(), on="conn", how="anti", maintain_order="left")
