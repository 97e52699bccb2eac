"""Hand-made rocev2_packets rows for the RoCEv2 transport detectors' tests (gbn_retransmission,
rnr_retry): a queue pair's requests and its responder's ACK / NAK / RNR NAK, as a mirror would record
them, in the decoder's schema (analyzer.decoders.rocev2.PACKET_COLUMNS). Times in ns after fakes.T0.

``Qp`` writes one QP pair's packets; ``frame(*qps)`` numbers them in time order (Wireshark frame
numbers) and builds the frame; ``gbn_trace`` is a small deterministic go-back-N requester/responder
(IBA §9.7.4-9.7.5) for loss patterns whose amplification is known by construction."""
from __future__ import annotations

import polars as pl

from analyzer.decoders.rocev2 import PACKET_COLUMNS
from fakes import T0, FakeCapture, columns_frame

WRITE_MIDDLE, WRITE_LAST, SEND_ONLY, ACKNOWLEDGE, CNP = 0x07, 0x08, 0x04, 0x11, 0x81
PSN_MASK = (1 << 24) - 1


class Qp:
    """One QP pair: ``requester`` (its QPN ``rq``: the DestQP of its responses) and ``responder``
    (``sq``: the DestQP of its requests)."""

    def __init__(self, pair: int = 1, requester: str = "10.0.0.1", responder: str = "10.1.0.1", rq: int = 0x2E1,
                 sq: int = 0x381, sport: int = 0xC101):
        self.pair, self.requester, self.responder, self.rq, self.sq, self.sport = pair, requester, responder, rq, sq, sport
        self.rows: list[dict] = []

    def _row(self, t, src, dst, qpn, psn, opcode, transport="RC", **aeth):
        row = {"ts_ns": T0 + int(t), "src": src, "dst": dst, "sport": self.sport, "dport": 4791, "opcode": opcode,
               "transport": transport, "dest_qp": qpn, "psn": psn & PSN_MASK, "ackreq": False, "status": "ok",
               "qp_pair": self.pair, "ecn": 2, "se": False, "migreq": True, "pad_count": 0, "tver": 0,
               "pkey": 0xFFFF, "fecn": False, "becn": False, "icrc_present": True, "payload_len": 0}
        row.update(aeth)
        self.rows.append(row)
        return self

    def send(self, t, psn, opcode=WRITE_MIDDLE):
        return self._row(t, self.requester, self.responder, self.sq, psn, opcode, payload_len=1024,
                         direction="requester")

    def ack(self, t, psn, credit=31):
        return self._row(t, self.responder, self.requester, self.rq, psn, ACKNOWLEDGE, aeth_syndrome=credit,
                         aeth_kind="ack", aeth_credit=credit, aeth_msn=0, direction="responder")

    def nak(self, t, psn, code=0):
        return self._row(t, self.responder, self.requester, self.rq, psn, ACKNOWLEDGE, aeth_syndrome=0x60 | code,
                         aeth_kind="nak", aeth_nak_code=code, aeth_msn=0, direction="responder")

    def rnr(self, t, psn, timer=12):
        return self._row(t, self.responder, self.requester, self.rq, psn, ACKNOWLEDGE, aeth_syndrome=0x20 | timer,
                         aeth_kind="rnr_nak", aeth_rnr_timer=timer, aeth_msn=0, direction="responder")

    def without(self, src: str) -> "Qp":
        """The same QP with every packet sent by ``src`` dropped (a direction the mirror missed)."""
        self.rows = [r for r in self.rows if r["src"] != src]
        return self


def frame(*qps: Qp) -> pl.DataFrame:
    rows = sorted((r for q in qps for r in q.rows), key=lambda r: r["ts_ns"])
    for k, r in enumerate(rows):
        r["frame"] = k + 1
    return columns_frame(PACKET_COLUMNS, rows)


def capture(*qps: Qp, resolution_ns: float = 1.0) -> FakeCapture:
    return FakeCapture(resolution_ns=resolution_ns, rocev2_packets=frame(*qps))


def gbn_trace(qp: Qp, *, n: int, losses=(), t0: int = 0, gap_ns: int = 100, nak_after: int = 30,
              ack_every: int = 16, ack_delay_ns: int = 2_000, psn0: int = 0) -> int:
    """A go-back-N exchange of ``n`` PSNs from ``psn0``, one request every ``gap_ns``: a PSN in
    ``losses`` is lost (not captured) the first time; the responder NAKs it once when the next PSN
    arrives, the NAK reaches the requester ``nak_after`` requests later, and the requester goes back
    to it. ACKs every ``ack_every`` in-order PSNs, ``ack_delay_ns`` later. Returns the last time."""
    t, nxt, epsn, nak_at, nak_psn, lost = t0, psn0, psn0, None, None, set()
    while nxt < psn0 + n:
        psn = nxt
        if psn - psn0 in losses and psn not in lost:
            lost.add(psn)                      # lost before the mirror: not captured
        else:
            qp.send(t, psn)
            if psn == epsn:
                epsn += 1
                if (psn - psn0) % ack_every == ack_every - 1:
                    qp.ack(t + ack_delay_ns, psn)
            elif psn > epsn and nak_at is None and nak_psn != epsn:
                nak_psn, nak_at = epsn, nxt + nak_after
                qp.nak(t + gap_ns // 2, epsn)
        nxt += 1
        t += gap_ns
        if nak_at is not None and nxt >= nak_at:
            nxt, nak_at = nak_psn, None
    qp.ack(t + ack_delay_ns, epsn - 1)
    return t
