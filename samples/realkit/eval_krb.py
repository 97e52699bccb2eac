"""Evaluation Kerberos scenarios (samples/make_eval.py): a herd of kinit processes on ONE node.

60 worker processes on one host (one address, 10.77.2.1) share one service account and each
keeps its own credential cache: when the job starts they all run ``kinit -k -t keytab`` (and
then ask for a service ticket) within half a second, so the KDC sees 60 concurrent AS
exchanges from one address, each from its own source port (UDP) or its own connection (TCP).
This is the ticket-cache race of many workers on one GPU node, or a fleet behind one NAT.

* ``build_mit_udp``: MIT krb5kdc, MIT kinit + kvno, UDP (MIT's default for small requests).
* ``build_heimdal_tcp``: Heimdal kdc, Heimdal kinit + kgetcred, ``udp_preference_limit = 1``
  (TCP). Debian's heimdal-kdc / heimdal-clients conflict with krb5-kdc / krb5-user:
  samples/make_eval.py swaps the packages (``--swap-kdc``).

Healthy twins: the same 60 workers start jittered over 30 s.

Topology: [kdc] k0 10.77.0.88 ====veth==== lan0 [lan] 10.77.2.1 (every worker)
"""
from __future__ import annotations

import os
import random
import re
import subprocess
import threading
import time
from pathlib import Path

from . import facts, scen_krb
from .core import ADDED_DETECTORS, Lab, deb_version, first_packet_time, join_all, start_threads, wait_for
from .eval_common import capture, capture_name, healthy_twin, new_entry, pathological

KDC = scen_krb.KDC
REALM = scen_krb.REALM
NODE = "10.77.2.1"
PRINCIPAL = f"svc-train@{REALM}"
SERVICE = f"HTTP/feature-store.corp.example@{REALM}"
HEIMDAL_KDC_BIN = "/usr/lib/heimdal-servers/kdc"
PRESPAWN_S = 3.0   # the workers' kinit processes are started this long before the schedule
CLIENT_CONF = dict(admin_server=False, ticket_enctypes=True)   # scen_krb.write_krb5_conf's options


def _client_conf(path: Path, tcp: bool, heimdal: bool = False) -> None:
    # MIT honours udp_preference_limit = 1; Heimdal's library does not: it is told with a
    # tcp/ prefix on the KDC address instead
    scen_krb.write_krb5_conf(path, tcp, kdc=f"tcp/{KDC}" if tcp and heimdal else KDC, **CLIENT_CONF)


def _mit_kdc(lab: Lab, ns, d: Path, keytab: Path) -> Path:
    """MIT krb5kdc with the service account (+requires_preauth) and the service."""
    cmds = [f"addprinc -randkey +requires_preauth {PRINCIPAL}", f"addprinc -randkey {SERVICE}",
            f"ktadd -k {keytab} {PRINCIPAL}"]
    _, log = scen_krb.start_mit_kdc(lab, ns, d, cmds, "hseval-master-pw", log_name="kdc.log",
                                    renewable=False, **CLIENT_CONF)
    if not keytab.exists():
        raise RuntimeError(f"kadmin.local wrote no keytab {keytab}")
    return log


def _heimdal_kdc(lab: Lab, ns, d: Path, keytab: Path) -> Path:
    """Heimdal kdc (its own HDB in D) with the same principals."""
    conf = d / "krb5.conf"
    log = d / "kdc.log"
    conf.write_text(f"""[libdefaults]
    default_realm = {REALM}
[realms]
    {REALM} = {{
        kdc = {KDC}
    }}
[kdc]
    database = {{
        dbname = {d}/heimdal
        realm = {REALM}
        mkey_file = {d}/m-key
        acl_file = {d}/kadmind.acl
        log_file = {d}/iprop.log
    }}
    addresses = {KDC}
    ports = 88
    require-preauth = true
[logging]
    kdc = FILE:{log}
    default = FILE:{d}/default.log
""")
    (d / "kadmind.acl").write_text("")
    env = dict(os.environ, KRB5_CONFIG=str(conf))

    def kadmin(*args):
        p = subprocess.run(["kadmin", "-l", "-c", str(conf), *args], env=env,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"kadmin -l {' '.join(args)}: {p.stdout[-300:]} {p.stderr[-300:]}")

    subprocess.run(["kstash", "--random-key", f"--key-file={d}/m-key"],
                   env=env, check=True, capture_output=True, text=True)
    kadmin("init", "--realm-max-ticket-life=10h", "--realm-max-renewable-life=7d", REALM)
    kadmin("add", "--random-key", "--use-defaults", PRINCIPAL)
    kadmin("modify", "--attributes=+requires-pre-auth", PRINCIPAL)
    kadmin("add", "--random-key", "--use-defaults", SERVICE)
    kadmin("ext_keytab", "-k", str(keytab), PRINCIPAL)
    lab.spawn(ns, "heimdal-kdc", [HEIMDAL_KDC_BIN, f"--config-file={conf}",
                                  f"--addresses={KDC}", "--ports=88"], env={"KRB5_CONFIG": str(conf)})
    wait_for(lambda: log.exists() and "listening on" in log.read_text(), 15, "Heimdal kdc to start")
    return log


def run_herd(lab: Lab, out: Path, fname: str, healthy: bool, kdc: str, tcp: bool,
             n_workers: int = 60, sync_window: float = 0.3, jitter_window: float = 30.0,
             seed: int = 31) -> dict:
    rng = random.Random(seed)
    kdc_ns, lan = scen_krb.kdc_topology(lab)
    lan.ip("addr", "add", f"{NODE}/16", "dev", "lan0")
    d = lab.workdir / "kdc"
    d.mkdir()
    keytab = lab.workdir / "svc-train.keytab"
    kdc_log = (_mit_kdc if kdc == "mit" else _heimdal_kdc)(lab, kdc_ns, d, keytab)
    cdir = lab.workdir / "clients"
    cdir.mkdir()
    conf = cdir / "krb5.conf"
    _client_conf(conf, tcp, heimdal=kdc == "heimdal")
    fname_pcap = fname.replace(".pcapng", ".pcap")
    cap = capture(lab, kdc_ns, "k0", out / fname_pcap)
    if healthy:
        starts = sorted(rng.uniform(1.0, 1.0 + jitter_window) for _ in range(n_workers))
    else:
        starts = [1.0 + rng.uniform(0, sync_window) for _ in range(n_workers)]
    results: dict[int, dict] = {}
    t_base = time.time() + PRESPAWN_S
    if kdc == "mit":
        kinit = ["kinit", "-k", "-t", str(keytab), PRINCIPAL]
        tgs = ["kvno", SERVICE]
    else:
        kinit = ["kinit", f"--keytab={keytab}", PRINCIPAL]
        tgs = ["kgetcred", SERVICE]

    def env_of(i: int) -> dict:
        return {"KRB5_CONFIG": str(conf), "KRB5CCNAME": f"FILE:{cdir}/cc{i}",
                "PATH": "/usr/bin:/bin", "LANG": "C", "HOME": str(cdir),
                "KRB5_TRACE": str(cdir / f"trace{i}.log")}   # MIT's libkrb5 traces (Heimdal ignores it)

    # Every worker's kinit process exists before the schedule and waits on a pipe; one thread
    # releases them at their start times, so a start is a write, not a fork (60 forks on a
    # busy 2-core machine take ~0.5 s by themselves).
    with lan:
        procs = [subprocess.Popen(["sh", "-c", 'read _ && exec "$0" "$@"', *kinit], env=env_of(i),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(n_workers)]
    released = [threading.Event() for _ in range(n_workers)]
    t_start = [0.0] * n_workers

    def worker(i: int):
        p = procs[i]
        released[i].wait(120)
        r = dict(worker=i)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        r.update(kinit_start=t_start[i], kinit_end=time.time(), kinit_rc=p.returncode,
                 kinit_err=err.strip()[-200:])
        if p.returncode == 0:
            with lan:
                t1 = time.time()
                p2 = subprocess.run(tgs, env=env_of(i), capture_output=True, text=True, timeout=60)
            r.update(tgs_start=t1, tgs_end=time.time(), tgs_rc=p2.returncode,
                     tgs_err=p2.stderr.strip()[-200:])
        results[i] = r

    threads = start_threads(worker, n_workers)
    for i in sorted(range(n_workers), key=lambda k: starts[k]):
        time.sleep(max(0.0, t_base + starts[i] - time.time()))
        t_start[i] = time.time()
        procs[i].stdin.write("go\n")
        procs[i].stdin.flush()
        released[i].set()
    join_all(threads, 120)
    stats = cap.stop()
    traces = [(cdir / f"trace{i}.log").read_text(errors="replace")
              for i in range(n_workers) if (cdir / f"trace{i}.log").exists()]
    return dict(results=[results[i] for i in sorted(results)], t_first=first_packet_time(out / fname_pcap),
                traces=traces,
                stats=stats, fname=fname, kdc=kdc, tcp=tcp, n=n_workers,
                kdc_log=kdc_log.read_text(errors="replace"), sync_window=sync_window,
                jitter_window=jitter_window)


def _kdc_log_counts(kind: str, text: str) -> dict:
    if kind == "mit":
        return dict(kdc_log_as_req=len(re.findall(r"AS_REQ", text)),
                    kdc_log_as_issue=len(re.findall(r"AS_REQ .*ISSUE", text)),
                    kdc_log_preauth_required=len(re.findall(r"NEEDED_PREAUTH", text)),
                    kdc_log_tgs_issue=len(re.findall(r"TGS_REQ .*ISSUE", text)))
    return dict(kdc_log_as_req=len(re.findall(r"AS-REQ \S+ from ", text)),
                kdc_log_preauth_required=len(re.findall(r"Need to use PA-ENC-TIMESTAMP", text)),
                kdc_log_tgs_req=len(re.findall(r"TGS-REQ \S+ from ", text)))


def _trace_counts(traces: list[str]) -> dict:
    """From MIT's KRB5_TRACE logs (none for Heimdal): resends and transport fallbacks."""
    if not traces:
        return {}
    retry = [len(re.findall(r"Sending retry UDP request", t)) for t in traces]
    tcp = [len(re.findall(r"Initiating TCP connection", t)) for t in traces]
    return dict(trace_udp_resends=sum(retry), trace_tcp_connections=sum(tcp),
                trace_workers_resending=sum(1 for a, b in zip(retry, tcp) if a or b))


def entry_for(r: dict, scenario: str, healthy: bool) -> dict:
    res, t0, n = r["results"], r["t_first"], r["n"]
    ok = [x for x in res if x["kinit_rc"] == 0]
    ks = sorted(x["kinit_start"] for x in res)
    ts = sorted(x["tgs_start"] for x in res if "tgs_start" in x)
    proto = ("UDP" if not r["tcp"] else "TCP (udp_preference_limit = 1)" if r["kdc"] == "mit"
             else "TCP (kdc = tcp/10.77.0.88 in krb5.conf)")
    if r["kdc"] == "mit":
        soft = (f"MIT: krb5-kdc {deb_version('krb5-kdc')}, krb5-user {deb_version('krb5-user')} "
                "(kinit -k -t keytab, kvno)")
    else:
        soft = (f"Heimdal: heimdal-kdc {deb_version('heimdal-kdc')}, heimdal-clients "
                f"{deb_version('heimdal-clients')} (kinit --keytab, kgetcred)")
    made = (f"{soft}. KDC for {REALM} on {KDC} (UDP and TCP 88), service account {PRINCIPAL} "
            f"with required pre-authentication, keys in a keytab, and {SERVICE}. {n} worker "
            f"processes on ONE node ({NODE}), each with its own credential cache, run kinit then "
            f"ask for a ticket to {SERVICE}, over {proto}; "
            + (f"starts jittered over {r['jitter_window']:g} s" if healthy else
               f"all scheduled within {r['sync_window'] * 1000:g} ms (a job starting its workers)")
            + f"; each kinit process is started {PRESPAWN_S:g} s ahead and released at its start "
            "time through a pipe, kvno/kgetcred follow when it exits."
            + " Captured on the KDC's veth (whole frames, -s 2048, converted to pcapng).")
    measured = dict(workers=n, addresses=1, kinit_ok=len(ok),
                    tgs_ok=sum(1 for x in res if x.get("tgs_rc") == 0),
                    kinit_failed=[x["kinit_err"] for x in res if x["kinit_rc"] != 0][:3],
                    kinit_start_spread_ms=round((ks[-1] - ks[0]) * 1000, 1),
                    kinit_first_s=round(ks[0] - t0, 3), kinit_last_s=round(ks[-1] - t0, 3),
                    transport="tcp" if r["tcp"] else "udp",
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1),
                    **_kdc_log_counts(r["kdc"], r["kdc_log"]), **_trace_counts(r["traces"]))
    entry = new_entry(scenario, healthy, made, ext=".pcapng", pcapng=True, measured=measured)
    if healthy:
        return healthy_twin(entry, (
            f"The same {n} workers and exchanges spread over {r['jitter_window']:g} s: the KDC "
            "sees one or two AS exchanges at a time. No herd."))
    expect = [
        dict(detector="herd", kind="kerberos", min_severity="medium", start_s=round(ks[0] - t0, 3),
             tolerance_s=0.5, client=NODE, server=KDC, resource=f"krbtgt/{REALM}@{REALM}",
             count=1, count_tolerance=0,
             measured=dict(clients=n, addresses=1, as_exchanges_ok=len(ok),
                           spread_ms=measured["kinit_start_spread_ms"],
                           end_s=round(ks[-1] - t0, 3)))]
    if ts:
        expect.append(dict(
            detector="herd", kind="kerberos", min_severity="medium", start_s=round(ts[0] - t0, 3),
            tolerance_s=0.5, client=NODE, server=KDC, resource=SERVICE, count=1,
            count_tolerance=0,
            measured=dict(clients=len(ts), addresses=1,
                          spread_ms=round((ts[-1] - ts[0]) * 1000, 1), end_s=round(ts[-1] - t0, 3))))
    return pathological(entry, (
        f"{n} workers on {NODE} hit the KDC within {measured['kinit_start_spread_ms']:.0f} ms over "
        f"{'TCP, one connection each' if r['tcp'] else 'UDP, one source port each'}: every AS-REQ "
        "first gets KRB-ERROR 25 (PREAUTH_REQUIRED) and is resent with PA-ENC-TIMESTAMP; the "
        f"{len(ok)} that got a TGT then send a TGS-REQ for {SERVICE}."
        + (f" The KDC falls behind: {measured['trace_workers_resending']} workers got no answer "
           f"in time and tried again ({measured['trace_udp_resends']} UDP resends, "
           f"{measured['trace_tcp_connections']} TCP connections, from their KRB5_TRACE logs)."
           if measured.get("trace_workers_resending") else "")),
        silent=["smb_break_queue", "tcp_stall", "toctou", "conn_churn", *ADDED_DETECTORS], expect=expect)


def build_mit_udp(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "krb5-onenode-herd-mit-udp"
    r = run_herd(lab, out, capture_name(scen, healthy, ".pcapng"), healthy, "mit",
                 tcp=False, sync_window=0.15, seed=31)
    return entry_for(r, scen, healthy)


def build_heimdal_tcp(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "krb5-onenode-herd-heimdal-tcp"
    r = run_herd(lab, out, capture_name(scen, healthy, ".pcapng"), healthy, "heimdal",
                 tcp=True, sync_window=0.1, seed=37)
    return entry_for(r, scen, healthy)


def tshark_facts(entry: dict, path) -> dict:
    """What tshark sees: Kerberos messages by type, the client streams, the transport."""
    rows = facts.tshark_rows(path, "kerberos", ["kerberos.msg_type", "kerberos.error_code",
                                                "ip.src", "udp.srcport", "tcp.srcport"])
    types = [r[0].split(",")[0] for r in rows]
    reqs = [r for r in rows if r[0].split(",")[0] in ("10", "12")]
    return dict(as_req=types.count("10"), as_rep=types.count("11"), tgs_req=types.count("12"),
                tgs_rep=types.count("13"),
                krb_error_25=sum(1 for r in rows if r[0] == "30" and r[1] == "25"),
                client_addresses=len({r[2] for r in reqs}),
                client_ports=len({(r[2], r[3] or r[4]) for r in reqs}),
                over_tcp=sum(1 for r in reqs if r[4]))
