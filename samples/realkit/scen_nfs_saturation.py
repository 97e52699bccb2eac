"""NFSv4.1 server saturation on nfs-ganesha: a ramp of sessions until the server's capacity, slot tables full.

The server: nfs-ganesha 4.3 (FSAL VFS) granting each session ``SLOT_TABLE_SIZE`` slots (NFSv4 {
Slot_Table_Size }, ganesha-core-config(8): "Size of the NFSv4.1 slot table", default 64; a client asking
for more in CREATE_SESSION gets this many, RFC 8881 §18.36), and whose capacity is its CPU allowance: the
ganesha process is put in a cpu cgroup of its own with ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` =
``QUOTA_US`` / ``PERIOD_US`` (4% of one CPU: a container CPU limit of "40m", the way Ganesha runs in a
Kubernetes pod). Why not Ganesha's own thread limits: 4.3 has no worker pool setting any more
(``Nb_Worker``, ``Dispatch_Max_Reqs_Xprt`` are gone from ganesha-core-config(8)); ``RPC_Ioq_ThrdMax``
bounds ntirpc's work pool (src/svc.c: thrd_max, at least 2 + the channel count), but VFS requests never
block here (an fsync on this disk takes 0.2 ms), so threads are never what runs out: each request costs
the server 50-90 us of CPU (50 us unthrottled), which is what runs out. The quota makes that capacity
~450-550 requests a second (it varies by ~20% with how many requests one wake-up handles and with what
else runs on the machine), far below what our clients can send, so the knee is the server's, not the
client machine's (two shared cores): the clients' own CPU use per step is recorded
(``step_client_cpu_share``, at most ~15% of one CPU), and the cgroup's throttled periods
(``step_server_throttled``) show the server using all of its allowance from the knee on.
A side effect seen on the wire: while ganesha is throttled its replies (and the ACKs it would piggyback
on them) wait, so the clients' tail-loss probes fire and tcp_stall reports spurious retransmissions at
low severity.

The clients (samples/realkit/nfs_session.py): each one TCP connection from its own address, one
NFSv4.1 client id (EXCHANGE_ID) and one session (CREATE_SESSION asking for ``ASKED_SLOTS`` slots,
granted ``SLOT_TABLE_SIZE``), RECLAIM_COMPLETE, then one worker per granted slot, each sending
SEQUENCE, PUTFH, GETATTR (a stat() of one file) on a fixed schedule: ``RATE_PER_SESSION`` requests a
second per session, spread over its workers; a worker whose previous answer came late sends the next at
once (no catch-up burst). Sessions join in steps of ``STEPS`` sessions, ``STEP_S`` each.

- pathological: ``RATE_PER_SESSION`` = 60/s, so the offered load reaches the server's capacity at the
  fourth step (8 sessions, 480/s): completions/s plateau, every session's slots stay busy (the further
  requests wait in the clients, behind the slot table: they are late, not on the wire), and the wire
  latency grows with the requests outstanding at the server (sessions x slots).
- healthy twin: the same server, sessions, ramp and requests at ``TWIN_RATE_PER_SESSION`` = 12/s: the
  top step offers ~40% of the capacity; completions follow the offered load, latency stays flat,
  slots are rarely all busy.

Ground truth from the clients' logs per step: sessions, requests intended / sent / completed,
completions/s, latency median / p90 (call sent to reply read, ms), the most slots one session had in
use, the share of slot-time busy and (median session) the share of the step with all its slots busy,
the clients' CPU share, and from the server's cgroup its throttled periods. The knee
(``knee_sessions``) is the first step at which the server was throttled in at least half of the
periods: at its capacity from there on.

Topology: [srv] s0 10.77.0.59 (ganesha.nfsd, NFSv4.1 only) ====veth==== lan0 [lan] clients 10.77.6.x.
Captured on s0, snaplen ``SNAPLEN`` (headers, the RPC header, SEQUENCE and the first ops).
"""
from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

from .core import ALL_DETECTORS, Lab, first_packet_time, join_all, log, start_threads
from .eval_common import capture
from .nfs_server import PSEUDO_ROOT, ganesha_version, start_ganesha, stop_ganesha
from .nfs_session import Nfs41Session

NAME = "saturation"
OTHERS = [d for d in ALL_DETECTORS if d != NAME]
SERVER = "10.77.0.59"
FILE = "data/status.json"
FILES = {FILE: b'{"ok": true}\n' * 64}
STEPS = (1, 2, 4, 8, 12, 16)          # sessions active in each step
STEP_S = 2.0
RATE_PER_SESSION = 60.0               # requests/s each session offers (pathological)
TWIN_RATE_PER_SESSION = 12.0          # healthy twin
ASKED_SLOTS = 16                      # CREATE_SESSION ca_maxrequests
SLOT_TABLE_SIZE = 4                   # NFSv4 { Slot_Table_Size }: what the server grants
PERIOD_US = 50_000                    # the server's CPU allowance: QUOTA_US of every PERIOD_US
QUOTA_US = 2_000
SNAPLEN = 256
CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")


def client_addr(i: int) -> str:
    return f"10.77.6.{i + 1}"


class CpuLimit:
    """A cpu cgroup (v1) of our own holding the server process: QUOTA_US of CPU per PERIOD_US."""

    def __init__(self, name: str, quota_us: int, period_us: int):
        self.path = CGROUP_ROOT / name
        self.path.mkdir(exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text(str(period_us))
        (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))    # v1: moves every thread of the process

    def stat(self) -> dict:
        out = {}
        for line in (self.path / "cpu.stat").read_text().splitlines():
            k, v = line.split()
            out[k] = int(v)
        return out

    def remove(self) -> None:
        """Move what is left back to the root group, then remove ours."""
        try:
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (CGROUP_ROOT / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            self.path.rmdir()
        except OSError as e:
            log(f"could not remove {self.path}: {e}")


def run_ramp(lab: Lab, out: Path, fname: str, healthy: bool, steps=STEPS, step_s: float = STEP_S,
             rate: float | None = None) -> dict:
    rate = rate if rate is not None else (TWIN_RATE_PER_SESSION if healthy else RATE_PER_SESSION)
    n = max(steps)
    srv, lan = lab.netns("srv"), lab.netns("lan")
    lab.veth(srv, "s0", lan, "lan0")
    srv.ip("addr", "add", f"{SERVER}/16", "dev", "s0")
    for i in range(n):
        lan.ip("addr", "add", f"{client_addr(i)}/16", "dev", "lan0")
    g = start_ganesha(lab, srv, SERVER, FILES, minor_versions=(1,), v4_extra={"Slot_Table_Size": str(SLOT_TABLE_SIZE)})
    limit = CpuLimit(f"nslot-ganesha-{os.getpid()}", QUOTA_US, PERIOD_US)
    sessions: list[Nfs41Session] = []
    try:
        limit.add(g.proc.pid)
        cap = capture(lab, srv, "s0", out / fname, snaplen=SNAPLEN)
        with lan:
            for i in range(n):
                s = Nfs41Session(SERVER, client_addr(i), f"c{i + 1}", slots=ASKED_SLOTS)
                s.setup()
                sessions.append(s)
        fh = sessions[0].lookup(f"{PSEUDO_ROOT}/{FILE}")
        granted = sessions[0].slots.granted
        t_base = time.time() + 0.5
        t_end = t_base + len(steps) * step_s
        samples: list[tuple[float, float, dict]] = []     # (t, client cpu s, server cgroup stat)

        def monitor():
            while True:
                u = resource.getrusage(resource.RUSAGE_SELF)
                samples.append((time.time(), u.ru_utime + u.ru_stime, limit.stat()))
                if time.time() > t_end + 0.5:
                    return
                time.sleep(0.25)
        mon = threading.Thread(target=monitor, daemon=True)
        mon.start()
        intended: list[tuple[int, float]] = []        # (step, t) a request was due
        lock = threading.Lock()

        def worker(j: int):
            i, w = divmod(j, granted)
            s = sessions[i]
            first = next(k for k, m in enumerate(steps) if m > i)
            interval = granted / rate
            t_next = t_base + first * step_s + (w + i / n) * interval / granted
            mine = []
            while True:
                now = time.time()
                if now < t_next:
                    time.sleep(t_next - now)
                if t_next >= t_end:
                    break
                mine.append((min(int((t_next - t_base) // step_s), len(steps) - 1), t_next))
                try:
                    s.getattr(fh)
                except (OSError, ConnectionError, RuntimeError) as e:   # a failure is a logged outcome
                    log(f"{s.name}: {e}")
                    break
                t_next = max(t_next + interval, time.time())
            with lock:
                intended.extend(mine)

        join_all(start_threads(worker, n * granted), len(steps) * step_s + 60)
        mon.join(5)
        time.sleep(0.3)
        for s in sessions:
            s.destroy()
        stats = cap.stop()
    finally:
        for s in sessions:
            s.close()
        stop_ganesha(lab, g)
        limit.remove()
    rows = sorted((r for s in sessions for r in s.log if r["slot"] >= 0 and t_base <= r["t_send"] < t_end),
                  key=lambda r: r["t_send"])
    return dict(rows=rows, intended=intended, samples=samples, t_first=first_packet_time(out / fname), stats=stats,
                fname=fname, t_base=t_base, steps=list(steps), step_s=step_s, rate=rate, granted=granted,
                sessions=[dict(client=s.src_addr, granted=s.slots.granted, max_in_use=s.slots.max_in_use)
                          for s in sessions])


def _busy_share(rows: list[dict], a: float, b: float, sessions: int, granted: int) -> float:
    """Share of the slot-time of the active sessions' slots that had a request outstanding in [a, b)."""
    busy = sum(max(0.0, min(r["t_reply"], b) - max(r["t_send"], a)) for r in rows)
    return busy / ((b - a) * sessions * granted) if sessions else 0.0


def _all_busy_share(rows: list[dict], a: float, b: float, granted: int) -> float:
    """The median over the sessions with requests in [a, b) of the share of [a, b) during which all GRANTED
    slots of the session had a request outstanding."""
    shares = []
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r["client"], []).append(r)
    for rs in by.values():
        ev = sorted([(max(r["t_send"], a), 1) for r in rs] + [(min(r["t_reply"], b), -1) for r in rs])
        cur, last, full = 0, a, 0.0
        for t, d in ev:
            if cur >= granted:
                full += t - last
            cur, last = cur + d, t
        shares.append(full / (b - a))
    shares.sort()
    return shares[len(shares) // 2] if shares else 0.0


def _max_slots_one_session(rows: list[dict]) -> int:
    """The most requests one session had outstanding at once (from the send / reply times)."""
    best = 0
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r["client"], []).append(r)
    for rs in by.values():
        ev = sorted([(r["t_send"], 1) for r in rs] + [(r["t_reply"], -1) for r in rs], key=lambda e: (e[0], e[1]))
        cur = 0
        for _, d in ev:
            cur += d
            best = max(best, cur)
    return best


def per_step(r: dict) -> list[dict]:
    out = []
    for k, m in enumerate(r["steps"]):
        a = r["t_base"] + k * r["step_s"]
        b = a + r["step_s"]
        sent = [x for x in r["rows"] if a <= x["t_send"] < b]
        done = [x for x in r["rows"] if a <= x["t_reply"] < b and x["status"] == 0]
        lat = sorted((x["t_reply"] - x["t_send"]) * 1000 for x in sent)
        q = (lambda f: round(lat[min(len(lat) - 1, int(f * len(lat)))], 2) if lat else -1)
        sm = [s for s in r["samples"] if a <= s[0] < b]
        cpu = round((sm[-1][1] - sm[0][1]) / (sm[-1][0] - sm[0][0]), 3) if len(sm) > 1 else -1
        thr = sm[-1][2].get("nr_throttled", 0) - sm[0][2].get("nr_throttled", 0) if len(sm) > 1 else -1
        per = sm[-1][2].get("nr_periods", 0) - sm[0][2].get("nr_periods", 0) if len(sm) > 1 else -1
        out.append(dict(step=k, sessions=m, start_s=round(a - r["t_first"], 3),
                        sent=len(sent), completed=len(done),
                        offered_per_s=round(len(sent) / r["step_s"], 1),
                        intended_per_s=round(m * r["rate"], 1),
                        completions_per_s=round(len(done) / r["step_s"], 1),
                        latency_median_ms=q(0.5), latency_p90_ms=q(0.9),
                        max_slots_one_session=_max_slots_one_session(sent),
                        slot_busy_share=round(_busy_share(sent, a, b, m, r["granted"]), 3),
                        slots_all_busy_share=round(_all_busy_share(sent, a, b, r["granted"]), 3),
                        client_cpu_share=cpu, server_throttled=thr, server_periods=per))
    return out


def measured_of(r: dict) -> dict:
    st = per_step(r)
    top = max(x["completions_per_s"] for x in st)
    # the knee: the first step at which the server used up its CPU allowance in most periods (the cgroup's
    # nr_throttled): it is at its capacity from there on (completions/s are too ragged under a CPU quota
    # for "the first step at 80% of the top" to find it); a ramp that never got there: the last step
    at_cap = [x for x in st if x["server_periods"] > 0 and x["server_throttled"] >= 0.5 * x["server_periods"]]
    knee = at_cap[0] if at_cap else st[-1]
    per = {f"step_{k}": [x[k] for x in st]
           for k in ("sessions", "start_s", "intended_per_s", "offered_per_s", "completions_per_s",
                     "latency_median_ms", "latency_p90_ms", "max_slots_one_session", "slot_busy_share",
                     "slots_all_busy_share",
                     "client_cpu_share", "server_throttled", "server_periods")}
    past = sorted(x["slots_all_busy_share"] for x in st[knee["step"]:])   # -1 knee: never at capacity
    return dict(requests=len(r["rows"]), failed=sum(1 for x in r["rows"] if x["status"] != 0),
                slots_asked=ASKED_SLOTS, slots_granted=r["granted"], **per, peak_completions_per_s=top,
                knee_sessions=knee["sessions"] if at_cap else -1, slots_all_busy_share_from_knee=past[len(past) // 2],
                latency_factor_top_vs_first=round(st[-1]["latency_median_ms"] / st[0]["latency_median_ms"], 1)
                if st[0]["latency_median_ms"] > 0 else -1,
                capture_dropped=r["stats"].get("dropped_by_kernel", -1))


def build_saturation(lab: Lab, out: Path, healthy: bool) -> dict:
    fname = "nfs41-saturation-healthy.pcap" if healthy else "nfs41-saturation.pcap"
    r = run_ramp(lab, out, fname, healthy)
    m = measured_of(r)
    st = per_step(r)
    for x in st:
        log(f"step {x}")
    made = (f"{ganesha_version()}, NFSv4.1 only, Slot_Table_Size {SLOT_TABLE_SIZE}, in a cpu cgroup of its own "
            f"(cfs_quota_us {QUOTA_US} per cfs_period_us {PERIOD_US}: {QUOTA_US / PERIOD_US:.0%} of one CPU), on "
            f"{SERVER}:2049; our NFSv4.1 clients (samples/realkit/nfs_session.py) 10.77.6.1-{max(STEPS)}, one TCP "
            f"connection, client id and session each (CREATE_SESSION asks {ASKED_SLOTS} slots, granted "
            f"{r['granted']}), one worker per slot; sessions join in steps of {', '.join(map(str, STEPS))}, "
            f"{STEP_S:g} s each; every request SEQUENCE, PUTFH, GETATTR of one file at "
            f"{r['rate']:g} requests/s per session (a late worker sends at once). Captured on the server's veth "
            f"(snaplen {SNAPLEN}, us pcap).")
    entry = dict(file=fname, scenario="nfs41-saturation", healthy=healthy,
                 twin="nfs41-saturation.pcap" if healthy else "nfs41-saturation-healthy.pcap",
                 made_with=made, measured=m)
    if healthy:
        entry["what_happened"] = (
            f"Offered load rises from {st[0]['offered_per_s']}/s to {st[-1]['offered_per_s']}/s and completions "
            f"follow it ({st[0]['completions_per_s']}/s to {st[-1]['completions_per_s']}/s); median latency "
            f"{st[0]['latency_median_ms']} ms at the first step, {st[-1]['latency_median_ms']} ms at the last; "
            f"at most {max(x['max_slots_one_session'] for x in st)} of a session's {r['granted']} slots in use: "
            "the server keeps up.")
        entry["silent"] = [*OTHERS, NAME]
        entry["expect"] = []
        return entry
    knee = next(x for x in st if x["sessions"] == m["knee_sessions"])
    entry["what_happened"] = (
        f"The server reaches its CPU allowance at {m['knee_sessions']} sessions (throttled in "
        f"{knee['server_throttled']} "
        f"of {knee['server_periods']} periods): completions/s {knee['completions_per_s']}/s there, "
        f"{m['peak_completions_per_s']}/s at most and {st[-1]['completions_per_s']}/s at the top step while the "
        f"sessions ask for {st[-1]['intended_per_s']}/s; from there each added session "
        f"only queues: median latency {st[0]['latency_median_ms']} ms with 1 session, {knee['latency_median_ms']} "
        f"ms at the knee, {st[-1]['latency_median_ms']} ms with {st[-1]['sessions']} sessions; every session keeps "
        f"all {r['granted']} of its slots busy ({st[-1]['slot_busy_share']:.0%} of the slot-time at the top step, all "
        f"of them at once {st[-1]['slots_all_busy_share']:.0%} of the time), the rest of its requests late in the "
        f"client. The server's CPU allowance is the limit (throttled in {st[-1]['server_throttled']} of "
        f"{st[-1]['server_periods']} periods at the top step); the clients used "
        f"{max(x['client_cpu_share'] for x in st):.0%} of a CPU at most.")
    entry["silent"] = list(OTHERS)
    entry["expect"] = [dict(
        detector="saturation", min_severity="medium", start_s=knee["start_s"], tolerance_s=2 * STEP_S,
        client="", server=SERVER, resource=f"{SERVER}:2049 GETATTR", count=1, count_tolerance=0,
        measured=dict(knee_sessions=m["knee_sessions"], peak_completions_per_s=m["peak_completions_per_s"],
                      latency_factor_top_vs_first=m["latency_factor_top_vs_first"], slots_granted=r["granted"]))]
    return entry
