"""Regressions found by an acceptance run of the command line as a new user (issue 11): each test is
one thing that was seen to go wrong, driven through ``main`` (or a subprocess where a real user id,
pipe or terminal width matters)."""
import io
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

from analyzer.cli import ExitCode, main

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
HERD = SAMPLES / "dns-ttl-herd.pcap"  # 616 packets, 3 medium herd findings
BREAK = SAMPLES / "smb2-break-queue.pcap"  # 195 packets, 1 high smb_break_queue finding
ARKIME = ROOT / "tests" / "data" / "arkime-wireshark-smb-on-windows10.pcap"
HERDSCOPE = Path(sys.executable).parent / "herdscope"


def _one_line(err: str) -> str:
    """The single ``herdscope: ...`` or ``Error: ...`` line of a failure, with no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith(("herdscope:", "Error:"))]
    assert len(lines) == 1, err
    return lines[0]


def _argv(command: str, path: Path, tmp_path: Path) -> list[str]:
    return {"info": ["info", str(path)], "stats": ["stats", str(path)],
            "scan": ["scan", "--detectors", "herd", str(path)],
            "export": ["export", str(path), "--out", str(tmp_path / "out"), "--frames", "packets"],
            "show": ["show", "--no-tshark", "0000", str(path)]}[command]


# -- an unreadable file is "could not read the input" (3), never a usage error (2) ---------------------

@pytest.mark.parametrize("command", ["info", "stats", "scan", "export", "show"])
def test_a_file_access_denies_is_left_to_the_reader_not_a_usage_error(command, tmp_path, monkeypatch, capsys):
    """click's own readability check (os.access) made an unreadable capture exit 2 with click's text;
    the reader is the one to say so (exit 3). Here access() denies the capture while open() works (as
    for root): the command must go on and read it."""
    path = tmp_path / "x.pcap"
    path.write_bytes(ARKIME.read_bytes())
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(path) else real_access(p, mode, **kw))
    code = main(_argv(command, path, tmp_path))
    err = capsys.readouterr().err
    assert "not readable" not in err
    # show's id 0000 is no finding of this file: that (and only that) is its usage error
    assert code == (ExitCode.USAGE if command == "show" else ExitCode.OK), err
    if command == "show":
        assert "no finding 0000" in _one_line(err)


def _nobody_can_run_the_checkout() -> str | None:
    """Why the uid-65534 test cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to switch to uid 65534 (as non-root, an unreadable file is the same test with chmod)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(HERDSCOPE),
                            "--version"], capture_output=True, text=True, env={**os.environ, "HOME": "/nonexistent"})
    if probe.returncode != 0:
        return "uid 65534 cannot read this checkout or its venv"
    return None


@pytest.mark.skipif(_nobody_can_run_the_checkout() is not None, reason=str(_nobody_can_run_the_checkout()))
@pytest.mark.parametrize("command", ["info", "scan", "show"])
def test_an_unreadable_file_exits_3_as_a_real_unprivileged_user(command, tmp_path):
    tmp_path.chmod(0o755)
    path = tmp_path / "unreadable.pcap"
    path.write_bytes(ARKIME.read_bytes())
    path.chmod(0)
    argv = _argv(command, path, tmp_path)
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(HERDSCOPE), *argv],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HOME": "/nonexistent"})
    assert done.returncode == ExitCode.UNREADABLE, done.stderr
    assert _one_line(done.stderr) == f"herdscope: {path}: permission denied"


# -- selection values that are no point in time --------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--start", "inf"], "finite"), (["--start", "1e400"], "finite"), (["--end", "nan"], "finite"),
    (["--start", "5", "--end", "1"], "before --start"),
    (["--start", "2026-11-29T18:31:00Z", "--end", "2026-11-29T18:30:00Z"], "before --start"),
])
@pytest.mark.parametrize("command", ["scan", "stats"])
def test_a_selection_that_is_no_time_is_a_usage_error(command, args, words, capsys):
    assert main([command, str(HERD), *args]) == ExitCode.USAGE
    assert words in _one_line(capsys.readouterr().err)


def test_a_time_beyond_what_a_timestamp_holds_selects_all_or_nothing(capsys):
    """1e300 s after the first packet (a float overflow once in ns) and year 9999 (beyond Int64 ns)."""
    import json

    for args, kept in ((["--start", "1e300"], 0), (["--end", "1e300"], 616), (["--start", "9999-12-31T00:00:00Z"], 0),
                       (["--end", "0001-01-01"], 0)):
        assert main(["stats", "--format", "json", str(HERD), *args]) == ExitCode.OK
        doc = json.loads(capsys.readouterr().out)
        assert doc["selection"]["packets_selected"] == kept and doc["selection"]["packets_total"] == 616


# -- help texts ----------------------------------------------------------------------------------------

def _help(command: str, capsys) -> str:
    assert main([command, "--help"]) == ExitCode.OK
    return capsys.readouterr().out


@pytest.mark.parametrize("command, codes", [
    ("scan", {0, 1, 2, 3, 4, 130, 141, 143}), ("show", {0, 2, 3, 4, 130, 141, 143}),
    ("info", {0, 2, 3, 4, 130, 141, 143}), ("stats", {0, 2, 3, 4, 130, 141, 143}),
    ("export", {0, 2, 3, 4, 130, 141, 143}), ("detectors", {0, 2, 4, 130, 141, 143}),
])
def test_help_lists_exactly_the_exit_codes_a_command_returns(command, codes, capsys):
    text = _help(command, capsys)
    block = text[text.index("Exit codes:"):text.index("Options:")]
    listed = {int(n) for n in re.findall(r"(?m)^\s+(\d+)\s\s", block)} | {int(n) for n in re.findall(r";\s(\d+)\s", block)}
    assert listed == codes, block


@pytest.mark.parametrize("command", ["scan", "show", "info", "stats", "export", "detectors", "dashboard"])
def test_help_never_sends_the_user_into_a_source_file(command, capsys):
    assert not re.search(r"\b[\w/]+\.py\b", _help(command, capsys))


# -- show on a pipe: tshark cannot read it again -------------------------------------------------------

@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_show_says_why_a_piped_capture_has_no_tshark_summary(tmp_path, monkeypatch, capsys):
    from detectors.show import tshark_summaries

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    record = {"evidence": [{"file": "-", "frames": [1, 2]}, {"file": str(fifo), "frames": [3]},
                           {"file": str(BREAK), "frames": [81]}]}
    out = tshark_summaries(record)  # must not open the FIFO (nobody writes it: that would hang)
    assert [o["lines"] for o in out[:2]] == [[], []]
    assert all("pipe" in o["note"] for o in out[:2])
    assert len(out[2]["lines"]) == 1 and "SMB2" in out[2]["lines"][0] and out[2]["note"] is None


# -- export and --config -------------------------------------------------------------------------------

@pytest.mark.parametrize("frames", ["", ",", " , "])
def test_export_with_no_frame_named_is_a_usage_error_before_anything_is_written(frames, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", str(ARKIME), "--out", str(out), "--frames", frames]) == ExitCode.USAGE
    assert "--frames" in _one_line(capsys.readouterr().err) and not out.exists()


def test_export_lines_up_long_frame_names(tmp_path, capsys):
    assert main(["export", str(ARKIME), "--out", str(tmp_path / "o"), "--frames",
                 "packets,kerberos_transactions"]) == ExitCode.OK
    lines = [line for line in capsys.readouterr().err.splitlines() if " rows " in line]
    assert len(lines) == 2 and len({line.index(" rows ") for line in lines}) == 1


def test_a_config_that_is_not_toml_names_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[herd\n")
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads(bad.read_text())
    assert main(["scan", "--config", str(bad), str(HERD)]) == ExitCode.USAGE
    line = _one_line(capsys.readouterr().err)
    assert f"--config {bad}: not valid TOML" in line


# -- herdscope detectors at 80 columns -----------------------------------------------------------------

def _listing(width: int) -> str:
    from detectors import describe
    from detectors.listing import print_detectors

    buf = io.StringIO()
    print_detectors(describe(), Console(file=buf, width=width, highlight=False, color_system=None))
    return buf.getvalue()


def test_detectors_listing_is_readable_at_80_columns():
    from detectors import describe

    text = _listing(80)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    for d in describe():
        for p in d["parameters"]:
            # each parameter starts its own line with its default, and its meaning is not cut into a
            # narrow column: the first 30 characters of it stand on one line
            assert any(line.strip().startswith(f"{p['name']} = {p['default']}") for line in lines), p["name"]
            head = p["help"][:30].rsplit(" ", 1)[0]
            assert head in text, (p["name"], head)


def test_detectors_listing_is_a_table_on_a_wide_terminal():
    text = _listing(160)
    assert re.search(r"parameter\s+default\s+unit\s+range\s+gate\s+meaning", text)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 160


# -- what ships in samples/ ----------------------------------------------------------------------------

def test_every_capture_in_samples_is_in_its_manifest():
    listed = {c["file"] for c in tomllib.loads((SAMPLES / "MANIFEST.toml").read_text())["capture"]}
    shipped = {p.name for p in SAMPLES.iterdir() if re.search(r"\.(pcap|pcapng)(\.gz)?$", p.name)}
    assert shipped == listed, shipped ^ listed


def test_the_samples_readme_names_the_capture_make_demo_reads():
    demo = re.search(r"(?m)^DEMO_CAPTURE \?= samples/(\S+)$", (ROOT / "Makefile").read_text()).group(1)
    readme = (SAMPLES / "README.md").read_text()
    assert f"`make demo` reads `{demo}`" in readme and "demo.pcap" not in readme


def test_info_says_one_byte_not_bytes(tmp_path, capsys):
    """A capture with one stray byte after its last record: "1 byte not read"."""
    path = tmp_path / "stray.pcap"
    path.write_bytes(ARKIME.read_bytes() + b"\x00")
    assert main(["info", str(path)]) == ExitCode.OK
    out = " ".join(capsys.readouterr().out.split())
    assert "; 1 byte not read" in out and "1 bytes" not in out
