"""The fabric: an event loop, links and egress ports with priority queues, ECN marking, PFC
(XOFF/XON ingress accounting, pause refresh, pauses obeyed per priority) and the capture point.

Model (documented parameters in :class:`FabricParams`):

* A port is one direction of a link: a strict-priority set of FIFOs drained at ``rate_bps`` with a
  propagation delay. A priority whose ``paused_until`` is in the future is skipped (802.1Qbb);
  MAC control frames bypass the queues (they are never paused).
* A switch counts the bytes it holds per (ingress port, priority). Above ``xoff_bytes`` it sends a
  PFC frame with ``pause_quanta`` out of that ingress port (to the upstream device) and refreshes it
  every ``refresh_fraction`` of the pause time while still above ``xon_bytes``; below ``xon_bytes``
  it sends a PFC frame with time 0 (resume). The upstream egress port obeys it, its queue grows,
  and the pause spreads hop by hop (Guo et al., SIGCOMM 2016).
* ECN (RED-style, as DCQCN configures it): a packet of an ECN-capable transport enqueued on a switch
  egress queue holding more than ``ecn_kmin_bytes`` is CE-marked with probability rising linearly to
  ``ecn_pmax`` at ``ecn_kmax_bytes`` and 1 above.
* A port may drop frames with a probability in a time window (a flaky cable: FCS errors).
* The capture point is a mirror that records every RoCE packet once, on the last link it crosses
  (switch -> destination host, with its final ECN bits), and every MAC control frame on the link
  where it travels. Dropped packets are therefore never recorded (the receiver side of a loss).
"""
from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass

from . import wire

NS_PER_S = 1_000_000_000
_PRIOS = tuple(range(wire.PFC_PRIORITIES - 1, -1, -1))   # strict priority, highest first


@dataclass
class FabricParams:
    rate_bps: int = wire.LINK_SPEEDS_BPS["100G"]   # every link's speed
    prop_ns: int = 500                  # propagation + switch pipeline latency per hop
    xoff_bytes: int = 96_000            # per (ingress port, priority) XOFF threshold
    xon_bytes: int = 48_000             # XON threshold (resume below it)
    pause_quanta: int = wire.PAUSE_MAX_QUANTA     # pause time sent with XOFF
    refresh_fraction: float = 0.5       # refresh the pause after this share of its duration
    ecn_kmin_bytes: int = 40_000        # RED Kmin on switch egress queues
    ecn_kmax_bytes: int = 200_000       # RED Kmax
    ecn_pmax: float = 0.2               # marking probability at Kmax
    host_queue_pkts: int = 8            # a NIC's transmit ring the QPs fill (they wait when it is full)


class Loop:
    """A discrete-event loop: (time ns, sequence, callback, argument)."""

    def __init__(self):
        self.q: list = []
        self.n = 0
        self.now = 0

    def at(self, t: int, fn, arg=None) -> None:
        self.n += 1
        heapq.heappush(self.q, (t, self.n, fn, arg))

    def run(self, until: int) -> None:
        q = self.q
        while q and q[0][0] <= until:
            t, _, fn, arg = heapq.heappop(q)
            self.now = t
            fn(arg)


class Capture:
    """What the mirror wrote: timestamps and frames, plus ground truth per RoCE packet."""

    def __init__(self):
        self.ts: list[int] = []
        self.frames: list[bytes] = []
        self.truth: list[tuple] = []     # see TRUTH_FIELDS
        self.pauses: list[tuple] = []    # (ts, port name, src mac hex, priority, quanta)

    def add(self, t: int, frame: bytes) -> None:
        self.ts.append(t)
        self.frames.append(frame)


TRUTH_FIELDS = ("frame", "ts", "src", "dst", "sport", "opcode", "dqpn", "psn", "ackreq", "fecn", "becn",
                "ecn", "syndrome", "msn", "va", "rkey", "dmalen", "imm", "paylen", "retransmit")


class Packet:
    """One RoCE packet travelling the fabric."""
    __slots__ = ("src", "dst", "sport", "opcode", "dqpn", "psn", "ackreq", "se", "becn", "syndrome", "msn",
                 "reth", "imm", "paylen", "ecn", "dscp", "prio", "size", "route", "hop", "ingress", "retransmit")

    def __init__(self, src, dst, sport, opcode, dqpn, psn, *, ackreq=False, se=False, becn=False,
                 syndrome=None, msn=0, reth=None, imm=None, paylen=0, ecn=wire.ECN_ECT0, cnp=False,
                 retransmit=False):
        self.src, self.dst, self.sport, self.opcode, self.dqpn, self.psn = src, dst, sport, opcode, dqpn, psn
        self.ackreq, self.se, self.becn, self.syndrome, self.msn = ackreq, se, becn, syndrome, msn
        self.reth, self.imm, self.paylen, self.ecn, self.retransmit = reth, imm, paylen, ecn, retransmit
        self.dscp, self.prio = (wire.DSCP_CNP, wire.PRIO_CNP) if cnp else (wire.DSCP_ROCE, wire.PRIO_ROCE)
        ext = (wire.RETH_BYTES if reth else 0) + (wire.AETH_BYTES if syndrome is not None else 0) \
            + (wire.IMMDT_BYTES if imm is not None else 0) + (wire.CNP_RESERVED_BYTES if cnp else 0)
        l3 = 40 if src.ep.v6 else 20
        self.size = 14 + l3 + 8 + wire.BTH_BYTES + ext + paylen + wire.pad_payload(paylen) + wire.ICRC_BYTES
        self.route, self.hop, self.ingress = None, 0, None


class Port:
    """One direction of a link, from ``node`` to ``peer``."""

    def __init__(self, fab: "Fabric", node, peer, name: str, mac: bytes):
        self.fab, self.node, self.peer, self.name, self.mac = fab, node, peer, name, mac
        self.q = {p: deque() for p in range(wire.PFC_PRIORITIES)}
        self.qbytes = [0] * wire.PFC_PRIORITIES
        self.paused_until = [0] * wire.PFC_PRIORITIES
        self.busy = False
        self.wake_at = -1
        self.backlog_n = 0
        self.reverse: Port | None = None           # the port of the same link in the other direction
        self.drop_prob, self.drop_window = 0.0, (0, 0)
        self.on_dequeue = None                     # a host NIC's callback (its QPs refill)
        # PFC ingress state of a switch for frames that entered through this port's link (this is
        # the egress towards the upstream device: pauses for that ingress go out here)
        self.ing_bytes = [0] * wire.PFC_PRIORITIES
        self.pausing = [False] * wire.PFC_PRIORITIES

    def backlog(self) -> int:
        return self.backlog_n

    def enqueue(self, pkt: Packet) -> None:
        fab = self.fab
        p = pkt.prio
        if self.node.switch:
            fp = fab.p
            qb = self.qbytes[p]
            if pkt.ecn in (wire.ECN_ECT0, wire.ECN_ECT1) and qb > fp.ecn_kmin_bytes:
                prob = 1.0 if qb >= fp.ecn_kmax_bytes else \
                    fp.ecn_pmax * (qb - fp.ecn_kmin_bytes) / (fp.ecn_kmax_bytes - fp.ecn_kmin_bytes)
                if fab.rng.random() < prob:
                    pkt.ecn = wire.ECN_CE
                    fab.ce_marks += 1
            ing = pkt.ingress
            if ing is not None:
                ing.ing_bytes[p] += pkt.size
                if ing.ing_bytes[p] > fp.xoff_bytes and not ing.pausing[p]:
                    ing.pausing[p] = True
                    ing.send_pfc(p, fp.pause_quanta)
        self.q[p].append(pkt)
        self.backlog_n += 1
        self.qbytes[p] += pkt.size
        self.start()

    def send_pfc_once(self, prio: int, quanta: int) -> None:
        """Send one PFC frame out of this port (MAC control bypasses the queues)."""
        fab = self.fab
        t = fab.loop.now
        fab.cap.add(t, wire.pfc_frame(self.mac, {prio: quanta}))
        fab.cap.pauses.append((t, self.name, self.mac.hex(), prio, quanta))
        fab.loop.at(t + fab.p.prop_ns, self.peer_port_paused, (prio, quanta))

    def send_pfc(self, prio: int, quanta: int) -> None:
        """Send a PFC frame and refresh it while this ingress stays above XON."""
        fab = self.fab
        t = fab.loop.now
        self.send_pfc_once(prio, quanta)
        if quanta:
            dur = wire.quanta_ns(quanta, fab.p.rate_bps)
            fab.loop.at(t + max(1, int(dur * fab.p.refresh_fraction)), self._refresh, prio)

    def _refresh(self, prio: int) -> None:
        if self.pausing[prio]:
            self.send_pfc(prio, self.fab.p.pause_quanta)

    def peer_port_paused(self, arg) -> None:
        """The device at the other end obeys a PFC frame on its egress port towards us."""
        prio, quanta = arg
        up = self.reverse
        now = self.fab.loop.now
        up.paused_until[prio] = now + wire.quanta_ns(quanta, self.fab.p.rate_bps) if quanta else now
        up.start()

    def _next(self):
        now = self.fab.loop.now
        wake = None
        q = self.q
        for p in _PRIOS:
            if q[p]:
                pu = self.paused_until[p]
                if pu <= now:
                    return q[p].popleft(), None
                wake = pu if wake is None else min(wake, pu)
        return None, wake

    free_at = 0

    def start(self) -> None:
        """Start transmitting if idle: now, or when the frame on the wire ends."""
        if self.busy:
            return
        now = self.fab.loop.now
        if self.free_at <= now:
            self.kick(None)
        else:
            self.busy = True
            self.fab.loop.at(self.free_at, self.kick)

    def kick(self, _arg) -> None:
        fab = self.fab
        if fab.loop.now < self.free_at:  # a wake-up set while paused: the chain sending now goes on
            return                       # (two chains would send one port at twice its line rate)
        pkt, wake = self._next()
        if pkt is None:
            self.busy = False
            if wake is not None and wake != self.wake_at:
                self.wake_at = wake
                fab.loop.at(wake, self.kick)
            return
        self.busy = True
        now = fab.loop.now
        self.backlog_n -= 1
        self.qbytes[pkt.prio] -= pkt.size
        ing = pkt.ingress
        if ing is not None:
            ing.ing_bytes[pkt.prio] -= pkt.size
            if ing.pausing[pkt.prio] and ing.ing_bytes[pkt.prio] < fab.p.xon_bytes:
                ing.pausing[pkt.prio] = False
                ing.send_pfc(pkt.prio, 0)
        ser = pkt.size * 8 * NS_PER_S // fab.p.rate_bps
        lo, hi = self.drop_window
        dropped = self.drop_prob and lo <= now < hi and fab.rng.random() < self.drop_prob
        if dropped:
            fab.drops.append((now, pkt.src.name, pkt.dst.name, pkt.dqpn, pkt.psn, pkt.opcode))
        else:
            if not self.peer.switch:
                fab.record(now, pkt)
            fab.loop.at(now + ser + fab.p.prop_ns, self.peer.receive, (pkt, self.reverse))
        self.free_at = now + ser
        if self.backlog_n:
            fab.loop.at(now + ser, self.kick)
        else:                                      # idle after this frame: the next enqueue waits for free_at
            self.busy = False
        if self.on_dequeue is not None:
            self.on_dequeue()


class Switch:
    switch = True

    def __init__(self, fab: "Fabric", name: str):
        self.fab, self.name = fab, name
        self.ports: dict[str, Port] = {}          # next node's name -> egress port

    def receive(self, arg) -> None:
        pkt, ingress = arg
        pkt.hop += 1                               # now the index of this switch in the route
        pkt.ingress = ingress
        self.ports[pkt.route[pkt.hop + 1].name].enqueue(pkt)


class Fabric:
    """Nodes, links, routes, the loop, the capture and the shared random stream."""

    def __init__(self, params: FabricParams, rng: random.Random):
        self.p, self.rng = params, rng
        self.loop, self.cap = Loop(), Capture()
        self.nodes: dict[str, object] = {}
        self.ports: list[Port] = []
        self.ipid: dict[tuple, int] = {}
        self.drops: list[tuple] = []
        self.ce_marks = 0
        self._mac = 0

    def mac(self) -> bytes:
        self._mac += 1
        return b"\x02\x00\x5e\x10" + self._mac.to_bytes(2, "big")   # locally administered

    def add(self, node) -> None:
        self.nodes[node.name] = node

    def link(self, a, b) -> tuple[Port, Port]:
        pa = Port(self, a, b, f"{a.name}->{b.name}", a.mac if not a.switch else self.mac())
        pb = Port(self, b, a, f"{b.name}->{a.name}", b.mac if not b.switch else self.mac())
        pa.reverse, pb.reverse = pb, pa
        for n, other, pt in ((a, b, pa), (b, a, pb)):
            if n.switch:
                n.ports[other.name] = pt
            else:
                n.nic = pt
                pt.on_dequeue = n.nic_ready
        self.ports += [pa, pb]
        return pa, pb

    def route(self, path: list[str]) -> list:
        return [self.nodes[n] for n in path]

    def record(self, t: int, pkt: Packet) -> None:
        """The mirror: encode the packet as it leaves the last switch."""
        src, dst = pkt.src, pkt.dst
        key = (src.name, dst.name)
        ipid = self.ipid[key] = (self.ipid.get(key, 0) + 1) & 0xFFFF
        pad = wire.pad_payload(pkt.paylen)
        cnp = pkt.opcode == wire.CNP
        tr = wire.bth(pkt.opcode, pkt.dqpn, pkt.psn, ackreq=pkt.ackreq, se=pkt.se, padcnt=pad,
                      fecn=False, becn=pkt.becn, migreq=not cnp)
        va = rkey = dmalen = None
        if pkt.reth is not None:
            va, rkey, dmalen = pkt.reth
            tr += wire.reth(va, rkey, dmalen)
        if pkt.syndrome is not None:
            tr += wire.aeth(pkt.syndrome, pkt.msn)
        if pkt.imm is not None:
            tr += pkt.imm.to_bytes(4, "big")
        if cnp:
            tr += b"\0" * wire.CNP_RESERVED_BYTES
        if pkt.paylen:
            tr += src.payload(pkt.paylen + pad)
        last = pkt.route[-2]
        frame = wire.roce_frame(src.ep, dst.ep, dst.mac, last.ports[dst.name].mac, pkt.sport, ipid,
                                pkt.dscp, pkt.ecn, tr)
        self.cap.truth.append((len(self.cap.ts), t, src.name, dst.name, pkt.sport, pkt.opcode, pkt.dqpn,
                               pkt.psn & wire.PSN_MASK, pkt.ackreq, False, pkt.becn, pkt.ecn,
                               -1 if pkt.syndrome is None else pkt.syndrome, pkt.msn & wire.PSN_MASK if pkt.syndrome is not None else -1,
                               -1 if va is None else va, -1 if rkey is None else rkey,
                               -1 if dmalen is None else dmalen, -1 if pkt.imm is None else pkt.imm,
                               pkt.paylen, pkt.retransmit))
        self.cap.add(t, frame)
