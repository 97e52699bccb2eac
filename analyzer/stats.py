"""``herdscope stats``: service response times per protocol and operation, like ``tshark -z smb2,srt``
but for DNS, Kerberos, LDAP and SMB2 together, and with what tshark's SRT leaves out: SMB2
STATUS_PENDING waits (interim → final response) and oplock/lease break acknowledgments.

One row per (protocol, operation, leg), and per server or per client with ``by``: ``count``
requests, ``answered``, ``unanswered``, ``errors`` (the protocol's own notion, ``is_error``: see
:func:`outcome_rules`), and the latency of answered ones in ns: ``min``, ``p50``, ``p90``, ``p99``,
``max`` (integers: quantiles use the "higher" rule, an observed value, never an interpolation) and
``mean``. SMB2 CANCEL (never answered) and unanswered CHANGE_NOTIFY (pending by design) are left out.
Extra operations: ``smb2 / STATUS_PENDING wait`` (the wait between the interim and the final response
of requests that went pending; CHANGE_NOTIFY waits, pending by design, have a row of their own) and
``smb2 / oplock break ack`` / ``lease break ack`` (notification → acknowledgment; an unacknowledged
break counts as unanswered).

**Legs.** A caching or forwarding DNS resolver's upstream queries are not its clients' latency, so
DNS rows are split by ``leg``. A *resolver* is an address that answered at least one standard query
(opcode QUERY) on port 53 and itself sent a standard query to another address's port 53 within the
capture. A DNS transaction sent by a resolver is ``resolver_to_upstream``; one sent to a resolver
``client_to_resolver``; any other ``direct`` (no forwarding seen: an authoritative server, or a
resolver whose upstream traffic is not in the capture). Zone maintenance between authoritative
servers (NOTIFY, UPDATE and the other opcodes; SOA, AXFR and IXFR queries, :data:`ZONE_QTYPES`) does
not make an address a resolver, but is labelled by the same rule. ``leg`` is null for Kerberos, LDAP
and SMB2.

Output columns (:data:`STAT_COLUMNS`, the stable keys of ``--format json`` and the header of
``--format csv``): ``protocol, operation, leg, server, client`` then the values; ``server`` / ``client``
are null unless the rows are broken down by them.
"""
from __future__ import annotations

import polars as pl

from .decoders import dns, registry
from .decoders.common import COMMON_NAMES
from .durations import fmt_ns
from .kernels.silences import SPAN_ONLY_NS
from .narrowing import build_and_release
from .partitions import CallerChunks, caller_packet_columns
from .selection import SELECTION_COLUMNS
LEGS = ("client_to_resolver", "resolver_to_upstream", "direct")
BY_CHOICES = ("server", "client")
KEY_COLUMNS = ("protocol", "operation", "leg", "server", "client")
LATENCY_COLUMNS = ("min", "p50", "p90", "p99", "max")
VALUE_COLUMNS = ("count", "answered", "unanswered", "errors") + LATENCY_COLUMNS + ("mean",)
STAT_COLUMNS = KEY_COLUMNS + VALUE_COLUMNS
DNS_PORT = 53  # RFC 1035 §4.2
# queries a secondary authoritative server sends its primary (RFC 1034 §4.3.5 refresh, RFC 5936, RFC 1995):
# no evidence of a resolver
ZONE_QTYPES = ("SOA", "AXFR", "IXFR")
# what stats of a capture decoded in partitions reads of its packets: the selection's, the partitioning's
# and the joining of pieces' columns (decode_in_partitions)
PARTITIONED_PACKET_COLUMNS = caller_packet_columns(*SELECTION_COLUMNS)
# what a partition's task reads of its packets once what reads the others is built (the packet readers,
# analyzer.packet_readers; the decoders read none of them), and of TCP analysis's segments: nothing
# beyond what the task and its merge keep (analyzer.partitions.TASK_KEPT_PACKET_COLUMNS, MERGE_KEY_COLUMNS)
TASK_PACKET_COLUMNS: tuple[str, ...] = ()
TASK_FRAME_COLUMNS: dict[str, tuple[str, ...]] = {"tcp_segments": ()}
# what stats decoded at once reads of its packets once what reads the others is built: their count alone
# (decode_at_once)
AT_ONCE_PACKET_COLUMNS = ("frame",)
SMB2_TRANSACTIONS, SMB2_BREAKS = "smb2_transactions", "smb2_breaks"  # what _smb2_extra_rows reads
# what the response times read of a protocol's transactions (service_response_times, resolvers)
RESPONSE_TIME_COLUMNS = ("protocol", "client", "server", "server_port", "operation", "latency_ns", "is_error",
                         "answered")
# what stats reads of the frames it decodes in partitions: the response times', expected_requests' and
# _smb2_extra_rows' (of a transactions frame and of smb2_breaks); the caller merges no more of them
PARTITIONED_FRAME_COLUMNS = (*RESPONSE_TIME_COLUMNS, "expects_response", "pending_by_design", "pending_ns",
                             "interim_frame", "ack_latency_ns", "ack_ns", "break_kind", "kind", "ack_required")
_SCHEMA = {c: pl.String for c in KEY_COLUMNS} | {c: pl.UInt32 for c in ("count", "answered", "unanswered", "errors")} \
    | {c: pl.Int64 for c in LATENCY_COLUMNS} | {"mean": pl.Float64}


def protocol_names() -> dict[str, str]:
    """name -> title ("dns" -> "DNS") of every registered protocol with transactions, in registration
    order: the protocols of these statistics and their order (analyzer.decoders.registry, read when
    called, so a protocol registered later is included)."""
    return registry.titles(with_transactions=True)


def latency_stats(frame: pl.DataFrame, keys: list[str], latency: str, answered: str, errors: pl.Expr) -> pl.DataFrame:
    lat = pl.col(latency).filter(pl.col(answered))
    return frame.group_by(keys).agg(
        pl.len().cast(pl.UInt32).alias("count"),
        pl.col(answered).sum().cast(pl.UInt32).alias("answered"),
        (~pl.col(answered)).sum().cast(pl.UInt32).alias("unanswered"),
        errors.sum().cast(pl.UInt32).alias("errors"),
        lat.min().cast(pl.Int64).alias("min"),
        lat.quantile(0.5, "higher").cast(pl.Int64).alias("p50"),
        lat.quantile(0.9, "higher").cast(pl.Int64).alias("p90"),
        lat.quantile(0.99, "higher").cast(pl.Int64).alias("p99"),
        lat.max().cast(pl.Int64).alias("max"),
        lat.mean().alias("mean"),
    )


def expected_requests(frame: pl.DataFrame) -> pl.DataFrame:
    """Requests that expect an answer: SMB2 CANCEL never gets one (MS-SMB2 3.3.5.16) and CHANGE_NOTIFY
    waits by design; they would only inflate "unanswered"."""
    if "expects_response" in frame.columns:
        frame = frame.filter(pl.col("expects_response"))
    if "pending_by_design" in frame.columns:
        frame = frame.filter(~pl.col("pending_by_design").fill_null(False) | pl.col("answered"))
    return frame


def _text_columns(frame: pl.DataFrame, names=("transport", "client", "server")) -> pl.DataFrame:
    """Enum/categorical address columns as text, so frames of different protocols stack."""
    return frame.with_columns(pl.col(c).cast(pl.String) for c in names if c in frame.columns)


def protocol_transactions(cap, columns: tuple[str, ...] = COMMON_NAMES) -> list[tuple[str, pl.DataFrame]]:
    """(protocol, its requests that expect an answer, ``columns`` of the common columns in their own
    dtypes) for every protocol with transactions in the capture."""
    frames = [(p.name, expected_requests(cap.frame(p.transactions)).select(columns))
              for p in _transaction_protocols(cap)]
    return [(p, f) for p, f in frames if f.height]


def _transaction_protocols(cap) -> list:
    """The registered protocols with a transactions frame ``cap`` can build."""
    names = set(cap.frame_names())
    return [p for p in registry.protocols() if p.transactions and p.transactions in names]


def transactions(cap) -> pl.DataFrame:
    """The common columns of every protocol's transaction frame, stacked (requests that expect an answer;
    addresses as text)."""
    frames = [_text_columns(f) for _, f in protocol_transactions(cap)]
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames, how="vertical_relaxed")


def _standard_query() -> pl.Expr:
    """DNS transactions of opcode QUERY: ``operation`` is then the qtype name (or QUERY without a
    question); other opcodes are named by the opcode (analyzer.decoders.dns)."""
    others = [name for code, name in dns.OPCODES.items() if code != 0]
    return ~pl.col("operation").is_in(others) & ~pl.col("operation").str.starts_with("OPCODE")


def resolvers(tx: pl.DataFrame) -> pl.Series:
    """Addresses seen both answering DNS queries on port 53 and sending queries to another address's
    port 53 (caching/forwarding resolvers), from DNS transactions (or :func:`transactions`)."""
    if tx.height == 0:
        return pl.Series("address", [], pl.String)
    # one row per client, server and operation first: the rules then run on a handful of rows
    pairs = _text_columns(
        tx.filter((pl.col("protocol") == "dns") & (pl.col("server_port") == DNS_PORT))
        .group_by("client", "server", "operation").agg(pl.col("answered").any())
    ).filter(_standard_query().fill_null(True))
    served = pairs.filter(pl.col("answered")).select(pl.col("server").alias("address")).unique()
    asks = pairs.filter((pl.col("client") != pl.col("server")) & ~pl.col("operation").is_in(ZONE_QTYPES)) \
        .select(pl.col("client").alias("address")).unique()
    return served.join(asks, on="address", how="semi").sort("address")["address"]


def _leg_code(found: list[str]) -> pl.Expr:
    """The leg of each transaction as its index in :data:`LEGS` (null outside DNS), given the resolvers
    ``found``: integers while 1M rows are labelled and grouped, names on the aggregated rows."""
    client_is, server_is = pl.col("client").is_in(found), pl.col("server").is_in(found)
    return (pl.when(pl.col("protocol") != "dns").then(pl.lit(None, pl.UInt8))
            .when(client_is & (pl.col("client") != pl.col("server"))).then(pl.lit(LEGS.index("resolver_to_upstream")))
            .when(server_is).then(pl.lit(LEGS.index("client_to_resolver")))
            .otherwise(pl.lit(LEGS.index("direct"))).cast(pl.UInt8))


def _leg_names(codes: pl.Expr) -> pl.Expr:
    return codes.replace_strict(list(range(len(LEGS))), list(LEGS), default=None, return_dtype=pl.String)


def with_legs(tx: pl.DataFrame) -> pl.DataFrame:
    """``tx`` (DNS transactions, or :func:`transactions`) with ``leg``: DNS rows labelled as the module
    doc says, others null."""
    if tx.height == 0:
        return tx.with_columns(pl.lit(None, pl.String).alias("leg"))
    return tx.with_columns(_leg_names(_leg_code(resolvers(tx).to_list())).alias("leg"))


def _smb2_extra_rows(cap, keys: list[str]) -> list[pl.DataFrame]:
    """STATUS_PENDING waits and break acknowledgments, as rows of their own (module doc)."""
    parts = []
    names = set(cap.frame_names())
    if SMB2_TRANSACTIONS in names:
        smb = cap.frame(SMB2_TRANSACTIONS)
        if "pending_ns" in smb.columns:
            pending = smb.filter(pl.col("pending_ns").is_not_null() | pl.col("interim_frame").is_not_null()) \
                if "interim_frame" in smb.columns else smb.filter(pl.col("pending_ns").is_not_null())
            if pending.height:
                by_design = pl.col("pending_by_design").fill_null(False) if "pending_by_design" in pending.columns \
                    else pl.lit(False)
                label = pl.when(by_design).then(pl.lit("CHANGE_NOTIFY wait (by design)")) \
                    .otherwise(pl.lit("STATUS_PENDING wait"))
                parts.append(latency_stats(
                    _text_columns(pending).with_columns(
                        pl.lit("smb2").alias("protocol"), label.alias("operation"),
                        pl.lit(None, pl.UInt8).alias("leg"), pl.col("pending_ns").is_not_null().alias("_done")),
                    keys, "pending_ns", "_done", pl.lit(False)))
    if SMB2_BREAKS in names:
        breaks = cap.frame(SMB2_BREAKS)
        lat = next((c for c in ("ack_latency_ns", "ack_ns") if c in breaks.columns), None)
        kind = next((c for c in ("break_kind", "kind") if c in breaks.columns), None)
        if "ack_required" in breaks.columns:  # level II oplock breaks are not acknowledged (3.3.4.6)
            breaks = breaks.filter(pl.col("ack_required"))
        if breaks.height and lat and all(k in breaks.columns for k in keys if k in BY_CHOICES):
            label = (pl.when(pl.col(kind).cast(pl.String).str.contains("lease")).then(pl.lit("lease break ack"))
                     .otherwise(pl.lit("oplock break ack"))) if kind else pl.lit("break ack")
            parts.append(latency_stats(
                _text_columns(breaks).with_columns(
                    pl.lit("smb2").alias("protocol"), label.alias("operation"),
                    pl.lit(None, pl.UInt8).alias("leg"), pl.col(lat).is_not_null().alias("_acked")),
                keys, lat, "_acked", pl.lit(False)))
    return parts


def response_time_frames(cap) -> list[str]:
    """The frames :func:`service_response_times` reads: every protocol's transactions, SMB2's breaks."""
    names = set(cap.frame_names())
    found = [p.transactions for p in _transaction_protocols(cap)]
    return list(dict.fromkeys(found + [n for n in (SMB2_TRANSACTIONS, SMB2_BREAKS) if n in names]))


def chunked_reading():
    """What the caller of :func:`decode_in_partitions` keeps of a file's packets as they are read
    (``analyzer.command.each_capture(chunked=...)``): each packet's partition, the span."""
    return CallerChunks(SPAN_ONLY_NS, record_index=True)


def decode_response_time_frames(cap, partitions: int) -> None:
    """Build the frames :func:`service_response_times` reads, and free the rest of ``cap`` (the CLI's
    ``stats``, which reads nothing else of it): in ``partitions`` server partitions when more than one
    (:func:`decode_in_partitions`), else at once (:func:`decode_at_once`)."""
    if partitions > 1:
        decode_in_partitions(cap, partitions)
    else:
        decode_at_once(cap)


def decode_at_once(cap) -> None:
    """Build the frames of :func:`response_time_frames` of a capture decoded at once, the way a scan
    builds its detectors' (issue 13), and free the rest: what reads ``packets`` first (TCP analysis, the
    decoders' payload segments and UDP messages: ``analyzer.packet_readers``), then ``packets`` narrowed
    to :data:`AT_ONCE_PACKET_COLUMNS` and ``tcp_segments`` to what stats reads of it
    (:data:`TASK_FRAME_COLUMNS`, as a partition's task does); the frames built several at once
    (``analyzer.threads``), each narrowed to :data:`PARTITIONED_FRAME_COLUMNS` as soon as nothing still
    to be built reads the rest (``analyzer.narrowing``); then the message frames and the builders' memos
    freed (``Capture.release``). Built one after the other and held whole, they took the 1M synth
    capture's ``stats`` to a peak of ~470 MB of anonymous memory (``scan``: ~385 MB); built so, ~305 MB
    (README, "Speed and memory")."""
    names = response_time_frames(cap)
    build_and_release(cap, names, AT_ONCE_PACKET_COLUMNS,
                      {**TASK_FRAME_COLUMNS, **dict.fromkeys(names, PARTITIONED_FRAME_COLUMNS)}, others=True)


def decode_in_partitions(cap, partitions: int) -> None:
    """Build the frames of :func:`response_time_frames` in ``partitions`` server partitions one after the
    other (``herdscope stats --partitions``, or a capture large enough: ``analyzer.record_estimate``),
    ``cap`` opened reading :data:`PARTITIONED_PACKET_COLUMNS` of its packets and its selection applied:
    memory holds one partition's decoding at a time (a big server cut into shards of its clients,
    ``analyzer.partitions``) and one merged frame, of which :data:`PARTITIONED_FRAME_COLUMNS` alone are
    merged and which is mapped out of memory once merged (``analyzer.distributed.decode_frames``: on the
    100M synth capture every column of every transaction frame, merged and held, was 7.2 GB); the
    response times are the same (tests/test_partitioned_commands.py). ``partitions``: more than one
    (:func:`decode_response_time_frames` decides: one is :func:`decode_at_once`)."""
    from .distributed import decode_into  # lazy: the partitions' tasks, only for partitioned stats

    names = response_time_frames(cap)
    decode_into(None, cap, names, packet_columns=("frame",), partitions=partitions,
                task_packet_columns=TASK_PACKET_COLUMNS, frame_columns=TASK_FRAME_COLUMNS, shards=True,
                caller_columns=dict.fromkeys(names, PARTITIONED_FRAME_COLUMNS))


def service_response_times(cap, by: str | None = None) -> pl.DataFrame:
    """One row per (protocol, operation, leg), and per ``by`` (``"server"`` or ``"client"``, the
    address) when given: the columns ``protocol, operation, leg, [by]`` then :data:`VALUE_COLUMNS`."""
    if by is not None and by not in BY_CHOICES:
        raise ValueError(f"by: expected one of {', '.join(BY_CHOICES)}, not {by!r}")
    keys = ["protocol", "operation", "leg"] + ([by] if by else [])
    parts = []
    for protocol, tx in protocol_transactions(cap, RESPONSE_TIME_COLUMNS):  # aggregated apart: own address dtypes
        found = resolvers(tx).to_list() if protocol == "dns" else []
        parts.append(latency_stats(tx.with_columns(_leg_code(found).alias("leg")), keys, "latency_ns", "answered",
                                   pl.col("is_error").fill_null(False)))
    parts += _smb2_extra_rows(cap, keys)
    columns = keys + list(VALUE_COLUMNS)
    if not parts:
        return pl.DataFrame(schema={c: _SCHEMA[c] for c in columns})
    out = pl.concat([p.with_columns(_leg_names(pl.col("leg"))).select(columns).cast({c: _SCHEMA[c] for c in columns})
                     for p in parts], how="vertical_relaxed")
    order = {p: k for k, p in enumerate(protocol_names())}
    legs = {leg: k for k, leg in enumerate(LEGS)}
    out = out.with_columns(pl.col("protocol").replace_strict(order, default=len(order)).alias("_o"),
                           pl.col("leg").replace_strict(legs, default=len(legs)).alias("_l"))
    sort = ["_o", "_l"] + ([by] if by else []) + ["count", "operation"]
    return out.sort(sort, descending=[c == "count" for c in sort], nulls_last=True).drop("_o", "_l")


def records(stats: pl.DataFrame) -> pl.DataFrame:
    """``stats`` with every :data:`STAT_COLUMNS` column, in that order (null where not broken down):
    the stable shape of the JSON rows and CSV lines."""
    return stats.with_columns(pl.lit(None, _SCHEMA[c]).alias(c) for c in STAT_COLUMNS
                              if c not in stats.columns).select(STAT_COLUMNS)


def csv_text(stats: pl.DataFrame, file: str, header: bool) -> str:
    """CSV lines (RFC 4180, comma-separated, nulls empty) of ``stats`` with a leading ``file`` column."""
    return records(stats).select(pl.lit(file).alias("file"), pl.all()).write_csv(include_header=header)


def no_transactions_message(path: str, cap) -> str:
    packets = cap.packet_count if getattr(cap, "packets", None) is not None else 0
    titles = list(protocol_names().values())
    names = ", ".join(titles[:-1]) + f" or {titles[-1]}" if len(titles) > 1 else "".join(titles)
    return (f"{path}: no {names} requests in its {packets:,} packet{'' if packets == 1 else 's'}: "
            f"no response times to report")


# -- what counts as an error, and as unanswered -------------------------------------------------------

def outcome_rules() -> list[tuple[str, str, str]]:
    """(protocol, what counts as an error, when a request counts as unanswered) for every registered
    protocol whose decoder module states its rules (``outcome_rules() -> (errors, unanswered)``, read
    from its code tables and parameters: the rules live there; this is their summary for ``stats --help``
    and the README, which tests/test_stats.py holds to this text)."""
    out = []
    for p in registry.protocols():
        rules = getattr(registry.module(p.name), "outcome_rules", None)
        if rules is not None:
            out.append((p.name, *rules()))
    return out


def outcome_help() -> str:
    """:func:`outcome_rules` as paragraphs of the ``stats --help`` text."""
    lines = []
    titles = registry.titles()
    for protocol, errors, unanswered in outcome_rules():
        lines.append(f"{titles[protocol]} errors: {errors}")
        lines.append(f"{titles[protocol]} unanswered: {unanswered}")
    lines.append("Any protocol: a request sent shortly before the capture ends counts as unanswered too.")
    return "\n\n".join(lines)


LEG_TITLES = {"client_to_resolver": "clients → resolvers (leg client_to_resolver)",
              "resolver_to_upstream": "resolvers → their upstream servers (leg resolver_to_upstream)",
              "direct": "no forwarding seen (leg direct)"}


def render_table(stats: pl.DataFrame, title: str, console=None) -> None:
    """``stats`` for a terminal: one table per protocol and leg (the group in its title), so the
    columns left are the operation, the --by address and the numbers."""
    from rich import box  # lazy: rich only when a table is drawn: start-up speed of the JSON/CSV outputs
    from rich.table import Table  # lazy: as above

    from .render import console as make_console  # lazy: beside rich, for the same reason

    console = console or make_console()
    console.print(title, highlight=False)
    shown = [c for c in ("operation", "server", "client") if c in stats.columns]
    columns = shown + list(VALUE_COLUMNS[:-1])
    groups = stats.select("protocol", "leg").unique(maintain_order=True).iter_rows()
    titles = registry.titles()
    for protocol, leg in groups:  # a handful: one per protocol and leg
        rows = stats.filter((pl.col("protocol") == protocol) & pl.col("leg").eq_missing(leg))
        name = titles.get(protocol, protocol)
        t = Table(title=f"{name}: {LEG_TITLES.get(leg, leg)}" if leg else name, title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
        for col in columns:  # names and addresses fold rather than lose their ends
            t.add_column(col, justify="left" if col in shown else "right", overflow="fold" if col in shown else None)
        for r in rows.select(columns).iter_rows(named=True):  # one row per stats line, not per transaction
            t.add_row(*(r[c] if r[c] is not None else "-" for c in shown),
                      *(f"{r[c]:,}" for c in ("count", "answered", "unanswered", "errors")),
                      *(fmt_ns(r[c]) if r[c] is not None else "-" for c in LATENCY_COLUMNS))
        console.print(t)
