"""tcp_stall on tiny scripted conversations (each kind fires, near-misses stay quiet), its contract,
and the labelled stall of the synthetic benchmark capture (slow).

The conversations are byte-exact pcaps (tests/builders.py) run through herdscope's TCP analysis; the
resulting frames go into a FakeCapture so that the timestamp resolution can be set per test.
"""
import json
from pathlib import Path

import polars as pl
import pytest
from conftest import synthetic_labels

from builders import handshake, opt_mss, tcp_conversation
from detectors import tcp_stall
from detectors.base import FINDINGS_SCHEMA
from fakes import FakeCapture
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


def fin_close(t, rtt):
    return [{"t": t, "from_client": True, "flags": 0x11}, {"t": t + rtt // 2, "from_client": False, "flags": 0x11},
            ack(t + rtt, True)]


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
    assert "× the 1 µs RTT" in r["explanation"]  # measured 400 ns, reported as the 1 µs tick
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


def test_never_raises_on_the_corpus():
    from analyzer import open_capture

    for row in corpus_files():
        with open_capture(ROOT / "tests" / "data" / "corpus" / row["file"]) as cap:
            f = tcp_stall.detect(cap, tcp_stall.Params())
        assert f.schema == FINDINGS_SCHEMA, row["file"]
        if "normal" in row["purposes"].split(","):
            assert f.filter(pl.col("severity").cast(pl.String).is_in(["medium", "high", "critical"])).height == 0


# -- the synthetic benchmark capture ---------------------------------------------------------------

@pytest.mark.slow
def test_synthetic_capture_labelled_stall_is_found(synthetic_capture):
    from analyzer import open_capture

    path = synthetic_capture
    labels = synthetic_labels(path, "tcp_stall")
    with open_capture(path) as cap:
        f = tcp_stall.detect(cap, tcp_stall.Params())
    assert labels
    for lab in labels:
        hit = f.filter((pl.col("kind") == "rto") & (pl.col("server") == lab["server"])
                       & pl.col("resource").str.contains(lab["clients"][0] + ":", literal=True)
                       & (pl.col("start_ns") - lab["start_ns"]).abs().le(10 * MS))
        assert hit.height == 1, (lab, f.select("kind", "severity", "start_ns", "resource").to_dicts())
        assert str(hit["severity"][0]) == "medium"
        assert abs(hit["value"][0] - lab["parameters"]["gap_ms"]) < 1.0
