"""Evaluation DNS scenarios (samples/make_eval.py): TTL-expiry herds the detectors were not
tuned to, with other server software and other client populations than samples/make_real.py.

* ``run_herd(..., resolver="bind")``: BIND 9 (named, recursive, static-stub) in front of nsd,
  the authoritative server 30 ms away (user-space link, realkit/link.py), and the clients are
  **processes on one node**: N forked worker processes on ONE address, each with its own UDP
  socket (own source port), all re-asking the name at the resolver's expiry, so that every one
  of them waits on the same upstream fetch (all outstanding at once).
* ``run_herd(..., resolver="dnsmasq")``: dnsmasq as a caching forwarder in front of nsd on the
  same veth, clients on many addresses (one socket each), population swept 5 / 50 / 500.

Topology (BIND, one node)::

    [lan] 10.77.1.1 (all workers) ==veth== r0 [srv] 10.77.0.53 named   u0 ==link.py 30 ms== u1 [auth] 10.77.0.54 nsd

Topology (dnsmasq, many hosts): as samples/realkit/scen_dns.py (nsd on the lan side, 10.77.0.54).
The capture runs on r0, the resolver's interface towards the clients.

Clients cache the answer like a time_t based cache (until floor(t_recv) + TTL + 1, the
resolver's whole-second expiry) and need the name every ``use_every`` seconds (own phase), so
at each expiry all of them ask within one use interval.  Healthy twins refresh after a
jittered 60-100 % of the TTL instead.
"""
from __future__ import annotations

import json
import math
import os
import random
import select
import signal
import struct
import sys
import time
from pathlib import Path

from . import facts, scen_dns
from .core import ADDED_DETECTORS, Lab, deb_version, first_packet_time, wait_for
from .eval_common import (ALL_DETECTORS, add_addresses, capture, capture_name, healthy_twin, new_entry,
                          pathological)
from .scen_dns import AUTH, RESOLVER, probe, start_dnsmasq, start_nsd, Stub

UPSTREAM_DELAY_MS = 30.0   # one-way delay resolver <-> authoritative in the BIND scenario


def addr(block: int, i: int) -> str:
    """Client address i (0-based) in 10.77.<block>.x, spilling into the next /24s."""
    return f"10.77.{block + i // 250}.{i % 250 + 1}"


# --------------------------------------------------------------------------- servers
def start_named(lab: Lab, srv) -> object:
    d = lab.workdir / "named"
    d.mkdir(exist_ok=True)
    conf = d / "named.conf"
    conf.write_text(f"""options {{
    directory "{d}";
    pid-file "{d}/named.pid";
    session-keyfile "{d}/session.key";
    managed-keys-directory "{d}";
    listen-on port 53 {{ {RESOLVER}; }};
    listen-on-v6 {{ none; }};
    query-source address {RESOLVER};
    recursion yes;
    allow-query {{ any; }};
    allow-recursion {{ any; }};
    dnssec-validation no;
    prefetch 0;
    stale-answer-enable no;
    clients-per-query 0;
    max-clients-per-query 0;
    minimal-responses yes;
    notify no;
}};
zone "{scen_dns.ZONE}" {{
    type static-stub;
    server-addresses {{ {AUTH}; }};
}};
""")
    return lab.spawn(srv, "named", ["named", "-g", "-n", "1", "-c", str(conf)])


# --------------------------------------------------------------------------- topology
def _setup_bind(lab: Lab, n_addrs: int, delay_ms: float):
    srv = lab.netns("srv")
    lan = lab.netns("lan")
    auth = lab.netns("auth")
    lab.veth(srv, "r0", lan, "lan0")
    srv.ip("addr", "add", f"{RESOLVER}/16", "dev", "r0")
    add_addresses(lan, "lan0", [addr(1, i) for i in range(n_addrs)])
    link = lab.spawn(None, "link", [sys.executable, str(Path(__file__).with_name("link.py")),
                                    "--ns-a", srv.name, "--tap-a", "u0", "--ns-b", auth.name,
                                    "--tap-b", "u1", "--delay-ms", str(delay_ms)])
    wait_for(lambda: "ready" in lab.logtail("link"), 10, "link to come up")
    srv.ip("link", "set", "u0", "up")
    auth.ip("link", "set", "u1", "up")
    auth.ip("addr", "add", f"{AUTH}/32", "dev", "u1")
    auth.ip("route", "add", f"{RESOLVER}/32", "dev", "u1")
    srv.ip("route", "add", f"{AUTH}/32", "dev", "u0")
    return srv, lan, auth, link


def _setup_flat(lab: Lab, n_addrs: int):
    srv = lab.netns("srv")
    lan = lab.netns("lan")
    lab.veth(srv, "r0", lan, "lan0")
    srv.ip("addr", "add", f"{RESOLVER}/16", "dev", "r0")
    add_addresses(lan, "lan0", [AUTH] + [addr(1, i) for i in range(n_addrs)])
    return srv, lan


# --------------------------------------------------------------------------- clients
def _client_loop(stub: Stub, name: str, t_base: float, start: float, phase: float,
                 use_every: float, rounds: int, healthy: bool, jitter: list[float],
                 ttl_default: int) -> list[list]:
    """One client: look the name up, cache it, ask again at expiry. Rows:
    [round, t_send, t_recv or None, ttl or None, rcode or None]."""
    rows = []
    time.sleep(max(0.0, t_base + start - time.time()))
    for k in range(rounds + 1):
        t0, t1, res = stub.query(name, 2.0)
        ttl = res[1] if res else None
        rows.append([k, t0, t1, ttl, res[0] if res else None])
        if k == rounds:
            break
        nxt = _next_due(healthy, t1 or time.time(), ttl if ttl is not None else 1, jitter[k],
                        ttl_default, t_base, phase, use_every)
        time.sleep(max(0.0, nxt - time.time()))
    return rows


def _run_forked(stubs, args_for, timeout: float) -> list[list]:
    """Each client in a process of its own (os.fork; the child inherits its socket), rows sent
    back as one JSON line per child through a pipe. Children are waited for by PID."""
    rfd, wfd = os.pipe()
    pids = []
    for i, st in enumerate(stubs):
        pid = os.fork()
        if pid == 0:  # child
            code = 0
            try:
                os.close(rfd)
                rows = _client_loop(st, *args_for(i))
                os.write(wfd, (json.dumps([i, st.sock.getsockname()[1], rows]) + "\n").encode())
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(wfd)
    buf = bytearray()
    deadline = time.time() + timeout
    while time.time() < deadline:
        r, _, _ = select.select([rfd], [], [], 1.0)
        if r:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            buf += chunk
    os.close(rfd)
    for pid in pids:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if not done:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    out = []
    for line in buf.decode().splitlines():
        i, port, rows = json.loads(line)
        out += [[i, port] + r for r in rows]
    return out


def _next_due(healthy: bool, t1: float, ttl: int, jitter: float, ttl_default: int,
              t_base: float, phase: float, use_every: float) -> float:
    """When a client next asks: its next use tick after its cached answer runs out. Healthy:
    after a jittered share of TTL+1 s; pathological: at the resolver's whole-second expiry
    (floor(t_recv) + TTL + 1, like a time_t based cache)."""
    due = t1 + (ttl_default + 1) * jitter if healthy else math.floor(t1) + ttl + 1
    n = math.ceil((due - t_base - phase) / use_every)
    return t_base + phase + n * use_every


def _run_eventloop(stubs, args_for, timeout: float) -> list[list]:
    """Every client (one socket each, own address) driven by one thread: an epoll loop with a
    schedule of due times, so that hundreds of clients keep their timing (threads would queue
    on the interpreter lock and smear a 50 ms herd over a second). Same logic as _client_loop."""
    import heapq
    import selectors
    import socket as _socket

    import dns.message
    sel = selectors.DefaultSelector()
    for i, st in enumerate(stubs):
        st.sock.setblocking(False)
        sel.register(st.sock, selectors.EVENT_READ, i)
    args = [args_for(i) for i in range(len(stubs))]
    heap = [(a[1] + a[2], i) for i, a in enumerate(args)]     # (due, client)
    heapq.heapify(heap)
    pending: dict[int, tuple] = {}                             # client -> (qid, t0, deadline)
    k_of = [0] * len(stubs)
    rows: list[list] = []
    t_stop = time.time() + timeout
    # one query message per name, a fresh ID per send (cheaper than building each query)
    templates = {a[0]: dns.message.make_query(a[0], "A").to_wire() for a in args}
    rnd = random.Random(len(stubs))

    def finish(i: int, t0: float, t1, ttl, rcode) -> None:
        name, t_base, _, phase, use_every, rounds, healthy, jitter, ttl_default = args[i]
        k = k_of[i]
        rows.append([i, stubs[i].sock.getsockname()[1], k, t0, t1, ttl, rcode])
        if k == rounds:
            return
        k_of[i] = k + 1
        heapq.heappush(heap, (_next_due(healthy, t1 or time.time(), ttl if ttl is not None else 1,
                                        jitter[k], ttl_default, t_base, phase, use_every), i))

    while (heap or pending) and time.time() < t_stop:
        now = time.time()
        while heap and heap[0][0] <= now:
            _, i = heapq.heappop(heap)
            qid = rnd.randrange(65536)
            t0 = time.time()
            stubs[i].sock.sendto(struct.pack("!H", qid) + templates[args[i][0]][2:], (RESOLVER, 53))
            pending[i] = (qid, t0, t0 + 2.0)
        cands = [p[2] for p in pending.values()] + ([heap[0][0]] if heap else [])
        nxt = min(cands) if cands else now + 0.2
        for key, _ in sel.select(max(0.0, min(nxt, now + 0.2) - time.time())):
            i = key.data
            while True:
                try:
                    data = stubs[i].sock.recv(4096)
                except (BlockingIOError, _socket.timeout):
                    break
                t1 = time.time()
                if i not in pending:
                    continue
                r = dns.message.from_wire(data)
                qid, t0, _ = pending[i]
                if r.id != qid:
                    continue
                del pending[i]
                finish(i, t0, t1, min((rr.ttl for rr in r.answer), default=None), r.rcode())
        now = time.time()
        for i in [i for i, p in pending.items() if p[2] <= now]:
            _, t0, _ = pending.pop(i)
            finish(i, t0, None, None, None)
    sel.close()
    return rows


def run_herd(lab: Lab, out: Path, fname: str, healthy: bool, resolver: str, n_addrs: int,
             per_addr: int, processes: bool, rounds: int, name: str, ttl: int,
             use_every: float, start_window: tuple, seed: int) -> dict:
    rng = random.Random(seed)
    n = n_addrs * per_addr
    link = None
    if resolver == "bind":
        srv, lan, auth, link = _setup_bind(lab, n_addrs, UPSTREAM_DELAY_MS)
        start_nsd(lab, auth, 0, extra=f"{name.split('.')[0]} {ttl} IN A 10.77.9.11\n")
        start_named(lab, srv)
    else:
        srv, lan = _setup_flat(lab, n_addrs)
        start_nsd(lab, lan, 0, extra=f"{name.split('.')[0]} {ttl} IN A 10.77.9.11\n")
        start_dnsmasq(lab, srv, cache_size=1000)
    wait_for(lambda: probe(lan, RESOLVER, "ns1.corp.example", src=addr(1, 0)), 20,
             f"{resolver} to answer")
    time.sleep(1.0)
    cap = capture(lab, srv, "r0", out / fname)
    stubs = [Stub(lan, addr(1, i // per_addr)) for i in range(n)]
    starts = [rng.uniform(*start_window) for _ in range(n)]
    phases = [rng.uniform(0, use_every) for _ in range(n)]
    jit = [[rng.uniform(0.6, 1.0) for _ in range(rounds)] for _ in range(n)]
    t_base = time.time() + 0.5

    def args_for(i):
        return (name, t_base, starts[i], phases[i], use_every, rounds, healthy, jit[i], ttl)

    timeout = start_window[1] + (rounds + 1) * (ttl + 4) + 20
    rows = (_run_forked if processes else _run_eventloop)(stubs, args_for, timeout)
    stats = cap.stop()
    for s in stubs:
        s.sock.close()
    if link is not None:
        lab.stop(link)
    return dict(rows=rows, t_first=first_packet_time(out / fname), stats=stats, fname=fname,
                n=n, n_addrs=n_addrs, per_addr=per_addr, rounds=rounds, name=name, ttl=ttl,
                use_every=use_every, resolver=resolver, processes=processes,
                start_window=start_window)


def max_outstanding(rows) -> int:
    """Most client queries waiting for their answer at one instant (from the clients' logs)."""
    ev = []
    for r in rows:
        if r[4] is not None:
            ev += [(r[3], 1), (r[4], -1)]
    best = cur = 0
    for _, d in sorted(ev, key=lambda e: (e[0], e[1])):
        cur += d
        best = max(best, cur)
    return best


CORE_SHARE = 0.9   # spread_ms: the shortest interval holding this share of a round's queries


def rounds_of(r: dict) -> list[dict]:
    """Per re-query round (1..rounds): first send, spread (of the core CORE_SHARE of the
    queries: a client starved of CPU, or one whose first answer came from another fetch, must
    not stretch a 50 ms herd to a second; full_spread_ms is first to last), clients,
    addresses, outstanding."""
    res = []
    for k in range(1, r["rounds"] + 1):
        rr = [x for x in r["rows"] if x[2] == k]
        if not rr:
            continue
        ts = sorted(x[3] for x in rr)
        lat = sorted((x[4] - x[3]) * 1000 for x in rr if x[4] is not None)
        m = math.ceil(CORE_SHARE * len(ts))
        core = min(ts[i + m - 1] - ts[i] for i in range(len(ts) - m + 1))
        res.append(dict(round=k, start_s=round(ts[0] - r["t_first"], 3),
                        end_s=round(ts[-1] - r["t_first"], 3),
                        spread_ms=round(core * 1000, 1), core_share=CORE_SHARE,
                        full_spread_ms=round((ts[-1] - ts[0]) * 1000, 1),
                        clients=len({x[0] for x in rr}),
                        addresses=len({x[0] // r["per_addr"] for x in rr}), queries=len(rr),
                        max_outstanding=max_outstanding(rr),
                        client_median_wait_ms=round(lat[len(lat) // 2], 2) if lat else -1.0,
                        client_max_wait_ms=round(lat[-1], 2) if lat else -1.0))
    return res


# --------------------------------------------------------------------------- manifest entries
def _versions(resolver: str) -> str:
    if resolver == "bind":
        return f"bind9 {deb_version('bind9')}, nsd {deb_version('nsd')}"
    return f"dnsmasq-base {deb_version('dnsmasq-base')}, nsd {deb_version('nsd')}"


def entry_for(r: dict, scenario: str, healthy: bool, twin: str | None = None,
              sweep: dict | None = None, min_severity: str = "medium",
              below_high: list[str] = ()) -> dict:
    rd = rounds_of(r)
    n, t0 = r["n"], r["t_first"]
    if r["resolver"] == "bind":
        topo = (f"BIND 9 named (recursive, static-stub {scen_dns.ZONE} -> nsd, prefetch 0, no "
                "stale answers, clients-per-query 0 = unlimited) on 10.77.0.53; nsd on "
                f"10.77.0.54 behind a user-space link with {UPSTREAM_DELAY_MS:g} ms one-way delay")
    else:
        topo = ("dnsmasq on 10.77.0.53 as a caching forwarder (--cache-size=1000, "
                f"--server=/{scen_dns.ZONE}/10.77.0.54) in front of nsd on 10.77.0.54 (same veth)")
    if r["per_addr"] > 1:
        who = (f"{n} client {'processes' if r['processes'] else 'threads'} (forked from one "
               f"driver, dnspython messages) on ONE address {addr(1, 0)}, each with its own UDP "
               "socket (own source port)")
    else:
        who = (f"{n} clients (dnspython messages, one UDP socket each, all driven by one epoll "
               f"loop so that they keep their timing) on {n} addresses "
               f"{addr(1, 0)}-{addr(1, n - 1)}")
    sw = r["start_window"]
    refresh = ("refresh after a jittered 60-100 % of TTL+1 s" if healthy else
               "cache until the resolver's whole-second expiry (floor(t_recv) + TTL + 1), like a "
               "time_t based cache")
    made = (f"{_versions(r['resolver'])}. {topo}; {r['name']} A has TTL {r['ttl']}. {who} start "
            f"over {sw[0]:g}-{sw[1]:g} s, each needing the address every "
            f"{r['use_every'] * 1000:g} ms through a local cache ({refresh}), "
            f"{r['rounds'] + 1} lookups each. Captured with tcpdump on the resolver's interface "
            "towards the clients (whole frames, -s 2048, us pcap).")
    rows = r["rows"]
    measured = dict(clients=n, addresses=r["n_addrs"], source_ports=len({(x[0], x[1]) for x in rows}),
                    ttl_s=r["ttl"], lookups=len(rows),
                    failed_lookups=sum(1 for x in rows if x[4] is None),
                    servfail=sum(1 for x in rows if x[6] not in (None, 0)),
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = new_entry(scenario, healthy, made, twin=twin, **({"sweep": sweep} if sweep else {}),
                      measured=measured)
    if healthy:
        measured["refresh_spread_ms"] = [x["spread_ms"] for x in rd]
        measured["max_outstanding"] = max_outstanding(rows)
        return healthy_twin(entry, (
            f"The same {n} clients and lookups, but every refresh comes after a jittered 60-100 % "
            "of the TTL, so the re-queries spread over the capture (at most "
            f"{measured['max_outstanding']} queries outstanding at once). No herd."))
    spread = max(x["spread_ms"] for x in rd)
    outst = min(x["max_outstanding"] for x in rd)
    what = (
        f"At each of the resolver's expiries of {r['name']} all {n} clients ask again, "
        f"{CORE_SHARE:.0%} of them within {spread:.0f} ms ({len(rd)} herds); "
        + (f"they wait on the resolver's one upstream fetch, at least {outst} queries outstanding "
           "at once in every herd" if r["resolver"] == "bind" else
           f"at least {outst} queries outstanding at once in every herd")
        + (f", all from one address ({r['per_addr']} source ports)." if r["per_addr"] > 1 else "."))
    expect = []
    for x in rd:
        expect.append(dict(
            detector="herd", kind="dns", min_severity=min_severity, start_s=x["start_s"],
            tolerance_s=0.5, client=addr(1, 0) if r["per_addr"] > 1 else "", server=RESOLVER,
            resource=r["name"], count=1, count_tolerance=0 if min_severity != "informational" else 1,
            measured=dict(clients=x["clients"], addresses=x["addresses"], queries=x["queries"],
                          spread_ms=x["spread_ms"], full_spread_ms=x["full_spread_ms"],
                          max_outstanding=x["max_outstanding"],
                          client_median_wait_ms=x["client_median_wait_ms"],
                          client_max_wait_ms=x["client_max_wait_ms"], expiry_round=x["round"],
                          end_s=x["end_s"])))
    return pathological(entry, what, silent=[d for d in ALL_DETECTORS if d != "herd"], expect=expect,
                        below_high=below_high)


# --------------------------------------------------------------------------- scenarios
ONE_NODE = dict(resolver="bind", n_addrs=1, per_addr=150, processes=True, rounds=3,
                name="flags.corp.example", ttl=10, use_every=0.02, start_window=(0.3, 9.0))


def build_onenode(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "dns-onenode-herd-bind"
    r = run_herd(lab, out, capture_name(scen, healthy), healthy, seed=21, **ONE_NODE)
    return entry_for(r, scen, healthy)


def _sweep(n: int, rounds: int):
    def build(lab: Lab, out: Path, healthy: bool) -> dict:
        scen = f"dns-herd-dnsmasq-{n}"
        r = run_herd(lab, out, capture_name(scen, healthy), healthy, resolver="dnsmasq", n_addrs=n, per_addr=1,
                     processes=False, rounds=rounds, name="cfg.corp.example", ttl=8,
                     use_every=0.05, start_window=(0.3, 7.5), seed=100 + n)
        # 5 clients re-asking together is a herd by construction but harmless: a point of the
        # operating curve (may fire, must not be >= high); 50 and 500 must be >= medium.
        floor = "informational" if n < 20 else "medium"
        return entry_for(r, scen, healthy, twin="" if n < 20 else None,
                         sweep=dict(variable="clients", value=n), min_severity=floor,
                         below_high=["herd"] if n < 20 else [])
    return build


build_sweep_5 = _sweep(5, 3)
build_sweep_50 = _sweep(50, 3)
build_sweep_500 = _sweep(500, 2)


def tshark_facts(entry: dict, path) -> dict:
    """What tshark sees: client streams and addresses asking the resolver for the herd name,
    the largest number of distinct streams within 100 ms, and the bursts of them (for the
    retry storm: samples/realkit/facts.py's retry-storm facts)."""
    if "storm" in entry["scenario"]:
        return facts.dns_retry_storm(path)
    name = entry["expect"][0]["resource"] if entry["expect"] else ""
    if not name:
        name = "flags.corp.example" if "bind" in entry["scenario"] else "cfg.corp.example"
    rows = facts.tshark_rows(path, f'dns.flags.response == 0 && ip.dst == {RESOLVER} && '
                             f'!icmp && dns.qry.name == "{name}"',
                             ["frame.time_relative", "ip.src", "udp.srcport"])
    ev = [(float(r[0]), f"{r[1]}:{r[2]}") for r in rows]
    n = entry["measured"]["clients"]
    ans = facts.tshark_rows(path, f'dns.flags.response == 1 && ip.src == {RESOLVER} && !icmp && '
                            f'dns.qry.name == "{name}"', ["dns.time"])
    rt = sorted(float(r[0]) * 1000 for r in ans if r[0])
    return dict(queries=len(ev), client_streams=len({k for _, k in ev}),
                client_addresses=len({r[1] for r in rows}),
                max_streams_in_100ms=facts.max_distinct_in_window(ev, 0.1),
                bursts_half_the_clients_in_100ms=len(facts.bursts(ev, 0.1, max(2, n // 2), gap=0.5)),
                resolver_median_response_ms=round(rt[len(rt) // 2], 3) if rt else -1.0,
                resolver_max_response_ms=round(rt[-1], 3) if rt else -1.0)


# --------------------------------------------------------------------------- retry storm, unbound
STORM = dict(n_clients=30, duration=18.0, stop_at=4.0, stop_for=8.0, timeout=0.2, seed=61)


def build_storm_unbound(lab: Lab, out: Path, healthy: bool) -> dict:
    """realkit/scen_dns.py's retry storm (clients resend on a fixed timer while nsd is
    SIGSTOPped) with unbound (caching, iterator) as the resolver instead of dnsmasq, 30
    clients, a 200 ms timer and an 8 s outage. scen_dns.run_retry_storm starts its resolver
    through scen_dns.start_dnsmasq; that name is pointed at scen_dns.start_unbound for the
    duration of the call (and restored after it)."""
    scen = "dns-retry-storm-unbound"
    fname = capture_name(scen, healthy)
    saved = scen_dns.start_dnsmasq
    scen_dns.start_dnsmasq = lambda lab_, srv, cache_size=0: scen_dns.start_unbound(lab_, srv)
    try:
        r = scen_dns.run_retry_storm(lab, out, healthy, **STORM)
    finally:
        scen_dns.start_dnsmasq = saved
    (out / r["fname"]).rename(out / fname)
    s = scen_dns.storm_summary(r)
    s["capture_dropped"] = r["stats"].get("dropped_by_kernel", -1)
    how = ("fixed 200 ms timer, same query resent until answered, no backoff" if not healthy
           else "exponential backoff from 200 ms, x2 per try, jitter 0.5-1.5, cap 4 s")
    made = (f"unbound {deb_version('unbound')}, nsd {deb_version('nsd')}. unbound on 10.77.0.53 "
            "(iterator, cache, stub-zone corp.example -> nsd on 10.77.0.54, as in "
            f"samples/realkit/scen_dns.py) instead of dnsmasq; {r['n_clients']} clients "
            "(dnspython messages, own UDP sockets bound to 10.77.1.1-"
            f"{r['n_clients']}) look up {scen_dns.STORM_NAME} (TTL 5) once a second; retries: {how}. "
            f"nsd's process group is SIGSTOPped at {s['upstream_stopped_s']} s for "
            f"{STORM['stop_for']:g} s. Captured on the resolver's veth (full packets, us pcap).")
    entry = new_entry(scen, healthy, made, measured=s)
    if healthy:
        return healthy_twin(entry, (
            f"The same outage; unbound serves its cached answer until the TTL runs out, then the "
            f"clients back off: {s['retries']} retries in all ({s['max_tries_one_lookup']} tries "
            "at most for one lookup). No storm."), silent=[d for d in ALL_DETECTORS if d != "herd"])
    return pathological(entry, (
        f"nsd stops answering at {s['upstream_stopped_s']} s; once unbound's cached answer "
        f"expires, the {s['clients_retrying']} clients resend every 200 ms until answered: "
        f"{s['retries']} retries ({s['max_tries_one_lookup']} tries for one lookup at most) from "
        f"{s.get('first_retry_s')} s to {s.get('last_retry_s')} s; nsd resumes at "
        f"{s['upstream_resumed_s']} s."),
        silent=["smb_break_queue", "tcp_stall", "toctou", "conn_churn", *ADDED_DETECTORS], expect=[dict(
            detector="retry_storm", kind="dns", min_severity="medium",
            start_s=s.get("first_retry_s", 0.0), tolerance_s=1.0, client="", server=RESOLVER,
            resource=scen_dns.STORM_NAME, count=1, count_tolerance=1,
            measured=dict(clients=s["clients_retrying"], retries=s["retries"],
                          retry_interval_ms=int(r["timeout"] * 1000), end_s=s.get("last_retry_s", 0.0),
                          upstream_down_s=[s["upstream_stopped_s"], s["upstream_resumed_s"]]))])
    entry["what_happened"] = (
        f"nsd stops answering at {s['upstream_stopped_s']} s; once unbound's cached answer "
        f"expires, the {s['clients_retrying']} clients resend every 200 ms until answered: "
        f"{s['retries']} retries ({s['max_tries_one_lookup']} tries for one lookup at most) from "
        f"{s.get('first_retry_s')} s to {s.get('last_retry_s')} s; nsd resumes at "
        f"{s['upstream_resumed_s']} s.")
    entry["silent"] = ["smb_break_queue", "tcp_stall", "toctou", "conn_churn", *ADDED_DETECTORS]
    entry["below_high"] = []
    entry["expect"] = [dict(
        detector="retry_storm", kind="dns", min_severity="medium",
        start_s=s.get("first_retry_s", 0.0), tolerance_s=1.0, client="", server=RESOLVER,
        resource=scen_dns.STORM_NAME, count=1, count_tolerance=1,
        measured=dict(clients=s["clients_retrying"], retries=s["retries"],
                      retry_interval_ms=int(r["timeout"] * 1000), end_s=s.get("last_retry_s", 0.0),
                      upstream_down_s=[s["upstream_stopped_s"], s["upstream_resumed_s"]]))]
    return entry
