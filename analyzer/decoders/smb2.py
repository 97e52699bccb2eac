"""SMB2/3 (MS-SMB2) over TCP 445 and 139: the ``smb2_messages``, ``smb2_transactions`` and
``smb2_breaks`` frames.

Input: NBSS messages (RFC 1002 4.3.1; MS-SMB2 2.1 "Direct TCP transport" uses the same 4-byte
header) framed by ``analyzer.tcp.tcp_messages(cap, "nbss", {445, 139})``. Each message holds an
SMB2 header chain (compound requests and responses, MS-SMB2 3.2.4.1.4 / 3.3.4.1.3), an SMB2
TRANSFORM_HEADER (encrypted, 2.2.41), a COMPRESSION_TRANSFORM_HEADER (2.2.42) or an SMB1 message.

* ``smb2_messages``: one row per SMB2 header, so a compound gives several rows with the same
  ``message``; one row for each encrypted, compressed, SMB1 or unrecognised message (``kind``).
  Decoded by the Numba kernels of :mod:`analyzer.decoders.smb2_kernel`.
* ``smb2_transactions``: one row per request with its final response, the interim STATUS_PENDING
  response between them, the CANCEL that targeted it, and the share and file path it touched
  (:mod:`analyzer.decoders.smb2_pairing`).
* ``smb2_breaks``: one row per oplock or lease break notification, with its acknowledgment, the
  server's answer to the acknowledgment and the request that triggered it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl
import pyarrow as pa

from ..capture import frame_builder
from ..columns import arrow_series
from ..messages import FRAMING_BATCH_BYTES, KEPT_COLUMNS, MESSAGE_COLUMNS as _SET_COLUMNS, message_set_batches
from ..messages import protocol_message_sets
from ..messages import MessageSet
from ..wide_frames import concat_in_order
from ..schema import FRAMES, Column, column, empty_frame
from .protocol import Protocol
from . import smb2_kernel as k
from . import smb2_tables as t
from . import kerberos_ap_tokens, ntstatus
from .ntstatus import code_names, status_names
from .smb2_breaks import MESSAGE_COLUMNS as BREAK_MESSAGE_COLUMNS
from .smb2_frames import MESSAGE_ORDER
from .smb2_pairing import BREAK_COLUMNS, TRANSACTION_COLUMNS, Params, break_frame, pair_transactions
from .text import arena_strings

__all__ = ["BREAK_COLUMNS", "MESSAGE_COLUMNS", "PROTOCOL", "TRANSACTION_COLUMNS",
           "Params", "break_frame", "decode_messages", "empty_messages", "message_sets", "nbss_message_sets",
           "pair_transactions"]

PROTOCOL = Protocol(
    name="smb2", title="SMB2", spec="MS-SMB2", tcp_ports=(445, 139), tcp_framing="nbss",  # MS-SMB2 2.1
    frames=("smb2_messages", "smb2_transactions", "smb2_breaks"), transactions="smb2_transactions",
    from_frames=("smb2_breaks",),  # break_frame(smb2_messages, smb2_transactions)
    server_frames={"smb2_breaks": ("smb2_messages", "smb2_transactions")},  # the trigger: another client's open
    server_frame_columns={"smb2_messages": BREAK_MESSAGE_COLUMNS},  # what break_frame reads of them
    # MS-SMB2 3.2.4.2: a connection is negotiated, a session set up and a share connected before work
    setup_operations=("NEGOTIATE", "SESSION_SETUP", "TREE_CONNECT", "TREE_DISCONNECT", "LOGOFF", "ECHO", "CANCEL"),
    setup_words="negotiate/session setup", work_operations=("CREATE",),
    requests_noun="SMB2 requests", work_noun="SMB2 opens", services={139: "netbios-ssn", 445: "smb"},
    operation_words={"CREATE": "open"},
)


MESSAGE_COLUMNS: tuple[Column, ...] = KEPT_COLUMNS + (
    column("message", np.uint32, "ordinal of the NBSS message (RFC 1002 4.3.1) in this frame: the rows of "
         "one compound share it"),
    column("chain_index", np.uint32, "position of this SMB2 header in its compound chain, 0-based "
         "(MS-SMB2 3.2.4.1.4)"),
    column("chain_offset", np.uint32, "offset of this SMB2 header in the NBSS message (MS-SMB2 2.2.1 "
         "NextCommand)"),
    column("kind", object, "smb2, transform (encrypted, MS-SMB2 2.2.41), compressed (2.2.42), smb1 "
         "(MS-CIFS 2.2.3.1) or unknown", polars=pl.Enum(t.KINDS)),
    column("command", object, "SMB2 command name (MS-SMB2 2.2.1.2 Command); UNKNOWN for codes past 0x13",
         polars=pl.Enum(t.COMMAND_NAMES)),
    column("command_code", np.uint16, "SMB2 command code (MS-SMB2 2.2.1.2); for SMB1 rows the SMB1 "
         "command (MS-CIFS 2.2.3.1)"),
    column("is_response", np.bool_, "SMB2_FLAGS_SERVER_TO_REDIR (MS-SMB2 2.2.1.2); SMB1: SMB_FLAGS_REPLY"),
    column("status", object, "NTSTATUS name of a response (MS-SMB2 2.2.1.1 Status, MS-ERREF 2.3.1); "
         "unknown codes as 0xXXXXXXXX; null for requests", polars=pl.String),
    column("status_code", np.uint32, "NTSTATUS value of a response (MS-SMB2 2.2.1.1)"),
    column("flags", np.uint32, "SMB2 header Flags (MS-SMB2 2.2.1.2)"),
    column("is_async", np.bool_, "SMB2_FLAGS_ASYNC_COMMAND: async header form with AsyncId (MS-SMB2 2.2.1.1)"),
    column("is_related", np.bool_, "SMB2_FLAGS_RELATED_OPERATIONS: related compound element (MS-SMB2 "
         "2.2.1.2)"),
    column("is_signed", np.bool_, "SMB2_FLAGS_SIGNED (MS-SMB2 2.2.1.2)"),
    column("priority", np.uint8, "SMB2_FLAGS_PRIORITY_MASK >> 4 (MS-SMB2 2.2.1.2, SMB 3.1.1)"),
    column("is_dfs", np.bool_, "SMB2_FLAGS_DFS_OPERATIONS (MS-SMB2 2.2.1.2)"),
    column("is_replay", np.bool_, "SMB2_FLAGS_REPLAY_OPERATION (MS-SMB2 2.2.1.2)"),
    column("credit_charge", np.uint16, "CreditCharge (MS-SMB2 2.2.1.2)"),
    column("credit_request", np.uint16, "CreditRequest of a request (MS-SMB2 2.2.1.2)"),
    column("credit_grant", np.uint16, "CreditResponse: credits granted by a response (MS-SMB2 2.2.1.2)"),
    column("channel_sequence", np.uint16, "ChannelSequence of a request (MS-SMB2 2.2.1.2, SMB 3.x)"),
    column("message_id", np.uint64, "MessageId (MS-SMB2 2.2.1.2); 0xFFFFFFFFFFFFFFFF on unsolicited "
         "oplock/lease break notifications; SMB1 rows: MID"),
    column("async_id", np.uint64, "AsyncId of the async header form (MS-SMB2 2.2.1.1)"),
    column("tree_id", np.uint32, "TreeId of the sync header form (MS-SMB2 2.2.1.2); SMB1 rows: TID"),
    column("session_id", np.uint64, "SessionId (MS-SMB2 2.2.1.2); transform rows: the TRANSFORM_HEADER "
         "SessionId (2.2.41); SMB1 rows: UID"),
    column("has_signature", np.bool_, "the 16-byte Signature is not all zero (MS-SMB2 2.2.1.2)"),
    column("structure_size", np.uint16, "StructureSize of the command body (MS-SMB2 2.2.3 ff.)"),
    column("error_body", np.bool_, "the body is an SMB2 ERROR Response (MS-SMB2 2.2.2): nothing of the "
         "command's own response was decoded"),
    column("dialects", object, "dialects offered by a NEGOTIATE request (MS-SMB2 2.2.3 Dialects)",
         polars=pl.List(pl.UInt16)),
    column("dialect_count", np.uint16, "DialectCount of a NEGOTIATE request (MS-SMB2 2.2.3)"),
    column("dialect", np.uint16, "DialectRevision chosen by a NEGOTIATE response, 0x0202..0x0311 "
         "(MS-SMB2 2.2.4)"),
    column("capabilities", np.uint32, "Capabilities of NEGOTIATE (MS-SMB2 2.2.3, 2.2.4) or a "
         "SESSION_SETUP request (2.2.5)"),
    column("session_flags", np.uint16, "SESSION_SETUP request Flags (MS-SMB2 2.2.5) or response "
         "SessionFlags (2.2.6)"),
    column("tree", object, "share path of a TREE_CONNECT request, e.g. \\\\server\\share (MS-SMB2 2.2.9)",
         polars=pl.String),
    column("share_type", object, "ShareType of a TREE_CONNECT response (MS-SMB2 2.2.10)",
         polars=pl.Enum(list(t.SHARE_TYPES.values()) + ["invalid"])),
    column("share_flags", np.uint32, "ShareFlags of a TREE_CONNECT response (MS-SMB2 2.2.10)"),
    column("filename", object, "file name of a CREATE request, relative to the share (MS-SMB2 2.2.13)",
         polars=pl.String),
    column("desired_access", np.uint32, "DesiredAccess of a CREATE request (MS-SMB2 2.2.13, 2.2.13.1)"),
    column("share_access", np.uint32, "ShareAccess of a CREATE request: 1 read, 2 write, 4 delete "
         "(MS-SMB2 2.2.13)"),
    column("create_disposition", object, "CreateDisposition of a CREATE request (MS-SMB2 2.2.13)",
         polars=pl.Enum(t.DISPOSITION_NAMES)),
    column("create_options", np.uint32, "CreateOptions of a CREATE request (MS-SMB2 2.2.13)"),
    column("file_attributes", np.uint32, "FileAttributes (MS-FSCC 2.6) of a CREATE request or response, "
         "a CLOSE response with POSTQUERY_ATTRIB, or a SET_INFO FileBasicInformation"),
    column("oplock_level", np.uint8, "oplock level: requested (CREATE request), granted (CREATE response), "
         "or of an oplock break (MS-SMB2 2.2.13, 2.2.14, 2.2.23.1, 2.2.24.1)"),
    column("oplock", object, "oplock_level named: none, level2, exclusive, batch, lease",
         polars=pl.Enum(t.OPLOCK_NAMES)),
    column("create_contexts", object, "names of the CREATE contexts, comma-separated, in wire order "
         "(MS-SMB2 2.2.13.2, 2.2.14.2): RqLs, DHnQ, DH2Q, MxAc, QFid ...", polars=pl.String),
    column("lease_key", object, "LeaseKey of a lease create context, lease break notification, "
         "acknowledgment or response, printed as a GUID like Wireshark (MS-SMB2 2.2.13.2.8, 2.2.23.2, "
         "2.2.24.2)", polars=pl.String),
    column("lease_state", np.uint32, "LeaseState (1 read, 2 handle, 4 write caching): requested, granted, "
         "the CurrentLeaseState of a break notification, or acknowledged (MS-SMB2 2.2.13.2.8, 2.2.23.2, "
         "2.2.24.2)"),
    column("new_lease_state", np.uint32, "NewLeaseState of a lease break notification (MS-SMB2 2.2.23.2)"),
    column("lease_flags", np.uint32, "lease context Flags (2.2.13.2.10) or break notification Flags: 1 = "
         "SMB2_NOTIFY_BREAK_LEASE_FLAG_ACK_REQUIRED (MS-SMB2 2.2.23.2)"),
    column("lease_version", np.uint8, "1 or 2: SMB2_CREATE_REQUEST_LEASE or _V2 (MS-SMB2 2.2.13.2.8, "
         "2.2.13.2.10)"),
    column("parent_lease_key", object, "ParentLeaseKey of a v2 lease context (MS-SMB2 2.2.13.2.10)",
         polars=pl.String),
    column("lease_epoch", np.uint16, "Epoch of a v2 lease context or NewEpoch of a lease break "
         "notification (MS-SMB2 2.2.13.2.10, 2.2.23.2)"),
    column("break_kind", object, "which OPLOCK_BREAK form (by StructureSize, direction and MessageId, "
         "MS-SMB2 2.2.23-2.2.25)", polars=pl.Enum(t.BREAK_KINDS)),
    column("break_reason", np.uint32, "BreakReason of a lease break notification (MS-SMB2 2.2.23.2)"),
    column("create_action", object, "CreateAction of a CREATE response (MS-SMB2 2.2.14)",
         polars=pl.Enum(t.ACTION_NAMES)),
    column("end_of_file", np.uint64, "EndofFile of a CREATE or CLOSE response, or a SET_INFO "
         "FileEndOfFileInformation (MS-SMB2 2.2.14, 2.2.16; MS-FSCC 2.4.14)"),
    column("fid_persistent", np.uint64, "FileId.Persistent (MS-SMB2 2.2.14.1) of the CREATE response or "
         "of the request / break that names the open; 0xFFFFFFFFFFFFFFFF in related compounds"),
    column("fid_volatile", np.uint64, "FileId.Volatile (MS-SMB2 2.2.14.1)"),
    column("file_offset", np.uint64, "Offset of a READ or WRITE request (MS-SMB2 2.2.19, 2.2.21)"),
    column("io_length", np.uint32, "Length of a READ/WRITE request, DataLength of a READ response, Count "
         "of a WRITE response (MS-SMB2 2.2.19-2.2.22); the data itself is not read"),
    column("lock_count", np.uint16, "LockCount of a LOCK request (MS-SMB2 2.2.26)"),
    column("lock_offset", np.uint64, "Offset of the first lock range (MS-SMB2 2.2.26.1)"),
    column("lock_length", np.uint64, "Length of the first lock range (MS-SMB2 2.2.26.1)"),
    column("lock_flags", np.uint32, "Flags of the first lock range: 1 shared, 2 exclusive, 4 unlock, "
         "0x10 fail immediately (MS-SMB2 2.2.26.1)"),
    column("ctl_code", np.uint32, "CtlCode of an IOCTL request or response (MS-SMB2 2.2.31, 2.2.32)"),
    column("ioctl", object, "ctl_code named for common FSCTLs (MS-SMB2 2.2.31, MS-FSCC 2.3), else "
         "0xXXXXXXXX", polars=pl.String),
    column("info_type", object, "InfoType of QUERY_INFO / SET_INFO (MS-SMB2 2.2.37, 2.2.39)",
         polars=pl.Enum(list(t.INFO_TYPES.values()) + ["invalid"])),
    column("info_class", np.uint8, "FileInfoClass of QUERY_INFO / SET_INFO, FileInformationClass of "
         "QUERY_DIRECTORY (MS-SMB2 2.2.33, 2.2.37, 2.2.39)"),
    column("info_class_name", object, "info_class named (MS-FSCC 2.4 file, 2.5 file system classes), "
         "e.g. FileRenameInformation", polars=pl.String),
    column("target_name", object, "new name of a SET_INFO FileRenameInformation / FileLinkInformation "
         "(MS-FSCC 2.4.37.2, 2.4.21.2)", polars=pl.String),
    column("delete_pending", np.bool_, "DeletePending of SET_INFO FileDispositionInformation, or "
         "FILE_DISPOSITION_DELETE of FileDispositionInformationEx (MS-FSCC 2.4.11, 2.4.12)"),
    column("pattern", object, "search pattern of a QUERY_DIRECTORY request (MS-SMB2 2.2.33)",
         polars=pl.String),
    column("notify_flags", np.uint16, "Flags of a CHANGE_NOTIFY request: 1 = WATCH_TREE (MS-SMB2 2.2.35)"),
    column("completion_filter", np.uint32, "CompletionFilter of a CHANGE_NOTIFY request (MS-SMB2 2.2.35)"),
    column("original_size", np.uint32, "OriginalMessageSize of a TRANSFORM_HEADER (MS-SMB2 2.2.41) or "
         "OriginalCompressedSegmentSize of a COMPRESSION_TRANSFORM_HEADER (2.2.42)"),
    column("decode_error", object, "null when the row decoded; else why not: truncated, bad header, bad "
         "structure size, bad next command, bad offset, bad create context, unknown protocol, bad lock "
         "count", polars=pl.Enum(t.DECODE_ERRORS)),
)
MESSAGE_NAMES = tuple(c.name for c in MESSAGE_COLUMNS)

_UINT64_FIELDS = set(k.U64_FIELDS)


def empty_messages() -> pl.DataFrame:
    return empty_frame(MESSAGE_COLUMNS)


def _session_messages(ms: MessageSet) -> pl.DataFrame:
    """The set's rows that are NBSS session messages. ``tcp_messages`` may flag keep-alives and
    session requests/responses (RFC 1002 4.3) in an ``nbss_type`` column; those are not SMB."""
    frame = ms.frame
    if "nbss_type" in frame.columns:
        frame = frame.filter(pl.col("nbss_type") == 0)
    return frame


def _masked(name: str, values: np.ndarray, valid: np.ndarray) -> pl.Series:
    """``values`` with nulls where not ``valid``. Built by Polars, not ``pa.array(values, mask=...)``:
    pyarrow's conversion of a NumPy array imports pandas (~0.25 s CPU) only to rule it out."""
    if valid.all():
        return pl.Series(name, values)
    return pl.select(pl.when(pl.lit(pl.Series(valid))).then(pl.lit(pl.Series(name, values)))).to_series()


def _dialect_lists(arena: np.ndarray, start: np.ndarray, nbytes: np.ndarray) -> pl.Series:
    valid = nbytes >= 0
    counts = np.where(valid, nbytes // 2, 0).astype(np.int64)
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    within = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], counts)
    idx = np.repeat(start, counts) + 2 * within
    values = (arena[idx].astype(np.uint16) | (arena[idx + 1].astype(np.uint16) << 8)) if total else \
        np.zeros(0, np.uint16)
    # from Arrow buffers: pa.array() of a NumPy array would import pandas (see _masked)
    items = pa.Array.from_buffers(pa.uint16(), total, [None, pa.py_buffer(np.ascontiguousarray(values, np.uint16))])
    arr = pa.Array.from_buffers(pa.large_list(pa.uint16()), len(counts),
                                [pa.py_buffer(np.packbits(valid, bitorder="little")), pa.py_buffer(offsets)],
                                children=[items])
    return arrow_series("dialects", arr).cast(pl.List(pl.UInt16))


def _decode_set(ms: MessageSet, first_message: int) -> pl.DataFrame:
    frame = _session_messages(ms)
    if frame.height == 0:
        return empty_messages()
    buf = ms.buf
    offset = frame["offset"].to_numpy().astype(np.int64)
    length = frame["length"].to_numpy().astype(np.int64)
    wire = frame["wire_length"].to_numpy().astype(np.int64)
    if len(buf) and (offset.min() < 0 or (offset + length).max() > len(buf)):
        raise ValueError("message set offsets/lengths point outside its buffer")
    counts = k.count_rows(buf, offset, length, wire)
    n_rows = int(counts.sum())
    out = k.allocate_rows(n_rows)
    arena = np.empty(max(1 << 16, 64 * n_rows), np.uint8)
    first, row, apos = 0, 0, 0
    while True:
        first, row, apos = k.decode(buf, offset, length, wire, first, row, apos, arena,
                                     out.o8, out.o4, out.o2, out.o1)
        if first >= len(offset):
            break
        arena = np.concatenate([arena, np.empty(len(arena), np.uint8)])  # grow and resume
    assert row == n_rows, "count and decode passes disagree"
    return _rows_frame(frame, out, arena, first_message)


def _rows_frame(frame: pl.DataFrame, out, arena: np.ndarray, first_message: int) -> pl.DataFrame:
    present = out.present
    cols: dict[str, pl.Series] = {}
    for bit, name in enumerate(k.FIELDS):
        values = getattr(out, name)
        if name in _UINT64_FIELDS:
            values = values.view(np.uint64)
        elif k.FIELD_DTYPES[name] is np.bool_:
            values = values.view(np.bool_)
        elif values.dtype != k.FIELD_DTYPES[name]:
            values = values.astype(k.FIELD_DTYPES[name])
        cols[name] = _masked(name, values, ((present >> bit) & 1).astype(np.bool_))
    for bit, name in enumerate(k.STRINGS[:-1], start=k.STRING_BIT):
        start, length = getattr(out, f"{name}_start"), getattr(out, f"{name}_len")
        cols[name] = arena_strings(name, arena, start, length, ((present >> bit) & 1).astype(np.bool_))
    valid = ((present >> (k.STRING_BIT + k.S_DIALECTS)) & 1).astype(np.bool_)
    cols["dialects"] = _dialect_lists(arena, out.dialects_start, np.where(valid, out.dialects_len, -1))
    raw = pl.DataFrame(list(cols.values()))
    base = frame.select([c.name for c in KEPT_COLUMNS])[out.msg]
    flags = pl.col("flags")
    smb2 = pl.col("kind_code") == t.KIND_SMB2
    decoded = raw.rename({"kind": "kind_code"}).with_columns(
        pl.Series("message", out.msg + first_message).cast(pl.UInt32),
        pl.col("kind_code").replace_strict(list(range(len(t.KINDS))), t.KINDS,
                                           return_dtype=pl.Enum(t.KINDS)).alias("kind"),
        pl.when(smb2).then(pl.col("command_code").replace_strict(
            list(t.COMMANDS), list(t.COMMANDS.values()), default=t.UNKNOWN_COMMAND,
            return_dtype=pl.String)).cast(pl.Enum(t.COMMAND_NAMES)).alias("command"),
        status_names(pl.col("status_code")).alias("status"),
        ((flags & t.FLAGS_ASYNC_COMMAND) != 0).alias("is_async"),
        ((flags & t.FLAGS_RELATED_OPERATIONS) != 0).alias("is_related"),
        ((flags & t.FLAGS_SIGNED) != 0).alias("is_signed"),
        ((flags & t.FLAGS_PRIORITY_MASK) // 16).cast(pl.UInt8).alias("priority"),
        ((flags & t.FLAGS_DFS_OPERATIONS) != 0).alias("is_dfs"),
        ((flags & t.FLAGS_REPLAY_OPERATION) != 0).alias("is_replay"),
        _named(pl.col("share_type"), t.SHARE_TYPES),
        _named(pl.col("create_disposition"), t.CREATE_DISPOSITIONS),
        _named(pl.col("oplock_level"), t.OPLOCK_LEVELS).alias("oplock"),
        _named(pl.col("break_kind"), dict(enumerate(t.BREAK_KINDS, start=1)), invalid=False),
        _named(pl.col("create_action"), t.CREATE_ACTIONS),
        code_names(pl.col("ctl_code"), t.FSCTLS).alias("ioctl"),
        _named(pl.col("info_type"), t.INFO_TYPES),
        _info_class_name(),
        _named(pl.col("decode_error"), dict(enumerate(t.DECODE_ERRORS, start=1)), invalid=False),
    )
    return pl.concat([base, decoded], how="horizontal").select(MESSAGE_NAMES)


def _named(codes: pl.Expr, table: dict[int, str], invalid: bool = True) -> pl.Expr:
    names = list(table.values()) + (["invalid"] if invalid else [])
    named = codes.replace_strict(list(table), list(table.values()), default="invalid" if invalid else None,
                                 return_dtype=pl.String)
    return pl.when(codes.is_not_null()).then(named).cast(pl.Enum(names))


def _info_class_name() -> pl.Expr:
    table = {(1 << 8) | c: n for c, n in t.FILE_INFO_CLASSES.items()}
    table |= {(2 << 8) | c: n for c, n in t.FS_INFO_CLASSES.items()}
    # QUERY_DIRECTORY has a FileInformationClass and no InfoType: a file information class.
    key = pl.col("info_type").cast(pl.Int64).fill_null(1) * 256 + pl.col("info_class").cast(pl.Int64)
    security = pl.when(pl.col("info_type") == 3).then(pl.lit("SecurityInformation")) \
        .when(pl.col("info_type") == 4).then(pl.lit("QuotaInformation"))
    return pl.coalesce(key.replace_strict(list(table), list(table.values()), default=None,
                                          return_dtype=pl.String),
                       pl.when(pl.col("info_class").is_not_null()).then(security)).alias("info_class_name")


def decode_messages(sets: Sequence[MessageSet], first: int = 0) -> pl.DataFrame:
    """The ``smb2_messages`` frame of NBSS message sets: one row per SMB2 header (see module doc);
    ``first``: the number (``message``) of the sets' first message (the messages before them)."""
    frames = []
    for ms in sets:
        if not isinstance(ms, MessageSet):
            raise TypeError(f"expected MessageSet, got {type(ms).__name__}")
        missing = {c.name for c in _SET_COLUMNS} - set(ms.frame.columns)
        if missing:
            raise ValueError(f"message set lacks columns {sorted(missing)}")
        frames.append(_decode_set(ms, first))
        first += ms.height
    return concat_in_order(frames, MESSAGE_ORDER, empty_messages())


# --- registration --------------------------------------------------------------------------------

def message_sets(cap) -> list[MessageSet]:
    """SMB2 message sets of a capture: TCP/445 and 139, NBSS-framed (from PROTOCOL)."""
    return protocol_message_sets(cap, PROTOCOL)


nbss_message_sets = message_sets  # its older name (tests/test_smb2_conformance.py)


def outcome_rules() -> tuple[str, str]:
    """(what counts as an error, when a request counts as unanswered): ``herdscope stats --help`` and
    the README (analyzer.stats.outcome_rules)."""
    more = ntstatus.STATUS_MORE_PROCESSING_REQUIRED
    return (f"a final response whose NTSTATUS has error severity (0xC0000000 and above), except "
            f"{ntstatus.NTSTATUS[more]} (0x{more:08X}), a step of SESSION_SETUP; "
            f"warnings (STATUS_BUFFER_OVERFLOW, STATUS_NO_MORE_FILES) are not errors. STATUS_PENDING is an "
            f"interim response, not the result: the final response counts, and the wait from interim to final "
            f"has a row of its own.",
            "no final response with the request's MessageId on its connection before the capture ends (no time "
            "limit). CANCEL (never answered) and unanswered CHANGE_NOTIFY (pending by design) are not counted; a "
            "break that needs an acknowledgment and gets none is an unanswered break ack.")


FRAMES.setdefault("smb2_messages", MESSAGE_COLUMNS)  # descriptions for ``herdscope export``
FRAMES.setdefault("smb2_transactions", TRANSACTION_COLUMNS)
FRAMES.setdefault("smb2_breaks", BREAK_COLUMNS)


@frame_builder("smb2_messages")
def _build_messages(cap) -> pl.DataFrame:
    """Decoded a batch of connections at a time (:data:`FRAMING_BATCH_BYTES`), each batch's copied
    bytes dropped before the next; the messages (numbered in the order of the sets framed at once,
    ``analyzer.messages.message_set_batches``) and the SESSION_SETUP tokens kerberos_ap reads (not
    framed again) are those of the whole sets."""
    frames, tokens, first = [], [], 0
    for sets in message_set_batches(cap, PROTOCOL, FRAMING_BATCH_BYTES):
        frame = decode_messages(sets, first)
        first += sum(ms.height for ms in sets)
        found = kerberos_ap_tokens.carried("smb2_messages", sets, frame)
        tokens = None if found is None else tokens + found
        frames.append(frame)
        del sets
    kerberos_ap_tokens.keep(cap, "smb2_messages", tokens)
    return concat_in_order(frames, MESSAGE_ORDER, empty_messages())


@frame_builder("smb2_transactions")
def _build_transactions(cap) -> pl.DataFrame:
    return pair_transactions(cap.frame("smb2_messages"))


@frame_builder("smb2_breaks")
def _build_breaks(cap) -> pl.DataFrame:
    return break_frame(cap.frame("smb2_messages"), cap.frame("smb2_transactions"))
