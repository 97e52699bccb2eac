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


def test_callback_server_answers_a_recall_on_loopback():
    """samples/realkit/nfs_callback.py, the recall scenario's client side: a CB_COMPOUND(CB_RECALL) over
    record-marked TCP (RFC 5531 §11) is answered NFS4_OK for the operation, and the recall handler runs."""
    import socket
    import struct
    import threading

    import rpc_builders as b
    from samples.realkit.nfs_callback import CB_PROGRAM, CallbackServer
    from samples.realkit.nfs_client import recv_record

    called = threading.Event()
    srv = CallbackServer("127.0.0.1", on_recall=lambda ev: called.set())
    sid, fh = b.stateid(1, b"deleg-state1"), b"file-handle-00003"
    msg = b.call(0x1234, CB_PROGRAM, 1, 1, b.cb_compound("t", 0, 1, [b.cb_op_recall(sid, fh)]))
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(b.record(msg, cuts=(10,)))   # two fragments: the server must join them
            reply = recv_record(s)
        assert called.wait(5)
    finally:
        srv.close()
    xid, mtype, reply_stat, _flavor, _len, accept_stat, status = struct.unpack_from(">7I", reply)
    assert (xid, mtype, reply_stat, accept_stat, status) == (0x1234, 1, 0, 0, 0)
    tag_len = struct.unpack_from(">I", reply, 28)[0]
    assert reply[32:32 + tag_len] == b"t"
    n_ops, op, op_status = struct.unpack_from(">3I", reply, 32 + 4)
    assert (n_ops, op, op_status) == (1, 4, 0)
    ev = srv.recalls()[0]
    assert ev.recall_stateid == sid and ev.recall_fh == fh and ev.procedure == "CB_COMPOUND"
