"""NFS/RPC transactions from the ``nfs_messages`` frame (vectorised Polars).

Pairing (RFC 5531 §9, §11): a reply answers the latest earlier call with the same xid on the same
flow (TCP connection, or UDP client address/port + server) sent by the reply's destination. A call
repeated with the same xid, program, version and procedure by the same caller while the earlier one
is unanswered, within :attr:`Params.retransmission_window_ns`, is a retransmission (RFC 5531 §9: the
xid is what lets a server's duplicate request cache recognise it): it joins the first call's
transaction (``retransmissions``), the reply to any of them answers it, and the latency runs from
the first call (what the application waited).

Rows: one per call, except COMPOUND / CB_COMPOUND calls, which get one row per operation that
matters — every operation but the context-setting ones (:data:`nfs_layout.NFS4_CONTEXT_OPS`: SEQUENCE,
PUTFH, GETFH, GETATTR ...); a compound of context operations only keeps its last one. An operation's
status is its own result, or the COMPOUND status when the reply stops before it (an earlier one failed).

Paths: a name looked up (NFSv3 LOOKUP/CREATE/MKDIR..., NFSv4 LOOKUP/OPEN/CREATE, MOUNT MNT) links
the object id to its directory; a handle returned for it (LOOKUP3res, post_op_fh3, GETFH, the MNT
fhstatus) is linked to that object; PUTROOTFH is ``/``. ``resource`` is the path so resolved, else
``fh:<crc32>`` of the handle (with the name appended for name operations).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ..schema import Column, column
from . import nfs_xdr as X
from . import nfs_layout as L
from .common import TRANSACTION_COMMON
from .smb2_frames import asof_join, schema_of


@dataclass(frozen=True)
class Params:
    """Pairing parameters."""

    # A call repeated within this long of the first, unanswered, is a retransmission. Linux retries a
    # TCP mount's call after timeo=60 s (nfs(5)) and UDP ones after 1.1 s (NFS_DEF_UDP_TIMEO 11) doubling up to 60 s; 10 min
    # covers its 'retrans' default of 2-3 major timeouts and is far below xid reuse (2^32 calls).
    retransmission_window_ns: int = 600_000_000_000
    # How deep a path is resolved (one level per join; deeper names fall back to fh:<hash>/name).
    max_path_depth: int = 32


TRANSACTION_COLUMNS: tuple[Column, ...] = TRANSACTION_COMMON + (
    column("message", np.uint32, "the call's message in nfs_messages (with op_index: its row)"),
    column("op_index", np.uint32, "position of the operation in its COMPOUND (0 otherwise)"),
    column("xid", np.uint32, "transaction id (RFC 5531 §9)"),
    column("program", np.uint32, "RPC program (100003 NFS, 100005 MOUNT, 100000 PORTMAP, a callback program)"),
    column("version", np.uint32, "program version (3, 4 ...)"),
    column("procedure", np.uint32, "procedure number"),
    column("minorversion", np.uint32, "NFSv4 minorversion of the COMPOUND"),
    column("is_callback", np.bool_, "a CB_COMPOUND operation: the server called the client (RFC 8881 §20)"),
    column("retransmissions", np.uint32, "calls repeated with the same xid before the reply (RFC 5531 §9)"),
    column("last_call_frame", np.uint32, "frame of the last of those calls"),
    column("last_call_ts_ns", np.int64, "time of the last of those calls"),
    column("replies", np.uint32, "replies seen to the calls of this transaction (more than 1: duplicates "
         "answered from the server's duplicate request cache, or to each retransmission)"),
    column("auth_flavor", np.uint32, "credential flavour of the call"),
    column("auth_uid", np.uint32, "AUTH_SYS uid of the call"),
    column("machine", object, "AUTH_SYS machinename of the call", polars=pl.String),
    column("path", object, "path resolved from the handles and names seen earlier (see the module doc); null "
         "when unknown", polars=pl.String),
    column("name", object, "the name the operation names (LOOKUP, OPEN, CREATE, REMOVE ...)", polars=pl.String),
    column("fh_hash", np.uint32, "CRC-32 of the handle of the call (PUTFH's for NFSv4, as nfs.fh.hash)"),
    column("result_fh_hash", np.uint32, "CRC-32 of the handle the reply returned (LOOKUP, GETFH ...)"),
    column("offset", np.uint64, "READ/WRITE/LOCK offset"),
    column("length", np.uint64, "READ/WRITE count, LOCK length"),
    column("lock_type", object, "LOCK/LOCKT/LOCKU locktype", polars=pl.String),
    column("share_access", np.uint32, "OPEN share_access"),
    column("share_deny", np.uint32, "OPEN share_deny"),
    column("claim_type", object, "OPEN claim", polars=pl.String),
    column("delegation_type", object, "OPEN result: delegation granted", polars=pl.String),
    column("owner", object, "OPEN/LOCK/LOCKT owner (hex)", polars=pl.String),
    column("denied_owner", object, "NFS4ERR_DENIED: the owner holding the conflicting lock (hex)", polars=pl.String),
    column("denied_clientid", np.uint64, "NFS4ERR_DENIED: its clientid"),
    column("denied_offset", np.uint64, "NFS4ERR_DENIED: the conflicting lock's offset"),
    column("denied_length", np.uint64, "NFS4ERR_DENIED: the conflicting lock's length"),
    column("stateid", object, "stateid the call names, else the one the reply returns (hex of 'other')",
         polars=pl.String),
    column("sessionid", object, "the COMPOUND's SEQUENCE sessionid (4.1)", polars=pl.String),
    column("slotid", np.uint32, "the COMPOUND's SEQUENCE slotid"),
    column("sequenceid", np.uint32, "the COMPOUND's SEQUENCE sequenceid"),
    column("highest_slotid", np.uint32, "the reply's SEQUENCE highest_slotid (the server's)"),
)
TRANSACTION_NAMES = tuple(c.name for c in TRANSACTION_COLUMNS)

_OK_STATUS = ("SUCCESS", "NFS3_OK", "NFS4_OK", "MNT3_OK", "NLM4_GRANTED", "NLM4_BLOCKED")


def _retransmissions(calls: pl.DataFrame, replies: pl.DataFrame, params: Params) -> pl.DataFrame:
    """calls (one row per call message) with ``chain`` (the first call's message) and reply ts of itself."""
    key = ["flow", "xid", "caller", "caller_port"]
    calls = calls.sort("ts_last_ns", "message")
    if replies.height:
        r = replies.select(*key, pl.col("message").alias("r_message"), pl.col("ts_last_ns").alias("_on"))
        l = calls.select(*key, pl.col("message").alias("c_message"), pl.col("ts_last_ns").alias("_on"))
        paired = asof_join(r.sort("_on"), l.sort("_on"), on="_on", by=key, strategy="backward") \
            .drop_nulls("c_message").group_by("c_message").agg(pl.col("_on").min().alias("reply_ts"))
        calls = calls.join(paired.rename({"c_message": "message"}), on="message", how="left")
    else:
        calls = calls.with_columns(pl.lit(None, pl.Int64).alias("reply_ts"))
    same = [*key, "program", "version", "procedure"]
    calls = calls.sort(*same, "ts_last_ns", "message", nulls_last=True)
    prev_ts = pl.col("ts_last_ns").shift(1).over(same)
    prev_reply = pl.col("reply_ts").shift(1).over(same)
    retrans = (prev_ts.is_not_null() & prev_reply.is_null()
               & (pl.col("ts_last_ns") - prev_ts <= params.retransmission_window_ns)).fill_null(False)
    calls = calls.with_columns(retrans.alias("_retrans")).with_columns(
        (~pl.col("_retrans")).cum_sum().over(same).alias("_run"))
    return calls.with_columns(pl.col("message").first().over(*same, "_run").alias("chain"))


def _paths(msgs: pl.DataFrame, call_rows: pl.DataFrame, reply_rows: pl.DataFrame, params: Params) -> pl.DataFrame:
    """id -> path for every object id the capture names (see the module doc)."""
    edges = msgs.filter((pl.col("msg_type") == "CALL") & pl.col("name").is_not_null() & pl.col("cur_id").is_not_null()
                        & pl.col("dir_id").is_not_null()).select(
        pl.col("cur_id").alias("id"), pl.col("dir_id").alias("parent"),
        pl.col("name").str.strip_chars("/").alias("name"))
    alias = call_rows.select("chain", "op_index", pl.col("cur_id").alias("parent")).join(
        reply_rows.select("chain", "op_index", pl.col("fh_hash").cast(pl.Int64).alias("id")),
        on=["chain", "op_index"]).drop_nulls().select("id", "parent", pl.lit(None, pl.String).alias("name"))
    links = pl.concat([edges, alias]).filter(pl.col("id") != pl.col("parent")).unique("id", keep="first")
    # handles whose own name was never seen (a mount root from an uncaptured MNT) head a path of their own
    roots = links.select(pl.col("parent").alias("id")).unique().join(links, on="id", how="anti") \
        .filter((pl.col("id") >= 0) & (pl.col("id") < int(X.ROOT_ID))) \
        .select("id", pl.concat_str([pl.lit("fh:"), _hex8(pl.col("id"))]).alias("path"))
    known = pl.concat([pl.DataFrame({"id": [int(X.ROOT_ID)], "path": [""]}, schema={"id": pl.Int64, "path": pl.String}),
                       roots])
    for _ in range(params.max_path_depth):
        step = links.join(known, on="id", how="anti").join(known.rename({"id": "parent", "path": "ppath"}),
                                                            on="parent").select(
            "id", pl.when(pl.col("name").is_null()).then(pl.col("ppath"))
            .otherwise(pl.concat_str([pl.col("ppath"), pl.lit("/"), pl.col("name")])).alias("path"))
        if step.height == 0:
            break
        known = pl.concat([known, step])
    return known.with_columns(pl.when(pl.col("path") == "").then(pl.lit("/")).otherwise(pl.col("path")).alias("path"))


def _hex8(v: pl.Expr) -> pl.Expr:
    """A 32-bit value as 8 lower-case hex digits, vectorised (as Wireshark prints nfs.fh.hash)."""
    digits = [str(d) for d in "0123456789abcdef"]
    return pl.concat_str([((v // (16 ** (7 - n))) % 16).replace_strict(list(range(16)), digits, return_dtype=pl.String)
                          for n in range(8)])


def pair_transactions(messages: pl.DataFrame, params: Params = Params()) -> pl.DataFrame:
    """The ``nfs_transactions`` frame (see the module doc)."""
    if messages.height == 0:
        return pl.DataFrame(schema=schema_of(TRANSACTION_COLUMNS))
    msgs = messages.with_columns(pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String))
    heads = msgs.filter(pl.col("op_index") == 0)
    calls = heads.filter(pl.col("msg_type") == "CALL").with_columns(
        pl.col("src").alias("caller"), pl.col("sport").alias("caller_port"))
    replies = heads.filter(pl.col("msg_type") == "REPLY").with_columns(
        pl.col("dst").alias("caller"), pl.col("dport").alias("caller_port"))
    calls = _retransmissions(calls, replies, params)
    chain_of = calls.select("message", "chain")
    # replies -> the call (message) they answer -> its chain
    key = ["flow", "xid", "caller", "caller_port"]
    r = replies.select(*key, "message", pl.col("ts_last_ns").alias("_on"))
    l = calls.select(*key, pl.col("chain"), pl.col("ts_last_ns").alias("_on"))
    reply_chain = asof_join(r.sort("_on"), l.sort("_on"), on="_on", by=key, strategy="backward") \
        .drop_nulls("chain").select("message", "chain")
    first_reply = reply_chain.join(replies.select("message", "ts_last_ns"), on="message") \
        .sort("ts_last_ns", "message").group_by("chain").agg(
        pl.col("message").first().alias("r_message"), pl.len().alias("replies"))
    runs = calls.group_by("chain").agg(
        (pl.len() - 1).alias("retransmissions"), pl.col("frame_last").max().alias("last_call_frame"),
        pl.col("ts_last_ns").max().alias("last_call_ts_ns")).join(first_reply, on="chain", how="left")

    call_rows = msgs.filter(pl.col("msg_type") == "CALL").join(chain_of, on="message") \
        .filter(pl.col("message") == pl.col("chain"))
    reply_rows = msgs.filter(pl.col("msg_type") == "REPLY").join(
        runs.select("chain", pl.col("r_message").alias("message")).drop_nulls(), on="message")
    paths = _paths(msgs, call_rows, reply_rows, params)

    # the COMPOUND's SEQUENCE, per call and per reply
    seq_call = call_rows.filter(pl.col("operation").is_in(["SEQUENCE", "CB_SEQUENCE"])).group_by("chain").agg(
        pl.col("sessionid").first().alias("seq_sessionid"), pl.col("slotid").first().alias("seq_slotid"),
        pl.col("sequenceid").first().alias("seq_sequenceid"))
    seq_reply = reply_rows.filter(pl.col("operation").is_in(["SEQUENCE", "CB_SEQUENCE"])).group_by("chain").agg(
        pl.col("highest_slotid").first().alias("seq_highest"))
    # operations that matter
    compound = pl.col("op_count").is_not_null() & pl.col("opcode").is_not_null()
    context = pl.col("operation").is_in(list(L.NFS4_CONTEXT_OPS))
    has_work = (~context).any().over("chain")
    last = pl.col("op_index") == pl.col("op_index").max().over("chain")
    chosen = call_rows.filter(~compound | ~context | (~has_work & last))

    rep = reply_rows.select(
        "chain", "op_index", pl.col("frame_last").alias("r_frame"), pl.col("ts_last_ns").alias("r_ts"),
        pl.col("status").alias("r_status"), pl.col("fh_hash").alias("result_fh_hash"),
        pl.col("delegation_type").alias("r_deleg"), pl.col("owner").alias("denied_owner_"),
        pl.col("clientid").alias("r_clientid"), pl.col("denied_offset").alias("r_doff"),
        pl.col("denied_length").alias("r_dlen"), pl.col("stateid").alias("r_stateid"),
        pl.col("op_status").alias("r_op_status"))
    rhead = reply_rows.filter(pl.col("op_index") == 0).select(
        "chain", pl.col("frame_last").alias("h_frame"), pl.col("ts_last_ns").alias("h_ts"),
        pl.col("reply_stat").alias("h_reply_stat"), pl.col("accept_stat").alias("h_accept_stat"),
        pl.col("nfs_status").alias("h_nfs_status"), pl.col("status").alias("h_status"),
        pl.col("op_count").alias("h_ops"))
    q = (chosen.join(runs, on="chain", how="left").join(rhead, on="chain", how="left")
         .join(rep, on=["chain", "op_index"], how="left")
         .join(seq_call, on="chain", how="left").join(seq_reply, on="chain", how="left"))
    # status: the operation's own, else (the reply stopped before it, or a plain RPC reply) the header's
    compound_status = pl.when(pl.col("h_nfs_status").is_not_null() & (pl.col("h_reply_stat") == 0)
                              & (pl.col("h_accept_stat") == 0)).then(
        pl.col("h_nfs_status").replace_strict(list(L.NFS4_STATUS), list(L.NFS4_STATUS.values()), default=None,
                                              return_dtype=pl.String))
    status = pl.when(pl.col("r_op_status").is_not_null()).then(pl.col("r_status")) \
        .when(compound & compound_status.is_not_null()).then(compound_status).otherwise(pl.col("h_status"))
    answered = pl.col("h_frame").is_not_null()
    dir_path = pl.col("dir_path")
    q = q.join(paths.rename({"id": "dir_id", "path": "dir_path"}), on="dir_id", how="left") \
        .join(paths.rename({"id": "cur_id", "path": "cur_path"}), on="cur_id", how="left")
    fh_of = lambda c: pl.when((pl.col(c) >= 0) & (pl.col(c) < int(X.ROOT_ID))).then(
        pl.concat_str([pl.lit("fh:"), _hex8(pl.col(c))]))
    named_path = pl.concat_str([pl.when(dir_path == "/").then(pl.lit("")).otherwise(dir_path), pl.lit("/"),
                                pl.col("name").str.strip_chars("/")])
    path = pl.when(pl.col("name").is_not_null() & dir_path.is_not_null()).then(named_path) \
        .when(pl.col("name").is_not_null()).then(None).otherwise(pl.col("cur_path"))
    unresolved = pl.when(pl.col("name").is_not_null()).then(
        pl.concat_str([pl.coalesce(fh_of("dir_id"), pl.lit("?")), pl.lit("/"), pl.col("name")])) \
        .otherwise(fh_of("cur_id"))
    out = q.with_columns(path.alias("path")).sort("ts_last_ns", "message", "op_index").select(
        pl.lit("nfs").alias("protocol"), "transport", "flow",
        pl.col("src").alias("client"), pl.col("sport").alias("client_port"),
        pl.col("dst").alias("server"), pl.col("dport").alias("server_port"),
        "operation",
        pl.coalesce("path", unresolved).alias("resource"),
        pl.col("frame_last").alias("request_frame"), pl.col("h_frame").alias("response_frame"),
        pl.col("ts_last_ns").alias("request_ts_ns"), pl.col("h_ts").alias("response_ts_ns"),
        (pl.col("h_ts") - pl.col("ts_last_ns")).alias("latency_ns"),
        pl.when(answered).then(status).alias("status"),
        (answered & ~status.is_in(list(_OK_STATUS)).fill_null(False)).alias("is_error"),
        answered.alias("answered"),
        "message", "op_index", "xid", "program", "version", "procedure", "minorversion", "is_callback",
        "retransmissions", "last_call_frame", "last_call_ts_ns", pl.col("replies").fill_null(0),
        "auth_flavor", "auth_uid", "machine", "path", "name", "fh_hash", "result_fh_hash", "offset", "length",
        "lock_type", "share_access", "share_deny", "claim_type", pl.col("r_deleg").alias("delegation_type"),
        "owner", pl.col("denied_owner_").alias("denied_owner"),
        pl.when(pl.col("r_doff").is_not_null()).then(pl.col("r_clientid")).alias("denied_clientid"),
        pl.col("r_doff").alias("denied_offset"), pl.col("r_dlen").alias("denied_length"),
        pl.coalesce("stateid", "r_stateid").alias("stateid"),
        pl.coalesce("sessionid", "seq_sessionid").alias("sessionid"),
        pl.coalesce("slotid", "seq_slotid").alias("slotid"),
        pl.coalesce("sequenceid", "seq_sequenceid").alias("sequenceid"),
        pl.col("seq_highest").alias("highest_slotid"),
    ).with_columns(pl.when(pl.col("denied_offset").is_not_null()).then(pl.col("denied_owner")).alias("denied_owner"))
    return out.cast(schema_of(TRANSACTION_COLUMNS)).select(TRANSACTION_NAMES)
