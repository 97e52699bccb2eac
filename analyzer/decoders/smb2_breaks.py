"""SMB2 oplock and lease breaks (MS-SMB2 3.3.4.6, 3.3.4.7), from ``smb2_messages`` and
``smb2_transactions``: one row per oplock or lease break notification with its acknowledgment (the
first acknowledgment for the same FileId or LeaseKey on the same server after it, that no later
notification took), the server's response to the acknowledgment, the open that held the oplock or
lease, and the request that triggered the break (a Numba walk over each notification's candidates).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from ..jit import njit
from ..schema import Column, column
from ..wide_frames import selected_rows, sorted_rows
from . import smb2_tables as t
from .smb2_frames import KEY, MESSAGE_ORDER, Params, asof_join, schema_of


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

_NOTIFICATIONS = ("oplock_break_notification", "lease_break_notification")
# what break_frame reads of smb2_messages' SMB2 header rows: the notifications', and of the rows of the
# acknowledgments and owners' CREATEs, the FileId, oplock and name (SMB2's server_frame_columns)
NOTE_COLUMNS = ("flow", "src", "dst", "sport", "dport", "frame_last", "ts_last_ns", "break_kind", "fid_persistent",
                "fid_volatile", "lease_key", "oplock", "lease_state", "new_lease_state", "break_reason",
                "lease_flags", "lease_epoch")
MESSAGE_COLUMNS = tuple(dict.fromkeys(("kind", *MESSAGE_ORDER, *KEY, *NOTE_COLUMNS, "filename")))


class _HeaderRows:
    """The SMB2 header rows of ``messages`` with their ordinal ``ord`` in wire order (as
    ``smb2_frames.header_rows`` numbers them), served a few at a time: a file server's messages are
    millions and its breaks a few, so only the rows asked for are copied (on the 10M synth capture's
    file server at 10x, ~430 MB less than the header rows whole)."""

    def __init__(self, messages: pl.DataFrame):
        smb2 = pl.col("kind") == "smb2"
        keys = selected_rows(messages, smb2, pl.int_range(pl.len(), dtype=pl.Int64).alias("_i"), *MESSAGE_ORDER)
        order = sorted_rows(keys, MESSAGE_ORDER)["_i"].to_numpy()  # header_rows' stable order
        ords = np.full(messages.height, -1, np.int64)
        ords[order] = np.arange(len(order), dtype=np.int64)
        self._messages, self._ords = messages, pl.Series("ord", ords)

    def where(self, condition: pl.Expr, *columns: str) -> pl.DataFrame:
        """``columns`` of the header rows where ``condition`` holds, with ``ord``, in wire order."""
        return selected_rows(self._messages.with_columns(self._ords), (pl.col("ord") >= 0) & condition,
                             "ord", *columns).sort("ord")

    def of(self, tx: pl.DataFrame, *columns: str) -> pl.DataFrame:
        """The header rows of the NBSS messages of transactions ``tx`` (a few among millions)."""
        return self.where(pl.col("message").is_in(tx["message"].drop_nulls().unique().implode()), *KEY, *columns)


def _lease_letters(state: pl.Expr) -> pl.Expr:
    """A lease state (MS-SMB2 2.2.13.2.8 LeaseState) as letters: RWH, RH, R ...; 'none' for 0."""
    s = state.cast(pl.Int64)
    letters = pl.concat_str([
        pl.when((s // t.LEASE_READ_CACHING) % 2 == 1).then(pl.lit("R")).otherwise(pl.lit("")),
        pl.when((s // t.LEASE_WRITE_CACHING) % 2 == 1).then(pl.lit("W")).otherwise(pl.lit("")),
        pl.when((s // t.LEASE_HANDLE_CACHING) % 2 == 1).then(pl.lit("H")).otherwise(pl.lit("")),
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


def break_frame(messages: pl.DataFrame, transactions: pl.DataFrame, params: Params = Params()) -> pl.DataFrame:
    """The ``smb2_breaks`` frame: one row per break notification (see the module doc)."""
    rows = _HeaderRows(messages)
    notes = rows.where(pl.col("break_kind").is_in(_NOTIFICATIONS), *NOTE_COLUMNS)
    if notes.height == 0:
        return pl.DataFrame(schema=schema_of(BREAK_COLUMNS))
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
    acks = transactions.filter(pl.col("break_kind").is_in(["oplock_break_ack", "lease_break_ack"]))
    acks = acks.join(rows.of(acks, "fid_persistent", "fid_volatile", "oplock").rename({"oplock": "ack_oplock"}),
                     on=KEY, how="left")
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
        taken = asof_join(a, nk, on="_on", by=["server", "bkey"], strategy="backward").drop_nulls("note_ord") \
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
        pl.when(pl.col("kind") == "lease")
        .then((pl.col("lease_flags") & t.NOTIFY_BREAK_LEASE_FLAG_ACK_REQUIRED) != 0)
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
    return out.cast(schema_of(BREAK_COLUMNS)).select(BREAK_NAMES)



def _owners(n: pl.DataFrame, tx: pl.DataFrame, rows: _HeaderRows) -> pl.DataFrame:
    """The open that held the oplock (by FileId, from CREATE responses) or lease (by LeaseKey, from
    CREATE requests), the latest before the notification, on the same server. Only the CREATEs of a
    notified FileId or LeaseKey can be (a LeaseKey, a GUID, is never a FileId's "persistent:volatile"):
    those are picked first, by the FileId's persistent half and the LeaseKey."""
    notified = (pl.col("fid_persistent").is_in(n["fid_persistent"].drop_nulls().unique().implode())
                | pl.col("lease_key").is_in(n["lease_key"].drop_nulls().unique().implode()))
    creates = tx.filter((pl.col("operation") == "CREATE") & notified.fill_null(False))
    creates = creates.join(rows.of(creates, "filename"), on=KEY, how="left")
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
    n = asof_join(left, table, on="_on", by=["server", "bkey"], strategy="backward").drop("_on")
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
PREFIX_FILTER_GROUPS = 256  # broken paths up to which candidates are first narrowed by prefix (_near)
MAX_SCAN = 100_000  # candidates examined per notification, newest first


# The kernel's inputs: one int64 row per notification (N_*) and per candidate (C_*); flags are 0/1.
(N_TS, N_ACK_TS, N_HAS_ACK, N_ACK_REQUIRED, N_OWNER_FLOW, N_OWNER_SESSION, N_IS_LEASE, N_LEASE, N_FID_P, N_FID_V,
 N_HAS_FID, N_LO, N_HI) = range(13)
N_NOTE = 13
# (candidate request times are an array of their own: the kernel binary-searches them)
(C_RESP_TS, C_ANSWERED, C_FLOW, C_SESSION, C_LEASE, C_FID_P, C_FID_V, C_HAS_FID, C_EXACT) = range(9)
N_CAND = 9


def input_matrix(cols: dict[int, np.ndarray], width: int) -> np.ndarray:
    """Row-major int64 matrix with column ``k`` = ``cols[k]`` (one row is one or two cache lines)."""
    n = len(next(iter(cols.values())))
    out = np.empty((n, width), np.int64)
    assert sorted(cols) == list(range(width)), "kernel input columns out of step with their layout"
    for k, values in cols.items():
        out[:, k] = values
    return out


def _near(cand: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """The candidates whose key starts with a broken path on the same server: an ancestor of a key
    (its first parts joined) is a prefix of it, so only these can meet ``groups`` in _triggers' join;
    the others need not be split into ancestors (on the 1M-packet synthetic capture 3 breaks, 28,000
    requests). With many broken paths the pairs would outgrow the saving: all are kept."""
    if groups.height > PREFIX_FILTER_GROUPS:
        return cand
    near = cand.select("cand", "server", "c_key").join(groups.select("server", "path_key"), on="server") \
        .filter(pl.col("c_key").str.starts_with(pl.col("path_key")))["cand"].unique()
    return cand.filter(pl.col("cand").is_in(near.implode()))


def _triggers(n: pl.DataFrame, tx: pl.DataFrame, params: Params) -> pl.DataFrame:
    """The request that caused each break (see BREAK_COLUMNS trigger_frame): candidates are requests
    on the broken path or, for a directory, under it (each request is listed under every ancestor
    of its path), sent within the window before the notification; a Numba kernel walks each
    notification's candidates newest first."""
    cols = ("trigger_frame", "trigger_flow", "trigger_client", "trigger_operation", "trigger_path",
            "trigger_status", "trigger_response_frame", "trigger_wait_ns", "trigger_match")
    notes = n.filter(pl.col("path_key").is_not_null())
    near = _in_a_window(tx["request_ts_ns"], notes["ts_ns"], int(params.trigger_window_ns))  # one filter: no copy
    cand = tx.filter(pl.col("path").is_not_null() & ~pl.col("operation").is_in(["OPLOCK_BREAK", "CANCEL"]) & near) \
        .with_row_index("cand") \
        .with_columns(_path_key(pl.col("share"), pl.col("path").str.slice(pl.col("share").str.len_chars()
                                                                          .fill_null(0))).alias("c_key"))
    if cand.height == 0 or notes.height == 0:
        return n.with_columns([pl.lit(None).alias(c) for c in cols])
    groups = notes.select("server", "path_key").unique().with_row_index("g")
    parts = pl.col("c_key").str.split("\\")
    anc = _near(cand, groups).select("cand", "server", "request_ts_ns", "chain_index", parts.alias("_parts")) \
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

    def flag(series):
        return series.to_numpy().astype(np.int64)

    note_cols = {
        N_TS: i64(nn, "ts_ns"), N_ACK_TS: i64(nn, "ack_ts_ns"), N_HAS_ACK: flag(nn["ack_ts_ns"].is_not_null()),
        N_ACK_REQUIRED: flag(nn["ack_required"].fill_null(False)), N_OWNER_FLOW: i64(nn, "owner_flow"),
        N_OWNER_SESSION: i64(nn, "owner_session"), N_IS_LEASE: flag(nn["kind"] == "lease"),
        N_LEASE: lease_id(nn, "lease_key"), N_FID_P: i64(nn, "fid_persistent", 0),
        N_FID_V: i64(nn, "fid_volatile", 0), N_HAS_FID: flag(nn["fid_persistent"].is_not_null()),
        N_LO: lo, N_HI: hi}
    cand_cols = {
        C_RESP_TS: i64(c, "response_ts_ns"), C_ANSWERED: flag(c["answered"]),
        C_FLOW: i64(c, "flow"), C_SESSION: i64(c, "session_id"), C_LEASE: lease_id(c, "lease_key"),
        C_FID_P: i64(c, "fid_persistent", 0), C_FID_V: i64(c, "fid_volatile", 0),
        C_HAS_FID: flag(c["fid_persistent"].is_not_null()), C_EXACT: flag(c["_exact"])}
    pick, blocked = _pick_triggers(input_matrix(note_cols, N_NOTE), i64(c, "request_ts_ns"),
                                   input_matrix(cand_cols, N_CAND), np.int64(params.trigger_window_ns),
                                   np.int64(MAX_SCAN))
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


def _in_a_window(ts: pl.Series, note_ts: pl.Series, window_ns: int) -> pl.Series:
    """Whether each request time ``ts`` lies within ``window_ns`` before (or at) a notification's
    ``note_ts``: the only candidates :func:`_pick_triggers` looks at (null times as it reads them, -1).
    A file server's requests are millions, its breaks a few: the others are not keyed by path."""
    notes = np.sort(note_ts.cast(pl.Int64).fill_null(-1).to_numpy())
    t = ts.cast(pl.Int64).fill_null(-1).to_numpy()
    if notes.shape[0] == 0:
        return pl.Series(np.zeros(t.shape[0], np.bool_))
    nearest = notes[np.minimum(np.searchsorted(notes, t, side="left"), notes.shape[0] - 1)]  # the first at or after
    return pl.Series((nearest >= t) & (nearest - window_ns <= t))


@njit(cache=True)
def _pick_triggers(notes, c_ts, cands, window, max_scan):
    """Per notification j (a row of ``notes``, columns N_*), its candidates are rows
    ``notes[j, N_LO]:notes[j, N_HI]`` of ``cands`` (columns C_*, times in ``c_ts``): those of its path
    group sorted by time. Walk back from the notification over the window: skip requests of the open
    that holds the oplock/lease (same LeaseKey / FileId); the first request that waited for the break
    (answered after the ack, or not at all, when an ack was due) on the exact path from another
    connection or session wins ("blocked"); else the newest candidate ("preceding"). Returns (row or
    -1, blocked)."""
    n = notes.shape[0]
    pick = np.full(n, -1, np.int64)
    blocked = np.zeros(n, np.bool_)
    for j in range(n):
        a, b = notes[j, N_LO], notes[j, N_HI]
        if a >= b:
            continue
        note_ts = notes[j, N_TS]
        last = a + np.searchsorted(c_ts[a:b], note_ts, side="right")
        first = a + np.searchsorted(c_ts[a:b], note_ts - window, side="left")
        is_lease = notes[j, N_IS_LEASE] != 0
        has_fid = notes[j, N_HAS_FID] != 0
        has_ack = notes[j, N_HAS_ACK] != 0
        ack_required = notes[j, N_ACK_REQUIRED] != 0
        scanned = 0
        for x in range(last - 1, first - 1, -1):
            scanned += 1
            if scanned > max_scan:
                break
            if is_lease:
                same = cands[x, C_LEASE] >= 0 and cands[x, C_LEASE] == notes[j, N_LEASE]
            else:
                same = (has_fid and cands[x, C_HAS_FID] != 0 and cands[x, C_FID_P] == notes[j, N_FID_P]
                        and cands[x, C_FID_V] == notes[j, N_FID_V])
            if same:
                continue
            if pick[j] < 0:
                pick[j] = x
            other = not (cands[x, C_FLOW] == notes[j, N_OWNER_FLOW]
                         and cands[x, C_SESSION] == notes[j, N_OWNER_SESSION])
            if has_ack:
                late = cands[x, C_RESP_TS] >= notes[j, N_ACK_TS]
            else:
                late = cands[x, C_RESP_TS] > note_ts
            waited = ack_required and (cands[x, C_ANSWERED] == 0 or late)
            if waited and other and cands[x, C_EXACT] != 0:
                pick[j] = x
                blocked[j] = True
                break
    return pick, blocked
