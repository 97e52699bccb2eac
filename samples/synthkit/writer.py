"""Writing: the frames sorted by time into a classic pcap (µs or ns) or a pcapng file, the labels as
JSON, and :func:`generate` (build + write + labels, what the CLI runs)."""
from __future__ import annotations

import json
import struct
import time

from .base import BASE_EPOCH_NS, GENERATOR_VERSION, LABEL_KEYS, MASK32, SEC
from .generator import Gen

# Classic pcap (draft-ietf-opsawg-pcap §4): magic for µs / ns timestamps, version 2.4, snaplen
PCAP_MAGIC_US, PCAP_MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D
PCAP_VERSION = (2, 4)
SNAPLEN = 262144
LINKTYPE_ETHERNET = 1
# pcapng (draft-ietf-opsawg-pcapng §4): block types, byte-order magic, options
BT_SHB, BT_IDB, BT_EPB = 0x0A0D0D0A, 0x00000001, 0x00000006
BYTE_ORDER_MAGIC = 0x1A2B3C4D
PCAPNG_VERSION = (1, 0)
SECTION_LENGTH_UNSPECIFIED = -1
OPT_ENDOFOPT, SHB_USERAPPL, IF_NAME, IF_TSRESOL = 0, 4, 2, 9
TSRESOL_NS = b"\x09"                # if_tsresol: 10^-9 s
EPB_FIXED = 32                      # block type, length, interface, ts high/low, caplen, len, trailing length
CHUNK = 65536                       # records joined per write


def _abs_times(gen: Gen, nanosecond: bool):
    import numpy as np
    ts = np.asarray(gen.store.ts, dtype=np.int64)
    order = np.argsort(ts, kind="stable")
    abs_ns = ts[order] + BASE_EPOCH_NS
    if not nanosecond:
        abs_ns -= abs_ns % 1000
    return order, abs_ns


def _pcapng_opt(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _pcapng_block(btype: int, body: bytes) -> bytes:
    n = 12 + len(body)
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


def write_capture(gen: Gen, path: str, fmt: str = "pcap", nanosecond: bool = False) -> int:
    """Write the frames sorted by time; returns the number of bytes written."""
    order, abs_ns = _abs_times(gen, nanosecond)
    frames = gen.store.frames
    chunk = CHUNK
    with open(path, "wb") as f:
        if fmt == "pcap":
            f.write(struct.pack("<IHHiIII", PCAP_MAGIC_NS if nanosecond else PCAP_MAGIC_US, *PCAP_VERSION, 0, 0,
                                SNAPLEN, LINKTYPE_ETHERNET))
            secs = (abs_ns // SEC).tolist()
            frac = (abs_ns % SEC if nanosecond else (abs_ns % SEC) // 1000).tolist()
            rec = struct.Struct("<IIII").pack
            idx = order.tolist()
            for lo in range(0, len(idx), chunk):
                parts = []
                for j in range(lo, min(lo + chunk, len(idx))):
                    fr = frames[idx[j]]
                    n = len(fr)
                    parts.append(rec(secs[j], frac[j], n, n))
                    parts.append(fr)
                f.write(b"".join(parts))
        elif fmt == "pcapng":
            opt, block = _pcapng_opt, _pcapng_block
            shb = struct.pack("<IHHq", BYTE_ORDER_MAGIC, *PCAPNG_VERSION, SECTION_LENGTH_UNSPECIFIED) \
                + opt(SHB_USERAPPL, f"herdscope synth.py v{GENERATOR_VERSION} seed={gen.seed}".encode()) \
                + opt(OPT_ENDOFOPT, b"")
            idb_opts = opt(IF_NAME, b"synth0") + (opt(IF_TSRESOL, TSRESOL_NS) if nanosecond else b"") \
                + opt(OPT_ENDOFOPT, b"")
            f.write(block(BT_SHB, shb) + block(BT_IDB, struct.pack("<HHI", LINKTYPE_ETHERNET, 0, SNAPLEN) + idb_opts))
            units = abs_ns if nanosecond else abs_ns // 1000
            hi = (units >> 32).tolist()
            lo_ = (units & MASK32).tolist()
            epb = struct.Struct("<IIIIIII").pack
            idx = order.tolist()
            pads = [b"", b"\0\0\0", b"\0\0", b"\0"]
            for lo in range(0, len(idx), chunk):
                parts = []
                for j in range(lo, min(lo + chunk, len(idx))):
                    fr = frames[idx[j]]
                    n = len(fr)
                    total = EPB_FIXED + n + (-n % 4)
                    parts.append(epb(BT_EPB, total, 0, hi[j], lo_[j], n, n))
                    parts.append(fr)
                    parts.append(pads[n % 4] + struct.pack("<I", total))
                f.write(b"".join(parts))
        else:
            raise ValueError(f"unknown format {fmt!r}")
        return f.tell()


def labels_json(gen: Gen, nanosecond: bool) -> list[dict]:
    def conv(t: int) -> int:
        a = BASE_EPOCH_NS + t
        return a if nanosecond else a - a % 1000

    out = []
    for l in gen.labels:
        d = dict(l)
        d["start_ns"], d["end_ns"] = conv(l["start_ns"]), conv(l["end_ns"])
        d["parameters"] = {k: (conv(v) if k.endswith("_ns") else v) for k, v in l["parameters"].items()}
        out.append({k: d[k] for k in LABEL_KEYS})
    return out


def generate(out: str, packets: int = 1_000_000, seed: int = 1, fmt: str = "pcap",
             nanosecond: bool = False) -> dict:
    """Generate ``out`` and ``out.labels.json``; returns a small summary dict."""
    t0 = time.perf_counter()
    gen = Gen(seed, packets)
    gen.build()
    t1 = time.perf_counter()
    size = write_capture(gen, out, fmt, nanosecond)
    labels = labels_json(gen, nanosecond)
    with open(out + ".labels.json", "w") as f:
        json.dump(labels, f, indent=1)
        f.write("\n")
    t2 = time.perf_counter()
    ts = gen.store.ts
    return {"path": out, "packets": len(ts), "bytes": size, "labels": len(labels),
            "span_s": round((max(ts) - min(ts)) / SEC, 3), "build_s": round(t1 - t0, 3),
            "write_s": round(t2 - t1, 3), "seed": seed, "format": fmt, "nanosecond": nanosecond}
