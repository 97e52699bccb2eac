"""What a long run is doing, on standard error, only when it is a terminal.

- :func:`stages` (a context manager the CLI wraps a command in) shows a one-line status with the
  stage under way: reading (the reader's own byte bar for big files), TCP analysis, decoding a
  protocol, running a detector. The layers report their stage with :func:`stage`, which costs nothing
  when no status is shown (pipes, CI, Python use).
- The first run after an install compiles the Numba kernels (about 30 s): Numba's compile event says
  when that happens, and the line "compiling analysis kernels (first run only)" is printed once. A run
  with a warm cache compiles nothing and prints nothing.
"""
from __future__ import annotations

import contextlib
import sys

_console = None  # the stderr console while stages() is in force on a terminal
_status = None  # its status line, started at the first stage after reading
_compile_noticed = False

# frame name prefixes -> the stage a person recognises
_STAGE_OF_FRAME = (("tcp_", "TCP analysis"), ("connections", "TCP analysis"), ("dns_", "decoding DNS"),
                   ("kerberos_", "decoding Kerberos"), ("ldap_", "decoding LDAP"), ("smb2_", "decoding SMB2"))


def _stderr_is_terminal() -> bool:
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def stage(text: str) -> None:
    """Report the stage under way (shown only inside :func:`stages` on a terminal). The status line
    starts here, not before: reading shows the reader's own byte bar, and rich allows one live
    display at a time."""
    global _status
    if _console is None:
        return
    line = f"[dim]herdscope:[/dim] {text}…"
    if _status is None:
        _status = _console.status(line)
        _status.start()
    else:
        _status.update(line)


def frame_stage(name: str) -> None:
    """Report that frame ``name`` is being built, as the stage it belongs to."""
    if _console is not None:
        for prefix, words in _STAGE_OF_FRAME:
            if name.startswith(prefix):
                stage(words)
                return
        stage(f"building {name}")


def _on_compile(_event) -> None:
    global _compile_noticed
    if _compile_noticed:
        return
    _compile_noticed = True
    text = "compiling analysis kernels (first run only, about 30 s; later runs load them from the cache)"
    if _console is not None:
        _console.print(f"[dim]herdscope:[/dim] {text}")
    elif _stderr_is_terminal():
        print(f"herdscope: {text}", file=sys.stderr)


def _listen_for_compiles() -> None:
    """Register for Numba's compile events (Numba >= 0.53); nothing happens if the API is missing."""
    try:
        import numba.core.event as events  # lazy: Numba's events only when a terminal shows the stages
    except ImportError:  # pragma: no cover - an older Numba
        return

    class Listener(events.Listener):
        def on_start(self, event):
            _on_compile(event)

        def on_end(self, event):
            pass

    events.register("numba:compile", Listener())


@contextlib.contextmanager
def stages(enabled: bool | None = None):
    """Show the stage status line for the duration of the block (on a terminal by default)."""
    global _console, _status
    show = _stderr_is_terminal() if enabled is None else enabled
    if not show:
        yield
        return
    from rich.console import Console  # lazy: rich only when a terminal shows the stages

    _listen_for_compiles()
    _console = Console(file=sys.stderr, highlight=False)
    try:
        yield
    finally:
        if _status is not None:
            _status.stop()
        _console = _status = None
