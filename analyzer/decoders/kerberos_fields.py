"""Kerberos kernels: the structures several messages share (RFC 4120 §5.2 - §5.5): EXPLICIT fields,
PrincipalName, EncryptedData, Ticket, AP-REQ (a message of its own, and inside PA-TGS-REQ) and
METHOD-DATA (PA-DATA sequences). A top-level AP-REQ also gives its ap-options and where its
authenticator's cipher lies (``I_AP_OPTIONS``, ``I_AUTH_CIPHER_*``: the replay-cache tag of
:mod:`.kerberos_ap`). Each reads into the field vector ``f`` (``I_*``) and string slots
``sp`` (``S_*``) of :mod:`.kerberos_layout` and returns the new arena position with a status."""
from __future__ import annotations

import numpy as np

from . import ber
from . import kerberos_layout as L
from .ber import (ARENA_FULL, MISSING, NULL, OK, TEXT, UNEXPECTED, helper, put_byte, put_int, put_slot, put_utf8,
                  read_bits32, read_int, read_tlv_partial)
from .kerberos_layout import (ANY_STRING, APP_AP_REQ, APP_TICKET, BITS, C0, C1, C2, C3, C4, COMMA, I_AP_OPTIONS,
                              I_AUTH_CIPHER_END, I_AUTH_CIPHER_START, I_ENC_ETYPE, I_ENC_KVNO, I_MSG_TYPE, I_PREAUTH, I_PREAUTH_ETYPE, I_PVNO, I_STATUS, I_TICKET_ETYPE,
                              I_TICKET_KVNO, INT, NO, OCTETS, S_PADATA, S_TGS_REALM, S_TGS_SNAME, SEQ, SLASH)


@helper
def fail(f, status):
    """Record the first problem of the message; returns the status for chaining."""
    if f[I_STATUS] == OK:
        f[I_STATUS] = status
    return status


@helper
def explicit(buf, a, b, mend, want):
    """Content of an EXPLICIT [n] field: the single TLV inside ``[a, b)`` must have tag ``want``
    (``-1``: any universal primitive, used for the string types). Returns (start, end, status)."""
    t, s, e, st = read_tlv_partial(buf, a, b, mend)
    if st != OK:
        return s, e, st
    if want >= 0:
        if t != want:
            return s, e, UNEXPECTED
    elif (t >> ber.TAG_CLASS_SHIFT) != ber.UNIVERSAL:  # strings: GeneralString in the spec; any universal
        # primitive is accepted
        return s, e, UNEXPECTED
    return s, e, OK


@helper
def explicit_int(buf, a, b, mend):
    s, e, st = explicit(buf, a, b, mend, INT)
    if st != OK:
        return np.int64(0), st
    return read_int(buf, s, e)


@helper
def explicit_bits32(buf, a, b, mend):
    """EXPLICIT BIT STRING of at most 32 bits (KDCOptions, APOptions) as an integer, bit 0 the top."""
    s, e, st = explicit(buf, a, b, mend, BITS)
    if st != OK:
        return np.int64(0), st
    return read_bits32(buf, s, e)


@helper
def principal(buf, a, b, mend, arena, apos, sp, k):
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
                if (t3 >> ber.TAG_CLASS_SHIFT) != ber.UNIVERSAL:
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
def encrypted_cipher(buf, s, e, mend):
    """EncryptedData SEQUENCE content ``[s, e)`` (§5.2.9) → (etype, kvno or NULL, cipher start, cipher
    end, status); the cipher bounds are -1 when absent or not wholly captured (a truncated OCTET STRING
    is no status here: the caller's message already records its truncation)."""
    etype = NULL
    kvno = NULL
    c_s = np.int64(-1)
    c_e = np.int64(-1)
    p = s
    while p < e:
        t, fs, fe, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return etype, kvno, c_s, c_e, st
        p = fe
        if t == C0:
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return etype, kvno, c_s, c_e, st
            etype = v
        elif t == C1:
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return etype, kvno, c_s, c_e, st
            kvno = v
        elif t == C2:
            cs, ce, st = explicit(buf, fs, fe, mend, OCTETS)
            if st == OK:
                c_s = cs
                c_e = ce
            elif st != ber.TRUNCATED:
                return etype, kvno, c_s, c_e, st
    if etype == NULL:
        return etype, kvno, c_s, c_e, MISSING
    return etype, kvno, c_s, c_e, OK


@helper
def encrypted_data(buf, s, e, mend):
    """EncryptedData SEQUENCE content ``[s, e)`` (§5.2.9) → (etype, kvno or NULL, status)."""
    etype, kvno, c_s, c_e, st = encrypted_cipher(buf, s, e, mend)
    return etype, kvno, st


@helper
def explicit_encrypted(buf, a, b, mend):
    s, e, st = explicit(buf, a, b, mend, SEQ)
    if st != OK:
        return NULL, NULL, st
    return encrypted_data(buf, s, e, mend)


@helper
def ticket(buf, a, b, mend, f, arena, apos, sp, k_realm, k_sname):
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
            cs, ce, st = explicit(buf, fs, fe, mend, ANY_STRING)
            if st != OK:
                return apos, st
            apos = put_slot(buf, cs, ce, arena, apos, sp, k_realm)
            if apos < 0:
                return apos, ARENA_FULL
        elif t == C2:
            apos, st = principal(buf, fs, fe, mend, arena, apos, sp, k_sname)
            if st != OK:
                return apos, st
        elif t == C3:
            etype, kvno, st = explicit_encrypted(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_TICKET_ETYPE] = etype
            f[I_TICKET_KVNO] = kvno
    return apos, OK


@helper
def ap_req(buf, a, b, mend, f, arena, apos, sp, k_realm, k_sname, top):
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
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_PVNO] = v
        elif t == C1 and top:
            v, st = explicit_int(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_MSG_TYPE] = v
        elif t == C2 and top:
            v, st = explicit_bits32(buf, fs, fe, mend)
            if st != OK:
                return apos, st
            f[I_AP_OPTIONS] = v
        elif t == C3:
            apos, st = ticket(buf, fs, fe, mend, f, arena, apos, sp, k_realm, k_sname)
            if st != OK:
                return apos, st
        elif t == C4 and top:
            cs, ce, st = explicit(buf, fs, fe, mend, SEQ)
            if st != OK:
                return apos, st
            etype, kvno, c_s, c_e, st = encrypted_cipher(buf, cs, ce, mend)
            if st != OK:
                return apos, st
            f[I_ENC_ETYPE] = etype
            f[I_ENC_KVNO] = kvno
            f[I_AUTH_CIPHER_START] = c_s
            f[I_AUTH_CIPHER_END] = c_e
    return apos, OK


@helper
def padata(buf, s, e, mend, f, arena, apos, sp, tgs, strict):
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
                v, st = explicit_int(buf, fs, fe, mend)
                if st != OK:
                    return start, st
                ptype = v
            elif t == C2:
                vs, ve, st = explicit(buf, fs, fe, mend, OCTETS)
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
        if ptype == L.PA_ENC_TIMESTAMP or ptype == L.PA_PK_AS_REQ or ptype == L.PA_PK_AS_REQ_OLD \
                or ptype == L.PA_FX_FAST or ptype == L.PA_ENC_CHALLENGE:
            if strict:
                f[I_PREAUTH] = 1
        if ptype == L.PA_ENC_TIMESTAMP and ts_s < 0:
            ts_s = vs
            ts_e = ve
        elif ptype == L.PA_TGS_REQ and tgs_s < 0:
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
            etype, kvno, st = encrypted_data(buf, es, ee, mend)
            if st == OK:
                f[I_PREAUTH_ETYPE] = etype
        elif st == OK:
            st = UNEXPECTED
        if st != OK:
            fail(f, st)
    if tgs and tgs_s >= 0:
        apos, st = ap_req(buf, tgs_s, tgs_e, mend, f, arena, apos, sp, S_TGS_REALM, S_TGS_SNAME, NO)
        if apos < 0:
            return apos, ARENA_FULL
        if st != OK:
            fail(f, st)
    return apos, OK
