"""The retry_storm detector's sends (see detectors/retry_storm.py for what a send, a retry and "the same
request" are): one row per send of a request — the first send of every transaction (DNS, Kerberos,
LDAP, SMB2: their transaction frames), each retransmitted DNS query (``dns_messages``) and every SYN a
client sent (``tcp_segments`` + ``connections``) — with how it ended: answered fine (``ok_ts``), with an
error (``error``, ``err_ts``) or not at all, and when it stopped being outstanding (``end_ts``).
"""
from __future__ import annotations

import polars as pl

from analyzer.tcp.analysis import TH_ACK as ACK, TH_SYN as SYN

from .base import endpoint_expr
from .herd import requests_of

SEND_SCHEMA = {
    "kind": pl.String, "client": pl.String, "client_port": pl.UInt16, "server": pl.String,
    "server_port": pl.UInt16, "operation": pl.String, "key_resource": pl.String, "resource": pl.String,
    "ts": pl.Int64, "frame": pl.UInt32, "ok_ts": pl.Int64, "end_ts": pl.Int64, "extra": pl.UInt32,
    "latency_ns": pl.Int64, "answered": pl.Boolean, "error": pl.String, "err_ts": pl.Int64,
    "reliable": pl.Boolean, "flow": pl.Int64,
}

# request fields that make two requests of one protocol different although operation and resource
# agree (two LDAP searches of one base with different filters are different requests)
_DETAIL_FIELDS = ("filter", "scope", "attributes", "oid", "cname", "info_class_name", "file_offset",
                  "create_disposition", "fid_persistent", "fid_volatile")


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


def _dns_retransmissions(capture, dns_tx: pl.DataFrame) -> pl.DataFrame | None:
    """The retransmitted queries (dns_messages.retransmission) with their transaction's outcome."""
    try:
        msgs = capture.frame("dns_messages")
    except KeyError:
        return None
    need = {"retransmission", "qr", "src", "dst", "sport", "dport", "id", "qname", "qtype", "ts_last_ns",
            "frame_last", "transport"}
    if msgs is None or not need <= set(msgs.columns):
        return None
    rt = msgs.filter(pl.col("retransmission").fill_null(False) & (pl.col("qr") == False)).select(  # noqa: E712
        pl.col("transport").cast(pl.String), pl.col("src").cast(pl.String).alias("client"),
        pl.col("sport").cast(pl.UInt16).alias("client_port"), pl.col("dst").cast(pl.String).alias("server"),
        pl.col("dport").cast(pl.UInt16).alias("server_port"), pl.col("id").cast(pl.UInt16),
        pl.col("qname").cast(pl.String).alias("resource"), pl.col("qtype").cast(pl.UInt16),
        pl.col("ts_last_ns").cast(pl.Int64).alias("ts"), pl.col("frame_last").cast(pl.UInt32).alias("frame"))
    if rt.height == 0:
        return rt.with_columns(pl.lit(None, pl.Int64).alias("_txn"))
    by = ["transport", "client", "client_port", "server", "server_port", "id", "resource", "qtype"]
    tx = dns_tx.select(
        pl.col("transport").cast(pl.String), pl.col("client").cast(pl.String), pl.col("client_port").cast(pl.UInt16),
        pl.col("server").cast(pl.String), pl.col("server_port").cast(pl.UInt16), pl.col("id").cast(pl.UInt16),
        pl.col("resource").cast(pl.String), pl.col("qtype").cast(pl.UInt16),
        pl.col("request_ts_ns").cast(pl.Int64).alias("tx_ts"), pl.col("_txn"))
    return rt.sort("ts").join_asof(tx.sort("tx_ts", "_txn"), left_on="ts", right_on="tx_ts", by=by, strategy="backward",
                                   check_sortedness=False)


def transaction_sends(capture, frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """One row per send of every transaction frame (DNS retransmissions included)."""
    parts = []
    for name, f in frames.items():
        f = f.with_row_index("_txn").with_columns(pl.col("_txn").cast(pl.Int64), _detail(f).alias("_detail"),
                                                   pl.col("status").cast(pl.String).alias("_status"),
                                                   pl.col("resource").cast(pl.String).alias("_resource"))
        dns = {"retries", "id", "qtype"} <= set(f.columns)
        f = f.with_columns(pl.col("transport").cast(pl.String).alias("_transport"),
                           pl.col("flow").cast(pl.Int64).alias("_flow"))
        req = requests_of({name: f}, keep=("_txn", "_detail", "_status", "_resource", "_transport", "_flow")
                          + (("retries",) if dns else ()))
        req = req.with_columns(pl.concat_str("key_resource", pl.col("_detail").fill_null(""), separator="\x1f")
                               .alias("key_resource"))
        extra = pl.lit(0, pl.UInt32)
        rts = None
        if dns:
            rts = _dns_retransmissions(capture, f)
            if rts is None:  # no message frame: the retries are known, their times are not
                extra = pl.col("retries").cast(pl.UInt32).fill_null(0)
        first = req.select(
            pl.col("protocol").alias("kind"), "client", "client_port", "server", "server_port", "operation",
            "key_resource", pl.coalesce("_resource", "resource").alias("resource"), pl.col("request_ts_ns").alias("ts"),
            pl.col("request_frame").alias("frame"),
            pl.when(pl.col("answered") & ~pl.col("is_error").fill_null(False)).then(pl.col("response_ts_ns"))
            .alias("ok_ts"), pl.col("end_ts_ns").alias("end_ts"), extra.alias("extra"), "latency_ns", "answered",
            pl.when(pl.col("is_error").fill_null(False)).then(pl.col("_status")).alias("error"),
            pl.when(pl.col("answered") & pl.col("is_error").fill_null(False)).then(pl.col("response_ts_ns"))
            .alias("err_ts"), (pl.col("_transport") == "tcp").fill_null(False).alias("reliable"),
            pl.col("_flow").alias("flow"), "_txn", "expects")
        parts.append(first.filter(pl.col("expects")).drop("expects", "_txn").cast(SEND_SCHEMA))
        if rts is not None and rts.height:
            outcome = first.select("_txn", "kind", "operation", "key_resource", "ok_ts", "end_ts", "error", "err_ts",
                                   "reliable", "flow")
            parts.append(rts.filter(pl.col("_txn").is_not_null()).join(outcome, on="_txn", how="inner").select(
                "kind", "client", "client_port", "server", "server_port", "operation", "key_resource", "resource",
                "ts", "frame", "ok_ts", "end_ts", pl.lit(0, pl.UInt32).alias("extra"),
                pl.lit(None, pl.Int64).alias("latency_ns"), pl.lit(False).alias("answered"), "error", "err_ts",
                "reliable", "flow",
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
        segs = capture.frame("tcp_segments")
    except KeyError:
        return empty, None
    if conns is None or conns.height == 0 or segs is None or segs.height == 0:
        return empty, conns
    is_syn = (pl.col("tcp_flags").cast(pl.Int64) & (SYN | ACK)) == SYN
    syn = segs.filter(is_syn & pl.col("from_client")).select(
        pl.col("frame").cast(pl.UInt32), pl.col("ts_ns").cast(pl.Int64).alias("ts"), "conn")
    if syn.height == 0:
        return empty, conns
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
        pl.lit(False).alias("reliable"), pl.col("conn").cast(pl.Int64).alias("flow"))
    return out.cast(SEND_SCHEMA), conns
