"""Numba kernels of the SMB2/3 decoder: NBSS messages → one row per SMB2 header.

Input is the message set's ``(buf, offset, length, wire_length)``: each message is what one NetBIOS
session message (RFC 1002 4.3.1, MS-SMB2 2.1) carried after its 4-byte header. It holds one SMB2
header chain (MS-SMB2 2.2.1, compounded by NextCommand, 3.2.4.1.4), an SMB2 TRANSFORM_HEADER
(2.2.41, encrypted), a COMPRESSION_TRANSFORM_HEADER (2.2.42), or an SMB1 header (MS-CIFS 2.2.3.1).

Two passes: :func:`count_rows` walks the NextCommand chains to size the output, :func:`decode`
fills it. Both use :func:`_next_element`, so they agree on the number of rows. Every offset read
from the wire is checked against the end of its element (``pos + NextCommand``, or the end of the
available bytes for the last one) before use; NextCommand must move forward by at least a header
(64 bytes) and create contexts by at least a context header, so no chain can loop.

Per row the helpers fill an int64 field vector ``f`` (indexes ``F_*`` below, with a presence bit
mask in ``f[F_PRESENT]``) and a string vector ``s`` (``(start, length)`` pairs into the byte arena;
length -1 = null); the loop stores both once per row (see ``analyzer/kernels/headers.py`` for why),
into four 2-D arrays by element size (:class:`RowColumns`).
Strings are written into the arena as UTF-8: SMB2 names are UTF-16LE (MS-SMB2 2.2.13 "Buffer"),
transcoded by :func:`put_utf16le`; 64-bit unsigned fields travel as int64 bit patterns and are
viewed as uint64 by the caller.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import smb2_tables as t
from .text import HEX_DIGITS, put_escaped

FIELDS = (
    "kind", "chain_index", "chain_offset", "command_code", "status_code", "flags", "is_response",
    "credit_charge", "credit_request", "credit_grant", "message_id", "async_id", "tree_id", "session_id",
    "has_signature", "structure_size", "error_body", "channel_sequence", "dialect", "dialect_count",
    "capabilities", "session_flags", "share_type", "share_flags", "desired_access", "file_attributes",
    "share_access", "create_disposition", "create_options", "oplock_level", "lease_state",
    "new_lease_state", "lease_flags", "lease_version", "lease_epoch", "break_reason", "break_kind",
    "create_action", "end_of_file", "fid_persistent", "fid_volatile", "file_offset", "io_length",
    "lock_count", "lock_offset", "lock_length", "lock_flags", "ctl_code", "info_type", "info_class",
    "delete_pending", "notify_flags", "completion_filter", "original_size", "decode_error",
)
(F_KIND, F_CHAIN_INDEX, F_CHAIN_OFFSET, F_COMMAND_CODE, F_STATUS_CODE, F_FLAGS, F_IS_RESPONSE,
 F_CREDIT_CHARGE, F_CREDIT_REQUEST, F_CREDIT_GRANT, F_MESSAGE_ID, F_ASYNC_ID, F_TREE_ID, F_SESSION_ID,
 F_HAS_SIGNATURE, F_STRUCTURE_SIZE, F_ERROR_BODY, F_CHANNEL_SEQUENCE, F_DIALECT, F_DIALECT_COUNT,
 F_CAPABILITIES, F_SESSION_FLAGS, F_SHARE_TYPE, F_SHARE_FLAGS, F_DESIRED_ACCESS, F_FILE_ATTRIBUTES,
 F_SHARE_ACCESS, F_CREATE_DISPOSITION, F_CREATE_OPTIONS, F_OPLOCK_LEVEL, F_LEASE_STATE,
 F_NEW_LEASE_STATE, F_LEASE_FLAGS, F_LEASE_VERSION, F_LEASE_EPOCH, F_BREAK_REASON, F_BREAK_KIND,
 F_CREATE_ACTION, F_END_OF_FILE, F_FID_PERSISTENT, F_FID_VOLATILE, F_FILE_OFFSET, F_IO_LENGTH,
 F_LOCK_COUNT, F_LOCK_OFFSET, F_LOCK_LENGTH, F_LOCK_FLAGS, F_CTL_CODE, F_INFO_TYPE, F_INFO_CLASS,
 F_DELETE_PENDING, F_NOTIFY_FLAGS, F_COMPLETION_FILTER, F_ORIGINAL_SIZE, F_DECODE_ERROR) = range(55)
N_FIELDS = len(FIELDS)
F_PRESENT = N_FIELDS  # one more slot: bit k set = field k present
assert all(FIELDS[value] == name[2:].lower() for name, value in dict(globals()).items()
           if name.startswith("F_") and name != "F_PRESENT") and N_FIELDS == 55 < 63, \
    "field constants out of step with FIELDS"


def _mask(*fields: int) -> int:
    m = 0
    for field in fields:
        m |= 1 << field
    return m


# Presence masks: which fields a decoding step fills (Numba freezes these module ints as constants).
M_ALWAYS = _mask(F_KIND, F_CHAIN_INDEX, F_CHAIN_OFFSET)
M_DECODE_ERROR = _mask(F_DECODE_ERROR)
M_COMMAND_CODE = _mask(F_COMMAND_CODE)
M_IS_RESPONSE = _mask(F_IS_RESPONSE)
M_HEADER = _mask(F_COMMAND_CODE, F_FLAGS, F_IS_RESPONSE, F_CREDIT_CHARGE, F_MESSAGE_ID, F_SESSION_ID,
                 F_HAS_SIGNATURE)
M_RESPONSE_HEADER = _mask(F_STATUS_CODE, F_CREDIT_GRANT)
M_REQUEST_HEADER = _mask(F_CHANNEL_SEQUENCE, F_CREDIT_REQUEST)
M_ASYNC_ID = _mask(F_ASYNC_ID)
M_TREE_ID = _mask(F_TREE_ID)
M_STRUCTURE_SIZE = _mask(F_STRUCTURE_SIZE)
M_ERROR_BODY = _mask(F_ERROR_BODY)
M_NEGOTIATE_REQUEST = _mask(F_DIALECT_COUNT, F_CAPABILITIES)
M_NEGOTIATE_RESPONSE = _mask(F_DIALECT, F_CAPABILITIES)
M_SESSION_FLAGS = _mask(F_SESSION_FLAGS)
M_CAPABILITIES = _mask(F_CAPABILITIES)
M_TREE_CONNECT_RESPONSE = _mask(F_SHARE_TYPE, F_SHARE_FLAGS)
M_CREATE_REQUEST = _mask(F_OPLOCK_LEVEL, F_DESIRED_ACCESS, F_FILE_ATTRIBUTES, F_SHARE_ACCESS,
                         F_CREATE_DISPOSITION, F_CREATE_OPTIONS)
M_CREATE_RESPONSE = _mask(F_CREATE_ACTION)
M_OPLOCK_LEVEL = _mask(F_OPLOCK_LEVEL)
M_EOF_ATTRIBUTES = _mask(F_END_OF_FILE, F_FILE_ATTRIBUTES)
M_END_OF_FILE = _mask(F_END_OF_FILE)
M_FILE_ATTRIBUTES = _mask(F_FILE_ATTRIBUTES)
M_LEASE = _mask(F_LEASE_STATE, F_LEASE_FLAGS, F_LEASE_VERSION)
M_LEASE_EPOCH = _mask(F_LEASE_EPOCH)
M_FID = _mask(F_FID_PERSISTENT, F_FID_VOLATILE)
M_IO_LENGTH = _mask(F_IO_LENGTH)
M_FILE_OFFSET = _mask(F_FILE_OFFSET)
M_LOCK_COUNT = _mask(F_LOCK_COUNT)
M_LOCK_RANGE = _mask(F_LOCK_OFFSET, F_LOCK_LENGTH, F_LOCK_FLAGS)
M_CTL_CODE = _mask(F_CTL_CODE)
M_INFO_CLASS = _mask(F_INFO_CLASS)
M_INFO_TYPE_CLASS = _mask(F_INFO_TYPE, F_INFO_CLASS)
M_CHANGE_NOTIFY = _mask(F_NOTIFY_FLAGS, F_COMPLETION_FILTER)
M_DELETE_PENDING = _mask(F_DELETE_PENDING)
M_BREAK_KIND = _mask(F_BREAK_KIND)
M_LEASE_BREAK_NOTIFICATION = _mask(F_BREAK_KIND, F_LEASE_EPOCH, F_LEASE_FLAGS, F_LEASE_STATE,
                                   F_NEW_LEASE_STATE, F_BREAK_REASON)
M_LEASE_BREAK_ACK = _mask(F_BREAK_KIND, F_LEASE_FLAGS, F_LEASE_STATE)
M_ORIGINAL_SIZE = _mask(F_ORIGINAL_SIZE)
M_TRANSFORM = _mask(F_ORIGINAL_SIZE, F_SESSION_ID)
M_STATUS_CODE = _mask(F_STATUS_CODE)
M_SMB1 = _mask(F_COMMAND_CODE, F_IS_RESPONSE, F_TREE_ID, F_SESSION_ID, F_MESSAGE_ID)


# Kernel dtypes; uint64 fields are int64 here (bit patterns) and viewed as uint64 by the caller.
_U64 = ("message_id", "async_id", "session_id", "end_of_file", "fid_persistent", "fid_volatile",
        "file_offset", "lock_offset", "lock_length")
_DTYPES = {name: np.int64 for name in _U64} | {
    "kind": np.uint8, "chain_index": np.uint32, "chain_offset": np.uint32, "command_code": np.uint16,
    "status_code": np.uint32, "flags": np.uint32, "is_response": np.bool_, "credit_charge": np.uint16,
    "credit_request": np.uint16, "credit_grant": np.uint16, "tree_id": np.uint32,
    "has_signature": np.bool_, "structure_size": np.uint16, "error_body": np.bool_,
    "channel_sequence": np.uint16, "dialect": np.uint16, "dialect_count": np.uint16,
    "capabilities": np.uint32, "session_flags": np.uint16, "share_type": np.uint8,
    "share_flags": np.uint32, "desired_access": np.uint32, "file_attributes": np.uint32,
    "share_access": np.uint32, "create_disposition": np.uint32, "create_options": np.uint32,
    "oplock_level": np.uint8, "lease_state": np.uint32, "new_lease_state": np.uint32,
    "lease_flags": np.uint32, "lease_version": np.uint8, "lease_epoch": np.uint16,
    "break_reason": np.uint32, "break_kind": np.uint8, "create_action": np.uint32, "io_length": np.uint32,
    "lock_count": np.uint16, "lock_flags": np.uint32, "ctl_code": np.uint32, "info_type": np.uint8,
    "info_class": np.uint8, "delete_pending": np.bool_, "notify_flags": np.uint16,
    "completion_filter": np.uint32, "original_size": np.uint32, "decode_error": np.uint8,
}
FIELD_DTYPES = {name: _DTYPES[name] for name in FIELDS}

# String columns: (start, length) pairs in the string vector.
STRINGS = ("tree", "filename", "pattern", "target_name", "lease_key", "parent_lease_key",
           "create_contexts", "dialects")
S_TREE, S_FILENAME, S_PATTERN, S_TARGET_NAME, S_LEASE_KEY, S_PARENT_LEASE_KEY, S_CREATE_CONTEXTS, \
    S_DIALECTS = range(8)
N_STRINGS = len(STRINGS)  # "dialects" holds raw little-endian uint16s, not text (a List column)

# The output: one 2-D array per element size, [column, row], so each column is a contiguous row of
# its array (a namedtuple of ~70 typed arrays cost Numba seconds more compile time). The kernel
# stores only the fields a row has (about 15 of 55): each column is a separate memory stream, and
# writing all of them for every row made the store the slowest part of the loop.
GROUPS = {8: np.int64, 4: np.uint32, 2: np.uint16, 1: np.uint8}
_GROUP_OF = {name: np.dtype(dtype).itemsize for name, dtype in FIELD_DTYPES.items()}
GROUP_FIELDS = {size: tuple(n for n in FIELDS if _GROUP_OF[n] == size) for size in GROUPS}
# Extra int64 rows after the fields of group 8: presence mask, message index, string starts/lengths.
EXTRA = ("present", "msg") + tuple(f"{n}_{part}" for n in STRINGS for part in ("start", "len"))


class RowColumns:
    """The kernel's output arrays and named access to their rows (one per column)."""

    def __init__(self, n: int):
        n8 = len(GROUP_FIELDS[8]) + len(EXTRA)
        self.o8 = np.zeros((n8, n), np.int64)
        self.o4 = np.zeros((len(GROUP_FIELDS[4]), n), np.uint32)
        self.o2 = np.zeros((len(GROUP_FIELDS[2]), n), np.uint16)
        self.o1 = np.zeros((len(GROUP_FIELDS[1]), n), np.uint8)
        self._where = {}
        for size, arr in ((8, self.o8), (4, self.o4), (2, self.o2), (1, self.o1)):
            for j, name in enumerate(GROUP_FIELDS[size]):
                self._where[name] = (arr, j)
        base = len(GROUP_FIELDS[8])
        for j, name in enumerate(EXTRA):
            self._where[name] = (self.o8, base + j)

    def __getattr__(self, name):
        try:
            arr, j = self.__dict__["_where"][name]
        except KeyError:
            raise AttributeError(name) from None
        return arr[j]


def allocate_rows(n: int) -> RowColumns:
    return RowColumns(n)


# Compile-time constants for Numba.
KIND_SMB2, KIND_TRANSFORM, KIND_COMPRESSED, KIND_SMB1, KIND_UNKNOWN = (
    t.KIND_SMB2, t.KIND_TRANSFORM, t.KIND_COMPRESSED, t.KIND_SMB1, t.KIND_UNKNOWN)
E_TRUNCATED, E_BAD_HEADER, E_BAD_STRUCTURE_SIZE, E_BAD_NEXT_COMMAND, E_BAD_OFFSET, \
    E_BAD_CREATE_CONTEXT, E_UNKNOWN_PROTOCOL, E_BAD_LOCK_COUNT = (
        t.E_TRUNCATED, t.E_BAD_HEADER, t.E_BAD_STRUCTURE_SIZE, t.E_BAD_NEXT_COMMAND, t.E_BAD_OFFSET,
        t.E_BAD_CREATE_CONTEXT, t.E_UNKNOWN_PROTOCOL, t.E_BAD_LOCK_COUNT)
STATUS_PENDING = 0x00000103
STATUS_MORE_PROCESSING_REQUIRED = 0xC0000016
STATUS_BUFFER_OVERFLOW = 0x80000005
UNSOLICITED = -1  # MessageId 0xFFFFFFFFFFFFFFFF as an int64 bit pattern
HEADER = 64
FIELD_GROUP = np.array([(8, 4, 2, 1).index(_GROUP_OF[n]) for n in FIELDS], np.int64)
FIELD_POS = np.array([GROUP_FIELDS[_GROUP_OF[n]].index(n) for n in FIELDS], np.int64)
STRING_BIT = N_FIELDS  # presence bits of the strings follow those of the fields
assert STRING_BIT + N_STRINGS <= 63
X_PRESENT = len(GROUP_FIELDS[8])  # row of o8 holding the presence mask; then msg, then strings
MAX_CREATE_CONTEXTS = 64  # a CREATE carries a handful; more is hostile
MAX_DIALECTS = 64


# --- small helpers -------------------------------------------------------------------------------
# Plain (not inline="always") readers: LLVM inlines them anyway; Numba-level inlining of the ~70 call
# sites only cost compile time (measured: no run-time difference).

@njit(cache=True, _nrt=False)
def u16le(buf, off):
    return np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)


@njit(cache=True, _nrt=False)
def u32le(buf, off):
    return (np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8) | (np.int64(buf[off + 2]) << 16)
            | (np.int64(buf[off + 3]) << 24))


@njit(cache=True, _nrt=False)
def _u64le(buf, off):
    return (u32le(buf, off + 4) << 32) | u32le(buf, off)


@njit(cache=True, _nrt=False)
def _err(f, code):
    """Record the first error of a row (later ones are consequences)."""
    if f[F_DECODE_ERROR] == 0:
        f[F_DECODE_ERROR] = code


@njit(cache=True, _nrt=False)
def _put_escape(arena, pos, prefix, value, digits):
    """``\\x`` + 2 or ``\\u`` + 4 hex digits. Returns the new position or -1 when full."""
    if pos + 2 + digits > arena.shape[0]:
        return -1
    arena[pos] = 0x5C
    arena[pos + 1] = prefix
    for k in range(digits):
        arena[pos + 2 + k] = HEX_DIGITS[(value >> (4 * (digits - 1 - k))) & 15]
    return pos + 2 + digits


@njit(cache=True, _nrt=False)
def put_utf16le(arena, pos, src, start, n):
    """Transcode ``n`` bytes of UTF-16LE at ``src[start:]`` into UTF-8 at ``arena[pos:]``.

    Surrogate pairs become one 4-byte sequence; an unpaired surrogate is written as ``\\uDXXX``,
    a control character (below 0x20, and 0x7F) as ``\\xNN``, and a dangling odd byte as ``\\xNN``, so
    the result is always valid UTF-8. Backslashes stay as they are (they separate path components;
    tshark prints them literally too). Returns the new position, or -1 when the arena is full.
    """
    cap = arena.shape[0]
    units = n // 2
    k = 0
    while k < units:
        u = np.int64(src[start + 2 * k]) | (np.int64(src[start + 2 * k + 1]) << 8)
        k += 1
        cp = u
        if 0xD800 <= u < 0xDC00 and k < units:
            low = np.int64(src[start + 2 * k]) | (np.int64(src[start + 2 * k + 1]) << 8)
            if 0xDC00 <= low < 0xE000:
                cp = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00)
                k += 1
        if 0xD800 <= cp < 0xE000:
            pos = _put_escape(arena, pos, 0x75, cp, 4)  # \uDXXX
        elif cp < 0x20 or cp == 0x7F:
            pos = _put_escape(arena, pos, 0x78, cp, 2)  # \xNN
        elif cp < 0x80:
            if pos + 1 > cap:
                return -1
            arena[pos] = cp
            pos += 1
        elif cp < 0x800:
            if pos + 2 > cap:
                return -1
            arena[pos] = 0xC0 | (cp >> 6)
            arena[pos + 1] = 0x80 | (cp & 0x3F)
            pos += 2
        elif cp < 0x10000:
            if pos + 3 > cap:
                return -1
            arena[pos] = 0xE0 | (cp >> 12)
            arena[pos + 1] = 0x80 | ((cp >> 6) & 0x3F)
            arena[pos + 2] = 0x80 | (cp & 0x3F)
            pos += 3
        else:
            if pos + 4 > cap:
                return -1
            arena[pos] = 0xF0 | (cp >> 18)
            arena[pos + 1] = 0x80 | ((cp >> 12) & 0x3F)
            arena[pos + 2] = 0x80 | ((cp >> 6) & 0x3F)
            arena[pos + 3] = 0x80 | (cp & 0x3F)
            pos += 4
        if pos < 0:
            return -1
    if n & 1:
        pos = _put_escape(arena, pos, 0x78, np.int64(src[start + n - 1]), 2)
    return pos


@njit(cache=True, _nrt=False)
def put_guid(arena, pos, src, off):
    """16 bytes as a GUID the way Wireshark prints FT_GUID (MS-DTYP 2.3.4.2: the first three
    fields little-endian): ``1f79bcfb-03c3-094c-86cc-6e8b2d018097``. -1 when the arena is full."""
    if pos + 36 > arena.shape[0]:
        return -1
    order = (3, 2, 1, 0, -1, 5, 4, -1, 7, 6, -1, 8, 9, -1, 10, 11, 12, 13, 14, 15)
    for j in order:
        if j < 0:
            arena[pos] = 0x2D
            pos += 1
        else:
            b = src[off + j]
            arena[pos] = HEX_DIGITS[b >> 4]
            arena[pos + 1] = HEX_DIGITS[b & 15]
            pos += 2
    return pos


@njit(cache=True, _nrt=False)
def _string16(buf, pos, end, name_off, name_len, s, slot, arena, apos, f):
    """A UTF-16LE name at ``pos + name_off`` (offsets count from the SMB2 header, MS-SMB2 2.2.13
    NameOffset). Out of the element's bounds: ``bad offset``, the string stays null."""
    if name_len == 0:
        s[2 * slot] = apos
        s[2 * slot + 1] = 0
        return apos
    start = pos + name_off
    if name_off < HEADER or start + name_len > end:
        _err(f, E_BAD_OFFSET)
        return apos
    new = put_utf16le(arena, apos, buf, start, name_len)
    if new < 0:
        return -1
    s[2 * slot] = apos
    s[2 * slot + 1] = new - apos
    return new


@njit(cache=True, _nrt=False)
def _guid(buf, off, s, slot, arena, apos):
    new = put_guid(arena, apos, buf, off)
    if new < 0:
        return -1
    s[2 * slot] = apos
    s[2 * slot + 1] = 36
    return new


@njit(cache=True, _nrt=False)
def _fid(f, buf, off):
    f[F_FID_PERSISTENT] = _u64le(buf, off)
    f[F_FID_VOLATILE] = _u64le(buf, off + 8)
    f[F_PRESENT] |= M_FID


# --- chains --------------------------------------------------------------------------------------

@njit(cache=True, inline="always")
def _protocol(buf, start, end):
    """Which header an NBSS message starts with (MS-SMB2 2.2.1, 2.2.41, 2.2.42; MS-CIFS 2.2.3.1)."""
    if end - start < 4 or buf[start + 1] != 0x53 or buf[start + 2] != 0x4D or buf[start + 3] != 0x42:
        return KIND_UNKNOWN
    b = buf[start]
    if b == 0xFE:
        return KIND_SMB2
    if b == 0xFD:
        return KIND_TRANSFORM
    if b == 0xFC:
        return KIND_COMPRESSED
    if b == 0xFF:
        return KIND_SMB1
    return KIND_UNKNOWN


@njit(cache=True, inline="always")
def _next_element(buf, pos, end, wire_end):
    """Start of the next compound element after the SMB2 header at ``pos`` (MS-SMB2 2.2.1.2
    NextCommand): 0 when this is the last, -1 when NextCommand is bogus (shorter than a header, or
    past the end of the message), -2 when the next element lies beyond the captured bytes."""
    if end - pos < 24:
        return 0
    nxt = u32le(buf, pos + 20)
    if nxt == 0:
        return 0
    if nxt < HEADER:
        return -1
    if pos + nxt >= end:
        return -2 if pos + nxt < wire_end else -1
    return pos + nxt


@njit(cache=True)
def count_rows(buf, offset, length, wire_length):
    """Rows each message produces: its number of SMB2 headers, 1 for any other non-empty message."""
    n = offset.shape[0]
    counts = np.zeros(n, np.int64)
    for i in range(n):
        if length[i] == 0:
            continue
        start = offset[i]
        end = start + np.int64(length[i])
        if _protocol(buf, start, end) != KIND_SMB2:
            counts[i] = 1
            continue
        c = 1
        pos = start
        wire_end = start + max(np.int64(wire_length[i]), np.int64(length[i]))
        while True:
            nxt = _next_element(buf, pos, end, wire_end)
            if nxt <= 0:
                break
            pos = nxt
            c += 1
        counts[i] = c
    return counts


# --- commands ------------------------------------------------------------------------------------

@njit(cache=True, _nrt=False)
def _create_contexts(buf, pos, end, ctx_off, ctx_len, f, s, arena, apos):
    """Walk the CREATE contexts (MS-SMB2 2.2.13.2 / 2.2.14.2): list their names, decode the lease
    (RqLs, 2.2.13.2.8 / 2.2.13.2.10 and 2.2.14.2.10 / 2.2.14.2.11)."""
    if ctx_len == 0:
        return apos
    cstart = pos + ctx_off
    cend = cstart + ctx_len
    if ctx_off < HEADER or cend > end:
        _err(f, E_BAD_OFFSET)
        return apos
    tags_start = apos
    lease = -1
    lease_len = 0
    p = cstart
    for k in range(MAX_CREATE_CONTEXTS + 1):
        if k == MAX_CREATE_CONTEXTS:
            _err(f, E_BAD_CREATE_CONTEXT)
            break
        if cend - p < 16:
            _err(f, E_BAD_CREATE_CONTEXT)
            break
        nxt = u32le(buf, p)
        name_off = u16le(buf, p + 4)
        name_len = u16le(buf, p + 6)
        data_off = u16le(buf, p + 10)
        data_len = u32le(buf, p + 12)
        if p + name_off + name_len > cend or (data_len > 0 and p + data_off + data_len > cend):
            _err(f, E_BAD_CREATE_CONTEXT)
            break
        if k > 0:
            if apos + 1 > arena.shape[0]:
                return -1
            arena[apos] = 0x2C  # ","
            apos += 1
        nstart = p + name_off
        if name_len == 16:
            apos = put_guid(arena, apos, buf, nstart)
        else:
            apos = put_escaped(arena, apos, buf, nstart, min(name_len, 32))
        if apos < 0:
            return -1
        if (name_len == 4 and buf[nstart] == 0x52 and buf[nstart + 1] == 0x71 and buf[nstart + 2] == 0x4C
                and buf[nstart + 3] == 0x73 and data_len >= 32):  # "RqLs"
            lease = p + data_off
            lease_len = data_len
        if nxt == 0:
            break
        if nxt < 16 or p + nxt >= cend:  # forward only: no loops
            _err(f, E_BAD_CREATE_CONTEXT)
            break
        p += nxt
    s[2 * S_CREATE_CONTEXTS] = tags_start
    s[2 * S_CREATE_CONTEXTS + 1] = apos - tags_start
    if lease >= 0:  # after the names, so the name list stays one contiguous string
        apos = _guid(buf, lease, s, S_LEASE_KEY, arena, apos)
        if apos < 0:
            return -1
        f[F_LEASE_STATE] = u32le(buf, lease + 16)
        f[F_LEASE_FLAGS] = u32le(buf, lease + 20)
        f[F_PRESENT] |= M_LEASE
        if lease_len >= 52:
            f[F_LEASE_VERSION] = 2
            apos = _guid(buf, lease + 32, s, S_PARENT_LEASE_KEY, arena, apos)
            if apos < 0:
                return -1
            f[F_LEASE_EPOCH] = u16le(buf, lease + 48)
            f[F_PRESENT] |= M_LEASE_EPOCH
        else:
            f[F_LEASE_VERSION] = 1
    return apos


@njit(cache=True, _nrt=False)
def _session_tree(buf, pos, b, end, cmd, resp, status, f, s, arena, apos):
    """NEGOTIATE (2.2.3, 2.2.4), SESSION_SETUP (2.2.5, 2.2.6), TREE_CONNECT (2.2.9, 2.2.10)."""
    if cmd == 0:  # NEGOTIATE
        if resp:
            if end - b < 64:
                _err(f, E_TRUNCATED)
                return apos
            f[F_DIALECT] = u16le(buf, b + 4)
            f[F_CAPABILITIES] = u32le(buf, b + 24)
            f[F_PRESENT] |= M_NEGOTIATE_RESPONSE
        else:
            if end - b < 36:
                _err(f, E_TRUNCATED)
                return apos
            count = u16le(buf, b + 2)
            f[F_DIALECT_COUNT] = count
            f[F_CAPABILITIES] = u32le(buf, b + 8)
            f[F_PRESENT] |= M_NEGOTIATE_REQUEST
            have = min(count, (end - (b + 36)) // 2, MAX_DIALECTS)
            if have < count and have < MAX_DIALECTS:
                _err(f, E_TRUNCATED)
            if apos + 2 * have > arena.shape[0]:
                return -1
            for k in range(2 * have):
                arena[apos + k] = buf[b + 36 + k]
            s[2 * S_DIALECTS] = apos
            s[2 * S_DIALECTS + 1] = 2 * have
            apos += 2 * have
    elif cmd == 1:  # SESSION_SETUP
        if resp:
            if end - b < 8:
                _err(f, E_TRUNCATED)
                return apos
            f[F_SESSION_FLAGS] = u16le(buf, b + 2)
            f[F_PRESENT] |= M_SESSION_FLAGS
        else:
            if end - b < 24:
                _err(f, E_TRUNCATED)
                return apos
            f[F_SESSION_FLAGS] = buf[b + 2]
            f[F_CAPABILITIES] = u32le(buf, b + 4)
            f[F_PRESENT] |= M_SESSION_FLAGS | M_CAPABILITIES
    else:  # TREE_CONNECT
        if resp:
            if end - b < 16:
                _err(f, E_TRUNCATED)
                return apos
            f[F_SHARE_TYPE] = buf[b + 2]
            f[F_SHARE_FLAGS] = u32le(buf, b + 4)
            f[F_PRESENT] |= M_TREE_CONNECT_RESPONSE
        else:
            if end - b < 8:
                _err(f, E_TRUNCATED)
                return apos
            apos = _string16(buf, pos, end, u16le(buf, b + 4), u16le(buf, b + 6), s, S_TREE, arena, apos, f)
    return apos


@njit(cache=True, _nrt=False)
def _create(buf, pos, b, end, resp, f, s, arena, apos):
    """CREATE request (MS-SMB2 2.2.13) and response (2.2.14)."""
    if resp:
        if end - b < 88:
            _err(f, E_TRUNCATED)
            return apos
        f[F_OPLOCK_LEVEL] = buf[b + 2]
        f[F_PRESENT] |= M_OPLOCK_LEVEL
        f[F_CREATE_ACTION] = u32le(buf, b + 4)
        f[F_PRESENT] |= M_CREATE_RESPONSE
        f[F_END_OF_FILE] = _u64le(buf, b + 48)
        f[F_FILE_ATTRIBUTES] = u32le(buf, b + 56)
        f[F_PRESENT] |= M_EOF_ATTRIBUTES
        _fid(f, buf, b + 64)
        return _create_contexts(buf, pos, end, u32le(buf, b + 80), u32le(buf, b + 84), f, s, arena, apos)
    if end - b < 56:
        _err(f, E_TRUNCATED)
        return apos
    f[F_OPLOCK_LEVEL] = buf[b + 3]
    f[F_DESIRED_ACCESS] = u32le(buf, b + 24)
    f[F_FILE_ATTRIBUTES] = u32le(buf, b + 28)
    f[F_SHARE_ACCESS] = u32le(buf, b + 32)
    f[F_CREATE_DISPOSITION] = u32le(buf, b + 36)
    f[F_CREATE_OPTIONS] = u32le(buf, b + 40)
    f[F_PRESENT] |= M_CREATE_REQUEST
    apos = _string16(buf, pos, end, u16le(buf, b + 44), u16le(buf, b + 46), s, S_FILENAME, arena, apos, f)
    if apos < 0:
        return -1
    return _create_contexts(buf, pos, end, u32le(buf, b + 48), u32le(buf, b + 52), f, s, arena, apos)


@njit(cache=True, _nrt=False)
def _file_ops(buf, pos, b, end, cmd, resp, f, s, arena, apos):
    """CLOSE (2.2.15/16), FLUSH (2.2.17), READ (2.2.19/20), WRITE (2.2.21/22), LOCK (2.2.26),
    IOCTL (2.2.31/32), QUERY_DIRECTORY (2.2.33), CHANGE_NOTIFY (2.2.35), QUERY_INFO (2.2.37),
    SET_INFO (2.2.39)."""
    have = end - b
    if cmd == 6:  # CLOSE
        if resp:
            if have < 60:
                _err(f, E_TRUNCATED)
            elif u16le(buf, b + 2) & 1:  # SMB2_CLOSE_FLAG_POSTQUERY_ATTRIB
                f[F_END_OF_FILE] = _u64le(buf, b + 48)
                f[F_FILE_ATTRIBUTES] = u32le(buf, b + 56)
                f[F_PRESENT] |= M_EOF_ATTRIBUTES
        elif have < 24:
            _err(f, E_TRUNCATED)
        else:
            _fid(f, buf, b + 8)
    elif cmd == 7:  # FLUSH
        if not resp:
            if have < 24:
                _err(f, E_TRUNCATED)
            else:
                _fid(f, buf, b + 8)
    elif cmd == 8 or cmd == 9:  # READ / WRITE
        if resp:
            if have < 8:
                _err(f, E_TRUNCATED)
            else:
                f[F_IO_LENGTH] = u32le(buf, b + 4)
                f[F_PRESENT] |= M_IO_LENGTH
        elif have < 48:
            _err(f, E_TRUNCATED)
        else:
            f[F_IO_LENGTH] = u32le(buf, b + 4)
            f[F_PRESENT] |= M_IO_LENGTH
            f[F_FILE_OFFSET] = _u64le(buf, b + 8)
            f[F_PRESENT] |= M_FILE_OFFSET
            _fid(f, buf, b + 16)
    elif cmd == 10:  # LOCK
        if not resp:
            if have < 24:
                _err(f, E_TRUNCATED)
            else:
                count = u16le(buf, b + 2)
                f[F_LOCK_COUNT] = count
                f[F_PRESENT] |= M_LOCK_COUNT
                _fid(f, buf, b + 8)
                if count == 0:
                    _err(f, E_BAD_LOCK_COUNT)
                elif have < 48:
                    _err(f, E_TRUNCATED)
                else:
                    f[F_LOCK_OFFSET] = _u64le(buf, b + 24)
                    f[F_LOCK_LENGTH] = _u64le(buf, b + 32)
                    f[F_LOCK_FLAGS] = u32le(buf, b + 40)
                    f[F_PRESENT] |= M_LOCK_RANGE
                    if have < 24 + 24 * count:
                        _err(f, E_BAD_LOCK_COUNT)
    elif cmd == 11:  # IOCTL
        if have < 24:
            _err(f, E_TRUNCATED)
        else:
            f[F_CTL_CODE] = u32le(buf, b + 4)
            f[F_PRESENT] |= M_CTL_CODE
            _fid(f, buf, b + 8)
    elif cmd == 14:  # QUERY_DIRECTORY
        if not resp:
            if have < 32:
                _err(f, E_TRUNCATED)
            else:
                f[F_INFO_CLASS] = buf[b + 2]
                f[F_PRESENT] |= M_INFO_CLASS
                _fid(f, buf, b + 8)
                apos = _string16(buf, pos, end, u16le(buf, b + 24), u16le(buf, b + 26), s, S_PATTERN,
                                 arena, apos, f)
    elif cmd == 15:  # CHANGE_NOTIFY
        if not resp:
            if have < 32:
                _err(f, E_TRUNCATED)
            else:
                f[F_NOTIFY_FLAGS] = u16le(buf, b + 2)
                _fid(f, buf, b + 8)
                f[F_COMPLETION_FILTER] = u32le(buf, b + 24)
                f[F_PRESENT] |= M_CHANGE_NOTIFY
    elif cmd == 16:  # QUERY_INFO
        if not resp:
            if have < 40:
                _err(f, E_TRUNCATED)
            else:
                f[F_INFO_TYPE] = buf[b + 2]
                f[F_INFO_CLASS] = buf[b + 3]
                f[F_PRESENT] |= M_INFO_TYPE_CLASS
                _fid(f, buf, b + 24)
    elif cmd == 17:  # SET_INFO
        if not resp:
            if have < 32:
                _err(f, E_TRUNCATED)
            else:
                info_type = buf[b + 2]
                info_class = buf[b + 3]
                f[F_INFO_TYPE] = info_type
                f[F_INFO_CLASS] = info_class
                f[F_PRESENT] |= M_INFO_TYPE_CLASS
                _fid(f, buf, b + 16)
                apos = _set_info_buffer(buf, pos, end, info_type, info_class, u32le(buf, b + 4),
                                        u16le(buf, b + 8), f, s, arena, apos)
    return apos


@njit(cache=True, _nrt=False)
def _set_info_buffer(buf, pos, end, info_type, info_class, blen, boff, f, s, arena, apos):
    """The SET_INFO buffers that matter for breaks and TOCTOU (MS-FSCC 2.4): rename/link target
    (2.4.37.2 SMB2 form: FileNameLength at 16, FileName at 20), disposition (2.4.11, 2.4.12),
    end of file (2.4.14), basic information's attributes (2.4.7)."""
    if info_type != 1 or blen == 0:
        return apos
    d = pos + boff
    if boff < HEADER or d + blen > end:
        _err(f, E_BAD_OFFSET)
        return apos
    if info_class == 10 or info_class == 11 or info_class == 65:  # rename, link, rename ex
        if blen < 20:
            _err(f, E_TRUNCATED)
            return apos
        n = u32le(buf, d + 16)
        if n > blen - 20:
            _err(f, E_BAD_OFFSET)
            return apos
        new = put_utf16le(arena, apos, buf, d + 20, n)
        if new < 0:
            return -1
        s[2 * S_TARGET_NAME] = apos
        s[2 * S_TARGET_NAME + 1] = new - apos
        return new
    if info_class == 13:
        f[F_DELETE_PENDING] = buf[d] != 0
        f[F_PRESENT] |= M_DELETE_PENDING
    elif info_class == 64:
        if blen < 4:
            _err(f, E_TRUNCATED)
        else:
            f[F_DELETE_PENDING] = (u32le(buf, d) & 1) != 0  # FILE_DISPOSITION_DELETE
            f[F_PRESENT] |= M_DELETE_PENDING
    elif info_class == 20:
        if blen < 8:
            _err(f, E_TRUNCATED)
        else:
            f[F_END_OF_FILE] = _u64le(buf, d)
            f[F_PRESENT] |= M_END_OF_FILE
    elif info_class == 4:
        if blen < 36:
            _err(f, E_TRUNCATED)
        else:
            f[F_FILE_ATTRIBUTES] = u32le(buf, d + 32)
            f[F_PRESENT] |= M_FILE_ATTRIBUTES
    return apos


@njit(cache=True, _nrt=False)
def _oplock_break(buf, b, end, resp, ss, message_id, f, s, arena, apos):
    """The OPLOCK_BREAK forms, told apart by StructureSize (MS-SMB2 2.2.23-2.2.25): 24 oplock
    break notification / acknowledgment / response, 44 lease break notification, 36 lease break
    acknowledgment / response. Notifications carry MessageId 0xFFFFFFFFFFFFFFFF (3.3.4.6, 3.3.4.7)."""
    have = end - b
    if ss == 24:
        if have < 24:
            _err(f, E_TRUNCATED)
            return apos
        if not resp:
            kind = t.BREAK_OPLOCK_ACK
        elif message_id == UNSOLICITED:
            kind = t.BREAK_OPLOCK_NOTIFICATION
        else:
            kind = t.BREAK_OPLOCK_RESPONSE
        f[F_BREAK_KIND] = kind
        f[F_PRESENT] |= M_BREAK_KIND
        f[F_OPLOCK_LEVEL] = buf[b + 2]
        f[F_PRESENT] |= M_OPLOCK_LEVEL
        _fid(f, buf, b + 8)
    elif ss == 44:
        if have < 44:
            _err(f, E_TRUNCATED)
            return apos
        f[F_BREAK_KIND] = t.BREAK_LEASE_NOTIFICATION
        f[F_LEASE_EPOCH] = u16le(buf, b + 2)
        f[F_LEASE_FLAGS] = u32le(buf, b + 4)
        apos = _guid(buf, b + 8, s, S_LEASE_KEY, arena, apos)
        f[F_LEASE_STATE] = u32le(buf, b + 24)
        f[F_PRESENT] |= M_LEASE_BREAK_ACK
        f[F_NEW_LEASE_STATE] = u32le(buf, b + 28)
        f[F_BREAK_REASON] = u32le(buf, b + 32)
        f[F_PRESENT] |= M_LEASE_BREAK_NOTIFICATION
    elif ss == 36:
        if have < 36:
            _err(f, E_TRUNCATED)
            return apos
        f[F_BREAK_KIND] = t.BREAK_LEASE_RESPONSE if resp else t.BREAK_LEASE_ACK
        f[F_LEASE_FLAGS] = u32le(buf, b + 4)
        apos = _guid(buf, b + 8, s, S_LEASE_KEY, arena, apos)
        f[F_LEASE_STATE] = u32le(buf, b + 24)
        f[F_PRESENT] |= M_LEASE_BREAK_ACK
    else:
        _err(f, E_BAD_STRUCTURE_SIZE)
    return apos


# Response StructureSize of each command (MS-SMB2 2.2.4 ... 2.2.40); 9 is also the error response's
# (2.2.2), so for these commands the status tells an error body from a regular one.
_RESPONSE_SIZE = np.array([65, 9, 4, 16, 4, 89, 60, 4, 17, 17, 4, 49, 4, 4, 9, 9, 9, 2, 24, 8], np.int64)


@njit(cache=True, _nrt=False)
def _smb2(buf, pos, end, f, s, arena, apos):
    """One SMB2 header (MS-SMB2 2.2.1.1 async / 2.2.1.2 sync) and its command body."""
    f[F_KIND] = KIND_SMB2
    if end - pos < HEADER:
        _err(f, E_TRUNCATED)
        if end - pos >= 14:
            f[F_COMMAND_CODE] = u16le(buf, pos + 12)
            f[F_PRESENT] |= M_COMMAND_CODE
        if end - pos >= 20:
            f[F_IS_RESPONSE] = u32le(buf, pos + 16) & 1
            f[F_PRESENT] |= M_IS_RESPONSE
        return apos
    flags = u32le(buf, pos + 16)
    resp = (flags & 1) != 0
    cmd = u16le(buf, pos + 12)
    f[F_COMMAND_CODE] = cmd
    f[F_FLAGS] = flags
    f[F_IS_RESPONSE] = resp
    f[F_CREDIT_CHARGE] = u16le(buf, pos + 6)
    status = u32le(buf, pos + 8)
    if resp:
        f[F_STATUS_CODE] = status
        f[F_CREDIT_GRANT] = u16le(buf, pos + 14)
        f[F_PRESENT] |= M_RESPONSE_HEADER
    else:
        f[F_CHANNEL_SEQUENCE] = u16le(buf, pos + 8)
        f[F_CREDIT_REQUEST] = u16le(buf, pos + 14)
        f[F_PRESENT] |= M_REQUEST_HEADER
    message_id = _u64le(buf, pos + 24)
    f[F_MESSAGE_ID] = message_id
    if flags & 2:
        f[F_ASYNC_ID] = _u64le(buf, pos + 32)
        f[F_PRESENT] |= M_ASYNC_ID
    else:
        f[F_TREE_ID] = u32le(buf, pos + 36)
        f[F_PRESENT] |= M_TREE_ID
    f[F_SESSION_ID] = _u64le(buf, pos + 40)
    signed = False
    for k in range(16):
        if buf[pos + 48 + k] != 0:
            signed = True
            break
    f[F_HAS_SIGNATURE] = signed
    f[F_PRESENT] |= M_HEADER
    if u16le(buf, pos + 4) != HEADER:
        _err(f, E_BAD_HEADER)
        return apos
    b = pos + HEADER
    if end - b < 2:
        _err(f, E_TRUNCATED)
        return apos
    ss = u16le(buf, b)
    f[F_STRUCTURE_SIZE] = ss
    f[F_PRESENT] |= M_STRUCTURE_SIZE
    if resp and ss == 9:
        normal = _RESPONSE_SIZE[cmd] if cmd < 20 else 0
        severe = (status >> 30) == 3 and status != STATUS_MORE_PROCESSING_REQUIRED
        if normal != 9 or severe or status == STATUS_PENDING:
            f[F_ERROR_BODY] = True  # SMB2 ERROR Response (2.2.2)
            f[F_PRESENT] |= M_ERROR_BODY
            return apos
    if cmd <= 1 or cmd == 3:
        if resp and cmd == 1 and status != 0 and status != STATUS_MORE_PROCESSING_REQUIRED:
            return apos
        return _session_tree(buf, pos, b, end, cmd, resp, status, f, s, arena, apos)
    if cmd == 5:
        return _create(buf, pos, b, end, resp, f, s, arena, apos)
    if cmd == 18:
        return _oplock_break(buf, b, end, resp, ss, message_id, f, s, arena, apos)
    if 6 <= cmd <= 17:
        return _file_ops(buf, pos, b, end, cmd, resp, f, s, arena, apos)
    return apos  # LOGOFF, TREE_DISCONNECT, CANCEL, ECHO: nothing beyond the header


@njit(cache=True, _nrt=False)
def _other(buf, start, end, kind, f):
    """The rows of messages that are not SMB2 header chains."""
    f[F_KIND] = kind
    have = end - start
    if kind == KIND_TRANSFORM:  # MS-SMB2 2.2.41
        if have < 52:
            _err(f, E_TRUNCATED)
        else:
            f[F_ORIGINAL_SIZE] = u32le(buf, start + 36)
            f[F_SESSION_ID] = _u64le(buf, start + 44)
            f[F_PRESENT] |= M_TRANSFORM
    elif kind == KIND_COMPRESSED:  # MS-SMB2 2.2.42
        if have < 16:
            _err(f, E_TRUNCATED)
        else:
            f[F_ORIGINAL_SIZE] = u32le(buf, start + 4)
            f[F_PRESENT] |= M_ORIGINAL_SIZE
    elif kind == KIND_SMB1:  # MS-CIFS 2.2.3.1
        if have < 32:
            _err(f, E_TRUNCATED)
        else:
            f[F_COMMAND_CODE] = buf[start + 4]
            if u16le(buf, start + 10) & 0x4000:  # SMB_FLAGS2_NT_STATUS
                f[F_STATUS_CODE] = u32le(buf, start + 5)
                f[F_PRESENT] |= M_STATUS_CODE
            f[F_IS_RESPONSE] = (buf[start + 9] & 0x80) != 0
            f[F_TREE_ID] = u16le(buf, start + 24)
            f[F_SESSION_ID] = u16le(buf, start + 28)
            f[F_MESSAGE_ID] = u16le(buf, start + 30)
            f[F_PRESENT] |= M_SMB1
    else:
        _err(f, E_UNKNOWN_PROTOCOL)


@njit(cache=True)
def decode(buf, offset, length, wire_length, first, row, apos, arena, o8, o4, o2, o1):
    """Decode messages ``first..`` into rows ``row..`` of ``out``, strings into ``arena`` from
    ``apos``. Returns ``(next message, next row, next arena position)``; when the arena fills up it
    stops before the message that did not fit, and the caller grows the arena and calls again."""
    n = offset.shape[0]
    f = np.zeros(N_FIELDS + 1, np.int64)
    s = np.zeros(2 * N_STRINGS, np.int64)
    for i in range(first, n):
        if length[i] == 0:
            continue
        start = offset[i]
        end = start + np.int64(length[i])
        wire_end = start + max(np.int64(wire_length[i]), np.int64(length[i]))
        kind = _protocol(buf, start, end)
        msg_row = row
        msg_apos = apos
        pos = start
        index = 0
        while True:
            f[:] = 0
            for k in range(N_STRINGS):
                s[2 * k + 1] = -1
            if kind == KIND_SMB2:
                nxt = _next_element(buf, pos, end, wire_end)
                elem_end = nxt if nxt > 0 else end
                apos = _smb2(buf, pos, elem_end, f, s, arena, apos)
                if nxt == -1:
                    _err(f, E_BAD_NEXT_COMMAND)
                elif nxt == -2:
                    _err(f, E_TRUNCATED)
            else:
                nxt = 0
                _other(buf, start, end, kind, f)
            if apos < 0:
                return i, msg_row, msg_apos
            f[F_CHAIN_INDEX] = index
            f[F_CHAIN_OFFSET] = pos - start
            f[F_PRESENT] |= M_ALWAYS
            if f[F_DECODE_ERROR] != 0:
                f[F_PRESENT] |= M_DECODE_ERROR
            # Store only what is present: a row has ~15 of the ~70 columns, and each column is its own
            # memory stream (the arrays are zeroed, so absent values read 0 and are masked as null).
            present = f[F_PRESENT]
            for k in range(N_FIELDS):
                if (present >> k) & 1:
                    g = FIELD_GROUP[k]
                    j = FIELD_POS[k]
                    if g == 0:
                        o8[j, row] = f[k]
                    elif g == 1:
                        o4[j, row] = f[k]
                    elif g == 2:
                        o2[j, row] = f[k]
                    else:
                        o1[j, row] = f[k]
            o8[X_PRESENT + 1, row] = i
            for k in range(N_STRINGS):
                if s[2 * k + 1] >= 0:
                    present |= np.int64(1) << (STRING_BIT + k)
                    o8[X_PRESENT + 2 + 2 * k, row] = s[2 * k]
                    o8[X_PRESENT + 3 + 2 * k, row] = s[2 * k + 1]
            o8[X_PRESENT, row] = present
            row += 1
            if nxt <= 0:
                break
            pos = nxt
            index += 1
    return n, row, apos
