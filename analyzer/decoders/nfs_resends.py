"""NFS/ONC-RPC's retransmitted calls (``Protocol.resends`` of analyzer/decoders/nfs.py): one row per call
re-sent with the xid of an unanswered one (RFC 5531 §9: the xid is what lets the server's duplicate
request cache recognise a retransmission), joined to the ``nfs_transactions`` row(s) that fold it.

:mod:`analyzer.decoders.nfs_pairing` folds a call repeated with the same flow, xid, caller, program,
version and procedure while the first is unanswered into the first call's transaction
(``retransmissions``, ``last_call_ts_ns``); the resends themselves are the CALL rows of ``nfs_messages``
between that first call and the last. A COMPOUND with several operations that matter has one
transaction row per operation: a resend of the COMPOUND re-sends each of them (one row per
transaction row). The Linux client retransmits after ``timeo`` (nfs(5); include/uapi/linux/nfs_fs.h:
NFS_DEF_UDP_TIMEO 11 deciseconds, doubling per retry up to 60 s; NFS_DEF_TCP_TIMEO 600), on the same
connection or, over TCP, on a new one after a reconnect: the xid stays.
"""
from __future__ import annotations

import polars as pl

RESEND_SCHEMA = {"client": pl.String, "client_port": pl.UInt16, "server": pl.String, "server_port": pl.UInt16,
                 "ts": pl.Int64, "frame": pl.UInt32, "txn": pl.Int64}

# what resends reads of the message frame (Protocol.resends_columns: a scan keeps no more of it for it)
MESSAGE_COLUMNS = frozenset({"msg_type", "op_index", "flow", "xid", "src", "sport", "dst", "dport", "program",
                             "version", "procedure", "ts_last_ns", "frame_last", "message"})
# the rows of it resends reads, the calls (Protocol.resends_rows: a shard hands over no others)
MESSAGE_ROWS = (pl.col("msg_type").cast(pl.String) == "CALL") & (pl.col("op_index") == 0)
_NEED_TRANSACTIONS = {"flow", "xid", "client", "client_port", "program", "version", "procedure", "request_ts_ns",
                      "last_call_ts_ns", "retransmissions", "message"}
_KEY = ["flow", "xid", "client", "client_port", "program", "version", "procedure"]


def resends(messages: pl.DataFrame, transactions: pl.DataFrame) -> pl.DataFrame:
    """The retransmitted calls of ``messages`` (nfs_messages), each with ``txn``: the row of ``transactions``
    (nfs_transactions) whose first call it repeats — the pairing's key: same flow (addresses and ports),
    xid, caller, program, version and procedure — sent after that first call and no later than its last
    one. A client that reconnects from its old source port (Linux binds it again, net/sunrpc/xprtsock.c,
    so the server's duplicate request cache still knows it) stays on the flow; one that reconnects from a
    new port opens another flow, where the pairing sees a new call (retry_storm's another-connection rule
    then applies, within its max_gap_ns). Empty when either frame lacks the columns."""
    if not (MESSAGE_COLUMNS <= set(messages.columns) and _NEED_TRANSACTIONS <= set(transactions.columns)):
        return pl.DataFrame(schema=RESEND_SCHEMA)
    tx = transactions.with_row_index("txn").filter(pl.col("retransmissions").fill_null(0) > 0).select(
        pl.col("txn").cast(pl.Int64), pl.col("flow").cast(pl.UInt32), pl.col("xid").cast(pl.UInt32),
        pl.col("client").cast(pl.String),
        pl.col("client_port").cast(pl.UInt16), pl.col("program").cast(pl.UInt32),
        pl.col("version").cast(pl.UInt32), pl.col("procedure").cast(pl.UInt32),
        pl.col("request_ts_ns").cast(pl.Int64).alias("first_ts"), pl.col("last_call_ts_ns").cast(pl.Int64),
        pl.col("message").cast(pl.UInt32).alias("first_message"))
    if tx.height == 0:
        return pl.DataFrame(schema=RESEND_SCHEMA)
    calls = messages.filter(MESSAGE_ROWS).select(
        pl.col("flow").cast(pl.UInt32), pl.col("xid").cast(pl.UInt32), pl.col("src").cast(pl.String).alias("client"),
        pl.col("sport").cast(pl.UInt16).alias("client_port"), pl.col("dst").cast(pl.String).alias("server"),
        pl.col("dport").cast(pl.UInt16).alias("server_port"), pl.col("program").cast(pl.UInt32),
        pl.col("version").cast(pl.UInt32), pl.col("procedure").cast(pl.UInt32),
        pl.col("ts_last_ns").cast(pl.Int64).alias("ts"), pl.col("frame_last").cast(pl.UInt32).alias("frame"),
        pl.col("message").cast(pl.UInt32))
    # the key is selective (xid + caller): the join is a few rows per retransmitted transaction
    out = calls.join(tx, on=_KEY, how="inner").filter(
        (pl.col("message") != pl.col("first_message")) & (pl.col("ts") >= pl.col("first_ts"))
        & (pl.col("ts") <= pl.col("last_call_ts_ns")))
    return out.select(list(RESEND_SCHEMA)).cast(RESEND_SCHEMA).sort("ts", "frame", "txn")
