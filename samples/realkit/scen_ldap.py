"""LDAP scenarios on OpenLDAP slapd: connection churn and a read-modify-write TOCTOU.

Topology: [ldap] l0 10.77.0.89 (slapd, back-mdb) ====veth==== lan0 [lan] clients 10.77.3.x
Clients are ldap3 (pure Python), each bound to its own source address.
"""
from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path

import ldap3
from ldap3.core.exceptions import LDAPException

from .core import (ADDED_DETECTORS, ALL_DETECTORS, Capture, Lab, deb_version, first_packet_time, join_all, log,
                   start_threads, wait_for)

SLAPD = "10.77.0.89"
BASE = "dc=corp,dc=example"
ADMIN = f"cn=admin,{BASE}"
ADMIN_PW = "hsreal-admin-pw"
READER = f"cn=reader,{BASE}"
READER_PW = "hsreal-reader-pw"
COUNTER_DN = f"cn=uid-pool,ou=counters,{BASE}"
COUNTER_START = 10000
N_USERS = 50


def _ldif() -> str:
    out = [f"dn: {BASE}\nobjectClass: top\nobjectClass: dcObject\nobjectClass: organization\n"
           "o: Corp\ndc: corp\n",
           f"dn: {READER}\nobjectClass: simpleSecurityObject\nobjectClass: organizationalRole\n"
           f"cn: reader\nuserPassword: {READER_PW}\n",
           f"dn: ou=people,{BASE}\nobjectClass: organizationalUnit\nou: people\n",
           f"dn: ou=counters,{BASE}\nobjectClass: organizationalUnit\nou: counters\n",
           f"dn: {COUNTER_DN}\nobjectClass: posixGroup\ncn: uid-pool\ngidNumber: {COUNTER_START}\n"
           "description: next free uidNumber\n"]
    for i in range(1, N_USERS + 1):
        out.append(f"dn: uid=user{i:02d},ou=people,{BASE}\nobjectClass: inetOrgPerson\n"
                   f"uid: user{i:02d}\ncn: User {i}\nsn: User{i}\n"
                   f"mail: user{i:02d}@corp.example\n")
    return "\n".join(out)


def slapd_conf_head(d, *, schemas=("core", "cosine", "inetorgperson"), modules=("back_mdb",),
                    loglevel: str = "stats") -> str:
    """The global part of a slapd.conf in directory ``d``: schemas, pid/args files, modules, log level
    (every slapd of the scenarios starts with it; the database section follows)."""
    lines = [f"include /etc/ldap/schema/{s}.schema" for s in schemas]
    lines += [f"pidfile {d}/slapd.pid", f"argsfile {d}/slapd.args", "modulepath /usr/lib/ldap"]
    lines += [f"moduleload {m}" for m in modules] + [f"loglevel {loglevel}"]
    return "\n".join(lines) + "\n"


def start_slapd(lab: Lab, ns) -> subprocess.Popen:
    d = lab.workdir / "slapd"
    (d / "db").mkdir(parents=True, exist_ok=True)
    conf = d / "slapd.conf"
    conf.write_text(slapd_conf_head(d, schemas=("core", "cosine", "inetorgperson", "nis")) + f"""database mdb
suffix "{BASE}"
rootdn "{ADMIN}"
rootpw {ADMIN_PW}
directory {d}/db
maxsize 104857600
index objectClass eq
index uid eq
access to attrs=userPassword by anonymous auth by * none
access to * by users write by * read
""")
    (d / "init.ldif").write_text(_ldif())
    subprocess.run(["slapadd", "-f", str(conf), "-l", str(d / "init.ldif")], check=True,
                   capture_output=True, text=True)
    p = lab.spawn(ns, "slapd", ["slapd", "-d", "stats", "-f", str(conf),
                                "-h", f"ldap://{SLAPD}:389/"])

    def up():
        try:
            with ns:
                c = ldap3.Connection(ldap3.Server(SLAPD, 389, connect_timeout=1, get_info=ldap3.NONE), READER,
                                     READER_PW, auto_bind=True, receive_timeout=2)
            c.unbind()
            return True
        except LDAPException:
            return False
    wait_for(up, 15, "slapd to answer", interval=0.2)
    return p


def setup_directory(lab: Lab, n_clients: int):
    """The slapd and client namespaces joined by a veth, with ``n_clients`` client addresses; (srv, lan)."""
    srv = lab.netns("ldap")
    lan = lab.netns("lan")
    lab.veth(srv, "l0", lan, "lan0")
    srv.ip("addr", "add", f"{SLAPD}/16", "dev", "l0")
    lan.ip("addr", "add", "10.77.0.2/16", "dev", "lan0")  # the namespace's own probe address
    for i in range(n_clients):
        lan.ip("addr", "add", f"10.77.3.{i + 1}/16", "dev", "lan0")
    return srv, lan


def bind_connection(src: str, user: str = READER, pw: str = READER_PW) -> ldap3.Connection:
    """A new LDAP connection from ``src`` to slapd, bound as ``user`` (a TCP connect and a simple bind)."""
    server = ldap3.Server(SLAPD, 389, connect_timeout=3, get_info=ldap3.NONE)
    return ldap3.Connection(server, user, pw, source_address=src, receive_timeout=5,
                            auto_bind=ldap3.AUTO_BIND_NO_TLS, read_only=False)


# --------------------------------------------------------------------------- churn
def run_churn(lab: Lab, out: Path, healthy: bool, ops: int = 300, interval: float = 0.02,
              seed: int = 3) -> dict:
    rng = random.Random(seed)
    srv, lan = setup_directory(lab, 1)
    start_slapd(lab, srv)
    src = "10.77.3.1"
    fname = "ldap-conn-churn-healthy.pcap" if healthy else "ldap-conn-churn.pcap"
    cap = Capture(lab, srv, "l0", out / fname)
    wanted = [f"user{rng.randrange(1, N_USERS + 1):02d}" for _ in range(ops)]
    rows = []  # (t_start, t_end, found)
    with lan:
        time.sleep(0.5)
        t_base = time.time()
        pooled = bind_connection(src) if healthy else None
        for k, uid in enumerate(wanted):
            time.sleep(max(0.0, t_base + k * interval - time.time()))
            t0 = time.time()
            c = pooled or bind_connection(src)          # pathological: connect + bind for every search
            c.search(f"ou=people,{BASE}", f"(uid={uid})", attributes=["mail", "cn"])
            found = len(c.entries)
            if not healthy:
                c.unbind()                    # ... and unbind + close right after it
            rows.append((t0, time.time(), found))
        if pooled:
            pooled.unbind()
        time.sleep(0.5)
    stats = cap.stop()
    return dict(rows=rows, t_first=first_packet_time(out / fname), stats=stats, fname=fname,
                src=src, ops=ops, interval=interval)


def build_churn(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_churn(lab, out, healthy)
    rows, t0 = r["rows"], r["t_first"]
    lat = sorted(x[1] - x[0] for x in rows)
    made = (f"slapd {deb_version('slapd')} (back-mdb, slapd.conf, {N_USERS} users) on "
            f"{SLAPD}:389; ldap3 client on {r['src']}: {r['ops']} searches for a random "
            f"uid=userNN, one every {int(r['interval'] * 1000)} ms, simple bind as {READER}; "
            + ("all on one pooled connection (bind once, unbind at the end)." if healthy else
               "each on a new TCP connection: connect, bind, search, unbind, close.")
            + " Captured on slapd's veth (full packets, us pcap).")
    measured = dict(searches=len(rows), found=sum(x[2] for x in rows),
                    connections=1 if healthy else len(rows),
                    ops_per_s=round(len(rows) / (rows[-1][0] - rows[0][0]), 1),
                    median_latency_ms=round(lat[len(lat) // 2] * 1000, 2),
                    first_op_s=round(rows[0][0] - t0, 3), last_op_s=round(rows[-1][0] - t0, 3),
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"], scenario="ldap-conn-churn", healthy=healthy,
                 twin="ldap-conn-churn.pcap" if healthy else "ldap-conn-churn-healthy.pcap",
                 made_with=made, measured=measured)
    if healthy:
        entry["what_happened"] = (f"{len(rows)} searches at {measured['ops_per_s']}/s over one "
                                  "long-lived, bound connection. No churn.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
    else:
        entry["what_happened"] = (
            f"{len(rows)} short connections from {r['src']} to {SLAPD}:389 at "
            f"{measured['ops_per_s']}/s, each carrying exactly bind + search + unbind; the "
            "client closes each one, leaving one TIME_WAIT per search on its side.")
        entry["silent"] = ["herd", "retry_storm", "smb_break_queue", "tcp_stall", "toctou", *ADDED_DETECTORS]
        entry["expect"] = [dict(
            detector="conn_churn", min_severity="medium", start_s=measured["first_op_s"],
            tolerance_s=1.0, client=r["src"], server=SLAPD, resource=f"{SLAPD}:389", count=1,
            count_tolerance=0,
            measured=dict(connections=len(rows), ops_per_connection=3,
                          connections_per_s=measured["ops_per_s"],
                          duration_s=round(rows[-1][0] - rows[0][0], 2)))]
    return entry


# --------------------------------------------------------------------------- TOCTOU
def run_toctou(lab: Lab, out: Path, healthy: bool, per_client: int = 15, think: float = 0.03,
               gap: tuple = (0.15, 0.45), seed: int = 17) -> dict:
    rng = random.Random(seed)
    srv, lan = setup_directory(lab, 2)
    start_slapd(lab, srv)
    fname = "ldap-toctou-healthy.pcap" if healthy else "ldap-toctou.pcap"
    cap = Capture(lab, srv, "l0", out / fname)
    gaps = [[rng.uniform(*gap) for _ in range(per_client)] for _ in range(2)]
    events = []  # (client, t_read, value_read, t_write, value_written, result, attempt)
    lock = threading.Lock()
    t_base = time.time() + 0.5

    def worker(ci: int):
        src = f"10.77.3.{ci + 1}"
        with lan:
            c = bind_connection(src, ADMIN, ADMIN_PW)
        time.sleep(max(0.0, t_base + ci * 0.05 - time.time()))
        for k in range(per_client):
            attempt = 0
            while True:
                t_r = time.time()
                c.search(COUNTER_DN, "(objectClass=posixGroup)", ldap3.BASE,
                         attributes=["gidNumber"])
                v = int(c.entries[0].gidNumber.value)
                time.sleep(think)             # the "allocate" step between check and use
                t_w = time.time()
                if healthy:
                    ok = c.modify(COUNTER_DN, {"gidNumber": [(ldap3.MODIFY_DELETE, [str(v)]),
                                                             (ldap3.MODIFY_ADD, [str(v + 1)])]})
                else:
                    ok = c.modify(COUNTER_DN, {"gidNumber": [(ldap3.MODIFY_REPLACE, [str(v + 1)])]})
                res = c.result["result"]
                with lock:
                    events.append((src, t_r, v, t_w, v + 1, res, attempt))
                if ok or not healthy:
                    break
                attempt += 1                  # conflict (noSuchAttribute): read again
            time.sleep(gaps[ci][k])
        c.unbind()

    join_all(start_threads(worker, 2), 120)
    time.sleep(0.3)
    stats = cap.stop()
    with lan:
        c = bind_connection("10.77.0.2")
        c.search(COUNTER_DN, "(objectClass=*)", ldap3.BASE, attributes=["gidNumber"])
        final = int(c.entries[0].gidNumber.value)
        c.unbind()
    return dict(events=sorted(events, key=lambda e: e[1]), final=final, per_client=per_client,
                t_first=first_packet_time(out / fname), stats=stats, fname=fname, think=think)


def lost_updates(events) -> list[tuple]:
    """Successful writes that stored a value another successful write had already stored:
    both clients read the same value and both wrote value+1."""
    ok = [e for e in events if e[5] == 0]
    by_val: dict[int, list] = {}
    for e in ok:
        by_val.setdefault(e[4], []).append(e)
    return [tuple(sorted(v, key=lambda e: e[3])) for v in by_val.values() if len(v) > 1]


def build_toctou(lab: Lab, out: Path, healthy: bool) -> dict:
    r = run_toctou(lab, out, healthy)
    ev, t0 = r["events"], r["t_first"]
    lost = lost_updates(ev)
    ok_writes = [e for e in ev if e[5] == 0]
    conflicts = [e for e in ev if e[5] != 0]
    made = (f"slapd {deb_version('slapd')} (back-mdb) on {SLAPD}:389; counter entry "
            f"{COUNTER_DN} (posixGroup, gidNumber = next free uidNumber, starts at "
            f"{COUNTER_START}). Two ldap3 clients (10.77.3.1, 10.77.3.2, one connection each, "
            f"bound as the rootdn) each allocate {r['per_client']} numbers: search the counter, "
            f"wait {int(r['think'] * 1000)} ms, then "
            + ("modify with delete-old-value + add-new-value (fails with noSuchAttribute if "
               "the value changed; the client then reads again)" if healthy else
               "modify replace gidNumber = read + 1 (blind write)")
            + "; 150-450 ms between allocations. Captured on slapd's veth (full packets, "
            "converted to pcapng).")
    measured = dict(clients=2, allocations=2 * r["per_client"], writes_ok=len(ok_writes),
                    writes_failed_conflict=len(conflicts), counter_start=COUNTER_START,
                    counter_final=r["final"], lost_updates=sum(len(g) - 1 for g in lost),
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    entry = dict(file=r["fname"].replace(".pcap", ".pcapng"), scenario="ldap-toctou",
                 healthy=healthy,
                 twin="ldap-toctou.pcapng" if healthy else "ldap-toctou-healthy.pcapng",
                 made_with=made, pcapng=True, measured=measured)
    if healthy:
        entry["what_happened"] = (
            f"{len(ok_writes)} allocations succeed, the counter ends at {r['final']} "
            f"(= start + {r['final'] - COUNTER_START}); {len(conflicts)} modifies hit a "
            "concurrent change and fail cleanly with noSuchAttribute (16), after which the "
            "client re-reads. No lost update.")
        entry["silent"] = list(ALL_DETECTORS)
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"{len(ok_writes)} blind writes all succeed, but the counter ends at {r['final']} "
        f"instead of {COUNTER_START + len(ok_writes)}: {measured['lost_updates']} lost "
        "update(s), each where both clients read the same value before either wrote it back, "
        "so the same uidNumber was handed out twice.")
    entry["silent"] = ["herd", "retry_storm", "smb_break_queue", "tcp_stall", "conn_churn", *ADDED_DETECTORS]
    entry["expect"] = []
    for g in lost:
        first_read = min(e[1] for e in g)
        entry["expect"].append(dict(
            detector="toctou", min_severity="medium", start_s=round(first_read - t0, 3),
            tolerance_s=0.2, client="", server=SLAPD, resource=COUNTER_DN, count=1,
            count_tolerance=0,
            measured=dict(clients=[e[0] for e in g], value_read=g[0][2],
                          value_written=g[0][4],
                          reads_s=[round(e[1] - t0, 3) for e in g],
                          writes_s=[round(e[3] - t0, 3) for e in g])))
    return entry
