"""Server saturation on OpenLDAP slapd: a ramp of concurrent clients against a server with few threads.

slapd (back-mdb) runs with ``threads 2`` (the smallest pool slapd accepts) and a directory of
``N_ENTRIES`` people whose ``description`` has no substring index, so every search
``(description=*token*)`` scans the whole of ou=people: a few ms of CPU on one of slapd's two
worker threads. Clients (ldap3, one pooled connection each, each from its own source address,
bound once before the ramp) join in steps: 1, 2, 4, 8, 16, 24 clients, ``STEP_S`` seconds each.

- pathological: each client searches back to back (closed loop: a new search as soon as the
  previous answer arrives). Once the two worker threads are busy, completions/s stop growing and
  every added client only lengthens the queue: latency grows with the concurrency (the knee).
- healthy twin: the same clients, the same ramp and the same search, but each client sends one
  search every ``TWIN_INTERVAL_S`` on its own schedule (open loop), so the offered load at the top
  step stays below what the two threads complete: completions/s follow the offered load, latency
  stays flat.

Ground truth comes from the clients' own logs: per step the clients active, searches sent and
completed, completions/s and the latency quantiles.

Topology: [ldap] l0 10.77.0.89 (slapd, back-mdb) ====veth==== lan0 [lan] clients 10.77.3.x
(realkit/scen_ldap.py's directory setup).
"""
from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path

import ldap3

from . import scen_ldap
from .core import ALL_DETECTORS, Lab, deb_version, first_packet_time, join_all, log, start_threads, wait_for
from .eval_common import capture

SLAPD = scen_ldap.SLAPD
BASE = scen_ldap.BASE
PEOPLE = f"ou=people,{BASE}"
N_ENTRIES = 6000
STEPS = (1, 2, 4, 8, 16, 24)      # clients active in each step of the ramp
STEP_S = 2.0                      # seconds per step
TWIN_INTERVAL_S = 0.5             # healthy twin: each client sends one search this often
SLAPD_THREADS = 2
SNAPLEN = 256                     # headers + the LDAP messages' first bytes (operation, DN, filter)
NAME = "saturation"
OTHERS = [d for d in ALL_DETECTORS if d != NAME]   # every other detector must stay silent


def _ldif(n: int) -> str:
    out = [f"dn: {BASE}\nobjectClass: top\nobjectClass: dcObject\nobjectClass: organization\n"
           "o: Corp\ndc: corp\n",
           f"dn: {scen_ldap.READER}\nobjectClass: simpleSecurityObject\nobjectClass: organizationalRole\n"
           f"cn: reader\nuserPassword: {scen_ldap.READER_PW}\n",
           f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people\n"]
    rng = random.Random(5)
    for i in range(n):
        words = " ".join(f"w{rng.randrange(100000):05d}" for _ in range(12))
        out.append(f"dn: uid=p{i:05d},{PEOPLE}\nobjectClass: inetOrgPerson\nuid: p{i:05d}\n"
                   f"cn: Person {i}\nsn: P{i}\ndescription: {words}\n")
    return "\n".join(out)


def start_slapd(lab: Lab, ns, threads: int = SLAPD_THREADS, n_entries: int = N_ENTRIES,
                extra: str = "") -> subprocess.Popen:
    """slapd with a small thread pool and ``n_entries`` people without a substring index."""
    d = lab.workdir / "slapd"
    (d / "db").mkdir(parents=True, exist_ok=True)
    conf = d / "slapd.conf"
    conf.write_text(scen_ldap.slapd_conf_head(d, loglevel="none") + f"""threads {threads}
sizelimit unlimited
database mdb
suffix "{BASE}"
rootdn "{scen_ldap.ADMIN}"
rootpw {scen_ldap.ADMIN_PW}
directory {d}/db
maxsize 268435456
index objectClass eq
index uid eq
{extra}
access to attrs=userPassword by anonymous auth by * none
access to * by users write by * read
""")
    (d / "init.ldif").write_text(_ldif(n_entries))
    subprocess.run(["slapadd", "-q", "-f", str(conf), "-l", str(d / "init.ldif")], check=True,
                   capture_output=True, text=True)
    p = lab.spawn(ns, "slapd", ["slapd", "-d", "0", "-f", str(conf), "-h", f"ldap://{SLAPD}:389/"])

    def up():
        try:
            with ns:
                c = scen_ldap.bind_connection(SLAPD)
            c.unbind()
            return True
        except Exception:
            return False
    wait_for(up, 20, "slapd to answer", interval=0.2)
    return p


def search_op(c: ldap3.Connection, k: int) -> int:
    """The costly search: an unindexed substring filter over all of ou=people."""
    c.search(PEOPLE, f"(description=*w{k % 100000:05d}*)", attributes=["uid"])
    return len(c.entries)


def run_ramp(lab: Lab, out: Path, fname: str, healthy: bool, steps=STEPS, step_s: float = STEP_S,
             interval: float = TWIN_INTERVAL_S, op=search_op, bind=None, threads: int = SLAPD_THREADS,
             n_entries: int = N_ENTRIES, extra: str = "", seed: int = 11) -> dict:
    """The ramp against slapd; rows (client, step, t_start, t_end, ok) from the clients' logs."""
    n = max(steps)
    srv, lan = scen_ldap.setup_directory(lab, n)
    start_slapd(lab, srv, threads=threads, n_entries=n_entries, extra=extra)
    bind = bind or (lambda src: scen_ldap.bind_connection(src))
    conns = []
    with lan:
        for i in range(n):
            conns.append(bind(f"10.77.3.{i + 1}"))
    cap = capture(lab, srv, "l0", out / fname, snaplen=SNAPLEN)
    rng = random.Random(seed)
    phases = [rng.uniform(0, interval) for _ in range(n)]
    rows: list[tuple] = []
    lock = threading.Lock()
    t_base = time.time() + 0.5
    t_end = t_base + len(steps) * step_s

    def client(i: int):
        c, k, mine = conns[i], i * 7919, []
        first = next(s for s, m in enumerate(steps) if m > i)     # the step this client joins in
        t_join = t_base + first * step_s
        nxt = t_join + (phases[i] if healthy else 0.0)
        while True:
            now = time.time()
            if healthy:
                time.sleep(max(0.0, nxt - now))
                nxt += interval
            elif now < t_join:
                time.sleep(t_join - now)
            t0 = time.time()
            if t0 >= t_end:
                break
            step = min(int((t0 - t_base) // step_s), len(steps) - 1)
            try:
                ok = op(c, k) >= 0
            except Exception:   # noqa: BLE001 - a failed request is a logged outcome
                ok = False
            mine.append((i, step, t0, time.time(), ok))
            k += 1
        with lock:
            rows.extend(mine)

    join_all(start_threads(client, n), len(steps) * step_s + 60)
    time.sleep(0.3)
    stats = cap.stop()
    for c in conns:
        try:
            c.unbind()
        except Exception:  # noqa: BLE001
            pass
    rows.sort(key=lambda r: r[2])
    return dict(rows=rows, t_first=first_packet_time(out / fname), stats=stats, fname=fname,
                t_base=t_base, steps=list(steps), step_s=step_s, interval=interval)


def per_step(r: dict) -> list[dict]:
    """Per step of the ramp, from the clients' logs: clients, sent, completed, completions/s,
    latency median / p90 (ms), started at (s after the first packet)."""
    out = []
    for s, m in enumerate(r["steps"]):
        rows = [x for x in r["rows"] if x[1] == s]
        a = r["t_base"] + s * r["step_s"]
        done = [x for x in r["rows"] if a <= x[3] < a + r["step_s"] and x[4]]
        lat = sorted((x[3] - x[2]) * 1000 for x in rows if x[4])
        q = (lambda f: round(lat[min(len(lat) - 1, int(f * len(lat)))], 2) if lat else None)
        out.append(dict(step=s, clients=m, start_s=round(a - r["t_first"], 3), sent=len(rows),
                        completed=len(done), completions_per_s=round(len(done) / r["step_s"], 1),
                        offered_per_s=round(len(rows) / r["step_s"], 1), latency_median_ms=q(0.5),
                        latency_p90_ms=q(0.9)))
    return out


def measured_of(r: dict) -> dict:
    steps = per_step(r)
    top = max(x["completions_per_s"] for x in steps)
    knee = next(x for x in steps if x["completions_per_s"] >= 0.8 * top)
    per = {f"step_{k}": [(x[k] if x[k] is not None else -1) for x in steps]  # -1: nothing completed
           for k in ("clients", "start_s", "sent", "completed", "offered_per_s", "completions_per_s",
                     "latency_median_ms", "latency_p90_ms")}
    return dict(requests=len(r["rows"]), failed=sum(1 for x in r["rows"] if not x[4]),
                **per, peak_completions_per_s=top, knee_clients=knee["clients"],
                latency_factor_top_vs_first=round(steps[-1]["latency_median_ms"] / steps[0]["latency_median_ms"], 1)
                if steps[0]["latency_median_ms"] else None,
                capture_dropped=r["stats"].get("dropped_by_kernel", -1))


def build_ramp(lab: Lab, out: Path, healthy: bool) -> dict:
    fname = "ldap-saturation-healthy.pcap" if healthy else "ldap-saturation.pcap"
    r = run_ramp(lab, out, fname, healthy)
    m = measured_of(r)
    st = per_step(r)
    for x in st:
        log(f"step {x}")
    made = (f"slapd {deb_version('slapd')} (back-mdb, threads {SLAPD_THREADS}, {N_ENTRIES} people, no "
            f"substring index on description) on {SLAPD}:389; ldap3 clients 10.77.3.1-{max(STEPS)}, one bound "
            f"connection each, joining in steps of {', '.join(map(str, STEPS))} clients, {STEP_S:g} s each; every "
            "request an unindexed substring search (description=*wNNNNN*) over ou=people; "
            + (f"each client sends one search every {int(TWIN_INTERVAL_S * 1000)} ms (open loop, below capacity)."
               if healthy else "each client searches back to back (closed loop).")
            + f" Captured on slapd's veth (snaplen {SNAPLEN}, us pcap).")
    entry = dict(file=fname, scenario="ldap-saturation", healthy=healthy,
                 twin="ldap-saturation.pcap" if healthy else "ldap-saturation-healthy.pcap",
                 made_with=made, measured=m)
    if healthy:
        entry["what_happened"] = (
            f"Offered load rises from {st[0]['offered_per_s']}/s to {st[-1]['offered_per_s']}/s and completions "
            f"follow it ({st[0]['completions_per_s']}/s to {st[-1]['completions_per_s']}/s); median latency "
            f"{st[0]['latency_median_ms']} ms at the first step, {st[-1]['latency_median_ms']} ms at the last: "
            "the server keeps up.")
        entry["silent"] = [*OTHERS, NAME]
        entry["expect"] = []
        return entry
    knee = next(x for x in st if x["clients"] == m["knee_clients"])
    entry["what_happened"] = (
        f"Completions/s reach {m['peak_completions_per_s']}/s by {m['knee_clients']} clients and stop growing; from "
        f"there each added client only queues: median latency {st[0]['latency_median_ms']} ms with 1 client, "
        f"{knee['latency_median_ms']} ms at the knee, {st[-1]['latency_median_ms']} ms with {st[-1]['clients']} "
        "clients (slapd's two worker threads are the bottleneck).")
    entry["silent"] = list(OTHERS)
    entry["expect"] = [dict(
        detector="saturation", min_severity="medium", start_s=knee["start_s"], tolerance_s=2 * STEP_S,
        client="", server=SLAPD, resource=f"{SLAPD}:389 searchRequest", count=1, count_tolerance=0,
        measured=dict(knee_clients=m["knee_clients"], peak_completions_per_s=m["peak_completions_per_s"],
                      latency_factor_top_vs_first=m["latency_factor_top_vs_first"]))]
    return entry
