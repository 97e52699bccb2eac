"""Wire encoders for RoCEv2 and Ethernet MAC control: bytes out, no state.

Sources, by the constants below:

* InfiniBand Architecture Specification vol. 1, rel. 1.4 ("IBA"), ch. 9: §9.2 Base Transport
  Header (BTH, 12 bytes), §9.3 extended headers (RETH 16 bytes, AETH 4 bytes, ImmDt 4 bytes),
  Table 38 (opcodes), §9.7.5.2 (AETH syndrome, Table 41/43: ACK credit count, RNR NAK timer, NAK
  codes), Table 45 (RNR NAK timer field), §9.7.6.1.3 (local ACK timeout = 4.096 µs × 2^timeout).
* IBA Annex A17 "RoCEv2": UDP destination port 4791 (A17.4.2), the invariant CRC computed over the
  packet with the variant fields masked to ones (A17.4.5) and a masked LRH of 8 ones first.
* Linux ``drivers/infiniband/sw/rxe`` (rxe_hdr.h, rxe_opcode.c, rxe_icrc.c) and
  ``include/rdma/ib_verbs.h`` (the UDP source port of a QP: ``rdma_calc_flow_label`` +
  ``rdma_flow_label_to_udp_sport``).
* IEEE 802.3 Annex 31B (MAC Control PAUSE, opcode 0x0001) and IEEE 802.1Qbb (PFC, opcode 0x0101,
  class-enable vector and eight pause times); one pause quantum = 512 bit times.
* RFC 3168 (ECN codepoints), DCQCN (Zhu et al., SIGCOMM 2015) and the RoCEv2 CNP (BTH opcode 0x81,
  16 reserved bytes, BECN set; IBA Annex A17.9).
"""
from __future__ import annotations

import ipaddress
import os
import struct
import sys
import zlib

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # the repository root, for the decoder's wire tables (a pure-Python module)
    sys.path.append(_ROOT)
from analyzer.decoders import rocev2_layout as _L  # noqa: E402

# --- the RoCEv2 wire tables: one copy, in the decoder's layout module analyzer/decoders/rocev2_layout.py
# (opcodes, header sizes, AETH syndrome encoding, Table 43 credits, Table 45 RNR delays, ACK timeout
# base, CNP); the names below are the generator's.
TRANSPORT_RC = _L.TRANSPORT_RC
CNP = _L.CNP                                    # Annex A17.9: congestion notification packet
SEND_FIRST, SEND_MIDDLE, SEND_LAST = _L.SEND_FIRST, _L.SEND_MIDDLE, _L.SEND_LAST
SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM = _L.SEND_LAST_IMM, _L.SEND_ONLY, _L.SEND_ONLY_IMM
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST = _L.WRITE_FIRST, _L.WRITE_MIDDLE, _L.WRITE_LAST
WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM = _L.WRITE_LAST_IMM, _L.WRITE_ONLY, _L.WRITE_ONLY_IMM
READ_REQUEST = _L.READ_REQUEST
READ_RESP_FIRST, READ_RESP_MIDDLE = _L.READ_RESP_FIRST, _L.READ_RESP_MIDDLE
READ_RESP_LAST, READ_RESP_ONLY = _L.READ_RESP_LAST, _L.READ_RESP_ONLY
ACKNOWLEDGE = _L.ACKNOWLEDGE
OPCODE_NAMES = {SEND_FIRST: "SEND_FIRST", SEND_MIDDLE: "SEND_MIDDLE", SEND_LAST: "SEND_LAST",
                SEND_LAST_IMM: "SEND_LAST_IMM", SEND_ONLY: "SEND_ONLY", SEND_ONLY_IMM: "SEND_ONLY_IMM",
                WRITE_FIRST: "WRITE_FIRST", WRITE_MIDDLE: "WRITE_MIDDLE", WRITE_LAST: "WRITE_LAST",
                WRITE_LAST_IMM: "WRITE_LAST_IMM", WRITE_ONLY: "WRITE_ONLY", WRITE_ONLY_IMM: "WRITE_ONLY_IMM",
                READ_REQUEST: "READ_REQUEST", READ_RESP_FIRST: "READ_RESP_FIRST",
                READ_RESP_MIDDLE: "READ_RESP_MIDDLE", READ_RESP_LAST: "READ_RESP_LAST",
                READ_RESP_ONLY: "READ_RESP_ONLY", ACKNOWLEDGE: "ACKNOWLEDGE", CNP: "CNP"}
# which extension headers follow the BTH, for the RC opcodes the generator sends (Table 38, from the
# layout's per-opcode header bits; rxe_opcode.c masks RXE_RETH_MASK / AETH / IMMDT / PAYLOAD)
_RC_SENT = range(SEND_FIRST, ACKNOWLEDGE + 1)
HAS_RETH = frozenset(o for o in _RC_SENT if _L.OPCODE_HEADERS[o] & _L.H_RETH)
HAS_AETH = frozenset(o for o in _RC_SENT if _L.OPCODE_HEADERS[o] & _L.H_AETH)
HAS_IMM = frozenset(o for o in _RC_SENT if _L.OPCODE_HEADERS[o] & _L.H_IMMDT)
HAS_PAYLOAD = frozenset(o for o in _RC_SENT if _L.OPCODE_HEADERS[o] & _L.H_PAYLOAD)
ENDS_MESSAGE = frozenset({SEND_LAST, SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM, WRITE_LAST, WRITE_LAST_IMM,
                          WRITE_ONLY, WRITE_ONLY_IMM})   # requester messages that complete a receive/write

# --- header sizes (IBA §9.2, §9.3; rxe_hdr.h RXE_BTH_BYTES etc.)
BTH_BYTES, RETH_BYTES, AETH_BYTES, IMMDT_BYTES, ICRC_BYTES = (_L.BTH_BYTES, _L.RETH_BYTES, _L.AETH_BYTES,
                                                              _L.IMMDT_BYTES, _L.ICRC_BYTES)
CNP_RESERVED_BYTES = _L.CNP_RESERVED_BYTES      # Annex A17.9.2: 16 reserved bytes after the BTH
PSN_MASK = _L.PSN_MASK                          # 24-bit PSN, QPN
QPN_MASK = _L.QPN_MASK
DEFAULT_PKEY = _L.DEFAULT_PKEY                  # the default partition, full membership (IBA §10.9.1.2)
BTH_SE, BTH_MIGREQ = _L.SE_BIT, _L.MIGREQ_BIT   # byte 1: SolicitedEvent, MigReq, PadCnt (2 bits), TVer (4 bits)
BTH_FECN, BTH_BECN = _L.FECN_BIT, _L.BECN_BIT   # byte 4 (rxe_hdr.h BTH_FECN_MASK/BTH_BECN_MASK in the qpn word)
BTH_ACKREQ = _L.ACKREQ_BIT                      # byte 8: AckReq, then 7 reserved bits
PAD_ALIGN = _L.PAD_ALIGN                        # payload padded to a multiple of 4 bytes (PadCnt)

# --- AETH syndrome (IBA §9.7.5.2.1, Table 41): bit 7 reserved, bits 6-5 type, bits 4-0 value
AETH_ACK, AETH_RNR_NAK, AETH_NAK = _L.AETH_ACK, _L.AETH_RNR_NAK, _L.AETH_NAK
AETH_TYPE_MASK, AETH_VALUE_MASK = _L.AETH_TYPE_MASK, _L.AETH_VALUE_MASK
NAK_PSN_SEQ_ERROR, NAK_INVALID_REQUEST, NAK_REMOTE_ACCESS, NAK_REMOTE_OP = (
    _L.NAK_PSN_SEQ_ERROR, _L.NAK_INVALID_REQUEST, _L.NAK_REMOTE_ACCESS, _L.NAK_REMOTE_OP)   # syndrome 0x60..0x63
CREDIT_INVALID = _L.CREDIT_INVALID              # Table 43: credit count 31 = "invalid" (no end-to-end credits)
CREDIT_TABLE = _L.CREDIT_TABLE                  # Table 43: encoded credit count -> number of receive WQEs
RNR_DELAY_US = _L.RNR_DELAY_US                  # Table 45: RNR NAK timer field -> minimum delay in µs
ACK_TIMEOUT_BASE_NS = _L.ACK_TIMEOUT_BASE_NS    # §9.7.6.1.3: 4.096 µs × 2^timeout (timeout 0 = infinite)
RETRY_INFINITE = 7                              # rnr_retry 7 = retry forever (IBA §9.7.5.2.8)

# --- RoCEv2 (Annex A17) and IP
ROCEV2_PORT = _L.ROCEV2_PORT
UDP_SPORT_MIN = 0xC000                          # ib_verbs.h IB_ROCE_UDP_ENCAP_VALID_PORT_MIN
FLOW_LABEL_MASK = 0xFFFFF                       # IB_GRH_FLOWLABEL_MASK
ICRC_MASKED_LRH = b"\xff" * 8                   # A17.4.5.1: 8 bytes of ones stand for the LRH
ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE = _L.ECN_NOT_ECT, _L.ECN_ECT1, _L.ECN_ECT0, _L.ECN_CE  # RFC 3168 §5
DSCP_ROCE, DSCP_CNP = 26, 48                    # a common deployment: data on DSCP 26 (prio 3), CNPs on 48 (prio 6)
PRIO_ROCE, PRIO_CNP = 3, 6                      # 802.1p priorities the switch maps those DSCPs to ("trust dscp")
TTL = 64
ETH_IPV4, ETH_IPV6, ETH_MAC_CONTROL = 0x0800, 0x86DD, 0x8808
PROTO_UDP = 17
ETH_MIN_FRAME = 60                              # without FCS (802.3 §3.2.8 minus the 4-byte FCS)

# --- MAC Control (802.3 Annex 31B, 802.1Qbb)
MAC_CONTROL_DST = bytes.fromhex("0180c2000001")   # the reserved multicast address of PAUSE/PFC
OPCODE_PAUSE, OPCODE_PFC = 0x0001, 0x0101
PAUSE_QUANTUM_BITS = 512
PFC_PRIORITIES = 8
PAUSE_MAX_QUANTA = 0xFFFF
LINK_SPEEDS_BPS = {"10G": 10_000_000_000, "25G": 25_000_000_000, "40G": 40_000_000_000,
                   "50G": 50_000_000_000, "100G": 100_000_000_000, "200G": 200_000_000_000,
                   "400G": 400_000_000_000}

_BTH = struct.Struct("!BBHI I").pack            # opcode, SE/M/Pad/TVer, P_Key, FECN/BECN/resv6 + DestQP, A/resv7 + PSN
_IP4 = struct.Struct("!BBHHHBBH4s4s").pack
_IP6 = struct.Struct("!IHBB16s16s").pack
_UDP = struct.Struct("!HHHH").pack


def quanta_ns(quanta: int, link_bps: int) -> int:
    """Duration of ``quanta`` pause quanta on a link of ``link_bps`` (512 bit times each)."""
    return quanta * PAUSE_QUANTUM_BITS * 1_000_000_000 // link_bps


def ack_timeout_ns(timeout: int) -> int:
    """The local ACK timeout of a QP attribute ``timeout`` (0 means infinite: returns 0)."""
    return ACK_TIMEOUT_BASE_NS << timeout if timeout else 0


def credit_code(wqes: int) -> int:
    """The largest Table 43 code whose credit count does not exceed ``wqes``."""
    code = 0
    for i, c in enumerate(CREDIT_TABLE):
        if c <= wqes:
            code = i
    return code


def udp_sport(lqpn: int, rqpn: int) -> int:
    """The UDP source port Linux uses for a QP pair (ib_verbs.h, symmetric in the two QPNs)."""
    v = lqpn * rqpn
    v ^= v >> 20
    v ^= v >> 40
    fl = v & FLOW_LABEL_MASK
    lo, hi = fl & 0x3FFF, fl & 0xFC000
    return (lo ^ (hi >> 14)) | UDP_SPORT_MIN


def bth(opcode: int, dqpn: int, psn: int, *, ackreq: bool = False, se: bool = False, padcnt: int = 0,
        fecn: bool = False, becn: bool = False, pkey: int = DEFAULT_PKEY, migreq: bool = True) -> bytes:
    """The 12-byte BTH (TVer 0). MigReq is set as ConnectX and rxe send it on migrated-state QPs."""
    b1 = (BTH_SE if se else 0) | (BTH_MIGREQ if migreq else 0) | (padcnt << 4)
    w4 = ((BTH_FECN if fecn else 0) | (BTH_BECN if becn else 0)) << 24 | (dqpn & QPN_MASK)
    w8 = (BTH_ACKREQ << 24 if ackreq else 0) | (psn & PSN_MASK)
    return _BTH(opcode, b1, pkey, w4, w8)


def reth(va: int, rkey: int, dmalen: int) -> bytes:
    return struct.pack("!QII", va, rkey, dmalen)


def aeth(syndrome: int, msn: int) -> bytes:
    return struct.pack("!I", (syndrome & 0xFF) << 24 | (msn & PSN_MASK))


def icrc(ip_udp: bytes, v6: bool, transport: bytes) -> bytes:
    """The ICRC (Annex A17.4.5, rxe_icrc.c): CRC-32 over 8 ones (masked LRH), the IP and UDP headers
    with their variant fields set to ones (IPv4 TOS, TTL, header checksum; IPv6 traffic class, flow
    label, hop limit; UDP checksum), the BTH with its byte 4 (FECN, BECN, reserved) set to ones, and
    the rest of the packet up to the ICRC. Sent least significant byte first, as rxe stores the
    little-endian CRC register."""
    h = bytearray(ip_udp)
    if v6:
        h[0] |= 0x0F                               # traffic class, high nibble
        h[1] = 0xFF                                # traffic class low nibble + flow label
        h[2] = h[3] = 0xFF
        h[7] = 0xFF                                # hop limit
        u = 40
    else:
        h[1] = 0xFF                                # type of service (DSCP + ECN)
        h[8] = 0xFF                                # TTL
        h[10] = h[11] = 0xFF                       # header checksum
        u = 20
    h[u + 6] = h[u + 7] = 0xFF                     # UDP checksum
    t = bytearray(transport[:BTH_BYTES])
    t[4] = 0xFF                                    # FECN, BECN, resv6
    crc = zlib.crc32(ICRC_MASKED_LRH + bytes(h) + bytes(t))
    crc = zlib.crc32(transport[BTH_BYTES:], crc)
    return struct.pack("<I", crc)


class Endpoint:
    """A RoCE port: MAC, IP (v4 or v6)."""
    __slots__ = ("mac", "addr", "v6", "ip")

    def __init__(self, ip: str, mac: bytes):
        a = ipaddress.ip_address(ip)
        self.ip, self.addr, self.v6, self.mac = str(a), a.packed, a.version == 6, mac


def roce_frame(src: Endpoint, dst: Endpoint, dst_mac: bytes, src_mac: bytes, sport: int, ipid: int,
               dscp: int, ecn: int, transport: bytes) -> bytes:
    """Ethernet + IPv4/IPv6 + UDP(4791) + ``transport`` (BTH.. payload) + ICRC.
    IPv4: DF set, UDP checksum 0 (allowed by RFC 768 and sent so by RoCE NICs); IPv6: the UDP
    checksum is computed (RFC 8200 §8.1 forbids 0)."""
    n = 8 + len(transport) + ICRC_BYTES
    tos = dscp << 2 | ecn
    if src.v6:
        ip = _IP6(0x60000000 | tos << 20, n, PROTO_UDP, TTL, src.addr, dst.addr)
        udp = _UDP(sport, ROCEV2_PORT, n, 0)
        body = transport + icrc(ip + udp, True, transport)
        v = int.from_bytes(body, "big") << (8 if len(body) & 1 else 0)
        s = int.from_bytes(src.addr + dst.addr, "big") + PROTO_UDP + n + n + (sport << 16) + ROCEV2_PORT + v
        udp = _UDP(sport, ROCEV2_PORT, n, -s % 0xFFFF or 0xFFFF)
        return dst_mac + src_mac + struct.pack("!H", ETH_IPV6) + ip + udp + body
    hdr = _IP4(0x45, tos, 20 + n, ipid, 0x4000, TTL, PROTO_UDP, 0, src.addr, dst.addr)
    ip = _IP4(0x45, tos, 20 + n, ipid, 0x4000, TTL, PROTO_UDP, -int.from_bytes(hdr, "big") % 0xFFFF,
              src.addr, dst.addr)
    udp = _UDP(sport, ROCEV2_PORT, n, 0)
    frame = dst_mac + src_mac + struct.pack("!H", ETH_IPV4) + ip + udp + transport + icrc(ip + udp, False, transport)
    return frame


def pad_payload(n: int) -> int:
    """PadCnt for an ``n``-byte payload."""
    return -n % PAD_ALIGN


def pfc_frame(src_mac: bytes, times: dict[int, int]) -> bytes:
    """An 802.1Qbb PFC frame: ``times`` maps priority -> quanta (0 = resume); the class-enable vector
    has a bit for each priority named (its upper 8 bits are zero)."""
    cev, q = 0, [0] * PFC_PRIORITIES
    for p, t in times.items():
        cev |= 1 << p
        q[p] = t
    body = struct.pack("!HH8H", OPCODE_PFC, cev, *q)
    f = MAC_CONTROL_DST + src_mac + struct.pack("!H", ETH_MAC_CONTROL) + body
    return f + b"\0" * (ETH_MIN_FRAME - len(f))


def pause_frame(src_mac: bytes, quanta: int) -> bytes:
    """An 802.3x PAUSE frame (all traffic)."""
    f = MAC_CONTROL_DST + src_mac + struct.pack("!HHH", ETH_MAC_CONTROL, OPCODE_PAUSE, quanta)
    return f + b"\0" * (ETH_MIN_FRAME - len(f))
