"""TCP timer and window scenarios over an emulated link (user-space, see link.py):
slow start after idle (on/off), an RTO blackout, and Nagle x delayed-ACK stalls.

Topology: [a] tapa 10.77.5.1 (server, sends)  <== link.py: rate, queue, delay ==>  tapb 10.77.5.2 [b]
The capture runs on tapa, i.e. at the sender, with headers only (-s 96) and ns timestamps.
Congestion control is set to CUBIC per socket (TCP_CONGESTION): the kernel default here is
BBR, which ignores tcp_slow_start_after_idle.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from .core import ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, log, wait_for

A, B = "10.77.5.1", "10.77.5.2"
PORT = 5001
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)


def _cubic(s: socket.socket) -> None:
    avail = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    if "cubic" not in avail:
        raise RuntimeError(f"CUBIC not available (have {avail})")
    s.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, b"cubic")


def _setup(lab: Lab, delay_ms: float, rate_mbit: float, queue_pkts: int, ssai: int = 1):
    a = lab.netns("a")
    b = lab.netns("b")
    link = lab.spawn(None, "link", [sys.executable, str(Path(__file__).with_name("link.py")),
                                    "--ns-a", a.name, "--tap-a", "tapa", "--ns-b", b.name,
                                    "--tap-b", "tapb", "--delay-ms", str(delay_ms),
                                    "--rate-mbit", str(rate_mbit),
                                    "--queue-pkts", str(queue_pkts)])
    wait_for(lambda: "ready" in lab.logtail("link"), 10, "link to come up")
    for ns, tap, ip in ((a, "tapa", A), (b, "tapb", B)):
        ns.ip("addr", "add", f"{ip}/24", "dev", tap)
        ns.ip("link", "set", tap, "up")
        ns.sysctl("net.ipv4.tcp_no_metrics_save", 1)   # no cached ssthresh between runs
        ns.sysctl("net.ipv4.tcp_slow_start_after_idle", ssai)
    # warm ARP so that the first data packet is not held behind resolution
    with a:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"hello", (B, 9))
    s.close()
    time.sleep(2 * delay_ms / 1000 + 0.3)
    return a, b, link


def _link_stats(lab: Lab) -> str:
    return " ".join(l for l in lab.logtail("link", 4).splitlines() if "forwarded" in l)


def _server(ns, handler, ready: threading.Event, nodelay: bool = False):
    with ns:
        srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((A, PORT))
    srv.listen(4)
    ready.set()
    c, _ = srv.accept()
    _cubic(c)
    if nodelay:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        handler(c)
    finally:
        c.close()
        srv.close()


def _client(ns, nodelay: bool = False) -> socket.socket:
    with ns:
        s = socket.socket()
    _cubic(s)
    if nodelay:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.bind((B, 0))
    s.connect((A, PORT))
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


# --------------------------------------------------------------------------- slow start after idle
def run_idle(lab: Lab, out: Path, healthy: bool, bursts: int = 5, burst_bytes: int = 384 * 1024,
             idle_s: float = 2.0, delay_ms: float = 50.0, rate_mbit: float = 20.0) -> dict:
    bdp_pkts = int(rate_mbit * 1e6 / 8 * 2 * delay_ms / 1000 / 1514) + 1
    a, b, link = _setup(lab, delay_ms, rate_mbit, queue_pkts=bdp_pkts, ssai=0 if healthy else 1)
    fname = ("tcp-slow-start-after-idle-healthy.pcap" if healthy
             else "tcp-slow-start-after-idle.pcap")
    cap = Capture(lab, a, "tapa", out / fname, snaplen=96, nano=True, bpf="tcp")
    ready = threading.Event()
    sent: list[tuple[float, float]] = []

    def handler(c):
        # request/response: the client asks for a burst, the server writes it in one go
        for k in range(bursts):
            _recv_exact(c, 4)
            t0 = time.time()
            c.sendall(os.urandom(16) * (burst_bytes // 16))
            sent.append((t0, time.time()))

    th = threading.Thread(target=_server, args=(a, handler, ready), daemon=True)
    th.start()
    ready.wait(5)
    s = _client(b)
    port = s.getsockname()[1]
    got: list[tuple[float, float]] = []
    for k in range(bursts):
        if k:
            time.sleep(idle_s)           # the connection sits idle (> RTO) between bursts
        t0 = time.time()
        s.sendall(b"GET!")
        _recv_exact(s, burst_bytes)
        got.append((t0, time.time()))
    s.close()
    th.join(10)
    time.sleep(0.3)
    stats = cap.stop()
    lab.stop(link)
    return dict(got=got, sent=sent, fname=fname, port=port, t_first=first_packet_time(out / fname),
                stats=stats, link=_link_stats(lab), bursts=bursts, burst_bytes=burst_bytes,
                idle_s=idle_s, delay_ms=delay_ms, rate_mbit=rate_mbit, queue_pkts=bdp_pkts)


def _link_desc(r: dict) -> str:
    return (f"user-space link (samples/realkit/link.py: TAP in each namespace) with "
            f"{r['delay_ms']:g} ms one-way delay, a {r['rate_mbit']:g} Mbit/s drop-tail bottleneck "
            f"of {r['queue_pkts']} full-size frames")


def build_idle(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_idle(lab, out, healthy)
    t0 = r["t_first"]
    durs = [round((e - s) * 1000, 1) for s, e in r["got"]]
    conn = f"{A}:{PORT}-{B}:{r['port']}"
    made = (f"Linux {os.uname().release} TCP (CUBIC set per socket), "
            f"{_link_desc(r)}; net.ipv4.tcp_slow_start_after_idle = {0 if healthy else 1} on "
            f"the sender. One connection {conn}: {r['bursts']} times the client sends a 4-byte "
            f"request and the server answers with {r['burst_bytes'] // 1024} KB, "
            f"{r['idle_s']:g} s idle between bursts. Captured at the sender (tapa), -s 96, ns pcap.")
    measured = dict(bursts=r["bursts"], burst_bytes=r["burst_bytes"], idle_s=r["idle_s"],
                    rtt_ms=2 * r["delay_ms"], burst_ms=durs,
                    first_burst_ms=durs[0], later_bursts_mean_ms=round(sum(durs[1:]) / len(durs[1:]), 1),
                    link=r["link"], capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"], scenario="tcp-slow-start-after-idle", healthy=healthy,
                 twin=("tcp-slow-start-after-idle.pcap" if healthy
                       else "tcp-slow-start-after-idle-healthy.pcap"),
                 made_with=made, measured=measured)
    if healthy:
        entry["what_happened"] = (
            "With slow start after idle off the sender keeps its congestion window across the "
            f"idle gaps: bursts after the first take {measured['later_bursts_mean_ms']:.0f} ms on "
            f"average (first, from a cold start: {durs[0]:.0f} ms).")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"After each {r['idle_s']:g} s idle gap (longer than the RTO) the sender collapses its "
        "congestion window to the initial window and slow-starts again, so every burst takes "
        f"{measured['later_bursts_mean_ms']:.0f} ms on average, like the cold first one "
        f"({durs[0]:.0f} ms); compare the healthy twin.")
    entry["silent"] = ["herd", "retry_storm", "smb_break_queue", "toctou", "conn_churn"]
    n = r["bursts"] - 1
    entry["expect"] = [dict(
        detector="tcp_stall", min_severity="medium", start_s=round(r["got"][1][0] - t0, 3),
        tolerance_s=0.5, client=B, server=A, resource=conn, count=n, count_tolerance=n - 1,
        measured=dict(kind="slow_start_after_idle", bursts_after_idle=n,
                      burst_starts_s=[round(s - t0, 3) for s, _ in r["got"][1:]],
                      burst_ms=durs[1:]))]
    return entry


# --------------------------------------------------------------------------- RTO blackout
def run_blackout(lab: Lab, out: Path, healthy: bool, total: int = 2 * 1024 * 1024,
                 blackout_at: float = 0.6, blackout_s: float = 1.5, delay_ms: float = 10.0,
                 rate_mbit: float = 10.0) -> dict:
    bdp_pkts = max(20, int(rate_mbit * 1e6 / 8 * 2 * delay_ms / 1000 / 1514) * 2)
    a, b, link = _setup(lab, delay_ms, rate_mbit, queue_pkts=bdp_pkts)
    fname = "tcp-rto-blackout-healthy.pcap" if healthy else "tcp-rto-blackout.pcap"
    cap = Capture(lab, a, "tapa", out / fname, snaplen=96, nano=True, bpf="tcp")
    ready = threading.Event()
    marks = {}

    def handler(c):
        _recv_exact(c, 4)
        marks["send_start"] = time.time()
        c.sendall(os.urandom(16) * (total // 16))
        marks["send_end"] = time.time()

    th = threading.Thread(target=_server, args=(a, handler, ready), daemon=True)
    th.start()
    ready.wait(5)
    s = _client(b)
    port = s.getsockname()[1]
    t0 = time.time()
    s.sendall(b"GET!")

    def blackout():
        time.sleep(max(0.0, t0 + blackout_at - time.time()))
        if not healthy:
            os.kill(link.pid, signal.SIGUSR1)
            marks["bo_start"] = time.time()
            time.sleep(blackout_s)
            os.kill(link.pid, signal.SIGUSR2)
            marks["bo_end"] = time.time()

    tb = threading.Thread(target=blackout, daemon=True)
    tb.start()
    _recv_exact(s, total)
    t1 = time.time()
    s.close()
    tb.join(10)
    th.join(10)
    time.sleep(0.3)
    stats = cap.stop()
    lab.stop(link)
    return dict(fname=fname, port=port, t_first=first_packet_time(out / fname), stats=stats,
                link=_link_stats(lab), marks=marks, t_req=t0, t_done=t1, total=total,
                delay_ms=delay_ms, rate_mbit=rate_mbit, queue_pkts=bdp_pkts,
                blackout_s=blackout_s)


def build_blackout(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_blackout(lab, out, healthy)
    t0, m = r["t_first"], r["marks"]
    conn = f"{A}:{PORT}-{B}:{r['port']}"
    made = (f"Linux {os.uname().release} TCP (CUBIC per socket), {_link_desc(r)}. One "
            f"connection {conn}: the client asks for {r['total'] // 1024} KB and reads it all"
            + ("." if healthy else
               f"; 0.6 s after the request the link drops every frame in both directions for "
               f"{r['blackout_s']:g} s (SIGUSR1/SIGUSR2 to link.py).")
            + " Captured at the sender (tapa), -s 96, ns pcap.")
    measured = dict(bytes=r["total"], transfer_ms=round((r["t_done"] - r["t_req"]) * 1000, 1),
                    rtt_ms=2 * r["delay_ms"], link=r["link"],
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"], scenario="tcp-rto-blackout", healthy=healthy,
                 twin="tcp-rto-blackout.pcap" if healthy else "tcp-rto-blackout-healthy.pcap",
                 made_with=made, measured=measured)
    if healthy:
        entry["what_happened"] = (f"The same transfer without the blackout: "
                                  f"{measured['transfer_ms']:.0f} ms, no retransmission timeout.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
        return entry
    measured["blackout_s"] = [round(m["bo_start"] - t0, 3), round(m["bo_end"] - t0, 3)]
    entry["what_happened"] = (
        f"The link goes dark at {measured['blackout_s'][0]} s for {r['blackout_s']:g} s in the "
        "middle of the transfer: the sender's in-flight data is lost, it retransmits on its "
        "retransmission timer with exponential backoff (RTO 200 ms min, doubled each time) "
        "until the link returns, then recovers; the transfer takes "
        f"{measured['transfer_ms']:.0f} ms instead of about "
        f"{r['total'] * 8 / (r['rate_mbit'] * 1e6) * 1000:.0f} ms.")
    entry["silent"] = ["herd", "retry_storm", "smb_break_queue", "toctou", "conn_churn"]
    entry["expect"] = [dict(
        detector="tcp_stall", min_severity="medium", start_s=measured["blackout_s"][0],
        tolerance_s=0.5, client=B, server=A, resource=conn, count=1, count_tolerance=1,
        measured=dict(kind="rto_backoff", blackout_s=r["blackout_s"],
                      link_restored_s=measured["blackout_s"][1],
                      note="the sender resumes at its first RTO expiry after the link is back"))]
    return entry


# --------------------------------------------------------------------------- Nagle x delayed ACK
def run_nagle(lab: Lab, out: Path, healthy: bool, requests: int = 60, delay_ms: float = 1.0,
              gap_s: float = 0.05) -> dict:
    a, b, link = _setup(lab, delay_ms, 0.0, queue_pkts=1000)
    fname = "tcp-nagle-delayed-ack-healthy.pcap" if healthy else "tcp-nagle-delayed-ack.pcap"
    cap = Capture(lab, a, "tapa", out / fname, snaplen=96, nano=True, bpf="tcp")
    ready = threading.Event()

    def handler(c):
        # server: read a 20-byte header + 200-byte body, answer 64 bytes
        for _ in range(requests):
            _recv_exact(c, 220)
            c.sendall(b"R" * 64)

    th = threading.Thread(target=_server, args=(a, handler, ready, healthy), daemon=True)
    th.start()
    ready.wait(5)
    s = _client(b, nodelay=healthy)
    port = s.getsockname()[1]
    lat = []
    t_base = time.time()
    for k in range(requests):
        time.sleep(max(0.0, t_base + k * gap_s - time.time()))
        t0 = time.time()
        s.send(b"H" * 20)        # write: header
        s.send(b"B" * 200)       # write: body (Nagle holds it while the header is unacked)
        _recv_exact(s, 64)       # read: response
        lat.append((t0, time.time()))
        gap_next = t_base + (k + 1) * gap_s
        if time.time() > gap_next:
            t_base += time.time() - gap_next   # keep the schedule after a slow request
    s.close()
    th.join(10)
    time.sleep(0.3)
    stats = cap.stop()
    lab.stop(link)
    return dict(fname=fname, port=port, lat=lat, t_first=first_packet_time(out / fname),
                stats=stats, requests=requests, delay_ms=delay_ms, rate_mbit=0.0,
                queue_pkts=1000, link=_link_stats(lab))


def build_nagle(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_nagle(lab, out, healthy)
    t0 = r["t_first"]
    ms = sorted(round((e - s) * 1000, 2) for s, e in r["lat"])
    slow = [(s, e) for s, e in r["lat"] if e - s > 0.02]
    conn = f"{A}:{PORT}-{B}:{r['port']}"
    made = (f"Linux {os.uname().release} TCP, user-space link with {r['delay_ms']:g} ms one-way "
            f"delay and no bottleneck. One connection {conn}: {r['requests']} requests, each "
            "written as a 20-byte header and a 200-byte body in two send() calls, then a read "
            "of the 64-byte response (write-write-read), one every 50 ms; "
            + ("TCP_NODELAY on both ends." if healthy else "Nagle on (the default).")
            + " Captured at the server (tapa), -s 96, ns pcap.")
    measured = dict(requests=r["requests"], median_request_ms=ms[len(ms) // 2],
                    max_request_ms=ms[-1], requests_over_20ms=len(slow),
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"], scenario="tcp-nagle-delayed-ack", healthy=healthy,
                 twin=("tcp-nagle-delayed-ack.pcap" if healthy
                       else "tcp-nagle-delayed-ack-healthy.pcap"),
                 made_with=made, measured=measured)
    if healthy:
        entry["what_happened"] = (f"With TCP_NODELAY both writes leave at once: median request "
                                  f"{measured['median_request_ms']} ms, none over 20 ms.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        "Nagle holds each request's body until the header is acknowledged, and the server "
        "delays that ACK (delayed ACK, ~40 ms) because it has nothing to send until the whole "
        f"request arrives: {len(slow)} of {r['requests']} requests take over 20 ms (median "
        f"{measured['median_request_ms']} ms) for a {2 * r['delay_ms']:g} ms RTT.")
    entry["silent"] = ["herd", "retry_storm", "smb_break_queue", "toctou", "conn_churn"]
    entry["expect"] = [dict(
        detector="tcp_stall", min_severity="medium",
        start_s=round((slow[0][0] if slow else r["lat"][0][0]) - t0, 3), tolerance_s=0.5,
        client=B, server=A, resource=conn, count=1, count_tolerance=0,
        measured=dict(kind="nagle_delayed_ack", stalled_requests=len(slow),
                      median_request_ms=measured["median_request_ms"]))]
    return entry
