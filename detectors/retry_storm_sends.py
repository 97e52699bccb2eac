"""The retry_storm detector's sends (see detectors/retry_storm.py for what a send, a retry and "the same
request" are): one row per send of a request — the first send of every transaction (every protocol's
transaction frame), each resend a protocol folds into its transaction and declares with
``Protocol.resends`` (DNS queries, RPC calls re-sent with their id: the hook reads the protocol's
message frame, :data:`RESEND_FRAMES`) and every SYN a client sent (``tcp_client_syns`` + ``connections``) —
with how it ended: answered fine (``ok_ts``), with an error (``error``, ``err_ts``) or not at all, and
when it stopped being outstanding (``end_ts``). Asks answered with one of a protocol's ``poll_answers``
(a lock denied because another owner holds it) are left out: they are lock_polling's.
"""
from __future__ import annotations

import importlib

import polars as pl

from analyzer.decoders import registry
from analyzer.decoders.protocol import Protocol

from .base import endpoint_expr, optional_frame
from .herd import requests_of

# the message frames the protocols' resends hooks read (Protocol.resends_frame), from the registry as it
# stands when detectors are imported (as base.TRANSACTION_FRAMES)
RESEND_FRAMES = tuple(p.resends_frame for p in registry.protocols() if p.transactions and p.resends_frame)

SEND_SCHEMA = {
    "kind": pl.String, "client": pl.String, "client_port": pl.UInt16, "server": pl.String,
    "server_port": pl.UInt16, "operation": pl.String, "key_resource": pl.String, "resource": pl.String,
    "ts": pl.Int64, "frame": pl.UInt32, "ok_ts": pl.Int64, "end_ts": pl.Int64, "extra": pl.UInt32,
    "latency_ns": pl.Int64, "answered": pl.Boolean, "error": pl.String, "err_ts": pl.Int64,
    "reliable": pl.Boolean, "flow": pl.Int64,
    # a resend its protocol recognises as the same request (same DNS id, same RPC xid: Protocol.resends):
    # the application retrying, on whichever connection (TCP's own retransmissions never reach a message)
    "same_id": pl.Boolean,
}

# request fields that make two requests of one protocol different although operation and resource
# agree (two LDAP searches of one base with different filters are different requests)
# (NFS: offset and length of a READ, WRITE or LOCK: reading on through a file is not asking again)
_DETAIL_FIELDS = ("filter", "scope", "attributes", "oid", "cname", "info_class_name", "file_offset",
                  "create_disposition", "fid_persistent", "fid_volatile", "offset", "length")


_RESPONSE_FIELDS = ("fid_persistent", "fid_volatile")  # filled from the response of a CREATE: not the request's


def _detail(f: pl.DataFrame) -> pl.Expr:
    cols = []
    for c in _DETAIL_FIELDS:
        if c not in f.columns:
            continue
        e = pl.col(c).cast(pl.String)
        if c in _RESPONSE_FIELDS:
            e = pl.when(pl.col("operation").cast(pl.String) != "CREATE").then(e)
        cols.append(e.fill_null(""))
    return pl.concat_str(cols, separator="\x1f") if cols else pl.lit(None, pl.String)


def _hook(spec: str):
    """The function a ``"module:function"`` declaration names (Protocol.resends)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _poll_answer(proto: Protocol | None) -> pl.Expr:
    """True for the rows answered with one of the protocol's ``poll_answers`` (operation, status): a
    poll of a contended resource (lock_polling's), not a failure to retry."""
    pairs = proto.poll_answers if proto is not None else ()
    if not pairs:
        return pl.lit(False)
    keys = pl.Series([f"{op}\x1f{status}" for op, status in pairs], dtype=pl.String).implode()
    return pl.concat_str(pl.col("operation").cast(pl.String), pl.col("_status"), separator="\x1f").is_in(keys) \
        .fill_null(False)


def resends_of(proto: Protocol, messages: pl.DataFrame, transactions: pl.DataFrame) -> pl.DataFrame:
    """The protocol's ``resends`` hook on its message frame and transactions frame: one row per resend
    (client, client_port, server, server_port, ts, frame, txn: the row of ``transactions``)."""
    return _hook(proto.resends)(messages, transactions)


def _resends(capture, proto: Protocol | None, f: pl.DataFrame) -> pl.DataFrame | None:
    """The protocol's retransmitted sends (its ``resends`` hook on its message frame), None when it
    declares none or the capture lacks the message frame."""
    if proto is None or not proto.resends:
        return None
    declared = getattr(capture, "requires", None)  # a CaptureView serves what REQUIRES named at import
    if declared is not None and proto.resends_frame not in declared:
        return None
    msgs = optional_frame(capture, proto.resends_frame)
    if msgs is None:
        return None
    return resends_of(proto, msgs, f)


def transaction_sends(capture, frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """One row per send of every transaction frame: its first send, and every resend its protocol
    recognises (``Protocol.resends``: DNS queries and RPC calls re-sent with their id), minus the asks
    answered with one of the protocol's ``poll_answers`` (lock polling, not retries)."""
    parts = []
    for name, f in frames.items():
        proto = registry.protocol_of_frame(name)
        f = f.with_row_index("_txn").with_columns(pl.col("_txn").cast(pl.Int64), _detail(f).alias("_detail"),
                                                   pl.col("status").cast(pl.String).alias("_status"),
                                                   pl.col("resource").cast(pl.String).alias("_resource"))
        f = f.with_columns(pl.col("transport").cast(pl.String).alias("_transport"),
                           pl.col("flow").cast(pl.Int64).alias("_flow"), _poll_answer(proto).alias("_poll"))
        count = proto.resends_count if proto is not None and proto.resends_count in f.columns else None
        req = requests_of({name: f}, keep=("_txn", "_detail", "_status", "_resource", "_transport", "_flow", "_poll")
                          + ((count,) if count else ()))
        if any(c in f.columns for c in _DETAIL_FIELDS):  # else the key is the resource's (DNS: ~1.7 GB at 7.2M)
            req = req.with_columns(pl.concat_str("key_resource", pl.col("_detail").fill_null(""), separator="\x1f")
                                   .alias("key_resource"))
        extra = pl.lit(0, pl.UInt32)
        rts = _resends(capture, proto, f.drop("_txn", "_detail", "_status", "_resource", "_transport", "_flow",
                                              "_poll"))
        if rts is None and count:  # no message frame: the resends are known, their times are not
            extra = pl.col(count).cast(pl.UInt32).fill_null(0)
        first = req.filter(~pl.col("_poll")).select(
            pl.col("protocol").alias("kind"), "client", "client_port", "server", "server_port", "operation",
            "key_resource", pl.coalesce("_resource", "resource").alias("resource"), pl.col("request_ts_ns").alias("ts"),
            pl.col("request_frame").alias("frame"),
            pl.when(pl.col("answered") & ~pl.col("is_error").fill_null(False)).then(pl.col("response_ts_ns"))
            .alias("ok_ts"), pl.col("end_ts_ns").alias("end_ts"), extra.alias("extra"), "latency_ns", "answered",
            pl.when(pl.col("is_error").fill_null(False)).then(pl.col("_status")).alias("error"),
            pl.when(pl.col("answered") & pl.col("is_error").fill_null(False)).then(pl.col("response_ts_ns"))
            .alias("err_ts"), (pl.col("_transport") == "tcp").fill_null(False).alias("reliable"),
            pl.col("_flow").alias("flow"), pl.lit(False).alias("same_id"), "_txn", "expects")
        parts.append(first.filter(pl.col("expects")).drop("expects", "_txn").cast(SEND_SCHEMA))
        if rts is not None and rts.height:
            outcome = first.filter(pl.col("expects")).select(
                "_txn", "kind", "operation", "key_resource", "resource", "ok_ts", "end_ts", "error", "err_ts",
                "reliable", "flow")
            parts.append(rts.rename({"txn": "_txn"}).join(outcome, on="_txn", how="inner").select(
                "kind", "client", "client_port", "server", "server_port", "operation", "key_resource", "resource",
                "ts", "frame", "ok_ts", "end_ts", pl.lit(0, pl.UInt32).alias("extra"),
                pl.lit(None, pl.Int64).alias("latency_ns"), pl.lit(False).alias("answered"), "error", "err_ts",
                "reliable", "flow", pl.lit(True).alias("same_id"),
            ).cast(SEND_SCHEMA))
    if not parts:
        return pl.DataFrame(schema=SEND_SCHEMA)
    return pl.concat(parts)


def syn_sends(capture) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """One row per SYN a client sent (retransmissions included), with its connection's outcome; and
    the connections frame (for handshake RTTs)."""
    empty = pl.DataFrame(schema=SEND_SCHEMA)
    try:
        conns = capture.frame("connections")
        syns = capture.frame("tcp_client_syns")
    except KeyError:
        return empty, None
    if conns is None or conns.height == 0 or syns is None or syns.height == 0:
        return empty, conns
    syn = syns.select(pl.col("frame").cast(pl.UInt32), pl.col("ts_ns").cast(pl.Int64).alias("ts"), "conn")
    c = conns.select(
        "conn", pl.col("client").cast(pl.String), pl.col("client_port").cast(pl.UInt16),
        pl.col("server").cast(pl.String), pl.col("server_port").cast(pl.UInt16),
        pl.col("synack_ts_ns").cast(pl.Int64), pl.col("last_ts_ns").cast(pl.Int64),
        pl.col("rtt_client_server_ns").cast(pl.Int64), pl.col("server_rst").cast(pl.Boolean))
    out = syn.join(c, on="conn", how="inner").select(
        pl.lit("tcp").alias("kind"), "client", "client_port", "server", "server_port", pl.lit("SYN").alias("operation"),
        endpoint_expr(pl.col("server"), pl.col("server_port")).alias("key_resource"),
        endpoint_expr(pl.col("server"), pl.col("server_port")).alias("resource"), "ts", "frame",
        pl.col("synack_ts_ns").alias("ok_ts"), pl.coalesce("synack_ts_ns", "last_ts_ns").alias("end_ts"),
        pl.lit(0, pl.UInt32).alias("extra"), pl.col("rtt_client_server_ns").alias("latency_ns"),
        pl.col("synack_ts_ns").is_not_null().alias("answered"),
        pl.when(pl.col("server_rst") & pl.col("synack_ts_ns").is_null()).then(pl.lit("RST")).alias("error"),
        pl.when(pl.col("server_rst") & pl.col("synack_ts_ns").is_null()).then(pl.col("last_ts_ns")).alias("err_ts"),
        pl.lit(False).alias("reliable"), pl.col("conn").cast(pl.Int64).alias("flow"), pl.lit(False).alias("same_id"))
    return out.cast(SEND_SCHEMA), conns
