"""GSS-API and SPNEGO token framing (Numba): where the Kerberos message inside a security token is.

A carrier (the SMB2 SESSION_SETUP security buffer, LDAP SASL bind credentials, HTTP ``Negotiate``)
holds one of:

- a GSS-API InitialContextToken (RFC 2743 §3.1): ``[APPLICATION 0]`` (0x60) { thisMech OID,
  innerContextToken }. For the Kerberos mechanisms (RFC 1964 §1.1, RFC 4121 §4.1) the inner token is a
  2-octet TOK_ID (``01 00`` AP-REQ, ``02 00`` AP-REP, ``03 00`` KRB-ERROR) and the Kerberos message,
  up to the end of the framing. Mechanisms: krb5 ``1.2.840.113554.1.2.2``, Microsoft's
  ``1.2.840.48018.1.2.2`` (MS-KILE 3.1.5.11, the OID Windows clients put first), user-to-user
  ``1.2.840.113554.1.2.2.3``.
- SPNEGO (RFC 4178 §4.2): the InitialContextToken with ``1.3.6.1.5.5.2`` around a NegotiationToken,
  or a bare NegotiationToken (every token after the first): ``negTokenInit [0]`` { mechTypes [0],
  reqFlags [1], mechToken [2] OCTET STRING, ... } or ``negTokenResp [1]`` { negState [0],
  supportedMech [1], responseToken [2] OCTET STRING, mechListMIC [3] }. The mechToken /
  responseToken is itself a token of the negotiated mechanism: the krb5 framing above, or (some
  implementations) the bare Kerberos message.
- a bare Kerberos message ([APPLICATION 14] AP-REQ, [15] AP-REP, [30] KRB-ERROR): the PA-TGS-REQ
  value (RFC 4120 §5.4.1, §7.5.2), or a responseToken without framing.

:func:`unwrap_all` finds the Kerberos message of each token. It emits a row for a token that holds
one, and for a token whose GSS/SPNEGO framing is damaged (unless SPNEGO already named a non-Kerberos
mechanism, e.g. NTLMSSP): a damaged token is a counted row. Tokens of other mechanisms (NTLMSSP),
SPNEGO tokens without a mechanism token (a final ``accept-completed``) and anything else give no row.
Every length is checked against the token's available bytes (``ber.read_tlv``); nesting is bounded
(SPNEGO around at most one framed mechanism token: no loop).
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import ber
from .ber import BAD_LENGTH, OK, TRUNCATED, UNEXPECTED, bytes_equal, helper, read_tlv, read_tlv_partial

# --- mechanisms: DER contents of the OIDs (X.690 §8.19) --------------------------------------------
MECH_NONE = np.int64(0)  # a bare Kerberos message, no mechanism said
MECH_KRB5 = np.int64(1)  # 1.2.840.113554.1.2.2 (RFC 1964 §1, RFC 4121 §4.1)
MECH_MS_KRB5 = np.int64(2)  # 1.2.840.48018.1.2.2 (MS-KILE 3.1.5.11; RFC 4178 §1 notes it)
MECH_KRB5_U2U = np.int64(3)  # 1.2.840.113554.1.2.2.3 (draft-swift-win2k-krb-user2user)
MECH_OTHER = np.int64(4)  # any other OID (NTLMSSP 1.3.6.1.4.1.311.2.2.10 ...)
MECH_SPNEGO_ONLY = np.int64(5)  # only SPNEGO framed it, no mechanism OID seen
MECH_NAMES = {1: "krb5", 2: "ms-krb5", 3: "krb5-u2u", 4: "other", 5: "spnego"}
OID_KRB5 = np.array([0x2A, 0x86, 0x48, 0x86, 0xF7, 0x12, 0x01, 0x02, 0x02], np.uint8)
OID_MS_KRB5 = np.array([0x2A, 0x86, 0x48, 0x82, 0xF7, 0x12, 0x01, 0x02, 0x02], np.uint8)
OID_KRB5_U2U = np.array([0x2A, 0x86, 0x48, 0x86, 0xF7, 0x12, 0x01, 0x02, 0x02, 0x03], np.uint8)
OID_SPNEGO = np.array([0x2B, 0x06, 0x01, 0x05, 0x05, 0x02], np.uint8)  # 1.3.6.1.5.5.2 (RFC 4178 §3)

# --- tags ---------------------------------------------------------------------------------------------
GSS_FRAMING = ber.app(0)  # InitialContextToken ::= [APPLICATION 0] IMPLICIT SEQUENCE (RFC 2743 §3.1)
OID = ber.OID
SEQ = ber.SEQUENCE
OCTETS = ber.OCTET_STRING
C0 = ber.ctx(0)  # negTokenInit; NegTokenInit mechTypes; NegTokenResp negState
C1 = ber.ctx(1)  # negTokenResp; NegTokenResp supportedMech
C2 = ber.ctx(2)  # mechToken / responseToken
GSS_FRAMING_OCTET = 0x60
NEG_TOKEN_INIT_OCTET = 0xA0
NEG_TOKEN_RESP_OCTET = 0xA1
# identifier octets of the Kerberos messages a GSS token carries ([APPLICATION n] constructed, RFC 4120
# §5.5.1, §5.5.2, §5.9.1)
KRB_AP_REQ_OCTET = 0x6E
KRB_AP_REP_OCTET = 0x6F
KRB_ERROR_OCTET = 0x7E
TOK_ID_SIZE = 2  # RFC 1964 §1.1 / RFC 4121 §4.1: two octets, big-endian
NO_TOK_ID = np.int64(-1)
TOK_AP_REQ = 0x0100  # RFC 4121 §4.1: the TOK_IDs of the context establishment tokens
TOK_AP_REP = 0x0200
TOK_ERROR = 0x0300
TOK_MESSAGE = {TOK_AP_REQ: 14, TOK_AP_REP: 15, TOK_ERROR: 30}  # TOK_ID -> the msg-type it frames

# outputs of unwrap_all, one row per token: (field, meaning)
(G_EMIT, G_K_START, G_K_END, G_MECH, G_SPNEGO, G_TOK_ID, G_STATUS) = (np.int64(k) for k in range(7))
N_G = 7


@helper
def _mech(buf, s, e):
    if bytes_equal(buf, s, e, OID_KRB5, False):
        return MECH_KRB5
    if bytes_equal(buf, s, e, OID_MS_KRB5, False):
        return MECH_MS_KRB5
    if bytes_equal(buf, s, e, OID_KRB5_U2U, False):
        return MECH_KRB5_U2U
    return MECH_OTHER


@helper
def _is_kerberos_octet(b):
    return b == KRB_AP_REQ_OCTET or b == KRB_AP_REP_OCTET or b == KRB_ERROR_OCTET


@helper
def _framed(buf, s, mend, g):
    """GSS InitialContextToken at ``s``. Returns (is SPNEGO, content start after the OID, content end).
    A Kerberos mechanism fills g's mech, TOK_ID and Kerberos bounds; errors go to g's status."""
    t, cs, ce, st = read_tlv_partial(buf, s, mend, mend)
    if st != OK:
        g[G_STATUS] = st
        return False, cs, ce
    if t != GSS_FRAMING:
        g[G_STATUS] = UNEXPECTED
        return False, cs, ce
    t, os_, oe, st = read_tlv(buf, cs, ce, mend)
    if st != OK:
        g[G_STATUS] = st
        return False, cs, ce
    if t != OID:
        g[G_STATUS] = UNEXPECTED
        return False, cs, ce
    if bytes_equal(buf, os_, oe, OID_SPNEGO, False):
        return True, oe, ce
    mech = _mech(buf, os_, oe)
    g[G_MECH] = mech
    if mech == MECH_OTHER:
        return False, oe, ce
    if oe + TOK_ID_SIZE > ce:
        g[G_STATUS] = TRUNCATED if ce >= mend else BAD_LENGTH
        return False, oe, ce
    tok = (np.int64(buf[oe]) << 8) | np.int64(buf[oe + 1])
    g[G_TOK_ID] = tok
    if tok == TOK_AP_REQ or tok == TOK_AP_REP or tok == TOK_ERROR:
        g[G_K_START] = oe + TOK_ID_SIZE
        g[G_K_END] = ce
    else:  # RFC 1964 §1.2 MIC / wrap / delete tokens (01 01, 02 01, 01 02): a security layer, not Kerberos
        g[G_MECH] = MECH_OTHER
    return False, oe, ce


@helper
def _negotiation(buf, s, e, mend, g):
    """SPNEGO NegotiationToken TLV in ``[s, e)`` (RFC 4178 §4.2). Returns (inner token start, end,
    mechanism the token names: negTokenInit's first mechType, negTokenResp's supportedMech), start -1
    when it carries no mechanism token; errors go to g's status."""
    mech = MECH_SPNEGO_ONLY
    t, cs, ce, st = read_tlv_partial(buf, s, e, mend)
    if st != OK:
        g[G_STATUS] = st
        return np.int64(-1), np.int64(-1), mech
    if t != C0 and t != C1:
        g[G_STATUS] = UNEXPECTED
        return np.int64(-1), np.int64(-1), mech
    init = t == C0
    t, ss, se, st = read_tlv_partial(buf, cs, ce, mend)
    if st != OK:
        g[G_STATUS] = st
        return np.int64(-1), np.int64(-1), mech
    if t != SEQ:
        g[G_STATUS] = UNEXPECTED
        return np.int64(-1), np.int64(-1), mech
    p = ss
    while p < se:
        t, fs, fe, st = read_tlv_partial(buf, p, se, mend)
        if st != OK:
            g[G_STATUS] = st
            return np.int64(-1), np.int64(-1), mech
        p = fe
        if init and t == C0:  # mechTypes: SEQUENCE OF MechType; the mechToken is for the first
            t2, ls, le, st = read_tlv_partial(buf, fs, fe, mend)
            if st == OK and t2 == SEQ and ls < le:
                t3, os_, oe, st = read_tlv(buf, ls, le, mend)
                if st == OK and t3 == OID:
                    mech = _mech(buf, os_, oe)
            if st != OK:
                g[G_STATUS] = st
                return np.int64(-1), np.int64(-1), mech
        elif not init and t == C1:  # supportedMech
            t2, os_, oe, st = read_tlv(buf, fs, fe, mend)
            if st != OK:
                g[G_STATUS] = st
                return np.int64(-1), np.int64(-1), mech
            if t2 == OID:
                mech = _mech(buf, os_, oe)
        elif t == C2:
            t2, ts, te, st = read_tlv(buf, fs, fe, mend)
            if st == TRUNCATED and ts > fs:
                g[G_STATUS] = TRUNCATED  # decode what was captured of it
            elif st != OK:
                g[G_STATUS] = st
                return np.int64(-1), np.int64(-1), mech
            if t2 != OCTETS:
                g[G_STATUS] = UNEXPECTED
                return np.int64(-1), np.int64(-1), mech
            return ts, te, mech
    return np.int64(-1), np.int64(-1), mech


@helper
def unwrap(buf, s, mend, g):
    """The token ``buf[s:mend]`` into g (``G_*``): see the module docstring."""
    if s >= mend:
        return
    b = buf[s]
    if _is_kerberos_octet(b):
        g[G_K_START] = s
        g[G_K_END] = mend
        g[G_EMIT] = 1
        return
    if b != GSS_FRAMING_OCTET and b != NEG_TOKEN_INIT_OCTET and b != NEG_TOKEN_RESP_OCTET:
        return  # NTLMSSP, a security-layer token, anything else: no Kerberos
    # a token cut short (snapshot length, a wrong carrier length) shows in its outermost TLV. The
    # krb5 framing's content is the Kerberos message, so a cut framing is a truncated row; a SPNEGO
    # token cut after its mechanism token (in mechListMIC) leaves the Kerberos message whole
    t, cs, ce, st = read_tlv(buf, s, mend, mend)
    cut = st == TRUNCATED
    unwrap_framing(buf, s, mend, g, b)
    if cut and (g[G_K_START] < 0 or g[G_SPNEGO] == 0) and g[G_STATUS] == OK and g[G_MECH] != MECH_OTHER:
        g[G_STATUS] = TRUNCATED
        g[G_EMIT] = 1


@helper
def unwrap_framing(buf, s, mend, g, b):
    """:func:`unwrap` below the truncation check: ``b`` is the token's first octet."""
    if b == GSS_FRAMING_OCTET:
        spnego, cs, ce = _framed(buf, s, mend, g)
        if not spnego:
            mech = g[G_MECH]
            g[G_EMIT] = 1 if (g[G_K_START] >= 0 or (g[G_STATUS] != OK and mech != MECH_OTHER)) else 0
            return
        ns = cs
        ne = ce
    elif b == NEG_TOKEN_INIT_OCTET or b == NEG_TOKEN_RESP_OCTET:
        ns = s
        ne = mend
    else:
        return
    g[G_SPNEGO] = 1
    ts, te, hint = _negotiation(buf, ns, ne, mend, g)
    if ts < 0:
        g[G_MECH] = hint
        g[G_EMIT] = 1 if (g[G_STATUS] != OK and hint != MECH_OTHER) else 0
        return
    inner_status = g[G_STATUS]
    if ts < te and buf[ts] == GSS_FRAMING_OCTET:
        spnego, cs, ce = _framed(buf, ts, te, g)
        if spnego:  # SPNEGO inside SPNEGO: not a mechanism token
            g[G_STATUS] = UNEXPECTED
            g[G_MECH] = MECH_SPNEGO_ONLY
        if inner_status != OK:
            g[G_STATUS] = inner_status
        mech = g[G_MECH]
        g[G_EMIT] = 1 if (g[G_K_START] >= 0 or (g[G_STATUS] != OK and mech != MECH_OTHER)) else 0
        return
    g[G_MECH] = hint
    if ts < te and _is_kerberos_octet(buf[ts]):
        g[G_K_START] = ts
        g[G_K_END] = te
        g[G_EMIT] = 1
    else:  # NTLMSSP or another mechanism's token: a damaged one still counts when SPNEGO named Kerberos
        g[G_EMIT] = 1 if (g[G_STATUS] != OK and hint != MECH_OTHER) else 0


@njit(cache=True)
def unwrap_all(buf, offsets, lengths):
    """Every token ``buf[offsets[i]:offsets[i]+lengths[i]]`` → an (N_G, n) int64 array (``G_*`` rows)."""
    n = offsets.shape[0]
    out = np.empty((N_G, n), np.int64)
    g = np.empty(N_G, np.int64)
    for i in range(n):
        g[G_EMIT] = 0
        g[G_K_START] = -1
        g[G_K_END] = -1
        g[G_MECH] = MECH_NONE
        g[G_SPNEGO] = 0
        g[G_TOK_ID] = NO_TOK_ID
        g[G_STATUS] = OK
        if lengths[i] > 0:
            unwrap(buf, offsets[i], offsets[i] + lengths[i], g)
        out[:, i] = g
    return out
