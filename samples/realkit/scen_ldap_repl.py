"""LDAP multi-provider replication conflicts on OpenLDAP slapd (RFC 4533 syncrepl).

Topology (one bridge, so one capture sees every link):

    [p1] e0 10.77.0.91 (slapd serverID 1) ──┐
    [p2] e0 10.77.0.92 (slapd serverID 2) ──┼── br0 [sw]  ← tcpdump on br0
    [lan] e0 10.77.3.1, 10.77.3.2 (clients)─┘

Both slapd are providers (syncprov overlay) and consumers of each other (``syncrepl
type=refreshAndPersist``, ``multiprovider on``), back-mdb, started from the same database file so
entries carry the same entryUUID on both. Clients are ldap3, bound as the rootdn.

Pathological: in each round two clients replace ``description`` of the same entry at the same
instant, client A on p1 and client B on p2; each provider stamps its own CSN (serverID 1 or 2),
pushes the entry to the other, and the later CSN wins on both: one value is lost. Ground truth:
the scenario reads the entry back from both servers after each round (value, entryCSN).
Twin: the same writes, serialised through p1 (B waits for A's response).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import ldap3
from ldap3.core.exceptions import LDAPException

from .core import ALL_DETECTORS, Lab, deb_version, first_packet_time, log, wait_for
from .eval_common import capture
from .scen_ldap import slapd_conf_head

P1, P2 = "10.77.0.91", "10.77.0.92"
CLIENTS = ("10.77.3.1", "10.77.3.2")
PROBE = "10.77.3.10"
BASE = "dc=corp,dc=example"
ADMIN = f"cn=admin,{BASE}"
ADMIN_PW = "hsreal-admin-pw"
SHARED = [f"cn=shared-{k},ou=config,{BASE}" for k in range(3)]
NEW_DETECTORS = ["replay", "saturation", "incast", "replication_conflict"]


def quiet(*but: str) -> list[str]:
    """Every detector's name (core.ALL_DETECTORS and this round's new ones, once each) except ``but``."""
    return [d for d in dict.fromkeys([*ALL_DETECTORS, *NEW_DETECTORS]) if d not in but]


def _ldif() -> str:
    out = [f"dn: {BASE}\nobjectClass: top\nobjectClass: dcObject\nobjectClass: organization\n"
           "o: Corp\ndc: corp\n",
           f"dn: ou=config,{BASE}\nobjectClass: organizationalUnit\nou: config\n"]
    for dn in SHARED:
        cn = dn.split(",")[0][3:]
        out.append(f"dn: {dn}\nobjectClass: organizationalRole\ncn: {cn}\n"
                   "description: initial\nl: initial\n")
    return "\n".join(out)


def _conf(d: Path, sid: int, other: str) -> str:
    return slapd_conf_head(d, modules=("back_mdb", "syncprov"), loglevel="stats sync") + f"""serverID {sid}
database mdb
suffix "{BASE}"
rootdn "{ADMIN}"
rootpw {ADMIN_PW}
directory {d}/db
maxsize 104857600
index objectClass eq
index entryCSN,entryUUID eq
syncrepl rid=00{3 - sid} provider=ldap://{other}:389 bindmethod=simple binddn="{ADMIN}"
  credentials={ADMIN_PW} searchbase="{BASE}" type=refreshAndPersist retry="1 +" timeout=3
  attrs="*,+"
multiprovider on
overlay syncprov
syncprov-checkpoint 100 10
access to * by * read
"""


def _server(addr: str) -> ldap3.Server:
    return ldap3.Server(addr, 389, connect_timeout=3, get_info=ldap3.NONE)


def connect(ns, src: str, addr: str) -> ldap3.Connection:
    with ns:
        return ldap3.Connection(_server(addr), ADMIN, ADMIN_PW, source_address=src, receive_timeout=5,
                                auto_bind=ldap3.AUTO_BIND_NO_TLS, read_only=False)


def read_back(c: ldap3.Connection, dn: str, attr: str = "description") -> tuple[str, str]:
    c.search(dn, "(objectClass=*)", ldap3.BASE, attributes=[attr, "entryCSN"])
    e = c.entries[0]
    return str(e[attr].value), str(e.entryCSN.value)


def network(lab: Lab):
    """Namespaces and the bridge; returns (p1, p2, lan, sw)."""
    sw = lab.netns("sw")
    sw.ip("link", "add", "br0", "type", "bridge")
    sw.ip("link", "set", "br0", "up")
    nss = []
    for short, port, addrs in (("p1", "s1", [P1]), ("p2", "s2", [P2]), ("lan", "s3", [*CLIENTS, PROBE])):
        ns = lab.netns(short)
        lab.veth(ns, "e0", sw, port)
        sw.ip("link", "set", port, "master", "br0")
        for a in addrs:
            ns.ip("addr", "add", f"{a}/16", "dev", "e0")
        nss.append(ns)
    return (*nss, sw)


def start_providers(lab: Lab, p1, p2, lan) -> list:
    """Both slapd providers from one database file, each replicating from the other."""
    d1, d2 = lab.workdir / "slapd1", lab.workdir / "slapd2"
    for d in (d1, d2):
        (d / "db").mkdir(parents=True, exist_ok=True)
    (d1 / "slapd.conf").write_text(_conf(d1, 1, P2))
    (d2 / "slapd.conf").write_text(_conf(d2, 2, P1))
    (d1 / "init.ldif").write_text(_ldif())
    subprocess.run(["slapadd", "-S", "1", "-f", str(d1 / "slapd.conf"), "-l", str(d1 / "init.ldif")],
                   check=True, capture_output=True, text=True)
    shutil.copy(d1 / "db" / "data.mdb", d2 / "db" / "data.mdb")  # same entries, same entryUUIDs
    procs = []
    for ns, d, addr, name in ((p1, d1, P1, "slapd1"), (p2, d2, P2, "slapd2")):
        procs.append(lab.spawn(ns, name, ["slapd", "-d", "stats,sync", "-f", str(d / "slapd.conf"),
                                          "-h", f"ldap://{addr}:389/"]))
    for addr in (P1, P2):
        def up(addr=addr):
            try:
                connect(lan, PROBE, addr).unbind()
                return True
            except LDAPException:
                return False
        wait_for(up, 15, f"slapd on {addr}", interval=0.2)
    return procs


def run_rounds(lab: Lab, out: Path, fname: str, serial: bool, rounds: int = 6, gap_s: float = 0.0,
               attrs: tuple[str, str] = ("description", "description"), settle: float = 1.0) -> dict:
    """``rounds`` rounds: client A writes attrs[0] of SHARED[round % 3] on p1, client B writes attrs[1]
    on p2 (on p1 when ``serial``, after A's response) ``gap_s`` later. Returns the log."""
    p1, p2, lan, sw = network(lab)
    cap = capture(lab, sw, "br0", out / fname)   # from before the start: the refresh phase is on the wire
    start_providers(lab, p1, p2, lan)
    time.sleep(2.0)   # both consumers finish their refresh and sit in persist
    ca = connect(lan, CLIENTS[0], P1)
    cb = connect(lan, CLIENTS[1], P1 if serial else P2)
    r1, r2 = connect(lan, PROBE, P1), connect(lan, PROBE, P2)
    rows = []
    for k in range(rounds):
        dn = SHARED[k % len(SHARED)]
        va, vb = f"A-round{k}-from-{CLIENTS[0]}", f"B-round{k}-from-{CLIENTS[1]}"
        res: dict = {}

        def write(name, c, attr, value, delay, go=None):
            if go is not None:
                go.wait()
            if delay:
                time.sleep(delay)
            t0 = time.time()
            ok = c.modify(dn, {attr: [(ldap3.MODIFY_REPLACE, [value])]})
            res[name] = (t0, time.time(), ok, c.result["result"])

        if serial:
            write("a", ca, attrs[0], va, 0)
            write("b", cb, attrs[1], vb, gap_s)
        else:
            go = threading.Barrier(2)
            ts = [threading.Thread(target=write, args=("a", ca, attrs[0], va, 0, go)),
                  threading.Thread(target=write, args=("b", cb, attrs[1], vb, gap_s, go))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(10)
        time.sleep(settle)
        final = {}
        for srv, c in (("p1", r1), ("p2", r2)):
            final[srv] = {a: read_back(c, dn, a) for a in sorted(set(attrs))}
        rows.append(dict(round=k, dn=dn, attrs=attrs, value_a=va, value_b=vb, a=res["a"], b=res["b"],
                         final=final, server_b="p1" if serial else "p2"))
        log(f"round {k}: {dn} a={res['a'][2]} b={res['b'][2]} final={final}")
    for c in (ca, cb, r1, r2):
        c.unbind()
    time.sleep(0.3)
    stats = cap.stop()
    return dict(rows=rows, t_first=first_packet_time(out / fname), stats=stats, fname=fname, serial=serial,
                gap_s=gap_s, attrs=attrs, rounds=rounds,
                log1=lab.logtail("slapd1", 100000), log2=lab.logtail("slapd2", 100000))


LOG_LINE = re.compile(r"^([0-9a-f]{8})\.([0-9a-f]{8}) \S+ (.*)$")
MOD_LINE = re.compile(r'conn=\d+ op=\d+ MOD dn="(.*)"$')
RECV_LINE = re.compile(r"syncrepl_message_to_entry: rid=\d+ DN: (.*?), UUID")


def log_events(text: str) -> dict:
    """slapd -d stats,sync log -> {"mod": [(t, dn)], "recv": [(t, dn)]}: when the server took a client's
    MOD of dn, and when it received dn from its syncrepl provider (t: the log's own seconds.nanoseconds)."""
    out = {"mod": [], "recv": []}
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        if not m:
            continue
        t = int(m.group(1), 16) + int(m.group(2), 16) / 1e9
        if (x := MOD_LINE.search(m.group(3))):
            out["mod"].append((t, x.group(1).lower()))
        elif (x := RECV_LINE.search(m.group(3))):
            out["recv"].append((t, x.group(1).lower()))
    return out


def _first(events, dn, after):
    return min((t for t, d in events if d == dn and t >= after), default=None)


def outcome(row: dict, logs: dict) -> dict:
    """What the servers show for one round. The read-back gives the value each provider kept and its
    CSN (converged, which write survived); the slapd logs say whether the two writes were concurrent:
    the surviving write's server took it (MOD) before it received the other write's entry by syncrepl
    (or never received it). A write of the round whose value is gone after a concurrent round is lost;
    after a sequential one (the second write made on a server that already had the first) it was
    overwritten on purpose, not lost; a round whose providers read back different values (diverged)
    lost a value on each."""
    f1, f2 = row["final"]["p1"], row["final"]["p2"]
    converged = f1 == f2
    a_attr, b_attr = row["attrs"]
    a_kept = f1[a_attr][0] == row["value_a"] and f2[a_attr][0] == row["value_a"]
    b_kept = f1[b_attr][0] == row["value_b"] and f2[b_attr][0] == row["value_b"]
    dn = row["dn"].lower()
    srv_a, srv_b = "p1", row["server_b"]
    t0 = min(row["a"][0], row["b"][0]) - 0.05
    mod_a, mod_b = _first(logs[srv_a]["mod"], dn, t0), _first(logs[srv_b]["mod"], dn, t0)
    concurrent = False
    if srv_a != srv_b and mod_a is not None and mod_b is not None:
        recv_a = _first(logs[srv_b]["recv"], dn, mod_a)   # B's server receives A's change
        recv_b = _first(logs[srv_a]["recv"], dn, mod_b)
        # neither server had the other's write when it took its own
        concurrent = (recv_a is None or recv_a > mod_b) and (recv_b is None or recv_b > mod_a)
    # a round that did not converge lost a value on each provider, whatever the logs' order says
    lost = [w for w, kept in (("a", a_kept), ("b", b_kept)) if (concurrent or not converged) and not kept]
    return dict(converged=converged, a_kept=a_kept, b_kept=b_kept, concurrent=concurrent, lost=lost,
                csn_p1=f1[a_attr][1], csn_p2=f2[a_attr][1])


def summarise(r: dict) -> tuple[dict, list[dict]]:
    t0 = r["t_first"]
    logs = {"p1": log_events(r["log1"]), "p2": log_events(r["log2"])}
    outs = [outcome(x, logs) for x in r["rows"]]
    lost = [(x, o) for x, o in zip(r["rows"], outs) if o["lost"]]
    measured = dict(rounds=r["rounds"], writes=2 * r["rounds"],
                    writes_ok=sum(int(x["a"][2]) + int(x["b"][2]) for x in r["rows"]),
                    rounds_converged=sum(o["converged"] for o in outs),
                    rounds_concurrent=sum(o["concurrent"] for o in outs), rounds_with_lost_update=len(lost),
                    rounds_diverged=sum(1 for o in outs if not o["converged"]),
                    lost_values=[(x["value_a"] if "a" in o["lost"] else x["value_b"]) for x, o in lost],
                    write_gap_ms=[round((x["b"][0] - x["a"][0]) * 1000, 2) for x in r["rows"]],
                    capture_dropped=r["stats"].get("dropped_by_kernel", -1))
    expects = []
    for x, o in lost:
        w = o["lost"][0]
        attr = x["attrs"][0 if w == "a" else 1]
        split = not o["converged"]   # each provider kept a different value: both writes lost somewhere
        expects.append(dict(
            detector="replication_conflict", kind="divergence" if split else "lost_update", min_severity="medium",
            start_s=round(min(x["a"][0], x["b"][0]) - t0, 3), tolerance_s=0.5,
            client="" if split else CLIENTS[0 if w == "a" else 1],
            server=P1 if split or w == "a" or r["serial"] else P2,  # a divergence: both providers, P1 among them
            resource=x["dn"], count=1, count_tolerance=0,
            measured=dict(attribute=attr, value_lost=x["value_a" if w == "a" else "value_b"],
                          value_kept=x["final"]["p1"][attr][0], csn_final=x["final"]["p1"][attr][1],
                          write_gap_ms=round((x["b"][0] - x["a"][0]) * 1000, 2))))
    return measured, expects


def made_with(r: dict) -> str:
    return (f"two slapd {deb_version('slapd')} providers (back-mdb, syncprov, multiprovider on, serverID 1 "
            f"on {P1}, 2 on {P2}, each a refreshAndPersist syncrepl consumer of the other, attrs=\"*,+\"), "
            f"started from one database file; ldap3 clients bound as the rootdn: {r['rounds']} rounds, "
            f"client {CLIENTS[0]} replaces {r['attrs'][0]} of one of {len(SHARED)} entries on {P1} and "
            f"client {CLIENTS[1]} replaces {r['attrs'][1]} of the same entry on "
            + (f"{P1} after the first write's response" if r["serial"] else f"{P2}")
            + (f" {r['gap_s'] * 1000:g} ms later" if r["gap_s"] else (" at the same instant" if not r["serial"] else ""))
            + f"; each round read back from both providers (value, entryCSN). Captured on the bridge "
            "joining both providers and the clients from before the providers start (whole frames, "
            "-s 2048, us pcap).")


def build_conflict(lab: Lab, out: Path, healthy: bool) -> dict:
    fname = "ldap-repl-conflict-healthy.pcap" if healthy else "ldap-repl-conflict.pcap"
    r = run_rounds(lab, out, fname, serial=healthy)
    measured, expects = summarise(r)
    entry = dict(file=fname, scenario="ldap-repl-conflict", healthy=healthy,
                 twin="ldap-repl-conflict.pcap" if healthy else "ldap-repl-conflict-healthy.pcap",
                 made_with=made_with(r), measured=measured)
    if healthy:
        entry["what_happened"] = (
            f"{measured['writes_ok']} writes, each round's two serialised through {P1}: the second "
            f"overwrites the first on purpose (it was sent after the first was answered), one CSN "
            f"origin (serverID 1); {measured['rounds_converged']} of {r['rounds']} rounds read back "
            "the same value and CSN from both providers. No cross-server conflict.")
        entry["silent"] = quiet()
        entry["expect"] = []
        return entry
    entry["what_happened"] = (
        f"{r['rounds']} rounds of two simultaneous writes to the same attribute of the same entry on two "
        f"providers; slapd's logs show {measured['rounds_concurrent']} rounds concurrent (each provider took "
        f"its write before the other's change reached it); {measured['rounds_with_lost_update']} rounds lost a "
        f"value: in {measured['rounds_with_lost_update'] - measured['rounds_diverged']} both providers kept the "
        f"later CSN's value, in {measured['rounds_diverged']} the providers diverged (each kept a different "
        f"value, read back from both); {measured['rounds_converged']} of {r['rounds']} rounds converged.")
    entry["silent"] = quiet("replication_conflict") if expects else quiet()
    entry["expect"] = expects
    return entry
