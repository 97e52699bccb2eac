"""gbn_retransmission: go-back-N episodes after a NAK or an ACK timeout, on constructed rows (tests/rocev2_rows.py)
and on the generated RoCEv2 captures (tests/rocev2_captures.py: GENERATED, see samples/rocekit/README.md)."""
from __future__ import annotations

import re

import polars as pl
import pytest

import detectors
from analyzer import open_capture
from detectors import gbn_retransmission as gbn
from detectors.base import SEVERITY_RANK
from rocev2_captures import labels, rocev2_capture
from rocev2_rows import Qp, capture, gbn_trace

from fakes import FakeCapture

MS = 1_000_000
TIMEOUT_14_NS = 4096 << 14  # IBA §9.7.6.1.3: 4.096 µs x 2^14 = 67.1 ms


def run(cap, **overrides) -> pl.DataFrame:
    return detectors.run(cap, only=["gbn_retransmission"],
                         overrides={f"gbn_retransmission.{k}": v for k, v in overrides.items()})


def storm(**kw) -> Qp:
    q = Qp()
    gbn_trace(q, n=400, losses=(50, 150, 250), **kw)
    return q


# -- constructed rows --------------------------------------------------------------------------------

def test_nak_storm_counts_resends_per_psn_lost():
    f = run(capture(storm()))
    assert f.height == 1
    r = f.row(0, named=True)
    # each loss: the lost PSN and the 30 sent before the NAK came back are resent (gbn_trace's nak_after)
    assert (r["kind"], r["metric"], r["value"], r["severity"]) == ("nak", "amplification", 31.0, "high")
    assert r["resource"] == "10.0.0.1:qp0x2e1->10.1.0.1:qp0x381"  # requester's QPN from its responses' DestQP
    assert (r["client"], r["server"]) == ("10.0.0.1", "10.1.0.1")
    assert "3 episode(s), 93 PSNs resent for 3 lost" in r["explanation"]
    assert "3 NAK(s) (PSN sequence error)" in r["explanation"] and "not the DMA" in r["explanation"]
    naks = capture(storm()).frame("rocev2_packets").filter(pl.col("aeth_kind") == "nak")["frame"].to_list()
    assert len(naks) == 3 and set(naks) <= set(r["evidence_frames"])
    assert r["start_ns"] == capture(storm()).frame("rocev2_packets").filter(
        pl.col("aeth_kind") == "nak")["ts_ns"].min()  # the first NAK


def test_packets_with_a_transport_version_other_than_0_are_not_the_transport():
    """A receiver drops a BTH with TVer != 0 (IBA §9.2.2): the same storm with its packets' TVer set is
    nothing (and random bytes on UDP 4791 mostly fail this test)."""
    pk = capture(storm()).frame("rocev2_packets")
    assert run(capture(storm())).height == 1
    assert run(FakeCapture(rocev2_packets=pk.with_columns(pl.lit(1, pl.UInt8).alias("tver")))).height == 0


def test_severity_steps_follow_their_parameters():
    cap = capture(storm())  # 3 episodes, 93 of 493 requests resent (19 %), 31 per loss
    # 3 episodes are not a storm then (no high), but resending 19 % of the traffic is still medium ...
    assert run(cap, storm_episodes=4)["severity"].to_list() == ["medium"]
    assert run(cap, storm_episodes=4, medium_resent_share=0.2)["severity"].to_list() == ["low"]  # ... not 20 %
    assert run(cap, high_resent_share=0.2)["severity"].to_list() == ["medium"]
    assert run(cap, high_amplification=40.0)["severity"].to_list() == ["medium"]
    assert run(cap, medium_amplification=40.0, high_amplification=40.0)["severity"].to_list() == ["low"]
    assert run(cap, min_resent=94).height == 0 and run(cap, min_resent=93).height == 1


def test_one_loss_is_rated_by_the_share_of_the_traffic_it_cost():
    """One loss resending 101 PSNs of a 300-request QP is a third of its goodput: medium (it was low
    when medium needed 3 episodes); the same loss once the QP has sent 24,800 PSNs more (0.4 %) is an
    isolated incident: low. Neither is high: high is a storm, the loss repeating."""
    q = Qp()
    gbn_trace(q, n=200, losses=(50,), nak_after=100)
    r = run(capture(q)).row(0, named=True)
    assert r["severity"] == "medium" and r["value"] == 101.0 and "1 episode(s)" in r["explanation"]
    # 199 PSNs captured once and 101 resent: 300 requests; 30 µs of them at one every 100 ns
    assert "the resends were 33.7 % of the QP's 300 requests" in r["explanation"]
    assert "1 loss(es) in its 30 µs of requests (~33,333/s)" in r["explanation"]
    long = Qp()
    gbn_trace(long, n=25_000, losses=(50,), nak_after=100)
    r = run(capture(long)).row(0, named=True)
    assert (r["severity"], r["value"]) == ("low", 101.0) and "0.4 % of the QP's 25,100 requests" in r["explanation"]


def test_an_isolated_loss_in_a_long_healthy_capture_stays_low():
    """One NAKed loss (41 PSNs resent) among 20,000 requests of a QP over 20 ms: 0.2 % of its traffic,
    low (the other QPs' traffic is not part of its share); five such losses in the same capture are a
    storm (1 % of the traffic: medium, not the 2 % of high)."""
    q = Qp()
    gbn_trace(q, n=20_000, losses=(10_000,), nak_after=40, gap_ns=1_000)
    others = [Qp(pair=k, requester=f"10.0.0.{k}", rq=0x100 + k, sq=0x200 + k, sport=0xC100 + k) for k in (2, 3)]
    for o in others:
        gbn_trace(o, n=1_000, gap_ns=20_000)
    f = run(capture(q, *others))
    assert f.select("severity", "value").rows() == [("low", 41.0)]
    assert "0.2 % of the QP's 20,040 requests" in f["explanation"][0]
    storm5 = Qp()
    gbn_trace(storm5, n=20_000, losses=tuple(range(2_000, 20_000, 4_000)), nak_after=40, gap_ns=1_000)
    assert run(capture(storm5)).select("severity", "value").rows() == [("medium", 41.0)]


def test_psn_wrap_is_one_step_and_healthy_traffic_is_silent():
    wrapped = Qp()
    gbn_trace(wrapped, n=400, losses=(50, 150, 250), psn0=(1 << 24) - 200)  # the PSN wraps inside the run
    assert run(capture(wrapped)).select("value", "severity").rows() == [(31.0, "high")]
    clean = Qp()
    gbn_trace(clean, n=400, psn0=(1 << 24) - 200)
    assert run(capture(clean)).height == 0


def timeout_qp(resends: int = 1, gap_ns: int = TIMEOUT_14_NS + 1_000) -> Qp:
    """100 PSNs, ACKs up to PSN 79 captured, then the ACK timer resends 80..99 ``resends`` times."""
    q = Qp()
    for psn in range(100):
        q.send(psn * 100, psn)
        if psn % 16 == 15 and psn < 80:
            q.ack(psn * 100 + 2_000, psn)
    t = 99 * 100
    for _ in range(resends):
        t += gap_ns
        for psn in range(80, 100):
            q.send(t + (psn - 80) * 100, psn)
    return q


def test_ack_timeout_after_a_silence_names_the_timer():
    q = timeout_qp()
    q.ack(99 * 100 + TIMEOUT_14_NS + 5_000, 99)
    f = run(capture(q))
    r = f.row(0, named=True)
    assert (f.height, r["kind"], r["severity"], r["metric"]) == (1, "timeout", "high", "timeout_stall_ms")
    assert r["value"] == pytest.approx(TIMEOUT_14_NS / MS, rel=0.01)
    assert "4.096 µs × 2^14 = 67.1 ms" in r["explanation"] and "20 PSNs the mirror had seen" in r["explanation"]
    rows = capture(q).frame("rocev2_packets")
    before = rows.filter(pl.col("ts_ns") < r["end_ns"] - 10 * MS)["frame"].max()  # what the timer started from
    assert before in r["evidence_frames"] and r["start_ns"] == rows.filter(pl.col("frame") == before)["ts_ns"][0]
    # on both scales: 67 ms is far above timeout_high_ns but, with the RTT scale raised past its ~33,000 RTTs, medium
    assert run(capture(q), timeout_high_rtts=50_000.0)["severity"].to_list() == ["medium"]
    assert run(capture(q), timeout_medium_ns=100 * MS, timeout_high_ns=100 * MS)["severity"].to_list() == ["low"]


def test_a_quick_resend_without_a_nak_is_no_timer():
    q = timeout_qp(gap_ns=3_000)  # 3 µs of silence: no ACK timer is that short (min 8.2 µs)
    r = run(capture(q)).row(0, named=True)
    assert (r["kind"], r["severity"]) == ("nak", "low")
    assert "no NAK captured" in r["explanation"]


def bystander(until_ns: int) -> Qp:
    """Another QP's traffic to ``until_ns``: the capture goes on."""
    q = Qp(pair=9, requester="10.0.0.9", rq=0x99, sq=0x98, sport=0xC999)
    for k in range(0, until_ns, MS):
        q.send(k, k // MS).ack(k + 2_000, k // MS)
    return q


def test_retry_count_exhausted_is_critical():
    q = timeout_qp(resends=7, gap_ns=4096 << 10)  # PSN 80: the original and 7 retries, never acknowledged
    after = bystander(8 * (4096 << 10) + 10 * MS)  # ... and the QP silent while the capture goes on
    r = run(capture(q, after)).row(0, named=True)
    assert (r["kind"], r["severity"]) == ("timeout", "critical")
    assert "retry count exhausted: one PSN sent 8 times" in r["explanation"]
    assert run(capture(q))["severity"].to_list() == ["high"]  # the capture ends there: cannot tell
    six = timeout_qp(resends=6, gap_ns=4096 << 10)
    assert run(capture(six, after))["severity"].to_list() == ["high"]
    assert run(capture(six, after), retry_cnt=6)["severity"].to_list() == ["critical"]
    # without the responder's direction "never acknowledged" cannot be seen: no exhausted claim
    blind = run(capture(timeout_qp(resends=7, gap_ns=4096 << 10).without("10.1.0.1"), after)).row(0, named=True)
    assert blind["severity"] == "informational" and "exhausted" not in blind["explanation"]


def test_a_missing_responder_direction_is_informational_and_says_why():
    q = storm().without("10.1.0.1")
    r = run(capture(q)).row(0, named=True)
    assert r["severity"] == "informational"
    assert r["resource"] == "10.0.0.1:qp?->10.1.0.1:qp0x381"  # the requester's QPN is only in its responses
    assert "responder->requester direction missing" in r["explanation"]


def test_resends_after_an_rnr_nak_are_not_go_back_n():
    q = Qp()
    for psn in range(4):
        q.send(psn * 100, psn, opcode=0x04)
    q.rnr(1_000, 2, timer=12)
    for psn in range(2, 4):
        q.send(1_000 + 640_000 + 500 + psn * 100, psn, opcode=0x04)
    q.ack(700_000, 3)
    assert run(capture(q)).height == 0


def test_many_qps_to_one_responder_are_one_finding():
    qps = [Qp(pair=k, requester=f"10.0.0.{k}", rq=0x100 + k, sq=0x200 + k, sport=0xC100 + k) for k in range(1, 5)]
    for k, q in enumerate(qps):
        gbn_trace(q, n=400, losses=(50, 150, 250), t0=k * 37)
    f = run(capture(*qps))
    assert f.height == 1
    r = f.row(0, named=True)
    assert (r["resource"], r["clients"], r["severity"]) == ("4 QPs to 10.1.0.1", 4, "high")
    assert all(f"10.0.0.{k}:qp0x{0x100 + k:x}" in r["explanation"] for k in range(1, 5))
    assert run(capture(*qps), population_min_qps=5).height == 4


def test_no_rocev2_traffic_is_nothing_to_report():
    assert run(FakeCapture()).height == 0
    assert run(capture()).height == 0


def test_timeout_exponent_is_the_nearest_timer():
    assert gbn.timeout_exponent(TIMEOUT_14_NS - 3_000) == 14 and gbn.timeout_exponent(TIMEOUT_14_NS + 9_000) == 14
    assert gbn.timeout_exponent(8_192) == 1 and gbn.timeout_exponent(1_000) is None


# -- generated captures (GENERATED: samples/rocev2_synth.py) -------------------------------------------------

def found(scenario: str, scale: float = 0.1, seed: int = 1) -> tuple[pl.DataFrame, list[dict]]:
    path = rocev2_capture(scenario, scale=scale, seed=seed)
    with open_capture(path) as cap:
        return run(cap), labels(path)


@pytest.mark.parametrize("scale,seed", [(0.1, 1), (0.25, 2)])
def test_gbn_storm_is_found_per_qp_with_its_amplification(scale, seed):
    f, labs = found("gbn-storm", scale, seed)
    assert sorted(f["resource"]) == sorted(lab["resource"] for lab in labs) and len(labs) == 3
    for lab in labs:
        r = f.filter(pl.col("resource") == lab["resource"]).row(0, named=True)
        assert r["kind"] == lab["parameters"]["trigger"] == "nak"
        assert SEVERITY_RANK[r["severity"]] >= SEVERITY_RANK["medium"]
        assert r["value"] == pytest.approx(lab["parameters"]["amplification"], rel=0.15)
        resent = int(re.search(r"([\d,]+) PSNs resent", r["explanation"]).group(1).replace(",", ""))
        assert resent == pytest.approx(lab["parameters"]["retransmitted"], rel=0.05)
        assert r["start_ns"] <= lab["end_ns"] and r["end_ns"] >= lab["start_ns"]


@pytest.mark.parametrize("scale,seed", [(0.1, 1), (0.1, 3)])
def test_ack_timeout_is_found_with_its_timer(scale, seed):
    f, labs = found("ack-timeout", scale, seed)
    lab, = labs
    r, = f.rows(named=True)
    assert (r["kind"], r["resource"], r["severity"]) == ("timeout", lab["resource"], "high")
    assert r["value"] * MS == pytest.approx(lab["parameters"]["ack_timeout_ns"], rel=0.01)
    assert f"2^{lab['parameters']['timeout_exp']} " in r["explanation"]
    assert r["start_ns"] <= lab["end_ns"] and r["end_ns"] >= lab["start_ns"]


@pytest.mark.parametrize("scenario", ["gbn-storm-healthy", "ack-timeout-healthy", "healthy", "rnr-loop",
                                      "rnr-loop-healthy", "pfc-storm", "pfc-storm-healthy", "incast", "incast-healthy",
                                      "cnp-ignored"])
def test_twins_and_other_pathologies_stay_below_medium(scenario):
    f, _ = found(scenario)
    assert all(SEVERITY_RANK[s] < SEVERITY_RANK["medium"] for s in f["severity"]), f.select(
        "severity", "resource", "explanation").rows()


def test_a_coarse_timestamp_tick_is_said():
    r = run(capture(storm(), resolution_ns=1_000.0)).row(0, named=True)
    assert "within 10 ticks of the capture's 1 µs timestamp resolution" in r["explanation"]


# -- the proof: the PSN ladder ----------------------------------------------------------------------------

def _datasets(spec: dict) -> list[dict]:
    return [row for rows in spec["datasets"].values() for row in rows]


def test_the_proof_ladder_marks_the_resends_and_naks_of_the_finding():
    from dashboards import proofs
    from dashboards.charts.base import MAX_ROWS

    path = rocev2_capture("gbn-storm")
    with open_capture(path) as cap:
        f = run(cap)
        finding = f.filter(pl.col("resource") == labels(path)[0]["resource"]).row(0, named=True)
        (chart, caption), = proofs.proof_charts(cap, finding)
        rows = cap.frame("rocev2_packets")
    spec = chart.to_dict(validate=True)
    assert spec["title"]["text"].startswith(f"PSN ladder of {finding['resource']}: go-back-N after NAKs")
    points = _datasets(spec)
    drawn = {r["frame"]: r["mark"] for r in points if "mark" in r}
    naks = rows.filter(pl.col("aeth_kind") == "nak")["frame"].to_list()
    assert {drawn.get(n) for n in naks if n in finding["evidence_frames"]} == {"NAK (PSN sequence error)"}
    resends = [fr for fr in finding["evidence_frames"] if fr not in naks]
    assert resends and {drawn[fr] for fr in resends} == {"resent (go-back-N)"}
    assert {"sent", "ACK"} <= set(drawn.values())
    assert all(len(v) <= MAX_ROWS for v in spec["datasets"].values())
    assert "go-back-N" in caption
    # opens on the finding's window with µs-scale context, not the dashboards' 1 s minimum
    lo, hi = spec["vconcat"][0]["layer"][-1]["encoding"]["x"]["scale"]["domain"] if "vconcat" in spec else \
        spec["layer"][-1]["encoding"]["x"]["scale"]["domain"]
    t0 = int(rows["ts_ns"].min())
    assert lo <= (finding["start_ns"] - t0) / 1e9 and hi >= (finding["end_ns"] - t0) / 1e9 and hi - lo < 0.01


def test_hostile_rows_never_crash():
    """Random PSNs, opcodes, NAK codes, missing fields and truncated rows: findings or nothing, never an error."""
    import random

    rng = random.Random(7)
    qps = [Qp(pair=k, requester=f"10.0.0.{k}", rq=k, sq=100 + k, sport=0xC000 + k) for k in range(1, 4)]
    t = 0
    for _ in range(3000):
        q = rng.choice(qps)
        t += rng.choice([0, 1, 50, 5_000, 70_000_000])
        psn = rng.choice([rng.randrange(1 << 24), rng.randrange(40)])
        pick = rng.random()
        if pick < 0.6:
            q.send(t, psn, opcode=rng.choice([0x00, 0x04, 0x06, 0x07, 0x0C, 0x13]))
        elif pick < 0.75:
            q.ack(t, psn)
        elif pick < 0.85:
            q.nak(t, psn, code=rng.randrange(5))
        elif pick < 0.95:
            q.rnr(t, psn, timer=rng.randrange(32))
        else:
            q.send(t, psn)
            q.rows[-1].update(status="truncated", psn=None, opcode=None)
    cap = capture(*qps)
    for name in ("gbn_retransmission", "rnr_retry"):
        out = detectors.run(cap, only=[name])
        assert out.height == out["finding_id"].n_unique()  # one id per finding, always
        assert set(out["severity"].cast(pl.String)) <= set(SEVERITY_RANK)


def test_the_ladder_keeps_its_row_budget_and_says_what_it_left_out():
    from dashboards.charts.base import MAX_ROWS, chart_notes
    from dashboards.charts.psn_ladder import RESENT, SENT, psn_ladder

    n = MAX_ROWS + 1_000
    pts = pl.concat([pl.DataFrame({"qp": [f"qp{k}"] * n, "t_ns": list(range(n)), "frame": list(range(n)),
                                   "psn_rel": list(range(n)), "psn": list(range(n)),
                                   "mark": [RESENT if i % 500 == 0 else SENT for i in range(n)],
                                   "detail": [None] * n}, schema_overrides={"detail": pl.String}) for k in range(4)])
    chart = psn_ladder(pts, t0_ns=0, window_ns=(100, 200), focus=["qp3"])
    spec = chart.to_dict(validate=True)
    notes = chart_notes(chart)
    assert any(x.startswith("sampled:") for x in notes) and any("first 3 of 4 QP directions" in x for x in notes)
    points = [r for rows in spec["datasets"].values() for r in rows if "mark" in r]
    assert all(len(v) <= MAX_ROWS for v in spec["datasets"].values()) and sum(r["mark"] == RESENT for r in points) == 3 * len(range(0, n, 500))
    assert "qp3" in spec["vconcat"][0]["layer"][1]["encoding"]["y"]["title"]  # the finding's QP first


def test_storms_far_apart_are_separate_findings():
    q = Qp()
    end = gbn_trace(q, n=400, losses=(50, 150, 250))
    gbn_trace(q, n=400, losses=(50, 150, 250), t0=end + 2_000 * MS, psn0=400)
    assert run(capture(q)).height == 2
    assert run(capture(q), episode_gap_ns=5_000 * MS)["explanation"].str.contains("6 episode").to_list() == [True]
