"""Frames: hosts, one-direction paths and the packet store (packet emission).

Every frame is packed with ``struct`` from per-flow precomputed pieces; checksums use the identity
"ones'-complement sum of 16-bit words == value mod 0xFFFF", so one ``int.from_bytes`` per
header/payload replaces a per-word loop: the checksum is ``-sum % 0xFFFF`` (0x0000 rather than
0xFFFF when the sum is "negative zero", as RFC 1624 asks; UDP sends 0xFFFF for a computed 0,
RFC 768). dpkt builds the reference frames the tests compare against (:func:`dpkt_reference_frame`).
"""
from __future__ import annotations

import ipaddress
import struct

_IP4 = struct.Struct("!BBHHHBBH4s4s").pack       # RFC 791 §3.1
_IP6 = struct.Struct("!IHBB16s16s").pack         # RFC 8200 §3
_TCP = struct.Struct("!HHIIBBHHH").pack          # RFC 9293 §3.1
_UDP = struct.Struct("!HHHH").pack               # RFC 768
# TCP control bits (RFC 9293 §3.1)
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
PROTO_TCP, PROTO_UDP = 6, 17                     # IANA protocol numbers (RFC 790)
ETH_IPV4, ETH_IPV6 = b"\x08\x00", b"\x86\xdd"   # EtherTypes (IEEE 802 numbers)
ROUTER_MAC = bytes.fromhex("00005e000101")       # VRRP virtual router MAC, VRID 1 (RFC 5798 §7.3)
LOCAL_MAC_PREFIX = b"\x02"                       # locally administered unicast MACs (IEEE 802 U/L bit)
IPV4_VERSION_IHL = 0x45                          # version 4, 5 words of header (RFC 791 §3.1)
IPV4_HEADER_LEN = 20
IPV4_DF = 0x4000                                 # flags: Don't Fragment (RFC 791 §3.1)
IPV6_VERSION_WORD = 0x60000000                   # version 6, traffic class 0, flow label 0 (RFC 8200 §3)
TCP_HEADER_LEN = 20                              # without options (RFC 9293 §3.1)
UDP_HEADER_LEN = 8
UDP_NO_CHECKSUM = 0xFFFF                         # a computed 0 is sent as all ones (RFC 768)
TTL_WINDOWS, TTL_LINUX = 128, 64                 # initial TTL / hop limit of the two stacks


class Host:
    """An endpoint. ``local`` hosts sit on the capture's segment; others come through the router."""
    __slots__ = ("ip", "addr", "v6", "mac", "ttl", "windows", "local", "rtt", "port", "name")

    def __init__(self, ip: str, *, windows: bool, local: bool, rtt: int, port: int, name: str = ""):
        a = ipaddress.ip_address(ip)
        self.ip, self.addr, self.v6 = str(a), a.packed, a.version == 6
        self.mac = LOCAL_MAC_PREFIX + a.packed[-5:] if self.v6 else LOCAL_MAC_PREFIX + b"\x00" + a.packed
        self.windows, self.local, self.rtt, self.port = windows, local, rtt, port
        # TTL as seen at the capture point: routed hosts have crossed one hop
        self.ttl = (TTL_WINDOWS if windows else TTL_LINUX) - (0 if local else 1)
        self.name = name or ip

    def ephemeral(self) -> int:
        p = self.port
        self.port = p + 1 if p < 65535 else 49152
        return p


class Path:
    """One direction of one flow with everything that does not change per packet."""
    __slots__ = ("eth", "src", "dst", "sport", "dport", "psum", "ttl", "v6", "ipid", "proto")

    def __init__(self, a: Host, b: Host, sport: int, dport: int, proto: int, ipid: int):
        if a.v6 != b.v6:
            raise ValueError("mixed address families")
        src_mac = a.mac if a.local else ROUTER_MAC
        dst_mac = b.mac if b.local else ROUTER_MAC
        self.eth = dst_mac + src_mac + (ETH_IPV6 if a.v6 else ETH_IPV4)
        self.src, self.dst, self.sport, self.dport = a.addr, b.addr, sport, dport
        # the pseudo-header's addresses and protocol (RFC 9293 §3.1, RFC 8200 §8.1), summed once
        self.psum = int.from_bytes(a.addr + b.addr, "big") + proto
        self.ttl, self.v6, self.ipid, self.proto = a.ttl, a.v6, ipid, proto


class Store:
    """Timestamps (ns from capture start) and frames in creation order; sorted when written."""

    def __init__(self):
        self.ts: list[int] = []
        self.frames: list[bytes] = []

    def __len__(self) -> int:
        return len(self.ts)

    def rollback(self, mark: int) -> None:
        del self.ts[mark:]
        del self.frames[mark:]

    def _ip(self, t: int, p: Path, l4: bytes, n: int) -> None:
        if p.v6:
            hdr = _IP6(IPV6_VERSION_WORD, n, p.proto, p.ttl, p.src, p.dst)
        else:
            ipid = p.ipid = (p.ipid + 1) & 0xFFFF
            hdr = _IP4(IPV4_VERSION_IHL, 0, IPV4_HEADER_LEN + n, ipid, IPV4_DF, p.ttl, p.proto, 0, p.src, p.dst)
            hdr = _IP4(IPV4_VERSION_IHL, 0, IPV4_HEADER_LEN + n, ipid, IPV4_DF, p.ttl, p.proto,
                       -int.from_bytes(hdr, "big") % 0xFFFF, p.src, p.dst)
        self.ts.append(t)
        self.frames.append(p.eth + hdr + l4)

    def tcp(self, t: int, p: Path, seq: int, ack: int, flags: int, win: int, opts: bytes,
            payload: bytes) -> None:
        hl = TCP_HEADER_LEN + len(opts)
        n = hl + len(payload)
        v = int.from_bytes(payload, "big")
        if n & 1:
            v <<= 8
        off = hl << 2                                # data offset in 32-bit words, in the top nibble
        h = _TCP(p.sport, p.dport, seq, ack, off, flags, win, 0, 0)
        s = p.psum + n + int.from_bytes(h, "big") + int.from_bytes(opts, "big") + v
        h = _TCP(p.sport, p.dport, seq, ack, off, flags, win, -s % 0xFFFF, 0)
        self._ip(t, p, h + opts + payload, n)

    def udp(self, t: int, p: Path, payload: bytes) -> None:
        n = UDP_HEADER_LEN + len(payload)
        v = int.from_bytes(payload, "big")
        if n & 1:
            v <<= 8
        s = p.psum + n + n + (p.sport << 16) + p.dport + v
        self._ip(t, p, _UDP(p.sport, p.dport, n, -s % 0xFFFF or UDP_NO_CHECKSUM) + payload, n)


def dpkt_reference_frame(frame: bytes) -> bytes:
    """Re-encode ``frame`` with dpkt, letting dpkt compute every checksum (for tests)."""
    import dpkt
    eth = dpkt.ethernet.Ethernet(frame)
    ip = eth.data
    l4 = ip.data
    if isinstance(l4, (dpkt.tcp.TCP, dpkt.udp.UDP)):
        l4.sum = 0
    if isinstance(ip, dpkt.ip.IP):
        ip.sum = 0
    return bytes(eth)
