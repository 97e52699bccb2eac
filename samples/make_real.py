#!/usr/bin/env python3
"""Rebuild herdscope's real-server sample captures (samples/*.pcap*, samples/MANIFEST.toml).

Run as root on Debian (``make samples`` does ``sudo python3 samples/make_real.py --out samples/``).
This script installs nothing: it checks that the Debian packages and Python client libraries
it needs are there and says how to install the missing ones.

For each scenario it starts real servers (unbound, nsd, dnsmasq, MIT krb5kdc, slapd, smbd)
with configurations written to a temporary directory, inside network namespaces of its own
(names starting with ``hsreal-``; loopback and veth only, addresses in 10.77.0.0/16 that
exist only inside those namespaces), drives real clients against them, captures the traffic
with tcpdump, and records what the clients and servers did as ground truth in MANIFEST.toml.
Everything it started is stopped by PID and the namespaces are removed, also on failure;
namespaces left by an interrupted earlier run are removed at start.

    sudo python3 samples/make_real.py --out samples/               # everything (~6 min)
    sudo python3 samples/make_real.py --only dns-ttl-herd --out /tmp/s
    python3 samples/make_real.py --list
    python3 samples/make_real.py --check
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import tomllib
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from realkit import core, facts, tomlw  # noqa: E402

COMMON_DEBS = ["iproute2", "tcpdump", "tshark"]   # tshark also brings editcap (wireshark-common)
PY_MODULES = {"dns": "dnspython", "ldap3": "ldap3", "smbprotocol": "smbprotocol"}

# name -> (module, build function, Debian packages, Python modules, has healthy twin)
SCENARIOS: dict[str, tuple[str, str, list[str], list[str], bool]] = {
    "dns-ttl-herd": ("scen_dns", "build_ttl_herd", ["unbound", "nsd"], ["dns"], True),
    "dns-retry-storm": ("scen_dns", "build_retry_storm", ["dnsmasq-base", "nsd"], ["dns"], True),
    "krb5-as-tgs-herd": ("scen_krb", "build_herd", ["krb5-kdc", "krb5-admin-server", "krb5-user"],
                         [], True),
    "ldap-conn-churn": ("scen_ldap", "build_churn", ["slapd", "ldap-utils"], ["ldap3"], True),
    "ldap-toctou": ("scen_ldap", "build_toctou", ["slapd", "ldap-utils"], ["ldap3"], True),
    "smb2-oplock-lease-break": ("scen_smb", "build_breaks", ["samba", "smbclient"],
                                ["smbprotocol"], True),
    "smb2-break-queue": ("scen_smb", "build_queue", ["samba", "smbclient"], ["smbprotocol"], True),
    "smb2-toctou": ("scen_smb", "build_toctou", ["samba", "smbclient"], ["smbprotocol"], True),
    "tcp-slow-start-after-idle": ("scen_tcp", "build_idle", [], [], True),
    "tcp-rto-blackout": ("scen_tcp", "build_blackout", [], [], True),
    "tcp-nagle-delayed-ack": ("scen_tcp", "build_nagle", [], [], True),
}

HEADER = '''# herdscope real-server sample captures: how each was made, what happened, ground truth.
# Written by samples/make_real.py (do not edit by hand: rebuild with `make samples`).
#
# Per capture: file, scenario, healthy, twin, made_with, what_happened, silent (detectors that
# must report nothing >= medium), [capture.measured] (from the scenario's own logs),
# [capture.tshark] (what tshark 4.0 sees, re-checked by tests/test_samples_real.py within
# [capture.tshark_tolerance]), and [[capture.expect]] findings: detector, min_severity,
# start_s (seconds after the first packet), tolerance_s, client, server, resource, count,
# count_tolerance, [capture.expect.measured].
# Severity order: informational < low < medium < high < critical.
# Detectors: herd, retry_storm, smb_break_queue, tcp_stall, toctou, conn_churn.
'''


def missing_requirements(names: list[str]) -> tuple[list[str], list[str]]:
    debs = set(COMMON_DEBS)
    mods: set[str] = set()
    for n in names:
        debs.update(SCENARIOS[n][2])
        mods.update(SCENARIOS[n][3])
    miss_debs = sorted(d for d in debs if core.deb_version(d) == "not installed")
    miss_mods = sorted(PY_MODULES[m] for m in mods if importlib.util.find_spec(m) is None)
    return miss_debs, miss_mods


def build_one(name: str, healthy: bool, out: Path, keep: bool) -> dict:
    """Run one half of a scenario in its own namespaces; the capture is written to the
    temporary directory first and moved to OUT only when the scenario succeeded."""
    mod_name, fn_name, *_ = SCENARIOS[name]
    mod = importlib.import_module(f"realkit.{mod_name}")
    build = getattr(mod, fn_name)
    label = f"{name}{'-healthy' if healthy else ''}"
    workdir = Path(tempfile.mkdtemp(prefix=f"hsreal-{label}-"))
    stage = workdir / "capture"
    stage.mkdir()
    lab = core.Lab(label, workdir)
    core.log(f"=== {label} (work dir {workdir})")
    try:
        try:
            entry = build(lab, stage, healthy)
        finally:
            lab.close()
        if entry.pop("pcapng", False):
            core.to_pcapng(stage / entry["file"].replace(".pcapng", ".pcap"))
        shutil.move(str(stage / entry["file"]), str(out / entry["file"]))
    except BaseException:
        core.log(f"{label} failed; server logs in {workdir}")
        keep = True
        raise
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    add_facts(entry, out)
    return entry


def add_facts(entry: dict, out: Path) -> None:
    """[capture.tshark] and its tolerances: what tshark sees in the capture."""
    pcap = out / entry["file"]
    frames = facts.tshark_reads(pcap)
    f = facts.facts_for(entry["scenario"], pcap)
    entry["tshark"] = dict(frames_total=frames, **f)
    entry["tshark_tolerance"] = {k: facts.tolerance_for(entry["scenario"], k, v)
                                 for k, v in f.items()}
    entry["size_bytes"] = pcap.stat().st_size
    core.log(f"{entry['file']}: {entry['size_bytes']} bytes, tshark {f}")


def refresh_facts(out: Path) -> int:
    """Recompute the tshark facts of the captures already listed in OUT/MANIFEST.toml
    (after a change to realkit/facts.py); the scenario ground truth is left as it is."""
    path = out / "MANIFEST.toml"
    entries = tomllib.loads(path.read_text())["capture"]
    for e in entries:
        add_facts(e, out)
    path.write_text(tomlw.dump_manifest(sorted(entries, key=order_key), HEADER))
    core.log(f"refreshed the tshark facts of {len(entries)} captures in {path}")
    return 0


def order_key(entry: dict) -> tuple:
    names = list(SCENARIOS)
    sc = entry.get("scenario", "")
    return (names.index(sc) if sc in names else len(names), entry.get("healthy", False))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE, help="where captures and MANIFEST.toml go")
    ap.add_argument("--only", default="", help="comma-separated scenario names (see --list)")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--check", action="store_true", help="check the requirements and exit")
    ap.add_argument("--pathological-only", action="store_true",
                    help="skip the healthy twins (faster, for development)")
    ap.add_argument("--refresh-facts", action="store_true",
                    help="only recompute [capture.tshark] of the captures in OUT (no root)")
    ap.add_argument("--keep-workdir", action="store_true",
                    help="keep the temporary server directories (kept anyway on failure)")
    args = ap.parse_args(argv)

    if args.list:
        for n, (_, _, debs, mods, twin) in SCENARIOS.items():
            print(f"{n:22s} debs: {' '.join(debs):45s} python: {' '.join(PY_MODULES[m] for m in mods)}"
                  f"{'  (+ healthy twin)' if twin else ''}")
        return 0
    if args.refresh_facts:
        return refresh_facts(args.out.resolve())
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")

    miss_debs, miss_mods = missing_requirements(names)
    if miss_debs or miss_mods:
        if miss_debs:
            print("missing Debian packages; install them with\n  apt-get install "
                  + " ".join(miss_debs), file=sys.stderr)
        if miss_mods:
            print("missing Python client libraries; install them into the interpreter that runs "
                  "this script, e.g.\n  pip install " + " ".join(miss_mods)
                  + "\n(or: pip install -e '.[samples]')", file=sys.stderr)
        return 2
    if args.check:
        print("all requirements present")
        return 0
    if os.geteuid() != 0:
        print("make_real.py needs root (network namespaces, tcpdump, servers)", file=sys.stderr)
        return 2

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    core.cleanup_stale()
    new_entries: list[dict] = []
    failed: list[str] = []
    t0 = time.time()
    for n in names:
        variants = [False] + ([True] if SCENARIOS[n][4] and not args.pathological_only else [])
        for healthy in variants:
            try:
                new_entries.append(build_one(n, healthy, out, args.keep_workdir))
            except KeyboardInterrupt:
                core.cleanup_stale()
                raise
            except Exception:
                traceback.print_exc()
                failed.append(f"{n}{' (healthy)' if healthy else ''}")
    core.cleanup_stale()

    manifest_path = out / "MANIFEST.toml"
    old: list[dict] = []
    if manifest_path.exists():
        old = tomllib.loads(manifest_path.read_text()).get("capture", [])
    new_files = {e["file"] for e in new_entries}
    rebuilt = {(e["scenario"], e["healthy"]) for e in new_entries}
    merged = [e for e in old if e["file"] not in new_files
              and (e.get("scenario"), e.get("healthy")) not in rebuilt] + new_entries
    merged.sort(key=order_key)
    manifest_path.write_text(tomlw.dump_manifest(merged, HEADER))
    core.log(f"wrote {manifest_path} ({len(merged)} captures) in {time.time() - t0:.0f} s")
    if failed:
        core.log(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
