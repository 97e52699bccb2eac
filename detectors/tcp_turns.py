"""TCP request/response turns: the one copy of how a TCP connection without a decoder is cut into requests.

A connection's payload segments (``tcp_segments`` with ``seglen > 0``, in frame order) alternate
between runs from the client and runs from the server. A **request turn** is a run of client payload
that starts the connection's payload or follows server payload; its response is the server run right
after it (none when the connection ends, or the capture does, first). This is the application's
request/response rhythm as TCP shows it, whatever the protocol: what conn_churn counts per connection
(requests per connection where no decoder applies) and what saturation times (the turns' latency and
concurrency). Pipelined requests sent back to back without server payload between them are one turn:
the wire cannot tell them apart without a decoder.

Not a detector (no ``NAME``): detectors/__init__.py skips it.
"""
from __future__ import annotations

import polars as pl

from analyzer.tcp.analysis import ANY_RETRANSMISSION


# what payload_segments reads of tcp_segments (a detector's COLUMNS, base.py)
SEGMENT_COLUMNS = ("conn", "frame", "ts_ns", "from_client", "seglen", "analysis")


def payload_segments(seg: pl.DataFrame, conns: pl.DataFrame | None = None) -> pl.DataFrame:
    """The payload-carrying segments (conn, frame, ts_ns, from_client, seglen, analysis when present) of
    the connections in ``conns`` (a frame with a ``conn`` column; every connection when None), sorted
    by connection and frame: the input of :func:`turn_start` and :func:`turns`."""
    cols = ["conn", "frame", "ts_ns", "from_client", "seglen"] + (["analysis"] if "analysis" in seg.columns else [])
    s = seg.select(cols)
    if conns is not None:
        s = s.join(conns.select(pl.col("conn").cast(s.schema["conn"])), on="conn", how="semi")
    return s.filter(pl.col("seglen") > 0).sort("conn", "frame")


def turn_start() -> pl.Expr:
    """True on the client segment that opens a request turn (on :func:`payload_segments`' order): the
    connection's first payload, or the first client payload after server payload."""
    same = pl.col("conn") == pl.col("conn").shift(1)
    return (pl.col("from_client") & (~same | ~pl.col("from_client").shift(1)).fill_null(True)).alias("turn")


def turns(seg: pl.DataFrame, conns: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per request turn: ``conn``, ``turn`` (its number in the connection, from 0),
    ``request_first_frame`` / ``request_first_ts_ns`` (the turn's first client segment),
    ``request_frame`` / ``request_ts_ns`` (its last: the request fully sent), ``response_frame`` /
    ``response_ts_ns`` (the server's first segment after it; null when none came),
    ``retransmitted`` (a client segment of the turn was a TCP retransmission) and ``segments``."""
    s = payload_segments(seg, conns)
    empty = pl.DataFrame(schema={"conn": pl.UInt32, "turn": pl.UInt32, "request_first_frame": pl.UInt32,
                                 "request_first_ts_ns": pl.Int64, "request_frame": pl.UInt32,
                                 "request_ts_ns": pl.Int64, "response_frame": pl.UInt32,
                                 "response_ts_ns": pl.Int64, "retransmitted": pl.Boolean, "segments": pl.UInt32})
    if s.height == 0:
        return empty
    same = pl.col("conn") == pl.col("conn").shift(1)
    new_run = (~same | (pl.col("from_client") != pl.col("from_client").shift(1))).fill_null(True)
    retx = ((pl.col("analysis") & ANY_RETRANSMISSION) != 0) if "analysis" in s.columns else pl.lit(False)
    runs = s.with_columns(new_run.cum_sum().alias("_run"), retx.alias("_retx")).group_by("_run", maintain_order=True).agg(
        pl.col("conn").first(), pl.col("from_client").first(),
        pl.col("frame").first().alias("first_frame"), pl.col("ts_ns").first().alias("first_ts"),
        pl.col("frame").last().alias("last_frame"), pl.col("ts_ns").last().alias("last_ts"),
        pl.col("_retx").any().alias("retransmitted"), pl.len().cast(pl.UInt32).alias("segments"))
    nxt_same = pl.col("conn").shift(-1) == pl.col("conn")
    runs = runs.with_columns(
        pl.when(nxt_same).then(pl.col("first_frame").shift(-1)).alias("response_frame"),
        pl.when(nxt_same).then(pl.col("first_ts").shift(-1)).alias("response_ts_ns"))
    out = runs.filter(pl.col("from_client")).with_columns(
        pl.int_range(pl.len()).over("conn").cast(pl.UInt32).alias("turn"))
    return out.select(
        pl.col("conn").cast(pl.UInt32), "turn", pl.col("first_frame").cast(pl.UInt32).alias("request_first_frame"),
        pl.col("first_ts").cast(pl.Int64).alias("request_first_ts_ns"),
        pl.col("last_frame").cast(pl.UInt32).alias("request_frame"), pl.col("last_ts").cast(pl.Int64).alias("request_ts_ns"),
        pl.col("response_frame").cast(pl.UInt32), pl.col("response_ts_ns").cast(pl.Int64), "retransmitted", "segments")
