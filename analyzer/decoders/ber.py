"""A BER/DER reader (ITU-T X.690) for Numba kernels, shared by the Kerberos and LDAP decoders.

Kerberos messages are DER (RFC 4120 §5.1); LDAP messages are BER with the restrictions of RFC 4511
§5.1 (definite lengths only, OCTET STRINGs primitive). Both are read with the same primitives:

- :func:`read_tlv` reads one identifier/length header (X.690 §8.1.2 identifier octets, low- and
  high-tag-number form; §8.1.3 length octets, short form and long form of up to 4 octets) and
  checks that the content fits both the enclosing TLV and the bytes of the message.
- :func:`read_int`, :func:`read_bool`, :func:`read_bits32`, :func:`read_time` decode primitive
  contents (INTEGER/ENUMERATED §8.3/§8.4, BOOLEAN §8.2, BIT STRING §8.6, GeneralizedTime §11.7).
- :func:`walk` checks a whole TLV tree iteratively with a nesting cap (the decoders only descend
  where their ASN.1 goes; ``walk`` is the generic check, and what the tests drive with random bytes).

A tag is packed into one integer: ``(identifier octet & 0xE0) << 24 | tag number`` (class and
constructed bits on top, the number below; numbers are capped at 2**28 - 1). Build constants with
:func:`tag`, :func:`ctx`, :func:`app` or :func:`ident` (from a one-octet identifier such as 0x30);
Numba folds module-level integers into the kernels as constants.

Indefinite length (0x80) is reported as :data:`INDEFINITE`: DER forbids it and so does LDAP
(RFC 4511 §5.1 "Only the definite form of length encoding is used"), so both decoders treat it as a
decode error. Non-minimal long-form lengths (``84 00 00 00 05``) are accepted: BER allows them and
Active Directory sends them in every LDAP message.

Every reader returns a status; no reader raises, reads outside ``[pos, mend)`` or loops without
consuming input.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from ..jit import njit
from ..columns import series
from .text import HEX_DIGITS, arena_strings

# --- statuses (decode_error reasons) -------------------------------------------------------------
# Constants handed to kernels are np.int64, not int: Numba compiles a separate specialisation of a
# function for every distinct *literal* int argument, which multiplied the cold compile time.
OK = np.int64(0)
TRUNCATED = np.int64(1)  # a TLV runs past the bytes available for the message (snapshot length, short message)
BAD_LENGTH = np.int64(2)  # a TLV runs past its enclosing TLV; a length of 5+ octets; the reserved 0xFF octet
INDEFINITE = np.int64(3)  # indefinite length: not allowed by DER nor by LDAP (RFC 4511 §5.1)
BAD_TAG = np.int64(4)  # high-tag-number form with a tag number of 2**28 or more
UNEXPECTED = np.int64(5)  # a TLV other than the one the ASN.1 definition requires here
TOO_DEEP = np.int64(6)  # nesting deeper than the cap (filters, walk)
BAD_INTEGER = np.int64(7)  # INTEGER/ENUMERATED/BOOLEAN content empty or too long for int64
MISSING = np.int64(8)  # a required component is absent
TRAILING = np.int64(9)  # bytes after the last TLV of a message
NOT_PROTOCOL = np.int64(10)  # the first TLV is not a message of this protocol
BAD_VALUE = np.int64(11)  # a value outside its range (msg-type, bit string unused bits ...)
ARENA_FULL = np.int64(99)  # internal: the string arena is full; the Python wrapper grows it and runs again

STATUS_NAMES = {int(k): v for k, v in {
    TRUNCATED: "truncated", BAD_LENGTH: "bad length", INDEFINITE: "indefinite length",
    BAD_TAG: "bad tag", UNEXPECTED: "unexpected tag", TOO_DEEP: "too deep",
    BAD_INTEGER: "bad integer", MISSING: "missing field", TRAILING: "trailing bytes",
    NOT_PROTOCOL: "not this protocol", BAD_VALUE: "bad value",
}.items()}

MAX_DEPTH = 64  # nesting cap of walk(); the LDAP filter renderer has its own (ldap.MAX_FILTER_DEPTH)
NULL = np.iinfo(np.int64).min  # "absent" in the int64 field vectors of the decoders

# Per-message helpers are compiled without the Numba runtime's reference counting (``_nrt=False``):
# with it, every call increments and decrements (atomically) the refcount of each array argument,
# which made a call cost ~40 ns per array and dominated decoding (a Kerberos message goes through
# ~50 helper calls). Without NRT a helper cannot allocate arrays; the top-level kernels that do
# (``_decode_all``) keep ``@njit(cache=True)``.
helper = njit(cache=True, _nrt=False)

# --- tags ----------------------------------------------------------------------------------------
UNIVERSAL = 0x00
APPLICATION = 0x40
CONTEXT = 0x80
PRIVATE = 0xC0
CONSTRUCTED = 0x20
_MAX_TAG_NUMBER = (1 << 28) - 1
# A packed tag is (identifier class and constructed bits) << TAG_CLASS_SHIFT | tag number.
TAG_CLASS_SHIFT = 24
TAG_NUMBER_MASK = 0x0FFFFFFF
# X.690 §8.1.2: identifier octet = class (2 bits), constructed (1 bit), tag number (5 bits; 31 = more
# octets follow, 7 bits each, bit 8 set on all but the last); §8.1.3: length octets (short form below
# 0x80; 0x80 indefinite; else 0x80 | number of length octets, 0xFF reserved)
ID_CLASS_BITS = 0xE0
ID_NUMBER_BITS = 0x1F
HIGH_TAG_NUMBER = 0x1F
MORE_OCTETS = 0x80
SEVEN_BITS = 0x7F
MAX_TAG_OCTETS = 4  # subsequent tag octets: 4 x 7 bits = the 28 bits a packed tag number holds
LENGTH_LONG_FORM = 0x80
LENGTH_RESERVED = 0xFF
MAX_LENGTH_OCTETS = 4


def tag(cls: int, number: int, constructed: bool) -> int:
    """Packed tag of class ``cls`` (UNIVERSAL/APPLICATION/CONTEXT/PRIVATE) and ``number``."""
    return np.int64(((cls | (CONSTRUCTED if constructed else 0)) << TAG_CLASS_SHIFT) | number)


def ctx(number: int, constructed: bool = True) -> int:
    """``[number]`` context-specific tag (EXPLICIT tags are constructed)."""
    return tag(CONTEXT, number, constructed)


def app(number: int, constructed: bool = True) -> int:
    """``[APPLICATION number]`` tag."""
    return tag(APPLICATION, number, constructed)


def ident(octet: int) -> int:
    """Packed tag of a low-tag-number identifier octet, e.g. ``ident(0x30)`` = SEQUENCE."""
    assert octet & ID_NUMBER_BITS != HIGH_TAG_NUMBER, "high-tag-number form needs tag()"
    return np.int64(((octet & ID_CLASS_BITS) << TAG_CLASS_SHIFT) | (octet & ID_NUMBER_BITS))


BOOLEAN = ident(0x01)
INTEGER = ident(0x02)
BIT_STRING = ident(0x03)
OCTET_STRING = ident(0x04)
NULL_TAG = ident(0x05)
OID = ident(0x06)
ENUMERATED = ident(0x0A)
UTF8_STRING = ident(0x0C)
SEQUENCE = ident(0x30)
SET = ident(0x31)
GENERALIZED_TIME = ident(0x18)
GENERAL_STRING = ident(0x1B)


@helper
def tag_class(t):
    """Class and constructed bits of a packed tag, as in the identifier octet (0x60 = [APPLICATION] constructed)."""
    return t >> TAG_CLASS_SHIFT


@helper
def tag_number(t):
    return t & TAG_NUMBER_MASK


@helper
def _beyond(end, mend):
    # content or header needed past `end`: the message ran out (truncated) or the enclosing TLV did
    return TRUNCATED if end >= mend else BAD_LENGTH


@helper
def read_tlv(buf, pos, end, mend):
    """One TLV at ``pos``, which must lie inside ``[pos, end)``; ``mend`` (>= end) is the end of the
    message's available bytes.

    Returns ``(tag, content_start, content_end, status)``. On TRUNCATED/BAD_LENGTH for the content
    (the header itself was read: ``content_start > pos``), ``content_end`` is clipped to ``end`` so
    that a caller may still decode what is there; otherwise the content bounds are empty.
    """
    if pos >= end:
        return 0, pos, pos, _beyond(end, mend)
    b = np.int64(buf[pos])
    p = pos + 1
    number = b & ID_NUMBER_BITS
    if number == HIGH_TAG_NUMBER:  # high-tag-number form, X.690 §8.1.2.4
        number = np.int64(0)
        count = 0
        while True:
            if p >= end:
                return 0, pos, pos, _beyond(end, mend)
            c = np.int64(buf[p])
            p += 1
            count += 1
            if count > MAX_TAG_OCTETS:
                return 0, pos, pos, BAD_TAG
            number = (number << 7) | (c & SEVEN_BITS)
            if c < MORE_OCTETS:
                break
        if number > _MAX_TAG_NUMBER:
            return 0, pos, pos, BAD_TAG
    t = ((b & ID_CLASS_BITS) << TAG_CLASS_SHIFT) | number
    if p >= end:
        return t, pos, pos, _beyond(end, mend)
    first = np.int64(buf[p])
    p += 1
    if first < LENGTH_LONG_FORM:
        n = first
    elif first == LENGTH_LONG_FORM:
        return t, p, p, INDEFINITE
    else:
        k = first & SEVEN_BITS
        if k > MAX_LENGTH_OCTETS or first == LENGTH_RESERVED:
            return t, p, p, BAD_LENGTH
        if p + k > end:
            return t, pos, pos, _beyond(end, mend)
        n = np.int64(0)
        for j in range(k):
            n = (n << 8) | np.int64(buf[p + j])
        p += k
    if p + n > end:
        return t, p, end, _beyond(end, mend)
    return t, p, p + n, OK


@helper
def read_tlv_partial(buf, pos, end, mend):
    """:func:`read_tlv` for decoding what a cut message still holds: a *constructed* TLV whose
    content runs past the message's available bytes is returned as OK, its content clipped, so
    the fields before the cut decode; a primitive one stays TRUNCATED (a clipped INTEGER or string
    would be a wrong value). Use it below a top level that has recorded the truncation."""
    t, s, e, st = read_tlv(buf, pos, end, mend)
    if st == TRUNCATED and s > pos and (t >> TAG_CLASS_SHIFT) & CONSTRUCTED:
        return t, s, e, OK
    return t, s, e, st


@helper
def read_int(buf, start, end):
    """Two's-complement INTEGER/ENUMERATED content → (value, status). Up to 8 octets, or 9 when the
    first is a 0x00 sign octet (a UInt32/UInt64 value with its top bit set)."""
    n = end - start
    if n < 1 or n > 9:
        return np.int64(0), BAD_INTEGER
    if n == 9:
        if buf[start] != 0 or buf[start + 1] >= 0x80:
            return np.int64(0), BAD_INTEGER
        start += 1
    v = np.int64(buf[start])
    if v >= 0x80:
        v -= 0x100
    for k in range(start + 1, end):
        v = (v << 8) | np.int64(buf[k])
    return v, OK


@helper
def read_bool(buf, start, end):
    """BOOLEAN content → (0/1, status); any non-zero octet is TRUE (BER)."""
    if end - start != 1:
        return np.int64(0), BAD_INTEGER
    return np.int64(1 if buf[start] != 0 else 0), OK


@helper
def read_bits32(buf, start, end):
    """BIT STRING content → the first 32 bits as an integer, bit 0 the most significant (how RFC 4120
    flag sets like KDCOptions are numbered and how tshark prints them). Shorter strings are padded
    with zero bits. Returns (value, status)."""
    if end - start < 1 or buf[start] > 7:
        return np.int64(0), BAD_VALUE
    v = np.int64(0)
    for k in range(4):
        v <<= 8
        if start + 1 + k < end:
            v |= np.int64(buf[start + 1 + k])
    return v, OK


@helper
def _digits(buf, pos, n):
    v = np.int64(0)
    for k in range(n):
        c = np.int64(buf[pos + k]) - 48
        if c < 0 or c > 9:
            return np.int64(-1)
        v = v * 10 + c
    return v


@helper
def days_from_civil(y, m, d):
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    if m <= 2:
        y -= 1
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    mp = (m + 9) % 12
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


_MAX_SECONDS = 9_223_372_035  # ns since 1970 must fit int64: about 2262-04-11


@helper
def read_time(buf, start, end):
    """GeneralizedTime ``YYYYMMDDHHMMSS[.f+]Z`` (X.680 §46, as KerberosTime RFC 4120 §5.2.3) →
    (ns since the Unix epoch, status). Times past 2262 (int64 ns) are BAD_VALUE."""
    n = end - start
    if n < 15 or buf[end - 1] != 0x5A:  # 'Z'
        return np.int64(0), BAD_VALUE
    y = _digits(buf, start, 4)
    mo = _digits(buf, start + 4, 2)
    d = _digits(buf, start + 6, 2)
    h = _digits(buf, start + 8, 2)
    mi = _digits(buf, start + 10, 2)
    s = _digits(buf, start + 12, 2)
    if y < 0 or mo < 1 or mo > 12 or d < 1 or d > 31 or h < 0 or h > 23 or mi < 0 or mi > 59 or s < 0 or s > 60:
        return np.int64(0), BAD_VALUE
    frac = np.int64(0)
    if n > 15:
        if buf[start + 14] != 0x2E or n - 16 < 1 or n - 16 > 9:  # '.' then 1..9 digits
            return np.int64(0), BAD_VALUE
        frac = _digits(buf, start + 15, n - 16)
        if frac < 0:
            return np.int64(0), BAD_VALUE
        for _ in range(9 - (n - 16)):
            frac *= 10
    secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s
    if secs > _MAX_SECONDS or secs < -_MAX_SECONDS:
        return np.int64(0), BAD_VALUE
    return secs * 1_000_000_000 + frac, OK


@helper
def walk(buf, start, end, max_depth, stack):
    """Check the TLV tree in ``[start, end)``: every header readable, every length inside its parent,
    no indefinite length, nesting at most ``max_depth`` (``stack`` is an int64 scratch array of at
    least ``max_depth`` entries). Returns (number of TLVs, status). Primitive contents are not
    looked into; constructed ones (bit 0x20 of the identifier) are."""
    depth = 0
    count = 0
    p = start
    e = end
    while True:
        if p >= e:
            if depth == 0:
                return count, OK
            depth -= 1
            p = e
            e = stack[depth]
            continue
        t, cs, ce, st = read_tlv(buf, p, e, end)
        if st != OK:
            return count, st
        count += 1
        if (t >> TAG_CLASS_SHIFT) & CONSTRUCTED and ce > cs:
            if depth >= max_depth:
                return count, TOO_DEEP
            stack[depth] = e
            depth += 1
            p = cs
            e = ce
        else:
            p = ce


# --- writing text into a string arena ------------------------------------------------------------

_INT64_MIN_TEXT = np.frombuffer(b"-9223372036854775808", dtype=np.uint8).copy()


@helper
def put_int(arena, pos, v):
    """Decimal text of ``v`` (int64) at ``pos``. Returns the new position or -1 when full."""
    if pos < 0:
        return -1
    if v == NULL:  # -2**63 has no positive counterpart
        return put_ascii(arena, pos, _INT64_MIN_TEXT)
    n = 1
    if v < 0:
        n += 1
    x = abs(v)
    while x >= 10:
        x //= 10
        n += 1
    if pos + n > arena.shape[0]:
        return -1
    x = abs(v)
    for k in range(pos + n - 1, pos - 1, -1):
        arena[k] = 48 + x % 10
        x //= 10
    if v < 0:
        arena[pos] = 45  # '-'
    return pos + n


@helper
def put_byte(arena, pos, b):
    """One ASCII byte at ``pos``; the new position, or -1 when full or when ``pos`` is already -1
    (so that a chain of writes can be checked once at its end)."""
    if pos < 0 or pos >= arena.shape[0]:
        return -1
    arena[pos] = b
    return pos + 1


@helper
def put_ascii(arena, pos, text):
    """Copy ``text`` (a uint8 array of ASCII) to ``arena`` at ``pos``; new position or -1."""
    if pos < 0 or pos + text.shape[0] > arena.shape[0]:
        return -1
    for k in range(text.shape[0]):
        arena[pos + k] = text[k]
    return pos + text.shape[0]


def ascii_array(text: str) -> np.ndarray:
    """A constant for :func:`put_ascii` (module-level arrays are frozen into the kernels)."""
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8).copy()


# --- Python side: columns out of the kernels' field vectors --------------------------------------

def int_column(name: str, values: np.ndarray, dtype) -> pl.Series:
    """A Polars column of ``dtype`` from int64 ``values`` with :data:`NULL` as null (zero-copy, then one
    cast). A value the type cannot hold (a 40-bit resultCode in a hostile message) becomes null rather
    than wrapping."""
    values = np.ascontiguousarray(values, np.int64)
    return series(name, values, values != NULL).cast(dtype, strict=False)


def status_column(name: str, status: np.ndarray) -> pl.Series:
    """decode_error: null where 0, else the reason's name (a String column)."""
    s = pl.Series(name, np.ascontiguousarray(status, np.int64))
    return s.replace_strict({k: v for k, v in STATUS_NAMES.items()}, default=None,
                            return_dtype=pl.String).alias(name)


@njit(cache=True)
def _compact_strings(arena, spans, base, out, out_start):
    """Copy every string slot k of every row i (``spans[2k, i]`` start, ``spans[2k+1, i]`` length,
    -1 = null) into ``out`` at ``base[k]`` onwards, rows back to back; ``out_start[k, i]`` is where
    row i's string starts relative to ``base[k]``. One pass over the rows."""
    n = spans.shape[1]
    slots = base.shape[0]
    pos = base.copy()
    for i in range(n):
        for k in range(slots):
            out_start[k, i] = pos[k] - base[k]
            length = spans[2 * k + 1, i]
            if length > 0:
                s = spans[2 * k, i]
                p = pos[k]
                for j in range(length):
                    out[p + j] = arena[s + j]
                pos[k] = p + length


def string_columns(names, arena: np.ndarray, spans: np.ndarray) -> list:
    """String columns out of a shared arena: slot k of ``spans`` (shape (2 * slots, rows): start and
    length rows) becomes column ``names[k]``. The bytes are regrouped per column in one pass so that
    each column is one Arrow buffer (no per-row gather afterwards)."""

    lengths = spans[1::2]
    totals = np.clip(lengths, 0, None).sum(axis=1).astype(np.int64)
    base = np.zeros(len(names), np.int64)
    np.cumsum(totals[:-1], out=base[1:])
    out = np.empty(int(totals.sum()), np.uint8)
    out_start = np.empty((len(names), spans.shape[1]), np.int64)
    _compact_strings(arena, spans, base, out, out_start)
    cols = []
    for k, name in enumerate(names):
        data = out[base[k]:base[k] + totals[k]]
        length = lengths[k]
        cols.append(arena_strings(name, data, out_start[k], np.maximum(length, 0), length >= 0))
    return cols


def stack_sets(sets, parts):
    """Concatenate per-set kernel outputs into one time-ordered result.

    ``parts[j]`` = (u_msg, ints, spans, arena) for ``sets[j]``: column r of ``ints``/``spans``
    (field-major arrays) belongs to message ``u_msg[r]`` of that set. Returns (base frame of set
    columns, one row per output row, ints, spans, arena), rows ordered by (ts_last_ns, frame_last,
    set order, row order)."""

    frames, u_all, ints_all, spans_all, arenas = [], [], [], [], []
    row0 = 0
    arena0 = 0
    for ms, (u_msg, ints, spans, arena) in zip(sets, parts):
        frames.append(ms.frame.drop("offset", "length"))
        u_all.append(u_msg + row0)
        row0 += ms.height
        if arena0:
            spans = spans.copy()
            starts = spans[0::2]
            starts[spans[1::2] >= 0] += arena0
        spans_all.append(spans)
        ints_all.append(ints)
        arenas.append(arena)
        arena0 += arena.shape[0]
    try:
        base = pl.concat(frames, how="vertical_relaxed") if len(frames) > 1 else frames[0]
    except Exception:  # sets whose address Enums differ: fall back to text
        base = pl.concat([f.with_columns(pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String))
                          for f in frames], how="vertical_relaxed")
    u = np.concatenate(u_all)
    ints = np.concatenate(ints_all, axis=1) if len(ints_all) > 1 else ints_all[0]
    spans = np.concatenate(spans_all, axis=1) if len(spans_all) > 1 else spans_all[0]
    arena = np.concatenate(arenas) if len(arenas) > 1 else arenas[0]
    ts = base["ts_last_ns"].to_numpy()[u]
    fr = base["frame_last"].to_numpy()[u]
    order = np.lexsort((np.arange(u.shape[0]), fr, ts))
    if not np.all(order[1:] > order[:-1]):  # np.take: 1/3 the time of [:, order]; gathers from one chunk
        u, ints, spans = u[order], np.take(ints, order, axis=1), np.take(spans, order, axis=1)
    return base.rechunk()[u] if not np.array_equal(u, np.arange(base.height)) else base, ints, spans, arena


# --- UTF-8 text ------------------------------------------------------------------------------------
TEXT = np.int64(0)  # put_utf8 mode: escape as \xNN (what text.put_escaped writes), for names, DNs, messages
FILTER_VALUE = np.int64(1)  # put_utf8 mode: RFC 4515 §3 escaping (\NN) of NUL ( ) * \ and of unprintables


@helper
def _utf8_len(buf, p, end):
    """Length of the well-formed UTF-8 sequence (RFC 3629 §4) of 2-4 bytes at ``p``, or 0."""
    b = buf[p]
    if 0xC2 <= b <= 0xDF:
        n = 2
    elif 0xE0 <= b <= 0xEF:
        n = 3
    elif 0xF0 <= b <= 0xF4:
        n = 4
    else:
        return 0
    if p + n > end:
        return 0
    c = buf[p + 1]
    lo = 0x80
    hi = 0xBF
    if b == 0xE0:
        lo = 0xA0
    elif b == 0xED:
        hi = 0x9F
    elif b == 0xF0:
        lo = 0x90
    elif b == 0xF4:
        hi = 0x8F
    if c < lo or c > hi:
        return 0
    for k in range(2, n):
        c = buf[p + k]
        if c < 0x80 or c > 0xBF:
            return 0
    return n


@helper
def put_utf8(arena, pos, src, start, n, mode):
    """Copy ``src[start:start+n]`` keeping well-formed UTF-8 (RFC 3629) and printable ASCII, escaping
    every other byte (controls, DEL, stray or overlong bytes) and the backslash. ``mode`` TEXT writes
    ``\\xNN`` like :func:`analyzer.decoders.text.put_escaped`; FILTER_VALUE writes RFC 4515's ``\\NN``
    and also escapes ``(``, ``)`` and ``*``. Returns the new position or -1 when full."""
    if pos < 0:
        return -1
    cap = arena.shape[0]
    end = start + n
    p = start
    while p < end:
        b = src[p]
        if 0x20 <= b < 0x7F and b != 0x5C and not (mode == FILTER_VALUE and (b == 0x28 or b == 0x29 or b == 0x2A)):
            if pos >= cap:
                return -1
            arena[pos] = b
            pos += 1
            p += 1
            continue
        k = _utf8_len(src, p, end) if b >= 0x80 else 0
        if k > 0:
            if pos + k > cap:
                return -1
            for j in range(k):
                arena[pos + j] = src[p + j]
            pos += k
            p += k
            continue
        w = 4 if mode == TEXT else 3
        if pos + w > cap:
            return -1
        arena[pos] = 0x5C
        if mode == TEXT:
            arena[pos + 1] = 0x78
        arena[pos + w - 2] = HEX_DIGITS[b >> 4]
        arena[pos + w - 1] = HEX_DIGITS[b & 15]
        pos += w
        p += 1
    return pos


@helper
def bytes_equal(buf, s, e, want, fold_ascii):
    """Whether ``buf[s:e]`` is ``want`` (OID octets, a name); ``fold_ascii``: A-Z match lower-case ``want``."""
    if e - s != want.shape[0]:
        return False
    for k in range(e - s):
        b = buf[s + k]
        if b != want[k] and not (fold_ascii and 0x41 <= b <= 0x5A and b + 0x20 == want[k]):
            return False
    return True


@helper
def put_slot(buf, s, e, arena, apos, sp, k):
    """Escape ``buf[s:e]`` (UTF-8 kept, other bytes escaped) into the arena as string slot ``k``:
    ``sp[2k]`` its start, ``sp[2k+1]`` its length. Returns the new position, -1 when the arena is full."""
    if apos < 0:
        return -1
    sp[2 * k] = apos
    apos = put_utf8(arena, apos, buf, s, e - s, TEXT)
    if apos < 0:
        return -1
    sp[2 * k + 1] = apos - sp[2 * k]
    return apos
