"""NFSv4.1 session slot use for detectors/saturation.py: were the sessions' slot tables full past the knee?

An NFSv4.1 client sends every request on a slot of its session (RFC 8881 §2.10.6.1): one request per
slot at a time, so a session with N slots has at most N requests outstanding; a request that finds
every slot busy waits in the client, where the capture cannot see it. The server says how many slots
it accepts in every SEQUENCE reply: ``sr_highest_slotid`` (the highest slot it will accept now) and
``sr_target_highest_slotid`` (the highest it wants used, §18.46.3: lowered to throttle a client).

From ``nfs_messages``' SEQUENCE rows (the call's sessionid, slotid, send time; its reply, paired by
``call_frame``, with the server's highest_slotid and, when the decoder gives it,
``target_highest_slotid``), per session over a finding's period past the knee:
- the most requests outstanding at once (slots in use: a slot carries one request at a time) and the
  distinct slotids used;
- the slots the server accepts (its highest_slotid + 1, the lowest it said in the period) and the
  target it asked for;
- the share of its time in the period (first request to last answer: a session that joined late counts
  from when it joined) during which every accepted slot was busy.

A session is slot-bound when every accepted slot was busy for ``slot_full_share`` of the period or more;
when at least ``slot_bound_sessions_share`` of the sessions were, the slot tables
were exhausted: what reached the server was capped at sessions x slots and the clients' further
requests waited on their side, unseen (the queue is longer than the capture shows; a server that
lowered its target was throttling through the slots). Otherwise the slots were never the limit (at most
M of N in use): the server's own capacity was. Not a detector (no ``NAME``): a helper the saturation
finding calls when its protocol is NFS and SEQUENCE rows are visible. Columns throughout.
"""
from __future__ import annotations

import polars as pl

from .base import optional_frame

_EMPTY_TEXT = pl.lit(None, pl.String)


# what sequence_calls reads of nfs_messages
SEQUENCE_COLUMNS = ("operation", "msg_type", "sessionid", "slotid", "highest_slotid", "target_highest_slotid",
                    "call_frame", "ts_first_ns", "ts_last_ns", "dst", "dport", "frame_last", "is_callback")


def sequence_calls(msgs: pl.DataFrame) -> pl.DataFrame:
    """One row per answered fore-channel SEQUENCE call: server, server_port, sessionid, slotid, s, e (ns),
    server_highest (the reply's highest_slotid), server_target (its target_highest_slotid, null when the
    decoder does not give it)."""
    need = set(SEQUENCE_COLUMNS) - {"target_highest_slotid", "is_callback"}  # those two may be absent
    if not need <= set(msgs.columns):
        return pl.DataFrame()
    seq = msgs.filter(pl.col("operation").cast(pl.String) == "SEQUENCE")
    if "is_callback" in seq.columns:
        seq = seq.filter(~pl.col("is_callback").fill_null(False))
    kind = pl.col("msg_type").cast(pl.String)
    calls = seq.filter((kind == "CALL") & pl.col("sessionid").is_not_null() & pl.col("slotid").is_not_null()).select(
        pl.col("frame_last").cast(pl.Int64).alias("cf"), pl.col("dst").cast(pl.String).alias("server"),
        pl.col("dport").cast(pl.Int32).alias("server_port"), pl.col("sessionid").cast(pl.String),
        pl.col("slotid").cast(pl.Int64), pl.col("ts_first_ns").cast(pl.Int64).alias("s"))
    target = (pl.col("target_highest_slotid").cast(pl.Int64) if "target_highest_slotid" in seq.columns
              else pl.lit(None, pl.Int64))
    replies = seq.filter((kind == "REPLY") & pl.col("call_frame").is_not_null()).select(
        pl.col("call_frame").cast(pl.Int64).alias("cf"), pl.col("ts_last_ns").cast(pl.Int64).alias("e"),
        pl.col("highest_slotid").cast(pl.Int64).alias("server_highest"), target.alias("server_target"))
    return calls.join(replies.unique("cf", keep="first"), on="cf", how="inner").filter(pl.col("e") >= pl.col("s"))


def session_use(calls: pl.DataFrame, periods: pl.DataFrame) -> pl.DataFrame:
    """Per group ``g`` of PERIODS (g, server, server_port, start_ns, end_ns) and session: max_in_use (the
    most calls outstanding at once), distinct_slots, accepted (the server's lowest highest_slotid + 1),
    target (its lowest target_highest_slotid + 1), full_share (share of the period with every accepted
    slot busy, of the time from the session's first request in the period to its last answer)."""
    j = calls.join(periods, on=["server", "server_port"]).filter(
        (pl.col("s") < pl.col("end_ns")) & (pl.col("e") > pl.col("start_ns")))
    if j.height == 0:
        return pl.DataFrame()
    j = j.with_columns(pl.max_horizontal("s", "start_ns").alias("s"), pl.min_horizontal("e", "end_ns").alias("e"))
    per = j.group_by("g", "sessionid").agg(
        pl.col("slotid").n_unique().alias("distinct_slots"), (pl.col("server_highest").min() + 1).alias("accepted"),
        (pl.col("server_target").min() + 1).alias("target"), pl.col("s").min().alias("first_ns"),
        pl.col("e").max().alias("last_ns"))
    # the outstanding count as a step function: +1 at each send, -1 at each reply, summed in time order
    ev = pl.concat([j.select("g", "sessionid", pl.col("s").alias("t"), pl.lit(1, pl.Int64).alias("d")),
                    j.select("g", "sessionid", pl.col("e").alias("t"), pl.lit(-1, pl.Int64).alias("d"))])
    ev = ev.sort("g", "sessionid", "t", "d").with_columns(
        pl.col("d").cum_sum().over("g", "sessionid").alias("n"),
        (pl.col("t").shift(-1).over("g", "sessionid") - pl.col("t")).fill_null(0).alias("dt"))
    ev = ev.join(per.select("g", "sessionid", "accepted"), on=["g", "sessionid"])
    busy = ev.group_by("g", "sessionid").agg(
        pl.col("n").max().alias("max_in_use"),
        pl.col("dt").filter(pl.col("n") >= pl.col("accepted")).sum().alias("full_ns"))
    return per.join(busy, on=["g", "sessionid"]).with_columns(
        (pl.col("full_ns") / (pl.col("last_ns") - pl.col("first_ns")).clip(lower_bound=1)).alias("full_share"))


def _text(full_share: float, sessions_share: float) -> pl.Expr:
    """The words: exhausted (enough sessions slot-bound), reached at times, or never reached."""
    sessions, full, n = pl.col("sessions"), pl.col("sessions_full"), pl.col("accepted_max")
    head = pl.lit("NFSv4.1 session slots (RFC 8881 §2.10.6.1) past the knee: ")
    share = (pl.col("full_share_median") * 100).round(0).cast(pl.Int64)
    lowered = pl.col("target_min").is_not_null() & (pl.col("target_min") < n)
    exhausted = pl.format(
        "{} of the {} sessions kept all {} of their slots busy (the server's highest_slotid {}) for {}% of the "
        "time (median session): the slot tables were exhausted, so what reached the server was capped at sessions "
        "x slots and the clients' further requests waited on their side, unseen (the queue is longer than the "
        "capture shows)", full, sessions, n, n - 1, share)
    throttled = pl.format("; the server lowered its target_highest_slotid to {} (RFC 8881 §18.46.3): it was "
                          "throttling its clients through the slots", pl.col("target_min") - 1)
    at_times = pl.format(
        "{} of the {} sessions had all {} of their slots (the server's highest_slotid {}) busy at times, but for "
        "only {}% of the time (median session): the queue was mostly at the server, its own capacity the limit "
        "(while a session's slots were full its further requests waited on the client's side, unseen)",
        pl.col("sessions_reached"), sessions, n, n - 1, share)
    spare = pl.format(
        "never exhausted: at most {} of {} slots in use in any of the {} sessions (the server's highest_slotid "
        "{}): the server's own capacity was the limit, not the slot tables", pl.col("max_in_use"), n, sessions,
        n - 1)
    body = (pl.when(full >= sessions_share * sessions)
            .then(pl.concat_str([exhausted, pl.when(lowered).then(throttled).otherwise(pl.lit(""))]))
            .when(pl.col("max_in_use") >= n).then(at_times)
            .otherwise(spare))
    return pl.concat_str([head, body])


def slot_use(capture, summ: pl.DataFrame, p) -> pl.DataFrame:
    """``slot_text`` (and slot_sessions, slot_max_in_use, slot_accepted, slot_sessions_full) for NFS groups
    of SUMM (g, protocol, server, server_port, start_ns, end_ns) from ``nfs_messages``' SEQUENCE rows;
    null where the protocol is not NFS or no session is visible."""
    out = summ.with_columns(_EMPTY_TEXT.alias("slot_text"), pl.lit(None, pl.Int64).alias("slot_sessions"),
                            pl.lit(None, pl.Int64).alias("slot_max_in_use"),
                            pl.lit(None, pl.Int64).alias("slot_accepted"),
                            pl.lit(None, pl.Int64).alias("slot_sessions_full"))
    nfs = summ.filter(pl.col("protocol") == "nfs")
    if nfs.height == 0:
        return out
    msgs = optional_frame(capture, "nfs_messages", nonempty=True)
    if msgs is None:
        return out
    calls = sequence_calls(msgs)
    if calls.height == 0:
        return out
    periods = nfs.select("g", pl.col("server").cast(pl.String), pl.col("server_port").cast(pl.Int32),
                         pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64))
    use = session_use(calls, periods)
    if use.height == 0:
        return out
    full = (pl.col("full_share") >= p.slot_full_share) & pl.col("accepted").is_not_null()
    agg = use.group_by("g").agg(
        pl.len().alias("sessions"), full.sum().alias("sessions_full"), pl.col("max_in_use").max(),
        (pl.col("max_in_use") >= pl.col("accepted")).sum().alias("sessions_reached"),
        pl.col("full_share").median().alias("full_share_median"),
        pl.col("accepted").max().alias("accepted_max"), pl.col("target").min().alias("target_min"))
    agg = agg.with_columns(_text(p.slot_full_share, p.slot_bound_sessions_share).alias("_st"))
    return out.join(agg.select("g", "_st", "sessions", "max_in_use", "accepted_max", "sessions_full"), on="g",
                    how="left").with_columns(
        pl.coalesce("_st", "slot_text").alias("slot_text"), pl.col("sessions").cast(pl.Int64).alias("slot_sessions"),
        pl.col("max_in_use").cast(pl.Int64).alias("slot_max_in_use"),
        pl.col("accepted_max").cast(pl.Int64).alias("slot_accepted"),
        pl.col("sessions_full").cast(pl.Int64).alias("slot_sessions_full")).drop(
        "_st", "sessions", "max_in_use", "accepted_max", "sessions_full")


def in_use_over_time(capture, server: str, server_port: int) -> pl.DataFrame:
    """For the proof chart: per session of SERVER:SERVER_PORT, the slots in use as a step function (t ns,
    sessionid, in_use after t) and the slots the server accepted at the time (``accepted``: the highest_slotid
    + 1 of the latest reply); empty when no SEQUENCE is visible."""
    msgs = optional_frame(capture, "nfs_messages", nonempty=True)
    if msgs is None:
        return pl.DataFrame()
    calls = sequence_calls(msgs)
    if calls.height == 0:
        return pl.DataFrame()
    c = calls.filter((pl.col("server") == server) & (pl.col("server_port") == server_port))
    if c.height == 0:
        return pl.DataFrame()
    ev = pl.concat([c.select("sessionid", pl.col("s").alias("t"), pl.lit(1, pl.Int64).alias("d"),
                             pl.lit(None, pl.Int64).alias("accepted")),
                    c.select("sessionid", pl.col("e").alias("t"), pl.lit(-1, pl.Int64).alias("d"),
                             (pl.col("server_highest") + 1).alias("accepted"))])
    return ev.sort("sessionid", "t", "d").with_columns(
        pl.col("d").cum_sum().over("sessionid").alias("in_use"),
        pl.col("accepted").forward_fill().over("sessionid")).select("t", "sessionid", "in_use", "accepted")
