"""The lock_polling detector's working tables (see detectors/lock_polling.py), from ``nfs_transactions``
(vectorised Polars):

* :func:`lock_events`: one row per lock attempt (NFSv4 LOCK, NLM LOCK / LOCK_MSG), grant callback
  (NLM GRANTED / GRANTED_MSG: the server calls the client, Open Group XNFS ch. 10) and release (NFSv4
  LOCKU and CLOSE, NLM UNLOCK / UNLOCK_MSG), with its outcome (``denied``, ``granted``, ``blocked``,
  ``released``, ``closed``), the waiter it belongs to and its lock resource ``gkey`` (server + file +
  a group of overlapping byte ranges: RFC 7530 §16.10 / RFC 8881 §18.10 conflicts are between
  overlapping ranges);
* :func:`lock_waits`: one row per wait (a waiter's denied or blocked attempts up to its grant, or to
  its last attempt), merged into contended episodes (``episode``: waits that overlap in time);
* :func:`lock_holds`: one row per grant with the release that ended it (LOCKU / UNLOCK, else the
  holder's CLOSE of the file), and :func:`free_gaps`: the time the lock sat free between a release
  inside an episode and the next grant.
"""
from __future__ import annotations

import polars as pl

from analyzer.decoders import nfs_layout as L
from analyzer.decoders.nfs import PROTOCOL as NFS
from .base import client_identity_by

U64_MAX = 2**64 - 1
_V4 = pl.col("program") == L.PROG_NFS
_NLM = pl.col("program") == L.PROG_NLM
V4_LOCK_OPS = ("LOCK",)
NLM_LOCK_OPS = ("LOCK", "LOCK_MSG")
# "held by another owner: ask again" answers, as the NFS declaration lists them for retry_storm (which
# leaves them to this detector): (operation, status) joined by a unit separator
POLL_ANSWERS = [f"{op}\x1f{st}" for op, st in NFS.poll_answers]
NLM_GRANT_OPS = ("GRANTED", "GRANTED_MSG")  # the server's callback: a blocked lock is now held
NLM_UNLOCK_OPS = ("UNLOCK", "UNLOCK_MSG")
EVENT_SCHEMA = {"gkey": pl.String, "kind": pl.String, "server": pl.String, "resource": pl.String,
                "range_lo": pl.UInt64, "range_hi": pl.UInt64, "waiter": pl.String, "client": pl.String,
                "outcome": pl.String, "ts_ns": pl.Int64, "frame": pl.UInt32, "latency_ns": pl.Int64,
                "owner": pl.String, "denied_owner": pl.String, "denied_clientid": pl.UInt64,
                "minorversion": pl.UInt32, "lock_type": pl.String, "client_identity": pl.String}


def _col(tx: pl.DataFrame, name: str, dtype) -> pl.Expr:
    return pl.col(name).cast(dtype) if name in tx.columns else pl.lit(None, dtype)


def lock_events(tx: pl.DataFrame | None) -> pl.DataFrame:
    """Lock attempts, grant callbacks and releases of the capture (see the module doc); empty (with
    :data:`EVENT_SCHEMA`) without NFS locking."""
    empty = pl.DataFrame(schema=EVENT_SCHEMA)
    need = ("program", "operation", "client", "server", "request_ts_ns")
    if tx is None or tx.height == 0 or any(c not in tx.columns for c in need):
        return empty
    # NLM procedures are named with their program ("NLM LOCK"): the NFSv4 operation names stay as they are
    op = pl.when(_NLM).then(pl.col("operation").str.replace(r"^NLM ", "")).otherwise(pl.col("operation"))
    status = _col(tx, "status", pl.String)
    callback = _col(tx, "is_callback", pl.Boolean).fill_null(False)
    v4 = _V4 & ~callback
    named = pl.when(_NLM).then(pl.concat_str([pl.lit("NLM "), op])).otherwise(op)  # the decoder's naming
    polled = pl.concat_str([named, status], separator="\x1f").is_in(POLL_ANSWERS)
    outcome = (
        pl.when(v4 & op.is_in(V4_LOCK_OPS) & (status == "NFS4_OK")).then(pl.lit("granted"))
        .when(v4 & op.is_in(V4_LOCK_OPS) & polled).then(pl.lit("denied"))
        .when(v4 & (op == "LOCKU") & (status == "NFS4_OK")).then(pl.lit("released"))
        .when(v4 & (op == "CLOSE") & (status == "NFS4_OK")).then(pl.lit("closed"))
        .when(_NLM & op.is_in(NLM_LOCK_OPS) & (status == "NLM4_GRANTED")).then(pl.lit("granted"))
        .when(_NLM & op.is_in(NLM_LOCK_OPS) & polled).then(pl.lit("denied"))
        .when(_NLM & op.is_in(NLM_LOCK_OPS) & (status == "NLM4_BLOCKED")).then(pl.lit("blocked"))
        .when(_NLM & op.is_in(NLM_GRANT_OPS)).then(pl.lit("granted"))
        .when(_NLM & op.is_in(NLM_UNLOCK_OPS) & (status.is_null() | (status == "NLM4_GRANTED")))
        .then(pl.lit("released")))
    # an NLM GRANTED callback is a call from the lock server to the client: swap the ends back
    grant_cb = _NLM & op.is_in(NLM_GRANT_OPS)
    ev = tx.with_columns(outcome.alias("outcome")).filter(pl.col("outcome").is_not_null())
    if ev.height == 0:
        return empty
    lat = _col(ev, "latency_ns", pl.Int64)
    resp = _col(ev, "response_ts_ns", pl.Int64)
    ev = ev.select(
        pl.when(_V4).then(pl.lit("nfs4")).otherwise(pl.lit("nlm")).alias("kind"),
        pl.when(grant_cb).then(pl.col("server")).otherwise(pl.col("client")).cast(pl.String).alias("client"),
        pl.when(grant_cb).then(pl.col("client")).otherwise(pl.col("server")).cast(pl.String).alias("server"),
        pl.when(grant_cb).then(pl.lit(None, pl.Int64)).otherwise(_col(ev, "client_port", pl.Int64)).alias("port"),
        pl.coalesce(_col(ev, "path", pl.String), _col(ev, "resource", pl.String),
                    pl.format("fh:{}", _col(ev, "fh_hash", pl.String)), pl.lit("(file not known)")).alias("resource"),
        "outcome",
        # a release counts from its reply (the server had unlocked by then); an attempt from its call
        pl.when(pl.col("outcome").is_in(["released", "closed"])).then(pl.coalesce(resp, pl.col("request_ts_ns")))
        .otherwise(pl.col("request_ts_ns")).cast(pl.Int64).alias("ts_ns"),
        pl.col("request_ts_ns").cast(pl.Int64).alias("request_ts_ns"),
        pl.coalesce(resp, pl.col("request_ts_ns")).cast(pl.Int64).alias("response_ts_ns"),
        _col(ev, "request_frame", pl.UInt32).alias("frame"),
        lat.alias("latency_ns"),
        _col(ev, "owner", pl.String).alias("owner"),
        _col(ev, "denied_owner", pl.String).alias("denied_owner"),
        _col(ev, "denied_clientid", pl.UInt64).alias("denied_clientid"),
        _col(ev, "minorversion", pl.UInt32).alias("minorversion"),
        _col(ev, "lock_type", pl.String).alias("lock_type"),
        _col(ev, "offset", pl.UInt64).alias("offset"),
        _col(ev, "length", pl.UInt64).alias("length"),
    ).drop_nulls("ts_ns")
    if ev.height == 0:
        return empty
    # the byte range [lo, hi); length all ones (v4) or 0 (NLM: to the end) is to the end of the file
    off = pl.col("offset").fill_null(0)
    ln = pl.col("length")
    to_eof = ln.is_null() | (ln == 0) | (ln >= pl.lit(U64_MAX, pl.UInt64) - off)
    ev = ev.with_columns(off.alias("range_lo"),
                         pl.when(to_eof).then(pl.lit(U64_MAX, pl.UInt64)).otherwise(off + ln).alias("range_hi"))
    ev = _range_groups(ev)
    ident = client_identity_by(
        ev.with_columns(pl.col("port").fill_null(0)), ["server"], port="port", start="request_ts_ns",
        end="response_ts_ns", name="client_id")
    # one address with several lock owners on one file runs several contenders (processes): tell them apart
    owners = pl.col("owner").drop_nulls().n_unique().over("gkey", "client_id")
    ev = ident.with_columns(
        pl.when((owners > 1) & pl.col("owner").is_not_null())
        .then(pl.format("{} ({})", pl.col("client_id"), _owner_names(ev["owner"])))
        .otherwise(pl.col("client_id")).alias("waiter"),
        pl.col("client_id").alias("client"))
    return ev.select(list(EVENT_SCHEMA)).sort("gkey", "ts_ns", "frame")


def _range_groups(ev: pl.DataFrame) -> pl.DataFrame:
    """``gkey``: kind + server + file + a group of overlapping byte ranges (interval union over the
    file's lock and unlock ranges); a CLOSE (no range) belongs to every group of its file
    (:func:`lock_holds` matches it by file)."""
    fkey = pl.concat_str([pl.col("kind"), pl.col("server"), pl.col("resource")], separator="|")
    ev = ev.with_columns(fkey.alias("fkey"))
    ranged = ev.filter(pl.col("outcome") != "closed").select("fkey", "range_lo", "range_hi").unique() \
        .sort("fkey", "range_lo", "range_hi")
    ranged = ranged.with_columns(
        (pl.col("range_lo") >= pl.col("range_hi").cum_max().shift(1).over("fkey")).fill_null(True)
        .cast(pl.UInt32).cum_sum().over("fkey").alias("rg"))
    bounds = ranged.group_by("fkey", "rg").agg(pl.col("range_lo").min().alias("g_lo"),
                                              pl.col("range_hi").max().alias("g_hi"))
    ranged = ranged.join(bounds, on=["fkey", "rg"])
    ev = ev.join(ranged, on=["fkey", "range_lo", "range_hi"], how="left")
    return ev.with_columns(
        pl.format("{}|{}", pl.col("fkey"), pl.col("rg").fill_null(0)).alias("gkey"),
        pl.coalesce("g_lo", "range_lo").alias("range_lo"), pl.coalesce("g_hi", "range_hi").alias("range_hi"))


def owner_text(owner_hex: str | None) -> str | None:
    """A lock owner (hex, as the decoder keeps it) as text where it is printable ASCII
    (``lock-worker0``), else its hex."""
    if owner_hex is None:
        return None
    try:
        raw = bytes.fromhex(owner_hex)
    except ValueError:
        return owner_hex
    if raw and all(32 <= b < 127 for b in raw):
        return raw.decode("ascii")
    return owner_hex


def _owner_names(owners: pl.Series) -> pl.Expr:
    """An expression naming ``owner`` by :func:`owner_text` (a mapping over the few distinct owners)."""
    distinct = [o for o in owners.drop_nulls().unique().to_list()]
    return pl.col("owner").replace_strict(distinct, [owner_text(o) for o in distinct], default=None,
                                          return_dtype=pl.String)


def lock_holds(ev: pl.DataFrame) -> pl.DataFrame:
    """One row per grant (gkey, waiter, client, ts_ns, frame) with ``release_ns`` / ``release_frame``
    / ``released_by`` (``LOCKU`` or ``CLOSE``; null: not released while the capture lasts)."""
    grants = ev.filter(pl.col("outcome") == "granted").select("gkey", "waiter", "client", "ts_ns", "frame") \
        .with_columns(pl.col("gkey").str.replace(r"\|[^|]*$", "").alias("fkey")).sort("ts_ns")
    unl = ev.filter(pl.col("outcome") == "released").select(
        "gkey", "client", pl.col("ts_ns").alias("u_ns"), pl.col("frame").alias("u_frame")).sort("u_ns")
    cls = ev.filter(pl.col("outcome") == "closed").select(
        pl.col("gkey").str.replace(r"\|[^|]*$", "").alias("fkey"), "client",
        pl.col("ts_ns").alias("c_ns"), pl.col("frame").alias("c_frame")).sort("c_ns")
    h = grants.join_asof(unl, left_on="ts_ns", right_on="u_ns", by=["gkey", "client"], strategy="forward",
                         check_sortedness=False)
    h = h.join_asof(cls, left_on="ts_ns", right_on="c_ns", by=["fkey", "client"], strategy="forward",
                    check_sortedness=False)
    # the next grant of the same client ends this hold's claim on a later release (a re-lock)
    h = h.sort("gkey", "client", "ts_ns").with_columns(pl.col("ts_ns").shift(-1).over("gkey", "client").alias("nxt"))
    by_u = pl.col("u_ns").is_not_null() & (pl.col("c_ns").is_null() | (pl.col("u_ns") <= pl.col("c_ns")))
    h = h.with_columns(
        pl.when(by_u).then(pl.col("u_ns")).otherwise(pl.col("c_ns")).alias("release_ns"),
        pl.when(by_u).then(pl.col("u_frame")).otherwise(pl.col("c_frame")).alias("release_frame"),
        pl.when(by_u).then(pl.lit("LOCKU")).when(pl.col("c_ns").is_not_null()).then(pl.lit("CLOSE"))
        .alias("released_by"))
    late = pl.col("nxt").is_not_null() & (pl.col("release_ns") > pl.col("nxt"))
    h = h.with_columns([pl.when(late).then(None).otherwise(pl.col(c)).alias(c)
                        for c in ("release_ns", "release_frame", "released_by")])
    return h.select("gkey", "waiter", "client", "ts_ns", "frame", "release_ns", "release_frame",
                    "released_by").sort("gkey", "ts_ns")


def lock_waits(ev: pl.DataFrame, max_poll_gap_ns: int) -> pl.DataFrame:
    """One row per wait: a waiter's run of denied / blocked attempts on one gkey up to (and with) its
    grant; a new wait starts after a grant or after ``max_poll_gap_ns`` of silence. Columns: gkey,
    kind, waiter, client, start_ns, end_ns (grant, else last attempt), grant_ns, grant_frame, polls
    (denied attempts), blocked (an NLM4_BLOCKED answer: the server queued it), tries (attempt times,
    grant included), frames (denied attempts), denied_owner / denied_clientid (the first named),
    episode (waits of one gkey that overlap)."""
    a = ev.filter(pl.col("outcome").is_in(["denied", "granted", "blocked"])).sort("gkey", "waiter", "ts_ns", "frame")
    if a.height == 0:
        return pl.DataFrame()
    prev_granted = (pl.col("outcome").shift(1) == "granted").over("gkey", "waiter")
    gap = (pl.col("ts_ns") - pl.col("ts_ns").shift(1)).over("gkey", "waiter")
    new = (prev_granted | (gap > max_poll_gap_ns)).fill_null(True)
    a = a.with_columns(new.cast(pl.UInt32).cum_sum().over("gkey", "waiter").alias("wait_no"))
    w = a.group_by("gkey", "waiter", "wait_no").agg(
        pl.col("kind").first(), pl.col("client").first(), pl.col("client_identity").first(),
        pl.col("server").first(), pl.col("resource").first(),
        pl.col("range_lo").first(), pl.col("range_hi").first(),
        (pl.col("outcome") == "denied").sum().cast(pl.UInt32).alias("polls"),
        (pl.col("outcome") == "blocked").any().alias("blocked"),
        pl.col("ts_ns").filter(pl.col("outcome") != "granted").min().alias("start_ns"),
        pl.col("ts_ns").filter(pl.col("outcome") == "granted").first().alias("grant_ns"),
        pl.col("frame").filter(pl.col("outcome") == "granted").first().alias("grant_frame"),
        pl.col("ts_ns").filter(pl.col("outcome") == "denied").max().alias("last_poll_ns"),
        pl.col("ts_ns").filter(pl.col("outcome") != "blocked").alias("tries"),
        pl.col("frame").filter(pl.col("outcome") == "denied").alias("frames"),
        pl.col("denied_owner").drop_nulls().first().alias("denied_owner"),
        pl.col("denied_clientid").drop_nulls().first().alias("denied_clientid"),
        pl.col("minorversion").max().alias("minorversion"),
    ).filter(pl.col("start_ns").is_not_null())
    if w.height == 0:
        return pl.DataFrame()
    w = w.with_columns(pl.coalesce("grant_ns", "last_poll_ns", "start_ns").alias("end_ns")) \
        .sort("gkey", "start_ns", "waiter")
    w = w.with_columns(
        (pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1).over("gkey")).fill_null(True)
        .cast(pl.UInt32).cum_sum().over("gkey").alias("ep"))
    return w.with_columns(pl.format("{}#{}", pl.col("gkey"), pl.col("ep")).alias("episode"))


def free_gaps(episodes: pl.DataFrame, holds: pl.DataFrame) -> pl.DataFrame:
    """The lock sat free: per release that falls inside an episode (gkey, start_ns, end_ns), the gap to
    the next grant on the gkey at or before the episode's end. Columns: episode, release_ns,
    release_frame, released_by, holder, grant_ns, grant_frame, grantee, gap_ns."""
    empty = pl.DataFrame(schema={"episode": pl.String, "release_ns": pl.Int64, "release_frame": pl.UInt32,
                                 "released_by": pl.String, "holder": pl.String, "grant_ns": pl.Int64,
                                 "grant_frame": pl.UInt32, "grantee": pl.String, "gap_ns": pl.Int64})
    if holds.height == 0 or episodes.height == 0:
        return empty
    rel = holds.filter(pl.col("release_ns").is_not_null()).select(
        "gkey", "release_ns", "release_frame", "released_by", pl.col("waiter").alias("holder"))
    if rel.height == 0:
        return empty
    inside = rel.join(episodes.select("episode", "gkey", pl.col("start_ns").alias("e0"), pl.col("end_ns").alias("e1")),
                      on="gkey").filter((pl.col("release_ns") > pl.col("e0")) & (pl.col("release_ns") < pl.col("e1")))
    g = holds.select("gkey", pl.col("ts_ns").alias("grant_ns"), pl.col("frame").alias("grant_frame"),
                     pl.col("waiter").alias("grantee")).sort("grant_ns")
    out = inside.sort("release_ns").join_asof(g, left_on="release_ns", right_on="grant_ns", by="gkey",
                                              strategy="forward", check_sortedness=False)
    out = out.filter(pl.col("grant_ns").is_not_null() & (pl.col("grant_ns") <= pl.col("e1")))
    # two releases before one grant (shared locks, or a LOCKU and a CLOSE): the lock was free from the last
    out = out.sort("episode", "grant_ns", "release_ns").unique(["episode", "grant_ns"], keep="last")
    return out.with_columns((pl.col("grant_ns") - pl.col("release_ns")).alias("gap_ns")).select(
        "episode", "release_ns", "release_frame", "released_by", "holder", "grant_ns", "grant_frame", "grantee",
        "gap_ns").sort("episode", "release_ns")
