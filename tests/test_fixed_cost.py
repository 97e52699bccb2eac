"""The fixed cost of a herdscope process (issue 13): nothing imported that the command does not use.

Each test runs a command in a fresh interpreter and reads what it imported (``sys.modules`` at exit):
``--version`` loads no Polars, NumPy or Numba; ``detectors`` no Numba; ``info`` no ``pyarrow.compute``.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
PCAP_LE = bytes.fromhex("d4c3b2a1")  # a little-endian classic pcap's magic
PCAP_HEADER_BYTES, RECORD_HEADER_BYTES = 24, 16


def _imported(tmp_path: Path, *args: str) -> set[str]:
    """The modules ``herdscope ARGS`` imported, run in a fresh interpreter."""
    out = tmp_path / "modules.json"
    code = ("import json, sys; from analyzer.cli import main; rc = main(sys.argv[2:]); "
            "json.dump(sorted(sys.modules), open(sys.argv[1], 'w')); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(out), *args], capture_output=True, cwd=ROOT, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr.decode()  # 1: a finding reached --fail-on
    return set(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def one_dns_packet(tmp_path_factory) -> Path:
    """The first packet (a DNS query over UDP) of a DNS-only sample, as a one-packet capture."""
    data = (SAMPLES / "dns-ttl-herd.pcap").read_bytes()
    assert data[:4] == PCAP_LE
    start = PCAP_HEADER_BYTES
    caplen = int.from_bytes(data[start + 8:start + 12], "little")
    path = tmp_path_factory.mktemp("one") / "one-dns.pcap"
    path.write_bytes(data[:start + RECORD_HEADER_BYTES + caplen])
    return path


def test_version_loads_no_polars_numpy_or_numba(tmp_path):
    loaded = _imported(tmp_path, "--version")
    assert not {"numba", "polars", "numpy", "pyarrow", "rich"} & loaded


def test_the_detectors_listing_loads_no_numba(tmp_path):
    """Numba is imported when a kernel is first called (analyzer.jit.numba_module), not when the modules
    that define kernels are: the listing imports every detector and calls none (~0.1 s)."""
    loaded = _imported(tmp_path, "detectors")
    assert "detectors.herd" in loaded and not {"numba", "llvmlite"} & loaded


def test_a_kernel_made_before_numba_was_imported_runs_and_pickles(tmp_path):
    """In a fresh interpreter: a kernel module imported without Numba; its first call imports Numba,
    makes the lazy intrinsic (wire's prefetch, which the record walker inlines) and runs."""
    code = ("import sys, pickle, numpy as np; from analyzer.kernels import records as rk, wire; "
            "assert 'numba' not in sys.modules; "
            "buf = np.zeros(64, np.uint8); assert wire.u16be(np.array([1, 2], np.uint8), 0) == 258; "
            "assert 'numba' in sys.modules and callable(wire._prefetch_address); "
            "assert wire.prefetch_until(buf, 0, 200) == 64; "
            "assert pickle.loads(pickle.dumps(wire.u16be)) is wire.u16be; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == b"ok", proc.stderr.decode()


def test_info_of_one_packet_loads_no_pyarrow_compute(tmp_path, one_dns_packet):
    """The reader's nullable columns reach Polars through the Arrow C data interface
    (analyzer.columns.ArrowCArray), not pl.from_arrow, whose pyarrow path imports pyarrow.compute (~40 ms)."""
    loaded = _imported(tmp_path, "info", str(one_dns_packet))
    assert "polars" in loaded and "pyarrow.compute" not in loaded


def _fast_loading() -> bool:
    """Whether kernels load without Numba's compiler work here (analyzer.jit), from a cache kept
    between processes."""
    import analyzer
    from analyzer import jit

    return analyzer.CACHE_KEPT and all(jit.INSTALLED.values())


@pytest.mark.skipif(not _fast_loading(), reason="kernels load the way Numba loads them here")
def test_scan_of_one_packet_loads_no_numba_compiler_registries(tmp_path, one_dns_packet):
    """Kernels loaded from Numba's cache (analyzer.jit) skip the target context's refresh, which imports
    every implementation Numba has (~0.12 s): a scan that compiles nothing loads none of them. The
    decoded DNS names reach Polars through the C data interface too (no pyarrow.compute)."""
    _imported(tmp_path, "scan", str(one_dns_packet), "--fail-on", "critical")  # compiles what is not cached
    loaded = _imported(tmp_path, "scan", str(one_dns_packet), "--fail-on", "critical")
    assert "numba" in loaded
    assert not {"numba.np.random.generator_core", "numba.typed.typeddict", "numba.np.polynomial",
                "numba.experimental.jitclass.base", "pyarrow.compute"} & loaded


def _scan_json(tmp_path: Path, capture: Path, env: dict[str, str], name: str) -> str:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "analyzer", "scan", str(capture), "--format", "json",
                           "--output", str(out), "--fail-on", "critical"], capture_output=True, cwd=ROOT,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()
    return out.read_text()


def test_kernels_loaded_as_numba_loads_them_find_the_same(tmp_path):
    """HERDSCOPE_NUMBA_LOAD=plain leaves the loading to Numba: the escape hatch finds what the fast
    loading finds, byte for byte."""
    import os

    capture = SAMPLES / "smb2-break-queue.pcap"
    env = dict(os.environ)
    env.pop("HERDSCOPE_NUMBA_LOAD", None)
    fast = _scan_json(tmp_path, capture, env, "fast")
    plain = _scan_json(tmp_path, capture, {**env, "HERDSCOPE_NUMBA_LOAD": "plain"}, "plain")
    assert json.loads(fast)["findings"]
    assert fast == plain
