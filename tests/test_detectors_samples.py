"""Golden findings: every real-server sample fires the detectors its manifest names, about when and
where it says, and stays silent (nothing >= medium) for the others; healthy twins and the ordinary
corpus captures stay silent altogether. False positives are bugs.

A detector the manifest names that does not exist is a failure, as is a registry with no detectors.
"""
import sys
from pathlib import Path

import polars as pl
import pytest

from analyzer import open_capture
from detectors import at_least, available, run
from tshark_ref import corpus_files

sys.path.insert(0, str(Path(__file__).parent.parent / "samples"))
from groundtruth import count_ok, load_manifest, matches  # noqa: E402  (shared with evaluate.py, test_detectors_eval.py)

ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "samples"
MANIFEST = load_manifest(SAMPLES / "MANIFEST.toml")
CORPUS = Path(__file__).parent / "data" / "corpus"

_cache: dict[str, tuple[pl.DataFrame, int]] = {}


def findings_of(path: Path) -> tuple[pl.DataFrame, int]:
    key = str(path)
    if key not in _cache:
        with open_capture(path) as cap:
            first = int(cap.packets["ts_ns"].min())
            _cache[key] = (run(cap), first)
    return _cache[key]


EXPECTS = [(c["file"], k, e) for c in MANIFEST for k, e in enumerate(c.get("expect", []))]


@pytest.mark.parametrize("file,k,expect", EXPECTS, ids=[f"{f}#{k}-{e['detector']}" for f, k, e in EXPECTS])
def test_pathological_sample_fires(file, k, expect):
    assert expect["detector"] in available(), f"the manifest expects detector {expect['detector']}: not registered"
    f, first = findings_of(SAMPLES / file)
    hits = matches(f, expect, first)
    assert count_ok(hits, expect), (
        f"{hits.height} {expect['detector']} findings >= {expect['min_severity']} on {expect.get('resource')!r} "
        f"near {expect['start_s']} s; "
        f"all findings: {f.select('detector', 'kind', 'severity', 'start_ns', 'server', 'resource').to_dicts()}")


SILENT = [(c["file"], d) for c in MANIFEST for d in c.get("silent", [])]


@pytest.mark.parametrize("file,detector", SILENT, ids=[f"{f}-{d}" for f, d in SILENT])
def test_sample_stays_silent_for_other_detectors(file, detector):
    assert detector in available(), f"the manifest names detector {detector}: not registered"
    f, _ = findings_of(SAMPLES / file)
    loud = at_least(f.filter(pl.col("detector") == detector), "medium")
    assert loud.height == 0, loud.select("kind", "severity", "explanation").to_dicts()


HEALTHY = [c["file"] for c in MANIFEST if c["healthy"]]


@pytest.mark.parametrize("file", HEALTHY)
def test_healthy_twin_has_nothing_medium_or_worse(file):
    assert available(), "no detectors registered"
    f, _ = findings_of(SAMPLES / file)
    loud = at_least(f, "medium")
    assert loud.height == 0, loud.select("detector", "kind", "severity", "explanation").to_dicts()


NORMAL = sorted(r["file"] for r in corpus_files("normal"))


@pytest.mark.parametrize("rel", NORMAL)
def test_ordinary_corpus_capture_has_nothing_medium_or_worse(rel):
    assert available(), "no detectors registered"
    f, _ = findings_of(CORPUS / rel)
    loud = at_least(f, "medium")
    assert loud.height == 0, loud.select("detector", "kind", "severity", "explanation").to_dicts()
