"""The toctou detector's windows and interleaving scan (see detectors/toctou.py for what a window and a
realised race are): the check -> use windows of each (server, resource, client), and one Numba pass
that finds, per window, the other clients' conflicting changes of its resource inside it.

The kernel reads two integer matrices, one row per named column (``W_*`` for the windows, ``C_*``
for the changes), instead of a long list of positional arrays; ``UNKNOWN`` (-1) marks a value that
is not known (no handle, no byte range, no attribute set).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from analyzer.jit import njit

UNKNOWN = -1  # an unknown code, offset, length or attribute mask in the kernel's matrices

# rows of the windows matrix
W_GROUP, W_CHECK_SEQ, W_USE_SEQ, W_CLIENT, W_FID, W_MASK, W_OFFSET, W_LENGTH, W_WRITE = range(9)
# rows of the changes matrix (sorted by group, then seq)
C_SEQ, C_CLIENT, C_FID, C_MASK, C_OFFSET, C_LENGTH = range(6)
# rows of the group bounds matrix: each group's first change and one past its last
B_LO, B_HI = range(2)


@njit(cache=True)
def _scan(win, chg, bounds, max_scan, max_clients):
    """For each window (a column of ``win``): the other clients' conflicting changes of its resource
    strictly between the check (``W_CHECK_SEQ``) and the use (``W_USE_SEQ``), at most ``max_scan``
    changes examined. A change made through the very handle the use goes through (``fid`` codes
    equal, UNKNOWN = none: e.g. the CREATE that returned the handle) is never one the use missed.
    Returns (first change index or -1, count, distinct other clients up to ``max_clients``)."""
    n = win.shape[1]
    first = np.full(n, -1, np.int64)
    count = np.zeros(n, np.int64)
    distinct = np.zeros(n, np.int64)
    seen = np.empty(max(max_clients, 1), np.int64)
    c_seq = chg[C_SEQ]
    c_cid = chg[C_CLIENT]
    c_fid = chg[C_FID]
    c_mask = chg[C_MASK]
    c_off = chg[C_OFFSET]
    c_len = chg[C_LENGTH]
    for i in range(n):
        g = win[W_GROUP, i]
        lo, hi = bounds[B_LO, g], bounds[B_HI, g]
        if lo >= hi:
            continue
        cid, fid, mask = win[W_CLIENT, i], win[W_FID, i], win[W_MASK, i]
        off, length, write = win[W_OFFSET, i], win[W_LENGTH, i], win[W_WRITE, i] != 0
        s1 = win[W_USE_SEQ, i]
        x = lo + np.searchsorted(c_seq[lo:hi], win[W_CHECK_SEQ, i], side="right")
        ns = 0
        scanned = 0
        while x < hi and c_seq[x] < s1 and scanned < max_scan:
            scanned += 1
            if c_cid[x] != cid and (fid < 0 or c_fid[x] != fid):
                conflict = True
                if write:
                    if mask != UNKNOWN and c_mask[x] != UNKNOWN and (mask & c_mask[x]) == 0:
                        conflict = False
                    if length >= 0 and c_len[x] >= 0 and off >= 0 and c_off[x] >= 0:
                        if not (off < c_off[x] + c_len[x] and c_off[x] < off + length):
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
                    if new and ns < max_clients:
                        seen[ns] = c_cid[x]
                        ns += 1
            x += 1
        distinct[i] = ns
    return first, count, distinct


def windows(ev: pl.DataFrame, params) -> pl.DataFrame:
    """The check -> use windows of the events ``ev`` (detectors/toctou_events.py): each use with the
    previous event of its (protocol, server, resource, client) as ``p_*`` columns, kept when that was a
    check the use depends on, no longer ago than ``max_window_ns`` (a write) or
    ``stale_max_window_ns`` (a re-open)."""
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
        (pl.col("mask") == UNKNOWN) | (pl.col("p_rmask") == UNKNOWN) | ((pl.col("mask") & pl.col("p_rmask")) != 0)
    ).otherwise(~pl.col("p_read_content").fill_null(False))
    return rel.filter(is_use & pl.col("p_check").fill_null(False) & ~pl.col("p_write_op").fill_null(True)
                      & ((pl.col("ts") - pl.col("p_ts")) <= maxw) & (pl.col("seq") > pl.col("p_seq")) & depends)


def _matrix(frame: pl.DataFrame, exprs: list[pl.Expr]) -> np.ndarray:
    """One int64 row per expression (null -> UNKNOWN), C-contiguous: the kernel's named rows."""
    cols = frame.select([e.cast(pl.Int64).fill_null(UNKNOWN).alias(f"_{k}") for k, e in enumerate(exprs)])
    out = np.empty((len(exprs), frame.height), np.int64)
    for k, name in enumerate(cols.columns):
        out[k] = cols[name].to_numpy()
    return out


def interleavings(ev: pl.DataFrame, win: pl.DataFrame, params) -> pl.DataFrame:
    """Per window: the first conflicting change by another client inside it (x_* columns), how many
    (``x_count``), from how many other clients (``x_clients``, at most ``max_counted_clients``)."""
    ch = ev.filter(pl.col("write_op") & pl.col("ok") & pl.col("key").is_not_null())
    groups = pl.concat([ch.select("proto", "server", "key"), win.select("proto", "server", "key")]).unique() \
        .sort("proto", "server", "key").with_row_index("g")
    cids = pl.concat([ch["cid"], win["cid"]]).unique().sort()
    code = {"old": cids, "new": pl.arange(0, cids.len(), eager=True)}
    fids = pl.concat([ch["fid"], win["fid"]]).drop_nulls().unique().sort()
    fcode = {"old": fids, "new": pl.arange(0, fids.len(), eager=True)}

    def cid_code(col):
        return pl.col(col).replace_strict(code["old"], code["new"], return_dtype=pl.Int64)

    def fid_code(col):  # UNKNOWN: no handle (LDAP, or not captured)
        return pl.col(col).replace_strict(fcode["old"], fcode["new"], default=UNKNOWN, return_dtype=pl.Int64)

    ch = ch.join(groups, on=["proto", "server", "key"]).sort("g", "seq").with_row_index("ci")
    win = win.join(groups, on=["proto", "server", "key"])
    ng = groups.height
    gc = ch["g"].to_numpy().astype(np.int64)
    bounds = np.empty((2, ng), np.int64)
    bounds[B_LO] = np.searchsorted(gc, np.arange(ng), side="left")
    bounds[B_HI] = np.searchsorted(gc, np.arange(ng), side="right")
    w = [None] * 9
    w[W_GROUP], w[W_CHECK_SEQ], w[W_USE_SEQ] = pl.col("g"), pl.col("p_seq"), pl.col("seq")
    w[W_CLIENT], w[W_FID], w[W_MASK] = cid_code("cid"), fid_code("fid"), pl.col("mask")
    w[W_OFFSET], w[W_LENGTH], w[W_WRITE] = pl.col("off"), pl.col("len"), pl.col("write_op").fill_null(False)
    c = [None] * 6
    c[C_SEQ], c[C_CLIENT], c[C_FID] = pl.col("seq"), cid_code("cid"), fid_code("fid")
    c[C_MASK], c[C_OFFSET], c[C_LENGTH] = pl.col("mask"), pl.col("off"), pl.col("len")
    first, count, distinct = _scan(_matrix(win, w), _matrix(ch, c), bounds, int(params.max_scan),
                                   int(params.max_counted_clients))
    win = win.with_columns(pl.Series("x_ci", first).cast(pl.Int64), pl.Series("x_count", count),
                           pl.Series("x_clients", distinct))
    x = ch.select(pl.col("ci").cast(pl.Int64).alias("x_ci"), pl.col("cid").alias("x_cid"), pl.col("ts").alias("x_ts"),
                  pl.col("frame").alias("x_frame"), pl.col("resp_frame").alias("x_resp_frame"),
                  pl.col("op").alias("x_op"))
    return win.join(x, on="x_ci", how="left")
