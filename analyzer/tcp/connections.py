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

import numpy as np
import polars as pl
from numba import njit

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
    while size < 4 * n + 16:
        size <<= 1
    mask = size - 1
    slot_conn = np.full(size, _EMPTY, np.int64)
    # per-connection state (at most one connection per packet)
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
            cand = slot_conn[h]
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
            if is_syn and c_isn_set[c, sd] and c_isn[c, sd] != seq[i]:
                reused[i] = True
                c = _EMPTY  # a new generation takes over this slot below
        if c == _EMPTY:
            c = n_conn
            n_conn += 1
            c_addr0[c], c_port0[c], c_addr1[c], c_port1[c] = s_a, s_p, d_a, d_p
            slot_conn[h] = c
            sd = 0
        if not c_isn_set[c, sd]:
            c_isn[c, sd] = seq[i] if (f & SYN) else (seq[i] - 1) & 0xFFFFFFFF
            c_isn_set[c, sd] = True
        conn[i] = c
        side[i] = sd
    return conn, side, reused, n_conn


def _history(seg: pl.DataFrame) -> pl.DataFrame:
    """Zeek-style history per connection from per-segment event flags (first occurrence order)."""
    events = [
        ("S", (pl.col("flags") & (SYN | ACK)) == SYN),
        ("H", (pl.col("flags") & (SYN | ACK)) == (SYN | ACK)),
        ("A", ((pl.col("flags") & (SYN | FIN | RST | ACK)) == ACK) & (pl.col("payload_len") == 0)),
        ("D", pl.col("payload_len") > 0),
        ("F", (pl.col("flags") & FIN) != 0),
        ("R", (pl.col("flags") & RST) != 0),
        ("T", pl.col("is_retransmission")),
        ("W", (pl.col("window") == 0) & ((pl.col("flags") & (SYN | FIN | RST)) == 0)),
    ]
    parts = []
    for letter, cond in events:
        parts.append(
            seg.filter(cond).group_by("conn", "from_client").agg(pl.col("frame").min().alias("first_frame"))
            .with_columns(pl.when(pl.col("from_client")).then(pl.lit(letter)).otherwise(pl.lit(letter.lower()))
                          .alias("letter"))
        )
    hist = pl.concat(parts).sort("conn", "first_frame", "letter")
    return hist.group_by("conn", maintain_order=True).agg(pl.col("letter").str.join("").alias("history"))


def connections_frame(seg: pl.DataFrame) -> pl.DataFrame:
    """One row per connection from the per-segment frame ``seg`` (columns: conn, side, from_client,
    frame, ts_ns, src, dst, sport, dport, flags, seq, ack, window, payload_len, mss, wscale, sack_perm,
    ts_val, is_retransmission)."""
    syn = (pl.col("flags") & (SYN | ACK)) == SYN
    synack = (pl.col("flags") & (SYN | ACK)) == (SYN | ACK)
    c = pl.col("from_client")
    agg = seg.group_by("conn").agg(
        pl.col("client").first(), pl.col("client_port").first(), pl.col("server").first(),
        pl.col("server_port").first(), pl.col("client_by").first(),
        pl.col("ts_ns").min().alias("first_ts_ns"), pl.col("ts_ns").max().alias("last_ts_ns"),
        pl.col("frame").min().alias("first_frame"), pl.col("frame").max().alias("last_frame"),
        c.sum().cast(pl.UInt32).alias("client_packets"), (~c).sum().cast(pl.UInt32).alias("server_packets"),
        pl.col("payload_len").filter(c).sum().cast(pl.UInt64).alias("client_bytes"),
        pl.col("payload_len").filter(~c).sum().cast(pl.UInt64).alias("server_bytes"),
        pl.col("mss").filter(c & (pl.col("flags") & SYN != 0)).first().alias("client_mss"),
        pl.col("mss").filter(~c & (pl.col("flags") & SYN != 0)).first().alias("server_mss"),
        pl.col("wscale").filter(c & (pl.col("flags") & SYN != 0)).first().alias("client_wscale"),
        pl.col("wscale").filter(~c & (pl.col("flags") & SYN != 0)).first().alias("server_wscale"),
        pl.col("sack_perm").filter(c & (pl.col("flags") & SYN != 0)).first().alias("client_sack_perm"),
        pl.col("sack_perm").filter(~c & (pl.col("flags") & SYN != 0)).first().alias("server_sack_perm"),
        pl.col("ts_val").filter(c & (pl.col("flags") & SYN != 0)).first().is_not_null().alias("client_timestamps"),
        pl.col("ts_val").filter(~c & (pl.col("flags") & SYN != 0)).first().is_not_null().alias("server_timestamps"),
        pl.col("ts_ns").filter(c & syn).first().alias("syn_ts_ns"),
        pl.col("ts_ns").filter(~c & synack).first().alias("synack_ts_ns"),
        pl.col("seq").filter(~c & synack).first().alias("_server_isn"),
        (c & syn).any().alias("saw_syn"), (~c & synack).any().alias("saw_synack"),
        (c & (pl.col("flags") & FIN != 0)).any().alias("client_fin"),
        (~c & (pl.col("flags") & FIN != 0)).any().alias("server_fin"),
        (c & (pl.col("flags") & RST != 0)).any().alias("client_rst"),
        (~c & (pl.col("flags") & RST != 0)).any().alias("server_rst"),
        pl.col("reused").any().alias("reused_ports"),
    )
    # The ACK that completes the handshake: first client ACK after the SYN/ACK acknowledging its ISN.
    hs_ack = (
        seg.join(agg.select("conn", "synack_ts_ns", "_server_isn"), on="conn")
        .filter(pl.col("from_client") & ((pl.col("flags") & (SYN | ACK)) == ACK)
                & (pl.col("ts_ns") >= pl.col("synack_ts_ns"))
                & (pl.col("ack") == ((pl.col("_server_isn").cast(pl.Int64) + 1) % (1 << 32)).cast(pl.UInt32)))
        .group_by("conn").agg(pl.col("ts_ns").min().alias("hs_ack_ts_ns"))
    )
    out = agg.join(hs_ack, on="conn", how="left").join(_history(seg), on="conn", how="left")
    established = pl.col("saw_syn") & pl.col("saw_synack")
    state = (
        pl.when(~pl.col("saw_syn") & ~pl.col("saw_synack")).then(pl.lit("OTH"))
        .when(pl.col("saw_syn") & ~pl.col("saw_synack") & pl.col("server_rst")).then(pl.lit("REJ"))
        .when(pl.col("saw_syn") & ~pl.col("saw_synack") & pl.col("client_rst")).then(pl.lit("RSTOS0"))
        .when(pl.col("saw_syn") & ~pl.col("saw_synack") & pl.col("client_fin")).then(pl.lit("SH"))
        .when(pl.col("saw_syn") & ~pl.col("saw_synack")).then(pl.lit("S0"))
        .when(~pl.col("saw_syn") & pl.col("saw_synack") & pl.col("server_rst")).then(pl.lit("RSTRH"))
        .when(~pl.col("saw_syn") & pl.col("saw_synack") & pl.col("server_fin")).then(pl.lit("SHR"))
        .when(~pl.col("saw_syn") & pl.col("saw_synack")).then(pl.lit("OTH"))
        .when(established & pl.col("client_rst")).then(pl.lit("RSTO"))
        .when(established & pl.col("server_rst")).then(pl.lit("RSTR"))
        .when(established & pl.col("client_fin") & pl.col("server_fin")).then(pl.lit("SF"))
        .when(established & pl.col("client_fin")).then(pl.lit("S2"))
        .when(established & pl.col("server_fin")).then(pl.lit("S3"))
        .otherwise(pl.lit("S1"))
    )
    return out.with_columns(
        state.alias("conn_state"),
        pl.col("history").fill_null(""),
        (pl.col("synack_ts_ns") - pl.col("syn_ts_ns")).alias("rtt_client_server_ns"),
        (pl.col("hs_ack_ts_ns") - pl.col("synack_ts_ns")).alias("rtt_server_client_ns"),
        (pl.col("hs_ack_ts_ns") - pl.col("syn_ts_ns")).alias("handshake_rtt_ns"),
        (pl.col("last_ts_ns") - pl.col("first_ts_ns")).alias("duration_ns"),
        pl.col("saw_syn").alias("saw_start"),
        ((pl.col("client_fin") & pl.col("server_fin")) | pl.col("client_rst") | pl.col("server_rst"))
        .alias("saw_end"),
    ).drop("_server_isn", "hs_ack_ts_ns").sort("conn")
