"""The SMB2 side of the SMB scenarios: Samba's smbd in a namespace, and an smbprotocol client
that answers oplock and lease breaks itself (MS-SMB2 2.2.23, 2.2.24), after a delay the scenario chooses.

Used by :mod:`samples.realkit.scen_smb`.
"""
from __future__ import annotations

import os
import pwd
import queue
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

import smbprotocol.transport
from smbprotocol.connection import Connection
from smbprotocol.create_contexts import (CreateContextName, LeaseState,
                                         SMB2CreateContextRequest, SMB2CreateRequestLeaseV2)
from smbprotocol.header import Commands, NtStatus
from smbprotocol.open import (CreateDisposition, CreateOptions, FileAttributes,
                              FilePipePrinterAccessMask, ImpersonationLevel, Open,
                              RequestedOplockLevel, ShareAccess, SMB2QueryInfoRequest,
                              SMB2QueryInfoResponse, SMB2SetInfoRequest)
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.session import Session
from smbprotocol.structure import BytesField, IntField, Structure
from smbprotocol.tree import TreeConnect

from .core import (ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, join_all, log,
                   start_threads, wait_for)

SMBD = "10.77.0.45"
SHARE = "data"
UNC = rf"\\{SMBD}\{SHARE}"
SMB_USER = "nobody"          # an existing Unix account: nothing is added to /etc/passwd
SMB_PW = "hsreal-Smb-pw1"
BREAK_MID = 0xFFFFFFFFFFFFFFFF

# --------------------------------------------------------------------------- source address
_tls = threading.local()


class _SocketShim:
    """smbprotocol.transport's view of the socket module: binds each client's own address."""

    def __getattr__(self, name):
        return getattr(socket, name)

    @staticmethod
    def create_connection(address, timeout=None, source_address=None):
        src = getattr(_tls, "src", None)
        return socket.create_connection(address, timeout, source_address=(src, 0) if src else None)


smbprotocol.transport.socket = _SocketShim()


# --------------------------------------------------------------------------- server
def start_smbd(lab: Lab, ns, files: dict[str, bytes]) -> subprocess.Popen:
    d = lab.workdir / "samba"
    share = d / "share"
    for sub in ("private", "lock", "state", "cache", "pid", "ncalrpc", "bind-dns", "log"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    share.mkdir(parents=True, exist_ok=True)
    nobody = pwd.getpwnam(SMB_USER)
    for name, data in files.items():
        (share / name).write_bytes(data)
        os.chown(share / name, nobody.pw_uid, nobody.pw_gid)
    os.chown(share, nobody.pw_uid, nobody.pw_gid)
    lab.workdir.chmod(0o711)
    d.chmod(0o711)
    conf = d / "smb.conf"
    conf.write_text(f"""[global]
    workgroup = CORP
    netbios name = FILES
    server role = standalone server
    security = user
    map to guest = never
    passdb backend = tdbsam:{d}/private/passdb.tdb
    private dir = {d}/private
    lock directory = {d}/lock
    state directory = {d}/state
    cache directory = {d}/cache
    pid directory = {d}/pid
    ncalrpc dir = {d}/ncalrpc
    binddns dir = {d}/bind-dns
    log file = {d}/log/log.%m
    log level = 1
    interfaces = {SMBD}
    bind interfaces only = yes
    smb ports = 445
    disable netbios = yes
    server min protocol = SMB2_10
    server signing = mandatory
    server smb encrypt = off
    load printers = no
    printing = bsd
    printcap name = /dev/null
    disable spoolss = yes
    kernel oplocks = no
    kernel share modes = no
    posix locking = no
    oplocks = yes
    level2 oplocks = yes
    smb2 leases = yes
    durable handles = no

[{SHARE}]
    path = {share}
    read only = no
    valid users = {SMB_USER}
    create mask = 0644
""")
    env = {"SMB_CONF_PATH": str(conf)}
    p = subprocess.run(["smbpasswd", "-c", str(conf), "-L", "-s", "-a", SMB_USER],
                       input=f"{SMB_PW}\n{SMB_PW}\n", capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"smbpasswd: {p.stdout} {p.stderr}")
    # smbd makes its own session and process group (setsid, which fails if we already did,
    # so new_session=False); never --no-process-group: on exit smbd signals its whole group.
    proc = lab.spawn(ns, "smbd", ["smbd", "--foreground", "--debug-stdout",
                                  f"--configfile={conf}", "--debuglevel=1"], env=env,
                     new_session=False)

    def listening():
        with ns:
            s = socket.socket()
        s.settimeout(0.5)
        try:
            s.connect((SMBD, 445))
            return True
        except OSError:
            return False
        finally:
            s.close()
    wait_for(listening, 20, "smbd to listen")
    return proc


def setup_lab(lab: Lab, n_clients: int, files: dict[str, bytes]):
    srv = lab.netns("smb")
    lan = lab.netns("lan")
    lab.veth(srv, "s0", lan, "lan0")
    srv.ip("addr", "add", f"{SMBD}/16", "dev", "s0")
    for i in range(n_clients):
        lan.ip("addr", "add", f"10.77.4.{i + 1}/16", "dev", "lan0")
    start_smbd(lab, srv, files)
    return srv, lan


# --------------------------------------------------------------------------- break handling
class OplockBreakAck(Structure):
    """MS-SMB2 2.2.24.1 SMB2 OPLOCK_BREAK Acknowledgment."""
    COMMAND = Commands.SMB2_OPLOCK_BREAK

    def __init__(self):
        self.fields = OrderedDict([
            ("structure_size", IntField(size=2, default=24)),
            ("oplock_level", IntField(size=1)),
            ("reserved", IntField(size=1)),
            ("reserved2", IntField(size=4)),
            ("file_id", BytesField(size=16)),
        ])
        super().__init__()


class LeaseBreakAck(Structure):
    """MS-SMB2 2.2.24.2 SMB2 Lease Break Acknowledgment."""
    COMMAND = Commands.SMB2_OPLOCK_BREAK

    def __init__(self):
        self.fields = OrderedDict([
            ("structure_size", IntField(size=2, default=36)),
            ("reserved", IntField(size=2)),
            ("flags", IntField(size=4)),
            ("lease_key", BytesField(size=16)),
            ("lease_state", IntField(size=4)),
            ("lease_duration", IntField(size=8)),
        ])
        super().__init__()


class _Field:
    def __init__(self, v):
        self.v = v

    def get_value(self):
        return self.v


class _BreakSink:
    """Stands in for an outstanding request: the receive thread stores the unsolicited break
    notification in it, and we hand the header to the client's break queue."""

    def __init__(self, q: queue.Queue, session_id: int):
        self.q = q
        self.session_id = session_id
        self.response_event_lock = threading.Lock()
        self.message = {"reserved": _Field(0), "command": _Field(Commands.SMB2_OPLOCK_BREAK)}
        self.response = None
        sink = self

        class _Ev:
            def set(self_inner):
                if sink.response is not None:
                    sink.q.put((time.time(), sink.response))

        self.response_event = _Ev()


class _Requests(dict):
    def __init__(self, q: queue.Queue):
        super().__init__()
        self.q = q
        self.session_id = 0

    def __getitem__(self, key):
        if key == BREAK_MID:
            return _BreakSink(self.q, self.session_id)
        return super().__getitem__(key)


class Client:
    """One SMB client host: a signed SMB 3.1.1 session on its own source address, with a
    thread that acknowledges breaks after `ack_delay` seconds."""

    def __init__(self, lan, idx: int, name: str, ack_delay: float = 0.0):
        self.name, self.src, self.ack_delay = name, f"10.77.4.{idx}", ack_delay
        self.breaks: list[dict] = []
        self.levels: dict[bytes, int] = {}
        self.q: queue.Queue = queue.Queue()
        _tls.src = self.src
        with lan:
            self.conn = Connection(uuid.uuid4(), SMBD, 445, require_signing=True)
            self.conn.outstanding_requests = _Requests(self.q)
            self.conn.connect(timeout=10)
        _tls.src = None
        self.session = Session(self.conn, SMB_USER, SMB_PW, require_encryption=False)
        self.session.connect()
        self.conn.outstanding_requests.session_id = self.session.session_id
        self.tree = TreeConnect(self.session, UNC)
        self.tree.connect()
        self._stop = False
        self.t = threading.Thread(target=self._break_loop, daemon=True)
        self.t.start()

    def _break_loop(self):
        while not self._stop:
            try:
                t_recv, header = self.q.get(timeout=0.2)
            except queue.Empty:
                continue
            body = header["data"].get_value()
            size = struct.unpack_from("<H", body, 0)[0]
            rec = dict(client=self.src, t_break=t_recv)
            if size == 24:       # oplock break notification: level, reserved, reserved2, file id
                level = body[2]
                file_id = body[8:24]
                cur = self.levels.get(file_id, RequestedOplockLevel.SMB2_OPLOCK_LEVEL_BATCH)
                self.levels[file_id] = level
                rec.update(kind="oplock", from_level=cur, new_level=level)
                if cur == RequestedOplockLevel.SMB2_OPLOCK_LEVEL_II:
                    # level II -> none: the client does not acknowledge (MS-SMB2 3.2.5.19.1)
                    rec["ack_required"] = 0
                    self.breaks.append(rec)
                    continue
                rec["ack_required"] = 1
                # a client holding a write cache (batch/exclusive) must flush before it acks:
                # that is where the delay goes
                delay = self.ack_delay
                ack = OplockBreakAck()
                ack["oplock_level"] = level
                ack["file_id"] = file_id
            else:                # lease break notification (44 bytes)
                new_epoch, flags = struct.unpack_from("<HI", body, 2)
                lease_key = body[8:24]
                cur, new = struct.unpack_from("<II", body, 24)
                rec.update(kind="lease", from_state=cur, new_state=new, ack_required=flags & 1)
                ack = LeaseBreakAck()
                ack["lease_key"] = lease_key
                ack["lease_state"] = new
                if not flags & 1:
                    self.breaks.append(rec)
                    continue
                delay = self.ack_delay if cur & LeaseState.SMB2_LEASE_WRITE_CACHING else 0.0
            time.sleep(delay)
            rec["t_ack"] = time.time()
            try:
                req = self.conn.send(ack, sid=self.session.session_id,
                                     tid=self.tree.tree_connect_id)
                resp = self.conn.receive(req, wait=True)
                rec["ack_status"] = resp["status"].get_value()
            except SMBResponseException as e:
                rec["ack_status"] = e.status
            rec["t_ack_done"] = time.time()
            self.breaks.append(rec)
            log(f"{self.name} acknowledged {rec['kind']} break after "
                f"{rec['t_ack'] - t_recv:.3f} s")

    # -- file operations ----------------------------------------------------------------
    def open(self, path: str, access: int, disposition: int, share: int,
             oplock: int = RequestedOplockLevel.SMB2_OPLOCK_LEVEL_NONE,
             lease_state: int | None = None) -> tuple[Open, dict]:
        f = Open(self.tree, path)
        ctx = None
        if lease_state is not None:
            lease = SMB2CreateRequestLeaseV2()
            lease["lease_key"] = uuid.uuid4().bytes
            lease["lease_state"] = lease_state
            lease["parent_lease_key"] = b"\x00" * 16
            lease["epoch"] = b"\x00\x00"
            c = SMB2CreateContextRequest()
            c["buffer_name"] = CreateContextName.SMB2_CREATE_REQUEST_LEASE_V2
            c["buffer_data"] = lease
            ctx = [c]
            oplock = RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE
        rec = dict(client=self.src, path=path, t_send=time.time())
        try:
            f.create(ImpersonationLevel.Impersonation, access, FileAttributes.FILE_ATTRIBUTE_NORMAL,
                     share, disposition, CreateOptions.FILE_NON_DIRECTORY_FILE,
                     create_contexts=ctx, oplock_level=oplock)
            rec["status"] = 0
            rec["oplock_granted"] = f.oplock_level
            self.levels[f.file_id] = f.oplock_level
        except SMBResponseException as e:
            rec["status"] = e.status
            f = None
        rec["t_done"] = time.time()
        return f, rec

    def query_size(self, f: Open) -> int:
        q = SMB2QueryInfoRequest()
        q["info_type"] = 1
        q["file_info_class"] = 5          # FileStandardInformation
        q["output_buffer_length"] = 24
        q["file_id"] = f.file_id
        req = self.conn.send(q, sid=self.session.session_id, tid=self.tree.tree_connect_id)
        resp = self.conn.receive(req)
        r = SMB2QueryInfoResponse()
        r.unpack(resp["data"].get_value())
        return struct.unpack_from("<q", r["buffer"].get_value(), 8)[0]   # EndOfFile

    def rename(self, f: Open, new_name: str, replace: bool = True) -> int:
        name = new_name.encode("utf-16-le")
        buf = struct.pack("<B7xQI", 1 if replace else 0, 0, len(name)) + name
        s = SMB2SetInfoRequest()
        s["info_type"] = 1
        s["file_info_class"] = 10         # FileRenameInformation
        s["file_id"] = f.file_id
        s["buffer"] = buf
        req = self.conn.send(s, sid=self.session.session_id, tid=self.tree.tree_connect_id)
        try:
            self.conn.receive(req)
            return 0
        except SMBResponseException as e:
            return e.status

    def close(self):
        self._stop = True
        self.t.join(2)
        try:
            self.tree.disconnect()
            self.session.disconnect()
        finally:
            self.conn.disconnect()


RW = (FilePipePrinterAccessMask.FILE_READ_DATA | FilePipePrinterAccessMask.FILE_WRITE_DATA
      | FilePipePrinterAccessMask.FILE_READ_ATTRIBUTES | FilePipePrinterAccessMask.SYNCHRONIZE)
READ = (FilePipePrinterAccessMask.FILE_READ_DATA | FilePipePrinterAccessMask.FILE_READ_ATTRIBUTES
        | FilePipePrinterAccessMask.SYNCHRONIZE)
SHARE_ALL = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE


OPLOCK_BATCH = RequestedOplockLevel.SMB2_OPLOCK_LEVEL_BATCH
RWH = (LeaseState.SMB2_LEASE_READ_CACHING | LeaseState.SMB2_LEASE_WRITE_CACHING
       | LeaseState.SMB2_LEASE_HANDLE_CACHING)


