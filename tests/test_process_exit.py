"""A herdscope process ends without the interpreter's teardown, and loses nothing by it
(``analyzer/process_exit.py``; issue 13, a process's fixed cost).

Each test runs the CLI in a fresh interpreter, as its entry point does (``main()`` with no ``argv``),
and compares it with the same command ended by the interpreter (``main(argv)``, which returns): the
same exit code and the same standard output, every atexit handler run, and the usual exit where another
thread is alive.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "dns-ttl-herd.pcap"

# argv: MARKER ARGS...; an atexit handler writes MARKER; MARKER.returned is written only when main returns
ENTRY = """
import atexit, sys
marker = sys.argv[1]
atexit.register(lambda: open(marker, "w").write("handler ran"))
sys.argv = ["herdscope", *sys.argv[2:]]
from analyzer.cli import main
code = main({argv})
open(marker + ".returned", "w").write(str(code))
sys.exit(code)
"""

# a thread that is not a daemon is alive when the command ends: it waits for MARKER.returned (at most a
# minute), then writes MARKER.thread
WITH_A_THREAD = """
import os, threading, time, sys
def wait_for_main(marker=sys.argv[1]):
    deadline = time.monotonic() + 60
    while not os.path.exists(marker + ".returned") and time.monotonic() < deadline:
        time.sleep(0.05)
    open(marker + ".thread", "w").write("done")
threading.Thread(target=wait_for_main).start()
""" + ENTRY


def _run(tmp_path: Path, name: str, script: str, *args: str, argv: str = "") -> tuple[subprocess.CompletedProcess, Path]:
    marker = tmp_path / name
    proc = subprocess.run([sys.executable, "-c", script.format(argv=argv), str(marker), *args],
                          capture_output=True, cwd=ROOT, timeout=600)
    return proc, marker


def test_a_command_ends_with_its_code_its_whole_output_and_its_atexit_handlers(tmp_path):
    args = ("scan", str(SAMPLE), "--format", "json", "--fail-on", "informational")
    ended, marker = _run(tmp_path, "ended", ENTRY, *args)
    returned, returned_marker = _run(tmp_path, "returned", ENTRY, *args, argv="sys.argv[1:]")
    assert returned.returncode == 1, returned.stderr.decode()  # the sample's herd reaches --fail-on informational
    assert ended.returncode == returned.returncode, ended.stderr.decode()
    assert ended.stdout == returned.stdout and json.loads(ended.stdout)["findings"]
    assert marker.read_text() == "handler ran"
    assert not Path(f"{marker}.returned").exists()  # the process ended inside main
    assert Path(f"{returned_marker}.returned").read_text() == "1"


def test_with_another_thread_alive_the_interpreter_ends_the_process(tmp_path):
    proc, marker = _run(tmp_path, "thread", WITH_A_THREAD, "info", str(SAMPLE), "--format", "json")
    assert proc.returncode == 0, proc.stderr.decode()
    assert Path(f"{marker}.returned").read_text() == "0"  # leave returned: the usual exit
    assert Path(f"{marker}.thread").read_text() == "done"  # which waited for the thread
    assert marker.read_text() == "handler ran"
    assert json.loads(proc.stdout)
