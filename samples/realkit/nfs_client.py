"""A small ONC-RPC/XDR NFS client of our own over a socket, for the recorded NFS samples.

ONC RPC (RFC 5531: call/reply header, AUTH_SYS credential, TCP record marking §11), NFSv4.0
COMPOUNDs (RFC 7530: SETCLIENTID/SETCLIENTID_CONFIRM, PUTROOTFH, LOOKUP, OPEN(+OPEN_CONFIRM),
GETFH, READ, WRITE, CLOSE, LOCK/LOCKU with NFS4ERR_DENIED, RENEW) and NFSv3 over UDP (RFC 1813
GETATTR/LOOKUP/READ; root handle from MOUNT v3 MNT) with retransmission of the same xid.
Written by hand because libnfs answers lock denials straight back and keeps no retry timer.

Timers modelled on the Linux client (fs/nfs/nfs4proc.c, fs/nfs/nfs4renewd.c, nfs(5)):
- blocking lock retry (nfs4_retry_setlk_simple): NFS4_LOCK_MINTIMEOUT = 1*HZ = 1 s, doubled
  after each NFS4ERR_DENIED up to NFS4_LOCK_MAXTIMEOUT = 30*HZ = 30 s (checked in the kernel
  source; not 1/10 s).  Blocking requests use WRITEW_LT, as nfs4_lck_type() does for F_SETLKW.
- lease renewal: RENEW at 2/3 of the server's lease time (nfs4_schedule_state_renewal).
- UDP retransmission (nfs(5)): timeo=11 (1.1 s), doubled after each retransmission, same xid,
  capped at 60 s.
- NFS4ERR_DELAY (e.g. an OPEN that conflicts with another client's delegation while the server
  recalls it): the call is sent again after nfs4_delay's timer (nfs4_update_delay):
  NFS4_POLL_RETRY_MIN = HZ/10 = 100 ms, doubled after each delay, capped at NFS4_POLL_RETRY_MAX =
  15*HZ = 15 s (checked in the kernel source).

Delegations (RFC 7530 §10.4): SETCLIENTID can name a real callback address (a
samples.realkit.nfs_callback.CallbackServer); OPEN records the delegation it grants
(open_delegation4, §16.16.5); DELEGRETURN (§16.8) gives it back.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

# RFC 5531
MSG_CALL, MSG_REPLY = 0, 1
AUTH_NONE, AUTH_SYS = 0, 1
LAST_FRAGMENT = 0x80000000
NFS_PROGRAM, MOUNT_PROGRAM = 100003, 100005

# RFC 7530 §16 operation numbers
OP_CLOSE, OP_GETATTR, OP_GETFH, OP_LOCK, OP_LOCKU, OP_LOOKUP = 4, 9, 10, 12, 14, 15
OP_OPEN, OP_OPEN_CONFIRM, OP_PUTFH, OP_PUTROOTFH, OP_READ = 18, 20, 22, 24, 25
OP_RENEW, OP_SETCLIENTID, OP_SETCLIENTID_CONFIRM, OP_WRITE = 30, 35, 36, 38
OP_DELEGRETURN = 8
NFS4_OK, NFS4ERR_DENIED = 0, 10010
NFS4ERR_DELAY = 10008
OPEN4_SHARE_ACCESS_WRITE = 2
OPEN_DELEGATE_NONE, OPEN_DELEGATE_READ, OPEN_DELEGATE_WRITE = 0, 1, 2
CB_PROGRAM = 0x40000000          # RFC 7530 §16.33.1 transient range; the Linux client's NFS4_CALLBACK
WRITE_LT, WRITEW_LT = 2, 4
OPEN4_SHARE_ACCESS_READ, OPEN4_SHARE_ACCESS_BOTH, OPEN4_SHARE_DENY_NONE = 1, 3, 0
OPEN4_RESULT_CONFIRM = 2
FILE_SYNC4 = 2
NFS4_LENGTH_TO_EOF = 0xFFFFFFFFFFFFFFFF

# Linux client timers (see the module docstring)
LOCK_MIN_TIMEOUT_S = 1.0
LOCK_MAX_TIMEOUT_S = 30.0
RENEW_FRACTION_OF_LEASE = 2 / 3
UDP_TIMEO_S = 1.1
UDP_MAX_TIMEO_S = 60.0
DELAY_MIN_S = 0.1                # NFS4_POLL_RETRY_MIN
DELAY_MAX_S = 15.0               # NFS4_POLL_RETRY_MAX



def rpc_connection(src_addr: str, server: str, port: int) -> socket.socket:
    """A TCP connection from SRC_ADDR to the server's PORT, Nagle off (a client's calls go out at once)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.bind((src_addr, 0))
    s.connect((server, port))
    return s


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """N bytes from SOCK; ConnectionError when the peer closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def recv_record(sock: socket.socket) -> bytes:
    """One RPC record from SOCK: its fragments up to the one with the last-fragment bit (RFC 5531 §11)."""
    parts = []
    while True:
        mark = struct.unpack(">I", recv_exact(sock, 4))[0]
        parts.append(recv_exact(sock, mark & 0x7FFFFFFF))
        if mark & LAST_FRAGMENT:
            return b"".join(parts)

class NfsError(Exception):
    def __init__(self, op: int, status: int):
        super().__init__(f"op {op}: status {status}")
        self.op, self.status = op, status


# --------------------------------------------------------------------------- XDR
class Packer:
    def __init__(self):
        self.parts: list[bytes] = []

    def u32(self, v: int) -> "Packer":
        self.parts.append(struct.pack(">I", v & 0xFFFFFFFF))
        return self

    def u64(self, v: int) -> "Packer":
        self.parts.append(struct.pack(">Q", v))
        return self

    def fixed(self, b: bytes) -> "Packer":
        self.parts.append(b + b"\0" * (-len(b) % 4))
        return self

    def opaque(self, b: bytes) -> "Packer":
        return self.u32(len(b)).fixed(b)

    def string(self, s: str) -> "Packer":
        return self.opaque(s.encode())

    def raw(self, b: bytes) -> "Packer":
        self.parts.append(b)
        return self

    def bytes(self) -> bytes:
        return b"".join(self.parts)


class Unpacker:
    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def u32(self) -> int:
        v = struct.unpack_from(">I", self.data, self.pos)[0]
        self.pos += 4
        return v

    def u64(self) -> int:
        v = struct.unpack_from(">Q", self.data, self.pos)[0]
        self.pos += 8
        return v

    def fixed(self, n: int) -> bytes:
        b = self.data[self.pos:self.pos + n]
        self.pos += n + (-n % 4)
        return b

    def opaque(self) -> bytes:
        return self.fixed(self.u32())


def auth_sys(machine: str, uid: int = 0, gid: int = 0) -> bytes:
    body = Packer().u32(int(time.time())).string(machine).u32(uid).u32(gid).u32(0).bytes()
    return Packer().u32(AUTH_SYS).opaque(body).bytes()


def rpc_call_header(xid: int, prog: int, vers: int, proc: int, cred: bytes) -> bytes:
    return (Packer().u32(xid).u32(MSG_CALL).u32(2).u32(prog).u32(vers).u32(proc).raw(cred)
            .u32(AUTH_NONE).u32(0).bytes())


def parse_reply(data: bytes) -> tuple[int, Unpacker]:
    """(xid, unpacker at the procedure results) of an accepted, successful RPC reply."""
    u = Unpacker(data)
    xid, mtype, reply_stat = u.u32(), u.u32(), u.u32()
    if mtype != MSG_REPLY or reply_stat != 0:
        raise RuntimeError(f"RPC reply xid {xid:#x} denied (stat {reply_stat})")
    u.u32()
    u.opaque()          # verifier
    accept = u.u32()
    if accept != 0:
        raise RuntimeError(f"RPC reply xid {xid:#x} accept_stat {accept}")
    return xid, u


_xid_lock = threading.Lock()
_xid_next = [int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF]


def next_xid() -> int:
    with _xid_lock:
        _xid_next[0] = (_xid_next[0] + 1) & 0xFFFFFFFF
        return _xid_next[0]


# --------------------------------------------------------------------------- NFSv4.0 over TCP
@dataclass
class OpenFile:
    path: str
    fh: bytes
    stateid: bytes           # seqid(4) + other(12)
    lock_stateid: bytes | None = None
    lock_seqid: int = 0
    delegation_type: int = OPEN_DELEGATE_NONE     # what OPEN granted (open_delegation_type4)
    delegation_stateid: bytes | None = None


@dataclass
class Nfs4Client:
    """One NFSv4.0 client: its own TCP connection from SRC_ADDR, its own client id and open-owner."""
    server: str
    src_addr: str
    name: str
    port: int = 2049
    sock: socket.socket | None = None
    clientid: int = 0
    open_seqid: int = 0
    lease_s: float = 0.0
    log: list[dict] = field(default_factory=list)

    def connect(self) -> None:
        self._io = threading.Lock()
        self._stop_renew = threading.Event()
        self.last_renewal = time.time()
        self.sock = rpc_connection(self.src_addr, self.server, self.port)
        self.cred = auth_sys(self.name)

    @classmethod
    def started(cls, server: str, src_addr: str, name: str, renew: bool = True) -> "Nfs4Client":
        """A client connected, with its client id confirmed (SETCLIENTID without a callback) and, with
        RENEW, its lease renewed in the background: how every scenario's plain client starts."""
        c = cls(server, src_addr, name)
        c.connect()
        c.setclientid()
        if renew:
            c.start_renewer()
        return c

    def close(self) -> None:
        self._stop_renew.set()
        if self.sock:
            self.sock.close()
            self.sock = None

    def _recv_record(self) -> bytes:
        return recv_record(self.sock)

    def compound(self, ops: list[tuple[int, bytes]], tag: str = "") -> tuple[int, list[tuple[int, int, Unpacker]]]:
        """Send one COMPOUND (minor version 0) and return (status, [(op, status, unpacker)])
        for the results up to the first failing one."""
        xid = next_xid()
        body = Packer().string(tag).u32(0).u32(len(ops))
        for op, args in ops:
            body.u32(op).raw(args)
        msg = rpc_call_header(xid, NFS_PROGRAM, 4, 1, self.cred) + body.bytes()
        with self._io:
            t_send = time.time()
            self.sock.sendall(struct.pack(">I", LAST_FRAGMENT | len(msg)) + msg)
            rxid, u = parse_reply(self._recv_record())
            self.last_renewal = t_send    # every v4.0 call with our client id renews the lease
        if rxid != xid:
            raise RuntimeError(f"xid mismatch {rxid:#x} != {xid:#x}")
        status, results = compound_results(u, ops)
        self.log.append(dict(t_send=t_send, t_reply=time.time(), xid=xid, ops=[o for o, _ in ops],
                             status=status))
        return status, results

    # -- client id (RFC 7530 §16.33, §16.34)
    def setclientid(self, cb_r_addr: str | None = None, cb_program: int = CB_PROGRAM, cb_ident: int = 1) -> None:
        """CB_R_ADDR: the universal address of our callback server (RFC 7530 §16.33 cb_location, netid
        "tcp"); None names port 989 of our address, where nothing listens (no callback path)."""
        verifier = os.urandom(8)
        owner = f"herdscope-{self.name}-{os.getpid()}".encode()
        cb = (Packer().fixed(verifier).opaque(owner).u32(cb_program).string("tcp")
              .string(cb_r_addr or f"{self.src_addr}.3.221").u32(cb_ident).bytes())
        _, res = self._must(self.compound([(OP_SETCLIENTID, cb)], "setclientid"))
        u = res[0][2]
        self.clientid = struct.unpack_from(">Q", u.data, u._res_pos)[0]
        confirm = u.data[u._res_pos + 8:u._res_pos + 16]
        self._must(self.compound([(OP_SETCLIENTID_CONFIRM, Packer().u64(self.clientid).fixed(confirm).bytes())],
                                 "setclientid_confirm"))
        # the lease time (attribute 10, lease_time) from the root's GETATTR
        _, res = self._must(self.compound([(OP_PUTROOTFH, b""), (OP_GETATTR, bitmap([10]))], "lease"))
        u = res[1][2]
        words = struct.unpack_from(">I", u.data, u._res_pos)[0]
        self.lease_s = float(struct.unpack_from(">I", u.data, u._res_pos + 4 + 4 * words + 4)[0])

    def start_renewer(self) -> None:
        """A thread like the Linux client's renewd: RENEW when 2/3 of the lease has passed
        since the last call (nfs4_schedule_state_renewal)."""
        def loop() -> None:
            while not self._stop_renew.wait(0.2):
                if time.time() - self.last_renewal >= self.lease_s * RENEW_FRACTION_OF_LEASE:
                    try:
                        self.renew()
                    except OSError:
                        return
        threading.Thread(target=loop, daemon=True).start()

    def renew(self) -> int:
        st, _ = self.compound([(OP_RENEW, Packer().u64(self.clientid).bytes())], "renew")
        return st

    def _must(self, r):
        st, res = r
        if st != NFS4_OK:
            raise NfsError(res[-1][0] if res else -1, st)
        return r

    @staticmethod
    def _lookups(path: str) -> list[tuple[int, bytes]]:
        return [(OP_LOOKUP, Packer().string(c).bytes()) for c in path.strip("/").split("/") if c]

    def lookup(self, path: str) -> bytes:
        """PUTROOTFH, LOOKUP per component, GETFH, GETATTR: the handle of PATH."""
        _, res = self._must(self.compound([(OP_PUTROOTFH, b"")] + self._lookups(path)
                                          + [(OP_GETFH, b""), (OP_GETATTR, bitmap([1, 4]))], "lookup"))
        u = [r for r in res if r[0] == OP_GETFH][0][2]
        return opaque_at(u.data, u._res_pos)

    # -- open / close (RFC 7530 §16.16, §16.18, §16.2)
    def open(self, path: str, access: int = OPEN4_SHARE_ACCESS_BOTH) -> OpenFile:
        parent, name = path.rstrip("/").rsplit("/", 1) if "/" in path.strip("/") else ("", path.strip("/"))
        owner = f"open-{self.name}".encode()
        args = (Packer().u32(self.open_seqid).u32(access).u32(OPEN4_SHARE_DENY_NONE)
                .u64(self.clientid).opaque(owner).u32(0).u32(0).string(name).bytes())  # NOCREATE, CLAIM_NULL
        st, res = self.compound([(OP_PUTROOTFH, b"")] + self._lookups(parent)
                                + [(OP_OPEN, args), (OP_GETFH, b"")], "open")
        if any(op == OP_OPEN for op, _, _ in res):
            self.open_seqid += 1     # the open-owner seqid advances on OK and on most errors (§9.1.7)
        self._must((st, res))
        u = [r for r in res if r[0] == OP_OPEN][0][2]
        p = u._res_pos
        stateid = u.data[p:p + 16]
        rflags = struct.unpack_from(">I", u.data, p + 16 + 4 + 16)[0]
        deleg_type, deleg_stateid = _open_delegation(u.data, p)
        fu = [r for r in res if r[0] == OP_GETFH][0][2]
        fh = opaque_at(fu.data, fu._res_pos)
        if rflags & OPEN4_RESULT_CONFIRM:
            _, cres = self._must(self.compound([(OP_PUTFH, Packer().opaque(fh).bytes()),
                                                (OP_OPEN_CONFIRM, Packer().fixed(stateid).u32(self.open_seqid).bytes())],
                                               "open_confirm"))
            self.open_seqid += 1
            cu = cres[1][2]
            stateid = cu.data[cu._res_pos:cu._res_pos + 16]
        return OpenFile(path, fh, stateid, delegation_type=deleg_type, delegation_stateid=deleg_stateid)

    def open_retrying_delay(self, path: str, access: int, attempts: list[dict], give_up_s: float = 60.0) -> OpenFile:
        """OPEN, sent again while the server answers NFS4ERR_DELAY, on the Linux client's nfs4_delay
        timer (DELAY_MIN_S doubled up to DELAY_MAX_S). Appends each attempt (client, t_send, t_reply,
        status, wait_before_next_s) to ATTEMPTS."""
        wait_s = DELAY_MIN_S
        t_end = time.time() + give_up_s
        while True:
            t = time.time()
            try:
                f = self.open(path, access)
            except NfsError as e:
                attempts.append(dict(client=self.src_addr, t_send=t, t_reply=time.time(), status=e.status,
                                     wait_before_next_s=wait_s if e.status == NFS4ERR_DELAY else 0.0))
                if e.status != NFS4ERR_DELAY or time.time() + wait_s > t_end:
                    raise
                time.sleep(wait_s)
                wait_s = min(DELAY_MAX_S, wait_s * 2)
                continue
            attempts.append(dict(client=self.src_addr, t_send=t, t_reply=time.time(), status=NFS4_OK,
                                 wait_before_next_s=0.0))
            return f

    def delegreturn(self, fh: bytes, deleg_stateid: bytes) -> int:
        """PUTFH + DELEGRETURN (RFC 7530 §16.8); returns the COMPOUND's status."""
        st, _ = self.compound([(OP_PUTFH, Packer().opaque(fh).bytes()),
                               (OP_DELEGRETURN, Packer().fixed(deleg_stateid).bytes())], "delegreturn")
        return st

    def close_file(self, f: OpenFile) -> None:
        st, res = self.compound([(OP_PUTFH, Packer().opaque(f.fh).bytes()),
                                 (OP_CLOSE, Packer().u32(self.open_seqid).fixed(f.stateid).bytes())], "close")
        self.open_seqid += 1
        self._must((st, res))

    def read(self, f: OpenFile, offset: int, count: int) -> bytes:
        _, res = self._must(self.compound([(OP_PUTFH, Packer().opaque(f.fh).bytes()),
                                           (OP_READ, Packer().fixed(f.stateid).u64(offset).u32(count).bytes())], "read"))
        u = res[1][2]
        return opaque_at(u.data, u._res_pos + 4)

    def write(self, f: OpenFile, offset: int, data: bytes) -> None:
        self._must(self.compound([(OP_PUTFH, Packer().opaque(f.fh).bytes()),
                                  (OP_WRITE, Packer().fixed(f.stateid).u64(offset).u32(FILE_SYNC4).opaque(data).bytes())],
                                 "write"))

    # -- byte-range locks (RFC 7530 §16.10, §16.12)
    def lock_once(self, f: OpenFile, locktype: int = WRITEW_LT) -> int:
        """One LOCK of the whole file; returns NFS4_OK or NFS4ERR_DENIED (other errors raise)."""
        hdr = Packer().u32(locktype).u32(0).u64(0).u64(NFS4_LENGTH_TO_EOF)
        if f.lock_stateid is None:   # open_to_lock_owner4 (§16.10.4)
            hdr.u32(1).u32(self.open_seqid).fixed(f.stateid).u32(0).u64(self.clientid).opaque(f"lock-{self.name}".encode())
        else:                        # exist_lock_owner4
            hdr.u32(0).fixed(f.lock_stateid).u32(f.lock_seqid)
        st, res = self.compound([(OP_PUTFH, Packer().opaque(f.fh).bytes()), (OP_LOCK, hdr.bytes())], "lock")
        if f.lock_stateid is None:
            self.open_seqid += 1
        else:
            f.lock_seqid += 1
        if st == NFS4_OK:
            u = res[1][2]
            f.lock_stateid = u.data[u._res_pos:u._res_pos + 16]
            if f.lock_seqid == 0:
                f.lock_seqid = 1
            return NFS4_OK
        if st == NFS4ERR_DENIED:
            return st
        raise NfsError(OP_LOCK, st)

    def unlock(self, f: OpenFile) -> None:
        args = Packer().u32(WRITE_LT).u32(f.lock_seqid).fixed(f.lock_stateid).u64(0).u64(NFS4_LENGTH_TO_EOF).bytes()
        st, res = self.compound([(OP_PUTFH, Packer().opaque(f.fh).bytes()), (OP_LOCKU, args)], "locku")
        f.lock_seqid += 1
        self._must((st, res))
        u = res[1][2]
        f.lock_stateid = u.data[u._res_pos:u._res_pos + 16]

    def lock_blocking(self, f: OpenFile, interval_s: float | None, give_up_s: float,
                      attempts: list[dict]) -> bool:
        """Poll LOCK until granted: every INTERVAL_S seconds (fixed), or, with INTERVAL_S None, the
        Linux client's growing interval (LOCK_MIN_TIMEOUT_S doubled up to LOCK_MAX_TIMEOUT_S).
        Appends each attempt to ATTEMPTS."""
        wait_s = LOCK_MIN_TIMEOUT_S if interval_s is None else interval_s
        t_end = time.time() + give_up_s
        while True:
            t = time.time()
            st = self.lock_once(f)
            attempts.append(dict(client=self.src_addr, t=t, status=st, wait_before_next_s=wait_s))
            if st == NFS4_OK:
                return True
            if time.time() + wait_s > t_end:
                return False
            time.sleep(wait_s)
            if interval_s is None:
                wait_s = min(LOCK_MAX_TIMEOUT_S, wait_s * 2)


def bitmap(bits: list[int]) -> bytes:
    """An XDR bitmap4 (RFC 7530 §3.2) with these bit numbers set: its word count, then the words."""
    words = [0] * (max(bits) // 32 + 1)
    for b in bits:
        words[b // 32] |= 1 << (b % 32)
    p = Packer().u32(len(words))
    for w in words:
        p.u32(w)
    return p.bytes()


def _skip_delegation(u: Unpacker) -> int:
    """Move past an open_delegation4 (RFC 7530 §16.16.5): none, read (stateid, recall, nfsace4) or write
    (stateid, recall, nfs_space_limit4, nfsace4); returns its type."""
    kind = u.u32()
    if kind in (OPEN_DELEGATE_READ, OPEN_DELEGATE_WRITE):
        u.fixed(16)
        u.u32()                       # recall
        if kind == OPEN_DELEGATE_WRITE:
            if u.u32() == 1:          # NFS_LIMIT_SIZE: filesize
                u.u64()
            else:                     # NFS_LIMIT_BLOCKS: num_blocks, bytes_per_block
                u.u32(); u.u32()
        u.u32(); u.u32(); u.u32()     # nfsace4 type, flag, access_mask
        u.opaque()                    # who
    elif kind != OPEN_DELEGATE_NONE:
        raise RuntimeError(f"OPEN delegation type {kind} not handled")
    return kind


def _open_delegation(data: bytes, res_pos: int) -> tuple[int, bytes | None]:
    """(delegation type, delegation stateid or None) of the OPEN4resok starting at RES_POS."""
    u = Unpacker(data, res_pos)
    u.fixed(16)
    u.u32(); u.u64(); u.u64()
    u.u32()
    for _ in range(u.u32()):
        u.u32()
    at = u.pos
    kind = _skip_delegation(u)
    return kind, (data[at + 4:at + 20] if kind != OPEN_DELEGATE_NONE else None)


def opaque_at(data: bytes, pos: int) -> bytes:
    """The XDR variable-length opaque at POS of DATA (a 4-byte length, then the bytes; RFC 4506 §4.10)."""
    n = struct.unpack_from(">I", data, pos)[0]
    return data[pos + 4:pos + 4 + n]


def compound_results(u: Unpacker, ops: list[tuple[int, bytes]], skip=None) -> tuple[int, list]:
    """COMPOUND4res (RFC 7530 §16.2.2): (status, [(op, status, its own Unpacker at the result body)]) for
    the results up to the first failing one, each checked against the operation asked; SKIP(op, u) moves
    past a result body (default :func:`skip_result`)."""
    skip = skip or skip_result
    status = u.u32()
    u.opaque()     # tag
    results = []
    for _ in range(u.u32()):
        op, st = u.u32(), u.u32()
        mine = Unpacker(u.data, u.pos)   # this result's own view (u moves on)
        mine._res_pos = u.pos
        results.append((op, st, mine))
        if st != NFS4_OK:
            break
        if op != ops[len(results) - 1][0]:
            raise RuntimeError("result order")
        skip(op, u)
    return status, results


def skip_result(op: int, u: Unpacker) -> None:
    """Remember where OP's result body starts (u._res_pos) and move past it (RFC 7530 §16)."""
    u._res_pos = u.pos
    if op in (OP_PUTROOTFH, OP_PUTFH, OP_LOOKUP, OP_RENEW, OP_SETCLIENTID_CONFIRM, OP_DELEGRETURN):
        return
    if op == OP_GETFH:
        u.opaque()
    elif op == OP_GETATTR:
        for _ in range(u.u32()):
            u.u32()
        u.opaque()
    elif op == OP_OPEN:
        u.fixed(16)
        u.u32(); u.u64(); u.u64()     # change_info4
        u.u32()                       # rflags
        for _ in range(u.u32()):      # attrset
            u.u32()
        _skip_delegation(u)
    elif op in (OP_OPEN_CONFIRM, OP_CLOSE, OP_LOCK, OP_LOCKU):
        u.fixed(16)
    elif op == OP_READ:
        u.u32()
        u.opaque()
    elif op == OP_WRITE:
        u.u32(); u.u32(); u.fixed(8)
    elif op == OP_SETCLIENTID:
        u.u64(); u.fixed(8)
    else:
        raise RuntimeError(f"result of op {op} not handled")


# --------------------------------------------------------------------------- NFSv3 over UDP
class Nfs3UdpClient:
    """NFSv3 over UDP from SRC_ADDR: MOUNT v3 MNT for the root handle, then GETATTR/LOOKUP/READ
    calls retransmitted with the same xid on the nfs(5) UDP timer (timeo doubled per retry)."""

    def __init__(self, server: str, src_addr: str, name: str, nfs_port: int = 2049, mount_port: int = 20048,
                 timeo_s: float = UDP_TIMEO_S):
        self.server, self.src_addr, self.name = server, src_addr, name
        self.nfs_port, self.mount_port, self.timeo_s = nfs_port, mount_port, timeo_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((src_addr, 0))
        self.cred = auth_sys(name)
        self.calls: list[dict] = []

    def call(self, prog: int, vers: int, proc: int, args: bytes, port: int) -> Unpacker:
        xid = next_xid()
        msg = rpc_call_header(xid, prog, vers, proc, self.cred) + args
        timeo = self.timeo_s
        rec = dict(client=self.src_addr, xid=xid, proc=proc, t_first=time.time(), sends=[])
        self.calls.append(rec)
        while True:
            rec["sends"].append(time.time())
            self.sock.sendto(msg, (self.server, port))
            deadline = time.time() + timeo
            while True:
                left = deadline - time.time()
                if left <= 0:
                    break
                self.sock.settimeout(left)
                try:
                    data = self.sock.recv(65536)
                except socket.timeout:
                    break
                if struct.unpack_from(">I", data)[0] != xid:
                    continue      # a late reply to an earlier, already answered call
                rec["t_reply"] = time.time()
                rec["retransmissions"] = len(rec["sends"]) - 1
                return parse_reply(data)[1]
            timeo = min(UDP_MAX_TIMEO_S, timeo * 2)

    def mount(self, path: str) -> bytes:
        u = self.call(MOUNT_PROGRAM, 3, 1, Packer().string(path).bytes(), self.mount_port)
        st = u.u32()
        if st != 0:
            raise RuntimeError(f"MNT {path}: status {st}")
        return u.opaque()

    def getattr(self, fh: bytes) -> int:
        return self.call(NFS_PROGRAM, 3, 1, Packer().opaque(fh).bytes(), self.nfs_port).u32()

    def lookup(self, dir_fh: bytes, name: str) -> bytes:
        u = self.call(NFS_PROGRAM, 3, 3, Packer().opaque(dir_fh).string(name).bytes(), self.nfs_port)
        st = u.u32()
        if st != 0:
            raise RuntimeError(f"LOOKUP {name}: status {st}")
        return u.opaque()

    def read(self, fh: bytes, offset: int, count: int) -> int:
        return self.call(NFS_PROGRAM, 3, 6, Packer().opaque(fh).u64(offset).u32(count).bytes(), self.nfs_port).u32()

    def close(self) -> None:
        self.sock.close()
