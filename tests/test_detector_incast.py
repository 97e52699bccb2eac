"""incast on scripted fan-out rounds (byte-exact pcaps from tests/builders.py: one client, N servers,
the tail of some answers lost and resent on the timer), its near-misses (staggered answers, a single
lossy path, a slow path, too few servers), its folding of tcp_stall's rto findings, and the real
recording samples/tcp-incast.pcap with its staggered twin."""
import struct
import tomllib
from pathlib import Path

import polars as pl
import pytest

from builders import handshake, pcap_file, tcp_conversation
from detectors import incast, incast_rounds as ir, tcp_stall
from shared_captures import shared_capture, shared_run

US, MS = 1_000, 1_000_000
ROOT = Path(__file__).parent.parent
CLIENT = "10.0.0.1"
SEG, SEGS = 1000, 8  # each answer: SEGS segments of SEG bytes
REQ = 16


def _records(pcap: bytes) -> list[tuple]:
    """(sec, ns, frame, wire length) of each record of a ns pcap written by builders.pcap_file."""
    out, at = [], 24
    while at + 16 <= len(pcap):
        sec, frac, caplen, wire = struct.unpack("<IIII", pcap[at:at + 16])
        out.append((sec, frac, pcap[at + 16:at + 16 + caplen], wire))
        at += 16 + caplen
    return out


def server_steps(i: int, rounds: int, lost: dict[int, set[int]], rtt: int, period: int, stagger: int,
                 gap: int) -> list[dict]:
    """Server i's connection: a handshake, then per round k a 16-byte request at k x period (+ i x
    stagger) and an answer of SEGS segments; when i is in lost[k], its last segment (captured here, at
    the switch, before it was dropped) is acknowledged only after its retransmission ``gap`` later."""
    steps = handshake(i * US, rtt=rtt)
    for k in range(rounds):
        t = 10 * MS + k * period + i * stagger
        steps.append({"t": t, "from_client": True, "data": b"q" * REQ, "flags": 0x18})
        ta = t + rtt // 2
        base = 1 + k * SEG * SEGS
        for j in range(SEGS):
            steps.append({"t": ta + j * 20 * US, "from_client": False, "data": b"a" * SEG, "flags": 0x18})
        last = ta + (SEGS - 1) * 20 * US
        if i in lost.get(k, set()):
            steps.append({"t": last + rtt // 2, "from_client": True, "flags": 0x10,
                          "ack": base + (SEGS - 1) * SEG})
            steps.append({"t": last + gap, "from_client": False, "data": b"a" * SEG, "flags": 0x18,
                          "seq": base + (SEGS - 1) * SEG})
            steps.append({"t": last + gap + rtt // 2, "from_client": True, "flags": 0x10})
        else:
            steps.append({"t": last + rtt // 2, "from_client": True, "flags": 0x10})
    return steps


def fan_out(read_capture, n=8, rounds=6, lost=None, rtt=50 * US, period=300 * MS, stagger=10 * US,
            gap=200 * MS, name="incast.pcap"):
    """A capture of one client's fan-out rounds to n servers (10.0.1.1..n:7100)."""
    lost = {k: {k % n, (k + 3) % n} for k in range(rounds)} if lost is None else lost
    recs = []
    for i in range(n):
        recs += _records(tcp_conversation(server_steps(i, rounds, lost, rtt, period, stagger, gap),
                                          client=(CLIENT, 40000 + i), server=(f"10.0.1.{i + 1}", 7100)))
    recs.sort(key=lambda r: (r[0], r[1]))
    return read_capture(pcap_file(recs, nanosecond=True), name=name)


def detect(cap, **params):
    return incast.detect(cap, incast.Params(**params))


def test_fan_out_rounds_whose_tails_time_out_are_incast(read_capture):
    cap = fan_out(read_capture)
    f = detect(cap)
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "incast" and r["client"] == CLIENT and r["server"] is None
    # every round lost ~200 ms against well under a millisecond of work: the 90 % collapse
    assert r["severity"] == "critical" and r["metric"] == "goodput_lost" and r["value"] > 0.99
    assert r["resource"].startswith("10.0.0.1 <- 10.0.1.1, ") and r["resource"].count("10.0.1.") == 8
    t = r["explanation"]
    assert "8 servers' answers in flight at once (up to 8) in 6 fan-out rounds; in 6 of them (100%)" in t
    assert "12 flows (median 2, up to 2 per round, from 8 servers)" in t
    assert "first silence of 200 ms on a 50 µs base RTT (4,000x)" in t
    rounds = ir.rounds(ir.flows(cap, incast.Params()), incast.Params())
    assert rounds["fan_in"].to_list() == [8] * 6 and rounds["timed_out"].to_list() == [2] * 6
    assert rounds["incast"].all() and (rounds["round_ns"] > 200 * MS).all() and (rounds["ideal_ns"] < MS).all()


def test_fewer_incast_rounds_are_medium_and_a_lower_bar_never_removes_the_finding(read_capture):
    cap = fan_out(read_capture, rounds=6, lost={0: {1}, 3: {5}})
    r = detect(cap).row(0, named=True)
    # 2 of 6 rounds: high needs 5 incast rounds (and half the rounds), however much the two rounds lost
    # (2 x 200 ms against 6 x 0.3 ms of work: nearly all the goodput of the six)
    assert r["severity"] == "medium" and r["value"] > 0.99
    assert detect(cap, medium_rounds=3).row(0, named=True)["severity"] == "low"
    assert detect(cap, high_rounds=2, high_round_share=0.3).row(0, named=True)["severity"] == "critical"
    assert detect(cap, high_rounds=2, high_round_share=0.3, critical_lost_share=1.0).row(
        0, named=True)["severity"] == "high"
    assert detect(cap, high_rounds=2, high_round_share=0.4).row(0, named=True)["severity"] == "medium"


def test_it_explains_tcp_stalls_rto_findings_of_its_rounds(read_capture):
    import detectors

    cap = fan_out(read_capture)
    found = detectors.run(cap, only=["tcp_stall", "incast"])
    top = found.filter(pl.col("member_of").is_null())
    (inc,) = top.filter(pl.col("detector") == "incast").iter_rows(named=True)
    rto = found.filter((pl.col("detector") == "tcp_stall") & (pl.col("kind") == "rto"))
    assert rto.height == 8 and (rto["member_of"] == inc["finding_id"]).all()
    assert inc["members"] == 8 and "8 tcp_stall/rto finding(s)" in inc["explanation"]
    assert top.height == 1  # one cause, one finding


def test_staggered_answers_are_not_incast(read_capture):
    # the same timeouts, but each server asked 5 ms after the previous one: the answers never overlap
    cap = fan_out(read_capture, stagger=5 * MS)
    assert detect(cap).height == 0
    assert tcp_stall.detect(cap).filter(pl.col("kind") == "rto").height == 8  # tcp_stall's, alone


def test_a_single_lossy_path_is_at_most_low(read_capture):
    cap = fan_out(read_capture, lost={k: {3} for k in range(6)})
    r = detect(cap).row(0, named=True)
    assert r["kind"] == "single_path" and r["severity"] == "low" and r["server"] == "10.0.1.4"
    assert "every timeout came from 1 server(s): that may be a single lossy path" in r["explanation"]
    relaxed = detect(cap, min_timed_out_servers=1).row(0, named=True)
    assert relaxed["kind"] == "incast" and relaxed["severity"] == "critical"


def test_a_single_lossy_path_explains_nothing(read_capture):
    import detectors

    found = detectors.run(fan_out(read_capture, lost={k: {3} for k in range(6)}), only=["tcp_stall", "incast"])
    (r,) = found.filter(pl.col("detector") == "incast").iter_rows(named=True)
    assert r["members"] == 0 and r["severity"] == "low"  # not raised to its would-be member's severity
    assert found.filter(pl.col("detector") == "tcp_stall")["member_of"].is_null().all()


def test_a_timer_in_proportion_to_a_slow_path_is_not_incast(read_capture):
    # 250 ms silences on a 40 ms path are 6 RTTs: ordinary loss recovery, not a minimum RTO out of scale
    cap = fan_out(read_capture, rtt=40 * MS, period=1000 * MS, gap=250 * MS)
    assert detect(cap).height == 0
    assert detect(cap, min_gap_rtts=5.0).height == 1


def test_two_servers_are_no_fan_out_unless_asked(read_capture):
    cap = fan_out(read_capture, n=2, lost={k: {k % 2} for k in range(6)})
    assert detect(cap).height == 0
    assert detect(cap, min_fan_in=2).height == 1


def test_nothing_to_judge_is_no_finding(read_capture):
    from fakes import FakeCapture

    assert detect(FakeCapture()).height == 0  # no TCP frames at all
    one = read_capture(tcp_conversation(handshake(0)), name="one.pcap")
    assert detect(one).height == 0 and ir.flows(one, incast.Params()).height == 0


# -- the real recording ---------------------------------------------------------------------------

SAMPLE = ROOT / "samples" / "tcp-incast.pcap"
TWIN = ROOT / "samples" / "tcp-incast-healthy.pcap"


def _measured(name):
    entries = tomllib.loads((ROOT / "samples" / "MANIFEST.toml").read_text())["capture"]
    return next(e for e in entries if e["file"] == name)["measured"]


@pytest.mark.skipif(not SAMPLE.exists(), reason="real sample not recorded")
def test_real_incast_recording_agrees_with_the_servers_counters():
    m = _measured(SAMPLE.name)
    f = shared_run(SAMPLE)
    (r,) = f.filter(pl.col("detector") == "incast").iter_rows(named=True)
    assert r["severity"] in ("high", "critical") and r["client"] == "10.77.14.1" and r["value"] > 0.5
    flows = ir.flows(shared_capture(SAMPLE), incast.Params())
    rounds = ir.rounds(flows, incast.Params())
    assert rounds.filter(pl.col("fanout")).height == m["rounds"]  # the client's 12 rounds, no more
    assert rounds["incast"].sum() >= m["rounds_with_slow_flows"] - 1
    # flows timed out against the servers' own TcpExtTCPTimeouts (a flow may time out twice)
    timed_out = int(rounds["timed_out"].sum())
    assert 0.7 * m["server_tcp_timeouts"] <= timed_out <= 1.3 * m["server_tcp_timeouts"]
    rto = f.filter((pl.col("detector") == "tcp_stall") & (pl.col("kind") == "rto"))
    assert rto.height > 0 and (rto["member_of"] == r["finding_id"]).all()


@pytest.mark.skipif(not TWIN.exists(), reason="real sample not recorded")
def test_real_staggered_twin_is_silent():
    f = shared_run(TWIN)
    assert f.filter(pl.col("detector") == "incast").height == 0
    rounds = ir.rounds(ir.flows(shared_capture(TWIN), incast.Params()), incast.Params())
    assert rounds.filter(pl.col("fanout")).height == 0 and rounds["fan_in"].max() <= 2


@pytest.mark.skipif(not SAMPLE.exists(), reason="real sample not recorded")
def test_proof_chart_draws_the_rounds_and_the_slowest_flows():
    from dashboards.proofs.base import proof_charts

    f = shared_run(SAMPLE)
    finding = f.filter(pl.col("detector") == "incast").row(0, named=True)
    (rounds, flows) = proof_charts(shared_capture(SAMPLE), finding)
    spec = flows[0].to_dict()
    assert "slowest incast rounds" in spec["title"]["text"]
    assert len(spec["title"]["subtitle"]) == 3 and "base RTT" in spec["title"]["subtitle"][0]
    assert "round time" in str(rounds[0].to_dict())
