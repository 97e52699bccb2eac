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

Breaks are in :mod:`.smb2_breaks`; :func:`break_frame` here pairs the transactions first when not given them.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from ..schema import Column, column
from ..wide_frames import selected_rows
from . import smb2_tables as t
from .common import TRANSACTION_COMMON
from .ntstatus import STATUS_PENDING, status_is_error, status_names
from . import smb2_breaks
from .smb2_breaks import BREAK_COLUMNS, BREAK_NAMES  # noqa: F401  (the breaks frame's schema, importable here)
from .smb2_frames import KEY, Params, asof_join, header_rows, schema_of  # noqa: F401  (Params: the public one)

# FileId 0xFFFFFFFFFFFFFFFF: the previous compound element's (MS-SMB2 3.2.4.1.4); MessageId: unsolicited
ALL_ONES = 0xFFFFFFFFFFFFFFFF


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


def _join_path(share: pl.Expr, name: pl.Expr) -> pl.Expr:
    clean = name.str.strip_chars_start("\\")
    return (pl.when(share.is_null()).then(clean)
            .when(clean.is_null() | (clean == "")).then(share)
            .otherwise(pl.concat_str([share, pl.lit("\\"), clean])))


def _first_match(left: pl.DataFrame, right: pl.DataFrame, by: list[str], prefix: str) -> pl.DataFrame:
    """For each row of ``right`` (responses), the latest ``left`` row (request) at or before it with the
    same ``by`` keys; then, per request, the first such response. Returns ``left_ord`` → ``prefix*``."""
    if left.height == 0 or right.height == 0:
        return pl.DataFrame(schema={"left_ord": pl.Int64, f"{prefix}ord": pl.Int64})
    l = left.select(*by, pl.col("ord").alias("left_ord"), pl.col("ord").alias("_on")).drop_nulls(by).sort("_on")
    r = right.select(*by, pl.col("ord").alias(f"{prefix}ord"), pl.col("ord").alias("_on")).drop_nulls(by) \
        .sort("_on")
    matched = asof_join(r, l, on="_on", by=by, strategy="backward").drop_nulls("left_ord")
    return matched.group_by("left_ord").agg(pl.col(f"{prefix}ord").min())


def _aligned(q: pl.DataFrame, by_ord: pl.DataFrame) -> pl.DataFrame:
    """``q`` with the columns of ``by_ord`` (``ord`` and the columns to add, at most one row per ord)
    added row by row: a join of ``q``'s ord column alone, so no column of ``q`` is copied."""
    added = q.select("ord").join(by_ord, on="ord", how="left", maintain_order="left")
    return q.hstack(added.drop("ord").get_columns())


def _gathered(rows: pl.DataFrame, ords: pl.Series, columns: dict[str, str]) -> list[pl.Series]:
    """Columns of ``rows`` (old name → new name) at the rows ``ords`` (``ord`` is the row's index in
    ``rows``; a null ord gives nulls)."""
    index = ords.cast(pl.UInt32)
    return [rows[old].gather(index).alias(new) for old, new in columns.items()]


def pair_transactions(messages: pl.DataFrame, params: Params = Params()) -> pl.DataFrame:
    """The ``smb2_transactions`` frame (see the module doc). The request rows are the one wide frame;
    what is learnt about them (their responses, cancels, paths) is worked out on narrow frames of the
    keys and added as columns in ``ord`` order (an SMB2 server's partition holds hundreds of
    thousands of rows of ~45 columns, and a join of the wide frame copies all of them)."""
    rows = header_rows(messages)
    if rows.height == 0:
        return pl.DataFrame(schema=schema_of(TRANSACTION_COLUMNS))
    response = pl.col("is_response").fill_null(False)
    unsolicited = pl.col("message_id") == ALL_ONES
    keys = rows.select("ord", "flow", "message_id", "command", "status_code", response.alias("_response"))
    responses = keys.filter(pl.col("_response") & ~unsolicited)
    interim = responses.filter(pl.col("status_code") == STATUS_PENDING)
    final = responses.filter(pl.col("status_code") != STATUS_PENDING)
    answerable = keys.filter(~pl.col("_response") & pl.col("message_id").is_not_null()
                             & (pl.col("command") != "CANCEL"))
    by = ["flow", "message_id"]
    links = (keys.filter(~pl.col("_response") & pl.col("message_id").is_not_null()).select("ord")
             .join(_first_match(answerable, final, by, "final_").rename({"left_ord": "ord"}), on="ord",
                   how="left", maintain_order="left")
             .join(_first_match(answerable, interim, by, "interim_").rename({"left_ord": "ord"}), on="ord",
                   how="left", maintain_order="left"))
    del keys, responses, interim, final, answerable
    final_columns = ("frame_last", "ts_last_ns", "status_code", "async_id", "fid_persistent", "fid_volatile",
                     "oplock", "lease_state", "create_action", "tree_id", "session_id")
    q = rows.filter(~response & pl.col("message_id").is_not_null())  # the requests, in ord order
    q = q.hstack([links["final_ord"],
                  *_gathered(rows, links["final_ord"], {c: f"final_{c}" for c in final_columns}),
                  links["interim_ord"],
                  *_gathered(rows, links["interim_ord"], {"frame_last": "interim_frame", "ts_last_ns": "interim_ts_ns",
                                                          "async_id": "interim_async_id"})])
    del rows, links

    q = _cancels(q)
    q = _paths(q)

    answered = pl.col("final_ord").is_not_null()
    status = pl.col("final_status_code")
    out = q.select(
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
    return out.cast(schema_of(TRANSACTION_COLUMNS)).select(TRANSACTION_NAMES)


def _cancels(q: pl.DataFrame) -> pl.DataFrame:
    """CANCEL → the request it targets: by AsyncId (async form, the interim response's) or else by
    MessageId (sync form), the latest such request before the CANCEL (MS-SMB2 3.2.4.24)."""
    is_cancel = pl.col("command") == "CANCEL"
    cancels = selected_rows(q, is_cancel, "ord", "flow", "message_id", "async_id", "is_async",
                            pl.col("frame_last").alias("c_frame"), pl.col("ts_last_ns").alias("c_ts"))
    targets = selected_rows(q, ~is_cancel, "ord", "flow", "message_id", "interim_async_id")
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
        by_id = asof_join(r, l, on="_on", by=["flow", "message_id"], strategy="backward").drop_nulls("target_ord")
        links.append(by_id.select("ord", "target_ord"))
    link = pl.concat(links).unique("ord", keep="first")
    frames = q.select(pl.col("ord").alias("target_ord"), pl.col("frame_last").alias("cancels_frame"))
    first_cancel = link.join(cancels.select("ord", "c_frame", "c_ts"), on="ord").sort("ord") \
        .group_by("target_ord", maintain_order=True).first() \
        .select(pl.col("target_ord").alias("ord"), pl.col("c_frame").alias("cancel_frame"),
                pl.col("c_ts").alias("cancel_ts_ns"))
    q = _aligned(q, link.join(frames, on="target_ord", how="left").select("ord", "cancels_frame"))
    return _aligned(q, first_cancel)


def _paths(q: pl.DataFrame) -> pl.DataFrame:
    """share (TreeId → TREE_CONNECT path), path and effective FileId (see the module doc). ``q`` is in
    ``ord`` order, in which the elements of a compound message are contiguous and in chain order."""
    ok = pl.col("final_status_code") == 0
    # A session, and its tree connects and opens, can span connections (multichannel, MS-SMB2 3.2.4.1.7,
    # 3.3.5.5.2), so trees and FileIds are looked up per server and SessionId, not per connection.
    q = q.with_columns(pl.col("dst").cast(pl.String).alias("_server"))
    trees = selected_rows(q, (pl.col("command") == "TREE_CONNECT") & ok,
                      "_server", pl.col("final_session_id").alias("session_id"),
                      pl.col("final_tree_id").alias("tree_id"), pl.col("tree").alias("share"),
                      pl.col("final_ord").alias("_on")).drop_nulls(["tree_id", "session_id"])
    q = _asof(q, trees, ["_server", "session_id", "tree_id"], ["share"])
    q = q.with_columns(pl.when(pl.col("command") == "TREE_CONNECT").then(pl.col("tree")).otherwise(pl.col("share"))
                       .alias("share"))
    is_create = pl.col("command") == "CREATE"
    q = q.with_columns(
        pl.when(is_create).then(_join_path(pl.col("share"), pl.col("filename"))).alias("create_path"),
    )
    opens = selected_rows(q, is_create & ok,
                      "_server", "session_id", "tree_id", pl.col("final_fid_persistent").alias("fid_p"),
                      pl.col("final_fid_volatile").alias("fid_v"), pl.col("create_path").alias("fid_path"),
                      pl.col("lease_key").alias("fid_lease_key"), pl.col("final_ord").alias("_on")
                      ).drop_nulls(["fid_p", "fid_v"])
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
    q = q.with_columns(
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
    leases = selected_rows(q, is_create & pl.col("lease_key").is_not_null(),
                       "_server", pl.col("lease_key").alias("_ack_key"), pl.col("create_path").alias("lease_path"),
                       pl.col("ord").alias("_on"))
    q = q.with_columns(pl.when(pl.col("break_kind") == "lease_break_ack").then(pl.col("lease_key")).alias("_ack_key"))
    q = _asof(q, leases, ["_server", "_ack_key"], ["lease_path"])
    return q.with_columns(pl.coalesce("path", "lease_path").alias("path"),
                          pl.coalesce("open_lease_key", "lease_key").alias("lease_key"))


def _asof(q: pl.DataFrame, table: pl.DataFrame, by: list[str], take: list[str]) -> pl.DataFrame:
    """Attach ``take`` from the latest ``table`` row (by ``_on``) at or before each row of ``q`` (in
    ``ord`` order); only ``q``'s keys are joined."""
    if table.height == 0:
        return q.with_columns([pl.lit(None, dtype=table.schema[c]).alias(c) for c in take])
    left = q.select(*by, pl.col("ord").alias("_on")).set_sorted("_on")
    table = table.with_columns([pl.col(c).cast(left.schema[c]) for c in by]).sort("_on")
    found = asof_join(left, table.select(*by, *take, "_on"), on="_on", by=by, strategy="backward")
    return q.hstack(found.select(take).get_columns())


def break_frame(messages: pl.DataFrame, transactions: pl.DataFrame | None = None,
                params: Params = Params()) -> pl.DataFrame:
    """The ``smb2_breaks`` frame (:func:`analyzer.decoders.smb2_breaks.break_frame`), pairing the
    transactions first when they are not given."""
    if transactions is None:
        transactions = pair_transactions(messages, params)
    return smb2_breaks.break_frame(messages, transactions, params)
