"""The synthetic capture's labels (``samples/synth.py`` writes ``<capture>.labels.json`` beside the
capture; tests/conftest.py's ``synthetic_capture`` fixture generates it once per session) and the
detectors' findings on it, for the detector label tests (tests/test_detector_*.py). Every label test
reads the one Capture of tests/shared_captures.py: the 200,000-packet capture is read and its frames
built once per session, not once per detector."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

S = 1_000_000_000
LABEL_START_SLACK_NS = 2 * S  # a finding matches a label starting at most this far from it
MIN_LABEL_SEVERITY_RANK = 2  # ... with at least this severity (medium)

_FINDINGS: dict = {}


def synthetic_labels(path, detector: str | None = None) -> list[dict]:
    """The labels of a synthetic capture (of one detector when given)."""
    labels = json.loads(Path(str(path) + ".labels.json").read_text())
    return [x for x in labels if detector is None or x["detector"] == detector]


def synthetic_findings(capture_path, detectors=("herd", "retry_storm")):
    """Run the detectors once per session on the synthetic capture: (findings, labels, frame names)."""
    from shared_captures import shared_capture, shared_run

    key = (str(capture_path), tuple(detectors))
    if key not in _FINDINGS:
        names = set(shared_capture(capture_path).frame_names())
        _FINDINGS[key] = (shared_run(capture_path, detectors), synthetic_labels(capture_path), names)
    return _FINDINGS[key]


def synthetic_detect(capture_path, module) -> pl.DataFrame:
    """``module.detect`` with its default parameters on the session's shared synthetic capture."""
    from shared_captures import shared_capture

    return module.detect(shared_capture(capture_path), module.Params())


def label_found(findings: pl.DataFrame, label: dict) -> pl.DataFrame:
    """The findings that match a label: its detector and server, a start within
    LABEL_START_SLACK_NS, the label's resource, severity at least medium."""
    return findings.filter((pl.col("detector") == label["detector"]) & (pl.col("server") == label["server"])
                           & ((pl.col("start_ns") - label["start_ns"]).abs() <= LABEL_START_SLACK_NS)
                           & pl.col("resource").str.contains(label["resource"], literal=True)
                           & (pl.col("severity").to_physical() >= MIN_LABEL_SEVERITY_RANK))
