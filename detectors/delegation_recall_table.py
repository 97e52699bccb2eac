"""The working tables of the ``delegation_recall`` detector, from ``nfs_transactions``: one row per
delegation recall with its return, and one row per waiter (a client whose requests on the recalled
file were answered NFS4ERR_DELAY while the recall was outstanding) with its retries and final answer.

Separate from the detector module so that the proof chart reads the same rows the findings do.
The rules are documented in :mod:`detectors.delegation_recall`.
"""
from __future__ import annotations

import polars as pl

from .base import client_identity, optional_frame, resolution_ns
from .smb_break_queue import capture_end_ns, queue_depth_of, waiter_ops

DELAY = "NFS4ERR_DELAY"  # RFC 7530 §13.1.1.3, RFC 8881 §15.1.1.3
# what a server answers for a delegation it has revoked (RFC 8881 §15.1.5 state management errors:
# DELEG_REVOKED, ADMIN_REVOKED; a 4.0 server: EXPIRED or BAD_STATEID, RFC 7530 §10.4.7, §13.1.5)
REVOKED = ("NFS4ERR_DELEG_REVOKED", "NFS4ERR_ADMIN_REVOKED", "NFS4ERR_EXPIRED", "NFS4ERR_BAD_STATEID")
GRANTED = ("OPEN_DELEGATE_READ", "OPEN_DELEGATE_WRITE")
FLUSH_OPS = ("WRITE", "COMMIT")

_WAITER_SCHEMA = {
    "rid": pl.UInt32, "wclient": pl.String, "operation": pl.String, "delays": pl.UInt32,
    "first_ts_ns": pl.Int64, "last_delay_ts_ns": pl.Int64, "final_ts_ns": pl.Int64,
    "final_response_ts_ns": pl.Int64, "final_status": pl.String, "final_frame": pl.UInt32,
    "final_response_frame": pl.UInt32, "wait_ns": pl.Int64, "after_return_ns": pl.Int64,
    "delay_frames": pl.List(pl.UInt32), "delay_ts_ns": pl.List(pl.Int64),
}


def _nfs(capture) -> pl.DataFrame | None:
    tx = optional_frame(capture, "nfs_transactions", nonempty=True)
    if tx is None or "operation" not in tx.columns:
        return None
    return tx.with_columns(pl.col("client").cast(pl.String), pl.col("server").cast(pl.String))


def recalls(tx: pl.DataFrame) -> pl.DataFrame:
    """One row per recall episode: the CB_RECALLs naming one delegation stateid (a server may send the
    recall again) folded into the first. Columns: rid, nfs_server, holder (the called client's
    address), stateid, fh_hash, resource, ts_ns (the first CB_RECALL), frame, cb_calls, cb_frames,
    cb_flow, cb_minor, cb_answered, cb_status, cb_latency_ns, cb_response_frame."""
    cb = tx.filter((pl.col("operation") == "CB_RECALL") & pl.col("is_callback").fill_null(True))
    if cb.height == 0:
        return pl.DataFrame()
    key = pl.coalesce(pl.col("stateid"), pl.format("fh:{}", pl.col("fh_hash")),
                      pl.format("frame:{}", pl.col("request_frame")))
    cb = cb.with_columns(key.alias("dkey")).sort("request_ts_ns", "request_frame")
    return cb.group_by(pl.col("client").alias("nfs_server"), pl.col("server").alias("holder"), "dkey",
                       maintain_order=True).agg(
        pl.col("stateid").first(), pl.col("fh_hash").first(), pl.col("resource").first(),
        pl.col("request_ts_ns").first().alias("ts_ns"), pl.col("request_frame").first().alias("frame"),
        pl.len().cast(pl.UInt32).alias("cb_calls"),
        pl.concat_list("request_frame", "response_frame").explode().drop_nulls().alias("cb_frames"),
        pl.col("flow").first().alias("cb_flow"), pl.col("minorversion").first().alias("cb_minor"),
        pl.col("answered").first().alias("cb_answered"), pl.col("status").first().alias("cb_status"),
        pl.col("latency_ns").first().alias("cb_latency_ns"),
        pl.col("response_frame").first().alias("cb_response_frame"),
    ).sort("ts_ns", "frame").with_row_index("rid")


def _returns(r: pl.DataFrame, tx: pl.DataFrame) -> pl.DataFrame:
    """The first DELEGRETURN of each recall's stateid after it (RFC 7530 §16.6, RFC 8881 §18.6)."""
    dr = tx.filter((pl.col("operation") == "DELEGRETURN") & pl.col("stateid").is_not_null()).select(
        pl.col("server").alias("nfs_server"), "stateid", pl.col("request_ts_ns").alias("return_ts_ns"),
        pl.col("request_frame").alias("return_frame"), pl.col("response_frame").alias("return_response_frame"),
        pl.col("response_ts_ns").alias("return_response_ts_ns"), pl.col("status").alias("return_status"),
        pl.col("flow").alias("return_flow"), pl.col("client").alias("return_client"),
        pl.col("client_port").alias("return_port")).sort("return_ts_ns")
    if dr.height == 0:
        return r.with_columns(*[pl.lit(None, dr.schema[c]).alias(c) for c in dr.columns
                                if c not in ("nfs_server", "stateid")])
    left = r.filter(pl.col("stateid").is_not_null()).sort("ts_ns")
    if left.height == 0:
        joined = left.join(dr.drop("nfs_server", "stateid").clear(), how="cross")
    else:
        joined = left.join_asof(dr, left_on="ts_ns", right_on="return_ts_ns", by=["nfs_server", "stateid"],
                                strategy="forward", check_sortedness=False)
    rest = r.filter(pl.col("stateid").is_null())
    return pl.concat([joined, rest], how="diagonal_relaxed").sort("rid")


def _grants(tx: pl.DataFrame) -> pl.DataFrame:
    """OPENs answered with a READ or WRITE delegation (RFC 7530 §16.16.2 open_delegation4)."""
    return tx.filter((pl.col("operation") == "OPEN") & pl.col("delegation_type").is_in(list(GRANTED))).select(
        pl.col("server").alias("nfs_server"), pl.col("client").alias("holder"), "resource",
        pl.col("response_ts_ns").alias("grant_ts_ns"), pl.col("request_frame").alias("grant_frame"),
        pl.col("response_frame").alias("grant_response_frame"), pl.col("flow").alias("grant_flow"),
        pl.col("delegation_type").alias("grant_type")).drop_nulls("grant_ts_ns").sort("grant_ts_ns")


def recall_table(capture, params) -> pl.DataFrame:
    """One row per recall with its return, the holder's flush, the threshold and its waiters' summary
    (empty when the capture has no CB_RECALL)."""
    tx = _nfs(capture)
    if tx is None:
        return pl.DataFrame()
    r = recalls(tx)
    if r.height == 0:
        return pl.DataFrame()
    end = capture_end_ns(capture, (tx, "response_ts_ns"), (tx, "request_ts_ns"))
    r = _returns(r, tx)
    g = _grants(tx)
    if g.height:
        r = r.sort("ts_ns").join_asof(g, left_on="ts_ns", right_on="grant_ts_ns", by=["nfs_server", "holder",
                                                                                      "resource"],
                                      strategy="backward", check_sortedness=False).sort("rid")
    else:
        r = r.with_columns(*[pl.lit(None, g.schema[c]).alias(c) for c in g.columns
                             if c not in ("nfs_server", "holder", "resource")])
    # the holder's fore connection: its DELEGRETURN's, its grant's, or (4.1) the recall's own
    r = r.with_columns(
        pl.coalesce("return_flow", "grant_flow",
                    pl.when(pl.col("cb_minor") >= 1).then(pl.col("cb_flow"))).alias("holder_flow"),
        (pl.lit(end, pl.Int64) - pl.col("ts_ns")).alias("observed_after_ns"),
        (pl.col("return_ts_ns") - pl.col("ts_ns")).alias("latency_ns"),
    )
    r = _revocations(r, tx)
    r = _flushes(r, tx)
    r = _baseline(r, tx, capture, params)
    ident, rule = client_identity(tx.filter(~pl.col("is_callback").fill_null(False)))
    r = r.with_columns(pl.lit(rule).alias("client_identity"))
    holder_ids = tx.filter(~pl.col("is_callback").fill_null(False)).select("flow", ident.alias("hid")) \
        .unique("flow", keep="first")
    r = r.join(holder_ids.rename({"flow": "holder_flow"}), on="holder_flow", how="left").with_columns(
        pl.coalesce("hid", "holder").alias("holder_id")).drop("hid")
    w = waiter_table(capture, params, r=r, tx=tx, end=end)
    summary = _waiter_summary(w, end)
    return r.join(summary, on="rid", how="left").with_columns(
        pl.col("waiters").fill_null(0), pl.col("waiter_delays").fill_null(0), pl.col("total_wait_ns").fill_null(0),
        pl.col("max_wait_ns").fill_null(0), pl.col("queue_depth").fill_null(0),
        pl.col("waiter_frames").fill_null(pl.lit([], pl.List(pl.UInt32))),
        pl.col("waiter_client_ids").fill_null(pl.lit([], pl.List(pl.String))),
    ).sort("rid")


def _revocations(r: pl.DataFrame, tx: pl.DataFrame) -> pl.DataFrame:
    """The first answer after the recall naming its stateid with a revoked-state error."""
    rv = tx.filter(pl.col("status").is_in(list(REVOKED)) & pl.col("stateid").is_not_null()).select(
        pl.col("server").alias("nfs_server"), "stateid", pl.col("response_ts_ns").alias("revoked_ts_ns"),
        pl.col("response_frame").alias("revoked_frame"), pl.col("status").alias("revoked_status"),
        pl.col("operation").alias("revoked_operation")).drop_nulls("revoked_ts_ns").sort("revoked_ts_ns")
    left = r.filter(pl.col("stateid").is_not_null()).sort("ts_ns")
    if rv.height == 0 or left.height == 0:
        return r.with_columns(pl.lit(None, pl.Int64).alias("revoked_ts_ns"), pl.lit(None, pl.UInt32)
                              .alias("revoked_frame"), pl.lit(None, pl.String).alias("revoked_status"),
                              pl.lit(None, pl.String).alias("revoked_operation"))
    j = left.join_asof(rv, left_on="ts_ns", right_on="revoked_ts_ns", by=["nfs_server", "stateid"],
                       strategy="forward", check_sortedness=False)
    return pl.concat([j, r.filter(pl.col("stateid").is_null())], how="diagonal_relaxed").sort("rid")


def _flushes(r: pl.DataFrame, tx: pl.DataFrame) -> pl.DataFrame:
    """WRITE / COMMIT the holder sent on its fore connection between the recall and its return (the
    cached data a delegation holder must flush first, RFC 7530 §10.4.4)."""
    wr = tx.filter(pl.col("operation").is_in(list(FLUSH_OPS))).select(
        pl.col("flow").alias("holder_flow"), "request_ts_ns", "operation", "length")
    if wr.height == 0:
        return r.with_columns(pl.lit(0, pl.UInt32).alias("flush_ops"), pl.lit(0, pl.UInt64).alias("flush_bytes"))
    j = r.select("rid", "holder_flow", "ts_ns", "return_ts_ns").join(wr, on="holder_flow").filter(
        (pl.col("request_ts_ns") >= pl.col("ts_ns"))
        & (pl.col("request_ts_ns") <= pl.col("return_ts_ns").fill_null(pl.col("request_ts_ns"))))
    agg = j.group_by("rid").agg(pl.len().cast(pl.UInt32).alias("flush_ops"),
                                pl.col("length").filter(pl.col("operation") == "WRITE").sum().cast(pl.UInt64)
                                .alias("flush_bytes"))
    return r.join(agg, on="rid", how="left").with_columns(pl.col("flush_ops").fill_null(0),
                                                          pl.col("flush_bytes").fill_null(0))


def _baseline(r: pl.DataFrame, tx: pl.DataFrame, capture, params) -> pl.DataFrame:
    """threshold = max(min, factor x baseline, resolution); baseline = max(holder RTT, the server's median
    NFS response time over answered, non-DELAY, non-callback calls)."""
    conns = optional_frame(capture, "connections")
    if conns is not None and conns.height and "conn" in conns.columns:
        rtt = pl.coalesce(pl.col("handshake_rtt_ns"), pl.col("rtt_client_server_ns") + pl.col("rtt_server_client_ns"))
        cc = conns.select(pl.col("conn").cast(pl.UInt32).alias("holder_flow"), rtt.cast(pl.Int64).alias("rtt_ns"),
                          (pl.col("client_packets") > 0).alias("holder_dir_seen"))
        r = r.join(cc, on="holder_flow", how="left")
    else:
        r = r.with_columns(pl.lit(None, pl.Int64).alias("rtt_ns"), pl.lit(None, pl.Boolean).alias("holder_dir_seen"))
    normal = tx.filter(pl.col("answered").fill_null(False) & ~pl.col("is_callback").fill_null(False)
                       & (pl.col("status") != DELAY).fill_null(True))
    med = normal.group_by(pl.col("server").alias("nfs_server")).agg(
        pl.col("latency_ns").median().alias("median_latency_ns"))
    r = r.join(med, on="nfs_server", how="left").with_columns(
        pl.max_horizontal(pl.col("rtt_ns").fill_null(0), pl.col("median_latency_ns").fill_null(0))
        .cast(pl.Int64).alias("baseline_ns"))
    return r.with_columns(pl.max_horizontal(pl.lit(params.min_return_latency_ns, pl.Float64),
                                            pl.col("baseline_ns") * params.return_latency_factor,
                                            pl.lit(resolution_ns(capture), pl.Float64)).cast(pl.Int64)
                          .alias("threshold_ns"))


def delayed(tx: pl.DataFrame) -> pl.DataFrame:
    """The requests answered NFS4ERR_DELAY (not callbacks), with their client identity ``wclient``."""
    fore = tx.filter(~pl.col("is_callback").fill_null(False))
    ident, rule = client_identity(fore) if fore.height else (pl.col("client"), "address")
    return fore.with_row_index("tid").with_columns(ident.alias("wclient"), pl.lit(rule).alias("client_identity")) \
        .filter(pl.col("status") == DELAY)


def waiter_table(capture, params, *, r: pl.DataFrame | None = None, tx: pl.DataFrame | None = None,
                 end: int | None = None) -> pl.DataFrame:
    """One row per waiter of a recall: (rid, wclient, operation) with its NFS4ERR_DELAY answers, its
    first request, and the first answer other than NFS4ERR_DELAY to the same operation on the same
    file from the same client after them (``final_*``; null: none in the capture)."""
    if tx is None:
        tx = _nfs(capture)
        if tx is None:
            return pl.DataFrame(schema=_WAITER_SCHEMA)
        end = capture_end_ns(capture, (tx, "response_ts_ns"), (tx, "request_ts_ns"))
    if r is None:
        r = recall_table(capture, params)
    if r.height == 0 or end is None:
        return pl.DataFrame(schema=_WAITER_SCHEMA)
    fore = tx.filter(~pl.col("is_callback").fill_null(False))
    ident, _ = client_identity(fore) if fore.height else (pl.col("client"), "address")
    fore = fore.with_row_index("tid").with_columns(ident.alias("wclient"))
    d = fore.filter(pl.col("status") == DELAY)
    pairs = _delay_pairs(r, d, end, params)
    if pairs.height == 0:
        return pl.DataFrame(schema=_WAITER_SCHEMA)
    by = ["rid", "wclient", "nfs_server", "resource", "operation"]
    g = pairs.sort("request_ts_ns").group_by(by, maintain_order=True).agg(
        pl.len().cast(pl.UInt32).alias("delays"), pl.col("request_ts_ns").min().alias("first_ts_ns"),
        pl.col("request_ts_ns").max().alias("last_delay_ts_ns"),
        pl.concat_list("request_frame", "response_frame").explode().drop_nulls().cast(pl.UInt32).unique().sort()
        .alias("delay_frames"), pl.col("request_ts_ns").alias("delay_ts_ns"), pl.col("return_ts_ns").first())
    done = fore.filter((pl.col("status") != DELAY) & pl.col("answered").fill_null(False)).select(
        "wclient", pl.col("server").alias("nfs_server"), "resource", "operation",
        pl.col("request_ts_ns").alias("final_ts_ns"), pl.col("response_ts_ns").alias("final_response_ts_ns"),
        pl.col("status").alias("final_status"), pl.col("request_frame").alias("final_frame"),
        pl.col("response_frame").alias("final_response_frame")).drop_nulls("resource").sort("final_ts_ns")
    g = g.sort("last_delay_ts_ns").join_asof(done, left_on="last_delay_ts_ns", right_on="final_ts_ns",
                                             by=["wclient", "nfs_server", "resource", "operation"],
                                             strategy="forward", allow_exact_matches=False, check_sortedness=False)
    g = g.with_columns(
        (pl.coalesce(pl.col("final_response_ts_ns"), pl.lit(end, pl.Int64)) - pl.col("first_ts_ns")).alias("wait_ns"),
        (pl.col("final_response_ts_ns") - pl.col("return_ts_ns")).alias("after_return_ns"),
    ).filter(pl.col("wait_ns") >= params.min_waiter_wait_ns)
    return g.sort("rid", "first_ts_ns").select(list(_WAITER_SCHEMA)).cast(_WAITER_SCHEMA)


def _delay_pairs(r: pl.DataFrame, d: pl.DataFrame, end: int, params) -> pl.DataFrame:
    """DELAY answers to other clients on a recalled file (same resource, or the recalled handle) sent
    from ``trigger_window_ns`` before the recall until its return (or the capture's end); a request
    goes with the outstanding recall returned last (the one that held it)."""
    if d.height == 0:
        return pl.DataFrame()
    rq = r.select("rid", "nfs_server", pl.col("resource").alias("r_resource"), pl.col("fh_hash").alias("r_fh"),
                  "holder", "holder_flow", "return_ts_ns",
                  (pl.col("ts_ns") - params.trigger_window_ns).alias("w_start"),
                  pl.coalesce(pl.col("return_ts_ns"), pl.lit(end, pl.Int64)).alias("w_end"), "ts_ns")
    cand = d.select("tid", "wclient", pl.col("client").alias("w_addr"), "flow", pl.col("server").alias("nfs_server"),
                    "resource", "fh_hash", "operation", "request_ts_ns", "response_ts_ns", "request_frame",
                    "response_frame")
    by_path = cand.join(rq, left_on=["nfs_server", "resource"], right_on=["nfs_server", "r_resource"], how="inner")
    by_fh = cand.drop_nulls("fh_hash").join(rq.drop_nulls("r_fh"), left_on=["nfs_server", "fh_hash"],
                                            right_on=["nfs_server", "r_fh"], how="inner")
    pairs = pl.concat([by_path, by_fh], how="diagonal_relaxed").filter(
        (pl.col("request_ts_ns") >= pl.col("w_start")) & (pl.col("request_ts_ns") <= pl.col("w_end"))
        # not the holder itself: its fore connection when known, else its address
        & pl.when(pl.col("holder_flow").is_not_null()).then(pl.col("flow") != pl.col("holder_flow"))
        .otherwise(pl.col("w_addr") != pl.col("holder")))
    # several recalls outstanding at once (read delegations held by several clients): the request waits
    # for the last of them to be returned; one sent before any recall (its trigger) likewise
    inside = (pl.col("request_ts_ns") >= pl.col("ts_ns")).alias("_inside")
    return pairs.with_columns(inside).sort("tid", "_inside", "w_end", "rid") \
        .unique("tid", keep="last", maintain_order=True).drop("_inside")


def _waiter_summary(w: pl.DataFrame, end: int | None) -> pl.DataFrame:
    schema = {"rid": pl.UInt32, "waiters": pl.UInt32, "waiter_delays": pl.UInt32, "total_wait_ns": pl.Int64,
              "max_wait_ns": pl.Int64, "queue_depth": pl.UInt32, "waiter_frames": pl.List(pl.UInt32),
              "waiter_client_ids": pl.List(pl.String), "waiters_through": pl.UInt32,
              "max_after_return_ns": pl.Int64, "median_after_return_ns": pl.Int64, "last_through_ns": pl.Int64,
              "waiter_ops": pl.String}
    if w.height == 0:
        return pl.DataFrame(schema=schema)
    depth = queue_depth_of(w.select(pl.col("rid").alias("bid"), pl.col("first_ts_ns").alias("request_ts_ns"),
                                    pl.col("final_response_ts_ns").alias("response_ts_ns")), end) \
        .rename({"bid": "rid"})
    ops = waiter_ops(w, "rid")
    agg = w.group_by("rid").agg(
        pl.len().cast(pl.UInt32).alias("waiters"), pl.col("delays").sum().cast(pl.UInt32).alias("waiter_delays"),
        pl.col("wait_ns").sum().alias("total_wait_ns"), pl.col("wait_ns").max().alias("max_wait_ns"),
        pl.concat_list(pl.col("delay_frames"), pl.concat_list("final_frame", "final_response_frame").list.drop_nulls())
        .explode().drop_nulls().cast(pl.UInt32).unique().sort().alias("waiter_frames"),
        pl.col("wclient").unique().sort().alias("waiter_client_ids"),
        pl.col("final_response_ts_ns").is_not_null().sum().cast(pl.UInt32).alias("waiters_through"),
        pl.col("after_return_ns").max().alias("max_after_return_ns"),
        pl.col("after_return_ns").median().cast(pl.Int64).alias("median_after_return_ns"),
        pl.col("final_response_ts_ns").max().alias("last_through_ns"),
    )
    return agg.join(depth, on="rid", how="left").join(ops, on="rid", how="left").select(list(schema)).cast(schema)


def unexplained_delays(capture, params, r: pl.DataFrame) -> pl.DataFrame:
    """Per (server, resource): NFS4ERR_DELAY answers that no visible recall explains (what a capture
    without the callback connection shows of a recall), with any delegation granted on the file before."""
    tx = _nfs(capture)
    if tx is None:
        return pl.DataFrame()
    d = delayed(tx)
    if d.height == 0:
        return pl.DataFrame()
    if r.height:
        end = capture_end_ns(capture, (tx, "response_ts_ns"), (tx, "request_ts_ns"))
        explained = _delay_pairs(r, d, end, params)
        if explained.height:
            d = d.join(explained.select("tid"), on="tid", how="anti")
    if d.height == 0:
        return pl.DataFrame()
    agg = d.group_by(pl.col("server").alias("nfs_server"), "resource").agg(
        pl.len().cast(pl.UInt32).alias("delays"), pl.col("wclient").n_unique().cast(pl.UInt32).alias("clients"),
        pl.col("wclient").unique().sort().alias("client_ids"), pl.col("client_identity").first(),
        pl.col("request_ts_ns").min().alias("start_ns"),
        pl.coalesce("response_ts_ns", "request_ts_ns").max().alias("end_ns"),
        pl.concat_list("request_frame", "response_frame").explode().drop_nulls().cast(pl.UInt32).unique().sort()
        .alias("frames"),
        pl.col("operation").unique().sort().str.join(", ").alias("ops"))
    g = _grants(tx)
    if g.height:
        last = g.group_by("nfs_server", "resource").agg(
            pl.col("holder").last().alias("grant_holder"), pl.col("grant_type").last(),
            pl.col("grant_frame").last(), pl.col("grant_ts_ns").last())
        agg = agg.join(last, on=["nfs_server", "resource"], how="left")
    else:
        agg = agg.with_columns(pl.lit(None, pl.String).alias("grant_holder"), pl.lit(None, pl.String).alias("grant_type"),
                               pl.lit(None, pl.UInt32).alias("grant_frame"), pl.lit(None, pl.Int64).alias("grant_ts_ns"))
    # the holder's DELEGRETURN after the first DELAY, if visible: when the recall ended
    dr = tx.filter(pl.col("operation") == "DELEGRETURN").select(
        pl.col("server").alias("nfs_server"), "resource", pl.col("client").alias("return_client"),
        pl.col("request_ts_ns").alias("return_ts_ns"), pl.col("request_frame").alias("return_frame")) \
        .drop_nulls(["resource", "return_ts_ns"]).sort("return_ts_ns")
    agg = agg.sort("start_ns").join_asof(dr, left_on="start_ns", right_on="return_ts_ns",
                                         by=["nfs_server", "resource"], strategy="forward", check_sortedness=False)
    any_cb = tx.filter(pl.col("is_callback").fill_null(False)).height > 0
    return agg.with_columns(pl.lit(any_cb).alias("callbacks_seen")).sort("nfs_server", "resource")
