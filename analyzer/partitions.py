"""Decoding a capture in server partitions, and merging the partitions' frames into the whole run's.

What a distributed scan is built on (issue 13; ``analyzer/distributed.py`` runs it on Dask). Most
decoder state lives between two hosts (a TCP connection and its reassembly, a UDP flow, a request
waiting for its response, a RoCE queue pair), but three decoders keep state per *server*, across
its clients: an SMB2 break's trigger is another client's CREATE, an NFS file handle's path is learned
from another client's LOOKUP, Kerberos numbers logins across the capture. So the unit of decoding is
the server: every packet to or from it, in one partition.

**The server of a packet** (:func:`partition_of_packets`) is decided per unordered address pair, so
both directions of every connection, flow and queue pair land together: of the two addresses, the one
that used a decoder's port (``Protocol.ports``) in its packets with the other is the server. When
neither did, the one the other opened TCP connections to (sent a SYN without ACK) is: so every
attempt to connect to a port no decoder knows (what ``retry_storm`` counts as SYN retries, per server
and port) lands with its server. When both did (RoCE peers, two LDAP servers replicating, connections
opened both ways) or neither did, the one first seen in the capture (the lower code in the capture's
address Enum) is. The NFS callback channel, on which the NFS server is the
TCP client, is between the same two addresses as the client's NFS connection, so it stays with its NFS
server. Packets without addresses (PAUSE frames, ARP) are partition 0's.
The servers are dealt to the ``n`` partitions largest first, each to the partition with the fewest
packets so far (:func:`balanced_partitions`, Graham's LPT rule: no partition holds more than 4/3 of
the least a largest partition can hold, the largest server or an ``n``-th of the packets): a
capture's servers are far from equal (on the 1M synth capture one has 27% of the packets), and a
partition's memory is that of its packets. The caller decides and sends every task the partition of
each packet (:func:`partition_ids`), so nothing has to agree across workers but the frame numbers.

**The merge** (:func:`merge_frames`) concatenates each frame's partitions and gives back the whole
run's rows, ids and order:
- ``conn`` (Wireshark's ``tcp.stream``, and ``flow`` of TCP rows, ``owner_flow``/``trigger_flow`` of
  ``smb2_breaks``) is renumbered by first frame, as the connection table numbers it;
- ``flow`` of UDP rows is a dense rank of (client, client port, server, server port) per protocol,
  recomputed over the union of the partitions' flows;
- ``qp_pair`` (RoCE) is recomputed as the dense rank of its unordered endpoints and source port;
- ordinals that count messages or logins across the capture (``message`` of ``nfs_*`` and
  ``smb2_*``, ``login`` of ``kerberos_transactions``) are kept unique by offsetting each partition's
  by the counts of the partitions before it; they order rows within a partition as in the whole run
  but are not the whole run's numbers (no detector reads them);
- rows are put in the order each frame's builder sorts them (:data:`MERGE_ORDER`).
Checked on every sample (``tests/test_partitions.py``): every frame the detectors read is the whole
run's, the ordinals above aside, and so are the findings.

**Shards** (:meth:`PartitionDecision.dealt` with ``shards``): a server with more than an even share of
the packets is cut by client into shards, each a partition of its own; ``analyzer.shards`` says how
and what a cut server's task merges.

**Client buckets** (:func:`client_buckets`): a detector that follows one client across its servers
(incast: a client's many servers answering at once) needs every connection of that client, and a
server partition holds only some of them. So a server partition's connection frames
(:data:`CONNECTION_FRAMES`) are split again by the hash of each connection's client address, and bucket
``j`` of every server partition, merged with the whole run's ``conn`` numbering
(:func:`connection_maps`), is every connection of the clients of bucket ``j`` with its segments.
:class:`FrameSet` carries such merged frames to a detector without the capture's bytes.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable

import numpy as np
import polars as pl

from .capture import UNSELECTED, ReadPart, open_captures
from .ingest import ChunkReduction
from .decoders.registry import protocol_of_frame, protocols
from .kernels.pairs import PairTable
from .kernels.silences import KEEP_EVERY_TIME, SPAN_ONLY_NS, thinned_times
from .messages import flow_key
from .record_index import RecordIndex, RecordIndexWriter
from .wide_frames import sorted_held

# frame -> the columns its builder sorts its rows by (after the ids are renumbered); a frame not
# listed here keeps partition order, which tests/test_partitions.py would catch
MERGE_ORDER: dict[str, tuple[str, ...]] = {
    "tcp_segments": ("frame",),
    "tcp_client_syns": ("frame",),
    "connections": ("conn",),
    "dns_messages": ("frame_first", "frame_last"),
    "kerberos_messages": ("frame_last",),
    "ldap_messages": ("frame_last",),
    "smb2_messages": ("frame_last", "message", "chain_index"),
    "nfs_messages": ("ts_last_ns", "message", "op_index"),
    "http_messages": ("frame_first", "frame_last"),
    "dns_transactions": ("request_ts_ns", "request_frame"),
    "kerberos_transactions": ("request_ts_ns", "request_frame"),
    "ldap_transactions": ("request_ts_ns", "request_frame"),
    "smb2_transactions": ("request_ts_ns", "request_frame"),
    "nfs_transactions": ("request_ts_ns", "request_frame"),
    "kerberos_ap": ("ts_ns", "frame"),
    "ldap_sync": ("ts_ns", "frame"),
    "smb2_breaks": ("ts_ns", "frame"),
    "pause_frames": ("frame",),
    "rocev2_packets": ("frame",),
    "rocev2_flows": ("first_ns", "qp_pair"),
    "tcp_sack": ("frame", "block"),
    "icmp_errors": ("frame",),
}
# per-partition ordinals, offset to stay unique (module doc)
ORDINALS: dict[str, tuple[str, ...]] = {
    "smb2_messages": ("message",), "smb2_transactions": ("message",),
    "nfs_messages": ("message",), "nfs_transactions": ("message",), "kerberos_transactions": ("login",),
}
# the frames keyed by a TCP connection (a ``conn`` column): what a client bucket holds
CONNECTION_FRAMES = ("connections", "tcp_segments", "tcp_client_syns")
_TCP_FLOW_COLUMNS = ("owner_flow", "trigger_flow")  # smb2_breaks: connections of other rows
_CONN_MAP = "_conn_first_frame"  # what a partition hands over besides its frames: conn -> first frame
_ADDRESSES = "_address_dtype"  # and the capture's address Enum (an empty column of it): what codes are


# what a partition's task keeps of its packets and frames whatever its caller reads of them: the frame
# numbers and times, the addresses' Enum (decode_partition hands it over), and of every frame the keys
# the merge renumbers and orders rows by (analyzer.distributed.decode_partition_task)
TASK_KEPT_PACKET_COLUMNS = ("frame", "ts_ns", "src")
MERGE_KEY_COLUMNS = ("conn", "frame")

# what partition_ids reads of the packets frame
PARTITION_COLUMNS = ("frame", "src", "dst", "sport", "dport", "tcp_flags")
SYN, SYN_ACK = 0x02, 0x12  # tcp_flags: a SYN without ACK opens a connection to its destination
# packets whose pair inputs (~12 bytes each: partition_of_packets) are worked out at a time
PAIR_SLICE_ROWS = 1 << 20


def merge_columns(name: str, frame: pl.DataFrame, wanted) -> tuple[str, ...]:
    """Of ``frame`` (frame ``name`` of a partition), what to send to the merge when the merged frame's
    readers read only ``wanted``: those, and what :func:`merge_frames` itself reads of such a frame
    (the ids it renumbers and what says which to renumber, its ordinals, the keys it orders rows by, a
    RoCE pair's endpoints; of a messages frame what the UDP flows are recomputed from), in the
    frame's order. The merged frame then keeps ``wanted`` alone (``wide_frames.columns_among``)."""
    keys = {"conn", "flow", "transport", *_TCP_FLOW_COLUMNS, *ORDINALS.get(name, ()), *MERGE_ORDER.get(name, ())}
    if "qp_pair" in frame.columns:
        keys |= {"qp_pair", "src", "dst", "sport"}
    if _protocol_of(name) is not None and name == f"{_protocol_of(name)}_messages":
        keys |= {"src", "dst", "from_client"}
    kept = keys | set(wanted)
    return tuple(c for c in frame.columns if c in kept)


def caller_packet_columns(*columns: str) -> tuple[str, ...]:
    """What the caller of a run in partitions reads of the packets at all: ``columns`` (what the command
    itself reads of them) and those the partitioning reads (``open_captures`` adds what the joining of
    a ring buffer's pieces compares when there are several)."""
    return tuple(dict.fromkeys(columns + PARTITION_COLUMNS))


class PartitionDecision:
    """The server partitions of a capture's packets, added in capture order a slice at a time
    (:meth:`pairs_of`: each packet's address pair, found in one pass over the slices,
    :class:`analyzer.kernels.pairs.PairTable`), decided once all are in (:meth:`partition_of_pair`;
    module doc). Addresses are compared by their codes in the capture's address Enum, which every
    reader of the same files assigns alike."""

    def __init__(self, ports=None):
        self.served = np.zeros(1 << 16, np.bool_)
        self.served[np.asarray(sorted(set(decoder_ports() if ports is None else ports)), np.int64)] = True
        self.table = PairTable()

    def pairs_of(self, packets: pl.DataFrame) -> np.ndarray:
        """uint32 per packet of these, the next in capture order: its pair's number
        (:data:`~analyzer.kernels.pairs.NO_PAIR` without two addresses), :data:`PAIR_SLICE_ROWS` at a time."""
        pair_of = np.empty(packets.height, np.uint32)
        for start in range(0, packets.height, PAIR_SLICE_ROWS):
            rows = packets.slice(start, PAIR_SLICE_ROWS)
            self.table.add(*_pair_inputs(rows, self.served), pair_of[start:start + rows.height])
        return pair_of

    def partition_of_pair(self, count: int) -> np.ndarray:
        """uint32 per pair: its partition (0 .. count-1), its server's, servers dealt by packets
        (:func:`balanced_partitions`); one more entry, partition 0, for packets without a pair: index
        it with ``np.minimum(pair_of, len - 1)``."""
        return self.dealt(count)[0]

    def dealt(self, count: int, shards: bool = False) -> tuple[np.ndarray, list[list[int]]]:
        """:meth:`partition_of_pair`, and with ``shards`` every server with more than an even share of
        the packets (``count``-th of them) cut by client into shards (``analyzer.shards``): its address
        pairs dealt largest first into as many shards as hold its packets at that share (no more than
        its pairs), each shard a partition of its own numbered after the ``count`` of the other servers.
        Returns the partition of each pair (and the last entry, for packets without one) and, per
        server so cut (in address-code order), the partitions of its shards."""
        lo, hi, loads, lo_serves, hi_serves, lo_syn, hi_syn = self.table.pairs()
        by_port = lo_serves | hi_serves
        server = np.where(by_port, np.where(hi_serves & ~lo_serves, hi, lo), np.where(hi_syn & ~lo_syn, hi, lo))
        servers, server_of_pair = np.unique(server, return_inverse=True)
        server_loads = np.bincount(server_of_pair, weights=loads, minlength=servers.shape[0]).astype(np.int64)
        share = -(-int(loads.sum()) // count) if shards and count > 1 else None
        cuts = _shard_counts(server_loads, np.bincount(server_of_pair, minlength=servers.shape[0]), share)
        whole = np.flatnonzero(cuts == 1)
        order = whole[np.lexsort((servers[whole], -server_loads[whole]))]  # largest first, the lower code first
        partition_of_server = np.zeros(servers.shape[0], np.uint32)
        partition_of_server[order] = balanced_partitions(server_loads[order], count)
        partition_of_pair = partition_of_server[server_of_pair]
        groups, first = [], count
        for cut in np.flatnonzero(cuts > 1):  # servers in code order; each one's pairs largest first
            pairs = np.flatnonzero(server_of_pair == cut)
            pairs = pairs[np.lexsort((pairs, -loads[pairs]))]
            partition_of_pair[pairs] = first + balanced_partitions(loads[pairs], int(cuts[cut]))
            groups.append(list(range(first, first + int(cuts[cut]))))
            first += int(cuts[cut])
        if first >= int(UNSELECTED):
            raise ValueError(f"partition count {first} out of range (1 .. {int(UNSELECTED) - 1})")
        return np.append(partition_of_pair, np.uint32(0)), groups  # NO_PAIR: partition 0


def _shard_counts(server_loads: np.ndarray, server_pairs: np.ndarray, share: int | None) -> np.ndarray:
    """How many shards each server is cut into: 1 (whole) unless ``share`` is given and its packets are
    more than that; then as many as hold them at that size, but no more than its address pairs."""
    if share is None:
        return np.ones(server_loads.shape[0], np.int64)
    return np.maximum(1, np.minimum(-(-server_loads // max(1, share)), server_pairs))


def partition_of_packets(packets: pl.DataFrame, count: int, ports) -> pl.Series:
    """The partition (0 .. count-1) of each packet: its server's (:class:`PartitionDecision`)."""
    return pl.Series("partition", dealt_packets(packets, count, ports)[0], pl.UInt32)


def dealt_packets(packets: pl.DataFrame, count: int, ports, shards: bool = False
                  ) -> tuple[np.ndarray, list[list[int]]]:
    """uint32 per packet: its partition (:meth:`PartitionDecision.dealt`, with ``shards`` the servers
    above an even share cut into shards); and per server so cut the partitions of its shards."""
    decision = PartitionDecision(ports)
    pair_of = decision.pairs_of(packets)
    partition_of_pair, groups = decision.dealt(count, shards)
    np.minimum(pair_of, np.uint32(partition_of_pair.shape[0] - 1), out=pair_of)
    return partition_of_pair[pair_of], groups


def _pair_inputs(packets: pl.DataFrame, served: np.ndarray) -> tuple[np.ndarray, ...]:
    """What :meth:`PairTable.add` reads of these packets: source and destination address codes,
    whether a packet has both, whether its source and its destination port is ``served``, whether it
    opens a TCP connection (a SYN without ACK)."""
    has = (packets["src"].is_not_null() & packets["dst"].is_not_null()).to_numpy()
    src, dst = (packets[c].to_physical().fill_null(0).cast(pl.UInt32).to_numpy() for c in ("src", "dst"))
    src_serves, dst_serves = (served[packets[c].fill_null(0).to_numpy()] for c in ("sport", "dport"))
    syn = ((packets["tcp_flags"].fill_null(0) & SYN_ACK) == SYN).to_numpy()
    return src, dst, has, src_serves, dst_serves, syn


def balanced_partitions(loads: np.ndarray, count: int) -> np.ndarray:
    """The partition (0 .. count-1) of each of these items, given largest first: each goes to the
    partition with the least load so far, the lowest-numbered of equals (Graham's LPT rule: the
    largest partition is within 4/3 of the best any assignment can do)."""
    heap = [(0, k) for k in range(count)]
    out = np.empty(len(loads), np.uint32)
    for i, load in enumerate(loads.tolist()):
        least, k = heapq.heappop(heap)
        out[i] = k
        heapq.heappush(heap, (least + load, k))
    return out


def decoder_ports() -> tuple[int, ...]:
    """Every port a registered decoder listens on."""
    return tuple(sorted({port for p in protocols() for port in p.ports}))


def partition_ids(cap, count: int) -> np.ndarray:
    """uint16 per frame of ``cap`` (frame - 1): the partition (of ``count``) of each packet it holds (after
    a selection, the selected ones), :data:`~analyzer.capture.UNSELECTED` for the rest: what
    :func:`read_part` hands a reader of one partition. Of a capture read through :class:`CallerChunks`,
    decided from the pairs it kept (once: they are let go of then)."""
    return sharded_ids(cap, count, shards=False)[0]


def sharded_ids(cap, count: int, shards: bool) -> tuple[np.ndarray, list[list[int]]]:
    """:func:`partition_ids`, with ``shards`` the servers above an even share cut into shards of their
    clients (:meth:`PartitionDecision.dealt`): the ids, and per server so cut the partitions of its
    shards (numbered from ``count`` on)."""
    if not 0 < count < int(UNSELECTED):
        raise ValueError(f"partition count {count} out of range (1 .. {int(UNSELECTED) - 1})")
    records = sum(n for _, _, n in cap.pieces)
    if isinstance(cap.reduction, CallerChunks):
        return cap.reduction.ids(count, records, shards)
    packets = cap.packets
    partition, groups = dealt_packets(packets, count, decoder_ports(), shards)
    ids = np.full(records, UNSELECTED, np.uint16)
    ids[packets["frame"].to_numpy().astype(np.int64) - 1] = partition
    return ids, groups


class CallerChunks(ChunkReduction):
    """What the caller of a run in partitions keeps of a capture's packets, chunk by chunk as they are
    read (``open_captures(reduce=...)``), instead of reading them whole and then deciding: each
    packet's address pair (:class:`PartitionDecision`; 4 bytes a packet until :meth:`ids` turns them
    into the partitions' 2), the rows of every packet's ``extract`` (a scan's DNS payload locations:
    ``detectors.incidents_evidence.dns_payloads``; :meth:`take_extracted`), and of the packets themselves
    (frame, ts_ns) of those their span and silences of ``silence_ns`` need
    (``analyzer.kernels.silences``): what ``Capture.thin_packets`` would have left once the partitions
    were decided. The same partitions, extracted rows and times as the whole reading's, whatever the
    size of the capture (issue 13: the caller's reading of a 100M-packet capture held 6.3 GB). With
    ``record_index``, it writes the file's record index as well (``analyzer.record_index``; in
    ``index_dir``, by default the temporary directory): the partitions then read their records' rows
    from it instead of walking the file (:func:`read_part`); :meth:`close` deletes it."""

    def __init__(self, silence_ns: int | None, extract: Callable[[pl.DataFrame], pl.DataFrame] | None = None, *,
                 record_index: bool = False, index_dir: str | None = None):
        self.silence_ns, self.extract = silence_ns, extract
        self.decision = PartitionDecision()
        self.chunks: list[tuple[np.ndarray | int, np.ndarray]] = []  # (frames, or the first of a run; pairs)
        self.extracted_chunks: list[pl.DataFrame] = []
        self.decided: int | None = None  # the partitions ids() decided the packets' in
        self._index_writer = RecordIndexWriter(index_dir) if record_index else None
        self.record_index: RecordIndex | None = None  # once the file is read (None: no index; the partitions walk)
        self.index_warning: str | None = None  # why there is none, when one was asked for

    def records(self, recs, n: int) -> None:
        if self._index_writer is not None:
            self._index_writer.append(recs, n)

    def records_done(self, iface_linktypes, file_linktype: int, report) -> None:
        if self._index_writer is not None:
            self.record_index = self._index_writer.finish(iface_linktypes, file_linktype, report)
            self.index_warning = self._index_writer.why_not
            self._index_writer = None

    def close(self) -> None:
        """Delete the record index (and stop writing one)."""
        if self._index_writer is not None:
            self._index_writer.abandon()
            self._index_writer = None
        if self.record_index is not None:
            self.record_index.remove()
            self.record_index = None

    def chunk(self, packets: pl.DataFrame) -> pl.DataFrame:
        pair_of = self.decision.pairs_of(packets)
        frames = packets["frame"].to_numpy()
        run = frames.shape[0] == 0 or int(frames[-1]) - int(frames[0]) + 1 == frames.shape[0]
        self.chunks.append((int(frames[0]) if run and frames.shape[0] else frames.copy(), pair_of))
        if self.extract is not None:
            self.extracted_chunks.append(self.extract(packets))
        return thinned_times(packets.select("frame", "ts_ns"), self.silence_ns)

    def finish(self, packets: pl.DataFrame) -> pl.DataFrame:
        return thinned_times(packets, self.silence_ns)

    def take_extracted(self) -> pl.DataFrame | None:
        """``extract``'s rows of every chunk, in capture order (None without ``extract``); handed over once."""
        if self.extract is None:
            return None
        chunks, self.extracted_chunks = self.extracted_chunks, []
        return pl.concat(chunks) if len(chunks) != 1 else chunks[0]

    def ids(self, count: int, records: int, shards: bool = False) -> tuple[np.ndarray, list[list[int]]]:
        """:func:`sharded_ids` of the packets read, in ``count`` partitions, over ``records`` frames:
        decided once, the packets' pairs let go of then, and handed over (the caller's is the only
        reference: a second call raises)."""
        if self.decided is not None:
            raise ValueError(f"partitions decided already (for {self.decided} partitions) and handed over; "
                             f"asked again for {count}")
        partition_of_pair, groups = self.decision.dealt(count, shards)
        partition_of_pair = partition_of_pair.astype(np.uint16)
        last = np.uint32(partition_of_pair.shape[0] - 1)
        ids = np.full(records, UNSELECTED, np.uint16)
        for frames, pair_of in self.chunks:
            np.minimum(pair_of, last, out=pair_of)
            if isinstance(frames, int):
                ids[frames - 1:frames - 1 + pair_of.shape[0]] = partition_of_pair[pair_of]
            else:
                ids[frames.astype(np.int64) - 1] = partition_of_pair[pair_of]
        self.decided, self.decision, self.chunks = count, None, []
        return ids, groups


def read_part(cap, ids: np.ndarray | None, index: int, silence_ns: int | None = KEEP_EVERY_TIME) -> ReadPart:
    """What reading partition ``index`` of ``cap``'s files alone needs (``open_captures(part=...)``): the
    whole reading's pieces, interfaces and address Enums, and ``ids`` (:func:`partition_ids`; None to
    be set later, as a cluster sends it once to every worker); of the whole capture's packet times,
    those its span and silences of ``silence_ns`` need (``detectors.shortest_silence_ns``; None: all)."""
    icmp = cap.frame("icmp_errors")
    return ReadPart(pieces=tuple(cap.pieces), ids=ids, index=index, interfaces=cap.frame("interfaces"),
                    address_types={"packets": {c: cap.address_dtype for c in ("src", "dst")},
                                   "icmp_errors": {c: icmp.schema[c] for c in ("inner_src", "inner_dst")}},
                    silence_ns=silence_ns, record_index=record_index_of(cap))


def record_index_of(cap):
    """The record index ``cap``'s reading wrote (:class:`CallerChunks` with ``record_index``), or None."""
    return cap.reduction.record_index if isinstance(cap.reduction, CallerChunks) else None


def packets_reader(cap, packet_columns: tuple[str, ...]) -> Callable[[np.ndarray], pl.DataFrame]:
    """A function of some frame numbers of ``cap`` (the whole reading, before its packets are
    released) that reads those packets again from its files, with ``packet_columns`` (addresses in
    ``cap``'s Enum), in frame order: what the caller of a run in partitions, which keeps no column of
    every packet, reads of a few of them at the end (the incident linker: the addresses of the
    findings' evidence frames). Each call walks the files' records once (as a partition does) and
    decodes only those asked for."""
    template = dataclasses.replace(read_part(cap, None, 0, SPAN_ONLY_NS), whole_times=False)  # no time read
    records = sum(n for _, _, n in cap.pieces)

    def read(frames) -> pl.DataFrame:
        numbers = np.unique(np.asarray(frames, np.int64))
        numbers = numbers[(numbers >= 1) & (numbers <= records)]
        ids = np.full(records, UNSELECTED, np.uint16)
        ids[numbers - 1] = 0
        with open_captures([p for p, _, _ in template.pieces], part=dataclasses.replace(template, ids=ids),
                           packet_columns=packet_columns) as part:
            return part.packets.select(packet_columns)

    return read


def decode_partition(cap, names) -> dict[str, pl.DataFrame]:
    """Frames ``names`` of a capture already restricted to one partition, and the connection table's
    first frames (what the merge renumbers ``conn`` by)."""
    out = {name: cap.frame(name) for name in names}
    out[_ADDRESSES] = cap.packets.select("src").head(0)
    out[_CONN_MAP] = cap.frame("connections").select("conn", "first_frame")  # empty without TCP
    return out


# -- the merge ---------------------------------------------------------------------------------------
def connection_maps(parts: list[dict[str, pl.DataFrame]]) -> list[pl.DataFrame]:
    """Per partition: local conn -> the whole run's (rank of the connection's first frame), from each
    partition's conn map (:func:`decode_partition`)."""
    firsts = pl.concat([p[_CONN_MAP].select(pl.col("conn").cast(pl.UInt32), pl.col("first_frame").cast(pl.Int64),
                                            pl.lit(k, pl.UInt32).alias("_part"))
                        for k, p in enumerate(parts)])
    firsts = firsts.sort("first_frame", "_part", "conn").with_row_index("_global")
    return [firsts.filter(pl.col("_part") == k).select("conn", pl.col("_global").cast(pl.UInt32))
            for k in range(len(parts))]


def _protocol_of(name: str) -> str | None:
    proto = protocol_of_frame(name)
    return proto.name if proto is not None else None


def _code(column: str, addresses: pl.DataType) -> pl.Expr:
    """An address column as its code in the capture's address Enum (text columns cast to it)."""
    return pl.col(column).cast(pl.String).cast(addresses).to_physical().cast(pl.Int64)


def _udp_flow_maps(parts, protocol: str) -> list[pl.DataFrame] | None:
    """Per partition: local UDP flow -> the whole run's, for ``protocol`` (from its messages frame)."""
    name = f"{protocol}_messages"
    if not all(name in p for p in parts):
        return None
    keyed = []
    for k, p in enumerate(parts):
        m = p[name]
        if "transport" not in m.columns or "from_client" not in m.columns:
            return None
        m = m.filter(pl.col("transport").cast(pl.String) == "udp")
        if m.height:
            addresses = p[_ADDRESSES].schema["src"]
            key = flow_key(_code("src", addresses), _code("dst", addresses)).alias("_key")
            keyed.append(m.select("flow", key).unique().with_columns(pl.lit(k, pl.UInt32).alias("_part")))
    if not keyed:
        return None
    keyed = pl.concat(keyed)
    keyed = keyed.with_columns((pl.col("_key").rank("dense") - 1).cast(pl.UInt32).alias("_global"))
    return [keyed.filter(pl.col("_part") == k).select("flow", "_global") for k in range(len(parts))]


def _remap(frame: pl.DataFrame, column: str, mapping: pl.DataFrame, where: pl.Expr | None = None) -> pl.DataFrame:
    """``column`` through ``mapping`` (columns: local id under the name ``mapping.columns[0]``, _global;
    an id it does not list becomes null), only where ``where`` holds when given. Only the column is
    worked on: a join of the frame would copy every column of a wide frame (``tcp_segments``) twice."""
    dtype = frame.schema[column]
    local = mapping.get_column(mapping.columns[0]).cast(dtype)
    new = pl.col(column).replace_strict(local, mapping.get_column("_global").cast(dtype), default=None,
                                        return_dtype=dtype)
    new = pl.when(where).then(new).otherwise(pl.col(column)) if where is not None else new
    return frame.with_columns(new.alias(column))


def _renumber(name: str, frame: pl.DataFrame, conn_map, udp_map, ordinal_base: dict[str, int]) -> pl.DataFrame:
    cols = frame.columns
    if "conn" in cols:
        frame = _remap(frame, "conn", conn_map)
    if "flow" in cols:
        tcp = (pl.col("transport").cast(pl.String) == "tcp") if "transport" in cols else pl.lit(True)
        frame = _remap(frame, "flow", conn_map, tcp)
        if udp_map is not None and "transport" in cols:
            frame = _remap(frame, "flow", udp_map, pl.col("transport").cast(pl.String) == "udp")
    for c in _TCP_FLOW_COLUMNS:
        if c in cols:
            frame = _remap(frame, c, conn_map)
    for c in ORDINALS.get(name, ()):
        frame = frame.with_columns((pl.col(c).cast(pl.Int64) + ordinal_base.get(c, 0)).cast(frame.schema[c]))
    return frame


def _qp_pairs(frame: pl.DataFrame) -> pl.DataFrame:
    """``qp_pair`` as ``rocev2._pairs_and_directions`` numbers it, over the merged rows."""
    if isinstance(frame.schema["src"], pl.Enum) and frame.schema["src"] == frame.schema["dst"]:
        s, d = pl.col("src").to_physical(), pl.col("dst").to_physical()
    else:
        enum = pl.Enum(pl.concat([frame["src"].cast(pl.String), frame["dst"].cast(pl.String)]).drop_nulls().unique().sort())
        s, d = (pl.col(c).cast(pl.String).cast(enum).to_physical() for c in ("src", "dst"))
    key = pl.struct(pl.min_horizontal(s, d).alias("lo"), pl.max_horizontal(s, d).alias("hi"), pl.col("sport"))
    return frame.with_columns((key.rank("dense") - 1).cast(frame.schema["qp_pair"]).alias("qp_pair"))


def _unify_enums(frames: list[pl.DataFrame]) -> list[pl.DataFrame]:
    """Enum columns whose categories differ between partitions (those built from the values present)
    get the sorted union of them, as the whole run's sorted set of values."""
    out = frames
    for c, dtype in frames[0].schema.items():
        if not isinstance(dtype, pl.Enum) or all(f.schema[c] == dtype for f in frames):
            continue
        values = sorted({v for f in frames for v in f.schema[c].categories.to_list()})
        out = [f.with_columns(pl.col(c).cast(pl.String).cast(pl.Enum(values))) for f in out]
    return out


def _ordinal_bases(parts, name: str, frames: list[pl.DataFrame]) -> list[dict[str, int]]:
    """Per partition: what its ordinals are offset by. ``message`` counts the protocol's messages
    frame (the transactions frame points into it), ``login`` its own frame (``frames``: frame ``name``
    of each part, already read: parts read from spilled files read a frame each time it is asked for)."""
    messages = f"{_protocol_of(name)}_messages"
    bases, running = [], {}
    for p, frame in zip(parts, frames):
        bases.append(dict(running))
        for c in ORDINALS.get(name, ()):
            source = p[messages] if c == "message" and messages != name and messages in p else frame
            if source.height:
                running[c] = running.get(c, 0) + int(source[c].cast(pl.Int64).max()) + 1
    return bases


def merge_frames(parts: list[dict[str, pl.DataFrame]], conn_maps: list[pl.DataFrame] | None = None,
                 only=None, then=None) -> dict[str, pl.DataFrame]:
    """The whole run's frames from the partitions' (:func:`decode_partition`; module doc). ``conn_maps``:
    the partitions' conn maps over every partition (:func:`connection_maps`), where ``parts`` are
    client buckets of them (:func:`client_buckets`); by default they are worked out from ``parts``.
    ``only``: those frames alone (the others are not read; by default every one). ``then(name, frame)``:
    what is kept of each frame, called once it is merged (``distributed.decode_frames`` maps it out of memory)."""
    conn_maps = connection_maps(parts) if conn_maps is None else conn_maps
    udp_maps: dict[str, list | None] = {}
    merged = {}
    for name in (n for n in parts[0] if n not in (_CONN_MAP, _ADDRESSES) and (only is None or n in only)):
        protocol = _protocol_of(name)
        if protocol is not None and protocol not in udp_maps:
            udp_maps[protocol] = _udp_flow_maps(parts, protocol)
        udp = udp_maps.get(protocol) or [None] * len(parts)
        frames = [p[name] for p in parts]  # each part's read once
        bases = _ordinal_bases(parts, name, frames)
        frames = [_renumber(name, f, conn_maps[k], udp[k], bases[k]) for k, f in enumerate(frames)]
        nonempty = [f for f in frames if f.height] or frames[:1]
        held = [pl.concat(_unify_enums(nonempty), how="vertical_relaxed") if len(nonempty) > 1 else nonempty[0]]
        del frames, nonempty  # the merged frame alone holds the parts' columns: gathered, each is let go of
        if "qp_pair" in held[0].columns:
            held = [_qp_pairs(held.pop())]
        merged[name] = _in_merge_order(held, name) if then is None else then(name, _in_merge_order(held, name))
    return merged


def _in_merge_order(held: list[pl.DataFrame], name: str) -> pl.DataFrame:
    """The frame ``held[0]`` (given up by the caller) in its builder's order (:data:`MERGE_ORDER`, stable),
    by ``wide_frames.sorted_held`` (a sort of the wide frame held its columns about twice)."""
    order = tuple(c for c in MERGE_ORDER.get(name, ()) if c in held[0].columns)
    return sorted_held(held, order) if order else held.pop()


# -- client buckets ----------------------------------------------------------------------------------
def client_buckets(frames: dict[str, pl.DataFrame], count: int) -> list[dict[str, pl.DataFrame]]:
    """One server partition's connection frames (:data:`CONNECTION_FRAMES`, ``connections`` among them,
    with :func:`decode_partition`'s conn map) split into ``count`` buckets: bucket ``j`` holds the
    connections whose client address (its text, Polars ``hash(seed=0)``, the same on every worker)
    hashes to ``j`` and the rows of the other frames that are theirs, in their order (module doc)."""
    other = sorted(n for n in frames if n not in CONNECTION_FRAMES and n not in (_CONN_MAP, _ADDRESSES))
    if other or "connections" not in frames:
        raise ValueError(f"client buckets hold connections and the frames keyed by them, not {', '.join(other)}")
    bucket = (pl.col("client").cast(pl.String).hash(seed=0) % count).cast(pl.UInt32).alias("_bucket")
    keyed = frames["connections"].select("conn", bucket)
    out = []
    for j in range(count):
        ids = keyed.filter(pl.col("_bucket") == j)["conn"].cast(pl.Int64).implode()
        out.append({name: f if name == _ADDRESSES else f.filter(pl.col("conn").cast(pl.Int64).is_in(ids))
                    for name, f in frames.items()})
    return out


class FrameSet:
    """A capture's frames without its bytes or builders: what detectors read when they run on merged
    frames away from the capture (a cluster's client buckets). :meth:`frame` serves the frames it
    holds (KeyError for any other); ``path``, ``files``, ``pieces`` and ``warnings`` are the capture's."""

    def __init__(self, frames: dict[str, pl.DataFrame], *, path: str, files, pieces, warnings=()):
        self._frames = dict(frames)
        self.path, self.files, self.pieces, self.warnings = path, list(files), list(pieces), list(warnings)

    def frame(self, name: str) -> pl.DataFrame:
        if name not in self._frames:
            raise KeyError(f"no frame named {name!r} in this set; it holds {', '.join(sorted(self._frames))}")
        return self._frames[name]

    @property
    def packets(self) -> pl.DataFrame:
        return self.frame("packets")

    def set_frame(self, name: str, frame: pl.DataFrame) -> None:
        self._frames[name] = frame

    def drop(self, names) -> None:
        """Let go of frames ``names`` (``Capture.drop``: a detector run that reads them no more)."""
        for name in names:
            self._frames.pop(name, None)
