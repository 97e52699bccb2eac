"""TCP incast (samples/make_real.py ``tcp-incast``; eval variants in eval_incast.py).

One client asks N servers for a block at once (a partition/aggregate round, as a storage or
search front end does); the N answers converge on the client's port of one switch whose queue is
shallow, overflow it, and the flows that lose their tail sit out the retransmission timer
(Linux: 200 ms minimum RTO) while the path's RTT is tens of microseconds (Vasudevan et al.,
SIGCOMM 2009; Alizadeh et al., DCTCP, SIGCOMM 2010). The round completes only with the slowest.

Topology (every namespace our own; addresses 10.77.14.0/24 exist only inside them)::

    [cli] eth0 10.77.14.1 ==veth== pc  \\
    [s1]  eth0 10.77.14.11 ==veth== p1  +-- br0 in [sw];  pc egress: tbf rate R, small limit
    ...                                 |
    [sN]  eth0 10.77.14.(10+N) ==veth== pN

The bottleneck is ``tbf`` on the switch port towards the client (this kernel has no netem):
rate ``rate_mbit``, bucket ``burst_bytes``, queue ``limit_bytes``. The capture runs in the
switch namespace on every port, inbound only (``tcpdump -i any -Q in``: each packet once, as it
enters the switch, i.e. before the bottleneck drops it: a SPAN port's view) or, with
``vantage="client"``, on the client's eth0; headers only (-s 96), ns timestamps.

Servers: one Python process per server namespace; a persistent connection each (CUBIC set per
socket, the kernel default here is BBR); per request (16 bytes) they write the response in one
``sendall``. The client sends the request to all N with non-blocking writes in one loop (a
round), reads every answer (a selector), records when each answer completed, then waits
``round_gap_s`` before the next round. The healthy twin staggers the requests
(``stagger_ms`` apart, longer than one answer takes at the bottleneck rate): the same bytes, no
overlap. Ground truth: the client's per-round, per-flow timings, ``nstat`` in each server
namespace (TcpExtTCPTimeouts, TcpRetransSegs, TcpExtTCPLossProbes) and the tbf's drop counter.
"""
from __future__ import annotations

import os
import re
import selectors
import socket
import sys
import time
from pathlib import Path

from .core import ALL_DETECTORS, Lab, first_packet_time, log, run, wait_for
from .eval_common import capture

NET = "10.77.14"
CLIENT = f"{NET}.1"
PORT = 7100
REQ = 16
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
NSTAT_KEYS = ("TcpExtTCPTimeouts", "TcpRetransSegs", "TcpExtTCPLossProbes", "TcpExtTCPLostRetransmit",
              "TcpExtTCPSackRecovery")
# issue 14's new detectors, silent here too (core.ALL_DETECTORS gets them later: no duplicates)
NEW_DETECTORS = ["saturation", "replay", "replication_conflict"]
EVERY_DETECTOR = list(dict.fromkeys([*ALL_DETECTORS, *NEW_DETECTORS, "incast"]))
# the detectors besides incast that must stay silent (tcp_stall's rto findings of the rounds
# become incast's members; alone they would be medium or high)
OTHERS_SILENT = [d for d in EVERY_DETECTOR if d not in ("tcp_stall", "incast")]


def server_addr(i: int) -> str:
    return f"{NET}.{11 + i}"


def _cubic(s: socket.socket) -> None:
    s.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, b"cubic")


# one server per namespace, each its own process (threads of the recorder would share its GIL and
# answer one after another): a persistent connection, a 16-byte request, the answer in one write
SERVER = r"""
import os, socket, sys
addr, port, size, req = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
resp = os.urandom(size)
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((addr, port))
ls.listen(4)
print("listening", flush=True)
while True:
    c, _ = ls.accept()
    c.setsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_CONGESTION", 13), b"cubic")
    try:
        while True:
            got = b""
            while len(got) < req:
                b = c.recv(req - len(got))
                if not b:
                    raise ConnectionError
                got += b
            c.sendall(resp)
    except OSError:
        pass
    finally:
        c.close()
"""


def _nstat(ns) -> dict:
    out = run(["ip", "netns", "exec", ns.name, "nstat", "-az", *NSTAT_KEYS], check=False).stdout
    vals = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in NSTAT_KEYS:
            vals[parts[0]] = int(parts[1])
    return vals


def _tbf_drops(sw) -> dict:
    out = run(["ip", "netns", "exec", sw.name, "tc", "-s", "qdisc", "show", "dev", "pc"], check=False).stdout
    m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", out)
    return dict(sent_packets=int(m.group(2)), dropped=int(m.group(3))) if m else {}


def run_incast(lab: Lab, out: Path, fname: str, n_servers: int, resp_bytes: int, rounds: int,
               stagger_ms: float = 0.0, rate_mbit: float = 100.0, burst_bytes: int = 4500,
               limit_bytes: int = 30000, round_gap_s: float = 0.05, vantage: str = "switch") -> dict:
    """One recording (see the module docstring)."""
    sw = lab.netns("sw")
    cli = lab.netns("cli")
    srvs = [lab.netns(f"s{i + 1}") for i in range(n_servers)]
    sw.ip("link", "add", "br0", "type", "bridge")
    sw.ip("link", "set", "br0", "up")
    lab.veth(cli, "eth0", sw, "pc")
    cli.ip("addr", "add", f"{CLIENT}/24", "dev", "eth0")
    sw.ip("link", "set", "pc", "master", "br0")
    for i, ns in enumerate(srvs):
        lab.veth(ns, "eth0", sw, f"p{i + 1}")
        ns.ip("addr", "add", f"{server_addr(i)}/24", "dev", "eth0")
        sw.ip("link", "set", f"p{i + 1}", "master", "br0")
    run(["ip", "netns", "exec", sw.name, "tc", "qdisc", "add", "dev", "pc", "root", "tbf", "rate",
         f"{rate_mbit:g}mbit", "burst", str(burst_bytes), "limit", str(limit_bytes)])
    for ns in (cli, *srvs):
        ns.sysctl("net.ipv4.tcp_no_metrics_save", 1)
    servers = [lab.spawn(ns, f"server{i + 1}", [sys.executable, "-c", SERVER, server_addr(i), str(PORT),
                                                 str(resp_bytes), str(REQ)]) for i, ns in enumerate(srvs)]
    for i in range(n_servers):
        wait_for(lambda: "listening" in lab.logtail(f"server{i + 1}"), 10, f"server {i + 1} to listen")
    # connect every server (and warm ARP) before the capture starts: the rounds are the capture
    socks = []
    for i in range(n_servers):
        with cli:
            s = socket.socket()
        _cubic(s)
        s.connect((server_addr(i), PORT))
        s.setblocking(False)
        socks.append(s)
    before = {ns.name: _nstat(ns) for ns in srvs}
    if vantage == "client":
        cap = capture(lab, cli, "eth0", out / fname, snaplen=96, nano=True, bpf="tcp")
    else:
        cap = capture(lab, sw, "any", out / fname, snaplen=96, nano=True, bpf="-Q in tcp")
    sel = selectors.DefaultSelector()
    for k, s in enumerate(socks):
        sel.register(s, selectors.EVENT_READ, k)
    log_rounds = []
    for r in range(rounds):
        t0 = time.time()
        sent = [0.0] * n_servers
        done = [0.0] * n_servers
        got = [0] * n_servers
        pending = set(range(n_servers))
        nxt = 0
        deadline = t0 + 30
        while pending and time.time() < deadline:
            # the requests: all at once, or one every stagger_ms
            while nxt < n_servers and time.time() >= t0 + nxt * stagger_ms / 1000:
                socks[nxt].send(b"q" * REQ)
                sent[nxt] = time.time()
                nxt += 1
            wait = 0.05 if nxt >= n_servers else max(0.0, t0 + nxt * stagger_ms / 1000 - time.time())
            for key, _ in sel.select(timeout=wait):
                k = key.data
                try:
                    b = socks[k].recv(1 << 20)
                except BlockingIOError:
                    continue
                got[k] += len(b)
                if got[k] >= resp_bytes and k in pending:
                    done[k] = time.time()
                    pending.discard(k)
        t1 = time.time()
        log_rounds.append(dict(t0=t0, t1=t1, sent=sent, done=done, complete=not pending))
        time.sleep(round_gap_s)
    time.sleep(0.3)
    stats = cap.stop()
    after = {ns.name: _nstat(ns) for ns in srvs}
    tbf = _tbf_drops(sw)
    for s in socks:
        s.close()
    for srv in servers:
        lab.stop(srv)
    per_server = []
    for i, ns in enumerate(srvs):
        d = {k: after[ns.name].get(k, 0) - before[ns.name].get(k, 0) for k in NSTAT_KEYS}
        per_server.append(d)
    return dict(fname=fname, rounds=log_rounds, t_first=first_packet_time(out / fname), stats=stats,
                nstat=per_server, tbf=tbf, n_servers=n_servers, resp_bytes=resp_bytes,
                stagger_ms=stagger_ms, rate_mbit=rate_mbit, burst_bytes=burst_bytes,
                limit_bytes=limit_bytes, round_gap_s=round_gap_s, vantage=vantage)


# a flow "waited on its timer" in a round when its answer completed this long after the round's
# median flow: far more than the bottleneck needs for the whole round, close to Linux's 200 ms RTO-min
SLOW_FLOW_S = 0.15


def summarise(r: dict) -> dict:
    """Ground truth from the client's timings and the servers' counters."""
    t_first = r["t_first"]
    ideal_ms = r["n_servers"] * r["resp_bytes"] * 8 / (r["rate_mbit"] * 1e6) * 1000
    rounds_ms, slow_rounds, slow_flows, starts = [], [], [], []
    for k, x in enumerate(r["rounds"]):
        flows = sorted(d - x["t0"] for d in x["done"] if d)
        med = flows[len(flows) // 2] if flows else 0.0
        slow = [i for i, d in enumerate(x["done"]) if d and d - x["t0"] - med >= SLOW_FLOW_S]
        rounds_ms.append(round((x["t1"] - x["t0"]) * 1000, 1))
        starts.append(max(0.0, round(x["t0"] - t_first, 3)))
        if slow:
            slow_rounds.append(k)
            slow_flows.append(len(slow))
    ns = r["nstat"]
    timeouts = sum(d.get("TcpExtTCPTimeouts", 0) for d in ns)
    srt = sorted(rounds_ms)
    return dict(
        servers=r["n_servers"], response_bytes=r["resp_bytes"], rounds=len(r["rounds"]),
        bottleneck=f"tbf rate {r['rate_mbit']:g} Mbit/s burst {r['burst_bytes']} limit {r['limit_bytes']} bytes",
        round_ms=rounds_ms, median_round_ms=srt[len(srt) // 2], ideal_round_ms=round(ideal_ms, 1),
        round_start_s=starts, rounds_with_slow_flows=len(slow_rounds), slow_round_index=slow_rounds,
        slow_flows_per_slow_round=slow_flows, server_tcp_timeouts=timeouts,
        servers_with_timeouts=sum(1 for d in ns if d.get("TcpExtTCPTimeouts", 0)),
        server_retrans_segs=sum(d.get("TcpRetransSegs", 0) for d in ns),
        server_loss_probes=sum(d.get("TcpExtTCPLossProbes", 0) for d in ns),
        tbf_dropped=r["tbf"].get("dropped", -1), capture_dropped=r["stats"].get("dropped_by_kernel", -1))


def made_with(r: dict) -> str:
    where = ("on the client's eth0" if r["vantage"] == "client"
             else "in the switch namespace on every port, inbound only (tcpdump -i any -Q in: each packet once, "
                  "before the bottleneck)")
    how = (f"requests staggered {r['stagger_ms']:g} ms apart" if r["stagger_ms"]
           else "the request sent to all servers at once")
    return (f"Linux {os.uname().release} TCP (CUBIC per socket; tail loss probes and RACK on, the defaults), network namespaces: one client "
            f"({CLIENT}) and {r['n_servers']} servers ({server_addr(0)}-{server_addr(r['n_servers'] - 1)}) on one "
            f"Linux bridge in a namespace of its own; the bridge port towards the client shaped with tbf "
            f"(rate {r['rate_mbit']:g} Mbit/s, burst {r['burst_bytes']} bytes, limit {r['limit_bytes']} bytes: a "
            f"shallow queue). One persistent connection per server; {len(r['rounds'])} rounds, "
            f"{r['round_gap_s'] * 1000:g} ms apart, {how}, each server answering a {REQ}-byte request with "
            f"{r['resp_bytes'] // 1024} KB in one write. Captured {where}, -s 96, ns pcap, tcp only.")


def entry_for(r: dict, scen: str, healthy: bool, twin: str) -> dict:
    """A manifest entry (make_real.py's schema) for one half of the scenario."""
    m = summarise(r)
    entry = dict(file=r["fname"], scenario=scen, healthy=healthy, twin=twin, made_with=made_with(r), measured=m)
    if healthy:
        entry["what_happened"] = (
            f"With the requests staggered the answers do not overlap at the bottleneck: median round "
            f"{m['median_round_ms']:.0f} ms, {m['rounds_with_slow_flows']} rounds with a flow "
            f"{SLOW_FLOW_S * 1000:.0f} ms "
            f"behind the median, {m['server_tcp_timeouts']} retransmission timeouts on the servers, tbf dropped "
            f"{m['tbf_dropped']} packets.")
        entry["silent"] = EVERY_DETECTOR
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"{m['servers']} answers of {m['response_bytes'] // 1024} KB converge on the client's shallow port: tbf "
        f"dropped {m['tbf_dropped']} packets; in {m['rounds_with_slow_flows']} of {m['rounds']} rounds some flows "
        f"(per such round: {m['slow_flows_per_slow_round']}) finished {SLOW_FLOW_S * 1000:.0f} ms or more after the "
        f"median flow: the servers counted {m['server_tcp_timeouts']} retransmission timeouts (nstat "
        f"TcpExtTCPTimeouts, on {m['servers_with_timeouts']} of {m['servers']} servers) and "
        f"{m['server_loss_probes']} tail loss probes. Median round {m['median_round_ms']:.0f} ms against "
        f"{m['ideal_round_ms']:.0f} ms of bottleneck time: the round completes only with the slowest flow.")
    entry["silent"] = OTHERS_SILENT
    first = m["slow_round_index"][0] if m["slow_round_index"] else 0
    # the finding names the client's fan-in as its resource ("client <- servers"); its server is empty
    # (one server only when a single one timed out)
    entry["expect"] = [dict(
        detector="incast", kind="incast", min_severity="medium", start_s=max(0.0, m["round_start_s"][first]),
        tolerance_s=1.0, client=CLIENT, server="", resource=f"{CLIENT} <-", count=1, count_tolerance=0,
        measured=dict(kind="incast", rounds_with_timeouts=m["rounds_with_slow_flows"],
                      server_tcp_timeouts=m["server_tcp_timeouts"], fan_in=m["servers"]))]
    return entry


def build_incast(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "tcp-incast"
    fname = f"{scen}{'-healthy' if healthy else ''}.pcap"
    twin = f"{scen}{'' if healthy else '-healthy'}.pcap"
    # 24 KB answers: one answer's burst fits the 30,000-byte queue (the staggered twin loses nothing),
    # sixteen at once do not
    r = run_incast(lab, out, fname, n_servers=16, resp_bytes=24 * 1024, rounds=12,
                   stagger_ms=5.0 if healthy else 0.0)
    e = entry_for(r, scen, healthy, twin)
    log(f"{fname}: {e['measured']}")
    return e
