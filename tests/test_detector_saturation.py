"""detectors/saturation.py: the knee (latency growing with concurrency while completions/s plateau), the
collapse, the retries, the false positives it must not report, and detectors/tcp_turns.py (the shared
TCP request/response turns). Constructed transactions come from a small FCFS queue simulation
(``servers`` workers, fixed service time), so the numbers asserted follow from queueing, not from the
detector."""
from __future__ import annotations

import heapq
import random
from pathlib import Path

import polars as pl
import pytest

from detectors import saturation, tcp_turns
from detectors.base import SEVERITY_RANK
from fakes import MS, S, T0, FakeCapture, transaction_frame

SAMPLES = Path(__file__).parent.parent / "samples"
SERVER = "10.0.0.89"


def simulate(arrivals, servers: int, service_ns: int, closed: dict | None = None):
    """FCFS queue: ``arrivals`` (t, client) open-loop requests, or ``closed`` = {client: (join_ns, end_ns,
    think_ns)} closed-loop clients (each sends its next request ``think_ns`` after its answer).
    Returns [(client, t_request, latency)]."""
    free = [0] * servers
    heap = list(arrivals)
    heapq.heapify(heap)
    for c, (join, _, _) in (closed or {}).items():
        heapq.heappush(heap, (join, c))
    out = []
    while heap:
        t, c = heapq.heappop(heap)
        w = heapq.heappop(free)
        done = max(t, w) + service_ns
        heapq.heappush(free, done)
        out.append((c, t, done - t))
        if closed and c in closed and done + closed[c][2] < closed[c][1]:
            heapq.heappush(heap, (done + closed[c][2], c))
    return out


def ramp_closed(steps=(1, 2, 4, 8, 16), step_ns=2 * S, servers=2, service_ns=10 * MS, think_ns=0):
    end = T0 + len(steps) * step_ns
    closed = {}
    for i in range(max(steps)):
        first = next(k for k, n in enumerate(steps) if n > i)
        closed[f"10.0.1.{i + 1}"] = (T0 + first * step_ns + i * 10_000, end, think_ns)
    return simulate([], servers, service_ns, closed)


def ramp_open(rates=(10, 20, 40, 60, 80, 100), step_ns=2 * S, servers=2, service_ns=10 * MS, clients=24, seed=3):
    rng = random.Random(seed)
    arr, t = [], T0
    for k, rate in enumerate(rates):
        end = T0 + (k + 1) * step_ns
        while True:
            t += int(rng.expovariate(rate) * S)
            if t >= end:
                t = end
                break
            arr.append((t, f"10.0.1.{rng.randrange(clients) + 1}"))
    return simulate(arr, servers, service_ns)


def capture_of(rows, *, op="searchRequest", port_of=None, **extra):
    """A FakeCapture with ldap_transactions for the simulated (client, t, latency) rows; a latency of
    None is unanswered."""
    tx = []
    for k, (c, t, lat) in enumerate(sorted(rows, key=lambda r: r[1])):
        tx.append(dict(t=t, client=c, lat=lat if lat is not None else 0, answered=lat is not None, op=op,
                       server=SERVER, server_port=389, transport="tcp", flow=k % 50,
                       port=port_of(c) if port_of else 40000 + int(c.rsplit(".", 1)[1]), frame=2 * k + 1,
                       **{n: v[k] for n, v in extra.items()}))
    frame = transaction_frame(tx, protocol="ldap", **{n: 0 for n in extra})
    return FakeCapture(ldap_transactions=frame)


def run(cap, **over):
    return saturation.detect(cap, saturation.Params(**over))


def test_closed_loop_ramp_past_the_knee_is_saturation():
    f = run(capture_of(ramp_closed()))
    assert f.height == 1, f
    r = f.row(0, named=True)
    assert r["kind"] == "saturation" and r["resource"] == f"{SERVER}:389 searchRequest"
    assert SEVERITY_RANK[r["severity"]] >= SEVERITY_RANK["medium"]
    # 2 workers x 10 ms: capacity 200/s, reached at 2 outstanding; past it 8 to 16 outstanding wait 40-80 ms
    assert "200/s" in r["explanation"] and r["clients"] >= 8
    assert 3.0 <= r["value"] <= 9.0
    # the finding starts past the knee: when 4 or more clients are in (the third step, 4 s after T0)
    assert r["start_ns"] >= T0 + 3 * S


def test_a_healthy_open_loop_ramp_is_silent():
    rows = ramp_open()   # up to 100/s against 200/s: completions follow the offered load, latency flat
    assert len(rows) > 400
    assert run(capture_of(rows)).height == 0


def test_a_server_slow_at_low_load_is_not_saturated():
    # 300 ms per request but 16 workers and 20 requests/s: high latency, flat, ~6 outstanding
    rows = ramp_open(rates=(5, 10, 15, 20, 20, 20), servers=16, service_ns=300 * MS)
    assert run(capture_of(rows)).height == 0


def test_one_client_pipelining_is_at_most_low():
    rows = [("10.0.1.1", t, lat) for _, t, lat in ramp_closed()]   # every request from one client, one port
    f = run(capture_of(rows, port_of=lambda c: 40000))
    assert f.height == 1 and f["severity"][0] == "low" and f["clients"][0] == 1
    assert "client-side limit" in f["explanation"][0]


def test_collapse_with_retries_is_critical():
    rows = ramp_closed(steps=(1, 2, 4, 8, 8, 8))
    # then, for longer than it was saturated, the offered load keeps rising (500/s, retries among it)
    # while the server answers 1 in 5 (100/s: half its capacity)
    rng = random.Random(7)
    t0 = T0 + 12 * S
    extra_rows, retries = [], []
    for k in range(6000):
        t = t0 + k * 2 * MS
        answered = k % 5 == 0
        extra_rows.append((f"10.0.1.{rng.randrange(16) + 1}", t, 300 * MS if answered else None))
    rows = rows + extra_rows
    rows.sort(key=lambda r: r[1])
    retries = [1 if (r[1] >= t0 and r[2] is None) else 0 for r in rows]
    f = run(capture_of(rows, retries=retries))
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "collapse" and r["severity"] == "critical", r
    assert "collapses" in r["explanation"] and "amplifying" in r["explanation"]
    # without the retries it is still a collapse, one step lower
    f = run(capture_of(rows))
    assert f["kind"][0] == "collapse" and f["severity"][0] == "high"
    # Kerberos marks its UDP retries per request (``retransmission``): the same reading
    krb = capture_of(rows, retransmission=[bool(x) for x in retries]).frame("ldap_transactions").with_columns(
        pl.lit("kerberos").alias("protocol"), pl.lit(88, pl.UInt16).alias("server_port"),
        pl.lit("AS-REQ").alias("operation"))
    f = run(FakeCapture(kerberos_transactions=krb))
    assert f["resource"][0] == f"{SERVER}:88 AS-REQ" and f["severity"][0] == "critical"


def test_throughput_falling_as_clients_pile_up_is_a_collapse():
    # a lock that thrashes: with n writers queued each write takes 10 ms x n^0.8 (one worker), so every
    # added closed-loop client lowers the completions/s (the MDB writes of ldap-saturation-writes did)
    rows, t = [], T0
    for k, n in enumerate((1, 1, 2, 4, 8, 16, 24)):
        step = ramp_closed(steps=(n,), step_ns=2 * S, servers=1, service_ns=int(10 * MS * n ** 0.8))
        rows += [(c, t0 + k * 2 * S, lat) for c, t0, lat in step]
    f = run(capture_of(rows))
    assert f.height == 1 and f["kind"][0] == "collapse" and f["severity"][0] in ("high", "critical")
    assert "fall to" in f["explanation"][0]


def test_smb2_credits_granted_against_requested_are_told():
    rows = ramp_closed()
    cap = capture_of(rows, op="READ")
    tx = cap.frame("ldap_transactions").with_columns(pl.lit("smb2").alias("protocol"),
                                                     pl.lit(445, pl.UInt16).alias("server_port"))
    # each request asks for 8 credits; the server grants 8 until the knee (4 clients in, at 4 s), then 1
    knee_at = T0 + 4 * S
    msgs = pl.concat([
        tx.select(pl.lit("smb2").alias("kind"), pl.lit(True).alias("from_client"), pl.col("client").alias("src"),
                  pl.col("server").alias("dst"), pl.col("request_ts_ns").alias("ts_first_ns"),
                  pl.lit(False).alias("is_response"), pl.lit(8, pl.UInt16).alias("credit_request"),
                  pl.lit(0, pl.UInt16).alias("credit_grant")),
        tx.select(pl.lit("smb2").alias("kind"), pl.lit(False).alias("from_client"), pl.col("server").alias("src"),
                  pl.col("client").alias("dst"), pl.col("response_ts_ns").alias("ts_first_ns"),
                  pl.lit(True).alias("is_response"), pl.lit(0, pl.UInt16).alias("credit_request"),
                  pl.when(pl.col("response_ts_ns") < knee_at).then(8).otherwise(1).cast(pl.UInt16)
                  .alias("credit_grant"))])
    f = run(FakeCapture(smb2_transactions=tx, smb2_messages=msgs))
    assert f.height == 1 and f["resource"][0] == f"{SERVER}:445 READ"
    text = f["explanation"][0]
    assert "SMB2 credits past the knee" in text
    granted, requested = (int(x) for x in text.split("SMB2 credits past the knee: ")[1].split(" requested")[0]
                          .split(" granted for "))
    assert requested > 4 * granted > 0   # past the knee: about 1 granted for each 8 asked
    g0, r0 = (int(x) for x in text.split("before it: ")[1].split(")")[0].split(" for "))
    assert 0 < r0 < 1.2 * g0             # before it: what was asked (the windows' edges aside)


def test_gates_keep_their_direction():
    cap = capture_of(ramp_closed())
    value = run(cap)["value"][0]
    assert run(cap, min_latency_factor=value + 0.5).height == 0
    assert run(cap, high_latency_factor=value - 0.1)["severity"][0] == "high"
    assert run(cap, min_requests=10**6).height == 0
    assert run(cap, min_knee_concurrency=50.0).height == 0   # the knee is at ~2 outstanding
    assert run(cap, min_clients=100)["severity"][0] == "low"


def test_thin_or_hostile_input_is_quiet():
    assert run(FakeCapture()).height == 0
    rows = [(c, t, None) for c, t, _ in ramp_closed()]   # nothing answered (one direction)
    assert run(capture_of(rows)).height == 0
    # timestamps near the end of int64 and a single giant latency: no crash, no finding
    big = 2**62
    odd = [("10.0.1.1", big + k * MS, 1) for k in range(300)] + [("10.0.1.2", big, 2**61)]
    assert run(capture_of(odd)).height == 0


def _segments(rows):
    return pl.DataFrame(rows, schema={"conn": pl.UInt32, "frame": pl.UInt32, "ts_ns": pl.Int64,
                                      "from_client": pl.Boolean, "seglen": pl.UInt32, "analysis": pl.UInt32},
                        orient="row")


def test_tcp_turns_cut_a_connection_into_requests_and_answers():
    seg = _segments([
        (1, 1, 100, True, 0, 0),      # handshake ACK: no payload
        (1, 2, 200, True, 50, 0), (1, 3, 210, True, 50, 1),   # one request in two segments, a retransmission
        (1, 4, 900, False, 80, 0), (1, 5, 950, False, 80, 0),  # its answer
        (1, 6, 1000, True, 40, 0),                             # a second request, never answered
        (2, 7, 300, False, 10, 0),                             # a server banner first
        (2, 8, 400, True, 10, 0), (2, 9, 600, False, 10, 0),
    ])
    t = tcp_turns.turns(seg).sort("conn", "turn")
    assert t.select("conn", "request_first_frame", "request_frame", "response_frame").rows() == [
        (1, 2, 3, 4), (1, 6, 6, None), (2, 8, 8, 9)]
    assert t["retransmitted"].to_list() == [True, False, False]
    assert (t["response_ts_ns"] - t["request_ts_ns"]).to_list() == [690, None, 200]
    # conn_churn's count of turns per connection is the same cut
    s = tcp_turns.payload_segments(seg).with_columns(tcp_turns.turn_start())
    assert s.group_by("conn").agg(pl.col("turn").sum()).sort("conn")["turn"].to_list() == [2, 1]


def test_tcp_turns_feed_the_detector_where_no_decoder_applies():
    rows = ramp_closed()
    segs, conns = [], []
    frame = 1
    for k, (c, t, lat) in enumerate(sorted(rows, key=lambda r: r[1])):
        segs += [(k, frame, t, True, 60, 0), (k, frame + 1, t + lat, False, 200, 0)]
        frame += 2
        conns.append((k, c, 40000 + k % 30000, SERVER, 7000))
    seg = _segments(segs)
    con = pl.DataFrame(conns, schema={"conn": pl.UInt32, "client": pl.String, "client_port": pl.UInt16,
                                      "server": pl.String, "server_port": pl.UInt16}, orient="row").with_columns(
        pl.lit(1, pl.UInt32).alias("client_packets"), pl.lit(1, pl.UInt32).alias("server_packets"))
    f = run(FakeCapture(tcp_segments=seg, connections=con))
    assert f.height == 1 and f["resource"][0] == f"{SERVER}:7000 turn"
    assert "request/response turns" in f["explanation"][0]


@pytest.mark.skipif(not (SAMPLES / "ldap-saturation.pcap").exists(), reason="real sample not recorded")
def test_real_slapd_ramp_and_its_twin():
    from analyzer import open_capture

    f = saturation.detect(open_capture(SAMPLES / "ldap-saturation.pcap"))
    assert f.height == 1 and SEVERITY_RANK[f["severity"][0]] >= SEVERITY_RANK["medium"]
    assert f["resource"][0] == "10.77.0.89:389 searchRequest"
    assert saturation.detect(open_capture(SAMPLES / "ldap-saturation-healthy.pcap")).height == 0
