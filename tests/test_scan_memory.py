"""A scan frees what its detectors no longer read (issue 13), and finds exactly the same.

``detectors.run(cap, release=True)`` (what ``herdscope scan`` does) builds every frame the selected
detectors read, narrows ``packets`` to ``detectors.PACKET_COLUMNS`` and drops the builders' memos
(``Capture.release``), and drops each frame after the last detector that reads it. These tests check
that the findings are identical to the plain run on every sample, evaluation capture and the
generated synthetic capture, and what release leaves behind. The memory itself is measured in
``make bench`` (tests/benchmarks/bench.py), not here.
"""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import detectors
from analyzer import open_capture
from detectors.base import PACKET_COLUMNS, CaptureView
from shared_captures import shared_run

ROOT = Path(__file__).parent.parent
CAPTURES = sorted(p for d in (ROOT / "samples", ROOT / "samples" / "eval")
                  for p in d.iterdir() if p.suffix in (".pcap", ".pcapng"))


def _same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.columns == b.columns
    assert a.height == b.height
    assert a.to_dicts() == b.to_dicts()


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_released_scan_finds_exactly_what_the_plain_run_finds(path):
    with open_capture(path) as cap:
        released = detectors.run(cap, release=True)
        assert set(cap.packets.columns) == set(PACKET_COLUMNS)
    _same(released, shared_run(path))


@pytest.mark.parametrize("scenario", ["rocev2-pfc-storm", "rocev2-cnp-ignored"])
def test_released_scan_of_generated_rocev2_captures_is_identical(scenario):
    """RoCEv2 and PFC: their frames read packet columns of their own (ECN bits, MAC Control frames),
    built before packets is narrowed (analyzer.packet_readers)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from rocev2_captures import rocev2_capture

    path = rocev2_capture(scenario)
    with open_capture(path) as cap:
        released = detectors.run(cap, release=True)
    with open_capture(path) as cap:
        plain = detectors.run(cap)
    assert plain.height
    _same(released, plain)


def test_released_scan_of_a_capture_with_frames_built_before_is_identical():
    """Frames built before the scan (diff, the dashboard): before the decoders run, only what reads
    packets is narrowed, not a frame a later builder reads whole (kerberos_ap reads smb2_messages,
    which saturation reads a few columns of)."""
    path = ROOT / "samples" / "smb2-break-queue.pcap"
    with open_capture(path) as cap:
        for name in ("smb2_messages", "smb2_transactions", "tcp_segments"):
            cap.frame(name)
        released = detectors.run(cap, release=True)
    _same(released, shared_run(path))


def test_released_scan_of_the_synthetic_capture_is_identical(synthetic_capture):
    with open_capture(synthetic_capture) as cap:
        released = detectors.run(cap, release=True)
    assert released.height  # the generated capture carries pathologies
    _same(released, shared_run(synthetic_capture))


def test_release_of_one_detector_keeps_only_what_the_report_reads():
    with open_capture(ROOT / "samples" / "dns-ttl-herd.pcap") as cap:
        packets = cap.packets.height
        found = detectors.run(cap, only=["herd"], release=True)
        assert found.height
        # herd's frames are gone after it ran; the reader's frames stay, packets narrowed
        assert "dns_transactions" not in cap.built_frames()
        assert "dns_transactions" in cap.built_names()
        assert cap.packets.columns == list(PACKET_COLUMNS) and cap.packets.height == packets
        assert {"interfaces", "tcp_sack", "icmp_errors"} <= set(cap.built_frames())
        with pytest.raises(RuntimeError, match="release"):
            cap.frame("ldap_messages")  # nothing can be built from the narrowed packets


def test_release_refuses_frames_not_built():
    with open_capture(ROOT / "samples" / "dns-ttl-herd.pcap") as cap:
        with pytest.raises(RuntimeError, match="dns_messages"):
            cap.release(["dns_messages"], PACKET_COLUMNS)


def test_a_detector_sees_only_the_packet_columns_it_may_read():
    with open_capture(ROOT / "samples" / "dns-ttl-herd.pcap") as cap:
        view = CaptureView(cap, "herd", ("packets",))
        assert view.packets.columns == list(PACKET_COLUMNS)
        assert view.frame("packets").columns == list(PACKET_COLUMNS)
        assert "tcp_flags" in cap.packets.columns  # the capture itself is untouched


# A herdscope process: Polars' jemalloc gets analyzer.memory's settings before Polars is loaded, and takes
# them (jemalloc says "Invalid conf pair" on standard error for one it does not know); a setting already
# in the environment is kept; once Polars is loaded it is too late and nothing is set.
_ALLOCATOR = """
import os, sys
from analyzer.memory import POLARS_ALLOCATOR_ENV, configure_polars_allocator
first = configure_polars_allocator()
conf = os.environ.get(POLARS_ALLOCATOR_ENV)
import polars as pl  # which puts its own defaults first (later pairs win in jemalloc)
assert pl.DataFrame({"a": list(range(100000))}).select(pl.col("a").sum()).item() == 4999950000
assert os.environ.get(POLARS_ALLOCATOR_ENV).endswith(conf)
from analyzer.distributed import worker_env
print(first, conf, configure_polars_allocator(), worker_env()[POLARS_ALLOCATOR_ENV])
"""


def _inherited(given: str | None, generations: int) -> str | None:
    """The allocator variable a process started by ``generations`` nested processes that each loaded
    Polars inherits, the first of them given ``given``: Polars' own import writes it, not a stand-in."""
    import os
    import subprocess
    import sys

    from analyzer.memory import POLARS_ALLOCATOR_ENV
    for _ in range(generations):
        env = {k: v for k, v in os.environ.items() if k != POLARS_ALLOCATOR_ENV}
        if given:
            env[POLARS_ALLOCATOR_ENV] = given
        given = subprocess.run([sys.executable, "-c", f"import os, polars; print(os.environ[{POLARS_ALLOCATOR_ENV!r}])"],
                               capture_output=True, text=True, env=env, timeout=120, check=True).stdout.strip()
    return given


# (what the user set, how many processes that loaded Polars started herdscope one after the other)
@pytest.mark.parametrize("given, generations", [(None, 0), ("narenas:3", 0), (None, 1), ("narenas:3", 1), (None, 2)])
def test_polars_allocator_is_configured_before_polars_loads(given, generations):
    """A setting of the user's is kept, the Polars defaults a parent process wrote are not (a scan
    started by a Python pipeline that uses Polars, or by the benchmark, is configured as one from a shell)."""
    import os
    import subprocess
    import sys

    from analyzer.memory import POLARS_ALLOCATOR_ENV, polars_allocator_conf

    env = {k: v for k, v in os.environ.items() if k != POLARS_ALLOCATOR_ENV}
    inherited = _inherited(given, generations)
    if inherited:
        env[POLARS_ALLOCATOR_ENV] = inherited
    assert generations == 0 or inherited != given  # Polars did write its own first
    proc = subprocess.run([sys.executable, "-c", _ALLOCATOR], capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0 and "jemalloc" not in proc.stderr, proc.stderr
    first, conf, again, worker = proc.stdout.split()
    assert (first, again) == ("True", "False")
    assert conf == (given or polars_allocator_conf())
    assert worker == (given or polars_allocator_conf(1))  # a Dask worker's: one thread, one arena
    assert "narenas:" in polars_allocator_conf(4) and "background_thread:true" in polars_allocator_conf()


def test_frames_made_from_frames_alone_build_without_the_memos_or_the_wide_packets():
    """Protocol.from_frames is a promise a scan relies on (analyzer.narrowing.build_frames builds them once the
    memos are let go of): SMB2's breaks built with neither memos nor packets' wide columns are the
    whole build's."""
    from pathlib import Path

    from analyzer import open_capture
    from analyzer.narrowing import build_frames

    path = Path(__file__).parent.parent / "samples" / "smb2-break-queue.pcap"
    with open_capture(path) as whole:
        expected = whole.frame("smb2_breaks")
    with open_capture(path) as cap:
        cap.frame("smb2_messages"), cap.frame("smb2_transactions")
        cap.forget_memos()
        cap.narrow_packets(("frame", "ts_ns"))
        assert cap.frame("smb2_breaks").equals(expected) and expected.height >= 1
    with open_capture(path) as cap:
        build_frames(cap, ["smb2_breaks", "smb2_messages"])  # the breaks after the messages, memos let go of
        assert cap.frame("smb2_breaks").equals(expected) and not cap._memo
