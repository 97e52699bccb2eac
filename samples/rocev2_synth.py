#!/usr/bin/env python3
"""Deterministic synthetic RoCEv2 captures (issue 16): reliable-connected queue pairs on a small
leaf-spine lossless fabric, one scenario per capture, with ground-truth labels.

    python samples/rocev2_synth.py --scenario rocev2-pfc-storm --seed 1 --out pfc.pcapng [--scale 1.0]
    python samples/rocev2_synth.py --all --out-dir DIR       # every scenario and twin
    python samples/rocev2_synth.py --list

writes ``OUT`` (pcapng with ns timestamps by default; ``--format pcap``, ``--microsecond``) and
``OUT.labels.json`` (a JSON list with ``synth.py``'s label keys; healthy twins have ``[]``). The same
arguments always give byte-identical files: one ``random.Random(seed)`` per scenario, event order
fixed by (time, insertion sequence).

These captures are GENERATED, not recorded: no public RoCEv2 capture with a reusable licence was
found and the kernel here has no soft-RoCE (rxe). What is modelled, and from which sources, is in
``samples/rocekit/`` (``wire`` the encoders, ``fabric`` the switch queues/ECN/PFC and the capture
point, ``qp`` the RC transport and DCQCN, ``scenarios``/``congestion`` the scenarios, ``writer``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from rocekit.catalog import SCENARIOS  # noqa: E402
from rocekit.writer import generate  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--all", action="store_true", help="write every scenario into --out-dir")
    ap.add_argument("--list", action="store_true", help="list the scenarios")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the duration / work posted")
    ap.add_argument("--out", help="capture file; labels go to OUT.labels.json")
    ap.add_argument("--out-dir", help="directory for --all (files named SCENARIO.pcapng)")
    ap.add_argument("--format", choices=("pcap", "pcapng"), default="pcapng")
    ap.add_argument("--microsecond", action="store_true", help="µs timestamps instead of ns")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.list:
        for name, fn in SCENARIOS.items():
            print(f"{name}\t{(fn.__doc__ or '').strip().splitlines()[0] if fn.__doc__ else ''}")
        return 0
    jobs = []
    if a.all:
        if not a.out_dir:
            ap.error("--all needs --out-dir")
        os.makedirs(a.out_dir, exist_ok=True)
        ext = "pcapng" if a.format == "pcapng" else "pcap"
        jobs = [(n, os.path.join(a.out_dir, f"{n}.{ext}")) for n in SCENARIOS]
    elif a.scenario and a.out:
        jobs = [(a.scenario, a.out)]
    else:
        ap.error("give --scenario and --out, --all and --out-dir, or --list")
    for name, out in jobs:
        try:
            summary = generate(out, name, a.seed, a.scale, a.format, not a.microsecond)
        except ValueError as e:
            print(f"rocev2_synth.py: {e}", file=sys.stderr)
            return 2
        if not a.quiet:
            print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
