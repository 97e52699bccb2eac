"""A stand-in for ``analyzer.Capture`` holding hand-made frames, for detector tests on tiny
constructed inputs (Zeek's policy-test habit: a few rows, a lowered threshold, an expected finding)."""
from __future__ import annotations

import numpy as np
import polars as pl


class FakeCapture:
    """``frame(name)`` returns the frames given; ``interfaces`` defaults to one ns-resolution iface."""

    def __init__(self, path: str = "fake.pcap", resolution_ns: float = 1.0, **frames: pl.DataFrame):
        self.path = path
        self.files = [path]
        self._frames = dict(frames)
        self._frames.setdefault("interfaces", pl.DataFrame({
            "iface": [0], "section": [0], "linktype": [1], "snaplen": [0], "ts_resolution_ns": [resolution_ns],
            "ts_offset_s": [0], "name": [None], "linktype_name": ["Ethernet"]},
            schema_overrides={"iface": pl.UInt16, "section": pl.UInt16, "linktype": pl.Int32,
                              "snaplen": pl.UInt32, "name": pl.String}))
        self.buf = np.zeros(0, np.uint8)

    @property
    def packets(self) -> pl.DataFrame:
        return self._frames.get("packets", pl.DataFrame({"frame": [], "ts_ns": []},
                                                        schema={"frame": pl.UInt32, "ts_ns": pl.Int64}))

    def frame(self, name: str) -> pl.DataFrame:
        if name not in self._frames:
            raise KeyError(f"FakeCapture has no frame {name!r}; give it one")
        return self._frames[name]

    def set_frame(self, name: str, frame: pl.DataFrame) -> None:
        self._frames[name] = frame

    def close(self) -> None:
        pass
