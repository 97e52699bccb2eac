"""Text the SMB2 kernels write into the byte arena: UTF-16LE names transcoded to UTF-8 (SMB2 names
are UTF-16LE, MS-SMB2 2.2.13 "Buffer") and GUIDs as Wireshark prints them; the result is always
valid UTF-8 (see :func:`put_utf16le`)."""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import smb2_layout as L
from . import smb2_tables as t
from .smb2_rows import set_error
from .text import HEX_DIGITS

BACKSLASH = 0x5C
ESCAPE_U = 0x75  # "u": \uDXXX for an unpaired surrogate
ESCAPE_X = 0x78  # "x": \xNN for a control character or a dangling byte
DASH = 0x2D
# UTF-16 surrogates (RFC 2781 §2.2); below: UTF-8 sequences of 1-4 bytes (RFC 3629 §3)
HIGH_SURROGATE, LOW_SURROGATE, SURROGATE_END = 0xD800, 0xDC00, 0xE000
FIRST_PRINTABLE, DEL = 0x20, 0x7F


@njit(cache=True, _nrt=False)
def _put_escape(arena, pos, prefix, value, digits):
    """``\\x`` + 2 or ``\\u`` + 4 hex digits. Returns the new position or -1 when full."""
    if pos + 2 + digits > arena.shape[0]:
        return -1
    arena[pos] = BACKSLASH
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
        if HIGH_SURROGATE <= u < LOW_SURROGATE and k < units:
            low = np.int64(src[start + 2 * k]) | (np.int64(src[start + 2 * k + 1]) << 8)
            if LOW_SURROGATE <= low < SURROGATE_END:
                cp = 0x10000 + ((u - HIGH_SURROGATE) << 10) + (low - LOW_SURROGATE)
                k += 1
        if HIGH_SURROGATE <= cp < SURROGATE_END:
            pos = _put_escape(arena, pos, ESCAPE_U, cp, 4)
        elif cp < FIRST_PRINTABLE or cp == DEL:
            pos = _put_escape(arena, pos, ESCAPE_X, cp, 2)
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
        pos = _put_escape(arena, pos, ESCAPE_X, np.int64(src[start + n - 1]), 2)
    return pos


@njit(cache=True, _nrt=False)
def put_guid(arena, pos, src, off):
    """16 bytes as a GUID the way Wireshark prints FT_GUID (MS-DTYP 2.3.4.2: the first three
    fields little-endian): ``1f79bcfb-03c3-094c-86cc-6e8b2d018097``. -1 when the arena is full."""
    if pos + L.GUID_TEXT_SIZE > arena.shape[0]:
        return -1
    order = (3, 2, 1, 0, -1, 5, 4, -1, 7, 6, -1, 8, 9, -1, 10, 11, 12, 13, 14, 15)
    for j in order:
        if j < 0:
            arena[pos] = DASH
            pos += 1
        else:
            b = src[off + j]
            arena[pos] = HEX_DIGITS[b >> 4]
            arena[pos + 1] = HEX_DIGITS[b & 15]
            pos += 2
    return pos


@njit(cache=True, _nrt=False)
def put_string16(buf, pos, end, name_off, name_len, s, slot, arena, apos, f):
    """A UTF-16LE name at ``pos + name_off`` (offsets count from the SMB2 header, MS-SMB2 2.2.13
    NameOffset). Out of the element's bounds: ``bad offset``, the string stays null."""
    if name_len == 0:
        s[2 * slot] = apos
        s[2 * slot + 1] = 0
        return apos
    start = pos + name_off
    if name_off < L.HEADER or start + name_len > end:
        set_error(f, t.E_BAD_OFFSET)
        return apos
    new = put_utf16le(arena, apos, buf, start, name_len)
    if new < 0:
        return -1
    s[2 * slot] = apos
    s[2 * slot + 1] = new - apos
    return new


@njit(cache=True, _nrt=False)
def put_guid_slot(buf, off, s, slot, arena, apos):
    """The GUID at ``off`` into string slot ``slot``."""
    new = put_guid(arena, apos, buf, off)
    if new < 0:
        return -1
    s[2 * slot] = apos
    s[2 * slot + 1] = L.GUID_TEXT_SIZE
    return new
