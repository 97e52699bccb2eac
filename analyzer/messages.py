"""Application messages: what the protocol decoders read.

A :class:`MessageSet` is a Polars frame with one row per application message (a UDP datagram, or a
message framed out of a reassembled TCP stream) plus the byte buffer its ``offset`` column indexes.
UDP datagrams index the capture buffer itself (no copy); IP-fragmented datagrams are reassembled into
a buffer of their own; TCP messages index the reassembly buffer of ``analyzer.tcp``. A decoder is
called once per message set and never needs to know where the bytes came from.

:func:`protocol_message_sets` is a decoder's entry point: its declaration (``PROTOCOL``, see
analyzer/decoders/protocol.py) says the ports, the TCP framing and the client-side rule. The
:class:`MessageSet` itself lives in :mod:`analyzer.message_set` (re-exported here), which
:mod:`analyzer.tcp.framing` imports too: this module imports ``analyzer.tcp``, never the other way.

Fragment reassembly (RFC 791 §3.2, RFC 8200 §4.5) is done for UDP only (big Kerberos tickets and
EDNS answers fragment): fragments are grouped by (source, destination, protocol, identification),
ordered by offset, and a datagram is complete when its pieces cover [0, end of the fragment without
MF) without a hole. Overlapping fragments: the first copy wins (as most stacks do). An incomplete
datagram is still a message, ``complete`` False, holding the bytes before the first hole.
"""
from __future__ import annotations

import importlib

import numpy as np
import polars as pl

from .jit import njit
from .decoders.protocol import Protocol
from .message_set import KEPT_COLUMNS, MESSAGE_COLUMNS, TRANSPORTS, MessageSet  # noqa: F401 - re-exported
from .tcp import connection_batches, tcp_messages


def udp_packets(cap) -> pl.DataFrame:
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


def _service_port_direction(service_ports: set[int]) -> pl.Expr:
    """The "service_port" rule: sent towards a service port (the lower one when both ends use one)."""
    ports = pl.Series(sorted(service_ports), dtype=pl.UInt16).implode()
    return pl.col("dport").is_in(ports) & ~(pl.col("sport").is_in(ports) & (pl.col("sport") < pl.col("dport")))


def flow_key(src: pl.Expr, dst: pl.Expr) -> pl.Expr:
    """The key UDP flow ids rank: (client, client port, server, server port) as a struct, oriented by
    the frame's ``from_client`` column; ``src``/``dst`` are the addresses as comparable codes."""
    fc = pl.col("from_client")
    return pl.struct(pl.when(fc).then(src).otherwise(dst).alias("c"),
                     pl.when(fc).then(pl.col("sport")).otherwise(pl.col("dport")).alias("cp"),
                     pl.when(fc).then(dst).otherwise(src).alias("s"),
                     pl.when(fc).then(pl.col("dport")).otherwise(pl.col("sport")).alias("sp"))


def _flow_ids(frame: pl.DataFrame) -> pl.DataFrame:
    """Adds ``flow``: a dense id of :func:`flow_key`."""
    # addresses by their Enum codes (one category list per capture): no text needed for a key
    key = flow_key(pl.col("src").to_physical(), pl.col("dst").to_physical())
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


def _on_service(service_ports: set[int]) -> pl.Expr:
    """Datagrams to or from a service port."""
    ports = pl.Series(sorted(service_ports), dtype=pl.UInt16).implode()
    return pl.col("sport").is_in(ports) | pl.col("dport").is_in(ports)


def _service_datagrams(frame: pl.DataFrame, service_ports: set[int], also_flows: pl.DataFrame | None) -> pl.DataFrame:
    """The rows of FRAME to or from a service port, and those of the ALSO_FLOWS 4-tuples (either way)."""
    on_port = frame.filter(_on_service(service_ports))
    if also_flows is None or also_flows.height == 0:
        return on_port
    key = list(FLOW_KEY_COLUMNS)
    flows = also_flows.select([pl.col(c).cast(pl.String) for c in key[:2]] + [pl.col(c).cast(pl.UInt16) for c in key[2:]])
    both = pl.concat([flows, flows.select(pl.col("dst").alias("src"), pl.col("src").alias("dst"),
                                          pl.col("dport").alias("sport"), pl.col("sport").alias("dport"))]).unique()
    probe = frame.with_row_index("_k").select("_k", *[pl.col(c).cast(pl.String) for c in key[:2]],
                                              *[pl.col(c).cast(pl.UInt16) for c in key[2:]])
    learned = probe.join(both, on=key, how="semi")["_k"]
    hit = pl.Series(np.zeros(frame.height, np.bool_))
    hit[learned.to_numpy()] = True
    return frame.filter(_on_service(service_ports) | hit)


def _reassembled_udp(cap, packets: pl.DataFrame, service_ports: set[int], also_flows: pl.DataFrame | None = None):
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
    datagrams = _service_datagrams(datagrams, service_ports, also_flows)
    if datagrams.height == 0:
        return None
    return datagrams, out


def udp_messages(cap, service_ports: set[int], *, direction=None, also_flows: pl.DataFrame | None = None
                 ) -> list[MessageSet]:
    """UDP datagrams to or from ``service_ports``: unfragmented ones over the capture buffer, and
    reassembled fragmented ones in a buffer of their own. ``from_client``: towards a service port, or
    what ``direction(message_set)`` (a bool per message) says; flows are oriented by it. ``also_flows``:
    the datagrams of these (src, dst, sport, dport) too, either way (flows a decoder learned from the
    capture, e.g. NLM on a port the portmapper handed out)."""
    p = udp_packets(cap)
    whole = _service_datagrams(p.filter(
        (pl.col("ip_proto") == 17) & (pl.col("parse_status").is_in(["ok", "bad_l4"]))
        & ((pl.col("ip_flags") & 1) == 0) & (pl.col("frag_offset") == 0)), service_ports, also_flows,
    ).with_columns(
        pl.col("frame").alias("frame_first"), pl.col("frame").alias("frame_last"),
        pl.col("ts_ns").alias("ts_first_ns"), pl.col("ts_ns").alias("ts_last_ns"),
        pl.col("payload_offset").alias("offset"), pl.col("payload_caplen").alias("length"),
        pl.col("payload_len").alias("wire_length"),
    )
    pieces = [(whole, cap.buf)]
    fragmented = _reassembled_udp(cap, p, service_ports, also_flows)
    if fragmented is not None:
        pieces.append(fragmented)
    # flow ids are numbered over all pieces so a flow has one id whichever buffer holds a datagram
    keyed = [frame.select(FLOW_KEY_COLUMNS).with_columns(_service_port_direction(service_ports)
                                                         .alias("from_client"), pl.lit(k).alias("_piece"),
                                                         pl.int_range(frame.height).alias("_row"))
             for k, (frame, _) in enumerate(pieces)]
    if direction is not None:  # the "message" rule: the decoder reads each datagram's direction
        keyed = [key.with_columns(pl.Series("from_client", _direction_of(
                     direction, MessageSet(_select(frame.with_columns(pl.lit(0, pl.UInt32).alias("flow"),
                                                                      key["from_client"])), buf))))
                 for key, (frame, buf) in zip(keyed, pieces)]
    flows = _flow_ids(pl.concat(keyed))
    sets = []
    for k, (frame, buf) in enumerate(pieces):
        ids = flows.filter(pl.col("_piece") == k).sort("_row").select("flow", "from_client")
        sets.append(MessageSet(_select(pl.concat([frame, ids], how="horizontal")), buf))
    return [s for s in sets if s.height]


def _direction_of(direction, ms: MessageSet) -> np.ndarray:
    """``direction(ms)`` checked: one bool per message (True: sent by the client)."""
    out = np.asarray(direction(ms), dtype=np.bool_)
    if out.shape != (ms.height,):
        raise ValueError(f"message direction function returned {out.shape[0] if out.ndim else 'a scalar'} "
                         f"values for {ms.height} messages")
    return out


def message_direction(proto: Protocol):
    """The decoder's function of the "message" rule (``Protocol.message_direction``, "module:function";
    the module is the decoder's own, already imported when its frames are built)."""
    module, _, name = proto.message_direction.partition(":")
    return getattr(importlib.import_module(module), name)


def protocol_message_sets(cap, proto: Protocol, *, only_conns=None, udp: bool = True) -> list[MessageSet]:
    """A protocol's messages, from its declaration: UDP datagrams to or from its ``udp_ports`` and TCP
    messages framed with its ``tcp_framing`` on its ``tcp_ports`` (see ``analyzer.tcp.framing``), the
    client side (``from_client``, and so the orientation of UDP flows) decided by its ``client_side``
    rule (analyzer/decoders/protocol.py):

    - "service_port": sent towards one of the protocol's ports (the lower one when both ends use one;
      a TCP connection with the same port at both ends keeps the side analyzer.tcp calls the client).
    - "connection_initiator": TCP: the connection's client as analyzer.tcp decides it (the SYN sender;
      without the handshake the SYN/ACK's receiver, else the higher port); UDP: "service_port".
    - "message": the decoder's ``message_direction`` function reads each message's bytes.

    ``only_conns``: of TCP, only these connections (``tcp_messages``); UDP is always whole, or left out
    with ``udp`` False.
    """
    direction = message_direction(proto) if proto.client_side == "message" else None
    sets = udp_messages(cap, set(proto.udp_ports), direction=direction) if proto.udp_ports and udp else []
    if proto.tcp_ports:
        tcp_rule = "service_port" if proto.client_side == "service_port" else "connection_initiator"
        tcp_sets = tcp_messages(cap, proto.tcp_framing, set(proto.tcp_ports), client_side=tcp_rule,
                                only_conns=only_conns)
        if direction is not None:  # per message; ms.stats keeps analyzer.tcp's orientation (MessageSet)
            tcp_sets = [MessageSet(ms.frame.with_columns(pl.Series("from_client", _direction_of(direction, ms))),
                                   ms.buf, ms.stats) for ms in tcp_sets]
        sets += tcp_sets
    return sets



# Captured payload framed at a time by the decoders that frame in batches (analyzer.tcp.connection_batches:
# HTTP, SMB2). HTTP's first framing copies up to its HEADER_COPY_BYTES of every message, bodies within
# them included: 54 MB at once for the 37k messages of web traffic of the 1M synth capture (287 MB of
# payload); SMB2's up to 8 KiB of each: 618 MB at once for the SMB2 server's partition of the 10M synth
# capture. Batch by batch, memory holds one batch's copies and what was decoded from the others. Each
# batch costs a framing call (~25 ms): on the 1M synth, 64 MiB is 5 HTTP batches, the scan's peak
# 626 -> 582-589 MB at no cost in time; 16 MiB is 18 batches, 559-572 MB and 0.3 s more.
FRAMING_BATCH_BYTES = 64 << 20


def message_set_batches(cap, proto: Protocol, batch_bytes: int):
    """:func:`protocol_message_sets` of a protocol over TCP alone, a batch of its connections at a time
    (``analyzer.tcp.connection_batches``: about ``batch_bytes`` of captured payload each, ascending
    connection ids), as lists of sets: a decoder that decodes each list and drops it before the next
    holds one batch's copied bytes at a time. Concatenated in order, the batches' sets hold the rows
    of the sets framed at once, in their order (a set's rows go by connection, then by stream). A
    protocol's UDP datagrams, which are not framed by connection, come whole with the first batch
    (at once with its TCP sets when they carry no payload), before its TCP sets, as
    :func:`protocol_message_sets` puts them."""
    batches = connection_batches(cap, set(proto.tcp_ports), batch_bytes) if proto.tcp_ports else []
    if not batches:  # no TCP payload to copy
        if proto.udp_ports:
            yield protocol_message_sets(cap, proto)
        return
    for k, batch in enumerate(batches):
        yield protocol_message_sets(cap, proto, only_conns=batch, udp=k == 0)


def _peer_pairs(sets: list[MessageSet]) -> pl.DataFrame | None:
    """(a, b) address pairs (text, both orders) that exchanged messages in SETS; None when none did."""
    pairs = [ms.frame.select(pl.col("src").cast(pl.String).alias("a"), pl.col("dst").cast(pl.String).alias("b"))
             for ms in sets if ms.height]
    if not pairs:
        return None
    pairs = pl.concat(pairs).unique()
    return pl.concat([pairs, pairs.select(pl.col("b").alias("a"), pl.col("a").alias("b"))]).unique()


def peer_connections(cap, sets: list[MessageSet], proto: Protocol) -> list[int]:
    """TCP connections between two hosts that exchanged ``proto``'s messages (SETS, from its declared
    ports), on ports it does not declare: where a protocol's peers talk it on ports learned at run time
    (an NFSv4.0 callback channel, RFC 7530 §3.3.5: the server connects to the client's callback port;
    NLM and MOUNT on ports from the portmapper). Candidates only: the decoder checks their bytes."""
    pairs = _peer_pairs(sets)
    if pairs is None:
        return []
    ports = pl.Series(sorted(set(proto.tcp_ports)), dtype=pl.UInt16).implode()
    conns = cap.frame("connections").filter(~pl.col("server_port").is_in(ports) & ~pl.col("client_port").is_in(ports))
    if conns.height == 0:
        return []
    found = conns.select("conn", pl.col("client").cast(pl.String).alias("a"), pl.col("server").cast(pl.String).alias("b")) \
        .join(pairs, on=["a", "b"], how="semi")
    return found["conn"].to_list()


def peer_datagrams(cap, sets: list[MessageSet], proto: Protocol) -> pl.DataFrame:
    """The UDP twin of :func:`peer_connections`: per UDP flow between two such hosts on ports ``proto``
    does not declare, its first whole datagram (``src dst sport dport offset length``: the payload in
    the capture buffer), for the decoder to check; pass the flows it accepts to
    :func:`udp_messages` as ``also_flows``."""
    cols = {"src": pl.String, "dst": pl.String, "sport": pl.UInt16, "dport": pl.UInt16, "offset": pl.Int64,
            "length": pl.Int64}
    pairs = _peer_pairs(sets)
    if pairs is None:
        return pl.DataFrame(schema=cols)
    ports = pl.Series(sorted(set(proto.udp_ports)), dtype=pl.UInt16).implode()
    p = udp_packets(cap).filter(
        (pl.col("parse_status").is_in(["ok", "bad_l4"])) & ((pl.col("ip_flags") & 1) == 0) & (pl.col("frag_offset") == 0)
        & ~pl.col("sport").is_in(ports) & ~pl.col("dport").is_in(ports))
    if p.height == 0:
        return pl.DataFrame(schema=cols)
    p = p.select("frame", pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String), "sport", "dport",
                 pl.col("payload_offset").cast(pl.Int64).alias("offset"),
                 pl.col("payload_caplen").cast(pl.Int64).alias("length"))
    p = p.join(pairs.rename({"a": "src", "b": "dst"}), on=["src", "dst"], how="semi")
    lo = (pl.col("src") < pl.col("dst")) | ((pl.col("src") == pl.col("dst")) & (pl.col("sport") <= pl.col("dport")))
    key = pl.struct(pl.when(lo).then(pl.col("src")).otherwise(pl.col("dst")).alias("a"),
                    pl.when(lo).then(pl.col("sport")).otherwise(pl.col("dport")).alias("ap"),
                    pl.when(lo).then(pl.col("dst")).otherwise(pl.col("src")).alias("b"),
                    pl.when(lo).then(pl.col("dport")).otherwise(pl.col("sport")).alias("bp"))
    first = p.sort("frame").with_columns(key.alias("_flow")).group_by("_flow", maintain_order=True).first()
    return first.select([pl.col(c).cast(t) for c, t in cols.items()])
