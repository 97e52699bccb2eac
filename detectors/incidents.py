"""Incidents: findings that are one chain of events, linked, ordered, and their likely trigger named.

Why
    A DNS TTL herd slows the resolver, Kerberos clients time out and retry in phase, LDAP clients
    reconnect per request: several detectors report one incident. Listed apart, the reader has to
    find the chain; linked, the first link is the place to look (issue 17).

The rule (over the top-level findings: a population stands for its members)
    Two findings are **linked** when both hold:

    - *time*: their windows overlap, or one starts at most ``lag_ns`` after the other ends (the gap
      equal to ``lag_ns`` still links);
    - *participants*: they share a client, or a server, or one's server is the other's dependency.
      Participants (:mod:`detectors.incidents_evidence`) are the ``client``/``server`` columns, a
      population's members' and the addresses of the evidence frames. A's server is B's
      **dependency** when A is about a DNS name that the capture's DNS answers resolve to a server of
      B (:mod:`detectors.incidents_dns`), or when a server of B is among A's clients (B's server
      itself asked A's server: a KDC querying the resolver).

    Findings below ``min_severity`` (default low: informational findings say what could not be
    judged) take no part. An **incident** is a connected group of at least ``min_findings`` linked findings,
    one of them at least ``min_worst_severity`` (default medium) (links chain:
    A-B and B-C make A, B, C one incident even when A and C share nothing). Its findings are ordered
    by start (then id), its severity is the worst of theirs, its id a stable hash of their ids (the
    same whatever the row order).

    The **likely trigger** is the finding that starts first. Starts closer than the tie window (the
    larger of ``tie_ns`` and the capture's timestamp resolution, ``base.resolution_ns``) cannot be
    ordered by time: among those, the one that is the dependency of the most others wins (then the
    earlier start, then the id). The reasons say it in words with numbers: how long it precedes the
    others, how many of the later findings' clients are its clients, and which dependency evidence
    was found. A trigger is a hypothesis the order and the shared participants support, not a proof
    of cause: a finding the capture does not show (an upstream outage) can precede them all.

An INCIDENT (a dict, JSON-ready): ``incident_id``, ``start_ns``, ``end_ns``, ``start_time``,
``end_time``, ``severity``, ``trigger`` (a finding_id), ``trigger_reasons`` (sentences), ``findings``
(finding_ids in start order), ``lanes`` (``[{"lane", "protocol", "server", "finding_ids"}]``: one per
protocol and server, in order of first start) and ``summary`` (one line). ``detectors/report.py``
adds ``capture``.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.decoders import registry
from analyzer.summary import iso_time

from .base import PROTOCOL_KINDS, SEVERITIES, SEVERITY_RANK, fmt_ns, resolution_ns, stable_id
from .incidents_evidence import Participants, Retained, addresses_of, participants, retain
from .params import param

NAME = "incident"  # --set incident.lag_ns=2s, an [incident] table in --config
REASONS_LISTED = 3  # dependency sentences per trigger before "and N more"


@dataclass(frozen=True)
class Params:
    lag_ns: int = param(5_000_000_000, "how long after one finding ends another may start and still be linked "
                                       "(the gap equal to it links): the longest client retry timer in common "
                                       "use, the resolver's (resolv.conf timeout, 5 s)", unit="ns", lo=0)
    tie_ns: int = param(0, "starts closer than this, or than the capture's timestamp resolution if that is "
                           "larger, are a near-tie: the trigger among them is the one the others depend on",
                        unit="ns", lo=0)
    min_findings: int = param(2, "linked findings that make an incident", unit="findings", lo=2)
    min_severity: str = param("low", "findings below this severity are linked into no incident (an "
                                     "informational finding says what could not be judged, not what went wrong)",
                              choices=SEVERITIES)
    min_worst_severity: str = param("medium", "an incident's worst finding must reach this severity: low findings "
                                              "that merely touch (two small retry bursts of a healthy resolver) "
                                              "are not an incident to act on", choices=SEVERITIES)


@dataclass
class _Finding:
    finding_id: str
    detector: str
    kind: str
    severity: str
    start_ns: int
    end_ns: int
    server: str | None
    client: str | None
    resource: str | None
    who: Participants

    @property
    def label(self) -> str:
        return f"{self.detector}/{self.kind} {self.finding_id}"


def link(findings: pl.DataFrame, capture, params: Params = Params(), *, retained: Retained | None = None) -> list[dict]:
    """The incidents among ``findings`` (ordered by start; see the module docstring for the rule).

    ``findings``: :func:`detectors.run`'s output (its members' rows add to their population's
    participants; only top-level findings are linked) or :func:`detectors.top_level` of it.
    ``capture``: the capture they came from (its timestamp resolution; its packets' addresses and DNS
    answers unless ``retained`` is given). ``retained``: :func:`incidents_evidence.retain` taken
    before a ``release=True`` run freed them (what ``herdscope scan`` does); the result is the same
    as a plain run's."""
    top = findings.filter(pl.col("member_of").is_null()) if "member_of" in findings.columns else findings
    top = top.filter(pl.col("severity").cast(pl.String).replace_strict(SEVERITY_RANK, return_dtype=pl.Int32)
                     >= SEVERITY_RANK[params.min_severity])
    if top.height < params.min_findings:
        return []
    retained = retained if retained is not None else (Retained() if capture is None else retain(capture))
    who = participants(findings, retained)
    rows = [_Finding(r["finding_id"], r["detector"], r["kind"] or "", str(r["severity"]), int(r["start_ns"]),
                     int(r["end_ns"]), r["server"], r["client"], r["resource"], who.get(r["finding_id"], Participants()))
            for r in top.sort("start_ns", "finding_id").iter_rows(named=True)]
    tie_ns = max(params.tie_ns, int(_resolution(capture)))
    groups = _components(rows, params.lag_ns, retained)
    out = [_incident(g, tie_ns, retained) for g in groups if len(g) >= params.min_findings
           and max(SEVERITY_RANK[f.severity] for f in g) >= SEVERITY_RANK[params.min_worst_severity]]
    return sorted(out, key=lambda i: (i["start_ns"], i["incident_id"]))


def _resolution(capture) -> float:
    """The capture's timestamp tick (1 ns without a capture: findings linked on their own)."""
    return 1.0 if capture is None else resolution_ns(capture)


def dependency(a: _Finding, b: _Finding, retained: Retained) -> str | None:
    """What shows that ``a``'s server is ``b``'s dependency (a clause naming the evidence, not ``b``),
    or None when nothing does."""
    resolved = [x for x in retained.resolves_to(a.resource) if x in b.who.servers] if a.resource else []
    if resolved:
        return (f"{a.resource}, the name {a.label} is about, resolves to {', '.join(resolved)} in the "
                f"capture's DNS answers")
    asked = sorted(b.who.servers & a.who.clients)
    if asked:
        return (f"{', '.join(asked)} is itself a client of {a.server or ', '.join(sorted(a.who.servers))}, "
                f"the server of {a.label}")
    return None


def related(a: _Finding, b: _Finding, retained: Retained) -> bool:
    """The participants half of the rule: shared clients or servers, or a dependency either way."""
    return bool(a.who.clients & b.who.clients or a.who.servers & b.who.servers
                or dependency(a, b, retained) or dependency(b, a, retained))


def _components(rows: list[_Finding], lag_ns: int, retained: Retained) -> list[list[_Finding]]:
    """Connected groups of linked findings (``rows`` in start order; a sweep over start times, then
    union-find), each in start order."""
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(rows):
        for j in range(i + 1, len(rows)):
            b = rows[j]
            if b.start_ns > a.end_ns + lag_ns:
                break  # rows are in start order: no later one is within the lag either
            if root(i) != root(j) and related(a, b, retained):
                parent[root(j)] = root(i)
    groups: dict[int, list[_Finding]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(root(i), []).append(r)
    return list(groups.values())


def _trigger(group: list[_Finding], tie_ns: int, retained: Retained) -> _Finding:
    """The earliest start; a near-tie (within ``tie_ns``) goes to the dependency of the most others."""
    first = group[0].start_ns
    near = [f for f in group if f.start_ns - first <= tie_ns]

    def depended_on(f: _Finding) -> int:
        return sum(1 for o in group if o is not f and dependency(f, o, retained))

    return min(near, key=lambda f: (-depended_on(f), f.start_ns, f.finding_id))


def _reasons(t: _Finding, group: list[_Finding], tie_ns: int, retained: Retained) -> list[str]:
    others = [f for f in group if f is not t]
    out = []
    nxt = min(others, key=lambda f: (f.start_ns, f.finding_id))
    last = max(others, key=lambda f: (f.start_ns, f.finding_id))
    lead_ns = nxt.start_ns - t.start_ns
    if lead_ns > tie_ns:
        tail = (f" and {fmt_ns(last.start_ns - t.start_ns)} before the last ({last.label})" if last is not nxt else "")
        out.append(f"it precedes the others: it starts {fmt_ns(lead_ns)} before the next ({nxt.label}){tail}")
    else:
        close = [f for f in others if abs(f.start_ns - t.start_ns) <= tie_ns]
        out.append(f"it starts within {fmt_ns(tie_ns)} (the tie window: the capture's timestamp resolution or "
                   f"incident.tie_ns) of {', '.join(f.label for f in close)}: too close to order by time, so "
                   f"the dependency evidence decides (then the earlier start, then the id)")
    later = set().union(*(f.who.clients for f in others))
    shared = t.who.clients & later
    if shared:
        out.append(f"its clients are theirs: {len(shared)} of the {len(later)} clients the other findings name "
                   f"(in their columns and evidence frames) are its clients")
    same = [f for f in others if t.who.servers & f.who.servers]
    if same:
        out.append(f"{len(same)} of the {len(others)} other findings are at its server "
                   f"{', '.join(sorted(t.who.servers & set().union(*(f.who.servers for f in same))))}")
    out += _grouped("its server is the dependency of", [(f, dependency(t, f, retained)) for f in others])
    # the other way round: a later finding's server that the trigger itself depends on (a resolver's
    # upstream answers after its clients asked) is said, as the place to look next
    out += _grouped("but it depends on the server of", [(f, dependency(f, t, retained)) for f in others])
    return out


def _grouped(lead: str, pairs: list[tuple[_Finding, str | None]]) -> list[str]:
    """One sentence per distinct piece of evidence: "<lead> X, Y: <evidence>" (at most
    :data:`REASONS_LISTED` findings named in each)."""
    by_evidence: dict[str, list[_Finding]] = {}
    for f, evidence in pairs:
        if evidence:
            by_evidence.setdefault(evidence, []).append(f)
    out = []
    for evidence, fs in by_evidence.items():
        named = ", ".join(f.label for f in fs[:REASONS_LISTED])
        more = f" and {len(fs) - REASONS_LISTED} more" if len(fs) > REASONS_LISTED else ""
        out.append(f"{lead} {named}{more}: {evidence}")
    return out


_PORT_PROTOCOL = {port: p.name for p in registry.protocols() for port in (*p.udp_ports, *p.tcp_ports)}


def protocol_of(f) -> str:
    """The lane's protocol: a transaction detector's kind (dns, kerberos, ...), else the protocol of the
    first ``address:port`` its resource names (conn_churn's 10.77.0.89:389 -> ldap), else its detector."""
    kind, detector, resource = (f.kind, f.detector, f.resource) if isinstance(f, _Finding) else (
        f["kind"], f["detector"], f["resource"])
    if kind in PROTOCOL_KINDS:
        return kind
    for token in (resource or "").replace("-", " ").replace(",", " ").split():
        head, _, port = token.rpartition(":")
        if head and port.isdigit() and int(port) in _PORT_PROTOCOL:
            return _PORT_PROTOCOL[int(port)]
    return detector


def _lanes(group: list[_Finding]) -> list[dict]:
    lanes: dict[tuple, dict] = {}
    for f in group:  # start order: lanes in order of first start
        server = f.server or (next(iter(f.who.servers)) if len(f.who.servers) == 1 else None)
        where = server or (f"({len(f.who.servers)} servers)" if f.who.servers else "(no server)")
        protocol = protocol_of(f)
        lane = lanes.setdefault((protocol, server), {"lane": f"{protocol} {where}",
                                                     "protocol": protocol, "server": server, "finding_ids": []})
        lane["finding_ids"].append(f.finding_id)
    return list(lanes.values())


def _incident(group: list[_Finding], tie_ns: int, retained: Retained) -> dict:
    t = _trigger(group, tie_ns, retained)
    start, end = min(f.start_ns for f in group), max(f.end_ns for f in group)
    severity = SEVERITIES[max(SEVERITY_RANK[f.severity] for f in group)]
    lanes = _lanes(group)
    summary = (f"{len(group)} linked findings over {fmt_ns(end - start)} in {len(lanes)} lane(s) "
               f"({', '.join(lane['lane'] for lane in lanes)}); likely trigger {t.label}")
    return {"incident_id": stable_id(sorted(f.finding_id for f in group)), "start_ns": start, "end_ns": end,
            "start_time": iso_time(start), "end_time": iso_time(end), "severity": severity,
            "trigger": t.finding_id, "trigger_reasons": _reasons(t, group, tie_ns, retained),
            "findings": [f.finding_id for f in group], "lanes": lanes, "summary": summary}


def incident_of(incidents: list[dict]) -> dict[str, str]:
    """finding_id -> the incident_id it belongs to (findings in no incident are absent)."""
    return {fid: inc["incident_id"] for inc in incidents for fid in inc["findings"]}


__all__ = ["NAME", "Params", "Retained", "addresses_of", "dependency", "incident_of", "link", "protocol_of",
           "related", "retain"]
