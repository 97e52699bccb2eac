"""lock_polling: clients polling a held NFS lock (NFSv4 NFS4ERR_DENIED, NLM4_DENIED).

On the recorded captures (tests/data/nfs/recorded, nfs-ganesha, 4 clients) against their ground truth,
and on constructed nfs_transactions rows: NLM non-blocking polling (found) and blocking waits (not
polling), starvation, one client locking and unlocking alone, a capture without NFS."""
from __future__ import annotations

import statistics
import tomllib
from pathlib import Path

import polars as pl
import pytest

from detectors import lock_polling as lp
from detectors.base import FINDINGS_SCHEMA
from fakes import S, T0, FakeCapture, transaction_frame

RECORDED = Path(__file__).parent / "data" / "nfs" / "recorded"
GROUNDTRUTH = {e["file"]: e for e in tomllib.loads((RECORDED / "GROUNDTRUTH.toml").read_text())["capture"]}
SRV = "10.0.0.2"
FILE = "/export/locks/job.lock"
WHOLE = 2**64 - 1


# -- the recorded captures ------------------------------------------------------------------------------

def _scan(name: str):
    from analyzer import open_capture

    with open_capture(RECORDED / name) as cap:
        return lp.detect(cap), lp.episode_summaries(cap)


def _truth_gaps(e: dict) -> list[float]:
    """Release -> next grant gaps (s) from the ground truth, for releases followed by a waiter's grant."""
    grants, releases = e["grant_s"], e["release_s"]
    return [g - r for r, g in zip(releases[:-1], grants[1:])]


def test_fixed_polling_found_with_groundtruth_free_time():
    e = GROUNDTRUTH["nfs4-lock-polling.pcap"]
    found, summaries = _scan(e["file"])
    assert found.height == 1 and len(summaries) == 1
    f, s = found.row(0, named=True), summaries[0]
    assert f["kind"] == "nfs4" and f["severity"] in ("medium", "high", "critical")
    assert s["waiters"] == e["clients"] - 1
    assert s["polls"] == e["lock_denials"]
    assert s["grants"] == e["locks_granted"] - 1  # the first holder never waited
    assert s["backoff"] == "fixed"
    gaps = _truth_gaps(e)
    assert s["releases"] == len(gaps)
    first_denied = min(t for t, d in zip(e["attempt_s"], e["attempt_denied"]) if d)
    truth_share = sum(gaps) / (e["grant_s"][-1] - first_denied)
    assert s["free_share"] == pytest.approx(truth_share, rel=0.15)
    assert s["median_free_ns"] / S == pytest.approx(statistics.median(gaps), rel=0.15)
    assert s["overtakes"] == 0 and not s["starved"]  # granted in request order
    assert s["holder"] == e["grant_order"][0]
    assert "FIFO" in f["explanation"] and "CB_NOTIFY_LOCK" in f["explanation"]
    assert f["evidence_total"] >= e["lock_denials"]


def test_growing_polling_is_exponential_and_mostly_free():
    e = GROUNDTRUTH["nfs4-lock-polling-growing.pcap"]
    found, summaries = _scan(e["file"])
    assert found.height == 1
    s = summaries[0]
    assert s["backoff"] == "exponential"
    assert s["waiters"] == e["clients"] - 1 and s["polls"] == e["lock_denials"]
    gaps = _truth_gaps(e)
    first_denied = min(t for t, d in zip(e["attempt_s"], e["attempt_denied"]) if d)
    assert s["free_share"] == pytest.approx(sum(gaps) / (e["grant_s"][-1] - first_denied), rel=0.1)
    # the lock sat free for a large share of the wait: at least high by the documented rule
    assert s["free_share"] >= lp.Params().high_free_share
    assert found["severity"][0] in ("high", "critical")


def test_healthy_twin_is_quiet():
    found, _ = _scan("nfs4-lock-polling-healthy.pcap")
    assert found.filter(pl.col("severity") != "informational").height == 0


# -- constructed rows -----------------------------------------------------------------------------------

def _row(client, t_s, op, status, *, program=100003, owner=None, denied_owner=None, lat_us=200, port=None,
         offset=0, length=WHOLE, lock_type="WRITEW_LT", server=SRV, path=FILE, frame=None, callback=False):
    return {"client": client, "t": T0 + int(t_s * S), "op": op, "status": status, "lat": lat_us * 1000,
            "server": server, "name": path, "port": port or 700 + int(client.rsplit(".", 1)[1]),
            "server_port": 2049 if program == 100003 else 4045, "transport": "tcp",
            "flow": int(client.rsplit(".", 1)[1]), "program": program, "owner": owner, "denied_owner": denied_owner,
            "offset": offset, "length": length, "lock_type": lock_type, "path": path, "is_callback": callback,
            **({"frame": frame} if frame else {})}


def _capture(rows: list[dict]) -> FakeCapture:
    rows = sorted(rows, key=lambda r: r["t"])
    for k, r in enumerate(rows):
        r["frame"] = 2 * k + 1
    tx = transaction_frame(rows, protocol="nfs", program=100003, owner=None, denied_owner=None, offset=0,
                           length=0, lock_type=None, path=None, is_callback=False, minorversion=0,
                           denied_clientid=None)
    tx = tx.with_columns(pl.col("program").cast(pl.UInt32), pl.col("offset").cast(pl.UInt64),
                         pl.col("length").cast(pl.UInt64), pl.col("minorversion").cast(pl.UInt32),
                         pl.col("denied_clientid").cast(pl.UInt64), pl.col("owner").cast(pl.String),
                         pl.col("denied_owner").cast(pl.String), pl.col("lock_type").cast(pl.String),
                         pl.col("path").cast(pl.String))
    return FakeCapture(nfs_transactions=tx)


def _polls(client, start_s, every_s, until_s, *, owner, holder_owner, program=100003, denied="NFS4ERR_DENIED",
           op="LOCK", **kw):
    rows, t = [], start_s
    while t < until_s:
        rows.append(_row(client, t, op, denied, program=program, owner=owner, denied_owner=holder_owner, **kw))
        t += every_s
    return rows


def test_nlm_nonblocking_polling_is_found_blocking_wait_is_not():
    nlm = dict(program=100021, length=0, lock_type="WRITE_LT")
    a, b = "10.0.0.11", "10.0.0.12"
    held = [_row(a, 0.0, "LOCK", "NLM4_GRANTED", owner="aa", **nlm), _row(a, 4.2, "UNLOCK", "NLM4_GRANTED", **nlm)]
    polled = _polls(b, 0.5, 1.0, 4.0, owner="bb", holder_owner=None, denied="NLM4_DENIED", **nlm) \
        + [_row(b, 4.5, "LOCK", "NLM4_GRANTED", owner="bb", **nlm)]
    found = lp.detect(_capture(held + polled))
    assert found.height == 1
    f = found.row(0, named=True)
    assert f["kind"] == "nlm" and f["value"] == 4.0 and f["unit"] == "polls"
    assert "NLM4_DENIED" in f["explanation"]
    # the same wait done the protocol's way: one LOCK answered NLM4_BLOCKED, the server's GRANTED callback
    queued = [_row(b, 0.5, "LOCK", "NLM4_BLOCKED", owner="bb", **nlm),
              {**_row(SRV, 4.2005, "GRANTED", "NLM4_GRANTED", owner="bb", server=b, **nlm)}]
    assert lp.detect(_capture(held + queued)).height == 0
    t = lp.lock_tables(_capture(held + queued))
    w = t["waits"]
    assert w.height == 1 and w["blocked"][0] and w["polls"][0] == 0 and w["client"][0] == b
    assert w["grant_ns"][0] == T0 + int(4.2005 * S)  # granted by the callback, to the client it called


def _starvation_rows():
    a, b, c, d = "10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"
    rows = [_row(a, 0.0, "LOCK", "NFS4_OK", owner="aa"), _row(a, 2.05, "LOCKU", "NFS4_OK")]
    # B polls every second just after the others have won: always too late
    rows += _polls(b, 0.12, 1.0, 6.0, owner="bb", holder_owner="aa")
    rows += [_row(b, 6.12, "LOCK", "NFS4_OK", owner="bb")]
    # C and D poll every 200 ms and win every release, C twice
    rows += _polls(c, 0.5, 0.2, 2.1, owner="cc", holder_owner="aa") + [_row(c, 2.1, "LOCK", "NFS4_OK", owner="cc"),
                                                                        _row(c, 3.05, "LOCKU", "NFS4_OK")]
    rows += _polls(d, 0.6, 0.2, 3.1, owner="dd", holder_owner="aa") + [_row(d, 3.1, "LOCK", "NFS4_OK", owner="dd"),
                                                                        _row(d, 4.05, "LOCKU", "NFS4_OK")]
    rows += _polls(c, 3.2, 0.2, 4.1, owner="cc", holder_owner="dd") + [_row(c, 4.1, "LOCK", "NFS4_OK", owner="cc"),
                                                                        _row(c, 5.05, "LOCKU", "NFS4_OK")]
    return rows, b


def test_starvation_names_the_client_overtaken_by_later_askers():
    rows, starved = _starvation_rows()
    cap = _capture(rows)
    found = lp.detect(cap)
    assert found.height == 1
    f = found.row(0, named=True)
    s = lp.episode_summaries(cap)[0]
    assert s["starved"] == [starved] and f["client"] == starved
    assert s["overtakes"] >= 3
    assert f["severity"] in ("medium", "high", "critical")
    assert f"{starved} starved" in f["explanation"] and "not a queue" in f["explanation"]
    # one more overtake needed than happened: nobody starves
    s_strict = lp.episode_summaries(cap, lp.Params(starve_min_overtakes=s["overtakes"] + 1))[0]
    assert s_strict["starved"] == []


def test_free_gap_is_release_to_next_grant():
    rows, _ = _starvation_rows()
    s = lp.episode_summaries(_capture(rows))[0]
    # releases 2.05 (+200 µs reply) -> 2.1, 3.05 -> 3.1, 4.05 -> 4.1, 5.05 -> 6.12
    assert s["releases"] == 4
    expected = (0.05 - 0.0002) * 3 + (6.12 - 5.05 - 0.0002)
    assert s["free_ns"] / S == pytest.approx(expected, rel=1e-6)


def test_one_client_locking_alone_is_not_polling():
    a = "10.0.0.11"
    rows = []
    for k in range(10):
        rows += [_row(a, k * 1.0, "LOCK", "NFS4_OK", owner="aa"), _row(a, k * 1.0 + 0.5, "LOCKU", "NFS4_OK")]
    cap = _capture(rows)
    assert lp.detect(cap).height == 0
    assert lp.lock_tables(cap)["holds"].height == 10


def test_few_denials_need_a_lowered_threshold():
    a, b = "10.0.0.11", "10.0.0.12"
    rows = [_row(a, 0.0, "LOCK", "NFS4_OK", owner="aa"), _row(a, 1.5, "LOCKU", "NFS4_OK")]
    rows += _polls(b, 0.2, 1.0, 1.3, owner="bb", holder_owner="aa") + [_row(b, 2.2, "LOCK", "NFS4_OK", owner="bb")]
    cap = _capture(rows)
    assert lp.detect(cap).height == 0  # 2 denials < min_polls 3
    found = lp.detect(cap, lp.Params(min_polls=2))
    assert found.height == 1 and found["severity"][0] != "informational"


def test_disjoint_ranges_are_separate_locks():
    a, b = "10.0.0.11", "10.0.0.12"
    rows = [_row(a, 0.0, "LOCK", "NFS4_OK", owner="aa", offset=0, length=100),
            _row(b, 0.1, "LOCK", "NFS4_OK", owner="bb", offset=100, length=100)]
    rows += _polls(b, 0.5, 0.5, 3.0, owner="bb", holder_owner="aa", offset=50, length=10)
    ev = lp.lock_tables(_capture(rows))["events"]
    assert ev["gkey"].n_unique() == 2  # [0,100) with [50,60), and [100,200) alone


def test_capture_without_nfs_is_empty():
    empty_cap = FakeCapture()
    out = lp.detect(empty_cap)
    assert out.height == 0 and out.schema == FINDINGS_SCHEMA
    no_rows = _capture([_row("10.0.0.11", 0.0, "LOCK", "NFS4_OK", owner="aa")]).frame("nfs_transactions").head(0)
    assert lp.detect(FakeCapture(nfs_transactions=no_rows)).height == 0
    odd = pl.DataFrame({"operation": ["LOCK"], "client": ["x"]})  # missing columns: nothing, no exception
    assert lp.detect(FakeCapture(nfs_transactions=odd)).height == 0


def test_never_granted_while_others_were_is_starved_even_in_order():
    a, b, c, d = "10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"
    rows = [_row(a, 0.0, "LOCK", "NFS4_OK", owner="aa"), _row(a, 1.0, "LOCKU", "NFS4_OK")]
    rows += _polls(c, 0.1, 0.5, 1.0, owner="cc", holder_owner="aa") + [_row(c, 1.1, "LOCK", "NFS4_OK", owner="cc"),
                                                                        _row(c, 2.0, "LOCKU", "NFS4_OK")]
    rows += _polls(d, 0.15, 0.5, 2.0, owner="dd", holder_owner="aa") + [_row(d, 2.15, "LOCK", "NFS4_OK", owner="dd"),
                                                                         _row(d, 3.0, "LOCKU", "NFS4_OK")]
    rows += _polls(b, 0.2, 1.0, 2.5, owner="bb", holder_owner="aa")  # gives up after its poll at 2.2
    s = lp.episode_summaries(_capture(rows))[0]
    assert s["overtakes"] == 0  # C and D asked before B: the grants went in request order
    assert s["starved"] == [b]
    assert s["grants"] == 2


def test_proof_chart_draws_polls_holds_and_free_gaps():
    from analyzer import open_capture
    from dashboards.proofs.base import proof_charts
    from dashboards.proofs.lock_polling import FREE_LANE, lock_lanes

    e = GROUNDTRUTH["nfs4-lock-polling.pcap"]
    with open_capture(RECORDED / e["file"]) as cap:
        f = lp.detect(cap).row(0, named=True)
        lanes = lock_lanes(cap, f)
        charts = proof_charts(cap, f)
    spans, points = lanes["spans"], lanes["points"]
    assert points.filter(pl.col("what") == "denied poll").height == e["lock_denials"]
    assert spans.filter(pl.col("lane") == FREE_LANE).height == len(_truth_gaps(e))
    assert sorted(spans.filter(pl.col("state") == "holding")["lane"].unique().to_list()) == sorted(e["grant_order"])
    assert len(charts) == 1
    spec = charts[0][0].to_dict()
    assert "lock free" in str(spec)


# -- NLM end to end: packets through the decoder -----------------------------------------------------------

NLM_SRV = ("10.0.0.2", 32803)


def _nlm_pcap(messages) -> bytes:
    """messages: (client (addr, port), from_client, rpc bytes, t_s): UDP datagrams to / from the lock server."""
    from builders import ethernet, ipv4, pcap_file, udp

    records = []
    for client, from_client, payload, t_s in messages:
        (sa, sp), (da, dp) = (client, NLM_SRV) if from_client else (NLM_SRV, client)
        t = T0 + int(t_s * S)
        records.append((t // S, t % S, ethernet(ipv4(udp(payload, sport=sp, dport=dp), proto=17, src=sa, dst=da))))
    return pcap_file(records, nanosecond=True)


def _nlm_messages(blocking: bool):
    import rpc_builders as b
    from rpc_builders import call, reply, u32

    cookie, fh = b.opaque(b"\x01\x02"), b"file-handle-00003"

    def lock(owner):
        return b.opaque("node7") + b.opaque(fh) + b.opaque(owner) + u32(4242) + b.u64(0) + b.u64(0)

    a, w = ("10.0.0.11", 700), ("10.0.0.12", 701)
    lock_call = lambda xid, owner, block: call(xid, 100021, 4, 2, cookie + u32(int(block)) + u32(1) + lock(owner)
                                               + u32(0) + u32(3))
    msgs = [(a, True, lock_call(1, b"owner-a", False), 0.0), (a, False, reply(1, cookie + u32(0)), 0.0002),
            (a, True, call(2, 100021, 4, 4, cookie + lock(b"owner-a")), 3.0), (a, False, reply(2, cookie + u32(0)), 3.0002)]
    if blocking:  # queued by the server (NLM4_BLOCKED), then its GRANTED callback to the waiter
        msgs += [(w, True, lock_call(10, b"owner-b", True), 0.5), (w, False, reply(10, cookie + u32(3)), 0.5002),
                 (w, False, call(50, 100021, 4, 5, cookie + u32(1) + lock(b"owner-b")), 3.001),
                 (w, True, reply(50, cookie + u32(0)), 3.0012)]
    else:  # non-blocking LOCKs, denied and re-sent every second
        for k, t in enumerate((0.5, 1.5, 2.5, 3.5)):
            msgs += [(w, True, lock_call(10 + k, b"owner-b", False), t),
                     (w, False, reply(10 + k, cookie + u32(1 if t < 3 else 0)), t + 0.0002)]
    return sorted(msgs, key=lambda m: m[3])


def test_nlm_capture_polling_found_and_blocking_wait_not(read_capture):
    polled = read_capture(_nlm_pcap(_nlm_messages(blocking=False)), name="nlm-poll.pcap")
    found = lp.detect(polled)
    assert found.height == 1 and found["kind"][0] == "nlm"
    s = lp.episode_summaries(polled)[0]
    assert (s["polls"], s["grants"], s["waiters"]) == (3, 1, 1)
    assert s["free_ns"] / S == pytest.approx(0.5 - 0.0002, abs=1e-6)  # UNLOCK reply at 3.0002, the poll at 3.5
    queued = read_capture(_nlm_pcap(_nlm_messages(blocking=True)), name="nlm-block.pcap")
    assert lp.detect(queued).height == 0
    w = lp.lock_tables(queued)["waits"]
    assert w.height == 1 and w["blocked"][0] and w["client"][0] == "10.0.0.12"
    assert w["grant_ns"][0] == T0 + int(3.001 * S)


def test_a_lock_held_from_before_the_capture_is_named_from_the_denial():
    b = "10.0.0.12"
    holder = b"backup-job".hex()
    rows = _polls(b, 0.0, 0.5, 2.0, owner="bb", holder_owner=holder) + [_row(b, 2.0, "LOCK", "NFS4_OK", owner="bb")]
    f = lp.detect(_capture(rows)).row(0, named=True)
    assert "lock owner 'backup-job'" in f["explanation"] and "not in the capture" in f["explanation"]
    assert "no release visible" in f["explanation"]  # its release (LOCKU, CLOSE or lease expiry) is not seen
    s = lp.episode_summaries(_capture(rows))[0]
    assert s["releases"] == 0 and s["free_ns"] == 0 and s["holder"] is None


def test_a_close_without_locku_is_the_release():
    a, b = "10.0.0.11", "10.0.0.12"
    rows = [_row(a, 0.0, "LOCK", "NFS4_OK", owner="aa"), _row(a, 1.7, "CLOSE", "NFS4_OK", lock_type=None)]
    rows += _polls(b, 0.1, 0.5, 2.0, owner="bb", holder_owner="aa") + [_row(b, 2.1, "LOCK", "NFS4_OK", owner="bb")]
    cap = _capture(rows)
    s = lp.episode_summaries(cap)[0]
    assert s["releases"] == 1 and s["free_ns"] / S == pytest.approx(2.1 - 1.7 - 0.0002, abs=1e-6)
    assert "holder's CLOSE with no LOCKU" in lp.detect(cap)["explanation"][0]
    # another client's CLOSE of the file is not a release of A's lock
    other = [r for r in rows if r["op"] != "CLOSE"] + [_row(b, 1.7, "CLOSE", "NFS4_OK", lock_type=None)]
    assert lp.episode_summaries(_capture(other))[0]["releases"] == 0
