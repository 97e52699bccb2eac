"""``herdscope detectors``: the detectors and their parameters as a terminal listing, generated from
the declarations (:func:`detectors.describe`), so it cannot drift from the code."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

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


def print_detectors(rows: list[dict], console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    for d in rows:
        console.print(f"[bold]{escape(d['name'])}[/bold]: {escape(d['summary'])}")
        console.print(f"  kinds: {', '.join(d['kinds']) or '-'}")
        console.print(f"  needs: {', '.join(d['requires']) or '-'}")
        table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1, 0, 2))
        for column in ("parameter", "default", "unit", "range", "gate", "meaning"):
            table.add_column(column, overflow="fold")
        for p in d["parameters"]:
            unit = "duration" if p["kind"] == "duration" else p["unit"] or ""
            table.add_row(escape(p["name"]), escape(p["default"]), escape(unit), escape(_range(p)),
                          p["gate"] or "", escape(p["help"]))
        console.print(table)
        console.print()
    console.print("Set any of them with --set DETECTOR.PARAMETER=VALUE (repeatable) or a [DETECTOR] table "
                  "in --config; durations (unit ns) take 250ms, 1s, 20us. A lower-bound gate: lowering it "
                  "never removes or downgrades a finding; an upper bound: raising it never does.")
