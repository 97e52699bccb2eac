"""Numba kernels of the DNS decoder: one pass over each message (RFC 1035 §4.1, RFC 6891 §6.1).

A message is ``buf[base:end]``; ``wire_end`` is where it would end had nothing been cut (snapshot
length, missing fragment). Every read is checked against ``end``. What is decoded per message:

- the header (§4.1.1): id, flags, the four counts;
- the first question (§4.1.2): its name rendered into the text arena, qtype, qclass. Further
  questions are skipped;
- every resource record (§4.1.3) of the answer, authority and additional sections: owner name
  skipped (not followed: only the question name is rendered and its pointers checked), TYPE, CLASS,
  TTL, RDLENGTH. From them: the minimum TTL of the answer RRs, how many answer RRs have the
  question's type, the first SOA of the authority section (its TTL and MINIMUM, RFC 2308 §5) and
  the OPT pseudo-RR (RFC 6891 §6.1.2-6.1.3: UDP payload size in CLASS, extended RCODE, version
  and DO in TTL).

Name compression (§4.1.4) is loop-safe by construction: a pointer must point strictly before the
start of the label run it ends (so pointer targets strictly decrease and a chain ends), at most
``MAX_POINTERS`` are followed, and a name longer than 255 octets (§2.3.4, counting length octets
and the root) is an error. The work per name is therefore bounded by 255 label octets plus 128
pointer hops whatever the message says.

Counts are never trusted for allocation: sections are walked while bytes remain, each question
takes at least 5 bytes and each RR at least 11, so absurd counts end in a ``truncated`` error after
at most ``length / 5`` steps.

Fields go through an int64 vector (``F_*``) filled per message and stored once, as in
``analyzer/kernels/headers.py``.
"""
import numpy as np

from ..jit import njit
from ..kernels.wire import u16be, u32be
from .text import put_escaped

# Per-message field vector.
(F_ID, F_FLAGS, F_QDCOUNT, F_ANCOUNT, F_NSCOUNT, F_ARCOUNT, F_QNAME_START, F_QNAME_LEN, F_QTYPE,
 F_QCLASS, F_TTL_MIN, F_AN_QTYPE, F_SOA_TTL, F_SOA_MINIMUM, F_EDNS_SIZE, F_EDNS_TTL, F_PRESENT,
 F_ERROR) = range(18)
N_FIELDS = 18

# Bits of F_PRESENT: which optional fields were decoded.
P_HEADER = 1
P_QNAME = 2
P_QTYPE = 4  # qtype and qclass
P_TTL_MIN = 8  # at least one answer RR (other than OPT) had its TTL read
P_SOA = 16  # an SOA in the authority section with its MINIMUM read
P_EDNS = 32  # an OPT RR in the additional section

# Decode errors: index into dns.DECODE_ERRORS (0 = none).
E_NONE = 0
E_TRUNC_HEADER = 1
E_TRUNC_QUESTION = 2
E_TRUNC_RR = 3
E_POINTER_LOOP = 4
E_FORWARD_POINTER = 5
E_POINTER_OOB = 6
E_LABEL_TYPE = 7
E_NAME_TOO_LONG = 8
E_MISPLACED_OPT = 9
E_MULTIPLE_OPT = 10
E_TRUNCATED = 100  # internal: "ran out of bytes", mapped to the section's truncation error
E_ARENA_FULL = 101  # internal: the text arena needs to grow

# RFC 1035 §4.1.1 header: ID, flags, QDCOUNT, ANCOUNT, NSCOUNT, ARCOUNT (2 octets each)
HDR_ID, HDR_FLAGS, HDR_QDCOUNT, HDR_ANCOUNT, HDR_NSCOUNT, HDR_ARCOUNT = 0, 2, 4, 6, 8, 10
HEADER = 12
# §4.1.2 question after QNAME: QTYPE, QCLASS
Q_TYPE, Q_CLASS = 0, 2
QUESTION_FIXED = 4
# §4.1.3 RR after NAME: TYPE, CLASS, TTL, RDLENGTH, then RDATA
RR_TYPE, RR_CLASS, RR_TTL, RR_RDLENGTH = 0, 2, 4, 8
RR_FIXED = 10
# §3.3.13 SOA RDATA after MNAME and RNAME: SERIAL REFRESH RETRY EXPIRE MINIMUM (4 octets each)
SOA_MINIMUM = 16
SOA_FIXED = 20
# §4.1.4 a length octet's top two bits: 00 label, 11 pointer (the other 14 bits an offset)
LABEL_KIND = 0xC0
LABEL_POINTER = 0xC0
POINTER_HIGH = 0x3F
POINTER_SIZE = 2
DOT = 0x2E
# sections of the RRs, in order (§4.1)
ANSWER, AUTHORITY, ADDITIONAL = 0, 1, 2

T_SOA = 6
T_OPT = 41
T_ANY = 255
MAX_NAME = 255  # RFC 1035 §2.3.4: octets, length octets and the root label included
MAX_POINTERS = 128  # a 255-octet name has at most 127 labels, each ended by at most one pointer

_ROOT = np.frombuffer(b"<Root>", dtype=np.uint8)


@njit(cache=True, _nrt=False)
def read_name(buf, base, end, wire_end, pos, arena, apos):
    """Render the name at ``pos`` into ``arena`` from ``apos`` (Wireshark's ``dns.qry.name`` form:
    labels joined by '.', the root alone as ``<Root>``, unprintable bytes escaped).

    Returns (position after the name in the message, new arena position, error). On error the
    arena position is meaningless and the caller discards what was written.
    """
    seg_start = pos  # start of the current run of labels; a pointer must land strictly before it
    after = np.int64(-1)  # where the message continues: after the first pointer or the root label
    wire = np.int64(0)
    hops = 0
    out = apos
    while True:
        if pos >= end:
            return -1, out, E_TRUNCATED
        b = np.int64(buf[pos])
        if b == 0:
            if after < 0:
                after = pos + 1
            if out == apos:
                for k in range(_ROOT.shape[0]):
                    if out >= arena.shape[0]:
                        return -1, out, E_ARENA_FULL
                    arena[out] = _ROOT[k]
                    out += 1
            return after, out, E_NONE
        kind = b & LABEL_KIND
        if kind == LABEL_POINTER:
            if pos + 1 >= end:
                return -1, out, E_TRUNCATED
            target = base + (((b & POINTER_HIGH) << 8) | np.int64(buf[pos + 1]))
            if after < 0:
                after = pos + POINTER_SIZE
            if target >= wire_end:
                return -1, out, E_POINTER_OOB
            if target > pos:
                return -1, out, E_FORWARD_POINTER
            if target >= seg_start:
                return -1, out, E_POINTER_LOOP
            hops += 1
            if hops > MAX_POINTERS:
                return -1, out, E_POINTER_LOOP
            seg_start = target
            pos = target
            continue
        if kind != 0:
            return -1, out, E_LABEL_TYPE  # 01/10: extended (RFC 6891 §5) or reserved label types
        wire += b + 1
        if wire + 1 > MAX_NAME:
            return -1, out, E_NAME_TOO_LONG
        if pos + 1 + b > end:
            return -1, out, E_TRUNCATED
        if out != apos:
            if out >= arena.shape[0]:
                return -1, out, E_ARENA_FULL
            arena[out] = DOT
            out += 1
        out = put_escaped(arena, out, buf, pos + 1, b)
        if out < 0:
            return -1, out, E_ARENA_FULL
        pos += 1 + b


@njit(cache=True, _nrt=False)
def skip_name(buf, pos, end):
    """Position after the (possibly compressed) name at ``pos``, without following pointers, or a
    negative error: -E_TRUNCATED, -E_LABEL_TYPE, -E_NAME_TOO_LONG."""
    wire = np.int64(0)
    while True:
        if pos >= end:
            return -E_TRUNCATED
        b = np.int64(buf[pos])
        if b == 0:
            return pos + 1
        kind = b & LABEL_KIND
        if kind == LABEL_POINTER:
            if pos + POINTER_SIZE > end:
                return -E_TRUNCATED
            return pos + POINTER_SIZE
        if kind != 0:
            return -E_LABEL_TYPE
        wire += b + 1
        if wire + 1 > MAX_NAME:
            return -E_NAME_TOO_LONG
        pos += 1 + b


@njit(cache=True, _nrt=False)
def _soa_minimum(buf, rd, rd_end):
    """MINIMUM of an SOA RDATA (MNAME RNAME SERIAL REFRESH RETRY EXPIRE MINIMUM), or -1."""
    p = skip_name(buf, rd, rd_end)
    if p < 0:
        return -1
    p = skip_name(buf, p, rd_end)
    if p < 0 or p + SOA_FIXED > rd_end:
        return -1
    return u32be(buf, p + SOA_MINIMUM)


@njit(cache=True, _nrt=False)
def decode_message(buf, base, end, wire_end, arena, apos, f):
    """Decode one message into the zeroed field vector ``f``; returns the new arena position, or
    -1 when the arena is full (nothing of this message is kept; grow and call again)."""
    if end - base < HEADER:
        f[F_ERROR] = E_TRUNC_HEADER
        return apos
    f[F_ID] = u16be(buf, base + HDR_ID)
    f[F_FLAGS] = u16be(buf, base + HDR_FLAGS)
    qdcount = u16be(buf, base + HDR_QDCOUNT)
    ancount = u16be(buf, base + HDR_ANCOUNT)
    nscount = u16be(buf, base + HDR_NSCOUNT)
    arcount = u16be(buf, base + HDR_ARCOUNT)
    f[F_QDCOUNT] = qdcount
    f[F_ANCOUNT] = ancount
    f[F_NSCOUNT] = nscount
    f[F_ARCOUNT] = arcount
    present = P_HEADER
    pos = base + HEADER

    # Questions (§4.1.2): the first is rendered, the others skipped.
    qtype = np.int64(-1)
    for q in range(qdcount):
        if q == 0:
            nxt, out, err = read_name(buf, base, end, wire_end, pos, arena, apos)
            if err == E_ARENA_FULL:
                return -1
            if err != E_NONE:
                f[F_ERROR] = E_TRUNC_QUESTION if err == E_TRUNCATED else err
                f[F_PRESENT] = present
                return apos
            f[F_QNAME_START] = apos
            f[F_QNAME_LEN] = out - apos
            present |= P_QNAME
            apos = out
        else:
            nxt = skip_name(buf, pos, end)
            if nxt < 0:
                f[F_ERROR] = E_TRUNC_QUESTION if nxt == -E_TRUNCATED else -nxt
                f[F_PRESENT] = present
                return apos
        if nxt + QUESTION_FIXED > end:
            f[F_ERROR] = E_TRUNC_QUESTION
            f[F_PRESENT] = present
            return apos
        if q == 0:
            qtype = u16be(buf, nxt + Q_TYPE)
            f[F_QTYPE] = qtype
            f[F_QCLASS] = u16be(buf, nxt + Q_CLASS)
            present |= P_QTYPE
        pos = nxt + QUESTION_FIXED

    # Resource records (§4.1.3) of the three sections, in order.
    ttl_min = np.int64(-1)
    an_qtype = 0
    error = E_NONE
    n_rr = ancount + nscount + arcount
    for k in range(n_rr):
        section = ANSWER if k < ancount else (AUTHORITY if k < ancount + nscount else ADDITIONAL)
        p = skip_name(buf, pos, end)
        if p < 0:
            error = E_TRUNC_RR if p == -E_TRUNCATED else -p
            break
        if p + RR_FIXED > end:
            error = E_TRUNC_RR
            break
        rtype = u16be(buf, p + RR_TYPE)
        rclass = u16be(buf, p + RR_CLASS)
        ttl = u32be(buf, p + RR_TTL)
        rdlen = u16be(buf, p + RR_RDLENGTH)
        rd = p + RR_FIXED
        rd_end = rd + rdlen
        if rtype == T_OPT:
            if section != ADDITIONAL:
                if error == E_NONE:
                    error = E_MISPLACED_OPT
            elif present & P_EDNS:
                if error == E_NONE:
                    error = E_MULTIPLE_OPT
            else:
                f[F_EDNS_SIZE] = rclass
                f[F_EDNS_TTL] = ttl
                present |= P_EDNS
        elif section == ANSWER:
            # The TTL counts as soon as the fixed part is read, as Wireshark shows it even when
            # the RDATA is cut.
            if ttl_min < 0 or ttl < ttl_min:
                ttl_min = ttl
            if rtype == qtype or qtype == T_ANY:
                an_qtype += 1
        if rd_end > end:
            error = E_TRUNC_RR
            break
        if rtype == T_SOA and section == AUTHORITY and not (present & P_SOA):
            minimum = _soa_minimum(buf, rd, rd_end)
            if minimum >= 0:
                f[F_SOA_TTL] = ttl
                f[F_SOA_MINIMUM] = minimum
                present |= P_SOA
        pos = rd_end
    if ttl_min >= 0:
        f[F_TTL_MIN] = ttl_min
        present |= P_TTL_MIN
    f[F_AN_QTYPE] = an_qtype
    f[F_ERROR] = error
    f[F_PRESENT] = present
    return apos


# The output columns, one 2-D array [column, message] per dtype, and the field each column takes:
# (name in dns._decode_set, F_*). Each column is a contiguous row of its array.
OUTPUT = (
    (np.uint16, (("id", F_ID), ("flags", F_FLAGS), ("qd", F_QDCOUNT), ("an", F_ANCOUNT), ("ns", F_NSCOUNT),
                 ("ar", F_ARCOUNT), ("qtype", F_QTYPE), ("qclass", F_QCLASS), ("an_qtype", F_AN_QTYPE),
                 ("edns_size", F_EDNS_SIZE))),
    (np.uint32, (("ttl_min", F_TTL_MIN), ("soa_ttl", F_SOA_TTL), ("soa_min", F_SOA_MINIMUM),
                 ("edns_ttl", F_EDNS_TTL))),
    (np.int64, (("qname_start", F_QNAME_START), ("qname_len", F_QNAME_LEN))),
    (np.uint8, (("present", F_PRESENT), ("error", F_ERROR))),
)
OUT_U16, OUT_U32, OUT_I64, OUT_U8 = (np.array([fld for _, fld in cols], np.int64) for _, cols in OUTPUT)
assert sorted(fld for _, cols in OUTPUT for _, fld in cols) == list(range(N_FIELDS))


def allocate_output(n: int) -> tuple[tuple[np.ndarray, ...], dict[str, np.ndarray]]:
    """The arrays :func:`decode_all` fills for ``n`` messages, and each column by name (a row view)."""
    arrays = tuple(np.zeros((len(cols), n), dtype) for dtype, cols in OUTPUT)
    named = {name: arr[r] for arr, (_, cols) in zip(arrays, OUTPUT) for r, (name, _) in enumerate(cols)}
    return arrays, named


@njit(cache=True)
def decode_all(buf, offset, length, wire_length, first, arena, apos, o_u16, o_u32, o_i64, o_u8):
    """Decode messages ``first..`` into the output arrays (:func:`allocate_output`). Returns (next
    message, arena position): next < len(offset) means the arena filled up at that message."""
    f = np.zeros(N_FIELDS, np.int64)
    n = offset.shape[0]
    for i in range(first, n):
        f[:] = 0
        base = offset[i]
        end = base + np.int64(length[i])
        wire_end = base + max(np.int64(wire_length[i]), np.int64(length[i]))
        out = decode_message(buf, base, end, wire_end, arena, apos, f)
        if out < 0:
            return i, apos
        apos = out
        for r in range(OUT_U16.shape[0]):
            o_u16[r, i] = f[OUT_U16[r]]
        for r in range(OUT_U32.shape[0]):
            o_u32[r, i] = f[OUT_U32[r]]
        for r in range(OUT_I64.shape[0]):
            o_i64[r, i] = f[OUT_I64[r]]
        for r in range(OUT_U8.shape[0]):
            o_u8[r, i] = f[OUT_U8[r]]
    return n, apos


# Roles of messages in transactions (dns.ROLES names them).
R_NONE = -1  # no header: takes no part
R_REQUEST = 0  # a query that opens a transaction
R_RETRANSMISSION = 1  # the same query again before an answer, within the retransmission window
R_ANSWER = 2  # the first response to an open transaction
R_DUPLICATE = 3  # a further response to an answered transaction
R_UNSOLICITED = 4  # a response with no open transaction (or later than the timeout)

# Rows of assign_roles' per-transaction output (one column per transaction).
TX_REQ_ROW, TX_ANS_ROW, TX_RETRIES, TX_DUPLICATES, TX_LAST_QUERY = range(5)
N_TX = 5

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _mix(h, v):
    h = (h ^ np.uint64(v)) * _MIX
    return h ^ (h >> np.uint64(29))


@njit(cache=True, inline="always")
def _same_key(keys, q_off, q_data, q_valid, a, b):
    for c in range(keys.shape[1]):
        if keys[a, c] != keys[b, c]:
            return False
    if q_valid[a] != q_valid[b]:
        return False
    if not q_valid[a]:
        return True
    la = q_off[a + 1] - q_off[a]
    if la != q_off[b + 1] - q_off[b]:
        return False
    pa = q_off[a]
    pb = q_off[b]
    for j in range(la):
        if q_data[pa + j] != q_data[pb + j]:
            return False
    return True


@njit(cache=True)
def assign_roles(order, keys, q_off, q_data, q_valid, is_query, ts, retransmission_window_ns, timeout_ns,
                 txn, role, txns):
    """Pair the messages ``order`` (row numbers, in time order) by their key: the integer columns of
    ``keys`` plus the question name (Arrow string buffers ``q_off``/``q_data``, null where not
    ``q_valid``). One pass with a hash table of open transactions, one slot per distinct key.

    A query opens a transaction unless the key's current transaction is unanswered and began less
    than ``retransmission_window_ns`` before it (then it is a retransmission, as Wireshark's
    ``dns.retransmission_timer``). A response to an answered transaction is a duplicate (however
    late: Wireshark's ``dns.retransmit_response``); to an unanswered one, it is the answer if it
    comes at most ``timeout_ns`` after the transaction's latest query. Anything else is
    unsolicited.

    Per row: ``txn`` (-1: none) and ``role`` (R_*). Per transaction, a column of ``txns`` (rows
    ``TX_*``): its first query's row, its answer's row (-1), retransmission and duplicate counts,
    latest query time. Returns the number of transactions."""
    n = order.shape[0]
    size = 1
    while size < 2 * n + 2:
        size *= 2
    mask = np.uint64(size - 1)
    # one row per slot, one cache line: key hash, latest row with the key (-1: empty), the key's
    # current transaction, that transaction's first query time
    slots = np.full((size, 4), -1, np.int64)
    n_txn = 0
    for i in range(n):
        r = order[i]
        h = _FNV_OFFSET
        for c in range(keys.shape[1]):
            h = _mix(h, keys[r, c])
        if q_valid[r]:
            for j in range(q_off[r], q_off[r + 1]):
                h = (h ^ np.uint64(q_data[j])) * _FNV_PRIME
        hs = np.int64(h)
        s = h & mask
        while slots[s, 1] >= 0 and not (slots[s, 0] == hs
                                        and _same_key(keys, q_off, q_data, q_valid, slots[s, 1], r)):
            s = (s + np.uint64(1)) & mask
        if slots[s, 1] < 0:
            slots[s, 0] = hs
        slots[s, 1] = r  # the latest row: the next comparison is likely in cache
        t = ts[r]
        cur = slots[s, 2]
        if is_query[r]:
            if cur >= 0 and txns[TX_ANS_ROW, cur] < 0 and t - slots[s, 3] < retransmission_window_ns:
                txn[r] = cur
                role[r] = R_RETRANSMISSION
                txns[TX_RETRIES, cur] += 1
                txns[TX_LAST_QUERY, cur] = t
            else:
                cur = n_txn
                n_txn += 1
                slots[s, 2] = cur
                slots[s, 3] = t
                txns[TX_REQ_ROW, cur] = r
                txns[TX_ANS_ROW, cur] = -1
                txns[TX_LAST_QUERY, cur] = t
                txn[r] = cur
                role[r] = R_REQUEST
        elif cur >= 0 and txns[TX_ANS_ROW, cur] >= 0:
            txn[r] = cur
            role[r] = R_DUPLICATE
            txns[TX_DUPLICATES, cur] += 1
        elif cur >= 0 and t - txns[TX_LAST_QUERY, cur] <= timeout_ns:
            txn[r] = cur
            role[r] = R_ANSWER
            txns[TX_ANS_ROW, cur] = r
        else:
            txn[r] = -1
            role[r] = R_UNSOLICITED
    return n_txn
