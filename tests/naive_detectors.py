"""Slow, obvious reference implementations of the detector kernels, for property tests of the fast
(Numba / Polars) versions: tests/test_naive_detectors.py. Covered: herd segments (the Kadane scan
and the rate ladder), retry ladders (backoff class; chains and episodes), SMB2 break queues (how a
break ends, who waits behind it, the queue depth), TCP stalls (retransmission timer, delayed ACK,
zero window).

Written from the detectors' docstrings (detectors/herd.py, herd_search.py, retry_storm.py,
smb_break_queue.py, tcp_stall.py), one Python object at a time, with no vectorisation and no shared
code with the detectors (tests/naive.py does the same for the pcap walkers). Where the fast code
makes a choice the docstring leaves open (how ties are broken), the choice is stated again here.
"""
from __future__ import annotations

import math
import statistics
from fractions import Fraction

S = 1_000_000_000


# -- herd segments (detectors/herd_search.py) -------------------------------------------------------

RESCAN_STEPS_PER_ARRIVAL = 64  # herd_search's work bound on hostile input (steps per arrival)


def kadane_segments(key, t, lam, min_events):
    """Segment number per arrival (-1: none), arrivals sorted by key then time.

    Within a run of equal keys, a scan starts at an arrival with score 1; arrival m of the scan
    first costs lam[m] x (t[m] - t[m-1]) — when that leaves the score at or below 0 the scan ends
    before m — and then adds 1. The segment is the scan's start up to its first highest score
    (kept when it holds ``min_events`` arrivals or more); the next scan starts right after it.
    Once the scans have taken more than RESCAN_STEPS_PER_ARRIVAL steps per arrival (plus one), the
    next scan starts where the last one ran out instead. Scores are exact rationals, computed
    afresh for every candidate end (the fast kernel's floats agree except on exact ties)."""
    n = len(t)
    seg = [-1] * n
    runs, i = [], 0
    while i < n:
        j = i
        while j < n and key[j] == key[i]:
            j += 1
        runs.append((i, j))
        i = j
    nseg, steps, budget = 0, 0, RESCAN_STEPS_PER_ARRIVAL * n + n
    for i, j in runs:
        # exact arithmetic: cost[m] = lam[m] x (t[m] - t[m-1]); spent[m] = the costs up to m in the run
        spent = {i: Fraction(0)}
        for m in range(i + 1, j):
            spent[m] = spent[m - 1] + Fraction(lam[m]) * (int(t[m]) - int(t[m - 1]))

        def score(start, end):  # the score after arrival ``end`` of a scan from ``start``
            return (end - start + 1) - (spent[end] - spent[start])

        k = i
        while k < j:
            # the scan runs over k..last: the first arrival whose cost takes the score to <= 0 ends it
            last = k
            while last + 1 < j and score(k, last + 1) - 1 > 0:
                last += 1
            scores = [score(k, e) for e in range(k, last + 1)]
            peak_end = k + scores.index(max(scores))  # index(): the first highest
            ran_out = last + 1  # the arrival the scan stopped at (or the run's end)
            steps += ran_out - k
            if peak_end - k + 1 >= min_events:
                for x in range(k, peak_end + 1):
                    seg[x] = nseg
                nseg += 1
            k = peak_end + 1 if steps <= budget else ran_out
    return seg


LADDER_STEPS_PER_DOUBLING = 2  # herd_search: rungs sqrt(2) apart (per second)
MAX_LADDER_STEPS = 160


def next_rung(lam_per_ns):
    """The first rung of the fixed ladder (2 ** (i / 2) per second, i integer) above ``lam``.
    (``math.log(x, 2)`` is ln(x) / ln(2), the same computation as Polars' ``log(2)``.)"""
    k = LADDER_STEPS_PER_DOUBLING
    i = math.floor(math.log(lam_per_ns * S, 2) * k) + 1
    return 2.0 ** (i / k) / S


def _scan_groups(rows, lam_of, min_events):
    """kadane_segments over ``rows`` [(group, t, ...)] already sorted by group, then time:
    {row index: segment number}."""
    seg = kadane_segments([r[0] for r in rows], [r[1] for r in rows], [lam_of(r) for r in rows], min_events)
    return {i: s for i, s in enumerate(seg) if s >= 0}


def herd_segments(arrivals, min_clients, max_span_ns, trim_factor):
    """The herds among arrivals [(grp, t, lam, cid, row)]: a list of sets of ``row``.

    Per rung: the segments of each group at its lam (at least min_clients arrivals); each is trimmed
    to its best part: the segments found again inside it at max(lam, its arrivals / trim_factor /
    (its span + 1)), the one with most arrivals (the first on a tie). A trimmed part with min_clients
    distinct clients or more is a herd when it lasts at most max_span_ns; when it lasts longer the
    whole segment, and what the trim cut off every segment, are searched again at the next rung,
    each leftover segment a group of its own. Stop when fewer than min_clients arrivals are left."""
    work = sorted(arrivals, key=lambda a: (a[0], a[1], a[4]))
    herds = []
    for _ in range(MAX_LADDER_STEPS):
        if len(work) < min_clients:
            break
        segs = _scan_groups(work, lambda a: a[2], min_clients)
        if not segs:
            break
        members: dict[int, list] = {}
        for i in sorted(segs):
            members.setdefault(segs[i], []).append(work[i])
        leftover = []
        for s in sorted(members):
            rows = members[s]  # in (grp, t, row) order
            span = rows[-1][1] - rows[0][1]
            lam2 = [max(a[2], len(rows) / trim_factor / (span + 1)) for a in rows]
            sub = kadane_segments([0] * len(rows), [a[1] for a in rows], lam2, min_clients)
            parts: dict[int, list] = {}
            for i, p in enumerate(sub):
                if p >= 0:
                    parts.setdefault(p, []).append(i)
            keep = set()
            if parts:
                best = max(sorted(parts), key=lambda p: len(parts[p]))  # most arrivals, first on a tie
                keep = set(parts[best])
            core = [rows[i] for i in sorted(keep)]
            is_big = len({a[3] for a in core}) >= min_clients
            too_long = is_big and core[-1][1] - core[0][1] > max_span_ns
            if is_big and not too_long:
                herds.append({a[4] for a in core})
            # searched again: the whole of a too-long segment, the trimmed-off rest of the others;
            # each segment is a group of its own, at the next rung of its lam
            again = rows if too_long else [rows[i] for i in range(len(rows)) if i not in keep]
            leftover += [(s, a[1], next_rung(a[2]), a[3], a[4]) for a in again]
        work = sorted(leftover, key=lambda a: (a[0], a[1], a[4]))
    return herds


# -- retry ladders: backoff class (detectors/retry_storm.py) ----------------------------------------

MAX_CLASSIFIED_CHAINS = 2000  # retry_storm: the first chains looked at for the backoff class


def _slope_and_residuals(y):
    """Least-squares line through (0, y0), (1, y1), ...: its slope and the residuals."""
    n = len(y)
    mx = (n - 1) / 2
    my = sum(y) / n
    sxx = sum((x - mx) ** 2 for x in range(n))
    b = sum((x - mx) * (v - my) for x, v in enumerate(y)) / sxx
    return b, [v - (my + b * (x - mx)) for x, v in enumerate(y)]


def classify_backoff(intervals, growth_ratio, fixed_ratio, linear_step, jitter, no_timer):
    """(class, jitter) of retry chains given as lists of inter-send intervals, following
    retry_storm.classify_backoff's docstring:

    chains: the first MAX_CLASSIFIED_CHAINS, their positive intervals, those with >= 2 left
    (none: "unknown", None). growth = exp(median over chains of the slope of log(interval)).
    * growth >= growth_ratio: exponential, unless among the chains of >= 3 intervals the median
      relative residual of a straight line is below 0.8 x the median log residual: linear. Jitter:
      the chosen model's median absolute residual (over all chains) above ``jitter``.
    * 1/fixed_ratio < growth < growth_ratio: linear when the steps (differences over the chain's
      median) have a median >= linear_step and at least 75 % are positive; else the median
      |log(d / median(d))| decides: above no_timer irregular (jittered), else fixed, jittered above
      ``jitter``.
    * growth at most 1/fixed_ratio (shrinking): irregular, jittered."""
    chains = []
    for d in list(intervals)[:MAX_CLASSIFIED_CHAINS]:
        d = [float(x) for x in d if float(x) > 0]
        if len(d) >= 2:
            chains.append(d)
    if not chains:
        return "unknown", None

    def log_res(ch):
        return [abs(r) for d in ch for r in _slope_and_residuals([math.log(x) for x in d])[1]]

    def lin_res(ch):
        out = []
        for d in ch:
            _, res = _slope_and_residuals(d)
            out += [abs(r) / max(x - r, 1e-12) for x, r in zip(d, res)]
        return out

    growth = math.exp(statistics.median(_slope_and_residuals([math.log(x) for x in d])[0] for d in chains))
    if growth >= growth_ratio:
        longer = [d for d in chains if len(d) >= 3]
        if longer and statistics.median(lin_res(longer)) < statistics.median(log_res(longer)) * 0.8:
            return "linear", statistics.median(lin_res(chains)) > jitter
        return "exponential", statistics.median(log_res(chains)) > jitter
    if growth > 1.0 / fixed_ratio:
        steps = []
        for d in chains:
            m = statistics.median(d)
            steps += [(b - a) / m for a, b in zip(d, d[1:])]
        if statistics.median(steps) >= linear_step and sum(s > 0 for s in steps) / len(steps) >= 0.75:
            return "linear", statistics.median(lin_res(chains)) > jitter
        dev = statistics.median(abs(math.log(x / statistics.median(d))) for d in chains for x in d)
        if dev > no_timer:
            return "irregular", True
        return "fixed", dev > jitter
    return "irregular", True


# -- retry ladders: chains and episodes (detectors/retry_storm.py) ----------------------------------

def retry_episodes(sends, max_gap_ns, episode_gap_ns, min_retries):
    """Retry episodes of sends over a datagram transport, each client on one port (so a client is
    its address): sends are dicts with client, server, server_port, operation, resource, ts, frame,
    ok_ts (a good answer's time, or None) and err_ts (an error answer's time, or None).

    A send is a retry of the one before it (same client, server, server port, operation and
    resource; in time order, ties in input order) when it came at most ``max_gap_ns`` later and
    that one had an error answer by then or no answer at all yet. A send that is not a retry starts
    a chain; chains with a retry are *retried*. Retried chains of one server and port form one
    episode while each starts at most ``episode_gap_ns`` after the latest end of the episode's
    earlier chains. Episodes with at least ``min_retries`` retries are returned, in time order, as
    dicts: server, start_ns (the first retry), end_ns (the last send), clients, chains, retries,
    frames (every send of the retried chains, sorted)."""
    groups: dict[tuple, list] = {}
    for i, s in enumerate(sends):
        key = (s["client"], s["server"], s["server_port"], s["operation"], s["resource"])
        groups.setdefault(key, []).append((s["ts"], i, s))
    chains = []
    for key, g in groups.items():
        g.sort(key=lambda x: (x[0], x[1]))
        chain = [g[0][2]]
        for (_, _, prev), (_, _, cur) in zip(g, g[1:]):
            answered_ok = prev["ok_ts"] is not None and prev["ok_ts"] <= cur["ts"]
            answered_err = prev["err_ts"] is not None and prev["err_ts"] <= cur["ts"]
            if cur["ts"] - prev["ts"] <= max_gap_ns and (answered_err or not answered_ok):
                chain.append(cur)
            else:
                chains.append((key, chain))
                chain = [cur]
        chains.append((key, chain))
    retried = [(key, c) for key, c in chains if len(c) > 1]
    by_server: dict[tuple, list] = {}
    for key, c in retried:
        by_server.setdefault((key[1], key[2]), []).append(c)
    episodes = []
    for (server, port), cs in by_server.items():
        cs.sort(key=lambda c: c[0]["ts"])
        current, latest_end = [], None
        for c in cs:
            if current and c[0]["ts"] > latest_end + episode_gap_ns:
                episodes.append((server, current))
                current = []
            current.append(c)
            latest_end = c[-1]["ts"] if len(current) == 1 else max(latest_end, c[-1]["ts"])
        episodes.append((server, current))
    out = []
    for server, cs in episodes:
        retries = sum(len(c) - 1 for c in cs)
        if retries < min_retries:
            continue
        out.append({"server": server, "start_ns": min(c[1]["ts"] for c in cs),
                    "end_ns": max(c[-1]["ts"] for c in cs), "clients": len({c[0]["client"] for c in cs}),
                    "chains": len(cs), "retries": retries, "frames": sorted(s["frame"] for c in cs for s in c)})
    return sorted(out, key=lambda e: (e["start_ns"], e["server"]))


# -- SMB2 break queues (detectors/smb_break_queue.py) -----------------------------------------------

def break_queues(breaks, txs, end_ns, min_waiter_wait_ns, release_window_ns):
    """Per break (in input order) how it ended and who queued behind it, from smb_break_queue's
    docstring, one request at a time. ``breaks``: dicts with server, path, kind ("oplock" | "lease"),
    fid (persistent, volatile), lease_key, ts_ns, ack_ts_ns (None: none), ack_required,
    trigger_frame, trigger_match; ``txs``: dicts with server, path, operation, fid, lease_key,
    request_frame, request_ts_ns, response_ts_ns (None: unanswered), interim_frame; ``end_ns``: the
    capture's last timestamp. Paths compare case-insensitively.

    A break ends at its acknowledgment, or at the first CLOSE (at or after the notification) of the
    broken open — for a lease, of an open with the lease key — when that comes first or there is
    no acknowledgment. Only breaks that need an acknowledgment hold a queue. A request waits behind
    a break when it is on the same server and path, is not itself an OPLOCK_BREAK or CANCEL, is not
    on the broken open (nor the broken lease), waited (to its answer, or to the capture's end) at
    least ``min_waiter_wait_ns``, was sent between the break's start (the notification, or the
    triggering request when that was blocked by the break) and its end (the capture's end when it
    never ended), and was answered within ``release_window_ns`` after the end — or never, when the
    break never ended. A request waits behind one break at most: the one that started last (the
    later break on a tie). The queue depth is the most waiting requests at once (an answer at the
    moment of a new arrival leaves first)."""
    out = []
    for b in breaks:
        key = ("L:" + b["lease_key"]) if b["kind"] == "lease" else "F:%d:%d" % b["fid"]
        closes = sorted((t["request_ts_ns"], t["request_frame"]) for t in txs
                        if t["operation"] == "CLOSE" and t["server"] == b["server"]
                        and key in {"F:%d:%d" % t["fid"], "L:" + t["lease_key"] if t["lease_key"] else None}
                        and t["request_ts_ns"] >= b["ts_ns"])
        close = closes[0][0] if closes else None
        if b["ack_ts_ns"] is not None and (close is None or b["ack_ts_ns"] <= close):
            resolved, by = b["ack_ts_ns"], "ack"
        elif close is not None:
            resolved, by = close, "close"
        else:
            resolved, by = None, None
        starts = [t["request_ts_ns"] for t in txs if t["request_frame"] == b["trigger_frame"]]
        start = b["ts_ns"]
        if b["trigger_match"] == "blocked" and starts:
            start = min(start, min(starts))
        out.append({"key": key, "resolved_ts_ns": resolved, "resolved_by": by, "start": start,
                    "end": resolved if resolved is not None else end_ns, "waits": []})
    for ti, t in enumerate(txs):
        if t["path"] is None or t["operation"] in ("OPLOCK_BREAK", "CANCEL"):
            continue
        wait = (t["response_ts_ns"] if t["response_ts_ns"] is not None else end_ns) - t["request_ts_ns"]
        if wait < min_waiter_wait_ns:
            continue
        behind = None
        for bi, (b, q) in enumerate(zip(breaks, out)):
            if not b["ack_required"] or b["path"] is None or b["server"] != t["server"] \
                    or b["path"].lower() != t["path"].lower():
                continue
            if q["key"] in ("F:%d:%d" % t["fid"], "L:%s" % t["lease_key"]):
                continue
            if not q["start"] <= t["request_ts_ns"] <= q["end"]:
                continue
            if q["resolved_ts_ns"] is None:
                if t["response_ts_ns"] is not None:
                    continue
            elif t["response_ts_ns"] is None or not (
                    q["resolved_ts_ns"] <= t["response_ts_ns"] <= q["resolved_ts_ns"] + release_window_ns):
                continue
            if behind is None or q["start"] >= out[behind]["start"]:
                behind = bi
        if behind is not None:
            out[behind]["waits"].append((t["request_ts_ns"], t["request_ts_ns"] + wait, t))
    result = []
    for q in out:
        depth, best = 0, 0
        for _, delta in sorted([(a, 1) for a, _, _ in q["waits"]] + [(e, -1) for _, e, _ in q["waits"]]):
            depth += delta
            best = max(best, depth)
        w = [e - a for a, e, _ in q["waits"]]
        result.append({"resolved_ts_ns": q["resolved_ts_ns"], "resolved_by": q["resolved_by"], "waiters": len(w),
                       "pending_waiters": sum(x["interim_frame"] is not None for _, _, x in q["waits"]),
                       "total_wait_ns": sum(w), "max_wait_ns": max(w, default=0), "queue_depth": best})
    return result


# -- TCP stalls: the Nagle / delayed-ACK wait (detectors/tcp_stall.py) -----------------------------

def delayed_ack_stall(steps, rtt_ns, mss, delack_min_ns, delack_rtts, resume_rtts, resume_slack_ns,
                      small_segment_margin, delack_min_events, min_lost_ns, res_ns=1.0):
    """The client side's delayed_ack finding, from a scripted conversation (tcp_conversation steps:
    frame k + 1 is step k) in which the server sends pure ACKs that acknowledge everything the
    client sent, and data now and then: None, or (stall_ns, start_ns, end_ns, evidence frames: S, the
    ACK and N of each episode).

    tcp_stall's docstring: the client's data segment S is acknowledged by a pure ACK from the server
    that came at least max(delack_min_ns, delack_rtts x RTT) after it, and the client's very next data
    segment N is small (under the MSS less small_segment_margin) and leaves within resume_rtts x RTT
    + resume_slack_ns of that ACK, with no data from the server in between. Stall = N - S - RTT.
    Reported from delack_min_events such segments, when they lost min_lost_ns (episodes here never
    overlap)."""
    thr = max(float(delack_min_ns), rtt_ns * delack_rtts, res_ns)
    resume = rtt_ns * resume_rtts + resume_slack_ns + res_ns
    pay = [k for k, st in enumerate(steps) if st.get("data")]
    episodes, acked = [], set()
    for k, st in enumerate(steps):
        pure_ack = not st["from_client"] and not st.get("data") and st.get("flags", 0x10) == 0x10
        sent = [i for i in pay if i < k and steps[i]["from_client"]]
        if not pure_ack or not sent or sent[-1] in acked:
            continue
        s = sent[-1]  # the segment this ACK acknowledges first
        acked.add(s)
        if st["t"] - steps[s]["t"] < thr:
            continue
        after = [i for i in pay if i > s]
        if not after or not steps[after[0]]["from_client"]:
            continue  # the server's data came first, or nothing followed
        n = after[0]
        ok = (steps[n]["t"] >= st["t"] and steps[n]["t"] - st["t"] <= resume
              and len(steps[n]["data"]) < mss - small_segment_margin)
        if ok:
            episodes.append((max(0.0, steps[n]["t"] - steps[s]["t"] - rtt_ns), steps[s]["t"], steps[n]["t"],
                             [s + 1, k + 1, n + 1]))
    if len(episodes) < delack_min_events:
        return None
    stall = sum(e[0] for e in episodes)
    if stall < min_lost_ns:
        return None
    frames = sorted({f for e in episodes for f in e[3]})  # each frame once (N of one is S of the next)
    return stall, min(e[1] for e in episodes), max(e[2] for e in episodes), frames


# -- TCP stalls: the zero window (detectors/tcp_stall.py) ---------------------------------------------

def zero_window_stall(steps, rtt_ns, window_min_ns, window_rtts, resume_rtts, resume_slack_ns, min_lost_ns,
                      res_ns=1.0):
    """The server side's zero_window finding from a scripted conversation (frame k + 1 is step k) in
    which the client is the receiver and every window it closes it opens again, and the steps
    marked ``probe`` are the server's zero-window probes: None, or (stall_ns, start_ns, end_ns,
    evidence frames).

    tcp_stall's docstring: the receiver advertised window 0 for at least max(window_min_ns,
    window_rtts x RTT) — from its first zero window to its first segment with an open window — while
    the sender was blocked: it sent zero-window probes meanwhile, or resumed sending within
    resume_rtts x RTT + resume_slack_ns of the reopening. Stall = the time closed; evidence: the
    first zero window, the probes, the reopening and the sender's next data."""
    thr = max(float(window_min_ns), rtt_ns * window_rtts, res_ns)
    resume = rtt_ns * resume_rtts + resume_slack_ns + res_ns
    client = [k for k, st in enumerate(steps) if st["from_client"] and not st.get("flags", 0x10) & 0x07]
    episodes, k = [], 0
    while k < len(client):
        i = client[k]
        if steps[i].get("window", 65535) != 0 or (k and steps[client[k - 1]].get("window", 65535) == 0):
            k += 1
            continue
        opened = next(j for j in client[k:] if steps[j].get("window", 65535) != 0)
        start, end = steps[i]["t"], steps[opened]["t"]
        probes = [j for j, st in enumerate(steps) if st.get("probe") and start <= st["t"] <= end]
        sent = [j for j, st in enumerate(steps)
                if not st["from_client"] and st.get("data") and not st.get("probe") and st["t"] >= end]
        resumed = bool(sent) and steps[sent[0]]["t"] - end <= resume
        if end - start >= thr and (probes or resumed):
            frames = [i + 1] + [j + 1 for j in probes[:10]] + [opened + 1] + ([sent[0] + 1] if sent else [])
            episodes.append((end - start, start, end, frames))
        k += 1
    stall = sum(e[0] for e in episodes)
    if not episodes or stall < min_lost_ns:
        return None
    return stall, min(e[1] for e in episodes), max(e[2] for e in episodes), sorted({f for e in episodes for f in e[3]})


# -- TCP stalls: the retransmission timer (detectors/tcp_stall.py) -----------------------------------

def rto_stall(steps, rtt_ns, rto_min_gap_ns, rto_gap_rtts, rto_max_gap_ns, min_lost_ns, res_ns=1.0):
    """The server side's rto finding from a scripted conversation (frame k + 1 is step k) whose
    server resends lost data on its timer (the steps marked ``retx``; no SYN or FIN resent): None, or
    (stall_ns, start_ns, end_ns, evidence frames).

    tcp_stall's docstring: a retransmission after the sender had been silent (no data, SYN or FIN)
    for at least max(rto_min_gap_ns, rto_gap_rtts x RTT) and at most rto_max_gap_ns; back-to-back
    timeouts (each the sender's next segment after the one before) are one episode, from the first
    transmission of the retransmitted data (or the last segment before the silence, when earlier) to
    its last retransmission; stall = that minus one RTT. Evidence: the original, the last segment
    before the silence, each retransmission and the peer's next segment."""
    thr = max(float(rto_min_gap_ns), rtt_ns * rto_gap_rtts, res_ns)
    sent = [k for k, st in enumerate(steps)
            if not st["from_client"] and (st.get("data") or st.get("flags", 0x10) & 0x03)]  # data, SYN, FIN
    episodes, last_timeout = [], None
    for n, k in enumerate(sent):
        if not steps[k].get("retx") or n == 0:
            continue
        before = sent[n - 1]
        gap = steps[k]["t"] - steps[before]["t"]
        if not thr <= gap <= rto_max_gap_ns:
            continue
        if last_timeout == before:  # back to back: the same episode
            episodes[-1]["retx"].append(k)
        else:
            orig = next(j for j in sent if steps[j].get("data") and not steps[j].get("retx")
                        and steps[j]["seq"] <= steps[k]["seq"]
                        < steps[j]["seq"] + len(steps[j]["data"]))
            episodes.append({"orig": orig, "prev": before, "retx": [k]})
        last_timeout = k
    if not episodes:
        return None
    out = []
    for e in episodes:
        start = min(steps[e["orig"]]["t"], steps[e["prev"]]["t"])
        end = steps[e["retx"][-1]]["t"]
        peer = [j for j, st in enumerate(steps) if st["from_client"] and st["t"] >= end]
        frames = [e["orig"] + 1, e["prev"] + 1] + [j + 1 for j in e["retx"]] + ([peer[0] + 1] if peer else [])
        out.append((max(0.0, end - start - rtt_ns), start, end, frames))
    stall = sum(e[0] for e in out)
    if stall < min_lost_ns:
        return None
    return stall, min(e[1] for e in out), max(e[2] for e in out), sorted({f for e in out for f in e[3]})
