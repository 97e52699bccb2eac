"""Altair chart -> inline SVG for the HTML report (``herdscope report``), offline, with vl-convert.

The report draws the dashboard's own charts (:mod:`dashboards.proofs`, :mod:`dashboards.charts`): the
same Vega-Lite specs, rendered here by ``vl-convert-python`` (Vega in an embedded JavaScript engine: no
browser, and ``allowed_base_urls=[]`` so that it may not fetch anything) into SVG text that the
document holds inline. Three things differ from the dashboard's browser:

- ``width: "container"`` (charts that stretch to the page) has no container here: such a chart gets
  :data:`CHART_WIDTH_PX`.
- Vega names its clip paths ``clip1``, ``clip2``, ... in every SVG; many SVGs in one HTML document
  would point at each other's clips, so every ``id`` (and each ``url(#…)``/``href="#…"`` to it) gets
  the chart's own prefix (:func:`scoped_ids`).
- Interaction (zoom, tooltips, clicks) is gone: the SVG is the view the dashboard opens on, and the
  subtitles lose their "scroll to zoom out" hint (:func:`static_subtitles`).

A chart that fails to convert raises :class:`ChartError` with one line saying why; the report puts a
note in its place and counts it (:mod:`dashboards.report_html`).
"""
from __future__ import annotations

import json
import re

import altair as alt
import vl_convert

from .charts.base import zoom_note

CHART_WIDTH_PX = 900  # the width of a chart that stretches to its container in the dashboard
_ID = re.compile(r'\bid="([^"]+)"')
_REFERENCE = re.compile(r'(url\(#|href="#)([^)"]+)')
# what zoom_note says after its colon: how to zoom a chart in the browser
INTERACTION_HINT = zoom_note((0, 1), None).split(": ", 1)[1]
_SPEC_TREES = ("layer", "vconcat", "hconcat", "concat", "spec")  # where sub-views sit in a Vega-Lite spec


class ChartError(Exception):
    """A chart that vl-convert could not render (the message says which and why, in one line)."""


def vega_lite_version() -> str | None:
    """The Vega-Lite version Altair writes its specs for, as vl-convert names it ("6.4"), when
    vl-convert bundles it; None (vl-convert's default) otherwise."""
    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return major_minor if major_minor in vl_convert.get_vegalite_versions() else None


def views(spec: dict):
    """``spec`` and every view nested in it (layers, concatenations, facets' specs); not the data."""
    yield spec
    for key in _SPEC_TREES:
        sub = spec.get(key)
        for view in (sub if isinstance(sub, list) else [sub] if isinstance(sub, dict) else []):
            if isinstance(view, dict):
                yield from views(view)


def fixed_width(spec: dict, width_px: int = CHART_WIDTH_PX) -> dict:
    """``spec`` (a Vega-Lite dict, changed in place and returned) with every ``width: "container"``
    of it and its sub-views set to ``width_px``; the data is not walked."""
    for view in views(spec):
        if view.get("width") == "container":
            view["width"] = width_px
    return spec


def static_subtitles(spec: dict) -> dict:
    """``spec`` (changed in place and returned) without the dashboard's "scroll to zoom out, drag to
    pan, ..." hint in its subtitles (:func:`dashboards.charts.base.zoom_note`): an SVG does not zoom."""
    for view in views(spec):
        title = view.get("title")
        if isinstance(title, dict) and isinstance(title.get("subtitle"), list):
            title["subtitle"] = [line.replace(f": {INTERACTION_HINT}", "") if isinstance(line, str) else line
                                 for line in title["subtitle"]]
    return spec


def scoped_ids(svg: str, prefix: str) -> str:
    """``svg`` with every element id and every in-document reference to one prefixed by ``prefix``
    (unique per chart in a document), so that two SVGs' ``clip1`` stay apart."""
    svg = _ID.sub(lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    return _REFERENCE.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", svg)


def chart_svg(chart, prefix: str, width_px: int = CHART_WIDTH_PX) -> str:
    """The SVG text of an Altair chart (or a Vega-Lite dict), ids scoped by ``prefix``.

    Raises :class:`ChartError` when the spec cannot be built or rendered (any error of Altair or of
    the Vega engine: a chart that cannot be drawn must not stop the report)."""
    try:
        spec = chart if isinstance(chart, dict) else chart.to_dict(validate=False)
        spec = static_subtitles(fixed_width(json.loads(json.dumps(spec)), width_px))  # a copy: the chart is left alone
        svg = vl_convert.vegalite_to_svg(spec, vl_version=vega_lite_version(), allowed_base_urls=[])
    except Exception as exc:  # noqa: BLE001 - vl-convert raises plain ValueError/RuntimeError with Vega's message
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ChartError(f"{type(exc).__name__}: {first_line}") from exc
    return scoped_ids(svg, prefix)
