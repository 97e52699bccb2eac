"""DNS scenarios: TTL-expiry herd (unbound in front of nsd) and retry storm (dnsmasq in front of nsd).

Topology (two namespaces, one veth pair):

    [srv]  r0 10.77.0.53  (the resolver)  ====veth====  lan0 [lan]
           10.77.0.54 authoritative nsd, 10.77.1.1.. clients (one address each)

The capture runs on r0, the resolver's only interface: it sees clients -> resolver and
resolver -> authoritative traffic.
"""
from __future__ import annotations

import math
import random
import socket
import threading
import time
from pathlib import Path

import dns.message
import dns.rdatatype

from .core import (ADDED_DETECTORS, ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, join_all,
                   stall_group, start_threads, wait_for)

RESOLVER = "10.77.0.53"
AUTH = "10.77.0.54"
ZONE = "corp.example"
HERD_NAME = "api.corp.example"
HERD_TTL = 10
USE_EVERY = 0.05  # a client needs the address every 50 ms


def client_addr(i: int) -> str:
    return f"10.77.1.{i + 1}"


def _zone_text(n_hosts: int) -> str:
    lines = [
        "$ORIGIN corp.example.",
        "$TTL 300",
        "@ IN SOA ns1.corp.example. hostmaster.corp.example. 2024010101 3600 600 86400 30",
        "@ IN NS ns1.corp.example.",
        f"ns1 IN A {AUTH}",
        f"api {HERD_TTL} IN A 10.77.9.10",
    ]
    lines += [f"host{i} 5 IN A 10.77.8.{i % 250 + 1}" for i in range(n_hosts)]
    return "\n".join(lines) + "\n"


def _setup(lab: Lab, n_clients: int):
    srv = lab.netns("srv")
    lan = lab.netns("lan")
    lab.veth(srv, "r0", lan, "lan0")
    srv.ip("addr", "add", f"{RESOLVER}/16", "dev", "r0")
    lan.ip("addr", "add", f"{AUTH}/16", "dev", "lan0")
    for i in range(n_clients):
        lan.ip("addr", "add", f"{client_addr(i)}/16", "dev", "lan0")
    return srv, lan


def start_nsd(lab: Lab, lan, n_hosts: int, extra: str = ""):
    """Start nsd, the zone's authoritative server, on AUTH with ``n_hosts`` host records (and ``extra`` zone lines)."""
    d = lab.workdir / "nsd"
    d.mkdir(exist_ok=True)
    (d / "corp.example.zone").write_text(_zone_text(n_hosts) + extra)
    conf = d / "nsd.conf"
    conf.write_text(f"""server:
    ip-address: {AUTH}
    port: 53
    username: ""
    chroot: ""
    zonesdir: "{d}"
    database: ""
    pidfile: "{d}/nsd.pid"
    xfrdfile: "{d}/xfrd.state"
    zonelistfile: "{d}/zone.list"
    server-count: 1
    verbosity: 1
    hide-version: yes
    do-ip6: no
remote-control:
    control-enable: no
zone:
    name: "{ZONE}"
    zonefile: "corp.example.zone"
""")
    p = lab.spawn(lan, "nsd", ["nsd", "-d", "-c", str(conf)])
    wait_for(lambda: probe(lan, AUTH, "ns1.corp.example", rd=False), 10, "nsd to answer")
    return p


def start_unbound(lab: Lab, srv):
    """Start unbound, a caching resolver forwarding the zone to AUTH, on RESOLVER."""
    d = lab.workdir / "unbound"
    d.mkdir(exist_ok=True)
    conf = d / "unbound.conf"
    conf.write_text(f"""server:
    interface: {RESOLVER}
    outgoing-interface: {RESOLVER}
    port: 53
    do-daemonize: no
    username: ""
    chroot: ""
    directory: "{d}"
    pidfile: "{d}/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: 1
    num-threads: 1
    do-ip6: no
    access-control: 10.77.0.0/16 allow
    module-config: "iterator"
    do-not-query-localhost: no
    qname-minimisation: no
    prefetch: no
    serve-expired: no
    cache-min-ttl: 0
    minimal-responses: yes
stub-zone:
    name: "{ZONE}"
    stub-addr: {AUTH}
remote-control:
    control-enable: no
""")
    p = lab.spawn(srv, "unbound", ["unbound", "-d", "-c", str(conf)])
    return p


def start_dnsmasq(lab: Lab, srv, cache_size: int = 0):
    """Start dnsmasq, a forwarder for the zone to AUTH with ``cache_size`` entries (0: no cache), on RESOLVER."""
    d = lab.workdir / "dnsmasq"
    d.mkdir(exist_ok=True)
    argv = ["dnsmasq", "--keep-in-foreground", "--log-facility=-", "--no-resolv", "--no-hosts",
            "--no-poll", f"--pid-file={d}/dnsmasq.pid", "--user=root", "--group=root",
            f"--listen-address={RESOLVER}", "--bind-interfaces", "--except-interface=lo",
            f"--server=/{ZONE}/{AUTH}", f"--cache-size={cache_size}", "--dns-forward-max=1000",
            "--log-queries=extra"]
    return lab.spawn(srv, "dnsmasq", argv)


def probe(ns, server: str, name: str, rd: bool = True, src: str | None = None) -> bool:
    """True when ``server`` answers an A query for ``name`` with NOERROR (from ``src``, inside namespace ``ns``)."""
    with ns:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if src:
            s.bind((src, 0))
        q = dns.message.make_query(name, "A")
        if not rd:
            q.flags &= ~dns.flags.RD
        s.settimeout(0.5)
        s.sendto(q.to_wire(), (server, 53))
        data, _ = s.recvfrom(4096)
        return dns.message.from_wire(data).rcode() == 0
    except OSError:
        return False
    finally:
        s.close()


import dns.flags  # noqa: E402  (after the helpers so the import order reads naturally)


class Stub:
    """One client's UDP socket, bound to its own address (created inside the lan namespace)."""

    def __init__(self, ns, src: str):
        with ns:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((src, 0))
        self.src = src

    def query(self, name: str, timeout: float):
        q = dns.message.make_query(name, "A")
        t0 = time.time()
        self.sock.settimeout(timeout)
        self.sock.sendto(q.to_wire(), (RESOLVER, 53))
        while True:
            try:
                data, _ = self.sock.recvfrom(4096)
            except socket.timeout:
                return t0, None, None
            r = dns.message.from_wire(data)
            if r.id != q.id:
                continue  # a late answer to an earlier try
            ttl = min((rr.ttl for rr in r.answer), default=None)
            return t0, time.time(), (r.rcode(), ttl)


# --------------------------------------------------------------------------- TTL herd
def run_ttl_herd(lab: Lab, out: Path, healthy: bool, n_clients: int = 60, rounds: int = 3,
                 seed: int = 5) -> dict:
    rng = random.Random(seed)
    srv, lan = _setup(lab, n_clients)
    start_nsd(lab, lan, 0)
    start_unbound(lab, srv)
    wait_for(lambda: probe(lan, RESOLVER, "ns1.corp.example", src=client_addr(0)), 10,
             "unbound to answer")
    time.sleep(1.5)  # let the probe's cache entry age out of the picture (different name anyway)
    fname = "dns-ttl-herd-healthy.pcap" if healthy else "dns-ttl-herd.pcap"
    cap = Capture(lab, srv, "r0", out / fname)
    starts = sorted(rng.uniform(0.3, 6.5) for _ in range(n_clients))
    uses = [rng.uniform(0, USE_EVERY) for _ in range(n_clients)]
    jitter = [[rng.uniform(0.6, 1.0) for _ in range(rounds)] for _ in range(n_clients)]
    log_rows: list[tuple] = []  # (client, round, t_send, t_recv, ttl)
    lock = threading.Lock()
    t_base = time.time()
    stubs = [Stub(lan, client_addr(i)) for i in range(n_clients)]

    def client(i: int):
        # Each client uses the name every USE_EVERY seconds (own phase) through a local cache.
        # Pathological: the cache keeps the entry until the resolver's whole-second expiry
        # (floor(t_recv) + TTL, inclusive), like a time_t based cache; the first use after it
        # asks again, so every client asks within one use-interval of the same instant.
        # Healthy: the same number of lookups, each refresh after a jittered 60-100 % of the
        # record's TTL, so the clients never line up.
        phase = uses[i]
        time.sleep(max(0.0, t_base + starts[i] - time.time()))
        for k in range(rounds + 1):
            t0, t1, res = stubs[i].query(HERD_NAME, 2.0)
            ttl = res[1] if res else None
            with lock:
                log_rows.append((i, k, t0, t1, ttl))
            if k == rounds:
                break
            t1 = t1 or time.time()
            if ttl is None:
                ttl = 1
            if healthy:
                due = t1 + (HERD_TTL + 1) * jitter[i][k]
            else:
                due = math.floor(t1) + ttl + 1
            # next use tick of this client at or after `due`
            n = math.ceil((due - t_base - phase) / USE_EVERY)
            time.sleep(max(0.0, t_base + phase + n * USE_EVERY - time.time()))

    join_all(start_threads(client, n_clients), 120)
    stats = cap.stop()
    for s in stubs:
        s.sock.close()
    t_first = first_packet_time(out / fname)
    return dict(rows=log_rows, t_first=t_first, stats=stats, fname=fname,
                n_clients=n_clients, rounds=rounds, starts=starts)


def herd_rounds(rows, n_clients: int, rounds: int, t_first: float):
    """Group the re-queries by round; per round: first send, spread, distinct clients."""
    res = []
    for k in range(1, rounds + 1):
        ts = sorted(r[2] for r in rows if r[1] == k)
        clients = {r[0] for r in rows if r[1] == k}
        if not ts:
            continue
        res.append(dict(round=k, start_s=round(ts[0] - t_first, 3),
                        spread_ms=round((ts[-1] - ts[0]) * 1000, 1), clients=len(clients),
                        queries=len(ts)))
    return res


def _ttl_list(rows):
    return sorted({r[4] for r in rows if r[4] is not None})


# --------------------------------------------------------------------------- retry storm
STORM_NAME = "db.corp.example"


def run_retry_storm(lab: Lab, out: Path, healthy: bool, n_clients: int = 20,
                    duration: float = 17.0, stop_at: float = 4.0, stop_for: float = 6.0,
                    timeout: float = 0.25, seed: int = 7) -> dict:
    """dnsmasq forwards (no cache) to nsd; nsd is SIGSTOPped for `stop_for` seconds.

    Every client looks up STORM_NAME once a second.  Pathological clients resend the same
    query every `timeout` seconds until answered (fixed timer, no backoff, no limit); healthy
    clients back off exponentially (x2 per try, jittered 0.5-1.5, capped at 4 s).
    """
    rng = random.Random(seed)
    srv, lan = _setup(lab, n_clients)
    nsd = start_nsd(lab, lan, 0, extra="db 5 IN A 10.77.9.20\n")
    start_dnsmasq(lab, srv)
    wait_for(lambda: probe(lan, RESOLVER, STORM_NAME, src=client_addr(0)), 10,
             "dnsmasq to answer")
    time.sleep(1.0)
    fname = "dns-retry-storm-healthy.pcap" if healthy else "dns-retry-storm.pcap"
    cap = Capture(lab, srv, "r0", out / fname)
    phases = [rng.uniform(0, 1.0) for _ in range(n_clients)]
    jit = random.Random(seed + 1)
    rows: list[tuple] = []  # (client, lookup, try, t_send, answered_at or None)
    lock = threading.Lock()
    stubs = [Stub(lan, client_addr(i)) for i in range(n_clients)]
    t_base = time.time()
    t_end = t_base + duration

    def client(i: int):
        st = stubs[i]
        lookup = 0
        while True:
            due = t_base + phases[i] + lookup * 1.0
            if due > t_end - 1.0:
                break
            time.sleep(max(0.0, due - time.time()))
            q = dns.message.make_query(STORM_NAME, "A")
            wire = q.to_wire()
            tries, wait = 0, timeout
            while True:
                t0 = time.time()
                st.sock.sendto(wire, (RESOLVER, 53))
                st.sock.settimeout(wait)
                got = None
                deadline = t0 + wait
                while got is None:
                    st.sock.settimeout(max(0.001, deadline - time.time()))
                    try:
                        data, _ = st.sock.recvfrom(4096)
                    except socket.timeout:
                        break
                    if dns.message.from_wire(data).id == q.id:
                        got = time.time()
                with lock:
                    rows.append((i, lookup, tries, t0, got))
                if got is not None or time.time() > t_end + 5:
                    break
                tries += 1
                if healthy:
                    with lock:
                        wait = min(4.0, timeout * (2 ** tries)) * jit.uniform(0.5, 1.5)
            # next tick of the once-a-second schedule that is still ahead (missed ones are skipped)
            lookup = max(lookup + 1, math.ceil(time.time() - t_base - phases[i]))

    threads = start_threads(client, n_clients)
    time.sleep(max(0.0, t_base + stop_at - time.time()))
    t_stop, t_cont = stall_group(nsd, stop_for, "nsd")
    join_all(threads, 60)
    stats = cap.stop()
    for s in stubs:
        s.sock.close()
    t_first = first_packet_time(out / fname)
    return dict(rows=rows, t_first=t_first, t_stop=t_stop, t_cont=t_cont, stats=stats,
                fname=fname, n_clients=n_clients, timeout=timeout)


def storm_summary(r: dict) -> dict:
    rows, t_first = r["rows"], r["t_first"]
    retries = [x for x in rows if x[2] > 0]
    lookups = {(x[0], x[1]) for x in rows}
    unanswered_sends = [x for x in rows if x[4] is None]
    res = dict(clients=r["n_clients"], lookups=len(lookups), sends=len(rows),
               retries=len(retries),
               clients_retrying=len({x[0] for x in retries}),
               max_tries_one_lookup=max((x[2] for x in rows), default=0) + 1,
               upstream_stopped_s=round(r["t_stop"] - t_first, 3),
               upstream_resumed_s=round(r["t_cont"] - t_first, 3),
               timeouts=len(unanswered_sends))
    if retries:
        res["first_retry_s"] = round(min(x[3] for x in retries) - t_first, 3)
        res["last_retry_s"] = round(max(x[3] for x in retries) - t_first, 3)
    return res


# --------------------------------------------------------------------------- manifest entries


def build_ttl_herd(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_ttl_herd(lab, out, healthy)
    rounds = herd_rounds(r["rows"], r["n_clients"], r["rounds"], r["t_first"])
    versions = f"unbound {deb_version('unbound')}, nsd {deb_version('nsd')}"
    made = (f"{versions}. unbound (iterator only, no prefetch, no serve-expired) on 10.77.0.53 "
            f"with a stub-zone corp.example -> nsd on 10.77.0.54; {HERD_NAME} A has TTL "
            f"{HERD_TTL}. {r['n_clients']} clients (dnspython, one UDP socket each, bound to "
            f"10.77.1.1-{r['n_clients']}) start over 0.3-6.5 s, each needing the address every "
            f"{int(USE_EVERY * 1000)} ms through a local cache, {r['rounds'] + 1} lookups each. "
            "Captured with tcpdump on the resolver's veth (full packets, us pcap).")
    entry = dict(file=r["fname"], scenario="dns-ttl-herd", healthy=healthy,
                 twin="dns-ttl-herd.pcap" if healthy else "dns-ttl-herd-healthy.pcap",
                 made_with=made)
    measured = dict(clients=r["n_clients"], ttl_s=HERD_TTL, lookups=len(r["rows"]),
                    failed_lookups=sum(1 for x in r["rows"] if x[3] is None),
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    if healthy:
        entry["what_happened"] = (
            "Same clients, same number of lookups, but each refresh happens after a jittered "
            "60-100 % of the TTL, so the lookups spread over the whole capture; the resolver "
            "refetches the record from nsd once per expiry. No herd.")
        entry["silent"] = list(ALL_DETECTORS)
        spreads = [x["spread_ms"] for x in rounds]
        measured["refresh_spread_ms"] = spreads
        entry["measured"] = measured
        entry["expect"] = []
    else:
        entry["what_happened"] = (
            f"Every client's cache entry for {HERD_NAME} ends at the resolver's whole-second "
            "expiry, so at each expiry all clients ask within one 50 ms use-interval: "
            f"{len(rounds)} herds of {r['n_clients']} distinct clients on 10.77.0.53; unbound "
            "sends one upstream query per herd (it coalesces).")
        entry["silent"] = [d for d in ALL_DETECTORS if d != "herd"]
        entry["measured"] = measured
        entry["expect"] = []
        for x in rounds:
            entry["expect"].append(dict(
                detector="herd", min_severity="medium", start_s=x["start_s"], tolerance_s=0.5,
                client="", server=RESOLVER, resource=HERD_NAME, count=1, count_tolerance=0,
                measured=dict(clients=x["clients"], queries=x["queries"],
                              spread_ms=x["spread_ms"], expiry_round=x["round"])))
    return entry


def build_retry_storm(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_retry_storm(lab, out, healthy)
    s = storm_summary(r)
    versions = f"dnsmasq-base {deb_version('dnsmasq-base')}, nsd {deb_version('nsd')}"
    how = ("fixed 250 ms timer, same query resent until answered, no backoff" if not healthy
           else "exponential backoff from 250 ms, x2 per try, jitter 0.5-1.5, cap 4 s")
    made = (f"{versions}. dnsmasq on 10.77.0.53 as a forwarder without cache "
            f"(--cache-size=0, --server=/corp.example/10.77.0.54) in front of nsd on 10.77.0.54; "
            f"{r['n_clients']} clients (dnspython messages, own UDP sockets bound to "
            f"10.77.1.1-{r['n_clients']}) look up {STORM_NAME} once a second (skipping missed "
            f"ticks); retries: {how}. nsd's process group is SIGSTOPped at "
            f"{s['upstream_stopped_s']} s for 6 s. Captured on the resolver's veth (full "
            "packets, converted to pcapng).")
    entry = dict(file=r["fname"].replace(".pcap", ".pcapng"), scenario="dns-retry-storm",
                 healthy=healthy,
                 twin="dns-retry-storm.pcapng" if healthy else "dns-retry-storm-healthy.pcapng",
                 made_with=made, pcapng=True)
    s["capture_dropped"] = r["stats"].get("dropped_by_kernel", -1)
    entry["measured"] = s
    if healthy:
        entry["what_happened"] = (
            f"The same outage: nsd stops answering for 6 s. The clients back off, so only "
            f"{s['retries']} retries in all ({s['max_tries_one_lookup']} tries at most for one "
            "lookup); dnsmasq forwards each of them. No storm.")
        entry["silent"] = [d for d in ALL_DETECTORS if d != "herd"]
        entry["expect"] = []
    else:
        entry["what_happened"] = (
            f"nsd stops answering at {s['upstream_stopped_s']} s; each of the "
            f"{s['clients_retrying']} clients resends its query every 250 ms until answered: "
            f"{s['retries']} retries ({s['max_tries_one_lookup']} tries for one lookup at most) "
            "from the first at "
            f"{s.get('first_retry_s')} s to the last at {s.get('last_retry_s')} s; dnsmasq forwards "
            "every retry upstream and, after nsd resumes at "
            f"{s['upstream_resumed_s']} s, answers the backlog (with ICMP port unreachable for "
            "upstream answers to ports it had closed).")
        entry["silent"] = ["smb_break_queue", "tcp_stall", "toctou", "conn_churn", *ADDED_DETECTORS]
        entry["expect"] = [dict(
            detector="retry_storm", min_severity="medium", start_s=s.get("first_retry_s", 0.0),
            tolerance_s=1.0, client="", server=RESOLVER, resource=STORM_NAME, count=1,
            count_tolerance=1,
            measured=dict(clients=s["clients_retrying"], retries=s["retries"],
                          retry_interval_ms=int(r["timeout"] * 1000),
                          end_s=s.get("last_retry_s", 0.0),
                          upstream_down_s=[s["upstream_stopped_s"], s["upstream_resumed_s"]]))]
    return entry
