"""LDAP kernels: the protocolOp of one LDAPMessage (RFC 4511 §4.2 - §4.13), one helper per operation,
dispatched by :func:`decode_op` on the [APPLICATION n] number (:mod:`.ldap_layout`). Each helper
reads its operation's components from ``p`` into the field vector ``f`` (``I_*``) and string slots
``sp`` (``S_*``) and returns ``(apos, next, status)``; a status other than OK stops the message."""
from __future__ import annotations

from . import ber
from . import ldap_layout as L
from .ber import (ARENA_FULL, BAD_VALUE, OK, TEXT, TRAILING, UNEXPECTED, bytes_equal, helper, put_byte,
                  put_int, put_slot, put_utf8, read_bool, read_int, read_tlv_partial)
from .ldap_filter import render_filter
from .ldap_layout import (APP_CONSTRUCTED, APP_PRIMITIVE, BOOL, CANCEL_OID_BYTES, COMMA, CTX_PRIMITIVE, ENUM,
                          I_ABANDON_ID, I_ATTR_COUNT, I_AUTH, I_CRED_LEN, I_DELETE_OLD_RDN, I_DEREF, I_OP, I_RESULT,
                          I_SCOPE, I_SIZE_LIMIT, I_TIME_LIMIT, I_TYPES_ONLY, I_VERSION, INT, INTERMEDIATE_NAME,
                          LPAREN, MOD_ADD, MOD_DELETE, MOD_INCREMENT, MOD_REPLACE, NEW_SUPERIOR, OCTETS, REFERRAL,
                          REQUEST_NAME, REQUEST_VALUE, RESPONSE_NAME, RESPONSE_VALUE, RPAREN, S_ATTRS, S_CHANGES,
                          S_DIAG, S_DN, S_FILTER, S_MATCHED, S_MECH, S_NEW_RDN, S_NEW_SUPERIOR, S_OID, S_REFERRALS,
                          SASL_CREDENTIALS, SEQ, SERVER_SASL_CREDS, SPACE)
from .ldap_read import expect, int_field, string_list

@helper
def _result(buf, p, e, mend, f, arena, apos, sp):
    """LDAPResult components (§4.1.9) from ``p``; returns (apos, next, status)."""
    v, p, st = int_field(buf, p, e, mend, ENUM)
    if st != OK:
        return apos, p, st
    f[I_RESULT] = v
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_MATCHED)
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DIAG)
    if apos < 0:
        return apos, p, ARENA_FULL
    if p < e:
        t, cs, ce, st = read_tlv_partial(buf, p, e, mend)
        if st == OK and t == REFERRAL:
            apos, n, st = string_list(buf, cs, ce, mend, arena, apos, sp, S_REFERRALS, SPACE)
            if st != OK:
                return apos, ce, st
            p = ce
    return apos, p, OK


@helper
def _is_cancel(buf, s, e):
    return bytes_equal(buf, s, e, CANCEL_OID_BYTES, False)




@helper
def _bind_request(buf, p, e, mend, f, arena, apos, sp):
    """BindRequest §4.2: the content from ``p``. Returns (apos, next, status)."""
    v, p, st = int_field(buf, p, e, mend, INT)
    if st != OK:
        return apos, p, st
    f[I_VERSION] = v
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
    if apos < 0:
        return apos, p, ARENA_FULL
    t2, cs, ce, st = read_tlv_partial(buf, p, e, mend)
    if st != OK:
        return apos, p, st
    p = ce
    choice = t2 & ber.TAG_NUMBER_MASK
    if (t2 >> ber.TAG_CLASS_SHIFT) & CTX_PRIMITIVE == 0:
        return apos, p, UNEXPECTED
    f[I_AUTH] = choice
    if t2 == SASL_CREDENTIALS:
        ms, me, q, st = expect(buf, cs, ce, mend, OCTETS)
        if st != OK:
            return apos, p, st
        apos = put_slot(buf, ms, me, arena, apos, sp, S_MECH)
        if apos < 0:
            return apos, p, ARENA_FULL
        f[I_CRED_LEN] = 0
        if q < ce:
            ks, ke, q, st = expect(buf, q, ce, mend, OCTETS)
            if st != OK:
                return apos, p, st
            f[I_CRED_LEN] = ke - ks
    else:
        f[I_CRED_LEN] = ce - cs
    return apos, p, OK


@helper
def _search_request(buf, p, e, mend, f, arena, apos, sp, stk_p, stk_e, stk_t, stk_n):
    """SearchRequest §4.5.1: the content from ``p``. Returns (apos, next, status)."""
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
    if apos < 0:
        return apos, p, ARENA_FULL
    v, p, st = int_field(buf, p, e, mend, ENUM)
    if st != OK:
        return apos, p, st
    f[I_SCOPE] = v
    v, p, st = int_field(buf, p, e, mend, ENUM)
    if st != OK:
        return apos, p, st
    f[I_DEREF] = v
    v, p, st = int_field(buf, p, e, mend, INT)
    if st != OK:
        return apos, p, st
    f[I_SIZE_LIMIT] = v
    v, p, st = int_field(buf, p, e, mend, INT)
    if st != OK:
        return apos, p, st
    f[I_TIME_LIMIT] = v
    cs, ce, p, st = expect(buf, p, e, mend, BOOL)
    if st != OK:
        return apos, p, st
    v, st = read_bool(buf, cs, ce)
    if st != OK:
        return apos, p, st
    f[I_TYPES_ONLY] = v
    t2, cs, ce, st = read_tlv_partial(buf, p, e, mend)
    if st != OK:
        return apos, p, st
    fstart = apos
    apos, st = render_filter(buf, p, ce, mend, arena, apos, stk_p, stk_e, stk_t, stk_n)
    if apos < 0:
        return apos, p, ARENA_FULL
    if st != OK:
        return fstart, p, st
    sp[2 * S_FILTER] = fstart
    sp[2 * S_FILTER + 1] = apos - fstart
    p = ce
    cs, ce, p, st = expect(buf, p, e, mend, SEQ)
    if st != OK:
        return apos, p, st
    apos, n, st = string_list(buf, cs, ce, mend, arena, apos, sp, S_ATTRS, COMMA)
    if st != OK:
        return apos, p, st
    f[I_ATTR_COUNT] = n
    return apos, p, OK


@helper
def _search_result_entry(buf, p, e, mend, f, arena, apos, sp):
    """SearchResultEntry §4.5.2: the content from ``p``. Returns (apos, next, status)."""
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
    if apos < 0:
        return apos, p, ARENA_FULL
    cs, ce, p, st = expect(buf, p, e, mend, SEQ)
    if st != OK:
        return apos, p, st
    n = 0
    q = cs
    while q < ce:
        t2, a, b, st = read_tlv_partial(buf, q, ce, mend)
        if st != OK:
            return apos, p, st
        if t2 != SEQ:
            return apos, p, UNEXPECTED
        q = b
        n += 1
    f[I_ATTR_COUNT] = n
    return apos, p, OK


@helper
def _search_result_reference(buf, p, e, mend, f, arena, apos, sp):
    """SearchResultReference §4.5.3: the content from ``p``. Returns (apos, next, status)."""
    apos, n, st = string_list(buf, p, e, mend, arena, apos, sp, S_REFERRALS, SPACE)
    if st != OK:
        return apos, p, st
    p = e
    return apos, p, OK


@helper
def _modify_request(buf, p, e, mend, f, arena, apos, sp):
    """ModifyRequest §4.6: the content from ``p``. Returns (apos, next, status)."""
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
    if apos < 0:
        return apos, p, ARENA_FULL
    ls, le, p, st = expect(buf, p, e, mend, SEQ)
    if st != OK:
        return apos, p, st
    start = apos
    n = 0
    q = ls
    while q < le:
        ms, me, q, st = expect(buf, q, le, mend, SEQ)
        if st != OK:
            return apos, p, st
        v, r, st = int_field(buf, ms, me, mend, ENUM)
        if st != OK:
            return apos, p, st
        as_, ae, r, st = expect(buf, r, me, mend, SEQ)  # PartialAttribute
        if st != OK:
            return apos, p, st
        ts_, te, r2, st = expect(buf, as_, ae, mend, OCTETS)
        if st != OK:
            return apos, p, st
        if n > 0:
            apos = put_byte(arena, apos, COMMA)
        if 0 <= v <= 3:
            apos = ber.put_ascii(arena, apos, MOD_ADD if v == 0 else (MOD_DELETE if v == 1 else (
                MOD_REPLACE if v == 2 else MOD_INCREMENT)))
        else:
            apos = put_int(arena, apos, v)
        apos = put_byte(arena, apos, LPAREN)
        apos = put_utf8(arena, apos, buf, ts_, te - ts_, TEXT)
        apos = put_byte(arena, apos, RPAREN)
        if apos < 0:
            return apos, p, ARENA_FULL
        n += 1
    sp[2 * S_CHANGES] = start
    sp[2 * S_CHANGES + 1] = apos - start
    f[I_ATTR_COUNT] = n
    return apos, p, OK


@helper
def _add_request(buf, p, e, mend, f, arena, apos, sp):
    """AddRequest §4.7: the content from ``p``. Returns (apos, next, status)."""
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
    if apos < 0:
        return apos, p, ARENA_FULL
    ls, le, p, st = expect(buf, p, e, mend, SEQ)
    if st != OK:
        return apos, p, st
    start = apos
    n = 0
    q = ls
    while q < le:
        as_, ae, q, st = expect(buf, q, le, mend, SEQ)
        if st != OK:
            return apos, p, st
        ts_, te, r, st = expect(buf, as_, ae, mend, OCTETS)
        if st != OK:
            return apos, p, st
        if n > 0:
            apos = put_byte(arena, apos, COMMA)
        apos = put_utf8(arena, apos, buf, ts_, te - ts_, TEXT)
        if apos < 0:
            return apos, p, ARENA_FULL
        n += 1
    sp[2 * S_ATTRS] = start
    sp[2 * S_ATTRS + 1] = apos - start
    f[I_ATTR_COUNT] = n
    return apos, p, OK


@helper
def _modify_dn_request(buf, p, e, mend, f, arena, apos, sp):
    """ModifyDNRequest §4.9: the content from ``p``. Returns (apos, next, status)."""
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_NEW_RDN)
    if apos < 0:
        return apos, p, ARENA_FULL
    cs, ce, p, st = expect(buf, p, e, mend, BOOL)
    if st != OK:
        return apos, p, st
    v, st = read_bool(buf, cs, ce)
    if st != OK:
        return apos, p, st
    f[I_DELETE_OLD_RDN] = v
    if p < e:
        cs, ce, p, st = expect(buf, p, e, mend, NEW_SUPERIOR)
        if st != OK:
            return apos, p, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, S_NEW_SUPERIOR)
        if apos < 0:
            return apos, p, ARENA_FULL
    return apos, p, OK


@helper
def _compare_request(buf, p, e, mend, f, arena, apos, sp):
    """CompareRequest §4.10: the content from ``p``. Returns (apos, next, status)."""
    cs, ce, p, st = expect(buf, p, e, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_DN)
    as_, ae, p, st = expect(buf, p, e, mend, SEQ)
    if st != OK:
        return apos, p, st
    ts_, te, r, st = expect(buf, as_, ae, mend, OCTETS)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, ts_, te, arena, apos, sp, S_ATTRS)
    if apos < 0:
        return apos, p, ARENA_FULL
    f[I_ATTR_COUNT] = 1
    return apos, p, OK


@helper
def _extended_request(buf, p, e, mend, f, arena, apos, sp):
    """ExtendedRequest §4.12: the content from ``p``. Returns (apos, next, status)."""
    cs, ce, p, st = expect(buf, p, e, mend, REQUEST_NAME)
    if st != OK:
        return apos, p, st
    apos = put_slot(buf, cs, ce, arena, apos, sp, S_OID)
    if apos < 0:
        return apos, p, ARENA_FULL
    if p < e and _is_cancel(buf, cs, ce):  # RFC 3909: requestValue ::= SEQUENCE { cancelID MessageID }
        vs, ve, p, st = expect(buf, p, e, mend, REQUEST_VALUE)
        if st != OK:
            return apos, p, st
        ss, se, q, st = expect(buf, vs, ve, mend, SEQ)
        if st != OK:
            return apos, p, st
        v, q, st = int_field(buf, ss, se, mend, INT)
        if st != OK:
            return apos, p, st
        f[I_ABANDON_ID] = v
    p = e  # other requestValues are opaque
    return apos, p, OK


@helper
def _intermediate_response(buf, p, e, mend, f, arena, apos, sp):
    """IntermediateResponse §4.13: the content from ``p``. Returns (apos, next, status)."""
    if p < e:
        t2, cs, ce, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, p, st
        if t2 == INTERMEDIATE_NAME:
            apos = put_slot(buf, cs, ce, arena, apos, sp, S_OID)
            if apos < 0:
                return apos, p, ARENA_FULL
    p = e
    return apos, p, OK


@helper
def _response(buf, num, p, e, mend, f, arena, apos, sp):
    """The responses with COMPONENTS OF LDAPResult (bindResponse, searchResDone, modifyResponse,
    addResponse, delResponse, modDNResponse, compareResponse, extendedResp: §4.1.9) and their own
    trailing fields. Returns (apos, next, status)."""
    apos, p, st = _result(buf, p, e, mend, f, arena, apos, sp)
    if st != OK:
        return apos, p, st
    while p < e:  # bindResponse serverSaslCreds [7]; extendedResp responseName [10], value [11]
        t2, cs, ce, st = read_tlv_partial(buf, p, e, mend)
        if st != OK:
            return apos, p, st
        p = ce
        if num == L.EXTENDED_RESPONSE and t2 == RESPONSE_NAME:
            apos = put_slot(buf, cs, ce, arena, apos, sp, S_OID)
            if apos < 0:
                return apos, p, ARENA_FULL
        elif not ((num == L.BIND_RESPONSE and t2 == SERVER_SASL_CREDS)
                  or (num == L.EXTENDED_RESPONSE and t2 == RESPONSE_VALUE)):
            return apos, p, UNEXPECTED
    return apos, p, OK


@helper
def decode_op(buf, t, s, e, mend, f, arena, apos, sp, stk_p, stk_e, stk_t, stk_n):
    """protocolOp with tag ``t`` and content ``[s, e)``. Returns (apos, status)."""
    num = t & ber.TAG_NUMBER_MASK
    constructed = (t >> ber.TAG_CLASS_SHIFT) == APP_CONSTRUCTED
    primitive = (t >> ber.TAG_CLASS_SHIFT) == APP_PRIMITIVE
    if (not (constructed or primitive) or num > L.MAX_OP or L.ABANDON_REQUEST < num < L.SEARCH_RESULT_REFERENCE
            or L.SEARCH_RESULT_REFERENCE < num < L.EXTENDED_REQUEST):  # unassigned numbers
        return apos, UNEXPECTED
    f[I_OP] = num
    # primitive ones: unbind (NULL), delRequest (LDAPDN), abandon (MessageID)
    if num == L.UNBIND_REQUEST or num == L.DEL_REQUEST or num == L.ABANDON_REQUEST:
        if not primitive:
            return apos, UNEXPECTED
        if num == L.DEL_REQUEST:
            apos = put_slot(buf, s, e, arena, apos, sp, S_DN)
            return apos, OK if apos >= 0 else ARENA_FULL
        if num == L.ABANDON_REQUEST:
            v, st = read_int(buf, s, e)
            if st == OK:
                f[I_ABANDON_ID] = v
            return apos, st
        return apos, OK if e == s else BAD_VALUE
    if not constructed:
        return apos, UNEXPECTED
    p = s
    if num == L.BIND_REQUEST:
        apos, p, st = _bind_request(buf, p, e, mend, f, arena, apos, sp)
    elif num == L.SEARCH_REQUEST:
        apos, p, st = _search_request(buf, p, e, mend, f, arena, apos, sp, stk_p, stk_e, stk_t, stk_n)
    elif num == L.SEARCH_RESULT_ENTRY:
        apos, p, st = _search_result_entry(buf, p, e, mend, f, arena, apos, sp)
    elif num == L.SEARCH_RESULT_REFERENCE:
        apos, p, st = _search_result_reference(buf, p, e, mend, f, arena, apos, sp)
    elif num == L.MODIFY_REQUEST:
        apos, p, st = _modify_request(buf, p, e, mend, f, arena, apos, sp)
    elif num == L.ADD_REQUEST:
        apos, p, st = _add_request(buf, p, e, mend, f, arena, apos, sp)
    elif num == L.MODIFY_DN_REQUEST:
        apos, p, st = _modify_dn_request(buf, p, e, mend, f, arena, apos, sp)
    elif num == L.COMPARE_REQUEST:
        apos, p, st = _compare_request(buf, p, e, mend, f, arena, apos, sp)
    elif num == L.EXTENDED_REQUEST:
        apos, p, st = _extended_request(buf, p, e, mend, f, arena, apos, sp)
    elif num == L.INTERMEDIATE_RESPONSE:
        apos, p, st = _intermediate_response(buf, p, e, mend, f, arena, apos, sp)
    else:  # responses with COMPONENTS OF LDAPResult: 1, 5, 7, 9, 11, 13, 15, 24
        apos, p, st = _response(buf, num, p, e, mend, f, arena, apos, sp)
    if st != OK:
        return apos, st
    if p != e:
        return apos, TRAILING
    return apos, OK
