"""The report of ``herdscope scan``: findings for people and pipelines.

The configuration (``--config``, ``--set``) is :mod:`detectors.scan_config`; the command itself
(opening, running, writing) is :mod:`detectors.scan_command`.

Output formats (``--format``):

- ``table`` (default): a capture summary, then findings grouped by severity, each with its explanation,
  time window, who and what, the measured value against its threshold, the evidence frames and the
  Wireshark command that shows them; low and informational findings one line each (at most 10 per
  detector and kind).
- ``json``: one document ``{"herdscope": VERSION, "captures": [CAPTURE...], "findings": [FINDING...],
  "incidents": [INCIDENT...]}``.
- ``ndjson``: one FINDING object per line (nothing else), for log pipelines: incidents are not records
  of their own (a reader expecting findings would misread them); each FINDING's ``incident`` names its
  incident, and ``--format json`` has the INCIDENT objects.
- ``parquet``: the findings frame with ``capture`` and ``incident`` columns (``--output`` required).
- ``junit``: JUnit XML, one test case per detector and capture, failing when it has findings at or
  above ``--fail-on`` (CI systems show these natively); a capture's incidents, when it has any, are
  the text of its test suite's ``system-out`` (incidents pass or fail nothing: their findings do).

A FINDING object has the findings-frame columns (``detectors.base.FINDING_COLUMNS``): detector, kind,
finding_id, severity, start_ns, end_ns, client, server, resource, clients, client_identity, metric,
value, threshold, unit, evidence_frames, evidence_total, explanation, parameters (an object), members,
member_ids, member_of, plus ``capture`` (the file or files it came from), ``start_time``/``end_time``
(ISO 8601 UTC) and ``incident`` (the ``incident_id`` of the incident it is part of, null for most).

An INCIDENT object (:mod:`detectors.incidents`: findings linked by time and shared participants, the
likely trigger first): ``incident_id`` (16 hex digits, stable: a hash of its findings' ids),
``capture``, ``start_ns``, ``end_ns``, ``start_time``, ``end_time``, ``severity`` (the worst of its
findings), ``trigger`` (the finding_id of the likely trigger), ``trigger_reasons`` (sentences with
the numbers: how long it precedes the others, the clients shared, the dependency evidence),
``findings`` (finding_ids in start order), ``lanes`` (``[{"lane", "protocol", "server",
"finding_ids"}]``, one per protocol and server) and ``summary`` (one line). The table prints a
capture's incidents first, each finding beneath its incident on one line (its id is the title of its
panel below).

Populations (``detectors/population.py``): a population finding (``members`` > 0) stands for many
findings of one cause at one service or across servers; ``member_ids`` names them. Every format lists
populations and ordinary findings only, and the CAPTURE's ``findings`` counts only those; with
``--expand`` each population's members follow it (``member_of`` = its id; in the table, one line each
beneath it). Members never count for ``--fail-on`` (the population's severity does).
A CAPTURE object: ``files``, ``packets``, ``first_time``, ``last_time``, ``duration_s``,
``ts_resolution_ns``, ``detectors`` (run), ``findings`` (count by severity), ``damage`` (per file, null
when clean).
"""
from __future__ import annotations

import json
import shlex

import polars as pl
from rich.markup import escape as esc
from rich.panel import Panel

from analyzer import __version__
from analyzer.render import console as make_console
from analyzer.summary import iso_time

from .base import SEVERITIES, SEVERITY_RANK, resolution_ns
from .incidents import incident_of

FORMATS = ("table", "json", "ndjson", "parquet", "junit")


def _int_if_whole(x: float):
    """JSON numbers that are integers are written as integers."""
    return int(x) if x is not None and float(x).is_integer() else x


def capture_summary(cap, files: list[str], findings: pl.DataFrame, detector_names: list[str]) -> dict:
    p = cap.packets  # its ends (a scan in partitions keeps no more of it: Capture.thin_packets)
    count = cap.packet_count
    first = int(p["ts_ns"].min()) if p.height else None
    last = int(p["ts_ns"].max()) if p.height else None
    counts = dict(findings.group_by("severity").len().iter_rows()) if findings.height else {}
    damage = [{"file": f, "reason": r.damage, "offset": r.stop_offset, "bytes_not_read": r.bytes_not_read}
              for f, r in getattr(cap, "reports", [(cap.path, cap.report)]) if r.damage is not None]
    return {
        "files": files, "packets": count, "first_time": iso_time(first), "last_time": iso_time(last),
        "duration_s": (last - first) / 1e9 if p.height else 0.0, "ts_resolution_ns": _int_if_whole(resolution_ns(cap)),
        "detectors": detector_names, "findings": {s: int(counts.get(s, 0)) for s in SEVERITIES},
        "damage": damage or None, "selection": cap.selection,
    }


def finding_records(findings: pl.DataFrame, capture_label: str, cap=None, incidents: list[dict] | None = None) -> list[dict]:
    """The findings as JSON-ready dicts; with ``cap``, ``evidence`` says per file which of that file's
    frames the evidence is (several files read as one capture number their frames on); ``incident``
    is the id of the incident (among ``incidents``) each is part of, or None."""
    part_of = incident_of(incidents or [])
    rows = []
    for r in findings.iter_rows(named=True):
        r = dict(r)
        r["severity"] = str(r["severity"])
        r["parameters"] = json.loads(r["parameters"]) if r["parameters"] else {}
        r["start_time"] = iso_time(r["start_ns"])
        r["end_time"] = iso_time(r["end_ns"])
        r["capture"] = capture_label
        frames = r["evidence_frames"] or []
        r["evidence"] = cap.frames_by_file(frames) if cap is not None else (
            [{"file": capture_label, "frames": list(frames)}] if frames else [])
        r["incident"] = part_of.get(r["finding_id"])
        rows.append(r)
    return rows


def incident_records(incidents: list[dict], capture_label: str) -> list[dict]:
    """The INCIDENT objects of one capture (``incidents.link``'s dicts with ``capture``)."""
    return [{**inc, "capture": capture_label} for inc in incidents]


def unpack(result: tuple) -> tuple[dict, list[dict], list[dict]]:
    """(summary, records, incidents) of one capture's result; a (summary, records) pair has none."""
    summary, records, *rest = result
    return summary, records, (rest[0] if rest else [])


def _title(record: dict | None, finding_id: str) -> str:
    return f"{record['detector']}/{record['kind']} {finding_id}" if record else finding_id


def incident_lines(incident: dict, records: list[dict]) -> list[str]:
    """An incident as plain lines (the table's and JUnit's): its summary, the trigger and why, then
    each finding on one line in start order, ``+seconds`` after the incident's start."""
    by_id = {r["finding_id"]: r for r in records}
    lines = [f"incident {incident['incident_id']} {incident['severity']} {incident['start_time']} .. "
             f"{incident['end_time']}: {incident['summary']}",
             f"  likely trigger {_title(by_id.get(incident['trigger']), incident['trigger'])}, because:"]
    lines += [f"    - {why}" for why in incident["trigger_reasons"]]
    for k, fid in enumerate(incident["findings"], 1):
        r = by_id.get(fid)
        if r is None:
            lines.append(f"  {k}. {fid}")
            continue
        mark = "  <- trigger" if fid == incident["trigger"] else ""
        lines.append(f"  {k}. +{(r['start_ns'] - incident['start_ns']) / 1e9:.3f} s {r['severity']} "
                     f"{_title(r, fid)} {r['server'] or r['client'] or ''} "
                     f"{r['resource'] or ''}".rstrip() + mark)
    return lines


def wireshark_filter(frames: list[int]) -> str:
    """``frame.number in {1, 2, 3}``: the set syntax of Wireshark 3.6 and later (tshark 4.0 rejects a
    set separated by spaces only)."""
    return "frame.number in {" + ", ".join(str(int(f)) for f in frames) + "}"


def wireshark_command(path: str, frames: list[int]) -> str:
    """The command line that opens these frames in Wireshark, quoted for a POSIX shell."""
    if str(path) in ("-", "<stdin>"):  # the bytes came down a pipe: name a file to save them to
        path = "SAVED-CAPTURE.pcap"
    return f"wireshark -r {shlex.quote(str(path))} -Y {shlex.quote(wireshark_filter(frames))}"


TABLE_EVIDENCE_FRAMES = 20  # frames per Wireshark command in the table (JSON and `show` have them all)


def evidence_lines(record: dict, per_command: int = TABLE_EVIDENCE_FRAMES) -> list[str]:
    """One Wireshark command per file holding evidence, each with at most ``per_command`` frames and
    "... and N more" when the list was cut (here, or by the findings frame's cap)."""
    lines = []
    listed = sum(len(e["frames"]) for e in record.get("evidence") or [])
    for e in record.get("evidence") or []:
        shown = e["frames"][:per_command]
        line = wireshark_command(e["file"], shown)
        if len(e["frames"]) > len(shown):
            line += f"  ... and {len(e['frames']) - len(shown)} more in this file"
        lines.append(line)
    beyond = (record.get("evidence_total") or 0) - listed
    if beyond > 0:
        lines.append(f"... and {beyond} more evidence frames (herdscope show {record['finding_id']} lists them all)")
    return lines


def measured(x) -> str:
    """A measured value or threshold as the table, JUnit and ``show`` print it (``n/a`` when absent)."""
    return "n/a" if x is None else f"{x:g}"


COMPACT_PER_KIND = 10  # low/informational findings listed per detector and kind in the table


def _compact(console, group: list[dict]) -> None:
    """Low and informational findings: one line each, at most COMPACT_PER_KIND per detector and kind
    (every finding is in the JSON/NDJSON/Parquet outputs)."""
    kinds: dict[tuple, list[dict]] = {}
    for r in group:
        if not r.get("member_of"):  # members (--expand) are printed beneath their population
            kinds.setdefault((r["detector"], r["kind"]), []).append(r)
    for (detector, kind), rows in kinds.items():
        for r in rows[:COMPACT_PER_KIND]:
            console.print(f"  {esc(detector)}/{esc(kind)}{esc(population_tag(r))} {r['start_time']}: "
                          f"{esc(r['explanation'])}", highlight=False)
            print_members(console, r, group)
        if len(rows) > COMPACT_PER_KIND:
            console.print(f"  [dim]... and {len(rows) - COMPACT_PER_KIND} more {esc(detector)}/{esc(kind)} "
                          f"(--format json lists them all)[/dim]")


def population_tag(r: dict) -> str:
    """What a listing adds to a population finding's title: how many findings it stands for."""
    n = r.get("members") or 0
    return f" [population of {n} finding{'s' if n != 1 else ''}]" if n else ""


def print_members(console, population: dict, records: list[dict]) -> None:
    """``--expand``: a population's members (those among ``records``), one line each, beneath it in
    ``member_ids`` order (worst first); nothing for an ordinary finding or without --expand."""
    ids = population.get("member_ids") or []
    if not ids:
        return
    by_id = {r["finding_id"]: r for r in records if r.get("member_of") == population["finding_id"]}
    for fid in ids:
        m = by_id.get(fid)
        if m is not None:
            console.print(f"    [dim]member {m['finding_id']} {m['severity']} {m['start_time']}:[/dim] "
                          f"{esc(m['explanation'])}", highlight=False)


def render_table(results: list[tuple[dict, list[dict]]], fail_on: str, console=None) -> None:
    console = console or make_console()
    colours = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "informational": "dim"}
    for result in results:
        summary, records, incidents = unpack(result)
        files = ", ".join(summary["files"])
        counts = ", ".join(f"{n} {s}" for s, n in summary["findings"].items() if n) or "no findings"
        console.print(f"[bold]{esc(files)}[/bold]: {counts}")
        span = (f" ({summary['first_time']} .. {summary['last_time']})" if summary["first_time"] else "")
        console.print(f"  {summary['packets']:,} packets over {summary['duration_s']:.3f} s{span}")
        console.print(f"  time resolution {summary['ts_resolution_ns']:g} ns; "
                      f"detectors: {', '.join(summary['detectors'])}")
        sel = summary.get("selection")
        if sel:
            parts = [f"from {iso_time(sel['start_ns'])}" if sel["start_ns"] is not None else "",
                     f"to {iso_time(sel['end_ns'])}" if sel["end_ns"] is not None else "",
                     f"hosts {', '.join(sel['hosts'])}" if sel["hosts"] else "",
                     f"ports {', '.join(map(str, sel['ports']))}" if sel["ports"] else ""]
            console.print(f"  selected {sel['packets_selected']:,} of {sel['packets_total']:,} packets "
                          f"({esc(' '.join(p for p in parts if p))})")
        for d in summary["damage"] or []:
            where = f" at byte {d['offset']:,}" if d["offset"] is not None else ""
            console.print(f"[red]damage[/red] in {esc(d['file'])}: {esc(d['reason'])}{where}")
        if incidents:
            console.rule(f"[bold]incidents ({len(incidents)})")
            for inc in incidents:
                head, *rest = incident_lines(inc, records)
                console.print(f"[{colours[inc['severity']]}]{esc(head)}[/]", highlight=False)
                for line in rest:
                    console.print(esc(line), highlight=False)
        members = [r for r in records if r.get("member_of")]  # --expand: shown beneath their population
        for severity in reversed(SEVERITIES):
            group = [r for r in records if r["severity"] == severity and not r.get("member_of")]
            if not group:
                continue
            console.rule(f"[{colours[severity]}]{severity} ({len(group)})")
            if SEVERITIES.index(severity) < SEVERITIES.index("medium"):
                _compact(console, group + members)
                continue
            for r in group:
                who = " ".join(x for x in (
                    f"client {r['client']}" if r["client"] else (f"{r['clients']} clients" if r["clients"] else ""),
                    f"server {r['server']}" if r["server"] else "",
                    f"resource {r['resource']}" if r["resource"] else "") if x)
                body = (f"{esc(r['explanation'])}\n"
                        f"[dim]{r['start_time']} .. {r['end_time']}; {esc(who)}\n"
                        f"{esc(r['metric'])} = {measured(r['value'])} {esc(r['unit'] or '')} "
                        f"(threshold {measured(r['threshold'])}); "
                        f"evidence {r['evidence_total']} frames[/dim]")
                for line in evidence_lines(r):
                    body += f"\n[dim]{esc(line)}[/dim]"
                console.print(Panel(body, title=esc(f"{r['detector']}/{r['kind']} {r['finding_id']}{population_tag(r)}"),
                                    title_align="left", border_style=colours[severity]))
                print_members(console, r, members)
        console.print()


def junit_xml(results: list[tuple[dict, list[dict]]], fail_on: str) -> str:
    """JUnit XML that CI systems display: one test suite per capture, one test case per finding
    (failing at or above ``fail_on``, passing below it, its text in ``system-out`` either way), and
    a passing case for each detector that found nothing, so every run detector shows."""
    from xml.sax.saxutils import escape, quoteattr  # lazy: loads urllib.request and http.client (junit only)

    suites, total_tests, total_failures = [], 0, 0
    for result in results:
        summary, records, incidents = unpack(result)
        label = "+".join(summary["files"])
        cases, failures = [], 0
        for det in summary["detectors"]:
            mine = [r for r in records if r["detector"] == det and not r.get("member_of")]  # members: --expand only
            for r in mine:
                text = "\n".join([r["explanation"], f"{r['start_time']} .. {r['end_time']}",
                                  f"{r['metric']} = {measured(r['value'])} {r['unit'] or ''} "
                                  f"(threshold {measured(r['threshold'])})", *evidence_lines(r)])
                name = f"{r['kind']} {r['finding_id']} [{r['severity']}]: {r['resource'] or r['server'] or ''}"
                case = f'  <testcase classname={quoteattr("herdscope." + det)} name={quoteattr(name)}>'
                if SEVERITY_RANK[r["severity"]] >= SEVERITY_RANK[fail_on]:
                    failures += 1
                    message = f"{r['severity']} (at or above {fail_on}): {r['explanation'][:200]}"
                    case += (f"\n    <failure message={quoteattr(message)} type={quoteattr(r['severity'])}>"
                             f"{escape(text)}</failure>")
                cases.append(case + f"\n    <system-out>{escape(text)}</system-out>\n  </testcase>")
            if not mine:
                cases.append(f'  <testcase classname={quoteattr("herdscope." + det)} '
                             f'name={quoteattr("no findings")}/>')
        tests = len(cases)
        total_tests += tests
        total_failures += failures
        if incidents:  # after the test cases, as the JUnit schema orders a suite's elements
            text = "\n".join(line for inc in incidents for line in incident_lines(inc, records))
            cases.append(f"  <system-out>{escape(text)}</system-out>")
        suites.append(f' <testsuite name={quoteattr("herdscope " + label)} tests="{tests}" '
                      f'failures="{failures}">\n' + "\n".join(cases) + "\n </testsuite>")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="herdscope" tests="{total_tests}" '
            f'failures="{total_failures}">\n' + "\n".join(suites) + "\n</testsuites>\n")


def render(results: list[tuple[dict, list[dict]]], findings: list[pl.DataFrame], fmt: str, fail_on: str) -> str | None:
    """The text of a format (None for table, which prints itself, and parquet, written by the caller)."""
    results = [unpack(r) for r in results]
    if fmt == "json":
        return json.dumps({"herdscope": __version__, "captures": [s for s, _, _ in results],
                           "findings": [r for _, recs, _ in results for r in recs],
                           "incidents": [i for _, _, incs in results for i in incs]}, indent=1) + "\n"
    if fmt == "ndjson":
        return "".join(json.dumps(r) + "\n" for _, recs, _ in results for r in recs)
    if fmt == "junit":
        return junit_xml(results, fail_on)
    return None
