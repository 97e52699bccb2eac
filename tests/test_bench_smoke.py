"""tests/benchmarks/bench.py runs end to end on a tiny capture (the real run is ``make bench``)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "benchmarks" / "bench.py"


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    # --fixed-runs 0: the fixed-cost section (10 more herdscope processes) would not fit the timeout;
    # --skip-workers: the Dask stages have their own test below
    r = subprocess.run([sys.executable, str(BENCH), "--packets", "2000", "--skip-tshark", "--fixed-runs", "0",
                        "--skip-workers", "--cache-dir", str(tmp_path / "cache"), "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(l.startswith("stage") and "packets/s" in l for l in lines)
    for name in ("cat", "herdscope ingest", "herdscope export", "dpkt loop", "tshark fields",
                 "scan, 8 partitions in process"):
        assert any(l.startswith(name) for l in lines), name
    doc = json.loads(out.read_text())
    stages = {s["name"]: s for s in doc["stages"]}
    assert doc["packets"] == 2000 and stages["cat"]["status"] == "ok"
    assert stages["dpkt loop"]["status"] == "ok" and stages["dpkt loop"]["packets"] == 2000
    assert stages["tshark fields"]["status"] == "skipped"
    assert stages["herdscope ingest"]["status"] in ("ok", "unavailable")
    assert stages["scan, 8 partitions in process"]["status"] in ("ok", "unavailable")  # failed: the reports differ
    for command in ("info", "stats"):  # failed: the output in partitions differs
        assert stages[f"{command}, partitions compared"]["status"] in ("ok", "unavailable"), stages[command]
    assert doc["fixed_cost"] == [] and not any(l.startswith("fixed cost of a process") for l in lines)
    # the cached capture is reused on a second run
    again = subprocess.run([sys.executable, str(BENCH), "--packets", "2000", "--skip-tshark", "--only", "cat",
                            "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "cached" in again.stdout


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="Dask: herdscope[distributed]")
def test_bench_worker_stages(tmp_path):
    out = tmp_path / "bench.json"
    only = ["--only", "scan, 8 pieces, 1 worker", "--only", "scan, 8 pieces, 2 workers"]
    r = subprocess.run([sys.executable, str(BENCH), "--packets", "2000", "--fixed-runs", "0", *only,
                        "--cache-dir", str(tmp_path / "cache"), "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    stages = {s["name"]: s for s in json.loads(out.read_text())["stages"]}
    two = stages["scan, 8 pieces, 2 workers"]
    assert stages["scan, 8 pieces, 1 worker"]["status"] == "ok" and two["status"] == "ok"
    assert "findings identical to 1 worker" in two["note"] and "parallel efficiency" in two["note"]


def test_captures_beyond_synths_reach_are_its_captures_one_after_the_other(tmp_path, monkeypatch):
    """The 100M-packet capture is ten 10M ones (synth.py holds its frames in memory) of successive seeds:
    here three of 2,000 packets. Each part's records are that seed's capture's bytes but for the times,
    shifted to start REPEAT_GAP_US after the previous part's last packet; the labels move alike; only
    the first seed's capture stays cached."""
    import numpy as np

    from analyzer import open_capture
    monkeypatch.syspath_prepend(str(BENCH.parent))
    bench = importlib.import_module("bench")
    monkeypatch.setattr(bench, "SYNTH_LARGEST_PACKETS", 2000)
    path, _ = bench.ensure_capture(tmp_path / "cache", 6000, 1, "pcap", False)
    assert sorted(p.name.split("-")[2] for p in (tmp_path / "cache").glob("synth-2000-*.pcap")) == ["s1"]
    joined = open_capture(str(path)).packets
    assert joined.height == 6000
    body = path.read_bytes()[24:]
    labels = json.loads(Path(str(path) + ".labels.json").read_text())
    at, next_first = 0, None
    for k, seed in enumerate((1, 2, 3)):
        part, _ = bench.ensure_capture(tmp_path / "parts", 2000, seed, "pcap", False)
        one = open_capture(str(part)).packets["ts_ns"].to_numpy()
        shift = 0 if next_first is None else next_first - one[0]
        ts = joined["ts_ns"].to_numpy()[2000 * k:2000 * (k + 1)]
        np.testing.assert_array_equal(ts, one + shift)
        next_first = ts[-1] + bench.REPEAT_GAP_US * 1000
        own = part.read_bytes()[24:]
        mine = np.frombuffer(body[at:at + len(own)], np.uint8).copy()
        theirs = np.frombuffer(own, np.uint8).copy()
        off = 0
        while off < len(own):                                  # every byte but each record's ts_sec, ts_usec
            mine[off:off + 8] = theirs[off:off + 8] = 0
            off += 16 + int.from_bytes(own[off + 8:off + 12], "little")
        np.testing.assert_array_equal(mine, theirs)
        at += len(own)
        part_labels = json.loads(Path(str(part) + ".labels.json").read_text())
        moved = [l for l in labels if l["start_ns"] == part_labels[0]["start_ns"] + shift]
        assert moved and moved[0]["detector"] == part_labels[0]["detector"]
    assert at == len(body) and (np.diff(joined["ts_ns"].to_numpy()) >= 0).all()
    assert len(labels) == 3 * len(part_labels)
    with pytest.raises(SystemExit, match="multiple"):
        bench.ensure_capture(tmp_path, 5000, 1, "pcap", False)


def test_server_tasks_bench_measures_each_cut_servers_detectors(tmp_path):
    """tests/benchmarks/server_tasks.py: a sample whose server is cut at 3 partitions; its task's detectors
    run on its frames repeated twice, each with its peak anonymous memory, herd's finding twice as many
    herds as on the frames once."""
    bench = ROOT / "tests" / "benchmarks" / "server_tasks.py"
    sample = ROOT / "samples" / "krb5-as-tgs-herd.pcapng"
    rows = {}
    for times in (1, 2):
        out = tmp_path / f"tasks-{times}.json"
        r = subprocess.run([sys.executable, str(bench), str(sample), "--partitions", "3", "--times", str(times),
                            "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0, r.stdout + r.stderr
        rows[times] = json.loads(out.read_text())
    assert {r["detector"] for r in rows[2]} >= {"herd", "retry_storm", "toctou"}
    assert all(r["peak_mb"] >= r["start_mb"] > 0 and r["seconds"] >= 0 for r in rows[2])
    assert len(rows[1]) == len(rows[2])
    herds = [next(r["found"] for r in rows[t] if r["detector"] == "herd") for t in (1, 2)]
    assert herds[1] == 2 * herds[0] > 0  # each copy's herd, a second apart
