"""The incident timeline on the recorded cascade (issue 17): samples/cascade-dns-krb5.pcap.

A DNS TTL herd at a stalled resolver releases a Kerberos AS herd at the KDC from the same clients
(samples/realkit/scen_cascade.py). The manifest's ``[capture.cascade]`` table says which finding is the
cause and which are its effects, in order; the incident linking (detectors/incidents.py) must make them one
incident with the cause as its trigger and the effects after it, and the healthy twin must have no
incident. The expectation is read from the manifest, never written here.
"""
import json
import sys
from pathlib import Path

import polars as pl
import pytest

from analyzer.cli import main
from detectors import top_level
from detectors.incidents import Params, link
from shared_captures import shared_capture, shared_run

sys.path.insert(0, str(Path(__file__).parent.parent / "samples"))
from groundtruth import load_manifest  # noqa: E402

SAMPLES = Path(__file__).parent.parent / "samples"
CASCADES = [c for c in load_manifest(SAMPLES / "MANIFEST.toml") if "cascade" in c]
TWINS = [c["twin"] for c in CASCADES]


def _named(findings: pl.DataFrame, what: str, server: str, resource: str) -> pl.DataFrame:
    """The top-level findings ``detector/kind`` on SERVER about RESOURCE."""
    detector, kind = what.split("/", 1)
    return findings.filter((pl.col("detector") == detector) & (pl.col("kind") == kind)
                           & (pl.col("server") == server) & (pl.col("resource") == resource))


def _linked(path: Path) -> tuple[pl.DataFrame, list[dict]]:
    findings = top_level(shared_run(path))
    return findings, link(findings, shared_capture(path), Params())


def _one(findings: pl.DataFrame, what: str, server: str, resource: str) -> dict:
    hits = _named(findings, what, server, resource)
    assert hits.height == 1, (f"{what} on {server} {resource!r}: {hits.height} findings; all: "
                              f"{findings.select('detector', 'kind', 'severity', 'server', 'resource').to_dicts()}")
    return hits.row(0, named=True)


def test_a_cascade_sample_is_listed():
    assert CASCADES, "no [capture.cascade] table in samples/MANIFEST.toml"
    for c in CASCADES:
        casc = c["cascade"]
        assert not c["healthy"] and casc["effects"]
        assert len(casc["effects"]) == len(casc["effect_servers"]) == len(casc["effect_resources"])
        # cause and effects are among the capture's expected findings
        expected = {(f"{e['detector']}/{e.get('kind', '')}", e["server"]) for e in c["expect"]}
        assert {(casc["cause"], casc["cause_server"]), *zip(casc["effects"], casc["effect_servers"])} <= expected


@pytest.mark.parametrize("cap", CASCADES, ids=lambda c: c["file"])
def test_the_timeline_puts_the_cause_first(cap):
    casc = cap["cascade"]
    findings, found = _linked(SAMPLES / cap["file"])
    cause = _one(findings, casc["cause"], casc["cause_server"], casc["cause_resource"])
    effects = [_one(findings, w, s, r) for w, s, r in
               zip(casc["effects"], casc["effect_servers"], casc["effect_resources"])]
    holding = [i for i in found if cause["finding_id"] in i["findings"]]
    assert len(holding) == 1, f"the cause is in {len(holding)} incidents: {found}"
    (inc,) = holding
    assert inc["trigger"] == cause["finding_id"], inc
    assert inc["trigger_reasons"], "the trigger is named without a reason"
    # the effects follow the trigger, in the manifest's order, in the incident's start order
    order = [inc["findings"].index(f["finding_id"]) for f in [cause, *effects]]
    assert order == sorted(order) and order[0] == 0, inc["findings"]
    starts = [f["start_ns"] for f in [cause, *effects]]
    assert starts == sorted(starts)
    assert inc["start_ns"] == cause["start_ns"] and inc["end_ns"] >= max(f["end_ns"] for f in effects)
    # the first effect lags the cause by what the clients' logs say (within both expectations' tolerances)
    tol_s = sum(e["tolerance_s"] for e in cap["expect"][:2])
    assert abs((effects[0]["start_ns"] - cause["start_ns"]) / 1e9 - casc["lag_s"]) <= tol_s
    # one lane per server of the chain
    lane_servers = {lane["server"] for lane in inc["lanes"]}
    assert {casc["cause_server"], *casc["effect_servers"]} <= lane_servers
    worst = max([cause, *effects], key=lambda f: ["informational", "low", "medium", "high", "critical"]
                .index(f["severity"]))
    assert inc["severity"] == worst["severity"]


@pytest.mark.parametrize("file", TWINS)
def test_the_healthy_twin_has_no_incident(file):
    _, found = _linked(SAMPLES / file)
    assert found == []


@pytest.mark.parametrize("cap", CASCADES, ids=lambda c: c["file"])
def test_scan_json_carries_the_incident(cap, capsys):
    main(["scan", "--format", "json", str(SAMPLES / cap["file"]), str(SAMPLES / cap["twin"]), "--separate"])
    doc = json.loads(capsys.readouterr().out)
    by_id = {f["finding_id"]: f for f in doc["findings"]}
    on_cascade = [i for i in doc["incidents"] if i["capture"].endswith(cap["file"])]
    assert len(on_cascade) == 1 and not [i for i in doc["incidents"] if i["capture"].endswith(cap["twin"])]
    (inc,) = on_cascade
    trigger = by_id[inc["trigger"]]
    assert f"{trigger['detector']}/{trigger['kind']}" == cap["cascade"]["cause"]
    assert trigger["server"] == cap["cascade"]["cause_server"]
    assert all(by_id[f]["incident"] == inc["incident_id"] for f in inc["findings"])
    assert all(f["incident"] is None for f in doc["findings"] if f["finding_id"] not in inc["findings"])
