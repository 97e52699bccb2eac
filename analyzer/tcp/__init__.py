"""TCP: connections, Wireshark-grade segment analysis, reassembly and message framing.

Frames (``cap.frame(name)``):
- ``tcp_segments``: one row per TCP segment (frame number, connection id, direction, relative sequence
  numbers, the ``tcp.analysis.*`` flags and measures). Join to ``packets`` on ``frame``.
- ``connections``: one row per connection (Zeek's conn_state and history, handshake RTT split into its
  two halves, options per side, packets and bytes per direction).

Messages for the decoders: :func:`tcp_messages` (see ``analyzer.tcp.framing``).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from .. import schema
from ..capture import frame_builder
from . import analysis as an
from .connections import ACK, CONNECTION_DESCRIPTIONS, SYN, assign_connections, connections_frame
from .framing import tcp_messages

SEGMENT_DESCRIPTIONS = {
    "frame": "frame number of the segment (join key to packets)",
    "ts_ns": "capture time of the segment (as packets.ts_ns)",
    "tcp_flags": "TCP flags (as packets.tcp_flags)",
    "window": "raw window field (as packets.window); window_size has the scale applied",
    "conn": "connection id (connections.conn); a reused 4-tuple gets a new id",
    "from_client": "sent by the connection's client",
    "seq_rel": "sequence number relative to the sender's ISN (Wireshark's tcp.seq)",
    "ack_rel": "acknowledgment number relative to the other side's ISN (tcp.ack); null without ACK",
    "seglen": "TCP payload length (tcp.len)",
    "analysis": "tcp.analysis flag bits (analyzer.tcp.analysis.FLAG_NAMES)",
    "dupack_num": "duplicate ACK number (tcp.analysis.duplicate_ack_num); null unless a duplicate ACK",
    "dupack_frame": "frame of the original ACK (tcp.analysis.duplicate_ack_frame)",
    "acks_frame": "frame of the segment this ACK acknowledges exactly (tcp.analysis.acks_frame)",
    "ack_rtt_ns": "time from that segment to this ACK (tcp.analysis.ack_rtt)",
    "rtt_ns": "ack_rtt_ns with Karn's rule: null when the acknowledged data was sent more than once",
    "bytes_in_flight": "unacknowledged bytes after this segment minus the SACK blocks of the receiver's "
                       "latest segment (tcp.analysis.bytes_in_flight)",
    "pipe_bytes": "unacknowledged data bytes minus every byte the receiver has SACKed above the "
                  "cumulative ACK (RFC 6675 pipe)",
    "window_size": "receive window in bytes, scale applied (tcp.window_size); null when the scale is unknown",
    "rto_ns": "for retransmissions: time since the highest segment before it (tcp.analysis.rto)",
    "rto_frame": "frame of that highest segment (tcp.analysis.rto_frame)",
    "since_prev_same_dir_ns": "time since the previous segment in the same direction",
    "initial_rtt_ns": "handshake RTT, SYN to the first ACK after it (tcp.analysis.initial_rtt)",
}

# descriptions for export's schema.json (types come from the frames themselves)
schema.FRAMES.setdefault("tcp_segments", tuple(schema.column(k, object, v) for k, v in SEGMENT_DESCRIPTIONS.items()))
schema.FRAMES.setdefault("connections", tuple(schema.column(k, object, v) for k, v in CONNECTION_DESCRIPTIONS.items()))

_TCP_COLUMNS = ("frame", "ts_ns", "src", "dst", "sport", "dport", "tcp_flags", "seq", "ack", "window",
                "wscale", "mss", "sack_perm", "ts_val", "payload_len", "payload_caplen", "payload_offset",
                "sack_blocks")


def tcp_packets(cap) -> pl.DataFrame:
    """The TCP segments of the capture (header decoded), capture order."""
    return (
        cap.packets.filter(pl.col("tcp_flags").is_not_null() & (pl.col("parse_status") != "fragment"))
        .select(_TCP_COLUMNS)
        .with_columns(pl.col("payload_len").fill_null(0), pl.col("payload_caplen").fill_null(0))
    )


def _client_side(seg: pl.DataFrame) -> pl.DataFrame:
    """Per connection: the side (0/1) of the client and the rule that chose it."""
    syn = seg.filter((pl.col("tcp_flags") & (SYN | ACK)) == SYN).group_by("conn").agg(
        pl.col("side").sort_by("frame").first().alias("syn_side"))
    synack = seg.filter((pl.col("tcp_flags") & (SYN | ACK)) == (SYN | ACK)).group_by("conn").agg(
        (1 - pl.col("side").sort_by("frame").first()).alias("synack_side"))
    ports = seg.group_by("conn").agg(
        pl.col("sport").filter(pl.col("side") == 0).first().alias("p0"),
        pl.col("dport").filter(pl.col("side") == 0).first().alias("p0_peer"),
        pl.col("dport").filter(pl.col("side") == 1).first().alias("p1_peer"),
        pl.col("sport").filter(pl.col("side") == 1).first().alias("p1"),
    ).with_columns(
        pl.coalesce("p0", "p1_peer").alias("port0"), pl.coalesce("p1", "p0_peer").alias("port1"),
    )
    out = ports.join(syn, on="conn", how="left").join(synack, on="conn", how="left")
    return out.select(
        "conn",
        pl.coalesce("syn_side", "synack_side", pl.when(pl.col("port1") > pl.col("port0")).then(1).otherwise(0))
        .cast(pl.UInt8).alias("client_side"),
        pl.when(pl.col("syn_side").is_not_null()).then(pl.lit("syn"))
        .when(pl.col("synack_side").is_not_null()).then(pl.lit("synack"))
        .otherwise(pl.lit("port")).alias("client_by"),
    )


def _sack_index(frames: np.ndarray, sack: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    sack = sack.sort("frame", "block")
    sf = sack["frame"].to_numpy()
    start = np.searchsorted(sf, frames, side="left").astype(np.int64)
    stop = np.searchsorted(sf, frames, side="right").astype(np.int64)
    return start, (stop - start).astype(np.int64), sack["left"].to_numpy(), sack["right"].to_numpy()


def analyze_segments(cap, params: an.Params = an.Params()) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(tcp_segments, connections)."""
    tcp = tcp_packets(cap)
    src = tcp["src"].to_physical().to_numpy().astype(np.int64)
    dst = tcp["dst"].to_physical().to_numpy().astype(np.int64)
    flags = tcp["tcp_flags"].to_numpy()
    seq = tcp["seq"].to_numpy().astype(np.int64)
    conn, side, reused, n_conn = assign_connections(src, dst, tcp["sport"].to_numpy(), tcp["dport"].to_numpy(),
                                                    flags, seq)
    tcp = tcp.with_columns(pl.Series("conn", conn), pl.Series("side", side), pl.Series("reused", reused))
    sides = _client_side(tcp)
    tcp = tcp.join(sides, on="conn", how="left").with_columns(
        (pl.col("side") == pl.col("client_side")).alias("from_client"))

    frames = tcp["frame"].to_numpy()
    sack_start, sack_count, sack_left, sack_right = _sack_index(frames, cap.frame("tcp_sack"))
    segs = an.Segments(
        conn, side, tcp["ts_ns"].to_numpy(), frames, seq, tcp["ack"].to_numpy().astype(np.int64),
        flags.astype(np.int64), tcp["window"].to_numpy().astype(np.int64),
        tcp["wscale"].fill_null(-1).cast(pl.Int64).to_numpy(), tcp["payload_len"].to_numpy().astype(np.int64),
        sack_start, sack_count)
    out = an.allocate_analysis(tcp.height)
    an.analyze(segs, n_conn, sack_left.astype(np.int64), sack_right.astype(np.int64),
               params.ooo_threshold_ns, params.use_handshake_rtt_for_ooo, out)
    analysis = out.flags | np.where(reused, an.REUSED_PORTS, 0).astype(np.uint32)

    def nullable(name, values, null_value):
        return pl.Series(name, values).replace(null_value, None) if (values == null_value).any() \
            else pl.Series(name, values)

    tcp = tcp.with_columns(
        pl.Series("analysis", analysis),
        nullable("dupack_num", out.dupack_num, 0), nullable("dupack_frame", out.dupack_frame, 0),
        nullable("acks_frame", out.acks_frame, 0), nullable("ack_rtt_ns", out.ack_rtt_ns, -1),
        nullable("rtt_ns", out.rtt_ns, -1), nullable("bytes_in_flight", out.bytes_in_flight, -1),
        nullable("pipe_bytes", out.pipe_bytes, -1), nullable("window_size", out.window_size, -1),
        nullable("rto_ns", out.rto_ns, -1), nullable("rto_frame", out.rto_frame, 0),
        nullable("since_prev_same_dir_ns", out.since_prev_same_dir_ns, -1),
        nullable("initial_rtt_ns", out.initial_rtt_ns, -1),
        pl.Series("seq_rel", out.seq_rel), nullable("ack_rel", out.ack_rel, -1).cast(pl.UInt32),
    )
    leading = ("frame", "ts_ns", "tcp_flags", "window", "conn", "from_client", "seq_rel", "ack_rel", "seglen")
    seg_frame = tcp.select(
        "frame", "ts_ns", "tcp_flags", "window", "conn", "from_client", "seq_rel", "ack_rel",
        pl.col("payload_len").alias("seglen"), *[c for c in SEGMENT_DESCRIPTIONS if c not in leading],
    )
    conn_input = tcp.with_columns(
        pl.when(pl.col("from_client")).then(pl.col("src")).otherwise(pl.col("dst")).alias("client"),
        pl.when(pl.col("from_client")).then(pl.col("sport")).otherwise(pl.col("dport")).alias("client_port"),
        pl.when(pl.col("from_client")).then(pl.col("dst")).otherwise(pl.col("src")).alias("server"),
        pl.when(pl.col("from_client")).then(pl.col("dport")).otherwise(pl.col("sport")).alias("server_port"),
        pl.col("tcp_flags").alias("flags"),
        ((pl.col("analysis") & an.ANY_RETRANSMISSION) != 0).alias("is_retransmission"),
    )
    return seg_frame, connections_frame(conn_input)


@frame_builder("tcp_segments")
def _build_segments(cap) -> pl.DataFrame:
    segments, connections = analyze_segments(cap)
    cap.set_frame("connections", connections)
    return segments


@frame_builder("connections")
def _build_connections(cap) -> pl.DataFrame:
    segments, connections = analyze_segments(cap)
    cap.set_frame("tcp_segments", segments)
    return connections


__all__ = ["analyze_segments", "tcp_messages", "tcp_packets"]
