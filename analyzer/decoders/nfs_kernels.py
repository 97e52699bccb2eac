"""Numba kernels that decode ONC-RPC messages (RFC 5531 §9) and the NFS bodies they carry into rows:
one row per RPC message, or per operation of an NFSv4 COMPOUND / CB_COMPOUND (RFC 7530 §16.2,
RFC 8881 §18-20). Captures are hostile: every XDR length and count is checked against the message's
end before use, arrays are bounded (:data:`nfs_layout.MAX_COMPOUND_OPS`, ``MAX_XDR_ARRAY``); damage
sets ``decode_error`` on the row and decoding of that message stops.

A reply carries no program or procedure (RFC 5531 §9): the caller passes, per message, the program,
version and procedure of the call it answers (``prog_hint`` ...; -1 when unknown: the RPC header
alone is decoded), which :mod:`analyzer.decoders.nfs` finds by pairing xids first (:func:`headers`).

Output: an int64 matrix ``out[row, F_*]`` (``NULL`` = absent; 64-bit unsigned fields as bit patterns)
and a byte arena for the string fields (``*_S`` start, ``*_L`` length). File handles are hashed with
CRC-32 as Wireshark's ``nfs.fh.hash``; the *current filehandle* ids (``CUR_ID``/``DIR_ID``) let the
frame builder resolve paths: a known handle's id is its hash, the object a LOOKUP/OPEN/CREATE by
name reaches is ``name_id(dir, name)`` (bit 62 set) until a GETFH/LOOKUP result names its handle.
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import nfs_layout as L
from .nfs4_ops import cb_op_args, cb_op_result, nfs4_op_args, nfs4_op_result
from .nfs_xdr import (F_ACCEPT_STAT, F_AUTH_FLAVOR, F_AUTH_GID, F_AUTH_UID, F_CUR_ID, F_DECODE_ERROR, F_FH_HASH,
                      F_LENGTH, F_MINORVERSION, F_MSG, F_MSG_TYPE, F_NFS_STATUS, F_OFFSET, F_OPCODE, F_OP_COUNT,
                      F_OP_INDEX, F_OP_STATUS, F_PROC, F_PROG, F_REJECT_STAT, F_REPLY_STAT, F_RPCVERS, F_VERS,
                      F_XID, F_LOCK_TYPE, F_DENIED_TYPE, F_DENIED_OFFSET, F_DENIED_LENGTH, MAX_NAME_BYTES,
                      N_FIELDS, NOT_WALKED, NULL, ROOT_ID, S_MACHINE, S_OWNER, S_TAG, crc32, fixed_end, opaque_end,
                      put_fh, put_name, put_opaque, put_string, u32, u64)


@njit(cache=True, _nrt=False)
def rpc_header(buf, p, end, row, arena, apos):
    """RFC 5531 §9 call/reply header into ``row``; returns (body position or -1, arena position, error)."""
    if p + 8 > end:
        return -1, apos, L.E_TRUNCATED
    row[F_XID] = u32(buf, p)
    mtype = u32(buf, p + 4)
    if mtype != L.CALL and mtype != L.REPLY:
        return -1, apos, L.E_NOT_RPC
    row[F_MSG_TYPE] = mtype
    p += 8
    if mtype == L.CALL:
        if p + 24 > end:
            return -1, apos, L.E_TRUNCATED
        row[F_RPCVERS] = u32(buf, p)
        if row[F_RPCVERS] != L.RPC_VERSION:
            return -1, apos, L.E_RPC_VERSION
        row[F_PROG] = u32(buf, p + 4)
        row[F_VERS] = u32(buf, p + 8)
        row[F_PROC] = u32(buf, p + 12)
        flavor = u32(buf, p + 16)
        row[F_AUTH_FLAVOR] = flavor
        cred = p + 20
        cred_end = opaque_end(buf, cred, end, L.MAX_AUTH_BYTES)
        if cred_end < 0:
            return -1, apos, L.E_AUTH
        if flavor == L.AUTH_SYS:  # RFC 5531 App. A authsys_parms
            q = cred + 8  # length, stamp
            m_end = opaque_end(buf, q, cred_end, L.MAX_MACHINE_NAME)
            if m_end < 0 or m_end + 12 > cred_end:
                return -1, apos, L.E_AUTH
            apos = put_string(row, S_MACHINE, arena, apos, buf, q + 4, u32(buf, q), False)
            row[F_AUTH_UID] = u32(buf, m_end)
            row[F_AUTH_GID] = u32(buf, m_end + 4)
        if cred_end + 4 > end:
            return -1, apos, L.E_TRUNCATED
        verf_end = opaque_end(buf, cred_end + 4, end, L.MAX_AUTH_BYTES)
        if verf_end < 0:
            return -1, apos, L.E_AUTH
        return verf_end, apos, 0
    if p + 4 > end:
        return -1, apos, L.E_TRUNCATED
    stat = u32(buf, p)
    row[F_REPLY_STAT] = stat
    p += 4
    if stat == 0:  # MSG_ACCEPTED: verifier, accept_stat
        if p + 4 > end:
            return -1, apos, L.E_TRUNCATED
        q = opaque_end(buf, p + 4, end, L.MAX_AUTH_BYTES)
        if q < 0:
            return -1, apos, L.E_AUTH
        if q + 4 > end:
            return -1, apos, L.E_TRUNCATED
        row[F_ACCEPT_STAT] = u32(buf, q)
        return q + 4, apos, 0
    if stat == 1:  # MSG_DENIED: reject_stat
        if p + 4 > end:
            return -1, apos, L.E_TRUNCATED
        row[F_REJECT_STAT] = u32(buf, p)
        return -1, apos, 0
    return -1, apos, L.E_NOT_RPC


@njit(cache=True, _nrt=False)
def nfs3_call(buf, p, end, proc, row, arena, apos):
    """NFSv3 arguments (RFC 1813 §3.3): the file handle, the name of directory operations, READ/WRITE
    offset and count. Returns (position or -1, arena position)."""
    if proc == 0:
        return p, apos
    p, apos = put_fh(row, arena, apos, buf, p, end, L.NFS3_FHSIZE)
    if p < 0:
        return -1, apos
    fh_id = row[F_FH_HASH]
    row[F_CUR_ID] = fh_id
    if proc == L.NFS3_LOOKUP or proc == L.NFS3_CREATE or proc == L.NFS3_MKDIR or proc == L.NFS3_SYMLINK \
            or proc == L.NFS3_MKNOD or proc == L.NFS3_REMOVE or proc == L.NFS3_RMDIR or proc == L.NFS3_RENAME:
        p, apos = put_name(row, arena, apos, buf, p, end, fh_id)
    elif proc == L.NFS3_LINK:  # file, then the link's directory and name
        e = opaque_end(buf, p, end, L.NFS3_FHSIZE)
        if e < 0:
            return -1, apos
        p, apos = put_name(row, arena, apos, buf, e, end, crc32(buf, p + 4, u32(buf, p)))
    elif proc == L.NFS3_READ or proc == L.NFS3_WRITE or proc == L.NFS3_COMMIT:
        if p + 12 > end:
            return -1, apos
        row[F_OFFSET] = u64(buf, p)
        row[F_LENGTH] = u32(buf, p + 8)
        p += 12
    return p, apos


@njit(cache=True, _nrt=False)
def nfs3_reply(buf, p, end, proc, row, arena, apos):
    """NFSv3 results: status, and the object handle of LOOKUP (RFC 1813 §3.3.3) and of CREATE, MKDIR,
    SYMLINK, MKNOD (post_op_fh3, §3.3.8)."""
    if proc == 0:
        return p, apos
    if p + 4 > end:
        return -1, apos
    status = u32(buf, p)
    row[F_NFS_STATUS] = status
    p += 4
    if status != 0:
        return p, apos
    if proc == L.NFS3_LOOKUP:
        return put_fh(row, arena, apos, buf, p, end, L.NFS3_FHSIZE)
    if proc == L.NFS3_CREATE or proc == L.NFS3_MKDIR or proc == L.NFS3_SYMLINK or proc == L.NFS3_MKNOD:
        if p + 4 > end:
            return -1, apos
        if u32(buf, p) == 1:
            return put_fh(row, arena, apos, buf, p + 4, end, L.NFS3_FHSIZE)
        return p + 4, apos
    return p, apos


@njit(cache=True, _nrt=False)
def nlm_lock(buf, p, end, vers, exclusive, row, arena, apos):
    """nlm4_lock / nlm_lock (XNFS ch. 10): caller_name, fh, oh, svid, l_offset, l_len (64-bit in v4,
    32-bit before). The lock type is written as NFSv4's (exclusive: WRITE_LT, else READ_LT)."""
    p = opaque_end(buf, p, end, MAX_NAME_BYTES)  # caller_name
    p, apos = put_fh(row, arena, apos, buf, p, end, L.NLM_NETOBJ_MAX)
    if p < 0:
        return -1, apos
    row[F_CUR_ID] = row[F_FH_HASH]
    p, apos = put_string_opaque_owner(row, arena, apos, buf, p, end)
    width = 8 if vers == 4 else 4
    if p < 0 or p + 4 + 2 * width > end:
        return -1, apos
    p += 4  # svid
    row[F_OFFSET] = u64(buf, p) if width == 8 else u32(buf, p)
    row[F_LENGTH] = u64(buf, p + width) if width == 8 else u32(buf, p + width)
    if exclusive >= 0:
        row[F_LOCK_TYPE] = 2 if exclusive else 1
    return p + 2 * width, apos


@njit(cache=True, _nrt=False)
def put_string_opaque_owner(row, arena, apos, buf, p, end):
    return put_opaque(row, S_OWNER, arena, apos, buf, p, end, L.NLM_NETOBJ_MAX, True)


@njit(cache=True, _nrt=False)
def nlm_call(buf, p, end, vers, proc, row, arena, apos):
    """NLM TEST / LOCK / CANCEL / UNLOCK / GRANTED arguments and their _MSG forms (XNFS ch. 10)."""
    base = proc - L.NLM_MSG_OFFSET if proc > L.NLM_GRANTED else proc
    if proc > L.NLM_GRANTED + L.NLM_MSG_OFFSET or base < L.NLM_TEST:
        return p, apos
    p = opaque_end(buf, p, end, L.NLM_NETOBJ_MAX)  # cookie
    if base == L.NLM_LOCK or base == L.NLM_CANCEL:
        p = fixed_end(p, 4, end)  # block
    exclusive = -1
    if base != L.NLM_UNLOCK:
        if p < 0 or p + 4 > end:
            return -1, apos
        exclusive = u32(buf, p)
        p += 4
    return nlm_lock(buf, p, end, vers, exclusive, row, arena, apos)


@njit(cache=True, _nrt=False)
def nlm_reply(buf, p, end, vers, proc, row, arena, apos):
    """nlm4_res (cookie, stat) and nlm4_testres (a denied TEST names the holder: exclusive, svid, oh,
    l_offset, l_len)."""
    if proc == 0 or proc > L.NLM_GRANTED:
        return p, apos
    p = opaque_end(buf, p, end, L.NLM_NETOBJ_MAX)
    if p < 0 or p + 4 > end:
        return -1, apos
    stat = u32(buf, p)
    row[F_NFS_STATUS] = stat
    p += 4
    if proc == L.NLM_TEST and stat == 1:
        if p + 8 > end:
            return -1, apos
        row[F_DENIED_TYPE] = 2 if u32(buf, p) else 1
        p, apos = put_string_opaque_owner(row, arena, apos, buf, p + 8, end)
        width = 8 if vers == 4 else 4
        if p < 0 or p + 2 * width > end:
            return -1, apos
        row[F_DENIED_OFFSET] = u64(buf, p) if width == 8 else u32(buf, p)
        row[F_DENIED_LENGTH] = u64(buf, p + width) if width == 8 else u32(buf, p + width)
        p += 2 * width
    return p, apos


@njit(cache=True)
def headers(buf, offset, length):
    """xid, msg_type, prog, vers, proc and auth flavour per message (-1 where absent): what pairing
    replies with calls needs before the bodies can be decoded."""
    n = offset.shape[0]
    out = np.full((n, 6), -1, np.int64)
    for i in range(n):
        p, end = offset[i], offset[i] + length[i]
        if p + 8 > end:
            continue
        out[i, 0] = u32(buf, p)
        mtype = u32(buf, p + 4)
        out[i, 1] = mtype
        if mtype == L.CALL and p + 28 <= end:
            out[i, 2] = u32(buf, p + 12)
            out[i, 3] = u32(buf, p + 16)
            out[i, 4] = u32(buf, p + 20)
            out[i, 5] = u32(buf, p + 24)
    return out


@njit(cache=True)
def decode(buf, offset, length, hint, out, arena):
    """Decode every message into rows of ``out`` (see the module doc); ``hint[i]`` = (prog, vers, proc,
    auth flavour) of message i's call (its own for a call). Returns (rows, arena bytes, 0), or
    (-1, -1, 1) when ``out`` or the arena is too small (the caller grows them and calls again)."""
    n = offset.shape[0]
    cap = out.shape[0]
    row = 0
    apos = np.int64(0)
    hdr = np.empty(N_FIELDS, np.int64)
    for i in range(n):
        if row >= cap:
            return -1, -1, 1
        hdr[:] = NULL
        hdr[S_MACHINE + 1] = -1
        for s in range(S_TAG, N_FIELDS, 2):
            hdr[s + 1] = -1
        hdr[F_MSG] = i
        p, end = offset[i], offset[i] + length[i]
        body, apos, err = rpc_header(buf, p, end, hdr, arena, apos)
        if apos < 0:
            return -1, -1, 1
        first = row
        out[row, :] = hdr
        out[row, F_OP_INDEX] = 0
        row += 1
        if err:
            out[first, F_DECODE_ERROR] = err
            continue
        if body < 0:
            continue
        prog, vers, proc, flavor = hint[i, 0], hint[i, 1], hint[i, 2], hint[i, 3]
        if flavor == L.RPCSEC_GSS:
            continue  # the body may be wrapped (RFC 2203 §5.3.2): not decoded
        is_call = hdr[F_MSG_TYPE] == L.CALL
        r = out[first]
        if prog == L.PROG_NFS and vers == 3:
            if is_call:
                q, apos = nfs3_call(buf, body, end, proc, r, arena, apos)
            else:
                q, apos = nfs3_reply(buf, body, end, proc, r, arena, apos)
            if apos < 0:
                return -1, -1, 1
            if q < 0:
                r[F_DECODE_ERROR] = L.E_TRUNCATED
            continue
        if prog == L.PROG_NLM and 1 <= vers <= 4:
            if is_call:
                q, apos = nlm_call(buf, body, end, vers, proc, r, arena, apos)
            else:
                q, apos = nlm_reply(buf, body, end, vers, proc, r, arena, apos)
            if apos < 0:
                return -1, -1, 1
            if q < 0:
                r[F_DECODE_ERROR] = L.E_TRUNCATED
            continue
        if prog == L.PROG_MOUNT and vers == 3 and proc == L.MOUNT_MNT:  # RFC 1813 App. I §5.2.1
            if is_call:
                q, apos = put_name(r, arena, apos, buf, body, end, ROOT_ID)
            elif body + 4 <= end:
                r[F_NFS_STATUS] = u32(buf, body)
                q = body + 4
                if r[F_NFS_STATUS] == 0:
                    q, apos = put_fh(r, arena, apos, buf, body + 4, end, L.NFS3_FHSIZE)
            else:
                q = -1
            if apos < 0:
                return -1, -1, 1
            if q < 0:
                r[F_DECODE_ERROR] = L.E_TRUNCATED
            continue
        nfs4 = prog == L.PROG_NFS and vers == 4 and proc == L.NFS4_COMPOUND_PROC
        cb = L.CB_PROG_FIRST <= prog < L.CB_PROG_END and vers == 1 and proc == L.CB_COMPOUND_PROC
        if not (nfs4 or cb):
            continue
        # COMPOUND4args / CB_COMPOUND4args: tag, minorversion, [callback_ident], argarray
        # COMPOUND4res / CB_COMPOUND4res: status, tag, resarray
        q = body
        if not is_call:
            if q + 4 > end:
                r[F_DECODE_ERROR] = L.E_TRUNCATED
                continue
            hdr[F_NFS_STATUS] = u32(buf, q)
            q += 4
        e = opaque_end(buf, q, end, MAX_NAME_BYTES)
        if e < 0:
            r[F_DECODE_ERROR] = L.E_TRUNCATED
            continue
        apos = put_string(hdr, S_TAG, arena, apos, buf, q + 4, u32(buf, q), False)
        if apos < 0:
            return -1, -1, 1
        q = e
        if is_call:
            extra = 8 if cb else 4
            if q + extra > end:
                r[F_DECODE_ERROR] = L.E_TRUNCATED
                continue
            hdr[F_MINORVERSION] = u32(buf, q)
            q += extra
        if q + 4 > end:
            out[first, :] = hdr
            out[first, F_DECODE_ERROR] = L.E_TRUNCATED
            continue
        nops = u32(buf, q)
        q += 4
        hdr[F_OP_COUNT] = nops
        out[first, :] = hdr
        out[first, F_OP_INDEX] = 0
        if nops > L.MAX_COMPOUND_OPS:
            out[first, F_DECODE_ERROR] = L.E_TOO_MANY_OPS
            continue
        cur = NULL
        saved = NULL
        for k in range(nops):
            if k > 0:
                if row >= cap:
                    return -1, -1, 1
                out[row, :] = hdr
                out[row, F_OP_INDEX] = k
                row += 1
            r = out[row - 1]
            if q + (4 if is_call else 8) > end:
                r[F_DECODE_ERROR] = L.E_TRUNCATED
                break
            op = u32(buf, q)
            r[F_OPCODE] = op
            q += 4
            if is_call:
                if cb:
                    q, apos = cb_op_args(buf, q, end, op, r, arena, apos)
                else:
                    q, apos, cur, saved = nfs4_op_args(buf, q, end, op, r, arena, apos, cur, saved)
            else:
                status = u32(buf, q)
                r[F_OP_STATUS] = status
                q += 4
                if cb:
                    q, apos = cb_op_result(buf, q, end, op, status, r, arena, apos)
                else:
                    q, apos = nfs4_op_result(buf, q, end, op, status, r, arena, apos)
            if apos < 0:
                return -1, -1, 1
            if q < 0:
                # a body the kernel cannot walk: the rest of the compound is not decoded
                r[F_DECODE_ERROR] = L.E_UNPARSED if q == NOT_WALKED else L.E_TRUNCATED
                break
    return row, apos, 0
