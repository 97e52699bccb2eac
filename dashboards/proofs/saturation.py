"""The saturation proof: per window, concurrency against completions/s and against latency, the knee marked.

:func:`saturation_proof` (registered for ``saturation``) asks the detector for the finding's windows and
its decisions (``detectors.saturation.windows_of``: which windows are the baseline, which past the knee,
which collapsed), and :func:`knee_chart` draws them: a healthy ramp climbs along the diagonal
(completions/s grow with concurrency, latency flat); a saturated server turns flat at the knee and its
latency climbs from there.
"""
from __future__ import annotations

import altair as alt
import polars as pl

import detectors.saturation as detector
import detectors.saturation_slots as slots

from ..charts.base import (TIME_TITLE, empty, finish, linked_zoom, opening_view, seconds_domain, thin, window_rect,
                           x_scale)
from .base import Proof, detector_params, proof_chart

CLASSES = ("baseline", "past the knee", "collapsed", "other", "too few answers")
COLOURS = ("#4e79a7", "#e15759", "#b07aa1", "#bab0ac", "#e0e0e0")


def window_classes(win: pl.DataFrame) -> pl.DataFrame:
    """The windows with a ``class`` (CLASSES) and latency in ms, for drawing."""
    return win.with_columns(
        pl.when(pl.col("collapse")).then(pl.lit("collapsed")).when(pl.col("past")).then(pl.lit("past the knee"))
        .when(pl.col("base")).then(pl.lit("baseline")).when(pl.col("valid")).then(pl.lit("other"))
        .otherwise(pl.lit("too few answers")).alias("class"),
        (pl.col("lat_median") / 1e6).alias("latency_ms"))


def knee_chart(win: pl.DataFrame, *, t0_ns: int) -> alt.Chart:
    """Two panels over the same concurrency axis: completions/s and median latency per window, coloured
    by the detector's classes; the knee's concurrency as a vertical rule, the capacity as a horizontal
    one."""
    title = "Concurrency against completions/s and latency"
    if win.height == 0:
        return empty("No windows to draw for this service.", title)
    w = window_classes(win).with_columns(((pl.col("a") - t0_ns) / 1e9).alias("t_s"))
    w, note = thin(w, keep=pl.col("past") | pl.col("collapse"), what="windows")
    knee = w.select(pl.col("knee_l").drop_nulls().first(), pl.col("capacity").drop_nulls().first())
    colour = alt.Color("class:N", scale=alt.Scale(domain=list(CLASSES), range=list(COLOURS)), title="window")
    tips = [alt.Tooltip("t_s:Q", title="window start (s)", format=".2f"), alt.Tooltip("L:Q", format=".2f"),
            alt.Tooltip("X:Q", title="completions/s", format=",.1f"), alt.Tooltip("offered:Q", format=",.1f"),
            alt.Tooltip("latency_ms:Q", format=",.2f"), alt.Tooltip("class:N")]
    x = alt.X("L:Q", title="concurrency (requests outstanding, time average)", scale=alt.Scale(zero=True))
    points = alt.Chart(w).mark_circle(size=40, opacity=0.8)
    top = points.encode(x=x, y=alt.Y("X:Q", title="completions/s"), color=colour, tooltip=tips)
    bottom = points.encode(x=x, y=alt.Y("latency_ms:Q", title="median latency (ms)"), color=colour, tooltip=tips)
    layers_top, layers_bottom = [top], [bottom]
    if knee.height and knee["knee_l"][0] is not None:
        rule = pl.DataFrame({"L": [knee["knee_l"][0]], "label": [f"knee: {knee['knee_l'][0]:.2g} outstanding"]})
        vr = alt.Chart(rule).mark_rule(color="#333", strokeDash=[4, 3]).encode(x="L:Q", tooltip=["label:N"])
        layers_top.append(vr)
        layers_bottom.append(vr)
        if knee["capacity"][0] is not None:
            cap = pl.DataFrame({"X": [knee["capacity"][0]], "label": [f"capacity {knee['capacity'][0]:,.0f}/s"]})
            layers_top.append(alt.Chart(cap).mark_rule(color="#888", strokeDash=[2, 2]).encode(
                y="X:Q", tooltip=["label:N"]))
    chart = alt.vconcat(alt.layer(*layers_top).properties(width="container", height=200),
                        alt.layer(*layers_bottom).properties(width="container", height=200))
    n_past = int(w["past"].sum())
    return finish(chart, f"{title}: {win.height:,} windows, {n_past:,} past the knee", [note])


def timeline_chart(win: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                   view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """The same windows over time: concurrency, completions/s (and the offered load) and median latency,
    one panel each on a shared time axis, the finding's period shaded. Opens on ``view_ns`` (default:
    the finding's window with context); scroll to zoom out."""
    title = "Concurrency, completions/s and latency over time"
    if win.height == 0:
        return empty("No windows to draw for this service.", title)
    notes: list = []
    view = opening_view(window_ns, view_ns, notes)
    w = window_classes(win).with_columns((((pl.col("a") + pl.col("b")) / 2 - t0_ns) / 1e9).alias("t_s"))
    w, note = thin(w, keep=pl.col("past"), what="windows")
    notes.append(note)
    xs = x_scale(view, t0_ns)
    zoom = linked_zoom("saturation_time")
    colour = alt.Color("class:N", scale=alt.Scale(domain=list(CLASSES), range=list(COLOURS)), title="window")
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xs)

    def panel(field: str, label: str, extra=None):
        layers = []
        if window_ns:
            layers.append(window_rect(*seconds_domain(window_ns[0], window_ns[1], t0_ns), "past the knee",
                                      opacity=0.08, scale=xs))
        line = alt.Chart(w).mark_line(color="#999", clip=True).encode(x=x, y=alt.Y(f"{field}:Q", title=label))
        dots = alt.Chart(w).mark_circle(size=25, clip=True).encode(
            x=x, y=f"{field}:Q", color=colour,
            tooltip=[alt.Tooltip("t_s:Q", format=".2f"), alt.Tooltip(f"{field}:Q", format=",.2f"), "class:N"])
        layers += [line, dots] + ([extra] if extra is not None else [])
        return alt.layer(*layers).properties(width="container", height=120)

    offered = alt.Chart(w).mark_line(color="#f28e2b", strokeDash=[3, 2], clip=True).encode(
        x=x, y="offered:Q", tooltip=[alt.Tooltip("offered:Q", title="offered/s", format=",.1f")])
    chart = alt.vconcat(panel("L", "outstanding").add_params(zoom), panel("X", "completions/s (offered dashed)", offered),
                        panel("latency_ms", "median latency (ms)"))
    return finish(chart, title, notes)


def slots_chart(use: pl.DataFrame, *, t0_ns: int, window_ns: tuple[int, int] | None = None,
                view_ns: tuple[int, int] | None = None) -> alt.Chart:
    """NFSv4.1: the slots each session had in use over time (a step line per session) against the slots
    the server accepts (its highest_slotid + 1, dashed), the finding's period shaded."""
    title = "NFSv4.1 session slots in use over time"
    if use.height == 0:
        return empty("No SEQUENCE visible for this service.", title)
    notes: list = []
    view = opening_view(window_ns, view_ns, notes)
    u = use.with_columns(((pl.col("t") - t0_ns) / 1e9).alias("t_s"))
    u, note = thin(u, what="slot changes")
    notes.append(note)
    xs = x_scale(view, t0_ns)
    x = alt.X("t_s:Q", title=TIME_TITLE, scale=xs)
    layers = []
    if window_ns:
        layers.append(window_rect(*seconds_domain(window_ns[0], window_ns[1], t0_ns), "past the knee", opacity=0.08,
                                  scale=xs))
    layers.append(alt.Chart(u).mark_line(interpolate="step-after", opacity=0.5, clip=True).encode(
        x=x, y=alt.Y("in_use:Q", title="slots in use"), color=alt.Color("sessionid:N", legend=None),
        tooltip=[alt.Tooltip("t_s:Q", format=".3f"), "sessionid:N", "in_use:Q", "accepted:Q"]))
    layers.append(alt.Chart(u).mark_line(color="#333", strokeDash=[4, 3], interpolate="step-after", clip=True).encode(
        x=x, y="max(accepted):Q", tooltip=[alt.Tooltip("max(accepted):Q", title="slots the server accepts")]))
    chart = alt.layer(*layers).properties(width="container", height=160)
    return finish(chart, f"{title}: {use['sessionid'].n_unique():,} sessions", notes)


@proof_chart(detector.NAME)
def saturation_proof(p: Proof) -> list[tuple[object, str]]:
    params = detector_params(p.finding, detector)
    resource = p.finding.get("resource") or ""
    try:
        win = detector.windows_of(p.cap, resource, params)
    except Exception as e:  # noqa: BLE001 - a proof never breaks the page
        return [(empty(f"Could not rebuild the windows of {resource}: {e}"), "")]
    return [(timeline_chart(win, t0_ns=p.t0, window_ns=p.window, view_ns=p.view),
             "The detector's windows over time: requests outstanding, completions/s against the offered load "
             "(dashed), median latency; the finding's period (past the knee) shaded."),
            (knee_chart(win, t0_ns=p.t0),
             "Each point is one window of the detector's: its concurrency (requests outstanding), completions/s "
             "and median latency. Blue windows are the baseline (at or below the knee's concurrency), red ones "
             "past the knee (at least the growth factor more outstanding, completions/s still at the plateau), "
             "purple ones collapsed; the dashed rules mark the knee and the capacity. Saturation is the red "
             "points lying flat on top and climbing below.")] + _slot_panel(p, resource)


def _slot_panel(p: Proof, resource: str) -> list[tuple[object, str]]:
    """The NFSv4.1 slot chart when the finding is NFS and SEQUENCE rows are visible (else nothing)."""
    try:
        endpoint = resource.split(" ")[0]
        server, port = endpoint.rsplit(":", 1)
        use = slots.in_use_over_time(p.cap, server.strip("[]"), int(port))
    except Exception:  # noqa: BLE001 - a proof never breaks the page
        return []
    if use.height == 0:
        return []
    return [(slots_chart(use, t0_ns=p.t0, window_ns=p.window, view_ns=p.view),
             "NFSv4.1 (RFC 8881 §2.10.6.1): each line is one session's slots in use (requests outstanding on it: a "
             "slot carries one at a time), the dashed line the slots the server accepts (its highest_slotid + 1). "
             "Lines pinned at the dashed one are sessions whose slot tables were full: their further requests "
             "waited in the client, unseen.")]
