"""conn_churn on tiny constructed connections / transactions frames (FakeCapture; each kind fires,
near-misses stay quiet), on a scripted pcap for the TCP-only count, and on the labelled churn of the
synthetic benchmark capture."""
import json
from pathlib import Path

import polars as pl
import pytest

from builders import handshake, tcp_conversation
from detectors import conn_churn
from detectors.base import FINDINGS_SCHEMA
from fakes import FakeCapture
from shared_captures import shared_capture
from synthetic import synthetic_detect, synthetic_labels
from tshark_ref import corpus_files

US, MS, S = 1_000, 1_000_000, 1_000_000_000
T0 = 1_700_000_000 * S
ROOT = Path(__file__).parent.parent

CONN_SCHEMA = {
    "conn": pl.UInt32, "client": pl.String, "client_port": pl.UInt16, "server": pl.String,
    "server_port": pl.UInt16, "first_ts_ns": pl.Int64, "last_ts_ns": pl.Int64, "first_frame": pl.UInt32,
    "client_packets": pl.UInt32, "server_packets": pl.UInt32, "syn_ts_ns": pl.Int64, "synack_ts_ns": pl.Int64,
    "saw_syn": pl.Boolean, "saw_synack": pl.Boolean, "reused_ports": pl.Boolean, "history": pl.String,
    "conn_state": pl.String, "rtt_client_server_ns": pl.Int64, "handshake_rtt_ns": pl.Int64,
    "saw_start": pl.Boolean,
}


def connections(n, rate, *, client="10.0.0.1", server="10.0.0.89", port=389, start=T0, life=3 * MS, rtt=40 * US,
                first_conn=0, history="ShADadFf", state="SF", ports=None, server_packets=6, reused=False):
    """n connections from client to server:port, one every 1/rate s, each living ``life``."""
    rows = []
    for k in range(n):
        t = start + int(k * S / rate)
        rows.append({
            "conn": first_conn + k, "client": client, "client_port": (ports[k] if ports else 40000 + k),
            "server": server, "server_port": port, "first_ts_ns": t, "last_ts_ns": t + life,
            "first_frame": 1 + 10 * (first_conn + k), "client_packets": 9,
            "server_packets": server_packets if state not in ("S0",) else 0, "syn_ts_ns": t,
            "synack_ts_ns": t + rtt // 2 if state not in ("S0", "REJ") else None,
            "saw_syn": True, "saw_synack": state not in ("S0", "REJ"),
            "reused_ports": reused and ports is not None and ports[k] in ports[:k],
            "history": history, "conn_state": state, "rtt_client_server_ns": rtt // 2, "handshake_rtt_ns": rtt,
            "saw_start": True,
        })
    return pl.DataFrame(rows, schema=CONN_SCHEMA)


def ldap_tx(conns, searches=1, bind_ms=0.6, gap=200 * US):
    """bind, ``searches`` searches and unbind on every connection (ldap_transactions columns the
    detector reads)."""
    rows = []
    for c in conns.iter_rows(named=True):
        t = c["syn_ts_ns"] + c["handshake_rtt_ns"] + 100 * US
        ops = [("bindRequest", int(bind_ms * MS))] + [("searchRequest", 300 * US)] * searches + [("unbindRequest", 0)]
        for op, lat in ops:
            rows.append({"transport": "tcp", "flow": c["conn"], "operation": op, "request_ts_ns": t,
                         "response_ts_ns": t + lat if op != "unbindRequest" else None})
            t += lat + gap
    return pl.DataFrame(rows, schema={"transport": pl.String, "flow": pl.UInt32, "operation": pl.String,
                                      "request_ts_ns": pl.Int64, "response_ts_ns": pl.Int64})


def smb2_tx(conns):
    """A whole SMB2 session per connection around one file open (smb2_transactions columns read)."""
    rows = []
    ops = ["NEGOTIATE", "SESSION_SETUP", "SESSION_SETUP", "TREE_CONNECT", "CREATE", "READ", "CLOSE",
           "TREE_DISCONNECT", "LOGOFF"]
    for c in conns.iter_rows(named=True):
        t = c["syn_ts_ns"] + c["handshake_rtt_ns"] + 50 * US
        for op in ops:
            rows.append({"transport": "tcp", "flow": c["conn"], "operation": op, "request_ts_ns": t,
                         "response_ts_ns": t + 150 * US})
            t += 250 * US
    return pl.DataFrame(rows, schema={"transport": pl.String, "flow": pl.UInt32, "operation": pl.String,
                                      "request_ts_ns": pl.Int64, "response_ts_ns": pl.Int64})


def detect(cap, **params):
    return conn_churn.detect(cap, conn_churn.Params(**params))


def test_churn_with_ldap_transactions():
    conns = connections(60, 20.0)
    f = detect(FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns)))
    assert f.height == 1
    r = f.row(0, named=True)
    assert (r["kind"], r["severity"], r["client"], r["server"], r["resource"]) == \
        ("churn", "medium", "10.0.0.1", "10.0.0.89", "10.0.0.89:389")
    assert r["clients"] == 1 and r["client_identity"] == "address"
    assert r["metric"] == "connections_per_s" and r["value"] == pytest.approx(20.0) and r["threshold"] == 10.0
    assert r["evidence_total"] == 60 and r["evidence_frames"][:3] == [1, 11, 21]  # the SYNs
    e = r["explanation"]
    assert e.startswith("60 connections from 10.0.0.1 to 10.0.0.89:389 in 2.95 s (20.0/s), each carrying 1 search")
    assert "counted as LDAP operations" in e and "handshake and bind" in e and "TIME_WAIT" in e
    assert e.endswith("reuse one connection (a pool) instead of connecting per request.")


def test_churn_with_smb2_transactions():
    conns = connections(30, 12.0, server="10.0.0.45", port=445)
    r = detect(FakeCapture(connections=conns, smb2_transactions=smb2_tx(conns))).row(0, named=True)
    assert r["severity"] == "medium" and r["resource"] == "10.0.0.45:445"
    assert "each carrying 1 open (median, counted as SMB2 opens (smb2_transactions))" in r["explanation"]
    assert "handshake and negotiate/session setup" in r["explanation"]


def test_pooled_connections_are_not_churn():
    conns = connections(60, 20.0, life=2 * S)
    assert detect(FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns, searches=50))).height == 0


def test_slow_or_few_connections():
    # one every 30 s: every connection is its own episode (a pool would have timed out)
    conns = connections(12, 1 / 30)
    assert detect(FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns))).height == 0
    # 9 connections is under min_connections
    conns = connections(9, 20.0)
    assert detect(FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns))).height == 0
    # 1/s: churn, but below the medium rate; lowered, medium
    conns = connections(12, 1.0)
    cap = FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns))
    assert detect(cap)["severity"].cast(pl.String).to_list() == ["low"]
    assert detect(cap, medium_rate_per_s=0.5)["severity"].cast(pl.String).to_list() == ["medium"]


def test_churn_episode_inside_a_long_capture():
    # the same client also makes a few ordinary connections far away: the episode's rate counts
    conns = pl.concat([connections(3, 0.05, start=T0 - 400 * S),
                       connections(100, 50.0, first_conn=3)])
    f = detect(FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns)))
    r = f.row(0, named=True)
    assert f.height == 1 and r["value"] == pytest.approx(50.0) and r["start_ns"] == T0


def test_time_wait_pressure_and_port_reuse():
    conns = connections(600, 150.0)
    f = detect(FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns)))
    assert f["severity"].cast(pl.String).to_list() == ["high"]  # >= 100/s
    # 4-tuples reused inside TIME_WAIT (ports cycling): high even at 20/s
    conns = connections(40, 20.0, ports=[50000 + k % 10 for k in range(40)], reused=True)
    r = detect(FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns))).row(0, named=True)
    assert r["severity"] == "high" and "30 4-tuples were reused, the soonest after" in r["explanation"]
    # the server closes first: TIME_WAIT is on the server, no client port pressure
    conns = connections(40, 20.0, history="ShADadfF")
    r = detect(FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns))).row(0, named=True)
    assert "the server closes first" in r["explanation"] and r["severity"] == "medium"
    # client port exhaustion: 500/s x 60 s > the whole ephemeral range, and the capture shows 24,000 of them
    conns = connections(24_000, 500.0)
    assert detect(FakeCapture(connections=conns))["severity"].cast(pl.String).to_list() == ["critical"]
    # ... but the TIME_WAIT estimate never exceeds the connections seen: 1,000 in 2 s hold at most 1,000
    r = detect(FakeCapture(connections=connections(1000, 500.0))).row(0, named=True)
    assert r["severity"] == "high" and "about 1,000 of its 28,232 ephemeral ports" in r["explanation"]


def test_an_isolated_burst_is_churn_but_not_a_rate():
    """21 connections in 14 ms, one request each, then nothing (an exploit's burst, suricata-verify
    smb-filename; redis-benchmark's 15 in 6 ms, tcpdump resp_1_benchmark): churn, low. The rate is
    measured over at least rate_min_span_ns (20/s, not 1,430/s), the rate steps need an episode that
    long, and TIME_WAIT holds at most the 21 ports used, not the whole range."""
    burst = connections(21, 1_430.0, port=445, life=2 * MS)
    r = detect(FakeCapture(connections=burst)).row(0, named=True)
    assert r["severity"] == "low" and r["value"] == pytest.approx(20.0)
    assert "an isolated burst: 20.0/s over the 1 s" in r["explanation"]
    assert "about 21 of its 28,232 ephemeral ports sit in TIME_WAIT (0%, at most the connections seen)" \
        in r["explanation"]
    # the same 21 connections spread over 2 s are a sustained 10/s: medium
    assert detect(FakeCapture(connections=connections(21, 10.0, port=445)))["severity"].to_list() == ["medium"]
    # rate_min_span_ns is a lower bound: lowered, the burst's own span is its rate (high); raised, never more
    assert detect(FakeCapture(connections=burst), rate_min_span_ns=MS)["severity"].to_list() == ["high"]
    assert detect(FakeCapture(connections=burst), rate_min_span_ns=10 * S)["severity"].to_list() == ["low"]


def test_one_shot_protocols_and_one_vantage_point():
    conns = connections(60, 20.0, port=88)
    r = detect(FakeCapture(connections=conns)).row(0, named=True)
    assert r["severity"] == "low" and "this protocol's norm" in r["explanation"]
    assert detect(FakeCapture(connections=connections(60, 2.0, port=88))).height == 0
    conns = connections(60, 20.0, server_packets=0)
    r = detect(FakeCapture(connections=conns)).row(0, named=True)
    assert r["severity"] == "informational" and "one direction only" in r["explanation"]


def test_tcp_only_counts_request_turns(read_capture):
    # 12 short connections, each: handshake, request, response, second request, response, close
    caps = []
    for k in range(12):
        t = k * 150 * MS
        steps = [dict(s, t=s["t"] + t) for s in handshake(0, rtt=40 * US)] + [
            {"t": t + 100 * US, "from_client": True, "data": b"q" * 50, "flags": 0x18},
            {"t": t + 200 * US, "from_client": False, "data": b"r" * 80, "flags": 0x18},
            {"t": t + 300 * US, "from_client": True, "data": b"q" * 50, "flags": 0x18},
            {"t": t + 400 * US, "from_client": False, "data": b"r" * 80, "flags": 0x18},
            {"t": t + 500 * US, "from_client": True, "flags": 0x11},
            {"t": t + 520 * US, "from_client": False, "flags": 0x11},
            {"t": t + 540 * US, "from_client": True, "flags": 0x10}]
        caps.append(read_capture(tcp_conversation(steps, client=("10.0.0.1", 40000 + k), server=("10.0.0.2", 7000)),
                                 name=f"c{k}.pcap"))
    # the 12 analysed conversations as one capture's frames (connection ids and frame numbers shifted)
    conns = pl.concat([c.frame("connections").with_columns(pl.lit(k, pl.UInt32).alias("conn"),
                                                            (pl.col("first_frame") + 100 * k).alias("first_frame"))
                       .with_columns(pl.col("client").cast(pl.String), pl.col("server").cast(pl.String))
                       for k, c in enumerate(caps)], how="vertical_relaxed")
    segs = pl.concat([c.frame("tcp_segments").with_columns(pl.lit(k, pl.UInt32).alias("conn"),
                                                            (pl.col("frame") + 100 * k).alias("frame"))
                      for k, c in enumerate(caps)])
    pkts = pl.concat([c.packets.select((pl.col("frame") + 100 * k).alias("frame"), "ts_ns")
                      for k, c in enumerate(caps)])
    f = detect(FakeCapture(connections=conns, tcp_segments=segs, packets=pkts))
    r = f.row(0, named=True)
    assert (r["kind"], r["severity"]) == ("churn", "low")  # 6.7/s, under the 10/s medium rate
    assert "each carrying 2 requests (median, counted as TCP request turns (no decoder for this port))" \
        in r["explanation"]
    assert detect(FakeCapture(connections=conns, tcp_segments=segs, packets=pkts),
                  max_turns_per_connection=1).height == 0


def test_syn_backlog_overflow():
    # 40 connections accepted at 40/s and held open: the accept queue fills while SYNs go unanswered
    ok = connections(40, 40.0, server="10.0.0.80", port=80, client="10.0.1.1", life=5 * S)
    dropped = connections(6, 6.0, server="10.0.0.80", port=80, client="10.0.1.2", first_conn=100, state="S0",
                          history="S")
    f = detect(FakeCapture(connections=pl.concat([ok, dropped])))
    r = f.filter(pl.col("kind") == "syn_backlog").row(0, named=True)
    assert r["severity"] == "medium" and r["resource"] == "10.0.0.80:80" and r["client"] is None
    # the first drop came with the first connection, none open yet: not a full queue's, so not counted
    assert r["value"] == pytest.approx(5 / 46) and r["evidence_total"] == 5
    assert r["explanation"].startswith("5 of 46 connection attempts to 10.0.0.80:80 from 1 client")
    assert "and at least 5 established connections to it were open (20, median at those SYNs)" in r["explanation"]
    # the same unanswered SYNs on a lightly loaded service (each connection 3 ms, none open at the
    # drops): random SYN loss on the path, not a full listen queue; the gate is a lower bound
    light = pl.concat([ok.with_columns((pl.col("syn_ts_ns") + 3 * MS).alias("last_ts_ns")),
                       dropped])
    assert detect(FakeCapture(connections=light)).filter(pl.col("kind") == "syn_backlog").height == 0
    assert detect(FakeCapture(connections=light), backlog_min_open=0).filter(
        pl.col("kind") == "syn_backlog").height == 1
    assert detect(FakeCapture(connections=pl.concat([ok, dropped])), backlog_min_open=18).filter(
        pl.col("kind") == "syn_backlog").height == 0
    # near misses: SYNs to a service that never answers anyone (filtered/closed port), and an S0 whose
    # SYN was never retransmitted (the capture may simply have ended or missed the answer)
    closed = connections(6, 6.0, server="10.0.0.81", port=80, first_conn=200, state="S0", history="S")
    assert detect(FakeCapture(connections=closed)).height == 0
    once = dropped.with_columns(pl.lit(1, pl.UInt32).alias("client_packets"))
    assert detect(FakeCapture(connections=pl.concat([ok, once]))).filter(pl.col("kind") == "syn_backlog").height == 0


def _backlog_of(conns, **params):
    return detect(FakeCapture(connections=conns), **params).filter(pl.col("kind") == "syn_backlog")


def test_syn_backlog_more_retried_handshakes_never_lose_the_finding():
    # 6 unanswered SYNs while 20-40 connections are open, and later 10 handshakes answered after 50 ms
    # on an idle service (nothing else open). syn_retry_ns = 20 ms makes those 10 "retried": they are
    # not a full queue's (too few open), and they must not hide the 6 that are. A median of the open
    # connections over all 16 (0) did.
    ok = connections(40, 40.0, server="10.0.0.80", port=80, client="10.0.1.1", life=5 * S)
    dropped = connections(6, 6.0, server="10.0.0.80", port=80, client="10.0.1.2", start=T0 + S // 2,
                          first_conn=100, state="S0", history="S")
    slow = connections(10, 10.0, server="10.0.0.80", port=80, client="10.0.1.3", start=T0 + 7 * S, life=60 * MS,
                       rtt=100 * MS, first_conn=200)
    conns = pl.concat([ok, dropped, slow])
    at_default, looser = _backlog_of(conns), _backlog_of(conns, syn_retry_ns=20 * MS)
    assert at_default.height == 1 and str(at_default["severity"][0]) == "medium"
    assert at_default["explanation"][0].startswith("6 of 46 connection attempts")
    assert looser.height == 1 and str(looser["severity"][0]) == "medium"
    # the worst window: 6 of the 32 attempts within 1 s of the last drop
    assert looser["value"][0] == at_default["value"][0] == pytest.approx(6 / 32)
    assert looser["explanation"][0] == at_default["explanation"][0]
    # with no connection required open, the 10 count too (lowering that gate adds, never removes)
    loosest = _backlog_of(conns, syn_retry_ns=20 * MS, backlog_min_open=0)
    assert loosest["evidence_total"][0] == 16 and str(loosest["severity"][0]) == "high"


def test_syn_backlog_severity_is_the_worst_window_so_more_failures_never_lower_it():
    # 40 unanswered SYNs in 100 ms among 100 connections/s: 27 % of the attempts within 1 s of them
    # (high). 5 handshakes answered after 50 ms two seconds later, "retried" at syn_retry_ns = 20 ms,
    # widen the period; over the whole of it the share falls to 18 % (medium), but the worst window
    # is unchanged: the severity steps on it.
    ok = connections(200, 100.0, server="10.0.0.82", port=80, client="10.0.1.1", life=10 * S)
    dropped = connections(40, 400.0, server="10.0.0.82", port=80, client="10.0.1.2", start=T0 + 60 * MS,
                          first_conn=300, state="S0", history="S")
    late = connections(5, 100.0, server="10.0.0.82", port=80, client="10.0.1.3", start=T0 + 1995 * MS,
                       life=10 * S, rtt=100 * MS, first_conn=600)
    conns = pl.concat([ok, dropped, late])
    at_default, looser = _backlog_of(conns), _backlog_of(conns, syn_retry_ns=20 * MS)
    assert str(at_default["severity"][0]) == "high" and str(looser["severity"][0]) == "high"
    assert looser["value"][0] >= at_default["value"][0] > 0.2
    assert looser["evidence_total"][0] == 45
    assert "45 of 245 connection attempts" in looser["explanation"][0]
    assert "at worst 40 of the 147 attempts within 1 s of one of them" in looser["explanation"][0]


def test_syn_backlog_needs_another_handshake_answered_not_its_own():
    # retried handshakes 2 s apart, answered after 950 ms, while 20 connections are open: each one's
    # only SYN/ACK within the window is its own, so nothing shows the service answering others then
    ok = connections(20, 40.0, server="10.0.0.83", port=80, client="10.0.1.1", life=30 * S)
    apart = connections(5, 0.5, server="10.0.0.83", port=80, client="10.0.1.2", start=T0 + 5 * S,
                        rtt=1900 * MS, life=5 * S, first_conn=400)
    assert _backlog_of(pl.concat([ok, apart])).height == 0
    # 1 s apart, each after the first comes 50 ms after the previous one was answered: those are found
    close = connections(6, 1.0, server="10.0.0.83", port=80, client="10.0.1.2", start=T0 + 5 * S,
                        rtt=1900 * MS, life=5 * S, first_conn=400)
    found = _backlog_of(pl.concat([ok, close]))
    assert found.height == 1 and found["evidence_total"][0] == 5
    assert "(0 never answered or reset, 5 answered only after a SYN retry)" in found["explanation"][0]


def test_contract():
    conns = connections(60, 20.0)
    cap = FakeCapture(connections=conns, ldap_transactions=ldap_tx(conns))
    a, b = detect(cap), detect(cap)
    assert a.schema == FINDINGS_SCHEMA and a["finding_id"].to_list() == b["finding_id"].to_list()
    assert json.loads(a["parameters"][0])["min_connections"] == 10
    assert conn_churn.detect(FakeCapture(), conn_churn.Params()).schema == FINDINGS_SCHEMA
    import dataclasses
    src = Path(conn_churn.__file__).read_text()
    assert all(f"    {f.name}:" in src for f in dataclasses.fields(conn_churn.Params))
    assert "Severity rule" in conn_churn.__doc__ and "Client identity" in conn_churn.__doc__


def test_never_raises_on_the_corpus():
    for row in corpus_files():
        f = conn_churn.detect(shared_capture(ROOT / "tests" / "data" / "corpus" / row["file"]), conn_churn.Params())
        assert f.schema == FINDINGS_SCHEMA, row["file"]


def test_synthetic_capture_labelled_churn_is_found(synthetic_capture):
    path = synthetic_capture
    labels = synthetic_labels(path, "conn_churn")
    f = synthetic_detect(path, conn_churn)
    assert labels
    for lab in labels:
        hit = f.filter((pl.col("kind") == "churn") & (pl.col("client") == lab["clients"][0])
                       & (pl.col("server") == lab["server"]) & (pl.col("start_ns") == lab["start_ns"]))
        assert hit.height == 1, (lab, f.select("kind", "severity", "client", "start_ns").to_dicts())
        assert str(hit["severity"][0]) == "medium"
        assert f"{lab['parameters']['connections']} connections" in hit["explanation"][0]
    assert f.filter(pl.col("severity").cast(pl.String).is_in(["medium", "high", "critical"])).height == len(labels)
