"""The replay detector: repeats of replay-cache tags per service, identical KDC requests, KRB-ERROR 34.

Constructed rows (tests/fakes.FakeCapture) for the rules, and the real-server sample of
samples/realkit/scen_replay.py (MIT KDC + slapd SASL/GSSAPI) with its healthy twin."""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import detectors
from fakes import MS, S, T0, FakeCapture, transaction_frame

SERVER, CLIENT, OTHER = "10.0.0.89", "10.0.4.1", "10.0.4.66"
KDC = "10.0.0.88"
SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def ap_frame(rows: list[dict]) -> pl.DataFrame:
    """kerberos_ap rows (the path14 schema): each dict needs t, tag (bytes or None), flow; optional
    src, dst, message, carrier, frame, error_code, sname."""
    out = []
    for k, r in enumerate(rows):
        req = r.get("message", "ap_req") == "ap_req"
        out.append({
            "carrier": r.get("carrier", "ldap"), "frame": r.get("frame", 10 * k + 1),
            "frame_last": r.get("frame", 10 * k + 1), "ts_ns": T0 + r["t"],
            "src": r.get("src", CLIENT) if req else r.get("src", SERVER),
            "dst": r.get("dst", SERVER) if req else r.get("dst", CLIENT),
            "sport": 40000 + r["flow"] if req else 389, "dport": 389 if req else 40000 + r["flow"],
            "transport": "tcp", "flow": r["flow"], "from_client": req, "message": r.get("message", "ap_req"),
            "mech": "krb5", "pvno": 5, "ap_options": 0x20000000 if req else None, "realm": "CORP.EXAMPLE" if req else None,
            "sname": r.get("sname", "ldap/10.0.0.89") if req else None, "ticket_etype": 18 if req else None,
            "ticket_kvno": 2 if req else None, "authenticator_etype": r.get("etype", 18) if req else None,
            "authenticator_kvno": None, "rc_tag": r.get("tag") if req else None,
            "error_code": r.get("error_code"), "error_name": None, "e_text": None, "decode_error": None,
        })
    return pl.DataFrame(out, schema_overrides={
        "frame": pl.UInt32, "frame_last": pl.UInt32, "ts_ns": pl.Int64, "sport": pl.UInt16, "dport": pl.UInt16,
        "flow": pl.UInt32, "pvno": pl.Int32, "ap_options": pl.UInt32, "ticket_etype": pl.Int32,
        "ticket_kvno": pl.Int64, "authenticator_etype": pl.Int32, "authenticator_kvno": pl.Int64,
        "rc_tag": pl.Binary, "error_code": pl.Int32, "error_name": pl.String, "e_text": pl.String,
        "decode_error": pl.String, "realm": pl.String, "sname": pl.String})


def ldap_tx(aps: list[dict], status_of) -> pl.DataFrame:
    """One bind transaction per AP-REQ row (same flow and frame), answered with status_of(k)."""
    rows = []
    for k, r in enumerate(aps):
        st = status_of(k)
        rows.append({"t": T0 + r["t"], "client": r.get("src", CLIENT), "server": SERVER, "server_port": 389,
                     "transport": "tcp", "flow": r["flow"], "frame": r.get("frame", 10 * k + 1), "op": "bindRequest",
                     "status": st, "is_error": st not in ("success", "saslBindInProgress"), "lat": 500_000})
    return transaction_frame(rows, protocol="ldap")


def kerberos_frames(reqs: list[dict] | None = None) -> dict:
    """kerberos_messages (with request_digest) and kerberos_transactions from request dicts:
    t, digest, flow; optional src, transport, reply_digest (None: unanswered)."""
    msgs, tx = [], []
    for k, r in enumerate(reqs or []):
        f = 100 * k + 1
        base = {"transport": r.get("transport", "udp"), "flow": r["flow"], "frame_first": f, "frame_last": f,
                "ts_first_ns": T0 + r["t"], "ts_last_ns": T0 + r["t"], "wire_length": 600, "complete": True,
                "sname": "ldap/10.0.0.89", "realm": "CORP.EXAMPLE", "cname": "alice", "error_code": None}
        msgs.append(dict(base, from_client=True, src=r.get("src", CLIENT), dst=KDC, sport=50000 + r["flow"],
                         dport=88, message="TGS-REQ", request_digest=r["digest"]))
        answered = r.get("reply_digest") is not None
        if answered:
            msgs.append(dict(base, from_client=False, src=KDC, dst=r.get("src", CLIENT), sport=88,
                             dport=50000 + r["flow"], message="TGS-REP", request_digest=r["reply_digest"],
                             frame_first=f + 1, frame_last=f + 1, ts_first_ns=T0 + r["t"] + MS))
        tx.append({"t": T0 + r["t"], "client": r.get("src", CLIENT), "server": KDC, "server_port": 88,
                   "transport": r.get("transport", "udp"), "flow": r["flow"], "frame": f, "op": "TGS-REQ",
                   "answered": answered, "status": "TGS-REP" if answered else None, "lat": MS})
    schema = {"frame_first": pl.UInt32, "frame_last": pl.UInt32, "flow": pl.UInt32, "sport": pl.UInt16,
              "dport": pl.UInt16, "ts_first_ns": pl.Int64, "ts_last_ns": pl.Int64, "request_digest": pl.UInt64,
              "error_code": pl.Int32, "wire_length": pl.UInt32}
    m = pl.DataFrame(msgs, schema_overrides=schema) if msgs else pl.DataFrame(
        schema={**schema, "message": pl.String, "from_client": pl.Boolean, "src": pl.String, "dst": pl.String,
                "transport": pl.String, "sname": pl.String, "realm": pl.String, "cname": pl.String})
    t = transaction_frame(tx, protocol="kerberos") if tx else transaction_frame([], protocol="kerberos")
    if t.height:  # the reply is the frame after its request (as kerberos_messages above has it)
        t = t.with_columns(pl.when(pl.col("answered")).then(pl.col("request_frame") + 1).alias("response_frame"))
    return {"kerberos_messages": m, "kerberos_transactions": t}


def capture(aps: list[dict], status_of=lambda k: "saslBindInProgress" if k == 0 else "invalidCredentials",
            kdc: list[dict] | None = None, **frames) -> FakeCapture:
    binds = [r for r in aps if r.get("message", "ap_req") == "ap_req"]
    return FakeCapture(kerberos_ap=ap_frame(aps), ldap_transactions=ldap_tx(binds, status_of),
                       **kerberos_frames(kdc), **frames)


def run(cap, **overrides) -> pl.DataFrame:
    return detectors.run(cap, only=["replay"], overrides={f"replay.{k}": v for k, v in overrides.items()})


TAG = b"\x11" * 12


def flood(n: int, interval_ns: int, src=CLIENT, tag=TAG) -> list[dict]:
    """The original AP-REQ then n copies, each on a fresh connection."""
    return [{"t": k * interval_ns, "tag": tag, "flow": k, "src": CLIENT if k == 0 else src} for k in range(n + 1)]


# -- authenticator replays --------------------------------------------------------------------------

def test_a_rejected_flood_of_one_authenticator_is_high_with_the_numbers():
    f = run(capture(flood(150, 4 * MS)))
    assert f.height == 1
    r = f.row(0, named=True)
    assert (r["kind"], r["severity"], r["server"], r["resource"]) == (
        "authenticator_replay", "high", SERVER, "ldap/10.0.0.89@CORP.EXAMPLE")
    assert r["value"] == 150 and r["clients"] == 1 and r["client"] == CLIENT
    assert "rejected 150 (invalidCredentials)" in r["explanation"] and "first copy: saslBindInProgress" in r["explanation"]
    assert "/s" in r["explanation"] and r["start_ns"] == T0 + 4 * MS  # the first repeat (the original is evidence)
    assert 1 in r["evidence_frames"]


def test_severity_follows_count_and_rate():
    assert run(capture(flood(1, 10 * MS))).height == 0                         # one copy: below min_repeats
    assert run(capture(flood(3, 10 * MS)))["severity"].to_list() == ["low"]
    assert run(capture(flood(8, 10 * MS)))["severity"].to_list() == ["medium"]
    # many copies, but slowly (60 over 2 minutes: 0.5/s): not high
    assert run(capture(flood(60, 2 * S)))["severity"].to_list() == ["medium"]
    assert run(capture(flood(60, 2 * S)), high_rate_per_s=0.1)["severity"].to_list() == ["high"]
    assert run(capture(flood(3, 10 * MS)), min_repeats=4).height == 0


def test_an_accepted_copy_is_at_least_high_and_said():
    f = run(capture(flood(3, 10 * MS), status_of=lambda k: "success"))
    assert f["severity"].to_list() == ["high"]
    assert "ACCEPTED 3 (success)" in f["explanation"][0]


def test_copies_from_another_address_are_at_least_medium():
    f = run(capture(flood(3, 10 * MS, src=OTHER)))
    assert f["severity"].to_list() == ["medium"] and f["clients"][0] == 1
    assert f"from {OTHER}, not the original sender {CLIENT}" in f["explanation"][0]


def test_fresh_authentications_are_silent():
    aps = [{"t": k * 4 * MS, "tag": bytes([k % 256, k // 256]) * 6, "flow": k} for k in range(300)]
    assert run(capture(aps, status_of=lambda k: "saslBindInProgress")).height == 0


def test_spnego_resend_on_the_same_connection_is_not_counted():
    aps = [{"t": 0, "tag": TAG, "flow": 1}, {"t": MS, "tag": TAG, "flow": 1}] * 1
    assert run(capture(aps), min_repeats=1).height == 0
    assert run(capture(aps), min_repeats=1, in_flow_resends=0).height == 1


def test_a_pause_longer_than_the_window_splits_episodes():
    aps = flood(4, MS) + [{"t": 400 * S + k * MS, "tag": TAG, "flow": 100 + k} for k in range(4)]
    f = run(capture(aps))
    assert f.height == 2 and sorted(f["value"].to_list()) == [4, 4]
    assert run(capture(aps), window_ns=500 * S)["value"].to_list() == [8]


def test_untagged_ap_reqs_are_named_and_krb_error_34_counts_as_rejection():
    aps = flood(3, 10 * MS) + [{"t": 5 * MS, "tag": None, "flow": 99, "etype": 99}]
    aps += [{"t": 10 * MS * k + MS, "message": "krb_error", "error_code": 34, "flow": k, "frame": 10 * k + 5}
            for k in range(1, 4)]
    f = run(capture(aps, status_of=lambda k: None if k else "saslBindInProgress"))
    assert f.height == 1  # the errors are explained by the replay finding, not a second one
    e = f["explanation"][0]
    assert "rejected 3 (KRB_AP_ERR_REPEAT)" in e and "1 other AP-REQ(s) to it carry no tag (authenticator etype 99" in e


def test_krb_error_34_without_tags_is_its_own_finding():
    aps = [{"t": k * MS, "message": "krb_error", "error_code": 34, "flow": k, "frame": 10 * k + 5} for k in range(6)]
    f = run(FakeCapture(kerberos_ap=ap_frame(aps), **kerberos_frames()))
    assert f["kind"].to_list() == ["repeat_error"] and f["severity"][0] == "medium" and f["value"][0] == 6
    assert "not in the capture" in f["explanation"][0]


def test_no_frames_no_findings():
    assert run(FakeCapture()).height == 0
    assert run(FakeCapture(kerberos_ap=ap_frame([]), **kerberos_frames())).height == 0


# -- identical KDC requests --------------------------------------------------------------------------

def test_identical_tgs_reqs_on_new_flows_are_replays_answered_from_the_lookaside():
    reqs = [{"t": k * 4 * MS, "digest": 7, "flow": k, "reply_digest": 99} for k in range(51)]
    f = run(capture([], kdc=reqs))
    r = f.row(0, named=True)
    assert (r["kind"], r["server"], r["value"]) == ("kdc_request_repeat", KDC, 50)
    assert r["severity"] == "high"  # 50 replays at 250/s
    assert "50 of them with the same reply bytes" in r["explanation"]


def test_a_clients_own_udp_retries_are_at_most_low():
    reqs = [{"t": k * S, "digest": 7, "flow": 1, "reply_digest": 99 if k == 3 else None} for k in range(4)]
    f = run(capture([], kdc=reqs))
    assert f["severity"].to_list() == ["low"] and "own retries" in f["explanation"][0]
    # ... and the switch to TCP with the same request is a retry too
    reqs = [{"t": 0, "digest": 7, "flow": 1}, {"t": S, "digest": 7, "flow": 2, "transport": "tcp", "reply_digest": 9}]
    assert run(capture([], kdc=reqs), min_repeats=1)["severity"].to_list() == ["low"]
    assert run(capture([], kdc=reqs)).height == 0  # one retry: below min_repeats


def test_distinct_kdc_requests_are_silent():
    reqs = [{"t": k * MS, "digest": k, "flow": k, "reply_digest": 1000 + k} for k in range(100)]
    assert run(capture([], kdc=reqs)).height == 0


# -- the real-server sample -------------------------------------------------------------------------

REAL = SAMPLES / "krb5-replay-ldap-gssapi.pcapng"
TWIN = SAMPLES / "krb5-replay-ldap-gssapi-healthy.pcapng"


@pytest.mark.skipif(not REAL.exists(), reason="real-server sample not recorded yet")
def test_real_sample_and_its_twin():
    from analyzer import open_capture

    with open_capture(REAL) as cap:
        f = detectors.run(cap, only=["replay"])
    kinds = dict(zip(f["kind"], f["severity"]))
    assert kinds.get("authenticator_replay") in ("high", "critical"), f
    assert "kdc_request_repeat" in kinds, f
    a = f.filter(pl.col("kind") == "authenticator_replay").row(0, named=True)
    assert a["value"] == 150 and "rejected 150" in a["explanation"]
    with open_capture(TWIN) as cap:
        h = detectors.run(cap, only=["replay"])
    assert h.filter(pl.col("severity").cast(pl.String).is_in(["medium", "high", "critical"])).height == 0, h


@pytest.mark.skipif(not REAL.exists(), reason="real-server sample not recorded yet")
def test_a_tcp_retransmission_is_not_a_copy(tmp_path):
    """The same bind bytes retransmitted at the TCP layer (same sequence numbers) are one message: only
    the copies on other connections count, even with in_flow_resends 0."""
    from analyzer import open_capture, open_captures
    from builders import data_step, handshake, tcp_conversation

    with open_capture(REAL) as cap:
        ap = cap.frame("kerberos_ap").filter((pl.col("carrier") == "ldap") & (pl.col("message") == "ap_req"))
        p = cap.packets.filter(pl.col("frame") == ap["frame"][1]).row(0, named=True)
        bind = bytes(cap.buf[p["payload_offset"]:p["payload_offset"] + p["payload_len"]])
    paths = []
    for k in range(3):
        t = k * S
        steps = handshake(t) + [data_step(t + MS, True, bind)]
        if k == 0:  # the same segment again, 200 ms later (an RTO retransmission)
            steps.append(data_step(t + 201 * MS, True, bind, seq=1))
        path = tmp_path / f"c{k}.pcap"
        path.write_bytes(tcp_conversation(steps, client=("10.0.4.1", 40000 + k), server=(SERVER, 389)))
        paths.append(path)
    with open_captures(paths) as cap:
        rows = cap.frame("kerberos_ap").filter(pl.col("message") == "ap_req")
        assert rows.height == 3  # four segments carrying the bind, three messages
        f = detectors.run(cap, only=["replay"], overrides={"replay.in_flow_resends": 0})
    assert f["kind"].to_list() == ["authenticator_replay"] and f["value"].to_list() == [2]
    assert "2 got no answer" in f["explanation"][0]


def test_the_proof_chart_draws_every_copy():
    from dashboards.proofs.base import proof_charts

    cap = capture(flood(20, 4 * MS))
    r = run(cap).row(0, named=True)
    chart, caption = proof_charts(cap, r)[0]
    data = [v for v in chart.to_dict()["datasets"].values() if len(v) > 1]
    assert [len(v) for v in data] == [21] and "rejected" in caption
    assert {d["class"] for d in data[0]} == {"first copy", "rejected copy"}


def test_hostile_rows_never_crash():
    aps = flood(6, MS) + [{"t": 2 * MS, "tag": TAG, "flow": 50, "src": None}, {"t": 3 * MS, "tag": b"", "flow": 51}]
    frame = ap_frame(aps).with_columns(
        pl.when(pl.col("flow") == 3).then(None).otherwise(pl.col("sname")).alias("sname"),
        pl.when(pl.col("flow") == 4).then(None).otherwise(pl.col("ts_ns")).alias("ts_ns"),
        pl.when(pl.col("flow") == 5).then(None).otherwise(pl.col("frame")).alias("frame"))
    f = run(FakeCapture(kerberos_ap=frame, ldap_transactions=ldap_tx(aps, lambda k: None), **kerberos_frames(
        [{"t": k * MS, "digest": 7 if k else None, "flow": k, "src": None} for k in range(4)])))
    assert f.height >= 1 and f["explanation"].null_count() == 0


def test_a_copy_after_a_processed_one_on_the_same_connection_counts():
    """One keep-alive connection reusing a cached token: the service answered the first with an AP-REP
    and each later copy with KRB-ERROR 34, so no copy is a SPNEGO resend of an unprocessed token."""
    aps = [{"t": k * 50 * MS, "tag": TAG, "flow": 1, "frame": 10 * k + 1} for k in range(10)]
    answers = [{"t": k * 50 * MS + MS, "message": "ap_rep" if k == 0 else "krb_error",
                "error_code": None if k == 0 else 34, "flow": 1, "frame": 10 * k + 5} for k in range(10)]
    f = run(capture(aps + answers))
    assert f["value"].to_list() == [9] and "rejected 9 (KRB_AP_ERR_REPEAT)" in f["explanation"][0]
