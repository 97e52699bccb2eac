"""A capinfos-like summary of one capture, as a plain dict with stable keys.

Keys of :func:`summarize` (the ``herdscope info --format json`` object, one per file):

``file``, ``format``, ``compressed`` (gzip), ``file_size`` (bytes on disk), ``packets`` (rows, incl.
pcapng custom/journal records Wireshark numbers), ``bytes`` (sum of captured lengths), ``wire_bytes``
(sum of original lengths), ``first_ts`` / ``last_ts`` (earliest / latest packet time, integer ns since the
Unix epoch, null without packets), ``first_time`` / ``last_time`` (the same as ISO 8601 UTC text),
``duration_s``, ``ts_resolution_ns`` (finest declared interface resolution: the file header's),
``effective_resolution_ns`` (the tick the timestamps really have, inferred from them: the coarsest
among the interfaces carrying packets, what durations are limited by; see analyzer/resolution.py),
``effective_resolution_samples`` (the fewest nonzero timestamp differences an interface carrying
packets has: below ``resolution.MIN_DIFFERENCES`` the tick could not be inferred and the declared one
stands), ``link_types`` (list of ``{linktype, name, packets}``), ``interfaces`` (list of ``{iface, name,
linktype, snaplen, ts_resolution_ns, effective_resolution_ns, effective_resolution_samples}``),
``protocols`` (``{transport: {service: packets}}`` guessed by well-known ports),
``parse_status`` (``{status: packets}``), ``skipped`` (``{total, reasons: {reason: n}}``: records that got
no row, incl. a cut-short last record), ``damage`` (null, or ``{reason, offset, bytes_not_read}`` when
reading stopped before the end or the gzip stream was cut short; offset may then be null), ``events`` (``{name: n}``: timestamps going backwards, skipped
non-packet blocks, sections ...), ``tcp`` (``{connections, states: {conn_state: n}, segments,
retransmissions, fast_retransmissions, spurious_retransmissions, zero_windows, duplicate_acks,
lost_segments, handshake_rtt_ns: {n, median, p99}}``; the RTTs as measured, so a median of 0 on a
10 ms tick means "below the tick": ``herdscope info`` prints it so), ``decode_damage``
(``{frame: {status: rows}}``: damaged messages a decoder kept as rows, see :func:`damaged_rows`).
"""
from __future__ import annotations

import datetime as dt

import polars as pl

from .capture import Capture
from .decoders import registry
from .tcp import analysis as an
from .kernels import records as rk
from . import mac_control  # noqa: F401 - registers pause_frames (schema and builder)
from .kernels.headers import ETH_MAC_CONTROL
from .kernels.silences import SPAN_ONLY_NS
from .partitions import CallerChunks, caller_packet_columns
from .schema import FRAMES
from .resolution import capture_tick

# Well-known ports → service names, as tshark's port tables name them, for the ports no decoder
# declares (the decoders' own come from their declarations: services()).
OTHER_SERVICES = {
    20: "ftp-data", 21: "ftp", 22: "ssh", 23: "telnet", 25: "smtp", 67: "dhcp", 68: "dhcp",
    69: "tftp", 80: "http", 110: "pop3", 123: "ntp", 135: "dcerpc",
    137: "nbns", 138: "nbdgm", 143: "imap", 161: "snmp", 162: "snmptrap",
    443: "https", 514: "syslog",
    853: "dns-over-tls", 993: "imaps", 995: "pop3s", 1812: "radius", 1813: "radius-acct",
    3306: "mysql", 3389: "rdp", 5060: "sip", 5353: "mdns",
    5355: "llmnr", 5432: "postgresql", 6379: "redis", 8080: "http-alt", 8443: "https-alt",
}


def services() -> dict[int, str]:
    """port → service name: what the registered decoders declare (``Protocol.services``) over
    :data:`OTHER_SERVICES`, by port."""
    return dict(sorted({**OTHER_SERVICES, **registry.service_names()}.items()))
TRANSPORTS = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6", 47: "gre", 50: "esp", 132: "sctp"}


def iso_time(ns: int | None) -> str | None:
    if ns is None:
        return None
    secs, frac = divmod(int(ns), 1_000_000_000)
    return dt.datetime.fromtimestamp(secs, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def _lower_known_port() -> pl.Expr:
    """The lower of a packet's two ports that :func:`services` names (null when neither is)."""
    known = pl.Series(list(services()), dtype=pl.UInt16)
    return (pl.when(pl.col("sport").is_in(known.implode()) & pl.col("dport").is_in(known.implode()))
            .then(pl.min_horizontal("sport", "dport"))
            .when(pl.col("sport").is_in(known.implode())).then(pl.col("sport"))
            .when(pl.col("dport").is_in(known.implode())).then(pl.col("dport")))


# what packet_tally adds up per group, and how two tallies' groups are added up again (merged_tally)
_TALLY_SUMS = ("packets", "bytes", "wire_bytes")


def packet_tally(packets: pl.DataFrame) -> pl.DataFrame:
    """What :func:`summarize` reads of the packets, added up per (``iface``, ``ip_proto``, ``port``: the
    lower well-known port, :func:`services`): ``packets``, ``bytes``, ``wire_bytes``, ``first_ts``,
    ``last_ts``, and per frame with a damage status (:func:`damage_frames`) whether any of them carries
    its traffic. A few hundred rows whatever the size of the capture: what the caller of ``info`` in
    partitions keeps of each chunk of packets as they are read (``analyzer.partitions.CallerChunks``),
    instead of their columns (:func:`merged_tally` adds the chunks' up)."""
    carried = {name: expr for name, expr in _carried().items() if _damage_status(name)}
    return (packets.lazy()
            .group_by("iface", "ip_proto", _lower_known_port().alias("port"))
            .agg(pl.len().cast(pl.Int64).alias("packets"), pl.col("caplen").cast(pl.Int64).sum().alias("bytes"),
                 pl.col("wirelen").cast(pl.Int64).sum().alias("wire_bytes"), pl.col("ts_ns").min().alias("first_ts"),
                 pl.col("ts_ns").max().alias("last_ts"), *(expr.any().alias(name) for name, expr in carried.items()))
            .collect())


def merged_tally(tallies: pl.DataFrame) -> pl.DataFrame:
    """Tallies (:func:`packet_tally`, of chunks of one capture, concatenated) as one."""
    flags = [c for c in tallies.columns if c not in ("iface", "ip_proto", "port", "first_ts", "last_ts", *_TALLY_SUMS)]
    return (tallies.group_by("iface", "ip_proto", "port", maintain_order=True)
            .agg(*(pl.col(c).sum() for c in _TALLY_SUMS), pl.col("first_ts").min(), pl.col("last_ts").max(),
                 *(pl.col(c).any() for c in flags)))


def protocols(packets: pl.DataFrame, tally: pl.DataFrame | None = None) -> dict[str, dict[str, int]]:
    """Packets per transport and (for TCP/UDP) per service guessed from the lower well-known port
    (of ``packets``: ``ip_proto``, ``sport``, ``dport``; or of their ``tally``, :func:`packet_tally`)."""
    if tally is None:
        tally = (packets.lazy().group_by("ip_proto", _lower_known_port().alias("port"))
                 .agg(pl.len().cast(pl.Int64).alias("packets")).collect())
    known = services()
    ports = pl.DataFrame({"port": list(known), "service": list(known.values())},
                         schema={"port": pl.UInt16, "service": pl.String})
    # counted per (protocol, port) first, the names given to those few rows: naming every packet held
    # two text columns of every one (~0.8 GB at 10M packets, the peak of info in partitions)
    by_port = tally.filter(pl.col("ip_proto").is_not_null()).group_by("ip_proto", "port").agg(
        pl.col("packets").sum().alias("len"))
    counted = (
        by_port.join(ports, on="port", how="left")
        .with_columns(
            pl.col("ip_proto").replace_strict(TRANSPORTS, default=None, return_dtype=pl.String)
            .fill_null(pl.format("ip-proto-{}", pl.col("ip_proto"))).alias("transport"),
            pl.col("service").fill_null("other"),
        )
        .group_by("transport", "service").agg(pl.col("len").cast(pl.Int64).sum())
        .sort("transport", "len", "service", descending=[False, True, False])  # equal counts by name
    )
    out: dict[str, dict[str, int]] = {}
    for transport, service, n in counted.iter_rows():
        if transport not in ("tcp", "udp"):
            service = "all"
        out.setdefault(transport, {})
        out[transport][service] = out[transport].get(service, 0) + n
    non_ip = int(tally["packets"].sum()) - int(by_port["len"].sum())
    if non_ip:
        out["non-ip"] = {"all": non_ip}
    return out


# segments with each analysis flag, as tcp_totals reports them
_SEGMENT_FLAGS = {
    "retransmissions": an.ANY_RETRANSMISSION,
    "fast_retransmissions": an.FAST_RETRANSMISSION,
    "spurious_retransmissions": an.SPURIOUS_RETRANSMISSION | an.SACKED_RETRANSMISSION,
    "zero_windows": an.ZERO_WINDOW,
    "duplicate_acks": an.DUPLICATE_ACK,
    "lost_segments": an.LOST_SEGMENT,
}
# what summarize reads of the packets frame (packet_tally: what a summary of a capture decoded in
# partitions keeps of them, tallied as they are read or before the partitions decode)
SUMMARY_PACKET_COLUMNS = ("ts_ns", "iface", "caplen", "wirelen", "ip_proto", "sport", "dport", "ethertype")
# what a summary of a capture decoded in partitions reads of its packets at all: the columns above and
# those the partitioning and the joining of a ring buffer's pieces read (summarize_in_partitions)
PARTITIONED_PACKET_COLUMNS = caller_packet_columns(*SUMMARY_PACKET_COLUMNS)
# what a partition's task reads of its packets once what reads the others is built (analyzer.packet_readers):
# what damaged_rows reads (the ports and EtherType its frames' traffic is told by); of TCP analysis's
# segments, what segment_counts reads (beyond what the task and its merge keep: analyzer.partitions), which
# is all TCP analysis builds of them for a summary at once too (summarize_in_partitions)
TASK_PACKET_COLUMNS = ("sport", "dport", "ethertype")
TASK_FRAME_COLUMNS = {"tcp_segments": ("analysis",)}


def counted_parts(cap: Capture, whole_times=None) -> dict[str, pl.DataFrame]:
    """What :func:`summarize` adds up over a capture's partitions (or reads of a capture decoded at
    once): ``segment_counts`` (:func:`segment_counts`) and ``damage_rows`` (:func:`damaged_rows`). The
    ``then`` of a partition (``analyzer.distributed.decode_frames``, which also hands it the whole
    capture's packet times, ``whole_times``: nothing here is a rate, so they are not read)."""
    return {"segment_counts": segment_counts(cap), "damage_rows": damaged_rows(cap)}


def segment_counts(cap: Capture) -> pl.DataFrame:
    """One row: the TCP segments of ``cap``, and those with each analysis flag tcp_totals counts."""
    seg = cap.frame("tcp_segments")
    analysis = seg.get_column("analysis")
    counts = {"segments": seg.height, **{name: int(((analysis & bits) != 0).sum()) if seg.height else 0
                                         for name, bits in _SEGMENT_FLAGS.items()}}
    return pl.DataFrame([counts], schema={k: pl.Int64 for k in counts})


def tcp_totals(cap: Capture, segments: pl.DataFrame | None = None) -> dict:
    """TCP connections by Zeek state, analysis flag counts (``segments``: rows of
    :func:`segment_counts`, summed; by default counted on ``cap``) and the handshake RTT distribution."""
    conns = cap.frame("connections")
    rows = segment_counts(cap) if segments is None else segments
    counts = {name: int(rows[name].sum()) for name in rows.columns}
    rtt = conns["handshake_rtt_ns"].drop_nulls() if conns.height else conns.get_column("conn")
    states = conns.group_by("conn_state").len().sort(["len", "conn_state"], descending=[True, False])
    return {
        "connections": conns.height,
        "states": dict(states.iter_rows()) if conns.height else {},
        "segments": counts["segments"],
        **{name: counts[name] for name in _SEGMENT_FLAGS},
        "handshake_rtt_ns": {
            "n": len(rtt),
            "median": int(rtt.median()) if len(rtt) else None,
            "p99": int(rtt.quantile(0.99, interpolation="higher")) if len(rtt) else None,
        },
    }


def _fewest_samples(ifaces: pl.DataFrame) -> int:
    """The weakest evidence for the effective tick: the fewest nonzero timestamp differences among the
    interfaces that carry packets (0 without packets)."""
    samples = ifaces["effective_resolution_samples"] if ifaces.height else None
    used = samples.filter(samples > 0) if samples is not None else None
    return int(used.min()) if used is not None and used.len() else 0


def _damage_status(frame: str) -> bool:
    """Whether ``frame``'s schema has a damage status: a ``status`` Enum whose first value is "ok" (not
    a response code such as DNS's rcode or SMB2's NT status)."""
    status = next((c for c in FRAMES.get(frame, ()) if c.name == "status"), None)
    return status is not None and isinstance(status.polars, pl.Enum) and status.polars.categories[0] == "ok"


# damaged_rows: the frame and status (text), the rows, and where each goes in decode_damage's order:
# the frame's place among the frames checked, the status's code in its Enum
_DAMAGE_SCHEMA = {"frame": pl.String, "status": pl.String, "rows": pl.Int64, "frame_order": pl.Int64,
                  "status_order": pl.Int64}


def _carried() -> dict[str, pl.Expr]:
    """frame -> which packets carry its traffic (EtherType 0x8808, a protocol's ports)."""
    carried = {"pause_frames": pl.col("ethertype") == ETH_MAC_CONTROL}
    for proto in registry.protocols():
        if proto.ports:
            on_ports = pl.col("sport").is_in(list(proto.ports)) | pl.col("dport").is_in(list(proto.ports))
            carried.update({f: on_ports for f in proto.frames})
    return carried


def damage_frames(tally: pl.DataFrame) -> tuple[str, ...]:
    """The frames :func:`damaged_rows` builds for the packets of this :func:`packet_tally`: those with a
    damage status whose traffic they carry."""
    carried = [name for name in _carried() if _damage_status(name)]
    return tuple(name for name in carried if tally.height and bool(tally[name].any()))


def damaged_rows(cap: Capture) -> pl.DataFrame:
    """(frame, status, rows, frame_order, status_order): the damaged messages the decoders kept as rows
    with a ``status`` other than "ok" (rocev2_packets: truncated, bad_length; pause_frames: truncated)
    instead of dropping them; the orders put the frames and each one's statuses in
    :func:`decode_damage`'s order.
    Only frames whose schema has such a status are built, and only when the capture carries their
    traffic (a protocol's ports, EtherType 0x8808): a DNS capture decodes nothing more here."""
    p = cap.packets
    carried = _carried()
    rows = [pl.DataFrame(schema=_DAMAGE_SCHEMA)]
    for k, (name, carries) in enumerate(carried.items()):
        if not _damage_status(name) or p.height == 0 or p.filter(carries).height == 0:
            continue
        bad = cap.frame(name).filter(pl.col("status").cast(pl.String) != "ok").group_by("status").len()
        rows.append(bad.select(pl.lit(name).alias("frame"), pl.col("status").cast(pl.String),
                               pl.col("len").alias("rows"),
                               pl.lit(k).alias("frame_order"), pl.col("status").to_physical().alias("status_order"))
                    .cast(_DAMAGE_SCHEMA))
    return pl.concat(rows)


def decode_damage(damage_rows: pl.DataFrame) -> dict[str, dict[str, int]]:
    """``{frame: {status: rows}}`` of :func:`damaged_rows`' rows (of a capture, or of its partitions)."""
    summed = (damage_rows.group_by("frame", "status", "frame_order", "status_order").agg(pl.col("rows").sum())
              .sort("frame_order", "status_order").select("frame", "status", "rows"))
    out: dict[str, dict[str, int]] = {}
    for frame, status, n in summed.iter_rows():
        out.setdefault(frame, {})[status] = int(n)
    return out


def summarize(cap: Capture, counted: dict[str, pl.DataFrame] | None = None, tally: pl.DataFrame | None = None) -> dict:
    """The summary of ``cap`` (module doc). ``counted``: its partitions' :func:`counted_parts`,
    concatenated, when it was decoded in partitions (``analyzer.distributed.decode_into``, which set
    its ``connections``); by default they are counted on ``cap`` itself. ``tally``: its packets'
    :func:`packet_tally` (of chunks, concatenated), by default taken of ``cap.packets``."""
    counted = counted_parts(cap) if counted is None else counted
    tally = merged_tally(packet_tally(cap.packets) if tally is None else tally)
    report = cap.report
    ifaces = cap.frame("interfaces")
    count = int(tally["packets"].sum())
    first = int(tally["first_ts"].min()) if count else None
    last = int(tally["last_ts"].max()) if count else None
    per_iface = tally.group_by("iface").agg(pl.col("packets").sum().alias("len"))
    link_counts = (
        ifaces.join(per_iface, on="iface", how="left")
        .group_by("linktype", "linktype_name").agg(pl.col("len").fill_null(0).sum().alias("packets"))
        .sort("packets", "linktype", descending=[True, False])  # equal counts in link-type order
    )
    skipped_reasons = {rk.COUNT_NAMES[k]: report.counts.get(rk.COUNT_NAMES[k], 0)
                       for k in rk.SKIPPED_PACKET_COUNTS}
    if report.stop_offset is not None:
        skipped_reasons["cut_short_last_record" if "cut short" in report.stop else "unframeable_rest"] = 1
    skipped_reasons = {k: v for k, v in skipped_reasons.items() if v}
    events = {k: v for k, v in report.counts.items() if k not in skipped_reasons}
    return {
        "file": cap.path,
        "format": report.format,
        "compressed": report.gzip,
        "file_size": cap._data.file_size,
        "packets": count,
        "bytes": int(tally["bytes"].sum()),
        "wire_bytes": int(tally["wire_bytes"].sum()),
        "first_ts": first,
        "last_ts": last,
        "first_time": iso_time(first),
        "last_time": iso_time(last),
        "duration_s": (last - first) / 1e9 if count else 0.0,
        "ts_resolution_ns": float(ifaces["ts_resolution_ns"].min()) if ifaces.height else None,
        "effective_resolution_ns": capture_tick(ifaces),
        "effective_resolution_samples": _fewest_samples(ifaces),
        "link_types": [{"linktype": int(a), "name": b, "packets": int(c)} for a, b, c in link_counts.iter_rows()],
        "interfaces": [
            {"iface": int(r["iface"]), "name": r["name"], "linktype": int(r["linktype"]),
             "snaplen": int(r["snaplen"]), "ts_resolution_ns": float(r["ts_resolution_ns"]),
             "effective_resolution_ns": float(r["effective_resolution_ns"]),
             "effective_resolution_samples": int(r["effective_resolution_samples"])}
            for r in ifaces.iter_rows(named=True)
        ],
        "protocols": protocols(cap.packets, tally),
        "parse_status": report.parse_status,
        "skipped": {"total": sum(skipped_reasons.values()), "reasons": skipped_reasons},
        "damage": None if report.stop_offset is None and not report.gzip_truncated else {
            "reason": report.damage,
            "offset": report.stop_offset, "bytes_not_read": report.bytes_not_read},
        "events": events,
        "tcp": tcp_totals(cap, counted["segment_counts"]),
        "decode_damage": decode_damage(counted["damage_rows"]),
    }


def summarize_in_partitions(cap: Capture, partitions: int) -> dict:
    """:func:`summarize` of ``cap`` decoded in ``partitions`` server partitions one after the other
    (``herdscope info --partitions``, or a capture large enough: ``analyzer.record_estimate``), ``cap``
    opened reading :data:`PARTITIONED_PACKET_COLUMNS` of its packets: memory holds one partition's
    TCP analysis and decoding at a time, and the summary is the same (tests/test_partitioned_commands.py).
    At once (one partition), TCP analysis builds of ``tcp_segments`` only what the summary reads of it
    (:data:`TASK_FRAME_COLUMNS`, ``Capture.plan_columns``), so ``cap`` is for this summary alone (the
    CLI's ``info``; the dashboard calls :func:`summarize`): on the 1M synth capture the outputs it
    would otherwise hold were the peak of ``info`` (~365 MB of anonymous memory, now ~300 MB)."""
    if partitions <= 1:
        cap.plan_columns(TASK_FRAME_COLUMNS)
        return summarize(cap)
    from .distributed import decode_into  # lazy: the partitions' tasks, only for a partitioned summary

    # read chunk by chunk (chunked_reading), or whole: then tallied before the partitions narrow the packets
    tally = cap.reduction.take_extracted() if isinstance(cap.reduction, CallerChunks) else packet_tally(cap.packets)
    # counts add up over shards of a server's clients too: a big server is cut into them (analyzer.partitions)
    counted = decode_into(None, cap, ["connections"], then=counted_parts, shard_then=counted_parts,
                          packet_columns=("frame",),
                          partitions=partitions, task_frames=damage_frames(merged_tally(tally)),
                          task_packet_columns=TASK_PACKET_COLUMNS, frame_columns=TASK_FRAME_COLUMNS,
                          whole_times=False)  # counted_parts reads none of the whole capture's packet times
    return summarize(cap, counted, tally)


def chunked_reading() -> CallerChunks:
    """What the caller of :func:`summarize_in_partitions` keeps of a file's packets as they are read
    (``analyzer.command.each_capture(chunked=...)``): their tally, each packet's partition, the span."""
    return CallerChunks(SPAN_ONLY_NS, packet_tally, record_index=True)
