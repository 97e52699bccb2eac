"""The decoders' wire layout tables (analyzer/decoders/*_layout.py and the named offsets of the DNS and
BER kernels) checked against independent descriptions of the same structures: struct formats written
from the specs, the decoders' own code tables, and byte-level round trips. A mistyped offset fails
here, by name, rather than as a wrong column in a capture."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from analyzer.decoders import ber, dns_kernels, kerberos, kerberos_layout, ldap, ldap_layout, smb2_layout
from analyzer.decoders import smb2_breaks, smb2_kernel, smb2_tables
from analyzer.decoders import rocev2, rocev2_kernels, rocev2_layout

# MS-SMB2 2.2.1.2 SYNC header, field by field (ProtocolId, StructureSize, CreditCharge, Status, Command,
# CreditRequest, Flags, NextCommand, MessageId, Reserved/ProcessId, TreeId, SessionId, Signature)
SMB2_SYNC_HEADER = "<4sHHIHHIIQIIQ16s"


def _tiles(layout, size):
    """(name, offset, width) rows cover [0, size) with neither gap nor overlap."""
    pos = 0
    for name, offset, width in sorted(layout, key=lambda row: row[1]):
        assert offset == pos, f"{name} at {offset}, expected {pos}"
        pos += width
    assert pos == size


def test_smb2_header_layout_tiles_the_header_and_matches_the_spec_struct():
    _tiles(smb2_layout.HEADER_LAYOUT, smb2_layout.HEADER)
    assert struct.calcsize(SMB2_SYNC_HEADER) == smb2_layout.HEADER
    values = (b"\xfeSMB", 64, 3, 0xC0000016, 5, 31, 0x1, 0x98, 0x1122334455667788, 0xFEFF, 0xAABBCCDD,
              0x0102030405060708, bytes(range(16)))
    raw = np.frombuffer(struct.pack(SMB2_SYNC_HEADER, *values), np.uint8)
    L = smb2_layout
    assert smb2_kernel.u16le(raw, L.HDR_STRUCTURE_SIZE) == 64
    assert smb2_kernel.u16le(raw, L.HDR_CREDIT_CHARGE) == 3
    assert smb2_kernel.u32le(raw, L.HDR_STATUS) == 0xC0000016
    assert smb2_kernel.u16le(raw, L.HDR_COMMAND) == smb2_tables.CREATE
    assert smb2_kernel.u16le(raw, L.HDR_CREDIT) == 31
    assert smb2_kernel.u32le(raw, L.HDR_FLAGS) == smb2_tables.FLAGS_SERVER_TO_REDIR
    assert smb2_kernel.u32le(raw, L.HDR_NEXT_COMMAND) == 0x98
    assert smb2_kernel.u64le(raw, L.HDR_MESSAGE_ID) == 0x1122334455667788
    assert smb2_kernel.u32le(raw, L.HDR_TREE_ID) == 0xAABBCCDD
    assert smb2_kernel.u64le(raw, L.HDR_SESSION_ID) == 0x0102030405060708
    assert bytes(raw[L.HDR_SIGNATURE:L.HDR_SIGNATURE + L.HDR_SIGNATURE_SIZE]) == bytes(range(16))
    assert raw[L.HDR_PROTOCOL_ID] == L.PROTOCOL_SMB2
    assert bytes(raw[1:4]) == bytes((L.PROTOCOL_S, L.PROTOCOL_M, L.PROTOCOL_B))


def test_smb2_response_sizes_cover_every_command():
    assert len(smb2_kernel.RESPONSE_SIZE) == len(smb2_tables.COMMANDS)
    # the commands whose regular response has StructureSize 9, like the ERROR response (2.2.2)
    nine = {smb2_tables.COMMANDS[c] for c, size in enumerate(smb2_kernel.RESPONSE_SIZE) if size == 9}
    assert nine == {"SESSION_SETUP", "QUERY_DIRECTORY", "CHANGE_NOTIFY", "QUERY_INFO"}


@pytest.mark.parametrize("size_name, fields", [
    ("CREATE_REQ_SIZE", ("CREATE_REQ_CONTEXTS_LENGTH",)),  # the last fixed field ends the fixed part
    ("CREATE_RESP_SIZE", ("CREATE_RESP_CONTEXTS_LENGTH",)),
    ("SI_SIZE", ("SI_FILE_ID",)),
    ("QI_SIZE", ("QI_FILE_ID",)),
    ("LOCK_REQ_SIZE", ("LOCK_FILE_ID",)),
    ("TRANSFORM_SIZE", ("TRANSFORM_SESSION_ID",)),
    ("LEASE_V2_SIZE", ("LEASE_EPOCH",)),
])
def test_smb2_fixed_parts_hold_the_fields_read_from_them(size_name, fields):
    widths = {"CREATE_REQ_CONTEXTS_LENGTH": 4, "CREATE_RESP_CONTEXTS_LENGTH": 4, "SI_FILE_ID": 16,
              "QI_FILE_ID": 16, "LOCK_FILE_ID": 16, "TRANSFORM_SESSION_ID": 8,
              "LEASE_EPOCH": 4}  # LEASE_EPOCH: Epoch (2) + Reserved (2)
    size = getattr(smb2_layout, size_name)
    for name in fields:
        assert getattr(smb2_layout, name) + widths[name] == size, name


def test_dns_header_offsets_match_rfc1035_struct():
    raw = np.frombuffer(struct.pack("!6H", 0x1234, 0x8180, 1, 2, 3, 4), np.uint8)
    k = dns_kernels
    assert k.HEADER == struct.calcsize("!6H")
    got = [int(raw[o]) << 8 | int(raw[o + 1])
           for o in (k.HDR_ID, k.HDR_FLAGS, k.HDR_QDCOUNT, k.HDR_ANCOUNT, k.HDR_NSCOUNT, k.HDR_ARCOUNT)]
    assert got == [0x1234, 0x8180, 1, 2, 3, 4]
    assert k.RR_FIXED == struct.calcsize("!HHIH") and k.RR_RDLENGTH == struct.calcsize("!HHI")
    assert k.SOA_FIXED == struct.calcsize("!5I") and k.SOA_MINIMUM == struct.calcsize("!4I")


def test_dns_output_columns_cover_each_field_once():
    arrays, named = dns_kernels.allocate_output(3)
    assert len(named) == dns_kernels.N_FIELDS
    assert [a.dtype for a in arrays] == [np.uint16, np.uint32, np.int64, np.uint8]
    assert all(v.shape == (3,) and v.base is not None for v in named.values())  # views into the arrays


def test_ldap_operation_numbers_match_the_operation_names():
    names = {"BIND_REQUEST": "bindRequest", "BIND_RESPONSE": "bindResponse", "UNBIND_REQUEST": "unbindRequest",
             "SEARCH_REQUEST": "searchRequest", "SEARCH_RESULT_ENTRY": "searchResEntry",
             "SEARCH_RESULT_DONE": "searchResDone", "MODIFY_REQUEST": "modifyRequest",
             "MODIFY_RESPONSE": "modifyResponse", "ADD_REQUEST": "addRequest", "ADD_RESPONSE": "addResponse",
             "DEL_REQUEST": "delRequest", "DEL_RESPONSE": "delResponse", "MODIFY_DN_REQUEST": "modDNRequest",
             "MODIFY_DN_RESPONSE": "modDNResponse", "COMPARE_REQUEST": "compareRequest",
             "COMPARE_RESPONSE": "compareResponse", "ABANDON_REQUEST": "abandonRequest",
             "SEARCH_RESULT_REFERENCE": "searchResRef", "EXTENDED_REQUEST": "extendedReq",
             "EXTENDED_RESPONSE": "extendedResp", "INTERMEDIATE_RESPONSE": "intermediateResponse"}
    assert {getattr(ldap_layout, const): name for const, name in names.items()} == ldap.OPERATIONS
    assert set(range(ldap_layout.MAX_OP + 1)) - set(ldap.OPERATIONS) == set(ldap_layout.UNASSIGNED_OPS)


def test_kerberos_message_types_match_the_table():
    consts = {"AS_REQ": "AS-REQ", "AS_REP": "AS-REP", "TGS_REQ": "TGS-REQ", "TGS_REP": "TGS-REP",
              "AP_REQ": "AP-REQ", "AP_REP": "AP-REP", "KRB_RESERVED16": "KRB-RESERVED16",
              "KRB_RESERVED17": "KRB-RESERVED17", "KRB_SAFE": "KRB-SAFE", "KRB_PRIV": "KRB-PRIV",
              "KRB_CRED": "KRB-CRED", "KRB_ERROR": "KRB-ERROR"}
    assert {getattr(kerberos_layout, c): name for c, name in consts.items()} == kerberos.MESSAGE_TYPES
    for code in (kerberos_layout.PA_ENC_TIMESTAMP, kerberos_layout.PA_PK_AS_REQ, kerberos_layout.PA_PK_AS_REQ_OLD):
        assert code in kerberos.PREAUTH_PADATA


def test_ber_tag_packing_constants():
    assert ber.ident(0x30) == ber.SEQUENCE == (ber.UNIVERSAL | ber.CONSTRUCTED) << ber.TAG_CLASS_SHIFT | 0x10
    assert ber.tag_class(ber.app(3)) == ber.APPLICATION | ber.CONSTRUCTED
    assert ber.tag_number(ber.ctx(27, False)) == 27
    assert ber.TAG_NUMBER_MASK == (1 << 28) - 1  # X.690 tag numbers up to 2**28 - 1 (4 subsequent octets)
    assert (ber.ID_CLASS_BITS << ber.TAG_CLASS_SHIFT) & ber.TAG_NUMBER_MASK == 0
    # a two-octet high-tag-number identifier: [APPLICATION 200] constructed = 7F 81 48, then length 0
    buf = np.array([0x7F, 0x81, 0x48, 0x00], np.uint8)
    t, s, e, st = ber.read_tlv(buf, 0, 4, 4)
    assert (st, t, s, e) == (ber.OK, ber.app(200), 4, 4)


def test_break_trigger_matrices_refuse_a_missing_column():
    cols = {k: np.zeros(2, np.int64) for k in range(smb2_breaks.N_CAND - 1)}
    with pytest.raises(AssertionError, match="out of step"):
        smb2_breaks.input_matrix(cols, smb2_breaks.N_CAND)


# IBA vol. 1 §9.2 BTH: OpCode, SE|M|PadCnt|TVer, P_Key, FECN|BECN|resv6, DestQP (24), A|resv7, PSN (24)
ROCE_BTH = "!BBHB3sB3s"


def test_rocev2_bth_layout_tiles_the_header_and_matches_the_spec_struct():
    R = rocev2_layout
    _tiles(R.BTH_LAYOUT, R.BTH_BYTES)
    assert struct.calcsize(ROCE_BTH) == R.BTH_BYTES
    raw = np.frombuffer(struct.pack(ROCE_BTH, 0x0A, 0xE5, 0x8001, 0xC0, b"\xab\xcd\xef", 0x80, b"\x12\x34\x56"),
                        np.uint8)
    out = rocev2_kernels.allocate_output(1)
    rocev2_kernels.decode_all(raw, np.zeros(1, np.int64), np.full(1, 12, np.int64), np.full(1, 12 + 16 + 6 + 2 + 4, np.int64),
                              out)
    K = rocev2_kernels
    f = out[:, 0]
    assert (f[K.F_OPCODE], f[K.F_PKEY], f[K.F_DEST_QP], f[K.F_PSN]) == (0x0A, 0x8001, 0xABCDEF, 0x123456)
    assert f[K.F_FLAGS] & R.SE_BIT and f[K.F_FLAGS] & R.MIGREQ_BIT and f[K.F_FLAGS] & R.TVER_MASK == 5
    assert (f[K.F_FLAGS] >> R.PADCNT_SHIFT) & R.PADCNT_MASK == 2
    assert f[K.F_FECN_BECN] == R.FECN_BIT | R.BECN_BIT and f[K.F_ACKREQ] == R.ACKREQ_BIT
    assert f[K.F_STATUS] == K.S_TRUNCATED  # WRITE Only: its RETH (and 6 payload + 2 pad bytes) not captured


def test_rocev2_extended_header_sizes_match_the_spec_structs():
    R = rocev2_layout
    assert R.RETH_BYTES == struct.calcsize("!QII") and R.RETH_RKEY == 8 and R.RETH_DMA_LEN == 12
    assert R.AETH_BYTES == struct.calcsize("!B3s") and R.AETH_MSN == 1
    assert R.DETH_BYTES == struct.calcsize("!IB3s") and R.DETH_SRC_QP == 5
    assert R.ATOMICETH_BYTES == struct.calcsize("!QIQQ") and R.ATOMICACKETH_BYTES == struct.calcsize("!Q")
    assert R.RDETH_BYTES == R.XRCETH_BYTES == R.IMMDT_BYTES == R.IETH_BYTES == R.ICRC_BYTES == 4
    assert R.CNP_RESERVED_BYTES == 16 and R.CNP == 0x81 and R.ROCEV2_PORT == 4791
    assert [bit for bit, _ in R.HEADER_ORDER] == sorted(bit for bit, _ in R.HEADER_ORDER if bit != R.H_CNP) + [R.H_CNP]


def test_rocev2_headers_per_opcode_follow_the_names():
    """Table 38's headers, checked against what each opcode's (Wireshark) name says it is."""
    R = rocev2_layout
    for op, name in R.OPCODE_NAMES.items():
        h = int(R.OPCODE_HEADERS[op])
        if name.endswith("Reserved"):  # RC 0x15: named by Wireshark, defined by no transport
            assert h == 0
            continue
        assert h & R.H_KNOWN, name
        assert bool(h & R.H_IMMDT) == ("with Immediate" in name), name
        assert bool(h & R.H_IETH) == ("with Invalidate" in name), name
        reth = any(s in name for s in ("WRITE First", "WRITE Only", "READ Request"))
        assert bool(h & R.H_RETH) == reth, name
        aeth = any(s in name for s in ("response First", "response Last", "response Only", "Acknowledge"))
        assert bool(h & R.H_AETH) == aeth, name
        assert bool(h & R.H_ATOMICETH) == ("CmpSwap" in name or "FetchAdd" in name), name
        assert bool(h & R.H_ATOMICACKETH) == ("ATOMIC Acknowledge" in name), name
        assert bool(h & R.H_RDETH) == ("(RD)" in name), name
        request = not any(s in name for s in ("response", "Acknowledge")) and name != "CNP"
        assert bool(h & R.H_REQUEST) == request, name
        assert bool(h & R.H_DETH) == ("(UD)" in name or ("(RD)" in name and request)), name
        assert bool(h & R.H_XRCETH) == ("(XRC)" in name and request), name
        assert (op >> R.TRANSPORT_SHIFT) == {"(RC)": 0, "(UC)": 1, "(RD)": 2, "(UD)": 3, "CNP": 4, "(XRC)": 5}[
            next(t for t in ("(RC)", "(UC)", "(RD)", "(UD)", "(XRC)", "CNP") if t in name)]
    assert set(np.flatnonzero(R.OPCODE_HEADERS)) == {op for op, n in R.OPCODE_NAMES.items() if not n.endswith("Reserved")}
    transport = {c.name: c for c in rocev2.PACKET_COLUMNS}["transport"]
    assert transport.polars.categories.to_list() == list(R.TRANSPORT_NAMES)


def test_rocev2_aeth_and_timer_tables():
    R = rocev2_layout
    assert (R.AETH_ACK, R.AETH_RNR_NAK, R.AETH_NAK) == (0x00, 0x20, 0x60)  # Table 41: bits 6-5
    assert [R.AETH_KINDS[(s >> R.AETH_TYPE_SHIFT) & 3] for s in (0x1F, 0x2C, 0x45, 0x63)] == [
        "ack", "rnr_nak", "reserved", "nak"]
    assert len(R.CREDIT_TABLE) == R.CREDIT_INVALID == 31 and list(R.CREDIT_TABLE) == sorted(set(R.CREDIT_TABLE))
    assert R.CREDIT_TABLE[-1] == 32768 and R.CREDIT_TABLE[5] == 6
    assert len(R.RNR_DELAY_US) == 32 and R.RNR_DELAY_US[0] == 655360 and list(R.RNR_DELAY_US[1:]) == sorted(R.RNR_DELAY_US[1:])
    assert R.RNR_DELAY_US[25] == 61440 and R.ACK_TIMEOUT_BASE_NS == 4096
