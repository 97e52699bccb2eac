"""``herdscope detectors``: the detectors and their parameters as a terminal listing, generated from
the declarations (:func:`detectors.describe`), so it cannot drift from the code."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table

from analyzer.render import console as make_console

GATE_WORDS = {"lower": "lower bound: lowering it never removes a finding",
              "upper": "upper bound: raising it never removes a finding",
              None: ""}


def _range(p: dict) -> str:
    if p["choices"]:
        return "one of " + ", ".join(p["choices"])
    lo, hi = p["lo"], p["hi"]
    if lo is not None and hi is not None:
        return f"{lo} .. {hi}"
    if lo is not None:
        return f">= {lo}"
    if hi is not None:
        return f"<= {hi}"
    return ""


TABLE_MIN_WIDTH = 110  # columns below which each parameter is two lines instead of a table row


def _heading(d: dict) -> Table:
    """kinds and needs, wrapped under their own column (not back to the margin)."""
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("kinds:", ", ".join(d["kinds"]) or "-")
    grid.add_row("needs:", ", ".join(d["requires"]) or "-")
    return grid


def _unit(p: dict) -> str:
    return "duration" if p["kind"] == "duration" else p["unit"] or ""


def _parameter_table(d: dict) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1, 0, 2))
    for column in ("parameter", "default", "unit", "range", "gate", "meaning"):
        table.add_column(column, overflow="fold")
    for p in d["parameters"]:
        table.add_row(escape(p["name"]), escape(p["default"]), escape(_unit(p)), escape(_range(p)),
                      p["gate"] or "", escape(p["help"]))
    return table


def _parameter_lines(d: dict) -> Table:
    """Narrow terminals: the name and its numbers on one line, the meaning wrapped beneath it."""
    grid = Table.grid()
    grid.add_column(overflow="fold")
    for p in d["parameters"]:
        unit = p["unit"] if p["unit"] and p["kind"] != "duration" else ""
        unit = unit if unit in ("", "x") else " " + unit  # 10x, 20 clients
        facts = "; ".join(x for x in (_range(p), f"{p['gate']} bound" if p["gate"] else "") if x)
        grid.add_row(f"[bold]{escape(p['name'])}[/bold] = {escape(p['default'])}{escape(unit)}"
                     + (f"  [dim]({escape(facts)})[/dim]" if facts else ""))
        grid.add_row(Padding(escape(p["help"]), (0, 0, 0, 4)))
    return grid


def print_detectors(rows: list[dict], console: Console | None = None) -> None:
    console = console or make_console()
    for d in rows:
        console.print(f"[bold]{escape(d['name'])}[/bold]: {escape(d['summary'])}")
        console.print(Padding(_heading(d), (0, 0, 0, 2)))
        body = _parameter_table(d) if console.width >= TABLE_MIN_WIDTH else _parameter_lines(d)
        console.print(Padding(body, (0, 0, 0, 2)))
        console.print()
    console.print("Set any of them with --set DETECTOR.PARAMETER=VALUE (repeatable) or a [DETECTOR] table "
                  "in --config; durations (unit ns) take 250ms, 1s, 20us. A lower-bound gate: lowering it "
                  "never removes or downgrades a finding; an upper bound: raising it never does.")
