"""herd on tiny constructed transaction frames (lowered thresholds, like Zeek's policy tests)."""
import polars as pl
import pytest

from detectors import herd, run
from detectors.base import FINDINGS_SCHEMA
from fakes import FakeCapture, transaction_frame as tx
from synthetic import label_found, synthetic_findings

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S  # a whole second
LOW = herd.Params(min_clients=5, medium_clients=8, high_impact=30, critical_impact=300)


def dns(rows):
    return tx(rows, "dns", answer_ttl_min=None, qtype=1, id=0, retries=0)


def background(n=40, start=T0, every=S // 2, name="other.corp.example"):
    return [{"t": start + k * every, "client": f"10.9.0.{k % 7}", "name": name} for k in range(n)]


def cap_of(**frames):
    return FakeCapture(**frames)


def test_ttl_herd_fires_with_trigger_and_numbers():
    # a resolver's cached record with TTL 10 at T0, handed out with the TTL counting down in whole
    # seconds: every client's copy runs out at about T0 + 10 s (+ up to 1 s of TTL granularity)
    rows = [{"t": T0 + k * 300 * MS, "client": f"10.1.0.{k}", "lat": 200_000, "answer_ttl_min": 10 - (k * 3) // 10}
            for k in range(12)]
    herd_t = T0 + 10 * S + 950 * MS
    rows += [{"t": herd_t + k * 2 * MS, "client": f"10.1.0.{k}", "lat": 40 * MS} for k in range(12)]
    rows += background(60, T0, S // 2)
    f = herd.detect(cap_of(dns_transactions=dns(rows)), LOW)
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["detector"] == "herd" and r["kind"] == "dns" and r["resource"] == "api.corp.example"
    assert r["clients"] == 12 and r["value"] == 12 and r["metric"] == "clients_in_window"
    assert r["start_ns"] == herd_t and r["end_ns"] == herd_t + 22 * MS
    assert r["client_identity"] == "address" and r["server"] == "10.0.0.53"
    assert r["evidence_total"] == 12
    assert "when its TTL ran out (TTL 10 s" in r["explanation"]
    assert "12 clients re-queried api.corp.example A" in r["explanation"]
    assert "22 ms" in r["explanation"]
    # latency 0.2 ms -> 40 ms (200x, capped 100x): impact 12 x 100 -> critical
    assert r["severity"] == "critical"
    assert "rose from 200 µs to 40 ms" in r["explanation"]
    assert f.schema == FINDINGS_SCHEMA


def test_near_miss_spread_out_or_too_few_clients():
    spread = [{"t": T0 + k * 400 * MS, "client": f"10.1.0.{k}"} for k in range(12)]  # 2.5/s < 5 per s
    assert herd.detect(cap_of(dns_transactions=dns(spread + background(30))), LOW).height == 0
    few = [{"t": T0 + 5 * S + k * MS, "client": f"10.1.0.{k}"} for k in range(4)]  # 4 < min_clients 5
    assert herd.detect(cap_of(dns_transactions=dns(few + background(30))), LOW).height == 0
    five = [{"t": T0 + 5 * S + k * MS, "client": f"10.1.0.{k}"} for k in range(5)]
    assert herd.detect(cap_of(dns_transactions=dns(five + background(30))), LOW).height == 1


def test_relative_to_the_keys_normal_rate():
    # 'popular' is asked 20 times a second all along by 40 clients: a burst of 12 in 100 ms is
    # 120/s, only 6x its median rate (rate_factor 10): not a herd
    steady = [{"t": T0 + k * 50 * MS, "client": f"10.2.0.{k % 40}", "name": "popular"} for k in range(400)]
    burst = [{"t": T0 + 10 * S + 3 * MS + k * 8 * MS, "client": f"10.3.0.{k}", "name": "popular"} for k in range(12)]
    assert herd.detect(cap_of(dns_transactions=dns(steady + burst)), LOW).height == 0
    # the same burst on a quiet name is one
    quiet = [dict(r, name="quiet") for r in burst]
    f = herd.detect(cap_of(dns_transactions=dns(steady + quiet)), LOW)
    assert f.height == 1 and f["resource"][0] == "quiet"


def test_one_finding_per_episode():
    rows = background(80)
    starts = [T0 + 5 * S + 300 * MS, T0 + 20 * S + 300 * MS, T0 + 35 * S + 300 * MS]
    for st in starts:
        rows += [{"t": st + k * MS, "client": f"10.1.0.{k}"} for k in range(10)]
    f = herd.detect(cap_of(dns_transactions=dns(rows)), LOW)
    assert f.height == 3
    assert f.sort("start_ns")["start_ns"].to_list() == starts
    assert f["finding_id"].n_unique() == 3


def test_client_identity_address_vs_address_port():
    # one address, 10 ports, requests outstanding together: 10 clients by address+port (processes on
    # one node), judged by the same impact rule as 10 hosts: latency 0.1 -> 30 ms, impact 10 x 100
    conc = [{"t": T0 + 5 * S + k * MS, "client": "10.5.0.1", "port": 50000 + k, "lat": 30 * MS} for k in range(10)]
    f = herd.detect(cap_of(dns_transactions=dns(conc + background(30))), LOW)
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["client_identity"] == "address+port" and r["clients"] == 10 and r["severity"] == "critical"
    assert "10 concurrent streams from one address (processes, containers or NAT): 10.5.0.1" in r["explanation"]
    assert "informational" not in r["explanation"]
    hosts = [dict(x, client=f"10.5.0.{k + 1}") for k, x in enumerate(conc)]
    f2 = herd.detect(cap_of(dns_transactions=dns(hosts + background(30))), LOW)
    assert f2["severity"].to_list() == ["critical"] and f2["client_identity"].to_list() == ["address"]
    assert "concurrent streams" not in f2["explanation"][0]
    # the same address asking one at a time from a new port each time is one client: no herd
    seq = [{"t": T0 + 5 * S + k * MS, "client": "10.5.0.1", "port": 50000 + k, "lat": 200_000} for k in range(10)]
    assert herd.detect(cap_of(dns_transactions=dns(seq + background(30))), LOW).height == 0


def test_kerberos_key_is_the_principal_and_a_login_counts_once():
    rows, t = [], T0 + 3 * S
    for k in range(8):
        c = f"10.7.0.{k}"
        rows.append({"t": t + k * 3 * MS, "client": c, "op": "AS-REQ", "name": f"user{k}@CORP", "login_step": 1,
                     "cname": f"user{k}", "sname": "krbtgt/CORP", "realm": "CORP", "server": "10.0.0.88",
                     "server_port": 88, "status": "KDC_ERR_PREAUTH_REQUIRED"})
        rows.append({"t": t + 100 * MS + k * 3 * MS, "client": c, "op": "AS-REQ", "name": f"user{k}@CORP",
                     "login_step": 2, "cname": f"user{k}", "sname": "krbtgt/CORP", "realm": "CORP",
                     "server": "10.0.0.88", "server_port": 88, "status": "AS-REP"})
    rows.append({"t": T0, "client": "10.7.1.1", "op": "TGS-REQ", "name": "x@CORP", "sname": "x", "realm": "CORP",
                 "login_step": 1, "cname": None, "server": "10.0.0.88", "server_port": 88})
    rows.append({"t": T0 + 9 * S, "client": "10.7.1.1", "op": "TGS-REQ", "name": "x@CORP", "sname": "x",
                 "realm": "CORP", "login_step": 1, "cname": None, "server": "10.0.0.88", "server_port": 88})
    k = tx(rows, "kerberos", login_step=1, cname=None, sname=None, realm=None)
    f = herd.detect(cap_of(kerberos_transactions=k), LOW)
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["resource"] == "krbtgt/CORP@CORP" and r["clients"] == 8 and r["kind"] == "kerberos"
    assert "AS-REQ" in r["explanation"]
    assert r["evidence_total"] == 8  # the logins' first requests (their second steps come after the herd)
    # with 7 logins it is below min_clients 8 even though there are 14 AS-REQs
    k7 = k.filter(pl.col("client") != "10.7.0.7")
    assert herd.detect(cap_of(kerberos_transactions=k7), herd.Params(min_clients=8)).height == 0


def test_requests_without_answer_by_design_do_not_count():
    rows = [{"t": T0 + 4 * S + k * MS, "client": f"10.8.0.{k}", "op": "unbindRequest", "name": None,
             "answered": False, "expects_response": False, "server_port": 389} for k in range(10)]
    rows += [{"t": T0 + k * S, "client": "10.8.1.1", "op": "searchRequest", "name": "dc=x", "server_port": 389,
              "expects_response": True} for k in range(10)]
    f = herd.detect(cap_of(ldap_transactions=tx(rows, "ldap", expects_response=True)), LOW)
    assert f.height == 0


def test_synchronised_start_and_preceding_failure_triggers():
    sync = [{"t": T0 + 7 * S + 3 * MS + k * MS, "client": f"10.1.0.{k}", "name": "cron.corp"} for k in range(10)]
    f = herd.detect(cap_of(dns_transactions=dns(sync + background(40))), LOW)
    assert f.height == 1 and "+3.0 ms from a whole second" in f["explanation"][0]
    failing = [{"t": T0 + 2 * S + k * 200 * MS, "client": "10.1.9.9", "name": "flaky.corp", "answered": False}
               for k in range(5)]
    back = [{"t": T0 + 4 * S + 250 * MS + k * MS, "client": f"10.1.0.{k}", "name": "flaky.corp"} for k in range(10)]
    f = herd.detect(cap_of(dns_transactions=dns(failing + back + background(40))), LOW)
    assert f.height == 1 and "after 5 failed or unanswered request(s)" in f["explanation"][0]


def test_severity_grows_with_clients_and_errors():
    def one(n_clients, lat=100_000, error=False):
        rows = background(60)
        rows += [{"t": T0 + 6 * S + 300 * MS + k * 100_000, "client": f"10.{k // 200}.{k % 200}.1", "lat": lat,
                  "is_error": error, "status": "SERVFAIL" if error else "NOERROR"} for k in range(n_clients)]
        return herd.detect(cap_of(dns_transactions=dns(rows)), LOW)["severity"][0]
    assert one(6) == "low"
    assert one(8) == "medium"
    assert one(30) == "high"
    assert one(300) == "critical"
    assert one(6, error=True) == "medium"  # failures 0 % -> 100 %: one level up


def test_timestamp_resolution_is_never_undercut():
    rows = background(40) + [{"t": T0 + 5 * S + 250 * MS, "client": f"10.1.0.{k}"} for k in range(8)]
    f = herd.detect(FakeCapture(resolution_ns=1000.0, dns_transactions=dns(rows)), LOW)
    assert f.height == 1 and "within 1 µs (the capture's timestamp resolution)" in f["explanation"][0]


def test_capture_too_short_to_know_the_normal_rate_is_informational():
    rows = [{"t": T0 + k * 20 * MS, "client": f"10.1.0.{k % 30}"} for k in range(30)]  # 600 ms capture, one name
    f = herd.detect(cap_of(dns_transactions=dns(rows)), LOW)
    assert f.height == 1 and f["severity"][0] == "informational" and "too short" in f["explanation"][0]


def test_nothing_to_do():
    assert herd.detect(FakeCapture(), LOW).height == 0
    assert herd.detect(cap_of(dns_transactions=dns(background(3))), LOW).height == 0
    # via the registry with an override
    rows = background(40) + [{"t": T0 + 5 * S + 250 * MS + k * MS, "client": f"10.1.0.{k}"} for k in range(8)]
    c = cap_of(dns_transactions=dns(rows))
    assert run(c, only=["herd"], overrides={"herd.min_clients": 9}).height == 0
    assert run(c, only=["herd"], overrides={"herd.min_clients": 8}).height == 1


# -- the synthetic capture's labels (tests/conftest.py generates it once per session) ----------------

def test_synthetic_herd_labels_are_found(synthetic_capture):
    findings, labels, frames = synthetic_findings(synthetic_capture)
    checked = 0
    for label in labels:
        if label["detector"] != "herd" or f"{label['protocol']}_transactions" not in frames:
            continue
        hit = label_found(findings, label)
        assert hit.height == 1, (label["description"], findings.filter(pl.col("detector") == "herd").to_dicts())
        assert hit["clients"][0] >= 0.95 * len(label["clients"])
        checked += 1
    assert checked >= 1


def test_one_direction_capture_says_latency_cannot_be_judged():
    rows = [dict(r, answered=False) for r in background(40)]
    rows += [{"t": T0 + 5 * S + 250 * MS + k * MS, "client": f"10.1.0.{k}", "answered": False} for k in range(8)]
    f = herd.detect(cap_of(dns_transactions=dns(rows)), LOW)
    assert f.height == 1 and "responses are not in the capture" in f["explanation"][0]


def test_client_identity_by_splits_only_concurrent_addresses():
    from detectors.base import client_identity_by
    r = pl.DataFrame({
        "server": ["s"] * 6 + ["t"] * 2,
        "client": ["a", "a", "a", "b", "b", "b", "a", "a"],
        "client_port": [1, 2, 3, 1, 2, 3, 7, 8],
        "request_ts_ns": [0, 10, 20, 0, 100, 200, 0, 100],
        "response_ts_ns": [50, 60, 70, 50, 150, 250, 50, 150],
    })
    out = client_identity_by(r, ["server"])
    # a asks s three times at once from three ports: three clients; b one at a time: one client;
    # a's sequential asks of t stay one client
    assert out["client_id"].to_list() == ["a:1", "a:2", "a:3", "b", "b", "b", "a", "a"]
    assert out["client_identity"].to_list() == ["address+port"] * 3 + ["address"] * 5
    # unanswered requests count as outstanding for timeout_ns
    r2 = r.with_columns(pl.lit(None, pl.Int64).alias("response_ts_ns"))
    assert client_identity_by(r2, ["server"], timeout_ns=5)["client_identity"].to_list() == ["address"] * 8
    assert client_identity_by(r2, ["server"])["client_identity"].to_list() == ["address+port"] * 8


# -- herds of processes on one node (generated real-protocol captures, tests/scenarios_one_node.py) --

@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """Captures of one-node herds and their single-stream twins, opened once for this module."""
    import scenarios_one_node as sc
    from analyzer import open_capture

    d = tmp_path_factory.mktemp("one_node")
    made = {
        "dns": sc.dns_one_node_herd(str(d / "dns.pcap")),
        "dns_single": sc.dns_one_node_herd(str(d / "dns1.pcap"), single_stream=True),
        "krb_udp": sc.krb_one_node_herd(str(d / "krbu.pcap")),
        "krb_tcp": sc.krb_one_node_herd(str(d / "krbt.pcap"), tcp=True),
        "krb_single": sc.krb_one_node_herd(str(d / "krb1.pcap"), single_stream=True),
    }
    caps = {k: open_capture(p) for k, p in made.items()}
    yield caps
    for c in caps.values():
        c.close()


@pytest.mark.parametrize("name, clients, address, kind", [
    ("dns", 150, "10.5.0.7", "dns"), ("krb_udp", 60, "10.6.0.9", "kerberos"), ("krb_tcp", 60, "10.6.0.9", "kerberos")])
def test_one_node_herd_is_judged_like_distinct_hosts(one_node, name, clients, address, kind):
    # 150 processes re-asking a name at its TTL expiry, 60 parallel kinit (UDP, TCP) from one node:
    # the same impact rule as a herd of hosts (>= medium), said to be streams of one address
    f = herd.detect(one_node[name])
    assert f.height == 1, f.select("severity", "explanation").to_dicts()
    r = f.row(0, named=True)
    assert r["kind"] == kind and r["clients"] == clients and r["client_identity"] == "address+port"
    assert r["severity"] in ("medium", "high", "critical")
    assert f"{clients} concurrent streams from one address (processes, containers or NAT): {address}" \
        in r["explanation"]
    assert "informational" not in r["explanation"] and "busy client" not in r["explanation"]
    if kind == "dns":
        assert "TTL ran out (TTL 60 s" in r["explanation"]
    else:
        assert r["resource"] == "krbtgt/CORP.EXAMPLE.COM@CORP.EXAMPLE.COM"
        assert r["end_ns"] - r["start_ns"] <= 500 * MS


@pytest.mark.parametrize("name", ["dns_single", "krb_single"])
def test_one_stream_from_one_node_is_not_a_herd(one_node, name):
    # the same requests one after the other (each answered before the next): one client, no herd
    assert herd.detect(one_node[name]).height == 0


def test_segment_search_rescans_after_the_peak():
    # a burst, a gap that does not bring the score to zero, a smaller burst: the second is a segment
    # of its own (it used to be swallowed: the scan ended at the first peak and never came back)
    import numpy as np
    from detectors.herd_search import _kadane_segments
    t = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 101, 102, 103], dtype=np.int64) * MS
    # 1 per 20 ms: the burst scores 9.55, the 91 ms gap costs 4.55, the 4 later arrivals bring the
    # score back to 8.8 only (below the first peak)
    lam = np.full(t.shape[0], 0.05 / MS)
    seg = _kadane_segments(np.zeros(t.shape[0], np.int64), t, lam, 3)
    assert (seg[:10] == seg[0]).all() and seg[0] >= 0
    assert (seg[10:] == seg[10]).all() and seg[10] >= 0 and seg[10] != seg[0]


def test_lower_min_clients_never_loses_herds_that_merge_into_one_long_segment():
    # three herds of 30 clients 11 s apart after a slow ramp: at min_clients=3 (herd rate 3/s) they
    # merge with the ramp into one 33 s segment, longer than max_span_ns; the ladder of finer rates
    # splits it again, so the three herds are found at every min_clients (samples/dns-ttl-herd.pcap
    # gave none at 2-5 before)
    ramp = [{"t": T0 + k * 200 * MS, "client": f"10.1.0.{k}", "name": "api.corp.example"} for k in range(30)]
    herds = [{"t": T0 + (10 + 11 * h) * S + k * MS, "client": f"10.1.0.{k}", "name": "api.corp.example"}
             for h in range(3) for k in range(30)]
    cap = cap_of(dns_transactions=dns(ramp + herds + background(80)))
    for mc in (2, 3, 5, 8, 12, 20, 30):
        f = herd.detect(cap, herd.Params(min_clients=mc))
        big = f.filter((pl.col("clients") == 30) & (pl.col("end_ns") - pl.col("start_ns") < 100 * MS))
        assert sorted(big["start_ns"].to_list()) == [T0 + (10 + 11 * h) * S for h in range(3)], mc
