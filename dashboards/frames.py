"""Pure helpers over a capture's frames for the dashboard (no Streamlit): the transactions of every
protocol in one frame, service-response-time tables, where evidence frames live, the Wireshark line.
"""
from __future__ import annotations

import os

import polars as pl

from analyzer.decoders.common import COMMON_NAMES, TRANSACTION_TEXT_SCHEMA
from analyzer.decoders.registry import protocol, transaction_frames
from detectors.report import wireshark_command as scan_wireshark_command
from detectors.report import wireshark_filter as display_filter  # noqa: F401 - re-exported for the pages
from analyzer.stats import expected_requests, latency_stats

# The transactions frame every page uses: TRANSACTION_COMMON's columns, with one set of types across
# protocols (categorical columns as text, so frames of different protocols concatenate).
TRANSACTIONS_SCHEMA = TRANSACTION_TEXT_SCHEMA


def transaction_frame_names(cap) -> list[str]:
    """Names of the capture's transaction frames: those the registered protocols declare
    (:func:`analyzer.decoders.registry.transaction_frames`), whatever decoders are installed."""
    declared = set(transaction_frames())
    return [n for n in cap.frame_names() if n in declared]


def transactions_frame_of(protocol_name: str | None) -> str | None:
    """The transactions frame a protocol declares (a finding's kind, a transaction's protocol), None
    when the name is no registered protocol or it pairs no requests."""
    try:
        return protocol(protocol_name).transactions if protocol_name else None
    except KeyError:
        return None


def common_transactions(frame: pl.DataFrame) -> pl.DataFrame:
    """A protocol's transactions cut to the common columns, with one set of types."""
    return frame.select(pl.col(n).cast(t) for n, t in TRANSACTIONS_SCHEMA.items())


def all_transactions(cap) -> tuple[pl.DataFrame, dict[str, str]]:
    """Every protocol's transactions in one frame, and the frames that could not be built (name → why).
    Requests that expect no answer (SMB2 CANCEL, CHANGE_NOTIFY still waiting) are left out, as
    ``herdscope stats`` leaves them out."""
    parts, problems = [], {}
    for name in transaction_frame_names(cap):
        try:
            frame = cap.frame(name)
        except Exception as exc:  # noqa: BLE001 - one decoder's failure must not hide the others
            problems[name] = f"{type(exc).__name__}: {exc}"
            continue
        missing = [c for c in COMMON_NAMES if c not in frame.columns]
        if missing:
            problems[name] = f"lacks the common transaction columns {', '.join(missing)}"
            continue
        parts.append(common_transactions(expected_requests(frame)))
    out = pl.concat(parts) if parts else pl.DataFrame(schema=TRANSACTIONS_SCHEMA)
    return out.sort("request_ts_ns"), problems


SRT_MS = ("min", "p50", "p90", "p99", "max", "mean")


def srt_table(tx: pl.DataFrame, by: tuple[str, ...] = ("protocol", "operation")) -> pl.DataFrame:
    """Service response times grouped by ``by``, computed as ``herdscope stats`` does
    (:mod:`analyzer.stats`: count, answered, unanswered, errors, latency quantiles by the "higher"
    rule), with the latencies in ms."""
    table = latency_stats(tx, list(by), "latency_ns", "answered", pl.col("is_error").fill_null(False))
    return ms_columns(table).sort("count", descending=True)


def ms_columns(stats: pl.DataFrame) -> pl.DataFrame:
    """A stats table's ns latency columns as ms (``p50`` → ``p50_ms``)."""
    return stats.with_columns((pl.col(c) / 1e6).alias(f"{c}_ms") for c in SRT_MS if c in stats.columns).drop(
        [c for c in SRT_MS if c in stats.columns])


def time_origin(cap) -> tuple[int, int]:
    """(first, last) packet time in ns: the origin and end of every chart's time axis."""
    p = cap.packets
    if p.height == 0:
        return 0, 1
    return int(p["ts_ns"].min()), int(p["ts_ns"].max())


def file_frame_ranges(cap) -> list[tuple[str, int, int]]:
    """(file, first frame, last frame) of each file, in the numbering of the (possibly joined) capture."""
    reports = getattr(cap, "reports", None) or [(cap.path, cap.report)]
    if len(reports) == 1:
        return [(reports[0][0], 1, cap.packets.height)]
    out, base = [], 0
    for path, report in reports:
        out.append((path, base + 1, base + report.records))
        base += report.records
    return out


def evidence_locations(cap, frames: list[int]) -> list[tuple[str, list[int]]]:
    """Frames of the capture → (file, that file's own frame numbers), for each file that has some.
    For a capture joined from several files, frame numbers count across the files (as ``mergecap -a``)."""
    out = []
    for path, first, last in file_frame_ranges(cap):
        mine = [f - first + 1 for f in frames if first <= f <= last]
        if mine:
            out.append((path, mine))
    return out


def wireshark_command(path: str, frames: list[int]) -> str:
    """The line that opens ``path`` in Wireshark showing just ``frames``."""
    return scan_wireshark_command(os.fspath(path), frames)


def packet_rows(cap, frames: list[int], t0_ns: int) -> pl.DataFrame:
    """herdscope's own row for each frame: time, addresses, ports, lengths (beside Wireshark's view)."""
    p = cap.packets.filter(pl.col("frame").is_in(pl.Series(frames, dtype=pl.UInt32).implode()))
    return p.select(
        "frame", ((pl.col("ts_ns") - t0_ns) / 1e9).alias("time_s"), pl.col("src").cast(pl.String),
        "sport", pl.col("dst").cast(pl.String), "dport", "ip_proto", "wirelen",
        pl.col("parse_status").cast(pl.String))


BLANK = "—"  # what a table cell shows where a value is missing (never Python's None)


def display_table(table: pl.DataFrame, formats: dict[str, str] | None = None) -> pl.DataFrame:
    """``table`` for ``st.dataframe`` with no cell showing ``None``: in every column that has nulls
    (or NaNs) the values become text and the missing ones :data:`BLANK`; numbers there are rounded by
    ``formats`` (column → ``"%.3f"`` decimals or ``"%.4g"`` significant figures, as Streamlit's
    NumberColumn would have shown them); lists are joined with ", ". Columns without nulls keep their
    type (and so their NumberColumn formatting: see :func:`number_config`)."""
    formats = formats or {}
    out = []
    for name, dtype in table.schema.items():
        col = pl.col(name)
        if dtype.is_float():
            col = col.fill_nan(None)
        if table.select(col.is_null().any()).item() is not True:
            out.append(col)
            continue
        fmt = formats.get(name, "")
        if dtype.is_numeric() and fmt.endswith("g"):
            col = col.round_sig_figs(int(fmt[2:-1]))
        elif dtype.is_float() and fmt.endswith("f"):
            col = col.round(int(fmt[2:-1]))
        if isinstance(dtype, pl.List):
            col = col.list.eval(pl.element().cast(pl.String)).list.join(", ")
        out.append(col.cast(pl.String).fill_null(BLANK).alias(name))
    return table.select(out)


def number_config(table: pl.DataFrame, config: dict) -> dict:
    """The ``column_config`` entries that still apply after :func:`display_table`: number formats
    only on columns that stayed numeric."""
    return {k: v for k, v in config.items() if k not in table.columns or table.schema[k].is_numeric()}


def findings_table(found: pl.DataFrame, t0_ns: int) -> pl.DataFrame:
    """The Findings page's table: one row per finding, times relative to the first packet."""
    return found.select(
        pl.col("severity").cast(pl.String), "detector", "kind",
        ((pl.col("start_ns") - t0_ns) / 1e9).alias("start_s"),
        ((pl.col("end_ns") - pl.col("start_ns")) / 1e6).alias("duration_ms"),
        "client", "server", "resource", "metric", "value", "threshold", "unit", "evidence_total", "finding_id")


def endpoint_matches(addr: str, port: str | None, value: str | None) -> pl.Expr:
    """True where ``addr`` (or ``addr:port``, ``[addr]:port``) is ``value``; everything when value is empty."""
    if not value:
        return pl.lit(True)
    a = pl.col(addr).cast(pl.String)
    cond = a == value
    if port is not None:
        cond = cond | (pl.format("{}:{}", a, pl.col(port)) == value) | (pl.format("[{}]:{}", a, pl.col(port)) == value)
    return cond.fill_null(False)
