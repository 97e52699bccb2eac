"""The ``Capture``: one capture file's bytes and the named frames derived from it.

Frames are computed on first use and kept: ``cap.packets`` reads the file; later layers (TCP
analysis, decoders) add their frames through :meth:`Capture.frame` and a registry of builders, so a
detector asks for ``cap.frame("dns_transactions")`` without knowing what it takes to build it.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import polars as pl

from .ingest import DEFAULT_CHUNK_RECORDS, PacketTables, ReadReport, read_tables
from .source import CaptureBytes

# frame name -> function(capture) -> DataFrame. Later layers register theirs at import time; they are
# imported on the first request for a frame the reader does not make, so reading only packets (export
# --frames packets) pays for neither their import nor their Numba cache loading.
FRAME_BUILDERS: dict[str, Callable[["Capture"], pl.DataFrame]] = {}
_BUILDER_MODULES = ("analyzer.tcp", "analyzer.decoders.registry")


def _load_builders() -> None:
    import importlib

    for module in _BUILDER_MODULES:
        importlib.import_module(module)


def frame_builder(name: str):
    """Decorator: register the function that builds frame ``name`` from a Capture."""
    def register(fn):
        FRAME_BUILDERS[name] = fn
        return fn
    return register


class Capture:
    """A capture file read into frames. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike, *, chunk_records: int = DEFAULT_CHUNK_RECORDS,
                 progress: bool | None = None, _parts=None):
        self.path = os.fspath(path)
        if _parts is None:
            data, tables = read_tables(self.path, chunk_records=chunk_records, progress=progress)
        else:
            data, tables = _parts
        self._data: CaptureBytes = data
        self._tables: PacketTables = tables
        self._frames: dict[str, pl.DataFrame] = {
            "packets": tables.packets, "tcp_sack": tables.tcp_sack,
            "icmp_errors": tables.icmp_errors, "interfaces": tables.interfaces,
        }
        self._memo: dict[str, object] = {}  # intermediate tables shared by builders (not frames)
        self.reports: list[tuple[str, ReadReport]] = [(self.path, tables.report)]
        self.files: list[str] = [self.path]

    # -- bytes ---------------------------------------------------------------------------------
    @property
    def buf(self) -> np.ndarray:
        """The capture's bytes (uint8, read-only); ``payload_offset`` columns index into it."""
        return self._data.buf

    def bytes_at(self, offset: int, length: int) -> bytes:
        end = min(len(self.buf), offset + max(0, length))
        return bytes(self.buf[offset:end])

    # -- frames --------------------------------------------------------------------------------
    @property
    def packets(self) -> pl.DataFrame:
        return self._frames["packets"]

    @property
    def report(self) -> ReadReport:
        return self._tables.report

    @property
    def file_format(self):
        return self._tables.format

    @property
    def section_info(self) -> dict[str, str]:
        return self._tables.section_info

    def frame(self, name: str) -> pl.DataFrame:
        """A named frame, built on first request."""
        if name not in self._frames:
            if name not in FRAME_BUILDERS:
                _load_builders()
            builder = FRAME_BUILDERS.get(name)
            if builder is None:
                raise KeyError(f"no frame named {name!r}; known: {', '.join(self.frame_names())}")
            self._frames[name] = builder(self)
        return self._frames[name]

    def memo(self, key: str, build: Callable[[], object]):
        """An intermediate result built once per capture (e.g. the TCP payload segments every framing
        starts from); not a frame, so export and frame_names() do not see it."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def set_frame(self, name: str, frame: pl.DataFrame) -> None:
        self._frames[name] = frame

    def frame_names(self) -> list[str]:
        _load_builders()
        return sorted(set(self._frames) | set(FRAME_BUILDERS))

    def built_frames(self) -> dict[str, pl.DataFrame]:
        return dict(self._frames)

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        self._data.close()

    def __enter__(self) -> "Capture":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Capture({self.path!r}, {self.packets.height} packets, {self.report.format})"


def open_capture(path: str | os.PathLike, **options) -> Capture:
    """Read ``path`` (pcap, pcapng, optionally gzip-compressed) into a :class:`Capture`."""
    return Capture(path, **options)


def _merge_enum(frames: list[pl.DataFrame], columns: tuple[str, ...]) -> list[pl.DataFrame]:
    texts = set()
    for f in frames:
        for c in columns:
            texts.update(v for v in f[c].cast(pl.String).unique().to_list() if v is not None)
    enum = pl.Enum(sorted(texts))
    return [f.with_columns(pl.col(c).cast(pl.String).cast(enum) for c in columns) for f in frames]


def open_captures(paths: list[str | os.PathLike], **options) -> Capture:
    """Several files read as one capture: the pieces of a ring buffer, joined in time order.

    Frame numbers run on across files as in the output of ``mergecap -a`` on the files in this order;
    payload offsets index one buffer holding the files' bytes one after the other (a copy).
    """
    caps = [open_capture(p, **options) for p in paths]
    if len(caps) == 1:
        return caps[0]
    caps.sort(key=lambda c: (c.packets["ts_ns"].min() if c.packets.height else 0) or 0)
    frame_base, buf_base, iface_base = 0, 0, 0
    packets, sacks, icmps, ifaces = [], [], [], []
    for k, c in enumerate(caps):
        p = c.packets
        packets.append(p.with_columns(pl.col("frame") + frame_base, pl.col("payload_offset") + buf_base,
                                      pl.col("iface") + iface_base))
        sacks.append(c.frame("tcp_sack").with_columns(pl.col("frame") + frame_base))
        icmps.append(c.frame("icmp_errors").with_columns(pl.col("frame") + frame_base))
        ifaces.append(c.frame("interfaces").with_columns(pl.col("iface") + iface_base))
        frame_base += p.height
        buf_base += len(c.buf)
        iface_base += c.frame("interfaces").height
    packets = pl.concat(_merge_enum(packets, ("src", "dst")))
    icmps = pl.concat(_merge_enum(icmps, ("inner_src", "inner_dst")))
    buf = np.concatenate([c.buf for c in caps])
    first = caps[0]
    report = ReadReport(format=" + ".join(c.report.format for c in caps), records=packets.height,
                        counts={}, parse_status={})
    for c in caps:
        for key, n in c.report.counts.items():
            report.counts[key] = report.counts.get(key, 0) + n
        for key, n in c.report.parse_status.items():
            report.parse_status[key] = report.parse_status.get(key, 0) + n
    tables = PacketTables(packets, pl.concat(sacks), icmps, pl.concat(ifaces), report, first.file_format,
                          first.section_info)
    data = CaptureBytes("+".join(c.path for c in caps), buf, False, sum(c._data.file_size for c in caps))
    merged = Capture(data.path, _parts=(data, tables))
    merged.reports = [(c.path, c.report) for c in caps]
    merged.files = [c.path for c in caps]
    for c in caps:
        c.close()
    return merged
