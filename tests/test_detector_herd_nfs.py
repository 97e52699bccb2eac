"""herd on NFS: one key per path whatever the operation, the parent directory as a second key (a
checkpoint restart's ranks opening their own shards), one finding per herd, and the recorded
checkpoint restart (samples/nfs4-open-herd*.pcap, samples/realkit/scen_nfs.py
build_herd) against its ground truth."""
import random
import tomllib
from pathlib import Path

import polars as pl
import pytest

from detectors import herd, herd_files
from fakes import FakeCapture, transaction_frame as tx

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S
SERVER = "10.0.0.49"
CKPT = "/export/ckpt/step1000"
LOW = herd.Params(min_clients=10, medium_clients=15, high_impact=100, critical_impact=1000)

SAMPLES = Path(__file__).parent.parent / "samples"
# the recorded restart's ground truth: samples/MANIFEST.toml's entry (what the clients logged)
GROUNDTRUTH = {e["file"]: {**e, **e.get("measured", {})}
               for e in tomllib.loads((SAMPLES / "MANIFEST.toml").read_text())["capture"]}


def nfs_row(t, client, op, path, *, frame=None, lat=200_000):
    """One nfs_transactions row: ``path`` resolved, ``name`` its last component for name operations."""
    name = path.rsplit("/", 1)[1] if op in ("LOOKUP", "OPEN") and path else None
    return {"t": t, "client": client, "op": op, "name": path, "server": SERVER, "server_port": 2049,
            "transport": "tcp", "status": "NFS4_OK", "lat": lat, "path": path, "component": name,
            **({"frame": frame} if frame else {})}


def nfs(rows):
    f = tx(rows, "nfs", path=None, component=None)
    # the nfs_transactions columns herd keys on: the resolved path and the name of a name operation
    return f.rename({"component": "name"})


def quiet_before_after(n=20):
    """Requests for something else, before and after: the capture shows the key's normal rate."""
    return [nfs_row(T0 + k * S, f"10.9.0.{k % 3}", "GETATTR", "/export/other") for k in range(n)]


def restart(n, t, *, own_shards=True, shared=None, lookup_dir=True, gap_ns=MS):
    """N ranks at T (GAP_NS apart): LOOKUP the checkpoint directory, then OPEN/READ/CLOSE the shared
    file and/or their own shard, each a few ms after the last."""
    rows = []
    for i in range(n):
        c, t_i = f"10.1.0.{i + 1}", t + i * gap_ns
        steps = [("LOOKUP", CKPT)] if lookup_dir else []
        for f in ([f"{CKPT}/{shared}"] if shared else []) + ([f"{CKPT}/__{i}_0.distcp"] if own_shards else []):
            steps += [("OPEN", f), ("READ", f), ("CLOSE", f)]
        rows += [nfs_row(t_i + k * 2 * MS, c, op, p) for k, (op, p) in enumerate(steps)]
    return rows


def detect(rows, params=LOW):
    return herd.detect(FakeCapture(nfs_transactions=nfs(rows)), params)


def test_ranks_opening_their_own_shards_are_one_herd_on_the_directory():
    rows = restart(30, T0 + 10 * S, shared=".metadata") + quiet_before_after(30)
    f = detect(rows)
    assert f.height == 1, f.select("resource", "clients", "explanation").to_dicts()
    r = f.row(0, named=True)
    assert r["kind"] == "nfs" and r["server"] == SERVER and r["resource"] == CKPT and r["clients"] == 30
    assert r["start_ns"] == T0 + 10 * S and r["end_ns"] == T0 + 10 * S + 29 * MS
    # the explanation names the directory, how many names in it, the shared file, the operations
    e = r["explanation"]
    assert f"31 different names in the directory {CKPT} ({CKPT}/.metadata by all of them)" in e
    assert "30 clients sent NFS requests (" in e and "lookup" in e and "open" in e
    # evidence: the arrivals and their repeats (every rank's LOOKUP, OPENs, READs, CLOSEs)
    assert r["evidence_total"] == 30 * 7


def test_own_shards_without_a_lookup_of_the_directory():
    f = detect(restart(30, T0 + 10 * S, lookup_dir=False) + quiet_before_after(30))
    assert f["resource"].to_list() == [CKPT] and f["clients"].to_list() == [30]
    assert "30 different names in the directory" in f["explanation"][0]


def test_everyone_opening_one_file_is_a_herd_on_the_file_not_its_directory():
    f = detect(restart(30, T0 + 10 * S, own_shards=False, shared="model.pt") + quiet_before_after(30))
    assert f["resource"].to_list() == [f"{CKPT}/model.pt"] and f["clients"].to_list() == [30]


def test_lookup_then_open_of_one_path_is_one_arrival():
    # each client LOOKUPs the file, then OPENs it 5 ms later: one arrival, one herd of 12 clients
    rows = []
    for i in range(12):
        t = T0 + 10 * S + i * MS
        rows += [nfs_row(t, f"10.1.0.{i}", "LOOKUP", f"{CKPT}/model.pt"),
                 nfs_row(t + 5 * MS, f"10.1.0.{i}", "OPEN", f"{CKPT}/model.pt")]
    f = detect(rows + quiet_before_after(30))
    assert f.height == 1 and f["clients"][0] == 12
    # 12 arrivals in 11 ms, not 24: the rate says so
    assert "1,091/s" in f["explanation"][0]


def test_a_directory_many_clients_use_at_a_steady_rate_is_no_herd():
    # 60 clients each open a different file in the directory about every 2 s (independent, jittered)
    # for 30 s: some 30 clients a second, far above min_clients, but that is the directory's normal rate
    rng = random.Random(15)
    rows = [nfs_row(T0 + k * 2 * S + int(rng.uniform(0, 2) * S), f"10.1.0.{i}", "OPEN", f"{CKPT}/file{i}")
            for k in range(15) for i in range(60)]
    assert detect(rows).height == 0
    # the edge: without the baseline rule (rate_factor 1) the same arrivals are herds
    assert detect(rows, herd.Params(min_clients=10, rate_factor=1.0, baseline_min_bins=1000)).height > 0


def test_setup_operations_keep_their_own_key():
    # SETCLIENTID at mount has no path: its herd is its own, not a file's
    rows = [nfs_row(T0 + 10 * S + i * MS, f"10.1.0.{i}", "SETCLIENTID", None) for i in range(12)]
    f = detect(rows + quiet_before_after(30))
    assert f.height == 1 and f["resource"][0] is None


def test_odd_rows_do_not_crash():
    rows = restart(12, T0 + 10 * S) + [nfs_row(T0 + 11 * S, "10.1.0.99", "READ", "fh:0badf00d"),
                                       nfs_row(T0 + 11 * S, "10.1.0.98", "LOOKUP", "/")]
    assert detect(rows + quiet_before_after(30)).height == 1
    parents = pl.DataFrame({"p": ["/a/b/c", "/a", "/", "fh:ab/x", "fh:ab", None]}).select(
        herd_files.parent_directory(pl.col("p")).alias("up"))["up"].to_list()
    assert parents == ["/a/b", "/", None, "fh:ab", None, None]


# -- the recorded checkpoint restart -------------------------------------------------------------

@pytest.fixture(scope="module")
def recorded():
    from analyzer import open_capture
    return {n: herd.detect(open_capture(SAMPLES / n)) for n in ("nfs4-open-herd.pcap", "nfs4-open-herd-healthy.pcap")}


def test_recorded_restart_is_one_herd_on_the_checkpoint_directory(recorded):
    from analyzer import open_capture
    gt = GROUNDTRUTH["nfs4-open-herd.pcap"]
    f = recorded["nfs4-open-herd.pcap"]
    loud = f.filter(pl.col("severity").cast(pl.String).is_in(["medium", "high", "critical"]))
    assert loud.height == f.height == 1, f.select("resource", "clients", "explanation").to_dicts()
    r = f.row(0, named=True)
    assert r["server"] == "10.77.0.49" and r["resource"] == gt["path"] and r["kind"] == "nfs"
    assert abs(r["clients"] - gt["clients"]) <= 2
    first_ns = int(open_capture(SAMPLES / "nfs4-open-herd.pcap").packets["ts_ns"].min())
    assert abs((r["start_ns"] - first_ns) / S - gt["open_burst_start_s"]) < 0.1
    assert (r["end_ns"] - r["start_ns"]) / MS <= gt["open_burst_span_ms"] + 5
    assert f"{gt['opens'] // 2 + 1} different names in the directory {gt['path']}" in r["explanation"]


def test_recorded_healthy_twin_is_silent(recorded):
    assert GROUNDTRUTH["nfs4-open-herd-healthy.pcap"]["healthy"]
    assert recorded["nfs4-open-herd-healthy.pcap"].height == 0


def test_empty_or_pathless_nfs_frames_give_nothing():
    empty = nfs(restart(2, T0)).clear()
    assert herd.detect(FakeCapture(nfs_transactions=empty), LOW).height == 0
    # no resources at all (handles never resolved, nothing named): keyed by operation as before
    rows = [dict(nfs_row(T0 + 10 * S + i * MS, f"10.1.0.{i}", "READ", None)) for i in range(12)]
    f = detect(rows + quiet_before_after(30))
    assert f.height == 1 and f["resource"][0] is None and "sent READ for" in f["explanation"][0]
