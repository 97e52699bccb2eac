"""NFS scenarios recorded on nfs-ganesha (VFS) with our own ONC-RPC client: an open herd on one
checkpoint path, lock-polling contention (fixed and growing interval), NFSv3/UDP retransmissions
after a server stall; each with its healthy twin.  Ground truth goes to
tests/data/nfs/recorded/GROUNDTRUTH.toml.

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

from .core import Capture, Lab, cleanup_stale, first_packet_time, join_all, log, start_threads
from .nfs_client import (LOCK_MAX_TIMEOUT_S, LOCK_MIN_TIMEOUT_S, NFS4_OK, Nfs3UdpClient, Nfs4Client,
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


def setup(lab: Lab, n_clients: int, nfs3_udp: bool = False):
    srv = lab.netns("srv")
    lan = lab.netns("lan")
    lab.veth(srv, "s0", lan, "lan0")
    srv.ip("addr", "add", f"{SERVER}/16", "dev", "s0")
    for i in range(n_clients):
        lan.ip("addr", "add", f"{client_addr(i)}/16", "dev", "lan0")
    g = start_ganesha(lab, srv, SERVER, FILES, nfs3_udp=nfs3_udp)
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
def run_herd(lab: Lab, out: Path, healthy: bool, n_clients: int = 16, spread_s: float = 8.0) -> dict:
    fname = f"nfs4-open-herd{'-healthy' if healthy else ''}.pcap"
    _, lan, _ = setup(lab, n_clients)
    cap = Capture(lab, lab.namespaces[0], "s0", out / fname, nano=True)
    clients = []
    with lan:
        for i in range(n_clients):
            c = Nfs4Client(SERVER, client_addr(i), f"rank{i}")
            c.connect()
            c.setclientid()
            clients.append(c)
    time.sleep(1.0)
    t_go = time.time() + 0.5
    opened: list[dict] = []

    def rank(i: int) -> None:
        c = clients[i]
        delay = (i * spread_s / n_clients) if healthy else 0.0
        time.sleep(max(0.0, t_go + delay - time.time()))
        t0 = time.time()
        c.lookup(f"{PSEUDO_ROOT}/{CKPT_DIR}")
        f = c.open(f"{PSEUDO_ROOT}/{CKPT_FILE}")
        c.read(f, 0, 4096)
        c.close_file(f)
        opened.append(dict(client=c.src_addr, t_start=t0, t_done=time.time()))

    join_all(start_threads(rank, n_clients), 30)
    time.sleep(0.3)
    for c in clients:
        c.close()
    stats = cap.stop()
    starts = sorted(o["t_start"] for o in opened)
    t_first = first_packet_time(out / fname)
    return dict(file=fname, scenario="nfs4-open-herd", healthy=healthy, clients=n_clients,
                opens=len(opened), lookups=len(opened), reads=len(opened), closes=len(opened),
                path=f"{PSEUDO_ROOT}/{CKPT_FILE}",
                open_burst_start_s=round(starts[0] - t_first, 3),
                open_burst_span_ms=round((starts[-1] - starts[0]) * 1000, 1),
                spread_s=spread_s if healthy else 0.0,
                capture_dropped=stats.get("dropped_by_kernel", -1),
                what=(f"{n_clients} NFSv4.0 clients (one address and TCP connection each) LOOKUP the "
                      f"checkpoint directory then OPEN/READ/CLOSE the same file "
                      + (f"spread evenly over {spread_s:.0f} s." if healthy else "all at the same instant.")))


# --------------------------------------------------------------------------- (b) lock contention
def run_locks(lab: Lab, out: Path, variant: str, n_clients: int = 4, hold_s: float = 6.0,
              fixed_interval_s: float = 0.5) -> dict:
    """VARIANT: 'fixed' (waiters poll every FIXED_INTERVAL_S), 'growing' (the Linux timer
    1 s doubling to 30 s), 'healthy' (one client at a time, no denials)."""
    suffix = {"fixed": "", "growing": "-growing", "healthy": "-healthy"}[variant]
    fname = f"nfs4-lock-polling{suffix}.pcap"
    _, lan, _ = setup(lab, n_clients)
    cap = Capture(lab, lab.namespaces[0], "s0", out / fname, nano=True)
    path = f"{PSEUDO_ROOT}/locks/job.lock"
    clients, files = [], []
    with lan:
        for i in range(n_clients):
            c = Nfs4Client(SERVER, client_addr(i), f"worker{i}")
            c.connect()
            c.setclientid()
            c.start_renewer()
            clients.append(c)
            files.append(c.open(path))
    time.sleep(0.5)
    attempts: list[dict] = []
    held: list[dict] = []
    interval = {"fixed": fixed_interval_s, "growing": None, "healthy": None}[variant]

    def worker(i: int) -> None:
        c, f = clients[i], files[i]
        if variant == "healthy":
            time.sleep(i * (hold_s + 0.5))        # turns: nobody asks while another holds
        else:
            time.sleep(i * 0.05)                  # client 0 first, the others right behind
        ok = c.lock_blocking(f, interval, give_up_s=40.0, attempts=attempts)
        if ok:
            t = time.time()
            time.sleep(hold_s)
            c.unlock(f)
            held.append(dict(client=c.src_addr, t_granted=t, t_released=time.time()))

    join_all(start_threads(worker, n_clients), 60)
    for c, f in zip(clients, files):
        c.close_file(f)
        c.close()
    stats = cap.stop()
    t_first = first_packet_time(out / fname)
    denied = [a for a in attempts if a["status"] != NFS4_OK]
    attempts.sort(key=lambda a: a["t"])
    return dict(file=fname, scenario="nfs4-lock-polling", healthy=variant == "healthy", variant=variant,
                clients=n_clients, lock_attempts=len(attempts), lock_denials=len(denied),
                locks_granted=len(held), hold_s=hold_s,
                retry_interval_s=(fixed_interval_s if variant == "fixed" else 0.0),
                retry_min_s=LOCK_MIN_TIMEOUT_S if variant == "growing" else 0.0,
                retry_max_s=LOCK_MAX_TIMEOUT_S if variant == "growing" else 0.0,
                grant_order=[h["client"] for h in sorted(held, key=lambda h: h["t_granted"])],
                grant_s=[round(h["t_granted"] - t_first, 3) for h in sorted(held, key=lambda h: h["t_granted"])],
                release_s=[round(h["t_released"] - t_first, 3) for h in sorted(held, key=lambda h: h["t_granted"])],
                capture_dropped=stats.get("dropped_by_kernel", -1),
                attempt_clients=[a["client"] for a in attempts],
                attempt_s=[round(a["t"] - t_first, 3) for a in attempts],
                attempt_denied=[a["status"] != NFS4_OK for a in attempts],
                what=(f"{n_clients} NFSv4.0 clients OPEN {path}; each asks for a whole-file WRITEW_LT LOCK "
                      f"and holds it {hold_s:.0f} s. "
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
