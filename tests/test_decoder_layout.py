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
