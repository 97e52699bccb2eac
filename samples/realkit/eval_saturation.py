"""Evaluation saturation scenarios (samples/make_eval.py) on OpenLDAP slapd (realkit/scen_saturation.py).

- ``ldap-saturation-writes``: the ramp of realkit/scen_saturation.py, but every request is a modify
  (replace the description of one of the people, bound as the rootdn). back-mdb lets one writer
  transaction at a time hold its write lock and commits each with an fsync, so writes are serialised
  whatever the thread pool (``threads 8`` here); description has an eq,sub index, so each write also
  rewrites the substring keys of its 12 words: closed-loop clients joining in steps queue on the lock.
  Healthy twin: the same clients, steps and modifies, one per client every ``TWIN_INTERVAL_S`` (open
  loop), against the same slapd without the description index: a write costs about a millisecond, so
  the single writer keeps up with the top step's offered load many times over (with the index it
  completes only 60-90 writes/s here, too close to that load to be a healthy twin).
- ``ldap-saturation-near-miss``: the costly search of scen_saturation.py, closed loop, but the ramp
  stops at 2 clients (= slapd's 2 threads): it reaches the capacity and never goes past it, so the
  latency grows only as the second thread's share of the two cores does. No twin; nothing expected.

Ground truth from the clients' own logs (per step: clients, sent, completed, latency quantiles).
"""
from __future__ import annotations

import random
from pathlib import Path

import ldap3

from . import scen_ldap, scen_saturation as ss
from .core import Lab, deb_version
from .eval_common import healthy_twin, new_entry, pathological

WRITE_THREADS = 8
WRITE_INDEX = "index description eq,sub"   # every write updates the substring index keys of 12 words
NEAR_MISS_STEPS = (1, 1, 2, 2, 2, 2)


def modify_op(c: ldap3.Connection, k: int) -> int:
    """One write: replace one person's description (a write transaction on MDB's single writer lock)."""
    rng = random.Random(k)
    dn = f"uid=p{k % ss.N_ENTRIES:05d},{ss.PEOPLE}"
    words = " ".join(f"w{rng.randrange(100000):05d}" for _ in range(12))
    if not c.modify(dn, {"description": [(ldap3.MODIFY_REPLACE, [words])]}):
        raise RuntimeError(c.result.get("description"))
    return 1


def _admin(src: str) -> ldap3.Connection:
    return scen_ldap.bind_connection(src, scen_ldap.ADMIN, scen_ldap.ADMIN_PW)


def _made(what: str, healthy: bool, threads: int, steps) -> str:
    return (f"slapd {deb_version('slapd')} (back-mdb, threads {threads}, {ss.N_ENTRIES} people) on "
            f"{ss.SLAPD}:389; ldap3 clients 10.77.3.1-{max(steps)}, one bound connection each, joining in steps of "
            f"{', '.join(map(str, steps))} clients, {ss.STEP_S:g} s each; every request {what}; "
            + (f"each client sends one every {int(ss.TWIN_INTERVAL_S * 1000)} ms (open loop)." if healthy else
               "each client sends them back to back (closed loop).")
            + f" Captured on slapd's veth (snaplen {ss.SNAPLEN}, us pcap).")


def build_writes(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "ldap-saturation-writes"
    r = ss.run_ramp(lab, out, scen + ("-healthy" if healthy else "") + ".pcap", healthy, op=modify_op, bind=_admin,
                    threads=WRITE_THREADS, extra="" if healthy else WRITE_INDEX)
    m = ss.measured_of(r)
    st = ss.per_step(r)
    what = ("a modify (replace description of uid=pNNNNN, bound as the rootdn; " +
            ("description has no index, so a write costs about a ms: the writer keeps up with the offered load)"
             if healthy else "description has an eq,sub index, so each write updates its substring keys)"))
    entry = new_entry(scen, healthy, _made(what, healthy, WRITE_THREADS, ss.STEPS), measured=m)
    if healthy:
        return healthy_twin(entry, (
            f"Offered writes rise from {st[0]['offered_per_s']}/s to {st[-1]['offered_per_s']}/s and completions "
            f"follow ({st[-1]['completions_per_s']}/s at the top step); median latency {st[0]['latency_median_ms']} ms at "
            f"the first step, {st[-1]['latency_median_ms']} ms at the last: the writer keeps up."),
            silent=[*ss.OTHERS, ss.NAME])
    knee = next(x for x in st if x["clients"] == m["knee_clients"])
    return pathological(entry, (
        f"Completed writes reach {m['peak_completions_per_s']}/s by {m['knee_clients']} clients and stop growing; "
        f"median latency {st[0]['latency_median_ms']} ms with 1 client, {st[-1]['latency_median_ms']} ms with "
        f"{st[-1]['clients']}: the writers queue on MDB's write lock."), silent=list(ss.OTHERS), expect=[dict(
            detector="saturation", min_severity="medium", start_s=knee["start_s"], tolerance_s=2 * ss.STEP_S,
            client="", server=ss.SLAPD, resource=f"{ss.SLAPD}:389 modifyRequest", count=1, count_tolerance=0,
            measured=dict(knee_clients=m["knee_clients"], peak_completions_per_s=m["peak_completions_per_s"],
                          latency_factor_top_vs_first=m["latency_factor_top_vs_first"]))])


def build_near_miss(lab: Lab, out: Path, healthy: bool) -> dict:
    scen = "ldap-saturation-near-miss"
    r = ss.run_ramp(lab, out, scen + ".pcap", False, steps=NEAR_MISS_STEPS)
    m = ss.measured_of(r)
    st = ss.per_step(r)
    entry = new_entry(scen, False, _made("the costly unindexed substring search of ldap-saturation", False,
                                         ss.SLAPD_THREADS, NEAR_MISS_STEPS), twin="", measured=m)
    return healthy_twin(entry, (
        f"The ramp stops at {max(NEAR_MISS_STEPS)} clients, as many as slapd has threads: completions/s "
        f"{st[0]['completions_per_s']}/s with 1 client, {st[-1]['completions_per_s']}/s with 2, median latency "
        f"{st[0]['latency_median_ms']} ms and {st[-1]['latency_median_ms']} ms: at the capacity, never past it "
        "(no queue beyond the threads)."), silent=[*ss.OTHERS, ss.NAME])
