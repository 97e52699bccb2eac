"""tests/benchmarks/bench.py runs end to end on a tiny capture (the real run is ``make bench``)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "benchmarks" / "bench.py"


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    # --fixed-runs 0: the fixed-cost section (10 more herdscope processes) would not fit the timeout
    r = subprocess.run([sys.executable, str(BENCH), "--packets", "2000", "--skip-tshark", "--fixed-runs", "0",
                        "--cache-dir", str(tmp_path / "cache"), "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(l.startswith("stage") and "packets/s" in l for l in lines)
    for name in ("cat", "herdscope ingest", "herdscope export", "dpkt loop", "tshark fields"):
        assert any(l.startswith(name) for l in lines), name
    doc = json.loads(out.read_text())
    stages = {s["name"]: s for s in doc["stages"]}
    assert doc["packets"] == 2000 and stages["cat"]["status"] == "ok"
    assert stages["dpkt loop"]["status"] == "ok" and stages["dpkt loop"]["packets"] == 2000
    assert stages["tshark fields"]["status"] == "skipped"
    assert stages["herdscope ingest"]["status"] in ("ok", "unavailable")
    assert doc["fixed_cost"] == [] and not any(l.startswith("fixed cost of a process") for l in lines)
    # the cached capture is reused on a second run
    again = subprocess.run([sys.executable, str(BENCH), "--packets", "2000", "--skip-tshark", "--only", "cat",
                            "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "cached" in again.stdout
