"""SMB2 transactions and breaks, from the ``smb2_messages`` frame (vectorised Polars, no row loops).

Transactions (MS-SMB2 3.2.5.1, 3.3.4.1): a request and its final response share the connection and
the MessageId; compound elements (3.2.4.1.4) each have their own MessageId, so they pair the same way.
A server that cannot answer at once sends an interim response, STATUS_PENDING with the async header
form and an AsyncId (3.3.4.2), then the final response with the same MessageId and AsyncId: the
interim frame and the wait from interim to final are kept. CANCEL (2.2.30) is never answered; it
carries the MessageId (sync form) or the AsyncId (async form) of the request it cancels, and is paired
to it. CHANGE_NOTIFY is pending by design: it is answered only when something changes.

Paths: TREE_CONNECT request path → TreeId from its response, per server and session; CREATE request
name + share → FileId from its response, per server, session and tree; later requests carrying that
FileId get the path. (Per server, not per connection: with multichannel a session, its trees and its
opens are used over several connections, MS-SMB2 3.2.4.1.7, 3.3.5.5.2.) In related compounds
(3.2.4.1.4) the elements after a CREATE use FileId 0xFFFFFFFFFFFFFFFF and take the CREATE's;
SessionId/TreeId are inherited likewise. Lease keys (2.2.13.2.8) map to the paths of the CREATEs that
requested them.

Breaks (3.3.4.6, 3.3.4.7): one row per oplock or lease break notification with its acknowledgment
(the first acknowledgment for the same FileId or LeaseKey on the same server after it, that no later
notification took), the server's response to the acknowledgment, and the request that triggered it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import polars as pl
from numba import njit

from ..schema import Column, column, polars_type
from . import smb2_tables as t
from .common import TRANSACTION_COMMON
from .ntstatus import STATUS_PENDING, status_is_error, status_names

ALL_ONES = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class Params:
    """Windows for the break analysis."""

    # a request can have triggered a break only if it was sent at most this long before the notification
    trigger_window_ns: int = 2_000_000_000


TRANSACTION_COLUMNS: tuple[Column, ...] = TRANSACTION_COMMON + (
    column("message", np.uint32, "the request's NBSS message in smb2_messages (with chain_index: its row)"),
    column("chain_index", np.uint32, "position of the request in its compound chain (MS-SMB2 3.2.4.1.4)"),
    column("compound_size", np.uint32, "number of SMB2 headers in the request's NBSS message; 1 = not "
         "compounded"),
    column("message_id", np.uint64, "MessageId shared by request and responses (MS-SMB2 2.2.1.2)"),
    column("session_id", np.uint64, "SessionId of the request, inherited in related compounds (MS-SMB2 "
         "3.3.5.2.7.2)"),
    column("tree_id", np.uint32, "TreeId of the request, inherited in related compounds"),
    column("async_id", np.uint64, "AsyncId the server gave the request in its interim response (MS-SMB2 "
         "3.3.4.2)"),
    column("status_code", np.uint32, "NTSTATUS of the final response (MS-SMB2 2.2.1.1)"),
    column("share", object, "share path (\\\\server\\share) of the request's TreeId, from the TREE_CONNECT "
         "(MS-SMB2 2.2.9; a TREE_CONNECT's own path); null when that was not captured", polars=pl.String),
    column("path", object, "file path: share + '\\' + the CREATE name of the FileId the request uses (or "
         "the CREATE's own); the name alone when the TREE_CONNECT was not captured", polars=pl.String),
    column("fid_persistent", np.uint64, "FileId.Persistent the request uses (the CREATE's: from its response)"),
    column("fid_volatile", np.uint64, "FileId.Volatile the request uses (the CREATE's: from its response)"),
    column("interim_frame", np.uint32, "frame of the interim STATUS_PENDING response (MS-SMB2 3.3.4.2); null "
         "when the server answered at once"),
    column("interim_ts_ns", np.int64, "time of the interim response"),
    column("pending_ns", np.int64, "interim → final response: how long the request sat pending at the "
         "server; null when it never went pending or was never answered"),
    column("pending_by_design", np.bool_, "CHANGE_NOTIFY: answered only when something changes (MS-SMB2 "
         "3.3.5.19), so a long wait is not a stall"),
    column("expects_response", np.bool_, "False for CANCEL, which is never answered (MS-SMB2 3.3.5.16)"),
    column("cancel_frame", np.uint32, "frame of a CANCEL that targeted this request (MS-SMB2 2.2.30)"),
    column("cancel_ts_ns", np.int64, "time of that CANCEL"),
    column("cancels_frame", np.uint32, "on a CANCEL: the request frame it targets"),
    column("oplock", object, "CREATE: oplock level requested (MS-SMB2 2.2.13); OPLOCK_BREAK ack: level "
         "acknowledged", polars=pl.Enum(t.OPLOCK_NAMES)),
    column("granted_oplock", object, "CREATE: oplock level granted (MS-SMB2 2.2.14)",
         polars=pl.Enum(t.OPLOCK_NAMES)),
    column("lease_key", object, "CREATE: LeaseKey requested (MS-SMB2 2.2.13.2.8); requests on a FileId: the "
         "LeaseKey its CREATE requested; lease break ack: the key (MS-SMB2 2.2.24.2)", polars=pl.String),
    column("lease_state", np.uint32, "CREATE: lease state requested; lease break ack: state acknowledged"),
    column("granted_lease_state", np.uint32, "CREATE: lease state granted (MS-SMB2 2.2.14.2.10)"),
    column("create_disposition", object, "CREATE: CreateDisposition (MS-SMB2 2.2.13)",
         polars=pl.Enum(t.DISPOSITION_NAMES)),
    column("create_options", np.uint32, "CREATE: CreateOptions (MS-SMB2 2.2.13)"),
    column("desired_access", np.uint32, "CREATE: DesiredAccess (MS-SMB2 2.2.13)"),
    column("share_access", np.uint32, "CREATE: ShareAccess (MS-SMB2 2.2.13)"),
    column("create_action", object, "CREATE: CreateAction of the response (MS-SMB2 2.2.14)",
         polars=pl.Enum(t.ACTION_NAMES)),
    column("break_kind", object, "OPLOCK_BREAK requests: oplock_break_ack or lease_break_ack",
         polars=pl.Enum(t.BREAK_KINDS)),
    column("file_offset", np.uint64, "READ / WRITE: Offset (MS-SMB2 2.2.19, 2.2.21)"),
    column("io_length", np.uint32, "READ / WRITE: Length requested (MS-SMB2 2.2.19, 2.2.21)"),
    column("info_class_name", object, "QUERY_INFO / SET_INFO / QUERY_DIRECTORY information class (MS-FSCC 2.4)",
         polars=pl.String),
    column("target_name", object, "SET_INFO rename / link: the new name (MS-FSCC 2.4.37.2)", polars=pl.String),
    column("delete_pending", np.bool_, "SET_INFO FileDispositionInformation: delete on close requested"),
    column("ioctl", object, "IOCTL: the FSCTL name or 0xXXXXXXXX (MS-SMB2 2.2.31)", polars=pl.String),
)
TRANSACTION_NAMES = tuple(c.name for c in TRANSACTION_COLUMNS)

BREAK_COLUMNS: tuple[Column, ...] = (
    column("flow", np.uint32, "connection the notification came on"),
    column("client", object, "client address the notification went to", polars=pl.String),
    column("client_port", np.uint16, "client port"),
    column("server", object, "server address", polars=pl.String),
    column("server_port", np.uint16, "server port"),
    column("frame", np.uint32, "frame of the break notification (MS-SMB2 2.2.23.1 / 2.2.23.2)"),
    column("ts_ns", np.int64, "time of the break notification"),
    column("kind", object, "oplock or lease", polars=pl.Enum(["oplock", "lease"])),
    column("fid_persistent", np.uint64, "oplock breaks: FileId.Persistent (MS-SMB2 2.2.23.1)"),
    column("fid_volatile", np.uint64, "oplock breaks: FileId.Volatile"),
    column("lease_key", object, "lease breaks: LeaseKey (MS-SMB2 2.2.23.2)", polars=pl.String),
    column("old_state", object, "before: the oplock level (the level of the previous break of the same "
         "FileId, else the one the CREATE granted: level2, exclusive, batch) or the CurrentLeaseState as "
         "letters (RWH, RH, R ...)", polars=pl.String),
    column("new_state", object, "after: the oplock level to break to, or the NewLeaseState as letters; "
         "'none' for nothing", polars=pl.String),
    column("current_lease_state", np.uint32, "lease breaks: CurrentLeaseState (MS-SMB2 2.2.23.2)"),
    column("new_lease_state", np.uint32, "lease breaks: NewLeaseState (MS-SMB2 2.2.23.2)"),
    column("break_reason", np.uint32, "lease breaks: BreakReason (MS-SMB2 2.2.23.2)"),
    column("ack_required", np.bool_, "an acknowledgment is expected: oplock breaks from exclusive/batch, "
         "not from level II (MS-SMB2 3.3.4.6); lease breaks with SMB2_NOTIFY_BREAK_LEASE_FLAG_ACK_REQUIRED "
         "(2.2.23.2)"),
    column("lease_epoch", np.uint16, "lease breaks: NewEpoch (MS-SMB2 2.2.23.2)"),
    column("share", object, "share of the open that was broken", polars=pl.String),
    column("path", object, "path of the open (oplock: by FileId; lease: the latest CREATE that requested "
         "the LeaseKey)", polars=pl.String),
    column("lease_paths", object, "lease breaks: every path a CREATE requested the LeaseKey for, before the "
         "notification", polars=pl.List(pl.String)),
    column("owner_flow", np.uint32, "connection of the CREATE that obtained the oplock or lease"),
    column("owner_frame", np.uint32, "frame of that CREATE request"),
    column("ack_frame", np.uint32, "frame of the acknowledgment (MS-SMB2 2.2.24); null if never acknowledged"),
    column("ack_ts_ns", np.int64, "time of the acknowledgment"),
    column("ack_latency_ns", np.int64, "notification → acknowledgment: how long the client sat on the break"),
    column("ack_state", object, "the level or lease state acknowledged", polars=pl.String),
    column("ack_response_frame", np.uint32, "frame of the server's response to the acknowledgment (MS-SMB2 "
         "2.2.25)"),
    column("ack_response_ts_ns", np.int64, "time of that response"),
    column("ack_response_status", object, "NTSTATUS of that response", polars=pl.String),
    column("trigger_frame", np.uint32, "frame of the request that caused the break: the latest request on the "
         "same path (or, for a directory lease, under it) sent at most Params.trigger_window_ns before the "
         "notification, by another open; one that waited for the break (answered after the ack, or never) "
         "is preferred"),
    column("trigger_flow", np.uint32, "connection of the triggering request"),
    column("trigger_client", object, "client address of the triggering request", polars=pl.String),
    column("trigger_operation", object, "command of the triggering request", polars=pl.String),
    column("trigger_path", object, "path of the triggering request", polars=pl.String),
    column("trigger_status", object, "final NTSTATUS of the triggering request", polars=pl.String),
    column("trigger_response_frame", np.uint32, "frame of its final response"),
    column("trigger_wait_ns", np.int64, "its latency: how long it waited (null when unanswered)"),
    column("trigger_match", object, "blocked: it was answered only after the acknowledgment (or never), on "
         "another connection or session than the open that was broken: the break queue; preceding: the "
         "latest request that could have caused the break, answered before that",
         polars=pl.Enum(["blocked", "preceding"])),
)
BREAK_NAMES = tuple(c.name for c in BREAK_COLUMNS)

_KEY = ["message", "chain_index"]


def _asof_join(left: pl.DataFrame, right: pl.DataFrame, **kwargs) -> pl.DataFrame:
    """``join_asof``; both sides are sorted on the ``on`` key by the caller (Polars cannot check
    sortedness within ``by`` groups and warns)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sortedness of columns cannot be checked")
        return left.join_asof(right, **kwargs)


def _schema(columns) -> dict[str, pl.DataType]:
    return {c.name: polars_type(c) for c in columns}


def _lease_letters(state: pl.Expr) -> pl.Expr:
    s = state.cast(pl.Int64)
    letters = pl.concat_str([
        pl.when((s // 1) % 2 == 1).then(pl.lit("R")).otherwise(pl.lit("")),
        pl.when((s // 4) % 2 == 1).then(pl.lit("W")).otherwise(pl.lit("")),
        pl.when((s // 2) % 2 == 1).then(pl.lit("H")).otherwise(pl.lit("")),
    ])
    return pl.when(state.is_null()).then(None).when(s == 0).then(pl.lit("none")).otherwise(letters)


def _path_key(share: pl.Expr, name: pl.Expr) -> pl.Expr:
    """Case-insensitive key of share name + file name: \\\\srv\\Share + dir\\F → share\\dir\\f, so
    clients that name the server differently (address, NetBIOS or DNS name) still match."""
    share_name = share.str.replace(r"^.*\\", "")
    clean = name.str.strip_chars("\\")
    key = pl.when(clean.is_null() | (clean == "")).then(share_name) \
        .otherwise(pl.concat_str([share_name, pl.lit("\\"), clean]))
    return key.str.to_lowercase()


def _join_path(share: pl.Expr, name: pl.Expr) -> pl.Expr:
    clean = name.str.strip_chars_start("\\")
    return (pl.when(share.is_null()).then(clean)
            .when(clean.is_null() | (clean == "")).then(share)
            .otherwise(pl.concat_str([share, pl.lit("\\"), clean])))


_USED = ("transport", "flow", "src", "dst", "sport", "dport", "frame_last", "ts_last_ns", "message", "chain_index",
         "command", "is_response", "is_async", "is_related", "status_code", "message_id", "async_id", "tree_id",
         "session_id", "tree", "filename", "fid_persistent", "fid_volatile", "oplock", "lease_key", "lease_state",
         "new_lease_state", "lease_flags", "lease_epoch", "break_kind", "break_reason", "create_action",
         "create_disposition", "create_options", "desired_access", "share_access", "file_offset", "io_length",
         "info_class_name", "target_name", "delete_pending", "ioctl")


def _smb2_rows(messages: pl.DataFrame) -> pl.DataFrame:
    """SMB2 rows in wire order with an ordinal ``ord``, the compound size, and SessionId / TreeId
    inherited by related compound elements (only the columns pairing uses)."""
    rows = messages.filter(pl.col("kind") == "smb2").select(_USED).sort("frame_last", "message", "chain_index")
    related = pl.col("is_related").fill_null(False) & (pl.col("chain_index") > 0)
    return rows.with_row_index("ord").with_columns(
        pl.col("ord").cast(pl.Int64),
        pl.len().over("message").cast(pl.UInt32).alias("compound_size"),
        pl.when(related).then(None).otherwise(pl.col("session_id")).forward_fill().over("message")
        .alias("session_id"),
        pl.when(related).then(None).otherwise(pl.col("tree_id")).forward_fill().over("message")
        .alias("tree_id"),
    )


def _first_match(left: pl.DataFrame, right: pl.DataFrame, by: list[str], prefix: str) -> pl.DataFrame:
    """For each row of ``right`` (responses), the latest ``left`` row (request) at or before it with the
    same ``by`` keys; then, per request, the first such response. Returns ``left_ord`` → ``prefix*``."""
    if left.height == 0 or right.height == 0:
        return pl.DataFrame(schema={"left_ord": pl.Int64, f"{prefix}ord": pl.Int64})
    l = left.select(*by, pl.col("ord").alias("left_ord"), pl.col("ord").alias("_on")).drop_nulls(by).sort("_on")
    r = right.select(*by, pl.col("ord").alias(f"{prefix}ord"), pl.col("ord").alias("_on")).drop_nulls(by) \
        .sort("_on")
    matched = _asof_join(r, l, on="_on", by=by, strategy="backward").drop_nulls("left_ord")
    return matched.group_by("left_ord").agg(pl.col(f"{prefix}ord").min())


def pair_transactions(messages: pl.DataFrame, params: Params = Params()) -> pl.DataFrame:
    """The ``smb2_transactions`` frame (see the module doc)."""
    rows = _smb2_rows(messages)
    if rows.height == 0:
        return pl.DataFrame(schema=_schema(TRANSACTION_COLUMNS))
    unsolicited = pl.col("message_id") == ALL_ONES
    requests = rows.filter(~pl.col("is_response").fill_null(False) & pl.col("message_id").is_not_null())
    responses = rows.filter(pl.col("is_response").fill_null(False) & ~unsolicited)
    interim = responses.filter(pl.col("status_code") == STATUS_PENDING)
    final = responses.filter(pl.col("status_code") != STATUS_PENDING)
    is_cancel = pl.col("command") == "CANCEL"
    answerable = requests.filter(~is_cancel)
    by = ["flow", "message_id"]
    final_of = _first_match(answerable, final, by, "final_")
    interim_of = _first_match(answerable, interim, by, "interim_")

    resp_cols = rows.select(
        "ord", "frame_last", "ts_last_ns", "status_code", "async_id", "fid_persistent", "fid_volatile",
        "oplock", "lease_state", "create_action", "tree_id", "session_id")
    fin = resp_cols.rename({c: f"final_{c}" for c in resp_cols.columns})
    itm = resp_cols.select("ord", "frame_last", "ts_last_ns", "async_id").rename(
        {"ord": "interim_ord", "frame_last": "interim_frame", "ts_last_ns": "interim_ts_ns",
         "async_id": "interim_async_id"})
    q = (requests.join(final_of.rename({"left_ord": "ord"}), on="ord", how="left")
         .join(fin, on="final_ord", how="left")
         .join(interim_of.rename({"left_ord": "ord"}), on="ord", how="left")
         .join(itm, on="interim_ord", how="left"))

    q = _cancels(q, rows)
    q = _paths(q)

    answered = pl.col("final_ord").is_not_null()
    status = pl.col("final_status_code")
    out = q.sort("ord").select(
        pl.lit("smb2").alias("protocol"),
        "transport", "flow",
        pl.col("src").cast(pl.String).alias("client"), pl.col("sport").alias("client_port"),
        pl.col("dst").cast(pl.String).alias("server"), pl.col("dport").alias("server_port"),
        pl.col("command").cast(pl.String).alias("operation"),
        pl.when(pl.col("command") == "TREE_CONNECT").then(pl.col("tree"))
        .otherwise(pl.coalesce("path", "share")).alias("resource"),
        pl.col("frame_last").alias("request_frame"),
        pl.col("final_frame_last").alias("response_frame"),
        pl.col("ts_last_ns").alias("request_ts_ns"),
        pl.col("final_ts_last_ns").alias("response_ts_ns"),
        (pl.col("final_ts_last_ns") - pl.col("ts_last_ns")).alias("latency_ns"),
        status_names(status).alias("status"),
        pl.when(answered).then(status_is_error(status)).otherwise(False).alias("is_error"),
        answered.alias("answered"),
        "message", "chain_index", "compound_size", "message_id", "session_id", "tree_id",
        pl.coalesce("interim_async_id", "final_async_id", "async_id").alias("async_id"),
        status.alias("status_code"),
        "share", "path",
        pl.col("fid_p").alias("fid_persistent"), pl.col("fid_v").alias("fid_volatile"),
        "interim_frame", "interim_ts_ns",
        (pl.col("final_ts_last_ns") - pl.col("interim_ts_ns")).alias("pending_ns"),
        (pl.col("command") == "CHANGE_NOTIFY").alias("pending_by_design"),
        (pl.col("command") != "CANCEL").alias("expects_response"),
        "cancel_frame", "cancel_ts_ns", "cancels_frame",
        "oplock", pl.col("final_oplock").alias("granted_oplock"),
        "lease_key", "lease_state",
        pl.when(pl.col("command") == "CREATE").then(pl.col("final_lease_state")).alias("granted_lease_state"),
        "create_disposition", "create_options", "desired_access", "share_access",
        pl.col("final_create_action").alias("create_action"),
        "break_kind", "file_offset", "io_length", "info_class_name", "target_name", "delete_pending", "ioctl",
    )
    return out.cast(_schema(TRANSACTION_COLUMNS)).select(TRANSACTION_NAMES)


def _cancels(q: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """CANCEL → the request it targets: by AsyncId (async form, the interim response's) or else by
    MessageId (sync form), the latest such request before the CANCEL (MS-SMB2 3.2.4.24)."""
    is_cancel = pl.col("command") == "CANCEL"
    cancels = q.filter(is_cancel).select("ord", "flow", "message_id", "async_id", "is_async",
                                         pl.col("frame_last").alias("c_frame"),
                                         pl.col("ts_last_ns").alias("c_ts"))
    targets = q.filter(~is_cancel)
    empty = pl.DataFrame(schema={"ord": pl.Int64, "target_ord": pl.Int64})
    links = [empty]
    if cancels.height and targets.height:
        by_async = cancels.filter(pl.col("is_async").fill_null(False) & pl.col("async_id").is_not_null()).join(
            targets.filter(pl.col("interim_async_id").is_not_null()).select(
                "flow", pl.col("interim_async_id").alias("async_id"), pl.col("ord").alias("target_ord")),
            on=["flow", "async_id"], how="inner")
        links.append(by_async.select("ord", "target_ord"))
        sync = cancels.join(by_async.select("ord"), on="ord", how="anti")
        l = targets.select("flow", "message_id", pl.col("ord").alias("target_ord"), pl.col("ord").alias("_on")) \
            .drop_nulls(["message_id"]).sort("_on")
        r = sync.select("ord", "flow", "message_id", pl.col("ord").alias("_on")).sort("_on")
        by_id = _asof_join(r, l, on="_on", by=["flow", "message_id"], strategy="backward").drop_nulls("target_ord")
        links.append(by_id.select("ord", "target_ord"))
    link = pl.concat(links).unique("ord", keep="first")
    frames = q.select(pl.col("ord").alias("target_ord"), pl.col("frame_last").alias("cancels_frame"))
    first_cancel = link.join(cancels.select("ord", "c_frame", "c_ts"), on="ord").sort("ord") \
        .group_by("target_ord", maintain_order=True).first() \
        .select(pl.col("target_ord").alias("ord"), pl.col("c_frame").alias("cancel_frame"),
                pl.col("c_ts").alias("cancel_ts_ns"))
    return (q.join(link.join(frames, on="target_ord", how="left").select("ord", "cancels_frame"), on="ord",
                   how="left")
            .join(first_cancel, on="ord", how="left"))


def _paths(q: pl.DataFrame) -> pl.DataFrame:
    """share (TreeId → TREE_CONNECT path), path and effective FileId (see the module doc)."""
    ok = pl.col("final_status_code") == 0
    # A session, and its tree connects and opens, can span connections (multichannel, MS-SMB2 3.2.4.1.7,
    # 3.3.5.5.2), so trees and FileIds are looked up per server and SessionId, not per connection.
    q = q.with_columns(pl.col("dst").cast(pl.String).alias("_server"))
    trees = q.filter((pl.col("command") == "TREE_CONNECT") & ok).select(
        "_server", pl.col("final_session_id").alias("session_id"), pl.col("final_tree_id").alias("tree_id"),
        pl.col("tree").alias("share"), pl.col("final_ord").alias("_on")).drop_nulls(["tree_id", "session_id"])
    q = _asof(q, trees, ["_server", "session_id", "tree_id"], ["share"])
    q = q.with_columns(pl.when(pl.col("command") == "TREE_CONNECT").then(pl.col("tree")).otherwise(pl.col("share"))
                       .alias("share"))
    is_create = pl.col("command") == "CREATE"
    q = q.with_columns(
        pl.when(is_create).then(_join_path(pl.col("share"), pl.col("filename"))).alias("create_path"),
    )
    opens = q.filter(is_create & ok).select(
        "_server", "session_id", "tree_id", pl.col("final_fid_persistent").alias("fid_p"),
        pl.col("final_fid_volatile").alias("fid_v"), pl.col("create_path").alias("fid_path"),
        pl.col("lease_key").alias("fid_lease_key"), pl.col("final_ord").alias("_on")).drop_nulls(["fid_p", "fid_v"])
    own = pl.col("fid_persistent")
    inherit = (pl.col("is_related").fill_null(False) & (pl.col("chain_index") > 0)
               & (own == ALL_ONES) & (pl.col("fid_volatile") == ALL_ONES))
    q = q.with_columns(
        pl.when(is_create).then(pl.col("final_fid_persistent")).when(inherit).then(None).otherwise(own)
        .alias("fid_p"),
        pl.when(is_create).then(pl.col("final_fid_volatile")).when(inherit).then(None)
        .otherwise(pl.col("fid_volatile")).alias("fid_v"),
        inherit.alias("_inherit"),
    )
    q = _asof(q, opens, ["_server", "session_id", "tree_id", "fid_p", "fid_v"], ["fid_path", "fid_lease_key"])
    # related compound elements: the previous element's FileId and path (a CREATE's own, or inherited)
    q = q.sort("message", "chain_index").with_columns(
        pl.when(pl.col("_inherit")).then(None).otherwise(pl.coalesce("create_path", "fid_path"))
        .forward_fill().over("message").alias("path"),
        pl.when(pl.col("_inherit")).then(None).otherwise(pl.coalesce(
            pl.when(is_create).then(pl.col("lease_key")), "fid_lease_key"))
        .forward_fill().over("message").alias("open_lease_key"),
        pl.col("fid_p").forward_fill().over("message"),
        pl.col("fid_v").forward_fill().over("message"),
    ).with_columns(
        pl.when(pl.col("_inherit") | is_create | pl.col("fid_p").is_not_null()).then(pl.col("path"))
        .alias("path"),
        pl.when(pl.col("_inherit") | is_create | pl.col("fid_p").is_not_null()).then(pl.col("open_lease_key"))
        .alias("open_lease_key"),
    )
    # lease break acknowledgments name no FileId: the path of the latest CREATE that asked for the key
    leases = q.filter(is_create & pl.col("lease_key").is_not_null()).select(
        "_server", pl.col("lease_key").alias("_ack_key"), pl.col("create_path").alias("lease_path"),
        pl.col("ord").alias("_on"))
    q = q.with_columns(pl.when(pl.col("break_kind") == "lease_break_ack").then(pl.col("lease_key")).alias("_ack_key"))
    q = _asof(q, leases, ["_server", "_ack_key"], ["lease_path"])
    return q.with_columns(pl.coalesce("path", "lease_path").alias("path"),
                          pl.coalesce("open_lease_key", "lease_key").alias("lease_key"))


def _asof(q: pl.DataFrame, table: pl.DataFrame, by: list[str], take: list[str]) -> pl.DataFrame:
    """Attach ``take`` from the latest ``table`` row (by ``_on``) at or before each row of ``q``."""
    if table.height == 0:
        return q.with_columns([pl.lit(None, dtype=table.schema[c]).alias(c) for c in take])
    left = q.with_columns(pl.col("ord").alias("_on")).sort("_on")
    table = table.with_columns([pl.col(c).cast(left.schema[c]) for c in by]).sort("_on")
    return _asof_join(left, table.select(*by, *take, "_on"), on="_on", by=by, strategy="backward") \
        .drop("_on")


# --- breaks --------------------------------------------------------------------------------------

def break_frame(messages: pl.DataFrame, transactions: pl.DataFrame | None = None,
                params: Params = Params()) -> pl.DataFrame:
    """The ``smb2_breaks`` frame: one row per break notification (see the module doc)."""
    if transactions is None:
        transactions = pair_transactions(messages, params)
    rows = _smb2_rows(messages)
    kinds = pl.col("break_kind")
    notes = rows.filter(kinds.is_in(["oplock_break_notification", "lease_break_notification"]))
    if notes.height == 0:
        return pl.DataFrame(schema=_schema(BREAK_COLUMNS))
    lease = pl.col("break_kind") == "lease_break_notification"
    fid_key = pl.concat_str([pl.col("fid_persistent").cast(pl.String), pl.lit(":"),
                             pl.col("fid_volatile").cast(pl.String)])
    key = pl.when(lease).then(pl.col("lease_key")).otherwise(fid_key)
    n = notes.select(
        "ord", "flow", pl.col("dst").cast(pl.String).alias("client"), pl.col("dport").alias("client_port"),
        pl.col("src").cast(pl.String).alias("server"), pl.col("sport").alias("server_port"),
        pl.col("frame_last").alias("frame"), pl.col("ts_last_ns").alias("ts_ns"),
        pl.when(lease).then(pl.lit("lease")).otherwise(pl.lit("oplock")).alias("kind"),
        pl.when(~lease).then(pl.col("fid_persistent")).alias("fid_persistent"),
        pl.when(~lease).then(pl.col("fid_volatile")).alias("fid_volatile"),
        "lease_key", key.alias("bkey"), "oplock",
        pl.when(lease).then(pl.col("lease_state")).alias("current_lease_state"),
        "new_lease_state", "break_reason", "lease_flags",
        pl.when(lease).then(pl.col("lease_epoch")).alias("lease_epoch"),
    )
    # acknowledgments: the latest notification for the key at or before each ack takes it
    acks = transactions.filter(pl.col("break_kind").is_in(["oplock_break_ack", "lease_break_ack"])).join(
        rows.select("message", "chain_index", "ord", "fid_persistent", "fid_volatile",
                    pl.col("oplock").alias("ack_oplock")), on=_KEY, how="left")
    ack_key = pl.when(pl.col("break_kind") == "lease_break_ack").then(pl.col("lease_key")).otherwise(fid_key)
    a = acks.select(pl.col("server"), ack_key.alias("bkey"), pl.col("ord").alias("_on"),
                    pl.col("request_frame").alias("ack_frame"), pl.col("request_ts_ns").alias("ack_ts_ns"),
                    pl.when(pl.col("break_kind") == "lease_break_ack").then(_lease_letters(pl.col("lease_state")))
                    .otherwise(pl.col("ack_oplock").cast(pl.String)).alias("ack_state"),
                    pl.col("response_frame").alias("ack_response_frame"),
                    pl.col("response_ts_ns").alias("ack_response_ts_ns"),
                    pl.col("status").alias("ack_response_status")).drop_nulls("bkey").sort("_on")
    nk = n.select("server", "bkey", pl.col("ord").alias("note_ord"), pl.col("ord").alias("_on")).sort("_on")
    if a.height:
        taken = _asof_join(a, nk, on="_on", by=["server", "bkey"], strategy="backward").drop_nulls("note_ord") \
            .sort("_on").group_by("note_ord", maintain_order=True).first().drop("server", "bkey", "_on")
        n = n.join(taken.rename({"note_ord": "ord"}), on="ord", how="left")
    else:
        n = n.with_columns([pl.lit(None).alias(c) for c in ("ack_frame", "ack_ts_ns", "ack_state",
                                                           "ack_response_frame", "ack_response_ts_ns",
                                                           "ack_response_status")])
    n = _owners(n, transactions, rows)
    # an oplock broken before is at the level that break went to; else at the level the CREATE got
    n = n.sort("ord").with_columns(
        pl.coalesce(pl.col("oplock").cast(pl.String).shift(1).over(["server", "bkey"]), "old_oplock")
        .alias("old_oplock"))
    # MS-SMB2 3.3.4.6: a break from level II is not acknowledged; 2.2.23.2: lease breaks say so
    n = n.with_columns(
        pl.when(pl.col("kind") == "lease").then((pl.col("lease_flags") & 1) == 1)
        .otherwise(pl.col("old_oplock").is_null() | pl.col("old_oplock").is_in(["exclusive", "batch"]))
        .alias("ack_required"))
    n = _triggers(n, transactions, params)
    out = n.sort("ord").select(
        "flow", "client", "client_port", "server", "server_port", "frame", "ts_ns", "kind",
        "fid_persistent", "fid_volatile", "lease_key",
        pl.when(pl.col("kind") == "lease").then(_lease_letters(pl.col("current_lease_state")))
        .otherwise(pl.col("old_oplock").cast(pl.String)).alias("old_state"),
        pl.when(pl.col("kind") == "lease").then(_lease_letters(pl.col("new_lease_state")))
        .otherwise(pl.col("oplock").cast(pl.String)).alias("new_state"),
        "current_lease_state", "new_lease_state", "break_reason", "ack_required",
        "lease_epoch", "share", "path", "lease_paths", "owner_flow", "owner_frame",
        "ack_frame", "ack_ts_ns", (pl.col("ack_ts_ns") - pl.col("ts_ns")).alias("ack_latency_ns"),
        "ack_state", "ack_response_frame", "ack_response_ts_ns", "ack_response_status",
        "trigger_frame", "trigger_flow", "trigger_client", "trigger_operation", "trigger_path",
        "trigger_status", "trigger_response_frame", "trigger_wait_ns", "trigger_match",
    )
    return out.cast(_schema(BREAK_COLUMNS)).select(BREAK_NAMES)


def _owners(n: pl.DataFrame, tx: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """The open that held the oplock (by FileId, from CREATE responses) or lease (by LeaseKey, from
    CREATE requests), the latest before the notification, on the same server."""
    creates = tx.filter(pl.col("operation") == "CREATE").join(
        rows.select("message", "chain_index", "ord", "filename"), on=_KEY, how="left")
    ok = creates.filter(pl.col("status_code") == 0)
    fid_key = pl.concat_str([pl.col("fid_persistent").cast(pl.String), pl.lit(":"),
                             pl.col("fid_volatile").cast(pl.String)])
    by_fid = ok.select("server", fid_key.alias("bkey"), pl.col("share").alias("o_share"),
                       pl.col("path").alias("o_path"), pl.col("flow").alias("o_flow"),
                       pl.col("request_frame").alias("o_frame"),
                       pl.col("granted_oplock").cast(pl.String).alias("old_oplock"),
                       "session_id", "filename", pl.col("ord").alias("_on")).drop_nulls("bkey")
    by_lease = creates.filter(pl.col("lease_key").is_not_null()).select(
        "server", pl.col("lease_key").alias("bkey"), pl.col("share").alias("o_share"),
        pl.col("path").alias("o_path"), pl.col("flow").alias("o_flow"), pl.col("request_frame").alias("o_frame"),
        pl.lit(None, dtype=pl.String).alias("old_oplock"), "session_id", "filename", pl.col("ord").alias("_on"))
    table = pl.concat([by_fid, by_lease], how="vertical_relaxed").sort("_on")
    left = n.with_columns(pl.col("ord").alias("_on")).sort("_on")
    n = _asof_join(left, table, on="_on", by=["server", "bkey"], strategy="backward").drop("_on")
    # every path requested with the key before the notification (distinct paths first: a client can
    # reopen one file thousands of times with the same key)
    firsts = by_lease.drop_nulls("o_path").group_by("server", "bkey", "o_path").agg(pl.col("_on").min())
    paths = firsts.join(n.filter(pl.col("kind") == "lease").select("server", "bkey", "ord"),
                        on=["server", "bkey"]).filter(pl.col("_on") <= pl.col("ord")) \
        .sort("_on").group_by("ord").agg(pl.col("o_path").alias("lease_paths"))
    return n.join(paths, on="ord", how="left").with_columns(
        pl.col("o_share").alias("share"), pl.col("o_path").alias("path"), pl.col("o_flow").alias("owner_flow"),
        pl.col("o_frame").alias("owner_frame"), pl.col("session_id").alias("owner_session"),
        _path_key(pl.col("o_share"), pl.col("o_path").str.slice(pl.col("o_share").str.len_chars().fill_null(0)))
        .alias("path_key"),
    )


MAX_PATH_DEPTH = 64  # directory levels considered when matching a request to a directory lease
MAX_SCAN = 100_000  # candidates examined per notification, newest first


def _triggers(n: pl.DataFrame, tx: pl.DataFrame, params: Params) -> pl.DataFrame:
    """The request that caused each break (see BREAK_COLUMNS trigger_frame): candidates are requests
    on the broken path or, for a directory, under it (each request is listed under every ancestor
    of its path), sent within the window before the notification; a Numba kernel walks each
    notification's candidates newest first."""
    cols = ("trigger_frame", "trigger_flow", "trigger_client", "trigger_operation", "trigger_path",
            "trigger_status", "trigger_response_frame", "trigger_wait_ns", "trigger_match")
    notes = n.filter(pl.col("path_key").is_not_null())
    cand = tx.filter(pl.col("path").is_not_null() & ~pl.col("operation").is_in(["OPLOCK_BREAK", "CANCEL"])) \
        .with_row_index("cand") \
        .with_columns(_path_key(pl.col("share"), pl.col("path").str.slice(pl.col("share").str.len_chars()
                                                                          .fill_null(0))).alias("c_key"))
    if cand.height == 0 or notes.height == 0:
        return n.with_columns([pl.lit(None).alias(c) for c in cols])
    groups = notes.select("server", "path_key").unique().with_row_index("g")
    parts = pl.col("c_key").str.split("\\")
    anc = cand.select("cand", "server", "request_ts_ns", "chain_index", parts.alias("_parts")) \
        .with_columns(pl.col("_parts").list.len().clip(upper_bound=MAX_PATH_DEPTH).alias("_depth")) \
        .with_columns(pl.int_ranges(1, pl.col("_depth") + 1).alias("_level")).explode("_level") \
        .with_columns(pl.col("_parts").list.head(pl.col("_level")).list.join("\\").alias("path_key"),
                      (pl.col("_level") == pl.col("_parts").list.len()).alias("_exact")) \
        .join(groups, on=["server", "path_key"], how="inner") \
        .sort("g", "request_ts_ns", pl.col("chain_index"), descending=[False, False, True])
    if anc.height == 0:
        return n.with_columns([pl.lit(None).alias(c) for c in cols])
    keys = pl.concat([cand["lease_key"], notes["lease_key"]]).drop_nulls().unique().to_list()

    def lease_id(frame, col):  # lease keys as small integers for the kernel; -1 = none
        return frame[col].replace_strict(keys or [""], list(range(len(keys))) or [-1], default=-1,
                                         return_dtype=pl.Int64).fill_null(-1).to_numpy()
    c = cand.select("cand", "flow", "session_id", "lease_key", "fid_persistent", "fid_volatile", "response_ts_ns",
                    "answered")
    c = anc.select("cand", "g", "request_ts_ns", "_exact").join(c, on="cand", how="left", maintain_order="left")
    nn = notes.join(groups, on=["server", "path_key"], how="left", maintain_order="left")
    g_sorted = c["g"].to_numpy().astype(np.int64)
    note_g = nn["g"].to_numpy().astype(np.int64)
    lo = np.searchsorted(g_sorted, note_g, side="left")
    hi = np.searchsorted(g_sorted, note_g, side="right")

    def i64(frame, col, fill=-1):
        return frame[col].cast(pl.Int64, wrap_numerical=True).fill_null(fill).to_numpy()

    pick, blocked = _pick_triggers(
        lo, hi, i64(nn, "ts_ns"), i64(nn, "ack_ts_ns"), nn["ack_ts_ns"].is_not_null().to_numpy(),
        nn["ack_required"].fill_null(False).to_numpy(), i64(nn, "owner_flow"), i64(nn, "owner_session"),
        (nn["kind"] == "lease").to_numpy(), lease_id(nn, "lease_key"), i64(nn, "fid_persistent", 0),
        i64(nn, "fid_volatile", 0), nn["fid_persistent"].is_not_null().to_numpy(),
        i64(c, "request_ts_ns"), i64(c, "response_ts_ns"), c["answered"].to_numpy(), i64(c, "flow"),
        i64(c, "session_id"), lease_id(c, "lease_key"), i64(c, "fid_persistent", 0), i64(c, "fid_volatile", 0),
        c["fid_persistent"].is_not_null().to_numpy(), c["_exact"].to_numpy(), params.trigger_window_ns, MAX_SCAN)
    chosen = pl.DataFrame({"ord": nn["ord"], "_row": pick, "_blocked": blocked}).filter(pl.col("_row") >= 0)
    chosen = chosen.with_columns(pl.Series("cand", c["cand"].to_numpy()[chosen["_row"].to_numpy()]))
    trig = chosen.join(cand, on="cand", how="left").select(
        "ord", pl.col("request_frame").alias("trigger_frame"), pl.col("flow").alias("trigger_flow"),
        pl.col("client").alias("trigger_client"), pl.col("operation").alias("trigger_operation"),
        pl.col("path").alias("trigger_path"), pl.col("status").alias("trigger_status"),
        pl.col("response_frame").alias("trigger_response_frame"), pl.col("latency_ns").alias("trigger_wait_ns"),
        pl.when(pl.col("_blocked")).then(pl.lit("blocked")).otherwise(pl.lit("preceding")).alias("trigger_match"),
    )
    return n.join(trig, on="ord", how="left")


@njit(cache=True)
def _pick_triggers(lo, hi, note_ts, ack_ts, has_ack, ack_required, owner_flow, owner_session, is_lease,
                   note_lease, note_fid_p, note_fid_v, note_has_fid, c_ts, c_resp_ts, c_answered, c_flow, c_session,
                   c_lease, c_fid_p, c_fid_v, c_has_fid, c_exact, window, max_scan):
    """Per notification j, candidates ``lo[j]:hi[j]`` are those of its path group sorted by time. Walk
    back from the notification over the window: skip requests of the open that holds the oplock/lease
    (same LeaseKey / FileId); the first request that waited for the break (answered after the ack, or
    not at all, when an ack was due) on the exact path from another connection or session wins
    ("blocked"); else the newest candidate ("preceding"). Returns (row or -1, blocked)."""
    n = lo.shape[0]
    pick = np.full(n, -1, np.int64)
    blocked = np.zeros(n, np.bool_)
    for j in range(n):
        a, b = lo[j], hi[j]
        if a >= b:
            continue
        last = a + np.searchsorted(c_ts[a:b], note_ts[j], side="right")
        first = a + np.searchsorted(c_ts[a:b], note_ts[j] - window, side="left")
        scanned = 0
        for x in range(last - 1, first - 1, -1):
            scanned += 1
            if scanned > max_scan:
                break
            if is_lease[j]:
                same = c_lease[x] >= 0 and c_lease[x] == note_lease[j]
            else:
                same = note_has_fid[j] and c_has_fid[x] and c_fid_p[x] == note_fid_p[j] and c_fid_v[x] == note_fid_v[j]
            if same:
                continue
            if pick[j] < 0:
                pick[j] = x
            other = not (c_flow[x] == owner_flow[j] and c_session[x] == owner_session[j])
            if has_ack[j]:
                late = c_resp_ts[x] >= ack_ts[j]
            else:
                late = c_resp_ts[x] > note_ts[j]
            waited = ack_required[j] and ((not c_answered[x]) or late)
            if waited and other and c_exact[x]:
                pick[j] = x
                blocked[j] = True
                break
    return pick, blocked
