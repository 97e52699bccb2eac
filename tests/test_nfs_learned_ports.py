"""RPC on ports learned at run time (analyzer.decoders.nfs.learned_rpc_sets): the NFSv4.0 callback channel
(RFC 7530 §3.3.5: the server connects to the client's callback port) is decoded between hosts already
seen speaking NFS on 2049; other bytes on such a connection, and RPC between hosts that never spoke
NFS on a declared port, are not."""
from __future__ import annotations

import struct

import polars as pl

import rpc_builders as b
from builders import merged_pcaps
from rpc_builders import CLIENT, SERVER, call, record, reply, tcp_capture, udp_capture

FH_FILE = b"file-handle-00003"
DELEG_SID = b.stateid(1, b"deleg-state1")
OPEN_SID = b.stateid(1, b"open-state12")
CB_PROG = 0x40000000
CB_PORT = 40123


def shifted(data: bytes, by_ns: int) -> bytes:
    """The records of a ns pcap moved later by BY_NS."""
    out, pos = bytearray(data[:24]), 24
    while pos + 16 <= len(data):
        sec, frac, incl, orig = struct.unpack("<IIII", data[pos:pos + 16])
        t = sec * 10**9 + frac + by_ns
        out += struct.pack("<IIII", t // 10**9, t % 10**9, incl, orig) + data[pos + 16:pos + 16 + incl]
        pos += 16 + incl
    return bytes(out)


def fore_channel() -> bytes:
    """The client opens a file on the server (NFSv4.0 COMPOUND on 2049) and gets a read delegation."""
    return tcp_capture([
        (True, record(call(10, 100003, 4, 1, b.compound("open", 0, [
            b.op_putfh(FH_FILE), b.op_open("model.bin", access=1)])))),
        (False, record(reply(10, b.compound_res(0, "open", [
            b.res_plain(22), b.res_open(OPEN_SID, deleg=1, deleg_sid=DELEG_SID)])))),
    ])


def callback(server=SERVER[0], client=CLIENT[0], port=CB_PORT, payload=None) -> bytes:
    """The server connects to the client's callback port and sends CB_COMPOUND(CB_RECALL); the client
    answers. PAYLOAD replaces the RPC bytes (a connection carrying something else)."""
    msgs = [(True, record(call(77, CB_PROG, 1, 1, b.cb_compound("", 0, 1, [b.cb_op_recall(DELEG_SID, FH_FILE)])))),
            (False, record(reply(77, b.compound_res(0, "", [b.res_plain(4)]))))]
    if payload is not None:
        msgs = [(True, payload), (False, payload)]
    return shifted(tcp_capture(msgs, client=(server, 33001), server=(client, port)), 5_000_000)


def test_callback_channel_on_a_learned_port(read_capture):
    cap = read_capture(merged_pcaps(fore_channel(), callback()))
    m = cap.frame("nfs_messages")
    cb = m.filter(pl.col("xid") == 77)
    assert cb["operation"].to_list() == ["CB_RECALL", "CB_RECALL"]
    assert cb["is_callback"].all()
    # the server's CB_COMPOUND is the call: the server is the client of the callback exchange
    assert cb.filter(pl.col("msg_type") == "CALL")["src"].cast(pl.String).to_list() == [SERVER[0]]
    assert cb.filter(pl.col("msg_type") == "CALL")["dport"].to_list() == [CB_PORT]
    assert cb["stateid"][0] == b"deleg-state1".hex()
    tx = cap.frame("nfs_transactions").filter(pl.col("operation") == "CB_RECALL").row(0, named=True)
    assert (tx["client"], tx["server"], tx["answered"]) == (SERVER[0], CLIENT[0], True)


def test_other_bytes_between_the_same_hosts_are_not_rpc(read_capture):
    cap = read_capture(merged_pcaps(fore_channel(), callback(payload=b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n" * 2)))
    m = cap.frame("nfs_messages")
    assert m.filter(pl.col("dport") == CB_PORT).height == 0
    assert m.filter(pl.col("sport") == CB_PORT).height == 0
    assert set(m["xid"].to_list()) == {10}


def test_rpc_between_hosts_that_never_spoke_nfs_is_left_alone(read_capture):
    cap = read_capture(merged_pcaps(fore_channel(), callback(server="10.9.9.9", client="10.9.9.8")))
    m = cap.frame("nfs_messages")
    assert set(m["xid"].to_list()) == {10}


def test_a_capture_of_the_fore_channel_only_is_unchanged(read_capture):
    m = read_capture(fore_channel()).frame("nfs_messages")
    assert m["xid"].to_list() == [10, 10, 10, 10]


def _nlm_lock_args(fh: bytes, owner: bytes) -> bytes:
    """nlm4_lockargs (NLM v4): cookie, block false, exclusive, the lock, reclaim false, state 3."""
    lock = b.opaque("client1") + b.opaque(fh) + b.opaque(owner) + b.u32(1) + b.u64(0) + b.u64(100)
    return b.opaque(b"\x01\x02") + b.u32(0) + b.u32(1) + lock + b.u32(0) + b.u32(3)


def test_nlm_over_udp_on_a_portmapper_port(read_capture):
    """NFSv3 over UDP 2049, then NLM on the port lockd registered (not one we declare): decoded."""
    nfs = udp_capture([(True, call(5, 100003, 3, 0)), (False, reply(5))], server=("10.0.0.2", 2049))
    nlm = shifted(udp_capture([(True, call(6, 100021, 4, 2, _nlm_lock_args(FH_FILE, b"owner-a"))),
                               (False, reply(6, b.opaque(b"\x01\x02") + b.u32(1)))],
                              client=("10.0.0.1", 872), server=("10.0.0.2", 40777)), 5_000_000)
    stray = shifted(udp_capture([(True, b"\x00" * 40), (False, b"\x00" * 40)],
                                client=("10.0.0.1", 873), server=("10.0.0.2", 40778)), 9_000_000)
    m = read_capture(merged_pcaps(nfs, nlm, stray)).frame("nfs_messages")
    assert m.filter(pl.col("xid") == 6)["operation"].to_list() == ["NLM LOCK", "NLM LOCK"]
    assert m.filter(pl.col("xid") == 6)["status"].to_list()[1] == "NLM4_DENIED"
    assert 40778 not in m["dport"].to_list() + m["sport"].to_list()
    tx = read_capture(merged_pcaps(nfs, nlm), name="t2.pcap").frame("nfs_transactions")
    # the flows are numbered over one UDP pass: the NFS NULL and the NLM LOCK are two transactions
    assert sorted(tx["operation"].to_list()) == ["NLM LOCK", "NULL"]
