"""A cascade: a DNS TTL-expiry herd at a stalled resolver releases a Kerberos AS herd at the KDC.

Issue 17 ("the incident timeline"): a herd on one service causes a storm on another, and the
timeline must put the cause first.  Here the cause is DNS and the effect Kerberos, on the same
client hosts:

    [srv]  r0 10.77.0.53 unbound (resolver), 10.77.0.88 MIT krb5kdc  ====veth====  lan0 [lan]
           10.77.0.54 nsd (authoritative for corp.example), clients 10.77.2.1..N

Every client host needs the KDC's address before each login: it resolves ``kdc.corp.example``
(TTL ``KDC_TTL``) at the resolver with dnspython's stub resolver (its own timeout and lifetime,
source address the client's), through a local cache, then runs Debian's ``kinit`` against the address
it got (a krb5.conf per client naming that address; kinit runs under the client's uid, whose
policy route gives it the client's source address, as in realkit/scen_krb.py).

Pathological: the local caches keep the answer until the resolver's whole-second expiry (a
time_t cache, as in realkit/scen_dns.py's herd), so at expiry every client asks within one
use-interval: a DNS herd.  The resolver's record has expired too and its upstream nsd is stalled
(SIGSTOP of its process group, ``STALL_S`` seconds, from just before the herd; this kernel has no
sch_netem for a delay): unbound holds all the herd's queries and answers them together when nsd
resumes, and every client starts its kinit at that instant: a Kerberos AS herd at the KDC, one
stall later.  Healthy twin: the same clients, lookups and logins, each refresh after a jittered
60-100 % of the TTL, and nsd answering at once: no herd anywhere.

The capture runs on r0: clients -> resolver, resolver -> nsd and clients -> KDC all cross it.
"""
from __future__ import annotations

import math
import os
import random
import subprocess
import threading
import time
from pathlib import Path

import dns.exception
import dns.resolver
import dns.version

from .core import (ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, join_all, log, stall_group,
                   start_threads, wait_for)
from .scen_dns import AUTH, RESOLVER, probe, start_nsd, start_unbound
from .scen_krb import KDC, REALM, UID0, client_addr, start_mit_kdc, write_krb5_conf

KDC_NAME = "kdc.corp.example"
KDC_TTL = 10             # s, the TTL of KDC_NAME's A record
USE_EVERY_S = 0.05       # a client needs the KDC's address every 50 ms (its own phase)
STALL_S = 1.5            # s nsd is stopped for, from STALL_LEAD_S before the herd
STALL_LEAD_S = 0.3
DNS_TIMEOUT_S = 2.0      # dnspython's defaults: per try ...
DNS_LIFETIME_S = 5.0     # ... and for the whole lookup
START_SPREAD_S = (0.3, 7.0)  # the clients' first lookups
AS_PRINCIPAL = f"krbtgt/{REALM}@{REALM}"


def _topology(lab: Lab, n_clients: int):
    """(srv, lan): resolver and KDC on r0 in srv, nsd and the clients on lan0 in lan; every client
    uid routes to the KDC from its own address."""
    lab.workdir.chmod(0o711)
    srv = lab.netns("srv")
    lan = lab.netns("lan")
    lab.veth(srv, "r0", lan, "lan0")
    srv.ip("addr", "add", f"{RESOLVER}/16", "dev", "r0")
    srv.ip("addr", "add", f"{KDC}/16", "dev", "r0")
    lan.ip("addr", "add", f"{AUTH}/16", "dev", "lan0")
    for i in range(n_clients):
        lan.ip("addr", "add", f"{client_addr(i)}/16", "dev", "lan0")
        table = str(100 + i)
        lan.ip("route", "add", f"{KDC}/32", "dev", "lan0", "src", client_addr(i), "table", table)
        lan.ip("rule", "add", "uidrange", f"{UID0 + i}-{UID0 + i}", "lookup", table)
    return srv, lan


def _resolver(src: str) -> dns.resolver.Resolver:
    r = dns.resolver.Resolver(configure=False)
    r.nameservers = [RESOLVER]
    r.timeout, r.lifetime = DNS_TIMEOUT_S, DNS_LIFETIME_S
    r.cache = None          # the client's cache is the caller's (below)
    return r


def run_cascade(lab: Lab, out: Path, healthy: bool, n_clients: int = 40, seed: int = 17) -> dict:
    rng = random.Random(seed)
    srv, lan = _topology(lab, n_clients)
    nsd = start_nsd(lab, lan, 0, extra=f"kdc {KDC_TTL} IN A {KDC}\n")
    start_unbound(lab, srv)
    wait_for(lambda: probe(lan, RESOLVER, "ns1.corp.example", src=client_addr(0)), 10, "unbound to answer")
    users = [(f"user{i + 1:02d}", f"Pw-{i + 1:02d}-{rng.randrange(10**6):06d}") for i in range(n_clients)]
    kdc_cmds = [f"addprinc -pw {pw} +requires_preauth {u}" for u, pw in users]
    start_mit_kdc(lab, srv, lab.workdir / "kdc", kdc_cmds, "hsreal-master-pw")
    cdir = lab.workdir / "clients"
    cdir.mkdir(mode=0o755)
    cdir.chmod(0o755)
    for i in range(n_clients):
        cc = cdir / f"cc{i}"
        cc.mkdir(mode=0o700)
        os.chown(cc, UID0 + i, UID0 + i)
    time.sleep(1.0)
    fname = "cascade-dns-krb5-healthy.pcap" if healthy else "cascade-dns-krb5.pcap"
    cap = Capture(lab, srv, "r0", out / fname)
    starts = [rng.uniform(*START_SPREAD_S) for _ in range(n_clients)]
    phases = [rng.uniform(0, USE_EVERY_S) for _ in range(n_clients)]
    jitter = [rng.uniform(0.6, 1.0) for _ in range(n_clients)]
    lookups: list[tuple] = []   # (client, round, t_send, t_answer or None, ttl, address)
    logins: list[tuple] = []    # (client, round, t_start, t_end, rc)
    lock = threading.Lock()
    due_at: dict[int, float] = {}
    t_base = time.time()

    def login(i: int, k: int, address: str) -> None:
        uid = UID0 + i
        conf = cdir / f"krb5-{i}.conf"
        write_krb5_conf(conf, tcp=False, kdc=address)
        env = {"KRB5_CONFIG": str(conf), "KRB5CCNAME": f"FILE:{cdir}/cc{i}/ccache", "HOME": str(cdir / f"cc{i}"),
               "PATH": "/usr/bin:/bin", "LANG": "C"}

        # setpriv, not a preexec_fn: without one Python spawns with vfork, so 40 clients released at once
        # start their kinit within a few ms of each other instead of queueing behind 40 full forks
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "kinit", f"{users[i][0]}@{REALM}"]
        t0 = time.time()
        p = subprocess.run(argv, input=users[i][1] + "\n", env=env, capture_output=True, text=True, timeout=60)
        with lock:
            logins.append((i, k, t0, time.time(), p.returncode))

    def client(i: int) -> None:
        # resolve (through the local cache), log in with the address; twice: the first login and the
        # one after the cached answer ran out
        res = _resolver(client_addr(i))
        time.sleep(max(0.0, t_base + starts[i] - time.time()))
        with lan:
            for k in range(2):
                t0 = time.time()
                try:
                    ans = res.resolve(KDC_NAME, "A", source=client_addr(i), search=False)
                    t1, ttl, address = time.time(), ans.rrset.ttl, ans[0].address
                except dns.exception.DNSException as e:
                    log(f"client {i} lookup {k}: {e}")
                    t1, ttl, address = None, None, None
                with lock:
                    lookups.append((i, k, t0, t1, ttl, address))
                if address:
                    login(i, k, address)
                if k == 1:
                    break
                t1 = t1 or time.time()
                ttl = KDC_TTL if ttl is None else ttl
                # pathological: kept until the whole-second expiry (floor(t) + TTL + 1, time_t cache);
                # healthy: refreshed after a jittered 60-100 % of the TTL
                due = t1 + (KDC_TTL + 1) * jitter[i] if healthy else math.floor(t1) + ttl + 1
                n = math.ceil((due - t_base - phases[i]) / USE_EVERY_S)
                due = t_base + phases[i] + n * USE_EVERY_S   # the first use at or after it
                with lock:
                    due_at[i] = due
                time.sleep(max(0.0, due - time.time()))

    threads = start_threads(client, n_clients)
    t_stop = t_cont = None
    if not healthy:
        # stall nsd from just before the herd (the clients' common expiry) for STALL_S
        wait_for(lambda: len(due_at) == n_clients, 30, "every client's first login")
        herd_at = min(due_at.values())
        time.sleep(max(0.0, herd_at - STALL_LEAD_S - time.time()))
        t_stop, t_cont = stall_group(nsd, STALL_S, "nsd")
    join_all(threads, 90)
    time.sleep(0.5)
    stats = cap.stop()
    return dict(lookups=sorted(lookups), logins=sorted(logins), t_first=first_packet_time(out / fname),
                t_stop=t_stop, t_cont=t_cont, stats=stats, fname=fname, n_clients=n_clients)


def _round(rows: list[tuple], k: int, col: int) -> list[float]:
    return sorted(r[col] for r in rows if r[1] == k and r[col] is not None)


def summary(r: dict) -> dict:
    """What the clients logged, in seconds after the capture's first packet."""
    t0, lk, li = r["t_first"], r["lookups"], r["logins"]
    s = dict(clients=r["n_clients"], ttl_s=KDC_TTL, lookups=len(lk), failed_lookups=sum(1 for x in lk if x[3] is None),
             logins=len(li), failed_logins=sum(1 for x in li if x[4] != 0),
             capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    for k, name in ((0, "first"), (1, "refresh")):
        sends, answers, kinits = _round(lk, k, 2), _round(lk, k, 3), _round(li, k, 2)
        if not sends:
            continue
        s[f"{name}_lookup_s"] = [round(sends[0] - t0, 3), round(sends[-1] - t0, 3)]
        s[f"{name}_lookup_spread_ms"] = round((sends[-1] - sends[0]) * 1000, 1)
        waits = sorted(a - b for a, b in ((x[3], x[2]) for x in lk if x[1] == k and x[3] is not None))
        if waits:
            s[f"{name}_lookup_wait_ms"] = [round(waits[0] * 1000, 1), round(waits[len(waits) // 2] * 1000, 1),
                                          round(waits[-1] * 1000, 1)]
        if answers:
            s[f"{name}_answers_received_spread_ms"] = round((answers[-1] - answers[0]) * 1000, 1)
        if kinits:
            s[f"{name}_kinit_s"] = [round(kinits[0] - t0, 3), round(kinits[-1] - t0, 3)]
            s[f"{name}_kinit_spread_ms"] = round((kinits[-1] - kinits[0]) * 1000, 1)
    if r["t_stop"] is not None:
        s["upstream_stalled_s"] = [round(r["t_stop"] - t0, 3), round(r["t_cont"] - t0, 3)]
    return s


def build_cascade(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_cascade(lab, out, healthy)
    s = summary(r)
    n = r["n_clients"]
    versions = (f"unbound {deb_version('unbound')}, nsd {deb_version('nsd')}, krb5-kdc {deb_version('krb5-kdc')}, "
                f"krb5-user (kinit) {deb_version('krb5-user')}, dnspython {dns.version.version}")
    made = (f"{versions}. unbound (iterator, no prefetch, no serve-expired) on {RESOLVER} with a stub-zone "
            f"corp.example -> nsd on {AUTH}; MIT krb5kdc for {REALM} on {KDC} (UDP and TCP 88, pre-authentication "
            f"required). {n} client hosts ({client_addr(0)}-{n}): each resolves {KDC_NAME} (A, TTL {KDC_TTL}) with "
            f"dnspython's stub resolver (timeout {DNS_TIMEOUT_S:g} s, lifetime {DNS_LIFETIME_S:g} s, from its own "
            f"address) through a local cache and then runs kinit (UDP) against the address it got, under its own "
            f"uid (setpriv) routed from its own address; first lookups over {START_SPREAD_S[0]}-{START_SPREAD_S[1]} s, one "
            "refresh each. "
            + ("Refresh after a jittered 60-100 % of the TTL; nsd answers at once." if healthy else
               f"The local cache keeps the answer to the resolver's whole-second expiry; nsd's process group is "
               f"SIGSTOPped {STALL_LEAD_S} s before the clients' common expiry for {STALL_S} s.")
            + " Captured with tcpdump on the resolver's and KDC's veth (full packets, us pcap).")
    entry = dict(file=r["fname"], scenario="cascade-dns-krb5", healthy=healthy,
                 twin="cascade-dns-krb5.pcap" if healthy else "cascade-dns-krb5-healthy.pcap",
                 made_with=made, measured=s)
    if healthy:
        entry["what_happened"] = (
            f"The same {n} clients, {s['lookups']} lookups and {s['logins']} logins, but each refresh comes after a "
            f"jittered 60-100 % of the TTL (refresh lookups spread over {s.get('refresh_lookup_spread_ms', 0):.0f} ms) "
            f"and nsd answers at once (refresh lookups waited {s.get('refresh_lookup_wait_ms', ['?'] * 3)[2]} ms at "
            "most): the resolver and the KDC see a few clients at a time. No herd, no cascade.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
        return entry
    dns_start, krb_start = s["refresh_lookup_s"][0], s["refresh_kinit_s"][0]
    entry["what_happened"] = (
        f"At the resolver's whole-second expiry of {KDC_NAME} all {n} clients ask again within "
        f"{s['refresh_lookup_spread_ms']:.0f} ms (from {dns_start} s): a DNS TTL herd on {RESOLVER}. The "
        f"resolver's record has expired too and nsd is stalled ({s['upstream_stalled_s'][0]}-"
        f"{s['upstream_stalled_s'][1]} s), so unbound holds every query (waits {s['refresh_lookup_wait_ms'][0]:.0f}-"
        f"{s['refresh_lookup_wait_ms'][2]:.0f} ms, median {s['refresh_lookup_wait_ms'][1]:.0f} ms; unbound resends "
        f"upstream meanwhile) and answers them all when nsd resumes; every client starts kinit at once: "
        f"{n} kinit within {s['refresh_kinit_spread_ms']:.0f} ms from {krb_start} s, a Kerberos AS herd on "
        f"{KDC} ({krb_start - dns_start:.2f} s after the DNS herd, from the same {n} client addresses). "
        f"{s['failed_logins']} logins failed.")
    entry["silent"] = [d for d in ALL_DETECTORS if d != "herd"]
    entry["expect"] = [
        dict(detector="herd", kind="dns", min_severity="medium", start_s=dns_start, tolerance_s=0.5, client="",
             server=RESOLVER, resource=KDC_NAME, count=1, count_tolerance=0,
             measured=dict(clients=n, spread_ms=s["refresh_lookup_spread_ms"],
                           wait_ms_max=s["refresh_lookup_wait_ms"][2])),
        dict(detector="herd", kind="kerberos", min_severity="medium", start_s=krb_start, tolerance_s=0.5, client="",
             server=KDC, resource=AS_PRINCIPAL, count=1, count_tolerance=0,
             measured=dict(clients=n, spread_ms=s["refresh_kinit_spread_ms"])),
    ]
    # the causal chain, cause first: tests/test_cascade_sample.py checks the incident timeline against it
    entry["cascade"] = dict(
        cause="herd/dns", cause_server=RESOLVER, cause_resource=KDC_NAME,
        effects=["herd/kerberos"], effect_servers=[KDC], effect_resources=[AS_PRINCIPAL],
        shared_clients=n, lag_s=round(krb_start - dns_start, 3),
        mechanism=(f"the clients need {KDC_NAME} before each login; the resolver answers the herd only when its "
                   "stalled upstream resumes, so the logins start together"))
    return entry

