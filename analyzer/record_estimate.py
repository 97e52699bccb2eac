"""How many records a capture holds, estimated before it is read: what ``scan``, ``stats`` and ``info``
decide by whether to decode in partitions (``analyzer.distributed``, issue 13) when no ``--partitions``
says (:func:`partitions_for`).

A scan's memory grows with the packets, not the bytes (about 500 B of decoded frames per packet,
whatever its length), and pcap and pcapng do not say how many records they hold. So the records are
sampled in :data:`SAMPLE_WINDOWS` windows spread evenly over the file (the first at its start: a
capture's first seconds are often its handshakes, smaller than the rest), each window's first
record found as where :data:`RESYNC_CHAIN` plausible records follow one another (pcap: lengths
within the snap length, a fraction of a second in range; pcapng: a block's trailing length repeats
its leading one), and the file's size divided by the sampled bytes per packet (16 MB read, a few
ms; a file under that is walked whole, and its count is exact). A ring buffer's files are estimated one by one. Only
regular, uncompressed files are estimated: a gzip file would be decompressed again by each partition,
and what arrives on standard input cannot be read twice (None: no estimate, a capture of it is not
partitioned unless asked).
"""
from __future__ import annotations

import math
import os
import struct

from .formats import PCAP_FILE_HEADER_LEN, detect
from .progress import stage
from .source import STDIN

SAMPLE_WINDOWS = 16  # places of the file sampled, evenly spaced from its start
SAMPLE_WINDOW_BYTES = 1 << 20  # bytes read at each: a thousand records of an average 1 kB
RESYNC_CHAIN = 4  # plausible records in a row that mark where records start in a window
MAX_RECORD_BYTES = 262_144  # the largest plausible packet (libpcap's maximum snap length)
MAX_BLOCK_BYTES = 16 << 20  # the largest plausible pcapng block
# pcapng blocks that hold a packet (Enhanced, Simple, obsolete Packet Block): the records the reader counts
_PCAPNG_PACKET_BLOCKS = (6, 3, 2)
_PCAPNG_BLOCK_HEADER_LEN = 8  # block type, block total length
_PCAPNG_ALIGN = 4  # every pcapng block starts at a multiple of 4 bytes from the file's start (§3.1)

# the default partitions of a scan, stats or info (automatic_partitions): a capture estimated at fewer
# than AUTO_MIN_PACKETS is decoded whole (partitions cost time: each walks the files again, and on the
# 1M synth capture 4 partitions take ~1.6x the time of one), a larger one in partitions of about
# PARTITION_PACKETS packets, at most AUTO_MAX_PARTITIONS (each walks every record of the files, so
# the walks grow with the square of the size).
AUTO_MIN_PACKETS = 5_000_000
PARTITION_PACKETS = 2_500_000
AUTO_MAX_PARTITIONS = 16


def estimated_records(path: str | os.PathLike) -> int | None:
    """The number of records of the capture file at ``path``, estimated from its size and a sample of
    its records (module doc); None for what cannot be estimated (not a regular file, compressed, not
    a capture, no whole record found)."""
    path = os.fspath(path)
    if path == STDIN or not os.path.isfile(path):  # isfile first: opening a FIFO would wait for a writer
        return None
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fmt = detect(fh.read(PCAP_FILE_HEADER_LEN))
            if fmt is None:
                return None
            record = (_PcapngBlocks(fmt.big_endian) if fmt.kind == "pcapng" else
                      _PcapRecords(fmt.big_endian, fmt.record_header_len, fmt.snaplen, fmt.nanosecond))
            records = sampled = 0
            windows = SAMPLE_WINDOWS if size > SAMPLE_WINDOWS * SAMPLE_WINDOW_BYTES else 1
            for k in range(windows):
                fh.seek(record.first + (size - record.first) * k // windows // record.align * record.align)
                window = fh.read(SAMPLE_WINDOW_BYTES if windows > 1 else size)  # a small file: all of it
                n, nbytes = _walk(window, 0 if k == 0 else _resync(window, record), record)
                records += n
                sampled += nbytes
    except OSError:
        return None
    if not records:
        return None
    return math.ceil((size - record.first) * records / sampled)


class _PcapRecords:
    """Classic pcap record headers: the length of the record at an offset of a window, or None where
    no plausible record starts (its lengths beyond the snap length, or the captured beyond the wire
    length; the fraction of a second out of range). Every record holds a packet."""

    first = PCAP_FILE_HEADER_LEN  # the file offset of the first record
    align = 1  # records start at any byte

    def __init__(self, big_endian: bool, header_len: int, snaplen: int, nanosecond: bool):
        self.order, self.header_len = (">" if big_endian else "<"), header_len
        self.max_caplen = max(snaplen, MAX_RECORD_BYTES)
        self.max_fraction = 1_000_000_000 if nanosecond else 1_000_000

    def length(self, window: bytes, at: int) -> int | None:
        if at + self.header_len > len(window):
            return None
        _, fraction, caplen, wirelen = struct.unpack_from(self.order + "IIII", window, at)
        if fraction >= self.max_fraction or caplen > self.max_caplen or caplen > wirelen:
            return None
        return self.header_len + caplen

    def packet(self, window: bytes, at: int) -> bool:
        return True


class _PcapngBlocks:
    """pcapng blocks: the length of the block at an offset of a window when its trailing length
    repeats it (RFC-draft pcapng §3.1), else None; ``packet`` says whether it holds a packet."""

    first = 0  # the Section Header Block is a block like the others
    align = _PCAPNG_ALIGN

    def __init__(self, big_endian: bool):
        self.order = ">" if big_endian else "<"

    def length(self, window: bytes, at: int) -> int | None:
        if at + _PCAPNG_BLOCK_HEADER_LEN > len(window):
            return None
        length = struct.unpack_from(self.order + "I", window, at + 4)[0]
        if length < 12 or length % 4 or length > MAX_BLOCK_BYTES or at + length > len(window):
            return None
        return length if struct.unpack_from(self.order + "I", window, at + length - 4)[0] == length else None

    def packet(self, window: bytes, at: int) -> bool:
        return struct.unpack_from(self.order + "I", window, at)[0] in _PCAPNG_PACKET_BLOCKS


def _resync(window: bytes, record) -> int | None:
    """The first offset of a window (read from an arbitrary point of the file) where
    :data:`RESYNC_CHAIN` plausible records follow one another, or None."""
    for at in range(0, min(len(window), SAMPLE_WINDOW_BYTES // 2), record.align):  # windows start aligned
        end = at
        for _ in range(RESYNC_CHAIN):
            step = record.length(window, end)
            if step is None:
                break
            end += step
        else:
            return at
    return None


def _walk(window: bytes, at: int | None, record) -> tuple[int, int]:
    """(packets, bytes) of the whole records of ``window`` from ``at``."""
    if at is None:
        return 0, 0
    packets, start = 0, at
    while (step := record.length(window, at)) is not None:
        packets += record.packet(window, at)
        at += step
    return packets, at - start


def estimated_packets(paths: list[str]) -> int | None:
    """The records of these files (one capture), estimated; None when any cannot be."""
    estimates = [estimated_records(p) for p in paths]
    return None if any(e is None for e in estimates) else sum(estimates)


def automatic_partitions(packets: int | None) -> int:
    """How many partitions a command (scan, stats, info) decoding a capture of about ``packets``
    (:func:`estimated_packets`) uses when no ``--partitions`` says (module doc): 1 without an estimate
    or under :data:`AUTO_MIN_PACKETS`."""
    if packets is None or packets < AUTO_MIN_PACKETS:
        return 1
    return min(AUTO_MAX_PARTITIONS, math.ceil(packets / PARTITION_PACKETS))


def partitions_for(paths: list[str], requested: int | None) -> int:
    """The partitions a command (scan, stats, info) decodes the capture of ``paths`` in: ``requested``
    (``--partitions``), or as many as its estimated size asks (:func:`automatic_partitions`), which
    the stage line then says."""
    if requested is not None:
        return requested
    packets = estimated_packets(paths)
    count = automatic_partitions(packets)
    if count > 1:
        stage(f"decode in {count} partitions (a capture of about {packets:,} packets; --partitions 1 "
              f"decodes it at once)")
    return count
