"""Captures opened once per test session, and their default scans, shared by every test that only
reads them.

Reading a capture and building its frames (TCP analysis, the decoders) is most of what a test of
the detectors on a real capture costs, and many test modules look at the same files: the samples of
samples/MANIFEST.toml, the evaluation recordings of samples/eval/, the corpus of tests/data/corpus
and the generated synthetic capture. A :class:`~analyzer.capture.Capture` keeps every frame it has
built, so one opened Capture per file serves every detector, every parameter value and every test
module; :func:`shared_run` keeps ``detectors.run`` of one capture and detector selection, so a file
scanned by several modules is scanned once.

Only for tests that treat the capture as read-only: a shared capture refuses ``restrict_packets``
(the one change a Capture accepts after opening); a test that needs a capture of its own (a
selection, a modified file, counting what gets built) opens it with ``open_capture``. Entries are
keyed by the file's real path, size and modification time, so a file rewritten during the session is
read again. tests/conftest.py closes everything when the session ends.
"""
from __future__ import annotations

import os

import polars as pl

_CAPTURES: dict[tuple, object] = {}
_RUNS: dict[tuple, pl.DataFrame] = {}


def _key(path) -> tuple:
    real = os.path.realpath(os.fspath(path))
    st = os.stat(real)
    return real, st.st_size, st.st_mtime_ns


def _refuse_restrict(*args, **kwargs):
    raise RuntimeError("a shared capture (tests/shared_captures.py) is read-only: open_capture() your own "
                       "to select packets")


def shared_capture(path):
    """The Capture of ``path``, opened on first request and kept open until the session ends."""
    from analyzer import open_capture

    key = _key(path)
    cap = _CAPTURES.get(key)
    if cap is None:
        cap = open_capture(path)
        cap.restrict_packets = _refuse_restrict
        _CAPTURES[key] = cap
    return cap


def shared_run(path, only=None) -> pl.DataFrame:
    """``detectors.run`` of the shared capture of ``path`` with the default parameters (of the
    detectors in ``only``, every registered detector when None), computed once per session."""
    import detectors

    key = (_key(path), None if only is None else tuple(only))
    if key not in _RUNS:
        _RUNS[key] = detectors.run(shared_capture(path), only=None if only is None else list(only))
    return _RUNS[key]


def close_all() -> None:
    for cap in _CAPTURES.values():
        cap.close()
    _CAPTURES.clear()
    _RUNS.clear()
