"""Numba kernel of the ``ldap_sync`` frame (see :mod:`analyzer.decoders.ldap_sync` for the schema):
one pass over the LDAPMessages pass 1 of the LDAP decoder found (:mod:`.ldap_units`), reading what
replication needs and the LDAP decoder does not keep: the RFC 4533 controls (Sync Request §2.2, Sync
State §2.3, Sync Done §2.4) and the Sync Info intermediate response (§2.5), the attributes and values
of search result entries (RFC 4511 §4.5.2), modify (§4.6) and add (§4.7) requests, the
``entryCSN`` / ``entryUUID`` values among them, and Active Directory conflict DNs (``\\0ACNF:``,
MS-ADTS 3.1.1.5.5.6.2). Every read is bounds-checked by the shared BER reader; a problem sets the
message's status (first one wins) and keeps what was read before it."""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import ber
from .ber import (NULL, OK, TEXT, TRUNCATED, UNEXPECTED, bytes_equal, helper, put_slot, put_utf8, read_bool, read_int,
                  read_tlv, read_tlv_partial)
from .ldap_layout import (APP_CONSTRUCTED, APP_PRIMITIVE, BOOL, CONTROLS, ENUM, INT, K_LDAP, K_SASL_LDAP, OCTETS,
                          SEQ, SET_)
from .ldap_read import expect

# RFC 4533 §2.2 - §2.5 OIDs (the controlType / responseName octets)
SYNC_REQUEST_OID = ber.ascii_array("1.3.6.1.4.1.4203.1.9.1.1")
SYNC_STATE_OID = ber.ascii_array("1.3.6.1.4.1.4203.1.9.1.2")
SYNC_DONE_OID = ber.ascii_array("1.3.6.1.4.1.4203.1.9.1.3")
SYNC_INFO_OID = ber.ascii_array("1.3.6.1.4.1.4203.1.9.1.4")
ENTRY_CSN = ber.ascii_array("entrycsn")  # OpenLDAP operational attributes (compared case-insensitively)
ENTRY_UUID = ber.ascii_array("entryuuid")
CNF_TAG = ber.ascii_array("CNF:")  # MS-ADTS 3.1.1.5.5.6.2: "<RDN value>\nCNF:<objectGUID>"
ESC_0A = ber.ascii_array("\\0A")   # the newline as RFC 4514 escapes it in the DN string
GUID_TEXT = np.int64(36)           # "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
UUID_OCTETS = np.int64(16)         # syncUUID ::= OCTET STRING (SIZE(16)) (§2.1)
DASH = np.int64(ord("-"))
HEX = ber.ascii_array("0123456789abcdef")
# syncInfoValue CHOICE (§2.5): newcookie [0], refreshDelete [1], refreshPresent [2], syncIdSet [3]
INFO_NEWCOOKIE = ber.ctx(0, False)
INFO_REFRESH_DELETE = ber.ctx(1)
INFO_REFRESH_PRESENT = ber.ctx(2)
INFO_SYNC_ID_SET = ber.ctx(3)
IR_NAME = ber.ctx(0, False)   # IntermediateResponse responseName [0], responseValue [1] (RFC 4511 §4.13)
IR_VALUE = ber.ctx(1, False)
FNV_OFFSET = np.uint64(0xCBF29CE484222325)  # FNV-1a 64 (the value digest of an attribute)
FNV_PRIME = np.uint64(0x100000001B3)

# protocolOps read here (RFC 4511 §4.2)
OP_SEARCH_REQUEST, OP_ENTRY, OP_DONE, OP_MODIFY, OP_ADD, OP_DEL, OP_MODDN, OP_INTERMEDIATE = (
    np.int64(k) for k in (3, 4, 5, 6, 8, 10, 12, 25))

# --- field layout: ints (Q_*) and string slots (T_*) of one LDAPMessage; child rows (attributes) ------------
(Q_OP, Q_MSGID, Q_CTRL, Q_MODE, Q_RELOAD, Q_STATE, Q_INFO, Q_REFRESH_DONE, Q_REFRESH_DELETES, Q_IDS, Q_CNF,
 Q_RESULT, Q_NATTR, Q_STATUS) = (np.int64(k) for k in range(14))
N_Q = 14
(T_DN, T_UUID, T_COOKIE, T_CSN, T_UUID_ATTR, T_CNF_GUID) = (np.int64(k) for k in range(6))
N_T = 6
CTRL_REQUEST, CTRL_STATE, CTRL_DONE, CTRL_INFO = (np.int64(1 << k) for k in range(4))
C_OP, C_NVALS = np.int64(0), np.int64(1)  # child ints
N_C = 2
MAX_VALUE_TEXT = np.int64(256)  # bytes of an attribute's first value kept as text (the digest covers all)


@helper
def fail(f, status):
    """The message's first problem wins (the Q_STATUS field of this kernel's own layout)."""
    if f[Q_STATUS] == OK:
        f[Q_STATUS] = status
    return status


@helper
def _uuid(buf, s, e, arena, apos, sp, k):
    """A 16-octet syncUUID as RFC 4122 text (8-4-4-4-12, lower case); other lengths as escaped text."""
    if e - s != UUID_OCTETS:
        return put_slot(buf, s, e, arena, apos, sp, k)
    if apos < 0 or apos + GUID_TEXT > arena.shape[0]:
        return -1
    sp[2 * k] = apos
    for j in range(UUID_OCTETS):
        if j == 4 or j == 6 or j == 8 or j == 10:
            arena[apos] = DASH
            apos += 1
        b = buf[s + j]
        arena[apos] = HEX[b >> 4]
        arena[apos + 1] = HEX[b & 0xF]
        apos += 2
    sp[2 * k + 1] = GUID_TEXT
    return apos


@helper
def _cnf(buf, s, e, f, arena, apos, sp):
    """Active Directory conflict RDN in the DN ``[s, e)``: ``\\0ACNF:`` (or a raw newline before CNF:)."""
    for p in range(s, e - CNF_TAG.shape[0] + 1):
        hit = True
        for j in range(CNF_TAG.shape[0]):
            if buf[p + j] != CNF_TAG[j]:
                hit = False
                break
        if not hit:
            continue
        esc = p - s >= 3 and buf[p - 3] == ESC_0A[0] and buf[p - 2] == ESC_0A[1] and (buf[p - 1] | 0x20) == 0x61
        raw = p - s >= 1 and buf[p - 1] == 0x0A
        if esc or raw:
            f[Q_CNF] = 1
            g = p + CNF_TAG.shape[0]
            ge = g
            while ge < e and ge - g < GUID_TEXT and buf[ge] != 0x2C:  # up to the next RDN's comma
                ge += 1
            return put_slot(buf, g, ge, arena, apos, sp, T_CNF_GUID)
    return apos


@helper
def _cookie_and_flag(buf, p, e, mend, f, arena, apos, sp, flag_field):
    """``SEQUENCE { cookie OCTET STRING OPTIONAL, <flag> BOOLEAN DEFAULT ... }`` content from ``p``."""
    while p < e:
        t, cs, ce, st = read_tlv(buf, p, e, mend)
        if st != OK:
            return apos, st
        if t == OCTETS:
            apos = put_slot(buf, cs, ce, arena, apos, sp, T_COOKIE)
        elif t == BOOL:
            v, st = read_bool(buf, cs, ce)
            if st != OK:
                return apos, st
            f[flag_field] = v
        elif t == SET_:  # syncIdSet syncUUIDs (§2.5)
            n = 0
            q = cs
            while q < ce:
                t2, a, b, st = read_tlv(buf, q, ce, mend)
                if st != OK:
                    return apos, st
                if t2 != OCTETS:
                    return apos, UNEXPECTED
                n += 1
                q = b
            f[Q_IDS] = n
        else:
            return apos, UNEXPECTED
        p = ce
    return apos, OK


@helper
def _sync_info(buf, s, e, mend, f, arena, apos, sp):
    """syncInfoValue (RFC 4533 §2.5) in ``[s, e)``."""
    t, cs, ce, st = read_tlv(buf, s, e, mend)
    if st != OK:
        return apos, st
    if t == INFO_NEWCOOKIE:
        f[Q_INFO] = 0
        return put_slot(buf, cs, ce, arena, apos, sp, T_COOKIE), OK
    if t == INFO_REFRESH_DELETE or t == INFO_REFRESH_PRESENT:
        f[Q_INFO] = 1 if t == INFO_REFRESH_DELETE else 2
        f[Q_REFRESH_DONE] = 1  # refreshDone BOOLEAN DEFAULT TRUE
        return _cookie_and_flag(buf, cs, ce, mend, f, arena, apos, sp, Q_REFRESH_DONE)
    if t == INFO_SYNC_ID_SET:
        f[Q_INFO] = 3
        f[Q_REFRESH_DELETES] = 0
        return _cookie_and_flag(buf, cs, ce, mend, f, arena, apos, sp, Q_REFRESH_DELETES)
    return apos, UNEXPECTED


@helper
def _control_value(buf, kind, s, e, mend, f, arena, apos, sp):
    """controlValue of a Sync Request / State / Done control (RFC 4533 §2.2 - §2.4) in ``[s, e)``."""
    ss, se, p, st = expect(buf, s, e, mend, SEQ)
    if st != OK:
        return apos, st
    if kind == CTRL_DONE:
        f[Q_REFRESH_DELETES] = 0
        return _cookie_and_flag(buf, ss, se, mend, f, arena, apos, sp, Q_REFRESH_DELETES)
    cs, ce, p, st = expect(buf, ss, se, mend, ENUM)
    if st != OK:
        return apos, st
    v, st = read_int(buf, cs, ce)
    if st != OK:
        return apos, st
    if kind == CTRL_REQUEST:
        f[Q_MODE] = v
        f[Q_RELOAD] = 0
        return _cookie_and_flag(buf, p, se, mend, f, arena, apos, sp, Q_RELOAD)
    f[Q_STATE] = v
    us, ue, p, st = expect(buf, p, se, mend, OCTETS)
    if st != OK:
        return apos, st
    apos = _uuid(buf, us, ue, arena, apos, sp, T_UUID)
    if p < se:
        cs, ce, p, st = expect(buf, p, se, mend, OCTETS)
        if st != OK:
            return apos, st
        apos = put_slot(buf, cs, ce, arena, apos, sp, T_COOKIE)
    return apos, OK


@helper
def _controls(buf, p, e, mend, f, arena, apos, sp):
    """Controls [0] (RFC 4511 §4.1.11) content from ``p``: the RFC 4533 ones are read."""
    while p < e:
        xs, xe, p, st = expect(buf, p, e, mend, SEQ)
        if st != OK:
            return apos, st
        ts_, te, q, st = expect(buf, xs, xe, mend, OCTETS)
        if st != OK:
            return apos, st
        kind = np.int64(0)
        if bytes_equal(buf, ts_, te, SYNC_REQUEST_OID, False):
            kind = CTRL_REQUEST
        elif bytes_equal(buf, ts_, te, SYNC_STATE_OID, False):
            kind = CTRL_STATE
        elif bytes_equal(buf, ts_, te, SYNC_DONE_OID, False):
            kind = CTRL_DONE
        if kind == 0:
            continue
        f[Q_CTRL] |= kind
        while q < xe:  # criticality BOOLEAN DEFAULT FALSE, controlValue OCTET STRING OPTIONAL
            t, cs, ce, st = read_tlv(buf, q, xe, mend)
            if st != OK:
                return apos, st
            q = ce
            if t == OCTETS:
                apos, st = _control_value(buf, kind, cs, ce, mend, f, arena, apos, sp)
                if st != OK or apos < 0:
                    return apos, st
            elif t != BOOL:
                return apos, UNEXPECTED
    return apos, OK


@helper
def _attributes(buf, p, e, mend, row, modify, f, arena, apos, sp, c_row, c_ints, c_hash, c_spans, nc):
    """``SEQUENCE OF PartialAttribute`` (entries, add) or of ``change`` (modify) content from ``p``: one
    child row each (name, operation, value count and FNV-1a digest, the first value as text). Returns
    (apos, nc, status); nc -1: the child arrays are full."""
    while p < e:
        xs, xe, p, st = expect(buf, p, e, mend, SEQ)
        if st != OK:
            return apos, nc, st
        op = np.int64(-1)
        q = xs
        if modify:
            cs, ce, q, st = expect(buf, q, xe, mend, ENUM)
            if st != OK:
                return apos, nc, st
            op, st = read_int(buf, cs, ce)
            if st != OK:
                return apos, nc, st
            xs, xe, q, st = expect(buf, q, xe, mend, SEQ)
            if st != OK:
                return apos, nc, st
            q = xs
        ns, ne, q, st = expect(buf, q, xe, mend, OCTETS)
        if st != OK:
            return apos, nc, st
        if nc >= c_row.shape[0]:
            return apos, -1, OK
        c_row[nc] = row
        c_ints[C_OP, nc] = op
        c_spans[0, nc] = apos
        apos = put_utf8(arena, apos, buf, ns, ne - ns, TEXT)
        if apos < 0:
            return -1, nc, OK
        c_spans[1, nc] = apos - c_spans[0, nc]
        c_spans[2, nc] = -1
        c_spans[3, nc] = -1
        h = FNV_OFFSET
        nv = 0
        vst = OK
        if q < xe:
            t, vs, ve, vst = read_tlv_partial(buf, q, xe, mend)
            if vst == OK and t != SET_:
                vst = UNEXPECTED
            r = vs
            while vst == OK and r < ve:
                t2, a, b, vst = read_tlv(buf, r, ve, mend)
                if vst != OK:
                    break
                if t2 != OCTETS:
                    vst = UNEXPECTED
                    break
                n = b - a
                for j in range(4):  # the value's length, then its octets
                    h = (h ^ np.uint64((n >> (8 * j)) & 0xFF)) * FNV_PRIME
                for j in range(a, b):
                    h = (h ^ np.uint64(buf[j])) * FNV_PRIME
                if nv == 0:
                    c_spans[2, nc] = apos
                    apos = put_utf8(arena, apos, buf, a, min(n, MAX_VALUE_TEXT), TEXT)
                    if apos < 0:
                        return -1, nc, OK
                    c_spans[3, nc] = apos - c_spans[2, nc]
                    if bytes_equal(buf, ns, ne, ENTRY_CSN, True):
                        apos = put_slot(buf, a, b, arena, apos, sp, T_CSN)
                    elif bytes_equal(buf, ns, ne, ENTRY_UUID, True):
                        apos = put_slot(buf, a, b, arena, apos, sp, T_UUID_ATTR)
                    if apos < 0:
                        return -1, nc, OK
                nv += 1
                r = b
        c_ints[C_NVALS, nc] = nv
        c_hash[nc] = h
        nc += 1
        f[Q_NATTR] += 1
        if vst != OK:
            return apos, nc, vst
    return apos, nc, OK


@helper
def _may_replicate(buf, p, e, mend):
    """Whether the attribute list (``SEQUENCE OF PartialAttribute``) of a searchResultEntry at ``p``
    names ``entryCSN`` or ``entryUUID``, or cannot be walked: without that, a Sync State control or a
    conflict DN the entry is not an ``ldap_sync`` row, and its values need no reading (digests, text)."""
    ls, le, q, st = expect(buf, p, e, mend, SEQ)
    if st != OK:
        return True
    q = ls
    while q < le:
        xs, xe, q, st = expect(buf, q, le, mend, SEQ)
        if st != OK:
            return True
        ns, ne, r, st = expect(buf, xs, xe, mend, OCTETS)
        if st != OK or bytes_equal(buf, ns, ne, ENTRY_CSN, True) or bytes_equal(buf, ns, ne, ENTRY_UUID, True):
            return True
    return False


@helper
def _one(buf, s, mend, row, f, sp, arena, apos, c_row, c_ints, c_hash, c_spans, nc):
    """One LDAPMessage at ``s``. Returns (apos, nc): -1 when the arena / the child arrays are full."""
    t, cs, ce, st = read_tlv(buf, s, mend, mend)
    if st == TRUNCATED and cs > s and t == SEQ:
        fail(f, TRUNCATED)
    elif st != OK or t != SEQ:
        fail(f, st if st != OK else UNEXPECTED)
        return apos, nc
    ms, me, p, st = expect(buf, cs, ce, mend, INT)
    if st != OK:
        fail(f, st)
        return apos, nc
    v, st = read_int(buf, ms, me)
    if st != OK:
        fail(f, st)
        return apos, nc
    f[Q_MSGID] = v
    t2, os_, oe, st = read_tlv_partial(buf, p, ce, mend)
    if st != OK:
        fail(f, st)
        return apos, nc
    cls = t2 >> ber.TAG_CLASS_SHIFT
    if cls != APP_CONSTRUCTED and cls != APP_PRIMITIVE:
        fail(f, UNEXPECTED)
        return apos, nc
    num = np.int64(t2 & ber.TAG_NUMBER_MASK)
    f[Q_OP] = num
    st = OK
    if num == OP_DEL:
        apos = put_slot(buf, os_, oe, arena, apos, sp, T_DN)
    elif num == OP_INTERMEDIATE:
        q = os_
        info = False
        while q < oe:
            t3, a, b, st = read_tlv(buf, q, oe, mend)
            if st != OK:
                break
            q = b
            if t3 == IR_NAME:
                info = bytes_equal(buf, a, b, SYNC_INFO_OID, False)
                if info:
                    f[Q_CTRL] |= CTRL_INFO
            elif t3 == IR_VALUE and info:
                apos, st = _sync_info(buf, a, b, mend, f, arena, apos, sp)
                if st != OK:
                    break
    elif num == OP_DONE:
        ls, le, q, st = expect(buf, os_, oe, mend, ENUM)
        if st == OK:
            v, st = read_int(buf, ls, le)
            f[Q_RESULT] = v
    elif (num == OP_SEARCH_REQUEST or num == OP_ENTRY or num == OP_MODIFY or num == OP_ADD
          or num == OP_MODDN) and cls == APP_CONSTRUCTED:
        ds, de, q, st = expect(buf, os_, oe, mend, OCTETS)
        if st == OK:
            apos = put_slot(buf, ds, de, arena, apos, sp, T_DN)
            if num == OP_ENTRY:
                apos = _cnf(buf, ds, de, f, arena, apos, sp)
                if f[Q_CNF] == 0 and oe >= ce and not _may_replicate(buf, q, oe, mend):
                    return apos, nc  # an entry the frame leaves out: its values are not read
            if num == OP_ENTRY or num == OP_MODIFY or num == OP_ADD:
                f[Q_NATTR] = 0
                ls, le, q, st = expect(buf, q, oe, mend, SEQ)
                if st == OK and apos >= 0:
                    apos, nc, st = _attributes(buf, ls, le, mend, row, num == OP_MODIFY, f, arena, apos, sp,
                                               c_row, c_ints, c_hash, c_spans, nc)
    if apos < 0 or nc < 0:
        return apos, nc
    if st != OK:
        fail(f, st)
        return apos, nc
    if oe < ce:
        t3, ls, le, st = read_tlv_partial(buf, oe, ce, mend)
        if st != OK:
            fail(f, st)
        elif t3 == CONTROLS:
            apos, st = _controls(buf, ls, le, mend, f, arena, apos, sp)
            if st != OK:
                fail(f, st)
    return apos, nc


@helper
def _kept(f, sp):
    """Whether the message just read is an ``ldap_sync`` row (the list in analyzer/decoders/ldap_sync.py)."""
    op = f[Q_OP]
    ctrl = f[Q_CTRL]
    if op == OP_SEARCH_REQUEST:
        return (ctrl & CTRL_REQUEST) != 0
    if op == OP_ENTRY:
        return (ctrl & CTRL_STATE) != 0 or sp[2 * T_CSN + 1] >= 0 or sp[2 * T_UUID_ATTR + 1] >= 0 or f[Q_CNF] == 1
    if op == OP_DONE:
        return (ctrl & CTRL_DONE) != 0
    if op == OP_INTERMEDIATE:
        return (ctrl & CTRL_INFO) != 0
    return op == OP_MODIFY or op == OP_ADD or op == OP_DEL or op == OP_MODDN


@njit(cache=True)
def sync_decode(buf, u_start, u_end, u_kind, ints, spans, rows, arena, c_row, c_ints, c_hash, c_spans):
    """Every LDAPMessage unit; the frame's rows (:func:`_kept`) → ``rows`` (their unit numbers), ``ints``
    (N_Q, rows) / ``spans`` (2 N_T, rows), back to back from column 0, and attribute child rows.
    Returns (arena bytes used, child rows, frame rows); the first two -1 when their arrays were too
    small (grow, run again)."""
    f = np.empty(N_Q, np.int64)
    sp = np.empty(2 * N_T, np.int64)
    apos = np.int64(0)
    nc = np.int64(0)
    kept = np.int64(0)
    for i in range(u_start.shape[0]):
        f[:] = NULL
        f[Q_STATUS] = OK
        f[Q_CTRL] = 0
        f[Q_CNF] = 0
        sp[:] = -1
        if u_kind[i] == K_LDAP or u_kind[i] == K_SASL_LDAP:
            apos, nc = _one(buf, u_start[i], u_end[i], i, f, sp, arena, apos, c_row, c_ints, c_hash, c_spans, nc)
            if apos < 0 or nc < 0:
                return apos, nc, kept
        if _kept(f, sp):
            rows[kept] = i
            ints[:, kept] = f
            spans[:, kept] = sp
            kept += 1
    return apos, nc, kept
