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

# frame name -> function(capture) -> DataFrame. Later layers register theirs at import time.
FRAME_BUILDERS: dict[str, Callable[["Capture"], pl.DataFrame]] = {}


def frame_builder(name: str):
    """Decorator: register the function that builds frame ``name`` from a Capture."""
    def register(fn):
        FRAME_BUILDERS[name] = fn
        return fn
    return register


class Capture:
    """A capture file read into frames. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike, *, chunk_records: int = DEFAULT_CHUNK_RECORDS,
                 progress: bool | None = None):
        self.path = os.fspath(path)
        data, tables = read_tables(self.path, chunk_records=chunk_records, progress=progress)
        self._data: CaptureBytes = data
        self._tables: PacketTables = tables
        self._frames: dict[str, pl.DataFrame] = {
            "packets": tables.packets, "tcp_sack": tables.tcp_sack,
            "icmp_errors": tables.icmp_errors, "interfaces": tables.interfaces,
        }

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
            builder = FRAME_BUILDERS.get(name)
            if builder is None:
                raise KeyError(f"no frame named {name!r}; known: {', '.join(self.frame_names())}")
            self._frames[name] = builder(self)
        return self._frames[name]

    def set_frame(self, name: str, frame: pl.DataFrame) -> None:
        self._frames[name] = frame

    def frame_names(self) -> list[str]:
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
