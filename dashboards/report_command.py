"""The body of ``herdscope report FILE... --out report.html``: read the files as one capture, run the
detectors, link the findings into incidents, and write the self-contained HTML report
(:mod:`dashboards.report_html`).

``analyzer/cli.py`` parses the options and has already checked ``--out`` (writable, before anything is
read: :func:`analyzer.command.check_output_file`) and the detector configuration. Exit codes: 0 the
report was written (whatever it found: a report is not a gate, ``scan --fail-on`` is), 2 usage (a bad
parameter found when the detectors are configured), 3 unreadable input (nothing is written then).
Charts that could not be drawn are notes in the report and a line on standard error, not a failure.
"""
from __future__ import annotations

import os
import time


from analyzer.command import open_captures, writing
from analyzer.errors import ExitCode, UnreadableCapture, fail
from analyzer.selection import apply as select
from detectors import available, incidents
from detectors.scan_command import linker_params, run_detectors
from detectors.scan_config import ScanConfig

from .report_html import ReportLimits, build_report


def incidents_of(findings, cap, cfg: ScanConfig) -> list[dict]:
    """The findings linked into incidents (:func:`detectors.incidents.link`, with the ``incident.*``
    overrides): all of ``findings`` (members add to their population's participants)."""
    return incidents.link(findings, cap, linker_params(cfg))


def report(files, cfg: ScanConfig, selection, *, out: str, title: str | None, limits: ReportLimits) -> int:
    """Write the report of ``files`` (one capture) to ``out``; the exit code (0 written, 3 unreadable)."""
    started = time.perf_counter()
    try:
        cap = open_captures(list(files))
    except UnreadableCapture as exc:
        fail(str(exc))
        return ExitCode.UNREADABLE
    with cap:
        select(cap, selection)
        findings = run_detectors(cap, cfg, release=False)  # no release: the charts read the frames
        for warning in cap.warnings:
            fail(f"warning: {warning}")
        incidents = incidents_of(findings, cap, cfg)
        document, tally = build_report(cap, list(files), findings, cfg.detectors or list(available()),
                                       incidents=incidents, title=title, limits=limits)
    with writing("--out", out):
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(document)
    for failure in tally.chart_failures:
        fail(f"warning: chart not drawn: {failure}")
    size_kb = os.path.getsize(out) / 1024
    fail(f"{out}: {_count(tally.findings, 'finding')} ({tally.charted} with proof charts), "
         f"{_count(tally.charts, 'chart')}"
         + (f", {len(tally.chart_failures)} not drawn" if tally.chart_failures else "")
         + ("" if tally.incidents is None else f", {_count(tally.incidents, 'incident')}")
         + f"; {size_kb:,.0f} KiB in {time.perf_counter() - started:.1f} s")
    return ExitCode.OK


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"
