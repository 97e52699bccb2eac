"""NFSv4.0 delegation recall queue, recorded on nfs-ganesha 4.3 (FSAL GLUSTER) with our XDR client.

Pathology: one client holds a delegation on a file (RFC 7530 §10.4); other clients OPEN it for write,
which conflicts; the server recalls the delegation (CB_RECALL on the callback path, §18.2, §10.4.1) and
answers every conflicting OPEN NFS4ERR_DELAY (§13.1.1.3: "the server ... is recalling a delegation")
until the holder gives it back with DELEGRETURN (§16.8).  The writers queue behind the holder: each
resends its OPEN on the Linux client's nfs4_delay timer (100 ms doubled, capped at 15 s), so a holder
that returns late makes every writer wait, and retry, for as long.

    pathological: the holder (10.77.5.1) has a write delegation and dirty data it cached under it; on
                  CB_RECALL it answers at once (NFS4_OK) but first flushes its cached writes, slowly
                  (FLUSH_WRITES WRITEs paced FLUSH_PACE_S apart: a slow client), and sends DELEGRETURN
                  only after them, ~2.5 s after the recall;
    healthy twin: the same holder with nothing dirty returns the delegation within ~1 ms of the recall.

Setup: GlusterFS single-brick volume (features.leases on) behind ganesha.nfsd's FSAL GLUSTER, both in the
server namespace (nfs_server.start_gluster / start_ganesha(gluster=..., ipv4_only=True): see that module
for why Ganesha must bind IPv4 only); Ganesha probes the holder's callback path with CB_NULL after
SETCLIENTID_CONFIRM and grants delegations only on a confirmed open-owner, so the holder first opens and
closes another file (as a Linux client's first OPEN would).  The writers name no callback server (port 989
of their address, closed): they get no delegations themselves.  tcpdump on the server's veth sees both
directions: the fore channel to 2049 and the callback connection Ganesha opens to the holder's callback
port (an ephemeral port named in SETCLIENTID's r_addr).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from .core import ALL_DETECTORS, Capture, Lab, first_packet_time, join_all, log, start_threads
from .nfs_callback import CallbackEvent, CallbackServer
from .nfs_client import (DELAY_MAX_S, DELAY_MIN_S, NFS4_OK, NFS4ERR_DELAY, OPEN4_SHARE_ACCESS_BOTH, OPEN4_SHARE_ACCESS_READ, OPEN_DELEGATE_NONE,
                         OPEN_DELEGATE_READ, OPEN_DELEGATE_WRITE, Nfs4Client)
from .nfs_server import (PSEUDO_ROOT, gluster_ganesha_version, start_ganesha, start_gluster, stop_ganesha,
                         stop_gluster)

SERVER = "10.77.0.49"
HOLDER = "10.77.5.1"
SHARED = "shared/report.csv"
WARMUP = "shared/warmup.txt"
FILES = {SHARED: b"id,value\n" + b"0,0\n" * 1024, WARMUP: b"w\n"}
N_WRITERS = 6
WRITER_STAGGER_S = 0.02          # writers' first OPENs 20 ms apart
FLUSH_WRITES = 10                # pathological: cached writes flushed before DELEGRETURN
FLUSH_PACE_S = 0.25
FLUSH_CHUNK_BYTES = 4096
WRITE_BYTES = 512                # each writer's own WRITE once its OPEN succeeds
DELEG_NAMES = {OPEN_DELEGATE_NONE: "none", OPEN_DELEGATE_READ: "read", OPEN_DELEGATE_WRITE: "write"}


def writer_addr(i: int) -> str:
    return f"10.77.5.{i + 2}"


def _rel(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 6)


def run_recall(lab: Lab, out: Path, healthy: bool) -> dict:
    fname = f"nfs4-delegation-recall{'-healthy' if healthy else ''}.pcap"
    srv, lan = lab.netns("srv"), lab.netns("lan")
    lab.veth(srv, "s0", lan, "lan0")
    srv.ip("addr", "add", f"{SERVER}/16", "dev", "s0")
    lan.ip("addr", "add", f"{HOLDER}/16", "dev", "lan0")
    for i in range(N_WRITERS):
        lan.ip("addr", "add", f"{writer_addr(i)}/16", "dev", "lan0")
    gluster = start_gluster(lab, srv, SERVER, FILES)
    ganesha = None
    try:
        ganesha = start_ganesha(lab, srv, SERVER, {}, gluster=gluster, ipv4_only=True)
        return _drive(lab, out, fname, healthy, srv, lan)
    finally:
        if ganesha is not None:
            stop_ganesha(lab, ganesha)
        stop_gluster(lab, gluster)


def _drive(lab: Lab, out: Path, fname: str, healthy: bool, srv, lan) -> dict:
    cap = Capture(lab, srv, "s0", out / fname, nano=True)
    path = f"{PSEUDO_ROOT}/{SHARED}"
    holder_box: dict = {}
    returned = threading.Event()
    flush_log: list[dict] = []

    def on_recall(ev: CallbackEvent) -> None:
        """The holder's answer to CB_RECALL (the callback reply itself was already sent)."""
        c, f = holder_box["client"], holder_box["file"]
        if not healthy:
            for k in range(FLUSH_WRITES):          # the cached writes go out first, slowly
                time.sleep(FLUSH_PACE_S)
                t = time.time()
                c.write(f, k * FLUSH_CHUNK_BYTES, b"x" * FLUSH_CHUNK_BYTES)
                flush_log.append(dict(t_send=t, t_reply=time.time()))
        holder_box["t_return_send"] = time.time()
        holder_box["return_status"] = c.delegreturn(ev.recall_fh, ev.recall_stateid)
        holder_box["t_return_reply"] = time.time()
        returned.set()

    with lan:
        cb = CallbackServer(HOLDER, on_recall=on_recall)
        holder = Nfs4Client(SERVER, HOLDER, "holder")
        holder.connect()
        holder.setclientid(cb_r_addr=cb.r_addr)
        if not cb.saw_null.wait(10):
            raise RuntimeError("ganesha never probed the holder's callback path (no CB_NULL)")
        holder.start_renewer()
        warm = holder.open(f"{PSEUDO_ROOT}/{WARMUP}", OPEN4_SHARE_ACCESS_READ)   # confirms the open-owner
        holder.close_file(warm)
        f = holder.open(path, OPEN4_SHARE_ACCESS_BOTH)
        if f.delegation_type == OPEN_DELEGATE_NONE:
            raise RuntimeError("ganesha granted the holder no delegation (see ganesha.log in the work dir)")
        holder_box.update(client=holder, file=f)
        t_deleg = holder.log[-1]["t_send"] if f.delegation_type else None
        holder.read(f, 0, 4096)
        writers = []
        for i in range(N_WRITERS):
            writers.append(Nfs4Client.started(SERVER, writer_addr(i), f"writer{i}"))
    log(f"holder has a {DELEG_NAMES[f.delegation_type]} delegation on {path}; callback on {cb.r_addr}")
    time.sleep(1.0)
    attempts: list[list[dict]] = [[] for _ in range(N_WRITERS)]
    done: dict[int, float] = {}
    t_go = time.time() + 0.2

    def writer(i: int) -> None:
        w = writers[i]
        time.sleep(max(0.0, t_go + i * WRITER_STAGGER_S - time.time()))
        g = w.open_retrying_delay(path, OPEN4_SHARE_ACCESS_BOTH, attempts[i], give_up_s=40.0)
        w.write(g, 0, b"w" * WRITE_BYTES)
        w.close_file(g)
        done[i] = time.time()

    join_all(start_threads(writer, N_WRITERS), 60)
    returned.wait(30)
    time.sleep(0.5)
    holder.close_file(f)
    for c in [holder, *writers]:
        c.close()
    cb.close()
    stats = cap.stop()
    t0 = first_packet_time(out / fname)
    recalls = cb.recalls()
    if not recalls:
        raise RuntimeError("no CB_RECALL reached the holder")
    r = recalls[0]
    w_rows = []
    for i, a in enumerate(attempts):
        ok = [x for x in a if x["status"] == NFS4_OK]
        w_rows.append(dict(
            client=writer_addr(i), attempts=len(a), delay_replies=sum(x["status"] == NFS4ERR_DELAY for x in a),
            attempt_s=[_rel(x["t_send"], t0) for x in a],
            first_open_s=_rel(a[0]["t_send"], t0) if a else None,
            open_ok_s=_rel(ok[0]["t_reply"], t0) if ok else None,
            waited_ms=round((ok[0]["t_reply"] - a[0]["t_send"]) * 1000, 1) if ok and a else None))
    all_attempts = sorted((x for a in attempts for x in a), key=lambda x: x["t_send"])
    return_latency_ms = round((holder_box["t_return_send"] - r.t_call) * 1000, 3)
    measured = dict(
        capture_dropped=stats.get("dropped_by_kernel", -1),
        server=SERVER, holder=HOLDER, callback_r_addr=cb.r_addr, callback_port=cb.port,
        path=path, delegation_type=DELEG_NAMES[f.delegation_type],
        delegation_stateid=f.delegation_stateid.hex() if f.delegation_stateid else "",
        delegation_granted_s=_rel(t_deleg, t0),
        writers=N_WRITERS, writer_stagger_s=WRITER_STAGGER_S,
        first_conflicting_open_s=min(x["first_open_s"] for x in w_rows),
        recall_s=_rel(r.t_call, t0), recall_reply_s=_rel(r.t_reply, t0),
        recall_stateid=r.recall_stateid.hex(), recalls=len(recalls),
        delegreturn_s=_rel(holder_box["t_return_send"], t0),
        delegreturn_reply_s=_rel(holder_box["t_return_reply"], t0),
        delegreturn_status=holder_box["return_status"],
        recall_to_delegreturn_ms=return_latency_ms,
        flush_writes=len(flush_log), flush_pace_s=0.0 if healthy else FLUSH_PACE_S,
        delay_replies=sum(x["delay_replies"] for x in w_rows),
        writer_attempts=sum(x["attempts"] for x in w_rows),
        last_writer_open_ok_s=max((x["open_ok_s"] or 0.0) for x in w_rows),
        retry_min_s=DELAY_MIN_S, retry_max_s=DELAY_MAX_S,
        # per writer (same order), then every OPEN attempt in time order, from the clients' own logs
        writer_clients=[x["client"] for x in w_rows],
        writer_attempt_counts=[x["attempts"] for x in w_rows],
        writer_delay_replies=[x["delay_replies"] for x in w_rows],
        writer_first_open_s=[x["first_open_s"] for x in w_rows],
        writer_open_ok_s=[x["open_ok_s"] for x in w_rows],
        writer_waited_ms=[x["waited_ms"] for x in w_rows],
        attempt_clients=[a["client"] for a in all_attempts],
        attempt_s=[_rel(a["t_send"], t0) for a in all_attempts],
        attempt_reply_s=[_rel(a["t_reply"], t0) for a in all_attempts],
        attempt_status=[a["status"] for a in all_attempts],
        flush_write_s=[_rel(x["t_send"], t0) for x in flush_log],
        callback_procedures=[e.procedure + "".join(f" op{o}" for o in e.ops) for e in cb.events],
        callback_s=[_rel(e.t_call, t0) for e in cb.events])
    return dict(fname=fname, measured=measured)


def build_recall(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_recall(lab, out, healthy)
    m = r["measured"]
    made = (f"{gluster_ganesha_version()}. glusterd + one single-brick volume (features.leases on) and "
            f"ganesha.nfsd (FSAL GLUSTER, NFSv4 Delegations = true, EXPORT Delegations = RW, lease 15 s, IPv4 "
            f"sockets only via an LD_PRELOAD shim refusing AF_INET6) in the server namespace on {SERVER}; "
            f"our XDR NFSv4.0 client (samples/realkit/nfs_client.py, callback server nfs_callback.py): the holder "
            f"{HOLDER} names its callback port in SETCLIENTID (r_addr {m['callback_r_addr']}), opens the file "
            f"for read+write and gets a {m['delegation_type']} delegation; {N_WRITERS} writers "
            f"({writer_addr(0)}-{writer_addr(N_WRITERS - 1).rsplit('.', 1)[1]}, no callback path) OPEN it for "
            f"write {WRITER_STAGGER_S * 1000:.0f} ms apart and resend on NFS4ERR_DELAY on the Linux client's "
            f"nfs4_delay timer ({DELAY_MIN_S:g} s doubled, max {DELAY_MAX_S:g} s). "
            + ("The holder returns the delegation as soon as it is recalled." if healthy else
               f"On CB_RECALL the holder answers at once, then flushes {FLUSH_WRITES} cached 4 KiB WRITEs "
               f"{FLUSH_PACE_S} s apart before DELEGRETURN.")
            + " Captured with tcpdump on the server's veth (both directions, fore and callback channels, ns pcap).")
    entry = dict(file=r["fname"], scenario="nfs4-delegation-recall", healthy=healthy,
                 twin="nfs4-delegation-recall.pcap" if healthy else "nfs4-delegation-recall-healthy.pcap",
                 made_with=made, measured=m)
    queue = (f"{m['writers']} writers' OPENs from {m['first_conflicting_open_s']} s conflict with {HOLDER}'s "
             f"{m['delegation_type']} delegation on {m['path']}; Ganesha sends CB_RECALL to the holder's callback "
             f"port {m['callback_port']} at {m['recall_s']} s and answers NFS4ERR_DELAY to {m['delay_replies']} of the "
             f"writers' {m['writer_attempts']} OPENs")
    if healthy:
        delayed = sum(1 for n in m["writer_delay_replies"] if n)
        entry["what_happened"] = (
            f"{queue}; the holder sends DELEGRETURN {m['recall_to_delegreturn_ms']:.1f} ms after the recall, so "
            f"the {delayed} writer(s) told to wait got through on their first resend (after {DELAY_MIN_S:g} s) and "
            f"the others' OPENs succeeded at once; the last writer's OPEN succeeds at {m['last_writer_open_ok_s']} s. "
            "A recall answered at once: no queue worth reporting.")
        entry["silent"] = [*ALL_DETECTORS, "lock_polling", "delegation_recall"]
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"{queue}; the holder answers the recall at once but flushes {m['flush_writes']} WRITEs first and sends "
        f"DELEGRETURN only at {m['delegreturn_s']} s, {m['recall_to_delegreturn_ms'] / 1000:.2f} s after the "
        f"recall; meanwhile every writer resends its OPEN on the doubling timer and gets NFS4ERR_DELAY again; "
        f"the last writer's OPEN succeeds at {m['last_writer_open_ok_s']} s.")
    entry["silent"] = [*ALL_DETECTORS, "lock_polling"]
    entry["expect"] = [dict(
        detector="delegation_recall", kind="slow_return", min_severity="medium", start_s=m["recall_s"],
        tolerance_s=0.5, client=HOLDER, server=SERVER, resource=m["path"], count=1, count_tolerance=0,
        measured=dict(recall_to_delegreturn_ms=m["recall_to_delegreturn_ms"], writers=m["writers"],
                      delay_replies=m["delay_replies"]))]
    return entry
