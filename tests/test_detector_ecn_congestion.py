"""ecn_congestion (detectors/ecn_congestion.py): CE marks and CNPs per destination and flow.

Constructed rows (tests/fakes.FakeCapture with rocev2_packets / rocev2_flows shaped as the plan's
schema) put each kind on both sides of its thresholds; the generated captures
(tests/rocev2_captures.py: samples/rocev2_synth.py's DCQCN model) show the incast and the CNPs
ignored against their twins, at two seeds and scales, and the other scenarios as negatives."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import polars as pl
import pytest

import detectors
import detectors.ecn_congestion as E
from analyzer import open_capture
from detectors.base import SEVERITY_RANK
from detectors.params import LOWER, UPPER, fields_of, spec_of
from analyzer.decoders.rocev2 import PACKET_COLUMNS
from analyzer.decoders.rocev2 import flows as rocev2_flows
from fakes import FakeCapture, T0, columns_frame

sys.path.insert(0, str(Path(__file__).parent))
from rocev2_captures import labels, rocev2_capture  # noqa: E402

US = 1_000
DST = "10.1.0.1"
CNP = 0x81
WRITE_MIDDLE, ACK = 0x07, 0x11


# -- constructed rows -------------------------------------------------------------------------------------

def _flow(rows: list, sender: str, qp: int, start_us: float, end_us: float, *, gap_ns: int = 1_000,
          ce=lambda t_us, k: True, cnp_every_us: float | None = None, cnp_until_us: float | None = None, dst=DST):
    """Data packets sender -> dst every ``gap_ns`` from start to end (CE where ``ce(t_us)``), an ACK
    every 20 packets back, and a CNP back every ``cnp_every_us`` up to ``cnp_until_us``."""
    t, k = int(start_us * US), 0
    while t < end_us * US:
        rows.append(dict(ts_ns=T0 + t, src=sender, dst=dst, ecn=3 if ce(t / US, k) else 2, opcode=WRITE_MIDDLE,
                         qp_pair=qp, payload_len=1024))
        if k % 20 == 19:
            rows.append(dict(ts_ns=T0 + t + 500, src=dst, dst=sender, ecn=2, opcode=ACK, qp_pair=qp, payload_len=0))
        t, k = t + gap_ns, k + 1
    if cnp_every_us:
        c = start_us + 5
        while c <= (cnp_until_us if cnp_until_us is not None else end_us):
            rows.append(dict(ts_ns=T0 + int(c * US), src=dst, dst=sender, ecn=2, opcode=CNP, qp_pair=qp,
                             payload_len=0))
            c += cnp_every_us


def _capture(rows: list, *, one_way: bool = False, resolution_ns: float = 1.0) -> FakeCapture:
    """The rows in the decoder's schema (frame numbers in time order), its rocev2_flows built by the
    decoder's own ``flows``; ``one_way``: a mirror that saw only the senders' direction."""
    rows = sorted(rows, key=lambda r: r["ts_ns"])
    if one_way:
        rows = [r for r in rows if r["dst"] == DST]
    for k, r in enumerate(rows, start=1):
        r.update(frame=k, transport="CNP" if r["opcode"] == CNP else "RC", status="ok",
                 sport=0xC000 + (r["qp_pair"] or 0), dport=4791, dest_qp=0x100 + (r["qp_pair"] or 0), psn=k)
    packets = columns_frame(PACKET_COLUMNS, rows)
    return FakeCapture(resolution_ns=resolution_ns, rocev2_packets=packets, rocev2_flows=rocev2_flows(packets))


def _incast(senders: int, *, until_us: float = 400, share: float = 1.0, cnps: float | None = 50) -> FakeCapture:
    rows: list = []
    for i in range(senders):
        every = max(1, round(1 / share)) if share > 0 else 0
        _flow(rows, f"10.1.0.{i + 2}", i, 0, until_us, gap_ns=1_000 + 37 * i,
              ce=(lambda t, k, e=every: e > 0 and k % e == 0), cnp_every_us=cnps)
    return _capture(rows)


def _kinds(found: pl.DataFrame) -> dict[str, str]:
    return {k: s for k, s in found.select("kind", pl.col("severity").cast(pl.String)).iter_rows()}


def test_incast_fires_with_its_senders_and_numbers():
    found = E.detect(_incast(4))
    assert found.height == 1
    r = found.row(0, named=True)
    assert (r["kind"], r["server"], r["resource"], r["clients"]) == ("incast", DST, DST, 4)
    assert r["severity"] == "medium"  # 400 µs of congestion: >= medium_congested_ns (250 µs), < high (2 ms)
    assert (r["metric"], r["value"], r["unit"]) == ("congested_ms", 0.4, "ms")
    assert "4 sender(s) -> 10.1.0.1" in r["explanation"] and "10.1.0.2 100 %" in r["explanation"]
    assert "CNP" in r["explanation"] and "not the DMA" in r["explanation"]
    assert r["evidence_total"] > 400  # the CE-marked packets and the CNPs


def test_fewer_senders_is_sustained_and_the_classification_moves_it():
    assert _kinds(E.detect(_incast(2))) == {"sustained": "medium"}
    assert _kinds(E.detect(_incast(2), E.Params(incast_min_senders=2))) == {"incast": "medium"}
    assert _kinds(E.detect(_incast(3), E.Params(incast_min_senders=4))) == {"sustained": "medium"}


def test_congested_time_edges():
    p = E.Params()
    # 100 µs of congestion = two 50 µs windows = min_congested_ns: reported, low
    assert _kinds(E.detect(_incast(3, until_us=100, cnps=None), p)) == {"incast": "low"}
    # one window short: not reported
    assert E.detect(_incast(3, until_us=100, cnps=None), dataclasses.replace(p, min_congested_ns=150_000)).height == 0
    # medium from medium_congested_ns exactly (5 windows)
    assert _kinds(E.detect(_incast(3, until_us=250, cnps=None), p)) == {"incast": "medium"}
    assert _kinds(E.detect(_incast(3, until_us=250, cnps=None),
                           dataclasses.replace(p, medium_congested_ns=300_000))) == {"incast": "low"}
    assert _kinds(E.detect(_incast(3, until_us=250, cnps=None),
                           dataclasses.replace(p, high_congested_ns=250_000))) == {"incast": "high"}


def test_ce_share_edge():
    # one packet in ten CE-marked: a 10 % share is congested at min_ce_share 0.1, not at 0.11
    cap = _incast(3, share=0.1, cnps=None)
    assert _kinds(E.detect(cap, E.Params(min_ce_share=0.1))) == {"incast": "medium"}
    assert E.detect(cap, E.Params(min_ce_share=0.11)).height == 0
    assert E.detect(_incast(3, share=0.0, cnps=None)).height == 0  # ECT but never CE: nothing


def test_cnps_without_slowdown_fire_and_explain_the_incast():
    # CE stays ~1 while a CNP arrives every 50 µs for 600 µs (12 CNPs each) and the rate stays
    cap = _incast(4, until_us=600)
    found = E.detect(cap)
    assert _kinds(found) == {"incast": "medium", "cnp_no_slowdown": "high"}
    r = found.filter(pl.col("kind") == "cnp_no_slowdown").row(0, named=True)
    assert r["clients"] == 4 and r["server"] == DST and r["value"] >= 10
    assert "rate on the wire" in r["explanation"] and "DCQCN" in r["explanation"]
    # through detectors.run, the incast is its member: one cause, one top-level finding
    top = detectors.top_level(detectors.population.apply(
        found, None, {E.NAME: E}, {E.NAME: E.Params()}))
    assert top["kind"].to_list() == ["cnp_no_slowdown"]


def test_cnp_no_slowdown_edges():
    # 9 CNPs (until 450 µs) are below no_slowdown_min_cnps: no cnp_no_slowdown
    assert "cnp_no_slowdown" not in _kinds(E.detect(_incast(4, until_us=450)))
    assert "cnp_no_slowdown" in _kinds(E.detect(_incast(4, until_us=450), E.Params(no_slowdown_min_cnps=9)))


def test_a_sender_that_slows_down_is_not_cnp_no_slowdown():
    # DCQCN working: after the CNPs the CE share falls (the queue drains) and the packet rate halves
    rows: list = []
    for i in range(4):
        _flow(rows, f"10.1.0.{i + 2}", i, 0, 300, gap_ns=1_000, cnp_every_us=50)
        _flow(rows, f"10.1.0.{i + 2}", i, 300, 1_000, gap_ns=2_000, ce=lambda t, k: k % 10 == 0)
    found = E.detect(_capture(rows))
    assert "cnp_no_slowdown" not in _kinds(found)
    assert _kinds(found)["incast"] in ("medium", "high")
    # ... and a sender whose rate fell to a third while still marked is not "no slowdown" either
    rows = []
    for i in range(4):
        _flow(rows, f"10.1.0.{i + 2}", i, 0, 100, gap_ns=1_000)
        _flow(rows, f"10.1.0.{i + 2}", i, 100, 800, gap_ns=3_000, cnp_every_us=50)
    reactions = E.analyse(_capture(rows))["reactions"]
    assert reactions.height == 4 and not reactions["no_slowdown"].any()
    assert (reactions["rate_ratio"] < 0.5).all()


def test_a_released_pause_is_capped_at_low():
    rows: list = []
    for i in range(3):  # the senders talk to DST, then DST's link is silent 1 ms (paused), then a marked burst
        _flow(rows, f"10.1.0.{i + 2}", i, 0, 100, ce=lambda t, k: False)
        _flow(rows, f"10.1.0.{i + 2}", i, 1_100, 1_500)
    found = E.detect(_capture(rows))
    assert _kinds(found) == {"incast": "low"}
    assert "silent for" in found["explanation"][0] and "pfc_storm" in found["explanation"][0]
    assert _kinds(E.detect(_capture(rows), E.Params(pause_silence_ns=2_000_000))) == {"incast": "medium"}


def test_missing_direction_is_said_and_cnps_not_judged():
    cap = _capture([r for r in _build(lambda rows: [_flow(rows, f"10.1.0.{i + 2}", i, 0, 600, cnp_every_us=50)
                                                     for i in range(3)])], one_way=True)
    found = E.detect(cap)
    assert _kinds(found) == {"incast": "medium"}
    assert "direction 10.1.0.1 -> 10.1.0.2, 10.1.0.3, 10.1.0.4 missing" in found["explanation"][0]


def _build(fill) -> list:
    rows: list = []
    fill(rows)
    return rows


def test_odd_input_gives_nothing():
    assert E.detect(FakeCapture()).height == 0  # no RoCEv2 decoder frame
    empty = _capture([dict(ts_ns=T0, src="10.1.0.2", dst=DST, ecn=0, opcode=WRITE_MIDDLE, qp_pair=0,
                           payload_len=0)])
    assert E.detect(empty).height == 0  # Not-ECT only
    assert E.detect(_capture([dict(ts_ns=T0, src=DST, dst="10.1.0.2", ecn=2, opcode=CNP, qp_pair=0,
                                   payload_len=0)])).height == 0  # a lone CNP


def test_hostile_rows_never_raise():
    """Nulls where a truncated packet leaves them, duplicate timestamps, unknown opcodes, CNPs with no
    data behind them: findings or nothing, never an exception."""
    import random

    rnd = random.Random(7)
    for trial in range(20):
        rows = []
        for k in range(rnd.randrange(0, 400)):
            sender = f"10.1.0.{rnd.randrange(2, 6)}"
            back = rnd.random() < 0.3
            rows.append(dict(ts_ns=T0 + rnd.randrange(0, 2_000_000) // rnd.choice((1, 1000)) * rnd.choice((1, 1000)),
                             src=DST if back else sender, dst=sender if back else DST,
                             ecn=rnd.choice((None, 0, 1, 2, 3, 3)),
                             opcode=rnd.choice((None, CNP, ACK, WRITE_MIDDLE, 0xFF)),
                             qp_pair=rnd.choice((None, 0, 1, 2)), payload_len=rnd.choice((None, 0, 1024))))
        cap = _capture(rows, one_way=trial % 3 == 0) if rows else FakeCapture(
            rocev2_packets=columns_frame(PACKET_COLUMNS, []), rocev2_flows=pl.DataFrame())
        found = E.detect(cap, E.Params(min_ce_packets=1, min_congested_ns=0, no_slowdown_min_cnps=1))
        assert set(found["kind"].to_list()) <= set(E.KINDS)


def test_windows_are_never_shorter_than_the_tick():
    rows: list = []
    for i in range(3):
        _flow(rows, f"10.1.0.{i + 2}", i, 0, 400, gap_ns=1_000 + 37 * i)
    cap = _capture(rows, resolution_ns=100_000.0)
    a = E.analyse(cap)
    assert a["window_ns"] == 100_000 and a["limited"]
    assert "widened to the timestamp tick" in E.detect(cap)["explanation"][0]


# -- the generated captures ---------------------------------------------------------------------------------

def _run(scenario: str, scale: float = 0.1, seed: int = 1):
    path = rocev2_capture(scenario, scale=scale, seed=seed)
    with open_capture(path) as cap:
        found = detectors.run(cap, only=[E.NAME])
        t0 = int(cap.frame("rocev2_packets")["ts_ns"].min())
    return found, detectors.top_level(found), labels(path), t0


def _loud(found: pl.DataFrame, bar: str = "medium") -> pl.DataFrame:
    return found.filter(pl.col("severity").cast(pl.String).replace_strict(SEVERITY_RANK) >= SEVERITY_RANK[bar])


@pytest.mark.parametrize("scale, seed", [(0.1, 1), (0.3, 3)])
def test_generated_incast_is_one_incast_at_the_receiver(scale, seed):
    _, top, lab, _ = _run("rocev2-incast", scale, seed)
    (label,) = lab
    hits = _loud(top)
    assert hits["kind"].to_list() == ["incast"], top.select("kind", "severity", "server")
    r = hits.row(0, named=True)
    assert r["server"] == label["server"] and r["clients"] == len(label["clients"])
    assert label["start_ns"] <= r["start_ns"] <= label["end_ns"]
    for client in label["clients"]:
        assert client in r["explanation"]


@pytest.mark.parametrize("scale, seed", [(0.1, 1), (0.3, 3)])
def test_generated_cnps_ignored_is_cnp_no_slowdown(scale, seed):
    found, top, lab, _ = _run("rocev2-cnp-ignored", scale, seed)
    (label,) = lab
    assert _loud(top)["kind"].to_list() == ["cnp_no_slowdown"], top.select("kind", "severity")
    r = top.row(0, named=True)
    assert r["severity"] in ("high", "critical") and r["server"] == label["server"]
    assert r["clients"] == len(label["clients"]) and label["start_ns"] <= r["start_ns"] <= label["end_ns"]
    assert r["members"] == 1 and found.filter(pl.col("member_of") == r["finding_id"])["kind"].to_list() == ["incast"]


@pytest.mark.parametrize("scale, seed", [(0.1, 1), (0.1, 2)])
def test_the_dcqcn_twin_is_an_incast_not_cnp_no_slowdown(scale, seed):
    found, top, _, _ = _run("rocev2-cnp-ignored-healthy", scale, seed)
    assert "cnp_no_slowdown" not in found["kind"].to_list()
    assert top["kind"].to_list() == ["incast"]  # the twin is itself an incast (samples/rocekit/README.md)


@pytest.mark.parametrize("scenario", ["rocev2-incast-healthy", "rocev2-healthy", "rocev2-gbn-storm-healthy",
                                      "rocev2-gbn-storm", "rocev2-pfc-storm", "rocev2-pfc-storm-healthy",
                                      "rocev2-rnr-loop", "rocev2-ack-timeout"])
def test_other_scenarios_stay_below_medium(scenario):
    found, _, _, _ = _run(scenario)
    assert _loud(found).height == 0, found.select("kind", "severity", "server", "explanation").rows()
    if scenario == "rocev2-incast-healthy":
        assert found.height == 0  # the ring: no CE at all


def _gates():
    return [f for f in fields_of(E.Params) if spec_of(f).gate in (LOWER, UPPER)]


@pytest.mark.parametrize("field", _gates(), ids=lambda f: f.name)
def test_gates_keep_their_direction_on_the_generated_captures(field):
    """tests/test_params_monotonic.py's promise on these captures: with the looser value every
    (kind, server) of the stricter one is there, at least as severe."""
    caps = [rocev2_capture(s) for s in ("rocev2-incast", "rocev2-cnp-ignored", "rocev2-pfc-storm",
                                        "rocev2-gbn-storm-healthy")]
    d = field.default
    lo, hi = (d // 2, d * 2) if isinstance(d, int) else (d / 2, min(d * 2, spec_of(field).hi or d * 2))
    looser, stricter = (lo, hi) if spec_of(field).gate == LOWER else (hi, lo)
    for path in caps:
        with open_capture(path) as cap:
            worst = []
            for v in (looser, stricter):
                found = E.detect(cap, dataclasses.replace(E.Params(), **{field.name: v}))
                best: dict = {}
                for k, s, sev in found.select("kind", "server", pl.col("severity").cast(pl.String)).iter_rows():
                    best[(k, s)] = max(best.get((k, s), -1), SEVERITY_RANK[sev])
                worst.append(best)
        for key, rank in worst[1].items():
            assert worst[0].get(key, -1) >= rank, (path.name, field.name, key)


def test_the_proof_chart_draws_the_ce_share_and_the_cnps():
    from dashboards import proofs

    path = rocev2_capture("rocev2-cnp-ignored")
    with open_capture(path) as cap:
        found = detectors.top_level(detectors.run(cap, only=[E.NAME]))
        (chart, caption), = proofs.proof_charts(cap, found.row(0, named=True))
        cnps = cap.frame("rocev2_packets").filter(pl.col("opcode") == CNP).height
    spec = chart.to_dict(validate=True)
    assert spec["title"]["text"] == "CE share of the packets to 10.1.0.1" and "CNP" in caption
    panels = spec["vconcat"]
    assert len(panels) == 3 and panels[1]["title"] == f"per sender -> 10.1.0.1; ticks: CNPs ({cnps:,})"
    drawn = {len(v) for v in spec["datasets"].values()}
    assert cnps in drawn  # one tick per CNP the destination sent back
    shares = [r["share"] for d in spec["datasets"].values() for r in d if "share" in r and "sender" not in r
              and "packets" in r]
    assert shares and max(shares) == 1.0  # the CE share at the receiver stays ~1
