"""The command bodies of the SMB2 kernel (MS-SMB2 2.2.3 - 2.2.39): one helper per command family,
called by :func:`analyzer.decoders.smb2_kernel.body` once the header is read. Each fills the row's
field vector ``f`` and string slots ``s`` (:mod:`analyzer.decoders.smb2_rows`), reads offsets and sizes
from :mod:`analyzer.decoders.smb2_layout`, checks every length and offset read from the wire against
the element's end before use, and returns the new arena position (-1 when the arena is full)."""
from __future__ import annotations

from ..jit import njit

from . import smb2_layout as L
from . import smb2_tables as t
from .smb2_rows import (
    F_BREAK_KIND, F_BREAK_REASON, F_CAPABILITIES, F_COMPLETION_FILTER, F_CREATE_ACTION, F_CREATE_DISPOSITION,
    F_CREATE_OPTIONS, F_CTL_CODE, F_DELETE_PENDING, F_DESIRED_ACCESS, F_DIALECT, F_DIALECT_COUNT, F_END_OF_FILE,
    F_FILE_ATTRIBUTES, F_FILE_OFFSET, F_INFO_CLASS, F_INFO_TYPE, F_IO_LENGTH, F_LEASE_EPOCH, F_LEASE_FLAGS,
    F_LEASE_STATE, F_LEASE_VERSION, F_LOCK_COUNT, F_LOCK_FLAGS, F_LOCK_LENGTH, F_LOCK_OFFSET, F_NEW_LEASE_STATE,
    F_NOTIFY_FLAGS, F_OPLOCK_LEVEL, F_PRESENT, F_SESSION_FLAGS, F_SHARE_ACCESS, F_SHARE_FLAGS, F_SHARE_TYPE,
    M_BREAK_KIND, M_CAPABILITIES, M_CHANGE_NOTIFY, M_CREATE_REQUEST, M_CREATE_RESPONSE, M_CTL_CODE,
    M_DELETE_PENDING, M_END_OF_FILE, M_EOF_ATTRIBUTES, M_FILE_ATTRIBUTES, M_FILE_OFFSET, M_INFO_CLASS,
    M_INFO_TYPE_CLASS, M_IO_LENGTH, M_LEASE, M_LEASE_BREAK_ACK, M_LEASE_BREAK_NOTIFICATION, M_LEASE_EPOCH,
    M_LOCK_COUNT, M_LOCK_RANGE, M_NEGOTIATE_REQUEST, M_NEGOTIATE_RESPONSE, M_OPLOCK_LEVEL, M_SESSION_FLAGS,
    M_TREE_CONNECT_RESPONSE, S_CREATE_CONTEXTS, S_DIALECTS, S_FILENAME, S_LEASE_KEY, S_PARENT_LEASE_KEY,
    S_PATTERN, S_TARGET_NAME, S_TREE, put_fid, set_error, u16le, u32le, u64le)
from .smb2_text import put_guid, put_guid_slot, put_string16, put_utf16le
from .text import put_escaped

MAX_CREATE_CONTEXTS = 64  # a CREATE carries a handful; more is hostile
MAX_DIALECTS = 64  # dialects listed in a NEGOTIATE request (real clients send up to 6)
COMMA = 0x2C  # separates the names in create_contexts


@njit(cache=True, _nrt=False)
def _create_contexts(buf, pos, end, ctx_off, ctx_len, f, s, arena, apos):
    """Walk the CREATE contexts (MS-SMB2 2.2.13.2 / 2.2.14.2): list their names, decode the lease
    (RqLs, 2.2.13.2.8 / 2.2.13.2.10 and 2.2.14.2.10 / 2.2.14.2.11)."""
    if ctx_len == 0:
        return apos
    cstart = pos + ctx_off
    cend = cstart + ctx_len
    if ctx_off < L.HEADER or cend > end:
        set_error(f, t.E_BAD_OFFSET)
        return apos
    tags_start = apos
    lease = -1
    lease_len = 0
    p = cstart
    for k in range(MAX_CREATE_CONTEXTS + 1):
        if k == MAX_CREATE_CONTEXTS:
            set_error(f, t.E_BAD_CREATE_CONTEXT)
            break
        if cend - p < L.CTX_HEADER:
            set_error(f, t.E_BAD_CREATE_CONTEXT)
            break
        nxt = u32le(buf, p + L.CTX_NEXT)
        name_off = u16le(buf, p + L.CTX_NAME_OFFSET)
        name_len = u16le(buf, p + L.CTX_NAME_LENGTH)
        data_off = u16le(buf, p + L.CTX_DATA_OFFSET)
        data_len = u32le(buf, p + L.CTX_DATA_LENGTH)
        if p + name_off + name_len > cend or (data_len > 0 and p + data_off + data_len > cend):
            set_error(f, t.E_BAD_CREATE_CONTEXT)
            break
        if k > 0:
            if apos + 1 > arena.shape[0]:
                return -1
            arena[apos] = COMMA
            apos += 1
        nstart = p + name_off
        if name_len == L.CTX_GUID_NAME_LENGTH:
            apos = put_guid(arena, apos, buf, nstart)
        else:
            apos = put_escaped(arena, apos, buf, nstart, min(name_len, L.CTX_NAME_SHOWN))
        if apos < 0:
            return -1
        if (name_len == L.CTX_TAG_LENGTH and buf[nstart] == L.LEASE_NAME_0 and buf[nstart + 1] == L.LEASE_NAME_1
                and buf[nstart + 2] == L.LEASE_NAME_2 and buf[nstart + 3] == L.LEASE_NAME_3
                and data_len >= L.LEASE_V1_SIZE):
            lease = p + data_off
            lease_len = data_len
        if nxt == 0:
            break
        if nxt < L.CTX_HEADER or p + nxt >= cend:  # forward only: no loops
            set_error(f, t.E_BAD_CREATE_CONTEXT)
            break
        p += nxt
    s[2 * S_CREATE_CONTEXTS] = tags_start
    s[2 * S_CREATE_CONTEXTS + 1] = apos - tags_start
    if lease >= 0:  # after the names, so the name list stays one contiguous string
        apos = put_guid_slot(buf, lease + L.LEASE_KEY, s, S_LEASE_KEY, arena, apos)
        if apos < 0:
            return -1
        f[F_LEASE_STATE] = u32le(buf, lease + L.LEASE_STATE)
        f[F_LEASE_FLAGS] = u32le(buf, lease + L.LEASE_FLAGS)
        f[F_PRESENT] |= M_LEASE
        if lease_len >= L.LEASE_V2_SIZE:
            f[F_LEASE_VERSION] = 2
            apos = put_guid_slot(buf, lease + L.LEASE_PARENT_KEY, s, S_PARENT_LEASE_KEY, arena, apos)
            if apos < 0:
                return -1
            f[F_LEASE_EPOCH] = u16le(buf, lease + L.LEASE_EPOCH)
            f[F_PRESENT] |= M_LEASE_EPOCH
        else:
            f[F_LEASE_VERSION] = 1
    return apos


@njit(cache=True, _nrt=False)
def session_tree(buf, pos, b, end, cmd, resp, status, f, s, arena, apos):
    """NEGOTIATE (2.2.3, 2.2.4), SESSION_SETUP (2.2.5, 2.2.6), TREE_CONNECT (2.2.9, 2.2.10)."""
    if cmd == t.NEGOTIATE:
        if resp:
            if end - b < L.NEG_RESP_SIZE:
                set_error(f, t.E_TRUNCATED)
                return apos
            f[F_DIALECT] = u16le(buf, b + L.NEG_RESP_DIALECT)
            f[F_CAPABILITIES] = u32le(buf, b + L.NEG_RESP_CAPABILITIES)
            f[F_PRESENT] |= M_NEGOTIATE_RESPONSE
        else:
            if end - b < L.NEG_REQ_SIZE:
                set_error(f, t.E_TRUNCATED)
                return apos
            count = u16le(buf, b + L.NEG_REQ_DIALECT_COUNT)
            f[F_DIALECT_COUNT] = count
            f[F_CAPABILITIES] = u32le(buf, b + L.NEG_REQ_CAPABILITIES)
            f[F_PRESENT] |= M_NEGOTIATE_REQUEST
            have = min(count, (end - (b + L.NEG_REQ_DIALECTS)) // 2, MAX_DIALECTS)
            if have < count and have < MAX_DIALECTS:
                set_error(f, t.E_TRUNCATED)
            if apos + 2 * have > arena.shape[0]:
                return -1
            for k in range(2 * have):
                arena[apos + k] = buf[b + L.NEG_REQ_DIALECTS + k]
            s[2 * S_DIALECTS] = apos
            s[2 * S_DIALECTS + 1] = 2 * have
            apos += 2 * have
    elif cmd == t.SESSION_SETUP:
        if resp:
            if end - b < L.SS_RESP_SIZE:
                set_error(f, t.E_TRUNCATED)
                return apos
            f[F_SESSION_FLAGS] = u16le(buf, b + L.SS_RESP_SESSION_FLAGS)
            f[F_PRESENT] |= M_SESSION_FLAGS
        else:
            if end - b < L.SS_REQ_SIZE:
                set_error(f, t.E_TRUNCATED)
                return apos
            f[F_SESSION_FLAGS] = buf[b + L.SS_REQ_FLAGS]
            f[F_CAPABILITIES] = u32le(buf, b + L.SS_REQ_CAPABILITIES)
            f[F_PRESENT] |= M_SESSION_FLAGS | M_CAPABILITIES
    else:  # TREE_CONNECT
        if resp:
            if end - b < L.TC_RESP_SIZE:
                set_error(f, t.E_TRUNCATED)
                return apos
            f[F_SHARE_TYPE] = buf[b + L.TC_RESP_SHARE_TYPE]
            f[F_SHARE_FLAGS] = u32le(buf, b + L.TC_RESP_SHARE_FLAGS)
            f[F_PRESENT] |= M_TREE_CONNECT_RESPONSE
        else:
            if end - b < L.TC_REQ_SIZE:
                set_error(f, t.E_TRUNCATED)
                return apos
            apos = put_string16(buf, pos, end, u16le(buf, b + L.TC_REQ_PATH_OFFSET),
                                u16le(buf, b + L.TC_REQ_PATH_LENGTH), s, S_TREE, arena, apos, f)
    return apos


@njit(cache=True, _nrt=False)
def create(buf, pos, b, end, resp, f, s, arena, apos):
    """CREATE request (MS-SMB2 2.2.13) and response (2.2.14)."""
    if resp:
        if end - b < L.CREATE_RESP_SIZE:
            set_error(f, t.E_TRUNCATED)
            return apos
        f[F_OPLOCK_LEVEL] = buf[b + L.CREATE_RESP_OPLOCK_LEVEL]
        f[F_PRESENT] |= M_OPLOCK_LEVEL
        f[F_CREATE_ACTION] = u32le(buf, b + L.CREATE_RESP_ACTION)
        f[F_PRESENT] |= M_CREATE_RESPONSE
        f[F_END_OF_FILE] = u64le(buf, b + L.CREATE_RESP_END_OF_FILE)
        f[F_FILE_ATTRIBUTES] = u32le(buf, b + L.CREATE_RESP_FILE_ATTRIBUTES)
        f[F_PRESENT] |= M_EOF_ATTRIBUTES
        put_fid(f, buf, b + L.CREATE_RESP_FILE_ID)
        return _create_contexts(buf, pos, end, u32le(buf, b + L.CREATE_RESP_CONTEXTS_OFFSET),
                                u32le(buf, b + L.CREATE_RESP_CONTEXTS_LENGTH), f, s, arena, apos)
    if end - b < L.CREATE_REQ_SIZE:
        set_error(f, t.E_TRUNCATED)
        return apos
    f[F_OPLOCK_LEVEL] = buf[b + L.CREATE_REQ_OPLOCK_LEVEL]
    f[F_DESIRED_ACCESS] = u32le(buf, b + L.CREATE_REQ_DESIRED_ACCESS)
    f[F_FILE_ATTRIBUTES] = u32le(buf, b + L.CREATE_REQ_FILE_ATTRIBUTES)
    f[F_SHARE_ACCESS] = u32le(buf, b + L.CREATE_REQ_SHARE_ACCESS)
    f[F_CREATE_DISPOSITION] = u32le(buf, b + L.CREATE_REQ_DISPOSITION)
    f[F_CREATE_OPTIONS] = u32le(buf, b + L.CREATE_REQ_OPTIONS)
    f[F_PRESENT] |= M_CREATE_REQUEST
    apos = put_string16(buf, pos, end, u16le(buf, b + L.CREATE_REQ_NAME_OFFSET),
                        u16le(buf, b + L.CREATE_REQ_NAME_LENGTH), s, S_FILENAME, arena, apos, f)
    if apos < 0:
        return -1
    return _create_contexts(buf, pos, end, u32le(buf, b + L.CREATE_REQ_CONTEXTS_OFFSET),
                            u32le(buf, b + L.CREATE_REQ_CONTEXTS_LENGTH), f, s, arena, apos)


@njit(cache=True, _nrt=False)
def file_ops(buf, pos, b, end, cmd, resp, f, s, arena, apos):
    """CLOSE (2.2.15/16), FLUSH (2.2.17), READ (2.2.19/20), WRITE (2.2.21/22), LOCK (2.2.26),
    IOCTL (2.2.31/32), QUERY_DIRECTORY (2.2.33), CHANGE_NOTIFY (2.2.35), QUERY_INFO (2.2.37),
    SET_INFO (2.2.39)."""
    have = end - b
    if cmd == t.CLOSE:
        if resp:
            if have < L.CLOSE_RESP_SIZE:
                set_error(f, t.E_TRUNCATED)
            elif u16le(buf, b + L.CLOSE_FLAGS) & L.CLOSE_FLAG_POSTQUERY_ATTRIB:
                f[F_END_OF_FILE] = u64le(buf, b + L.CLOSE_RESP_END_OF_FILE)
                f[F_FILE_ATTRIBUTES] = u32le(buf, b + L.CLOSE_RESP_FILE_ATTRIBUTES)
                f[F_PRESENT] |= M_EOF_ATTRIBUTES
        elif have < L.CLOSE_REQ_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            put_fid(f, buf, b + L.CLOSE_REQ_FILE_ID)
    elif cmd == t.FLUSH:
        if not resp:
            if have < L.FLUSH_REQ_SIZE:
                set_error(f, t.E_TRUNCATED)
            else:
                put_fid(f, buf, b + L.FLUSH_REQ_FILE_ID)
    elif cmd == t.READ or cmd == t.WRITE:
        if resp:
            if have < L.RW_RESP_SIZE:
                set_error(f, t.E_TRUNCATED)
            else:
                f[F_IO_LENGTH] = u32le(buf, b + L.RW_RESP_LENGTH)
                f[F_PRESENT] |= M_IO_LENGTH
        elif have < L.RW_REQ_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            f[F_IO_LENGTH] = u32le(buf, b + L.RW_REQ_LENGTH)
            f[F_PRESENT] |= M_IO_LENGTH
            f[F_FILE_OFFSET] = u64le(buf, b + L.RW_REQ_OFFSET)
            f[F_PRESENT] |= M_FILE_OFFSET
            put_fid(f, buf, b + L.RW_REQ_FILE_ID)
    elif cmd == t.LOCK:
        if not resp:
            _lock(buf, b, have, f)
    elif cmd == t.IOCTL:
        if have < L.IOCTL_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            f[F_CTL_CODE] = u32le(buf, b + L.IOCTL_CTL_CODE)
            f[F_PRESENT] |= M_CTL_CODE
            put_fid(f, buf, b + L.IOCTL_FILE_ID)
    elif cmd == t.QUERY_DIRECTORY:
        if not resp:
            if have < L.QD_SIZE:
                set_error(f, t.E_TRUNCATED)
            else:
                f[F_INFO_CLASS] = buf[b + L.QD_INFO_CLASS]
                f[F_PRESENT] |= M_INFO_CLASS
                put_fid(f, buf, b + L.QD_FILE_ID)
                apos = put_string16(buf, pos, end, u16le(buf, b + L.QD_NAME_OFFSET), u16le(buf, b + L.QD_NAME_LENGTH),
                                    s, S_PATTERN, arena, apos, f)
    elif cmd == t.CHANGE_NOTIFY:
        if not resp:
            if have < L.CN_SIZE:
                set_error(f, t.E_TRUNCATED)
            else:
                f[F_NOTIFY_FLAGS] = u16le(buf, b + L.CN_FLAGS)
                put_fid(f, buf, b + L.CN_FILE_ID)
                f[F_COMPLETION_FILTER] = u32le(buf, b + L.CN_COMPLETION_FILTER)
                f[F_PRESENT] |= M_CHANGE_NOTIFY
    elif cmd == t.QUERY_INFO:
        if not resp:
            if have < L.QI_SIZE:
                set_error(f, t.E_TRUNCATED)
            else:
                f[F_INFO_TYPE] = buf[b + L.QI_INFO_TYPE]
                f[F_INFO_CLASS] = buf[b + L.QI_INFO_CLASS]
                f[F_PRESENT] |= M_INFO_TYPE_CLASS
                put_fid(f, buf, b + L.QI_FILE_ID)
    elif cmd == t.SET_INFO:
        if not resp:
            if have < L.SI_SIZE:
                set_error(f, t.E_TRUNCATED)
            else:
                info_type = buf[b + L.SI_INFO_TYPE]
                info_class = buf[b + L.SI_INFO_CLASS]
                f[F_INFO_TYPE] = info_type
                f[F_INFO_CLASS] = info_class
                f[F_PRESENT] |= M_INFO_TYPE_CLASS
                put_fid(f, buf, b + L.SI_FILE_ID)
                apos = _set_info_buffer(buf, pos, end, info_type, info_class, u32le(buf, b + L.SI_BUFFER_LENGTH),
                                        u16le(buf, b + L.SI_BUFFER_OFFSET), f, s, arena, apos)
    return apos


@njit(cache=True, _nrt=False)
def _lock(buf, b, have, f):
    """LOCK request (MS-SMB2 2.2.26): the count, the FileId and the first SMB2_LOCK_ELEMENT (2.2.26.1)."""
    if have < L.LOCK_REQ_SIZE:
        set_error(f, t.E_TRUNCATED)
        return
    count = u16le(buf, b + L.LOCK_COUNT)
    f[F_LOCK_COUNT] = count
    f[F_PRESENT] |= M_LOCK_COUNT
    put_fid(f, buf, b + L.LOCK_FILE_ID)
    if count == 0:
        set_error(f, t.E_BAD_LOCK_COUNT)
    elif have < L.LOCK_ELEMENTS + L.LOCK_ELEMENT_SIZE:
        set_error(f, t.E_TRUNCATED)
    else:
        e = b + L.LOCK_ELEMENTS
        f[F_LOCK_OFFSET] = u64le(buf, e + L.LOCK_ELEMENT_OFFSET)
        f[F_LOCK_LENGTH] = u64le(buf, e + L.LOCK_ELEMENT_LENGTH)
        f[F_LOCK_FLAGS] = u32le(buf, e + L.LOCK_ELEMENT_FLAGS)
        f[F_PRESENT] |= M_LOCK_RANGE
        if have < L.LOCK_ELEMENTS + L.LOCK_ELEMENT_SIZE * count:
            set_error(f, t.E_BAD_LOCK_COUNT)


@njit(cache=True, _nrt=False)
def _set_info_buffer(buf, pos, end, info_type, info_class, blen, boff, f, s, arena, apos):
    """The SET_INFO buffers that matter for breaks and TOCTOU (MS-FSCC 2.4): rename/link target
    (2.4.37.2 SMB2 form: FileNameLength at 16, FileName at 20), disposition (2.4.11, 2.4.12),
    end of file (2.4.14), basic information's attributes (2.4.7)."""
    if info_type != L.INFO_FILE or blen == 0:
        return apos
    d = pos + boff
    if boff < L.HEADER or d + blen > end:
        set_error(f, t.E_BAD_OFFSET)
        return apos
    if (info_class == t.FILE_RENAME_INFORMATION or info_class == t.FILE_LINK_INFORMATION
            or info_class == t.FILE_RENAME_INFORMATION_EX):
        if blen < L.RENAME_SIZE:
            set_error(f, t.E_TRUNCATED)
            return apos
        n = u32le(buf, d + L.RENAME_NAME_LENGTH)
        if n > blen - L.RENAME_NAME:
            set_error(f, t.E_BAD_OFFSET)
            return apos
        new = put_utf16le(arena, apos, buf, d + L.RENAME_NAME, n)
        if new < 0:
            return -1
        s[2 * S_TARGET_NAME] = apos
        s[2 * S_TARGET_NAME + 1] = new - apos
        return new
    if info_class == t.FILE_DISPOSITION_INFORMATION:
        f[F_DELETE_PENDING] = buf[d + L.DISPOSITION_DELETE_PENDING] != 0
        f[F_PRESENT] |= M_DELETE_PENDING
    elif info_class == t.FILE_DISPOSITION_INFORMATION_EX:
        if blen < L.DISPOSITION_EX_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            f[F_DELETE_PENDING] = (u32le(buf, d + L.DISPOSITION_EX_FLAGS) & L.FILE_DISPOSITION_DELETE) != 0
            f[F_PRESENT] |= M_DELETE_PENDING
    elif info_class == t.FILE_END_OF_FILE_INFORMATION:
        if blen < L.END_OF_FILE_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            f[F_END_OF_FILE] = u64le(buf, d + L.END_OF_FILE)
            f[F_PRESENT] |= M_END_OF_FILE
    elif info_class == t.FILE_BASIC_INFORMATION:
        if blen < L.BASIC_SIZE:
            set_error(f, t.E_TRUNCATED)
        else:
            f[F_FILE_ATTRIBUTES] = u32le(buf, d + L.BASIC_FILE_ATTRIBUTES)
            f[F_PRESENT] |= M_FILE_ATTRIBUTES
    return apos


@njit(cache=True, _nrt=False)
def oplock_break(buf, b, end, resp, ss, message_id, f, s, arena, apos):
    """The OPLOCK_BREAK forms, told apart by StructureSize (MS-SMB2 2.2.23-2.2.25): 24 oplock
    break notification / acknowledgment / response, 44 lease break notification, 36 lease break
    acknowledgment / response. Notifications carry MessageId 0xFFFFFFFFFFFFFFFF (3.3.4.6, 3.3.4.7)."""
    have = end - b
    if ss == L.OPLOCK_BREAK_SIZE:
        if have < L.OPLOCK_BREAK_SIZE:
            set_error(f, t.E_TRUNCATED)
            return apos
        if not resp:
            kind = t.BREAK_OPLOCK_ACK
        elif message_id == L.UNSOLICITED:
            kind = t.BREAK_OPLOCK_NOTIFICATION
        else:
            kind = t.BREAK_OPLOCK_RESPONSE
        f[F_BREAK_KIND] = kind
        f[F_PRESENT] |= M_BREAK_KIND
        f[F_OPLOCK_LEVEL] = buf[b + L.OPLOCK_BREAK_LEVEL]
        f[F_PRESENT] |= M_OPLOCK_LEVEL
        put_fid(f, buf, b + L.OPLOCK_BREAK_FILE_ID)
    elif ss == L.LEASE_BREAK_NOTIFICATION_SIZE:
        if have < L.LEASE_BREAK_NOTIFICATION_SIZE:
            set_error(f, t.E_TRUNCATED)
            return apos
        f[F_BREAK_KIND] = t.BREAK_LEASE_NOTIFICATION
        f[F_LEASE_EPOCH] = u16le(buf, b + L.LEASE_BREAK_EPOCH)
        f[F_LEASE_FLAGS] = u32le(buf, b + L.LEASE_BREAK_FLAGS)
        apos = put_guid_slot(buf, b + L.LEASE_BREAK_KEY, s, S_LEASE_KEY, arena, apos)
        f[F_LEASE_STATE] = u32le(buf, b + L.LEASE_BREAK_STATE)
        f[F_PRESENT] |= M_LEASE_BREAK_ACK
        f[F_NEW_LEASE_STATE] = u32le(buf, b + L.LEASE_BREAK_NEW_STATE)
        f[F_BREAK_REASON] = u32le(buf, b + L.LEASE_BREAK_REASON)
        f[F_PRESENT] |= M_LEASE_BREAK_NOTIFICATION
    elif ss == L.LEASE_BREAK_ACK_SIZE:
        if have < L.LEASE_BREAK_ACK_SIZE:
            set_error(f, t.E_TRUNCATED)
            return apos
        f[F_BREAK_KIND] = t.BREAK_LEASE_RESPONSE if resp else t.BREAK_LEASE_ACK
        f[F_LEASE_FLAGS] = u32le(buf, b + L.LEASE_BREAK_FLAGS)
        apos = put_guid_slot(buf, b + L.LEASE_BREAK_KEY, s, S_LEASE_KEY, arena, apos)
        f[F_LEASE_STATE] = u32le(buf, b + L.LEASE_BREAK_STATE)
        f[F_PRESENT] |= M_LEASE_BREAK_ACK
    else:
        set_error(f, t.E_BAD_STRUCTURE_SIZE)
    return apos
