"""Header decoder: link layer → IPv4/IPv6 → TCP/UDP/ICMP for every record, in one pass.

Specs: Ethernet II / IEEE 802.3 with LLC-SNAP; IEEE 802.1Q and 802.1ad tags, stacked; PPPoE session
(RFC 2516); MPLS label stacks (RFC 3032); tcpdump.org LINKTYPE_NULL/LOOP, LINUX_SLL, LINUX_SLL2, NFLOG
and the raw-IP types; IPv4 (RFC 791) with options and fragments; IPv6 (RFC 8200) with hop-by-hop,
routing, fragment, destination-options, AH (RFC 4302), mobility and HIP/shim6 extension headers; TCP
(RFC 9293) with MSS, window scale and timestamps (RFC 7323), SACK (RFC 2018); UDP (RFC 768);
ICMP (RFC 792) and ICMPv6 (RFC 4443).

Every read is preceded by a check against ``end``, the last captured byte of the record (or of the
IP datagram, so Ethernet padding is never taken for payload). Lengths on the wire that exceed what was
captured are kept (``payload_len`` is the wire length, as Wireshark's ``tcp.len``); a header that the
snapshot length cut is reported in ``parse_status``.
"""
from collections import namedtuple

import numpy as np

from ..jit import njit
from .. import linktypes as lt
from ..schema import PACKET_COLUMNS, ParseStatus, Present
from .wire import next_tcp_option, u16be, u16le, u32be, u32le

# Columns the walker already produced (records.RecordColumns) or Python derives; not filled here.
_FROM_RECORDS = ("frame", "ts_ns", "iface", "caplen", "wirelen", "src", "dst")
# Addresses leave the kernel as 128-bit values (two uint64 halves) plus a family, into a scratch the size
# of a batch of records, and are interned batch by batch (kernels/reading.py).
ADDRESS_FIELDS = ("src_hi", "src_lo", "dst_hi", "dst_lo", "family")

# the field vector: the packet columns decoded here, the address scratch and the present bits
FIELD_NAMES = tuple(c.name for c in PACKET_COLUMNS if c.name not in _FROM_RECORDS) + ADDRESS_FIELDS + ("present",)
HEADER_FIELDS = tuple(name for name in FIELD_NAMES if name not in ADDRESS_FIELDS)
HeaderColumns = namedtuple("HeaderColumns", HEADER_FIELDS)
AddressScratch = namedtuple("AddressScratch", ADDRESS_FIELDS)

_SCRATCH_DTYPES = {"src_hi": np.uint64, "src_lo": np.uint64, "dst_hi": np.uint64, "dst_lo": np.uint64,
                   "family": np.uint8, "present": np.uint16}
_DTYPES = {c.name: c.dtype for c in PACKET_COLUMNS} | _SCRATCH_DTYPES


def allocate_headers(capacity: int) -> HeaderColumns:
    """Uninitialised: decode_block writes every field of every record it decodes."""
    return HeaderColumns(*(np.empty(capacity, _DTYPES[name]) for name in HEADER_FIELDS))


# The helpers below fill one packet's fields into an int64 vector indexed by these constants, and the
# loop stores the vector into the columns. (Handing the tuple of ~30 arrays to each helper instead
# costs an atomic incref/decref per array per call: 0.5 µs a packet; and the loop is compiled without
# reference counting altogether, see decode_block.)
(F_PARSE_STATUS, F_VLAN, F_ETHERTYPE, F_IP_PROTO, F_TTL, F_DSCP, F_ECN, F_IP_ID, F_FRAG_OFFSET, F_IP_FLAGS,
 F_SPORT, F_DPORT, F_TCP_FLAGS, F_SEQ, F_ACK, F_WINDOW, F_MSS, F_WSCALE, F_SACK_PERM, F_SACK_BLOCKS, F_TS_VAL,
 F_TS_ECR, F_ICMP_TYPE, F_ICMP_CODE, F_L4_HDR_LEN, F_PAYLOAD_OFFSET, F_PAYLOAD_LEN, F_PAYLOAD_CAPLEN,
 F_SRC_HI, F_SRC_LO, F_DST_HI, F_DST_LO, F_FAMILY, F_PRESENT) = range(34)
N_FIELDS = 34
assert all(FIELD_NAMES[value] == name[2:].lower() for name, value in dict(globals()).items()
           if name.startswith("F_")) and len(FIELD_NAMES) == N_FIELDS, \
    "field constants out of step with the packet schema"


# Numba sees these as compile-time constants.
OK = int(ParseStatus.OK)
NOT_IP = int(ParseStatus.NOT_IP)
UNSUPPORTED = int(ParseStatus.UNSUPPORTED_LINKTYPE)
TRUNC_L2 = int(ParseStatus.TRUNCATED_L2)
TRUNC_L3 = int(ParseStatus.TRUNCATED_L3)
TRUNC_L4 = int(ParseStatus.TRUNCATED_L4)
BAD_L3 = int(ParseStatus.BAD_L3)
BAD_L4 = int(ParseStatus.BAD_L4)
FRAGMENT = int(ParseStatus.FRAGMENT)
IP_OTHER = int(ParseStatus.IP_OTHER)
NOT_PACKET = int(ParseStatus.NOT_PACKET)
LINKTYPE_NOT_PACKET = -1  # linktype_of value for records that are not packets

P_IP = int(Present.IP)
P_L4 = int(Present.L4)
P_TCP = int(Present.TCP)
P_UDP = int(Present.UDP)
P_ICMP = int(Present.ICMP)
P_VLAN = int(Present.VLAN)
P_MSS = int(Present.MSS)
P_WSCALE = int(Present.WSCALE)
P_SACK_PERM = int(Present.SACK_PERM)
P_TSOPT = int(Present.TSOPT)
P_PAYLOAD = int(Present.PAYLOAD)
P_FRAG = int(Present.FRAG)

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
ETH_VLAN = 0x8100
ETH_QINQ = 0x88A8
ETH_QINQ_OLD = 0x9100
ETH_PPPOE_SESSION = 0x8864
ETH_MPLS = 0x8847
ETH_MPLS_MC = 0x8848
ETH_VNTAG = 0x8926  # Cisco VN-Tag: 4 bytes of tag, then the next EtherType
ETH_ETAG = 0x893F  # IEEE 802.1BR E-Tag: 6 bytes of tag, then the next EtherType
ETH_MAC_CONTROL = 0x8808  # IEEE 802.3 MAC Control (PAUSE, PFC): its payload is located for mac_control.py
PPP_IPV4 = 0x0021
PPP_IPV6 = 0x0057

IPPROTO_ICMP = 1
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_ICMPV6 = 58
IPV6_FRAGMENT = 44
IPV6_AH = 51
IPV6_NONE = 59

MAX_VLAN_TAGS = 8
MAX_MPLS_LABELS = 16
MAX_IPV6_EXT_HEADERS = 16
IPV4_MAPPED_PREFIX = np.uint64(0x0000FFFF00000000)

# Address families of the capturing OS in LINKTYPE_NULL/LOOP headers: AF_INET, and AF_INET6 on
# Linux (10), FreeBSD (28), Darwin (30) and NetBSD/OpenBSD/Windows (24).
AF_INET = 2
NFLOG_PAYLOAD = 9


@njit(cache=True, inline="always")
def _is_ipv6_af(af):
    return af == 10 or af == 24 or af == 28 or af == 30


@njit(cache=True)
def _ipv6_ext_header(nh):
    return nh == 0 or nh == 43 or nh == 60 or nh == 135 or nh == 139 or nh == 140


@njit(cache=True, inline="always")
def _tcp_options(buf, p, opt_end, f):
    present = 0
    while True:
        kind, olen, nxt = next_tcp_option(buf, p, opt_end)
        if kind < 0:
            break
        if kind == 2 and olen == 4:
            f[F_MSS] = u16be(buf, p + 2)
            present |= P_MSS
        elif kind == 3 and olen == 3:
            f[F_WSCALE] = buf[p + 2]
            present |= P_WSCALE
        elif kind == 4 and olen == 2:
            f[F_SACK_PERM] = 1
        elif kind == 5 and olen >= 10:
            f[F_SACK_BLOCKS] = (olen - 2) // 8
        elif kind == 8 and olen == 10:
            f[F_TS_VAL] = u32be(buf, p + 2)
            f[F_TS_ECR] = u32be(buf, p + 6)
            present |= P_TSOPT
        p = nxt
    return present


@njit(cache=True, inline="always")
def _transport(buf, proto, l4, end, wire_len, first_fragment, f):
    """Transport header at ``l4``; ``end`` bounds captured bytes; ``wire_len`` is the IP payload
    length on the wire. Returns (status, present bits)."""
    avail = end - l4
    if proto == IPPROTO_TCP:
        if avail < 20:
            return TRUNC_L4, 0
        f[F_SPORT] = u16be(buf, l4)
        f[F_DPORT] = u16be(buf, l4 + 2)
        f[F_SEQ] = u32be(buf, l4 + 4)
        f[F_ACK] = u32be(buf, l4 + 8)
        doff = np.int64(buf[l4 + 12] >> 4) * 4
        f[F_TCP_FLAGS] = ((np.int64(buf[l4 + 12]) & 0x0F) << 8) | buf[l4 + 13]
        f[F_WINDOW] = u16be(buf, l4 + 14)
        present = P_L4 | P_TCP
        if doff < 20 or doff > wire_len:
            return BAD_L4, present
        f[F_L4_HDR_LEN] = doff
        f[F_PAYLOAD_OFFSET] = l4 + doff
        f[F_PAYLOAD_LEN] = wire_len - doff
        present |= P_PAYLOAD
        present |= _tcp_options(buf, l4 + 20, min(l4 + doff, end), f)
        if doff > avail:
            return TRUNC_L4, present
        return OK, present
    if proto == IPPROTO_UDP:
        if avail < 8:
            return TRUNC_L4, 0
        f[F_SPORT] = u16be(buf, l4)
        f[F_DPORT] = u16be(buf, l4 + 2)
        udp_len = np.int64(u16be(buf, l4 + 4))
        f[F_L4_HDR_LEN] = 8
        f[F_PAYLOAD_OFFSET] = l4 + 8
        present = P_L4 | P_UDP | P_PAYLOAD
        status = OK
        if wire_len < 8:
            f[F_PAYLOAD_LEN] = 0
            return BAD_L4, present
        if first_fragment:
            f[F_PAYLOAD_LEN] = wire_len - 8
        elif udp_len < 8 or udp_len > wire_len:
            # Wireshark: "Bad length value"; the IP length is the better guess of what was sent.
            f[F_PAYLOAD_LEN] = wire_len - 8
            status = BAD_L4
        else:
            f[F_PAYLOAD_LEN] = udp_len - 8
        return status, present
    if proto == IPPROTO_ICMP or proto == IPPROTO_ICMPV6:
        if avail < 4:
            return TRUNC_L4, 0
        f[F_ICMP_TYPE] = buf[l4]
        f[F_ICMP_CODE] = buf[l4 + 1]
        hdr = min(np.int64(8), wire_len)
        f[F_L4_HDR_LEN] = hdr
        f[F_PAYLOAD_OFFSET] = l4 + hdr
        f[F_PAYLOAD_LEN] = wire_len - hdr
        return OK, P_ICMP | P_PAYLOAD
    f[F_PAYLOAD_OFFSET] = l4
    f[F_PAYLOAD_LEN] = wire_len
    return IP_OTHER, P_PAYLOAD


@njit(cache=True, inline="always")
def _ipv4(buf, pos, end, wire_end, f):
    if end - pos < 20:
        return TRUNC_L3, 0
    ihl = np.int64(buf[pos] & 0x0F) * 4
    if buf[pos] >> 4 != 4 or ihl < 20:
        return BAD_L3, 0
    if end - pos < ihl:
        return TRUNC_L3, 0
    total = np.int64(u16be(buf, pos + 2))
    if total == 0:  # TCP segmentation offload: the NIC fills the length in later
        total = end - pos
    # A length beyond the frame's wire length is clamped to it, as Wireshark does ("IPv4 total
    # length exceeds packet length"); a snapshot length that cut the frame does not clamp it.
    total = min(total, wire_end - pos)
    if total < ihl:
        return BAD_L3, 0
    flags = u16be(buf, pos + 6)
    more_fragments = (flags >> 13) & 1
    frag_offset = (flags & 0x1FFF) * 8
    proto = buf[pos + 9]
    f[F_IP_ID] = u16be(buf, pos + 4)
    f[F_IP_FLAGS] = more_fragments | (((flags >> 14) & 1) << 1)
    f[F_FRAG_OFFSET] = frag_offset
    f[F_TTL] = buf[pos + 8]
    f[F_DSCP] = buf[pos + 1] >> 2  # TOS byte (RFC 2474 / RFC 3168)
    f[F_ECN] = buf[pos + 1] & 0x03
    f[F_IP_PROTO] = proto
    f[F_FAMILY] = 4
    f[F_SRC_HI] = 0
    f[F_SRC_LO] = IPV4_MAPPED_PREFIX | np.uint64(u32be(buf, pos + 12))
    f[F_DST_HI] = 0
    f[F_DST_LO] = IPV4_MAPPED_PREFIX | np.uint64(u32be(buf, pos + 16))
    present = P_IP
    if more_fragments or frag_offset:
        present |= P_FRAG
    l4 = pos + ihl
    l4_end = min(end, pos + total)
    wire_len = total - ihl
    if frag_offset:
        f[F_PAYLOAD_OFFSET] = l4
        f[F_PAYLOAD_LEN] = wire_len
        return FRAGMENT, present | P_PAYLOAD
    status, l4_present = _transport(buf, proto, l4, l4_end, wire_len, more_fragments, f)
    return status, present | l4_present


@njit(cache=True)
def _u64be(buf, off):
    return (np.uint64(u32be(buf, off)) << np.uint64(32)) | np.uint64(u32be(buf, off + 4))


@njit(cache=True, inline="always")
def _ipv6(buf, pos, end, wire_end, f):
    if end - pos < 40:
        return TRUNC_L3, 0
    if buf[pos] >> 4 != 6:
        return BAD_L3, 0
    payload_len = np.int64(u16be(buf, pos + 4))
    if payload_len == 0:  # jumbogram (RFC 2675) or segmentation offload
        payload_len = end - pos - 40
    payload_len = max(np.int64(0), min(payload_len, wire_end - pos - 40))
    nh = buf[pos + 6]
    f[F_TTL] = buf[pos + 7]
    traffic_class = ((np.int64(buf[pos]) & 0x0F) << 4) | (np.int64(buf[pos + 1]) >> 4)
    f[F_DSCP] = traffic_class >> 2
    f[F_ECN] = traffic_class & 0x03
    f[F_FAMILY] = 6
    f[F_SRC_HI] = _u64be(buf, pos + 8)
    f[F_SRC_LO] = _u64be(buf, pos + 16)
    f[F_DST_HI] = _u64be(buf, pos + 24)
    f[F_DST_LO] = _u64be(buf, pos + 32)
    present = P_IP
    l4 = pos + 40
    dgram_end = l4 + payload_len
    end = min(end, dgram_end)
    more_fragments = 0
    frag_offset = 0
    for _ in range(MAX_IPV6_EXT_HEADERS):
        if _ipv6_ext_header(nh) or nh == IPV6_AH:
            if end - l4 < 2:
                f[F_IP_PROTO] = nh
                return TRUNC_L3, present
            if nh == IPV6_AH:
                hlen = (np.int64(buf[l4 + 1]) + 2) * 4
            else:
                hlen = (np.int64(buf[l4 + 1]) + 1) * 8
            nh = buf[l4]
            l4 += hlen
        elif nh == IPV6_FRAGMENT:
            if end - l4 < 8:
                f[F_IP_PROTO] = nh
                return TRUNC_L3, present
            fo = u16be(buf, l4 + 2)
            frag_offset = fo & 0xFFF8
            more_fragments = fo & 1
            f[F_IP_ID] = u32be(buf, l4 + 4)
            present |= P_FRAG
            nh = buf[l4]
            l4 += 8
        else:
            break
        if l4 > dgram_end:
            f[F_IP_PROTO] = nh
            return BAD_L3, present
    f[F_IP_PROTO] = nh
    f[F_IP_FLAGS] = more_fragments
    f[F_FRAG_OFFSET] = frag_offset
    wire_len = dgram_end - l4
    if frag_offset:
        f[F_PAYLOAD_OFFSET] = l4
        f[F_PAYLOAD_LEN] = wire_len
        return FRAGMENT, present | P_PAYLOAD
    if nh == IPV6_NONE:
        f[F_PAYLOAD_OFFSET] = l4
        f[F_PAYLOAD_LEN] = wire_len
        return IP_OTHER, present | P_PAYLOAD
    status, l4_present = _transport(buf, nh, l4, end, wire_len, more_fragments, f)
    return status, present | l4_present


@njit(cache=True)
def _nflog_payload(buf, pos, end):
    """NFLOG TLVs (length and type in the capturing host's byte order): (start, end) of the
    NFULA_PAYLOAD attribute, or (-1, -1)."""
    while pos + 4 <= end:
        tlv_len = np.int64(u16le(buf, pos))
        tlv_type = u16le(buf, pos + 2)
        if tlv_len < 4 or pos + tlv_len > end:
            tlv_len = np.int64(u16be(buf, pos))
            tlv_type = u16be(buf, pos + 2)
            if tlv_len < 4 or pos + tlv_len > end:
                return -1, -1
        if (tlv_type & 0x7FFF) == NFLOG_PAYLOAD:
            return pos + 4, pos + tlv_len
        pos += (tlv_len + 3) & ~3
    return -1, -1


@njit(cache=True, inline="always")
def _link_layer(buf, pos, end, linktype, f):
    """Returns (status, ethertype, network-layer offset, end, present bits). status < 0 = go on."""
    present = 0
    if linktype == LINKTYPE_NOT_PACKET:
        return NOT_PACKET, 0, pos, end, 0
    if linktype == lt.ETHERNET:
        if end - pos < 14:
            return TRUNC_L2, 0, pos, end, 0
        ethertype = u16be(buf, pos + 12)
        pos += 14
        if ethertype <= 1500:  # IEEE 802.3 length: LLC, maybe SNAP
            if (end - pos >= 8 and buf[pos] == 0xAA and buf[pos + 1] == 0xAA
                    and buf[pos + 2] == 0x03):
                ethertype = u16be(buf, pos + 6)
                pos += 8
            else:
                return NOT_IP, 0, pos, end, 0
    elif linktype == lt.NULL or linktype == lt.LOOP:
        if end - pos < 4:
            return TRUNC_L2, 0, pos, end, 0
        # LOOP is network order; NULL is the capturing host's order, so try both. Some systems put
        # an EtherType in the second half instead (Wireshark's packet-null.c accepts that too).
        af_be = u32be(buf, pos)
        af_le = u32le(buf, pos) if linktype == lt.NULL else af_be
        half = u16be(buf, pos + 2)
        pos += 4
        if af_be == AF_INET or af_le == AF_INET or half == ETH_IPV4:
            ethertype = ETH_IPV4
        elif _is_ipv6_af(af_be) or _is_ipv6_af(af_le) or half == ETH_IPV6:
            ethertype = ETH_IPV6
        else:
            return NOT_IP, 0, pos, end, 0
    elif (linktype == lt.RAW or linktype == lt.RAW_DLT12 or linktype == lt.RAW_DLT14
          or linktype == lt.IPV4 or linktype == lt.IPV6):
        if end - pos < 1:
            return TRUNC_L3, 0, pos, end, 0
        version = buf[pos] >> 4
        if version == 4 and linktype != lt.IPV6:
            ethertype = ETH_IPV4
        elif version == 6 and linktype != lt.IPV4:
            ethertype = ETH_IPV6
        else:
            return BAD_L3, 0, pos, end, 0
    elif linktype == lt.LINUX_SLL:
        if end - pos < 16:
            return TRUNC_L2, 0, pos, end, 0
        ethertype = u16be(buf, pos + 14)
        pos += 16
    elif linktype == lt.LINUX_SLL2:
        if end - pos < 20:
            return TRUNC_L2, 0, pos, end, 0
        ethertype = u16be(buf, pos)
        pos += 20
    elif linktype == lt.NFLOG:
        if end - pos < 4:
            return TRUNC_L2, 0, pos, end, 0
        family = buf[pos]
        start, stop = _nflog_payload(buf, pos + 4, end)
        if start < 0:
            return NOT_IP, 0, pos, end, 0
        pos, end = start, stop
        if family == AF_INET:
            ethertype = ETH_IPV4
        elif family == 10:
            ethertype = ETH_IPV6
        else:
            return NOT_IP, 0, pos, end, 0
    else:
        return UNSUPPORTED, 0, pos, end, 0

    tags = 0
    while tags < MAX_VLAN_TAGS:
        if ethertype == ETH_VLAN or ethertype == ETH_QINQ or ethertype == ETH_QINQ_OLD:
            if end - pos < 4:
                return TRUNC_L2, ethertype, pos, end, present
            f[F_VLAN] = u16be(buf, pos) & 0x0FFF
            present |= P_VLAN
            ethertype = u16be(buf, pos + 2)
            pos += 4
        elif ethertype == ETH_VNTAG or ethertype == ETH_ETAG:
            skip = 4 if ethertype == ETH_VNTAG else 6
            if end - pos < skip + 2:
                return TRUNC_L2, ethertype, pos, end, present
            ethertype = u16be(buf, pos + skip)
            pos += skip + 2
        else:
            break
        tags += 1
    if ethertype == ETH_PPPOE_SESSION:
        if end - pos < 8:
            return TRUNC_L2, ethertype, pos, end, present
        ppp = u16be(buf, pos + 6)
        pos += 8
        ethertype = ETH_IPV4 if ppp == PPP_IPV4 else (ETH_IPV6 if ppp == PPP_IPV6 else 0)
    elif ethertype == ETH_MPLS or ethertype == ETH_MPLS_MC:
        for _ in range(MAX_MPLS_LABELS):
            if end - pos < 4:
                return TRUNC_L2, ethertype, pos, end, present
            bottom = buf[pos + 2] & 1
            pos += 4
            if bottom:
                break
        if end - pos < 1:
            return TRUNC_L3, ethertype, pos, end, present
        version = buf[pos] >> 4
        ethertype = ETH_IPV4 if version == 4 else (ETH_IPV6 if version == 6 else 0)
    return -1, ethertype, pos, end, present


@njit(cache=True, _nrt=False)
def decode_block(buf, records, lo, hi, linktype_of, out, addresses, f):
    """Decode records lo..hi-1 (``linktype_of[i]`` is record i's link type), one after the other, using
    the field vector ``f``; record i's addresses go to row i - lo of ``addresses``. The reader calls it
    on each batch of records just walked, while their bytes are still in cache (kernels/reading.py).
    Compiled without reference counting (it allocates nothing): the inlined helpers would otherwise
    incref/decref ``buf`` and ``f`` per call."""
    for i in range(lo, hi):
        linktype = linktype_of[i]
        f[:] = 0
        start = records.data_off[i]
        end = start + np.int64(records.caplen[i])
        status, ethertype, pos, l3_end, present = _link_layer(buf, start, end, linktype, f)
        # Bytes on the wire after the link header; NFLOG bounds its payload attribute itself.
        wire_end = max(end, start + np.int64(records.wirelen[i])) if l3_end == end else l3_end
        f[F_ETHERTYPE] = ethertype
        if status < 0:
            if ethertype == ETH_IPV4:
                status, l3_present = _ipv4(buf, pos, l3_end, wire_end, f)
            elif ethertype == ETH_IPV6:
                status, l3_present = _ipv6(buf, pos, l3_end, wire_end, f)
            elif ethertype == ETH_MAC_CONTROL:  # no IP; payload = the MAC Control opcode and parameters
                f[F_PAYLOAD_OFFSET] = pos
                f[F_PAYLOAD_LEN] = max(np.int64(0), wire_end - pos)
                status, l3_present = NOT_IP, P_PAYLOAD
            else:
                status, l3_present = NOT_IP, 0
            present |= l3_present
        f[F_PARSE_STATUS] = status
        f[F_PRESENT] = present
        if present & P_PAYLOAD:
            f[F_PAYLOAD_CAPLEN] = max(np.int64(0), min(f[F_PAYLOAD_LEN], end - f[F_PAYLOAD_OFFSET]))
        out.parse_status[i] = f[F_PARSE_STATUS]
        out.vlan[i] = f[F_VLAN]
        out.ethertype[i] = f[F_ETHERTYPE]
        out.ip_proto[i] = f[F_IP_PROTO]
        out.ttl[i] = f[F_TTL]
        out.dscp[i] = f[F_DSCP]
        out.ecn[i] = f[F_ECN]
        out.ip_id[i] = f[F_IP_ID]
        out.frag_offset[i] = f[F_FRAG_OFFSET]
        out.ip_flags[i] = f[F_IP_FLAGS]
        out.sport[i] = f[F_SPORT]
        out.dport[i] = f[F_DPORT]
        out.tcp_flags[i] = f[F_TCP_FLAGS]
        out.seq[i] = f[F_SEQ]
        out.ack[i] = f[F_ACK]
        out.window[i] = f[F_WINDOW]
        out.mss[i] = f[F_MSS]
        out.wscale[i] = f[F_WSCALE]
        out.sack_perm[i] = f[F_SACK_PERM] != 0
        out.sack_blocks[i] = f[F_SACK_BLOCKS]
        out.ts_val[i] = f[F_TS_VAL]
        out.ts_ecr[i] = f[F_TS_ECR]
        out.icmp_type[i] = f[F_ICMP_TYPE]
        out.icmp_code[i] = f[F_ICMP_CODE]
        out.l4_hdr_len[i] = f[F_L4_HDR_LEN]
        out.payload_offset[i] = f[F_PAYLOAD_OFFSET]
        out.payload_len[i] = f[F_PAYLOAD_LEN]
        out.payload_caplen[i] = f[F_PAYLOAD_CAPLEN]
        addresses.src_hi[i - lo] = np.uint64(f[F_SRC_HI])
        addresses.src_lo[i - lo] = np.uint64(f[F_SRC_LO])
        addresses.dst_hi[i - lo] = np.uint64(f[F_DST_HI])
        addresses.dst_lo[i - lo] = np.uint64(f[F_DST_LO])
        addresses.family[i - lo] = f[F_FAMILY]
        out.present[i] = f[F_PRESENT]
