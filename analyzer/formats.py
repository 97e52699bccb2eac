"""Recognising a capture file by its first bytes: classic pcap variants and pcapng."""
from __future__ import annotations

import struct
from dataclasses import dataclass

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAP_MAGIC_KUZNETZOV = 0xA1B2CD34  # Alexey Kuznetzov's patched libpcap: 8 more bytes per record
PCAPNG_SHB = 0x0A0D0D0A
PCAP_FILE_HEADER_LEN = 24
PCAPNG_MIN_SHB_LEN = 28  # block type, length, byte-order magic, version, section length, trailing length
PCAPNG_BYTE_ORDER_MAGIC = b"\x4d\x3c\x2b\x1a"  # 0x1A2B3C4D written little-endian
MAGIC_BYTES = 4  # a capture's format is told by its first 4 bytes
_PCAP_MAGICS = (PCAP_MAGIC_US, PCAP_MAGIC_NS, PCAP_MAGIC_KUZNETZOV)


@dataclass(frozen=True)
class FileFormat:
    kind: str  # "pcap" or "pcapng"
    big_endian: bool
    nanosecond: bool = False  # pcap only
    record_header_len: int = 16  # pcap only
    snaplen: int = 0  # pcap only
    linktype: int = -1  # pcap only
    version: str = ""

    @property
    def description(self) -> str:
        order = "big-endian" if self.big_endian else "little-endian"
        if self.kind == "pcapng":
            return f"pcapng ({order})"
        variant = " (nanosecond)" if self.nanosecond else ""
        if self.record_header_len != 16:
            variant = " (modified/Kuznetzov)"
        return f"pcap{variant} ({order})"


def detect(head: bytes) -> FileFormat | None:
    """The format of a file starting with ``head`` (at least 24 bytes for pcap), or None."""
    if len(head) < 4:
        return None
    if struct.unpack("<I", head[:4])[0] == PCAPNG_SHB:
        if len(head) < 12:
            return None
        bom = head[8:12]
        if bom == b"\x4d\x3c\x2b\x1a":
            return FileFormat("pcapng", False)
        if bom == b"\x1a\x2b\x3c\x4d":
            return FileFormat("pcapng", True)
        return None
    for order, big in (("<", False), (">", True)):
        magic = struct.unpack(order + "I", head[:4])[0]
        if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS, PCAP_MAGIC_KUZNETZOV):
            if len(head) < PCAP_FILE_HEADER_LEN:
                return None
            major, minor, _zone, _sigfigs, snaplen, network = struct.unpack(order + "HHiIII", head[4:24])
            return FileFormat(
                "pcap", big, nanosecond=magic == PCAP_MAGIC_NS,
                record_header_len=24 if magic == PCAP_MAGIC_KUZNETZOV else 16,
                snaplen=snaplen, linktype=network & 0x03FFFFFF, version=f"{major}.{minor}",
            )
    return None


def is_capture_magic(head: bytes) -> bool:
    """Whether ``head`` starts like a pcap or pcapng file (4 bytes suffice)."""
    if len(head) < MAGIC_BYTES:
        return False
    return (struct.unpack("<I", head[:4])[0] == PCAPNG_SHB
            or any(struct.unpack(o + "I", head[:4])[0] in _PCAP_MAGICS for o in "<>"))


def why_not(head: bytes, size: int) -> str:
    """Why a file of ``size`` bytes starting with ``head`` (its first 24 bytes or all of it) is not
    read as a capture: the reason :func:`detect` returned None, in words."""
    if size == 0:
        return "empty file (0 bytes)"
    if struct.unpack("<I", head[:4].ljust(4, b"\0"))[0] == PCAPNG_SHB and size >= MAGIC_BYTES:
        if size < 12:
            return f"the pcapng section header block is cut short ({size} of {PCAPNG_MIN_SHB_LEN} bytes)"
        return (f"a pcapng section header block whose byte-order magic is {head[8:12].hex(' ')} "
                f"(expected {PCAPNG_BYTE_ORDER_MAGIC.hex(' ')} or its reverse): corrupt header")
    if is_capture_magic(head):
        return f"the file header is cut short ({size} of {PCAP_FILE_HEADER_LEN} bytes)"
    if size < MAGIC_BYTES:
        return f"not a pcap or pcapng capture (only {size} byte{'s' if size > 1 else ''}: {head.hex(' ')})"
    return f"not a pcap or pcapng capture (starts with {head[:4].hex(' ')})"
