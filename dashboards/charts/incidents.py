"""The incident swim lanes: one incident (``detectors.incidents.link``) as a timeline with one lane per
protocol and server, a bar per finding coloured by severity, the likely trigger marked (issue 17).

The Overview draws one per incident above the findings timeline; clicking a bar selects its
``finding_id`` under :data:`overview.PICK`, as the findings timeline does, so the page opens it the
same way.
"""
from __future__ import annotations

import altair as alt
import polars as pl

from .base import TIME_TITLE, finish, severity_scale
from .overview import PICK

MIN_BAR_SHARE = 1 / 250  # a finding shorter than this share of the incident is drawn that wide
PAD_SHARE = 0.05  # room either side of the incident on the time axis
TRIGGER_MARK = "▶ trigger"


def incident_lanes(incident: dict, findings: pl.DataFrame, *, t0_ns: int) -> alt.LayerChart:
    """The incident's findings as bars on its lanes (``incident["lanes"]``, in their order), x in
    seconds since the first packet (``t0_ns``), the trigger outlined and labelled. ``findings``
    holds at least the incident's findings (other rows are ignored)."""
    lane_of = {fid: lane["lane"] for lane in incident["lanes"] for fid in lane["finding_ids"]}
    rows = findings.filter(pl.col("finding_id").is_in(list(lane_of)))
    start_s = (incident["start_ns"] - t0_ns) / 1e9
    span_s = max((incident["end_ns"] - incident["start_ns"]) / 1e9, 1e-6)
    min_width_s = span_s * MIN_BAR_SHARE
    data = rows.select(
        "finding_id", "detector", "kind", pl.col("severity").cast(pl.String), "explanation", "resource",
        pl.col("finding_id").replace_strict(lane_of, return_dtype=pl.String).alias("lane"),
        (pl.col("finding_id") == incident["trigger"]).alias("trigger"),
        ((pl.col("start_ns") - t0_ns) / 1e9).alias("start_s"),
        ((pl.col("end_ns") - t0_ns) / 1e9).alias("end_s"),
    ).with_columns(
        pl.max_horizontal("end_s", pl.col("start_s") + min_width_s).alias("bar_end_s"),
        ((pl.col("end_s") - pl.col("start_s")) * 1e3).alias("duration_ms"),
        pl.when(pl.col("trigger")).then(pl.lit(TRIGGER_MARK)).otherwise(pl.lit("")).alias("mark"),
    ).sort("start_s", "finding_id")
    notes = []
    if data.filter(pl.col("end_s") - pl.col("start_s") < min_width_s).height:
        notes.append(f"findings shorter than {min_width_s * 1e3:.3g} ms are drawn that wide")
    lanes = [lane["lane"] for lane in incident["lanes"]]
    scale = alt.Scale(domain=[start_s - span_s * PAD_SHARE, start_s + span_s * (1 + PAD_SHARE)], nice=False)
    x = alt.X("start_s:Q", title=TIME_TITLE, scale=scale)
    y = alt.Y("lane:N", title=None, sort=lanes, axis=alt.Axis(labelLimit=360))
    pick = alt.selection_point(name=PICK, fields=["finding_id"], on="click", clear="dblclick")
    base = alt.Chart(data)
    bars = base.mark_bar(cornerRadius=2).encode(
        x=x, x2="bar_end_s:Q", y=y,
        color=alt.Color("severity:N", scale=severity_scale(), title="severity", legend=alt.Legend(orient="top")),
        stroke=alt.condition("datum.trigger", alt.value("#111"), alt.value("#333")),
        strokeWidth=alt.condition("datum.trigger", alt.value(2.5), alt.value(0.3)),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.35)),
        tooltip=[alt.Tooltip("detector:N"), alt.Tooltip("kind:N"), alt.Tooltip("severity:N"),
                 alt.Tooltip("start_s:Q", format=".6f", title="start (s)"),
                 alt.Tooltip("duration_ms:Q", format=".3f", title="duration (ms)"),
                 alt.Tooltip("resource:N"), alt.Tooltip("explanation:N"), alt.Tooltip("finding_id:N")],
    ).add_params(pick)
    label = base.transform_filter("datum.trigger").mark_text(align="left", dx=5, fontWeight="bold").encode(
        x=alt.X("bar_end_s:Q", scale=scale), y=y, text="mark:N")  # just right of the trigger's bar
    chart = alt.layer(bars, label).properties(height=alt.Step(34), width="container")
    return finish(chart, f"Incident {incident['incident_id']} ({len(incident['findings'])} findings, "
                         f"{incident['severity']})", notes)
