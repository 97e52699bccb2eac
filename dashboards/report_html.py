"""The HTML report of ``herdscope report`` (issue 17, "a report that travels"): one self-contained file.

One document, for a CI artifact or a ticket attachment, that opens anywhere with nothing fetched: the
CSS is inline, every chart is an inline ``<svg>`` (:mod:`dashboards.report_svg`: the dashboard's own
Altair specs rendered offline), there is no script, no font, no image and no link out of the file
(links are in-document anchors only). Every string that comes from the capture (names, paths,
resources, explanations) is HTML-escaped.

The sections, in order:

1. the capture summary: files, packets, time span, time resolution, detectors run, findings per
   severity, selection, damage and warnings, protocols (packets per transport and service);
2. the incidents (findings linked into one causal timeline, :mod:`detectors.incidents`), trigger first,
   each with its swim lanes (:func:`dashboards.charts.incident_lanes`);
3. the findings timeline (:func:`dashboards.charts.findings_timeline`);
4. every finding, worst first (populations with their member count and a list of their members):
   its explanation, its numbers (metric = value unit against its threshold, window, who), its proof
   charts (:func:`dashboards.proofs.proof_charts`) and its Wireshark commands
   (:func:`detectors.report.evidence_lines`). Only the worst :attr:`ReportLimits.max_charts` findings
   get charts (each is tens to hundreds of kB of SVG); the others are listed in full without them,
   and the report says how many were left out;
5. the service response times (:func:`analyzer.stats.service_response_times`, as ``herdscope stats``).

The command around it (opening, running the detectors, writing the file) is
:mod:`dashboards.report_command`.
"""
from __future__ import annotations

import datetime as dt
import html
import os
from dataclasses import dataclass, field

import polars as pl

from analyzer import __version__
from analyzer.durations import fmt_ns
from analyzer.stats import LATENCY_COLUMNS, LEG_TITLES, service_response_times
from analyzer.summary import iso_time, protocols
from detectors import expanded, top_level, worst_first
from detectors.base import SEVERITIES
from detectors.report import (TABLE_EVIDENCE_FRAMES, capture_summary, evidence_lines, finding_records, measured,
                              population_tag)

from .charts import findings_timeline, incident_lanes
from .charts.base import SEVERITY_COLOURS
from .frames import time_origin
from .proofs import proof_charts
from .report_svg import ChartError, chart_svg

MAX_CHARTED_FINDINGS = 30  # findings (worst first) whose proof charts the report draws
MEMBERS_LISTED = 20  # members listed under a population finding (the rest are counted)


@dataclass(frozen=True)
class ReportLimits:
    """What bounds the report's size on a large capture.

    ``max_charts``: the worst this many findings get their proof charts (``--max-charts``; 0: none);
    every finding is still listed with its explanation, numbers and Wireshark commands.
    ``members_listed``: members named under each population finding.
    ``frames_per_command``: evidence frames per Wireshark command (as scan's table).
    """

    max_charts: int = MAX_CHARTED_FINDINGS
    members_listed: int = MEMBERS_LISTED
    frames_per_command: int = TABLE_EVIDENCE_FRAMES


@dataclass
class ReportTally:
    """What the written report holds (for the command's closing line and the tests)."""

    findings: int = 0  # findings listed (populations and ordinary ones)
    charted: int = 0  # findings whose proof charts were drawn
    charts: int = 0  # SVG charts in the document, the timeline included
    chart_failures: list[str] = field(default_factory=list)  # one line per chart that could not be drawn
    incidents: int | None = None  # None: incident linking was not available


def esc(value) -> str:
    """Text from the capture (or anywhere) for HTML content or a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def finding_anchor(finding_id: str) -> str:
    """The id of a finding's section (what the timeline, the incidents and a URL fragment point at)."""
    return f"finding-{finding_id}"


class _Figures:
    """Draws charts as inline SVG figures, each with a prefix of its own, counting them in the tally."""

    def __init__(self, tally: ReportTally):
        self.tally, self.drawn = tally, 0

    def figure(self, chart, caption: str, what: str) -> str:
        self.drawn += 1
        try:
            svg = chart_svg(chart, f"chart{self.drawn}")
        except ChartError as exc:
            return self.failed(what, str(exc))
        self.tally.charts += 1
        caption_html = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
        return f'<figure class="chart">{svg}{caption_html}</figure>'

    def failed(self, what: str, why: str) -> str:
        self.tally.chart_failures.append(f"{what}: {why}")
        return (f'<p class="chart-failed">The chart of {esc(what)} could not be drawn ({esc(why)}); the numbers '
                f'and the evidence frames are below.</p>')


def build_report(cap, files: list[str], findings: pl.DataFrame, detector_names: list[str], *,
                 incidents: list[dict] | None, title: str | None = None,
                 limits: ReportLimits = ReportLimits()) -> tuple[str, ReportTally]:
    """The whole HTML document of ``findings`` (every finding, members included, as
    :func:`detectors.run` returns them) over ``cap`` (read from ``files``), and its tally.
    ``incidents``: :func:`detectors.incidents.link`'s list, or None when it is not available."""
    tally = ReportTally(incidents=None if incidents is None else len(incidents))
    figures = _Figures(tally)
    top = worst_first(top_level(findings))
    label = "+".join(files)
    records = finding_records(top, label, cap)
    tally.findings = len(records)
    summary = capture_summary(cap, files, top, detector_names)
    summary["warnings"] = list(getattr(cap, "warnings", []))
    t0_ns, t1_ns = time_origin(cap)
    title = title or f"herdscope report: {', '.join(os.path.basename(f) for f in files)}"
    body = [f"<header><h1>{esc(title)}</h1><p class=\"meta\">herdscope {esc(__version__)}, written "
            f"{dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}</p></header>",
            _contents(records, incidents),
            summary_section(summary, protocols(cap.packets)),
            incidents_section(incidents, {r["finding_id"]: r for r in records},
                              lambda inc: _lanes(inc, top, t0_ns, figures)),
            timeline_section(top, t0_ns, t1_ns, figures)]
    findings_html = []
    members = expanded(findings).filter(pl.col("member_of").is_not_null())
    for rank, (row, record) in enumerate(zip(top.iter_rows(named=True), records)):
        charts_html = None
        if rank < limits.max_charts:
            charts_html = _proofs(cap, row, findings, figures)
            tally.charted += 1
        findings_html.append(finding_section(record, t0_ns, charts_html, members, limits))
    body.append(_findings_block(findings_html, len(records), limits.max_charts))
    body.append(srt_section(service_response_times(cap)))
    body.append(_closing_notes(tally, len(records), limits.max_charts))
    return _page(title, "\n".join(body)), tally


def _lanes(incident: dict, top: pl.DataFrame, t0_ns: int, figures: _Figures) -> str:
    """The incident's swim lanes (:func:`dashboards.charts.incident_lanes`, as the Overview draws them)."""
    what = f"incident {incident.get('incident_id')}"
    try:
        chart = incident_lanes(incident, top, t0_ns=t0_ns)
    except Exception as exc:  # noqa: BLE001 - a chart that cannot be built must not stop the report
        return figures.failed(what, f"{type(exc).__name__}: {exc}")
    return figures.figure(chart, "One lane per protocol and server, a bar per finding; the likely trigger outlined.",
                          what)


def _proofs(cap, row: dict, findings: pl.DataFrame, figures: _Figures) -> str:
    what = f"{row['detector']}/{row['kind']} {row['finding_id']}"
    try:
        proofs = proof_charts(cap, row, findings)
    except Exception as exc:  # noqa: BLE001 - as the dashboard: one chart's failure must not hide the rest
        return figures.failed(what, f"{type(exc).__name__}: {exc}")
    return "\n".join(figures.figure(chart, caption, what) for chart, caption in proofs)


# -- the sections -------------------------------------------------------------------------------------

def _contents(records: list[dict], incidents: list[dict] | None) -> str:
    items = ['<li><a href="#summary">Capture</a></li>', '<li><a href="#incidents">Incidents'
             + (f" ({len(incidents)})" if incidents else "") + "</a></li>",
             '<li><a href="#timeline">Findings timeline</a></li>',
             f'<li><a href="#findings">Findings ({len(records)})</a></li>',
             '<li><a href="#srt">Service response times</a></li>']
    return f'<nav><ul>{"".join(items)}</ul></nav>'


def summary_section(s: dict, protocol_packets: dict[str, dict[str, int]]) -> str:
    """The capture: what was read, when, how finely timed, what was found, what went wrong reading it."""
    counts = ", ".join(f'<span class="sev sev-{esc(sv)}">{n} {esc(sv)}</span>'
                       for sv, n in reversed(list(s["findings"].items())) if n) or "no findings"
    span = (f"{esc(s['first_time'])} .. {esc(s['last_time'])} ({fmt_ns(s['duration_s'] * 1e9)})"
            if s["first_time"] else "no packets")
    rows = [("files", "<br>".join(f"<code>{esc(f)}</code>" for f in s["files"])),
            ("packets", f"{s['packets']:,}"), ("time span", span),
            ("time resolution", esc(fmt_ns(s["ts_resolution_ns"])) if s["ts_resolution_ns"] is not None else "n/a"),
            ("detectors run", esc(", ".join(s["detectors"]))), ("findings", counts)]
    sel = s.get("selection")
    if sel:
        parts = [f"from {iso_time(sel['start_ns'])}" if sel.get("start_ns") is not None else "",
                 f"to {iso_time(sel['end_ns'])}" if sel.get("end_ns") is not None else "",
                 f"hosts {', '.join(map(str, sel['hosts']))}" if sel.get("hosts") else "",
                 f"ports {', '.join(map(str, sel['ports']))}" if sel.get("ports") else ""]
        rows.append(("selection", f"{sel['packets_selected']:,} of {sel['packets_total']:,} packets "
                                  f"({esc(' '.join(p for p in parts if p))})"))
    for d in s.get("damage") or []:
        where = f" at byte {d['offset']:,} ({d['bytes_not_read']:,} bytes not read)" if d.get("offset") is not None else ""
        rows.append(("damage", f'<span class="warn">{esc(d["file"])}: {esc(d["reason"])}{where}</span>'))
    for w in s.get("warnings") or []:
        rows.append(("warning", f'<span class="warn">{esc(w)}</span>'))
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    proto_rows = "".join(f"<tr><td>{esc(t)}</td><td>{esc(svc)}</td><td class=\"num\">{n:,}</td></tr>"
                         for t, services in protocol_packets.items() for svc, n in services.items())
    protos = (f'<table class="grid"><thead><tr><th>transport</th><th>service</th><th>packets</th></tr></thead>'
              f"<tbody>{proto_rows}</tbody></table>" if proto_rows else "<p>No packets.</p>")
    return (f'<section id="summary"><h2>Capture</h2><table class="facts">{table}</table>'
            f"<h3>Protocols</h3>{protos}</section>")


def incidents_section(incidents: list[dict] | None, by_id: dict[str, dict], lanes=None) -> str:
    """Findings linked into incidents, each with its likely trigger first and why; ``lanes``
    (incident -> HTML), when given, draws each incident's swim lanes."""
    head = '<section id="incidents"><h2>Incidents</h2>'
    if incidents is None:  # the caller linked none (build_report without the incident linker)
        return head + ('<p class="note" id="incidents-unavailable">Incident linking is not available in this '
                       'build of herdscope (detectors.incidents): the findings below are not grouped.</p></section>')
    if not incidents:
        return head + "<p>No incident: no two findings are linked (by time and by shared clients or servers).</p></section>"
    parts = [head]
    for inc in incidents:
        trigger = inc.get("trigger")
        reasons = "".join(f"<li>{esc(r)}</li>" for r in inc.get("trigger_reasons") or [])
        lane_rows = "".join(
            f"<tr><td>{esc(lane.get('lane'))}</td><td>{esc(lane.get('protocol'))}</td><td>{esc(lane.get('server'))}</td>"
            f"<td>{' '.join(_finding_link(f, by_id) for f in lane.get('finding_ids') or [])}</td></tr>"
            for lane in inc.get("lanes") or [])
        order = " → ".join(_finding_link(f, by_id) for f in inc.get("findings") or [])
        sev = str(inc.get("severity") or "")
        parts.append(
            f'<article class="incident sev-border-{esc(sev)}" id="incident-{esc(inc.get("incident_id"))}">'
            f'<h3><span class="sev sev-{esc(sev)}">{esc(sev)}</span> incident {esc(inc.get("incident_id"))}</h3>'
            f"<p>{esc(inc.get('summary'))}</p>"
            f"<p class=\"meta\">{esc(inc.get('start_time'))} .. {esc(inc.get('end_time'))}</p>"
            f"<p><b>likely trigger</b>: {_finding_link(trigger, by_id) if trigger else 'none named'}</p>"
            + (f"<ul>{reasons}</ul>" if reasons else "")
            + f"<p><b>findings in start order</b>: {order}</p>"
            + (f'<table class="grid"><thead><tr><th>lane</th><th>protocol</th><th>server</th><th>findings</th></tr>'
               f"</thead><tbody>{lane_rows}</tbody></table>" if lane_rows else "")
            + (lanes(inc) if lanes is not None else "") + "</article>")
    return "\n".join(parts) + "</section>"


def _finding_link(finding_id: str, by_id: dict[str, dict]) -> str:
    r = by_id.get(finding_id)
    text = f"{r['detector']}/{r['kind']} {finding_id}" if r else finding_id
    return f'<a href="#{esc(finding_anchor(finding_id))}">{esc(text)}</a>' if r else f"<code>{esc(text)}</code>"


def timeline_section(top: pl.DataFrame, t0_ns: int, t1_ns: int, figures: _Figures) -> str:
    head = '<section id="timeline"><h2>Findings timeline</h2>'
    if top.height == 0:
        return head + "<p>No findings.</p></section>"
    chart = findings_timeline(top, t0_ns=t0_ns, t1_ns=t1_ns)
    return head + figures.figure(chart, "Every finding from its start to its end, coloured by severity.",
                                 "the findings timeline") + "</section>"


def finding_section(r: dict, t0_ns: int, charts_html: str | None, members: pl.DataFrame,
                    limits: ReportLimits) -> str:
    """One finding: what, its numbers, its proof (``charts_html``; None: left out by the limit), its
    Wireshark commands and, for a population, its members."""
    sev = str(r["severity"])
    fid = r["finding_id"]
    unit = f" {r['unit']}" if r["unit"] else ""
    who = [("client", r["client"]), ("server", r["server"]), ("resource", r["resource"]),
           ("clients", f"{r['clients']:,}" + (f" (told apart by {r['client_identity']})" if r.get("client_identity")
                                              else "") if r["clients"] is not None else None)]
    window = (f"{esc(r['start_time'])} .. {esc(r['end_time'])} ({(r['start_ns'] - t0_ns) / 1e9:.6f} s .. "
              f"{(r['end_ns'] - t0_ns) / 1e9:.6f} s after the first packet; {fmt_ns(r['end_ns'] - r['start_ns'])})")
    facts = [("measured", f"<code>{esc(r['metric'])} = {esc(measured(r['value']))}{esc(unit)}</code> (threshold "
                          f"{esc(measured(r['threshold']))}{esc(unit)})"), ("window", window)]
    facts += [(k, f"<code>{esc(v)}</code>") for k, v in who if v]
    facts.append(("evidence", f"{r['evidence_total'] or 0:,} frames"))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    if charts_html is None:
        proof = (f'<p class="note">Proof chart left out: only the worst {limits.max_charts} findings get charts '
                 f"(--max-charts).</p>")
    else:
        proof = charts_html or '<p class="note">This finding has no proof chart.</p>'
    commands = evidence_lines(r, limits.frames_per_command)
    wireshark = (f'<h4>Wireshark</h4><pre class="cmd">{esc(chr(10).join(commands))}</pre>' if commands else "")
    title = f"{r['detector']}/{r['kind']} {fid}{population_tag(r)}"
    return (f'<section class="finding sev-border-{esc(sev)}" id="{esc(finding_anchor(fid))}" '
            f'data-finding-id="{esc(fid)}" data-charted="{"yes" if charts_html is not None else "no"}">'
            f'<h3><span class="sev sev-{esc(sev)}">{esc(sev)}</span> {esc(title)}</h3>'
            f'<p class="explanation">{esc(r["explanation"])}</p><dl>{dl}</dl>{proof}{wireshark}'
            f"{_members(r, members, t0_ns, limits.members_listed)}</section>")


def _members(r: dict, members: pl.DataFrame, t0_ns: int, listed: int) -> str:
    n = r.get("members") or 0
    if not n:
        return ""
    mine = members.filter(pl.col("member_of") == r["finding_id"])
    items = "".join(f"<li><code>{esc(m['finding_id'])}</code> {esc(m['severity'])} at "
                    f"{(m['start_ns'] - t0_ns) / 1e9:.3f} s: {esc(m['explanation'])}</li>"
                    for m in mine.head(listed).iter_rows(named=True))
    more = f"<p>... and {n - min(listed, mine.height):,} more.</p>" if n > min(listed, mine.height) else ""
    return (f"<details><summary>Members ({n:,}): the findings this population stands for, worst first</summary>"
            f"<ul>{items}</ul>{more}</details>")


def _findings_block(sections: list[str], total: int, max_charts: int) -> str:
    head = f'<section id="findings"><h2>Findings ({total:,})</h2>'
    if not sections:
        return head + "<p>No findings.</p></section>"
    note = (f'<p class="note">Worst first. The worst {max_charts} have their proof charts; the other '
            f"{total - max_charts:,} are listed without (--max-charts).</p>" if total > max_charts else
            '<p class="note">Worst first.</p>')
    return head + note + "\n".join(sections) + "</section>"


def srt_section(stats: pl.DataFrame) -> str:
    """The service response times, one table per protocol and leg, as ``herdscope stats`` prints them."""
    head = '<section id="srt"><h2>Service response times</h2>'
    if stats.height == 0:
        return head + "<p>No request/response transactions were decoded in this capture.</p></section>"
    counts = ("count", "answered", "unanswered", "errors")
    header = "".join(f"<th>{c}</th>" for c in ("protocol", "operation", *counts, *LATENCY_COLUMNS))
    rows = []
    for r in stats.iter_rows(named=True):
        name = r["protocol"] + (f" ({LEG_TITLES.get(r['leg'], r['leg'])})" if r.get("leg") else "")
        cells = [esc(name), esc(r["operation"])] + [f"{r[c]:,}" for c in counts] + [
            esc(fmt_ns(r[c])) if r[c] is not None else "–" for c in LATENCY_COLUMNS]
        rows.append("<tr>" + "".join(f'<td{" class=num" if k >= 2 else ""}>{v}</td>' for k, v in enumerate(cells))
                    + "</tr>")
    return (head + f'<table class="grid"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            '<p class="note">Quantiles are observed values (the "higher" rule); unanswered requests have no '
            "latency.</p></section>")


def _closing_notes(tally: ReportTally, total: int, max_charts: int) -> str:
    notes = []
    if total > max_charts:
        notes.append(f"{total - max_charts:,} findings are listed without proof charts (only the worst {max_charts} "
                     f"get them: --max-charts).")
    if tally.chart_failures:
        notes.append(f"{len(tally.chart_failures)} chart(s) could not be drawn: "
                     + "; ".join(esc(f) for f in tally.chart_failures[:10]))
    if not notes:
        return ""
    return '<section id="left-out"><h2>Left out</h2><ul>' + "".join(f"<li>{n}</li>" for n in notes) + "</ul></section>"


# -- the page -----------------------------------------------------------------------------------------

def _css() -> str:
    severity = "".join(f".sev-{s}{{background:{c};}}.sev-border-{s}{{border-left-color:{c};}}"
                       for s, c in zip(SEVERITIES, SEVERITY_COLOURS))
    return (
        "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:0 auto;"
        "max-width:1100px;padding:1em 2em;color:#222;line-height:1.4;background:#fff}"
        "h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"
        "h3{margin:.2em 0}h4{margin:.8em 0 .2em}.meta{color:#666;font-size:.9em}"
        "nav ul{list-style:none;padding:0;display:flex;gap:1.2em;flex-wrap:wrap}a{color:#1f5fa8}"
        "table{border-collapse:collapse;margin:.4em 0}th,td{padding:.2em .6em;text-align:left;vertical-align:top}"
        ".facts th{color:#555;font-weight:600;white-space:nowrap}.grid th,.grid td{border:1px solid #ddd}"
        ".grid thead th{background:#f4f4f4}.num{text-align:right;font-variant-numeric:tabular-nums}"
        ".sev{color:#fff;border-radius:3px;padding:0 .4em;font-size:.85em;font-weight:600;text-transform:uppercase}"
        ".finding,.incident{border-left:6px solid #999;padding:.4em 1em;margin:1.2em 0;background:#fafafa}"
        ".explanation{font-size:1.05em}dl{display:grid;grid-template-columns:max-content 1fr;gap:.1em 1em}"
        "dt{color:#555;font-weight:600}dd{margin:0;overflow-wrap:anywhere}"
        "code,pre{font-family:ui-monospace,'DejaVu Sans Mono',monospace;font-size:.88em}"
        "pre.cmd{background:#272822;color:#f8f8f2;padding:.6em;white-space:pre-wrap;overflow-wrap:anywhere}"
        "figure.chart{margin:.6em 0 .6em 1.5em}figure.chart svg{max-width:100%;height:auto;display:block;overflow:visible}"
        "figcaption{color:#555;font-size:.9em}.note{color:#8a5a00}.warn{color:#b00020}"
        ".chart-failed{color:#b00020;border:1px dashed #b00020;padding:.4em}"
        "@media print{nav{display:none}.finding,.incident{break-inside:avoid}}" + severity)


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{_css()}</style></head>\n<body>\n{body}\n</body></html>\n")
