"""Application messages: what the protocol decoders read.

A :class:`MessageSet` is a Polars frame with one row per application message (a UDP datagram, or a
message framed out of a reassembled TCP stream) plus the byte buffer its ``offset`` column indexes.
UDP datagrams index the capture buffer itself (no copy); IP-fragmented datagrams are reassembled into
a buffer of their own; TCP messages index the reassembly buffer of ``analyzer.tcp``. A decoder is
called once per message set and never needs to know where the bytes came from.

Fragment reassembly (RFC 791 §3.2, RFC 8200 §4.5) is done for UDP only (big Kerberos tickets and
EDNS answers fragment): fragments are grouped by (source, destination, protocol, identification),
ordered by offset, and a datagram is complete when its pieces cover [0, end of the fragment without
MF) without a hole. Overlapping fragments: the first copy wins (as most stacks do). An incomplete
datagram is still a message, ``complete`` False, holding the bytes before the first hole.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from numba import njit

from .schema import Column, column

TRANSPORTS = pl.Enum(["udp", "tcp"])

MESSAGE_COLUMNS: tuple[Column, ...] = (
    column("transport", object, "udp or tcp", polars=TRANSPORTS),
    column("flow", np.uint32, "UDP: dense id of the (client, client port, server, server port) flow; "
         "TCP: the connection id of the connections frame"),
    column("from_client", np.bool_, "sent by the client (towards the service port)"),
    column("src", object, "source address"),
    column("dst", object, "destination address"),
    column("sport", np.uint16, "source port"),
    column("dport", np.uint16, "destination port"),
    column("frame_first", np.uint32, "frame number of the first packet carrying the message"),
    column("frame_last", np.uint32, "frame number of the last packet carrying the message (where Wireshark "
         "shows the reassembled message)"),
    column("ts_first_ns", np.int64, "time of the first packet of the message"),
    column("ts_last_ns", np.int64, "time of the last packet of the message"),
    column("offset", np.int64, "offset of the message's first byte in the message set's buffer"),
    column("length", np.uint32, "bytes of the message available in the buffer"),
    column("wire_length", np.uint32, "bytes the message has on the wire (more than length when the "
         "snapshot length or a missing fragment/segment cut it)"),
    column("complete", np.bool_, "every byte of the message was captured (length may still be shorter when a "
         "framing copies only a message's first bytes, e.g. the header of a 1 MiB SMB2 WRITE)"),
)


# The message-set columns every decoder's message frame keeps (offset and length only locate bytes).
KEPT_COLUMNS: tuple[Column, ...] = tuple(c for c in MESSAGE_COLUMNS if c.name not in ("offset", "length"))


@dataclass
class MessageSet:
    """Messages (``frame``, columns as MESSAGE_COLUMNS) and the bytes their offsets index."""

    frame: pl.DataFrame
    buf: np.ndarray
    stats: pl.DataFrame | None = None  # TCP: per-direction reassembly and framing figures

    @property
    def height(self) -> int:
        return self.frame.height

    def message_bytes(self, row: int) -> bytes:
        """One message's available bytes (for tests and drill-down, not for hot paths)."""
        off = int(self.frame["offset"][row])
        return bytes(self.buf[off:off + int(self.frame["length"][row])])


def _udp_packets(cap) -> pl.DataFrame:
    """The capture's UDP packets (whole datagrams and fragments), built once and shared by every
    protocol's udp_messages."""
    def build():
        return cap.packets.filter(pl.col("ip_proto") == 17).select(
            "frame", "ts_ns", "src", "dst", "sport", "dport", "ip_proto", "parse_status", "ip_id", "ip_flags",
            "frag_offset",
            "l4_hdr_len", "payload_offset", "payload_len", "payload_caplen")
    memo = getattr(cap, "memo", None)
    return memo("udp_packets", build) if memo else build()


FLOW_KEY_COLUMNS = ("src", "dst", "sport", "dport")


def _flows(frame: pl.DataFrame, service_ports: set[int]) -> pl.DataFrame:
    """Adds ``from_client`` (towards a service port; the lower one when both are) and ``flow``."""
    ports = pl.Series(sorted(service_ports), dtype=pl.UInt16).implode()
    to_service = pl.col("dport").is_in(ports) & ~(pl.col("sport").is_in(ports) & (pl.col("sport") < pl.col("dport")))
    frame = frame.with_columns(to_service.alias("from_client"))
    # addresses by their Enum codes (one category list per capture): no text needed for a key
    src, dst = pl.col("src").to_physical(), pl.col("dst").to_physical()
    client = pl.when(pl.col("from_client")).then(src).otherwise(dst)
    server = pl.when(pl.col("from_client")).then(dst).otherwise(src)
    cport = pl.when(pl.col("from_client")).then(pl.col("sport")).otherwise(pl.col("dport"))
    sport = pl.when(pl.col("from_client")).then(pl.col("dport")).otherwise(pl.col("sport"))
    key = pl.struct(client.alias("c"), cport.alias("cp"), server.alias("s"), sport.alias("sp"))
    return frame.with_columns((key.rank("dense") - 1).cast(pl.UInt32).alias("flow"))


def _select(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select(
        pl.lit("udp").cast(TRANSPORTS).alias("transport"), "flow", "from_client", "src", "dst", "sport", "dport",
        "frame_first", "frame_last", "ts_first_ns", "ts_last_ns", "offset",
        pl.col("length").cast(pl.UInt32), pl.col("wire_length").cast(pl.UInt32),
        pl.col("complete") if "complete" in frame.columns else (pl.col("length") == pl.col("wire_length")).alias("complete"),
    )


@njit(cache=True)
def _assemble(buf, order, group_start, frag_offset, payload_offset, captured, wire_len, more, out, out_start,
              out_len, out_wire, out_complete):
    """Copy each group's fragments (rows ``order[group_start[g]:group_start[g+1]]``, sorted by offset)
    into ``out`` at ``out_start[g]``; first copy wins on overlap; stop at the first hole."""
    for g in range(group_start.shape[0] - 1):
        base = out_start[g]
        # the datagram's length comes from its last fragment (MF clear), wherever that lies
        total = -1
        for k in range(group_start[g], group_start[g + 1]):
            r = order[k]
            if not more[r]:
                total = np.int64(frag_offset[r]) + np.int64(wire_len[r])
        filled = 0  # contiguous bytes from offset 0
        for k in range(group_start[g], group_start[g + 1]):
            r = order[k]
            off = np.int64(frag_offset[r])
            if off > filled:
                break  # a hole: the bytes after it cannot be placed in a contiguous message
            have = np.int64(captured[r])
            end = off + have
            if end > filled:
                src = payload_offset[r] + (filled - off)
                n = end - filled
                out[base + filled:base + filled + n] = buf[src:src + n]
                filled = end
            if have < wire_len[r]:
                break  # this fragment was cut by the snapshot length: a hole after it
        out_len[g] = filled
        out_wire[g] = total if total >= 0 else filled
        out_complete[g] = total >= 0 and filled >= total


def _reassembled_udp(cap, packets: pl.DataFrame, service_ports: set[int]):
    """(datagrams frame without flow ids, their buffer), or None."""
    frags = packets.filter((pl.col("ip_proto") == 17) & (pl.col("frag_offset").is_not_null())
                           & (((pl.col("ip_flags") & 1) == 1) | (pl.col("frag_offset") > 0)))
    if frags.height == 0:
        return None
    frags = frags.with_columns(
        pl.struct("src", "dst", "ip_id").rank("dense").cast(pl.Int64).alias("group"),
        pl.col("payload_caplen").cast(pl.Int64).alias("captured"),
        # the first fragment's payload_offset is past the UDP header; reassemble from the UDP header
        pl.when(pl.col("frag_offset") == 0)
        .then(pl.col("payload_offset") - pl.col("l4_hdr_len").cast(pl.Int64))
        .otherwise(pl.col("payload_offset")).alias("ip_payload_offset"),
        pl.when(pl.col("frag_offset") == 0)
        .then(pl.col("payload_len") + pl.col("l4_hdr_len").cast(pl.UInt32))
        .otherwise(pl.col("payload_len")).alias("ip_payload_len"),
    ).with_columns(
        pl.when(pl.col("frag_offset") == 0).then(pl.col("captured") + pl.col("l4_hdr_len").cast(pl.Int64))
        .otherwise(pl.col("captured")).alias("captured"),
    ).sort("group", "frag_offset", "frame")
    heads = frags.filter(pl.col("frag_offset") == 0)
    groups = frags.group_by("group", maintain_order=True).agg(
        pl.len().alias("n"), pl.col("frame").min().alias("frame_first"), pl.col("frame").max().alias("frame_last"),
        pl.col("ts_ns").min().alias("ts_first_ns"), pl.col("ts_ns").max().alias("ts_last_ns"),
        (pl.col("frag_offset").cast(pl.Int64) + pl.col("ip_payload_len").cast(pl.Int64)).max().alias("span"),
    )
    counts = groups["n"].to_numpy()
    group_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    span = groups["span"].to_numpy().astype(np.int64)
    out_start = np.concatenate([[0], np.cumsum(span)[:-1]]).astype(np.int64)
    out = np.zeros(int(span.sum()), np.uint8)
    n_groups = groups.height
    out_len = np.zeros(n_groups, np.int64)
    out_wire = np.zeros(n_groups, np.int64)
    out_complete = np.zeros(n_groups, np.bool_)
    _assemble(cap.buf, np.arange(frags.height, dtype=np.int64), group_start,
              frags["frag_offset"].to_numpy(), frags["ip_payload_offset"].to_numpy(),
              frags["captured"].to_numpy(), frags["ip_payload_len"].to_numpy().astype(np.int64),
              ((frags["ip_flags"].to_numpy() & 1) == 1), out, out_start, out_len, out_wire, out_complete)
    datagrams = groups.with_columns(
        pl.Series("offset", out_start + 8), pl.Series("length", np.maximum(out_len - 8, 0)),
        pl.Series("wire_length", np.maximum(out_wire - 8, 0)), pl.Series("complete", out_complete),
    ).join(heads.select("group", "src", "dst", "sport", "dport"), on="group", how="inner")
    ports = pl.Series(sorted(service_ports), dtype=pl.UInt16).implode()
    datagrams = datagrams.filter(pl.col("sport").is_in(ports) | pl.col("dport").is_in(ports))
    if datagrams.height == 0:
        return None
    return datagrams, out


def udp_messages(cap, service_ports: set[int]) -> list[MessageSet]:
    """UDP datagrams to or from ``service_ports``: unfragmented ones over the capture buffer, and
    reassembled fragmented ones in a buffer of their own."""
    p = _udp_packets(cap)
    ports = pl.Series(sorted(service_ports), dtype=pl.UInt16).implode()
    whole = p.filter(
        (pl.col("ip_proto") == 17) & (pl.col("parse_status").is_in(["ok", "bad_l4"]))
        & ((pl.col("ip_flags") & 1) == 0) & (pl.col("frag_offset") == 0)
        & (pl.col("sport").is_in(ports) | pl.col("dport").is_in(ports))
    ).with_columns(
        pl.col("frame").alias("frame_first"), pl.col("frame").alias("frame_last"),
        pl.col("ts_ns").alias("ts_first_ns"), pl.col("ts_ns").alias("ts_last_ns"),
        pl.col("payload_offset").alias("offset"), pl.col("payload_caplen").alias("length"),
        pl.col("payload_len").alias("wire_length"),
    )
    pieces = [(whole, cap.buf)]
    fragmented = _reassembled_udp(cap, p, service_ports)
    if fragmented is not None:
        pieces.append(fragmented)
    # flow ids are numbered over all pieces so a flow has one id whichever buffer holds a datagram
    keyed = [frame.select(FLOW_KEY_COLUMNS).with_columns(pl.lit(k).alias("_piece"),
                                                         pl.int_range(frame.height).alias("_row"))
             for k, (frame, _) in enumerate(pieces)]
    flows = _flows(pl.concat(keyed), service_ports)
    sets = []
    for k, (frame, buf) in enumerate(pieces):
        ids = flows.filter(pl.col("_piece") == k).sort("_row").select("flow", "from_client")
        sets.append(MessageSet(_select(pl.concat([frame, ids], how="horizontal")), buf))
    return [s for s in sets if s.height]


def message_sets(cap, *, udp_ports=(), tcp_framing: str | None = None, tcp_ports=()) -> list[MessageSet]:
    """A protocol's messages: UDP datagrams to or from ``udp_ports`` and TCP messages framed with
    ``tcp_framing`` on ``tcp_ports`` (see ``analyzer.tcp.framing``)."""
    sets = udp_messages(cap, set(udp_ports)) if udp_ports else []
    if tcp_framing and tcp_ports:
        from .tcp import tcp_messages  # analyzer.tcp builds on this module

        sets += tcp_messages(cap, tcp_framing, set(tcp_ports))
    return sets
