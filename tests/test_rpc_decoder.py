"""ONC-RPC layer of the nfs decoder (RFC 5531): header fields, AUTH_SYS, accepted/denied replies,
call/reply pairing by xid and flow, retransmissions, record marking over TCP, hostile input."""
from __future__ import annotations

import random

import polars as pl
import pytest

from analyzer.decoders import nfs
from fuzzing import mutate
from rpc_builders import (AUTH_NONE, CLIENT, SERVER, auth_sys, call, denied, record, reply, tcp_capture,
                          udp_capture, u32)

S = 1_000_000_000


def frames(read_capture, data):
    cap = read_capture(data)
    return cap.frame("nfs_messages"), cap.frame("nfs_transactions")


def test_call_header_and_auth_sys_fields(read_capture):
    m, tx = frames(read_capture, udp_capture([
        (True, call(0xDEADBEEF, 100003, 3, 1, u32(4) + b"\1\2\3\4", cred=auth_sys("node-17", 4242, 77))),
        (False, reply(0xDEADBEEF, u32(0)))]))
    c, r = m.row(0, named=True), m.row(1, named=True)
    assert (c["xid"], c["msg_type"], c["rpcvers"], c["program"], c["version"], c["procedure"]) == \
        (0xDEADBEEF, "CALL", 2, 100003, 3, 1)
    assert (c["auth_flavor"], c["auth_uid"], c["auth_gid"], c["machine"]) == (1, 4242, 77, "node-17")
    assert c["operation"] == "GETATTR" and c["from_client"] and not r["from_client"]
    assert (r["msg_type"], r["reply_stat"], r["accept_stat"], r["status"]) == ("REPLY", 0, 0, "NFS3_OK")
    assert r["call_frame"] == c["frame_last"] and r["program"] == 100003 and r["procedure"] == 1
    t = tx.row(0, named=True)
    assert (t["protocol"], t["client"], t["client_port"], t["server"], t["server_port"]) == \
        ("nfs", CLIENT[0], CLIENT[1], SERVER[0], SERVER[1])
    assert t["answered"] and not t["is_error"] and t["latency_ns"] == 1_000_000 and t["retransmissions"] == 0


@pytest.mark.parametrize("answer, status", [
    (lambda x: denied(x, 1, 5), "AUTH_ERROR"),
    (lambda x: denied(x, 0), "RPC_MISMATCH"),
    (lambda x: reply(x, accept_stat=1), "PROG_UNAVAIL"),
    (lambda x: reply(x, u32(0) + u32(9), accept_stat=2), "PROG_MISMATCH"),
])
def test_rejected_and_unaccepted_replies_are_errors(read_capture, answer, status):
    m, tx = frames(read_capture, udp_capture([(True, call(5, 100003, 3, 1, u32(0))), (False, answer(5))]))
    assert m["status"][1] == status
    assert tx["status"].to_list() == [status] and tx["is_error"].to_list() == [True]


def test_replies_pair_by_xid_not_by_order(read_capture):
    m, tx = frames(read_capture, udp_capture([
        (True, call(1, 100003, 3, 0)), (True, call(2, 100003, 3, 1, u32(0))),
        (False, reply(2, u32(0))), (False, reply(1))]))
    assert m.filter(pl.col("msg_type") == "REPLY")["call_frame"].to_list() == [2, 1]
    assert tx.sort("request_frame")["response_frame"].to_list() == [4, 3]
    assert tx.sort("request_frame")["operation"].to_list() == ["NULL", "GETATTR"]


def test_retransmissions_join_the_first_call(read_capture):
    """Same xid, same call, unanswered: one transaction, latency from the first call (RFC 5531 §9)."""
    args = u32(4) + b"fhfh"
    m, tx = frames(read_capture, udp_capture([
        (True, call(9, 100003, 3, 1, args), 1 * S), (True, call(9, 100003, 3, 1, args), 2 * S),
        (True, call(9, 100003, 3, 1, args), 4 * S), (False, reply(9, u32(0)), 4 * S + 500),
        (True, call(9, 100003, 3, 1, args), 10 * S),  # after the answer: a new call with a reused xid
    ]))
    assert m.height == 5
    t = tx.sort("request_frame")
    assert t.height == 2
    first = t.row(0, named=True)
    assert (first["retransmissions"], first["last_call_frame"], first["response_frame"]) == (2, 3, 4)
    assert first["latency_ns"] == 3 * S + 500 and first["replies"] == 1
    assert t["answered"].to_list() == [True, False] and t["retransmissions"][1] == 0


def test_a_different_call_with_the_same_xid_is_not_a_retransmission(read_capture):
    _, tx = frames(read_capture, udp_capture([(True, call(3, 100003, 3, 1, u32(0))),
                                              (True, call(3, 100003, 3, 4, u32(0) + u32(1)))]))
    assert tx["retransmissions"].to_list() == [0, 0]


def test_pairing_is_per_flow(read_capture):
    """Two clients, same xid: each reply answers its own client's call."""
    other = ("10.0.0.9", 871)
    data = udp_capture([(True, call(7, 100003, 3, 0))])
    from builders import ethernet, ipv4, pcap_file, udp
    recs = [(1, 0, ethernet(ipv4(udp(call(7, 100003, 3, 0), sport=871, dport=2049), proto=17, src=CLIENT[0],
                                 dst=SERVER[0]))),
            (1, 1000, ethernet(ipv4(udp(call(7, 100003, 3, 0), sport=871, dport=2049), proto=17, src=other[0],
                                    dst=SERVER[0]))),
            (1, 2000, ethernet(ipv4(udp(reply(7), sport=2049, dport=871), proto=17, src=SERVER[0], dst=other[0])))]
    del data
    _, tx = frames(read_capture, pcap_file(recs))
    t = tx.sort("request_frame")
    assert t["client"].to_list() == [CLIENT[0], other[0]]
    assert t["response_frame"].to_list() == [None, 3] and t["retransmissions"].to_list() == [0, 0]


def test_tcp_records_with_several_fragments_across_segments(read_capture):
    big = call(11, 100003, 3, 1, u32(32) + bytes(range(32)), cred=auth_sys())
    rec = record(big, cuts=[5, 40, 41])
    m, tx = frames(read_capture, tcp_capture([
        (True, rec, [2, 20, 60]),
        (False, record(reply(11, u32(0))) + record(reply(99, u32(0)))),  # two records in one segment
    ]))
    assert m["xid"].to_list() == [11, 11, 99] and m["transport"].to_list() == ["tcp"] * 3
    assert m["machine"][0] == "client1" and m["decode_error"].null_count() == 3
    assert m["wire_length"][0] == len(big)
    t = tx.row(0, named=True)
    assert tx.height == 1 and t["answered"] and t["status"] == "NFS3_OK" and t["transport"] == "tcp"
    assert m["call_frame"][2] is None  # xid 99 answers no call


def test_server_calls_on_the_clients_connection_are_calls_from_the_server(read_capture):
    """client_side='message': a CALL is the caller's whatever the connection (4.1 callbacks)."""
    cb = call(500, 0x40000000, 1, 0)  # CB_NULL from the server
    m, tx = frames(read_capture, tcp_capture([(True, record(call(1, 100003, 4, 0))), (False, record(reply(1))),
                                              (False, record(cb)), (True, record(reply(500)))]))
    assert m["from_client"].to_list() == [True, False, True, False]
    t = tx.sort("request_frame")
    assert t["operation"].to_list() == ["NULL", "CB_NULL"]
    assert t["client"].to_list() == [CLIENT[0], SERVER[0]] and t["answered"].all()
    assert t["is_callback"].to_list() == [False, True]


@pytest.mark.parametrize("cut", [3, 8, 20, 30, 41])
def test_truncated_headers_give_a_decode_error(read_capture, cut):
    msg = call(1, 100003, 3, 1, u32(0), cred=auth_sys())[:cut]
    m, _ = frames(read_capture, udp_capture([(True, msg)]))
    assert m.height == 1 and m["decode_error"][0] in ("truncated", "bad auth")


def test_garbage_on_the_port_is_not_rpc(read_capture):
    m, tx = frames(read_capture, udp_capture([(True, u32(1) + u32(7) + b"junkjunk"),
                                              (True, call(1, 100003, 3, 0)[:8] + u32(3) + b"\0" * 32)]))
    assert m["decode_error"].to_list() == ["not rpc", "bad rpc version"]
    assert tx.height == 1  # the CALL with rpcvers 3 is still a call


def test_mutated_messages_never_raise(read_capture):
    rnd = random.Random(15)
    base = [call(3, 100003, 3, 3, u32(8) + b"abcdefgh" + u32(4) + b"name", cred=auth_sys()),
            reply(3, u32(0) + u32(8) + b"abcdefgh" + u32(0) + u32(0)),
            call(4, 100003, 4, 1, u32(0) + u32(1) + u32(2) + u32(22) + u32(4) + b"fhfh" + u32(15) + u32(1) + b"a\0\0\0"),
            reply(4, u32(0) + u32(0) + u32(2) + u32(22) + u32(0) + u32(15) + u32(0)),
            denied(5), call(6, 100005, 3, 1, u32(7) + b"/export\0")]
    msgs = []
    for k in range(300):
        b = base[k % len(base)]
        msgs.append((k % 2 == 0, mutate(b, rnd, (0x00, 0xFF, 0x80, 0x01, 0x7F))))
    m, tx = frames(read_capture, udp_capture(msgs, gap_ns=1000))
    assert m.select(pl.col("message").n_unique()).item() == 300
    assert tx.height <= m.height


def test_no_rpc_means_empty_frames_with_the_schema(read_capture):
    m, tx = frames(read_capture, udp_capture([(True, b"")], server=("10.0.0.2", 53)))
    assert m.height == 0 and tx.height == 0
    assert m.columns == list(nfs.MESSAGE_NAMES) and "retransmissions" in tx.columns
    assert AUTH_NONE == u32(0) + u32(0)
