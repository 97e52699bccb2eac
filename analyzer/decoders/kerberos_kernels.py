"""Numba kernels of the Kerberos decoder (see ``analyzer.decoders.kerberos`` for the schema, the
tables and the pairing): one pass over the messages of a set, a per-message field vector and string
spans into one arena, as ``analyzer/kernels/headers.py`` does. RFC 4120 §5 structures, read with the
shared BER reader (``analyzer.decoders.ber``): the messages here (KDC-REQ, KDC-REP, KRB-ERROR, the
others' pvno and msg-type), the structures they share in :mod:`.kerberos_fields`, the layout
(message types, PA-DATA types, ``I_*``, ``S_*``) in :mod:`.kerberos_layout`."""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import ber
from . import kerberos_layout as L
from .ber import (ARENA_FULL, BAD_VALUE, MISSING, NOT_PROTOCOL, NULL, OK, TRAILING, TRUNCATED, UNEXPECTED, helper,
                  put_byte, put_int, put_slot, read_int, read_time, read_tlv, read_tlv_partial)
from .kerberos_fields import (ap_req, explicit, explicit_bits32, explicit_encrypted, explicit_int, fail, padata, principal,
                              ticket)
from .kerberos_layout import (ANY_STRING, APPLICATION_CONSTRUCTED, C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10,
                              C11, C12, COMMA, GTIME, I_APP, I_CTIME, I_ENC_ETYPE, I_ENC_KVNO, I_ERROR_CODE,
                              I_KDC_OPTIONS, I_MSG_TYPE, I_NONCE, I_PREAUTH, I_PVNO, I_STATUS, I_STIME, I_TILL, INT,
                              N_INTS, N_STRS, NO, OCTETS, S_CNAME, S_CREALM, S_ETEXT, S_ETYPES, S_PADATA, S_REALM,
                              S_SNAME, SEQ, YES)
# What kerberos.py builds its frame from: the layout.
from .kerberos_layout import (  # noqa: F401
    I_PREAUTH_ETYPE, I_TICKET_ETYPE, I_TICKET_KVNO, STR_NAMES)


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
            v, st = explicit_bits32(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_KDC_OPTIONS] = v
        elif t == C1:
            apos, st = principal(buf, fs, fe, mend, arena, apos, sp, S_CNAME)
            if st != OK:
                return apos, st
        elif t == C2:
            cs, ce, st = explicit(buf, fs, fe, mend, ANY_STRING)
            if st != OK:
                return apos, st
            apos = put_slot(buf, cs, ce, arena, apos, sp, S_REALM)
            if apos < 0:
                return apos, ARENA_FULL
        elif t == C3:
            apos, st = principal(buf, fs, fe, mend, arena, apos, sp, S_SNAME)
            if st != OK:
                return apos, st
        elif t == C5:
            cs, ce, st = explicit(buf, fs, fe, mend, GTIME)
            if st != OK:
                return apos, st
            v, st = read_time(buf, cs, ce)
            if st == OK:
                f[I_TILL] = v
        elif t == C7:
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_NONCE] = v
        elif t == C8:
            ls, le, st = explicit(buf, fs, fe, mend, SEQ)
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
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_PVNO] = v
        elif t == C2:
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_MSG_TYPE] = v
        elif t == C3:
            ls, le, st = explicit(buf, fs, fe, mend, SEQ)
            if st != OK:
                return apos, st
            apos, st = padata(buf, ls, le, mend, f, arena, apos, sp, tgs, YES)
            if apos < 0:
                return apos, ARENA_FULL
            if st != OK:
                return apos, st
        elif t == C4:
            bs, be, st = explicit(buf, fs, fe, mend, SEQ)
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
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_PVNO] = v
        elif t == C1:
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_MSG_TYPE] = v
        elif t == C2:
            ls, le, st = explicit(buf, fs, fe, mend, SEQ)
            if st != OK:
                return apos, st
            apos, st = padata(buf, ls, le, mend, f, arena, apos, sp, NO, YES)
            if apos < 0:
                return apos, ARENA_FULL
            if st != OK:
                return apos, st
        elif t == C3:
            cs, ce, st = explicit(buf, fs, fe, mend, ANY_STRING)
            if st != OK:
                return apos, st
            apos = put_slot(buf, cs, ce, arena, apos, sp, S_CREALM)
            if apos < 0:
                return apos, ARENA_FULL
        elif t == C4:
            apos, st = principal(buf, fs, fe, mend, arena, apos, sp, S_CNAME)
            if st != OK:
                return apos, st
        elif t == C5:
            apos, st = ticket(buf, fs, fe, mend, f, arena, apos, sp, S_REALM, S_SNAME)
            if st != OK:
                return apos, st
        elif t == C6:
            etype, kvno, st = explicit_encrypted(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_ENC_ETYPE] = etype
            f[I_ENC_KVNO] = kvno
    return apos, OK


@helper
def _time_field(buf, fs, fe, mend):
    cs, ce, st = explicit(buf, fs, fe, mend, GTIME)
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
            v, st = explicit_int(buf, fs, fe, mend)
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
            cs, ce, st = explicit(buf, fs, fe, mend, ANY_STRING)
            if st != OK:
                return apos, st
            k = S_CREALM if t == C7 else (S_REALM if t == C9 else S_ETEXT)
            apos = put_slot(buf, cs, ce, arena, apos, sp, k)
            if apos < 0:
                return apos, ARENA_FULL
        elif t == C8 or t == C10:
            apos, st = principal(buf, fs, fe, mend, arena, apos, sp, S_CNAME if t == C8 else S_SNAME)
            if st != OK:
                return apos, st
        elif t == C12:
            cs, ce, st = explicit(buf, fs, fe, mend, OCTETS)
            if st != OK:
                return apos, st
            t2, ls, le, st = read_tlv_partial(buf, cs, ce, ce)
            if st == OK and t2 == SEQ and le == ce:
                apos, st = padata(buf, ls, le, ce, f, arena, apos, sp, NO, NO)
                if apos < 0:
                    return apos, ARENA_FULL
                if st != OK:
                    sp[2 * S_PADATA] = -1
                    sp[2 * S_PADATA + 1] = -1
    if stime != NULL and 0 <= susec < L.USEC_PER_SEC:
        f[I_STIME] = stime + susec * L.NS_PER_USEC
    if ctime != NULL and 0 <= cusec < L.USEC_PER_SEC:
        f[I_CTIME] = ctime + cusec * L.NS_PER_USEC
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
            v, st = explicit_int(buf, fs, fe, mend)
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
        fail(f, TRUNCATED)  # decode what was captured
    elif st != OK:
        fail(f, st)
        return apos
    if (t >> ber.TAG_CLASS_SHIFT) != APPLICATION_CONSTRUCTED:
        fail(f, NOT_PROTOCOL)
        return apos
    number = t & ber.TAG_NUMBER_MASK
    if not (L.AS_REQ <= number <= L.KRB_RESERVED17 or L.KRB_SAFE <= number <= L.KRB_CRED or number == L.KRB_ERROR):
        fail(f, NOT_PROTOCOL)
        return apos
    f[I_APP] = number
    trailing = e < mend  # bytes after the message: reported only when nothing else is wrong
    if number == L.AP_REQ:
        apos, st = ap_req(buf, start, e, mend, f, arena, apos, sp, S_REALM, S_SNAME, YES)
    else:
        t2, s2, e2, st = read_tlv_partial(buf, s, e, mend)
        if st == OK and t2 != SEQ:
            st = UNEXPECTED
        if st == OK:
            if number == L.AS_REQ or number == L.TGS_REQ:
                apos, st = _kdc_req(buf, s2, e2, mend, f, arena, apos, sp, np.bool_(number == L.TGS_REQ))
            elif number == L.AS_REP or number == L.TGS_REP:
                apos, st = _kdc_rep(buf, s2, e2, mend, f, arena, apos, sp)
            elif number == L.KRB_ERROR:
                apos, st = _krb_error(buf, s2, e2, mend, f, arena, apos, sp)
            else:
                st = _generic(buf, s2, e2, mend, f)
    if apos < 0:
        return -1
    if st != OK:
        fail(f, st)
    if f[I_MSG_TYPE] != NULL and f[I_MSG_TYPE] != number:
        fail(f, BAD_VALUE)
    if trailing:
        fail(f, TRAILING)
    return apos


@njit(cache=True)
def decode_all(buf, offsets, lengths, ints, spans, arena):
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


# FNV-1a, 64 bits (Fowler, Noll, Vo; draft-eastlake-fnv): the request_digest of kerberos_messages
FNV64_OFFSET = np.uint64(0xCBF29CE484222325)
FNV64_PRIME = np.uint64(0x100000001B3)


@njit(cache=True)
def digest_all(buf, offsets, lengths):
    """FNV-1a 64 of each message's available bytes: equal messages, equal digests."""
    out = np.empty(offsets.shape[0], np.uint64)
    for i in range(offsets.shape[0]):
        h = FNV64_OFFSET
        for k in range(offsets[i], offsets[i] + lengths[i]):
            h = (h ^ np.uint64(buf[k])) * FNV64_PRIME
        out[i] = h
    return out
