"""Reading a capture file into frames: the driver around the record walkers and header decoder.

The file is walked in chunks of at most ``chunk_records`` records; each chunk's arrays become Polars
columns without copying, so memory is the memory map plus the frames plus one chunk of scratch.
"""
from __future__ import annotations

import dataclasses
import struct
import sys
from dataclasses import dataclass, field
from typing import Hashable

import numpy as np
import polars as pl

from . import columns, linktypes
from .errors import UnreadableCapture
from .formats import PCAP_FILE_HEADER_LEN, FileFormat, detect, why_not
from .kernels import records as rk
from .kernels.details import ICMP_ERROR_TYPES, ICMPV6_ERROR_TYPES, icmp_quotes, sack_blocks
from .kernels.headers import allocate_headers
from .kernels.intern import AddressTable
from .kernels.reading import STOP_TABLE_FULL, read_pcap, read_pcapng, read_rows
from .kernels.silences import KEEP_EVERY_TIME, thinned_times
from .packed_part import Following, packed
from .record_index import IndexMismatch, RecordIndex
from .resolution import TickSampler, timed_packets
from .schema import (ICMP_ERROR_COLUMNS, INTERFACE_COLUMNS, PACKET_COLUMNS, PARSE_STATUS_NAMES,
                     TCP_SACK_COLUMNS, ParseStatus, Present, empty_frame)
from .source import CaptureBytes, open_bytes

DEFAULT_CHUNK_RECORDS = 1 << 20
PROGRESS_MIN_BYTES = 64 << 20  # show a progress bar for files at least this big (on a terminal)
# A pcapng block longer than this is called a corrupt length rather than a file cut short: it is more
# than the largest record herdscope believes (records.MAX_TRUSTED_SNAPLEN) plus room for its options.
MAX_PLAUSIBLE_BLOCK = rk.MAX_TRUSTED_SNAPLEN + (1 << 20)
_ADDRESS_NULL = np.uint32(0xFFFFFFFF)
# what the reader reads of its own packets frame once every chunk is in (the address Enum, the
# interfaces' effective resolution) and a joined capture of several files (analyzer.capture)
READ_COLUMNS = ("frame", "ts_ns", "iface", "parse_status", "src", "dst", "payload_offset")


@dataclass
class ReadReport:
    """What reading the file found besides packets: the damage, the skips and the events."""

    format: str
    records: int = 0
    stop: str = "end of file"  # why reading ended
    stop_offset: int | None = None  # file offset where damage stopped reading (None at clean EOF)
    bytes_not_read: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # records.COUNT_NAMES → n (nonzero only)
    parse_status: dict[str, int] = field(default_factory=dict)  # ParseStatus name → packets
    gzip: bool = False
    gzip_truncated: bool = False  # the gzip stream ended early; what came before it was read
    gzip_damage: str = ""  # why it ended early: a bad CRC, corrupt data, cut short ("" when whole)

    @property
    def skipped_records(self) -> int:
        """Packet records seen in the file that have no row (plus one for a cut-short last record)."""
        skipped = sum(self.counts.get(rk.COUNT_NAMES[k], 0) for k in rk.SKIPPED_PACKET_COUNTS)
        return skipped + (1 if self.stop_offset is not None else 0)

    @property
    def clean(self) -> bool:
        return self.stop_offset is None and self.skipped_records == 0 and not self.gzip_damage

    @property
    def damage(self) -> str | None:
        """All that stopped reading early, in words (the walk's stop and the gzip damage), or None."""
        parts = ([self.stop] if self.stop_offset is not None else []) + ([self.gzip_damage] if self.gzip_damage else [])
        return "; ".join(parts) or None

    def nothing_read(self) -> str | None:
        """Why no record at all could be read, when damage is the reason (a capture that is whole and
        holds no packets, e.g. a pcap header alone, is not damage: None then)."""
        if self.records or self.damage is None:
            return None
        where = f"at byte {self.stop_offset:,}, " if self.stop_offset is not None else ""
        return f"could not read the input, no packet before the damage: {where}{self.damage}"


def _shb_options(buf: np.ndarray, big_endian: bool) -> dict[str, str]:
    """Text options of the first Section Header Block (hardware, OS, application)."""
    order = ">" if big_endian else "<"
    if len(buf) < 28:
        return {}
    blen = struct.unpack(order + "I", bytes(buf[4:8]))[0]
    names = {2: "hardware", 3: "os", 4: "application", 1: "comment"}
    return _text_options(buf, 24, min(blen - 4, len(buf)), order, names)


def _option_bytes(buf, start, end, order, codes) -> dict[int, bytes]:
    """The first value of each pcapng option in ``codes`` found between ``start`` and ``end``."""
    found = {}
    pos = start
    while pos + 4 <= end:
        code, length = struct.unpack(order + "HH", bytes(buf[pos:pos + 4]))
        if code == 0 or pos + 4 + length > end:
            break
        if code in codes and code not in found:
            found[code] = bytes(buf[pos + 4:pos + 4 + length])
        pos += 4 + ((length + 3) & ~3)
    return found


def _text_options(buf, start, end, order, names) -> dict[str, str]:
    return {names[code]: value.decode("utf-8", "replace").rstrip("\0")
            for code, value in _option_bytes(buf, start, end, order, names).items()}


IF_NAME, IF_DESCRIPTION, IF_SPEED = 2, 3, 8  # pcapng Interface Description Block options


def _interfaces_frame(fmt: FileFormat, buf, ifaces, n_ifaces: int, ticks: TickSampler) -> pl.DataFrame:
    if fmt.kind == "pcap":
        arrays = {"iface": np.zeros(1, np.uint16), "section": np.zeros(1, np.uint16),
                  "linktype": np.array([fmt.linktype], np.int32), "snaplen": np.array([fmt.snaplen], np.uint32),
                  "ts_resolution_ns": np.array([1.0 if fmt.nanosecond else 1000.0]),
                  "ts_offset_s": np.zeros(1, np.int64), "name": [None], "speed_bps": np.zeros(1, np.int64)}
    else:
        n = n_ifaces
        exp = ifaces.ts_exp[:n].astype(np.float64)
        resolution = np.where(ifaces.ts_pow2[:n] == 1, 1e9 / np.power(2.0, exp), np.power(10.0, 9 - exp))
        arrays = {"iface": np.arange(n, dtype=np.uint16), "section": ifaces.section[:n].copy(),
                  "linktype": ifaces.linktype[:n].copy(), "snaplen": ifaces.snaplen[:n].copy(),
                  "ts_resolution_ns": resolution, "ts_offset_s": ifaces.ts_offset_s[:n].copy()}
        names, speeds = [], []
        for k in range(n):  # one IDB each: a handful per file
            off = int(ifaces.block_off[k])
            order = ">" if ifaces.big_endian[k] else "<"
            blen = struct.unpack(order + "I", bytes(buf[off + 4:off + 8]))[0]
            opts = _option_bytes(buf, off + 16, off + blen - 4, order, (IF_NAME, IF_DESCRIPTION, IF_SPEED))
            text = {c: opts[c].decode("utf-8", "replace").rstrip("\0") for c in (IF_NAME, IF_DESCRIPTION) if c in opts}
            names.append(text.get(IF_NAME) or text.get(IF_DESCRIPTION))
            speed = opts.get(IF_SPEED, b"")
            # if_speed: a 64-bit count of bits per second; 0 or a wrong length says nothing
            value = struct.unpack(order + "Q", speed)[0] if len(speed) == 8 else 0
            speeds.append(value if value < 1 << 63 else 0)
        arrays["name"] = names
        arrays["speed_bps"] = np.array(speeds, np.int64)
    arrays["linktype_name"] = [linktypes.name(int(v)) for v in arrays["linktype"]]
    arrays.update(ticks.resolution(arrays["iface"], arrays["ts_resolution_ns"]))
    frame = columns.frame(INTERFACE_COLUMNS, arrays)
    return frame.with_columns(pl.when(pl.col("speed_bps") > 0).then(pl.col("speed_bps")).alias("speed_bps"))


class _Progress:
    """A rich progress bar over bytes, only on a terminal and only for big files."""

    def __init__(self, total_bytes: int, label: str, enabled: bool | None):
        if enabled is None:
            enabled = sys.stderr.isatty() and total_bytes >= PROGRESS_MIN_BYTES
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn  # lazy: a terminal only
            self.bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                                TimeRemainingColumn(), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(label, total=total_bytes)

    def update(self, done_bytes: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done_bytes)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@dataclass
class PacketTables:
    packets: pl.DataFrame
    tcp_sack: pl.DataFrame
    icmp_errors: pl.DataFrame
    interfaces: pl.DataFrame
    report: ReadReport
    format: FileFormat
    section_info: dict[str, str]
    # read in part (``kept``): (frame, ts_ns) of every record the part's ``times`` mask selects
    times: pl.DataFrame | None = None
    # the addresses' Enum (what src, dst, inner_src and inner_dst are in; ``packets`` may hold neither)
    address_dtype: pl.DataType | None = None
    # the packets read, when ``packets`` holds fewer rows (read with ``reduce``); None: its rows
    rows: int | None = None


class ChunkReduction:
    """What ``read_tables(reduce=...)`` keeps of a capture's packets instead of all of them: :meth:`chunk`
    is handed each chunk's packets as it is read (the columns asked for and :data:`READ_COLUMNS`,
    ``src`` and ``dst`` still the address table's integer codes, which are the Enum's) and returns the
    rows to keep of it; :meth:`finish` is handed their concatenation (``src`` and ``dst``, if kept, in
    the Enum by then) and returns the packets frame. What the caller of a
    run in partitions holds of a capture of any size (``analyzer.partitions.CallerChunks``)."""

    def chunk(self, packets: pl.DataFrame) -> pl.DataFrame:
        raise NotImplementedError

    def finish(self, packets: pl.DataFrame) -> pl.DataFrame:
        return packets

    def records(self, recs, n: int) -> None:
        """The walker's rows of the chunk's ``n`` records (``analyzer.kernels.records.RecordColumns``,
        every record of the file in turn): what a record index keeps (``analyzer.record_index``)."""

    def records_done(self, iface_linktypes, file_linktype: int, report: ReadReport) -> None:
        """Every record was handed to :meth:`records`: the interfaces' link types (pcapng), the format's
        (pcap; -1 for pcapng) and what the walk found (:class:`ReadReport`)."""

    def close(self) -> None:
        """The capture read through it is closed (``Capture.close``): delete what it keeps on disk."""


@dataclass(frozen=True)
class IndexedPart:
    """A part of a file read from the record index of its whole reading (``read_tables(indexed=)``):
    the index, the frames to keep (ascending) and which records' times its ``times`` holds (a
    boolean per record; None: every one); ``times`` False: none are worked out (a reader of a few
    packets that reads no time of the others: the index's ts_ns column is 8 bytes a record). ``key``
    names the part and ``following`` gives the parts read next in this process, for their copies to be
    made in the same pass as this one's (``analyzer.packed_part``)."""

    index: RecordIndex
    frames: np.ndarray
    timed: np.ndarray | None = None
    times: bool = True
    key: Hashable | None = None
    following: Following | None = None


def _read_indexed(data: CaptureBytes, part: IndexedPart, capacity: int, addresses: AddressTable, take,
                  packed_offsets: np.ndarray | None) -> None:
    """Decode the records of ``part`` from the index's rows, ``capacity`` at a time, handing each chunk
    to ``take`` (read_tables). A row whose bytes lie beyond the mapped file (the file changed since the
    index was written) raises ``IndexMismatch`` before anything is decoded. ``packed_offsets``: where
    each record is in ``data`` when that is the part's records packed (``analyzer.packed_part``)."""
    size = len(data.buf)
    for lo in range(0, part.frames.shape[0], capacity):
        frames = np.ascontiguousarray(part.frames[lo:lo + capacity], np.uint32)
        recs = part.index.rows(frames)
        if packed_offsets is not None:
            recs = recs._replace(data_off=packed_offsets[lo:lo + capacity])
        n = frames.shape[0]
        end = recs.data_off + recs.caplen.astype(np.int64)
        if n and (int(recs.data_off.min()) < 0 or int(end.max()) > size):
            raise IndexMismatch.beyond(data.path, size)
        linktype_of = part.index.linktypes_of(recs)
        hdr = allocate_headers(n)
        ids = (np.empty(n, np.uint32), np.empty(n, np.uint32))  # src, dst
        done = 0
        while True:
            done, stop = read_rows(data.buf, recs, hdr, done, n, linktype_of, addresses.arrays(), *ids)
            if stop != STOP_TABLE_FULL:
                break
            addresses.grow()
        take(recs, hdr, ids, n, 0, frames, n)  # arrays of the chunk's rows alone: nothing to trim


def _chunk_frames(data: CaptureBytes, recs, hdr, src_ids, dst_ids, n, first_frame, addresses: AddressTable,
                  row_frames: np.ndarray | None = None):
    """The packets, SACK-block and ICMP-error frames of one chunk of walked and decoded records (frame
    numbers from ``first_frame`` on, or ``row_frames``' when read in part)."""
    buf = data.buf
    frame_no = np.arange(first_frame, first_frame + n, dtype=np.uint32) if row_frames is None else row_frames
    arrays = {name: getattr(hdr, name) for name in hdr._fields}
    arrays.update(frame=frame_no, ts_ns=recs.ts_ns[:n], iface=recs.iface[:n], caplen=recs.caplen[:n],
                  wirelen=recs.wirelen[:n], src=src_ids, dst=dst_ids)
    present = hdr.present
    # Addresses stay integer ids here; they become an Enum once every chunk is read.
    packets = columns.frame(PACKET_COLUMNS, arrays, present)

    def record_end(rows):  # the end of the rows' captured bytes in the file
        return recs.data_off[rows] + recs.caplen[rows].astype(np.int64)

    with_sack = np.flatnonzero(hdr.sack_blocks > 0)
    n_sack = int(hdr.sack_blocks[with_sack].sum())
    sack = {c.name: np.empty(n_sack, c.dtype) for c in TCP_SACK_COLUMNS}
    if n_sack:
        hdr_start = hdr.payload_offset[with_sack] - hdr.l4_hdr_len[with_sack].astype(np.int64)
        hdr_end = np.minimum(hdr.payload_offset[with_sack], record_end(with_sack))
        written = sack_blocks(buf, hdr_start, hdr_end, frame_no[with_sack], sack["frame"], sack["block"],
                              sack["left"], sack["right"])
        sack = {k: v[:written] for k, v in sack.items()}
    sack_frame = columns.frame(TCP_SACK_COLUMNS, sack)

    is_icmp = (present & int(Present.ICMP)) != 0
    is_error = is_icmp & (((hdr.ip_proto == 1) & np.isin(hdr.icmp_type, ICMP_ERROR_TYPES))
                          | ((hdr.ip_proto == 58) & np.isin(hdr.icmp_type, ICMPV6_ERROR_TYPES)))
    err = np.flatnonzero(is_error)
    m = len(err)
    q_hi, q_lo, q_fam = np.zeros(2 * m, np.uint64), np.zeros(2 * m, np.uint64), np.zeros(2 * m, np.uint8)
    q = {"inner_proto": np.zeros(m, np.uint8), "inner_sport": np.zeros(m, np.uint16),
         "inner_dport": np.zeros(m, np.uint16)}
    if m:
        icmp_quotes(buf, hdr.payload_offset[err], record_end(err), q_hi, q_lo, q_fam,
                    q["inner_proto"], q["inner_sport"], q["inner_dport"])
    q_ids = addresses.intern(q_hi, q_lo, q_fam, 2 * m)
    q.update(frame=frame_no[err], icmp_type=hdr.icmp_type[err], icmp_code=hdr.icmp_code[err],
             inner_src=q_ids[0::2].copy(), inner_dst=q_ids[1::2].copy())
    icmp_frame = columns.frame(ICMP_ERROR_COLUMNS, q, None)
    icmp_frame = icmp_frame.with_columns(
        pl.when(pl.col(c) != _ADDRESS_NULL).then(pl.col(c)).alias(c) for c in ("inner_src", "inner_dst"))
    return packets, sack_frame, icmp_frame


def _u32(buf, off: int, big_endian: bool) -> int:
    return struct.unpack(">I" if big_endian else "<I", bytes(buf[off:off + 4]))[0]


def _stop_reason(fmt: FileFormat, buf, off: int, stop: int, big_endian: bool) -> str:
    """What stopped the walk at ``off``, in words with the numbers (records.STOP_MESSAGES plus detail).

    The phrases "cut short" (the file ends inside a record) and "cannot be right" (a corrupt length)
    are kept for the callers that tell the two apart."""
    size = len(buf)
    left = size - off
    if fmt.kind == "pcap":
        header = fmt.record_header_len
        if stop == rk.STOP_TRUNCATED:
            if left < header:
                return f"the file ends in the middle of a record header (cut short: {left} of {header} bytes)"
            incl = _u32(buf, off + 8, big_endian)
            return (f"the file ends in the middle of a record (cut short: {left - header:,} of its "
                    f"{incl:,} bytes of packet data)")
        if stop == rk.STOP_BOGUS_LENGTH:
            incl = _u32(buf, off + 8, big_endian)
            limit = max(min(fmt.snaplen, rk.MAX_TRUSTED_SNAPLEN), rk.MAX_STANDARD_RECORD)
            return (f"a record length that cannot be right ({incl:,} bytes captured, more than the "
                    f"{limit:,} a record can hold here): corrupt file")
        return rk.STOP_MESSAGES[stop]
    if left < 12 and stop == rk.STOP_TRUNCATED:
        return f"the file ends in the middle of a block header (cut short: {left} of 12 bytes)"
    blen = _u32(buf, off + 4, big_endian) if left >= 8 else 0
    if stop == rk.STOP_TRUNCATED:
        if blen > MAX_PLAUSIBLE_BLOCK:
            return (f"a block length that cannot be right ({blen:#x} = {blen:,} bytes, more than any pcapng "
                    f"block holds; {left:,} bytes follow): corrupt file")
        return f"the file ends in the middle of a block (cut short: {left:,} of its {blen:,} bytes)"
    if stop == rk.STOP_BOGUS_LENGTH:
        if blen < 12 or blen % 4:
            return (f"a block length that cannot be right ({blen:,} bytes: a pcapng block is a multiple "
                    f"of 4 bytes, at least 12): corrupt file")
        trailer = _u32(buf, off + blen - 4, big_endian)
        return (f"a block length that cannot be right ({blen:,} bytes at the start of the block, "
                f"{trailer:,} at its end): corrupt file")
    if stop == rk.STOP_BAD_SECTION and left >= 12:
        btype = _u32(buf, off, big_endian)
        if btype != rk.BT_SHB:
            return f"a block of type {btype:#x} where a pcapng section header block was required: corrupt file"
        magic = bytes(buf[off + 8:off + 12])
        if magic not in (b"\x4d\x3c\x2b\x1a", b"\x1a\x2b\x3c\x4d"):
            return (f"a pcapng section header whose byte-order magic is {magic.hex(' ')} "
                    f"(expected 4d 3c 2b 1a or its reverse): corrupt header")
        if left >= 16:
            major = struct.unpack(">H" if big_endian else "<H", bytes(buf[off + 12:off + 14]))[0]
            minor = struct.unpack(">H" if big_endian else "<H", bytes(buf[off + 14:off + 16]))[0]
            return f"a pcapng section header of version {major}.{minor} (only 1.x is defined)"
    return rk.STOP_MESSAGES[stop]


def _filled(arrays, n: int, capacity: int) -> list[np.ndarray]:
    """The first ``n`` rows of each array. The frame's columns are views of them: a chunk filled less
    than half is copied, so its whole allocation is not kept alive."""
    return [a[:n].copy() if n < capacity // 2 else a[:n] for a in arrays]


_NO_MASK = np.zeros(0, np.bool_)


def part_arrays(kept: tuple[np.ndarray, np.ndarray] | None, capacity: int, first_record: int) -> tuple:
    """The ``part`` argument of the reading kernels for one chunk (``analyzer.kernels.reading``: reading
    in part): ``kept``'s (keep, timed) masks over the file's records, the chunk's first record (number -
    1) and its outputs: every kept row's frame number, (frame, ts_ns) of the timed records. Without
    ``kept``, empty arrays that say "every record is a row"."""
    if kept is None:
        return (False, _NO_MASK, _NO_MASK, 0, 0, np.zeros(0, np.uint32), np.zeros(0, np.uint32), np.zeros(0, np.int64), 0)
    keep, timed = (np.ascontiguousarray(m, dtype=np.bool_) for m in kept)
    return (True, keep, timed, first_record, 0, np.empty(capacity, np.uint32), np.empty(capacity, np.uint32),
            np.empty(capacity, np.int64), 0)


def read_tables(path, *, chunk_records: int = DEFAULT_CHUNK_RECORDS, progress: bool | None = None,
                data: CaptureBytes | None = None, kept: tuple[np.ndarray, np.ndarray] | None = None,
                packet_columns: tuple[str, ...] | None = None, silence_ns: int | None = KEEP_EVERY_TIME,
                reduce: ChunkReduction | None = None, indexed: IndexedPart | None = None
                ) -> tuple[CaptureBytes, PacketTables]:
    """Read every record of ``path``. Raises :class:`UnreadableCapture` when the file is not a capture
    at all; damage inside a capture is reported in the returned :class:`ReadReport`.

    ``kept`` (a part of a capture already read whole, ``analyzer.partitions``): two boolean arrays over
    the file's records (frame number - 1): the rows to keep, and the records whose (frame, ts_ns) go to
    the tables' ``times``. Every record is still walked, but only those become rows: the others are not
    decoded, nor their addresses interned (the caller casts the addresses to the whole reading's Enum),
    ``analyzer.kernels.reading``. The report's record and walker counts are the whole file's, its
    ``parse_status`` the kept rows'; the interfaces frame is inferred from the kept rows only (the
    caller replaces it). ``silence_ns``: each chunk's ``times`` thinned to its span and silences of at
    least that long (``analyzer.kernels.silences``; None: every timed record's); the reader of a part,
    ``analyzer.capture``, thins their concatenation over the files once more. ``reduce``: what is kept
    of each chunk's packets (:class:`ChunkReduction`, handed ``packet_columns`` and ``READ_COLUMNS``); the
    interfaces' effective resolution is sampled from every packet as it is read all the same
    (``analyzer.resolution.TickSampler``), and the tables' ``rows`` says how many were read; it is
    handed the walker's row of every record as well (:meth:`ChunkReduction.records`: a record index).
    ``indexed`` (instead of ``kept``): a part read from the whole reading's record index, its records'
    rows decoded without walking the file (:class:`IndexedPart`, ``analyzer.record_index``)."""
    data = data or open_bytes(path, populate=indexed is None)  # a part read from an index walks no record
    buf = data.buf
    fmt = detect(bytes(buf[:PCAP_FILE_HEADER_LEN]))
    if fmt is None:
        head, size = bytes(buf[:PCAP_FILE_HEADER_LEN]), len(buf)
        data.close()
        if size == 0 and data.compressed:
            reason = "the gzip data decompresses to nothing"
        elif size == 0 and data.spilled:
            reason = "empty input (nothing arrived)"
        else:
            reason = why_not(head, size)
        raise UnreadableCapture(f"{data.path}: {reason}" + (f"; {data.gzip_damage}" if data.gzip_damage else ""))
    report = ReadReport(format=fmt.description, gzip=data.compressed, gzip_truncated=not data.gzip_complete,
                        gzip_damage=data.gzip_damage)
    counts = np.zeros(rk.N_COUNTS, np.int64)
    state = rk.new_state(fmt.big_endian)
    ifaces = rk.allocate_interfaces()
    addresses = AddressTable()
    size = len(buf)
    # A record is at least 16 bytes (pcap header) / 16 (smallest SPB): no chunk needs more rows.
    capacity = max(1, min(chunk_records, size // 16 + 1))
    off = PCAP_FILE_HEADER_LEN if fmt.kind == "pcap" else 0
    pieces: list[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]] = []
    times: list[pl.DataFrame] = []
    status_counts = np.zeros(len(PARSE_STATUS_NAMES), np.int64)
    ticks = TickSampler()
    next_frame, rows = 1, 0
    narrow = None if packet_columns is None else [c.name for c in PACKET_COLUMNS
                                                 if c.name in set(packet_columns) | set(READ_COLUMNS)]
    bar = _Progress(size, "reading", progress)
    section = _shb_options(buf, fmt.big_endian) if fmt.kind == "pcapng" else {}

    def take(recs, hdr, ids, n: int, first_frame: int, row_frames, allocated: int = capacity) -> None:
        """Rows 0..n of a chunk walked (or read from the index) and decoded, its arrays ``allocated``
        rows long: into ``pieces``."""
        nonlocal rows
        recs, hdr = type(recs)(*_filled(recs, n, allocated)), type(hdr)(*_filled(hdr, n, allocated))
        chunk = _chunk_frames(data, recs, hdr, *_filled(ids, n, allocated), n, first_frame, addresses, row_frames)
        codes = chunk[0]["parse_status"].to_physical().to_numpy()
        status_counts[:] += np.bincount(codes, minlength=len(PARSE_STATUS_NAMES))[:len(PARSE_STATUS_NAMES)]
        rows_read = chunk[0]
        ticks.add(rows_read["ts_ns"].to_numpy(), rows_read["iface"].to_numpy(),
                  timed_packets(rows_read["parse_status"]))
        rows += n
        if narrow is not None:
            chunk = (chunk[0].select(narrow), *chunk[1:])
        if reduce is not None:
            chunk = (reduce.chunk(chunk[0]), *chunk[1:])
        pieces.append(chunk)

    try:
        if indexed is not None:
            packed_offsets = None
            if (copy := packed(data, indexed.index, indexed.frames, indexed.key, indexed.following)) is not None:
                data.close()  # every later pass reads the part's records from the copy (analyzer.packed_part)
                (data, packed_offsets), buf = copy, copy[0].buf
            _read_indexed(data, indexed, capacity, addresses, take, packed_offsets)
            if indexed.times:
                times.append(indexed.index.times(indexed.timed, silence_ns))
        while indexed is None:
            recs, hdr = rk.allocate_records(capacity), allocate_headers(capacity)
            ids = (np.empty(capacity, np.uint32), np.empty(capacity, np.uint32))  # src, dst
            part = part_arrays(kept, capacity, next_frame - 1)
            n = 0
            while True:
                if fmt.kind == "pcap":
                    n, off, stop, walked, n_timed = read_pcap(
                        buf, off, fmt.big_endian, fmt.nanosecond, fmt.record_header_len, fmt.snaplen, fmt.linktype,
                        recs, hdr, n, addresses.arrays(), *ids, state, counts, part)
                else:
                    n, off, stop, walked, n_timed = read_pcapng(buf, off, recs, hdr, n, addresses.arrays(), *ids,
                                                                ifaces, state, counts, part)
                if stop != STOP_TABLE_FULL:
                    break
                addresses.grow()
                part = part[:4] + (walked,) + part[5:8] + (n_timed,)
            if kept is not None:
                times.append(thinned_times(pl.DataFrame({"frame": part[6][:n_timed].copy(),
                                                         "ts_ns": part[7][:n_timed].copy()}), silence_ns))
            if reduce is not None and kept is None:
                reduce.records(recs, n)  # read whole: every record walked is a row
            if n:
                take(recs, hdr, ids, n, next_frame, part[5][:n].copy() if kept is not None else None)
            next_frame += walked
            bar.update(off)
            if stop != rk.STOP_FULL:
                break
    except BaseException:
        if reduce is not None:
            reduce.close()  # what it wrote to disk so far
        raise
    finally:
        bar.close()

    if indexed is not None:  # the whole reading's, as a walk of the part would have found them
        report = dataclasses.replace(indexed.index.report, counts=dict(indexed.index.report.counts))
    else:
        report.records = next_frame - 1
        if stop != rk.STOP_EOF:
            report.stop = _stop_reason(fmt, buf, int(off), stop, bool(state[rk.ST_BIG_ENDIAN]))
            report.stop_offset = int(off)
            report.bytes_not_read = int(size - off)
        report.counts = {name: int(v) for name, v in zip(rk.COUNT_NAMES, counts) if v}
    if reduce is not None and indexed is None and kept is None:
        reduce.records_done(ifaces.linktype[:int(state[rk.ST_N_IFACES])] if fmt.kind == "pcapng" else (),
                            fmt.linktype if fmt.kind == "pcap" else -1, report)

    texts = addresses.texts()
    address_enum = pl.Enum(texts)
    if pieces:
        packets = pl.concat([p[0] for p in pieces], rechunk=False)
        sack = pl.concat([p[1] for p in pieces], rechunk=False)
        icmp = pl.concat([p[2] for p in pieces], rechunk=False)
    else:
        packets = empty_frame(PACKET_COLUMNS) if narrow is None else empty_frame(PACKET_COLUMNS).select(narrow)
        packets = packets if reduce is None else reduce.chunk(packets)
        sack = empty_frame(TCP_SACK_COLUMNS)
        icmp = empty_frame(ICMP_ERROR_COLUMNS)
    packets = packets.with_columns(columns.enum_from_codes(packets[c], address_enum).alias(c)
                                   for c in ("src", "dst") if c in packets.columns)
    if reduce is not None:
        packets = reduce.finish(packets)
    icmp = icmp.with_columns(columns.enum_from_codes(icmp[c], address_enum).alias(c)
                             for c in ("inner_src", "inner_dst"))
    report.parse_status = {name: int(v) for name, v in zip(PARSE_STATUS_NAMES, status_counts) if v}
    # a part read from the index walked no interface block: its reader sets the whole reading's
    interfaces = (empty_frame(INTERFACE_COLUMNS) if indexed is not None
                  else _interfaces_frame(fmt, buf, ifaces, int(state[rk.ST_N_IFACES]), ticks))
    tables = PacketTables(packets, sack, icmp, interfaces, report, fmt, section, address_dtype=address_enum,
                          rows=rows if reduce is not None else None)
    if kept is not None or indexed is not None:
        tables.times = pl.concat(times) if times else pl.DataFrame(schema={"frame": pl.UInt32, "ts_ns": pl.Int64})
    return data, tables


__all__ = ["read_tables", "ReadReport", "PacketTables", "ParseStatus", "ChunkReduction", "IndexedPart"]
