"""Human-readable output with rich: the ``info`` summary."""
from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table

from .durations import fmt_limited, fmt_ns
from .resolution import MIN_DIFFERENCES, is_limited


PIPE_WIDTH = 120  # columns when writing to a pipe or file and COLUMNS is not set


def console(file=None) -> Console:
    """A console for tables: ``COLUMNS`` when set, else the terminal's width, else PIPE_WIDTH columns
    in pipes and files. Rich honours ``NO_COLOR`` (and ``FORCE_COLOR``) itself."""
    target = file or sys.stdout
    width = None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        width = int(columns)
    elif not (hasattr(target, "isatty") and target.isatty()):
        width = PIPE_WIDTH
    return Console(file=file, highlight=False, width=width)


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:,.6f} s"


def _resolution(ns: float | None) -> str:
    if ns is None:
        return "n/a"
    names = {1.0: "nanoseconds", 1000.0: "microseconds", 1e6: "milliseconds", 1e9: "seconds"}
    return names.get(ns, f"{ns:g} ns")


def _time_resolution(s: dict) -> str:
    """Declared and effective resolution, and how much the effective one rests on."""
    declared, effective = s["ts_resolution_ns"], s.get("effective_resolution_ns")
    samples = s.get("effective_resolution_samples", 0)
    if declared is None:
        return "n/a"
    text = f"{_resolution(declared)} declared"
    if effective is None:
        return text
    if samples < MIN_DIFFERENCES:
        return (f"{text}; effective tick cannot be told from {samples} timestamp difference"
                f"{'s' if samples != 1 else ''} (at least {MIN_DIFFERENCES} needed), the declared one is assumed")
    if any(i.get("effective_resolution_ns", 0) > i["ts_resolution_ns"] for i in s["interfaces"]):
        return (f"{text}, but the timestamps move in {fmt_ns(effective)} ticks (the effective resolution, from "
                f"{samples:,} timestamp differences): nothing shorter than {fmt_ns(effective)} can be seen")
    return f"{text}, {_resolution(effective)} effective (from {samples:,} timestamp differences)"


def _tick_of(iface: dict) -> str:
    """ ", timestamps tick in 10 ms" for an interface whose timestamps are coarser than declared."""
    effective = iface.get("effective_resolution_ns")
    if effective is None or effective == iface["ts_resolution_ns"]:
        return ""
    return f", timestamps tick in {fmt_ns(effective)}"


def _tick_duration(ns: float, res_ns: float | None) -> str:
    """A measured duration, never finer than the timestamp tick: "< 10 ms (the capture's timestamp tick)"."""
    if not is_limited(ns, res_ns):
        return _duration(ns / 1e9)
    return fmt_limited(ns, res_ns)


def print_summary(s: dict, out: Console | None = None) -> None:
    out = out or console()
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("File name:", s["file"])
    t.add_row("File type:", s["format"] + (", gzip-compressed" if s["compressed"] else ""))
    t.add_row("File size:", f"{s['file_size']:,} bytes")
    links = ", ".join(f"{lt['name']} ({lt['linktype']}): {lt['packets']:,}" for lt in s["link_types"])
    t.add_row("Link types:", links or "none")
    if len(s["interfaces"]) > 1 or any(i["name"] for i in s["interfaces"]):
        ifs = "; ".join(f"#{i['iface']} {i['name'] or '-'} snaplen {i['snaplen']}" + _tick_of(i)
                        for i in s["interfaces"])
        t.add_row("Interfaces:", f"{len(s['interfaces'])}: {ifs}")
    t.add_row("Packets:", f"{s['packets']:,}")
    t.add_row("Data size:", f"{s['bytes']:,} bytes captured, {s['wire_bytes']:,} bytes on the wire")
    t.add_row("First packet:", s["first_time"] or "n/a")
    t.add_row("Last packet:", s["last_time"] or "n/a")
    t.add_row("Duration:", _duration(s["duration_s"]))
    if s["duration_s"] > 0:
        t.add_row("Average rate:", f"{s['packets'] / s['duration_s']:,.1f} packets/s, "
                                   f"{8 * s['wire_bytes'] / s['duration_s']:,.0f} bits/s")
    t.add_row("Time resolution:", _time_resolution(s))
    protos = []
    for transport, services in s["protocols"].items():
        total = sum(services.values())
        detail = ", ".join(f"{k} {v:,}" for k, v in services.items() if k not in ("all",))
        protos.append(f"{transport} {total:,}" + (f" ({detail})" if detail else ""))
    t.add_row("Protocols:", "; ".join(protos) or "none")
    t.add_row("Decoding:", ", ".join(f"{k} {v:,}" for k, v in s["parse_status"].items()) or "n/a")
    skipped = s["skipped"]
    if skipped["total"]:
        t.add_row("Skipped records:", f"{skipped['total']:,} (" +
                  ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in skipped["reasons"].items()) + ")")
    else:
        t.add_row("Skipped records:", "none")
    if s["damage"]:
        d = s["damage"]
        lost = d["bytes_not_read"]
        where = (f" at byte {d['offset']:,}; {lost:,} byte{'' if lost == 1 else 's'} not read"
                 if d["offset"] is not None else "")
        t.add_row("Damage:", f"[red]{d['reason']}[/red]{where}")
    tcp = s.get("tcp")
    if tcp and tcp["connections"]:
        states = ", ".join(f"{k} {v:,}" for k, v in tcp["states"].items())
        t.add_row("TCP connections:", f"{tcp['connections']:,} ({states})")
        rtt = tcp["handshake_rtt_ns"]
        if rtt["n"]:
            res = s.get("effective_resolution_ns")
            t.add_row("Handshake RTT:", f"median {_tick_duration(rtt['median'], res)}, p99 "
                                        f"{_tick_duration(rtt['p99'], res)} over {rtt['n']:,} handshakes")
        t.add_row("TCP segments:", f"{tcp['segments']:,}: {tcp['retransmissions']:,} retransmissions "
                                   f"({tcp['fast_retransmissions']:,} fast, {tcp['spurious_retransmissions']:,} "
                                   f"spurious), {tcp['duplicate_acks']:,} duplicate ACKs, {tcp['zero_windows']:,} "
                                   f"zero windows, {tcp['lost_segments']:,} not captured before")
    if s.get("decode_damage"):
        t.add_row("Decode damage:", "; ".join(
            f"{frame}: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in statuses.items())
            for frame, statuses in s["decode_damage"].items()) + " (kept as rows with that status, not dropped)")
    if s["events"]:
        t.add_row("Notes:", ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in s["events"].items()))
    out.print(t)
    out.print()
