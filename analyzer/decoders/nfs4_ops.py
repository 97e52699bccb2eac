"""NFSv4 COMPOUND and CB_COMPOUND operation walkers (RFC 7530 §16, RFC 8881 §18 and §20, RFC 7862):
one operation's arguments or result into a row, returning where the next operation starts (-1 when
the message ends first, :data:`nfs_xdr.NOT_WALKED` for an operation not walked here: the rest of its
compound is then not decoded). Called by :func:`analyzer.decoders.nfs_kernels.decode`.
"""
from __future__ import annotations

from ..jit import njit

from . import nfs_layout as L
from .nfs_xdr import (F_CLAIM_TYPE, F_CLIENTID, F_CUR_ID, F_DELEGATION_TYPE, F_DENIED_LENGTH, F_DENIED_OFFSET,
                      F_DENIED_TYPE, F_FH_HASH, F_HIGHEST_SLOTID, F_LENGTH, F_LOCK_TYPE, F_OFFSET, F_OPEN_TYPE,
                      F_SEQID, F_SEQUENCEID, F_SHARE_ACCESS, F_SHARE_DENY, F_SLOTID, F_TARGET_HIGHEST_SLOTID, MAX_NAME_BYTES,
                      MAX_OPAQUE_BYTES, NOT_WALKED, NULL, ROOT_ID, S_SESSIONID, array_count, bitmap_end, fattr_end,
                      fixed_end, opaque_end, put_fh, put_lock_owner, put_name, put_stateid, put_string, u32, u64)


@njit(cache=True, _nrt=False)
def cb_sec_parms_end(buf, p, end):
    """callback_sec_parms4<> (RFC 8881 §18.33.1): AUTH_NONE, AUTH_SYS or RPCSEC_GSS entries."""
    n = array_count(buf, p, end)
    if n < 0:
        return -1
    p += 4
    for _ in range(n):
        if p + 4 > end:
            return -1
        flavor = u32(buf, p)
        p += 4
        if flavor == L.AUTH_SYS:
            p = fixed_end(p, 4, end)  # stamp
            p = opaque_end(buf, p, end, L.MAX_MACHINE_NAME)
            p = fixed_end(p, 8, end)
            if p < 0:
                return -1
            gids = u32(buf, p)
            if gids > L.MAX_AUTH_GIDS:
                return -1
            p = fixed_end(p + 4, 4 * gids, end)
        elif flavor == L.RPCSEC_GSS:
            p = fixed_end(p, 4, end)
            p = opaque_end(buf, p, end, L.MAX_AUTH_BYTES)
            p = opaque_end(buf, p, end, L.MAX_AUTH_BYTES)
        elif flavor != L.AUTH_NONE:
            return -1
        if p < 0:
            return -1
    return p


@njit(cache=True, _nrt=False)
def channel_attrs_end(buf, p, end):
    """channel_attrs4 (RFC 8881 §18.36): six uint32 and ca_rdma_ird<1>."""
    p = fixed_end(p, 24, end)
    if p < 0 or p + 4 > end or u32(buf, p) > 1:
        return -1
    return fixed_end(p + 4, 4 * u32(buf, p), end)


@njit(cache=True, _nrt=False)
def sequence_args(buf, p, end, row, arena, apos):
    """SEQUENCE4args / CB_SEQUENCE4args head (RFC 8881 §18.46, §20.9): sessionid, sequenceid, slotid,
    highest_slotid."""
    if fixed_end(p, 28, end) < 0:
        return -1, apos
    apos = put_string(row, S_SESSIONID, arena, apos, buf, p, 16, True)
    row[F_SEQUENCEID] = u32(buf, p + 16)
    row[F_SLOTID] = u32(buf, p + 20)
    row[F_HIGHEST_SLOTID] = u32(buf, p + 24)
    return p + 28, apos


@njit(cache=True, _nrt=False)
def nfs4_op_args(buf, p, end, op, row, arena, apos, cur, saved):
    """One COMPOUND operation's arguments (RFC 7530 §16, RFC 8881 §18). Returns (position or -1, arena
    position, current filehandle id, saved filehandle id)."""
    if op == L.OP_ACCESS or op == L.OP_SECINFO_NO_NAME or op == L.OP_RECLAIM_COMPLETE or op == L.OP_OPENATTR:
        p = fixed_end(p, 4, end)
    elif op == L.OP_CLOSE:
        if fixed_end(p, 4, end) < 0:
            return -1, apos, cur, saved
        row[F_SEQID] = u32(buf, p)
        p, apos = put_stateid(row, arena, apos, buf, p + 4, end)
    elif op == L.OP_COMMIT:
        if fixed_end(p, 12, end) >= 0:
            row[F_OFFSET] = u64(buf, p)
            row[F_LENGTH] = u32(buf, p + 8)
        p = fixed_end(p, 12, end)
    elif op == L.OP_CREATE:
        if p + 4 > end:
            return -1, apos, cur, saved
        ftype = u32(buf, p)
        p += 4
        if ftype == 5:  # NF4LNK: linkdata
            p = opaque_end(buf, p, end, MAX_OPAQUE_BYTES)
        elif ftype == 3 or ftype == 4:  # NF4BLK, NF4CHR: specdata4
            p = fixed_end(p, 8, end)
        p, apos = put_name(row, arena, apos, buf, p, end, cur)
        cur = row[F_CUR_ID] if p >= 0 else cur
        p = fattr_end(buf, p, end)
    elif op == L.OP_DELEGPURGE or op == L.OP_RENEW or op == L.OP_DESTROY_CLIENTID:
        if fixed_end(p, 8, end) >= 0:
            row[F_CLIENTID] = u64(buf, p)
        p = fixed_end(p, 8, end)
    elif op == L.OP_DELEGRETURN or op == L.OP_FREE_STATEID:
        p, apos = put_stateid(row, arena, apos, buf, p, end)
    elif op == L.OP_GETATTR:
        p = bitmap_end(buf, p, end)
    elif op == L.OP_GETFH or op == L.OP_LOOKUPP or op == L.OP_READLINK:
        if op == L.OP_LOOKUPP:
            cur = NULL
    elif op == L.OP_LINK or op == L.OP_REMOVE or op == L.OP_SECINFO:
        p, apos = put_name(row, arena, apos, buf, p, end, cur)
    elif op == L.OP_RENAME:
        p, apos = put_name(row, arena, apos, buf, p, end, saved)  # RFC 7530 §16.26: from the saved filehandle
        p = opaque_end(buf, p, end, MAX_NAME_BYTES)
    elif op == L.OP_LOCK:
        if fixed_end(p, 28, end) < 0:
            return -1, apos, cur, saved
        row[F_LOCK_TYPE] = u32(buf, p)
        row[F_OFFSET] = u64(buf, p + 8)
        row[F_LENGTH] = u64(buf, p + 16)
        new_owner = u32(buf, p + 24)
        p += 28
        if new_owner:  # open_to_lock_owner4: open_seqid, open_stateid, lock_seqid, lock_owner
            p = fixed_end(p, 4, end)
            p, apos = put_stateid(row, arena, apos, buf, p, end)
            if fixed_end(p, 4, end) < 0:
                return -1, apos, cur, saved
            row[F_SEQID] = u32(buf, p)
            p, apos = put_lock_owner(row, arena, apos, buf, p + 4, end)
        else:  # exist_lock_owner4: lock_stateid, lock_seqid
            p, apos = put_stateid(row, arena, apos, buf, p, end)
            if fixed_end(p, 4, end) < 0:
                return -1, apos, cur, saved
            row[F_SEQID] = u32(buf, p)
            p += 4
    elif op == L.OP_LOCKT:
        if fixed_end(p, 20, end) < 0:
            return -1, apos, cur, saved
        row[F_LOCK_TYPE] = u32(buf, p)
        row[F_OFFSET] = u64(buf, p + 4)
        row[F_LENGTH] = u64(buf, p + 12)
        p, apos = put_lock_owner(row, arena, apos, buf, p + 20, end)
    elif op == L.OP_LOCKU:
        if fixed_end(p, 8, end) < 0:
            return -1, apos, cur, saved
        row[F_LOCK_TYPE] = u32(buf, p)
        row[F_SEQID] = u32(buf, p + 4)
        p, apos = put_stateid(row, arena, apos, buf, p + 8, end)
        if fixed_end(p, 16, end) < 0:
            return -1, apos, cur, saved
        row[F_OFFSET] = u64(buf, p)
        row[F_LENGTH] = u64(buf, p + 8)
        p += 16
    elif op == L.OP_LOOKUP:
        p, apos = put_name(row, arena, apos, buf, p, end, cur)
        cur = row[F_CUR_ID] if p >= 0 else cur
    elif op == L.OP_NVERIFY or op == L.OP_VERIFY:
        p = fattr_end(buf, p, end)
    elif op == L.OP_OPEN:  # RFC 7530 §16.16.1 OPEN4args
        if fixed_end(p, 12, end) < 0:
            return -1, apos, cur, saved
        row[F_SEQID] = u32(buf, p)
        row[F_SHARE_ACCESS] = u32(buf, p + 4)
        row[F_SHARE_DENY] = u32(buf, p + 8)
        p, apos = put_lock_owner(row, arena, apos, buf, p + 12, end)
        if fixed_end(p, 4, end) < 0:
            return -1, apos, cur, saved
        opentype = u32(buf, p)
        row[F_OPEN_TYPE] = opentype
        p += 4
        if opentype == 1:  # createhow4
            if p + 4 > end:
                return -1, apos, cur, saved
            mode = u32(buf, p)
            p += 4
            if mode == 0 or mode == 1:  # UNCHECKED4, GUARDED4: createattrs
                p = fattr_end(buf, p, end)
            elif mode == 2:  # EXCLUSIVE4: verifier
                p = fixed_end(p, 8, end)
            elif mode == 3:  # EXCLUSIVE4_1 (RFC 8881 §18.16.1): verifier + attrs
                p = fattr_end(buf, fixed_end(p, 8, end), end)
            else:
                return -1, apos, cur, saved
        if fixed_end(p, 4, end) < 0:
            return -1, apos, cur, saved
        claim = u32(buf, p)
        row[F_CLAIM_TYPE] = claim
        p += 4
        if claim == 0 or claim == 3:  # CLAIM_NULL, CLAIM_DELEGATE_PREV: file
            p, apos = put_name(row, arena, apos, buf, p, end, cur)
            cur = row[F_CUR_ID] if p >= 0 else cur
        elif claim == 1:  # CLAIM_PREVIOUS: delegate_type
            p = fixed_end(p, 4, end)
        elif claim == 2:  # CLAIM_DELEGATE_CUR: delegate_stateid, file
            p, apos = put_stateid(row, arena, apos, buf, p, end)
            p, apos = put_name(row, arena, apos, buf, p, end, cur)
            cur = row[F_CUR_ID] if p >= 0 else cur
        elif claim == 5:  # CLAIM_DELEG_CUR_FH: stateid
            p, apos = put_stateid(row, arena, apos, buf, p, end)
        elif claim != 4 and claim != 6:
            return -1, apos, cur, saved
    elif op == L.OP_OPEN_CONFIRM:
        p, apos = put_stateid(row, arena, apos, buf, p, end)
        if fixed_end(p, 4, end) >= 0:
            row[F_SEQID] = u32(buf, p)
        p = fixed_end(p, 4, end)
    elif op == L.OP_OPEN_DOWNGRADE:
        p, apos = put_stateid(row, arena, apos, buf, p, end)
        if fixed_end(p, 12, end) < 0:
            return -1, apos, cur, saved
        row[F_SEQID] = u32(buf, p)
        row[F_SHARE_ACCESS] = u32(buf, p + 4)
        row[F_SHARE_DENY] = u32(buf, p + 8)
        p += 12
    elif op == L.OP_PUTFH:
        p, apos = put_fh(row, arena, apos, buf, p, end, L.NFS4_FHSIZE)
        cur = row[F_FH_HASH] if p >= 0 else cur
    elif op == L.OP_PUTPUBFH or op == L.OP_PUTROOTFH:
        cur = ROOT_ID
    elif op == L.OP_READ:
        p, apos = put_stateid(row, arena, apos, buf, p, end)
        if fixed_end(p, 12, end) >= 0:
            row[F_OFFSET] = u64(buf, p)
            row[F_LENGTH] = u32(buf, p + 8)
        p = fixed_end(p, 12, end)
    elif op == L.OP_READDIR:
        p = bitmap_end(buf, fixed_end(p, 24, end), end)
    elif op == L.OP_RESTOREFH:
        cur = saved
    elif op == L.OP_SAVEFH:
        saved = cur
    elif op == L.OP_SETATTR:
        p, apos = put_stateid(row, arena, apos, buf, p, end)
        p = fattr_end(buf, p, end)
    elif op == L.OP_SETCLIENTID:  # verifier, id, cb_client4 (program, netid, addr), callback_ident
        p = opaque_end(buf, fixed_end(p, 8, end), end, MAX_NAME_BYTES)
        p = fixed_end(p, 4, end)
        p = opaque_end(buf, p, end, MAX_NAME_BYTES)
        p = opaque_end(buf, p, end, MAX_NAME_BYTES)
        p = fixed_end(p, 4, end)
    elif op == L.OP_SETCLIENTID_CONFIRM:
        if fixed_end(p, 16, end) >= 0:
            row[F_CLIENTID] = u64(buf, p)
        p = fixed_end(p, 16, end)
    elif op == L.OP_WRITE:
        p, apos = put_stateid(row, arena, apos, buf, p, end)
        if fixed_end(p, 12, end) < 0:
            return -1, apos, cur, saved
        row[F_OFFSET] = u64(buf, p)
        e = opaque_end(buf, p + 12, end, MAX_OPAQUE_BYTES)
        if e >= 0:
            row[F_LENGTH] = u32(buf, p + 12)
        p = e
    elif op == L.OP_RELEASE_LOCKOWNER:
        p, apos = put_lock_owner(row, arena, apos, buf, p, end)
    elif op == L.OP_BACKCHANNEL_CTL:
        p = cb_sec_parms_end(buf, fixed_end(p, 4, end), end)
    elif op == L.OP_BIND_CONN_TO_SESSION:
        if fixed_end(p, 24, end) >= 0:
            apos = put_string(row, S_SESSIONID, arena, apos, buf, p, 16, True)
        p = fixed_end(p, 24, end)
    elif op == L.OP_EXCHANGE_ID:  # client_owner4, flags, state_protect4_a, client_impl_id<1>
        p = opaque_end(buf, fixed_end(p, 8, end), end, MAX_NAME_BYTES)
        p = fixed_end(p, 4, end)
        if p < 0 or p + 4 > end or u32(buf, p) != 0:  # only SP4_NONE is walked
            return -1, apos, cur, saved
        p += 4
        if p + 4 > end or u32(buf, p) > 1:
            return -1, apos, cur, saved
        if u32(buf, p) == 1:
            p = opaque_end(buf, p + 4, end, MAX_NAME_BYTES)
            p = opaque_end(buf, p, end, MAX_NAME_BYTES)
            p = fixed_end(p, 12, end)
        else:
            p += 4
    elif op == L.OP_CREATE_SESSION:
        if fixed_end(p, 16, end) >= 0:
            row[F_CLIENTID] = u64(buf, p)
        p = channel_attrs_end(buf, fixed_end(p, 16, end), end)
        p = channel_attrs_end(buf, p, end)
        p = cb_sec_parms_end(buf, fixed_end(p, 4, end), end)
    elif op == L.OP_DESTROY_SESSION:
        if fixed_end(p, 16, end) >= 0:
            apos = put_string(row, S_SESSIONID, arena, apos, buf, p, 16, True)
        p = fixed_end(p, 16, end)
    elif op == L.OP_SEQUENCE:
        p, apos = sequence_args(buf, p, end, row, arena, apos)
        p = fixed_end(p, 4, end)  # cachethis
    elif op == L.OP_TEST_STATEID:
        n = array_count(buf, p, end)
        if n < 0:
            return -1, apos, cur, saved
        p = fixed_end(p + 4, L.STATEID_BYTES * n, end)
    elif op == L.OP_ALLOCATE or op == L.OP_DEALLOCATE:
        p, apos = put_stateid(row, arena, apos, buf, p, end)
        if fixed_end(p, 16, end) >= 0:
            row[F_OFFSET] = u64(buf, p)
            row[F_LENGTH] = u64(buf, p + 8)
        p = fixed_end(p, 16, end)
    else:
        return NOT_WALKED, apos, cur, saved  # the rest of the compound is not decoded
    row[F_CUR_ID] = cur if row[F_CUR_ID] == NULL else row[F_CUR_ID]
    return p, apos, cur, saved


@njit(cache=True, _nrt=False)
def lock_denied(buf, p, end, row, arena, apos):
    """LOCK4denied (RFC 7530 §16.10.5): offset, length, locktype, the owner holding the lock."""
    if fixed_end(p, 20, end) < 0:
        return -1, apos
    row[F_DENIED_OFFSET] = u64(buf, p)
    row[F_DENIED_LENGTH] = u64(buf, p + 8)
    row[F_DENIED_TYPE] = u32(buf, p + 16)
    return put_lock_owner(row, arena, apos, buf, p + 20, end)


@njit(cache=True, _nrt=False)
def nfsace_end(buf, p, end):
    return opaque_end(buf, fixed_end(p, 12, end), end, MAX_NAME_BYTES)  # type, flag, access_mask, who


@njit(cache=True, _nrt=False)
def nfs4_op_result(buf, p, end, op, status, row, arena, apos):
    """One COMPOUND operation's result after its status (RFC 7530 §16, RFC 8881 §18). Returns
    (position or -1, arena position)."""
    if op == L.OP_LOCK or op == L.OP_LOCKT:
        if status == L.NFS4ERR_DENIED:
            return lock_denied(buf, p, end, row, arena, apos)
        if status == 0 and op == L.OP_LOCK:
            return put_stateid(row, arena, apos, buf, p, end)
        return p, apos
    if op == L.OP_SETATTR:  # attrsset, whatever the status (RFC 7530 §16.32.2)
        return bitmap_end(buf, p, end), apos
    if op == L.OP_SETCLIENTID and status == L.NFS4ERR_CLID_INUSE:
        return opaque_end(buf, opaque_end(buf, p, end, MAX_NAME_BYTES), end, MAX_NAME_BYTES), apos
    if status != 0:
        return p, apos
    if op == L.OP_ACCESS:
        return fixed_end(p, 8, end), apos
    if op == L.OP_CLOSE or op == L.OP_LOCKU or op == L.OP_OPEN_CONFIRM or op == L.OP_OPEN_DOWNGRADE:
        return put_stateid(row, arena, apos, buf, p, end)
    if op == L.OP_COMMIT:
        return fixed_end(p, 8, end), apos
    if op == L.OP_CREATE:
        return bitmap_end(buf, fixed_end(p, 20, end), end), apos
    if op == L.OP_GETATTR:
        return fattr_end(buf, p, end), apos
    if op == L.OP_GETFH:
        return put_fh(row, arena, apos, buf, p, end, L.NFS4_FHSIZE)
    if op == L.OP_LINK or op == L.OP_REMOVE:
        return fixed_end(p, 20, end), apos
    if op == L.OP_RENAME:
        return fixed_end(p, 40, end), apos
    if op == L.OP_OPEN:  # RFC 7530 §16.16.2 OPEN4resok
        p, apos = put_stateid(row, arena, apos, buf, p, end)
        p = bitmap_end(buf, fixed_end(p, 24, end), end)  # cinfo, rflags, attrset
        if p < 0 or p + 4 > end:
            return -1, apos
        deleg = u32(buf, p)
        row[F_DELEGATION_TYPE] = deleg
        p += 4
        if deleg == 1 or deleg == 2:  # READ / WRITE: stateid, recall, [space_limit,] permissions
            p = fixed_end(p, L.STATEID_BYTES + 4, end)
            if deleg == 2:
                if p < 0 or p + 4 > end:
                    return -1, apos
                limitby = u32(buf, p)
                p = fixed_end(p + 4, 8, end) if limitby == 1 or limitby == 2 else -1
            p = nfsace_end(buf, p, end)
        elif deleg == 3:  # OPEN_DELEGATE_NONE_EXT (RFC 8881 §18.16.2): why, and a bool for two of them
            if p + 4 > end:
                return -1, apos
            why = u32(buf, p)
            p = fixed_end(p + 4, 4 if why == 1 or why == 2 else 0, end)
        elif deleg != 0:
            return -1, apos
        return p, apos
    if op == L.OP_READ:
        if fixed_end(p, 4, end) < 0:
            return -1, apos
        e = opaque_end(buf, p + 4, end, MAX_OPAQUE_BYTES)
        if e >= 0:
            row[F_LENGTH] = u32(buf, p + 4)
        return e, apos
    if op == L.OP_READLINK:
        return opaque_end(buf, p, end, MAX_OPAQUE_BYTES), apos
    if op == L.OP_READDIR:  # cookieverf, entries (value_follows, cookie, name, attrs)..., eof
        p = fixed_end(p, 8, end)
        for _ in range(1 << 16):
            if p < 0 or p + 4 > end:
                return -1, apos
            more = u32(buf, p)
            p += 4
            if not more:
                return fixed_end(p, 4, end), apos
            p = fattr_end(buf, opaque_end(buf, fixed_end(p, 8, end), end, MAX_NAME_BYTES), end)
        return -1, apos
    if op == L.OP_SECINFO or op == L.OP_SECINFO_NO_NAME:
        n = array_count(buf, p, end)
        if n < 0:
            return -1, apos
        p += 4
        for _ in range(n):
            if p + 4 > end:
                return -1, apos
            flavor = u32(buf, p)
            p += 4
            if flavor == L.RPCSEC_GSS:
                p = fixed_end(opaque_end(buf, p, end, L.MAX_AUTH_BYTES), 8, end)
            if p < 0:
                return -1, apos
        return p, apos
    if op == L.OP_SETCLIENTID:
        if fixed_end(p, 16, end) >= 0:
            row[F_CLIENTID] = u64(buf, p)
        return fixed_end(p, 16, end), apos
    if op == L.OP_WRITE:
        if fixed_end(p, 16, end) >= 0:
            row[F_LENGTH] = u32(buf, p)
        return fixed_end(p, 16, end), apos
    if op == L.OP_BIND_CONN_TO_SESSION:
        return fixed_end(p, 24, end), apos
    if op == L.OP_EXCHANGE_ID:  # clientid, sequenceid, flags, state_protect4_r, server_owner4, scope, impl_id<1>
        if fixed_end(p, 16, end) >= 0:
            row[F_CLIENTID] = u64(buf, p)
        p = fixed_end(p, 16, end)
        if p < 0 or p + 4 > end or u32(buf, p) != 0:
            return -1, apos
        p = opaque_end(buf, fixed_end(p + 4, 8, end), end, MAX_NAME_BYTES)
        p = opaque_end(buf, p, end, MAX_NAME_BYTES)
        if p < 0 or p + 4 > end or u32(buf, p) > 1:
            return -1, apos
        if u32(buf, p) == 1:
            p = opaque_end(buf, p + 4, end, MAX_NAME_BYTES)
            p = opaque_end(buf, p, end, MAX_NAME_BYTES)
            return fixed_end(p, 12, end), apos
        return p + 4, apos
    if op == L.OP_CREATE_SESSION:
        if fixed_end(p, 24, end) < 0:
            return -1, apos
        apos = put_string(row, S_SESSIONID, arena, apos, buf, p, 16, True)
        p = channel_attrs_end(buf, p + 24, end)
        return channel_attrs_end(buf, p, end), apos
    if op == L.OP_SEQUENCE:  # SEQUENCE4resok (RFC 8881 §18.46.2): the head, target_highest_slotid, status_flags
        p, apos = sequence_args(buf, p, end, row, arena, apos)
        if p >= 0 and p + 4 <= end:
            row[F_TARGET_HIGHEST_SLOTID] = u32(buf, p)
        return fixed_end(p, 8, end), apos
    if op == L.OP_TEST_STATEID:
        n = array_count(buf, p, end)
        return (-1 if n < 0 else fixed_end(p + 4, 4 * n, end)), apos
    if op == L.OP_SEEK:
        return fixed_end(p, 12, end), apos
    if op == L.OP_DELEGPURGE or op == L.OP_DELEGRETURN or op == L.OP_LOOKUP or op == L.OP_LOOKUPP \
            or op == L.OP_NVERIFY or op == L.OP_OPENATTR or op == L.OP_PUTFH or op == L.OP_PUTPUBFH \
            or op == L.OP_PUTROOTFH or op == L.OP_RENEW or op == L.OP_RESTOREFH or op == L.OP_SAVEFH \
            or op == L.OP_SETCLIENTID_CONFIRM or op == L.OP_VERIFY or op == L.OP_RELEASE_LOCKOWNER \
            or op == L.OP_BACKCHANNEL_CTL or op == L.OP_DESTROY_SESSION or op == L.OP_FREE_STATEID \
            or op == L.OP_DESTROY_CLIENTID or op == L.OP_RECLAIM_COMPLETE or op == L.OP_ALLOCATE \
            or op == L.OP_DEALLOCATE:
        return p, apos
    return NOT_WALKED, apos


@njit(cache=True, _nrt=False)
def cb_op_args(buf, p, end, op, row, arena, apos):
    """One CB_COMPOUND operation's arguments (RFC 7530 §16.2 ff., RFC 8881 §20)."""
    if op == L.CB_RECALL:  # stateid, truncate, fh
        p, apos = put_stateid(row, arena, apos, buf, p, end)
        p = fixed_end(p, 4, end)
        p, apos = put_fh(row, arena, apos, buf, p, end, L.NFS4_FHSIZE)
        row[F_CUR_ID] = row[F_FH_HASH]
        return p, apos
    if op == L.CB_GETATTR:
        p, apos = put_fh(row, arena, apos, buf, p, end, L.NFS4_FHSIZE)
        row[F_CUR_ID] = row[F_FH_HASH]
        return bitmap_end(buf, p, end), apos
    if op == L.CB_SEQUENCE:  # ..., cachethis, referring_call_lists<>
        p, apos = sequence_args(buf, p, end, row, arena, apos)
        p = fixed_end(p, 4, end)
        n = array_count(buf, p, end)
        if n < 0:
            return -1, apos
        p += 4
        for _ in range(n):
            p = fixed_end(p, 16, end)
            m = array_count(buf, p, end)
            if m < 0:
                return -1, apos
            p = fixed_end(p + 4, 8 * m, end)
        return p, apos
    if op == L.CB_RECALL_ANY:
        return bitmap_end(buf, fixed_end(p, 4, end), end), apos
    if op == L.CB_RECALL_SLOT:
        return fixed_end(p, 4, end), apos
    if op == L.CB_WANTS_CANCELLED:
        return fixed_end(p, 8, end), apos
    if op == L.CB_NOTIFY_LOCK:
        p, apos = put_fh(row, arena, apos, buf, p, end, L.NFS4_FHSIZE)
        row[F_CUR_ID] = row[F_FH_HASH]
        return put_lock_owner(row, arena, apos, buf, p, end)
    return NOT_WALKED, apos


@njit(cache=True, _nrt=False)
def cb_op_result(buf, p, end, op, status, row, arena, apos):
    if status != 0:
        return p, apos
    if op == L.CB_GETATTR:
        return fattr_end(buf, p, end), apos
    if op == L.CB_SEQUENCE:  # CB_SEQUENCE4resok (RFC 8881 §20.9.2): the head, csr_target_highest_slotid
        p, apos = sequence_args(buf, p, end, row, arena, apos)
        if p >= 0 and p + 4 <= end:
            row[F_TARGET_HIGHEST_SLOTID] = u32(buf, p)
        return fixed_end(p, 4, end), apos
    if op == L.CB_RECALL or op == L.CB_RECALL_ANY or op == L.CB_RECALL_SLOT or op == L.CB_WANTS_CANCELLED \
            or op == L.CB_NOTIFY_LOCK:
        return p, apos
    return NOT_WALKED, apos


