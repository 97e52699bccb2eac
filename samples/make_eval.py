#!/usr/bin/env python3
"""Record herdscope's evaluation captures (samples/eval/*.pcap*, samples/eval/MANIFEST.toml).

An evaluation set, not a tuning set: real servers and clients in scenarios the detectors were
not tuned to (other server software, one node vs many hosts, 5 -> 500 clients, synchronised vs
jittered), each with a healthy twin. It reuses samples/realkit (namespaces, captures, servers);
the scenarios are in samples/realkit/eval_*.py. Ground truth comes from the scenario's own logs
(clients, servers, iptables counters), never from a detector.

Run as root on Debian 12:

    python3 samples/make_eval.py --out samples/eval/              # everything (~8 min)
    python3 samples/make_eval.py --only dns-onenode-herd-bind --out /tmp/e
    python3 samples/make_eval.py --list
    python3 samples/make_eval.py --check

MIT and Heimdal KDCs conflict as Debian packages (krb5-kdc vs heimdal-kdc): the Heimdal
scenario swaps them with apt-get (MIT's krb5-kdc, krb5-admin-server and krb5-user out,
heimdal-kdc and heimdal-clients in: krb5-user conflicts with heimdal-clients) and the MIT
scenario swaps back, when --swap-kdc is given (at the end the KDC that was there before is put
back);
without it a missing KDC is reported with the apt-get line to run. Apart from that this script
installs nothing.
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from realkit import core, driver, facts  # noqa: E402

MIT_KDC = ["krb5-kdc", "krb5-admin-server", "krb5-user"]       # MIT KDC + MIT kinit/kvno
HEIMDAL_KDC = ["heimdal-kdc", "heimdal-clients"]               # Heimdal KDC + Heimdal kinit/kgetcred
MAX_ATTEMPTS = 3   # a capture in which tcpdump dropped packets is recorded again, this often

# name -> (module, build function, Debian packages, Python modules, has healthy twin)
SCENARIOS: dict[str, tuple[str, str, list[str], list[str], bool]] = {
    "dns-onenode-herd-bind": ("eval_dns", "build_onenode", ["bind9", "nsd"], ["dns"], True),
    "krb5-onenode-herd-mit-udp": ("eval_krb", "build_mit_udp", MIT_KDC, [], True),
    "krb5-onenode-herd-heimdal-tcp": ("eval_krb", "build_heimdal_tcp", HEIMDAL_KDC, [],
                                      True),
    "ldap-population-churn": ("eval_ldap", "build_population", ["slapd", "ldap-utils"], ["ldap3"],
                              True),
    "ldap-repl-conflict-12": ("eval_ldap_repl", "build_conflict12", ["slapd", "ldap-utils"], ["ldap3"], True),
    "ldap-repl-near-miss": ("eval_ldap_repl", "build_near_miss", ["slapd", "ldap-utils"], ["ldap3"], True),
    "ldap-repl-two-attrs": ("eval_ldap_repl", "build_two_attrs", ["slapd", "ldap-utils"], ["ldap3"], True),
    "dns-herd-dnsmasq-5": ("eval_dns", "build_sweep_5", ["dnsmasq-base", "nsd"], ["dns"], False),
    "dns-herd-dnsmasq-50": ("eval_dns", "build_sweep_50", ["dnsmasq-base", "nsd"], ["dns"], True),
    "dns-herd-dnsmasq-500": ("eval_dns", "build_sweep_500", ["dnsmasq-base", "nsd"], ["dns"], True),
    "tcp-syn-loss-population": ("eval_tcp", "build_syn_loss", ["iptables"], [], True),
    "tcp-incast-8x64k": ("eval_incast", "build_8x64k", ["iproute2", "tcpdump"], [], True),
    "tcp-incast-32x16k": ("eval_incast", "build_32x16k", ["iproute2", "tcpdump"], [], True),
    "tcp-incast-client-vantage": ("eval_incast", "build_client_vantage", ["iproute2", "tcpdump"], [], True),
    "smb2-break-queue-12": ("eval_smb", "build_queue12", ["samba", "smbclient"], ["smbprotocol"],
                            True),
    "dns-retry-storm-unbound": ("eval_dns", "build_storm_unbound", ["unbound", "nsd"], ["dns"],
                                True),
    "ldap-saturation-writes": ("eval_saturation", "build_writes", ["slapd", "ldap-utils"], ["ldap3"], True),
    "ldap-saturation-near-miss": ("eval_saturation", "build_near_miss", ["slapd", "ldap-utils"], ["ldap3"], False),
    "krb5-replay-ldap-foreign-slow": ("eval_replay", "build_foreign_slow", [*MIT_KDC, "slapd", "ldap-utils",
                                      "libsasl2-modules-gssapi-mit", "tshark"], ["ldap3"], True),
    "krb5-replay-ldap-no-rcache": ("eval_replay", "build_no_rcache", [*MIT_KDC, "slapd", "ldap-utils",
                                   "libsasl2-modules-gssapi-mit", "tshark"], ["ldap3"], True),
    "krb5-kdc-udp-retries": ("eval_replay", "build_udp_retries", [*MIT_KDC, "slapd", "ldap-utils",
                             "libsasl2-modules-gssapi-mit", "iptables"], ["ldap3"], True),
    "krb5-http-cached-token": ("eval_http", "build_cached_token", ["apache2", "libapache2-mod-auth-gssapi", *MIT_KDC,
                               "curl"], [], True),
}

HEADER = '''# herdscope EVALUATION captures: real servers in scenarios the detectors were not tuned to.
# Written by samples/make_eval.py (do not edit by hand: rebuild with it).
#
# Same schema as samples/MANIFEST.toml. Per capture: file, scenario, healthy, twin, made_with,
# what_happened, silent (detectors that must report nothing >= medium), below_high (detectors
# that must report nothing >= high), optional sweep {variable, value} (a point of an operating
# curve), optional note and also_acceptable (detector/kind readings of the same cause that are
# neither required nor forbidden), [capture.measured] (from the scenario's own logs),
# [capture.tshark] (what tshark sees),
# and [[capture.expect]] findings: detector, kind, min_severity, start_s (seconds after the first
# packet), tolerance_s, client, server, resource, count, count_tolerance,
# [capture.expect.measured]. min_severity "informational" marks a sweep point that may fire at
# any severity below high (or not at all: count_tolerance covers 0).
# Severity order: informational < low < medium < high < critical.
# Detectors: herd, retry_storm, smb_break_queue, tcp_stall, toctou, conn_churn, replay, saturation, incast,
# replication_conflict.
'''


def ensure_kdc(pkgs: list[str], swap: bool) -> None:
    """Make the KDC packages PKGS installed (they conflict with the other KDC's packages)."""
    if all(driver.installed(p) for p in pkgs):
        return
    other = HEIMDAL_KDC if pkgs == MIT_KDC else MIT_KDC
    line = ["apt-get", "install", "-y", "--no-install-recommends", *pkgs,
            *[f"{p}-" for p in other if driver.installed(p)]]
    if not swap:
        raise RuntimeError(f"KDC packages {pkgs} missing; run `{' '.join(line)}` or pass --swap-kdc")
    core.log("swapping KDC packages: " + " ".join(line))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    p = subprocess.run(line, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"apt-get failed: {p.stderr[-800:]}")


def kdc_for(name: str, swap: bool) -> None:
    """Before a Kerberos scenario: its KDC's packages installed (swapped in with --swap-kdc)."""
    for kdc in (MIT_KDC, HEIMDAL_KDC):
        if set(kdc) <= set(SCENARIOS[name][2]):
            ensure_kdc(kdc, swap)


def add_facts(entry: dict, out: Path) -> None:
    pcap = out / entry["file"]
    frames, duration = facts.tshark_frames(pcap)
    mod = importlib.import_module(f"realkit.{SCENARIOS[entry['scenario']][0]}")
    f = mod.tshark_facts(entry, pcap) if hasattr(mod, "tshark_facts") else {}
    entry["tshark"] = dict(frames_total=frames, duration_s=round(duration, 3), **f)
    entry["size_bytes"] = pcap.stat().st_size
    core.log(f"{entry['file']}: {entry['size_bytes']} bytes, tshark {entry['tshark']}")


def _iso_ns(text: str) -> int:
    """'2026-11-29T18:30:42.304612000Z' -> ns since the epoch (exact, no float rounding)."""
    import calendar
    import time
    date, _, frac = text.rstrip("Z").partition(".")
    secs = calendar.timegm(time.strptime(date, "%Y-%m-%dT%H:%M:%S"))
    return secs * 1_000_000_000 + int((frac + "000000000")[:9])


# the findings' columns groundtruth.py reads
MATCHED_COLUMNS = ("detector", "kind", "finding_id", "severity", "start_ns", "server", "resource", "member_of")


def judge(entry: dict, scan: dict) -> tuple[str, str, str]:
    """(expected, reported, verdict) for one capture from ``herdscope scan --format json``, by
    samples/groundtruth.py (the matching tests/test_detectors_eval.py asserts with). Verdict
    words: ok, MISS, DOWNGRADED (the right finding, below the floor), COUNT (too many matching
    findings), EXTRA (findings >= medium of an expected detector that match no expectation:
    split or spurious), FALSE ALARM (a silent / below_high rule broken)."""
    sys.path.insert(0, str(HERE.parent))       # groundtruth needs the detectors package
    import groundtruth as gt
    import polars as pl
    from detectors.base import FINDINGS_SCHEMA

    cap = scan["captures"][0]
    t0 = _iso_ns(cap["first_time"]) if cap["packets"] else 0
    schema = {k: FINDINGS_SCHEMA[k] for k in MATCHED_COLUMNS}
    fs = pl.DataFrame([{k: f.get(k) for k in schema} for f in scan["findings"]], schema=schema)
    problems = gt.problems(fs, entry, t0)
    return gt.describe_expected(entry), gt.describe_found(fs), "; ".join(problems) or "ok"


def scan_table(out: Path, herdscope: str = "") -> int:
    """Run `herdscope scan --format json` on every capture of OUT/MANIFEST.toml and print a
    Markdown table: capture, expected, what herdscope reports, verdict. HERDSCOPE: the command
    to run (default: the herdscope next to this interpreter)."""
    import json
    herdscope = herdscope or str(Path(sys.executable).with_name("herdscope"))
    entries = tomllib.loads((out / "MANIFEST.toml").read_text())["capture"]
    print("| capture | expected | herdscope reports (detector/kind severity x count) | verdict |")
    print("|---|---|---|---|")
    bad = 0
    for e in entries:
        p = subprocess.run([*herdscope.split(), "scan", "--format", "json", str(out / e["file"])],
                           capture_output=True, text=True, timeout=900)
        try:
            scan = json.loads(p.stdout)
        except json.JSONDecodeError:
            print(f"| {e['file']} | | scan failed (exit {p.returncode}) | ERROR |")
            bad += 1
            continue
        exp, rep, verdict = judge(e, scan)
        bad += verdict != "ok"
        print(f"| {e['file']} | {exp} | {rep} | {verdict} |", flush=True)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    DRIVER.add_arguments(ap, default_out=HERE / "eval")
    ap.add_argument("--healthy-only", action="store_true", help="only the healthy twins")
    ap.add_argument("--swap-kdc", action="store_true",
                    help="let the script swap MIT and Heimdal KDC packages with apt-get")
    ap.add_argument("--scan", action="store_true",
                    help="no recording: scan every capture in OUT with herdscope and print the "
                         "expected-vs-reported table (no root needed)")
    ap.add_argument("--herdscope", default="", help="with --scan: the herdscope command to run")
    args = ap.parse_args(argv)
    if args.scan:
        return scan_table(args.out.resolve(), args.herdscope)
    had = [k for k in (MIT_KDC, HEIMDAL_KDC) if all(driver.installed(p) for p in k)]
    DRIVER.before_build = lambda name: kdc_for(name, args.swap_kdc)
    rc = DRIVER.main(args, ap)
    if args.swap_kdc and had and not (args.list or args.check):
        ensure_kdc(had[0], swap=True)      # put back the KDC that was installed before
    return rc


DRIVER = driver.Driver("make_eval.py", SCENARIOS, HEADER, add_facts, work_prefix="hseval-",
                       work_label_chars=30, managed_debs=tuple(MIT_KDC + HEIMDAL_KDC),
                       attempts=MAX_ATTEMPTS, list_widths=(32, 40),
                       check_note="KDC packages are swapped per scenario with --swap-kdc")


if __name__ == "__main__":
    sys.exit(main())
