"""The NFSv4.0 callback server of one of our XDR clients (samples/realkit/nfs_client.py).

An NFSv4.0 client names a callback address in SETCLIENTID (RFC 7530 §16.33: cb_client4 with
cb_program, r_netid "tcp" and r_addr, the universal address "h1.h2.h3.h4.p1.p2" of RFC 5665 §5.2.3.3);
the server opens a TCP connection of its own to it (§3.3.5: the callback path) and calls the callback
program there: CB_NULL (§17.1; Ganesha probes the path with it before it grants delegations) and
CB_COMPOUND (§17.2) holding CB_RECALL (§18.2: the delegation's stateid, truncate, file handle) or
CB_GETATTR (§18.1).  ONC RPC over TCP with record marking (RFC 5531 §11).

Like the Linux client (fs/nfs/callback_proc.c nfs4_callback_recall), the CB_RECALL is answered at once
(NFS4_OK: the client knows the delegation) and the delegation is given back afterwards, with
DELEGRETURN on the fore channel (§16.8), by ``on_recall`` in a thread of its own: how long that takes
is the client's business (the scenario's: a prompt return, or a slow flush).
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .nfs_client import LAST_FRAGMENT, MSG_CALL, MSG_REPLY, Packer, Unpacker, recv_record

CB_PROGRAM = 0x40000000        # first number of the transient range (RFC 7530 §16.33.1), the Linux client's
CB_VERSION = 1
CB_NULL, CB_COMPOUND = 0, 1
OP_CB_GETATTR, OP_CB_RECALL, OP_CB_ILLEGAL = 3, 4, 10044
NFS4_OK, NFS4ERR_BADHANDLE, NFS4ERR_OP_ILLEGAL = 0, 10001, 10044


def universal_addr(host: str, port: int) -> str:
    """RFC 5665 §5.2.3.3: an IPv4 address and TCP port as "h1.h2.h3.h4.p1.p2"."""
    return f"{host}.{port >> 8}.{port & 0xFF}"


@dataclass
class CallbackEvent:
    """One callback call as the client saw it (times: wall clock, seconds)."""
    t_call: float                 # the call's record fully read
    t_reply: float                # the reply written
    xid: int
    procedure: str                # "CB_NULL" or "CB_COMPOUND"
    ops: list[int] = field(default_factory=list)
    recall_stateid: bytes = b""
    recall_truncate: bool = False
    recall_fh: bytes = b""
    peer: str = ""


class CallbackServer:
    """A listening TCP socket on ADDR (in the namespace of the thread that builds it) serving
    CB_NULL and CB_COMPOUND; ON_RECALL(event) runs in a new thread after each CB_RECALL reply."""

    def __init__(self, addr: str, on_recall: Callable[[CallbackEvent], None] | None = None,
                 port: int = 0, program: int = CB_PROGRAM):
        self.addr, self.program, self.on_recall = addr, program, on_recall
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((addr, port))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.events: list[CallbackEvent] = []
        self.saw_null = threading.Event()
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def r_addr(self) -> str:
        return universal_addr(self.addr, self.port)

    def close(self) -> None:
        self._closed = True
        for s in [self.listener, *self._conns]:
            try:
                s.close()
            except OSError:
                pass

    def recalls(self) -> list[CallbackEvent]:
        return [e for e in self.events if OP_CB_RECALL in e.ops]

    # -- serving
    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn, f"{peer[0]}:{peer[1]}"), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        try:
            while True:
                msg = _recv_record(conn)
                if msg is None:
                    return
                t_call = time.time()
                reply, ev = self._answer(msg, t_call, peer)
                if reply is None:
                    continue
                conn.sendall(struct.pack(">I", LAST_FRAGMENT | len(reply)) + reply)
                ev.t_reply = time.time()
                self.events.append(ev)
                if ev.procedure == "CB_NULL":
                    self.saw_null.set()
                if OP_CB_RECALL in ev.ops and self.on_recall is not None:
                    threading.Thread(target=self.on_recall, args=(ev,), daemon=True).start()
        except OSError:
            return

    def _answer(self, msg: bytes, t_call: float, peer: str) -> tuple[bytes | None, CallbackEvent | None]:
        """The reply to one callback call (RFC 5531 §9 accepted reply, AUTH_NONE verifier)."""
        u = Unpacker(msg)
        xid, mtype = u.u32(), u.u32()
        if mtype != MSG_CALL:
            return None, None
        _rpcvers, prog, vers, proc = u.u32(), u.u32(), u.u32(), u.u32()
        u.u32(); u.opaque()        # credential
        u.u32(); u.opaque()        # verifier
        head = Packer().u32(xid).u32(MSG_REPLY).u32(0).u32(0).u32(0)   # MSG_ACCEPTED, AUTH_NONE, len 0
        if prog != self.program:
            return head.u32(1).bytes(), CallbackEvent(t_call, 0.0, xid, f"prog {prog}", peer=peer)   # PROG_UNAVAIL
        if proc == CB_NULL:
            return head.u32(0).bytes(), CallbackEvent(t_call, 0.0, xid, "CB_NULL", peer=peer)
        if proc != CB_COMPOUND:
            return head.u32(3).bytes(), CallbackEvent(t_call, 0.0, xid, f"proc {proc}", peer=peer)  # PROC_UNAVAIL
        ev = CallbackEvent(t_call, 0.0, xid, "CB_COMPOUND", peer=peer)
        tag = u.opaque()
        u.u32()                    # minorversion (0)
        u.u32()                    # callback_ident (the one SETCLIENTID named)
        results: list[tuple[int, int]] = []
        status = NFS4_OK
        for _ in range(u.u32()):
            op = u.u32()
            ev.ops.append(op)
            if op == OP_CB_RECALL:
                ev.recall_stateid = u.fixed(16)
                ev.recall_truncate = bool(u.u32())
                ev.recall_fh = u.opaque()
                results.append((op, NFS4_OK))
            elif op == OP_CB_GETATTR:
                u.opaque()
                for _ in range(u.u32()):
                    u.u32()
                status = NFS4ERR_BADHANDLE     # we hold no write delegation whose attributes it could ask
                results.append((op, status))
                break
            else:
                status = NFS4ERR_OP_ILLEGAL
                results.append((OP_CB_ILLEGAL, status))
                break
        body = head.u32(0).u32(status).opaque(tag).u32(len(results))
        for op, st in results:
            body.u32(op).u32(st)
        return body.bytes(), ev


def _recv_record(conn: socket.socket) -> bytes | None:
    """One RPC record, or None when the server closed the callback connection."""
    try:
        return recv_record(conn)
    except ConnectionError:
        return None
