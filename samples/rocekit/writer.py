"""Output: the capture (through ``samples/synthkit/writer.write_capture``: one pcap/pcapng writer for
both generators), the labels JSON and :func:`generate` (build + write + labels, what the CLI runs)."""
from __future__ import annotations

import json
import os
import sys
import time

_SAMPLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _SAMPLES not in sys.path:
    sys.path.insert(0, _SAMPLES)

from synthkit.base import BASE_EPOCH_NS, LABEL_KEYS, SEC  # noqa: E402
from synthkit.writer import write_capture  # noqa: E402

from .scenarios import Built  # noqa: E402

GENERATOR_VERSION = "2"


class _Shim:
    """What ``write_capture`` reads: ``store.ts``, ``store.frames`` and ``seed``."""

    def __init__(self, b: Built, seed: int):
        self.store, self.seed = b.fab.cap, seed


def _abs(v, conv):
    """Timestamps (keys ending in ``_at_ns``, at any depth) from capture-relative to epoch ns."""
    if isinstance(v, dict):
        return {k: (conv(x) if k.endswith("_at_ns") and isinstance(x, int) else _abs(x, conv)) for k, x in v.items()}
    if isinstance(v, list):
        return [_abs(x, conv) for x in v]
    return v


def labels_json(b: Built, nanosecond: bool = True) -> list[dict]:
    def conv(t: int) -> int:
        a = BASE_EPOCH_NS + t
        return a if nanosecond else a - a % 1000

    out = []
    for l in b.labels:
        d = dict(l)
        d["start_ns"], d["end_ns"] = conv(l["start_ns"]), conv(l["end_ns"])
        d["parameters"] = _abs(l["parameters"], conv)
        d["parameters"]["generated"] = True
        out.append({k: d[k] for k in LABEL_KEYS})
    return out


def write(b: Built, out: str, seed: int, fmt: str = "pcapng", nanosecond: bool = True) -> tuple[int, list]:
    """Write a built scenario's capture and labels; returns (bytes written, labels)."""
    size = write_capture(_Shim(b, seed), out, fmt, nanosecond)
    labels = labels_json(b, nanosecond)
    with open(out + ".labels.json", "w") as f:
        json.dump(labels, f, indent=1)
        f.write("\n")
    return size, labels


def generate(out: str, scenario: str, seed: int = 1, scale: float = 1.0, fmt: str = "pcapng",
             nanosecond: bool = True) -> dict:
    """Build ``scenario``, write ``out`` and ``out.labels.json``; returns a summary."""
    from .catalog import SCENARIOS
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    if not scale > 0:
        raise ValueError("scale must be > 0")
    t0 = time.perf_counter()
    b = SCENARIOS[scenario](seed, scale)
    t1 = time.perf_counter()
    size, labels = write(b, out, seed, fmt, nanosecond)
    t2 = time.perf_counter()
    cap = b.fab.cap
    ts = cap.ts
    return {"path": out, "scenario": scenario, "packets": len(ts), "rocev2": len(cap.truth),
            "pause_frames": len(ts) - len(cap.truth), "bytes": size, "labels": len(labels),
            "span_s": round((max(ts) - min(ts)) / SEC, 6) if ts else 0.0, "events": b.fab.loop.n,
            "build_s": round(t1 - t0, 3), "write_s": round(t2 - t1, 3), "seed": seed, "scale": scale,
            "format": fmt, "nanosecond": nanosecond}
