"""The toctou detector's events (see detectors/toctou.py for what a check, a use and a resource are): one
row per SMB2 or LDAP request that checks or uses a resource, with the resource key, the client, the
handle it goes through and what it reads or writes (byte range, attribute set), in capture order.

- SMB2 (``smb2_transactions``): CREATE, QUERY_INFO and READ check; WRITE, SET_INFO (rename, link,
  delete disposition, end of file ...) and CREATE that overwrites, supersedes or creates use. A rename
  or link also changes its target path. Clients per session (:func:`session_client`).
- LDAP (``ldap_transactions`` + ``ldap_messages``): a baseObject search and a compare check, modify /
  add / delete / modDN use; a modDN also changes the new DN, a search checks the entries it returned.
  Attribute sets are 62-bit hashed masks (:func:`attribute_mask`).
"""
from __future__ import annotations

import polars as pl

from analyzer.decoders.smb2_tables import FILE_DELETE_ON_CLOSE
from analyzer.wide_frames import gathered, selected_rows

from .base import client_identity, optional_frame, via_unique
from .smb_break_queue import path_key

# MS-SMB2 2.2.13 ShareAccess: an open that does not share write access cannot be raced by a writer
FILE_SHARE_WRITE = 0x2
FILE_SHARE_ALL = 0x7  # READ | WRITE | DELETE: what an open whose ShareAccess was not captured is taken to allow

# ``sub``: the order of the events one request makes (ties in time and frame broken by it)
SUB_RENAME_TARGET = 1000  # added to a rename's own sub: the target path it also changes
SUB_MODDN_TARGET = 1  # a modDN's new DN
SUB_SEARCH_ENTRY = 2  # an entry a search returned

ATTRIBUTE_MASK_BITS = 62  # attribute names hashed into this many bits (an Int64 mask, sign bit unused)
_ATTRIBUTE_HASH_SEED = 7

EVENT_SCHEMA = {
    "proto": pl.String, "server": pl.String, "key": pl.String, "resource": pl.String, "cid": pl.String,
    "ident_rule": pl.String, "ts": pl.Int64, "resp_ts": pl.Int64, "frame": pl.UInt32, "resp_frame": pl.UInt32,
    "sub": pl.Int64, "op": pl.String, "check": pl.Boolean, "write_op": pl.Boolean, "ok": pl.Boolean,
    "open_use": pl.Boolean, "conditional": pl.Boolean, "fid": pl.String, "open_share": pl.Int64,
    "off": pl.Int64, "len": pl.Int64, "mask": pl.Int64, "rmask": pl.Int64, "read_content": pl.Boolean,
    "status": pl.String,
}


# -- SMB2 ---------------------------------------------------------------------------------------------

smb_key = path_key  # one copy: the case-insensitive share + path key of smb_break_queue


_SMB_CHANGE_INFO = ("FileRenameInformation", "FileRenameInformationEx", "FileLinkInformation",
                    "FileDispositionInformation", "FileDispositionInformationEx", "FileEndOfFileInformation",
                    "FileAllocationInformation", "FileValidDataLengthInformation")
_RENAMES = ("FileRenameInformation", "FileRenameInformationEx", "FileLinkInformation")


def session_client(tx: pl.DataFrame, ident: pl.Expr) -> pl.Expr:
    """The client of each SMB2 request, one per session: connections that carry the same SessionId to
    one server are channels of one session (SMB 3 multichannel, MS-SMB2 3.2.4.1.7 and 3.3.5.5.2: a
    channel binds to an existing session), so they are one client however many connections, ports or
    addresses it uses. The session's client is the identity of its earliest request (``ident``, the
    address or address+port rule); requests without a SessionId (0 or missing) keep ``ident``."""
    if "session_id" not in tx.columns:
        return ident
    sid = pl.col("session_id")
    keyed = sid.is_not_null() & (sid != 0) & pl.col("server").is_not_null()
    first = ident.sort_by(pl.col("request_ts_ns").fill_null(0), pl.col("request_frame").fill_null(0)) \
        .first().over(pl.col("server").cast(pl.String), sid)
    return pl.when(keyed).then(first).otherwise(ident)


def smb_events(tx: pl.DataFrame) -> pl.DataFrame:
    if tx is None or tx.height == 0:
        return pl.DataFrame(schema=EVENT_SCHEMA)
    ident, rule = client_identity(tx)
    tx = tx.with_columns(session_client(tx, ident).alias("_cid"))
    opens_of = tx.filter(pl.col("operation") == "CREATE")
    tx = tx.filter(pl.col("operation").is_in(["CREATE", "WRITE", "SET_INFO", "QUERY_INFO", "READ"])
                   & pl.col("path").is_not_null())
    if tx.height == 0:
        return pl.DataFrame(schema=EVENT_SCHEMA)
    op = pl.col("operation")
    status = pl.col("status")
    ok = pl.col("answered").fill_null(False) & ~pl.col("is_error").fill_null(True)
    disp = pl.col("create_disposition").cast(pl.String)
    action = pl.col("create_action").cast(pl.String)
    info = pl.col("info_class_name")
    create = op == "CREATE"
    delete_on_close = (pl.col("create_options").fill_null(0) & FILE_DELETE_ON_CLOSE) != 0
    write_op = (
        (op == "WRITE")
        | (create & (disp.is_in(["SUPERSEDE", "OVERWRITE", "OVERWRITE_IF", "CREATE"]) | delete_on_close
                     | (ok & action.is_in(["CREATED", "OVERWRITTEN", "SUPERSEDED"]))))
        | ((op == "SET_INFO") & info.is_in(list(_SMB_CHANGE_INFO))
           & (pl.col("delete_pending").fill_null(True) | ~info.str.starts_with("FileDisposition")))
    ).fill_null(False)
    check = (~write_op & (
        (create & disp.is_in(["OPEN", "OPEN_IF"]) & (ok | (status == "STATUS_OBJECT_NAME_NOT_FOUND")))
        | (op.is_in(["QUERY_INFO", "READ"]) & ok))).fill_null(False)
    fid = pl.concat_str([pl.col("server").cast(pl.String), pl.lit("|"), pl.col("fid_persistent").cast(pl.String),
                         pl.lit(":"), pl.col("fid_volatile").cast(pl.String)])
    label = (pl.when(create).then(pl.format("CREATE ({})", disp.fill_null("?")))
             .when(op == "SET_INFO").then(pl.concat_str([pl.lit("SET_INFO "), info.fill_null("?"),
                                                         pl.when(info.is_in(list(_RENAMES)))
                                                         .then(pl.concat_str([pl.lit(" -> "), pl.col("target_name")]))
                                                         .otherwise(pl.lit(""))]))
             .when(op == "WRITE").then(pl.format("WRITE of {} bytes at offset {}", pl.col("io_length"),
                                                 pl.col("file_offset")))
             .when(op == "QUERY_INFO").then(pl.format("QUERY_INFO {}", info.fill_null("?")))
             .otherwise(op))
    base = tx.with_columns(write_op.alias("_w"), check.alias("_c"), ok.alias("_ok")).filter(
        pl.col("path").is_not_null() & (pl.col("_w") | pl.col("_c")))
    if base.height == 0:
        return pl.DataFrame(schema=EVENT_SCHEMA)
    # the ShareAccess of the open each request goes through (a CREATE's own)
    opens = opens_of.filter(ok & pl.col("fid_persistent").is_not_null()).select(
        fid.alias("fid"), pl.col("share_access").cast(pl.Int64).alias("open_share")).unique("fid", keep="last")
    ev = base.select(
        pl.lit("smb2").alias("proto"), pl.col("server").cast(pl.String),
        smb_key(pl.col("share"), pl.col("path")).alias("key"), pl.col("path").alias("resource"),
        pl.col("_cid").alias("cid"), pl.lit(rule).alias("ident_rule"),
        pl.col("request_ts_ns").alias("ts"), pl.col("response_ts_ns").alias("resp_ts"),
        pl.col("request_frame").alias("frame"), pl.col("response_frame").alias("resp_frame"),
        pl.col("chain_index").cast(pl.Int64).fill_null(0).alias("sub"),
        label.alias("op"), pl.col("_c").alias("check"), pl.col("_w").alias("write_op"), pl.col("_ok").alias("ok"),
        (pl.col("_c") & create & pl.col("_ok")).alias("open_use"), pl.lit(False).alias("conditional"),
        fid.alias("fid"),
        pl.when(op == "WRITE").then(pl.col("file_offset").cast(pl.Int64)).otherwise(-1).alias("off"),
        pl.when(op == "WRITE").then(pl.col("io_length").cast(pl.Int64)).otherwise(-1).alias("len"),
        pl.lit(-1, pl.Int64).alias("mask"), pl.lit(-1, pl.Int64).alias("rmask"), (op == "READ").alias("read_content"),
        status.alias("status"),
        info.is_in(list(_RENAMES)).fill_null(False).alias("_rename"), pl.col("share"), pl.col("target_name"),
    ).join(opens, on="fid", how="left")
    # a rename or link also changes its target path (FileName is relative to the share root)
    ren = ev.filter(pl.col("_rename") & pl.col("target_name").is_not_null())
    if ren.height:
        tgt = pl.col("target_name").str.strip_chars("\\")
        ren = ren.with_columns(
            smb_key(pl.col("share"), pl.concat_str([pl.col("share").fill_null(""), pl.lit("\\"), tgt]))
            .alias("key"),
            pl.when(pl.col("share").is_null()).then(tgt).otherwise(
                pl.concat_str([pl.col("share"), pl.lit("\\"), tgt])).alias("resource"),
            (pl.col("sub") + SUB_RENAME_TARGET).alias("sub"))
        ev = pl.concat([ev, ren])
    return ev.select(list(EVENT_SCHEMA)).cast(EVENT_SCHEMA)


# -- LDAP ---------------------------------------------------------------------------------------------

def dn_key(dn: pl.Expr) -> pl.Expr:
    """Normalised DN for matching: lower case, no blanks around ``,`` ``=`` ``+``."""
    return dn.str.strip_chars().str.replace_all(r"\s*([,=+])\s*", "$1").str.to_lowercase()


_ATTRS = r"\(([^)]*)\)"


def _attr_list(changes: pl.Expr, op: str | None = None) -> pl.Expr:
    pat = (op + r"\([^)]*\)") if op else r"\w+\([^)]*\)"
    return changes.str.extract_all(pat).list.eval(
        pl.element().str.extract(_ATTRS, 1).str.to_lowercase().str.replace(r";.*$", ""))


def attribute_mask(names: pl.Expr) -> pl.Expr:
    """A 62-bit set of attribute names (hashed; a shared bit only ever adds a conflict)."""
    bits = names.list.eval(pl.element().hash(_ATTRIBUTE_HASH_SEED) % ATTRIBUTE_MASK_BITS).list.unique()
    return bits.list.eval(pl.lit(2, pl.Int64).pow(pl.element())).list.sum().cast(pl.Int64)


def _read_mask(attributes: pl.Expr) -> pl.Expr:
    """What a search (its attribute selection, RFC 4511 4.5.1.8) or compare read: -1 for all (none
    listed, ``*`` or ``+``), 0 for none (``1.1``)."""
    names = attributes.str.split(",").list.eval(
        pl.element().str.strip_chars().str.to_lowercase().str.replace(r";.*$", "")).list.eval(
        pl.element().filter(pl.element() != ""))
    everything = attributes.is_null() | (names.list.len() == 0) | names.list.contains("*") | names.list.contains("+")
    only_none = names.list.eval(pl.element() == "1.1").list.all()
    return pl.when(everything).then(-1).when(only_none).then(0) \
        .otherwise(attribute_mask(names.list.eval(pl.element().filter(pl.element() != "1.1")))).cast(pl.Int64)


# what ldap_events reads of ldap_messages: a write's request fields the transaction does not carry, and a
# search's returned entries (toctou's COLUMNS)
MESSAGE_COLUMNS = ("changes", "controls", "dn", "flow", "frame_last", "message_id", "new_rdn", "new_superior", "op",
                   "transport", "ts_last_ns")
# the writes (RFC 4511 §4.6-4.9) whose requests are uses of the entry they name
LDAP_WRITES = ("modifyRequest", "addRequest", "delRequest", "modDNRequest")
# ... and the rows of ldap_messages it reads: those writes' requests and searches' returned entries
# (toctou's ROWS: a shard hands over no others; on the synth LDAP server 40% of its messages)
MESSAGE_ROWS = pl.col("op").cast(pl.String).is_in([*LDAP_WRITES, "searchResEntry"])


# what ldap_events reads of ldap_transactions (client_identity's columns included)
TX_COLUMNS = ("operation", "dn", "status", "scope", "filter", "attributes", "server", "client", "client_port",
              "request_ts_ns", "response_ts_ns", "request_frame", "response_frame", "flow", "message_id",
              "transport", "entries")


def ldap_events(tx: pl.DataFrame | None, msgs: pl.DataFrame | None, params) -> pl.DataFrame:
    if tx is None or tx.height == 0:
        return pl.DataFrame(schema=EVENT_SCHEMA)
    ident, rule = client_identity(tx)
    op = pl.col("operation")
    writes = list(LDAP_WRITES)
    # of the requests, those that check or use a DN, and of them what the events are made of (a filter
    # of the frame would copy each of its ~40 columns: ~410 MB for the 10M synth capture's LDAP server at 10x)
    tx = selected_rows(tx, op.is_in(writes + ["searchRequest", "compareRequest"]) & pl.col("dn").is_not_null(),
                       *[c for c in TX_COLUMNS if c in tx.columns])
    if tx.height == 0:
        return pl.DataFrame(schema=EVENT_SCHEMA)
    extra_cols = ("changes", "new_rdn", "new_superior", "controls")
    if msgs is not None and msgs.height and all(c in msgs.columns for c in extra_cols):
        req = msgs.lazy().filter(pl.col("op").cast(pl.String).is_in(writes)).select(  # lazy: these columns only
            pl.col("transport").cast(pl.String).alias("_t"), "flow", "message_id",
            pl.col("frame_last").alias("request_frame"), *extra_cols).collect().unique(
            ["_t", "flow", "message_id", "request_frame"], keep="first")
        tx = tx.with_columns(pl.col("transport").cast(pl.String).alias("_t")).join(
            req, on=["_t", "flow", "message_id", "request_frame"], how="left")
    else:
        tx = tx.with_columns([pl.lit(None, pl.String).alias(c) for c in extra_cols])
    status = pl.col("status")
    ok_write = status == "success"
    mask = via_unique(pl.col("changes"), tx, "changes", attribute_mask(_attr_list(pl.col("changes"))))
    rmask = via_unique(pl.col("attributes"), tx, "attributes", _read_mask(pl.col("attributes")))
    rmask = pl.when(pl.col("attributes").is_null()).then(-1).otherwise(rmask)
    deleted = _attr_list(pl.col("changes"), "delete")
    added = _attr_list(pl.col("changes"), "(?:add|replace)")
    test_and_set = via_unique(pl.col("changes"), tx, "changes", (
        (deleted.list.set_intersection(added).list.len() > 0)
        | pl.col("changes").str.contains(r"increment\(")).cast(pl.Int64)) == 1
    conditional = ((op == "modifyRequest") & (
        test_and_set.fill_null(False)
        | pl.col("controls").fill_null("").str.contains("1.3.6.1.1.12", literal=True))).fill_null(False)
    is_write = op.is_in(writes)
    check = ((op == "searchRequest") & (pl.col("scope") == "baseObject") & status.is_in(["success", "noSuchObject"])) \
        | ((op == "compareRequest") & status.is_in(["compareTrue", "compareFalse"]))
    label = (pl.when(op == "modifyRequest").then(pl.format("modify {}", pl.col("changes").fill_null("?")))
             .when(op == "searchRequest").then(pl.format("search {} {}", pl.col("scope").fill_null("?"),
                                                         pl.col("filter").fill_null("")))
             .otherwise(op.str.replace("Request$", "")))
    ev = tx.with_row_index("_r").select(
        "_r", pl.lit("ldap").alias("proto"), pl.col("server").cast(pl.String),
        via_unique(pl.col("dn"), tx, "dn", dn_key(pl.col("dn")), pl.String).alias("key"),
        pl.col("dn").alias("resource"), ident.alias("cid"),
        pl.lit(rule).alias("ident_rule"), pl.col("request_ts_ns").alias("ts"),
        pl.col("response_ts_ns").alias("resp_ts"),
        pl.col("request_frame").alias("frame"), pl.col("response_frame").alias("resp_frame"),
        pl.lit(0, pl.Int64).alias("sub"), label.alias("op"), check.fill_null(False).alias("check"),
        is_write.alias("write_op"), ok_write.fill_null(False).alias("ok"), pl.lit(False).alias("open_use"),
        conditional.alias("conditional"), pl.lit(None, pl.String).alias("fid"),
        pl.lit(None, pl.Int64).alias("open_share"),
        pl.lit(-1, pl.Int64).alias("off"), pl.lit(-1, pl.Int64).alias("len"),
        pl.when((op == "modifyRequest") & pl.col("changes").is_not_null()).then(mask).otherwise(-1)
        .fill_null(-1).cast(pl.Int64).alias("mask"),
        pl.when(check).then(rmask).otherwise(-1).fill_null(-1).alias("rmask"),
        rmask.fill_null(-1).alias("_rmask"),
        pl.lit(False).alias("read_content"), status.alias("status"),
        "flow", "message_id", pl.col("transport").cast(pl.String).alias("_t"), pl.col("attributes").alias("_attrs"),
        "new_rdn", "new_superior", "dn", "entries", "operation")
    parts = [ev.filter(pl.col("check") | pl.col("write_op"))]
    # modDN also changes the new DN
    moved = ev.filter((pl.col("operation") == "modDNRequest") & pl.col("new_rdn").is_not_null())
    if moved.height:
        parent = pl.coalesce(pl.col("new_superior"), pl.col("dn").str.replace(r"^(?:[^,\\]|\\.)*,", ""))
        new_dn = pl.concat_str([pl.col("new_rdn"), pl.lit(","), parent])
        parts.append(moved.with_columns(dn_key(new_dn).alias("key"), new_dn.alias("resource"),
                                        pl.lit(SUB_MODDN_TARGET, pl.Int64).alias("sub")))
    # a search checks the entries it returned: found on the keys alone, then the searches' rows taken
    # (ev's row is its ``_r``; a search returns many entries, and the rows are wide)
    if msgs is not None and msgs.height:
        searched = (pl.col("operation") == "searchRequest") & (pl.col("status") == "success") \
            & (pl.col("entries").fill_null(0) > 0) & (pl.col("entries") <= params.max_entries_per_search)
        searches = selected_rows(ev, searched, "_r", "_t", "flow", "message_id", "ts", "resp_ts")
        if searches.height:
            ent = msgs.lazy().filter(pl.col("op").cast(pl.String) == "searchResEntry").select(
                pl.col("transport").cast(pl.String).alias("_t"), "flow", "message_id",
                pl.col("ts_last_ns").alias("_ets"), pl.col("dn").alias("_edn")).collect().drop_nulls("_edn")
            hit = entries_in_windows(searches, ent, ["_t", "flow", "message_id"])
            hit = hit.with_columns(via_unique(pl.col("_edn"), hit, "_edn", dn_key(pl.col("_edn")), pl.String)
                                   .alias("key"))
            hit = hit.join(parts[0].select("_r", "key"), on=["_r", "key"], how="anti") \
                .sort("_r", "key", "_ets", "_edn").unique(["_r", "key"], keep="first", maintain_order=True)
            entry_columns = [c for c in EVENT_SCHEMA if c not in ("key", "resource", "check", "sub", "rmask")]
            parts.append(ev.select(*entry_columns, "_rmask")[hit["_r"]].with_columns(
                hit["key"], hit["_edn"].alias("resource"), pl.lit(True).alias("check"),
                pl.lit(SUB_SEARCH_ENTRY, pl.Int64).alias("sub"), pl.col("_rmask").alias("rmask")))
    out = pl.concat([p.select(list(EVENT_SCHEMA)).cast(EVENT_SCHEMA) for p in parts])
    return out


# no end: a search whose response was not captured takes every later entry of its message id
_NO_END_NS = (1 << 63) - 1


def entries_in_windows(searches: pl.DataFrame, entries: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """(``_r``, ``_ets``, ``_edn``): each entry of ``entries`` (``on`` keys, time ``_ets``, DN ``_edn``)
    with each search of ``searches`` (``_r``, ``on`` keys, ``ts``, ``resp_ts``: null for no end) of the
    same keys whose window holds it (ts <= _ets <= resp_ts). What an inner join on the keys filtered
    by time gives, without the pairs of every search and entry of the same keys first: a client that
    reuses one message id on a long connection made n searches x (n x entries) of them. Each search's
    entries are a run of the entries sorted by keys and time, found by two as-of joins, so the rows
    are those of the answer only."""
    ent = entries.drop_nulls([*on, "_ets"]).with_columns(pl.col("_ets").cast(pl.Int64)) \
        .sort(*on, "_ets").with_row_index("_i")
    s = searches.drop_nulls([*on, "ts"]).select(
        "_r", *on, pl.col("ts").cast(pl.Int64), pl.col("resp_ts").cast(pl.Int64).fill_null(_NO_END_NS).alias("_end"))
    if ent.height == 0 or s.height == 0:
        return pl.DataFrame(schema={"_r": searches.schema["_r"], "_ets": pl.Int64, "_edn": entries.schema["_edn"]})
    runs = ent.select(*on, "_ets", "_i")
    # within each key (the as-of joins' ``by``) the entries are sorted by time: what they need
    first = s.sort("ts").join_asof(runs, left_on="ts", right_on="_ets", by=on, strategy="forward",
                                   check_sortedness=False).select("_r", pl.col("_i").alias("_lo"))
    last = s.sort("_end").join_asof(runs, left_on="_end", right_on="_ets", by=on, strategy="backward",
                                    check_sortedness=False).select("_r", pl.col("_i").alias("_hi"))
    spans = first.join(last, on="_r").filter(pl.col("_lo") <= pl.col("_hi"))
    rows = spans.select("_r", pl.int_ranges("_lo", pl.col("_hi") + 1, dtype=pl.UInt32).alias("_i")).explode("_i")
    return rows.select("_r", ent["_ets"].gather(rows["_i"]), ent["_edn"].gather(rows["_i"]))


def events(capture, params) -> pl.DataFrame:
    """The check and use events of the capture (SMB2 and LDAP), in capture order with ``seq``."""
    held = [pl.concat([smb_events(optional_frame(capture, "smb2_transactions")),
                       ldap_events(optional_frame(capture, "ldap_transactions"),
                                   optional_frame(capture, "ldap_messages"), params)])]
    # a request without client, server or time cannot be placed in anyone's window; ties (several
    # entries of one search in one frame) broken by what they are about, never by row order
    keys = ("ts", "frame", "sub", "key", "resource", "cid")
    placed = pl.col("cid").is_not_null() & pl.col("server").is_not_null() & pl.col("ts").is_not_null()
    rows = selected_rows(held[0], placed, pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), *keys) \
        .sort(keys, nulls_last=True)["_row"]  # the order of the sorted frame, from its keys alone
    return gathered(held, rows).with_row_index("seq").with_columns(pl.col("seq").cast(pl.Int64))

