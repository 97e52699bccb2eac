"""The measurements of detectors/saturation.py: its requests, its sliding windows, the knee per service.

Columns throughout (Polars; the window sums in Numba, detectors/saturation_kernel.py), never a
Python object per request or window. The proof chart (dashboards/proofs/saturation.py) calls
:func:`requests`, :func:`windows` and :func:`classify` so that it draws what the detector decided. Not a
detector (no ``NAME``)."""
from __future__ import annotations

import numpy as np
import polars as pl

from . import saturation_kernel, tcp_turns
from .base import client_identity_by, endpoint_expr, optional_frame

KEY = ["protocol", "server", "server_port", "operation"]
COLUMNS = {"protocol": pl.String, "server": pl.String, "server_port": pl.Int32, "operation": pl.String,
           "client": pl.String, "client_port": pl.Int32, "s": pl.Int64, "e": pl.Int64, "answered": pl.Boolean,
           "request_frame": pl.UInt32, "response_frame": pl.UInt32, "retries": pl.Int64}


def _from_transactions(tx: pl.DataFrame) -> pl.DataFrame:
    keep = pl.col("request_ts_ns").is_not_null() & pl.col("server").is_not_null()
    if "expects_response" in tx.columns:
        keep &= pl.col("expects_response").fill_null(True)
    if "pending_by_design" in tx.columns:
        keep &= ~pl.col("pending_by_design").fill_null(False)
    if "retries" in tx.columns:
        retries = pl.col("retries").cast(pl.Int64).fill_null(0)
    elif "retransmission" in tx.columns:
        retries = pl.col("retransmission").cast(pl.Int64).fill_null(0)
    else:
        retries = pl.lit(0, pl.Int64)
    answered = pl.col("answered").fill_null(False) & pl.col("response_ts_ns").is_not_null()
    return tx.filter(keep).select(
        pl.col("protocol").cast(pl.String), pl.col("server").cast(pl.String), pl.col("server_port").cast(pl.Int32),
        pl.col("operation").cast(pl.String).fill_null("?"), pl.col("client").cast(pl.String),
        pl.col("client_port").cast(pl.Int32), pl.col("request_ts_ns").cast(pl.Int64).alias("s"),
        pl.when(answered).then(pl.col("response_ts_ns")).cast(pl.Int64).alias("e"), answered.alias("answered"),
        pl.col("request_frame").cast(pl.UInt32), pl.col("response_frame").cast(pl.UInt32), retries.alias("retries"))


def _covered(frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """TCP connections a decoder already turned into transactions."""
    parts = [f.filter(pl.col("transport").cast(pl.String) == "tcp").select(pl.col("flow").cast(pl.UInt32).alias("conn"))
             for f in frames.values() if "flow" in f.columns and "transport" in f.columns]
    return pl.concat(parts).unique() if parts else pl.DataFrame(schema={"conn": pl.UInt32})


def _from_turns(capture, covered: pl.DataFrame) -> pl.DataFrame | None:
    conns = optional_frame(capture, "connections", nonempty=True)
    seg = optional_frame(capture, "tcp_segments", nonempty=True)
    if conns is None or seg is None:
        return None
    c = conns.filter((pl.col("client_packets") > 0) & (pl.col("server_packets") > 0)).select(
        pl.col("conn").cast(pl.UInt32), pl.col("client").cast(pl.String), pl.col("client_port").cast(pl.Int32),
        pl.col("server").cast(pl.String), pl.col("server_port").cast(pl.Int32)).join(covered, on="conn", how="anti")
    if c.height == 0:
        return None
    t = tcp_turns.turns(seg, c)
    if t.height == 0:
        return None
    return t.join(c, on="conn").select(
        pl.lit("tcp").alias("protocol"), "server", "server_port", pl.lit("turn").alias("operation"), "client",
        "client_port", pl.col("request_ts_ns").alias("s"), pl.col("response_ts_ns").alias("e"),
        pl.col("response_ts_ns").is_not_null().alias("answered"), "request_frame", "response_frame",
        pl.col("retransmitted").cast(pl.Int64).alias("retries"))


def requests(capture, frames: dict[str, pl.DataFrame], p) -> pl.DataFrame:
    """Every request the capture shows (COLUMNS): the transactions of ``frames``, then the TCP turns of
    the connections none of them covers; with ``resource`` ("server:port operation")."""
    parts = [_from_transactions(f) for f in frames.values() if "request_ts_ns" in f.columns]
    turns = _from_turns(capture, _covered(frames))
    if turns is not None:
        parts.append(turns)
    parts = [x.select(pl.col(n).cast(t) for n, t in COLUMNS.items()) for x in parts if x.height]
    if not parts:
        return pl.DataFrame(schema={**COLUMNS, "resource": pl.String})
    out = pl.concat(parts).filter(pl.col("e").is_null() | (pl.col("e") >= pl.col("s")))
    return out.with_columns(pl.format("{} {}", endpoint_expr(pl.col("server"), pl.col("server_port")),
                                      pl.col("operation")).alias("resource"))


def _by_group(frame: pl.DataFrame, t: str) -> pl.DataFrame:
    """``frame`` sorted by group ``g``, then ``t``: by one integer key (g, then t, packed) where both are
    non-negative and fit in it, a third of the cost of sorting by two columns. Rows equal in both keep no
    particular order (every sum over a window is the same whatever their order)."""
    if frame.height and frame[t].min() >= 0 and frame["g"].min() >= 0:
        span = int(frame[t].max()) + 1
        if (int(frame["g"].max()) + 1) * span < 2 ** 62:
            return frame[(frame["g"].cast(pl.Int64) * span + frame[t].cast(pl.Int64)).arg_sort()]
    return frame.sort("g", t)


def _starts(x: pl.DataFrame, step: int, window: int) -> pl.DataFrame:
    """Per group ``g`` and window ``k`` (covering [k step, k step + window) of ``s_rel``) with a request sent
    in it: arrivals, retries, lat_median and lat_mean (null: none of them answered). ``x``: the requests
    sorted by g, then s_rel."""
    g, k, lo, hi = saturation_kernel.windows_holding(x["g"].cast(pl.Int64).to_numpy(), x["s_rel"].to_numpy(),
                                                     step, window)
    lat = x["lat"]
    rsum, med, mean = saturation_kernel.send_sums(lo, hi, x["retries"].fill_null(0).to_numpy(),
                                                  lat.fill_null(0).cast(pl.Float64).to_numpy(),
                                                  lat.is_not_null().to_numpy())
    return pl.DataFrame({"g": pl.Series(g).cast(x.schema["g"]), "k": pl.Series(k, dtype=pl.Int64),
                         "arrivals": pl.Series(hi - lo).cast(pl.UInt32), "retries": rsum,
                         "lat_median": pl.Series(med).fill_nan(None), "lat_mean": pl.Series(mean).fill_nan(None)})


def _ends(x: pl.DataFrame, step: int, window: int) -> pl.DataFrame:
    """Per group ``g`` and window ``k`` with an answer in it (``e_rel``): completions. ``x``: the answered
    requests sorted by g, then e_rel."""
    g, k, lo, hi = saturation_kernel.windows_holding(x["g"].cast(pl.Int64).to_numpy(), x["e_rel"].to_numpy(),
                                                     step, window)
    return pl.DataFrame({"g": pl.Series(g).cast(x.schema["g"]), "k": pl.Series(k, dtype=pl.Int64),
                         "completions": pl.Series(hi - lo).cast(pl.UInt32)})


def windows(req: pl.DataFrame, window: int, p) -> pl.DataFrame:
    """Per group ``g`` (a column of ``req``) and window ``k``: a, b (window bounds, ns), arrivals, retries,
    completions, lat_median, lat_mean (ns, of the requests sent in it), L (mean outstanding), X
    (completions/s), offered (requests/s)."""
    step = max(1, window // max(1, p.window_overlap))
    r = req.with_columns(pl.col("s").min().over("g").alias("t0")).with_columns(
        (pl.col("s") - pl.col("t0")).alias("s_rel"),
        (pl.coalesce("e", pl.col("s") + p.unanswered_ns) - pl.col("t0")).alias("e_rel"),
        (pl.col("e") - pl.col("s")).alias("lat"))
    sent = _by_group(r.select("g", "s_rel", "retries", "lat"), "s_rel")
    ended = _by_group(r.select("g", "e_rel", "answered"), "e_rel")
    starts, ends = _starts(sent, step, window), _ends(ended.filter(pl.col("answered")), step, window)
    w = starts.join(ends, on=["g", "k"], how="full", coalesce=True).with_columns(
        pl.col("arrivals").fill_null(0), pl.col("retries").fill_null(0), pl.col("completions").fill_null(0))
    t0 = r.group_by("g").agg(pl.col("t0").first())
    w = w.join(t0, on="g").with_columns((pl.col("k") * step).alias("a_rel")).sort("g", "k")
    # the time integral of the outstanding count over each window (sent minus ended, from the group's start)
    a = w["a_rel"].to_numpy().astype(np.float64)
    area = saturation_kernel.outstanding_area(
        sent["g"].cast(pl.Int64).to_numpy(), sent["s_rel"].cast(pl.Float64).to_numpy(),
        ended["g"].cast(pl.Int64).to_numpy(), ended["e_rel"].cast(pl.Float64).to_numpy(),
        w["g"].cast(pl.Int64).to_numpy(), a, a + window)
    L = area / window
    sec = window / 1e9
    return w.with_columns(pl.Series("L", L, dtype=pl.Float64)).with_columns(
        (pl.col("t0") + pl.col("a_rel")).alias("a"), (pl.col("t0") + pl.col("a_rel") + window).alias("b"),
        (pl.col("completions") / sec).alias("X"), (pl.col("arrivals") / sec).alias("offered")).drop("t0", "a_rel")


def classify(win: pl.DataFrame, p) -> pl.DataFrame:
    """The windows with the knee's decisions: valid, capacity, knee_l, base, past (and among those,
    plateau and collapse), per window and group ``g``."""
    valid = (pl.col("completions") >= p.min_completions_per_window) & (pl.col("arrivals") >= p.min_completions_per_window)
    w = win.with_columns(valid.alias("valid"))
    w = w.with_columns(pl.col("X").filter(pl.col("valid")).quantile(p.cap_quantile).over("g").alias("capacity"))
    w = w.with_columns(pl.col("L").filter(pl.col("valid") & (pl.col("X") >= p.knee_share * pl.col("capacity")))
                       .min().over("g").alias("knee_l"))
    w = w.with_columns(
        (pl.col("valid") & (pl.col("L") < p.concurrency_growth * pl.col("knee_l"))).fill_null(False).alias("base"),
        (pl.col("valid") & (pl.col("L") >= p.concurrency_growth * pl.col("knee_l"))).fill_null(False).alias("past"))
    return w.with_columns(
        (pl.col("past") & (pl.col("X") >= p.plateau_share * pl.col("capacity"))).fill_null(False).alias("plateau"),
        (pl.col("past") & (pl.col("X") <= p.collapse_share * pl.col("capacity"))).fill_null(False).alias("collapse"))


def knees(win: pl.DataFrame, req: pl.DataFrame, p, qualifies: pl.Expr | None = None) -> pl.DataFrame:
    """Per group: the knee and what lies past it (one row per group with a past window; with
    ``qualifies``, an expression of these columns, only the groups it holds for: the evidence of
    the others is not gathered)."""
    w = classify(win, p)
    past, base, col = pl.col("past"), pl.col("base"), pl.col("collapse")
    mean_ok = pl.col("valid") & (pl.col("lat_mean") > 0) & (pl.col("X") > 0)
    g = w.group_by("g").agg(
        pl.col("capacity").first(), pl.col("knee_l").first(),
        base.sum().alias("n_base"), past.sum().alias("n_past"), col.sum().alias("n_collapse"),
        pl.col("lat_median").filter(base).median().alias("base_w"),
        pl.col("lat_median").filter(past).median().alias("past_w"),
        pl.col("L").filter(past).median().alias("past_l"), pl.col("L").filter(past).max().alias("max_l"),
        pl.col("X").filter(past).median().alias("past_x"),
        pl.col("plateau").sum().alias("n_plateau"),
        pl.col("X").filter(col).min().alias("min_x"), pl.col("offered").filter(col).median().alias("collapse_offered"),
        (pl.col("retries").filter(past).sum() / pl.col("arrivals").filter(past).sum()).alias("retry_share"),
        (pl.col("retries").filter(base).sum() / pl.col("arrivals").filter(base).sum()).alias("retry_share_base"),
        (pl.col("L") / (pl.col("X") * pl.col("lat_mean") / 1e9)).filter(mean_ok).median().alias("little"),
        pl.col("a").filter(past).min().alias("start_ns"),
        pl.col("b").filter(past).max().alias("end_ns"),
        pl.col("k").filter(past).sort_by(pl.col("L").filter(past), descending=True).first().alias("worst_k"),
    ).filter(pl.col("n_past") > 0)
    if g.height == 0:
        return g
    g = g.with_columns((pl.col("past_w") / pl.col("base_w").clip(lower_bound=1)).alias("factor"))
    if qualifies is not None:
        g = g.filter(qualifies)
        if g.height == 0:
            return g
    keys = req.group_by("g").agg(*[pl.col(c).first() for c in KEY], pl.col("resource").first())
    # evidence: the requests sent in the worst window past the knee (the most outstanding)
    worst = w.join(g.select("g", "worst_k"), left_on=["g", "k"], right_on=["g", "worst_k"]).select("g", "a", "b")
    ev = req.select("g", "s", "request_frame", "response_frame").join(worst, on="g").filter(
        pl.col("s").is_between(pl.col("a"), pl.col("b"), closed="left")).group_by("g").agg(
        pl.concat([pl.col("request_frame"), pl.col("response_frame")]).drop_nulls().unique().sort()
        .alias("evidence_frames"))
    return g.join(keys, on="g").join(ev, on="g", how="left").with_columns(
        pl.col("evidence_frames").fill_null([]))


def clients_past(summ: pl.DataFrame, req: pl.DataFrame, p) -> pl.DataFrame:
    """Per group: clients with requests sent in the period past the knee, one client's largest share of
    the outstanding time there, and how clients were told apart (``base.client_identity_by``)."""
    per = req.join(summ.select("g", "start_ns", "end_ns"), on="g").filter(
        pl.col("s").is_between(pl.col("start_ns"), pl.col("end_ns")))
    per = client_identity_by(per.with_columns(pl.col("s").alias("request_ts_ns"), pl.col("e").alias("response_ts_ns")),
                             ["g"], timeout_ns=p.unanswered_ns)
    held = per.with_columns((pl.coalesce("e", pl.col("s") + p.unanswered_ns) - pl.col("s")).alias("_held"))
    by = held.group_by("g", "client_id").agg(pl.col("_held").sum())
    agg = by.group_by("g").agg(pl.len().alias("clients"), (pl.col("_held").max() / pl.col("_held").sum().clip(
        lower_bound=1)).alias("top_client_share"))
    ident = per.group_by("g").agg(pl.col("client_identity").sort().last())
    return summ.join(agg, on="g", how="left").join(ident, on="g", how="left").with_columns(
        pl.col("clients").fill_null(0), pl.col("client_identity").fill_null("address"))


# what smb2_credits reads of smb2_messages
SMB2_CREDIT_COLUMNS = ("kind", "from_client", "src", "dst", "ts_first_ns", "is_response", "credit_request",
                       "credit_grant")


def smb2_credits(capture, summ: pl.DataFrame) -> pl.DataFrame:
    """``credit_text`` for SMB2 groups: credits the server granted against those its clients requested
    past the knee and before it (MS-SMB2 3.3.1.2), from ``smb2_messages``."""
    summ = summ.with_columns(pl.lit(None, pl.String).alias("credit_text"))
    if not summ.filter(pl.col("protocol") == "smb2").height:
        return summ
    msgs = optional_frame(capture, "smb2_messages", nonempty=True)
    if msgs is None or "credit_request" not in msgs.columns:
        return summ
    m = msgs.filter(pl.col("kind").cast(pl.String) == "smb2").select(
        pl.when(pl.col("from_client")).then(pl.col("dst")).otherwise(pl.col("src")).cast(pl.String).alias("server"),
        "ts_first_ns", "is_response", pl.col("credit_request").cast(pl.Int64), pl.col("credit_grant").cast(pl.Int64))
    j = m.join(summ.filter(pl.col("protocol") == "smb2").select("g", "server", "start_ns", "end_ns"), on="server")
    in_past = pl.col("ts_first_ns").is_between(pl.col("start_ns"), pl.col("end_ns"))
    before = pl.col("ts_first_ns") < pl.col("start_ns")
    req, resp = ~pl.col("is_response"), pl.col("is_response")
    c = j.group_by("g").agg(
        pl.col("credit_request").filter(req & in_past).sum().alias("rq"),
        pl.col("credit_grant").filter(resp & in_past).sum().alias("gr"),
        pl.col("credit_request").filter(req & before).sum().alias("rq0"),
        pl.col("credit_grant").filter(resp & before).sum().alias("gr0"))
    text = pl.format("SMB2 credits past the knee: {} granted for {} requested ({} before it: {} for {})",
                     pl.col("gr"), pl.col("rq"), pl.lit("and"), pl.col("gr0"), pl.col("rq0"))
    c = c.filter(pl.col("rq") > 0).select("g", text.alias("_ct"))
    return summ.join(c, on="g", how="left").with_columns(pl.coalesce("_ct", "credit_text").alias("credit_text")).drop("_ct")
