#!/usr/bin/env python3
"""Small labelled synthetic captures for parameter sweeps, and the large mixed capture with losses.

    python samples/synth_scenarios.py list [--quick]
    python samples/synth_scenarios.py write --out DIR [--quick] [--only NAME ...]
    python samples/synth_scenarios.py mixed --packets 1000000 --out big.pcap [--syn-loss 0.01] [--tail-loss 0.005]

Built on ``samples/synth.py`` (its site of hosts, its DNS/Kerberos/LDAP encoders, its TCP model and
its writer); nothing here changes what ``synth.py`` itself writes. Every scenario is one small µs
pcap of a single mechanism on top of light normal background (answered DNS lookups, short HTTP
sessions), deterministic (its seed is a CRC of its name), and carries its ground truth *as data*: a
record with the keys of ``samples/MANIFEST.toml``'s ``[[capture]]`` (``file``, ``scenario``,
``healthy``, ``silent``, ``expect`` with ``detector``, ``min_severity``, ``start_s``,
``tolerance_s``, ``server``, ``resource``, ``count``, ``count_tolerance``) plus ``kind`` and
``pathology`` per expectation and ``sweep``, ``param``, ``value`` per capture. ``write`` puts the
records in ``DIR/MANIFEST.json``; ``tests/benchmarks/evaluate.py`` reads them like the real manifest.

Families (the builders below; :data:`SWEEPS` lists the swept points):

* ``dns_herd``: N clients (distinct hosts, or one address with one socket per process) cache one
  name; the resolver's entry gives them all the same expiry, so they re-ask within ``spread_ms`` of
  it, ``rounds`` times. Healthy twin: the same lookups, each refresh after a jittered 60-100 % of
  the TTL (prefetch), so they stay spread out.
* ``krb_herd``: N clients log on (AS exchange with PREAUTH round trip) or ask for one service
  ticket (TGS) within ``spread_ms``, over UDP or TCP 88. Healthy twin: the same exchanges spread
  over the capture.
* ``ldap_churn``: ``hosts`` clients open a new connection (connect, bind, one search, unbind) per
  request, the service taking ``rate_per_s`` new connections a second. Healthy twin: the same
  requests at the same times over one pooled connection per host.
* ``retry_storm``: N clients, first asking over ``start_spread_ms``, resend an unanswered DNS query
  or Kerberos AS-REQ every ``interval_ms`` (times ``backoff`` per try, +-``jitter``). Healthy twin:
  answered at once.
* ``tcp_loss``: connections on a path of ``rtt_ms`` of which a share loses the first SYN (resent
  after the 1 s initial RTO, RFC 6298 2.1) or the tail segment of a response (resent after an RTO of
  ``max(200 ms, 3 RTT)`` or ``rto_ms``). Healthy twin: no loss.

Ground truth (the evaluation's definition of "a pathology", documented thresholds, not detector
parameters): see :data:`TRUTH`. A point below a pathology floor is ``pathology = None`` (grey: it is
on the operating curve but not in the confusion table); a TCP timer within ``proportionate_rtts``
RTTs of the path is RFC 6298 working as designed, so that point is a healthy twin (nothing >= high).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth as S  # noqa: E402

US, MS, SEC = S.US, S.MS, S.SEC
DETECTORS = S.DETECTORS

TRUTH = {
    "herd_min_clients": 50,        # >= this many clients within herd_max_spread_ms: a herd that must be found
    "herd_max_spread_ms": 1000,
    "churn_min_rate_per_s": 20.0,  # connection per request at >= this service rate: churn that must be found
    "retry_min_clients": 10,       # >= this many clients resending: a storm that must be found
    "tcp_min_stall_ms": 100,       # a timer wait of >= this ...
    "tcp_min_rtts": 100,           # ... and >= this many RTTs: out of proportion, must be found
    "tcp_proportionate_rtts": 25,  # a wait of <= this many RTTs is the timer working as designed
}


# -- shared pieces -------------------------------------------------------------------------------

def _clients(g: S.Gen, n: int, one_host: bool) -> list[tuple[S.Host, int | None]]:
    """n clients: distinct workstations, or processes of one Linux node (each its own port)."""
    if one_host:
        h = g.lnx[0]
        return [(h, 33000 + i) for i in range(n)]
    pool = g.ws[:2000] + g.lnx[1:200]      # ws[2000:] and lnx[200:] are background hosts
    return [(h, None) for h in g.rng.sample(pool, n)]


def _exchanges(g: S.Gen, c: S.Tcp, t: int, n: int, tail_rto: int | None = None) -> tuple[int, int | None]:
    """n small HTTP request/response exchanges on an open connection from t; with ``tail_rto`` the
    first response's tail segment is lost and resent that much later. Returns (time, loss time)."""
    r, lost = g.rng, None
    for j in range(n):
        req = f"GET /api/v1/items/{r.randrange(100000)} HTTP/1.1\r\nHost: {c.srv.name}\r\n\r\n".encode()
        size = r.randrange(300, 4000)
        rsp = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode() + g.payload(size)
        tail = tail_rto is not None and j == 0
        t = c.send(c.send(t, 0, req) + r.randrange(100 * US, 400 * US), 1, rsp, loss="rto" if tail else None,
                   rto=tail_rto if tail else None)
        if tail:
            lost = c.last_loss[0]
        t += r.randrange(1 * MS, 30 * MS)
    return t, lost


def _background(g: S.Gen, duration: int, lookups: int = 150, sessions: int = 8) -> None:
    """Ordinary traffic from hosts no scenario uses (lnx[200:]): answered lookups, short LAN HTTP."""
    r = g.rng
    pool = g.lnx[200:]
    for _ in range(lookups):
        g.dns_udp(r.randrange(0, duration), r.choice(pool))
    for _ in range(sessions):
        c = S.Tcp(g, r.choice(pool), r.choice(g.apps[4:]), 8080)
        t, _ = _exchanges(g, c, c.open(r.randrange(0, max(1, duration - 2 * SEC))), r.randrange(1, 4))
        c.close(t, 0)


def _lookup(g: S.Gen, t: int, cli: S.Host, port: int | None, srv: S.Host, name: str, ttl_s: int | None,
            svc: int) -> int:
    """One A query at t answered svc later (ttl_s None: unanswered); returns the answer time."""
    r = g.rng
    q, a = g.udp_pair(cli, srv, port or r.randrange(49152, 65536), 53)
    txid, edns = r.getrandbits(16), not cli.windows
    g.store.udp(t, q, g.dns_query(txid, name, S.T_A, edns))
    if ttl_s is not None:
        g.store.udp(t + svc, a, g.dns_answer(txid, name, S.T_A, edns, ttl_s))
    return t + svc


def _expect(detector: str, kind: str, start: int, first: int, tolerance_s: float, server: str,
            resource: str, pathology: bool | None) -> dict:
    return {"detector": detector, "kind": kind, "min_severity": "medium",
            "start_s": round((start - first) / SEC, 6), "tolerance_s": tolerance_s, "client": "",
            "server": server, "resource": resource, "count": 1, "count_tolerance": 0, "pathology": pathology}


# -- the families ----------------------------------------------------------------------------------
# Each builder adds its packets to g.store and returns (episodes, either, healthy, pathology, what):
# episodes = [(detector, kind, start_ns, tolerance_s, server, resource)]; ``either``: detectors whose
# findings are a correct reading too (neither expected nor silent); every other detector is silent.

def dns_herd(g: S.Gen, *, clients: int, sync: bool = True, one_host: bool = False, spread_ms: float = 50.0,
             ttl_s: int = 10, rounds: int = 2):
    r, srv, name = g.rng, g.dns, g.herd_name
    g.zone[name] = S.Zone(name, ["10.0.2.50"], [], ttl_s)
    ttl, spread = ttl_s * SEC, int(spread_ms * MS)
    cl = _clients(g, clients, one_host)
    t0 = 1 * SEC
    expiry = t0 + ttl
    episodes = []
    firsts = [t0 + r.randrange(0, ttl - 300 * MS) for _ in cl]
    for (cli, port), t in zip(cl, firsts):      # first lookups: cache misses spread over one TTL
        left = max(1, round((expiry - t) / SEC)) if sync else ttl_s
        _lookup(g, t, cli, port, srv, name, left, r.randrange(25 * US, 250 * US))
    if sync:
        for _ in range(rounds):
            arrivals = sorted(expiry + int(spread * r.random()) for _ in cl)
            upstream = arrivals[0] + r.randrange(5 * MS, 15 * MS)     # one refetch, then a burst of answers
            busy = 0
            for (cli, port), ta in zip(cl, arrivals):
                busy = max(busy, upstream, ta) + r.randrange(6 * US, 14 * US)
                _lookup(g, ta, cli, port, srv, name, ttl_s, busy - ta)
            episodes.append(("herd", "dns", arrivals[0], 0.5, srv.ip, name))
            expiry = upstream + ttl
    else:
        end = expiry + rounds * ttl
        for (cli, port), t in zip(cl, firsts):
            for _ in range(rounds):
                t += int(ttl * (0.6 + 0.4 * r.random()))
                if t < end:
                    _lookup(g, t, cli, port, srv, name, ttl_s, r.randrange(25 * US, 250 * US))
    _background(g, t0 + (rounds + 1) * ttl + 2 * SEC)
    who = f"{clients} processes on {cl[0][0].ip}" if one_host else f"{clients} hosts"
    what = (f"{who} re-ask {name} within {spread_ms:g} ms of its TTL ({ttl_s} s) expiring, {rounds} times"
            if sync else f"{who} refresh {name} after a jittered 60-100 % of its {ttl_s} s TTL: no herd")
    patho = (clients >= TRUTH["herd_min_clients"] and spread_ms <= TRUTH["herd_max_spread_ms"]) or None
    return episodes, (), not sync, patho, what


def _tgs(g: S.Gen, t: int, cli: S.Host, kdc: S.Host, user: str, svc: str, host: str, tcp: bool) -> int:
    """One TGS exchange for svc/host (the request and reply as synth.Gen.krb_logon builds them)."""
    r = g.rng
    sname = S.krb_principal(S.NT_SRV_INST, svc, f"{host}.{S.DOMAIN}")
    tgt = S.krb_ticket(S.REALM, S.krb_principal(S.NT_SRV_INST, "krbtgt", S.REALM), r.randbytes(r.randrange(700, 860)))
    req = S.krb_kdc_req(S.KRB_TGS_REQ, [S.krb_padata(S.PA_TGS_REQ, S.krb_ap_req(tgt, r.randbytes(180)))],
                        S.krb_req_body(S.KDC_OPT_TGS, S.REALM, sname, r.randrange(1 << 24, 1 << 31),
                                       etypes=(18, 17, 23)))
    rep = S.krb_kdc_rep(S.KRB_TGS_REP, S.REALM, S.krb_principal(S.NT_PRINCIPAL, user),
                        S.krb_ticket(S.REALM, sname, r.randbytes(r.randrange(650, 800)), 5), r.randbytes(260))
    return g.krb_xchg(t, cli, kdc, req, lambda tt: rep, r.randrange(500 * US, 2500 * US), tcp)


def krb_herd(g: S.Gen, *, clients: int, sync: bool = True, one_host: bool = False, spread_ms: float = 150.0,
             tcp: bool = False, exchange: str = "as", duration_s: int = 20):
    r, kdc = g.rng, g.dc1
    D, T = duration_s * SEC, duration_s * SEC // 2
    cl = _clients(g, clients, one_host)
    for _ in range(8):           # ordinary logons to the same KDC: the key's normal rate
        g.krb_logon(r.randrange(0, D - SEC), r.choice(g.ws[2000:]), tcp=tcp, kdc=kdc, services=[])
    starts = []
    for i, (cli, _) in enumerate(cl):
        user = g.users[i % len(g.users)]
        t = T + int(spread_ms * MS * r.random()) if sync else r.randrange(SEC, D - 2 * SEC)
        starts.append(t)
        if exchange == "as":
            g.krb_logon(t, cli, tcp=tcp, kdc=kdc, user=user, services=[])
        else:
            g.krb_logon(r.randrange(0, T - SEC), cli, tcp=tcp, kdc=kdc, user=user, services=[])
            _tgs(g, t, cli, kdc, user, "HTTP", "app", tcp)
    _background(g, D)
    resource = f"krbtgt/{S.REALM}" if exchange == "as" else f"HTTP/app.{S.DOMAIN}"
    episodes = [("herd", "kerberos", min(starts), 0.5, kdc.ip, resource)] if sync else []
    who = f"{clients} processes on {cl[0][0].ip}" if one_host else f"{clients} hosts"
    what = (f"{who} send {exchange.upper()}-REQs ({'TCP' if tcp else 'UDP'}) for {resource} to {kdc.ip} "
            + (f"within {spread_ms:g} ms" if sync else f"spread over {duration_s - 3} s: no herd"))
    patho = (clients >= TRUTH["herd_min_clients"] and spread_ms <= TRUTH["herd_max_spread_ms"]) or None
    return episodes, (), not sync, patho, what


def ldap_churn(g: S.Gen, *, hosts: int, rate_per_s: float, per_host: int = 10, pooled: bool = False,
               one_host: bool = False):
    r, srv = g.rng, g.dc1
    cl = [h for h, _ in _clients(g, hosts, False)] if not one_host else [g.lnx[0]]
    n = per_host * hosts
    t0, t, times = 1 * SEC, 1 * SEC, []
    for _ in range(n):
        times.append(t)
        t += int(r.expovariate(rate_per_s) * SEC) + 50 * US
    owners = [cl[k % len(cl)] for k in range(n)]
    r.shuffle(owners)

    def search(L, tt):
        u = r.choice(g.users)
        return L.search(tt, S.LDAP_BASE, S.f_and(S.f_eq("objectClass", "user"), S.f_eq("sAMAccountName", u)),
                        ["cn", "mail", "memberOf"], [g.ldap_user_entry(u)])

    if pooled:
        per: dict[str, list[int]] = {}
        for h, tk in zip(owners, times):
            per.setdefault(h.ip, []).append(tk)
        for h in cl:
            ts = per.get(h.ip, [])
            if not ts:
                continue
            L = S.Ldap(g, h, srv)
            tt = L.bind(L.c.open(ts[0] - 2 * MS) + 20 * US, f"CN=svc-{h.name},OU=Service Accounts,{S.LDAP_BASE}")
            for tk in ts:
                tt = search(L, max(tk, tt + 20 * US))
            L.unbind_close(tt + 5 * MS)
    else:
        for h, tk in zip(owners, times):
            L = S.Ldap(g, h, srv)
            tt = L.bind(L.c.open(tk) + r.randrange(5 * US, 30 * US),
                        f"CN=svc-{h.name},OU=Service Accounts,{S.LDAP_BASE}")
            L.unbind_close(search(L, tt + r.randrange(5 * US, 30 * US)) + r.randrange(5 * US, 30 * US))
    for _ in range(3):           # ordinary long-lived LDAP sessions of other clients
        g.ldap_session(r.randrange(0, max(1, times[-1] - t0)), r.choice(g.lnx[200:]), 5, (1 * MS, 300 * MS))
    _background(g, times[-1] + 2 * SEC)
    span = (times[-1] - times[0]) / SEC
    episodes = [] if pooled else [("conn_churn", "churn", times[0], 1.0 + hosts / rate_per_s, srv.ip, "")]
    what = (f"{len(cl)} host(s), {n} LDAP searches at {rate_per_s:g}/s over {span:.1f} s, "
            + ("one pooled connection per host: no churn" if pooled
               else "a new connection (bind, search, unbind) each"))
    patho = rate_per_s >= TRUTH["churn_min_rate_per_s"] or None
    return episodes, (), pooled, patho, what


def retry_storm(g: S.Gen, *, clients: int, interval_ms: float = 1000.0, backoff: float = 1.0, attempts: int = 5,
                jitter: float = 0.0, protocol: str = "dns", answered: bool = False, one_host: bool = False,
                start_spread_ms: float = 5000.0):
    r = g.rng
    name = g.storm_name
    g.zone[name] = S.Zone(name, ["203.0.113.77"], [], 60)
    srv = g.dns if protocol == "dns" else g.dc2
    T = 3 * SEC
    first_retry = None
    if protocol == "krb":       # the KDC that does answer: the capture shows the protocol both ways
        for _ in range(6):
            g.krb_logon(r.randrange(0, T), r.choice(g.ws[2000:]), tcp=False, kdc=g.dc1, services=[])
    for i, (cli, port) in enumerate(_clients(g, clients, one_host)):
        t = T + int(start_spread_ms * MS * r.random())     # first asks spread out: a storm, not a herd
        if protocol == "dns":
            if answered:
                _lookup(g, t, cli, port, srv, name, 60, r.randrange(100 * US, 400 * US))
                continue
            q, _ = g.udp_pair(cli, srv, port or r.randrange(49152, 65536), 53)
            payload = g.dns_query(r.getrandbits(16), name, S.T_A, not cli.windows)
        else:
            user = g.users[i % len(g.users)]
            if answered:
                g.krb_logon(t, cli, tcp=False, kdc=srv, user=user, services=[])
                continue
            q, _ = g.udp_pair(cli, srv, port or cli.ephemeral(), 88)
            payload = g.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), False)
        gap = interval_ms * MS
        for k in range(attempts):
            g.store.udp(t, q, payload)
            if k == 1:
                first_retry = t if first_retry is None else min(first_retry, t)
            t += int(gap * (1 + jitter * (2 * r.random() - 1)))
            gap *= backoff
    _background(g, T + int((start_spread_ms + interval_ms * sum(backoff ** k for k in range(attempts))) * MS) + 3 * SEC)
    resource = name if protocol == "dns" else ""        # Kerberos: each client's own principal
    episodes = [] if answered or first_retry is None else [
        ("retry_storm", "dns" if protocol == "dns" else "kerberos", first_retry,
         max(1.0, 2 * interval_ms / 1000), srv.ip, resource)]
    what = (f"{clients} clients ask {srv.ip} ({protocol}) once each and are answered" if answered else
            f"{clients} clients resend an unanswered {protocol} request to {srv.ip} {attempts} times, every "
            f"{interval_ms:g} ms x{backoff:g} per try (jitter {jitter:.0%})")
    patho = clients >= TRUTH["retry_min_clients"] or None
    return episodes, (), answered, patho, what


def tcp_loss(g: S.Gen, *, rtt_ms: float, loss: str = "syn", share: float = 0.05, connections: int = 200,
             servers: int = 1, rto_ms: float | None = None, duration_s: int = 20):
    r = g.rng
    rtt = max(1 * US, int(rtt_ms * MS))
    hosts = [S.Host(f"10.4.{i // 250}.{1 + i % 250}", windows=False, local=False, rtt=rtt,
                    port=r.randrange(32768, 55000)) for i in range(min(connections, 100))]
    srvs = g.apps[:servers]
    starts = sorted(r.randrange(SEC // 2, (duration_s - 3) * SEC) for _ in range(connections))
    lossy = set(r.sample(range(connections), max(1, round(share * connections)))) if share > 0 else set()
    syn_rto = int(rto_ms * MS) if rto_ms is not None else S.SYN_RTO
    waits, first_loss = [], None
    for k, t in enumerate(starts):
        srv = srvs[k % len(srvs)]
        c = S.Tcp(g, hosts[k % len(hosts)], srv, 8080)
        lose = k in lossy
        if lose and loss == "syn":
            first_loss = t if first_loss is None else min(first_loss, t)
            waits.append(syn_rto)
        t = c.open(t, syn_rto=syn_rto if lose and loss == "syn" else None) + r.randrange(5 * US, 50 * US)
        rto = None
        if lose and loss == "tail":
            rto = int(rto_ms * MS) if rto_ms is not None else c.rto()
            waits.append(rto)
        t, lost = _exchanges(g, c, t, 3, rto)
        if lost is not None:
            first_loss = lost if first_loss is None else min(first_loss, lost)
        c.close(t, 0)
    _background(g, duration_s * SEC, sessions=0)
    wait = sorted(waits)[len(waits) // 2] if waits else 0
    rtts = wait / rtt if rtt else 0.0
    healthy = not lossy or rtts <= TRUTH["tcp_proportionate_rtts"]
    patho = (not healthy and wait >= TRUTH["tcp_min_stall_ms"] * MS and rtts >= TRUTH["tcp_min_rtts"]) or None
    episodes = [] if healthy else [("tcp_stall", "rto", first_loss, float(duration_s), srvs[0].ip if servers == 1
                                    else "", "")]
    # a lost SYN is also a retried SYN (retry_storm) and an unanswered one (conn_churn's syn_backlog)
    either = ("retry_storm", "conn_churn") if lossy and loss == "syn" else ()
    what = (f"{connections} connections on a {rtt_ms:g} ms path to {servers} server(s); "
            + (f"{len(lossy)} lose their {'first SYN' if loss == 'syn' else 'first response tail segment'} and wait "
               f"{wait / MS:.0f} ms ({rtts:.0f} RTTs)" if lossy else "no loss"))
    return episodes, either, healthy, patho, what


FAMILIES = {"dns_herd": dns_herd, "krb_herd": krb_herd, "ldap_churn": ldap_churn, "retry_storm": retry_storm,
            "tcp_loss": tcp_loss}


# -- scenarios and sweeps ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Sweep:
    """One parameter of one family varied over ``values`` (ascending) with the rest fixed.
    ``direction``: "up" when the pathology grows with the value (the operating curve is the
    smallest value that fires), "down" when it shrinks (the largest value that still fires)."""
    name: str
    family: str
    param: str
    values: tuple
    base: dict = field(default_factory=dict)
    direction: str = "up"
    quick: tuple = ()


SWEEPS = (
    Sweep("dns_herd_hosts", "dns_herd", "clients", (5, 10, 20, 30, 50, 100, 200, 500), quick=(100,)),
    Sweep("dns_herd_one_host", "dns_herd", "clients", (5, 10, 20, 50, 150, 500), {"one_host": True}, quick=(150,)),
    Sweep("dns_herd_spread", "dns_herd", "spread_ms", (20, 100, 500, 2000, 5000), {"clients": 100}, "down"),
    Sweep("dns_herd_jittered", "dns_herd", "clients", (5, 50, 500), {"sync": False}, quick=(50,)),
    Sweep("dns_herd_one_host_jittered", "dns_herd", "clients", (50, 500), {"sync": False, "one_host": True}),
    Sweep("krb_as_herd_udp", "krb_herd", "clients", (5, 10, 20, 50, 100, 200), quick=(50,)),
    Sweep("krb_as_herd_tcp", "krb_herd", "clients", (10, 50, 100), {"tcp": True}),
    Sweep("krb_as_herd_one_host", "krb_herd", "clients", (10, 60, 200), {"one_host": True}),
    Sweep("krb_as_herd_one_host_tcp", "krb_herd", "clients", (60,), {"one_host": True, "tcp": True}),
    Sweep("krb_tgs_herd", "krb_herd", "clients", (10, 50, 200), {"exchange": "tgs"}),
    Sweep("krb_herd_jittered", "krb_herd", "clients", (50, 200), {"sync": False}, quick=(50,)),
    Sweep("ldap_churn_rate", "ldap_churn", "rate_per_s", (2, 5, 10, 20, 50, 100, 180, 400), {"hosts": 40},
          quick=(180,)),
    Sweep("ldap_churn_hosts", "ldap_churn", "hosts", (1, 5, 10, 40, 100, 200), {"rate_per_s": 180}),
    Sweep("ldap_churn_one_host", "ldap_churn", "rate_per_s", (10, 100), {"hosts": 40, "one_host": True}),
    Sweep("ldap_pooled", "ldap_churn", "hosts", (40, 200), {"rate_per_s": 180, "pooled": True}, quick=(40,)),
    Sweep("retry_storm_clients", "retry_storm", "clients", (1, 3, 10, 30, 100, 300), quick=(30,)),
    Sweep("retry_storm_interval", "retry_storm", "interval_ms", (50, 200, 1000, 3000), {"clients": 30}, "down"),
    Sweep("retry_storm_backoff", "retry_storm", "backoff", (1.0, 1.5, 2.0), {"clients": 30}, "down"),
    Sweep("retry_storm_jitter", "retry_storm", "jitter", (0.0, 0.2, 0.5), {"clients": 30}, "down"),
    Sweep("retry_storm_krb", "retry_storm", "clients", (3, 30), {"protocol": "krb"}),
    Sweep("retry_answered", "retry_storm", "clients", (30, 300), {"answered": True}, quick=(30,)),
    Sweep("tcp_syn_loss_rtt", "tcp_loss", "rtt_ms", (0.04, 0.1, 0.4, 1, 4, 10, 25, 50), {"loss": "syn"}, "down",
          quick=(0.4, 50)),
    Sweep("tcp_tail_loss_rtt", "tcp_loss", "rtt_ms", (0.04, 0.1, 0.4, 1, 4, 10, 25, 50), {"loss": "tail"}, "down",
          quick=(0.1,)),
    Sweep("tcp_tail_stall", "tcp_loss", "rto_ms", (5, 10, 20, 50, 100, 200, 500, 1000),
          {"loss": "tail", "rtt_ms": 0.1}),
    Sweep("tcp_syn_loss_share", "tcp_loss", "share", (0.005, 0.01, 0.05, 0.2), {"loss": "syn", "rtt_ms": 0.4}),
    Sweep("tcp_syn_loss_servers", "tcp_loss", "servers", (4,), {"loss": "syn", "rtt_ms": 0.4, "share": 0.02}),
    Sweep("tcp_no_loss", "tcp_loss", "rtt_ms", (0.04, 0.4, 50), {"share": 0.0}, "down", quick=(0.4,)),
)


@dataclass(frozen=True)
class Scenario:
    name: str
    sweep: str
    family: str
    param: str
    value: float
    options: dict

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())


def scenarios(quick: bool = False, only: list[str] | None = None) -> list[Scenario]:
    """Every swept point (or the quick subset), in SWEEPS order; ``only`` keeps names or sweeps."""
    out = []
    for sw in SWEEPS:
        for v in (sw.quick if quick else sw.values):
            sc = Scenario(f"{sw.name}-{sw.param}-{v:g}", sw.name, sw.family, sw.param, v, {**sw.base, sw.param: v})
            if not only or sc.name in only or sw.name in only:
                out.append(sc)
    return out


def build(sc: Scenario) -> tuple[S.Gen, dict]:
    """Generate the scenario's packets; returns the generator and its ground-truth record."""
    g = S.Gen(sc.seed, S.MIN_PACKETS)
    episodes, either, healthy, patho, what = FAMILIES[sc.family](g, **sc.options)
    first = min(g.store.ts)
    expect = [] if healthy else [_expect(d, k, s, first, tol, srv, res, patho) for d, k, s, tol, srv, res in episodes]
    record = {"file": f"{sc.name}.pcap", "scenario": sc.name, "healthy": healthy, "twin": "",
              "made_with": f"samples/synth_scenarios.py {sc.family} {json.dumps(sc.options, sort_keys=True)} "
                           f"seed={sc.seed}",
              "what_happened": what, "expect": expect,
              "silent": [d for d in DETECTORS if d not in either and (healthy or all(d != e[0] for e in episodes))],
              "sweep": sc.sweep, "param": sc.param, "value": sc.value, "packets": len(g.store)}
    return g, record


def write(sc: Scenario, out_dir: str) -> dict:
    """Write ``out_dir/<name>.pcap`` and return its record (``size_bytes`` added)."""
    g, record = build(sc)
    record["size_bytes"] = S.write_capture(g, os.path.join(out_dir, record["file"]), "pcap", False)
    return record


def mixed(out: str, packets: int, seed: int = 1, syn_loss: float = 0.01, tail_loss: float = 0.005) -> dict:
    """synth.py's mixed capture where ``syn_loss`` of the TCP connections lose their first SYN and
    ``tail_loss`` the tail segment of their first response; writes ``out``, ``out.labels.json``
    (synth.py's labels) and ``out.losses.json`` (every loss: kind, client, port, server, port, ns)."""
    g = S.Gen(seed, packets)
    g.syn_loss_share, g.tail_loss_share = syn_loss, tail_loss      # synth.py's loss hook
    g.build()
    size = S.write_capture(g, out, "pcap", False)
    with open(out + ".labels.json", "w") as f:
        json.dump(S.labels_json(g, False), f, indent=1)
    losses = [dict(zip(("kind", "client", "client_port", "server", "server_port", "t_ns"), x)) for x in g.losses or []]
    for x in losses:
        x["t_ns"] = S.BASE_EPOCH_NS + x["t_ns"]
    with open(out + ".losses.json", "w") as f:
        json.dump(losses, f, indent=0)
    kinds = {k: sum(1 for x in losses if x["kind"] == k) for k in ("syn", "tail")}
    return {"path": out, "packets": len(g.store), "bytes": size, "labels": len(g.labels), "losses": kinds,
            "servers_with_losses": len({(x["server"], x["server_port"]) for x in losses})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="scenario names")
    p.add_argument("--quick", action="store_true")
    p = sub.add_parser("write", help="write the scenario captures and DIR/MANIFEST.json")
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="*")
    p = sub.add_parser("mixed", help="synth.py's mixed capture with SYN and tail losses")
    p.add_argument("--out", required=True)
    p.add_argument("--packets", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--syn-loss", type=float, default=0.01)
    p.add_argument("--tail-loss", type=float, default=0.005)
    a = ap.parse_args(argv)
    if a.cmd == "list":
        for sc in scenarios(a.quick):
            print(sc.name)
        return 0
    if a.cmd == "mixed":
        if not (0 <= a.syn_loss <= 1 and 0 <= a.tail_loss <= 1 and a.syn_loss + a.tail_loss <= 1):
            print("synth_scenarios.py: loss shares must be in [0, 1] and sum to at most 1", file=sys.stderr)
            return 2
        try:
            print(json.dumps(mixed(a.out, a.packets, a.seed, a.syn_loss, a.tail_loss)))
        except ValueError as e:
            print(f"synth_scenarios.py: {e}", file=sys.stderr)
            return 2
        return 0
    os.makedirs(a.out, exist_ok=True)
    records = [write(sc, a.out) for sc in scenarios(a.quick, a.only)]
    with open(os.path.join(a.out, "MANIFEST.json"), "w") as f:
        json.dump({"capture": records}, f, indent=1)
    print(json.dumps({"out": a.out, "captures": len(records), "bytes": sum(r["size_bytes"] for r in records)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
