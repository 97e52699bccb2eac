"""tcp_stall's episode finders: one function per kind, each returning one row per episode.

Each episode frame has: conn, from_client (the blocked sender), kind, start_ns, end_ns, stall_ns,
threshold_ns, frames (list[u32]) and kind-specific detail columns. ``s`` is the linked segment frame
(capture order, see :func:`linked`); ``dk`` is conn * 2 + from_client. What each kind means, and how
it is measured, is in detectors/tcp_stall.py's docstring; the slow-start kinds are read in
detectors/tcp_stall_bursts.py.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from analyzer.jit import njit
from analyzer.tcp import analysis as an

SYN, FIN, RST, ACK = an.TH_SYN, an.TH_FIN, an.TH_RST, an.TH_ACK

# rows of the segment matrix _links reads (one int64 row per named column, capture order)
SEG_CONN, SEG_SIDE, SEG_TS, SEG_SEGLEN, SEG_ANALYSIS, SEG_FRAME, SEG_DATA_LIKE = range(7)
SEG_ROWS = 7

# the columns _links adds to the segment frame, and their rows in its output matrix
LINK_COLUMNS = ("prev_any_ts", "prev_any_frame", "prev_pay_ts", "prev_pay_frame", "next_frame", "next_ts",
                "next_seglen", "next_analysis", "next_held", "tr", "prev_tr")
(PREV_ANY_TS, PREV_ANY_FRAME, PREV_PAY_TS, PREV_PAY_FRAME, NEXT_FRAME, NEXT_TS, NEXT_SEGLEN, NEXT_ANALYSIS,
 NEXT_HELD, TR, PREV_TR) = range(len(LINK_COLUMNS))
LINK_ROWS = len(LINK_COLUMNS)

ZERO_WINDOW_PROBE_EVIDENCE = 10  # zero_window: the first probes kept as evidence
SEQ_SPAN = 1 << 33  # dk * SEQ_SPAN + seq_rel: one integer per (direction, relative sequence number)


@njit(cache=True)
def _links(seg, gap_limit, idle_thr, zw_bit, blocked_bits, n_conn):
    """One pass in capture order over ``seg`` (rows SEG_*: conn, side = from_client, ts, seglen,
    analysis, frame, data_like), returning one row per LINK_COLUMNS name. Per segment (-1 where there
    is none):
    prev_any_ts / prev_any_frame: the previous data-bearing (payload, SYN or FIN) segment of its direction;
    prev_pay_ts / prev_pay_frame, next_frame / next_ts / next_seglen / next_analysis: the previous and
    next payload segment of its direction (payload segments only); next_held: that next payload segment
    directly follows this one in the connection (no payload from the peer in between);
    tr / prev_tr: the transfer of a payload segment (the row of its first segment; a new transfer
    starts after a silence of ``gap_limit`` or when the peer sent payload in between; none where
    gap_limit is NaN) and the direction's transfer before it.
    Per connection: idle, the sum of the gaps of at least ``idle_thr[conn]`` after which the connection
    carries on (the segment after the gap is not a retransmission, probe or window update, and the one
    before it did not close the window)."""
    conn, side, ts, seglen = seg[SEG_CONN], seg[SEG_SIDE], seg[SEG_TS], seg[SEG_SEGLEN]
    analysis, frame, data_like = seg[SEG_ANALYSIS], seg[SEG_FRAME], seg[SEG_DATA_LIKE]
    n = conn.shape[0]
    out = np.full((LINK_ROWS, n), -1, np.int64)
    out[NEXT_ANALYSIS] = 0
    out[NEXT_HELD] = 0
    prev_any_ts, prev_any_frame, prev_pay_ts, prev_pay_frame = out[PREV_ANY_TS], out[PREV_ANY_FRAME], \
        out[PREV_PAY_TS], out[PREV_PAY_FRAME]
    next_frame, next_ts, next_seglen, next_analysis = out[NEXT_FRAME], out[NEXT_TS], out[NEXT_SEGLEN], \
        out[NEXT_ANALYSIS]
    next_held, tr, prev_tr = out[NEXT_HELD], out[TR], out[PREV_TR]
    idle = np.zeros(n_conn, np.int64)
    last_seg = np.full(n_conn, -1, np.int64)
    last_pay_c = np.full(n_conn, -1, np.int64)
    last_any = np.full(2 * n_conn, -1, np.int64)
    last_pay = np.full(2 * n_conn, -1, np.int64)
    cur_tr = np.full(2 * n_conn, -1, np.int64)
    before_tr = np.full(2 * n_conn, -1, np.int64)
    for i in range(n):
        c = conn[i]
        d = c * 2 + side[i]
        ps = last_seg[c]
        if ps >= 0 and ts[i] - ts[ps] >= idle_thr[c] and (analysis[i] & blocked_bits) == 0 \
                and (analysis[ps] & zw_bit) == 0:
            idle[c] += ts[i] - ts[ps]
        last_seg[c] = i
        if data_like[i] != 0:
            pa = last_any[d]
            if pa >= 0:
                prev_any_ts[i] = ts[pa]
                prev_any_frame[i] = frame[pa]
            last_any[d] = i
        if seglen[i] > 0:
            pp = last_pay[d]
            pc = last_pay_c[c]
            if pp >= 0:
                prev_pay_ts[i] = ts[pp]
                prev_pay_frame[i] = frame[pp]
                next_frame[pp] = frame[i]
                next_ts[pp] = ts[i]
                next_seglen[pp] = seglen[i]
                next_analysis[pp] = analysis[i]
                next_held[pp] = 1 if pc == pp else 0
            last_pay[d] = i
            last_pay_c[c] = i
            g = gap_limit[i]
            if g == g:
                turn = pc >= 0 and side[pc] != side[i]
                if pp < 0 or cur_tr[d] < 0 or turn or (ts[i] - ts[pp]) >= g:
                    before_tr[d] = cur_tr[d]
                    cur_tr[d] = i
                tr[i] = cur_tr[d]
                prev_tr[i] = before_tr[d]
    return out, idle


def linked(s: pl.DataFrame, info: pl.DataFrame, p, res: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """s with the LINK_COLUMNS (null where there is none) and info with ``active_ns``."""
    data_like = (pl.col("seglen") > 0) | ((pl.col("tcp_flags") & (SYN | FIN)) != 0)
    gap_limit = (pl.col("rtt") * p.transfer_gap_rtts + p.resume_slack_ns + res).fill_null(float("nan"))
    rows = [None] * SEG_ROWS
    rows[SEG_CONN], rows[SEG_SIDE], rows[SEG_TS] = pl.col("conn"), pl.col("from_client"), pl.col("ts_ns")
    rows[SEG_SEGLEN], rows[SEG_ANALYSIS] = pl.col("seglen").fill_null(0), pl.col("analysis").fill_null(0)
    rows[SEG_FRAME], rows[SEG_DATA_LIKE] = pl.col("frame"), data_like
    arrays = s.select([e.cast(pl.Int64).alias(f"_{k}") for k, e in enumerate(rows)])
    seg = np.ascontiguousarray(arrays.to_numpy(order="fortran").T)  # a view when Polars hands out Fortran order
    n_conn = int(max(arrays["_0"].max(), info["conn"].max())) + 1
    idle_thr = np.full(n_conn, float(p.idle_min_ns))
    known = info.filter(pl.col("rtt").is_not_null())
    idle_thr[known["conn"].to_numpy().astype(np.int64)] += known["rtt"].to_numpy()
    blocked_bits = an.ANY_RETRANSMISSION | an.ZERO_WINDOW_PROBE | an.WINDOW_UPDATE | an.ZERO_WINDOW \
        | an.ZERO_WINDOW_PROBE_ACK
    cols, idle = _links(seg, s.select(gap_limit)[:, 0].to_numpy(), idle_thr, an.ZERO_WINDOW, blocked_bits, n_conn)
    series = []
    for name, a in zip(LINK_COLUMNS, cols):
        ser = pl.Series(name, a.astype(np.bool_) if name == "next_held" else a)
        if name not in ("next_analysis", "next_held"):
            ser = ser.set(ser == -1, None) if (a == -1).any() else ser
        series.append(ser)
    s = s.with_columns(series).with_columns(data_like.alias("data_like"))
    info = info.join(pl.DataFrame({"conn": np.arange(n_conn, dtype=np.int64), "idle_ns": idle})
                     .with_columns(pl.col("conn").cast(info["conn"].dtype)), on="conn", how="left").with_columns(
        (pl.col("life_ns") - pl.col("idle_ns").fill_null(0)).clip(lower_bound=1).alias("active_ns"))
    return s, info


# -- episodes ----------------------------------------------------------------------------------------

DK = (pl.col("conn").cast(pl.Int64) * 2 + pl.col("from_client").cast(pl.Int64))


def _rows(s: pl.DataFrame, mask: pl.Expr, *cols) -> pl.DataFrame:
    """The rows of ``s`` where ``mask`` holds, only ``cols`` (names or expressions): the segment frame
    is wide, and filtering only the columns needed is what keeps the detector fast."""
    return s.lazy().filter(mask).select(*cols).collect()


RESUME = "resume"  # column: rtt * resume_rtts + resume_slack_ns + resolution
# the flags of a segment :func:`rto` may read as a timer's retransmission: a retransmission, not a fast
# one nor an out-of-order segment (every segment of an rto episode has them)
TIMER_RETRANSMISSION = ((pl.col("analysis") & (an.RETRANSMISSION | an.SPURIOUS_RETRANSMISSION)) != 0) \
    & ((pl.col("analysis") & (an.FAST_RETRANSMISSION | an.OUT_OF_ORDER)) == 0)


def rto(s: pl.DataFrame, p, res: float) -> pl.DataFrame:
    """Timer-driven retransmission episodes, each read as what it is (``kind``): ``rto`` (data, or a
    client's SYN), ``synack_retransmission`` (the server's SYN/ACK), ``spurious_retransmission``
    (data the receiver's D-SACK says it already had) or ``teardown`` (a bare FIN)."""
    retx = TIMER_RETRANSMISSION
    thr = pl.max_horizontal(pl.lit(float(p.rto_min_gap_ns)), pl.col("rtt").fill_null(0.0) * p.rto_gap_rtts,
                            pl.lit(res))
    gap = pl.col("ts_ns") - pl.col("prev_any_ts")
    is_syn = (pl.col("tcp_flags") & SYN) != 0
    is_rto = (pl.col("data_like") & retx & (gap >= thr) & (gap <= p.rto_max_gap_ns)
              & (~is_syn | pl.col("saw_synack"))).fill_null(False)
    r = _rows(s, is_rto, "dk", "_i", "conn", "from_client", "frame", "ts_ns", "seq_rel", "prev_any_ts",
              "prev_any_frame", "rtt", "tcp_flags", "seglen", "analysis", "last_pay_ts", RESUME)
    if r.height == 0:
        return pl.DataFrame()
    # back-to-back timeouts (the previous data segment of the direction was a timeout too) are one episode
    # ... of one class: a SYN, a bare FIN (teardown) and data are never one episode
    cls = pl.when(is_syn).then(1).when((pl.col("seglen") == 0) & ((pl.col("tcp_flags") & FIN) != 0)).then(2) \
        .otherwise(0)
    r = r.with_columns(gap.alias("gap"), thr.alias("threshold_ns"), is_syn.alias("syn"), cls.alias("cls")) \
        .sort("dk", "_i")
    chained = ((pl.col("dk") == pl.col("dk").shift(1)) & (pl.col("frame").shift(1) == pl.col("prev_any_frame"))
               & (pl.col("cls") == pl.col("cls").shift(1)))
    r = r.with_columns((~chained.fill_null(False)).cum_sum().alias("ep"))
    # the first transmission of the retransmitted bytes: the original segment holding seq_rel
    key = pl.col("dk") * SEQ_SPAN + pl.col("seq_rel")
    orig = _rows(s, pl.col("data_like") & ((pl.col("analysis") & (an.ANY_RETRANSMISSION | an.OUT_OF_ORDER)) == 0)
                 & pl.col("dk").is_in(r["dk"].unique().implode()),
        key.alias("key"), pl.col("ts_ns").alias("orig_ts"), pl.col("frame").alias("orig_frame"),
        (pl.col("seq_rel") + pl.col("seglen").clip(lower_bound=1)).alias("orig_end"),
        pl.col("dk").alias("orig_dk")).sort("key", "orig_frame")
    r = r.with_columns(key.alias("key")).sort("key").join_asof(orig, on="key", strategy="backward")
    ok = (pl.col("orig_dk") == pl.col("dk")) & (pl.col("seq_rel") < pl.col("orig_end")) \
        & (pl.col("orig_ts") <= pl.col("ts_ns"))
    r = r.with_columns(pl.when(ok).then(pl.col("orig_ts")).alias("orig_ts"),
                       pl.when(ok).then(pl.col("orig_frame")).alias("orig_frame")).sort("_i")
    eps = r.group_by("conn", "from_client", "ep").agg(
        pl.col("ts_ns").max().alias("end_ns"), pl.col("ts_ns").min().alias("retx_ts"),
        pl.col("frame").alias("retx_frames"), pl.col("gap").alias("gaps"), pl.len().alias("retx"),
        pl.col("orig_ts").first(), pl.col("orig_frame").first(), pl.col("prev_any_ts").first().alias("prev_ts"),
        pl.col("prev_any_frame").first().alias("prev_frame"), pl.col("syn").any(),
        pl.col("threshold_ns").first(), pl.col("rtt").first(), pl.col("last_pay_ts").first(), pl.col(RESUME).first(),
        (pl.col("seglen") > 0).any().alias("payload"),
        ((pl.col("tcp_flags") & FIN) != 0).any().alias("fin"),
        ((pl.col("analysis") & an.DSACKED_RETRANSMISSION) != 0).sum().alias("dsacked"),
        ((pl.col("analysis") & an.DSACKED_RETRANSMISSION) != 0).first().alias("first_dsacked"),
    )
    eps = eps.with_columns(pl.min_horizontal(pl.coalesce("orig_ts", "prev_ts"), "prev_ts").alias("start_ns"))
    # the other side's segments: its first after the last retransmission (the recovery ACK), its
    # first after the episode started (did it answer before the timer fired?) and its first FIN
    other = _rows(s, pl.col("conn").is_in(eps["conn"].unique().implode()),
        "conn", (~pl.col("from_client")).alias("from_client"), pl.col("ts_ns").alias("ack_ts"),
        pl.col("frame").alias("ack_frame"), pl.col("tcp_flags").alias("ans_flags")).sort("ack_ts", "ack_frame")
    eps = eps.sort("end_ns").join_asof(other.drop("ans_flags"), left_on="end_ns", right_on="ack_ts",
                                       by=["conn", "from_client"], strategy="forward", check_sortedness=False)
    answer = other.rename({"ack_ts": "ans_ts", "ack_frame": "ans_frame"})
    eps = eps.sort("start_ns").join_asof(answer, left_on="start_ns", right_on="ans_ts", by=["conn", "from_client"],
                                         strategy="forward", check_sortedness=False, allow_exact_matches=False)
    eps = eps.with_columns(*[pl.when(pl.col("ans_ts") < pl.col("retx_ts")).then(pl.col(c)).alias(c)
                             for c in ("ans_ts", "ans_frame", "ans_flags")])
    # the peer's last segment in the capture: an episode it never answered (no segment of its after
    # the last retransmission) ended nothing, the peer or the path was gone
    peer_last = other.group_by("conn", "from_client").agg(pl.col("ack_frame").max().alias("peer_last_frame"))
    eps = eps.join(peer_last, on=["conn", "from_client"], how="left").with_columns(
        pl.col("ack_frame").is_null().alias("unanswered"))
    peer_fin = other.filter((pl.col("ans_flags") & FIN) != 0).group_by("conn", "from_client").agg(
        pl.col("ack_ts").min().alias("peer_fin_ts"), pl.col("ack_frame").min().alias("peer_fin_frame"))
    eps = eps.join(peer_fin, on=["conn", "from_client"], how="left").with_columns(
        pl.when(pl.col("peer_fin_ts") < pl.col("end_ns")).then(pl.col("peer_fin_frame")).alias("peer_fin_frame"))
    # a SYN/ACK resent within the resume window of the client's repeated SYN answers that SYN (RFC 9293
    # 3.10.7.4), it is not the server's timer: the client's SYN episode is the finding
    echo = (pl.col("syn") & ~pl.col("from_client") & ((pl.col("ans_flags") & SYN) != 0)
            & ((pl.col("retx_ts") - pl.col("ans_ts")) <= pl.col(RESUME))).fill_null(False)
    eps = eps.filter(~echo)
    if eps.height == 0:
        return pl.DataFrame()
    kind = (pl.when(pl.col("syn") & ~pl.col("from_client")).then(pl.lit("synack_retransmission"))
            .when(pl.col("syn")).then(pl.lit("rto"))
            # the receiver had the data before the timer first fired: its D-SACK of the first retransmission
            .when(pl.col("payload") & pl.col("first_dsacked")).then(pl.lit("spurious_retransmission"))
            .when(~pl.col("payload") & pl.col("fin")).then(pl.lit("teardown"))
            .otherwise(pl.lit("rto")))
    eps = eps.with_columns(
        pl.concat_list(pl.col("orig_frame").cast(pl.UInt32), pl.col("prev_frame").cast(pl.UInt32),
                       pl.when(pl.col("syn")).then(pl.col("ans_frame")).cast(pl.UInt32),
                       pl.col("retx_frames").cast(pl.List(pl.UInt32)),
                       pl.col("ack_frame").cast(pl.UInt32)).list.drop_nulls().alias("frames"),
        (pl.col("end_ns") - pl.col("start_ns") - pl.col("rtt").fill_null(0.0)).clip(lower_bound=0.0)
        .alias("stall_ns"),
        kind.alias("kind"),
        # data waited on this episode: it retransmitted data, or data followed it in the connection
        (pl.col("payload") | (pl.col("last_pay_ts") > pl.col("end_ns")).fill_null(False)).alias("waited"),
    )
    return eps.select("conn", "from_client", "kind", "start_ns", "end_ns", "stall_ns", "threshold_ns", "frames",
                      pl.col("gaps").cast(pl.List(pl.Float64)), "retx", "syn", "waited", "dsacked",
                      "ans_frame", "ans_flags", "peer_fin_frame", "unanswered", "peer_last_frame")


def resume_rows(s: pl.DataFrame) -> pl.DataFrame:
    """The data-bearing segments of ``s`` (after :func:`linked`) as (r_ts, r_retx): what
    :func:`first_resumes` needs of them."""
    return _rows(s, pl.col("data_like"), pl.col("ts_ns").cast(pl.Int64).alias("r_ts"),
                 ((pl.col("analysis") & an.ANY_RETRANSMISSION) != 0).alias("r_retx"))


# a silence of the whole capture: the last packet before it and the first after (times, frames)
SILENCE_SCHEMA = {"g0": pl.Int64, "g1": pl.Int64, "g0_frame": pl.Int64, "g1_frame": pl.Int64}
# a silence and the first data-bearing segment at or after its end (null when none): first_resumes
RESUME_SCHEMA = {**SILENCE_SCHEMA, "r_ts": pl.Int64, "r_retx": pl.Boolean}


def capture_silences(capture, p) -> pl.DataFrame:
    """Silences of the whole capture (no packet from anyone, ``capture.packets``) of at least
    ``capture_gap_ns``, whatever came after them (:data:`SILENCE_SCHEMA`). A server partition holds
    every one of them (base.py, PARTITION)."""
    empty = pl.DataFrame(schema=SILENCE_SCHEMA)
    try:
        pk = capture.packets.select(pl.col("ts_ns").cast(pl.Int64), pl.col("frame").cast(pl.Int64))
    except (KeyError, AttributeError, pl.exceptions.ColumnNotFoundError):
        return empty
    pk = pk.drop_nulls()
    if not pk["ts_ns"].is_sorted():  # a stable sort of sorted times changes nothing: one pass instead
        pk = pk.sort("ts_ns", maintain_order=True)
    gaps = pk.with_columns(pl.col("ts_ns").shift(1).alias("g0"), pl.col("frame").shift(1).alias("g0_frame")) \
        .filter((pl.col("ts_ns") - pl.col("g0")) >= p.capture_gap_ns) \
        .select("g0", pl.col("ts_ns").alias("g1"), "g0_frame", pl.col("frame").alias("g1_frame"))
    return gaps.cast(SILENCE_SCHEMA) if gaps.height else empty


def first_resumes(silences: pl.DataFrame, resumes: list[pl.DataFrame]) -> pl.DataFrame:
    """Each of ``silences`` with the first of ``resumes`` (:func:`resume_rows` of each batch: data-bearing
    segments as (r_ts, r_retx)) at or after its end; of segments at the same time, one that is not a
    retransmission. On a server partition these are its own segments' (:data:`RESUME_SCHEMA`);
    :func:`clean_gaps` takes the first over every partition's."""
    if silences.height == 0:  # nothing to resume from: the segments' rows are not gathered
        return pl.DataFrame(schema=RESUME_SCHEMA)
    resume = pl.concat(resumes).select(pl.col("r_ts").cast(pl.Int64), "r_retx").sort("r_ts", "r_retx")
    return silences.sort("g1").join_asof(resume, left_on="g1", right_on="r_ts", strategy="forward") \
        .cast(RESUME_SCHEMA)


def clean_gaps(resumes: pl.DataFrame) -> pl.DataFrame:
    """The silences after which traffic resumed cleanly: the first data-bearing TCP segment of the
    whole capture at or after the silence's end (the earliest of ``resumes``' rows for it, the
    :func:`first_resumes` of one or of every partition) is not a retransmission, or there is none.
    Columns g0 (last packet before), g1 (first after), g0_frame, g1_frame."""
    first = resumes.sort("r_ts", "r_retx", nulls_last=True, maintain_order=True) \
        .group_by(*SILENCE_SCHEMA, maintain_order=True).first()
    return first.filter(~pl.col("r_retx").fill_null(False)).select(*SILENCE_SCHEMA)


def holding_a_silence(eps: pl.DataFrame, silences: pl.DataFrame) -> pl.Series:
    """The connections (``conn``) with an episode of ``eps`` whose interval holds one of ``silences``
    (whatever came after it): the only ones :func:`relabel_capture_gaps` can change, and so the only
    ones whose findings depend on what the whole capture resumed with."""
    if silences.height == 0 or eps.height == 0:
        return pl.Series("conn", [], eps.schema.get("conn", pl.UInt32))
    return _held(eps, "conn", silences)["conn"].unique()


def _held(eps: pl.DataFrame, key: str, silences: pl.DataFrame) -> pl.DataFrame:
    """(``key``, start_ns, end_ns and the silence's columns) of each episode of ``eps`` whose interval
    holds one of ``silences``, with the first it holds. Silences do not overlap: of those starting at
    or after an episode's start the first ends first, so an episode holds one when it holds that one."""
    return eps.select(key, pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64)).sort("start_ns") \
        .join_asof(silences.sort("g0"), left_on="start_ns", right_on="g0", strategy="forward") \
        .filter(pl.col("g1") <= pl.col("end_ns"))


def relabel_capture_gaps(eps: pl.DataFrame, gaps: pl.DataFrame) -> pl.DataFrame:
    """Episodes that contain a clean capture-wide gap become ``capture_gap`` (cannot judge); the
    kind they had is kept in ``was_kind`` and the gap in gap_ns / gap_frames."""
    eps = eps.with_columns(pl.col("kind").alias("was_kind"), pl.lit(None, pl.Int64).alias("gap_ns"),
                           pl.lit(None, pl.List(pl.UInt32)).alias("gap_frames"))
    if gaps.height == 0 or eps.height == 0:
        return eps
    eps = eps.with_row_index("_e").sort("start_ns")
    hit = _held(eps, "_e", gaps).select(
        "_e", (pl.col("g1") - pl.col("g0")).alias("_gap"),
        pl.concat_list(pl.col("g0_frame").cast(pl.UInt32), pl.col("g1_frame").cast(pl.UInt32)).alias("_gf"))
    eps = eps.join(hit, on="_e", how="left").with_columns(
        pl.when(pl.col("_gap").is_not_null()).then(pl.lit("capture_gap")).otherwise(pl.col("kind")).alias("kind"),
        pl.col("_gap").alias("gap_ns"), pl.col("_gf").alias("gap_frames"),
        pl.when(pl.col("_gf").is_not_null()).then(pl.concat_list("frames", "_gf")).otherwise(pl.col("frames"))
        .alias("frames"))
    return eps.drop("_e", "_gap", "_gf")


def delayed_ack(s: pl.DataFrame, p, res: float) -> pl.DataFrame:
    thr = pl.max_horizontal(pl.lit(float(p.delack_min_ns)), pl.col("rtt").fill_null(0.0) * p.delack_rtts,
                            pl.lit(res))
    k = _rows(s, (pl.col("seglen") == 0) & ((pl.col("tcp_flags") & (SYN | FIN | RST)) == 0)
              & ((pl.col("tcp_flags") & ACK) != 0) & pl.col("acks_frame").is_not_null()
              & (pl.col("ack_rtt_ns") >= thr), "frame", "ts_ns", "acks_frame", thr.alias("threshold_ns"))
    if k.height == 0:
        return pl.DataFrame()
    # the acknowledged segment S, found by frame number (s is in frame order)
    pos = s["frame"].search_sorted(k["acks_frame"].cast(s["frame"].dtype), side="left").cast(pl.Int64)
    pos = pos.clip(upper_bound=s.height - 1)
    seg = s.select("_i", "frame", "conn", "from_client", "ts_ns", "next_frame", "next_ts", "next_seglen",
                   "next_analysis", "next_held", "rtt", "peer_mss", RESUME)[pos]
    j = pl.concat([k.select(pl.col("frame").alias("ack_frame"), pl.col("ts_ns").alias("ack_ts"),
                            "threshold_ns", pl.col("acks_frame").cast(pl.UInt32).alias("want")), seg],
                  how="horizontal")
    j = j.filter((pl.col("frame") == pl.col("want"))
                 & pl.col("next_frame").is_not_null()
                 & (pl.col("next_ts") >= pl.col("ack_ts"))
                 & ((pl.col("next_ts") - pl.col("ack_ts")) <= pl.col(RESUME))
                 & (pl.col("next_seglen") < pl.col("peer_mss") - p.small_segment_margin)
                 & ((pl.col("next_analysis") & (an.ANY_RETRANSMISSION | an.OUT_OF_ORDER)) == 0)
                 # nothing from the peer but that ACK between S and N: N was held, not a new request
                 & pl.col("next_held"))
    if j.height == 0:
        return pl.DataFrame()
    return j.select(
        "conn", "from_client", pl.lit("delayed_ack").alias("kind"), pl.col("ts_ns").alias("start_ns"),
        pl.col("next_ts").alias("end_ns"),
        (pl.col("next_ts") - pl.col("ts_ns") - pl.col("rtt").fill_null(0.0)).clip(lower_bound=0.0).alias("stall_ns"),
        "threshold_ns",
        pl.concat_list(pl.col("frame").cast(pl.UInt32), pl.col("ack_frame").cast(pl.UInt32),
                       pl.col("next_frame").cast(pl.UInt32)).alias("frames"),
        (pl.col("ack_ts") - pl.col("ts_ns")).alias("wait_ns"),
    )


def zero_window(s: pl.DataFrame, p, res: float) -> pl.DataFrame:
    """Zero-window episodes of each receiver; the blocked sender is the other side."""
    zw = ((pl.col("window") == 0) & ((pl.col("tcp_flags") & (SYN | FIN | RST)) == 0)).fill_null(False)
    dirs = _rows(s, zw, "dk")["dk"].unique()
    if dirs.len() == 0:
        return pl.DataFrame()
    w = _rows(s, pl.col("dk").is_in(dirs.implode()) & ((pl.col("tcp_flags") & RST) == 0),
              "dk", "_i", "conn", "from_client", "frame", "ts_ns", "window", "tcp_flags", "rtt", "last_ts_ns",
              RESUME).sort("dk", "_i")
    same = (pl.col("dk") == pl.col("dk").shift(1)).fill_null(False)
    w = w.with_columns(zw.alias("zw")).with_columns(
        pl.when(same).then(pl.col("zw").shift(1)).otherwise(False).fill_null(False).alias("prev_zw"))
    w = w.with_columns((pl.col("zw") & ~pl.col("prev_zw")).cum_sum().alias("ep"))
    eps = w.filter(pl.col("zw") | pl.col("prev_zw")).group_by("conn", "from_client", "ep").agg(
        pl.col("ts_ns").filter(pl.col("zw")).min().alias("start_ns"),
        pl.col("frame").filter(pl.col("zw")).min().alias("zw_frame"),
        pl.col("ts_ns").filter(~pl.col("zw")).min().alias("open_ts"),
        pl.col("frame").filter(~pl.col("zw")).min().alias("open_frame"),
        pl.col("rtt").first(), pl.col("last_ts_ns").first(), pl.col(RESUME).first(),
    ).filter(pl.col("start_ns").is_not_null())
    eps = eps.with_columns(
        (~pl.col("from_client")).alias("sender"),
        pl.coalesce("open_ts", "last_ts_ns").alias("end_ns"),
        pl.max_horizontal(pl.lit(float(p.window_min_ns)), pl.col("rtt").fill_null(0.0) * p.window_rtts,
                          pl.lit(res)).alias("threshold_ns"),
    ).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("closed_ns"))
    eps = eps.filter(pl.col("closed_ns") >= pl.col("threshold_ns"))
    if eps.height == 0:
        return pl.DataFrame()
    # the sender's probes while closed, and its first data after the reopening
    dd = _rows(s, (pl.col("seglen") > 0) & pl.col("conn").is_in(eps["conn"].unique().implode()),
               "conn", "from_client", "ts_ns", "frame", "analysis")
    probes = dd.filter((pl.col("analysis") & an.ZERO_WINDOW_PROBE) != 0).select(
        "conn", pl.col("from_client").alias("sender"), pl.col("ts_ns").alias("probe_ts"),
        pl.col("frame").alias("probe_frame"))
    pj = eps.select("conn", "sender", "ep", "start_ns", "end_ns").join(probes, on=["conn", "sender"]).filter(
        pl.col("probe_ts").is_between(pl.col("start_ns"), pl.col("end_ns"))).group_by("ep").agg(
        pl.col("probe_frame").cast(pl.UInt32).alias("probe_frames"))
    sent = dd.filter((pl.col("analysis") & an.ZERO_WINDOW_PROBE) == 0).select(
        "conn", pl.col("from_client").alias("sender"), pl.col("ts_ns").alias("next_ts"),
        pl.col("frame").alias("next_frame")).sort("next_ts", "next_frame")
    eps = eps.sort("end_ns").join_asof(sent, left_on="end_ns", right_on="next_ts", by=["conn", "sender"],
                                       strategy="forward", check_sortedness=False)
    eps = eps.join(pj, on="ep", how="left").with_columns(
        pl.col("probe_frames").fill_null(pl.lit([], pl.List(pl.UInt32))))
    blocked = (pl.col("probe_frames").list.len() > 0) | (
        pl.col("open_ts").is_not_null() & ((pl.col("next_ts") - pl.col("open_ts")) <= pl.col(RESUME)))
    eps = eps.filter(blocked.fill_null(False))
    if eps.height == 0:
        return pl.DataFrame()
    return eps.select(
        "conn", pl.col("sender").alias("from_client"), pl.lit("zero_window").alias("kind"), "start_ns", "end_ns",
        pl.col("closed_ns").cast(pl.Float64).alias("stall_ns"), "threshold_ns",
        pl.concat_list(pl.col("zw_frame").cast(pl.UInt32), pl.col("probe_frames").list.head(ZERO_WINDOW_PROBE_EVIDENCE),
                       pl.col("open_frame").cast(pl.UInt32), pl.col("next_frame").cast(pl.UInt32))
        .list.drop_nulls().alias("frames"),
        pl.col("probe_frames").list.len().alias("probes"), pl.col("open_ts").is_null().alias("never_reopened"),
    )


def window_full(s: pl.DataFrame, zw: pl.DataFrame, p, res: float) -> pl.DataFrame:
    thr = pl.max_horizontal(pl.lit(float(p.window_min_ns)), pl.col("rtt").fill_null(0.0) * p.window_rtts,
                            pl.lit(res))
    wf = _rows(s, ((pl.col("analysis") & an.WINDOW_FULL) != 0) & (pl.col("seglen") > 0)
               & pl.col("next_ts").is_not_null(),
               "conn", "from_client", "frame", "ts_ns", "next_ts", "next_frame", "rtt", RESUME)
    if wf.height == 0:
        return pl.DataFrame()
    wf = wf.with_columns(thr.alias("threshold_ns"), (pl.col("next_ts") - pl.col("ts_ns")).alias("wait_ns")) \
        .filter(pl.col("wait_ns") >= pl.col("threshold_ns"))
    if wf.height == 0:
        return pl.DataFrame()
    # the receiver's last segment before the sender resumed: it reopened the window
    other = _rows(s, pl.col("conn").is_in(wf["conn"].unique().implode()),
        "conn", (~pl.col("from_client")).alias("from_client"), pl.col("ts_ns").alias("en_ts"),
        pl.col("frame").alias("en_frame")).sort("en_ts", "en_frame")
    wf = wf.sort("next_ts").join_asof(other, left_on="next_ts", right_on="en_ts", by=["conn", "from_client"],
                                      strategy="backward", check_sortedness=False)
    wf = wf.filter((pl.col("en_ts") >= pl.col("ts_ns")) & ((pl.col("next_ts") - pl.col("en_ts")) <= pl.col(RESUME)))
    if zw.height and wf.height:
        z = zw.select("conn", pl.col("from_client").alias("zf"), pl.col("start_ns").alias("zs"),
                      pl.col("end_ns").alias("ze"))
        inside = wf.select("conn", "frame", "from_client", "ts_ns", "next_ts").join(z, on="conn").filter(
            (pl.col("zf") == pl.col("from_client")) & (pl.col("zs") <= pl.col("next_ts"))
            & (pl.col("ze") >= pl.col("ts_ns"))).select("conn", "frame").unique()
        wf = wf.join(inside, on=["conn", "frame"], how="anti")
    if wf.height == 0:
        return pl.DataFrame()
    return wf.select(
        "conn", "from_client", pl.lit("window_full").alias("kind"), pl.col("ts_ns").alias("start_ns"),
        pl.col("next_ts").alias("end_ns"),
        (pl.col("wait_ns") - pl.col("rtt").fill_null(0.0)).clip(lower_bound=0.0).alias("stall_ns"), "threshold_ns",
        pl.concat_list(pl.col("frame").cast(pl.UInt32), pl.col("en_frame").cast(pl.UInt32),
                       pl.col("next_frame").cast(pl.UInt32)).list.drop_nulls().alias("frames"),
        "wait_ns",
    )
