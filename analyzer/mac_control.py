"""Ethernet MAC Control (EtherType 0x8808): PAUSE and PFC frames, as the ``pause_frames`` frame.

Specs
    * IEEE 802.3 Annex 31B, MAC Control PAUSE: opcode 0x0001 followed by one 16-bit ``pause_time``
      that stops the link partner sending *any* frame (but MAC Control) for that many quanta.
    * IEEE 802.1Qbb (Priority-based Flow Control; 802.3 Annex 31D): opcode 0x0101, a 16-bit
      priority-enable vector (its upper 8 bits are reserved and zero; bit ``n`` of the lower byte
      enables priority ``n``), then eight 16-bit times, ``time[0]`` (priority 0) first. A time is
      acted on only where its enable bit is set; 0 resumes the priority at once.
    * One *pause quantum* is 512 bit times, so how long a frame pauses depends on the link speed:
      ``quanta * 512 / link_bps`` seconds (:data:`PAUSE_QUANTUM_BITS`). The speed is the pcapng
      ``if_speed`` of the capturing interface when the file gives one (the interfaces frame's
      ``speed_bps``), else :data:`DEFAULT_LINK_BPS` (100 Gb/s); the usual Ethernet speeds are named in
      :data:`LINK_SPEEDS_BPS`. A capture's interface speed is that of the sniffer's port, which may
      not be the paused link's: a detector may override it (``pfc_storm.link_speed_bps``).

The frame has a row per MAC Control frame, VLAN-tagged ones included (the header decoder in
``analyzer/kernels/headers.py`` locates the MAC Control payload: ``payload_offset``/``payload_caplen``
of the packets frame's EtherType 0x8808 rows). A frame the snapshot length cut before its parameters
ends has ``status`` "truncated" and nulls where its bytes are missing: it is counted, not dropped.
Opcodes other than PAUSE and PFC (EPON's GATE/REPORT ..., 802.3 Annex 31C EXTENSION) are ``kind``
"other", their parameters not decoded.

Parsing is columnar: one Numba pass over the rows with EtherType 0x8808, every read checked against
the record's captured end; no Python work per frame (addresses are formatted once per distinct MAC).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from .jit import njit
from . import columns
from . import linktypes as lt
from .capture import frame_builder
from .kernels.headers import ETH_MAC_CONTROL
from .kernels.wire import u16be
from .schema import FRAMES, column, empty_frame, polars_type

OPCODE_PAUSE = 0x0001  # IEEE 802.3 Annex 31B
OPCODE_PFC = 0x0101  # IEEE 802.1Qbb / 802.3 Annex 31D
PFC_PRIORITIES = 8
PAUSE_QUANTUM_BITS = 512  # one pause quantum, in bit times
PAUSE_ALL_PRIORITIES = 0xFF  # class_enable of an 802.3x PAUSE: it stops every priority
# Bytes of MAC Control payload each kind needs: the opcode, then PAUSE's pause_time, or PFC's
# priority-enable vector and eight times.
OPCODE_LEN = 2
PAUSE_LEN = OPCODE_LEN + 2
PFC_LEN = OPCODE_LEN + 2 + 2 * PFC_PRIORITIES
MAC_LEN = 6

LINK_SPEEDS_BPS = {"10G": 10_000_000_000, "25G": 25_000_000_000, "40G": 40_000_000_000,
                   "50G": 50_000_000_000, "100G": 100_000_000_000, "200G": 200_000_000_000,
                   "400G": 400_000_000_000, "800G": 800_000_000_000}
DEFAULT_LINK_BPS = LINK_SPEEDS_BPS["100G"]  # when the capture does not give the interface's speed

KIND_NAMES = ("pause", "pfc", "other")
STATUS_NAMES = ("ok", "truncated")

_QUANTA = tuple(f"quanta_p{p}" for p in range(PFC_PRIORITIES))
_UNTIL = tuple(f"paused_until_p{p}_ns" for p in range(PFC_PRIORITIES))

PAUSE_FRAME_COLUMNS = (
    column("frame", np.uint32, "frame number of the MAC Control frame"),
    column("ts_ns", np.int64, "capture timestamp, ns since the Unix epoch (UTC)"),
    column("iface", np.uint16, "interface index, as in packets.iface"),
    column("src_mac", object, "source MAC address, the port that sends the pause (lower-case, as Wireshark's "
           "eth.src; Linux cooked captures: the sll address)", polars=pl.String),
    column("dst_mac", object, "destination MAC address (01:80:c2:00:00:01 for PAUSE and PFC; null in Linux "
           "cooked captures)", polars=pl.String),
    column("opcode", np.uint16, "MAC Control opcode (0x0001 PAUSE, 0x0101 PFC; null when not captured)"),
    column("kind", object, "pause (802.3 Annex 31B), pfc (802.1Qbb) or other opcode",
           polars=pl.Enum(KIND_NAMES)),
    column("class_enable", np.uint8, "PFC priority-enable vector, bit n = priority n (its lower byte, as "
           "macc.cbfc.enbv & 0xff); PAUSE: 0xff, every priority"),
    *(column(q, np.uint16, f"pause time of priority {p} in quanta of 512 bit times (PFC: null where the "
             f"enable bit is clear; PAUSE: its one pause_time; 0 = resume)") for p, q in enumerate(_QUANTA)),
    column("link_bps", np.int64, "link speed the pause times are computed with: the interface's pcapng if_speed, "
           "else mac_control.DEFAULT_LINK_BPS (100 Gb/s)"),
    *(column(u, np.int64, f"until when priority {p} is paused: ts_ns + quanta_p{p} x 512 x 1e9 / link_bps "
             f"(rounded down to whole ns; ts_ns for a resume; null where not enabled)")
      for p, u in enumerate(_UNTIL)),
    column("status", object, "ok, or truncated: the snapshot length cut the frame before its parameters end",
           polars=pl.Enum(STATUS_NAMES)),
)
FRAMES.setdefault("pause_frames", PAUSE_FRAME_COLUMNS)  # descriptions for ``herdscope export``


# Columns of the kernel's output: one int64 per field and row, and whether it is present.
(K_OPCODE, K_KIND, K_CLASS_ENABLE, K_Q0) = range(4)
K_STATUS = K_Q0 + PFC_PRIORITIES
N_K = K_STATUS + 1
KIND_PAUSE, KIND_PFC, KIND_OTHER = (KIND_NAMES.index(k) for k in ("pause", "pfc", "other"))
STATUS_TRUNCATED = STATUS_NAMES.index("truncated")
ETHERNET, LINUX_SLL, LINUX_SLL2 = lt.ETHERNET, lt.LINUX_SLL, lt.LINUX_SLL2
# Where a cooked (SLL / SLL2) header keeps the sender's address and its length
SLL_HALEN_AT, SLL_ADDR_AT, SLL2_HALEN_AT, SLL2_ADDR_AT = 4, 6, 11, 12


@njit(cache=True)
def _mac_key(buf, at):
    key = np.int64(0)
    for k in range(MAC_LEN):
        key = (key << 8) | np.int64(buf[at + k])
    return key


@njit(cache=True)
def _decode(buf, off, avail, caplen, linktype, out, present, macs):
    """Row i: the MAC Control payload at ``off[i]``, ``avail[i]`` bytes of it captured, its record
    ``caplen[i]`` bytes long ending where the payload does. Fills ``out``/``present`` (N_K rows of n)
    and ``macs`` (source, destination as 48-bit keys, -1 when unknown). Every read is bounds-checked
    against the record and the buffer."""
    size = len(buf)
    for i in range(len(off)):
        o, a = off[i], avail[i]
        end = min(o + a, size)
        start = o + a - caplen[i]  # the record's first byte
        macs[i, 0] = -1
        macs[i, 1] = -1
        if start >= 0 and start + 2 * MAC_LEN <= end:
            lk = linktype[i]
            if lk == ETHERNET:
                macs[i, 1] = _mac_key(buf, start)
                macs[i, 0] = _mac_key(buf, start + MAC_LEN)
            elif lk == LINUX_SLL and start + SLL_ADDR_AT + MAC_LEN <= end \
                    and u16be(buf, start + SLL_HALEN_AT) == MAC_LEN:
                macs[i, 0] = _mac_key(buf, start + SLL_ADDR_AT)
            elif lk == LINUX_SLL2 and start + SLL2_ADDR_AT + MAC_LEN <= end and buf[start + SLL2_HALEN_AT] == MAC_LEN:
                macs[i, 0] = _mac_key(buf, start + SLL2_ADDR_AT)
        kind = KIND_OTHER
        need = OPCODE_LEN
        if o >= 0 and o + OPCODE_LEN <= end:
            opcode = u16be(buf, o)
            out[K_OPCODE, i] = opcode
            present[K_OPCODE, i] = True
            if opcode == OPCODE_PAUSE:
                kind, need = KIND_PAUSE, PAUSE_LEN
            elif opcode == OPCODE_PFC:
                kind, need = KIND_PFC, PFC_LEN
        out[K_KIND, i] = kind
        present[K_KIND, i] = True
        out[K_STATUS, i] = STATUS_TRUNCATED if o + need > end else 0
        present[K_STATUS, i] = True
        if kind == KIND_OTHER or o + OPCODE_LEN + 2 > end:
            continue
        second = u16be(buf, o + OPCODE_LEN)  # PAUSE: the pause_time; PFC: the priority-enable vector
        enable = PAUSE_ALL_PRIORITIES if kind == KIND_PAUSE else second & 0xFF
        out[K_CLASS_ENABLE, i] = enable
        present[K_CLASS_ENABLE, i] = True
        for p in range(PFC_PRIORITIES):
            if kind == KIND_PAUSE:
                out[K_Q0 + p, i] = second
                present[K_Q0 + p, i] = True
            else:
                at = o + OPCODE_LEN + 2 + 2 * p
                if (enable >> p) & 1 and at + 2 <= end:
                    out[K_Q0 + p, i] = u16be(buf, at)
                    present[K_Q0 + p, i] = True


def _mac_texts(keys: np.ndarray) -> pl.Series:
    """48-bit keys as "02:00:5e:10:00:01" (null for -1), formatted once per distinct address."""
    known = keys >= 0
    if not known.any():
        return pl.Series([None] * len(keys), dtype=pl.String)
    distinct, index = np.unique(keys[known], return_inverse=True)
    texts = pl.Series([":".join(f"{b:02x}" for b in int(v).to_bytes(MAC_LEN, "big")) for v in distinct],
                      dtype=pl.String)
    at = np.zeros(len(keys), np.int64)
    at[known] = index
    return texts.gather(at).set(pl.Series(~known), None)


def decode_pause_frames(buf: np.ndarray, rows: pl.DataFrame, interfaces: pl.DataFrame) -> pl.DataFrame:
    """The pause_frames frame of ``rows`` (packets-frame rows with EtherType 0x8808: ``frame``, ``ts_ns``,
    ``iface``, ``caplen``, ``payload_offset``, ``payload_caplen``); ``interfaces`` gives each row's link
    type and speed."""
    rows = rows.filter(pl.col("payload_offset").is_not_null())
    if rows.height == 0:
        return empty_frame(PAUSE_FRAME_COLUMNS)
    speeds = interfaces.select(pl.col("iface"), pl.col("linktype"),
                               (pl.col("speed_bps") if "speed_bps" in interfaces.columns
                                else pl.lit(None, pl.Int64)).alias("speed_bps"))
    rows = rows.join(speeds, on="iface", how="left", maintain_order="left")
    n = rows.height
    out = np.zeros((N_K, n), np.int64)
    present = np.zeros((N_K, n), np.bool_)
    macs = np.empty((n, 2), np.int64)
    _decode(buf, rows["payload_offset"].to_numpy().astype(np.int64),
            rows["payload_caplen"].to_numpy().astype(np.int64), rows["caplen"].to_numpy().astype(np.int64),
            rows["linktype"].fill_null(-1).to_numpy().astype(np.int64), out, present, macs)

    def field(k: int, name: str, dtype) -> pl.Series:
        return columns.series(name, out[k].astype(dtype), present[k])

    frame = pl.DataFrame([
        rows["frame"], rows["ts_ns"], rows["iface"],
        _mac_texts(macs[:, 0]).alias("src_mac"), _mac_texts(macs[:, 1]).alias("dst_mac"),
        field(K_OPCODE, "opcode", np.uint16),
        columns.enum_from_codes(pl.Series("kind", out[K_KIND]), pl.Enum(KIND_NAMES)),
        field(K_CLASS_ENABLE, "class_enable", np.uint8),
        *(field(K_Q0 + p, q, np.uint16) for p, q in enumerate(_QUANTA)),
        rows["speed_bps"].fill_null(DEFAULT_LINK_BPS).cast(pl.Int64).alias("link_bps"),
        columns.enum_from_codes(pl.Series("status", out[K_STATUS]), pl.Enum(STATUS_NAMES)),
    ])
    ts, bps = pl.col("ts_ns"), pl.col("link_bps")
    frame = frame.with_columns(
        (ts + pl.col(q).cast(pl.Int64) * (PAUSE_QUANTUM_BITS * 1_000_000_000) // bps).alias(u)
        for q, u in zip(_QUANTA, _UNTIL))
    return frame.select(c.name for c in PAUSE_FRAME_COLUMNS).cast(
        {c.name: polars_type(c) for c in PAUSE_FRAME_COLUMNS})


@frame_builder("pause_frames")
def pause_frames(cap) -> pl.DataFrame:
    """One row per Ethernet MAC Control frame of the capture (see the module docstring)."""
    rows = cap.packets.select("frame", "ts_ns", "iface", "caplen", "payload_offset", "payload_caplen", "ethertype") \
        .filter(pl.col("ethertype") == ETH_MAC_CONTROL)
    return decode_pause_frames(cap.buf, rows, cap.frame("interfaces"))
