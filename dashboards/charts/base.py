"""What every chart builder shares: the time axis, the severity colours, the row budget and the notes.

Row budget: a chart carries at most :data:`MAX_ROWS` rows per dataset (below Altair's 5,000-row
guard, which stays on as a safety net). A builder that has more rows aggregates them (bins,
percentiles, per-bucket envelopes) or thins them deterministically, and records what it did in a
note: :func:`finish` puts the notes in the chart's subtitle, where the reader sees them, and in
``usermeta["herdscope"]`` (``notes``, ``sampled``) where tests and the page find them.
"""
from __future__ import annotations

import math

import altair as alt
import polars as pl

from analyzer.durations import fmt_ns
from detectors.base import SEVERITIES

MAX_ROWS = 4000  # rows per dataset in one chart
PANEL_WIDTH = 760  # px: the width of panels that share a time axis (concatenated charts)
# A proof chart opens on the finding's window with this much context on each side: this many times
# the window's length, and at least MIN_CONTEXT_NS (a 48 ms herd gets a second before and after, so
# the trigger and the calm either side are visible); scrolling zooms out, double-click resets.
CONTEXT_FACTOR = 2.0
MIN_CONTEXT_NS = 1_000_000_000
# How far beyond the opening view a proof chart's data reaches (in view lengths, each side), so that
# zooming out shows more traffic rather than an empty axis.
ZOOM_OUT_VIEWS = 4.0
SEVERITY_COLOURS = ("#9e9e9e", "#4e79a7", "#e8a202", "#e15759", "#7b0d1e")  # informational .. critical
TIME_TITLE = "seconds since the first packet"


def severity_scale() -> alt.Scale:
    return alt.Scale(domain=list(SEVERITIES), range=list(SEVERITY_COLOURS))


def rel_s(column: str, t0_ns: int, alias: str | None = None) -> pl.Expr:
    """Seconds since ``t0_ns`` (the capture's first packet): the time axis of every chart."""
    return ((pl.col(column) - t0_ns) / 1e9).alias(alias or column.replace("_ns", "_s"))


def nice_bin_ns(span_ns: float, target_bins: int = 300, min_ns: float = 1_000) -> int:
    """A round bin width (1, 2 or 5 × 10^k ns) giving about ``target_bins`` bins over ``span_ns``."""
    raw = max(float(span_ns) / max(target_bins, 1), float(min_ns), 1.0)
    exp = math.floor(math.log10(raw))
    for step in (1, 2, 5, 10):
        width = step * 10 ** exp
        if width >= raw:
            return int(width)
    return int(10 ** (exp + 1))


def focus_domain(window_ns: tuple[int, int], *, factor: float = CONTEXT_FACTOR,
                 min_context_ns: int = MIN_CONTEXT_NS) -> tuple[int, int]:
    """The time range (ns) a proof chart opens on: the finding's window ± max(factor × its length,
    min_context_ns). Not clipped to the capture: a finding at its very end keeps its right-hand
    context (empty: the capture stopped), so its shading is never on the chart's edge."""
    w0, w1 = int(window_ns[0]), max(int(window_ns[1]), int(window_ns[0]))
    context = int(max(factor * (w1 - w0), min_context_ns))
    return w0 - context, w1 + context


def data_range(view_ns: tuple[int, int], extent_ns: tuple[int, int] | None,
               views: float = ZOOM_OUT_VIEWS) -> tuple[int, int]:
    """The range a zoomable chart carries data for: the view and ``views`` view-lengths either side,
    within ``extent_ns`` (the capture's) when given, and never less than the view."""
    span = view_ns[1] - view_ns[0]
    lo, hi = view_ns[0] - int(views * span), view_ns[1] + int(views * span)
    if extent_ns is not None:
        lo, hi = max(lo, int(extent_ns[0])), min(hi, int(extent_ns[1]))
    return min(lo, view_ns[0]), max(hi, view_ns[1])


def zoom_note(view_ns: tuple[int, int], window_ns: tuple[int, int] | None) -> str:
    """The subtitle line that says the chart is zoomed and how to zoom out."""
    what = (f"the finding's {fmt_ns(window_ns[1] - window_ns[0])} window"
            if window_ns is not None else "the finding")
    return (f"zoomed on {what} ± context ({fmt_ns(view_ns[1] - view_ns[0])} shown): scroll to zoom "
            f"out, drag to pan, double-click to come back")


def seconds_domain(lo_ns: int, hi_ns: int, t0_ns: int) -> tuple[float, float]:
    """A time range (ns) as an x domain in seconds since ``t0_ns`` (never empty)."""
    return ((lo_ns - t0_ns) / 1e9, (max(hi_ns, lo_ns + 1) - t0_ns) / 1e9)


def linked_zoom(name: str):
    """Scroll to zoom, drag to pan the x axis (double-click resets); shared by concatenated panels."""
    return alt.selection_interval(name=name, bind="scales", encodings=["x"])


def opening_view(window_ns, view_ns, notes: list) -> tuple[int, int] | None:
    """The range a proof chart opens on: ``view_ns``, else the finding's window with context
    (:func:`focus_domain`, and a note saying so), else None (the data's own range)."""
    if view_ns is not None:
        return view_ns
    if window_ns is None:
        return None
    view = focus_domain(window_ns)
    notes.append(zoom_note(view, window_ns))
    return view


def x_scale(view, t0_ns) -> alt.Scale:
    """The x scale of a chart opening on ``view`` (ns), or the data's own range without one."""
    return alt.Scale(domain=list(seconds_domain(view[0], view[1], t0_ns)), nice=False) if view \
        else alt.Scale(zero=False)


def thin(frame: pl.DataFrame, max_rows: int = MAX_ROWS, keep: pl.Expr | None = None,
         what: str = "rows") -> tuple[pl.DataFrame, str | None]:
    """At most ``max_rows`` rows: every k-th row (deterministic, order kept), plus the rows ``keep``
    selects (up to half the budget). Returns the frame and a note when rows were dropped."""
    if frame.height <= max_rows:
        return frame, None
    kept = frame.filter(keep).head(max_rows // 2) if keep is not None else frame.clear()
    rest = frame.filter(~keep) if keep is not None else frame
    room = max(max_rows - kept.height, 1)
    step = math.ceil(rest.height / room)
    sampled = rest.gather_every(step)
    out = pl.concat([kept, sampled]) if kept.height else sampled
    flagged = frame.filter(keep).height if keep is not None else 0
    note = (f"sampled: {out.height:,} of {frame.height:,} {what} shown (1 in {step}"
            + (f", and {'all ' if kept.height == flagged else ''}{kept.height:,} of the {flagged:,} marked ones"
               if flagged else "") + ")")
    return out, note


def finish(chart, title: str, notes: list[str | None] = ()):
    """Title the chart, with the sampling/aggregation notes as its subtitle and in usermeta."""
    notes = [n for n in notes if n]
    chart = chart.properties(title=alt.TitleParams(text=title, subtitle=notes or alt.Undefined,
                                                   anchor="start", subtitleColor="#b35900"))
    meta = {"herdscope": {"notes": notes, "sampled": any(n.startswith("sampled") for n in notes),
                          "aggregated": any(n.startswith("aggregated") for n in notes)}}
    # The height is the plot's, not the whole chart's (title, legend and axes come on top): Streamlit's
    # default, "fit", squeezes the plot into the height instead. Concatenations keep their panel sizes.
    concat = isinstance(chart, (alt.VConcatChart, alt.HConcatChart, alt.ConcatChart))
    autosize = alt.AutoSizeParams(type="pad" if concat else "fit-x", contains="padding")
    return chart.properties(usermeta=meta, autosize=autosize)


def chart_notes(chart) -> list[str]:
    """The notes :func:`finish` attached (empty when none)."""
    meta = chart.to_dict(validate=False).get("usermeta") or {}
    return list(meta.get("herdscope", {}).get("notes", []))


def empty(message: str, title: str = "") -> alt.Chart:
    """A chart that says there is nothing to draw (instead of an error or a blank box)."""
    chart = alt.Chart(pl.DataFrame({"message": [message]})).mark_text(
        align="left", baseline="middle", fontSize=13, color="#666").encode(
        text="message:N").properties(height=60, width="container")
    return finish(chart, title or message, [])


def time_x(field: str = "t_s", title: str = TIME_TITLE, domain: tuple[float, float] | None = None,
           **axis) -> alt.X:
    scale = alt.Scale(domain=list(domain), nice=False) if domain else alt.Undefined
    return alt.X(f"{field}:Q", title=title, scale=scale, axis=alt.Axis(**axis) if axis else alt.Undefined)


def window_rect(start_s: float, end_s: float, label: str, colour: str = "#e15759",
                opacity: float = 0.15, scale: alt.Scale | None = None, min_width_s: float = 0.0) -> alt.LayerChart:
    """A shaded time window with its label at the top (the finding's window, a stall). Pass the
    chart's x ``scale`` so the shading does not widen the time axis (to zero, say), and
    ``min_width_s`` to keep a short window visible on a long axis."""
    data = pl.DataFrame({"start_s": [start_s], "end_s": [max(end_s, start_s + min_width_s)], "label": [label]})
    return windows_rect(data, colour=colour, opacity=opacity, scale=scale, tooltip=False)


def windows_rect(frame: pl.DataFrame, colour: str = "#e15759", opacity: float = 0.15,
                 label: str = "label", scale: alt.Scale | None = None, tooltip: bool = True) -> alt.LayerChart:
    """Shaded windows (``start_s``, ``end_s`` and ``label`` columns), each labelled at the top."""
    base = alt.Chart(frame)
    x = alt.X("start_s:Q", scale=scale if scale is not None else alt.Scale(zero=False), title=TIME_TITLE)
    tips = [alt.Tooltip(f"{label}:N", title="window"), alt.Tooltip("start_s:Q", format=".6f"),
            alt.Tooltip("end_s:Q", format=".6f")] if tooltip else alt.Undefined
    # clipped: on a zoomed (or zoomable) axis, shading outside the view must not spill over the axes
    rect = base.mark_rect(color=colour, opacity=opacity, clip=True).encode(x=x, x2="end_s:Q", tooltip=tips)
    text = base.mark_text(align="left", baseline="top", dx=3, dy=3, color=colour, fontSize=11, clip=True).encode(
        x=x, y=alt.value(0), text=f"{label}:N")
    return rect + text
