"""Evaluation scenario (samples/make_eval.py): an HTTP client that caches its Negotiate header.

A known client bug (libraries that compute ``Authorization: Negotiate`` once and attach it to every
request): one client, one keep-alive connection to Apache 2.4 + mod_auth_gssapi, 60 GETs 50 ms apart,
all carrying the same SPNEGO token. The first is accepted (200 with the AP-REP); every later one is a
replay of the same authenticator from the same address and port, on the same connection, and MIT's
replay cache makes Apache answer 401 (a SPNEGO reject with KRB-ERROR 34). Unlike the real sample's
replayer (samples/realkit/scen_http.py: a foreign address, 120 connections in 0.1 s) this is the
original client at a moderate rate: the "legitimate client that retransmits" of the issue.

Healthy twin: the same client, connection and pacing, a fresh token for every request (all 200).

The tokens come from Debian's curl --negotiate (the only GSS-API client at hand): curl sends its
token to a one-shot listener in the client's own namespace (127.0.0.1:8081, the same host name, so the
same service principal), which answers 401 and keeps the header; the capture on the server's veth
does not see that.

Topology: as scen_http: [srv] k0 10.77.0.88 (KDC) + 10.77.0.80 (Apache) ==== lan0 [lan] 10.77.2.1
"""
from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from .core import ALL_DETECTORS, Lab, deb_version, first_packet_time
from .eval_common import capture, capture_name, healthy_twin, new_entry, pathological
from .scen_http import NEW_DETECTORS, REALM, SPN, WEB, WEB_HOST, apache_logs, client_addr, kinit_all, start_web

SCEN = "krb5-http-cached-token"
TOKEN_PORT = 8081  # the one-shot listener that collects curl's Authorization header


def _token(env: dict) -> str:
    """A fresh ``Negotiate <token>`` from curl --negotiate, caught by a listener on 127.0.0.1."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", TOKEN_PORT))
    srv.listen(4)
    got: list[str] = []

    def serve():
        srv.settimeout(10)
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            m = re.search(rb"^Authorization: (Negotiate \S+)\r$", data, re.M)
            if m:
                got.append(m.group(1).decode())
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    subprocess.run(["curl", "-s", "-o", "/dev/null", "--negotiate", "-u", ":", "--resolve",
                    f"{WEB_HOST}:{TOKEN_PORT}:127.0.0.1", f"http://{WEB_HOST}:{TOKEN_PORT}/private/"],
                   env=env, capture_output=True, timeout=30)
    t.join(12)
    srv.close()
    if not got:
        raise RuntimeError("curl --negotiate sent no Authorization header to the listener")
    return got[0]


def _response(f) -> tuple[str, bool]:
    """Read one response (status line, fields, Content-Length body) from file F: (status, has token)."""
    status = f.readline().decode("latin-1").split(" ")
    length, token = 0, False
    while True:
        line = f.readline().decode("latin-1").strip()
        if not line:
            break
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
        if name.lower() == "www-authenticate" and len(value.split()) > 1:
            token = True
    f.read(length)
    return (status[1] if len(status) > 1 else ""), token


def run_cached(lab: Lab, out: Path, healthy: bool, n_requests: int = 60, spacing_s: float = 0.05) -> dict:
    w = start_web(lab, 1, master_pw="hseval-master-pw")
    kinits = kinit_all(w)
    env = w["envs"][0]
    fname = capture_name(SCEN, healthy)
    cap = capture(lab, w["srv"], "k0", out / fname)
    results = []
    with w["lan"]:
        tokens = [_token(env) for _ in range(n_requests)] if healthy else [_token(env)] * n_requests
        t_start = time.time()
        with socket.create_connection((WEB, 80), timeout=10, source_address=(client_addr(0), 0)) as s:
            f = s.makefile("rb")
            for k, auth in enumerate(tokens):
                time.sleep(max(0.0, t_start + k * spacing_s - time.time()))
                s.sendall((f"GET /private/ HTTP/1.1\r\nHost: {WEB_HOST}\r\nUser-Agent: hs-cached-token\r\n"
                           f"Authorization: {auth}\r\n\r\n").encode())
                status, token = _response(f)
                results.append(dict(t=time.time(), status=status, token=token))
        t_end = time.time()
    time.sleep(0.3)
    stats = cap.stop()
    lab.stop(w["apache"])
    error_log, access = apache_logs(w)
    return dict(results=results, kinits=kinits, stats=stats, fname=fname, t_first=first_packet_time(out / fname),
                t_start=t_start, t_end=t_end, error_log=error_log, access=access, n_requests=n_requests,
                spacing_s=spacing_s)


def build_cached_token(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_cached(lab, out, healthy)
    t0 = r["t_first"]
    status = Counter(x["status"] for x in r["results"])
    replay_lines = len(re.findall(r"Request is a replay", r["error_log"]))
    access = Counter(line.rsplit(" ", 2)[-2] for line in r["access"] if line.count('"') >= 2)
    made = (f"apache2 {deb_version('apache2')}, libapache2-mod-auth-gssapi {deb_version('libapache2-mod-auth-gssapi')}, "
            f"krb5-kdc {deb_version('krb5-kdc')}, curl {deb_version('curl')}. MIT krb5kdc for {REALM}; Apache 2.4 "
            f"(KeepAlive on) with mod_auth_gssapi for {SPN} on {WEB}:80. One client {client_addr(0)} (kinit) sends "
            f"{r['n_requests']} GET /private/ on ONE keep-alive connection, {r['spacing_s'] * 1000:.0f} ms apart, "
            + ("each with a fresh Negotiate token" if healthy else "all with the SAME Negotiate token (a cached "
               "header)")
            + " (tokens from curl --negotiate caught by a listener in the client's namespace, not captured). "
            "Captured on the server veth.")
    measured = dict(requests=len(r["results"]), kinit_ok=sum(1 for c in r["kinits"] if c == 0),
                    **{f"status_{k}": v for k, v in sorted(status.items())},
                    responses_with_token=sum(1 for x in r["results"] if x["token"]),
                    **{f"apache_access_status_{k}": v for k, v in sorted(access.items())},
                    apache_error_log_replay_lines=replay_lines,
                    first_request_s=round(r["t_start"] - t0, 3), last_response_s=round(r["t_end"] - t0, 3),
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = new_entry(SCEN, healthy, made, measured=measured)
    if healthy:
        return healthy_twin(entry, f"{len(r['results'])} requests on one connection, each a fresh AP-REQ: "
                            f"Apache answered {dict(status)}; no replay in its error log ({replay_lines}).",
                            silent=list(ALL_DETECTORS) + NEW_DETECTORS)
    rejected = sum(v for k, v in status.items() if k != "200")
    return pathological(
        entry, f"The same Negotiate header on {len(r['results'])} requests of one connection: Apache accepted "
        f"the first ({status.get('200', 0)} x 200) and answered {rejected} with 401 (each with a WWW-Authenticate "
        f"token: {measured['responses_with_token']}); its error log says 'Request is a replay' {replay_lines} "
        "times.",
        silent=list(ALL_DETECTORS) + ["saturation", "incast", "replication_conflict"],
        expect=[dict(detector="replay", min_severity="medium", start_s=measured["first_request_s"], tolerance_s=1.0,
                     client=client_addr(0), server=WEB, resource=f"{SPN}@{REALM}", count=1, count_tolerance=1,
                     measured=dict(replays=rejected, rejected=rejected, same_connection=True))])
