"""TCP: connections, Wireshark-grade segment analysis, reassembly and message framing.

Frames (``cap.frame(name)``):
- ``tcp_segments``: one row per TCP segment (frame number, connection id, direction, relative sequence
  numbers, the ``tcp.analysis.*`` flags and measures). Join to ``packets`` on ``frame``.
- ``connections``: one row per connection (Zeek's conn_state and history, handshake RTT split into its
  two halves, options per side, packets and bytes per direction).
- ``tcp_client_syns``: the rows of ``tcp_segments`` that are a SYN without ACK from the connection's
  client (resent SYNs included): ``frame``, ``ts_ns``, ``conn``. What counts connection attempts
  without the whole segment table (on a cluster, what crosses from the workers instead of it).

Messages for the decoders: :func:`tcp_messages` (see ``analyzer.tcp.framing``).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from .. import columns, schema
from ..capture import frame_builder
from . import analysis as an
from .connections import ACK, CONNECTION_DESCRIPTIONS, SYN, assign_connections, client_sides, connections_frame
from .framing import connection_batches, tcp_messages

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
# tcp_client_syns: its columns are tcp_segments' (the rows are a client's SYNs)
schema.FRAMES.setdefault("tcp_client_syns", tuple(c for c in schema.FRAMES["tcp_segments"] if c.name in ("frame", "ts_ns", "conn")))

_TCP_COLUMNS = ("frame", "ts_ns", "src", "dst", "sport", "dport", "tcp_flags", "seq", "ack", "window",
                "wscale", "mss", "sack_perm", "ts_val", "payload_len", "payload_caplen", "payload_offset",
                "sack_blocks")


_IS_SEGMENT = pl.col("tcp_flags").is_not_null() & (pl.col("parse_status") != "fragment")


def tcp_packets(cap) -> pl.DataFrame:
    """The TCP segments of the capture (header decoded), capture order."""
    return (
        cap.packets.filter(_IS_SEGMENT).select(_TCP_COLUMNS)
        .with_columns(pl.col("payload_len").fill_null(0), pl.col("payload_caplen").fill_null(0))
    )


# what the analysis reads of each segment; the SYN options are nullable
_ANALYSIS_COLUMNS = ("frame", "ts_ns", "src", "dst", "sport", "dport", "tcp_flags", "seq", "ack", "window",
                     "payload_len")
_OPTION_COLUMNS = ("mss", "wscale", "sack_perm")


def _sack_blocks(sack: pl.DataFrame) -> pl.DataFrame:
    """The tcp_sack frame in (frame, block) order (the reader writes it so: then it is not sorted again)."""
    frames, blocks = sack["frame"].to_numpy(), sack["block"].to_numpy()
    ordered = (frames[1:] > frames[:-1]) | ((frames[1:] == frames[:-1]) & (blocks[1:] > blocks[:-1]))
    return sack if ordered.all() else sack.sort("frame", "block")


def _nullable(name: str, values: np.ndarray, null_value: int) -> pl.Series:
    """``values`` as a column, null where the kernel left ``null_value`` (its "not measured")."""
    return columns.series(name, values, values != null_value)


# what is built from tcp_segments besides the detectors' reads: the payload segments every framing
# starts from (framing.payload_segments) and tcp_client_syns (client_syns)
_READ_BY_BUILDERS = ("frame", "ts_ns", "conn", "from_client", "tcp_flags", "seglen")
# tcp_segments column -> the analysis output it is made of (analysis.ANALYSIS_OUTPUTS), where it is one
_OUTPUT_OF = {"analysis": "flags", **{c: c for c in an.ANALYSIS_OUTPUTS if c in SEGMENT_DESCRIPTIONS}}


def segment_columns(cap) -> tuple[str, ...]:
    """The columns of ``tcp_segments`` to build: those ``cap.plan_columns`` said will be read and what is
    built from it (all of them when nothing was said), in SEGMENT_DESCRIPTIONS' order."""
    planned = cap.planned_columns("tcp_segments") if hasattr(cap, "planned_columns") else None
    if planned is None:
        return tuple(SEGMENT_DESCRIPTIONS)
    wanted = set(planned) | set(_READ_BY_BUILDERS)
    return tuple(c for c in SEGMENT_DESCRIPTIONS if c in wanted)


def analyze_segments(cap, params: an.Params = an.Params()) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(tcp_segments, connections). The columns go to the kernels as NumPy views, in their own dtypes.
    Of ``tcp_segments``, the columns :func:`segment_columns` says (the kernel's other outputs are not
    kept: ``analysis.allocate_analysis``); ``connections`` whole."""
    tcp = cap.packets.filter(_IS_SEGMENT).select(*_ANALYSIS_COLUMNS, *_OPTION_COLUMNS, "ts_val")
    seg = {name: tcp[name].to_numpy() for name in _ANALYSIS_COLUMNS if name not in ("src", "dst", "payload_len")}
    seg["src"], seg["dst"] = (tcp[c].to_physical().to_numpy() for c in ("src", "dst"))
    seg["payload_len"] = tcp["payload_len"].fill_null(0).to_numpy()
    for name in _OPTION_COLUMNS:
        seg[name], seg[f"{name}_valid"] = tcp[name].fill_null(0).to_numpy(), tcp[name].is_not_null().to_numpy()
    seg["has_ts_val"] = tcp["ts_val"].is_not_null().to_numpy()
    flags, frames = seg["tcp_flags"], seg["frame"]
    conn, side, reused, n_conn = assign_connections(seg["src"], seg["dst"], seg["sport"], seg["dport"], flags,
                                                    seg["seq"])
    client_side, client_by = client_sides(conn, side, frames, flags, seg["sport"], seg["dport"], n_conn)
    from_client = side == client_side[conn]

    sack = _sack_blocks(cap.frame("tcp_sack"))
    sack_start, sack_count = an.sack_ranges(frames, sack["frame"].to_numpy())
    wscale = np.where(seg["wscale_valid"], seg["wscale"].astype(np.int16), np.int16(-1))  # -1: no option
    segs = an.Segments(conn, side, seg["ts_ns"], frames, seg["seq"], seg["ack"], flags, seg["window"], wscale,
                       seg["payload_len"], sack_start, sack_count)
    built = segment_columns(cap)
    out = an.allocate_analysis(tcp.height, [_OUTPUT_OF[c] for c in built if c in _OUTPUT_OF])
    an.analyze(segs, n_conn, sack["left"].to_numpy(), sack["right"].to_numpy(), params.ooo_threshold_ns,
               params.use_handshake_rtt_for_ooo, out)
    del segs, wscale, sack_start, sack_count
    analysis = out.flags
    analysis[reused] |= an.REUSED_PORTS

    made = {  # each column of tcp_segments, made when it is built
        "frame": lambda: tcp["frame"], "ts_ns": lambda: tcp["ts_ns"], "tcp_flags": lambda: tcp["tcp_flags"],
        "window": lambda: tcp["window"], "conn": lambda: pl.Series("conn", conn),
        "from_client": lambda: pl.Series("from_client", from_client),
        "seq_rel": lambda: pl.Series("seq_rel", out.seq_rel),
        "ack_rel": lambda: columns.series("ack_rel", out.ack_rel, (flags & ACK) != 0),
        "seglen": lambda: pl.Series("seglen", seg["payload_len"]), "analysis": lambda: pl.Series("analysis", analysis),
        **{name: (lambda name=name, missing=missing: _nullable(name, getattr(out, name), missing))
           for name, (_, missing) in an.ANALYSIS_OUTPUTS.items()
           if name not in ("flags", "seq_rel", "ack_rel")},
    }
    assert set(made) == set(SEGMENT_DESCRIPTIONS), "tcp_segments columns out of step"
    seg_frame = pl.DataFrame([made[name]() for name in built])
    seg.update(conn=conn, from_client=from_client, reused=reused, client_by=client_by,
               is_retransmission=(analysis & an.ANY_RETRANSMISSION) != 0)
    return seg_frame, connections_frame(seg, n_conn, tcp.schema["src"])


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


CLIENT_SYN_COLUMNS = tuple(c.name for c in schema.FRAMES["tcp_client_syns"])


def client_syns(segments: pl.DataFrame) -> pl.DataFrame:
    """Of ``tcp_segments``: the SYNs (no ACK) each connection's client sent, resends included."""
    syn = (pl.col("tcp_flags").cast(pl.Int64) & (SYN | ACK)) == SYN
    return segments.lazy().filter(syn & pl.col("from_client")).select(CLIENT_SYN_COLUMNS).collect()


@frame_builder("tcp_client_syns")
def _build_client_syns(cap) -> pl.DataFrame:
    return client_syns(cap.frame("tcp_segments"))


__all__ = ["analyze_segments", "client_syns", "connection_batches", "tcp_messages", "tcp_packets"]
