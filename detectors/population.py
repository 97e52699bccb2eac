"""Populations: many findings of one cause, reported as one finding at the service (or the fleet).

Why
    Forty hosts that each open a new LDAP connection per search are one problem of the directory
    service, not forty small ones; 1 % of SYNs lost on every path is one problem of the network, not
    a thousand one-second stalls. Listed one by one, such findings bury what matters and under-rate
    it: each client alone is "low" while the service takes 150 new connections a second.

How findings group (declared by the detector, applied here for every detector alike)
    A detector module that has population-forming kinds declares ``POPULATION``, a dict:

    - ``kinds``: the kinds that group (each kind is its own cause);
    - ``service``: where the service's ``address:port`` is read from: ``"resource"`` (the resource
      *is* the service, as ``conn_churn``'s churn) or ``"resource_head"`` (the resource is
      ``service-peer``, as ``tcp_stall``'s ``server:port-client:port``);
    - ``member``: what one finding is about, ``"client"`` or ``"connection"``: the share affected
      is taken over the service's distinct client addresses, or over its connections (both counted
      from the capture's ``connections`` frame);
    - ``fleet`` (default False): whether one cause can span servers (packet loss on every path);
    - ``aggregate`` (optional) ``"rate"``: the members' ``value`` is a rate per client; the
      population's value is the rate at the service, sum(value x duration) / the population's span;
    - ``steps`` (optional): names of the detector's own ``Params`` fields (medium, high[, critical])
      that the aggregate is compared with: the detector's rule for one client, applied to the service.

    Per (detector, kind), member findings are keyed by service. When they reach at least
    ``fleet_min_services`` services and the kind is ``fleet``, they form one fleet-wide population
    listing the servers, except a service whose affected share is at least ``concentration`` times
    the fleet-wide share (a cause of its own, e.g. one overflowing listen backlog): it keeps its own
    population. Otherwise each service with at least ``min_members`` findings is a population. What
    is left (fewer than ``min_members`` at a service) stays as ordinary findings.

One cause explained by another detector's finding (``EXPLAINS``)
    A detector whose finding names the cause of other detectors' findings declares ``EXPLAINS``, a
    dict kind -> ``{"service": how its own service is read, "detector": the explained detector,
    "kinds": its explained kinds, "member_service": how theirs is read}`` (``SERVICE_FROM`` forms).
    E.g. conn_churn's ``syn_backlog`` (the listen backlog of a service overflowed) explains
    tcp_stall's ``rto`` / ``synack_retransmission`` findings at that service that began within its
    window (the SYN timeouts the clients waited out): those become the ``syn_backlog`` finding's
    members, before any population is formed, so one cause is one top-level finding, never below
    its worst member, whose explanation says what it cost. ``"client"`` (the findings' ``client``
    column) is the form for a cause at one client across its servers: incast's finding explains
    tcp_stall's ``rto`` findings of that client address.

What a population finding says
    ``members`` (how many findings) and ``member_ids`` (their ids, worst first); each member keeps
    its row with ``member_of`` = the population's id, so ``herdscope scan --expand`` and the
    dashboard can show it, but the default listing and ``--fail-on`` count only the population.
    ``clients`` is the distinct clients affected; the explanation gives their share of the
    service's clients (or connections), the rate at the service where declared, the median and the
    worst member, and when it started and ended. ``detector`` and ``kind`` are the members'.
    ``metric`` is the aggregate's (the members' metric at the service) where declared, else
    ``affected_share`` (value = the share, threshold = ``medium_share``).

Severity rule (population-level impact; never below the worst member)
    informational when every member is informational (cannot judge); the worst member's severity
    when the members come from fewer than ``impact_min_clients`` (3) distinct clients (one client's
    twelve SYN timeouts, or seven D-SACKs, are that client's path, not a pathology of the service);
    otherwise the highest of: the worst member's severity; medium when the share affected reaches ``medium_share``; high when it
    reaches ``high_share`` with at least ``high_members`` members; and where ``steps`` are declared,
    the aggregate against the detector's own steps (medium, high, critical).
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from .base import (FINDINGS_SCHEMA, SEVERITIES, SEVERITY_RANK, endpoint_expr, evidence_cap, fmt_ns, optional_frame,
                   params_json, significant_floats, stable_id)
from .params import LOWER, param

NAME = "population"
# the frames the step reads (service_load): detectors.run hands it a view serving only these, and a
# detector declaring POPULATION must require them itself, so they are built only for such detectors
REQUIRES = ("connections",)
COLUMNS = {"connections": ("server", "server_port", "client")}  # what service_load reads of them
SERVICE_FROM = {
    "resource": pl.col("resource"),
    "resource_head": pl.col("resource").str.split("-").list.first(),
    "client": pl.col("client"),  # the finding's client (incast: a client address, as tcp_stall's client column)
}
MEMBER_UNITS = ("client", "connection")
RESOURCE_SERVICES = 5  # services named in a fleet population's resource (then "+N more")
EXPLAINED_SERVICES = 30  # ... and in its explanation (every one of them is in the id and the members)


@dataclass(frozen=True)
class Params:
    min_members: int = param(5, "findings of one detector and kind at one service that are reported as one "
                                "population (fewer stay ordinary findings)", unit="findings", lo=2)
    fleet_min_services: int = param(2, "a kind declared fleet-wide whose findings reach this many services "
                                       "(together at least min_members) is one population across servers",
                                    unit="services", lo=2)
    concentration: float = param(3.0, "... except a service whose affected share is at least this many times "
                                      "the fleet-wide share: it keeps a population of its own", unit="x", lo=1.0)
    medium_share: float = param(0.25, "severity: at least medium when this share of the service's clients (or "
                                      "connections) is affected", unit="share", gate=LOWER, lo=0.0, hi=1.0)
    high_share: float = param(0.5, "... at least high from this share ...", unit="share", gate=LOWER, lo=0.0,
                              hi=1.0)
    high_members: int = param(20, "... with at least this many members", unit="findings", gate=LOWER, lo=1)
    impact_min_clients: int = param(3, "a population rises above its worst member (by share or aggregate) only "
                                       "with at least this many distinct clients: one client's many findings "
                                       "are that client's problem, not the service's", unit="clients",
                                    gate=LOWER, lo=1)


def declarations(modules: dict[str, object]) -> dict[str, dict]:
    """detector NAME -> its checked POPULATION declaration, for the modules that declare one."""
    out = {}
    for name, module in modules.items():
        decl = getattr(module, "POPULATION", None)
        if not decl:
            continue
        kinds = tuple(decl["kinds"])
        unknown = set(kinds) - set(getattr(module, "KINDS", kinds))
        if unknown or decl["service"] not in SERVICE_FROM or decl["member"] not in MEMBER_UNITS:
            raise TypeError(f"{name}.POPULATION is malformed: {decl!r}")
        out[name] = {"kinds": kinds, "service": decl["service"], "member": decl["member"],
                     "fleet": bool(decl.get("fleet", False)), "aggregate": decl.get("aggregate"),
                     "steps": tuple(decl.get("steps", ()))}
    return out


def explanations(modules: dict[str, object]) -> list[dict]:
    """The checked ``EXPLAINS`` declarations of the modules, as rules: the explaining (detector,
    kind) and how its service is read, the explained detector and kinds and how theirs is read."""
    out = []
    for name, module in sorted(modules.items()):
        for kind, decl in sorted((getattr(module, "EXPLAINS", None) or {}).items()):
            target, kinds = decl.get("detector"), tuple(decl.get("kinds", ()))
            if (kind not in getattr(module, "KINDS", (kind,)) or not target or not kinds
                    or decl.get("service") not in SERVICE_FROM or decl.get("member_service") not in SERVICE_FROM):
                raise TypeError(f"{name}.EXPLAINS is malformed: {kind!r}: {decl!r}")
            out.append({"detector": name, "kind": kind, "service": decl["service"], "target": target,
                        "kinds": kinds, "member_service": decl["member_service"]})
    return out


def _fold(found: pl.DataFrame, rules: list[dict]) -> pl.DataFrame:
    """Apply the ``EXPLAINS`` rules: every top-level finding of an explained (detector, kind) at the
    explaining finding's service that began within its window (start to end) becomes its member; the
    explaining finding then carries ``members`` / ``member_ids`` (worst first), is never below its
    worst member, and its explanation says what it cost. A finding two explainers could claim goes
    to the earliest (then the lowest id)."""
    if found.height == 0 or not rules:
        return found
    claims = []
    for rule in rules:
        ex = found.filter((pl.col("detector") == rule["detector"]) & (pl.col("kind") == rule["kind"])
                          & pl.col("member_of").is_null())
        mem = found.filter((pl.col("detector") == rule["target"]) & pl.col("kind").is_in(list(rule["kinds"]))
                           & pl.col("member_of").is_null() & (pl.col("members") == 0))
        if ex.height == 0 or mem.height == 0:
            continue
        ex = ex.select(SERVICE_FROM[rule["service"]].alias("_service"), pl.col("finding_id").alias("_by"),
                       pl.col("start_ns").alias("_a"), pl.col("end_ns").alias("_b"))
        mem = mem.with_columns(SERVICE_FROM[rule["member_service"]].alias("_service"))
        claims.append(mem.join(ex, on="_service").filter(pl.col("start_ns").is_between(pl.col("_a"), pl.col("_b")))
                      .select("finding_id", "_by", "_a"))
    claims = [c for c in claims if c.height]
    if not claims:
        return found
    link = pl.concat(claims).sort("finding_id", "_a", "_by").unique("finding_id", keep="first", maintain_order=True)
    link = link.filter(~pl.col("finding_id").is_in(link["_by"].implode()))  # an explainer is no one's member
    if link.height == 0:
        return found
    members = found.join(link.select("finding_id", "_by"), on="finding_id").with_columns(
        _rank(pl.col("severity")).alias("_rank"))
    updates = []
    for (by,), g in sorted(members.group_by("_by"), key=lambda kv: kv[0]):
        g = g.sort(pl.col("_rank"), pl.col("value").fill_null(float("-inf")), pl.col("start_ns"),
                   pl.col("finding_id"), descending=[True, True, False, False])
        host = found.filter(pl.col("finding_id") == by).row(0, named=True)
        worst = g.row(0, named=True)
        kinds = "/".join(sorted(g["kind"].unique().to_list()))
        unit = worst["unit"] or ""
        cost = (f"; what it cost: {g.height} {worst['detector']}/{kinds} finding(s) at this service in that "
                f"window are this one cause (members: median {_num(g['value'].median(), unit)}, worst "
                f"{_num(worst['value'], unit)}, {worst['severity']}, finding {worst['finding_id']}); "
                f"--expand lists them")
        updates.append({"finding_id": by, "_sev": SEVERITIES[max(SEVERITY_RANK[str(host["severity"])], worst["_rank"])],
                        "_ids": (host["member_ids"] or []) + g["finding_id"].to_list(),
                        "_text": (host["explanation"] or "").rstrip(".") + cost})
    upd = pl.DataFrame(updates, schema={"finding_id": pl.String, "_sev": pl.String, "_ids": pl.List(pl.String),
                                        "_text": pl.String})
    return (found.join(upd, on="finding_id", how="left", maintain_order="left")
            .join(link.select("finding_id", pl.col("_by").alias("_of")), on="finding_id", how="left",
                  maintain_order="left")
            .with_columns(pl.coalesce(pl.col("_sev"), pl.col("severity").cast(pl.String))
                          .cast(found.schema["severity"]).alias("severity"),
                          pl.coalesce("_ids", "member_ids").alias("member_ids"),
                          pl.coalesce("_text", "explanation").alias("explanation"),
                          pl.coalesce("member_of", "_of").alias("member_of"))
            .with_columns(pl.col("member_ids").list.len().cast(found.schema["members"]).alias("members"))
            .select(found.columns))


def service_load(capture) -> pl.DataFrame:
    """Per service (``address:port``) of the capture's TCP connections: distinct client addresses
    and connections (the denominators of the shares)."""
    schema = {"service": pl.String, "svc_clients": pl.UInt32, "svc_connections": pl.UInt32}
    conns = optional_frame(capture, "connections", nonempty=True)
    if conns is None:
        return pl.DataFrame(schema=schema)
    return (conns.select(endpoint_expr(pl.col("server"), pl.col("server_port")).alias("service"),
                         pl.col("client").cast(pl.String))
            .group_by("service").agg(pl.col("client").n_unique().cast(pl.UInt32).alias("svc_clients"),
                                     pl.len().cast(pl.UInt32).alias("svc_connections")))


def _rank(severity: pl.Expr) -> pl.Expr:
    return severity.cast(pl.Enum(list(SEVERITIES))).to_physical().cast(pl.Int32)


def _assign(m: pl.DataFrame, decl: dict, p: Params) -> pl.DataFrame:
    """The members of one (detector, kind) with ``_pop`` (population key: a service, or "*" for
    the fleet) where they form a population, null where they stay ordinary findings."""
    denom = "svc_clients" if decl["member"] == "client" else "svc_connections"
    unit = pl.col("_client_key") if decl["member"] == "client" else pl.col("finding_id")
    per = m.group_by("_service").agg(unit.n_unique().alias("_n"), pl.len().alias("_findings"),
                                     pl.col(denom).first().alias("_denom")).sort("_service")
    per = per.with_columns((pl.col("_n") / pl.col("_denom")).alias("_share"))
    own = pl.col("_findings") >= p.min_members
    if decl["fleet"] and per.height >= p.fleet_min_services:
        fleet_share = per["_n"].sum() / per["_denom"].sum() if per["_denom"].null_count() == 0 else None
        if fleet_share is not None and fleet_share > 0:
            own = own & (pl.col("_share") >= p.concentration * fleet_share).fill_null(False)
        else:
            own = pl.lit(False)
        per = per.with_columns(pl.when(own).then(pl.col("_service")).otherwise(pl.lit("*")).alias("_pop"))
        rest = per.filter(pl.col("_pop") == "*")["_findings"].sum()
        if rest < p.min_members:
            per = per.with_columns(pl.when(pl.col("_pop") == "*").then(None).otherwise(pl.col("_pop")).alias("_pop"))
    else:
        per = per.with_columns(pl.when(own).then(pl.col("_service")).otherwise(None).alias("_pop"))
    return m.join(per.select("_service", "_pop"), on="_service", how="left", maintain_order="left")


def _severity(g: dict, steps: list[float], p: Params) -> str:
    if g["_worst_rank"] == 0:
        return "informational"
    rank = g["_worst_rank"]
    if g["clients"] < p.impact_min_clients:  # no population-level impact: the worst member says it all
        return SEVERITIES[rank]
    share = g["_share"]
    if share is not None:
        if share >= p.high_share and g["members"] >= p.high_members:
            rank = max(rank, SEVERITY_RANK["high"])
        elif share >= p.medium_share:
            rank = max(rank, SEVERITY_RANK["medium"])
    if steps and g["_aggregate"] is not None:
        for k, step in enumerate(steps):
            if g["_aggregate"] >= step:
                rank = max(rank, SEVERITY_RANK["medium"] + k)
    return SEVERITIES[min(rank, len(SEVERITIES) - 1)]


def _num(x: float | None, unit: str) -> str:
    if x is None:
        return "n/a"
    if unit == "ms":
        return fmt_ns(x * 1e6)
    suffix = "/s" if unit == "1/s" else (f" {unit}" if unit else "")
    return f"{x:,.1f}{suffix}" if x < 100 else f"{x:,.0f}{suffix}"


def _explain(g: dict, decl: dict, p: Params) -> str:
    from analyzer.summary import iso_time

    what = f"{g['detector']}/{g['kind']}"
    services = g["_services"]
    if g["_pop"] == "*":
        more = len(services) - EXPLAINED_SERVICES
        where = (f"{len(services)} services ({', '.join(services[:EXPLAINED_SERVICES])}"
                 f"{f' and {more} more' if more > 0 else ''})")
    else:
        where = services[0]
    if decl["member"] == "client":
        head = f"{g['clients']} clients"
        if g["_denom"]:
            head += f" ({g['_share']:.0%} of the {g['_denom']:,} clients of {where})"
        else:
            head += f" of {where}"
    else:
        head = f"{g['members']} connections from {g['clients']} clients"
        if g["_denom"]:
            head += f" ({g['_share']:.1%} of the {g['_denom']:,} connections to {where})"
        else:
            head += f" to {where}"
    unit = g["unit"] or ""
    t = f"{head} each show the same {what} pathology"
    if g["_aggregate"] is not None:
        t += (f": together the service takes {_num(g['_aggregate'], unit)} "
              f"({g['_metric']}) from them")
    t += (f"; from {iso_time(g['start_ns'])} to {iso_time(g['end_ns'])} ({fmt_ns(g['end_ns'] - g['start_ns'])}); "
          f"median member {_num(g['_median'], unit)}, worst {_num(g['_worst_value'], unit)} "
          f"({g['_worst_severity']}, finding {g['_worst_id']}")
    if g["_worst_client"]:
        t += f", client {g['_worst_client']}"
    t += f"); worst member: {(g['_worst_text'] or '').split('; ')[0].rstrip('.')}"
    return t + "; --expand lists every member."


def apply(found: pl.DataFrame, capture, modules: dict[str, object], configured: dict[str, object],
          p: Params = Params()) -> pl.DataFrame:
    """``found`` (every detector's findings) with population findings added and their members
    marked (``member_of``), after folding what an ``EXPLAINS`` rule explains into the explaining
    finding; nothing changes for detectors that declare neither POPULATION nor EXPLAINS."""
    mods = {n: m for n, m in modules.items() if n in configured}
    found = _fold(found, explanations(mods))  # one cause explained by another detector's finding: its members
    decls = declarations(mods)
    if found.height == 0 or not decls:
        return found
    eligible = pl.lit(False)
    for name, decl in decls.items():
        eligible = eligible | ((pl.col("detector") == name) & pl.col("kind").is_in(list(decl["kinds"])))
    cand = found.filter(eligible & pl.col("member_of").is_null() & (pl.col("members") == 0))
    if cand.height < p.min_members:
        return found
    load = service_load(capture)
    populations, links = [], []
    for (name, kind), m in sorted(cand.group_by("detector", "kind"), key=lambda kv: kv[0]):
        decl = decls[name]
        if m.height < p.min_members:
            continue
        m = m.with_columns(SERVICE_FROM[decl["service"]].alias("_service"),
                           pl.coalesce(pl.col("client"), pl.col("finding_id")).alias("_client_key"),
                           _rank(pl.col("severity")).alias("_rank"))
        m = m.join(load.rename({"service": "_service"}), on="_service", how="left", maintain_order="left")
        m = _assign(m, decl, p).filter(pl.col("_pop").is_not_null())
        if m.height == 0:
            continue
        steps = [float(getattr(configured[name], s)) for s in decl["steps"]]
        for (pop,), g in sorted(m.group_by("_pop"), key=lambda kv: kv[0]):
            row, ids = _population(g, name, kind, pop, decl, steps, p)
            populations.append(row)
            links.append(pl.DataFrame({"finding_id": ids, "_member_of": [row["finding_id"]] * len(ids)}))
    if not populations:
        return found
    link = pl.concat(links)
    found = found.join(link, on="finding_id", how="left", maintain_order="left").with_columns(
        pl.coalesce("member_of", "_member_of").alias("member_of")).drop("_member_of")
    pops = pl.DataFrame([[r[c] for c in FINDINGS_SCHEMA.names()] for r in populations], schema=FINDINGS_SCHEMA,
                        orient="row").with_columns(significant_floats())
    return pl.concat([found.select(FINDINGS_SCHEMA.names()), pops])


def _population(g: pl.DataFrame, name: str, kind: str, pop: str, decl: dict, steps: list[float],
                p: Params) -> tuple[dict, list[str]]:
    """One population finding (a row of FINDINGS_SCHEMA as a dict) and its member ids, worst first."""
    g = g.sort(pl.col("_rank"), pl.col("value").fill_null(float("-inf")), pl.col("start_ns"), pl.col("finding_id"),
               descending=[True, True, False, False])
    worst = g.row(0, named=True)
    services = sorted(g["_service"].drop_nulls().unique().to_list())
    per_svc = g.group_by("_service").agg(pl.col("svc_clients").first(), pl.col("svc_connections").first())
    denom_col = "svc_clients" if decl["member"] == "client" else "svc_connections"
    denom = None if per_svc[denom_col].null_count() else int(per_svc[denom_col].sum())
    clients = g["_client_key"].n_unique()
    affected = clients if decl["member"] == "client" else g.height
    start, end = int(g["start_ns"].min()), int(g["end_ns"].max())
    aggregate = None
    if decl["aggregate"] == "rate":
        span_s = max(end - start, 1) / 1e9
        events = g.select((pl.col("value").fill_null(0.0) * (pl.col("end_ns") - pl.col("start_ns")) / 1e9).sum()).item()
        aggregate = float(events / span_s)
    facts = {
        "detector": name, "kind": kind, "members": g.height, "clients": clients, "start_ns": start, "end_ns": end,
        "unit": worst["unit"], "_pop": pop, "_services": services, "_denom": denom,
        "_share": (affected / denom) if denom else None, "_aggregate": aggregate,
        "_metric": f"{worst['metric']} at the service", "_median": g["value"].median(),
        "_worst_value": worst["value"], "_worst_severity": str(worst["severity"]), "_worst_id": worst["finding_id"],
        "_worst_client": worst["client"], "_worst_text": worst["explanation"],
        "_worst_rank": int(g["_rank"].max()),
    }
    severity = _severity(facts, steps, p)
    identity = g["client_identity"].drop_nulls().mode().sort()
    if aggregate is not None:
        metric, value, threshold, unit = f"{worst['metric']}_at_service", aggregate, (steps or [None])[0], worst["unit"]
    else:
        metric, value, threshold, unit = "affected_share", facts["_share"], p.medium_share, "fraction"
    server = None if pop == "*" else worst["server"]
    resource = pop if pop != "*" else (", ".join(services[:RESOURCE_SERVICES])
                                       + (f" (+{len(services) - RESOURCE_SERVICES} more)"
                                          if len(services) > RESOURCE_SERVICES else ""))
    fid = stable_id(("population", name, kind, pop, start, *services))
    frames = sorted({f for fs in g["evidence_frames"].to_list() for f in (fs or [])})
    row = {
        "detector": name, "kind": kind, "finding_id": fid, "severity": severity, "start_ns": start, "end_ns": end,
        "client": None, "server": server, "resource": resource, "clients": clients,
        "client_identity": identity[0] if identity.len() else None, "metric": metric, "value": value,
        "threshold": threshold, "unit": unit, "evidence_frames": frames[:evidence_cap() or len(frames)],
        "evidence_total": len(frames), "explanation": _explain(facts, decl, p),
        "parameters": params_json(p), "members": g.height, "member_ids": g["finding_id"].to_list(),
        "member_of": None,
    }
    return row, row["member_ids"]
