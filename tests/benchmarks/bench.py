#!/usr/bin/env python3
"""herdscope ingest benchmark: one capture, several readers, side by side.

    python tests/benchmarks/bench.py [--packets 1000000 [--packets 10000000 ...]] [--seed 1] [--skip-tshark] [--json OUT]

Generates (once, cached under ``.bench/`` in the repository root) a deterministic mixed capture
with ``samples/synth.py`` (beyond 10M packets, which synth.py cannot hold in memory, 10M captures of
successive seeds one after the other: :func:`repeated_capture`) and times, in one run:

  cat                 ``cat FILE > /dev/null`` with the file already in the page cache
  herdscope ingest    ``analyzer.open_capture(FILE).packets`` in this process, after imports and one
                      warm-up call (Numba's cache is warm)
  herdscope export    the whole ``herdscope export FILE --out DIR`` process (wall time)
  dpkt loop           dpkt extracting the same header fields into Python lists
  tshark fields       ``tshark -T fields`` with the same fields, tshark's default settings
  tshark tcp analysis ``tshark -2`` with ``tcp.analysis.*`` fields (placeholder, to be extended)

and prints seconds, packets/s, peak RSS and ratios (to ``cat`` and to herdscope's ingest).

Then the fixed cost of a process (``--fixed-runs N``, default 5; 0 skips it): the median wall and CPU
time (user + system, the command's own) over N runs, after one warm-up run, of ``herdscope --version``,
``herdscope detectors``, and ``info`` / ``scan`` / ``scan --detectors herd`` of a one-packet capture
cut from the benchmark capture: what every command pays before its first packet (imports, Numba's
cached kernels). Issue 13's target for it is under 0.5 s.
Peak RSS: subprocess stages report the command's own peak (``/usr/bin/time -v``, else
``getrusage(RUSAGE_CHILDREN)``); in-process stages report this process's RSS sampled during the
stage, so it includes the interpreter, imports and whatever earlier stages left behind. The machine
should be otherwise idle: on a shared 2-core box the tshark rows vary by 2-3x with load.

Adding a stage: write ``def stage_x(ctx: Ctx) -> Result`` and decorate it with ``@stage("name")``
(optionally ``tags={"tshark"}`` so ``--skip-tshark`` skips it). Stages run in definition order.
A stage that cannot run yet returns ``Result(..., status="unavailable")``; one that raises is
reported as failed and makes the exit status 1.

This file is not a pytest test (no ``test_`` prefix); ``tests/test_bench_smoke.py`` runs it small.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
SYNTH = ROOT / "samples" / "synth.py"
DEFAULT_CACHE = ROOT / ".bench"
TIME_BIN = "/usr/bin/time"

TSHARK_FIELDS = ["frame.number", "frame.time_epoch", "frame.cap_len", "frame.len", "ip.src", "ip.dst",
                 "ipv6.src", "ipv6.dst", "ip.proto", "tcp.srcport", "tcp.dstport", "udp.srcport",
                 "udp.dstport", "tcp.flags", "tcp.seq_raw", "tcp.ack_raw", "tcp.window_size_value",
                 "tcp.len", "udp.length"]


# ------------------------------------------------------------------------------------------------
# results and the stage registry
# ------------------------------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    seconds: float | None = None
    packets: int | None = None              # records the stage reported handling (None: not counted)
    peak_rss_kb: int | None = None
    peak_anon_kb: int | None = None       # subprocess stages: the highest RssAnon (file-backed pages left out)
    status: str = "ok"                      # ok | unavailable | skipped | failed
    note: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class Ctx:
    path: Path
    packets: int
    size: int
    args: argparse.Namespace
    results: list[Result] = field(default_factory=list)
    pieces: list[Path] | None = None  # the capture cut in files, while the worker stages run

    def result(self, name: str) -> Result | None:
        for r in self.results:
            if r.name == name:
                return r
        return None


@dataclass
class Stage:
    name: str
    fn: Callable[[Ctx], Result]
    tags: frozenset


STAGES: list[Stage] = []


def stage(name: str, tags: set[str] | frozenset = frozenset()):
    def register(fn: Callable[[Ctx], Result]):
        STAGES.append(Stage(name, fn, frozenset(tags)))
        return fn
    return register


# ------------------------------------------------------------------------------------------------
# measuring helpers
# ------------------------------------------------------------------------------------------------

class PeakRSS:
    """Samples this process's RSS from /proc every few ms while the block runs (kB)."""

    def __init__(self, interval: float = 0.005):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()

    @staticmethod
    def current_kb() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current_kb())
            self._stop.wait(self.interval)

    def __enter__(self):
        self.peak = self.current_kb()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.current_kb())


def run_timed(cmd: list[str], *, stdout=subprocess.DEVNULL,
              cwd: Path | None = None) -> tuple[float, int | None, subprocess.CompletedProcess, int | None]:
    """Run ``cmd``; returns (wall seconds, peak RSS kB of the command, completed process, peak anonymous
    memory kB). The peak RSS is ``/usr/bin/time -v``'s: a child forked straight from this process would
    report this process's own high-water mark (Linux carries it across fork and exec into the child's
    ``ru_maxrss``), and the in-process stages make this process big. The anonymous peak (``RssAnon``
    of the command under ``time``, sampled every few ms) leaves file-backed pages out, i.e. the
    memory-mapped capture: what "memory beyond the map" means when the file is larger than the page
    cache can hold (issue 13's 100M-packet run)."""
    use_time = os.access(TIME_BIN, os.X_OK)
    full = [TIME_BIN, "-v", *cmd] if use_time else cmd
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.Popen(full, stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=cwd)
    with AnonPeak(proc.pid, child=use_time) as anon:
        err = proc.communicate()[1]
    wall = time.perf_counter() - t0
    rss = None
    if use_time:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
        rss = int(m.group(1)) if m else None
        err = "\n".join(l for l in err.splitlines() if not l.startswith("\t"))
    else:
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        rss = after if after > before else None     # max over all children so far
    return wall, rss, subprocess.CompletedProcess(full, proc.returncode, None, err), anon.peak or None


class AnonPeak(PeakRSS):
    """The highest ``RssAnon`` of process ``pid`` while the block runs (kB), sampled as :class:`PeakRSS`
    samples this process; ``child``: ``pid`` is ``time``'s, the command measured is its (first) child."""

    def __init__(self, pid: int, *, child: bool = False):
        super().__init__()
        self.pid, self.child = pid, child

    def _target(self) -> int | None:
        if not self.child:
            return self.pid
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
                kids = f.read().split()
        except OSError:
            return None
        return int(kids[0]) if kids else None

    def current_kb(self) -> int:
        pid = self._target()
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        return int(line.split()[1])
        except (OSError, TypeError):  # not started yet, or gone
            pass
        return 0


def tail(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else "..." + text[-n:]


# ------------------------------------------------------------------------------------------------
# the stages
# ------------------------------------------------------------------------------------------------

@stage("cat")
def stage_cat(ctx: Ctx) -> Result:
    subprocess.run(["cat", str(ctx.path)], stdout=subprocess.DEVNULL, check=True)      # warm the cache
    wall, rss, proc, anon = run_timed(["cat", str(ctx.path)])
    if proc.returncode:
        raise RuntimeError(f"cat failed: {tail(proc.stderr)}")
    return Result("cat", wall, ctx.packets, rss, peak_anon_kb=anon, note="page-cached read")


@stage("herdscope ingest")
def stage_herdscope_ingest(ctx: Ctx) -> Result:
    try:
        from analyzer import open_capture
    except Exception as e:          # the API is being written; absence is not a failure
        return Result("herdscope ingest", status="unavailable",
                      note=f"herdscope: not available yet ({type(e).__name__}: {e})")
    warm = open_capture(ctx.path)                      # Numba compile / cache load, page cache
    _ = warm.packets
    getattr(warm, "close", lambda: None)()
    del warm, _
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        cap = open_capture(ctx.path)
        frame = cap.packets
        wall = time.perf_counter() - t0
    rows = frame.height
    est = frame.estimated_size()
    getattr(cap, "close", lambda: None)()
    res = Result("herdscope ingest", wall, rows, mem.peak,
                 note=f"{est / max(rows, 1):.1f} B/packet in the packets frame ({len(frame.columns)} columns)",
                 extra={"frame_bytes": est, "bytes_per_packet": est / max(rows, 1), "columns": frame.columns})
    if rows != ctx.packets:
        res.status = "failed"
        res.note = f"packets frame has {rows} rows, capture has {ctx.packets} records; " + res.note
    return res


def _herdscope_cmd() -> tuple[list[str], str] | None:
    """The installed ``herdscope`` command, else ``python -m analyzer`` from this checkout."""
    exe = shutil.which("herdscope")
    if exe is None:
        cand = Path(sys.executable).parent / "herdscope"
        exe = str(cand) if cand.exists() else None
    if exe:
        return [exe], "herdscope"
    if (ROOT / "analyzer" / "__main__.py").exists():
        return [sys.executable, "-m", "analyzer"], "python -m analyzer"
    return None


@stage("herdscope tcp")
def stage_herdscope_tcp(ctx: Ctx) -> Result:
    """Ingest + TCP connections and segment analysis + reassembly and framing for the four protocols."""
    try:
        from analyzer import open_capture
        from analyzer.tcp import tcp_messages
    except Exception as e:
        return Result("herdscope tcp", status="unavailable", note=f"not available yet ({type(e).__name__}: {e})")

    def run():
        cap = open_capture(ctx.path)
        seg = cap.frame("tcp_segments")
        conns = cap.frame("connections")
        n_msgs = sum(ms.height for framing, ports in (("nbss", {445, 139}), ("record_mark", {88}),
                                                      ("length16", {53}), ("ber", {389, 3268}))
                     for ms in tcp_messages(cap, framing, ports))
        return cap, seg.height, conns.height, n_msgs

    run()  # warm: Numba caches
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        cap, n_seg, n_conn, n_msgs = run()
        wall = time.perf_counter() - t0
    getattr(cap, "close", lambda: None)()
    return Result("herdscope tcp", wall, ctx.packets, mem.peak,
                  note=f"in process: ingest + {n_seg:,} segments analysed, {n_conn:,} connections, "
                       f"{n_msgs:,} messages framed")


DECODED_FRAMES = ("dns_messages", "dns_transactions", "kerberos_messages", "kerberos_transactions",
                  "ldap_messages", "ldap_transactions", "smb2_messages", "smb2_transactions", "smb2_breaks")


@stage("herdscope decode")
def stage_herdscope_decode(ctx: Ctx) -> Result:
    """Ingest + TCP + every decoder's message and transaction frames, in process."""
    try:
        from analyzer import open_capture
    except Exception as e:
        return Result("herdscope decode", status="unavailable", note=f"not available yet ({type(e).__name__}: {e})")

    def run():
        cap = open_capture(ctx.path)
        names = [n for n in DECODED_FRAMES if n in cap.frame_names()]
        rows = {n: cap.frame(n).height for n in names}
        return cap, rows

    run()
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        cap, rows = run()
        wall = time.perf_counter() - t0
    getattr(cap, "close", lambda: None)()
    msgs = {k.split("_")[0]: v for k, v in rows.items() if k.endswith("_messages")}
    return Result("herdscope decode", wall, ctx.packets, mem.peak,
                  note="in process: " + ", ".join(f"{p} {n:,} msgs" for p, n in msgs.items()),
                  extra={"rows": rows})


@stage("herdscope scan")
def stage_herdscope_scan(ctx: Ctx) -> Result:
    """The whole `herdscope scan` process: ingest, TCP, decoders, every detector."""
    found = _herdscope_cmd()
    if found is None:
        return Result("herdscope scan", status="unavailable", note="no herdscope command")
    cmd, how = found
    with tempfile.TemporaryDirectory(dir=ctx.args.cache_dir, prefix="scan-") as out:
        report = Path(out) / "findings.json"
        wall, rss, proc, anon = run_timed([*cmd, "scan", str(ctx.path), "--format", "json", "--output", str(report),
                                     "--fail-on", "critical"], cwd=ROOT)
        text = report.read_text() if report.exists() else ""
        doc = json.loads(text) if text else {}
    if proc.returncode not in (0, 1):
        return Result("herdscope scan", wall, None, rss, peak_anon_kb=anon, status="failed", note=f"exit {proc.returncode}: {tail(proc.stderr)}")
    n = len(doc.get("findings", []))
    dets = ", ".join(doc.get("captures", [{}])[0].get("detectors", [])) if doc else ""
    parts = _default_partitions(ctx)
    decoded = f"decoded in {parts} partitions by default" if parts > 1 else "decoded at once"
    return Result("herdscope scan", wall, ctx.packets, rss, peak_anon_kb=anon,
                  note=f"{how}; {decoded}; {n} findings ({dets})",
                  extra={"report_sha256": hashlib.sha256(text.encode()).hexdigest()})


def _default_partitions(ctx: Ctx) -> int:
    """The partitions a default `scan`, `stats` or `info` of the capture decodes it in (analyzer.record_estimate)."""
    from analyzer.record_estimate import partitions_for

    return partitions_for([str(ctx.path)], None)


@stage("scan, at once")
def stage_scan_at_once(ctx: Ctx) -> Result:
    """`scan --partitions 1`, for a capture large enough that the default decodes it in partitions:
    the whole capture decoded at once, the memory it takes and the time the partitions cost. Its
    report must be the default scan's, byte for byte."""
    name = "scan, at once"
    found = _herdscope_cmd()
    if found is None:
        return Result(name, status="unavailable", note="no herdscope command")
    if _default_partitions(ctx) == 1:
        return Result(name, status="unavailable", note="the default scan of this capture decodes it at once")
    return _compared_scan(ctx, found, name, ["--partitions", "1"])


IN_PROCESS_PARTITIONS = 8  # `scan --partitions` of the capture: server partitions decoded one after the other


@stage(f"scan, {IN_PROCESS_PARTITIONS} partitions in process")
def stage_scan_partitions(ctx: Ctx) -> Result:
    """`scan --partitions 8`: the server partitions decoded one after the other in this process, each
    reading only its packets; less memory at the cost of reading the file 8 more times. Its report
    must be the default scan's, byte for byte."""
    name = f"scan, {IN_PROCESS_PARTITIONS} partitions in process"
    found = _herdscope_cmd()
    if found is None:
        return Result(name, status="unavailable", note="no herdscope command")
    return _compared_scan(ctx, found, name, ["--partitions", str(IN_PROCESS_PARTITIONS)])


def _compared_scan(ctx: Ctx, found: tuple, name: str, options: list[str]) -> Result:
    """A `scan` of the capture with ``options`` (``found``: the herdscope command), its report compared
    byte for byte with the default scan's."""
    cmd, how = found
    other = ctx.result("herdscope scan")
    with tempfile.TemporaryDirectory(dir=ctx.args.cache_dir, prefix="scan-") as out:
        report = Path(out) / "findings.json"
        wall, rss, proc, anon = run_timed([*cmd, "scan", str(ctx.path), *options, "--format", "json", "--output",
                                           str(report), "--fail-on", "critical"], cwd=ROOT)
        text = report.read_text() if report.exists() else ""
    if proc.returncode not in (0, 1):
        return Result(name, wall, None, rss, peak_anon_kb=anon, status="failed", note=f"exit {proc.returncode}: {tail(proc.stderr)}")
    res = Result(name, wall, ctx.packets, rss, peak_anon_kb=anon, note=how + _anon_note(anon, other))
    if other is not None and other.extra.get("report_sha256"):
        same = hashlib.sha256(text.encode()).hexdigest() == other.extra["report_sha256"]
        res.note += "; report identical to the default scan's" if same else "; REPORT DIFFERS from the default scan's"
        res.status = "ok" if same else "failed"
    return res


SUMMARY_COMMANDS = ("info", "stats")  # the other commands that decode in partitions (analyzer.record_estimate)
COMPARED_PARTITIONS = 4  # the partitions a summary is compared in when its default decodes it at once


def _summary_run(ctx: Ctx, name: str, command: str, options: list[str]) -> tuple[Result, str | None]:
    """`herdscope COMMAND --format json` of the capture with ``options``: its result and its output's sha256."""
    found = _herdscope_cmd()
    if found is None:
        return Result(name, status="unavailable", note="no herdscope command"), None
    cmd, how = found
    with tempfile.TemporaryDirectory(dir=ctx.args.cache_dir, prefix=f"{command}-") as out:
        path = Path(out) / "out.json"
        with open(path, "w") as fh:
            wall, rss, proc, anon = run_timed([*cmd, command, str(ctx.path), "--format", "json", *options],
                                              stdout=fh, cwd=ROOT)
        text = path.read_text()
    if proc.returncode != 0:
        return Result(name, wall, None, rss, peak_anon_kb=anon, status="failed",
                      note=f"exit {proc.returncode}: {tail(proc.stderr)}"), None
    return Result(name, wall, ctx.packets, rss, peak_anon_kb=anon, note=how), hashlib.sha256(text.encode()).hexdigest()


def _summary_stages(command: str) -> None:
    """Two stages per command: its default run, and the other way (``--partitions 1`` when the default
    decodes in partitions, :data:`COMPARED_PARTITIONS` when it decodes at once), whose output must be
    the default's, byte for byte."""
    @stage(command)
    def default(ctx: Ctx) -> Result:
        parts = _default_partitions(ctx)
        res, digest = _summary_run(ctx, command, command, [])
        res.note += f"; decoded in {parts} partitions by default" if parts > 1 else "; decoded at once"
        res.extra["sha256"] = digest
        return res

    @stage(f"{command}, partitions compared")
    def compared(ctx: Ctx) -> Result:
        parts = _default_partitions(ctx)
        options = ["--partitions", "1" if parts > 1 else str(COMPARED_PARTITIONS)]
        res, digest = _summary_run(ctx, f"{command}, partitions compared", command, options)
        plain = ctx.result(command)
        res.note += f"; {' '.join(options)}" + _anon_note(res.peak_anon_kb, plain, command)
        if digest and plain is not None and plain.extra.get("sha256"):
            same = digest == plain.extra["sha256"]
            res.note += f"; output identical to the default {command}'s" if same else "; OUTPUT DIFFERS"
            res.status = "ok" if same else "failed"
        return res


for _command in SUMMARY_COMMANDS:
    _summary_stages(_command)


@stage("scan, 1 packet")
def stage_herdscope_scan_one(ctx: Ctx) -> Result:
    """`herdscope scan` of the capture's first packet: the process's own memory, which the memory per
    packet subtracts (issue 13's formula: (peak RSS - file size - this) / packets)."""
    found = _herdscope_cmd()
    if found is None:
        return Result("scan, 1 packet", status="unavailable", note="no herdscope command")
    cmd, how = found
    with tempfile.TemporaryDirectory(dir=ctx.args.cache_dir, prefix="one-") as tmp:
        one = one_packet_capture(ctx.path, ctx.args.format, Path(tmp))
        if one is None:
            return Result("scan, 1 packet", status="unavailable", note="no editcap to cut one packet")
        wall, rss, proc, anon = run_timed([*cmd, "scan", str(one), "--format", "json", "--fail-on", "critical"], cwd=ROOT)
    status = "ok" if proc.returncode in (0, 1) else "failed"
    return Result("scan, 1 packet", wall, 1, rss, peak_anon_kb=anon, status=status, note=how)


@stage("scan identity")
def stage_scan_identity(ctx: Ctx) -> Result:
    """In process: the findings of ``detectors.run`` as the dashboard runs it (every frame kept) and as
    ``scan`` runs it (``release=True``: frames freed after their last reader) must be identical."""
    from analyzer import open_capture
    import detectors

    t0 = time.perf_counter()
    with open_capture(ctx.path) as cap:
        kept = detectors.run(cap)
    with open_capture(ctx.path) as cap:
        released = detectors.run(cap, release=True)
    same = kept.to_dicts() == released.to_dicts()
    return Result("scan identity", time.perf_counter() - t0, ctx.packets, None, status="ok" if same else "failed",
                  note=f"{kept.height} findings, " + ("identical with and without release" if same else
                                                      f"DIFFER: {released.height} with release"))


WORKER_PIECES = 8  # the capture is cut into this many files (editcap -c), as a ring buffer writes them


def _pieces(ctx: Ctx) -> list[Path] | None:
    """The capture cut into WORKER_PIECES files (once per run, in the cache directory)."""
    if ctx.pieces is None:
        editcap = shutil.which("editcap")
        if editcap is None:
            return None
        out = Path(tempfile.mkdtemp(dir=ctx.args.cache_dir, prefix="pieces-"))
        subprocess.run([editcap, "-c", str(-(-ctx.packets // WORKER_PIECES)), str(ctx.path), str(out / "piece.pcap")],
                       check=True, capture_output=True)
        ctx.pieces = sorted(out.iterdir())
    return ctx.pieces


def _workers_stage(ctx: Ctx, workers: int) -> Result:
    name = f"scan, {WORKER_PIECES} pieces, {workers} worker{'s' if workers > 1 else ''}"
    found, pieces = _herdscope_cmd(), _pieces(ctx)
    if found is None or pieces is None:
        return Result(name, status="unavailable", note="no herdscope command" if found is None else "no editcap")
    cmd, how = found
    report = pieces[0].parent / f"findings-{workers}.json"
    wall, rss, proc, anon = run_timed([*cmd, "scan", *map(str, pieces), "--workers", str(workers), "--format", "json",
                                       "--output", str(report), "--fail-on", "critical"], cwd=ROOT)
    if proc.returncode not in (0, 1):
        return Result(name, wall, None, rss, peak_anon_kb=anon, status="failed", note=f"exit {proc.returncode}: {tail(proc.stderr)}")
    n = len(json.loads(report.read_text())["findings"])
    return Result(name, wall, ctx.packets, rss, peak_anon_kb=anon,
                  note=f"{how}; {n} findings; peak is the driver's" + _anon_note(anon, ctx.result("herdscope scan")))


def _anon_note(anon_kb: int | None, plain: Result | None, command: str = "scan") -> str:
    """The stage's peak anonymous memory beside the default ``command``'s (its RSS counts mapped files:
    the capture, and the Arrow files the partitions' frames come back through)."""
    if not anon_kb:
        return ""
    beside = (f" (default {command} {plain.peak_anon_kb / 1e3:,.0f} MB)" if plain is not None and plain.peak_anon_kb
              else "")
    return f"; peak anonymous {anon_kb / 1e3:,.0f} MB{beside}"


@stage("scan, 8 pieces, 1 worker", {"workers"})
def stage_scan_one_worker(ctx: Ctx) -> Result:
    """`scan --workers 1` of the capture cut in 8 pieces: a local Dask cluster of one worker process."""
    return _workers_stage(ctx, 1)


@stage("scan, 8 pieces, 2 workers", {"workers"})
def stage_scan_two_workers(ctx: Ctx) -> Result:
    """`scan --workers 2` of the same pieces: two server partitions decoded side by side. Its findings
    must be the one-worker run's and the unsplit file's (detector, kind, severity, server, resource,
    times: evidence is per file); the parallel efficiency is t(1) / (2 t(2))."""
    res = _workers_stage(ctx, 2)
    pieces = ctx.pieces
    if res.status != "ok" or not pieces:
        return res
    def identity(path):
        return sorted((f["detector"], f["kind"], f["severity"], f["server"], f["resource"], f["start_ns"],
                       f["end_ns"]) for f in json.loads(Path(path).read_text())["findings"])
    one, two = pieces[0].parent / "findings-1.json", pieces[0].parent / "findings-2.json"
    same = one.exists() and identity(one) == identity(two)
    t1 = ctx.result("scan, 8 pieces, 1 worker")
    eff = f"; parallel efficiency {t1.seconds / (2 * res.seconds):.0%}" if t1 and t1.status == "ok" else ""
    shutil.rmtree(pieces[0].parent, ignore_errors=True)
    ctx.pieces = None
    res.note += ("; findings identical to 1 worker" if same else "; FINDINGS DIFFER from 1 worker") + eff
    if not same:
        res.status = "failed"
    return res


def _export_stage(ctx: Ctx, name: str, extra: list[str]) -> Result:
    found = _herdscope_cmd()
    if found is None:
        return Result(name, status="unavailable", note="herdscope: not available yet (no `herdscope` command on PATH)")
    cmd, how = found
    with tempfile.TemporaryDirectory(dir=ctx.args.cache_dir, prefix="export-") as out:
        wall, rss, proc, anon = run_timed([*cmd, "export", str(ctx.path), "--out", out, *extra], cwd=ROOT)
        written = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file())
        files = sorted(f.stem for f in Path(out).glob("*.parquet"))
    if proc.returncode:
        if how != "herdscope" and re.search(r"No such command|invalid choice|ModuleNotFoundError", proc.stderr):
            return Result(name, status="unavailable", note=f"herdscope: not available yet ({tail(proc.stderr, 120)})")
        return Result(name, wall, None, rss, peak_anon_kb=anon, status="failed", note=f"exit {proc.returncode}: {tail(proc.stderr)}")
    return Result(name, wall, ctx.packets, rss, peak_anon_kb=anon, note=f"{how}; {len(files)} frames, {written / 1e6:.1f} MB",
                  extra={"output_bytes": written, "command": how, "frames": files})


@stage("herdscope export")
def stage_herdscope_export(ctx: Ctx) -> Result:
    """The whole process, writing the packets frame: the same header fields the dpkt loop and
    `tshark -T fields` extract, so the three rows compare like with like."""
    return _export_stage(ctx, "herdscope export", ["--frames", "packets"])


@stage("herdscope export all")
def stage_herdscope_export_all(ctx: Ctx) -> Result:
    """The whole process, every frame: TCP analysis, connections and the decoders' frames too."""
    return _export_stage(ctx, "herdscope export all", [])


@stage("dpkt loop")
def stage_dpkt(ctx: Ctx) -> Result:
    import dpkt
    cols: dict[str, list] = {k: [] for k in ("frame", "ts", "caplen", "len", "src", "dst", "proto", "sport",
                                              "dport", "tcp_flags", "seq", "ack", "win", "payload_len")}
    (frame, ts_, caplen, wirelen, src, dst, proto, sport, dport, flags, seq, ack, win, plen) = cols.values()
    TCP, UDP, IP, IP6 = dpkt.tcp.TCP, dpkt.udp.UDP, dpkt.ip.IP, dpkt.ip6.IP6
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        with open(ctx.path, "rb") as f:
            reader = dpkt.pcapng.Reader(f) if ctx.path.suffix == ".pcapng" else dpkt.pcap.Reader(f)
            for n, (ts, buf) in enumerate(reader, 1):
                frame.append(n)
                ts_.append(ts)
                caplen.append(len(buf))
                wirelen.append(len(buf))       # dpkt's iterator does not expose the original length
                ip = dpkt.ethernet.Ethernet(buf).data
                if isinstance(ip, IP):
                    src.append(ip.src)
                    dst.append(ip.dst)
                    proto.append(ip.p)
                elif isinstance(ip, IP6):
                    src.append(ip.src)
                    dst.append(ip.dst)
                    proto.append(ip.nxt)
                else:
                    src.append(None)
                    dst.append(None)
                    proto.append(None)
                    ip = None
                l4 = ip.data if ip is not None else None
                if isinstance(l4, TCP):
                    sport.append(l4.sport)
                    dport.append(l4.dport)
                    flags.append(l4.flags)
                    seq.append(l4.seq)
                    ack.append(l4.ack)
                    win.append(l4.win)
                    plen.append(len(l4.data))
                elif isinstance(l4, UDP):
                    sport.append(l4.sport)
                    dport.append(l4.dport)
                    flags.append(None)
                    seq.append(None)
                    ack.append(None)
                    win.append(None)
                    plen.append(len(l4.data))
                else:
                    for c in (sport, dport, flags, seq, ack, win, plen):
                        c.append(None)
        wall = time.perf_counter() - t0
    return Result("dpkt loop", wall, len(frame), mem.peak, note="14 fields into Python lists")


def _tshark() -> str | None:
    return shutil.which("tshark")


@stage("tshark fields", tags={"tshark"})
def stage_tshark_fields(ctx: Ctx) -> Result:
    exe = _tshark()
    if exe is None:
        return Result("tshark fields", status="unavailable", note="tshark not installed")
    cmd = [exe, "-r", str(ctx.path), "-T", "fields"]
    for f in TSHARK_FIELDS:
        cmd += ["-e", f]
    wall, rss, proc, anon = run_timed(cmd)
    if proc.returncode:
        return Result("tshark fields", wall, None, rss, peak_anon_kb=anon, status="failed", note=tail(proc.stderr))
    return Result("tshark fields", wall, ctx.packets, rss, peak_anon_kb=anon, note=f"{len(TSHARK_FIELDS)} fields, default prefs")


@stage("tshark tcp analysis", tags={"tshark"})
def stage_tshark_tcp_analysis(ctx: Ctx) -> Result:
    """Two-pass tshark with TCP analysis fields.

    The same flags and measures herdscope's tcp_segments frame holds.
    """
    exe = _tshark()
    if exe is None:
        return Result("tshark tcp analysis", status="unavailable", note="tshark not installed")
    fields = ["frame.number", "tcp.stream", "tcp.seq", "tcp.ack", "tcp.len", "tcp.window_size",
              "tcp.analysis.flags", "tcp.analysis.retransmission", "tcp.analysis.fast_retransmission",
              "tcp.analysis.spurious_retransmission", "tcp.analysis.out_of_order", "tcp.analysis.lost_segment",
              "tcp.analysis.ack_lost_segment", "tcp.analysis.duplicate_ack_num", "tcp.analysis.zero_window",
              "tcp.analysis.zero_window_probe", "tcp.analysis.window_full", "tcp.analysis.window_update",
              "tcp.analysis.keep_alive", "tcp.analysis.acks_frame", "tcp.analysis.ack_rtt",
              "tcp.analysis.bytes_in_flight", "tcp.analysis.initial_rtt"]
    cmd = [exe, "-r", str(ctx.path), "-2", "-T", "fields"]
    for f in fields:
        cmd += ["-e", f]
    wall, rss, proc, anon = run_timed(cmd)
    if proc.returncode:
        return Result("tshark tcp analysis", wall, None, rss, peak_anon_kb=anon, status="failed", note=tail(proc.stderr))
    return Result("tshark tcp analysis", wall, ctx.packets, rss, peak_anon_kb=anon, note=f"-2 (two-pass), {len(fields)} tcp fields")


DECODER_FIELDS = [  # what herdscope's four decoders extract, as tshark fields
    "frame.number", "tcp.stream", "dns.id", "dns.flags.response", "dns.flags.rcode", "dns.qry.name", "dns.qry.type",
    "dns.resp.ttl", "dns.time", "dns.retransmission", "kerberos.msg_type", "kerberos.realm", "kerberos.CNameString",
    "kerberos.SNameString", "kerberos.nonce", "kerberos.error_code", "kerberos.etype", "ldap.messageID",
    "ldap.protocolOp", "ldap.baseObject", "ldap.name", "ldap.resultCode", "smb2.cmd", "smb2.nt_status",
    "smb2.msg_id", "smb2.flags.response", "smb2.sesid", "smb2.tid", "smb2.filename", "smb2.tree", "smb2.time",
    "smb2.lease.lease_key", "smb2.lease.lease_state",
]


@stage("tshark -2 decoders", tags={"tshark"})
def stage_tshark_decoders(ctx: Ctx) -> Result:
    """Two-pass tshark extracting the fields herdscope's DNS, Kerberos, LDAP and SMB2 decoders give."""
    exe = _tshark()
    if exe is None:
        return Result("tshark -2 decoders", status="unavailable", note="tshark not installed")
    cmd = [exe, "-r", str(ctx.path), "-2", "-T", "fields"]
    for f in DECODER_FIELDS:
        cmd += ["-e", f]
    wall, rss, proc, anon = run_timed(cmd)
    if proc.returncode:
        return Result("tshark -2 decoders", wall, None, rss, peak_anon_kb=anon, status="failed", note=tail(proc.stderr))
    return Result("tshark -2 decoders", wall, ctx.packets, rss, peak_anon_kb=anon, note=f"-2, {len(DECODER_FIELDS)} dns/kerberos/ldap/smb2 fields")


@stage("tshark -2, 1 packet", tags={"tshark"})
def stage_tshark_decoders_one(ctx: Ctx) -> Result:
    """The same tshark command on the first packet: tshark's own memory, for its memory per packet."""
    exe = _tshark()
    if exe is None:
        return Result("tshark -2, 1 packet", status="unavailable", note="tshark not installed")
    with tempfile.TemporaryDirectory(dir=ctx.args.cache_dir, prefix="one-") as tmp:
        one = one_packet_capture(ctx.path, ctx.args.format, Path(tmp))
        if one is None:
            return Result("tshark -2, 1 packet", status="unavailable", note="no editcap to cut one packet")
        cmd = [exe, "-r", str(one), "-2", "-T", "fields"]
        for f in DECODER_FIELDS:
            cmd += ["-e", f]
        wall, rss, proc, anon = run_timed(cmd)
    return Result("tshark -2, 1 packet", wall, 1, rss, peak_anon_kb=anon, status="failed" if proc.returncode else "ok")


# ------------------------------------------------------------------------------------------------
# the capture
# ------------------------------------------------------------------------------------------------

def synth_digest() -> str:
    """Of synth.py and the samples/synthkit/ modules it runs: a change to any of them regenerates."""
    h = hashlib.sha256(SYNTH.read_bytes())
    for p in sorted((SYNTH.parent / "synthkit").glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


# synth.py builds every frame in memory before it writes them (about 0.9 GB per million packets), so
# it cannot write a capture much beyond this on a 24 GiB machine; larger sizes join captures of this
# size of successive seeds (repeated_capture)
SYNTH_LARGEST_PACKETS = 10_000_000
REPEAT_GAP_US = 1_000  # between one repeat's last packet and the next one's first


def ensure_capture(cache: Path, packets: int, seed: int, fmt: str, regenerate: bool) -> tuple[Path, float | None]:
    """The cached capture for these arguments and this version of synth.py (generated if missing).
    Beyond :data:`SYNTH_LARGEST_PACKETS` (a multiple of it), captures of that size of successive seeds,
    one after the other in time (:func:`repeated_capture`)."""
    cache.mkdir(parents=True, exist_ok=True)
    if packets > SYNTH_LARGEST_PACKETS:
        return repeated_capture(cache, packets, seed, fmt, regenerate)
    stem = f"synth-{packets}-s{seed}-{synth_digest()}"
    path = cache / f"{stem}.{fmt}"
    labels = Path(str(path) + ".labels.json")
    if path.exists() and labels.exists() and not regenerate:
        return path, None
    for old in cache.glob(f"synth-{packets}-s{seed}-*.{fmt}*"):      # captures of older synth.py versions
        if not old.name.startswith(stem):
            old.unlink()
    tmp = cache / f".{stem}.tmp.{fmt}"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(SYNTH), "--packets", str(packets), "--seed", str(seed), "--format", fmt,
                    "--out", str(tmp), "--quiet"], check=True)
    took = time.perf_counter() - t0
    os.replace(str(tmp) + ".labels.json", labels)
    os.replace(tmp, path)
    return path, took


def repeated_capture(cache: Path, packets: int, seed: int, fmt: str, regenerate: bool) -> tuple[Path, float | None]:
    """A capture of ``packets`` packets made of :data:`SYNTH_LARGEST_PACKETS`-packet synth captures of the
    seeds ``seed``, ``seed + 1``, ... one after the other, each shifted in time to start
    :data:`REPEAT_GAP_US` after the previous one's last packet: the same site (synth.py's hosts and
    servers do not depend on the seed) for longer, with sessions, ports, sequence numbers and tickets of
    their own; one copy of the same file would replay every Kerberos authenticator and TCP sequence
    number, which replay and tcp_stall rightly report (on 4 December 2026, ten copies of seed 1: 23,061
    replay and 20,675 tcp_stall findings). Classic µs pcap; the labels are each part's, shifted alike.
    Each part is generated in turn and, but for ``seed``'s own (the smaller benchmark's), deleted once
    appended, so the disk holds the result and one part."""
    if fmt != "pcap" or packets % SYNTH_LARGEST_PACKETS:
        raise SystemExit(f"captures beyond {SYNTH_LARGEST_PACKETS:,} packets are synth captures of that many "
                         f"packets one after the other: --packets a multiple of it, --format pcap")
    parts = packets // SYNTH_LARGEST_PACKETS
    path = cache / f"synth-{packets}-s{seed}-{synth_digest()}-{parts}-seeds.pcap"
    labels = Path(str(path) + ".labels.json")
    if path.exists() and labels.exists() and not regenerate:
        return path, None
    for old in cache.glob(f"synth-{packets}-s{seed}-*"):
        old.unlink()
    t0 = time.perf_counter()
    tmp = cache / f".{path.name}.tmp"
    joined_labels, next_first_us = [], None
    with open(tmp, "wb") as out:
        for k in range(parts):
            base, _ = ensure_capture(cache, SYNTH_LARGEST_PACKETS, seed + k, fmt, regenerate and k == 0)
            shift_us, last_us = _append_shifted(base, out, next_first_us, header=k == 0)
            next_first_us = last_us + REPEAT_GAP_US
            for label in json.loads(Path(str(base) + ".labels.json").read_text()):
                moved = {key: (v + shift_us * 1000 if key in ("start_ns", "end_ns") else v) for key, v in label.items()}
                moved["parameters"] = {key: (v + shift_us * 1000 if key.endswith("_ns") else v)
                                       for key, v in label["parameters"].items()}
                joined_labels.append(moved)
            if k:
                for done in (base, Path(str(base) + ".labels.json")):
                    done.unlink()
    labels.write_text(json.dumps(joined_labels, indent=1) + "\n")
    os.replace(tmp, path)
    return path, time.perf_counter() - t0


def _append_shifted(base: Path, out, first_us: int | None, *, header: bool) -> tuple[int, int]:
    """Append the records of the µs pcap ``base`` to ``out`` (its file header too when ``header``), their
    times shifted so that the first is ``first_us`` (None: unshifted); returns (the shift, the last
    record's new time), in µs."""
    import numpy as np
    data = np.memmap(base, np.uint8, mode="r")
    view = memoryview(data)
    offsets, off = [], 24                                    # of each record header
    while off + 16 <= len(data):
        offsets.append(off)
        off += 16 + int.from_bytes(view[off + 8:off + 12], "little")
    offsets = np.asarray(offsets, np.int64)

    def u32(at):
        b = data[at[:, None] + np.arange(4)].astype(np.int64)
        return b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16 | b[:, 3] << 24

    def time_us(at):
        return u32(at) * 1_000_000 + u32(at + 4)
    shift_us = 0 if first_us is None else first_us - int(time_us(offsets[:1])[0])
    if header:
        out.write(bytes(data[:24]))
    records_per_write = 1 << 20
    for lo in range(0, len(offsets), records_per_write):
        at = offsets[lo:lo + records_per_write]
        end = offsets[lo + records_per_write] if lo + records_per_write < len(offsets) else len(data)
        chunk = np.array(data[at[0]:end])
        local = at - at[0]
        us = time_us(at) + shift_us
        for field_at, value in ((local, us // 1_000_000), (local + 4, us % 1_000_000)):
            for byte in range(4):
                chunk[field_at + byte] = (value >> (8 * byte)) & 0xFF
        out.write(chunk.tobytes())
    return shift_us, int(time_us(offsets[-1:])[0]) + shift_us


# ------------------------------------------------------------------------------------------------
# the fixed cost of a process
# ------------------------------------------------------------------------------------------------

FIXED_COST_TARGET_S = 0.5  # issue 13: what a process may cost before its first packet
PACKAGES = ("analyzer", "detectors", "dashboards")  # herdscope's own (compiled as make setup does)
# (label, arguments; ONE stands for the one-packet capture)
FIXED_COST_COMMANDS = [
    ("--version", ["--version"]),
    ("detectors", ["detectors"]),
    ("info, 1 packet", ["info", "ONE"]),
    ("scan, 1 packet", ["scan", "ONE", "--fail-on", "critical"]),
    ("scan herd, 1 packet", ["scan", "ONE", "--detectors", "herd", "--fail-on", "critical"]),
]


def one_packet_capture(path: Path, fmt: str, out_dir: Path) -> Path | None:
    """The first packet of ``path`` as a capture of its own (editcap, else the first pcap record)."""
    out = out_dir / f"one-packet.{fmt}"
    editcap = shutil.which("editcap")
    if editcap:
        subprocess.run([editcap, "-r", str(path), str(out), "1"], check=True, capture_output=True)
        return out
    if fmt != "pcap":
        return None
    with open(path, "rb") as f:
        head = f.read(24 + 16)
        little = head[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1")
        caplen = int.from_bytes(head[24 + 8:24 + 12], "little" if little else "big")
        out.write_bytes(head + f.read(caplen))
    return out


def fixed_costs(ctx: Ctx) -> list[dict]:
    """Each command of FIXED_COST_COMMANDS run ``--fixed-runs`` times (after a warm-up): median wall
    and CPU seconds, and the exit code of the last run."""
    found = _herdscope_cmd()
    if found is None:
        return []
    cmd, _ = found
    with tempfile.TemporaryDirectory(dir=ctx.args.cache_dir, prefix="fixed-") as tmp:
        one = one_packet_capture(ctx.path, ctx.args.format, Path(tmp))
        rows = []
        for label, args in FIXED_COST_COMMANDS:
            if "ONE" in args and one is None:
                rows.append({"command": label, "status": "unavailable", "note": "no editcap to cut one packet"})
                continue
            full = [*cmd, *[str(one) if a == "ONE" else a for a in args]]
            walls, cpus, code = [], [], None
            for k in range(ctx.args.fixed_runs + 1):  # the first run warms caches and is not counted
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                proc = subprocess.run(full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
                wall = time.perf_counter() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                code = proc.returncode
                if k:
                    walls.append(wall)
                    cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            status = "ok" if code in (0, 1) else "failed"
            rows.append({"command": label, "argv": args, "status": status, "exit": code,
                         "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "runs": len(walls),
                         "note": "" if status == "ok" else tail(proc.stderr.decode(errors="replace"))})
    return rows


def print_fixed_costs(rows: list[dict]) -> None:
    if not rows:
        return
    print()
    n = max((r.get("runs", 0) for r in rows), default=0)
    head = (f"{'fixed cost of a process':<24} {'wall s':>8} {'cpu s':>8}  "
            f"(median of {n}; target < {FIXED_COST_TARGET_S:g} s)")
    print(head)
    print("-" * len(head))
    for r in rows:
        if r["status"] == "unavailable":
            print(f"{r['command']:<24} {'-':>8} {'-':>8}  {r['note']}")
            continue
        verdict = "ok" if r["wall_s"] < FIXED_COST_TARGET_S else "MISSES"
        note = f"FAILED exit {r['exit']}: {r['note']}" if r["status"] == "failed" else verdict
        print(f"{r['command']:<24} {r['wall_s']:8.3f} {r['cpu_s']:8.3f}  {note}")


# ------------------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------------------

def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.1f} k"


def print_table(ctx: Ctx) -> None:
    cat = ctx.result("cat")
    hs = ctx.result("herdscope ingest")
    cat_s = cat.seconds if cat and cat.status == "ok" else None
    hs_s = hs.seconds if hs and hs.status == "ok" else None
    w = max([20] + [len(r.name) for r in ctx.results])  # the stage column, as wide as its longest name
    head = (f"{'stage':<{w}} {'seconds':>9} {'packets/s':>11} {'MB/s':>8} {'peak RSS':>10} {'x cat':>8} "
            f"{'x ingest':>9}  note")
    print(head)
    print("-" * len(head))
    for r in ctx.results:
        if r.status in ("unavailable", "skipped"):
            print(f"{r.name:<{w}} {'-':>9} {'-':>11} {'-':>8} {'-':>10} {'-':>8} {'-':>9}  {r.note}")
            continue
        sec = f"{r.seconds:.3f}" if r.seconds is not None else "-"
        n = r.packets if r.packets is not None else ctx.packets
        pps = fmt_rate(n / r.seconds) if r.seconds else "-"
        mbs = f"{ctx.size / 1e6 / r.seconds:.0f}" if r.seconds else "-"
        rss = f"{r.peak_rss_kb / 1024:.0f} MB" if r.peak_rss_kb else "-"
        xcat = f"{r.seconds / cat_s:.1f}" if cat_s and r.seconds else "-"
        xhs = f"{r.seconds / hs_s:.2f}" if hs_s and r.seconds else "-"
        note = ("FAILED: " if r.status == "failed" else "") + r.note
        print(f"{r.name:<{w}} {sec:>9} {pps:>11} {mbs:>8} {rss:>10} {xcat:>8} {xhs:>9}  {note}")


RATIOS = [  # (what the issues ask, slow stage, fast stage, target)
    ("ingest vs cat (in process)", "herdscope ingest", "cat", 3.0),
    ("tshark fields / herdscope export", "tshark fields", "herdscope export", 20.0),
    ("dpkt loop / herdscope export", "dpkt loop", "herdscope export", 10.0),
    ("tshark -2 tcp analysis / herdscope tcp", "tshark tcp analysis", "herdscope tcp", 10.0),
    ("tshark -2 decoders / herdscope decode", "tshark -2 decoders", "herdscope decode", 10.0),
    ("tshark -2 decoders / herdscope scan (process)", "tshark -2 decoders", "herdscope scan", 20.0),
]


MEMORY_PER_PACKET_TARGET_B = 200  # issue 13: a scan's memory per packet beyond the memory map
MEMORY_ROWS = [  # (label, the whole capture's stage, the one-packet stage)
    ("herdscope scan", "herdscope scan", "scan, 1 packet"),
    ("scan, at once", "scan, at once", "scan, 1 packet"),
    ("tshark -2 decoders", "tshark -2 decoders", "tshark -2, 1 packet"),
]


def print_memory(ctx: Ctx) -> None:
    """Memory per packet beyond the file, two ways: issue 13's (peak RSS - file size - the same command's
    peak on one packet) / packets (the file is memory-mapped by herdscope, read by tshark), and the
    anonymous peak less the one-packet one, which leaves file-backed pages out and so still means
    something when the file does not fit the page cache."""
    print()
    for label, whole, one in MEMORY_ROWS:
        rw, r1 = ctx.result(whole), ctx.result(one)
        if not (rw and r1 and rw.peak_rss_kb and r1.peak_rss_kb and rw.status == r1.status == "ok"):
            continue
        per = (rw.peak_rss_kb * 1024 - ctx.size - r1.peak_rss_kb * 1024) / ctx.packets
        verdict = ("ok" if per <= MEMORY_PER_PACKET_TARGET_B else "MISSES") if label == "herdscope scan" else "reference"
        print(f"{'memory per packet, ' + label:<42} {per:6.0f} B   (peak {rw.peak_rss_kb / 1024:.0f} MB, one packet "
              f"{r1.peak_rss_kb / 1024:.0f} MB; target <= {MEMORY_PER_PACKET_TARGET_B} B: {verdict})")
        if rw.peak_anon_kb and r1.peak_anon_kb:
            anon = (rw.peak_anon_kb - r1.peak_anon_kb) * 1024 / ctx.packets
            print(f"{'  anonymous memory per packet':<42} {anon:6.0f} B   (peak RssAnon {rw.peak_anon_kb / 1024:.0f} MB, "
                  f"one packet {r1.peak_anon_kb / 1024:.0f} MB)")


def print_ratios(ctx: Ctx) -> None:
    print()
    for label, a, b, target in RATIOS:
        ra, rb = ctx.result(a), ctx.result(b)
        if not (ra and rb and ra.seconds and rb.seconds and ra.status == rb.status == "ok"):
            continue
        ratio = ra.seconds / rb.seconds
        if a == "herdscope ingest":  # lower is better: within target x cat
            verdict = "ok" if ratio <= target else "MISSES"
            print(f"{label:<42} {ratio:6.1f}x   (target <= {target:g}x: {verdict})")
        else:
            verdict = "ok" if ratio >= target else "MISSES"
            print(f"{label:<42} {ratio:6.1f}x   (target >= {target:g}x: {verdict})")


def compile_bytecode() -> None:
    """What an installed herdscope starts from: the bytecode of its modules as they are now. make setup
    compiles it once; where PYTHONDONTWRITEBYTECODE is set (this machine, CI images) a module edited
    since is compiled from source at every start, ~0.1 s of each herdscope process measured here, which
    no installation pays."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *PACKAGES], cwd=ROOT, check=False,
                   stdout=subprocess.DEVNULL)


def run_size(args: argparse.Namespace, packets: int) -> tuple[Ctx, list[dict], dict, bool]:
    """Every stage (and the fixed costs) on the capture of ``packets`` packets: the context with its
    results, the fixed-cost rows, the JSON document and whether a stage failed."""
    path, gen_s = ensure_capture(args.cache_dir, packets, args.seed, args.format, args.regenerate)
    compile_bytecode()
    size = path.stat().st_size
    ctx = Ctx(path, packets, size, args)
    print(f"capture   {path} ({packets:,} packets, {size / 1e6:.1f} MB"
          + (f", generated in {gen_s:.1f} s" if gen_s is not None else ", cached") + ")")
    print(f"machine   {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print()
    failed = False
    for st in STAGES:
        if args.only and st.name not in args.only:
            continue
        if args.skip_tshark and "tshark" in st.tags:
            ctx.results.append(Result(st.name, status="skipped", note="--skip-tshark"))
            continue
        if args.skip_workers and "workers" in st.tags:
            ctx.results.append(Result(st.name, status="skipped", note="--skip-workers"))
            continue
        print(f"... {st.name}", file=sys.stderr, flush=True)
        try:
            res = st.fn(ctx)
        except Exception as e:
            traceback.print_exc()
            res = Result(st.name, status="failed", note=f"{type(e).__name__}: {tail(str(e))}")
        failed |= res.status == "failed"
        ctx.results.append(res)
    fixed = []
    if args.fixed_runs > 0 and (not args.only or "fixed cost" in args.only):
        print("... fixed cost", file=sys.stderr, flush=True)
        fixed = fixed_costs(ctx)
        failed |= any(r["status"] == "failed" for r in fixed)
    print_table(ctx)
    print_ratios(ctx)
    print_memory(ctx)
    print_fixed_costs(fixed)
    doc = {"capture": str(path), "packets": packets, "bytes": size, "seed": args.seed,
           "format": args.format, "generated_s": gen_s, "synth_digest": synth_digest(),
           "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
           "stages": [], "fixed_cost": fixed}
    for r in ctx.results:
        d = asdict(r)
        d["packets_per_s"] = (r.packets or packets) / r.seconds if r.seconds else None
        doc["stages"].append(d)
    return ctx, fixed, doc, failed


def print_sizes(runs: list[Ctx]) -> None:
    """One line per capture size: the whole scan against tshark -2 with the decoders' fields, side by
    side (time, ratio, memory per packet beyond the file by both measures)."""
    if len(runs) < 2:
        return
    print()
    head = (f"{'packets':>12} {'MB':>8} {'scan s':>8} {'tshark -2 s':>12} {'ratio':>7} {'scan peak':>10} "
            f"{'B/pkt':>6} {'anon B/pkt':>10}")
    print(head)
    print("-" * len(head))
    for ctx in runs:
        scan, one, tshark = ctx.result("herdscope scan"), ctx.result("scan, 1 packet"), ctx.result("tshark -2 decoders")
        ok = lambda r: r is not None and r.status == "ok" and r.seconds  # noqa: E731
        ratio = f"{tshark.seconds / scan.seconds:.1f}x" if ok(scan) and ok(tshark) else "-"
        per = anon = "-"
        if ok(scan) and ok(one) and scan.peak_rss_kb and one.peak_rss_kb:
            per = f"{(scan.peak_rss_kb * 1024 - ctx.size - one.peak_rss_kb * 1024) / ctx.packets:.0f}"
            if scan.peak_anon_kb and one.peak_anon_kb:
                anon = f"{(scan.peak_anon_kb - one.peak_anon_kb) * 1024 / ctx.packets:.0f}"
        secs = lambda r: f"{r.seconds:.1f}" if ok(r) else "-"  # noqa: E731
        peak = f"{scan.peak_rss_kb / 1024:.0f} MB" if ok(scan) and scan.peak_rss_kb else "-"
        print(f"{ctx.packets:>12,} {ctx.size / 1e6:>8.0f} {secs(scan):>8} {secs(tshark):>12} {ratio:>7} {peak:>10} "
              f"{per:>6} {anon:>10}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, action="append",
                    help="capture size in packets (repeat for several sizes, run one after the other; default 1000000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--format", choices=("pcap", "pcapng"), default="pcap")
    ap.add_argument("--skip-tshark", action="store_true", help="skip the stages that run tshark")
    ap.add_argument("--skip-workers", action="store_true", help="skip the Dask stages (scan --workers 1 and 2)")
    ap.add_argument("--only", action="append", metavar="STAGE", help="run only these stages (repeatable)")
    ap.add_argument("--json", metavar="OUT", help="write machine-readable results to OUT")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where captures are cached (.bench/)")
    ap.add_argument("--regenerate", action="store_true", help="regenerate the capture even if cached")
    ap.add_argument("--fixed-runs", type=int, default=5, metavar="N",
                    help="runs of each fixed-cost command (median reported; 0 skips that section)")
    args = ap.parse_args(argv)
    args.cache_dir = args.cache_dir.resolve()
    sys.path.insert(0, str(ROOT))
    runs, docs, failed = [], [], False
    for k, packets in enumerate(args.packets or [1_000_000]):
        if k:
            print("\n")
            args.fixed_runs = 0  # the fixed cost of a process does not depend on the capture's size
        ctx, _, doc, bad = run_size(args, packets)
        runs.append(ctx)
        docs.append(doc)
        failed |= bad
    print_sizes(runs)
    if args.json:
        doc = dict(docs[0])
        if len(docs) > 1:
            doc["sizes"] = docs
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
