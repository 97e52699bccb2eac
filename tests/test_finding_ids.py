"""Finding ids are stable: the same capture and parameters give the same ids, in the same order, about
the same resources, in every process.

Ties that were broken by hash order (Polars ``mode()``, ``unique()`` and ``group_by`` output order,
sorts with equal keys feeding ``first()``/``shift``/numbering) all change with the process (Polars
seeds its hash tables per process) and with the thread count. So the scan runs in several
subprocesses with different PYTHONHASHSEED and POLARS_MAX_THREADS over every sample of
samples/MANIFEST.toml and generated captures (a samples/synth.py capture, a population
scenario of samples/synth_scenarios.py, small RoCEv2 pathologies of samples/rocev2_synth.py), and
every finding (population members included) must come out identical.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "samples"
# the columns compared (all of a finding but its parameters, which are the same by construction)
COMPARED = ("finding_id", "detector", "kind", "severity", "start_ns", "end_ns", "client", "server", "resource",
            "clients", "client_identity", "metric", "value", "threshold", "unit", "evidence_frames",
            "evidence_total", "explanation", "members", "member_ids", "member_of")
RUNS = ((0, 1), (1, 2), (2, 2), (3, 1))  # (PYTHONHASHSEED, POLARS_MAX_THREADS)
ROCEV2 = ("rocev2-pfc-storm", "rocev2-gbn-storm", "rocev2-rnr-loop", "rocev2-incast", "rocev2-cnp-ignored")
ROCEV2_SCALE = 0.02  # small (each is scanned in every run); every one still has its labelled pathology

CHILD = r"""
import json, sys
import detectors
from analyzer import open_capture
only = sys.argv[2].split(",") if sys.argv[2] else None
for path in sys.argv[3:]:
    with open_capture(path) as cap:
        f = detectors.expanded(detectors.run(cap, only=only))
    cols = json.loads(sys.argv[1])
    print(json.dumps({"file": path, "findings": f.select(cols).to_dicts()}, default=str), flush=True)
"""


@pytest.fixture(scope="module")
def capture_paths(tmp_path_factory) -> list[str]:
    sys.path.insert(0, str(SAMPLES))
    import rocev2_captures as rc
    import synth
    import synth_scenarios as ss

    d = tmp_path_factory.mktemp("ids")
    paths = [str(SAMPLES / c["file"]) for c in tomllib.loads((SAMPLES / "MANIFEST.toml").read_text())["capture"]]
    synth.generate(str(d / "synth.pcap"), packets=30_000, seed=5)
    sc = ss.Scenario("ids-syn-loss", "ids", "tcp_loss", "servers", 4.0,
                     {"servers": 4, "rtt_ms": 0.4, "loss": "syn", "share": 0.1, "connections": 300})
    ss.write(sc, str(d))
    return paths + [str(d / "synth.pcap"), str(d / "ids-syn-loss.pcap"),
                    dns_herd_mixed_case(str(d / "dns-herd-0x20.pcap"))] + [
        str(rc.rocev2_capture(name, ROCEV2_SCALE)) for name in ROCEV2]


def dns_herd_mixed_case(path: str, n: int = 60) -> str:
    """A DNS TTL herd of ``n`` hosts asking one name in two spellings (DNS 0x20 case randomisation,
    as unbound does), half each: the herd's resource is a tie between them."""
    import scenarios_one_node as sc
    import synth

    g = sc._gen(7)
    spellings = ("API.corp.example.com", "api.CORP.example.com")
    for name in spellings:
        g.zone[name] = synth.Zone(name, ["10.0.2.50"], [], 60)
    hosts = [sc._host(f"10.7.{k // 200}.{10 + k % 200}") for k in range(n)]
    expiry = 2 * synth.SEC + 60 * synth.SEC
    for k, h in enumerate(hosts):
        t = 2 * synth.SEC + k * (30 * synth.SEC // n)
        sc._dns(g, t, h, h.ephemeral(), spellings[k % 2], 200 * synth.US, max(1, (expiry - t) // synth.SEC))
    for k, h in enumerate(hosts):
        sc._dns(g, expiry + k * 300 * synth.US, h, h.ephemeral(), spellings[k % 2], 300 * synth.US, 60)
    sc._background_dns(g, expiry + 3 * synth.SEC)
    synth.write_capture(g, path, "pcap", nanosecond=True)
    return path


def _scan(paths: list[str], seed: int, threads: int) -> dict[str, list[dict]]:
    return _scan_only(paths, seed, threads, "")


def _scan_only(paths: list[str], seed: int, threads: int, only: str) -> dict[str, list[dict]]:
    """Every file's findings (expanded: populations, then their members) from a fresh process."""
    env = dict(os.environ, PYTHONHASHSEED=str(seed), POLARS_MAX_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(list(COMPARED)), only, *paths],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    return {d["file"]: d["findings"] for d in map(json.loads, out.stdout.splitlines())}


def _first_difference(a: list[dict], b: list[dict]) -> str:
    if len(a) != len(b):
        return f"{len(a)} findings vs {len(b)}"
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"finding {k}: " + "; ".join(f"{c}: {x[c]!r} vs {y[c]!r}" for c in COMPARED if x[c] != y[c])
    return ""


def test_ids_order_and_resources_are_the_same_in_every_process(capture_paths):
    runs = [_scan(capture_paths, seed, threads) for seed, threads in RUNS]
    assert set(runs[0]) == set(capture_paths)
    total = sum(len(v) for v in runs[0].values())
    assert total >= 20  # the samples do find things: an empty comparison proves nothing
    bad = []
    for path in capture_paths:
        for (seed, threads), other in zip(RUNS[1:], runs[1:]):
            diff = _first_difference(runs[0][path], other[path])
            if diff:
                bad.append(f"{Path(path).name} (PYTHONHASHSEED={seed}, {threads} threads): {diff}")
                break
    assert not bad, "\n".join(bad)
    for path, found in runs[0].items():
        ids = [f["finding_id"] for f in found]
        assert len(ids) == len(set(ids)), f"{Path(path).name}: duplicate finding ids"
        assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    assert any(f["members"] for v in runs[0].values() for f in v)  # populations are compared too


def test_findings_sharing_id_parts_get_distinct_ids_whatever_their_order():
    import polars as pl

    from detectors.base import findings
    from detectors.conn_churn import Params

    rows = pl.DataFrame({
        "kind": ["churn"] * 3, "severity": ["low"] * 3, "start_ns": [5, 5, 5], "end_ns": [9, 8, 9],
        "client": ["a"] * 3, "server": ["s"] * 3, "resource": ["r"] * 3, "metric": ["m"] * 3,
        "value": [1.0, 1.0, 2.0], "threshold": [1.0] * 3, "unit": ["x"] * 3,
        "evidence_frames": [[1], [2], [3]], "explanation": ["e1", "e2", "e3"]})
    a = findings(rows, detector="conn_churn", params=Params())
    b = findings(rows.reverse(), detector="conn_churn", params=Params())
    assert a["finding_id"].n_unique() == 3
    pair = dict(zip(a["explanation"], a["finding_id"]))
    assert pair == dict(zip(b["explanation"], b["finding_id"]))


def test_a_herd_asked_in_two_spellings_gets_one_id_and_resource(tmp_path):
    """The issue's symptom: six runs flipped between two ids and two resources (the herd's resource
    was ``mode().first()`` of a tie). Six processes, one small capture, the herd detector only."""
    sys.path.insert(0, str(SAMPLES))
    path = dns_herd_mixed_case(str(tmp_path / "dns-herd-0x20.pcap"))
    seen = set()
    for seed in range(6):
        out = _scan_only([path], seed, 1 + seed % 2, "herd")[path]
        assert len(out) == 1 and out[0]["clients"] == 60
        seen.add((out[0]["finding_id"], out[0]["resource"]))
    assert seen == {(next(iter(seen))[0], "API.corp.example.com")}  # the smallest spelling, every time
