"""A throwaway decoder for tests/test_protocol_registry.py: the Echo protocol (RFC 862) on UDP port 7,
written the way a real decoder is: one ``PROTOCOL`` declaration and its ``@frame_builder`` functions,
nothing anywhere else. The test's fixture registers it (``registry.register(module)``) and unregisters
it, so it shows that a protocol is its own module plus one registration.

RFC 862 §3: "Once a datagram is received, the data from it is sent back in an answering datagram."
A request is a datagram to port 7, its answer the datagram from port 7 on the same flow carrying the
same bytes (matched by the first eight, :data:`KEY_BYTES`).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from analyzer.capture import frame_builder
from analyzer.decoders.common import TRANSACTION_COMMON, unbroken_duration
from analyzer.decoders.protocol import Protocol
from analyzer.messages import KEPT_COLUMNS, MessageSet, protocol_message_sets
from analyzer.schema import FRAMES, column, empty_frame

PROTOCOL = Protocol(
    name="echo", title="Echo", spec="RFC 862", udp_ports=(7,),
    frames=("echo_messages", "echo_transactions"), transactions="echo_transactions",
    requests_noun="Echo requests", services={7: "echo"},
)

KEY_BYTES = 8  # bytes of a datagram that pair an answer with its request
TIMEOUT_NS = 5_000_000_000  # an answer later than this is not the answer (RFC 862 sets no limit)

MESSAGE_COLUMNS = KEPT_COLUMNS + (
    column("key", np.uint64, f"the datagram's first {KEY_BYTES} bytes, big-endian (zero-padded)"),)
TRANSACTION_COLUMNS = TRANSACTION_COMMON
FRAMES.setdefault("echo_messages", MESSAGE_COLUMNS)
FRAMES.setdefault("echo_transactions", TRANSACTION_COLUMNS)


def _keys(ms: MessageSet) -> np.ndarray:
    """The first KEY_BYTES bytes of every message as one integer (a gather per byte, no loop per row)."""
    off = ms.frame["offset"].to_numpy()
    length = ms.frame["length"].to_numpy().astype(np.int64)
    key = np.zeros(ms.height, np.uint64)
    for k in range(KEY_BYTES):
        have = length > k
        byte = np.where(have, ms.buf[np.where(have, off + k, 0)], 0).astype(np.uint64)
        key = (key << np.uint64(8)) | byte
    return key


def message_sets(cap) -> list[MessageSet]:
    return protocol_message_sets(cap, PROTOCOL)


@frame_builder("echo_messages")
def _build_messages(cap) -> pl.DataFrame:
    parts = [ms.frame.select([c.name for c in KEPT_COLUMNS]).with_columns(pl.Series("key", _keys(ms)))
             for ms in message_sets(cap)]
    return pl.concat(parts) if parts else empty_frame(MESSAGE_COLUMNS)


@frame_builder("echo_transactions")
def _build_transactions(cap) -> pl.DataFrame:
    m = cap.frame("echo_messages")
    if m.height == 0:
        return empty_frame(TRANSACTION_COLUMNS)
    req = m.filter(pl.col("from_client")).sort("ts_last_ns")
    rsp = m.filter(~pl.col("from_client")).sort("ts_last_ns").select(
        "flow", "key", pl.col("ts_last_ns").alias("response_ts_ns"), pl.col("frame_last").alias("response_frame"))
    tx = req.join_asof(rsp, left_on="ts_last_ns", right_on="response_ts_ns", by=["flow", "key"],
                       strategy="forward", tolerance=TIMEOUT_NS, check_sortedness=False)  # sorted by time
    return tx.select(
        pl.lit("echo").alias("protocol"), "transport", "flow",
        pl.col("src").cast(pl.String).alias("client"), pl.col("sport").alias("client_port"),
        pl.col("dst").cast(pl.String).alias("server"), pl.col("dport").alias("server_port"),
        pl.lit("echo").alias("operation"), pl.lit(None, pl.String).alias("resource"),
        pl.col("frame_last").alias("request_frame"), "response_frame",
        pl.col("ts_last_ns").alias("request_ts_ns"), "response_ts_ns",
        (pl.col("response_ts_ns") - pl.col("ts_last_ns")).alias("latency_ns"),
        pl.when(pl.col("response_ts_ns").is_not_null()).then(pl.lit("echoed")).alias("status"),
        pl.lit(False).alias("is_error"), pl.col("response_ts_ns").is_not_null().alias("answered"),
    ).sort("request_ts_ns")


def outcome_rules() -> tuple[str, str]:
    """(what counts as an error, when a request counts as unanswered): ``stats --help``."""
    return ("none: an answer is the request's own bytes.",
            f"no datagram with the same first {KEY_BYTES} bytes back on the flow within "
            f"{unbroken_duration(TIMEOUT_NS)}.")


# -- for the "message" client-side rule (a toy, not Echo): the first byte says who sent it ---------

REQUEST_TAG = ord("Q")


def tagged_direction(ms: MessageSet) -> np.ndarray:
    """True for messages whose first byte is "Q" (a request: sent by the client)."""
    off = ms.frame["offset"].to_numpy()
    have = ms.frame["length"].to_numpy() > 0
    return have & (ms.buf[np.where(have, off, 0)] == REQUEST_TAG)
