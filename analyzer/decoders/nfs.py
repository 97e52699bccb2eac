"""ONC-RPC (RFC 5531) and NFS (NFSv3 RFC 1813, NFSv4.0/4.1 RFC 7530/8881, MOUNT, callbacks) over
TCP and UDP 2049 and 111: the ``nfs_messages`` and ``nfs_transactions`` frames.

Input: RPC messages, record-marked over TCP (``"rpc_record_mark"``, RFC 5531 §11: fragments assembled
into one message by analyzer.tcp.framing) or one per UDP datagram. Direction is read from each
message (``client_side="message"``): a CALL is sent by the client of that exchange, so an NFSv4.1
callback (CB_COMPOUND, RFC 8881 §2.10.3.1) sent by the server on the client's own connection is a
call from the server.

* ``nfs_messages``: one row per RPC message, except NFSv4 COMPOUND / CB_COMPOUND messages, which get
  one row per operation (``op_index``; the RPC header repeated on each), the way smb2_messages has
  one row per header of a compound chain. A reply's program, version and procedure are those of the
  call it answers (same flow, same xid, caller's address and port; RFC 5531 §9 says a reply carries
  only the xid): calls and replies are paired first (:func:`call_hints`) and the bodies decoded
  after (:mod:`analyzer.decoders.nfs_kernels`).
* ``nfs_transactions``: :mod:`analyzer.decoders.nfs_pairing`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl

from ..capture import frame_builder
from ..columns import series
from ..messages import (KEPT_COLUMNS, MESSAGE_COLUMNS as _SET_COLUMNS, MessageSet, peer_connections, peer_datagrams,
                        protocol_message_sets, udp_messages)
from ..tcp import tcp_messages
from ..schema import FRAMES, Column, column, empty_frame, polars_type
from . import nfs_kernels as k
from . import nfs_xdr as X
from . import nfs_layout as L
from . import nfs_resends
from .nfs_pairing import TRANSACTION_COLUMNS, Params, pair_transactions
from .common import unbroken_duration
from .protocol import Protocol
from .smb2_frames import asof_join
from .text import arena_strings

__all__ = ["MESSAGE_COLUMNS", "PROTOCOL", "TRANSACTION_COLUMNS", "Params", "decode_messages", "message_sets",
           "pair_transactions", "message_direction"]

PROTOCOL = Protocol(
    name="nfs", title="NFS", spec="RFC 5531, RFC 1813, RFC 7530, RFC 8881",
    # 20048: mountd (IANA "mountd"; Linux rpc.mountd -p 20048, nfs-ganesha's MNT_Port); 32803: nfs-ganesha's
    # NLM_Port default (lockd elsewhere takes a port from the portmapper: not seen here)
    udp_ports=(111, 2049, 20048, 32803), tcp_ports=(111, 2049, 20048, 32803), tcp_framing="rpc_record_mark",  # RFC 5531 §11
    client_side="message", message_direction=f"{__name__}:message_direction",
    frames=("nfs_messages", "nfs_transactions"), transactions="nfs_transactions",
    server_frames={"nfs_transactions": ("nfs_messages",)},  # a handle's path: another client's LOOKUP
    # RFC 8881 §18.35-18.37 / RFC 7530 §16.33-34: a client (4.0) or session (4.1) is set up before work
    setup_operations=("NULL", "EXCHANGE_ID", "CREATE_SESSION", "DESTROY_SESSION", "DESTROY_CLIENTID",
                      "SETCLIENTID", "SETCLIENTID_CONFIRM", "RECLAIM_COMPLETE", "BIND_CONN_TO_SESSION",
                      "MOUNT MNT", "MOUNT UMNT", "PORTMAP GETPORT"),
    setup_words="mount/session setup", work_operations=("OPEN", "LOOKUP", "CREATE"),
    requests_noun="NFS requests", work_noun="NFS opens", services={111: "rpcbind", 2049: "nfs", 20048: "mountd", 32803: "nlockmgr"},
    operation_words={"OPEN": "open", "LOOKUP": "lookup", "LOCK": "lock", "LOCKT": "lock test"},
    # calls re-sent with their xid (RFC 5531 §9), folded by nfs_pairing: analyzer/decoders/nfs_resends.py
    resends="analyzer.decoders.nfs_resends:resends", resends_frame="nfs_messages", resends_count="retransmissions",
    resends_columns=tuple(sorted(nfs_resends.MESSAGE_COLUMNS)), resends_rows=nfs_resends.MESSAGE_ROWS,
    # a lock held by another owner: ask again later (RFC 7530 §16.10.4, RFC 8881 §18.10.4; NLM4 LOCK with
    # block false): lock polling (detectors/lock_polling.py), not a failure
    poll_answers=(("LOCK", "NFS4ERR_DENIED"), ("NLM LOCK", "NLM4_DENIED"), ("NLM LOCK_MSG", "NLM4_DENIED")),
    # nfs(5) timeo; include/uapi/linux/nfs_fs.h NFS_DEF_UDP_TIMEO 11, NFS_DEF_TCP_TIMEO 600 (deciseconds)
    retry_timers={"udp": (1_100_000_000, "Linux's default timeo for UDP mounts, nfs(5)"),
                  "tcp": (60_000_000_000, "Linux's default timeo for TCP mounts, nfs(5)")},
)

_MSG_TYPES = pl.Enum(list(L.MSG_TYPES.values()))
_ERRORS = pl.Enum(list(L.DECODE_ERRORS))

MESSAGE_COLUMNS: tuple[Column, ...] = KEPT_COLUMNS + (
    column("message", np.uint32, "ordinal of the RPC message in the capture: the rows of one COMPOUND share it"),
    column("op_index", np.uint32, "position of the operation in its COMPOUND / CB_COMPOUND (RFC 7530 §16.2); "
         "0 for other messages"),
    column("op_count", np.uint32, "number of operations in the COMPOUND argarray / resarray"),
    column("xid", np.uint32, "transaction id (RFC 5531 §9)"),
    column("msg_type", object, "CALL or REPLY (RFC 5531 §9)", polars=_MSG_TYPES),
    column("rpcvers", np.uint32, "RPC version of a call, 2 (RFC 5531 §9)"),
    column("program", np.uint32, "program number (RFC 5531 §9, App. C); a reply: its call's"),
    column("version", np.uint32, "program version; a reply: its call's"),
    column("procedure", np.uint32, "procedure number; a reply: its call's"),
    column("call_frame", np.uint32, "a reply: the frame of the call it answers (same flow and xid); a call: "
         "its own frame"),
    column("is_callback", np.bool_, "an NFSv4 callback program (RFC 7530 §16.33 cb_program, in the "
         "transient range 0x40000000-0x5fffffff): CB_COMPOUND from the server"),
    column("operation", object, "NFSv3 procedure (RFC 1813 §3.3), NFSv4 operation (RFC 7530 §15.2, "
         "RFC 8881 §18; CB_* for callbacks), else PROGRAM PROCEDURE (MOUNT MNT, PORTMAP GETPORT) or "
         "'prog N proc M'", polars=pl.String),
    column("auth_flavor", np.uint32, "credential flavour of a call: 0 AUTH_NONE, 1 AUTH_SYS, 6 RPCSEC_GSS "
         "(RFC 5531 §8.2)"),
    column("auth_uid", np.uint32, "AUTH_SYS uid (RFC 5531 App. A)"),
    column("auth_gid", np.uint32, "AUTH_SYS gid (RFC 5531 App. A)"),
    column("machine", object, "AUTH_SYS machinename (RFC 5531 App. A)", polars=pl.String),
    column("reply_stat", np.uint32, "reply: 0 MSG_ACCEPTED, 1 MSG_DENIED (RFC 5531 §9)"),
    column("accept_stat", np.uint32, "accepted reply: 0 SUCCESS, 1 PROG_UNAVAIL, 2 PROG_MISMATCH, "
         "3 PROC_UNAVAIL, 4 GARBAGE_ARGS, 5 SYSTEM_ERR (RFC 5531 §9)"),
    column("reject_stat", np.uint32, "denied reply: 0 RPC_MISMATCH, 1 AUTH_ERROR (RFC 5531 §9)"),
    column("nfs_status", np.uint32, "reply: nfsstat3 (RFC 1813 §2.6), the COMPOUND status (nfsstat4, RFC "
         "7530 §15.1) or the MOUNT fhstatus"),
    column("op_status", np.uint32, "reply: the status of this COMPOUND operation (nfsstat4)"),
    column("status", object, "op_status, else nfs_status, named (NFS3_OK, NFS4ERR_DENIED ...); else the "
         "RPC error (PROG_UNAVAIL, AUTH_ERROR ...); null for calls", polars=pl.String),
    column("tag", object, "COMPOUND tag (RFC 7530 §16.2.3)", polars=pl.String),
    column("minorversion", np.uint32, "COMPOUND minorversion: 0, 1, 2 (RFC 7530 §16.2, RFC 8881 §16.2.3)"),
    column("opcode", np.uint32, "NFSv4 operation or callback operation number"),
    column("fh", object, "file handle in hex: PUTFH, NFSv3 arguments, GETFH / LOOKUP / CREATE results, "
         "CB_RECALL (RFC 1813 §2.3.3 nfs_fh3, RFC 7530 §2.2 nfs_fh4)", polars=pl.String),
    column("fh_hash", np.uint32, "CRC-32 of the file handle (Wireshark's nfs.fh.hash)"),
    column("name", object, "name of LOOKUP, CREATE, MKDIR, REMOVE, RENAME (the source), LINK, OPEN by "
         "name; MOUNT MNT: the export path", polars=pl.String),
    column("offset", np.uint64, "READ/WRITE/COMMIT/LOCK/LOCKT/LOCKU offset"),
    column("length", np.uint64, "READ/WRITE count (or the data length returned), LOCK* length "
         "(0xFFFFFFFFFFFFFFFF: to the end of file)"),
    column("lock_type", object, "LOCK/LOCKT/LOCKU locktype (RFC 7530 §16.10): READ_LT, WRITE_LT, READW_LT, "
         "WRITEW_LT", polars=pl.String),
    column("seqid", np.uint32, "open-owner / lock-owner seqid of OPEN, CLOSE, LOCK (lock_seqid), LOCKU"),
    column("share_access", np.uint32, "OPEN share_access (RFC 7530 §16.16: 1 read, 2 write, 3 both; 4.1 want "
         "bits above)"),
    column("share_deny", np.uint32, "OPEN share_deny (RFC 7530 §16.16)"),
    column("open_type", object, "OPEN openhow: OPEN4_NOCREATE or OPEN4_CREATE", polars=pl.String),
    column("claim_type", object, "OPEN claim (RFC 7530 §16.16, RFC 8881 §18.16): CLAIM_NULL, CLAIM_FH ...",
         polars=pl.String),
    column("delegation_type", object, "OPEN result's delegation (RFC 7530 §16.16.2): OPEN_DELEGATE_NONE, "
         "_READ, _WRITE, _NONE_EXT", polars=pl.String),
    column("denied_offset", np.uint64, "NFS4ERR_DENIED: offset of the conflicting lock (LOCK4denied)"),
    column("denied_length", np.uint64, "NFS4ERR_DENIED: length of the conflicting lock"),
    column("denied_type", object, "NFS4ERR_DENIED: locktype of the conflicting lock", polars=pl.String),
    column("clientid", np.uint64, "clientid of an open/lock owner (the holder's, in LOCK4denied), RENEW, "
         "SETCLIENTID(_CONFIRM), EXCHANGE_ID, CREATE_SESSION"),
    column("owner", object, "open/lock owner in hex (OPEN, LOCK, LOCKT; the holder's in LOCK4denied)",
         polars=pl.String),
    column("stateid", object, "stateid 'other' field in hex (RFC 7530 §9.1.4): what CLOSE, LOCKU, READ, "
         "WRITE, DELEGRETURN, CB_RECALL name, or what OPEN/LOCK return", polars=pl.String),
    column("sessionid", object, "SEQUENCE / CB_SEQUENCE / CREATE_SESSION sessionid in hex (RFC 8881 §18.46)",
         polars=pl.String),
    column("slotid", np.uint32, "SEQUENCE / CB_SEQUENCE slotid (RFC 8881 §2.10.6)"),
    column("sequenceid", np.uint32, "SEQUENCE / CB_SEQUENCE sequenceid"),
    column("highest_slotid", np.uint32, "SEQUENCE highest_slotid (the client's in the call, the server's in "
         "the reply)"),
    column("target_highest_slotid", np.uint32, "SEQUENCE / CB_SEQUENCE reply's target_highest_slotid (RFC 8881 "
         "§18.46.3: the highest slot the server wants the client to use)"),
    column("cur_id", np.int64, "id of the current filehandle after this operation: a handle's CRC-32, or an "
         "id for the object a name reached (path resolution in nfs_transactions)"),
    column("dir_id", np.int64, "id of the directory a name is looked up in"),
    column("decode_error", object, "null when the row decoded; else truncated, not rpc, bad rpc version, "
         "bad auth, too many ops, op not decoded (an operation the decoder does not walk: the rest of the "
         "COMPOUND is not decoded)", polars=_ERRORS),
)
MESSAGE_NAMES = tuple(c.name for c in MESSAGE_COLUMNS)
_U64 = set(X.U64_FIELDS)  # travel as int64 bit patterns


def message_direction(ms: MessageSet) -> np.ndarray:
    """True for CALLs (RFC 5531 §9 msg_type 0 at bytes 4-7): the caller is the client of the exchange."""
    if ms.height == 0:
        return np.zeros(0, np.bool_)
    hdr = k.headers(ms.buf, ms.frame["offset"].to_numpy().astype(np.int64),
                    ms.frame["length"].to_numpy().astype(np.int64))
    return hdr[:, 1] != L.REPLY


def _header_frame(sets: Sequence[MessageSet]) -> pl.DataFrame:
    parts = []
    for s, ms in enumerate(sets):
        f = ms.frame
        hdr = k.headers(ms.buf, f["offset"].to_numpy().astype(np.int64), f["length"].to_numpy().astype(np.int64))
        parts.append(pl.DataFrame({
            "set": pl.Series(np.full(f.height, s, np.int64)), "row": pl.Series(np.arange(f.height)),
            "flow": f["flow"], "src": f["src"].cast(pl.String), "dst": f["dst"].cast(pl.String),
            "sport": f["sport"], "dport": f["dport"], "frame_last": f["frame_last"], "ts": f["ts_last_ns"],
            "xid": hdr[:, 0], "mtype": hdr[:, 1], "prog": hdr[:, 2], "vers": hdr[:, 3], "proc": hdr[:, 4],
            "flavor": hdr[:, 5]}))
    return pl.concat(parts).sort("ts", "set", "row").with_columns(pl.int_range(pl.len()).alias("ord"))


def call_hints(sets: Sequence[MessageSet]) -> pl.DataFrame:
    """Per message (set, row): the program, version, procedure and flavour of its call, and the call's frame
    (a reply: the latest earlier call with the same flow and xid sent by the reply's destination)."""
    h = _header_frame(sets)
    key = ["flow", "xid", "caller", "caller_port"]
    calls = h.filter(pl.col("mtype") == L.CALL).select(
        "flow", "xid", pl.col("src").alias("caller"), pl.col("sport").alias("caller_port"), "ord",
        pl.col("prog").alias("c_prog"), pl.col("vers").alias("c_vers"), pl.col("proc").alias("c_proc"),
        pl.col("flavor").alias("c_flavor"), pl.col("frame_last").alias("c_frame"))
    replies = h.filter(pl.col("mtype") == L.REPLY).with_columns(
        pl.col("dst").alias("caller"), pl.col("dport").alias("caller_port"))
    matched = asof_join(replies.sort("ord"), calls.sort("ord"), on="ord", by=key, strategy="backward") \
        .select("set", "row", "c_prog", "c_vers", "c_proc", "c_flavor", "c_frame")
    own = h.filter(pl.col("mtype") != L.REPLY).select(
        "set", "row", pl.col("prog").alias("c_prog"), pl.col("vers").alias("c_vers"),
        pl.col("proc").alias("c_proc"), pl.col("flavor").alias("c_flavor"), pl.col("frame_last").alias("c_frame"))
    return pl.concat([own, matched]).with_columns(pl.col(c).fill_null(-1) for c in ("c_prog", "c_vers", "c_proc",
                                                                                    "c_flavor"))


def _decode_set(ms: MessageSet, hints: pl.DataFrame, first_message: int) -> pl.DataFrame:
    f = ms.frame
    offset = f["offset"].to_numpy().astype(np.int64)
    length = f["length"].to_numpy().astype(np.int64)
    if len(offset) and (offset.min() < 0 or (offset + length).max() > len(ms.buf)):
        raise ValueError("message set offsets/lengths point outside its buffer")
    hints = hints.sort("row")
    hint = np.ascontiguousarray(hints.select("c_prog", "c_vers", "c_proc", "c_flavor").to_numpy().astype(np.int64))
    rows_cap, arena_cap = max(16, 2 * f.height), max(1 << 16, 256 * f.height)
    while True:
        out = np.empty((rows_cap, X.N_FIELDS), np.int64)
        arena = np.empty(arena_cap, np.uint8)
        n_rows, n_bytes, full = k.decode(ms.buf, offset, length, hint, out, arena)
        if not full:
            break
        rows_cap, arena_cap = 2 * rows_cap, 2 * arena_cap
    out = out[:n_rows]
    cols = {}
    for j, name in enumerate(X.FIELDS):
        v = out[:, j]
        # through columns.series, not pa.array(mask=), which imports pandas (~0.25 s of a scan)
        cols[name] = series(name, v.view(np.uint64) if name in _U64 else v, v != X.NULL)
    for j, name in enumerate(X.STRINGS):
        start, n = out[:, X.N_INT + 2 * j], out[:, X.N_INT + 2 * j + 1]
        cols[name] = arena_strings(name, arena, np.maximum(start, 0), np.maximum(n, 0), n >= 0)
    raw = pl.DataFrame(list(cols.values()))
    msg = out[:, X.F_MSG]
    base = f.select([c.name for c in KEPT_COLUMNS])[msg]
    extra = pl.DataFrame({
        "c_prog": hint[msg, 0], "c_vers": hint[msg, 1], "c_proc": hint[msg, 2],
        "call_frame": hints["c_frame"].cast(pl.Int64).fill_null(-1).to_numpy()[msg]}).with_columns(
        pl.col(c).replace(-1, None) for c in ("c_prog", "c_vers", "c_proc", "call_frame"))
    frame = pl.concat([base, raw, extra], how="horizontal").with_columns(
        (pl.col("msg") + first_message).alias("message"))
    return _named(frame)


def _name(code: pl.Expr, table: dict[int, str]) -> pl.Expr:
    return code.replace_strict(list(table), list(table.values()), default=None, return_dtype=pl.String)


def _status_name(code: pl.Expr, table: dict[int, str]) -> pl.Expr:
    return pl.coalesce(_name(code, table), code.cast(pl.String))


def _operation() -> pl.Expr:
    prog, vers, proc, op = pl.col("c_prog"), pl.col("c_vers"), pl.col("c_proc"), pl.col("opcode")
    generic = pl.format("prog {} proc {}", prog, proc)
    named = pl.lit(None, pl.String)
    for number, table in L.PROC_TABLES.items():
        named = pl.when(prog == number).then(pl.concat_str([pl.lit(L.PROGRAMS[number] + " "), _name(proc, table)])) \
            .otherwise(named)
    is_cb = pl.col("is_callback")
    return (pl.when((prog == L.PROG_NFS) & (vers == 4) & op.is_not_null()).then(
                pl.coalesce(_name(op, L.NFS4_OPS), pl.format("OP_{}", op)))
            .when(is_cb & op.is_not_null()).then(pl.coalesce(_name(op, L.CB_OPS), pl.format("CB_OP_{}", op)))
            .when((prog == L.PROG_NFS) & (vers == 4)).then(pl.when(proc == 0).then(pl.lit("NULL"))
                                                           .otherwise(pl.lit("COMPOUND")))
            .when(is_cb).then(pl.when(proc == 0).then(pl.lit("CB_NULL")).otherwise(pl.lit("CB_COMPOUND")))
            .when(prog == L.PROG_NFS).then(pl.coalesce(_name(proc, L.NFS3_PROCS), generic))
            .otherwise(pl.coalesce(named, generic)))


def _named(frame: pl.DataFrame) -> pl.DataFrame:
    is_cb = (pl.col("c_prog") >= L.CB_PROG_FIRST) & (pl.col("c_prog") < L.CB_PROG_END)
    v4 = ((pl.col("c_prog") == L.PROG_NFS) & (pl.col("c_vers") == 4)) | pl.col("is_callback")
    status = (pl.when(pl.col("msg_type") != L.REPLY).then(None)
              .when(pl.col("reply_stat") == 1).then(_status_name(pl.col("reject_stat"), L.REJECT_STATS))
              .when(pl.col("accept_stat") != 0).then(_status_name(pl.col("accept_stat"), L.ACCEPT_STATS))
              .when(pl.col("op_status").is_not_null()).then(_status_name(pl.col("op_status"), L.NFS4_STATUS))
              .when(pl.col("nfs_status").is_not_null() & v4).then(_status_name(pl.col("nfs_status"), L.NFS4_STATUS))
              .when(pl.col("nfs_status").is_not_null() & (pl.col("c_prog") == L.PROG_NFS))
              .then(_status_name(pl.col("nfs_status"), L.NFS3_STATUS))
              .when(pl.col("nfs_status").is_not_null() & (pl.col("c_prog") == L.PROG_NLM))
              .then(_status_name(pl.col("nfs_status"), L.NLM_STATUS))
              .when(pl.col("nfs_status").is_not_null() & (pl.col("c_prog") == L.PROG_MOUNT))
              .then(_status_name(pl.col("nfs_status"), L.MOUNT_STATUS))
              .when(pl.col("nfs_status").is_not_null()).then(pl.col("nfs_status").cast(pl.String))
              .when(pl.col("accept_stat") == 0).then(pl.lit("SUCCESS")))
    frame = frame.with_columns(is_cb.fill_null(False).alias("is_callback"))
    return frame.with_columns(
        pl.col("msg_type").replace_strict(list(L.MSG_TYPES), list(L.MSG_TYPES.values()), default=None,
                                          return_dtype=pl.String).cast(_MSG_TYPES),
        pl.col("c_prog").alias("program"), pl.col("c_vers").alias("version"), pl.col("c_proc").alias("procedure"),
        _operation().alias("operation"),
        status.alias("status"),
        _name(pl.col("lock_type"), L.LOCK_TYPES).alias("lock_type"),
        _name(pl.col("denied_type"), L.LOCK_TYPES).alias("denied_type"),
        _name(pl.col("open_type"), L.OPEN_TYPES).alias("open_type"),
        _name(pl.col("claim_type"), L.CLAIM_TYPES).alias("claim_type"),
        _name(pl.col("delegation_type"), L.DELEGATION_TYPES).alias("delegation_type"),
        _name(pl.col("decode_error"), dict(enumerate(L.DECODE_ERRORS, start=1))).cast(_ERRORS).alias("decode_error"),
        pl.when(pl.col("msg_type") == L.CALL).then(pl.col("frame_last")).otherwise(pl.col("call_frame"))
        .alias("call_frame"),
    )


def _cast(frame: pl.DataFrame) -> pl.DataFrame:
    schema = {c.name: polars_type(c) for c in MESSAGE_COLUMNS}
    return frame.select([pl.col(n).cast(schema[n]) for n in MESSAGE_NAMES])


def decode_messages(sets: Sequence[MessageSet]) -> pl.DataFrame:
    """The ``nfs_messages`` frame of RPC message sets (see the module doc)."""
    for ms in sets:
        if not isinstance(ms, MessageSet):
            raise TypeError(f"expected MessageSet, got {type(ms).__name__}")
        missing = {c.name for c in _SET_COLUMNS} - set(ms.frame.columns)
        if missing:
            raise ValueError(f"message set lacks columns {sorted(missing)}")
    sets = [ms for ms in sets if ms.height]
    if not sets:
        return empty_frame(MESSAGE_COLUMNS)
    hints = call_hints(sets)
    frames, first = [], 0
    for s, ms in enumerate(sets):
        frames.append(_cast(_decode_set(ms, hints.filter(pl.col("set") == s), first)))
        first += ms.height
    frame = pl.concat(frames) if len(frames) > 1 else frames[0]
    return frame.sort("ts_last_ns", "message", "op_index", maintain_order=True)


def message_sets(cap) -> list[MessageSet]:
    """RPC message sets of a capture: TCP and UDP on PROTOCOL's ports, and RPC between the same hosts on
    ports learned at run time: the NFSv4.0 callback channel (the server connects to the port the client
    named in SETCLIENTID's cb_location, RFC 7530 §3.3.5, §16.33) and NLM / MOUNT / STATUS on the ports
    the portmapper handed out (RFC 1833). Candidates are the TCP connections and UDP flows between
    hosts seen speaking RPC on the declared ports (:func:`analyzer.messages.peer_connections`,
    :func:`~analyzer.messages.peer_datagrams`); one counts when its first message is an RPC CALL
    (:func:`rpc_calls`)."""
    sets = protocol_message_sets(cap, PROTOCOL)
    learned = _learned_tcp_sets(cap, sets)
    first = peer_datagrams(cap, sets, PROTOCOL)
    flows = first.filter(pl.Series(rpc_calls(cap.buf, first["offset"].to_numpy(), first["length"].to_numpy())))
    if flows.height:  # UDP again, with the learned flows (flow ids are numbered over one call)
        sets = [ms for ms in sets if ms.frame["transport"].cast(pl.String).ne("udp").all()]
        sets += udp_messages(cap, set(PROTOCOL.udp_ports), direction=message_direction, also_flows=flows)
    return sets + learned


def rpc_calls(buf, offset, length) -> np.ndarray:
    """Per message (OFFSET, LENGTH in BUF): an RPC CALL (msg_type 0, rpcvers 2, RFC 5531 §9) to a program
    of :data:`nfs_layout.PROGRAMS` or of the callback range (RFC 7530 §16.33.1: 0x40000000-0x5fffffff)."""
    off, n = np.asarray(offset, np.int64), np.asarray(length, np.int64)
    if off.size == 0:
        return np.zeros(0, np.bool_)
    hdr = k.headers(buf, off, n)
    whole = (n >= 12) & (off >= 0) & (off + 12 <= buf.shape[0])
    at = np.where(whole, off + 8, 0)[:, None] + np.arange(4)
    word = (buf[at].astype(np.int64) << np.array([24, 16, 8, 0])).sum(axis=1) if buf.shape[0] >= 4 else 0
    rpcvers = np.where(whole, word, -1)
    prog = hdr[:, 2]
    known = np.isin(prog, np.array(list(L.PROGRAMS), np.int64)) | ((prog >= L.CB_PROG_FIRST) & (prog < L.CB_PROG_END))
    return (hdr[:, 1] == L.CALL) & (rpcvers == 2) & known


def _learned_tcp_sets(cap, sets: list[MessageSet]) -> list[MessageSet]:
    """The candidate TCP connections whose initiator's first message is an RPC call, framed."""
    cands = peer_connections(cap, sets, PROTOCOL)
    if not cands:
        return []
    out = []
    for ms in tcp_messages(cap, PROTOCOL.tcp_framing, set(), client_side="connection_initiator", also_conns=cands):
        f = ms.frame.with_row_index("_row")
        first = f.filter(pl.col("from_client")).sort("ts_first_ns", "_row").group_by("flow", maintain_order=True).first()
        ok = first["flow"].filter(pl.Series(rpc_calls(ms.buf, first["offset"].to_numpy(), first["length"].to_numpy())))
        keep = f.filter(pl.col("flow").is_in(ok.implode())).drop("_row")
        if keep.height == 0:
            continue
        keep = keep.with_columns(pl.Series("from_client", message_direction(MessageSet(keep, ms.buf, ms.stats))))
        out.append(MessageSet(keep, ms.buf, ms.stats.filter(pl.col("conn").is_in(ok.cast(pl.UInt32).implode()))))
    return out


def outcome_rules() -> tuple[str, str]:
    """(what counts as an error, when a call counts as unanswered): ``herdscope stats --help``."""
    p = Params()
    return ("a reply that was denied (RPC_MISMATCH, AUTH_ERROR) or not accepted with SUCCESS (PROG_UNAVAIL, "
            "GARBAGE_ARGS ...), or whose NFS status is not NFS3_OK / NFS4_OK (the operation's own status in a "
            "COMPOUND, else the COMPOUND's); MOUNT: a non-zero fhstatus; NLM: a stat other than NLM4_GRANTED or "
            "NLM4_BLOCKED (queued: a GRANTED callback follows).",
            f"no reply with the call's xid on its flow, from the server it was sent to, before the capture ends; "
            f"the same call again within {unbroken_duration(p.retransmission_window_ns)} while unanswered is a "
            f"retransmission of it (counted in retransmissions), not a new call.")


FRAMES.setdefault("nfs_messages", MESSAGE_COLUMNS)
FRAMES.setdefault("nfs_transactions", TRANSACTION_COLUMNS)


@frame_builder("nfs_messages")
def _build_messages(cap) -> pl.DataFrame:
    return decode_messages(message_sets(cap))


@frame_builder("nfs_transactions")
def _build_transactions(cap) -> pl.DataFrame:
    return pair_transactions(cap.frame("nfs_messages"))
