"""DNS's retransmitted queries (``Protocol.resends`` of analyzer/decoders/dns.py): one row per query
re-sent with the id and question of an outstanding one (``dns_messages.retransmission``, Wireshark's
``dns.retransmission``; RFC 1035 §4.2.1, RFC 1536 §1), joined to the transaction that folds it
(``dns_transactions.retries``).
"""
from __future__ import annotations

import polars as pl

RESEND_SCHEMA = {"client": pl.String, "client_port": pl.UInt16, "server": pl.String, "server_port": pl.UInt16,
                 "ts": pl.Int64, "frame": pl.UInt32, "txn": pl.Int64}

# what resends reads of the message frame (Protocol.resends_columns: a scan keeps no more of it for it)
MESSAGE_COLUMNS = frozenset({"retransmission", "qr", "src", "dst", "sport", "dport", "id", "qname", "qtype",
                             "ts_last_ns", "frame_last", "transport"})
# the rows of it resends reads, the queries re-sent (Protocol.resends_rows: a shard hands over no others)
MESSAGE_ROWS = pl.col("retransmission").fill_null(False) & (pl.col("qr") == False)  # noqa: E712
_NEED_TRANSACTIONS = {"transport", "client", "client_port", "server", "server_port", "id", "resource", "qtype",
                      "request_ts_ns"}


def resends(messages: pl.DataFrame, transactions: pl.DataFrame) -> pl.DataFrame:
    """The retransmitted queries of ``messages`` (dns_messages), each with ``txn``: the row of
    ``transactions`` (dns_transactions) it re-sends — the latest one at or before it with the same
    transport, addresses, ports, id and question. Empty when either frame lacks the columns."""
    if not (MESSAGE_COLUMNS <= set(messages.columns) and _NEED_TRANSACTIONS <= set(transactions.columns)):
        return pl.DataFrame(schema=RESEND_SCHEMA)
    rt = messages.filter(MESSAGE_ROWS).select(
        pl.col("transport").cast(pl.String), pl.col("src").cast(pl.String).alias("client"),
        pl.col("sport").cast(pl.UInt16).alias("client_port"), pl.col("dst").cast(pl.String).alias("server"),
        pl.col("dport").cast(pl.UInt16).alias("server_port"), pl.col("id").cast(pl.UInt16),
        pl.col("qname").cast(pl.String).alias("resource"), pl.col("qtype").cast(pl.UInt16),
        pl.col("ts_last_ns").cast(pl.Int64).alias("ts"), pl.col("frame_last").cast(pl.UInt32).alias("frame"))
    if rt.height == 0:
        return pl.DataFrame(schema=RESEND_SCHEMA)
    by = ["transport", "client", "client_port", "server", "server_port", "id", "resource", "qtype"]
    # only the transactions of an id re-sent can be re-sent (first narrowed by that integer: a DNS
    # server's transactions are millions, its re-sent queries a few)
    resent = pl.col("id").cast(pl.UInt16).is_in(rt["id"].drop_nulls().unique().implode())
    if rt["id"].null_count():
        resent = resent | pl.col("id").is_null()
    tx = transactions.lazy().with_row_index("txn").filter(resent).select(
        pl.col("transport").cast(pl.String), pl.col("client").cast(pl.String), pl.col("client_port").cast(pl.UInt16),
        pl.col("server").cast(pl.String), pl.col("server_port").cast(pl.UInt16), pl.col("id").cast(pl.UInt16),
        pl.col("resource").cast(pl.String), pl.col("qtype").cast(pl.UInt16),
        pl.col("request_ts_ns").cast(pl.Int64).alias("tx_ts"), pl.col("txn").cast(pl.Int64)).collect()
    out = rt.sort("ts").join_asof(tx.sort("tx_ts", "txn"), left_on="ts", right_on="tx_ts", by=by,
                                  strategy="backward", check_sortedness=False)
    return out.filter(pl.col("txn").is_not_null()).select(list(RESEND_SCHEMA)).cast(RESEND_SCHEMA)
