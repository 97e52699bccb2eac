"""Recognising a capture file by its first bytes: classic pcap variants and pcapng."""
from __future__ import annotations

import struct
from dataclasses import dataclass

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAP_MAGIC_KUZNETZOV = 0xA1B2CD34  # Alexey Kuznetzov's patched libpcap: 8 more bytes per record
PCAPNG_SHB = 0x0A0D0D0A
PCAP_FILE_HEADER_LEN = 24


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
