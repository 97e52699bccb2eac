"""LDAP content synchronisation (RFC 4533 syncrepl) and replicated entry states: the ``ldap_sync`` frame.

Built from the LDAP message sets (TCP 389/3268, CLDAP; :mod:`analyzer.decoders.ldap`, which registers
this frame's builder) by a second Numba pass over the LDAPMessages (:mod:`.ldap_sync_kernels`; pass 1,
:func:`.ldap_message_units.units`, is shared with ``ldap_messages``), keeping what replication needs and
``ldap_messages`` does not: one row per LDAPMessage that

- carries an RFC 4533 control or response: a searchRequest with the Sync Request control (§2.2,
  ``1.3.6.1.4.1.4203.1.9.1.1``: the consumer starts or resumes a refresh; ``kind`` sync_request), a
  searchResultEntry with the Sync State control (§2.3, ``.1.2``: one replicated entry state pushed by
  the provider; ``sync_state``), a searchResultDone with the Sync Done control (§2.4, ``.1.3``;
  ``sync_done``), an intermediateResponse whose responseName is Sync Info (§2.5, ``.1.4``: newcookie,
  refreshDelete, refreshPresent, syncIdSet; ``sync_info``);
- is a searchResultEntry without those controls that shows an ``entryCSN`` or ``entryUUID`` value
  or an Active Directory conflict DN (``entry``);
- is a write: modifyRequest (RFC 4511 §4.6), addRequest (§4.7), delRequest (§4.8), modDNRequest (§4.9)
  (``modify``, ``add``, ``delete``, ``moddn``).

Columns: ``frame`` / ``ts_ns`` (the message's last frame and its time, as ``ldap_messages``'
``frame_last`` / ``ts_last_ns``, = ``request_frame`` of ``ldap_transactions`` for a write), the
message's addresses and connection (``flow``), ``message_id``; ``server`` and ``client`` (the server is
the side answering: the destination of requests, the source of entries and responses; for sync rows
the server is the *provider* and the client the *consumer*); ``dn``; ``entry_uuid`` (the Sync State
control's 16-octet syncUUID as RFC 4122 text, else the entry's ``entryUUID`` value, lower case);
``state`` (present / add / modify / delete); ``sync_mode`` (refreshOnly / refreshAndPersist),
``reload_hint``; ``cookie`` (the syncCookie of the control or Sync Info, as text) and its OpenLDAP
parts (``rid=NNN,sid=XXX,csn=...``: ``cookie_rid`` decimal, ``cookie_sid`` hexadecimal, ``cookie_csn``
the CSN list); ``info`` (the syncInfoValue choice), ``refresh_done``, ``refresh_deletes``, ``sync_ids``
(UUIDs in a syncIdSet); ``result_code`` of a searchResultDone (4096 e-syncRefreshRequired);
``entry_csn`` (the first ``entryCSN`` value) parsed as OpenLDAP writes it (``YYYYmmddHHMMSS.uuuuuuZ#
cccccc#sid#mmmmmm``, servers/slapd/ctxcsn.c / lutil_csnstr: µs UTC timestamp, change count, server id,
modification count, the last three hexadecimal) into ``csn_ts_ns``, ``csn_count``, ``csn_sid``,
``csn_mod`` (null when the text is not that shape); ``conflict_guid``: the objectGUID after ``CNF:``
when the entry's DN is an Active Directory conflict object (``<RDN>\\0ACNF:<objectGUID>``, MS-ADTS
3.1.1.5.5.6.2); per attribute of an entry, add or modify (lists, one element per attribute or change
in wire order): ``attributes`` (names), ``ops`` (modify: add / delete / replace / increment; null
otherwise), ``value_counts``, ``value_digests`` (FNV-1a 64 over every value's length and octets: equal
digests mean equal value lists) and ``values`` (the first value as text, at most
``ldap_sync_kernels.MAX_VALUE_TEXT`` bytes); ``decode_error`` (null when fine: damage is a counted
reason, what was read before it is kept).

tshark 4.x names: ldap.mode, ldap.reloadHint, ldap.cookie, ldap.state, ldap.entryUUID,
ldap.refreshDeletes, ldap.SyncInfoValue, ldap.newcookie, ldap.refreshDone, ldap.syncUUIDs,
ldap.objectName, ldap.type, ldap.AttributeValue (tests/test_ldap_sync_conformance.py).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from ..schema import FRAMES, Column, column, empty_frame, polars_type
from . import ber
from . import ldap_sync_kernels as K
from .ldap_message_units import units

KINDS = ("sync_request", "sync_state", "sync_done", "sync_info", "entry", "modify", "add", "delete", "moddn")
KIND_ENUM = pl.Enum(list(KINDS))
STATES = {0: "present", 1: "add", 2: "modify", 3: "delete"}  # RFC 4533 §2.3
STATE_ENUM = pl.Enum(list(STATES.values()))
MODES = {1: "refreshOnly", 3: "refreshAndPersist"}  # §2.2
INFOS = {0: "newcookie", 1: "refreshDelete", 2: "refreshPresent", 3: "syncIdSet"}  # §2.5
INFO_ENUM = pl.Enum(list(INFOS.values()))
MOD_OPS = {0: "add", 1: "delete", 2: "replace", 3: "increment"}  # RFC 4511 §4.6, RFC 4525
REQUEST_OPS = (3, 6, 8, 10, 12)
WRITE_KINDS = {6: "modify", 8: "add", 10: "delete", 12: "moddn"}
# OpenLDAP CSN text (lutil_csnstr): 14 digits, '.', 6 digits of µs, 'Z', three '#'-separated hex fields
CSN_RE = r"^(\d{14})\.(\d{1,6})Z#([0-9a-fA-F]{1,8})#([0-9a-fA-F]{1,4})#([0-9a-fA-F]{1,8})$"

SYNC_COLUMNS: tuple[Column, ...] = (
    column("frame", np.uint32, "last frame of the message (ldap_messages.frame_last)"),
    column("ts_ns", np.int64, "time of that frame"),
    column("transport", object, "tcp or udp", polars=pl.String),
    column("flow", np.uint32, "TCP connection id (CLDAP: flow id)"),
    column("src", object, "source address", polars=pl.String),
    column("dst", object, "destination address", polars=pl.String),
    column("sport", np.uint16, "source port"),
    column("dport", np.uint16, "destination port"),
    column("message_id", np.int64, "messageID (RFC 4511 §4.1.1.1)"),
    column("kind", object, "sync_request / sync_state / sync_done / sync_info (RFC 4533 §2.2-§2.5), entry "
         "(a searchResultEntry showing entryCSN / entryUUID / a CNF DN), modify / add / delete / moddn",
         polars=KIND_ENUM),
    column("server", object, "the answering side: destination of a request, source of an entry or response "
         "(sync rows: the provider)", polars=pl.String),
    column("client", object, "the other side (sync rows: the consumer)", polars=pl.String),
    column("dn", object, "objectName of the entry, object of the write, baseObject of the sync search",
         polars=pl.String),
    column("entry_uuid", object, "Sync State syncUUID as RFC 4122 text, else the entryUUID value (lower case)",
         polars=pl.String),
    column("state", object, "Sync State state (§2.3)", polars=STATE_ENUM),
    column("sync_mode", object, "Sync Request mode (§2.2)", polars=pl.String),
    column("reload_hint", np.bool_, "Sync Request reloadHint (§2.2)"),
    column("cookie", object, "syncCookie (§2.1) of the control or Sync Info, as text", polars=pl.String),
    column("cookie_rid", np.int32, "OpenLDAP cookie rid= (decimal: the consumer's replica id)"),
    column("cookie_sid", np.int32, "OpenLDAP cookie sid= (hexadecimal: the sending server's id)"),
    column("cookie_csn", object, "OpenLDAP cookie csn= (';'-separated CSNs, one per server id)",
         polars=pl.String),
    column("info", object, "Sync Info choice (§2.5)", polars=INFO_ENUM),
    column("refresh_done", np.bool_, "Sync Info refreshDelete / refreshPresent refreshDone (§2.5)"),
    column("refresh_deletes", np.bool_, "Sync Done / syncIdSet refreshDeletes (§2.4, §2.5)"),
    column("sync_ids", np.uint32, "syncIdSet: number of syncUUIDs (§2.5)"),
    column("result_code", np.int32, "searchResultDone resultCode (4096: e-syncRefreshRequired, §2.6)"),
    column("entry_csn", object, "the first entryCSN value (OpenLDAP change sequence number)", polars=pl.String),
    column("csn_ts_ns", np.int64, "entryCSN timestamp (µs resolution, UTC) as ns since the epoch"),
    column("csn_count", np.uint32, "entryCSN change count (hex field 2)"),
    column("csn_sid", np.uint16, "entryCSN server id (hex field 3): the provider that made the change"),
    column("csn_mod", np.uint32, "entryCSN modification count (hex field 4)"),
    column("conflict_guid", object, "Active Directory conflict object: the objectGUID after CNF: in the DN "
         "(MS-ADTS 3.1.1.5.5.6.2); null otherwise", polars=pl.String),
    column("attributes", object, "attribute names (entries, add) or modified attributes (modify), wire order",
         polars=pl.List(pl.String)),
    column("ops", object, "modify: each change's operation (add / delete / replace / increment)",
         polars=pl.List(pl.String)),
    column("value_counts", object, "number of values per attribute", polars=pl.List(pl.UInt32)),
    column("value_digests", object, "FNV-1a 64 digest of each attribute's values (lengths and octets)",
         polars=pl.List(pl.UInt64)),
    column("values", object, "each attribute's first value as text (at most 256 bytes)",
         polars=pl.List(pl.String)),
    column("decode_error", object, "null when the message decoded; else why not", polars=pl.String),
)
FRAMES.setdefault("ldap_sync", SYNC_COLUMNS)

_STR_NAMES = ("dn", "_uuid_ctrl", "cookie", "entry_csn", "_uuid_attr", "conflict_guid")


def _set_rows(ms, set_units=None) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    u_start, u_end, u_kind, u_msg, _ = units(ms) if set_units is None else set_units
    n = u_start.shape[0]
    if n == 0:
        return None
    ints = np.empty((K.N_Q, n), np.int64)  # filled for the kept rows only: pages of the rest stay untouched
    spans = np.empty((2 * K.N_T, n), np.int64)
    kept_units = np.empty(n, np.int64)
    size = int((u_end - u_start).sum()) * 2 + 64 * n + 1024
    cap_children = 8 * n + 64
    while True:  # grow on the rare overflow (escapes, many attributes)
        arena = np.empty(size, np.uint8)
        c_row = np.empty(cap_children, np.int64)
        c_ints = np.empty((K.N_C, cap_children), np.int64)
        c_hash = np.empty(cap_children, np.uint64)
        c_spans = np.empty((4, cap_children), np.int64)
        used, nc, kept = K.sync_decode(ms.buf, u_start, u_end, u_kind, ints, spans, kept_units, arena, c_row,
                                       c_ints, c_hash, c_spans)
        if used >= 0 and nc >= 0:
            break
        if used < 0:
            size *= 2
        if nc < 0:
            cap_children *= 2
    arena = arena[:used]
    rows = kept_units[:kept]  # the units that are rows of the frame (ldap_sync_kernels._kept)
    if rows.shape[0] == 0:
        return None
    base = ms.frame[u_msg[rows]].select(
        pl.col("frame_last").alias("frame"), pl.col("ts_last_ns").alias("ts_ns"),
        pl.col("transport").cast(pl.String), "flow", pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String),
        "sport", "dport")
    sub_i, sub_s = ints[:, :kept], spans[:, :kept]
    dec = pl.DataFrame([
        ber.int_column("message_id", sub_i[K.Q_MSGID], pl.Int64),
        ber.int_column("_op", sub_i[K.Q_OP], pl.Int64),
        ber.int_column("_ctrl", sub_i[K.Q_CTRL], pl.Int64),
        ber.int_column("_state", sub_i[K.Q_STATE], pl.Int64),
        ber.int_column("_mode", sub_i[K.Q_MODE], pl.Int64),
        ber.int_column("_info", sub_i[K.Q_INFO], pl.Int64),
        ber.int_column("reload_hint", sub_i[K.Q_RELOAD], pl.Boolean),
        ber.int_column("refresh_done", sub_i[K.Q_REFRESH_DONE], pl.Boolean),
        ber.int_column("refresh_deletes", sub_i[K.Q_REFRESH_DELETES], pl.Boolean),
        ber.int_column("sync_ids", sub_i[K.Q_IDS], pl.UInt32),
        ber.int_column("result_code", sub_i[K.Q_RESULT], pl.Int32),
        ber.int_column("_row", rows.astype(np.int64), pl.Int64),
        *ber.string_columns(_STR_NAMES, arena, sub_s),
        ber.status_column("decode_error", sub_i[K.Q_STATUS]),
    ])
    frame = pl.concat([base, dec], how="horizontal")
    children = pl.DataFrame()
    if nc:
        cs = c_spans[:, :nc]
        children = pl.DataFrame([
            pl.Series("_row", c_row[:nc]),
            ber.int_column("_cop", c_ints[K.C_OP, :nc], pl.Int64),
            pl.Series("_nv", c_ints[K.C_NVALS, :nc]).cast(pl.UInt32),
            pl.Series("_digest", c_hash[:nc]),
            *ber.string_columns(("_name", "_value"), arena, cs),
        ]).filter(pl.col("_row").is_in(pl.Series(rows.astype(np.int64)).implode()))
    return frame, children


def _finish(frame: pl.DataFrame, children: pl.DataFrame) -> pl.DataFrame:
    op = pl.col("_op")
    ctrl = pl.col("_ctrl")
    kind = (pl.when((op == 3) & ((ctrl & int(K.CTRL_REQUEST)) != 0)).then(pl.lit("sync_request"))
            .when((op == 4) & ((ctrl & int(K.CTRL_STATE)) != 0)).then(pl.lit("sync_state"))
            .when(op == 4).then(pl.lit("entry"))
            .when(op == 5).then(pl.lit("sync_done"))
            .when(op == 25).then(pl.lit("sync_info"))
            .otherwise(op.replace_strict(WRITE_KINDS, default=None, return_dtype=pl.String)))
    request = op.is_in(list(REQUEST_OPS))
    csn = pl.col("entry_csn").str.extract_groups(CSN_RE)
    if children.height:
        lists = children.group_by("_row", maintain_order=True).agg(
            pl.col("_name").alias("attributes"),
            pl.col("_cop").replace_strict(MOD_OPS, default=None, return_dtype=pl.String).alias("ops"),
            pl.col("_nv").alias("value_counts"), pl.col("_digest").alias("value_digests"),
            pl.col("_value").alias("values"))
        frame = frame.join(lists, on="_row", how="left", maintain_order="left")
    else:
        frame = frame.with_columns(*[pl.lit(None, polars_type(c)).alias(c.name) for c in SYNC_COLUMNS
                                     if c.name in ("attributes", "ops", "value_counts", "value_digests", "values")])
    out = frame.with_columns(
        kind.cast(KIND_ENUM).alias("kind"),
        pl.when(request).then(pl.col("dst")).otherwise(pl.col("src")).alias("server"),
        pl.when(request).then(pl.col("src")).otherwise(pl.col("dst")).alias("client"),
        pl.coalesce(pl.col("_uuid_ctrl"), pl.col("_uuid_attr").str.to_lowercase()).alias("entry_uuid"),
        pl.col("_state").replace_strict(STATES, default=None, return_dtype=pl.String).cast(STATE_ENUM).alias("state"),
        pl.col("_mode").replace_strict(MODES, default=None, return_dtype=pl.String)
        .fill_null(pl.format("mode{}", pl.col("_mode"))).alias("sync_mode"),
        pl.col("_info").replace_strict(INFOS, default=None, return_dtype=pl.String).cast(INFO_ENUM).alias("info"),
        pl.col("cookie").str.extract(r"(?:^|,)rid=(\d{1,9})(?:,|$)").str.to_integer(strict=False)
        .cast(pl.Int32, strict=False).alias("cookie_rid"),
        pl.col("cookie").str.extract(r"(?:^|,)sid=([0-9a-fA-F]{1,4})(?:,|$)").str.to_integer(base=16, strict=False)
        .cast(pl.Int32, strict=False).alias("cookie_sid"),
        pl.col("cookie").str.extract(r"(?:^|,)csn=(.*)$").alias("cookie_csn"),
        (csn.struct.field("1").str.to_datetime("%Y%m%d%H%M%S", time_unit="ns", time_zone="UTC", strict=False)
         .dt.epoch("ns") + csn.struct.field("2").str.pad_end(6, "0").cast(pl.Int64, strict=False) * 1000)
        .alias("csn_ts_ns"),
        csn.struct.field("3").str.to_integer(base=16, strict=False).cast(pl.UInt32, strict=False).alias("csn_count"),
        csn.struct.field("4").str.to_integer(base=16, strict=False).cast(pl.UInt16, strict=False).alias("csn_sid"),
        csn.struct.field("5").str.to_integer(base=16, strict=False).cast(pl.UInt32, strict=False).alias("csn_mod"),
    )
    return out.select([pl.col(c.name).cast(polars_type(c)) for c in SYNC_COLUMNS])


def decode_sync(sets, set_units=None) -> pl.DataFrame:
    """LDAP message sets → ldap_sync rows, in time order (rules in the module docstring). ``set_units``:
    each set's :func:`.ldap_message_units.units`, when the caller has them (shared with ldap_messages)."""
    if set_units is None:
        set_units = [None] * len(sets)
    parts = [p for p in (_set_rows(ms, u) for ms, u in zip(sets, set_units) if ms.height) if p is not None]
    if not parts:
        return empty_frame(SYNC_COLUMNS)
    out = [_finish(frame, children) for frame, children in parts]
    return pl.concat(out, how="vertical_relaxed").sort("ts_ns", "frame", maintain_order=True)
