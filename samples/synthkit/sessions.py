"""SMB2 and LDAP client conversations on top of :class:`.tcp.Tcp`: message ids, credits, sessions
and trees (SMB2, MS-SMB2 §3.2), message ids and segmenting (LDAP, RFC 4511 §4.1.1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .base import DOMAIN, MS, SEC, US
from .frames import ACK, PSH, Host
from .ldap import (LDAP_UNBIND, OP_BIND_RESPONSE, OP_MODIFY_RESPONSE, OP_SEARCH_RESULT_DONE,
                   SCOPE_SUBTREE, ldap_bind_req, ldap_modify_req, ldap_msg, ldap_result, ldap_search_req)
from .ntlm import (NEG_ACCEPT_COMPLETED, NEG_ACCEPT_INCOMPLETE, filetime, ntlm_authenticate, ntlm_challenge,
                   ntlm_negotiate, spnego_init, spnego_resp)
from .smb2 import (ACCESS_READ, ACCESS_WRITE, CLOSE_FLAG_POSTQUERY_ATTRIB, FILE_NON_DIRECTORY_FILE,
                   FILE_OPEN, FILE_OPENED, FL_RESPONSE, LEASE_H, LEASE_R, LEASE_W, MAX_CREDIT_CHARGE_UNIT,
                   OPLOCK_BATCH, OPLOCK_LEASE, SMB2_CLOSE, SMB2_CREATE, SMB2_LOGOFF, SMB2_NEGOTIATE, SMB2_READ,
                   SMB2_SESSION_SETUP, SMB2_TREE_CONNECT, SMB2_TREE_DISCONNECT, SMB2_WRITE, ST_MORE, ST_OK,
                   ST_PENDING, nbss, smb2_close_req, smb2_close_rsp, smb2_create_req, smb2_create_rsp,
                   smb2_empty4, smb2_hdr, smb2_negotiate_req, smb2_negotiate_rsp, smb2_notify_hdr,
                   smb2_read_req, smb2_read_rsp, smb2_session_setup_req, smb2_session_setup_rsp,
                   smb2_tree_connect_req, smb2_tree_connect_rsp, smb2_write_req, smb2_write_rsp)
from .tcp import Tcp

if TYPE_CHECKING:
    from .generator import Gen

SMB_PORT, LDAP_PORT = 445, 389
@dataclass
class SmbOpen:
    name: str
    fid: bytes
    size: int
    lease_key: bytes | None
    oplock: int


class Smb:
    """One SMB2 client connection to the file server (NBSS over TCP 445)."""

    def __init__(self, g: "Gen", cli: Host, srv: Host, user: str, share: str = "projects"):
        self.g, self.cli, self.srv, self.user, self.share = g, cli, srv, user, share
        self.c = Tcp(g, cli, srv, SMB_PORT)
        self.mid = 0
        self.sess = 0
        self.tree = 0
        self.async_next = g.rng.getrandbits(20) + 1

    # -- messages -------------------------------------------------------------------------------
    def req(self, t: int, cmd: int, body: bytes, charge: int = 1, split=None) -> tuple[int, int]:
        """Client request; returns (server reaction time, message id)."""
        mid = self.mid
        self.mid += charge
        hdr = smb2_hdr(cmd, mid, tree=self.tree, sess=self.sess, credits=max(charge, 1) + 1,
                       charge=charge)
        return self.c.send(t, 0, nbss(hdr + body), split=split), mid

    def rsp(self, t: int, cmd: int, mid: int, body: bytes, status: int = ST_OK, charge: int = 1,
            async_id: int | None = None, loss=None) -> int:
        hdr = smb2_hdr(cmd, mid, status=status, flags=FL_RESPONSE, tree=self.tree, sess=self.sess,
                       credits=charge if async_id is None or status == ST_PENDING else 0,
                       charge=charge, async_id=async_id)
        return self.c.send(t, 1, nbss(hdr + body), loss=loss)

    def push(self, t: int, cmd: int, body: bytes, sess: int = 0) -> int:
        """Unsolicited server message (break notification)."""
        hdr = smb2_notify_hdr(cmd, sess)
        return self.c.send(t, 1, nbss(hdr + body))

    def call(self, t: int, cmd: int, body: bytes, rsp_body: bytes, svc: int, status: int = ST_OK,
             charge: int = 1, loss=None) -> int:
        a, mid = self.req(t, cmd, body, charge)
        return self.rsp(a + svc, cmd, mid, rsp_body, status, charge, loss=loss)

    def think(self) -> int:
        return self.g.rng.randrange(30 * US, 400 * US)

    # -- conversation ---------------------------------------------------------------------------
    def setup(self, t: int) -> int:
        g, r = self.g, self.g.rng
        t = self.c.open(t) + r.randrange(5 * US, 40 * US)
        t = self.call(t, SMB2_NEGOTIATE, smb2_negotiate_req(r.randbytes(16)),
                      smb2_negotiate_rsp(g.fs_guid, g.abs(t), g.abs(0) - 86400 * 3 * SEC),
                      r.randrange(50 * US, 200 * US))
        t += self.think()
        a, mid = self.req(t, SMB2_SESSION_SETUP, smb2_session_setup_req(spnego_init(ntlm_negotiate())))
        self.sess = g.next_session_id()
        chal = spnego_resp(NEG_ACCEPT_INCOMPLETE, ntlm_challenge(r.randbytes(8), g.abs(a)), mech=True)
        t = self.rsp(a + r.randrange(100 * US, 400 * US), SMB2_SESSION_SETUP, mid,
                     smb2_session_setup_rsp(chal), status=ST_MORE)
        t += self.think()
        auth = spnego_resp(None, ntlm_authenticate(self.user, self.cli.name, g.abs(t), r),
                           mic=b"\x01\0\0\0" + r.randbytes(8) + b"\0\0\0\0")   # NTLMSSP verifier
        t = self.call(t, SMB2_SESSION_SETUP, smb2_session_setup_req(auth),
                      smb2_session_setup_rsp(spnego_resp(NEG_ACCEPT_COMPLETED, None)), r.randrange(1 * MS, 4 * MS))
        t += self.think()
        a, mid = self.req(t, SMB2_TREE_CONNECT,
                          smb2_tree_connect_req(f"\\\\fs01.{DOMAIN}\\{self.share}"))
        self.tree = r.randrange(1, 16)
        return self.rsp(a + r.randrange(60 * US, 300 * US), SMB2_TREE_CONNECT, mid,
                        smb2_tree_connect_rsp())

    def create_req(self, t: int, name: str, oplock: int = OPLOCK_BATCH, lease_state: int = 0,
                   write: bool = False, disposition: int = FILE_OPEN) -> tuple[int, int, bytes | None]:
        key = self.g.rng.randbytes(16) if oplock == OPLOCK_LEASE else None
        access = ACCESS_WRITE if write else ACCESS_READ
        body = smb2_create_req(name, oplock, access, disposition, FILE_NON_DIRECTORY_FILE,
                               lease=(key, lease_state) if key else None)
        a, mid = self.req(t, SMB2_CREATE, body)
        return a, mid, key

    def create_rsp(self, t: int, mid: int, name: str, oplock: int, key: bytes | None,
                   lease_state: int, size: int, async_id: int | None = None,
                   action: int = FILE_OPENED) -> tuple[int, SmbOpen]:
        fid = self.g.rng.randbytes(16)
        granted = oplock
        body = smb2_create_rsp(granted, action, fid, filetime(self.g.abs(t)) - 3600 * 10**7, size,
                               lease=(key, lease_state) if key else None)
        t = self.rsp(t, SMB2_CREATE, mid, body, async_id=async_id)
        return t, SmbOpen(name, fid, size, key, granted)

    def open(self, t: int, name: str, size: int, oplock: int = OPLOCK_BATCH,
             lease_state: int = LEASE_R | LEASE_H | LEASE_W, write: bool = False,
             disposition: int = FILE_OPEN) -> tuple[int, SmbOpen]:
        a, mid, key = self.create_req(t, name, oplock, lease_state if oplock == OPLOCK_LEASE else 0,
                                      write, disposition)
        svc = self.g.rng.randrange(80 * US, 600 * US)
        return self.create_rsp(a + svc, mid, name, oplock, key, lease_state, size)

    def read(self, t: int, f: SmbOpen, nbytes: int | None = None, chunk: int = 65536,
             loss=None) -> int:
        r = self.g.rng
        nbytes = f.size if nbytes is None else nbytes
        off = 0
        while off < nbytes:
            n = min(chunk, nbytes - off)
            charge = max(1, (n + MAX_CREDIT_CHARGE_UNIT - 1) // MAX_CREDIT_CHARGE_UNIT)
            a, mid = self.req(t, SMB2_READ, smb2_read_req(f.fid, n, off), charge)
            svc = r.randrange(40 * US, 250 * US) if r.random() < 0.9 else r.randrange(1 * MS, 8 * MS)
            t = self.rsp(a + svc, SMB2_READ, mid, smb2_read_rsp(self.g.payload(n)), charge=charge,
                         loss=loss if off + n >= nbytes else None)
            t += r.randrange(10 * US, 80 * US)
            off += n
        return t

    def write(self, t: int, f: SmbOpen, nbytes: int, chunk: int = 65536) -> int:
        r = self.g.rng
        off = 0
        while off < nbytes:
            n = min(chunk, nbytes - off)
            charge = max(1, (n + MAX_CREDIT_CHARGE_UNIT - 1) // MAX_CREDIT_CHARGE_UNIT)
            a, mid = self.req(t, SMB2_WRITE, smb2_write_req(f.fid, self.g.payload(n), off), charge)
            t = self.rsp(a + r.randrange(60 * US, 700 * US), SMB2_WRITE, mid, smb2_write_rsp(n),
                         charge=charge)
            t += r.randrange(10 * US, 80 * US)
            off += n
        f.size = max(f.size, nbytes)
        return t

    def close(self, t: int, f: SmbOpen, postquery: bool = False) -> int:
        fl = CLOSE_FLAG_POSTQUERY_ATTRIB if postquery else 0
        return self.call(t, SMB2_CLOSE, smb2_close_req(f.fid, fl),
                         smb2_close_rsp(filetime(self.g.abs(t)), f.size, fl),
                         self.g.rng.randrange(40 * US, 250 * US))

    def logoff(self, t: int) -> int:
        r = self.g.rng
        t = self.call(t, SMB2_TREE_DISCONNECT, smb2_empty4(), smb2_empty4(), r.randrange(30 * US, 100 * US))
        t += self.think()
        t = self.call(t, SMB2_LOGOFF, smb2_empty4(), smb2_empty4(), r.randrange(30 * US, 100 * US))
        return self.c.close(t + self.think(), 0)


class Ldap:
    """One LDAP client connection (TCP 389)."""

    def __init__(self, g: "Gen", cli: Host, srv: Host):
        self.g, self.cli, self.srv = g, cli, srv
        self.c = Tcp(g, cli, srv, LDAP_PORT)
        self.msgid = 0

    def _id(self) -> int:
        self.msgid += 1
        return self.msgid

    def call(self, t: int, req: bytes, rsp: bytes | list[bytes], svc: int, split=None) -> int:
        a = self.c.send(t, 0, req, split=split)
        if isinstance(rsp, list):
            rsp_split = self.segment_sizes([len(m) for m in rsp], self.c.mss)
            rsp = b"".join(rsp)
        else:
            rsp_split = None
        return self.c.send(a + svc, 1, rsp, split=rsp_split)

    @staticmethod
    def segment_sizes(msg_lens: list[int], mss: int, sliver: int = 8) -> list[int]:
        """MSS-sized segments, except that a segment never ends with the first few bytes of the next
        message (Wireshark's LDAP dissector reports a one-byte BER header tail as malformed)."""
        bounds, acc = [], 0
        for n in msg_lens:
            acc += n
            bounds.append(acc)
        total, sizes, s, j = acc, [], 0, 0
        while s < total:
            e = min(s + mss, total)
            if e < total:
                while j < len(bounds) and bounds[j] <= s:
                    j += 1
                k = j
                best = None
                while k < len(bounds) and bounds[k] < e:
                    best = bounds[k]
                    k += 1
                if best is not None and e - best < sliver:
                    e = best
            sizes.append(e - s)
            s = e
        return sizes

    def bind(self, t: int, dn: str) -> int:
        m = self._id()
        r = self.g.rng
        return self.call(t, ldap_msg(m, ldap_bind_req(dn, "S3cret-" + str(r.randrange(1000)))),
                         ldap_msg(m, ldap_result(OP_BIND_RESPONSE)), r.randrange(300 * US, 1500 * US))

    def search(self, t: int, base: str, filt: bytes, attrs: list[str], entries: list[bytes],
               split_req: bool = False, scope: int = SCOPE_SUBTREE) -> int:
        m = self._id()
        r = self.g.rng
        req = ldap_msg(m, ldap_search_req(base, scope, filt, attrs))
        rsp = [ldap_msg(m, e) for e in entries] + [ldap_msg(m, ldap_result(OP_SEARCH_RESULT_DONE))]
        split = None
        if split_req:             # header and body in two segments (never a few-byte sliver)
            k = r.randrange(min(8, len(req) // 2), max(9, len(req) - 8))
            split = [k, len(req) - k]
        return self.call(t, req, rsp, r.randrange(150 * US, 2 * MS) + 40 * US * len(entries),
                         split=split)

    def modify(self, t: int, dn: str, changes) -> int:
        m = self._id()
        return self.call(t, ldap_msg(m, ldap_modify_req(dn, changes)), ldap_msg(m, ldap_result(OP_MODIFY_RESPONSE)),
                         self.g.rng.randrange(1 * MS, 6 * MS))

    def unbind_close(self, t: int) -> int:
        self.c.flush(0, t)
        self.c.pend[0] = None
        self.c.seg(t, 0, ACK | PSH, ldap_msg(self._id(), LDAP_UNBIND))
        return self.c.close(t + self.g.rng.randrange(5 * US, 30 * US), 0, four_way=False)
