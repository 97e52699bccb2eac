"""Evaluation scenarios of Kerberos replay (samples/make_eval.py), on the topology of
realkit/scen_replay.py (MIT krb5kdc + slapd with SASL GSSAPI in one namespace, clients in another).

- krb5-replay-ldap-foreign-slow: another replayer and rate: the captured bindRequest is sent again
  40 times at 10/s and the TGS-REQ 10 times, from a *second* address (10.77.4.66), not the client's;
  twin: the same number of fresh authentications by the client.
- krb5-replay-ldap-no-rcache: the same replay against a slapd whose MIT replay cache is off
  (KRB5RCACHETYPE=none): 60 copies at 20/s, each *accepted* (saslBindInProgress with an AP-REP); twin:
  the same fresh authentications against the same server.
- krb5-kdc-udp-retries: a near-miss: legitimate clients whose KDC replies are lost retransmit their
  TGS-REQ over UDP, byte-identical, on the same socket (MIT's sendto_kdc), and the KDC's lookaside
  cache answers the copies. The KDC namespace drops every second UDP reply from port 88 (iptables
  statistic nth), so 20 concurrent ``kvno --no-store`` clients each lose a reply and retry; twin: the
  same 20 clients without the drop. Not a replay: the replay detector must stay below medium.
"""
from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

from . import scen_replay as R
from .core import Lab, deb_version, first_packet_time, join_all, run, start_threads
from .eval_common import ALL_DETECTORS, healthy_twin, new_entry, pathological

QUIET = list(ALL_DETECTORS) + R.NEW


def build_foreign_slow(lab: Lab, out: Path, healthy: bool) -> dict:
    e = R.build_replay(lab, out, healthy, scen="krb5-replay-ldap-foreign-slow", n_ldap=40, n_tgs=10,
                       interval=0.1, src=R.REPLAYER)
    e["below_high"] = list(QUIET) if healthy else []
    return e


def build_no_rcache(lab: Lab, out: Path, healthy: bool) -> dict:
    e = R.build_replay(lab, out, healthy, scen="krb5-replay-ldap-no-rcache", n_ldap=60, n_tgs=10, interval=0.05,
                       rcache=False)
    e["below_high"] = list(QUIET) if healthy else []
    return e


def run_retries(lab: Lab, out: Path, fname: str, drop: bool, n_clients: int = 20) -> dict:
    e = R.setup(lab)
    lan, srv = e["lan"], e["srv"]
    if drop:   # every second KDC reply over UDP is lost on its way out
        run(["ip", "netns", "exec", srv.name, "iptables", "-A", "OUTPUT", "-p", "udp", "--sport", "88", "-m",
             "statistic", "--mode", "nth", "--every", "2", "--packet", "0", "-j", "DROP"])
    cap = R.Capture(lab, srv, "s0", out / fname)
    env = R.client_env(e, "ccache")
    res: dict[int, tuple] = {}
    lock = threading.Lock()
    with lan:
        time.sleep(0.3)
        R.kinit(env)
    t_base = time.time() + 0.5

    def client(i: int):
        time.sleep(max(0.0, t_base + i * 0.05 - time.time()))
        with lan:
            t0 = time.time()
            p = subprocess.run(["kvno", "--no-store", R.LDAP_SPN], env=env, capture_output=True, text=True,
                               timeout=60)
        with lock:
            res[i] = (t0, time.time(), p.returncode)

    join_all(start_threads(client, n_clients), 90)
    time.sleep(0.5)
    stats = cap.stop()
    drops = 0
    if drop:
        out_rules = run(["ip", "netns", "exec", srv.name, "iptables", "-L", "OUTPUT", "-v", "-x", "-n"]).stdout
        m = re.search(r"^\s*(\d+)\s+\d+\s+DROP", out_rules, re.M)
        drops = int(m.group(1)) if m else -1
    kdc_log = e["kdc_log"].read_text(errors="replace")
    return dict(res=[res[i] for i in sorted(res)], stats=stats, drops=drops, kdc_log=kdc_log,
                t_first=first_packet_time(out / fname), n_clients=n_clients)


def build_udp_retries(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "krb5-kdc-udp-retries"
    fname = f"{scen}{'-healthy' if healthy else ''}.pcap"
    r = run_retries(lab, out, fname, drop=not healthy)
    res = r["res"]
    lat = sorted(x[1] - x[0] for x in res)
    measured = dict(
        clients=len(res), kvno_ok=sum(1 for x in res if x[2] == 0), kdc_replies_dropped=r["drops"],
        kdc_tgs_issued=len(re.findall(r"TGS_REQ .* ISSUE", r["kdc_log"])),
        kdc_lookaside_resends=len(re.findall(r"DISPATCH: repeated \(retransmitted\?\) request", r["kdc_log"])),
        median_kvno_s=round(lat[len(lat) // 2], 3), max_kvno_s=round(lat[-1], 3),
        first_kvno_s=round(min(x[0] for x in res) - r["t_first"], 3),
        capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    made = (f"krb5-kdc {deb_version('krb5-kdc')}, krb5-user {deb_version('krb5-user')}: MIT krb5kdc for {R.REALM} "
            f"on {R.KDC} (lookaside cache on: MIT's default); the client {R.CLIENT} runs kinit, then "
            f"{r['n_clients']} kvno --no-store {R.LDAP_SPN} start 50 ms apart (each a fresh TGS-REQ over UDP, "
            "kdc_timeout 3000 ms, max_retries 3)"
            + ("; iptables in the KDC's namespace drops every second UDP reply from port 88 (statistic nth 2), "
               "so the clients whose reply is lost resend the same TGS-REQ on the same socket"
               if not healthy else "; nothing is dropped")
            + ". Captured on the KDC's veth (full packets).")
    entry = new_entry(scen, healthy, made, measured=measured)
    if healthy:
        return healthy_twin(entry, (
            f"{measured['kvno_ok']} fresh TGS-REQs, each answered once ({measured['kdc_tgs_issued']} tickets issued, "
            f"{measured['kdc_lookaside_resends']} lookaside resends). No retry, no replay."), silent=QUIET)
    return pathological(entry, (
        f"{measured['kdc_replies_dropped']} KDC replies were dropped; the clients resent their identical TGS-REQ on "
        f"the same socket and krb5kdc answered {measured['kdc_lookaside_resends']} of the copies from its lookaside "
        f"cache ('repeated (retransmitted?) request'); {measured['kvno_ok']} of {measured['clients']} kvno succeeded, "
        f"the slowest after {measured['max_kvno_s']} s. The clients' own retransmissions, not a replay: the replay "
        "detector may say so (low), not more."),
        silent=[d for d in QUIET if d != "retry_storm"], below_high=["retry_storm"],
        also_acceptable=["retry_storm", "replay/kdc_request_repeat"], expect=[])
