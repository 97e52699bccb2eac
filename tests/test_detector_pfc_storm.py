"""pfc_storm on constructed pause_frames rows (FakeCapture: the paused intervals, each gate at its edge,
the spread's order and its members), on the generated PFC storm and its healthy twin (and the other
generated captures as negatives), at another seed and scale; and its proof chart."""
from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

import detectors
from detectors import pfc_storm
from detectors.base import FINDINGS_SCHEMA
from fakes import FakeCapture

sys.path.insert(0, str(Path(__file__).parent))
from rocev2_captures import labels, rocev2_capture  # noqa: E402

US, MS, S = 1_000, 1_000_000, 1_000_000_000
T0 = 1_700_000_000 * S
G100 = 100_000_000_000
MAXQ = 65535
MAXQ_NS = MAXQ * 512 * S // G100  # 335 539 ns: one max-quanta pause at 100 Gb/s
P = pfc_storm.Params()
A, B, C, D = (f"02:00:5e:10:00:{k:02x}" for k in (0x0D, 0x0B, 0x02, 0x0A))

PAUSE_SCHEMA = {"frame": pl.UInt32, "ts_ns": pl.Int64, "iface": pl.UInt16, "src_mac": pl.String,
                "dst_mac": pl.String, "opcode": pl.UInt16, "kind": pl.Enum(["pause", "pfc", "other"]),
                "class_enable": pl.UInt8, **{f"quanta_p{p}": pl.UInt16 for p in range(8)}, "link_bps": pl.Int64,
                **{f"paused_until_p{p}_ns": pl.Int64 for p in range(8)}, "status": pl.Enum(["ok", "truncated"])}


def frames(events, link_bps=G100) -> pl.DataFrame:
    """A pause_frames frame (the plan's schema) from (t after T0 in ns, mac, priority, quanta) events;
    priority None is an 802.3x PAUSE (every priority)."""
    rows = []
    for k, (t, mac, prio, q, *status) in enumerate(sorted(events, key=lambda e: e[0])):
        row = {"frame": 10 + k, "ts_ns": T0 + t, "iface": 0, "src_mac": mac, "dst_mac": "01:80:c2:00:00:01",
               "opcode": 0x0001 if prio is None else 0x0101, "kind": "pause" if prio is None else "pfc",
               "class_enable": 0xFF if prio is None else 1 << prio, "link_bps": link_bps,
               "status": status[0] if status else "ok"}
        for p in range(8):
            on = prio is None or p == prio
            row[f"quanta_p{p}"] = q if on else None
            row[f"paused_until_p{p}_ns"] = T0 + t + q * 512 * S // link_bps if on else None
        rows.append(row)
    return pl.DataFrame(rows, schema=PAUSE_SCHEMA)


def packets(span) -> pl.DataFrame:
    """A packets frame spanning ``span`` ns from T0 (the capture's extent)."""
    return pl.DataFrame({"frame": [1, 99999], "ts_ns": [T0, T0 + span]}, schema={"frame": pl.UInt32, "ts_ns": pl.Int64})


def capture(events, span=10 * MS, resolution_ns=1.0, **kw) -> FakeCapture:
    return FakeCapture(pause_frames=frames(events, **kw), packets=packets(span), resolution_ns=resolution_ns)


def storm(mac, start, refreshes, prio=3, every=MAXQ_NS // 2, xon=True):
    """An XOFF at ``start`` refreshed ``refreshes`` times every ``every`` (before it expires), then an XON."""
    ev = [(start + k * every, mac, prio, MAXQ) for k in range(refreshes + 1)]
    return ev + ([(start + refreshes * every + every // 2, mac, prio, 0)] if xon else [])


def run(cap, **overrides):
    return pfc_storm.detect(cap, pfc_storm.Params(**overrides))


def top(found):
    return found.filter(pl.col("member_of").is_null())


# -- the paused intervals -----------------------------------------------------------------------------

def test_paused_intervals_are_the_union_with_the_timer_replaced_by_each_frame():
    ev = [(0, A, 3, MAXQ), (100 * US, A, 3, MAXQ), (250 * US, A, 3, 0),   # refresh, then XON ends it early
          (1 * MS, A, 3, MAXQ),                                               # alone: expires by itself
          (2 * MS, A, 3, MAXQ), (2 * MS + 10 * US, A, 3, 100)]               # a shorter XOFF replaces the timer
    iv = pfc_storm.pause_intervals(frames(ev))
    runs = pfc_storm.pause_runs(iv)
    got = runs.select(pl.col("start_ns") - T0, pl.col("end_ns") - T0, "refreshes", "xoffs").rows()
    assert got == [(0, 250 * US, 1, 2), (1 * MS, 1 * MS + MAXQ_NS, 0, 1),
                   (2 * MS, 2 * MS + 10 * US + 100 * 512 * S // G100, 1, 2)]
    assert runs["frames"].to_list()[0] == [10, 11, 12]  # the XON that ended it is evidence too
    # another priority and another port are their own timers
    other = pfc_storm.pause_runs(pfc_storm.pause_intervals(frames(ev + [(50 * US, A, 4, 0), (60 * US, B, 3, 0)])))
    assert other.filter(pl.col("priority") == 3).height == 3 and other.height == 3  # quanta 0 alone pauses nothing


def test_link_speed_override_rescales_the_pause():
    # XOFFs every 200 µs: at 100 Gb/s each expires after 335 µs (back to back); at 400 Gb/s after 84 µs (not)
    ev = [(k * 200 * US, A, 3, MAXQ) for k in range(6)]
    assert pfc_storm.pause_runs(pfc_storm.pause_intervals(frames(ev)))["refreshes"].to_list() == [5]
    fast = pfc_storm.pause_runs(pfc_storm.pause_intervals(frames(ev), link_speed_bps=400_000_000_000))
    assert fast["refreshes"].to_list() == [0] * 6
    assert run(capture(ev), link_speed_bps=400_000_000_000).height == 0
    found = run(capture(ev))
    assert found["kind"].to_list() == ["pause_storm"] and "at 100 Gb/s, the default" in found["explanation"][0]
    assert "link_speed_bps setting" in run(capture(ev), link_speed_bps=G100)["explanation"][0]


def test_the_explanation_says_where_the_link_speed_came_from():
    ev = [(k * 200 * US, A, 3, MAXQ) for k in range(6)]
    cap = capture(ev, link_bps=25_000_000_000)  # the frame's times at 25 Gb/s: 1.34 ms per pause
    ifaces = cap.frame("interfaces").with_columns(pl.lit(25_000_000_000, pl.Int64).alias("speed_bps"))
    cap.set_frame("interfaces", ifaces)
    (f,) = run(cap).iter_rows(named=True)
    assert "at 25 Gb/s, the capture's interface speed (pcapng if_speed)" in f["explanation"]
    assert f["end_ns"] - f["start_ns"] == 5 * 200 * US + MAXQ * 512 * S // 25_000_000_000
    # another interface's if_speed does not make the default speed "the capture's"
    other = capture(ev)  # link_bps: the 100 Gb/s default
    other.set_frame("interfaces", other.frame("interfaces").with_columns(pl.lit(25_000_000_000, pl.Int64)
                                                                          .alias("speed_bps")))
    (g,) = run(other).iter_rows(named=True)
    assert "at 100 Gb/s, the default: the capture does not give the interface speed" in g["explanation"]


# -- pause_storm: each gate at its edge -----------------------------------------------------------------

def test_back_to_back_refreshes_gate():
    # 3 refreshes every 100 µs (a 400 µs continuous pause: below medium_pause_ns, share 4% of 10 ms)
    cap = capture(storm(A, 1 * MS, 3, every=100 * US))
    (f,) = run(cap).iter_rows(named=True)
    assert (f["kind"], f["severity"], f["server"], f["resource"]) == ("pause_storm", "low", A, "priority 3")
    assert f["start_ns"] == T0 + 1 * MS and f["end_ns"] == T0 + 1 * MS + 350 * US  # ended by the XON
    assert "refreshed back to back 3 times" in f["explanation"] and "mirror on one link" in f["explanation"]
    assert run(cap, min_back_to_back=4).height == 0
    assert run(capture(storm(A, 1 * MS, 2, every=100 * US))).height == 0


def test_paused_share_gate_and_window():
    # one XOFF/XON cycle per ms paused 200 µs: 20 % of the 10 ms capture, never refreshed
    ev = [e for k in range(10) for e in ((k * MS, A, 3, MAXQ), (k * MS + 200 * US, A, 3, 0))]
    (f,) = run(capture(ev)).iter_rows(named=True)
    assert f["value"] == pytest.approx(0.2) and f["severity"] == "low" and "Short XOFF/XON cycles" in f["explanation"]
    assert run(capture(ev), min_paused_share=0.21).height == 0
    assert run(capture(ev, span=11 * MS)).height == 0  # 200 µs x 10 / 11 ms < 20 %
    # the share is the largest in any share_window_ns: the busy 2 ms of a 100 ms capture
    busy = [e for k in range(2) for e in ((k * MS, A, 3, MAXQ), (k * MS + 300 * US, A, 3, 0))]
    assert run(capture(busy, span=100 * MS)).height == 0
    (g,) = run(capture(busy, span=100 * MS), share_window_ns=2 * MS).iter_rows(named=True)
    assert g["value"] == pytest.approx(0.3)


def test_storm_severity_steps():
    def sev(refreshes, start=1 * MS, span=10 * MS, **kw):
        return run(capture(storm(A, start, refreshes, every=100 * US), span=span), **kw)["severity"].to_list()
    # continuous pause = refreshes x 100 µs + 50 µs (to the XON)
    assert sev(4) == ["low"]                      # 450 µs < medium_pause_ns (500 µs)
    assert sev(5) == ["medium"]                   # 550 µs
    assert sev(5, medium_pause_ns=551 * US) == ["low"]
    assert sev(5, start=0, span=1 * MS) == ["high"]  # 550 µs of a 1 ms capture: 55 % paused
    assert sev(5, start=0, span=1 * MS, high_share=0.56) == ["medium"]
    assert sev(5, start=0, span=1 * MS, medium_pause_ns=551 * US) == ["low"]  # a share alone stays low
    assert sev(100, span=100 * MS) == ["high"]    # 10.05 ms continuous, 10 % paused
    assert sev(100, span=100 * MS, critical_pause_ns=10 * MS) == ["critical"]
    assert sev(100, span=100 * MS, high_pause_ns=10_050 * US + 1) == ["medium"]
    assert sev(100, span=10 * MS) == ["critical"]  # ... 90 % of a 10 ms capture


def test_a_pause_running_past_the_capture_is_measured_to_its_end():
    # refreshed from 9 ms every 100 µs, the last XOFF (10.5 ms) asks for 335 µs more; the capture ends at 10.6 ms
    (f,) = run(capture(storm(A, 9 * MS, 15, every=100 * US, xon=False), span=10_600 * US)).iter_rows(named=True)
    assert f["end_ns"] == T0 + 10_600 * US
    assert "longest continuous pause 1.6 ms from +9 ms (still paused when the capture ends)" in f["explanation"]
    assert f["severity"] == "medium"  # 1.6 ms seen, not the 1.84 ms asked for


def test_a_coarse_tick_caps_at_low():
    ev = storm(A, 1 * MS, 20, every=100 * US)
    coarse = capture(ev, resolution_ns=1_000_000.0)
    assert run(capture(ev))["severity"].to_list() == ["medium"]
    (f,) = run(coarse).iter_rows(named=True)
    assert f["severity"] == "low" and "cannot be told" in f["explanation"]


def test_8023x_pause_is_every_priority_and_three_benign_ones_are_silent():
    benign = [(k * MS, A, None, 1000) for k in range(3)]
    assert run(capture(benign)).height == 0
    (f,) = run(capture([(k * 100 * US, A, None, MAXQ) for k in range(5)])).iter_rows(named=True)
    assert f["resource"] == "all priorities (802.3x PAUSE)"


def test_odd_input_never_raises():
    assert run(FakeCapture()).height == 0  # no pause_frames frame at all
    assert run(capture([])).height == 0
    truncated = [(k * 100 * US, A, 3, MAXQ, "truncated") for k in range(10)]
    assert run(capture(truncated)).height == 0  # counted by the frame, not paused on
    assert run(capture(storm(A, 0, 5), span=0)).height == 1  # a capture of one instant
    out = run(capture(storm(A, 1 * MS, 5)))
    assert out.schema == FINDINGS_SCHEMA


# -- pause_spreading ------------------------------------------------------------------------------------

def cascade(lag=50 * US):
    """A storms from 1 ms; B, C, D start pausing ``lag`` apart while A is paused (a spread)."""
    return (storm(A, 1 * MS, 6) + storm(B, 1 * MS + lag, 6) + storm(C, 1 * MS + 2 * lag, 6)
            + [(1 * MS + 3 * lag, D, 3, MAXQ), (1 * MS + 3 * lag + 20 * US, D, 3, 0)])


def test_a_spread_is_one_finding_naming_the_ports_in_order_with_the_storms_as_members():
    found = run(capture(cascade()))
    (f,) = top(found).iter_rows(named=True)
    assert (f["kind"], f["server"], f["resource"], f["client"], f["clients"]) == (
        "pause_spreading", A, "priority 3", f"{B},{C},{D}", 3)
    assert f["value"] == 4 and f["start_ns"] == T0 + 1 * MS
    storms = found.filter(pl.col("kind") == "pause_storm")
    assert sorted(storms["server"]) == sorted([A, B, C])  # D paused 20 µs: in the spread, not a storm
    assert set(storms["member_of"]) == {f["finding_id"]} and sorted(f["member_ids"]) == sorted(storms["finding_id"])
    assert f["members"] == 3 and f["severity"] == max(storms["severity"], key=list(pfc_storm.SEVERITIES).index)
    assert f"{A} (first), {B} (+50 µs), {C} (+100 µs), {D} (+150 µs)" in f["explanation"]
    assert "mirror on one link" in f["explanation"]
    # every frame number opens a pause frame: first pauses and the storms' runs
    assert {10, 11}.issubset(set(f["evidence_frames"])) and f["evidence_total"] >= 4


def test_spread_gates_at_their_edges():
    assert top(run(capture(cascade()), spread_min_ports=4))["kind"].to_list() == ["pause_spreading"]
    alone = top(run(capture(cascade()), spread_min_ports=5))
    assert alone["kind"].to_list() == ["pause_storm"] * 3  # no spread: each storm is its own finding
    # the lag: C starts 100 µs into A's pause, D 150 µs into A's and 100 µs into B's
    (f,) = top(run(capture(cascade()), min_spread_lag_ns=100 * US)).iter_rows(named=True)
    assert f["kind"] == "pause_spreading" and f["client"] == f"{B},{C},{D}"
    found = top(run(capture(cascade()), min_spread_lag_ns=100 * US + 1))  # only D joins, under A: 2 ports
    assert "pause_spreading" not in found["kind"].to_list() and found.height == 3


def test_ports_starting_together_are_one_event_not_a_spread():
    # an incast: six ports pause within 2 µs of each other, in XOFF/XON cycles
    ev = [e for k in range(6) for c in range(4) for e in (
        (c * 50 * US + k * 300, f"02:00:5e:10:00:{0x18 + 2 * k:02x}", 3, MAXQ),
        (c * 50 * US + k * 300 + 25 * US, f"02:00:5e:10:00:{0x18 + 2 * k:02x}", 3, 0))]
    assert run(capture(ev, span=1 * MS)).filter(pl.col("severity") >= "medium").height == 0
    assert "pause_spreading" not in run(capture(ev, span=1 * MS))["kind"].to_list()


def test_a_capture_started_mid_storm_shows_no_spread():
    """Every port's first frame comes within its pause time (335 µs) of the capture's start: each may be
    refreshing a pause begun before the mirror started, so none can be said to have joined."""
    mid = storm(A, 0, 6) + storm(B, 50 * US, 6) + storm(C, 100 * US, 6) + storm(D, 150 * US, 6)
    found = run(capture(mid))
    assert set(found["kind"]) == {"pause_storm"} and found.height == 4
    # ... while the same pauses 335 µs later are a spread (the first port needs no quiet time before it)
    later = [(t + MAXQ_NS, m, p, q) for t, m, p, q in mid]
    assert top(run(capture(later)))["kind"].to_list() == ["pause_spreading"]


def test_a_lone_storm_elsewhere_stays_its_own_finding():
    found = run(capture(cascade() + storm("02:00:5e:10:00:99", 5 * MS, 6, prio=5)))
    assert sorted(top(found).select("kind", "resource").rows()) == [("pause_spreading", "priority 3"),
                                                                   ("pause_storm", "priority 5")]


# -- the generated captures (samples/rocev2_synth.py) ----------------------------------------------------

def generated(scenario, scale=0.1, seed=1):
    from analyzer import open_capture

    path = rocev2_capture(scenario, scale=scale, seed=seed)
    with open_capture(path) as cap:
        if "pause_frames" not in cap.frame_names():
            pytest.skip("no pause_frames decoder (analyzer/mac_control.py) yet")
        return detectors.run(cap, only=["pfc_storm"]), labels(path)


def mac(compact: str) -> str:
    return ":".join(compact[i:i + 2] for i in range(0, 12, 2))


@pytest.mark.parametrize("scale, seed", [(0.1, 1), (0.1, 2), (0.2, 1)])
def test_generated_storm_is_found_as_one_spreading_finding(scale, seed):
    found, (label,) = generated("pfc-storm", scale, seed)
    shown = detectors.top_level(found).filter(pl.col("severity") >= "medium")
    (f,) = shown.iter_rows(named=True)
    lp = label["parameters"]
    ports = [mac(p["mac"]) for p in sorted(lp["ports"], key=lambda p: p["first_at_ns"])]
    assert (f["detector"], f["kind"], f["resource"]) == ("pfc_storm", "pause_spreading", label["resource"])
    assert f["server"] == mac(lp["origin_mac"]) == ports[0]
    assert f["client"].split(",") == ports[1:]  # in order of first pause
    assert abs(f["start_ns"] - label["start_ns"]) <= 1 * US and abs(f["end_ns"] - label["end_ns"]) <= 400 * US
    assert f["severity"] in ("high", "critical")
    assert "100 Gb/s" in found.filter(pl.col("member_of").is_not_null())["explanation"][0]


@pytest.mark.parametrize("scenario", ["pfc-storm-healthy", "healthy", "gbn-storm-healthy", "incast",
                                      "incast-healthy", "gbn-storm"])
@pytest.mark.parametrize("scale, seed", [(0.1, 1), (0.2, 1)])
def test_generated_negatives_are_below_medium(scenario, scale, seed):
    found, _ = generated(scenario, scale, seed)
    assert found.filter(pl.col("severity") >= "medium").height == 0, found.select("kind", "severity", "explanation")
    if scenario in ("pfc-storm-healthy", "healthy"):
        assert found.height == 0  # silent (the healthy capture's three 802.3x PAUSE frames included)


def test_cnp_ignored_incast_pauses_a_lot_but_is_no_storm():
    """DCQCN off: the senders' ports are paused ~80 % of the time in short XOFF/XON cycles: reported,
    low (ecn_congestion's finding is the cause), never a spread (the ports start together)."""
    found, _ = generated("cnp-ignored")
    assert found.height and set(found["kind"]) == {"pause_storm"} and set(found["severity"]) == {"low"}
    assert all("Short XOFF/XON cycles" in e for e in found["explanation"])


# -- the proof chart -------------------------------------------------------------------------------------

def test_proof_chart_draws_each_port_in_order_of_first_pause():
    from dashboards import proofs

    cap = capture(cascade() + storm("02:00:5e:10:00:99", 5 * MS, 6, prio=5))
    found = run(cap)
    spread = top(found).filter(pl.col("kind") == "pause_spreading").row(0, named=True)
    (chart, caption), = proofs.proof_charts(cap, spread)
    spec = chart.to_dict(validate=True)
    assert spec["title"]["text"] == "Pause timeline: priority 3" and "order they started pausing" in caption
    bars = next(d for d in spec["datasets"].values() if d and "paused_us" in d[0])
    rows = list(dict.fromkeys(r["row"] for r in bars))
    assert [r.split()[1] for r in rows[:4]] == [A, B, C, D] and rows[0].startswith(" 1.")
    assert any(r["row"].endswith("p5") for r in bars)  # the other priority's port is drawn too, after
    steps = next(d for d in spec["datasets"].values() if d and "paused" in d[0] and "row" not in d[0])
    assert max(r["paused"] for r in steps if r["priority"] == 3) == 4  # four ports paused at once
    # and a capture without pause frames says so instead of failing
    empty_cap = capture([])
    (none, _), = proofs.proof_charts(empty_cap, spread)
    assert "No PFC or PAUSE frame" in str(none.to_dict())
