"""LDAP wire layout shared by the LDAP kernels and :mod:`analyzer.decoders.ldap`: the protocolOp
numbers (RFC 4511 §4.2 - §4.13, the [APPLICATION n] tags of LDAPMessage.protocolOp), the BER tags of
the fields the kernels read, the filter choices (§4.5.1.7), the GSS-API wrap token layouts of SASL
buffers (RFC 4121 §4.2.6.2, RFC 1964 §1.2.2), and the kernels' field layout (``I_*`` int fields,
``S_*`` string slots). Numba freezes these module-level ints as compile-time constants (its cache
is keyed on each kernel's own source file: after changing a value here, touch the kernel modules or
clear the cache)."""
from __future__ import annotations

import numpy as np

from . import ber

# --- protocolOp (RFC 4511 §4.1.1): [APPLICATION n] -------------------------------------------------------
BIND_REQUEST = 0  # §4.2
BIND_RESPONSE = 1  # §4.2.2
UNBIND_REQUEST = 2  # §4.3
SEARCH_REQUEST = 3  # §4.5.1
SEARCH_RESULT_ENTRY = 4  # §4.5.2
SEARCH_RESULT_DONE = 5  # §4.5.2
MODIFY_REQUEST = 6  # §4.6
MODIFY_RESPONSE = 7
ADD_REQUEST = 8  # §4.7
ADD_RESPONSE = 9
DEL_REQUEST = 10  # §4.8
DEL_RESPONSE = 11
MODIFY_DN_REQUEST = 12  # §4.9
MODIFY_DN_RESPONSE = 13
COMPARE_REQUEST = 14  # §4.10
COMPARE_RESPONSE = 15
ABANDON_REQUEST = 16  # §4.11
SEARCH_RESULT_REFERENCE = 19  # §4.5.3
EXTENDED_REQUEST = 23  # §4.12
EXTENDED_RESPONSE = 24
INTERMEDIATE_RESPONSE = 25  # §4.13
MAX_OP = 25
# numbers RFC 4511 leaves unassigned (17, 18: RFC 1777's; 20 - 22)
UNASSIGNED_OPS = (17, 18, 20, 21, 22)
# bindRequest AuthenticationChoice [3] SaslCredentials (§4.2); [0] simple, MS-ADTS sicily choices
AUTH_SASL = 3
# bindResponse serverSaslCreds [7] (§4.2.2); ExtendedResponse responseName [10], responseValue [11] (§4.12);
# ExtendedRequest requestName [0], requestValue [1]; IntermediateResponse responseName [0] (§4.13);
# ModifyDNRequest newSuperior [0] (§4.9); LDAPMessage controls [0] (§4.1.11); LDAPResult referral [3] (§4.1.9)
SERVER_SASL_CREDS = ber.ctx(7, False)
RESPONSE_NAME = ber.ctx(10, False)
RESPONSE_VALUE = ber.ctx(11, False)
REQUEST_NAME = ber.ctx(0, False)
REQUEST_VALUE = ber.ctx(1, False)
NEW_SUPERIOR = ber.ctx(0, False)
INTERMEDIATE_NAME = ber.ctx(0, False)
CONTROLS = ber.ctx(0)
REFERRAL = ber.ctx(3)
SASL_CREDENTIALS = ber.ctx(3)


MAX_SASL_UNITS = 1 << 20  # LDAPMessages opened in one SASL buffer
CANCEL_OID_BYTES = np.frombuffer(b"1.3.6.1.1.8", dtype=np.uint8).copy()  # RFC 3909 Cancel


# --- kernel layout: int fields (I_*) and string slots (S_*) of one LDAPMessage -------------------------
(I_UNIT, I_SASL, I_OPAQUE, I_MSGID, I_OP, I_VERSION, I_AUTH, I_CRED_LEN, I_SCOPE, I_DEREF, I_SIZE_LIMIT,
 I_TIME_LIMIT, I_TYPES_ONLY, I_ATTR_COUNT, I_DELETE_OLD_RDN, I_ABANDON_ID, I_RESULT, I_STATUS) = (
    np.int64(k) for k in range(18))
N_INTS = 18
(S_DN, S_MECH, S_FILTER, S_ATTRS, S_CHANGES, S_NEW_RDN, S_NEW_SUPERIOR, S_OID, S_MATCHED, S_DIAG, S_REFERRALS,
 S_CONTROLS) = (np.int64(k) for k in range(12))
N_STRS = 12

SEQ = ber.SEQUENCE
OCTETS = ber.OCTET_STRING
INT = ber.INTEGER
ENUM = ber.ENUMERATED
BOOL = ber.BOOLEAN
SET_ = ber.SET
APP_CONSTRUCTED = ber.APPLICATION | ber.CONSTRUCTED
APP_PRIMITIVE = ber.APPLICATION
CTX_CONSTRUCTED = ber.CONTEXT | ber.CONSTRUCTED
CTX_PRIMITIVE = ber.CONTEXT
# Filter CHOICE (§4.5.1.7): and [0], or [1], not [2], equalityMatch [3], substrings [4], greaterOrEqual [5],
# lessOrEqual [6], present [7] (primitive), approxMatch [8], extensibleMatch [9]
F_AND, F_OR, F_NOT = ber.ctx(0), ber.ctx(1), ber.ctx(2)
F_EQ, F_SUB, F_GE, F_LE, F_APPROX, F_EXT = ber.ctx(3), ber.ctx(4), ber.ctx(5), ber.ctx(6), ber.ctx(8), ber.ctx(9)
F_PRESENT = ber.ctx(7, False)
# SubstringFilter substrings (§4.5.1.7.2): initial [0], any [1], final [2]
SUB_INITIAL, SUB_ANY, SUB_FINAL = (ber.ctx(k, False) for k in (0, 1, 2))
# MatchingRuleAssertion (§4.5.1.7.7): matchingRule [1], type [2], matchValue [3], dnAttributes [4]
MRA_RULE, MRA_TYPE, MRA_VALUE, MRA_DN = (ber.ctx(k, False) for k in (1, 2, 3, 4))
APP0 = ber.app(0)  # GSS-API InitialContextToken [APPLICATION 0] (RFC 2743 §3.1)
OID_TAG = ber.OID
# RFC 4515 §3 filter text
OP_EQ, OP_GE, OP_LE, OP_APPROX = (ber.ascii_array(op) for op in ("=", ">=", "<=", "~="))
TXT_PRESENT = ber.ascii_array("=*)")
TXT_DN = ber.ascii_array(":dn")
TXT_EXT = ber.ascii_array(":=")
# ModifyRequest operation ENUMERATED (§4.6; increment: RFC 4525), as the changes text names them
MOD_ADD, MOD_DELETE, MOD_REPLACE, MOD_INCREMENT = (
    ber.ascii_array(name) for name in ("add", "delete", "replace", "increment"))
# RFC 1964 §1.2: the Kerberos V5 GSS-API mechanism OID 1.2.840.113554.1.2.2, DER content
KRB5_OID = np.frombuffer(bytes.fromhex("2a864886f712010202"), dtype=np.uint8).copy()

# unit kinds (first pass)
K_LDAP, K_SASL_LDAP, K_TLS, K_SASL, K_SEALED = (np.int64(k) for k in range(5))
# characters, as np.int64 (int literals as call arguments cost a compiled specialisation each, see ber)
(LPAREN, RPAREN, STAR, EQUALS, COLON, AMP, PIPE, BANG, COMMA, SPACE) = (
    np.int64(ord(c)) for c in "()*=:&|!, ")
YES = np.bool_(True)
NO = np.bool_(False)
ZERO = np.int64(0)


# --- SASL buffers (RFC 4422 §3.7): a 4-octet length, then a GSS-API token ------------------------------------
SASL_LENGTH_SIZE = 4
# RFC 4121 §4.2.6.2 Wrap token: TOK_ID 05 04, Flags, Filler FF, EC (2), RRC (2), SND_SEQ (8)
WRAP_TOK_ID_0, WRAP_TOK_ID_1 = 0x05, 0x04
WRAP_FLAGS = 2
WRAP_FLAG_SEALED = 0x02  # Flags bit 1: Sealed (confidentiality)
WRAP_FILLER = 3
WRAP_FILLER_OCTET = 0xFF
WRAP_EC = 4
WRAP_RRC = 6
WRAP_HEADER = 16
# RFC 1964 §1.2.2 token after the krb5 OID: TOK_ID 02 01, SGN_ALG (2), SEAL_ALG (2: FF FF = none), SND_SEQ (8),
# SGN_CKSUM (8, or 20 for HMAC-SHA1-DES3-KD), confounder (8)
MIC1964_TOK_ID_0, MIC1964_TOK_ID_1 = 0x02, 0x01
MIC1964_SGN_ALG = 2
MIC1964_SEAL_ALG = 4
MIC1964_NO_SEAL = 0xFF
MIC1964_HEADER = 8
MIC1964_SND_SEQ = 8
MIC1964_CKSUM_DES3 = 20
MIC1964_CKSUM = 8
MIC1964_CONFOUNDER = 8
SGN_ALG_HMAC_SHA1_DES3_KD = 0x0400
GSS_TOKEN_TAG = 0x60  # [APPLICATION 0] constructed: InitialContextToken framing (RFC 2743 §3.1)
PADDING_MAX = 8  # RFC 1964 / RFC 4121 padding left after the last LDAPMessage
# TLS record (RFC 8446 §5.1): ContentType 20-23, legacy_record_version 0x03xx
TLS_CONTENT_FIRST, TLS_CONTENT_LAST, TLS_VERSION_MAJOR = 0x14, 0x17, 0x03
SEQUENCE_OCTET = 0x30  # the first octet of an LDAPMessage (SEQUENCE)
