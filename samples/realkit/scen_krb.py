"""Kerberos AS/TGS herd: MIT krb5kdc with pre-authentication, dozens of kinit + kvno at once.

Topology: [kdc] k0 10.77.0.88 ====veth==== lan0 [lan] clients 10.77.2.1..N

The clients are Debian's own kinit and kvno (krb5-user).  They cannot be told which source
address to use, so each runs under its own uid and a uid-range policy route
(``ip rule add uidrange U-U lookup T``; table T: route to the KDC with ``src 10.77.2.N``)
gives every client host its own address.  Some clients use a krb5.conf with
``udp_preference_limit = 1`` (TCP); the rest use UDP, MIT's default for small requests.
"""
from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

from .core import (ADDED_DETECTORS, ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, join_all, log,
                   start_threads, wait_for)

KDC = "10.77.0.88"
REALM = "CORP.EXAMPLE"
SERVICE = f"HTTP/app.corp.example@{REALM}"
UID0 = 30000


def client_addr(i: int) -> str:
    return f"10.77.2.{i + 1}"


def write_krb5_conf(path: Path, tcp: bool, kdc: str = KDC, admin_server: bool = True,
               ticket_enctypes: bool = False) -> None:
    """The clients' krb5.conf: UDP, or TCP (udp_preference_limit = 1); KDC as the realm's kdc
    line (realkit/eval_krb.py's Heimdal clients need a tcp/ prefix there); optionally without
    the admin_server line and with default_tkt/tgs_enctypes."""
    tkt = ("    default_tkt_enctypes = aes256-cts-hmac-sha1-96 aes128-cts-hmac-sha1-96\n"
           "    default_tgs_enctypes = aes256-cts-hmac-sha1-96 aes128-cts-hmac-sha1-96\n"
           if ticket_enctypes else "")
    admin = f"        admin_server = {KDC}\n" if admin_server else ""
    path.write_text(f"""[libdefaults]
    default_realm = {REALM}
    dns_lookup_kdc = false
    dns_lookup_realm = false
    rdns = false
    dns_canonicalize_hostname = false
    udp_preference_limit = {1 if tcp else 1465}
    kdc_timeout = 3000
    max_retries = 3
    permitted_enctypes = aes256-cts-hmac-sha1-96 aes128-cts-hmac-sha1-96
{tkt}
[realms]
    {REALM} = {{
        kdc = {kdc}
{admin}    }}
""")
    path.chmod(0o644)


def start_mit_kdc(lab: Lab, kdc_ns, d: Path, kadmin_cmds: list[str], master_pw: str,
                  log_name: str = "krb5kdc.log", renewable: bool = True,
                  **client_conf) -> tuple[subprocess.Popen, Path]:
    """MIT krb5kdc on KDC in KDC_NS, its database, stash and logs in D, its principals made with
    KADMIN_CMDS (kadmin.local); D/krb5.conf is ``write_krb5_conf(tcp=False, **CLIENT_CONF)``.
    (process, log file) once it logged "commencing operation"."""
    d.mkdir(exist_ok=True)
    renew = "        max_renewable_life = 7d 0h 0m 0s\n" if renewable else ""
    (d / "kdc.conf").write_text(f"""[kdcdefaults]
    kdc_ports = 88
    kdc_tcp_ports = 88

[realms]
    {REALM} = {{
        database_name = {d}/principal
        key_stash_file = {d}/stash
        acl_file = {d}/kadm5.acl
        kdc_listen = {KDC}
        kdc_tcp_listen = {KDC}
        max_life = 10h 0m 0s
{renew}        master_key_type = aes256-cts-hmac-sha1-96
        supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal
    }}

[logging]
    kdc = FILE:{d}/{log_name}
""")
    (d / "kadm5.acl").write_text("")
    write_krb5_conf(d / "krb5.conf", tcp=False, **client_conf)
    env = {"KRB5_CONFIG": str(d / "krb5.conf"), "KRB5_KDC_PROFILE": str(d / "kdc.conf")}
    subprocess.run(["kdb5_util", "create", "-s", "-r", REALM, "-P", master_pw],
                   env=dict(os.environ, **env), check=True, capture_output=True, text=True)
    p = subprocess.run(["kadmin.local", "-r", REALM], input="\n".join(kadmin_cmds) + "\nquit\n",
                       env=dict(os.environ, **env), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"kadmin.local: {p.stdout[-400:]} {p.stderr[-400:]}")
    kdc = lab.spawn(kdc_ns, "krb5kdc", ["krb5kdc", "-n", "-r", REALM, "-P", str(d / "kdc.pid")], env=env)
    log_path = d / log_name
    wait_for(lambda: log_path.exists() and "commencing operation" in log_path.read_text(), 15,
             "krb5kdc to start")
    return kdc, log_path


def _setup_kdc(lab: Lab, kdc_ns, users: list[tuple[str, str]]) -> dict:
    d = lab.workdir / "kdc"
    cmds = [f"addprinc -pw {pw} +requires_preauth {u}" for u, pw in users]
    cmds.append(f"addprinc -randkey {SERVICE}")
    kdc, _ = start_mit_kdc(lab, kdc_ns, d, cmds, "hsreal-master-pw")
    return dict(dir=d, proc=kdc)


def kdc_topology(lab: Lab):
    """(kdc, lan) namespaces: [kdc] k0 KDC/16 ====veth==== lan0 [lan]; the clients' addresses
    on lan0 are the caller's. The work directory is opened (0711) for the clients' uids."""
    lab.workdir.chmod(0o711)
    kdc_ns = lab.netns("kdc")
    lan = lab.netns("lan")
    lab.veth(kdc_ns, "k0", lan, "lan0")
    kdc_ns.ip("addr", "add", f"{KDC}/16", "dev", "k0")
    return kdc_ns, lan


def run_herd(lab: Lab, out: Path, healthy: bool, n_clients: int = 40, n_wrong: int = 3,
             n_tcp: int = 8, seed: int = 11) -> dict:
    rng = random.Random(seed)
    kdc_ns, lan = kdc_topology(lab)
    # client i: user i (good password) except: the last one asks for an unknown principal,
    # n_wrong of the others type a wrong password; n_tcp of them use TCP.
    roles = ["ok"] * n_clients
    roles[-1] = "unknown"
    for i in rng.sample(range(n_clients - 1), n_wrong):
        roles[i] = "wrong"
    tcp = set(rng.sample(range(n_clients), n_tcp))
    users = [(f"user{i + 1:02d}", f"Pw-{i + 1:02d}-{rng.randrange(10**6):06d}")
             for i in range(n_clients)]
    kdc = _setup_kdc(lab, kdc_ns, users[:-1])
    cdir = lab.workdir / "clients"
    cdir.mkdir(mode=0o755)
    cdir.chmod(0o755)
    write_krb5_conf(cdir / "krb5-udp.conf", tcp=False)
    write_krb5_conf(cdir / "krb5-tcp.conf", tcp=True)
    for i in range(n_clients):
        lan.ip("addr", "add", f"{client_addr(i)}/16", "dev", "lan0")
        table = str(100 + i)
        lan.ip("route", "add", f"{KDC}/32", "dev", "lan0", "src", client_addr(i), "table", table)
        lan.ip("rule", "add", "uidrange", f"{UID0 + i}-{UID0 + i}", "lookup", table)
        cc = cdir / f"cc{i}"
        cc.mkdir(mode=0o700)
        os.chown(cc, UID0 + i, UID0 + i)

    fname = "krb5-as-tgs-herd-healthy.pcap" if healthy else "krb5-as-tgs-herd.pcap"
    cap = Capture(lab, kdc_ns, "k0", out / fname)
    if healthy:
        starts = sorted(rng.uniform(1.0, 31.0) for _ in range(n_clients))
    else:
        starts = [1.0 + rng.uniform(0, 0.03) for _ in range(n_clients)]  # cron at :00, 30 ms jitter
    order = list(range(n_clients))
    rng.shuffle(order)
    results: dict[int, dict] = {}
    t_base = time.time()

    def client(slot: int):
        i = order[slot]
        uid = UID0 + i
        user, pw = users[i]
        if roles[i] == "unknown":
            user, pw = "nosuchuser", "whatever"
        elif roles[i] == "wrong":
            pw = pw + "-typo"
        env = {"KRB5_CONFIG": str(cdir / ("krb5-tcp.conf" if i in tcp else "krb5-udp.conf")),
               "KRB5CCNAME": f"FILE:{cdir}/cc{i}/ccache", "HOME": str(cdir / f"cc{i}"),
               "PATH": "/usr/bin:/bin", "LANG": "C"}

        def as_user():
            os.setgid(uid)
            os.setuid(uid)

        time.sleep(max(0.0, t_base + starts[slot] - time.time()))
        r = dict(client=client_addr(i), user=user, role=roles[i], tcp=i in tcp)
        with lan:
            t0 = time.time()
            p = subprocess.run(["kinit", f"{user}@{REALM}"], input=pw + "\n", env=env,
                               preexec_fn=as_user, capture_output=True, text=True, timeout=60)
            r.update(kinit_start=t0, kinit_end=time.time(), kinit_rc=p.returncode,
                     kinit_err=p.stderr.strip()[-200:])
            if p.returncode == 0:
                t1 = time.time()
                p2 = subprocess.run(["kvno", SERVICE], env=env, preexec_fn=as_user,
                                    capture_output=True, text=True, timeout=60)
                r.update(kvno_start=t1, kvno_end=time.time(), kvno_rc=p2.returncode,
                         kvno_err=p2.stderr.strip()[-200:])
        results[i] = r

    join_all(start_threads(client, n_clients), 120)   # `with lan:` in a thread switches only it
    stats = cap.stop()
    t_first = first_packet_time(out / fname)
    kdc_log = (kdc["dir"] / "krb5kdc.log").read_text(errors="replace")
    return dict(results=[results[i] for i in sorted(results)], t_first=t_first, stats=stats,
                fname=fname, n_clients=n_clients, kdc_log=kdc_log, t_base=t_base)




def build_herd(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_herd(lab, out, healthy)
    res, t0 = r["results"], r["t_first"]
    ok = [x for x in res if x["kinit_rc"] == 0]
    wrong = [x for x in res if x["role"] == "wrong"]
    unknown = [x for x in res if x["role"] == "unknown"]
    kinit_starts = sorted(x["kinit_start"] for x in res)
    kvno_starts = sorted(x["kvno_start"] for x in res if "kvno_start" in x)
    versions = (f"krb5-kdc {deb_version('krb5-kdc')}, krb5-admin-server (kadmin.local) "
                f"{deb_version('krb5-admin-server')}, krb5-user (kinit, kvno) "
                f"{deb_version('krb5-user')}")
    made = (f"{versions}. MIT krb5kdc for realm {REALM} on {KDC} (UDP and TCP 88), aes256/aes128 "
            f"only; {len(res) - 1} user principals with +requires_preauth and {SERVICE}. "
            f"{len(res)} clients, each Debian's kinit (password on stdin) then kvno {SERVICE}, "
            "run under its own uid so that a uidrange policy route gives it its own source "
            f"address 10.77.2.1-{len(res)}; {sum(1 for x in res if x['tcp'])} of them use "
            "udp_preference_limit = 1 (TCP), the others UDP. "
            + ("Starts jittered over 1-31 s." if healthy else
               "All are scheduled for the same instant (+-30 ms, like a cron job at :00); "
               "forking 40 kinit processes on a 2-core machine spreads the first AS-REQs "
               "over a few hundred ms (measured.kinit_start_spread_ms).")
            + " Captured on the KDC's veth (full packets, converted to pcapng).")
    measured = dict(
        clients=len(res), kinit_ok=len(ok), wrong_password=len(wrong),
        wrong_password_clients=[x["client"] for x in wrong],
        unknown_principal=len(unknown), unknown_principal_clients=[x["client"] for x in unknown],
        tcp_clients=sum(1 for x in res if x["tcp"]),
        kvno_ok=sum(1 for x in res if x.get("kvno_rc") == 0),
        kinit_start_spread_ms=round((kinit_starts[-1] - kinit_starts[0]) * 1000, 1),
        kinit_first_s=round(kinit_starts[0] - t0, 3), kinit_last_s=round(kinit_starts[-1] - t0, 3),
        capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"].replace(".pcap", ".pcapng"), scenario="krb5-as-tgs-herd",
                 healthy=healthy,
                 twin=("krb5-as-tgs-herd.pcapng" if healthy else "krb5-as-tgs-herd-healthy.pcapng"),
                 made_with=made, pcapng=True, measured=measured)
    if healthy:
        entry["what_happened"] = (
            f"The same {len(res)} clients, passwords and failures, but spread over 30 s: the KDC "
            "sees at most a few AS exchanges at a time. No herd.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"{len(res)} clients hit the KDC within {measured['kinit_start_spread_ms']:.0f} ms: every "
        "AS-REQ first gets KRB-ERROR 25 (PREAUTH_REQUIRED) and is resent with PA-ENC-TIMESTAMP; "
        f"{len(wrong)} wrong passwords get KRB-ERROR 24 (PREAUTH_FAILED), the unknown principal "
        f"nosuchuser gets KRB-ERROR 6 (C_PRINCIPAL_UNKNOWN); the {len(ok)} that got a TGT "
        f"immediately send a TGS-REQ for {SERVICE}.")
    entry["silent"] = ["smb_break_queue", "tcp_stall", "toctou", "conn_churn", *ADDED_DETECTORS]
    entry["expect"] = [
        dict(detector="herd", min_severity="medium", start_s=round(kinit_starts[0] - t0, 3),
             tolerance_s=0.5, client="", server=KDC, resource=f"krbtgt/{REALM}@{REALM}",
             count=1, count_tolerance=1,
             measured=dict(clients=len(res), as_exchanges_ok=len(ok),
                           spread_ms=measured["kinit_start_spread_ms"],
                           preauth_failed=len(wrong), principal_unknown=len(unknown))),
        dict(detector="herd", min_severity="medium", start_s=round(kvno_starts[0] - t0, 3),
             tolerance_s=0.5, client="", server=KDC, resource=SERVICE, count=1,
             count_tolerance=1,
             measured=dict(clients=len(kvno_starts),
                           spread_ms=round((kvno_starts[-1] - kvno_starts[0]) * 1000, 1))),
    ]
    return entry
