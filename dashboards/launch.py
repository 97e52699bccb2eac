"""``herdscope dashboard``: start Streamlit on the app with the captures and settings given.

Streamlit runs as a child process (``python -m streamlit run dashboards/streamlit_app.py``) bound to
``address`` (127.0.0.1 unless told otherwise) and ``port``; the app gets its settings as JSON in
``$HERDSCOPE_DASHBOARD`` (:class:`dashboards.data.Settings`). Usage statistics are off and nothing is
fetched from the network. The exit code is the CLI's: 0 when the server stopped normally (Ctrl-C
included), 3 when a capture file is missing, 2 for a bad option, 4 when Streamlit itself failed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "streamlit_app.py"


def streamlit_command(*, port: int, address: str, max_upload_mb: int, python: str | None = None) -> list[str]:
    """The ``streamlit run`` command line (the app's own settings travel in the environment)."""
    return [
        python or sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(port),
        "--server.address", address,
        "--server.maxUploadSize", str(max_upload_mb),
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--browser.serverAddress", address if address not in ("0.0.0.0", "::") else "localhost",
        "--browser.serverPort", str(port),
        "--global.developmentMode", "false",
        "--client.toolbarMode", "viewer",
    ]


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Ask Streamlit to stop (SIGINT, as Ctrl-C does), then kill it if it does not."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def launch(files: list[str], *, port: int = 8501, address: str = "127.0.0.1", browse_root: str | None = None,
           max_upload_mb: int = 200, env: dict | None = None) -> int:
    """Run the dashboard until it is stopped; returns the exit code for ``herdscope``."""
    from analyzer.errors import ExitCode, fail

    from .settings import Settings

    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        fail(f"{', '.join(missing)}: no such file")
        return ExitCode.UNREADABLE
    if not 0 < port < 65536:
        fail(f"--port {port}: expected 1-65535")
        return ExitCode.USAGE
    if max_upload_mb < 1:
        fail(f"--max-upload-mb {max_upload_mb}: expected at least 1")
        return ExitCode.USAGE
    root = os.path.abspath(browse_root or os.getcwd())
    if not os.path.isdir(root):
        fail(f"--root {browse_root}: not a directory")
        return ExitCode.USAGE
    settings = Settings(files=tuple(os.path.abspath(f) for f in files), browse_root=root, max_upload_mb=max_upload_mb)
    child_env = dict(os.environ if env is None else env)
    child_env["HERDSCOPE_DASHBOARD"] = settings.to_env()
    child_env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    project = str(APP.parent.parent)  # a source checkout: make `analyzer`/`detectors` importable
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (project, child_env.get("PYTHONPATH")) if p)
    cmd = streamlit_command(port=port, address=address, max_upload_mb=max_upload_mb)
    where = f"[{address}]" if ":" in address else address
    print(f"herdscope dashboard on http://{where}:{port} (Ctrl-C stops it)", file=sys.stderr, flush=True)
    try:
        proc = subprocess.Popen(cmd, env=child_env)
    except OSError as exc:
        fail(f"cannot start Streamlit: {exc}")
        return ExitCode.INTERNAL

    def forward(signum, _frame):  # `kill herdscope` must not leave Streamlit serving on its own
        proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        stop(proc)
        return ExitCode.OK
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            stop(proc)
    if code in (0, -signal.SIGINT, -signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGTERM):
        return ExitCode.OK
    fail(f"Streamlit exited with status {code}")
    return ExitCode.INTERNAL
