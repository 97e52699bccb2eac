"""A scan's steps on several threads (analyzer.threads, issue 13): the same findings as one after the
other, each frame built once, the results in the order asked, the kernels releasing the GIL."""
from __future__ import annotations

import contextvars
import threading
import time
from pathlib import Path

import polars as pl
import pytest

import detectors
from analyzer import open_capture
from analyzer.capture import FRAME_BUILDERS, frame_builder
from analyzer.jit import KERNEL_OPTIONS, njit
from analyzer.packed_part import copy_records
from analyzer.threads import DEFAULT_MAX_THREADS, THREADS_ENV, at_most, run_each, thread_count
from shared_captures import shared_run

ROOT = Path(__file__).parent.parent
CAPTURES = sorted(p for d in (ROOT / "samples", ROOT / "samples" / "eval")
                  for p in d.iterdir() if p.suffix in (".pcap", ".pcapng"))
SAMPLE = ROOT / "samples" / "smb2-break-queue.pcap"
WAIT_S = 10  # how long a call waits for another that runs at the same time (a failure, not a hang)


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_a_scan_on_one_thread_finds_what_it_finds_on_several(path, monkeypatch):
    """shared_run is a plain run on the default threads (two or more where the machine has the
    cores: the test's own run below makes sure of several); one thread, released as a scan is, finds
    the same, row for row."""
    monkeypatch.setenv(THREADS_ENV, "1")
    with open_capture(path) as cap:
        alone = detectors.run(cap, release=True)
    monkeypatch.setenv(THREADS_ENV, "3")
    with open_capture(path) as cap:
        several = detectors.run(cap, release=True)
    assert alone.to_dicts() == several.to_dicts() == shared_run(path).to_dicts()


def test_the_results_come_in_the_order_asked_whatever_order_the_calls_end_in():
    second_ran = threading.Event()
    finished: list[tuple[int, int]] = []

    def first():
        saw = second_ran.wait(WAIT_S)  # runs only when both calls run at once
        return ("first", saw)

    def second():
        second_ran.set()
        return "second"

    out = run_each([first, second], threads=2, done=lambda i: finished.append((i, threading.get_ident())))
    assert out == [("first", True), "second"]
    assert sorted(finished) == [(0, threading.get_ident()), (1, threading.get_ident())]  # in the calling thread


def test_at_most_holds_the_count_to_it_within_and_in_the_calls_made_from_it(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "3")
    with at_most(1):
        assert thread_count() == 1
        with at_most(2):
            assert thread_count() == 2
        assert thread_count() == 1
    assert thread_count() == 3
    with at_most(2):
        assert run_each([thread_count, thread_count], threads=2) == [2, 2]


def test_a_scan_in_partitions_runs_one_step_at_a_time(monkeypatch):
    """The partitions bound the memory: neither their tasks nor the caller's detectors on the merged
    frames run steps at once (on the 100M synth capture several did took the peak past 4 GB)."""
    import analyzer.threads as threads_module

    monkeypatch.setenv(THREADS_ENV, "3")
    asked: list[int] = []
    real = threads_module.thread_count
    monkeypatch.setattr(threads_module, "thread_count", lambda: asked.append(real()) or asked[-1])
    from analyzer.cli import main

    assert main(["scan", str(SAMPLE), "--partitions", "2", "--quiet"]) in (0, 1)
    assert asked and set(asked) == {1}
    asked.clear()
    assert main(["scan", str(SAMPLE), "--partitions", "1", "--quiet"]) in (0, 1)
    assert asked and set(asked) == {3}


def test_a_bad_thread_count_is_a_usage_error_before_anything_is_read(monkeypatch, capsys):
    from analyzer.cli import main

    monkeypatch.setenv(THREADS_ENV, "two")
    assert main(["scan", str(SAMPLE)]) == 2
    assert THREADS_ENV in capsys.readouterr().err


def test_the_calls_see_the_caller_s_context_variables():
    setting = contextvars.ContextVar("setting", default="default")
    token = setting.set("the caller's")
    try:
        assert run_each([setting.get, setting.get], threads=2) == ["the caller's", "the caller's"]
    finally:
        setting.reset(token)


def test_on_one_thread_the_calls_run_in_order_and_a_failure_stops_the_rest():
    ran: list[int] = []

    def call(i):
        def run():
            ran.append(i)
            if i == 1:
                raise KeyError("one")
            return i
        return run

    with pytest.raises(KeyError, match="one"):
        run_each([call(0), call(1), call(2)], threads=1)
    assert ran == [0, 1]


def test_on_several_threads_the_first_failure_in_order_is_raised():
    both_started = threading.Barrier(2, timeout=WAIT_S)

    def fails(message, delay_s):
        def run():
            both_started.wait()
            time.sleep(delay_s)  # the later call fails first
            raise ValueError(message)
        return run

    with pytest.raises(ValueError, match="earlier"):
        run_each([fails("earlier", 0.2), fails("later", 0.0)], threads=2)


def test_the_thread_count_is_the_environment_s_or_the_cpus_capped(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "5")
    assert thread_count() == 5
    monkeypatch.delenv(THREADS_ENV)
    assert 1 <= thread_count() <= DEFAULT_MAX_THREADS
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ValueError, match=THREADS_ENV):
            thread_count()


def test_a_frame_asked_for_by_threads_at_once_is_built_once():
    builds: list[int] = []
    asked = threading.Barrier(3, timeout=WAIT_S)

    @frame_builder("test_slow_frame")
    def _slow(cap):
        builds.append(1)
        time.sleep(0.3)  # the other threads ask meanwhile
        return pl.DataFrame({"n": [len(builds)]})

    try:
        with open_capture(SAMPLE) as cap:
            def ask():
                asked.wait()
                return cap.frame("test_slow_frame")
            frames = run_each([ask, ask, ask], threads=3)
        assert builds == [1]
        assert all(f is frames[0] for f in frames)
    finally:
        FRAME_BUILDERS.pop("test_slow_frame", None)


def test_kernels_release_the_gil():
    """Every kernel is compiled with KERNEL_OPTIONS (the bare decorator and the one with options)."""
    assert KERNEL_OPTIONS["nogil"] is True
    assert copy_records.targetoptions["nogil"] is True and copy_records._cache.__class__.__name__ != "NullCache"
    assert njit(lambda x: x + 1).targetoptions["nogil"] is True
