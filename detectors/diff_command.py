"""The body of ``herdscope diff BEFORE AFTER``: open both sides, measure them alike, compare, gate, write.

``analyzer/cli.py`` parses the options (the detector options and selection of ``scan``, the gate
thresholds of :mod:`detectors.diff_gate`) and calls :func:`diff`. Each side is a capture file, or a
directory whose files (every regular file not starting with ``.``) are read as one capture, as ``scan
FILE...`` reads the pieces of a ring buffer (:func:`analyzer.command.open_captures`). Opening, the
one-line errors and the writing of ``--output`` are :mod:`analyzer.command`'s; the capture summary and
finding records are :mod:`detectors.report`'s; the comparison is :mod:`detectors.diff`.
"""
from __future__ import annotations

import os

from analyzer.command import open_captures, writing
from analyzer.errors import ExitCode, UnreadableCapture, fail
from analyzer.selection import apply as select

from . import available, top_level
from .diff import compare, measure
from .diff_gate import GateParams, describe_gate, gate
from .diff_render import render, render_table
from .report import capture_summary, finding_records
from .scan_command import run_detectors, write_output
from .scan_config import ScanConfig


def side_files(path: str) -> list[str]:
    """The files of one side: ``path`` itself, or a directory's capture pieces (sorted by name; the
    reader puts them in time order). UnreadableCapture for an empty directory."""
    if path != "-" and os.path.isdir(path):
        files = sorted(os.path.join(path, name) for name in os.listdir(path)
                       if not name.startswith(".") and os.path.isfile(os.path.join(path, name)))
        if not files:
            raise UnreadableCapture(f"{path}: a directory without capture files")
        return files
    return [path]


def measure_side(path: str, cfg: ScanConfig, selection) -> tuple[dict, dict]:
    """(the CAPTURE summary, the :func:`detectors.diff.measure` result) of one side."""
    files = side_files(path)
    cap = open_captures(files)
    try:
        for warning in cap.warnings:
            fail(f"warning: {warning}")
        select(cap, selection)
        measured = measure(cap, None, "+".join(files))  # before the detectors' release frees the TCP frames
        findings = top_level(run_detectors(cap, cfg, release=True))
        measured["findings"] = finding_records(findings, "+".join(files), cap)  # scan's FINDING objects
        summary = capture_summary(cap, files, findings, cfg.detectors or list(available()))
        summary["warnings"] = list(cap.warnings)
        summary["tcp"] = measured["rates"]
    finally:
        cap.close()
    return summary, measured


def run_diff(before: str, after: str, cfg: ScanConfig, selection, params: GateParams) -> dict:
    """Measure both sides and compare them: ``{before, after, gate_parameters, comparison, gate}``
    (UnreadableCapture when a side cannot be read)."""
    b_summary, b_measured = measure_side(before, cfg, selection)
    a_summary, a_measured = measure_side(after, cfg, selection)
    comparison = compare(b_measured, a_measured, params)
    return {"before": b_summary, "after": a_summary, "gate_parameters": describe_gate(params),
            "comparison": comparison, "gate": gate(comparison, params)}


def diff(before: str, after: str, cfg: ScanConfig, selection, params: GateParams, *, fmt: str,
         output: str | None, quiet: bool) -> int:
    """``herdscope diff``: exit 1 when the gate fails, 3 when a side is unreadable, 0 otherwise. The
    options were checked by the caller (before anything is read)."""
    try:
        result = run_diff(before, after, cfg, selection, params)
    except UnreadableCapture as exc:
        fail(str(exc))
        return ExitCode.UNREADABLE
    with writing("--output", output):
        write_diff(result, fmt, output, quiet)
    return ExitCode.OK if result["gate"]["passed"] else ExitCode.FINDINGS


def write_diff(result: dict, fmt: str, output: str | None, quiet: bool) -> None:
    """The report in ``fmt`` on standard output or in ``output`` (nothing on stdout with ``quiet``)."""
    write_output(output, quiet, table=(lambda console: render_table(result, console)) if fmt == "table" else None,
                 text=lambda: render(result, fmt))
