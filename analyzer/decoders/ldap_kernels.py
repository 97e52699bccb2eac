"""Numba kernels of the LDAP decoder (see ``analyzer.decoders.ldap`` for the schema, the tables and
the pairing). Pass 1 finds the LDAPMessages of each framed message (plain, several in a CLDAP
datagram, or inside a SASL buffer); pass 2 decodes each one into a field vector and string spans,
rendering search filters as RFC 4515 text. RFC 4511 §4 structures, read with the shared BER reader
(``analyzer.decoders.ber``)."""
from __future__ import annotations

import numpy as np
from numba import njit

from . import ber
from .ber import (NULL, OK, TRUNCATED, UNEXPECTED, MISSING, TRAILING, NOT_PROTOCOL, BAD_VALUE, TOO_DEEP, ARENA_FULL,
                  TEXT, FILTER_VALUE, helper, read_tlv, read_tlv_partial, read_int, read_bool, put_byte, put_int,
                  put_slot, put_utf8)

MAX_FILTER_DEPTH = 32  # nested and/or/not; real filters stay under 10
_MAX_SASL_UNITS = 1 << 20
CANCEL_OID_BYTES = np.frombuffer(b"1.3.6.1.1.8", dtype=np.uint8).copy()  # RFC 3909 Cancel


# --- kernel layout -----------------------------------------------------------------------------------
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
F_AND, F_OR, F_NOT = ber.ctx(0), ber.ctx(1), ber.ctx(2)
F_EQ, F_SUB, F_GE, F_LE, F_APPROX, F_EXT = ber.ctx(3), ber.ctx(4), ber.ctx(5), ber.ctx(6), ber.ctx(8), ber.ctx(9)
F_PRESENT = ber.ctx(7, False)
P0, P1, P2, P3, P4, P7, P10, P11 = (ber.ctx(k, False) for k in (0, 1, 2, 3, 4, 7, 10, 11))
C0, C3 = ber.ctx(0), ber.ctx(3)
APP0 = ber.app(0)
OID_TAG = ber.OID
_OP_TEXT = (ber.ascii_array("="), ber.ascii_array(">="), ber.ascii_array("<="), ber.ascii_array("~="))
OP_EQ, OP_GE, OP_LE, OP_APPROX = _OP_TEXT
TXT_PRESENT = ber.ascii_array("=*)")
TXT_DN = ber.ascii_array(":dn")
TXT_EXT = ber.ascii_array(":=")
_MODS = tuple(ber.ascii_array(name) for name in ("add", "delete", "replace", "increment"))  # RFC 4511 §4.6
MOD_ADD, MOD_DELETE, MOD_REPLACE, MOD_INCREMENT = _MODS
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


# --- pass 1: where the LDAPMessages are ---------------------------------------------------------------

@helper
def _u16(buf, p):
    return (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])


@helper
def _gss_payload(buf, s, e):
    """The GSS-API token of a SASL buffer in ``[s, e)`` → (kind, data start, data end): the plaintext
    of an integrity-only Kerberos wrap token (K_SASL_LDAP), K_SEALED for a confidential one, K_SASL
    for anything else."""
    n = e - s
    # RFC 4121 §4.2.6.2: TOK_ID 05 04, Flags, Filler FF, EC, RRC, SND_SEQ (16 octets), then
    # {data | filler | checksum(EC octets)} rotated right by RRC octets (§4.2.5)
    if n >= 16 and buf[s] == 0x05 and buf[s + 1] == 0x04 and buf[s + 3] == 0xFF:
        if buf[s + 2] & 0x02:
            return K_SEALED, s, e
        ec = _u16(buf, s + 4)
        rrc = _u16(buf, s + 6)
        body = n - 16
        if body <= ec:
            return K_SASL, s, e
        rrc = rrc % body
        if rrc > ec:
            return K_SASL, s, e  # data wraps around the end of the buffer; not opened
        ds = s + 16 + rrc
        return K_SASL_LDAP, ds, ds + body - ec
    # RFC 1964 §1.2.2: [APPLICATION 0] { krb5 OID, TOK_ID 02 01, SGN_ALG, SEAL_ALG, FF FF, SND_SEQ[8],
    # SGN_CKSUM[8 or 20], confounder[8], data, padding }
    if n >= 2 and buf[s] == 0x60:
        t, cs, ce, st = read_tlv(buf, s, e, e)
        if st != OK or t != APP0:
            return K_SASL, s, e
        t, os_, oe, st = read_tlv(buf, cs, ce, e)
        if st != OK or t != OID_TAG or oe - os_ != KRB5_OID.shape[0]:
            return K_SASL, s, e
        for k in range(KRB5_OID.shape[0]):
            if buf[os_ + k] != KRB5_OID[k]:
                return K_SASL, s, e
        p = oe
        if ce - p < 8 or buf[p] != 0x02 or buf[p + 1] != 0x01:
            return K_SASL, s, e
        if not (buf[p + 4] == 0xFF and buf[p + 5] == 0xFF):
            return K_SEALED, s, e
        sgn_alg = _u16(buf, p + 2)
        cksum = 20 if sgn_alg == 0x0400 else 8
        ds = p + 8 + 8 + cksum + 8
        if ds >= ce:
            return K_SASL, s, e
        return K_SASL_LDAP, ds, ce
    return K_SASL, s, e


@helper
def _split(buf, s, mend, fill, base, u_start, u_end, u_kind):
    """Units of the framed message ``[s, mend)``; written at ``base`` when ``fill``. Returns the count."""
    if mend <= s:
        if fill:
            u_start[base] = s
            u_end[base] = mend
            u_kind[base] = K_LDAP
        return 1
    b0 = buf[s]
    count = 0
    if b0 == 0x30:
        p = s
        while p < mend:
            t, cs, ce, st = read_tlv(buf, p, mend, mend)
            if count > 0 and (st != OK or t != SEQ):
                # bytes after the last LDAPMessage: give them their own (failing) row
                if fill:
                    u_start[base + count] = p
                    u_end[base + count] = mend
                    u_kind[base + count] = K_LDAP
                return count + 1
            if fill:
                u_start[base + count] = p
                u_end[base + count] = ce if st == OK else mend
                u_kind[base + count] = K_LDAP
            count += 1
            if st != OK:
                return count
            p = ce
        return count
    if 0x14 <= b0 <= 0x17 and mend - s >= 2 and buf[s + 1] == 0x03:  # TLS record (RFC 8446 §5.1)
        if fill:
            u_start[base] = s
            u_end[base] = mend
            u_kind[base] = K_TLS
        return 1
    if mend - s >= 4:  # SASL buffer: 4-octet length (RFC 4422 §3.7)
        length = (np.int64(buf[s]) << 24) | (np.int64(buf[s + 1]) << 16) | (np.int64(buf[s + 2]) << 8) \
            | np.int64(buf[s + 3])
        e = min(mend, s + 4 + length)
        kind, ds, de = _gss_payload(buf, s + 4, e)
        if kind == K_SASL_LDAP:
            p = ds
            while p < de and count < _MAX_SASL_UNITS:
                t, cs, ce, st = read_tlv(buf, p, de, de)
                if st != OK or t != SEQ:
                    if count == 0:
                        kind = K_SASL  # not LDAP inside after all
                        break
                    if de - p <= 8:
                        return count  # RFC 1964 / RFC 4121 padding
                    if fill:
                        u_start[base + count] = p
                        u_end[base + count] = de
                        u_kind[base + count] = K_SASL_LDAP
                    return count + 1
                if fill:
                    u_start[base + count] = p
                    u_end[base + count] = ce
                    u_kind[base + count] = K_SASL_LDAP
                count += 1
                p = ce
            if count > 0:
                return count
        if fill:
            u_start[base] = s
            u_end[base] = mend
            u_kind[base] = kind
        return 1
    if fill:
        u_start[base] = s
        u_end[base] = mend
        u_kind[base] = K_LDAP
    return 1


@njit(cache=True)
def _count_units(buf, offsets, lengths, counts):
    dummy = np.empty(0, np.int64)
    for i in range(offsets.shape[0]):
        counts[i] = _split(buf, offsets[i], offsets[i] + lengths[i], NO, ZERO, dummy, dummy, dummy)


@njit(cache=True)
def _fill_units(buf, offsets, lengths, first, u_start, u_end, u_kind, u_msg):
    for i in range(offsets.shape[0]):
        n = _split(buf, offsets[i], offsets[i] + lengths[i], YES, first[i], u_start, u_end, u_kind)
        for k in range(n):
            u_msg[first[i] + k] = i


# --- pass 2: one LDAPMessage ---------------------------------------------------------------------------

@helper
def _fail(f, status):
    if f[I_STATUS] == OK:
        f[I_STATUS] = status
    return status


@helper
def _expect(buf, p, e, mend, want):
    """The TLV at ``p`` must have tag ``want``. Returns (content start, content end, next, status):
    MISSING when the enclosing TLV ends before it (and is not itself cut short)."""
    if p >= e and e < mend:
        return p, p, p, MISSING
    t, cs, ce, st = read_tlv_partial(buf, p, e, mend)
    if st != OK:
        return cs, ce, ce, st
    if t != want:
        return cs, ce, ce, UNEXPECTED
    return cs, ce, ce, OK


@helper
def _int_field(buf, p, e, mend, want):
    cs, ce, nxt, st = _expect(buf, p, e, mend, want)
    if st != OK:
        return np.int64(0), nxt, st
    v, st = read_int(buf, cs, ce)
    return v, nxt, st


@helper
def _string_list(buf, s, e, mend, arena, apos, sp, k, sep):
    """SEQUENCE OF OCTET STRING content → text joined by ``sep``; returns (apos, count, status)."""
    start = apos
    n = 0
    p = s
    while p < e:
        t, cs, ce, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, n, st
        if t != OCTETS:
            return apos, n, UNEXPECTED
        p = ce
        if n > 0:
            apos = put_byte(arena, apos, sep)
        apos = put_utf8(arena, apos, buf, cs, ce - cs, TEXT)
        if apos < 0:
            return -1, n, ARENA_FULL
        n += 1
    sp[2 * k] = start
    sp[2 * k + 1] = apos - start
    return apos, n, OK


@helper
def _put_value(arena, apos, buf, s, e):
    return put_utf8(arena, apos, buf, s, e - s, FILTER_VALUE)


@helper
def _ava(buf, s, e, mend, arena, apos, op):
    """AttributeValueAssertion content → ``(attr<op>value)``."""
    a_s, a_e, p, st = _expect(buf, s, e, mend, OCTETS)
    if st != OK:
        return apos, st
    v_s, v_e, p, st = _expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, st
    apos = put_byte(arena, apos, LPAREN)
    apos = _put_value(arena, apos, buf, a_s, a_e)
    apos = ber.put_ascii(arena, apos, op)
    apos = _put_value(arena, apos, buf, v_s, v_e)
    apos = put_byte(arena, apos, RPAREN)
    if apos < 0:
        return apos, ARENA_FULL
    return apos, OK if p == e else TRAILING


@helper
def _substrings(buf, s, e, mend, arena, apos):
    """SubstringFilter content (§4.5.1.7.2) → ``(attr=initial*any*final)``."""
    a_s, a_e, p, st = _expect(buf, s, e, mend, OCTETS)
    if st != OK:
        return apos, st
    l_s, l_e, p, st = _expect(buf, p, e, mend, SEQ)
    if st != OK:
        return apos, st
    apos = put_byte(arena, apos, LPAREN)
    apos = _put_value(arena, apos, buf, a_s, a_e)
    apos = put_byte(arena, apos, EQUALS)
    q = l_s
    last_final = False
    n = 0
    while q < l_e:
        t, cs, ce, st = read_tlv_partial(buf, q, l_e, mend)
        if st != OK:
            return apos, st
        q = ce
        if last_final:
            return apos, UNEXPECTED  # final must come last
        if t == P0:
            if n > 0:
                return apos, UNEXPECTED  # initial must come first
        elif t == P1 or t == P2:
            apos = put_byte(arena, apos, STAR)
            last_final = t == P2
        else:
            return apos, UNEXPECTED
        apos = _put_value(arena, apos, buf, cs, ce)
        n += 1
    if n == 0:
        return apos, MISSING  # SIZE (1..MAX)
    if not last_final:
        apos = put_byte(arena, apos, STAR)
    apos = put_byte(arena, apos, RPAREN)
    if apos < 0:
        return apos, ARENA_FULL
    return apos, OK


@helper
def _extensible(buf, s, e, mend, arena, apos):
    """MatchingRuleAssertion content (§4.5.1.7.7) → ``(type:dn:rule:=value)``."""
    r_s = r_e = t_s = t_e = v_s = v_e = np.int64(-1)
    dn = False
    p = s
    while p < e:
        t, cs, ce, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = ce
        if t == P1:
            r_s, r_e = cs, ce
        elif t == P2:
            t_s, t_e = cs, ce
        elif t == P3:
            v_s, v_e = cs, ce
        elif t == P4:
            v, st = read_bool(buf, cs, ce)
            if st != OK:
                return apos, st
            dn = v != 0
        else:
            return apos, UNEXPECTED
    if v_s < 0:
        return apos, MISSING
    apos = put_byte(arena, apos, LPAREN)
    if t_s >= 0:
        apos = _put_value(arena, apos, buf, t_s, t_e)
    if dn:
        apos = ber.put_ascii(arena, apos, TXT_DN)
    if r_s >= 0:
        apos = put_byte(arena, apos, COLON)
        apos = _put_value(arena, apos, buf, r_s, r_e)
    apos = ber.put_ascii(arena, apos, TXT_EXT)
    apos = _put_value(arena, apos, buf, v_s, v_e)
    apos = put_byte(arena, apos, RPAREN)
    if apos < 0:
        return apos, ARENA_FULL
    return apos, OK


@helper
def _filter(buf, s, e, mend, arena, apos, stk_p, stk_e, stk_t, stk_n):
    """Render the Filter TLV ``[s, e)`` (§4.5.1.7) as RFC 4515 text, iteratively (explicit stack of
    MAX_FILTER_DEPTH). Returns (apos, status)."""
    depth = 0
    p = s
    end = e
    while True:
        if p >= end:
            if depth == 0:
                return apos, OK
            depth -= 1
            if stk_t[depth] == F_NOT and stk_n[depth] != 1:
                return apos, BAD_VALUE  # not: exactly one Filter
            apos = put_byte(arena, apos, RPAREN)
            if apos < 0:
                return apos, ARENA_FULL
            p = stk_p[depth]
            end = stk_e[depth]
            continue
        t, cs, ce, st = read_tlv_partial(buf, p, end, mend)
        if st != OK:
            return apos, st
        if depth > 0:
            stk_n[depth - 1] += 1
        p = ce
        if t == F_AND or t == F_OR or t == F_NOT:
            if depth >= MAX_FILTER_DEPTH:
                return apos, TOO_DEEP
            apos = put_byte(arena, apos, LPAREN)
            apos = put_byte(arena, apos, AMP if t == F_AND else (PIPE if t == F_OR else BANG))
            if apos < 0:
                return apos, ARENA_FULL
            stk_p[depth] = p
            stk_e[depth] = end
            stk_t[depth] = t
            stk_n[depth] = 0
            depth += 1
            p = cs
            end = ce
            continue
        if t == F_EQ:
            apos, st = _ava(buf, cs, ce, mend, arena, apos, OP_EQ)
        elif t == F_GE:
            apos, st = _ava(buf, cs, ce, mend, arena, apos, OP_GE)
        elif t == F_LE:
            apos, st = _ava(buf, cs, ce, mend, arena, apos, OP_LE)
        elif t == F_APPROX:
            apos, st = _ava(buf, cs, ce, mend, arena, apos, OP_APPROX)
        elif t == F_SUB:
            apos, st = _substrings(buf, cs, ce, mend, arena, apos)
        elif t == F_PRESENT:
            apos = put_byte(arena, apos, LPAREN)
            apos = _put_value(arena, apos, buf, cs, ce)
            apos = ber.put_ascii(arena, apos, TXT_PRESENT)
            st = OK if apos >= 0 else ARENA_FULL
        elif t == F_EXT:
            apos, st = _extensible(buf, cs, ce, mend, arena, apos)
        else:
            st = UNEXPECTED
        if apos < 0:
            return apos, ARENA_FULL
        if st != OK:
            return apos, st
        if depth == 0:
            return apos, OK


@helper
def _result(buf, p, e, mend, f, arena, apos, sp):
    """LDAPResult components (§4.1.9) from ``p``; returns (apos, next, status)."""
    v, p, st = _int_field(buf, p, e, mend, ENUM)
    if st != OK:
        return apos, p, st
    f[I_RESULT] = v
    cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_MATCHED)
    cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DIAG)
    if apos < 0:
        return apos, p, ARENA_FULL
    if p < e:
        t, cs, ce, st = read_tlv_partial(buf, p, e, mend)
        if st == OK and t == C3:
            apos, n, st = _string_list(buf, cs, ce, mend, arena, apos, sp, S_REFERRALS, SPACE)
            if st != OK:
                return apos, ce, st
            p = ce
    return apos, p, OK


@helper
def _is_cancel(buf, s, e):
    if e - s != CANCEL_OID_BYTES.shape[0]:
        return False
    for k in range(e - s):
        if buf[s + k] != CANCEL_OID_BYTES[k]:
            return False
    return True


@helper
def _op(buf, t, s, e, mend, f, arena, apos, sp, stk_p, stk_e, stk_t, stk_n):
    """protocolOp with tag ``t`` and content ``[s, e)``. Returns (apos, status)."""
    num = t & 0x0FFFFFFF
    constructed = (t >> 24) == APP_CONSTRUCTED
    primitive = (t >> 24) == APP_PRIMITIVE
    if not (constructed or primitive) or num > 25 or (17 <= num <= 18) or (20 <= num <= 22):
        return apos, UNEXPECTED
    f[I_OP] = num
    # primitive ones: unbind (NULL), delRequest (LDAPDN), abandon (MessageID)
    if num == 2 or num == 10 or num == 16:
        if not primitive:
            return apos, UNEXPECTED
        if num == 10:
            apos = put_slot(buf, s, e, arena, apos, sp, S_DN)
            return apos, OK if apos >= 0 else ARENA_FULL
        if num == 16:
            v, st = read_int(buf, s, e)
            if st == OK:
                f[I_ABANDON_ID] = v
            return apos, st
        return apos, OK if e == s else BAD_VALUE
    if not constructed:
        return apos, UNEXPECTED
    p = s
    if num == 0:  # BindRequest §4.2
        v, p, st = _int_field(buf, p, e, mend, INT)
        if st != OK:
            return apos, st
        f[I_VERSION] = v
        cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
        if apos < 0:
            return apos, ARENA_FULL
        t2, cs, ce, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = ce
        choice = t2 & 0x0FFFFFFF
        if (t2 >> 24) & CTX_PRIMITIVE == 0:
            return apos, UNEXPECTED
        f[I_AUTH] = choice
        if t2 == C3:  # SaslCredentials
            ms, me, q, st = _expect(buf, cs, ce, mend, OCTETS)
            if st != OK:
                return apos, st
            apos = put_slot(buf, ms, me, arena, apos, sp, S_MECH)
            if apos < 0:
                return apos, ARENA_FULL
            f[I_CRED_LEN] = 0
            if q < ce:
                ks, ke, q, st = _expect(buf, q, ce, mend, OCTETS)
                if st != OK:
                    return apos, st
                f[I_CRED_LEN] = ke - ks
        else:
            f[I_CRED_LEN] = ce - cs
    elif num == 3:  # SearchRequest §4.5.1
        cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
        if apos < 0:
            return apos, ARENA_FULL
        v, p, st = _int_field(buf, p, e, mend, ENUM)
        if st != OK:
            return apos, st
        f[I_SCOPE] = v
        v, p, st = _int_field(buf, p, e, mend, ENUM)
        if st != OK:
            return apos, st
        f[I_DEREF] = v
        v, p, st = _int_field(buf, p, e, mend, INT)
        if st != OK:
            return apos, st
        f[I_SIZE_LIMIT] = v
        v, p, st = _int_field(buf, p, e, mend, INT)
        if st != OK:
            return apos, st
        f[I_TIME_LIMIT] = v
        cs, ce, p, st = _expect(buf, p, e, mend, BOOL)
        if st != OK:
            return apos, st
        v, st = read_bool(buf, cs, ce)
        if st != OK:
            return apos, st
        f[I_TYPES_ONLY] = v
        t2, cs, ce, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        fstart = apos
        apos, st = _filter(buf, p, ce, mend, arena, apos, stk_p, stk_e, stk_t, stk_n)
        if apos < 0:
            return apos, ARENA_FULL
        if st != OK:
            return fstart, st
        sp[2 * S_FILTER] = fstart
        sp[2 * S_FILTER + 1] = apos - fstart
        p = ce
        cs, ce, p, st = _expect(buf, p, e, mend, SEQ)
        if st != OK:
            return apos, st
        apos, n, st = _string_list(buf, cs, ce, mend, arena, apos, sp, S_ATTRS, COMMA)
        if st != OK:
            return apos, st
        f[I_ATTR_COUNT] = n
    elif num == 4:  # SearchResultEntry §4.5.2
        cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
        if apos < 0:
            return apos, ARENA_FULL
        cs, ce, p, st = _expect(buf, p, e, mend, SEQ)
        if st != OK:
            return apos, st
        n = 0
        q = cs
        while q < ce:
            t2, a, b, st = read_tlv_partial(buf, q, ce, mend)
            if st != OK:
                return apos, st
            if t2 != SEQ:
                return apos, UNEXPECTED
            q = b
            n += 1
        f[I_ATTR_COUNT] = n
    elif num == 19:  # SearchResultReference §4.5.3
        apos, n, st = _string_list(buf, s, e, mend, arena, apos, sp, S_REFERRALS, SPACE)
        if st != OK:
            return apos, st
        p = e
    elif num == 6:  # ModifyRequest §4.6
        cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
        if apos < 0:
            return apos, ARENA_FULL
        ls, le, p, st = _expect(buf, p, e, mend, SEQ)
        if st != OK:
            return apos, st
        start = apos
        n = 0
        q = ls
        while q < le:
            ms, me, q, st = _expect(buf, q, le, mend, SEQ)
            if st != OK:
                return apos, st
            v, r, st = _int_field(buf, ms, me, mend, ENUM)
            if st != OK:
                return apos, st
            as_, ae, r, st = _expect(buf, r, me, mend, SEQ)  # PartialAttribute
            if st != OK:
                return apos, st
            ts_, te, r2, st = _expect(buf, as_, ae, mend, OCTETS)
            if st != OK:
                return apos, st
            if n > 0:
                apos = put_byte(arena, apos, COMMA)
            if 0 <= v <= 3:
                apos = ber.put_ascii(arena, apos, _MODS[0] if v == 0 else (_MODS[1] if v == 1 else (
                    _MODS[2] if v == 2 else _MODS[3])))
            else:
                apos = put_int(arena, apos, v)
            apos = put_byte(arena, apos, LPAREN)
            apos = put_utf8(arena, apos, buf, ts_, te - ts_, TEXT)
            apos = put_byte(arena, apos, RPAREN)
            if apos < 0:
                return apos, ARENA_FULL
            n += 1
        sp[2 * S_CHANGES] = start
        sp[2 * S_CHANGES + 1] = apos - start
        f[I_ATTR_COUNT] = n
    elif num == 8:  # AddRequest §4.7
        cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
        if apos < 0:
            return apos, ARENA_FULL
        ls, le, p, st = _expect(buf, p, e, mend, SEQ)
        if st != OK:
            return apos, st
        start = apos
        n = 0
        q = ls
        while q < le:
            as_, ae, q, st = _expect(buf, q, le, mend, SEQ)
            if st != OK:
                return apos, st
            ts_, te, r, st = _expect(buf, as_, ae, mend, OCTETS)
            if st != OK:
                return apos, st
            if n > 0:
                apos = put_byte(arena, apos, COMMA)
            apos = put_utf8(arena, apos, buf, ts_, te - ts_, TEXT)
            if apos < 0:
                return apos, ARENA_FULL
            n += 1
        sp[2 * S_ATTRS] = start
        sp[2 * S_ATTRS + 1] = apos - start
        f[I_ATTR_COUNT] = n
    elif num == 12:  # ModifyDNRequest §4.9
        cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
        cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_NEW_RDN)
        if apos < 0:
            return apos, ARENA_FULL
        cs, ce, p, st = _expect(buf, p, e, mend, BOOL)
        if st != OK:
            return apos, st
        v, st = read_bool(buf, cs, ce)
        if st != OK:
            return apos, st
        f[I_DELETE_OLD_RDN] = v
        if p < e:
            cs, ce, p, st = _expect(buf, p, e, mend, P0)
            if st != OK:
                return apos, st
            apos = put_slot(buf, cs, ce, arena, apos, sp, S_NEW_SUPERIOR)
            if apos < 0:
                return apos, ARENA_FULL
    elif num == 14:  # CompareRequest §4.10
        cs, ce, p, st = _expect(buf, p, e, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
        as_, ae, p, st = _expect(buf, p, e, mend, SEQ)
        if st != OK:
            return apos, st
        ts_, te, r, st = _expect(buf, as_, ae, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, ts_, te, arena, apos, sp, S_ATTRS)
        if apos < 0:
            return apos, ARENA_FULL
        f[I_ATTR_COUNT] = 1
    elif num == 23:  # ExtendedRequest §4.12
        cs, ce, p, st = _expect(buf, p, e, mend, P0)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_OID)
        if apos < 0:
            return apos, ARENA_FULL
        if p < e and _is_cancel(buf, cs, ce):  # RFC 3909: requestValue ::= SEQUENCE { cancelID MessageID }
            vs, ve, p, st = _expect(buf, p, e, mend, P1)
            if st != OK:
                return apos, st
            ss, se, q, st = _expect(buf, vs, ve, mend, SEQ)
            if st != OK:
                return apos, st
            v, q, st = _int_field(buf, ss, se, mend, INT)
            if st != OK:
                return apos, st
            f[I_ABANDON_ID] = v
        p = e  # other requestValues are opaque
    elif num == 25:  # IntermediateResponse §4.13
        if p < e:
            t2, cs, ce, st = read_tlv_partial(buf, p, e, mend)
            if st != OK:
                return apos, st
            if t2 == P0:
                apos = put_slot(buf, cs, ce, arena, apos, sp, S_OID)
                if apos < 0:
                    return apos, ARENA_FULL
        p = e
    else:  # responses with COMPONENTS OF LDAPResult: 1, 5, 7, 9, 11, 13, 15, 24
        apos, p, st = _result(buf, p, e, mend, f, arena, apos, sp)
        if st != OK:
            return apos, st
        while p < e:  # bindResponse serverSaslCreds [7]; extendedResp responseName [10], value [11]
            t2, cs, ce, st = read_tlv_partial(buf, p, e, mend)
            if st != OK:
                return apos, st
            p = ce
            if num == 24 and t2 == P10:
                apos = put_slot(buf, cs, ce, arena, apos, sp, S_OID)
                if apos < 0:
                    return apos, ARENA_FULL
            elif not ((num == 1 and t2 == P7) or (num == 24 and t2 == P11)):
                return apos, UNEXPECTED
    if p != e:
        return apos, TRAILING
    return apos, OK


@helper
def _decode_one(buf, s, mend, f, sp, arena, apos, stk_p, stk_e, stk_t, stk_n):
    """One LDAPMessage TLV at ``s`` (§4.1.1). Returns the new arena position (-1: full)."""
    t, cs, ce, st = read_tlv(buf, s, mend, mend)
    if st == TRUNCATED and cs > s and t == SEQ:
        _fail(f, TRUNCATED)  # decode what was captured
    elif st != OK:
        _fail(f, st)
        return apos
    if t != SEQ:
        _fail(f, NOT_PROTOCOL)
        return apos
    v, p, st = _int_field(buf, cs, ce, mend, INT)
    if st != OK:
        _fail(f, st if st != UNEXPECTED else NOT_PROTOCOL)
        return apos
    f[I_MSGID] = v
    t2, os_, oe, st = read_tlv_partial(buf, p, ce, mend)
    if st != OK:
        _fail(f, st)
        return apos
    apos, st = _op(buf, t2, os_, oe, mend, f, arena, apos, sp, stk_p, stk_e, stk_t, stk_n)
    if apos < 0:
        return -1
    if st != OK:
        _fail(f, st)
        return apos
    p = oe
    if p < ce:  # controls [0] (§4.1.11)
        t3, ls, le, st = read_tlv_partial(buf, p, ce, mend)
        if st != OK:
            _fail(f, st)
            return apos
        if t3 != C0:
            _fail(f, UNEXPECTED)
            return apos
        start = apos
        n = 0
        q = ls
        while q < le:
            xs, xe, q, st = _expect(buf, q, le, mend, SEQ)
            if st != OK:
                _fail(f, st)
                break
            ts_, te, r, st = _expect(buf, xs, xe, mend, OCTETS)
            if st != OK:
                _fail(f, st)
                break
            if n > 0:
                apos = put_byte(arena, apos, COMMA)
            apos = put_utf8(arena, apos, buf, ts_, te - ts_, TEXT)
            if apos < 0:
                return -1
            n += 1
        sp[2 * S_CONTROLS] = start
        sp[2 * S_CONTROLS + 1] = apos - start
        p = le
    if p < ce:
        _fail(f, TRAILING)
    elif ce < mend:
        _fail(f, TRAILING)
    return apos


@njit(cache=True)
def _decode_all(buf, u_start, u_end, u_kind, u_first, ints, spans, arena):
    f = np.empty(N_INTS, np.int64)
    sp = np.empty(2 * N_STRS, np.int64)
    stk_p = np.empty(MAX_FILTER_DEPTH, np.int64)
    stk_e = np.empty(MAX_FILTER_DEPTH, np.int64)
    stk_t = np.empty(MAX_FILTER_DEPTH, np.int64)
    stk_n = np.empty(MAX_FILTER_DEPTH, np.int64)
    apos = np.int64(0)
    for i in range(u_start.shape[0]):
        f[:] = NULL
        f[I_STATUS] = OK
        sp[:] = -1
        kind = u_kind[i]
        f[I_UNIT] = u_first[i]
        f[I_SASL] = 1 if kind == K_SASL_LDAP else 0
        f[I_OPAQUE] = 0
        if kind == K_TLS:
            f[I_OPAQUE] = 1
        elif kind == K_SASL:
            f[I_OPAQUE] = 2
        elif kind == K_SEALED:
            f[I_OPAQUE] = 3
        else:
            apos = _decode_one(buf, u_start[i], u_end[i], f, sp, arena, apos, stk_p, stk_e, stk_t, stk_n)
            if apos < 0:
                return -1
        ints[:, i] = f  # column-major: each field's column is contiguous for Polars
        spans[:, i] = sp
    return apos
