#!/usr/bin/env python3
"""The memory of each cut server's task at a multiple of a capture's size, without that capture.

    python tests/benchmarks/server_tasks.py [CAPTURE] [--partitions 16] [--times 10] [--detectors herd,...]

A scan in partitions cuts a big server into shards and runs the detectors that look at every client
of it on the shards' frames merged, in one task per server (``analyzer.shards``,
``analyzer.distributed.server_task``). On the 100M synth capture those tasks set the scan's peak
(6.1 GB on 6 December 2026), and building and scanning that capture takes over an hour. This measures
the same tasks in a few minutes: it scans CAPTURE (by default the benchmark's 10M synth capture, in
16 partitions: the 100M default's proportions) in a child process that keeps every frame a cut
server's task merges, as the task merges it; then, for each server, a fresh child process runs its
task's detectors on those frames repeated ``--times`` times one after the other in time (the 100M
capture is ten 10M captures of successive seeds one after the other: :func:`repeated`) and reports
each detector's time and the process's peak anonymous memory (``RssAnon``, sampled every few ms)
while it ran, the frames it merges included (a frame is merged when a detector first reads it, and
let go of after the last, as in the task; once merged it is held in a mapped file, as in the task:
``analyzer.mapped_frames``, so what it holds then is not anonymous memory).

What the copies share is what successive seeds share (the site's addresses, names, files), not
what they do not (connections, flows, messages: numbered apart), so joins on those keys do not grow
as the square of the copies. Tickets and authenticators are copied too: ``replay`` reports the
copies' as replays (~21,000 on the LDAP server's frames x10), so its figures are not the 100M
task's. The peaks are the process's, with jemalloc's freed-but-kept pages, its allocators set as a
scan sets them (``analyzer.memory``): as in the task. What the probe does not reproduce: the task's
merge of its shards' spilled frames (``partitions.merge_frames``; here one kept frame is repeated),
and what the scan's caller holds in the same process while the task runs (~0.5-1 GB at 100M).

Not a pytest test (no ``test_`` prefix); ``tests/test_bench_smoke.py`` runs it on a sample.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
from bench import AnonPeak, ensure_capture  # noqa: E402 - the benchmark's sampler and capture cache

# columns holding an instant (ns since the epoch), shifted per copy; other *_ns columns are durations
INSTANT_COLUMNS = re.compile(r"(?:.*_)?ts(?:_.*)?_ns|first_entry_ns|till_ns|stime_ns|ctime_ns")
# columns numbering something of one copy alone (a connection, flow or NBSS message), shifted per copy
ID_COLUMNS = ("conn", "flow", "owner_flow", "trigger_flow", "message")
# between the last packet of one copy and the first of the next, as bench.REPEAT_GAP_US
COPY_GAP_NS = 1_000_000_000
GIVEN = "_given_"  # the frames the task is given (packets, interfaces), not merged
SOURCE = "_source_"  # a server-state frame's source, merged to build it and let go of


# -- the scan that keeps what each cut server's task merges -------------------------------------------

def keep_task_frames(out_dir: Path, scan_args: list[str]) -> int:
    """``herdscope scan`` with every cut server's task writing what it merges under ``out_dir/<n>/``."""
    import polars as pl

    from analyzer import shards
    from analyzer.cli import main

    built, init, merge = shards.MergedShards._built, shards.MergedShards.__init__, shards.merge_frames
    sources = {s for v in shards.SERVER_STATE_FRAMES.values() for s in v}
    current: list[Path] = []  # the task running (tasks run one after the other in a scan in this process)

    def kept_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        current.append(out_dir / str(len(current)))
        current[-1].mkdir(parents=True)
        for name, frame in self._frames.items():
            if isinstance(frame, pl.DataFrame):
                frame.write_ipc(current[-1] / f"{GIVEN}{name}.arrow")

    def kept_built(self, name):
        frame = built(self, name)
        frame.write_ipc(current[-1] / f"{name}.arrow")
        return frame

    def kept_merge(parts, conn_maps, only=None):
        merged = merge(parts, conn_maps, only=only)
        if only is not None and current:  # what MergedShards._built merges
            for name, frame in merged.items():
                if name in sources:
                    frame.write_ipc(current[-1] / f"{SOURCE}{name}.arrow")
        return merged

    shards.MergedShards.__init__, shards.MergedShards._built, shards.merge_frames = kept_init, kept_built, kept_merge
    return main(["scan", *scan_args, "--format", "json", "--output", os.devnull])


# -- one task's detectors on its frames repeated ------------------------------------------------------

def repeated(frame, times: int, span_ns: int, frames_per_copy: int):
    """``frame`` and ``times - 1`` copies after it, each shifted by ``span_ns`` in time and
    ``frames_per_copy`` in frame numbers, its connections, flows and messages numbered apart."""
    import polars as pl

    if times == 1 or frame.height == 0:
        return frame
    copies = []
    for k in range(times):
        shifted = []
        for name, dtype in frame.schema.items():
            if INSTANT_COLUMNS.fullmatch(name) and dtype == pl.Int64:
                shifted.append(pl.col(name) + k * span_ns)
            elif "frame" in name and dtype == pl.UInt32:
                shifted.append(pl.col(name) + k * frames_per_copy)
            elif name in ID_COLUMNS and dtype.is_integer():
                shifted.append(pl.col(name) + k * (int(frame[name].max() or 0) + 1))
        copies.append(frame.with_columns(shifted))
    return pl.concat(copies, rechunk=True)


def measure_task(task_dir: Path, times: int, only: list[str] | None) -> list[dict]:
    """Each of the task's detectors run as ``detectors.detect_merged`` runs them, on its frames
    repeated ``times`` times: its name, seconds, the process's RssAnon (MB) as it began and at its
    highest while it ran, and what it found (findings; of a detector in two steps, its episodes)."""
    import polars as pl

    import detectors
    from analyzer.shards import MergedShards

    packets = pl.read_ipc(task_dir / f"{GIVEN}packets.arrow")
    span_ns = int(packets["ts_ns"].max() - packets["ts_ns"].min()) + COPY_GAP_NS
    per_copy = int(packets["frame"].max()) + 1

    def kept(name: str) -> Path | None:
        for stem in (name, SOURCE + name):
            if (task_dir / f"{stem}.arrow").exists():
                return task_dir / f"{stem}.arrow"
        return None

    class Repeated(MergedShards):
        """The task's frame set, its frames read from what the scan kept and repeated instead of merged
        over shards: built, kept and let go of as in the task."""

        def _merged(self, names):
            return {name: repeated(pl.read_ipc(kept(name)), times, span_ns, per_copy) for name in names}

    names = detectors.partitioned(list(detectors.available()))
    on = [n for n in names if n not in detectors.sharded(names) and (only is None or n in only)]
    read = detectors.server_read_columns(on)
    rows: list[dict] = []
    for name in on:
        module = detectors.available()[name]
        step = "partial" if hasattr(module, "partial") else "detect"
        run = getattr(module, step)

        def watched(*args, _run=run, _name=name, **kwargs):
            t0 = time.perf_counter()
            with AnonPeak(os.getpid()) as anon:
                start = anon.peak
                out = _run(*args, **kwargs)
            found = out.get("episodes", pl.DataFrame()).height if isinstance(out, dict) else out.height
            rows.append({"detector": _name, "seconds": time.perf_counter() - t0, "start_mb": start // 1024,
                         "peak_mb": anon.peak // 1024, "found": found})
            return out

        setattr(module, step, watched)
    given = {"packets": repeated(packets, times, span_ns, per_copy),
             "interfaces": pl.read_ipc(task_dir / f"{GIVEN}interfaces.arrow")}
    detectors.detect_merged(Repeated([], [], read, given, path="", files=(), pieces=()), on)
    return rows


# -- the report ---------------------------------------------------------------------------------------

def _task_label(task_dir: Path) -> str:
    """The task's largest frame and its rows (what server it is)."""
    import polars as pl

    sizes = [(p.stat().st_size, p) for p in task_dir.glob("*.arrow") if not p.name.startswith(GIVEN)]
    if not sizes:
        return "(no frames)"
    _, biggest = max(sizes)
    name = biggest.stem.removeprefix(SOURCE)
    return f"{name} {pl.scan_ipc(biggest).select(pl.len()).collect().item():,} rows"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("capture", nargs="?", help="capture to scan (default: the benchmark's 10M synth capture)")
    ap.add_argument("--partitions", type=int, default=16, help="scan in this many partitions (default 16)")
    ap.add_argument("--times", type=int, default=10, help="repeat each task's frames this many times (default 10)")
    ap.add_argument("--detectors", help="only these server detectors (comma-separated)")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--keep-task-frames", metavar="SCAN_ARGS", help=argparse.SUPPRESS)
    ap.add_argument("--into", help=argparse.SUPPRESS)
    ap.add_argument("--measure-task", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.keep_task_frames:  # child: the scan
        return keep_task_frames(Path(args.into), json.loads(args.keep_task_frames))
    only = args.detectors.split(",") if args.detectors else None
    if args.measure_task:  # child: one task, its allocators set as the scan sets them (before Polars loads)
        from analyzer.memory import configure_polars_allocator, return_freed_memory_promptly

        return_freed_memory_promptly()
        configure_polars_allocator()
        print(json.dumps(measure_task(Path(args.measure_task), args.times, only)))
        return 0
    capture = args.capture
    if capture is None:
        capture = str(ensure_capture(ROOT / ".bench", 10_000_000, 1, "pcap", False)[0])
    me = [sys.executable, str(Path(__file__).resolve())]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = []
    with tempfile.TemporaryDirectory(prefix="herdscope-tasks-") as kept:
        scan = subprocess.run([*me, "--keep-task-frames", json.dumps([capture, "--partitions", str(args.partitions)]),
                               "--into", kept], env=env)
        if scan.returncode not in (0, 1):  # 1: findings
            print(f"the scan failed ({scan.returncode})", file=sys.stderr)
            return 1
        tasks = sorted(Path(kept).iterdir(), key=lambda p: int(p.name))
        if not tasks:
            print(f"no server was cut into shards at --partitions {args.partitions}", file=sys.stderr)
            return 1
        print(f"{capture}: {len(tasks)} cut servers' tasks, frames x{args.times}")
        print(f"{'task (largest frame x1)':<40} {'detector':<18} {'seconds':>8} {'start MB':>9} {'peak MB':>8} "
              f"{'found':>6}")
        for task in tasks:
            label = _task_label(task)
            child = [*me, "--measure-task", str(task), "--times", str(args.times)]
            if args.detectors:
                child += ["--detectors", args.detectors]
            done = subprocess.run(child, env=env, stdout=subprocess.PIPE, text=True)
            if done.returncode:
                print(f"{label:<40} failed ({done.returncode})")
                results.append({"task": label, "failed": done.returncode})
                continue
            for row in json.loads(done.stdout.strip().splitlines()[-1]):
                print(f"{label:<40} {row['detector']:<18} {row['seconds']:8.2f} {row['start_mb']:9d} "
                      f"{row['peak_mb']:8d} {row['found']:6d}")
                results.append({"task": label, **row})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if any("failed" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
