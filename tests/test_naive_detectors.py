"""The detector kernels against their slow references (tests/naive_detectors.py) on generated inputs.

Times and rates are chosen so that every score is exact in binary floating point (integer times,
rates that are multiples of 1/16): the fast and the naive code may add in a different order and
must still agree on ties. Examples are derandomized (tests/conftest.py) and few enough for the
file to run in well under a minute."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import naive_detectors as naive
from builders import handshake, opt_mss, tcp_conversation
from detectors import retry_storm, smb_break_queue, tcp_stall
from detectors.base import SIGNIFICANT_DIGITS
from detectors.herd_search import _kadane_segments, herd_segments
from fakes import SMB2_FILE, SMB2_SHARE, FakeCapture, smb2_break, smb2_capture, smb2_tx, transaction_frame as tx_frame

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same_partition(fast: list[int], slow: list[int]) -> bool:
    """Two segment numberings describe the same segments (numbers may differ, -1 = none)."""
    return [x < 0 for x in fast] == [x < 0 for x in slow] and len(
        {(a, b) for a, b in zip(fast, slow) if a >= 0}) == len({a for a in fast if a >= 0}) == len(
        {b for b in slow if b >= 0})


# -- herd segments ---------------------------------------------------------------------------------

@st.composite
def keyed_arrivals(draw, max_n=64):
    """Arrivals sorted by key then time (at most 64, so the scan's work bound is never reached:
    n x n steps <= 64 x n), with one exact rate per key."""
    n = draw(st.integers(0, max_n))
    keys = sorted(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    gaps = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    rate = {k: draw(st.integers(0, 24)) / 16 for k in set(keys)}
    t, now, prev = [], 0, None
    for k, g in zip(keys, gaps):
        now = now + g if k == prev else draw(st.integers(0, 100))
        t.append(now)
        prev = k
    return keys, t, [rate[k] for k in keys]


@FAST
@given(keyed_arrivals(), st.integers(1, 6))
def test_kadane_segments_match_the_definition(arr, min_events):
    key, t, lam = arr
    fast = _kadane_segments(np.asarray(key, np.int64), np.asarray(t, np.int64), np.asarray(lam, np.float64),
                            min_events).tolist()
    slow = naive.kadane_segments(key, t, lam, min_events)
    assert fast == slow, (key, t, lam, min_events)


def test_kadane_rescans_after_the_peak():
    # a burst, a gap the score survives, a smaller burst, then silence: the second burst did not lift
    # the score above the first peak, so the scan from the first arrival ends at that peak and the
    # second burst is found by the next scan
    t = [0, 1, 2, 3, 10, 11, 12, 100]
    lam = [0.5] * len(t)
    assert naive.kadane_segments([0] * 8, t, lam, 2) == [0, 0, 0, 0, 1, 1, 1, -1]
    assert _kadane_segments(np.zeros(8, np.int64), np.asarray(t, np.int64), np.asarray(lam), 2).tolist() == \
        [0, 0, 0, 0, 1, 1, 1, -1]


class _HerdParams:
    def __init__(self, min_clients, max_span_ns, trim_factor):
        self.min_clients, self.max_span_ns, self.trim_factor = min_clients, max_span_ns, trim_factor


@st.composite
def herd_arrivals(draw):
    """Bursts of a few clients over background, for two keys, with rates on the herd ladder or off it
    (times to the ns: a rung rate times a whole number of seconds would be an exact tie)."""
    rows = []
    for grp in range(draw(st.integers(1, 2))):
        lam = draw(st.sampled_from([2.0 ** (i / 2) / naive.S for i in range(-4, 4)] + [0.3e-9, 1.7e-9, 5e-9]))
        t = draw(st.integers(0, 5)) * naive.S
        for _ in range(draw(st.integers(1, 4))):
            for _ in range(draw(st.integers(0, 12))):  # a burst: ms apart
                t += draw(st.integers(0, 30_000_000))
                rows.append((grp, t, lam, draw(st.integers(0, 9))))
            for _ in range(draw(st.integers(0, 6))):  # background: seconds apart
                t += draw(st.integers(naive.S, 4 * naive.S))
                rows.append((grp, t, lam, draw(st.integers(0, 9))))
    return [(g, t, lam, cid, row) for row, (g, t, lam, cid) in enumerate(rows)]


@settings(FAST, max_examples=100)
@given(herd_arrivals(), st.integers(2, 6), st.sampled_from([50_000_000, 200_000_000, 2 * naive.S]),
       st.sampled_from([2.0, 10.0]))
def test_herd_segments_match_the_ladder(arr, min_clients, max_span_ns, trim_factor):
    df = pl.DataFrame(arr, schema={"grp": pl.Int64, "request_ts_ns": pl.Int64, "lam": pl.Float64, "cid": pl.UInt64,
                                   "_row": pl.UInt32}, orient="row")
    out = herd_segments(df, _HerdParams(min_clients, max_span_ns, trim_factor))
    fast = sorted(sorted(g) for g in out.group_by("seg").agg("_row")["_row"].to_list())
    slow = sorted(sorted(h) for h in naive.herd_segments(arr, min_clients, max_span_ns, trim_factor))
    assert fast == slow, (arr, min_clients, max_span_ns, trim_factor)


# -- retry ladders: backoff class -------------------------------------------------------------------

@st.composite
def retry_chains(draw):
    """Inter-send intervals of a few chains: a fixed, linear or doubling timer with some jitter, or
    arbitrary intervals."""
    shape = draw(st.sampled_from(["fixed", "linear", "exponential", "any"]))
    base = draw(st.integers(1, 2000)) * 1_000_000
    chains = []
    for _ in range(draw(st.integers(0, 5))):
        n = draw(st.integers(0, 6))
        if shape == "any":
            chains.append([draw(st.integers(0, 5000)) * 1_000_000 for _ in range(n)])
            continue
        out = []
        for k in range(n):
            v = {"fixed": base, "linear": base * (k + 1), "exponential": base * 2 ** k}[shape]
            out.append(v * (1 + draw(st.integers(-30, 30)) / 100))
        chains.append(out)
    return chains


@FAST
@given(retry_chains(), st.sampled_from([1.25, 1.5]), st.sampled_from([0.05, 0.1, 0.3]))
def test_classify_backoff_matches_the_rules(chains, growth_ratio, jitter):
    p = retry_storm.Params(growth_ratio=growth_ratio, jitter=jitter)
    fast = retry_storm.classify_backoff([np.asarray(c, dtype=np.float64) for c in chains], p)
    slow = naive.classify_backoff(chains, p.growth_ratio, p.fixed_ratio, p.linear_step, p.jitter, p.no_timer)
    assert fast == slow, chains


@pytest.mark.parametrize("chains, expected", [
    ([[1e9, 1e9, 1e9]] * 3, ("fixed", False)),
    ([[1e9, 2e9, 3e9, 4e9]] * 3, ("linear", False)),  # the 1, 2, 3, 4 s gaps
    ([[1e9, 2e9, 4e9, 8e9]] * 3, ("exponential", False)),
    ([[4e9, 2e9, 1e9]] * 3, ("irregular", True)),
    ([[1e9]], ("unknown", None)),
])
def test_classify_backoff_examples_agree(chains, expected):
    p = retry_storm.Params()
    assert naive.classify_backoff(chains, p.growth_ratio, p.fixed_ratio, p.linear_step, p.jitter, p.no_timer) \
        == expected
    assert retry_storm.classify_backoff([np.asarray(c) for c in chains], p) == expected


# -- retry ladders: chains and episodes -------------------------------------------------------------

SERVERS = ("10.0.0.88", "10.0.0.89")


@st.composite
def retry_sends(draw):
    """Sends of a few clients (one port each) to two servers for two requests, each answered well,
    answered with an error or not answered, at ns times (no exact ties)."""
    sends, frame = [], 1
    t0 = 1_700_000_000 * naive.S
    for c in range(draw(st.integers(1, 4))):
        t = t0 + draw(st.integers(0, 5 * naive.S))
        server, name = draw(st.sampled_from(SERVERS)), draw(st.sampled_from(["cn=a", "cn=b"]))
        for _ in range(draw(st.integers(1, 10))):
            t += draw(st.integers(1, 3 * naive.S))
            if draw(st.integers(0, 5)) == 0:  # now and then another request or server
                server, name = draw(st.sampled_from(SERVERS)), draw(st.sampled_from(["cn=a", "cn=b"]))
            outcome = draw(st.sampled_from(["ok", "error", "none", "none"]))
            lat = draw(st.integers(1_000, 2 * naive.S))
            sends.append({"client": f"10.1.0.{c}", "port": 40000 + c, "server": server, "name": name, "t": t,
                          "frame": frame, "answered": outcome != "none", "lat": lat, "is_error": outcome == "error",
                          "status": {"ok": "success", "error": "busy"}.get(outcome)})
            frame += 2
    return sends


def _significant(x: float) -> float:
    """As a finding carries a float (detectors.base.SIGNIFICANT_DIGITS)."""
    return pl.Series([x]).round_sig_figs(SIGNIFICANT_DIGITS)[0]


@settings(FAST, max_examples=60)
@given(retry_sends(), st.sampled_from([1 * naive.S, 10 * naive.S]), st.sampled_from([1 * naive.S, 10 * naive.S]),
       st.integers(1, 4))
def test_retry_episodes_match_the_chains(rows, max_gap_ns, episode_gap_ns, min_retries):
    frame = tx_frame(rows, "ldap", op="searchRequest", server_port=389)
    p = retry_storm.Params(max_gap_ns=max_gap_ns, episode_gap_ns=episode_gap_ns, min_retries=min_retries)
    f = retry_storm.detect(FakeCapture(ldap_transactions=frame), p)
    fast = sorted(({"server": r["server"], "start_ns": r["start_ns"], "end_ns": r["end_ns"], "clients": r["clients"],
                    "value": r["value"], "frames": sorted(r["evidence_frames"])} for r in f.iter_rows(named=True)),
                  key=lambda e: (e["start_ns"], e["server"]))
    sends = [{"client": r["client"], "server": r["server"], "server_port": 389, "operation": "searchRequest",
              "resource": r["name"], "ts": r["t"], "frame": r["frame"],
              "ok_ts": r["t"] + r["lat"] if r["answered"] and not r["is_error"] else None,
              "err_ts": r["t"] + r["lat"] if r["answered"] and r["is_error"] else None} for r in rows]
    slow = [{"server": e["server"], "start_ns": e["start_ns"], "end_ns": e["end_ns"], "clients": e["clients"],
             "value": _significant(e["retries"] / e["chains"]), "frames": e["frames"]}
            for e in naive.retry_episodes(sends, max_gap_ns, episode_gap_ns, min_retries)]
    assert fast == slow, rows


# -- SMB2 break queues --------------------------------------------------------------------------------

SMB_PATHS = (SMB2_FILE, SMB2_FILE.replace("report", "REPORT"), SMB2_SHARE + "\\other.doc")


@st.composite
def break_scenes(draw):
    """A few breaks (oplock or lease, acknowledged or not, triggered by a request or not) and the
    requests around them: CREATEs of other clients on the same or another path (now and then on the
    broken open itself), CREATEs sent during a break and answered about when it ends, the holder's
    CLOSEs."""
    ms = 1_000_000
    txs = []
    for k in range(draw(st.integers(0, 8))):
        t = draw(st.integers(0, 6000)) * ms + draw(st.integers(0, 999))
        answered = draw(st.integers(0, 4)) > 0
        fid = draw(st.sampled_from([(100 + k, 100 + k), (7, 7)]))
        txs.append(smb2_tx(f"10.0.2.{k % 3 + 1}", 40000 + k % 3, k % 3 + 1, "CREATE", t,
                           t + draw(st.integers(0, 4000)) * ms if answered else None, frame_no=2000 + 4 * k,
                           interim=2001 + 4 * k if draw(st.booleans()) else None, path=draw(st.sampled_from(SMB_PATHS)),
                           fid=fid, lease_key=draw(st.sampled_from([None, None, "k0"]))))
    breaks = []
    for i in range(draw(st.integers(1, 3))):
        t = draw(st.integers(0, 5000)) * ms
        kind = draw(st.sampled_from(["oplock", "lease"]))
        ack = t + draw(st.integers(0, 3000)) * ms if draw(st.booleans()) else None
        trigger = draw(st.sampled_from(txs)) if txs and draw(st.booleans()) else None
        breaks.append(smb2_break(t, frame_no=10 + 100 * i, ack=ack, kind=kind, fid=(7 + i, 7 + i) if i else (7, 7),
                                 lease_key=f"k{i}" if kind == "lease" else None, trigger=trigger,
                                 ack_required=draw(st.integers(0, 3)) > 0, path=draw(st.sampled_from(SMB_PATHS))))
        for w in range(draw(st.integers(0, 3))):  # requests sent during the break, answered about when it ends
            t_req = t + draw(st.integers(-100, 3000)) * ms
            t_resp = (ack if ack is not None else t_req) + draw(st.integers(0, 1500)) * ms
            txs.append(smb2_tx(f"10.0.3.{w + 1}", 41000 + w, 10 + w, "CREATE", t_req,
                               t_resp if draw(st.integers(0, 3)) else None, frame_no=3000 + 100 * i + 4 * w,
                               interim=3001 + 100 * i + 4 * w if draw(st.booleans()) else None, fid=(200 + w, 1),
                               path=breaks[-1]["path"] if draw(st.integers(0, 3)) else draw(st.sampled_from(SMB_PATHS))))
        if draw(st.booleans()):  # the holder closes the broken open (or an open with the lease key)
            t_close = draw(st.integers(0, 6000)) * ms
            txs.append(smb2_tx("10.0.1.1", 50001, 0, "CLOSE", t_close, t_close + 100_000, frame_no=5000 + 2 * i,
                               fid=(7 + i, 7 + i) if i else (7, 7), lease_key=f"k{i}" if kind == "lease" else None))
    return breaks, txs


@settings(FAST, max_examples=100)
@given(break_scenes(), st.sampled_from([10_000_000, 300_000_000]), st.sampled_from([200_000_000, 1_000_000_000]))
def test_break_queues_match_the_rules(scene, min_wait, release):
    breaks, txs = scene
    cap = smb2_capture(breaks, txs)
    p = smb_break_queue.Params(min_waiter_wait_ns=min_wait, release_window_ns=release)
    fast = smb_break_queue.break_table(cap, p).sort("bid").select(
        "resolved_ts_ns", "resolved_by", "waiters", "pending_waiters", "total_wait_ns", "max_wait_ns",
        "queue_depth").to_dicts()
    tx_rows = [dict(r, fid=(r["fid_persistent"], r["fid_volatile"]))
               for r in cap.frame("smb2_transactions").to_dicts()]
    b_rows = [dict(r, fid=(r["fid_persistent"], r["fid_volatile"]) if r["kind"] == "oplock" else None,
                   ack_required=bool(r["ack_required"])) for r in cap.frame("smb2_breaks").to_dicts()]
    slow = naive.break_queues(b_rows, tx_rows, cap.packets["ts_ns"].max(), min_wait, release)
    assert fast == slow, scene


# -- TCP stalls: delayed ACK ---------------------------------------------------------------------------

@st.composite
def nagle_conversations(draw):
    """A handshake (RTT 200 µs or 2 ms, MSS 1460), then rounds of: the client sends a segment (small
    or full), the server answers with a pure ACK (soon or on a delayed-ACK timer) or with data, and
    the client sends its next segment at once or later. No ACK comes sooner than half the handshake
    RTT after what it acknowledges, so the path RTT is the handshake's."""
    rtt = draw(st.sampled_from([200_000, 2_000_000]))
    steps = handshake(0, rtt=rtt, client_opts=opt_mss(1460), server_opts=opt_mss(1460))
    t = rtt + 100_000
    for _ in range(draw(st.integers(2, 9))):
        size = draw(st.sampled_from([100, 600, 1460]))
        steps.append({"t": t, "from_client": True, "flags": 0x18, "data": b"x" * size})
        # the server's answer: at once or on a delayed-ACK timer (Linux ~40 ms, Windows ~200 ms), give or take
        t += draw(st.sampled_from([rtt // 2, 5_000_000, 40_000_000, 200_000_000])) + draw(st.integers(0, 999_999))
        if draw(st.integers(0, 4)):
            steps.append({"t": t, "from_client": False, "flags": 0x10})
        else:  # the client's next segment acknowledges it, half an RTT later at least (the RTT stays the handshake's)
            steps.append({"t": t, "from_client": False, "flags": 0x18, "data": b"y" * 100})
            t += rtt // 2
        # mostly at once (a held segment), now and then later
        t += draw(st.one_of(st.integers(0, 1_500_000), st.integers(0, 1_500_000), st.integers(0, 100_000_000)))
    steps.append({"t": t, "from_client": True, "flags": 0x18, "data": b"x" * 100})
    return rtt, steps


@settings(FAST, max_examples=30)  # a pcap and a whole detect() per example
@given(nagle_conversations(), st.sampled_from([2, 3]))
def test_delayed_ack_stall_matches_the_rule(conv, min_events):
    from analyzer import open_capture

    rtt, steps = conv
    p = tcp_stall.Params(delack_min_events=min_events)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "nagle.pcap"
        path.write_bytes(tcp_conversation(steps))
        with open_capture(path) as cap:
            f = tcp_stall.detect(cap, p).filter(pl.col("kind") == "delayed_ack")
    fast = [(r["value"], r["start_ns"], r["end_ns"], sorted(r["evidence_frames"])) for r in f.iter_rows(named=True)]
    slow = naive.delayed_ack_stall(steps, rtt, 1460, p.delack_min_ns, p.delack_rtts, p.resume_rtts, p.resume_slack_ns,
                                   p.small_segment_margin, p.delack_min_events, p.min_lost_ns)
    slow = [] if slow is None else [(pytest.approx(slow[0] / 1e6), slow[1], slow[2], slow[3])]
    assert fast == slow, steps


# -- TCP stalls: zero window ---------------------------------------------------------------------------

@st.composite
def zero_window_conversations(draw):
    """A request (RTT 1 ms), then rounds of: the server sends two segments, the client closes its
    window for a while (with a zero-window probe of the server's, or not) and opens it again, and
    the server resumes at once or much later."""
    rtt, ms = 1_000_000, 1_000_000
    steps = handshake(0, rtt=rtt) + [{"t": 2 * ms, "from_client": True, "flags": 0x18, "data": b"q" * 10}]
    t, seq = 3 * ms, 1
    for _ in range(draw(st.integers(1, 3))):
        steps += [{"t": t, "from_client": False, "flags": 0x18, "data": b"r" * 1000, "seq": seq},
                  {"t": t + 10_000, "from_client": False, "flags": 0x18, "data": b"r" * 1000, "seq": seq + 1000}]
        seq += 2000
        t0 = t + 10_000 + rtt
        steps.append({"t": t0, "from_client": True, "flags": 0x10, "window": 0})
        closed = draw(st.sampled_from([2 * ms, 8 * ms, 30 * ms, 500 * ms])) + draw(st.integers(0, 999_999))
        if draw(st.booleans()):
            steps += [{"t": t0 + closed // 3, "from_client": False, "flags": 0x18, "data": b"r", "seq": seq,
                       "probe": True},
                      {"t": t0 + closed // 3 + rtt, "from_client": True, "flags": 0x10, "window": 0, "ack": seq}]
        steps.append({"t": t0 + closed, "from_client": True, "flags": 0x10, "window": 65535, "ack": seq})
        t = t0 + closed + draw(st.sampled_from([200_000, 2_000_000, 1_000_000_000])) + draw(st.integers(0, 99_999))
    steps += [{"t": t, "from_client": False, "flags": 0x18, "data": b"r" * 500, "seq": seq},
              {"t": t + rtt, "from_client": True, "flags": 0x10}]
    return rtt, steps


@settings(FAST, max_examples=30)  # a pcap and a whole detect() per example
@given(zero_window_conversations())
def test_zero_window_stall_matches_the_rule(conv):
    from analyzer import open_capture

    rtt, steps = conv
    p = tcp_stall.Params()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "zw.pcap"
        path.write_bytes(tcp_conversation([{k: v for k, v in s.items() if k != "probe"} for s in steps]))
        with open_capture(path) as cap:
            f = tcp_stall.detect(cap, p).filter(pl.col("kind") == "zero_window")
    fast = [(r["value"], r["start_ns"], r["end_ns"], sorted(r["evidence_frames"])) for r in f.iter_rows(named=True)]
    slow = naive.zero_window_stall(steps, rtt, p.window_min_ns, p.window_rtts, p.resume_rtts, p.resume_slack_ns,
                                   p.min_lost_ns)
    slow = [] if slow is None else [(pytest.approx(slow[0] / 1e6), slow[1], slow[2], slow[3])]
    assert fast == slow, steps


# -- TCP stalls: retransmission timer ------------------------------------------------------------------

@st.composite
def rto_conversations(draw):
    """Rounds of a request and a response (RTT 50 µs or 2 ms) whose last segment is lost after the
    capture point and resent on the server's timer, once or backing off, after a short or a long
    silence."""
    rtt = draw(st.sampled_from([50_000, 2_000_000]))
    steps = handshake(0, rtt=rtt)
    t, seq = rtt + 50_000, 1
    for _ in range(draw(st.integers(1, 3))):
        steps.append({"t": t, "from_client": True, "flags": 0x18, "data": b"q" * 10})
        t1 = t + rtt
        n = draw(st.integers(1, 3))
        for j in range(n):
            steps.append({"t": t1 + 10_000 * j, "from_client": False, "flags": 0x18, "data": b"r" * 1000,
                          "seq": seq + 1000 * j})
        lost = seq + 1000 * n
        steps.append({"t": t1 + 10_000 * n, "from_client": False, "flags": 0x18, "data": b"r" * 500, "seq": lost})
        steps.append({"t": t1 + 10_000 * (n - 1) + rtt, "from_client": True, "flags": 0x10, "ack": lost})
        tr = t1 + 10_000 * n
        for _ in range(draw(st.integers(1, 3))):
            tr += draw(st.sampled_from([5_000_000, 200_000_000, 400_000_000])) + draw(st.integers(0, 999_999))
            steps.append({"t": tr, "from_client": False, "flags": 0x18, "data": b"r" * 500, "seq": lost,
                          "retx": True})
        seq = lost + 500
        steps.append({"t": tr + rtt, "from_client": True, "flags": 0x10, "ack": seq})
        t = tr + 2 * rtt + draw(st.integers(0, 50_000_000))
    return rtt, steps


@settings(FAST, max_examples=30)  # a pcap and a whole detect() per example
@given(rto_conversations())
def test_rto_stall_matches_the_rule(conv):
    from analyzer import open_capture

    rtt, steps = conv
    p = tcp_stall.Params()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rto.pcap"
        path.write_bytes(tcp_conversation([{k: v for k, v in s.items() if k != "retx"} for s in steps]))
        with open_capture(path) as cap:
            f = tcp_stall.detect(cap, p).filter(pl.col("kind") == "rto")
    fast = [(r["value"], r["start_ns"], r["end_ns"], sorted(r["evidence_frames"])) for r in f.iter_rows(named=True)]
    slow = naive.rto_stall(steps, rtt, p.rto_min_gap_ns, p.rto_gap_rtts, p.rto_max_gap_ns, p.min_lost_ns)
    slow = [] if slow is None else [(pytest.approx(slow[0] / 1e6), slow[1], slow[2], slow[3])]
    assert fast == slow, steps
