"""LDAP search filters (RFC 4511 §4.5.1.7) rendered as RFC 4515 text into the arena, iteratively
with an explicit stack of MAX_FILTER_DEPTH levels (a deeper filter is ``TOO_DEEP``, never a recursion)."""
from __future__ import annotations

import numpy as np

from . import ber
from .ber import (ARENA_FULL, BAD_VALUE, MISSING, OK, TOO_DEEP, TRAILING, UNEXPECTED, helper, put_byte, read_bool,
                  read_tlv_partial)
from .ldap_layout import (AMP, BANG, COLON, EQUALS, F_AND, F_APPROX, F_EQ, F_EXT, F_GE, F_LE, F_NOT, F_OR,
                          F_PRESENT, F_SUB, LPAREN, MRA_DN, MRA_RULE, MRA_TYPE, MRA_VALUE, OCTETS, OP_APPROX, OP_EQ,
                          OP_GE, OP_LE, PIPE, RPAREN, SEQ, STAR, SUB_ANY, SUB_FINAL, SUB_INITIAL, TXT_DN, TXT_EXT,
                          TXT_PRESENT)
from .ldap_read import expect, put_value

MAX_FILTER_DEPTH = 32  # nested and/or/not; real filters stay under 10


@helper
def _ava(buf, s, e, mend, arena, apos, op):
    """AttributeValueAssertion content → ``(attr<op>value)``."""
    a_s, a_e, p, st = expect(buf, s, e, mend, OCTETS)
    if st != OK:
        return apos, st
    v_s, v_e, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, st
    apos = put_byte(arena, apos, LPAREN)
    apos = put_value(arena, apos, buf, a_s, a_e)
    apos = ber.put_ascii(arena, apos, op)
    apos = put_value(arena, apos, buf, v_s, v_e)
    apos = put_byte(arena, apos, RPAREN)
    if apos < 0:
        return apos, ARENA_FULL
    return apos, OK if p == e else TRAILING


@helper
def _substrings(buf, s, e, mend, arena, apos):
    """SubstringFilter content (§4.5.1.7.2) → ``(attr=initial*any*final)``."""
    a_s, a_e, p, st = expect(buf, s, e, mend, OCTETS)
    if st != OK:
        return apos, st
    l_s, l_e, p, st = expect(buf, p, e, mend, SEQ)
    if st != OK:
        return apos, st
    apos = put_byte(arena, apos, LPAREN)
    apos = put_value(arena, apos, buf, a_s, a_e)
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
        if t == SUB_INITIAL:
            if n > 0:
                return apos, UNEXPECTED  # initial must come first
        elif t == SUB_ANY or t == SUB_FINAL:
            apos = put_byte(arena, apos, STAR)
            last_final = t == SUB_FINAL
        else:
            return apos, UNEXPECTED
        apos = put_value(arena, apos, buf, cs, ce)
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
        if t == MRA_RULE:
            r_s, r_e = cs, ce
        elif t == MRA_TYPE:
            t_s, t_e = cs, ce
        elif t == MRA_VALUE:
            v_s, v_e = cs, ce
        elif t == MRA_DN:
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
        apos = put_value(arena, apos, buf, t_s, t_e)
    if dn:
        apos = ber.put_ascii(arena, apos, TXT_DN)
    if r_s >= 0:
        apos = put_byte(arena, apos, COLON)
        apos = put_value(arena, apos, buf, r_s, r_e)
    apos = ber.put_ascii(arena, apos, TXT_EXT)
    apos = put_value(arena, apos, buf, v_s, v_e)
    apos = put_byte(arena, apos, RPAREN)
    if apos < 0:
        return apos, ARENA_FULL
    return apos, OK


@helper
def render_filter(buf, s, e, mend, arena, apos, stk_p, stk_e, stk_t, stk_n):
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
            apos = put_value(arena, apos, buf, cs, ce)
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
