"""Byte-exact ONC-RPC / NFS messages for the decoder tests: XDR (RFC 4506) by hand, each function a
transcription of its spec's structure (RFC 5531 §9 and App. A, RFC 1813 §3.3, RFC 7530 §16, RFC 8881
§18/§20), and captures that carry them over UDP or record-marked TCP (RFC 5531 §11)."""
from __future__ import annotations

import struct

from builders import ethernet, handshake, ipv4, pcap_file, stream_steps, tcp_conversation, udp

LAST = 0x80000000
CLIENT, SERVER = ("10.0.0.1", 871), ("10.0.0.2", 2049)


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def opaque(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return u32(len(b)) + b + b"\0" * (-len(b) % 4)


def auth_sys(machine="client1", uid=1000, gid=100, gids=(100, 10), stamp=7) -> bytes:
    """opaque_auth with AUTH_SYS authsys_parms (RFC 5531 App. A)."""
    body = u32(stamp) + opaque(machine) + u32(uid) + u32(gid) + u32(len(gids)) + b"".join(u32(g) for g in gids)
    return u32(1) + opaque(body)


AUTH_NONE = u32(0) + opaque(b"")


def call(xid: int, prog: int, vers: int, proc: int, args: bytes = b"", cred: bytes = AUTH_NONE) -> bytes:
    return u32(xid) + u32(0) + u32(2) + u32(prog) + u32(vers) + u32(proc) + cred + AUTH_NONE + args


def reply(xid: int, results: bytes = b"", accept_stat: int = 0) -> bytes:
    """MSG_ACCEPTED with an AUTH_NONE verifier."""
    return u32(xid) + u32(1) + u32(0) + AUTH_NONE + u32(accept_stat) + results


def denied(xid: int, reject_stat: int = 1, detail: int = 5) -> bytes:
    """MSG_DENIED: AUTH_ERROR (1) with an auth_stat, or RPC_MISMATCH (0) with low/high."""
    return u32(xid) + u32(1) + u32(1) + u32(reject_stat) + u32(detail) + (u32(2) if reject_stat == 0 else b"")


def record(message: bytes, cuts=()) -> bytes:
    """``message`` as one RPC record, split into fragments at ``cuts``."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(message))), len(message)]
    out = b""
    for k in range(len(bounds) - 1):
        piece = message[bounds[k]:bounds[k + 1]]
        out += u32(len(piece) | (LAST if k == len(bounds) - 2 else 0)) + piece
    return out


def udp_capture(messages, client=CLIENT, server=SERVER, t0_ns=1_000_000_000, gap_ns=1_000_000) -> bytes:
    """messages: (from_client, bytes) or (from_client, bytes, t_ns); UDP datagrams between client and server."""
    records = []
    for k, item in enumerate(messages):
        fc, payload = item[0], item[1]
        t = item[2] if len(item) > 2 else t0_ns + k * gap_ns
        (sa, sp), (da, dp) = (client, server) if fc else (server, client)
        frame = ethernet(ipv4(udp(payload, sport=sp, dport=dp), proto=17, src=sa, dst=da))
        records.append((t // 10**9, t % 10**9, frame))
    return pcap_file(records, nanosecond=True)


def tcp_capture(messages, client=CLIENT, server=SERVER, gap_ns=100_000) -> bytes:
    """messages: (from_client, record bytes[, segment cuts]) sent in order on one connection."""
    steps, t = handshake(), 100_000
    sent = {True: 0, False: 0}
    for item in messages:
        fc, data = item[0], item[1]
        cuts = item[2] if len(item) > 2 else ()
        for st in stream_steps(data, cuts, server=not fc, t0=t, gap=gap_ns // 4):
            st["seq"] += sent[fc]
            steps.append(st)
        sent[fc] += len(data)
        t += gap_ns
    return tcp_conversation(steps, client=client, server=server)


# --- NFSv3 (RFC 1813) and MOUNT (App. I) -----------------------------------------------------------

def diropargs(fh: bytes, name: str) -> bytes:
    return opaque(fh) + opaque(name)


def lookup3_ok(fh: bytes) -> bytes:
    return u32(0) + opaque(fh) + u32(0) + u32(0)  # status, object, no obj_attributes, no dir_attributes


# --- NFSv4 COMPOUND (RFC 7530 §16.2, RFC 8881 §18) -------------------------------------------------

def compound(tag: str, minor: int, ops: list[bytes]) -> bytes:
    return opaque(tag) + u32(minor) + u32(len(ops)) + b"".join(ops)


def compound_res(status: int, tag: str, results: list[bytes]) -> bytes:
    return u32(status) + opaque(tag) + u32(len(results)) + b"".join(results)


def cb_compound(tag: str, minor: int, ident: int, ops: list[bytes]) -> bytes:
    return opaque(tag) + u32(minor) + u32(ident) + u32(len(ops)) + b"".join(ops)


def stateid(seqid: int, other: bytes) -> bytes:
    return u32(seqid) + other.ljust(12, b"\0")[:12]


def op_sequence(sessionid: bytes, seq: int, slot: int, highest: int) -> bytes:
    return u32(53) + sessionid + u32(seq) + u32(slot) + u32(highest) + u32(0)


def res_sequence(sessionid: bytes, seq: int, slot: int, highest: int, target: int, status: int = 0) -> bytes:
    return u32(53) + u32(status) + (sessionid + u32(seq) + u32(slot) + u32(highest) + u32(target) + u32(0)
                                    if status == 0 else b"")


def op_putfh(fh: bytes) -> bytes:
    return u32(22) + opaque(fh)


def op_putrootfh() -> bytes:
    return u32(24)


def op_lookup(name: str) -> bytes:
    return u32(15) + opaque(name)


def op_getfh() -> bytes:
    return u32(10)


def op_getattr(*words: int) -> bytes:
    return u32(9) + u32(len(words)) + b"".join(u32(w) for w in words)


def op_open(name: str, seqid=1, access=1, deny=0, clientid=0x1122, owner=b"open-owner-1", create=False) -> bytes:
    how = u32(1) + u32(0) + u32(0) + u32(0) if create else u32(0)  # OPEN4_CREATE UNCHECKED4 with empty fattr4
    return (u32(18) + u32(seqid) + u32(access) + u32(deny) + u64(clientid) + opaque(owner) + how
            + u32(0) + opaque(name))  # CLAIM_NULL


def res_open(sid: bytes, deleg: int = 0, deleg_sid: bytes = b"") -> bytes:
    body = sid + u32(0) + u64(1) + u64(2) + u32(4) + u32(0)  # cinfo, rflags, attrset (empty bitmap)
    body += u32(deleg)
    if deleg == 1:  # READ: stateid, recall, nfsace4
        body += deleg_sid + u32(0) + u32(0) + u32(0) + u32(0) + opaque("EVERYONE@")
    return u32(18) + u32(0) + body


def res_plain(op: int, status: int = 0, body: bytes = b"") -> bytes:
    return u32(op) + u32(status) + body


def res_getfh(fh: bytes) -> bytes:
    return u32(10) + u32(0) + opaque(fh)


def res_getattr() -> bytes:
    return u32(9) + u32(0) + u32(1) + u32(0) + opaque(b"")


def op_lock(locktype: int, offset: int, length: int, open_sid: bytes, clientid=0x1122, owner=b"lock-owner-1",
            lock_seqid=0) -> bytes:
    return (u32(12) + u32(locktype) + u32(0) + u64(offset) + u64(length) + u32(1)  # new lock owner
            + u32(2) + open_sid + u32(lock_seqid) + u64(clientid) + opaque(owner))


def op_lockt(locktype: int, offset: int, length: int, clientid=0x1122, owner=b"lock-owner-1") -> bytes:
    return u32(13) + u32(locktype) + u64(offset) + u64(length) + u64(clientid) + opaque(owner)


def op_locku(locktype: int, seqid: int, sid: bytes, offset: int, length: int) -> bytes:
    return u32(14) + u32(locktype) + u32(seqid) + sid + u64(offset) + u64(length)


def res_lock_denied(op: int, offset: int, length: int, locktype: int, clientid: int, owner: bytes) -> bytes:
    return u32(op) + u32(10010) + u64(offset) + u64(length) + u32(locktype) + u64(clientid) + opaque(owner)


def op_delegreturn(sid: bytes) -> bytes:
    return u32(8) + sid


def cb_op_recall(sid: bytes, fh: bytes) -> bytes:
    return u32(4) + sid + u32(0) + opaque(fh)


def cb_op_sequence(sessionid: bytes, seq: int, slot: int, highest: int) -> bytes:
    return u32(11) + sessionid + u32(seq) + u32(slot) + u32(highest) + u32(0) + u32(0)


# --- delegations and their recall (RFC 7530 §10.4, §16.6, §18.2; RFC 8881 §18.6, §20.2) -------------

NFS4ERR_DELAY = 10008


def res_open_write_deleg(sid: bytes, deleg_sid: bytes) -> bytes:
    """OPEN4resok granting a WRITE delegation (open_write_delegation4: stateid, recall, space_limit
    NFS_LIMIT_SIZE, permissions)."""
    body = sid + u32(0) + u64(1) + u64(2) + u32(4) + u32(0) + u32(2)
    body += deleg_sid + u32(0) + u32(1) + u64(1 << 20) + u32(0) + u32(0) + u32(0) + opaque("EVERYONE@")
    return u32(18) + u32(0) + body


def op_write(sid: bytes, offset: int, data: bytes, stable: int = 2) -> bytes:
    return u32(38) + sid + u64(offset) + u32(stable) + opaque(data)


def res_write(count: int) -> bytes:
    return u32(38) + u32(0) + u32(count) + u32(2) + b"verifier"


def cb_recall_call(xid: int, sid: bytes, fh: bytes, sessionid: bytes | None = None, cb_prog: int = 0x40000000,
                   seq: int = 1) -> bytes:
    """CB_COMPOUND with CB_RECALL (4.1 with CB_SEQUENCE when ``sessionid``, else 4.0) as a record."""
    ops = ([cb_op_sequence(sessionid, seq, 0, 0)] if sessionid is not None else []) + [cb_op_recall(sid, fh)]
    return record(call(xid, cb_prog, 1, 1, cb_compound("", 1 if sessionid is not None else 0, 0, ops)))


def cb_recall_reply(xid: int, sessionid: bytes | None = None, seq: int = 1, status: int = 0) -> bytes:
    res = ([u32(11) + u32(0) + sessionid + u32(seq) + u32(0) + u32(0) + u32(0)] if sessionid is not None else [])
    return record(reply(xid, compound_res(status, "", res + [res_plain(4, status)])))


def multi_tcp_capture(connections) -> bytes:
    """One pcap (ns) of several record-marked TCP connections on one timeline. ``connections``: dicts
    with ``client`` and ``server`` (address, port), ``t0`` (handshake time, ns; RTT 20 µs) and
    ``messages``: (t_ns, from_client, record bytes) in order."""
    import struct as _s

    records = []
    for c in connections:
        steps = handshake(t0=c["t0"])
        sent = {True: 0, False: 0}
        for t, fc, data in c["messages"]:
            steps.append({"t": t, "from_client": fc, "data": data, "seq": 1 + sent[fc], "flags": 0x18})
            sent[fc] += len(data)
        pcap = tcp_conversation(steps, client=c["client"], server=c["server"])
        p = 24
        while p < len(pcap):
            sec, frac, caplen, _wire = _s.unpack_from("<IIII", pcap, p)
            records.append((sec, frac, pcap[p + 16:p + 16 + caplen]))
            p += 16 + caplen
    records.sort(key=lambda r: (r[0], r[1]))
    return pcap_file(records, nanosecond=True)
