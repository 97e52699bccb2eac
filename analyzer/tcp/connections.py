"""TCP connections: which packets belong together, who is the client, and the ``connections`` frame.

A connection is the bidirectional 4-tuple plus a generation. Like Wireshark's ``tcp.stream`` (and its
``tcp.analysis.reused_ports``), a SYN whose sequence number differs from the initial sequence number
recorded for its direction starts a new connection on the same 4-tuple. A SYN with the same ISN stays in
its connection even after an RST or FIN (tshark 4.0.17 does the same).

The client is the sender of the first SYN; without one, the receiver of the first SYN/ACK; without
either, the endpoint on the higher port (Zeek's fallback: services listen on low ports), and
``client_by`` says which rule decided.

State names follow Zeek's ``conn_state`` (base/protocols/conn/main.zeek) and ``history`` letters
(uppercase: client, lowercase: server; each letter once, at its first occurrence): S SYN, H SYN/ACK,
A pure ACK, D data, F FIN, R RST, T retransmission, W zero window, ^ direction flipped (client chosen
by port).
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import polars as pl

from ..jit import njit
from .. import columns

SYN, FIN, RST, ACK = 0x02, 0x01, 0x04, 0x10

CONNECTION_DESCRIPTIONS = {
    "conn": "connection id (tcp_segments.conn); Wireshark's tcp.stream in capture order",
    "client": "client address (SYN sender; see client_by)",
    "client_port": "client port",
    "server": "server address",
    "server_port": "server port",
    "client_by": "how the client was chosen: syn, synack (the SYN was not captured) or port (no handshake seen)",
    "first_ts_ns": "time of the first packet",
    "last_ts_ns": "time of the last packet",
    "first_frame": "frame of the first packet",
    "last_frame": "frame of the last packet",
    "client_packets": "packets sent by the client",
    "server_packets": "packets sent by the server",
    "client_bytes": "TCP payload bytes sent by the client (retransmissions included)",
    "server_bytes": "TCP payload bytes sent by the server (retransmissions included)",
    "client_mss": "MSS option of the client's SYN",
    "server_mss": "MSS option of the server's SYN/ACK",
    "client_wscale": "window-scale shift of the client's SYN",
    "server_wscale": "window-scale shift of the server's SYN/ACK",
    "client_sack_perm": "SACK-permitted in the client's SYN",
    "server_sack_perm": "SACK-permitted in the server's SYN/ACK",
    "client_timestamps": "timestamps option in the client's SYN",
    "server_timestamps": "timestamps option in the server's SYN/ACK",
    "syn_ts_ns": "time of the client's first SYN",
    "synack_ts_ns": "time of the server's first SYN/ACK",
    "saw_syn": "the client's SYN was captured",
    "saw_synack": "the server's SYN/ACK was captured",
    "client_fin": "the client sent a FIN",
    "server_fin": "the server sent a FIN",
    "client_rst": "the client sent an RST",
    "server_rst": "the server sent an RST",
    "reused_ports": "this connection reused the 4-tuple of an earlier one (tcp.analysis.reused_ports)",
    "history": "Zeek history: S SYN, H SYN/ACK, A ACK, D data, F FIN, R RST, T retransmission, W zero window; "
               "upper case client, lower case server, in first-occurrence order",
    "conn_state": "Zeek conn_state: S0 S1 SF REJ S2 S3 RSTO RSTR RSTOS0 RSTRH SH SHR OTH",
    "rtt_client_server_ns": "SYN -> SYN/ACK: the server-side half of the handshake RTT (as seen at the capture point)",
    "rtt_server_client_ns": "SYN/ACK -> the ACK completing the handshake: the client-side half",
    "handshake_rtt_ns": "SYN -> completing ACK (Wireshark's tcp.analysis.initial_rtt)",
    "duration_ns": "last_ts_ns - first_ts_ns",
    "saw_start": "the handshake's SYN was captured",
    "saw_end": "both FINs or an RST were captured",
}

_EMPTY = np.int64(-1)


@njit(cache=True, inline="always")
def _hash(a_addr, a_port, b_addr, b_port, mask):
    h = np.uint64(a_addr) * np.uint64(0x9E3779B97F4A7C15)
    h ^= np.uint64(b_addr) * np.uint64(0xC2B2AE3D27D4EB4F)
    h ^= (np.uint64(a_port) << np.uint64(16)) | np.uint64(b_port)
    h ^= h >> np.uint64(31)
    return np.int64(h & np.uint64(mask))


@njit(cache=True)
def assign_connections(src, dst, sport, dport, flags, seq):
    """Connection id and side (0: the endpoint that sent the connection's first packet) per segment,
    in capture order. Returns (conn, side, reused, n_connections)."""
    n = src.shape[0]
    size = 1
    while size < 2 * n + 16:  # load <= 1/2 even if every segment started a connection
        size <<= 1
    mask = size - 1
    slot_conn = np.full(size, _EMPTY, np.int32)  # the only table touched in full: int32 ids (n < 2**31)
    # per-connection state (at most one connection per packet; only the rows used are touched)
    c_addr0 = np.empty(n, np.int64)
    c_port0 = np.empty(n, np.int64)
    c_addr1 = np.empty(n, np.int64)
    c_port1 = np.empty(n, np.int64)
    c_isn = np.zeros((n, 2), np.int64)
    c_isn_set = np.zeros((n, 2), np.bool_)
    conn = np.empty(n, np.uint32)
    side = np.empty(n, np.uint8)
    reused = np.zeros(n, np.bool_)
    n_conn = 0
    for i in range(n):
        s_a, s_p, d_a, d_p = np.int64(src[i]), np.int64(sport[i]), np.int64(dst[i]), np.int64(dport[i])
        if (s_a, s_p) <= (d_a, d_p):
            ka, kp, kb, kq = s_a, s_p, d_a, d_p
        else:
            ka, kp, kb, kq = d_a, d_p, s_a, s_p
        h = _hash(ka, kp, kb, kq, mask)
        c = _EMPTY
        while slot_conn[h] != _EMPTY:
            cand = np.int64(slot_conn[h])
            lo_a, lo_p = c_addr0[cand], c_port0[cand]
            hi_a, hi_p = c_addr1[cand], c_port1[cand]
            if (lo_a, lo_p) > (hi_a, hi_p):
                lo_a, lo_p, hi_a, hi_p = hi_a, hi_p, lo_a, lo_p
            if lo_a == ka and lo_p == kp and hi_a == kb and hi_p == kq:
                c = cand
                break
            h = (h + 1) & mask
        f = flags[i]
        is_syn = (f & (SYN | ACK)) == SYN
        if c != _EMPTY:
            sd = 0 if (c_addr0[c] == s_a and c_port0[c] == s_p) else 1
            if is_syn and c_isn_set[c, sd] and c_isn[c, sd] != np.int64(seq[i]):
                reused[i] = True
                c = _EMPTY  # a new generation takes over this slot below
        if c == _EMPTY:
            c = n_conn
            n_conn += 1
            c_addr0[c], c_port0[c], c_addr1[c], c_port1[c] = s_a, s_p, d_a, d_p
            slot_conn[h] = c
            sd = 0
        if not c_isn_set[c, sd]:
            c_isn[c, sd] = np.int64(seq[i]) if (f & SYN) else (np.int64(seq[i]) - 1) & 0xFFFFFFFF
            c_isn_set[c, sd] = True
        conn[i] = c
        side[i] = sd
    return conn, side, reused, n_conn


CLIENT_BY = ("syn", "synack", "port")  # connections.client_by, by client_sides' rule index
BY_SYN, BY_SYNACK, BY_PORT = 0, 1, 2

# Zeek history letters (the client's; the server's are their lower case), in EV_* bit order
HISTORY_LETTERS = "SHADFRTW"
N_EVENTS = len(HISTORY_LETTERS)
EV_S, EV_H, EV_A, EV_D, EV_F, EV_R, EV_T, EV_W = (1 << k for k in range(N_EVENTS))
# the letters as bytes: the client's, then the server's
_LETTER_CODES = np.frombuffer((HISTORY_LETTERS + HISTORY_LETTERS.lower()).encode(), np.uint8).copy()
MAX_HISTORY = 2 * N_EVENTS
# Zeek conn_state names, by the index _conn_state returns
CONN_STATES = ("OTH", "REJ", "RSTOS0", "SH", "S0", "RSTRH", "SHR", "RSTO", "RSTR", "SF", "S2", "S3", "S1")


@njit(cache=True)
def client_sides(conn, side, frame, flags, sport, dport, n_conn):
    """Per connection: the side (0/1) of the client and the rule that chose it (a ``CLIENT_BY`` index):
    the sender of the earliest SYN; else the receiver of the earliest SYN/ACK; else the endpoint on the
    higher port (side 0 when the ports are equal)."""
    syn_frame = np.full(n_conn, -1, np.int64)
    syn_side = np.zeros(n_conn, np.uint8)
    synack_frame = np.full(n_conn, -1, np.int64)
    synack_side = np.zeros(n_conn, np.uint8)
    port = np.full((n_conn, 2), -1, np.int64)  # first source port seen from each side
    peer = np.full((n_conn, 2), -1, np.int64)  # first destination port seen from each side
    for i in range(conn.shape[0]):
        c = np.int64(conn[i])
        sd = np.int64(side[i])
        f = np.int64(flags[i]) & (SYN | ACK)
        fr = np.int64(frame[i])
        if f == SYN and (syn_frame[c] < 0 or fr < syn_frame[c]):
            syn_frame[c] = fr
            syn_side[c] = sd
        if f == SYN | ACK and (synack_frame[c] < 0 or fr < synack_frame[c]):
            synack_frame[c] = fr
            synack_side[c] = 1 - sd
        if port[c, sd] < 0:
            port[c, sd] = sport[i]
            peer[c, sd] = dport[i]
    client = np.empty(n_conn, np.uint8)
    rule = np.empty(n_conn, np.uint8)
    for c in range(n_conn):
        if syn_frame[c] >= 0:
            client[c], rule[c] = syn_side[c], BY_SYN
        elif synack_frame[c] >= 0:
            client[c], rule[c] = synack_side[c], BY_SYNACK
        else:
            port0 = port[c, 0] if port[c, 0] >= 0 else peer[c, 1]
            port1 = port[c, 1] if port[c, 1] >= 0 else peer[c, 0]
            client[c] = 1 if port0 >= 0 and port1 > port0 else 0
            rule[c] = BY_PORT
    return client, rule




@njit(cache=True, inline="always")
def _segment_events(flags, seglen, window, is_retx):
    """The history events (EV_* bits) one segment shows."""
    ev = 0
    if flags & (SYN | ACK) == SYN:
        ev |= EV_S
    if flags & (SYN | ACK) == SYN | ACK:
        ev |= EV_H
    if flags & (SYN | FIN | RST | ACK) == ACK and seglen == 0:
        ev |= EV_A
    if seglen > 0:
        ev |= EV_D
    if flags & FIN:
        ev |= EV_F
    if flags & RST:
        ev |= EV_R
    if is_retx:
        ev |= EV_T
    if window == 0 and flags & (SYN | FIN | RST) == 0:
        ev |= EV_W
    return ev


@njit(cache=True, inline="always")
def _conn_state(saw_syn, saw_synack, c_fin, s_fin, c_rst, s_rst):
    """Zeek's conn_state as an index into CONN_STATES."""
    if not saw_syn and not saw_synack:
        return 0  # OTH
    if saw_syn and not saw_synack:
        if s_rst:
            return 1  # REJ
        if c_rst:
            return 2  # RSTOS0
        if c_fin:
            return 3  # SH
        return 4  # S0
    if not saw_syn:
        if s_rst:
            return 5  # RSTRH
        if s_fin:
            return 6  # SHR
        return 0  # OTH
    if c_rst:
        return 7  # RSTO
    if s_rst:
        return 8  # RSTR
    if c_fin and s_fin:
        return 9  # SF
    if c_fin:
        return 10  # S2
    if s_fin:
        return 11  # S3
    return 12  # S1


ConnectionStats = namedtuple("ConnectionStats", [
    "first_row", "first_ts", "last_ts", "first_frame", "last_frame", "packets", "bytes", "syn_row",
    "syn_ts", "synack_ts", "hs_ack_ts", "saw_syn", "saw_synack", "fin", "rst", "reused", "history",
    "history_len", "state"])


@njit(cache=True)
def connection_stats(conn, from_client, frame, ts, flags, seglen, window, seq, ack, reused, is_retx, n_conn):
    """Per connection, in one pass over its segments (capture order): first row, time and frame span,
    packets and bytes per direction ([:, 0] client, [:, 1] server), each direction's first segment with
    SYN (its options are the connection's), the handshake's times, FIN/RST seen, the Zeek history and
    conn_state. A time is -1 where the event was not seen."""
    first_row = np.full(n_conn, -1, np.int64)
    first_ts = np.zeros(n_conn, np.int64)
    last_ts = np.zeros(n_conn, np.int64)
    first_frame = np.zeros(n_conn, np.uint32)
    last_frame = np.zeros(n_conn, np.uint32)
    packets = np.zeros((n_conn, 2), np.uint32)
    nbytes = np.zeros((n_conn, 2), np.uint64)
    syn_row = np.full((n_conn, 2), -1, np.int64)
    syn_ts = np.full(n_conn, -1, np.int64)
    synack_ts = np.full(n_conn, -1, np.int64)
    synack_seq = np.zeros(n_conn, np.int64)
    saw_syn = np.zeros(n_conn, np.bool_)
    saw_synack = np.zeros(n_conn, np.bool_)
    fin = np.zeros((n_conn, 2), np.bool_)
    rst = np.zeros((n_conn, 2), np.bool_)
    any_reused = np.zeros(n_conn, np.bool_)
    n_letters = N_EVENTS
    event_frame = np.full((n_conn, 2, n_letters), -1, np.int64)  # first frame of each event, per direction
    n = conn.shape[0]
    for i in range(n):
        c = np.int64(conn[i])
        d = 0 if from_client[i] else 1
        f = np.int64(flags[i])
        fr = np.int64(frame[i])
        t = np.int64(ts[i])
        length = np.int64(seglen[i])
        if first_row[c] < 0:
            first_row[c] = i
            first_ts[c], last_ts[c], first_frame[c], last_frame[c] = t, t, fr, fr
        else:
            first_ts[c] = min(first_ts[c], t)
            last_ts[c] = max(last_ts[c], t)
            first_frame[c] = min(np.int64(first_frame[c]), fr)
            last_frame[c] = max(np.int64(last_frame[c]), fr)
        packets[c, d] += 1
        nbytes[c, d] += np.uint64(length)
        if f & SYN and syn_row[c, d] < 0:
            syn_row[c, d] = i
        if d == 0 and f & (SYN | ACK) == SYN and not saw_syn[c]:
            saw_syn[c] = True
            syn_ts[c] = t
        if d == 1 and f & (SYN | ACK) == SYN | ACK and not saw_synack[c]:
            saw_synack[c] = True
            synack_ts[c] = t
            synack_seq[c] = np.int64(seq[i])
        if f & FIN:
            fin[c, d] = True
        if f & RST:
            rst[c, d] = True
        if reused[i]:
            any_reused[c] = True
        ev = _segment_events(f, length, np.int64(window[i]), is_retx[i])
        for k in range(n_letters):
            if ev & (1 << k) and (event_frame[c, d, k] < 0 or fr < event_frame[c, d, k]):
                event_frame[c, d, k] = fr
    # The ACK that completes the handshake: the client's earliest ACK (no SYN) at or after the SYN/ACK
    # acknowledging the server's ISN.
    hs_ack_ts = np.full(n_conn, -1, np.int64)
    for i in range(n):
        c = np.int64(conn[i])
        if from_client[i] and saw_synack[c] and np.int64(flags[i]) & (SYN | ACK) == ACK \
                and np.int64(ts[i]) >= synack_ts[c] and np.int64(ack[i]) == (synack_seq[c] + 1) & 0xFFFFFFFF:
            if hs_ack_ts[c] < 0 or np.int64(ts[i]) < hs_ack_ts[c]:
                hs_ack_ts[c] = np.int64(ts[i])
    # history: each direction's events by first frame (a tie, within one frame, in letter order)
    history = np.zeros((n_conn, MAX_HISTORY), np.uint8)
    history_len = np.zeros(n_conn, np.int64)
    key_frame = np.empty(MAX_HISTORY, np.int64)
    key_letter = np.empty(MAX_HISTORY, np.uint8)
    state = np.empty(n_conn, np.uint8)
    for c in range(n_conn):
        m = 0
        for d in range(2):
            for k in range(n_letters):
                fr = event_frame[c, d, k]
                if fr < 0:
                    continue
                letter = _LETTER_CODES[d * n_letters + k]
                j = m  # insertion sort by (frame, letter)
                while j > 0 and (key_frame[j - 1] > fr or (key_frame[j - 1] == fr and key_letter[j - 1] > letter)):
                    key_frame[j] = key_frame[j - 1]
                    key_letter[j] = key_letter[j - 1]
                    j -= 1
                key_frame[j] = fr
                key_letter[j] = letter
                m += 1
        for j in range(m):
            history[c, j] = key_letter[j]
        history_len[c] = m
        state[c] = _conn_state(saw_syn[c], saw_synack[c], fin[c, 0], fin[c, 1], rst[c, 0], rst[c, 1])
    return ConnectionStats(first_row, first_ts, last_ts, first_frame, last_frame, packets, nbytes, syn_row,
                           syn_ts, synack_ts, hs_ack_ts, saw_syn, saw_synack, fin, rst, any_reused, history,
                           history_len, state)


def _texts(name: str, codes: np.ndarray, texts) -> pl.Series:
    """A String column of ``texts[code]`` per row (a gather: no Python string per row)."""
    return pl.Series(name, list(texts), dtype=pl.String).gather(codes.astype(np.int64))


def _history_texts(history: np.ndarray) -> pl.Series:
    """The history column from the kernel's (connections x MAX_HISTORY) letters, NUL padded: each
    distinct history is decoded once (a capture has few)."""
    distinct, codes = np.unique(history.view(f"S{MAX_HISTORY}").ravel(), return_inverse=True)
    return _texts("history", codes, (h.decode("ascii") for h in distinct))


def _option(name, values, valid_values, rows, dtype):
    """A per-connection column of a segment option from the rows ``rows`` (-1: no such segment: null)."""
    have = rows >= 0
    at = np.where(have, rows, 0)
    return columns.series(name, values[at].astype(dtype), have & valid_values[at])


def connections_frame(seg: dict, n_conn: int, address_dtype: pl.DataType) -> pl.DataFrame:
    """One row per connection from per-segment NumPy arrays (capture order): conn, from_client, frame,
    ts_ns, src, dst (address codes of ``address_dtype``), sport, dport, tcp_flags, seq, ack, window,
    payload_len, reused, is_retransmission, client_by (per connection: CLIENT_BY index) and the SYN
    options: mss, wscale, sack_perm (values, and ``*_valid``), has_ts_val."""
    st = connection_stats(seg["conn"], seg["from_client"], seg["frame"], seg["ts_ns"], seg["tcp_flags"],
                          seg["payload_len"], seg["window"], seg["seq"], seg["ack"], seg["reused"],
                          seg["is_retransmission"], n_conn)
    first = st.first_row
    client_first = seg["from_client"][first]
    src, dst = seg["src"][first], seg["dst"][first]
    sport, dport = seg["sport"][first], seg["dport"][first]
    addresses = {"client": np.where(client_first, src, dst), "server": np.where(client_first, dst, src)}
    cols = [pl.Series("conn", np.arange(n_conn, dtype=np.uint32)),
            columns.enum_from_codes(pl.Series("client", addresses["client"]), address_dtype),
            pl.Series("client_port", np.where(client_first, sport, dport)),
            columns.enum_from_codes(pl.Series("server", addresses["server"]), address_dtype),
            pl.Series("server_port", np.where(client_first, dport, sport)),
            _texts("client_by", seg["client_by"], CLIENT_BY),
            pl.Series("first_ts_ns", st.first_ts), pl.Series("last_ts_ns", st.last_ts),
            pl.Series("first_frame", st.first_frame), pl.Series("last_frame", st.last_frame),
            pl.Series("client_packets", st.packets[:, 0].copy()), pl.Series("server_packets", st.packets[:, 1].copy()),
            pl.Series("client_bytes", st.bytes[:, 0].copy()), pl.Series("server_bytes", st.bytes[:, 1].copy())]
    syn_rows = {"client": st.syn_row[:, 0].copy(), "server": st.syn_row[:, 1].copy()}
    for option, dtype in (("mss", np.uint16), ("wscale", np.uint8), ("sack_perm", np.bool_)):
        for who in ("client", "server"):
            cols.append(_option(f"{who}_{option}", seg[option], seg[f"{option}_valid"], syn_rows[who], dtype))
    for who in ("client", "server"):
        rows = syn_rows[who]
        cols.append(pl.Series(f"{who}_timestamps", (rows >= 0) & seg["has_ts_val"][np.where(rows >= 0, rows, 0)]))
    syn_ts, synack_ts, hs_ack_ts = st.syn_ts, st.synack_ts, st.hs_ack_ts
    saw_syn, saw_synack, have_ack = st.saw_syn, st.saw_synack, hs_ack_ts >= 0
    fin, rst = st.fin, st.rst
    cols += [columns.series("syn_ts_ns", syn_ts, saw_syn), columns.series("synack_ts_ns", synack_ts, saw_synack),
             pl.Series("saw_syn", saw_syn), pl.Series("saw_synack", saw_synack),
             pl.Series("client_fin", fin[:, 0].copy()), pl.Series("server_fin", fin[:, 1].copy()),
             pl.Series("client_rst", rst[:, 0].copy()), pl.Series("server_rst", rst[:, 1].copy()),
             pl.Series("reused_ports", st.reused),
             _history_texts(st.history), _texts("conn_state", st.state, CONN_STATES),
             columns.series("rtt_client_server_ns", synack_ts - syn_ts, saw_syn & saw_synack),
             columns.series("rtt_server_client_ns", hs_ack_ts - synack_ts, have_ack),
             columns.series("handshake_rtt_ns", hs_ack_ts - syn_ts, have_ack & saw_syn),
             pl.Series("duration_ns", st.last_ts - st.first_ts),
             pl.Series("saw_start", saw_syn),
             pl.Series("saw_end", (fin[:, 0] & fin[:, 1]) | rst[:, 0] | rst[:, 1])]
    return pl.DataFrame(cols)
