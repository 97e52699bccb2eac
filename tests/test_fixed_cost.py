"""The fixed cost of a herdscope process (issue 13): nothing imported that the command does not use.

Each test runs a command in a fresh interpreter and reads what it imported (``sys.modules`` at exit):
``--version`` loads no Polars, NumPy or Numba; ``info`` loads no ``pyarrow.compute``.
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
