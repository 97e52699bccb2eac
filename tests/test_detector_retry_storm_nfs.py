"""retry_storm on NFS/ONC-RPC: calls re-sent with their xid (Protocol.resends, analyzer/decoders/nfs_resends.py)
are retries over UDP and over TCP alike; a pipelined twin with a new xid on one connection is not; denied
locks asked again (Protocol.poll_answers) are lock polling, not a retry storm. On the recorded captures
(tests/data/nfs/recorded, GROUNDTRUTH.toml) and on nfs_messages rows built by hand and paired by the
real pairing (analyzer.decoders.nfs_pairing)."""
from __future__ import annotations

import tomllib
from pathlib import Path

import polars as pl
import pytest

from analyzer.capture import open_capture
from analyzer.decoders.nfs import MESSAGE_COLUMNS, PROTOCOL
from analyzer.decoders.nfs_pairing import pair_transactions
from analyzer.decoders.nfs_resends import resends
from detectors import retry_storm as rs
from detectors import run
from detectors.base import SEVERITIES
from fakes import FakeCapture, columns_frame

S = 1_000_000_000
MS = 1_000_000
US = 1_000
T0 = 1_700_000_000 * S
SERVER = "10.0.0.2"
RECORDED = Path(__file__).parent / "data" / "nfs" / "recorded"
TRUTH = {e["file"]: e for e in tomllib.loads((RECORDED / "GROUNDTRUTH.toml").read_text())["capture"]}
LOCK_CAPTURES = [name for name, e in TRUTH.items() if e["scenario"] == "nfs4-lock-polling"]


def at_least(severity: str) -> list[str]:
    return list(SEVERITIES[SEVERITIES.index(severity):])


def storm_findings(name: str) -> pl.DataFrame:
    cap = open_capture(RECORDED / name)
    try:
        return run(cap, only=["retry_storm"])
    finally:
        cap.close()


# -- the recorded captures ----------------------------------------------------------------------------

def test_udp_retransmissions_are_one_storm_with_the_timer_named():
    truth = TRUTH["nfs3-udp-retrans.pcap"]
    f = storm_findings("nfs3-udp-retrans.pcap")
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "nfs" and r["server"] == "10.77.0.49" and r["clients"] == truth["clients"]
    retried = truth["calls_retransmitted"]
    assert r["value"] == truth["retransmissions"] / retried  # retries per retried call
    text = r["explanation"]
    assert "resent READs for" in text and f"{truth['retransmissions']} times" in text
    assert f"{retried} request(s) retried" in text
    assert "exponential backoff" in text
    # the measured timer is Linux's UDP timeo (1.1 s), named against the server's sub-millisecond response time
    assert f"retry timer {truth['timeo_s']:g} s (Linux's default timeo for UDP mounts, nfs(5)) is" in text
    assert "µs response time" in text
    # every retransmitted call is evidence, the first sends too
    assert r["evidence_total"] == retried + truth["retransmissions"]


def test_udp_healthy_twin_is_quiet():
    f = storm_findings("nfs3-udp-retrans-healthy.pcap")
    assert f.filter(pl.col("severity").is_in(at_least("low"))).height == 0


@pytest.mark.parametrize("name", LOCK_CAPTURES)
def test_lock_polling_is_not_a_retry_storm(name):
    f = storm_findings(name)
    assert f.filter(pl.col("severity").is_in(at_least("medium"))).height == 0, f["explanation"].to_list()


def test_the_hook_finds_every_retransmission_of_the_ground_truth():
    truth = TRUTH["nfs3-udp-retrans.pcap"]
    cap = open_capture(RECORDED / "nfs3-udp-retrans.pcap")
    try:
        msgs, txs = cap.frame("nfs_messages"), cap.frame("nfs_transactions")
    finally:
        cap.close()
    rows = resends(msgs, txs)
    assert rows.height == truth["retransmissions"]
    first = txs[rows["txn"].to_list()]
    assert rows["client"].n_unique() == truth["clients"]
    assert (rows["client"] == first["client"]).all() and (rows["ts"] > first["request_ts_ns"]).all()
    offsets_s = sorted(round(d / S, 1) for d in (rows["ts"] - first["request_ts_ns"]).to_list())
    assert offsets_s == sorted(round(x, 1) for x in truth["retransmit_offsets_s"])


# -- constructed: the same xid over TCP ---------------------------------------------------------------

def _call(flow, client, port, xid, t, frame, message, transport="tcp", offset=0):
    return dict(transport=transport, flow=flow, from_client=True, src=client, dst=SERVER, sport=port, dport=2049,
                frame_first=frame, frame_last=frame, ts_first_ns=t, ts_last_ns=t, wire_length=200, complete=True,
                message=message, op_index=0, xid=xid, msg_type="CALL", rpcvers=2, program=100003, version=3,
                procedure=6, call_frame=frame, is_callback=False, operation="READ", cur_id=0xABCD, fh_hash=0xABCD,
                offset=offset, length=4096)


def _reply(flow, client, port, xid, t, frame, message, call_frame, transport="tcp"):
    return dict(transport=transport, flow=flow, from_client=False, src=SERVER, dst=client, sport=2049, dport=port,
                frame_first=frame, frame_last=frame, ts_first_ns=t, ts_last_ns=t, wire_length=1200, complete=True,
                message=message, op_index=0, xid=xid, msg_type="REPLY", program=100003, version=3, procedure=6,
                call_frame=call_frame, is_callback=False, operation="READ", reply_stat=0, accept_stat=0,
                nfs_status=0, status="NFS3_OK")


def nfs_capture(clients=20, resend_after_s=(60, 120, 180), same_xid=True, answer_after_s=400, normal=True,
                answer_all=True):
    """``clients`` NFSv3 clients over TCP (one connection each), each reading on through a file (READs
    answered in 300 µs), then one READ the server does not answer: re-sent with its xid (or, ``same_xid``
    False, a new READ with a new xid, a pipelined twin) ``resend_after_s`` after the send before, all
    answered ``answer_after_s`` after the first (``answer_all`` False: only the last of the new-xid
    calls). A FakeCapture of nfs_messages, the real pairing's nfs_transactions and the
    connections (90 µs handshakes)."""
    rows, frame, message = [], 1, 0
    for k in range(clients):
        client, port, xid = f"10.1.0.{k + 1}", 700 + k, 1000 * (k + 1)
        t = T0 + k * 37 * MS
        for j in range(5 if normal else 0):  # everyday READs, answered fast
            rows.append(_call(k, client, port, xid, t, frame, message, offset=j * 4096))
            rows.append(_reply(k, client, port, xid, t + 300 * US, frame + 1, message + 1, frame))
            xid, t, frame, message = xid + 1, t + 200 * MS, frame + 2, message + 2
        stalled, first_frame = xid, frame
        offsets = [0]
        for gap in resend_after_s:
            offsets.append(offsets[-1] + gap)
        for j, off in enumerate(offsets):
            rows.append(_call(k, client, port, stalled if same_xid else stalled + j, t + off * S, frame, message,
                              offset=5 * 4096))
            frame, message = frame + 1, message + 1
        for j in range(1) if same_xid else range(0 if answer_all else len(offsets) - 1, len(offsets)):
            rows.append(_reply(k, client, port, stalled + j, t + answer_after_s * S + j * MS, frame, message,
                               first_frame + j))
            frame, message = frame + 1, message + 1
    msgs = columns_frame(MESSAGE_COLUMNS, rows).sort("ts_last_ns", "message")
    conns = pl.DataFrame({"conn": list(range(clients)), "client": [f"10.1.0.{k + 1}" for k in range(clients)],
                          "client_port": [700 + k for k in range(clients)], "server": [SERVER] * clients,
                          "server_port": [2049] * clients, "handshake_rtt_ns": [90 * US] * clients},
                         schema_overrides={"client_port": pl.UInt16, "server_port": pl.UInt16})
    syns = pl.DataFrame(schema={"frame": pl.UInt32, "ts_ns": pl.Int64, "conn": pl.UInt32})  # no SYN captured
    return FakeCapture(nfs_messages=msgs, nfs_transactions=pair_transactions(msgs), connections=conns,
                       tcp_client_syns=syns)


def test_same_xid_resent_on_one_tcp_connection_after_timeo_is_a_retry_storm():
    # Linux over TCP: timeo 60 s, then 120 s, 180 s (nfs(5): linear backoff), the xid kept, one connection
    cap = nfs_capture()
    assert cap.frame("nfs_transactions")["retransmissions"].max() == 3  # the pairing folded them
    f = rs.detect(cap, rs.Params())
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "nfs" and r["clients"] == 20 and r["value"] == 3.0 and r["server"] == SERVER
    text = r["explanation"]
    assert "60 times" in text and "20 request(s) retried" in text and "linear backoff" in text
    assert "retry timer 60 s (Linux's default timeo for TCP mounts, nfs(5)) is" in text
    assert "µs response time" in text and "90 µs TCP handshake RTT" in text
    # 4 sends per request from 20 clients: medium (amplification >= 3 with >= 3 clients), not high (< 10x,
    # < 100 retries); a linear backoff lowers nothing
    p = rs.Params()
    assert 4 >= p.medium_amplification and 4 < p.high_amplification and 60 < p.high_retries
    assert r["severity"] == "medium"


def test_a_pipelined_twin_with_new_xids_on_one_connection_is_not():
    cap = nfs_capture(same_xid=False)
    assert cap.frame("nfs_transactions")["retransmissions"].max() == 0
    assert rs.detect(cap, rs.Params()).height == 0
    # well within max_gap_ns too: new calls on the connection that carries the first are pipelined, not retries
    quick = nfs_capture(same_xid=False, resend_after_s=(2, 2, 2), answer_after_s=10, answer_all=False)
    assert rs.detect(quick, rs.Params()).height == 0
    # the same calls over UDP would be re-asks after no answer: retries (what keeps the TCP ones quiet is TCP)
    msgs = quick.frame("nfs_messages")
    msgs = msgs.with_columns(pl.lit("udp").cast(msgs["transport"].dtype).alias("transport"))
    assert rs.detect(FakeCapture(nfs_messages=msgs, nfs_transactions=pair_transactions(msgs)), rs.Params()).height == 1


def test_udp_resends_far_apart_are_retries_too_but_new_xids_far_apart_are_not():
    # over UDP a new xid is a retry only within max_gap_ns; the same xid whatever the gap
    def udp(same):
        cap = nfs_capture(clients=5, resend_after_s=(30, 30, 30), same_xid=same, answer_after_s=100)
        msgs = cap.frame("nfs_messages")
        msgs = msgs.with_columns(pl.lit("udp").cast(msgs["transport"].dtype).alias("transport"))
        return FakeCapture(nfs_messages=msgs, nfs_transactions=pair_transactions(msgs))

    assert rs.detect(udp(True), rs.Params()).height == 1
    assert rs.detect(udp(False), rs.Params()).height == 0


def test_denied_locks_are_left_to_lock_polling():
    # NFSv4.0 LOCK answered NFS4ERR_DENIED every 500 ms by 5 clients: no retry storm; unanswered: one
    def locks(status):
        rows, frame, message = [], 1, 0
        for k in range(5):
            client, port = f"10.1.0.{k + 1}", 800 + k
            for j in range(20):
                t = T0 + k * 41 * MS + j * 500 * MS
                row = _call(k, client, port, 5000 * (k + 1) + j, t, frame, message, transport="tcp")
                row.update(program=100003, version=4, procedure=1, operation="LOCK", op_count=1, opcode=12,
                           minorversion=0)
                rows.append(row)
                if status is not None:
                    rep = _reply(k, client, port, 5000 * (k + 1) + j, t + 200 * US, frame + 1, message + 1, frame)
                    rep.update(version=4, procedure=1, operation="LOCK", op_count=1, opcode=12, nfs_status=10010,
                               op_status=10010, status=status)
                    rows.append(rep)
                frame, message = frame + 2, message + 2
        msgs = columns_frame(MESSAGE_COLUMNS, rows).sort("ts_last_ns", "message")
        return FakeCapture(nfs_messages=msgs, nfs_transactions=pair_transactions(msgs))

    assert ("LOCK", "NFS4ERR_DENIED") in PROTOCOL.poll_answers
    assert rs.detect(locks("NFS4ERR_DENIED"), rs.Params()).height == 0
    # the same asks failing otherwise (a server error, not a held lock) are a retry storm
    f = rs.detect(locks("NFS4ERR_SERVERFAULT"), rs.Params())
    assert f.height == 1 and f["severity"][0] in at_least("medium")


# -- the declaration: derived from the registry -------------------------------------------------------

def test_the_resend_frames_are_declared_by_the_protocols_and_required():
    from analyzer.decoders import registry
    from analyzer.decoders.protocol import Protocol

    declared = {p.resends_frame for p in registry.protocols() if p.resends}
    assert {"dns_messages", "nfs_messages"} <= declared
    assert declared <= set(rs.REQUIRES) and set(rs.RESEND_FRAMES) == declared
    with pytest.raises(ValueError, match="resends"):
        Protocol(name="x", title="X", spec="-", frames=("x_messages",), resends="m:f")
    with pytest.raises(ValueError, match="resends frame"):
        Protocol(name="x", title="X", spec="-", frames=("x_messages",), resends="m:f", resends_frame="y")
    with pytest.raises(ValueError, match="resends_columns"):
        Protocol(name="x", title="X", spec="-", frames=("x_messages",), resends="m:f", resends_frame="x_messages")
    # what the hooks read of the message frames is what retry_storm declares it reads of them (a scan
    # keeps no more), and the hooks find nothing without one of those columns
    assert rs.COLUMNS == {p.resends_frame: p.resends_columns for p in registry.protocols() if p.resends}


def test_the_proof_counts_the_same_resends_as_the_detector():
    from dashboards.proofs import retry_storm as proof
    from dashboards.proofs.base import Proof

    truth = TRUTH["nfs3-udp-retrans.pcap"]
    cap = open_capture(RECORDED / "nfs3-udp-retrans.pcap")
    try:
        finding = run(cap, only=["retry_storm"]).row(0, named=True)
        attempts = proof.protocol_attempts(Proof.of(cap, finding), finding, rs.Params().max_gap_ns)
    finally:
        cap.close()
    assert attempts.filter(pl.col("attempt") > 0).height == truth["retransmissions"]
    assert attempts.filter(pl.col("attempt") > 0)["client"].n_unique() == truth["clients"]
    assert proof.backoff_of(attempts)[0] == "exponential"


def test_re_asks_answered_only_late_are_retries_and_said_so():
    # UDP, a new xid every 2 s while the server takes 10 s: every ask is answered, each after the next went out
    cap = nfs_capture(clients=5, same_xid=False, resend_after_s=(2, 2, 2), answer_after_s=10)
    msgs = cap.frame("nfs_messages")
    msgs = msgs.with_columns(pl.lit("udp").cast(msgs["transport"].dtype).alias("transport"))
    f = rs.detect(FakeCapture(nfs_messages=msgs, nfs_transactions=pair_transactions(msgs)), rs.Params())
    assert f.height == 1 and f["clients"][0] == 5 and f["value"][0] == 3.0
    text = f["explanation"][0]
    assert "15 tries were answered only after clients had asked again" in text and "went unanswered" not in text
    # over TCP on one connection the same asks are pipelined: quiet
    assert rs.detect(nfs_capture(clients=5, same_xid=False, resend_after_s=(2, 2, 2), answer_after_s=10),
                     rs.Params()).height == 0


def test_without_the_message_frame_the_folded_count_still_counts_and_odd_frames_do_not_crash():
    tx = nfs_capture().frame("nfs_transactions")
    # no nfs_messages: the resends are known from nfs_transactions.retransmissions, their times are not
    f = rs.detect(FakeCapture(nfs_transactions=tx), rs.Params())
    assert f.height == 1 and f["value"][0] == 3.0 and f["clients"][0] == 20
    # a message frame without the columns the hook needs, or without rows: no resends, no crash
    for msgs in (pl.DataFrame({"x": [1]}), columns_frame(MESSAGE_COLUMNS, [])):
        assert resends(msgs, tx).height == 0
        rs.detect(FakeCapture(nfs_transactions=tx, nfs_messages=msgs), rs.Params())
    assert resends(nfs_capture().frame("nfs_messages"), tx.head(0)).height == 0
