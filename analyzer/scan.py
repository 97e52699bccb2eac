"""``herdscope scan``: run the detectors over captures and report findings for people and pipelines.

Output formats (``--format``):

- ``table`` (default): a capture summary, then findings grouped by severity, each with its explanation,
  time window, who and what, the measured value against its threshold, the evidence frames and the
  Wireshark command that shows them; low and informational findings one line each (at most 10 per
  detector and kind).
- ``json``: one document ``{"herdscope": VERSION, "captures": [CAPTURE...], "findings": [FINDING...]}``.
- ``ndjson``: one FINDING object per line (nothing else), for log pipelines.
- ``parquet``: the findings frame (``--output`` required).
- ``junit``: JUnit XML, one test case per detector and capture, failing when it has findings at or
  above ``--fail-on`` (CI systems show these natively).

A FINDING object has the findings-frame columns (``detectors.base.FINDING_COLUMNS``): detector, kind,
finding_id, severity, start_ns, end_ns, client, server, resource, clients, client_identity, metric,
value, threshold, unit, evidence_frames, evidence_total, explanation, parameters (an object), plus
``capture`` (the file or files it came from) and ``start_time``/``end_time`` (ISO 8601 UTC).
A CAPTURE object: ``files``, ``packets``, ``first_time``, ``last_time``, ``duration_s``,
``ts_resolution_ns``, ``detectors`` (run), ``findings`` (count by severity), ``damage`` (per file, null
when clean).
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

import polars as pl

from . import __version__
from .summary import _iso

FORMATS = ("table", "json", "ndjson", "parquet", "junit")


@dataclass
class ScanConfig:
    detectors: list[str] | None = None
    overrides: dict[str, object] = field(default_factory=dict)
    fail_on: str = "high"


def load_config(path: str | None, sets: tuple[str, ...], detectors: str | None, fail_on: str | None) -> ScanConfig:
    """Config file first, then the command line. The file::

        [scan]
        detectors = ["herd", "retry_storm"]
        fail_on = "medium"

        [herd]
        min_clients = 50
    """
    cfg = ScanConfig()
    if path:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
        scan = doc.pop("scan", {})
        cfg.detectors = scan.get("detectors", cfg.detectors)
        cfg.fail_on = scan.get("fail_on", cfg.fail_on)
        for owner, table in doc.items():
            if not isinstance(table, dict):
                raise ValueError(f"{path}: [{owner}] must be a table of parameters")
            for name, value in table.items():
                cfg.overrides[f"{owner}.{name}"] = value
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ValueError(f"--set {item!r}: expected DETECTOR.PARAMETER=VALUE")
        cfg.overrides[key.strip()] = value.strip()
    if detectors:
        cfg.detectors = [d.strip() for d in detectors.split(",") if d.strip()]
    if fail_on:
        cfg.fail_on = fail_on
    return cfg


def capture_summary(cap, files: list[str], findings: pl.DataFrame, detector_names: list[str]) -> dict:
    from detectors.base import SEVERITIES, resolution_ns

    p = cap.packets
    first = int(p["ts_ns"].min()) if p.height else None
    last = int(p["ts_ns"].max()) if p.height else None
    counts = dict(findings.group_by("severity").len().iter_rows()) if findings.height else {}
    damage = [{"file": f, "reason": r.stop, "offset": r.stop_offset, "bytes_not_read": r.bytes_not_read}
              for f, r in getattr(cap, "reports", [(cap.path, cap.report)]) if r.stop_offset is not None]
    return {
        "files": files, "packets": p.height, "first_time": _iso(first), "last_time": _iso(last),
        "duration_s": (last - first) / 1e9 if p.height else 0.0, "ts_resolution_ns": resolution_ns(cap),
        "detectors": detector_names, "findings": {s: int(counts.get(s, 0)) for s in SEVERITIES},
        "damage": damage or None,
    }


def finding_records(findings: pl.DataFrame, capture_label: str) -> list[dict]:
    rows = []
    for r in findings.iter_rows(named=True):
        r = dict(r)
        r["severity"] = str(r["severity"])
        r["parameters"] = json.loads(r["parameters"]) if r["parameters"] else {}
        r["start_time"] = _iso(r["start_ns"])
        r["end_time"] = _iso(r["end_ns"])
        r["capture"] = capture_label
        rows.append(r)
    return rows


def wireshark_filter(frames: list[int]) -> str:
    """``frame.number in {1, 2, 3}``: the set syntax of Wireshark 3.6 and later (tshark 4.0 rejects a
    set separated by spaces only)."""
    return "frame.number in {" + ", ".join(str(int(f)) for f in frames) + "}"


def wireshark_command(path: str, frames: list[int]) -> str:
    """The command line that opens these frames in Wireshark, quoted for a POSIX shell."""
    import shlex

    return f"wireshark -r {shlex.quote(str(path))} -Y {shlex.quote(wireshark_filter(frames))}"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:g}"


COMPACT_PER_KIND = 10  # low/informational findings listed per detector and kind in the table


def _compact(console, group: list[dict]) -> None:
    """Low and informational findings: one line each, at most COMPACT_PER_KIND per detector and kind
    (every finding is in the JSON/NDJSON/Parquet outputs)."""
    from rich.markup import escape as esc

    kinds: dict[tuple, list[dict]] = {}
    for r in group:
        kinds.setdefault((r["detector"], r["kind"]), []).append(r)
    for (detector, kind), rows in kinds.items():
        for r in rows[:COMPACT_PER_KIND]:
            console.print(f"  {esc(detector)}/{esc(kind)} {r['start_time']}: {esc(r['explanation'])}", highlight=False)
        if len(rows) > COMPACT_PER_KIND:
            console.print(f"  [dim]... and {len(rows) - COMPACT_PER_KIND} more {esc(detector)}/{esc(kind)} "
                          f"(--format json lists them all)[/dim]")


def render_table(results: list[tuple[dict, list[dict]]], fail_on: str, console=None) -> None:
    from rich.markup import escape as esc
    from rich.panel import Panel

    from detectors.base import SEVERITIES

    from .render import console as make_console

    console = console or make_console()
    colours = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "informational": "dim"}
    for summary, records in results:
        files = ", ".join(summary["files"])
        counts = ", ".join(f"{n} {s}" for s, n in summary["findings"].items() if n) or "no findings"
        console.print(f"[bold]{files}[/bold]: {summary['packets']:,} packets over {summary['duration_s']:.3f} s "
                      f"({summary['first_time']} .. {summary['last_time']}), time resolution "
                      f"{summary['ts_resolution_ns']:g} ns; detectors: {', '.join(summary['detectors'])}; {counts}")
        for d in summary["damage"] or []:
            console.print(f"[red]damage[/red] in {d['file']}: {d['reason']} at byte {d['offset']:,}")
        for severity in reversed(SEVERITIES):
            group = [r for r in records if r["severity"] == severity]
            if not group:
                continue
            console.rule(f"[{colours[severity]}]{severity} ({len(group)})")
            if SEVERITIES.index(severity) < SEVERITIES.index("medium"):
                _compact(console, group)
                continue
            for r in group:
                who = " ".join(x for x in (
                    f"client {r['client']}" if r["client"] else (f"{r['clients']} clients" if r["clients"] else ""),
                    f"server {r['server']}" if r["server"] else "",
                    f"resource {r['resource']}" if r["resource"] else "") if x)
                body = (f"{esc(r['explanation'])}\n"
                        f"[dim]{r['start_time']} .. {r['end_time']}; {esc(who)}\n"
                        f"{esc(r['metric'])} = {_num(r['value'])} {esc(r['unit'] or '')} "
                        f"(threshold {_num(r['threshold'])}); "
                        f"evidence {r['evidence_total']} frames[/dim]")
                if r["evidence_frames"]:
                    body += f"\n[dim]{esc(wireshark_command(summary['files'][0], r['evidence_frames'][:20]))}[/dim]"
                console.print(Panel(body, title=esc(f"{r['detector']}/{r['kind']} {r['finding_id']}"),
                                    title_align="left", border_style=colours[severity]))
        console.print()


def junit_xml(results: list[tuple[dict, list[dict]]], fail_on: str) -> str:
    from detectors.base import SEVERITY_RANK

    cases = []
    failures = 0
    for summary, records in results:
        label = "+".join(summary["files"])
        for det in summary["detectors"]:
            mine = [r for r in records if r["detector"] == det]
            bad = [r for r in mine if SEVERITY_RANK[r["severity"]] >= SEVERITY_RANK[fail_on]]
            case = f'  <testcase classname={quoteattr("herdscope." + det)} name={quoteattr(label)}>'
            if bad:
                failures += 1
                text = "\n".join(f"[{r['severity']}] {r['explanation']} (frames {r['evidence_frames'][:10]})"
                                 for r in bad)
                case += (f'\n    <failure message={quoteattr(f"{len(bad)} finding(s) at or above {fail_on}")}>'
                         f"{escape(text)}</failure>\n  ")
            elif mine:
                case += f"\n    <system-out>{escape(chr(10).join(r['explanation'] for r in mine))}</system-out>\n  "
            cases.append(case + "</testcase>")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="herdscope" tests="{len(cases)}" '
            f'failures="{failures}">\n' + "\n".join(cases) + "\n</testsuite>\n")


def render(results: list[tuple[dict, list[dict]]], findings: list[pl.DataFrame], fmt: str, fail_on: str) -> str | None:
    """The text of a format (None for table, which prints itself, and parquet, written by the caller)."""
    if fmt == "json":
        return json.dumps({"herdscope": __version__, "captures": [s for s, _ in results],
                           "findings": [r for _, recs in results for r in recs]}, indent=1) + "\n"
    if fmt == "ndjson":
        return "".join(json.dumps(r) + "\n" for _, recs in results for r in recs)
    if fmt == "junit":
        return junit_xml(results, fail_on)
    return None
