"""smb_break_queue on tiny constructed smb2_breaks / smb2_transactions frames (Zeek's policy-test
habit: a few rows, lowered thresholds where it helps, an expected finding or none), plus the
synthetic capture's labelled break queue."""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from detectors import smb_break_queue as bq
from detectors.base import FINDINGS_SCHEMA
from fakes import (T0, FakeCapture, SMB2_FILE as FILE, SMB2_SERVER as SRV, SMB2_SHARE as SHARE,
                   columns_frame as frame, smb2_break as brk, smb2_capture as capture, smb2_tx as tx)
from synthetic import synthetic_detect, synthetic_labels

MS = 1_000_000
S = 1_000_000_000
def queue_case(ack_after, n_waiters=3, spacing=100 * MS):
    """Holder 10.0.1.1 sits ``ack_after`` on a batch oplock break; n CREATEs from other clients wait."""
    t_break = 1 * S
    waiters = []
    for k in range(n_waiters):
        t = t_break - 100_000 + k * spacing
        waiters.append(tx(f"10.0.2.{k + 1}", 40000 + k, k + 1, "CREATE", t, t_break + ack_after + 300_000 + k * 10_000,
                          frame_no=20 + 4 * k, interim=21 + 4 * k, fid=(100 + k, 100 + k)))
    b = brk(t_break, ack=t_break + ack_after, trigger=waiters[0] if waiters else None)
    return [b], waiters


def test_slow_ack_with_queue_fires_and_explains():
    breaks, waiters = queue_case(2 * S)
    f = bq.detect(capture(breaks, waiters), bq.Params())
    assert f.schema == FINDINGS_SCHEMA
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["detector"] == "smb_break_queue" and r["kind"] == "slow_ack"
    assert r["client"] == "10.0.1.1" and r["server"] == SRV and r["resource"] == FILE
    assert r["clients"] == 4 and r["client_identity"] == "address"
    assert r["value"] == pytest.approx(2000.0) and r["threshold"] == pytest.approx(50.0)
    # waits 2.0 + 1.9 + 1.8 s = 5.7 s >= high_wait_s (5 s)
    assert r["severity"] == "high"
    e = r["explanation"]
    assert "client 10.0.1.1 took 2 s to acknowledge the oplock break on" in e and "(batch→level2)" in e
    assert "3 CREATEs from 3 other clients waited behind it (3 with STATUS_PENDING)" in e
    assert "queue depth up to 3" in e and "triggered by 10.0.2.1's CREATE" in e
    assert {10, 60, 61, 20, 21, 24, 28}.issubset(set(r["evidence_frames"]))
    assert r["start_ns"] == T0 + S and r["end_ns"] == T0 + 3 * S


def test_one_waiter_is_medium_and_nobody_waiting_is_low():
    breaks, waiters = queue_case(2 * S, n_waiters=1)
    f = bq.detect(capture(breaks, waiters), bq.Params())
    assert f["severity"].to_list() == ["medium"]
    assert "1 CREATE from 1 other client" in f["explanation"][0]
    breaks, _ = queue_case(2 * S, n_waiters=0)
    f = bq.detect(capture(breaks, []), bq.Params())
    assert f["severity"].to_list() == ["low"] and "no other request waited" in f["explanation"][0]


def test_near_miss_fast_ack_is_silent_and_lowered_floor_fires():
    breaks, waiters = queue_case(40 * MS)  # 40 ms < the 50 ms floor
    cap = capture(breaks, waiters)
    assert bq.detect(cap, bq.Params()).height == 0
    f = bq.detect(cap, bq.Params(min_ack_latency_ns=10 * MS, medium_wait_s=0.03))
    assert f.height == 1 and f["severity"][0] == "medium"   # only the trigger waited (40 ms)
    assert "1 CREATE from 1 other client" in f["explanation"][0]


def test_threshold_is_relative_to_the_path():
    breaks, waiters = queue_case(200 * MS, n_waiters=1)
    # 20 µs path: 200 ms is 10,000 RTTs -> fires
    assert bq.detect(capture(breaks, waiters, rtt_ns=20_000), bq.Params()).height == 1
    # 20 ms path: threshold = 20 x 20 ms = 400 ms -> a 200 ms ack is no pathology there
    f = bq.detect(capture(breaks, waiters, rtt_ns=20 * MS), bq.Params())
    assert f.height == 0


def test_break_from_level2_needs_no_ack_and_is_ignored():
    b = brk(1 * S, old="level2", new="none", ack_required=False)
    assert bq.detect(capture([b], [], end=60 * S), bq.Params()).height == 0


def test_unacknowledged_past_the_break_timeout():
    t_break = 1 * S
    w = tx("10.0.2.1", 40000, 1, "CREATE", t_break - 100_000, None, frame_no=20, interim=21, fid=(100, 100))
    b = brk(t_break, trigger=w)
    f = bq.detect(capture([b], [w], end=40 * S), bq.Params())
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "unacknowledged" and r["severity"] == "high"  # the waiter waited ~39 s
    assert "never acknowledged" in r["explanation"] and "35 s break timeout" in r["explanation"]
    assert r["value"] == pytest.approx(39_000.0)


def test_unacknowledged_when_the_capture_ends_soon_after():
    b = brk(1 * S)
    f = bq.detect(capture([b], [], end=3 * S), bq.Params())
    assert f.height == 1 and f["kind"][0] == "unacknowledged" and f["severity"][0] == "low"
    assert "when the capture ends" in f["explanation"][0]
    # capture ends 20 ms after the notification: nothing to judge
    assert bq.detect(capture([b], [], end=1 * S + 20 * MS), bq.Params()).height == 0


def test_unacknowledged_but_client_direction_not_captured_is_informational():
    t_break = 1 * S
    w = tx("10.0.2.1", 40000, 1, "CREATE", t_break - 100_000, None, frame_no=20, interim=21, fid=(100, 100))
    f = bq.detect(capture([brk(t_break, trigger=w)], [w], end=40 * S, client_packets=0), bq.Params())
    assert f["severity"].to_list() == ["informational"]
    assert "cannot show one" in f["explanation"][0]


def test_close_instead_of_ack_ends_the_break():
    t_break = 1 * S
    close = tx("10.0.1.1", 50001, 0, "CLOSE", t_break + 300 * MS, t_break + 301 * MS, frame_no=40, fid=(7, 7))
    f = bq.detect(capture([brk(t_break)], [close], end=50 * S), bq.Params())
    assert f.height == 1 and f["kind"][0] == "slow_ack" and f["value"][0] == pytest.approx(300.0)
    assert "closed the file instead of acknowledging" in f["explanation"][0]


def test_lease_break_and_waiters_only_on_the_same_path_from_other_opens():
    t_break = 1 * S
    key = "aaaaaaaa-0000-0000-0000-000000000001"
    w1 = tx("10.0.2.1", 40000, 1, "CREATE", t_break - 100_000, t_break + 2 * S + 300_000, frame_no=20, interim=21,
            fid=(100, 100))
    other_path = tx("10.0.2.2", 40001, 2, "CREATE", t_break + 10 * MS, t_break + 2 * S + 400_000, frame_no=24,
                    interim=25, path=SHARE + "\\other.docx", fid=(101, 101))
    answered_early = tx("10.0.2.3", 40002, 3, "READ", t_break + 10 * MS, t_break + 12 * MS, frame_no=28,
                        fid=(102, 102))
    holders_own = tx("10.0.1.1", 50001, 0, "WRITE", t_break + 10 * MS, t_break + 2 * S + 100_000, frame_no=32,
                     fid=(7, 7), lease_key=key)
    b = brk(t_break, ack=t_break + 2 * S, kind="lease", old="RWH", new="RH", lease_key=key, trigger=w1)
    f = bq.detect(capture([b], [w1, other_path, answered_early, holders_own]), bq.Params())
    assert f.height == 1
    r = f.row(0, named=True)
    assert "the lease break on" in r["explanation"] and "(RWH→RH)" in r["explanation"]
    assert "1 CREATE from 1 other client" in r["explanation"] and r["clients"] == 2


def test_many_waiters_make_it_at_least_high():
    breaks, waiters = queue_case(300 * MS, n_waiters=4, spacing=1 * MS)
    f = bq.detect(capture(breaks, waiters), bq.Params())
    assert f["severity"][0] == "medium"   # 4 x ~0.3 s = 1.2 s
    f = bq.detect(capture(breaks, waiters), bq.Params(many_waiters=4))
    assert f["severity"][0] == "high"


def test_storm_on_one_file():
    breaks = [brk(k * 400 * MS, frame_no=10 + 100 * k, ack=k * 400 * MS + 1 * MS, client=f"10.0.1.{1 + k % 3}",
                  fid=(k, k)) for k in range(10)]
    f = bq.detect(capture(breaks, [], end=10 * S), bq.Params())
    assert f["kind"].to_list() == ["storm"]
    r = f.row(0, named=True)
    assert r["value"] == 10 and r["threshold"] == 8 and r["severity"] == "low" and r["clients"] == 3
    assert r["explanation"].startswith("10 oplock breaks on " + FILE)
    # 7 breaks (fewer than storm_min_breaks) or spread wider than the window: no storm
    assert bq.detect(capture(breaks[:7], [], end=10 * S), bq.Params()).height == 0
    wide = [brk(k * 2 * S, frame_no=10 + 100 * k, ack=k * 2 * S + 1 * MS, fid=(k, k)) for k in range(10)]
    assert bq.detect(capture(wide, [], end=30 * S), bq.Params()).height == 0


def test_holders_sharing_an_address_are_told_apart_by_port():
    # two processes on 10.0.1.1 with requests outstanding at the same time from two ports
    t_break = 1 * S
    w = tx("10.0.2.1", 40000, 1, "CREATE", t_break - 100_000, t_break + 2 * S + 300_000, frame_no=20, interim=21,
           fid=(100, 100))
    p1 = tx("10.0.1.1", 50001, 0, "READ", 10 * MS, 30 * MS, frame_no=500, fid=(7, 7))
    p2 = tx("10.0.1.1", 50002, 5, "READ", 15 * MS, 25 * MS, frame_no=502, fid=(8, 8))
    f = bq.detect(capture([brk(t_break, ack=t_break + 2 * S, trigger=w)], [w, p1, p2]), bq.Params())
    assert f["client"].to_list() == ["10.0.1.1:50001"] and f["client_identity"][0] == "address+port"


def test_queue_depth_over_time():
    breaks, waiters = queue_case(2 * S)
    d = bq.queue_depth(capture(breaks, waiters), bq.Params())
    assert d["depth"].max() == 3 and d["depth"][-1] == 0
    assert d["depth"].to_list()[:3] == [1, 2, 3]


def test_transactions_in_many_chunks_queue_as_in_one():
    """A scan in partitions hands smb2_transactions over in a chunk per partition (a mapped frame of many
    record batches): the queue is the same as from the frame in one chunk."""
    cap = capture(*queue_case(2 * S, n_waiters=4))
    whole = bq.detect(cap, bq.Params())
    rows = cap.frame("smb2_transactions")
    cap.set_frame("smb2_transactions", pl.concat([rows.slice(k, 1) for k in range(rows.height)], rechunk=False))
    assert cap.frame("smb2_transactions").n_chunks() > 4
    assert bq.detect(cap, bq.Params()).equals(whole) and whole.height == 1
    assert whole["explanation"][0].count("4 CREATEs from 4 other clients waited") == 1


def test_no_breaks_or_missing_frames_give_an_empty_frame():
    assert bq.detect(FakeCapture(), bq.Params()).height == 0
    cap = capture([], [], end=5 * S)
    assert bq.detect(cap, bq.Params()).schema == FINDINGS_SCHEMA


# -- synthetic capture -------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_synthetic_break_queue_label_is_found(synthetic_capture):
    out = synthetic_capture
    labels = synthetic_labels(out, bq.NAME)
    assert labels
    f = synthetic_detect(out, bq)
    for lab in labels:
        hit = f.filter((pl.col("start_ns") - lab["parameters"]["break_notify_ns"]).abs() < 5 * MS)
        assert hit.height == 1, f.select("start_ns", "resource", "explanation").to_dicts()
        h = hit.row(0, named=True)
        assert h["client"] == lab["parameters"]["holder"] and h["severity"] in ("medium", "high", "critical")
        assert h["resource"].lower() == lab["resource"].lower()
        assert f"{lab['parameters']['waiters']} CREATEs" in h["explanation"]
    assert f.filter(pl.col("severity").is_in(["medium", "high", "critical"])).height == len(labels)


# -- odd input never raises -------------------------------------------------------------------------------

SAMPLES = ROOT / "samples"


def test_nulls_in_any_column_never_raise():
    from analyzer import open_capture

    with open_capture(SAMPLES / "smb2-oplock-lease-break.pcap") as cap:
        frames = {n: cap.frame(n) for n in ("smb2_breaks", "smb2_transactions", "connections")}
        packets = cap.packets.select("frame", "ts_ns")
    for name in ("smb2_breaks", "smb2_transactions"):
        for col in frames[name].columns:
            broken = dict(frames)
            broken[name] = frames[name].with_columns(pl.lit(None, frames[name].schema[col]).alias(col))
            f = bq.detect(FakeCapture(packets=packets, **broken), bq.Params())
            assert f.schema == FINDINGS_SCHEMA, (name, col)
    # and with every row but one gone, or the transactions missing altogether
    f = bq.detect(FakeCapture(packets=packets, smb2_breaks=frames["smb2_breaks"].head(1)), bq.Params())
    assert f.schema == FINDINGS_SCHEMA
