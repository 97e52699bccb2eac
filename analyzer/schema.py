"""Frame schemas: every column of every frame herdscope produces, with a one-line description.

A schema is a table, in the spirit of dpkt's ``__hdr__``: the Numba kernels allocate their output
arrays from it, the ingest driver turns those arrays into Polars columns with it, and ``herdscope
export`` and the README document the frames from it. A column is *present when* a bit of the packet's
``present`` mask is set (see :class:`Present`); where the bit is clear the value is null, the way
Wireshark leaves a field empty when the layer is absent.

Conventions: times are Int64 nanoseconds since the Unix epoch (UTC) in columns named ``*_ns``;
durations are Int64 nanoseconds; frame numbers are Wireshark's 1-based numbering within one file;
addresses are Polars ``Enum`` columns whose categories are the textual address (IPv6 in RFC 5952 form,
as Wireshark prints it), so they cost 4 bytes a packet and still read as text.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, IntFlag

import numpy as np
import polars as pl


class Present(IntFlag):
    """Bits of the per-packet ``present`` mask: which layers and options a packet carried."""

    IP = 1 << 0  # an IPv4 or IPv6 header was decoded
    L4 = 1 << 1  # a TCP, UDP or ICMP header was decoded (ports/type present)
    TCP = 1 << 2
    UDP = 1 << 3
    ICMP = 1 << 4  # ICMP or ICMPv6
    VLAN = 1 << 5  # at least one 802.1Q/802.1ad tag
    MSS = 1 << 6
    WSCALE = 1 << 7
    SACK_PERM = 1 << 8
    TSOPT = 1 << 9  # TCP timestamps option
    PAYLOAD = 1 << 10  # payload_offset/payload_len are meaningful (transport or IP payload located; for
    # EtherType 0x8808 the MAC Control payload)
    FRAG = 1 << 11  # IPv4 or IPv6 fragmentation fields present (a fragment)


class ParseStatus(IntEnum):
    """How far the header decoder got with a packet. Every record has a row whatever its status."""

    OK = 0  # decoded down to the transport header (or IP payload for other protocols)
    NOT_IP = 1  # a link-layer frame that carries no IP (ARP, LLDP, STP ...): nothing to do
    UNSUPPORTED_LINKTYPE = 2  # link type herdscope does not decode (counted, reported)
    TRUNCATED_L2 = 3  # caplen shorter than the link-layer header
    TRUNCATED_L3 = 4  # IP header cut by the snapshot length
    TRUNCATED_L4 = 5  # TCP/UDP/ICMP header cut by the snapshot length
    BAD_L3 = 6  # malformed IP header (bad version, IHL < 5, total length < header)
    BAD_L4 = 7  # malformed transport header (TCP data offset < 5, UDP length < 8)
    FRAGMENT = 8  # a non-first IP fragment: no transport header in this packet
    IP_OTHER = 9  # IP with a protocol herdscope does not parse further (GRE, ESP, SCTP ...)
    NOT_PACKET = 10  # a pcapng custom block or systemd journal entry: a frame in Wireshark, no packet


PARSE_STATUS_NAMES = [s.name.lower() for s in ParseStatus]


@dataclass(frozen=True)
class Column:
    name: str
    dtype: type  # numpy dtype of the kernel's array
    description: str
    present: Present | None = None  # null unless this bit is set; None = always present
    polars: pl.DataType | None = None  # overrides the Polars type derived from dtype


def column(name, dtype, description, present=None, polars=None):
    return Column(name, dtype, description, present, polars)


# The packets frame: one row per record, in file order.  Order here is column order.
PACKET_COLUMNS: tuple[Column, ...] = (
    column("frame", np.uint32, "Wireshark's frame number: 1-based record index in the file"),
    column("ts_ns", np.int64, "capture timestamp, ns since the Unix epoch (UTC), interface offset applied"),
    column("iface", np.uint16, "interface index (pcapng: global across sections; pcap: 0)"),
    column("caplen", np.uint32, "bytes captured for this record"),
    column("wirelen", np.uint32, "bytes on the wire (original length)"),
    column("parse_status", np.uint8, "how far header decoding got (ParseStatus name)",
         polars=pl.Enum(PARSE_STATUS_NAMES)),
    column("vlan", np.uint16, "innermost 802.1Q/802.1ad VLAN id", Present.VLAN),
    column("ethertype", np.uint16, "network-layer protocol: EtherType (0x0800 IPv4, 0x86dd IPv6, ...)"),
    column("src", np.uint32, "source IP address (text; IPv6 first-class)", Present.IP),
    column("dst", np.uint32, "destination IP address (text)", Present.IP),
    column("ip_proto", np.uint8, "IP protocol / IPv6 upper-layer next header (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6)",
         Present.IP),
    column("ttl", np.uint8, "IPv4 TTL or IPv6 hop limit", Present.IP),
    column("dscp", np.uint8, "Differentiated Services codepoint (RFC 2474): the upper 6 bits of the IPv4 TOS "
         "byte / IPv6 traffic class (Wireshark's ip.dsfield.dscp, ipv6.tclass.dscp)", Present.IP),
    column("ecn", np.uint8, "ECN codepoint (RFC 3168 section 5), the low 2 bits of the TOS byte / traffic "
         "class: 0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE (ip.dsfield.ecn, ipv6.tclass.ecn)", Present.IP),
    column("ip_id", np.uint32, "IPv4 identification, or IPv6 fragment-header identification", Present.IP),
    column("frag_offset", np.uint16, "fragment offset in bytes (0 for first fragments and whole datagrams)",
         Present.IP),
    column("ip_flags", np.uint8, "bit 0: more fragments (MF/M); bit 1: don't fragment (IPv4 DF)", Present.IP),
    column("sport", np.uint16, "TCP/UDP source port", Present.L4),
    column("dport", np.uint16, "TCP/UDP destination port", Present.L4),
    column("tcp_flags", np.uint16, "TCP flags, 12 bits as Wireshark's tcp.flags: FIN 0x01 SYN 0x02 RST 0x04 "
         "PSH 0x08 ACK 0x10 URG 0x20 ECE 0x40 CWR 0x80 AE(NS) 0x100, reserved 0xE00", Present.TCP),
    column("seq", np.uint32, "TCP sequence number (absolute, as on the wire)", Present.TCP),
    column("ack", np.uint32, "TCP acknowledgment number (absolute)", Present.TCP),
    column("window", np.uint16, "TCP window field, unscaled", Present.TCP),
    column("mss", np.uint16, "TCP MSS option value", Present.MSS),
    column("wscale", np.uint8, "TCP window-scale option shift count", Present.WSCALE),
    column("sack_perm", np.bool_, "TCP SACK-permitted option seen", Present.TCP),
    column("sack_blocks", np.uint8, "number of TCP SACK blocks (the blocks are in the tcp_sack frame)",
         Present.TCP),
    column("ts_val", np.uint32, "TCP timestamps option TSval", Present.TSOPT),
    column("ts_ecr", np.uint32, "TCP timestamps option TSecr", Present.TSOPT),
    column("icmp_type", np.uint8, "ICMP/ICMPv6 type", Present.ICMP),
    column("icmp_code", np.uint8, "ICMP/ICMPv6 code", Present.ICMP),
    column("l4_hdr_len", np.uint8, "transport header length in bytes (TCP data offset x 4, UDP/ICMP 8)",
         Present.L4),
    column("payload_offset", np.int64, "file offset of the transport payload (IP payload when no transport "
         "header; the MAC Control opcode for EtherType 0x8808) in the capture buffer", Present.PAYLOAD),
    column("payload_len", np.uint32, "payload bytes this packet carries per its IP/UDP length fields "
         "(Wireshark's tcp.len for TCP; MAC Control: the frame's wire length after its MAC header); may exceed "
         "what was captured", Present.PAYLOAD),
    column("payload_caplen", np.uint32, "payload bytes actually in the file (payload_len cut by the snapshot "
         "length)", Present.PAYLOAD),
)

# Columns the kernel fills that never reach the frame (used to derive validity).
PACKET_SCRATCH = ("present",)

TCP_SACK_COLUMNS: tuple[Column, ...] = (
    column("frame", np.uint32, "frame number of the segment carrying the SACK option"),
    column("block", np.uint8, "index of the block within the option (0-based)"),
    column("left", np.uint32, "left edge of the SACK block (absolute sequence number)"),
    column("right", np.uint32, "right edge of the SACK block (absolute sequence number, exclusive)"),
)

ICMP_ERROR_COLUMNS: tuple[Column, ...] = (
    column("frame", np.uint32, "frame number of the ICMP/ICMPv6 error message"),
    column("icmp_type", np.uint8, "ICMP type (3 unreachable, 11 time exceeded, ...; ICMPv6 1-4)"),
    column("icmp_code", np.uint8, "ICMP code (e.g. 3 port unreachable)"),
    column("inner_src", np.uint32, "source address of the datagram that caused the error"),
    column("inner_dst", np.uint32, "destination address of the datagram that caused the error"),
    column("inner_proto", np.uint8, "IP protocol of the quoted datagram"),
    column("inner_sport", np.uint16, "source port of the quoted datagram (0 when not TCP/UDP or cut)"),
    column("inner_dport", np.uint16, "destination port of the quoted datagram (0 when not TCP/UDP or cut)"),
)

INTERFACE_COLUMNS: tuple[Column, ...] = (
    column("iface", np.uint16, "interface index, as in packets.iface"),
    column("section", np.uint16, "pcapng section number (0-based; 0 for pcap)"),
    column("linktype", np.int32, "LINKTYPE_ value of the interface"),
    column("snaplen", np.uint32, "snapshot length (0 = unlimited)"),
    column("ts_resolution_ns", np.float64, "timestamp resolution the file declares for the interface, ns per "
         "tick (pcap magic, pcapng if_tsresol)"),
    column("ts_offset_s", np.int64, "if_tsoffset: seconds added to every timestamp"),
    column("name", object, "if_name (or if_description) of the interface, when the file gives one",
         polars=pl.String),
    column("linktype_name", object, "name of the link type, as capinfos prints it", polars=pl.String),
    column("speed_bps", np.int64, "if_speed of the interface, bits per second, when the pcapng file gives one "
         "(null otherwise, and for pcap)"),
    column("effective_resolution_ns", np.float64, "the tick the interface's timestamps really have, ns: the "
         "coarser of ts_resolution_ns and the tick inferred from the data (analyzer/resolution.py); "
         "ts_resolution_ns when there are too few timestamps to tell"),
    column("effective_resolution_samples", np.int64, "nonzero differences between the interface's consecutive "
         "packet timestamps the effective resolution was inferred from (fewer than "
         "resolution.MIN_DIFFERENCES: not inferred)"),
)

FRAMES: dict[str, tuple[Column, ...]] = {
    "packets": PACKET_COLUMNS,
    "tcp_sack": TCP_SACK_COLUMNS,
    "icmp_errors": ICMP_ERROR_COLUMNS,
    "interfaces": INTERFACE_COLUMNS,
}


def polars_type(column: Column) -> pl.DataType:
    """The Polars type of a schema column: its override, String for text, else from its NumPy dtype."""
    if column.polars is not None:
        return column.polars
    if column.dtype is object:
        return pl.String
    return pl.Series(np.empty(0, column.dtype)).dtype


def empty_frame(columns: tuple[Column, ...]) -> pl.DataFrame:
    """A frame with these columns and no rows (what a builder returns when there is nothing)."""
    return pl.DataFrame(schema={c.name: polars_type(c) for c in columns})


def describe(frame: str) -> dict[str, str]:
    """Column name → one-line description for a frame (used by docs and ``export``)."""
    return {c.name: c.description for c in FRAMES[frame]}
