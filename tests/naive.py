"""Slow, obvious reference implementations the Numba kernels are tested against.

Written from the format specs with ``struct``, one record at a time, no cleverness. They share the
damage rules of the fast walkers (what stops a walk, what is skipped and counted), stated again here.
"""
from __future__ import annotations

import struct

MAX_STANDARD_RECORD = 262144
MAX_TRUSTED_SNAPLEN = 64 << 20


def walk_pcap(data: bytes):
    """[(data_off, caplen, wirelen, ts_ns)], stop ('eof' | 'truncated' | 'bogus') for a pcap file."""
    magic_le = struct.unpack("<I", data[:4])[0]
    order = "<" if magic_le in (0xA1B2C3D4, 0xA1B23C4D, 0xA1B2CD34) else ">"
    magic = struct.unpack(order + "I", data[:4])[0]
    nano = magic == 0xA1B23C4D
    hdr = 24 if magic == 0xA1B2CD34 else 16
    snaplen = struct.unpack(order + "I", data[16:20])[0]
    limit = max(min(snaplen, MAX_TRUSTED_SNAPLEN), MAX_STANDARD_RECORD)
    out, off = [], 24
    while True:
        if off >= len(data):
            return out, "eof"
        if off + hdr > len(data):
            return out, "truncated"
        sec, frac, incl, orig = struct.unpack(order + "IIII", data[off:off + 16])
        if incl > limit:
            return out, "bogus"
        if off + hdr + incl > len(data):
            return out, "truncated"
        out.append((off + hdr, incl, orig, sec * 10**9 + (frac if nano else frac * 1000)))
        off += hdr + incl


def _ticks_to_ns(ticks: int, resol: int) -> int:
    if resol & 0x80:
        exp = resol & 0x7F
        return (ticks >> exp) * 10**9 + ((ticks & ((1 << exp) - 1)) * 10**9 >> exp) if exp <= 30 else None
    return ticks * 10 ** (9 - resol) if resol <= 9 else ticks // 10 ** (resol - 9)


def walk_pcapng(data: bytes):
    """[(data_off, caplen, wirelen, ts_ns or None, kind)], stop, skipped-packet count."""
    out, off, order, ifaces, base, skipped = [], 0, "<", [], 0, 0
    last_ts = 0
    section_seen = False
    while True:
        if off >= len(data):
            return out, "eof", skipped
        if off + 12 > len(data):
            return out, "truncated", skipped
        btype = struct.unpack(order + "I", data[off:off + 4])[0]
        if btype == 0x0A0D0D0A:
            bom = data[off + 8:off + 12]
            if bom == b"\x4d\x3c\x2b\x1a":
                order = "<"
            elif bom == b"\x1a\x2b\x3c\x4d":
                order = ">"
            else:
                return out, "bad_section", skipped
        elif not section_seen:
            return out, "bad_section", skipped
        blen = struct.unpack(order + "I", data[off + 4:off + 8])[0]
        if blen < 12 or blen % 4:
            return out, "bogus", skipped
        if off + blen > len(data):
            return out, "truncated", skipped
        if struct.unpack(order + "I", data[off + blen - 4:off + blen])[0] != blen:
            return out, "bogus", skipped
        body = data[off:off + blen]
        if btype == 0x0A0D0D0A:
            if blen < 28 or struct.unpack(order + "H", body[12:14])[0] != 1:
                return out, "bad_section", skipped
            section_seen = True
            base = len(ifaces)
        elif btype == 1 and blen >= 20:
            resol, offset_s = 6, 0
            pos = 16
            while pos + 4 <= blen - 4:
                code, length = struct.unpack(order + "HH", body[pos:pos + 4])
                if code == 0 or pos + 4 + length > blen - 4:
                    break
                if code == 9 and length >= 1:
                    resol = body[pos + 4]
                elif code == 14 and length >= 8:
                    offset_s = struct.unpack(order + "q", body[pos + 4:pos + 12])[0]
                pos += 4 + ((length + 3) & ~3)
            ifaces.append((struct.unpack(order + "I", body[12:16])[0], resol, offset_s))
        elif btype in (6, 2):
            if blen < 32:
                skipped += 1
            else:
                local = struct.unpack(order + ("I" if btype == 6 else "H"), body[8:12] if btype == 6 else body[8:10])[0]
                caplen = struct.unpack(order + "I", body[20:24])[0]
                if base + local >= len(ifaces):
                    skipped += 1
                elif caplen > blen - 32:
                    skipped += 1
                else:
                    hi, lo = struct.unpack(order + "II", body[12:20])
                    _, resol, offset_s = ifaces[base + local]
                    ticks = (hi << 32) | lo
                    if ticks >= 1 << 63:  # read as a signed 64-bit count, as herdscope documents
                        ticks -= 1 << 64
                    scale = 1e9 / 2 ** (resol & 0x7F) if resol & 0x80 else 10.0 ** (9 - resol)
                    if abs(ticks * scale) < 9.2e18 and abs(offset_s) < 9e9:  # else: unrepresentable in ns
                        ns = _ticks_to_ns(ticks, resol)
                        ts = None if ns is None else ns + offset_s * 10**9
                        if ts is not None:
                            last_ts = ts
                    else:
                        ts = last_ts
                    out.append((off + 28, caplen, struct.unpack(order + "I", body[24:28])[0], ts, "packet"))
        elif btype == 3:
            if blen < 16 or base >= len(ifaces):
                skipped += 1
            else:
                wire = struct.unpack(order + "I", body[8:12])[0]
                cap = min(wire, blen - 16)
                if ifaces[base][0]:
                    cap = min(cap, ifaces[base][0])
                out.append((off + 12, cap, wire, last_ts, "packet"))
        elif btype in (0x00000BAD, 0x40000BAD, 9):
            body_len = max(blen - (12 if btype == 9 else 16), 0)
            out.append((off + (8 if btype == 9 else 12), body_len, body_len, last_ts, "record"))
        off += blen
