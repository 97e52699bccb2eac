"""Time and traffic selection (``--start``/``--end``/``--host``/``--port`` of scan and stats).

The selection is applied to the packets before anything is derived from them, so TCP analysis, the
decoders and the detectors see only the selected packets (like a display filter applied before the
analysis, not after it). Frame numbers stay the file's own, so evidence still opens the right
packets. IP fragments after the first carry no ports: a port selection keeps only first fragments
(and unfragmented packets) of the datagrams it selects.
"""
from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

import polars as pl


INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)  # the range of the ts_ns column (not a tunable threshold)
SELECTION_COLUMNS = ("ts_ns", "src", "dst", "sport", "dport")  # what Selection.predicate reads of the packets


class SelectionError(ValueError):
    """A --start/--end/--host/--port value that cannot be understood."""


@dataclass(frozen=True)
class TimeSpec:
    """A point in time: absolute (ns since the Unix epoch) or seconds after the first packet."""

    absolute_ns: int | None = None
    offset_ns: int | None = None

    def resolve(self, first_ns: int | None) -> int | None:
        """ns since the Unix epoch, held to what an Int64 timestamp column can compare with (a time
        beyond year 2262 or before 1677 selects as the end or the start of all time)."""
        if self.absolute_ns is not None:
            when = self.absolute_ns
        elif first_ns is None:
            return None
        else:
            when = first_ns + self.offset_ns
        return max(INT64_MIN, min(INT64_MAX, when))


def parse_time(text: str, what: str) -> TimeSpec:
    """``12.5`` (seconds after the first packet) or an ISO 8601 time (``2026-11-29T18:34:09.5Z``;
    without a zone it is UTC)."""
    raw = text.strip()
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):  # nan, inf, 1e400: no point in time
            raise SelectionError(f"{what} {text!r}: expected a finite number of seconds after the first packet")
        if seconds < 0:
            raise SelectionError(f"{what} {text!r}: seconds after the first packet cannot be negative")
        return TimeSpec(offset_ns=min(INT64_MAX, round(min(seconds * 1e9, float(INT64_MAX)))))
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise SelectionError(f"{what} {text!r}: expected seconds after the first packet (12.5) or an ISO 8601 "
                             f"time (2026-11-29T18:34:09Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    # whole seconds via the timestamp, the fraction from the microseconds (datetime has no ns)
    epoch_s = int(when.replace(microsecond=0).timestamp())
    return TimeSpec(absolute_ns=epoch_s * 1_000_000_000 + when.microsecond * 1000)


def parse_host(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise SelectionError(f"--host {text!r}: expected an IPv4 or IPv6 address") from None


def parse_port(value: int) -> int:
    if not 0 <= int(value) <= 65535:
        raise SelectionError(f"--port {value}: expected 0-65535")
    return int(value)


@dataclass
class Selection:
    start: TimeSpec | None = None
    end: TimeSpec | None = None
    hosts: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    report: dict = field(default_factory=dict)

    @classmethod
    def from_options(cls, start: str | None, end: str | None, hosts, ports) -> "Selection | None":
        """None when nothing is selected (the common case costs nothing)."""
        if start is None and end is None and not hosts and not ports:
            return None
        selection = cls(parse_time(start, "--start") if start is not None else None,
                        parse_time(end, "--end") if end is not None else None,
                        tuple(parse_host(h) for h in hosts), tuple(parse_port(p) for p in ports))
        selection.check_order(start, end)
        return selection

    def check_order(self, start_text: str | None, end_text: str | None) -> None:
        """An --end before --start selects nothing: a mistake, said before any capture is read (when
        both are of one kind; an offset against an absolute time is known only once the first packet is)."""
        if self.start is None or self.end is None:
            return
        for kind in ("absolute_ns", "offset_ns"):
            a, b = getattr(self.start, kind), getattr(self.end, kind)
            if a is not None and b is not None and b < a:
                raise SelectionError(f"--end {end_text!r} is before --start {start_text!r}: nothing would be selected")

    def predicate(self, packets: pl.DataFrame) -> pl.Expr:
        first = packets["ts_ns"].min() if packets.height else None
        keep = pl.lit(True)
        start = self.start.resolve(first) if self.start else None
        end = self.end.resolve(first) if self.end else None
        if start is not None:
            keep &= pl.col("ts_ns") >= start
        if end is not None:
            keep &= pl.col("ts_ns") <= end
        if self.hosts:
            hosts = list(self.hosts)
            keep &= pl.col("src").cast(pl.String).is_in(hosts) | pl.col("dst").cast(pl.String).is_in(hosts)
        if self.ports:
            ports = list(self.ports)
            keep &= (pl.col("sport").is_in(ports) | pl.col("dport").is_in(ports)).fill_null(False)
        self.report = {"start_ns": start, "end_ns": end, "hosts": list(self.hosts), "ports": list(self.ports)}
        return keep


def apply(cap, selection: Selection | None) -> None:
    """Restrict ``cap`` to the selection (before any frame is derived); the counts go to
    ``cap.selection``: start_ns, end_ns, hosts, ports, packets_selected, packets_total."""
    if selection is None:
        return
    packets = cap.packets
    kept = packets.filter(selection.predicate(packets))
    cap.restrict_packets(kept)
    cap.selection = {**selection.report, "packets_selected": kept.height, "packets_total": packets.height}
