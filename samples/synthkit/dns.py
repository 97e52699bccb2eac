"""DNS message encoder with name compression (RFC 1035 §4; AAAA RFC 3596; EDNS(0) RFC 6891)."""
from __future__ import annotations

import ipaddress
import struct

# TYPE values (RFC 1035 §3.2.2; AAAA RFC 3596 §2.1; OPT RFC 6891 §6.1.1)
T_A, T_NS, T_CNAME, T_SOA, T_AAAA, T_OPT = 1, 2, 5, 6, 28, 41
CLASS_IN = 1                    # RFC 1035 §3.2.4
HEADER_LEN = 12                 # RFC 1035 §4.1.1
# header section indices of the four counts (RFC 1035 §4.1.1)
QD, AN, NS, AR = 0, 1, 2, 3
# header flags (RFC 1035 §4.1.1)
FLAG_QR, FLAG_TC, FLAG_RD, FLAG_RA = 0x8000, 0x0200, 0x0100, 0x0080
RCODE_NXDOMAIN = 3
DNS_Q = FLAG_RD                                     # 0x0100: a recursive query
DNS_R = FLAG_QR | FLAG_RD | FLAG_RA                 # 0x8180: its answer
DNS_NX = DNS_R | RCODE_NXDOMAIN                     # 0x8183
DNS_TC = FLAG_TC
POINTER = 0xC000                # compression pointer: the top two bits set (RFC 1035 §4.1.4)
MAX_POINTER_OFFSET = 0x3FFF     # a pointer has 14 offset bits
# SOA timers of the zones (RFC 1035 §3.3.13): refresh, retry, expire, minimum
SOA_REFRESH, SOA_RETRY, SOA_EXPIRE, SOA_MINIMUM = 900, 600, 86400, 60
EDNS_UDP_SIZE = 1232            # the DNS flag day 2020 payload size
EDNS_DO = 0x8000                # DO bit of the OPT TTL field (RFC 3225 §3)
EDNS_COOKIE = 10                # COOKIE option code (RFC 7873 §4)


class DnsBuilder:
    """Builds one DNS message with name compression."""

    def __init__(self, txid: int, flags: int):
        self.buf = bytearray(HEADER_LEN)
        self.txid, self.flags = txid, flags
        self.counts = [0, 0, 0, 0]
        self.names: dict[str, int] = {}

    def name(self, name: str) -> None:
        labels = name.rstrip(".").split(".") if name not in ("", ".") else []
        for i in range(len(labels)):
            suffix = ".".join(labels[i:]).lower()
            off = self.names.get(suffix)
            if off is not None:
                self.buf += struct.pack("!H", POINTER | off)
                return
            if len(self.buf) < MAX_POINTER_OFFSET:
                self.names[suffix] = len(self.buf)
            lab = labels[i].encode()
            self.buf.append(len(lab))
            self.buf += lab
        self.buf.append(0)

    def question(self, name: str, qtype: int) -> "DnsBuilder":
        self.name(name)
        self.buf += struct.pack("!HH", qtype, CLASS_IN)
        self.counts[QD] += 1
        return self

    def rr(self, section: int, name: str, rtype: int, ttl: int, rdata) -> "DnsBuilder":
        self.name(name)
        self.buf += struct.pack("!HHI", rtype, CLASS_IN, ttl)
        at = len(self.buf)
        self.buf += b"\0\0"
        if rtype in (T_CNAME, T_NS):
            self.name(rdata)
        elif rtype == T_SOA:
            mname, rname, serial = rdata
            self.name(mname)
            self.name(rname)
            self.buf += struct.pack("!IIIII", serial, SOA_REFRESH, SOA_RETRY, SOA_EXPIRE, SOA_MINIMUM)
        elif rtype == T_A:
            self.buf += ipaddress.IPv4Address(rdata).packed
        elif rtype == T_AAAA:
            self.buf += ipaddress.IPv6Address(rdata).packed
        else:
            self.buf += rdata
        struct.pack_into("!H", self.buf, at, len(self.buf) - at - 2)
        self.counts[section] += 1
        return self

    def opt(self, udp_size: int = EDNS_UDP_SIZE, do: bool = False, cookie: bytes | None = None):
        """The OPT pseudo-RR (RFC 6891 §6.1.2): root owner, CLASS = UDP payload size, TTL = flags."""
        self.buf += b"\x00" + struct.pack("!HHI", T_OPT, udp_size, EDNS_DO if do else 0)
        rdata = b"" if cookie is None else struct.pack("!HH", EDNS_COOKIE, len(cookie)) + cookie
        self.buf += struct.pack("!H", len(rdata)) + rdata
        self.counts[AR] += 1
        return self

    def bytes(self) -> bytes:
        struct.pack_into("!HHHHHH", self.buf, 0, self.txid, self.flags, *self.counts)
        return bytes(self.buf)
