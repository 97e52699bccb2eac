"""The herdscope command: exit codes, info (table and JSON), export."""
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analyzer.cli import ExitCode, main
from builders import ethernet, ipv4, pcap_file, tcp

# a third-party Arkime capture (Apache-2.0; tests/data/README.md says where it comes from)
DEMO = Path(__file__).parent / "data" / "arkime-wireshark-smb-on-windows10.pcap"
INFO_KEYS = {"file", "format", "compressed", "file_size", "packets", "bytes", "wire_bytes", "first_ts", "last_ts",
             "first_time", "last_time", "duration_s", "ts_resolution_ns", "link_types", "interfaces", "protocols",
             "parse_status", "skipped", "damage", "events", "tcp", "decode_damage",
             "effective_resolution_ns", "effective_resolution_samples"}


def test_info_json_has_the_documented_keys(capsys):
    assert main(["info", "--format", "json", str(DEMO)]) == ExitCode.OK
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == INFO_KEYS
    assert doc["packets"] == 125 and doc["link_types"] == [{"linktype": 1, "name": "Ethernet", "packets": 125}]
    assert doc["first_ts"] == 1476605363990103000 and doc["first_time"] == "2016-10-16T08:09:23.990103000Z"
    assert doc["protocols"]["tcp"]["smb"] == 90 and doc["skipped"] == {"total": 0, "reasons": {}}
    assert doc["tcp"]["connections"] == 8 and doc["tcp"]["states"]["SF"] == 2
    assert doc["decode_damage"] == {}  # nothing kept damaged (see test_rocev2_decoder, test_mac_control)


def test_info_table_on_a_damaged_file_reports_the_damage(tmp_path, capsys):
    whole = pcap_file([(1, 0, ethernet(ipv4(tcp(b"a")))), (2, 0, ethernet(ipv4(tcp(b"b"))))])
    path = tmp_path / "cut.pcap"
    path.write_bytes(whole[:-10])
    assert main(["info", str(path)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "cut short" in out and "Packets:" in out and "1 (cut short last record 1)" in out


def test_unreadable_input_exits_3_with_one_line(tmp_path, capsys):
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"not a capture at all")
    assert main(["info", str(bad), str(tmp_path / "missing.pcap")]) == ExitCode.UNREADABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("herdscope: ") for line in err)


@pytest.mark.parametrize("argv", [["info"], ["frobnicate"], ["info", "--format", "xml", str(DEMO)],
                                  ["export", str(DEMO)]])
def test_usage_errors_exit_2(argv):
    assert main(argv) == ExitCode.USAGE


def test_help_lists_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Exit codes" in out and "3  unreadable input" in out


def test_export_writes_every_frame_as_parquet_with_a_schema(tmp_path):
    out = tmp_path / "out"
    assert main(["export", str(DEMO), "--out", str(out)]) == ExitCode.OK
    packets = pl.read_parquet(out / "packets.parquet")
    assert packets.height == 125 and packets["src"].dtype in (pl.Enum, pl.Categorical, pl.String)
    for name in ("tcp_segments", "connections", "interfaces", "tcp_sack", "icmp_errors"):
        assert (out / f"{name}.parquet").exists()
    schema = json.loads((out / "schema.json").read_text())
    assert schema["packets"]["ts_ns"]["description"].startswith("capture timestamp")
    assert json.loads((out / "read_report.json").read_text())["records"] == 125


def test_export_selected_frames_and_unknown_frame(tmp_path):
    out = tmp_path / "o"
    assert main(["export", str(DEMO), "--out", str(out), "--frames", "packets"]) == ExitCode.OK
    assert sorted(p.name for p in out.glob("*.parquet")) == ["packets.parquet"]
    assert main(["export", str(DEMO), "--out", str(out), "--frames", "nope"]) == ExitCode.USAGE


def test_console_script_exit_code_in_a_subprocess(tmp_path):
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"\x00" * 30)
    proc = subprocess.run([sys.executable, "-m", "analyzer", "info", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 3 and "not a pcap or pcapng" in proc.stderr


def test_every_exported_column_has_a_description(tmp_path):
    out = tmp_path / "o"
    assert main(["export", str(DEMO), "--out", str(out)]) == ExitCode.OK
    schema = json.loads((out / "schema.json").read_text())
    missing = [f"{frame}.{col}" for frame, cols in schema.items() for col, spec in cols.items()
               if not spec["description"]]
    assert missing == []


def test_a_panic_in_polars_is_an_internal_error_not_findings(monkeypatch, capsys):
    """Polars' Rust panics arrive as pyo3's PanicException, a BaseException: the CLI says it is a bug
    (exit 4, the traceback kept) instead of letting Python exit 1, which means "findings"."""
    from detectors import scan_command

    def panics(*args, **kwargs):
        raise pl.exceptions.PanicException("assertion failed: i < self.len()")

    monkeypatch.setattr(scan_command, "scan", panics)
    assert main(["scan", str(Path(__file__).resolve().parents[1] / "samples" / "dns-ttl-herd.pcap")]) == ExitCode.INTERNAL == 4
    err = capsys.readouterr().err
    assert "PanicException" in err and "internal error" in err
