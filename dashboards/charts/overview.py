"""The findings timeline: every finding a bar over the capture's time axis, coloured by severity."""
from __future__ import annotations

import altair as alt  # discrete axes get alt.Step heights: Streamlit does not honour a fixed height there
import polars as pl

from detectors import worst_first

from .base import TIME_TITLE, empty, finish, severity_scale

TIMELINE_MAX_FINDINGS = 300
TIMELINE_MAX_ROWS = 25  # more distinct detector · resource rows: one row per detector and kind instead
PICK = "pick"  # the selection parameter's name: st.altair_chart reports clicks under it


def _label(max_len: int = 70) -> pl.Expr:
    what = pl.coalesce(pl.col("resource"), pl.col("client"), pl.col("server"), pl.col("kind"), pl.lit(""))
    text = pl.format("{} · {}", pl.col("detector"), what)
    return (pl.when(text.str.len_chars() > max_len)
            .then(text.str.slice(0, max_len - 1) + pl.lit("…")).otherwise(text)).alias("row")


def findings_timeline(findings: pl.DataFrame, *, t0_ns: int, t1_ns: int,
                      max_findings: int = TIMELINE_MAX_FINDINGS) -> alt.Chart:
    """One bar per finding from start to end (rows: detector · resource), coloured by severity.

    Clicking a bar selects its ``finding_id`` (selection parameter :data:`PICK`). Findings shorter
    than 1/250 of the capture are drawn that wide so they stay visible (the tooltip has the real
    times). More than ``max_findings`` findings: the most severe are drawn, and the subtitle says so.
    """
    if findings.height == 0:
        return empty("No findings in this capture.", "Findings timeline")
    notes = []
    span_s = max((t1_ns - t0_ns) / 1e9, 1e-6)
    ordered = worst_first(findings)
    if ordered.height > max_findings:
        notes.append(f"sampled: the {max_findings} most severe of {ordered.height:,} findings shown")
        ordered = ordered.head(max_findings)
    min_width_s = span_s / 250
    data = ordered.select(
        "finding_id", "detector", "kind", pl.col("severity").cast(pl.String), "explanation",
        "value", "threshold", "unit", "client", "server", "resource", _label(),
        ((pl.col("start_ns") - t0_ns) / 1e9).alias("start_s"),
        ((pl.col("end_ns") - t0_ns) / 1e9).alias("end_s"),
    ).with_columns(
        pl.max_horizontal("end_s", pl.col("start_s") + min_width_s).alias("bar_end_s"),
        ((pl.col("end_s") - pl.col("start_s")) * 1e3).alias("duration_ms"),
    )
    if data.filter(pl.col("end_s") - pl.col("start_s") < min_width_s).height:
        notes.append(f"findings shorter than {min_width_s * 1e3:.3g} ms are drawn that wide")
    if data["row"].n_unique() > TIMELINE_MAX_ROWS:
        notes.append(f"{data['row'].n_unique():,} resources: one row per detector and kind (the tooltip names each)")
        data = data.with_columns(pl.format("{} · {}", "detector", pl.col("kind").fill_null("")).alias("row"))
    rows = data.group_by("row").agg(pl.col("start_s").min()).sort("start_s")["row"].to_list()
    pick = alt.selection_point(name=PICK, fields=["finding_id"], on="click", clear="dblclick")
    chart = alt.Chart(data).mark_bar(cornerRadius=2, stroke="#333", strokeWidth=0.3).encode(
        x=alt.X("start_s:Q", title=TIME_TITLE, scale=alt.Scale(domain=[0, span_s], nice=False)),
        x2="bar_end_s:Q",
        y=alt.Y("row:N", title=None, sort=rows, axis=alt.Axis(labelLimit=360)),
        color=alt.Color("severity:N", scale=severity_scale(), title="severity", legend=alt.Legend(orient="top")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.35)),
        tooltip=[alt.Tooltip("detector:N"), alt.Tooltip("kind:N"), alt.Tooltip("severity:N"),
                 alt.Tooltip("start_s:Q", format=".6f", title="start (s)"),
                 alt.Tooltip("duration_ms:Q", format=".3f", title="duration (ms)"),
                 alt.Tooltip("value:Q", format=",.4g"), alt.Tooltip("unit:N"),
                 alt.Tooltip("resource:N"), alt.Tooltip("explanation:N"), alt.Tooltip("finding_id:N")],
    ).add_params(pick).properties(height=alt.Step(28), width="container")
    return finish(chart, f"Findings timeline ({findings.height:,})", notes)
