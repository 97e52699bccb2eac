"""The dashboard's chart builders and evidence cutters, without a browser or Streamlit: frames in,
Vega-Lite specs out; what is encoded, which layers there are, that row budgets hold and that a
sampled or aggregated chart says so."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import altair as alt
import numpy as np
import polars as pl
import pytest

from dashboards import charts
from dashboards.charts.base import MAX_ROWS, nice_bin_ns, thin
from dashboards.proofs import conn_churn as churn_proof, herd as herd_proof, retry_storm as retry_proof
from dashboards.proofs import smb_break_queue as break_proof, tcp_stall as stall_proof, toctou as toctou_proof
from dashboards.proofs.conn_churn import churn_frames
from dashboards.proofs.herd import herd_frames
from dashboards.proofs.retry_storm import dns_attempts, transaction_attempts
from dashboards.proofs.smb_break_queue import break_frames
from dashboards.proofs.tcp_stall import stall_frames
from dashboards.proofs.toctou import toctou_frames
from dashboards.frames import TRANSACTIONS_SCHEMA, srt_table
from detectors.base import SEVERITIES, findings

T0 = 1_700_000_000_000_000_000
S = 1_000_000_000
MS = 1_000_000


# -- spec helpers ------------------------------------------------------------------------------------

def units(spec: dict, data: dict | None = None) -> list[dict]:
    """Every single-view spec (mark + encoding) inside a layered/concatenated spec, with the data it
    inherits from its parents filled in."""
    data = spec.get("data", data)
    out = []
    if "mark" in spec:
        out.append({**spec, "data": data})
    for key in ("layer", "vconcat", "hconcat", "concat"):
        for sub in spec.get(key, []):
            out.extend(units(sub, data))
    return out


def mark_type(unit: dict) -> str:
    return unit["mark"] if isinstance(unit["mark"], str) else unit["mark"]["type"]


def marks(spec: dict) -> list[str]:
    return [mark_type(u) for u in units(spec)]


def dataset_rows(spec: dict) -> list[int]:
    return [len(v) for v in spec.get("datasets", {}).values()]


def unit_data(spec: dict, unit: dict) -> list[dict]:
    return spec["datasets"][unit["data"]["name"]]


def subtitle(spec: dict) -> list[str]:
    sub = spec.get("title", {}).get("subtitle", [])
    return [sub] if isinstance(sub, str) else list(sub)


def notes(chart) -> list[str]:
    return charts.chart_notes(chart)


@dataclasses.dataclass(frozen=True)
class P:
    window_ms: int = 100


def make_findings(rows: list[dict], detector: str = "herd") -> pl.DataFrame:
    """A findings frame with the fixed schema, built the way detectors build theirs."""
    base = {"kind": "dns", "severity": "medium", "client": None, "server": "10.0.0.53", "resource": "a.example",
            "metric": "clients_in_window", "value": 30.0, "threshold": 20.0, "unit": "clients",
            "evidence_frames": [1, 2, 3], "explanation": "30 clients asked together"}
    frame = pl.DataFrame([{**base, **r} for r in rows], schema_overrides={"evidence_frames": pl.List(pl.UInt32)})
    return findings(frame, detector=detector, params=P())


def tx_frame(rows: list[dict]) -> pl.DataFrame:
    defaults = {"protocol": "dns", "transport": "udp", "flow": 0, "client": "10.0.1.1", "client_port": 5000,
                "server": "10.0.0.53", "server_port": 53, "operation": "A", "resource": "a.example",
                "request_frame": 1, "response_frame": 2, "request_ts_ns": T0, "response_ts_ns": T0 + MS,
                "latency_ns": MS, "status": "NOERROR", "is_error": False, "answered": True}
    return pl.DataFrame([{**defaults, **r} for r in rows], schema=TRANSACTIONS_SCHEMA)


# -- base ----------------------------------------------------------------------------------------------

def test_nice_bin_is_round_and_near_the_target():
    assert nice_bin_ns(30 * S, 300) == 100 * MS
    assert nice_bin_ns(1 * S, 300) == 5 * MS
    assert nice_bin_ns(10, 300) == 1000  # never below min_ns


def test_thin_keeps_order_marked_rows_and_says_so():
    frame = pl.DataFrame({"i": np.arange(10_000), "flag": np.arange(10_000) % 997 == 0})
    out, note = thin(frame, max_rows=1000, keep=pl.col("flag"), what="points")
    assert out.height <= 1000
    assert set(frame.filter("flag")["i"]) <= set(out["i"])
    assert note.startswith("sampled: ") and "of 10,000 points" in note and "all 11 of the 11 marked" in note
    small, none = thin(frame.head(10), max_rows=1000)
    assert none is None and small.height == 10


def test_empty_frames_give_a_message_not_an_error():
    empty_tx = pl.DataFrame(schema=TRANSACTIONS_SCHEMA).with_columns(pl.lit("x").alias("series"))
    for chart in (charts.findings_timeline(make_findings([]), t0_ns=T0, t1_ns=T0 + S),
                  charts.latency_histogram(empty_tx), charts.latency_over_time(empty_tx, t0_ns=T0)):
        spec = chart.to_dict()
        assert marks(spec) == ["text"]


# -- findings timeline ------------------------------------------------------------------------------

def test_timeline_bar_per_finding_coloured_by_severity_and_clickable():
    f = make_findings([
        {"start_ns": T0 + 2 * S, "end_ns": T0 + 3 * S, "severity": "high"},
        {"start_ns": T0 + 5 * S, "end_ns": T0 + 5 * S, "severity": "low", "resource": "b.example"},
    ])
    spec = charts.findings_timeline(f, t0_ns=T0, t1_ns=T0 + 10 * S).to_dict()
    (unit,) = units(spec)
    assert mark_type(unit) == "bar"
    enc = unit["encoding"]
    assert enc["x"]["field"] == "start_s" and enc["x"]["type"] == "quantitative"
    assert enc["x"]["scale"]["domain"] == [0, 10.0]
    assert enc["x2"]["field"] == "bar_end_s"
    assert enc["color"]["field"] == "severity" and enc["color"]["scale"]["domain"] == list(SEVERITIES)
    assert enc["y"]["field"] == "row" and enc["y"]["type"] == "nominal"
    assert spec["params"][0]["name"] == charts.PICK
    assert spec["params"][0]["select"]["fields"] == ["finding_id"]
    rows = unit_data(spec, unit)
    assert {r["finding_id"] for r in rows} == set(f["finding_id"])
    by_sev = {r["severity"]: r for r in rows}
    assert by_sev["high"]["start_s"] == 2.0 and by_sev["high"]["bar_end_s"] == 3.0
    # the zero-length finding is drawn 1/250 of the capture wide, and the subtitle says so
    assert by_sev["low"]["bar_end_s"] == pytest.approx(5.0 + 10 / 250)
    assert any("drawn that wide" in n for n in subtitle(spec))


def test_timeline_caps_findings_and_groups_rows_and_says_so():
    rows = [{"start_ns": T0 + k * MS, "end_ns": T0 + k * MS + 10 * MS, "resource": f"r{k}.example",
             "severity": SEVERITIES[k % 5]} for k in range(400)]
    chart = charts.findings_timeline(make_findings(rows), t0_ns=T0, t1_ns=T0 + S, max_findings=300)
    spec = chart.to_dict()
    assert max(dataset_rows(spec)) == 300
    n = notes(chart)
    assert any(x.startswith("sampled: the 300 most severe of 400 findings") for x in n)
    assert any("one row per detector and kind" in x for x in n)
    kept = unit_data(spec, units(spec)[0])
    assert min(SEVERITIES.index(r["severity"]) for r in kept) >= 1  # the informational ones went first
    assert spec["usermeta"]["herdscope"]["sampled"] is True


# -- herd --------------------------------------------------------------------------------------------

def test_herd_chart_rate_window_expiries_and_latency_on_one_axis():
    rng = np.random.default_rng(1)
    background = T0 + (rng.random(200) * 30 * S).astype(np.int64)
    herd = T0 + 10 * S + (rng.random(60) * 50 * MS).astype(np.int64)
    requests = pl.DataFrame({"t_ns": np.concatenate([background, herd]),
                             "key": ["other.example"] * 200 + ["a.example"] * 60})
    latency = pl.DataFrame({"t_ns": herd, "latency_ns": np.full(60, 2 * MS)})
    chart = herd_proof.herd_chart(requests, t0_ns=T0, window_ns=(T0 + 10 * S, T0 + 10 * S + 50 * MS),
                              focus_key="a.example", expiries_ns=[T0 + 9 * S, T0 + 9 * S + 200],
                              expiry_window_ns=(-250 * MS, S + 250 * MS),
                              latency=latency, domain_ns=(T0, T0 + 30 * S))
    spec = chart.to_dict()
    assert len(spec["vconcat"]) == 2 and spec["resolve"]["scale"]["x"] == "shared"
    top, bottom = spec["vconcat"]
    top_marks = [mark_type(u) for u in units(top)]
    assert "rect" in top_marks and "line" in top_marks
    line = next(u for u in units(top) if mark_type(u) == "line")
    assert line["encoding"]["y"]["field"] == "rate" and line["encoding"]["color"]["field"] == "key"
    rates = unit_data(spec, line)
    bin_s = nice_bin_ns(2 * S + 50 * MS, 300) / S  # bins of ~1/300 of the view (window ± 1 s)
    assert bin_s == 0.01
    assert max(r["rate"] for r in rates if r["key"] == "a.example") >= 30 / (50 * MS / S)  # the herd's peak
    assert all(r["rate"] == 0 for r in rates if r["key"] == "a.example" and not 10 <= r["t_s"] <= 10.05)
    # the two expiries (200 ns apart) are one band: the detector's [answer + TTL - tol, + 1 s + tol]
    bands = [u for u in units(top) if mark_type(u) == "rect" and u["encoding"].get("x2", {}).get("field") == "end_s"
             and any(r.get("label") == "TTL expiry" for r in unit_data(spec, u))]
    assert len(bands) == 1
    (band,) = unit_data(spec, bands[0])
    assert band["n"] == 2 and band["start_s"] == pytest.approx(8.75) and band["end_s"] == pytest.approx(10.25, abs=1e-6)
    assert any(mark_type(u) == "circle" for u in units(bottom))
    # opens on the herd window ± max(2 x 50 ms, 1 s), all panels on that axis
    assert all(u["encoding"]["x"]["scale"]["domain"] == [9.0, 11.05] for u in units(spec)
               if "x" in u["encoding"] and u["encoding"]["x"].get("field") == "t_s")
    assert any(n.startswith("zoomed on the finding's 50 ms window") for n in notes(chart))


def test_herd_chart_limits_keys_and_aggregates_latency_and_says_so():
    n = 50_000
    t = T0 + np.arange(n, dtype=np.int64) * (60 * S // n)
    requests = pl.DataFrame({"t_ns": t, "key": [f"k{i % 40}" for i in range(n)]})
    latency = pl.DataFrame({"t_ns": t, "latency_ns": np.full(n, MS)})
    chart = herd_proof.herd_chart(requests, t0_ns=T0, window_ns=(T0 + S, T0 + 2 * S), focus_key="k39",
                              latency=latency, max_keys=6, view_ns=(T0, T0 + 60 * S))
    spec = chart.to_dict()
    n_ = notes(chart)
    assert any("the 6 busiest of 40 keys" in x for x in n_)
    assert any(x.startswith("aggregated: 50,000 latencies") for x in n_)
    assert max(dataset_rows(spec)) <= MAX_ROWS
    line = next(u for u in units(spec["vconcat"][0]) if mark_type(u) == "line")
    assert "k39" in {r["key"] for r in unit_data(spec, line)}  # the finding's key is always drawn


def test_herd_frames_cut_requests_latency_and_ttl_expiries():
    tx = tx_frame([
        {"request_ts_ns": T0 + k * MS, "response_ts_ns": T0 + k * MS + 100, "latency_ns": 100,
         "resource": "a.example" if k % 2 else "b.example", "client": f"10.0.1.{k}"} for k in range(10)
    ] + [{"server": "10.9.9.9", "resource": "a.example"}])
    dns = tx.with_columns(pl.lit(5, pl.UInt32).alias("answer_ttl_min"), pl.lit(None, pl.UInt32).alias("negative_ttl"))
    got = herd_frames(tx, {"server": "10.0.0.53", "resource": "a.example"}, dns)
    assert got["requests"].height == 10 and set(got["requests"]["key"]) == {"a.example", "b.example"}
    assert got["latency"].height == 5
    assert sorted(got["expiries_ns"].to_list()) == [T0 + k * MS + 100 + 5 * S for k in range(1, 10, 2)]


# -- retry storm -----------------------------------------------------------------------------------------

def attempts_frame(chains: dict[str, list[int]]) -> pl.DataFrame:
    rows = []
    for chain, times in chains.items():
        for k, t in enumerate(times):
            rows.append({"t_ns": T0 + t, "client": chain.split("/")[0], "chain": chain, "attempt": k,
                         "frame": len(rows) + 1})
    return pl.DataFrame(rows)


@pytest.mark.parametrize("times,kind", [
    ([0, 250 * MS, 500 * MS, 750 * MS, S], "fixed"),
    ([0, 200 * MS, 600 * MS, 1400 * MS, 3000 * MS], "exponential"),
    ([0, S, 3 * S, 6 * S, 10 * S], "linear"),  # 1, 2, 3, 4 s gaps
    ([0, 100 * MS], "single retry"),
    ([0], "no retries"),
])
def test_backoff_class(times, kind):
    assert retry_proof.backoff_of(attempts_frame({"c1/x": times, "c2/x": times}))[0] == kind


@pytest.mark.parametrize("gaps_s", [(1, 2, 3, 4), (1, 1, 1, 1), (1, 2, 4, 8), (4, 3, 2, 1), (1, 2.1, 2.9, 4.2)])
def test_chart_and_detector_agree_on_the_backoff(gaps_s):
    """The chart's backoff class is the retry_storm detector's (one copy: for 1, 2, 3, 4 s gaps both say
    linear), with the finding's parameters when it ran with others."""
    import detectors.retry_storm as rs

    times = np.concatenate([[0], np.cumsum(np.array(gaps_s) * S)]).astype(np.int64).tolist()
    att = attempts_frame({"c1/x": times, "c2/x": [t + 7 * MS for t in times]})
    intervals = [np.diff(np.array(times, dtype=np.float64))] * 2
    expected, _ = rs.classify_backoff(intervals, rs.Params())
    assert retry_proof.backoff_of(att)[0] == expected
    assert "backoff: " + expected in retry_proof.retry_intervals(att).to_dict()["title"]["text"]
    if gaps_s == (1, 2, 3, 4):
        assert expected == "linear"
    strict = dataclasses.replace(rs.Params(), growth_ratio=3.0, linear_step=0.9)  # what a finding may carry
    assert retry_proof.backoff_of(att, strict)[0] == rs.classify_backoff(intervals, strict)[0]


def test_retry_ladder_row_per_client_mark_per_attempt():
    att = attempts_frame({"10.0.1.1/a": [0, 250 * MS, 500 * MS], "10.0.1.2/a": [10 * MS]})
    spec = retry_proof.retry_ladder(att, t0_ns=T0, window_ns=(T0, T0 + S)).to_dict()
    point = next(u for u in units(spec) if mark_type(u) == "point")
    assert point["encoding"]["y"]["field"] == "client" and point["encoding"]["y"]["type"] == "nominal"
    assert point["encoding"]["x"]["field"] == "t_s"
    data = unit_data(spec, point)
    assert len(data) == 4 and sum(r["what"] == "retry" for r in data) == 2


def test_retry_ladder_samples_clients_and_attempts_and_says_so():
    chains = {f"10.0.{c // 250}.{c % 250}/a": [k * 25 * MS for k in range(100)] for c in range(200)}
    chart = retry_proof.retry_ladder(attempts_frame(chains), t0_ns=T0, max_clients=60)
    spec = chart.to_dict()
    n = notes(chart)
    assert any(x.startswith("sampled: the 60 clients with most attempts of 200") for x in n)
    assert any(x.startswith("sampled: ") and "attempts shown" in x for x in n)
    assert max(dataset_rows(spec)) <= MAX_ROWS


def test_retry_intervals_histogram_and_amplification():
    att = attempts_frame({f"c{k}/a": [k * MS + i * 250 * MS for i in range(5)] for k in range(10)})
    hist = retry_proof.retry_intervals(att).to_dict()
    assert "backoff: fixed" in hist["title"]["text"] and "250 ms" in hist["title"]["text"]
    (bar,) = [u for u in units(hist) if mark_type(u) == "bar"]
    assert sum(r["intervals"] for r in unit_data(hist, bar)) == 40
    amp = retry_proof.amplification_chart(att, t0_ns=T0).to_dict()
    assert "5.00 attempts per request" in amp["title"]["text"]
    line = next(u for u in units(amp) if mark_type(u) == "line")
    assert {r["what"] for r in unit_data(amp, line)} == {"all attempts", "first tries"}


def test_dns_attempts_chain_by_wireshark_retransmission_flag():
    q = pl.DataFrame({
        "qr": [False, False, False, True, False], "dst": ["10.0.0.53"] * 5, "dport": [53] * 5,
        "src": ["10.0.1.1"] * 5, "sport": [5000] * 5, "id": [7, 7, 7, 7, 8], "qname": ["a.example"] * 5,
        "qtype": [1] * 5, "retransmission": [False, True, True, False, False],
        "ts_first_ns": [T0, T0 + 250 * MS, T0 + 500 * MS, T0 + 600 * MS, T0 + S], "frame_first": [1, 2, 3, 4, 5],
    }).with_columns(pl.col("dport", "sport", "id", "qtype").cast(pl.UInt16))
    att = dns_attempts(q, {"server": "10.0.0.53", "resource": "a.example"})
    assert att["attempt"].to_list() == [0, 1, 2, 0]
    assert att["chain"].n_unique() == 2


def test_transaction_attempts_retry_follows_a_failure():
    tx = tx_frame([
        {"request_ts_ns": T0, "answered": False, "latency_ns": None, "response_ts_ns": None, "status": None},
        {"request_ts_ns": T0 + S, "is_error": True, "status": "SERVFAIL"},
        {"request_ts_ns": T0 + 2 * S},
        {"request_ts_ns": T0 + 3 * S},  # after a success: a new request
    ])
    att = transaction_attempts(tx, {"server": "10.0.0.53", "resource": "a.example"})
    assert att["attempt"].to_list() == [0, 1, 2, 0]


# -- SMB2 break queue -------------------------------------------------------------------------------------

def test_break_queue_bars_and_queue_depth_step():
    breaks = pl.DataFrame({"frame": [10], "ts_ns": [T0 + S], "ack_ts_ns": [T0 + 4 * S], "client": ["10.0.4.1"],
                           "path": ["\\\\fs\\d\\x.db"], "kind": ["oplock"]})
    waiters = pl.DataFrame({"t_ns": [T0 + S + k * 100 * MS for k in range(4)], "end_ns": [T0 + 4 * S + MS] * 4,
                            "client": [f"10.0.4.{k + 2}" for k in range(4)], "operation": ["CREATE"] * 4,
                            "frame": [11, 12, 13, 14]})
    chart = break_proof.break_queue_chart(breaks, waiters, t0_ns=T0, window_ns=(T0 + S, T0 + 4 * S))
    spec = chart.to_dict()
    top, bottom = spec["vconcat"]
    bar = next(u for u in units(top) if mark_type(u) == "bar")
    (b,) = unit_data(spec, bar)
    assert b["latency_ms"] == pytest.approx(3000.0) and b["state"] == "acknowledged" and b["label"] == "3000.0 ms"
    step = next(u for u in units(bottom) if mark_type(u) == "line")
    assert step["mark"]["interpolate"] == "step-after"
    depth = [r for r in unit_data(spec, step) if r["series"] == "requests waiting"]
    assert max(r["depth"] for r in depth) == 4 and depth[-1]["depth"] == 0
    acked = [r for r in unit_data(spec, step) if r["series"] == "breaks unacknowledged"]
    assert [r["depth"] for r in acked][:3] == [0, 1, 0]


def test_break_frames_pick_the_resource_and_its_waiters():
    breaks = pl.DataFrame({"frame": [10, 20], "ts_ns": [T0, T0 + S], "ack_ts_ns": [T0 + S, None],
                           "client": ["a", "a"], "server": ["s", "s"], "server_port": [445, 445],
                           "path": ["\\\\s\\d\\x", "\\\\s\\d\\y"], "kind": ["oplock", "lease"],
                           "lease_paths": [None, ["\\\\s\\d\\y"]], "trigger_frame": [9, None]})
    smb = tx_frame([{"protocol": "smb2", "operation": "CREATE", "server": "s", "server_port": 445,
                     "request_frame": 9}, {"protocol": "smb2", "operation": "CREATE", "server": "s",
                                           "server_port": 445, "request_frame": 30}]).with_columns(
        pl.Series("path", ["\\\\s\\d\\x", "\\\\s\\d\\x"]), pl.Series("pending_ns", [None, 5 * MS]),
        pl.Series("pending_by_design", [False, False]))
    got = break_frames(breaks, smb, {"server": "s", "resource": "\\\\s\\d\\x"})
    assert got["breaks"]["frame"].to_list() == [10]
    assert sorted(got["waiters"]["frame"].to_list()) == [9, 30]  # the named trigger and the one that went pending


# -- TCP stall ----------------------------------------------------------------------------------------------

def segments_frame(n_data: int, retx_every: int = 0) -> pl.DataFrame:
    rows = []
    for k in range(n_data):
        rows.append({"t_ns": T0 + k * MS, "frame": 2 * k + 1, "from_sender": True, "seq_rel": k * 1000,
                     "seglen": 1000, "ack_rel": 1, "window_size": 65535, "bytes_in_flight": 4000,
                     "retransmission": bool(retx_every and k % retx_every == 0 and k)})
        rows.append({"t_ns": T0 + k * MS + MS // 2, "frame": 2 * k + 2, "from_sender": False, "seq_rel": 1,
                     "seglen": 0, "ack_rel": (k + 1) * 1000, "window_size": 65535, "bytes_in_flight": None,
                     "retransmission": False})
    return pl.DataFrame(rows)


def test_stevens_graph_layers():
    seg = segments_frame(50, retx_every=10)
    stalls = pl.DataFrame({"start_ns": [T0 + 20 * MS], "end_ns": [T0 + 30 * MS], "label": ["rto 10.0 ms"]})
    spec = stall_proof.stevens_chart(seg, t0_ns=T0, stalls=stalls).to_dict()
    top, bottom = spec["vconcat"]
    kinds = [mark_type(u) for u in units(top)]
    assert kinds.count("rect") == 1 and "text" in kinds and "line" in kinds and "point" in kinds
    point = next(u for u in units(top) if mark_type(u) == "point")
    assert point["encoding"]["y"]["field"] == "seq"
    pts = unit_data(spec, point)
    assert sum(r["what"] == "retransmission" for r in pts) == 4
    line = next(u for u in units(top) if mark_type(u) == "line")
    assert {r["line"] for r in unit_data(spec, line)} == {"ACK", "receive window (ACK + window)"}
    text = next(u for u in units(top) if mark_type(u) == "text")
    assert unit_data(spec, text)[0]["label"] == "rto 10.0 ms"
    (area,) = units(bottom)
    assert area["encoding"]["y"]["field"] == "bytes_in_flight"


def test_stevens_graph_thins_long_connections_keeps_retransmissions_and_says_so():
    seg = segments_frame(30_000, retx_every=500)
    chart = stall_proof.stevens_chart(seg, t0_ns=T0)
    spec = chart.to_dict()
    assert max(dataset_rows(spec)) <= MAX_ROWS
    n = notes(chart)
    assert any(x.startswith("sampled: ") and "all 59 retransmissions kept" in x for x in n)
    assert any(x.startswith("aggregated: 30,000 ACKs") for x in n)
    point = next(u for u in units(spec["vconcat"][0]) if mark_type(u) == "point")
    assert sum(r["what"] == "retransmission" for r in unit_data(spec, point)) == 59


def test_stall_frames_choose_the_data_direction():
    seg = pl.DataFrame({"frame": [1, 2, 3], "conn": [7, 7, 8], "from_client": [False, True, True],
                        "seq_rel": [1, 1, 1], "ack_rel": [1, 1001, 1], "seglen": [1000, 0, 5000],
                        "analysis": [0, 0, 1], "window_size": [100, 100, 100], "bytes_in_flight": [1000, None, 1]})
    packets = pl.DataFrame({"frame": [1, 2, 3], "ts_ns": [T0, T0 + MS, T0 + 2 * MS]})
    got = stall_frames(seg, packets, 7, pl.DataFrame({"start_ns": [T0], "end_ns": [T0 + MS], "kind": ["rto"]}))
    assert got["segments"]["from_sender"].to_list() == [True, False]
    assert got["stalls"]["label"].to_list() == ["rto 1.0 ms"]


# -- TOCTOU ---------------------------------------------------------------------------------------------

def test_toctou_windows_and_interleaved_change():
    tx = tx_frame([
        {"client": "A", "operation": "searchRequest", "request_ts_ns": T0, "request_frame": 1},
        {"client": "B", "operation": "searchRequest", "request_ts_ns": T0 + 3 * MS, "request_frame": 2},
        {"client": "B", "operation": "modifyRequest", "request_ts_ns": T0 + 20 * MS, "request_frame": 3},
        {"client": "A", "operation": "modifyRequest", "request_ts_ns": T0 + 30 * MS, "request_frame": 4},
        {"client": "C", "operation": "modifyRequest", "request_ts_ns": T0 + 90 * MS, "request_frame": 5},
    ]).with_columns(pl.lit("ldap").alias("protocol"))
    got = toctou_frames(tx, {"server": "10.0.0.53", "resource": "a.example", "start_ns": T0, "end_ns": T0 + 30 * MS})
    roles = dict(zip(got["ops"]["frame"].to_list(), got["ops"]["role"].to_list(), strict=True))
    assert roles == {1: "check", 2: "check", 3: "use", 4: "use", 5: "change"}
    win = {r["client"]: r for r in got["windows"].iter_rows(named=True)}
    assert win["A"]["interleaved"] and not win["B"]["interleaved"]  # B wrote inside A's window, not the other way
    assert got["ops"].filter(pl.col("interleaved"))["frame"].to_list() == [3]
    chart = toctou_proof.toctou_chart(got["ops"], got["windows"], t0_ns=T0, resource="a.example",
                                domain_ns=got["domain_ns"])
    spec = chart.to_dict()
    kinds = marks(spec)
    assert "bar" in kinds and "point" in kinds and "rule" in kinds
    text = [u for u in units(spec) if mark_type(u) == "text" and "label" in str(u["encoding"].get("text"))]
    assert any(r["label"] == "modifyRequest by B" for u in text for r in unit_data(spec, u))


def test_toctou_smb2_rename_onto_the_resource_is_a_use():
    PATH = "\\\\s\\d\\c.json"  # noqa: N806
    tx = tx_frame([
        {"client": "A", "operation": "QUERY_INFO", "resource": PATH, "request_ts_ns": T0, "request_frame": 1},
        {"client": "B", "operation": "CREATE", "resource": PATH, "request_ts_ns": T0 + 5 * MS, "request_frame": 2},
        {"client": "A", "operation": "SET_INFO", "resource": PATH + ".tmp", "request_ts_ns": T0 + 9 * MS,
         "request_frame": 3},
    ]).with_columns(pl.Series("create_disposition", [None, "OVERWRITE", None]),
                    pl.Series("target_name", [None, None, "c.json"]))
    got = toctou_frames(tx, {"server": "10.0.0.53", "resource": PATH, "start_ns": T0,
                             "end_ns": T0 + 9 * MS})
    assert got["ops"]["role"].to_list() == ["check", "change", "use"]
    assert got["windows"]["interleaved"].to_list() == [True]


# -- connection churn ------------------------------------------------------------------------------------

def test_churn_rate_and_lifetime_split():
    conns = pl.DataFrame({
        "conn": [0, 1], "client": ["10.0.3.1", "10.0.3.1"], "client_port": [40000, 40001],
        "server": ["10.0.0.89", "10.0.0.89"], "server_port": [389, 389],
        "first_ts_ns": [T0, T0 + 20 * MS], "syn_ts_ns": [T0, T0 + 20 * MS], "handshake_rtt_ns": [MS // 10] * 2,
        "last_ts_ns": [T0 + 4 * MS, T0 + 24 * MS],
    })
    tx = tx_frame([
        {"flow": 0, "transport": "tcp", "operation": "bindRequest", "request_ts_ns": T0 + MS // 5,
         "response_ts_ns": T0 + MS},
        {"flow": 0, "transport": "tcp", "operation": "searchRequest", "request_ts_ns": T0 + MS,
         "response_ts_ns": T0 + 2 * MS},
    ])
    got = churn_frames(conns, tx, {"server": "10.0.0.89:389", "client": "10.0.3.1"})
    lt = got["lifetimes"].sort("conn").row(0, named=True)
    assert (lt["handshake_ns"], lt["setup_ns"], lt["work_ns"], lt["close_ns"]) == (MS // 10, MS - MS // 10, MS, 2 * MS)
    spec = churn_proof.lifetime_chart(got["lifetimes"]).to_dict()
    (bar,) = units(spec)
    assert bar["encoding"]["y"]["stack"] == "zero" and bar["encoding"]["color"]["field"] == "phase"
    rate = churn_proof.churn_rate_chart(got["conns"], t0_ns=T0).to_dict()
    assert "2 connections" in rate["title"]["text"]


# -- transactions -------------------------------------------------------------------------------------

def test_latency_histogram_log_bins_stacked_by_series():
    tx = tx_frame([{"latency_ns": int(10 ** (3 + k / 20)), "operation": "A" if k % 2 else "AAAA"}
                   for k in range(100)] + [{"answered": False, "latency_ns": None, "response_ts_ns": None}])
    chart = charts.latency_histogram(tx.with_columns(pl.col("operation").alias("series")))
    spec = chart.to_dict()
    (bar,) = units(spec)
    assert bar["encoding"]["x"]["scale"]["type"] == "log"
    assert bar["encoding"]["y"]["field"] == "top" and bar["encoding"]["y2"]["field"] == "bottom"
    assert sum(r["count"] for r in unit_data(spec, bar)) == 100
    n = notes(chart)
    assert any(x.startswith("aggregated: 100 answered") for x in n)
    assert "1 unanswered (no latency) not shown" in n


def test_latency_over_time_points_then_percentiles_when_large():
    small = tx_frame([{"request_ts_ns": T0 + k * MS, "latency_ns": MS} for k in range(100)]).with_columns(
        pl.lit("A").alias("series"))
    spec = charts.latency_over_time(small, t0_ns=T0).to_dict()
    assert marks(spec) == ["circle"] and spec["encoding"]["y"]["scale"]["type"] == "log"
    n = 20_000
    big = pl.DataFrame({"request_ts_ns": T0 + np.arange(n, dtype=np.int64) * MS,
                        "latency_ns": np.arange(n, dtype=np.int64) % 1000 * 1000 + 1000}).with_columns(
        pl.lit("A").alias("series"), pl.lit(None, pl.String).alias("client"), pl.lit(None, pl.String).alias("server"),
        pl.lit("A").alias("operation"), pl.lit(None, pl.String).alias("resource"), pl.lit(1).alias("request_frame"))
    chart = charts.latency_over_time(big, t0_ns=T0)
    spec = chart.to_dict()
    assert marks(spec) == ["line"] and max(dataset_rows(spec)) <= MAX_ROWS
    assert any(x.startswith("aggregated: 20,000 transactions → p50/p99/max") for x in notes(chart))


def test_srt_table_matches_herdscope_stats_rules():
    tx = tx_frame([{"latency_ns": k * MS} for k in range(1, 11)] + [{"answered": False, "latency_ns": None}])
    row = srt_table(tx).row(0, named=True)
    assert (row["count"], row["answered"], row["unanswered"]) == (11, 10, 1)
    assert row["p50_ms"] == 6.0 and row["max_ms"] == 10.0  # the observed value above the middle ("higher")


def test_every_chart_stays_valid_vega_lite():
    """to_dict() validates against the Vega-Lite schema; a layer child must not carry top-level keys."""
    f = make_findings([{"start_ns": T0, "end_ns": T0 + S}])
    for chart in (charts.findings_timeline(f, t0_ns=T0, t1_ns=T0 + S),
                  stall_proof.stevens_chart(segments_frame(10), t0_ns=T0)):
        assert isinstance(chart.to_dict(validate=True), dict)
        assert isinstance(chart, (alt.Chart, alt.LayerChart, alt.VConcatChart))


# -- every proof chart agrees with its finding (real samples) -----------------------------------------

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
PROOF_SAMPLES = ("dns-ttl-herd.pcap", "smb2-break-queue.pcap", "tcp-rto-blackout.pcap", "ldap-conn-churn.pcap",
                 "smb2-toctou.pcap", "dns-retry-storm.pcapng")


def time_domains(spec: dict) -> list[list[float]]:
    """The x-scale domain of every unit drawn on a time axis (seconds since the first packet)."""
    out = []
    for u in units(spec):
        x = u.get("encoding", {}).get("x", {})
        if x.get("field") in ("t_s", "start_s") and "domain" in x.get("scale", {}):
            out.append(x["scale"]["domain"])
    return out


@pytest.fixture(scope="module")
def sample_proofs():
    """(sample, finding, t0, t1, zoomed charts, whole-capture charts) for every finding of PROOF_SAMPLES."""
    from dashboards.proofs import proof_charts
    from dashboards.frames import all_transactions, time_origin
    from shared_captures import shared_capture, shared_run

    out = []
    for name in PROOF_SAMPLES:
        cap = shared_capture(SAMPLES / name)  # read and scanned once per session (test_detectors_samples too)
        found = shared_run(SAMPLES / name)
        tx = all_transactions(cap)[0]
        t0, t1 = time_origin(cap)
        for row in found.iter_rows(named=True):
            zoomed = [c.to_dict() for c, _ in proof_charts(cap, row, found, tx)]
            whole = [c.to_dict() for c, _ in proof_charts(cap, row, found, tx, whole=True)]
            out.append((name, row, t0, t1, zoomed, whole))
    assert {name for name, *_ in out} == set(PROOF_SAMPLES)  # every sample gave findings to prove
    return out


def test_every_proof_chart_opens_on_the_finding_window_with_context(sample_proofs):
    from dashboards.charts.base import CONTEXT_FACTOR, MIN_CONTEXT_NS

    checked = set()
    for name, row, t0, t1, zoomed, whole in sample_proofs:
        w0, w1 = (row["start_ns"] - t0) / 1e9, (row["end_ns"] - t0) / 1e9
        context = max(CONTEXT_FACTOR * (w1 - w0), MIN_CONTEXT_NS / 1e9)
        domains = [d for spec in zoomed for d in time_domains(spec)]
        assert domains, (name, row["detector"])
        for lo, hi in domains:  # the window and its context before and after, and not the whole capture
            assert lo <= w0 - context + 1e-6 and hi >= w1 + context - 1e-6, (name, row["detector"], lo, hi, w0, w1)
            assert hi - lo <= 2 * context + (w1 - w0) + 1e-6
        for lo, hi in (d for spec in whole for d in time_domains(spec)):  # the toggle: the whole capture
            assert lo <= 1e-6 and hi >= (t1 - t0) / 1e9 - 1e-6
        checked.add(row["detector"])
    assert checked == {"herd", "smb_break_queue", "tcp_stall", "conn_churn", "toctou", "retry_storm"}


def test_ttl_marks_align_with_the_herds_they_triggered(sample_proofs):
    from detectors.herd import Params

    herds = [(row, t0, t1, zoomed) for name, row, t0, t1, zoomed, _ in sample_proofs
             if name == "dns-ttl-herd.pcap" and row["detector"] == "herd"]
    assert len(herds) == 3
    tol = Params().ttl_tolerance_ns / 1e9
    for row, t0, t1, zoomed in herds:
        spec = zoomed[0]
        start = (row["start_ns"] - t0) / 1e9
        bands = [r for u in units(spec) if mark_type(u) == "rect"
                 for r in unit_data(spec, u) if r.get("label") == "TTL expiry"]
        assert bands, row["explanation"]
        # the herd starts inside an expiry band, as the detector reads the TTL: [answer + TTL - tol,
        # answer + TTL + 1 s + tol] (TTLs are whole seconds) — not a second before it
        hit = [b for b in bands if b["start_s"] <= start <= b["end_s"]]
        assert hit, (start, bands)
        # a band spans the answers' spread (the first herd's clients started over 6 s, their TTLs counted
        # down with the resolver's cache) plus the whole second and the tolerance; no wider
        assert all(b["end_s"] - b["start_s"] <= 1 + 2 * tol + 1.5 for b in hit)
        assert start - hit[0]["start_s"] >= tol  # the herd is after the earliest expiry, not before it
    # the last herd of the capture is not on the chart's right edge: its context runs past the capture's end
    last_row, t0, t1, zoomed = max(herds, key=lambda h: h[0]["start_ns"])
    (lo, hi), *_ = time_domains(zoomed[0])
    assert hi - (last_row["end_ns"] - t0) / 1e9 >= 1.0


def test_a_short_herd_is_wide_enough_to_see(sample_proofs):
    name, row, t0, t1, zoomed, whole = next(p for p in sample_proofs if p[1]["detector"] == "herd")
    (lo, hi), *_ = time_domains(zoomed[0])
    share = (row["end_ns"] - row["start_ns"]) / 1e9 / (hi - lo)
    assert share * charts.base.PANEL_WIDTH >= 10  # a 48 ms herd takes at least 10 of the panel's pixels


# -- tables never show None --------------------------------------------------------------------------

def test_display_table_blanks_missing_values():
    from dashboards.frames import BLANK, display_table, number_config

    t = pl.DataFrame({"s": ["a", None], "i": [1, None], "f": [1.23456, float("nan")], "ok": [1.5, 2.5],
                      "l": [[1, 2], None], "b": [True, None]})
    out = display_table(t, {"f": "%.3f"})
    assert out["s"].to_list() == ["a", BLANK] and out["i"].to_list() == ["1", BLANK]
    assert out["f"].to_list() == ["1.235", BLANK] and out["l"].to_list() == ["1, 2", BLANK]
    assert out["ok"].dtype == pl.Float64  # no nulls: stays a number (and keeps its NumberColumn format)
    assert number_config(out, {"f": 1, "ok": 2, "x": 3}) == {"ok": 2, "x": 3}


def _cells(frame) -> list:
    value = frame.value if isinstance(frame.value, pl.DataFrame) else pl.from_pandas(frame.value)
    return [v for row in value.iter_rows() for v in row], value


def test_no_none_in_rendered_tables(monkeypatch):
    pytest.importorskip("streamlit")
    import math

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboards.settings import ENV, Settings

    st.cache_data.clear()
    st.cache_resource.clear()
    monkeypatch.delenv("HERDSCOPE_TSHARK", raising=False)
    monkeypatch.setenv("HERDSCOPE_TSHARK", "/nonexistent/tshark")  # no dissection: faster, and not under test
    monkeypatch.setenv(ENV, Settings(files=(str(SAMPLES / "dns-ttl-herd.pcap"),)).to_env())
    at = AppTest.from_file(str(SAMPLES.parent / "dashboards" / "streamlit_app.py"), default_timeout=120).run()
    seen = 0
    for page in ("Overview", "Findings", "Transactions"):
        at.sidebar.radio(key="page").set_value(page).run()
        assert not at.exception, [e.value for e in at.exception]
        for frame in at.dataframe:
            cells, value = _cells(frame)
            seen += 1
            assert not any(v is None or (isinstance(v, float) and math.isnan(v)) for v in cells), (page, value)
            assert not any(str(v) == "None" for v in cells), (page, value)
        if page == "Findings":
            findings = next(_cells(f)[1] for f in at.dataframe if "finding_id" in _cells(f)[1].columns)
            assert "—" in findings["client"].to_list()  # herds have no single client: a dash, not None
            specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
            zoomed = max(hi - lo for spec in specs for lo, hi in time_domains(spec))
            toggle = next(t for t in at.toggle if t.key.startswith("whole_"))
            toggle.set_value(True).run()
            specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
            widest = max(hi - lo for spec in specs for lo, hi in time_domains(spec))
            assert zoomed < 5 and widest > 30  # the 32.7 s capture, after the toggle
    assert seen >= 4


# -- incident swim lanes -----------------------------------------------------------------------------

def test_incident_lanes_one_lane_per_protocol_and_server_trigger_marked_and_clickable():
    f = make_findings([
        {"start_ns": T0 + 1 * S, "end_ns": T0 + 1 * S + 50 * MS, "severity": "critical"},
        {"start_ns": T0 + 2 * S, "end_ns": T0 + 2 * S + 300 * MS, "kind": "kerberos", "server": "10.0.0.88",
         "resource": "krbtgt/X@X"},
        {"start_ns": T0 + 9 * S, "end_ns": T0 + 9 * S, "severity": "low", "resource": "other.example"},
    ])
    ids = f["finding_id"].to_list()
    incident = {"incident_id": "ab" * 8, "start_ns": T0 + 1 * S, "end_ns": T0 + 2 * S + 300 * MS,
                "severity": "critical", "trigger": ids[0], "findings": ids[:2],
                "lanes": [{"lane": "dns 10.0.0.53", "protocol": "dns", "server": "10.0.0.53", "finding_ids": ids[:1]},
                          {"lane": "kerberos 10.0.0.88", "protocol": "kerberos", "server": "10.0.0.88",
                           "finding_ids": ids[1:2]}]}
    spec = charts.incident_lanes(incident, f, t0_ns=T0).to_dict()
    assert marks(spec) == ["bar", "text"]
    bars, label = units(spec)
    enc = bars["encoding"]
    assert enc["y"]["field"] == "lane" and enc["y"]["sort"] == ["dns 10.0.0.53", "kerberos 10.0.0.88"]
    assert enc["color"]["field"] == "severity" and enc["color"]["scale"]["domain"] == list(SEVERITIES)
    assert enc["x"]["field"] == "start_s" and enc["x2"]["field"] == "bar_end_s"
    lo, hi = enc["x"]["scale"]["domain"]
    assert lo < 1.0 and 2.3 < hi < 9.0  # the incident's span (padded), not the capture's
    rows = unit_data(spec, bars)
    assert {r["finding_id"] for r in rows} == set(ids[:2])  # the finding outside the incident is not drawn
    assert {r["finding_id"]: r["lane"] for r in rows} == {ids[0]: "dns 10.0.0.53", ids[1]: "kerberos 10.0.0.88"}
    assert [r["finding_id"] for r in rows if r["trigger"]] == [ids[0]]
    assert enc["strokeWidth"]["condition"]["test"] == "datum.trigger"
    assert label["transform"] == [{"filter": "datum.trigger"}] and label["encoding"]["text"]["field"] == "mark"
    pick = next(p for p in spec["params"] if p["name"] == charts.PICK)
    assert pick["select"]["fields"] == ["finding_id"]
