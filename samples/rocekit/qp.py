"""Hosts (a NIC with reliable-connected queue pairs) and the RC transport (IBA ch. 9.7).

Requester (IBA §9.7.4, rxe_req.c/rxe_comp.c): work requests (SEND, RDMA WRITE, RDMA READ) are cut
into path-MTU packets (FIRST/MIDDLE/LAST or ONLY; RETH on WRITE FIRST/ONLY and READ REQUEST),
numbered by a 24-bit PSN; at most ``window`` PSNs are outstanding. AckReq is set on the last packet
of a message and every ``ackreq_every`` PSNs. An ACK acknowledges every PSN up to its own; a NAK
"PSN sequence error" makes the requester go back N to the NAKed PSN and resend everything from there
(byte-identical BTHs); the local ACK timer (4.096 µs × 2^timeout) resends from the oldest
unacknowledged PSN. Both decrement ``retry_cnt`` (reset on progress); exhausted, the QP goes to the
error state and stops. An RNR NAK makes the requester wait the RNR delay of the NAK's timer code
(Table 45) and resend from that PSN, decrementing ``rnr_retry`` (7 = forever).

Responder (IBA §9.7.5, rxe_resp.c): in-order PSNs are executed; a gap sends one NAK (sequence error)
and drops until the expected PSN arrives; a duplicate is re-ACKed (a duplicate READ is re-executed);
a SEND that finds no posted receive WQE gets an RNR NAK with the QP's ``min_rnr_timer``. ACKs are
coalesced: one ACK ``ack_delay_ns`` after the first AckReq packet, for the latest PSN then. The ACK's
credit count encodes the receive WQEs posted (Table 43).

Congestion (DCQCN, Zhu et al. 2015): the notification point sends a CNP to the sending QP when a
CE-marked packet arrives, at most one per ``cnp_interval_ns`` per QP. The reaction point cuts its rate
(Rt = Rc; Rc *= 1 - alpha/2; alpha = (1-g) alpha + g) and recovers every ``increase_period_ns``
(fast recovery towards Rt for ``fast_recovery_steps`` steps, then additive increase by ``rai_bps``).
With ``dcqcn=False`` a QP receives CNPs and ignores them (the misconfiguration to detect).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import wire
from .fabric import NS_PER_S, Packet

W = wire
RESPONSES = frozenset({W.ACKNOWLEDGE, W.READ_RESP_FIRST, W.READ_RESP_MIDDLE, W.READ_RESP_LAST, W.READ_RESP_ONLY})


@dataclass
class QPParams:
    pmtu: int = 1024                    # path MTU (payload bytes per packet)
    window: int = 128                   # max outstanding PSNs (the NIC's limit)
    ackreq_every: int = 16              # AckReq at least every so many PSNs
    timeout: int = 14                   # local ACK timeout exponent: 4.096 µs × 2^14 = 67.1 ms
    retry_cnt: int = 7                  # transport retries (3 bits)
    rnr_retry: int = 7                  # RNR retries (7 = infinite)
    min_rnr_timer: int = 12             # responder's RNR timer code (Table 45: 12 = 0.64 ms)
    ack_delay_ns: int = 2_000           # responder coalesces ACKs over this delay
    cnp_interval_ns: int = 50_000       # notification point: min time between CNPs per QP
    dcqcn: bool = True                  # reaction point honours CNPs
    dcqcn_g: float = 1 / 256            # alpha gain
    increase_period_ns: int = 55_000    # rate increase / alpha decay timer
    fast_recovery_steps: int = 5
    rai_bps: int = 2_000_000_000        # additive increase step
    min_rate_bps: int = 1_000_000_000   # floor of the rate limiter


class Wqe:
    __slots__ = ("kind", "length", "post_ns", "first_psn", "npkts", "va", "rkey", "imm", "done_ns", "index")

    def __init__(self, kind: str, length: int, post_ns: int, va: int, rkey: int, imm=None):
        self.kind, self.length, self.post_ns, self.va, self.rkey, self.imm = kind, length, post_ns, va, rkey, imm
        self.first_psn, self.npkts, self.done_ns, self.index = -1, 0, -1, 0


class Host:
    """A RoCE NIC: an endpoint, a transmit port and its queue pairs by QPN."""
    switch = False

    def __init__(self, fab, name: str, ip: str, payload_block: bytes):
        self.fab, self.name = fab, name
        self.mac = fab.mac()
        self.ep = W.Endpoint(ip, self.mac)
        self.qps: dict[int, "QP"] = {}
        self.nic = None
        self._block, self._off = payload_block, 0
        self.storm: tuple | None = None         # (start, end, priority): a NIC sending pause frames

    def payload(self, n: int) -> bytes:
        b, o = self._block, self._off
        if o + n > len(b):
            o = 0
        self._off = o + n
        return b[o:o + n]

    def nic_ready(self) -> None:
        if self.nic.backlog_n < self.fab.p.host_queue_pkts:
            for qp in self.qps.values():
                qp.pump(None)

    def send(self, pkt: Packet) -> None:
        self.nic.enqueue(pkt)

    def receive(self, arg) -> None:
        pkt, _ = arg
        qp = self.qps.get(pkt.dqpn)
        if qp is not None:
            qp.on_packet(pkt)

    def pfc_storm(self, start: int, end: int, prio: int = W.PRIO_ROCE) -> None:
        """A malfunctioning NIC that keeps pausing its switch port (Guo et al. §4.3)."""
        self.storm = (start, end, prio)
        self.fab.loop.at(start, self._storm_tick)

    def _storm_tick(self, _arg) -> None:
        start, end, prio = self.storm
        now = self.fab.loop.now
        if now >= end:
            self.nic.send_pfc_once(prio, 0)
            return
        self.nic.send_pfc_once(prio, self.fab.p.pause_quanta)
        dur = W.quanta_ns(self.fab.p.pause_quanta, self.fab.p.rate_bps)
        self.fab.loop.at(now + max(1, int(dur * self.fab.p.refresh_fraction)), self._storm_tick)


class QP:
    """One end of a reliable connection: requester for its own work requests, responder for the peer's."""

    def __init__(self, host: Host, qpn: int, peer_host: Host, route: list, params: QPParams, ipsn: int, rq=None):
        self.h, self.qpn, self.peer_host, self.route, self.p = host, qpn, peer_host, route, params
        self.fab = host.fab
        self.loop = host.fab.loop
        self.peer: QP | None = None
        self.sport = 0
        self.line = host.fab.p.rate_bps
        host.qps[qpn] = self
        # requester
        self.wqes: list[Wqe] = []
        self.next_psn = self.una = ipsn
        self.snd = 0                        # index of the WQE being sent
        self.snd_i = 0                      # packet index in it
        self.done_idx = 0                   # first WQE not yet completed
        self.next_tx = 0
        self.retry_left, self.rnr_left = params.retry_cnt, params.rnr_retry
        self.rnr_until = 0
        self.timer_gen = 0
        self.error_ns = -1
        self.read_gap = False
        self.rc = self.rt = float(self.line)
        self.rc_min = self.rc               # the lowest rate the limiter reached (ground truth)
        self.alpha = 1.0
        self.stage = 0
        self.rate_timer = False
        self.pump_at = -1
        self.events: list[tuple] = []       # (t, kind, psn, detail) for the labels
        self.cnps_rx = 0
        # responder
        self.epsn = 0
        self.msn = 0
        self.rq = rq                        # posted receive WQEs (None = always available)
        self.nak_sent = False
        self.rnr_sent = False
        self.ack_pending = False
        self.last_cnp = -1 << 62
        self.cnps_tx = 0

    def connect(self, peer: "QP") -> None:
        self.peer = peer
        self.sport = W.udp_sport(self.qpn, peer.qpn)
        self.epsn = peer.next_psn

    # ---- requester ------------------------------------------------------------------------------
    def post(self, kind: str, length: int, post_ns: int, va: int, rkey: int, imm=None) -> Wqe:
        w = Wqe(kind, length, post_ns, va, rkey, imm)
        w.npkts = max(1, -(-length // self.p.pmtu))
        w.index = len(self.wqes)
        self.wqes.append(w)
        return w

    def _pkt(self, opcode, psn, **kw) -> Packet:
        pk = Packet(self.h, self.peer_host, self.sport, opcode, self.peer.qpn, psn, **kw)
        pk.route = self.route
        return pk

    def _seq_psn(self, w: Wqe) -> int:
        if w.first_psn < 0:
            prev = self.wqes[w.index - 1] if w.index else None
            w.first_psn = self.una if prev is None else prev.first_psn + prev.npkts
        return w.first_psn

    def pump(self, _arg) -> None:
        if self._pumping:                   # re-entered from the NIC's dequeue callback
            return
        self._pumping = True
        try:
            self._pump()
        finally:
            self._pumping = False

    _pumping = False

    def _pump(self) -> None:
        now = self.loop.now
        p = self.p
        nic, ring = self.h.nic, self.fab.p.host_queue_pkts
        while True:
            if self.error_ns >= 0 or self.snd >= len(self.wqes):
                return
            if self.rnr_until > now:
                return self._wake(self.rnr_until)
            w = self.wqes[self.snd]
            if w.post_ns > now:
                return self._wake(w.post_ns)
            first = self._seq_psn(w)
            psn = first + self.snd_i
            need = w.npkts - self.snd_i if w.kind == "read" else 1
            if psn + need - self.una > p.window:
                return
            if nic.backlog_n >= ring:
                return
            if self.next_tx > now:
                return self._wake(self.next_tx)
            pk = self._build(w, psn, now)
            pk.retransmit = psn < self.next_psn
            self.next_tx = now + int(pk.size * 8 * NS_PER_S / self.rc)
            self.next_psn = max(self.next_psn, psn + need)
            if w.kind == "read":
                self.snd, self.snd_i = self.snd + 1, 0
            else:
                self.snd_i += 1
                if self.snd_i >= w.npkts:
                    self.snd, self.snd_i = self.snd + 1, 0
            if self.timer_gen == 0 or self._timer_idle:
                self._arm()
            self.h.send(pk)

    def _wake(self, t: int) -> None:
        if self.pump_at != t:
            self.pump_at = t
            self.loop.at(t, self.pump)

    def _build(self, w: Wqe, psn: int, now: int) -> Packet:
        p, i, n = self.p, self.snd_i, w.npkts
        last = i == n - 1
        ackreq = last or (psn % p.ackreq_every == 0)
        if w.kind == "read":
            off = i * p.pmtu
            return self._pkt(W.READ_REQUEST, psn, reth=(w.va + off, w.rkey, w.length - off))
        paylen = min(p.pmtu, w.length - i * p.pmtu)
        imm = w.imm if last else None
        if w.kind == "send":
            op = (W.SEND_ONLY_IMM if imm is not None else W.SEND_ONLY) if n == 1 else \
                W.SEND_FIRST if i == 0 else (W.SEND_LAST_IMM if imm is not None else W.SEND_LAST) if last \
                else W.SEND_MIDDLE
            return self._pkt(op, psn, ackreq=ackreq, paylen=paylen, imm=imm, se=last)
        op = (W.WRITE_ONLY_IMM if imm is not None else W.WRITE_ONLY) if n == 1 else \
            W.WRITE_FIRST if i == 0 else (W.WRITE_LAST_IMM if imm is not None else W.WRITE_LAST) if last \
            else W.WRITE_MIDDLE
        reth = (w.va, w.rkey, w.length) if op in W.HAS_RETH else None
        return self._pkt(op, psn, ackreq=ackreq, paylen=paylen, imm=imm, reth=reth)

    _timer_idle = False

    def _arm(self) -> None:
        self.timer_gen += 1
        self._timer_idle = False
        to = W.ack_timeout_ns(self.p.timeout)
        if to:
            self.loop.at(self.loop.now + to, self._timeout, self.timer_gen)

    def _timeout(self, gen: int) -> None:
        if gen != self.timer_gen or self.error_ns >= 0:
            return
        if self.una >= self.next_psn:
            self._timer_idle = True
            return
        self.events.append((self.loop.now, "ack_timeout", self.una, self.retry_left))
        self._retry(self.una, "retry")

    def _retry(self, psn: int, counter: str) -> None:
        if counter == "retry":
            self.retry_left -= 1
            if self.retry_left < 0:
                return self._error("retry_exceeded")
        elif self.p.rnr_retry != W.RETRY_INFINITE:
            self.rnr_left -= 1
            if self.rnr_left < 0:
                return self._error("rnr_retry_exceeded")
        self._go_back(psn)
        self._arm()
        self.pump(None)

    def _error(self, why: str) -> None:
        self.error_ns = self.loop.now
        self.events.append((self.loop.now, why, self.una, 0))

    def _go_back(self, psn: int) -> None:
        """Resend from ``psn``: find its WQE (at or after the oldest incomplete one)."""
        for k in range(self.snd if self.snd < len(self.wqes) else len(self.wqes) - 1, -1, -1):
            w = self.wqes[k]
            if w.first_psn >= 0 and w.first_psn <= psn:
                self.snd, self.snd_i = k, psn - w.first_psn
                if self.snd_i >= w.npkts:
                    self.snd, self.snd_i = k + 1, 0
                return

    def _progress(self, psn: int) -> None:
        """Everything up to ``psn`` is acknowledged."""
        if psn < self.una:
            return
        self.una = psn + 1
        self.retry_left, self.rnr_left = self.p.retry_cnt, self.p.rnr_retry
        now, ws, k = self.loop.now, self.wqes, self.done_idx
        while k < len(ws) and ws[k].first_psn >= 0 and ws[k].first_psn + ws[k].npkts <= self.una:
            ws[k].done_ns = now
            k += 1
        self.done_idx = k
        if self.una < self.next_psn:
            self._arm()
        else:
            self.timer_gen += 1
            self._timer_idle = True

    def _on_response(self, pk: Packet) -> None:
        psn = pk.psn
        if pk.opcode == W.ACKNOWLEDGE:
            kind = pk.syndrome & W.AETH_TYPE_MASK
            if kind != W.AETH_ACK and psn < self.una:   # a stale NAK for PSNs already acknowledged
                return
            if kind == W.AETH_ACK:
                self._progress(psn)
            elif kind == W.AETH_RNR_NAK:
                self._progress(psn - 1)
                code = pk.syndrome & W.AETH_VALUE_MASK
                self.events.append((self.loop.now, "rnr_nak", psn, code))
                self.rnr_until = self.loop.now + W.RNR_DELAY_US[code] * 1000
                self._retry(psn, "rnr")
                return
            else:
                self._progress(psn - 1)
                self.events.append((self.loop.now, "nak_seq", psn, pk.syndrome & W.AETH_VALUE_MASK))
                self._retry(psn, "retry")
                return
        else:                                        # a READ response: implicit ACK of earlier PSNs
            if psn == self.una:
                self.read_gap = False
                self._progress(psn)
            elif psn > self.una and not self.read_gap:
                self.read_gap = True
                self.events.append((self.loop.now, "read_gap", self.una, psn))
                self._retry(self.una, "retry")
                return
        self.pump(None)

    def _on_cnp(self) -> None:
        self.cnps_rx += 1
        if not self.p.dcqcn:
            return
        self.rt = self.rc
        self.rc = max(self.p.min_rate_bps, self.rc * (1 - self.alpha / 2))
        self.rc_min = min(self.rc_min, self.rc)
        self.alpha = (1 - self.p.dcqcn_g) * self.alpha + self.p.dcqcn_g
        self.stage = 0
        if not self.rate_timer:
            self.rate_timer = True
            self.loop.at(self.loop.now + self.p.increase_period_ns, self._rate_tick)

    def _rate_tick(self, _arg) -> None:
        p = self.p
        self.alpha *= 1 - p.dcqcn_g
        self.stage += 1
        if self.stage > p.fast_recovery_steps:
            self.rt = min(self.line, self.rt + p.rai_bps)
        self.rc = min(self.line, (self.rt + self.rc) / 2)
        if self.rc >= self.line * 0.999:
            self.rc, self.rate_timer = float(self.line), False
            return
        self.loop.at(self.loop.now + p.increase_period_ns, self._rate_tick)

    # ---- responder ------------------------------------------------------------------------------
    def on_packet(self, pk: Packet) -> None:
        op = pk.opcode
        if op == W.CNP:
            return self._on_cnp()
        if op in RESPONSES:
            return self._on_response(pk)
        now = self.loop.now
        if pk.ecn == W.ECN_CE and now - self.last_cnp >= self.p.cnp_interval_ns:
            self.last_cnp = now
            self.cnps_tx += 1
            self.h.send(self.peer._pkt_from(self, W.CNP, 0, becn=True, cnp=True))
        psn = pk.psn
        if psn > self.epsn:
            if not (self.nak_sent or self.rnr_sent):
                self.nak_sent = True
                self._ack(W.AETH_NAK | W.NAK_PSN_SEQ_ERROR, self.epsn)
            return
        if psn < self.epsn:
            if op == W.READ_REQUEST:
                self._read_responses(pk)
            else:
                self._coalesced_ack()
            return
        if op in (W.SEND_FIRST, W.SEND_ONLY, W.SEND_ONLY_IMM) and self.rq is not None:
            if self.rq <= 0:                  # every attempt at the expected PSN gets its RNR NAK
                self.rnr_sent = True
                self._ack(W.AETH_RNR_NAK | self.p.min_rnr_timer, psn)
                return
            self.rq -= 1
        self.nak_sent = self.rnr_sent = False
        if op == W.READ_REQUEST:
            n = max(1, -(-pk.reth[2] // self.p.pmtu))
            self.epsn = psn + n
            self.msn += 1
            self._read_responses(pk)
            return
        self.epsn = psn + 1
        if op in W.ENDS_MESSAGE:
            self.msn += 1
        if pk.ackreq:
            self._coalesced_ack()

    def _pkt_from(self, resp: "QP", opcode, psn, **kw) -> Packet:
        """A packet sent by ``resp`` (the peer) to this QP."""
        pk = Packet(resp.h, self.h, resp.sport, opcode, self.qpn, psn, **kw)
        pk.route = resp.route
        return pk

    def _ack(self, syndrome: int, psn: int) -> None:
        self.h.send(self.peer._pkt_from(self, W.ACKNOWLEDGE, psn, syndrome=syndrome, msn=self.msn))

    def _credits(self) -> int:
        return W.CREDIT_INVALID if self.rq is None else W.credit_code(max(0, self.rq))

    def _coalesced_ack(self) -> None:
        if not self.ack_pending:
            self.ack_pending = True
            self.loop.at(self.loop.now + self.p.ack_delay_ns, self._send_ack)

    def _send_ack(self, _arg) -> None:
        self.ack_pending = False
        self._ack(W.AETH_ACK | self._credits(), self.epsn - 1)

    def _read_responses(self, req: Packet) -> None:
        va, rkey, length = req.reth
        n = max(1, -(-length // self.p.pmtu))
        for i in range(n):
            paylen = min(self.p.pmtu, length - i * self.p.pmtu)
            op = W.READ_RESP_ONLY if n == 1 else W.READ_RESP_FIRST if i == 0 else \
                W.READ_RESP_LAST if i == n - 1 else W.READ_RESP_MIDDLE
            syn = (W.AETH_ACK | self._credits()) if op in W.HAS_AETH else None
            self.h.send(self.peer._pkt_from(self, op, req.psn + i, syndrome=syn, msn=self.msn, paylen=paylen))

    def post_recv(self, n: int) -> None:
        if self.rq is not None:
            self.rq += n
