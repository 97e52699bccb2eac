"""The row layout of the nfs kernels (field indexes ``F_*``, string slots ``S_*``) and the XDR
readers and row writers they share (RFC 4506: big-endian 4-byte units, opaque<> padded to 4).

Shared by :mod:`analyzer.decoders.nfs_kernels` (RPC header, NFSv3, the message loop) and
:mod:`analyzer.decoders.nfs4_ops` (the NFSv4 operation walkers). Every reader is given the message's
``end`` and answers -1 when what it reads would pass it; -1 passed in stays -1, so calls chain.
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import nfs_layout as L
from .text import HEX_DIGITS, put_escaped

NULL = np.int64(-(1 << 63))
NOT_WALKED = -2  # an operation walker's answer for an operation it does not know (not damage)
ROOT_ID = np.int64(1 << 32)  # the id of PUTROOTFH / PUTPUBFH's filehandle and of MOUNT's export root

FIELDS = (
    "msg", "op_index", "op_count", "xid", "msg_type", "rpcvers", "prog", "vers", "proc", "auth_flavor",
    "auth_uid", "auth_gid", "reply_stat", "accept_stat", "reject_stat", "nfs_status", "minorversion",
    "opcode", "op_status", "fh_hash", "offset", "length", "lock_type", "seqid", "share_access",
    "share_deny", "open_type", "claim_type", "delegation_type", "denied_offset", "denied_length",
    "denied_type", "clientid", "slotid", "sequenceid", "highest_slotid",
    "target_highest_slotid", "cur_id", "dir_id", "decode_error",
)
STRINGS = ("machine", "tag", "fh", "name", "owner", "sessionid", "stateid")
(F_MSG, F_OP_INDEX, F_OP_COUNT, F_XID, F_MSG_TYPE, F_RPCVERS, F_PROG, F_VERS, F_PROC, F_AUTH_FLAVOR,
 F_AUTH_UID, F_AUTH_GID, F_REPLY_STAT, F_ACCEPT_STAT, F_REJECT_STAT, F_NFS_STATUS, F_MINORVERSION,
 F_OPCODE, F_OP_STATUS, F_FH_HASH, F_OFFSET, F_LENGTH, F_LOCK_TYPE, F_SEQID, F_SHARE_ACCESS,
 F_SHARE_DENY, F_OPEN_TYPE, F_CLAIM_TYPE, F_DELEGATION_TYPE, F_DENIED_OFFSET, F_DENIED_LENGTH,
 F_DENIED_TYPE, F_CLIENTID, F_SLOTID, F_SEQUENCEID, F_HIGHEST_SLOTID, F_TARGET_HIGHEST_SLOTID,
 F_CUR_ID, F_DIR_ID, F_DECODE_ERROR) = range(40)
N_INT = len(FIELDS)
S_MACHINE, S_TAG, S_FH, S_NAME, S_OWNER, S_SESSIONID, S_STATEID = (N_INT + 2 * k for k in range(7))
N_FIELDS = N_INT + 2 * len(STRINGS)
N_HEADER = F_NFS_STATUS  # columns 0..N_HEADER-1 (and S_MACHINE) are the RPC header's, shared by a message's rows
assert N_INT == 40 and FIELDS[F_DECODE_ERROR] == "decode_error"
U64_FIELDS = ("offset", "length", "denied_offset", "denied_length", "clientid")

MAX_NAME_BYTES = 1024  # a component or path longer than this is damage (Linux NAME_MAX 255, PATH_MAX 4096)
MAX_OPAQUE_BYTES = 1 << 20  # largest opaque skipped whole (READ/WRITE data are up to 1 MiB)


def _crc_table() -> np.ndarray:
    table = np.zeros(256, np.int64)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (0xEDB88320 ^ (c >> 1)) if c & 1 else (c >> 1)
        table[n] = c
    return table


CRC_TABLE = _crc_table()  # CRC-32 (IEEE 802.3), as Wireshark's crc32_ccitt for nfs.fh.hash


@njit(cache=True, _nrt=False)
def crc32(buf, start, n):
    c = np.int64(0xFFFFFFFF)
    for k in range(n):
        c = CRC_TABLE[(c ^ buf[start + k]) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


@njit(cache=True, _nrt=False)
def name_id(dir_id, buf, start, n):
    """A stable id for the object ``name`` reaches in directory ``dir_id`` (FNV-1a, bit 62 set)."""
    if dir_id == NULL:
        return NULL
    h = np.int64(-3750763034362895579) ^ dir_id
    h = h * np.int64(1099511628211)
    for k in range(n):
        h = (h ^ buf[start + k]) * np.int64(1099511628211)
    return (h & np.int64(0x3FFFFFFFFFFFFFFF)) | np.int64(0x4000000000000000)


@njit(cache=True, _nrt=False)
def u32(buf, p):
    return (np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16) | (np.int64(buf[p + 2]) << 8) | np.int64(buf[p + 3])


@njit(cache=True, _nrt=False)
def u64(buf, p):
    return (u32(buf, p) << 32) | u32(buf, p + 4)


@njit(cache=True, _nrt=False)
def pad4(n):
    return (n + 3) & ~np.int64(3)


@njit(cache=True, _nrt=False)
def opaque_end(buf, p, end, max_len):
    """End of the XDR opaque<> / string<> at p (RFC 4506 §4.10), or -1 when it does not fit."""
    if p < 0 or p + 4 > end:
        return -1
    n = u32(buf, p)
    if n > max_len or p + 4 + pad4(n) > end:
        return -1
    return p + 4 + pad4(n)


@njit(cache=True, _nrt=False)
def fixed_end(p, n, end):
    return -1 if p < 0 or p + n > end else p + n


@njit(cache=True, _nrt=False)
def array_count(buf, p, end):
    """The element count of the XDR array at ``p`` (RFC 4506 §4.13: a uint32 before the elements), or -1
    when ``p`` is already -1, the count is cut off, or it exceeds MAX_XDR_ARRAY (hostile input)."""
    if p < 0 or p + 4 > end:
        return -1
    n = np.int64(u32(buf, p))
    return -1 if n > L.MAX_XDR_ARRAY else n


@njit(cache=True, _nrt=False)
def bitmap_end(buf, p, end):
    """End of a bitmap4 (RFC 7530 §3.3.7: uint32 array)."""
    n = array_count(buf, p, end)
    return -1 if n < 0 else fixed_end(p + 4, 4 * n, end)


@njit(cache=True, _nrt=False)
def fattr_end(buf, p, end):
    """End of a fattr4 (bitmap4 + opaque attr_vals, RFC 7530 §3.3.9)."""
    return opaque_end(buf, bitmap_end(buf, p, end), end, MAX_OPAQUE_BYTES)


@njit(cache=True, _nrt=False)
def put_hex(arena, pos, src, start, n):
    if pos < 0 or pos + 2 * n > arena.shape[0]:
        return -1
    for k in range(n):
        b = src[start + k]
        arena[pos] = HEX_DIGITS[b >> 4]
        arena[pos + 1] = HEX_DIGITS[b & 15]
        pos += 2
    return pos


@njit(cache=True, _nrt=False)
def put_string(row, slot, arena, apos, buf, start, n, as_hex):
    """Write bytes into the arena as text (escaped or hex) and record (start, length) in ``row``."""
    if apos < 0:
        return -1
    new = put_hex(arena, apos, buf, start, n) if as_hex else put_escaped(arena, apos, buf, start, n)
    if new < 0:
        return -1
    row[slot] = apos
    row[slot + 1] = new - apos
    return new


@njit(cache=True, _nrt=False)
def put_opaque(row, slot, arena, apos, buf, p, end, max_len, as_hex):
    """Decode the opaque at p into string slot ``slot``; returns (end of it or -1, arena position)."""
    e = opaque_end(buf, p, end, max_len)
    if e < 0:
        return -1, apos
    return e, put_string(row, slot, arena, apos, buf, p + 4, u32(buf, p), as_hex)


@njit(cache=True, _nrt=False)
def put_fh(row, arena, apos, buf, p, end, max_len):
    """A file handle (opaque<NFS3_FHSIZE> / nfs_fh4): its hex and CRC-32 into ``row``."""
    e = opaque_end(buf, p, end, max_len)
    if e < 0:
        return -1, apos
    n = u32(buf, p)
    row[F_FH_HASH] = crc32(buf, p + 4, n)
    return e, put_string(row, S_FH, arena, apos, buf, p + 4, n, True)


@njit(cache=True, _nrt=False)
def put_stateid(row, arena, apos, buf, p, end):
    """stateid4 (RFC 7530 §9.1.4): seqid + other[12]; ``other`` in hex (it names the state across seqids)."""
    if fixed_end(p, L.STATEID_BYTES, end) < 0:
        return -1, apos
    return p + L.STATEID_BYTES, put_string(row, S_STATEID, arena, apos, buf, p + 4, 12, True)


@njit(cache=True, _nrt=False)
def put_lock_owner(row, arena, apos, buf, p, end):
    """lock_owner4 / open_owner4 (RFC 7530 §2.2.13): clientid + owner opaque (hex)."""
    if fixed_end(p, 8, end) < 0:
        return -1, apos
    row[F_CLIENTID] = u64(buf, p)
    return put_opaque(row, S_OWNER, arena, apos, buf, p + 8, end, MAX_NAME_BYTES, True)


@njit(cache=True, _nrt=False)
def put_name(row, arena, apos, buf, p, end, dir_id):
    """A component4 / filename3 (RFC 7530 §2.2.1): the name, the directory it is in, the object it names."""
    e = opaque_end(buf, p, end, MAX_NAME_BYTES)
    if e < 0:
        return -1, apos
    n = u32(buf, p)
    row[F_DIR_ID] = dir_id
    row[F_CUR_ID] = name_id(dir_id, buf, p + 4, n)
    return e, put_string(row, S_NAME, arena, apos, buf, p + 4, n, False)


