"""Helpers shared by the evaluation scenarios (samples/realkit/eval_*.py)."""
from __future__ import annotations

import contextlib
import os

from .core import ALL_DETECTORS, Capture, run

CAPTURE_NICE = -10   # tcpdump's scheduling priority: keep up on a loaded 2-core machine
FULL_FRAME = 2048    # snap length: more than any frame on a 1500-byte-MTU veth without GSO


def capture_name(scen: str, healthy: bool, ext: str = ".pcap") -> str:
    """A scenario's capture file: SCEN.pcap, its healthy twin SCEN-healthy.pcap."""
    return scen + ("-healthy" if healthy else "") + ext


def new_entry(scen: str, healthy: bool, made: str, ext: str = ".pcap", twin: str | None = None,
              **fields) -> dict:
    """A manifest entry's head: file, scenario, healthy, twin (the other half; "" for none),
    made_with, then FIELDS (measured, ...)."""
    twin = capture_name(scen, not healthy, ext) if twin is None else twin
    return dict(file=capture_name(scen, healthy, ext), scenario=scen, healthy=healthy, twin=twin,
                made_with=made, **fields)


def healthy_twin(entry: dict, what_happened: str, silent: list[str] = ALL_DETECTORS,
                 **fields) -> dict:
    """Complete a healthy twin's entry: nothing expected, SILENT (default: every detector) silent
    at >= medium and every detector below high; then FIELDS (note, ...)."""
    entry.update(what_happened=what_happened, silent=list(silent), below_high=list(ALL_DETECTORS),
                 **fields, expect=[])
    return entry


def pathological(entry: dict, what_happened: str, silent: list[str], expect: list[dict],
                 below_high: list[str] = (), **fields) -> dict:
    """Complete a pathological entry: what happened, the silent and below_high detectors, then
    FIELDS (also_acceptable, ...), and the expected findings."""
    entry.update(what_happened=what_happened, silent=list(silent), below_high=list(below_high),
                 **fields, expect=expect)
    return entry


def add_addresses(ns, dev: str, addrs: list[str]) -> None:
    """Add many /16 addresses at once (ip -batch: one process, not one per address)."""
    batch = "".join(f"addr add {a}/16 dev {dev}\n" for a in addrs)
    run(["ip", "-n", ns.name, "-batch", "-"], input=batch)


def capture(lab, ns, iface: str, path, snaplen: int = FULL_FRAME, **kw) -> Capture:
    """realkit.core.Capture with a snap length of FULL_FRAME instead of tcpdump's 262144
    (every frame on our veths is whole: MTU 1500, gso_max_segs 1; with -s 0 libpcap sizes each
    slot of its capture ring for 256 KB, so the 16 MB buffer holds only 64 packets and bursts
    are dropped), and tcpdump raised to CAPTURE_NICE so that it keeps up when other work
    shares the CPUs. Every entry still records capture_dropped, and make_eval.py records a
    scenario again when it is not 0."""
    cap = Capture(lab, ns, iface, path, snaplen=snaplen, **kw)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, cap.proc.pid, CAPTURE_NICE)
    return cap
