"""tcp_stall's explanations: one sentence with the numbers per finding (see detectors/tcp_stall.py)."""
from __future__ import annotations

from analyzer.tcp.analysis import TH_ACK as _ACK, TH_RST as _RST, TH_SYN as _SYN

from .base import fmt_limited, fmt_ns

# How the first silence of a timer episode names the timer: (shortest ns, longest ns, SYN only, name).
TIMER_NAMES = (
    (0.8e9, 1.3e9, True, "its initial RTO (RFC 6298: 1 s)"),
    (2.5e9, 3.5e9, True, "its initial RTO (RFC 1122: 3 s)"),
    (190e6, 450e6, False, "its retransmission timer (Linux: the 200 ms minimum RTO + SRTT; Windows: 300 ms)"),
)
DOUBLING = (1.6, 2.5)  # each silence this many times the one before (inclusive): "doubled each time"
LISTED_BACKOFF_STEPS = 5  # the later silences of an episode listed at most
# a delayed-ACK wait from this long is Windows' ~200 ms timer (or Linux's maximum), shorter Linux's ~40 ms
DELACK_LONG_TIMER_NS = 120e6


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def _bytes(n) -> str:
    n = float(n or 0)
    if n >= 1 << 20:
        return f"{n / (1 << 20):.3g} MiB"
    if n >= 1024:
        return f"{n / 1024:.3g} KiB"
    return f"{n:.0f} bytes"


def _timer_name(gaps: list[float], syn: bool) -> str:
    """Name the timer from the silences before successive retransmissions of one episode."""
    g1 = gaps[0]
    name = next((label for lo, hi, syn_only, label in TIMER_NAMES if (syn or not syn_only) and lo <= g1 <= hi),
                "its retransmission timer")
    if len(gaps) > 1:
        ratios = [b / a for a, b in zip(gaps, gaps[1:]) if a > 0]
        doubling = ratios and all(DOUBLING[0] <= x <= DOUBLING[1] for x in ratios)
        rest = ", ".join(fmt_ns(g) for g in gaps[1:1 + LISTED_BACKOFF_STEPS])
        name += f", {'doubled each time' if doubling else 'then'} to {rest}"
    return name


def _frame(n) -> str:
    return f"frame {n}" if n is not None else "not captured"


def _syn_answer(r: dict) -> str:
    """What answered the client's SYN before its timer fired, read from the capture."""
    flags, frame = r["ans_flags"], r["ans_frame"]
    if flags is not None and flags & _RST:
        return (f"the server refused it with a RST ({_frame(frame)}) and the client tried again when its "
                f"timer fired")
    if flags is not None and flags & _ACK and not flags & _SYN:
        return (f"the server answered with a bare ACK ({_frame(frame)}), not a SYN/ACK: it still held an older "
                f"connection on this 4-tuple (a challenge ACK, RFC 5961 4), the client reset it and waited out "
                f"its timer before the next SYN")
    if flags is not None and flags & _SYN and flags & _ACK:
        return (f"the server's SYN/ACK ({_frame(frame)}) was captured, yet the client sent its SYN again: the "
                f"SYN/ACK did not reach the client's TCP (lost after the capture point, or dropped by a local "
                f"firewall) and the client waited out its initial timer")
    return ("the SYN went unanswered (lost, filtered, or dropped by a full listen backlog) and the client waited "
            "out its initial timer")


def _synack_answer(r: dict) -> str:
    """Why the server resent its SYN/ACK: what the client sent in between, as captured."""
    flags, frame = r["ans_flags"], r["ans_frame"]
    if flags is not None and flags & _SYN:
        return (f"the SYN/ACK did not reach the client: it sent its SYN again ({_frame(frame)}) before the "
                f"server's timer fired")
    if flags is not None and flags & _RST:
        return f"the client reset the connection ({_frame(frame)}) instead of completing the handshake"
    if flags is not None and flags & _ACK:
        return (f"the client's ACK ({_frame(frame)}) was captured, so the server did not get it: it was lost "
                f"between the capture point and the server, or the server dropped it (Linux drops the "
                f"handshake's last ACK when the listener's accept queue is full, nstat TcpExtListenOverflows, "
                f"and resends the SYN/ACK)")
    return ("no answer from the client was captured before it: the SYN/ACK was lost on its way to the client, "
            "or the client's ACK before the capture point")


def _timer_kinds(r: dict, p, sender: str, peer: str, rtt_txt: str, lost: str, share: str) -> str:
    """rto, synack_retransmission, spurious_retransmission and teardown: retransmission-timer episodes."""
    kind, rtt, n = r["kind"], r["rtt"], r["episodes"]
    gaps = [g for gs in (r["gaps"] or []) for g in (gs or [])]
    g1 = gaps[0] if gaps else 0.0
    syn = kind == "synack_retransmission" or bool(r["syn"])
    timer = _timer_name(gaps or [0.0], syn)
    ratio = (g1 / rtt) if rtt else None
    approx = "~" if rtt_txt[0] in "~<" else ""  # the RTT is within a few ticks: so is the ratio
    head = (f"retry timer {fmt_ns(g1)} is {approx}{_num(ratio)}× the {rtt_txt}: " if ratio else
            f"retry timer {fmt_ns(g1)} on a path of {rtt_txt}: ")
    eps = f"{n} timeout episodes, " if n != 1 else ""
    if kind == "teardown":
        after = (f" after {peer} had sent its own FIN ({_frame(r['peer_fin_frame'])})"
                 if r["peer_fin_frame"] is not None else "")
        return (f"connection teardown, not a stall: {sender} retransmitted its FIN {r['retx_total']} "
                f"time{'s' if r['retx_total'] != 1 else ''}{after}, waiting {lost} in all on {timer} ({rtt_txt}); "
                f"no ACK of that FIN came back in time (the peer, a NAT or a firewall had dropped the "
                f"connection's state, or it was lost); both applications had finished with the connection, "
                f"so no data waited on it (informational).")
    if kind == "spurious_retransmission":
        k = r["dsacked"]
        return (f"{head}{sender} retransmitted data {k} time{'s' if k != 1 else ''} that {peer}'s D-SACK "
                f"(RFC 2883) reports it had already received: spurious retransmissions, not loss (the original "
                f"arrived); {timer} fired before the ACK came back (a delayed or lost ACK, a timer too short "
                f"for the path, or reordering); no data was lost, but the sender resent it and may have cut "
                f"its congestion window.")
    if kind == "synack_retransmission":
        return (f"{head}{sender} waited {lost} ({eps}{share}) on {timer} before retransmitting its SYN/ACK "
                f"(the client's SYN had been answered); {_synack_answer(r)}.")
    backoff = (r["retx_max"] or 1) > 1
    if r["syn"]:
        cause = _syn_answer(r)
    elif r.get("unanswered"):
        last = (f" (its last segment was {_frame(r['peer_last_frame'])})" if r.get("peer_last_frame") is not None
                else " (nothing of its was captured after the data was first sent)")
        cause = (f"{peer} never answered the retransmissions{last}: the peer or the path was gone and the "
                 f"timer recovered nothing (the connection was lost, not slowed)")
    elif backoff:
        cause = ("likely a burst loss or an outage: the sender backed off its timer until the path came "
                 "back and resumed only at the next expiry")
    elif ratio is not None and ratio >= p.rto_mismatch_rtts:
        cause = ("likely an RTO-min mismatch: a lost tail segment waits out a minimum timer sized for "
                 "slower paths (lower the route's rto_min, or rely on TLP/RACK)")
    else:
        cause = "likely loss of the last segments of a flight, recovered only by the timer"
    what = "its SYN" if r["syn"] else "data"
    return (f"{head}{sender} stalled {lost} ({eps}{share}) waiting on {timer} before retransmitting "
            f"{what}; {cause}.")


def explain(r: dict, res: float, p) -> str:
    kind = r["kind"]
    rtt = r["rtt"]
    sender = f"{'client' if r['from_client'] else 'server'} {r['client_ep'] if r['from_client'] else r['server_ep']}"
    peer = f"{'server' if r['from_client'] else 'client'} {r['server_ep'] if r['from_client'] else r['client_ep']}"
    rtt_txt = f"{fmt_limited(rtt, res)} RTT" if rtt is not None else "unmeasured RTT"
    lost = fmt_ns(r["stall_ns"])
    share = f"{r['share']:.0%} of the connection's active life"
    n = r["episodes"]
    if kind == "capture_gap":
        was = (r["was_kind"] or "rto").replace("_", " ")
        return (f"cannot judge: a {lost} {was} stall of {sender} spans a {fmt_ns(r['gap_ns'])} silence of the "
                f"whole capture (no packet from anyone) after which traffic resumed without a retransmission: "
                f"the capture was stopped or files were merged, so that time is the capture's, not TCP's "
                f"(informational).")
    if kind in ("rto", "synack_retransmission", "spurious_retransmission", "teardown"):
        return _timer_kinds(r, p, sender, peer, rtt_txt, lost, share)
    if kind == "delayed_ack":
        wait = r["median_wait"]
        timer = ("a ~200 ms delayed-ACK timer (Windows, or Linux's maximum)" if wait and wait >= DELACK_LONG_TIMER_NS
                 else "a ~40 ms delayed-ACK timer (Linux)")
        return (f"{sender} held a small segment until {peer}'s delayed ACK {n} times (median wait "
                f"{fmt_ns(wait)}, {timer}, on a {rtt_txt}), losing {lost} ({share}): Nagle's algorithm "
                f"meets delayed ACK (write-write-read); send each request in one write or set TCP_NODELAY.")
    if kind == "zero_window":
        never = " and never reopened it" if r["never_reopened"] else ""
        return (f"{peer} advertised a zero receive window {n} time{'s' if n != 1 else ''}{never}, "
                f"blocking {sender} for {lost} in all (longest {fmt_ns(r['max_stall'])}, {share}, "
                f"{r['probes_total']} zero-window probe{'s' if r['probes_total'] != 1 else ''}, {rtt_txt}): "
                f"the receiving application stopped reading (receiver-limited).")
    if kind == "window_full":
        return (f"{sender} filled {peer}'s receive window {n} time{'s' if n != 1 else ''} and waited "
                f"{lost} beyond the {rtt_txt} in all for it to reopen (longest wait {fmt_ns(r['max_wait'])}, "
                f"{share}): receiver-limited, the receiving application reads slowly or its buffer is small.")
    if kind == "slow_start_after_idle":
        return (f"after {n} idle gap{'s' if n != 1 else ''} (about {fmt_ns(r['median_idle'])}, longer than "
                f"its ~{fmt_ns(p.idle_min_ns + (rtt or 0))} retransmission timeout) {sender} restarted from a "
                f"{_bytes(r['min_first'])} first round although it had reached {_bytes(r['max_prev_peak'])} per "
                f"{rtt_txt} round before, losing about {lost} ({share}): slow start after idle "
                f"(Linux net.ipv4.tcp_slow_start_after_idle=1); turn it off for bursty long-lived connections.")
    if kind == "small_initial_window":
        return (f"{n} transfer{'s' if n != 1 else ''} from {sender} finished while still in slow start "
                f"(up to {r['max_rounds']} round trips of {rtt_txt} for {_bytes(r['max_bytes'])}, starting from "
                f"a {_bytes(r['min_first'])} first round; best flight {_bytes(r['best_peak'])} per round), "
                f"costing about {lost} ({share}): the initial window is small for this path's "
                f"bandwidth-delay product; reuse warm connections or raise the initial window.")
    return f"{sender} stalled {lost} ({share})."
