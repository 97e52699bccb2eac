"""Numba kernels of the SMB2/3 decoder: NBSS messages → one row per SMB2 header.

Input is the message set's ``(buf, offset, length, wire_length)``: each message is what one NetBIOS
session message (RFC 1002 4.3.1, MS-SMB2 2.1) carried after its 4-byte header. It holds one SMB2
header chain (MS-SMB2 2.2.1, compounded by NextCommand, 3.2.4.1.4), an SMB2 TRANSFORM_HEADER
(2.2.41, encrypted), a COMPRESSION_TRANSFORM_HEADER (2.2.42), or an SMB1 header (MS-CIFS 2.2.3.1).

Two passes: :func:`count_rows` walks the NextCommand chains to size the output, :func:`decode`
fills it. Both use :func:`next_element`, so they agree on the number of rows. Every offset read
from the wire is checked against the end of its element (``pos + NextCommand``, or the end of the
available bytes for the last one) before use; NextCommand must move forward by at least a header
(64 bytes) and create contexts by at least a context header, so no chain can loop.

The modules: :mod:`.smb2_layout` (wire offsets, spec-cited), :mod:`.smb2_rows` (the row layout the
frame builder shares: ``FIELDS``, ``F_*``, ``M_*``, ``S_*``, :class:`RowColumns`), :mod:`.smb2_text`
(UTF-16LE names and GUIDs into the arena), :mod:`.smb2_commands` (the command bodies), and this one:
the header, the chains and the row store.
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import smb2_layout as L
from . import smb2_tables as t
from .ntstatus import STATUS_MORE_PROCESSING_REQUIRED, STATUS_PENDING, STATUS_SUCCESS
from .smb2_commands import create, file_ops, oplock_break, session_tree
from .smb2_rows import (
    F_ASYNC_ID, F_CHAIN_INDEX, F_CHAIN_OFFSET, F_CHANNEL_SEQUENCE, F_COMMAND_CODE, F_CREDIT_CHARGE,
    F_CREDIT_GRANT, F_CREDIT_REQUEST, F_DECODE_ERROR, F_ERROR_BODY, F_FLAGS, F_HAS_SIGNATURE, F_IS_RESPONSE,
    F_KIND, F_MESSAGE_ID, F_ORIGINAL_SIZE, F_PRESENT, F_SESSION_ID, F_STATUS_CODE, F_STRUCTURE_SIZE, F_TREE_ID,
    FIELD_GROUP, FIELD_POS, M_ALWAYS, M_ASYNC_ID, M_COMMAND_CODE, M_DECODE_ERROR, M_ERROR_BODY, M_HEADER,
    M_IS_RESPONSE, M_ORIGINAL_SIZE, M_REQUEST_HEADER, M_RESPONSE_HEADER, M_SMB1, M_STATUS_CODE, M_STRUCTURE_SIZE,
    M_TRANSFORM, M_TREE_ID, N_FIELDS, N_STRINGS, STRING_BIT, X_PRESENT, set_error, u16le, u32le, u64le)
# The row layout the frame builder in smb2.py reads back (it is defined in smb2_rows).
from .smb2_rows import FIELD_DTYPES, FIELDS, S_DIALECTS, STRINGS, U64_FIELDS, allocate_rows  # noqa: F401
from .smb2_text import put_guid, put_utf16le  # noqa: F401  (tests call them through this module)

# Response StructureSize of each command (MS-SMB2 2.2.4 ... 2.2.40), indexed by command code; 9 is also
# the ERROR response's (2.2.2), so for these commands the status tells an error body from a regular one.
RESPONSE_SIZE = np.array([65, 9, 4, 16, 4, 89, 60, 4, 17, 17, 4, 49, 4, 4, 9, 9, 9, 2, 24, 8], np.int64)
assert RESPONSE_SIZE.shape[0] == len(t.COMMANDS)
# NTSTATUS Sev (MS-ERREF 2.3): the top two bits; 3 = STATUS_SEVERITY_ERROR
SEVERITY_SHIFT = 30
SEVERITY_ERROR = 3


@njit(cache=True, inline="always")
def _protocol(buf, start, end):
    """Which header an NBSS message starts with (MS-SMB2 2.2.1, 2.2.41, 2.2.42; MS-CIFS 2.2.3.1)."""
    if (end - start < L.PROTOCOL_ID_SIZE or buf[start + 1] != L.PROTOCOL_S or buf[start + 2] != L.PROTOCOL_M
            or buf[start + 3] != L.PROTOCOL_B):
        return t.KIND_UNKNOWN
    b = buf[start]
    if b == L.PROTOCOL_SMB2:
        return t.KIND_SMB2
    if b == L.PROTOCOL_TRANSFORM:
        return t.KIND_TRANSFORM
    if b == L.PROTOCOL_COMPRESSED:
        return t.KIND_COMPRESSED
    if b == L.PROTOCOL_SMB1:
        return t.KIND_SMB1
    return t.KIND_UNKNOWN


@njit(cache=True, inline="always")
def next_element(buf, pos, end, wire_end):
    """Start of the next compound element after the SMB2 header at ``pos`` (MS-SMB2 2.2.1.2
    NextCommand): 0 when this is the last, -1 when NextCommand is bogus (shorter than a header, or
    past the end of the message), -2 when the next element lies beyond the captured bytes."""
    if end - pos < L.HDR_NEXT_COMMAND + 4:
        return 0
    nxt = u32le(buf, pos + L.HDR_NEXT_COMMAND)
    if nxt == 0:
        return 0
    if nxt < L.HEADER:
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
        if _protocol(buf, start, end) != t.KIND_SMB2:
            counts[i] = 1
            continue
        c = 1
        pos = start
        wire_end = start + max(np.int64(wire_length[i]), np.int64(length[i]))
        while True:
            nxt = next_element(buf, pos, end, wire_end)
            if nxt <= 0:
                break
            pos = nxt
            c += 1
        counts[i] = c
    return counts


# --- the header and the store -------------------------------------------------------------------

@njit(cache=True, _nrt=False)
def _smb2(buf, pos, end, f, s, arena, apos):
    """One SMB2 header (MS-SMB2 2.2.1.1 async / 2.2.1.2 sync) and its command body."""
    f[F_KIND] = t.KIND_SMB2
    if end - pos < L.HEADER:
        set_error(f, t.E_TRUNCATED)
        if end - pos >= L.HDR_COMMAND + 2:
            f[F_COMMAND_CODE] = u16le(buf, pos + L.HDR_COMMAND)
            f[F_PRESENT] |= M_COMMAND_CODE
        if end - pos >= L.HDR_FLAGS + 4:
            f[F_IS_RESPONSE] = u32le(buf, pos + L.HDR_FLAGS) & t.FLAGS_SERVER_TO_REDIR
            f[F_PRESENT] |= M_IS_RESPONSE
        return apos
    flags = u32le(buf, pos + L.HDR_FLAGS)
    resp = (flags & t.FLAGS_SERVER_TO_REDIR) != 0
    cmd = u16le(buf, pos + L.HDR_COMMAND)
    f[F_COMMAND_CODE] = cmd
    f[F_FLAGS] = flags
    f[F_IS_RESPONSE] = resp
    f[F_CREDIT_CHARGE] = u16le(buf, pos + L.HDR_CREDIT_CHARGE)
    status = u32le(buf, pos + L.HDR_STATUS)
    if resp:
        f[F_STATUS_CODE] = status
        f[F_CREDIT_GRANT] = u16le(buf, pos + L.HDR_CREDIT)
        f[F_PRESENT] |= M_RESPONSE_HEADER
    else:
        f[F_CHANNEL_SEQUENCE] = u16le(buf, pos + L.HDR_CHANNEL_SEQUENCE)
        f[F_CREDIT_REQUEST] = u16le(buf, pos + L.HDR_CREDIT)
        f[F_PRESENT] |= M_REQUEST_HEADER
    message_id = u64le(buf, pos + L.HDR_MESSAGE_ID)
    f[F_MESSAGE_ID] = message_id
    if flags & t.FLAGS_ASYNC_COMMAND:
        f[F_ASYNC_ID] = u64le(buf, pos + L.HDR_ASYNC_ID)
        f[F_PRESENT] |= M_ASYNC_ID
    else:
        f[F_TREE_ID] = u32le(buf, pos + L.HDR_TREE_ID)
        f[F_PRESENT] |= M_TREE_ID
    f[F_SESSION_ID] = u64le(buf, pos + L.HDR_SESSION_ID)
    signed = False
    for k in range(L.HDR_SIGNATURE_SIZE):
        if buf[pos + L.HDR_SIGNATURE + k] != 0:
            signed = True
            break
    f[F_HAS_SIGNATURE] = signed
    f[F_PRESENT] |= M_HEADER
    if u16le(buf, pos + L.HDR_STRUCTURE_SIZE) != L.HEADER:
        set_error(f, t.E_BAD_HEADER)
        return apos
    return body(buf, pos, end, cmd, resp, status, message_id, f, s, arena, apos)


@njit(cache=True, _nrt=False)
def body(buf, pos, end, cmd, resp, status, message_id, f, s, arena, apos):
    """The command body after the header at ``pos``: its StructureSize, an ERROR response (2.2.2), or
    the command's own fields (:mod:`analyzer.decoders.smb2_commands`)."""
    b = pos + L.HEADER
    if end - b < 2:
        set_error(f, t.E_TRUNCATED)
        return apos
    ss = u16le(buf, b + L.BODY_STRUCTURE_SIZE)
    f[F_STRUCTURE_SIZE] = ss
    f[F_PRESENT] |= M_STRUCTURE_SIZE
    if resp and ss == L.ERROR_STRUCTURE_SIZE:
        normal = RESPONSE_SIZE[cmd] if cmd < RESPONSE_SIZE.shape[0] else 0
        severe = (status >> SEVERITY_SHIFT) == SEVERITY_ERROR and status != STATUS_MORE_PROCESSING_REQUIRED
        if normal != L.ERROR_STRUCTURE_SIZE or severe or status == STATUS_PENDING:
            f[F_ERROR_BODY] = True  # SMB2 ERROR Response (2.2.2)
            f[F_PRESENT] |= M_ERROR_BODY
            return apos
    if cmd == t.NEGOTIATE or cmd == t.SESSION_SETUP or cmd == t.TREE_CONNECT:
        if resp and cmd == t.SESSION_SETUP and status != STATUS_SUCCESS and status != STATUS_MORE_PROCESSING_REQUIRED:
            return apos
        return session_tree(buf, pos, b, end, cmd, resp, status, f, s, arena, apos)
    if cmd == t.CREATE:
        return create(buf, pos, b, end, resp, f, s, arena, apos)
    if cmd == t.OPLOCK_BREAK:
        return oplock_break(buf, b, end, resp, ss, message_id, f, s, arena, apos)
    if t.CLOSE <= cmd <= t.SET_INFO:
        return file_ops(buf, pos, b, end, cmd, resp, f, s, arena, apos)
    return apos  # LOGOFF, TREE_DISCONNECT, CANCEL, ECHO: nothing beyond the header


@njit(cache=True, _nrt=False)
def _other(buf, start, end, kind, f):
    """The rows of messages that are not SMB2 header chains."""
    f[F_KIND] = kind
    have = end - start
    if kind == t.KIND_TRANSFORM:  # MS-SMB2 2.2.41
        if have < L.TRANSFORM_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            f[F_ORIGINAL_SIZE] = u32le(buf, start + L.TRANSFORM_ORIGINAL_SIZE)
            f[F_SESSION_ID] = u64le(buf, start + L.TRANSFORM_SESSION_ID)
            f[F_PRESENT] |= M_TRANSFORM
    elif kind == t.KIND_COMPRESSED:  # MS-SMB2 2.2.42
        if have < L.COMPRESSED_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            f[F_ORIGINAL_SIZE] = u32le(buf, start + L.COMPRESSED_ORIGINAL_SIZE)
            f[F_PRESENT] |= M_ORIGINAL_SIZE
    elif kind == t.KIND_SMB1:  # MS-CIFS 2.2.3.1
        if have < L.SMB1_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            f[F_COMMAND_CODE] = buf[start + L.SMB1_COMMAND]
            if u16le(buf, start + L.SMB1_FLAGS2) & L.SMB1_FLAGS2_NT_STATUS:
                f[F_STATUS_CODE] = u32le(buf, start + L.SMB1_STATUS)
                f[F_PRESENT] |= M_STATUS_CODE
            f[F_IS_RESPONSE] = (buf[start + L.SMB1_FLAGS] & L.SMB1_FLAGS_REPLY) != 0
            f[F_TREE_ID] = u16le(buf, start + L.SMB1_TID)
            f[F_SESSION_ID] = u16le(buf, start + L.SMB1_UID)
            f[F_MESSAGE_ID] = u16le(buf, start + L.SMB1_MID)
            f[F_PRESENT] |= M_SMB1
    else:
        set_error(f, t.E_UNKNOWN_PROTOCOL)


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
            if kind == t.KIND_SMB2:
                nxt = next_element(buf, pos, end, wire_end)
                elem_end = nxt if nxt > 0 else end
                apos = _smb2(buf, pos, elem_end, f, s, arena, apos)
                if nxt == -1:
                    set_error(f, t.E_BAD_NEXT_COMMAND)
                elif nxt == -2:
                    set_error(f, t.E_TRUNCATED)
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
