"""Kerberos over HTTP (SPNEGO ``Negotiate``, RFC 4559): fresh authentications vs a replayed header.

Topology: [srv] k0 10.77.0.88 (MIT krb5kdc) + 10.77.0.80 (Apache 2.4 + mod_auth_gssapi)
          ====veth==== lan0 [lan] clients 10.77.2.1..N, replayer 10.77.2.200

Each client runs kinit (password on stdin) then Debian's curl ``--negotiate -u :`` against
``http://web.corp.example/private/`` (``--resolve`` to 10.77.0.80, ``--interface`` its own address),
so every curl run is a fresh GSS-API context: a new authenticator inside a new AP-REQ (curl first
sends the request bare, gets ``401 WWW-Authenticate: Negotiate``, then sends ``Authorization:
Negotiate <SPNEGO NegTokenInit>``; Apache answers 200 with the AP-REP as a ``WWW-Authenticate:
Negotiate`` token). Pathological half: the ``Authorization`` headers of a few of those curl runs
(read from ``curl -v``) are sent again, many times, from another address over raw sockets:
Apache's MIT replay cache (``KRB5RCACHEDIR``, the ``dfl:`` cache keyed on the authenticator's
checksum tail) rejects them; what Apache answered (status, any token) and what its error log said
are the ground truth. Healthy twin: the same number of extra authentications, all fresh (curl).
"""
from __future__ import annotations

import os
import pwd
import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

from .core import ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, join_all, log, start_threads, wait_for
from .scen_krb import KDC, REALM, kdc_topology, start_mit_kdc, write_krb5_conf

WEB = "10.77.0.80"
WEB_HOST = "web.corp.example"
SPN = f"HTTP/{WEB_HOST}"
URL = f"http://{WEB_HOST}/private/"
REPLAYER = "10.77.2.200"
NEW_DETECTORS = ["replay", "saturation", "incast", "replication_conflict"]


def client_addr(i: int) -> str:
    return f"10.77.2.{i + 1}"


def _apache_conf(d: Path) -> Path:
    mods = "/usr/lib/apache2/modules"
    (d / "htdocs" / "private").mkdir(parents=True, exist_ok=True)
    (d / "htdocs" / "private" / "index.html").write_text("ok\n")
    (d / "run").mkdir(exist_ok=True)
    conf = d / "httpd.conf"
    conf.write_text(f"""ServerRoot {d}
ServerName {WEB_HOST}
Listen {WEB}:80
PidFile {d}/run/httpd.pid
DefaultRuntimeDir {d}/run
ErrorLog {d}/error.log
LogLevel info auth_gssapi:debug
User www-data
Group www-data
LoadModule mpm_event_module {mods}/mod_mpm_event.so
LoadModule authn_core_module {mods}/mod_authn_core.so
LoadModule authz_core_module {mods}/mod_authz_core.so
LoadModule authz_user_module {mods}/mod_authz_user.so
LoadModule dir_module {mods}/mod_dir.so
LoadModule auth_gssapi_module {mods}/mod_auth_gssapi.so
LogFormat "%a %{{%s}}t.%{{usec_frac}}t \\"%r\\" %>s %u" hs
CustomLog {d}/access.log hs
KeepAlive On
DocumentRoot {d}/htdocs
DirectoryIndex index.html
<Directory {d}/htdocs>
    Require all granted
</Directory>
<Location /private>
    AuthType GSSAPI
    AuthName "herdscope"
    GssapiCredStore keytab:{d}/http.keytab
    GssapiAllowedMech krb5
    Require valid-user
</Location>
""")
    return conf


def _curl(env: dict, i: int) -> dict:
    """One fresh Negotiate authentication by curl; its status and the Authorization header it sent."""
    t0 = time.time()
    p = subprocess.run(["curl", "-sv", "-o", "/dev/null", "-w", "%{http_code}", "--negotiate", "-u", ":",
                        "--resolve", f"{WEB_HOST}:80:{WEB}", "--interface", client_addr(i), URL],
                       env=env, capture_output=True, text=True, timeout=30)
    auth = re.findall(r"^> Authorization: (Negotiate \S+)", p.stderr, re.M)
    return dict(client=client_addr(i), start=t0, end=time.time(), rc=p.returncode,
                status=p.stdout.strip(), authorization=auth[-1] if auth else "")


def _replay(header: str, src: str) -> dict:
    """Send a GET with a captured Authorization header on a new connection; what Apache answered."""
    req = (f"GET /private/ HTTP/1.1\r\nHost: {WEB_HOST}\r\nUser-Agent: hs-replay\r\n"
           f"Authorization: {header}\r\nConnection: close\r\n\r\n").encode()
    t0 = time.time()
    with socket.create_connection((WEB, 80), timeout=10, source_address=(src, 0)) as s:
        s.sendall(req)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    status = head.split(" ", 2)[1] if head.startswith("HTTP/") else ""
    www = re.findall(r"^WWW-Authenticate: *(.*)$", head, re.M | re.I)
    return dict(start=t0, end=time.time(), status=status, www_authenticate=[w.strip() for w in www])


def start_web(lab: Lab, n_clients: int, master_pw: str = "hsreal-master-pw") -> dict:
    """The KDC and Apache in [srv], N_CLIENTS users with addresses on lan0 (and REPLAYER's); returns
    srv, lan, users, envs (each client's KRB5_CONFIG / KRB5CCNAME), web (Apache's directory), apache."""
    srv, lan = kdc_topology(lab)
    srv.ip("addr", "add", f"{WEB}/16", "dev", "k0")
    users = [(f"user{i + 1:02d}", f"Pw-{i + 1:02d}-http") for i in range(n_clients)]
    d = lab.workdir / "kdc"
    cmds = [f"addprinc -pw {pw} +requires_preauth {u}" for u, pw in users]
    cmds += [f"addprinc -randkey {SPN}", f"ktadd -k {lab.workdir}/web/http.keytab {SPN}"]
    web = lab.workdir / "web"
    web.mkdir(mode=0o755)
    start_mit_kdc(lab, srv, d, cmds, master_pw)
    www = pwd.getpwnam("www-data")
    keytab = web / "http.keytab"
    os.chown(keytab, www.pw_uid, www.pw_gid)
    rcdir = web / "rcache"
    rcdir.mkdir()
    os.chown(rcdir, www.pw_uid, www.pw_gid)
    conf = _apache_conf(web)
    web.chmod(0o755)
    apache = lab.spawn(srv, "apache2", ["apache2", "-f", str(conf), "-DFOREGROUND"],
                       env={"KRB5_CONFIG": str(d / "krb5.conf"), "KRB5RCACHEDIR": str(rcdir),
                            "LANG": "C"})
    wait_for(lambda: (web / "run" / "httpd.pid").exists(), 15, "apache2 to start")
    cdir = lab.workdir / "clients"
    cdir.mkdir(mode=0o755)
    write_krb5_conf(cdir / "krb5.conf", tcp=False)
    for i in range(n_clients):
        lan.ip("addr", "add", f"{client_addr(i)}/16", "dev", "lan0")
    lan.ip("addr", "add", f"{REPLAYER}/16", "dev", "lan0")
    envs = [{"KRB5_CONFIG": str(cdir / "krb5.conf"), "KRB5CCNAME": f"FILE:{cdir}/cc{i}",
             "HOME": str(cdir), "PATH": "/usr/bin:/bin", "LANG": "C"} for i in range(n_clients)]
    return dict(srv=srv, lan=lan, users=users, envs=envs, web=web, apache=apache)


def kinit_all(w: dict) -> list[int]:
    """kinit every user of start_web's W (password on stdin); their return codes."""
    codes = []
    with w["lan"]:
        for i, (u, pw) in enumerate(w["users"]):
            p = subprocess.run(["kinit", f"{u}@{REALM}"], input=pw + "\n", env=w["envs"][i], capture_output=True,
                               text=True, timeout=30)
            codes.append(p.returncode)
    return codes


def apache_logs(w: dict) -> tuple[str, list[str]]:
    """(error log, access log lines) of start_web's Apache."""
    return ((w["web"] / "error.log").read_text(errors="replace"),
            (w["web"] / "access.log").read_text(errors="replace").splitlines())


def run_http(lab: Lab, out: Path, healthy: bool, n_clients: int = 16, per_client: int = 1,
             n_captured: int = 3, replays_each: int = 40, replay_threads: int = 4,
             healthy_spacing_s: float = 0.06) -> dict:
    """PER_CLIENT fresh curl authentications by each of N_CLIENTS clients; then N_CAPTURED of their
    Authorization headers replayed REPLAYS_EACH times from REPLAYER over REPLAY_THREADS connections at
    a time, or (healthy) as many fresh authentications, one every HEALTHY_SPACING_S across the clients
    (every client fewer than conn_churn's min_connections 10: one curl run is one connection)."""
    w = start_web(lab, n_clients)
    srv, lan, envs = w["srv"], w["lan"], w["envs"]
    fname = "krb5-http-replay-healthy.pcap" if healthy else "krb5-http-replay.pcap"
    cap = Capture(lab, srv, "k0", out / fname)
    fresh: list[dict] = []
    replays: list[dict] = []
    kinits = kinit_all(w)

    def client(i: int):
        with lan:
            for _ in range(per_client):
                fresh.append(_curl(envs[i], i) | dict(phase="baseline"))
                time.sleep(0.05)

    join_all(start_threads(client, n_clients), 120)
    captured = [r["authorization"] for r in fresh if r["status"] == "200" and r["authorization"]][:n_captured]
    if len(captured) < n_captured:
        raise RuntimeError(f"curl --negotiate did not authenticate: {fresh[:3]} {lab.logtail('apache2')}")
    time.sleep(1.0)
    t_burst = time.time()
    n_burst = len(captured) * replays_each
    work = [(k, j) for k in range(len(captured)) for j in range(replays_each)]

    def burst(t: int):
        with lan:
            for k, j in work[t::replay_threads]:
                replays.append(_replay(captured[k], REPLAYER) | dict(header=k))

    def fresh_burst(i: int):  # the same number of authentications, fresh, every client paced
        with lan:
            for j in range(i, n_burst, n_clients):
                time.sleep(max(0.0, t_burst + j * healthy_spacing_s - time.time()))
                fresh.append(_curl(envs[i], i) | dict(phase="burst"))

    if healthy:
        join_all(start_threads(fresh_burst, n_clients), 300)
    else:
        join_all(start_threads(burst, replay_threads), 300)
    t_burst_end = time.time()
    time.sleep(0.5)
    stats = cap.stop()
    lab.stop(w["apache"])
    error_log, access = apache_logs(w)
    return dict(fresh=fresh, replays=replays, kinits=kinits, stats=stats, fname=fname, t_first=first_packet_time(
        out / fname), t_burst=t_burst, t_burst_end=t_burst_end, error_log=error_log, access=access,
        n_clients=n_clients, per_client=per_client, captured=len(captured))


def build_replay(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_http(lab, out, healthy)
    t0 = r["t_first"]
    fresh, replays = r["fresh"], r["replays"]
    replay_status = Counter(x["status"] for x in replays)
    replay_tokens = sum(1 for x in replays if any(w.split()[1:] for w in x["www_authenticate"]))
    access_status = Counter(line.rsplit(" ", 2)[-2] for line in r["access"] if line.count('"') >= 2)
    err = r["error_log"]
    replay_lines = len(re.findall(r"Request is a replay", err))
    versions = (f"apache2 {deb_version('apache2')}, libapache2-mod-auth-gssapi "
                f"{deb_version('libapache2-mod-auth-gssapi')}, krb5-kdc {deb_version('krb5-kdc')}, "
                f"krb5-user {deb_version('krb5-user')}, curl {deb_version('curl')}")
    n_burst = len(replays) if not healthy else sum(1 for x in fresh if x["phase"] == "burst")
    made = (f"{versions}. MIT krb5kdc for {REALM} on {KDC}; Apache 2.4 (mpm_event, KeepAlive on) on {WEB}:80 with "
            f"mod_auth_gssapi (AuthType GSSAPI, GssapiAllowedMech krb5, keytab for {SPN}, MIT replay cache in "
            f"KRB5RCACHEDIR) protecting /private/. {r['n_clients']} clients (10.77.2.1-{r['n_clients']}) kinit "
            f"then run curl --negotiate -u : {URL} ({r['per_client']} fresh GSS context each). "
            + ("Then " + str(n_burst) + " more fresh curl authentications, one every 60 ms across the "
               f"{r['n_clients']} clients." if healthy else
               f"Then {REPLAYER} resends the Authorization: Negotiate headers of {r['captured']} of those "
               f"curl runs (from curl -v), {n_burst} times in all, 4 connections at a time, one request "
               "per connection (Python sockets).")
            + " Captured on the server veth k0 (full packets, converted to pcapng).")
    measured = dict(
        clients=r["n_clients"], kinit_ok=sum(1 for c in r["kinits"] if c == 0),
        fresh_authentications=len(fresh), fresh_ok=sum(1 for x in fresh if x["status"] == "200"),
        replays=len(replays), replay_headers=r["captured"] if not healthy else 0,
        **{f"replay_status_{k}": v for k, v in sorted(replay_status.items())},
        replay_responses_with_token=replay_tokens,
        **{f"apache_access_status_{k}": v for k, v in sorted(access_status.items())},
        apache_error_log_replay_lines=replay_lines,
        burst_start_s=round(r["t_burst"] - t0, 3), burst_end_s=round(r["t_burst_end"] - t0, 3),
        capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    sample_err = [ln for ln in err.splitlines() if "Request is a replay" in ln][:1]
    if sample_err:
        measured["apache_error_log_sample"] = sample_err[0][-300:]
    entry = dict(file=r["fname"].replace(".pcap", ".pcapng"), scenario="krb5-http-replay", healthy=healthy,
                 twin=("krb5-http-replay.pcapng" if healthy else "krb5-http-replay-healthy.pcapng"),
                 made_with=made, pcapng=True, measured=measured)
    if healthy:
        entry["what_happened"] = (
            f"{len(fresh)} Negotiate authentications, every one a fresh AP-REQ; Apache answered "
            f"{measured['fresh_ok']} of them 200 (curl sends the Negotiate token with its first request; the "
            "200 carries the AP-REP). No replay.")
        entry["silent"] = list(ALL_DETECTORS) + NEW_DETECTORS
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"{len(fresh)} fresh authentications (200), then {len(replays)} replays of {r['captured']} captured "
        f"Authorization headers within {measured['burst_end_s'] - measured['burst_start_s']:.1f} s; Apache "
        f"answered every one {'/'.join(sorted(replay_status))} with a WWW-Authenticate: Negotiate token "
        f"({replay_tokens} of {len(replays)}: a SPNEGO reject carrying KRB-ERROR 34 KRB_AP_ERR_REPEAT, as tshark "
        f"shows it); its error log has {replay_lines} lines 'gss_accept_sec_context() failed: ... (Request is a "
        "replay)'.")
    entry["silent"] = [d for d in ALL_DETECTORS if d != "conn_churn"] + ["saturation", "incast",
                                                                         "replication_conflict"]
    # one finding: the replay detector reports per service (server, sname, realm) and episode, and
    # the burst of copies of every captured header is one episode
    entry["expect"] = [dict(detector="replay", kind="authenticator_replay", min_severity="medium",
                            start_s=measured["burst_start_s"], tolerance_s=1.0, client="", server=WEB,
                            resource=f"{SPN}@{REALM}", count=1, count_tolerance=0,
                            measured=dict(replays=len(replays), headers=r["captured"],
                                          rejected=sum(v for k, v in replay_status.items() if k != "200")))]
    return entry
