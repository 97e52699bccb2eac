"""``herdscope stats``: service response times per protocol and operation, like ``tshark -z smb2,srt``
but for DNS, Kerberos, LDAP and SMB2 together, and with what tshark's SRT leaves out: SMB2
STATUS_PENDING waits (interim → final response) and oplock/lease break acknowledgments.

One row per (protocol, operation): ``count`` requests, ``answered``, ``unanswered``, ``errors``
(the protocol's own notion, ``is_error``), and the latency of answered ones in ns: ``min``, ``p50``,
``p90``, ``p99``, ``max``, ``mean``. Quantiles use the "higher" rule (an observed value, never an
interpolation). SMB2 CANCEL (never answered) and unanswered CHANGE_NOTIFY (pending by design) are
left out. Extra operations: ``smb2 / STATUS_PENDING wait`` (the wait between the interim and
the final response of requests that went pending; CHANGE_NOTIFY waits, pending by design, have a row
of their own) and ``smb2 / oplock break ack`` / ``lease break ack``
(notification → acknowledgment; an unacknowledged break counts as unanswered).
"""
from __future__ import annotations

import polars as pl

from .decoders.common import COMMON_NAMES

PROTOCOLS = ("dns", "kerberos", "ldap", "smb2")
STAT_COLUMNS = ("protocol", "operation", "count", "answered", "unanswered", "errors", "min", "p50", "p90",
                "p99", "max", "mean")


def latency_stats(frame: pl.DataFrame, keys: list[str], latency: str, answered: str, errors: pl.Expr) -> pl.DataFrame:
    lat = pl.col(latency).filter(pl.col(answered))
    return frame.group_by(keys).agg(
        pl.len().cast(pl.UInt32).alias("count"),
        pl.col(answered).sum().cast(pl.UInt32).alias("answered"),
        (~pl.col(answered)).sum().cast(pl.UInt32).alias("unanswered"),
        errors.sum().cast(pl.UInt32).alias("errors"),
        lat.min().alias("min"),
        lat.quantile(0.5, "higher").alias("p50"),
        lat.quantile(0.9, "higher").alias("p90"),
        lat.quantile(0.99, "higher").alias("p99"),
        lat.max().alias("max"),
        lat.mean().alias("mean"),
    )


def expected_requests(frame: pl.DataFrame) -> pl.DataFrame:
    """Requests that expect an answer: SMB2 CANCEL never gets one (MS-SMB2 3.3.5.16) and CHANGE_NOTIFY
    waits by design; they would only inflate "unanswered"."""
    if "expects_response" in frame.columns:
        frame = frame.filter(pl.col("expects_response"))
    if "pending_by_design" in frame.columns:
        frame = frame.filter(~pl.col("pending_by_design").fill_null(False) | pl.col("answered"))
    return frame


def transactions(cap) -> pl.DataFrame:
    """The common columns of every protocol's transaction frame, stacked (requests that expect an answer)."""
    names = set(cap.frame_names())
    frames = [expected_requests(cap.frame(f"{p}_transactions")).select(COMMON_NAMES)
              for p in PROTOCOLS if f"{p}_transactions" in names]
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame()
    return pl.concat([f.with_columns(pl.col("transport").cast(pl.String)) for f in frames], how="vertical_relaxed")


def service_response_times(cap) -> pl.DataFrame:
    parts = []
    tx = transactions(cap)
    if tx.height:
        parts.append(latency_stats(tx, ["protocol", "operation"], "latency_ns", "answered",
                                    pl.col("is_error").fill_null(False)))
    names = set(cap.frame_names())
    if "smb2_transactions" in names:
        smb = cap.frame("smb2_transactions")
        if "pending_ns" in smb.columns:
            pending = smb.filter(pl.col("pending_ns").is_not_null() | pl.col("interim_frame").is_not_null()) \
                if "interim_frame" in smb.columns else smb.filter(pl.col("pending_ns").is_not_null())
            if pending.height:
                by_design = pl.col("pending_by_design").fill_null(False) if "pending_by_design" in pending.columns \
                    else pl.lit(False)
                label = pl.when(by_design).then(pl.lit("CHANGE_NOTIFY wait (by design)")) \
                    .otherwise(pl.lit("STATUS_PENDING wait"))
                parts.append(latency_stats(
                    pending.with_columns(pl.lit("smb2").alias("protocol"), label.alias("operation"),
                                         pl.col("pending_ns").is_not_null().alias("_done")),
                    ["protocol", "operation"], "pending_ns", "_done", pl.lit(False)))
    if "smb2_breaks" in names:
        breaks = cap.frame("smb2_breaks")
        lat = next((c for c in ("ack_latency_ns", "ack_ns") if c in breaks.columns), None)
        kind = next((c for c in ("break_kind", "kind") if c in breaks.columns), None)
        if "ack_required" in breaks.columns:  # level II oplock breaks are not acknowledged (3.3.4.6)
            breaks = breaks.filter(pl.col("ack_required"))
        if breaks.height and lat:
            label = (pl.when(pl.col(kind).cast(pl.String).str.contains("lease")).then(pl.lit("lease break ack"))
                     .otherwise(pl.lit("oplock break ack"))) if kind else pl.lit("break ack")
            parts.append(latency_stats(
                breaks.with_columns(pl.lit("smb2").alias("protocol"), label.alias("operation"),
                                    pl.col(lat).is_not_null().alias("_acked")),
                ["protocol", "operation"], lat, "_acked", pl.lit(False)))
    if not parts:
        return pl.DataFrame(schema={c: (pl.String if c in ("protocol", "operation") else pl.Float64)
                                    for c in STAT_COLUMNS})
    order = {p: k for k, p in enumerate(PROTOCOLS)}
    out = pl.concat([p.select(STAT_COLUMNS) for p in parts], how="vertical_relaxed")
    return out.with_columns(pl.col("protocol").replace_strict(order, default=99).alias("_o")) \
        .sort("_o", "count", descending=[False, True]).drop("_o")


def render_table(stats: pl.DataFrame, title: str, console=None) -> None:
    from rich.table import Table

    from detectors.base import fmt_ns

    from .render import console as make_console

    console = console or make_console()
    t = Table(title=title, title_justify="left")
    for col in ("protocol", "operation", "count", "answered", "unanswered", "errors", "min", "p50", "p90",
                "p99", "max"):
        t.add_column(col, justify="left" if col in ("protocol", "operation") else "right")
    for r in stats.iter_rows(named=True):
        t.add_row(r["protocol"], r["operation"], f"{r['count']:,}", f"{r['answered']:,}", f"{r['unanswered']:,}",
                  f"{r['errors']:,}", *(fmt_ns(r[c]) if r[c] is not None else "-" for c in
                                        ("min", "p50", "p90", "p99", "max")))
    console.print(t)
