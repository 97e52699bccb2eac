"""Numba kernels of the Kerberos decoder (see ``analyzer.decoders.kerberos`` for the schema, the
tables and the pairing): one pass over the messages of a set, a per-message field vector and string
spans into one arena, as ``analyzer/kernels/headers.py`` does. RFC 4120 §5 structures, read with the
shared BER reader (``analyzer.decoders.ber``)."""
from __future__ import annotations

import numpy as np
from numba import njit

from . import ber
from .ber import (NULL, OK, TRUNCATED, UNEXPECTED, MISSING, TRAILING, NOT_PROTOCOL, BAD_VALUE, ARENA_FULL, TEXT,
                  helper, read_tlv, read_tlv_partial, read_int, read_bits32, read_time, put_byte, put_int, put_slot, put_utf8)

PA_TGS_REQ = 1
PA_ENC_TIMESTAMP = 2
_PA_PK_AS_REQ_OLD, _PA_PK_AS_REQ, _PA_FX_FAST, _PA_ENC_CHALLENGE = 14, 16, 136, 138


# --- kernel field layout ---------------------------------------------------------------------------
(I_APP, I_MSG_TYPE, I_PVNO, I_NONCE, I_PREAUTH, I_PREAUTH_ETYPE, I_KDC_OPTIONS, I_TILL, I_TICKET_ETYPE,
 I_TICKET_KVNO, I_ENC_ETYPE, I_ENC_KVNO, I_ERROR_CODE, I_STIME, I_CTIME, I_STATUS) = (np.int64(k) for k in range(16))
N_INTS = 16
(S_REALM, S_CREALM, S_CNAME, S_SNAME, S_ETYPES, S_PADATA, S_TGS_REALM, S_TGS_SNAME, S_ETEXT) = (
    np.int64(k) for k in range(9))
N_STRS = 9
_STR_NAMES = ("realm", "crealm", "cname", "sname", "etypes", "padata_types", "tgs_ticket_realm",
              "tgs_ticket_sname", "e_text")

_CTX = [ber.ctx(k) for k in range(13)]
C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12 = _CTX
SEQ = ber.SEQUENCE
INT = ber.INTEGER
OCTETS = ber.OCTET_STRING
BITS = ber.BIT_STRING
GTIME = ber.GENERALIZED_TIME
APP_TICKET = ber.app(1)
APP_AP_REQ = ber.app(14)
APPLICATION_CONSTRUCTED = ber.APPLICATION | ber.CONSTRUCTED
# np.int64 rather than int literals as call arguments: see ber (one compiled specialisation each)
ANY_STRING = np.int64(-1)
COMMA = np.int64(44)
SLASH = np.int64(47)
YES = np.bool_(True)
NO = np.bool_(False)


@helper
def _fail(f, status):
    """Record the first problem of the message; returns the status for chaining."""
    if f[I_STATUS] == OK:
        f[I_STATUS] = status
    return status


@helper
def _explicit(buf, a, b, mend, want):
    """Content of an EXPLICIT [n] field: the single TLV inside ``[a, b)`` must have tag ``want``
    (``-1``: any universal primitive, used for the string types). Returns (start, end, status)."""
    t, s, e, st = read_tlv_partial(buf, a, b, mend)
    if st != OK:
        return s, e, st
    if want >= 0:
        if t != want:
            return s, e, UNEXPECTED
    elif (t >> 24) != 0:  # strings: GeneralString in the spec; accept any universal primitive
        return s, e, UNEXPECTED
    return s, e, OK


@helper
def _explicit_int(buf, a, b, mend):
    s, e, st = _explicit(buf, a, b, mend, INT)
    if st != OK:
        return np.int64(0), st
    return read_int(buf, s, e)


@helper
def _principal(buf, a, b, mend, arena, apos, sp, k):
    """EXPLICIT PrincipalName (§5.2.2) in ``[a, b)`` → name-string components joined with '/'.
    Returns (apos, status)."""
    t, s, e, st = read_tlv_partial(buf, a, b, mend)
    if st != OK:
        return apos, st
    if t != SEQ:
        return apos, UNEXPECTED
    p = s
    found = False
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = fe
        if t == C1:
            t2, ls, le, st = read_tlv_partial(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            if t2 != SEQ:
                return apos, UNEXPECTED
            start = apos
            q = ls
            first = True
            while q < le:
                t3, cs, ce, st = read_tlv_partial(buf, q, le, mend)
                if st != OK:
                    return apos, st
                if (t3 >> 24) != 0:
                    return apos, UNEXPECTED
                q = ce
                if not first:
                    apos = put_byte(arena, apos, SLASH)
                    if apos < 0:
                        return apos, ARENA_FULL
                apos = put_utf8(arena, apos, buf, cs, ce - cs, TEXT)
                if apos < 0:
                    return apos, ARENA_FULL
                first = False
            sp[2 * k] = start
            sp[2 * k + 1] = apos - start
            found = True
    if not found:
        return apos, MISSING
    return apos, OK


@helper
def _encrypted_data(buf, s, e, mend):
    """EncryptedData SEQUENCE content ``[s, e)`` (§5.2.9) → (etype, kvno or NULL, status)."""
    etype = NULL
    kvno = NULL
    p = s
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return etype, kvno, st
        p = fe
        if t == C0:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return etype, kvno, st
            etype = v
        elif t == C1:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return etype, kvno, st
            kvno = v
    if etype == NULL:
        return etype, kvno, MISSING
    return etype, kvno, OK


@helper
def _explicit_encrypted(buf, a, b, mend):
    s, e, st = _explicit(buf, a, b, mend, SEQ)
    if st != OK:
        return NULL, NULL, st
    return _encrypted_data(buf, s, e, mend)


@helper
def _ticket(buf, a, b, mend, f, arena, apos, sp, k_realm, k_sname):
    """Ticket ([APPLICATION 1] SEQUENCE, §5.3) in ``[a, b)`` (the TLV itself, not EXPLICIT-wrapped):
    realm and sname into string slots, enc-part etype/kvno into f. Returns (apos, status)."""
    t, s, e, st = read_tlv_partial(buf, a, b, mend)
    if st != OK:
        return apos, st
    if t != APP_TICKET:
        return apos, UNEXPECTED
    t, s, e, st = read_tlv_partial(buf, s, e, mend)
    if st != OK:
        return apos, st
    if t != SEQ:
        return apos, UNEXPECTED
    p = s
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = fe
        if t == C1:
            cs, ce, st = _explicit(buf, fs, fe, mend, ANY_STRING)
            if st != OK:
                return apos, st
            apos = put_slot(buf, cs, ce, arena, apos, sp, k_realm)
            if apos < 0:
                return apos, ARENA_FULL
        elif t == C2:
            apos, st = _principal(buf, fs, fe, mend, arena, apos, sp, k_sname)
            if st != OK:
                return apos, st
        elif t == C3:
            etype, kvno, st = _explicit_encrypted(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_TICKET_ETYPE] = etype
            f[I_TICKET_KVNO] = kvno
    return apos, OK


@helper
def _ap_req(buf, a, b, mend, f, arena, apos, sp, k_realm, k_sname, top):
    """AP-REQ ([APPLICATION 14], §5.5.1) TLV in ``[a, b)``. ``top``: the message itself (pvno and
    msg-type go to f) rather than the PA-TGS-REQ value. Returns (apos, status)."""
    t, s, e, st = read_tlv_partial(buf, a, b, mend)
    if st != OK:
        return apos, st
    if t != APP_AP_REQ:
        return apos, UNEXPECTED
    t, s, e, st = read_tlv_partial(buf, s, e, mend)
    if st != OK:
        return apos, st
    if t != SEQ:
        return apos, UNEXPECTED
    p = s
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = fe
        if t == C0 and top:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_PVNO] = v
        elif t == C1 and top:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_MSG_TYPE] = v
        elif t == C3:
            apos, st = _ticket(buf, fs, fe, mend, f, arena, apos, sp, k_realm, k_sname)
            if st != OK:
                return apos, st
        elif t == C4 and top:
            etype, kvno, st = _explicit_encrypted(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_ENC_ETYPE] = etype
            f[I_ENC_KVNO] = kvno
    return apos, OK


@helper
def _padata(buf, s, e, mend, f, arena, apos, sp, tgs, strict):
    """SEQUENCE OF PA-DATA (§5.2.7) content ``[s, e)``: the types as text; PA-ENC-TIMESTAMP's
    etype; for a TGS-REQ (``tgs``) the PA-TGS-REQ AP-REQ's ticket. ``strict`` False: a structure
    that is not METHOD-DATA is no error (KRB-ERROR e-data is often something else) and nothing is
    written. Returns (apos, status)."""
    start = apos
    p = s
    first = True
    ts_s = np.int64(-1)
    ts_e = np.int64(-1)
    tgs_s = np.int64(-1)
    tgs_e = np.int64(-1)
    while p < e:
        t, ps, pe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK or t != SEQ:
            return start, st if st != OK else UNEXPECTED
        p = pe
        ptype = NULL
        vs = np.int64(-1)
        ve = np.int64(-1)
        q = ps
        while q < pe:
            t, fs, fe, st = read_tlv_partial(buf, q, pe, mend)
            if st != OK:
                return start, st
            q = fe
            if t == C1:
                v, st = _explicit_int(buf, fs, fe, mend)
                if st != OK:
                    return start, st
                ptype = v
            elif t == C2:
                vs, ve, st = _explicit(buf, fs, fe, mend, OCTETS)
                if st != OK:
                    return start, st
            elif not strict:
                return start, UNEXPECTED  # TYPED-DATA ([0] data-type) and friends: not METHOD-DATA
        if ptype == NULL:
            return start, MISSING
        if not first:
            apos = put_byte(arena, apos, COMMA)
        apos = put_int(arena, apos, ptype)
        if apos < 0:
            return apos, ARENA_FULL
        first = False
        if ptype == PA_ENC_TIMESTAMP or ptype == _PA_PK_AS_REQ or ptype == _PA_PK_AS_REQ_OLD \
                or ptype == _PA_FX_FAST or ptype == _PA_ENC_CHALLENGE:
            if strict:
                f[I_PREAUTH] = 1
        if ptype == PA_ENC_TIMESTAMP and ts_s < 0:
            ts_s = vs
            ts_e = ve
        elif ptype == PA_TGS_REQ and tgs_s < 0:
            tgs_s = vs
            tgs_e = ve
    sp[2 * S_PADATA] = start
    sp[2 * S_PADATA + 1] = apos - start
    if not strict:
        return apos, OK
    # the values, after the text so that the type list stays one contiguous string
    if ts_s >= 0:
        t, es, ee, st = read_tlv_partial(buf, ts_s, ts_e, mend)
        if st == OK and t == SEQ:
            etype, kvno, st = _encrypted_data(buf, es, ee, mend)
            if st == OK:
                f[I_PREAUTH_ETYPE] = etype
        elif st == OK:
            st = UNEXPECTED
        if st != OK:
            _fail(f, st)
    if tgs and tgs_s >= 0:
        apos, st = _ap_req(buf, tgs_s, tgs_e, mend, f, arena, apos, sp, S_TGS_REALM, S_TGS_SNAME, NO)
        if apos < 0:
            return apos, ARENA_FULL
        if st != OK:
            _fail(f, st)
    return apos, OK


@helper
def _req_body(buf, s, e, mend, f, arena, apos, sp):
    """KDC-REQ-BODY SEQUENCE content (§5.4.1). Returns (apos, status)."""
    p = s
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = fe
        if t == C0:
            cs, ce, st = _explicit(buf, fs, fe, mend, BITS)
            if st != OK:
                return apos, st
            v, st = read_bits32(buf, cs, ce)
            if st != OK:
                return apos, st
            f[I_KDC_OPTIONS] = v
        elif t == C1:
            apos, st = _principal(buf, fs, fe, mend, arena, apos, sp, S_CNAME)
            if st != OK:
                return apos, st
        elif t == C2:
            cs, ce, st = _explicit(buf, fs, fe, mend, ANY_STRING)
            if st != OK:
                return apos, st
            apos = put_slot(buf, cs, ce, arena, apos, sp, S_REALM)
            if apos < 0:
                return apos, ARENA_FULL
        elif t == C3:
            apos, st = _principal(buf, fs, fe, mend, arena, apos, sp, S_SNAME)
            if st != OK:
                return apos, st
        elif t == C5:
            cs, ce, st = _explicit(buf, fs, fe, mend, GTIME)
            if st != OK:
                return apos, st
            v, st = read_time(buf, cs, ce)
            if st == OK:
                f[I_TILL] = v
        elif t == C7:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_NONCE] = v
        elif t == C8:
            ls, le, st = _explicit(buf, fs, fe, mend, SEQ)
            if st != OK:
                return apos, st
            start = apos
            q = ls
            first = True
            while q < le:
                t3, cs, ce, st = read_tlv_partial(buf, q, le, mend)
                if st != OK:
                    return apos, st
                if t3 != INT:
                    return apos, UNEXPECTED
                q = ce
                v, st = read_int(buf, cs, ce)
                if st != OK:
                    return apos, st
                if not first:
                    apos = put_byte(arena, apos, COMMA)
                apos = put_int(arena, apos, v)
                if apos < 0:
                    return apos, ARENA_FULL
                first = False
            sp[2 * S_ETYPES] = start
            sp[2 * S_ETYPES + 1] = apos - start
    return apos, OK


@helper
def _kdc_req(buf, s, e, mend, f, arena, apos, sp, tgs):
    """KDC-REQ SEQUENCE content (§5.4.1): pvno [1], msg-type [2], padata [3], req-body [4]."""
    p = s
    body = False
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = fe
        if t == C1:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_PVNO] = v
        elif t == C2:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_MSG_TYPE] = v
        elif t == C3:
            ls, le, st = _explicit(buf, fs, fe, mend, SEQ)
            if st != OK:
                return apos, st
            apos, st = _padata(buf, ls, le, mend, f, arena, apos, sp, tgs, YES)
            if apos < 0:
                return apos, ARENA_FULL
            if st != OK:
                return apos, st
        elif t == C4:
            bs, be, st = _explicit(buf, fs, fe, mend, SEQ)
            if st != OK:
                return apos, st
            apos, st = _req_body(buf, bs, be, mend, f, arena, apos, sp)
            if st != OK:
                return apos, st
            body = True
    if not body:
        return apos, MISSING
    return apos, OK


@helper
def _kdc_rep(buf, s, e, mend, f, arena, apos, sp):
    """KDC-REP SEQUENCE content (§5.4.2): pvno [0], msg-type [1], padata [2], crealm [3], cname [4],
    ticket [5], enc-part [6]."""
    p = s
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = fe
        if t == C0:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_PVNO] = v
        elif t == C1:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_MSG_TYPE] = v
        elif t == C2:
            ls, le, st = _explicit(buf, fs, fe, mend, SEQ)
            if st != OK:
                return apos, st
            apos, st = _padata(buf, ls, le, mend, f, arena, apos, sp, NO, YES)
            if apos < 0:
                return apos, ARENA_FULL
            if st != OK:
                return apos, st
        elif t == C3:
            cs, ce, st = _explicit(buf, fs, fe, mend, ANY_STRING)
            if st != OK:
                return apos, st
            apos = put_slot(buf, cs, ce, arena, apos, sp, S_CREALM)
            if apos < 0:
                return apos, ARENA_FULL
        elif t == C4:
            apos, st = _principal(buf, fs, fe, mend, arena, apos, sp, S_CNAME)
            if st != OK:
                return apos, st
        elif t == C5:
            apos, st = _ticket(buf, fs, fe, mend, f, arena, apos, sp, S_REALM, S_SNAME)
            if st != OK:
                return apos, st
        elif t == C6:
            etype, kvno, st = _explicit_encrypted(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_ENC_ETYPE] = etype
            f[I_ENC_KVNO] = kvno
    return apos, OK


@helper
def _time_field(buf, fs, fe, mend):
    cs, ce, st = _explicit(buf, fs, fe, mend, GTIME)
    if st != OK:
        return NULL, st
    v, st = read_time(buf, cs, ce)
    if st != OK:
        return NULL, OK  # an unreadable time is left null, not a decode error
    return v, OK


@helper
def _krb_error(buf, s, e, mend, f, arena, apos, sp):
    """KRB-ERROR SEQUENCE content (§5.9.1)."""
    p = s
    stime = NULL
    susec = np.int64(0)
    ctime = NULL
    cusec = np.int64(0)
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, st
        p = fe
        if t == C0 or t == C1 or t == C3 or t == C5 or t == C6:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            if t == C0:
                f[I_PVNO] = v
            elif t == C1:
                f[I_MSG_TYPE] = v
            elif t == C3:
                cusec = v
            elif t == C5:
                susec = v
            else:
                f[I_ERROR_CODE] = v
        elif t == C2:
            ctime, st = _time_field(buf, fs, fe, mend)
            if st != OK:
                return apos, st
        elif t == C4:
            stime, st = _time_field(buf, fs, fe, mend)
            if st != OK:
                return apos, st
        elif t == C7 or t == C9 or t == C11:
            cs, ce, st = _explicit(buf, fs, fe, mend, ANY_STRING)
            if st != OK:
                return apos, st
            k = S_CREALM if t == C7 else (S_REALM if t == C9 else S_ETEXT)
            apos = put_slot(buf, cs, ce, arena, apos, sp, k)
            if apos < 0:
                return apos, ARENA_FULL
        elif t == C8 or t == C10:
            apos, st = _principal(buf, fs, fe, mend, arena, apos, sp, S_CNAME if t == C8 else S_SNAME)
            if st != OK:
                return apos, st
        elif t == C12:
            cs, ce, st = _explicit(buf, fs, fe, mend, OCTETS)
            if st != OK:
                return apos, st
            t2, ls, le, st = read_tlv_partial(buf, cs, ce, ce)
            if st == OK and t2 == SEQ and le == ce:
                apos, st = _padata(buf, ls, le, ce, f, arena, apos, sp, NO, NO)
                if apos < 0:
                    return apos, ARENA_FULL
                if st != OK:
                    sp[2 * S_PADATA] = -1
                    sp[2 * S_PADATA + 1] = -1
    if stime != NULL and 0 <= susec < 1_000_000:
        f[I_STIME] = stime + susec * 1000
    if ctime != NULL and 0 <= cusec < 1_000_000:
        f[I_CTIME] = ctime + cusec * 1000
    if f[I_ERROR_CODE] == NULL:
        return apos, MISSING
    return apos, OK


@helper
def _generic(buf, s, e, mend, f):
    """AP-REP, KRB-SAFE, KRB-PRIV, KRB-CRED: pvno [0] and msg-type [1] only."""
    p = s
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return st
        p = fe
        if t == C0 or t == C1:
            v, st = _explicit_int(buf, fs, fe, mend)
            if st != OK:
                return st
            f[I_PVNO if t == C0 else I_MSG_TYPE] = v
    return OK


@helper
def _decode_one(buf, start, mend, f, sp, arena, apos):
    """One Kerberos message in ``buf[start:mend]``. Fills f/sp; returns the new arena position
    (-1: arena full)."""
    t, s, e, st = read_tlv(buf, start, mend, mend)
    if st == TRUNCATED and s > start:
        _fail(f, TRUNCATED)  # decode what was captured
    elif st != OK:
        _fail(f, st)
        return apos
    if (t >> 24) != APPLICATION_CONSTRUCTED:
        _fail(f, NOT_PROTOCOL)
        return apos
    number = t & 0x0FFFFFFF
    if not (10 <= number <= 17 or 20 <= number <= 22 or number == 30):
        _fail(f, NOT_PROTOCOL)
        return apos
    f[I_APP] = number
    trailing = e < mend  # bytes after the message: reported only when nothing else is wrong
    if number == 14:
        apos, st = _ap_req(buf, start, e, mend, f, arena, apos, sp, S_REALM, S_SNAME, YES)
    else:
        t2, s2, e2, st = read_tlv_partial(buf, s, e, mend)
        if st == OK and t2 != SEQ:
            st = UNEXPECTED
        if st == OK:
            if number == 10 or number == 12:
                apos, st = _kdc_req(buf, s2, e2, mend, f, arena, apos, sp, np.bool_(number == 12))
            elif number == 11 or number == 13:
                apos, st = _kdc_rep(buf, s2, e2, mend, f, arena, apos, sp)
            elif number == 30:
                apos, st = _krb_error(buf, s2, e2, mend, f, arena, apos, sp)
            else:
                st = _generic(buf, s2, e2, mend, f)
    if apos < 0:
        return -1
    if st != OK:
        _fail(f, st)
    if f[I_MSG_TYPE] != NULL and f[I_MSG_TYPE] != number:
        _fail(f, BAD_VALUE)
    if trailing:
        _fail(f, TRAILING)
    return apos


@njit(cache=True)
def _decode_all(buf, offsets, lengths, ints, spans, arena):
    """Every message; returns the arena bytes used, or -1 when the arena is too small."""
    f = np.empty(N_INTS, np.int64)
    sp = np.empty(2 * N_STRS, np.int64)
    apos = np.int64(0)
    for i in range(offsets.shape[0]):
        f[:] = NULL
        f[I_STATUS] = OK
        f[I_PREAUTH] = 0
        sp[:] = -1
        start = offsets[i]
        apos = _decode_one(buf, start, start + lengths[i], f, sp, arena, apos)
        if apos < 0:
            return -1
        ints[:, i] = f  # column-major: each field's column is contiguous for Polars
        spans[:, i] = sp
    return apos
