#!/usr/bin/env python3
"""Deterministic synthetic captures: normal mixed traffic with labelled pathologies.

    python samples/synth.py --packets 1000000 --seed 1 --out big.pcap [--format pcap|pcapng] [--nanosecond]

writes ``big.pcap`` and ``big.pcap.labels.json``. The same arguments always give byte-identical
files (the randomness is one ``random.Random(seed)``; nothing depends on hash order, the clock or
the platform's byte order).

What is in it
-------------
A capture taken on a switch port next to the servers of a small Windows/Linux site:

* TCP: full handshakes with MSS/wscale/SACK-permitted/timestamp options (Linux- and
  Windows-style), data both ways with delayed ACKs and window-limited bursts, FIN teardown, some
  RSTs (aborts, SYN to a closed port), RTO retransmissions (~200 ms, on WAN paths), duplicate
  ACKs with SACK blocks and fast retransmits, an occasional zero window + probe + window update.
* DNS over UDP (A/AAAA/CNAME answers, NXDOMAIN with SOA, EDNS OPT) and a little over TCP.
* Kerberos over UDP and TCP 88: AS-REQ -> KRB-ERROR 25 -> AS-REQ with PA-ENC-TIMESTAMP -> AS-REP,
  TGS-REQ -> TGS-REP, some KRB-ERROR 6/24.
* LDAP over TCP 389: simple bind, searches with filters, modifies, unbind; messages split across
  segments and several messages per segment.
* SMB2 over TCP 445: NEGOTIATE, SESSION_SETUP (SPNEGO/NTLMSSP), TREE_CONNECT, CREATE with oplocks
  and leases, READ, WRITE, CLOSE, oplock and lease breaks with acks, STATUS_PENDING + async final.
* HTTP/1.1 request/response traffic (the bulk of the bytes) and one-way syslog.
* IPv4 and some IPv6.

Pathologies (one label each, see ``LABEL_KEYS``): a DNS TTL-expiry herd, a DNS retry storm, a
Kerberos AS herd, an SMB2 lease-break queue, a TCP RTO stall on a LAN path, LDAP connection
churn and an SMB2 check-then-use (TOCTOU) window. Normal traffic also contains benign versions
of some of the same mechanics (RTO retransmissions on WAN paths with tens of ms of RTT, quick
oplock/lease breaks, short LDAP connections); those are not labelled.

Labels: ``<capture>.labels.json`` is a JSON list of objects with keys ``detector`` (herd,
retry_storm, smb_break_queue, tcp_stall, toctou, conn_churn), ``start_ns``/``end_ns`` (epoch ns
of the first and last packet of the episode, as written in the capture, i.e. truncated to µs in
µs captures), ``clients`` (list of IP strings), ``server`` (IP string), ``server_port``,
``protocol``, ``resource``, ``description`` and ``parameters`` (detector-specific details).

Speed: every frame is packed with ``struct`` from per-flow precomputed pieces, checksums with one
``int.from_bytes`` per header/payload (see ``samples/synthkit/frames.py``); dpkt builds the
reference frames the tests compare against (see ``dpkt_reference_frame``).

Code: ``samples/synthkit/`` holds the generator, one job per module (wire encoders per protocol,
frames, the TCP model, client conversations, the site, normal traffic, the pathologies, the
scheduling, the writer; see its ``__init__``). This file is the command line plus the names other
code imports from ``synth`` (``samples/synth_scenarios.py``, ``tests/``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:       # synthkit sits beside this file (also when loaded by path or as samples.synth)
    sys.path.insert(0, _HERE)

# Re-exports: every name other modules use as ``synth.<name>`` (tests/test_synth.py checks the list)
from synthkit.base import (BASE_EPOCH_NS, DETECTORS, DOMAIN, GENERATOR_VERSION, LABEL_KEYS,  # noqa: E402,F401
                           MIN_PACKETS, MS, REALM, SEC, US)
from synthkit.dns import T_A, T_AAAA, DnsBuilder  # noqa: E402,F401
from synthkit.frames import (ACK, FIN, PROTO_TCP, PROTO_UDP, PSH, RST, SYN, Host, Path, Store,  # noqa: E402,F401
                             dpkt_reference_frame)
from synthkit.generator import Gen  # noqa: E402,F401
from synthkit.kerberos import (KDC_OPT_AS, KDC_OPT_TGS, KRB_AS_REP, KRB_AS_REQ, KRB_ERROR,  # noqa: E402,F401
                               KRB_TGS_REP, KRB_TGS_REQ, NT_PRINCIPAL, NT_SRV_INST, PA_ENC_TIMESTAMP, PA_TGS_REQ,
                               krb_ap_req, krb_error, krb_kdc_rep, krb_kdc_req, krb_padata, krb_principal,
                               krb_req_body, krb_ticket)
from synthkit.ldap import f_and, f_eq, f_or, f_present, f_substr  # noqa: E402,F401
from synthkit.sessions import Ldap, Smb, SmbOpen  # noqa: E402,F401
from synthkit.site import LDAP_BASE, Zone  # noqa: E402,F401
from synthkit.tcp import SYN_RTO, Tcp  # noqa: E402,F401
from synthkit.writer import generate, labels_json, write_capture  # noqa: E402,F401


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=1_000_000, help="exact number of records (default 1,000,000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="capture file to write; labels go to OUT.labels.json")
    ap.add_argument("--format", choices=("pcap", "pcapng"), default="pcap")
    ap.add_argument("--nanosecond", action="store_true", help="ns timestamps (pcap ns magic / if_tsresol=9)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    try:
        summary = generate(a.out, a.packets, a.seed, a.format, a.nanosecond)
    except ValueError as e:
        print(f"synth.py: {e}", file=sys.stderr)
        return 2
    if not a.quiet:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
