"""The TCP connection model (TCP state): a connection as seen at a capture point next to the server.

Handshakes with MSS / window scale / SACK-permitted / timestamp options in Linux and Windows order,
data with delayed ACKs (RFC 9293 §3.8.6.3, RFC 1122 §4.2.3.2) and window-limited bursts, FIN
teardown, RSTs, RTO retransmissions (RFC 6298), duplicate ACKs with SACK blocks and fast retransmits
(RFC 5681 §3.2, RFC 2018), and a zero window with its probe (RFC 9293 §3.8.6.1).
"""
from __future__ import annotations

import random
import struct
from typing import TYPE_CHECKING

from .base import MASK32, MS, SEC, US
from .frames import ACK, FIN, PROTO_TCP, PSH, RST, SYN, Host, Path

if TYPE_CHECKING:
    from .generator import Gen

_TSOPT = struct.Struct("!BBBBII").pack
# Option kinds and lengths (RFC 9293 §3.2; window scale and timestamps RFC 7323 §2.2, §3.2;
# SACK-permitted and SACK RFC 2018 §2, §3)
OPT_NOP, OPT_MSS, OPT_WSCALE, OPT_SACK_OK, OPT_SACK, OPT_TS = 1, 2, 3, 4, 5, 8
LEN_MSS, LEN_WSCALE, LEN_SACK_OK, LEN_TS = 4, 3, 2, 10
SACK_OK = bytes((OPT_SACK_OK, LEN_SACK_OK))
NOP2 = bytes((OPT_NOP, OPT_NOP))
TS_OPTION_LEN = 12                # NOP NOP + timestamps: what the timestamps take from the MSS
MSS_V4, MSS_V6 = 1460, 1440       # Ethernet MTU 1500 minus the IP and TCP headers
SYN_WINDOW, SYNACK_WINDOW = 64240, 65160        # the unscaled windows of a SYN / SYN-ACK
WSCALE_CLIENT, WSCALE_SERVER = 8, 7
RWIN_WINDOWS, RWIN_LINUX, RWIN_SERVER = 256 * 1024, 64128, 65160 * 4
INITIAL_CWND = 10                 # segments (RFC 6928)
MAX_CWND = 400                    # segments: the model's cap on the congestion window
DELAYED_ACK = 40 * MS             # the receivers' delayed-ACK timer
MIN_RTO = 200 * MS                # Linux's minimum RTO (RFC 6298 §2.4 allows a lower bound)
RTO_RTTS = 3                      # an RTO is at least this many RTTs
DUPACK_THRESHOLD = 3              # duplicate ACKs that trigger a fast retransmit (RFC 5681 §3.2)
FOUR_WAY_CLOSE_SHARE = 0.4        # share of closes where the peer ACKs the FIN before sending its own
SYN_RTO = 1 * SEC                 # the initial retransmission timeout of a SYN (RFC 6298 §2.1)


class Tcp:
    """A TCP connection seen at a capture point next to the server (side 1).

    Times are capture times in ns. ``rtt`` is the capture point <-> client round trip; the server
    answers ``near`` ns after a segment passes the capture point. ``send`` returns the capture
    time at which the receiver can first be seen reacting to the data.
    """

    def __init__(self, g: "Gen", cli: Host, srv: Host, dport: int, *, sport: int | None = None,
                 ts: bool | None = None, sack: bool = True):
        self.g = g
        r = g.rng
        self.cli, self.srv = cli, srv
        sport = cli.ephemeral() if sport is None else sport
        self.sport, self.dport = sport, dport
        self.p = (Path(cli, srv, sport, dport, PROTO_TCP, r.getrandbits(16)),
                  Path(srv, cli, dport, sport, PROTO_TCP, r.getrandbits(16)))
        self.rtt = cli.rtt + r.randrange(0, max(1, cli.rtt // 20))
        self.near = r.randrange(6 * US, 30 * US)
        self.ts_on = (not cli.windows) if ts is None else ts
        self.sack = sack
        self.mss = MSS_V6 if cli.v6 else MSS_V4
        if self.ts_on:
            self.mss -= TS_OPTION_LEN
        self.nxt = [r.getrandbits(32), r.getrandbits(32)]
        self.tsoff = [r.getrandbits(32), r.getrandbits(32)]
        self.ws = [WSCALE_CLIENT, WSCALE_SERVER]
        self.rwin = [RWIN_WINDOWS if cli.windows else RWIN_LINUX, RWIN_SERVER]
        self.cwnd = [INITIAL_CWND, INITIAL_CWND]
        self.pend: list[int | None] = [None, None]
        self.delack = DELAYED_ACK
        self.last_loss: tuple[int, int] | None = None
        self.gap = (r.randrange(1200, 2500), r.randrange(1100, 1400))   # per-segment spacing
        # "syn" / "tail": this connection loses its first SYN / first server tail segment (Gen's
        # loss hook, drawn from g.loss_rng so that the main random stream stays as it is)
        self.forced_loss = None
        if g.syn_loss_share or g.tail_loss_share:
            if g.loss_rng is None:
                g.loss_rng, g.losses = random.Random(g.seed * 7919 + 17), []
            x = g.loss_rng.random()
            self.forced_loss = ("syn" if x < g.syn_loss_share else
                                "tail" if x < g.syn_loss_share + g.tail_loss_share else None)

    # -- options ----------------------------------------------------------------------------
    def _tsval(self, side: int, t: int) -> int:
        return (self.tsoff[side] + t // MS) & MASK32

    def _opts(self, side: int, t: int, sack_blocks=None) -> bytes:
        o = b""
        if self.ts_on:
            o = _TSOPT(OPT_NOP, OPT_NOP, OPT_TS, LEN_TS, self._tsval(side, t), self._tsval(1 - side, t - self.rtt))
        if sack_blocks:
            o += NOP2 + bytes((OPT_SACK, 2 + 8 * len(sack_blocks))) + b"".join(
                struct.pack("!II", a & MASK32, b & MASK32) for a, b in sack_blocks)
        return o

    def _syn_opts(self, side: int, t: int) -> bytes:
        mss = struct.pack("!BBH", OPT_MSS, LEN_MSS, self.mss + (TS_OPTION_LEN if self.ts_on else 0))
        ws = bytes((OPT_WSCALE, LEN_WSCALE, self.ws[side]))
        sack_ok = SACK_OK if self.sack else NOP2
        nop = bytes((OPT_NOP,))
        if self.ts_on:          # Linux order: MSS, SACK-permitted, timestamps, NOP, window scale
            tsecr = 0 if side == 0 else self._tsval(0, t - self.rtt)
            ts = struct.pack("!BBII", OPT_TS, LEN_TS, self._tsval(side, t), tsecr)
            return mss + sack_ok + ts + nop + ws
        if side == 0:           # Windows client order: MSS, NOP, window scale, NOP NOP, SACK-permitted
            return mss + nop + ws + NOP2 + sack_ok
        return mss + NOP2 + sack_ok + nop + ws

    # -- raw segments ---------------------------------------------------------------------------
    def seg(self, t: int, side: int, flags: int, payload: bytes = b"", *, seq: int | None = None,
            ack: int | None = None, win: int | None = None, sack_blocks=None, opts=None) -> int:
        if seq is None:
            seq = self.nxt[side]
            self.nxt[side] = (seq + len(payload) + (1 if flags & (SYN | FIN) else 0)) & MASK32
        if ack is None:
            ack = self.nxt[1 - side] if flags & ACK else 0
        if win is None:
            win = min(65535, self.rwin[side] >> self.ws[side])
        if opts is None:
            opts = self._opts(side, t, sack_blocks)
        self.g.store.tcp(t, self.p[side], seq & MASK32, ack & MASK32, flags, win, opts,
                         payload)
        return t

    def lat(self, side: int) -> int:
        """Capture-time delay from a segment sent towards ``side`` to ``side``'s reaction."""
        return self.near if side == 1 else self.rtt

    # -- connection life ------------------------------------------------------------------------
    def open(self, t: int, syn_rto: int | None = None) -> int:
        """Three-way handshake starting at ``t``; returns the time of the client's final ACK.
        ``syn_rto``: the first SYN is lost after the capture point and resent this much later."""
        win0 = SYN_WINDOW
        if syn_rto is None and self.forced_loss == "syn":
            syn_rto = SYN_RTO + self.g.loss_rng.randrange(0, 2 * MS)
            self.g.losses.append(("syn", self.cli.ip, self.sport, self.srv.ip, self.dport, t))
        if syn_rto is not None:          # the same SYN (explicit seq: nxt does not move), then again
            self.seg(t, 0, SYN, seq=self.nxt[0], win=win0, opts=self._syn_opts(0, t))
            t += syn_rto
        self.seg(t, 0, SYN, win=win0, opts=self._syn_opts(0, t))
        t1 = t + self.near
        self.seg(t1, 1, SYN | ACK, win=SYNACK_WINDOW, opts=self._syn_opts(1, t1))
        t2 = t1 + self.rtt
        self.seg(t2, 0, ACK)
        return t2

    def refuse(self, t: int) -> int:
        """SYN answered by RST (closed port)."""
        self.seg(t, 0, SYN, win=SYN_WINDOW, opts=self._syn_opts(0, t))
        t1 = t + self.near
        self.seg(t1, 1, RST | ACK, seq=0, win=0, opts=b"")
        return t1

    def flush(self, side: int, t: int) -> None:
        """Emit ``side``'s delayed ACK if its timer fires before ``t``; otherwise it piggybacks."""
        due = self.pend[side]
        if due is not None:
            if due + self.delack < t:
                self.seg(due + self.delack, side, ACK)
            self.pend[side] = None

    def close(self, t: int, side: int = 0, four_way: bool | None = None) -> int:
        """FIN from ``side`` at ``t`` (or later if it owes a delayed ACK); returns the last time."""
        other = 1 - side
        self.flush(side, t)
        self.flush(other, t)
        self.seg(t, side, FIN | ACK)
        t1 = t + self.lat(other)
        if four_way is None:
            four_way = self.g.rng.random() < FOUR_WAY_CLOSE_SHARE
        if four_way:
            self.seg(t1, other, ACK)
            t1 += self.g.rng.randrange(20 * US, 400 * US)
        self.seg(t1, other, FIN | ACK)
        t2 = t1 + self.lat(side)
        self.seg(t2, side, ACK)
        return t2

    def abort(self, t: int, side: int = 0) -> int:
        self.pend = [None, None]
        self.seg(t, side, RST | ACK, win=0)
        return t

    # -- data -----------------------------------------------------------------------------------
    def send(self, t: int, side: int, data: bytes, *, split: list[int] | None = None,
             loss=None, rto: int | None = None) -> int:
        """``side`` sends ``data`` starting at ``t``; the receiver ACKs every second segment.

        ``split``: explicit segment sizes. ``loss``: ``"rto"`` (the last segment is lost after the
        capture point and resent after an RTO) or ``("fast", k)`` (segment k is lost; duplicate
        ACKs with SACK blocks follow and a fast retransmit). Returns the receiver's reaction time.
        """
        rcv = 1 - side
        if loss is None and side == 1 and self.forced_loss == "tail":     # Gen's loss hook
            self.forced_loss = None
            loss, rto = "rto", max(MIN_RTO, self.rtt * RTO_RTTS) + self.g.loss_rng.randrange(2 * MS, 12 * MS)
            self.g.losses.append(("tail", self.cli.ip, self.sport, self.srv.ip, self.dport, t))
        self.flush(side, t)
        mss = self.mss
        if split is None:
            sizes = [mss] * (len(data) // mss)
            if len(data) % mss:
                sizes.append(len(data) % mss)
        else:
            sizes = split
        n = len(sizes)
        lat_ack = self.lat(rcv)
        lat_go = self.lat(side)
        gap = self.gap[side]
        wnd = max(2, min(self.cwnd[side], self.rwin[rcv] // mss))
        times: list[int] = []
        ti = t
        for i in range(n):
            if i:
                ti += gap
                j = i - wnd
                if j >= 0:
                    k = j | 1
                    lim = times[k] + lat_ack + lat_go
                    if lim > ti:
                        ti = lim
            times.append(ti)
        self.cwnd[side] = min(self.cwnd[side] + n, MAX_CWND)
        seq0 = self.nxt[side]
        starts = [seq0]
        for s in sizes:
            starts.append(starts[-1] + s)
        lost = -1
        if loss == "rto" and n:
            lost = n - 1
        elif isinstance(loss, tuple) and loss[0] == "fast" and loss[1] + DUPACK_THRESHOLD + 1 < n:
            lost = loss[1]
        r = self.g.rng
        t_retx = None
        if lost >= 0:
            if loss == "rto":
                t_retx = times[lost] + (rto if rto is not None else self.rto())
            else:
                # the third duplicate ACK is caused by segment lost+3; the sender is window-limited
                # at the end of the burst, so its last segment leaves after the retransmission
                t_retx = times[lost + DUPACK_THRESHOLD] + lat_ack + lat_go + r.randrange(1 * US, 8 * US)
                if t_retx >= times[-1]:
                    times[-1] = t_retx + gap
        # receiver side: arrivals in order of time
        arrivals = [(times[i] + lat_ack, i) for i in range(n) if i != lost]
        if t_retx is not None:
            arrivals.append((t_retx + lat_ack, -1))
            arrivals.sort()
        acks: list[tuple[int, int, list | None]] = []      # (time, ack seq, sack blocks)
        unacked = 0
        last_unacked = None
        if self.pend[rcv] is not None:
            unacked, last_unacked = 1, self.pend[rcv]
            self.pend[rcv] = None
        have = set()
        contiguous = 0          # number of leading segments received
        prev = 0
        for a, i in arrivals:
            a = prev = max(a + r.randrange(0, 3 * US), prev)   # the receiver's ACKs keep their order
            if unacked and last_unacked + self.delack < a:
                acks.append((last_unacked + self.delack, starts[contiguous], None))
                unacked = 0
            if i == -1:
                i = lost
            have.add(i)
            if i == contiguous:
                while contiguous in have:
                    contiguous += 1
                if lost >= 0 and i == lost:
                    acks.append((a, starts[contiguous], None))
                    unacked = 0
                    continue
                unacked += 1
                last_unacked = a
                if unacked >= 2 or (lost >= 0 and contiguous == n):
                    acks.append((a, starts[contiguous], None))
                    unacked = 0
            else:      # out of order: immediate duplicate ACK
                hi = max(x for x in have if x > contiguous)
                blocks = [(starts[lost + 1], starts[hi + 1])] if self.sack else None
                acks.append((a, starts[contiguous], blocks))
                unacked = 0
        if unacked:
            self.pend[rcv] = last_unacked
        # emit in time order: data first on ties
        out = [(times[i], 0, i) for i in range(n)]
        if t_retx is not None:
            out.append((t_retx, 1, lost))
        out += [(acks[j][0], 2, j) for j in range(len(acks))]
        out.sort()
        rwin = self.rwin[rcv]
        for tt, kind, i in out:
            if kind == 2:
                _, ackno, blocks = acks[i]
                self.seg(tt, rcv, ACK, ack=ackno, sack_blocks=blocks)
            else:
                payload = data[starts[i] - seq0:starts[i + 1] - seq0]
                fl = ACK | PSH if i == n - 1 or kind == 1 else ACK
                self.seg(tt, side, fl, payload, seq=starts[i], ack=self.nxt[rcv])
        self.nxt[side] = starts[n] & MASK32
        self.rwin[rcv] = rwin
        if t_retx is not None:
            self.last_loss = (times[lost], t_retx)
        last = max(arrivals)[0] if arrivals else t
        return last

    def rto(self) -> int:
        return max(MIN_RTO, self.rtt * RTO_RTTS) + self.g.rng.randrange(2 * MS, 12 * MS)

    def zero_window(self, t: int, n_before: int = 6, stall: int = 350 * MS) -> int:
        """Server -> client transfer into a receiver that stops reading: the client's window shrinks
        to zero, the server probes, the client later opens the window and the transfer resumes."""
        mss = self.mss
        self.flush(1, t)
        self.pend[0] = None          # the client's ACKs below cover anything it owed
        win_bytes = n_before * mss
        shift = self.ws[0]
        ti = t
        for i in range(n_before):
            self.seg(ti, 1, ACK | PSH, self.g.payload(mss))
            if i % 2 == 1:
                win_bytes -= 2 * mss
                self.seg(ti + self.rtt, 0, ACK, win=max(0, win_bytes) >> shift)
            ti += self.gap[1]
        last_ack_t = ti - self.gap[1] + self.rtt
        probe_t = last_ack_t + self.rto()
        self.seg(probe_t, 1, ACK, self.g.payload(1), seq=self.nxt[1])      # zero window probe
        self.seg(probe_t + self.rtt, 0, ACK, win=0)
        upd = probe_t + stall
        self.seg(upd, 0, ACK, win=self.rwin[0] >> shift)               # window update
        t2 = upd + self.near
        tail = self.g.payload(3 * mss)
        return self.send(t2, 1, tail)

