"""Scenarios: a leaf-spine fabric, queue pairs, a workload and (for the pathologies) what goes wrong.

Every scenario is a function ``(seed, scale) -> Built``; ``scale`` multiplies the work posted (the
packet count grows with it; 1.0 gives a capture of a few thousand to ~100k packets). Each pathology
has a healthy twin: the same hosts, queue pairs and work, without the fault. The labels say what,
where (hosts, QPs, ports), when (first and last packet of the episode, ns from capture start) and
the numbers the model counted (losses, NAKs, timeouts, RNR NAKs, CE marks, CNPs, pause frames).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import wire
from .fabric import Fabric, FabricParams, Switch
from .qp import QP, Host, QPParams

US, MS = 1_000, 1_000_000
KIB = 1024
PAYLOAD_BLOCK = 1 << 16          # bytes of random payload each host cycles through
QPN_BASE = 0x11                  # first QPN a host hands out (QPNs 0 and 1 are the special QPs)
RKEY_BASE = 0x1000
VA_BASE = 0x7F00_0000_0000


@dataclass
class Built:
    name: str
    fab: Fabric
    qps: list = field(default_factory=list)     # (requester QP, responder QP)
    labels: list = field(default_factory=list)
    duration_ns: int = 0
    twin: str = ""
    notes: str = ""


class Site:
    """A two-leaf, one-spine fabric of ``per_leaf`` hosts per leaf (IPv4; ``v6`` hosts get IPv6)."""

    def __init__(self, seed: int, per_leaf: int = 4, v6_hosts: tuple = (), fparams: FabricParams | None = None):
        self.rng = random.Random(seed)
        self.fab = Fabric(fparams or FabricParams(), self.rng)
        self.spine = Switch(self.fab, "spine0")
        self.fab.add(self.spine)
        self.leaves, self.hosts, self.leaf_of = [], {}, {}
        for l in range(2):
            leaf = Switch(self.fab, f"leaf{l}")
            self.fab.add(leaf)
            self.fab.link(leaf, self.spine)
            self.leaves.append(leaf)
            for i in range(per_leaf):
                name = f"h{l}{i}"
                ip = f"fd00:{l}::{i + 1}" if name in v6_hosts else f"10.{l}.0.{i + 1}"
                block = self.rng.randbytes(PAYLOAD_BLOCK)
                h = Host(self.fab, name, ip, block)
                self.fab.add(h)
                self.fab.link(h, leaf)
                self.hosts[name], self.leaf_of[name] = h, leaf
        self.next_qpn: dict[str, int] = {}

    def path(self, a: str, b: str) -> list:
        la, lb = self.leaf_of[a].name, self.leaf_of[b].name
        names = [a, la, b] if la == lb else [a, la, "spine0", lb, b]
        return self.fab.route(names)

    def qpn(self, host: str) -> int:
        n = self.next_qpn.get(host, QPN_BASE + self.rng.randrange(0x40) * 0x10)
        self.next_qpn[host] = n + 1
        return n

    def connect(self, a: str, b: str, pa: QPParams, pb: QPParams | None = None, rq=None) -> tuple[QP, QP]:
        ha, hb = self.hosts[a], self.hosts[b]
        qa = QP(ha, self.qpn(a), hb, self.path(a, b), pa, self.rng.randrange(1 << 24))
        qb = QP(hb, self.qpn(b), ha, self.path(b, a), pb or pa, self.rng.randrange(1 << 24), rq=rq)
        qa.connect(qb)
        qb.connect(qa)
        return qa, qb

    def workload(self, qa: QP, kinds: tuple, size: int, gap_ns: int, start: int, end: int, jitter: float = 0.2,
                 imm_share: float = 0.0) -> None:
        """Post work requests of ``size`` bytes every ``gap_ns`` (± ``jitter``) between ``start`` and ``end``."""
        t, k, rng = start, 0, self.rng
        rkey = RKEY_BASE + qa.qpn
        while t < end:
            kind = kinds[k % len(kinds)]
            imm = rng.randrange(1 << 32) if kind != "read" and rng.random() < imm_share else None
            qa.post(kind, size, t, VA_BASE + (k % 256) * size, rkey, imm)
            t += int(gap_ns * (1 + jitter * (2 * rng.random() - 1)))
            k += 1


def _span(cap, keep) -> tuple[int, int]:
    ts = [r[1] for r in cap.truth if keep(r)]
    return (min(ts), max(ts)) if ts else (0, 0)


def label(detector: str, start: int, end: int, clients: list, server: str, resource: str, description: str,
          **parameters) -> dict:
    return {"detector": detector, "start_ns": start, "end_ns": end, "clients": clients, "server": server,
            "server_port": wire.ROCEV2_PORT, "protocol": "rocev2", "resource": resource,
            "description": description, "parameters": parameters}


def qp_counts(qa: QP) -> dict:
    ev = [e[1] for e in qa.events]
    return {"nak_seq": ev.count("nak_seq"), "ack_timeout": ev.count("ack_timeout"), "rnr_nak": ev.count("rnr_nak"),
            "read_gap": ev.count("read_gap"), "retry_exceeded": "retry_exceeded" in ev,
            "rnr_retry_exceeded": "rnr_retry_exceeded" in ev, "cnps_received": qa.cnps_rx,
            "wqes": len(qa.wqes), "wqes_done": sum(1 for w in qa.wqes if w.done_ns >= 0)}


def qp_name(qa: QP) -> str:
    return f"{qa.h.ep.ip}:qp{qa.qpn:#x}->{qa.peer_host.ep.ip}:qp{qa.peer.qpn:#x}"


def _retransmits(cap, src_ip_name: str, dqpn: int) -> int:
    return sum(1 for r in cap.truth if r[2] == src_ip_name and r[6] == dqpn and r[19])


def run_built(b: Built) -> Built:
    for qa, _ in b.qps:
        qa.loop.at(0, qa.pump)
    b.fab.loop.run(b.duration_ns)
    return b


# ---------------------------------------------------------------------------------------------------
def healthy(seed: int, scale: float = 1.0) -> Built:
    """Mixed SEND/WRITE/READ between host pairs, IPv4 and IPv6, no loss, light load."""
    s = Site(seed, v6_hosts=("h03", "h13"))
    b = Built("rocev2-healthy", s.fab, duration_ns=int(20 * MS * scale))
    p = QPParams()
    pairs = [("h00", "h10", ("write",), 64 * KIB), ("h01", "h11", ("send",), 8 * KIB),
             ("h02", "h12", ("read",), 32 * KIB), ("h03", "h13", ("send", "write", "read"), 16 * KIB),
             ("h11", "h00", ("send",), 2 * KIB), ("h10", "h02", ("write", "send"), 4 * KIB)]
    for a, c, kinds, size in pairs:
        qa, qb = s.connect(a, c, p)
        s.workload(qa, kinds, size, 60 * US, 0, int(b.duration_ns * 0.9), imm_share=0.25)
        b.qps.append((qa, qb))
    # a host with a legacy 802.3x link pause (benign: two short pauses and a resume)
    h = s.hosts["h01"]
    for t, q in ((3 * MS, 0x0200), (3 * MS + 20 * US, 0x0200), (3 * MS + 40 * US, 0)):
        s.fab.loop.at(t, lambda q, h=h: s.fab.cap.add(s.fab.loop.now, wire.pause_frame(h.mac, q)), q)
    return run_built(b)


def _gbn(seed: int, scale: float, drop: bool) -> Built:
    s = Site(seed)
    name = "rocev2-gbn-storm" + ("" if drop else "-healthy")
    b = Built(name, s.fab, duration_ns=int(20 * MS * scale), twin="rocev2-gbn-storm")
    p = QPParams(window=128)
    for a, c in (("h00", "h10"), ("h01", "h11"), ("h02", "h12")):
        qa, qb = s.connect(a, c, p)
        s.workload(qa, ("write",), 256 * KIB, 120 * US, 0, int(b.duration_ns * 0.85))
        b.qps.append((qa, qb))
    port = s.spine.ports["leaf1"]
    lo, hi = int(b.duration_ns * 0.1), int(b.duration_ns * 0.8)
    drop_prob = 0.002                       # a flaky spine->leaf1 cable: 0.2 % of frames lost (FCS errors)
    if drop:
        port.drop_prob, port.drop_window = drop_prob, (lo, hi)
    run_built(b)
    if drop:
        lost = [d for d in s.fab.drops]
        for qa, qb in b.qps:
            mine = [d for d in lost if d[0] >= 0 and d[1] == qa.h.name and d[3] == qb.qpn]
            if not mine:
                continue
            rtx = _retransmits(s.fab.cap, qa.h.name, qb.qpn)
            c = qp_counts(qa)
            st, en = _span(s.fab.cap, lambda r, qb=qb: r[6] == qb.qpn and r[19])
            b.labels.append(label(
                "gbn_retransmission", st, en, [qa.h.ep.ip], qa.peer_host.ep.ip, qp_name(qa),
                f"go-back-N after losses on {port.name}: {len(mine)} packets lost, {rtx} resent "
                f"({rtx / len(mine):.1f} per loss), {c['nak_seq']} NAKs (PSN sequence error)",
                port=port.name, drop_prob=drop_prob, lost=len(mine), retransmitted=rtx,
                amplification=round(rtx / len(mine), 2), trigger="nak", window=p.window, **c))
    return b


def gbn_storm(seed, scale=1.0):
    return _gbn(seed, scale, True)


def gbn_storm_healthy(seed, scale=1.0):
    return _gbn(seed, scale, False)


def _timeout(seed: int, scale: float, flap: bool) -> Built:
    s = Site(seed)
    name = "rocev2-ack-timeout" + ("" if flap else "-healthy")
    b = Built(name, s.fab, duration_ns=int(300 * MS * max(scale, 1.0)), twin="rocev2-ack-timeout")
    p = QPParams(timeout=14)
    qa, qb = s.connect("h00", "h10", p)
    # bursts of 64 KiB WRITEs every 2 ms, a pause of 80 ms after the burst at 20 ms, then bursts again:
    # a tail lost at 20 ms is followed by no packet that could reveal the gap, so only the ACK timer can
    s.workload(qa, ("write",), 64 * KIB, 2 * MS, 0, 20 * MS + 1, jitter=0.0)
    s.workload(qa, ("write",), 64 * KIB, 2 * MS, 100 * MS, b.duration_ns - 100 * MS, jitter=0.0)
    b.qps.append((qa, qb))
    flap_at = 20 * MS + 4 * US                 # covers the tail of the burst posted at 20 ms and its ACK
    flap_ns = 30 * US
    if flap:
        for pt in (s.spine.ports["leaf1"], s.spine.ports["leaf0"]):   # link down both ways for 30 µs
            pt.drop_prob, pt.drop_window = 1.0, (flap_at, flap_at + flap_ns)
    run_built(b)
    if flap:
        c = qp_counts(qa)
        to = [e for e in qa.events if e[1] == "ack_timeout"]
        lost = sum(1 for d in s.fab.drops if d[3] == qb.qpn)
        rtx = _retransmits(s.fab.cap, "h00", qb.qpn)
        st = min(e[0] for e in to) if to else flap_at
        en = max((r[1] for r in s.fab.cap.truth if r[19]), default=st)
        b.labels.append(label(
            "gbn_retransmission", flap_at, en, [qa.h.ep.ip], qa.peer_host.ep.ip, qp_name(qa),
            f"link flap of {flap_ns // US} µs on spine0<->leaf1 lost {lost} packets of the burst's tail; no "
            f"NAK possible, the ACK timer ({wire.ack_timeout_ns(p.timeout) / MS:.1f} ms) fired {len(to)} time(s) "
            f"and {rtx} packets were resent",
            trigger="timeout", flap_ns=flap_ns, lost=lost, retransmitted=rtx, timeout_exp=p.timeout,
            ack_timeout_ns=wire.ack_timeout_ns(p.timeout), first_timeout_at_ns=st, **c))
    return b


def ack_timeout(seed, scale=1.0):
    return _timeout(seed, scale, True)


def ack_timeout_healthy(seed, scale=1.0):
    return _timeout(seed, scale, False)


def _rnr(seed: int, scale: float, starve: bool) -> Built:
    s = Site(seed)
    name = "rocev2-rnr-loop" + ("" if starve else "-healthy")
    b = Built(name, s.fab, duration_ns=int(30 * MS * scale), twin="rocev2-rnr-loop")
    p = QPParams(min_rnr_timer=12, rnr_retry=wire.RETRY_INFINITE)
    post_every = 1 * MS                        # the receiving application posts a buffer every 1 ms ...
    sends_every = 100 * US                     # ... while its peer sends a 4 KiB message every 100 µs
    qa, qb = s.connect("h01", "h11", p, rq=4 if starve else 1 << 20)
    s.workload(qa, ("send",), 4 * KIB, sends_every, 0, int(b.duration_ns * 0.7), jitter=0.0)
    b.qps.append((qa, qb))
    if starve:
        t = post_every
        while t < b.duration_ns:
            s.fab.loop.at(t, lambda _a, qb=qb: qb.post_recv(1))
            t += post_every
    qc, qd = s.connect("h02", "h12", p)        # a bystander pair with plenty of buffers
    s.workload(qc, ("write",), 16 * KIB, 100 * US, 0, int(b.duration_ns * 0.7))
    b.qps.append((qc, qd))
    run_built(b)
    if starve:
        c = qp_counts(qa)
        rnr = [e for e in qa.events if e[1] == "rnr_nak"]
        if rnr:
            delay = wire.RNR_DELAY_US[p.min_rnr_timer]
            b.labels.append(label(
                "rnr_retry", rnr[0][0], rnr[-1][0], [qa.h.ep.ip], qa.peer_host.ep.ip, qp_name(qa),
                f"{len(rnr)} RNR NAKs (timer code {p.min_rnr_timer} = {delay / 1000:.2f} ms): the receiver posts "
                f"one receive buffer per {post_every // US} µs while SENDs arrive every {sends_every // US} µs",
                rnr_timer_code=p.min_rnr_timer, rnr_delay_ns=delay * 1000, rnr_naks=len(rnr),
                rnr_retry=p.rnr_retry, recv_post_interval_ns=post_every, send_interval_ns=sends_every, **c))
    return b


def rnr_loop(seed, scale=1.0):
    return _rnr(seed, scale, True)


def rnr_loop_healthy(seed, scale=1.0):
    return _rnr(seed, scale, False)
