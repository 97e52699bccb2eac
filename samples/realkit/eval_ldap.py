"""Evaluation LDAP scenario (samples/make_eval.py): connection churn by a *population*.

40 hosts (40 addresses, 10.77.3.1-40) each look up a user every 250 ms (own phase) for 2.5 s;
the pathological clients open a new TCP connection for every search (connect, simple bind,
search, unbind, close), so slapd takes ~400 connections in 2.5 s (~160 new connections/s)
carrying one search each, ten per client: no single client churns much, the service does.
The healthy twin: the same hosts and searches, each host on one pooled connection (the pools
open at random times over the 8 s before the searches, not all at one instant).

Topology: [ldap] l0 10.77.0.89 (slapd, back-mdb) ====veth==== lan0 [lan] clients 10.77.3.x
(see realkit/scen_ldap.py; clients are ldap3, each bound to its own source address).
"""
from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

from . import facts, scen_ldap
from .core import ADDED_DETECTORS, Lab, deb_version, first_packet_time, join_all, start_threads
from .eval_common import ALL_DETECTORS, capture, capture_name, healthy_twin, new_entry, pathological

SLAPD = scen_ldap.SLAPD
BASE = scen_ldap.BASE
POOL_WARMUP = 8.0   # healthy twin: the pooled connections open spread over this many seconds


def run_population(lab: Lab, out: Path, fname: str, healthy: bool, n_hosts: int = 40,
                   per_host: int = 10, interval: float = 0.25, seed: int = 41) -> dict:
    rng = random.Random(seed)
    srv, lan = scen_ldap.setup_directory(lab, n_hosts)
    scen_ldap.start_slapd(lab, srv)
    cap = capture(lab, srv, "l0", out / fname)
    phases = [rng.uniform(0, interval) for _ in range(n_hosts)]
    wanted = [[f"user{rng.randrange(1, scen_ldap.N_USERS + 1):02d}" for _ in range(per_host)]
              for _ in range(n_hosts)]
    # healthy: each host's pool connects at its own time in the POOL_WARMUP s before the
    # searches (hosts whose services started at different times), not all at one instant
    warm = [rng.uniform(0, POOL_WARMUP) for _ in range(n_hosts)]
    rows: list[tuple] = []   # (host, k, t_start, t_end, found, new_connection)
    lock = threading.Lock()
    t_base = time.time() + 1.0 + (POOL_WARMUP if healthy else 0.0)

    def host(h: int):
        src = f"10.77.3.{h + 1}"
        pooled = None
        if healthy:
            time.sleep(max(0.0, t_base - POOL_WARMUP - 0.5 + warm[h] - time.time()))
            with lan:
                pooled = scen_ldap.bind_connection(src)
        for k, uid in enumerate(wanted[h]):
            time.sleep(max(0.0, t_base + phases[h] + k * interval - time.time()))
            t0 = time.time()
            if pooled is None:
                with lan:
                    c = scen_ldap.bind_connection(src)      # connect + bind for every search
            else:
                c = pooled
            c.search(f"ou=people,{BASE}", f"(uid={uid})", attributes=["mail", "cn"])
            found = len(c.entries)
            if pooled is None:
                c.unbind()                        # ... unbind + close right after it
            with lock:
                rows.append((h, k, t0, time.time(), found, pooled is None))
        if pooled is not None:
            time.sleep(max(0.0, t_base + per_host * interval + 0.2 - time.time()))
            pooled.unbind()

    join_all(start_threads(host, n_hosts), 60)
    time.sleep(0.3)
    stats = cap.stop()
    return dict(rows=sorted(rows, key=lambda r: r[2]), t_first=first_packet_time(out / fname),
                stats=stats, fname=fname, n_hosts=n_hosts, per_host=per_host, interval=interval,
                slapd_log=lab.logtail("slapd", 100000))


def build_population(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "ldap-population-churn"
    fname = capture_name(scen, healthy)
    r = run_population(lab, out, fname, healthy)
    rows, t0 = r["rows"], r["t_first"]
    lat = sorted(x[3] - x[2] for x in rows)
    accepts = len(re.findall(r"conn=\d+ fd=\d+ ACCEPT from IP=10\.77\.3\.", r["slapd_log"]))
    span = rows[-1][2] - rows[0][2]
    conns = sum(1 for x in rows if x[5]) if not healthy else r["n_hosts"]
    made = (f"slapd {deb_version('slapd')} (back-mdb, slapd.conf, {scen_ldap.N_USERS} users) on "
            f"{SLAPD}:389; {r['n_hosts']} ldap3 clients on {r['n_hosts']} addresses "
            f"(10.77.3.1-{r['n_hosts']}), each searching for a random uid=userNN every "
            f"{r['interval'] * 1000:g} ms (own phase), {r['per_host']} searches each, simple bind "
            f"as {scen_ldap.READER}; "
            + (f"each host keeps one pooled connection (bind once, unbind at the end), the 40 "
               f"pools opening at random times over the {POOL_WARMUP:g} s before the searches."
               if healthy
               else "every search on a new TCP connection: connect, bind, search, unbind, close.")
            + " Captured on slapd's veth (whole frames, -s 2048, us pcap).")
    measured = dict(hosts=r["n_hosts"], searches=len(rows), found=sum(x[4] for x in rows),
                    connections=conns, slapd_accepts_from_clients=accepts,
                    searches_per_connection=round(len(rows) / max(conns, 1), 2),
                    service_connections_per_s=round((conns - 1) / span, 1) if not healthy else 0.0,
                    span_s=round(span, 3), first_op_s=round(rows[0][2] - t0, 3),
                    last_op_s=round(rows[-1][2] - t0, 3),
                    median_latency_ms=round(lat[len(lat) // 2] * 1000, 2),
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = new_entry(scen, healthy, made, measured=measured)
    if healthy:
        # The search workload itself starts at one instant on all 40 hosts (in both twins):
        # a herd reading of that onset is debatable, so herd is held below high, not silent.
        return healthy_twin(entry, (
            f"{len(rows)} searches from {r['n_hosts']} hosts over {r['n_hosts']} long-lived "
            f"connections ({measured['searches_per_connection']:g} searches each). No churn."),
            silent=[d for d in ALL_DETECTORS if d != "herd"],
            note=("the 40 hosts start their search schedules together (as in the "
                  "pathological twin): herd may report that onset, below high"))
    return pathological(entry, (
        f"{conns} short connections from {r['n_hosts']} hosts to {SLAPD}:389 in {span:.2f} s "
        f"({measured['service_connections_per_s']:g} new connections/s at the service; slapd "
        f"logged {accepts} ACCEPTs), each carrying bind + one search + unbind; every client "
        f"opens only {r['per_host']} of them, so the churn is the population's, at the service."),
        silent=["herd", "retry_storm", "smb_break_queue", "tcp_stall", "toctou", *ADDED_DETECTORS], expect=[dict(
        detector="conn_churn", kind="churn", min_severity="medium", start_s=measured["first_op_s"],
        tolerance_s=1.0, client="", server=SLAPD, resource=f"{SLAPD}:389", count=1,
        count_tolerance=0,
        measured=dict(clients=r["n_hosts"], connections=conns,
                      connections_per_client=r["per_host"], searches_per_connection=1,
                      connections_per_s=measured["service_connections_per_s"],
                      duration_s=round(span, 2), end_s=measured["last_op_s"]))])


def tshark_facts(entry: dict, path) -> dict:
    """What tshark sees: connections to slapd, clients, LDAP operations."""
    syn = facts.tshark_rows(path, f"tcp.flags.syn == 1 && tcp.flags.ack == 0 && ip.dst == {SLAPD}",
                            ["ip.src", "tcp.srcport"])
    ops = facts.tshark_rows(path, f"ldap && ip.dst == {SLAPD}", ["ldap.protocolOp"])
    kinds = [o for r in ops for o in r[0].split(",") if o]
    return dict(tcp_connections=len(set(map(tuple, syn))), clients=len({r[0] for r in syn}),
                bind_requests=kinds.count("0"), search_requests=kinds.count("3"),
                unbind_requests=kinds.count("2"))
