"""Generated captures of herds from ONE node: many processes (or containers) on one address, each with
its own source port, asking the same thing at once. Built with samples/synth.py's encoders (real
DNS and Kerberos bytes, TCP handshakes and teardown), written as pcap.

- :func:`dns_one_node_herd`: ``n`` processes on 10.5.0.7 each cached api.corp.example.com A (a
  resolver hands the record out with its TTL counting down, so every copy runs out at the same
  instant) and re-ask it within ``spread_ns`` of the expiry, each from its own UDP port; the
  resolver's upstream refresh keeps all of them outstanding at once. Other hosts ask other names
  all along (the server's normal latency and the key's normal rate).
- :func:`krb_one_node_herd`: ``n`` parallel ``kinit`` on 10.6.0.9 within ``spread_ns`` (AS-REQ ->
  PREAUTH_REQUIRED -> AS-REQ with PA-ENC-TIMESTAMP -> AS-REP, a new port or TCP connection per
  exchange), the KDC serving one request at a time; a few other hosts log in now and then.
- ``*_single_stream``: the same requests, but from ONE port, one after the other (one stream):
  not a herd.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "samples"))

import synth  # noqa: E402
from synth import MS, SEC, US  # noqa: E402

NAME = "api.corp.example.com"


def _gen(seed: int) -> synth.Gen:
    g = synth.Gen(seed, synth.MIN_PACKETS)
    g.zone[NAME] = synth.Zone(NAME, ["10.0.2.50"], [], 60)
    return g


def _host(ip: str, *, windows: bool = False, rtt: int = 60 * US) -> synth.Host:
    return synth.Host(ip, windows=windows, local=False, rtt=rtt, port=40000)


def _dns(g: synth.Gen, t: int, cli: synth.Host, port: int, name: str, latency: int, ttl: int) -> None:
    q, a = g.udp_pair(cli, g.dns, port, 53)
    txid = g.rng.getrandbits(16)
    g.store.udp(t, q, g.dns_query(txid, name, synth.T_A, False))
    g.store.udp(t + latency, a, g.dns_answer(txid, name, synth.T_A, False, ttl))


def _background_dns(g: synth.Gen, until: int) -> None:
    """Other hosts asking other names every 100 ms, answered in 100-300 µs."""
    others = [_host(f"10.2.0.{10 + k}") for k in range(20)]
    names = [n for n in g._names if n != NAME][:30]
    t, k = 50 * MS, 0
    while t < until:
        cli = others[k % len(others)]
        _dns(g, t, cli, cli.ephemeral(), names[k % len(names)], g.rng.randrange(100 * US, 300 * US), 300)
        t += 100 * MS
        k += 1


def dns_one_node_herd(path: str, n: int = 150, spread_ns: int = 30 * MS, ttl_s: int = 60, seed: int = 1,
                      single_stream: bool = False) -> str:
    g = _gen(seed)
    node = _host("10.5.0.7")
    ports = [20000 + 7 * k for k in range(n)]
    # the first asks, spread over 30 s (sequential, 5 a second), each answer's TTL counting down to
    # one expiry instant
    expiry = 2 * SEC + ttl_s * SEC
    for k in range(n):
        t = 2 * SEC + k * (30 * SEC // n)
        left = max(1, (expiry - t) // SEC)
        _dns(g, t, node, ports[k] if not single_stream else 20000, NAME, 200 * US, left)
    r = g.rng
    arrivals = sorted(expiry + int(spread_ns * r.random() ** 2) for _ in range(n))
    if single_stream:  # one port, each query after the previous answer (one stream, no herd)
        t = expiry
        for _ in range(n):
            _dns(g, t, node, 20000, NAME, 200 * US, ttl_s)
            t += 400 * US
    else:
        upstream = arrivals[0] + 12 * MS  # the resolver refreshes once; every process waits for it
        busy = upstream
        for k, ta in enumerate(arrivals):
            busy = max(busy, ta) + r.randrange(20 * US, 60 * US)
            _dns(g, ta, node, ports[k], NAME, busy - ta, ttl_s)
    _background_dns(g, expiry + 3 * SEC)
    synth.write_capture(g, path, "pcap", nanosecond=True)
    return path


def _kinit(g: synth.Gen, t: int, cli: synth.Host, kdc: synth.Host, user: str, tcp: bool, kdc_free: list[int],
           work: int) -> int:
    """One kinit: AS-REQ -> PREAUTH_REQUIRED -> AS-REQ + PA-ENC-TIMESTAMP -> AS-REP; the KDC serves
    one request at a time (``kdc_free[0]``: when it is next free). Returns the end."""
    r = g.rng
    start = max(kdc_free[0], t) + r.randrange(40 * US, 90 * US)
    kdc_free[0] = start
    t2 = g.krb_xchg(t, cli, kdc, g.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), False),
                    lambda tt: g.krb_preauth_required(user, tt), start - t + 50 * US, tcp)
    t2 += r.randrange(200 * US, 500 * US)
    done = max(kdc_free[0], t2) + work
    kdc_free[0] = done
    return g.krb_xchg(t2, cli, kdc, g.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), True),
                      lambda tt: g.krb_as_rep(user, tcp), done - t2, tcp)


def krb_one_node_herd(path: str, n: int = 60, spread_ns: int = 500 * MS, tcp: bool = False, seed: int = 2,
                      single_stream: bool = False) -> str:
    g = _gen(seed)
    kdc = g.dc1
    node = _host("10.6.0.9", rtt=80 * US)
    r = g.rng
    free = [0]
    # other hosts log in now and then (one every 2 s): the key's normal rate and the KDC's latency
    t = 100 * MS
    others = [_host(f"10.1.9.{10 + k}", windows=True) for k in range(20)]
    herd_at = 30 * SEC
    k = 0
    while t < herd_at + 5 * SEC:
        if not herd_at - 100 * MS <= t <= herd_at + spread_ns + 2 * SEC:
            cli = others[k % len(others)]
            _kinit(g, t, cli, kdc, g.user_for(cli), tcp, [0], r.randrange(1 * MS, 2 * MS))
        t += 2 * SEC
        k += 1
    users = [f"job{k:03d}" for k in range(n)]
    if single_stream:
        t = herd_at
        for u in users:
            t = _kinit(g, t, node, kdc, u, tcp, free, 1 * MS) + 100 * US
    else:
        for u, ta in zip(users, sorted(herd_at + int(spread_ns * r.random() ** 1.5) for _ in users)):
            _kinit(g, ta, node, kdc, u, tcp, free, r.randrange(2 * MS, 4 * MS))
    synth.write_capture(g, path, "pcap", nanosecond=True)
    return path
