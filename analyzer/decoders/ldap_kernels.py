"""Numba kernels of the LDAP decoder (see ``analyzer.decoders.ldap`` for the schema, the tables and
the pairing). Pass 1 (:mod:`.ldap_units`) finds the LDAPMessages of each framed message (plain,
several in a CLDAP datagram, or inside a SASL buffer); pass 2 (:func:`decode_all`, here) decodes each
one into a field vector and string spans: the envelope and controls here, the protocolOp in
:mod:`.ldap_ops`, search filters rendered as RFC 4515 text in :mod:`.ldap_filter`. RFC 4511 §4
structures, read with the shared BER reader (``analyzer.decoders.ber``); the layout (``I_*``, ``S_*``,
tags, operation numbers) is :mod:`.ldap_layout`."""
from __future__ import annotations

import numpy as np

from ..jit import njit
from .ber import (NOT_PROTOCOL, NULL, OK, TEXT, TRAILING, TRUNCATED, UNEXPECTED, helper, put_byte, put_utf8, read_tlv,
                  read_tlv_partial)
from .ldap_filter import MAX_FILTER_DEPTH
from .ldap_layout import (COMMA, CONTROLS, I_MSGID, I_OPAQUE, I_SASL, I_STATUS, I_UNIT, INT, K_SASL, K_SASL_LDAP,
                          K_SEALED, K_TLS, N_INTS, N_STRS, OCTETS, S_CONTROLS, SEQ)
from .ldap_ops import decode_op
from .ldap_read import expect, fail, int_field
# What ldap.py builds its frame from: the two passes and the layout.
from .ldap_layout import (  # noqa: F401
    I_ABANDON_ID, I_ATTR_COUNT, I_AUTH, I_CRED_LEN, I_DELETE_OLD_RDN, I_DEREF, I_OP, I_RESULT, I_SCOPE,
    I_SIZE_LIMIT, I_TIME_LIMIT, I_TYPES_ONLY, I_VERSION)
from .ldap_units import count_units, fill_units  # noqa: F401


@helper
def _decode_one(buf, s, mend, f, sp, arena, apos, stk_p, stk_e, stk_t, stk_n):
    """One LDAPMessage TLV at ``s`` (§4.1.1). Returns the new arena position (-1: full)."""
    t, cs, ce, st = read_tlv(buf, s, mend, mend)
    if st == TRUNCATED and cs > s and t == SEQ:
        fail(f, TRUNCATED)  # decode what was captured
    elif st != OK:
        fail(f, st)
        return apos
    if t != SEQ:
        fail(f, NOT_PROTOCOL)
        return apos
    v, p, st = int_field(buf, cs, ce, mend, INT)
    if st != OK:
        fail(f, st if st != UNEXPECTED else NOT_PROTOCOL)
        return apos
    f[I_MSGID] = v
    t2, os_, oe, st = read_tlv_partial(buf, p, ce, mend)
    if st != OK:
        fail(f, st)
        return apos
    apos, st = decode_op(buf, t2, os_, oe, mend, f, arena, apos, sp, stk_p, stk_e, stk_t, stk_n)
    if apos < 0:
        return -1
    if st != OK:
        fail(f, st)
        return apos
    p = oe
    if p < ce:  # controls [0] (§4.1.11)
        t3, ls, le, st = read_tlv_partial(buf, p, ce, mend)
        if st != OK:
            fail(f, st)
            return apos
        if t3 != CONTROLS:
            fail(f, UNEXPECTED)
            return apos
        start = apos
        n = 0
        q = ls
        while q < le:
            xs, xe, q, st = expect(buf, q, le, mend, SEQ)
            if st != OK:
                fail(f, st)
                break
            ts_, te, r, st = expect(buf, xs, xe, mend, OCTETS)
            if st != OK:
                fail(f, st)
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
        fail(f, TRAILING)
    elif ce < mend:
        fail(f, TRAILING)
    return apos


@njit(cache=True)
def decode_all(buf, u_start, u_end, u_kind, u_first, ints, spans, arena):
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
