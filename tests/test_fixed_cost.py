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
