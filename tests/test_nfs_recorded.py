"""The recorded NFS captures (tests/data/nfs/recorded, made by samples/realkit/scen_nfs.py) agree
with their ground truth: what the clients logged against what tshark counted at recording time,
and the files are the small pcaps the manifest says.  Plus the XDR packer of our client."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from samples.realkit.core import first_packet_time
from samples.realkit.nfs_client import Packer, Unpacker

RECORDED = Path(__file__).parent / "data" / "nfs" / "recorded"
MAX_CAPTURE_BYTES = 1_100_000
GROUNDTRUTH = {e["file"]: e for e in tomllib.loads((RECORDED / "GROUNDTRUTH.toml").read_text())["capture"]}


@pytest.mark.parametrize("name", sorted(GROUNDTRUTH))
def test_capture_matches_groundtruth(name):
    e = GROUNDTRUTH[name]
    path = RECORDED / e["file"]
    assert path.stat().st_size <= MAX_CAPTURE_BYTES
    assert first_packet_time(path) > 0
    t = e["tshark"]
    assert t["malformed"] == 0
    assert t["nfs_calls"] == t["nfs_replies"]
    assert e["capture_dropped"] == 0
    if e["scenario"] == "nfs4-lock-polling":
        assert t["lock_denied_replies"] == e["lock_denials"]
        assert (e["lock_denials"] == 0) == e["healthy"]
        assert e["locks_granted"] == e["clients"]
        assert sum(e["attempt_denied"]) == e["lock_denials"] == len(e["attempt_s"]) - e["clients"]
    if e["scenario"] == "nfs3-udp-retrans":
        assert t["duplicate_calls"] == e["retransmissions"]
        assert (e["retransmissions"] == 0) == e["healthy"]
    if e["scenario"] == "nfs4-open-herd":
        ops = dict(kv.split(":") for kv in t["v4_opcodes_in_packets"].split())
        assert int(ops["18"]) == 2 * e["opens"]          # OPEN in each call and its reply
        assert (e["open_burst_span_ms"] < 100) != e["healthy"]


def test_xdr_opaque_padding_round_trip():
    data = Packer().u32(7).opaque(b"abcde").string("x").u64(2**40 + 3).bytes()
    assert len(data) == 4 + 4 + 8 + 4 + 4 + 8
    u = Unpacker(data)
    assert (u.u32(), u.opaque(), u.opaque(), u.u64()) == (7, b"abcde", b"x", 2**40 + 3)
