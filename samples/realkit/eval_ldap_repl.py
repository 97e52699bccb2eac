"""Evaluation scenarios of LDAP multi-provider replication conflicts (samples/make_eval.py), on the
topology of realkit/scen_ldap_repl.py (two slapd providers, serverID 1 and 2, replicating each other
with refreshAndPersist syncrepl, clients behind one bridge, captured on the bridge).

- ldap-repl-conflict-12: 12 rounds of simultaneous writes of one attribute of one entry on both
  providers (a longer run of the sample); twin: the same writes serialised through provider 1.
- ldap-repl-near-miss: a sweep of the gap between the two writes: 0.3 ms (inside the replication
  delay: the second provider has not yet received the first write) against 60 ms (the healthy twin:
  longer than the replication delay, the second write is made on top of the first, no conflict).
- ldap-repl-two-attrs: the two clients write *different* attributes of the same entry at the same
  instant on both providers (description on 1, l on 2); what survives is read back from both servers;
  twin: the same writes serialised through provider 1.
"""
from __future__ import annotations

from pathlib import Path

from . import scen_ldap_repl as R
from .core import Lab
from .eval_common import healthy_twin, new_entry, pathological


def _build(lab: Lab, out: Path, healthy: bool, scen: str, what: str, **kw) -> dict:
    fname = f"{scen}{'-healthy' if healthy else ''}.pcap"
    r = R.run_rounds(lab, out, fname, **kw)
    measured, expects = R.summarise(r)
    entry = new_entry(scen, healthy, R.made_with(r), measured=measured)
    if not expects:
        return healthy_twin(entry, (
            f"{measured['writes_ok']} writes in {r['rounds']} rounds ({what}); "
            f"{measured['rounds_converged']} rounds read back the same value and CSN from both providers and "
            "no write's value was lost."), silent=R.quiet()) if healthy else pathological(
            entry, f"{what}: no value lost in {r['rounds']} rounds (read back from both providers)",
            silent=R.quiet(), expect=[])
    return pathological(entry, (
        f"{what}: {measured['rounds_with_lost_update']} of {r['rounds']} rounds lost one write's value on both "
        f"providers (the later CSN won; lost: {', '.join(measured['lost_values'])})."),
        silent=R.quiet("replication_conflict"), expect=expects)


def build_conflict12(lab: Lab, out: Path, healthy: bool) -> dict:
    return _build(lab, out, healthy, "ldap-repl-conflict-12",
                  "serialised through provider 1" if healthy else "simultaneous writes on both providers",
                  serial=healthy, rounds=12, settle=0.5)


def build_near_miss(lab: Lab, out: Path, healthy: bool) -> dict:
    gap = 0.060 if healthy else 0.0003
    return _build(lab, out, healthy, "ldap-repl-near-miss",
                  f"the second write {gap * 1000:g} ms after the first, on the other provider",
                  serial=False, rounds=8, gap_s=gap, settle=0.5)


def build_two_attrs(lab: Lab, out: Path, healthy: bool) -> dict:
    return _build(lab, out, healthy, "ldap-repl-two-attrs",
                  ("description and l written through provider 1 one after the other" if healthy else
                   "description written on provider 1 and l on provider 2 at the same instant"),
                  serial=healthy, rounds=6, attrs=("description", "l"), settle=0.6)


def tshark_facts(entry: dict, path) -> dict:
    """What tshark sees: client modify requests per provider, Sync State entries (RFC 4533 §2.3) each
    provider pushed to the other, and their entryUUIDs."""
    from . import facts

    mods = facts.tshark_rows(path, "ldap.protocolOp == 6", ["ip.dst"])
    states = facts.tshark_rows(path, "ldap.state", ["ip.src", "ldap.entryUUID"])
    return dict(modify_requests=len(mods),
                modify_requests_per_provider={a: sum(1 for r in mods if r[0] == a) for a in (R.P1, R.P2)},
                sync_state_entries=len(states), sync_entry_uuids=len({r[1] for r in states}))
