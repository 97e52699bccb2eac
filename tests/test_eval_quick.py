"""tests/benchmarks/evaluate.py works (quick mode): its counts add up and its table names every
detector; samples/synth_scenarios.py writes deterministic captures whose ground truth is well formed.
Detector *quality* is what the evaluation measures, so nothing here asserts TP or FA numbers."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
sys.path.insert(0, str(ROOT / "samples"))

import evaluate  # noqa: E402
import groundtruth as gt  # noqa: E402
import synth_scenarios as sc  # noqa: E402
from detectors import available  # noqa: E402
from detectors.base import SEVERITIES  # noqa: E402

EXPECT_KEYS = {"detector", "min_severity", "start_s", "tolerance_s", "client", "server", "resource", "count",
               "count_tolerance", "kind", "pathology"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "quick.json"
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert evaluate.main(["--quick", "--json", str(out)]) == 0
    return json.loads(out.read_text()), buf.getvalue()


def test_quick_table_has_every_detector(quick):
    res, text = quick
    names = list(available())
    assert names and set(res["confusion"]) >= set(names)
    table = text.split("All captures", 1)[1].split("\n\n", 1)[0].splitlines()
    rows = {line.split()[0] for line in table[3:]}
    assert rows >= set(names) | {"all"}
    for line in table[3:]:
        assert len(line.split()) == 1 + len(evaluate.COLUMNS)


def test_quick_counts_add_up(quick):
    res, _ = quick
    caps = res["captures"]
    assert {r["source"] for r in caps} >= {"samples", "synthetic"}
    assert sum(r["source"] == "synthetic" for r in caps) == len(sc.scenarios(quick=True))
    for det, row in res["confusion"].items():
        scored = [e for r in caps for e in r["expects"] if e["detector"] == det and e["pathology"] is not None]
        assert row["tp"] + row["miss"] == len(scored)
        assert row["tp"] == sum(e["hit"] for e in scored)
        assert row["count"] <= row["tp"]
        assert row["fa"] == sum(fa["detector"] == det for r in caps for fa in r["false_alarms"])
        assert row["h_med"] <= sum(r["healthy"] for r in caps)
        # the per-source tables partition the whole
        for col in evaluate.COLUMNS:
            assert row[col] == sum(t[det][col] for t in res["by_source"].values())
    for r in caps:
        assert not (r["healthy"] and r["expects"]), r["file"]
        for e in r["expects"]:
            assert e["hit"] == (e["hits"] > 0) and (e["worst"] is None) == (not e["hit"])


def test_quick_operating_curves_are_consistent(quick):
    res, text = quick
    swept = {s.sweep for s in sc.scenarios(quick=True)}
    assert {c["sweep"] for c in res["curves"] if ":" not in c["sweep"]} == swept   # "eval:..": recorded sweeps
    for c in res["curves"]:
        values = [p["value"] for p in c["points"]]
        assert values == sorted(values)
        fired = [p["value"] for p in c["points"] if p["fires"] and not p["healthy"]]
        want = (min(fired) if c["direction"] == "up" else max(fired)) if fired else None
        assert c["first_fires"] == want
        assert c["healthy_fires"] == [p["value"] for p in c["points"] if p["fires"] and p["healthy"]]
        for p in c["points"]:
            assert p["worst"] in (None, *SEVERITIES)
            assert p["fires"] == (p["worst"] in ("medium", "high", "critical"))
        assert c["sweep"] in text


def test_grey_points_and_below_high():
    assert evaluate.scored({"min_severity": "medium"}) is True
    assert evaluate.scored({"min_severity": "informational"}) is None      # the eval manifest's grey point
    assert evaluate.scored({"min_severity": "medium", "pathology": None}) is None
    t0 = 10**18
    f = pl.DataFrame({"detector": ["herd", "tcp_stall"], "kind": ["dns", "rto"], "severity": ["high", "medium"],
                      "start_ns": [t0 + 10**9, t0], "end_ns": [t0 + 2 * 10**9, t0 + 10**9], "server": ["s", "s"],
                      "resource": ["a", "b"]}, schema_overrides={"severity": pl.Enum(list(SEVERITIES))})
    opts = argparse.Namespace(severity="medium", healthy_severity="high")
    grey = {"file": "x", "healthy": False, "silent": ["tcp_stall"], "below_high": ["herd"],
            "expect": [{"detector": "herd", "min_severity": "informational", "start_s": 1.0, "tolerance_s": 0.5,
                        "server": "", "count": 1}]}
    out = evaluate.judge(grey, f, t0, {}, opts)
    assert out["expects"][0]["pathology"] is None and out["expects"][0]["hit"]
    assert sorted(fa["detector"] for fa in out["false_alarms"]) == ["herd", "tcp_stall"]   # high; medium
    healthy = {"file": "y", "healthy": True, "silent": ["herd", "tcp_stall"], "expect": []}
    out = evaluate.judge(healthy, f, t0, {}, opts)
    assert [fa["detector"] for fa in out["false_alarms"]] == ["herd"] and out["healthy_medium"] == ["tcp_stall"]


def test_matching_filters_on_window_kind_and_server():
    t0 = 1_000_000_000_000
    f = pl.DataFrame({"detector": ["herd", "herd", "herd", "tcp_stall"], "kind": ["dns", "kerberos", "dns", "rto"],
                      "severity": ["medium", "high", "low", "critical"],
                      "start_ns": [t0 + 10 * 10**9, t0 + 10 * 10**9, t0 + 10 * 10**9, t0],
                      "server": ["10.0.0.53", "10.0.0.10", "10.0.0.53", None],
                      "resource": ["a.example", "krbtgt", "a", None]},
                     schema_overrides={"severity": pl.Enum(list(SEVERITIES))})
    e = {"detector": "herd", "min_severity": "medium", "start_s": 10.2, "tolerance_s": 0.5, "server": "", "count": 1,
         "count_tolerance": 0, "resource": "a.example"}
    assert gt.matches(f, e, t0).height == 1                       # low: below min_severity; krbtgt: not the resource
    assert gt.matches(f, {**e, "resource": ""}, t0).height == 2   # no resource named: any
    assert gt.matches(f, {**e, "kind": "dns"}, t0)["server"].to_list() == ["10.0.0.53"]
    assert gt.matches(f, {**e, "server": "10.0.0.10", "resource": "KRBTGT"}, t0)["kind"].to_list() == ["kerberos"]
    assert gt.matches(f, {**e, "start_s": 11.0}, t0).height == 0  # outside the tolerance
    hits = gt.matches(f, {**e, "kind": "dns"}, t0)
    assert gt.count_ok(hits, e) and gt.resource_ok(hits, e)
    assert not gt.count_ok(gt.matches(f, {**e, "resource": ""}, t0), e)
    assert not gt.resource_ok(hits, {**e, "resource": "b.example"})
    assert gt.loud(f, "high").height == 2 and gt.loud(f, "high", "herd").height == 1


def test_scenarios_are_deterministic_and_labelled(tmp_path):
    names = {s.name for s in sc.scenarios()}
    assert len(names) == len(sc.scenarios())                       # unique names
    pick = sc.scenarios(only=["dns_herd_one_host-clients-50", "tcp_syn_loss_rtt-rtt_ms-50"])
    assert len(pick) == 2
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for s in pick:
        ra, rb = sc.write(s, str(a)), sc.write(s, str(b))
        assert ra == rb
        assert (a / ra["file"]).read_bytes() == (b / rb["file"]).read_bytes()
    herd, wan = (sc.build(s)[1] for s in pick)
    assert not herd["healthy"] and len(herd["expect"]) == 2
    assert all(set(e) == EXPECT_KEYS and e["pathology"] is True and e["detector"] == "herd" for e in herd["expect"])
    assert "herd" not in herd["silent"] and set(herd["silent"]) <= set(sc.DETECTORS)
    assert wan["healthy"] and wan["expect"] == [] and "tcp_stall" in wan["silent"]   # 1 s on 50 ms: 20 RTTs
    assert "retry_storm" not in wan["silent"]                      # a lost SYN is a retried SYN too


def test_mixed_capture_loses_syns_and_tails(tmp_path):
    out = tmp_path / "mixed.pcap"
    summary = sc.mixed(str(out), 4000, seed=2, syn_loss=0.2, tail_loss=0.2)
    assert summary["packets"] == 4000 and summary["losses"]["syn"] > 0 and summary["losses"]["tail"] > 0
    losses = json.loads(Path(str(out) + ".losses.json").read_text())
    assert len(losses) == summary["losses"]["syn"] + summary["losses"]["tail"]
    from analyzer import open_capture
    from analyzer.summary import tcp_totals
    with open_capture(out) as cap:
        retx = tcp_totals(cap)["retransmissions"]
        conns = cap.frame("connections").height
    assert retx >= len(losses)                                     # every loss is resent, seen twice
    assert len(losses) <= conns


def test_scenario_captures_show_what_their_truth_says(tmp_path):
    """The generator, read back by herdscope's own frames (not its detectors), matches the record."""
    from analyzer import open_capture
    names = ["dns_herd_hosts-clients-50", "dns_herd_one_host-clients-50", "tcp_syn_loss_rtt-rtt_ms-0.4",
             "ldap_churn_hosts-hosts-5"]
    recs = {s.name: (sc.write(s, str(tmp_path)), s) for s in sc.scenarios(only=names)}
    assert set(recs) == set(names)

    def frames(name, *which):
        with open_capture(tmp_path / recs[name][0]["file"]) as cap:
            return int(cap.packets["ts_ns"].min()), [cap.frame(w) for w in which]

    for name, ports in (("dns_herd_hosts-clients-50", False), ("dns_herd_one_host-clients-50", True)):
        rec = recs[name][0]
        first, (dns,) = frames(name, "dns_transactions")
        for e in rec["expect"]:             # each herd: 50 clients within the 50 ms spread, all answered
            t = first + int(e["start_s"] * 1e9)
            herd = dns.filter(pl.col("resource").cast(pl.String).str.contains("config.svc")
                              & pl.col("request_ts_ns").is_between(t, t + 60_000_000))
            assert herd.height == 50 and herd["answered"].all()
            assert herd["client"].n_unique() == (1 if ports else 50)
            assert herd["client_port"].n_unique() == 50
    _, (conns,) = frames("tcp_syn_loss_rtt-rtt_ms-0.4", "connections")
    svc = conns.filter((pl.col("server").cast(pl.String) == "10.0.2.11") & (pl.col("server_port") == 8080))
    waited = svc.filter(pl.col("synack_ts_ns") - pl.col("first_ts_ns") >= 1_000_000_000)
    assert svc.height == 200 and waited.height == 10               # 5 % of 200 lost their first SYN
    _, (conns,) = frames("ldap_churn_hosts-hosts-5", "connections")
    per_client = conns.filter(pl.col("server_port") == 389).group_by("client").len()["len"].sort().to_list()
    assert per_client[-5:] == [10] * 5 and sum(per_client[:-5]) == 3   # 5 hosts x 10; 3 ordinary sessions
