"""Wireshark's own dissection of a few frames, through pyshark over tshark.

pyshark decodes a few hundred packets a second, so only the frames asked for are dissected: tshark
reads the file with the display filter ``frame.number in {…}`` and pyshark parses just those.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass

from .frames import display_filter

MAX_FRAMES = 50  # frames dissected at once (the findings' evidence cap)
DIRECT_MAX_PACKETS = 50_000  # larger files: cut the frames out first (see dissect)
TIMEOUT_S = 60.0


class DissectError(RuntimeError):
    """tshark is missing, failed, or took too long; the message says which, for the page."""


@dataclass(frozen=True)
class Dissection:
    frame: int
    summary: str  # "DNS, 76 bytes"
    text: str  # the layer-by-layer dissection, as Wireshark's packet details pane shows it


def tshark_path() -> str | None:
    """The tshark to use: ``$HERDSCOPE_TSHARK`` when set (empty or not executable: none), else the
    one on ``PATH``."""
    configured = os.environ.get("HERDSCOPE_TSHARK")
    if configured is not None:
        return configured if configured and os.access(configured, os.X_OK) else None
    return shutil.which("tshark")


@dataclass(frozen=True)
class DissectResult:
    frames: list[Dissection]
    note: str | None = None  # how the frames were dissected, when it differs from opening the file


def editcap_path(tshark: str | None) -> str | None:
    """editcap (Wireshark's record cutter) next to tshark, or on PATH."""
    if tshark:
        beside = os.path.join(os.path.dirname(tshark), "editcap")
        if os.access(beside, os.X_OK):
            return beside
    return shutil.which("editcap")


def dissect(path: str, frames: list[int], tshark: str | None = None, timeout_s: float = TIMEOUT_S,
            total_packets: int | None = None) -> DissectResult:
    """Dissect ``frames`` (Wireshark frame numbers of ``path``, at most :data:`MAX_FRAMES`).

    tshark dissects every packet of a file to apply a display filter (about 20,000 packets a
    second), so in a file of more than :data:`DIRECT_MAX_PACKETS` (``total_packets``) the frames are
    first cut out with ``editcap -r`` (which reads records without dissecting them) and dissected
    there: quick, but out of context (no TCP analysis or reassembly across the frames left out),
    and the result says so."""
    tshark = tshark or tshark_path()
    if not tshark:
        raise DissectError("tshark is not installed, so Wireshark's dissection is not available "
                           "(Debian: apt-get install tshark).")
    frames = sorted({int(f) for f in frames})[:MAX_FRAMES]
    if not frames:
        return DissectResult([])
    editcap = editcap_path(tshark)
    if total_packets and total_packets > DIRECT_MAX_PACKETS and editcap:
        with tempfile.TemporaryDirectory(prefix="herdscope-dissect-") as tmp:
            small = os.path.join(tmp, "frames" + (".pcapng" if path.endswith(("ng", "ng.gz")) else ".pcap"))
            try:
                subprocess.run([editcap, "-r", path, small, *map(str, frames)], check=True, capture_output=True,
                               timeout=timeout_s)
            except (subprocess.SubprocessError, OSError) as exc:
                raise DissectError(f"editcap could not cut frames out of {path}: {exc}") from exc
            cut = _pyshark(small, list(range(1, len(frames) + 1)), tshark, timeout_s)
        renumbered = [Dissection(frames[d.frame - 1], d.summary, d.text) for d in cut if 0 < d.frame <= len(frames)]
        return DissectResult(renumbered, f"The {total_packets:,}-packet file is too long to dissect whole here: "
                                         f"these frames were cut out with editcap and dissected on their own "
                                         f"(no TCP analysis or reassembly across the frames left out; Wireshark "
                                         f"on the whole file shows those).")
    return DissectResult(_pyshark(path, frames, tshark, timeout_s))


def _pyshark(path: str, frames: list[int], tshark: str, timeout_s: float) -> list[Dissection]:
    result: dict[str, object] = {}
    def work() -> None:
        import pyshark  # slow to import; only when a dissection is asked for

        loop = asyncio.new_event_loop()
        capture = None
        try:
            capture = pyshark.FileCapture(path, display_filter=display_filter(frames), tshark_path=tshark,
                                          eventloop=loop, keep_packets=False)
            out = []
            for packet in capture:
                out.append(Dissection(int(packet.number), f"{packet.highest_layer}, {packet.length} bytes",
                                      str(packet)))
            result["ok"] = out
        except Exception as exc:  # noqa: BLE001 - reported on the page
            result["error"] = exc
        finally:
            if capture is not None:
                try:
                    capture.close()
                except Exception:  # noqa: BLE001 - tshark already gone
                    pass
                # pyshark's __del__ closes again while processes are listed, on this (closed) loop
                for process in list(getattr(capture, "_running_processes", ())):
                    try:
                        process.kill()
                    except Exception:  # noqa: BLE001 - already exited
                        pass
                getattr(capture, "_running_processes", set()).clear()
            loop.close()

    thread = threading.Thread(target=work, name="herdscope-dissect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise DissectError(f"tshark took longer than {timeout_s:.0f} s to dissect {len(frames)} frames of {path}.")
    if "error" in result:
        exc = result["error"]
        text = str(exc).strip().splitlines()
        raise DissectError(f"tshark could not dissect the frames: {type(exc).__name__}: "
                           f"{text[0] if text else ''}")
    return result.get("ok", [])
