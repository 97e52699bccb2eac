"""tcp_stall on tiny scripted conversations (each kind fires, near-misses stay quiet), its contract,
and the labelled stall of the synthetic benchmark capture.

The conversations are byte-exact pcaps (tests/builders.py) run through herdscope's TCP analysis; the
resulting frames go into a FakeCapture so that the timestamp resolution can be set per test.
"""
import json
from pathlib import Path

import polars as pl
import pytest

from builders import handshake, opt_mss, tcp_conversation
from detectors import tcp_stall
from detectors.base import FINDINGS_SCHEMA
from fakes import FakeCapture
from shared_captures import shared_capture
from synthetic import synthetic_detect, synthetic_labels
from tcp_scenarios import fin_close, gap_capture
from tshark_ref import corpus_files

US, MS, S = 1_000, 1_000_000, 1_000_000_000
ROOT = Path(__file__).parent.parent


def fake(read_capture, steps, resolution_ns=1.0, keep=None, **kw):
    """Analyse a scripted conversation and hand its frames to a FakeCapture."""
    cap = read_capture(tcp_conversation(steps, **kw))
    seg, conns, pkts = cap.frame("tcp_segments"), cap.frame("connections"), cap.packets
    if keep is not None:  # simulate a capture that missed packets: rebuild from the kept frames only
        cap = read_capture(tcp_conversation([s for s in steps if keep(s)], **kw), name="kept.pcap")
        seg, conns, pkts = cap.frame("tcp_segments"), cap.frame("connections"), cap.packets
    return FakeCapture(resolution_ns=resolution_ns, tcp_segments=seg, connections=conns, packets=pkts)


def data(t, from_client, n=100, **kw):
    return {"t": t, "from_client": from_client, "data": b"x" * n, "flags": 0x18, **kw}


def ack(t, from_client, **kw):
    return {"t": t, "from_client": from_client, "flags": 0x10, **kw}


def detect(cap, **params):
    return tcp_stall.detect(cap, tcp_stall.Params(**params))


def kinds(f):
    return dict(zip(f["kind"].to_list(), f["severity"].cast(pl.String).to_list()))


# -- rto ------------------------------------------------------------------------------------------

def rto_steps(rtt, gaps=(200 * MS,)):
    """A request; the response's last segment is lost after the capture point and resent by the timer
    (once per gap: exponential backoff when several)."""
    t = rtt + 50 * US
    steps = handshake(0, rtt=rtt) + [data(t, True)]
    t1 = t + rtt
    steps += [data(t1, False, 1000), data(t1 + 10 * US, False, 1000), data(t1 + 20 * US, False, 500),
              ack(t1 + 10 * US + rtt, True, ack=2001)]
    tr = t1 + 20 * US
    for g in gaps:
        tr += g
        steps.append(data(tr, False, 500, seq=2001))
    steps.append(ack(tr + rtt, True))
    return steps + fin_close(tr + 2 * rtt, rtt)


def test_rto_on_a_fast_path_is_the_rto_min_mismatch(read_capture):
    f = detect(fake(read_capture, rto_steps(50 * US)))
    assert kinds(f) == {"rto": "medium"}
    r = f.row(0, named=True)
    assert r["resource"] == "10.0.0.2:445-10.0.0.1:40000" and r["client"] == "10.0.0.1" and r["server"] == "10.0.0.2"
    assert r["metric"] == "stall_ms" and 199 < r["value"] < 201 and r["unit"] == "ms"
    assert r["threshold"] == pytest.approx(20.0)  # max(20 ms floor, 3 x 50 µs)
    # the lost segment's original, which is also the last one before the gap (7), its retransmission (9)
    # and the ACK after it (10)
    assert r["evidence_frames"] == [7, 9, 10]
    assert "is 4,000× the 50 µs RTT" in r["explanation"] and "RTO-min mismatch" in r["explanation"]
    assert "200 ms minimum RTO" in r["explanation"]


def test_rto_backoff_is_one_episode(read_capture):
    f = detect(fake(read_capture, rto_steps(50 * US, gaps=(200 * MS, 400 * MS, 800 * MS))))
    r = f.row(0, named=True)
    assert f.height == 1 and r["kind"] == "rto" and r["severity"] == "high"  # 1.4 s, nearly all of the life
    assert "doubled each time to 400 ms, 800 ms" in r["explanation"] and "backed off" in r["explanation"]
    assert 1399 < r["value"] < 1401


def test_rto_on_a_slow_path_is_ordinary_loss_recovery(read_capture):
    # 250 ms is 6x a 40 ms RTT: a timer in proportion to the path, at most low
    f = detect(fake(read_capture, rto_steps(40 * MS, gaps=(250 * MS,))))
    assert kinds(f) == {"rto": "low"}


def test_rto_near_miss_and_lowered_threshold(read_capture):
    cap = fake(read_capture, rto_steps(50 * US, gaps=(5 * MS,)))
    assert detect(cap).height == 0  # 5 ms is under the 20 ms floor: not a timer we call an RTO
    f = detect(cap, rto_min_gap_ns=1 * MS, min_lost_ns=1 * MS)
    assert kinds(f) == {"rto": "low"}


def test_one_direction_captured_is_informational(read_capture):
    cap = fake(read_capture, rto_steps(50 * US), keep=lambda s: not s["from_client"])
    f = detect(cap)
    assert kinds(f) == {"rto": "informational"}
    assert "only the server->client direction was captured" in f["explanation"][0]


def test_rtt_is_never_below_the_timestamp_resolution(read_capture):
    cap = fake(read_capture, rto_steps(400), resolution_ns=1000.0)
    r = detect(cap).row(0, named=True)
    assert "× the ~1 µs (± the 1 µs timestamp tick) RTT" in r["explanation"]  # measured 400 ns: one tick
    assert "timestamp resolution" in r["explanation"]


# -- delayed_ack (Nagle) --------------------------------------------------------------------------

def nagle_steps(requests=3, rtt=2 * MS, ack_delay=40 * MS, body_after=None, nodelay=False):
    """write-write-read: a 20-byte header, then a 200-byte body, then a 64-byte response. Captured at
    the server: its delayed ACK, then the body one RTT later."""
    steps = handshake(0, rtt=rtt)
    cseq, sseq = 1, 1
    t = rtt + 1 * MS
    for _ in range(requests):
        steps.append(data(t, True, 20))
        if nodelay:
            steps.append(data(t + 30 * US, True, 200, seq=cseq + 20))
            steps.append(ack(t + 40 * US, False))
            tb = t + 30 * US
        else:
            steps.append(ack(t + ack_delay, False, ack=cseq + 20))
            tb = t + ack_delay + (body_after if body_after is not None else rtt)
            steps.append(data(tb, True, 200, seq=cseq + 20))
            steps.append(ack(tb + 10 * US, False))
        steps.append(data(tb + 60 * US, False, 64, seq=sseq))
        steps.append(ack(tb + 60 * US + rtt, True))
        cseq += 220
        sseq += 64
        t += 100 * MS
    return steps + fin_close(t, rtt)


def test_nagle_meets_delayed_ack(read_capture):
    f = detect(fake(read_capture, nagle_steps()))
    assert kinds(f) == {"delayed_ack": "medium"}
    r = f.row(0, named=True)
    assert r["evidence_total"] == 9  # per stall: the header, the delayed ACK, the body
    assert 3 * 39 < r["value"] < 3 * 41  # body - header - RTT, three times
    assert "delayed ACK 3 times" in r["explanation"] and "TCP_NODELAY" in r["explanation"]
    assert "~40 ms" in r["explanation"]


def test_nagle_near_misses(read_capture):
    assert detect(fake(read_capture, nagle_steps(nodelay=True))).height == 0  # TCP_NODELAY
    # the ACK is delayed but the next write comes much later: the sender was not waiting for it
    assert detect(fake(read_capture, nagle_steps(body_after=300 * MS))).height == 0
    # two stalls are under delack_min_events (3); lowered, they are reported
    cap = fake(read_capture, nagle_steps(requests=2))
    assert detect(cap).height == 0
    assert kinds(detect(cap, delack_min_events=2)) == {"delayed_ack": "low"}


# -- zero_window / window_full --------------------------------------------------------------------

def zero_window_steps(closed=500 * MS, probe=True, resume_after=200 * US):
    rtt = 1 * MS
    steps = handshake(0, rtt=rtt) + [data(2 * MS, True, 10)]
    t = 3 * MS
    steps += [data(t, False, 1000), data(t + 10 * US, False, 1000), ack(t + 10 * US + rtt, True, window=0)]
    t0 = t + 10 * US + rtt
    if probe:
        steps += [data(t0 + closed // 3, False, 1, seq=2001), ack(t0 + closed // 3 + rtt, True, window=0, ack=2001)]
    steps.append(ack(t0 + closed, True, window=65535, ack=2001))
    steps += [data(t0 + closed + resume_after, False, 1000, seq=2001), ack(t0 + closed + resume_after + rtt, True)]
    return steps + fin_close(t0 + closed + 10 * MS, rtt)


def test_zero_window_blocks_the_sender(read_capture):
    f = detect(fake(read_capture, zero_window_steps()))
    assert kinds(f) == {"zero_window": "medium"}
    r = f.row(0, named=True)
    assert 499 < r["value"] < 501
    assert "advertised a zero receive window" in r["explanation"] and "1 zero-window probe," in r["explanation"]
    assert r["explanation"].startswith("client 10.0.0.1:40000")


def test_zero_window_near_misses(read_capture):
    assert detect(fake(read_capture, zero_window_steps(closed=5 * MS, probe=False))).height == 0  # too short
    # closed, but the sender had nothing to send: no probe and nothing right after the reopening
    assert detect(fake(read_capture, zero_window_steps(probe=False, resume_after=2 * S))).height == 0


def window_full_steps(reader_delay=60 * MS, rounds=3):
    rtt = 1 * MS
    steps = handshake(0, rtt=rtt) + [data(2 * MS, True, 10, window=2000)]
    t, seq = 3 * MS, 1
    for _ in range(rounds):
        steps += [data(t, False, 1000, seq=seq), data(t + 10 * US, False, 1000, seq=seq + 1000)]
        seq += 2000
        t_ack = t + 10 * US + max(reader_delay, rtt)
        steps.append(ack(t_ack, True, window=2000, ack=seq))
        t = t_ack + 100 * US
    steps.append(ack(t, True))
    return steps + fin_close(t + 5 * MS, rtt)


def test_window_full_receiver_limited(read_capture):
    f = detect(fake(read_capture, window_full_steps()))
    assert kinds(f) == {"window_full": "medium"}
    r = f.row(0, named=True)
    # the third full window is followed by no more data: only two waits count (60 ms - RTT each)
    assert 2 * 58 < r["value"] < 2 * 60
    assert r["explanation"].startswith("server 10.0.0.2:445 filled client 10.0.0.1:40000's receive window 2 times")


def test_window_full_at_the_ack_clock_is_not_a_stall(read_capture):
    assert detect(fake(read_capture, window_full_steps(reader_delay=0))).height == 0


# -- slow start after idle / small initial window ------------------------------------------------

def burst(t0, rtt, rounds, seq, mss=1000, spacing=10 * US):
    """Server data sent in RTT rounds of the given segment counts (a sender-side capture), each round
    acknowledged by the client at its end."""
    steps = []
    for k, n in enumerate(rounds):
        tk = t0 + k * rtt
        for i in range(n):
            steps.append(data(tk + i * spacing, False, mss, seq=seq))
            seq += mss
        steps.append(ack(tk + n * spacing + rtt // 2, True, ack=seq))
    return steps, seq


def slow_start_steps(after_idle=(10, 20, 40, 80), bursts=2, idle=1 * S, rtt=20 * MS):
    steps = handshake(0, rtt=rtt, client_opts=opt_mss(1000))
    t, seq, cseq = 2 * rtt, 1, 1
    for b in range(bursts):
        steps.append(data(t, True, 10, seq=cseq))
        cseq += 10
        part, seq = burst(t + rtt // 2, rtt, (10, 20, 40, 80) if b == 0 else after_idle, seq)
        steps += part
        t = part[-1]["t"] + idle
    return steps + fin_close(t, rtt)


def test_slow_start_after_idle(read_capture):
    cap = fake(read_capture, slow_start_steps(bursts=4))
    f = detect(cap)
    k = kinds(f)
    assert k["slow_start_after_idle"] in ("medium", "high") and k["small_initial_window"] == "low"
    r = f.filter(pl.col("kind") == "slow_start_after_idle").row(0, named=True)
    assert "after 3 idle gaps" in r["explanation"] and "9.77 KiB first round" in r["explanation"]
    assert "78.1 KiB per 20 ms RTT round" in r["explanation"]
    assert "tcp_slow_start_after_idle" in r["explanation"]


def test_window_kept_across_idle_is_not_slow_start_after_idle(read_capture):
    f = detect(fake(read_capture, slow_start_steps(after_idle=(80, 70), bursts=3)))
    assert "slow_start_after_idle" not in kinds(f)


def test_small_initial_window_is_at_most_low(read_capture):
    f = detect(fake(read_capture, slow_start_steps(bursts=1)))
    assert kinds(f) == {"small_initial_window": "low"}
    r = f.row(0, named=True)
    assert 39 < r["value"] < 41  # 4 rounds where the best flight would need 2: two 20 ms round trips
    f = detect(fake(read_capture, slow_start_steps(bursts=1)), medium_lost_ns=10 * MS)
    assert kinds(f) == {"small_initial_window": "low"}  # capped whatever the time lost


# -- contract -------------------------------------------------------------------------------------

def test_contract_schema_ids_and_empty_inputs(read_capture):
    cap = fake(read_capture, rto_steps(50 * US))
    a, b = detect(cap), detect(cap)
    assert a.schema == FINDINGS_SCHEMA
    assert a["finding_id"].to_list() == b["finding_id"].to_list()
    assert json.loads(a["parameters"][0])["rto_min_gap_ns"] == 20 * MS
    assert a["detector"].to_list() == ["tcp_stall"]
    assert tcp_stall.detect(FakeCapture(), tcp_stall.Params()).schema == FINDINGS_SCHEMA
    quiet = fake(read_capture, handshake() + [data(50 * US, True), ack(70 * US, False)])
    assert detect(quiet).height == 0


def test_params_documented():
    import dataclasses
    names = {f.name for f in dataclasses.fields(tcp_stall.Params)}
    src = Path(tcp_stall.__file__).read_text()
    assert all(f"    {n}:" in src for n in names)
    assert tcp_stall.NAME == "tcp_stall" and "Severity rule" in tcp_stall.__doc__


_CORPUS_FINDINGS: dict[str, pl.DataFrame] = {}


def corpus_findings(rel: str) -> pl.DataFrame:
    """tcp_stall with its defaults on one corpus capture (the session's shared Capture), computed once
    for both corpus tests below."""
    if rel not in _CORPUS_FINDINGS:
        _CORPUS_FINDINGS[rel] = tcp_stall.detect(shared_capture(ROOT / "tests" / "data" / "corpus" / rel),
                                                 tcp_stall.Params())
    return _CORPUS_FINDINGS[rel]


def test_never_raises_on_the_corpus():
    for row in corpus_files():
        f = corpus_findings(row["file"])
        assert f.schema == FINDINGS_SCHEMA, row["file"]
        if "normal" in row["purposes"].split(","):
            assert f.filter(pl.col("severity").cast(pl.String).is_in(["medium", "high", "critical"])).height == 0


# -- the synthetic benchmark capture ---------------------------------------------------------------

def test_synthetic_capture_labelled_stall_is_found(synthetic_capture):
    path = synthetic_capture
    labels = synthetic_labels(path, "tcp_stall")
    f = synthetic_detect(path, tcp_stall)
    assert labels
    for lab in labels:
        hit = f.filter((pl.col("kind") == "rto") & (pl.col("server") == lab["server"])
                       & pl.col("resource").str.contains(lab["clients"][0] + ":", literal=True)
                       & (pl.col("start_ns") - lab["start_ns"]).abs().le(10 * MS))
        assert hit.height == 1, (lab, f.select("kind", "severity", "start_ns", "resource").to_dicts())
        assert str(hit["severity"][0]) == "medium"
        assert abs(hit["value"][0] - lab["parameters"]["gap_ms"]) < 1.0


# -- what a retransmission timer episode is (issue 10) ----------------------------------------------

DATA = ROOT / "tests" / "data"


def corpus(rel, **params):
    return tcp_stall.detect(shared_capture(DATA / rel), tcp_stall.Params(**params))


def teardown_steps(rtt=50 * US, gaps=(200 * MS, 400 * MS, 800 * MS)):
    """The client sends its FIN, the server its own; the client's ACK of the server's FIN and the
    server's ACK of the client's FIN never arrive: the client resends its FIN on its timer."""
    steps = handshake(0, rtt=rtt) + [data(rtt + 10 * US, True), ack(2 * rtt, False),
                                     data(2 * rtt + 10 * US, False, 500), ack(3 * rtt, True)]
    t = 3 * rtt + 10 * US
    steps += [{"t": t, "from_client": True, "flags": 0x11}, {"t": t + rtt // 2, "from_client": False, "flags": 0x11,
                                                            "ack": 102}]
    for g in gaps:
        t += g
        steps.append({"t": t, "from_client": True, "flags": 0x11, "seq": 101, "ack": 502})
    return steps


def test_fin_resent_after_the_peers_fin_is_teardown_not_a_stall(read_capture):
    f = detect(fake(read_capture, teardown_steps()))
    assert kinds(f) == {"teardown": "informational"}
    r = f.row(0, named=True)
    assert 1399 < r["value"] < 1401
    e = r["explanation"]
    assert "teardown, not a stall" in e and "FIN 3 times after server 10.0.0.2:445 had sent its own FIN (frame 9)" in e
    assert "before retransmitting data" not in e


def test_fin_retransmission_on_a_real_capture_is_teardown():
    # tshark: vlan-collisions.pcap carries one connection seen on three VLANs 50 ms apart; the client's
    # FIN (17) comes again at 28 and 38 ("suspected retransmission"), 38 after the server's FIN (29).
    # 50 ms is under 3 x the 70 ms handshake RTT, so nothing at the defaults; with the RTO floor
    # lowered the repeats are read as teardown, never as a data stall.
    assert corpus("corpus/zeek/vlan-collisions.pcap").filter(pl.col("kind") == "teardown").height == 0
    f = corpus("corpus/zeek/vlan-collisions.pcap", rto_gap_rtts=0.0, rto_min_gap_ns=10 * MS)
    t = f.filter(pl.col("kind") == "teardown")
    assert t.height >= 1 and set(t["severity"].cast(pl.String)) == {"informational"}
    client_side = t.filter(pl.col("explanation").str.starts_with("connection teardown, not a stall: client"))
    assert "had sent its own FIN (frame 29)" in client_side["explanation"][0]
    assert {17, 28, 38} <= set(client_side["evidence_frames"][0])
    assert f.filter(pl.col("explanation").str.contains("FIN") & (pl.col("kind") == "rto")).height == 0


def synack_steps(rtt=100 * US, client_acks=True, timer=1 * S, then_data=True):
    steps = handshake(0, rtt=rtt)
    if not client_acks:
        steps = steps[:2]
    steps.append({"t": rtt // 2 + timer, "from_client": False, "flags": 0x12, "seq": 0})
    steps.append(ack(rtt + timer, True))
    if then_data:  # a server-speaks-first protocol: the banner after the handshake completed
        steps += [data(rtt + timer + 10 * US, False, 50), ack(2 * rtt + timer, True)]
    return steps + fin_close(3 * rtt + timer, rtt)


def test_synack_retransmission_after_the_clients_ack(read_capture):
    f = detect(fake(read_capture, synack_steps()))
    assert kinds(f) == {"synack_retransmission": "medium"}  # ~1 s, 10,000 RTTs, but < 1 s lost: medium
    e = f["explanation"][0]
    assert "before retransmitting its SYN/ACK" in e and "the client's ACK (frame 3) was captured" in e
    assert "accept queue" in e and "SYN went unanswered" not in e


def test_synack_retransmission_without_an_answer_and_without_data(read_capture):
    f = detect(fake(read_capture, synack_steps(client_acks=False)))
    assert "no answer from the client was captured" in f["explanation"][0]
    f = detect(fake(read_capture, synack_steps(then_data=False)))
    assert kinds(f) == {"synack_retransmission": "low"}  # nothing waited on the handshake
    assert "nothing waited on it" in f["explanation"][0]


def test_synack_retransmission_on_a_real_capture():
    # tshark: var-services-std-ports.pcap, 172.16.238.1:49658 -> :80: SYN (40), SYN/ACK (43), the
    # client's ACK (44), then the server's SYN/ACK again 4.0 s later (61, "suspected retransmission").
    f = corpus("tcp_stall/var-services-std-ports.pcap")
    r = f.filter(pl.col("resource") == "172.16.238.131:80-172.16.238.1:49658").row(0, named=True)
    assert r["kind"] == "synack_retransmission" and 4003 < r["value"] < 4005
    assert "the client's ACK (frame 44) was captured" in r["explanation"]
    # no payload ever follows on that connection: nothing waited on the handshake
    assert r["severity"] == "low" and "nothing waited on it" in r["explanation"]


def test_synack_answering_a_repeated_syn_is_not_a_server_timer():
    # tshark: bug-5881-01.pcap: SYN (1), SYN/ACK (2) captured 42 ms later, the client's SYN again at
    # 998 ms (3), the SYN/ACK again 41 ms after it (4). The client is the one that waited; the SYN/ACK
    # at 4 answers its SYN.
    f = corpus("tcp_stall/bug-5881-01.pcap")
    assert kinds(f) == {"rto": "low"}  # 953 ms is 23 RTTs of a 44 ms path: RFC 6298 as designed
    e = f["explanation"][0]
    assert "the server's SYN/ACK (frame 2) was captured, yet the client sent its SYN again" in e


def dsack_steps(rtt=200 * US, timer=30 * MS, dsack=True):
    """The server's 100-byte response arrives; the client's ACK is delayed past the server's timer,
    which resends it; the client's ACK then carries a D-SACK of it (RFC 2883)."""
    from builders import opt_sack, opt_sack_perm

    steps = handshake(0, rtt=rtt, client_opts=opt_sack_perm(), server_opts=opt_sack_perm())
    t = rtt + 10 * US
    steps += [data(t, True), data(t + rtt, False, 100), data(t + rtt + timer, False, 100, seq=1)]
    opts = opt_sack((5001, 5101)) if dsack else b""
    steps.append(ack(t + 2 * rtt + timer, True, ack=101, options=opts))
    return steps + fin_close(t + 3 * rtt + timer, rtt)


def test_dsack_makes_the_retransmission_spurious_not_a_loss(read_capture):
    f = detect(fake(read_capture, dsack_steps()))
    assert kinds(f) == {"spurious_retransmission": "low"}
    r = f.row(0, named=True)
    assert (r["metric"], r["value"], r["unit"]) == ("spurious_retransmissions", 1.0, "retransmissions")
    assert "D-SACK (RFC 2883)" in r["explanation"] and "not loss" in r["explanation"]
    assert "lost tail segment" not in r["explanation"] and "RTO-min mismatch" not in r["explanation"]
    # the same without the D-SACK block: an RTO of a lost tail, 150 RTTs
    f = detect(fake(read_capture, dsack_steps(dsack=False)))
    assert kinds(f) == {"rto": "low"} and "RTO-min mismatch" in f["explanation"][0]


def test_dsack_on_a_real_capture():
    # tshark: smb_v2_only_non_zero_reserved1.pcap, 172.31.112.16:445 -> :57834: 105 bytes (81), the
    # same 105 bytes 21.3 ms later (90, "suspected retransmission"), then the client's ACK 729 with
    # SACK 624-729 (92, "D-SACK Sequence"): the client had the original.
    f = corpus("corpus/zeek/smb/smb_v2_only_non_zero_reserved1.pcap")
    r = f.filter(pl.col("resource") == "172.31.112.16:445-172.31.112.17:57834").row(0, named=True)
    assert r["kind"] == "spurious_retransmission" and r["severity"] == "low"
    assert {81, 90, 92} <= set(r["evidence_frames"])
    assert f.filter(pl.col("explanation").str.contains("lost tail segment")).height == 0


# -- severity against the path's own timescale ----------------------------------------------------

def syn_steps(rtt, timer=1 * S):
    steps = [{"t": 0, "from_client": True, "flags": 0x02},
             {"t": timer, "from_client": True, "flags": 0x02, "seq": 0},
             {"t": timer + rtt // 2, "from_client": False, "flags": 0x12},
             ack(timer + rtt, True), data(timer + rtt + 10 * US, True), data(timer + 2 * rtt, False, 500),
             ack(timer + 3 * rtt, True)]
    return steps + fin_close(timer + 4 * rtt, rtt)


def test_initial_syn_timeout_weighed_in_rtts(read_capture):
    # 1 s on a 48 ms WAN path is ~20 RTTs: RFC 6298 working as designed
    assert kinds(detect(fake(read_capture, syn_steps(48 * MS)))) == {"rto": "low"}
    # 1 s on a 0.4 ms path is 2,500 RTTs: the pathology (medium: just under a second lost; high from
    # 1 s lost, e.g. a 3 s initial RTO)
    assert kinds(detect(fake(read_capture, syn_steps(400 * US)))) == {"rto": "medium"}
    assert kinds(detect(fake(read_capture, syn_steps(400 * US, timer=3 * S)))) == {"rto": "high"}
    assert kinds(detect(fake(read_capture, syn_steps(48 * MS, timer=3 * S)))) == {"rto": "medium"}  # 62 RTTs
    # the RTT steps are parameters: raising medium_lost_rtts above 2,500 RTTs caps it at low
    cap = fake(read_capture, syn_steps(400 * US))
    assert kinds(detect(cap, medium_lost_rtts=3000.0, high_lost_rtts=3000.0, critical_lost_rtts=3000.0)) \
        == {"rto": "low"}


def test_200ms_timer_on_a_fast_path_versus_a_wan(read_capture):
    assert kinds(detect(fake(read_capture, rto_steps(400 * US)))) == {"rto": "medium"}  # 500 RTTs
    assert kinds(detect(fake(read_capture, rto_steps(48 * MS, gaps=(250 * MS,))))) == {"rto": "low"}


# -- a silence of the whole capture -----------------------------------------------------------------

def test_stall_across_a_clean_capture_gap_cannot_be_judged(read_capture):
    cap = read_capture(gap_capture(resume_with_retransmission=False))
    f = tcp_stall.detect(cap, tcp_stall.Params())
    assert kinds(f) == {"capture_gap": "informational"}
    e = f["explanation"][0]
    assert e.startswith("cannot judge") and "silence of the whole capture" in e and "files were merged" in e


def test_capture_wide_silence_ending_in_retransmissions_is_a_stall(read_capture):
    cap = read_capture(gap_capture(resume_with_retransmission=True))
    f = tcp_stall.detect(cap, tcp_stall.Params())
    assert kinds(f) == {"rto": "critical"}  # 60 s on a 0.4 ms path, nearly all of the connection's life
    # ... and a gap parameter longer than the silence keeps the other reading a stall too
    cap = read_capture(gap_capture(resume_with_retransmission=False), name="b.pcap")
    assert kinds(tcp_stall.detect(cap, tcp_stall.Params(capture_gap_ns=120 * S))) == {"rto": "critical"}


def test_blackout_sample_keeps_its_stall():
    # samples/tcp-rto-blackout.pcap: the link drops everything for 1.5 s; the whole capture is silent
    # for 1.06 s and ends in the sender's retransmission: an outage, a real stall (MANIFEST: >= medium)
    from analyzer import open_capture

    with open_capture(ROOT / "samples" / "tcp-rto-blackout.pcap") as cap:
        f = tcp_stall.detect(cap, tcp_stall.Params(capture_gap_ns=500 * MS))
    assert kinds(f) == {"rto": "medium"}


def test_corpus_findings_at_medium_or_above_are_pinned():
    """Every tcp_stall finding >= medium on tests/data/corpus, with why it is true.

    zeek/tcp/reassembly.pcap, 63.193.213.194:2564 -> 128.3.97.175:80 (30.5 ms handshake RTT): tshark
    shows the client silent from 0.97 s to 2.58 s, then resending data first sent at 0.45 s (frames
    35-52, tcp.analysis.rto 2.1-2.4 s), silent again from 3.63 s to 7.64 s and resending data of
    0.81 s (frames 64-77, rto 4.7-7.2 s): the retransmission timer backing off, 11.6 s of a 14 s
    connection. 380 RTTs lost: medium (not critical: an outage on a WAN path, not a fabric's timer)."""
    seen = {}
    for row in corpus_files():
        f = corpus_findings(row["file"])
        bad = f.filter(pl.col("severity").cast(pl.String).is_in(["medium", "high", "critical"]))
        for r in bad.iter_rows(named=True):
            seen[(row["file"], r["kind"], r["resource"])] = (str(r["severity"]), r["explanation"])
    # the captures added by the corpus review carry their own pins (tests/test_corpus_review.py)
    reviewed = {"zeek/echo-connections.pcap.gz", "suricata-verify/mime/mime-stream-depth/input.pcap",
                "zeek/dce-rpc/mapi.pcap",
                "zeek/http/206_example_b.pcap", "suricata-verify/tls/tls-subjectaltname/input.pcap",
                "suricata-verify/bug-4376/syn_retransmit_with_ts.pcap"}
    seen = {k: v for k, v in seen.items() if k[0] not in reviewed}
    assert set(seen) == {("zeek/tcp/reassembly.pcap", "rto", "128.3.97.175:80-63.193.213.194:2564")}
    severity, text = seen[("zeek/tcp/reassembly.pcap", "rto", "128.3.97.175:80-63.193.213.194:2564")]
    assert severity == "medium" and "backed off its timer" in text and "11.6 s" in text


def test_connections_in_separate_batches_find_what_one_batch_finds(read_capture, monkeypatch):
    """tcp_stall works in batches of whole connections (BATCH_SEGMENTS): the slow-start kinds of a
    connection in a later batch are found as in the first (they matched a transfer's first segment by a
    capture-wide row number against a row number within the batch, so past the first batch they were
    skipped or read from the wrong row)."""
    PCAP_HEADER_BYTES = 24
    conversations = [tcp_conversation(slow_start_steps(bursts=4), client=("10.0.0.1", 40000 + k))
                     for k in range(3)]
    # one capture of three connections, one after the other (a later one's times are offset by 30 s)
    records = [conv[PCAP_HEADER_BYTES:] for conv in conversations]
    shifted = []
    for k, rec in enumerate(records):
        out, pos = bytearray(), 0
        while pos < len(rec):
            caplen = int.from_bytes(rec[pos + 8:pos + 12], "little")
            secs = int.from_bytes(rec[pos:pos + 4], "little") + 30 * k
            out += secs.to_bytes(4, "little") + rec[pos + 4:pos + 16 + caplen]
            pos += 16 + caplen
        shifted.append(bytes(out))
    cap = read_capture(conversations[0][:PCAP_HEADER_BYTES] + b"".join(shifted))
    seg, conns = cap.frame("tcp_segments"), cap.frame("connections")
    assert conns.height == 3
    capture = FakeCapture(resolution_ns=1.0, tcp_segments=seg, connections=conns, packets=cap.packets)
    one_batch = detect(capture)
    assert one_batch.filter(pl.col("kind") == "slow_start_after_idle").height == 3
    monkeypatch.setattr(tcp_stall, "BATCH_SEGMENTS", 1)  # every connection a batch of its own
    assert detect(capture).to_dicts() == one_batch.to_dicts()
