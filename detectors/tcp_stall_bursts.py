"""tcp_stall's slow-start kinds: per-transfer, per-RTT-round flight, in one Numba pass per batch.

``slow_start_after_idle`` and ``small_initial_window`` (what they mean: detectors/tcp_stall.py's
docstring) are read from the transfers :func:`detectors.tcp_stall_kinds.linked` marks (``tr``: the row
of a transfer's first payload segment in the linked segment frame, ``prev_tr``: the direction's
transfer before it). :func:`_sums` totals each transfer's new data (no retransmission, no
out-of-order segment) in one pass over the rows, :func:`_rounds` its RTT-long rounds for the
transfers of at least one RTT, one pass over their rows, instead of grouping the segment frame by
transfer and by round; the verdicts are then columns on the (few) transfers of two rounds or more.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from analyzer.jit import njit
from analyzer.tcp import analysis as an

MIN_SLOW_START_ROUNDS = 2  # a transfer shows slow start (a round that grew) from two RTT rounds on

# rows of _rounds' output, one column per transfer
R_PEAK, R_PEAK_ROUND, R_LAST_ROUND, R_NONEMPTY, R_FIRST, R_STALLED, R_SECOND_KNOWN, R_SECOND_GREW = range(8)
R_ROWS = 8


@njit(cache=True)
def _sums(tr, new, ts, seglen, frame):
    """Per head row (``tr[i]``: the row of row i's transfer head, -1 for none; ``new[i]``: row i
    carries new data of it): the transfer's new-data segments, first and last time, bytes, first and
    last frame (count 0: no new data, the rest unset)."""
    n = tr.shape[0]
    count = np.zeros(n, np.int64)
    t0, t1 = np.zeros(n, np.int64), np.zeros(n, np.int64)
    total = np.zeros(n, np.int64)
    ff, lf = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for i in range(n):
        if not new[i]:
            continue
        h = tr[i]
        if count[h] == 0:
            t0[h], t1[h], ff[h], lf[h] = ts[i], ts[i], frame[i], frame[i]
        else:
            t0[h], t1[h] = min(t0[h], ts[i]), max(t1[h], ts[i])
            ff[h], lf[h] = min(ff[h], frame[i]), max(lf[h], frame[i])
        count[h] += 1
        total[h] += seglen[i]
    return count, t0, t1, total, ff, lf


@njit(cache=True)
def _rounds(rows, starts, since, seglen, rtt, rounds, growth, first_round_rtts):
    """Per transfer g of at least one RTT (its new-data rows ``rows[starts[g]:starts[g + 1]]``, in row
    order, as positions in the per-row arrays: ``since`` its time after the transfer's first,
    ``rounds`` floor(since / rtt) as the caller computed it), rows R_*: the peak round's bytes and the first round holding it, the
    last round, the rounds with data, the bytes of the first ``first_round_rtts`` RTT (-1: none),
    whether a complete round carried less than ``growth`` x the round before it, whether round 1
    carried ``growth`` x round 0 (known when both carried data)."""
    m = starts.shape[0] - 1
    out = np.zeros((R_ROWS, m), np.int64)
    for g in range(m):
        mine = rows[starts[g]:starts[g + 1]]
        first, first_any = 0, False
        for i in mine:
            if float(since[i]) < rtt[i] * first_round_rtts:
                first += seglen[i]
                first_any = True
        for q in range(1, mine.shape[0]):
            if rounds[mine[q]] < rounds[mine[q - 1]]:  # times out of order: sort by round
                mine = mine[np.argsort(rounds[mine], kind="mergesort")]
                break
        peak, peak_round, nonempty, stalled = -1, -1, 0, False
        rb0, rb1, prev_rb = -1, -1, -1
        last_round = rounds[mine[-1]]
        q = 0
        while q < mine.shape[0]:
            r = rounds[mine[q]]
            rb = 0
            while q < mine.shape[0] and rounds[mine[q]] == r:
                rb += seglen[mine[q]]
                q += 1
            nonempty += 1
            if rb > peak:
                peak, peak_round = rb, r
            if r < last_round and prev_rb >= 0 and float(rb) < growth * float(prev_rb):
                stalled = True
            if r == 0:
                rb0 = rb
            elif r == 1:
                rb1 = rb
            prev_rb = rb
        out[R_PEAK, g], out[R_PEAK_ROUND, g], out[R_LAST_ROUND, g], out[R_NONEMPTY, g] = \
            peak, peak_round, last_round, nonempty
        out[R_FIRST, g] = first if first_any else -1
        out[R_STALLED, g] = stalled
        if rb0 >= 0 and rb1 >= 0:
            out[R_SECOND_KNOWN, g] = 1
            out[R_SECOND_GREW, g] = float(rb1) >= growth * float(rb0)
    return out


def _nullable(values: np.ndarray, valid: np.ndarray, name: str) -> pl.Series:
    """``values`` as a Series, null where ``valid`` is False."""
    return pl.Series(name, values).set(pl.Series(~valid), None) if not valid.all() else pl.Series(name, values)


def bursts(s: pl.DataFrame, p, res: float) -> pl.DataFrame:
    """Slow start after idle and transfers finished in slow start, from per-RTT-round flight.

    A transfer (``tr``, from _links) is a run of one side's payload with no payload from the peer in
    between and no silence longer than ``transfer_gap_rtts x RTT + resume_slack_ns`` (slow start sends
    every round trip). Its rounds are RTT-long slots from its first segment; the first round is its first
    ``first_round_rtts`` RTT."""
    new_data = ((pl.col("analysis") & (an.ANY_RETRANSMISSION | an.OUT_OF_ORDER)) == 0) & pl.col("tr").is_not_null()
    cols = s.select(pl.col("tr").fill_null(-1), new_data.fill_null(False).alias("new"), pl.col("ts_ns"),
                    pl.col("seglen").fill_null(0), pl.col("frame").cast(pl.Int64),
                    pl.col("rtt").cast(pl.Float64).fill_null(float("nan")), pl.col("prev_tr").fill_null(-1),
                    pl.col("dk"))
    if not cols["new"].any():
        return pl.DataFrame()
    tr, new, ts, seglen, frame, rtt, prev_tr, dk = (cols[c].to_numpy() for c in cols.columns)
    count, t0, t1, total, first_frame, last_frame = _sums(tr, new, ts, seglen, frame)
    heads = np.flatnonzero(count)
    # transfers of at least one RTT (no RTT: never) have rounds; only they can have two
    multi = heads[(t1[heads] - t0[heads]).astype(np.float64) >= rtt[heads]]
    peak = total.copy()
    if multi.size:
        is_multi = np.zeros(tr.shape[0], np.bool_)
        is_multi[multi] = True
        mine = new & is_multi[np.maximum(tr, 0)]
        idx = np.flatnonzero(mine)  # their rows; below, arrays over these rows
        order = np.argsort(tr[idx], kind="stable")  # grouped by transfer (multi ascending), in row order
        starts = np.r_[0, np.cumsum(count[multi])]
        since = ts[idx] - t0[tr[idx]]
        # each segment's round, by Polars' own division of s's RTT column as the rows select it (a column
        # that is one value repeated divides as a multiplication by its reciprocal: the rounds must be
        # Polars' to the last bit)
        rtt_rows = s.lazy().filter(pl.lit(pl.Series(mine))).select("rtt").collect()
        rounds = rtt_rows.select(pl.lit(pl.Series(since)).truediv(pl.col("rtt")).floor().cast(pl.Int64)) \
            .to_series().to_numpy()
        r = _rounds(order, starts, since, seglen[idx], rtt[idx], rounds, float(p.round_growth),
                    float(p.first_round_rtts))
        peak[multi] = r[R_PEAK]
        keep = r[R_LAST_ROUND] + 1 >= MIN_SLOW_START_ROUNDS
    if not multi.size or not keep.any():
        return pl.DataFrame()
    r, multi = r[:, keep], multi[keep]
    # the direction's previous transfer (when it had new data) and its best, over all its transfers
    before = np.maximum(prev_tr[multi], 0)
    has_prev = (prev_tr[multi] >= 0) & (count[before] > 0)
    best = np.zeros(int(dk.max()) + 1, np.int64)
    np.maximum.at(best, dk[heads], peak[heads])
    # per transfer: its first segment (the head row) says how it started, its new data what it carried
    b = s.select(
        "prev_tr", "conn", "from_client", "rtt", "peer_mss",
        (pl.col("ts_ns") - pl.col("prev_pay_ts")).alias("idle_ns"), pl.col("prev_pay_frame").alias("before_frame"),
    )[multi].with_columns(
        pl.Series("t0", t0[multi]), pl.Series("t1", t1[multi]), pl.Series("bytes", total[multi]),
        pl.Series("first_frame", first_frame[multi]), pl.Series("last_frame", last_frame[multi]),
        pl.Series("peak", r[R_PEAK]), pl.Series("peak_round", r[R_PEAK_ROUND]),
        pl.Series("last_round", r[R_LAST_ROUND]), pl.Series("nonempty_rounds", r[R_NONEMPTY]),
        pl.Series("first", np.where(r[R_FIRST] >= 0, r[R_FIRST], total[multi])),
        pl.Series("stalled_growth", r[R_STALLED].astype(np.bool_)),
        _nullable(r[R_SECOND_GREW].astype(np.bool_), r[R_SECOND_KNOWN].astype(np.bool_), "second_round_grew"),
        _nullable(peak[before], has_prev, "prev_peak"),
        pl.Series("best_peak", best[dk[multi]]),
        pl.Series("rounds", r[R_LAST_ROUND] + 1),
    )
    mss = pl.col("peer_mss").cast(pl.Float64)
    iw_cap = mss * p.iw_max_segments
    idle_thr = pl.lit(float(p.idle_min_ns)) + pl.col("rtt")
    ssi = ((pl.col("idle_ns") >= idle_thr)
           & (pl.col("first") <= pl.col("prev_peak") * p.restart_ratio)
           & (pl.col("first") <= iw_cap) & (pl.col("first") >= mss * p.ssi_min_first_segments)
           & (pl.col("bytes") >= p.transfer_growth * pl.col("first"))
           & pl.col("second_round_grew")).fill_null(False)
    ideal = ((pl.col("bytes") / pl.col("prev_peak")) - 1).clip(lower_bound=0) * pl.col("rtt")
    regrow = (pl.col("prev_peak") / pl.col("first")).log(2).ceil() * pl.col("rtt")
    ssi_lost = pl.min_horizontal((pl.col("t1") - pl.col("t0") - ideal).clip(lower_bound=0), regrow)
    sis = (~ssi & (pl.col("nonempty_rounds") >= p.sis_min_rounds) & ~pl.col("stalled_growth").fill_null(True)
           & (pl.col("first") <= iw_cap) & (pl.col("first") >= p.sis_min_first_segments * mss)
           & (pl.col("peak_round") >= pl.col("last_round") - 1)
           & (pl.col("bytes") >= p.transfer_growth * pl.col("first")))
    needed = (pl.col("bytes") / pl.col("best_peak")).ceil().clip(lower_bound=1)
    sis_lost = pl.min_horizontal(((pl.col("rounds") - needed) * pl.col("rtt")).clip(lower_bound=0),
                                 (pl.col("t1") - pl.col("t0")).cast(pl.Float64))
    b = b.with_columns(
        pl.when(ssi).then(pl.lit("slow_start_after_idle")).when(sis).then(pl.lit("small_initial_window"))
        .otherwise(None).alias("kind"),
        pl.when(ssi).then(ssi_lost).when(sis).then(sis_lost).otherwise(0.0).alias("stall_ns"),
    ).filter(pl.col("kind").is_not_null() & (pl.col("stall_ns") > 0))
    if b.height == 0:
        return pl.DataFrame()
    return b.select(
        "conn", "from_client", "kind", pl.col("t0").alias("start_ns"), pl.col("t1").alias("end_ns"),
        pl.col("stall_ns").cast(pl.Float64),
        pl.when(pl.col("kind") == "slow_start_after_idle").then(pl.lit(float(p.idle_min_ns)) + pl.col("rtt"))
        .otherwise(pl.col("rtt") * p.sis_min_rounds).alias("threshold_ns"),
        pl.concat_list(pl.col("before_frame").cast(pl.UInt32), pl.col("first_frame").cast(pl.UInt32),
                       pl.col("last_frame").cast(pl.UInt32)).list.drop_nulls().alias("frames"),
        pl.col("first").alias("first_bytes"), pl.col("prev_peak"), pl.col("best_peak"), pl.col("bytes"),
        pl.col("rounds"), pl.col("idle_ns"),
    )
