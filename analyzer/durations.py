"""Durations in words, for explanations, tables and the dashboard: one copy for every layer."""
from __future__ import annotations

import math


def fmt_ns(ns: float | int | None) -> str:
    """A duration for an explanation: 42 µs, 3.1 ms, 1.25 s."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "n/a"
    ns = float(ns)
    if ns < 999.5:  # thresholds at the rounding point: 999,999 ns is "1 ms", not "1e+03 µs"
        return f"{ns:.0f} ns"
    if ns < 999_500:
        return f"{ns / 1e3:.3g} µs"
    if ns < 999_500_000:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e9:.3g} s"


def fmt_limited(ns: float | int | None, res_ns: float | None) -> str:
    """:func:`fmt_ns`, honest about the timestamp tick ``res_ns``: a duration shorter than one tick
    reads "< 10 ms (the capture's timestamp tick)", one within ten ticks "~30 ms (± the 10 ms
    timestamp tick)"; at or below 1 ns ticks, plain :func:`fmt_ns`."""
    from .resolution import limited_text  # lazy: resolution loads NumPy and Polars, fmt_ns needs neither

    return limited_text(ns, res_ns, fmt_ns)
