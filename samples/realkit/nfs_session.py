"""NFSv4.1 sessions for our XDR client: EXCHANGE_ID, CREATE_SESSION, SEQUENCE slots, many requests in flight.

Built on :mod:`samples.realkit.nfs_client` (its Packer / Unpacker, RPC header, AUTH_SYS credential,
record marking), which speaks NFSv4.0 one call at a time. Here one :class:`Nfs41Session` is one TCP
connection from its own source address carrying one session, and any number of caller threads may
have a COMPOUND outstanding on it at once: a reader thread reads the replies and hands each to the
caller waiting on its xid (RFC 5531 §9: a reply carries only the xid).

RFC 8881 (NFSv4.1):
- §18.35 EXCHANGE_ID: the client id (client_owner4 = verifier + owner string, SP4_NONE);
- §18.36 CREATE_SESSION: the session, fore channel ``ca_maxrequests`` = the slots asked for; the
  server answers with the slots it grants (nfs-ganesha: at most NFSv4 { Slot_Table_Size }, default 64);
  no back channel is asked for (flags 0, so no callbacks);
- §18.46 SEQUENCE, first operation of every other COMPOUND; §2.10.6.1 the slot table: a request takes
  the lowest free slot, sends that slot's sequenceid + 1 (a slot's first request carries 1), and the
  highest slotid the client has in use; the slot is free again when its reply arrives (the reply, not
  the request, ends the use: §2.10.6.1.2). §2.10.6 exactly once: a slot carries one request at a time,
  so the slots granted bound the requests a session can have outstanding.
- §18.46.3: the reply's ``sr_highest_slotid`` (the highest slot the server will accept now) and
  ``sr_target_highest_slotid`` (the highest it wants used): new requests use only slots up to the lower
  of the two (and below what CREATE_SESSION granted); a request that finds every usable slot busy waits
  on the client (the Linux client's slot table wait queue, fs/nfs/nfs4session.c) — that wait never
  reaches the wire.
- §18.51 RECLAIM_COMPLETE (after CREATE_SESSION, before any state), §18.37 DESTROY_SESSION,
  §18.50 DESTROY_CLIENTID.

Each COMPOUND is logged (``log``): send and reply times, xid, slot, sequenceid, the time it waited for a
slot, its first work operation and status, and the server's highest / target slot ids of the reply.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from .nfs_client import (LAST_FRAGMENT, NFS4_OK, NFS_PROGRAM, OP_GETATTR, OP_GETFH, OP_LOOKUP, OP_PUTFH,
                         OP_PUTROOTFH, OP_READ, NfsError, Packer, Unpacker, bitmap, opaque_at, skip_result,
                         auth_sys, compound_results, next_xid, parse_reply, recv_record, rpc_call_header,
                         rpc_connection)

# RFC 8881 §18 operation numbers
OP_EXCHANGE_ID, OP_CREATE_SESSION, OP_DESTROY_SESSION = 42, 43, 44
OP_SEQUENCE, OP_DESTROY_CLIENTID, OP_RECLAIM_COMPLETE = 53, 57, 58
EXCHGID4_FLAG_USE_NON_PNFS = 0x00010000      # §18.35.3
SP4_NONE = 0
MINOR_VERSION = 1
ANONYMOUS_STATEID = b"\0" * 16               # §8.2.3: READ without an open (the special stateid 0)
# fore channel limits we ask for (§18.36.3); the server may lower them
MAX_REQUEST_BYTES = 1 << 20
MAX_RESPONSE_BYTES = 1 << 20
MAX_OPERATIONS = 16


@dataclass
class SlotTable:
    """The client's side of a session's fore-channel slot table (RFC 8881 §2.10.6.1)."""
    granted: int                          # ca_maxrequests the server granted
    seqid: list[int] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)
    server_highest: int = -1              # sr_highest_slotid of the last reply (-1: none yet)
    server_target: int = -1               # sr_target_highest_slotid of the last reply
    cond: threading.Condition = field(default_factory=threading.Condition)
    max_in_use: int = 0                   # the most slots ever busy at once

    def __post_init__(self):
        self.seqid = [0] * self.granted
        self.busy = [False] * self.granted

    def limit(self) -> int:
        """The highest slotid a new request may use: the granted table, lowered by the server's
        highest and target slot ids (§18.46.3) once a reply has told them."""
        lim = self.granted - 1
        if self.server_highest >= 0:
            lim = min(lim, self.server_highest)
        if self.server_target >= 0:
            lim = min(lim, self.server_target)
        return max(lim, 0)

    def acquire(self) -> tuple[int, int, int, float]:
        """Wait for the lowest free usable slot; (slotid, sequenceid, highest_slotid in use, wait s)."""
        t0 = time.time()
        with self.cond:
            while True:
                lim = self.limit()
                free = [s for s in range(lim + 1) if not self.busy[s]]
                if free:
                    break
                self.cond.wait()
            slot = free[0]
            self.busy[slot] = True
            self.seqid[slot] += 1        # a new request on the slot: sequenceid + 1 (first one: 1)
            in_use = [s for s, b in enumerate(self.busy) if b]
            self.max_in_use = max(self.max_in_use, len(in_use))
            return slot, self.seqid[slot], max(in_use), time.time() - t0

    def release(self, slot: int, highest: int | None, target: int | None, consumed: bool = True) -> None:
        """Free SLOT after its reply; CONSUMED False when SEQUENCE itself failed (the server did not take
        the sequenceid, §2.10.6.1: the next request on the slot sends the same one again)."""
        with self.cond:
            if not consumed:
                self.seqid[slot] -= 1
            self.busy[slot] = False
            if highest is not None:
                self.server_highest = highest
            if target is not None:
                self.server_target = target
            self.cond.notify_all()

    def in_use(self) -> int:
        with self.cond:
            return sum(self.busy)


class Nfs41Session:
    """One NFSv4.1 client: its own TCP connection from SRC_ADDR, client id, one session of SLOTS slots
    (asked for; ``slots.granted`` is what the server gave). Thread-safe: :meth:`compound` may be called
    from many threads at once, each call holding one slot while it is outstanding."""

    def __init__(self, server: str, src_addr: str, name: str, slots: int = 16, port: int = 2049):
        self.server, self.src_addr, self.name, self.asked_slots, self.port = server, src_addr, name, slots, port
        self.sock: socket.socket | None = None
        self.clientid = 0
        self.sessionid = b""
        self.slots: SlotTable | None = None
        self.log: list[dict] = []
        self._log_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._waiting: dict[int, list] = {}     # xid -> [Event, reply bytes | None]
        self._wait_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._closed = False

    # -- transport: one reader thread, callers waiting per xid
    def connect(self) -> None:
        self.sock = rpc_connection(self.src_addr, self.server, self.port)
        self.cred = auth_sys(self.name)
        self._reader = threading.Thread(target=self._read_loop, daemon=True, name=f"rd-{self.name}")
        self._reader.start()

    def _read_loop(self) -> None:
        try:
            while True:
                data = recv_record(self.sock)
                xid = struct.unpack_from(">I", data)[0]
                with self._wait_lock:
                    w = self._waiting.pop(xid, None)
                if w is not None:     # else: a reply nobody waits for (ignored)
                    w[1] = data
                    w[0].set()
        except (OSError, ConnectionError, struct.error):
            pass
        finally:
            with self._wait_lock:       # wake every caller: their replies will not come
                for w in self._waiting.values():
                    w[0].set()
                self._waiting.clear()

    def _call(self, body: bytes, timeout_s: float = 60.0) -> tuple[int, float, float, bytes]:
        """Send one NFSv4 COMPOUND (procedure 1) and wait for its reply: (xid, t_send, t_reply, data)."""
        xid = next_xid()
        msg = rpc_call_header(xid, NFS_PROGRAM, 4, 1, self.cred) + body
        w = [threading.Event(), None]
        with self._wait_lock:
            self._waiting[xid] = w
        with self._send_lock:
            t_send = time.time()
            self.sock.sendall(struct.pack(">I", LAST_FRAGMENT | len(msg)) + msg)
        if not w[0].wait(timeout_s) or w[1] is None:
            with self._wait_lock:
                self._waiting.pop(xid, None)
            raise ConnectionError(f"no reply to xid {xid:#x}")
        return xid, t_send, time.time(), w[1]

    # -- COMPOUND with or without SEQUENCE
    def compound(self, ops: list[tuple[int, bytes]], tag: str = "", sequence: bool = True
                 ) -> tuple[int, list[tuple[int, int, Unpacker]]]:
        """Send one COMPOUND (minor version 1), SEQUENCE first unless SEQUENCE is False (EXCHANGE_ID,
        CREATE_SESSION, DESTROY_*); (status, [(op, status, unpacker at the result)]) up to the first
        failing operation. With SEQUENCE the call waits for a slot first."""
        slot = seq = highest = -1
        wait_s = 0.0
        if sequence:
            slot, seq, highest, wait_s = self.slots.acquire()
            ops = [(OP_SEQUENCE, Packer().fixed(self.sessionid).u32(seq).u32(slot).u32(highest).u32(0).bytes()),
                   *ops]
        body = Packer().string(tag).u32(MINOR_VERSION).u32(len(ops))
        for op, args in ops:
            body.u32(op).raw(args)
        sr_highest = sr_target = None
        seq_ok = answered = False    # SEQUENCE answered NFS4_OK (else its sequenceid was not consumed)
        try:
            xid, t_send, t_reply, data = self._call(body.bytes())
            answered = True
            _, u = parse_reply(data)
            status, results = compound_results(u, ops, _skip41)
            if results and results[0][0] == OP_SEQUENCE and results[0][1] == NFS4_OK:
                seq_ok = True
                sr_highest, sr_target = struct.unpack_from(">II", data, results[0][2]._res_pos + 16 + 8)
        finally:
            if sequence:   # no reply at all (connection lost): assume the server took it
                self.slots.release(slot, sr_highest, sr_target, consumed=seq_ok or not answered)
        work = [o for o, _ in ops if o not in (OP_SEQUENCE, OP_PUTFH, OP_PUTROOTFH)]
        rec = dict(client=self.src_addr, t_send=t_send, t_reply=t_reply, xid=xid, slot=slot, sequenceid=seq,
                   highest_slotid=highest, wait_slot_s=wait_s, op=work[0] if work else ops[-1][0], status=status,
                   sr_highest_slotid=sr_highest, sr_target_highest_slotid=sr_target)
        with self._log_lock:
            self.log.append(rec)
        return status, results

    def _must(self, r):
        st, res = r
        if st != NFS4_OK:
            raise NfsError(res[-1][0] if res else -1, st)
        return r

    # -- client id and session (RFC 8881 §18.35, §18.36, §18.51)
    def exchange_id(self) -> None:
        owner = f"herdscope-{self.name}-{os.getpid()}".encode()
        args = (Packer().fixed(os.urandom(8)).opaque(owner).u32(EXCHGID4_FLAG_USE_NON_PNFS).u32(SP4_NONE)
                .u32(0).bytes())                         # no client implementation id
        _, res = self._must(self.compound([(OP_EXCHANGE_ID, args)], "exchange_id", sequence=False))
        u = res[0][2]
        self.clientid, self._cs_seq = struct.unpack_from(">QI", u.data, u._res_pos)

    def create_session(self) -> None:
        fore = (Packer().u32(0).u32(MAX_REQUEST_BYTES).u32(MAX_RESPONSE_BYTES).u32(4096).u32(MAX_OPERATIONS)
                .u32(self.asked_slots).u32(0).bytes())
        back = Packer().u32(0).u32(4096).u32(4096).u32(0).u32(2).u32(1).u32(0).bytes()
        args = (Packer().u64(self.clientid).u32(self._cs_seq).u32(0).raw(fore).raw(back).u32(0x40000000)
                .u32(1).u32(0).bytes())                  # csa_sec_parms: one AUTH_NONE
        _, res = self._must(self.compound([(OP_CREATE_SESSION, args)], "create_session", sequence=False))
        u = res[0][2]
        p = u._res_pos
        self.sessionid = u.data[p:p + 16]
        # csr_sequence, csr_flags, then the fore channel: headerpad, maxreq, maxresp, maxresp_cached, maxops,
        # maxrequests
        granted = struct.unpack_from(">I", u.data, p + 16 + 8 + 20)[0]
        self.slots = SlotTable(granted=max(1, granted))

    def reclaim_complete(self) -> None:
        self._must(self.compound([(OP_RECLAIM_COMPLETE, Packer().u32(0).bytes())], "reclaim_complete"))

    def setup(self) -> None:
        """connect, EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE."""
        self.connect()
        self.exchange_id()
        self.create_session()
        self.reclaim_complete()

    def destroy(self) -> None:
        """DESTROY_SESSION, DESTROY_CLIENTID, close (errors ignored: best effort at the end)."""
        try:
            if self.sessionid:
                self.compound([(OP_DESTROY_SESSION, Packer().fixed(self.sessionid).bytes())], "destroy_session",
                              sequence=False)
            if self.clientid:
                self.compound([(OP_DESTROY_CLIENTID, Packer().u64(self.clientid).bytes())], "destroy_clientid",
                              sequence=False)
        except (OSError, ConnectionError, RuntimeError):
            pass
        self.close()

    def close(self) -> None:
        if self.sock:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            self.sock = None

    # -- work
    @staticmethod
    def _lookups(path: str) -> list[tuple[int, bytes]]:
        return [(OP_LOOKUP, Packer().string(c).bytes()) for c in path.strip("/").split("/") if c]

    def lookup(self, path: str) -> bytes:
        """SEQUENCE, PUTROOTFH, LOOKUP per component, GETFH: the handle of PATH."""
        _, res = self._must(self.compound([(OP_PUTROOTFH, b"")] + self._lookups(path) + [(OP_GETFH, b"")],
                                          "lookup"))
        u = [r for r in res if r[0] == OP_GETFH][0][2]
        return opaque_at(u.data, u._res_pos)

    def getattr(self, fh: bytes, bits: tuple[int, ...] = (1, 4, 33)) -> int:
        """SEQUENCE, PUTFH, GETATTR (type, size, mode by default): a stat(). Returns the status."""
        st, _ = self.compound([(OP_PUTFH, Packer().opaque(fh).bytes()), (OP_GETATTR, bitmap(list(bits)))],
                              "getattr")
        return st

    def read(self, fh: bytes, offset: int, count: int) -> int:
        """SEQUENCE, PUTFH, READ with the anonymous stateid (RFC 8881 §8.2.3). Returns the status."""
        st, _ = self.compound([(OP_PUTFH, Packer().opaque(fh).bytes()),
                               (OP_READ, Packer().fixed(ANONYMOUS_STATEID).u64(offset).u32(count).bytes())], "read")
        return st


def _skip41(op: int, u: Unpacker) -> None:
    """Move past the result of OP (RFC 8881 §18), remembering its start in ``u._res_pos``."""
    u._res_pos = u.pos
    if op == OP_SEQUENCE:             # sessionid, sequenceid, slotid, highest, target, status_flags
        u.fixed(16); u.u32(); u.u32(); u.u32(); u.u32(); u.u32()
    elif op == OP_EXCHANGE_ID:        # clientid, sequenceid, flags, state_protect4_r, server_owner4, scope, impl_id<1>
        u.u64(); u.u32(); u.u32()
        if u.u32() != SP4_NONE:
            raise RuntimeError("EXCHANGE_ID: state protection not handled")
        u.u64(); u.opaque(); u.opaque()
        for _ in range(u.u32()):
            u.opaque(); u.opaque(); u.u64(); u.u32()
    elif op == OP_CREATE_SESSION:     # sessionid, sequence, flags, fore and back channel_attrs4
        u.fixed(16); u.u32(); u.u32()
        for _ in range(2):
            for _ in range(6):
                u.u32()
            for _ in range(u.u32()):
                u.u32()
    elif op in (OP_RECLAIM_COMPLETE, OP_DESTROY_SESSION, OP_DESTROY_CLIENTID):
        return
    else:
        skip_result(op, u)
