"""Where captures come from and the cached loaders the pages share.

Sources: the files given on the command line, the bundled samples (``samples/`` with its
``MANIFEST.toml``), an upload (size limit: Streamlit's ``server.maxUploadSize``), or a path typed in,
which must resolve inside the configured root directory (:func:`resolve_under_root`).

Caching: an opened :class:`analyzer.Capture` is a resource (``st.cache_resource``: shared, not
copied; its frames are built on first use and kept inside it); findings, transactions and the summary
are data (``st.cache_data``), keyed on the files and their size and modification time, so a file
rewritten in place is read again.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import streamlit as st

from analyzer import open_captures
from analyzer.errors import HerdscopeError

from .frames import all_transactions, time_origin
from .settings import Settings  # noqa: F401 - re-exported for the app

log = logging.getLogger("herdscope.dashboard")

CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz", ".cap.gz", ".dmp")
UPLOAD_DIR = Path(tempfile.gettempdir()) / "herdscope-uploads"


# -- sources -------------------------------------------------------------------------------------------

def is_capture_name(name: str) -> bool:
    return name.lower().endswith(CAPTURE_SUFFIXES)


def bundled_samples(samples_dir: Path) -> list[dict]:
    """The sample captures present, with their manifest entry (scenario, healthy, what_happened)."""
    if not samples_dir.is_dir():
        return []
    manifest = {}
    try:
        with open(samples_dir / "MANIFEST.toml", "rb") as fh:
            manifest = {c["file"]: c for c in tomllib.load(fh).get("capture", [])}
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        pass
    out = []
    for path in sorted(samples_dir.iterdir()):
        if path.is_file() and is_capture_name(path.name):
            entry = manifest.get(path.name, {})
            out.append({"file": path.name, "path": str(path), "scenario": entry.get("scenario"),
                        "healthy": entry.get("healthy"), "what_happened": entry.get("what_happened", "")})
    return out


class PathRejected(ValueError):
    """A typed path that may not be read (outside the root, missing, not a file)."""


def resolve_under_root(text: str, root: str) -> Path:
    """The file ``text`` names, relative to ``root`` unless absolute; it must stay inside ``root``
    after resolving ``..`` and symbolic links."""
    text = (text or "").strip()
    if not text:
        raise PathRejected("Type a path to a capture file.")
    base = Path(root).resolve()
    candidate = Path(text)
    target = (candidate if candidate.is_absolute() else base / candidate).resolve()
    if os.path.commonpath([str(base), str(target)]) != str(base):
        raise PathRejected(f"{text} is outside {base}: only captures under that directory can be opened "
                           f"(herdscope dashboard --root DIR).")
    if not target.exists():
        raise PathRejected(f"{text}: no such file under {base}.")
    if not target.is_file():
        raise PathRejected(f"{text} is not a file.")
    return target


def captures_under(root: str, limit: int = 200, max_depth: int = 3) -> list[str]:
    """Capture files under ``root`` (relative paths, at most ``limit``, ``max_depth`` levels down)."""
    base = Path(root).resolve()
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        depth = len(Path(dirpath).relative_to(base).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) if depth < max_depth else []
        for name in sorted(filenames):
            if is_capture_name(name):
                found.append(str((Path(dirpath) / name).relative_to(base)))
                if len(found) >= limit:
                    return sorted(found)
    return sorted(found)


def save_upload(name: str, data: bytes, directory: Path = UPLOAD_DIR) -> Path:
    """Keep an uploaded file on disk (tshark and the memory-mapped reader need a path), named by its
    content so the same upload is read once."""
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.blake2b(data, digest_size=10).hexdigest()
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(name).name)[-80:] or "upload"
    path = directory / f"{digest}-{safe}"
    if not path.exists():
        tmp = path.with_suffix(path.suffix + ".part")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


# -- loading -------------------------------------------------------------------------------------------

def stamp(paths: tuple[str, ...]) -> tuple:
    """What makes a cached capture stale: each file's size and modification time."""
    out = []
    for p in paths:
        try:
            st_ = os.stat(p)
            out.append((st_.st_size, st_.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _release(cap) -> None:
    # an evicted capture gives its file and memory map back (a run still holding it sees an empty
    # buffer: frames already built stay valid, the page guard reports anything else)
    cap.close()


@st.cache_resource(max_entries=3, show_spinner="Reading the capture…", on_release=_release)
def _open(paths: tuple[str, ...], stamps: tuple):
    return open_captures(list(paths))


@dataclass
class Loaded:
    """A capture ready for the pages."""

    label: str
    paths: tuple[str, ...]
    key: tuple  # cache key: paths and their stamps
    cap: object
    t0_ns: int
    t1_ns: int


def load(label: str, paths: tuple[str, ...]) -> tuple[Loaded | None, str | None]:
    """(Loaded, None), or (None, a message for the page) when the files cannot be read as a capture."""
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        return None, f"Cannot read {', '.join(missing)}: no such file."
    key = (paths, stamp(paths))
    try:
        cap = _open(paths, key[1])
    except HerdscopeError as exc:
        return None, f"{label} is not a capture herdscope can read: {exc}"
    except MemoryError:
        return None, f"{label} is too large to read into memory on this machine."
    except Exception as exc:  # noqa: BLE001 - a damaged file must give a message, not a traceback
        log.exception("reading %s", paths)
        return None, f"{label} could not be read: {type(exc).__name__}: {exc}"
    t0, t1 = time_origin(cap)
    return Loaded(label, paths, key, cap, t0, t1), None


@st.cache_data(max_entries=16, show_spinner="Summarising…")
def summary(key: tuple, _cap) -> dict:
    from analyzer.summary import summarize

    return summarize(_cap)


@st.cache_data(max_entries=16, show_spinner="Pairing requests and responses…")
def transactions(key: tuple, _cap) -> tuple[pl.DataFrame, dict[str, str]]:
    return all_transactions(_cap)


@st.cache_data(max_entries=16, show_spinner="Computing service response times…")
def service_response_times(key: tuple, _cap) -> pl.DataFrame:
    from analyzer.stats import service_response_times as srt

    return srt(_cap)


def parse_overrides(text: str) -> dict[str, str]:
    """``detector.param=value`` lines (blank lines and ``#`` comments ignored)."""
    from detectors.params import parse_assignment

    out = {}
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, value = parse_assignment(line, "line")
            out[key] = value
    return out


def usable_overrides(overrides: dict[str, object], errors: dict[str, str]) -> dict[str, object]:
    """The overrides :func:`detectors.configure` accepts, owner by owner: a bad value disables its own
    detector (recorded in ``errors`` under the detector's name, "bad parameter: …"), overrides for
    no known detector are recorded under ``"overrides"``; the others' overrides are returned."""
    import detectors

    by_owner: dict[str, dict[str, object]] = {}
    for k, v in overrides.items():
        by_owner.setdefault(k.partition(".")[0], {})[k] = v
    known = set(detectors.available()) | set(detectors.RESERVED_NAMES)  # population.*, incident.*
    unknown = {k: v for owner, mine in by_owner.items() if owner not in known for k, v in mine.items()}
    if unknown:
        try:
            detectors.configure(None, unknown)
        except detectors.ParameterError as exc:
            errors["overrides"] = str(exc)
    good: dict[str, object] = {}
    for owner, mine in by_owner.items():
        if owner not in known:
            continue
        try:
            detectors.configure(None if owner in detectors.RESERVED_NAMES else [owner], mine)
            good.update(mine)
        except detectors.ParameterError as exc:
            errors[owner] = f"bad parameter: {exc}"
    return good


@st.cache_data(max_entries=16, show_spinner="Running the detectors…")
def findings(key: tuple, _cap, overrides_json: str = "{}") -> tuple[pl.DataFrame, dict[str, str], list[str]]:
    """(findings, detector → error message for those that failed, the detectors run), from
    :func:`detectors.run` with its ``errors`` policy: a detector that raises is recorded and the others'
    findings are still returned. A bad override disables only its own detector (:func:`usable_overrides`)."""
    import detectors

    names = list(detectors.available())
    errors: dict[str, str] = {}
    good = usable_overrides(json.loads(overrides_json), errors)
    ran = [n for n in names if n not in errors]
    if not ran:
        return detectors.empty_findings(), errors, names
    return detectors.run(_cap, only=ran, overrides=good, errors=errors), errors, names
