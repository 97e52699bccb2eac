"""Evaluation TCP scenario (samples/make_eval.py): a share of SYNs lost across a population.

25 client hosts (10.77.4.1-25) each open a short connection every 0.8 s (own phase) to one of
two services (10.77.5.1:8080 and 10.77.5.3:8443, alternating), send 5 small requests and read
5 small responses on it, then close: 250 connections in ~8 s on a veth path with a round trip
of tens of microseconds.  In the pathological run an iptables rule in the servers' namespace
drops a random ``loss`` share of incoming SYNs (``-m statistic --mode random``), so those
connections wait out Linux's 1 s initial retransmission timeout (RFC 6298 2.1; TCP_TIMEOUT_INIT)
before the SYN is retransmitted: one systemic cause (a lossy path, an overflowing conntrack
table or SYN queue, a policer) spread thinly over every client and both services.
The healthy twin: the same traffic, no rule.

Topology: [srv] s0 10.77.5.1 + 10.77.5.3 ====veth==== lan0 [lan] clients 10.77.4.x
The capture runs on s0 (tcpdump sees a SYN before netfilter drops it), headers only (-s 96).
"""
from __future__ import annotations

import os
import random
import re
import socket
import threading
import time
from pathlib import Path

from . import facts
from .core import ADDED_DETECTORS, Lab, first_packet_time, join_all, run, start_threads
from .eval_common import add_addresses, capture, capture_name, healthy_twin, new_entry, pathological

SERVICES = [("10.77.5.1", 8080), ("10.77.5.3", 8443)]
REQ, RESP, TURNS = 80, 300, 5


def _serve(ns, addr: tuple, stop: threading.Event, served: list):
    with ns:
        ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(addr)
    ls.listen(512)
    ls.settimeout(0.2)

    def handle(c):
        try:
            for _ in range(TURNS):
                got = 0
                while got < REQ:
                    b = c.recv(REQ - got)
                    if not b:
                        return
                    got += len(b)
                c.sendall(b"r" * RESP)
            c.recv(16)          # wait for the client's FIN
        except OSError:
            pass
        finally:
            c.close()

    while not stop.is_set():
        try:
            c, _ = ls.accept()
        except socket.timeout:
            continue
        served.append(time.time())
        threading.Thread(target=handle, args=(c,), daemon=True).start()
    ls.close()


def _drop_counts(srv) -> dict:
    out = run(["ip", "netns", "exec", srv.name, "iptables", "-L", "INPUT", "-v", "-x", "-n"]).stdout
    counts = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+\d+\s+DROP\s+.*?(10\.77\.5\.\d+)", line)
        if m:
            counts[m.group(2)] = int(m.group(1))
    return counts


def run_syn_loss(lab: Lab, out: Path, fname: str, healthy: bool, n_hosts: int = 25,
                 per_host: int = 10, every: float = 0.8, loss: float = 0.04, seed: int = 51) -> dict:
    rng = random.Random(seed)
    srv = lab.netns("srv")
    lan = lab.netns("lan")
    lab.veth(srv, "s0", lan, "lan0")
    add_addresses(srv, "s0", [a for a, _ in SERVICES])
    add_addresses(lan, "lan0", [f"10.77.4.{i + 1}" for i in range(n_hosts)])
    for ns in (srv, lan):
        ns.sysctl("net.ipv4.tcp_no_metrics_save", 1)
    if not healthy:
        for a, port in SERVICES:
            run(["ip", "netns", "exec", srv.name, "iptables", "-A", "INPUT", "-p", "tcp", "--syn",
                 "-d", a, "--dport", str(port), "-m", "statistic", "--mode", "random",
                 "--probability", f"{loss}", "-j", "DROP"])
    stop = threading.Event()
    served: list = []
    servers = [threading.Thread(target=_serve, args=(srv, s, stop, served), daemon=True)
               for s in SERVICES]
    for t in servers:
        t.start()
    time.sleep(0.5)
    cap = capture(lab, srv, "s0", out / fname, snaplen=96, nano=True, bpf="tcp")
    phases = [rng.uniform(0, every) for _ in range(n_hosts)]
    rows: list[dict] = []
    lock = threading.Lock()
    t_base = time.time() + 0.5

    def host(h: int):
        src = f"10.77.4.{h + 1}"
        for k in range(per_host):
            a, port = SERVICES[(h + k) % len(SERVICES)]
            time.sleep(max(0.0, t_base + phases[h] + k * every - time.time()))
            with lan:
                s = socket.socket()
            s.bind((src, 0))
            s.settimeout(10)
            r = dict(client=src, server=a, port=port, t_connect=time.time())
            try:
                s.connect((a, port))
                r["t_established"] = time.time()
                r["client_port"] = s.getsockname()[1]
                for _ in range(TURNS):
                    s.sendall(b"q" * REQ)
                    got = 0
                    while got < RESP:
                        b = s.recv(RESP - got)
                        if not b:
                            raise ConnectionError("server closed")
                        got += len(b)
                r["t_done"] = time.time()
            except OSError as e:
                r["error"] = str(e)
            finally:
                s.close()
            with lock:
                rows.append(r)

    join_all(start_threads(host, n_hosts), 120)
    time.sleep(0.5)
    stats = cap.stop()
    drops = _drop_counts(srv) if not healthy else {}
    stop.set()
    for t in servers:
        t.join(5)
    return dict(rows=sorted(rows, key=lambda r: r["t_connect"]), t_first=first_packet_time(out / fname),
                stats=stats, fname=fname, n_hosts=n_hosts, per_host=per_host, every=every,
                loss=loss, drops=drops)


def build_syn_loss(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "tcp-syn-loss-population"
    fname = capture_name(scen, healthy)
    r = run_syn_loss(lab, out, fname, healthy)
    rows, t0 = r["rows"], r["t_first"]
    est = [x for x in rows if "t_established" in x]
    hs = sorted((x["t_established"] - x["t_connect"]) * 1000 for x in est)
    slow = [x for x in est if x["t_established"] - x["t_connect"] > 0.5]
    made = (f"Linux {os.uname().release} TCP (default congestion control), veth path (RTT tens "
            f"of us). {r['n_hosts']} client hosts (10.77.4.1-{r['n_hosts']}, Python sockets) each "
            f"open a connection every {r['every']:g} s (own phase), {r['per_host']} each, "
            f"alternating between {SERVICES[0][0]}:{SERVICES[0][1]} and "
            f"{SERVICES[1][0]}:{SERVICES[1][1]}; each connection carries {TURNS} requests of "
            f"{REQ} bytes and {TURNS} responses of {RESP} bytes, then the client closes. "
            + ("No loss." if healthy else
               f"iptables in the servers' namespace drops a random {r['loss'] * 100:g} % of "
               "incoming SYNs to each service (-m statistic --mode random).")
            + " Captured on the servers' veth, -s 96, ns pcap, tcp only.")
    measured = dict(clients=r["n_hosts"], servers=len(SERVICES), connections=len(rows),
                    established=len(est), errors=len(rows) - len(est),
                    median_connect_ms=round(hs[len(hs) // 2], 3),
                    connections_waiting_initial_rto=len(slow),
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = new_entry(scen, healthy, made, measured=measured)
    if healthy:
        return healthy_twin(entry, (
            f"{len(est)} connections, every handshake at once (median connect "
            f"{measured['median_connect_ms']:.3f} ms, none waited for a SYN retransmission)."))
    measured.update(
        syn_drop_probability=r["loss"], iptables_syns_dropped=r["drops"],
        waiting_connections_share=round(len(slow) / max(len(est), 1), 4),
        clients_affected=len({x["client"] for x in slow}),
        servers_affected=sorted({x["server"] for x in slow}),
        connect_ms_of_waiting=[round((x["t_established"] - x["t_connect"]) * 1000, 1) for x in slow])
    return pathological(entry, (
        f"{len(slow)} of {len(est)} connections ({measured['waiting_connections_share'] * 100:.1f} %) "
        f"lost their SYN (iptables counted {sum(r['drops'].values())} dropped SYNs: "
        f"{r['drops']}) and connected only after the 1 s initial RTO, on a path whose RTT is "
        f"tens of microseconds; {measured['clients_affected']} of {r['n_hosts']} clients and "
        f"{len(measured['servers_affected'])} services were hit: one systemic cause."),
        silent=["herd", "retry_storm", "smb_break_queue", "toctou", *ADDED_DETECTORS],
        # conn_churn's syn_backlog reads "attempts without a SYN/ACK" at a service: a defensible
        # per-service reading of the same cause, not required and not forbidden
        also_acceptable=["conn_churn/syn_backlog"],
        expect=[dict(
        detector="tcp_stall", kind="rto", min_severity="medium",
        start_s=round(min(x["t_connect"] for x in slow) - t0, 3) if slow else 0.0,
        tolerance_s=0.5, client="", server="", resource="", count=1, count_tolerance=0,
        measured=dict(population="SYN loss across clients and services",
                      connections=len(slow), share=measured["waiting_connections_share"],
                      clients=measured["clients_affected"],
                      servers=measured["servers_affected"],
                      end_s=round(max(x["t_established"] for x in slow) - t0, 3) if slow else 0.0,
                      members=[f"{x['client']}:{x['client_port']}->{x['server']}:{x['port']}"
                               for x in slow]))])


def tshark_facts(entry: dict, path) -> dict:
    """What tshark sees: connections, clients, servers, SYNs sent again."""
    syn = facts.tshark_rows(path, "tcp.flags.syn == 1 && tcp.flags.ack == 0",
                            ["ip.src", "tcp.srcport", "ip.dst", "tcp.dstport"])
    per = {}
    for r in syn:
        per[tuple(r)] = per.get(tuple(r), 0) + 1
    return dict(tcp_connections=len(per), clients=len({k[0] for k in per}),
                servers=len({k[2] for k in per}), syns=len(syn),
                connections_with_syn_resent=sum(1 for v in per.values() if v > 1))
