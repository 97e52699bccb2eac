"""``herdscope show FINDING_ID FILE...``: one finding in full.

The detectors run again on the same files with the same options (a finding id depends on both), with
the evidence cap lifted, and the finding is printed with every evidence frame per file, the Wireshark
command of each file, tshark's one-line summary of each evidence frame when tshark is installed, and
a population finding's members.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from rich.markup import escape as esc

from analyzer.render import console as make_console

from . import available, incident_params, incidents, run
from .base import uncapped_evidence
from .params import fields_of, format_value
from .report import finding_records, measured, wireshark_command, wireshark_filter

TSHARK_TIMEOUT_S = 120  # per file; a summary that takes longer is left out, with a note
TSHARK_MAX_FRAMES = 2_000  # evidence frames summarised per file (the rest are listed, not summarised)
MIN_PREFIX = 4  # hex digits an abbreviated id needs


def check_id(finding_id: str) -> str | None:
    """None when ``finding_id`` has the form of an id (or a prefix of one), else why not."""
    if re.fullmatch(r"[0-9a-f]{%d,16}" % MIN_PREFIX, finding_id.strip().lower()):
        return None
    return (f"{finding_id!r} is not a finding id (16 hex digits as scan prints them, or a unique prefix "
            f"of at least {MIN_PREFIX})")


def find_finding(cap, files, finding_id: str, cfg) -> tuple[dict, list[dict]] | str:
    """(the finding's record, its member findings' records) in the opened capture ``cap`` of
    ``files``, or a sentence saying why not."""
    why = check_id(finding_id)
    if why:
        return why
    wanted = finding_id.strip().lower()
    group = list(files)
    with uncapped_evidence():
        findings = run(cap, only=cfg.detectors, overrides=cfg.overrides)
    linked = incidents.link(findings, cap, incident_params(cfg.overrides))  # as scan links (its evidence cap)
    records = finding_records(findings, "+".join(group), cap, linked)
    matches = [r for r in records if r["finding_id"].startswith(wanted)]
    if not matches:
        return (f"no finding {finding_id} in {' '.join(group)} with these options ({len(records)} findings; "
                f"ids depend on the files and the detector options: give show the ones given to scan)")
    if len(matches) > 1:
        return f"{finding_id} is ambiguous: {', '.join(r['finding_id'] for r in matches)}"
    record = matches[0]
    members = [r for r in records if r.get("member_of") == record["finding_id"]]
    return record, members


def tshark_summaries(record: dict) -> list[dict] | None:
    """Per evidence file: tshark's one-line summary of each evidence frame (``{"file", "lines",
    "note"}``), or None when tshark is not installed."""
    tshark = shutil.which("tshark")
    if tshark is None:
        return None
    out = []
    for e in record["evidence"]:
        if not os.path.isfile(e["file"]):  # "-", a FIFO, <(...): its bytes are gone, tshark cannot re-read them
            out.append({"file": e["file"], "lines": [], "note": "read from a pipe, which tshark cannot read again: "
                                                             "save the capture to a file for tshark's summaries"})
            continue
        frames = e["frames"][:TSHARK_MAX_FRAMES]
        note = None
        if len(e["frames"]) > len(frames):
            note = f"summarised the first {len(frames)} of {len(e['frames'])} frames"
        try:
            done = subprocess.run([tshark, "-n", "-r", e["file"], "-Y", wireshark_filter(frames)],
                                  capture_output=True, text=True, timeout=TSHARK_TIMEOUT_S, check=False)
            lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
            if done.returncode != 0 and not lines:
                note = f"tshark failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
        except subprocess.TimeoutExpired:
            lines, note = [], f"tshark took longer than {TSHARK_TIMEOUT_S} s; left out"
        out.append({"file": e["file"], "lines": lines, "note": note})
    return out


def _parameters_text(record: dict) -> str:
    """The finding's parameters as --set would take them (durations with units)."""
    module = available().get(record["detector"])
    fields = {f.name: f for f in fields_of(module.Params)} if module else {}
    values = record["parameters"]
    return ", ".join(f"{k}={format_value(fields[k], frozenset(v) if isinstance(v, list) else v) if k in fields else v}"
                     for k, v in sorted(values.items()))


def print_finding(record: dict, members: list[dict], summaries: list[dict] | None, console=None) -> None:
    console = console or make_console()
    console.print(f"[bold]{esc(record['detector'])}/{esc(record['kind'])} {record['finding_id']}[/bold] "
                  f"({record['severity']})")
    console.print(esc(record["explanation"]))
    rows = [("when", f"{record['start_time']} .. {record['end_time']}"),
            ("client", record["client"]), ("server", record["server"]), ("resource", record["resource"]),
            ("clients", record["clients"]), ("client identity", record["client_identity"]),
            ("measured", f"{record['metric']} = {measured(record['value'])} {record['unit'] or ''} "
                         f"(threshold {measured(record['threshold'])})"),
            ("members", record.get("members") or None),
            ("incident", record.get("incident")),
            ("capture", record["capture"]),
            ("parameters", _parameters_text(record))]
    for name, value in rows:
        if value not in (None, ""):
            console.print(f"  [dim]{name}:[/dim] {esc(str(value))}")
    console.print(f"  [dim]evidence:[/dim] {record['evidence_total']} frames")
    by_file = {s["file"]: s for s in summaries or []}
    for e in record["evidence"]:
        console.print(f"  [bold]{esc(e['file'])}[/bold]: frames {', '.join(map(str, e['frames']))}")
        console.print(f"    {esc(wireshark_command(e['file'], e['frames']))}")
        s = by_file.get(e["file"])
        if s:
            for line in s["lines"]:
                console.print(f"    {esc(line)}", soft_wrap=True)
            if s["note"]:
                console.print(f"    [dim]{esc(s['note'])}[/dim]")
    if summaries is None:
        console.print("  [dim](install tshark for a one-line summary of each evidence frame)[/dim]")
    if members:
        console.print(f"[bold]members ({len(members)})[/bold]")
        for m in members:
            console.print(f"  {m['finding_id']} {m['severity']:<13} {esc(m['explanation'])}")
