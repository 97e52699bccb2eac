"""What the SMB2 frame builders share (:mod:`.smb2_pairing` for transactions, :mod:`.smb2_breaks` for
breaks): their parameters, the SMB2 header rows of ``smb2_messages`` in wire order, and a quiet
``join_asof``."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import polars as pl

from ..wide_frames import selected_rows, sorted_rows
from ..schema import polars_type


@dataclass(frozen=True)
class Params:
    """Windows for the break analysis."""

    # a request can have triggered a break only if it was sent at most this long before the notification
    trigger_window_ns: int = 2_000_000_000



KEY = ["message", "chain_index"]  # a row of smb2_messages: its NBSS message and position in the chain


def asof_join(left: pl.DataFrame, right: pl.DataFrame, **kwargs) -> pl.DataFrame:
    """``join_asof``; both sides are sorted on the ``on`` key by the caller (Polars cannot check
    sortedness within ``by`` groups and warns)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sortedness of columns cannot be checked")
        return left.join_asof(right, **kwargs)


def schema_of(columns) -> dict[str, pl.DataType]:
    return {c.name: polars_type(c) for c in columns}


USED = ("transport", "flow", "src", "dst", "sport", "dport", "frame_last", "ts_last_ns", "message", "chain_index",
         "command", "is_response", "is_async", "is_related", "status_code", "message_id", "async_id", "tree_id",
         "session_id", "tree", "filename", "fid_persistent", "fid_volatile", "oplock", "lease_key", "lease_state",
         "new_lease_state", "lease_flags", "lease_epoch", "break_kind", "break_reason", "create_action",
         "create_disposition", "create_options", "desired_access", "share_access", "file_offset", "io_length",
         "info_class_name", "target_name", "delete_pending", "ioctl")


# the order of smb2_messages' rows, and of header_rows (message and chain_index make it total)
MESSAGE_ORDER = ("frame_last", "message", "chain_index")



def header_rows(messages: pl.DataFrame) -> pl.DataFrame:
    """SMB2 rows in wire order with an ordinal ``ord``, the compound size, and SessionId / TreeId
    inherited by related compound elements (only the columns pairing uses)."""
    rows = selected_rows(messages, pl.col("kind") == "smb2", *USED)
    rows = sorted_rows(rows, MESSAGE_ORDER)  # as smb2_messages' builder leaves them, unless given others
    related = pl.col("is_related").fill_null(False) & (pl.col("chain_index") > 0)
    return rows.with_row_index("ord").with_columns(
        pl.col("ord").cast(pl.Int64),
        pl.len().over("message").cast(pl.UInt32).alias("compound_size"),
        pl.when(related).then(None).otherwise(pl.col("session_id")).forward_fill().over("message")
        .alias("session_id"),
        pl.when(related).then(None).otherwise(pl.col("tree_id")).forward_fill().over("message")
        .alias("tree_id"),
    )

