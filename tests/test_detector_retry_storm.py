"""retry_storm on tiny constructed frames (lowered thresholds where needed, like Zeek's policy tests)."""
import random

import numpy as np
import polars as pl

from analyzer.tcp import client_syns
from detectors import retry_storm as rs
from detectors import run
from detectors.base import FINDINGS_SCHEMA
from fakes import FakeCapture, transaction_frame as tx
from synthetic import label_found, synthetic_findings

S = 1_000_000_000
MS = 1_000_000
US = 1_000
T0 = 1_700_000_000 * S
SERVER = "10.0.0.53"


def dns_frames(chains: list[dict]):
    """dns_transactions + dns_messages for chains of sends: each {client, port, sends: [ts...],
    answer_at (ts or None), rcode_error (bool), name}. Sends of one chain share one id (retransmissions
    of one transaction)."""
    txs, msgs, frame = [], [], 1
    for k, c in enumerate(chains):
        sends, ans = c["sends"], c.get("answer_at")
        qid = c.get("id", 1000 + k)
        name = c.get("name", "db.corp.example")
        first_frame = frame
        for j, t in enumerate(sends):
            msgs.append({"transport": "udp", "src": c["client"], "dst": SERVER, "sport": c.get("port", 40000),
                         "dport": 53, "id": qid, "qr": False, "qname": name, "qtype": 1, "ts_last_ns": t,
                         "frame_last": frame, "retransmission": j > 0})
            frame += 1
        if ans is not None:
            frame += 1
        err = c.get("error", False)
        txs.append({"t": sends[0], "client": c["client"], "port": c.get("port", 40000), "server": SERVER,
                    "name": name, "frame": first_frame, "answered": ans is not None,
                    "lat": (ans - sends[0]) if ans is not None else None, "is_error": err,
                    "status": ("SERVFAIL" if err else "NOERROR") if ans is not None else None,
                    "id": qid, "retries": len(sends) - 1, "flow": k})
    t = tx(txs, "dns", id=0, qtype=1, retries=0, answer_ttl_min=None)
    m = pl.DataFrame(msgs, schema_overrides={"sport": pl.UInt16, "dport": pl.UInt16, "id": pl.UInt16,
                                             "qtype": pl.UInt16, "ts_last_ns": pl.Int64, "frame_last": pl.UInt32})
    return {"dns_transactions": t, "dns_messages": m}


def quick(client: str, t: int, lat=300 * US, name="db.corp.example", port=40000):
    return {"client": client, "port": port, "sends": [t], "answer_at": t + lat, "name": name}


def normal_traffic(n=20, start=T0):
    return [quick(f"10.9.0.{k % 5}", start + k * 100 * MS, name=f"n{k}.corp") for k in range(n)]


def test_fixed_timer_storm_fires_with_numbers():
    chains = normal_traffic()
    for k in range(5):
        start = T0 + 3 * S + k * 37 * MS
        chains.append({"client": f"10.1.0.{k}", "sends": [start + j * 250 * MS for j in range(8)],
                       "answer_at": start + 7 * 250 * MS + 400 * US})
    f = rs.detect(FakeCapture(**dns_frames(chains)), rs.Params())
    assert f.height == 1 and f.schema == FINDINGS_SCHEMA
    r = f.row(0, named=True)
    assert (r["detector"], r["kind"], r["server"], r["resource"]) == ("retry_storm", "dns", SERVER, "db.corp.example")
    assert r["clients"] == 5 and r["metric"] == "retries_per_request" and r["value"] == 7.0
    assert r["start_ns"] == T0 + 3 * S + 250 * MS  # the first retry
    assert r["end_ns"] == T0 + 3 * S + 4 * 37 * MS + 7 * 250 * MS
    assert r["evidence_total"] == 40 and r["client_identity"] == "address"
    e = r["explanation"]
    assert "5 clients resent queries for db.corp.example A at 10.0.0.53 35 times" in e
    assert "no backoff (fixed timer) without jitter" in e and "(8x amplification)" in e
    assert "retry timer 250 ms is 833x the 300 µs response time" in e
    assert r["severity"] == "medium"  # A = 8 >= 3 with 5 clients; not 10x, not 10 clients
    more = chains + [{"client": f"10.2.0.{k}", "sends": [T0 + 3 * S + 5 * MS + k * 11 * MS + j * 250 * MS
                                                          for j in range(12)]} for k in range(5)]
    assert rs.detect(FakeCapture(**dns_frames(more)), rs.Params())["severity"][0] == "high"  # A = 10.4


def test_exponential_backoff_with_jitter_is_not_a_storm():
    rng = random.Random(7)
    chains = normal_traffic()
    for k in range(12):
        t = T0 + 3 * S + k * 13 * MS
        sends = [t]
        for j in range(5):
            t += int(250 * MS * 2 ** j * rng.uniform(0.5, 1.5))
            sends.append(t)
        chains.append({"client": f"10.1.0.{k}", "sends": sends, "answer_at": sends[-1] + 300 * US})
    f = rs.detect(FakeCapture(**dns_frames(chains)), rs.Params())
    assert f.height == 1
    assert "exponential backoff with jitter" in f["explanation"][0] and f["severity"][0] == "low"


def test_classify_backoff():
    p = rs.Params()
    ms = 1e6
    assert rs.classify_backoff([np.array([250, 250, 251, 250]) * ms] * 3, p) == ("fixed", False)
    jit = [np.array([250, 310, 190, 280, 220]) * ms, np.array([200, 260, 300, 240]) * ms]
    assert rs.classify_backoff(jit, p) == ("fixed", True)
    assert rs.classify_backoff([np.array([1, 2, 4, 8, 16]) * S] * 2, p) == ("exponential", False)
    ej = [np.array([0.9, 2.3, 3.5, 9.1, 14.0]) * S, np.array([1.2, 1.7, 4.8, 6.1]) * S]
    assert rs.classify_backoff(ej, p) == ("exponential", True)
    assert rs.classify_backoff([np.array([100, 200, 300, 400, 500]) * ms] * 2, p) == ("linear", False)
    assert rs.classify_backoff([np.array([1000, 1200, 1400, 1600, 1800]) * ms], p) == ("linear", False)
    assert rs.classify_backoff([np.array([250]) * ms] * 4, p) == ("unknown", None)


def test_answered_before_the_next_send_is_not_a_retry():
    # polling: the same question every 250 ms, each answered at once
    chains = normal_traffic() + [quick(f"10.1.0.{k}", T0 + 3 * S + j * 250 * MS) for k in range(5) for j in range(8)]
    assert rs.detect(FakeCapture(**dns_frames(chains)), rs.Params()).height == 0
    # ... but after SERVFAIL every time, it is
    bad = normal_traffic() + [dict(quick(f"10.1.0.{k}", T0 + 3 * S + k * MS + j * 250 * MS), error=True)
                              for k in range(5) for j in range(8)]
    f = rs.detect(FakeCapture(**dns_frames(bad)), rs.Params())
    assert f.height == 1 and f["value"][0] == 7.0 and "40 tries failed (SERVFAIL)" in f["explanation"][0]
    assert "median retry interval 250 ms" in f["explanation"][0]


def test_near_miss_below_min_retries():
    chains = normal_traffic() + [{"client": "10.1.0.1", "sends": [T0 + 3 * S, T0 + 3 * S + S, T0 + 3 * S + 2 * S],
                                  "answer_at": T0 + 3 * S + 2 * S + 300 * US}]
    assert rs.detect(FakeCapture(**dns_frames(chains)), rs.Params()).height == 0  # 2 retries < 3
    assert rs.detect(FakeCapture(**dns_frames(chains)), rs.Params(min_retries=2)).height == 1
    # a re-ask with a new id later than max_gap_ns is a new request ...
    late = normal_traffic() + [{"client": "10.1.0.1", "sends": [T0 + 3 * S + j * 11 * S], "id": 7000 + j}
                               for j in range(5)]
    assert rs.detect(FakeCapture(**dns_frames(late)), rs.Params()).height == 0
    # ... while a resend the decoder folded into its transaction (same id) is the same request whatever the gap
    # (its pairing window bounds it: NFS over TCP resends after 60 s)
    folded = normal_traffic() + [{"client": "10.1.0.1", "sends": [T0 + 3 * S + j * 11 * S for j in range(5)]}]
    assert rs.detect(FakeCapture(**dns_frames(folded)), rs.Params()).height == 1


def test_re_asks_with_new_ids_after_no_answer_chain_up():
    chains = normal_traffic()
    for k in range(4):
        for j in range(5):  # a new transaction (new id, same port) every 2 s, none answered
            chains.append({"client": f"10.1.0.{k}", "id": 2000 + 10 * k + j,
                           "sends": [T0 + 3 * S + k * MS + j * 2 * S]})
    f = rs.detect(FakeCapture(**dns_frames(chains)), rs.Params())
    assert f.height == 1 and f["value"][0] == 4.0 and f["clients"][0] == 4
    assert "0 of 4 eventually succeeded" in f["explanation"][0]


def test_timer_shorter_than_the_response_time():
    chains = [quick(f"10.9.0.{k}", T0 + k * 100 * MS, lat=80 * MS, name=f"n{k}") for k in range(20)]
    for k in range(4):
        st = T0 + 3 * S + k * 3 * MS
        chains.append({"client": f"10.1.0.{k}", "sends": [st + j * 20 * MS for j in range(5)],
                       "answer_at": st + 95 * MS})
    f = rs.detect(FakeCapture(**dns_frames(chains)), rs.Params())
    assert f.height == 1
    assert "the retry timer 20 ms is shorter than the server's 80 ms response time" in f["explanation"][0]


def test_no_answer_anywhere_is_informational():
    chains = [{"client": f"10.1.0.{k}", "sends": [T0 + k * MS + j * 250 * MS for j in range(10)]} for k in range(6)]
    f = rs.detect(FakeCapture(**dns_frames(chains)), rs.Params())
    assert f.height == 1 and f["severity"][0] == "informational" and "one direction" in f["explanation"][0]


def test_client_identity_per_port_when_concurrent():
    # one address, 4 processes (ports) each retrying its own query concurrently
    chains = normal_traffic()
    for k in range(4):
        chains.append({"client": "10.1.0.1", "port": 41000 + k, "id": 3000 + k,
                       "sends": [T0 + 3 * S + k * MS + j * 250 * MS for j in range(6)],
                       "answer_at": T0 + 3 * S + k * MS + 5 * 250 * MS + 300 * US})
    f = rs.detect(FakeCapture(**dns_frames(chains)), rs.Params())
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["client_identity"] == "address+port" and r["clients"] == 4 and r["value"] == 5.0


def test_in_phase():
    def sends(offsets):
        return pl.DataFrame({"client_id": [f"c{k}" for k, o in enumerate(offsets) for _ in range(10)],
                             "ts": [o + j * 250 * MS for o in offsets for j in range(10)]})
    together = rs.in_phase(sends([k * 100 * US for k in range(8)]), 10 * 250 * MS)
    spread = rs.in_phase(sends([k * 31 * MS for k in range(8)]), 10 * 250 * MS)
    assert together < 0.05 and spread > 0.5
    assert rs.in_phase(sends([0, 1]), S) is None  # fewer than 3 clients


def krb(rows):
    return tx(rows, "kerberos", login_step=1, cname=None, sname="krbtgt/CORP", realm="CORP")


def test_kerberos_preauth_round_trip_is_not_a_retry():
    rows = []
    for k in range(10):
        t = T0 + k * 300 * MS
        rows.append({"t": t, "client": f"10.7.0.{k}", "op": "AS-REQ", "name": f"u{k}@CORP", "cname": f"u{k}",
                     "status": "KDC_ERR_PREAUTH_REQUIRED", "is_error": False, "lat": 200 * US,
                     "server": "10.0.0.88", "server_port": 88})
        rows.append({"t": t + 5 * MS, "client": f"10.7.0.{k}", "op": "AS-REQ", "name": f"u{k}@CORP", "cname": f"u{k}",
                     "login_step": 2, "status": "AS-REP", "lat": 300 * US, "server": "10.0.0.88", "server_port": 88})
    assert rs.detect(FakeCapture(kerberos_transactions=krb(rows)), rs.Params()).height == 0
    # a KDC that does not answer: kinit resends every second
    for k in range(3):
        for j in range(4):
            rows.append({"t": T0 + 5 * S + k * MS + j * S, "client": f"10.7.1.{k}", "op": "AS-REQ",
                         "name": f"v{k}@CORP", "cname": f"v{k}", "answered": False, "server": "10.0.0.88",
                         "server_port": 88})
    f = rs.detect(FakeCapture(kerberos_transactions=krb(rows)), rs.Params())
    assert f.height == 1 and f["kind"][0] == "kerberos" and f["value"][0] == 3.0 and f["clients"][0] == 3


def test_over_tcp_pipelined_twins_are_not_retries_but_reactions_to_errors_are():
    def smb(rows):
        return tx(rows, "smb2", create_disposition="OPEN")
    base = [{"t": T0 + k * 50 * MS, "client": "10.4.0.9", "op": "READ", "name": f"\\\\s\\d\\f{k}", "transport": "tcp",
             "flow": 99, "server": "10.0.0.45", "server_port": 445, "status": "STATUS_SUCCESS"} for k in range(20)]
    twins = [{"t": T0 + 2 * S + j * 100 * US, "client": "10.4.0.1", "op": "CREATE", "name": "\\\\s\\d\\x",
              "transport": "tcp", "flow": 7, "server": "10.0.0.45", "server_port": 445, "lat": 5 * MS,
              "status": "STATUS_SUCCESS"} for j in range(6)]
    assert rs.detect(FakeCapture(smb2_transactions=smb(base + twins)), rs.Params()).height == 0
    again = [{"t": T0 + 2 * S + j * 100 * MS, "client": "10.4.0.1", "op": "CREATE", "name": "\\\\s\\d\\x",
              "transport": "tcp", "flow": 7, "server": "10.0.0.45", "server_port": 445, "lat": 400 * US,
              "is_error": True, "status": "STATUS_SHARING_VIOLATION"} for j in range(6)]
    f = rs.detect(FakeCapture(smb2_transactions=smb(base + again)), rs.Params())
    assert f.height == 1 and f["kind"][0] == "smb2" and f["client"][0] == "10.4.0.1" and f["severity"][0] == "low"
    assert "6 tries failed (STATUS_SHARING_VIOLATION)" in f["explanation"][0]
    # no answer on one connection, then the same request on new connections: the client gave up and retried
    reconnect = [{"t": T0 + 2 * S + j * 2 * S, "client": "10.4.0.1", "op": "CREATE", "name": "\\\\s\\d\\x",
                  "transport": "tcp", "flow": 100 + j, "server": "10.0.0.45", "server_port": 445,
                  "answered": False} for j in range(5)]
    assert rs.detect(FakeCapture(smb2_transactions=smb(base + reconnect)), rs.Params()).height == 1


def test_syn_retries():
    segs, conns, frame = [], [], 1

    def conn(cid, client, cport, t_syns, synack_at=None, rst_at=None):
        nonlocal frame
        for t in t_syns:
            segs.append({"frame": frame, "conn": cid, "from_client": True, "ts_ns": t, "tcp_flags": 0x02})
            frame += 1
        for t, fl in ((synack_at, 0x12), (rst_at, 0x14)):
            if t is not None:
                segs.append({"frame": frame, "conn": cid, "from_client": False, "ts_ns": t, "tcp_flags": fl})
                frame += 1
        conns.append({"conn": cid, "client": client, "client_port": cport, "server": "10.0.2.11", "server_port": 8080,
                      "synack_ts_ns": synack_at, "last_ts_ns": max([*t_syns, synack_at or 0, rst_at or 0]),
                      "rtt_client_server_ns": (synack_at - t_syns[-1]) if synack_at else None,
                      "server_rst": rst_at is not None})
    cid = 0
    for k in range(10):  # healthy connections: 80 µs handshakes
        conn(cid, f"10.2.1.{k}", 50000 + k, [T0 + k * 10 * MS], T0 + k * 10 * MS + 80 * US)
        cid += 1
    for k in range(4):  # a server that stopped answering SYNs: Linux retransmits at 1, 2, 4, 8 s
        st = T0 + S + k * 7 * MS
        conn(cid, f"10.2.2.{k}", 51000 + k, [st, st + S, st + 3 * S, st + 7 * S, st + 15 * S])
        cid += 1
    seg_frame = pl.DataFrame(segs, schema_overrides={"frame": pl.UInt32, "conn": pl.UInt32, "ts_ns": pl.Int64,
                                                     "tcp_flags": pl.UInt8})
    conn_frame = pl.DataFrame(conns, schema_overrides={
        "conn": pl.UInt32, "client_port": pl.UInt16, "server_port": pl.UInt16, "synack_ts_ns": pl.Int64,
        "last_ts_ns": pl.Int64, "rtt_client_server_ns": pl.Int64})
    # tcp_segments carries its own times and flags (analyzer/tcp: SEGMENT_DESCRIPTIONS); packets is not read
    c = FakeCapture(tcp_client_syns=client_syns(seg_frame), connections=conn_frame)
    f = rs.detect(c, rs.Params(max_gap_ns=10 * S))
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "tcp_syn" and r["resource"] == "10.0.2.11:8080" and r["clients"] == 4 and r["value"] == 4.0
    e = r["explanation"]
    assert "exponential backoff without jitter" in e and "retry timer 1 s is 12,500x the 80 µs handshake RTT" in e
    assert "clients retry in phase" in e
    # exponential without jitter but in phase: not lowered; A = 5 with 4 clients: medium
    assert r["severity"] == "medium"


def test_syn_retry_resource_brackets_an_ipv6_server():
    segs = pl.DataFrame({"frame": [1, 2], "conn": [0, 1], "from_client": [True, True], "ts_ns": [T0, T0 + S],
                         "tcp_flags": [0x02, 0x02]},
                        schema_overrides={"frame": pl.UInt32, "conn": pl.UInt32, "tcp_flags": pl.UInt8})
    conns = pl.DataFrame({"conn": [0, 1], "client": ["2001:db8::2", "10.0.0.2"], "client_port": [40000, 40001],
                          "server": ["2001:db8::1", "10.0.0.1"], "server_port": [53, 53],
                          "synack_ts_ns": [None, None], "last_ts_ns": [T0, T0 + S], "rtt_client_server_ns": [None, None],
                          "server_rst": [False, False]},
                         schema_overrides={"conn": pl.UInt32, "client_port": pl.UInt16, "server_port": pl.UInt16,
                                           "synack_ts_ns": pl.Int64, "rtt_client_server_ns": pl.Int64})
    sends, _ = rs.syn_sends(FakeCapture(tcp_client_syns=client_syns(segs), connections=conns))
    assert sends.sort("frame")["resource"].to_list() == ["[2001:db8::1]:53", "10.0.0.1:53"]
    assert sends["key_resource"].to_list() == sends["resource"].to_list()


def test_resolution_limits_classification():
    chains = normal_traffic() + [{"client": f"10.1.0.{k}",
                                  "sends": [T0 + 3 * S + k * MS + j * 2 * US for j in range(6)],
                                  "answer_at": T0 + 3 * S + k * MS + 12 * US} for k in range(4)]
    f = rs.detect(FakeCapture(resolution_ns=1000.0, **dns_frames(chains)), rs.Params())
    assert f.height == 1 and "too fine to classify" in f["explanation"][0]


def test_nothing_to_do_and_registry():
    assert rs.detect(FakeCapture(), rs.Params()).height == 0
    chains = normal_traffic() + [{"client": "10.1.0.1", "sends": [T0 + 3 * S + j * S for j in range(4)],
                                  "answer_at": T0 + 6 * S + 300 * US}]
    c = FakeCapture(**dns_frames(chains))
    assert run(c, only=["retry_storm"]).height == 1
    assert run(c, only=["retry_storm"], overrides={"retry_storm.min_retries": 4}).height == 0


def test_synthetic_retry_storm_label_is_found(synthetic_capture):
    findings, labels, frames = synthetic_findings(synthetic_capture)
    storms = [lb for lb in labels if lb["detector"] == "retry_storm"]
    assert storms
    for label in storms:
        hit = label_found(findings, label)
        assert hit.height == 1, (label["description"], findings.filter(pl.col("detector") == "retry_storm").to_dicts())
        assert hit["clients"][0] == len(label["clients"])
        assert hit["value"][0] == label["parameters"]["attempts"] - 1
        assert "no backoff (fixed timer)" in hit["explanation"][0]


def test_polling_through_a_failure_adds_no_load():
    # 4 monitors ask every 2 s; answered fine for 20 s, then SERVFAIL for 20 s: same pace, no storm
    chains = normal_traffic()
    for k in range(4):
        for j in range(20):
            chains.append(dict(quick(f"10.6.0.{k}", T0 + k * 7 * MS + j * 2 * S), error=j >= 10))
    f = rs.detect(FakeCapture(**dns_frames(chains)), rs.Params())
    assert f.height == 1 and f["severity"][0] == "low"
    assert "no faster than they normally ask for it (every 2 s)" in f["explanation"][0]
    # the same failure, but they resend every 250 ms: 8x faster than their pace, a storm
    fast = normal_traffic()
    for k in range(4):
        fast += [quick(f"10.6.0.{k}", T0 + k * 7 * MS + j * 2 * S) for j in range(10)]
        fast += [dict(quick(f"10.6.0.{k}", T0 + 20 * S + k * 7 * MS + j * 250 * MS), error=True) for j in range(12)]
    f = rs.detect(FakeCapture(**dns_frames(fast)), rs.Params())
    assert f.height == 1 and f["severity"][0] == "high"
    assert "8x faster than the clients normally ask for it (every 2 s)" in f["explanation"][0]


def test_a_kinds_median_latency_from_partitions_counts_is_polars_median_of_the_latencies():
    """``partial`` hands each kind's distinct latencies with their counts, not a row a request (held by a
    scan's caller to its end); ``finish``'s median of them is Polars' median of the latencies themselves,
    whatever the partitions they are counted in."""
    import numpy as np

    from detectors.retry_storm import _latency_counts, _median_latencies

    rng = np.random.default_rng(5)
    for trial in range(200):
        n = int(rng.integers(1, 40))
        requests = pl.DataFrame({"kind": rng.choice(["dns", "ldap", "tcp"], n),
                                 "latency_ns": rng.integers(0, 2**40 if trial % 2 else 20, n)})
        want = requests.group_by("kind").agg(pl.col("latency_ns").median().alias("rtt_kind")).sort("kind")
        cut = int(rng.integers(0, n + 1))
        counted = pl.concat([_latency_counts(requests[:cut]), _latency_counts(requests[cut:])])
        assert counted.height <= n and _median_latencies(counted).sort("kind").equals(want)
