"""Oplock / lease-break queue (``smb_break_queue``): clients that sit on an oplock or lease break
while other clients' requests wait behind it.

The pathology
    An SMB2 server that must break a client's oplock or lease (another open conflicts with the
    cached state) sends a break notification and holds the conflicting request — typically a CREATE,
    answered at once with an interim STATUS_PENDING — until the holder acknowledges the break
    (MS-SMB2 3.3.4.6 oplocks, 3.3.4.7 leases; 3.3.5.22 acknowledgment) or closes its open. A holder
    that flushes a lot of cached data first, is busy, or is buggy makes every later opener of that
    file queue behind the same break. When no acknowledgment comes the server gives up after its
    oplock break acknowledgment timer (MS-SMB2 3.3.2.1 ``OplockBreakAckTimeout``; Windows: 35 s) and
    revokes the state itself: the waiters wait that long.

The signal (from the ``smb2_breaks`` and ``smb2_transactions`` frames)
    * per break that needs an acknowledgment (exclusive/batch oplock breaks, lease breaks with
      SMB2_NOTIFY_BREAK_LEASE_FLAG_ACK_REQUIRED; a break from level II is never acknowledged,
      3.3.4.6): the time from the notification to the acknowledgment — or to the holder's CLOSE of
      the broken open, which also ends a break (3.3.5.10) — compared with a threshold relative to
      the capture: ``max(min_ack_latency_ns, ack_latency_factor x baseline)``, where the baseline is
      the larger of the holder connection's measured RTT and the server's median SMB2 response time;
      a client that sits 2 s on a break on a 20 µs path is the pathology, a 200 µs ack is not;
    * the queue behind it: requests on the same path from other opens (not the broken open itself),
      sent after the triggering request and before the break ended, that were answered only once it
      ended (within ``release_window_ns``) or never, after waiting at least ``min_waiter_wait_ns``:
      how many, from how many clients, how many went STATUS_PENDING, the longest and the total wait,
      the peak queue depth (see :func:`queue_depth` for the depth over time), and the request that
      triggered the break (``smb2_breaks.trigger_*``);
    * breaks never acknowledged: no acknowledgment nor CLOSE while the capture lasts; "never" when
      the capture runs past the server's break timeout (``break_timeout_ns``) after the notification;
    * break storms: ``storm_min_breaks`` or more breaks (any kind, acknowledged or not) on one file
      within ``storm_window_ns``: caching on the file keeps being granted and revoked.

Kinds: ``slow_ack``, ``unacknowledged``, ``storm``.

References: MS-SMB2 2.2.23 / 2.2.24 / 2.2.25 (break notification, acknowledgment, response),
3.3.4.6 / 3.3.4.7 (server sends oplock / lease breaks), 3.3.5.22 (acknowledgment processing),
3.3.2.1 (oplock break acknowledgment timer), 3.3.4.2 (interim responses); [MS-FSA] 2.1.5.17.

Known false positives / limits
    * A directory lease (SMB 3) break does not hold the triggering request: such breaks rarely have
      waiters, so a slow acknowledgment of one is only ``low`` (nobody waited).
    * A request that was pending for another reason (a byte-range lock, a slow disk) and happened to
      be answered right after the break ended is counted as a waiter.
    * With one vantage point: a capture that misses the client-to-server direction of the holder's
      connection cannot see acknowledgments; such unacknowledged breaks are reported
      ``informational`` with that reason. A capture taken at the holder sees a shorter
      notification-to-ack time than the server did (by about one RTT).
    * Lease breaks resolved by closing one of several handles with the same lease key are taken as
      resolved at that first CLOSE.

Client identity: :func:`detectors.base.client_identity` over the capture's SMB2 transactions
(address, or address:port when one address runs concurrent request streams from several ports).
The ``client`` of a finding is the break's holder (the client that sat on it); the waiters are
counted in ``clients`` and named in the explanation.

Severity rule (per break): by the total time other requests waited behind it — below
``medium_wait_s`` ``low`` (also when nobody waited: a slow acknowledgment that hurt no one), then
``medium``, ``high`` from ``high_wait_s``, ``critical`` from ``critical_wait_s``; at least ``high``
when ``many_waiters`` or more requests queued. Storms: the same scale on the total time requests
waited behind the storm's breaks, at least ``low``. ``informational`` when the vantage point
cannot show the acknowledgment.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .base import (NS_PER_MS, NS_PER_S, SEVERITY_RANK, client_identity, empty_findings, findings, fmt_ns,
                   optional_frame, resolution_ns, severity_from_scale)
from .params import LOWER, UPPER, param

NAME = "smb_break_queue"
KINDS = ("slow_ack", "unacknowledged", "storm")
# every frame it reads (packets: where the capture ends; interfaces: resolution_ns)
REQUIRES = ("smb2_breaks", "smb2_transactions", "connections", "packets", "interfaces")
# its findings are the union of its findings per server partition (base.py; tests/test_partitions.py)
PARTITION = "server"
ORDER = 30  # where it runs and is listed (detectors/__init__.py)



@dataclass(frozen=True)
class Params:
    """Thresholds and windows of the break-queue detector."""

    min_ack_latency_ns: int = param(50_000_000, "slow-acknowledgment floor: acks faster than this are never "
                                                "reported", unit="ns", gate=LOWER, lo=0)
    ack_latency_factor: float = param(20.0, "... and at least this multiple of the path baseline (max of the "
                                            "holder's RTT and the server's median SMB2 response time)",
                                      unit="x", gate=LOWER, lo=0.0)
    break_timeout_ns: int = param(35_000_000_000, "the server's oplock break acknowledgment timer (MS-SMB2 "
                                                  "3.3.2.1; Windows default 35 s)", unit="ns", lo=1)
    min_waiter_wait_ns: int = param(10_000_000, "a request counts as queued behind a break only if it waited "
                                                "at least this long", unit="ns", gate=LOWER, lo=0)
    release_window_ns: int = param(1_000_000_000, "... and was answered at most this long after the break "
                                                  "ended (else it waited for something else)", unit="ns",
                                   gate=UPPER, lo=0)
    medium_wait_s: float = param(0.5, "severity: medium from this total time others waited behind one break",
                                 unit="s", gate=LOWER, lo=0.0)
    high_wait_s: float = param(5.0, "... high from this", unit="s", gate=LOWER, lo=0.0)
    critical_wait_s: float = param(60.0, "... critical from this", unit="s", gate=LOWER, lo=0.0)
    many_waiters: int = param(10, "at least high when this many requests queued behind one break",
                              unit="requests", gate=LOWER, lo=1)
    storm_min_breaks: int = param(8, "break storm: at least this many breaks on one file (a storm is several "
                                     "breaks: at least 2) ...", unit="breaks", gate=LOWER, lo=2)
    storm_window_ns: int = param(10_000_000_000, "... within this window", unit="ns", lo=1)


def _empty_transactions() -> pl.DataFrame:
    from analyzer.decoders.smb2_pairing import TRANSACTION_COLUMNS
    from analyzer.schema import empty_frame

    return empty_frame(TRANSACTION_COLUMNS)


def path_key(share: pl.Expr, path: pl.Expr) -> pl.Expr:
    """Case-insensitive key of a path: share name + path below the share (``\\\\srv\\Data`` +
    ``Dir\\F`` -> ``data\\dir\\f``), so clients naming the server differently still match."""
    share_name = share.str.replace(r"^.*\\", "")
    rel = pl.when(share.is_not_null() & path.str.starts_with(share)) \
        .then(path.str.slice(share.str.len_chars())).otherwise(path).str.strip_chars("\\")
    return pl.when(path.is_null()).then(None).otherwise(
        pl.concat_str([share_name.fill_null(""), pl.lit("\\"), rel.fill_null("")])).str.to_lowercase()


def capture_end_ns(capture, *frames_cols: tuple[pl.DataFrame | None, str]) -> int | None:
    """The last timestamp of the capture (its packets; else the latest of the given columns)."""
    p = capture.packets
    if p.height and "ts_ns" in p.columns:
        v = p["ts_ns"].max()
        if v is not None:
            return int(v)
    best = None
    for frame, col in frames_cols:
        if frame is not None and frame.height and col in frame.columns:
            v = frame[col].max()
            if v is not None:
                best = int(v) if best is None else max(best, int(v))
    return best


def break_table(capture, params: Params = Params()) -> pl.DataFrame:
    """One row per break notification with its resolution, threshold and the queue behind it
    (the detector's working table; empty when the capture has no breaks)."""
    breaks = optional_frame(capture, "smb2_breaks")
    tx = optional_frame(capture, "smb2_transactions")
    if breaks is None or breaks.height == 0:
        return pl.DataFrame()
    if tx is None:
        tx = _empty_transactions()
    end = capture_end_ns(capture, (tx, "response_ts_ns"), (tx, "request_ts_ns"), (breaks, "ts_ns"),
                         (breaks, "ack_ts_ns"))
    ident, rule = client_identity(tx) if tx.height else (pl.col("client").cast(pl.String), "address")
    fid = pl.concat_str([pl.lit("F:"), pl.col("fid_persistent").cast(pl.String), pl.lit(":"),
                         pl.col("fid_volatile").cast(pl.String)])
    b = breaks.with_row_index("bid").with_columns(
        ident.alias("holder"), pl.lit(rule).alias("client_identity"),
        path_key(pl.col("share"), pl.col("path")).alias("pkey"),
        pl.when(pl.col("kind") == "lease").then(pl.concat_str([pl.lit("L:"), pl.col("lease_key")]))
        .otherwise(fid).alias("rkey"),
        pl.col("ack_required").fill_null(False),
    )
    # a CLOSE of the broken open (or of an open with the broken lease key) also ends the break
    closes = tx.filter(pl.col("operation") == "CLOSE")
    if closes.height:
        c_fid = closes.select(pl.col("server").cast(pl.String), fid.alias("rkey"), "request_ts_ns", "request_frame")
        c_lease = closes.filter(pl.col("lease_key").is_not_null()).select(
            pl.col("server").cast(pl.String), pl.concat_str([pl.lit("L:"), pl.col("lease_key")]).alias("rkey"),
            "request_ts_ns", "request_frame")
        c = pl.concat([c_fid, c_lease]).drop_nulls("rkey").rename(
            {"request_ts_ns": "close_ts_ns", "request_frame": "close_frame"}).sort("close_ts_ns", "close_frame")
        b = b.sort("ts_ns", "bid").join_asof(c, left_on="ts_ns", right_on="close_ts_ns", by=["server", "rkey"],
                                      strategy="forward", check_sortedness=False).sort("bid")
    else:
        b = b.with_columns(pl.lit(None, pl.Int64).alias("close_ts_ns"), pl.lit(None, pl.UInt32).alias("close_frame"))
    by_ack = pl.col("ack_ts_ns").is_not_null() & (pl.col("close_ts_ns").is_null()
                                                   | (pl.col("ack_ts_ns") <= pl.col("close_ts_ns")))
    b = b.with_columns(
        pl.when(by_ack).then(pl.col("ack_ts_ns")).otherwise(pl.col("close_ts_ns")).alias("resolved_ts_ns"),
        pl.when(by_ack).then(pl.col("ack_frame")).otherwise(pl.col("close_frame")).alias("resolved_frame"),
        pl.when(by_ack).then(pl.lit("ack")).when(pl.col("close_ts_ns").is_not_null()).then(pl.lit("close"))
        .alias("resolved_by"),
    ).with_columns((pl.col("resolved_ts_ns") - pl.col("ts_ns")).alias("latency_ns"),
                   (pl.lit(end, pl.Int64) - pl.col("ts_ns")).alias("observed_after_ns"))
    # baseline: the holder connection's RTT and the server's median response time
    conns = optional_frame(capture, "connections")
    if conns is not None and conns.height and "conn" in conns.columns:
        rtt = pl.coalesce(pl.col("handshake_rtt_ns"),
                          pl.col("rtt_client_server_ns") + pl.col("rtt_server_client_ns"))
        cc = conns.select(pl.col("conn").cast(pl.UInt32).alias("flow"), rtt.alias("rtt_ns"),
                          (pl.col("client_packets") > 0).alias("client_dir_seen"))
        b = b.join(cc, on="flow", how="left")
    else:
        b = b.with_columns(pl.lit(None, pl.Int64).alias("rtt_ns"), pl.lit(None, pl.Boolean).alias("client_dir_seen"))
    normal = tx.filter(pl.col("answered").fill_null(False) & pl.col("interim_frame").is_null()
                       & ~pl.col("pending_by_design").fill_null(False) & (pl.col("operation") != "OPLOCK_BREAK"))
    med = normal.group_by(pl.col("server").cast(pl.String)).agg(
        pl.col("latency_ns").median().alias("median_latency_ns"))
    b = b.join(med, on="server", how="left").with_columns(
        pl.max_horizontal(pl.col("rtt_ns").fill_null(0), pl.col("median_latency_ns").fill_null(0))
        .cast(pl.Int64).alias("baseline_ns"))
    # never claim a latency shorter than the capture's timestamp resolution
    b = b.with_columns(pl.max_horizontal(pl.lit(params.min_ack_latency_ns, pl.Float64),
                                         pl.col("baseline_ns") * params.ack_latency_factor,
                                         pl.lit(resolution_ns(capture), pl.Float64))
                       .cast(pl.Int64).alias("threshold_ns"))
    # the queue: requests on the same path from other opens, waiting across the break
    waits = _waiters(b, tx, ident, end, params)
    b = b.join(waits, on="bid", how="left").with_columns(
        pl.col("waiters").fill_null(0), pl.col("waiter_clients").fill_null(0), pl.col("pending_waiters").fill_null(0),
        pl.col("total_wait_ns").fill_null(0), pl.col("max_wait_ns").fill_null(0), pl.col("queue_depth").fill_null(0),
        pl.col("waiter_frames").fill_null(pl.lit([], pl.List(pl.UInt32))),
        pl.col("waiter_ops").fill_null(""), pl.col("waiter_client_ids").fill_null(pl.lit([], pl.List(pl.String))),
    )
    return b.sort("bid")


def _waiter_pairs(b: pl.DataFrame, tx: pl.DataFrame, ident: pl.Expr, end: int | None,
                  params: Params) -> pl.DataFrame:
    if tx.height == 0 or end is None:
        return pl.DataFrame()
    bq = b.filter(pl.col("ack_required") & pl.col("pkey").is_not_null()).select(
        "bid", "server", "pkey", "kind", pl.col("rkey").alias("b_rkey"), "resolved_ts_ns",
        pl.min_horizontal(pl.when(pl.col("trigger_match") == "blocked").then(pl.col("trigger_ts_ns")),
                          pl.col("ts_ns")).alias("b_start"),
        pl.coalesce(pl.col("resolved_ts_ns"), pl.lit(end, pl.Int64)).alias("b_end"))
    if bq.height == 0:
        return pl.DataFrame()
    fid = pl.concat_str([pl.lit("F:"), pl.col("fid_persistent").cast(pl.String), pl.lit(":"),
                         pl.col("fid_volatile").cast(pl.String)])
    # only a request sent within a break's span can wait behind it: the rest (a file server's millions)
    # are not keyed by path and client (on the 10M synth capture's file server at 10x, ~670 MB less)
    during = _within_any(tx["request_ts_ns"], bq["b_start"], bq["b_end"])
    cand = _one_chunk(tx, [*WAITER_COLUMNS, *ident.meta.root_names()]).with_row_index("tid").filter(
        during & pl.col("path").is_not_null() & ~pl.col("operation").is_in(["OPLOCK_BREAK", "CANCEL"])
        & ~pl.col("pending_by_design").fill_null(False)
    ).with_columns(
        (pl.coalesce(pl.col("response_ts_ns"), pl.lit(end, pl.Int64)) - pl.col("request_ts_ns")).alias("wait_ns"),
    ).filter(pl.col("wait_ns") >= params.min_waiter_wait_ns).select(
        "tid", pl.col("server").cast(pl.String), path_key(pl.col("share"), pl.col("path")).alias("pkey"),
        ident.alias("wclient"), "operation", "request_frame", "interim_frame", "response_frame", "request_ts_ns",
        "response_ts_ns", "wait_ns", fid.alias("w_fid"),
        pl.concat_str([pl.lit("L:"), pl.col("lease_key")]).alias("w_lease"))
    if cand.height == 0:
        return pl.DataFrame()
    resolved = pl.col("resolved_ts_ns").is_not_null()
    pairs = cand.join(bq, on=["server", "pkey"], how="inner").filter(
        (pl.col("request_ts_ns") >= pl.col("b_start")) & (pl.col("request_ts_ns") <= pl.col("b_end"))
        & pl.when(resolved).then(
            (pl.col("response_ts_ns") >= pl.col("resolved_ts_ns"))
            & (pl.col("response_ts_ns") <= pl.col("resolved_ts_ns") + params.release_window_ns))
        .otherwise(pl.col("response_ts_ns").is_null())
        & (pl.col("w_fid").fill_null("") != pl.col("b_rkey")) & (pl.col("w_lease").fill_null("") != pl.col("b_rkey"))
    )
    # a request waits behind one break: the latest that started before it
    return pairs.sort("tid", "b_start", "bid").unique("tid", keep="last", maintain_order=True)


# the columns of smb2_transactions a waiter is picked and described by (besides the client identity's)
WAITER_COLUMNS = ("server", "share", "path", "operation", "pending_by_design", "request_frame", "interim_frame",
                  "response_frame", "request_ts_ns", "response_ts_ns", "fid_persistent", "fid_volatile", "lease_key")


def _one_chunk(tx: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """``tx``'s ``columns`` (each once) as one chunk. A scan in partitions merges smb2_transactions from
    every partition (analyzer.shards) into a frame of many chunks, mapped from a file (analyzer.mapped_frames);
    on the 100M synth capture's file server (2,763,060 transactions in 22 chunks) Polars 2.1.0 panicked
    in the filter-then-format chain below (``binview/mod.rs:413 assertion failed: i < self.len()``), and
    did not on the same frame rechunked. Only these columns are copied, and only when in several chunks."""
    picked = tx.select(list(dict.fromkeys(columns)))
    return picked.rechunk() if picked.n_chunks() > 1 else picked


def _within_any(ts: pl.Series, starts: pl.Series, ends: pl.Series) -> pl.Series:
    """Whether each time ``ts`` lies in one of the closed spans ``starts[i]..ends[i]`` (null: in none):
    a time is in a span when more spans start at or before it than end before it."""
    spans = pl.DataFrame({"s": starts, "e": ends}).cast(pl.Int64).drop_nulls().filter(pl.col("s") <= pl.col("e"))
    t = ts.cast(pl.Int64)
    s, e = np.sort(spans["s"].to_numpy()), np.sort(spans["e"].to_numpy())
    values = t.fill_null(0).to_numpy()
    inside = np.searchsorted(s, values, side="right") > np.searchsorted(e, values, side="left")
    return pl.Series(inside & t.is_not_null().to_numpy())


def _waiters(b: pl.DataFrame, tx: pl.DataFrame, ident: pl.Expr, end: int | None, params: Params) -> pl.DataFrame:
    schema = {"bid": pl.UInt32, "waiters": pl.UInt32, "waiter_clients": pl.UInt32, "pending_waiters": pl.UInt32,
              "total_wait_ns": pl.Int64, "max_wait_ns": pl.Int64, "queue_depth": pl.UInt32,
              "waiter_frames": pl.List(pl.UInt32), "waiter_ops": pl.String, "waiter_client_ids": pl.List(pl.String)}
    b = b.with_columns(_trigger_ts(tx).alias("trigger_ts_ns")) if "trigger_frame" in b.columns else b
    pairs = _waiter_pairs(b, tx, ident, end, params)
    if pairs.height == 0:
        return pl.DataFrame(schema=schema)
    holder = b.select("bid", "holder")
    pairs = pairs.join(holder, on="bid", how="left")
    depth = queue_depth_of(pairs, end)
    ops = waiter_ops(pairs, "bid")
    agg = pairs.group_by("bid").agg(
        pl.len().cast(pl.UInt32).alias("waiters"),
        pl.col("wclient").filter(pl.col("wclient") != pl.col("holder")).n_unique().cast(pl.UInt32)
        .alias("waiter_clients"),
        pl.col("interim_frame").is_not_null().sum().cast(pl.UInt32).alias("pending_waiters"),
        pl.col("wait_ns").sum().cast(pl.Int64).alias("total_wait_ns"),
        pl.col("wait_ns").max().cast(pl.Int64).alias("max_wait_ns"),
        pl.concat_list("request_frame", "interim_frame", "response_frame").explode().drop_nulls()
        .cast(pl.UInt32).unique().sort().alias("waiter_frames"),
        pl.col("wclient").unique().sort().alias("waiter_client_ids"),
    )
    return agg.join(depth, on="bid", how="left").join(ops, on="bid", how="left").select(list(schema)).cast(schema)


def _trigger_ts(tx: pl.DataFrame) -> pl.Expr:
    """The triggering request's time (smb2_breaks has its frame): the earliest request of that frame."""
    if tx.height == 0:
        return pl.lit(None, pl.Int64)
    u = tx.group_by("request_frame").agg(pl.col("request_ts_ns").min())
    return pl.col("trigger_frame").replace_strict(u["request_frame"], u["request_ts_ns"], default=None,
                                                  return_dtype=pl.Int64)


def queue_depth_of(pairs: pl.DataFrame, end: int | None) -> pl.DataFrame:
    """Peak queue depth per break from (bid, request_ts_ns, response_ts_ns) waiter rows."""
    ev = _depth_events(pairs, end)
    return ev.group_by("bid").agg(pl.col("depth").max().cast(pl.UInt32).alias("queue_depth"))


def _depth_events(pairs: pl.DataFrame, end: int | None) -> pl.DataFrame:
    arrive = pairs.select("bid", pl.col("request_ts_ns").alias("ts_ns"), pl.lit(1, pl.Int32).alias("delta"))
    leave = pairs.select("bid", pl.coalesce(pl.col("response_ts_ns"), pl.lit(end, pl.Int64)).alias("ts_ns"),
                         pl.lit(-1, pl.Int32).alias("delta"))
    return pl.concat([arrive, leave]).sort("bid", "ts_ns", "delta").with_columns(
        pl.col("delta").cum_sum().over("bid").alias("depth"))


def queue_depth(capture, params: Params = Params()) -> pl.DataFrame:
    """Queue depth over time behind each break: (bid, ts_ns, depth) steps, ``bid`` numbering the rows
    of ``smb2_breaks``; the depth changes when a waiting request arrives or is answered."""
    b = break_table(capture, params)
    tx = optional_frame(capture, "smb2_transactions")
    if b.height == 0 or tx is None:
        return pl.DataFrame(schema={"bid": pl.UInt32, "ts_ns": pl.Int64, "depth": pl.Int32})
    end = capture_end_ns(capture, (tx, "response_ts_ns"), (b, "ts_ns"))
    ident, _ = client_identity(tx)
    pairs = _waiter_pairs(b.with_columns(_trigger_ts(tx).alias("trigger_ts_ns")), tx, ident, end, params)
    if pairs.height == 0:
        return pl.DataFrame(schema={"bid": pl.UInt32, "ts_ns": pl.Int64, "depth": pl.Int32})
    return _depth_events(pairs, end).select("bid", "ts_ns", "depth")


# -- findings ---------------------------------------------------------------------------------------

def waiter_ops(waiters: pl.DataFrame, key: str) -> pl.DataFrame:
    """Per ``key``: ``waiter_ops``, what the waiters asked, most asked first ("3 CREATEs, 1 SET_INFO")."""
    return waiters.group_by(key, "operation").len().sort(key, "len", "operation", descending=[False, True, False]) \
        .group_by(key, maintain_order=True).agg(
            pl.format("{} {}{}", pl.col("len"), pl.col("operation"),
                      pl.when(pl.col("len") > 1).then(pl.lit("s")).otherwise(pl.lit("")))
            .str.join(", ").alias("waiter_ops"))


def severity_at_least(sev: pl.Expr, cond: pl.Expr, to: str) -> pl.Expr:
    """A severity expression raised to at least ``to`` where ``cond`` holds (never lowered)."""
    ranks = list(SEVERITY_RANK.values())
    names = list(SEVERITY_RANK)
    r = sev.replace_strict(names, ranks, return_dtype=pl.Int32)
    r = pl.when(cond).then(pl.max_horizontal(r, pl.lit(SEVERITY_RANK[to]))).otherwise(r)
    return r.replace_strict(ranks, names, return_dtype=pl.String)


def _break_findings(b: pl.DataFrame, params: Params) -> pl.DataFrame:
    need = b.filter(pl.col("ack_required"))
    slow = pl.col("latency_ns").is_not_null() & (pl.col("latency_ns") > pl.col("threshold_ns"))
    unacked = pl.col("resolved_ts_ns").is_null() & (pl.col("observed_after_ns") > pl.col("threshold_ns"))
    f = need.filter(slow | unacked)
    if f.height == 0:
        return pl.DataFrame()
    blind = pl.col("resolved_ts_ns").is_null() & (pl.col("client_dir_seen") == False)  # noqa: E712
    sev = severity_from_scale(pl.col("total_wait_ns") / NS_PER_S, (0.0, params.medium_wait_s, params.high_wait_s,
                                                               params.critical_wait_s))
    f = f.with_columns(sev.alias("severity")).with_columns(
        severity_at_least(pl.col("severity"), pl.col("waiters") >= params.many_waiters, "high").alias("severity"),
    ).with_columns(pl.when(blind).then(pl.lit("informational")).otherwise(pl.col("severity")).alias("severity"),
                   blind.alias("blind"))
    rows = []
    for r in f.iter_rows(named=True):
        rows.append(_break_row(r, params))
    return pl.DataFrame(rows, infer_schema_length=None)


def _state(r: dict) -> str:
    old, new = r.get("old_state"), r.get("new_state")
    if old or new:
        return f" ({old or '?'}→{new or '?'})"
    return ""


def _break_row(r: dict, params: Params) -> dict:
    holder = r["holder"]
    what = f"the {r['kind']} break on {r['path'] or '(path not captured)'}{_state(r)}"
    unacked = r["resolved_ts_ns"] is None
    if r["blind"]:
        lead = (f"no acknowledgment of {what} sent to client {holder} is visible in the "
                f"{fmt_ns(r['observed_after_ns'])} the capture lasts after it, but this capture has no "
                f"packets from that client on its connection, so it cannot show one")
    elif unacked and r["observed_after_ns"] >= params.break_timeout_ns:
        lead = (f"client {holder} never acknowledged {what}: nothing in the {fmt_ns(r['observed_after_ns'])} "
                f"after it, past the server's {fmt_ns(params.break_timeout_ns)} break timeout (MS-SMB2 3.3.2.1)")
    elif unacked:
        lead = (f"client {holder} had not acknowledged {what} {fmt_ns(r['observed_after_ns'])} later, when the "
                f"capture ends (servers give up after their break timeout, 35 s on Windows)")
    elif r["resolved_by"] == "close":
        lead = (f"client {holder} sat {fmt_ns(r['latency_ns'])} on {what} and then closed the file instead of "
                f"acknowledging")
    else:
        lead = f"client {holder} took {fmt_ns(r['latency_ns'])} to acknowledge {what}"
    n = r["waiters"]
    if n:
        others = r["waiter_clients"]
        pend = r["pending_waiters"]
        queue = (f"; {r['waiter_ops'] or n} from {others} other client{'s' if others != 1 else ''} waited behind it"
                 + (f" ({pend} with STATUS_PENDING)" if pend else "")
                 + f", the longest {fmt_ns(r['max_wait_ns'])}"
                 + (f", {fmt_ns(r['total_wait_ns'])} in all, queue depth up to {r['queue_depth']}" if n > 1 else ""))
    else:
        queue = "; no other request waited behind it"
    trig = ""
    if r.get("trigger_frame") is not None:
        trig = (f"; triggered by {r.get('trigger_client')}'s {r.get('trigger_operation')} (frame {r['trigger_frame']}"
                + (f", answered after {fmt_ns(r['trigger_wait_ns'])}" if r.get("trigger_wait_ns") is not None else "")
                + ")")
    if r["baseline_ns"]:
        thr = (f"; threshold {fmt_ns(r['threshold_ns'])} (the larger of {fmt_ns(params.min_ack_latency_ns)} and "
               f"{params.ack_latency_factor:g}x the {fmt_ns(r['baseline_ns'])} path baseline)")
    else:
        thr = f"; threshold {fmt_ns(r['threshold_ns'])} (no RTT or response time measured to compare with)"
    frames = [r["frame"], r.get("ack_frame"), r.get("ack_response_frame"), r.get("close_frame")
              if r["resolved_by"] == "close" else None, r.get("trigger_frame"), r.get("trigger_response_frame"),
              r.get("owner_frame")] + list(r["waiter_frames"] or [])
    value = r["latency_ns"] if r["latency_ns"] is not None else r["observed_after_ns"]
    holder_ids = {holder} | set(r["waiter_client_ids"] or [])
    return {
        "kind": "unacknowledged" if unacked else "slow_ack",
        "severity": r["severity"],
        "start_ns": r["ts_ns"],
        "end_ns": r["resolved_ts_ns"] if r["resolved_ts_ns"] is not None else r["ts_ns"] + r["observed_after_ns"],
        "client": holder,
        "server": r["server"],
        "resource": r["path"],
        "clients": len(holder_ids),
        "client_identity": r["client_identity"],
        "metric": "break_ack_latency_ms",
        "value": value / NS_PER_MS,
        "threshold": r["threshold_ns"] / NS_PER_MS,
        "unit": "ms",
        "evidence_frames": [int(x) for x in frames if x is not None],
        "explanation": lead + queue + trig + thr,
    }


def _storm_findings(b: pl.DataFrame, params: Params) -> pl.DataFrame:
    k = params.storm_min_breaks
    s = b.filter(pl.col("pkey").is_not_null()).sort("server", "pkey", "ts_ns", "bid")
    if s.height < k:
        return pl.DataFrame()
    grp = ["server", "pkey"]
    s = s.with_columns(
        ((pl.col("ts_ns").shift(-(k - 1)).over(grp) - pl.col("ts_ns")) <= params.storm_window_ns)
        .fill_null(False).alias("_dense"))
    s = s.with_columns(pl.col("_dense").cast(pl.Int8).rolling_max(k, min_samples=1).over(grp).cast(pl.Boolean)
                       .alias("_in"))
    s = s.filter(pl.col("_in"))
    if s.height == 0:
        return pl.DataFrame()
    s = s.with_columns(
        ((pl.col("ts_ns") - pl.col("ts_ns").shift(1).over(grp)).fill_null(params.storm_window_ns + 1)
         > params.storm_window_ns).cum_sum().over(grp).alias("_ep"))
    eps = s.group_by(*grp, "_ep").agg(
        pl.len().alias("n"), pl.col("ts_ns").min().alias("start_ns"),
        pl.max_horizontal(pl.col("ts_ns"), pl.col("resolved_ts_ns").fill_null(0)).max().alias("end_ns"),
        pl.col("path").drop_nulls().first().alias("path"),
        pl.col("holder").n_unique().alias("holders"),
        pl.concat_list(pl.col("holder"), pl.col("trigger_client").cast(pl.String)).explode().drop_nulls()
        .unique().alias("ids"),
        pl.col("total_wait_ns").sum().alias("total_wait_ns"),
        pl.col("waiters").sum().alias("waiters"),
        pl.col("ack_required").sum().alias("acked_kind"),
        (pl.col("kind") == "lease").sum().alias("leases"),
        pl.col("frame").alias("frames"),
        pl.col("client_identity").first(),
        pl.col("latency_ns").max().alias("max_latency_ns"),
    ).filter(pl.col("n") >= k)
    if eps.height == 0:
        return pl.DataFrame()
    sev = severity_from_scale(pl.col("total_wait_ns") / NS_PER_S, (0.0, params.medium_wait_s, params.high_wait_s,
                                                               params.critical_wait_s))
    eps = eps.with_columns(sev.alias("severity"))
    rows = []
    for r in eps.iter_rows(named=True):
        span = max(1, r["end_ns"] - r["start_ns"])
        rate = r["n"] / (span / NS_PER_S)
        kinds = ("lease" if r["leases"] == r["n"] else "oplock" if r["leases"] == 0 else "oplock and lease")
        rows.append({
            "kind": "storm", "severity": r["severity"], "start_ns": r["start_ns"], "end_ns": r["end_ns"],
            "client": None, "server": r["server"], "resource": r["path"], "clients": len(r["ids"]),
            "client_identity": r["client_identity"], "metric": "breaks_in_window", "value": float(r["n"]),
            "threshold": float(k), "unit": "breaks",
            "evidence_frames": [int(x) for x in r["frames"]],
            "explanation": (
                f"{r['n']} {kinds} breaks on {r['path']} in {fmt_ns(span)} ({rate:.3g}/s) among {len(r['ids'])} "
                f"client(s) ({r['holders']} holder(s)): caching on this file keeps being granted and revoked"
                + (f"; {r['waiters']} request(s) waited {fmt_ns(r['total_wait_ns'])} in all behind these breaks"
                   if r["waiters"] else "; no request waited long behind them")
                + f" (storm: at least {k} breaks within {fmt_ns(params.storm_window_ns)})"),
        })
    return pl.DataFrame(rows, infer_schema_length=None)


def detect(capture, params: Params = Params()) -> pl.DataFrame:
    """Findings: slow or missing acknowledgments of oplock/lease breaks with the queue behind them,
    and break storms on one file (see the module doc)."""
    b = break_table(capture, params)
    if b.height == 0:
        return empty_findings()
    parts = [p for p in (_break_findings(b, params), _storm_findings(b, params)) if p.height]
    if not parts:
        return empty_findings()
    rows = pl.concat(parts, how="diagonal_relaxed")
    return findings(rows, detector=NAME, params=params)
