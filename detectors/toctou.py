"""Check-then-use races (``toctou``): a client checks a resource, another client changes it, and the
first client then acts on what it checked.

The pathology
    A client reads the state of a file or directory entry — it opens it or queries its attributes
    (SMB2 CREATE with an open disposition, QUERY_INFO, READ), or searches / compares an LDAP entry —
    and later acts on it: writes it (SMB2 WRITE; SET_INFO rename, link, delete disposition, end of
    file; CREATE that overwrites, supersedes or creates it; LDAP modify, add, delete, modDN). If
    another client's change lands between the check and the use, the use is based on stale state:
    a lost update (the classic read-modify-write race, e.g. two LDAP clients allocating the same
    uidNumber from a counter entry, or a config file renamed over a newer version), or an action
    on something other than what was checked (time-of-check to time-of-use).

The signal (``smb2_transactions``, ``ldap_transactions`` + ``ldap_messages``)
    * Events per (server, resource, client): checks and uses, in capture order. A *window* is a use
      whose previous event by the same client on the same resource is a check (not an earlier use:
      a stream of writes after one check is one window), at most ``max_window_ns`` long (a re-open
      of the resource — a read use — at most ``stale_max_window_ns``).
    * Resources: SMB2 paths compared case-insensitively below the share name (a rename touches its
      source and its target path); LDAP DNs normalised (case, blanks around ``,`` and ``=``); an
      LDAP search checks its base (baseObject scope) and the entries it returned (at most
      ``max_entries_per_search``).
    * Clients: SMB2 requests that carry one SessionId to one server are one client, whatever
      connection they came on (SMB 3 multichannel binds several connections to one session, MS-SMB2
      3.2.4.1.7 / 3.3.5.5.2); otherwise :func:`detectors.base.client_identity`.
    * A realised race: another client's *successful* change of the same resource between the check
      and the use (capture order), not made through the handle the use goes through (a use through
      the handle the "change" itself returned knows that change), that conflicts with the use (overlapping byte ranges when both
      are WRITEs; overlapping attributes when both are LDAP modifies; always otherwise).
      ``lost_update``: the use succeeded and was unconditional. ``conflict_detected``: the use
      failed (e.g. LDAP noSuchAttribute on a delete-old/add-new modify, SMB
      STATUS_OBJECT_NAME_COLLISION): the race happened and the server caught it (informational).
      ``stale_use``: the use re-opened the resource after the change (a stale check, not a lost
      write). A conditional LDAP modify that succeeded (delete of the old value with an add of the
      new one, increment, or the assertion control RFC 4528) proves the checked value unchanged:
      no finding.
    * Windows without a realised race (write uses only): the rate of changes to the resource by
      other clients over the capture (change episodes: a client's changes less than
      ``episode_gap_ns`` apart count once) against the window length gives the race probability
      ``1 - exp(-rate x window)``; ``race_exposure`` summarises them per resource. A window whose
      check and use go through one open that denies write sharing (SMB2 ShareAccess without
      FILE_SHARE_WRITE) cannot race and is left out.

References: MS-SMB2 2.2.13 (CreateDisposition, ShareAccess), 2.2.14 (CreateAction), 2.2.37/2.2.39
(QUERY_INFO / SET_INFO), MS-FSCC 2.4.37 (FileRenameInformation), 2.4.11 (FileDispositionInformation);
RFC 4511 4.5 (search), 4.6 (modify: atomic, a failed delete of a value fails the whole
operation), 4.10 (compare); RFC 4528 (LDAP assertion control); CWE-367 (TOCTOU race condition).

Known false positives / limits
    * The order is the capture's (arrival order at the vantage point); a capture far from the server
      may order two nearly simultaneous requests differently than the server did. When a gap is not
      longer than the timestamp resolution the finding says so and is at most ``low``.
    * A client that re-reads the resource between the check and the use (outside the capture, from a
      cache, or through another protocol) is not seen: windows can look longer than they are.
    * Concurrent writes to disjoint byte ranges are not conflicts; a WRITE whose range is unknown
      conflicts with everything.
    * Several processes behind one address are one client unless their request streams overlap
      (:func:`detectors.base.client_identity`): a race between them is missed, never invented.
    * ``stale_use`` is a re-open after a check: whether the client acted on the stale check cannot
      be seen on the wire, so it is ``low`` by default (``stale_use_severity``).

Severity rule: ``lost_update`` is ``medium``; ``high`` when the same resource lost ``high_repeats``
or more updates in the capture (a systematic race), ``critical`` from ``critical_repeats``; at most
``low`` when the order is not resolvable at the capture's timestamp resolution. ``stale_use``:
``stale_use_severity``. ``conflict_detected``: ``informational``. ``race_exposure``: by the mean
race probability of the resource's windows — ``informational`` from ``min_report_probability``,
``low`` from ``low_probability``, ``medium`` from ``high_probability``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from numba import njit

from .base import SEVERITIES, SEVERITY_RANK, client_identity, empty_findings, findings, fmt_ns, resolution_ns
from .params import LOWER, UPPER, param

NAME = "toctou"
KINDS = ("lost_update", "stale_use", "outcome_unknown", "race_exposure", "vantage")
REQUIRES = ("smb2_transactions", "ldap_transactions", "ldap_messages")


@dataclass(frozen=True)
class Params:
    """Windows and thresholds of the check-then-use detector."""

    max_window_ns: int = param(10_000_000_000, "longest check -> write window considered (a later write is "
                                               "not taken as acting on that check)", unit="ns", gate=UPPER, lo=0)
    stale_max_window_ns: int = param(1_000_000_000, "longest check -> re-open window for a stale_use",
                                     unit="ns", gate=UPPER, lo=0)
    stale_use_severity: str = param("low", "severity of a stale_use (a re-open after another client's change)",
                                    choices=SEVERITIES)
    high_repeats: int = param(5, "lost updates on one resource from which each is high (a systematic race)",
                              unit="updates", gate=LOWER, lo=1)
    critical_repeats: int = param(50, "... and critical", unit="updates", gate=LOWER, lo=1)
    max_entries_per_search: int = param(10, "an LDAP search checks the entries it returned only when it "
                                            "returned at most this many", unit="entries", gate=UPPER, lo=0)
    episode_gap_ns: int = param(100_000_000, "a client's changes to one resource less than this apart are one "
                                             "change episode (rate estimate)", unit="ns", lo=0)
    min_report_probability: float = param(0.01, "race_exposure: mean race probability per window to report "
                                                "(informational)", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    low_probability: float = param(0.1, "... to call it low", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    high_probability: float = param(0.5, "... to flag it (medium)", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    min_requests_for_vantage: int = param(20, "a server with at least this many requests and no response "
                                              "captured cannot be judged", unit="requests", gate=LOWER, lo=1)
    max_scan: int = param(100_000, "changes examined per window (bounds the work on very hot resources)",
                          unit="changes", gate=UPPER, lo=1)


_EVENT_SCHEMA = {
    "proto": pl.String, "server": pl.String, "key": pl.String, "resource": pl.String, "cid": pl.String,
    "ident_rule": pl.String, "ts": pl.Int64, "resp_ts": pl.Int64, "frame": pl.UInt32, "resp_frame": pl.UInt32,
    "sub": pl.Int64, "op": pl.String, "check": pl.Boolean, "write_op": pl.Boolean, "ok": pl.Boolean,
    "open_use": pl.Boolean, "conditional": pl.Boolean, "fid": pl.String, "open_share": pl.Int64,
    "off": pl.Int64, "len": pl.Int64, "mask": pl.Int64, "rmask": pl.Int64, "read_content": pl.Boolean,
    "status": pl.String,
}


def _frame(capture, name: str) -> pl.DataFrame | None:
    try:
        return capture.frame(name)
    except KeyError:
        return None


# -- SMB2 ---------------------------------------------------------------------------------------------

def smb_key(share: pl.Expr, path: pl.Expr) -> pl.Expr:
    """Case-insensitive resource key: share name + path below the share (``\\\\srv\\Data`` + ``D\\F``
    -> ``data\\d\\f``), so clients that name the server differently still match."""
    share_name = share.str.replace(r"^.*\\", "")
    rel = pl.when(share.is_not_null() & path.str.starts_with(share)) \
        .then(path.str.slice(share.str.len_chars())).otherwise(path).str.strip_chars("\\")
    return pl.when(path.is_null()).then(None).otherwise(
        pl.concat_str([share_name.fill_null(""), pl.lit("\\"), rel.fill_null("")])).str.to_lowercase()


_SMB_CHANGE_INFO = ("FileRenameInformation", "FileRenameInformationEx", "FileLinkInformation",
                    "FileDispositionInformation", "FileDispositionInformationEx", "FileEndOfFileInformation",
                    "FileAllocationInformation", "FileValidDataLengthInformation")
_RENAMES = ("FileRenameInformation", "FileRenameInformationEx", "FileLinkInformation")


def _session_client(tx: pl.DataFrame, ident: pl.Expr) -> pl.Expr:
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


def _smb_events(tx: pl.DataFrame) -> pl.DataFrame:
    if tx is None or tx.height == 0:
        return pl.DataFrame(schema=_EVENT_SCHEMA)
    ident, rule = client_identity(tx)
    tx = tx.with_columns(_session_client(tx, ident).alias("_cid"))
    opens_of = tx.filter(pl.col("operation") == "CREATE")
    tx = tx.filter(pl.col("operation").is_in(["CREATE", "WRITE", "SET_INFO", "QUERY_INFO", "READ"])
                   & pl.col("path").is_not_null())
    if tx.height == 0:
        return pl.DataFrame(schema=_EVENT_SCHEMA)
    op = pl.col("operation")
    status = pl.col("status")
    ok = pl.col("answered").fill_null(False) & ~pl.col("is_error").fill_null(True)
    disp = pl.col("create_disposition").cast(pl.String)
    action = pl.col("create_action").cast(pl.String)
    info = pl.col("info_class_name")
    create = op == "CREATE"
    delete_on_close = (pl.col("create_options").fill_null(0) & 0x1000) != 0
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
        return pl.DataFrame(schema=_EVENT_SCHEMA)
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
            (pl.col("sub") + 1000).alias("sub"))
        ev = pl.concat([ev, ren])
    return ev.select(list(_EVENT_SCHEMA)).cast(_EVENT_SCHEMA)


# -- LDAP ---------------------------------------------------------------------------------------------

def dn_key(dn: pl.Expr) -> pl.Expr:
    """Normalised DN for matching: lower case, no blanks around ``,`` ``=`` ``+``."""
    return dn.str.strip_chars().str.replace_all(r"\s*([,=+])\s*", "$1").str.to_lowercase()


_ATTRS = r"\(([^)]*)\)"


def _attr_list(changes: pl.Expr, op: str | None = None) -> pl.Expr:
    pat = (op + r"\([^)]*\)") if op else r"\w+\([^)]*\)"
    return changes.str.extract_all(pat).list.eval(
        pl.element().str.extract(_ATTRS, 1).str.to_lowercase().str.replace(r";.*$", ""))


def _via_unique(col: pl.Expr, frame: pl.DataFrame, name: str, fn, dtype=pl.Int64) -> pl.Expr:
    """``fn`` (an expression on pl.col(name)) computed once per distinct value of ``col`` in ``frame``
    and mapped back (DNs, attribute lists and change lists repeat: few distinct strings in 100k rows)."""
    u = frame.select(col.alias(name)).unique().drop_nulls()
    if u.height == 0:
        return pl.lit(None, dtype)
    m = u.with_columns(fn.alias("_v"))
    return col.replace_strict(m[name], m["_v"], default=None, return_dtype=dtype)


def _mask_of(names: pl.Expr) -> pl.Expr:
    """A 62-bit set of attribute names (hashed; a shared bit only ever adds a conflict)."""
    bits = names.list.eval(pl.element().hash(7) % 62).list.unique()
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
        .otherwise(_mask_of(names.list.eval(pl.element().filter(pl.element() != "1.1")))).cast(pl.Int64)


def _ldap_events(tx: pl.DataFrame | None, msgs: pl.DataFrame | None, params: Params) -> pl.DataFrame:
    if tx is None or tx.height == 0:
        return pl.DataFrame(schema=_EVENT_SCHEMA)
    ident, rule = client_identity(tx)
    op = pl.col("operation")
    writes = ["modifyRequest", "addRequest", "delRequest", "modDNRequest"]
    tx = tx.filter(op.is_in(writes + ["searchRequest", "compareRequest"]) & pl.col("dn").is_not_null())
    if tx.height == 0:
        return pl.DataFrame(schema=_EVENT_SCHEMA)
    extra_cols = ("changes", "new_rdn", "new_superior", "controls")
    if msgs is not None and msgs.height and all(c in msgs.columns for c in extra_cols):
        req = msgs.filter(pl.col("op").cast(pl.String).is_in(writes)).select(
            pl.col("transport").cast(pl.String).alias("_t"), "flow", "message_id",
            pl.col("frame_last").alias("request_frame"), *extra_cols).unique(
            ["_t", "flow", "message_id", "request_frame"], keep="first")
        tx = tx.with_columns(pl.col("transport").cast(pl.String).alias("_t")).join(
            req, on=["_t", "flow", "message_id", "request_frame"], how="left")
    else:
        tx = tx.with_columns([pl.lit(None, pl.String).alias(c) for c in extra_cols])
    status = pl.col("status")
    ok_write = status == "success"
    mask = _via_unique(pl.col("changes"), tx, "changes", _mask_of(_attr_list(pl.col("changes"))))
    rmask = _via_unique(pl.col("attributes"), tx, "attributes", _read_mask(pl.col("attributes")))
    rmask = pl.when(pl.col("attributes").is_null()).then(-1).otherwise(rmask)
    deleted = _attr_list(pl.col("changes"), "delete")
    added = _attr_list(pl.col("changes"), "(?:add|replace)")
    test_and_set = _via_unique(pl.col("changes"), tx, "changes", (
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
        _via_unique(pl.col("dn"), tx, "dn", dn_key(pl.col("dn")), pl.String).alias("key"),
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
                                        pl.lit(1, pl.Int64).alias("sub")))
    # a search checks the entries it returned
    if msgs is not None and msgs.height:
        searches = ev.filter((pl.col("operation") == "searchRequest") & (pl.col("status") == "success")
                             & (pl.col("entries").fill_null(0) > 0)
                             & (pl.col("entries") <= params.max_entries_per_search))
        if searches.height:
            ent = msgs.filter(pl.col("op").cast(pl.String) == "searchResEntry").select(
                pl.col("transport").cast(pl.String).alias("_t"), "flow", "message_id",
                pl.col("ts_last_ns").alias("_ets"), pl.col("dn").alias("_edn")).drop_nulls("_edn")
            hit = searches.join(ent, on=["_t", "flow", "message_id"], how="inner").filter(
                (pl.col("_ets") >= pl.col("ts")) & (pl.col("_ets") <= pl.col("resp_ts").fill_null(pl.col("_ets"))))
            hit = hit.with_columns(_via_unique(pl.col("_edn"), hit, "_edn", dn_key(pl.col("_edn")), pl.String)
                                   .alias("key"), pl.col("_edn").alias("resource"),
                                   pl.lit(True).alias("check"), pl.lit(2, pl.Int64).alias("sub"),
                                   pl.col("_rmask").alias("rmask"))
            hit = hit.join(parts[0].select("_r", "key"), on=["_r", "key"], how="anti") \
                .sort("_r", "key", "_ets", "_edn").unique(["_r", "key"], keep="first", maintain_order=True)
            parts.append(hit.drop("_ets", "_edn"))
    out = pl.concat([p.select(list(_EVENT_SCHEMA)).cast(_EVENT_SCHEMA) for p in parts])
    return out


# -- windows and the interleaving scan -------------------------------------------------------------------

@njit(cache=True)
def _scan(w_g, w_s0, w_s1, w_cid, w_fid, w_mask, w_off, w_len, w_write, g_lo, g_hi, c_seq, c_cid, c_fid, c_mask,
          c_off, c_len, max_scan):
    """For each window: the other clients' conflicting changes of its resource strictly between the
    check (seq s0) and the use (seq s1). A change made through the very handle the use goes through
    (``fid`` codes equal, -1 = none: e.g. the CREATE that returned the handle) is never one the use
    missed. Returns (first change index or -1, count, distinct clients)."""
    n = w_g.shape[0]
    first = np.full(n, -1, np.int64)
    count = np.zeros(n, np.int64)
    distinct = np.zeros(n, np.int64)
    seen = np.empty(16, np.int64)
    for i in range(n):
        g = w_g[i]
        lo, hi = g_lo[g], g_hi[g]
        if lo >= hi:
            continue
        x = lo + np.searchsorted(c_seq[lo:hi], w_s0[i], side="right")
        ns = 0
        scanned = 0
        while x < hi and c_seq[x] < w_s1[i] and scanned < max_scan:
            scanned += 1
            if c_cid[x] != w_cid[i] and (w_fid[i] < 0 or c_fid[x] != w_fid[i]):
                conflict = True
                if w_write[i]:
                    if w_mask[i] != -1 and c_mask[x] != -1 and (w_mask[i] & c_mask[x]) == 0:
                        conflict = False
                    if w_len[i] >= 0 and c_len[x] >= 0 and w_off[i] >= 0 and c_off[x] >= 0:
                        if not (w_off[i] < c_off[x] + c_len[x] and c_off[x] < w_off[i] + w_len[i]):
                            conflict = False
                if conflict:
                    if first[i] < 0:
                        first[i] = x
                    count[i] += 1
                    new = True
                    for k in range(ns):
                        if seen[k] == c_cid[x]:
                            new = False
                            break
                    if new and ns < 16:
                        seen[ns] = c_cid[x]
                        ns += 1
            x += 1
        distinct[i] = ns
    return first, count, distinct


def _windows(ev: pl.DataFrame, params: Params) -> pl.DataFrame:
    rel = ev.filter(pl.col("key").is_not_null() & (pl.col("check") | pl.col("write_op")))
    # one integer per (protocol, server, resource, client): sorting and comparing it is much faster
    # than four string columns (a hash collision would only merge two clients' event streams)
    rel = rel.with_columns(pl.concat_str(["proto", "server", "key", "cid"], separator="\x1f").hash().alias("_gk")) \
        .sort("_gk", "seq")
    prev = ["check", "write_op", "ts", "resp_ts", "frame", "resp_frame", "op", "seq", "fid", "open_share", "resource",
            "rmask", "read_content"]
    same = pl.col("_gk") == pl.col("_gk").shift(1)
    rel = rel.with_columns([pl.when(same).then(pl.col(c).shift(1)).alias(f"p_{c}") for c in prev])
    is_use = pl.col("write_op") | pl.col("open_use")
    maxw = pl.when(pl.col("write_op")).then(params.max_window_ns).otherwise(params.stale_max_window_ns)
    # a write acts on the check only if it writes what the check read (LDAP: the attributes the search
    # returned or the compare tested; a whole-entry write always); a re-open acts on a check that only
    # looked (open, attributes), not on one that read the content (it reads it afresh)
    depends = pl.when(pl.col("write_op")).then(
        (pl.col("mask") == -1) | (pl.col("p_rmask") == -1) | ((pl.col("mask") & pl.col("p_rmask")) != 0)
    ).otherwise(~pl.col("p_read_content").fill_null(False))
    return rel.filter(is_use & pl.col("p_check").fill_null(False) & ~pl.col("p_write_op").fill_null(True)
                      & ((pl.col("ts") - pl.col("p_ts")) <= maxw) & (pl.col("seq") > pl.col("p_seq")) & depends)


def _interleavings(ev: pl.DataFrame, win: pl.DataFrame, params: Params) -> pl.DataFrame:
    """Per window: the first conflicting change by another client inside it (x_* columns), how many,
    from how many clients."""
    ch = ev.filter(pl.col("write_op") & pl.col("ok") & pl.col("key").is_not_null())
    groups = pl.concat([ch.select("proto", "server", "key"), win.select("proto", "server", "key")]).unique() \
        .sort("proto", "server", "key").with_row_index("g")
    cids = pl.concat([ch["cid"], win["cid"]]).unique().sort()
    code = {"old": cids, "new": pl.arange(0, cids.len(), eager=True)}
    fids = pl.concat([ch["fid"], win["fid"]]).drop_nulls().unique().sort()
    fcode = {"old": fids, "new": pl.arange(0, fids.len(), eager=True)}

    def cid_code(col):
        return pl.col(col).replace_strict(code["old"], code["new"], return_dtype=pl.Int64)

    def fid_code(col):  # -1: no handle (LDAP, or not captured)
        return pl.col(col).replace_strict(fcode["old"], fcode["new"], default=-1, return_dtype=pl.Int64)

    ch = ch.join(groups, on=["proto", "server", "key"]).sort("g", "seq").with_row_index("ci")
    win = win.join(groups, on=["proto", "server", "key"])
    ng = groups.height
    gc = ch["g"].to_numpy().astype(np.int64)
    g_lo = np.searchsorted(gc, np.arange(ng), side="left")
    g_hi = np.searchsorted(gc, np.arange(ng), side="right")

    def arr(frame, expr):
        return frame.select(expr.cast(pl.Int64).fill_null(-1)).to_series().to_numpy().astype(np.int64)

    first, count, distinct = _scan(
        arr(win, pl.col("g")), arr(win, pl.col("p_seq")), arr(win, pl.col("seq")), arr(win, cid_code("cid")),
        arr(win, fid_code("fid")), arr(win, pl.col("mask")), arr(win, pl.col("off")), arr(win, pl.col("len")),
        win["write_op"].to_numpy().astype(np.bool_), g_lo.astype(np.int64), g_hi.astype(np.int64),
        arr(ch, pl.col("seq")), arr(ch, cid_code("cid")), arr(ch, fid_code("fid")), arr(ch, pl.col("mask")), arr(ch, pl.col("off")),
        arr(ch, pl.col("len")), params.max_scan)
    win = win.with_columns(pl.Series("x_ci", first).cast(pl.Int64), pl.Series("x_count", count),
                           pl.Series("x_clients", distinct))
    x = ch.select(pl.col("ci").cast(pl.Int64).alias("x_ci"), pl.col("cid").alias("x_cid"), pl.col("ts").alias("x_ts"),
                  pl.col("frame").alias("x_frame"), pl.col("resp_frame").alias("x_resp_frame"),
                  pl.col("op").alias("x_op"))
    return win.join(x, on="x_ci", how="left")


# -- findings ---------------------------------------------------------------------------------------------

def _cap(sev: str, limit: str) -> str:
    return sev if SEVERITY_RANK[sev] <= SEVERITY_RANK[limit] else limit


def _realised_rows(real: pl.DataFrame, params: Params, res_ns: float) -> list[dict]:
    rows = []
    lost_per_res = {}
    for r in real.filter(pl.col("_kind") == "lost_update").group_by("proto", "server", "key").len().iter_rows():
        lost_per_res[r[:3]] = r[3]
    stale_sev = params.stale_use_severity
    for r in real.iter_rows(named=True):
        kind = r["_kind"]
        window = r["ts"] - r["p_ts"]
        gap = min(r["x_ts"] - r["p_ts"], r["ts"] - r["x_ts"])
        limited = gap <= res_ns
        n_lost = lost_per_res.get((r["proto"], r["server"], r["key"]), 0)
        if kind == "lost_update":
            sev = "critical" if n_lost >= params.critical_repeats else "high" if n_lost >= params.high_repeats \
                else "medium"
        elif kind == "stale_use":
            sev = stale_sev
        else:
            sev = "informational"
        if limited:
            sev = _cap(sev, "low")
        who, other = r["cid"], r["x_cid"]
        more = r["x_count"] - 1
        inter = (f"{other}'s {r['x_op']} (frame {r['x_frame']}) changed it {fmt_ns(r['x_ts'] - r['p_ts'])} after the "
                 f"check" + (f" (and {more} more change{'s' if more > 1 else ''} by {r['x_clients']} client(s))"
                             if more > 0 else ""))
        check = f"client {who} checked {r['resource']} ({r['p_op']}, frame {r['p_frame']})"
        if kind == "lost_update":
            tail = (f"; then {who}'s {r['op']} (frame {r['frame']}, {fmt_ns(window)} after its check) overwrote "
                    f"it on the stale check: a lost update"
                    + (f" ({n_lost} on this resource in the capture)" if n_lost > 1 else ""))
        elif kind == "stale_use":
            tail = (f"; then {who} opened it again for use (frame {r['frame']}, {fmt_ns(window)} after its check): "
                    f"what it checked is not what it uses")
        elif kind == "outcome_unknown":
            tail = (f"; then {who}'s {r['op']} (frame {r['frame']}, {fmt_ns(window)} after its check) acted on the "
                    f"stale check, but its response is not in the capture: a lost update if it succeeded")
        else:
            tail = (f"; {who}'s {r['op']} (frame {r['frame']}, {fmt_ns(window)} after its check) was refused "
                    f"({r['status']}): the race happened and the server caught it")
        note = (f" (the order rests on a gap of {fmt_ns(gap)}, no longer than the capture's "
                f"{fmt_ns(res_ns)} timestamp resolution)" if limited else "")
        frames = [r["p_frame"], r["p_resp_frame"], r["x_frame"], r["x_resp_frame"], r["frame"], r["resp_frame"]]
        rows.append({
            "kind": kind, "severity": sev, "start_ns": r["p_ts"], "end_ns": r["resp_ts"] or r["ts"],
            "client": who, "server": r["server"], "resource": r["p_resource"] or r["resource"],
            "clients": 1 + r["x_clients"], "client_identity": r["ident_rule"],
            "metric": "race_window_ms", "value": max(window, res_ns) / 1e6, "threshold": res_ns / 1e6, "unit": "ms",
            "evidence_frames": [int(f) for f in frames if f is not None],
            "explanation": check + ", " + inter + tail + note,
        })
    return rows


def _exposure(ev: pl.DataFrame, win: pl.DataFrame, real_keys: pl.DataFrame, duration_ns: int,
              params: Params, res_ns: float = 1.0) -> list[dict]:
    """Per resource, the windows that did not race: their race probability from the rate of other
    clients' changes (windows no shorter than the timestamp resolution)."""
    w = win.filter(pl.col("write_op") & (pl.col("x_count") == 0))
    protected = (pl.col("fid").is_not_null() & (pl.col("fid") == pl.col("p_fid"))
                 & ((pl.col("p_open_share").fill_null(7) & 2) == 0))
    w = w.filter(~protected)
    if w.height == 0 or duration_ns <= 0:
        return []
    ch = ev.filter(pl.col("write_op") & pl.col("ok") & pl.col("key").is_not_null()) \
        .sort("proto", "server", "key", "seq")
    g = ["proto", "server", "key"]
    ch = ch.with_columns(((pl.col("cid") != pl.col("cid").shift(1).over(g))
                          | ((pl.col("ts") - pl.col("ts").shift(1).over(g)) > params.episode_gap_ns))
                         .fill_null(True).alias("_new")).filter(pl.col("_new"))
    tot = ch.group_by(g).len("n_key")
    own = ch.group_by(*g, "cid").len("n_own")
    w = w.join(tot, on=g, how="left").join(own, on=[*g, "cid"], how="left").with_columns(
        ((pl.col("n_key").fill_null(0) - pl.col("n_own").fill_null(0)) / (duration_ns / 1e9)).alias("rate"),
        pl.max_horizontal(pl.col("ts") - pl.col("p_ts"), pl.lit(int(res_ns), pl.Int64)).alias("window_ns"))
    w = w.with_columns((1.0 - (-pl.col("rate") * pl.col("window_ns") / 1e9).exp()).alias("p"))
    agg = w.sort(*g, "seq").group_by(g).agg(  # sorted: first() and head() the same in every run
        pl.len().alias("windows"), pl.col("p").mean().alias("p_mean"), pl.col("p").max().alias("p_max"),
        pl.col("p").sum().alias("p_sum"), pl.col("window_ns").median().alias("window_med"),
        pl.col("rate").mean().alias("rate"), pl.col("cid").n_unique().alias("checkers"),
        pl.col("cid").unique().sort().head(3).alias("checker_ids"),
        pl.col("p_ts").min().alias("start_ns"), pl.col("ts").max().alias("end_ns"),
        pl.col("p_resource").first().alias("resource"), pl.col("ident_rule").first(),
        pl.concat_list("p_frame", "frame").explode().head(50).alias("frames"),
    ).filter(pl.col("p_mean") >= params.min_report_probability)
    if agg.height == 0:
        return []
    agg = agg.join(real_keys, on=g, how="left").with_columns(pl.col("realised").fill_null(0))
    rows = []
    for r in agg.iter_rows(named=True):
        p = r["p_mean"]
        sev = "medium" if p >= params.high_probability else "low" if p >= params.low_probability else "informational"
        who = ", ".join(r["checker_ids"]) + (f" and {r['checkers'] - 3} more" if r["checkers"] > 3 else "")
        rows.append({
            "kind": "race_exposure", "severity": sev, "start_ns": r["start_ns"], "end_ns": r["end_ns"],
            "client": r["checker_ids"][0] if r["checkers"] == 1 else None, "server": r["server"],
            "resource": r["resource"], "clients": r["checkers"], "client_identity": r["ident_rule"],
            "metric": "race_probability", "value": float(p), "threshold": params.high_probability,
            "unit": "probability", "evidence_frames": [int(f) for f in r["frames"] if f is not None],
            "explanation": (
                f"{who} checked then wrote {r['resource']} {r['windows']} time(s) with a median check-to-use window "
                f"of {fmt_ns(r['window_med'])} while other clients changed it {r['rate']:.3g} times a second: each "
                f"window has a {100 * p:.2g}% chance (at most {100 * r['p_max']:.2g}%) that another change lands "
                f"inside it (1 - exp(-rate x window)), {r['p_sum']:.2g} expected races in the capture"
                + (f"; {r['realised']} realised race(s) reported separately" if r["realised"] else "; none seen")),
        })
    return rows


def _vantage_rows(tx_frames: dict[str, pl.DataFrame | None], params: Params) -> list[dict]:
    rows = []
    for proto, tx in tx_frames.items():
        if tx is None or tx.height == 0 or "answered" not in tx.columns:
            continue
        by = tx.group_by(pl.col("server").cast(pl.String)).agg(
            pl.len().alias("n"), pl.col("answered").fill_null(False).sum().alias("answered"),
            pl.col("request_ts_ns").min().alias("start_ns"), pl.col("request_ts_ns").max().alias("end_ns"),
            pl.col("request_frame").head(10).alias("frames"))
        blind = by.filter((pl.col("n") >= params.min_requests_for_vantage) & (pl.col("answered") == 0))
        for r in blind.iter_rows(named=True):
            rows.append({
                "kind": "vantage", "severity": "informational", "start_ns": r["start_ns"], "end_ns": r["end_ns"],
                "client": None, "server": r["server"], "resource": None, "clients": None, "client_identity": None,
                "metric": "answered_requests", "value": 0.0, "threshold": 1.0, "unit": "requests",
                "evidence_frames": [int(f) for f in r["frames"]],
                "explanation": (f"{r['n']} {proto} requests to {r['server']} and not one response in this capture "
                                f"(one direction missing?): check-then-use races on it cannot be judged"),
            })
    return rows


def events(capture, params: Params = Params()) -> pl.DataFrame:
    """The check and use events of the capture (SMB2 and LDAP), in capture order with ``seq``."""
    smb = _smb_events(_frame(capture, "smb2_transactions"))
    ldap = _ldap_events(_frame(capture, "ldap_transactions"), _frame(capture, "ldap_messages"), params)
    # a request without client, server or time cannot be placed in anyone's window
    ev = pl.concat([smb, ldap]).filter(pl.col("cid").is_not_null() & pl.col("server").is_not_null()
                                       & pl.col("ts").is_not_null())
    # ties (several entries of one search in one frame) broken by what they are about, never by row order
    return ev.sort("ts", "frame", "sub", "key", "resource", "cid", nulls_last=True).with_row_index("seq") \
        .with_columns(pl.col("seq").cast(pl.Int64))


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    """Findings: realised check-then-use races (lost updates, stale uses, conflicts the server caught)
    and, per resource, the race probability of the windows that did not race (see the module doc)."""
    ev = events(capture, params)
    rows: list[dict] = _vantage_rows({"SMB2": _frame(capture, "smb2_transactions"),
                                      "LDAP": _frame(capture, "ldap_transactions")}, params)
    if ev.height:
        win = _windows(ev, params)
        if win.height:
            win = _interleavings(ev, win, params)
            real = win.filter(pl.col("x_count") > 0).with_columns(
                pl.when(pl.col("open_use")).then(pl.lit("stale_use"))
                .when(pl.col("resp_ts").is_null()).then(pl.lit("outcome_unknown"))
                .when(~pl.col("ok")).then(pl.lit("conflict_detected"))
                .when(pl.col("conditional")).then(pl.lit("verified"))
                .otherwise(pl.lit("lost_update")).alias("_kind")).filter(pl.col("_kind") != "verified")
            res = resolution_ns(capture)
            rows += _realised_rows(real, params, res)
            real_keys = real.group_by("proto", "server", "key").agg(pl.len().alias("realised"))
            p = capture.packets
            if p.height and "ts_ns" in p.columns:
                duration = int(p["ts_ns"].max() - p["ts_ns"].min())
            else:
                duration = int(ev["ts"].max() - ev["ts"].min())
            rows += _exposure(ev, win, real_keys, duration, params, res)
    if not rows:
        return empty_findings()
    return findings(pl.DataFrame(rows, infer_schema_length=None), detector=NAME, params=params)
