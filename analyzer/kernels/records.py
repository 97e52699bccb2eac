"""Record walkers: find the packet records of a pcap or pcapng file.

Formats: classic pcap (tcpdump.org "pcap" file format, draft-ietf-opsawg-pcap), including the
nanosecond magic and Kuznetzov's modified pcap; pcapng (draft-ietf-opsawg-pcapng) sections of either
byte order, Interface Description Blocks (``if_tsresol`` decimal and power-of-2, ``if_tsoffset``),
Enhanced, Simple and obsolete Packet Blocks. Name Resolution, Interface Statistics, Decryption
Secrets, systemd Journal, custom and unknown blocks are skipped and counted.

Each walker fills rows ``lo``..``hi - 1`` of ``out`` at most, with the records from ``off``, and returns
``(index after the last row filled, next_offset, stop)``. ``stop`` says why it returned (a ``STOP_*`` value); damage
that the format lets us step over (a pcapng block whose inner lengths are bogus, a packet for an
interface that was never described) is counted in ``counts`` by ``SKIP_*`` index and walking goes on.
Custom blocks and systemd journal entries become records of their own kind (Wireshark numbers
them as frames). Damage that leaves no way to find the next record (a cut-short file, a record or block length that
cannot be right) stops the walk: everything before it is kept and the caller reports the rest.
"""
from collections import namedtuple

import numpy as np

from ..jit import njit
from .wire import prefetch_until, u16, u32, u64

# Why a walker returned.
STOP_FULL = 0  # the output arrays are full; call again from next_offset
STOP_EOF = 1  # clean end of file
STOP_TRUNCATED = 2  # the file ends inside a record (header or data): cut short
STOP_BOGUS_LENGTH = 3  # a length that cannot be right; the rest of the file cannot be framed
STOP_BAD_SECTION = 4  # a pcapng block where a Section Header Block was required, or bad byte-order magic

STOP_MESSAGES = {
    STOP_TRUNCATED: "the file ends in the middle of a record (cut short)",
    STOP_BOGUS_LENGTH: "a record or block length that cannot be right (corrupt file)",
    STOP_BAD_SECTION: "a pcapng section header that cannot be read (bad byte-order magic or version)",
}

# Counted skips and events (indexes into ``counts``).
SKIP_UNKNOWN_INTERFACE = 0  # packet block names an interface no IDB described
SKIP_CAPLEN_EXCEEDS_BLOCK = 1  # packet block whose caplen does not fit its block
SKIP_TOO_MANY_INTERFACES = 2  # more IDBs than MAX_INTERFACES
SKIP_BAD_IDB = 3  # IDB too short to hold its fixed fields
EVENT_TS_BACKWARDS = 4  # a packet timestamp earlier than the previous one (kept, counted)
EVENT_SPB_NO_TIMESTAMP = 5  # Simple Packet Blocks carry no timestamp: previous one reused
EVENT_NRB = 6
EVENT_ISB = 7
EVENT_DSB = 8
EVENT_CUSTOM = 9
EVENT_UNKNOWN_BLOCK = 10
EVENT_SECTIONS = 11
EVENT_BAD_OPTION = 12  # IDB option running past its block: options ignored from there
EVENT_JOURNAL = 13
EVENT_TS_UNREPRESENTABLE = 14  # a time beyond ±292 years of 1970 in ns: previous time reused, counted
N_COUNTS = 15

COUNT_NAMES = (
    "unknown_interface", "caplen_exceeds_block", "too_many_interfaces", "bad_interface_block",
    "timestamps_backwards", "simple_packet_blocks_without_timestamp", "name_resolution_blocks",
    "interface_statistics_blocks", "decryption_secrets_blocks", "custom_blocks", "unknown_blocks",
    "sections", "bad_block_options", "systemd_journal_blocks", "timestamps_unrepresentable",
)
# Which counts are packets that were *not* turned into rows (the rest are informational).
SKIPPED_PACKET_COUNTS = (SKIP_UNKNOWN_INTERFACE, SKIP_CAPLEN_EXCEEDS_BLOCK)

MAX_INTERFACES = 65536
PREFETCH_BYTES = 4096  # how far ahead of a walker the file's bytes are prefetched (wire.prefetch_until)

# Largest record Wireshark accepts without an explicit bigger snaplen (WTAP_MAX_PACKET_SIZE_STANDARD).
MAX_STANDARD_RECORD = 262144
# A file header may announce a bigger snapshot length (USB, GRO captures); it is believed up to this.
MAX_TRUSTED_SNAPLEN = 64 << 20

# pcapng block types
BT_SHB = 0x0A0D0D0A
BT_IDB = 0x00000001
BT_PB = 0x00000002  # obsolete Packet Block
BT_SPB = 0x00000003
BT_NRB = 0x00000004
BT_ISB = 0x00000005
BT_EPB = 0x00000006
BT_JOURNAL = 0x00000009
BT_DSB = 0x0000000A
BT_CUSTOM = 0x00000BAD
BT_CUSTOM_NOCOPY = 0x40000BAD
BYTE_ORDER_MAGIC = 0x1A2B3C4D

OPT_ENDOFOPT = 0
OPT_IF_TSRESOL = 9
OPT_IF_TSOFFSET = 14

# Kinds of record. Wireshark numbers pcapng custom blocks and systemd journal entries as frames, so
# they get rows too (with no packet to decode) and frame numbers stay Wireshark's.
KIND_PACKET = 0
KIND_CUSTOM_BLOCK = 1
KIND_JOURNAL_ENTRY = 2

RecordColumns = namedtuple("RecordColumns", ["data_off", "caplen", "wirelen", "ts_ns", "iface", "kind"])


def allocate_records(capacity: int) -> RecordColumns:
    return RecordColumns(
        np.empty(capacity, np.int64), np.empty(capacity, np.uint32), np.empty(capacity, np.uint32),
        np.empty(capacity, np.int64), np.empty(capacity, np.uint16), np.zeros(capacity, np.uint8),
    )


# Interface table: one row per IDB, global index across sections.
InterfaceTable = namedtuple(
    "InterfaceTable",
    ["linktype", "snaplen", "ts_pow2", "ts_exp", "ts_offset_s", "section", "block_off", "big_endian"],
)


def allocate_interfaces(capacity: int = MAX_INTERFACES) -> InterfaceTable:
    return InterfaceTable(
        np.zeros(capacity, np.int32), np.zeros(capacity, np.uint32), np.zeros(capacity, np.uint8),
        np.full(capacity, 6, np.uint8), np.zeros(capacity, np.int64), np.zeros(capacity, np.uint16),
        np.zeros(capacity, np.int64), np.zeros(capacity, np.uint8),
    )


# Walker state carried between calls (int64 array): see the ST_* indexes.
ST_BIG_ENDIAN = 0  # byte order of the current pcapng section (pcap: of the file)
ST_SECTION_BASE = 1  # global index of the current section's interface 0
ST_N_IFACES = 2  # interfaces described so far (all sections)
ST_LAST_TS = 3  # timestamp of the previous packet, ns
ST_SECTION = 4  # current section number
ST_HAVE_TS = 5  # 1 once a packet with a timestamp was seen
N_STATE = 6


def new_state(big_endian: bool) -> np.ndarray:
    state = np.zeros(N_STATE, np.int64)
    state[ST_BIG_ENDIAN] = 1 if big_endian else 0
    state[ST_SECTION] = -1
    return state


NS_LIMIT = 9.2e18  # |ns| an int64 can hold, with a margin


@njit(cache=True)
def ticks_fit(ticks, pow2, exp):
    """Whether ``ticks`` of this resolution (plus an if_tsoffset) are representable as int64 ns."""
    scale = 1e9 / (2.0 ** exp) if pow2 else 10.0 ** (9 - exp)
    return abs(np.float64(ticks) * scale) < NS_LIMIT


@njit(cache=True)
def ticks_to_ns(ticks, pow2, exp):
    """Timestamp units of an interface (``if_tsresol``) to nanoseconds (check ``ticks_fit`` first)."""
    if pow2:
        if exp == 0:
            return ticks * 1_000_000_000
        whole = ticks >> exp
        frac = ticks & ((1 << exp) - 1)
        if exp <= 30:
            return whole * 1_000_000_000 + ((frac * 1_000_000_000) >> exp)
        return whole * 1_000_000_000 + np.int64(frac * (1e9 / (2.0 ** exp)))
    if exp <= 9:
        return ticks * 10 ** (9 - exp)
    return ticks // 10 ** (exp - 9)


@njit(cache=True, inline="always")
def _note_ts(ts, state, counts):
    if state[ST_HAVE_TS] and ts < state[ST_LAST_TS]:
        counts[EVENT_TS_BACKWARDS] += 1
    state[ST_LAST_TS] = ts
    state[ST_HAVE_TS] = 1


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def walk_pcap(buf, off, big_endian, nanosecond, record_header_len, snaplen, out, lo, hi, state, counts):
    """Classic pcap records from ``off`` (just after the 24-byte file header, or a previous stop)."""
    end = buf.shape[0]
    max_record = max(min(snaplen, MAX_TRUSTED_SNAPLEN), MAX_STANDARD_RECORD)
    n = lo
    ahead = off
    while n < hi:
        ahead = prefetch_until(buf, ahead, off + PREFETCH_BYTES)
        if off >= end:
            return n, off, STOP_EOF
        if off + record_header_len > end:
            return n, off, STOP_TRUNCATED
        sec = u32(buf, off, big_endian)
        frac = u32(buf, off + 4, big_endian)
        incl = u32(buf, off + 8, big_endian)
        orig = u32(buf, off + 12, big_endian)
        if incl > max_record:
            return n, off, STOP_BOGUS_LENGTH
        data = off + record_header_len
        if data + incl > end:
            return n, off, STOP_TRUNCATED
        ts = sec * 1_000_000_000 + (frac if nanosecond else frac * 1000)
        _note_ts(ts, state, counts)
        out.data_off[n] = data
        out.caplen[n] = incl
        out.wirelen[n] = orig
        out.ts_ns[n] = ts
        out.iface[n] = 0
        out.kind[n] = KIND_PACKET
        n += 1
        off = data + incl
    return n, off, STOP_FULL


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _read_idb(buf, off, blen, big_endian, ifaces, state, counts):
    if blen < 20:
        counts[SKIP_BAD_IDB] += 1
        return
    idx = state[ST_N_IFACES]
    if idx >= ifaces.linktype.shape[0]:
        counts[SKIP_TOO_MANY_INTERFACES] += 1
        return
    ifaces.linktype[idx] = u16(buf, off + 8, big_endian)
    ifaces.snaplen[idx] = u32(buf, off + 12, big_endian)
    ifaces.ts_pow2[idx] = 0
    ifaces.ts_exp[idx] = 6
    ifaces.ts_offset_s[idx] = 0
    ifaces.section[idx] = state[ST_SECTION]
    ifaces.block_off[idx] = off
    ifaces.big_endian[idx] = big_endian
    opt = off + 16
    opt_end = off + blen - 4
    while opt + 4 <= opt_end:
        code = u16(buf, opt, big_endian)
        length = u16(buf, opt + 2, big_endian)
        value = opt + 4
        if code == OPT_ENDOFOPT:
            break
        if value + length > opt_end:
            counts[EVENT_BAD_OPTION] += 1
            break
        if code == OPT_IF_TSRESOL and length >= 1:
            resol = buf[value]
            ifaces.ts_pow2[idx] = 1 if resol & 0x80 else 0
            ifaces.ts_exp[idx] = resol & 0x7F
        elif code == OPT_IF_TSOFFSET and length >= 8:
            ifaces.ts_offset_s[idx] = u64(buf, value, big_endian)
        opt = value + ((length + 3) & ~3)
    state[ST_N_IFACES] = idx + 1


@njit(cache=True, inline="always")
def _iface_of(local_id, state):
    """Global interface index for a section-local id, or -1 when no IDB described it."""
    glob = state[ST_SECTION_BASE] + local_id
    if local_id < 0 or glob >= state[ST_N_IFACES]:
        return -1
    return glob


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def walk_pcapng(buf, off, out, lo, hi, ifaces, state, counts):
    """pcapng blocks from ``off`` (a block boundary). See the module docstring for what is read."""
    end = buf.shape[0]
    n = lo
    ahead = off
    while n < hi:
        ahead = prefetch_until(buf, ahead, off + PREFETCH_BYTES)
        if off >= end:
            return n, off, STOP_EOF
        if off + 12 > end:
            return n, off, STOP_TRUNCATED
        big_endian = state[ST_BIG_ENDIAN]
        btype = u32(buf, off, big_endian)
        if btype == BT_SHB:
            magic = u32(buf, off + 8, False)
            if magic == BYTE_ORDER_MAGIC:
                big_endian = 0
            elif magic == 0x4D3C2B1A:
                big_endian = 1
            else:
                return n, off, STOP_BAD_SECTION
            state[ST_BIG_ENDIAN] = big_endian
        elif state[ST_SECTION] < 0:
            return n, off, STOP_BAD_SECTION
        blen = u32(buf, off + 4, big_endian)
        if blen < 12 or blen % 4 != 0:
            return n, off, STOP_BOGUS_LENGTH
        if off + blen > end:
            return n, off, STOP_TRUNCATED
        if u32(buf, off + blen - 4, big_endian) != blen:
            return n, off, STOP_BOGUS_LENGTH
        if btype == BT_SHB:
            if blen < 28 or u16(buf, off + 12, big_endian) != 1:
                return n, off, STOP_BAD_SECTION
            state[ST_SECTION] += 1
            state[ST_SECTION_BASE] = state[ST_N_IFACES]
            counts[EVENT_SECTIONS] += 1
        elif btype == BT_IDB:
            _read_idb(buf, off, blen, big_endian, ifaces, state, counts)
        elif btype == BT_EPB or btype == BT_PB:
            if blen < 32:
                counts[SKIP_CAPLEN_EXCEEDS_BLOCK] += 1
            else:
                if btype == BT_EPB:
                    local = u32(buf, off + 8, big_endian)
                else:
                    local = u16(buf, off + 8, big_endian)
                iface = _iface_of(local, state)
                caplen = u32(buf, off + 20, big_endian)
                if iface < 0:
                    counts[SKIP_UNKNOWN_INTERFACE] += 1
                elif caplen > blen - 32:
                    counts[SKIP_CAPLEN_EXCEEDS_BLOCK] += 1
                else:
                    ticks = (u32(buf, off + 12, big_endian) << 32) | u32(buf, off + 16, big_endian)
                    pow2, exp = ifaces.ts_pow2[iface], ifaces.ts_exp[iface]
                    offset_s = ifaces.ts_offset_s[iface]
                    if ticks_fit(ticks, pow2, exp) and abs(offset_s) < 9e9:
                        ts = ticks_to_ns(ticks, pow2, exp) + offset_s * 1_000_000_000
                        _note_ts(ts, state, counts)
                    else:
                        counts[EVENT_TS_UNREPRESENTABLE] += 1
                        ts = state[ST_LAST_TS]
                    out.data_off[n] = off + 28
                    out.caplen[n] = caplen
                    out.wirelen[n] = u32(buf, off + 24, big_endian)
                    out.ts_ns[n] = ts
                    out.iface[n] = iface
                    out.kind[n] = KIND_PACKET
                    n += 1
        elif btype == BT_SPB:
            iface = _iface_of(0, state)
            if blen < 16:
                counts[SKIP_CAPLEN_EXCEEDS_BLOCK] += 1
            elif iface < 0:
                counts[SKIP_UNKNOWN_INTERFACE] += 1
            else:
                wirelen = u32(buf, off + 8, big_endian)
                caplen = min(wirelen, blen - 16)
                snaplen = ifaces.snaplen[iface]
                if snaplen > 0:
                    caplen = min(caplen, snaplen)
                counts[EVENT_SPB_NO_TIMESTAMP] += 1
                out.data_off[n] = off + 12
                out.caplen[n] = caplen
                out.wirelen[n] = wirelen
                out.ts_ns[n] = state[ST_LAST_TS]
                out.iface[n] = iface
                out.kind[n] = KIND_PACKET
                n += 1
        elif btype == BT_NRB:
            counts[EVENT_NRB] += 1
        elif btype == BT_ISB:
            counts[EVENT_ISB] += 1
        elif btype == BT_DSB:
            counts[EVENT_DSB] += 1
        elif btype == BT_JOURNAL or btype == BT_CUSTOM or btype == BT_CUSTOM_NOCOPY:
            if btype == BT_JOURNAL:
                counts[EVENT_JOURNAL] += 1
                out.kind[n] = KIND_JOURNAL_ENTRY
            else:
                counts[EVENT_CUSTOM] += 1
                out.kind[n] = KIND_CUSTOM_BLOCK
            # Wireshark's frame length: the block body (after the Private Enterprise Number for
            # custom blocks)
            body = blen - 12 if btype == BT_JOURNAL else blen - 16
            out.data_off[n] = off + (8 if btype == BT_JOURNAL else 12)
            out.caplen[n] = max(body, 0)
            out.wirelen[n] = max(body, 0)
            out.ts_ns[n] = state[ST_LAST_TS]
            out.iface[n] = 0
            n += 1
        else:
            counts[EVENT_UNKNOWN_BLOCK] += 1
        off += blen
    return n, off, STOP_FULL
