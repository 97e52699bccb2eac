"""Hostile and unusual inputs through every command (issue 11): the exit code, one line on standard
error and no traceback; damaged gzip kept as tshark keeps it; pipes, FIFOs and standard input; outputs
checked before the work; a closed standard output; an unwritable Numba cache; several files joined.

Damaged inputs are built in tmp_path from small files in samples/ (the originals are never modified).
"""
import gzip
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from analyzer.cli import ExitCode, main
from builders import ethernet, ipv4, pcap_file, udp

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
DEMO = ROOT / "tests" / "data" / "arkime-wireshark-smb-on-windows10.pcap"  # 125 packets (Arkime, Apache-2.0)
HERD = SAMPLES / "dns-ttl-herd.pcap"  # 616 packets (pcap, µs)
PCAPNG = SAMPLES / "dns-retry-storm.pcapng"  # 270 KB pcapng
COMMANDS = ("info", "stats", "scan", "export")


def _argv(command: str, path, tmp_path) -> list[str]:
    argv = [command, str(path)]
    return argv + ["--out", str(tmp_path / "export-out")] if command == "export" else argv


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("herdscope: "), err
    return lines[0]


# --- inputs that cannot be read: exit 3 and the real cause -----------------------------------------

def _cut10(tmp):
    path = tmp / "cut10.pcap"
    path.write_bytes(HERD.read_bytes()[:10])
    return path, "the file header is cut short (10 of 24 bytes)"


def _bad_shb(tmp):
    data = bytearray(PCAPNG.read_bytes())
    data[8:12] = b"XXXX"  # the byte-order magic
    path = tmp / "bad-shb.pcapng"
    path.write_bytes(bytes(data))
    return path, "byte-order magic is 58 58 58 58"


def _bogus_block_length(tmp):
    data = bytearray(PCAPNG.read_bytes())
    shb_len = struct.unpack_from("<I", data, 4)[0]
    idb_len = struct.unpack_from("<I", data, shb_len + 4)[0]
    first_packet_block = shb_len + idb_len
    struct.pack_into("<I", data, first_packet_block + 4, 0x7FFFFF00)
    path = tmp / "bogus-length.pcapng"
    path.write_bytes(bytes(data))
    return path, "0x7fffff00"


def _caplen_rules_out_every_record(tmp):
    # every record claims more bytes than a record can hold (the header's snaplen is 65535)
    records = [(k, 0, ethernet(ipv4(udp(b"x" * 20)))) for k in range(3)]
    data = bytearray(pcap_file(records, snaplen=65535))
    struct.pack_into("<I", data, 24 + 8, 1 << 30)
    path = tmp / "caplen.pcap"
    path.write_bytes(bytes(data))
    return path, "could not read the input"


def _bad_pcapng_version(tmp):
    data = bytearray(PCAPNG.read_bytes())
    struct.pack_into("<H", data, 12, 2)  # major version 2
    path = tmp / "version2.pcapng"
    path.write_bytes(bytes(data))
    return path, "version 2.0"


def _cut_inside_first_block(tmp):
    path = tmp / "cut20.pcapng"
    path.write_bytes(PCAPNG.read_bytes()[:20])
    return path, "cut short: 20 of its"


def _directory(tmp):
    path = tmp / "a-directory.pcap"
    path.mkdir()
    return path, "is a directory"


def _missing(tmp):
    return tmp / "missing.pcap", "no such file"


def _empty(tmp):
    path = tmp / "empty.pcap"
    path.write_bytes(b"")
    return path, "empty file"


def _not_a_capture(tmp):
    path = tmp / "notes.txt"
    path.write_bytes(b"hello, this is not a capture\n")
    return path, "not a pcap or pcapng capture (starts with 68 65 6c 6c)"


UNREADABLE = [_cut10, _bad_shb, _bad_pcapng_version, _bogus_block_length, _caplen_rules_out_every_record,
              _cut_inside_first_block, _directory, _missing, _empty, _not_a_capture]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("make", UNREADABLE, ids=lambda f: f.__name__.strip("_"))
def test_unreadable_input_exits_3_with_the_cause_on_one_line(tmp_path, capsys, command, make):
    path, cause = make(tmp_path)
    assert main(_argv(command, path, tmp_path)) == ExitCode.UNREADABLE
    line = _one_line_error(capsys.readouterr().err)
    assert cause in line and str(path) in line


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_that_cannot_be_opened_exits_3(tmp_path, capsys, monkeypatch, command):
    """Permission denied (faked: the suite may run as root, whom no mode bit stops)."""
    from analyzer import source

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(source, "open", denied, raising=False)
    assert main(_argv(command, DEMO, tmp_path)) == ExitCode.UNREADABLE
    assert f"{DEMO}: permission denied" == _one_line_error(capsys.readouterr().err).removeprefix("herdscope: ")


def test_no_room_for_the_temporary_copy_of_a_pipe_exits_3(monkeypatch, capsys):
    import tempfile

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    monkeypatch.setattr(sys, "stdin", _Stdin(DEMO.read_bytes()))
    assert main(["info", "-"]) == ExitCode.UNREADABLE
    line = _one_line_error(capsys.readouterr().err)
    assert "No space left on device" in line and "TMPDIR" in line


def test_a_cut_pcap_header_is_not_called_a_foreign_format(tmp_path, capsys):
    path, _ = _cut10(tmp_path)
    assert main(["info", str(path)]) == ExitCode.UNREADABLE
    assert "not a pcap" not in capsys.readouterr().err


def test_a_bogus_block_length_is_not_called_cut_short(tmp_path, capsys):
    path, _ = _bogus_block_length(tmp_path)
    assert main(["info", str(path)]) == ExitCode.UNREADABLE
    line = _one_line_error(capsys.readouterr().err)
    assert "cannot be right" in line and "cut short" not in line and "269,904 bytes follow" in line


def test_zero_packets_from_a_whole_capture_is_not_an_error(tmp_path, capsys):
    path = tmp_path / "header-only.pcap"
    path.write_bytes(pcap_file([]))
    assert main(["info", "--format", "json", str(path)]) == ExitCode.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["packets"] == 0 and doc["damage"] is None


def test_one_unreadable_file_does_not_stop_the_others(tmp_path, capsys):
    path, _ = _directory(tmp_path)
    assert main(["info", "--format", "json", str(path), str(DEMO)]) == ExitCode.UNREADABLE
    out, err = capsys.readouterr()
    assert json.loads(out)["packets"] == 125
    _one_line_error(err)


# --- damaged gzip: keep what decompressed, report the damage ----------------------------------------

def _bad_crc(tmp):
    packed = bytearray(gzip.compress(HERD.read_bytes()))
    packed[-8] ^= 0xFF  # the CRC32 of the trailer
    path = tmp / "bad-crc.pcap.gz"
    path.write_bytes(bytes(packed))
    return path


def _corrupt_middle(tmp):
    packed = bytearray(gzip.compress(HERD.read_bytes()))
    middle = len(packed) // 2
    packed[middle:middle + 16] = bytes(16)
    path = tmp / "corrupt-middle.pcap.gz"
    path.write_bytes(bytes(packed))
    return path


def _info(path, capsys) -> dict:
    assert main(["info", "--format", "json", str(path)]) == ExitCode.OK
    return json.loads(capsys.readouterr().out)


def test_gzip_with_a_bad_crc_keeps_every_packet_and_reports_the_damage(tmp_path, capsys):
    doc = _info(_bad_crc(tmp_path), capsys)
    assert doc["packets"] == 616 and doc["compressed"]
    assert "gzip stream is damaged" in doc["damage"]["reason"] and "incorrect data check" in doc["damage"]["reason"]


def test_gzip_corrupt_in_the_middle_keeps_the_packets_before_the_damage(tmp_path, capsys):
    doc = _info(_corrupt_middle(tmp_path), capsys)
    assert 0 < doc["packets"] < 616
    assert "gzip stream is damaged" in doc["damage"]["reason"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("make", [_bad_crc, _corrupt_middle], ids=["bad_crc", "corrupt_middle"])
def test_damaged_gzip_is_read_by_every_command(tmp_path, capsys, command, make):
    code = main(_argv(command, make(tmp_path), tmp_path))
    assert code in (ExitCode.OK, ExitCode.FINDINGS)
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
@pytest.mark.parametrize("make", [_bad_crc, _corrupt_middle], ids=["bad_crc", "corrupt_middle"])
def test_damaged_gzip_reads_as_many_packets_as_tshark(tmp_path, capsys, make):
    path = make(tmp_path)
    proc = subprocess.run(["tshark", "-n", "-r", str(path), "-T", "fields", "-e", "frame.number"],
                          capture_output=True, text=True)
    assert proc.stdout.split()
    assert _info(path, capsys)["packets"] == len(proc.stdout.split())


def test_scan_warns_about_gzip_damage(tmp_path, capsys):
    doc, err = _scan_json([str(_bad_crc(tmp_path))], capsys)
    assert doc["captures"][0]["packets"] == 616
    assert any("gzip stream is damaged" in w for w in doc["captures"][0]["warnings"])
    assert "gzip stream is damaged" in doc["captures"][0]["damage"][0]["reason"]
    assert "herdscope: warning:" in err and "gzip stream is damaged" in err


@pytest.mark.parametrize("tail,expected_damage", [(b"\0" * 100, ""), (None, "")], ids=["trailing_zeros", "two_members"])
def test_whole_gzip_variants_read_clean(tmp_path, capsys, tail, expected_damage):
    raw = DEMO.read_bytes()
    packed = gzip.compress(raw) + tail if tail else gzip.compress(raw[:1000]) + gzip.compress(raw[1000:])
    path = tmp_path / "x.pcap.gz"
    path.write_bytes(packed)
    doc = _info(path, capsys)
    assert doc["packets"] == 125 and doc["damage"] is None


def test_a_gzip_that_is_not_gzip_at_all_exits_3(tmp_path, capsys):
    path = tmp_path / "x.pcap.gz"
    path.write_bytes(b"\x1f\x8bnot really gzip")
    assert main(["info", str(path)]) == ExitCode.UNREADABLE
    assert "not a readable gzip file" in _one_line_error(capsys.readouterr().err)


# --- pipes, FIFOs, standard input -------------------------------------------------------------------

class _Stdin:
    def __init__(self, data: bytes):
        self.buffer = io.BufferedReader(io.BytesIO(data))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_every_command_reads_standard_input_as_dash(tmp_path, capsys, monkeypatch, command, packed):
    data = DEMO.read_bytes()
    monkeypatch.setattr(sys, "stdin", _Stdin(gzip.compress(data) if packed else data))
    code = main(_argv(command, "-", tmp_path))
    out, err = capsys.readouterr()
    assert code in (ExitCode.OK, ExitCode.FINDINGS), err
    assert "empty" not in err
    if command == "info":
        assert "125" in out
    if command == "export":
        import polars as pl
        assert pl.read_parquet(tmp_path / "export-out" / "packets.parquet").height == 125


def test_empty_standard_input_says_nothing_arrived(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _Stdin(b""))
    assert main(["info", "-"]) == ExitCode.UNREADABLE
    assert "nothing arrived" in _one_line_error(capsys.readouterr().err)


def test_a_pipe_is_read_in_bounded_pieces(monkeypatch):
    from analyzer import source

    sizes = []

    class Recording(io.RawIOBase):
        def __init__(self, data):
            self.inner = io.BytesIO(data)

        def readable(self):
            return True

        def read(self, n=-1):
            sizes.append(n)
            return self.inner.read(n)

    monkeypatch.setattr(source, "PIECE_BYTES", 4096)
    monkeypatch.setattr(sys, "stdin", type("S", (), {"buffer": Recording(HERD.read_bytes())})())
    data = source.open_bytes("-")
    try:
        assert len(data.buf) == HERD.stat().st_size and data.spilled
        assert max(sizes) <= 4096 and -1 not in sizes
    finally:
        data.close()


def _run(args, **kwargs):
    return subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True, cwd=ROOT, **kwargs)


def test_dev_stdin_and_a_piped_stdin_in_a_real_process(tmp_path):
    for arg in ("-", "/dev/stdin"):
        with open(DEMO, "rb") as stdin:
            proc = _run(["info", "--format", "json", arg], stdin=stdin)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["packets"] == 125


def test_a_fifo_is_read(tmp_path):
    fifo = tmp_path / "capture.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(DEMO.read_bytes()))
    writer.start()
    try:
        proc = _run(["info", "--format", "json", str(fifo)], timeout=120)
    finally:
        writer.join(timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["packets"] == 125


@pytest.mark.skipif(shutil.which("bash") is None, reason="process substitution needs bash")
def test_process_substitution_is_read():
    proc = subprocess.run(["bash", "-c", f'"{sys.executable}" -m analyzer info --format json <(cat "{DEMO}")'],
                          capture_output=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["packets"] == 125


# --- outputs are checked before the work -----------------------------------------------------------

@pytest.fixture
def no_reading(monkeypatch):
    """Fail the test if a capture is opened."""
    import analyzer.capture

    def forbidden(*args, **kwargs):
        raise AssertionError("the capture was read before the output was checked")

    monkeypatch.setattr(analyzer.capture, "open_captures", forbidden)


@pytest.mark.parametrize("output,cause", [
    ("/nonexistent/dir/x.json", "does not exist"),
    (".", "is a directory"),
])
def test_scan_output_that_cannot_be_written_exits_2_before_reading(no_reading, capsys, output, cause):
    assert main(["scan", str(HERD), "--format", "json", "--output", output]) == ExitCode.USAGE
    assert cause in _one_line_error(capsys.readouterr().err)


def test_export_out_under_a_file_exits_2_before_reading(no_reading, capsys):
    assert main(["export", str(DEMO), "--out", str(DEMO / "sub")]) == ExitCode.USAGE
    assert "is not a directory" in _one_line_error(capsys.readouterr().err)


def test_scan_output_in_a_real_process_has_no_traceback(tmp_path):
    proc = _run(["scan", str(HERD), "--format", "json", "--output", "/nonexistent/dir/x.json"], timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1 and b"Traceback" not in proc.stderr


# --- a closed standard output -----------------------------------------------------------------------

@pytest.mark.parametrize("args", [["info", str(DEMO), str(HERD)], ["scan", str(HERD)],
                                  ["stats", str(HERD)], ["info", "--format", "json", str(DEMO)]])
def test_closed_stdout_stops_quietly_with_141(args):
    proc = subprocess.Popen([sys.executable, "-m", "analyzer", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # nobody will read: the first write meets a closed pipe
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.BROKEN_PIPE == 141
    assert err == b""


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("head") is None, reason="needs bash and head")
def test_head_minus_1_on_several_files():
    files = " ".join(f'"{p}"' for p in (DEMO, HERD, SAMPLES / "smb2-toctou.pcap"))
    proc = subprocess.run(["bash", "-c", f'set -o pipefail; "{sys.executable}" -m analyzer info {files} | head -1'],
                          capture_output=True, cwd=ROOT, timeout=300)
    assert proc.stdout.count(b"\n") == 1 and proc.stderr == b""
    assert proc.returncode == 141


# --- several files ---------------------------------------------------------------------------------

def _scan_json(args, capsys) -> tuple[dict, str]:
    code = main(["scan", "--format", "json", *args])
    out, err = capsys.readouterr()
    assert code in (ExitCode.OK, ExitCode.FINDINGS), err
    return json.loads(out), err


def test_the_same_file_twice_is_read_once_with_a_warning(tmp_path, capsys):
    link = tmp_path / "link.pcap"
    link.symlink_to(HERD)
    doc, err = _scan_json([str(HERD), str(HERD), str(link)], capsys)
    capture = doc["captures"][0]
    assert capture["packets"] == 616  # not 1848
    assert len(capture["warnings"]) == 2 and "given twice" in capture["warnings"][0]
    assert err.count("herdscope: warning:") == 2 and "Traceback" not in err


def test_a_copy_of_a_file_is_read_once_with_a_warning(tmp_path, capsys):
    copy = tmp_path / "copy.pcap"
    shutil.copyfile(HERD, copy)
    doc, _ = _scan_json([str(HERD), str(copy)], capsys)
    assert doc["captures"][0]["packets"] == 616
    assert "the same packets" in doc["captures"][0]["warnings"][0]


def _piece(tmp_path, name, seconds):
    path = tmp_path / name
    path.write_bytes(pcap_file([(s, 0, ethernet(ipv4(udp(b"q" * 8), ident=s))) for s in seconds]))
    return str(path)


def test_pieces_that_follow_each_other_give_no_warning(tmp_path, capsys):
    a = _piece(tmp_path, "a.pcap", range(1000, 1010))
    b = _piece(tmp_path, "b.pcap", range(1010, 1020))
    doc, err = _scan_json([b, a], capsys)
    assert doc["captures"][0]["packets"] == 20 and doc["captures"][0]["warnings"] == []
    assert "warning" not in err


def test_a_gap_between_pieces_is_warned(tmp_path, capsys):
    a = _piece(tmp_path, "a.pcap", range(1000, 1010))
    c = _piece(tmp_path, "c.pcap", range(1040, 1050))  # 31 s after a's last packet; 1 s silences inside
    doc, err = _scan_json([a, c], capsys)
    warnings = doc["captures"][0]["warnings"]
    assert len(warnings) == 1 and "no packets for 31.000 s" in warnings[0] and "missing" in warnings[0]
    assert "herdscope: warning: no packets for 31.000 s" in err


def test_overlapping_pieces_are_warned(tmp_path, capsys):
    a = _piece(tmp_path, "a.pcap", range(1000, 1010))
    d = _piece(tmp_path, "d.pcap", range(1005, 1015))
    doc, _ = _scan_json([a, d], capsys)
    warnings = doc["captures"][0]["warnings"]
    assert doc["captures"][0]["packets"] == 20
    assert len(warnings) == 1 and "starts 4.000 s before" in warnings[0] and "overlap" in warnings[0]


def test_separate_files_give_no_join_warnings(tmp_path, capsys):
    a = _piece(tmp_path, "a.pcap", range(1000, 1010))
    c = _piece(tmp_path, "c.pcap", range(1040, 1050))
    doc, _ = _scan_json(["--separate", a, c], capsys)
    assert [c["warnings"] for c in doc["captures"]] == [[], []]


# --- --help, --version and an unwritable Numba cache ------------------------------------------------

def test_help_and_version_load_no_kernel():
    code = ("import sys; from analyzer.cli import main; rc = main(sys.argv[1:]); "
            "assert 'numba' not in sys.modules, 'numba was imported'; sys.exit(rc)")
    for flag in ("--help", "--version"):
        proc = subprocess.run([sys.executable, "-c", code, flag], capture_output=True, cwd=ROOT, timeout=60)
        assert proc.returncode == 0, proc.stderr


def _unwritable_env(tmp_path) -> dict:
    """HOME and NUMBA_CACHE_DIR where nothing can be created, even by root: under a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "NUMBA_CACHE_DIR")}
    env.update(HOME=str(blocker), NUMBA_CACHE_DIR=str(blocker / "numba"), TMPDIR=str(tmp_path))
    return env


# Imports every module holding @njit(cache=True) kernels: with no cache locator Numba raises
# "cannot cache function ...: no locator available" right here, before anything is compiled.
IMPORT_ALL_KERNELS = ("import analyzer, analyzer.ingest, analyzer.tcp, analyzer.decoders.registry, "
                      "analyzer.messages, detectors; detectors.describe(); print(analyzer.CACHE_NOTICE)")


def test_unwritable_home_and_numba_cache_dir(tmp_path):
    """As whoever runs the suite (root in CI): HOME and NUMBA_CACHE_DIR cannot be written."""
    env = _unwritable_env(tmp_path)
    for args in (["--help"], ["--version"], ["info", str(tmp_path / "a-file")]):
        proc = subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True, cwd=ROOT,
                              env=env, timeout=300)
        err = proc.stderr.decode()
        assert proc.returncode == (3 if args[0] == "info" else 0), err
        assert "Traceback" not in err and err.count("\n") <= 2  # at most the notice and the error
    proc = subprocess.run([sys.executable, "-c", IMPORT_ALL_KERNELS], capture_output=True, cwd=ROOT, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr


def _read_only_checkout_cmd() -> list[str]:
    """A mount namespace where the checkout is read-only, so even root cannot write the in-tree
    __pycache__ (what a user meets with an installed, root-owned package)."""
    return ["unshare", "--mount", "sh", "-c", f'mount --bind -o ro "{ROOT}" "{ROOT}" && exec "$0" "$@"']


def _can_make_read_only_checkout() -> str:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare(1) to mount the checkout read-only"
    probe = subprocess.run(_read_only_checkout_cmd() + ["true"], capture_output=True)
    return "" if probe.returncode == 0 else f"cannot make a mount namespace here: {probe.stderr.decode().strip()}"


@pytest.mark.skipif(bool(_can_make_read_only_checkout()), reason=_can_make_read_only_checkout() or "n/a")
def test_no_writable_cache_anywhere_falls_back_with_one_notice(tmp_path):
    env = _unwritable_env(tmp_path)
    proc = subprocess.run(_read_only_checkout_cmd() + [sys.executable, "-c", IMPORT_ALL_KERNELS],
                          capture_output=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    notice = proc.stdout.decode().strip()
    assert notice.startswith("NUMBA_CACHE_DIR=") and str(tmp_path / "herdscope-numba-") in notice
    # through the command line: one notice line, then the command's own one-line error
    proc = subprocess.run(_read_only_checkout_cmd() + [sys.executable, "-m", "analyzer", "info",
                                                       str(tmp_path / "a-file")],
                          capture_output=True, cwd=ROOT, env=env, timeout=300)
    lines = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 3 and len(lines) == 2 and lines[0].startswith("herdscope: note: NUMBA_CACHE_DIR=")
    proc = subprocess.run(_read_only_checkout_cmd() + [sys.executable, "-m", "analyzer", "--help"],
                          capture_output=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stderr == b""


def _nobody_cmd() -> list[str]:
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _nobody_can_run_us() -> str:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv(1) to run as uid 65534"
    probe = subprocess.run(_nobody_cmd() + [sys.executable, "-c", "import analyzer.cli"], capture_output=True,
                           cwd="/", env={"PYTHONPATH": str(ROOT), "HOME": "/nonexistent"})
    if probe.returncode:
        return (f"uid 65534 cannot run {sys.executable} with this checkout (the interpreter or {ROOT} is not "
                f"readable by it): {probe.stderr.decode().strip().splitlines()[-1:]}")
    return ""


@pytest.mark.skipif(bool(_nobody_can_run_us()), reason=_nobody_can_run_us() or "n/a")
def test_as_a_user_without_a_writable_home(tmp_path):
    os.chmod(tmp_path, 0o777)
    env = {"PYTHONPATH": str(ROOT), "HOME": "/nonexistent", "TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]}
    for args in (["--help"], ["--version"]):
        proc = subprocess.run(_nobody_cmd() + [sys.executable, "-m", "analyzer", *args], capture_output=True,
                              cwd="/", env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(_nobody_cmd() + [sys.executable, "-c", IMPORT_ALL_KERNELS], capture_output=True,
                          cwd="/", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_cache_fallback_decisions(tmp_path, monkeypatch):
    """The fallback itself, in-process: nowhere writable → a private directory under TMPDIR; one that
    another user could write is not trusted."""
    import tempfile

    import numba.core.config

    import analyzer

    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    package = tmp_path / "package"
    package.mkdir()
    (package / "__pycache__").write_bytes(b"")  # a file where the in-tree cache directory would go
    monkeypatch.setattr(numba.core.config, "CACHE_DIR", numba.core.config.CACHE_DIR)
    monkeypatch.setattr(analyzer, "_KERNEL_DIRS", [str(package)])
    monkeypatch.setenv("HOME", str(blocker))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocker / "numba"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    notice = analyzer._cache_fallback()
    chosen = tmp_path / f"herdscope-numba-{os.geteuid()}"
    assert os.environ["NUMBA_CACHE_DIR"] == str(chosen) == numba.core.config.CACHE_DIR
    assert notice == f"NUMBA_CACHE_DIR={blocker / 'numba'} is not writable; caching compiled kernels in {chosen}"
    assert (chosen.stat().st_mode & 0o777) == 0o700
    # without NUMBA_CACHE_DIR, the directory made on an earlier run is used without a word
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert analyzer._cache_fallback() == "" and os.environ["NUMBA_CACHE_DIR"] == str(chosen)
    # a directory others can write is not used: a fresh one for this run instead
    chosen.chmod(0o777)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocker / "numba"))
    notice = analyzer._cache_fallback()
    assert os.environ["NUMBA_CACHE_DIR"] != str(chosen) and notice.endswith("for this run only")
    # a writable NUMBA_CACHE_DIR is left alone
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert analyzer._cache_fallback() == "" and os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "mine")
