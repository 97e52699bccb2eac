"""Population findings (detectors/population.py): many findings of one cause become one finding at the
service, or across the fleet, with the per-client findings as its members.

Captures: generated with samples/synth_scenarios.py (40 hosts connecting per LDAP search at 180/s and
its pooled twin; connections to four servers of which a share lose their first SYN) and a small
samples/synth.py capture, each built once per session.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import detectors
from analyzer.cli import main
from detectors import population
from detectors.base import SEVERITY_RANK
from detectors.params import LOWER, fields_of, spec_of
from shared_captures import shared_capture

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "samples"))


def _scenario(out_dir: Path, name: str, family: str, options: dict) -> Path:
    import synth_scenarios as ss

    sc = ss.Scenario(name, name, family, next(iter(options)), 0.0, options)
    return out_dir / ss.write(sc, str(out_dir))["file"]


@pytest.fixture(scope="session")
def pop_captures(tmp_path_factory):
    """name -> path of the generated captures (built once)."""
    import synth

    d = tmp_path_factory.mktemp("population")
    paths = {
        "churn": _scenario(d, "pop-ldap-churn-40", "ldap_churn", {"hosts": 40, "rate_per_s": 180}),
        "pooled": _scenario(d, "pop-ldap-pooled-40", "ldap_churn", {"hosts": 40, "rate_per_s": 180, "pooled": True}),
        "fleet": _scenario(d, "pop-syn-loss-fleet", "tcp_loss",
                           {"servers": 4, "rtt_ms": 0.4, "loss": "syn", "share": 0.1, "connections": 400}),
    }
    synth.generate(str(d / "synth.pcap"), packets=20_000, seed=11)
    paths["synth"] = d / "synth.pcap"
    return paths


_RUNS: dict = {}


def found(paths: dict, name: str, overrides: dict | None = None) -> pl.DataFrame:
    key = (name, json.dumps(overrides or {}, sort_keys=True))
    if key not in _RUNS:  # the capture is read and analysed once (tests/shared_captures.py), then only scanned
        _RUNS[key] = detectors.run(shared_capture(paths[name]), overrides=overrides)
    return _RUNS[key]


# (detector, kind) -> the (detector, kind)s its findings may take as members (the EXPLAINS rules)
EXPLAINED = {}
for _rule in population.explanations(detectors.available()):
    EXPLAINED.setdefault((_rule["detector"], _rule["kind"]), set()).update((_rule["target"], k) for k in _rule["kinds"])


def check_members_add_up(f: pl.DataFrame) -> None:
    """The population contract: members == len(member_ids); every member id is a finding of the
    expanded output marked member_of that population, and nothing else is; members are ordinary
    findings; a population is never below its worst member; ids are unique."""
    ids = f["finding_id"].to_list()
    assert len(ids) == len(set(ids)), "duplicate finding ids"
    by_id = {r["finding_id"]: r for r in f.iter_rows(named=True)}
    expanded = detectors.expanded(f)
    assert sorted(expanded["finding_id"].to_list()) == sorted(ids)  # --expand lists every finding once
    listed = set(expanded["finding_id"].to_list())
    claimed = set()
    for r in f.filter(pl.col("members") > 0).iter_rows(named=True):
        assert r["member_of"] is None
        assert r["members"] == len(r["member_ids"]) == len(set(r["member_ids"]))
        for m in r["member_ids"]:
            assert m in listed and by_id[m]["member_of"] == r["finding_id"]
            assert by_id[m]["members"] == 0 and by_id[m]["member_ids"] == []
            assert ((by_id[m]["detector"], by_id[m]["kind"]) == (r["detector"], r["kind"])
                    or (by_id[m]["detector"], by_id[m]["kind"]) in EXPLAINED.get((r["detector"], r["kind"]), ()))
            assert SEVERITY_RANK[by_id[m]["severity"]] <= SEVERITY_RANK[r["severity"]]
        assert not claimed & set(r["member_ids"])
        claimed |= set(r["member_ids"])
    marked = set(f.filter(pl.col("member_of").is_not_null())["finding_id"].to_list())
    assert marked == claimed
    for r in f.filter(pl.col("members") == 0).iter_rows(named=True):
        assert r["member_ids"] == []
    # expanded order: each population directly followed by its members, in member_ids order
    rows = expanded.iter_rows(named=True)
    order = [r["finding_id"] for r in rows]
    for r in f.filter(pl.col("members") > 0).iter_rows(named=True):
        k = order.index(r["finding_id"])
        assert order[k + 1:k + 1 + r["members"]] == r["member_ids"]


# -- the two examples of the issue ------------------------------------------------------------------

def test_forty_churning_clients_are_one_population_at_the_service(pop_captures):
    f = found(pop_captures, "churn")
    churn = f.filter((pl.col("detector") == "conn_churn") & (pl.col("kind") == "churn"))
    top = detectors.top_level(churn)
    assert top.height == 1
    pop = top.row(0, named=True)
    assert pop["members"] == 40 and pop["clients"] == 40
    assert pop["resource"] == "10.0.0.10:389" and pop["server"] == "10.0.0.10"
    assert SEVERITY_RANK[pop["severity"]] >= SEVERITY_RANK["medium"]
    # every member alone is low: the population is what reaches medium and above
    members = churn.filter(pl.col("member_of") == pop["finding_id"])
    assert members.height == 40 and set(members["severity"].cast(pl.String)) == {"low"}
    assert pop["metric"] == "connections_per_s_at_service" and pop["value"] >= 100  # 180/s offered
    connections = shared_capture(pop_captures["churn"]).frame("connections")  # the share: every client of the service
    total = connections.filter((pl.col("server").cast(pl.String) == "10.0.0.10")
                               & (pl.col("server_port") == 389))["client"].n_unique()
    assert total > 40
    assert f"40 clients ({40 / total:.0%} of the {total} clients of 10.0.0.10:389)" in pop["explanation"]
    assert "median member" in pop["explanation"] and "worst" in pop["explanation"]
    assert pop["start_ns"] == members["start_ns"].min() and pop["end_ns"] == members["end_ns"].max()
    check_members_add_up(f)


def test_pooled_twin_has_no_churn(pop_captures):
    f = found(pop_captures, "pooled")
    assert f.filter(pl.col("detector") == "conn_churn").height == 0


def test_syn_loss_on_every_server_is_one_fleet_population(pop_captures):
    f = found(pop_captures, "fleet")
    rto = f.filter((pl.col("detector") == "tcp_stall") & (pl.col("kind") == "rto"))
    top = detectors.top_level(rto)
    assert top.height == 1, top.select("resource", "members", "severity")
    pop = top.row(0, named=True)
    assert pop["members"] == rto.height - 1 >= 30
    assert pop["server"] is None  # across servers: the resource and explanation list them
    assert pop["resource"].count(":8080") == 4
    assert "4 services" in pop["explanation"]
    check_members_add_up(f)


def test_fewer_than_min_members_stay_ordinary(pop_captures):
    f = found(pop_captures, "churn", {"population.min_members": 41})
    churn = f.filter(pl.col("detector") == "conn_churn")
    assert churn.height == 40 and churn["members"].sum() == 0 and churn["member_of"].null_count() == 40


def test_a_concentrated_service_keeps_its_own_population():
    """Members at three services, one of which has most of its connections affected: that one is a
    cause of its own (a population at it); the scattered rest is one fleet population."""
    rows = []
    spec = {"10.0.0.1:80": (30, 40), "10.0.0.2:80": (3, 400), "10.0.0.3:80": (3, 400), "10.0.0.4:80": (3, 400)}
    for svc, (n, _) in spec.items():
        for k in range(n):
            rows.append({"detector": "tcp_stall", "kind": "rto", "finding_id": f"{svc}-{k}", "severity": "low",
                         "start_ns": k, "end_ns": k + 10, "client": f"10.9.0.{k}", "server": svc.split(":")[0],
                         "resource": f"{svc}-10.9.0.{k}:4000", "clients": 1, "value": 1000.0, "unit": "ms",
                         "metric": "stall_ms", "explanation": "x", "evidence_frames": [k + 1]})
    frame = pl.DataFrame(rows).with_columns(pl.lit(0, pl.UInt32).alias("members"),
                                            pl.lit([], pl.List(pl.String)).alias("member_ids"),
                                            pl.lit(None, pl.String).alias("member_of"))
    frame = pl.concat([detectors.empty_findings(), frame], how="diagonal_relaxed").cast(detectors.FINDINGS_SCHEMA)

    class Cap:
        def frame(self, name):
            assert name == "connections"
            out = []
            for svc, (_, total) in spec.items():
                addr = svc.split(":")[0]
                out += [{"server": addr, "server_port": 80, "client": f"10.9.{j // 250}.{j % 250}"} for j in range(total)]
            return pl.DataFrame(out)

    mods = detectors.available()
    out = population.apply(frame, Cap(), mods, detectors.configure(["tcp_stall"]), population.Params())
    pops = out.filter(pl.col("members") > 0).sort("members")
    assert pops["resource"].to_list()[1] == "10.0.0.1:80" and pops["members"].to_list() == [9, 30]
    fleet = pops.row(0, named=True)
    assert fleet["server"] is None and fleet["resource"].count(":80") == 3
    # 30 of 40 connections affected at 10.0.0.1: high by the share rule
    assert pops.row(1, named=True)["severity"] == "high"
    check_members_add_up(out)


# -- the property: member counts add up, for any population parameters -----------------------------

@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["churn", "fleet", "synth"]), min_members=st.integers(2, 45),
       fleet_min=st.integers(2, 6))
def test_members_add_up(pop_captures, name, min_members, fleet_min):
    f = found(pop_captures, name, {"population.min_members": min_members,
                                   "population.fleet_min_services": fleet_min})
    check_members_add_up(f)
    for r in f.filter(pl.col("members") > 0).iter_rows(named=True):
        assert r["members"] >= min_members or r["resource"].count(",") + 1 >= fleet_min


@pytest.mark.parametrize("field", [f for f in fields_of(population.Params) if spec_of(f).gate == LOWER],
                         ids=lambda f: f.name)
def test_population_gates_are_monotonic(pop_captures, field):
    """Lowering a lower-bound severity step never lowers a population's severity."""
    lo, hi = max(spec_of(field).lo or 0, field.default * 0.25), field.default * 2
    if spec_of(field).hi is not None:
        hi = min(hi, spec_of(field).hi)
    if isinstance(field.default, int):
        lo, hi = max(1, int(lo)), int(hi)
    for name in ("churn", "fleet"):
        loose = found(pop_captures, name, {f"population.{field.name}": lo})
        strict = found(pop_captures, name, {f"population.{field.name}": hi})
        worst: dict[tuple, int] = {}
        for d, k, s in detectors.top_level(loose).select("detector", "kind", "severity").iter_rows():
            worst[(d, k)] = max(worst.get((d, k), -1), SEVERITY_RANK[s])
        for d, k, s in detectors.top_level(strict).select("detector", "kind", "severity").iter_rows():
            assert worst.get((d, k), -1) >= SEVERITY_RANK[s], (field.name, name, d, k)


def test_population_parameters_are_checked():
    with pytest.raises(detectors.ParameterError):
        detectors.population_params({"population.min_members": 1})
    with pytest.raises(detectors.ParameterError):
        detectors.population_params({"population.no_such": 3})
    assert detectors.population_params({"population.min_members": "7"}).min_members == 7


# -- the CLI ----------------------------------------------------------------------------------------

def test_cli_lists_the_population_and_expand_lists_members(pop_captures, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = str(pop_captures["churn"])
    code = main(["scan", path, "--format", "json", "--detectors", "conn_churn"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1  # the population reaches --fail-on high; no member alone does
    assert len(doc["findings"]) == 1 and doc["findings"][0]["members"] == 40
    assert doc["captures"][0]["findings"][doc["findings"][0]["severity"]] == 1
    assert sum(doc["captures"][0]["findings"].values()) == 1
    assert main(["scan", path, "--format", "json", "--detectors", "conn_churn", "--fail-on", "medium",
                 "--set", "population.min_members=50"]) == 0  # 40 low findings: nothing reaches medium
    capsys.readouterr()
    main(["scan", path, "--format", "json", "--detectors", "conn_churn", "--expand"])
    doc = json.loads(capsys.readouterr().out)
    pop, members = doc["findings"][0], doc["findings"][1:]
    assert [m["finding_id"] for m in members] == pop["member_ids"]
    assert all(m["member_of"] == pop["finding_id"] for m in members)
    main(["scan", path, "--detectors", "conn_churn"])
    table = capsys.readouterr().out
    assert "[population of 40 findings]" in table and "    member " not in table
    main(["scan", path, "--detectors", "conn_churn", "--expand"])
    table = capsys.readouterr().out
    assert table.count("    member ") == 40
    assert table.index("[population of 40 findings]") < table.index("    member ")


# -- the dashboard -------------------------------------------------------------------------------------

def test_dashboard_lists_the_population_and_drills_down_to_a_member(pop_captures, monkeypatch):
    import streamlit as st  # a dependency (pyproject.toml): missing is a failure, not a skip
    from streamlit.testing.v1 import AppTest

    from dashboards import data as D
    from dashboards.settings import ENV, Settings

    path = str(pop_captures["churn"])
    f = found(pop_captures, "churn").filter(pl.col("detector") == "conn_churn")
    pop = detectors.top_level(f).row(0, named=True)
    st.cache_data.clear()
    monkeypatch.setattr(D, "findings", lambda key, cap, overrides="{}": (f, {}, ["conn_churn"]))
    monkeypatch.setenv("HERDSCOPE_TSHARK", "")
    monkeypatch.setenv(ENV, Settings(files=(path,)).to_env())
    at = AppTest.from_file(str(ROOT / "dashboards" / "streamlit_app.py"), default_timeout=120).run()
    at.sidebar.radio(key="page").set_value("Findings").run()
    assert not at.exception, [e.value for e in at.exception]
    tables = [t.value for t in at.dataframe]
    listing = next(t for t in tables if "members" in t.columns)
    assert len(listing) == 1 and int(listing["members"].iloc[0]) == 40  # members are not rows of their own
    assert len(at.selectbox(key="finding_select").options) == 1
    pick = at.selectbox(key=f"member_pick_{pop['finding_id']}")
    assert len(pick.options) == 41  # "—" and the 40 members
    member = pop["member_ids"][0]
    pick.set_value(member).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [e.value for e in at.markdown]
    assert any(member in m for m in shown)  # the member's own detail ("finding id") is on the page
    st.cache_data.clear()


# -- population-level impact needs several clients; one cause is one top-level finding -----------------

def _rows(rows: list[dict]) -> pl.DataFrame:
    base = {"clients": 1, "value": 1000.0, "unit": "ms", "metric": "stall_ms", "explanation": "x"}
    frame = pl.DataFrame([{**base, **r} for r in rows]).with_columns(
        pl.lit(0, pl.UInt32).alias("members"), pl.lit([], pl.List(pl.String)).alias("member_ids"),
        pl.lit(None, pl.String).alias("member_of"))
    return pl.concat([detectors.empty_findings(), frame], how="diagonal_relaxed").cast(detectors.FINDINGS_SCHEMA)


class _Conns:
    """A capture whose ``connections`` frame has ``total`` connections to each service, from
    ``clients`` addresses."""

    def __init__(self, services: dict[str, int], clients: int = 50):
        self.services, self.clients = services, clients

    def frame(self, name):
        assert name == "connections"
        return pl.DataFrame([{"server": s.split(":")[0], "server_port": int(s.split(":")[1]),
                              "client": f"10.9.0.{j % self.clients}"}
                             for s, total in self.services.items() for j in range(total)])


def _stalls(n: int, clients: int, *, kind="rto", severity="low", svc="10.0.0.1:80", start=0):
    return [{"detector": "tcp_stall", "kind": kind, "finding_id": f"{kind}-{svc}-{start}-{k}", "severity": severity,
             "start_ns": start + k, "end_ns": start + k + 10, "client": f"10.9.0.{k % clients}",
             "server": svc.split(":")[0], "resource": f"{svc}-10.9.0.{k % clients}:{4000 + k}",
             "evidence_frames": [start + k + 1]} for k in range(n)]


@pytest.mark.parametrize("clients, expect", [(1, "low"), (2, "low"), (3, "high"), (24, "high")])
def test_population_impact_needs_several_clients(clients, expect):
    """24 of 40 connections of a service stalled (share 0.6 >= high_share, 24 >= high_members): high
    from several clients; from one or two clients the population is its worst member (low) — the
    twelve SYN timeouts of one client behind a stale middlebox (suricata-verify tls-subjectaltname)."""
    frame = _rows(_stalls(24, clients))
    out = population.apply(frame, _Conns({"10.0.0.1:80": 40}), detectors.available(),
                           detectors.configure(["tcp_stall"]), population.Params())
    pop = out.filter(pl.col("members") > 0)
    assert pop.height == 1 and pop["severity"][0] == expect and pop["clients"][0] == clients
    check_members_add_up(out)
    # the gate is monotonic: lowered to 1, one client's population rises; raised past 24, none does
    loose = population.apply(frame, _Conns({"10.0.0.1:80": 40}), detectors.available(),
                             detectors.configure(["tcp_stall"]), population.Params(impact_min_clients=1))
    assert loose.filter(pl.col("members") > 0)["severity"][0] == "high"


@pytest.mark.parametrize("kind", ["spurious_retransmission", "teardown", "capture_gap"])
def test_kinds_that_cost_nothing_form_no_population(kind):
    """D-SACKed retransmissions, FIN retransmissions and capture gaps are no pathology of a service:
    however many, they stay ordinary findings (and never rise above what each is)."""
    frame = _rows(_stalls(30, 30, kind=kind))
    out = population.apply(frame, _Conns({"10.0.0.1:80": 40}), detectors.available(),
                           detectors.configure(["tcp_stall"]), population.Params())
    assert out.height == 30 and out["members"].sum() == 0 and out["member_of"].null_count() == 30
    assert set(out["severity"].cast(pl.String)) == {"low"}


def test_a_listen_backlog_finding_takes_the_syn_timeouts_it_explains():
    """conn_churn.EXPLAINS: a syn_backlog finding at 10.0.0.1:80 over [100, 200] takes as members the
    tcp_stall rto findings at that service that began in its window (here 30, high each: it becomes
    high, and says what it cost); a stall at another service, or after the window, is not its doing
    and forms its own population or stays ordinary."""
    backlog = {"detector": "conn_churn", "kind": "syn_backlog", "finding_id": "backlog", "severity": "medium",
               "start_ns": 100, "end_ns": 200, "client": None, "server": "10.0.0.1", "resource": "10.0.0.1:80",
               "clients": 30, "value": 0.3, "unit": "fraction", "metric": "unanswered_syn_share",
               "explanation": "100 of 300 connection attempts got no SYN/ACK.", "evidence_frames": [101]}
    inside = _stalls(30, 30, severity="high", start=100)
    later = _stalls(6, 6, start=1_000)
    elsewhere = _stalls(6, 6, svc="10.0.0.2:80", start=100)
    frame = _rows([backlog, *inside, *later, *elsewhere])
    out = population.apply(frame, _Conns({"10.0.0.1:80": 300, "10.0.0.2:80": 300}), detectors.available(),
                           detectors.configure(["tcp_stall", "conn_churn"]), population.Params())
    check_members_add_up(out)
    b = out.filter(pl.col("finding_id") == "backlog").row(0, named=True)
    assert b["members"] == 30 and set(b["member_ids"]) == {r["finding_id"] for r in inside}
    assert b["severity"] == "high" and "what it cost: 30 tcp_stall/rto finding(s)" in b["explanation"]
    assert b["explanation"].startswith("100 of 300 connection attempts got no SYN/ACK;")
    rest = out.filter(pl.col("finding_id").is_in([r["finding_id"] for r in later + elsewhere]))
    assert rest["member_of"].is_in(["backlog"]).sum() == 0
    # without conn_churn configured, nothing explains them: the 30 form a population of their own
    alone = population.apply(frame.filter(pl.col("finding_id").is_in([r["finding_id"] for r in inside])),
                             _Conns({"10.0.0.1:80": 300}),
                             detectors.available(), detectors.configure(["tcp_stall"]), population.Params())
    assert alone.filter(pl.col("members") == 30).height == 1
