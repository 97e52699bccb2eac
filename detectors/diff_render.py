"""The outputs of ``herdscope diff``: a table for people, one JSON document, JUnit XML for CI.

- ``table``: the verdict and what failed the gate first, then the service response times side by side
  (count, p50 and p99 with the change and its verdict, error share), the findings new, gone and changed
  (one line each), and the TCP rates.
- ``json``: ``{herdscope, before, after, gate_parameters, srt: [ROW], findings: {new, gone, changed,
  unchanged}, rates: {connection_rate, retransmission_rate, before, after}, gate: {passed, failures,
  checks}}``. ``before``/``after`` are scan's CAPTURE objects (:func:`detectors.report.capture_summary`);
  a ROW has protocol, operation, leg, ``before``/``after`` (count, answered, unanswered, errors,
  error_share, unanswered_share, p50, p99, p50_ci, p99_ci: ``[low, high]`` ns, null where unbounded),
  ``p50``/``p99`` (before, after, change_ratio, before_ci, after_ci, verdict, why) and
  ``error_share``/``unanswered_share`` (before, after, change_pp, verdict); new and gone are scan's
  FINDING objects, changed and unchanged ``{key, before, after, rose}``; a check is ``{check, status:
  passed|failed|skipped, message, threshold, before, after, change_ratio|change_pp}``.
- ``junit``: one test suite, one test case per gate check (failing when it trips, skipped when it was
  turned off or had too few samples).
"""
from __future__ import annotations

import json

from rich import box
from rich.markup import escape as esc
from rich.table import Table

from analyzer import __version__
from analyzer.durations import fmt_ns
from analyzer.render import console as make_console

from .diff_gate import relative_change

SEVERITY_COLOURS = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "informational": "dim"}
# the verdict of a quantile change in one short cell (the legend under the table says what each means)
VERDICT_MARKS = {"significant increase": "[red]↑ sig[/red]", "significant decrease": "[green]↓ sig[/green]",
                 "no significant change": "≈", "too few samples": "[dim]few[/dim]", "not in both": "[dim]one side[/dim]"}
VERDICT_LEGEND = ("↑/↓ sig: the confidence intervals do not overlap; ≈: they overlap; few: too few samples "
                  "(not gated); one side: in one capture only")


SERVICE_WIDTH = 20  # "resolver_to_upstream" on one line


def document(result: dict) -> dict:
    """The JSON document (module doc) of a diff ``result`` (:func:`detectors.diff_command.run_diff`)."""
    return {"herdscope": __version__, "before": result["before"], "after": result["after"],
            "gate_parameters": result["gate_parameters"], "srt": result["comparison"]["srt"],
            "findings": result["comparison"]["findings"], "rates": result["comparison"]["rates"],
            "gate": result["gate"]}


def _capture_line(label: str, summary: dict) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in summary["findings"].items() if n) or "no findings"
    return (f"  {label} {esc(', '.join(summary['files']))}: {summary['packets']:,} packets over "
            f"{summary['duration_s']:.3f} s; {counts}")


def _latency(side: dict | None, name: str) -> str:
    return fmt_ns(side[name]) if side and side[name] is not None else "-"


def _change(cmp: dict) -> str:
    ratio = cmp.get("change_ratio")
    return relative_change(ratio) if ratio is not None else ""


def _share(side: dict | None, name: str) -> str:
    return f"{side[name] * 100:.1f}" if side and side[name] is not None else "-"


def srt_table(rows: list[dict], confidence: float) -> Table:
    t = Table(title=f"Service response times, BEFORE → AFTER (intervals at {confidence * 100:g}%)",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              caption=VERDICT_LEGEND, caption_justify="left")
    t.add_column("service", overflow="fold", min_width=SERVICE_WIDTH)
    for col in ("count", "p50", "Δ", "p99", "Δ", "errors %"):
        t.add_column(col, justify="left" if col == "Δ" else "right", no_wrap=True)
    for r in rows:
        b, a = r["before"], r["after"]
        service = esc(f"{r['protocol']} {r['operation']}") + (f"\n[dim]{esc(r['leg'])}[/dim]" if r["leg"] else "")
        count = f"{b['count'] if b else '-'}→{a['count'] if a else '-'}"
        cells = []
        for name in ("p50", "p99"):
            cells += [f"{_latency(b, name)}→{_latency(a, name)}",
                      f"{_change(r[name]):>6} {VERDICT_MARKS[r[name]['verdict']]}"]
        errors = f"{_share(b, 'error_share')} → {_share(a, 'error_share')}"  # in % (the header says)
        t.add_row(service, count, *cells, errors)
    return t


def _finding_line(tag: str, record: dict, extra: str = "") -> str:
    colour = SEVERITY_COLOURS[record["severity"]]
    who = " ".join(x for x in (record["server"], record["resource"]) if x)
    return (f"  {tag} [{colour}]{record['severity']}[/{colour}] {esc(record['detector'])}/{esc(record['kind'])} "
            f"{esc(who)}{extra} ({record['finding_id']}): {esc(record['explanation'])}")


def _rate(value, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.2f}%" if unit == "%" else f"{value:.3g}/s"


def render_table(result: dict, console=None) -> None:
    console = console or make_console()
    gate, comparison = result["gate"], result["comparison"]
    failed = len(gate["failures"])
    verdict = "[green]passed[/green]" if gate["passed"] else f"[bold red]FAILED[/bold red] ({failed} check{'s' * (failed != 1)})"
    console.print(f"[bold]herdscope diff[/bold]: gate {verdict}")
    console.print(_capture_line("BEFORE", result["before"]), highlight=False)
    console.print(_capture_line("AFTER ", result["after"]), highlight=False)
    for warning in result["before"].get("warnings", []) + result["after"].get("warnings", []):
        console.print(f"  [yellow]warning[/yellow]: {esc(warning)}", highlight=False)
    if gate["failures"]:
        console.rule("[red]what failed the gate")
        for c in gate["failures"]:
            console.print(f"  [red]✗[/red] {esc(c['check'])}: {esc(c['message'])}", highlight=False)
    console.print()
    if comparison["srt"]:
        console.print(srt_table(comparison["srt"], result["gate_parameters"]["confidence"]))
    else:
        console.print("No DNS, Kerberos, LDAP or SMB2 requests in either capture: no response times to compare.")
    found = comparison["findings"]
    console.rule(f"findings: {len(found['new'])} new, {len(found['gone'])} gone, {len(found['changed'])} changed, "
                 f"{len(found['unchanged'])} unchanged")
    for r in found["new"]:
        console.print(_finding_line("[red]new[/red] ", r), highlight=False)
    for r in found["gone"]:
        console.print(_finding_line("[green]gone[/green]", r), highlight=False)
    for c in found["changed"]:
        console.print(_finding_line("[yellow]changed[/yellow]", c["after"], f" (was {c['before']['severity']})"),
                      highlight=False)
    rates = comparison["rates"]
    t = Table(title="TCP", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("rate", "BEFORE", "AFTER", "change", "counts"):
        t.add_column(col, justify="left" if col in ("rate", "counts") else "right")
    for name, key, unit, change in (
            ("new connections", "connection_rate", "/s", _change(rates["connection_rate"])),
            ("retransmissions / data segment", "retransmission_rate", "%",
             f"{rates['retransmission_rate']['change_pp']:+.2f}pp" if rates["retransmission_rate"]["change_pp"]
             is not None else "")):
        t.add_row(name, _rate(rates[key]["before"], unit), _rate(rates[key]["after"], unit), change,
                  esc(rates[key]["why"]))
    console.print(t)
    statuses = [c["status"] for c in gate["checks"]]
    console.print(f"[dim]{statuses.count('passed')} checks passed, {statuses.count('failed')} failed, "
                  f"{statuses.count('skipped')} skipped (turned off or too few samples); --format json lists "
                  f"them all[/dim]")


def junit_xml(result: dict) -> str:
    """One test suite ``herdscope diff``, one test case per gate check."""
    from xml.sax.saxutils import escape, quoteattr  # lazy: as in detectors.report (loads urllib.request)

    checks = result["gate"]["checks"]
    label = " vs ".join("+".join(result[side]["files"]) for side in ("before", "after"))
    cases = []
    for c in checks:
        group = c["check"].split(" ")[0]  # p50, p99, error, unanswered, new, severity, tcp
        case = f'  <testcase classname={quoteattr("herdscope.diff." + group)} name={quoteattr(c["check"])}>'
        if c["status"] == "failed":
            case += f'\n    <failure message={quoteattr(c["message"][:300])} type="gate">{escape(c["message"])}</failure>'
        elif c["status"] == "skipped":
            case += f"\n    <skipped message={quoteattr(c['message'][:300])}/>"
        cases.append(case + f"\n    <system-out>{escape(c['message'])}</system-out>\n  </testcase>")
    failures = sum(c["status"] == "failed" for c in checks)
    skipped = sum(c["status"] == "skipped" for c in checks)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="herdscope diff" tests="{len(checks)}" '
            f'failures="{failures}">\n <testsuite name={quoteattr("herdscope diff " + label)} tests="{len(checks)}" '
            f'failures="{failures}" skipped="{skipped}">\n' + "\n".join(cases) + "\n </testsuite>\n</testsuites>\n")


def render(result: dict, fmt: str) -> str | None:
    """The text of ``json`` or ``junit`` (None for ``table``, which prints itself)."""
    if fmt == "json":
        return json.dumps(document(result), indent=1) + "\n"
    if fmt == "junit":
        return junit_xml(result)
    return None

