"""SMB2 scenarios on Samba's smbd: oplock/lease breaks acknowledged late, a queue of opens
behind one slow break, and a check-then-use (TOCTOU) race on one path.

Topology: [smb] s0 10.77.0.45 (smbd, share "data") ====veth==== lan0 [lan] clients 10.77.4.x

Clients are smbprotocol connections (SMB 3.1.1, signed, not encrypted so the capture stays
readable), one per client address.  smbprotocol does not handle oplock/lease breaks: this
module catches the server's break notification (MessageId 0xFFFFFFFFFFFFFFFF) itself and
sends the acknowledgment (MS-SMB2 2.2.24.1 oplock break ack / 2.2.24.2 lease break ack),
after a delay chosen by the scenario.
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


def _setup(lab: Lab, n_clients: int, files: dict[str, bytes]):
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


def _res(path: str) -> str:
    return f"{UNC}\\{path}"


def _made(extra: str) -> str:
    return (f"samba {deb_version('samba')} (smbd, standalone, share [{SHARE}], signing "
            f"mandatory, no encryption, oplocks + level2 oplocks + SMB2 leases, kernel oplocks "
            f"off) on {SMBD}:445; clients: smbprotocol (SMB 3.1.1, NTLM, signed) as Unix user "
            f"'{SMB_USER}', each on its own address 10.77.4.x; break notifications are read and "
            f"acknowledged by the scenario itself. {extra} Captured on smbd's veth (full "
            "packets, ns pcap).")


# --------------------------------------------------------------------------- single breaks
def run_breaks(lab: Lab, out: Path, healthy: bool, ack_delay: float = 2.0) -> dict:
    files = {"report.xlsx": b"quarterly report v1\n" * 4, "budget.docx": b"budget v1\n" * 6}
    srv, lan = _setup(lab, 2, files)
    fname = "smb2-oplock-lease-break-healthy.pcap" if healthy else "smb2-oplock-lease-break.pcap"
    cap = Capture(lab, srv, "s0", out / fname, nano=True)
    delay = 0.0 if healthy else ack_delay
    time.sleep(0.2)
    a = Client(lan, 1, "A", ack_delay=delay)
    b = Client(lan, 2, "B")
    events = []
    for path, kind in (("report.xlsx", "oplock"), ("budget.docx", "lease")):
        if kind == "oplock":
            fa, ra = a.open(path, RW, CreateDisposition.FILE_OPEN, SHARE_ALL, oplock=OPLOCK_BATCH)
        else:
            fa, ra = a.open(path, RW, CreateDisposition.FILE_OPEN, SHARE_ALL, lease_state=RWH)
        fa.read(0, 64)
        time.sleep(0.5)
        fb, rb = b.open(path, RW, CreateDisposition.FILE_OPEN, SHARE_ALL)
        fb.read(0, 64)
        fb.write(b"edited by B\n", 0)
        fb.close()
        time.sleep(0.3)
        fa.close()
        events.append(dict(path=path, kind=kind, holder=ra, waiter=rb))
        time.sleep(1.0)
    time.sleep(0.2)
    breaks = list(a.breaks)
    a.close()
    b.close()
    time.sleep(0.2)
    stats = cap.stop()
    return dict(events=events, breaks=breaks, t_first=first_packet_time(out / fname),
                stats=stats, fname=fname, ack_delay=delay)


def build_breaks(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_breaks(lab, out, healthy)
    t0 = r["t_first"]
    made = _made(f"Client A (10.77.4.1) opens report.xlsx with a batch oplock, later "
                 f"budget.docx with an RWH lease (v2); 0.5 s later client B (10.77.4.2) opens "
                 f"the same file for read/write; A acknowledges the break after "
                 f"{r['ack_delay']:.1f} s.")
    measured = dict(breaks=len(r["breaks"]),
                    breaks_acknowledged=sum(1 for b in r["breaks"] if b.get("t_ack")),
                    ack_delay_s=r["ack_delay"],
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"], scenario="smb2-oplock-lease-break", healthy=healthy,
                 twin=("smb2-oplock-lease-break.pcap" if healthy
                       else "smb2-oplock-lease-break-healthy.pcap"),
                 made_with=made, measured=measured)
    expects = []
    for ev in r["events"]:
        w = ev["waiter"]
        br = min((b for b in r["breaks"] if b["t_break"] >= w["t_send"] and b.get("t_ack")),
                 key=lambda b: b["t_break"])
        wait_ms = round((w["t_done"] - w["t_send"]) * 1000, 1)
        measured[f"{ev['kind']}_waiter_create_ms"] = wait_ms
        expects.append(dict(
            detector="smb_break_queue", min_severity="medium",
            start_s=round(br["t_break"] - t0, 3), tolerance_s=0.3, client=w["client"],
            server=SMBD, resource=_res(ev["path"]), count=1, count_tolerance=0,
            measured=dict(kind=ev["kind"], holder=ev["holder"]["client"], waiters=1,
                          break_to_ack_ms=round((br["t_ack"] - br["t_break"]) * 1000, 1),
                          waiter_create_ms=wait_ms,
                          waiter_create_sent_s=round(w["t_send"] - t0, 3),
                          waiter_create_done_s=round(w["t_done"] - t0, 3))))
    if healthy:
        entry["what_happened"] = (
            "The same opens and breaks (an oplock break to level II and a lease break "
            "RWH -> RH), but A acknowledges each at once: B's CREATE completes within "
            f"{max(measured.get('oplock_waiter_create_ms', 0), measured.get('lease_waiter_create_ms', 0)):.0f} ms. "
            "No break stall.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
    else:
        entry["what_happened"] = (
            "B's CREATE on report.xlsx makes smbd break A's batch oplock (to level II) and "
            "answer B with an interim STATUS_PENDING; A acknowledges only after "
            f"{r['ack_delay']:.1f} s, so B's CREATE takes {measured['oplock_waiter_create_ms']:.0f} ms. "
            "The same again on budget.docx with A's RWH lease (lease break to RH, ack "
            f"required): B waits {measured['lease_waiter_create_ms']:.0f} ms.")
        entry["silent"] = ["herd", "retry_storm", "tcp_stall", "toctou", "conn_churn"]
        entry["expect"] = expects
    return entry


# --------------------------------------------------------------------------- queue
def run_queue(lab: Lab, out: Path, healthy: bool, waiters: int = 4, ack_delay: float = 3.0,
              spacing: float = 0.3) -> dict:
    path = "shared.db"
    srv, lan = _setup(lab, waiters + 1, {path: b"ledger v1\n" * 8})
    fname = "smb2-break-queue-healthy.pcap" if healthy else "smb2-break-queue.pcap"
    cap = Capture(lab, srv, "s0", out / fname, nano=True)
    delay = 0.0 if healthy else ack_delay
    time.sleep(0.2)
    a = Client(lan, 1, "A", ack_delay=delay)
    others = [Client(lan, i + 2, f"W{i + 1}") for i in range(waiters)]
    fa, ra = a.open(path, RW, CreateDisposition.FILE_OPEN, SHARE_ALL, oplock=OPLOCK_BATCH)
    fa.read(0, 64)
    time.sleep(0.5)
    recs: list[dict] = [None] * waiters  # type: ignore[list-item]
    handles = [None] * waiters
    t_go = time.time()

    def waiter(i: int):
        time.sleep(max(0.0, t_go + i * spacing - time.time()))
        handles[i], recs[i] = others[i].open(path, READ, CreateDisposition.FILE_OPEN, SHARE_ALL)

    join_all(start_threads(waiter, waiters), 60)
    for i, h in enumerate(handles):
        if h is not None:
            h.read(0, 64)
            h.close()
    time.sleep(0.3)
    fa.close()
    time.sleep(0.3)
    breaks = list(a.breaks)
    for c in [a] + others:
        c.close()
    time.sleep(0.2)
    stats = cap.stop()
    return dict(path=path, holder=ra, waiters=recs, breaks=breaks, ack_delay=delay,
                t_first=first_packet_time(out / fname), stats=stats, fname=fname,
                spacing=spacing)


def build_queue(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_queue(lab, out, healthy)
    t0 = r["t_first"]
    ws = r["waiters"]
    waits = [round((w["t_done"] - w["t_send"]) * 1000, 1) for w in ws]
    made = _made(f"Client A (10.77.4.1) holds a batch oplock on {r['path']}; {len(ws)} other "
                 f"clients (10.77.4.2-{len(ws) + 1}) open it for reading {r['spacing']:.1f} s "
                 f"apart; A acknowledges the break after {r['ack_delay']:.1f} s.")
    measured = dict(waiters=len(ws), breaks=len(r["breaks"]), ack_delay_s=r["ack_delay"],
                    waiter_create_ms=waits,
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"], scenario="smb2-break-queue", healthy=healthy,
                 twin="smb2-break-queue.pcap" if healthy else "smb2-break-queue-healthy.pcap",
                 made_with=made, measured=measured)
    if healthy:
        entry["what_happened"] = (
            f"The same {len(ws)} opens; A acknowledges the break at once, so every CREATE "
            f"completes within {max(waits):.0f} ms. No queue.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
        return entry
    br = r["breaks"][0]
    entry["what_happened"] = (
        f"The first opener makes smbd break A's batch oplock; A sits on the break for "
        f"{br['t_ack'] - br['t_break']:.1f} s. All {len(ws)} CREATEs get STATUS_PENDING and "
        f"queue behind that one break; they complete together right after A's acknowledgment "
        f"(waits {', '.join(f'{w:.0f}' for w in waits)} ms).")
    entry["silent"] = ["herd", "retry_storm", "tcp_stall", "toctou", "conn_churn"]
    entry["expect"] = [dict(
        detector="smb_break_queue", min_severity="medium", start_s=round(br["t_break"] - t0, 3),
        tolerance_s=0.3, client="", server=SMBD, resource=_res(r["path"]), count=1,
        count_tolerance=0,
        measured=dict(holder=r["holder"]["client"], waiters=len(ws),
                      waiter_clients=[w["client"] for w in ws],
                      break_to_ack_ms=round((br["t_ack"] - br["t_break"]) * 1000, 1),
                      max_wait_ms=max(waits), ack_s=round(br["t_ack"] - t0, 3)))]
    return entry


# --------------------------------------------------------------------------- TOCTOU
def run_toctou(lab: Lab, out: Path, healthy: bool, rounds: int = 3) -> dict:
    path = "config.json"
    srv, lan = _setup(lab, 2, {path: b'{"version": 1}\n'})
    fname = "smb2-toctou-healthy.pcap" if healthy else "smb2-toctou.pcap"
    cap = Capture(lab, srv, "s0", out / fname, nano=True)
    time.sleep(0.2)
    a = Client(lan, 1, "A")
    b = Client(lan, 2, "B")
    log_rows = []
    attr = FilePipePrinterAccessMask.FILE_READ_ATTRIBUTES | FilePipePrinterAccessMask.SYNCHRONIZE
    for k in range(rounds):
        row = dict(round=k + 1)
        b_done = threading.Event()

        def b_update():
            # B replaces the file in A's window: overwrite with new content
            time.sleep(0.15)
            for attempt in range(50):
                f, rec = b.open(path, RW, CreateDisposition.FILE_OVERWRITE, SHARE_ALL
                                if not healthy else ShareAccess.FILE_SHARE_READ)
                row.setdefault("b_attempts", []).append((rec["t_send"], rec["status"]))
                if f is not None:
                    f.write(f'{{"version": {k + 2}, "by": "B"}}\n'.encode(), 0)
                    f.close()
                    row["b_write"] = time.time()
                    break
                time.sleep(0.1)       # sharing violation: try again shortly
            b_done.set()

        tb = threading.Thread(target=b_update, daemon=True)
        if not healthy:
            # check: open, query the size, close ...
            f, rec = a.open(path, attr | FilePipePrinterAccessMask.FILE_READ_DATA,
                            CreateDisposition.FILE_OPEN, SHARE_ALL)
            row["a_check"] = rec["t_send"]
            row["a_size_seen"] = a.query_size(f)
            f.close()
            tb.start()
            time.sleep(0.4)           # ... decide ...
            # use: write a temp file and rename it over the checked path (replace)
            tmp, rec2 = a.open(path + ".tmp", RW | FilePipePrinterAccessMask.DELETE,
                               CreateDisposition.FILE_OVERWRITE_IF, SHARE_ALL)
            tmp.write(f'{{"version": {k + 2}, "by": "A"}}\n'.encode(), 0)
            row["a_use"] = rec2["t_send"]
            row["a_rename_status"] = a.rename(tmp, path, replace=True)
            tmp.close()
            row["a_done"] = time.time()
        else:
            # check and use under one handle that shares only reading: B cannot change it
            f, rec = a.open(path, RW, CreateDisposition.FILE_OPEN, ShareAccess.FILE_SHARE_READ)
            row["a_check"] = rec["t_send"]
            row["a_size_seen"] = a.query_size(f)
            tb.start()
            time.sleep(0.4)
            row["a_use"] = time.time()
            f.write(f'{{"version": {k + 2}, "by": "A"}}\n'.encode(), 0)
            f.close()
            row["a_done"] = time.time()
        tb.join(30)
        # who won? read the file back
        f, _ = a.open(path, READ, CreateDisposition.FILE_OPEN, SHARE_ALL)
        row["final"] = f.read(0, 64).decode().strip()
        f.close()
        log_rows.append(row)
        time.sleep(1.0)
    a.close()
    b.close()
    time.sleep(0.2)
    stats = cap.stop()
    return dict(rows=log_rows, path=path, t_first=first_packet_time(out / fname), stats=stats,
                fname=fname)


def build_toctou(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_toctou(lab, out, healthy)
    t0, rows = r["t_first"], r["rows"]
    lost = [x for x in rows if '"by": "A"' in x["final"] and x.get("b_write", 0) < x["a_done"]
            and x.get("b_write", 0) > x["a_check"]]
    violations = sum(1 for x in rows for _, st in x.get("b_attempts", []) if st != 0)
    if healthy:
        how = ("A opens config.json once with share access READ only, queries its size and "
               "overwrites it through the same handle (check and use under one open); B's "
               "overwrite in the middle fails with STATUS_SHARING_VIOLATION and is retried "
               "every 100 ms until A closes.")
    else:
        how = ("A checks config.json (CREATE, QUERY_INFO FileStandardInformation, CLOSE), "
               "waits 0.4 s, then uses it: writes config.json.tmp and renames it over "
               "config.json (SET_INFO FileRenameInformation, ReplaceIfExists); 0.15 s into A's "
               "window B overwrites config.json (CREATE FILE_OVERWRITE + WRITE).")
    made = _made(f"{len(rows)} rounds, 1 s apart. {how}")
    measured = dict(rounds=len(rows), lost_updates=len(lost), sharing_violations=violations,
                    final_contents=[x["final"] for x in rows],
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"], scenario="smb2-toctou", healthy=healthy,
                 twin="smb2-toctou.pcap" if healthy else "smb2-toctou-healthy.pcap",
                 made_with=made, measured=measured)
    if healthy:
        entry["what_happened"] = (
            f"In every round B's overwrite waits for A's handle ({violations} sharing "
            "violations in all) and lands after A's write: nothing is lost, B's version is "
            "the last one each time.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"In each of the {len(rows)} rounds B's overwrite lands between A's check and A's "
        f"rename, and A's rename (based on the stale check) replaces it: {len(lost)} lost "
        "updates on the same path.")
    entry["silent"] = ["herd", "retry_storm", "smb_break_queue", "tcp_stall", "conn_churn"]
    entry["expect"] = [dict(
        detector="toctou", min_severity="medium", start_s=round(x["a_check"] - t0, 3),
        tolerance_s=0.3, client="", server=SMBD, resource=_res(r["path"]), count=1,
        count_tolerance=0,
        measured=dict(checker="10.77.4.1", writer="10.77.4.2",
                      check_s=round(x["a_check"] - t0, 3),
                      other_write_s=round(x["b_write"] - t0, 3),
                      use_s=round(x["a_use"] - t0, 3), window_ms=round(
                          (x["a_use"] - x["a_check"]) * 1000, 1),
                      size_seen=x["a_size_seen"], final=x["final"]))
        for x in lost]
    return entry
