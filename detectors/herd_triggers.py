"""The triggers herd names when the capture shows them (see detectors/herd.py "Reported"): a DNS TTL
expiring at the herd (RFC 1035 §3.2.1, RFC 2181 §8: TTLs are whole seconds) and a run of failures of the
key just before it. ``params`` is herd's ``Params``."""
from __future__ import annotations

import polars as pl

S = 1_000_000_000


def ttl_trigger(req: pl.DataFrame, eps: pl.DataFrame, params) -> pl.DataFrame:
    """Per DNS episode: ttl_s (the TTL whose expiry triggered it) and ttl_share (share of the herd's
    clients whose own latest answer expired at their re-query), null when no TTL explains it."""
    answers = req.lazy().filter(  # lazy: only the selected columns are filtered
        pl.col("ttl").is_not_null() & pl.col("answered") & pl.col("response_ts_ns").is_not_null()
        & pl.col("key").is_in(eps["key"].implode())
    ).select("key", "client_id", pl.col("response_ts_ns").alias("ans_ts"), "ttl").collect()
    out_schema = {"seg": pl.Int64, "ttl_s": pl.Int64, "ttl_share": pl.Float64}
    if answers.height == 0 or eps.height == 0:
        return pl.DataFrame(schema=out_schema)
    tol = int(params.ttl_tolerance_ns)
    # the herd's arrivals: each client's first request of the key in the episode
    herd = (req.lazy().filter(pl.col("counts")).select("key", "client_id", "request_ts_ns").collect()
            .join(eps.select("seg", "key", "start_ns", "end_ns"), on="key", how="inner")
            .filter(pl.col("request_ts_ns").is_between(pl.col("start_ns"), pl.col("end_ns")))
            .group_by("seg", "key", "client_id").agg(pl.col("request_ts_ns").min()))
    mine = (herd.sort("request_ts_ns")
            .join_asof(answers.sort("ans_ts", "ttl"), left_on="request_ts_ns", right_on="ans_ts", by=["key", "client_id"],
                       strategy="backward", allow_exact_matches=False, check_sortedness=False)
            .with_columns((pl.col("ans_ts") + pl.col("ttl") * S).alias("expiry"))
            .with_columns(pl.col("request_ts_ns").is_between(pl.col("expiry") - tol, pl.col("expiry") + S + tol)
                          .alias("hit")))
    per = mine.group_by("seg").agg(
        pl.len().alias("n"), pl.col("ans_ts").is_not_null().sum().alias("with_answer"),
        pl.col("hit").fill_null(False).sum().alias("hits"),
        pl.col("ttl").filter(pl.col("hit").fill_null(False)).max().alias("ttl_hit"))
    # fallback when the clients' own answers are not in the capture: the key's latest earlier answer
    latest = (eps.select("seg", "key", "start_ns").sort("start_ns")
              .join_asof(answers.select("key", "ans_ts", "ttl").sort("ans_ts", "ttl"), left_on="start_ns", right_on="ans_ts",
                         by="key", strategy="backward", allow_exact_matches=False, check_sortedness=False)
              .with_columns((pl.col("ans_ts") + pl.col("ttl") * S).alias("expiry"))
              .with_columns(pl.col("start_ns").is_between(pl.col("expiry") - tol, pl.col("expiry") + S + tol)
                            .fill_null(False).alias("key_hit"))
              .select("seg", "key_hit", pl.col("ttl").alias("key_ttl")))
    per = per.join(latest, on="seg", how="left").with_columns(
        (pl.col("hits") / pl.col("n")).alias("share"),
        (pl.col("with_answer") < params.ttl_own_answer_share * pl.col("n")).alias("few_own"))
    own = (pl.col("hits") >= params.ttl_match_share * pl.col("n"))
    fallback = pl.col("few_own") & pl.col("key_hit")
    return per.select(
        pl.col("seg").cast(pl.Int64),
        pl.when(own).then(pl.col("ttl_hit")).when(fallback).then(pl.col("key_ttl")).otherwise(None)
        .cast(pl.Int64).alias("ttl_s"),
        pl.when(own).then(pl.col("share")).when(fallback).then(pl.lit(None, pl.Float64)).otherwise(None)
        .alias("ttl_share"),
    )


def failure_trigger(req: pl.DataFrame, eps: pl.DataFrame, params) -> pl.DataFrame:
    """Per episode: the key's failures (errors, or no answer where one was expected) in the lookback
    before it, kept only when they are at least ``failure_share`` of its requests there (a key that
    always fails now and then has no trigger in that)."""
    before = eps.select("seg", "key", "start_ns").join(
        req.lazy().filter(~pl.col("in_herd")).select("key", "request_ts_ns", "failed").collect(), on="key",
        how="inner").filter(
        (pl.col("request_ts_ns") < pl.col("start_ns"))
        & (pl.col("request_ts_ns") >= pl.col("start_ns") - params.failure_lookback_ns))
    return before.group_by("seg").agg(
        pl.col("failed").sum().alias("failures_before"), pl.len().alias("_n"),
        (pl.col("start_ns").first() - pl.col("request_ts_ns").filter(pl.col("failed")).min())
        .alias("failures_since_ns"),
    ).filter((pl.col("failures_before") > 0) & (pl.col("failures_before") >= params.failure_share * pl.col("_n"))
             ).drop("_n")
