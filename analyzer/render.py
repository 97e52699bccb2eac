"""Human-readable output with rich: the ``info`` summary."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table


def console(file=None) -> Console:
    """A console for tables: the terminal's width on a terminal, 140 columns in pipes and files."""
    target = file or sys.stdout
    return Console(file=file, highlight=False, width=None if target.isatty() else 140)


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
        ifs = "; ".join(f"#{i['iface']} {i['name'] or '-'} snaplen {i['snaplen']}" for i in s["interfaces"])
        t.add_row("Interfaces:", f"{len(s['interfaces'])}: {ifs}")
    t.add_row("Packets:", f"{s['packets']:,}")
    t.add_row("Data size:", f"{s['bytes']:,} bytes captured, {s['wire_bytes']:,} bytes on the wire")
    t.add_row("First packet:", s["first_time"] or "n/a")
    t.add_row("Last packet:", s["last_time"] or "n/a")
    t.add_row("Duration:", _duration(s["duration_s"]))
    if s["duration_s"] > 0:
        t.add_row("Average rate:", f"{s['packets'] / s['duration_s']:,.1f} packets/s, "
                                   f"{8 * s['wire_bytes'] / s['duration_s']:,.0f} bits/s")
    t.add_row("Time resolution:", _resolution(s["ts_resolution_ns"]))
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
        where = f" at byte {d['offset']:,}; {d['bytes_not_read']:,} bytes not read" if d["offset"] is not None else ""
        t.add_row("Damage:", f"[red]{d['reason']}[/red]{where}")
    tcp = s.get("tcp")
    if tcp and tcp["connections"]:
        states = ", ".join(f"{k} {v:,}" for k, v in tcp["states"].items())
        t.add_row("TCP connections:", f"{tcp['connections']:,} ({states})")
        rtt = tcp["handshake_rtt_ns"]
        if rtt["n"]:
            t.add_row("Handshake RTT:", f"median {_duration(rtt['median'] / 1e9)}, p99 {_duration(rtt['p99'] / 1e9)} "
                                        f"over {rtt['n']:,} handshakes")
        t.add_row("TCP segments:", f"{tcp['segments']:,}: {tcp['retransmissions']:,} retransmissions "
                                   f"({tcp['fast_retransmissions']:,} fast, {tcp['spurious_retransmissions']:,} "
                                   f"spurious), {tcp['duplicate_acks']:,} duplicate ACKs, {tcp['zero_windows']:,} "
                                   f"zero windows, {tcp['lost_segments']:,} not captured before")
    if s["events"]:
        t.add_row("Notes:", ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in s["events"].items()))
    out.print(t)
    out.print()
