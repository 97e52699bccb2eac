"""rnr_retry: RNR NAK loops, on constructed rows (tests/rocev2_rows.py) and on the generated RoCEv2 captures
(tests/rocev2_captures.py: GENERATED, see samples/rocekit/README.md)."""
from __future__ import annotations

import re

import polars as pl
import pytest

import detectors
from analyzer import open_capture
from detectors import rnr_retry
from detectors.base import SEVERITY_RANK
from rocev2_captures import labels, rocev2_capture
from rocev2_rows import SEND_ONLY, Qp, capture

from fakes import FakeCapture

US = 1_000
MS = 1_000_000
DELAY_12 = 640 * US  # IBA Table 45: timer code 12


def run(cap, **overrides) -> pl.DataFrame:
    return detectors.run(cap, only=["rnr_retry"], overrides={f"rnr_retry.{k}": v for k, v in overrides.items()})


def starving(messages: int = 5, wait_ns: int = DELAY_12 + US, naks_per_message: int = 1, qp: Qp | None = None,
             t0: int = 0) -> Qp:
    """A SEND every 100 µs to a responder with no receive WQE: each is RNR NAKed (code 12)
    ``naks_per_message`` times, retried ``wait_ns`` after each NAK, then ACKed."""
    q = qp or Qp()
    t = t0
    for psn in range(messages):
        t = max(t, t0 + psn * 100 * US)
        q.send(t, psn, opcode=SEND_ONLY)
        for _ in range(naks_per_message):
            q.rnr(t + 2 * US, psn, timer=12)
            t += 2 * US + wait_ns
            q.send(t, psn, opcode=SEND_ONLY)
        q.ack(t + 2 * US, psn)
    return q


def test_an_rnr_loop_reports_naks_waits_and_the_timer_against_the_rtt():
    f = run(capture(starving()))
    assert f.height == 1
    r = f.row(0, named=True)
    assert (r["kind"], r["severity"], r["metric"]) == ("rnr_loop", "high", "rnr_wait_ms")
    assert r["resource"] == "10.0.0.1:qp0x2e1->10.1.0.1:qp0x381"
    assert r["value"] == pytest.approx(5 * (DELAY_12 + 1 * US) / MS)
    text = r["explanation"]
    assert "5 RNR NAK(s) (timer code 12 = 640 µs (IBA Table 45), 320 × the QP's 2 µs ACK turnaround)" in text
    assert "for 5 message(s), up to 1 per message" in text and "not the DMA" in text
    rows = capture(starving()).frame("rocev2_packets")
    naks = rows.filter(pl.col("aeth_kind") == "rnr_nak")["frame"].to_list()
    assert set(naks) <= set(r["evidence_frames"]) and len(r["evidence_frames"]) == 10  # the NAKs and their retries
    assert r["start_ns"] == rows.filter(pl.col("aeth_kind") == "rnr_nak")["ts_ns"].min()


def test_severity_steps_follow_their_parameters():
    cap = capture(starving())
    # 5 NAKs are no loop then, but the QP waited through nearly all its 3.2 ms: medium by that share
    assert run(cap, loop_min_naks=6)["severity"].to_list() == ["medium"]
    assert run(cap, loop_min_naks=6, share_min_naks=6)["severity"].to_list() == ["low"]
    assert run(cap, loop_min_naks=6, medium_wait_share=1.0)["severity"].to_list() == ["low"]
    assert run(cap, high_lost_ns=10 * MS)["severity"].to_list() == ["medium"]
    assert run(cap, high_lost_rtts=2000.0)["severity"].to_list() == ["medium"]  # 3.2 ms is 1,600 RTTs of 2 µs
    assert run(cap, min_naks=6).height == 0


def test_one_rnr_nak_is_low():
    r = run(capture(starving(messages=1))).row(0, named=True)
    assert r["severity"] == "low" and "1 RNR NAK(s)" in r["explanation"]


def busy(until_ns: int, qp: Qp) -> Qp:
    """``qp``'s own SENDs, one every 100 µs up to ``until_ns``, each ACKed (PSNs from 1000)."""
    for k in range(until_ns // (100 * US)):
        qp.send(k * 100 * US + 50 * US, 1000 + k, opcode=SEND_ONLY).ack(k * 100 * US + 52 * US, 1000 + k)
    return qp


def test_two_rnr_naks_are_medium_when_the_qp_spent_its_time_waiting():
    """Two RNR NAKs (code 12: 641 µs each) are a starved QP in the 1.3 ms it was seen (medium: it was
    low when medium needed a 3-NAK loop), but a rounding error of a QP busy for 0.9 s (low; its share
    is over the episode_gap_ns / 2 around the NAKs: 501 ms): severity by the share of the QP's time
    spent waiting, not by the count alone. Two pipelined SENDs NAKed at
    once wait together: the union of the waits, not their sum."""
    r = run(capture(starving(messages=2))).row(0, named=True)
    assert r["severity"] == "medium" and "2 RNR NAK(s)" in r["explanation"]
    assert "a NAKed request waiting during 1.28 ms of the 1.29 ms the QP was seen (99.5 %)" in r["explanation"]
    long = run(capture(busy(900 * MS, starving(messages=2)))).row(0, named=True)
    assert long["severity"] == "low" and "of the 501 ms the QP was seen (0.26 %)" in long["explanation"]
    q = Qp()  # two SENDs in flight, both NAKed, both retried after one delay
    q.send(0, 0, opcode=SEND_ONLY).send(1 * US, 1, opcode=SEND_ONLY)
    q.rnr(3 * US, 0, timer=12).rnr(4 * US, 1, timer=12)
    q.send(3 * US + DELAY_12, 0, opcode=SEND_ONLY).send(4 * US + DELAY_12, 1, opcode=SEND_ONLY)
    q.ack(6 * US + DELAY_12, 1)
    r = run(capture(q)).row(0, named=True)
    assert "waited 1.28 ms in all" in r["explanation"] and "waiting during 641 µs of the 646 µs" in r["explanation"]


def test_retries_per_message_beyond_rnr_retry_are_exhausted():
    cap = capture(starving(messages=2, naks_per_message=3))
    r = run(cap).row(0, named=True)
    assert r["severity"] == "high" and "up to 3 per message" in r["explanation"]  # rnr_retry 7: for ever
    r = run(cap, rnr_retry=2).row(0, named=True)
    assert r["severity"] == "critical" and "more than rnr_retry 2" in r["explanation"]
    assert run(cap, rnr_retry=3)["severity"].to_list() == ["high"]


def test_a_nak_never_retried_while_the_capture_goes_on_is_giving_up():
    q = Qp()
    q.send(0, 7, opcode=SEND_ONLY).rnr(2 * US, 7, timer=12)
    other = Qp(pair=2, requester="10.0.0.9", rq=0x99, sq=0x98, sport=0xC999)
    for k in range(10):
        other.send(k * MS, k).ack(k * MS + 2 * US, k)
    r = run(capture(q, other)).row(0, named=True)
    assert r["severity"] == "critical" and "never retried and the QP went quiet" in r["explanation"]
    assert run(capture(q, other), gone_delays=100.0)["severity"].to_list() == ["low"]  # 9 ms is not 64 ms


def test_a_retry_sooner_than_the_timer_is_said():
    r = run(capture(starving(wait_ns=100 * US))).row(0, named=True)
    assert "5 retry(ies) came sooner than the timer's delay" in r["explanation"]


def test_a_missing_requester_direction_is_informational_and_says_why():
    r = run(capture(starving().without("10.0.0.1"))).row(0, named=True)
    assert r["severity"] == "informational"
    assert r["resource"] == "10.0.0.1:qp0x2e1->10.1.0.1:qp?"
    assert "requester->responder direction missing" in r["explanation"]
    assert "never retried" not in r["explanation"] and not r["explanation"].count("exhausted")


def test_many_starved_qps_of_one_responder_are_one_finding():
    qps = [starving(qp=Qp(pair=k, requester=f"10.0.0.{k}", rq=0x100 + k, sq=0x200 + k, sport=0xC100 + k), t0=k * 13)
           for k in range(1, 5)]
    r, = run(capture(*qps)).rows(named=True)
    assert (r["resource"], r["clients"], r["severity"]) == ("4 QPs to 10.1.0.1", 4, "high")
    assert run(capture(*qps), population_min_qps=5).height == 4


def test_one_qp_split_in_time_is_not_counted_as_many_qps():
    # four bursts of one QP, further apart than episode_gap_ns: four findings of that QP, never "4 QPs"
    q = Qp()
    for k in range(4):
        starving(qp=q, t0=k * 10 * MS)
    out = run(capture(q), episode_gap_ns=5 * MS)
    assert out.height == 4 and set(out["resource"]) == {"10.0.0.1:qp0x2e1->10.1.0.1:qp0x381"}


def test_tied_timer_codes_name_one_code_with_its_own_delay():
    q = Qp()
    for psn, timer in enumerate((14, 12, 20)):  # each code once: the mode is a tie
        t = psn * 100 * MS
        q.send(t, psn, opcode=SEND_ONLY).rnr(t + 2 * US, psn, timer=timer).send(t + 200 * MS, psn, opcode=SEND_ONLY)
    text = run(capture(q)).row(0, named=True)["explanation"]
    assert "timer code 12 = 640 µs (IBA Table 45), the most common of 3 codes" in text


def test_no_rocev2_traffic_is_nothing_to_report():
    assert run(FakeCapture()).height == 0 and run(capture()).height == 0
    q = Qp()
    for psn in range(20):
        q.send(psn * 1_000, psn).ack(psn * 1_000 + 2_000, psn)
    assert run(capture(q)).height == 0
    assert rnr_retry.nak_retries(*_req_rsp(q), 1).height == 0


def _req_rsp(q):
    from detectors import rocev2_common as rc

    rows = rc.rc_packets(capture(q).frame("rocev2_packets"))
    return rc.requests(rows), rc.responses(rows)


# -- generated captures (GENERATED: samples/rocev2_synth.py) -------------------------------------------------

def found(scenario: str, scale: float = 0.1, seed: int = 1) -> tuple[pl.DataFrame, list[dict]]:
    path = rocev2_capture(scenario, scale=scale, seed=seed)
    with open_capture(path) as cap:
        return run(cap), labels(path)


@pytest.mark.parametrize("scale,seed", [(0.1, 1), (0.25, 2)])
def test_rnr_loop_is_found_with_its_naks_and_timer(scale, seed):
    f, labs = found("rnr-loop", scale, seed)
    lab, = labs
    r, = f.rows(named=True)
    assert (r["resource"], r["kind"]) == (lab["resource"], "rnr_loop")
    assert SEVERITY_RANK[r["severity"]] >= SEVERITY_RANK["medium"]
    p = lab["parameters"]
    assert int(re.search(r"(\d+) RNR NAK\(s\)", r["explanation"]).group(1)) == p["rnr_naks"]
    assert f"timer code {p['rnr_timer_code']} = 640 µs" in r["explanation"]
    assert r["value"] * MS >= p["rnr_naks"] * p["rnr_delay_ns"] * 0.95  # each NAK cost at least its delay
    assert r["start_ns"] <= lab["end_ns"] and r["end_ns"] >= lab["start_ns"]


@pytest.mark.parametrize("scenario", ["rnr-loop-healthy", "healthy", "gbn-storm", "gbn-storm-healthy", "ack-timeout",
                                      "pfc-storm", "incast", "cnp-ignored"])
def test_twins_and_other_pathologies_have_no_rnr_loop(scenario):
    f, _ = found(scenario)
    assert all(SEVERITY_RANK[s] < SEVERITY_RANK["medium"] for s in f["severity"]), f.select(
        "severity", "resource", "explanation").rows()


def test_the_proof_ladder_marks_the_rnr_naks_and_their_retries():
    from dashboards import proofs

    path = rocev2_capture("rnr-loop")
    with open_capture(path) as cap:
        finding = run(cap).row(0, named=True)
        (chart, caption), = proofs.proof_charts(cap, finding)
        rows = cap.frame("rocev2_packets")
    spec = chart.to_dict(validate=True)
    assert spec["title"]["text"].endswith("RNR NAK loop")
    drawn = {r["frame"]: r["mark"] for rows_ in spec["datasets"].values() for r in rows_ if "mark" in r}
    naks = rows.filter(pl.col("aeth_kind") == "rnr_nak")["frame"].to_list()
    assert {drawn[n] for n in naks} == {"RNR NAK"}
    retries = [fr for fr in finding["evidence_frames"] if fr not in naks]
    assert retries and {drawn[fr] for fr in retries} == {"retried after RNR NAK"}
    assert "resent (go-back-N)" not in drawn.values()  # RNR waits are not go-back-N
    assert "RNR" in caption
