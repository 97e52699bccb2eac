"""RoCEv2 wire constants, once: opcodes and their names, header sizes, which extension headers follow
the BTH for each opcode, the AETH syndrome encoding, and the IBA timer and credit tables.

Sources, by the constants below:

* InfiniBand Architecture Specification vol. 1, rel. 1.4 ("IBA"), ch. 9: §9.2 BTH (12 bytes), §9.3
  extended transport headers (RDETH 4, DETH 8, RETH 16, AtomicETH 28, AETH 4, AtomicAckETH 8, ImmDt 4,
  IETH 4), XRCETH 4 (§9.3.8, XRC annex); Table 38 (opcodes: transport in bits 7-5, operation in bits
  4-0, and the headers each opcode carries); §9.7.5.2 AETH syndrome (Table 41: bit 7 reserved, bits
  6-5 type, bits 4-0 value), Table 43 (ACK credit count), Table 44 (NAK codes), Table 45 (RNR NAK
  timer); §9.7.6.1.3 (local ACK timeout = 4.096 µs × 2^timeout).
* IBA Annex A17 "RoCEv2": UDP destination port 4791 (A17.4.2), the ICRC (4 bytes, last in the UDP
  payload, A17.4.5), the CNP (A17.9.2: BTH opcode 0x81, 16 reserved bytes, then the ICRC).
* Linux ``drivers/infiniband/sw/rxe/rxe_hdr.h`` / ``rxe_opcode.c`` (header masks per opcode).
* Wireshark ``epan/dissectors/packet-infiniband.c``: :data:`OPCODE_NAMES` are its ``OpCodeMap``
  strings exactly (``tshark -G values``), except that Wireshark 4.0 names opcode 0x80 "CNP" and
  prints the CNP of Annex A17.9.2 (0x81) as "Unknown (129)": here 0x81 is "CNP" and 0x80 unknown.

``samples/rocekit/wire.py`` (the generator's encoders) imports its tables from here.
``tests/test_decoder_layout.py`` checks these against struct formats written from the spec.
Numba freezes module-level ints as compile-time constants (after changing a value here, touch
rocev2_kernels.py or clear the cache). Pure Python, no imports: the generator imports it cheaply.
"""
from __future__ import annotations

ROCEV2_PORT = 4791  # Annex A17.4.2: the UDP destination port of RoCEv2 (both directions)

# --- BTH (IBA §9.2, Figure 105) -----------------------------------------------------------------------
BTH_BYTES = 12
BTH_OPCODE = 0  # 1 byte
BTH_FLAGS = 1  # SE (bit 7), MigReq (bit 6), PadCnt (bits 5-4), TVer (bits 3-0)
BTH_PKEY = 2  # 2 bytes
BTH_FECN_BECN = 4  # FECN (bit 7), BECN (bit 6), 6 reserved bits (Annex A17.4.4 for FECN/BECN)
BTH_DEST_QP = 5  # 3 bytes
BTH_ACKREQ = 8  # AckReq (bit 7), 7 reserved bits
BTH_PSN = 9  # 3 bytes
BTH_LAYOUT = (("opcode", BTH_OPCODE, 1), ("flags", BTH_FLAGS, 1), ("pkey", BTH_PKEY, 2),
              ("fecn_becn", BTH_FECN_BECN, 1), ("dest_qp", BTH_DEST_QP, 3), ("ackreq", BTH_ACKREQ, 1),
              ("psn", BTH_PSN, 3))
SE_BIT, MIGREQ_BIT = 0x80, 0x40  # byte 1
PADCNT_SHIFT, PADCNT_MASK, TVER_MASK = 4, 0x3, 0xF
FECN_BIT, BECN_BIT = 0x80, 0x40  # byte 4
ACKREQ_BIT = 0x80  # byte 8
PSN_MASK = QPN_MASK = 0xFFFFFF  # 24-bit PSN, QPN, MSN
DEFAULT_PKEY = 0xFFFF  # the default partition, full membership (IBA §10.9.1.2)
PAD_ALIGN = 4  # the payload is padded to a multiple of 4 bytes (PadCnt)

# --- extended transport headers (IBA §9.3) -------------------------------------------------------------
RDETH_BYTES = 4  # §9.3.1: reserved (1), EE context (3)
DETH_BYTES = 8  # §9.3.2: Q_Key (4), reserved (1), source QP (3)
DETH_QKEY, DETH_SRC_QP = 0, 5
XRCETH_BYTES = 4  # reserved (1), XRC SRQ (3)
RETH_BYTES = 16  # §9.3.3: virtual address (8), R_Key (4), DMA length (4)
RETH_VA, RETH_RKEY, RETH_DMA_LEN = 0, 8, 12
ATOMICETH_BYTES = 28  # §9.3.4: VA (8), R_Key (4), swap/add (8), compare (8)
AETH_BYTES = 4  # §9.3.5: syndrome (1), MSN (3)
AETH_SYNDROME, AETH_MSN = 0, 1
ATOMICACKETH_BYTES = 8  # §9.3.6: original remote data (8)
IMMDT_BYTES = 4  # §9.3.7
IETH_BYTES = 4  # §9.3.8: the R_Key to invalidate
ICRC_BYTES = 4  # Annex A17.4.5: the invariant CRC closes every RoCEv2 packet
CNP_RESERVED_BYTES = 16  # Annex A17.9.2: 16 reserved bytes after the BTH of a CNP

# --- opcodes (IBA Table 38) --------------------------------------------------------------------------
TRANSPORT_SHIFT = 5
TRANSPORT_RC, TRANSPORT_UC, TRANSPORT_RD, TRANSPORT_UD = 0, 1, 2, 3
TRANSPORT_CNP, TRANSPORT_XRC = 4, 5  # 0b100: CNP (Annex A17.9); 0b101: XRC; 0b110/0b111 vendor
OP_MASK = 0x1F
# operations (bits 4-0), the same across transports
SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM = 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B
READ_REQUEST = 0x0C
READ_RESP_FIRST, READ_RESP_MIDDLE, READ_RESP_LAST, READ_RESP_ONLY = 0x0D, 0x0E, 0x0F, 0x10
ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE, CMP_SWAP, FETCH_ADD = 0x11, 0x12, 0x13, 0x14
RESYNC = 0x15  # RD only (RC: reserved)
SEND_LAST_INV, SEND_ONLY_INV = 0x16, 0x17
CNP = 0x81  # Annex A17.9.2: congestion notification packet

TRANSPORT_NAMES = ("RC", "UC", "RD", "UD", "CNP", "other")  # the rocev2_packets transport Enum
_CLASS_NAMES = {TRANSPORT_RC: "Reliable Connection (RC)", TRANSPORT_UC: "Unreliable Connection (UC)",
                TRANSPORT_RD: "Reliable Datagram (RD)", TRANSPORT_UD: "Unreliable Datagram (UD)",
                TRANSPORT_XRC: "Extended Reliable Connection (XRC)"}
_OP_NAMES = {SEND_FIRST: "SEND First", SEND_MIDDLE: "SEND Middle", SEND_LAST: "SEND Last",
             SEND_LAST_IMM: "SEND Last with Immediate", SEND_ONLY: "SEND Only",
             SEND_ONLY_IMM: "SEND Only with Immediate", WRITE_FIRST: "RDMA WRITE First",
             WRITE_MIDDLE: "RDMA WRITE Middle", WRITE_LAST: "RDMA WRITE Last",
             WRITE_LAST_IMM: "RDMA WRITE Last with Immediate", WRITE_ONLY: "RDMA WRITE Only",
             WRITE_ONLY_IMM: "RDMA WRITE Only with Immediate", READ_REQUEST: "RDMA READ Request",
             READ_RESP_FIRST: "RDMA READ response First", READ_RESP_MIDDLE: "RDMA READ response Middle",
             READ_RESP_LAST: "RDMA READ response Last", READ_RESP_ONLY: "RDMA READ response Only",
             ACKNOWLEDGE: "Acknowledge", ATOMIC_ACKNOWLEDGE: "ATOMIC Acknowledge", CMP_SWAP: "CmpSwap",
             FETCH_ADD: "FetchAdd", RESYNC: "RESYNC", SEND_LAST_INV: "SEND Last with Invalidate",
             SEND_ONLY_INV: "SEND Only with Invalidate"}
# operations each transport defines (Table 38); RC's 0x15 is "Reserved" in Wireshark's table
_RC_OPS = tuple(range(0x00, 0x15)) + (SEND_LAST_INV, SEND_ONLY_INV)
TRANSPORT_OPS = {TRANSPORT_RC: _RC_OPS, TRANSPORT_UC: tuple(range(0x00, 0x0C)),
                 TRANSPORT_RD: tuple(range(0x00, 0x16)), TRANSPORT_UD: (SEND_ONLY, SEND_ONLY_IMM),
                 TRANSPORT_XRC: _RC_OPS}
_UD_NAMES = {SEND_ONLY: "SEND only", SEND_ONLY_IMM: "SEND only with Immediate"}  # Wireshark's spelling


def _names() -> dict[int, str]:
    names = {}
    for t, ops in TRANSPORT_OPS.items():
        for op in ops:
            text = (_UD_NAMES if t == TRANSPORT_UD else _OP_NAMES)[op]
            names[t << TRANSPORT_SHIFT | op] = f"{_CLASS_NAMES[t]} - {text}"
    names[TRANSPORT_RC << TRANSPORT_SHIFT | RESYNC] = "Reliable Connection (RC) - Reserved"  # as Wireshark
    names[CNP] = "CNP"
    return names


# opcode -> name as Wireshark prints infiniband.bth.opcode; other opcodes: "Unknown (N)" (Wireshark too)
OPCODE_NAMES: dict[int, str] = _names()
OPCODE_NAME_LIST: tuple[str, ...] = tuple(OPCODE_NAMES.get(o, f"Unknown ({o})") for o in range(256))

# --- which headers follow the BTH, per opcode (Table 38; rxe_opcode.c masks) -------------------------
H_RDETH, H_DETH, H_XRCETH, H_RETH = 1 << 0, 1 << 1, 1 << 2, 1 << 3
H_ATOMICETH, H_AETH, H_ATOMICACKETH, H_IMMDT = 1 << 4, 1 << 5, 1 << 6, 1 << 7
H_IETH, H_PAYLOAD, H_CNP, H_KNOWN = 1 << 8, 1 << 9, 1 << 10, 1 << 11
H_REQUEST, H_ENDS_MESSAGE = 1 << 12, 1 << 13  # not headers: the opcode's role (is_request, ends_message)
# headers in wire order (IBA §9.2 figure 104) with their sizes: the kernel walks them in this order
HEADER_ORDER = ((H_RDETH, RDETH_BYTES), (H_DETH, DETH_BYTES), (H_XRCETH, XRCETH_BYTES), (H_RETH, RETH_BYTES),
                (H_ATOMICETH, ATOMICETH_BYTES), (H_AETH, AETH_BYTES), (H_ATOMICACKETH, ATOMICACKETH_BYTES),
                (H_IMMDT, IMMDT_BYTES), (H_IETH, IETH_BYTES), (H_CNP, CNP_RESERVED_BYTES))
_OP_HEADERS = {
    SEND_FIRST: H_PAYLOAD, SEND_MIDDLE: H_PAYLOAD, SEND_LAST: H_PAYLOAD, SEND_LAST_IMM: H_IMMDT | H_PAYLOAD,
    SEND_ONLY: H_PAYLOAD, SEND_ONLY_IMM: H_IMMDT | H_PAYLOAD, WRITE_FIRST: H_RETH | H_PAYLOAD,
    WRITE_MIDDLE: H_PAYLOAD, WRITE_LAST: H_PAYLOAD, WRITE_LAST_IMM: H_IMMDT | H_PAYLOAD,
    WRITE_ONLY: H_RETH | H_PAYLOAD, WRITE_ONLY_IMM: H_RETH | H_IMMDT | H_PAYLOAD, READ_REQUEST: H_RETH,
    READ_RESP_FIRST: H_AETH | H_PAYLOAD, READ_RESP_MIDDLE: H_PAYLOAD, READ_RESP_LAST: H_AETH | H_PAYLOAD,
    READ_RESP_ONLY: H_AETH | H_PAYLOAD, ACKNOWLEDGE: H_AETH, ATOMIC_ACKNOWLEDGE: H_AETH | H_ATOMICACKETH,
    CMP_SWAP: H_ATOMICETH, FETCH_ADD: H_ATOMICETH, RESYNC: 0, SEND_LAST_INV: H_IETH | H_PAYLOAD,
    SEND_ONLY_INV: H_IETH | H_PAYLOAD,
}
RESPONSE_OPS = frozenset({READ_RESP_FIRST, READ_RESP_MIDDLE, READ_RESP_LAST, READ_RESP_ONLY, ACKNOWLEDGE,
                          ATOMIC_ACKNOWLEDGE})
ENDS_MESSAGE_OPS = frozenset({SEND_LAST, SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM, WRITE_LAST, WRITE_LAST_IMM,
                              WRITE_ONLY, WRITE_ONLY_IMM, READ_REQUEST, READ_RESP_LAST, READ_RESP_ONLY,
                              CMP_SWAP, FETCH_ADD, RESYNC, SEND_LAST_INV, SEND_ONLY_INV})


def _header_table() -> tuple[int, ...]:
    table = [0] * 256
    for t, ops in TRANSPORT_OPS.items():
        for op in ops:
            h = _OP_HEADERS[op] | H_KNOWN
            request = op not in RESPONSE_OPS
            if t == TRANSPORT_RD:  # RDETH on every RD packet, DETH on requests (Table 38)
                h |= H_RDETH | (H_DETH if request else 0)
            elif t == TRANSPORT_UD:
                h |= H_DETH
            elif t == TRANSPORT_XRC and request:
                h |= H_XRCETH
            h |= (H_REQUEST if request else 0) | (H_ENDS_MESSAGE if op in ENDS_MESSAGE_OPS else 0)
            table[t << TRANSPORT_SHIFT | op] = h
    table[CNP] = H_CNP | H_KNOWN
    return tuple(table)


# opcode -> H_* bits (0: an opcode the specification does not define: BTH only). A tuple, so that this
# module imports nothing (samples/rocekit/wire.py reads its tables); the kernels use it as an array.
OPCODE_HEADERS: tuple[int, ...] = _header_table()

# --- AETH syndrome (IBA §9.7.5.2.1, Table 41) ----------------------------------------------------------
AETH_TYPE_SHIFT, AETH_TYPE_MASK, AETH_VALUE_MASK = 5, 0x60, 0x1F
AETH_ACK, AETH_RNR_NAK, AETH_RESERVED, AETH_NAK = 0x00, 0x20, 0x40, 0x60  # syndrome & AETH_TYPE_MASK
AETH_KINDS = ("ack", "rnr_nak", "reserved", "nak")  # index: (syndrome >> 5) & 3 (Wireshark: Ack, RNR Nak ...)
# Table 44: NAK codes (syndrome 0x60 | code), names as Wireshark's infiniband.aeth.syndrome.error_code
NAK_PSN_SEQ_ERROR, NAK_INVALID_REQUEST, NAK_REMOTE_ACCESS, NAK_REMOTE_OP, NAK_INVALID_RD_REQUEST = 0, 1, 2, 3, 4
NAK_NAMES = {NAK_PSN_SEQ_ERROR: "PSN Sequence Error", NAK_INVALID_REQUEST: "Invalid Request",
             NAK_REMOTE_ACCESS: "Remote Access Error", NAK_REMOTE_OP: "Remote Operational Error",
             NAK_INVALID_RD_REQUEST: "Invalid RD Request"}
CREDIT_INVALID = 0x1F  # Table 43: credit count 31 = "invalid" (no end-to-end credits)
# Table 43: encoded credit count -> number of receive WQEs
CREDIT_TABLE = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
                2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
# Table 45: RNR NAK timer field -> minimum delay in µs (code 0 is the longest, 655.36 ms). Linux's
# rnrnak_usec[] has 61410 for code 25 (a typo for 61.44 ms); the specification's value is used here.
RNR_DELAY_US = (655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
                5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680,
                491520)
ACK_TIMEOUT_BASE_NS = 4096  # §9.7.6.1.3: 4.096 µs × 2^timeout (timeout 0 = infinite)
ACK_TIMEOUT_MAX = 31  # the 5-bit QP attribute

# --- IP ECN (RFC 3168 §5) ------------------------------------------------------------------------------
ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE = 0, 1, 2, 3
