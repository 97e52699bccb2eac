"""TCP segment analysis with Wireshark's definitions (``tcp.analysis.*``).

Transcribed from Wireshark's ``tcp_analyze_sequence_number`` (epan/dissectors/packet-tcp.c, the 3.x/4.0
form) and its window-scaling rules (``verify_tcp_window_scaling``), so each flag means what a Wireshark
user expects; see the user guide's "TCP Analysis" section for the prose definitions. Segments are
processed per connection direction in capture order. Wireshark's quirks are kept on purpose (a zero
``nextseq``/``lastack`` means "not seen yet"; an ACK RTT is only measured on an ACK that exactly matches
a segment's end) so the flags agree frame by frame.

``dissect_tcp`` (4.0) also adjusts a flow before ``tcp_analyze_sequence_number`` runs; reproduced:
- A SYN (no ACK) with the ISN already recorded for its direction (a resent SYN; a different ISN starts
  a new connection, see ``connections.py``) resets the direction's highest sequence number to the
  highest contiguous one (``nextseq = maxseqtobeacked``, Wireshark issue 17616): an RST sent with the
  sequence number of a stale ACK it answers must not make the data after the new handshake look
  retransmitted.
- A SYN/ACK whose sequence number differs from the base recorded for its direction (the base was
  guessed from a stale ACK, or the server answered a resent SYN with a new ISN) is flagged
  ``reused_ports`` and becomes the direction's new base (Wireshark issue 16944); the connection stays.
- Bytes in flight subtract the SACK blocks of the last segment the receiver sent (its first three
  blocks: Wireshark stores blocks 1..3 of ``MAX_TCP_SACK_RANGES``; the counter is reset on every segment
  of that direction, so a segment without SACK clears them), in 32-bit unsigned arithmetic.

Where herdscope measures more than Wireshark (documented differences):
- Time differences (the 20 ms fast-retransmission window, the out-of-order threshold) are unsigned in
  Wireshark (``guint64 t``): when the capture's timestamps go backwards (merged interfaces, per-CPU
  capture buffers) the difference is huge and the test fails. herdscope does the same (``0 <= t``), so a
  segment resent 0.5 ms after a shorter one at the same sequence number, behind an ACK stamped later
  than both, is out-of-order (not a fast retransmission) in both.
- ``ooo_threshold_ns``: Wireshark calls a segment out-of-order instead of retransmitted when it arrives
  within 3 ms (or the handshake RTT, when known) of the highest segment. herdscope uses the handshake
  RTT as Wireshark does, and the default 3 ms otherwise; on µs-RTT paths pass a smaller value.
- ``rtt_ns``: the ACK RTT with Karn's rule applied (no sample when the acknowledged data was sent more
  than once); ``ack_rtt_ns`` is Wireshark's value, which times retransmitted data from the first copy.
- SACK (RFC 2018): Wireshark's flags ignore SACK blocks, and its bytes in flight only subtract the last
  SACK option (above). herdscope keeps a per-direction scoreboard of every SACK block still above the
  cumulative ACK and flags a retransmission of data the receiver had already SACKed
  (``SACKED_RETRANSMISSION``, a spurious retransmission Wireshark cannot see), and reports
  ``pipe_bytes``, the unacknowledged bytes minus the scoreboard's SACKed bytes (RFC 6675's pipe),
  beside Wireshark's ``bytes_in_flight``.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import numpy as np

from ..jit import njit

# Analysis flag bits (the ``analysis`` column); names are Wireshark's tcp.analysis.* fields.
RETRANSMISSION = 1 << 0
FAST_RETRANSMISSION = 1 << 1
SPURIOUS_RETRANSMISSION = 1 << 2
OUT_OF_ORDER = 1 << 3
LOST_SEGMENT = 1 << 4  # tcp.analysis.lost_segment: "previous segment not captured"
ACK_LOST_SEGMENT = 1 << 5  # tcp.analysis.ack_lost_segment: "ACKed unseen segment"
DUPLICATE_ACK = 1 << 6
ZERO_WINDOW = 1 << 7
ZERO_WINDOW_PROBE = 1 << 8
ZERO_WINDOW_PROBE_ACK = 1 << 9
WINDOW_FULL = 1 << 10
WINDOW_UPDATE = 1 << 11
KEEP_ALIVE = 1 << 12
KEEP_ALIVE_ACK = 1 << 13
REUSED_PORTS = 1 << 14
SACKED_RETRANSMISSION = 1 << 15  # herdscope: retransmits bytes the receiver had SACKed
DSACK = 1 << 16  # herdscope: this ACK carries a D-SACK block (RFC 2883: duplicate data received)
DSACKED_RETRANSMISSION = 1 << 17  # herdscope: a retransmission a later D-SACK reported as a duplicate

FLAG_NAMES = {
    RETRANSMISSION: "retransmission", FAST_RETRANSMISSION: "fast_retransmission",
    SPURIOUS_RETRANSMISSION: "spurious_retransmission", OUT_OF_ORDER: "out_of_order",
    LOST_SEGMENT: "lost_segment", ACK_LOST_SEGMENT: "ack_lost_segment", DUPLICATE_ACK: "duplicate_ack",
    ZERO_WINDOW: "zero_window", ZERO_WINDOW_PROBE: "zero_window_probe",
    ZERO_WINDOW_PROBE_ACK: "zero_window_probe_ack", WINDOW_FULL: "window_full",
    WINDOW_UPDATE: "window_update", KEEP_ALIVE: "keep_alive", KEEP_ALIVE_ACK: "keep_alive_ack",
    REUSED_PORTS: "reused_ports", SACKED_RETRANSMISSION: "sacked_retransmission", DSACK: "dsack",
    DSACKED_RETRANSMISSION: "dsacked_retransmission",
}
ANY_RETRANSMISSION = RETRANSMISSION | FAST_RETRANSMISSION | SPURIOUS_RETRANSMISSION | SACKED_RETRANSMISSION

TH_FIN, TH_SYN, TH_RST, TH_PUSH, TH_ACK = 0x01, 0x02, 0x04, 0x08, 0x10

MAX_UNACKED_SEGMENTS = 10000  # Wireshark's TCP_MAX_UNACKED_SEGMENTS
FAST_RETRANSMISSION_WINDOW_NS = 20_000_000  # Wireshark: within 20 ms of the last duplicate ACK
MAX_SACK_RANGES = 16  # scoreboard ranges kept per direction
MAX_RETX_TRACKED = 8  # recent retransmissions kept per direction for D-SACK matching (12 bytes each)
# Wireshark's MAX_TCP_SACK_RANGES is 4, but dissect_tcpopt_sack stores block k (1-based) only while
# k < 4: the bytes-in-flight subtraction sees at most three blocks of a SACK option
WS_BIF_SACK_BLOCKS = 3
BIF_LIMIT = 2_000_000_000  # Wireshark shows bytes in flight only when 0 < value < this


@dataclass(frozen=True)
class Params:
    """Thresholds of the analysis. Defaults reproduce Wireshark 4.0."""

    ooo_threshold_ns: int = 3_000_000  # used until the handshake RTT is known (then that RTT)
    use_handshake_rtt_for_ooo: bool = True  # Wireshark's behaviour


Segments = namedtuple("Segments", ["conn", "side", "ts", "frame", "seq", "ack", "flags", "window", "wscale",
                                   "seglen", "sack_start", "sack_count"])
Analysis = namedtuple("Analysis", ["flags", "dupack_num", "dupack_frame", "acks_frame", "ack_rtt_ns", "rtt_ns",
                                   "bytes_in_flight", "pipe_bytes", "window_size", "rto_ns", "rto_frame",
                                   "since_prev_same_dir_ns", "initial_rtt_ns", "seq_rel", "ack_rel"])


# each output's dtype and "not measured" value (0 or -1; those become nulls)
ANALYSIS_OUTPUTS = {"flags": (np.uint32, 0), "dupack_num": (np.uint32, 0), "dupack_frame": (np.uint32, 0),
                    "acks_frame": (np.uint32, 0), "ack_rtt_ns": (np.int64, -1), "rtt_ns": (np.int64, -1),
                    "bytes_in_flight": (np.int64, -1), "pipe_bytes": (np.int64, -1),
                    "window_size": (np.int64, -1), "rto_ns": (np.int64, -1), "rto_frame": (np.uint32, 0),
                    "since_prev_same_dir_ns": (np.int64, -1), "initial_rtt_ns": (np.int64, -1),
                    "seq_rel": (np.uint32, 0), "ack_rel": (np.uint32, 0)}
# what the analysis itself reads back of its outputs (a retransmission D-SACKed later is marked then)
READ_BACK_OUTPUTS = ("flags",)


def allocate_analysis(n: int, kept=None) -> Analysis:
    """Outputs of :func:`analyze` for ``n`` segments, each at its "not measured" value. ``ack_rel`` is
    written for segments with ACK only: that bit is its validity. ``kept``: the outputs wanted (None:
    all); each other one is a single slot the kernel writes every row to (:func:`_put`), so that a scan
    does not hold 8 bytes a segment of what nobody reads (issue 13; ``analysis.py``'s outputs are 92
    bytes a segment, 56 of them unread by the detectors)."""
    assert tuple(ANALYSIS_OUTPUTS) == Analysis._fields, "ANALYSIS_OUTPUTS out of step with Analysis"
    wanted = set(ANALYSIS_OUTPUTS if kept is None else kept) | set(READ_BACK_OUTPUTS)
    return Analysis(*(np.full(n if name in wanted else min(n, 1), missing, dtype)
                      for name, (dtype, missing) in ANALYSIS_OUTPUTS.items()))


@njit(cache=True, inline="always")
def _put(values, i, value):
    """Row ``i`` of an output of :func:`analyze` set to ``value``; an output not kept
    (:func:`allocate_analysis`) has one slot, written whatever the row."""
    values[min(i, values.shape[0] - 1)] = value


@njit(cache=True)
def sack_ranges(frames, sack_frames):
    """For each segment frame, the first row and the number of its SACK blocks in ``sack_frames`` (the
    ``tcp_sack`` frame's, ascending): a merge while ``frames`` ascend (capture order), a binary search
    where they do not."""
    n = frames.shape[0]
    m = sack_frames.shape[0]
    start = np.empty(n, np.int64)
    count = np.empty(n, np.int64)
    j = 0
    for i in range(n):
        f = np.int64(frames[i])
        if i > 0 and f < np.int64(frames[i - 1]):
            j = np.searchsorted(sack_frames, frames[i])
        while j < m and np.int64(sack_frames[j]) < f:
            j += 1
        k = j
        while k < m and np.int64(sack_frames[k]) == f:
            k += 1
        start[i] = j
        count[i] = k - j
    return start, count


@njit(cache=True, inline="always")
def _d(a, b):
    """Signed 32-bit sequence difference a - b (RFC 1982 arithmetic)."""
    x = (np.int64(a) - np.int64(b)) & 0xFFFFFFFF
    return x - 0x100000000 if x >= 0x80000000 else x


@njit(cache=True, inline="always")
def _u32(x):
    return np.int64(x) & 0xFFFFFFFF


@njit(cache=True, inline="always")
def _many_dupacks(n):
    """Wireshark's ``dupacknum >= 2`` on an unsigned counter that may hold -1 (see ACKED LOST PACKET)."""
    return n >= 2 or n == -1


@njit(cache=True, _nrt=False)
def _sack_covered(lo, hi, sk_lo, sk_hi, sk_n, d):
    """True when [lo, hi) lies inside one SACK range of direction d's scoreboard."""
    for k in range(sk_n[d]):
        if _d(lo, sk_lo[d, k]) >= 0 and _d(hi, sk_hi[d, k]) <= 0:
            return True
    return False


@njit(cache=True)
def analyze(seg, n_conn, sack_left, sack_right, ooo_default_ns, use_hs_rtt, out):
    n = seg.conn.shape[0]
    nd = 2 * n_conn
    # per-direction state (index conn*2 + side); 0 means "not seen" where Wireshark tests truthiness
    base_seq = np.zeros(nd, np.int64)
    base_set = np.zeros(nd, np.bool_)
    nextseq = np.zeros(nd, np.int64)
    nextseq_frame = np.zeros(nd, np.int64)
    nextseq_time = np.zeros(nd, np.int64)
    lastack = np.zeros(nd, np.int64)
    lastack_time = np.zeros(nd, np.int64)
    lastnondupack = np.zeros(nd, np.int64)
    dupacknum = np.zeros(nd, np.int64)
    window = np.zeros(nd, np.int64)
    win_scale = np.full(nd, -1, np.int64)
    maxseqtobeacked = np.zeros(nd, np.int64)
    lastsegmentflags = np.zeros(nd, np.int64)
    valid_bif = np.ones(nd, np.bool_)
    last_ts = np.full(nd, -1, np.int64)
    last_row = np.full(nd, -1, np.int64)  # the direction's latest segment (its SACK blocks feed the BiF)
    head = np.full(nd, -1, np.int64)
    count = np.zeros(nd, np.int64)
    sk_lo = np.zeros((nd, MAX_SACK_RANGES), np.int64)
    sk_hi = np.zeros((nd, MAX_SACK_RANGES), np.int64)
    sk_n = np.zeros(nd, np.int64)
    # the direction's recent retransmissions (ring): sequence range and row, for D-SACK matching
    rx_seq = np.zeros((nd, MAX_RETX_TRACKED), np.uint32)
    rx_end = np.zeros((nd, MAX_RETX_TRACKED), np.uint32)
    rx_row = np.full((nd, MAX_RETX_TRACKED), -1, np.int32)
    rx_n = np.zeros(nd, np.int64)
    # per-connection
    first_rtt = np.zeros(n_conn, np.int64)
    mru_syn = np.zeros(n_conn, np.int64)
    # unacked-segment pool (one entry per segment at most), singly linked newest → oldest
    e_seq = np.zeros(n, np.int64)
    e_next_seq = np.zeros(n, np.int64)
    e_data_end = np.zeros(n, np.int64)  # seq + seglen: the SYN/FIN sequence number is not data in flight
    e_frame = np.zeros(n, np.int64)
    e_ts = np.zeros(n, np.int64)
    e_retx = np.zeros(n, np.bool_)
    e_link = np.full(n, -1, np.int64)

    for i in range(n):
        c = np.int64(seg.conn[i])
        fwd = c * 2 + seg.side[i]
        rev = c * 2 + 1 - seg.side[i]
        ts = seg.ts[i]
        frame = np.int64(seg.frame[i])
        seq = _u32(seg.seq[i])
        ack = _u32(seg.ack[i])
        flags = np.int64(seg.flags[i])
        seglen = np.int64(seg.seglen[i])
        raw_window = np.int64(seg.window[i])
        ta = np.int64(0)

        if last_ts[fwd] >= 0:
            _put(out.since_prev_same_dir_ns, i, ts - last_ts[fwd])
        last_ts[fwd] = ts

        # handshake RTT (tcp.analysis.initial_rtt): most recent SYN to the first ACK after it
        if flags & TH_SYN:
            if not flags & TH_ACK:
                mru_syn[c] = ts
        elif (flags & TH_ACK) and first_rtt[c] == 0 and mru_syn[c] != 0:
            first_rtt[c] = ts - mru_syn[c]
        if first_rtt[c]:
            _put(out.initial_rtt_ns, i, first_rtt[c])

        # window scaling (dissect_tcpopt_wscale + verify_tcp_window_scaling)
        if flags & TH_SYN:
            if seg.wscale[i] >= 0:
                win_scale[fwd] = min(np.int64(seg.wscale[i]), 14)
            if win_scale[fwd] == -1:
                win_scale[fwd] = -2
                win_scale[rev] = -2
            elif (flags & TH_ACK) and win_scale[rev] == -2:
                win_scale[fwd] = -2
            _put(out.window_size, i, raw_window)
        elif win_scale[fwd] >= 0:
            _put(out.window_size, i, raw_window << win_scale[fwd])
        elif win_scale[fwd] == -2:
            _put(out.window_size, i, raw_window)
        # else: scaling unknown (no SYN seen): window_size stays -1 (null), as Wireshark's calc unknown

        # dissect_tcp, before the analysis: a resent SYN restores the highest contiguous sequence number
        # (issue 17616); a SYN/ACK with a new sequence number rebases its direction (issue 16944)
        if base_set[fwd] and (flags & (TH_SYN | TH_ACK)) == TH_SYN and seq == base_seq[fwd]:
            nextseq[fwd] = maxseqtobeacked[fwd]
        if base_set[fwd] and (flags & (TH_SYN | TH_ACK)) == (TH_SYN | TH_ACK) and seq != base_seq[fwd]:
            base_seq[fwd] = seq
            ta |= REUSED_PORTS
        # base sequence numbers
        if not base_set[fwd]:
            base_seq[fwd] = seq if flags & TH_SYN else _u32(seq - 1)
            base_set[fwd] = True
        if not base_set[rev] and (flags & TH_ACK):
            base_seq[rev] = _u32(ack - 1)
            base_set[rev] = True
        if flags & TH_ACK:
            valid_bif[rev] = True
        # Wireshark's relative sequence numbers (tcp.seq / tcp.ack)
        _put(out.seq_rel, i, _u32(seq - base_seq[fwd]))
        if flags & TH_ACK:
            _put(out.ack_rel, i, _u32(ack - base_seq[rev]))

        # D-SACK (RFC 2883 4): the first block below the cumulative ACK, or inside the second block
        if seg.sack_count[i] > 0 and (flags & TH_ACK):
            lo0 = _u32(sack_left[seg.sack_start[i]])
            hi0 = _u32(sack_right[seg.sack_start[i]])
            dup = _d(hi0, lo0) > 0 and _d(hi0, ack) <= 0
            if not dup and seg.sack_count[i] > 1 and _d(hi0, lo0) > 0:
                lo1 = _u32(sack_left[seg.sack_start[i] + 1])
                hi1 = _u32(sack_right[seg.sack_start[i] + 1])
                dup = _d(lo0, lo1) >= 0 and _d(hi0, hi1) <= 0
            if dup:
                ta |= DSACK
                for k in range(min(rx_n[rev], MAX_RETX_TRACKED)):  # newest first
                    slot = (rx_n[rev] - 1 - k) % MAX_RETX_TRACKED
                    if _d(rx_seq[rev, slot], hi0) < 0 and _d(rx_end[rev, slot], lo0) > 0 \
                            and not out.flags[rx_row[rev, slot]] & DSACKED_RETRANSMISSION:
                        out.flags[rx_row[rev, slot]] |= DSACKED_RETRANSMISSION
                        break
        # SACK scoreboard of the data this segment's sender has *received* (it describes rev's data)
        for k in range(seg.sack_count[i]):
            lo = _u32(sack_left[seg.sack_start[i] + k])
            hi = _u32(sack_right[seg.sack_start[i] + k])
            if _d(hi, lo) <= 0:
                continue
            merged = False
            for m in range(sk_n[rev]):
                if _d(lo, sk_hi[rev, m]) <= 0 and _d(hi, sk_lo[rev, m]) >= 0:
                    if _d(lo, sk_lo[rev, m]) < 0:
                        sk_lo[rev, m] = lo
                    if _d(hi, sk_hi[rev, m]) > 0:
                        sk_hi[rev, m] = hi
                    merged = True
                    break
            if not merged:
                if sk_n[rev] < MAX_SACK_RANGES:
                    sk_lo[rev, sk_n[rev]] = lo
                    sk_hi[rev, sk_n[rev]] = hi
                    sk_n[rev] += 1
        if flags & TH_ACK:  # drop scoreboard ranges the cumulative ACK has passed
            k = 0
            while k < sk_n[rev]:
                if _d(sk_hi[rev, k], ack) <= 0:
                    sk_n[rev] -= 1
                    sk_lo[rev, k] = sk_lo[rev, sk_n[rev]]
                    sk_hi[rev, k] = sk_hi[rev, sk_n[rev]]
                else:
                    k += 1

        finished_fwd = False
        # ZERO WINDOW PROBE
        if seglen == 1 and seq == nextseq[fwd] and window[rev] == 0:
            ta |= ZERO_WINDOW_PROBE
            finished_fwd = True
        if not finished_fwd:
            # ZERO WINDOW
            if raw_window == 0 and (flags & (TH_RST | TH_FIN | TH_SYN)) == 0:
                ta |= ZERO_WINDOW
            # LOST PACKET (previous segment not captured)
            if nextseq[fwd] and _d(seq, nextseq[fwd]) > 0 and (flags & TH_RST) == 0:
                ta |= LOST_SEGMENT
                valid_bif[fwd] = False
            # KEEP ALIVE
            if (seglen == 0 or seglen == 1) and seq == _u32(nextseq[fwd] - 1) \
                    and (flags & (TH_SYN | TH_FIN | TH_RST)) == 0:
                ta |= KEEP_ALIVE
            # WINDOW UPDATE
            if seglen == 0 and raw_window and raw_window != window[fwd] and seq == nextseq[fwd] \
                    and ack == lastack[fwd] and (flags & (TH_SYN | TH_FIN | TH_RST)) == 0:
                ta |= WINDOW_UPDATE
            # WINDOW FULL
            if seglen > 0 and win_scale[rev] != -1 and (flags & (TH_SYN | TH_FIN | TH_RST)) == 0:
                shift = 0 if win_scale[rev] == -2 else win_scale[rev]
                if _u32(seq + seglen) == _u32(lastack[rev] + (window[rev] << shift)):
                    ta |= WINDOW_FULL
            # KEEP ALIVE ACK
            if seglen == 0 and raw_window and raw_window == window[fwd] and seq == nextseq[fwd] \
                    and ack == lastack[fwd] and (lastsegmentflags[rev] & KEEP_ALIVE) \
                    and (flags & (TH_SYN | TH_FIN | TH_RST)) == 0:
                ta |= KEEP_ALIVE_ACK
                finished_fwd = True
        if not finished_fwd:
            # ZERO WINDOW PROBE ACK
            if seglen == 0 and raw_window == 0 and raw_window == window[fwd] and seq == nextseq[fwd] \
                    and ack == lastack[fwd] and (lastsegmentflags[rev] & ZERO_WINDOW_PROBE) \
                    and (flags & (TH_SYN | TH_FIN | TH_RST)) == 0:
                ta |= ZERO_WINDOW_PROBE_ACK
                finished_fwd = True
        if not finished_fwd:
            # DUPLICATE ACK
            if seglen == 0 and raw_window and raw_window == window[fwd] and seq == nextseq[fwd] \
                    and ack == lastack[fwd] and (flags & (TH_SYN | TH_FIN | TH_RST)) == 0:
                dupacknum[fwd] = 1 if dupacknum[fwd] == -1 else dupacknum[fwd] + 1
                ta |= DUPLICATE_ACK
                _put(out.dupack_num, i, dupacknum[fwd])
                _put(out.dupack_frame, i, lastnondupack[fwd])

        # finished_fwd:
        if ack != lastack[fwd]:
            lastnondupack[fwd] = frame
            dupacknum[fwd] = 0
        # ACKED LOST PACKET. Wireshark 4.0.17 also marks the other direction's duplicate-ACK counter
        # with -1; the counter is unsigned there, so -1 passes the ">= 2 duplicate ACKs" test of fast
        # retransmission below. Reproduced (``_many_dupacks``): tshark agrees frame by frame.
        if maxseqtobeacked[rev] and _d(ack, maxseqtobeacked[rev]) > 0 and (flags & TH_ACK):
            ta |= ACK_LOST_SEGMENT
            maxseqtobeacked[rev] = nextseq[rev]
            dupacknum[rev] = -1

        # RETRANSMISSION / FAST RETRANSMISSION / OUT-OF-ORDER / SPURIOUS
        if seglen > 0 or (flags & (TH_SYN | TH_FIN)):
            seq_not_advanced = nextseq[fwd] != 0 and _d(seq, nextseq[fwd]) < 0
            if not (ta & KEEP_ALIVE):
                if seglen > 1 and _u32(nextseq[fwd] - 1) == seq:
                    seq_not_advanced = False
                classified = False
                # Wireshark 4.0 tests for a spurious retransmission first, then fast, then out-of-order
                if seglen > 0 and lastack[rev] and _d(_u32(seq + seglen), lastack[rev]) <= 0:
                    ta |= SPURIOUS_RETRANSMISSION
                    classified = True
                # Wireshark holds these time differences in a guint64: a timestamp going backwards makes
                # them huge, never "within" a window (0 <= t below)
                t = ts - lastack_time[rev]
                if not classified and seq_not_advanced and _many_dupacks(dupacknum[rev]) and lastack[rev] == seq \
                        and 0 <= t < FAST_RETRANSMISSION_WINDOW_NS:
                    ta |= FAST_RETRANSMISSION
                    classified = True
                if not classified:
                    t = ts - nextseq_time[fwd]
                    ooo_thres = ooo_default_ns
                    if use_hs_rtt and first_rtt[c]:
                        ooo_thres = first_rtt[c]
                    syn_fin = 1 if flags & (TH_SYN | TH_FIN) else 0
                    if seq_not_advanced and 0 <= t < ooo_thres and nextseq[fwd] != _u32(seq + seglen + syn_fin):
                        ta |= OUT_OF_ORDER
                        classified = True
                if not classified and seq_not_advanced:
                    ta |= RETRANSMISSION
                    _put(out.rto_ns, i, ts - nextseq_time[fwd])
                    _put(out.rto_frame, i, nextseq_frame[fwd])
                    if seglen > 0 and _sack_covered(seq, _u32(seq + seglen), sk_lo, sk_hi, sk_n, fwd):
                        ta |= SACKED_RETRANSMISSION
                if seglen > 0 and (ta & (ANY_RETRANSMISSION | OUT_OF_ORDER)):
                    slot = rx_n[fwd] % MAX_RETX_TRACKED
                    rx_seq[fwd, slot] = seq
                    rx_end[fwd, slot] = _u32(seq + seglen)
                    rx_row[fwd, slot] = i
                    rx_n[fwd] += 1

        # finished_checking_retransmission_type:
        nseq = _u32(seq + seglen)
        if (seglen or (flags & (TH_SYN | TH_FIN))) and count[fwd] < MAX_UNACKED_SEGMENTS:
            if flags & (TH_SYN | TH_FIN):
                nseq = _u32(nseq + 1)
            e_seq[i] = seq
            e_next_seq[i] = nseq
            e_data_end[i] = _u32(seq + seglen)
            e_frame[i] = frame
            e_ts[i] = ts
            is_retx = (ta & (RETRANSMISSION | FAST_RETRANSMISSION | SPURIOUS_RETRANSMISSION | OUT_OF_ORDER)) != 0
            e_retx[i] = is_retx
            if is_retx:  # Karn: the copies already in the list are ambiguous now too
                u = head[fwd]
                while u >= 0:
                    if _d(e_seq[u], nseq) < 0 and _d(e_next_seq[u], seq) > 0:
                        e_retx[u] = True
                    u = e_link[u]
            e_link[i] = head[fwd]
            head[fwd] = i
            count[fwd] += 1
        if _d(nseq, nextseq[fwd]) > 0 or not nextseq[fwd]:
            if not (ta & ZERO_WINDOW_PROBE):
                nextseq[fwd] = nseq
                nextseq_frame[fwd] = frame
                nextseq_time[fwd] = ts
        if seq == maxseqtobeacked[fwd] or not maxseqtobeacked[fwd]:
            if not (ta & ZERO_WINDOW_PROBE):
                maxseqtobeacked[fwd] = nextseq[fwd]

        window[fwd] = raw_window
        lastack[fwd] = ack
        lastack_time[fwd] = ts
        lastsegmentflags[fwd] = ta

        # remove the segments this ACKs from the reverse list; exact matches give the ACK RTT
        prev = np.int64(-1)
        u = head[rev]
        while u >= 0:
            if ack == e_next_seq[u]:
                _put(out.acks_frame, i, e_frame[u])
                _put(out.ack_rtt_ns, i, ts - e_ts[u])
                _put(out.rtt_ns, i, -1 if e_retx[u] else ts - e_ts[u])
            elif _d(ack, e_seq[u]) > 0 and _d(ack, e_next_seq[u]) <= 0:
                e_seq[u] = ack
                continue
            elif _d(e_next_seq[u], ack) > 0:
                prev = u
                u = e_link[u]
                continue
            nxt = e_link[u]
            if prev < 0:
                head[rev] = nxt
            else:
                e_link[prev] = nxt
            count[rev] -= 1
            u = nxt

        # bytes in flight after this segment (tcp.analysis.bytes_in_flight): the highest next sequence
        # number of the unacknowledged segments minus the lowest sequence number, minus the SACK blocks
        # of the receiver's latest segment, in guint32; then 1 less when this segment is a SYN or FIN
        # (a SYN or FIN still listed from before counts its sequence number, as in Wireshark).
        # pipe_bytes counts data bytes only, minus the scoreboard's SACKed bytes.
        u = head[fwd]
        if seglen != 0 and u >= 0 and valid_bif[fwd]:
            first = _u32(e_seq[u] - base_seq[fwd])
            last = _u32(e_next_seq[u] - base_seq[fwd])
            last_data = _u32(e_data_end[u] - base_seq[fwd])
            sacked = np.int64(0)
            while u >= 0:
                if _u32(e_next_seq[u] - base_seq[fwd]) > last:
                    last = _u32(e_next_seq[u] - base_seq[fwd])
                if _u32(e_data_end[u] - base_seq[fwd]) > last_data:
                    last_data = _u32(e_data_end[u] - base_seq[fwd])
                if _u32(e_seq[u] - base_seq[fwd]) < first:
                    first = _u32(e_seq[u] - base_seq[fwd])
                u = e_link[u]
            delivered = np.int64(0)
            r = last_row[rev]
            if r >= 0:
                for k in range(min(seg.sack_count[r], WS_BIF_SACK_BLOCKS)):
                    delivered += _u32(np.int64(sack_right[seg.sack_start[r] + k])
                                      - np.int64(sack_left[seg.sack_start[r] + k]))
            ws_in_flight = _u32(last - first - delivered)
            if 0 < ws_in_flight < BIF_LIMIT and ws_in_flight - (1 if flags & (TH_SYN | TH_FIN) else 0) > 0:
                _put(out.bytes_in_flight, i, ws_in_flight - (1 if flags & (TH_SYN | TH_FIN) else 0))
            in_flight = last_data - first
            if 0 < in_flight < BIF_LIMIT:
                for k in range(sk_n[fwd]):
                    lo = max(_u32(sk_lo[fwd, k] - base_seq[fwd]), first)
                    hi = min(_u32(sk_hi[fwd, k] - base_seq[fwd]), last_data)
                    if hi > lo:
                        sacked += hi - lo
                _put(out.pipe_bytes, i, in_flight - sacked)
        last_row[fwd] = i
        out.flags[i] = ta
