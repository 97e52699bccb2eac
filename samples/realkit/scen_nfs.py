"""NFS scenarios recorded on nfs-ganesha (VFS) with our own ONC-RPC client: an open herd on a
checkpoint directory, lock-polling contention (fixed and growing interval), NFSv3/UDP
retransmissions after a server stall; each with its healthy twin (the growing-interval one has none).

samples/make_real.py records them through ``build_herd``, ``build_lock_polling``,
``build_lock_polling_growing`` and ``build_udp_retrans`` (build(lab, out, healthy) -> manifest
entry, realkit/scen_cascade.py's format):

    sudo .venv/bin/python samples/make_real.py --out DIR --only nfs4-open-herd,nfs4-lock-polling,...

The older CLI writes the captures of tests/data/nfs/recorded and their GROUNDTRUTH.toml (smaller
variants: 16 herd clients, 4 lock clients); ``groundtruth_record`` turns a make_real entry into one
of its records:

    sudo .venv/bin/python -m samples.realkit.scen_nfs [--out tests/data/nfs/recorded] [SCENARIO ...]

Topology: [srv] s0 10.77.0.49 (ganesha.nfsd) ====veth==== lan0 [lan] clients 10.77.5.x, one
address (one TCP connection, one NFSv4.0 client id) per client.  tcpdump on s0, full packets.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from .core import (ALL_DETECTORS, Capture, Lab, cleanup_stale, deb_version, first_packet_time, join_all, log,
                   start_threads)
from .nfs_client import (LOCK_MAX_TIMEOUT_S, LOCK_MIN_TIMEOUT_S, NFS4_OK, OPEN4_SHARE_ACCESS_READ, Nfs3UdpClient,
                         Nfs4Client,
                         UDP_TIMEO_S)
from .nfs_server import PSEUDO_ROOT, ganesha_version, start_ganesha, stop_ganesha
from .tomlw import dump_manifest

SERVER = "10.77.0.49"
CKPT_DIR = "ckpt/step1000"
CKPT_FILE = f"{CKPT_DIR}/model.pt"
FILES = {CKPT_FILE: b"checkpoint-bytes\n" * 256, "locks/job.lock": b"", "data/shard0": b"d" * 8192}
DEFAULT_OUT = Path("tests/data/nfs/recorded")
READ_SIZE_BYTES = 1024     # NFSv3 READ size of the UDP scenario (keeps the capture < 1 MB)


def client_addr(i: int) -> str:
    return f"10.77.5.{i + 1}"


def setup(lab: Lab, n_clients: int, nfs3_udp: bool = False, files: dict[str, bytes] | None = None):
    srv = lab.netns("srv")
    lan = lab.netns("lan")
    lab.veth(srv, "s0", lan, "lan0")
    srv.ip("addr", "add", f"{SERVER}/16", "dev", "s0")
    for i in range(n_clients):
        lan.ip("addr", "add", f"{client_addr(i)}/16", "dev", "lan0")
    g = start_ganesha(lab, srv, SERVER, FILES if files is None else files, nfs3_udp=nfs3_udp)
    return srv, lan, g


def tshark_counts(path: Path) -> dict:
    """The tshark figures GROUNDTRUTH records: NFS packets, calls, replies, LOCK denials, RPC
    duplicates (tshark's rpc.call.dup / rpc.reply.dup: same xid), per-opcode packet counts,
    malformed packets (must be 0)."""
    def count(flt: str) -> int:
        r = subprocess.run(["tshark", "-r", str(path), "-Y", flt], capture_output=True, text=True)
        return len([ln for ln in r.stdout.splitlines() if ln.strip()])
    def per_value(field: str, flt: str) -> str:
        out = subprocess.run(["tshark", "-r", str(path), "-Y", flt, "-T", "fields", "-e", field],
                             capture_output=True, text=True).stdout
        n: dict[str, int] = {}
        for line in out.split():
            for o in line.split(","):
                n[o] = n.get(o, 0) + 1
        return " ".join(f"{k}:{v}" for k, v in sorted(n.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0))
    return dict(nfs_packets=count("nfs"), malformed=count("_ws.malformed"),
                nfs_calls=count("nfs && rpc.msgtyp == 0"), nfs_replies=count("nfs && rpc.msgtyp == 1"),
                lock_denied_replies=count("nfs.nfsstat4 == 10010 && rpc.msgtyp == 1"),
                duplicate_calls=count("rpc.call.dup"), duplicate_replies=count("rpc.reply.dup"),
                # per packet, calls and replies both: "opcode:packets"
                v4_opcodes_in_packets=per_value("nfs.opcode", "nfs"),
                v3_procedures_in_packets=per_value("nfs.procedure_v3", "nfs"))


# --------------------------------------------------------------------------- (a) open herd
HERD_DIR = "ckpt/step1000"          # a PyTorch distributed-checkpoint directory (torch.distributed.checkpoint)
HERD_METADATA = ".metadata"         # read by every rank first
HERD_READ_BYTES = 1024         # each READ (keeps the capture small)


def shard_name(i: int) -> str:
    """Rank I's own shard file, as torch.distributed.checkpoint's FileSystemWriter names it."""
    return f"__{i}_0.distcp"


def herd_files(n_clients: int) -> dict[str, bytes]:
    files = {f"{HERD_DIR}/{HERD_METADATA}": b"metadata\n" * 64}
    files.update({f"{HERD_DIR}/{shard_name(i)}": bytes([65 + i % 26]) * HERD_READ_BYTES for i in range(n_clients)})
    return files


def _ms_quantiles(values: list[float]) -> list[float]:
    """[min, median, max] in ms."""
    v = sorted(values)
    return [round(v[0] * 1000, 1), round(v[len(v) // 2] * 1000, 1), round(v[-1] * 1000, 1)] if v else []


def run_herd(lab: Lab, out: Path, healthy: bool, n_clients: int = 16, spread_s: float = 8.0,
             shards: bool = False, fname: str | None = None, setup_gap_s: float = 0.0) -> dict:
    """N_CLIENTS ranks (one address, TCP connection and client id each) restart from a checkpoint:
    LOOKUP the directory, OPEN/READ/CLOSE the shared file; with SHARDS (the distributed-checkpoint
    layout) the shared file is the directory's ``.metadata`` and each rank then OPENs/READs/CLOSEs
    its own shard ``__<rank>_0.distcp`` too. All at one instant, or (HEALTHY) spread evenly over
    SPREAD_S. The clients set up (connect, SETCLIENTID) SETUP_GAP_S apart before: mounts that happened
    long before the restart, not a mount herd of their own."""
    fname = fname or f"nfs4-open-herd{'-healthy' if healthy else ''}.pcap"
    files = herd_files(n_clients) if shards else FILES
    shared = f"{HERD_DIR}/{HERD_METADATA}" if shards else CKPT_FILE
    _, lan, g = setup(lab, n_clients, files=files)
    cap = Capture(lab, lab.namespaces[0], "s0", out / fname, nano=True)
    clients = []
    with lan:
        for i in range(n_clients):
            clients.append(Nfs4Client.started(SERVER, client_addr(i), f"rank{i}", renew=False))
            time.sleep(setup_gap_s)
    t_setup_done = time.time()
    time.sleep(1.5)
    t_go = time.time() + 0.5
    opened: list[dict] = []

    def rank(i: int) -> None:
        c = clients[i]
        delay = (i * spread_s / n_clients) if healthy else 0.0
        time.sleep(max(0.0, t_go + delay - time.time()))
        t0 = time.time()
        c.lookup(f"{PSEUDO_ROOT}/{HERD_DIR if shards else CKPT_DIR}")
        names = [shared] + ([f"{HERD_DIR}/{shard_name(i)}"] if shards else [])
        for name in names:
            f = c.open(f"{PSEUDO_ROOT}/{name}", access=OPEN4_SHARE_ACCESS_READ)
            c.read(f, 0, HERD_READ_BYTES)
            c.close_file(f)
        opened.append(dict(client=c.src_addr, t_start=t0, t_done=time.time(), files=len(names)))

    join_all(start_threads(rank, n_clients), 60)
    time.sleep(1.5)
    for c in clients:
        c.close()
    stats = cap.stop()
    stop_ganesha(lab, g)
    starts = sorted(o["t_start"] for o in opened)
    dones = sorted(o["t_done"] for o in opened)
    t_first = first_packet_time(out / fname)
    calls = [x for c in clients for x in c.log]
    during = [x["t_reply"] - x["t_send"] for x in calls if x["t_send"] >= t_go - 0.01]
    before = [x["t_reply"] - x["t_send"] for x in calls if x["t_send"] < t_setup_done]
    n_open = sum(o["files"] for o in opened)
    return dict(file=fname, scenario="nfs4-open-herd", healthy=healthy, clients=n_clients,
                opens=n_open, lookups=len(opened), reads=n_open, closes=n_open,
                path=f"{PSEUDO_ROOT}/{HERD_DIR if shards else CKPT_FILE}",
                shared_file=f"{PSEUDO_ROOT}/{shared}", own_shards=shards,
                open_burst_start_s=round(starts[0] - t_first, 3),
                open_burst_span_ms=round((starts[-1] - starts[0]) * 1000, 1),
                ranks_done_s=round(dones[-1] - t_first, 3),
                call_latency_during_ms=_ms_quantiles(during), call_latency_setup_ms=_ms_quantiles(before),
                spread_s=spread_s if healthy else 0.0,
                capture_dropped=stats.get("dropped_by_kernel", -1),
                what=(f"{n_clients} NFSv4.0 clients (one address and TCP connection each) LOOKUP the "
                      f"checkpoint directory then OPEN/READ/CLOSE "
                      + (f"its {HERD_METADATA} and their own shard {shard_name(0).replace('0', '<rank>', 1)} "
                         if shards else "the same file ")
                      + (f"spread evenly over {spread_s:.0f} s." if healthy else "all at the same instant.")))


# --------------------------------------------------------------------------- (b) lock contention
def run_locks(lab: Lab, out: Path, variant: str, n_clients: int = 4, hold_s: float = 6.0,
              fixed_interval_s: float = 0.5, give_up_s: float = 40.0, fname: str | None = None) -> dict:
    """VARIANT: 'fixed' (waiters poll every FIXED_INTERVAL_S), 'growing' (the Linux timer
    1 s doubling to 30 s), 'healthy' (one client at a time, no denials). A waiter gives up when
    its next try would come after GIVE_UP_S."""
    suffix = {"fixed": "", "growing": "-growing", "healthy": "-healthy"}[variant]
    fname = fname or f"nfs4-lock-polling{suffix}.pcap"
    _, lan, g = setup(lab, n_clients)
    cap = Capture(lab, lab.namespaces[0], "s0", out / fname, nano=True)
    path = f"{PSEUDO_ROOT}/locks/job.lock"
    clients, files = [], []
    with lan:
        for i in range(n_clients):
            c = Nfs4Client.started(SERVER, client_addr(i), f"worker{i}")
            clients.append(c)
            files.append(c.open(path))
    time.sleep(0.5)
    attempts: list[dict] = []
    held: list[dict] = []
    gave_up: list[str] = []
    interval = {"fixed": fixed_interval_s, "growing": None, "healthy": None}[variant]

    def worker(i: int) -> None:
        c, f = clients[i], files[i]
        if variant == "healthy":
            time.sleep(i * (hold_s + 0.5))        # turns: nobody asks while another holds
        else:
            time.sleep(i * 0.05)                  # client 0 first, the others right behind
        ok = c.lock_blocking(f, interval, give_up_s=give_up_s, attempts=attempts)
        if ok:
            t = time.time()
            time.sleep(hold_s)
            c.unlock(f)
            held.append(dict(client=c.src_addr, t_granted=t, t_released=time.time()))
        else:
            gave_up.append(c.src_addr)

    join_all(start_threads(worker, n_clients), give_up_s + hold_s * n_clients + 30)
    for c, f in zip(clients, files):
        c.close_file(f)
        c.close()
    stats = cap.stop()
    stop_ganesha(lab, g)
    t_first = first_packet_time(out / fname)
    denied = [a for a in attempts if a["status"] != NFS4_OK]
    attempts.sort(key=lambda a: a["t"])
    held.sort(key=lambda h: h["t_granted"])
    # the lock sat free from a release to the next grant (the poll that won came that much later)
    free_s = [round(b["t_granted"] - a["t_released"], 3) for a, b in zip(held, held[1:])]
    return dict(file=fname, scenario="nfs4-lock-polling", healthy=variant == "healthy", variant=variant,
                clients=n_clients, lock_attempts=len(attempts), lock_denials=len(denied),
                locks_granted=len(held), clients_gave_up=len(gave_up), gave_up=sorted(gave_up), hold_s=hold_s,
                retry_interval_s=(fixed_interval_s if variant == "fixed" else 0.0),
                retry_min_s=LOCK_MIN_TIMEOUT_S if variant == "growing" else 0.0,
                retry_max_s=LOCK_MAX_TIMEOUT_S if variant == "growing" else 0.0,
                give_up_s=give_up_s,
                grant_order=[h["client"] for h in held],
                grant_s=[round(h["t_granted"] - t_first, 3) for h in held],
                release_s=[round(h["t_released"] - t_first, 3) for h in held],
                free_between_holds_s=free_s, free_total_s=round(sum(free_s), 3),
                capture_dropped=stats.get("dropped_by_kernel", -1),
                attempt_clients=[a["client"] for a in attempts],
                attempt_s=[round(a["t"] - t_first, 3) for a in attempts],
                attempt_denied=[a["status"] != NFS4_OK for a in attempts],
                what=(f"{n_clients} NFSv4.0 clients OPEN {path}; each asks for a whole-file WRITEW_LT LOCK "
                      f"and holds it {hold_s:g} s. "
                      + {"fixed": f"Waiters poll the denied LOCK every {fixed_interval_s} s.",
                         "growing": "Waiters retry on the Linux client's timer: 1 s doubling up to 30 s.",
                         "healthy": "They take turns; nobody asks while another holds it."}[variant]))


# --------------------------------------------------------------------------- (c) UDP stall
def run_udp_stall(lab: Lab, out: Path, healthy: bool, n_clients: int = 8, stall_s: float = 5.0,
                  duration_s: float = 12.0, call_interval_s: float = 0.25) -> dict:
    fname = f"nfs3-udp-retrans{'-healthy' if healthy else ''}.pcap"
    _, lan, g = setup(lab, n_clients, nfs3_udp=True)
    cap = Capture(lab, lab.namespaces[0], "s0", out / fname, nano=True)
    clients = []
    with lan:
        for i in range(n_clients):
            clients.append(Nfs3UdpClient(SERVER, client_addr(i), f"u{i}"))
        roots = [c.mount(str(g.export_dir)) for c in clients]
    t_start = time.time()
    stall: dict = {}

    def client(i: int) -> None:
        c, root = clients[i], roots[i]
        d = c.lookup(root, "data")
        fh = c.lookup(d, "shard0")
        while time.time() - t_start < duration_s:
            c.read(fh, 0, READ_SIZE_BYTES)
            time.sleep(call_interval_s)

    threads = start_threads(client, n_clients)
    if not healthy:
        time.sleep(3.0)
        stall["t_stop"] = time.time()
        g.stall()
        time.sleep(stall_s)
        g.resume()
        stall["t_cont"] = time.time()
    join_all(threads, duration_s + 60)
    time.sleep(0.5)
    stats = cap.stop()
    stop_ganesha(lab, g)
    t_first = first_packet_time(out / fname)
    calls = [r for c in clients for r in c.calls]
    retrans = [r for r in calls if r.get("retransmissions")]
    for c in clients:
        c.close()
    entry = dict(file=fname, scenario="nfs3-udp-retrans", healthy=healthy, clients=n_clients,
                 rpc_calls=len(calls), calls_retransmitted=len(retrans),
                 retransmissions=sum(r["retransmissions"] for r in retrans),
                 timeo_s=UDP_TIMEO_S, call_interval_s=call_interval_s, read_size_bytes=READ_SIZE_BYTES,
                 capture_dropped=stats.get("dropped_by_kernel", -1))
    if not healthy:
        entry.update(stall_s=round(stall["t_cont"] - stall["t_stop"], 3),
                     stall_start_s=round(stall["t_stop"] - t_first, 3),
                     stall_end_s=round(stall["t_cont"] - t_first, 3),
                     retransmit_offsets_s=[round(s - r["sends"][0], 3) for r in retrans for s in r["sends"][1:]])
    entry["what"] = (f"{n_clients} NFSv3 clients over UDP (MOUNT v3, LOOKUP, then a {READ_SIZE_BYTES}-byte READ every "
                     f"{call_interval_s} s for {duration_s:.0f} s), retransmitting the same xid after "
                     f"timeo {UDP_TIMEO_S} s doubled per retry"
                     + ("." if healthy else f"; ganesha.nfsd SIGSTOPped for {stall_s:.0f} s 3 s in."))
    return entry


# --------------------------------------------------------------------------- samples/make_real.py
# The four NFS scenarios of make_real (build(lab, out, healthy) -> manifest entry, see
# realkit/scen_cascade.py build_cascade for the format). Sizes chosen so each capture is well
# under 1 MB and under ~60 s.
HERD_CLIENTS = 48            # ranks restarting from the checkpoint (herd.min_clients is 20)
HERD_SPREAD_S = 8.0          # the healthy twin: the same ranks, evenly over this long
HERD_SETUP_GAP_S = 0.1       # the clients' set-up (connect, SETCLIENTID), this far apart, before
LOCK_CLIENTS = 8             # clients contending for one lock
LOCK_HOLD_S = 2.0            # each holds it this long
LOCK_FIXED_INTERVAL_S = 0.5  # the fixed polling interval
GROWING_GIVE_UP_S = 40.0     # growing timer: a waiter whose next try would be later than this gives up
# detectors issue 15 adds (helpers nlock, nddet) that core.ALL_DETECTORS does not list yet
NFS_DETECTORS = ["lock_polling", "delegation_recall"]
EVERY_DETECTOR = list(ALL_DETECTORS) + [d for d in NFS_DETECTORS if d not in ALL_DETECTORS]
# what a recording's legacy record keeps out of [capture.measured]
_NOT_MEASURED = ("file", "scenario", "healthy", "what")


def _made_with(clients: str) -> str:
    return (f"{ganesha_version()} in a network namespace ({SERVER}, NFSv4.0/4.1 over TCP 2049"
            f"{', NFSv3 and MOUNT v3 over UDP, rpcbind ' + deb_version('rpcbind') if 'NFSv3' in clients else ''}); "
            f"clients: {clients} from samples/realkit/nfs_client.py (ONC-RPC/XDR over a socket, one address "
            f"10.77.5.x each). Captured with tcpdump on the server's veth (full packets, ns pcap).")


def _entry(r: dict, twin: str, made_with: str) -> dict:
    measured = {k: v for k, v in r.items() if k not in _NOT_MEASURED}
    return dict(file=r["file"], scenario=r["scenario"], healthy=r["healthy"], twin=twin, made_with=made_with,
                measured=measured)


def build_herd(lab: Lab, out: Path, healthy: bool) -> dict:
    """A checkpoint restart (torch.distributed.checkpoint layout): every rank LOOKUPs the checkpoint
    directory, OPENs/READs/CLOSEs its ``.metadata`` and then its own shard ``__<rank>_0.distcp``: a
    herd on the directory (one shared file, HERD_CLIENTS different shard names). Healthy twin: the
    same ranks and requests spread evenly over HERD_SPREAD_S."""
    r = run_herd(lab, out, healthy, n_clients=HERD_CLIENTS, spread_s=HERD_SPREAD_S, shards=True,
                 setup_gap_s=HERD_SETUP_GAP_S)
    e = _entry(r, "nfs4-open-herd.pcap" if healthy else "nfs4-open-herd-healthy.pcap",
               _made_with(f"{HERD_CLIENTS} NFSv4.0 clients (one TCP connection and client id each)"))
    n, lat, setup_lat = r["clients"], r["call_latency_during_ms"], r["call_latency_setup_ms"]
    if healthy:
        e["what_happened"] = (
            f"The same {n} ranks restart from {r['path']} one after another, evenly over {HERD_SPREAD_S:g} s "
            f"(first at {r['open_burst_start_s']} s, last {r['open_burst_span_ms'] / 1000:.2f} s later): each "
            f"LOOKUPs the directory and OPENs/READs/CLOSEs {HERD_METADATA} and its own shard; {r['opens']} OPENs "
            f"in all, call latency {lat[1]} ms median, {lat[2]} ms at most. No herd.")
        e["silent"] = list(EVERY_DETECTOR)
        e["expect"] = []
        return e
    e["what_happened"] = (
        f"{n} ranks restart from the checkpoint at one instant: within {r['open_burst_span_ms']:.0f} ms from "
        f"{r['open_burst_start_s']} s each LOOKUPs {r['path']}, then OPENs/READs/CLOSEs {r['shared_file']} and its "
        f"own shard in the same directory ({r['opens']} OPENs of {n + 1} files); the last rank is done at "
        f"{r['ranks_done_s']} s. Call latency during the restart {lat[0]}-{lat[2]} ms (median {lat[1]} ms) "
        f"against {setup_lat[1]} ms median during the clients' set-up: a herd on the checkpoint directory.")
    e["silent"] = [d for d in EVERY_DETECTOR if d != "herd"]
    e["expect"] = [dict(detector="herd", kind="nfs", min_severity="medium", start_s=r["open_burst_start_s"],
                        tolerance_s=0.5, client="", server=SERVER, resource=r["path"], count=1, count_tolerance=0,
                        measured=dict(clients=n, spread_ms=r["open_burst_span_ms"], opens=r["opens"]))]
    return e


def _lock_expect(r: dict) -> dict:
    denied = [t for t, d in zip(r["attempt_s"], r["attempt_denied"]) if d]
    return dict(detector="lock_polling", kind="nfs4", min_severity="medium", start_s=denied[0] if denied else 0.0,
                tolerance_s=1.0, client="", server=SERVER, resource=f"{PSEUDO_ROOT}/locks/job.lock", count=1,
                count_tolerance=0,
                measured=dict(clients=r["clients"], denials=r["lock_denials"], granted=r["locks_granted"],
                              gave_up=r["clients_gave_up"], free_total_s=r["free_total_s"],
                              end_s=r["release_s"][-1] if r["release_s"] else 0.0))


def build_lock_polling(lab: Lab, out: Path, healthy: bool) -> dict:
    """LOCK_CLIENTS clients want one whole-file write lock; waiters poll the denied LOCK every
    LOCK_FIXED_INTERVAL_S. Healthy twin: they take turns (nobody asks while another holds it)."""
    r = run_locks(lab, out, "healthy" if healthy else "fixed", n_clients=LOCK_CLIENTS, hold_s=LOCK_HOLD_S,
                  fixed_interval_s=LOCK_FIXED_INTERVAL_S)
    e = _entry(r, "nfs4-lock-polling.pcap" if healthy else "nfs4-lock-polling-healthy.pcap",
               _made_with(f"{LOCK_CLIENTS} NFSv4.0 clients (RENEW at 2/3 of the 15 s lease)"))
    n = r["clients"]
    if healthy:
        e["what_happened"] = (
            f"{n} clients take the lock on {PSEUDO_ROOT}/locks/job.lock in turns, each holding it {LOCK_HOLD_S:g} s "
            f"and asking only after the previous one released it: {r['lock_attempts']} LOCKs, "
            f"{r['lock_denials']} denied, {r['locks_granted']} granted. No contention.")
        e["silent"] = list(EVERY_DETECTOR)
        e["expect"] = []
        return e
    e["what_happened"] = (
        f"{n} clients ask for the same whole-file WRITEW_LT lock on {PSEUDO_ROOT}/locks/job.lock within "
        f"{(n - 1) * 50} ms; each holds it {LOCK_HOLD_S:g} s once granted. NFSv4.0 has no lock wait, so the "
        f"waiters poll the denied LOCK every {LOCK_FIXED_INTERVAL_S:g} s: {r['lock_attempts']} LOCKs, "
        f"{r['lock_denials']} answered NFS4ERR_DENIED, {r['locks_granted']} granted (order "
        f"{', '.join(a.rsplit('.', 1)[1] for a in r['grant_order'])}, whichever waiter's poll came first after a release), grants at "
        f"{r['grant_s']} s; the lock sat free {r['free_total_s']} s in all between a release and the next "
        f"winning poll.")
    e["silent"] = [d for d in EVERY_DETECTOR if d != "lock_polling"]
    e["expect"] = [_lock_expect(r)]
    return e


def build_lock_polling_growing(lab: Lab, out: Path, healthy: bool) -> dict:
    """The same contention on the Linux client's blocking-lock timer (fs/nfs/nfs4proc.c
    nfs4_retry_setlk_simple / nfs4_set_lock_task_retry: NFS4_LOCK_MINTIMEOUT 1*HZ, doubled after
    each denial up to NFS4_LOCK_MAXTIMEOUT 30*HZ); waiters give up after GROWING_GIVE_UP_S so the
    capture stays under a minute: some starve. No healthy twin (the fixed scenario's serves)."""
    r = run_locks(lab, out, "growing", n_clients=LOCK_CLIENTS, hold_s=LOCK_HOLD_S, give_up_s=GROWING_GIVE_UP_S)
    e = _entry(r, "nfs4-lock-polling-healthy.pcap",
               _made_with(f"{LOCK_CLIENTS} NFSv4.0 clients (RENEW at 2/3 of the 15 s lease)"))
    e["scenario"] = "nfs4-lock-polling-growing"
    e["what_happened"] = (
        f"{r['clients']} clients ask for the same whole-file WRITEW_LT lock on {PSEUDO_ROOT}/locks/job.lock; each "
        f"holds it {LOCK_HOLD_S:g} s once granted. The waiters retry the denied LOCK on the Linux client's timer "
        f"(1 s, doubled per denial, up to 30 s): {r['lock_attempts']} LOCKs, {r['lock_denials']} denied, "
        f"{r['locks_granted']} granted at {r['grant_s']} s; the lock sat free {r['free_total_s']} s in all between "
        f"a release and the next winning poll (gaps {r['free_between_holds_s']} s); {r['clients_gave_up']} clients "
        f"gave up (their next try would have come after {GROWING_GIVE_UP_S:g} s): starved.")
    e["silent"] = [d for d in EVERY_DETECTOR if d != "lock_polling"]
    e["expect"] = [_lock_expect(r)]
    return e


def build_udp_retrans(lab: Lab, out: Path, healthy: bool) -> dict:
    """NFSv3 over UDP, 8 clients reading every 0.25 s; ganesha.nfsd SIGSTOPped 5 s: every
    outstanding call is retransmitted with the same xid on the nfs(5) UDP timer (timeo 1.1 s,
    doubled per retry). Healthy twin: no stall."""
    r = run_udp_stall(lab, out, healthy)
    e = _entry(r, "nfs3-udp-retrans.pcap" if healthy else "nfs3-udp-retrans-healthy.pcap",
               _made_with(f"{r['clients']} NFSv3 clients over UDP (MOUNT v3 MNT, LOOKUP, READ)"))
    if healthy:
        e["what_happened"] = (
            f"{r['clients']} NFSv3/UDP clients read {READ_SIZE_BYTES} bytes every {r['call_interval_s']} s: "
            f"{r['rpc_calls']} calls, {r['retransmissions']} retransmitted. No stall, no retransmissions.")
        e["silent"] = list(EVERY_DETECTOR)
        e["expect"] = []
        return e
    offsets = sorted(set(r["retransmit_offsets_s"]))
    e["what_happened"] = (
        f"ganesha.nfsd is SIGSTOPped from {r['stall_start_s']} s to {r['stall_end_s']} s; the {r['clients']} "
        f"NFSv3/UDP clients' outstanding READs ({r['calls_retransmitted']} calls) are resent with the same xid "
        f"{r['retransmissions']} times in all, at {offsets[0]} and {offsets[-1]} s after the first send (timeo "
        f"{UDP_TIMEO_S} s, doubled); the server answers them when it resumes.")
    e["silent"] = [d for d in EVERY_DETECTOR if d != "retry_storm"]
    # low: the retries add no load (they come no faster than the clients' own reads); the harm is the
    # stall each call waited on a 1.1 s timer against a sub-ms RTT (retry_storm's wording)
    e["expect"] = [dict(detector="retry_storm", kind="nfs", min_severity="low", start_s=r["stall_start_s"],
                        # the MOUNT path is the server's temporary export directory: its tail names the files
                        tolerance_s=1.5, client="", server=SERVER, resource="export/data/shard", count=1,
                        count_tolerance=0,
                        measured=dict(clients=r["clients"], calls_retransmitted=r["calls_retransmitted"],
                                      retransmissions=r["retransmissions"], end_s=r["stall_end_s"]))]
    return e


def groundtruth_record(entry: dict, out: Path, file: str | None = None) -> dict:
    """A make_real entry as a tests/data/nfs/recorded/GROUNDTRUTH.toml record (flat, with tshark_counts)."""
    rec = dict(file=file or entry["file"], scenario=entry["scenario"], healthy=entry["healthy"], **entry["measured"],
               what=entry["what_happened"], made_with=entry["made_with"])
    rec["tshark"] = tshark_counts(out / (file or entry["file"]))
    return rec


SCENARIOS = {
    "herd": lambda lab, out: run_herd(lab, out, healthy=False),
    "herd-healthy": lambda lab, out: run_herd(lab, out, healthy=True),
    "lock-fixed": lambda lab, out: run_locks(lab, out, "fixed"),
    "lock-growing": lambda lab, out: run_locks(lab, out, "growing"),
    "lock-healthy": lambda lab, out: run_locks(lab, out, "healthy"),
    "udp-stall": lambda lab, out: run_udp_stall(lab, out, healthy=False),
    "udp-healthy": lambda lab, out: run_udp_stall(lab, out, healthy=True),
}


def write_groundtruth(out: Path, entries: list[dict]) -> None:
    """Merge ENTRIES into GROUNDTRUTH.toml (one [[capture]] per file, replaced by file name)."""
    import tomllib
    gt = out / "GROUNDTRUTH.toml"
    by_file = {e["file"]: e for e in (tomllib.loads(gt.read_text()).get("capture", []) if gt.exists() else [])}
    for e in entries:
        by_file[e["file"]] = e
    header = ("# Ground truth of the recorded NFS captures (samples/realkit/scen_nfs.py).\n"
              f"# server: {ganesha_version()}; times in seconds from the capture's first packet;\n"
              "# [capture.tshark]: tshark's counts on the file (packets, calls and replies both).")
    gt.write_text(dump_manifest([by_file[k] for k in sorted(by_file)], header))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--recount", action="store_true",
                    help="only recompute the tshark figures of the captures already in GROUNDTRUTH.toml")
    ap.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.recount:
        import tomllib
        old = tomllib.loads((args.out / "GROUNDTRUTH.toml").read_text())["capture"]
        for e in old:
            e["tshark"] = tshark_counts(args.out / e["file"])
        write_groundtruth(args.out, old)
        return 0
    cleanup_stale()
    failed = 0
    for name in args.scenarios:
        lab = Lab(f"nfs{name}", Path(f"/tmp/hsreal-nfs/{name}"))
        try:
            e = SCENARIOS[name](lab, args.out)
            e["made_with"] = ganesha_version()
            e["tshark"] = tshark_counts(args.out / e["file"])
            write_groundtruth(args.out, [e])
            log(f"{name}: {e['file']} {(args.out / e['file']).stat().st_size} bytes, tshark {e['tshark']}")
        except Exception as ex:   # record the failure, go on with the next scenario
            failed += 1
            log(f"{name} FAILED: {ex!r}")
        finally:
            ours_rpcbind = any(n == "rpcbind" for n, _ in lab.procs)
            lab.close()
            if ours_rpcbind:   # rpcbind leaves its socket behind
                for leftover in ("/run/rpcbind.sock", "/run/rpcbind.lock"):
                    Path(leftover).unlink(missing_ok=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
