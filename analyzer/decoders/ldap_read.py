"""Small readers the LDAP kernels share (RFC 4511 §4 structures over the BER reader of
:mod:`analyzer.decoders.ber`): a required TLV of a given tag, an INTEGER/ENUMERATED field, a SEQUENCE
OF OCTET STRING as joined text, and the first-problem-wins status of a message."""
from __future__ import annotations

import numpy as np

from .ber import (ARENA_FULL, FILTER_VALUE, MISSING, OK, TEXT, UNEXPECTED, helper, put_byte, put_utf8, read_int,
                  read_tlv_partial)
from .ldap_layout import I_STATUS, OCTETS


@helper
def fail(f, status):
    if f[I_STATUS] == OK:
        f[I_STATUS] = status
    return status


@helper
def expect(buf, p, e, mend, want):
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
def int_field(buf, p, e, mend, want):
    cs, ce, nxt, st = expect(buf, p, e, mend, want)
    if st != OK:
        return np.int64(0), nxt, st
    v, st = read_int(buf, cs, ce)
    return v, nxt, st


@helper
def string_list(buf, s, e, mend, arena, apos, sp, k, sep):
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
def put_value(arena, apos, buf, s, e):
    return put_utf8(arena, apos, buf, s, e - s, FILTER_VALUE)
