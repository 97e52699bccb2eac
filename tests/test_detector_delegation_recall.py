"""delegation_recall: constructed NFSv4.1 captures decoded end to end (a holder with a WRITE
delegation, a CB_RECALL on its fore connection, waiters answered NFS4ERR_DELAY and retrying on the
Linux client's timer), and the recorded recall capture when it exists."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

import rpc_builders as b
from rpc_builders import record, reply, call

import detectors
from detectors.base import uncapped_evidence
from detectors import delegation_recall as det
from detectors.delegation_recall_table import waiter_table

S, MS = 1_000_000_000, 1_000_000
T0 = 1_700_000_000 * S
NFS = ("10.0.0.2", 2049)
HOLDER = ("10.0.0.10", 800)
FH_ROOT, FH_DIR, FH_FILE, FH_OTHER = b"root-handle-0001", b"dir-handle-000002", b"file-handle-00003", b"other-handle-004"
DELEG_SID = b.stateid(1, b"deleg-state1")
RECALL_AT = T0 + 102 * MS
LAT = 300_000  # every reply 0.3 ms after its call
# the recorded capture (helper ndrec) and its twin: the first of these that exists; env
# HERDSCOPE_RECALL_PCAP / HERDSCOPE_RECALL_HEALTHY_PCAP override (the lead moves them into samples/)
_HERE = Path(__file__).parent
_PLACES = (_HERE.parent / "samples", _HERE / "data" / "nfs" / "recorded")


def _recorded(env: str, name: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    return next((d / name for d in _PLACES if (d / name).exists()), _PLACES[-1] / name)


RECORDED = _recorded("HERDSCOPE_RECALL_PCAP", "nfs4-delegation-recall.pcap")
RECORDED_HEALTHY = _recorded("HERDSCOPE_RECALL_HEALTHY_PCAP", "nfs4-delegation-recall-healthy.pcap")


def _session(n: int) -> bytes:
    return bytes([n]) * 16


MINOR = {"v": 1}  # the scenario's minor version: 1 (SEQUENCE first), 0 (no session)


def _compound(xid, sess, seq, ops):
    if MINOR["v"] == 0:
        return record(call(xid, 100003, 4, 1, b.compound("", 0, ops)))
    return record(call(xid, 100003, 4, 1, b.compound("", 1, [b.op_sequence(sess, seq, 0, 3), *ops])))


def _result(xid, sess, seq, results, status=0):
    if MINOR["v"] == 0:
        return record(reply(xid, b.compound_res(status, "", results)))
    return record(reply(xid, b.compound_res(status, "", [b.res_sequence(sess, seq, 0, 3, 7), *results])))


def linux_retries(first_ns: int, release_ns: int) -> tuple[list[int], int]:
    """Request times answered NFS4ERR_DELAY and the one that gets through, with the Linux client's
    nfs4_delay timer (100 ms doubling, at most 15 s) after each DELAY answer."""
    delays, t, wait = [], first_ns, 100 * MS
    while t < release_ns:
        delays.append(t)
        t += LAT + wait
        wait = min(2 * wait, 15 * S)
    return delays, t


def scenario(*, return_after_ns: int | None = 2 * S, waiters: int = 4, revoke_after_ns: int = 90 * S,
             other_file_waiter: bool = False, flush_writes: int = 3, callbacks: bool = True, minor: int = 1,
             second_holder_return_ns: int | None = None):
    """(pcap bytes, truth): a holder opens /data/f.bin with a WRITE delegation; ``waiters`` clients open it
    for writing from 100 ms on; the server recalls the delegation at 102 ms and answers them DELAY until
    the holder's DELEGRETURN (``return_after_ns`` after the recall; None: never, the server revokes it
    ``revoke_after_ns`` after the recall and a later WRITE of the holder is answered DELEG_REVOKED)."""
    MINOR["v"] = minor
    sh = _session(1)
    cb = [(RECALL_AT, False, b.cb_recall_call(900, DELEG_SID, FH_FILE, sh)),
          (RECALL_AT + LAT, True, b.cb_recall_reply(900, sh))] if callbacks and minor else []
    h = [(T0 + 1 * MS, True, _compound(1, sh, 1, [b.op_putrootfh(), b.op_lookup("data"), b.op_getfh()])),
         (T0 + 1 * MS + LAT, False, _result(1, sh, 1, [b.res_plain(24), b.res_plain(15), b.res_getfh(FH_DIR)])),
         (T0 + 5 * MS, True, _compound(2, sh, 2, [b.op_putfh(FH_DIR), b.op_open("f.bin", access=3, owner=b"holder"),
                                                  b.op_getfh()])),
         (T0 + 5 * MS + LAT, False, _result(2, sh, 2, [b.res_plain(22), b.res_open_write_deleg(
             b.stateid(1, b"open-hold-01"), DELEG_SID), b.res_getfh(FH_FILE)])),
         *cb]
    xid, seq = 3, 3
    span = return_after_ns if return_after_ns is not None else 50 * MS * (flush_writes + 1)
    for k in range(flush_writes):
        t = RECALL_AT + (k + 1) * span // (flush_writes + 1)
        h += [(t, True, _compound(xid, sh, seq, [b.op_putfh(FH_FILE), b.op_write(b.stateid(1, b"open-hold-01"),
                                                                                k * 4096, b"x" * 4096)])),
              (t + LAT, False, _result(xid, sh, seq, [b.res_plain(22), b.res_write(4096)]))]
        xid, seq = xid + 1, seq + 1
    if return_after_ns is not None:
        release = RECALL_AT + return_after_ns
        h += [(release, True, _compound(xid, sh, seq, [b.op_putfh(FH_FILE), b.op_delegreturn(DELEG_SID)])),
              (release + LAT, False, _result(xid, sh, seq, [b.res_plain(22), b.res_plain(8)]))]
    else:
        release = RECALL_AT + revoke_after_ns
        t = release + 2 * S
        h += [(t, True, _compound(xid, sh, seq, [b.op_putfh(FH_FILE), b.op_write(DELEG_SID, 0, b"late")])),
              (t + LAT, False, _result(xid, sh, seq, [b.res_plain(22), b.res_plain(38, 10087)], status=10087))]
    conns = [{"client": HOLDER, "server": NFS, "t0": T0, "messages": h}]
    if second_holder_return_ns is not None:  # a second holder, of a read delegation, recalled 50 µs later
        s2, sid2, at = _session(2), b.stateid(1, b"deleg-state2"), RECALL_AT + 50_000
        conns.append({"client": ("10.0.0.11", 801), "server": NFS, "t0": T0, "messages": [
            (T0 + 7 * MS, True, _compound(1, s2, 1, [b.op_putfh(FH_DIR), b.op_open("f.bin", owner=b"reader"),
                                                     b.op_getfh()])),
            (T0 + 7 * MS + LAT, False, _result(1, s2, 1, [b.res_plain(22), b.res_open(
                b.stateid(1, b"open-read-01"), deleg=1, deleg_sid=sid2), b.res_getfh(FH_FILE)])),
            (at, False, b.cb_recall_call(901, sid2, FH_FILE, s2)), (at + LAT, True, b.cb_recall_reply(901, s2)),
            (at + second_holder_return_ns, True, _compound(2, s2, 2, [b.op_putfh(FH_FILE), b.op_delegreturn(sid2)])),
            (at + second_holder_return_ns + LAT, False, _result(2, s2, 2, [b.res_plain(22), b.res_plain(8)]))]})
    if callbacks and minor == 0:  # RFC 7530 §3.3.1: the server connects to the client's callback address
        conns.append({"client": (NFS[0], 1001), "server": (HOLDER[0], 45123), "t0": RECALL_AT - MS, "messages": [
            (RECALL_AT, True, b.cb_recall_call(900, DELEG_SID, FH_FILE)),
            (RECALL_AT + LAT, False, b.cb_recall_reply(900))]})
    truth = {"release_ns": release, "waiters": []}
    files = [("f.bin", FH_FILE)] * waiters + ([("other.bin", FH_OTHER)] if other_file_waiter else [])
    for i, (name, fh) in enumerate(files):
        sw = _session(10 + i)
        first = T0 + 100 * MS + i * 200_000
        delays, through = linux_retries(first, release)
        msgs = []
        for n, t in enumerate(delays):
            msgs += [(t, True, _compound(10 + n, sw, n + 1, [b.op_putfh(FH_DIR), b.op_open(name, access=2,
                                                                                        owner=b"w%d" % i)])),
                     (t + LAT, False, _result(10 + n, sw, n + 1, [b.res_plain(22), b.res_plain(18, b.NFS4ERR_DELAY)],
                                              status=b.NFS4ERR_DELAY))]
        n = len(delays)
        msgs += [(through, True, _compound(10 + n, sw, n + 1, [b.op_putfh(FH_DIR), b.op_open(name, access=2,
                                                                                          owner=b"w%d" % i),
                                                               b.op_getfh()])),
                 (through + LAT, False, _result(10 + n, sw, n + 1, [b.res_plain(22), b.res_open(
                     b.stateid(1, b"open-w%d" % i)), b.res_getfh(fh)]))]
        conns.append({"client": (f"10.0.1.{i + 1}", 900 + i), "server": NFS, "t0": T0 + 50 * MS, "messages": msgs})
        truth["waiters"].append({"client": f"10.0.1.{i + 1}", "file": name, "delays": len(delays), "first": first,
                                 "through_response": through + LAT})
    return b.multi_tcp_capture(conns), truth


def _run(cap, **overrides):
    return detectors.run(cap, only=[det.NAME], overrides={f"{det.NAME}.{k}": v for k, v in overrides.items()})


def test_slow_return_with_four_waiters(read_capture):
    data, truth = scenario(return_after_ns=2 * S, waiters=4)
    cap = read_capture(data)
    with uncapped_evidence():
        f = _run(cap)
    slow = f.filter(pl.col("kind") == "slow_return")
    assert slow.height == 1
    x = slow.row(0, named=True)
    assert (x["client"], x["server"], x["resource"]) == (HOLDER[0], NFS[0], "/data/f.bin")
    assert x["value"] == pytest.approx(2000.0, abs=0.01) and x["threshold"] == pytest.approx(50.0)
    assert x["clients"] == 5 and x["metric"] == "recall_return_ms"
    waits = [w["through_response"] - w["first"] for w in truth["waiters"]]
    assert sum(waits) >= 5 * S and x["severity"] == "high"
    n_delays = sum(w["delays"] for w in truth["waiters"])
    assert f"4 OPENs from 4 other clients waited behind it ({n_delays} NFS4ERR_DELAY answers)" in x["explanation"]
    assert "queue depth up to 4" in x["explanation"] and "3 WRITE/COMMITs (12,288 bytes)" in x["explanation"]
    # evidence: the CB_RECALL, the DELEGRETURN, every DELAY answer and the final successes
    tx = cap.frame("nfs_transactions")
    wanted = tx.filter(pl.col("operation").is_in(["CB_RECALL", "DELEGRETURN"])
                       | ((pl.col("operation") == "OPEN") & (pl.col("client") != HOLDER[0])))
    frames = set(wanted["request_frame"].to_list()) | set(wanted["response_frame"].to_list())
    assert frames <= set(x["evidence_frames"])
    # per waiter: its DELAY count, its total wait and how long after the return it got through
    w = waiter_table(cap, det.Params()).sort("wclient")
    assert w["delays"].to_list() == [t["delays"] for t in truth["waiters"]]
    assert w["wait_ns"].to_list() == waits
    assert w["after_return_ns"].to_list() == [t["through_response"] - truth["release_ns"] for t in truth["waiters"]]
    assert f.filter(pl.col("kind") != "slow_return").height == 0


def test_nfs40_recall_on_the_callback_connection(read_capture):
    """NFSv4.0: the CB_RECALL on a connection the server opens to the client's callback port."""
    data, truth = scenario(return_after_ns=2 * S, waiters=3, minor=0)
    try:
        f = _run(read_capture(data))
    finally:
        MINOR["v"] = 1
    assert f["kind"].to_list() == ["slow_return"]
    x = f.row(0, named=True)
    assert x["client"] == HOLDER[0] and x["value"] == pytest.approx(2000.0, abs=0.01) and x["clients"] == 4
    assert "3 OPENs from 3 other clients" in x["explanation"]


def test_waiters_go_with_the_recall_that_held_them(read_capture):
    """Two holders recalled at once: the waiters wait for the slow one (recalled first), not the
    prompt one recalled 50 µs later."""
    data, truth = scenario(return_after_ns=2 * S, waiters=3, second_holder_return_ns=5 * MS)
    f = _run(read_capture(data))
    assert f["kind"].to_list() == ["slow_return"]
    x = f.row(0, named=True)
    assert x["client"] == HOLDER[0] and "3 OPENs from 3 other clients" in x["explanation"]


def test_prompt_return_is_silent(read_capture):
    data, _ = scenario(return_after_ns=5 * MS, waiters=4)
    assert _run(read_capture(data)).height == 0


def test_lowered_floor_reports_the_prompt_return(read_capture):
    data, _ = scenario(return_after_ns=5 * MS, waiters=2)
    f = _run(read_capture(data), min_return_latency_ns=1 * MS, return_latency_factor=0.0)
    assert f["kind"].to_list() == ["slow_return"] and f["value"][0] == pytest.approx(5.0, abs=0.01)


def test_unreturned_recall_revoked_after_the_lease(read_capture):
    data, truth = scenario(return_after_ns=None, waiters=2, revoke_after_ns=90 * S)
    f = _run(read_capture(data))
    un = f.filter(pl.col("kind") == "unreturned")
    assert un.height == 1
    x = un.row(0, named=True)
    assert x["client"] == HOLDER[0] and x["resource"] == "/data/f.bin"
    assert x["value"] * MS >= 90 * S  # observed past the lease
    assert "never returned" in x["explanation"] and "NFS4ERR_DELEG_REVOKED" in x["explanation"]
    assert "2 got through" in x["explanation"]
    assert x["severity"] == "critical"  # two clients waited ~90 s each
    assert f.filter(pl.col("kind") == "slow_return").height == 0


def test_a_waiter_on_another_file_is_not_counted(read_capture):
    data, truth = scenario(return_after_ns=2 * S, waiters=4, other_file_waiter=True)
    f = _run(read_capture(data))
    x = f.filter(pl.col("kind") == "slow_return").row(0, named=True)
    assert x["clients"] == 5 and "4 OPENs from 4 other clients" in x["explanation"]
    assert "10.0.1.5" not in x["explanation"]
    # its DELAY answers are not explained by the visible recall: reported as such, informational
    un = f.filter(pl.col("kind") == "recall_unseen")
    assert un["resource"].to_list() == ["/data/other.bin"] and un["severity"].to_list() == ["informational"]
    assert un["value"][0] == truth["waiters"][4]["delays"]


def test_no_callback_captured_reports_the_delays_informationally(read_capture):
    """The recall itself cut out of the capture (a 4.0 callback connection not captured)."""
    data, truth = scenario(return_after_ns=2 * S, waiters=3, callbacks=False)
    f = _run(read_capture(data))
    assert f["kind"].to_list() == ["recall_unseen"]
    x = f.row(0, named=True)
    assert x["severity"] == "informational" and x["resource"] == "/data/f.bin"
    assert x["value"] == sum(w["delays"] for w in truth["waiters"]) and x["clients"] == 3
    assert "holds no callback" in x["explanation"] and "10.0.0.10 was granted a write delegation" in x["explanation"]
    first = min(w["first"] for w in truth["waiters"])
    from detectors.base import fmt_ns
    assert f"returned a delegation on it (DELEGRETURN, frame" in x["explanation"]
    assert f"{fmt_ns(truth['release_ns'] - first)} after the first DELAY" in x["explanation"]


def test_storm_of_recalls_on_one_file(read_capture):
    """Six delegations on one file granted and recalled within a few seconds."""
    sh = _session(1)
    msgs = [(T0 + 1 * MS, True, _compound(1, sh, 1, [b.op_putrootfh(), b.op_lookup("data"), b.op_getfh()])),
            (T0 + 1 * MS + LAT, False, _result(1, sh, 1, [b.res_plain(24), b.res_plain(15), b.res_getfh(FH_DIR)]))]
    for k in range(6):
        t = T0 + (k + 1) * 500 * MS
        sid = b.stateid(1, b"deleg-st%04d" % k)
        msgs += [(t, True, _compound(10 + k, sh, 2 + k, [b.op_putfh(FH_DIR), b.op_open("f.bin", owner=b"h"),
                                                        b.op_getfh()])),
                 (t + LAT, False, _result(10 + k, sh, 2 + k, [b.res_plain(22), b.res_open_write_deleg(
                     b.stateid(1, b"open-%07d" % k), sid), b.res_getfh(FH_FILE)])),
                 (t + 100 * MS, False, b.cb_recall_call(900 + k, sid, FH_FILE, sh)),
                 (t + 100 * MS + LAT, True, b.cb_recall_reply(900 + k, sh)),
                 (t + 101 * MS, True, _compound(100 + k, sh, 20 + k, [b.op_putfh(FH_FILE), b.op_delegreturn(sid)])),
                 (t + 101 * MS + LAT, False, _result(100 + k, sh, 20 + k, [b.res_plain(22), b.res_plain(8)]))]
    data = b.multi_tcp_capture([{"client": HOLDER, "server": NFS, "t0": T0, "messages": msgs}])
    f = _run(read_capture(data))
    assert f["kind"].to_list() == ["storm"]
    x = f.row(0, named=True)
    assert x["value"] == 6 and x["resource"] == "/data/f.bin" and "6 grants seen" in x["explanation"]
    assert _run(read_capture(data, name="s2.pcap"), storm_min_recalls=7).height == 0


def test_no_nfs_is_empty(read_capture):
    from builders import dns_query, ethernet, ipv4, pcap_file, udp

    frame = ethernet(ipv4(udp(dns_query(), sport=5353, dport=53), proto=17))
    f = _run(read_capture(pcap_file([(1_700_000_000, 0, frame)], nanosecond=True)))
    assert f.height == 0


def test_fake_capture_without_nfs_frames_is_empty():
    from fakes import FakeCapture

    assert det.detect(FakeCapture()).height == 0


def _measured(pcap: Path) -> dict:
    """The capture's [capture.measured] ground truth from the MANIFEST.toml (or GROUNDTRUTH.toml) beside
    it ({} if none)."""
    import tomllib

    for manifest in (pcap.parent / "MANIFEST.toml", pcap.parent / "GROUNDTRUTH.toml"):
        if manifest.exists():
            for c in tomllib.loads(manifest.read_text()).get("capture", []):
                if c.get("file") == pcap.name and c.get("measured"):
                    return c["measured"]
    return {}


@pytest.mark.skipif(not RECORDED.exists(), reason=f"recorded capture {RECORDED} not there yet")
def test_recorded_recall(read_capture):
    """Ganesha + GlusterFS: a write delegation recalled while writers get NFS4ERR_DELAY (helper ndrec)."""
    cap = read_capture(RECORDED.read_bytes(), name="rec.pcap")
    f = _run(cap)
    slow = f.filter(pl.col("kind") == "slow_return")
    assert slow.height == 1 and f.height == 1
    x = slow.row(0, named=True)
    assert x["severity"] in ("medium", "high", "critical")
    m = _measured(RECORDED)
    if m:
        assert (x["client"], x["server"], x["resource"]) == (m["holder"], m["server"], m["path"])
        assert x["value"] == pytest.approx(m["recall_to_delegreturn_ms"], abs=1.0)
        assert f"from {m['writers']} other clients" in x["explanation"]
        assert f"({m['delay_replies']} NFS4ERR_DELAY answers)" in x["explanation"]
        assert f"{m['flush_writes']} WRITE/COMMITs" in x["explanation"]
        w = waiter_table(cap, det.Params())
        t0 = cap.packets["ts_ns"].min()
        last_ok_s = (w["final_response_ts_ns"].max() - t0) / S
        assert last_ok_s == pytest.approx(m["last_writer_open_ok_s"], abs=0.002)


@pytest.mark.skipif(not RECORDED_HEALTHY.exists(), reason=f"recorded capture {RECORDED_HEALTHY} not there yet")
def test_recorded_healthy_twin_is_quiet(read_capture):
    f = _run(read_capture(RECORDED_HEALTHY.read_bytes(), name="healthy.pcap"))
    assert f.filter(pl.col("severity") != "informational").height == 0


def test_proof_chart_draws_the_recall_and_its_waiters(read_capture):
    from dashboards import proofs

    data, truth = scenario(return_after_ns=2 * S, waiters=4)
    cap = read_capture(data)
    f = _run(cap)
    charts = proofs.proof_charts(cap, f.row(0, named=True), f)
    assert len(charts) == 1
    spec = charts[0][0].to_dict()
    rows = {r["row"] for d in spec["datasets"].values() for r in d if "row" in r}
    assert {f"  10.0.1.{i} OPEN" for i in range(1, 5)} <= rows and any(r.startswith("recall ") for r in rows)
    depths = [r["depth"] for d in spec["datasets"].values() for r in d if "depth" in r]
    assert max(depths) == 4


def test_unreturned_without_the_holders_direction_is_informational(read_capture):
    """A capture without the holder's client-to-server packets cannot show a DELEGRETURN."""
    from fakes import FakeCapture

    data, _ = scenario(return_after_ns=None, waiters=2)
    cap = read_capture(data)
    tx = cap.frame("nfs_transactions")
    holder_flow = tx.filter((pl.col("client") == HOLDER[0]) & (pl.col("operation") == "OPEN"))["flow"][0]
    conns = cap.frame("connections").with_columns(
        pl.when(pl.col("conn") == holder_flow).then(0).otherwise(pl.col("client_packets"))
        .cast(cap.frame("connections").schema["client_packets"]).alias("client_packets"))
    fake = FakeCapture(nfs_transactions=tx, connections=conns, packets=cap.packets.select("frame", "ts_ns"))
    f = det.detect(fake)
    x = f.filter(pl.col("kind") == "unreturned").row(0, named=True)
    assert x["severity"] == "informational" and "cannot show one" in x["explanation"]
