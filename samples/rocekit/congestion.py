"""Congestion scenarios: a PFC storm that spreads, an incast with sustained CE marks and CNPs, and
CNPs the senders ignore; each with its healthy twin (see :mod:`.scenarios` for the conventions)."""
from __future__ import annotations

from dataclasses import replace

from . import wire
from .qp import QPParams
from .scenarios import KIB, MS, US, Built, Site, qp_name, run_built, label, qp_counts


def pause_summary(cap) -> dict:
    """Per port that sent PFC frames: first/last time, frames, XOFF and XON frames."""
    out: dict[str, dict] = {}
    for t, port, mac, prio, quanta in cap.pauses:
        d = out.setdefault(port, {"port": port, "mac": mac, "first_at_ns": t, "last_at_ns": t, "frames": 0,
                                  "xoff": 0, "xon": 0, "priority": prio})
        d["last_at_ns"] = t
        d["frames"] += 1
        d["xoff" if quanta else "xon"] += 1
    return out


def _storm(seed: int, scale: float, storm: bool) -> Built:
    s = Site(seed)
    name = "rocev2-pfc-storm" + ("" if storm else "-healthy")
    b = Built(name, s.fab, duration_ns=int(20 * MS * scale), twin="rocev2-pfc-storm")
    p = QPParams()
    end = int(b.duration_ns * 0.8)
    for a in ("h00", "h01", "h02"):                       # storage clients writing to h10
        qa, qb = s.connect(a, "h10", p)
        s.workload(qa, ("write",), 64 * KIB, 60 * US, 0, end)
        b.qps.append((qa, qb))
    for a, c in (("h03", "h11"), ("h12", "h13")):         # bystanders: across the spine, and inside leaf1
        qa, qb = s.connect(a, c, p)
        s.workload(qa, ("send", "write"), 16 * KIB, 40 * US, 0, end)
        b.qps.append((qa, qb))
    lo, hi = int(b.duration_ns * 0.1), int(b.duration_ns * 0.6)
    if storm:
        s.hosts["h10"].pfc_storm(lo, hi)                  # h10's NIC keeps pausing priority 3 (a stuck receive pipeline)
    run_built(b)
    if storm:
        ps = pause_summary(s.fab.cap)
        order = sorted(ps.values(), key=lambda d: d["first_at_ns"])
        dur = wire.quanta_ns(s.fab.p.pause_quanta, s.fab.p.rate_bps)
        paused_hosts = sorted({s.hosts[d["port"].split("->")[1]].ep.ip for d in order
                               if d["port"].split("->")[1] in s.hosts})
        b.labels.append(label(
            "pfc_storm", order[0]["first_at_ns"], max(d["last_at_ns"] for d in order), paused_hosts,
            s.hosts["h10"].ep.ip, f"priority {wire.PRIO_ROCE}",
            f"h10's NIC pauses priority {wire.PRIO_ROCE} continuously for {(hi - lo) / MS:.0f} ms; the pause spreads "
            f"to {len(order) - 1} more ports in this order: " + ", ".join(d["port"] for d in order),
            origin_port=order[0]["port"], origin_mac=order[0]["mac"], priority=wire.PRIO_ROCE,
            storm_start_at_ns=lo, storm_end_at_ns=hi, pause_quanta=s.fab.p.pause_quanta, pause_ns=dur,
            link_bps=s.fab.p.rate_bps, ports=[{k: v for k, v in d.items()} for d in order],
            victims=[qp_name(qa) for qa, _ in b.qps[3:]]))
    return b


def pfc_storm(seed, scale=1.0):
    return _storm(seed, scale, True)


def pfc_storm_healthy(seed, scale=1.0):
    return _storm(seed, scale, False)


SENDERS = ("h11", "h12", "h13", "h14", "h15", "h16")


def _incast(seed: int, scale: float, fan_in: bool, dcqcn: bool, name: str, twin: str) -> Built:
    s = Site(seed, per_leaf=8)
    b = Built(name, s.fab, duration_ns=int(10 * MS * scale), twin=twin)
    p = replace(QPParams(), dcqcn=dcqcn)
    end = int(b.duration_ns * 0.7)
    for i, a in enumerate(SENDERS):                      # each offers 128 KiB per 40 µs (26 Gb/s): 157 Gb/s in all
        dst = "h10" if fan_in else SENDERS[(i + 1) % len(SENDERS)]
        qa, qb = s.connect(a, dst, p)
        s.workload(qa, ("write",), 128 * KIB, 40 * US, 0, end)
        b.qps.append((qa, qb))
    run_built(b)
    return b


def _ecn_numbers(b: Built) -> dict:
    cap = b.fab.cap
    data = [r for r in cap.truth if r[5] != wire.CNP and r[5] != wire.ACKNOWLEDGE]
    ce = [r for r in data if r[11] == wire.ECN_CE]
    cnps = [r for r in cap.truth if r[5] == wire.CNP]
    return {"data_packets": len(data), "ce_marked": len(ce), "ce_fraction": round(len(ce) / max(1, len(data)), 3),
            "cnps": len(cnps), "first_ce_at_ns": min((r[1] for r in ce), default=0),
            "last_ce_at_ns": max((r[1] for r in ce), default=0), "pfc_frames": len(cap.pauses)}


def incast(seed, scale=1.0):
    b = _incast(seed, scale, True, True, "rocev2-incast", "rocev2-incast")
    n = _ecn_numbers(b)
    rx = b.qps[0][0].peer_host
    b.labels.append(label(
        "ecn_congestion", n["first_ce_at_ns"], n["last_ce_at_ns"], [qa.h.ep.ip for qa, _ in b.qps], rx.ep.ip,
        f"{rx.name} port", f"incast: {len(b.qps)} senders to {rx.name} at 157 Gb/s offered into 100 Gb/s; "
        f"{n['ce_marked']} of {n['data_packets']} data packets CE-marked, {n['cnps']} CNPs; DCQCN senders slow down",
        kind="incast", senders=len(b.qps), sender_rate_min_bps=int(min(min_rate(qa) for qa, _ in b.qps)),
        **n, qps=[qp_counts(qa) | {"qp": qp_name(qa)} for qa, _ in b.qps]))
    return b


def min_rate(qa) -> float:
    return qa.rc_min


def incast_healthy(seed, scale=1.0):
    return _incast(seed, scale, False, True, "rocev2-incast-healthy", "rocev2-incast")


def cnp_ignored(seed, scale=1.0):
    b = _incast(seed, scale, True, False, "rocev2-cnp-ignored", "rocev2-cnp-ignored")
    n = _ecn_numbers(b)
    rx = b.qps[0][0].peer_host
    b.labels.append(label(
        "ecn_congestion", n["first_ce_at_ns"], n["last_ce_at_ns"], [qa.h.ep.ip for qa, _ in b.qps], rx.ep.ip,
        f"{rx.name} port", f"CNPs without slowdown: {len(b.qps)} senders to {rx.name} receive "
        f"{sum(qa.cnps_rx for qa, _ in b.qps)} CNPs and keep their rate (DCQCN off); {n['ce_fraction']:.0%} "
        f"of data packets CE-marked, {n['pfc_frames']} PFC frames",
        kind="cnp_no_slowdown", senders=len(b.qps), sender_rate_min_bps=int(min(min_rate(qa) for qa, _ in b.qps)),
        **n, qps=[qp_counts(qa) | {"qp": qp_name(qa)} for qa, _ in b.qps]))
    return b


def cnp_ignored_healthy(seed, scale=1.0):
    """The twin: the same incast with DCQCN on (the senders slow down; the incast itself remains)."""
    return _incast(seed, scale, True, True, "rocev2-cnp-ignored-healthy", "rocev2-cnp-ignored")
