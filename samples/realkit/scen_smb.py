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

import threading
import time
from pathlib import Path

from smbprotocol.open import CreateDisposition, FilePipePrinterAccessMask, ShareAccess

from .core import ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, join_all, start_threads
from .smb_lab import (OPLOCK_BATCH, READ, RW, RWH, SHARE, SHARE_ALL, SMB_USER, SMBD, UNC, Client,  # noqa: F401
                      setup_lab)

def share_resource(path: str) -> str:
    """The resource column of a finding about ``path`` on the share (its UNC path)."""
    return f"{UNC}\\{path}"


def made_text(extra: str) -> str:
    """The MANIFEST's "how it was made" text of an SMB capture, with the scenario's own ``extra`` sentence."""
    return (f"samba {deb_version('samba')} (smbd, standalone, share [{SHARE}], signing "
            f"mandatory, no encryption, oplocks + level2 oplocks + SMB2 leases, kernel oplocks "
            f"off) on {SMBD}:445; clients: smbprotocol (SMB 3.1.1, NTLM, signed) as Unix user "
            f"'{SMB_USER}', each on its own address 10.77.4.x; break notifications are read and "
            f"acknowledged by the scenario itself. {extra} Captured on smbd's veth (full "
            "packets, ns pcap).")


# --------------------------------------------------------------------------- single breaks
def run_breaks(lab: Lab, out: Path, healthy: bool, ack_delay: float = 2.0) -> dict:
    files = {"report.xlsx": b"quarterly report v1\n" * 4, "budget.docx": b"budget v1\n" * 6}
    srv, lan = setup_lab(lab, 2, files)
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
    made = made_text(f"Client A (10.77.4.1) opens report.xlsx with a batch oplock, later "
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
            server=SMBD, resource=share_resource(ev["path"]), count=1, count_tolerance=0,
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
    srv, lan = setup_lab(lab, waiters + 1, {path: b"ledger v1\n" * 8})
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
    made = made_text(f"Client A (10.77.4.1) holds a batch oplock on {r['path']}; {len(ws)} other "
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
        tolerance_s=0.3, client="", server=SMBD, resource=share_resource(r["path"]), count=1,
        count_tolerance=0,
        measured=dict(holder=r["holder"]["client"], waiters=len(ws),
                      waiter_clients=[w["client"] for w in ws],
                      break_to_ack_ms=round((br["t_ack"] - br["t_break"]) * 1000, 1),
                      max_wait_ms=max(waits), ack_s=round(br["t_ack"] - t0, 3)))]
    return entry


# --------------------------------------------------------------------------- TOCTOU
def run_toctou(lab: Lab, out: Path, healthy: bool, rounds: int = 3) -> dict:
    path = "config.json"
    srv, lan = setup_lab(lab, 2, {path: b'{"version": 1}\n'})
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
    made = made_text(f"{len(rows)} rounds, 1 s apart. {how}")
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
        tolerance_s=0.3, client="", server=SMBD, resource=share_resource(r["path"]), count=1,
        count_tolerance=0,
        measured=dict(checker="10.77.4.1", writer="10.77.4.2",
                      check_s=round(x["a_check"] - t0, 3),
                      other_write_s=round(x["b_write"] - t0, 3),
                      use_s=round(x["a_use"] - t0, 3), window_ms=round(
                          (x["a_use"] - x["a_check"]) * 1000, 1),
                      size_seen=x["a_size_seen"], final=x["final"]))
        for x in lost]
    return entry
