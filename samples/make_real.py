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
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from realkit import core, driver, facts, tomlw  # noqa: E402

# nfs-ganesha with its VFS backend; the NFS clients are ours (realkit/nfs_client.py)
NFS_DEBS = ["nfs-ganesha", "nfs-ganesha-vfs"]

# name -> (module, build function, Debian packages, Python modules, has healthy twin)
SCENARIOS: dict[str, tuple[str, str, list[str], list[str], bool]] = {
    "dns-ttl-herd": ("scen_dns", "build_ttl_herd", ["unbound", "nsd"], ["dns"], True),
    "dns-retry-storm": ("scen_dns", "build_retry_storm", ["dnsmasq-base", "nsd"], ["dns"], True),
    "krb5-as-tgs-herd": ("scen_krb", "build_herd", ["krb5-kdc", "krb5-admin-server", "krb5-user"],
                         [], True),
    "ldap-conn-churn": ("scen_ldap", "build_churn", ["slapd", "ldap-utils"], ["ldap3"], True),
    "ldap-toctou": ("scen_ldap", "build_toctou", ["slapd", "ldap-utils"], ["ldap3"], True),
    "ldap-repl-conflict": ("scen_ldap_repl", "build_conflict", ["slapd", "ldap-utils"], ["ldap3"], True),
    "smb2-oplock-lease-break": ("scen_smb", "build_breaks", ["samba", "smbclient"],
                                ["smbprotocol"], True),
    "smb2-break-queue": ("scen_smb", "build_queue", ["samba", "smbclient"], ["smbprotocol"], True),
    "smb2-toctou": ("scen_smb", "build_toctou", ["samba", "smbclient"], ["smbprotocol"], True),
    "tcp-slow-start-after-idle": ("scen_tcp", "build_idle", [], [], True),
    "tcp-rto-blackout": ("scen_tcp", "build_blackout", [], [], True),
    "tcp-nagle-delayed-ack": ("scen_tcp", "build_nagle", [], [], True),
    "krb5-http-replay": ("scen_http", "build_replay", ["apache2", "libapache2-mod-auth-gssapi", "krb5-kdc",
                         "krb5-admin-server", "krb5-user", "curl"], [], True),
    "tcp-incast": ("scen_incast", "build_incast", ["iproute2", "tcpdump"], [], True),
    "krb5-replay-ldap-gssapi": ("scen_replay", "build_replay", ["krb5-kdc", "krb5-admin-server", "krb5-user",
                                "slapd", "ldap-utils", "libsasl2-modules-gssapi-mit", "tshark"], ["ldap3"], True),
    "ldap-saturation": ("scen_saturation", "build_ramp", ["slapd", "ldap-utils"], ["ldap3"], True),
    "cascade-dns-krb5": ("scen_cascade", "build_cascade", ["unbound", "nsd", "krb5-kdc", "krb5-admin-server",
                         "krb5-user"], ["dns"], True),
    "nfs4-open-herd": ("scen_nfs", "build_herd", NFS_DEBS, [], True),
    "nfs4-lock-polling": ("scen_nfs", "build_lock_polling", NFS_DEBS, [], True),
    "nfs4-lock-polling-growing": ("scen_nfs", "build_lock_polling_growing", NFS_DEBS, [], False),
    "nfs3-udp-retrans": ("scen_nfs", "build_udp_retrans", [*NFS_DEBS, "rpcbind"], [], True),
    # gcc: the IPv4-only socket shim ganesha runs with (realkit/nfs_server.py)
    "nfs4-delegation-recall": ("scen_nfs_deleg", "build_recall", ["nfs-ganesha", "nfs-ganesha-gluster",
                               "glusterfs-server", "gcc"], [], True),
    "nfs41-saturation": ("scen_nfs_saturation", "build_saturation", NFS_DEBS, [], True),
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
# Detectors: herd, retry_storm, smb_break_queue, tcp_stall, toctou, conn_churn, replay, saturation, incast,
# replication_conflict, lock_polling, delegation_recall.
'''


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
    path.write_text(tomlw.dump_manifest(sorted(entries, key=DRIVER.order_key), HEADER))
    core.log(f"refreshed the tshark facts of {len(entries)} captures in {path}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    DRIVER.add_arguments(ap, default_out=HERE)
    ap.add_argument("--refresh-facts", action="store_true",
                    help="only recompute [capture.tshark] of the captures in OUT (no root)")
    args = ap.parse_args(argv)
    if args.refresh_facts and not args.list:
        return refresh_facts(args.out.resolve())
    return DRIVER.main(args, ap)


DRIVER = driver.Driver("make_real.py", SCENARIOS, HEADER, add_facts, work_prefix="hsreal-",
                       is_installed=driver.has_version)


if __name__ == "__main__":
    sys.exit(main())
